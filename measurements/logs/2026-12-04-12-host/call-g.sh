set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1
D=$OUT/g; mkdir -p $D/bw $D/host $D/grads
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
pack() { tar czf $OUT/call-g.tar.gz -C $OUT g; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee $D/gpu.txt
date -u +%FT%TZ | tee -a $D/gpu.txt
echo "=== op host costs $(date -u +%T)"
timeout 40 python3 .gpu/opcost.py 2>&1 | tee $D/opcost.log
echo "=== step host split, Qwen3 T=4096 $(date -u +%T)"
timeout 55 python3 measurements/scripts/h200_step_host.py --models Qwen3-30B-A3B --out $D/host > $D/host/step-host.log 2>&1; echo rc $?; grep -E "host fwd" $D/host/step-host.log | cut -c1-300; pack
echo "=== backward Mixtral all T $(date -u +%T)"
timeout 200 python3 measurements/scripts/h200_backward.py --models Mixtral-8x7B --tokens 4096,16384,32768 --no-tiles --no-grads --max-minutes 3 --out $D/bw > $D/bw/backward.log 2>&1; echo rc $?; sed -n '/^1\./,$p' $D/bw/backward.log | cut -c1-235; pack
echo "=== gradients, three models $(date -u +%T)"
timeout 120 python3 measurements/scripts/h200_backward.py --models Qwen3-30B-A3B,DeepSeek-V3,Mixtral-8x7B --no-times --no-tiles --out $D/grads > $D/grads/grads.log 2>&1; echo rc $?; sed -n '/^2\./,$p' $D/grads/grads.log | cut -c1-200 | head -20; pack
echo "=== ncu step DeepSeek-V3 T=16384 $(date -u +%T)"
timeout 80 $NCU --clock-control none --set full -k regex:"rows_gemm_kernel|expert_grad_kernel|sorted_moe_kernel" --launch-skip 6 -c 6 -o $D/ncu-step-DeepSeek-V3-T16384 \
  python3 measurements/scripts/h200_backward_profile.py --model DeepSeek-V3 --tokens 16384 > $D/ncu-step-DeepSeek-V3-T16384.log 2>&1; echo rc $?
r=$D/ncu-step-DeepSeek-V3-T16384.ncu-rep
[ -f $r ] && { $NCU -i $r --page raw --csv > ${r%.ncu-rep}-raw.csv 2>&1; $NCU -i $r --page details > ${r%.ncu-rep}-details.txt 2>&1; rm -f $r; python3 measurements/scripts/ncu_summary.py ${r%.ncu-rep}-raw.csv > ${r%.ncu-rep}-summary.csv; cut -d, -f2-13 ${r%.ncu-rep}-summary.csv | cut -c1-250; }
pack
echo "=== notebook 08 under nbval-lax $(date -u +%T)"
python3 -m ipykernel install --user --name python3 > /dev/null 2>&1
timeout 100 python3 -m pytest --nbval-lax -q -p no:cacheprovider notebooks/08_training.ipynb > $D/notebook-08-nbval.log 2>&1; echo rc $?; tail -2 $D/notebook-08-nbval.log; pack
echo "=== done $(date -u +%T)"
