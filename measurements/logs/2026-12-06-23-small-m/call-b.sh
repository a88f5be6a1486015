# Call b (H100): the tl kernel loads one weight scale per K step where its tile lies in one 128 x 128 block
# (BLOCK_N <= 128), not BLOCK_N copies. GPU tests; call a's sweep again with the change; vLLM 0.34.0 beside
# the first GEMM with the change (the heuristic as it was).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/b; mkdir -p $D
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
V=.anchors/vllm-0.34.0
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fp8.py 2>&1 | tail -4 | tee $D/fp8-tests.log
for m in Kimi-K2 DeepSeek-V3 Qwen3-30B-A3B; do
  OUT=$D/$m timeout 60 python3 measurements/scripts/fp8_small_m_sweep.py --models $m --M 1 8 64 256 --max-seconds 0.3 2>&1 \
    | grep -v "Warning\|rejected" | tee -a $D/sweep.log
done
OUT=$D/first-1024 timeout 40 python3 measurements/scripts/fp8_small_m_sweep.py --M 1024 --variants plain --max-seconds 0.3 2>&1 \
  | grep -v Warning | tee -a $D/sweep.log
mkdir -p $D/anchor; OUT=$D/anchor timeout 240 python3 measurements/scripts/vllm_fp8_anchor.py --vllm-file $V/fused_moe.py \
  --vllm-configs $V/configs --models Qwen3-30B-A3B DeepSeek-V3 Kimi-K2 2>&1 | grep -v Warning | tee $D/anchor/vllm-anchor.log
tar -czf $OUT/call-b.tgz -C /tmp b
