# The next GPU call (written in the twelfth session, not run). (1) The Part 8 GPU tests on the
# final code: that session's last call (logs/2026-12-04-12-host/call-h.sh) ran 32 of the 34 GPU
# tests of test_align.py and test_backward_kernel.py before a 110 s timeout; the two after them
# (gradients near 1e-5, a bad id refused after the forward) ran only on the clamping alignment
# (call-f.sh, 9 passed). (2) A GPU test of the persistent grid for the M-grouped GEMMs (the
# interpreter's test, on a real shape). (3) The tile sweep of dA' and dx with their persistent
# candidates, where the step stays under 1.25x: merge any winner into
# moe_tutorial/data/tuned_configs_training_h200.json as call-c.sh of logs/2026-12-03-11-step did.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1
D=$OUT/n; mkdir -p $D
pack() { tar czf $OUT/call-n.tar.gz -C $OUT n; }
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_align.py tests/test_backward_kernel.py -rA > $D/gpu-tests.log 2>&1; echo rc $?; tail -5 $D/gpu-tests.log; pack
for c in DeepSeek-V3:4096 DeepSeek-V3:16384 Mixtral-8x7B:16384; do
  m=${c%%:*}; t=${c##*:}; mkdir -p $D/$m-$t
  timeout 110 python3 measurements/scripts/h200_backward.py --no-times --no-grads --tile-case $c --tile-gemms dact,dx --max-minutes 1.5 --out $D/$m-$t > $D/$m-$t/sweep.log 2>&1; echo rc $?; sed -n '/^3\./,$p' $D/$m-$t/sweep.log | cut -c1-200; pack
done
