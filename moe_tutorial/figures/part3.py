"""Figures for Part 3: the pid grid, the fused-topk columns, the gather, its explorer, the costs.

Every drawing is computed from the same index arithmetic the kernel does (``program_columns``),
so a figure cannot disagree with :mod:`moe_tutorial.kernels.fused_kernel`. Functions return a matplotlib
Figure (the notebook calls ``plt.show()``), except :func:`pid_explorer`, which returns a widget.
The GPU results Part 3 shows are drawn by :mod:`moe_tutorial.figures.perf`.
"""
from __future__ import annotations

import io
import math
from dataclasses import dataclass

import ipywidgets as widgets
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import to_rgb
from matplotlib.patches import Rectangle

from ..perf import traffic
from ..perf.results import committed_ceilings
from ..shapes import BATCH_SIZES, HEADLINE_MODELS, get_shape
from .args import check_ids_below, check_int, check_k_step, check_power_of_two, check_program, fail, id_rows
from .cells import cell
from .part2 import H200_SMS  # noqa: F401  (notebook 03 and its tests read it here)
from .style import PADDING_COLOR, expert_color, impl_color, m_axis

#: Colours of a program's slots (topk_idx 0, 1, ...): greys and blues, so they never read as experts.
SLOT_COLORS = ["#c6dbef", "#9ecae1", "#6baed6", "#4292c6", "#2171b5", "#08519c", "#08306b", "#041f45"]
#: One colour per pid_n in the pid-grid figure.
PID_COLORS = ["#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462", "#b3de69", "#fccde5"]
_DIM = "#f2f2f2"
_EDGE = "#999999"


def _tint(color: str, alpha: float):
    """``color`` blended with white: alpha 1 is the colour, 0 is white."""
    r, g, b = to_rgb(color)
    return (1 - alpha + alpha * r, 1 - alpha + alpha * g, 1 - alpha + alpha * b)


def _matrix(ax, colors, x0: float = 0.0, y0: float = 0.0, edge=_EDGE):
    """A grid of unit cells, ``colors[row][col]``, drawn as one image plus grid lines (fast to redraw)."""
    rows, cols = len(colors), len(colors[0])
    rgb = np.array([[to_rgb(c) for c in row] for row in colors])
    ax.imshow(rgb, extent=(x0, x0 + cols, y0 + rows, y0), interpolation="nearest", aspect="equal")
    ax.vlines([x0 + c for c in range(cols + 1)], y0, y0 + rows, colors=edge, lw=0.5)
    ax.hlines([y0 + r for r in range(rows + 1)], x0, x0 + cols, colors=edge, lw=0.5)


def _frame(ax, width, height, pad=0.3):
    ax.set_xlim(-pad, width + pad)
    ax.set_ylim(height + pad, -pad)          # row 0 at the top, like a printed matrix
    ax.set_aspect("equal")
    ax.axis("off")


# --------------------------------------------------------------------------------------
# The index arithmetic of one program, in plain Python

@dataclass(frozen=True)
class Column:
    """One column of a program's ``FUSED_N`` wide tile."""

    topk_idx: int        # which of the token's experts (slot), offs // BLOCK_N
    n_inner: int         # offs % BLOCK_N
    n_global: int        # pid_n * BLOCK_N + n_inner
    expert: int | None   # topk_ids[pid_m, topk_idx], None on padding slots
    valid: bool          # topk_idx < topk and n_global < N: the column is loaded and stored


def topk_pad(topk: int) -> int:
    """The fixed kernel's ``TOPK_PAD``: topk rounded up to a power of two."""
    return 1 << max(0, (topk - 1).bit_length())


