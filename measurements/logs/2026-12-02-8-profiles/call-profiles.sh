set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1
D=$OUT/c1; mkdir -p $D
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1); echo "ncu: $NCU"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee $D/gpu.txt
python3 -c "import torch, triton; print(torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__)" | tee -a $D/gpu.txt
date -u +%FT%TZ | tee -a $D/gpu.txt
echo "=== fp8 GPU tests $(date -u +%T)"
timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gluon_fp8.py tests/test_fp8.py > $D/fp8-tests.log 2>&1; tail -6 $D/fp8-tests.log
for M in 16384 4096; do
  echo "=== ncu gluon fp8 M=$M $(date -u +%T)"
  timeout 110 $NCU --clock-control none --set full -k regex:gluon_fp8_moe_kernel -c 1 -o $D/gluon-fp8-dsv3-M$M \
    python3 measurements/scripts/h200_gluon_fp8.py profile --models DeepSeek-V3 --M $M --variants gluon-128x8-s4 > $D/ncu-gluon-M$M.log 2>&1; tail -3 $D/ncu-gluon-M$M.log
done
echo "=== ncu backward $(date -u +%T)"
timeout 170 $NCU --clock-control none --set full -k regex:"rows_gemm_kernel|expert_grad_kernel" --launch-skip 5 -c 5 -o $D/backward-qwen3-T32768 \
  python3 measurements/scripts/h200_backward_profile.py --model Qwen3-30B-A3B --tokens 32768 > $D/ncu-backward.log 2>&1; tail -4 $D/ncu-backward.log
for r in $D/*.ncu-rep; do
  $NCU -i $r --page details > ${r%.ncu-rep}-details.txt 2>&1
  $NCU -i $r --page raw --csv > ${r%.ncu-rep}-raw.csv 2>&1
  rm -f $r
done
grep -h -E "Kernel Name|^  [a-z_]+_kernel|Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy" $D/*-details.txt | head -60
echo "=== done $(date -u +%T)"
tar czf $OUT/call1.tar.gz -C $OUT c1 && rm -rf $D
