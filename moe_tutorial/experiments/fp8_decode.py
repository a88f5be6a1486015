"""Part 7's experiment at decode: the FP8 layer in two launches, without the alignment or the topk sum.

With one token (M = 1) a layer call reads its topk experts' weights once and does almost no
arithmetic, so its time is that read plus the start and the tail of every launch. The package's
layer (:func:`moe_tutorial.kernels.fp8_layer.fp8_moe_layer`) makes five launches: the alignment,
x's quantiser, the two GEMMs and the topk sum. This path makes two (three with x quantised
beforehand), and each program works on **all of a token's topk experts at once**: its tile's rows
are BLOCK_N rows of each of the topk experts' weights (``TOPK_PAD * BLOCK_N`` rows, slot
``r // BLOCK_N``), so one K step loads every expert's tile together and the tile is tall enough
for the tensor cores.

1. **gate/up** (:func:`fp8_decode_up_kernel`): one program per token and BLOCK_N columns of I. It
   reads the token's expert ids itself, so no alignment is needed, and takes x's row one 128-wide
   group at a time (quantised beforehand, or here). It writes ``silu(gate) * up`` for every slot,
   fp32.
2. **down** (:func:`fp8_decode_down_kernel`): one program per token and BLOCK_N columns of H. The
   other operand is the token's topk activation rows, quantised per row and group as they load.
   The product holds every (weight row, slot) pair; a weight row keeps its own slot's column,
   times the router weight, and the slots' rows are added in fp32. That is the topk sum, done
   without a launch of its own, in a fixed order (deterministic).

Every K step is the package kernel's: 128 wide, e4m3 operands on the tensor cores, promoted with
the two scales (:func:`moe_tutorial.kernels.fp8_kernel.scaled_dot`, computed transposed so the
weights fill the tall side of the tile). The groups are quantised by the quantiser's own code
(:func:`moe_tutorial.kernels.fp8_quant.quantize_group`), so both GEMMs see bit for bit the
package layer's operands. Only the last sum differs: it is fp32 here, whereas the layer rounds
each pair's row to x's dtype before its topk sum.

**Measured, and not the package's path.** On an H200 (``moe_tutorial/data/h200_fp8_decode.csv``,
notebook 07's Appendix A, ``measurements/scripts/h200_fp8_decode.py``) it saves the launches but
reads the weights more slowly than the aligned layer's GEMMs, which bring one expert's tile per
program through TMA: its rows come from topk experts, so they are pointer loads. It is slower at
M = 1 on DeepSeek-V3 and Kimi-K2 and about even on Qwen3-30B-A3B, so the layer keeps its aligned
path at every M.
"""
from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import torch
import triton
import triton.language as tl

from ..checks import check_fp8_layer_inputs, check_fp8_runtime
from ..kernels.fp8_kernel import scaled_dot
from ..kernels.fp8_quant import launch_quantize_rows, quantize_group
from ..kernels.sorted_kernel import silu_and_mul_epilogue
from ..quant import BLOCK, E4M3_MAX, MIN_AMAX

DATA = Path(__file__).parent.parent / "data"

#: The other operand's row count: the tensor cores' least (``tl.dot`` needs 16). The gate/up GEMM
#: uses one of them (x's row); the down GEMM one per slot.
ROWS = 16


@dataclass(frozen=True)
class DecodeConfig:
    """Launch parameters of the two decode kernels (BLOCK_K is one quantisation group, 128).
    ``block_n_*`` are columns per slot: a tile has ``next_power_of_2(topk) * block_n`` rows (raised
    to 16 where that is fewer)."""

    block_n_up: int = 8         # the defaults: the fastest on the H200 at M = 1 (DeepSeek-V3, Kimi-K2)
    block_n_down: int = 16
    num_warps: int = 4
    num_stages: int = 3
    x_form: str = "e4m3"       # how the gate/up kernel reads x (see quantized_row_group)


