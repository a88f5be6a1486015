# Pending (any Hopper GPU; on an H200 the issue's own numbers): the FP8 layer on 64-row and on 128-row
# tiles by rows an expert (scripts/tile_height_layer.py), one process a model. The twenty-ninth session
# found the 128-row rescaled pair 1.15x faster on Kimi-K2 at 85 rows an expert and 0.93x on DeepSeek-V3
# at 128; this looks between and around them before the heuristic (GLUON_RESCALED_ROWS) changes.
set -u
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONPATH=$PWD; D=/tmp/h; mkdir -p $D
pack() { tar -czf $OUT/call-h.tgz -C /tmp h; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
for c in "Kimi-K2 2048 3072 4096 6144" "DeepSeek-V3 3072 4096 6144" "Qwen3-30B-A3B 2048 3072 4096"; do
  set -- $c; m=$1; shift; n=$m-$(echo $@ | tr ' ' -)
  OUT=$D/$n timeout 180 python3 measurements/scripts/tile_height_layer.py --models $m --M $@ 2>&1 | grep -v Warning \
    | tee $D/$n.log; pack
done
