# The next GPU call (written in the fifteenth session): the decode experiment's GPU tests as committed
# (its own input checks, the measured defaults; its kernels are call u's). Notebook 07 itself passed
# under nbval-lax on an H100 in the seventeenth session's call y (35 passed), so that part repeats it.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1
D=$OUT/v; mkdir -p $D
pack() { tar czf $OUT/call-v.tar.gz -C $OUT v; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
echo "=== GPU tests $(date -u +%T)"
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fp8_decode.py -rA > $D/gpu-tests.log 2>&1; echo rc $?; grep -E "passed|failed|Error" $D/gpu-tests.log | tail -4; pack
echo "=== notebook 07 under nbval-lax $(date -u +%T)"
timeout 330 python3 -m pytest --nbval-lax -q -p no:cacheprovider notebooks/07_fp8_experts.ipynb > $D/notebook-07-nbval.log 2>&1; echo rc $?; tail -3 $D/notebook-07-nbval.log; pack
echo "=== done $(date -u +%T)"
