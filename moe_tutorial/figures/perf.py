"""Figures for the performance notebook and the bench: intensity, roofline, time and floor vs M.

Every function takes benchmark rows (dicts with :data:`moe_tutorial.results.FIELDS` keys, as
``results.load_rows`` returns them) or model shapes, and returns the matplotlib Figure.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from .. import traffic
from ..bench_report import batch_sizes, impls, is_ok, models
from ..shapes import ModelShape
from .style import IMPL_COLORS

#: Legend names, in the series' words.
IMPL_LABELS = {
    "loop": "Part 1 loop", "indexing": "Part 2 indexing", "published": "Part 3 as published",
    "naive": "Part 3 fixed", "sorted": "Part 4 sorted", "sorted+align": "Part 4 + align",
    "sorted-heuristic": "Part 4, untuned", "grouped_mm": "torch._grouped_mm",
}
#: Implementations drawn as variations of another one: same colour, a different line.
_VARIANT_OF = {"sorted+align": ("sorted", ":"), "sorted-heuristic": ("sorted", "--")}
#: The H200 ceilings DESIGN.md quotes, used where no measured ones are at hand.
H200_COPY_TBPS, H200_MATMUL_TFLOPS = 4.27, 672.0


def impl_style(impl: str) -> dict:
    """Colour, line style and label of an implementation."""
    base, ls = _VARIANT_OF.get(impl, (impl, "-"))
    return {"color": IMPL_COLORS.get(base, "#555555"), "ls": ls, "label": IMPL_LABELS.get(impl, impl)}


def gemm_title(gemm: str) -> str:
    return "gate/up GEMM" if gemm == "first" else "whole layer"


def intensity(shape: ModelShape, M, gemm: str = "first", itemsize: int = 2) -> np.ndarray:
    """FLOPs per byte of the first GEMM or the layer at batch sizes ``M`` (uniform routing)."""
    M = np.asarray(M, dtype=float)
    E, k, H, inter = shape.num_experts, shape.topk, shape.hidden, shape.intermediate
    touched = traffic.experts_touched(M, E, k)
    if gemm == "first":
        nbytes = traffic.first_gemm_bytes(M, 2 * inter, H, E, k, itemsize, touched=touched)
        flops = traffic.first_gemm_flops(M, 2 * inter, H, k)
    else:
        nbytes = traffic.layer_bytes(M, H, inter, E, k, itemsize, touched=touched)
        flops = traffic.layer_flops(M, H, inter, k)
    return flops / nbytes


def plot_intensity(shapes: list[ModelShape], *, gemm: str = "first", copy_tbps: float = H200_COPY_TBPS,
                   matmul_tflops: float = H200_MATMUL_TFLOPS, max_m: int = 16384):
    """Arithmetic intensity against M for each model, with the ridge point of the roofline.

    Below the ridge (``matmul_tflops / copy_tbps`` FLOP/byte) a GEMM is memory-bound: its
    floor is the time to read the touched experts' weights. Above it, compute-bound.
    """
    Ms = np.unique(np.round(np.logspace(0, np.log2(max_m), 200, base=2)))
    ridge = matmul_tflops / copy_tbps
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for i, shape in enumerate(shapes):
        ai = intensity(shape, Ms, gemm)
        ax.plot(Ms, ai, color=f"C{i}", label=f"{shape.name} (E={shape.num_experts}, topk={shape.topk})")
        above = np.nonzero(ai >= ridge)[0]
        if above.size:
            ax.plot(Ms[above[0]], ai[above[0]], "o", color=f"C{i}", ms=5)
    ax.axhline(ridge, color="black", ls="--", lw=1)
    ax.text(Ms[0], ridge * 1.12, f"ridge: {ridge:.0f} FLOP/byte ({matmul_tflops:.0f} TFLOP/s / {copy_tbps:.2f} TB/s)",
            fontsize=8, va="bottom")
    ax.fill_between(Ms, 0.1, ridge, color="#f28e2b", alpha=0.07, lw=0)
    ax.text(Ms[-1], ridge / 3, "memory-bound", ha="right", fontsize=8, color="#b5651d")
    ax.text(Ms[-1], ridge * 3, "compute-bound", ha="right", fontsize=8, color="#2f6e3a")
    ax.set(yscale="log", ylabel="FLOPs per byte moved", title=f"Arithmetic intensity of the {gemm_title(gemm)}",
           ylim=(0.5, None))
    _m_axis(ax, [m for m in (1, 8, 64, 256, 1024, 4096, 16384) if m <= max_m])
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    return fig


def _ceilings(rows):
    r = next((r for r in rows if r.get("copy_tbps") and r.get("matmul_tflops")), None)
    return (r["copy_tbps"], r["matmul_tflops"]) if r else (H200_COPY_TBPS, H200_MATMUL_TFLOPS)


def plot_roofline(rows: list[dict], model: str, gemm: str = "first", *, ax=None):
    """Each implementation's measured points on the roofline of the GPU that measured them.

    A point sits at its problem's arithmetic intensity (``1000 * tflops / gbps``) and its
    achieved TFLOP/s; the roof is ``min(copy bandwidth * intensity, matmul rate)``. Points are
    joined in order of M, so each implementation is a line climbing from decode to prefill.
    """
    mine = [r for r in rows if r["model"] == model and r["gemm"] == gemm and is_ok(r) and r.get("gbps")]
    if not mine:
        raise ValueError(f"rows: no timed results for model={model!r}, gemm={gemm!r}")
    bw, peak = _ceilings(mine)
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ais = [1e3 * r["tflops"] / r["gbps"] for r in mine]
    x = np.logspace(np.log10(min(ais) / 2), np.log10(max(max(ais) * 2, 2 * peak / bw)), 200)
    ax.plot(x, np.minimum(bw * x, peak), color="black", lw=1.5, label=f"roof: {bw:.2f} TB/s, {peak:.0f} TFLOP/s")
    for impl in impls(mine):
        pts = sorted((r["M"], 1e3 * r["tflops"] / r["gbps"], r["tflops"]) for r in mine if r["impl"] == impl)
        style = impl_style(impl)
        ax.plot([p[1] for p in pts], [p[2] for p in pts], marker="o", ms=3.5, lw=1, **style)
    for M in (min(r["M"] for r in mine), max(r["M"] for r in mine)):
        ai = next(1e3 * r["tflops"] / r["gbps"] for r in mine if r["M"] == M)
        ax.annotate(f"M={M}", (ai, min(bw * ai, peak)), textcoords="offset points", xytext=(0, 6),
                    ha="center", fontsize=7)
    ax.set(xscale="log", yscale="log", xlabel="FLOPs per byte (of the problem's floor traffic)",
           ylabel="achieved TFLOP/s", title=f"{model}, {gemm_title(gemm)}: the roofline")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return fig if fig is not None else ax.figure


def _plot_metric(ax, rows, model, gemm, metric):
    mine = [r for r in rows if r["model"] == model and r["gemm"] == gemm]
    for impl in impls(mine):
        pts = sorted((r["M"], r[metric]) for r in mine if r["impl"] == impl and is_ok(r) and r.get(metric))
        wrong = sorted(r["M"] for r in mine if r["impl"] == impl and r.get("status") == "wrong")
        style = impl_style(impl)
        if pts:
            ax.plot(*zip(*pts), marker="o", ms=3.5, lw=1.4, **style)
        if wrong:   # a wrong answer's speed means nothing: crosses along the bottom edge
            ax.scatter(wrong, [0.04] * len(wrong), marker="x", color=style["color"], s=30, clip_on=False,
                       transform=ax.get_xaxis_transform(), label=f"{style['label']}: wrong result")
    if metric == "ms":
        floor = sorted({(r["M"], r["floor_ms"]) for r in mine if r.get("floor_ms")})
        if floor:
            ax.plot(*zip(*floor), color="black", ls="--", lw=1, label="roofline floor")
        ax.set(yscale="log", ylabel="time (ms)")
    else:
        ax.axhline(1.0, color="black", ls="--", lw=1)
        # Above 1 happens: a read-only stream outruns the copy that sets the bandwidth ceiling.
        top = max([1.0] + [r["fraction_of_floor"] for r in mine if is_ok(r) and r.get("fraction_of_floor")])
        ax.set(ylim=(0, max(1.1, top + 0.05)), ylabel="fraction of the floor")
    _m_axis(ax, batch_sizes(mine))
    ax.set(title=f"{model}, {gemm_title(gemm)}")
    ax.grid(True, which="major", alpha=0.3)


def _m_axis(ax, sizes) -> None:
    """A log2 M axis labelled with the measured batch sizes themselves."""
    ax.set_xscale("log", base=2)
    if sizes:
        ax.set_xticks(sizes, [str(m) for m in sizes])
        ax.minorticks_off()
    ax.set_xlabel("tokens M")


def plot_time(rows: list[dict], model: str, gemm: str = "first", *, ax=None):
    """Time against M for each implementation, with the roofline floor dashed."""
    fig, ax = (plt.subplots(figsize=(6.0, 3.8)) if ax is None else (None, ax))
    _plot_metric(ax, rows, model, gemm, "ms")
    ax.legend(fontsize=7, loc="upper left")
    return fig if fig is not None else ax.figure


def plot_fraction(rows: list[dict], model: str, gemm: str = "first", *, ax=None):
    """Fraction of the roofline floor reached against M (1.0 = as fast as the hardware allows)."""
    fig, ax = (plt.subplots(figsize=(6.0, 3.8)) if ax is None else (None, ax))
    _plot_metric(ax, rows, model, gemm, "fraction_of_floor")
    ax.legend(fontsize=7, loc="upper left")
    return fig if fig is not None else ax.figure


def _shared_legend(fig, axes, ncol: int = 5) -> float:
    """One legend for all panels, below them; returns the figure fraction it takes."""
    handles = {}
    for ax in np.ravel(axes):
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=min(ncol, len(handles)), fontsize=8,
               frameon=False)
    return 0.06 + 0.03 * ((len(handles) - 1) // ncol)


def plot_across_models(rows: list[dict], models: list[str], gemm: str = "first", metric: str = "ms"):
    """One panel per model of ``metric`` ("ms" or "fraction_of_floor") against M, one legend."""
    if metric not in ("ms", "fraction_of_floor"):
        raise ValueError(f"metric: expected 'ms' or 'fraction_of_floor', got {metric!r}")
    fig, axes = plt.subplots(1, len(models), figsize=(5.6 * len(models), 4.4), squeeze=False)
    for ax, model in zip(axes[0], models):
        _plot_metric(ax, rows, model, gemm, metric)
    what = "time" if metric == "ms" else "fraction of the roofline floor"
    fig.suptitle(f"{gemm_title(gemm)}: {what} against M")
    fig.tight_layout(rect=(0, _shared_legend(fig, axes), 1, 1))
    return fig


def plot_model(rows: list[dict], model: str):
    """One model's results: time (top) and fraction of the floor (bottom) for each gemm."""
    gemms = [g for g in ("first", "layer") if any(r["model"] == model and r["gemm"] == g for r in rows)]
    fig, axes = plt.subplots(2, len(gemms), figsize=(6.0 * len(gemms), 7.2), squeeze=False)
    for j, gemm in enumerate(gemms):
        _plot_metric(axes[0][j], rows, model, gemm, "ms")
        _plot_metric(axes[1][j], rows, model, gemm, "fraction_of_floor")
    first = next((r for r in rows if r["model"] == model), {})
    fig.suptitle(f"{model} on {first.get('gpu', '?')} ({first.get('dtype', '')})")
    fig.tight_layout(rect=(0, _shared_legend(fig, axes), 1, 1))
    return fig


def save_bench_figures(rows: list[dict], out_dir) -> list[Path]:
    """Write one PNG per model (``<model>.png``: time and fraction of the floor vs M) to ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for model in models(rows):
        if not any(r["model"] == model and is_ok(r) for r in rows):
            continue
        fig = plot_model(rows, model)
        path = out_dir / f"{model}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


__all__ = ["IMPL_LABELS", "impl_style", "intensity", "plot_intensity", "plot_roofline", "plot_time",
           "plot_fraction", "plot_across_models", "plot_model", "save_bench_figures"]
