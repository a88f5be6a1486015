set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1
D=$OUT/a; mkdir -p $D/sw $D/sw2
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
echo "=== backward GPU tests, sorted copies $(date -u +%T)"
timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_backward_kernel.py > $D/backward-tests.log 2>&1; echo rc $?; tail -6 $D/backward-tests.log | cut -c1-300
echo "=== Qwen3 T=32768: four impls, then the tile sweep on the sorted copies $(date -u +%T)"
timeout 240 python3 measurements/scripts/h200_backward.py --models Qwen3-30B-A3B --tokens 32768 --tile-case Qwen3-30B-A3B:32768 --no-grads --max-minutes 3.6 --out $D/sw > $D/sw/sweep.log 2>&1; echo rc $?; sed -n '/^1\./,$p' $D/sw/sweep.log | cut -c1-250
echo "=== DeepSeek-V3 T=4096: the same $(date -u +%T)"
timeout 200 python3 measurements/scripts/h200_backward.py --models DeepSeek-V3 --tokens 4096 --tile-case DeepSeek-V3:4096 --no-grads --max-minutes 3 --out $D/sw2 > $D/sw2/sweep.log 2>&1; echo rc $?; sed -n '/^1\./,$p' $D/sw2/sweep.log | cut -c1-250
echo "=== done $(date -u +%T)"
tar czf $OUT/call-a.tar.gz -C $OUT a && rm -rf $D