def program_columns(topk_ids, pid_m: int, pid_n: int, N: int, block_n: int) -> list[Column]:
    """The columns of program ``(pid_m, pid_n)``, as ``fused_moe_kernel`` computes them.

    Args:
        topk_ids: ``[M, topk]`` expert ids (tensor or nested list).
        pid_m, pid_n: the program, inside the grid ``(M, cdiv(N, block_n))``.
        N: output features. block_n: BLOCK_N, a power of two.

    Raises ValueError naming the argument when the program lies outside the grid or BLOCK_N is
    one the kernel would refuse.
    """
    rows = id_rows("topk_ids", topk_ids)
    check_int("N", N, 1)
    check_power_of_two("block_n", block_n)
    check_program(pid_m, pid_n, len(rows), N, block_n)
    row = rows[pid_m]
    topk = len(row)
    cols = []
    for offs in range(topk_pad(topk) * block_n):
        slot, n_inner = divmod(offs, block_n)
        n_global = pid_n * block_n + n_inner
        expert = row[slot] if slot < topk else None
        cols.append(Column(slot, n_inner, n_global, expert, slot < topk and n_global < N))
    return cols


def k_range(k_step: int, K: int, block_k: int) -> range:
    """The K indices the ``k_step``-th turn of the K loop loads (the last one may be short)."""
    check_int("K", K, 1)
    check_power_of_two("block_k", block_k)
    check_k_step(k_step, K, block_k)
    return range(k_step * block_k, min(K, (k_step + 1) * block_k))


# --------------------------------------------------------------------------------------
# Triton's model: the grid of programs over the output

#: Largest output the pid-grid figure draws cell by cell (rows M * topk, columns N rounded up).
PID_GRID_MAX_ROWS, PID_GRID_MAX_COLS = 48, 64


def program_color(pid_m: int, pid_n: int):
    """A program's colour in the pid-grid figure: the hue says pid_n, the shade pid_m (light, dark)."""
    return _tint(PID_COLORS[pid_n % len(PID_COLORS)], 1.0 if pid_m % 2 == 0 else 0.55)


