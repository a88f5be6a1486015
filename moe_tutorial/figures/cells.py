"""A labelled cell: the brick of every matrix, tile and sorted-pairs drawing."""
from __future__ import annotations

from matplotlib.patches import Rectangle


def cell(ax, x, y, color, text="", *, w=1.0, h=1.0, fontsize=7, hatch=None, edge="#999999", lw=0.5, alpha=1.0,
         text_color="black", rotation=0, fontweight="normal"):
    """A ``w x h`` rectangle with its corner at ``(x, y)`` and ``text`` centred in it.

    ``alpha`` fades the rectangle, not its label; an empty ``text`` draws no label (``0`` is one).
    """
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor=edge, lw=lw, hatch=hatch, alpha=alpha))
    if text != "":
        ax.text(x + w / 2, y + h / 2, str(text), ha="center", va="center", fontsize=fontsize,
                color=text_color, rotation=rotation, fontweight=fontweight)
