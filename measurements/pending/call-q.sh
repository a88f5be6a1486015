# Call q (short, any Hopper GPU): which compiled forms the layer's launches left edited (yield_edits, from
# Triton's post-compile hook), then where the layer's time goes at prefill, kernel by kernel
# (torch.profiler, warm, eager). The GPU tests of the edit and notebook 07 ran in the twenty-ninth
# session (logs/2026-12-07-29-half-skip/).
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
OUT=$D timeout 150 python3 measurements/scripts/h200_fp8_decode_profile.py --models Qwen3-30B-A3B DeepSeek-V3 \
  --M 4096 16384 2>&1 | grep -v Warning | tee $D/prefill-profile.log; pack
