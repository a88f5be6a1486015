"""Part 1, the expert view: a Python loop over experts, one small GEMM launch per expert."""
from __future__ import annotations

import torch

from .activation import silu_and_mul
from .checks import check_layer_inputs, check_matmul_inputs


def loop_moe_matmul(x: torch.Tensor, weight: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """First GEMM, expert by expert.

    Args:
        x: ``[M, K]`` float tokens.
        weight: ``[E, N, K]`` stacked expert weights, x's dtype.
        topk_ids: ``[M, topk]`` int32/int64 expert ids in ``[0, E)``.

    Returns:
        ``[M, topk, N]`` in x's dtype: ``out[m, j] = weight[topk_ids[m, j]] @ x[m]``.
    """
    M, K, N, E, topk = check_matmul_inputs(x, weight, topk_ids)
    out = x.new_empty(M, topk, N)
    counts = torch.bincount(topk_ids.flatten().long(), minlength=E)
    for e in counts.nonzero().flatten().tolist():
        # Every (token, slot) pair that chose expert e: one GEMM over just those tokens.
        idx, slot = torch.where(topk_ids == e)
        out[idx, slot] = x[idx] @ weight[e].T
    return out


def loop_moe_layer(x, w13, w2, topk_weights, topk_ids) -> torch.Tensor:
    """The whole MoE layer, expert by expert, as DeepSeek-V3's reference code writes it.

    Args:
        x: ``[M, K]``; w13: ``[E, 2I, K]`` gate rows then up rows; w2: ``[E, K, I]``;
        topk_weights: ``[M, topk]`` float; topk_ids: ``[M, topk]`` int.

    Returns:
        ``[M, K]`` in x's dtype: ``y[m] = sum_j w[m, j] * w2[e] @ (silu(gate) * up)``.
    """
    M, K, _, E, _ = check_layer_inputs(x, w13, w2, topk_weights, topk_ids)
    y = torch.zeros(M, K, dtype=torch.float32, device=x.device)
    counts = torch.bincount(topk_ids.flatten().long(), minlength=E)
    for e in counts.nonzero().flatten().tolist():
        idx, slot = torch.where(topk_ids == e)
        h = silu_and_mul(x[idx] @ w13[e].T)
        contribution = (h @ w2[e].T).float() * topk_weights[idx, slot, None].float()
        y.index_add_(0, idx, contribution)
    return y.to(x.dtype)
