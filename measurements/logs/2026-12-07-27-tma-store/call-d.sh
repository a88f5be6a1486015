# Call d (twenty-seventh session, on the warm GPU after calls t and b): the layer now copies its Gluon
# tiles out through TMA (layer_configs -> configs.copied_out). 1. the GPU tests of the FP8 layer as
# dispatched (real shapes, decode, the Gluon layer forms); 2. tma_store_layer.py where call t did not
# look: Kimi-K2 at M = 4096 and 16384, all three models at M = 1024 (the fused 64-row forms), and
# Qwen3-30B-A3B at M = 16384 again (the run-to-run spread); 3. Nsight Compute on the layer's two Gluon
# GEMMs (TMA forms) at Qwen3-30B-A3B, M = 16384. Outputs packed after each step. Carry .whl.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/d; mkdir -p $D
pack() { tar -czf $OUT/call-d.tgz -C /tmp d; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
P="python3 -m pytest -q -p no:cacheprovider"; S=measurements/scripts/tma_store_layer.py
timeout 200 $P -m gpu tests/test_fp8.py tests/test_fp8_decode.py tests/test_gluon_fp8.py -k "layer" \
  > $D/gpu-tests.log 2>&1; echo "gpu tests rc $?"; tail -2 $D/gpu-tests.log; pack
for spec in "Kimi-K2 4096 16384" "Qwen3-30B-A3B 1024 16384" "DeepSeek-V3 1024" "Kimi-K2 1024"; do
  set -- $spec; model=$1; shift
  OUT=$D/$model-$1 timeout 150 python3 $S --models $model --M "$@" 2>&1 | grep -v Warning | tee $D/layer-$model-$1.log
  pack
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
cat > $D/layer_once.py <<'PY'
import importlib.util, sys
import torch, moe_tutorial as mt
from moe_tutorial.kernels.fp8_layer import fp8_moe_layer, layer_configs
from moe_tutorial.shapes import get_shape
spec = importlib.util.spec_from_file_location("p", "measurements/scripts/h200_fp8_decode_profile.py")
p = importlib.util.module_from_spec(spec); spec.loader.exec_module(p)
s, M = get_shape(sys.argv[1]), int(sys.argv[2])
w13, s13, w2, s2 = p.fp8_weights(s, "cuda")
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(M, s.hidden, device="cuda", generator=g).bfloat16()
tw, ids = mt.route(torch.randn(M, s.num_experts, device="cuda", generator=g), s.topk)
print(layer_configs(M, s.num_experts, s.intermediate, s.hidden, s.topk))
for _ in range(2):
    fp8_moe_layer(x, w13, s13, w2, s2, tw, ids)
torch.cuda.synchronize()
PY
timeout 180 $NCU --clock-control none --set full -k regex:"gluon_fp8_moe_kernel" -c 2 -o $D/ncu-qwen3-M16384 \
  python3 $D/layer_once.py Qwen3-30B-A3B 16384 > $D/ncu.log 2>&1; echo "ncu rc $?"; tail -3 $D/ncu.log
for r in $D/*.ncu-rep; do $NCU -i $r --page details > ${r%.ncu-rep}-details.txt 2>&1
  $NCU -i $r --page raw --csv > ${r%.ncu-rep}-raw.csv 2>&1; rm -f $r; done
python3 measurements/scripts/ncu_summary.py $D/ncu-qwen3-M16384-raw.csv > $D/ncu-summary.csv; cut -c1-250 $D/ncu-summary.csv
pack
