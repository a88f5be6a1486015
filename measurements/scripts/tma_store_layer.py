"""The layers' tiles copied out through TMA (Part 7's FP8 layer, the bf16 Gluon layer), form by form: one timer.

    python3 measurements/scripts/tma_store_layer.py [--models Qwen3-30B-A3B DeepSeek-V3 Kimi-K2] \\
        [--M 1024 4096 16384] [--dry-run]

Issue 31 asks the FP8 layer for 1.5x the bf16 layer at M >= 4096. The Gluon epilogues store each
tile with ``gl.store``: the MMA warps wait while they do, and the tensor cores with them. A down GEMM
tile of Qwen3-30B-A3B is 6 K steps of MMAs and then 64 KB of bf16 to write: its stores are a large
part of its time. ``config.tma_store`` writes the tile into shared memory instead and hands it to the
TMA engine, which copies it out while the warps start the next tile's MMAs. A TMA copy writes a box of
rows as they lie, so the rows must be in sorted order: the gate/up GEMM's are; the down GEMM then
leaves its rows sorted too and the sum over each token's rows gathers them through their positions
(``sorted_topk_sum``). Forms, each from the dispatcher's configurations (``layer_configs``):

* ``fp8``: the layer's tiles stored with ``gl.store`` (``layer_configs(..., tma_store=False)``, as
  shipped before the twenty-seventh session); ``fp8-tma-up``: the gate/up GEMM's e4m3 tile through TMA;
* ``fp8-tma-down``: the down GEMM's rows sorted, through TMA (a 256-wide rescaled tile's four
  buffers take one stage's room: 3 stages); ``fp8-tma``: both (``copied_out``; the layer's
  configurations where ``configs.layer_copies_out`` says so);
* ``sorted``: Part 4's bf16 layer, the ratio's denominator;
* ``gluon-bf16``, ``gluon-bf16-tma``: the bf16 layer wholly on the Gluon kernel (``gluon_layer``,
  the pair notebook 04's appendix measured first: gate/up 128 x 128 with 4 stages, down 128 x 256
  with 3), its tiles stored with ``gl.store`` or copied out through TMA. The eighth session's profile
  of its down GEMM found the warps stalled on the barrier and on the store queue ("lg throttle").

Each is checked against float64 (4 rows; the FP8 forms against the float64 layer that takes the same
quantisation steps), and each TMA form for the same bits as its ``gl.store`` twin (``same_bits``).
Timed cold-l2 (L2 flushed before each call, one call per CUDA graph replay), in one order and then
the reverse, keeping the faster. Rows go to ``$OUT/tma_store_layer.csv`` with the run's ceilings and
``bf16_over`` (Part 4's bf16 layer's time over the row's).
"""
from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import moe_tutorial as mt  # noqa: F401  (first: picks the runtime)
from moe_tutorial import runtime
from moe_tutorial.kernels.configs import KernelConfig, copied_out
from moe_tutorial.kernels.fp8_layer import layer_configs
from moe_tutorial.perf import bench, impls, sweep
from moe_tutorial.shapes import ModelShape

import torch

OUT = os.environ.get("OUT", ".")
FORMS = ("fp8", "fp8-tma-up", "fp8-tma-down", "fp8-tma", "sorted", "gluon-bf16", "gluon-bf16-tma")
#: gluon_layer's (gate/up, down) pair: 128 rows, 64 of K, 8 warps (two consumer warpgroups).
BF16_PAIR = (KernelConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=4, short_tails=False),
             KernelConfig(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, short_tails=False))


def form_configs(inp) -> dict:
    """``{form: (gate/up, down) or the reason it does not run}`` for one case."""
    s = inp.shape
    up, down = layer_configs(inp.M, s.num_experts, s.intermediate, s.hidden, s.topk, tma_store=False)
    if not up.gluon:
        reason = "the dispatcher runs the tl kernel here (the TMA copies are the Gluon kernel's)"
        return {"fp8": (up, down), "fp8-tma-up": reason, "fp8-tma-down": reason, "fp8-tma": reason}
    return {"fp8": (up, down), "fp8-tma-up": (copied_out(up), down), "fp8-tma-down": (up, copied_out(down)),
            "fp8-tma": (copied_out(up), copied_out(down))}


