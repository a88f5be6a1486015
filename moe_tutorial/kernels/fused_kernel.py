"""Part 3: one Triton kernel that gathers each token's experts and multiplies, no intermediate.

Each program owns one token (BLOCK_M = 1) and one BLOCK_N slice of the output features, for
all ``topk`` experts of that token at once: the experts sit side by side in one
``FUSED_N = TOPK_PAD * BLOCK_N`` wide tile.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import runtime
from ..checks import check_matmul_inputs, check_power_of_two, first_gemm_out


@triton.jit
def fused_moe_kernel(
    x_ptr, w_ptr, topk_ids_ptr, out_ptr,
    N, K, TOPK,
    stride_xm, stride_xk,
    stride_we, stride_wn, stride_wk,
    stride_im, stride_ik,
    stride_om, stride_ot, stride_on,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, TOPK_PAD: tl.constexpr,
):
    """out[m, j, n] = sum_k x[m, k] * w[topk_ids[m, j], n, k] for one token and one N block."""
    # [Step 0: the grid]
    # Program (pid_m, pid_n) writes token pid_m, features [pid_n*BLOCK_N, (pid_n+1)*BLOCK_N),
    # for every one of the token's topk experts. int64 so that m * stride cannot overflow.
    pid_m = tl.program_id(axis=0).to(tl.int64)
    pid_n = tl.program_id(axis=1)

    # [Step 1: the fused-topk encoding]
    # Lay the topk experts side by side. arange needs a power of two, hence TOPK_PAD >= TOPK;
    # the padding columns are masked off everywhere below.
    FUSED_N: tl.constexpr = TOPK_PAD * BLOCK_N
    offs = tl.arange(0, FUSED_N)
    topk_idx = offs // BLOCK_N                   # which of the token's experts: 0 0 .. 1 1 ..
    n_inner = offs % BLOCK_N                     # column inside the block:   0 1 .. 0 1 ..
    n_global = pid_n * BLOCK_N + n_inner         # output feature this column computes
    col_ok = (topk_idx < TOPK) & (n_global < N)

    # [Step 2: the gather pointer grid]
    # One expert id per column; int64 because expert * stride_we passes 2^31 on large models.
    expert = tl.load(topk_ids_ptr + pid_m * stride_im + topk_idx * stride_ik,
                     mask=topk_idx < TOPK, other=0).to(tl.int64)
    # Each column's pointer to k = 0 of its weight row; the K loop adds k[:, None] * stride_wk
    # to make the [BLOCK_K, FUSED_N] grid of pointers of one step.
    w_col_ptrs = w_ptr + expert * stride_we + n_global.to(tl.int64) * stride_wn   # [FUSED_N]

    # [Step 3: the K loop]
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((FUSED_N,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + offs_k
        k_ok = k < K
        x_chunk = tl.load(x_ptr + pid_m * stride_xm + k * stride_xk, mask=k_ok, other=0.0)
        # The gather: a [BLOCK_K, FUSED_N] grid of pointers, each column inside its own expert.
        w_chunk = tl.load(w_col_ptrs[None, :] + k[:, None] * stride_wk,
                          mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        # A single token row is far below tl.dot's 16-row minimum: multiply and reduce over K.
        acc += tl.sum(x_chunk.to(tl.float32)[:, None] * w_chunk.to(tl.float32), axis=0)

    # [Step 3: the scatter]
    # Scatter the fused row back to out[m, topk_idx, n_global]; the store casts to out's dtype.
    out_ptrs = out_ptr + pid_m * stride_om + topk_idx * stride_ot + n_global * stride_on
    tl.store(out_ptrs, acc, mask=col_ok)


def default_blocks(topk: int, N: int, K: int, *, interpreted: bool | None = None) -> tuple[int, int]:
    """``(BLOCK_N, BLOCK_K)``: a [BLOCK_K, FUSED_N] tile of about 8K elements on a GPU.

    In the interpreter every program costs about a millisecond, so the blocks are wider there.
    ``interpreted`` picks the branch (default: this machine's runtime), so that a CPU can say
    which blocks a GPU would use.
    """
    topk_pad = triton.next_power_of_2(topk)
    if runtime.INTERPRETED if interpreted is None else interpreted:
        block_n = min(triton.next_power_of_2(max(N, 1)), 64)
        block_k = min(triton.next_power_of_2(max(K, 1)), 128)
    else:
        block_n = max(16, min(128, 256 // topk_pad))
        block_k = max(16, 8192 // (topk_pad * block_n))
    return block_n, block_k


def resolve_blocks(topk: int, N: int, K: int, block_n: int | None, block_k: int | None) -> tuple[int, int]:
    """``(BLOCK_N, BLOCK_K)``: the ones given, checked to be powers of two, or the defaults."""
    dn, dk = default_blocks(topk, N, K)
    block_n = dn if block_n is None else block_n
    block_k = dk if block_k is None else block_k
    return check_power_of_two("block_n", block_n), check_power_of_two("block_k", block_k)


def fused_moe_matmul(x: torch.Tensor, weight: torch.Tensor, topk_ids: torch.Tensor, *,
                     block_n: int | None = None, block_k: int | None = None,
                     out: torch.Tensor | None = None, kernel=None) -> torch.Tensor:
    """First GEMM with Part 3's kernel: grid ``(M, cdiv(N, BLOCK_N))``, BLOCK_M = 1.

    Args:
        x: ``[M, K]`` fp32 (interpreter) or fp32/fp16/bf16 (GPU); any strides.
        weight: ``[E, N, K]`` x's dtype; any strides.
        topk_ids: ``[M, topk]`` int32/int64 in ``[0, E)``; any topk from 1 to E.
        block_n, block_k: powers of two; defaults from :func:`default_blocks`.
        out: optional ``[M, topk, N]`` buffer to write into: any strides, but no two elements
            at one address and no memory shared with the inputs.
        kernel: the ``@triton.jit`` kernel to launch, with :func:`fused_moe_kernel`'s arguments
            (default: that kernel; notebook 03 passes the reader's edited copy, see ``moe_tutorial.edited_kernel``).

    No backward pass: inputs that require grad are refused unless autograd is off.

    Returns:
        ``[M, topk, N]`` in x's dtype, accumulated in fp32.
    """
    M, K, N, E, topk = check_matmul_inputs(x, weight, topk_ids, kernel=True)
    out = first_gemm_out(out, x, weight, topk_ids)
    block_n, block_k = resolve_blocks(topk, N, K, block_n, block_k)
    if M == 0 or N == 0:
        return out
    # [Step 0: the grid]
    # One program per token (axis 0) and per BLOCK_N block of output features (axis 1).
    grid = (M, triton.cdiv(N, block_n))
    (fused_moe_kernel if kernel is None else kernel)[grid](
        x, weight, topk_ids, out,
        N, K, topk,
        x.stride(0), x.stride(1),
        weight.stride(0), weight.stride(1), weight.stride(2),
        topk_ids.stride(0), topk_ids.stride(1),
        out.stride(0), out.stride(1), out.stride(2),
        BLOCK_N=block_n, BLOCK_K=block_k, TOPK_PAD=triton.next_power_of_2(topk),
    )
    return out
