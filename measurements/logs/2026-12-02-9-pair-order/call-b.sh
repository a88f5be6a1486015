set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1
D=$OUT/b; mkdir -p $D
echo "=== split FP8 GPU test $(date -u +%T)"
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gluon_fp8.py -k split > $D/split-tests.log 2>&1; echo rc $?; tail -3 $D/split-tests.log
echo "=== FP8 sweep: tl, plain, split $(date -u +%T)"
OUT=$D timeout 260 python3 measurements/scripts/h200_gluon_fp8.py sweep --models DeepSeek-V3 Qwen3-30B-A3B Kimi-K2 --M 4096 16384 --variants gluon-128x8-s4 gluon-128x8-s4-split --deadline 200 > $D/fp8-sweep.log 2>&1; echo rc $?; grep -E "first|ceilings" $D/fp8-sweep.log | cut -c1-220
echo "=== bf16 sweep with the hybrid $(date -u +%T)"
timeout 200 python3 measurements/scripts/h200_gluon_bf16.py sweep --models Qwen3-30B-A3B DeepSeek-V3 DeepSeek-V2-Lite --M 2048 16384 --deadline 150 --out $D > $D/bf16-sweep.log 2>&1; echo rc $?; grep -E "M=|tl-sorted|hybrid|grouped|x[0-9]" $D/bf16-sweep.log | cut -c1-160 | tail -40
echo "=== done $(date -u +%T)"
tar czf $OUT/call-b.tar.gz -C $OUT b && rm -rf $D
