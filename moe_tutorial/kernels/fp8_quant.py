"""FP8 activations: each token's row cut into 128-wide groups, each group scaled into e4m3, in one launch.

The FP8 layer's first step. A program takes ROWS tokens and one group of 128 columns, finds each
row's largest magnitude there, and writes ``q = x / scale`` in e4m3 with ``scale = amax / 448``
(the rule of :mod:`moe_tutorial.quant`, which is the float64 reference this kernel is tested
against). The gate/up GEMM quantises its own output the same way, in its epilogue
(:func:`moe_tutorial.kernels.fp8_kernel.quantize_epilogue`).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..checks import check_fp8_activations, check_kernel_dtype, check_tensor, check_values
from ..fp8_format import BLOCK, E4M3_MAX, FP8_DTYPE, MIN_AMAX

#: The quantisation rule's constants, as kernels see them (a kernel reads globals only as constexpr).
E4M3_MAX_C = tl.constexpr(E4M3_MAX)
MIN_AMAX_C = tl.constexpr(MIN_AMAX)


@triton.jit
def round_to_e4m3(v):
    """``v`` (fp32, within +-448) rounded to the nearest e4m3 value (ties to even), still in fp32.

    The cast to e4m3 would round by itself, but Triton 3.9's interpreter loses the carry when the
    mantissa rounds up (124.3 comes out as 64, not 128); rounded here, the cast is exact on both
    runtimes. Normal e4m3 numbers keep 3 of fp32's 23 mantissa bits: add just under half of the
    20 dropped bits (plus the last kept bit, for ties to even) and clear them; integer carries
    run into the exponent as they should. Below 2^-6 e4m3 is subnormal, spaced 2^-9 apart:
    there ``(v * 512 + 1.5 * 2^23) - 1.5 * 2^23`` rounds to a multiple of 2^-9.
    """
    bits = v.to(tl.int32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576).to(tl.float32, bitcast=True)  # -1048576 = 0xFFF00000
    subnormal = ((v * 512.0 + 12582912.0) - 12582912.0) / 512.0
    return tl.where(tl.abs(v) < 0.015625, subnormal, normal)


@triton.jit
def quantize_group(values, E4M3_MAX: tl.constexpr, MIN_AMAX: tl.constexpr):
    """``(q, scale)`` of a ``[rows, 128]`` fp32 block, one group per row: ``scale = amax / 448``,
    ``q = values / scale`` clamped to e4m3's range (division may carry 448 a hair over) and
    rounded to e4m3 values (still fp32: the caller casts).

    A group holding NaN or +-Inf gets a NaN scale: ``tl.max`` skips NaN (the group would come out
    finite, NaN stored as -448) and an Inf would make the scale Inf. With a NaN scale everything
    computed from the group is NaN, never a finite number that looks right."""
    amax = tl.maximum(tl.max(tl.abs(values), axis=1), MIN_AMAX)
    finite = tl.max(tl.where(tl.abs(values) < float("inf"), 0, 1), axis=1) == 0    # NaN < inf is False too
    scale = tl.where(finite, amax / E4M3_MAX, float("nan"))
    q = round_to_e4m3(tl.clamp(values / scale[:, None], -E4M3_MAX, E4M3_MAX))
    return q, scale


@triton.jit
def quantize_rows_kernel(x_ptr, q_ptr, scale_ptr, M, K,
                         stride_xm, stride_xk, stride_qm, stride_qk, stride_sm, stride_sk,
                         ROWS: tl.constexpr, GROUP: tl.constexpr,
                         E4M3_MAX: tl.constexpr, MIN_AMAX: tl.constexpr):
    """q[m, g*128 + i], scale[m, g] for ROWS tokens m and one group g."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * GROUP + tl.arange(0, GROUP)
    ok = (rows < M)[:, None] & (cols < K)[None, :]       # a partial last group reads zeros
    rows64 = rows.to(tl.int64)
    x = tl.load(x_ptr + rows64[:, None] * stride_xm + cols.to(tl.int64)[None, :] * stride_xk, mask=ok, other=0.0)
    q, scale = quantize_group(x.to(tl.float32), E4M3_MAX, MIN_AMAX)
    tl.store(q_ptr + rows64[:, None] * stride_qm + cols[None, :] * stride_qk, q.to(q_ptr.dtype.element_ty), mask=ok)
    tl.store(scale_ptr + rows64 * stride_sm + tl.program_id(1) * stride_sk, scale, mask=rows < M)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token, 128-group FP8 quantisation of activations, on the runtime's device.

    Args:
        x: ``[M, K]`` float (fp32 in the interpreter; bf16/fp16/fp32 on a GPU); any strides; finite:
            NaN or Inf has no scale and is refused with a ValueError naming the element. Reading that
            verdict back is one host sync on a GPU (skipped while a CUDA graph is captured, where a
            group with NaN or Inf gets a NaN scale instead, so it never comes out finite).

    Returns:
        ``(q [M, K] float8_e4m3fn, scale [M, ceil(K/128)] fp32)``, as
        :func:`moe_tutorial.quant.quantize_activations` computes them in float64.
    """
    check_fp8_activations("x", x)
    check_values(finite={"x": x})
    return launch_quantize_rows(x)


def launch_quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_rows` on inputs already checked (the FP8 layer's first step)."""
    M, K = x.shape
    q = torch.empty(M, K, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty(M, triton.cdiv(K, BLOCK), dtype=torch.float32, device=x.device)
    if M == 0 or K == 0:
        return q, scale
    rows = 16 if M >= 16 else triton.next_power_of_2(M)
    quantize_rows_kernel[(triton.cdiv(M, rows), triton.cdiv(K, BLOCK))](
        x, q, scale, M, K, x.stride(0), x.stride(1), q.stride(0), q.stride(1), scale.stride(0), scale.stride(1),
        ROWS=rows, GROUP=BLOCK, E4M3_MAX=E4M3_MAX, MIN_AMAX=MIN_AMAX, num_warps=4,
    )
    return q, scale


@triton.jit
def quantize_rows_sorted_kernel(x_ptr, pos_ptr, a_ptr, as_ptr, M, K, topk, stride_xm, stride_xk, stride_am, stride_ask,
                                ROWS: tl.constexpr, GROUP: tl.constexpr,
                                E4M3_MAX: tl.constexpr, MIN_AMAX: tl.constexpr):
    """ROWS tokens and one group of 128 columns: quantised once, then written to each of the
    tokens' ``topk`` sorted rows (``pos``), scales transposed (``[groups, rows]``)."""
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.program_id(1) * GROUP + tl.arange(0, GROUP)
    in_rows = rows < M
    ok = in_rows[:, None] & (cols < K)[None, :]
    rows64 = rows.to(tl.int64)
    x = tl.load(x_ptr + rows64[:, None] * stride_xm + cols.to(tl.int64)[None, :] * stride_xk, mask=ok, other=0.0)
    q, scale = quantize_group(x.to(tl.float32), E4M3_MAX, MIN_AMAX)
    q = q.to(a_ptr.dtype.element_ty)
    for j in range(0, topk):
        pos = tl.load(pos_ptr + rows64 * topk + j, mask=in_rows, other=-1)
        placed = pos >= 0                                  # -1: the alignment dropped this pair
        pos64 = pos.to(tl.int64)
        tl.store(a_ptr + pos64[:, None] * stride_am + cols[None, :], q, mask=ok & placed[:, None])
        tl.store(as_ptr + tl.program_id(1) * stride_ask + pos64, scale, mask=in_rows & placed)


def quantize_rows_sorted(x: torch.Tensor, positions: torch.Tensor, topk: int,
                         rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_rows` writing straight into sorted order, on inputs already checked.

    Each token's row is read and quantised once, then stored at its ``topk`` sorted rows, so the
    Gluon FP8 GEMM reads whole tiles of it through TMA without a separate gather
    (:func:`moe_tutorial.kernels.gluon_fp8_kernel.gather_sorted_fp8` copies the quantised rows instead).

    Args:
        x: ``[M, K]`` bf16/fp16/fp32 (fp32 in the interpreter), any strides, finite (checked by the caller).
        positions: ``[M * topk]`` int32 from :func:`moe_tutorial.kernels.align.sorted_positions`.
        topk: slots per token (``positions`` holds token ``m``'s at ``m * topk`` to ``m * topk + topk - 1``).
        rows: the sorted rows to allocate (``sorted_rows(alignment, block_m)``).

    Returns:
        ``(a [rows, K] e4m3, a_scale_t [ceil(K/128), rows] fp32)``. Padding rows and rows past the
        alignment's end are left unwritten, so they may hold any bytes, e4m3 NaN included (the
        gather copies a real row there instead). That is safe only because every later step of the
        forward works row by row and never stores a padding row's result; a weight gradient,
        which sums over rows, would need them finite.
    """
    M, K = x.shape
    a = torch.empty(rows, K, dtype=FP8_DTYPE, device=x.device)
    a_scale_t = torch.empty(triton.cdiv(K, BLOCK), rows, dtype=torch.float32, device=x.device)
    if M and K:
        block = 16 if M >= 16 else triton.next_power_of_2(M)
        quantize_rows_sorted_kernel[(triton.cdiv(M, block), triton.cdiv(K, BLOCK))](
            x, positions, a, a_scale_t, M, K, topk, x.stride(0), x.stride(1), a.stride(0), a_scale_t.stride(0),
            ROWS=block, GROUP=BLOCK, E4M3_MAX=E4M3_MAX, MIN_AMAX=MIN_AMAX, num_warps=4)
    return a, a_scale_t


@triton.jit
def silu_mul_quantize_kernel(h_ptr, q_ptr, qs_ptr, num_post_ptr, inter, stride_hm, stride_qm, stride_qsn,
                             ROWS: tl.constexpr, E4M3_MAX: tl.constexpr, MIN_AMAX: tl.constexpr):
    """``silu(h[r, :I]) * h[r, I:]`` for ROWS sorted rows and one group of 128 columns, quantised:
    e4m3 into ``q``, the rows' scales into ``qs`` transposed (``[groups, rows]``)."""
    first = tl.program_id(0) * ROWS
    if first < tl.load(num_post_ptr):                # past the real end no tile reads the rows
        rows = (first + tl.arange(0, ROWS)).to(tl.int64)
        cols = tl.program_id(1) * 128 + tl.arange(0, 128)
        ok = cols[None, :] < inter
        gate = tl.load(h_ptr + rows[:, None] * stride_hm + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        up = tl.load(h_ptr + rows[:, None] * stride_hm + inter + cols[None, :], mask=ok, other=0.0).to(tl.float32)
        q, scale = quantize_group(gate * tl.sigmoid(gate) * up, E4M3_MAX, MIN_AMAX)
        tl.store(q_ptr + rows[:, None] * stride_qm + cols[None, :], q.to(q_ptr.dtype.element_ty), mask=ok)
        tl.store(qs_ptr + tl.program_id(1) * stride_qsn + rows, scale)


def silu_mul_quantize(h: torch.Tensor, num_post: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The down GEMM's input from a gate/up GEMM's plain output, in one launch.

    Args:
        h: ``[R, 2I]`` bf16/fp32, gate columns then up columns, rows in sorted order.
        num_post: the alignment's real number of rows (a 1-element int32 tensor); rows past it are
            left unwritten.

    Returns:
        ``(q [R, I] e4m3, scale_t [ceil(I/128), R] fp32)``: ``silu(gate) * up`` per row and 128-wide
        group, as the gate/up GEMM's quantising epilogue writes them (scales transposed for TMA).
    """
    R, inter = h.shape[0], h.shape[1] // 2
    q = torch.empty(R, inter, dtype=FP8_DTYPE, device=h.device)
    scale_t = torch.empty(triton.cdiv(inter, BLOCK), R, dtype=torch.float32, device=h.device)
    rows = 32
    silu_mul_quantize_kernel[(triton.cdiv(R, rows), triton.cdiv(inter, BLOCK))](
        h, q, scale_t, num_post, inter, h.stride(0), q.stride(0), scale_t.stride(0),
        ROWS=rows, E4M3_MAX=E4M3_MAX, MIN_AMAX=MIN_AMAX, num_warps=4)
    return q, scale_t


@triton.jit
def cast_e4m3_kernel(x_ptr, out_ptr, n, ROUND_FIRST: tl.constexpr, BLOCK: tl.constexpr):
    """out[i] = x[i] cast to e4m3 inside a kernel, rounded by :func:`round_to_e4m3` first or not."""
    offs = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    if ROUND_FIRST:
        v = round_to_e4m3(v)
    tl.store(out_ptr + offs, v.to(out_ptr.dtype.element_ty), mask=offs < n)


def cast_to_e4m3(x: torch.Tensor, *, round_first: bool = True) -> torch.Tensor:
    """``x`` cast to e4m3 by a Triton kernel, as the FP8 kernels cast: after :func:`round_to_e4m3`
    (``round_first``), or by the cast alone, which Triton 3.9's interpreter gets wrong (notebook 07).

    Args:
        x: 1-D fp32, at most 1024 values within +-448, on the runtime's device.

    Returns:
        ``[n]`` float8_e4m3fn.
    """
    check_tensor("x", x, 1)
    check_kernel_dtype("x", x)
    if x.dtype != torch.float32 or x.numel() > 1024:
        raise ValueError(f"x: expected at most 1024 fp32 values, got {x.numel()} {x.dtype}")
    out = torch.empty(x.numel(), dtype=FP8_DTYPE, device=x.device)
    if x.numel():
        cast_e4m3_kernel[(1,)](x.contiguous(), out, x.numel(), ROUND_FIRST=round_first,
                               BLOCK=triton.next_power_of_2(max(x.numel(), 16)))
    return out
