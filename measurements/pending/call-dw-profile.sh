# Not run (the eighteenth session's device time ran out): after call k put the Gluon dW tiles into the H200 table,
# T = 16384 (the one case still under 1.25x), the second step's six GEMMs, as the twelfth session's call g.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
D=$OUT/m; mkdir -p $D
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
timeout 100 $NCU --clock-control none --set full -k regex:"rows_gemm_kernel|expert_grad_kernel|sorted_moe_kernel" --launch-skip 6 -c 6 -o $D/ncu-step-DeepSeek-V3-T16384 \
  python3 measurements/scripts/h200_backward_profile.py --model DeepSeek-V3 --tokens 16384 > $D/ncu-step-DeepSeek-V3-T16384.log 2>&1; echo rc $?
r=$D/ncu-step-DeepSeek-V3-T16384.ncu-rep
[ -f $r ] && { $NCU -i $r --page raw --csv > ${r%.ncu-rep}-raw.csv 2>&1; $NCU -i $r --page details > ${r%.ncu-rep}-details.txt 2>&1; rm -f $r; python3 measurements/scripts/ncu_summary.py ${r%.ncu-rep}-raw.csv > ${r%.ncu-rep}-summary.csv; cut -d, -f2-13 ${r%.ncu-rep}-summary.csv | cut -c1-300; }
gzip -f $D/*-raw.csv 2>/dev/null; ls -la $D
