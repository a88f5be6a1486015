"""Dispatch and combine: move each token's row to the ranks holding its experts, and the results back.

Rank r holds experts ``[r * E/world, (r + 1) * E/world)``. Two exchanges, one API
(:func:`dispatch` with ``method=``, then :func:`combine`):

* ``method="all_gather"`` (the default), fixed capacity and no host synchronisation. Every rank
  pads its tokens to the same ``capacity`` C (at least every rank's M) and one
  ``all_gather_into_tensor`` gives every rank every token, *once*, with its topk global expert
  ids and router weights packed in the same row. The receiver makes the ids local: ids of
  experts on other ranks fall outside ``[0, E/world)``, which the kernels' alignment drops, and
  padding rows carry id -1. Since a rank receives each token at most once, C rows per source
  rank hold everything: no token is ever dropped (:func:`dispatch` refuses a capacity smaller
  than a rank's M). Combine: each rank sums its own experts' outputs per received token, and
  one ``reduce_scatter_tensor`` (sum) hands each token's full sum back to its owner. Every
  shape is known on the host before a byte moves, so the whole layer fits in a CUDA graph.
* ``method="all_to_all"``, variable splits: each (token, slot) pair's row goes to its expert's
  rank with ``all_to_all_single``. Dispatch counts the pairs for each rank and exchanges the
  counts; the host must read them to size the buffers, so it waits for the GPU, and the
  exchange cannot be captured in a graph. It sends only the pairs that leave (``topk`` rows per
  token), and is the exchange notebook 06 builds by hand and the committed two-H200 data measured.

Bytes per rank, each way: all_gather sends ``(world - 1) * C`` rows of K values, all_to_all
``M * topk * (world - 1) / world`` on average. The all-gather moves no more while world <= topk
(two GPUs: Mixtral-8x7B M rows against M, DeepSeek-V3 M against 4 M); on more GPUs than topk a
de-duplicated all-to-all (each token once to each rank that holds one of its experts) moves less.

Both run on gloo as on NCCL: gloo implements ``all_gather_into_tensor`` and
``reduce_scatter_tensor`` (checked with torch 2.13's CPU build), so a laptop runs the very code a
GPU does. Why plain collectives first, not the other options: torch's symmetric memory
(``torch.distributed._symmetric_memory``, device-side splits) and a Triton kernel that writes rows
straight into a peer's buffer both need symmetric allocations that gloo has no equivalent of, so
the CPU path would be another program; a fixed-capacity all-gather captures in a CUDA graph with
stock NCCL, needs no new kernel, and at ``world <= topk`` sends no more bytes. Whether a
device-split exchange beats it is a question for the two-GPU data: the bench times two
``all_to_all_single`` calls of the same bytes beside it (``exchange_bench``).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..checks import capturing, check_ids_in_range, check_tensor, check_topk_weights
from .groups import check_same_on_all_ranks, gather_rows, require_group
from .sharding import experts_per_rank

#: The exchanges :func:`dispatch` knows (see the module docstring).
METHODS = ("all_gather", "all_to_all")


@dataclass
class DispatchPlan:
    """What the all-to-all dispatch did, so that combine can undo it.

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
    method = "all_to_all"

    @property
    def send_counts(self) -> list[int]:
        return self.counts[self.rank].tolist()

    @property
    def recv_counts(self) -> list[int]:
        return self.counts[:, self.rank].tolist()

    @property
    def received(self) -> int:
        return sum(self.recv_counts)


@dataclass
class GatherPlan:
    """What the fixed-capacity dispatch did: plain numbers, known on the host before any exchange.

    Every rank sent ``capacity`` rows (its ``num_tokens`` tokens, then padding); received row
    ``s * capacity + i`` is token i of rank s.
    """

    rank: int
    world: int
    capacity: int
    num_tokens: int
    method = "all_gather"

    @property
    def received(self) -> int:
        return self.world * self.capacity


@dataclass
class Dispatched:
    """The rows a rank received and what its experts need to process them.

    ``x [R, K]``; ``expert_ids [R, slots]`` int32, *local* ids (0 is this rank's first expert;
    an id outside ``[0, E/world)`` is a slot for another rank's expert, or padding, and must be
    skipped); ``weights [R, slots]`` fp32 router weights; ``plan`` for combine. With
    ``all_to_all`` a row is one (token, slot) pair (``slots = 1``, every id local); with
    ``all_gather`` a row is one token of some rank (``slots = topk``, ``R = world * capacity``).
    """

    x: torch.Tensor
    expert_ids: torch.Tensor
    weights: torch.Tensor
    plan: DispatchPlan | GatherPlan


def destinations(topk_ids: torch.Tensor, experts_per_rank: int) -> torch.Tensor:
    """``[M * topk]`` int64: the rank of each flat pair's expert, ``topk_ids // (E / world)``."""
    return topk_ids.reshape(-1).long() // experts_per_rank


