"""Figures for Part 4: sorting pairs by expert, which tile each program takes, GPU results.

The drawing functions take plain tensors or result rows and return the matplotlib Figure;
the notebook calls ``plt.show()``.
"""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.patches import Rectangle

from ..shapes import MODEL_SHAPES
from ..traffic import geomean
from .style import IMPL_COLORS, PADDING_COLOR, expert_color

#: Legend names of the implementations in the results CSV, in the series' order.
IMPL_LABELS = {
    "loop": "Part 1 loop",
    "indexing": "Part 2 indexing",
    "published": "Part 3 as published",
    "naive": "Part 3 fixed",
    "sorted": "Part 4 sorted",
    "grouped_mm": "torch._grouped_mm",
}


# --------------------------------------------------------------------------------------
# Sorting and padding
# --------------------------------------------------------------------------------------

def sorted_blocks(alignment, block_m: int, num_pairs: int) -> list[tuple[int, list[int | None]]]:
    """The used part of an alignment as ``[(expert, rows), ...]``, one entry per block.

    ``rows`` holds the flat pair index ``m * topk + j`` of each row, ``None`` for padding.
    Pairs inside one expert's run are listed in increasing order: the kernel does not care
    about that order and the GPU's atomics do not fix it, so a stable view is shown.

    Args:
        alignment: ``(sorted_token_ids, expert_ids, num_tokens_post_padded)`` from
            :func:`moe_tutorial.align_block_size`.
        block_m: the ``block_m`` it was built with.
        num_pairs: ``M * topk``, the value padding rows hold.
    """
    sorted_ids, expert_ids, num_post = (t.cpu() for t in alignment)
    n_blocks = int(num_post.item()) // block_m
    experts = expert_ids[:n_blocks].tolist()
    rows = sorted_ids[: n_blocks * block_m].tolist()
    out: list[tuple[int, list[int | None]]] = []
    b = 0
    while b < n_blocks:                     # one run of blocks of the same expert at a time
        e, end = experts[b], b
        while end < n_blocks and experts[end] == e:
            end += 1
        pairs = sorted(p for p in rows[b * block_m:end * block_m] if p != num_pairs)
        padded = pairs + [None] * ((end - b) * block_m - len(pairs))
        out.extend((e, padded[i * block_m:(i + 1) * block_m]) for i in range(end - b))
        b = end
    return out


def _cell(ax, x, y, color, text="", *, w=1.0, h=1.0, fontsize=7, hatch=None):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor="white", lw=1.0, hatch=hatch))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize)


def plot_sorting(topk_ids: torch.Tensor, alignment, block_m: int):
    """Pairs in token order (top) and sorted by expert, padded to ``block_m`` (bottom).

    Each cell is one (token m, slot j) pair, coloured by its expert and labelled ``m,j``.
    Grey cells are padding (sorted id ``M * topk``, masked off by the kernel); under each
    block is its entry of ``expert_ids``. Lines join every pair to its sorted position.
    """
    M, topk = topk_ids.shape
    flat = topk_ids.reshape(-1).tolist()
    blocks = sorted_blocks(alignment, block_m, M * topk)
    num_post = len(blocks) * block_m
    width = max(len(flat), num_post)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.42 * width + 1.5), 3.4))
    top, bottom = 3.0, 0.0
    for p, e in enumerate(flat):
        _cell(ax, p, top, expert_color(e), f"{p // topk},{p % topk}")
    where = {}
    for b, (e, rows) in enumerate(blocks):
        for i, p in enumerate(rows):
            col = b * block_m + i
            if p is None:
                _cell(ax, col, bottom, PADDING_COLOR, "pad", hatch="//", fontsize=6)
            else:
                _cell(ax, col, bottom, expert_color(e), f"{p // topk},{p % topk}")
                where[p] = col
        ax.annotate("", xy=(b * block_m + 0.05, bottom - 0.25), xytext=((b + 1) * block_m - 0.05, bottom - 0.25),
                    arrowprops=dict(arrowstyle="-", lw=1.5, color=expert_color(e)))
        ax.text((b + 0.5) * block_m, bottom - 0.65, f"block {b}: expert {e}", ha="center", va="top", fontsize=8)
    for p, col in where.items():
        ax.plot([p + 0.5, col + 0.5], [top, bottom + 1], color="#999999", lw=0.6, zorder=0)
    ax.text(-0.3, top + 0.5, "token order\n(m, j)", ha="right", va="center", fontsize=9)
    ax.text(-0.3, bottom + 0.5, "sorted by expert,\npadded to BLOCK_M", ha="right", va="center", fontsize=9)
    ax.set_xlim(-0.2, width + 0.2)
    ax.set_ylim(bottom - 1.3, top + 1.2)
    ax.set_axis_off()
    ax.set_title(f"{M} tokens x topk {topk} = {M * topk} pairs -> {num_post} rows "
                 f"({num_post - M * topk} padding), BLOCK_M = {block_m}", fontsize=10)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------
