# Pending (any Hopper GPU): the gate/up GEMM reading x's rows by index, rebuilt after call g
# (thirty-first session). In call g (logs/2026-12-07-31-gather/) the first build gave the same bits but the
# layer ran at 0.51x to 0.65x its speed with the sorted copy: its one load warp loaded the rows' ids
# before every stage's copies. gather-b.patch loads them once a tile, with four load warps
# (fp8-gather) or one (fp8-gather-1w); both compile for sm90 with Triton 3.6 and 3.9, no spills.
# Applies the patch to this copy of the tree, runs its GPU tests (the same bits as the sorted copy,
# three shapes, two forms, both warp counts), then gather_layer.py. Keep it only if the bits are the
# same and it wins; then notebook 07's K-loop excerpt shows the fence.
# Prediction (if the gathered loads keep the GEMM's pace): the layer saves most of the quantiser's topk
# copies (151 of 1656 us at Qwen3-30B-A3B M = 16384, 35 of 562 at 4096, call p of the thirtieth
# session), so bf16 / FP8 about 1.47x -> 1.57x at 16384 and 1.39x -> 1.45x at 4096.
set -u
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONPATH=$PWD; D=/tmp/g2; mkdir -p $D
pack() { tar -czf $OUT/call-g2.tgz -C /tmp g2; }
patch -p1 -s < measurements/pending/gather-b.patch || { echo "the patch no longer applies"; exit 1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_gluon_fp8.py -k "by_index or gather_form" 2>&1 \
  | tail -15 | tee $D/gpu-tests.log; pack
grep -q " passed" $D/gpu-tests.log && ! grep -q "failed" $D/gpu-tests.log || { echo "tests failed: not timed"; exit 0; }
for c in "Qwen3-30B-A3B 4096 16384" "DeepSeek-V3 16384" "Qwen3-30B-A3B 16384 4096"; do
  set -- $c; m=$1; shift; n=$m-$(echo $@ | tr ' ' -)
  OUT=$D/$n timeout 150 python3 measurements/scripts/gather_layer.py --models $m --M $@ 2>&1 | grep -v Warning \
    | tee $D/$n.log; pack
done
# Where the gathering GEMM's warps stall (Nsight Compute, one launch of the gate/up GEMM with four load
# warps, Qwen3-30B-A3B M = 16384): the details page and the source page (SASS, stall samples).
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1); $NCU --version | tail -1 | tee $D/ncu-version.txt
timeout 200 $NCU --clock-control none --set full --import-source no -k regex:"gluon_fp8_moe_kernel" -c 1 -o $D/ncu-gather \
  python3 -c "import sys, runpy; from moe_tutorial.kernels import gluon_fp8_kernel as g; g.GATHER_A = True; \
sys.argv = ['fp8_layer_once.py', '--model', 'Qwen3-30B-A3B', '--M', '16384']; \
runpy.run_path('measurements/scripts/fp8_layer_once.py', run_name='__main__')" > $D/ncu.log 2>&1; echo "ncu rc $?"
$NCU -i $D/ncu-gather.ncu-rep --page details > $D/ncu-gather-details.txt 2>&1
$NCU -i $D/ncu-gather.ncu-rep --page source --csv --print-source sass > $D/ncu-gather-source.csv 2>/dev/null
rm -f $D/ncu-gather.ncu-rep; pack
