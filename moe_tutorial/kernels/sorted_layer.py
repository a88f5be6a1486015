"""Part 4's entry points: the launchers of the sorted kernel, the first GEMM and the layer.

The kernel itself (the ``@triton.jit`` code notebook 04 shows) is in
:mod:`moe_tutorial.kernels.sorted_kernel`, its persistent-grid variant in
:mod:`moe_tutorial.kernels.persistent_kernel`. Here: :func:`sorted_moe_matmul` and
:func:`sorted_moe_layer`, which check their inputs at the door; :func:`launch_sorted_gemm`, the
checked door for the bench and the tuner, which launch on buffers they built; and behind them
:func:`launch_fitted` and :func:`_launch`, which trust their callers.
"""
from __future__ import annotations

import torch
import triton
from triton.runtime.errors import OutOfResources

from ..checks import (
    check_kernel_dtype,
    check_layer_inputs,
    check_matmul_inputs,
    check_no_grad,
    check_topk_weights,
)
from . import persistent_kernel, sorted_kernel  # the kernels through their modules: experiments replace them
from .align import align_block_size, check_alignment
from .configs import KernelConfig, check_config, get_config, shrink
from .tma import rows_descriptor, weight_descriptor
from .topk_sum import topk_sum

#: Configurations that did not fit this GPU's shared memory, and what ran instead.
_FITTED: dict = {}


def launch_sorted_gemm(a, b, c, router_weights, alignment, num_pairs: int, a_row_div: int,
                       config: KernelConfig, *, gated: bool = False, a_sorted: bool = False,
                       c_sorted: bool = False) -> None:
    """Launch :func:`~moe_tutorial.kernels.sorted_kernel.sorted_moe_kernel` on buffers the caller
    built (the bench and the tuner do): the checked door to :func:`launch_fitted`.

    Refuses, with the arguments as :func:`_launch` takes them, an ``alignment`` built for another
    launch (a ValueError, not a wild read; host-side, no sync), tensors autograd would track
    (the kernel has no backward), router weights on the gated GEMM (its epilogue is
    ``silu(gate) * up``; the layer weights the down GEMM's rows), and with ``a_sorted`` /
    ``c_sorted`` a side with fewer rows than the alignment's sorted positions.
    """
    check_alignment(alignment, block_m=config.block_m, num_pairs=num_pairs, num_experts=b.shape[0], device=a.device)
    check_no_grad({"x (or the activations)": a, "the expert weights": b, "topk_weights": router_weights})
    if gated and router_weights is not None:
        raise ValueError("router_weights: expected None with gated=True (the gated GEMM's epilogue is silu(gate) * up; "
                         "the layer multiplies the router weights into the down GEMM's rows)")
    max_padded = alignment[0].numel()
    for name, t, flag in (("a", a, a_sorted), ("c", c, c_sorted)):
        if flag and t.shape[0] < max_padded:
            raise ValueError(f"{name}: expected one row per sorted position ({max_padded}) with {name}_sorted, "
                             f"got {t.shape[0]} rows")
    launch_fitted(a, b, c, router_weights, alignment, num_pairs, a_row_div, config, gated=gated,
                  a_sorted=a_sorted, c_sorted=c_sorted)


def launch_fitted(a, b, c, router_weights, alignment, num_pairs: int, a_row_div: int,
                  config: KernelConfig, *, gated: bool = False, a_sorted: bool = False,
                  c_sorted: bool = False) -> None:
    """:func:`_launch`, shrinking ``config`` if this GPU lacks the shared memory it needs (a table
    tuned on an H200 may ask for more than a smaller GPU has); the shrunk configuration is
    remembered per process. Trusts its caller, as :func:`_launch` does.
    """
    config = check_config(config)     # the layer's configs too (notebook 04 shows sorted_moe_layer as it was)
    key = (config, gated, a.dtype)
    config = _FITTED.get(key, config)
    while True:
        try:
            return _launch(a, b, c, router_weights, alignment, num_pairs, a_row_div, config, gated=gated,
                           a_sorted=a_sorted, c_sorted=c_sorted)
        except OutOfResources:
            smaller = shrink(config)
            if smaller is None:
                raise
            config = _FITTED[key] = smaller


