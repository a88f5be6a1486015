# Call e (the same H100, warm): the heuristic changed (call-e/heuristic.diff: from 64 rows an expert, 128-wide tiles at
# 4 warps where K < 4096); vLLM 0.34.0 beside Qwen3-30B-A3B's first GEMM, then the FP8 GPU tests. Carry .anchors.
export PYTHONPATH=$PWD PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/e; mkdir -p $D/anchor; V=.anchors/vllm-0.34.0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
OUT=$D/anchor timeout 120 python3 measurements/scripts/vllm_fp8_anchor.py --vllm-file $V/fused_moe.py --vllm-configs $V/configs \
  --models Qwen3-30B-A3B 2>&1 | grep -v Warning | tee $D/anchor/vllm-anchor.log; tar -czf $OUT/call-e.tgz -C /tmp e
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fp8.py tests/test_fp8_steps.py 2>&1 | tail -3 | tee $D/fp8-tests.log
tar -czf $OUT/call-e.tgz -C /tmp e
