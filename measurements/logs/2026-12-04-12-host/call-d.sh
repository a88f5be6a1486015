set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1
D=$OUT/d; mkdir -p $D/host $D/mx
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee $D/gpu.txt
date -u +%FT%TZ | tee -a $D/gpu.txt
echo "=== where a T = 4096 step goes: host or GPU $(date -u +%T)"
timeout 150 python3 measurements/scripts/h200_step_host.py --out $D/host > $D/host/step-host.log 2>&1; echo rc $?; grep -v "^-\|^ \|^Name\|^=" $D/host/step-host.log | grep -v "^\s*$" | cut -c1-300 | tail -12
echo "=== backward GPU tests $(date -u +%T)"
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_backward_kernel.py tests/test_tuning.py > $D/backward-gpu-tests.log 2>&1; echo rc $?; tail -3 $D/backward-gpu-tests.log
echo "=== Mixtral-8x7B T = 32768, four impls $(date -u +%T)"
timeout 130 python3 measurements/scripts/h200_backward.py --models Mixtral-8x7B --tokens 32768 --no-tiles --no-grads --max-minutes 1.8 --out $D/mx > $D/mx/backward.log 2>&1; echo rc $?; sed -n '/^1\./,$p' $D/mx/backward.log | cut -c1-235
for c in DeepSeek-V3:4096 Mixtral-8x7B:16384; do
  m=${c%%:*}; t=${c##*:}
  echo "=== ncu step $m T=$t $(date -u +%T)"
  timeout 100 $NCU --clock-control none --set full -k regex:"rows_gemm_kernel|expert_grad_kernel|sorted_moe_kernel" --launch-skip 6 -c 6 -o $D/ncu-step-$m-T$t \
    python3 measurements/scripts/h200_backward_profile.py --model $m --tokens $t > $D/ncu-step-$m-T$t.log 2>&1; echo rc $?; tail -2 $D/ncu-step-$m-T$t.log
  r=$D/ncu-step-$m-T$t.ncu-rep
  [ -f $r ] && { $NCU -i $r --page raw --csv > ${r%.ncu-rep}-raw.csv 2>&1; $NCU -i $r --page details > ${r%.ncu-rep}-details.txt 2>&1; rm -f $r; python3 measurements/scripts/ncu_summary.py ${r%.ncu-rep}-raw.csv > ${r%.ncu-rep}-summary.csv; cut -c1-300 ${r%.ncu-rep}-summary.csv; }
done
echo "=== done $(date -u +%T)"
