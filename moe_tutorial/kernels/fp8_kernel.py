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

The program order, the alignment and the sorted activations are Part 4's.
"""
from __future__ import annotations

from dataclasses import replace

import torch
import triton
import triton.language as tl

from .. import runtime
from ..checks import check_fp8_layer_inputs, check_fp8_matmul_inputs
from ..quant import BLOCK, FP8_DTYPE
from .align import align_block_size, check_alignment
from .configs import GLUON_FUSED_DOWN, GLUON_PLAIN, KernelConfig, check_fp8_config, check_fp8_configs, fp8_config
from .fp8_quant import E4M3_MAX_C, MIN_AMAX_C, launch_quantize_rows, quantize_group
from .gluon_fp8_kernel import gluon_fp8_first_gemm, gluon_fp8_layer
from .persistent_kernel import persistent_grid
from .sorted_kernel import _tma_can_read, grouped_tile
from .topk_sum import topk_sum


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
def load_fp8_weight_tile(w_ptrs, w_desc, w_row, k0, k_ok, USE_TMA: tl.constexpr):
    """One ``[BLOCK_N, BLOCK_K]`` e4m3 tile of the expert's weights, as they lie, through TMA
    (Hopper) or pointer loads (masked only along K: columns wrap modulo N and the store masks them)."""
    if USE_TMA:
        w = w_desc.load([w_row, k0])
    else:
        w = tl.load(w_ptrs, mask=k_ok[None, :], other=0.0)
    return w


@triton.jit
def quantize_epilogue(acc, col_ok, E4M3_MAX: tl.constexpr, MIN_AMAX: tl.constexpr):
    """The gate/up GEMM's output tile, ``[rows, 128]`` fp32, as e4m3 values and one scale per row:
    the down GEMM's activations, quantised before they ever reach memory."""
    return quantize_group(tl.where(col_ok[None, :], acc, 0.0), E4M3_MAX, MIN_AMAX)


