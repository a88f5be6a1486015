# Call h (twenty-seventh session): in the rescaled FP8 partition, each tile's expert read during the
# tile before it and the step-0 units formed after the step-0 MMAs are issued (Nsight Compute's source
# page, call g, found the down GEMM's multiplies 40% stalled on a long scoreboard: the expert id, then
# the weight scales read from global memory at each tile's start, needed before its first MMAs). Against
# HEAD (.anchors/head) in the same call: the Gluon FP8 GPU tests with the change, then the layer
# (tma_store_layer.py) on Qwen3-30B-A3B (M = 4096, 16384) new, head, new, head and DeepSeek-V3 (M = 16384)
# new, head, then Qwen3-30B-A3B's first GEMM alone (fp8_grouped_anchor.py, fp8-gemm) new, head.
set -u
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/h; mkdir -p $D
pack() { tar -czf $OUT/call-h.tgz -C /tmp h; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
PYTHONPATH=$PWD timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gluon_fp8.py \
  > $D/gpu-tests.log 2>&1; echo "gpu tests rc $?"; tail -1 $D/gpu-tests.log; pack
S=measurements/scripts/tma_store_layer.py; A=measurements/scripts/fp8_grouped_anchor.py; n=0
for spec in "new $S Qwen3-30B-A3B 4096 16384" "head $S Qwen3-30B-A3B 4096 16384" "new $S Qwen3-30B-A3B 4096 16384" \
            "head $S Qwen3-30B-A3B 4096 16384" "new $S DeepSeek-V3 16384" "head $S DeepSeek-V3 16384" \
            "new $A Qwen3-30B-A3B 4096 16384" "head $A Qwen3-30B-A3B 4096 16384"; do
  set -- $spec; pkg=$1; script=$2; model=$3; shift 3; n=$((n + 1))
  root=$PWD; [ $pkg = head ] && root=$PWD/.anchors/head
  extra=""; [ $script = $A ] && extra="--impls fp8-gemm"
  PYTHONPATH=$root OUT=$D/$n-$pkg-$model timeout 110 python3 $script --models $model $extra --M "$@" 2>&1 \
    | grep -v Warning | sed "s/^/$pkg /" | tee $D/$n-$pkg-$model.log; pack
done
