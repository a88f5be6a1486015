"""The alternative to expert parallelism: every rank holds every expert, but only ``I / world`` of
its intermediate columns, runs the whole batch, and the ranks add their partial outputs.

``silu(gate) * up`` acts column by column, so a rank holding gate and up columns ``[lo, hi)``
computes those columns of the activation on its own; w2's matching columns take them to a
partial ``[M, K]``, and the sum over ranks (one all-reduce) is the layer's output.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..checks import check_kernel_dtype, check_layer_inputs
from ..kernels.sorted_layer import sorted_moe_layer
from .groups import check_same_on_all_ranks, dtype_code, gather_rows, require_group


def tensor_parallel_layer(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                          topk_ids: torch.Tensor, *, group=None, check_ranks: bool = True) -> torch.Tensor:
    """The MoE layer with every expert's intermediate columns split over the ranks of ``group``.

    Call it on every rank with the *same* tokens and routing.

    Args:
        x: ``[M, K]``, the same on every rank.
        w13: ``[E, 2I/world, K]`` this rank's gate columns then its up columns of every expert
            (see :func:`shard_intermediate`).
        w2: ``[E, K, I/world]`` the matching columns of the down projection.
        topk_weights, topk_ids: ``[M, topk]``, the same on every rank.
        group: the process group (None: the default one).
        check_ranks: gather every rank's shapes first and raise ValueError where they differ
            (one extra small collective; a benchmark that already checked may skip it).

    Returns:
        ``[M, K]`` in x's dtype, the same on every rank.
    """
    require_group(group)
    M, K, inter_shard, E, topk = check_layer_inputs(x, w13, w2, topk_weights, topk_ids)
    check_kernel_dtype("x", x)
    if check_ranks:
        agree = {"x.shape[0] (tokens M; every rank runs the same batch)": M, "x.shape[1] (hidden size K)": K,
                 "w13.shape[0] (experts E)": E, "w2.shape[2] (intermediate columns per rank)": inter_shard,
                 "topk_ids.shape[1] (topk)": topk, "x.dtype": dtype_code(x.dtype)}
        mine = torch.tensor(list(agree.values()), dtype=torch.int64, device=x.device)
        check_same_on_all_ranks(gather_rows(mine, group), list(agree))
    # [partial and all-reduce]
    partial = sorted_moe_layer(x, w13, w2, topk_weights, topk_ids)     # this rank's columns' share of y
    dist.all_reduce(partial, group=group)                               # y = sum over ranks
    return partial
