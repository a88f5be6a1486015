"""One look for every figure of the series: expert and implementation colours, labels, PNG output."""
from __future__ import annotations

import matplotlib

#: One colour per expert (cycled past 10), so expert e looks the same in every figure.
EXPERT_COLORS = [
    "#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f",
    "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac",
]
#: One colour per implementation, used by every timing plot.
IMPL_COLORS = {
    "loop": "#9c755f", "indexing": "#e15759", "published": "#bab0ac", "naive": "#f28e2b",
    "sorted": "#4e79a7", "grouped_mm": "#59a14f", "layer": "#4e79a7",
}
#: What figures and tables call each implementation of the benchmark results, in the series' words.
IMPL_LABELS = {
    "loop": "Part 1 loop", "indexing": "Part 2 indexing", "published": "Part 3 as published",
    "naive": "Part 3 fixed", "sorted": "Part 4 sorted", "sorted+align": "Part 4 + align",
    "sorted-heuristic": "Part 4, untuned", "grouped_mm": "torch._grouped_mm",
}
#: Implementations drawn as variations of another one: same colour, a different line.
_VARIANT_OF = {"sorted+align": ("sorted", ":"), "sorted-heuristic": ("sorted", "--")}
#: Results that failed the correctness check are marked in this colour, whatever their implementation.
WRONG_COLOR = "#d62728"
PADDING_COLOR = "#eeeeee"


def expert_color(e: int) -> str:
    return EXPERT_COLORS[int(e) % len(EXPERT_COLORS)]


def impl_style(impl: str) -> dict:
    """``plot`` keywords of an implementation: its colour, line style and label."""
    base, ls = _VARIANT_OF.get(impl, (impl, "-"))
    return {"color": IMPL_COLORS.get(base, "#555555"), "ls": ls, "label": IMPL_LABELS.get(impl, impl)}


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