# Which tile each program takes
# --------------------------------------------------------------------------------------

def pid_to_tile(pid: int, num_pid_m: int, num_pid_n: int, group_m: int) -> tuple[int, int]:
    """``(pid_m, pid_n)`` of program ``pid``: the kernel's grouped ordering, in plain Python.

    Programs walk ``group_m`` row blocks down one column before moving right; ``group_m = 1``
    is plain row-major order.
    """
    pids_per_group = group_m * num_pid_n
    first_m = (pid // pids_per_group) * group_m
    group_rows = min(num_pid_m - first_m, group_m)
    return first_m + (pid % pids_per_group) % group_rows, (pid % pids_per_group) // group_rows


def tile_pids(num_pid_m: int, num_pid_n: int, group_m: int) -> np.ndarray:
    """``[num_pid_m, num_pid_n]`` array: the program id that computes each output tile."""
    grid = np.full((num_pid_m, num_pid_n), -1, dtype=np.int64)
    for pid in range(num_pid_m * num_pid_n):
        grid[pid_to_tile(pid, num_pid_m, num_pid_n, group_m)] = pid
    return grid


def wave_loads(pids: np.ndarray, expert_ids, wave: int) -> tuple[int, int]:
    """``(x row-block loads, weight-tile loads)`` when programs run ``wave`` at a time.

    A toy cache model: a wave shares what it loads (L2), and nothing survives to the next
    wave. Blocks with expert -1 exit at once and load nothing. Weight tiles are keyed by
    ``(expert, pid_n)``, so row blocks of one expert share them.
    """
    experts = list(expert_ids)
    order = sorted((int(pid), m, n) for (m, n), pid in np.ndenumerate(pids))
    a_loads = b_loads = 0
    for start in range(0, len(order), wave):
        live = [(m, n) for _, m, n in order[start:start + wave] if experts[m] >= 0]
        a_loads += len({m for m, _ in live})
        b_loads += len({(experts[m], n) for m, n in live})
    return a_loads, b_loads


def plot_pid_order(expert_ids, num_pid_n: int, group_ms=(1, 4), wave: int = 8):
    """One panel per ``GROUP_M``: each output tile labelled with the program that computes it.

    Rows are blocks of BLOCK_M sorted pairs (coloured by their expert, grey past
    ``num_tokens_post_padded``), columns are BLOCK_N slices of the output. The first
    ``wave`` programs, those that run together, are outlined; the title counts the loads of
    the toy cache model of :func:`wave_loads`.
    """
    experts = [int(e) for e in expert_ids]
    num_pid_m = len(experts)
    fig, axes = plt.subplots(1, len(group_ms), figsize=((0.3 * num_pid_n + 1.2) * len(group_ms), 0.34 * num_pid_m + 1.8),
                             squeeze=False)
    for ax, g in zip(axes[0], group_ms):
        pids = tile_pids(num_pid_m, num_pid_n, g)
        for (m, n), pid in np.ndenumerate(pids):
            idle = experts[m] < 0
            color = PADDING_COLOR if idle else expert_color(experts[m])
            first_wave = pid < wave and not idle
            ax.add_patch(Rectangle((n, num_pid_m - 1 - m), 1, 1, facecolor=color, alpha=1.0 if first_wave else 0.45,
                                   edgecolor="black" if first_wave else "white", lw=1.6 if first_wave else 0.8))
            ax.text(n + 0.5, num_pid_m - 0.5 - m, str(pid), ha="center", va="center", fontsize=7,
                    color="#777777" if idle else "black", fontweight="bold" if first_wave else "normal")
        a_loads, b_loads = wave_loads(pids, experts, wave)
        ax.set_xlim(0, num_pid_n)
        ax.set_ylim(0, num_pid_m)
        ax.set_xticks(np.arange(num_pid_n) + 0.5, [str(n) for n in range(num_pid_n)], fontsize=7)
        ax.set_yticks(np.arange(num_pid_m) + 0.5,
                      [f"{m}: e{e}" if e >= 0 else f"{m}: exit" for m, e in reversed(list(enumerate(experts)))],
                      fontsize=7)
        ax.set_xlabel("pid_n (BLOCK_N slice of the output)")
        ax.tick_params(length=0)
        ax.set_title(f"GROUP_M = {g}{' (row-major)' if g == 1 else ''}\n"
                     f"programs run {wave} at a time:\n{a_loads} x blocks + {b_loads} weight tiles = {a_loads + b_loads} loads",
                     fontsize=9)
    axes[0][0].set_ylabel("pid_m: expert of the block")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------
# GPU results
# --------------------------------------------------------------------------------------

def _models_in(rows) -> list[str]:
    present = {r["model"] for r in rows}
    known = [m for m in MODEL_SHAPES if m in present]
    return known + sorted(present - set(known))


def _impls_in(rows) -> list[str]:
    present = {r["impl"] for r in rows}
    return [i for i in IMPL_LABELS if i in present] + sorted(present - set(IMPL_LABELS))


def _filter(rows, gemm: str, dtype: str | None):
    """Rows of one GEMM and one dtype; with ``dtype=None`` the rows must hold only one."""
    rows = [r for r in rows if r["gemm"] == gemm and (dtype is None or r["dtype"] == dtype)]
    dtypes = sorted({r["dtype"] for r in rows})
    if len(dtypes) > 1:
        raise ValueError(f"dtype: the results hold several dtypes {dtypes}; expected one of them, got None")
    return rows


def plot_results(rows: list[dict], metric: str = "ms", *, gemm: str = "first", dtype: str | None = None,
                 models=None, impls=None, ncols: int = 3):
    """``metric`` ("ms" or "fraction_of_floor") against M, one panel per model.

    Args:
        rows: results as :func:`moe_tutorial.results.load_rows` returns them.
        metric: "ms" (log scale, with the roofline floor dashed) or "fraction_of_floor".
        gemm: "first" (the gate/up GEMM) or "layer" (the whole layer).
        dtype: keep only this dtype; None when the rows hold a single dtype.
        models, impls: which to draw; default every one in ``rows``, in the series' order.
        ncols: panels per row of the figure.

    Rows with status "ok" are drawn as lines; "wrong" ones (failed the correctness
    check) as red crosses along the bottom edge; skipped ones are left out.
    """
    if metric not in ("ms", "fraction_of_floor"):
        raise ValueError(f"metric: expected 'ms' or 'fraction_of_floor', got {metric!r}")
    rows = _filter(rows, gemm, dtype)
    models = list(models) if models is not None else _models_in(rows)
    impls = list(impls) if impls is not None else _impls_in(rows)
    if not models:
        raise ValueError(f"rows: no results for gemm={gemm!r}" + (f", dtype={dtype!r}" if dtype else ""))
    ncols = min(ncols, len(models))
    nrows = -(-len(models) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.3 * nrows + 0.6), squeeze=False,
                             sharey=metric != "ms")
    flat_axes = list(axes.flat)
    for ax in flat_axes[len(models):]:
        ax.set_axis_off()
    for ax, model in zip(flat_axes, models):
        mine = [r for r in rows if r["model"] == model]
        for impl in impls:
            ok = sorted((r["M"], r[metric]) for r in mine if r["impl"] == impl and r["status"] == "ok"
                        and r[metric] is not None)
            wrong = sorted(r["M"] for r in mine if r["impl"] == impl and r["status"] == "wrong")
            color = IMPL_COLORS.get(impl, "black")
            if ok:
                ax.plot(*zip(*ok), marker="o", ms=3.5, lw=1.5, color=color, label=IMPL_LABELS.get(impl, impl))
            if wrong:   # no time worth plotting: crosses along the bottom edge
                ax.scatter(wrong, [0.04] * len(wrong), marker="x", color="#d62728", s=30, zorder=5, clip_on=False,
                           transform=ax.get_xaxis_transform(), label=f"{IMPL_LABELS.get(impl, impl)}: wrong result")
        first_col = flat_axes.index(ax) % ncols == 0
        if metric == "ms":
            floor = sorted({(r["M"], r["floor_ms"]) for r in mine if r["floor_ms"] is not None})
            if floor:
                ax.plot(*zip(*floor), ls="--", color="black", lw=1.0, label="roofline floor")
            ax.set_yscale("log")
            ax.set_ylabel("time (ms)" if first_col else "")
        else:
            ax.axhline(1.0, ls="--", color="black", lw=1.0)
            ax.set_ylim(0, 1.1)
            ax.set_ylabel("fraction of the floor" if first_col else "")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens M")
        ax.set_title(model)
        ax.grid(True, which="major", alpha=0.3)
    handles: dict = {}
    for ax in flat_axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    legend_rows = -(-len(handles) // 4)
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=min(4, len(handles)),
               fontsize=8, frameon=False)
    what = "gate/up GEMM" if gemm == "first" else "whole layer"
    fig.suptitle(f"{what}: {'time' if metric == 'ms' else 'fraction of the roofline floor'} against M")
    fig.tight_layout(rect=(0, (0.22 * legend_rows + 0.05) / fig.get_figheight(), 1, 1))
    return fig


