# Pending (twenty-sixth session, no device time left: written for the next session's first call, on any Hopper GPU):
# the committed whole-row stores and the new TMA copies out (config.tma_store), step by step, outputs packed after
# each: 1. the GPU tests of the Gluon kernels, of the FP8 layer on real shapes (the TMA forms among them: against
# float64 and bit for bit against gl.store) and of the sorted topk sum; 2. the FP8 layer form by form beside the bf16
# layer (scripts/tma_store_layer.py), Qwen3-30B-A3B, then DeepSeek-V3, each model in its own process.
# Then pending/call-store-tests.sh (notebook 07, Part 8's gate/up tests, DeepSeek-V3's first GEMM). Carry .whl, .anchors.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/t; mkdir -p $D
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
P="python3 -m pytest -q -p no:cacheprovider"; S=measurements/scripts/tma_store_layer.py
timeout 240 $P -m gpu tests/test_gluon_kernel.py tests/test_gluon_fp8.py tests/test_topk_sum.py \
  "tests/test_fp8.py::test_fp8_layer_on_real_shapes_on_gpu" > $D/gpu-tests.log 2>&1
echo rc $?; tail -3 $D/gpu-tests.log; tar -czf $OUT/call-t.tgz -C /tmp t
for model in Qwen3-30B-A3B DeepSeek-V3; do
  OUT=$D/$model timeout 150 python3 $S --models $model --M 4096 16384 2>&1 | grep -v Warning | tee $D/layer-$model.log
  tar -czf $OUT/call-t.tgz -C /tmp t
done
