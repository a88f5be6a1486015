set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/liger_kernel*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1
D=$OUT/d; mkdir -p $D/host $D/mx
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
echo "=== Mixtral-8x7B T = 32768, four impls $(date -u +%T)"
timeout 110 python3 measurements/scripts/h200_backward.py --models Mixtral-8x7B --tokens 32768 --no-tiles --no-grads --max-minutes 1.8 --out $D/mx > $D/mx/backward.log 2>&1; echo rc $?; sed -n '/^1\./,$p' $D/mx/backward.log | cut -c1-235
echo "=== where a T = 4096 step goes: host or GPU $(date -u +%T)"
timeout 70 python3 measurements/scripts/h200_step_host.py --models Qwen3-30B-A3B --out $D/host > $D/host/step-host.log 2>&1; echo rc $?; grep -v "^-\|^ \|^Name\|^=" $D/host/step-host.log | grep -v "^\s*$" | cut -c1-250 | tail -8
echo "=== done $(date -u +%T)"
