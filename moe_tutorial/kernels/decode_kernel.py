"""Part 4 at decode: a batch of a few tokens needs no sort, and its down GEMM can add up the
token's experts itself.

With one token, or a few, each (token, slot) pair usually has an expert to itself. Sorting
them buys nothing; :func:`pair_alignment` gives every pair its own block of rows without a
launch, so the gate/up GEMM runs right away. :func:`decode_down_kernel` then computes, for one
token and one slice of the output, the sum over its topk experts of ``w_j * act_j . W2[e_j]``
in fp32 registers: the layer's last two launches (down GEMM, sum) become one.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .align import Alignment
from .configs import KernelConfig
from .sorted_kernel import load_weight_tile


@triton.jit
def decode_down_kernel(
    act_ptr, b_ptr, b_desc, out_ptr, ids_ptr, router_w_ptr,
    N, K, topk, b_rows_per_expert,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_om, stride_on,
    TOPK_PAD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, USE_TMA: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """out[m, n] = sum_j w[m, j] * act[m * topk + j] . W2[ids[m, j], n] for one BLOCK_N slice.

    The A tile holds the token's topk activation rows; at step (j, k) only row j is loaded (the
    others are zero), so ``tl.dot`` with expert j's weight tile adds into row j alone. The rows
    are weighted and summed once, after the loop.
    """
    pid_n = tl.program_id(0)
    m = tl.program_id(1).to(tl.int64)
    slot = tl.arange(0, TOPK_PAD)
    slot_ok = slot < topk
    pair = m * topk + slot
    experts = tl.load(ids_ptr + pair, mask=slot_ok, other=0).to(tl.int64)
    weights = tl.load(router_w_ptr + pair, mask=slot_ok, other=0.0)
    offs_k = tl.arange(0, BLOCK_K)
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    a_rows = act_ptr + pair[:, None] * stride_am
    acc = tl.zeros((TOPK_PAD, BLOCK_N), dtype=tl.float32)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for t in range(0, topk * k_tiles):
        j = t // k_tiles
        k0 = (t % k_tiles) * BLOCK_K
        k_ok = offs_k < K - k0
        expert = tl.sum(tl.where(slot == j, experts, 0), axis=0)
        a = tl.load(a_rows + (k0 + offs_k)[None, :] * stride_ak, mask=(slot == j)[:, None] & k_ok[None, :],
                    other=0.0)
        b_ptrs = b_ptr + expert * stride_be + offs_n[None, :].to(tl.int64) * stride_bn + \
            (k0 + offs_k)[:, None] * stride_bk
        b_row = (expert * b_rows_per_expert + pid_n * BLOCK_N).to(tl.int32)
        b = load_weight_tile(b_ptrs, b_desc, b_row, k0, k_ok, USE_TMA, EVEN_K)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    out = tl.sum(acc * weights[:, None], axis=0)
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + m * stride_om + offs_cn * stride_on, out.to(out_ptr.dtype.element_ty), mask=offs_cn < N)


_PAIR_ROWS: dict = {}


def pair_alignment(topk_ids: torch.Tensor, block_m: int, num_experts: int) -> Alignment:
    """An :class:`Alignment` with one block per (token, slot) pair, built without a launch.

    Block b holds pair b and ``block_m - 1`` padding rows; its expert is ``topk_ids.view(-1)[b]``.
    Right when pairs rarely share an expert (decode); each shared expert is read once per pair.
    ``topk_ids`` must be contiguous. The constant rows are cached per shape and device.
    """
    pairs = topk_ids.numel()
    key = (pairs, block_m, topk_ids.device)
    if key not in _PAIR_ROWS:
        rows = torch.full((pairs, block_m), pairs, dtype=torch.int32, device=topk_ids.device)
        rows[:, 0] = torch.arange(pairs, dtype=torch.int32, device=topk_ids.device)
        _PAIR_ROWS[key] = (rows.view(-1), torch.full((1,), pairs * block_m, dtype=torch.int32, device=topk_ids.device))
    sorted_ids, num_post = _PAIR_ROWS[key]
    return Alignment((sorted_ids, topk_ids.view(-1), num_post), block_m=block_m, num_experts=num_experts,
                     topk_ids=topk_ids)


def decode_down(act: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor, router: torch.Tensor,
                out: torch.Tensor, config: KernelConfig) -> torch.Tensor:
    """The down GEMM and the sum over each token's experts in one launch.

    ``act`` ``[M * topk, I]``, ``w2`` ``[E, H, I]``, ``topk_ids`` ``[M, topk]`` contiguous,
    ``router`` ``[M * topk]`` fp32, ``out`` ``[M, H]``; uses ``config.block_n``, ``block_k``,
    warps, stages and ``use_tma``. Returns ``out``.
    """
    from .sorted_kernel import _weight_descriptor

    M, topk = topk_ids.shape
    E, H, inter = w2.shape
    b_desc = _weight_descriptor(w2, config) if config.use_tma else None
    grid = (triton.cdiv(H, config.block_n), M)
    decode_down_kernel[grid](
        act, w2, b_desc, out, topk_ids, router, H, inter, topk, H,
        act.stride(0), act.stride(1), w2.stride(0), w2.stride(1), w2.stride(2), out.stride(0), out.stride(1),
        TOPK_PAD=max(16, triton.next_power_of_2(topk)), BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        EVEN_K=inter % config.block_k == 0, USE_TMA=b_desc is not None,
        DOT_PRECISION="ieee" if act.dtype == torch.float32 else "tf32",
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out
