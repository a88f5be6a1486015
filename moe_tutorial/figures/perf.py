"""Figures for the performance notebook and the bench: intensity, roofline, time and floor vs M.

Every function takes benchmark rows (dicts with :data:`moe_tutorial.perf.results.FIELDS` keys, as
``results.load_rows`` returns them) or model shapes, and returns the matplotlib Figure.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np

from ..perf import traffic
from ..perf.report import (
    batch_sizes,
    gemm_title,
    impl_order,
    is_ok,
    model_order,
    subset,
)
from ..shapes import BATCH_SIZES, ModelShape
from .style import WRONG_COLOR, impl_style, m_axis


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


def plot_intensity(shapes: list[ModelShape], *, read_tbps: float, matmul_tflops: float, gemm: str = "first",
                   max_m: int = 16384):
    """Arithmetic intensity against M for each model, with the ridge point of the roofline.

    Below the ridge (``matmul_tflops / read_tbps`` FLOP/byte: pass the ceilings of a measured
    run, e.g. :func:`moe_tutorial.perf.report.headline_ceilings`) a GEMM is memory-bound: its
    floor is the time to read the touched experts' weights. Above it, compute-bound.
    """
    Ms = np.unique(np.round(np.logspace(0, np.log2(max_m), 200, base=2)))
    ridge = matmul_tflops / read_tbps
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for i, shape in enumerate(shapes):
        ai = intensity(shape, Ms, gemm)
        ax.plot(Ms, ai, color=f"C{i}", label=f"{shape.name} (E={shape.num_experts}, topk={shape.topk})")
        above = np.nonzero(ai >= ridge)[0]
        if above.size:
            ax.plot(Ms[above[0]], ai[above[0]], "o", color=f"C{i}", ms=5)
    ax.axhline(ridge, color="black", ls="--", lw=1)
    ax.text(Ms[0], ridge * 1.12,
            f"ridge: {ridge:.0f} FLOP/byte ({matmul_tflops:.0f} TFLOP/s / {read_tbps:.2f} TB/s read)",
            fontsize=8, va="bottom")
    ax.fill_between(Ms, 0.1, ridge, color="#f28e2b", alpha=0.07, lw=0)
    ax.text(Ms[-1], ridge / 3, "memory-bound", ha="right", fontsize=8, color="#b5651d")
    ax.text(Ms[-1], ridge * 3, "compute-bound", ha="right", fontsize=8, color="#2f6e3a")
    ax.set(yscale="log", ylabel="FLOPs per byte moved", title=f"Arithmetic intensity of the {gemm_title(gemm)}",
           ylim=(0.5, None))
    m_axis(ax, [m for m in BATCH_SIZES if m <= max_m])
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    return fig


def _ceilings(rows):
    """``(memory roof TB/s, matmul roof TFLOP/s)`` the rows were judged by: the read-only bandwidth
    (the copy bandwidth for runs that predate it)."""
    r = next((r for r in rows if (r.get("read_tbps") or r.get("copy_tbps")) and r.get("matmul_tflops")), None)
    if r is None:
        raise ValueError("rows: expected rows that carry the ceilings of their run (read_tbps, matmul_tflops)")
    return r.get("read_tbps") or r["copy_tbps"], r["matmul_tflops"]


def plot_rooflines(rows: list[dict], models, gemm: str = "first", *, impls=None, ceilings: dict | None = None,
                   protocol: str | None = None, label_impl: str = "sorted"):
    """:func:`plot_roofline` for each of ``models``, side by side, with one legend for all of them
    under the panels; only ``label_impl``'s line names its first and last M."""
    models = list(models)
    fig, axes = plt.subplots(1, len(models), figsize=(5.4 * len(models), 5.0), squeeze=False)
    for ax, model in zip(axes[0], models):
        plot_roofline(rows, model, gemm, ax=ax, impls=impls, ceilings=ceilings, protocol=protocol,
                      legend=False, label_impl=label_impl)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    return fig


