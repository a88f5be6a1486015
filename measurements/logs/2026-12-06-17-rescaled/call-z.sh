# Calls z and z2 (seventeenth session, the same warm H100 right after call y, typed at the tool):
# Nsight Compute on the rescaled split first GEMM at M = 16384, Qwen3-30B-A3B (its first two
# launches) and DeepSeek-V3 (three launches of it, then one of the shipped 128 x 128 kernel).
set -u
export PYTHONPATH=$PWD:/tmp/site PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
for spec in "qwen3 Qwen3-30B-A3B 2" "dsv3 DeepSeek-V3 4"; do
  set -- $spec; D=$OUT/z-$1; mkdir -p $D
  timeout 240 $NCU --clock-control none --set full -k regex:"gluon_(fp8_)?moe_kernel" -c $3 -o $D/ncu-$1-M16384 \
    python3 measurements/scripts/h200_gluon_fp8.py profile --models $2 --M 16384 \
    --variants gluon-128x256-rescaled-split-s4-g8 gluon-128x8-s4 > $D/ncu.log 2>&1
  for r in $D/*.ncu-rep; do $NCU -i $r --page details > ${r%.ncu-rep}-details.txt 2>&1
    $NCU -i $r --page raw --csv > ${r%.ncu-rep}-raw.csv 2>&1; rm -f $r; done
  python3 measurements/scripts/ncu_summary.py $D/ncu-$1-M16384-raw.csv > $D/ncu-summary.csv
done
