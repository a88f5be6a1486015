set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1
D=$OUT/b; mkdir -p $D/ds $D/mx
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
for c in "DeepSeek-V3:16384 ds" "Mixtral-8x7B:16384 mx"; do set -- $c
echo "=== tile sweep $1, sorted copies $(date -u +%T)"
timeout 250 python3 measurements/scripts/h200_backward.py --no-times --no-grads --tile-case $1 --max-minutes 3.8 --out $D/$2 > $D/$2/sweep.log 2>&1; echo rc $?; sed -n '/^3\./,$p' $D/$2/sweep.log | cut -c1-200
done
echo "=== done $(date -u +%T)"
tar czf $OUT/call-b.tar.gz -C $OUT b && rm -rf $D