def draw_pid_grid(M: int, N: int, topk: int, block_n: int, *, highlight: tuple[int, int] | None = None):
    """Which program writes which cells of ``out [M, topk, N]``, on Part 3's grid ``(M, cdiv(N, BLOCK_N))``.

    Token m is a band of ``topk`` rows (its slots j, that is ``out[m, j, :]``); the columns are
    the output features n. Program ``(pid_m, pid_n)`` writes one rectangle: token pid_m's band,
    features ``[pid_n * BLOCK_N, (pid_n + 1) * BLOCK_N)``, every slot. Its hue says pid_n and
    its shade pid_m, and it is labelled ``(pid_m, pid_n)``. Lanes of the last block past N are
    drawn dashed: the program computes their offsets, and its mask keeps it off them.

    Args:
        M, N, topk: the output's sizes. block_n: BLOCK_N, a power of two.
        highlight: one program ``(pid_m, pid_n)`` to outline; the others are drawn faint.
    """
    check_int("M", M, 1)
    check_int("N", N, 1)
    check_int("topk", topk, 1)
    check_power_of_two("block_n", block_n)
    num_n = math.ceil(N / block_n)
    span = num_n * block_n                      # lanes per row, masked ones included
    if M * topk > PID_GRID_MAX_ROWS or span > PID_GRID_MAX_COLS:
        fail(ValueError, "M, topk, N", f"a small output to draw cell by cell (M * topk <= {PID_GRID_MAX_ROWS}, "
             f"N rounded up to BLOCK_N <= {PID_GRID_MAX_COLS})", f"M * topk = {M * topk}, {span} columns")
    if highlight is not None:
        check_program(highlight[0], highlight[1], M, N, block_n)
    gap = 0.5                                    # between the tokens' bands
    height = M * topk + (M - 1) * gap
    fig, ax = plt.subplots(figsize=(0.42 * span + 2.6, 0.42 * height + 1.5))
    for m in range(M):
        y0 = m * (topk + gap)
        for pid_n in range(num_n):
            lo = pid_n * block_n
            hi = min(N, lo + block_n)
            mine = highlight is None or highlight == (m, pid_n)
            color = _tint(program_color(m, pid_n), 1.0 if mine else 0.3)
            for j in range(topk):
                for n in range(lo, hi):
                    cell(ax, n, y0 + j, color, edge="white", lw=0.8)
            for n in range(hi, lo + block_n):        # past N: computed, masked, never written
                for j in range(topk):
                    ax.add_patch(Rectangle((n, y0 + j), 1, 1, facecolor="none", edgecolor="#bbbbbb", lw=0.6,
                                           ls="--"))
            ax.add_patch(Rectangle((lo, y0), hi - lo, topk, facecolor="none", lw=2.2 if highlight else 1.2,
                                   edgecolor="black" if mine else "#bbbbbb"))
            ax.text((lo + hi) / 2, y0 + topk / 2, f"({m}, {pid_n})", ha="center", va="center", fontsize=9,
                    color="black" if mine else "#999999", fontweight="bold" if highlight and mine else "normal")
        ax.text(-0.4, y0 + topk / 2, f"token {m}\npid_m = {m}", ha="right", va="center", fontsize=9)
        for j in range(topk):
            ax.text(span + 0.2, y0 + j + 0.5, f"slot {j}", ha="left", va="center", fontsize=8, color="#555555")
    for pid_n in range(num_n):
        lo = pid_n * block_n
        ax.text(lo + block_n / 2, -0.9, f"pid_n = {pid_n}", ha="center", va="bottom", fontsize=9)
        ax.text(lo + block_n / 2, -0.2, f"n = {lo}..{lo + block_n - 1}", ha="center", va="bottom", fontsize=8,
                color="#555555")
    if span > N:
        ax.text(N + (span - N) / 2, height + 0.2, "past N:\nmasked", ha="center", va="top", fontsize=8,
                color="#777777")
    title = (f"out [M={M}, topk={topk}, N={N}] on the grid (M, cdiv(N, BLOCK_N)) = ({M}, {num_n}), "
             f"BLOCK_N = {block_n}: label (pid_m, pid_n)")
    if highlight is not None:
        m, n = highlight
        lo, hi = n * block_n, min(N, (n + 1) * block_n)
        title += f"\nprogram {highlight} writes out[{m}, :, {lo}:{hi}]: {topk * (hi - lo)} cells"
    ax.set_title(title, fontsize=10)
    ax.set_xlim(-3.0, span + 1.6)
    ax.set_ylim(height + 1.1, -1.6)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------
# The fused-topk encoding

def _draw_columns(ax, cols: list[Column], topk: int, N: int, block_n: int, title: str):
    rows = ("offs", "topk_idx", "n_inner", "n_global", "expert")
    width = len(cols)
    rotate = 90 if max(c.n_global for c in cols) >= 100 else 0
    for i, c in enumerate(cols):
        pad = c.topk_idx >= topk
        slot_color = PADDING_COLOR if pad else SLOT_COLORS[c.topk_idx % len(SLOT_COLORS)]
        light = c.topk_idx >= 4 and not pad
        cell(ax, i, 0, "white", i, fontsize=6, rotation=90 if width > 100 else 0)
        cell(ax, i, 1, slot_color, c.topk_idx, hatch="///" if pad else None,
              text_color="white" if light else "black")
        cell(ax, i, 2, "white", c.n_inner, fontsize=6)
        over = c.n_global >= N
        cell(ax, i, 3, "white", c.n_global, fontsize=6, rotation=rotate,
              text_color="#d62728" if over else "black", hatch="xx" if over else None, h=1.6)
        cell(ax, i, 4.6, expert_color(c.expert) if c.valid else PADDING_COLOR,
              "-" if c.expert is None else c.expert, hatch=None if c.valid else "///")
    for r, name in enumerate(rows):
        y = (r if r < 4 else 4.6) + (0.8 if r == 3 else 0.5)
        ax.text(-0.3, y, name, ha="right", va="center", fontsize=8)
    for b in range(0, width + 1, block_n):
        ax.plot([b, b], [-0.1, 5.7], color="black", lw=1.0)
    ax.set_title(title, fontsize=9, loc="left")
    ax.set_xlim(-3.5, width + 0.3)
    ax.set_ylim(5.9, -0.3)
    ax.set_aspect("equal")
    ax.axis("off")


