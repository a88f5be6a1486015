"""Where Part 4 stops short of the floor, and what was tried: the limit experiments, read back.

``measurements/scripts/h200_limit_experiments.py`` measured, on one H200 and under the cold-l2 protocol, the
read-only kernel over 25 MiB to 1.9 GB (the floor assumes the 8 GB rate), two reads of a decode
layer's weights, and each lever tried on Part 4 against Part 4 as it stood in the same run. The
rows ship as ``moe_tutorial/data/h200_limit_experiments.csv``; notebook 05's appendix reads them
through the functions here.

Each run's read ceiling is raised to the best rate its bandwidth-bound calls reached, as the
bench's are (:func:`raise_read_ceiling`, :mod:`moe_tutorial.perf.reached`). The rows of 2026-12-01
were written before the script kept its ceilings; theirs (``read_tbps``, ``matmul_tflops``,
``launch_us``) were taken from the run's log, ``measurements/logs/2026-12-01-2-levers/limit-experiments.log``.
"""
from __future__ import annotations

import statistics

from ..perf import reached, traffic
from ..perf.report import format_table
from ..perf.results import DATA_DIR, read_csv
from ..shapes import ModelShape, get_shape

LIMITS = DATA_DIR / "h200_limit_experiments.csv"
_INT = {"round", "M", "bytes"}
_FLOAT = {"read_tbps", "read_measured_tbps", "matmul_tflops", "launch_us", "ms", "floor_ms", "fraction_of_floor",
          "rate", "rel_error"}
#: Experiments whose rows time the first GEMM; "layer" rows time the whole layer.
FIRST_GEMM_EXPERIMENTS = ("first-gemm", "cta-clusters")

#: Each lever as tried: (experiment, baseline variant, variant, what it is, kept or dropped).
LEVERS = (
    ("first-gemm", "base", "ws", "warp specialisation of the K loop (Triton 3.6)", "dropped"),
    ("cta-clusters", "tuned", "tuned-ctas2", "2-CTA clusters (num_ctas=2) on the tuned kernel", "dropped"),
    ("cta-clusters", "tuned", "notails-ctas2", "2-CTA clusters without short tails", "dropped"),
    ("first-gemm", "base", "xsorted-gemm", "x gathered first, A through TMA: the GEMM alone", "dropped"),
    ("first-gemm", "base", "xsorted+gather", "x gathered first, A through TMA: with the gather", "dropped"),
    ("layer", "base", "decode-32x256w4s4", "decode path: no sort, down GEMM sums the topk", "dropped"),
    ("layer", "base", "atomic", "down GEMM adds into the output with fp32 atomics", "dropped"),
    ("layer", "base", "sortedact-tma", "sorted activations, A through TMA at prefill", "kept"),
    ("topk-sum", "torch-sum", "topk_sum", "the topk sum as one Triton launch (the sum alone)", "kept"),
)


#: Variants that time one piece of what ``floor_ms`` bounds (the gather of x alone, the topk sum
#: alone), as (experiment, variant): their rows leave ``floor_ms`` and ``fraction_of_floor``
#: empty, since the floor of the whole GEMM or layer is not theirs.
PARTS = frozenset({("first-gemm", "gather"), ("layer", "sum-alone")})


def is_part(row: dict) -> bool:
    """True for a row that times a piece of the GEMM or layer (see :data:`PARTS`)."""
    return (row["experiment"], row["variant"]) in PARTS


def load_limits(path=LIMITS) -> list[dict]:
    """The limit experiments' rows, numbers as int/float and empty cells as None."""
    return read_csv(path, _INT, _FLOAT)


def row_flops(row: dict, shapes: dict[str, ModelShape] | None = None) -> float:
    """FLOPs of the first GEMM or the layer a row with a floor times; ``shapes`` names models
    beyond :data:`moe_tutorial.shapes.MODEL_SHAPES` (the dry run's toy)."""
    s = (shapes or {}).get(row["model"]) or get_shape(row["model"])
    if row["experiment"] in FIRST_GEMM_EXPERIMENTS:
        return traffic.first_gemm_flops(row["M"], 2 * s.intermediate, s.hidden, s.topk)
    return traffic.layer_flops(row["M"], s.hidden, s.intermediate, s.topk)


