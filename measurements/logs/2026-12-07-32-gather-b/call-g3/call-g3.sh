# Pending (any Hopper GPU): where the four-warp gather wins. Call g2 (thirty-second session): same bits; Qwen3-30B-A3B
# 1.02x-1.04x faster than the sorted copy, DeepSeek-V3 M=16384 0.94x. This call times more M and Kimi-K2 to set the rule.
set -u
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONPATH=$PWD; D=/tmp/g3; mkdir -p $D
pack() { tar -czf $OUT/call-g3.tgz -C /tmp g3; }
patch -p1 -s < measurements/pending/gather-b.patch || { echo "the patch no longer applies"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
for c in "Qwen3-30B-A3B 1024 2048 8192" "Kimi-K2 16384 4096" "DeepSeek-V3 4096 8192" "Qwen3-30B-A3B 8192 2048 1024" "DeepSeek-V3 16384"; do
  set -- $c; m=$1; shift; n=$m-$(echo $@ | tr ' ' -)
  OUT=$D/$n timeout 150 python3 measurements/scripts/gather_layer.py --models $m --M $@ 2>&1 | grep -v Warning \
    | tee $D/$n.log; pack
done
