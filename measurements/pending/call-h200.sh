# Pending (H200 only; on any other GPU it stops at the gate): issue 31's comparison with vLLM 0.34.0 on
# the GPU its aims name (scripts/vllm_fp8_anchor.py, each side as it ships for an H200: our tuned table,
# vLLM's H200 file where it ships one).
# Carry .whl and .anchors (vLLM's fused_moe.py and configs from the vllm-0.34.0 wheel, in .anchors/vllm-0.34.0/).
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: not run"; exit 0; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/h; mkdir -p $D
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt; V=.anchors/vllm-0.34.0
OUT=$D timeout 200 python3 measurements/scripts/vllm_fp8_anchor.py --vllm-file $V/fused_moe.py --vllm-configs $V/configs \
  --models Qwen3-30B-A3B DeepSeek-V3 Kimi-K2 2>&1 | grep -v Warning | tee $D/vllm-anchor.log
tar -czf $OUT/call-h.tgz -C /tmp h
# The order of the pending H200 calls: call-next-a.sh, then call-next-b.sh.
