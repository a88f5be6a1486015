set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1
D=$OUT/e; mkdir -p $D
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee $D/gpu.txt
date -u +%FT%TZ | tee -a $D/gpu.txt
echo "=== step host split and profiles, Qwen3 T=4096 $(date -u +%T)"
timeout 90 python3 measurements/scripts/h200_step_host.py --models Qwen3-30B-A3B --out $D > $D/step-host.log 2>&1; echo rc $?
grep -E "host fwd|Self CPU|Self CUDA" $D/step-host.log | cut -c1-300
for c in DeepSeek-V3:4096 DeepSeek-V3:16384 Qwen3-30B-A3B:4096; do
  echo "=== dW tile sweep $c $(date -u +%T)"
  mkdir -p $D/${c%%:*}-${c##*:}
  timeout 150 python3 measurements/scripts/h200_backward.py --no-times --no-grads --tile-case $c --tile-gemms dw2,dw13 --max-minutes 2.0 --out $D/${c%%:*}-${c##*:} > $D/${c%%:*}-${c##*:}/sweep.log 2>&1; echo rc $?; sed -n '/^3\./,$p' $D/${c%%:*}-${c##*:}/sweep.log | cut -c1-200
done
echo "=== done $(date -u +%T)"
tar czf $OUT/call-e.tar.gz -C $OUT e && rm -rf $D
