# Pending (any Hopper GPU; the H200 for the numbers): the gate/up GEMM reading x's rows by index
# (gather-a.patch, thirtieth session: built and compiled for sm90 with Triton 3.6 and 3.9, 168
# registers, no spills with 56 for the load warp; never run). The layer quantises x into sorted order,
# each token's e4m3 row written once per expert it goes to (Qwen3-30B-A3B's profile: 35 us of 566 at
# M = 4096, 151 of 1670 at 16384); with the patch it quantises x once and the load warp gathers A by
# index (cp.async). The patch is applied to this copy of the tree; first its GPU tests (the same bits as
# the sorted copy, three shapes, two forms), then gather_layer.py where the split form runs. Keep it
# only if the bits are the same and it wins; then notebook 07 shows the fence in its K-loop excerpt.
set -u
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONPATH=$PWD; D=/tmp/g; mkdir -p $D
pack() { tar -czf $OUT/call-g.tgz -C /tmp g; }
patch -p1 -s < measurements/logs/2026-12-07-31-gather/call-g-gather-a.patch || { echo "the patch no longer applies"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_gluon_fp8.py -k "by_index or gather_form" 2>&1 \
  | tail -15 | tee $D/gpu-tests.log; pack
grep -q " passed" $D/gpu-tests.log && ! grep -q "failed" $D/gpu-tests.log || { echo "tests failed: not timed"; exit 0; }
for c in "Qwen3-30B-A3B 4096 16384" "Qwen3-30B-A3B 16384 4096" "DeepSeek-V3 16384" "Kimi-K2 16384"; do
  set -- $c; m=$1; shift; n=$m-$(echo $@ | tr ' ' -)
  OUT=$D/$n timeout 150 python3 measurements/scripts/gather_layer.py --models $m --M $@ 2>&1 | grep -v Warning \
    | tee $D/$n.log; pack
done