def plot_roofline(rows: list[dict], model: str, gemm: str = "first", *, ax=None, impls=None,
                  ceilings: dict | None = None, protocol: str | None = None, legend: bool = True,
                  label_impl: str | None = None):
    """Each implementation's measured points on the roofline of the GPU that measured them.

    A point sits at the arithmetic intensity of the bytes its implementation moves (for the first
    GEMM: Part 2 its copy's round trip too, Part 3 every pair's weights, the others the floor's
    traffic; :func:`implementation_bytes`) and its achieved TFLOP/s, so the parts do not all sit at
    one x; the roof is ``min(read bandwidth * intensity, matmul rate)``, from
    ``ceilings`` (a dict with ``read_tbps`` and ``matmul_tflops``, e.g.
    :func:`moe_tutorial.perf.report.headline_ceilings`) or else the first row's run. Points are
    joined in order of M, so each implementation is a line climbing from decode to prefill.
    ``impls`` and ``protocol`` pick rows as :func:`moe_tutorial.perf.report.subset` does. Each
    line names its last M, or only ``label_impl``'s names its first and last (labels of lines
    that end together would overlap); ``legend=False`` leaves the legend to the caller.
    """
    mine = [r for r in subset(rows, gemm, impls=impls, protocol=protocol)
            if r["model"] == model and is_ok(r) and r.get("gbps")]
    if not mine:
        raise ValueError(f"rows: no timed results for model={model!r}, gemm={gemm!r}")
    bw, peak = _ceilings([ceilings] if ceilings else mine)
    fig = None
    if ax is None:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
    def ai(r):
        flops = 1e12 * r["tflops"] * r["ms"] * 1e-3
        return flops / implementation_bytes(r) if gemm == "first" else 1e3 * r["tflops"] / r["gbps"]

    ais = [ai(r) for r in mine]
    x = np.logspace(np.log10(min(ais) / 2), np.log10(max(max(ais) * 2, 2 * peak / bw)), 200)
    ax.plot(x, np.minimum(bw * x, peak), color="black", lw=1.5, label=f"roof: {bw:.2f} TB/s, {peak:.0f} TFLOP/s")
    for impl in impl_order(mine):
        pts = sorted((r["M"], ai(r), r["tflops"]) for r in mine if r["impl"] == impl)
        style = impl_style(impl)
        ax.plot([p[1] for p in pts], [p[2] for p in pts], marker="o", ms=3.5, lw=1, **style)
        if label_impl is None:
            ax.annotate(f"M={pts[-1][0]}", pts[-1][1:], textcoords="offset points", xytext=(3, -9), fontsize=6,
                        color=style.get("color"))
        elif impl == label_impl:
            for (M, px, py), offset in ((pts[0], (6, -4)), (pts[-1], (-10, -16))):
                ax.annotate(f"M = {M}", (px, py), textcoords="offset points", xytext=offset, fontsize=8,
                            color=style.get("color"))
    ax.set(xscale="log", yscale="log", xlabel="FLOPs per byte the implementation moves",
           ylabel="achieved TFLOP/s", title=f"{model}, {gemm_title(gemm)}: the roofline")
    ax.grid(True, which="major", alpha=0.3)
    if legend:
        # Above the sloped roof at low intensity nothing can be: the legend goes there, off the data.
        ax.legend(fontsize=6, loc="upper left", framealpha=0.9)
    return fig if fig is not None else ax.figure


def implementation_bytes(row: dict) -> float:
    """The HBM bytes a first-GEMM row's implementation moves, by its own traffic model (bf16 sizes
    from the row): Part 2 the per-pair gather plus its copy's round trip, Part 3 (fixed or as
    published) every pair's weights, the others the floor's bytes (each touched expert once)."""
    from ..perf import traffic

    M, N, K, E, topk = (int(row[k]) for k in ("M", "N", "K", "E", "topk"))
    if row["impl"] == "indexing":
        return traffic.indexing_bytes(M, N, K, topk)
    if row["impl"] in ("fused", "published"):
        return traffic.per_pair_bytes(M, N, K, topk)
    return traffic.first_gemm_bytes(M, N, K, E, topk)


