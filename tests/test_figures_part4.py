"""Part 4's figure helpers: the pid-to-tile mapping, the sorted layout, the ladder of production steps.

The comparison of all implementations (notebook 05) is drawn by ``figures.perf``: tests/test_bench_report.py.
"""
from __future__ import annotations

from moe_tutorial import align_block_size, runtime  # noqa: E402
from moe_tutorial.figures import part4  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402


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


def _cell_labels(ax, y: float) -> list[str]:
    """The labels of the row of cells whose centres sit at height ``y``, left to right (the row's
    caption stands left of x = 0)."""
    return [t.get_text() for t in sorted((t for t in ax.texts if t.get_position()[1] == y and t.get_position()[0] > 0),
                                         key=lambda t: t.get_position()[0])]


def test_sorting_figure_shows_the_alignment():
    """Top row: pairs in token order; bottom row: the alignment's blocks, pads where it pads."""
    ids = torch.tensor([[0, 2], [2, 3], [1, 0]], dtype=torch.int32, device=runtime.DEVICE)
    alignment = align_block_size(ids, 4, 4)
    blocks = part4.sorted_blocks(alignment, 4, 6)
    fig = part4.plot_sorting(ids.cpu(), alignment, 4)
    ax = fig.axes[0]
    assert _cell_labels(ax, 3.5) == ["0,0", "0,1", "1,0", "1,1", "2,0", "2,1"]
    expected = [("pad" if p is None else f"{p // 2},{p % 2}") for _, rows in blocks for p in rows]
    assert _cell_labels(ax, 0.5) == expected
    assert expected.count("pad") == 4 * len(blocks) - 6
    captions = [t.get_text() for t in ax.texts if t.get_text().startswith("block ")]
    assert captions == [f"block {b}: expert {e}" for b, (e, _) in enumerate(blocks)]
    assert ax.get_title().startswith(f"3 tokens x topk 2 = 6 pairs -> {4 * len(blocks)} rows")


def test_pid_figure_numbers_the_first_wave_only():
    experts = [0, 0, 1, -1]
    fig = part4.plot_pid_order(experts, num_pid_n=5, group_ms=(1, 2, 4), wave=4)
    assert len(fig.axes) == 3
    for ax, g in zip(fig.axes, (1, 2, 4)):
        pids = part4.tile_pids(4, 5, g)
        # Cell (m, n) is drawn at (n, 3 - m); the first wave's tiles (of real blocks) carry their program id,
        # the others no label (issue 22: hundreds of numbers made the picture unreadable).
        drawn = {(int(t.get_position()[0]), 3 - int(t.get_position()[1])): int(t.get_text()) for t in ax.texts}
        assert drawn == {(n, m): int(pids[m, n]) for m in range(4) for n in range(5)
                         if pids[m, n] < 4 and experts[m] >= 0}
        a_loads, b_loads = part4.wave_loads(pids, experts, 4)
        assert ax.get_title().startswith(f"GROUP_M = {g}")
        assert ("row-major" in ax.get_title()) == (g == 1)
        assert ("the minimal kernel's 2-D grid" in ax.get_title()) == (g >= 4)
        assert ax.get_title().endswith(f"{a_loads} x blocks + {b_loads} weight tiles = {a_loads + b_loads} loads")


def test_whole_columns_are_the_order_of_a_2d_grid():
    """A 2-D grid (pid_m, pid_n) runs axis 0 fastest: program id pid_m + pid_n * num_pid_m."""
    pids = part4.tile_pids(4, 3, 4)
    assert pids.tolist() == [[m + n * 4 for n in range(3)] for m in range(4)]
    assert np.array_equal(part4.tile_pids(4, 3, 9), pids)


def _ladder_rows(gemm: str) -> list[dict]:
    """Each step of ``gemm``'s ladder 10% faster than the one before, on two models and three M."""
    from moe_tutorial.perf import report

    rows = []
    for i, step in enumerate(report.LADDERS[gemm]):
        for model in ("Mixtral-8x7B", "DeepSeek-V3"):
            for M in (1, 64, 1024):
                rows.append(dict(model=model, gemm=gemm, impl=step, M=M, ms=1.0 / 1.1 ** i, status="ok",
                                 dtype="bfloat16", protocol="cold-l2"))
    return rows


@pytest.mark.parametrize("gemm", ["first", "layer"])
def test_ladder_draws_each_step_as_its_gain_over_step_0(gemm):
    from moe_tutorial.perf import report

    steps = report.LADDERS[gemm]
    fig = part4.plot_ladder(_ladder_rows(gemm), gemm, band=2.0)
    assert [ax.get_title() for ax in fig.axes] == ["Mixtral-8x7B", "DeepSeek-V3"]
    lines = [line for line in fig.axes[0].get_lines() if line.get_label() in
             [part4.ladder_label(gemm, s) for s in steps]]
    assert [line.get_label() for line in lines] == [part4.ladder_label(gemm, s) for s in steps]
    for i, line in enumerate(lines):
        assert list(line.get_xdata()) == [1, 64, 1024]
        assert np.allclose(line.get_ydata(), 1.1 ** i)
    assert lines[-1].get_label().endswith("(= Part 4, tuned)") and lines[-1].get_linewidth() > lines[0].get_linewidth()
    band = fig.axes[0].patches[0]             # axhspan: a rectangle in data y, axes x
    ys = band.get_patch_transform().transform(band.get_path().vertices)[:, 1]
    assert min(ys) == pytest.approx(1 / 1.02) and max(ys) == pytest.approx(1.02)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[0] == "two timings of the same kernels differ by up to 2.0%"


def test_ladder_stops_where_asked_and_refuses_bad_input():
    fig = part4.plot_ladder(_ladder_rows("first"), "first", upto="+grouped")
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["Part 4 step 0: minimal kernel",
                                                                  "Part 4 step 1: + grouped order"]
    assert not fig.axes[0].patches                                 # no band unless asked
    with pytest.raises(ValueError, match="^gemm: expected one of first, layer, got 'down'"):
        part4.plot_ladder(_ladder_rows("first"), "down")
    with pytest.raises(ValueError, match="^upto: expected one of minimal, "):
        part4.plot_ladder(_ladder_rows("first"), "first", upto="+silu-epilogue")
    with pytest.raises(ValueError, match="^rows: no timings of 'unfused'"):
        part4.plot_ladder(_ladder_rows("first"), "layer")


def test_pid_order_explorer_redraws_when_a_slider_moves(monkeypatch):
    drawn = []
    monkeypatch.setattr(part4, "plot_pid_order", lambda *a, **k: drawn.append(k))
    box = part4.pid_order_explorer([0, 0, 1, 1, -1], num_pid_n=12)
    group, wave = box.children[0].children
    assert (group.description, group.max, wave.description) == ("GROUP_M", 5, "wave") and not drawn
    group.value = 2
    assert drawn == [{"group_ms": (1, 2), "wave": 12}]
