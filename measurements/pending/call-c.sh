# Pending (never ran: no machine came): call b's first calls on an H200, where the docs' first-call
# numbers come from (compiled one by one there). No notebook; packed into one tarball outside $OUT.
set -u
export PYTHONPATH=$PWD
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/c; mkdir -p $D
pack() { tar -czf $OUT/call-c.tgz -C /tmp c; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt; nproc | tee -a $D/gpu.txt
fc() { timeout 60 python3 measurements/scripts/first_call_profile.py --tokens 4096 --out $D "$@" 2>&1 | grep -E "first call|rror" | tee -a $D/first-call.txt; }
fc --model Mixtral-8x7B; fc --model Mixtral-8x7B --serial
fc --model DeepSeek-V3 --serial; fc --model DeepSeek-V3
fc --model Qwen3-30B-A3B; fc --model Qwen3-30B-A3B --serial
fc --model Mixtral-8x7B --warm-torch; fc --model Mixtral-8x7B --warm-torch --serial
pack
