"""Part 8: the kernels of the layer's backward pass, and the forward GEMM that saves for it.

The layer, per (token t, slot k) pair p with expert e and router weight s, and H the gate/up
GEMM's output before the activation:

    H_p = W13[e] x_t,   A_p = silu(H_p,gate) * H_p,up,   Y_p = W2[e] A_p,   O_t = sum_k s_p Y_p

Given dO, the gradient of the loss with respect to O, the backward is five GEMM-shaped steps:

    dA'_p = W2[e]^T dO_t                    (so dA_p = s_p dA'_p)
    dS_p  = <dA'_p, A_p>                    the router gradient: <dO_t, Y_p> without Y
    dH_p  = s_p * dSwiGLU(dA'_p, H_p)
    dW2[e] = sum_p dO_t (s_p A_p)^T,  dW13[e] = sum_p dH_p x_t^T
    dx_t  = sum_k W13[e]^T dH_p

Two kernels compute them, both over Part 4's sorted pairs (one alignment for every GEMM of the
layer, forward and backward):

* :func:`rows_gemm_kernel`, an **M-grouped** GEMM: each program owns BLOCK_M sorted pairs (one
  expert) and BLOCK_N output columns, as in Part 4. Its epilogue is what differs: in the forward
  (``"save_swiglu"``) it writes H, kept for the backward, and A for the down GEMM; in the
  backward (``"dswiglu"``) it recomputes A from the saved H and writes dH, s*A and the router
  gradient's partial sums, one per column block (no atomics); for dx (``"scatter"``) it writes
  plain rows, which Part 4's :func:`moe_tutorial.kernels.topk_sum.topk_sum` then adds per token.
* :func:`expert_grad_kernel`, a **K-grouped** ("varlen-K") GEMM for the weight gradients: the
  sum runs over an expert's pairs, a different number for each expert. One program owns one
  output tile of one expert's dW and walks that expert's rows; no two programs write the same
  element, so there are no atomics and the sum's order is fixed.

Only x, H and the alignment are kept from the forward; A is recomputed, and Y never exists. H is
kept in pair order, one row per (token, slot) pair and no padding rows: exactly the bytes of its values.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .configs import KernelConfig
from .dswiglu import dswiglu_epilogue
from .gluon_dact_kernel import launch_gluon_dact
from .gluon_grad_kernel import launch_gluon_expert_grad
from .persistent_kernel import persistent_grid
from .sorted_kernel import grouped_tile, load_weight_tile, pid_to_tile
from .tma import rows_descriptor, weight_descriptor

#: The epilogues of :func:`rows_gemm_kernel`.
EPILOGUES = ("save_swiglu", "dswiglu", "scatter")


@triton.jit
def load_weight_tile_kn(b_ptrs, b_desc, b_row, n0, k_ok, USE_TMA: tl.constexpr, EVEN_K: tl.constexpr):
    """One ``[BLOCK_K, BLOCK_N]`` tile of an expert's weights stored ``[K, N]`` (the contraction
    runs down the rows), as the backward reads W2 (``dA' = dO W2[e]``) and W13 (``dx = dH W13[e]``).

    With USE_TMA the tile comes through ``b_desc``, a descriptor over the weights viewed as
    ``[E * K, N]``, at row ``b_row``: only when K is a multiple of BLOCK_K, or the last K tile
    would read the next expert's first rows. Otherwise the threads load it, masking ragged K.
    """
    if USE_TMA:
        b = b_desc.load([b_row, n0])
    elif EVEN_K:
        b = tl.load(b_ptrs)
    else:
        b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
    return b


@triton.jit
def dswiglu_columns(dact, col0, s, row_ok, pair_row, sorted_row, h_ptr, c_ptr, act_ptr, N,
                    stride_hm, stride_cm, stride_cn, stride_actm):
    """The "dswiglu" epilogue on the columns ``col0 + [0, width)`` of dA' (``dact``, fp32): read H's
    gate and up there (at each pair's row), write dH (gate, then up ``N`` columns on) and ``s * A``
    at the sorted rows (padding rows as zeros), and return each row's ``sum dA' * A`` over these columns."""
    offs_cn = col0 + tl.arange(0, dact.shape[1])
    col_ok = offs_cn < N
    keep = row_ok[:, None] & col_ok[None, :]
    h_ptrs = h_ptr + pair_row * stride_hm + offs_cn[None, :]
    gate = tl.load(h_ptrs, mask=keep, other=0.0).to(tl.float32)
    up = tl.load(h_ptrs + N, mask=keep, other=0.0).to(tl.float32)
    d_gate, d_up, s_act, act = dswiglu_epilogue(dact, gate, up, s)
    dh_ptrs = c_ptr + sorted_row * stride_cm + offs_cn[None, :] * stride_cn
    tl.store(dh_ptrs, tl.where(keep, d_gate, 0.0).to(c_ptr.dtype.element_ty), mask=col_ok[None, :])
    tl.store(dh_ptrs + N * stride_cn, tl.where(keep, d_up, 0.0).to(c_ptr.dtype.element_ty), mask=col_ok[None, :])
    tl.store(act_ptr + sorted_row * stride_actm + offs_cn[None, :],
             tl.where(keep, s_act, 0.0).to(act_ptr.dtype.element_ty), mask=col_ok[None, :])
    return tl.sum(tl.where(keep, dact * act, 0.0), axis=1)


@triton.jit
def rows_gemm_kernel(
    # Pointers: A (rows) and its TMA descriptor (None unless A_ROWS is "sorted_tma"), B (the
    # experts' weights) and its descriptor (None unless B_TMA), C; the epilogue's: H (written by
    # "save_swiglu", read by "dswiglu"), the second output (A, or s * A), the router weights and
    # the router gradient's partial sums; the alignment.
    a_ptr, a_desc, b_ptr, b_desc, c_ptr, h_ptr, act_ptr, router_w_ptr, ds_ptr,
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr,
    # Sizes: N output columns (I for the gated epilogues), K the contraction
    N, K, num_pairs, max_padded, a_row_div, b_rows_per_expert,
    # Strides
    stride_am, stride_ak,
    stride_be, stride_bn, stride_bk,
    stride_cm, stride_cn,
    stride_hm, stride_actm, stride_dsm,
    # Meta-parameters: the tile and its order ...
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    # ... where A's rows are, how B is stored ("nk": [E, N, K] as in Part 4; "kn": [E, K, N]) ...
    A_ROWS: tl.constexpr, B_LAYOUT: tl.constexpr, B_TMA: tl.constexpr,
    # ... what the epilogue does (see EPILOGUES), and whether a program walks many tiles.
    EPILOGUE: tl.constexpr, EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr, PERSISTENT: tl.constexpr,
):
    """C[pair, n] = A[row(pair)] . B[expert(pair)][:, n] for [BLOCK_M, BLOCK_N] tiles of sorted pairs
    (:func:`rows_tile`): one tile per program, or with PERSISTENT one program per SM walking the
    real tiles (as Part 4's :func:`moe_tutorial.kernels.persistent_kernel.persistent_moe_kernel`),
    so that the next tile's first loads are in flight while this tile's epilogue runs."""
    num_pid_n = tl.cdiv(N, BLOCK_N)
    args = (a_ptr, a_desc, b_ptr, b_desc, c_ptr, h_ptr, act_ptr, router_w_ptr, ds_ptr, sorted_ids_ptr, expert_ids_ptr,
            N, K, num_pairs, a_row_div, b_rows_per_expert, stride_am, stride_ak, stride_be, stride_bn, stride_bk,
            stride_cm, stride_cn, stride_hm, stride_actm, stride_dsm)
    if PERSISTENT:
        # The real row blocks only, read on the device.
        num_pid_m = tl.cdiv(tl.load(num_post_ptr), BLOCK_M)
        for t in tl.range(tl.program_id(axis=0), num_pid_m * num_pid_n, tl.num_programs(axis=0), flatten=True):
            pid_m, pid_n = grouped_tile(t, num_pid_m, num_pid_n, GROUP_M)
            rows_tile(pid_m, pid_n, args, BLOCK_M, BLOCK_N, BLOCK_K, A_ROWS, B_LAYOUT, B_TMA, EPILOGUE, EVEN_K,
                      DOT_PRECISION)
    else:
        pid_m, pid_n = grouped_tile(tl.program_id(axis=0), tl.cdiv(max_padded, BLOCK_M), num_pid_n, GROUP_M)
        if pid_m * BLOCK_M < tl.load(num_post_ptr):
            rows_tile(pid_m, pid_n, args, BLOCK_M, BLOCK_N, BLOCK_K, A_ROWS, B_LAYOUT, B_TMA, EPILOGUE, EVEN_K,
                      DOT_PRECISION)


@triton.jit
def rows_tile(pid_m, pid_n, args, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              A_ROWS: tl.constexpr, B_LAYOUT: tl.constexpr, B_TMA: tl.constexpr, EPILOGUE: tl.constexpr,
              EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """One [BLOCK_M, BLOCK_N] tile of :func:`rows_gemm_kernel` (``args``: its pointers, sizes and strides).

    * A_ROWS: "gathered" (row ``pair // a_row_div``: x or dO, one row per token), "sorted" or
      "sorted_tma" (row = sorted position: dH, which the "dswiglu" epilogue wrote so).
    * EPILOGUE "save_swiglu" (B "nk", W13): two accumulators, gate and up; H's gate and up tiles
      go to ``h_ptr`` at each pair's row (no padding rows kept) and ``silu(gate) * up`` to
      ``act_ptr`` in sorted rows.
      "dswiglu" (B "kn", W2): the accumulator is dA'; H's tiles are read back from ``h_ptr``, A
      recomputed, and dH goes to ``c_ptr`` (gate then up), ``s * A`` to ``act_ptr`` (sorted rows),
      and ``sum_n dA' * A`` over this tile's columns to ``ds_ptr[pair, pid_n]``.
      "scatter": C's row is the pair.
    Sorted outputs write the padding rows as zeros: the K-grouped GEMMs read whole runs.
    """
    (a_ptr, a_desc, b_ptr, b_desc, c_ptr, h_ptr, act_ptr, router_w_ptr, ds_ptr, sorted_ids_ptr, expert_ids_ptr,
     N, K, num_pairs, a_row_div, b_rows_per_expert, stride_am, stride_ak, stride_be, stride_bn, stride_bk,
     stride_cm, stride_cn, stride_hm, stride_actm, stride_dsm) = args
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    # [the rows]
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ids_ptr + offs_m)
    row_ok = pair < num_pairs                       # padding rows hold num_pairs
    if A_ROWS == "gathered":
        a_row = (pair // a_row_div).to(tl.int64)
    else:
        a_row = offs_m.to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_row[:, None] * stride_am + offs_k[None, :] * stride_ak

    # [the weights]
    # Columns wrap modulo N so that loads stay in bounds without a mask; the stores mask them.
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    if B_LAYOUT == "nk":
        b_ptrs = b_ptr + expert * stride_be + offs_n[None, :].to(tl.int64) * stride_bn + offs_k[:, None] * stride_bk
        b_row = (expert * b_rows_per_expert + pid_n * BLOCK_N).to(tl.int32)
    else:
        b_ptrs = b_ptr + expert * stride_be + offs_n[None, :] * stride_bn + offs_k[:, None].to(tl.int64) * stride_bk
        b_row = (expert * b_rows_per_expert).to(tl.int32)

    # [the K loop]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_ok = offs_k < K - k * BLOCK_K
        if A_ROWS == "sorted_tma":
            a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
        elif EVEN_K:
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
        else:
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        if B_LAYOUT == "nk":
            b = load_weight_tile(b_ptrs, b_desc, b_row, k * BLOCK_K, k_ok, B_TMA, EVEN_K)
        else:
            b = load_weight_tile_kn(b_ptrs, b_desc, b_row + k * BLOCK_K, pid_n * BLOCK_N, k_ok, B_TMA, EVEN_K)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        if EPILOGUE == "save_swiglu":
            # The up rows of W13 sit N rows after the gate rows of the same expert.
            b_up = load_weight_tile(b_ptrs + N * stride_bn, b_desc, b_row + N, k * BLOCK_K, k_ok, B_TMA, EVEN_K)
            acc_up = tl.dot(a, b_up, acc_up, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = offs_cn < N
    sorted_row = offs_m.to(tl.int64)[:, None]
    if EPILOGUE == "save_swiglu":
        # [save H, write A]
        keep = row_ok[:, None]
        # H at each pair's row: what the backward keeps is then the values alone, no padding rows.
        h_ptrs = h_ptr + pair.to(tl.int64)[:, None] * stride_hm + offs_cn[None, :]
        tl.store(h_ptrs, acc.to(h_ptr.dtype.element_ty), mask=keep & col_ok[None, :])
        tl.store(h_ptrs + N, acc_up.to(h_ptr.dtype.element_ty), mask=keep & col_ok[None, :])
        act = acc * tl.sigmoid(acc) * acc_up
        tl.store(act_ptr + sorted_row * stride_actm + offs_cn[None, :],
                 tl.where(keep, act, 0.0).to(act_ptr.dtype.element_ty), mask=col_ok[None, :])
    elif EPILOGUE == "dswiglu":
        # [recompute A, write dH, s*A and the router gradient]
        # One half of the columns at a time: the epilogue holds dA', H's two tiles and what it computes
        # from them at once, and whole 128 x 128 tiles overflowed the registers (spills; Nsight Compute, H200).
        HALF: tl.constexpr = BLOCK_N // 2
        first, second = tl.split(tl.permute(tl.reshape(acc, (BLOCK_M, 2, HALF)), (0, 2, 1)))
        s = tl.load(router_w_ptr + pair, mask=row_ok, other=0.0)
        col0 = pid_n * BLOCK_N
        pair_row = pair.to(tl.int64)[:, None]
        partial = (dswiglu_columns(first, col0, s, row_ok, pair_row, sorted_row, h_ptr, c_ptr, act_ptr, N,
                                   stride_hm, stride_cm, stride_cn, stride_actm)
                   + dswiglu_columns(second, col0 + HALF, s, row_ok, pair_row, sorted_row, h_ptr, c_ptr, act_ptr,
                                     N, stride_hm, stride_cm, stride_cn, stride_actm))
        # dS = <dA', A>: this tile's share, one partial per column block, added up later in a fixed order.
        tl.store(ds_ptr + pair.to(tl.int64) * stride_dsm + pid_n, partial, mask=row_ok)
    else:
        # [scatter the rows]
        c_ptrs = c_ptr + pair.to(tl.int64)[:, None] * stride_cm + offs_cn[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def load_run_rows(ptr, desc, rows, r0, pair, row_ok, row_div, stride_m, col0, offs, cols_ok,
                  ROWS: tl.constexpr, EVEN: tl.constexpr):
    """``[BLOCK_R, BLOCK]`` rows of one operand of a K-grouped GEMM: rows ``r0 + i`` of an
    expert's run, each the sorted position's own row ("sorted", through pointers, or "sorted_tma"
    through ``desc``: padding rows hold zeros, or in a sorted copy of x or dO finite values that
    the other operand's zero rows cancel) or the row of its token, ``pair // row_div``
    ("gathered": x or dO, padding and foreign rows masked to zero)."""
    if ROWS == "sorted_tma":
        tile = desc.load([r0, col0])
    else:
        if ROWS == "gathered":
            row = (pair // row_div).to(tl.int64)
        else:
            row = rows.to(tl.int64)
        ptrs = ptr + row[:, None] * stride_m + offs[None, :]
        if EVEN:
            tile = tl.load(ptrs, mask=row_ok[:, None], other=0.0)
        else:
            tile = tl.load(ptrs, mask=row_ok[:, None] & cols_ok[None, :], other=0.0)
    return tile


@triton.jit
def expert_grad_kernel(
    # Pointers: L [rows, P] and R [rows, Q] and their TMA descriptors (sorted operands only),
    # dW [E, P, Q]; the alignment's sorted pairs and each expert's first sorted row.
    l_ptr, l_desc, r_ptr, r_desc, c_ptr, sorted_ids_ptr, expert_rows_ptr,
    # Sizes
    P, Q, num_pairs, row_div,
    # Strides (the operands' columns are contiguous)
    stride_lm, stride_rm, stride_ce, stride_cp, stride_cq,
    # Meta-parameters: the tile (BLOCK_R rows of the run per step), its order, the operands' rows
    BLOCK_P: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_R: tl.constexpr, GROUP_M: tl.constexpr,
    L_ROWS: tl.constexpr, R_ROWS: tl.constexpr, EVEN_P: tl.constexpr, EVEN_Q: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    """dW[e][p, q] = sum over the rows r of expert e's run of L[r, p] * R[r, q], one
    [BLOCK_P, BLOCK_Q] tile of one expert per program.

    dW2 takes L = dO (gathered by token) and R = s * A (sorted); dW13 takes L = dH (sorted) and
    R = x (gathered). The run's length, the K of this GEMM, is the expert's own: an expert
    nobody chose has an empty run and gets a tile of zeros.
    """
    # [which expert, which tile]
    num_pid_p = tl.cdiv(P, BLOCK_P)
    num_pid_q = tl.cdiv(Q, BLOCK_Q)
    tiles = num_pid_p * num_pid_q
    pid = tl.program_id(axis=0)
    expert = pid // tiles
    pid_p, pid_q = grouped_tile(pid % tiles, num_pid_p, num_pid_q, GROUP_M)
    first = tl.load(expert_rows_ptr + expert)
    end = tl.load(expert_rows_ptr + expert + 1)

    # [walk the expert's run]
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    acc = tl.zeros((BLOCK_P, BLOCK_Q), dtype=tl.float32)
    for r0 in range(first, end, BLOCK_R):
        rows = r0 + tl.arange(0, BLOCK_R)
        pair = tl.load(sorted_ids_ptr + rows)
        row_ok = (pair < num_pairs) & (rows < end)
        lt = load_run_rows(l_ptr, l_desc, rows, r0, pair, row_ok, row_div, stride_lm, pid_p * BLOCK_P, offs_p,
                           offs_p < P, L_ROWS, EVEN_P)
        rt = load_run_rows(r_ptr, r_desc, rows, r0, pair, row_ok, row_div, stride_rm, pid_q * BLOCK_Q, offs_q,
                           offs_q < Q, R_ROWS, EVEN_Q)
        acc = tl.dot(tl.trans(lt), rt, acc, input_precision=DOT_PRECISION)

    # [store the tile]
    c_ptrs = c_ptr + expert.to(tl.int64) * stride_ce + offs_p[:, None] * stride_cp + offs_q[None, :] * stride_cq
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_p < P)[:, None] & (offs_q < Q)[None, :])


def expert_tile(pid: int, P: int, Q: int, block_p: int, block_q: int, group_m: int) -> tuple[int, int, int]:
    """:func:`expert_grad_kernel`'s program order in plain Python, for figures and checkers:
    ``(expert, pid_p, pid_q)`` of program ``pid``, which owns rows ``pid_p * block_p`` on and
    columns ``pid_q * block_q`` on of that expert's dW. Keep the two in step:
    tests/test_backward_kernel.py checks this against the tiles the kernel's programs store."""
    num_p, num_q = -(-P // block_p), -(-Q // block_q)
    expert, tile = divmod(pid, num_p * num_q)
    return (expert, *pid_to_tile(tile, num_p, num_q, group_m))


# ---------------------------------------------------------------------------------- launchers

def _dot_precision(t: torch.Tensor) -> str:
    return "ieee" if t.dtype == torch.float32 else "tf32"


def _kn_descriptor(b: torch.Tensor, config: KernelConfig):
    """A TMA descriptor over ``b [E, K, N]`` as ``[E * K, N]`` with ``[BLOCK_K, BLOCK_N]`` tiles,
    or None where TMA cannot be used or K is ragged (the last tile would reach the next expert)."""
    if not config.use_tma or b.shape[1] % config.block_k:
        return None
    return weight_descriptor(b, [config.block_k, config.block_n])


def _sorted_descriptor(t: torch.Tensor, rows: int, cols: int, use: bool):
    """A TMA descriptor over sorted rows ``t [max_padded, C]`` with ``[rows, cols]`` tiles, or None."""
    return rows_descriptor(t, [rows, cols]) if use else None


def launch_rows_gemm(a, b, alignment, num_pairs: int, a_row_div: int, config: KernelConfig, *,
                     epilogue: str, b_layout: str, a_sorted: bool = False, out=None, h=None, act=None,
                     router_weights=None, ds_partial=None) -> None:
    """Launch :func:`rows_gemm_kernel` once over the alignment's sorted pairs.

    ``a`` ``[rows, K]``; ``b`` ``[E, N', K]`` ("nk") or ``[E, K, N]`` ("kn"); the epilogue's
    buffers (unit column stride) as :func:`rows_gemm_kernel` says: "save_swiglu" writes
    ``h [num_pairs, 2I]`` (pair order) and ``act [max_padded, I]`` (N = I); "dswiglu" writes
    ``out = dH [max_padded, 2I]``, ``act = s * A [max_padded, I]`` and ``ds_partial [num_pairs,
    cdiv(I, BLOCK_N)]`` fp32, reading ``h`` and ``router_weights [num_pairs]`` fp32; "scatter"
    writes ``out [num_pairs, N]``. Trusts its caller (the layer's autograd function checks the
    layer's inputs at its door). With ``config.persistent`` one program per SM walks the tiles.
    With ``config.gluon`` the "dswiglu" launch runs the Gluon kernel of
    :mod:`moe_tutorial.kernels.gluon_dact_kernel` instead (``a`` sorted; Hopper only).
    """
    if config.gluon:
        if epilogue != "dswiglu" or not a_sorted:
            raise ValueError(f"config.gluon: the Gluon kernel is dA' ('dswiglu') on dO's sorted rows (TMA tiles); "
                             f"got epilogue={epilogue!r}, a_sorted={a_sorted}")
        return launch_gluon_dact(a, b, alignment, num_pairs, config, dh=out, h=h, s_act=act,
                                 router_weights=router_weights, ds_partial=ds_partial)
    sorted_ids, expert_ids, num_post = alignment
    if b_layout == "nk":
        K = b.shape[2]
        N = b.shape[1] // 2 if epilogue == "save_swiglu" else b.shape[1]
        b_desc = weight_descriptor(b, [config.block_n, config.block_k]) if config.use_tma else None
        stride_bn, stride_bk = b.stride(1), b.stride(2)
    else:
        K, N = b.shape[1], b.shape[2]
        b_desc = _kn_descriptor(b, config)
        stride_bn, stride_bk = b.stride(2), b.stride(1)
    max_padded = sorted_ids.numel()
    a_desc = _sorted_descriptor(a, config.block_m, config.block_k, a_sorted and config.use_tma and config.block_m >= 64)
    # Buffers an epilogue does not touch are passed as any tensor: the kernel never reads them.
    spare = next(t for t in (out, h, act) if t is not None)
    out, h, act = (t if t is not None else spare for t in (out, h, act))
    router = router_weights if router_weights is not None else spare
    ds = ds_partial if ds_partial is not None else spare
    tiles = triton.cdiv(max_padded, config.block_m) * triton.cdiv(N, config.block_n)
    grid = persistent_grid(tiles) if config.persistent else (tiles,)
    rows_gemm_kernel[grid](
        a, a_desc, b, b_desc, out, h, act, router, ds, sorted_ids, expert_ids, num_post,
        N=N, K=K, num_pairs=num_pairs, max_padded=max_padded, a_row_div=a_row_div, b_rows_per_expert=b.shape[1],
        stride_am=a.stride(0), stride_ak=a.stride(1),
        stride_be=b.stride(0), stride_bn=stride_bn, stride_bk=stride_bk,
        stride_cm=out.stride(0), stride_cn=out.stride(1),
        stride_hm=h.stride(0), stride_actm=act.stride(0), stride_dsm=ds.stride(0),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=config.group_m,
        A_ROWS=("sorted_tma" if a_desc is not None else "sorted") if a_sorted else "gathered",
        B_LAYOUT=b_layout, B_TMA=b_desc is not None, EPILOGUE=epilogue,
        EVEN_K=K % config.block_k == 0, DOT_PRECISION=_dot_precision(a), PERSISTENT=config.persistent,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )


def launch_expert_grad(left, right, out, alignment, rows, num_pairs: int, row_div: int, config: KernelConfig, *,
                       left_sorted: bool, right_sorted: bool) -> None:
    """Launch :func:`expert_grad_kernel`: ``out [E, P, Q]`` = per expert, left^T right over its run.

    ``left [rows, P]`` and ``right [rows, Q]`` with unit column stride, each either in sorted order
    (``*_sorted``: one row per sorted position, padding rows zero) or one row per token (gathered
    as ``pair // row_div``). ``rows`` from :func:`moe_tutorial.kernels.stable_align.expert_rows`.
    ``config.block_m`` x ``config.block_n`` is the output tile, ``config.block_k`` the rows per step
    (at most the alignment's block_m, of which it is a divisor). One program per tile: the
    persistent grid does not help here (its run loop has each expert's own length, so Triton
    keeps it nested and pipelines no load of the next tile under this one's store). With
    ``config.gluon`` the Gluon kernel of :mod:`moe_tutorial.kernels.gluon_grad_kernel` runs
    instead, whose load warp does just that (both operands sorted; Hopper only).
    """
    sorted_ids = alignment[0]
    E, P, Q = out.shape
    block_r = min(config.block_k, alignment.block_m)
    if config.gluon:
        if not (left_sorted and right_sorted):
            raise ValueError("config.gluon: the Gluon dW kernel reads both operands in sorted order (TMA tiles)")
        return launch_gluon_expert_grad(left, right, out, rows, block_r, config)
    tma = config.use_tma and block_r >= 16

    def operand(t, sorted_rows: bool, cols: int):
        desc = _sorted_descriptor(t, block_r, cols, sorted_rows and tma and t.shape[1] % cols == 0)
        return desc, ("sorted_tma" if desc is not None else "sorted") if sorted_rows else "gathered"

    l_desc, l_rows = operand(left, left_sorted, config.block_m)
    r_desc, r_rows = operand(right, right_sorted, config.block_n)
    grid = (E * triton.cdiv(P, config.block_m) * triton.cdiv(Q, config.block_n),)
    expert_grad_kernel[grid](
        left, l_desc, right, r_desc, out, sorted_ids, rows,
        P=P, Q=Q, num_pairs=num_pairs, row_div=row_div,
        stride_lm=left.stride(0), stride_rm=right.stride(0),
        stride_ce=out.stride(0), stride_cp=out.stride(1), stride_cq=out.stride(2),
        BLOCK_P=config.block_m, BLOCK_Q=config.block_n, BLOCK_R=block_r, GROUP_M=config.group_m,
        L_ROWS=l_rows, R_ROWS=r_rows, EVEN_P=P % config.block_m == 0, EVEN_Q=Q % config.block_n == 0,
        DOT_PRECISION=_dot_precision(left),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