def _plot_metric(ax, rows, model: str, metric: str, *, title: str, highlight: str | None = None) -> None:
    """One panel: ``metric`` of each implementation against M for ``model`` (``rows`` of one gemm).

    Timed rows are lines (``highlight`` thicker); rows that failed the correctness check are
    red crosses above the panel, since a wrong answer's speed means nothing; skipped rows
    are left out. "ms" gets the roofline floor dashed, "fraction_of_floor" the line at 1.0.
    """
    mine = [r for r in rows if r["model"] == model]
    for impl in impl_order(mine):
        style = impl_style(impl)
        pts = sorted((r["M"], r[metric]) for r in mine if r["impl"] == impl and is_ok(r) and r.get(metric))
        wrong = sorted(r["M"] for r in mine if r["impl"] == impl and r.get("status") == "wrong")
        if pts:
            ax.plot(*zip(*pts), marker="o", ms=3.5, lw=2.6 if impl == highlight else 1.4, **style)
        if wrong:
            # Above the panel, not inside it: on a time axis a mark low down would read as a fast run.
            ax.scatter(wrong, [1.0] * len(wrong), marker="x", color=WRONG_COLOR, s=30, zorder=5, clip_on=False,
                       transform=ax.get_xaxis_transform(), label=f"{style['label']}: wrong result (no time)")
    if metric == "ms":
        floor = sorted({(r["M"], r["floor_ms"]) for r in mine if r.get("floor_ms")})
        if floor:
            ax.plot(*zip(*floor), color="black", ls="--", lw=1, label="roofline floor")
        ax.set(yscale="log", ylabel="time (ms)")
    else:
        ax.axhline(1.0, color="black", ls="--", lw=1)
        # Above 1 happens where a GEMM reads faster than the run's read-only kernel did.
        top = max([1.0] + [r["fraction_of_floor"] for r in mine if is_ok(r) and r.get("fraction_of_floor")])
        ax.set(ylim=(0, max(1.1, top + 0.05)), ylabel="fraction of the floor")
    m_axis(ax, batch_sizes(mine))
    ax.set_title(title, pad=9)
    ax.grid(True, which="major", alpha=0.3)


