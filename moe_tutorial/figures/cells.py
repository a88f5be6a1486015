"""The drawing helpers every figure module shares: a labelled cell (the brick of every matrix,
tile and sorted-pairs drawing), a rounded box and an arrow (the boxes-and-arrows diagrams)."""
from __future__ import annotations

from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle


def cell(ax, x, y, color, text="", *, w=1.0, h=1.0, fontsize=7, hatch=None, edge="#999999", lw=0.5, alpha=1.0,
         text_color="black", rotation=0, fontweight="normal"):
    """A ``w x h`` rectangle with its corner at ``(x, y)`` and ``text`` centred in it.

    ``alpha`` fades the rectangle, not its label; an empty ``text`` draws no label (``0`` is one).
    """
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor=edge, lw=lw, hatch=hatch, alpha=alpha))
    if text != "":
        ax.text(x + w / 2, y + h / 2, str(text), ha="center", va="center", fontsize=fontsize,
                color=text_color, rotation=rotation, fontweight=fontweight)


def box(ax, x, y, w, h, text, color="white", *, fontsize=9, edge="#555555"):
    """A rounded ``w x h`` box centred at ``(x, y)`` with ``text`` centred in it."""
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02,rounding_size=0.08",
                                facecolor=color, edgecolor=edge, lw=1.0))
    ax.text(x, y, text, ha="center", va="center", fontsize=fontsize)


def arrow(ax, start, end, *, color="#555555", lw=1.2, text=None, text_offset=(0.0, 0.12), fontsize=8):
    """An arrow from ``start`` to ``end``, with ``text`` at its middle (moved by ``text_offset``)."""
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=10, color=color, lw=lw,
                                 shrinkA=0, shrinkB=0))
    if text:
        mx, my = (start[0] + end[0]) / 2 + text_offset[0], (start[1] + end[1]) / 2 + text_offset[1]
        ax.text(mx, my, text, ha="center", va="center", fontsize=fontsize, color=color)
