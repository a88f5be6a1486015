# Call f (the same H100, warm): with the changed heuristic, vLLM 0.34.0 beside all three models' first GEMM
# (now moe_tutorial/data/h100_vllm_fp8_anchor.csv), then notebook 07 under nbval-lax. Then, as a bare command
# (no files back): pytest -m gpu tests/test_fp8*.py tests/test_gluon*.py, 92 passed. Carry .anchors, .whl.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/f; mkdir -p $D/anchor; V=.anchors/vllm-0.34.0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
OUT=$D/anchor timeout 170 python3 measurements/scripts/vllm_fp8_anchor.py --vllm-file $V/fused_moe.py --vllm-configs $V/configs \
  --models Qwen3-30B-A3B DeepSeek-V3 Kimi-K2 2>&1 | grep -v Warning | tee $D/anchor/vllm-anchor.log; tar -czf $OUT/call-f.tgz -C /tmp f
export PYTHONPATH=$PWD:/tmp/site; python3 -m ipykernel install --user --name python3 > /dev/null 2>&1
timeout 100 python3 -m pytest --nbval-lax -q -p no:cacheprovider notebooks/07_fp8_experts.ipynb > $D/notebook-07-nbval.log 2>&1
echo rc $?; tail -1 $D/notebook-07-nbval.log; tar -czf $OUT/call-f.tgz -C /tmp f
