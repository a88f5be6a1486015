set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1
D=$OUT/q; mkdir -p $D
pack() { tar czf $OUT/call-q.tar.gz -C $OUT q; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee $D/gpu.txt
date -u +%FT%TZ | tee -a $D/gpu.txt
echo "=== the sorted quantiser, GPU tests $(date -u +%T)"
timeout 90 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gluon_fp8.py -k "sorted_quantiser or gather" -rA > $D/gpu-tests.log 2>&1; echo rc $?; grep -E "PASS|FAIL|passed|failed" $D/gpu-tests.log | tail -6; pack
echo "=== sweep: the quantiser into sorted order, the layer $(date -u +%T)"
OUT=$D timeout 330 python3 measurements/scripts/h200_gluon_fp8.py sweep --models DeepSeek-V3 Kimi-K2 Qwen3-30B-A3B --M 1024 4096 16384 --variants gluon-128x8-s4 --deadline 260 > $D/sweep.log 2>&1; echo rc $?; grep -E "ceilings|floor|Error|deadline" $D/sweep.log | cut -c1-400; pack
echo "=== notebook 07 under nbval-lax $(date -u +%T)"
python3 -m ipykernel install --user --name python3 > /dev/null 2>&1
timeout 90 python3 -m pytest --nbval-lax -q -p no:cacheprovider notebooks/07_fp8_experts.ipynb > $D/notebook-07-nbval.log 2>&1; echo rc $?; tail -2 $D/notebook-07-nbval.log; pack
echo "=== done $(date -u +%T)"