def same_bits(name: str, outs: dict):
    """Whether a TMA form gave the bits of its ``gl.store`` twin (``fp8`` for the FP8 forms), or ""."""
    twin = "fp8" if name.startswith("fp8-") else name.removesuffix("-tma") if name.endswith("-tma") else None
    return bool(torch.equal(outs[name], outs[twin])) if twin in outs and name in outs else ""


def describe(config, kernel: str | None = None) -> str:
    """A configuration in a few characters: the kernel (``config.gluon`` says it for Part 7's; the bf16
    Gluon layer's name it), rows x columns, warps, stages, the forms' flags."""
    flags = "".join(f"-{name}" for name in ("rescale", "tma_store") if getattr(config, name))
    kernel = kernel or ("gluon" if config.gluon else "tl")
    return f"{kernel}-{config.block_m}x{config.block_n}-w{config.num_warps}-s{config.num_stages}{flags}"


def case_rows(shape: ModelShape, M: int, w13, w2, caches: dict, ceil, info: dict) -> list[dict]:
    """Check, then time every form on one batch; one row each (a reason where it did not run)."""
    inp = bench.make_inputs(shape, M, runtime.DEFAULT_DTYPE, w13, w2)
    inp.__dict__.update(caches)                 # the experts quantised once per model, not per M
    forms = form_configs(inp)
    builders = {name: (lambda c=c: impls.layer_fp8(inp, configs=c)) for name, c in forms.items()}
    builders["sorted"] = lambda: impls.layer_of("sorted")(inp)
    for name, tma in (("gluon-bf16", False), ("gluon-bf16-tma", True)):
        forms[name] = tuple(replace(c, tma_store=tma) for c in BF16_PAIR)
        builders[name] = lambda c=forms[name]: impls.gluon_layer_with(inp, c)
    prepared = {name: forms[name] if isinstance(forms.get(name), str) else sweep.prepared_or_reason(build)
                for name, build in builders.items()}
    caches.update({k: v for k, v in inp.__dict__.items() if k.startswith("_fp8")})
    # Four rows: the FP8 reference dequantises the experts they touch into float64.
    times, outs, errors, status = sweep.check_then_time(prepared, *bench.reference_rows("layer", inp, max_rows=4),
                                                  keep_outputs=True)     # [M, K] each: for the same-bits check
    rows = []
    for name in prepared:
        config = forms.get(name)
        kernel = "gluon" if name.startswith("gluon-") else None
        row = sweep.layer_row(info, shape, M, name, inp, ceil, times, errors, status,
                              precision="fp8" if name.startswith("fp8") else "bf16", E=shape.num_experts,
                              hidden=shape.hidden, inter=shape.intermediate, topk=shape.topk,
                              up=describe(config[0], kernel) if isinstance(config, tuple) else "",
                              down=describe(config[1], kernel) if isinstance(config, tuple) else "")
        if name in times:
            row.update(fraction_of_floor=row["floor_ms"] / row["ms"], same_bits=same_bits(name, outs))
        rows.append(row)
    sweep.print_case(shape.name, M, rows, lambda r: f"{r['bf16_over']:.2f}x")
    for r in rows:
        if r.get("same_bits") is False:
            print(f"    {r['impl']}: NOT the same bits as its gl.store twin (rel_error {r['rel_error']:.2e})",
                  flush=True)
    return rows


def main(argv=None) -> int:
    args = sweep.sweep_parser(__doc__.splitlines()[0], [1024, 4096, 16384]).parse_args(argv)
    if (todo := sweep.cases(args)) is None:
        return 2
    sweep.sweep_models(*todo, case_rows, Path(OUT) / "tma_store_layer.csv", with_w2=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
