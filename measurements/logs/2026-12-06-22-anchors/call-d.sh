# Call d: vLLM 0.34.0's block-FP8 Triton kernel beside Part 7's first GEMM (scripts/vllm_fp8_anchor.py),
# three models, M = 1 to 16384, the H200's tuned tables on both sides (ours: --table-of; vLLM: its H200
# JSON where it ships one, else its default rule). vLLM's fused_moe.py and its configs folder come from
# the vllm-0.34.0 wheel on PyPI, carried in .anchors/ (git-ignored: not this repository's code).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/d; mkdir -p $D
pack() { tar -czf $OUT/call-d.tgz -C /tmp d; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
V=.anchors/vllm-0.34.0
OUT=$D timeout 560 python3 measurements/scripts/vllm_fp8_anchor.py --vllm-file $V/fused_moe.py --vllm-configs $V/configs \
  --vllm-device NVIDIA_H200 --table-of "NVIDIA H200" --models Qwen3-30B-A3B DeepSeek-V3 Kimi-K2 2>&1 \
  | grep -v Warning | tee $D/vllm-anchor.log
pack
