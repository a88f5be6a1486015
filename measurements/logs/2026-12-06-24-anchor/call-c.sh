# Call c (the same H100, warm, right after call b): the down GEMM from 64 rows an expert, the heuristic's
# 256-wide tile at 8 warps beside its neighbours (n128-w4: 128 wide at 4 warps). Run as one command line.
export PYTHONPATH=$PWD; mkdir -p /tmp/c
OUT=/tmp/c timeout 150 python3 measurements/scripts/fp8_small_m_sweep.py --models Qwen3-30B-A3B DeepSeek-V3 --M 1024 2048 \
  --variants down --max-seconds 0.3 2>&1 | grep -v "Warning\|rejected" | tee /tmp/c/sweep.log
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > /tmp/c/gpu.txt; tar -czf $OUT/call-c.tgz -C /tmp c
