"""Timing the two exchanges on N GPUs (one included): the host-synchronised all-to-all against the
fixed-capacity all-gather, each beside two plain ``all_to_all_single`` calls of the same bytes.

The rank program :func:`timing_rank` runs under :func:`moe_tutorial.parallel.launch.launch` with
``backend="nccl"`` (``measurements/scripts/h200_ep_graphs.py`` drives it), or on CPU processes
with gloo (the tests run it on a tiny shape). For each model and M (tokens per rank) it times,
as rows of the CSV (columns :data:`FIELDS`; ``method`` says which exchange a row belongs to):

* ``dispatch``, ``experts``, ``combine``, ``dispatch_combine`` (dispatch, then combine of the
  received rows, no experts) and ``ep_layer``, for ``method`` ``all_to_all`` and ``all_gather``;
* ``a2a_x2_same_bytes``: two ``all_to_all_single`` calls moving what that method's dispatch and
  combine move over the link (the reference the targets name);
* ``tp_layer`` (tensor parallel) and ``single_gpu`` (one GPU running all ranks' tokens);
* ``check_graph_replay``: the all_gather layer captured with one routing, replayed with another,
  against Part 4's layer on all tokens (``rel_error``).

Timing protocol (each row names its own, :data:`GRAPH_PROTOCOL` or :data:`EAGER_PROTOCOL`): on a
GPU a call that reads no device value is captured in a CUDA graph (after warm-up calls) and the
graph replayed; a call that waits on the host (the all_to_all dispatch) runs eagerly. Before
each repetition: 256 MB read (L2 flushed, left clean), a device synchronise and a barrier over a gloo group
(so no NCCL call runs between replays); CUDA events around the replay or call only. A
repetition's time is the slowest rank's; the row's, the median of the repetitions. On the CPU,
``time.perf_counter`` and no graph. Rank 0 appends each row to the CSV as soon as it is measured.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
import torch.distributed as dist

from ..kernels.sorted_layer import sorted_moe_layer
from ..perf.timing import flush_l2
from ..reference import rel_error, tolerance
from ..shapes import BATCH_SIZES
from . import bench
from .bench import (
    all_ranks_ok,
    as_shape,
    empty_cache,
    in_time,
    last_error_line,
    machine_columns,
    make_batch,
    make_weights,
)
from .dispatch import combine, dispatch, packed_layout
from .expert_parallel import expert_parallel_layer, local_experts
from .graphs import StaticLayer, ep_layer_fn
from .groups import require_group
from .sharding import shard_experts, shard_intermediate
from .tensor_parallel import tensor_parallel_layer

REPS, REPS_LARGE, LARGE_M, WARMUP = 20, 6, 4096, 2
_COMMON = (f"L2 flushed (256 MB read), synchronize + gloo barrier before each repetition; events around it; "
           f"{WARMUP} warm-up calls; median of {REPS} ({REPS_LARGE} from M = {LARGE_M}); a repetition's time is "
           "the slowest rank's")
GRAPH_PROTOCOL = "cuda graph of one call, replayed; " + _COMMON
EAGER_PROTOCOL = "eager call (it waits on the host); " + _COMMON
CPU_PROTOCOL = "cpu: perf_counter around each call, no graph; median"

FIELDS = ["gpu", "driver", "torch", "triton", "nccl", "date", "world", "protocol", "model", "E", "K", "I", "topk",
          "dtype", "M", "capacity", "method", "step", "ms", "bytes", "gbps", "rel_error", "status"]
METHOD_STEPS = ("dispatch", "experts", "combine", "dispatch_combine", "ep_layer", "a2a_x2_same_bytes")
OTHER_STEPS = ("tp_layer", "single_gpu", "check_graph_replay")


def host_group():
    """A gloo group of the same ranks, for barriers and the timings' max; None if gloo cannot start
    here (the default group then does that work, and the protocol says so)."""
    if dist.get_backend() == "gloo":
        return None                              # the default group is gloo already
    try:
        return dist.new_group(backend="gloo")
    except Exception:  # noqa: BLE001  (e.g. no network interface gloo can use)
        return None


class Timer:
    """Times calls by :data:`GRAPH_PROTOCOL` or :data:`EAGER_PROTOCOL` (``time.perf_counter`` on the CPU)."""

    def __init__(self, host_group, reps: int = REPS, warmup: int = WARMUP):
        # Host-side barriers and the max over ranks go through ``host_group``, a gloo group, so
        # that between two replays of a graph holding NCCL collectives no other NCCL call runs
        # (None: the default group).
        self.host, self.reps, self.warmup = host_group, reps, warmup
        self.on_gpu = torch.cuda.is_available()
        self.nccl_barrier = self.on_gpu and host_group is None

    def __call__(self, fn: Callable, graph: bool = True) -> tuple[float, str]:
        """``(median ms, protocol)``: ``graph=False`` for a call that waits on the host; a graph
        that fails to capture falls back to eager calls, and the protocol says so."""
        protocol = GRAPH_PROTOCOL if graph else EAGER_PROTOCOL
        run, g = fn, None
        if not self.on_gpu:
            protocol = CPU_PROTOCOL
            for _ in range(self.warmup):
                fn()
        elif graph:
            try:
                g, why = _capture(fn, self.warmup), ""
            except Exception:  # noqa: BLE001  (reported in the row's protocol)
                torch.cuda.synchronize()
                g, why = None, last_error_line()[:80]
            # A graph holding a collective must be replayed on every rank or on none (NCCL's rule).
            if self._everywhere(g is not None):
                run = g.replay
            else:
                g, run = None, fn
                protocol = f"eager (graph capture failed: {why or 'on another rank'}); " + _COMMON
        else:
            for _ in range(self.warmup):
                fn()
        times = [self._once(run) for _ in range(self.reps)]
        del g
        slowest = torch.tensor(times, dtype=torch.float64, device="cuda" if self.nccl_barrier else "cpu")
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=self.host)
        if self.nccl_barrier:
            protocol = protocol.replace("gloo barrier", "NCCL barrier")
        return statistics.median(slowest.tolist()), protocol

    def _everywhere(self, ok: bool) -> bool:
        flag = torch.tensor([int(ok)], device="cuda" if self.nccl_barrier else "cpu")
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.host)
        return bool(flag.item())

    def _once(self, run: Callable) -> float:
        if not self.on_gpu:
            dist.barrier(group=self.host)
            t0 = time.perf_counter()
            run()
            return 1e3 * (time.perf_counter() - t0)
        flush_l2("read")                        # as the cold-l2 protocol: L2 left holding clean lines
        torch.cuda.synchronize()
        dist.barrier(group=self.host)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)


def _capture(fn: Callable, warmup: int) -> torch.cuda.CUDAGraph:
    """Warm ``fn`` up on a side stream, then capture one call."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g


