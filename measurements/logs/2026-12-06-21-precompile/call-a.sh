# The twenty-first session's first call: the step's kernels compiled side by side before its first
# launch (moe_tutorial/kernels/precompile.py). Its GPU test; the first call with it and without
# (--serial), each model in a fresh process with an empty Triton cache, the machine's first process
# first; h200_backward's first call (the docs' protocol) per model; then the Gluon GPU tests after
# last session's one-descriptor-builder mend (never run on a GPU).
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=$PWD:/tmp/site || exit 1
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=$OUT/a; mkdir -p $D
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt; nproc | tee -a $D/gpu.txt
fc() { timeout 60 python3 measurements/scripts/first_call_profile.py --tokens 4096 --out $D "$@" 2>&1 | grep -E "first call|rror" | tee -a $D/first-call.txt; }
fc --model Mixtral-8x7B; fc --model Mixtral-8x7B --serial
fc --model DeepSeek-V3 --serial; fc --model DeepSeek-V3
fc --model Qwen3-30B-A3B; fc --model Qwen3-30B-A3B --serial
fc --model Mixtral-8x7B --serial; fc --model Mixtral-8x7B
fc --model Mixtral-8x7B --warm-torch; fc --model Mixtral-8x7B --warm-torch --serial
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_precompile.py -rA > $D/gpu-tests-precompile.log 2>&1; echo rc $?; grep -E "^(PASSED|FAILED|ERROR)|passed|failed" $D/gpu-tests-precompile.log | tail -9
for m in Mixtral-8x7B DeepSeek-V3 Qwen3-30B-A3B; do
  timeout 150 python3 measurements/scripts/h200_backward.py --models $m --tokens 4096 --impls ours,grouped_mm \
    --no-grads --no-tiles --out $D/backward-$m > $D/backward-$m.log 2>&1; echo rc $?; grep -E "first call|rror" $D/backward-$m.log | tail -3
done
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gluon_kernel.py > $D/gpu-tests-gluon.log 2>&1; echo rc $?; tail -1 $D/gpu-tests-gluon.log
timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gluon_fp8.py -k "200-8-384-320-2 or 300-8-192-320-2 or same_bits" > $D/gpu-tests-gluon-fp8.log 2>&1; echo rc $?; tail -1 $D/gpu-tests-gluon-fp8.log
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_backward_kernel.py -k "gluon and not DeepSeek" > $D/gpu-tests-backward-gluon.log 2>&1; echo rc $?; tail -1 $D/gpu-tests-backward-gluon.log
