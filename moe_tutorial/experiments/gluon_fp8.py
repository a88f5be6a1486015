"""Part 7's Gluon FP8 kernel, measured: each lever on its own, the noise of the measurement, and
what Nsight Compute saw (notebook 07).

The rows come from ``measurements/scripts/h200_gluon_fp8.py sweep`` (``data/h200_gluon_fp8_levers.csv``:
every variant of one case timed in forward, then in reverse order, cold-l2; ``h200_fp8_scale_cost.csv``:
the shipped kernel against the same pipeline with one scale per tensor; ``h200_fp8_quantiser.csv``: the
layer's first step both ways; ``h100_fp8_rescaled.csv``: the sums rescaled in place, on an H100;
``h100_vllm_fp8_anchor.csv``: the first GEMM beside vLLM 0.34.0's block-FP8 Triton kernel, on an H100;
``h100_fp8_store_layout.csv``: the Gluon epilogues' two store layouts, on an H100;
``h100_fp8_tma_store.csv``: the layer's tiles stored by the warps or copied out through TMA, on an H100;
``h100_fp8_stall_sources.csv``: where the layer's Gluon GEMMs' warps stall, instruction by instruction;
``h100_fp8_yield.csv``: the layer with its rescaled forms' multiply runs edited to yield, on an H100;
``h100_fp8_gather.csv``: the gate/up GEMM reading x's rows by index against a sorted copy, on an H100) and
from Nsight Compute on the ``tl`` and Gluon kernels at DeepSeek-V3, M = 16384 (``data/h200_fp8_profile.csv``,
and ``h100_fp8_rescaled_profile.csv`` for the rescaled form).
"""
from __future__ import annotations

import ast
import csv
import re
from pathlib import Path
from statistics import median

from moe_tutorial.kernels.configs import KernelConfig
from moe_tutorial.kernels.gluon_fp8_kernel import split_form
from moe_tutorial.shapes import get_shape

import torch

DATA = Path(__file__).parent.parent / "data"
#: The kernel as shipped, against which each lever is measured: 128-row tiles (two consumer
#: warpgroups), 4 stages, GROUP_M 8, step k+1's MMA in flight during step k's promotion.
SHIPPED = "gluon-128x8-s4"
#: Each lever's row in the sweep, and what it changes from :data:`SHIPPED`.
LEVERS = {
    "gluon-128x8-s4-nooverlap": "no overlap: each step's MMA finished before its promotion (the tl schedule)",
    "gluon-64x4-s6": "one consumer warpgroup: 64-row tiles, 4 warps",
    "gluon-64x8-s6": "64-row tiles, two warpgroups side by side (64 columns each)",
    "gluon-256x8-2wave-s3": "256-row tiles as two waves: one weight tile for both, one raw accumulator",
    "gluon-128x8-s5": "5 pipeline stages instead of 4",
    "gluon-128x8-s4-g1": "GROUP_M 1: tiles in plain row order",
    "gluon-128x8-s4-g16": "GROUP_M 16",
    "gluon-128x8-s4-g32": "GROUP_M 32",
}


def _load(path: Path, floats: tuple[str, ...]) -> list[dict]:
    """A sweep's rows: ``M`` an int, the ``floats`` columns floats (a blank one stays "")."""
    with open(path) as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r["M"] = int(r["M"])
        for k in floats:
            r[k] = float(r[k]) if r[k] else ""
    return rows


def load_levers(path: Path | None = None) -> list[dict]:
    """The sweep's rows (``ms``, ``ms_forward``, ``ms_reverse`` as floats, ``M`` as an int)."""
    return _load(path or DATA / "h200_gluon_fp8_levers.csv", ("ms", "ms_forward", "ms_reverse", "noise"))


def case_times(rows: list[dict], model: str, M: int, gemm: str = "first") -> dict[str, float]:
    """``{variant: ms}`` of one case in the last run that measured it (levers compare within one run)."""
    runs = sorted({r["run"] for r in rows if r["model"] == model and r["M"] == M and r["gemm"] == gemm})
    if not runs:
        raise ValueError(f"no sweep rows for {model}, M = {M}, {gemm}")
    return {r["impl"]: r["ms"] for r in rows
            if r["model"] == model and r["M"] == M and r["gemm"] == gemm and r["run"] == runs[-1]}


def lever_slowdowns(rows: list[dict], model: str, M: int) -> dict[str, float]:
    """Each lever's first-GEMM time over the shipped kernel's (above 1: the lever loses), and the
    ``tl`` kernel's; only the levers that case measured."""
    t = case_times(rows, model, M)
    return {name: t[name] / t[SHIPPED] for name in ("tl", *LEVERS) if name in t}


