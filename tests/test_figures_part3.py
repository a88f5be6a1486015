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
