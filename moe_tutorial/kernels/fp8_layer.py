"""Part 7's entry points: the FP8 launcher, the first GEMM and the layer (kernels in :mod:`.fp8_kernel`).

:func:`fp8_moe_matmul` and :func:`fp8_moe_layer` check their inputs at the door (with
:mod:`moe_tutorial.checks`, as every part's entry points do) and choose the kernel each GEMM
runs: Part 7's ``tl`` kernel (:func:`moe_tutorial.kernels.fp8_kernel.fp8_moe_kernel`), or, where
the tuned table found it faster on Hopper, the Gluon kernel
(:mod:`moe_tutorial.kernels.gluon_fp8_kernel`). :func:`launch_fp8_gemm` launches one GEMM on
buffers its caller built and checked (the layer, the bench and the tuner).
"""
from __future__ import annotations

from dataclasses import replace

import torch
import triton

from .. import runtime
from ..checks import check_fp8_layer_inputs, check_fp8_matmul_inputs, check_fp8_runtime
from ..quant import BLOCK, FP8_DTYPE
from . import fp8_kernel  # the kernel through its module: experiments/sm90.py replaces it to compile only
from .align import align_block_size, check_alignment
from .configs import (
    GLUON_FUSED_DOWN,
    GLUON_PLAIN,
    KernelConfig,
    check_fp8_config,
    check_fp8_configs,
    copied_out,
    fp8_config,
    layer_copies_out,
)
from .fp8_quant import launch_quantize_rows
from .gluon_fp8_kernel import gluon_fp8_first_gemm, gluon_fp8_layer
from .tma import weight_descriptor
from .topk_sum import topk_sum


def launch_fp8_gemm(a, a_scale, b, b_scale, c, alignment, num_pairs: int, a_row_div: int, config: KernelConfig,
                    *, router_weights=None, c_scale=None, gated: bool = False, a_sorted: bool = False,
                    c_sorted: bool = False) -> None:
    """Launch :func:`~moe_tutorial.kernels.fp8_kernel.fp8_moe_kernel` once on checked inputs (a
    ``config`` that :func:`~moe_tutorial.kernels.configs.check_fp8_config` passes); shapes as flat pairs.

    ``a`` ``[rows, K]`` e4m3 with ``a_scale`` ``[rows, ceil(K/128)]``; ``b`` ``[E, N or 2N, K]`` e4m3
    with ``b_scale`` (gate/up halves blocked apart when ``gated``); ``c`` ``[num_pairs or padded rows,
    N]``, bf16/fp32, or e4m3 with ``c_scale`` ``[rows, ceil(N/128)]`` (then BLOCK_N = 128), quantised
    in the epilogue. ``a_row_div``: topk to gather token rows, 1 for one row per pair. As in Part 4's
    :func:`~moe_tutorial.kernels.sorted_layer.launch_sorted_gemm`, with ``a_sorted`` A's rows are the
    alignment's sorted positions and with ``c_sorted`` C's are (sorted activations).
    """
    if config.gluon:
        if a_sorted or c_sorted or c_scale is not None:
            raise ValueError("config.gluon: the Gluon kernel runs the first GEMM here; the layer runs it through "
                             "fp8_moe_layer")
        return gluon_fp8_first_gemm(a, a_scale, b, b_scale, c, alignment, num_pairs, a_row_div, config,
                                    router_weights)
    sorted_ids, expert_ids, num_post = alignment
    N, K = c.shape[1], a.shape[1]
    max_padded = sorted_ids.numel()
    max_tiles = triton.cdiv(max_padded, config.block_m) * triton.cdiv(N, config.block_n)
    b_desc = weight_descriptor(b, [config.block_n, config.block_k]) if config.use_tma else None
    # Pointers the kernel never reads (no quantised output, no router weights) may be any tensor.
    fp8_kernel.fp8_moe_kernel[(max_tiles,)](
        a, a_scale, b, b_desc, b_scale, c, c_scale if c_scale is not None else a_scale,
        router_weights if router_weights is not None else a_scale, (sorted_ids, expert_ids, num_post),
        N, K, num_pairs, max_padded, a_row_div, config.group_m,
        (a.stride(0), a.stride(1)), (b.stride(0), b.stride(1), b.stride(2)), (c.stride(0), c.stride(1)),
        (a_scale.stride(0), a_scale.stride(1)), (b_scale.stride(0), b_scale.stride(1), b_scale.stride(2)),
        c_scale.stride(0) if c_scale is not None else 0,
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        A_ROWS="sorted" if a_sorted else "gathered", C_ROWS="sorted" if c_sorted else "scattered",
        EPILOGUE="silu_and_mul" if gated else "router_weights" if router_weights is not None else None,
        SWAP_AB=config.swap_ab, num_warps=config.num_warps, num_stages=config.num_stages,
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
                    c_sorted=True)
    down = x.new_empty(num_pairs, K)
    router = topk_weights.reshape(-1).float().contiguous()
    launch_fp8_gemm(act, act_s, w2, w2_scale, down, alignment, num_pairs, 1, cfg_down, router_weights=router,
                    a_sorted=True)
    return topk_sum(down.view(M, topk, K))


def layer_configs(M: int, E: int, inter: int, K: int, topk: int, kernel: str | None = None, *,
                  tma_store: bool = True):
    """``(gate/up, down)`` configurations of the FP8 layer: the gate/up GEMM's entry picks the kernel
    (``tl`` or Gluon; ``kernel`` forces one), and the down GEMM follows it on the same row blocks,
    since both GEMMs read one alignment (and the Gluon down GEMM reads the scales its gate/up GEMM
    wrote, transposed). The layer's Gluon GEMMs write C in sorted order, so where the copies were
    measured faster (:func:`~moe_tutorial.kernels.configs.layer_copies_out`) their tiles leave through
    TMA copies (:func:`~moe_tutorial.kernels.configs.copied_out`); ``tma_store=False`` gives the
    ``gl.store`` forms these replaced (to measure the two side by side)."""
    up = fp8_config(M, E, inter, K, topk, "gated", kernel=kernel)
    down = fp8_config(M, E, K, inter, topk, "down", kernel="gluon" if up.gluon else "tl")
    if down.block_m != up.block_m:
        down = (GLUON_PLAIN if up.block_m == GLUON_PLAIN.block_m else GLUON_FUSED_DOWN) if up.gluon \
            else replace(down, block_m=up.block_m)
    if tma_store and layer_copies_out(up, M * topk // E):
        return copied_out(up), copied_out(down)
    return up, down


__all__ = ["launch_fp8_gemm", "fp8_moe_matmul", "fp8_moe_layer", "layer_configs", "out_dtype", "check_fp8_runtime"]
