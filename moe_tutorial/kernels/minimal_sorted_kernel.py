"""Part 4, the idea alone: (token, slot) pairs sorted by expert, one expert per program, ``tl.dot``.

:func:`moe_tutorial.kernels.align.align_block_size` groups the pairs by expert in runs padded to
BLOCK_M, so every block of BLOCK_M sorted pairs belongs to one expert. A program takes one such
block and one BLOCK_N slice of the output features, gathers the pairs' token rows, and multiplies
them by that expert's weights with ``tl.dot``: a real matrix product, on tensor cores.

That is all this kernel does. The production kernel
(:mod:`moe_tutorial.kernels.sorted_kernel`) computes the same numbers and adds one step at a time:
grouped program order, tuned tiles, weights through TMA, fused epilogues, short tails.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import runtime
from ..checks import check_matmul_inputs, check_power_of_two
from .align import align_block_size, check_alignment


@triton.jit
def minimal_sorted_kernel(
    a_ptr, b_ptr, c_ptr,
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr,
    N, K, num_pairs, topk,
    stride_am, stride_ak,
    stride_be, stride_bn, stride_bk,
    stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """C[pair, n] = A[pair // topk] . B[expert, n, :] for one [BLOCK_M, BLOCK_N] tile of sorted pairs.

    A is x ``[M, K]``, B the experts' weights ``[E, N, K]``, C the output ``[M * topk, N]``: the
    production kernel's names for the same pointers.
    """
    # [which tile]
    pid_m = tl.program_id(axis=0)                    # a block of BLOCK_M sorted pairs, all of one expert
    pid_n = tl.program_id(axis=1)                    # a block of BLOCK_N output features
    if pid_m * BLOCK_M >= tl.load(num_post_ptr):     # past the last padded row: nothing to do
        return
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    # [gather the rows]
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ids_ptr + offs_m)          # flat pair indices m * topk + j
    row_ok = pair < num_pairs                        # padding rows hold num_pairs
    token = (pair // topk).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + token[:, None] * stride_am + offs_k[None, :] * stride_ak                   # [BLOCK_M, BLOCK_K]
    b_ptrs = (b_ptr + expert * stride_be + offs_n[None, :].to(tl.int64) * stride_bn
              + offs_k[:, None] * stride_bk)                                                    # [BLOCK_K, BLOCK_N]

    # [the K loop]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = offs_k < K - k0
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs, mask=k_ok[:, None] & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)                      # [BLOCK_M, BLOCK_K] @ [BLOCK_K, BLOCK_N] on tensor cores
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    # [scatter the rows]
    c_ptrs = c_ptr + pair.to(tl.int64)[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & (offs_n[None, :] < N))


def default_blocks() -> tuple[int, int, int]:
    """``(BLOCK_M, BLOCK_N, BLOCK_K)``: small tiles in the interpreter (a millisecond per program),
    a common tensor-core tile on a GPU."""
    return (16, 32, 32) if runtime.INTERPRETED else (64, 128, 64)


def minimal_sorted_moe_matmul(x: torch.Tensor, weight: torch.Tensor, topk_ids: torch.Tensor, *,
                              block_m: int | None = None, block_n: int | None = None,
                              block_k: int | None = None, alignment=None, out: torch.Tensor | None = None,
                              num_warps: int = 4, num_stages: int = 3) -> torch.Tensor:
    """First GEMM with the minimal sorted kernel: grid ``(cdiv(max padded rows, BLOCK_M), cdiv(N, BLOCK_N))``.

    Args:
        x: ``[M, K]`` fp32 (interpreter) or fp32/fp16/bf16 (GPU; fp32 dots run in TF32 there); any strides.
        weight: ``[E, N, K]`` x's dtype; any strides.
        topk_ids: ``[M, topk]`` int32/int64 in ``[0, E)``.
        block_m, block_n, block_k: powers of two, at least 16 (``tl.dot``'s minimum on a GPU);
            defaults from :func:`default_blocks`.
        alignment: ``align_block_size(topk_ids, block_m, E)`` computed beforehand (an engine
            aligns once per batch), else computed here.
        out: an ``[M, topk, N]`` contiguous buffer of x's dtype to write into.
        num_warps, num_stages: how the GPU runs each program (ignored by the interpreter).

    Returns:
        ``[M, topk, N]`` in x's dtype, accumulated in fp32.
    """
    M, K, N, E, topk = check_matmul_inputs(x, weight, topk_ids, kernel=True)
    block_m, block_n, block_k = (check_power_of_two(name, b if b is not None else d, 16, "tl.dot's minimum")
                                 for name, b, d in zip(("block_m", "block_n", "block_k"), (block_m, block_n, block_k),
                                                       default_blocks()))
    if out is None:
        out = x.new_empty(M, topk, N)
    elif not out.is_contiguous() or tuple(out.shape) != (M, topk, N) or out.dtype != x.dtype:
        raise ValueError(f"out: expected a contiguous {(M, topk, N)} tensor of {x.dtype}, "
                         f"got shape {tuple(out.shape)}, {out.dtype}")
    if M == 0 or N == 0:
        return out
    if alignment is None:
        alignment = align_block_size(topk_ids, block_m, E)
    else:
        check_alignment(alignment, block_m=block_m, num_pairs=M * topk, num_experts=E, topk_ids=topk_ids)
    sorted_ids, expert_ids, num_post = alignment
    flat = out.view(M * topk, N)
    grid = (triton.cdiv(sorted_ids.numel(), block_m), triton.cdiv(N, block_n))
    minimal_sorted_kernel[grid](
        x, weight, flat,
        sorted_ids, expert_ids, num_post,
        N, K, M * topk, topk,
        x.stride(0), x.stride(1),
        weight.stride(0), weight.stride(1), weight.stride(2),
        flat.stride(0), flat.stride(1),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages,
    )
    return out
