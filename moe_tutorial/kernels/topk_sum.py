"""The layer's last step: add up each token's topk expert rows, in one Triton launch.

The down GEMM leaves one row per (token, slot) pair, ``[M, topk, H]``; the layer's output is
their sum over the topk slots. Each program loads one token's topk rows for a slice of H at
once (all of them in flight together), adds them in fp32 and rounds once.

:func:`sorted_topk_sum` takes the rows in sorted order instead, as Part 7's down GEMM leaves
them when it writes them through TMA copies (whole boxes of sorted rows): each token's sum
gathers its rows from where :func:`~moe_tutorial.kernels.align.sorted_positions` says they lie.

:func:`local_topk_sum` is the expert-parallel layer's variant: it adds only the slots whose
expert lives on this rank. The rows of the other slots are never written by the GEMMs (their
pairs were dropped by the alignment), so they must not be read: they contribute exactly zero.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

#: Columns of H per program: with topk = 8, 8192 elements in flight.
BLOCK_H = 1024


@triton.jit
def topk_sum_kernel(rows_ptr, out_ptr, H, topk, stride_rm, stride_rj, stride_rh, stride_om, stride_oh,
                    TOPK_PAD: tl.constexpr, BLOCK_H: tl.constexpr):
    """out[m, h] = sum_j rows[m, j, h] for one token m and one BLOCK_H slice of h."""
    m = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    slot = tl.arange(0, TOPK_PAD)
    ok = (slot < topk)[:, None] & (offs_h < H)[None, :]
    rows = tl.load(rows_ptr + m * stride_rm + slot[:, None] * stride_rj + offs_h[None, :] * stride_rh,
                   mask=ok, other=0.0)
    total = tl.sum(rows.to(tl.float32), axis=0)
    tl.store(out_ptr + m * stride_om + offs_h * stride_oh, total.to(out_ptr.dtype.element_ty), mask=offs_h < H)


def topk_sum(rows: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``rows.sum(dim=1)`` accumulated in fp32: ``rows`` ``[M, topk, H]`` -> ``[M, H]``, same dtype."""
    M, topk, H = rows.shape
    out = rows.new_empty(M, H) if out is None else out
    if M == 0 or H == 0:
        return out
    grid, meta = sum_launch(M, H, topk)
    topk_sum_kernel[grid](rows, out, H, topk, rows.stride(0), rows.stride(1), rows.stride(2), out.stride(0),
                          out.stride(1), **meta)
    return out


def sum_launch(M: int, H: int, topk: int) -> tuple[tuple[int, int], dict]:
    """``(grid, meta-parameters)`` of the two topk-sum kernels: a program per token and BLOCK_H columns,
    the topk slots padded to a power of two, 8 warps past 8192 elements in flight."""
    block_h = min(BLOCK_H, triton.next_power_of_2(H))
    topk_pad = triton.next_power_of_2(topk)
    return (M, triton.cdiv(H, block_h)), dict(TOPK_PAD=topk_pad, BLOCK_H=block_h,
                                              num_warps=4 if topk_pad * block_h <= 8192 else 8)


@triton.jit
def sorted_topk_sum_kernel(rows_ptr, pos_ptr, out_ptr, H, topk, stride_rr, stride_rh, stride_om, stride_oh,
                           TOPK_PAD: tl.constexpr, BLOCK_H: tl.constexpr):
    """out[m, h] = sum_j rows[pos[m, j], h] for one token m and one BLOCK_H slice of h; a slot at -1
    adds nothing. The topk rows are added as :func:`topk_sum_kernel` adds them (one ``tl.sum``)."""
    m = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    slot = tl.arange(0, TOPK_PAD)
    pos = tl.load(pos_ptr + m * topk + slot, mask=slot < topk, other=-1)
    found = tl.load(rows_ptr + pos.to(tl.int64)[:, None] * stride_rr + offs_h[None, :] * stride_rh,
                    mask=(pos >= 0)[:, None] & (offs_h < H)[None, :], other=0.0)
    tl.store(out_ptr + m * stride_om + offs_h * stride_oh, tl.sum(found.to(tl.float32), axis=0).to(
        out_ptr.dtype.element_ty), mask=offs_h < H)