def noise(rows: list[dict]) -> tuple[float, float]:
    """``(median, largest)`` relative spread between a variant's forward- and reverse-order timings,
    over every FP8 row of the sweep: differences below it are not differences."""
    spreads = sorted(r["noise"] for r in rows if r["impl"] != "bf16-sorted" and r["gemm"] != "gather")
    return spreads[len(spreads) // 2], spreads[-1]


#: The same pipeline on e4m3 with one scale per tensor (Part 4's Gluon kernel on FP8 operands: the
#: tensor cores sum all of K themselves, nothing is promoted), timed beside :data:`SHIPPED` in one run
#: (``data/h200_fp8_scale_cost.csv``): what the block scales cost, and what the pipeline alone reaches.
PER_TENSOR = {
    "pertensor-128x128-s4": "one scale per tensor, the same 128 x 128 tiles",
    "pertensor-128x256-s4": "one scale per tensor, 128 x 256 tiles (promoted, 384 registers a thread)",
}


def load_scale_cost(path: Path | None = None) -> list[dict]:
    """The block-against-tensor sweep's rows, numbers as floats (``M`` an int; blank stays "")."""
    return _load(path or DATA / "h200_fp8_scale_cost.csv", ("ms", "noise", "fp8_rate_fraction", "rel_error"))


def scale_cost(rows: list[dict], model: str, M: int) -> dict[str, dict]:
    """``{variant: {"ms", "rate", "error", "noise"}}`` for the first GEMM of one case: the shipped
    block-scaled kernel and the :data:`PER_TENSOR` ones; ``rate`` is the fraction of the FP8 matmul
    rate of the same run (the gather into sorted order included), ``error`` against float64."""
    return {r["impl"]: {"ms": r["ms"], "rate": r["fp8_rate_fraction"], "error": r["rel_error"], "noise": r["noise"]}
            for r in rows if r["model"] == model and r["M"] == M and r["gemm"] == "first"
            and r["impl"] in (SHIPPED, *PER_TENSOR)}


def load_quantiser(path: Path | None = None) -> list[dict]:
    """The sweep that timed the FP8 layer's first step both ways (``data/h200_fp8_quantiser.csv``)."""
    return _load(path or DATA / "h200_fp8_quantiser.csv", ("ms", "noise"))


def quantiser_gains(rows: list[dict]) -> list[dict]:
    """Per model and M, in the order measured: the first step alone, x quantised then gathered into
    sorted order (``step_gather``) and quantised straight into sorted order (``step_sorted``), and the
    Gluon layer each way (``layer_gather``, ``layer_sorted``: the faster of its two forms), in ms."""
    out = []
    for model, M in dict.fromkeys((r["model"], r["M"]) for r in rows):
        t = {r["impl"]: r["ms"] for r in rows if (r["model"], r["M"]) == (model, M)}
        out.append(dict(model=model, M=M, step_gather=t["quantise+gather-128"], step_sorted=t["quantise-sorted-128"],
                        layer_gather=min(v for k, v in t.items() if k.endswith("+gather")),
                        layer_sorted=min(v for k, v in t.items() if k.endswith("+qsorted"))))
    return out


def load_profile(path: Path | None = None) -> dict[tuple[str, int], dict]:
    """``{(kernel, M): metrics}`` of the Nsight Compute profiles (fractions in [0, 1], times in ms):
    the ``tl`` and Gluon kernels before the weight scales were read ahead, the Gluon kernel after, and the
    same pipeline with one scale per tensor (:data:`PER_TENSOR`'s two tile widths)."""
    text = ("gpu", "torch", "triton", "date", "tool", "model", "gemm", "kernel")
    with open(path or DATA / "h200_fp8_profile.csv") as f:
        out = {}
        for r in csv.DictReader(f):
            row = {k: (v if k in text else float(v)) for k, v in r.items()}
            out[row["kernel"], int(row["M"])] = row
        return out


#: The sums rescaled in place (``config.rescale``), measured on an H100 (``data/h100_fp8_rescaled.csv``):
#: the split form's 256-wide first GEMM and its layer (gate and up of 128 rows, a 256-wide down GEMM)
#: against the shipped kernel and the layer's two earlier forms, cold-l2, each the faster of two orders.
RESCALED = "gluon-128x256-rescaled-split-s4-g8"
RESCALED_LAYER = "gluon-rescaled-split-128"
EARLIER_LAYERS = ("gluon-fused-s4-d64s6", "gluon-unfused-128")


#: The same sweep on an H200, a later session, at M = 4096 and 16384 with the bf16 layer beside it.
H200_RESCALED = DATA / "h200_fp8_rescaled.csv"


def load_rescaled(path: Path | None = None) -> list[dict]:
    """The H100 sweep of the rescaled forms (``data/h100_fp8_rescaled.csv``), or another run's ``path``."""
    return _load(path or DATA / "h100_fp8_rescaled.csv", ("ms", "noise", "fp8_rate_fraction"))


def rescaled_gains(rows: list[dict]) -> list[dict]:
    """Per model and M, in the order measured: the first GEMM's time, shipped (``first``) and rescaled
    (``first_rescaled``; None where the case did not fit the card), the layer's best earlier form
    (``layer``, named in ``layer_form``), the rescaled layer (``layer_rescaled``) and the bf16 layer of
    the same run (``layer_bf16``, None where the run has none), in ms, and the expert's average rows
    (``rows``)."""
    out = []
    for model, M in dict.fromkeys((r["model"], r["M"]) for r in rows):
        t = {(r["gemm"], r["impl"]): r for r in rows if (r["model"], r["M"]) == (model, M)}
        first = t.get(("first", SHIPPED))
        rescaled = t.get(("first", RESCALED))
        form = min(EARLIER_LAYERS, key=lambda f: t["layer", f]["ms"])
        r0 = t["layer", form]
        out.append(dict(model=model, M=M, rows=M * int(r0["topk"]) // int(r0["E"]),
                        first=first["ms"] if first else None, first_rescaled=rescaled["ms"] if rescaled else None,
                        layer=r0["ms"], layer_form=form, layer_rescaled=t["layer", RESCALED_LAYER]["ms"],
                        layer_bf16=t["layer", "bf16-sorted"]["ms"] if ("layer", "bf16-sorted") in t else None))
    return out


def rescaled_lines(gains: list[dict]) -> list[str]:
    """:func:`rescaled_gains` as notebook 07 prints them, one line per model and M: the first GEMM and
    the layer before and after (ms), and the bf16 layer over the FP8 one where the run timed it."""
    lines = []
    for g in gains:
        fitted = g["first"] and g["first_rescaled"]
        first = f"{g['first']:6.3f} -> {g['first_rescaled']:6.3f}" if fitted else "    did not fit 80 GB"
        bf16 = f"   bf16 / FP8 {g['layer_bf16'] / g['layer_rescaled']:.2f}x" if g["layer_bf16"] else ""
        lines.append(f"  {g['model']:14s} M = {g['M']:<6d} {g['rows']:5d} rows an expert   first {first}   "
                     f"layer {g['layer']:6.3f} -> {g['layer_rescaled']:6.3f}{bf16}")
    return lines


def load_stall_sources(path: Path | None = None) -> dict[tuple[str, str], float]:
    """``{(gemm, kind): share}`` of Nsight Compute's stall samples, instruction by instruction, summed by
    kind (the kinds ``measurements/scripts/ncu_source_stalls.py`` defines, ``idle`` spare warps to
    ``other``), for the FP8 layer's two Gluon GEMMs on an H100 at Qwen3-30B-A3B, M = 16384, and for the
    gate/up GEMM reading x's rows by index (``gate/up, by index``; ``data/h100_fp8_stall_sources.csv``)."""
    with open(path or DATA / "h100_fp8_stall_sources.csv") as f:
        return {(r["gemm"], r["kind"]): float(r["share"]) for r in csv.DictReader(f)}


def load_rescaled_profile(path: Path | None = None) -> dict[tuple[str, str], dict]:
    """``{(model, kernel): metrics}`` of Nsight Compute on the H100 at M = 16384
    (``data/h100_fp8_rescaled_profile.csv``: fractions in [0, 1], times in ms, DRAM reads in TB/s)."""
    text = ("gpu", "torch", "triton", "date", "tool", "model", "gemm", "kernel")
    with open(path or DATA / "h100_fp8_rescaled_profile.csv") as f:
        return {(r["model"], r["kernel"]): {k: (v if k in text else float(v)) for k, v in r.items()}
                for r in csv.DictReader(f)}


#: The Gluon epilogues' store layouts measured on an H100 (``measurements/scripts/store_layout_table.py``).
STORE_LAYOUT = DATA / "h100_fp8_store_layout.csv"
STORE_LAYOUT_FIELDS = ("gpu", "driver", "torch", "triton", "date", "protocol", "fp8_tflops", "matmul_tflops",
                       "read_tbps", "model", "M", "gemm", "impl", "store", "ms", "fraction_of_rate", "floor_ms",
                       "fraction_of_floor", "rel_error", "source")


def load_store_layout(path: Path | None = None) -> list[dict]:
    """The rows of :data:`STORE_LAYOUT` (or ``path``): ``store`` is "mma" (the MMA's register layout,
    4 bytes of a row a thread), "rows" (16 bytes, ``gluon_kernel.store_layout``), "none" (the tile
    never written: what the stores cost at most) or "" for the anchors beside them (``cutlass-fp8``:
    CUTLASS's rowwise FP8 grouped GEMM; ``sorted``: Part 4's bf16 GEMM or layer)."""
    return _load(path or STORE_LAYOUT, ("ms", "fraction_of_rate", "fp8_tflops"))


def store_layout_gains(rows: list[dict]) -> list[dict]:
    """Per model, M and gemm ("first": Part 7's Gluon GEMM alone; "layer": the FP8 layer), in ms: the
    time with each store (``mma``, ``rows``, ``none``; None where not measured), the anchors
    (``cutlass``: CUTLASS's FP8 grouped GEMM, first GEMM only; ``bf16``: Part 4's layer, layer only),
    ``gain`` = mma / rows, and for the first GEMM the fraction of the FP8 rate with each store
    (``rate_mma``, ``rate_rows``, ``rate_cutlass``). Within a case every time comes from one GPU
    session; the runs of each store are separate processes, and the anchors are those of the run with
    the row-wise store where it timed them."""
    out = []
    for model, M, gemm in dict.fromkeys((r["model"], r["M"], r["gemm"]) for r in rows):
        case = [r for r in rows if (r["model"], r["M"], r["gemm"]) == (model, M, gemm)]
        ours = "fp8-gemm" if gemm == "first" else "fp8"
        by_store = {r["store"]: r for r in case if r["impl"] == ours}
        # the anchors of the run that timed the row-wise store where there is one (the same process)
        near = by_store["rows"]["source"] if "rows" in by_store else None
        anchor = {r["impl"]: r for r in sorted(case, key=lambda r: r["source"] == near) if r["store"] == ""}
        t = {k: by_store[k]["ms"] if k in by_store else None for k in ("mma", "rows", "none")}
        g = dict(model=model, M=M, gemm=gemm, **t, gain=t["mma"] / t["rows"] if t["mma"] and t["rows"] else None,
                 cutlass=anchor["cutlass-fp8"]["ms"] if "cutlass-fp8" in anchor else None,
                 bf16=anchor["sorted"]["ms"] if gemm == "layer" and "sorted" in anchor else None)
        if gemm == "first":
            g.update({f"rate_{k}": by_store[k]["fraction_of_rate"] if k in by_store else None for k in ("mma", "rows")},
                     rate_cutlass=anchor["cutlass-fp8"]["fraction_of_rate"] if "cutlass-fp8" in anchor else None)
        out.append(g)
    return out


TMA_STORE = DATA / "h100_fp8_tma_store.csv"
TMA_STORE_FIELDS = ("gpu", "driver", "torch", "triton", "date", "protocol", "fp8_tflops", "matmul_tflops",
                    "read_tbps", "model", "M", "E", "topk", "impl", "up", "down", "ms", "ms_forward", "ms_reverse",
                    "noise", "bf16_over", "rel_error", "same_bits", "source")
#: :data:`TMA_STORE`'s forms: the FP8 layer with its tiles stored by the warps (``gl.store``), each
#: GEMM's copied out through TMA alone, both; Part 4's bf16 layer (``sorted``, the ratio's denominator).
TMA_FORMS = {"fp8": "store", "fp8-tma-up": "up", "fp8-tma-down": "down", "fp8-tma": "tma", "sorted": "bf16"}


def gathered_runs(paths: list[Path], forms) -> list[dict]:
    """The rows of layer-timing runs (each of ``paths`` one process's CSV, as ``tma_store_layer.py`` and
    ``yield_layer.py`` write them) whose form (``impl``) is one of ``forms`` and that ran, each with
    its ``source``: the log folder's call and the run's folder (two runs of one case show the spread)."""
    out = []
    for path in map(Path, paths):
        with open(path, newline="") as f:
            run = [r for r in csv.DictReader(f) if r["impl"] in forms and r["status"] == "ok"]
        source = "/".join(path.parts[-4:-1]) if len(path.parts) >= 4 else path.parent.name
        out += [{**r, "source": source} for r in run]
    return out


def runs_beside(rows: list[dict], model: str, M: int, base: str, other: str) -> list[tuple[dict, dict, dict]]:
    """Each run (``source``) of ``model`` at ``M`` in which the forms ``base`` and ``other`` and Part 4's
    bf16 layer (``sorted``) all ran: ``(base row, other row, bf16 row)``, in the rows' order."""
    out = []
    for source in dict.fromkeys(r["source"] for r in rows if (r["model"], r["M"]) == (model, M)):
        case = {r["impl"]: r for r in rows if (r["model"], r["M"], r["source"]) == (model, M, source)}
        if {base, other, "sorted"} <= set(case):
            out.append((case[base], case[other], case["sorted"]))
    return out


def compared(runs: list[tuple[dict, dict, dict]], base: str, other: str) -> dict:
    """Two forms over :func:`runs_beside`'s runs (one process each), named ``base`` and ``other``:
    ``runs``, the median times (``base``, ``other``, ``bf16``), ``gain`` the median of the runs'
    base / other (``gain_lo``, ``gain_hi`` the smallest and largest), ``over_<base>`` and
    ``over_<other>`` the medians of the bf16 layer over each, ``spread`` the largest two-orders
    difference of the two forms."""
    gains = [b["ms"] / o["ms"] for b, o, _ in runs]
    return {"runs": len(runs), base: median(b["ms"] for b, _, _ in runs), other: median(o["ms"] for _, o, _ in runs),
            "bf16": median(f["ms"] for _, _, f in runs), "gain": median(gains), "gain_lo": min(gains),
            "gain_hi": max(gains), f"over_{base}": median(f["ms"] / b["ms"] for b, _, f in runs),
            f"over_{other}": median(f["ms"] / o["ms"] for _, o, f in runs),
            "spread": max(max(b["noise"], o["noise"]) for b, o, _ in runs)}


def runs_text(g: dict, digits: int = 2) -> str:
    """A :func:`compared` case's runs as the notebook's lines print them: the range of the gain over
    the runs, or ``1 run``."""
    if g["runs"] == 1:
        return "1 run"
    return f"{g['gain_lo']:.{digits}f}x to {g['gain_hi']:.{digits}f}x in {g['runs']} runs"


def load_tma_store(path: Path | None = None) -> list[dict]:
    """The rows of :data:`TMA_STORE` (or ``path``): one per form, model, M and run (``source``), as
    ``measurements/scripts/tma_store_layer.py`` timed them (cold-l2, the faster of two orders;
    ``noise`` the two orders' difference over the faster)."""
    return _load(path or TMA_STORE, ("ms", "ms_forward", "ms_reverse", "noise", "bf16_over"))


def tma_store_runs(rows: list[dict]) -> list[dict]:
    """Per model, M and run (``source``): the layer's time in ms for each form of :data:`TMA_FORMS`
    (``store``, ``up``, ``down``, ``tma``, ``bf16``; None where the form did not run), ``rows`` an expert's
    average rows (``M * topk / E``: from 256 the layer's tiles are 128 rows, under it 64), ``spread``
    the larger two-orders difference of the two forms compared (``fp8`` and ``fp8-tma``), and
    ``same_bits`` (every TMA form gave the bits of the ``gl.store`` one)."""
    out = []
    for model, M, source in dict.fromkeys((r["model"], r["M"], r["source"]) for r in rows):
        case = {r["impl"]: r for r in rows if (r["model"], r["M"], r["source"]) == (model, M, source)}
        t = {key: case[impl]["ms"] if impl in case else None for impl, key in TMA_FORMS.items()}
        if t["store"] is None or t["tma"] is None:
            continue
        E, topk = int(case["fp8"]["E"]), int(case["fp8"]["topk"])
        out.append(dict(model=model, M=M, source=source, rows=M * topk // E, **t,
                        spread=max(case[i]["noise"] for i in ("fp8", "fp8-tma")),
                        same_bits=all(case[i]["same_bits"] == "True" for i in case if i.startswith("fp8-"))))
    return out


def tma_store_gains(rows: list[dict]) -> list[dict]:
    """Per model and M, over its runs (:func:`tma_store_runs`; each run is one process, and a case may
    have several): ``runs``, the median times (``store``, ``tma``, ``bf16``), ``gain`` the median of the
    runs' store / tma (``gain_lo``, ``gain_hi`` the smallest and largest), ``up`` and ``down`` the
    medians of store / each GEMM's copies alone, ``over_store`` and ``over_tma`` the medians of the
    bf16 layer over each FP8 one, ``spread`` the largest of the runs' and ``same_bits`` all of theirs."""
    runs = tma_store_runs(rows)
    out = []
    for model, M in dict.fromkeys((r["model"], r["M"]) for r in runs):
        case = [r for r in runs if (r["model"], r["M"]) == (model, M)]
        gains = [r["store"] / r["tma"] for r in case]
        out.append(dict(model=model, M=M, rows=case[0]["rows"], runs=len(case),
                        **{k: median(r[k] for r in case) for k in ("store", "tma", "bf16")},
                        gain=median(gains), gain_lo=min(gains), gain_hi=max(gains),
                        up=median(r["store"] / r["up"] for r in case),
                        down=median(r["store"] / r["down"] for r in case),
                        over_store=median(r["bf16"] / r["store"] for r in case),
                        over_tma=median(r["bf16"] / r["tma"] for r in case),
                        spread=max(r["spread"] for r in case), same_bits=all(r["same_bits"] for r in case)))
    models = list(dict.fromkeys(g["model"] for g in out))
    return sorted(out, key=lambda g: (models.index(g["model"]), g["M"]))


def tma_store_lines(gains: list[dict]) -> list[str]:
    """:func:`tma_store_gains` as notebook 07 prints them, one line a case: an expert's rows, the layer
    stored by the warps and copied out (medians), the gain (its range over the runs), each GEMM's
    copies alone, the bf16 layer over the FP8 one before and after, the spread of two orders."""
    return [f"  {g['model']:14s} M = {g['M']:<6d}{g['rows']:5d} rows  {g['store']:6.3f} -> {g['tma']:6.3f} ms "
            f"{g['gain']:.2f}x ({runs_text(g)}; gate/up alone {g['up']:.2f}x, down alone {g['down']:.2f}x)  "
            f"bf16 / FP8 {g['over_store']:.2f}x -> {g['over_tma']:.2f}x  spread {g['spread']:.0%}"
            for g in gains]


YIELD = DATA / "h100_fp8_yield.csv"
YIELD_FIELDS = ("gpu", "driver", "torch", "triton", "date", "protocol", "fp8_tflops", "matmul_tflops", "model", "M",
                "impl", "changed", "ms", "ms_forward", "ms_reverse", "noise", "bf16_over", "rel_error", "same_bits",
                "source")
#: :data:`YIELD`'s forms: the FP8 layer as dispatched, its rescaled forms' multiply runs edited in each
#: pattern of ``kernels/yield_edit.py`` (``fp8-yield``: DeepGEMM's, ``reuse-alternate``), Part 4's bf16 layer.
YIELD_FORMS = {"fp8": "plain", "fp8-yield": "reuse-alternate", "fp8-yield-alternate": "alternate",
               "fp8-yield-all": "all", "sorted": "bf16"}


def load_yield(path: Path | None = None) -> list[dict]:
    """The rows of :data:`YIELD` (or ``path``): one per form, model, M and run (``source``), as
    ``measurements/scripts/yield_layer.py`` timed them (cold-l2, the faster of two orders)."""
    return _load(path or YIELD, ("ms", "ms_forward", "ms_reverse", "noise", "bf16_over"))


def yield_gains(rows: list[dict]) -> list[dict]:
    """Per model, M and pattern, over the runs (processes) that timed it beside the unedited layer:
    :func:`compared`'s figures, the unedited layer named ``plain`` and the edited one ``edited``,
    ``same_bits`` all of the runs', and ``apart``: the runs in which both orders' timings of the
    edited layer were under both of the unedited one."""
    out = []
    for model, M, impl in dict.fromkeys((r["model"], r["M"], r["impl"]) for r in rows if r["impl"].startswith("fp8-")):
        runs = runs_beside(rows, model, M, "fp8", impl)    # a run whose baseline did not run compares nothing
        if not runs:
            continue
        out.append(dict(model=model, M=M, pattern=YIELD_FORMS[impl], **compared(runs, "plain", "edited"),
                        apart=sum(max(e["ms_forward"], e["ms_reverse"]) < min(p["ms_forward"], p["ms_reverse"])
                                  for p, e, _ in runs),
                        same_bits=all(e["same_bits"] == "True" for _, e, _ in runs)))
    patterns = list(YIELD_FORMS.values())
    return sorted(out, key=lambda g: (g["model"], g["M"], patterns.index(g["pattern"])))


def yield_lines(gains: list[dict]) -> list[str]:
    """:func:`yield_gains` as notebook 07 prints them, one line a case and pattern."""
    return [f"  {g['model']:14s} M = {g['M']:<6d}{g['pattern']:16s}{g['plain']:7.3f} -> {g['edited']:7.3f} ms "
            f"{g['gain']:.3f}x ({runs_text(g, 3)})  bf16 / FP8 {g['over_plain']:.2f}x -> {g['over_edited']:.2f}x  "
            f"spread {g['spread']:.1%}  {'same bits' if g['same_bits'] else 'NOT the same bits'}" for g in gains]


GATHER = DATA / "h100_fp8_gather.csv"
GATHER_FIELDS = ("gpu", "driver", "torch", "triton", "date", "protocol", "fp8_tflops", "matmul_tflops", "model", "M",
                 "rows", "impl", "up", "down", "ms", "ms_forward", "ms_reverse", "noise", "bf16_over", "rel_error",
                 "same_bits", "source")
#: :data:`GATHER`'s forms: the FP8 layer with the gate/up GEMM reading a sorted copy of x through TMA,
#: reading x's rows by index with four load warps or one, and Part 4's bf16 layer.
GATHER_FORMS = {"fp8": "sorted copy", "fp8-gather": "4 load warps", "fp8-gather-1w": "1 load warp", "sorted": "bf16"}


def config_of(text: str) -> KernelConfig:
    """The :class:`~moe_tutorial.kernels.configs.KernelConfig` whose ``repr`` is ``text`` (as the layer
    scripts write a case's configurations into its rows)."""
    fields = dict(re.findall(r"(\w+)=(\w+)", text))
    return KernelConfig(**{k: ast.literal_eval(v) for k, v in fields.items()})


def load_gather(path: Path | None = None) -> list[dict]:
    """The rows of :data:`GATHER` (or ``path``): one per form, model, M and run (``source``), as
    ``measurements/scripts/gather_layer.py`` timed them (cold-l2, the faster of two orders)."""
    return _load(path or GATHER, ("rows", "ms", "ms_forward", "ms_reverse", "noise", "bf16_over"))


def gather_gains(rows: list[dict]) -> list[dict]:
    """Per model, M and gathering form, where the gate/up GEMM took its rescaled split form (the only
    one that can read A by index; elsewhere every form ran the same launches): ``inter`` (an expert's
    intermediate size I), ``warps`` (``GATHER_FORMS``' name), :func:`compared`'s figures with the
    sorted copy named ``copy`` and reading by index ``index`` (``gain``: copy time / index time), and
    ``same_bits`` all of the runs'."""
    out = []
    for model, M, impl in dict.fromkeys((r["model"], r["M"], r["impl"]) for r in rows
                                        if r["impl"].startswith("fp8-") and split_form(config_of(r["up"]))):
        runs = runs_beside(rows, model, M, "fp8", impl)
        out.append(dict(model=model, M=M, inter=get_shape(model).intermediate, warps=GATHER_FORMS[impl],
                        **compared(runs, "copy", "index"),
                        same_bits=all(g["same_bits"] == "True" for _, g, _ in runs)))
    forms = list(GATHER_FORMS.values())
    return sorted(out, key=lambda g: (g["inter"], g["model"], g["M"], forms.index(g["warps"])))


def gather_lines(gains: list[dict]) -> list[str]:
    """:func:`gather_gains` as notebook 07 prints them, one line a case and form."""
    return [f"  {g['model']:14s} I = {g['inter']:<5d} M = {g['M']:<6d}{g['warps']:13s}{g['copy']:7.3f} -> "
            f"{g['index']:7.3f} ms  {g['gain']:.2f}x ({runs_text(g)})  bf16 / FP8 {g['over_copy']:.2f}x -> "
            f"{g['over_index']:.2f}x  {'same bits' if g['same_bits'] else 'NOT the same bits'}" for g in gains]


TILE_HEIGHT = DATA / "h100_fp8_tile_height.csv"
TILE_HEIGHT_FIELDS = ("gpu", "driver", "torch", "triton", "date", "protocol", "fp8_tflops", "matmul_tflops", "model",
                      "M", "rows", "impl", "up", "down", "ms", "ms_forward", "ms_reverse", "noise", "bf16_over",
                      "rel_error", "source")
#: :data:`TILE_HEIGHT`'s forms: the FP8 layer as dispatched, on the fused 64-row pair, on the 128-row
#: rescaled pair (split, copied out through TMA), and Part 4's bf16 layer.
TILE_HEIGHT_FORMS = {"fp8": "dispatched", "fp8-64": "64 rows", "fp8-128": "128 rows", "sorted": "bf16"}


def load_tile_height(path: Path | None = None) -> list[dict]:
    """The rows of :data:`TILE_HEIGHT` (or ``path``): one per form, model, M and run (``source``),
    cold-l2, the faster of two orders; ``rows`` an expert's average rows (``M * topk / E``)."""
    return _load(path or TILE_HEIGHT, ("rows", "ms", "ms_forward", "ms_reverse", "noise", "bf16_over"))


def row_tiles(ids, num_experts: int, block_m: int) -> int:
    """Row tiles of ``block_m`` rows that routing ``ids`` (``[M, topk]`` expert ids) makes: each
    expert's rows padded up to whole tiles, as the alignment pads them."""
    counts = torch.bincount(ids.flatten().long(), minlength=num_experts)
    return int(((counts + block_m - 1) // block_m).sum())


def tile_height_gains(rows: list[dict]) -> list[dict]:
    """Per model and M where the fused 64-row pair and the 128-row rescaled pair ran side by side:
    ``rows`` and :func:`compared`'s figures, the 64-row layer named ``short`` and the 128-row one
    ``tall`` (``gain``: 64-row time / 128-row time, over the runs)."""
    out = []
    for model, M in dict.fromkeys((r["model"], r["M"]) for r in rows):
        if runs := runs_beside(rows, model, M, "fp8-64", "fp8-128"):
            out.append(dict(model=model, M=M, rows=runs[0][0]["rows"], **compared(runs, "short", "tall")))
    return sorted(out, key=lambda g: (g["model"], g["M"]))


def store_cost(rows: int, cols: int, size: int, bytes_a_thread: int, rows_a_store: int,
               warps: int = 4) -> tuple[int, int, int]:
    """What storing a ``[rows, cols]`` tile of ``size``-byte elements costs each of ``warps`` warps when a
    thread holds ``bytes_a_thread`` consecutive bytes of a row and one store of a warp spans
    ``rows_a_store`` rows: ``(store instructions, consecutive bytes each row receives from one,
    32-byte sectors written)``. The MMA's layout: 4 bytes of bf16 a thread, 8 rows a store."""
    stores = rows * cols * size // warps // (32 * bytes_a_thread)
    piece = 32 * bytes_a_thread // rows_a_store
    return stores, piece, stores * rows_a_store * -(-piece // 32)


def store_layout_lines(gains: list[dict]) -> list[str]:
    """:func:`store_layout_gains` as notebook 07 prints them: per first GEMM the time with the MMA-layout
    stores and with whole rows (the fraction of the FP8 rate beside each), with no stores at all, and
    CUTLASS's; per layer the two stores and the bf16 layer over the FP8 one after."""
    def ms(v):
        return f"{v:6.3f}" if v else "     -"
    lines = []
    for g in gains:
        head = f"  {g['model']:14s} M = {g['M']:<6d} {g['gemm']:6s}"
        if g["gemm"] == "first" and g["mma"] and g["rows"]:
            lines.append(f"{head}{ms(g['mma'])} ({g['rate_mma']:.2f}) -> {ms(g['rows'])} ({g['rate_rows']:.2f})   "
                         f"no stores {ms(g['none'])}   CUTLASS {ms(g['cutlass'])} ({g['rate_cutlass']:.2f})")
        elif g["gemm"] == "layer" and g["mma"] and g["rows"]:
            lines.append(f"{head}{ms(g['mma'])} -> {ms(g['rows'])}          bf16 / FP8 {g['bf16'] / g['mma']:.2f}x "
                         f"-> {g['bf16'] / g['rows']:.2f}x")
    return lines


def promoted_and_rescaled(products: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two ways the Gluon kernel can turn each K step's raw product into the tile's sum, step by
    step in fp32 as its registers hold them (what notebook 07's Appendix A works by hand).

    Args:
        products: ``[steps, rows]`` fp32, each step's raw e4m3 product (128 products summed by the
            tensor cores, no scale applied).
        scales: ``[steps, rows]`` fp32, each step's scale: the row's activation scale times the
            weight block's.

    Returns:
        ``(promoted, rescaled)``, ``[rows]`` fp32 each. *Promoted*: ``acc += product * scale`` every
        step, which needs the raw product in registers of its own beside ``acc``. *Rescaled in
        place*: ``acc`` is kept in units of the last step's scale, so the next product is added as
        it comes (the tensor cores can add it themselves): before step k ``acc *= unit / scale_k``,
        and one ``acc * unit`` at the end. A step whose scale is 0 keeps the unit (a block of zeros
        adds nothing); a NaN scale gives NaN, as promotion does. :func:`rescale_by` in
        ``kernels/gluon_fp8_kernel.py`` is the kernel's line.
    """
    products, scales = products.float(), scales.float()
    promoted = torch.zeros_like(products[0])
    for p, s in zip(products, scales):
        promoted = promoted + p * s
    acc, unit = products[0].clone(), scales[0].clone()
    for p, s in zip(products[1:], scales[1:]):
        zero = s == 0
        acc = acc * torch.where(zero, torch.ones_like(s), unit / s) + p
        unit = torch.where(zero, unit, s)
    return promoted, acc * unit


#: The first GEMM beside vLLM 0.34.0's block-FP8 Triton kernel on an H100, each with the tiles it ships
#: for that GPU (``measurements/scripts/vllm_fp8_anchor.py``; cold-l2, the faster of two orders).
VLLM_ANCHOR = DATA / "h100_vllm_fp8_anchor.csv"


def vllm_margins(path: Path | None = None) -> dict[str, dict[int, float]]:
    """``{model: {M: vLLM's time / the package's}}`` from :data:`VLLM_ANCHOR` (above 1: ours faster)."""
    out: dict[str, dict[int, float]] = {}
    for r in _load(path or VLLM_ANCHOR, ("vllm_over_ours",)):
        if r["impl"] == "fp8":
            out.setdefault(r["model"], {})[r["M"]] = r["vllm_over_ours"]
    return out


def vllm_summary(path: Path | None = None) -> dict:
    """What the prose says of :func:`vllm_margins`: ``geomeans`` ``{model: geometric mean over M}``,
    ``worst`` ``(margin, model, M)``, the least margin of all, ``worst_spread`` the timing spread of
    that case (the larger of the two kernels' gaps between one order's time and the reverse's, over
    the least), ``at_16384`` ``{model: margin}``, and ``sizes``, the M measured."""
    from ..perf.traffic import geomean

    margins = vllm_margins(path)
    worst = min((r, m, M) for m, by_m in margins.items() for M, r in by_m.items())
    rows = _load(path or VLLM_ANCHOR, ("ms", "ms_forward", "ms_reverse"))
    spread = max(abs(r["ms_forward"] - r["ms_reverse"]) / r["ms"] for r in rows if (r["model"], r["M"]) == worst[1:])
    return {"geomeans": {m: geomean(by_m.values()) for m, by_m in margins.items()},
            "worst": worst, "worst_spread": spread,
            "at_16384": {m: by_m[16384] for m, by_m in margins.items()},
            "sizes": sorted({M for by_m in margins.values() for M in by_m})}


def vllm_ceiling(path: Path | None = None, up_to: int = 1024) -> dict:
    """How far ahead of vLLM any kernel could be where both wait on the weights (M <= ``up_to``).

    A GEMM cannot beat its floor (``floor_ms``: the slower of reading its bytes at the measured HBM
    rate and its multiplies at the measured FP8 rate, from the same run as :data:`VLLM_ANCHOR`). So
    vLLM's time over the floor bounds the margin of a kernel that reached the floor exactly.

    Returns:
        ``reached`` ``{model: {M: floor / vLLM's time}}`` (the share of the floor vLLM's kernel
        reaches) for M <= ``up_to``; ``ceiling`` ``{model: geometric mean over every M of the margin
        if ours ran at the floor up to ``up_to`` and as measured above it}``.
    """
    from ..perf.traffic import geomean

    reached: dict[str, dict[int, float]] = {}
    for r in _load(path or VLLM_ANCHOR, ("ms", "floor_ms")):
        if r["impl"] == "vllm-fp8" and r["M"] <= up_to:
            reached.setdefault(r["model"], {})[r["M"]] = r["floor_ms"] / r["ms"]
    bound = {m: {M: 1 / reached[m][M] if M <= up_to else margin for M, margin in by_m.items()}
             for m, by_m in vllm_margins(path).items()}
    return {"reached": reached, "ceiling": {m: geomean(by_m.values()) for m, by_m in bound.items()}}
