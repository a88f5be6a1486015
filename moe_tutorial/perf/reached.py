"""The read ceiling a run reached: the best read rate anything in the run got, not one kernel's.

The bench measures the read-only bandwidth at the start of a run (:mod:`moe_tutorial.perf.ceilings`:
the best of a few read kernels and ``torch.sum``). A GEMM that streams weights can still read
faster than every one of them: on the H200 run that timed Part 4 (2026-12-01) the read kernels
got 4.50 TB/s and Part 4's first GEMM at DeepSeek-V3 M = 64 read at 4.65. A floor computed with
the lower figure is no floor: that call "beat" it by 3%.

So a ceiling is the best rate anything reaches in the run. After a run, :func:`raise_read_ceiling`
raises each run's read ceiling to the best rate any bandwidth-bound call of that run reached,
its bytes over its time less one launch, ``bytes / (ms - launch)``: the rate at which that call
would exactly meet its floor. Every floor of the run is recomputed with it, so no call takes
less than its floor (``fraction_of_floor <= 1``), and the ceiling is still something this GPU
did. What the read kernels got alone stays beside it as ``read_measured_tbps``.

The bench applies it to every run (:func:`moe_tutorial.perf.bench.run_bench`); applied to a
results CSV written before (``python -m moe_tutorial.perf.reached FILE.csv``) it re-derives
the same columns in place, and applying it twice changes nothing. The compute roofs are left as
measured: an 8192^3 cuBLAS product outruns every MoE GEMM the series times, and
``tests/test_data.py`` checks that no committed fraction exceeds 1.
"""
from __future__ import annotations

import argparse
from typing import Callable, Iterable

from . import traffic
from .results import load_rows, write_rows

#: The columns that name one run: the bench measures its ceilings once per run, at its start.
RUN_KEY = ("gpu", "date", "protocol")
#: dtype of rows whose compute roof is the FP8 rate (Part 7's experts).
FP8_DTYPE = "float8_e4m3fn"


def bench_row_flops(row: dict) -> float:
    """FLOPs of one bench row's call (:mod:`moe_tutorial.perf.results` columns): N = 2I and
    K = hidden for both gemms."""
    M, N, K, topk = row["M"], row["N"], row["K"], row["topk"]
    if row["gemm"] == "first":
        return traffic.first_gemm_flops(M, N, K, topk)
    return traffic.layer_flops(M, K, N // 2, topk)


def compute_roof_tflops(row: dict) -> float:
    """The compute roof a row's floor was computed with: the FP8 rate for e4m3 experts."""
    return row["fp8_tflops"] if row.get("dtype") == FP8_DTYPE and row.get("fp8_tflops") else row["matmul_tflops"]


def floor_terms_ms(row: dict, flops: float) -> tuple[float, float]:
    """``(memory ms, compute ms)`` of a row's floor under the ceilings in its columns.

    The floor is ``max(memory, compute) + launch``, and the compute term is known from the FLOPs,
    so the memory term is the floor less the launch where it is the larger. Where the compute term
    is larger, the floor less the launch is an upper bound on the memory term; that is all
    :func:`refloor_ms` needs, since raising the read ceiling only shrinks it.
    """
    compute = flops / (compute_roof_tflops(row) * 1e12) * 1e3
    return row["floor_ms"] - row["launch_us"] * 1e-3, compute


def is_bandwidth_bound(row: dict, flops: float) -> bool:
    memory, compute = floor_terms_ms(row, flops)
    return memory > compute


def reached_read_tbps(rows: Iterable[dict], flops_of: Callable[[dict], float]) -> tuple[float, dict | None]:
    """``(TB/s, row)``: the best ``bytes / (ms - launch)`` of the timed, correct, bandwidth-bound
    ``rows`` (one run's), and the row that reached it; ``(0.0, None)`` when there is none.

    A row's bytes are its memory term times the read ceiling it was judged by. A call no longer
    than one launch is left out: it says the launch was measured high, not that memory is faster.
    """
    best, where = 0.0, None
    for r in rows:
        if not str(r.get("status") or "").startswith("ok") or not r.get("ms") or r.get("floor_ms") is None:
            continue
        flops = flops_of(r)
        if not is_bandwidth_bound(r, flops):
            continue
        busy_ms = r["ms"] - r["launch_us"] * 1e-3
        if busy_ms <= 0:
            continue
        memory_ms, _ = floor_terms_ms(r, flops)
        rate = memory_ms * r["read_tbps"] / busy_ms
        if rate > best:
            best, where = rate, r
    return best, where


def refloor_ms(row: dict, flops: float, read_tbps: float) -> float:
    """The row's floor with the read ceiling at ``read_tbps`` (at least the row's own)."""
    memory, compute = floor_terms_ms(row, flops)
    return max(memory * row["read_tbps"] / read_tbps, compute) + row["launch_us"] * 1e-3


def raise_read_ceiling(rows: list[dict], flops_of: Callable[[dict], float] = bench_row_flops,
                       run_key: tuple[str, ...] = RUN_KEY) -> list[dict]:
    """Rows with each run's read ceiling raised to the best rate the run reached.

    ``rows``: dicts with the ceiling columns ``read_tbps``, ``matmul_tflops`` (``fp8_tflops`` for
    e4m3 rows), ``launch_us``, and ``floor_ms``, ``ms``, ``status`` (:data:`moe_tutorial.perf.results.FIELDS`);
    ``flops_of(row)`` gives a row's FLOPs; rows of one run share ``run_key``. Returns new dicts:
    ``read_tbps`` the raised ceiling (never below the measured one), ``read_measured_tbps`` what the
    read kernels got (kept where already there), ``floor_ms`` and ``fraction_of_floor`` recomputed.
    Rows without a floor are returned unchanged.
    """
    runs: dict[tuple, list[int]] = {}
    for i, r in enumerate(rows):
        if r.get("floor_ms") is not None and r.get("read_tbps"):
            runs.setdefault(tuple(r.get(k) for k in run_key), []).append(i)
    out = [dict(r) for r in rows]
    for members in runs.values():
        mine = [rows[i] for i in members]
        measured = {r.get("read_measured_tbps") or r["read_tbps"] for r in mine}
        if len(measured) != 1:
            raise ValueError(f"rows: expected one read ceiling per run {run_key}, got {sorted(measured)}")
        measured_tbps = measured.pop()
        reached, _ = reached_read_tbps(mine, flops_of)
        ceiling = max(measured_tbps, reached, max(r["read_tbps"] for r in mine))
        for i in members:
            r, new = rows[i], out[i]
            new["floor_ms"] = refloor_ms(r, flops_of(r), ceiling)
            new["read_tbps"], new["read_measured_tbps"] = ceiling, measured_tbps
            if r.get("ms"):
                new["fraction_of_floor"] = new["floor_ms"] / r["ms"]
    return out


def main(argv=None) -> None:
    """Re-derive the read ceiling, floors and fractions of bench results CSVs, in place."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("paths", nargs="+", help="results CSVs (moe_tutorial.perf.results.FIELDS)")
    for path in parser.parse_args(argv).paths:
        rows = load_rows(path)
        new = raise_read_ceiling(rows)
        write_rows(path, new)
        runs = {(r["date"], r["protocol"], r["read_measured_tbps"], r["read_tbps"]) for r in new if r.get("read_tbps")}
        for date, protocol, measured, ceiling in sorted(runs, key=str):
            print(f"{path}: run {date} ({protocol}): read ceiling {measured:.3f} -> {ceiling:.3f} TB/s")


if __name__ == "__main__":
    main()
