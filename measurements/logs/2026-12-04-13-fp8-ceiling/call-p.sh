set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1
D=$OUT/p; mkdir -p $D/bw
pack() { tar czf $OUT/call-p.tar.gz -C $OUT p; }
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee $D/gpu.txt
date -u +%FT%TZ | tee -a $D/gpu.txt
echo "=== ncu: one scale per tensor, DeepSeek-V3 M=16384 $(date -u +%T)"
timeout 140 $NCU --clock-control none --set full -k regex:"gluon_moe_kernel" -c 6 -o $D/ncu-pertensor-dsv3-M16384 \
  python3 measurements/scripts/h200_gluon_fp8.py profile --models DeepSeek-V3 --M 16384 --variants pertensor-128x128-s4 pertensor-128x256-s4 > $D/ncu.log 2>&1; echo rc $?; tail -2 $D/ncu.log
for r in $D/*.ncu-rep; do $NCU -i $r --page details > ${r%.ncu-rep}-details.txt 2>&1; $NCU -i $r --page raw --csv > ${r%.ncu-rep}-raw.csv 2>&1; rm -f $r; done
python3 measurements/scripts/ncu_summary.py $D/ncu-pertensor-dsv3-M16384-raw.csv > $D/ncu-summary.csv 2>&1; cut -c1-420 $D/ncu-summary.csv; pack
echo "=== backward DeepSeek-V3, all T, the new dx tiles $(date -u +%T)"
timeout 210 python3 measurements/scripts/h200_backward.py --models DeepSeek-V3 --tokens 4096,16384,32768 --no-tiles --no-grads --max-minutes 3.2 --out $D/bw > $D/bw/backward.log 2>&1; echo rc $?; sed -n '/^1\./,$p' $D/bw/backward.log | cut -c1-200; pack
echo "=== notebook 07 under nbval-lax $(date -u +%T)"
python3 -m ipykernel install --user --name python3 > /dev/null 2>&1
timeout 120 python3 -m pytest --nbval-lax -q -p no:cacheprovider notebooks/07_fp8_experts.ipynb > $D/notebook-07-nbval.log 2>&1; echo rc $?; tail -2 $D/notebook-07-nbval.log; pack
echo "=== done $(date -u +%T)"