def floor_geomeans(rows: list[dict], *, gemm: str = "first", dtype: str | None = None) -> dict:
    """``{(model, impl): value}``: the geometric mean over M of ``fraction_of_floor``.

    ``value`` is a float over the rows with status "ok", or the string "wrong" when any
    row of that model and implementation failed its correctness check.
    """
    rows = _filter(rows, gemm, dtype)
    out: dict = {}
    for model in _models_in(rows):
        for impl in _impls_in(rows):
            mine = [r for r in rows if r["model"] == model and r["impl"] == impl]
            if any(r["status"] == "wrong" for r in mine):
                out[model, impl] = "wrong"
            else:
                value = geomean(r["fraction_of_floor"] for r in mine if r["status"] == "ok")
                if not math.isnan(value):
                    out[model, impl] = value
    return out


def format_geomean_table(rows: list[dict], *, gemm: str = "first", dtype: str | None = None) -> str:
    """A plain-text table of :func:`floor_geomeans`: implementations down, models across."""
    values = floor_geomeans(rows, gemm=gemm, dtype=dtype)
    models = [m for m in _models_in(_filter(rows, gemm, dtype))]
    impls = [i for i in _impls_in(_filter(rows, gemm, dtype))]
    head = ["implementation"] + models
    body = []
    for impl in impls:
        cells = []
        for model in models:
            v = values.get((model, impl))
            cells.append("-" if v is None else v if isinstance(v, str) else f"{v:.2f}")
        body.append([IMPL_LABELS.get(impl, impl)] + cells)
    widths = [max(len(str(r[c])) for r in [head] + body) for c in range(len(head))]
    fmt = lambda r: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)  # noqa: E731
                              for i, (c, w) in enumerate(zip(r, widths)))
    lines = [fmt(head), "  ".join("-" * w for w in widths)] + [fmt(r) for r in body]
    return "\n".join(lines)
