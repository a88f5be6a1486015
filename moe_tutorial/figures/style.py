"""One look for every figure of the series: expert and implementation colours, labels, PNG output."""
from __future__ import annotations

import matplotlib

from ..perf import registry

#: One colour per expert (cycled past 10), so expert e looks the same in every figure.
EXPERT_COLORS = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
]
#: Results that failed the correctness check are marked in this colour, whatever their implementation.
WRONG_COLOR = "#d62728"
PADDING_COLOR = "#eeeeee"


def expert_color(e: int) -> str:
    return EXPERT_COLORS[int(e) % len(EXPERT_COLORS)]


def impl_style(impl: str) -> dict:
    """``plot`` keywords of an implementation (colour, line style, label), from the registry."""
    return registry.style(impl)


def impl_color(impl: str) -> str:
    """The colour every figure gives an implementation."""
    return impl_style(impl)["color"]


def m_axis(ax, sizes) -> None:
    """A log2 axis of tokens M, labelled with the batch sizes ``sizes`` themselves (1, 8, 64, ...)."""
    ax.set_xscale("log", base=2)
    if len(sizes):
        ax.set_xticks(sizes, [str(m) for m in sizes])
        ax.minorticks_off()
    ax.set_xlabel("tokens M")


def use_style() -> None:
    """Deterministic, readable defaults; call once at the top of a notebook."""
    matplotlib.rcParams.update({
        "figure.dpi": 100, "savefig.dpi": 100, "font.size": 10, "axes.titlesize": 11,
        "axes.spines.top": False, "axes.spines.right": False, "figure.autolayout": False,
        "svg.hashsalt": "moe-tutorial",
    })
