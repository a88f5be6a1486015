"""Figures for Part 2: the gather ``weight[topk_ids]``, the size of what it makes, the round trip.

Each function draws one figure from plain tensors or numbers and returns the matplotlib
Figure; the notebook calls ``plt.show()``.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import FancyArrowPatch, Rectangle

from .args import check_ids_below, fail, id_rows
from .cells import box, cell
from .style import expert_color, impl_color

#: HBM of one H200, the GPU the series measures on (141 GB).
H200_MEMORY_BYTES = 141e9
#: Streaming multiprocessors of an H200 (GH100 as in the H100 SXM).
H200_SMS = 132
#: The H200's memory on chip, in bytes: per SM a 256 KiB register file and 256 KiB of L1 cache and
#: shared memory (one pool), and a 50 MiB L2 cache that all SMs share.
H200_ON_CHIP_BYTES = {"registers": H200_SMS * 256 * 1024, "L1 and shared memory": H200_SMS * 256 * 1024,
                      "L2": 50 * 1024 * 1024}


def on_chip_text() -> str:
    """The H200's on-chip memory in words: "about 116 MB: registers 33, L1 and shared memory 33, L2 50"."""
    mib = {k: v / 2**20 for k, v in H200_ON_CHIP_BYTES.items()}
    return (f"about {sum(mib.values()):.0f} MB: " + ", ".join(f"{k} {v:.0f}" for k, v in mib.items()))


