# Ran with fp8-split-k.patch (beside this file; it applies to 461e5dc) applied: the package's split-K, measured and then taken out again;
# the script's --split option went with it.
# Call b: split-K at decode (issue 31's M <= 256 aims). The FP8 layer with its gate/up GEMM, its down GEMM
# or both splitting K, against the tuned pair and Part 4's bf16 layer, each checked against the float64
# layer first; the H200's tuned tables on whatever GPU comes (cold-l2, CUDA graphs, both orders).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/b; mkdir -p $D
pack() { tar -czf $OUT/call-b.tgz -C /tmp b; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
OUT=$D timeout 540 python3 measurements/scripts/h200_fp8_decode.py --models Qwen3-30B-A3B DeepSeek-V3 Kimi-K2 \
  --M 1 2 4 8 --split --variants --table-of "NVIDIA H200" 2>&1 | grep -v Warning | tee $D/split-k.log
pack