def _emit(csv_path, rank: int, row: dict) -> dict:
    """:func:`moe_tutorial.parallel.bench._emit` with this bench's columns."""
    return bench._emit(csv_path, rank, row, FIELDS, (("method", 10), ("step", 18)))


def timing_rank(model, csv_path: str | None, deadline: float, batch_sizes=BATCH_SIZES, num_experts: int | None = None,
                dtype=torch.bfloat16, reps: int | None = None) -> list[dict]:
    """On every rank: every step of :data:`METHOD_STEPS` for both methods, and :data:`OTHER_STEPS`,
    at each M of ``batch_sizes`` (tokens per rank), until ``deadline`` (``time.time()``).

    A failing step is recorded with its error and the ranks carry on together (they agree on
    each case's outcome before the next collective). Returns the rows; rank 0 also appends them
    to ``csv_path``. ``reps`` overrides the repetitions (the CPU tests use 1).
    """
    rank, world = require_group()
    shape = as_shape(model)
    E = num_experts or shape.num_experts
    cols = {**machine_columns(world, protocol=""), "model": shape.name, "E": E, "K": shape.hidden,
            "I": shape.intermediate, "topk": shape.topk, "dtype": str(dtype).replace("torch.", "")}
    rows: list[dict] = []
    try:
        w13, w2 = make_weights(shape, E, dtype)
        ep, tp = shard_experts(w13, w2, rank, world), shard_intermediate(w13, w2, rank, world)
        ok, err = True, ""
    except Exception:  # noqa: BLE001  (out of memory: recorded, and the ranks stop together)
        ok, err = False, last_error_line()
    if not all_ranks_ok(ok):
        return [_emit(csv_path, rank, {**cols, "step": "ep_layer", "status": f"error: {err or 'another rank'}"})]
    host = host_group()
    for M in batch_sizes:
        timer = Timer(host, reps or (REPS if M < LARGE_M else REPS_LARGE))
        cases = _cases(M, shape, E, dtype, rank, world, (w13, w2), ep, tp)
        while True:
            try:
                method, step, fn, graph, nbytes, check = next(cases)
                ok, err = True, ""
            except StopIteration:
                break
            except Exception:  # noqa: BLE001  (building a step's inputs failed, e.g. out of memory)
                ok, err = False, last_error_line()
            if not all_ranks_ok(ok):
                rows.append(_emit(csv_path, rank, {**cols, "M": M, "step": "setup",
                                                   "status": f"error: {err or 'another rank'}"}))
                break
            row = {**cols, "M": M, "capacity": M, "method": method, "step": step}
            if not in_time(deadline):
                rows.append(_emit(csv_path, rank, {**row, "status": "skipped: time budget"}))
                continue
            ms, rel, status, protocol = float("nan"), "", "ok", ""
            try:
                if check is not None:
                    rel = check()
                    status = "ok" if rel <= tolerance(dtype) else "wrong"
                    protocol = "graph replayed with a routing other than the captured one" \
                        if torch.cuda.is_available() else "static inputs, no graph (cpu)"
                else:
                    ms, protocol = timer(fn, graph)
            except Exception:  # noqa: BLE001
                status = "error: " + last_error_line()
            if not all_ranks_ok(status in ("ok", "wrong")) and status in ("ok", "wrong"):
                status = "another rank failed"
            gbps = nbytes / (ms * 1e6) if nbytes and ms == ms else ""
            rows.append(_emit(csv_path, rank, {**row, "protocol": protocol, "ms": "" if ms != ms else ms,
                                               "bytes": int(nbytes), "gbps": gbps, "rel_error": rel,
                                               "status": status}))
        empty_cache()
    return rows


