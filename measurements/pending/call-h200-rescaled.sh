# The rescaled forms on an H200 (not run: in the seventeenth session no H200 came, and call y ran on an
# H100, where DeepSeek-V3's and Kimi-K2's first GEMMs did not fit beside their float64 check): the
# shipped kernel, the rescaled split and 3-stage forms, the layer's forms and the package's layer (the
# H200 table's choice). If the rescaled forms win, gluon_fp8_table.py writes them into the H200 table.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
D=$OUT/w; mkdir -p $D
pack() { tar czf $OUT/call-w.tar.gz -C $OUT w; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee $D/gpu.txt
date -u +%FT%TZ | tee -a $D/gpu.txt
echo "=== sweep $(date -u +%T)"
OUT=$D timeout 250 python3 measurements/scripts/h200_gluon_fp8.py sweep --models DeepSeek-V3 Kimi-K2 Qwen3-30B-A3B --M 16384 4096 \
  --variants gluon-128x8-s4 gluon-128x256-rescaled-split-s4-g8 gluon-128x256-rescaled-s3-g8 \
  --layers tl gluon-fused-s4-d64s6 gluon-unfused-128 gluon-rescaled-split-128 --deadline 190 > $D/sweep.log 2>&1; echo rc $?; grep -E "ceilings|floor|Error|error|deadline" $D/sweep.log | cut -c1-500; pack
echo "=== done $(date -u +%T)"
