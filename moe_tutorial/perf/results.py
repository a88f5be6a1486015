"""Benchmark results as CSV: one schema for what the bench writes and the notebooks plot.

Every row carries the machine it was measured on (GPU, driver, torch, triton, date), the timing
protocol, and the ceilings measured in the same run under that protocol, so a file is
self-describing. The series ships the H200
results in ``moe_tutorial/data/h200_bench.csv``.
"""
from __future__ import annotations

import csv
from pathlib import Path

from .report import headline_ceilings

DATA_DIR = Path(__file__).parent.parent / "data"
H200_RESULTS = DATA_DIR / "h200_bench.csv"

#: Columns, in order. ``protocol`` names how the row was timed (:data:`moe_tutorial.perf.timing.PROTOCOLS`);
#: ``read_tbps`` is the read ceiling: the best of what the read kernels got alone (``read_measured_tbps``)
#: and what the run's bandwidth-bound calls reached (:mod:`moe_tutorial.perf.reached`);
#: ``floor_ms`` is ``max(bytes / read_tbps, FLOPs / matmul_tflops) + launch_us`` (``fp8_tflops`` for
#: rows of dtype float8_e4m3fn, whose bytes count e4m3 weights and activations and their scales); ``gemm`` is "first"
#: (the [M, topk, N] GEMM) or "layer" (the whole layer); ``impl`` is a name from
#: :mod:`moe_tutorial.perf.registry`; ``status`` is "ok", "wrong" (failed the correctness check) or
#: "skipped: <reason>"; times in ms.
FIELDS = [
    "gpu", "driver", "torch", "triton", "date",
    "protocol", "read_tbps", "read_measured_tbps", "copy_tbps", "matmul_tflops", "fp8_tflops", "launch_us",
    "model", "E", "N", "K", "topk", "dtype", "gemm", "impl", "M",
    "ms", "tflops", "gbps", "floor_ms", "fraction_of_floor", "rel_error", "status",
]
_INT = {"E", "N", "K", "topk", "M"}
_FLOAT = {"read_tbps", "read_measured_tbps", "copy_tbps", "matmul_tflops", "fp8_tflops", "launch_us", "ms", "tflops",
          "gbps", "floor_ms", "fraction_of_floor", "rel_error"}


def write_csv(path, rows: list[dict], fields: list[str]) -> Path:
    """Write ``rows`` as CSV with columns ``fields`` (missing keys and None left empty)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row[k] for k in fields})
    return path


def read_csv(path, ints=frozenset(), floats=frozenset()) -> list[dict]:
    """Read a CSV written by :func:`write_csv`: columns in ``ints`` as int, in ``floats`` as float,
    empty cells as None, the rest as text."""
    def parse(key: str, value: str):
        if value == "":
            return None
        if key in ints:
            return int(float(value))
        return float(value) if key in floats else value

    with open(path, newline="") as f:
        return [{k: parse(k, v) for k, v in row.items()} for row in csv.DictReader(f)]


def write_rows(path, rows: list[dict]) -> Path:
    """Write benchmark ``rows`` (dicts with :data:`FIELDS` keys) to ``path``."""
    return write_csv(path, rows, FIELDS)


def load_rows(path=H200_RESULTS) -> list[dict]:
    """Read a benchmark results CSV back, numbers as int/float and empty cells as None."""
    return read_csv(path, _INT, _FLOAT)


def select(rows: list[dict], **where) -> list[dict]:
    """Rows whose columns equal every ``where`` item, e.g. ``select(rows, impl="sorted")``."""
    return [r for r in rows if all(r.get(k) == v for k, v in where.items())]


def committed_ceilings(protocol: str = "cold-l2") -> tuple[float, float]:
    """``(read-only TB/s, matmul TFLOP/s)`` of the committed H200 run that timed Part 4 under
    ``protocol`` (:func:`moe_tutorial.perf.report.headline_ceilings`): what figures and prose quote
    as "the H200's ceilings", one measurement rather than several."""
    ceilings = headline_ceilings(load_rows(H200_RESULTS), protocol=protocol)
    return ceilings["read_tbps"], ceilings["matmul_tflops"]
