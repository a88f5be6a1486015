"""Part 4's figure helpers: the pid-to-tile mapping, the sorted layout, the results plots.

The results tests write a small synthetic CSV under pytest's tmp_path (never into the package)
and read it back through ``moe_tutorial.results``.
"""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from moe_tutorial import align_block_size, results, runtime  # noqa: E402
from moe_tutorial.figures import part4  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.mark.parametrize("num_pid_m,num_pid_n,group_m", [(1, 1, 1), (5, 4, 2), (7, 3, 4), (8, 12, 8), (3, 5, 8)])
def test_pid_to_tile_is_a_bijection(num_pid_m, num_pid_n, group_m):
    pids = part4.tile_pids(num_pid_m, num_pid_n, group_m)
    assert sorted(pids.flatten().tolist()) == list(range(num_pid_m * num_pid_n))


def test_group_1_is_row_major():
    assert np.array_equal(part4.tile_pids(3, 4, 1), np.arange(12).reshape(3, 4))


def test_grouped_order_walks_down_first():
    pids = part4.tile_pids(5, 3, 2)
    # Rows 0-1 form a group: down column 0, then column 1, ...; row 4 is a group of one.
    assert pids.tolist() == [[0, 2, 4], [1, 3, 5], [6, 8, 10], [7, 9, 11], [12, 13, 14]]


def test_wave_loads_counts_shared_tiles():
    experts = [0, 0, 1, -1]
    row_major = part4.tile_pids(4, 2, 1)
    # Waves of 2 = one row each: 3 live rows -> 3 x blocks; 2 weight tiles per row.
    assert part4.wave_loads(row_major, experts, 2) == (3, 6)
    grouped = part4.tile_pids(4, 2, 2)
    # Waves of 2 = a column of a group: rows 0-1 share expert 0's tile; rows 2-3: row 3 exits.
    assert part4.wave_loads(grouped, experts, 2) == (6, 4)


def test_sorted_blocks_worked_example():
    ids = torch.tensor([[0, 2], [2, 3]], dtype=torch.int32, device=runtime.DEVICE)
    blocks = part4.sorted_blocks(align_block_size(ids, 4, 4), 4, 4)
    assert blocks == [(0, [0, None, None, None]), (2, [1, 2, None, None]), (3, [3, None, None, None])]


def test_sorted_blocks_sorts_within_a_run():
    """Pairs of one expert over two blocks are listed in order, padding last."""
    ids = torch.tensor([[1], [1], [0], [1], [1], [1]], dtype=torch.int64, device=runtime.DEVICE)
    blocks = part4.sorted_blocks(align_block_size(ids, 4, 2), 4, 6)
    assert blocks == [(0, [2, None, None, None]), (1, [0, 1, 3, 4]), (1, [5, None, None, None])]


def test_sorting_and_pid_figures_draw():
    ids = torch.tensor([[0, 2], [2, 3], [1, 0]], dtype=torch.int32, device=runtime.DEVICE)
    fig = part4.plot_sorting(ids.cpu(), align_block_size(ids, 4, 4), 4)
    assert len(fig.axes) == 1
    fig = part4.plot_pid_order([0, 0, 1, -1], num_pid_n=5, group_ms=(1, 2, 4), wave=4)
    assert len(fig.axes) == 3
    assert "=" in fig.axes[1].get_title()


# --------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------

def _rows():
    """Two models, three implementations; one wrong and one skipped entry."""
    rows = []
    for model in ("DeepSeek-V3", "Mixtral-8x7B"):
        for impl, frac in (("sorted", 0.8), ("grouped_mm", 0.5), ("published", 0.05)):
            for M, scale in ((1, 1.0), (64, 0.5), (4096, 2.0)):
                status = "ok"
                if impl == "published" and model == "DeepSeek-V3":
                    status = "wrong"
                if impl == "grouped_mm" and M == 4096 and model == "Mixtral-8x7B":
                    status = "skipped: out of memory"
                f = min(1.0, frac * scale)
                rows.append(dict(gpu="H200", model=model, E=8, N=64, K=32, topk=2, dtype="bfloat16",
                                 gemm="first", impl=impl, M=M, ms=0.1 / f, floor_ms=0.1,
                                 fraction_of_floor=f if status == "ok" else "", status=status))
    return rows


@pytest.fixture
def csv_rows(tmp_path):
    path = results.write_rows(tmp_path / "bench.csv", _rows())
    return results.load_rows(path)


def test_floor_geomeans(csv_rows):
    values = part4.floor_geomeans(csv_rows, gemm="first")
    assert values["DeepSeek-V3", "published"] == "wrong"
    assert values["Mixtral-8x7B", "sorted"] == pytest.approx((0.8 * 0.4 * 1.0) ** (1 / 3))
    # The skipped M = 4096 row is left out of the mean, not counted as zero.
    assert values["Mixtral-8x7B", "grouped_mm"] == pytest.approx(math.sqrt(0.5 * 0.25))
    assert part4.floor_geomeans(csv_rows, gemm="layer") == {}


def test_geomean_table(csv_rows):
    table = part4.format_geomean_table(csv_rows, gemm="first")
    lines = table.splitlines()
    assert lines[0].split() == ["implementation", "Mixtral-8x7B", "DeepSeek-V3"]   # the series' order
    published = next(line for line in lines if line.startswith("Part 3 as published"))
    assert published.split()[-2:] == ["0.05", "wrong"]
    sorted_line = next(line for line in lines if line.startswith("Part 4 sorted"))
    assert sorted_line.split()[-2] == f"{(0.8 * 0.4 * 1.0) ** (1 / 3):.2f}"


@pytest.mark.parametrize("metric", ["ms", "fraction_of_floor"])
def test_plot_results(csv_rows, metric):
    fig = part4.plot_results(csv_rows, metric, gemm="first")
    assert [ax.get_title() for ax in fig.axes[:2]] == ["Mixtral-8x7B", "DeepSeek-V3"]
    labels = fig.legends[0].get_texts()
    assert "Part 3 as published: wrong result" in [t.get_text() for t in labels]


def test_plot_results_wraps_many_models(csv_rows):
    extra = [dict(r, model=m) for r in csv_rows for m in ("Qwen3-30B-A3B", "DeepSeek-V2-Lite")]
    fig = part4.plot_results(csv_rows + extra, "fraction_of_floor")
    assert len(fig.axes) == 6 and sum(ax.axison for ax in fig.axes) == 4


def test_plot_results_bad_input(csv_rows):
    with pytest.raises(ValueError, match="metric"):
        part4.plot_results(csv_rows, "tflops")
    with pytest.raises(ValueError, match="no results"):
        part4.plot_results(csv_rows, gemm="layer")
    with pytest.raises(ValueError, match="several dtypes"):
        part4.plot_results(csv_rows + [dict(csv_rows[0], dtype="float16")])
    assert part4.plot_results(csv_rows + [dict(csv_rows[0], dtype="float16")], dtype="bfloat16")
