# Call a (whichever GPU comes). On an H100: pending/call-small-m.sh's measurement (vLLM 0.34.0 beside the
# first GEMM after the twenty-third session's one-scale kernel and small-M heuristic), the GPU tests after
# the heuristic change, and the 128-wide 4-warp tile beside the heuristic's 256-wide one at 64 to 128 rows an
# expert. On an H200: pending/call-h200.sh (vLLM beside it on the GPU #31's aims name). Carry .whl, .anchors.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/a; mkdir -p $D
pack() { tar -czf $OUT/call-a.tgz -C /tmp a; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt; V=.anchors/vllm-0.34.0
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  OUT=$D timeout 200 python3 measurements/scripts/vllm_fp8_anchor.py --vllm-file $V/fused_moe.py --vllm-configs $V/configs \
    --models Qwen3-30B-A3B DeepSeek-V3 Kimi-K2 2>&1 | grep -v Warning | tee $D/vllm-anchor.log
  pack; exit 0
fi
mkdir -p $D/anchor; OUT=$D/anchor timeout 200 python3 measurements/scripts/vllm_fp8_anchor.py --vllm-file $V/fused_moe.py \
  --vllm-configs $V/configs --models Qwen3-30B-A3B DeepSeek-V3 Kimi-K2 2>&1 | grep -v Warning | tee $D/anchor/vllm-anchor.log
pack
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fp8.py tests/test_fp8_steps.py 2>&1 | tail -4 | tee $D/fp8-tests.log
pack
OUT=$D/rows timeout 120 python3 measurements/scripts/fp8_small_m_sweep.py --models Qwen3-30B-A3B DeepSeek-V3 --M 1024 2048 \
  --variants plain --max-seconds 0.3 2>&1 | grep -v "Warning\|rejected" | tee -a $D/sweep.log
OUT=$D/rows-kimi timeout 60 python3 measurements/scripts/fp8_small_m_sweep.py --models Kimi-K2 --M 4096 \
  --variants plain --max-seconds 0.3 2>&1 | grep -v "Warning\|rejected" | tee -a $D/sweep.log
pack
