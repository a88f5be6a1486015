"""Part 7's FP8 layer with its gate/up GEMM reading x's rows by index, against the layer as it ships.

    python3 measurements/scripts/gather_layer.py [--models Qwen3-30B-A3B DeepSeek-V3 Kimi-K2] \\
        [--M 4096 16384] [--dry-run]

Where the gate/up GEMM takes the rescaled split form (``configs.GLUON_RESCALED_ROWS`` rows an expert or
more), the layer quantises x into sorted order, writing each token's e4m3 row once per expert it goes
to (``topk`` copies), so that the GEMM loads its A tiles through TMA; or it quantises x once, and the
GEMM's load warps read each sorted row's token row by index (cp.async), with the rows' offsets loaded
once a tile (``gluon_fp8_kernel.gathers_a`` chooses). For each case:

* ``fp8``: the layer's configurations as dispatched (``layer_configs(..., tma_store=True)``) with
  ``GATHER_A`` off while the call runs (and is captured): the sorted copy;
* ``fp8-gather``: the same configurations with ``GATHER_A`` on, four load warps (``GATHER_WARPS``);
* ``fp8-gather-1w``: the same with one load warp;
* ``sorted``: Part 4's bf16 layer, the ratio's denominator.

Each is checked against float64 (4 rows), and the FP8 forms against each other bit for bit
(``same_bits``). Timed cold-l2 (L2 flushed before each call, one call per CUDA graph replay), in one
order and then the reverse, keeping the faster. Rows go to ``$OUT/gather_layer.csv``.
"""
from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import moe_tutorial as mt  # noqa: F401  (first: picks the runtime)
from moe_tutorial import runtime
from moe_tutorial.kernels import gluon_fp8_kernel
from moe_tutorial.kernels.fp8_layer import layer_configs
from moe_tutorial.perf import bench, impls, sweep

import torch

OUT = os.environ.get("OUT", ".")


#: The forms: name -> load warps reading A by index (0: the sorted copy through TMA).
LOAD_WARPS = {"fp8": 0, "fp8-gather": 4, "fp8-gather-1w": 1}


def gathering(prepared, warps: int):
    """``prepared`` (an FP8 layer's calls) with ``GATHER_A`` on and ``warps`` load warps while each call
    runs, or off where ``warps`` is 0; both as they were after it."""
    def on(call):
        def run():
            before = gluon_fp8_kernel.GATHER_A, gluon_fp8_kernel.GATHER_WARPS
            gluon_fp8_kernel.GATHER_A, gluon_fp8_kernel.GATHER_WARPS = warps > 0, warps or before[1]
            try:
                return call()
            finally:
                gluon_fp8_kernel.GATHER_A, gluon_fp8_kernel.GATHER_WARPS = before
        return run
    if isinstance(prepared, str):
        return prepared
    return replace(prepared, calls=[on(c) for c in prepared.calls])


def case_rows(shape, M: int, w13, w2, caches: dict, ceil, info: dict) -> list[dict]:
    """Check, then time the forms on one batch; one row each."""
    inp = bench.make_inputs(shape, M, runtime.DEFAULT_DTYPE, w13, w2)
    inp.__dict__.update(caches)
    s = shape
    pair = layer_configs(M, s.num_experts, s.intermediate, s.hidden, s.topk, tma_store=True)
    prepared = {name: gathering(sweep.prepared_or_reason(lambda: impls.layer_fp8(inp, configs=pair)), warps)
                for name, warps in LOAD_WARPS.items()}
    prepared["sorted"] = sweep.prepared_or_reason(lambda: impls.layer_of("sorted")(inp))
    caches.update({k: v for k, v in inp.__dict__.items() if k.startswith("_fp8")})
    times, outs, errors, status = sweep.check_then_time(prepared, *bench.reference_rows("layer", inp, max_rows=4),
                                                  keep_outputs=True)
    same = all(torch.equal(outs[n], outs["fp8"]) for n in LOAD_WARPS) if set(LOAD_WARPS) <= set(outs) else None
    rows = []
    for name in prepared:
        fp8 = name in LOAD_WARPS
        rows.append(sweep.layer_row(info, shape, M, name, inp, ceil, times, errors, status,
                                    precision="fp8" if fp8 else "bf16", up=str(pair[0]) if fp8 else "",
                                    down=str(pair[1]) if fp8 else "", rows=M * s.topk / s.num_experts,
                                    same_bits=same if fp8 else ""))
    sweep.print_case(shape.name, M, rows, lambda r: f"{r['bf16_over']:.2f}x")
    print(f"    gate/up form {pair[0]}; the FP8 forms {'bit for bit the same' if same else 'DIFFER'}"
          if same is not None else "    (the FP8 forms did not all run)", flush=True)
    return rows


def main(argv=None) -> int:
    args = sweep.sweep_parser(__doc__.splitlines()[0], [4096, 16384]).parse_args(argv)
    if (todo := sweep.cases(args)) is None:
        return 2
    sweep.sweep_models(*todo, case_rows, Path(OUT) / "gather_layer.csv", with_w2=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