def send_order(dest: torch.Tensor, world_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(order, send_counts)``: pair indices grouped by destination rank (a stable sort, so token
    order is kept inside each group), and ``[world]`` int64 pairs for each rank."""
    return torch.argsort(dest, stable=True), torch.bincount(dest, minlength=world_size)


def dispatch(x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, num_experts: int, *,
             method: str = "all_gather", capacity: int | None = None, group=None,
             same_on_all_ranks: dict[str, int] | None = None, check_ranks: bool = True) -> Dispatched:
    """Send this rank's tokens to the ranks that hold their experts.

    Args:
        x: ``[M, K]`` this rank's tokens (M may differ between ranks, 0 included).
        topk_weights: ``[M, topk]`` float router weights.
        topk_ids: ``[M, topk]`` int32/int64 global expert ids in ``[0, num_experts)``.
        num_experts: E of the model; the world size must divide it.
        method: ``"all_gather"`` (fixed capacity, no host synchronisation, graph-capturable) or
            ``"all_to_all"`` (variable splits; the host reads the counts). See the module docstring.
        capacity: all_gather only: rows every rank sends, the same on every rank and at least
            every rank's M. None: the largest M of any rank, learnt in the check collective
            (so it needs ``check_ranks``).
        group: the process group (None: the default one).
        same_on_all_ranks: extra ``{name: value}`` that must agree on every rank (the layer
            passes its weights' sizes); checked with the shapes, in the same collective.
        check_ranks: gather every rank's sizes (and check this rank's ids are in range) before
            exchanging: one small collective whose result the host reads, i.e. one host
            synchronisation. Skipped while a CUDA graph is captured. all_to_all always
            exchanges its counts, so it always checks.

    Returns:
        :class:`Dispatched`: the rows this rank's experts must process, in the order of the
        sending ranks (rank 0's rows first).

    Raises:
        ValueError: shapes that differ between ranks (the same message on every rank), ids out
        of range, or a capacity smaller than some rank's M (that would drop tokens).
    """
    rank, world = require_group(group)
    if method not in METHODS:
        raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
    per = experts_per_rank(num_experts, world)
    check_tensor("x", x, 2)
    check_tensor("topk_ids", topk_ids, 2)
    check_topk_weights(topk_weights, topk_ids)
    if topk_ids.shape[0] != x.shape[0]:
        raise ValueError(f"topk_ids: expected {x.shape[0]} rows, one per token of x, got shape {tuple(topk_ids.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_ids: expected dtype torch.int32 or torch.int64, got {topk_ids.dtype}")
    M, K = x.shape
    topk = topk_ids.shape[1]
    agree = {"x.shape[1] (hidden size K)": K, "topk_ids.shape[1] (topk)": topk, "num_experts": num_experts,
             **(same_on_all_ranks or {})}
    if method == "all_to_all":
        check_ids_in_range(topk_ids, num_experts)
        return dispatch_all_to_all(x, topk_weights, topk_ids, per, rank, world, agree, group)
    if capacity is not None and (isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 0):
        raise ValueError(f"capacity: expected a non-negative int, got {capacity!r}")
    if check_ranks and not capturing(x):
        check_ids_in_range(topk_ids, num_experts)
        capacity = _checked_capacity(M, capacity, agree, x.device, group)
    elif capacity is None:
        raise ValueError("capacity: expected an int (the rows every rank sends) when the ranks are not checked "
                         "(check_ranks=False, or a CUDA graph being captured), got None")
    if M > capacity:
        # The no-drop guarantee: a rank sends each of its tokens once, so capacity >= M is all it needs.
        raise ValueError(f"capacity: expected at least this rank's {M} tokens (a token beyond it would be dropped), "
                         f"got {capacity}")
    return dispatch_all_gather(x, topk_weights, topk_ids, per, rank, world, capacity, group)


def _checked_capacity(M: int, capacity: int | None, agree: dict, device, group) -> int:
    """Gather every rank's sizes, M and capacity in one collective; raise the same error on every
    rank where they disagree; return the capacity (the largest M when None was given)."""
    mine = torch.tensor([*agree.values(), M, -1 if capacity is None else capacity], dtype=torch.int64, device=device)
    table = gather_rows(mine, group)                           # [world, len(agree) + 2], read on the host
    check_same_on_all_ranks(table[:, :len(agree)], list(agree))
    ms, caps = table[:, len(agree)].tolist(), table[:, len(agree) + 1].tolist()
    if len(set(caps)) > 1:
        by_rank = ", ".join(f"{'None' if c < 0 else c} on rank {r}" for r, c in enumerate(caps))
        raise ValueError(f"capacity: expected the same value on every rank, got {by_rank}")
    largest = max(ms)
    if capacity is not None and capacity < largest:
        raise ValueError(f"capacity: expected at least every rank's number of tokens (rank {ms.index(largest)} "
                         f"has {largest}; a token beyond the capacity would be dropped), got {capacity}")
    return largest if capacity is None else capacity


def packed_layout(hidden: int, topk: int, dtype: torch.dtype) -> tuple[int, int, int]:
    """``(x_bytes, meta_offset, row_bytes)`` of one packed row: x's K values, then topk int32 ids
    and topk fp32 weights at a 4-byte boundary, the row padded to 64 bytes.

    Each part can then be viewed in its own dtype, and the row stride of the x view is a multiple
    of 16 elements (for 2- and 4-byte dtypes), which Triton needs to know to load A's rows with
    wide vector loads in the experts' first GEMM.
    """
    x_bytes = hidden * torch.empty(0, dtype=dtype).element_size()
    meta = -(-x_bytes // 4) * 4
    return x_bytes, meta, -(-(meta + 8 * topk) // 64) * 64


def _views(buf: torch.Tensor, hidden: int, topk: int, dtype: torch.dtype):
    """``(x [rows, K], ids [rows, topk] int32, weights [rows, topk] fp32)``: views into packed rows."""
    x_bytes, meta, _ = packed_layout(hidden, topk, dtype)
    return (buf[:, :x_bytes].view(dtype), buf[:, meta:meta + 4 * topk].view(torch.int32),
            buf[:, meta + 4 * topk:meta + 8 * topk].view(torch.float32))


def dispatch_all_gather(x, topk_weights, topk_ids, per: int, rank: int, world: int, capacity: int,
                         group) -> Dispatched:
    """Pack, all-gather, make the ids local. No device value is read: every shape is a host int."""
    M, K = x.shape
    topk = topk_ids.shape[1]
    # [pack the rows]
    send = torch.empty(capacity, packed_layout(K, topk, x.dtype)[2], dtype=torch.uint8, device=x.device)
    sx, sids, sw = _views(send, K, topk, x.dtype)
    sx[:M].copy_(x)
    sids[:M].copy_(topk_ids)                                   # global ids, int32
    sw[:M].copy_(topk_weights)
    if M < capacity:                                           # padding: no expert anywhere, zero rows
        sx[M:].zero_()
        sids[M:].fill_(-1)
        sw[M:].zero_()
    # [all-gather]
    recv = send.new_empty(world * capacity, send.shape[1])
    if capacity:                                               # the same on every rank: all skip together
        dist.all_gather_into_tensor(recv, send, group=group)
    # [make the ids local]
    rx, rids, rw = _views(recv, K, topk, x.dtype)
    local = rids - rank * per          # another rank's expert lands outside [0, per), padding's -1 below 0
    plan = GatherPlan(rank=rank, world=world, capacity=capacity, num_tokens=M)
    return Dispatched(rx, local, rw, plan)


def dispatch_all_to_all(x, topk_weights, topk_ids, per: int, rank: int, world: int, agree: dict,
                         group) -> Dispatched:
    """Count, exchange the counts (the host reads them), permute by destination, all-to-all."""
    M, K = x.shape
    topk = topk_ids.shape[1]
    # [count and exchange]
    dest = destinations(topk_ids, per)                         # [M * topk] rank of each pair's expert
    order, send_counts = send_order(dest, world)
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
    return Dispatched(recv_x, recv_meta[:, :1].to(torch.int32), recv_meta[:, 1:].contiguous(), plan)


def combine(expert_out: torch.Tensor, plan: DispatchPlan | GatherPlan, *, group=None) -> torch.Tensor:
    """Send the experts' outputs back and add up each token's rows: ``[R, K]`` -> ``[M, K]``.

    ``expert_out`` holds one row per row dispatch delivered, in its order: with ``all_to_all``
    one router-weighted row per pair, sent back with dispatch's counts transposed and summed over
    each token's topk rows; with ``all_gather`` each received token's sum over *this rank's*
    experts (zeros where it has none), reduce-scattered: rank s gets rows
    ``[s * capacity, (s + 1) * capacity)`` summed over all ranks, and keeps its first M.
    """
    require_group(group)
    check_tensor("expert_out", expert_out, 2)
    if expert_out.shape[0] != plan.received:
        raise ValueError(f"expert_out: expected {plan.received} rows, one per row this rank received, "
                         f"got shape {tuple(expert_out.shape)}")
    if plan.method == "all_gather":
        return combine_reduce_scatter(expert_out, plan, group)
    K = expert_out.shape[1]
    # [send back]
    back = expert_out.new_empty(plan.order.numel(), K)
    dist.all_to_all_single(back, expert_out.contiguous(), plan.send_counts, plan.recv_counts, group=group)
    # [unpermute and sum]
    pairs = torch.empty_like(back)
    pairs[plan.order.to(back.device)] = back                   # row i of back is pair order[i]
    return pairs.view(plan.num_tokens, plan.topk, K).sum(dim=1)


def combine_reduce_scatter(expert_out: torch.Tensor, plan: GatherPlan, group) -> torch.Tensor:
    """One reduce-scatter (sum): each rank's partial sums of every token, added, back to its owner."""
    out = expert_out.new_empty(plan.capacity, expert_out.shape[1])
    if plan.capacity:
        dist.reduce_scatter_tensor(out, expert_out.contiguous(), op=dist.ReduceOp.SUM, group=group)
    return out[:plan.num_tokens]
