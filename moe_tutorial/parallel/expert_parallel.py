"""Part 6's expert-parallel layer: each rank holds E / world experts and its own tokens.

dispatch (all-to-all) -> Part 4's kernel on the rows this rank's experts received -> combine
(all-to-all back, sum of each token's rows). Its output on each rank equals the single-process
layer's rows for that rank's tokens.
"""
from __future__ import annotations

import torch

from ..checks import check_kernel_dtype, check_tensor
from ..kernels.sorted_kernel import sorted_moe_layer
from .dispatch import Dispatched, combine, dispatch
from .groups import check_same_on_all_ranks, dtype_code, gather_rows, require_group
from .sharding import experts_per_rank


def local_experts(d: Dispatched, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Run this rank's experts on the rows it received: ``[R, K]``, one router-weighted row per pair.

    Each received row is a "token" with a single expert (topk = 1), so Part 4's layer applies
    unchanged: gate/up GEMM with SiLU * up, down GEMM with the router weight in its epilogue.
    """
    return sorted_moe_layer(d.x, w13, w2, d.weights[:, None], d.expert_ids[:, None])


def check_local_weights(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, num_experts: int,
                        world_size: int) -> tuple[int, int]:
    """This rank's experts must be ``w13 [E/world, 2I, K]`` and ``w2 [E/world, K, I]`` in x's dtype
    and device; returns ``(E/world, I)``."""
    check_tensor("x", x, 2)
    check_tensor("w13", w13, 3)
    check_tensor("w2", w2, 3)
    per = experts_per_rank(num_experts, world_size)
    K = x.shape[1]
    if w13.shape[0] != per or w13.shape[2] != K or w13.shape[1] % 2:
        raise ValueError(f"w13: expected this rank's E / world = {per} experts of shape [2I, K={K}], "
                         f"got shape {tuple(w13.shape)}")
    inter = w13.shape[1] // 2
    if tuple(w2.shape) != (per, K, inter):
        raise ValueError(f"w2: expected shape (E / world, K, I) = {(per, K, inter)}, got shape {tuple(w2.shape)}")
    for name, t in (("w13", w13), ("w2", w2)):
        if t.dtype != x.dtype:
            raise TypeError(f"{name}: expected x's dtype {x.dtype}, got {t.dtype}")
        if t.device != x.device:
            raise ValueError(f"{name}: expected x's device {x.device}, got {t.device}")
    check_kernel_dtype("x", x)
    return per, inter


def expert_parallel_layer(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                          topk_ids: torch.Tensor, *, num_experts: int, group=None) -> torch.Tensor:
    """The MoE layer with the experts sharded over the ranks of ``group``.

    Call it on every rank of the group, each with its own tokens.

    Args:
        x: ``[M, K]`` this rank's tokens; M may differ between ranks (0 included).
        w13: ``[E/world, 2I, K]`` this rank's experts (see :func:`shard_experts`): global expert
            ``rank * E/world + e`` is local expert ``e``.
        w2: ``[E/world, K, I]``.
        topk_weights: ``[M, topk]`` float router weights.
        topk_ids: ``[M, topk]`` int32/int64 global expert ids in ``[0, num_experts)``.
        num_experts: E of the whole model; the world size must divide it.
        group: the process group (None: the default one).

    Returns:
        ``[M, K]`` in x's dtype: the rows the single-process layer gives for these tokens.
    """
    _, world = require_group(group)
    check_tensor("x", x, 2)
    # num_experts first, on every rank: a rank given another E would otherwise find its own w13 of the
    # wrong size and blame it, alone, while the others wait in the exchange.
    check_same_on_all_ranks(gather_rows(torch.tensor([num_experts], dtype=torch.int64, device=x.device), group),
                            ["num_experts"])
    per, inter = check_local_weights(x, w13, w2, num_experts, world)
    same = {"w13.shape[0] (experts per rank)": per, "w2.shape[2] (intermediate size I)": inter,
            "x.dtype": dtype_code(x.dtype)}
    d = dispatch(x, topk_weights, topk_ids, num_experts, group=group, same_on_all_ranks=same)
    return combine(local_experts(d, w13, w2), d.plan, group=group)
