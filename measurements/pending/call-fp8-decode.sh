# The next GPU call for issue 31 (written in the thirteenth session, not run). (1) Where the FP8
# layer's time goes at decode, against bf16: the aim there is 1.7x (DeepSeek-V3, Kimi-K2) and 1.4x
# (Qwen3-30B-A3B) at M <= 256; the bench read 1.58x and 1.06x at M = 1. torch.profiler per kernel,
# then Nsight Compute on DeepSeek-V3's M = 1 call (the profile a missed target needs). (2) The
# layer sweep on DeepSeek-V3 and Kimi-K2 in one process (call q ran out of memory there; the
# sweep now drops its last call's references) with the sorted quantiser as the package's default.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1
D=$OUT/s; mkdir -p $D
pack() { tar czf $OUT/call-s.tar.gz -C $OUT s; }
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.draw,temperature.gpu --format=csv,noheader | tee $D/gpu.txt
echo "=== decode, kernel by kernel $(date -u +%T)"
OUT=$D timeout 200 python3 measurements/scripts/h200_fp8_decode_profile.py --models DeepSeek-V3 Qwen3-30B-A3B Kimi-K2 --M 1 64 256 > $D/decode.log 2>&1; echo rc $?; cut -c1-260 $D/decode.log; pack
echo "=== ncu, DeepSeek-V3 M=1 FP8 layer $(date -u +%T)"
timeout 120 $NCU --clock-control none --section SpeedOfLight --section LaunchStats --section Occupancy -k regex:"fp8|quantize|align|topk|scatter|count|plan" -c 24 -o $D/ncu-decode-dsv3-M1 \
  python3 measurements/scripts/h200_fp8_decode_profile.py --models DeepSeek-V3 --M 1 --calls 2 > $D/ncu.log 2>&1; echo rc $?
for r in $D/*.ncu-rep; do $NCU -i $r --page details > ${r%.ncu-rep}-details.txt 2>&1; rm -f $r; done
grep -E "^  [a-z_0-9]+ \(|Duration|Memory Throughput|DRAM Throughput" $D/ncu-decode-dsv3-M1-details.txt | head -60; pack
echo "=== layer sweep, DeepSeek-V3 and Kimi-K2 $(date -u +%T)"
OUT=$D timeout 200 python3 measurements/scripts/h200_gluon_fp8.py sweep --models DeepSeek-V3 Kimi-K2 --M 4096 16384 --variants gluon-128x8-s4 --deadline 150 > $D/sweep.log 2>&1; echo rc $?; grep -E "ceilings|layer floor|Error" $D/sweep.log | cut -c1-400; pack
echo "=== done $(date -u +%T)"
