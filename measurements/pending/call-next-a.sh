# Next session, first call (any Hopper; carry .whl and .anchors). Each part packs its own tarball as it ends.
# On an H200 (about 540 s at most): call-h200.sh (vLLM 0.34.0 beside ours), then the FP8 layer form by form
# on Qwen3-30B-A3B and DeepSeek-V3 (call-h200-layer.sh; Kimi-K2 is in call-next-b.sh).
# On an H100: the GPU tests whose set-up the thirty-second session's read-over shared (`_fp8_layer_problem`
# in tests/test_gluon_fp8.py), which have not run on a GPU since.
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  bash measurements/pending/call-h200.sh
  MODELS="Qwen3-30B-A3B DeepSeek-V3" bash measurements/pending/call-h200-layer.sh
else
  export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; D=/tmp/t; mkdir -p $D
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
  timeout 500 python3 -m pytest -q -p no:cacheprovider tests/test_gluon_fp8.py \
    -k "step_exact or sorted_quantiser or tma_copies_out or yield_edit" 2>&1 | tail -4 | tee $D/gpu-tests-layer-problem.log
  tar -czf $OUT/call-t.tgz -C /tmp t
fi
