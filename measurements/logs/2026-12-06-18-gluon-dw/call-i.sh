# Run on the warm H100 after call h: the step with one Gluon dW tile written into the user's table by
# hand (128 x 128 x 64, 8 warps, 4 stages, both dW GEMMs, T = 4096 and 16384 entries), against the same
# step with tl's dW tiles (ours-tl-dw), before any sweep had chosen a tile.
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; mkdir -p $OUT/i; python3 - <<'PY'
import json, os
from pathlib import Path
g = {"block_m": 128, "block_n": 128, "block_k": 64, "group_m": 8, "num_warps": 8, "num_stages": 4, "use_tma": True, "short_tails": False, "swap_ab": False, "persistent": False, "gluon": True}
t = {"NVIDIA H100 80GB HBM3": {f"E=256,N={N},K={K},topk=8,dtype=bfloat16,variant={v}": {"4096": g, "16384": g} for N, K, v in ((7168, 2048, "train_dw2"), (4096, 7168, "train_dw13"))}}
p = Path.home() / ".cache/moe_tutorial/tuned_configs.json"; p.parent.mkdir(parents=True, exist_ok=True); p.write_text(json.dumps(t))
PY
timeout 170 python3 measurements/scripts/h200_backward.py --models DeepSeek-V3 --tokens 4096,16384,32768 --no-tiles --no-grads --max-minutes 2.6 --out $OUT/i > $OUT/i/backward.log 2>&1