def draw_fused_columns(cases):
    """One program's ``FUSED_N`` columns, coloured by ``topk_idx``, with what each one computes.

    Args:
        cases: a list of dicts with keys ``title``, ``topk_ids`` (``[M, topk]``), ``pid_m``,
            ``pid_n``, ``N`` and ``block_n``. Each case gets one panel: ``offs``; ``topk_idx``
            (padding slots past topk hatched grey); ``n_inner``; ``n_global`` (red when past
            N); and the expert id the column loads, in the expert's colour.
    """
    keys = {"title", "topk_ids", "pid_m", "pid_n", "N", "block_n"}
    if not cases:
        fail(ValueError, "cases", "at least one case", "none")
    for i, case in enumerate(cases):
        if not isinstance(case, dict) or set(case) != keys:
            got = sorted(case) if isinstance(case, dict) else type(case).__name__
            fail(ValueError, f"cases[{i}]", f"a dict with the keys {sorted(keys)}", got)
    widths = [topk_pad(len(id_rows("topk_ids", c["topk_ids"])[0])) * c["block_n"] for c in cases]
    fig, axes = plt.subplots(len(cases), 1, figsize=(min(13, 0.3 * max(widths) + 1.5), 1.75 * len(cases) + 0.3),
                             squeeze=False)
    for ax, case in zip(axes[:, 0], cases):
        ids = id_rows("topk_ids", case["topk_ids"])
        topk = len(ids[0])
        cols = program_columns(ids, case["pid_m"], case["pid_n"], case["N"], case["block_n"])
        _draw_columns(ax, cols, topk, case["N"], case["block_n"], case["title"])
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------
# The gather: one program, one K step, drawn over x, the stacked weights, SRAM and out

