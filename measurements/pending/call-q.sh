# Twenty-eighth session, call q (short: little device time left): the package's own yield edit on the
# GPU. First which compiled forms the layer's launches left edited (yield_edits, from Triton's
# post-compile hook), then the GPU tests of the rescaled layer with it. Any Hopper GPU.
set -u
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONPATH=$PWD; D=/tmp/q; mkdir -p $D
pack() { tar -czf $OUT/call-q.tgz -C /tmp q; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
timeout 60 python3 - <<'PY' 2>&1 | grep -v Warning | tee $D/edited-forms.log
import torch, moe_tutorial as mt
from moe_tutorial.kernels import gluon_fp8_kernel as gk
from moe_tutorial.kernels.fp8_layer import fp8_moe_layer
from moe_tutorial.quant import quantize_w13, quantize_weight
E, I, K, M, topk = 128, 768, 2048, 4096, 8          # Qwen3-30B-A3B's layer
x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
tw, ids = mt.route(torch.randn(M, E, device="cuda"), topk)
q13, s13 = quantize_w13(torch.randn(E, 2 * I, K, device="cuda", dtype=torch.bfloat16) * K ** -0.5)
q2, s2 = quantize_weight(torch.randn(E, K, I, device="cuda", dtype=torch.bfloat16) * I ** -0.5)
out = fp8_moe_layer(x, q13, s13, q2, s2, tw, ids)
torch.cuda.synchronize()
for key, k in gk.gluon_fp8_moe_kernel.device_caches[0][0].items():
    print("form", k.hash[:12], "yield_edits", getattr(k, "yield_edits", 0), "finite", bool(torch.isfinite(out).all()))
PY
pack
timeout 170 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gluon_fp8.py \
  -k "yield or tma_copies_out or (step_exact and split)" > $D/gpu-tests.log 2>&1
echo "gpu tests rc $?"; tail -3 $D/gpu-tests.log; pack
