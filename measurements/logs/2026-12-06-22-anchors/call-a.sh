# Call a (twenty-second session): on an H200, pending call c first (the first calls side by side and
# one by one, then notebook 08 under nbval-lax: call b's tarball). On any GPU then: the GPU tests of the
# last review's mend (precompile's place in the layer), and Nsight Compute on the FP8 and bf16 layers'
# GEMMs at M = 1 (DeepSeek-V3, Qwen3-30B-A3B), where issue 31's decode aims are missed. One tarball.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/a; mkdir -p $D
pack() { tar -czf $OUT/call-a.tgz -C /tmp a; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
bash measurements/pending/call-c.sh 2>&1 | tail -5
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_precompile.py tests/test_backward_kernel.py \
  -k "precompile or (Qwen3 and not gluon)" > $D/gpu-tests.log 2>&1; echo "gpu tests rc $?"; tail -3 $D/gpu-tests.log
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
for spec in "dsv3 DeepSeek-V3" "qwen3 Qwen3-30B-A3B"; do
  set -- $spec
  timeout 150 $NCU --clock-control none --set full -k regex:"fp8_moe_kernel|sorted_moe_kernel" -c 12 -o $D/ncu-$1-M1 \
    python3 measurements/scripts/h200_fp8_decode_profile.py --models $2 --M 1 --calls 1 > $D/ncu-$1.log 2>&1
  for r in $D/*.ncu-rep; do $NCU -i $r --page details > ${r%.ncu-rep}-details.txt 2>&1
    $NCU -i $r --page raw --csv > ${r%.ncu-rep}-raw.csv 2>&1; rm -f $r; done
  python3 measurements/scripts/ncu_summary.py $D/ncu-$1-M1-raw.csv > $D/ncu-$1-summary.csv; cat $D/ncu-$1-summary.csv | cut -c1-220
  pack
done
pack
