"""One look for every figure of the series: expert colours, fonts, PNG output."""
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
PADDING_COLOR = "#eeeeee"


def expert_color(e: int) -> str:
    return EXPERT_COLORS[int(e) % len(EXPERT_COLORS)]


def use_style() -> None:
    """Deterministic, readable defaults; call once at the top of a notebook."""
    matplotlib.rcParams.update({
        "figure.dpi": 100, "savefig.dpi": 100, "font.size": 10, "axes.titlesize": 11,
        "axes.spines.top": False, "axes.spines.right": False, "figure.autolayout": False,
        "svg.hashsalt": "moe-tutorial",
    })
