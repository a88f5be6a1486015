# The fourth call (the session's last device minutes): call c's on the GPU whose table ships. The Gluon
# dA' kernel's DeepSeek-V3 test (call c refused its 64-row tile: the test asked 8 warps); its sweep on
# Mixtral-8x7B at every T and DeepSeek-V3 at 16384 (on call c's H100 it lost at 4096 and 32768); the
# winners and call b's Mixtral-8x7B dW sweep into the table; the step of both models at every T.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
L=measurements/logs/2026-12-06-19-gluon-dact
D=$OUT/d; mkdir -p $D/bw
pack() { tar czf $OUT/call-d.tar.gz -C $OUT d; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee $D/gpu.txt
date -u +%FT%TZ | tee -a $D/gpu.txt
echo "=== GPU tests $(date -u +%T)"
timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_backward_kernel.py -k "gluon_dact_kernel_on_real_shapes and DeepSeek" -rA > $D/gpu-tests.log 2>&1; echo rc $?
grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $D/gpu-tests.log | tail -3; pack
sweep() {  # MODEL T GEMMS NAME
  mkdir -p $D/$4; echo "=== $1 T=$2 $3 $(date -u +%T)"
  timeout 60 python3 measurements/scripts/h200_backward.py --no-times --no-grads --gluon-only --tile-case $1:$2 --tile-gemms $3 --max-minutes 0.7 --out $D/$4 > $D/$4/sweep.log 2>&1; echo rc $?
  grep -E " best |rror" $D/$4/sweep.log | cut -c1-160; pack
}
sweep Mixtral-8x7B 16384 dact mx16384
sweep DeepSeek-V3 16384 dact ds16384
sweep Mixtral-8x7B 4096 dact mx4096
sweep Mixtral-8x7B 32768 dact mx32768
python3 measurements/scripts/merge_training_table.py $L/call-b/mxdw*/tuned_configs_training.json $D/*/tuned_configs_training.json --copy $D/merged-table.json > $D/merge.log 2>&1; tail -6 $D/merge.log
for m in DeepSeek-V3 Mixtral-8x7B; do
  echo "=== $m step, all T $(date -u +%T)"
  timeout 130 python3 measurements/scripts/h200_backward.py --models $m --tokens 4096,16384,32768 --impls ours,ours-tl-dw,ours-tl,grouped_mm --no-tiles --no-grads --max-minutes 2.0 --out $D/bw/$m > $D/bw/$m.log 2>&1; echo rc $?
  grep -E "fwd\+bwd|rror" $D/bw/$m.log | cut -c1-110 | tail -14; pack
done
echo "=== done $(date -u +%T) after ${SECONDS}s"
