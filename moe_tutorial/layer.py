"""The whole MoE layer, ``y = sum_j w_j * w2[e_j] @ (silu(w1[e_j] x) * w3[e_j] x)``, four ways."""
from __future__ import annotations

from typing import Callable

import torch

from .activation import silu_and_mul
from .checks import check_kernel_dtype, check_layer_inputs, check_no_grad
from .indexing import indexing_moe_matmul
from .kernels.fused_kernel import fused_moe_matmul
from .kernels.sorted_layer import sorted_moe_layer
from .kernels.trainable_layer import trainable_moe_layer
from .loop import loop_moe_layer

IMPLS = ("loop", "indexing", "fused", "sorted")


def two_gemm_layer(first_gemm: Callable, x, w13, w2, topk_weights, topk_ids) -> torch.Tensor:
    """Build the layer from any first-GEMM function ``(x, weight, topk_ids) -> [M, topk, N]``.

    The down GEMM reuses the same function: each (token, slot) pair becomes a "token" of its
    own with a single expert, ``act [M * topk, I]`` and ``topk_ids.reshape(-1, 1)``.
    """
    M, topk = topk_ids.shape
    hidden, inter = w2.shape[1], w2.shape[2]
    act = silu_and_mul(first_gemm(x, w13, topk_ids))                                   # [M, topk, I]
    down = first_gemm(act.reshape(M * topk, inter), w2, topk_ids.reshape(M * topk, 1))  # [M * topk, 1, K]
    weighted = down.view(M, topk, hidden).float() * topk_weights[..., None].float()
    return weighted.sum(dim=1).to(x.dtype)


def moe_layer(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor, impl: str = "loop") -> torch.Tensor:
    """The MoE layer after routing.

    Args:
        x: ``[M, K]`` float tokens (K = hidden size).
        w13: ``[E, 2I, K]``, each expert's gate rows (w1) then up rows (w3).
        w2: ``[E, K, I]``, each expert's down projection.
        topk_weights: ``[M, topk]`` float router weights (see :func:`moe_tutorial.route`).
        topk_ids: ``[M, topk]`` int32/int64 expert ids in ``[0, E)``.
        impl: "loop" (Part 1), "indexing" (Part 2), "fused" (Part 3 kernel) or
            "sorted" (Part 4 kernel). The kernels need fp32 in the interpreter. "loop",
            "indexing" and "sorted" are differentiable: with "sorted", inputs that require grad
            (autograd on) take Part 8's kernels, whose backward gives gradients for x, w13, w2
            and topk_weights. "fused" has no backward: inputs that require grad are refused
            (ValueError) unless autograd is off (``torch.no_grad()``).

    Returns:
        ``[M, K]`` in x's dtype. ``M = 0`` gives an empty ``[0, K]``.
    """
    if impl not in IMPLS:
        raise ValueError(f"impl: expected one of {', '.join(IMPLS)}, got {impl!r}")
    # Parts 1 and 4 check their own inputs at their door (once: each check of the ids costs a host sync).
    if impl == "loop":
        return loop_moe_layer(x, w13, w2, topk_weights, topk_ids)
    if impl == "sorted":
        if _tracked(x, w13, w2, topk_weights):
            return trainable_moe_layer(x, w13, w2, topk_weights, topk_ids)   # Part 8: forward and backward
        return sorted_moe_layer(x, w13, w2, topk_weights, topk_ids)
    if impl == "fused":
        check_no_grad({"x": x, "w13": w13, "w2": w2, "topk_weights": topk_weights})
    M, K, _, _, _ = check_layer_inputs(x, w13, w2, topk_weights, topk_ids)
    if impl == "fused":
        check_kernel_dtype("x", x)
    if M == 0:
        return x.new_empty(0, K)
    if impl == "indexing":
        return two_gemm_layer(indexing_moe_matmul, x, w13, w2, topk_weights, topk_ids)
    return two_gemm_layer(fused_moe_matmul, x, w13, w2, topk_weights, topk_ids)


def _tracked(*tensors) -> bool:
    """True when autograd would record an operation on any of ``tensors``."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)
