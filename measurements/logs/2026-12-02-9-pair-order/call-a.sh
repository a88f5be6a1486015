set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1
D=$OUT/a; mkdir -p $D/bw
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
echo "=== backward GPU tests, pair-order H $(date -u +%T)"
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_backward_kernel.py tests/test_training.py > $D/backward-tests.log 2>&1; tail -4 $D/backward-tests.log
echo "=== split FP8 GPU test $(date -u +%T)"
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gluon_fp8.py -k split > $D/split-tests.log 2>&1; echo rc $?; tail -4 $D/split-tests.log
echo "=== backward all models, all T, grads $(date -u +%T)"
timeout 330 python3 measurements/scripts/h200_backward.py --models Qwen3-30B-A3B,DeepSeek-V3,Mixtral-8x7B --tokens 4096,16384,32768 --no-tiles --max-minutes 5 --out $D/bw > $D/bw/backward.log 2>&1; echo rc $?; sed -n '/^1\./,$p' $D/bw/backward.log | cut -c1-230
echo "=== done $(date -u +%T)"
tar czf $OUT/call-a.tar.gz -C $OUT a && rm -rf $D
