"""Which part of the weights each rank holds: whole experts (expert parallel) or a slice of every
expert's intermediate columns (tensor parallel)."""
from __future__ import annotations

import torch

from ..checks import check_tensor


def _check_world(world_size: int, rank: int | None = None) -> None:
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: expected a positive int, got {world_size!r}")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size):
        raise ValueError(f"rank: expected an int in [0, {world_size}), got {rank!r}")


def experts_per_rank(num_experts: int, world_size: int) -> int:
    """``E / world``, each rank's number of experts; ValueError unless the world size divides E."""
    _check_world(world_size)
    if num_experts % world_size:
        divisors = [d for d in range(1, num_experts + 1) if num_experts % d == 0]
        raise ValueError(f"world size: expected a divisor of the number of experts E={num_experts} (each rank holds "
                         f"E / world experts: {divisors}), got {world_size}")
    return num_experts // world_size


def expert_range(rank: int, num_experts: int, world_size: int) -> range:
    """The global expert ids rank ``rank`` holds: a contiguous block of ``E / world``."""
    _check_world(world_size, rank)
    per = experts_per_rank(num_experts, world_size)
    return range(rank * per, (rank + 1) * per)


def shard_experts(w13: torch.Tensor, w2: torch.Tensor, rank: int, world_size: int):
    """Rank ``rank``'s experts: ``(w13[lo:hi] [E/world, 2I, K], w2[lo:hi] [E/world, K, I])``, views.

    Expert ``e`` of the model is local expert ``e - lo`` on rank ``e // (E / world)``.
    """
    check_tensor("w13", w13, 3)
    check_tensor("w2", w2, 3)
    ids = expert_range(rank, w13.shape[0], world_size)
    return w13[ids.start:ids.stop], w2[ids.start:ids.stop]


def intermediate_range(rank: int, inter: int, world_size: int) -> range:
    """The intermediate columns ``[lo, hi)`` rank ``rank`` holds of every expert (tensor parallel)."""
    _check_world(world_size, rank)
    if inter % world_size:
        raise ValueError(f"world size: expected a divisor of the intermediate size I={inter} (each rank holds "
                         f"I / world columns of every expert), got {world_size}")
    per = inter // world_size
    return range(rank * per, (rank + 1) * per)


def shard_intermediate(w13: torch.Tensor, w2: torch.Tensor, rank: int, world_size: int):
    """Rank ``rank``'s columns of every expert: ``(w13 [E, 2I/world, K], w2 [E, K, I/world])``.

    w13 stacks gate rows ``[0, I)`` then up rows ``[I, 2I)``; the shard keeps the gate rows
    ``[lo, hi)`` and the matching up rows ``[I + lo, I + hi)``, so that ``silu(gate) * up`` of
    those columns can be computed on this rank alone. w2's columns ``[lo, hi)`` then take them
    back to the hidden size: a partial ``[M, K]`` that the ranks add up.
    """
    check_tensor("w13", w13, 3)
    check_tensor("w2", w2, 3)
    inter = w2.shape[2]
    cols = intermediate_range(rank, inter, world_size)
    gate, up = w13[:, cols.start:cols.stop], w13[:, inter + cols.start:inter + cols.stop]
    return torch.cat([gate, up], dim=1), w2[:, :, cols.start:cols.stop].contiguous()
