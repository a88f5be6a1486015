# Not run (built in the nineteenth session after its device time was spent): the forward's gate/up GEMM on
# Part 4's Gluon kernel with H kept by its epilogue (config.gluon on "up"). Its GPU tests, its sweep
# against the table's tl tile (the copy of x into sorted order timed with it) where the step misses or was
# close, the winners into the table, the step of both models. Run on an H200; about 8 minutes.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
D=$OUT/u; mkdir -p $D/bw
pack() { tar czf $OUT/call-u.tar.gz -C $OUT u; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_backward_kernel.py -k "gluon_gate_up" -rA > $D/gpu-tests.log 2>&1; echo rc $?
grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $D/gpu-tests.log | tail -5; pack
for c in "Mixtral-8x7B 16384 mx16384" "DeepSeek-V3 16384 ds16384" "Mixtral-8x7B 4096 mx4096" "Mixtral-8x7B 32768 mx32768"; do
  set -- $c; mkdir -p $D/$3
  timeout 60 python3 measurements/scripts/h200_backward.py --no-times --no-grads --gluon-only --tile-case $1:$2 --tile-gemms up --max-minutes 0.7 --out $D/$3 > $D/$3/sweep.log 2>&1; echo rc $?
  grep -E " best |rror" $D/$3/sweep.log | cut -c1-160; pack
done
python3 measurements/scripts/merge_training_table.py $D/*/tuned_configs_training.json --copy $D/merged-table.json > $D/merge.log 2>&1; tail -4 $D/merge.log
for m in Mixtral-8x7B DeepSeek-V3; do
  timeout 150 python3 measurements/scripts/h200_backward.py --models $m --tokens 4096,16384,32768 --impls ours,ours-tl-dw,ours-tl,grouped_mm --no-tiles --no-grads --max-minutes 2.2 --out $D/bw/$m > $D/bw/$m.log 2>&1; echo rc $?
  grep -E "fwd\+bwd|rror" $D/bw/$m.log | cut -c1-110 | tail -12; pack
done
