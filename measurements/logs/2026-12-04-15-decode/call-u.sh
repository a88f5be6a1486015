# GPU call u for issue 31 (fifteenth session): the decode path's third form (x quantised once a
# step, or beforehand; each program covers all of a token's topk experts) tested and measured
# against the aligned layer and bf16, and where its time goes kernel by kernel. torch, Triton and
# numpy are the GPU image's; pytest comes from .whl if it lacks it.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -m pytest --version > /dev/null 2>&1 || { python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site; }
D=$OUT/u; mkdir -p $D
pack() { tar czf $OUT/call-u.tar.gz -C $OUT u; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee $D/gpu.txt
echo "=== GPU tests $(date -u +%T)"
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fp8_decode.py -rA > $D/gpu-tests.log 2>&1; echo rc $?; grep -E "passed|failed|Error" $D/gpu-tests.log | tail -6; pack
echo "=== decode path against the aligned layer $(date -u +%T)"
OUT=$D timeout 200 python3 measurements/scripts/h200_fp8_decode.py --models DeepSeek-V3 Qwen3-30B-A3B Kimi-K2 --M 1 2 4 8 > $D/decode.log 2>&1; echo rc $?; cut -c1-300 $D/decode.log; pack
echo "=== decode, kernel by kernel $(date -u +%T)"
OUT=$D timeout 100 python3 measurements/scripts/h200_fp8_decode_profile.py --models DeepSeek-V3 Qwen3-30B-A3B --M 1 > $D/decode-profile.log 2>&1; echo rc $?; grep -v USDT $D/decode-profile.log | cut -c1-330; pack
echo "=== done $(date -u +%T)"