def format_bytes(n: float) -> str:
    """``1536 -> '1.5 kB'``: decimal units (kB, MB, GB, TB), as GPU memory is quoted."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def draw_gather(topk_ids: torch.Tensor, num_experts: int):
    """``selected = weight[topk_ids]``: every (token, slot) gets its own copy of an expert's matrix.

    Left, ``weight [E, N, K]``, one block per expert. Right, ``selected [M, topk, N, K]``, one
    block per (token, slot), joined to the expert it copies. An expert chosen twice is copied
    twice; an expert nobody chose is not copied at all.
    """
    ids = id_rows("topk_ids", topk_ids)
    check_ids_below("topk_ids", ids, num_experts)
    M, topk = len(ids), len(ids[0])
    rows = max(M * topk, num_experts)
    fig, ax = plt.subplots(figsize=(7.5, 0.55 * rows + 1.0))

    def ys(n):
        return [rows - (i + 0.5) * rows / n for i in range(n)]

    ey, py = ys(num_experts), ys(M * topk)
    used = {e for row in ids for e in row}
    for e in range(num_experts):
        cell(ax, 0, ey[e] - 0.35, expert_color(e), f"weight[{e}]", w=1.4, h=0.7, edge="white", lw=1.0, fontsize=8,
             alpha=1.0 if e in used else 0.35)
    for m in range(M):
        for j in range(topk):
            e, y = ids[m][j], py[m * topk + j]
            ax.add_patch(FancyArrowPatch((1.45, ey[e]), (3.95, y), arrowstyle="-|>", mutation_scale=9,
                                         color=expert_color(e), lw=1.2, shrinkA=0, shrinkB=0))
            cell(ax, 4, y - 0.35, expert_color(e), f"copy of [{e}]", w=1.4, h=0.7, edge="white", lw=1.0, fontsize=8)
            ax.text(5.55, y, f"selected[{m}, {j}]", ha="left", va="center", fontsize=8)
    ax.text(0.7, rows + 0.15, "weight [E, N, K]", ha="center", fontsize=10)
    ax.text(4.7, rows + 0.15, "selected [M, topk, N, K]", ha="center", fontsize=10)
    ax.text(2.7, rows + 0.15, "weight[topk_ids]", ha="center", fontsize=9, color="#666666")
    ax.set_xlim(-0.2, 7.2)
    ax.set_ylim(-0.2, rows + 0.6)
    ax.axis("off")
    return fig


def plot_intermediate_sizes(tokens: list[int], sizes: dict[str, list[float]], capacity: float = H200_MEMORY_BYTES,
                            mark: tuple[str, int] | None = None):
    """Bytes of ``selected`` against the number of tokens M, one line per model, log-log.

    Args:
        tokens: the M values. sizes: model name -> bytes at each M.
        capacity: a horizontal line for the GPU's whole memory (default: one H200).
        mark: ``(model, M)`` to point at with its size, e.g. ``("Mixtral-8x7B", 64)``.
    """
    for name, values in sizes.items():
        if len(values) != len(tokens):
            fail(ValueError, f"sizes[{name!r}]", f"one size per M of tokens ({len(tokens)})", f"{len(values)}")
    if mark is not None:
        if mark[0] not in sizes:
            fail(ValueError, "mark", f"(model, M) with a model of sizes ({', '.join(sizes)})", repr(mark[0]))
        if mark[1] not in tokens:
            fail(ValueError, "mark", f"(model, M) with an M of tokens ({tokens[0]} ... {tokens[-1]})", mark[1])
    fig, ax = plt.subplots(figsize=(7.5, 4))
    # Models with the same topk * N * K (Mixtral-8x7B, DeepSeek-V3 and Kimi-K2) have the same
    # curve: one line, named for all of them, rather than lines hidden under each other.
    same: dict[tuple, list[str]] = {}
    for name, values in sizes.items():
        same.setdefault(tuple(values), []).append(name)
    styles = [("o", "-"), ("s", "--"), ("^", "-."), ("v", ":"), ("D", (0, (5, 1)))]
    for i, (values, names) in enumerate(same.items()):
        marker, ls = styles[i % len(styles)]
        label = " = ".join(names) + (" (same topk x N x K)" if len(names) > 1 else "")
        ax.plot(tokens, values, marker=marker, ls=ls, ms=4, lw=1.5, label=label, mfc="none")
    ax.axhline(capacity, color="#333333", ls="--", lw=1)
    ax.text(tokens[0], capacity * 1.4, f"all of an H200's memory ({format_bytes(capacity)})", fontsize=8)
    if mark is not None:
        name, m = mark
        value = sizes[name][tokens.index(m)]
        ax.annotate(f"{name}, M = {m}: {format_bytes(value)}", (m, value), xytext=(m * 6, value / 40),
                    fontsize=8, arrowprops=dict(arrowstyle="->", color="#333333"))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens M")
    ax.set_ylabel("bytes of weight[topk_ids] (bf16)")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def _trip(ax, x0, x1, text, color, *, read: bool):
    """An arrow from the HBM band (top) down to an SRAM box (bottom) if ``read``, else back up."""
    hbm, sram = 2.05, 0.92
    start, end = ((x0, hbm), (x1, sram)) if read else ((x0, sram), (x1, hbm))
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, color=color, lw=2,
                                 shrinkA=0, shrinkB=0))
    ax.text(max(x0, x1) + 0.1, 1.5, text, ha="left", va="center", fontsize=8, color=color)


#: The arrows of :func:`draw_round_trip` that can carry a label.
ROUND_TRIP_LABELS = ("gather", "write", "read_back", "out", "fused")


def draw_round_trip(labels: dict[str, str] | None = None):
    """HBM -> SRAM -> HBM -> SRAM: Part 2's two kernels against one fused kernel.

    Top panel, Part 2: the indexing kernel reads the chosen weights into on-chip SRAM and writes
    ``selected`` back to HBM; the matmul kernel reads ``selected`` in again. Bottom panel, what
    Part 3 will do: one kernel reads each weight tile straight into SRAM and multiplies it there.

    Args:
        labels: optional byte counts shown on the arrows, keys ``"gather"``, ``"write"``,
            ``"read_back"``, ``"out"``, ``"fused"`` (e.g. from :func:`format_bytes`).
    """
    labels = labels or {}
    unknown = sorted(set(labels) - set(ROUND_TRIP_LABELS))
    if unknown:
        fail(ValueError, "labels", f"keys among {', '.join(ROUND_TRIP_LABELS)}", ", ".join(unknown))

    def tag(key):
        return f"\n{labels[key]}" if key in labels else ""

    red, blue, grey = impl_color("indexing"), impl_color("sorted"), "#777777"
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 5.4))
    for ax, title in ((top, "Part 2: weight[topk_ids], then torch.matmul (two kernels)"),
                      (bottom, "Part 3: one fused kernel (the gather happens inside it)")):
        ax.add_patch(Rectangle((0, 2.05), 11.4, 0.7, facecolor="#f2f2f2", edgecolor="#999999"))
        ax.text(0.1, 2.4, "HBM", ha="left", va="center", fontsize=10, weight="bold")
        ax.text(0.1, 0.55, "on-chip\nSRAM", ha="left", va="center", fontsize=9, color="#666666")
        ax.set_title(title, fontsize=10, loc="left")
        ax.set_xlim(0, 11.4)
        ax.set_ylim(0, 2.85)
        ax.axis("off")
    # Part 2: weight and x live in HBM; selected is written there between the two kernels.
    box(top, 1.4, 2.4, 1.2, 0.5, "weight, x", "white", fontsize=8)
    box(top, 4.6, 2.4, 1.4, 0.5, "selected", "#fbd5d5", fontsize=8)
    box(top, 10.3, 2.4, 1.0, 0.5, "out", "white", fontsize=8)
    box(top, 2.4, 0.55, 1.9, 0.7, "index kernel", "#e8f1fa", fontsize=8)
    box(top, 7.2, 0.55, 1.9, 0.7, "matmul kernel", "#e8f1fa", fontsize=8)
    _trip(top, 1.5, 1.8, "① read the chosen\n    weights" + tag("gather"), grey, read=True)
    _trip(top, 3.1, 4.1, "② write selected" + tag("write"), red, read=False)
    _trip(top, 5.2, 6.6, "③ read selected\n    back" + tag("read_back"), red, read=True)
    _trip(top, 7.9, 9.9, "④ write out" + tag("out"), grey, read=False)
    # Part 3: weight tiles go straight into SRAM and are used there.
    box(bottom, 1.4, 2.4, 1.2, 0.5, "weight, x", "white", fontsize=8)
    box(bottom, 10.3, 2.4, 1.0, 0.5, "out", "white", fontsize=8)
    box(bottom, 5.2, 0.55, 3.4, 0.7, "fused kernel: gather + multiply", "#e8f1fa", fontsize=8)
    _trip(bottom, 1.6, 3.9, "① read weight tiles\n    by expert id" + tag("fused"), blue, read=True)
    _trip(bottom, 6.6, 9.9, "② write out" + tag("out"), grey, read=False)
    fig.tight_layout()
    return fig
