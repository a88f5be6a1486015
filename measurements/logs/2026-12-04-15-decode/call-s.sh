# GPU call s for issue 31 (fifteenth session): the decode path (kernels/fp8_decode.py) tested and
# measured, and where a decode layer call's time goes, kernel by kernel, on both FP8 paths and bf16.
# The aim at M <= 256 is 1.7x bf16 (DeepSeek-V3, Kimi-K2) and 1.4x (Qwen3-30B-A3B); the bench read
# 1.58x and 1.06x at M = 1 on the aligned path. torch, Triton and numpy are the GPU image's; pytest
# comes from .whl only if the image lacks it.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -m pytest --version > /dev/null 2>&1 || { python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site; }
D=$OUT/s; mkdir -p $D
pack() { tar czf $OUT/call-s.tar.gz -C $OUT s; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee $D/gpu.txt
echo "=== GPU tests $(date -u +%T)"
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fp8_decode.py tests/test_fp8.py -rA > $D/gpu-tests.log 2>&1; echo rc $?; grep -E "passed|failed|Error" $D/gpu-tests.log | tail -6; pack
echo "=== decode path against the aligned layer $(date -u +%T)"
OUT=$D timeout 230 python3 measurements/scripts/h200_fp8_decode.py --models DeepSeek-V3 Qwen3-30B-A3B Kimi-K2 --M 1 2 4 8 > $D/decode.log 2>&1; echo rc $?; cut -c1-300 $D/decode.log; pack
echo "=== decode, kernel by kernel $(date -u +%T)"
OUT=$D timeout 150 python3 measurements/scripts/h200_fp8_decode_profile.py --models DeepSeek-V3 Qwen3-30B-A3B --M 1 64 > $D/decode-profile.log 2>&1; echo rc $?; cut -c1-330 $D/decode-profile.log | grep -v USDT; pack
echo "=== done $(date -u +%T)"