@triton.jit
def fp8_tile(
    pid_m, pid_n, expert_ids_ptr,
    a_ptr, a_scale_ptr, b_ptr, b_desc, b_scale_ptr, c_ptr, c_scale_ptr, router_w_ptr, sorted_ids_ptr,
    N, K, num_pairs, a_row_div, up_scale_rows, b_rows_per_expert,
    stride_am, stride_ak, stride_asm, stride_ask,
    stride_be, stride_bn, stride_bk, stride_bse, stride_bsn, stride_bsk,
    stride_cm, stride_cn, stride_csm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GATED: tl.constexpr, ROUTER_WEIGHTS: tl.constexpr, SORTED_ROWS: tl.constexpr,
    QUANT_OUT: tl.constexpr, SWAP_AB: tl.constexpr, USE_TMA: tl.constexpr,
):
    """One [BLOCK_M, BLOCK_N] tile of :func:`fp8_moe_kernel`: row block ``pid_m``, column block ``pid_n``."""
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    # [gather the rows]
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ids_ptr + offs_m)
    row_ok = pair < num_pairs
    if SORTED_ROWS and a_row_div == 0:
        a_row = offs_m.to(tl.int64)                  # the down GEMM: rows lie in sorted order
    else:
        a_row = (pair // tl.maximum(a_row_div, 1)).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_row[:, None] * stride_am + offs_k[None, :] * stride_ak
    a_scale_ptrs = a_scale_ptr + a_row * stride_asm

    # [the expert's weights and their block scales]
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    b_ptrs = b_ptr + expert * stride_be + offs_n[:, None].to(tl.int64) * stride_bn + offs_k[None, :] * stride_bk
    b_row = (expert * b_rows_per_expert + pid_n * BLOCK_N).to(tl.int32)   # TMA path only
    b_scale_ptrs = b_scale_ptr + expert * stride_bse + (offs_n // 128) * stride_bsn

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
        b = load_fp8_weight_tile(b_ptrs, b_desc, b_row, k * BLOCK_K, k_ok, USE_TMA)
        b_s = tl.load(b_scale_ptrs + group * stride_bsk)
        acc = scaled_dot(a, b, a_s, b_s, acc, SWAP_AB)
        if GATED:
            # The up rows sit N rows after the gate rows; their scales up_scale_rows rows on.
            b_up = load_fp8_weight_tile(b_ptrs + N * stride_bn, b_desc, b_row + N, k * BLOCK_K, k_ok, USE_TMA)
            b_up_s = tl.load(b_scale_ptrs + up_scale_rows * stride_bsn + group * stride_bsk)
            acc_up = scaled_dot(a, b_up, a_s, b_up_s, acc_up, SWAP_AB)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    if SWAP_AB:
        acc = tl.trans(acc)
        acc_up = tl.trans(acc_up)

    # [epilogues]
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = offs_cn < N
    if GATED:
        acc = acc * tl.sigmoid(acc) * acc_up
    if ROUTER_WEIGHTS:
        acc = acc * tl.load(router_w_ptr + pair, mask=row_ok, other=0.0)[:, None]

    # [store the rows]
    if SORTED_ROWS and a_row_div != 0:
        c_row = offs_m.to(tl.int64)                  # the gate/up GEMM: leave rows in sorted order
    else:
        c_row = pair.to(tl.int64)
    c_ptrs = c_ptr + c_row[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    if QUANT_OUT:
        q, scale = quantize_epilogue(acc, col_ok, E4M3_MAX_C, MIN_AMAX_C)
        tl.store(c_ptrs, q.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])
        tl.store(c_scale_ptr + c_row * stride_csm + pid_n, scale, mask=row_ok)
    else:
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def fp8_moe_kernel(
    # pointers: A, B and C with their scales; router weights; the alignment
    a_ptr, a_scale_ptr, b_ptr, b_desc, b_scale_ptr, c_ptr, c_scale_ptr, router_w_ptr,
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr,
    # sizes
    N, K, num_pairs, max_padded, a_row_div, up_scale_rows, b_rows_per_expert,
    # strides
    stride_am, stride_ak, stride_asm, stride_ask,
    stride_be, stride_bn, stride_bk, stride_bse, stride_bsn, stride_bsk,
    stride_cm, stride_cn, stride_csm,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    GATED: tl.constexpr, ROUTER_WEIGHTS: tl.constexpr, SORTED_ROWS: tl.constexpr,
    QUANT_OUT: tl.constexpr, SWAP_AB: tl.constexpr, USE_TMA: tl.constexpr,
    PERSISTENT: tl.constexpr,
):
    """C[pair, n] = A[pair // a_row_div] . B[expert(pair), n], e4m3 operands, block scales, fp32 sums.

    As :func:`moe_tutorial.kernels.sorted_kernel.sorted_moe_kernel`, with: ``a_scale`` ``[rows,
    ceil(K/128)]``, ``b_scale`` ``[E, rows of B / 128, ceil(K/128)]`` (with GATED the up rows' scales
    start ``up_scale_rows`` rows on). SORTED_ROWS is Part 4's sorted-activations layout for both
    sides of the layer: the gate/up GEMM writes C's rows at their sorted positions, the down GEMM
    reads A's rows there (``a_row_div`` = 0 marks the reading side). With QUANT_OUT (BLOCK_N = 128)
    C is e4m3 and ``c_scale`` ``[rows, ceil(N/128)]`` receives one scale per row and tile.
    PERSISTENT: Part 4's persistent grid (:mod:`moe_tutorial.kernels.persistent_kernel`), each
    program walking the real tiles.
    """
    # [which tile] One tile per program, or (PERSISTENT) every num_programs-th of the real tiles.
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_post = tl.load(num_post_ptr)
    first = tl.program_id(axis=0)
    if PERSISTENT:
        num_pid_m = tl.cdiv(num_post, BLOCK_M)
        end, step = num_pid_m * num_pid_n, tl.num_programs(axis=0)
    else:
        num_pid_m = tl.cdiv(max_padded, BLOCK_M)
        end = first + 1
        step = end - first                           # 1, as a tensor like the other branch's
    for t in tl.range(first, end, step):
        pid_m, pid_n = grouped_tile(t, num_pid_m, num_pid_n, GROUP_M)
        # max_padded is a host-side bound; blocks past the real end have nothing to do.
        if pid_m * BLOCK_M < num_post:
            fp8_tile(pid_m, pid_n, expert_ids_ptr,
                     a_ptr, a_scale_ptr, b_ptr, b_desc, b_scale_ptr, c_ptr, c_scale_ptr, router_w_ptr,
                     sorted_ids_ptr, N, K, num_pairs, a_row_div, up_scale_rows, b_rows_per_expert,
                     stride_am, stride_ak, stride_asm, stride_ask,
                     stride_be, stride_bn, stride_bk, stride_bse, stride_bsn, stride_bsk,
                     stride_cm, stride_cn, stride_csm,
                     BLOCK_M, BLOCK_N, BLOCK_K, GATED, ROUTER_WEIGHTS, SORTED_ROWS, QUANT_OUT, SWAP_AB, USE_TMA)

# ------------------------------------------------------------------ checks and the launcher

#: Triton releases whose e4m3 ``tl.dot`` was checked: natively on a GPU (FP8 tensor cores need
#: compute capability 8.9+: Ada, Hopper and later), in the CPU interpreter with 3.9.
MIN_TRITON_GPU = (3, 2)
MIN_TRITON_INTERPRETER = (3, 9)


def check_fp8_runtime() -> None:
    """Refuse, with the reason, a runtime where e4m3 kernels cannot run or were never checked."""
    version = tuple(int(p) for p in triton.__version__.split(".")[:2])
    if runtime.INTERPRETED:
        if version < MIN_TRITON_INTERPRETER:
            raise RuntimeError(f"FP8 kernels: Triton's CPU interpreter runs e4m3 tl.dot from Triton "
                               f"{'.'.join(map(str, MIN_TRITON_INTERPRETER))} on; this is Triton {triton.__version__}")
        return
    if version < MIN_TRITON_GPU:
        raise RuntimeError(f"FP8 kernels: expected Triton {'.'.join(map(str, MIN_TRITON_GPU))} or newer, "
                           f"got {triton.__version__}")
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 9):
        raise RuntimeError(f"FP8 kernels: need FP8 tensor cores (compute capability 8.9+), "
                           f"this GPU is sm{major}{minor}")


def _fp8_weight_descriptor(b: torch.Tensor, config: KernelConfig):
    """A TMA descriptor over e4m3 ``b`` viewed as ``[E * rows, K]``, or None (pointer loads)."""
    E, rows, K = b.shape
    if not config.use_tma or not _tma_can_read(b) or b.stride(0) != rows * b.stride(1):
        return None
    from triton.tools.tensor_descriptor import TensorDescriptor
    return TensorDescriptor.from_tensor(b.as_strided((E * rows, K), (b.stride(1), 1)),
                                        [config.block_n, config.block_k])


def launch_fp8_gemm(a, a_scale, b, b_scale, c, alignment, num_pairs: int, a_row_div: int, config: KernelConfig,
                    *, router_weights=None, c_scale=None, gated: bool = False, sorted_rows: bool = False) -> None:
    """Launch :func:`fp8_moe_kernel` once on checked inputs; shapes as flat pairs.

    ``a`` ``[rows, K]`` e4m3 with ``a_scale`` ``[rows, ceil(K/128)]``; ``b`` ``[E, N or 2N, K]`` e4m3
    with ``b_scale`` (gate/up halves blocked apart when ``gated``); ``c`` ``[num_pairs or padded rows,
    N]``, bf16/fp32, or e4m3 when ``c_scale`` ``[rows, ceil(N/128)]`` is given (then BLOCK_N = 128).
    ``a_row_div``: topk to gather token rows, 1 for one row per pair, 0 for rows in sorted order
    (``sorted_rows``: then the writing side passes topk and the reading side 0).
    """
    if config.gluon:
        if sorted_rows or c_scale is not None or a_row_div < 1:
            raise ValueError("config.gluon: the Gluon kernel runs the first GEMM here; the layer runs it through "
                             "fp8_moe_layer")
        return gluon_fp8_first_gemm(a, a_scale, b, b_scale, c, alignment, num_pairs, a_row_div, config,
                                    router_weights)
    sorted_ids, expert_ids, num_post = alignment
    N, K = c.shape[1], a.shape[1]
    if c_scale is not None and config.block_n != BLOCK:
        raise ValueError(f"config: quantising the output needs block_n = {BLOCK} (one scale per tile row), "
                         f"got {config.block_n}")
    if BLOCK % config.block_k:
        raise ValueError(f"config: block_k must divide {BLOCK} (one scale per K step), got {config.block_k}")
    max_padded = sorted_ids.numel()
    max_tiles = triton.cdiv(max_padded, config.block_m) * triton.cdiv(N, config.block_n)
    if config.persistent:
        grid = persistent_grid(max_tiles)
    else:
        grid = (max_tiles,)
    b_desc = _fp8_weight_descriptor(b, config)
    up_scale_rows = b_scale.shape[1] // 2 if gated else 0
    fp8_moe_kernel[grid](
        a, a_scale, b, b_desc, b_scale, c, c_scale if c_scale is not None else a_scale,
        router_weights if router_weights is not None else a_scale,
        sorted_ids, expert_ids, num_post,
        N, K, num_pairs, max_padded, a_row_div, up_scale_rows, b.shape[1],
        a.stride(0), a.stride(1), a_scale.stride(0), a_scale.stride(1),
        b.stride(0), b.stride(1), b.stride(2), b_scale.stride(0), b_scale.stride(1), b_scale.stride(2),
        c.stride(0), c.stride(1), c_scale.stride(0) if c_scale is not None else 0,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=config.group_m,
        GATED=gated, ROUTER_WEIGHTS=router_weights is not None, SORTED_ROWS=sorted_rows,
        QUANT_OUT=c_scale is not None, SWAP_AB=config.swap_ab, USE_TMA=b_desc is not None,
        PERSISTENT=config.persistent, num_warps=config.num_warps, num_stages=config.num_stages,
    )


def out_dtype() -> torch.dtype:
    """What the FP8 layer returns: bf16 on a GPU, fp32 in the interpreter (which mishandles bf16)."""
    return torch.bfloat16 if runtime.ON_GPU else torch.float32


def fp8_moe_matmul(x_q: torch.Tensor, x_scale: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                   topk_ids: torch.Tensor, topk_weights: torch.Tensor | None = None, *,
                   config: KernelConfig | None = None, alignment=None) -> torch.Tensor:
    """First GEMM in block-scaled FP8: ``out[m, j] = dequant(weight[e]) @ dequant(x[m])``, e = topk_ids[m, j].

    Args:
        x_q, x_scale: ``[M, K]`` e4m3 and ``[M, ceil(K/128)]`` fp32
            (:func:`moe_tutorial.kernels.fp8_quant.quantize_rows`).
        weight, weight_scale: ``[E, N, K]`` e4m3 and ``[E, ceil(N/128), ceil(K/128)]`` fp32
            (:func:`moe_tutorial.quant.quantize_weight`).
        topk_ids: ``[M, topk]`` int32/int64 in ``[0, E)``.
        topk_weights: optional ``[M, topk]`` float, multiplied into each output row.
        config: launch parameters (block_k dividing 128); default :func:`moe_tutorial.kernels.configs.fp8_config`.
        alignment: a precomputed ``align_block_size(topk_ids, config.block_m, E)``.

    Returns:
        ``[M, topk, N]`` bf16 on a GPU (fp32 in the interpreter), accumulated in fp32.
    """
    check_fp8_runtime()
    M, K, N, E, topk = check_fp8_matmul_inputs(x_q, x_scale, weight, weight_scale, topk_ids, topk_weights)
    config = fp8_config(M, E, N, K, topk, "plain") if config is None else check_fp8_config(config)
    out = torch.empty(M, topk, N, dtype=out_dtype(), device=x_q.device)
    if M == 0 or N == 0:
        return out
    if alignment is None:
        alignment = align_block_size(topk_ids, config.block_m, E)
    check_alignment(alignment, block_m=config.block_m, num_pairs=M * topk, num_experts=E, topk_ids=topk_ids)
    router = None if topk_weights is None else topk_weights.reshape(-1).float().contiguous()
    launch_fp8_gemm(x_q, x_scale, weight, weight_scale, out.view(M * topk, N), alignment, M * topk, topk, config,
                    router_weights=router)
    return out


def fp8_moe_layer(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                  w2_scale: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                  configs=None) -> torch.Tensor:
    """The whole MoE layer with FP8 experts, as :func:`moe_tutorial.layer.moe_layer` computes it in bf16.

    1. x quantised per token in 128-wide groups (one launch, :func:`quantize_rows`);
    2. the gate/up GEMM in FP8 with ``silu(gate) * up`` in its epilogue, quantised there into the
       down GEMM's e4m3 input, rows left in sorted order;
    3. the down GEMM in FP8 with the router weights in its epilogue -> ``[M * topk, K]``;
    4. the sum over each token's topk rows, in fp32.

    Args:
        x: ``[M, K]`` bf16 (GPU) or fp32 (interpreter).
        w13, w13_scale: ``[E, 2I, K]`` e4m3 (gate rows then up rows) and
            ``[E, 2 * ceil(I/128), ceil(K/128)]`` fp32 (:func:`moe_tutorial.quant.quantize_w13`,
            or a checkpoint's :func:`moe_tutorial.checkpoint.stack_experts`).
        w2, w2_scale: ``[E, K, I]`` e4m3 and ``[E, ceil(K/128), ceil(I/128)]`` fp32.
        topk_weights, topk_ids: ``[M, topk]`` router output (fp32, int32/int64).
        configs: optional ``(gate/up, down)`` :class:`KernelConfig` pair with one BLOCK_M.

    Returns:
        ``[M, K]`` in x's dtype.
    """
    check_fp8_runtime()
    M, K, inter, E, topk = check_fp8_layer_inputs(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids,
                                                  dtype=out_dtype())
    if configs is not None:
        configs = check_fp8_configs(configs)     # before the empty-batch return: a bad pair is bad anyway
    if M == 0:
        return x.new_empty(0, K)
    if configs is None:
        cfg_up, cfg_down = layer_configs(M, E, inter, K, topk)
    else:
        cfg_up, cfg_down = configs
    num_pairs = M * topk
    alignment = align_block_size(topk_ids, cfg_up.block_m, E)
    if cfg_up.gluon or cfg_down.gluon:
        if not (cfg_up.gluon and cfg_down.gluon):
            raise ValueError("configs: the Gluon layer hands the down GEMM its input with transposed scales, so "
                             "both configs or neither set gluon")
        return gluon_fp8_layer(x, w13, w13_scale, w2, w2_scale, topk_weights, alignment, topk, cfg_up, cfg_down)
    padded = alignment[0].numel()
    x_q, x_s = launch_quantize_rows(x)
    act = torch.empty(padded, inter, dtype=FP8_DTYPE, device=x.device)
    act_s = torch.empty(padded, triton.cdiv(inter, BLOCK), dtype=torch.float32, device=x.device)
    launch_fp8_gemm(x_q, x_s, w13, w13_scale, act, alignment, num_pairs, topk, cfg_up, c_scale=act_s, gated=True,
                    sorted_rows=True)
    down = x.new_empty(num_pairs, K)
    router = topk_weights.reshape(-1).float().contiguous()
    launch_fp8_gemm(act, act_s, w2, w2_scale, down, alignment, num_pairs, 0, cfg_down, router_weights=router,
                    sorted_rows=True)
    return topk_sum(down.view(M, topk, K))


def layer_configs(M: int, E: int, inter: int, K: int, topk: int, kernel: str | None = None):
    """``(gate/up, down)`` configurations of the FP8 layer: the gate/up GEMM's entry picks the kernel
    (``tl`` or Gluon; ``kernel`` forces one), and the down GEMM follows it on the same row blocks,
    since both GEMMs read one alignment (and the Gluon down GEMM reads the scales its gate/up GEMM
    wrote, transposed)."""
    up = fp8_config(M, E, inter, K, topk, "gated", kernel=kernel)
    down = fp8_config(M, E, K, inter, topk, "down", kernel="gluon" if up.gluon else "tl")
    if down.block_m == up.block_m:
        return up, down
    if up.gluon:
        return up, GLUON_PLAIN if up.block_m == GLUON_PLAIN.block_m else GLUON_FUSED_DOWN
    return up, replace(down, block_m=up.block_m)

