"""Notebook 07's H200 figures: every model the run timed, steps that can be told apart, a noise band."""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

from moe_tutorial.figures import part7
from moe_tutorial.perf import report
from moe_tutorial.perf.results import DATA_DIR, load_rows, select

import matplotlib.colors as mcolors

ROWS = load_rows(DATA_DIR / "h200_fp8_bench.csv")


def test_the_results_figure_draws_every_model_with_one_legend():
    models = report.model_order(select(ROWS, impl="fp8"))
    fig = part7.plot_fp8_results(ROWS, models)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[:len(models)] == models and len(models) == 5
    assert all(ax.get_legend() is None for ax in fig.axes)
    assert len(fig.axes[0].get_lines()) == 2 * len(models) + 1      # gate/up and layer per model, and 1.0


def test_the_steps_figure_tells_steps_apart_and_shades_the_noise():
    steps = ["fp8-step0", "fp8+swap", "fp8+tma"]
    noise = report.spread_percent(report.fp8_same_kernel_pairs(ROWS))
    assert 0 < noise < 10
    fig = part7.plot_fp8_steps(ROWS, "DeepSeek-V3", steps, band=noise)
    ax = fig.axes[0]
    lines = [line for line in ax.get_lines() if line.get_label().startswith("Part 7 step")]
    hues = [mcolors.rgb_to_hsv(mcolors.to_rgb(line.get_color()))[0] for line in lines]
    assert len(lines) == 3 and min(abs(a - b) for i, a in enumerate(hues) for b in hues[i + 1:]) > 0.1
    (band,) = ax.patches
    assert band.get_label().startswith(f"noise: two timings of one kernel, up to {noise:.1f}%")


def test_fp8_same_kernel_pairs_are_the_unswapped_heuristic():
    pairs = report.fp8_same_kernel_pairs(ROWS)
    assert pairs and all(p["impls"] == ("fp8-step0", "fp8+swap") for p in pairs)
    assert all(p["M"] >= 256 for p in pairs)                   # where an expert has 16 rows or more
