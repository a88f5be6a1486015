# Call e (any Hopper GPU): where the 128-row rescaled pair starts and stops winning over the fused
# 64-row pair, by rows an expert, between the thirtieth session's call h points (tile_height_layer.py,
# one process a model).
set -u
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONPATH=$PWD; D=/tmp/e; mkdir -p $D
pack() { tar -czf $OUT/call-e.tgz -C /tmp e; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
for c in "Kimi-K2 2560 4608 5120 5632 6656 7168 7680" "DeepSeek-V3 1664 3584 4608 5120 7168" \
         "Qwen3-30B-A3B 1536 1792 2304 2560 3584"; do
  set -- $c; m=$1; shift; n=$m-$(echo $@ | tr ' ' -)
  OUT=$D/$n timeout 240 python3 measurements/scripts/tile_height_layer.py --models $m --M $@ 2>&1 | grep -v Warning \
    | tee $D/$n.log; pack
done
