set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
D=$OUT/r; mkdir -p $D
date -u +%FT%TZ | tee $D/gpu.txt
echo "=== sweep: the quantiser into sorted order, Kimi-K2 and Qwen3 $(date -u +%T)"
OUT=$D timeout 150 python3 measurements/scripts/h200_gluon_fp8.py sweep --models Kimi-K2 Qwen3-30B-A3B --M 4096 16384 --variants gluon-128x8-s4 --deadline 95 > $D/sweep.log 2>&1; echo rc $?; grep -E "ceilings|floor|Error|deadline" $D/sweep.log | cut -c1-420
tar czf $OUT/call-r.tar.gz -C $OUT r
