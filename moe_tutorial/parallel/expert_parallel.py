"""Part 6's expert-parallel layer: each rank holds E / world experts and its own tokens.

dispatch -> Part 4's kernel on the rows this rank's experts received -> combine. Its output on
each rank equals the single-process layer's rows for that rank's tokens. Two exchanges
(:mod:`.dispatch`): ``"all_gather"``, fixed capacity with no host synchronisation (the layer can
be captured in a CUDA graph), and ``"all_to_all"``, variable splits read on the host.
"""
from __future__ import annotations

import torch

from ..checks import check_kernel_dtype, check_no_grad, check_tensor
from ..kernels.align import align_block_size
from ..kernels.configs import get_config
from ..kernels.sorted_layer import launch_fitted, sorted_moe_layer
from ..kernels.topk_sum import local_topk_sum
from .dispatch import METHODS, Dispatched, capturing, combine, dispatch
from .groups import check_same_on_all_ranks, dtype_code, gather_rows, require_group
from .sharding import experts_per_rank


def local_experts(d: Dispatched, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """Run this rank's experts on the rows it received: ``[R, K]`` in x's dtype, one row per received row.

    all_to_all: each received row is a "token" with a single expert (topk = 1), so Part 4's layer
    applies unchanged: gate/up GEMM with SiLU * up, down GEMM with the router weight in its
    epilogue. all_gather: each received row is a token with its topk slots, only some of them
    this rank's; :func:`local_moe_layer` skips the others, so a row is the token's sum over this
    rank's experts (zeros when it has none).
    """
    if d.plan.method == "all_to_all":
        return sorted_moe_layer(d.x, w13, w2, d.weights, d.expert_ids)
    return local_moe_layer(d.x, w13, w2, d.weights, d.expert_ids)


def local_moe_layer(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                    local_ids: torch.Tensor) -> torch.Tensor:
    """Part 4's layer on the slots whose expert is on this rank; the other slots contribute zero.

    Args:
        x: ``[R, K]`` tokens (any row stride; the packed rows of dispatch).
        w13: ``[E_local, 2I, K]``, w2: ``[E_local, K, I]``, x's dtype.
        topk_weights: ``[R, topk]`` float router weights.
        local_ids: ``[R, topk]`` int32/int64; an id outside ``[0, E_local)`` (another rank's expert,
            or padding) is dropped by the alignment and skipped by the sum.

    Returns:
        ``[R, K]`` in x's dtype: each token's router-weighted sum over its local slots.

    Reads no device value (the ids are not range-checked: out of range means "not here"), so it
    can be captured in a CUDA graph. Same kernels and configurations as
    :func:`moe_tutorial.kernels.sorted_layer.sorted_moe_layer`; only the last sum differs.
    """
    check_no_grad({"x": x, "w13": w13, "w2": w2, "topk_weights": topk_weights})
    check_tensor("local_ids", local_ids, 2)
    R, K = x.shape
    E, inter, topk = w13.shape[0], w2.shape[2], local_ids.shape[1]
    if tuple(topk_weights.shape) != (R, topk) or local_ids.shape[0] != R:
        raise ValueError(f"topk_weights, local_ids: expected shape {(R, topk)}, one row per token of x, got "
                         f"{tuple(topk_weights.shape)} and {tuple(local_ids.shape)}")
    if R == 0:
        return x.new_empty(0, K)
    cfg_up, cfg_down = get_config(R, E, inter, K, topk, x.dtype, "gated"), get_config(R, E, K, inter, topk, x.dtype,
                                                                                          "down")
    num_pairs = R * topk
    align_up = align_block_size(local_ids, cfg_up.block_m, E)      # other ranks' slots appear nowhere
    router = topk_weights.reshape(-1).float().contiguous()
    down = x.new_empty(num_pairs, K)                                # rows of dropped slots stay unwritten
    # Sorted activations when both GEMMs share a BLOCK_M, as in sorted_moe_layer: one alignment.
    in_sorted_order = cfg_down.block_m == cfg_up.block_m
    act = x.new_empty(align_up[0].numel() if in_sorted_order else num_pairs, inter)
    launch_fitted(x, w13, act, None, align_up, num_pairs, topk, cfg_up, gated=True, c_sorted=in_sorted_order)
    align_down = align_up if in_sorted_order else align_block_size(local_ids, cfg_down.block_m, E)
    launch_fitted(act, w2, down, router, align_down, num_pairs, 1, cfg_down, a_sorted=in_sorted_order)
    return local_topk_sum(down.view(R, topk, K), local_ids, E)     # reads only the rows written


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
                          topk_ids: torch.Tensor, *, num_experts: int, group=None, method: str = "all_gather",
                          capacity: int | None = None, check_ranks: bool = True) -> torch.Tensor:
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
        method: the exchange, ``"all_gather"`` (fixed capacity, no host synchronisation) or
            ``"all_to_all"`` (variable splits, the host reads the counts); see :mod:`.dispatch`.
        capacity: all_gather only: tokens every rank sends, the same on every rank and at least
            every rank's M (None: the largest M, learnt by the check).
        check_ranks: check shapes across ranks and ids first (one host synchronisation). A CUDA
            graph, or a serving loop, passes ``False`` with a ``capacity``: the layer then reads
            no device value and every shape is fixed by M, K, topk and capacity.

    Returns:
        ``[M, K]`` in x's dtype: the rows the single-process layer gives for these tokens.
    """
    _, world = require_group(group)
    if method not in METHODS:
        raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
    check_tensor("x", x, 2)
    if (check_ranks or method == "all_to_all") and not capturing(x):
        # num_experts first, on every rank: a rank given another E would otherwise find its own w13 of
        # the wrong size and blame it, alone, while the others wait in the exchange. A host wait, as
        # every rank check: with check_ranks=False the caller vouches for the sizes.
        check_same_on_all_ranks(gather_rows(torch.tensor([num_experts], dtype=torch.int64, device=x.device), group),
                                ["num_experts"])
    per, inter = check_local_weights(x, w13, w2, num_experts, world)
    same = {"w13.shape[0] (experts per rank)": per, "w2.shape[2] (intermediate size I)": inter,
            "x.dtype": dtype_code(x.dtype)}
    d = dispatch(x, topk_weights, topk_ids, num_experts, method=method, capacity=capacity, group=group,
                 same_on_all_ranks=same, check_ranks=check_ranks)
    return combine(local_experts(d, w13, w2), d.plan, group=group)
