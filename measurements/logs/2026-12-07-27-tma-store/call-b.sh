# Pending (after pending/call-tma.sh, which runs the GPU tests of the Gluon kernels and of the FP8 layer): the rest
# of the twenty-fifth session's call b, outputs packed after each step: 1. Part 8's Gluon gate/up GPU tests (it
# stores H through store_rows); 2. notebook 07 under nbval-lax; 3. DeepSeek-V3's first GEMM alone in its process
# (call a's ran out of memory after Qwen3-30B-A3B's): Part 7 whole, its Gluon GEMM alone, CUTLASS's.
# Carry .anchors and .whl.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/b; mkdir -p $D
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
P="python3 -m pytest -q -p no:cacheprovider"; S=measurements/scripts/fp8_grouped_anchor.py
timeout 60 $P -m gpu tests/test_backward_kernel.py -k "gate_up" > $D/gpu-tests-gate-up.log 2>&1
echo rc $?; tail -1 $D/gpu-tests-gate-up.log; tar -czf $OUT/call-b.tgz -C /tmp b
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
PYTHONPATH=$PWD:/tmp/site python3 -m ipykernel install --user --name python3 > /dev/null 2>&1
PYTHONPATH=$PWD:/tmp/site timeout 90 $P --nbval-lax notebooks/07_fp8_experts.ipynb > $D/notebook-07-nbval.log 2>&1
echo rc $?; tail -1 $D/notebook-07-nbval.log; tar -czf $OUT/call-b.tgz -C /tmp b
OUT=$D/new timeout 100 python3 $S --models DeepSeek-V3 --impls fp8 fp8-gemm cutlass-fp8 --M 4096 16384 2>&1 \
  | grep -v Warning | tee $D/new.log; tar -czf $OUT/call-b.tgz -C /tmp b
