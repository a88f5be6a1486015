# Call f (any Hopper GPU): is Kimi-K2's 128-row gain at M = 4096 (1.15x, where 4608 gave 0.97x) the rows
# an expert or the one routing? Neighbouring M (other routings, about the same rows) in one process,
# 4096 first and last (tile_height_layer.py); then DeepSeek-V3 around 4096.
set -u
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONPATH=$PWD; D=/tmp/f; mkdir -p $D
pack() { tar -czf $OUT/call-f.tgz -C /tmp f; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
for c in "Kimi-K2 4096 4032 4095 4097 4160 4096" "DeepSeek-V3 4032 4096 4160"; do
  set -- $c; m=$1; shift; n=$m-$(echo $@ | tr ' ' -)
  OUT=$D/$n timeout 150 python3 measurements/scripts/tile_height_layer.py --models $m --M $@ 2>&1 | grep -v Warning \
    | tee $D/$n.log; pack
done
