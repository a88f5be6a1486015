"""The layer's topk sum as one Triton launch, against a float64 sum."""
from __future__ import annotations

from moe_tutorial import runtime
from moe_tutorial.kernels.topk_sum import BLOCK_H, topk_sum

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


@pytest.mark.gpu
@pytest.mark.skipif(not runtime.ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_rounds_once(dtype):
    """fp32 accumulation, one rounding: the same as torch's sum up to one rounding step."""
    rows = torch.randn(300, 8, 2048, device="cuda", dtype=dtype)
    out = topk_sum(rows)
    ref = rows.double().sum(dim=1)
    assert ((out.double() - ref).abs() <= ref.abs() * 2 ** -7 + 1e-3).all()