def draw_program(topk_ids, num_experts: int, N: int, K: int, pid_m: int, pid_n: int, k_step: int,
                 block_n: int, block_k: int, fig=None):
    """What program ``(pid_m, pid_n)`` touches on K step ``k_step``.

    Four panels: ``x [M, K]`` (its row, the K block of this step bright); the weights
    ``[E, N, K]`` stacked expert over expert, each cell the pointer grid reads in this step lit
    in its expert's colour (the same rows' other K blocks faint: the rest of the loop); the
    ``[BLOCK_K, FUSED_N]`` tile those loads make in on-chip memory (masked lanes hatched); and
    ``out [M, topk, N]`` with the cells this program writes once the loop ends.

    Args:
        topk_ids: ``[M, topk]`` expert ids. num_experts, N, K: E and the GEMM's sizes.
        pid_m, pid_n, k_step: the program and the turn of its K loop.
        block_n, block_k: BLOCK_N and BLOCK_K, powers of two (the only sizes the kernel accepts).
        fig: a Figure to draw into (cleared first), e.g. the explorer's; default a new one.

    Raises ValueError naming the argument for a program outside the grid, a K step past K, a
    block size the kernel would refuse, or an id that is not an expert of ``[0, num_experts)``.
    """
    ids = id_rows("topk_ids", topk_ids)
    check_ids_below("topk_ids", ids, num_experts)
    M, topk = len(ids), len(ids[0])
    cols = program_columns(ids, pid_m, pid_n, N, block_n)
    ks = k_range(k_step, K, block_k)
    fused_n = len(cols)
    if fig is None:
        fig = plt.figure(figsize=(11, max(3.6, 0.15 * num_experts * N + 1.3)))
    fig.clear()
    grid = fig.add_gridspec(2, 3, width_ratios=[K + 1, K + 2, fused_n + 1], height_ratios=[1, 1.2])
    ax_w = fig.add_subplot(grid[:, 0])
    ax_x = fig.add_subplot(grid[0, 1])
    ax_s = fig.add_subplot(grid[0, 2])
    ax_o = fig.add_subplot(grid[1, 1:])

    # x [M, K]: the program reads one row, one K block per step.
    _matrix(ax_x, [["#525252" if m == pid_m and k in ks else ("#bdbdbd" if m == pid_m else _DIM)
                    for k in range(K)] for m in range(M)])
    ax_x.set_title(f"x [M={M}, K={K}]: row {pid_m}, k {ks.start}..{ks.stop - 1}", fontsize=9)
    _frame(ax_x, K, M)

    # Stacked weights: expert e's row n is drawn at height e * N + n.
    lit = {(c.expert, c.n_global) for c in cols if c.valid}
    _matrix(ax_w, [[_tint(expert_color(e), 1.0 if k in ks else 0.25) if (e, n) in lit else _DIM for k in range(K)]
                   for e in range(num_experts) for n in range(N)])
    for e in range(num_experts):
        ax_w.plot([-0.2, K + 0.2], [e * N, e * N], color="black", lw=1.2)
        ax_w.text(-0.4, e * N + N / 2, f"expert {e}", ha="right", va="center", fontsize=8, color=expert_color(e))
    ax_w.set_title(f"weight [E={num_experts}, N={N}, K={K}] in HBM", fontsize=9)
    _frame(ax_w, K, num_experts * N)
    ax_w.set_xlim(-3.2, K + 0.3)

    # The gathered tile in SRAM: rows are this step's k, columns the FUSED_N lanes.
    for r in range(block_k):
        k = ks.start + r
        for i, c in enumerate(cols):
            ok = c.valid and k < K
            cell(ax_s, i, r, expert_color(c.expert) if ok else PADDING_COLOR, hatch=None if ok else "///")
    for b in range(0, fused_n + 1, block_n):
        ax_s.plot([b, b], [-0.1, block_k + 0.1], color="black", lw=1.0)
    for j in range(topk_pad(topk)):
        label = f"expert {ids[pid_m][j]}" if j < topk else "padding"
        ax_s.text(j * block_n + block_n / 2, block_k + 0.3, label, ha="center", va="top", fontsize=7)
    ax_s.text(-0.3, block_k / 2, "k", ha="right", va="center", fontsize=8)
    ax_s.set_title(f"tile [BLOCK_K={block_k}, FUSED_N={fused_n}] on chip", fontsize=9)
    _frame(ax_s, fused_n, block_k + 0.8)

    # out [M, topk, N] as M rows of topk groups; the program's cells lit.
    written = {(c.topk_idx, c.n_global) for c in cols if c.valid}
    for j in range(topk):
        _matrix(ax_o, [[expert_color(ids[m][j]) if m == pid_m and (j, n) in written else _DIM for n in range(N)]
                       for m in range(M)], x0=j * (N + 1))
        ax_o.text(j * (N + 1) + N / 2, M + 0.3, f"slot {j}", ha="center", va="top", fontsize=7)
    ax_o.set_title(f"out [M={M}, topk={topk}, N={N}]: what program ({pid_m}, {pid_n}) writes", fontsize=9)
    _frame(ax_o, topk * (N + 1) - 1, M + 0.8)
    fig.suptitle(f"program (pid_m={pid_m}, pid_n={pid_n}), K step {k_step}: token {pid_m} routes to "
                 f"experts {ids[pid_m]}", fontsize=10)
    return fig


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def pid_explorer(topk_ids, num_experts: int, N: int, K: int, block_n: int, block_k: int,
                 *, figsize=None):
    """Sliders "pid_m", "pid_n" and "k step" over a live :func:`draw_program` picture.

    Returns an ``ipywidgets.VBox`` of the sliders, an ``ipywidgets.Image`` (PNG) that is redrawn
    whenever a slider moves, and a line that says each slider's range: a slider stops at its
    grid's last program, and a value set past it (``box.sliders["pid_m"].value = 99``) is clamped
    there without a word from ipywidgets. The box's ``redraw()`` draws by hand and its ``sliders``
    dict maps each description to its slider (for tests).
    """
    # The first redraw, below, checks every argument; the sliders' ranges keep the later ones valid.
    M = len(id_rows("topk_ids", topk_ids))
    check_int("N", N, 1)
    check_int("K", K, 1)
    check_power_of_two("block_n", block_n)
    check_power_of_two("block_k", block_k)
    sliders = {
        "pid_m": widgets.IntSlider(value=0, min=0, max=M - 1, description="pid_m"),
        "pid_n": widgets.IntSlider(value=0, min=0, max=math.ceil(N / block_n) - 1, description="pid_n"),
        "k step": widgets.IntSlider(value=0, min=0, max=max(0, math.ceil(K / block_k) - 1), description="k step"),
    }
    image = widgets.Image(format="png", layout=widgets.Layout(width="100%"))
    fig = plt.figure(figsize=figsize or (11, max(3.6, 0.15 * num_experts * N + 1.3)))
    plt.close(fig)       # drawn into by hand, never shown by the inline backend

    def redraw(_change=None):
        draw_program(topk_ids, num_experts, N, K, sliders["pid_m"].value, sliders["pid_n"].value,
                     sliders["k step"].value, block_n, block_k, fig=fig)
        image.value = _png(fig)

    for s in sliders.values():
        s.observe(redraw, names="value")
    redraw()
    note = widgets.HTML(explorer_ranges(M, N, K, block_n, block_k))
    box = widgets.VBox([widgets.HBox(list(sliders.values())), image, note])
    box.redraw, box.sliders = redraw, sliders
    return box


