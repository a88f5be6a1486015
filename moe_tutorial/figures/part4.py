"""Figures for Part 4: sorting pairs by expert, which tile each program takes, and what each
production step bought on the H200.

The drawing functions take plain tensors (or benchmark rows) and return the matplotlib Figure;
the notebook calls ``plt.show()``. The comparison of all implementations against the floor is
notebook 05's, drawn by :mod:`moe_tutorial.figures.perf`.
"""
from __future__ import annotations

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
import torch
from IPython.display import clear_output

from ..kernels.sorted_kernel import pid_to_tile
from ..perf import report
from .cells import cell
from .style import PADDING_COLOR, expert_color, impl_style, m_axis

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
        cell(ax, p, top, expert_color(e), f"{p // topk},{p % topk}", edge="white", lw=1.0)
    where = {}
    for b, (e, rows) in enumerate(blocks):
        for i, p in enumerate(rows):
            col = b * block_m + i
            if p is None:
                cell(ax, col, bottom, PADDING_COLOR, "pad", hatch="//", fontsize=6, edge="white", lw=1.0)
            else:
                cell(ax, col, bottom, expert_color(e), f"{p // topk},{p % topk}", edge="white", lw=1.0)
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

    ``GROUP_M = 1`` is row-major order; a ``GROUP_M`` of at least the number of row blocks walks
    down whole columns, the order in which a 2-D grid ``(row blocks, column blocks)`` runs its
    programs (axis 0 fastest), as the minimal kernel's does. Rows are blocks of BLOCK_M sorted
    pairs (coloured by their expert, grey past ``num_tokens_post_padded``), columns are BLOCK_N
    slices of the output. The first ``wave`` programs, those that run together, are outlined
    and numbered; the other tiles carry no number, their shade fading with their place in the
    order, so the picture shows the walk without hundreds of labels. The title counts the loads
    of the toy cache model of :func:`wave_loads`.
    """
    experts = [int(e) for e in expert_ids]
    num_pid_m = len(experts)
    figsize = ((0.3 * num_pid_n + 1.2) * len(group_ms), 0.34 * num_pid_m + 1.8)
    fig, axes = plt.subplots(1, len(group_ms), figsize=figsize,
                             squeeze=False)
    for ax, g in zip(axes[0], group_ms):
        pids = tile_pids(num_pid_m, num_pid_n, g)
        for (m, n), pid in np.ndenumerate(pids):
            idle = experts[m] < 0
            color = PADDING_COLOR if idle else expert_color(experts[m])
            first_wave = pid < wave and not idle
            later = 0.75 - 0.55 * pid / max(1, pids.size - 1)          # fades along the launch order
            cell(ax, n, num_pid_m - 1 - m, color, pid if first_wave else "", alpha=1.0 if first_wave else later,
                 edge="black" if first_wave else "white", lw=1.6 if first_wave else 0.8,
                 text_color="#777777" if idle else "black", fontweight="bold" if first_wave else "normal")
        a_loads, b_loads = wave_loads(pids, experts, wave)
        ax.set_xlim(0, num_pid_n)
        ax.set_ylim(0, num_pid_m)
        ax.set_xticks(np.arange(num_pid_n) + 0.5, [str(n) for n in range(num_pid_n)], fontsize=7)
        ax.set_yticks(np.arange(num_pid_m) + 0.5,
                      [f"{m}: e{e}" if e >= 0 else f"{m}: exit" for m, e in reversed(list(enumerate(experts)))],
                      fontsize=7)
        ax.set_xlabel("pid_n (BLOCK_N slice of the output)")
        ax.tick_params(length=0)
        order = (" (row-major)" if g == 1 else
                 " (whole columns:\nthe minimal kernel's 2-D grid)" if g >= num_pid_m else "")
        ax.set_title(f"GROUP_M = {g}{order}\n"
                     f"programs run {wave} at a time:\n"
                     f"{a_loads} x blocks + {b_loads} weight tiles = {a_loads + b_loads} loads",
                     fontsize=9)
    axes[0][0].set_ylabel("pid_m: expert of the block")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------
# What each production step bought
# --------------------------------------------------------------------------------------

#: How the ladder names its last rung, "sorted": the step it adds, and that it is Part 4 as shipped.
LADDER_TOP = {"first": "Part 4 step 4: + short tails (= Part 4, tuned)",
              "layer": "layer step 5: + one-launch topk sum (= Part 4, tuned)"}


def pid_order_explorer(expert_ids, num_pid_n: int, *, group_m: int = 4, wave: int = 12):
    """Sliders ``GROUP_M`` and ``wave`` over :func:`plot_pid_order` (row-major and grouped order).

    Returns an ``ipywidgets.VBox``; the figure is drawn only when a slider moves, so that a run
    without a browser stores the sliders alone.
    """
    group = widgets.IntSlider(value=group_m, min=1, max=len(expert_ids), description="GROUP_M")
    wave_slider = widgets.IntSlider(value=wave, min=4, max=48, step=4, description="wave")
    canvas = widgets.Output()

    def redraw(_change=None):
        with canvas:
            clear_output(wait=True)
            plot_pid_order(expert_ids, num_pid_n, group_ms=(1, group.value), wave=wave_slider.value)
            plt.show()

    group.observe(redraw, names="value")
    wave_slider.observe(redraw, names="value")
    box = widgets.VBox([widgets.HBox([group, wave_slider]), canvas])
    box.redraw = redraw
    return box


def ladder_label(gemm: str, step: str) -> str:
    """The name a step has on the ladder of ``gemm``: its registry label, the last rung named by its step."""
    return LADDER_TOP[gemm] if step == "sorted" else impl_style(step)["label"]


def plot_ladder(rows: list[dict], gemm: str = "first", *, upto: str | None = None, band: float | None = None,
                protocol: str | None = None):
    """Each production step's speed-up over step 0 against M: one panel per model.

    Args:
        rows: benchmark rows (``results.load_rows``) holding the steps of
            :data:`moe_tutorial.perf.report.LADDERS` for ``gemm``.
        gemm: "first" (steps 0-4 of the gate/up GEMM) or "layer" (steps 0-5 of the whole layer).
        upto: the last step to draw (default: all of them).
        band: a percentage, shaded around 1.0: how far apart two timings of the same kernels
            fall (:func:`moe_tutorial.perf.report.spread_percent`); a gain inside it is no evidence.
        protocol: as :func:`moe_tutorial.perf.report.subset`.

    The speed-up of step k at M is the time of step 0 over the time of step k, both measured.
    """
    if gemm not in report.LADDERS:
        raise ValueError(f"gemm: expected one of {', '.join(report.LADDERS)}, got {gemm!r}")
    steps = report.LADDERS[gemm]
    if upto is not None:
        if upto not in steps:
            raise ValueError(f"upto: expected one of {', '.join(steps)}, got {upto!r}")
        steps = steps[:steps.index(upto) + 1]
    gains = {step: report.step_gains(rows, gemm, steps[0], step, protocol=protocol) for step in steps}
    models = [m for m in report.model_order(report.subset(rows, gemm, protocol=protocol))
              if any(model == m for model, _ in gains[steps[0]])]
    if not models:
        raise ValueError(f"rows: no timings of {steps[0]!r} for gemm={gemm!r}")
    fig, axes = plt.subplots(1, len(models), figsize=(4.6 * len(models), 3.9), sharey=True, squeeze=False)
    for ax, model in zip(axes[0], models):
        if band:
            ax.axhspan(1 / (1 + band / 100), 1 + band / 100, color="#dddddd", alpha=0.6, lw=0,
                       label=f"two timings of the same kernels differ by up to {band:.1f}%")
        for step in steps:
            pts = sorted((M, g) for (m, M), g in gains[step].items() if m == model)
            style = dict(impl_style(step), label=ladder_label(gemm, step))
            ax.plot(*zip(*pts), marker="o", ms=3.5, lw=2.4 if step == "sorted" else 1.4, **style)
        ax.axhline(1.0, color="black", lw=0.8)
        m_axis(ax, sorted({M for (m, M) in gains[steps[0]] if m == model}))
        ax.set_title(model)
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].set_ylabel("speed-up over step 0")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, fontsize=8, frameon=False)
    fig.suptitle(f"{report.gemm_title(gemm)}: what each production step bought (time of step 0 / time of the step)")
    fig.tight_layout(rect=(0, 0.2 * -(-len(labels) // 2) / fig.get_figheight() + 0.02, 1, 1))
    return fig
