"""Part 4: the production kernel. Pairs sorted by expert, one expert per program, ``tl.dot``.

:func:`moe_tutorial.kernels.align.align_block_size` groups the (token, slot) pairs by expert in runs
padded to BLOCK_M. Each program then owns one block of BLOCK_M pairs (all of one expert) and
one BLOCK_N slice of the output, gathers the pairs' input rows, and multiplies them by the
expert's weights on tensor cores. Epilogues fuse SiLU(gate) * up and the router weights. In
the layer, the gate/up GEMM leaves its rows in sorted order and the down GEMM reads them as they
lie (sorted activations).

This module holds the ``@triton.jit`` code only, built from small functions, one production step
each (grouped order, TMA weight loads, short tails, the two epilogues), so that notebook 04 can
show each step's lines on their own; :mod:`moe_tutorial.kernels.persistent_kernel` runs the same
tiles on a persistent grid, and :mod:`moe_tutorial.kernels.sorted_layer` launches both (the
public entry points). :mod:`moe_tutorial.kernels.minimal_sorted_kernel` is the same idea with
none of the steps.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def grouped_tile(pid, num_pid_m, num_pid_n, group_m):
    """``(pid_m, pid_n)`` of program ``pid`` in grouped order: ``group_m`` row blocks down a column, then
    the next column, so programs that run together share weights in L2. ``group_m`` is a plain
    argument, not a meta-parameter: only this arithmetic reads it, once per program."""
    pids_per_group = group_m * num_pid_n
    first_m = (pid // pids_per_group) * group_m
    group_rows = tl.minimum(num_pid_m - first_m, group_m)
    pid_m = first_m + (pid % pids_per_group) % group_rows
    pid_n = (pid % pids_per_group) // group_rows
    return pid_m, pid_n


def pid_to_tile(pid: int, num_pid_m: int, num_pid_n: int, group_m: int) -> tuple[int, int]:
    """:func:`grouped_tile` in plain Python, for the figures and the exercise checkers:
    ``(pid_m, pid_n)`` of program ``pid``. ``group_m = 1`` is plain row-major order.

    Keep the two in step: tests/test_index_math.py checks this against the tiles the kernel's
    programs really store.
    """
    pids_per_group = group_m * num_pid_n
    first_m = (pid // pids_per_group) * group_m
    group_rows = min(num_pid_m - first_m, group_m)
    return first_m + (pid % pids_per_group) % group_rows, (pid % pids_per_group) // group_rows


@triton.jit
def second_half_is_padding(sorted_ids_ptr, pid_m, num_pairs, BLOCK_M: tl.constexpr):
    """True when the last BLOCK_M // 2 rows of row block ``pid_m`` are all padding.

    A run's padding comes after its pairs, so a block's real rows are a prefix of it: the last
    block of an expert's run often holds a few rows and needs only half the multiply.
    """
    offs_half = pid_m * BLOCK_M + BLOCK_M // 2 + tl.arange(0, BLOCK_M // 2)
    return tl.min(tl.load(sorted_ids_ptr + offs_half)) == num_pairs


@triton.jit
def load_weight_tile(b_ptrs, b_desc, b_row, k0, k_ok, USE_TMA: tl.constexpr, EVEN_K: tl.constexpr):
    """One ``[BLOCK_K, BLOCK_N]`` tile of the expert's weights, K elements from ``k0`` on.

    With USE_TMA, the Tensor Memory Accelerator (TMA, Hopper's engine for bulk tensor copies into
    shared memory) fetches the tile through the descriptor ``b_desc`` at row ``b_row``, leaving
    the threads free; rows past this expert's N belong to the next expert, and the store masks
    them. Otherwise the threads load it through ``b_ptrs``, masking K only where K is ragged.
    """
    if USE_TMA:
        b = b_desc.load([b_row, k0]).T
    elif EVEN_K:
        b = tl.load(b_ptrs)
    else:
        b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
    return b


@triton.jit
def silu_and_mul_epilogue(gate, up):
    """``silu(gate) * up`` on the fp32 accumulators, before anything is written to memory."""
    return gate * tl.sigmoid(gate) * up


@triton.jit
def router_weight_epilogue(acc, router_w_ptr, pair, row_ok):
    """Each row (one (token, slot) pair) times its router weight, still in fp32 registers."""
    w = tl.load(router_w_ptr + pair, mask=row_ok, other=0.0)
    return acc * w[:, None]


@triton.jit
def sorted_tile(
    # What differs between a whole row block and half a one (short tails): A's TMA descriptor
    # (None unless A_ROWS is "sorted_tma") and how many rows the tile has; then which tile.
    a_desc, ROWS: tl.constexpr, pid_m, pid_n, expert,
    # What every tile of the launch shares, bundled by the kernel (see sorted_moe_kernel).
    shared,
    # Meta-parameters: the tile, then what the launch does (see sorted_moe_kernel).
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    A_ROWS: tl.constexpr, C_ROWS: tl.constexpr, EPILOGUE: tl.constexpr, EVEN_K: tl.constexpr,
):
    """The first ROWS rows of row block ``pid_m`` times one expert's ``[BLOCK_N, K]`` slice."""
    (a_ptr, b_ptr, b_desc, c_ptr, router_w_ptr, sorted_ids_ptr,
     N, K, num_pairs, a_row_div, stride_b_up, b_rows_per_expert, stride_a, stride_b, stride_c) = shared
    stride_am, stride_ak = stride_a
    stride_be, stride_bn, stride_bk = stride_b
    stride_cm, stride_cn = stride_c
    B_TMA: tl.constexpr = b_desc is not None        # the launcher made a descriptor where TMA can read B
    # fp32 inputs multiply in full fp32 ("ieee"), not rounded to tf32 on the tensor cores.
    if a_ptr.dtype.element_ty == tl.float32:
        DOT_PRECISION: tl.constexpr = "ieee"
    else:
        DOT_PRECISION: tl.constexpr = "tf32"
    # [gather the rows]
    offs_m = pid_m * BLOCK_M + tl.arange(0, ROWS)
    pair = tl.load(sorted_ids_ptr + offs_m)
    row_ok = pair < num_pairs                       # padding rows hold num_pairs
    if A_ROWS == "gathered":
        a_row = (pair // a_row_div).to(tl.int64)
    else:
        # A is already in sorted order (the gate/up GEMM wrote it so): row = position, no gather.
        a_row = offs_m.to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_row[:, None] * stride_am + offs_k[None, :] * stride_ak

    # [the expert's weights]
    # Columns wrap modulo N so that loads stay in bounds without a mask; the store masks them.
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    b_ptrs = b_ptr + expert * stride_be + offs_n[None, :].to(tl.int64) * stride_bn + offs_k[:, None] * stride_bk
    b_row = (expert * b_rows_per_expert + pid_n * BLOCK_N).to(tl.int32)   # TMA path only

    # [the K loop]
    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_ok = offs_k < K - k * BLOCK_K
        if A_ROWS == "sorted_tma":
            # Sorted rows are contiguous, so TMA fetches A too. Padding rows bring whatever is
            # there; each output row depends on its own A row only, and padding rows are never stored.
            a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
        elif EVEN_K:
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
        else:
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = load_weight_tile(b_ptrs, b_desc, b_row, k * BLOCK_K, k_ok, B_TMA, EVEN_K)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        if EPILOGUE == "silu_and_mul":
            # The up rows sit N rows (stride_b_up elements) after the gate rows of the same expert.
            b_up = load_weight_tile(b_ptrs + stride_b_up, b_desc, b_row + N, k * BLOCK_K, k_ok, B_TMA, EVEN_K)
            acc_up = tl.dot(a, b_up, acc_up, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    # [epilogues]
    if EPILOGUE == "silu_and_mul":
        acc = silu_and_mul_epilogue(acc, acc_up)
    elif EPILOGUE == "router_weights":
        acc = router_weight_epilogue(acc, router_w_ptr, pair, row_ok)

    # [scatter the rows]
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # With C_ROWS = "sorted" the rows stay in sorted order, where the down GEMM reads them as whole blocks.
    if C_ROWS == "sorted":
        c_row = offs_m.to(tl.int64)
    else:
        c_row = pair.to(tl.int64)
    c_ptrs = c_ptr + c_row[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & (offs_cn[None, :] < N))


#: What :func:`sorted_moe_kernel`'s epilogue does, by EPILOGUE: one value, since no launch does both.
EPILOGUES = (None, "silu_and_mul", "router_weights")


@triton.jit
def sorted_moe_kernel(
    # Pointers: A, B (the experts' weights) and C; TMA descriptors over A (whole and half row
    # blocks) and B, None where unused; the router weights; the alignment, as align_block_size
    # returns it (sorted_ids, expert_ids, num_tokens_post_padded).
    a_ptr, a_desc, a_desc_half, b_ptr, b_desc, c_ptr, router_w_ptr, alignment,
    # Sizes, and the tiles' order (GROUP_M row blocks at a time, grouped_tile)
    N, K, num_pairs, max_padded, a_row_div, stride_b_up, b_rows_per_expert, group_m,
    # Strides: A's and C's (row, column), B's (expert, row, column)
    stride_a, stride_b, stride_c,
    # Meta-parameters: the tile ...
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    # ... where A's and C's rows are, what the epilogue does ...
    A_ROWS: tl.constexpr, C_ROWS: tl.constexpr, EPILOGUE: tl.constexpr,
    # ... half tiles for half-empty row blocks, and K a multiple of BLOCK_K.
    SHORT_TAILS: tl.constexpr, EVEN_K: tl.constexpr,
):
    """C[pair, n] = A[pair // a_row_div] . B[expert(pair), n] for one [BLOCK_M, BLOCK_N] tile.

    Pairs are flat indices m * topk + j. For the first GEMM A is x and a_row_div = topk; for
    the down GEMM A holds one row per pair and a_row_div = 1.

    * A_ROWS: "gathered" (row ``pair // a_row_div``, through pointers), or in sorted order
      (sorted activations: row = sorted position, no gather) through pointers, "sorted", or
      through TMA, "sorted_tma" (``a_desc``, ``a_desc_half`` for half blocks).
    * ``b_desc`` (Hopper): B tiles come through this tensor descriptor over B viewed as
      ``[E * b_rows_per_expert, K]``; None: through pointers.
    * C_ROWS: "scattered" (row ``pair``), or "sorted" (row = sorted position; C has
      max_padded rows).
    * EPILOGUE: None; "silu_and_mul" (B has 2N rows, gate then up, the up rows stride_b_up
      further on, and C = silu(A.B_gate) * (A.B_up)); "router_weights" (each row times its pair's
      router weight).
    * SHORT_TAILS: a block whose second half is padding multiplies only its first BLOCK_M // 2 rows.
    * fp32 A multiplies in full fp32 precision, other dtypes on the tensor cores as they are.
    """
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr = alignment
    # [which tile]
    num_pid_m = tl.cdiv(max_padded, BLOCK_M)
    pid_m, pid_n = grouped_tile(tl.program_id(axis=0), num_pid_m, tl.cdiv(N, BLOCK_N), group_m)
    # max_padded is a host-side bound; blocks past the real end have nothing to do.
    if pid_m * BLOCK_M >= tl.load(num_post_ptr):
        return
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    # [short tails]
    half_full = False
    if SHORT_TAILS:
        half_full = second_half_is_padding(sorted_ids_ptr, pid_m, num_pairs, BLOCK_M)
    # [the tile, whole or half]
    # What every tile shares goes to sorted_tile as one tuple; the two calls differ in A's
    # descriptor and the rows of the tile.
    shared = (a_ptr, b_ptr, b_desc, c_ptr, router_w_ptr, sorted_ids_ptr,
              N, K, num_pairs, a_row_div, stride_b_up, b_rows_per_expert, stride_a, stride_b, stride_c)
    if half_full:
        sorted_tile(a_desc_half, BLOCK_M // 2, pid_m, pid_n, expert, shared,
                    BLOCK_M, BLOCK_N, BLOCK_K, A_ROWS, C_ROWS, EPILOGUE, EVEN_K)
    else:
        sorted_tile(a_desc, BLOCK_M, pid_m, pid_n, expert, shared,
                    BLOCK_M, BLOCK_N, BLOCK_K, A_ROWS, C_ROWS, EPILOGUE, EVEN_K)


__all__ = ["grouped_tile", "pid_to_tile", "second_half_is_padding", "load_weight_tile", "silu_and_mul_epilogue",
           "router_weight_epilogue", "sorted_tile", "sorted_moe_kernel", "EPILOGUES"]
