"""Programs that every rank runs, for notebook 06 and the tests: build the same problem on each
rank, take this rank's share, run a parallel layer, and return what the notebook shows.

They are functions of an importable module because :func:`moe_tutorial.parallel.launch` starts
each rank as a new process that imports them by name.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Sequence

import torch

from .. import runtime
from ..routing import route
from .dispatch import combine, dispatch
from .expert_parallel import expert_parallel_layer, local_experts
from .groups import require_group
from .sharding import shard_experts, shard_intermediate
from .tensor_parallel import tensor_parallel_layer


def make_problem(tokens_per_rank: Sequence[int], num_experts: int, topk: int, hidden: int, inter: int, *,
                 seed: int = 0, experts_used: Sequence[int] | None = None, dtype=torch.float32,
                 device=None) -> SimpleNamespace:
    """One MoE problem, identical on every rank that builds it with the same arguments.

    Args:
        tokens_per_rank: how many tokens each rank owns, e.g. ``(3, 5)``; zeros allowed.
        num_experts, topk, hidden, inter: E, topk, K and I.
        seed: the CPU generator's seed (the values are drawn on the CPU, then moved).
        experts_used: route only to these experts (the others get no pairs), to build uneven
            routings; None routes over all of them.

    Returns:
        A namespace with the whole batch ``x [M, K]``, ``w13 [E, 2I, K]``, ``w2 [E, K, I]``,
        ``topk_weights [M, topk]``, ``topk_ids [M, topk]`` int32, and ``starts``: the first
        token of each rank (rank r owns ``starts[r]:starts[r + 1]``).
    """
    device = runtime.DEVICE if device is None else device
    g = torch.Generator().manual_seed(seed)
    M = sum(tokens_per_rank)
    x = torch.randn(M, hidden, generator=g)
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=g) * hidden ** -0.5
    w2 = torch.randn(num_experts, hidden, inter, generator=g) * inter ** -0.5
    logits = torch.randn(M, num_experts, generator=g)
    if experts_used is not None:
        banned = torch.ones(num_experts, dtype=torch.bool)
        banned[list(experts_used)] = False
        logits[:, banned] = float("-inf")
    topk_weights, topk_ids = route(logits, topk)
    starts = [0]
    for m in tokens_per_rank:
        starts.append(starts[-1] + m)
    move = dict(device=device)
    return SimpleNamespace(x=x.to(dtype=dtype, **move), w13=w13.to(dtype=dtype, **move), w2=w2.to(dtype=dtype, **move),
                           topk_weights=topk_weights.to(**move), topk_ids=topk_ids.to(**move), starts=starts)


def own_tokens(p: SimpleNamespace, rank: int):
    """``(x, topk_weights, topk_ids)`` of the tokens rank ``rank`` owns."""
    lo, hi = p.starts[rank], p.starts[rank + 1]
    return p.x[lo:hi], p.topk_weights[lo:hi], p.topk_ids[lo:hi]


def expert_parallel_demo(problem: dict) -> dict:
    """Run one rank of the expert-parallel layer step by step on ``make_problem(**problem)``.

    Returns this rank's output ``y [M_r, K]`` and what it exchanged: the ``[world, world]``
    count table, the global expert id of each row it sent (in sending order) and the local
    expert id of each row it received.
    """
    rank, world = require_group()
    p = make_problem(**problem)
    x, topk_weights, topk_ids = own_tokens(p, rank)
    w13, w2 = shard_experts(p.w13, p.w2, rank, world)
    d = dispatch(x, topk_weights, topk_ids, problem["num_experts"], method="all_to_all")
    y = combine(local_experts(d, w13, w2), d.plan)
    return {"y": y.cpu(), "counts": d.plan.counts, "sent_ids": topk_ids.reshape(-1)[d.plan.order].cpu(),
            "received_ids": d.expert_ids.reshape(-1).cpu()}


def all_gather_demo(problem: dict, capacity: int | None = None) -> dict:
    """One rank of the fixed-capacity exchange, step by step, on ``make_problem(**problem)``.

    Returns this rank's output ``y [M_r, K]``, the capacity used, the local expert ids of every
    row it received ``[world * capacity, topk]`` (outside ``[0, E/world)``: not this rank's), and
    ``y_all_to_all``, the same tokens through the host-synchronised exchange.
    """
    rank, world = require_group()
    p = make_problem(**problem)
    x, topk_weights, topk_ids = own_tokens(p, rank)
    w13, w2 = shard_experts(p.w13, p.w2, rank, world)
    d = dispatch(x, topk_weights, topk_ids, problem["num_experts"], method="all_gather", capacity=capacity)
    y = combine(local_experts(d, w13, w2), d.plan)
    y_a2a = expert_parallel_layer(x, w13, w2, topk_weights, topk_ids, num_experts=problem["num_experts"],
                                  method="all_to_all")
    return {"y": y.cpu(), "capacity": d.plan.capacity, "received_ids": d.expert_ids.cpu(),
            "y_all_to_all": y_a2a.cpu()}


def tensor_parallel_demo(problem: dict) -> dict:
    """Run one rank of the tensor-parallel layer on the whole batch of ``make_problem(**problem)``."""
    rank, world = require_group()
    p = make_problem(**problem)
    w13, w2 = shard_intermediate(p.w13, p.w2, rank, world)
    return {"y": tensor_parallel_layer(p.x, w13, w2, p.topk_weights, p.topk_ids).cpu(),
            "w13_shape": tuple(w13.shape), "w2_shape": tuple(w2.shape)}
