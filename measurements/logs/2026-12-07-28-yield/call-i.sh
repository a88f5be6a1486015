# Call i (twenty-eighth session; pending from the twenty-seventh, whose device time ran out): calls f and h each hid one of the FP8
# down GEMM's two global waits (the epilogue's router weights; step 0's weight scales and the tile's
# expert) and neither changed the layer's time; here both at once against the committed package,
# Qwen3-30B-A3B at M = 16384: both, this, both, this, one process each. The two patches are applied
# to a copy of the package on the GPU machine. The script checks each form against float64 and for
# the same bits as its gl.store twin; if "both" wins, run the Gluon FP8 GPU tests with it before
# keeping it. Any Hopper GPU.
set -u
export PYTHONPATH=$PWD       # (the call ran `export PYTHONPATH=$PWD; bash call.sh`)
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/i; mkdir -p $D
L=measurements/logs/2026-12-07-27-tma-store
rm -rf /tmp/both && mkdir -p /tmp/both && cp -r moe_tutorial /tmp/both/
(cd /tmp/both && patch -p1 -s < $OLDPWD/$L/router-weights-ahead.patch && patch -p1 -s < $OLDPWD/$L/expert-ahead.patch) \
  || { echo "the patches no longer apply"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
S=measurements/scripts/tma_store_layer.py; n=0
for pkg in both this both this; do
  n=$((n + 1)); root=$PWD; [ $pkg = both ] && root=/tmp/both
  PYTHONPATH=$root OUT=$D/$n-$pkg timeout 60 python3 $S --models Qwen3-30B-A3B --M 16384 2>&1 | grep -v Warning \
    | sed "s/^/$pkg /" | tee $D/$n-$pkg.log
  tar -czf $OUT/call-i.tgz -C /tmp i
done
