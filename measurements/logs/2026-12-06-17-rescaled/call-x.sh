# Call x (seventeenth session): the rescaled kernel's GPU tests, then the sweep. An H100 came (80 GB):
# 35 passed, DeepSeek-V3's four layer cases ran out of memory (their float64 reference), and the
# sweep ran out of memory making DeepSeek-V3's FP8 weights. Followed by pending/call-rescaled-sweep.sh.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1
D=$OUT/x; mkdir -p $D
pack() { tar czf $OUT/call-x.tar.gz -C $OUT x; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee $D/gpu.txt
date -u +%FT%TZ | tee -a $D/gpu.txt
echo "=== Gluon FP8 GPU tests $(date -u +%T)"
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gluon_fp8.py -rA > $D/gpu-tests.log 2>&1; echo rc $?; grep -E "^(FAILED|ERROR)|passed|failed" $D/gpu-tests.log | tail -8; pack
echo "=== sweep: rescaled in place against the shipped kernel $(date -u +%T)"
OUT=$D timeout 380 python3 measurements/scripts/h200_gluon_fp8.py sweep --models DeepSeek-V3 Qwen3-30B-A3B Kimi-K2 --M 16384 4096 1024 \
  --variants gluon-128x8-s4 gluon-128x256-rescaled-s4-g8 gluon-128x256-rescaled-split-s4-g8 gluon-128x256-rescaled-s3-g8 gluon-128x256-rescaled-s4-g4 \
  --layers gluon-fused-s4-d64s6 gluon-unfused-128 gluon-rescaled-128 gluon-rescaled-split-128 gluon-rescaled-up-d128 --deadline 320 > $D/sweep.log 2>&1; echo rc $?; grep -E "ceilings|floor|Error|error|deadline" $D/sweep.log | cut -c1-700; pack
echo "=== done $(date -u +%T)"
