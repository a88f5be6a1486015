set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1
D=$OUT/f; mkdir -p $D/bw $D/host
pack() { tar czf $OUT/call-f.tar.gz -C $OUT f; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee $D/gpu.txt
date -u +%FT%TZ | tee -a $D/gpu.txt
echo "=== backward GPU tests $(date -u +%T)"
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_backward_kernel.py > $D/backward-gpu-tests.log 2>&1; echo rc $?; tail -3 $D/backward-gpu-tests.log; pack
echo "=== step host split, Qwen3 T=4096 $(date -u +%T)"
timeout 55 python3 measurements/scripts/h200_step_host.py --models Qwen3-30B-A3B --out $D/host > $D/host/step-host.log 2>&1; echo rc $?; grep -E "host fwd" $D/host/step-host.log | cut -c1-300; pack
echo "=== backward all models, all T, grads $(date -u +%T)"
timeout 420 python3 measurements/scripts/h200_backward.py --models Qwen3-30B-A3B,DeepSeek-V3 --tokens 4096,16384,32768 --no-tiles --no-grads --max-minutes 6.3 --out $D/bw > $D/bw/backward.log 2>&1; echo rc $?; sed -n '/^1\./,$p' $D/bw/backward.log | cut -c1-235; pack
echo "=== done $(date -u +%T)"
