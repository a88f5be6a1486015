# Call c (H100): the FP8 heuristic after calls a and b (plain and down GEMMs up to 16 rows an expert: 64 wide,
# 3 stages where K >= 4096). GPU tests of Part 7; the heuristic beside its neighbours and the heuristic before
# ("before"), M = 1..256; vLLM 0.34.0 beside the first GEMM, each side as it ships for this GPU (on an H100
# ours has no tuned table, so the heuristic, and vLLM its default rule); the FP8 layer over the bf16 layer at
# decode (h200_fp8_decode.py, the decode path left out).
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/c; mkdir -p $D
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt; V=.anchors/vllm-0.34.0
S=measurements/scripts/fp8_small_m_sweep.py
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fp8.py tests/test_fp8_steps.py 2>&1 | tail -3 | tee $D/fp8-tests.log
for m in Kimi-K2 DeepSeek-V3 Qwen3-30B-A3B; do
  OUT=$D/$m timeout 45 python3 $S --models $m --M 1 8 64 256 --variants plain down --max-seconds 0.3 2>&1 \
    | grep -v "Warning\|rejected" | tee -a $D/sweep.log
done
mkdir -p $D/anchor; OUT=$D/anchor timeout 200 python3 measurements/scripts/vllm_fp8_anchor.py --vllm-file $V/fused_moe.py \
  --vllm-configs $V/configs --models Qwen3-30B-A3B DeepSeek-V3 Kimi-K2 2>&1 | grep -v Warning | tee $D/anchor/vllm-anchor.log
mkdir -p $D/decode; OUT=$D/decode timeout 100 python3 measurements/scripts/h200_fp8_decode.py --variants --M 1 8 2>&1 \
  | grep -v Warning | tee $D/decode/decode.log
tar -czf $OUT/call-c.tgz -C /tmp c
