"""Why Part 3's kernel stops near 10 TFLOP/s on an H200: the experiments, the file of their results, what it says.

``measurements/scripts/h200_part3_cap.py`` runs the experiments on a GPU and writes :data:`CAP_RESULTS`;
notebook 03 reads it with :func:`load` and prints :func:`table` and :func:`explain`. Each
experiment changes one thing and keeps the rest of the kernel's work as it was:

- ``dtype``: the same problem with fp32 weights and x instead of bf16. Every multiply-add then
  needs twice the bytes, and no more instructions (fewer: nothing to convert). A kernel that
  waits for bytes (from HBM, the L2 cache or L1) halves its TFLOP/s; a kernel that waits for
  its instructions to issue keeps them.
- ``routing``: every token routed to the same ``topk`` experts instead of uniformly. The
  weights then come from HBM once and from the caches after that: if HBM bandwidth were the
  limit, this would run much faster.
- ``tile``: other ``BLOCK_N``, ``BLOCK_K`` and warps per program. If the cap were a poor tile
  choice, one of them would escape it.
- ``ncu``: Nsight Compute's view of one launch in each dtype: how busy L1, L2, DRAM and the
  SMs' issue slots were (percent of their peak), and the instructions executed.

Rows are dicts with :data:`FIELDS` keys. A timing row has ``ms``, ``tflops`` and
``loaded_tbps`` (the bytes the programs load, weights once per (token, slot) pair, over the
time: what the memory system delivered to the SMs); an ``ncu`` row has ``metric`` (a short
key of :data:`NCU_METRICS`), ``value`` and, in ``note``, Nsight Compute's own metric name.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from ..perf.report import format_table
from ..perf.results import DATA_DIR, H200_RESULTS, committed_ceilings, read_csv, write_csv
from ..perf.traffic import geomean

#: Where the H200 result is committed (the script writes it under its --out directory).
CAP_RESULTS = DATA_DIR / "h200_part3_cap.csv"

FIELDS = [
    "gpu", "driver", "torch", "triton", "date",
    "experiment", "variant", "model", "E", "N", "K", "topk", "M", "dtype", "routing",
    "block_n", "block_k", "num_warps", "ms", "tflops", "loaded_tbps", "rel_error",
    "metric", "value", "note",
]
_INT = {"E", "N", "K", "topk", "M", "block_n", "block_k", "num_warps"}
_FLOAT = {"ms", "tflops", "loaded_tbps", "rel_error", "value"}

#: Short names of the Nsight Compute metrics the verdict reads, each with the metric names that
#: may carry it (the first one found in a report is used).
NCU_METRICS: dict[str, tuple[str, ...]] = {
    "duration_ns": ("gpu__time_duration.sum",),
    "sm_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed",),
    "issue_pct": ("smsp__issue_active.avg.pct_of_peak_sustained_active",
                  "sm__inst_issued.avg.pct_of_peak_sustained_active"),
    "fma_pipe_pct": ("sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active",
                     "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active"),
    "l1_pct": ("l1tex__throughput.avg.pct_of_peak_sustained_active",
               "l1tex__throughput.avg.pct_of_peak_sustained_elapsed"),
    "l2_pct": ("lts__throughput.avg.pct_of_peak_sustained_elapsed",),
    "dram_pct": ("dram__throughput.avg.pct_of_peak_sustained_elapsed",
                 "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"),
    "l1_hit_pct": ("l1tex__t_sector_hit_rate.pct",),
    "l2_hit_pct": ("lts__t_sector_hit_rate.pct",),
    "warp_inst": ("smsp__inst_executed.sum", "sm__inst_executed.sum"),
    "occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "registers": ("launch__registers_per_thread",),
}

#: fp32 over bf16 TFLOP/s at or below this: the rate follows the bytes (an exact halving is 0.5).
BYTES_BOUND_BELOW = 0.65
#: ... at or above this: the bytes doubled and the rate did not follow them.
ISSUE_BOUND_ABOVE = 0.85
#: Same-experts over uniform routing at or above this, with the weights arriving no faster than HBM
#: can deliver them: HBM traffic is what the kernel waits for.
HBM_BOUND_ABOVE = 1.25


def write(path, rows: list[dict]) -> Path:
    """Write ``rows`` (dicts with :data:`FIELDS` keys; missing ones left empty) as CSV."""
    return write_csv(path, rows, FIELDS)


def load(path=CAP_RESULTS) -> list[dict] | None:
    """The rows of a results file, numbers parsed; None when the file does not exist (not measured yet)."""
    return read_csv(path, _INT, _FLOAT) if Path(path).exists() else None


def timed(rows: list[dict], **where) -> list[dict]:
    """The timing rows (those with a TFLOP/s) whose columns equal every ``where`` item."""
    return [r for r in rows if r.get("tflops") and all(r.get(k) == v for k, v in where.items())]


def ncu(rows: list[dict]) -> dict[str, dict[str, float]]:
    """``{dtype: {metric: value}}`` from the ``ncu`` rows."""
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        if r.get("experiment") == "ncu" and r.get("metric") and r.get("value") is not None:
            out.setdefault(r["dtype"], {})[r["metric"]] = r["value"]
    return out


def ratios(rows: list[dict], experiment: str, column: str, new, old) -> dict[str, float]:
    """``{model: TFLOP/s with column = new / TFLOP/s with column = old}`` within one experiment."""
    out = {}
    for r_new in timed(rows, experiment=experiment, **{column: new}):
        base = timed(rows, experiment=experiment, model=r_new["model"], M=r_new["M"], **{column: old})
        if base:
            out[r_new["model"]] = r_new["tflops"] / base[0]["tflops"]
    return out


def table(rows: list[dict]) -> str:
    """The timing rows as a text table: what changed, the time, TFLOP/s and the TB/s the programs loaded."""
    body = []
    for r in timed(rows):
        tile = f"{r['block_n']}x{r['block_k']}, {r['num_warps']} warps"
        body.append([r["experiment"], r["variant"], r["model"], str(r["M"]), r["dtype"], r["routing"], tile,
                     f"{r['ms']:.3f}", f"{r['tflops']:.1f}", f"{r['loaded_tbps']:.1f}"])
    return format_table(["experiment", "variant", "model", "M", "dtype", "routing", "BLOCK_N x BLOCK_K",
                         "ms", "TFLOP/s", "loaded TB/s"], body)


def machine(rows: list[dict]) -> str:
    """Where and when the file was measured, from its first row."""
    r = rows[0] if rows else {}
    return (f"{r.get('gpu') or 'unknown GPU'}, driver {r.get('driver') or '?'}, torch {r.get('torch') or '?'}, "
            f"Triton {r.get('triton') or '?'}, {str(r.get('date') or 'undated')[:10]}")


@dataclass(frozen=True)
class Verdict:
    """What the measurements say: ``cause`` is "bytes: HBM", "bytes: on chip", "instructions",
    "mixed" or "unknown"; ``text`` says it in sentences, with the numbers that show it."""

    cause: str
    text: str


def instructions_per_element(rows: list[dict], dtype: str) -> float | None:
    """Thread instructions per weight element in the ``ncu`` run of ``dtype`` (warp instructions x 32
    over ``M * topk * N * K``), or None when that run recorded none."""
    case = next((r for r in rows if r.get("experiment") == "ncu" and r.get("dtype") == dtype
                 and r.get("metric") == "warp_inst" and r.get("value")), None)
    if case is None:
        return None
    return 32 * case["value"] / (case["M"] * case["topk"] * case["N"] * case["K"])


def _pct(metrics: dict, key: str) -> str:
    return f"{metrics[key]:.0f}%" if key in metrics else "not recorded"


def hbm_read_tbps() -> float | None:
    """The H200's read-only bandwidth measured by the series' benchmark (the committed run), if any."""
    return committed_ceilings()[0] if H200_RESULTS.exists() else None


def explain(rows: list[dict], hbm_tbps: float | None = None) -> Verdict:
    """One explanation of the cap, derived from the experiments' numbers (see the module's docstring).

    ``hbm_tbps``: the GPU's HBM read bandwidth (default: the committed benchmark's read-only
    ceiling). Weights that reach the SMs faster than HBM can deliver them come from the caches,
    whatever the routing experiment says.
    """
    source = "in the benchmark run that timed Part 4" if hbm_tbps is None else "by the benchmark"
    hbm_tbps = hbm_read_tbps() if hbm_tbps is None else hbm_tbps
    by_dtype = ratios(rows, "dtype", "dtype", "float32", "bfloat16")
    if not by_dtype:
        return Verdict("unknown", "The file holds no bf16/fp32 pair of the dtype experiment: no verdict.")
    r = geomean(by_dtype.values())
    models = ", ".join(f"{m} {v:.2f}x" for m, v in by_dtype.items())
    loads = {d: geomean([x["loaded_tbps"] for x in timed(rows, experiment="dtype", dtype=d)])
             for d in ("bfloat16", "float32")}
    routing = ratios(rows, "routing", "routing", "same experts", "uniform")
    tiles = [x["tflops"] for x in timed(rows, experiment="tile")]
    metrics = ncu(rows)
    bf16 = metrics.get("bfloat16", {})

    dtype_sentence = (f"With fp32 weights, twice the bytes for the same multiply-adds, the kernel reaches {r:.2f} "
                      f"times its bf16 TFLOP/s ({models})")
    if routing:
        rr = geomean(routing.values())
        routing_sentence = (f"Routing every token to the same experts, so that HBM serves each weight once, changes "
                            f"the rate by {rr:.2f}x ({', '.join(f'{m} {v:.2f}x' for m, v in routing.items())})")
    else:
        rr = math.nan
        routing_sentence = "The routing experiment is missing from the file"
    tile_sentence = (f" No other tile escapes it: {len(tiles)} other tile shapes ran at {min(tiles):.1f} to "
                     f"{max(tiles):.1f} TFLOP/s." if tiles else "")
    if bf16:
        ncu_sentence = (f" Nsight Compute, bf16: L1 {_pct(bf16, 'l1_pct')}, L2 {_pct(bf16, 'l2_pct')} and DRAM "
                        f"{_pct(bf16, 'dram_pct')} of their peak throughput; issue slots busy "
                        f"{_pct(bf16, 'issue_pct')}.")
        per_element = instructions_per_element(rows, "bfloat16")
        if per_element is not None:
            ncu_sentence += f" It executes {per_element:.1f} instructions per weight element (2 FLOPs)."
    else:
        ncu_sentence = " (Nsight Compute was not run, or gave no metrics.)"

    faster_than_hbm = hbm_tbps is not None and loads["bfloat16"] > 1.1 * hbm_tbps
    if r <= BYTES_BOUND_BELOW:
        if rr >= HBM_BOUND_ABOVE and not faster_than_hbm:
            cause, where = "bytes: HBM", "HBM bandwidth: the weights it re-reads for every token come from HBM"
        else:
            level = max(("L1", "l1_pct"), ("L2", "l2_pct"), key=lambda kv: bf16.get(kv[1], -1.0))[0] if bf16 else None
            cause = "bytes: on chip"
            where = (f"the rate at which the caches deliver the weights to the SMs (busiest: {level})" if level
                     else "the rate at which the caches (L2, L1) deliver the weights to the SMs")
        hbm_sentence = (f" That is more than HBM can deliver ({hbm_tbps:.2f} TB/s read-only, measured {source}), "
                        "so most of those bytes are re-reads served by the caches."
                        if faster_than_hbm else "")
        text = (f"Part 3's cap is {where}. {dtype_sentence}: the TFLOP/s follow the bytes, which flow at about "
                f"{loads['bfloat16']:.1f} TB/s in bf16 and {loads['float32']:.1f} TB/s in fp32.{hbm_sentence} "
                f"{routing_sentence}.{tile_sentence}{ncu_sentence}")
    elif r >= ISSUE_BOUND_ABOVE:
        cause = "instructions"
        text = (f"Part 3's cap is the SMs' instruction issue, not bytes. {dtype_sentence}: twice the bytes, the "
                f"same rate, so no level of memory is what it waits for. {routing_sentence}.{tile_sentence}"
                f"{ncu_sentence} Each weight element costs a conversion, a multiply-add and its share of "
                f"the cross-lane sum and the address arithmetic, on the ordinary cores, for 2 FLOPs.")
    else:
        cause = "mixed"
        text = (f"Part 3's cap has no single cause in these numbers. {dtype_sentence}: between the halving of a "
                f"bandwidth limit and the flat line of an instruction limit. {routing_sentence}.{tile_sentence}"
                f"{ncu_sentence}")
    return Verdict(cause, text)
