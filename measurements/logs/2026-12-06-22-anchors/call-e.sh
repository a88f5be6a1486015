# Call e (typed at the tool, on call d's warm H100): call d again with each side as it ships for an H100:
# ours with no tuned table for this GPU (the untuned heuristic), vLLM with its H100 JSON where it ships one
# (none for these shapes: its default rule). The CSV is moe_tutorial/data/h100_vllm_fp8_anchor.csv.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/e; mkdir -p $D
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt; V=.anchors/vllm-0.34.0
OUT=$D timeout 300 python3 measurements/scripts/vllm_fp8_anchor.py --vllm-file $V/fused_moe.py --vllm-configs $V/configs \
  --models Qwen3-30B-A3B DeepSeek-V3 Kimi-K2 2>&1 | grep -v Warning | tee $D/vllm-anchor.log; tar -czf $OUT/call-e.tgz -C /tmp e
