"""Figures for Part 8: which program owns which tile of dW, what the forward keeps, and an MoE
that learns (its loss, and its experts' load with and without balancing).

Each function takes plain numbers, tensors or :class:`moe_tutorial.training.History` objects and
returns the matplotlib Figure; the notebook calls ``plt.show()``.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from ..kernels.backward_kernel import expert_tile
from .args import check_int
from .cells import cell
from .style import PADDING_COLOR, expert_color


def plot_expert_grad_tiles(counts: list[int], P: int, Q: int, block_p: int, block_q: int, block_m: int,
                           group_m: int = 1):
    """The K-grouped GEMM: for each expert, its run of sorted rows (real rows coloured, padding
    grey; the run's length is this expert's K) beside its ``[P, Q]`` dW cut into tiles, each tile
    labelled with the program that owns it (:func:`moe_tutorial.kernels.backward_kernel.expert_tile`).

    ``counts`` are the pairs each expert received; runs are padded to ``block_m`` rows.
    """
    for name, v in (("P", P), ("Q", Q), ("block_p", block_p), ("block_q", block_q), ("block_m", block_m)):
        check_int(name, v, 1)
    E = len(counts)
    num_p, num_q = -(-P // block_p), -(-Q // block_q)
    runs = [-(-c // block_m) * block_m for c in counts]
    owner = {expert_tile(pid, P, Q, block_p, block_q, group_m): pid for pid in range(E * num_p * num_q)}
    height = max(max(runs), num_p, 1)
    fig, axes = plt.subplots(1, E, figsize=(2.6 * E, 0.32 * height + 1.4), squeeze=False)
    for e, ax in enumerate(axes[0]):
        for r in range(runs[e]):
            real = r < counts[e]
            cell(ax, 0, height - 1 - r, expert_color(e) if real else PADDING_COLOR, "", w=0.8, alpha=0.8 if real else 1)
        if runs[e] == 0:
            ax.text(0.4, height - 0.5, "no rows", ha="center", va="top", fontsize=7, rotation=90)
        for tp in range(num_p):
            for tq in range(num_q):
                pid = owner[(e, tp, tq)]
                cell(ax, 1.6 + tq, height - 1 - tp, "white" if runs[e] else "#f4f4f4", f"{pid}" if runs[e] else
                     f"{pid}\n0", edge="#555555", fontsize=7)
        ax.set_xlim(-0.3, 1.8 + num_q)
        ax.set_ylim(-0.3, height + 0.2)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_title(f"expert {e}: {counts[e]} pairs\nrun of {runs[e]} rows | dW tiles", fontsize=8)
    fig.suptitle("K-grouped GEMM: each program owns one tile of one expert's dW and sums over that expert's run",
                 fontsize=9)
    fig.tight_layout()
    return fig


def plot_saved_bytes(saved: dict[str, float], title: str):
    """Horizontal bars of the bytes in ``saved`` (GB), kept ones dark, the others light: the names
    of what the forward does not keep say so in brackets (as :func:`moe_tutorial.kernels.
    trainable_layer.saved_bytes` names them)."""
    names = list(saved)
    values = np.array([saved[n] / 1e9 for n in names])
    fig, ax = plt.subplots(figsize=(7.0, 0.45 * len(names) + 0.9))
    colors = ["#bbbbbb" if "(" in n else "#4e79a7" for n in names]
    ax.barh(range(len(names)), values, color=colors)
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.2f} GB", va="center", fontsize=8)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("GB")
    ax.set_xlim(0, values.max() * 1.25 if values.max() > 0 else 1)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_training(histories: dict, smooth: int = 10):
    """Left: the loss of each run (log scale). Right: one panel per run, each expert's share of
    the pairs over the steps (a moving average over ``smooth`` steps), the even share dashed."""
    check_int("smooth", smooth, 1)
    labels = list(histories)
    fig, axes = plt.subplots(1, 1 + len(labels), figsize=(3.4 * (1 + len(labels)), 3.0))
    for label in labels:
        axes[0].plot(histories[label].losses, label=label, lw=1.0)
    axes[0].set(yscale="log", xlabel="step", ylabel="mean squared error", title="loss")
    axes[0].legend(fontsize=8)
    kernel = np.ones(smooth) / smooth
    for ax, label in zip(axes[1:], labels):
        loads = histories[label].load_matrix().numpy()
        E = loads.shape[1]
        for e in range(E):
            ax.plot(np.convolve(loads[:, e], kernel, mode="valid"), color=expert_color(e), lw=1.0)
        ax.axhline(1 / E, color="#555555", ls="--", lw=0.8)
        ax.set(xlabel="step", ylim=(0, max(0.5, float(loads.max()) * 1.05)), title=f"expert load: {label}")
    axes[1].set_ylabel("share of the pairs")
    fig.tight_layout()
    return fig
