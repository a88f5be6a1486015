"""Part 7's FP8 layer on 64-row and on 128-row tiles, by rows an expert: one timer.

    python3 measurements/scripts/tile_height_layer.py [--models Qwen3-30B-A3B DeepSeek-V3 Kimi-K2] \\
        [--M 2048 3072 4096 6144 8192] [--dry-run]

The heuristic takes the fused 64-row Gluon pair under ``configs.GLUON_RESCALED_ROWS`` rows an expert and
the 128-row rescaled pair from there. The twenty-ninth session found the 128-row pair 1.15x faster on
Kimi-K2 at 85 rows an expert and 1.12x at 171, but 0.93x on DeepSeek-V3 at 128 (the same K and I);
the thirtieth measured the rows between and around them, and the rule moved from 256 to 168 rows.
This times, for each case:

* ``fp8``: the layer as dispatched (``layer_configs(..., tma_store=True)``);
* ``fp8-64``: the fused 64-row pair (``GLUON_FUSED_UP``, ``GLUON_FUSED_DOWN``; ``gl.store``);
* ``fp8-128``: the 128-row rescaled split pair, copied out through TMA (``GLUON_RESCALED``,
  ``GLUON_RESCALED_WIDE``);
* ``sorted``: Part 4's bf16 layer, the ratio's denominator.

Each is checked against float64 (4 rows). Timed cold-l2 (L2 flushed before each call, one call per
CUDA graph replay), in one order and then the reverse, keeping the faster. Rows go to
``$OUT/tile_height_layer.csv`` with the run's ceilings, ``bf16_over``, an expert's average ``rows`` and
the routings' mean count of 64-row and 128-row tiles (``tiles64``, ``tiles128``).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import moe_tutorial as mt  # noqa: F401  (first: picks the runtime)
from moe_tutorial import runtime
from moe_tutorial.experiments.gluon_fp8 import row_tiles
from moe_tutorial.kernels.configs import (
    GLUON_FUSED_DOWN,
    GLUON_FUSED_UP,
    GLUON_RESCALED,
    GLUON_RESCALED_WIDE,
    copied_out,
)
from moe_tutorial.kernels.fp8_layer import layer_configs
from moe_tutorial.perf import bench, impls, sweep

OUT = os.environ.get("OUT", ".")


def case_rows(shape, M: int, w13, w2, caches: dict, ceil, info: dict) -> list[dict]:
    """Check, then time the forms on one batch; one row each."""
    inp = bench.make_inputs(shape, M, runtime.DEFAULT_DTYPE, w13, w2)
    inp.__dict__.update(caches)
    s = shape
    forms = {"fp8": layer_configs(M, s.num_experts, s.intermediate, s.hidden, s.topk, tma_store=True),
             "fp8-64": (GLUON_FUSED_UP, GLUON_FUSED_DOWN),
             "fp8-128": (copied_out(GLUON_RESCALED), copied_out(GLUON_RESCALED_WIDE))}
    prepared = {name: sweep.prepared_or_reason(lambda c=pair: impls.layer_fp8(inp, configs=c))
                for name, pair in forms.items()}
    prepared["sorted"] = sweep.prepared_or_reason(lambda: impls.layer_of("sorted")(inp))
    caches.update({k: v for k, v in inp.__dict__.items() if k.startswith("_fp8")})
    times, _, errors, status = sweep.check_then_time(prepared, *bench.reference_rows("layer", inp, max_rows=4))
    counts = {b: sum(row_tiles(i, s.num_experts, b) for i in inp.ids) / len(inp.ids) for b in (64, 128)}
    rows = [sweep.layer_row(info, shape, M, name, inp, ceil, times, errors, status,
                            precision="bf16" if name == "sorted" else "fp8",
                            up=str(forms.get(name, ("", ""))[0]), down=str(forms.get(name, ("", ""))[1]),
                            rows=M * s.topk / s.num_experts, tiles64=counts[64], tiles128=counts[128])
            for name in prepared]
    sweep.print_case(shape.name, M, rows, lambda r: f"{r['bf16_over']:.2f}x")
    print(f"    {M * s.topk / s.num_experts:.0f} rows an expert; tiles of 64 rows {counts[64]:.0f}, "
          f"of 128 rows {counts[128]:.0f}", flush=True)
    return rows


def main(argv=None) -> int:
    args = sweep.sweep_parser(__doc__.splitlines()[0], [2048, 3072, 4096, 6144, 8192]).parse_args(argv)
    if (todo := sweep.cases(args)) is None:
        return 2
    sweep.sweep_models(*todo, case_rows, Path(OUT) / "tile_height_layer.csv", with_w2=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
