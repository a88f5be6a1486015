# Call g (twenty-seventh session): where the warps of the FP8 layer's two Gluon GEMMs (the dispatched
# TMA forms) stall, instruction by instruction: Nsight Compute's source page (SASS, stall samples per
# instruction) at Qwen3-30B-A3B, M = 16384, one launch of each GEMM.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/g; mkdir -p $D
pack() { tar -czf $OUT/call-g.tgz -C /tmp g; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1); $NCU --version | tail -1 | tee $D/ncu-version.txt
# (This call wrote these lines inline as $D/layer_once.py and ran that; the same lines are now
# measurements/scripts/fp8_layer_once.py, which this record calls instead.)
timeout 200 $NCU --clock-control none --set full --import-source no -k regex:"gluon_fp8_moe_kernel" -c 2 \
  -o $D/ncu-src python3 measurements/scripts/fp8_layer_once.py --model Qwen3-30B-A3B --M 16384 > $D/ncu.log 2>&1; echo "ncu rc $?"; tail -2 $D/ncu.log
$NCU -i $D/ncu-src.ncu-rep --page source --csv --print-source sass > $D/source-sass.csv 2> $D/source-err.txt
echo "source rc $?"; wc -l $D/source-sass.csv; head -c 600 $D/source-sass.csv; tail -3 $D/source-err.txt
$NCU -i $D/ncu-src.ncu-rep --page details > $D/details.txt 2>&1; rm -f $D/ncu-src.ncu-rep
pack
