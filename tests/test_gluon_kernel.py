"""The Gluon kernel (persistent, warp-specialised; Hopper only) against the float64 reference.

Gluon does not run in Triton's CPU interpreter: on a CPU every test here skips with that reason.
"""
from __future__ import annotations

from moe_tutorial import align_block_size, reference_moe_matmul, rel_error, route
from moe_tutorial.kernels import gluon_kernel
from moe_tutorial.kernels.configs import KernelConfig
from moe_tutorial.shapes import random_topk_ids

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(gluon_kernel.UNAVAILABLE is not None,
                                                   reason=str(gluon_kernel.UNAVAILABLE))]


def test_unavailable_says_why():
    assert gluon_kernel.UNAVAILABLE is None     # only reached where the kernel can run


@pytest.mark.parametrize("M,N,K,E,topk,bm,bn,bk,warps,stages", [
    (200, 256, 256, 4, 2, 128, 128, 64, 8, 3),     # several tiles per program, K of 4 steps
    (77, 320, 200, 8, 2, 64, 128, 64, 4, 4),       # N and K ragged: TMA zero-fills, the store masks
    (1024, 1536, 2048, 128, 8, 128, 256, 64, 8, 4),  # Qwen3-30B-A3B's first GEMM
])
def test_first_gemm_matches_the_reference(M, N, K, E, topk, bm, bn, bk, warps, stages):
    g = torch.Generator(device="cuda").manual_seed(M)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16, generator=g) * K ** -0.5
    ids = random_topk_ids(M, E, topk, generator=torch.Generator().manual_seed(M), device="cuda")
    tw = torch.rand(M, topk, device="cuda")
    config = KernelConfig(block_m=bm, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages)
    alignment = align_block_size(ids, bm, E)
    a = gluon_kernel.gather_sorted_rows(x, alignment[0], M * topk, topk)
    out = torch.full((M * topk, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    gluon_kernel.launch_gluon_gemm(a, w, out, tw.reshape(-1).contiguous(), alignment, M * topk, config)
    ref = reference_moe_matmul(x, w, ids) * tw.double()[..., None]
    assert rel_error(out.view(M, topk, N), ref) < 1e-2


def test_sorted_rows_in_and_out():
    """The down GEMM's case: A already in sorted order, C written at the sorted positions."""
    M, N, K, E, topk = 96, 128, 192, 4, 2
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16, generator=g) * K ** -0.5
    _, ids = route(torch.randn(M, E, device="cuda", generator=g), topk)
    config = KernelConfig(block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=3)
    alignment = align_block_size(ids, 64, E)
    a = gluon_kernel.gather_sorted_rows(x, alignment[0], M * topk, topk)
    out = torch.zeros(alignment[0].numel(), N, device="cuda", dtype=torch.bfloat16)
    gluon_kernel.launch_gluon_gemm(a, w, out, None, alignment, M * topk, config, c_sorted=True)
    sorted_ids = alignment[0].long()
    # Positions past num_tokens_post_padded were never written by the alignment: leave them out.
    used = torch.arange(sorted_ids.numel(), device="cuda") < alignment[2].long()
    real = used & (sorted_ids < M * topk)
    ref = reference_moe_matmul(x, w, ids).reshape(M * topk, N)[sorted_ids[real]]
    assert rel_error(out[real], ref) < 1e-2
