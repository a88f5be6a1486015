# Twenty-ninth session, call s: the split tiles' empty halves skipped (gluon_fp8_kernel.SKIP_EMPTY_HALVES).
# First the GPU tests (the skip against no skip bit for bit, the split layers against float64, the yield
# edit and the TMA copies with it), then scripts/half_skip_layer.py: the layer as dispatched against the
# same launches without the skip, one process a model. Any Hopper GPU.
set -u
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONPATH=$PWD; D=/tmp/s; mkdir -p $D
pack() { tar -czf $OUT/call-s.tgz -C /tmp s; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gluon_fp8.py \
  -k "skipping or yield or tma_copies_out or (step_exact and split)" > $D/gpu-tests.log 2>&1
echo "gpu tests rc $?"; tail -3 $D/gpu-tests.log; pack
S=measurements/scripts/half_skip_layer.py
for c in "Qwen3-30B-A3B 2048 4096 16384" "DeepSeek-V3 4096" "Kimi-K2 4096"; do
  set -- $c; m=$1; shift; n=$m-$(echo $@ | tr ' ' -)
  OUT=$D/$n timeout 125 python3 $S --models $m --M $@ 2>&1 | grep -v Warning | tee $D/$n.log
  pack
done
