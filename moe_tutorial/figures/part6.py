"""Figures for Part 6 (notebook 06): memory per GPU, how the weights are split, who sends which rows where, the
count table, and the cost model against the two-GPU measurements.

The drawing functions take plain tensors or rows and return the matplotlib Figure; the notebook
calls ``plt.show()``. Nothing here needs a process group: the pictures recompute each rank's
sends with the same functions dispatch uses.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.patches import Patch

from ..parallel.cost import Machine, predict
from ..parallel.dispatch import destinations, send_order
from ..parallel.memory import H200_MEMORY_GB
from ..parallel.results import calibration, ok_rows
from ..shapes import BATCH_SIZES, ModelShape
from .cells import cell
from .style import expert_color, m_axis

#: One colour per rank, distinct from the expert colours' first entries.
RANK_COLORS = ["#1f3b73", "#b5651d", "#2f6e3a", "#7a2e6b", "#555555", "#8c564b", "#17becf", "#bcbd22"]


def rank_color(r: int) -> str:
    return RANK_COLORS[int(r) % len(RANK_COLORS)]


# --------------------------------------------------------------------------------------
# Why shard: memory per GPU
# --------------------------------------------------------------------------------------

def plot_memory(table: list[dict], world_sizes=(1, 2, 4, 8), limit_gb: float = H200_MEMORY_GB):
    """Bars of expert weights per GPU (GB, log scale) for each model and world size, with one GPU's memory.

    ``table``: rows of :func:`moe_tutorial.parallel.memory.memory_table`.
    """
    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    width = 0.8 / len(world_sizes)
    x = np.arange(len(table))
    for i, w in enumerate(world_sizes):
        values = [row[w] for row in table]
        bars = ax.bar(x + (i - (len(world_sizes) - 1) / 2) * width, values, width, label=f"{w} GPU{'s' * (w > 1)}",
                      color=plt.cm.Blues(0.35 + 0.6 * i / max(1, len(world_sizes) - 1)))
        for bar, v in zip(bars, values):
            if v > limit_gb:
                bar.set_hatch("//")
                bar.set_edgecolor("#b22222")
    ax.axhline(limit_gb, color="#b22222", ls="--", lw=1)
    ax.text(-0.45, limit_gb * 1.1, f"one H200: {limit_gb:.0f} GB", color="#b22222", ha="left", fontsize=8)
    ax.set_xticks(x, [f"{row['model']}\n(E={row['experts']})" for row in table], fontsize=8)
    ax.set(yscale="log", ylabel="GB of expert weights per GPU (bf16)",
           title="All routed experts of a model, split evenly over the GPUs\n(hatched: more than one GPU holds)")
    ax.legend(fontsize=8, ncol=len(world_sizes), loc="upper center")
    ax.grid(True, axis="y", which="major", alpha=0.3)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------
# Expert parallel against tensor parallel: who holds which weights
# --------------------------------------------------------------------------------------

def plot_weight_split(num_experts: int = 4, world: int = 2, inter_cells: int = 4):
    """Each expert's w13 as a bar of ``inter_cells`` column groups, coloured by the rank holding it.

    Left, expert parallel: whole experts per rank. Right, tensor parallel: every rank holds
    ``1 / world`` of every expert's columns.
    """
    per = num_experts // world
    cols_per_rank = inter_cells // world
    fig, axes = plt.subplots(1, 2, figsize=(8.5, 0.55 * num_experts + 1.4))
    for ax, mode in zip(axes, ("expert parallel", "tensor parallel")):
        for e in range(num_experts):
            y = num_experts - 1 - e
            for c in range(inter_cells):
                owner = e // per if mode == "expert parallel" else c // cols_per_rank
                cell(ax, c, y, rank_color(owner), f"r{owner}", edge="white", lw=1.5, text_color="white", fontsize=8)
            ax.text(-0.2, y + 0.5, f"expert {e}", ha="right", va="center", fontsize=8)
        ax.set_xlim(-1.6, inter_cells)
        ax.set_ylim(-0.6, num_experts)
        ax.set_axis_off()
        what = "E / world whole experts each" if mode == "expert parallel" else "I / world columns of every expert"
        ax.set_title(f"{mode}: {what}", fontsize=9)
        ax.text(inter_cells / 2, -0.35, "intermediate columns of the expert ->", ha="center", fontsize=7)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------
# Dispatch and combine: who sends which rows where
# --------------------------------------------------------------------------------------

def exchange(ids_per_rank: list[torch.Tensor], experts_per_rank: int):
    """What each rank sends and receives, worked out with dispatch's own functions, without processes.

    Returns ``(sends, recvs)``: ``sends[r]`` lists rank r's pairs in sending order as
    ``(m, j, expert, destination)``; ``recvs[d]`` lists what rank d receives, in order, as
    ``(source, position in the source's send list)``.
    """
    world = len(ids_per_rank)
    sends = []
    for ids in ids_per_rank:
        topk = ids.shape[1]
        dest = destinations(ids, experts_per_rank)
        order, _ = send_order(dest, world)
        flat = ids.reshape(-1).tolist()
        sends.append([(p // topk, p % topk, flat[p], int(dest[p])) for p in order.tolist()])
    recvs = [[(s, i) for s in range(world) for i, item in enumerate(sends[s]) if item[3] == d] for d in range(world)]
    return sends, recvs


def plot_all_to_all(ids_per_rank: list[torch.Tensor], experts_per_rank: int, *, combine: bool = False):
    """Dispatch (or combine) drawn: each rank's send buffer on top, its receive buffer below, a line per row.

    Cells are ``(token m, slot j)`` pairs labelled ``m,j``, coloured by their expert. Top row of
    rank r: its pairs grouped by destination (what dispatch's permutation makes). Bottom row of
    rank d: the rows it receives, rank 0's first. With ``combine=True`` the arrows point back up:
    the experts' output rows return to the sender, to the same slots.
    """
    world = len(ids_per_rank)
    sends, recvs = exchange(ids_per_rank, experts_per_rank)
    width = max(max(len(s), len(r)) for s, r in zip(sends, recvs))
    gap = 1.5
    top, bottom = 3.2, 0.0
    fig, ax = plt.subplots(figsize=(max(7.0, 0.42 * world * (width + gap) + 1.5), 3.6))
    where = {}
    for r in range(world):
        x0 = r * (width + gap)
        held = f"experts {r * experts_per_rank}-{(r + 1) * experts_per_rank - 1}"
        ax.text(x0 + width / 2, top + 1.55, f"rank {r} ({held})", ha="center", fontsize=9, color=rank_color(r),
                fontweight="bold")
        for i, (m, j, e, d) in enumerate(sends[r]):
            cell(ax, x0 + i, top, expert_color(e), f"{m},{j}", edge="white", lw=1.0)
        _brackets(ax, x0, top + 1.05, [item[3] for item in sends[r]], "from r{}" if combine else "to r{}")
        for i, (s, k) in enumerate(recvs[r]):
            m, j, e, _ = sends[s][k]
            cell(ax, x0 + i, bottom, expert_color(e), f"{m},{j}", edge="white", lw=1.0)
            where[(s, k)] = x0 + i
        _brackets(ax, x0, bottom - 0.1, [s for s, _ in recvs[r]], "to r{}" if combine else "from r{}", below=True)
        if not recvs[r]:
            ax.text(x0 + width / 2, bottom + 0.5, "receives nothing", ha="center", va="center", fontsize=8,
                    color="#777777")
    for s in range(world):
        for k, (_, _, _, d) in enumerate(sends[s]):
            x_send, x_recv = s * (width + gap) + k + 0.5, where[(s, k)] + 0.5
            start, end = ((x_recv, bottom + 1), (x_send, top)) if combine else ((x_send, top), (x_recv, bottom + 1))
            ax.annotate("", xy=end, xytext=start, arrowprops=dict(arrowstyle="->", lw=0.7,
                                                                  color=rank_color(s if not combine else d),
                                                                  alpha=0.35 if s == d else 0.8))
    ax.text(-0.4, top + 0.5, "sent" if not combine else "back,\nin slot order", ha="right", va="center", fontsize=8)
    ax.text(-0.4, bottom + 0.5, "received" if not combine else "expert outputs", ha="right", va="center", fontsize=8)
    experts = sorted({e for s in sends for _, _, e, _ in s})
    ax.legend(handles=[Patch(color=expert_color(e), label=f"expert {e}") for e in experts], fontsize=7,
              ncol=min(8, len(experts)), loc="upper center", bbox_to_anchor=(0.5, -0.02), frameon=False)
    ax.set_xlim(-2.2, world * (width + gap))
    ax.set_ylim(bottom - 1.0, top + 2.0)
    ax.set_axis_off()
    ax.set_title("combine: every output row goes back to the rank that sent it (faint: stays on its rank)"
                 if combine else "dispatch: every (token, slot) row goes to the rank of its expert "
                 "(faint: stays on its rank)", fontsize=10)
    fig.tight_layout()
    return fig


def _brackets(ax, x0: float, y: float, groups: list[int], label: str, below: bool = False) -> None:
    """A line and a label over each run of equal values in ``groups`` (the rows for one rank)."""
    start = 0
    for i in range(1, len(groups) + 1):
        if i == len(groups) or groups[i] != groups[start]:
            g = groups[start]
            ax.plot([x0 + start + 0.1, x0 + i - 0.1], [y, y], color=rank_color(g), lw=2)
            ax.text(x0 + (start + i) / 2, y + (-0.15 if below else 0.12), label.format(g), ha="center",
                    va="top" if below else "bottom", fontsize=7, color=rank_color(g))
            start = i


def plot_counts(counts: torch.Tensor, row_bytes: int | None = None):
    """The ``[world, world]`` count table every rank learns in dispatch: rows sent from each rank to each rank.

    The diagonal stays on its rank (a local copy); the rest crosses the link. With ``row_bytes``,
    each cell also shows the bytes it moves.
    """
    counts = counts.cpu()
    world = counts.shape[0]
    fig, ax = plt.subplots(figsize=(1.2 * world + 2.2, 1.0 * world + 1.3))
    ax.imshow(counts.numpy(), cmap="Blues", vmin=0, vmax=max(1, int(counts.max())) * 1.6)
    for s in range(world):
        for d in range(world):
            text = str(int(counts[s, d])) + (f"\n{int(counts[s, d]) * row_bytes} B" if row_bytes else "")
            ax.text(d, s, text, ha="center", va="center", fontsize=9,
                    fontweight="normal" if s == d else "bold", color="#555555" if s == d else "black")
    ax.set_xticks(range(world), [f"to r{d}" for d in range(world)])
    ax.set_yticks(range(world), [f"from r{s}" for s in range(world)])
    ax.tick_params(length=0)
    ax.set_title("rows per (sender, receiver)\n(diagonal: stays local)", fontsize=9)
    fig.tight_layout()
    return fig


# --------------------------------------------------------------------------------------
# The cost model, and the measurements
# --------------------------------------------------------------------------------------

def plot_comm_share(shapes: list[ModelShape], machines: dict[str, Machine], world: int = 2, sizes=BATCH_SIZES):
    """Predicted share of the expert-parallel layer spent in dispatch and combine, against M per rank.

    One panel per model, one line per machine (e.g. the same link with different latencies).
    Near 1 the all-to-all dominates; near 0 it is small next to the experts' work.
    """
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.2 * len(shapes), 3.4), squeeze=False, sharey=True)
    Ms = np.unique(np.round(np.logspace(0, np.log2(max(sizes)), 120, base=2)))
    for ax, shape in zip(axes[0], shapes):
        for i, (label, machine) in enumerate(machines.items()):
            ax.plot(Ms, [predict(m, shape, world, machine)["ep_comm_share"] for m in Ms], color=f"C{i}", label=label)
        ax.set(title=f"{shape.name} on {world} GPUs", ylim=(0, 1), ylabel="share of the layer in dispatch + combine")
        m_axis(ax, sizes)
        ax.set_xlabel("tokens per rank M")
        ax.grid(True, alpha=0.3)
    axes[0][-1].legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig


def plot_steps_vs_bytes(rows: list[dict], models: list[str], machine: Machine):
    """Measured dispatch, combine and plain all-to-all times against the bytes one rank sent over the
    link, with the model's ``latency + bytes / bandwidth`` (the link measured in the same run)."""
    fig, ax = plt.subplots(figsize=(6.6, 4.0))
    markers = {"dispatch": "o", "combine": "s", "a2a_same_bytes": "^"}
    seen = []
    for i, model in enumerate(models):
        for step, marker in markers.items():
            pts = sorted((r["bytes"], r["ms"]) for r in ok_rows(rows, model=model, step=step) if r["bytes"])
            if pts:
                b, t = zip(*pts)
                seen += b
                ax.plot(b, np.array(t) * 1e3, marker=marker, ls="-", lw=0.8, color=f"C{i}", ms=4,
                        label=f"{model}: {step.replace('_', ' ')}")
    lo, hi = (min(seen) / 2, max(seen) * 2) if seen else (1e3, 1e10)
    b = np.logspace(np.log10(lo), np.log10(hi), 50)
    ax.plot(b, (machine.latency_us * 1e-6 + b / (machine.link_gbps * 1e9)) * 1e6, "k--", lw=1,
            label=f"one collective: {machine.latency_us:.0f} us + bytes / {machine.link_gbps:.0f} GB/s")
    ax.set(xscale="log", yscale="log", xlabel="bytes one rank sends to the other ranks", ylabel="time (us)",
           title="Dispatch and combine against a plain all-to-all of the same bytes")
    ax.legend(fontsize=7)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_layer_throughput(rows: list[dict], models: list[str], machine: Machine, world: int = 2):
    """Tokens per second of the whole layer against M per rank: one GPU running all ``world * M``
    tokens, the expert-parallel and the tensor-parallel layer on ``world`` GPUs; dashed, the model
    fitted to the measurements (:func:`moe_tutorial.parallel.results.calibration`), dotted, the
    ideal one (link latency and bandwidth, the roofline floor)."""
    fig, axes = plt.subplots(1, len(models), figsize=(4.6 * len(models), 3.6), squeeze=False)
    steps = {"single_gpu": ("one GPU", "single"), "ep_layer": ("expert parallel", "ep"),
             "tp_layer": ("tensor parallel", "tp")}
    for ax, model in zip(axes[0], models):
        sizes = sorted({r["M"] for r in ok_rows(rows, model=model, step="ep_layer")})
        shape = None
        for i, (step, (label, key)) in enumerate(steps.items()):
            pts = sorted((r["M"], r["ms"]) for r in ok_rows(rows, model=model, step=step))
            if not pts:
                continue
            r0 = ok_rows(rows, model=model, step=step)[0]
            shape = ModelShape(model, r0["E"], r0["topk"], r0["K"], r0["I"])
            M, ms = (np.array(v, dtype=float) for v in zip(*pts))
            fit = calibration(rows, model, machine)
            ax.plot(M, world * M / (ms * 1e-3), "o-", color=f"C{i}", ms=4, label=label)
            ax.plot(M, [world * m / predict(m, shape, world, machine, calibration=fit)[key] for m in M], "--",
                    color=f"C{i}", lw=0.9)
            ax.plot(M, [world * m / predict(m, shape, world, machine)[key] for m in M], ":", color=f"C{i}", lw=0.8)
        ax.set(yscale="log", ylabel="tokens per second (all ranks)", title=model)
        m_axis(ax, sizes)
        ax.set_xlabel("tokens per rank M")
        ax.grid(True, which="major", alpha=0.3)
        if shape is None:
            ax.text(0.5, 0.5, "no measurements", transform=ax.transAxes, ha="center", color="#777777")
        else:
            ax.legend(fontsize=7, title="measured (dashed: model fitted,\ndotted: ideal model)", title_fontsize=7)
    fig.tight_layout()
    return fig
