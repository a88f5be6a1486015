# Pending (H200 only; twenty-seventh session): the FP8 layer against the bf16 one on the H200 since the
# whole-row stores and the TMA copies out (measured on H100s only so far), form by form
# (scripts/tma_store_layer.py), one process a model, outputs packed after each. Carry nothing.
# MODELS picks the models (all three by default; call-next-a.sh and -b.sh share them out).
nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 || { echo "not an H200: not run"; exit 0; }
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/l; mkdir -p $D
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
for model in ${MODELS:-Qwen3-30B-A3B DeepSeek-V3 Kimi-K2}; do
  OUT=$D/layer-$model timeout 170 python3 measurements/scripts/tma_store_layer.py --models $model --M 4096 16384 \
    2>&1 | grep -v Warning | tee $D/layer-$model.log; tar -czf $OUT/call-l.tgz -C /tmp l
done
