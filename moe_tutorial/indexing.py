"""Part 2, the token view: gather each token's expert weights, then one broadcast matmul."""
from __future__ import annotations

import warnings

import torch

from .checks import check_matmul_inputs


def indexing_moe_matmul(x: torch.Tensor, weight: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """First GEMM with advanced indexing and no Python loop.

    Args:
        x: ``[M, K]`` float tokens.
        weight: ``[E, N, K]`` stacked expert weights, x's dtype.
        topk_ids: ``[M, topk]`` int32/int64 expert ids in ``[0, E)``.

    Returns:
        ``[M, topk, N]`` in x's dtype. On the way it materialises ``weight[topk_ids]``,
        a ``[M, topk, N, K]`` copy of the chosen weights (see :func:`intermediate_bytes`).
    """
    check_matmul_inputs(x, weight, topk_ids)
    selected = weight[topk_ids.long()]                          # [M, topk, N, K]
    return torch.matmul(selected, x[:, None, :, None]).squeeze(-1)  # [M, topk, N, 1] -> [M, topk, N]


def expert_moe_matmul(x: torch.Tensor, weight: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """Deprecated alias of :func:`indexing_moe_matmul`, Part 2's first GEMM under its old name.

    Kept for one release (0.1.x) and removed after it; it warns with a DeprecationWarning.
    """
    warnings.warn("expert_moe_matmul is deprecated and will be removed after the 0.1 releases: "
                  "call indexing_moe_matmul (the same function)", DeprecationWarning, stacklevel=2)
    return indexing_moe_matmul(x, weight, topk_ids)


def intermediate_bytes(M: int, topk: int, N: int, K: int, itemsize: int = 2) -> int:
    """Size in bytes of Part 2's ``selected`` tensor ``[M, topk, N, K]``."""
    return M * topk * N * K * itemsize