@triton.jit
def quantized_row_group(row_ptr, scale_ptr, k0, K, E4M3_MAX: tl.constexpr, MIN_AMAX: tl.constexpr,
                        ROWS: tl.constexpr, X_FORM: tl.constexpr):
    """One 128-wide group of x's row as the tensor cores' other operand: ``(q, scale)``, q
    ``[ROWS, 128]`` e4m3 with the row in row 0 (the others zero) and scale ``[ROWS]`` fp32.

    X_FORM says what ``row_ptr`` holds. "e4m3": the row already quantised (``scale_ptr`` its group
    scales). "values": x's row, quantised here as the quantiser does. "words": the same, a bf16 row
    read as 32-bit words, two values each (``row_ptr`` an int32 view): Triton's software pipeliner
    (3.9 on sm90, checked by compiling) copies no tile of the loop ahead when one of them is a bf16
    load that does not feed a ``tl.dot`` directly, and x's row is one. A bf16 value is the top half
    of its fp32 value, so shifting gives the fp32 numbers exactly."""
    first = tl.arange(0, ROWS) == 0
    offs_k = k0 + tl.arange(0, 128)
    if X_FORM == "e4m3":
        # (as a [ROWS, 128] tile masked to row 0: a 1-D e4m3 load is not copied ahead either)
        q = tl.load(row_ptr + 0 * first[:, None] + offs_k[None, :], mask=first[:, None] & (offs_k < K)[None, :],
                    other=0.0)
        scale = tl.load(scale_ptr + k0 // 128 + 0 * first, mask=first, other=0.0)
    else:
        if X_FORM == "words":
            offs_w = k0 // 2 + tl.arange(0, 64)
            words = tl.load(row_ptr + offs_w, mask=offs_w < K // 2, other=0)
            low = (words << 16).to(tl.float32, bitcast=True)            # element 2i: the word's low half
            high = (words & -65536).to(tl.float32, bitcast=True)        # element 2i + 1
            row = tl.reshape(tl.join(low, high), [1, 128])
        else:
            row = tl.load(row_ptr + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)[None, :]
        q1, s1 = quantize_group(row, E4M3_MAX, MIN_AMAX)          # one row: [1, 128] and [1]
        q = tl.where(first[:, None], q1, 0.0).to(tl.float8e4nv)
        scale = tl.where(first, s1, 0.0)
    return q, scale


@triton.jit
def slot_rows(ids_ptr, m, topk, num_experts, n0, N, BLOCK_N: tl.constexpr, TOPK_PAD: tl.constexpr):
    """The tile's rows for token m: row r is column ``n0 + r % BLOCK_N`` of slot ``r // BLOCK_N``'s
    expert. Returns ``(slot, expert, column, ok)``, each ``[TOPK_PAD * BLOCK_N]``; ``ok`` is False
    for padding slots, columns past N and ids out of range (their rows read nothing, add zero)."""
    r = tl.arange(0, TOPK_PAD * BLOCK_N)
    slot = r // BLOCK_N
    col = n0 + r % BLOCK_N
    expert = tl.load(ids_ptr + m * topk + slot, mask=slot < topk, other=-1).to(tl.int64)
    ok = (slot < topk) & (col < N) & (expert >= 0) & (expert < num_experts)
    return slot, tl.where(ok, expert, 0), col, ok


@triton.jit
def weight_group(w_ptr, w_scale_ptr, expert, w_row, s_row, ok, k0, K, stride_we, stride_wn, stride_wk,
                 stride_wse, stride_wsn, stride_wsk):
    """The tile's e4m3 weights over the 128 columns of K from ``k0`` (row r: expert ``expert[r]``'s
    weight row ``w_row[r]``) and each row's block scale (block row ``s_row[r] // 128`` from
    ``w_scale_ptr``): ``[rows, 128]`` and ``[rows]``."""
    offs_k = k0 + tl.arange(0, 128)
    w = tl.load(w_ptr + expert[:, None] * stride_we + w_row[:, None].to(tl.int64) * stride_wn
                + offs_k[None, :] * stride_wk, mask=ok[:, None] & (offs_k < K)[None, :], other=0.0)
    w_s = tl.load(w_scale_ptr + expert * stride_wse + (s_row // 128) * stride_wsn + (k0 // 128) * stride_wsk,
                  mask=ok, other=0.0)
    return w, w_s


@triton.jit
def fp8_decode_up_kernel(x_ptr, x_scale_ptr, ids_ptr, w_ptr, w_scale_ptr, act_ptr, inter, K, topk, num_experts,
                         stride_xm, stride_xsm, stride_we, stride_wn, stride_wk, stride_wse, stride_wsn, stride_wsk,
                         stride_am,
                         BLOCK_N: tl.constexpr, TOPK_PAD: tl.constexpr, ROWS: tl.constexpr, X_FORM: tl.constexpr,
                         E4M3_MAX: tl.constexpr, MIN_AMAX: tl.constexpr):
    """act[m * topk + j, n] = silu(gate) * up for token m, every slot j and BLOCK_N columns n of the
    intermediate size I (``inter``), fp32; x's row quantised per 128-wide group on the way in;
    w ``[E, 2I, K]`` (gate rows, then up rows)."""
    m = tl.program_id(0)
    slot, expert, col, ok = slot_rows(ids_ptr, m, topk, num_experts, tl.program_id(1) * BLOCK_N, inter,
                                      BLOCK_N, TOPK_PAD)
    x_row = x_ptr + m.to(tl.int64) * stride_xm                     # stride in x_ptr's elements
    x_scales = x_scale_ptr + m.to(tl.int64) * stride_xsm           # X_FORM "e4m3" only
    # The up rows lie I rows after the gate rows; their block scales ceil(I / 128) block rows on.
    up_scale = w_scale_ptr + tl.cdiv(inter, 128) * stride_wsn
    gate = tl.zeros((TOPK_PAD * BLOCK_N, ROWS), dtype=tl.float32)
    up = tl.zeros((TOPK_PAD * BLOCK_N, ROWS), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, 128)):
        a, a_s = quantized_row_group(x_row, x_scales, k * 128, K, E4M3_MAX, MIN_AMAX, ROWS, X_FORM)
        b, b_s = weight_group(w_ptr, w_scale_ptr, expert, col, col, ok, k * 128, K, stride_we, stride_wn, stride_wk,
                              stride_wse, stride_wsn, stride_wsk)
        gate = scaled_dot(a, b, a_s, b_s, gate, True)
        b, b_s = weight_group(w_ptr, up_scale, expert, col + inter, col, ok, k * 128, K, stride_we, stride_wn,
                              stride_wk, stride_wse, stride_wsn, stride_wsk)
        up = scaled_dot(a, b, a_s, b_s, up, True)
    act = silu_and_mul_epilogue(gate, up)              # [rows, ROWS]: column 0 is x's
    first = (tl.arange(0, ROWS) == 0)[None, :]
    ptrs = (act_ptr + (m * topk + slot).to(tl.int64)[:, None] * stride_am + col[:, None]
            + 0 * tl.arange(0, ROWS)[None, :])
    tl.store(ptrs, act, mask=ok[:, None] & first)


@triton.jit
def fp8_decode_down_kernel(act_ptr, ids_ptr, router_w_ptr, w_ptr, w_scale_ptr, out_ptr, H, inter, topk,
                           num_experts, stride_am, stride_we, stride_wn, stride_wk, stride_wse, stride_wsn,
                           stride_wsk, stride_om,
                           BLOCK_N: tl.constexpr, TOPK_PAD: tl.constexpr, ROWS: tl.constexpr,
                           E4M3_MAX: tl.constexpr, MIN_AMAX: tl.constexpr):
    """out[m, n] = sum over slots j of router_w[m, j] * (act[m * topk + j] . w[expert(m, j), n]),
    for token m and BLOCK_N columns n of H, in fp32; w ``[E, H, I]``, I = ``inter``."""
    m = tl.program_id(0)
    n0 = tl.program_id(1) * BLOCK_N
    slot, expert, col, ok = slot_rows(ids_ptr, m, topk, num_experts, n0, H, BLOCK_N, TOPK_PAD)
    # The other operand: the token's topk activation rows, one per column of the product.
    j = tl.arange(0, ROWS)
    pair = (m * topk + j).to(tl.int64)
    router = tl.load(router_w_ptr + pair, mask=j < topk, other=0.0)
    offs_k = tl.arange(0, 128)
    acc = tl.zeros((TOPK_PAD * BLOCK_N, ROWS), dtype=tl.float32)
    for k in range(0, tl.cdiv(inter, 128)):
        k_ok = offs_k < inter - k * 128
        rows = tl.load(act_ptr + pair[:, None] * stride_am + (k * 128 + offs_k)[None, :],
                       mask=(j < topk)[:, None] & k_ok[None, :], other=0.0)
        a, a_s = quantize_group(rows, E4M3_MAX, MIN_AMAX)
        b, b_s = weight_group(w_ptr, w_scale_ptr, expert, col, col, ok, k * 128, inter, stride_we, stride_wn,
                              stride_wk, stride_wse, stride_wsn, stride_wsk)
        # The router weight joins the slot's scale: sum_j w_j * sum_k p_jk = sum_k sum_j (w_j * p_jk).
        acc = scaled_dot(a.to(tl.float8e4nv), b, a_s * router, b_s, acc, True)
    # Row r of acc holds its weight row times every slot's activations: keep its own slot's column,
    # then add the slots' rows of each output column (a fixed tree: deterministic).
    mine = tl.sum(tl.where(slot[:, None] == j[None, :], acc, 0.0), axis=1)
    total = tl.sum(tl.reshape(mine, [TOPK_PAD, BLOCK_N]), axis=0)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    tl.store(out_ptr + m.to(tl.int64) * stride_om + offs_n, total.to(out_ptr.dtype.element_ty), mask=offs_n < H)


def fp8_decode_layer(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                     w2_scale: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                     config: DecodeConfig = DecodeConfig()) -> torch.Tensor:
    """The FP8 layer in two launches (three with ``config.x_form`` "e4m3"); the arguments and the
    checks of :func:`moe_tutorial.kernels.fp8_layer.fp8_moe_layer`, and at most 16 experts a token.

    Args:
        x: ``[M, K]`` bf16 (GPU) or fp32 (interpreter).
        w13, w13_scale: ``[E, 2I, K]`` e4m3 and ``[E, 2 * ceil(I/128), ceil(K/128)]`` fp32.
        w2, w2_scale: ``[E, K, I]`` e4m3 and ``[E, ceil(K/128), ceil(I/128)]`` fp32.
        topk_weights, topk_ids: ``[M, topk]`` router output.
        config: the two kernels' column blocks per slot, warps, pipeline stages, and how x is read.

    Returns:
        ``[M, K]`` in x's dtype.
    """
    check_fp8_runtime()
    check_fp8_layer_inputs(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, dtype=x.dtype)
    M, K = x.shape
    E, two_i, _ = w13.shape
    inter, topk = two_i // 2, topk_ids.shape[1]
    out = x.new_empty(M, K)
    if M == 0:
        return out
    x = x.contiguous()                                 # one row: the kernels read it with unit stride
    x_form = config.x_form
    if x_form == "words" and not (x.dtype == torch.bfloat16 and K % 2 == 0):
        x_form = "values"
    if x_form == "e4m3":
        x_in, x_scale = launch_quantize_rows(x)        # a third launch: x quantised beforehand
    else:
        x_in, x_scale = (x.view(torch.int32) if x_form == "words" else x), x
    ids = topk_ids.reshape(-1).contiguous()
    router = topk_weights.reshape(-1).float().contiguous()
    act = torch.empty(M * topk, inter, dtype=torch.float32, device=x.device)
    if topk > ROWS:
        raise ValueError(f"topk: the decode path takes at most {ROWS} experts a token, got {topk}")
    topk_pad = triton.next_power_of_2(topk)
    # A tile has topk_pad * block_n rows, and tl.dot needs at least 16.
    block_up, block_down = (max(b, 16 // topk_pad) for b in (config.block_n_up, config.block_n_down))
    common = dict(TOPK_PAD=topk_pad, ROWS=ROWS, E4M3_MAX=E4M3_MAX, MIN_AMAX=MIN_AMAX, num_warps=config.num_warps,
                  num_stages=config.num_stages)
    fp8_decode_up_kernel[(M, triton.cdiv(inter, block_up))](
        x_in, x_scale, ids, w13, w13_scale, act, inter, K, topk, E,
        x_in.stride(0), x_scale.stride(0), *w13.stride(), *w13_scale.stride(), act.stride(0),
        BLOCK_N=block_up, X_FORM=x_form, **common)
    fp8_decode_down_kernel[(M, triton.cdiv(K, block_down))](
        act, ids, router, w2, w2_scale, out, K, inter, topk, E,
        act.stride(0), *w2.stride(), *w2_scale.stride(), out.stride(0),
        BLOCK_N=block_down, **common)
    return out


def load_decode(path: Path | None = None) -> list[dict]:
    """The H200 run of ``measurements/scripts/h200_fp8_decode.py`` (``data/h200_fp8_decode.csv``):
    per model, M and call, ``ms`` (cold-l2, the faster of two orders) and the two orders' ``noise``.
    The ``fp8-package`` rows timed the layer while it sent M = 1 down this path (a 16 x 16 tile, x
    read as words, 4 stages); elsewhere they equal ``fp8-aligned``, the layer as it is now."""
    with open(path or DATA / "h200_fp8_decode.csv") as f:
        return list(csv.DictReader(f))


def decode_summary(rows: list[dict]) -> list[dict]:
    """Rows of :func:`load_decode` -> one dict per (model, M), in the order measured: ``bf16_us``,
    ``aligned_us`` (the package's layer), ``best`` (the fastest decode config's name) and
    ``best_us``, and ``aligned_over_best`` (above 1: the decode path is faster)."""
    out = {}
    for r in rows:
        case = out.setdefault((r["model"], int(r["M"])), {"model": r["model"], "M": int(r["M"])})
        us = float(r["ms"]) * 1e3
        if r["impl"] == "bf16-sorted":
            case["bf16_us"] = us
        elif r["impl"] == "fp8-aligned":
            case["aligned_us"] = us
        elif r["impl"].startswith("decode") and us < case.get("best_us", float("inf")):
            case["best"], case["best_us"] = r["impl"], us
    for case in out.values():
        case["aligned_over_best"] = case["aligned_us"] / case["best_us"]
    return list(out.values())


assert BLOCK == 128, "the decode kernels' K steps are one 128-wide quantisation group"

__all__ = ["DecodeConfig", "load_decode", "decode_summary", "fp8_decode_layer", "fp8_decode_up_kernel",
           "fp8_decode_down_kernel"]
