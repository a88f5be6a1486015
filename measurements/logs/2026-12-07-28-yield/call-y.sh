# Twenty-eighth session: the rescale's multiply runs set to yield (experiments/yield_bits.py), the FP8
# layer as dispatched against itself unedited, one process a model; same bits checked. Any Hopper GPU.
set -u
export PYTHONPATH=$PWD       # (the call ran `export PYTHONPATH=$PWD; bash call.sh`)
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/y; mkdir -p $D
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
S=measurements/scripts/yield_layer.py
for c in "Qwen3-30B-A3B 4096 16384" "DeepSeek-V3 16384" "Qwen3-30B-A3B 16384 4096"; do
  set -- $c; m=$1; shift; n=$m-$(echo $@ | tr ' ' -)
  OUT=$D/$n timeout 200 python3 $S --models $m --M $@ 2>&1 | grep -v Warning | tee $D/$n.log
  tar -czf $OUT/call-y.tgz -C /tmp y
done