def _shared_legend(fig, axes, ncol: int = 5) -> float:
    """One legend for all panels, below them; returns the fraction of the figure's height it takes."""
    handles = {}
    for ax in np.ravel(axes):
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=min(ncol, len(handles)), fontsize=8,
               frameon=False)
    return (0.1 + 0.2 * -(-len(handles) // ncol)) / fig.get_figheight()


def plot_across_models(rows: list[dict], models=None, gemm: str = "first", metric: str = "ms", *, impls=None,
                       dtype: str | None = None, highlight: str | None = None, ncols: int = 3,
                       protocol: str | None = None):
    """``metric`` against M, one panel per model, one line per implementation, one legend.

    Args:
        rows: results as :func:`moe_tutorial.perf.results.load_rows` returns them.
        models: one panel each, in this order (default: every model in ``rows``, the series' order).
        gemm: "first" (the gate/up GEMM) or "layer" (the whole layer).
        metric: "ms" (log scale, the roofline floor dashed) or "fraction_of_floor" (1.0 dashed;
            the panels share their y axis).
        impls: which implementations to draw (default: all), in the series' order.
        dtype: keep only this dtype; None when the rows hold a single one.
        protocol: keep only rows timed under this protocol; None: the headline protocol where
            the rows hold several (:func:`moe_tutorial.perf.report.subset`).
        highlight: an implementation drawn thicker, e.g. the notebook's own kernel.
        ncols: panels per row; more models wrap onto further rows.

    Timed rows are lines; rows that failed the correctness check are red crosses above the
    panel; skipped rows are left out.
    """
    if metric not in ("ms", "fraction_of_floor"):
        raise ValueError(f"metric: expected 'ms' or 'fraction_of_floor', got {metric!r}")
    rows = subset(rows, gemm, dtype, impls, protocol)
    models = list(models) if models is not None else model_order(rows)
    if not models:
        raise ValueError(f"rows: no results for gemm={gemm!r}" + (f", dtype={dtype!r}" if dtype else "")
                         + (f", impls={list(impls)}" if impls is not None else ""))
    ncols = min(ncols, len(models))
    nrows = -(-len(models) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.8 * ncols, 3.5 * nrows + 0.9), squeeze=False,
                             sharey=metric != "ms")
    panels = list(axes.flat)
    for i, (ax, model) in enumerate(zip(panels, models)):
        _plot_metric(ax, rows, model, metric, title=model, highlight=highlight)
        if i % ncols:
            ax.set_ylabel("")
    for ax in panels[len(models):]:
        ax.set_axis_off()
    if metric != "ms":          # one shared y axis: tall enough for every panel
        panels[0].set_ylim(0, max(ax.get_ylim()[1] for ax in panels[:len(models)]))
    what = "time" if metric == "ms" else "fraction of the roofline floor"
    fig.suptitle(f"{gemm_title(gemm)}: {what} against M")
    fig.tight_layout(rect=(0, _shared_legend(fig, panels), 1, 1))
    return fig


def plot_model(rows: list[dict], model: str):
    """One model's results: time (top) and fraction of the floor (bottom) for each gemm."""
    gemms = [g for g in ("first", "layer", "step") if any(r["model"] == model and r["gemm"] == g for r in rows)]
    fig, axes = plt.subplots(2, len(gemms), figsize=(6.0 * len(gemms), 7.2), squeeze=False)
    for j, gemm in enumerate(gemms):
        for i, metric in enumerate(("ms", "fraction_of_floor")):
            _plot_metric(axes[i][j], subset(rows, gemm), model, metric, title=f"{model}, {gemm_title(gemm)}")
    first = next((r for r in rows if r["model"] == model), {})
    fig.suptitle(f"{model} on {first.get('gpu', '?')} ({first.get('dtype', '')})")
    fig.tight_layout(rect=(0, _shared_legend(fig, axes), 1, 1))
    return fig


def save_bench_figures(rows: list[dict], out_dir) -> list[Path]:
    """Write one PNG per model (``<model>.png``: time and fraction of the floor vs M) to ``out_dir``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for model in model_order(rows):
        if not any(r["model"] == model and is_ok(r) for r in rows):
            continue
        fig = plot_model(rows, model)
        path = out_dir / f"{model}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


__all__ = ["intensity", "plot_intensity", "plot_roofline", "plot_across_models", "plot_model", "save_bench_figures"]


def plot_read_by_size(rates: dict, rows: list[dict], *, read_tbps: float, impl: str = "sorted",
                      Ms=(1, 8), protocol: str = "cold-l2"):
    """The read-only kernel's TB/s against the bytes it reads, with Part 4's decode calls on top.

    ``rates``: ``{(protocol, MiB): TB/s}`` (:func:`moe_tutorial.experiments.limits.read_rates`), a line
    for cold-l2 and one for a flush that leaves L2 clean. ``rows``: benchmark rows; each ``impl``
    call at the given ``Ms`` is placed at the bytes the floor counts for it and the rate it moved
    them at (``gbps``), the first GEMM as circles and the layer as squares. ``read_tbps``: the
    floor's read ceiling (an 8 GB read's rate or better, :mod:`moe_tutorial.perf.reached`), dashed.
    """
    fig, ax = plt.subplots(figsize=(6.8, 4.0))
    styles = {"cold-l2-zero": ("black", "-"), "clean-flush": ("#59a14f", "--")}
    for p, (color, ls) in styles.items():
        pts = sorted((mib * 2 ** 20 / 1e6, tbps) for (q, mib), tbps in rates.items() if q == p)
        if pts:
            label = {"cold-l2-zero": "read-only kernel, L2 flushed by zeroing",
                     "clean-flush": "read-only kernel, L2 flushed clean"}[p]
            ax.plot(*zip(*pts), color=color, ls=ls, marker=".", label=label)
    ax.axhline(read_tbps, color="black", ls="--", lw=0.8)
    ax.text(20, read_tbps * 1.02, f"the floor's read ceiling: {read_tbps:.2f} TB/s", fontsize=8,
            va="bottom")
    for gemm, marker in (("first", "o"), ("layer", "s")):
        for i, model in enumerate(model_order(rows)):
            pts = [(r["gbps"] * r["ms"] * 1e-3 * 1e9 / 1e6, r["gbps"] / 1e3)
                   for r in subset(rows, gemm, impls=(impl,), protocol=protocol)
                   if r["model"] == model and r["M"] in Ms and is_ok(r) and r.get("gbps")]
            if pts:
                ax.plot(*zip(*pts), marker, color=f"C{i}", ms=6, ls="none",
                        label=f"Part 4, {model}, {gemm_title(gemm)}, M = {' and '.join(map(str, Ms))}")
    ax.set(xscale="log", xlabel="MB read", ylabel="TB/s", ylim=(0, read_tbps * 1.25),
           title=f"A small read cannot reach the 8 GB rate ({protocol})")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig
