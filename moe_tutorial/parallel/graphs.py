"""The expert-parallel layer captured once in a CUDA graph and replayed with new routings.

A CUDA graph records the GPU work of one call, kernels and NCCL collectives alike, with every
address and size fixed; a replay re-runs it with no Python, no launches and no host waits. That
holds only for a call that reads no device value on the host (an ``.item()``, a ``.tolist()``, a
size taken from the data) and whose shapes are the same each time: the fixed-capacity exchange
(``method="all_gather"`` with ``check_ranks=False`` and a ``capacity``). New tokens and routings
go in by copying them into the graph's own input tensors before each replay.

On the CPU (gloo) there is no graph: :class:`StaticLayer` then calls the layer on its static
inputs, so the same protocol (fixed buffers, copies in, the same output tensor each time) runs
in the CPU tests too. :func:`graph_replay_rank` is the check that the GPU tests and
``measurements/scripts/h200_ep_graphs.py`` run on each rank.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from ..kernels.sorted_layer import sorted_moe_layer
from ..reference import rel_error, tolerance
from .demos import make_problem, own_tokens
from .expert_parallel import expert_parallel_layer
from .groups import require_group
from .sharding import shard_experts


class StaticLayer:
    """``fn(x, topk_weights, topk_ids) -> y`` on fixed input tensors, captured in a CUDA graph on a GPU.

    Args:
        fn: the layer on this rank's tokens; it must read no device value on the host and give
            the same shapes for inputs of the same shapes (on a GPU it is captured once).
        x, topk_weights, topk_ids: example inputs ``[M, K]``, ``[M, topk]``, ``[M, topk]``; their
            shapes, dtypes and devices are the graph's for good (the values are copied).
        warmup: eager calls before the capture: Triton compiles its kernels, the caching
            allocator and NCCL set themselves up, none of which a capture may do.

    ``layer(x, topk_weights, topk_ids)`` copies the inputs in, replays, and returns the graph's
    output tensor (the same tensor every call: copy it to keep a result past the next call).
    """

    def __init__(self, fn: Callable, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor, *,
                 warmup: int = 2):
        self.fn = fn
        self.inputs = (x.clone(), topk_weights.clone(), topk_ids.clone())
        self.graph = None
        if not x.is_cuda:
            return
        # Warm-up on a side stream, as torch.cuda.graph's documentation asks, then capture.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn(*self.inputs)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = fn(*self.inputs)
        torch.cuda.synchronize()

    def __call__(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        for static, new in zip(self.inputs, (x, topk_weights, topk_ids)):
            if static.shape != new.shape:
                raise ValueError(f"inputs: expected the captured shape {tuple(static.shape)}, got {tuple(new.shape)}")
            static.copy_(new)
        if self.graph is None:
            return self.fn(*self.inputs)
        self.graph.replay()
        return self.out


def ep_layer_fn(w13: torch.Tensor, w2: torch.Tensor, num_experts: int, capacity: int, group=None) -> Callable:
    """The graph-capturable expert-parallel layer on this rank's experts: all_gather, no checks."""
    def layer(x, topk_weights, topk_ids):
        return expert_parallel_layer(x, w13, w2, topk_weights, topk_ids, num_experts=num_experts, group=group,
                                     method="all_gather", capacity=capacity, check_ranks=False)
    return layer


#: Routings replayed through one captured graph: ``(name, experts_used)``; None routes over all
#: experts, "first rank" only to rank 0's experts (the other ranks receive nothing), "no expert 1"
#: leaves expert 1 without a token.
ROUTINGS = (("random", None), ("random, new seed", None), ("only rank 0's experts", "first rank"),
            ("expert 1 gets no token", "no expert 1"), ("random, third seed", None))


def graph_replay_rank(tokens_per_rank: Sequence[int], num_experts: int, topk: int, hidden: int, inter: int,
                      dtype_name: str = "bfloat16", routings=ROUTINGS, seed: int = 0) -> list[dict]:
    """On every rank: capture the layer once, replay it with each routing of ``routings``, and
    compare each replay with the single-process layer (Part 4's, on all ranks' tokens).

    The weights are those of the first routing's problem; each routing brings new tokens and
    router choices, copied into the graph's inputs. Each rank keeps its own M (uneven allowed),
    the capacity is the largest. Returns one dict per routing: ``case``, ``rel_error`` of the
    replay and of the eager ``all_gather`` and ``all_to_all`` layers, ``tol`` and ``ok``.
    """
    rank, world = require_group()
    dtype = getattr(torch, dtype_name)
    first = make_problem(tokens_per_rank, num_experts, topk, hidden, inter, seed=seed, dtype=dtype)
    w13, w2 = shard_experts(first.w13, first.w2, rank, world)
    capacity = max(tokens_per_rank)
    layer = StaticLayer(ep_layer_fn(w13, w2, num_experts, capacity), *own_tokens(first, rank))
    per = num_experts // world
    out = []
    for i, (case, used) in enumerate(routings):
        experts_used = {None: None, "first rank": list(range(per)),
                        "no expert 1": [e for e in range(num_experts) if e != 1]}[used]
        p = make_problem(tokens_per_rank, num_experts, topk, hidden, inter, seed=seed + 1 + i, dtype=dtype,
                         experts_used=experts_used)
        x, tw, ti = own_tokens(p, rank)
        lo, hi = p.starts[rank], p.starts[rank + 1]
        ref = sorted_moe_layer(p.x, first.w13, first.w2, p.topk_weights, p.topk_ids)[lo:hi]
        replayed = layer(x, tw, ti).clone()
        eager = {m: expert_parallel_layer(x, w13, w2, tw, ti, num_experts=num_experts, method=m)
                 for m in ("all_gather", "all_to_all")}
        errs = {"graph": _err(replayed, ref), **{m: _err(y, ref) for m, y in eager.items()}}
        tol = tolerance(dtype)
        out.append({"case": case, "rank": rank, "M": hi - lo, "capacity": capacity, "graphed": layer.graph is not None,
                    **{f"rel_error_{k}": v for k, v in errs.items()}, "tol": tol,
                    "ok": all(v <= tol for v in errs.values())})
    return out


def _err(y: torch.Tensor, ref: torch.Tensor) -> float:
    if y.shape != ref.shape:
        return float("inf")
    return rel_error(y, ref) if ref.numel() else 0.0


def graph_replay_shapes_rank(shapes: Sequence, tokens_per_rank: Sequence[int], dtype_name: str = "bfloat16",
                             routings=ROUTINGS) -> list[dict]:
    """:func:`graph_replay_rank` for each :class:`moe_tutorial.shapes.ModelShape` of ``shapes`` in
    one launch (one process start and one NCCL set-up for all); each row also names its ``model``."""
    rows = []
    for s in shapes:
        rows += [dict(r, model=s.name) for r in graph_replay_rank(tokens_per_rank, s.num_experts, s.topk, s.hidden,
                                                                 s.intermediate, dtype_name, routings)]
    return rows
