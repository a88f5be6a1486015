"""Part 7: Part 4's sorted kernel with block-scaled FP8 (e4m3) operands, the way DeepSeek-V3 is served.

What changes from :mod:`moe_tutorial.kernels.sorted_kernel` is the K loop and the epilogue:

- A (activations) and B (expert weights) are e4m3; A carries one fp32 scale per token and
  128-wide group of K, B one per 128 x 128 block (:mod:`moe_tutorial.quant`).
- Each 128-wide K step multiplies two e4m3 tiles on the FP8 tensor cores and **promotes** the
  product into the fp32 accumulator, scaled by the rows' activation scales and the columns'
  weight-block scales: ``acc += dot(a, b) * a_scale[:, None] * b_scale[None, :]``. The scales
  change every 128 K, so they cannot be applied once at the end.
- The gate/up GEMM's epilogue computes ``silu(gate) * up`` and quantises it, per row and
  128-wide group, into the e4m3 input (and scales) of the down GEMM.
- With SWAP_AB, small row blocks are computed transposed (``C^T = B^T A^T``): the tensor cores'
  tile is at least 64 rows tall, and a 16-row block of tokens would waste most of it, while the
  expert's weight block has BLOCK_N rows to fill it.

The program order, the alignment, the sorted activations and the names of the launch's choices
(``A_ROWS``, ``C_ROWS``, ``EPILOGUE``; B through TMA where the launch passes a descriptor) are
Part 4's. This module holds the ``@triton.jit`` code; :mod:`moe_tutorial.kernels.fp8_layer`
launches it (and the Gluon kernel, where the tuned table chose it).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .fp8_quant import E4M3_MAX_C, MIN_AMAX_C, quantize_group
from .sorted_kernel import grouped_tile, router_weight_epilogue, silu_and_mul_epilogue


@triton.jit
def scaled_dot(a, w, a_scale, w_scale, acc, SWAP_AB: tl.constexpr):
    """One K step: ``acc += (a @ w.T) * a_scale[:, None] * w_scale[None, :]``, the e4m3 product
    promoted into fp32; ``a`` ``[rows, BLOCK_K]``, ``w`` ``[BLOCK_N, BLOCK_K]`` as the weights lie
    (K innermost, the layout FP8 tensor cores read both operands in). With SWAP_AB, ``acc`` is
    transposed, ``[BLOCK_N, rows]``: the weights fill the tile's tall side."""
    # (if/else rather than an early return: Triton's compiler builds both returns of an
    # ``if constexpr: return`` and would fail on the branch that does not apply)
    if SWAP_AB:
        acc = acc + tl.dot(w, tl.trans(a)) * (w_scale[:, None] * a_scale[None, :])
    else:
        acc = acc + tl.dot(a, tl.trans(w)) * (a_scale[:, None] * w_scale[None, :])
    return acc


@triton.jit
def load_fp8_weight_tile(w_ptrs, w_desc, w_row, k0, k_ok, B_TMA: tl.constexpr):
    """One ``[BLOCK_N, BLOCK_K]`` e4m3 tile of the expert's weights, as they lie, through TMA
    (Hopper) or pointer loads (masked only along K: columns wrap modulo N and the store masks them)."""
    if B_TMA:
        w = w_desc.load([w_row, k0])
    else:
        w = tl.load(w_ptrs, mask=k_ok[None, :], other=0.0)
    return w


@triton.jit
def weight_scales(ptrs, BLOCK_N: tl.constexpr):
    """One K step's weight-block scales for the tile's BLOCK_N columns, fp32 ``[BLOCK_N]``: ``ptrs``
    holds one pointer per column, or a single pointer where the whole tile lies in one 128 x 128
    block; then one scale is loaded and broadcast, not BLOCK_N copies of it."""
    return tl.load(ptrs) + tl.zeros([BLOCK_N], dtype=tl.float32)


@triton.jit
def quantize_epilogue(acc, col_ok, E4M3_MAX: tl.constexpr, MIN_AMAX: tl.constexpr):
    """The gate/up GEMM's output tile, ``[rows, 128]`` fp32, as e4m3 values and one scale per row:
    the down GEMM's activations, quantised before they ever reach memory."""
    return quantize_group(tl.where(col_ok[None, :], acc, 0.0), E4M3_MAX, MIN_AMAX)


