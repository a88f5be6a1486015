set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1
D=$OUT/o; mkdir -p $D
pack() { tar czf $OUT/call-o.tar.gz -C $OUT o; }
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1); echo "ncu: $NCU"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee $D/gpu.txt
date -u +%FT%TZ | tee -a $D/gpu.txt
echo "=== e4m3 Gluon GPU tests $(date -u +%T)"
timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gluon_kernel.py -k e4m3 -rA > $D/gpu-tests.log 2>&1; echo rc $?; tail -3 $D/gpu-tests.log; pack
echo "=== sweep: block scales against one scale per tensor $(date -u +%T)"
OUT=$D timeout 300 python3 measurements/scripts/h200_gluon_fp8.py sweep --models DeepSeek-V3 Qwen3-30B-A3B Kimi-K2 --M 4096 16384 --variants gluon-128x8-s4 pertensor-128x128-s4 pertensor-128x256-s4 --deadline 250 > $D/sweep.log 2>&1; echo rc $?; grep -E "ceilings|floor|Error|error" $D/sweep.log | cut -c1-330; pack
echo "=== ncu DeepSeek-V3 M=16384 $(date -u +%T)"
timeout 150 $NCU --clock-control none --set full -k regex:"gluon_(fp8_)?moe_kernel" -c 3 -o $D/ncu-dsv3-M16384 \
  python3 measurements/scripts/h200_gluon_fp8.py profile --models DeepSeek-V3 --M 16384 --variants gluon-128x8-s4 pertensor-128x128-s4 pertensor-128x256-s4 > $D/ncu.log 2>&1; echo rc $?; tail -3 $D/ncu.log
for r in $D/*.ncu-rep; do $NCU -i $r --page details > ${r%.ncu-rep}-details.txt 2>&1; $NCU -i $r --page raw --csv > ${r%.ncu-rep}-raw.csv 2>&1; rm -f $r; done
python3 measurements/scripts/ncu_summary.py $D/ncu-dsv3-M16384-raw.csv > $D/ncu-summary.csv 2>&1; cut -c1-400 $D/ncu-summary.csv; pack
echo "=== notebook 08 under nbval-lax $(date -u +%T)"
python3 -m ipykernel install --user --name python3 > /dev/null 2>&1
timeout 110 python3 -m pytest --nbval-lax -q -p no:cacheprovider notebooks/08_training.ipynb > $D/notebook-08-nbval.log 2>&1; echo rc $?; tail -2 $D/notebook-08-nbval.log; pack
echo "=== done $(date -u +%T)"
