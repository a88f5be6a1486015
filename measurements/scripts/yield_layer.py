"""Part 7's FP8 layer with its Gluon kernels' multiply runs set to yield, against itself unedited: one timer.

    python3 measurements/scripts/yield_layer.py [--models Qwen3-30B-A3B DeepSeek-V3 Kimi-K2] \\
        [--M 1024 4096 16384] [--dry-run]

The twenty-seventh session's profile of the rescaled Gluon FP8 kernel (Qwen3-30B-A3B, M = 16384)
found the tensor pipe 54-59% active and the MMA warps busy with their own instructions between two
MMAs, 17% of the samples on the rescale's ``FMUL``s, which ptxas emits in runs of up to 92 that a
warp can issue back to back without yielding. ``kernels/yield_edit.py`` edits the compiled
kernel so that every other multiply of each run lets the scheduler switch warps (the edit DeepGEMM
makes to its promotion's ``FFMA``s). Forms, each from the dispatcher's configurations
(``layer_configs(..., tma_store=True)``, as shipped):

* ``fp8``: the layer as dispatched; ``fp8-yield``: the same launches, every compiled form of
  ``gluon_fp8_moe_kernel`` swapped for its edited twin while the call is captured (DeepGEMM's
  pattern, ``reuse-alternate``); with ``--patterns`` also ``fp8-yield-alternate`` (every other
  multiply yields) and ``fp8-yield-all`` (every one);
* ``sorted``: Part 4's bf16 layer, the ratio's denominator.

Each is checked against float64 (4 rows), and ``fp8-yield`` for the same bits as ``fp8`` (only
scheduling bits change). Timed cold-l2 (L2 flushed before each call, one call per CUDA graph
replay), in one order and then the reverse, keeping the faster. Rows go to ``$OUT/yield_layer.csv``
with the run's ceilings, ``bf16_over`` and ``changed`` (edited instructions per compiled form).
"""
from __future__ import annotations

import os
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path

import moe_tutorial as mt  # noqa: F401  (first: picks the runtime)
from moe_tutorial import runtime
from moe_tutorial.experiments.yield_bits import Yielding
from moe_tutorial.kernels.fp8_layer import layer_configs
from moe_tutorial.kernels.yield_edit import PATTERNS
from moe_tutorial.perf import bench, impls, sweep

import torch

OUT = os.environ.get("OUT", ".")


def yielded(prepared, yielding: Yielding):
    """``prepared`` whose calls run under ``yielding`` (each called once plainly first, to compile)."""
    if isinstance(prepared, str):
        return prepared
    for call in prepared.calls:
        call()
    return replace(prepared, calls=[lambda c=c: yielding(c) for c in prepared.calls])


def case_rows(shape, M: int, w13, w2, caches: dict, ceil, info: dict, *, all_patterns: bool = False) -> list[dict]:
    """Check, then time the forms on one batch (with ``all_patterns`` every pattern of
    ``yield_edit.PATTERNS``, else DeepGEMM's alone); one row each."""
    from moe_tutorial.kernels.gluon_fp8_kernel import gluon_fp8_moe_kernel
    inp = bench.make_inputs(shape, M, runtime.DEFAULT_DTYPE, w13, w2)
    inp.__dict__.update(caches)
    s = shape
    configs = layer_configs(M, s.num_experts, s.intermediate, s.hidden, s.topk, tma_store=True)
    yieldings = {("fp8-yield" if p == "reuse-alternate" else f"fp8-yield-{p}"): Yielding(gluon_fp8_moe_kernel, p)
                 for p in PATTERNS[:len(PATTERNS) if all_patterns else 1]}
    prepared = {"fp8": sweep.prepared_or_reason(lambda: impls.layer_fp8(inp, configs=configs))}
    for name, yielding in yieldings.items():
        prepared[name] = yielded(sweep.prepared_or_reason(lambda: impls.layer_fp8(inp, configs=configs)), yielding)
    prepared["sorted"] = sweep.prepared_or_reason(lambda: impls.layer_of("sorted")(inp))
    caches.update({k: v for k, v in inp.__dict__.items() if k.startswith("_fp8")})
    times, outs, errors, status = sweep.check_then_time(prepared, *bench.reference_rows("layer", inp, max_rows=4),
                                                  keep_outputs=True)
    rows = []
    for name in prepared:
        fp8 = name != "sorted"
        row = sweep.layer_row(info, shape, M, name, inp, ceil, times, errors, status,
                              precision="fp8" if fp8 else "bf16", up=str(configs[0]) if fp8 else "",
                              down=str(configs[1]) if fp8 else "",
                              changed=" ".join(str(n) for n in yieldings[name].changed.values())
                              if name in yieldings else "")
        if name in times:
            row["same_bits"] = bool(torch.equal(outs[name], outs["fp8"])) if name in yieldings and "fp8" in outs else ""
        rows.append(row)
    sweep.print_case(shape.name, M, rows, lambda r: f"{r['bf16_over']:.2f}x")
    for r in rows:
        if r.get("same_bits") is False:
            print(f"    {r['impl']}: NOT the same bits as fp8 (rel_error {r['rel_error']:.2e})", flush=True)
    for r in rows:
        if r["changed"]:
            print(f"    {r['impl']}: edited instructions per compiled form: {r['changed']}", flush=True)
    return rows


def main(argv=None) -> int:
    from moe_tutorial.kernels import gluon_fp8_kernel
    gluon_fp8_kernel.YIELD_RESCALED = False          # "fp8" as ptxas wrote it; the edits are this script's
    parser = sweep.sweep_parser(__doc__.splitlines()[0], [1024, 4096, 16384])
    parser.add_argument("--patterns", action="store_true", help="every pattern of yield_bits.PATTERNS")
    args = parser.parse_args(argv)
    if (todo := sweep.cases(args)) is None:
        return 2
    sweep.sweep_models(*todo, partial(case_rows, all_patterns=args.patterns), Path(OUT) / "yield_layer.csv",
                       with_w2=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
