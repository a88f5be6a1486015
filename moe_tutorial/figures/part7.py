"""Figures of notebook 07 (Part 7, block-scaled FP8): the e4m3 number line, what an outlier does to
one scale, and the H200 results of the FP8 kernel against Part 4's bf16 kernel."""
from __future__ import annotations

import difflib

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.lines import Line2D

from ..perf.report import is_ok
from ..perf.results import select
from ..quant import dequantize_weight, quantize_weight
from ..reference import rel_error
from .style import impl_style, m_axis


def e4m3_values() -> torch.Tensor:
    """Every finite, non-negative e4m3 value, ascending (float32)."""
    vals = torch.arange(128, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    return vals[torch.isfinite(vals)].unique()


def plot_e4m3_line(*, around: float | None = None):
    """The positive e4m3 values on a log axis: equally spaced in each power of two (8 per octave),
    subnormals below 2^-6; with ``around``, the two neighbours of that number marked."""
    vals = e4m3_values()[1:].numpy()
    fig, ax = plt.subplots(figsize=(9, 1.9))
    ax.vlines(vals, 0, 1, color=np.where(vals < 2 ** -6, "#bab0ac", "#4e79a7"), lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yticks([])
    ax.set_xlabel("positive e4m3 values (grey: subnormals below 2^-6; largest 448)")
    if around is not None:
        lo, hi = vals[vals <= around].max(), vals[vals >= around].min()
        ax.vlines([around], 0, 1.25, color="#e15759", lw=1.5)
        ax.annotate(f"{around:g} lies between {lo:g} and {hi:g}", (around, 1.25), xytext=(6, -4),
                    textcoords="offset points", color="#e15759")
    ax.set_ylim(0, 1.6)
    fig.tight_layout()
    return fig


def outlier_errors(outliers, *, seed: int = 0, size: int = 256) -> list[tuple[float, float, float]]:
    """``(outlier, block error, per-tensor error)``: the relative error of a ``size x size`` randn
    weight with one outlier at ``[0, 0]``, measured on the three 128 x 128 blocks without it, under
    128 x 128 block scales and under one scale for the whole tensor."""
    out = []
    for o in outliers:
        w = torch.randn(size, size, generator=torch.Generator().manual_seed(seed))
        w[0, 0] = o
        rest = torch.ones_like(w, dtype=torch.bool)
        rest[:128, :128] = False
        blocked = dequantize_weight(*quantize_weight(w))
        one = (w.abs().max() / 448).double()
        per_tensor = (w.double() / one).clamp(-448, 448).to(torch.float8_e4m3fn).double() * one
        ref = w.double()[rest]
        out.append((float(o), rel_error(blocked[rest], ref), rel_error(per_tensor[rest], ref)))
    return out


def plot_outlier_errors(errors):
    """:func:`outlier_errors` as two lines against the outlier's size."""
    o, blocked, per_tensor = (np.array(c) for c in zip(*errors))
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.loglog(o, per_tensor, "o-", color="#e15759", label="one scale for the tensor")
    ax.loglog(o, blocked, "s-", color="#4e79a7", label="one scale per 128 x 128 block")
    ax.set_xlabel("size of the one outlier (the other weights: randn)")
    ax.set_ylabel("relative error of the\nother blocks")
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig


def kernel_diff(old: str, new: str, old_name: str, new_name: str) -> str:
    """A unified diff of two kernels' source (or sections of it), ready to print."""
    lines = difflib.unified_diff(old.splitlines(), new.splitlines(), old_name, new_name, lineterm="", n=1)
    return "\n".join(lines)


def speedups(rows: list[dict], model: str, gemm: str, faster: str = "fp8", slower: str = "sorted"):
    """``(M, time of slower / time of faster)`` of one model and gemm, over the batch sizes both ran."""
    a = {r["M"]: r["ms"] for r in select(rows, model=model, gemm=gemm, impl=slower, status="ok")}
    b = {r["M"]: r["ms"] for r in select(rows, model=model, gemm=gemm, impl=faster, status="ok")}
    ms = sorted(set(a) & set(b))
    return np.array(ms), np.array([a[m] / b[m] for m in ms])


def plot_fp8_results(rows: list[dict], models, *, impl: str = "fp8", targets: dict | None = None):
    """Two panels: FP8 (``impl``'s rows) over bf16 speed (first GEMM solid, layer dashed) and the
    FP8 first GEMM's fraction of the FP8 floor, against M, one colour per model; one legend under
    both panels. ``targets``: optional ``{label: fraction}`` lines on the second panel."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.4))
    colors = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#9c755f"]
    sizes = sorted({r["M"] for r in rows})
    for model, c in zip(models, colors):
        for gemm, ls in (("first", "-"), ("layer", "--")):
            m, s = speedups(rows, model, gemm, faster=impl)
            a1.plot(m, s, ls, marker="o", ms=3, color=c)
        f = sorted((r["M"], r["fraction_of_floor"]) for r in select(rows, model=model, gemm="first", impl=impl))
        a2.plot(*zip(*f), "o-", ms=3, color=c)
    a1.axhline(1.0, color="#999999", lw=0.8)
    a1.set_ylabel("bf16 time / FP8 time")
    a1.set_title("FP8 against Part 4's bf16 kernel (H200, cold-l2)")
    a2.axhline(1.0, color="#999999", lw=0.8)
    a2.set_ylabel("FP8 floor / time")
    a2.set_title("FP8 gate/up GEMM: fraction of its floor")
    for t, y in (targets or {}).items():
        a2.axhline(y, color="#e15759", lw=0.8, ls=":")
        a2.annotate(t, (sizes[0], y), xytext=(2, 2), textcoords="offset points", color="#e15759", fontsize=8)
    for ax in (a1, a2):
        m_axis(ax, sizes)
    handles = [Line2D([], [], color=c, marker="o", ms=3, label=model) for model, c in zip(models, colors)]
    handles += [Line2D([], [], color="#555555", ls="-", label="gate/up GEMM"),
                Line2D([], [], color="#555555", ls="--", label="whole layer (left)")]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False, fontsize=8)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    return fig


#: The FP8 steps' colours and markers: one hue each, far apart, so the lines never read as one.
STEP_STYLES = {"fp8-step0": ("#4e79a7", "o"), "fp8+swap": ("#f28e2b", "s"), "fp8+tma": ("#59a14f", "^")}


def plot_fp8_steps(rows: list[dict], model: str, steps, *, tuned: str = "fp8-tl", band: float | None = None):
    """Each FP8 step's time over the tuned kernel's (``tuned``'s rows), against M, for one model,
    where the step timed correctly; ``band`` (percent), when given, shades how far apart two
    timings of one kernel fell (the noise)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    best = {r["M"]: r["ms"] for r in select(rows, model=model, gemm="first", impl=tuned) if is_ok(r)}
    if band:
        ax.axhspan(1 - band / 100, 1 + band / 100, color="#dddddd", zorder=0,
                   label=f"noise: two timings of one kernel, up to {band:.1f}% apart")
    for step in steps:
        pts = sorted((r["M"], r["ms"] / best[r["M"]]) for r in select(rows, model=model, gemm="first", impl=step)
                     if r["M"] in best and is_ok(r) and r.get("ms"))
        color, marker = STEP_STYLES.get(step, ("#333333", "o"))
        if pts:
            ax.plot(*zip(*pts), marker=marker, ms=4, color=color, lw=1.4, label=impl_style(step).get("label", step))
    ax.axhline(1.0, color="#999999", lw=0.8)
    ax.set_ylabel("time / tuned FP8 kernel's")
    ax.set_title(f"{model}: what each step of Part 7 buys (H200, cold-l2)")
    m_axis(ax, sorted(best))
    ax.legend(frameon=False, fontsize=8)
    fig.tight_layout()
    return fig


def plot_promotion_schedule(steps: int = 5, mma: float = 1.0, promote: float = 0.45):
    """The K loop on a timeline, ``tl`` kernel against the Gluon kernel: the tensor cores' MMAs
    (one per 128-wide K step, ``mma`` long) and the CUDA cores' promotions (``promote`` long) of each
    step's product into the fp32 accumulator. Returns the figure and the two loops' lengths."""
    fig, axes = plt.subplots(2, 1, figsize=(9, 2.9), sharex=True)
    mma_c, pro_c = "#4e79a7", "#f28e2b"
    serial = steps * (mma + promote)
    overlapped = steps * mma + promote
    for ax, title, overlap in ((axes[0], "tl: each step's product promoted before the next MMA starts", False),
                               (axes[1], "Gluon: step k+1's MMA in flight while step k is promoted", True)):
        for k in range(steps):
            start = k * mma if overlap else k * (mma + promote)
            ax.barh(1, mma, left=start, color=mma_c, edgecolor="white")
            ax.text(start + mma / 2, 1, f"MMA {k}", ha="center", va="center", color="white", fontsize=8)
            ax.barh(0, promote, left=start + mma, color=pro_c, edgecolor="white")
            ax.text(start + mma + promote / 2, 0, f"p{k}", ha="center", va="center", fontsize=7)
        ax.set_yticks([0, 1], ["CUDA cores", "tensor cores"])
        ax.set_title(title, fontsize=9, loc="left")
        ax.axvline(overlapped if overlap else serial, color="#555555", lw=0.8, ls=":")
    axes[1].set_xlabel(f"time (one MMA = {mma:g}, one promotion = {promote:g}): "
                       f"{serial:.2f} against {overlapped:.2f} for {steps} steps")
    fig.tight_layout()
    return fig, serial, overlapped


#: The three FP8 models' colours in the tile-height figure.
TILE_HEIGHT_COLORS = {"Qwen3-30B-A3B": "#4e79a7", "DeepSeek-V3": "#e15759", "Kimi-K2": "#59a14f"}


def plot_tile_height(gains: list[dict], threshold: int):
    """``experiments.gluon_fp8.tile_height_gains`` as one line a model: the 64-row layer's time over
    the 128-row one's against an expert's average rows (above 1: the 128-row pair is faster), each
    point the median over its runs and its bar the runs' range; ``threshold`` the rows from which the
    untuned choice takes the 128-row pair."""
    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for model, color in TILE_HEIGHT_COLORS.items():
        pts = sorted((g["rows"], g["gain"], g["gain_lo"], g["gain_hi"]) for g in gains if g["model"] == model)
        if not pts:
            continue
        rows, gain, lo, hi = (np.array(c) for c in zip(*pts))
        ax.errorbar(rows, gain, yerr=[gain - lo, hi - gain], marker="o", ms=4, lw=1.2, capsize=2, color=color,
                    label=model)
    ax.axhline(1.0, color="#999999", lw=0.8)
    ax.axvline(threshold, color="#333333", lw=0.8, ls="--")
    ax.text(threshold + 3, ax.get_ylim()[1], f"128-row pair from {threshold} rows", va="top", fontsize=8)
    ax.set_xlabel("rows an expert (average, M * topk / E)")
    ax.set_ylabel("64-row layer time /\n128-row layer time")
    ax.set_title("The FP8 layer's tile height (H100, cold-l2, the faster of two orders)")
    ax.legend(frameon=False, fontsize=8, loc="lower right")
    fig.tight_layout()
    return fig
