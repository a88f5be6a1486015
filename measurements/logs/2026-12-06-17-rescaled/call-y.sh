# Call y (seventeenth session, an H100 again): the sweep with the weights quantised 32 experts at a
# time (DeepSeek-V3 and Kimi-K2 first GEMMs still ran out of memory at their float64 check; the layers
# ran), notebook 07 under nbval-lax (35 passed), DeepSeek-V3's layer tests with 6 float64 rows (4 passed).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
D=$OUT/y; mkdir -p $D
pack() { tar czf $OUT/call-y.tar.gz -C $OUT y; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee $D/gpu.txt
date -u +%FT%TZ | tee -a $D/gpu.txt
echo "=== sweep: rescaled in place against the shipped kernel $(date -u +%T)"
OUT=$D timeout 300 python3 measurements/scripts/h200_gluon_fp8.py sweep --models Qwen3-30B-A3B DeepSeek-V3 Kimi-K2 --M 16384 4096 1024 \
  --variants gluon-128x8-s4 gluon-128x256-rescaled-s4-g8 gluon-128x256-rescaled-split-s4-g8 gluon-128x256-rescaled-s3-g8 gluon-128x256-rescaled-s4-g4 \
  --layers gluon-fused-s4-d64s6 gluon-unfused-128 gluon-rescaled-128 gluon-rescaled-split-128 gluon-rescaled-up-d128 --deadline 240 > $D/sweep.log 2>&1; echo rc $?; grep -E "ceilings|floor|Error|error|deadline" $D/sweep.log | cut -c1-700; pack
echo "=== notebook 07 under nbval-lax $(date -u +%T)"
python3 -m ipykernel install --user --name python3 > /dev/null 2>&1
timeout 90 python3 -m pytest --nbval-lax -q -p no:cacheprovider notebooks/07_fp8_experts.ipynb > $D/notebook-07-nbval.log 2>&1; echo rc $?; tail -2 $D/notebook-07-nbval.log; pack
echo "=== DeepSeek-V3's layer GPU tests $(date -u +%T)"
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gluon_fp8.py -k "step_exact and 7168" -rA > $D/gpu-tests.log 2>&1; echo rc $?; grep -E "^(PASSED|FAILED)|passed|failed" $D/gpu-tests.log | tail -6; pack
echo "=== done $(date -u +%T)"
