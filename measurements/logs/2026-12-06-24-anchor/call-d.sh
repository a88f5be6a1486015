# Call d (the same H100, warm): Kimi-K2 at M = 4096 (85 rows an expert), down and first GEMM, and Qwen3-30B-A3B
# at M = 1024 once more, each beside the 128-wide tile at 4 warps. Run as one command line.
export PYTHONPATH=$PWD; mkdir -p /tmp/d
OUT=/tmp/d timeout 100 python3 measurements/scripts/fp8_small_m_sweep.py --models Kimi-K2 --M 4096 --variants down plain \
  --max-seconds 0.3 2>&1 | grep -v "Warning\|rejected" | tee /tmp/d/sweep.log
OUT=/tmp/d/q timeout 60 python3 measurements/scripts/fp8_small_m_sweep.py --models Qwen3-30B-A3B --M 1024 --variants plain down \
  --max-seconds 0.3 2>&1 | grep -v "Warning\|rejected" | tee -a /tmp/d/sweep.log
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > /tmp/d/gpu.txt; tar -czf $OUT/call-d.tgz -C /tmp d