def _cases(M: int, shape, E: int, dtype, rank: int, world: int, full, ep, tp):
    """``(method, step, call, graphable, bytes one rank sends to others, check or None)`` for one M.

    Built lazily, one step at a time: a step that fails to build stops this M only.
    """
    K, topk = shape.hidden, shape.topk
    itemsize = torch.empty(0, dtype=dtype).element_size()
    x, tw, ti, starts = make_batch([M] * world, E, topk, K, dtype, seed=M)
    lo, hi = starts[rank], starts[rank + 1]
    xr, twr, tir = x[lo:hi].clone(), tw[lo:hi].clone(), ti[lo:hi].clone()
    row_bytes = packed_layout(K, topk, dtype)[2]
    new = dict(method="all_gather", capacity=M, check_ranks=False)

    # The fixed-capacity exchange: every call graph-capturable.
    d = dispatch(xr, twr, tir, E, **new)
    out = local_experts(d, *ep)
    sent = (world - 1) * M                                   # rows each rank sends to the others, each way
    yield "all_gather", "dispatch", lambda: dispatch(xr, twr, tir, E, **new), True, sent * row_bytes, None
    yield "all_gather", "experts", lambda: local_experts(d, *ep), True, 0, None
    yield "all_gather", "combine", lambda: combine(out, d.plan), True, sent * K * itemsize, None

    def new_exchange():
        dd = dispatch(xr, twr, tir, E, **new)
        return combine(dd.x, dd.plan)

    yield "all_gather", "dispatch_combine", new_exchange, True, sent * (row_bytes + K * itemsize), None
    layer = ep_layer_fn(*ep, E, M)
    yield "all_gather", "ep_layer", lambda: layer(xr, twr, tir), True, sent * (row_bytes + K * itemsize), None

    def replay_check() -> float:
        """Capture with this M's routing, replay with another's, compare with one GPU's layer."""
        graphed = StaticLayer(layer, xr, twr, tir)
        x2, tw2, ti2, _ = make_batch([M] * world, E, topk, K, dtype, seed=M + 7919)
        y = graphed(x2[lo:hi], tw2[lo:hi], ti2[lo:hi]).clone()
        del graphed
        return rel_error(y, sorted_moe_layer(x2, *full, tw2, ti2)[lo:hi])

    yield "all_gather", "check_graph_replay", None, False, 0, replay_check
    send1 = torch.empty(world * M * row_bytes, dtype=torch.uint8, device=x.device)
    recv1, send2 = torch.empty_like(send1), torch.empty(world * M, K, dtype=dtype, device=x.device)
    recv2 = torch.empty_like(send2)

    def two_equal_a2a():
        dist.all_to_all_single(recv1, send1)
        dist.all_to_all_single(recv2, send2)

    yield "all_gather", "a2a_x2_same_bytes", two_equal_a2a, True, sent * (row_bytes + K * itemsize), None

    # The host-synchronised exchange: dispatch reads its counts on the host, so it runs eagerly.
    old = dict(method="all_to_all")
    d = dispatch(xr, twr, tir, E, **old)
    out = local_experts(d, *ep)
    counts = d.plan.counts
    remote = int(counts[rank].sum() - counts[rank, rank])    # this rank's pairs that leave it
    yield "all_to_all", "dispatch", lambda: dispatch(xr, twr, tir, E, **old), False, remote * (K * itemsize + 8), None
    yield "all_to_all", "experts", lambda: local_experts(d, *ep), True, 0, None
    yield "all_to_all", "combine", lambda: combine(out, d.plan), True, remote * K * itemsize, None

    def old_exchange():
        dd = dispatch(xr, twr, tir, E, **old)
        return combine(dd.x, dd.plan)

    yield "all_to_all", "dispatch_combine", old_exchange, False, remote * (2 * K * itemsize + 8), None
    yield ("all_to_all", "ep_layer", lambda: expert_parallel_layer(xr, *ep, twr, tir, num_experts=E, **old), False,
           remote * (2 * K * itemsize + 8), None)
    send, recv = d.plan.send_counts, d.plan.recv_counts
    rows_out = torch.empty(sum(send), K * itemsize + 8, dtype=torch.uint8, device=x.device)
    rows_in = rows_out.new_empty(sum(recv), K * itemsize + 8)
    back_out, back_in = torch.empty(sum(recv), K, dtype=dtype, device=x.device), torch.empty(sum(send), K, dtype=dtype,
                                                                                             device=x.device)

    def two_split_a2a():                                     # the same splits, known in advance
        dist.all_to_all_single(rows_in, rows_out, recv, send)
        dist.all_to_all_single(back_in, back_out, send, recv)

    yield "all_to_all", "a2a_x2_same_bytes", two_split_a2a, True, remote * (2 * K * itemsize + 8), None

    # The alternatives: tensor parallel, and one GPU holding every expert with all ranks' tokens.
    yield ("", "tp_layer", lambda: tensor_parallel_layer(x, *tp, tw, ti, check_ranks=False), True,
           2 * (world - 1) / world * x.numel() * itemsize, None)
    yield "", "single_gpu", lambda: sorted_moe_layer(x, *full, tw, ti), True, 0, None
