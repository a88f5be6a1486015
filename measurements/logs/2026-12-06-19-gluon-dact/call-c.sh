# The third call: the Gluon dA' kernel rewritten again (8 MMA warps on one tile, as in call a, with the
# epilogue in 4 warps of its own that run under the next tile's MMAs); its GPU tests; its sweep where the
# step misses (DeepSeek-V3, Mixtral-8x7B), going on to the other T only if it wins at 16384; the winners
# and call b's Mixtral-8x7B dW sweep into the table; then the step of both models at every T, with
# every GEMM in tl (ours-tl), the dW GEMMs in tl (ours-tl-dw) and the table's (ours), and the composition.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
L=measurements/logs/2026-12-06-19-gluon-dact
D=$OUT/c; mkdir -p $D/bw
pack() { tar czf $OUT/call-c.tar.gz -C $OUT c; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee $D/gpu.txt
date -u +%FT%TZ | tee -a $D/gpu.txt
echo "=== GPU tests $(date -u +%T)"
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_backward_kernel.py -k "gluon_dact" -rA > $D/gpu-tests.log 2>&1; echo rc $?
grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $D/gpu-tests.log | tail -8; pack
sweep() {  # MODEL T GEMMS NAME
  mkdir -p $D/$4; echo "=== $1 T=$2 $3 $(date -u +%T)"
  timeout 75 python3 measurements/scripts/h200_backward.py --no-times --no-grads --gluon-only --tile-case $1:$2 --tile-gemms $3 --max-minutes 0.8 --out $D/$4 > $D/$4/sweep.log 2>&1; echo rc $?
  grep -E " best |error|Error" $D/$4/sweep.log | cut -c1-220; pack
}
sweep DeepSeek-V3 16384 dact ds16384
sweep Mixtral-8x7B 16384 dact mx16384
if grep -q '"gluon": true' $D/ds16384/tuned_configs_training.json $D/mx16384/tuned_configs_training.json 2>/dev/null; then
  for c in "DeepSeek-V3 4096 ds4096" "DeepSeek-V3 32768 ds32768" "Mixtral-8x7B 4096 mx4096" "Mixtral-8x7B 32768 mx32768"; do
    set -- $c; sweep $1 $2 dact $3
  done
else echo "the Gluon dA' kernel lost at 16384 on both: no further sweeps"; fi
python3 measurements/scripts/merge_training_table.py $L/call-b/mxdw*/tuned_configs_training.json $D/*/tuned_configs_training.json --copy $D/merged-table.json > $D/merge.log 2>&1; tail -4 $D/merge.log
for m in Mixtral-8x7B DeepSeek-V3; do
  [ $SECONDS -gt 420 ] && { echo "skipped the $m step: out of time"; continue; }
  echo "=== $m step, all T $(date -u +%T)"
  timeout 150 python3 measurements/scripts/h200_backward.py --models $m --tokens 4096,16384,32768 --impls ours,ours-tl-dw,ours-tl,grouped_mm --no-tiles --no-grads --max-minutes 2.3 --out $D/bw/$m > $D/bw/$m.log 2>&1; echo rc $?
  grep -E "fwd\+bwd|error" $D/bw/$m.log | cut -c1-110 | tail -14; pack
done
echo "=== done $(date -u +%T) after ${SECONDS}s"
