# The first call with torch's one-time import of sympy taken out first (--warm-torch now gives its tiny
# backward a gradient, as the step's backward is given one), then without, each a fresh process.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD; D=$OUT/y; mkdir -p $D
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
for m in Mixtral-8x7B DeepSeek-V3 Qwen3-30B-A3B; do for w in --warm-torch ""; do
  timeout 40 python3 measurements/scripts/first_call_profile.py --model $m --tokens 4096 $w --out $D 2>&1 | grep -E "first call|make_cubin|compile_module_from_src|rror"
done; done 2>&1 | tee $D/stdout.txt
