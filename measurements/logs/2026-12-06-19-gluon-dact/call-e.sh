# The nineteenth session, call e (warm H200 after call d): Nsight Compute on Mixtral-8x7B's step at T = 16384
# with the Gluon dA' and dW kernels from the table, the second step's six GEMMs.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
D=$OUT/m; mkdir -p $D
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
timeout 150 $NCU --clock-control none --set full -k regex:"rows_gemm_kernel|expert_grad_kernel|sorted_moe_kernel|gluon_dact_kernel" --launch-skip 6 -c 6 -o $D/ncu-step-Mixtral-8x7B-T16384 \
  python3 measurements/scripts/h200_backward_profile.py --model Mixtral-8x7B --tokens 16384 > $D/ncu-step-Mixtral-8x7B-T16384.log 2>&1; echo rc $?
r=$D/ncu-step-Mixtral-8x7B-T16384.ncu-rep
[ -f $r ] && { $NCU -i $r --page raw --csv > ${r%.ncu-rep}-raw.csv 2>&1; $NCU -i $r --page details > ${r%.ncu-rep}-details.txt 2>&1; rm -f $r; python3 measurements/scripts/ncu_summary.py ${r%.ncu-rep}-raw.csv > ${r%.ncu-rep}-summary.csv; cut -d, -f2-13 ${r%.ncu-rep}-summary.csv | cut -c1-300; }
gzip -f $D/*-raw.csv 2>/dev/null; ls -la $D
