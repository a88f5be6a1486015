# Call a (H100): Part 7's tl kernel at small M, its untuned choice against one-change neighbours and
# vLLM's default rule (scripts/fp8_small_m_sweep.py), all three GEMMs at M = 1..256, the first GEMM at 1024.
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/a; mkdir -p $D
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
for m in Kimi-K2 DeepSeek-V3 Qwen3-30B-A3B; do
  OUT=$D/$m timeout 170 python3 measurements/scripts/fp8_small_m_sweep.py --models $m --M 1 8 64 256 --max-seconds 0.3 2>&1 \
    | grep -v "Warning\|rejected" | tee -a $D/sweep.log
done
OUT=$D/first-1024 timeout 60 python3 measurements/scripts/fp8_small_m_sweep.py --M 1024 --variants plain --max-seconds 0.3 2>&1 \
  | grep -v Warning | tee -a $D/sweep.log
tar -czf $OUT/call-a.tgz -C /tmp a
