# The first call's seconds with and without torch's one-time imports of a process's first backward
# (sympy, 2.2 s in call t's profile), each model in a fresh process with an empty Triton cache.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; D=$OUT/x; mkdir -p $D
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
for m in Mixtral-8x7B DeepSeek-V3 Qwen3-30B-A3B; do for w in --warm-torch ""; do
  timeout 60 python3 measurements/scripts/first_call_profile.py --model $m --tokens 4096 $w --out $D 2>&1 | grep -E "first call|make_cubin|compile_module_from_src|rror"
done; done
