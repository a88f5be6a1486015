# The second call: call a's again with the Gluon dA' kernel rewritten (two MMA warpgroups taking turns,
# one's epilogue under the other's MMAs; call a's single warpgroup lost to tl): its GPU tests, its tile sweep
# (the table's tile against the Gluon tiles, each GEMM alone) on the three models, then Mixtral-8x7B's
# dW GEMMs against the Gluon dW tiles; each sweep starts only while the call has time for it.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
D=$OUT/b; mkdir -p $D
pack() { tar czf $OUT/call-b.tar.gz -C $OUT b; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee $D/gpu.txt
date -u +%FT%TZ | tee -a $D/gpu.txt
echo "=== GPU tests $(date -u +%T)"
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_backward_kernel.py -k "gluon" -rA > $D/gpu-tests.log 2>&1; echo rc $?
grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $D/gpu-tests.log | tail -14; pack
sweep() {  # MODEL T GEMMS NAME
  [ $SECONDS -gt 500 ] && { echo "skipped $4: out of time"; return; }
  mkdir -p $D/$4; echo "=== $1 T=$2 $3 $(date -u +%T)"
  timeout 75 python3 measurements/scripts/h200_backward.py --no-times --no-grads --gluon-only --tile-case $1:$2 --tile-gemms $3 --max-minutes 0.8 --out $D/$4 > $D/$4/sweep.log 2>&1; echo rc $?
  grep -E " best |error|Error" $D/$4/sweep.log | cut -c1-220; pack
}
sweep DeepSeek-V3 16384 dact ds16384
sweep Mixtral-8x7B 16384 dact mx16384
sweep DeepSeek-V3 4096 dact ds4096
sweep Mixtral-8x7B 4096 dact mx4096
sweep DeepSeek-V3 32768 dact ds32768
sweep Mixtral-8x7B 32768 dact mx32768
sweep Qwen3-30B-A3B 16384 dact qw16384
sweep Qwen3-30B-A3B 4096 dact qw4096
sweep Qwen3-30B-A3B 32768 dact qw32768
sweep Mixtral-8x7B 16384 dw2,dw13 mxdw16384
sweep Mixtral-8x7B 32768 dw2,dw13 mxdw32768
sweep Mixtral-8x7B 4096 dw2,dw13 mxdw4096
python3 measurements/scripts/merge_training_table.py $D/*/tuned_configs_training.json --copy $D/merged-table.json > $D/merge.log 2>&1; tail -3 $D/merge.log
pack; echo "=== done $(date -u +%T) after ${SECONDS}s"
