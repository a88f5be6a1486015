# Call f (twenty-seventh session): the router weights read at the tile's start in the rescaled FP8
# partition (their two dependent global reads overlapping the K loop, not opening the epilogue), against
# the committed package (HEAD, copied to .anchors/head) in the same call: the layer's GPU tests with the
# change, then tma_store_layer.py on Qwen3-30B-A3B (M = 4096, 16384) new, head, new, head, and on
# DeepSeek-V3 (M = 16384) new, head; one process each. Carry .anchors.
set -u
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/f; mkdir -p $D
pack() { tar -czf $OUT/call-f.tgz -C /tmp f; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
PYTHONPATH=$PWD timeout 150 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gluon_fp8.py -k "layer" \
  > $D/gpu-tests.log 2>&1; echo "gpu tests rc $?"; tail -1 $D/gpu-tests.log; pack
S=measurements/scripts/tma_store_layer.py; n=0
for spec in "new Qwen3-30B-A3B 4096 16384" "head Qwen3-30B-A3B 4096 16384" "new Qwen3-30B-A3B 4096 16384" \
            "head Qwen3-30B-A3B 4096 16384" "new DeepSeek-V3 16384" "head DeepSeek-V3 16384"; do
  set -- $spec; pkg=$1; model=$2; shift 2; n=$((n + 1))
  root=$PWD; [ $pkg = head ] && root=$PWD/.anchors/head
  PYTHONPATH=$root OUT=$D/$n-$pkg-$model timeout 120 python3 $S --models $model --M "$@" 2>&1 | grep -v Warning \
    | sed "s/^/$pkg /" | tee $D/$n-$pkg-$model.log; pack
done
