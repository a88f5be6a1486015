# On an H200, both pending measurements in one call: (1) Part 8's dW tile sweep on DeepSeek-V3 at
# T = 16384, 32768 and 4096 with the Gluon candidates, the winners into the H200 training table, the
# step against the composition at every T; (2) Part 7's rescaled forms (call-h200-rescaled.sh's sweep).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
D=$OUT/k; mkdir -p $D/bw $D/w
pack() { tar czf $OUT/call-k.tar.gz -C $OUT k; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee $D/gpu.txt
date -u +%FT%TZ | tee -a $D/gpu.txt
for T in 16384 32768 4096; do
  mkdir -p $D/ds$T
  echo "=== DeepSeek-V3 T=$T dW tile sweep $(date -u +%T)"
  timeout 60 python3 measurements/scripts/h200_backward.py --no-times --no-grads --tile-case DeepSeek-V3:$T --tile-gemms dw2,dw13 --max-minutes 0.9 --out $D/ds$T > $D/ds$T/sweep.log 2>&1; echo rc $?; sed -n '/^3\./,$p' $D/ds$T/sweep.log | cut -c1-200; pack
done
python3 measurements/scripts/merge_training_table.py $D/ds16384/tuned_configs_training.json $D/ds32768/tuned_configs_training.json $D/ds4096/tuned_configs_training.json --copy $D/merged-table.json
echo "=== DeepSeek-V3 step, all T, the merged table $(date -u +%T)"
timeout 120 python3 measurements/scripts/h200_backward.py --models DeepSeek-V3 --tokens 4096,16384,32768 --no-tiles --no-grads --max-minutes 1.9 --out $D/bw > $D/bw/backward.log 2>&1; echo rc $?; sed -n '/^1\./,$p' $D/bw/backward.log | cut -c1-200; pack
echo "=== FP8 rescaled sweep $(date -u +%T)"
OUT=$D/w timeout 200 python3 measurements/scripts/h200_gluon_fp8.py sweep --models DeepSeek-V3 Kimi-K2 Qwen3-30B-A3B --M 16384 4096 \
  --variants gluon-128x8-s4 gluon-128x256-rescaled-split-s4-g8 gluon-128x256-rescaled-s3-g8 \
  --layers tl gluon-fused-s4-d64s6 gluon-unfused-128 gluon-rescaled-split-128 --deadline 150 > $D/w/sweep.log 2>&1; echo rc $?; grep -E "ceilings|floor|Error|error|deadline" $D/w/sweep.log | cut -c1-300; pack
echo "=== done $(date -u +%T)"
