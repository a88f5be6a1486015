# Call p (any Hopper GPU): the yield edit's other two patterns (alternate: every other multiply of a run
# yields; all: every one) against DeepSeek-V3's reuse-alternate, which the layer ships, and the layer
# unedited (scripts/yield_layer.py --patterns, one process a case list; same bits checked); then the
# prefill profile of pending/call-q.sh. The edit's GPU tests ran in the twenty-ninth session.
set -u
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONPATH=$PWD; D=/tmp/p; mkdir -p $D
pack() { tar -czf $OUT/call-p.tgz -C /tmp p; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
S=measurements/scripts/yield_layer.py
for c in "Qwen3-30B-A3B 16384" "Qwen3-30B-A3B 16384 4096" "DeepSeek-V3 16384"; do
  set -- $c; m=$1; shift; n=$m-$(echo $@ | tr ' ' -); [ -d $D/$n ] && n=$n-2
  OUT=$D/$n timeout 130 python3 $S --patterns --models $m --M $@ 2>&1 | grep -v Warning | tee $D/$n.log
  pack
done
OUT=$D timeout 120 python3 measurements/scripts/h200_fp8_decode_profile.py --models Qwen3-30B-A3B --M 4096 16384 \
  2>&1 | grep -v Warning | tee $D/prefill-profile.log; pack