def explorer_ranges(M: int, N: int, K: int, block_n: int, block_k: int) -> str:
    """The explorer's note: each slider's range, from the grid, and what happens past it."""
    n_blocks, k_steps = math.ceil(N / block_n), max(1, math.ceil(K / block_k))
    return (f"pid_m runs 0..{M - 1} (M = {M} tokens), pid_n 0..{n_blocks - 1} (cdiv(N, BLOCK_N) = "
            f"cdiv({N}, {block_n})), k step 0..{k_steps - 1} (cdiv(K, BLOCK_K) = cdiv({K}, {block_k})). "
            "A value set past a slider's end is clamped to it: the grid has no program there.")


# --------------------------------------------------------------------------------------
# Why tl.sum and not tl.dot

def draw_dot_padding(block_n: int = 16, block_k: int = 16, min_dim: int = 16, *,
                     read_tbps: float | None = None, matmul_tflops: float | None = None,
                     itemsize: int = 2, measured_tflops: float | None = None):
    """Left: a tensor-core tile fed one token row (the rest padding). Right: the roofline of tiles.

    Right panel: a ``[BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N]`` tile does ``2 BM BN BK`` FLOPs on
    ``itemsize (BM BK + BK BN)`` bytes it loads; with the weights shared by BM rows the
    intensity grows with BM, and the attainable rate is ``min(matmul, intensity x bandwidth)``.
    ``read_tbps`` and ``matmul_tflops`` default to the committed H200 run's ceilings
    (:func:`moe_tutorial.perf.results.committed_ceilings`). ``measured_tflops``: Part 3's measured
    peak, drawn at BLOCK_M = 1 above the HBM-only line it beats (its repeated reads come from the caches).
    """
    if read_tbps is None or matmul_tflops is None:
        read, matmul = committed_ceilings()
        read_tbps, matmul_tflops = read_tbps or read, matmul_tflops or matmul
    fig, (ax, ax_r) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1.2, 1]})
    for r in range(min_dim):
        for k in range(block_k):
            real = r == 0
            cell(ax, k, r, "#ffd92f" if real else PADDING_COLOR, hatch=None if real else "///")
    for k in range(block_k):
        for n in range(block_n):
            cell(ax, block_k + 2 + n, k, expert_color(0))
    ax.text(block_k / 2, min_dim + 0.6, f"x tile [{min_dim}, {block_k}]:\n1 token row, {min_dim - 1} rows of padding",
            ha="center", va="top", fontsize=8)
    ax.text(block_k + 2 + block_n / 2, min_dim + 0.6, f"weight tile [{block_k}, {block_n}]", ha="center", va="top",
            fontsize=8)
    ax.text(block_k + 1, min_dim / 2, "@", ha="center", va="center", fontsize=14)
    ax.set_title(f"tl.dot needs every dimension >= {min_dim}:\nwith BLOCK_M = 1, "
                 f"{min_dim - 1}/{min_dim} of the work is padding", fontsize=9)
    _frame(ax, 2 * block_k + 2 + block_n, min_dim + 2.5)

    bms = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    bn, bk = 128, 64
    rates = []
    for bm in bms:
        flops = 2.0 * bm * bn * bk
        nbytes = itemsize * (bm * bk + bk * bn)
        rates.append(min(matmul_tflops, traffic.arithmetic_intensity(nbytes, flops) * read_tbps))
    ax_r.plot(bms, rates, marker="o", color=impl_color("sorted"), label="attainable if every tile load comes from HBM")
    ax_r.axhline(matmul_tflops, ls="--", color="black", lw=1.0, label=f"bf16 matmul {matmul_tflops:g} TFLOP/s")
    ax_r.scatter([1], [rates[0]], s=80, color=impl_color("fused"), zorder=5,
                 label=f"BLOCK_M = 1 from HBM alone: {rates[0]:.1f} TFLOP/s")
    if measured_tflops is not None:
        ax_r.scatter([1], [measured_tflops], s=90, marker="*", color="black", zorder=6,
                     label=f"Part 3 measured: {measured_tflops:.1f} TFLOP/s (repeats served by L2 and L1)")
    ax_r.set_xscale("log", base=2)
    ax_r.set_yscale("log")
    ax_r.set_xlabel("BLOCK_M (token rows sharing each weight tile)")
    ax_r.set_ylabel("TFLOP/s")
    ax_r.set_title(f"tile [BLOCK_M, {bk}] x [{bk}, {bn}] on an H200 ({read_tbps:.2f} TB/s)", fontsize=9)
    ax_r.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, 0.92))   # below the matmul roof, above the data
    ax_r.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------
