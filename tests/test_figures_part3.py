"""Part 3's figures: the index arithmetic they draw, the pid explorer, the bytes they plot."""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

import pytest  # noqa: E402
import torch  # noqa: E402

from moe_tutorial.perf import traffic  # noqa: E402
from moe_tutorial.figures import part3  # noqa: E402
from moe_tutorial.shapes import random_topk_ids  # noqa: E402



@pytest.mark.parametrize("topk,N,block_n", [(1, 7, 4), (3, 10, 4), (6, 33, 8), (8, 5, 2), (2, 2, 2)])
def test_programs_write_every_output_once(topk, N, block_n):
    """Over the whole grid, the valid columns cover every (token, slot, n) exactly once."""
    M, E = 3, 9
    ids = random_topk_ids(M, E, topk, generator=torch.Generator().manual_seed(topk))
    written = []
    for pid_m in range(M):
        for pid_n in range(-(-N // block_n)):
            cols = part3.program_columns(ids, pid_m, pid_n, N, block_n)
            assert len(cols) == part3.topk_pad(topk) * block_n
            for c in cols:
                if c.valid:
                    assert c.expert == int(ids[pid_m, c.topk_idx])
                    written.append((pid_m, c.topk_idx, c.n_global))
                else:
                    assert c.topk_idx >= topk or c.n_global >= N
    assert sorted(written) == [(m, j, n) for m in range(M) for j in range(topk) for n in range(N)]


@pytest.mark.parametrize("topk,pad", [(1, 1), (2, 2), (3, 4), (5, 8), (6, 8), (8, 8), (9, 16)])
def test_topk_pad(topk, pad):
    assert part3.topk_pad(topk) == pad


def test_k_range_last_step_is_short():
    assert list(part3.k_range(0, 10, 4)) == [0, 1, 2, 3]
    assert list(part3.k_range(2, 10, 4)) == [8, 9]


def test_explorer_sliders_and_redraw():
    ids = random_topk_ids(4, 6, 3, generator=torch.Generator().manual_seed(1))
    box = part3.pid_explorer(ids, num_experts=6, N=6, K=8, block_n=4, block_k=4)
    sliders = box.children[0].children
    assert [s.description for s in sliders] == ["pid_m", "pid_n", "k step"]
    assert [s.max for s in sliders] == [3, 1, 1]
    image = box.children[1]
    seen = {bytes(image.value)}
    assert bytes(image.value).startswith(b"\x89PNG")
    for slider in sliders:             # every slider redraws, and each picture is new
        slider.value = 1
        assert bytes(image.value) not in seen
        seen.add(bytes(image.value))
    # Past the grid ipywidgets clamps silently; the box's note says where each slider stops, and so.
    box.sliders["pid_m"].value = 99
    assert box.sliders["pid_m"].value == 3
    assert box.children[2].value == ("pid_m runs 0..3 (M = 4 tokens), pid_n 0..1 (cdiv(N, BLOCK_N) = cdiv(6, 4)), "
                                     "k step 0..1 (cdiv(K, BLOCK_K) = cdiv(8, 4)). A value set past a slider's end is "
                                     "clamped to it: the grid has no program there.")


def test_static_figures_draw():
    ids = random_topk_ids(2, 64, 6, generator=torch.Generator().manual_seed(0))
    figs = [
        part3.draw_pid_grid(3, 10, 2, 4),
        part3.draw_fused_columns([dict(title="t", topk_ids=ids, pid_m=1, pid_n=703, N=2816, block_n=4)]),
        part3.draw_program(ids, 64, 3, 5, 0, 0, 1, 2, 4),
        part3.draw_dot_padding(),
        part3.draw_traffic(models=("Mixtral-8x7B",), Ms=(1, 64)),
    ]
    assert all(len(f.axes) >= 1 for f in figs)


def test_fusion_saves_two_thirds_of_part2_bytes():
    for M in (1, 64, 4096):
        fused = traffic.per_pair_bytes(M, 2816, 2048, 6)
        assert traffic.indexing_bytes(M, 2816, 2048, 6) == pytest.approx(3 * fused, rel=1e-3)
    # One token reads each of its experts once: Part 3 is at the fewest bytes there.
    assert traffic.per_pair_bytes(1, 2816, 2048, 6) == traffic.first_gemm_bytes(1, 2816, 2048, 64, 6, touched=6)
    assert traffic.per_pair_bytes(64, 2816, 2048, 6) > 5 * traffic.first_gemm_bytes(64, 2816, 2048, 64, 6)


# --------------------------------------------------------------------------------------
# A reader's edits: every helper names the argument that is out of its range.

WORKED_IDS = [[0, 2], [2, 3]]


@pytest.mark.parametrize("pid_m,pid_n,match", [
    (2, 0, r"^pid_m: expected 0 <= pid_m < 2 \(one program per token: the grid's axis 0 has M = 2 programs\), got 2$"),
    (-1, 0, r"^pid_m: expected 0 <= pid_m < 2 .*got -1$"),
    (0, 3, r"^pid_n: expected 0 <= pid_n < 3 \(the grid's axis 1 has cdiv\(N=10, BLOCK_N=4\) = 3 column blocks\), "
           r"got 3$"),
])
def test_program_columns_refuse_a_program_outside_the_grid(pid_m, pid_n, match):
    with pytest.raises(ValueError, match=match):
        part3.program_columns(WORKED_IDS, pid_m, pid_n, N=10, block_n=4)


@pytest.mark.parametrize("kwargs,match", [
    (dict(block_n=3), r"^block_n: expected a power of two \(the kernel's tl.arange takes only powers of two\), got 3$"),
    (dict(block_n=0), r"^block_n: expected block_n >= 1, got 0$"),
    (dict(block_n=2.0), r"^block_n: expected an int, got float 2.0$"),
    (dict(N=0), r"^N: expected N >= 1, got 0$"),
])
def test_program_columns_refuse_block_sizes_the_kernel_refuses(kwargs, match):
    args = dict(topk_ids=WORKED_IDS, pid_m=0, pid_n=0, N=10, block_n=4) | kwargs
    with pytest.raises((ValueError, TypeError), match=match):
        part3.program_columns(**args)


def test_program_columns_refuse_ragged_ids():
    with pytest.raises(ValueError, match=r"^topk_ids: expected rows of one length topk >= 1, got row lengths \[1, 2\]"):
        part3.program_columns([[0, 1], [2]], 0, 0, N=4, block_n=2)


def test_k_range_refuses_a_step_past_K():
    with pytest.raises(ValueError, match=r"^k_step: expected 0 <= k_step < 3 \(the K loop makes cdiv\(K=10, "
                                         r"BLOCK_K=4\) = 3 steps\), got 3$"):
        part3.k_range(3, 10, 4)


@pytest.mark.parametrize("change,match", [
    (dict(pid_n=1), r"^pid_n: expected pid_n = 0 \(the grid's axis 1 has cdiv\(N=2, BLOCK_N=2\) = 1 column blocks\)"),
    (dict(k_step=2), r"^k_step: expected 0 <= k_step < 2 .*got 2$"),
    (dict(block_k=3), r"^block_k: expected a power of two"),
    (dict(num_experts=3), r"^topk_ids: expected expert ids in \[0, num_experts=3\), got an id of 3$"),
])
def test_draw_program_names_the_bad_argument(change, match):
    """The worked example's program (0, 0) draws; each change moves one argument out of its range."""
    args = dict(topk_ids=WORKED_IDS, num_experts=4, N=2, K=3, pid_m=0, pid_n=0, k_step=0, block_n=2, block_k=2)
    part3.draw_program(**args)
    with pytest.raises(ValueError, match=match):
        part3.draw_program(**(args | change))


def test_explorer_refuses_bad_arguments_before_drawing():
    with pytest.raises(ValueError, match=r"^block_k: expected a power of two"):
        part3.pid_explorer(WORKED_IDS, num_experts=4, N=2, K=3, block_n=2, block_k=6)
    with pytest.raises(ValueError, match=r"^topk_ids: expected expert ids in \[0, num_experts=2\), got an id of 2$"):
        part3.pid_explorer(WORKED_IDS, num_experts=2, N=2, K=3, block_n=2, block_k=2)


def test_explorer_sliders_stop_at_the_grids_edge():
    """The reader cannot move the explorer past its grid: the sliders' ranges are the grid's."""
    box = part3.pid_explorer(WORKED_IDS, num_experts=4, N=10, K=9, block_n=4, block_k=4)
    box.sliders["pid_n"].value = 99                  # ipywidgets clamps to the maximum
    assert box.sliders["pid_n"].value == 2
    box.sliders["k step"].value = 99
    assert box.sliders["k step"].value == 2


@pytest.mark.parametrize("args,kwargs,match", [
    ((3, 10, 2, 3), {}, r"^block_n: expected a power of two"),
    ((0, 10, 2, 4), {}, r"^M: expected M >= 1, got 0$"),
    ((3, 10, 2, 4), dict(highlight=(3, 0)), r"^pid_m: expected 0 <= pid_m < 3"),
    ((3, 10, 2, 4), dict(highlight=(0, 3)), r"^pid_n: expected 0 <= pid_n < 3"),
    ((64, 10, 8, 4), {}, r"^M, topk, N: expected a small output to draw cell by cell"),
])
def test_pid_grid_checks_its_arguments(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        part3.draw_pid_grid(*args, **kwargs)


def test_pid_grid_labels_every_program_and_names_the_highlighted_one():
    fig = part3.draw_pid_grid(3, 10, 2, 4, highlight=(2, 1))
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert [t for t in texts if t.startswith("(")] == [f"({m}, {n})" for m in range(3) for n in range(3)]
    assert sum(t.startswith("pid_n = ") for t in texts) == 3
    assert "program (2, 1) writes out[2, :, 4:8]: 8 cells" in fig.axes[0].get_title()
    # The masked lanes of the last block: 2 columns past N = 10 in each of the 3 x 2 rows.
    dashed = [p for p in fig.axes[0].patches if p.get_linestyle() == "--"]
    assert len(dashed) == 2 * 3 * 2


def test_program_colors_tell_both_axes_apart():
    colors = {(m, n): part3.program_color(m, n) for m in range(2) for n in range(3)}
    assert len(set(colors.values())) == 6


def test_fused_columns_cases_need_their_keys():
    with pytest.raises(ValueError, match=r"^cases\[0\]: expected a dict with the keys"):
        part3.draw_fused_columns([dict(title="t", topk_ids=WORKED_IDS, pid_m=0, pid_n=0, N=2)])
