"""Run Part 8's training step (our layer, forward + backward) a few times, untimed: for Nsight Compute.

    ncu --clock-control none --set full -k regex:"rows_gemm_kernel|expert_grad_kernel" \
        --launch-skip 5 -c 5 python3 measurements/scripts/h200_backward_profile.py --model Qwen3-30B-A3B --tokens 32768

One step launches five of the kernels Nsight Compute is told to catch: the forward's gate/up GEMM
(``rows_gemm_kernel``, saving H), then the backward's dA' GEMM with the dSwiGLU epilogue
(``rows_gemm_kernel``), dW2 and dW13 (``expert_grad_kernel``) and dX (``rows_gemm_kernel``). The first
step compiles; ``--launch-skip 5`` leaves it out, so the second step's five are profiled.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from moe_tutorial.shapes import MODEL_SHAPES  # noqa: E402

import torch  # noqa: E402
from h200_backward import device_problem, leaves, ours  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="Qwen3-30B-A3B", choices=sorted(MODEL_SHAPES))
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 2
    p = device_problem(MODEL_SHAPES[args.model], args.tokens, torch.bfloat16)
    for step in range(args.steps):
        leaf = leaves(p)
        out = ours(leaf["x"], leaf["w13"], leaf["w2"], leaf["topk_weights"], leaf["topk_ids"])
        out.backward(p["d_out"])
        torch.cuda.synchronize()
        print(f"step {step}: |dx| = {leaf['x'].grad.float().norm():.3e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
