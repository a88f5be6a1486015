"""Dispatch and combine: move each (token, slot) pair's row to the rank holding its expert, and back.

Rank r holds experts ``[r * E/world, (r + 1) * E/world)``, so pair ``(m, j)`` goes to rank
``topk_ids[m, j] // (E / world)``. Dispatch counts the pairs for each rank, exchanges the counts
(every rank learns the whole ``[world, world]`` table), orders the pairs by destination and sends
them with ``all_to_all_single``: one row of x per pair, with its expert id (local to the
receiver) and router weight. Combine sends the experts' outputs back the same way, puts them
back in pair order and sums each token's ``topk`` rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..checks import check_tensor, check_topk_weights
from .groups import check_same_on_all_ranks, gather_rows, require_group
from .sharding import experts_per_rank


@dataclass
class DispatchPlan:
    """What dispatch did, so that combine can undo it.

    ``order`` ``[M * topk]`` int64: the flat pair indices ``m * topk + j`` in the order they were
    sent (grouped by destination rank, token order inside a group). ``counts`` ``[world, world]``
    int64 on the CPU: ``counts[src, dst]`` pairs rank src sent to rank dst, the same table on
    every rank. ``send_counts`` and ``recv_counts`` are this rank's row and column of it.
    """

    order: torch.Tensor
    counts: torch.Tensor
    rank: int
    num_tokens: int
    topk: int

    @property
    def send_counts(self) -> list[int]:
        return self.counts[self.rank].tolist()

    @property
    def recv_counts(self) -> list[int]:
        return self.counts[:, self.rank].tolist()


@dataclass
class Dispatched:
    """The rows a rank received: ``x [R, K]``, ``expert_ids [R]`` int32 (local: 0 is this rank's
    first expert), ``weights [R]`` fp32 router weights, and the plan that combine needs."""

    x: torch.Tensor
    expert_ids: torch.Tensor
    weights: torch.Tensor
    plan: DispatchPlan


def destinations(topk_ids: torch.Tensor, experts_per_rank: int) -> torch.Tensor:
    """``[M * topk]`` int64: the rank of each flat pair's expert, ``topk_ids // (E / world)``."""
    return topk_ids.reshape(-1).long() // experts_per_rank


def send_order(dest: torch.Tensor, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(order, send_counts)``: pair indices grouped by destination rank (a stable sort, so token
    order is kept inside each group), and ``[world]`` int64 pairs for each rank."""
    return torch.argsort(dest, stable=True), torch.bincount(dest, minlength=world_size)


def dispatch(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, *,
             group=None, same_on_all_ranks: dict[str, int] | None = None) -> Dispatched:
    """Send every (token, slot) pair's row of ``x`` to the rank that holds its expert.

    Args:
        x: ``[M, K]`` this rank's tokens (M may differ between ranks, 0 included).
        topk_weights: ``[M, topk]`` float router weights.
        topk_ids: ``[M, topk]`` int32/int64 global expert ids in ``[0, num_experts)``.
        num_experts: E of the model; the world size must divide it.
        group: the process group (None: the default one).
        same_on_all_ranks: extra ``{name: value}`` that must agree on every rank (the layer
            passes its weights' sizes); checked with the counts, in the same collective.

    Returns:
        :class:`Dispatched`: the rows this rank's experts must process, in the order of the
        sending ranks (rank 0's rows first).
    """
    rank, world = require_group(group)
    per = experts_per_rank(num_experts, world)
    check_tensor("x", x, 2)
    check_tensor("topk_ids", topk_ids, 2)
    check_topk_weights(topk_weights, topk_ids)
    if topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"topk_ids: expected {x.shape[0]} rows, one per token of x, got shape {tuple(topk_ids.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_ids: expected dtype torch.int32 or torch.int64, got {topk_ids.dtype}")
    if topk_ids.numel():
        lo, hi = torch.stack(torch.aminmax(topk_ids)).tolist()
        if lo < 0 or hi >= num_experts:
            bad = lo if lo < 0 else hi
            raise ValueError(f"topk_ids: expected expert ids in [0, {num_experts}), got an id of {bad}")
    M, K = x.shape
    topk = topk_ids.shape[1]

    # [count and exchange]
    dest = destinations(topk_ids, per)                         # [M * topk] rank of each pair's expert
    order, send_counts = send_order(dest, world)
    agree = {"x.shape[1] (hidden size K)": K, "topk_ids.shape[1] (topk)": topk, "num_experts": num_experts,
             **(same_on_all_ranks or {})}
    mine = torch.tensor(list(agree.values()), dtype=torch.int64, device=x.device)
    table = gather_rows(torch.cat([mine, send_counts.to(x.device)]), group)   # [world, len(agree) + world]
    check_same_on_all_ranks(table[:, :len(agree)], list(agree))
    counts = table[:, len(agree):]                             # counts[src, dst]
    plan = DispatchPlan(order=order, counts=counts, rank=rank, num_tokens=M, topk=topk)
    send, recv = plan.send_counts, plan.recv_counts

    # [permute by destination]
    rows = x[order // topk]                                    # [M * topk, K]: rank 0's rows, then rank 1's ...
    local_ids = topk_ids.reshape(-1)[order].long() - dest[order] * per
    meta = torch.stack([local_ids.float(), topk_weights.reshape(-1)[order].float()], dim=1)   # ids exact below 2^24

    # [all-to-all]
    recv_x = x.new_empty(sum(recv), K)
    dist.all_to_all_single(recv_x, rows, recv, send, group=group)
    recv_meta = meta.new_empty(sum(recv), 2)
    dist.all_to_all_single(recv_meta, meta, recv, send, group=group)
    return Dispatched(recv_x, recv_meta[:, 0].to(torch.int32), recv_meta[:, 1].contiguous(), plan)


def combine(expert_out: torch.Tensor, plan: DispatchPlan, *, group=None) -> torch.Tensor:
    """Send the experts' outputs back and add up each token's rows: ``[R, K]`` -> ``[M, K]``.

    ``expert_out`` holds one (already router-weighted) row per received pair, in the order
    dispatch delivered them. The all-to-all is dispatch's with the counts transposed: what a
    rank received from rank s goes back to rank s.
    """
    require_group(group)
    check_tensor("expert_out", expert_out, 2)
    received = sum(plan.recv_counts)
    if expert_out.shape[0] != received:
        raise ValueError(f"expert_out: expected {received} rows, one per pair this rank received, "
                         f"got shape {tuple(expert_out.shape)}")
    K = expert_out.shape[1]
    # [send back]
    back = expert_out.new_empty(plan.order.numel(), K)
    dist.all_to_all_single(back, expert_out.contiguous(), plan.send_counts, plan.recv_counts, group=group)
    # [unpermute and sum]
    pairs = torch.empty_like(back)
    pairs[plan.order.to(back.device)] = back                   # row i of back is pair order[i]
    return pairs.view(plan.num_tokens, plan.topk, K).sum(dim=1)
