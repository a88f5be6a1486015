"""The layer's topk sum as one Triton launch, against a float64 sum."""
from __future__ import annotations

from moe_tutorial import runtime
from moe_tutorial.kernels.align import align_block_size, sorted_positions
from moe_tutorial.kernels.topk_sum import BLOCK_H, sorted_topk_sum, topk_sum

import pytest
import torch

DEVICE = runtime.DEVICE


@pytest.mark.parametrize("M,topk,H", [(1, 1, 7), (3, 2, 64), (5, 6, 100), (2, 8, BLOCK_H + 3), (4, 3, 2 * BLOCK_H)])
def test_matches_float64_sum(M, topk, H):
    g = torch.Generator().manual_seed(M * 131 + topk * 7 + H)
    rows = torch.randn(M, topk, H, generator=g).to(DEVICE)
    out = topk_sum(rows)
    assert out.shape == (M, H) and out.dtype == rows.dtype
    ref = rows.double().sum(dim=1)
    assert torch.allclose(out.double(), ref, rtol=1e-6, atol=1e-6)


def test_strided_rows_and_out():
    """A view with its topk axis first (as a transposed buffer would be) and an out= slice."""
    g = torch.Generator().manual_seed(3)
    base = torch.randn(4, 5, 40, generator=g).to(DEVICE)         # [topk, M, H]
    rows = base.transpose(0, 1)                                  # [M, topk, H], not contiguous
    out = torch.full((5, 50), float("nan"), device=DEVICE)[:, :40]
    assert topk_sum(rows, out=out) is out
    assert torch.allclose(out, rows.sum(dim=1), atol=1e-5)


def test_empty():
    assert topk_sum(torch.empty(0, 4, 8, device=DEVICE)).shape == (0, 8)


def _sorted_problem(seed, M, E, topk, H, block_m=16):
    """Rows in sorted order as a down GEMM leaves them (padding rows NaN: never to be read), the
    positions of each pair's row, and the same rows one per pair; some pairs dropped (id -1)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(M)]).to(torch.int32)
    ids[torch.rand(M, topk, generator=g) < 0.2] = -1             # an expert of another rank: dropped
    alignment = align_block_size(ids.to(DEVICE), block_m, E)
    pos = sorted_positions(alignment, M * topk).view(M, topk)
    rows = torch.full((alignment[0].numel(), H), float("nan"))
    pair_rows = torch.randn(M * topk, H, generator=g)
    kept = pos.reshape(-1).cpu() >= 0
    rows[pos.reshape(-1).cpu()[kept].long()] = pair_rows[kept]
    return rows.to(DEVICE), pos, pair_rows.view(M, topk, H), kept.view(M, topk)


@pytest.mark.parametrize("seed,M,E,topk,H", [(0, 1, 1, 1, 7), (1, 5, 4, 2, 100), (2, 9, 8, 3, BLOCK_H + 5),
                                             (3, 17, 16, 8, 64)])
def test_sorted_topk_sum_gathers_each_tokens_rows_and_skips_dropped_pairs(seed, M, E, topk, H):
    rows, pos, pair_rows, kept = _sorted_problem(seed, M, E, topk, H)
    out = sorted_topk_sum(rows, pos)
    ref = torch.where(kept[..., None], pair_rows, 0.0).double().sum(dim=1)
    assert out.shape == (M, H) and bool(torch.isfinite(out).all())     # no padding NaN was read
    assert torch.allclose(out.double().cpu(), ref, rtol=1e-6, atol=1e-6)


def test_sorted_topk_sum_gives_the_bits_of_topk_sum_on_the_same_rows():
    """The layer's two forms (down rows to their pairs, or left in sorted order) end in the same sum."""
    g = torch.Generator().manual_seed(4)
    M, E, topk = 33, 8, 4
    ids = torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(M)]).to(torch.int32).to(DEVICE)
    alignment = align_block_size(ids, 16, E)
    pos = sorted_positions(alignment, M * topk).view(M, topk)
    rows = torch.randn(alignment[0].numel(), 300, generator=g).to(DEVICE)
    assert torch.equal(sorted_topk_sum(rows, pos), topk_sum(rows[pos.long()]))


def test_sorted_topk_sum_refuses_positions_it_cannot_read():
    rows = torch.zeros(16, 8, device=DEVICE)
    for bad in (torch.zeros(4, 2, dtype=torch.int64), torch.zeros(2, 4, dtype=torch.int32).t(),
                torch.zeros(8, dtype=torch.int32)):
        with pytest.raises(ValueError, match="positions: expected a contiguous int32"):
            sorted_topk_sum(rows, bad.to(DEVICE))
    with pytest.raises(ValueError, match=r"rows: expected \[R, H\]"):
        sorted_topk_sum(rows.view(16, 2, 4), torch.zeros(4, 2, dtype=torch.int32, device=DEVICE))


@pytest.mark.gpu
@pytest.mark.skipif(not runtime.ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_rounds_once(dtype):
    """fp32 accumulation, one rounding: the same as torch's sum up to one rounding step."""
    rows = torch.randn(300, 8, 2048, device="cuda", dtype=dtype)
    out = topk_sum(rows)
    ref = rows.double().sum(dim=1)
    assert ((out.double() - ref).abs() <= ref.abs() * 2 ** -7 + 1e-3).all()