def _activation_descriptors(a: torch.Tensor, config: KernelConfig):
    """TMA descriptors over activations in sorted order, for whole and half row blocks, or
    ``(None, None)`` where TMA cannot or should not be used.

    Only with the configurations that take the weights through TMA too, 64-row tiles or taller
    (the prefill end): on an H200 it paid there and not at decode (measurements/gpu-notes.md, the
    second 2026-12-01 session, "Sorted activations").
    """
    if not config.use_tma or config.block_m < 64:
        return None, None
    whole = rows_descriptor(a, [config.block_m, config.block_k])
    if whole is None:
        return None, None
    return whole, rows_descriptor(a, [config.block_m // 2, config.block_k])


def _launch(a, b, c, router_weights, alignment, num_pairs: int, a_row_div: int,
            config: KernelConfig, *, gated: bool = False, a_sorted: bool = False, c_sorted: bool = False) -> None:
    """Launch :func:`~moe_tutorial.kernels.sorted_kernel.sorted_moe_kernel` (or, with
    ``config.persistent``, :func:`~moe_tutorial.kernels.persistent_kernel.persistent_moe_kernel`)
    once. Shapes as flat pairs: ``c`` is ``[num_pairs, N]``.

    ``a`` ``[rows, K]``, ``b`` ``[E, N or 2N, K]``, ``router_weights`` ``[num_pairs]`` fp32 or
    None, ``alignment`` from :func:`align_block_size` built with ``config.block_m`` for these
    ``num_pairs`` and ``b``'s experts. Sorted activations: with ``c_sorted`` C's rows are the
    alignment's sorted positions, with ``a_sorted`` A's rows are; that side then needs
    ``len(alignment[0])`` rows. Nothing is checked here: the public functions check their
    inputs at the door (:func:`launch_sorted_gemm`, :func:`sorted_moe_matmul`,
    :func:`sorted_moe_layer`).
    """
    sorted_ids, expert_ids, num_post = alignment
    N, K = c.shape[1], a.shape[1]
    max_padded = sorted_ids.numel()
    max_tiles = triton.cdiv(max_padded, config.block_m) * triton.cdiv(N, config.block_n)
    b_desc = weight_descriptor(b, [config.block_n, config.block_k]) if config.use_tma else None
    a_desc, a_desc_half = _activation_descriptors(a, config) if a_sorted else (None, None)
    args = dict(
        N=N, K=K, num_pairs=num_pairs, a_row_div=a_row_div,
        stride_b_up=N * b.stride(1), b_rows_per_expert=b.shape[1], group_m=config.group_m,
        stride_a=(a.stride(0), a.stride(1)), stride_b=(b.stride(0), b.stride(1), b.stride(2)),
        stride_c=(c.stride(0), c.stride(1)),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        A_ROWS=("sorted_tma" if a_desc is not None else "sorted") if a_sorted else "gathered",
        C_ROWS="sorted" if c_sorted else "scattered",
        EPILOGUE="silu_and_mul" if gated else "router_weights" if router_weights is not None else None,
        EVEN_K=K % config.block_k == 0,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    # Without router weights the kernel never reads them; any pointer does.
    router = router_weights if router_weights is not None else c
    if config.persistent:
        persistent_kernel.persistent_moe_kernel[persistent_kernel.persistent_grid(max_tiles)](
            a, a_desc, b, b_desc, c, router, (sorted_ids, expert_ids, num_post), **args)
        return
    sorted_kernel.sorted_moe_kernel[(max_tiles,)](
        a, a_desc, a_desc_half, b, b_desc, c, router, (sorted_ids, expert_ids, num_post),
        max_padded=max_padded, SHORT_TAILS=config.short_tails and config.block_m >= 32, **args)


def sorted_moe_matmul(x: torch.Tensor, weight: torch.Tensor, topk_ids: torch.Tensor,
                      topk_weights: torch.Tensor | None = None, *,
                      config: KernelConfig | None = None, alignment=None) -> torch.Tensor:
    """First GEMM with Part 4's kernel, optionally scaled by the router weights.

    Args:
        x: ``[M, K]`` fp32 (interpreter) or fp32/fp16/bf16 (GPU); any strides.
        weight: ``[E, N, K]`` x's dtype; any strides.
        topk_ids: ``[M, topk]`` int32/int64 in ``[0, E)``.
        topk_weights: optional ``[M, topk]`` float; multiplied into each output row.
        config: launch parameters; default from :func:`moe_tutorial.kernels.configs.get_config`.
        alignment: a precomputed ``align_block_size(topk_ids, config.block_m, E)`` of these very
            ``topk_ids``; one built for anything else is refused with a ValueError.

    No backward pass: inputs that require grad are refused unless autograd is off.

    Returns:
        ``[M, topk, N]`` in x's dtype, accumulated in fp32.
    """
    # The door: every input checked once here (x and weight's autograd state included), then
    # the launch trusts them.
    M, K, N, E, topk = check_matmul_inputs(x, weight, topk_ids, kernel=True)
    if topk_weights is not None:
        check_topk_weights(topk_weights, topk_ids)
        check_no_grad({"topk_weights": topk_weights})
    if config is not None:
        config = check_config(config)           # before the empty-batch return: a bad config is bad anyway
    out = x.new_empty(M, topk, N)
    if M == 0 or N == 0:
        return out
    config = config or get_config(M, E, N, K, topk, x.dtype, "plain")
    if alignment is None:
        alignment = align_block_size(topk_ids, config.block_m, E)
    else:
        check_alignment(alignment, block_m=config.block_m, num_pairs=M * topk, num_experts=E, topk_ids=topk_ids)
    router = None if topk_weights is None else topk_weights.reshape(-1).float().contiguous()
    launch_fitted(x, weight, out.view(M * topk, N), router, alignment, M * topk, topk, config)
    return out


def sorted_moe_layer(x, w13, w2, topk_weights, topk_ids, *, configs=None) -> torch.Tensor:
    """The whole layer with Part 4's kernel: two GEMMs with fused epilogues, then a sum.

    1. gate/up GEMM with ``silu(gate) * up`` in its epilogue -> ``[M * topk, I]``, rows left in
       sorted order when both GEMMs use the same BLOCK_M (they then share one alignment);
    2. down GEMM with the router weights in its epilogue -> ``[M * topk, K]``;
    3. the sum over each token's topk rows (:func:`moe_tutorial.kernels.topk_sum.topk_sum`, fp32).

    Args as :func:`moe_tutorial.layer.moe_layer`; ``configs`` an optional pair of
    :class:`KernelConfig` for the two GEMMs. Returns ``[M, K]`` in x's dtype.
    """
    # The door: every input checked once here, then the launches trust them. The kernels have no
    # backward: what autograd would track is refused first, as moe_layer always did.
    check_no_grad({"x": x, "w13": w13, "w2": w2, "topk_weights": topk_weights})
    M, K, inter, E, topk = check_layer_inputs(x, w13, w2, topk_weights, topk_ids)
    check_kernel_dtype("x", x)
    if M == 0:
        return x.new_empty(0, K)
    cfg_up, cfg_down = configs or (
        get_config(M, E, inter, K, topk, x.dtype, "gated"),
        get_config(M, E, K, inter, topk, x.dtype, "down"),
    )
    # [two GEMMs and a sum]
    num_pairs = M * topk
    align_up = align_block_size(topk_ids, cfg_up.block_m, E)
    router = topk_weights.reshape(-1).float().contiguous()
    down = x.new_empty(num_pairs, K)
    if cfg_down.block_m == cfg_up.block_m:
        # Sorted activations: the gate/up GEMM leaves its rows in sorted order (padding rows
        # included, never written), and the down GEMM reads each block of rows as it lies.
        act = x.new_empty(align_up[0].numel(), inter)
        launch_fitted(x, w13, act, None, align_up, num_pairs, topk, cfg_up, gated=True, c_sorted=True)
        launch_fitted(act, w2, down, router, align_up, num_pairs, 1, cfg_down, a_sorted=True)
    else:
        act = x.new_empty(num_pairs, inter)
        launch_fitted(x, w13, act, None, align_up, num_pairs, topk, cfg_up, gated=True)
        align_down = align_block_size(topk_ids, cfg_down.block_m, E)
        launch_fitted(act, w2, down, router, align_down, num_pairs, 1, cfg_down)
    return topk_sum(down.view(M, topk, K))


__all__ = ["launch_sorted_gemm", "launch_fitted", "sorted_moe_matmul", "sorted_moe_layer"]