# What fusion bought: bytes

def draw_traffic(models=HEADLINE_MODELS, Ms=BATCH_SIZES, itemsize: int = 2):
    """Bytes to and from HBM of the first GEMM against M, one panel per model (bf16).

    Part 2 (gather, write ``selected``, read it back: :func:`moe_tutorial.perf.traffic.indexing_bytes`),
    Part 3 (every pair's gather straight into the program: ``traffic.per_pair_bytes``), and the
    fewest bytes possible (each touched expert once, ``traffic.first_gemm_bytes``). By default
    the models and batch sizes the GPU benchmark measures.
    """
    fig, axes = plt.subplots(1, len(models), figsize=(4.1 * len(models), 3.6), squeeze=False)
    for ax, name in zip(axes[0], models):
        s = get_shape(name)
        N, K = s.first_gemm
        lines = {
            "Part 2: indexing": ([traffic.indexing_bytes(M, N, K, s.topk, itemsize) for M in Ms],
                                 impl_color("indexing")),
            "Part 3: fused kernel": ([traffic.per_pair_bytes(M, N, K, s.topk, itemsize) for M in Ms],
                                     impl_color("fused")),
            "fewest possible": ([traffic.first_gemm_bytes(M, N, K, s.num_experts, s.topk, itemsize) for M in Ms],
                                "black"),
        }
        for label, (values, color) in lines.items():
            ax.plot(Ms, [v / 1e9 for v in values], marker="o", ms=3, color=color, label=label,
                    ls="--" if color == "black" else "-")
        m_axis(ax, Ms)
        ax.set_yscale("log")
        ax.set_title(f"{name} (E={s.num_experts}, topk={s.topk})", fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
    axes[0][0].set_ylabel("GB moved (bf16)")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("first GEMM: bytes to and from HBM", fontsize=10)
    fig.tight_layout()
    return fig
