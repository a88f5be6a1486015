"""Figures for Part 4's last step: the persistent grid, warp specialisation, and what they bought.

``tile_schedule`` is the persistent kernel's loop in plain Python (which tiles each program
takes), so that a notebook cell can work it out by hand; the drawings are schematic timelines
(their time axis is in arbitrary units) except :func:`plot_persistent_gain`, which reads the
H200 rows.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from ..perf import report
from .style import m_axis


def tile_schedule(num_tiles: int, num_programs: int) -> list[list[int]]:
    """The tiles each program of the persistent grid computes, in order: program ``p`` takes
    ``p, p + num_programs, p + 2 * num_programs, ...`` (the kernel's ``tl.range`` loop)."""
    return [list(range(p, num_tiles, num_programs)) for p in range(num_programs)]


def _bar(ax, y, x, width, color, text="", hatch=None):
    ax.add_patch(Rectangle((x, y - 0.38), width, 0.76, facecolor=color, edgecolor="black", lw=0.5, hatch=hatch))
    if text:
        ax.text(x + width / 2, y, text, ha="center", va="center", fontsize=7)


def plot_schedules(num_tiles: int = 10, num_sms: int = 4, *, start: float = 0.6, mainloop: float = 3.0,
                   epilogue: float = 0.8):
    """Two timelines of ``num_tiles`` tiles on ``num_sms`` SMs. Top: one program per tile; each
    pays its start (``start``: address arithmetic, filling the load pipeline) and its epilogue
    with the tensor cores idle, and the last wave leaves SMs without work. Bottom: one program
    per SM; it starts once, and the next tile's first loads are in flight during this tile's
    epilogue, so only the epilogue's stores remain between two main loops."""
    fig, axes = plt.subplots(2, 1, figsize=(7.6, 4.2), sharex=True)
    colors = {"start": "#d9d9d9", "main": "#4e79a7", "epi": "#f28e2b"}
    # One program per tile, in waves of num_sms.
    ax = axes[0]
    for t in range(num_tiles):
        sm, wave = t % num_sms, t // num_sms
        x = wave * (start + mainloop + epilogue)
        _bar(ax, sm, x, start, colors["start"])
        _bar(ax, sm, x + start, mainloop, colors["main"], f"tile {t}")
        _bar(ax, sm, x + start + mainloop, epilogue, colors["epi"])
    end_grid = -(-num_tiles // num_sms) * (start + mainloop + epilogue)
    ax.set_title(f"one program per tile: {num_tiles} tiles in {-(-num_tiles // num_sms)} waves on {num_sms} SMs",
                 fontsize=9)
    # Persistent: program p walks tiles p, p + num_sms, ...; the epilogue overlaps the next loads.
    ax = axes[1]
    end_persistent = 0.0
    for p, tiles in enumerate(tile_schedule(num_tiles, num_sms)):
        x = 0.0
        _bar(ax, p, x, start, colors["start"])
        x += start
        for t in tiles:
            _bar(ax, p, x, mainloop, colors["main"], f"tile {t}")
            x += mainloop
            _bar(ax, p, x, epilogue / 2, colors["epi"], hatch="//")
            x += epilogue / 2
        end_persistent = max(end_persistent, x + epilogue / 2)
    ax.set_title("persistent: one program per SM walks the tile list; the next tile's loads overlap the epilogue",
                 fontsize=9)
    for ax in axes:
        ax.set_yticks(range(num_sms), [f"SM {s}" for s in range(num_sms)], fontsize=8)
        ax.set_ylim(num_sms - 0.4, -0.6)
        ax.set_xlim(0, end_grid * 1.02)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[1].set_xlabel("time (schematic)")
    handles = [Rectangle((0, 0), 1, 1, facecolor=c, edgecolor="black", lw=0.5) for c in colors.values()]
    fig.legend(handles, ["program start", "main loop (tensor cores)", "epilogue"], fontsize=7,
               loc="upper center", ncol=3, bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    return fig


def plot_warp_roles(steps: int = 6, stages: int = 3):
    """Warp specialisation, schematically: producer warps only load (TMA into a ring of
    ``stages`` shared-memory buffers), consumer warps only multiply, then run the epilogue while
    the producer already fills the ring for the next tile. A buffer is reused once the consumer
    has released it ("empty"); the consumer waits until a buffer is loaded ("full")."""
    fig, ax = plt.subplots(figsize=(7.6, 2.4))
    load, mma = 1.0, 1.0
    for k in range(steps):
        _bar(ax, 0, k * load, load * 0.95, "#59a14f", f"load k={k}\nbuf {k % stages}")
        _bar(ax, 1, (k + 1) * mma, mma * 0.95, "#4e79a7", f"mma k={k}\nbuf {k % stages}")
    _bar(ax, 1, (steps + 1) * mma, 1.6, "#f28e2b", "epilogue")
    for k in range(stages):
        _bar(ax, 0, (steps + k) * load, load * 0.95, "#a6d49a", f"next tile\nk={k}")
    ax.set_yticks([0, 1], ["producer warps\n(loads)", "consumer warps\n(MMA, epilogue)"], fontsize=8)
    ax.set_ylim(1.6, -0.6)
    ax.set_xlim(0, steps + 3.2)
    ax.set_xlabel("time (schematic): the producer runs up to "
                  f"{stages} buffers ahead; the next tile's loads overlap the epilogue", fontsize=8)
    ax.set_xticks([])
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.tight_layout()
    return fig


def persistent_gains(rows: list[dict], models, gemm: str = "first") -> dict:
    """``{(model, M): time of '+tma' / time of 'persistent'}`` from one protocol's rows: the gain
    of the persistent grid over the same tiles launched one program per tile."""
    ms = {(r["model"], r["impl"], r["M"]): r["ms"] for r in report.subset(rows, gemm, impls=("+tma", "persistent"))
          if report.is_ok(r)}
    return {(m, M): ms[m, "+tma", M] / ms[m, "persistent", M]
            for (m, impl, M) in ms if impl == "persistent" and m in models and (m, "+tma", M) in ms}


def plot_persistent_gain(rows: list[dict], models):
    """The persistent grid's gain over '+tma' per M, one line per model (first GEMM, H200)."""
    gains = persistent_gains(rows, models)
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    sizes = sorted({M for _, M in gains})
    for i, model in enumerate(models):
        pts = sorted((M, g) for (m, M), g in gains.items() if m == model)
        if pts:
            ax.plot(*zip(*pts), marker="o", color=f"C{i}", label=model)
    ax.axhline(1.0, color="black", lw=0.8)
    m_axis(ax, sizes)
    ax.set(ylabel="time of +tma / time of persistent", title="The persistent grid against one program per tile")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


__all__ = ["tile_schedule", "plot_schedules", "plot_warp_roles", "persistent_gains", "plot_persistent_gain"]