def sorted_topk_sum(rows: torch.Tensor, positions: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Each token's sum over its topk rows, the rows in sorted order: ``rows`` ``[R, H]``,
    ``positions`` ``[M, topk]`` int32 (:func:`~moe_tutorial.kernels.align.sorted_positions` viewed
    so: the row of each pair, -1 for a pair the alignment dropped) -> ``[M, H]`` in rows' dtype,
    accumulated in fp32. Where the rows hold the same values, the same bits as :func:`topk_sum`."""
    if positions.dim() != 2 or positions.dtype != torch.int32 or not positions.is_contiguous():
        raise ValueError(f"positions: expected a contiguous int32 [M, topk], got {positions.dtype} of shape "
                         f"{tuple(positions.shape)}")
    if rows.dim() != 2:
        raise ValueError(f"rows: expected [R, H], one row per sorted position, got shape {tuple(rows.shape)}")
    (M, topk), H = positions.shape, rows.shape[1]
    out = rows.new_empty(M, H) if out is None else out
    if M == 0 or H == 0:
        return out
    grid, meta = sum_launch(M, H, topk)
    sorted_topk_sum_kernel[grid](rows, positions, out, H, topk, rows.stride(0), rows.stride(1), out.stride(0),
                                 out.stride(1), **meta)
    return out


@triton.jit
def local_topk_sum_kernel(rows_ptr, ids_ptr, out_ptr, H, topk, num_experts, stride_rm, stride_rj, stride_rh,
                          stride_im, stride_ij, stride_om, stride_oh, BLOCK_H: tl.constexpr):
    """out[m, h] = sum of rows[m, j, h] over the slots j with ids[m, j] in [0, num_experts)."""
    m = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    in_h = offs_h < H
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in range(topk):
        expert = tl.load(ids_ptr + m * stride_im + j * stride_ij + 0 * offs_h)   # the slot's id in every lane
        here = in_h & (expert >= 0) & (expert < num_experts)     # a slot of another rank: not read at all
        row = tl.load(rows_ptr + m * stride_rm + j * stride_rj + offs_h * stride_rh, mask=here, other=0.0)
        acc += row.to(tl.float32)
    tl.store(out_ptr + m * stride_om + offs_h * stride_oh, acc.to(out_ptr.dtype.element_ty), mask=in_h)


def local_topk_sum(rows: torch.Tensor, ids: torch.Tensor, num_experts: int,
                   out: torch.Tensor | None = None) -> torch.Tensor:
    """Each token's sum over the slots whose expert is local: ``rows [M, topk, H]``, ``ids [M, topk]``
    int32/int64 -> ``[M, H]`` in rows' dtype, accumulated in fp32.

    Slot ``j`` of token ``m`` counts when ``0 <= ids[m, j] < num_experts``; the rows of the other
    slots are not read (they may hold anything). A token with no local slot gets a row of zeros.
    No host synchronisation: it can be captured in a CUDA graph.
    """
    M, topk, H = rows.shape
    if tuple(ids.shape) != (M, topk):
        raise ValueError(f"ids: expected shape {(M, topk)}, one id per slot of rows, got shape {tuple(ids.shape)}")
    out = rows.new_empty(M, H) if out is None else out
    if M == 0 or H == 0:
        return out
    block_h = min(BLOCK_H, triton.next_power_of_2(H))
    local_topk_sum_kernel[(M, triton.cdiv(H, block_h))](
        rows, ids, out, H, topk, num_experts, rows.stride(0), rows.stride(1), rows.stride(2),
        ids.stride(0), ids.stride(1), out.stride(0), out.stride(1), BLOCK_H=block_h, num_warps=4,
    )
    return out
