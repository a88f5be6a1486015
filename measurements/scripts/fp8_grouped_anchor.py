"""CUTLASS's FP8 grouped GEMM beside Part 7's first GEMM, and the bf16 pair beside them: one run, one timer.

    python3 measurements/scripts/fp8_grouped_anchor.py [--models DeepSeek-V3 Qwen3-30B-A3B Kimi-K2] \\
        [--M 256 1024 4096 16384] [--dry-run]

Issue 31 asks Part 7's first GEMM for 0.70 of the FP8 matmul rate at M >= 4096 (the rate of an 8192^3
``torch._scaled_mm`` in the same run) and its layer for 1.5x the bf16 layer. How far does a production
FP8 grouped GEMM get on the same shapes, and how much faster than its own bf16 twin is it?
``torch._scaled_grouped_mm`` runs CUTLASS's Hopper FP8 grouped GEMM with one scale per row of x and per
output column of the weights (rowwise): no scale changes along K, so nothing to promote inside its
loop, an easier problem than Part 7's 128 x 128 blocks. Timed on the same routing, cold-l2 (L2 flushed
before each call, one call per CUDA graph replay), in one order and then the reverse, keeping the faster:

* ``fp8``: Part 7's first GEMM as the bench times it (the dispatcher's kernel; with the Gluon kernel,
  x's e4m3 rows are gathered into sorted order inside the call);
* ``fp8-gemm``: the Gluon kernel alone on rows gathered beforehand (where the dispatcher takes it):
  what the layer pays, whose quantiser writes the rows in sorted order;
* ``cutlass-fp8``: CUTLASS with fast accumulation; ``cutlass-fp8-exact`` without it (the
  tensor cores' sums promoted into fp32 now and then), where this torch runs it;
* ``sorted``: Part 4's bf16 first GEMM; ``grouped_mm``: ``torch._grouped_mm`` (CUTLASS, bf16) on x
  pre-sorted by expert.

Each is checked against float64 on its own inputs (dequantised for the FP8 rows). Rows go to
``$OUT/fp8_grouped_anchor.csv`` with the run's ceilings, the floor of each row's precision and
``fraction_of_rate``: its multiplies' rate over the FP8 rate (FP8 rows) or the bf16 rate (bf16 rows).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import moe_tutorial as mt  # noqa: F401  (first: picks the runtime)
from moe_tutorial import runtime
from moe_tutorial.kernels.align import align_block_size
from moe_tutorial.kernels.configs import fp8_config
from moe_tutorial.kernels.fp8_quant import quantize_rows
from moe_tutorial.perf import bench, impls, sweep
from moe_tutorial.shapes import ModelShape

import torch

OUT = os.environ.get("OUT", ".")
#: Each row's precision: the FP8 rows are judged against the FP8 rate and floor, the rest against bf16's.
PRECISION = {"fp8": "fp8", "fp8-gemm": "fp8", "cutlass-fp8": "fp8", "cutlass-fp8-exact": "fp8",
             "sorted": "bf16", "grouped_mm": "bf16"}


def gluon_gemm_alone(inp, fp8: impls.Prepared):
    """Part 7's Gluon first GEMM without its gather (x's rows put in sorted order once, beforehand), or
    None where the dispatcher runs the ``tl`` kernel (that one reads the token rows itself)."""
    from moe_tutorial.kernels.gluon_fp8_kernel import gather_sorted_fp8, launch_gluon_fp8_gemm

    wq, ws = impls.fp8_experts(inp, layer=False)
    E, N, K = wq.shape
    M, topk = inp.M, inp.shape.topk
    config = fp8_config(M, E, N, K, topk, "plain")
    if not config.gluon:
        return None
    alignment = align_block_size(inp.ids[0], config.block_m, E)
    a, a_scale_t = gather_sorted_fp8(*quantize_rows(inp.xs[0]), alignment, M * topk, topk, config.block_m)
    out = torch.empty(M * topk, N, dtype=torch.bfloat16, device=wq.device)
    return impls.Prepared([lambda: launch_gluon_fp8_gemm(a, a_scale_t, wq, ws, out, alignment, M * topk, config)],
                          output=lambda _: out.view(M, topk, N), reference=fp8.reference)


def prepared_calls(inp, names=tuple(PRECISION)) -> dict:
    """``{name: Prepared or the reason it does not run}`` for one case, in the CSV's order (those of
    ``names``; "fp8-gemm" prepares "fp8" too)."""
    builders = {"fp8": impls.first_fp8, "fp8-gemm": None, "cutlass-fp8": impls.first_scaled_grouped_mm,
                "cutlass-fp8-exact": lambda i: impls.first_scaled_grouped_mm(i, fast_accum=False),
                "sorted": impls.first_sorted, "grouped_mm": impls.first_grouped_mm}
    out = {}
    for name, build in builders.items():
        if name not in names and not (name == "fp8" and "fp8-gemm" in names):
            continue
        out[name] = sweep.prepared_or_reason(lambda: gluon_gemm_alone(inp, out["fp8"]) if name == "fp8-gemm"
                                       else build(inp))
    if "fp8-gemm" in out and out["fp8-gemm"] is None:
        out["fp8-gemm"] = "the dispatcher runs the tl kernel here: no gather to leave out"
    return {name: out[name] for name in names}


def case_rows(shape: ModelShape, M: int, w13, w2, caches: dict, ceil, info: dict, names=tuple(PRECISION)) -> list[dict]:
    """Check, then time every implementation on one batch; one row each (a reason where it did not run)."""
    inp = bench.make_inputs(shape, M, runtime.DEFAULT_DTYPE, w13, None)
    inp.__dict__.update(caches)                 # the weights quantised once per model, not per M
    prepared = prepared_calls(inp, names)
    caches.update({k: v for k, v in inp.__dict__.items() if k.startswith("_fp8")})
    # Four rows, as vllm_fp8_anchor.py checks: the FP8 references dequantise the experts those rows touch
    # into float64, and sixteen of DeepSeek-V3's (up to 128 experts) would not fit an 80 GB card beside them.
    times, _, errors, status = sweep.check_then_time(prepared, *bench.reference_rows("first", inp, max_rows=4))
    rows = []
    for name in prepared:
        precision = PRECISION[name]
        nbytes, flops = bench.traffic_of("first", inp, precision)
        row = dict(info, model=shape.name, M=M, E=shape.num_experts, N=w13.shape[1], K=w13.shape[2],
                   topk=shape.topk, impl=name, precision=precision,
                   floor_ms=ceil.floor_ms(nbytes, flops, precision), status=status.get(name, "ok"))
        if name in times:
            best = min(times[name])
            rate = ceil.compute_tflops(precision)
            row.update(sweep.timed(times[name]), tflops=flops / (best * 1e-3) / 1e12,
                       fraction_of_rate=flops / (best * 1e-3) / 1e12 / rate, fraction_of_floor=row["floor_ms"] / best,
                       rel_error=errors[name])
        rows.append(row)
    sweep.print_case(shape.name, M, rows, lambda r: f"{r['fraction_of_rate']:.2f}")
    return rows


def main(argv=None) -> int:
    p = sweep.sweep_parser(__doc__.splitlines()[0], [256, 1024, 4096, 16384])
    p.add_argument("--impls", nargs="+", choices=list(PRECISION), default=list(PRECISION))
    args = p.parse_args(argv)
    if (todo := sweep.cases(args)) is None:
        return 2
    names = tuple(args.impls)
    sweep.sweep_models(*todo, lambda *case: case_rows(*case, names), Path(OUT) / "fp8_grouped_anchor.csv",
                 with_w2=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
