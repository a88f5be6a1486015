# Pending (any H100; written as call c of logs/2026-12-06-23-small-m/, which found no machine): the FP8
# heuristic after that session's calls a and b (first and down GEMMs up to 16 rows an expert: 64 wide,
# 3 stages where K >= 4096) and the one weight scale per tile. vLLM 0.34.0 beside the first GEMM, each side as
# it ships for an H100 (ours has no tuned table there, so the heuristic; vLLM its default rule). Both first
# GEMMs are checked against float64 before they are timed. Carry .anchors (see call-h200.sh). Then
# moe_tutorial/data/h100_vllm_fp8_anchor.csv takes the new rows, and the prose tests say what changes.
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H100 || { echo "not an H100: not run"; exit 0; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/c; mkdir -p $D/anchor
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt; V=.anchors/vllm-0.34.0
OUT=$D/anchor timeout 170 python3 measurements/scripts/vllm_fp8_anchor.py --vllm-file $V/fused_moe.py \
  --vllm-configs $V/configs --models Qwen3-30B-A3B DeepSeek-V3 Kimi-K2 2>&1 | grep -v Warning | tee $D/anchor/vllm-anchor.log
tar -czf $OUT/call-c.tgz -C /tmp c
