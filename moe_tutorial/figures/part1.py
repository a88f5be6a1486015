"""Figures for Part 1: what an MoE layer is, the expert view of routing, launches against E.

Each function draws one figure from plain tensors or numbers and returns the matplotlib
Figure; the notebook calls ``plt.show()``.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.patches import Rectangle

from .args import check_ids_below, check_int, check_same_shape, fail, id_rows
from .cells import arrow, box, cell
from .style import expert_color, impl_color

_GREY = "#d9d9d9"


def draw_routing(topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int):
    """Tokens go to their top-k experts; each output is the weighted sum of what came back.

    Lines from a token to an expert are its (token, slot) pairs, in the expert's colour; lines
    from an expert to an output are as wide as the router weight, and each output spells out
    its sum (``E4`` is expert 4 applied to that token). Experts no token chose stay grey.

    Args:
        topk_ids: ``[M, topk]`` int expert ids. topk_weights: ``[M, topk]`` float.
        num_experts: E, the number of expert boxes drawn.
    """
    ids = id_rows("topk_ids", topk_ids)
    check_ids_below("topk_ids", ids, num_experts)
    check_same_shape("topk_weights", topk_weights, "topk_ids", topk_ids)
    weights = topk_weights.float().cpu().tolist()
    M = len(ids)
    used = {e for row in ids for e in row}
    height = max(M, num_experts)
    fig, ax = plt.subplots(figsize=(8.5, 0.5 * height + 1.0))

    def rows(n):
        return [height - (i + 0.5) * height / n for i in range(n)]

    ty, ey = rows(M), rows(num_experts)
    xt, xe, xo = 0.0, 3.0, 6.0
    for m, row in enumerate(ids):
        for j, e in enumerate(row):
            c = expert_color(e)
            ax.plot([xt + 0.5, xe - 0.5], [ty[m], ey[e]], color=c, lw=1.5, alpha=0.8, zorder=1)
            ax.plot([xe + 0.5, xo - 0.6], [ey[e], ty[m]], color=c, lw=0.8 + 5 * weights[m][j], alpha=0.75,
                    solid_capstyle="butt", zorder=1)
    for m in range(M):
        box(ax, xt, ty[m], 1.0, 0.6, f"x{m}", "#f7f7f7")
        terms = " + ".join(f"{weights[m][j]:.2f}·E{e}" for j, e in enumerate(ids[m]))
        box(ax, xo + 0.6, ty[m], 2.4, 0.6, f"y{m} = {terms}", "#f7f7f7", fontsize=8)
    for e in range(num_experts):
        box(ax, xe, ey[e], 1.0, 0.6, f"expert {e}", expert_color(e) if e in used else _GREY)
    top = height + 0.1
    ax.text(xt, top, "tokens", ha="center", fontsize=10)
    ax.text((xt + xe) / 2, top, "top-k routing", ha="center", fontsize=10)
    ax.text(xe, top, "experts", ha="center", fontsize=10)
    ax.text((xe + xo) / 2, top, "router weights", ha="center", fontsize=10)
    ax.text(xo + 0.6, top, "weighted sums", ha="center", fontsize=10)
    ax.set_xlim(-0.7, 8.0)
    ax.set_ylim(-0.1, height + 0.5)
    ax.axis("off")
    return fig


def plot_router(probs: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor):
    """One panel per token: softmax probabilities over experts, the kept top-k in colour.

    Above each kept bar, its renormalised weight (what the layer multiplies by).

    Args:
        probs: ``[M, E]`` softmax of the router logits. topk_ids, topk_weights: ``[M, topk]``.
    """
    if getattr(probs, "ndim", None) != 2:
        fail(ValueError, "probs", "a 2-D [M, E] tensor of probabilities", f"shape {tuple(getattr(probs, 'shape', ()))}")
    probs = probs.float().cpu()
    M, E = probs.shape
    ids = id_rows("topk_ids", topk_ids)
    if len(ids) != M:
        fail(ValueError, "topk_ids", f"one row per token of probs (M = {M})", f"{len(ids)} rows")
    check_ids_below("topk_ids", ids, E)
    check_same_shape("topk_weights", topk_weights, "topk_ids", topk_ids)
    fig, axes = plt.subplots(1, M, figsize=(2.4 * M, 2.4), sharey=True, squeeze=False)
    for m, ax in enumerate(axes[0]):
        chosen = dict(zip(topk_ids[m].tolist(), topk_weights[m].float().tolist()))
        colors = [expert_color(e) if e in chosen else _GREY for e in range(E)]
        ax.bar(range(E), probs[m].tolist(), color=colors)
        for e, w in chosen.items():
            ax.text(e, probs[m, e].item() + 0.02, f"{w:.2f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(E))
        ax.set_xlabel("expert")
        ax.set_title(f"token {m}")
    axes[0][0].set_ylabel("softmax probability")
    axes[0][0].set_ylim(0, 1.1)
    fig.suptitle("router: softmax over experts, keep the top-k (colour), renormalise (labels)", fontsize=10)
    fig.tight_layout()
    return fig


def draw_gated_mlp():
    """One expert: ``w2 (silu(w1 x) * (w3 x))``, with the shape of every arrow.

    w1 and w3 are stored stacked as one ``w13 [2I, K]`` so a single GEMM gives both halves.
    """
    fig, ax = plt.subplots(figsize=(9, 2.6))
    box(ax, 0, 1, 0.9, 0.6, "x\n[K]", "#f7f7f7")
    box(ax, 2, 1.8, 1.3, 0.6, "w1 (gate)\n[I, K]", "#fde0c5")
    box(ax, 2, 0.2, 1.3, 0.6, "w3 (up)\n[I, K]", "#fde0c5")
    box(ax, 4, 1.8, 0.9, 0.6, "SiLU", "#e8f1fa")
    box(ax, 5.6, 1.0, 0.6, 0.6, "×", "#e8f1fa", fontsize=12)
    box(ax, 7.2, 1.0, 1.3, 0.6, "w2 (down)\n[K, I]", "#fde0c5")
    box(ax, 8.9, 1.0, 0.9, 0.6, "out\n[K]", "#f7f7f7")
    arrow(ax, (0.45, 1.15), (1.35, 1.75))
    arrow(ax, (0.45, 0.85), (1.35, 0.25))
    arrow(ax, (2.65, 1.8), (3.55, 1.8), text="[I]")
    arrow(ax, (4.45, 1.8), (5.3, 1.2), text="[I]", text_offset=(0.15, 0.1))
    arrow(ax, (2.65, 0.2), (5.3, 0.8), text="[I]", text_offset=(0.0, -0.2))
    arrow(ax, (5.9, 1.0), (6.55, 1.0), text="[I]")
    arrow(ax, (7.85, 1.0), (8.45, 1.0), text="[K]")
    ax.add_patch(Rectangle((1.25, -0.25), 1.5, 2.5, fill=False, ls="--", ec="#999999"))
    ax.text(2.0, 2.4, "w13 [2I, K]: one GEMM, then silu_and_mul", ha="center", fontsize=8, color="#666666")
    ax.set_xlim(-0.6, 9.5)
    ax.set_ylim(-0.4, 2.6)
    ax.axis("off")
    return fig


def plot_expert_view(topk_ids: torch.Tensor, num_experts: int):
    """The same routing seen two ways.

    Left, the token view: ``topk_ids [M, topk]``, each cell coloured by its expert. Right, the
    expert view the loop walks: for each expert, the ``(m, j)`` pairs of
    ``torch.where(topk_ids == e)``, i.e. the rows of its one small GEMM. Idle experts are grey.
    """
    ids = id_rows("topk_ids", topk_ids)
    check_ids_below("topk_ids", ids, num_experts)
    M, topk = len(ids), len(ids[0])
    pairs = {e: [(m, j) for m in range(M) for j in range(topk) if ids[m][j] == e] for e in range(num_experts)}
    widest = max([len(p) for p in pairs.values()] + [1])
    rows = max(M, num_experts)
    x0 = topk + 3.2                     # where the expert view starts, in cell units
    fig, ax = plt.subplots(figsize=(0.75 * (x0 + widest) + 0.8, 0.6 * rows + 0.9))
    for m in range(M):
        y = rows - 1 - m
        ax.text(-0.15, y + 0.5, f"token {m}", ha="right", va="center", fontsize=9)
        for j in range(topk):
            e = ids[m][j]
            cell(ax, j, y + 0.05, expert_color(e), e, h=0.9, edge="white", lw=2, fontsize=10)
    for j in range(topk):
        ax.text(j + 0.5, rows - 1 - M + 0.75, f"slot {j}", ha="center", va="center", fontsize=8)
    ax.text(topk / 2, rows + 0.25, "token view: topk_ids", ha="center", fontsize=10)
    for e in range(num_experts):
        y = rows - 1 - e
        ax.text(x0 - 0.15, y + 0.5, f"expert {e}", ha="right", va="center", fontsize=9)
        if not pairs[e]:
            cell(ax, x0, y + 0.05, _GREY, "idle", h=0.9, edge="white", lw=1.0, fontsize=8)
        for i, (m, j) in enumerate(pairs[e]):
            cell(ax, x0 + i, y + 0.05, expert_color(e), f"m={m}\nj={j}", h=0.9, edge="white", lw=2)
    ax.text(x0 + widest / 2, rows + 0.25, "expert view: where(topk_ids == e)", ha="center", fontsize=10)
    ax.set_xlim(-1.6, x0 + widest + 0.1)
    ax.set_ylim(-0.5 if M >= num_experts else 0, rows + 0.6)
    ax.set_aspect("equal")
    ax.axis("off")
    return fig


def plot_launches(num_experts: list[int], launches: dict[str, list[int]], models: dict[str, int] | None = None):
    """Kernel launches of one layer forward against the number of experts E.

    Args:
        num_experts: the E values measured.
        launches: implementation name -> launches at each E (e.g. ``{"loop": [...], "indexing": [...]}``).
        models: model name -> its E, each marked with a diamond on the loop's line (extended, dashed,
            past the last measured E) so readers see where every real model sits.
    """
    if not num_experts:
        fail(ValueError, "num_experts", "at least one E", "none")
    for e in num_experts:
        check_int("num_experts", e, 1)
    for impl, counts in launches.items():
        if len(counts) != len(num_experts):
            fail(ValueError, f"launches[{impl!r}]", f"one count per E ({len(num_experts)} of them)", f"{len(counts)}")
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    models = dict(sorted((models or {}).items(), key=lambda kv: kv[1]))
    last = max([max(num_experts)] + list(models.values()))
    top = 0.0
    for impl, counts in launches.items():
        # The measured counts (the table above) as points; the straight line through the first and
        # last carries them to every E (dashed past the last measurement), so that every real model
        # can be read off it.
        slope = (counts[-1] - counts[0]) / max(1, num_experts[-1] - num_experts[0])
        line = lambda e, c=counts, k=slope: c[0] + k * (e - num_experts[0])  # noqa: E731
        inside, beyond = np.arange(1, max(num_experts) + 1), np.arange(max(num_experts), last + 1)
        ax.plot(inside, line(inside), "-", color=impl_color(impl), lw=1.2, alpha=0.7)
        ax.plot(beyond, line(beyond), "--", color=impl_color(impl), lw=1.2, alpha=0.7)
        ax.plot(num_experts, counts, "o", color=impl_color(impl), label=f"{impl} (measured)")
        top = max(top, line(last))
        if impl == "loop":
            for i, (name, e) in enumerate(models.items()):
                at = line(e)
                ax.plot([e], [at], "D", color="black", ms=4, zorder=5)
                # Neighbouring names (E = 60 and 64) sit on alternating sides of the line.
                ax.annotate(f"{name}: {at:,.0f}", (e, at), textcoords="offset points", fontsize=7,
                            xytext=(6, -12) if i % 2 else (-6, 8), ha="left" if i % 2 else "right")
    ax.set_xlabel("experts E (every expert has tokens); diamonds: the real models, read off the line")
    ax.set_ylabel("kernel launches per forward")
    ax.set_xlim(0, last * 1.05)
    ax.set_ylim(-0.06 * top, top * 1.15)
    ax.legend(loc="upper left")
    fig.tight_layout()
    return fig
