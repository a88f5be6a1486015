# Pending (any Hopper GPU; carry .whl): call v, then call k, in one call (the device is scarce).
# v: the package as committed (gate/up reads x's rows by index where I <= GATHER_MAX_INTER): the dispatch
#    at the three models' shapes, the Qwen3-30B-A3B layer as dispatched against float64 and bit for bit
#    against the sorted copy, then notebook 07 top to bottom under nbval-lax.
# k: pending/call-k.sh (the load warps without a K bound a copy).
set -u
export PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; D=/tmp/v; mkdir -p $D
pack() { tar -czf $OUT/call-v.tgz -C /tmp v; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=$PWD:/tmp/site || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $D/gpu.txt
timeout 100 python3 -c "
import moe_tutorial as mt, torch
from moe_tutorial.kernels import gluon_fp8_kernel as g
from moe_tutorial.kernels.fp8_layer import fp8_moe_layer, layer_configs
from moe_tutorial.quant import quantize_w13, quantize_weight
from moe_tutorial.reference import reference_fp8_moe_layer, rel_error
from moe_tutorial.shapes import get_shape
for m in ('Qwen3-30B-A3B', 'DeepSeek-V3', 'Kimi-K2'):
    s = get_shape(m)
    for M in (2048, 4096, 16384):
        up = layer_configs(M, s.num_experts, s.intermediate, s.hidden, s.topk)[0]
        print(m, M, 'reads x by index:', g.gathers_a(up, M * s.hidden, s.intermediate))
s = get_shape('Qwen3-30B-A3B'); torch.manual_seed(0); M = 4096
x = torch.randn(M, s.hidden, device='cuda', dtype=torch.bfloat16)
w13 = torch.randn(s.num_experts, 2 * s.intermediate, s.hidden, device='cuda', dtype=torch.bfloat16) * s.hidden ** -0.5
w2 = torch.randn(s.num_experts, s.hidden, s.intermediate, device='cuda', dtype=torch.bfloat16) * s.intermediate ** -0.5
logits = torch.randn(M, s.num_experts, device='cuda')
tw, ids = torch.topk(torch.softmax(logits, -1), s.topk)
q13, s13 = quantize_w13(w13); q2, s2 = quantize_weight(w2)
outs = []
for flag in (None, False):
    g.GATHER_A = flag
    outs.append(fp8_moe_layer(x, q13, s13, q2, s2, tw, ids))
g.GATHER_A = None
ref = reference_fp8_moe_layer(x[:64], q13, s13, q2, s2, tw[:64], ids[:64])
print('Qwen3 M=4096 as dispatched: same bits as the sorted copy:', torch.equal(outs[0], outs[1]),
      '| rel error vs float64 (64 rows):', float(rel_error(outs[0][:64], ref)))
" 2>&1 | grep -v Warning | tee $D/dispatch.txt; pack
timeout 240 python3 -m pytest --nbval-lax -q -p no:cacheprovider notebooks/07_fp8_experts.ipynb > $D/notebook-07-nbval.log 2>&1
echo "nbval rc $?"; tail -3 $D/notebook-07-nbval.log; pack
unset PYTHONPATH
bash measurements/pending/call-k.sh