def raise_read_ceiling(rows: list[dict], shapes: dict[str, ModelShape] | None = None) -> list[dict]:
    """The rows with each run's read ceiling raised to the best rate its calls reached, floors and
    fractions recomputed (:func:`moe_tutorial.perf.reached.raise_read_ceiling`; a run is one
    ``date``, since the read-by-size rows of one run name several protocols)."""
    return reached.raise_read_ceiling(rows, lambda r: row_flops(r, shapes), run_key=("gpu", "date"))


def read_rates(rows: list[dict]) -> dict:
    """``{(protocol, MiB): TB/s}`` of the read-only kernel by size (the best when measured twice)."""
    out: dict = {}
    for r in rows:
        if r["experiment"] == "read-by-size" and r["status"] == "ok":
            key = (r["protocol"], r["bytes"] >> 20)
            out[key] = max(out.get(key, 0.0), r["bytes"] / (r["ms"] * 1e-3) / 1e12)
    return out


def read_rate_table(rows: list[dict], protocols=("cold-l2-zero", "clean-flush")) -> str:
    """One line per size: the read-only kernel's TB/s under each of ``protocols`` measured (the
    rotated protocol was measured too, but a read smaller than L2 is served from it there)."""
    rates = read_rates(rows)
    protocols = [p for p in protocols if any(k[0] == p for k in rates)]
    sizes = sorted({mib for _, mib in rates})
    body = [[f"{mib:,}"] + [f"{rates[p, mib]:.2f}" if (p, mib) in rates else "-" for p in protocols]
            for mib in sizes]
    return format_table(["MiB read"] + [f"{p} (TB/s)" for p in protocols], body)


def decode_reads(rows: list[dict]) -> dict:
    """``{(model, M): (us reading w13, us reading w13 then w2)}``: the touched experts' weights of
    a decode layer read by the read-only kernel, both in one graph, under cold-l2."""
    out: dict = {}
    for r in rows:
        if r["experiment"] == "decode-reads":
            w13, both = out.get((r["model"], r["M"]), (None, None))
            us = 1e3 * r["ms"]
            out[r["model"], r["M"]] = (us, both) if r["variant"] == "read-w13" else (w13, us)
    return out


def lever_gains(rows: list[dict], experiment: str, base: str, variant: str) -> dict:
    """``{(model, M): time of base / time of variant}`` within one experiment and run; a variant
    that failed maps to its status ("error: ...")."""
    by = {(r["round"], r["model"], r["M"], r["variant"]): r for r in rows if r["experiment"] == experiment}
    out: dict = {}
    for (rnd, model, M, name), r in by.items():
        if name != variant or (rnd, model, M, base) not in by:
            continue
        b = by[rnd, model, M, base]
        out[model, M] = r["status"] if r["status"] != "ok" else b["ms"] / r["ms"]
    return out


def lever_table(rows: list[dict], levers=LEVERS) -> str:
    """One line per lever: where it was measured, its lowest, median and highest speed-up over
    the baseline of the same run, and how often it failed to compile."""
    body = []
    for experiment, base, variant, what, verdict in levers:
        gains = lever_gains(rows, experiment, base, variant)
        ok = [g for g in gains.values() if not isinstance(g, str)]
        failed = len(gains) - len(ok)
        Ms = sorted({M for _, M in gains})
        where = f"M = {Ms[0]}..{Ms[-1]}" if Ms else "-"
        spread = (f"{min(ok):.2f}x  {statistics.median(ok):.2f}x  {max(ok):.2f}x" if ok else "-")
        body.append([what, where, spread, f"{failed} of {len(gains)}", verdict])
    return format_table(["lever", "measured at", "speed-up: lowest  median  highest", "did not compile",
                         "kept?"], body)
