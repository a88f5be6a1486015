"""The FP8 layer's input checks on a GPU: refused NaN, NaN inside a CUDA graph, and what the checks cost.

Usage, on a GPU, from the repository root: ``python3 measurements/scripts/h200_fp8_input_checks.py``
(CSV to ``$OUT/fp8_input_checks.csv``, ``$OUT`` defaulting to the current folder). About two minutes.

For DeepSeek-V3 and Qwen3-30B-A3B (64 experts at most, as the GPU tests take them) at M = 1, 64
and 2048 it checks, on real hidden and intermediate sizes:

1. the layer agrees with its float64 reference (four rows), as before the checks changed;
2. a NaN in x is refused at the door, naming the element, by ``fp8_moe_layer`` and ``quantize_rows``;
3. inside a CUDA graph, where nothing is read back, a replay with a NaN in one token gives that
   token NaN and the others their values (the quantiser's NaN scale);

then times four variants, each the median of 50 calls on the host clock (eager, synchronised
at the end) or of the cold-l2 protocol (graph replay):

- ``eager``: ``fp8_moe_layer`` as shipped: the ids' range, x's values and both scales read back
  at once, one host sync;
- ``eager, no read-back``: the same with ``checks.check_values`` made a no-op (what the read-back
  costs is the difference);
- ``graph``: one call captured and replayed (cold-l2), where the checks are skipped: the
  production path, and the kernels' own time;
- ``quantize_rows``: the quantiser alone, checked (one sync) and through ``launch_quantize_rows``.

What to look for: ``ok`` in every check column; the ``graph`` column within noise of the FP8 rows
of ``moe_tutorial/data/h200_fp8_bench.csv`` (printed beside it: the NaN test added a compare and
a reduction to each quantised group); and the read-back's cost, ``eager`` minus ``no read-back``,
a few tens of microseconds at most.
"""
import moe_tutorial as mt  # noqa: I001  (first: picks the runtime)

import csv
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from moe_tutorial import checks, quant
from moe_tutorial.kernels.fp8_layer import fp8_moe_layer
from moe_tutorial.kernels.fp8_quant import launch_quantize_rows, quantize_rows
from moe_tutorial.perf import timing
from moe_tutorial.reference import FP8_LAYER_TOLERANCE, reference_fp8_moe_layer, rel_error

MODELS = ("DeepSeek-V3", "Qwen3-30B-A3B")
BATCHES = (1, 64, 2048)
DATA = Path(mt.__file__).parent / "data" / "h200_fp8_bench.csv"


def host_ms(fn, calls: int = 50) -> float:
    """Median wall-clock milliseconds of one eager call, each synchronised (what a host that waits sees)."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def capture(fn) -> torch.cuda.CUDAGraph:
    """Warm ``fn`` up on a side stream, then capture one call (as the bench does)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph


def stored_ms(model: str, M: int) -> str:
    """The FP8 layer's cold-l2 time in the shipped data, for comparison, or "-"."""
    if not DATA.exists():
        return "-"
    with open(DATA) as f:
        for row in csv.DictReader(f):
            if (row["model"], row["M"], row["gemm"], row["impl"], row["protocol"]) == (model, str(M), "layer", "fp8",
                                                                                       "cold-l2"):
                return f"{float(row['ms']):.4f}"
    return "-"


def refused(fn, words: str) -> str:
    try:
        fn()
    except ValueError as e:
        return "ok" if words in str(e) else f"wrong message: {e}"
    return "NOT refused"


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    out_dir = Path(os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    print(f"{'model':14s} {'M':>5s}  {'ref':4s} {'door':4s} {'graph NaN':9s}  {'eager':>8s} {'no read':>8s} "
          f"{'graph':>8s} {'stored':>8s}  {'quant':>7s} {'q nocheck':>9s}  (ms)")
    for name in MODELS:
        s = mt.get_shape(name)
        E = min(s.num_experts, 64)
        g = torch.Generator(device="cuda").manual_seed(0)
        q13, s13 = quant.quantize_w13(torch.randn(E, 2 * s.intermediate, s.hidden, device="cuda", generator=g) * 0.02)
        q2, s2 = quant.quantize_weight(torch.randn(E, s.hidden, s.intermediate, device="cuda", generator=g) * 0.02)
        for M in BATCHES:
            x = torch.randn(M, s.hidden, device="cuda", generator=g).bfloat16()
            tw, ti = mt.route(torch.randn(M, E, device="cuda", generator=g), min(s.topk, E))
            args = (q13, s13, q2, s2, tw, ti)
            y = fp8_moe_layer(x, *args)
            rows4 = torch.arange(min(M, 4), device="cuda")
            used = torch.unique(ti[rows4])
            local = torch.searchsorted(used, ti[rows4].long()).to(torch.int32)
            ref = reference_fp8_moe_layer(x[rows4].float(), q13[used], s13[used], q2[used], s2[used], tw[rows4], local)
            ref_ok = "ok" if rel_error(y[rows4], ref) < FP8_LAYER_TOLERANCE else f"{rel_error(y[rows4], ref):.1e}"
            bad = x.clone()
            bad[M // 2, 5] = float("nan")
            door = refused(lambda: fp8_moe_layer(bad, *args), f"got nan at [{M // 2}, 5]")
            door = door if door != "ok" else refused(lambda: quantize_rows(bad), f"got nan at [{M // 2}, 5]")
            static, box = x.clone(), {}
            graph = capture(lambda: box.update(y=fp8_moe_layer(static, *args)))
            static.copy_(bad)
            graph.replay()
            torch.cuda.synchronize()
            got, others = box["y"], [r for r in range(M) if r != M // 2]
            nan_ok = "ok" if got[M // 2].isnan().all() and torch.isfinite(got[others]).all() else "WRONG"
            t_eager = host_ms(lambda: fp8_moe_layer(x, *args))
            real = checks.check_values
            checks.check_values = lambda **kw: None
            try:
                t_noread = host_ms(lambda: fp8_moe_layer(x, *args))
            finally:
                checks.check_values = real
            t_graph = timing.measure_ms(lambda: fp8_moe_layer(x, *args), protocol="cold-l2")[0]
            t_q, t_qn = host_ms(lambda: quantize_rows(x)), host_ms(lambda: launch_quantize_rows(x))
            row = dict(model=name, E=E, M=M, reference=ref_ok, refused_at_door=door, nan_in_graph=nan_ok,
                       eager_ms=t_eager, eager_no_readback_ms=t_noread, graph_cold_l2_ms=t_graph,
                       stored_cold_l2_ms=stored_ms(name, M), quantize_rows_ms=t_q, launch_quantize_rows_ms=t_qn)
            rows.append(row)
            print(f"{name:14s} {M:5d}  {ref_ok:4s} {door:4s} {nan_ok:9s}  {t_eager:8.4f} {t_noread:8.4f} "
                  f"{t_graph:8.4f} {row['stored_cold_l2_ms']:>8s}  {t_q:7.4f} {t_qn:9.4f}")
            graph = None                             # frees the captured pool before the next batch
        del q13, s13, q2, s2
        torch.cuda.empty_cache()
    path = out_dir / "fp8_input_checks.csv"
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