@triton.jit
def fp8_tile(
    # Which tile: row block, column block, and the expert that owns the row block.
    pid_m, pid_n, expert,
    # What the launch passed (see fp8_moe_kernel), as one tuple.
    shared,
    # Meta-parameters: the tile, then what the launch does (see fp8_moe_kernel).
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    A_ROWS: tl.constexpr, C_ROWS: tl.constexpr, EPILOGUE: tl.constexpr, SWAP_AB: tl.constexpr,
):
    """One [BLOCK_M, BLOCK_N] tile of :func:`fp8_moe_kernel`: row block ``pid_m``, column block ``pid_n``."""
    (a_ptr, a_scale_ptr, b_ptr, b_desc, b_scale_ptr, c_ptr, c_scale_ptr, router_w_ptr, sorted_ids_ptr,
     N, K, num_pairs, a_row_div, stride_a, stride_b, stride_c, stride_a_scale, stride_b_scale, stride_csm) = shared
    stride_am, stride_ak = stride_a
    stride_be, stride_bn, stride_bk = stride_b
    stride_cm, stride_cn = stride_c
    stride_asm, stride_ask = stride_a_scale
    stride_bse, stride_bsn, stride_bsk = stride_b_scale

    # [gather the rows]
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ids_ptr + offs_m)
    row_ok = pair < num_pairs
    if A_ROWS == "gathered":
        a_row = (pair // a_row_div).to(tl.int64)
    else:
        a_row = offs_m.to(tl.int64)                  # the down GEMM: rows lie in sorted order
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_row[:, None] * stride_am + offs_k[None, :] * stride_ak
    a_scale_ptrs = a_scale_ptr + a_row * stride_asm

    # [the expert's weights and their block scales]
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    b_ptrs = b_ptr + expert * stride_be + offs_n[:, None].to(tl.int64) * stride_bn + offs_k[None, :] * stride_bk
    # B as [E * rows, K] for TMA: N rows an expert, gate then up rows (2N) with the SiLU epilogue.
    b_rows_per_expert = 2 * N if EPILOGUE == "silu_and_mul" else N
    b_row = (expert * b_rows_per_expert + pid_n * BLOCK_N).to(tl.int32)   # TMA path only
    if 128 % BLOCK_N == 0:                           # the tile lies in one scale block: one pointer
        b_scale_ptrs = b_scale_ptr + expert * stride_bse + (pid_n * BLOCK_N // 128) * stride_bsn
    else:
        b_scale_ptrs = b_scale_ptr + expert * stride_bse + (offs_n // 128) * stride_bsn
    up_scale_rows = tl.cdiv(N, 128)                  # the up rows' scales: after the gate rows' blocks
    B_TMA: tl.constexpr = b_desc is not None        # the launcher made a descriptor where TMA can read B

    # [the scaled K loop]
    if SWAP_AB:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_ok = offs_k < K - k * BLOCK_K
        group = (k * BLOCK_K) // 128                 # BLOCK_K divides 128: one scale column per step
        a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        a_s = tl.load(a_scale_ptrs + group * stride_ask, mask=row_ok, other=0.0)
        b = load_fp8_weight_tile(b_ptrs, b_desc, b_row, k * BLOCK_K, k_ok, B_TMA)
        b_s = weight_scales(b_scale_ptrs + group * stride_bsk, BLOCK_N)
        acc = scaled_dot(a, b, a_s, b_s, acc, SWAP_AB)
        if EPILOGUE == "silu_and_mul":
            # The up rows sit N rows after the gate rows; their scales up_scale_rows rows on.
            b_up = load_fp8_weight_tile(b_ptrs + N * stride_bn, b_desc, b_row + N, k * BLOCK_K, k_ok, B_TMA)
            b_up_s = weight_scales(b_scale_ptrs + up_scale_rows * stride_bsn + group * stride_bsk, BLOCK_N)
            acc_up = scaled_dot(a, b_up, a_s, b_up_s, acc_up, SWAP_AB)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if SWAP_AB:
        acc = tl.trans(acc)
        acc_up = tl.trans(acc_up)

    # [epilogues]
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = offs_cn < N
    if EPILOGUE == "silu_and_mul":
        acc = silu_and_mul_epilogue(acc, acc_up)
    elif EPILOGUE == "router_weights":
        acc = router_weight_epilogue(acc, router_w_ptr, pair, row_ok)

    # [store the rows]
    if C_ROWS == "sorted":
        c_row = offs_m.to(tl.int64)                  # the gate/up GEMM: leave rows in sorted order
    else:
        c_row = pair.to(tl.int64)
    c_ptrs = c_ptr + c_row[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    if c_ptr.dtype.element_ty == tl.float8e4nv:     # e4m3 C: the down GEMM's input, with one scale per row
        q, scale = quantize_epilogue(acc, col_ok, E4M3_MAX_C, MIN_AMAX_C)
        tl.store(c_ptrs, q.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
        tl.store(c_scale_ptr + c_row * stride_csm + pid_n, scale, mask=row_ok)
    else:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def fp8_moe_kernel(
    # Pointers: A, B and C with their scales, B's TMA descriptor (None where B is read through
    # pointers); the router weights; the alignment (sorted_ids, expert_ids, num_tokens_post_padded).
    a_ptr, a_scale_ptr, b_ptr, b_desc, b_scale_ptr, c_ptr, c_scale_ptr, router_w_ptr, alignment,
    # Sizes, and the tiles' order (GROUP_M row blocks at a time, as in Part 4)
    N, K, num_pairs, max_padded, a_row_div, group_m,
    # Strides: A's and C's (row, column), B's (expert, row, column), as in Part 4; A's scales (row,
    # group), B's (expert, block row, block column), C's (row)
    stride_a, stride_b, stride_c, stride_a_scale, stride_b_scale, stride_csm,
    # Meta-parameters: the tile, where A's and C's rows are, what the epilogue does, and the tile
    # computed transposed
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    A_ROWS: tl.constexpr, C_ROWS: tl.constexpr, EPILOGUE: tl.constexpr, SWAP_AB: tl.constexpr,
):
    """C[pair, n] = A[pair // a_row_div] . B[expert(pair), n], e4m3 operands, block scales, fp32 sums.

    As :func:`moe_tutorial.kernels.sorted_kernel.sorted_moe_kernel`, with: ``a_scale`` ``[rows,
    ceil(K/128)]``, ``b_scale`` ``[E, rows of B / 128, ceil(K/128)]``; with EPILOGUE
    "silu_and_mul", B's rows are gate then up (2N an expert) and the up rows' scales start
    ``ceil(N/128)`` block rows on. A_ROWS ("gathered" or "sorted") and C_ROWS ("scattered" or
    "sorted") are Part 4's sorted-activations layout: the gate/up GEMM writes C's rows at their
    sorted positions, the down GEMM reads A's rows there. An e4m3 C (BLOCK_N = 128) is quantised in
    the epilogue: ``c_scale`` ``[rows, ceil(N/128)]`` receives one scale per row and tile.
    """
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr = alignment
    # [which tile]
    num_pid_m = tl.cdiv(max_padded, BLOCK_M)
    pid_m, pid_n = grouped_tile(tl.program_id(axis=0), num_pid_m, tl.cdiv(N, BLOCK_N), group_m)
    # max_padded is a host-side bound; blocks past the real end have nothing to do.
    if pid_m * BLOCK_M >= tl.load(num_post_ptr):
        return
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    # [the tile]
    shared = (a_ptr, a_scale_ptr, b_ptr, b_desc, b_scale_ptr, c_ptr, c_scale_ptr, router_w_ptr, sorted_ids_ptr,
              N, K, num_pairs, a_row_div, stride_a, stride_b, stride_c, stride_a_scale, stride_b_scale, stride_csm)
    fp8_tile(pid_m, pid_n, expert, shared, BLOCK_M, BLOCK_N, BLOCK_K, A_ROWS, C_ROWS, EPILOGUE, SWAP_AB)


__all__ = ["scaled_dot", "load_fp8_weight_tile", "weight_scales", "quantize_epilogue", "fp8_tile", "fp8_moe_kernel"]
