# Ran with fp8-split-k.patch (beside this file; it applies to 461e5dc) applied: the package's split-K, measured and then taken out again;
# the script's --split option went with it.
# Call c: where a split-K call's time goes at M = 1 (split_profile.py.txt, per launch), then call b's
# sweep again on Qwen3-30B-A3B and DeepSeek-V3 at M = 1 and 2, after the finishing pass's split loop
# was unrolled (every split's loads in flight at once).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/c; mkdir -p $D
pack() { tar -czf $OUT/call-c.tgz -C /tmp c; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
cp measurements/logs/2026-12-06-22-anchors/split_profile.py.txt /tmp/split_profile.py
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_fp8.py -k split > $D/gpu-tests.log 2>&1; tail -2 $D/gpu-tests.log
timeout 200 python3 /tmp/split_profile.py Qwen3-30B-A3B DeepSeek-V3 2>&1 | grep -v Warn | tee $D/split-profile.log
pack
OUT=$D timeout 300 python3 measurements/scripts/h200_fp8_decode.py --models Qwen3-30B-A3B DeepSeek-V3 \
  --M 1 2 --split --variants --table-of "NVIDIA H200" 2>&1 | grep -v Warning | tee $D/split-k.log
pack
