"""Measuring the parallel layers: correctness against one device, then timings.

The rank programs here run under :func:`moe_tutorial.parallel.launch.launch`, on GPUs with
``backend="nccl"`` (``measurements/scripts/h200x2_ep.py`` drives them on two H200s) or on CPU processes with
gloo (the tests run the same code on tiny shapes). Rank 0 appends each result to a CSV as soon as
it has it, so a case that fails, or a run that is stopped, keeps everything measured before it.
Before each case the ranks agree (one all-reduce) on whether to run it, so they never part ways
in the middle of a collective.

Timing protocol (:data:`PROTOCOL`): every repetition starts with a device synchronize and a
barrier, so all ranks enter together; CUDA events on each rank bracket the call (a CPU clock
without a GPU); a repetition's time is the slowest rank's (an all-reduce of MAX), and a case's
time the median of its repetitions after the warm-up ones. The timed exchange is the
host-synchronised one (``method="all_to_all"``): its dispatch reads the counts on the host, which a
CUDA graph cannot capture, so nothing here uses graphs. The correctness checks run the layer's
default, the fixed-capacity exchange. :mod:`.exchange_bench` times both exchanges under graph replay.
"""
from __future__ import annotations

import csv
import os
import statistics
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from ..kernels.sorted_layer import sorted_moe_layer
from ..perf.timing import machine_info
from ..reference import reference_moe_layer, rel_error, tolerance
from ..routing import route
from ..shapes import BATCH_SIZES, ModelShape, get_shape
from .dispatch import combine, dispatch
from .expert_parallel import expert_parallel_layer, local_experts
from .groups import require_group
from .sharding import shard_experts, shard_intermediate
from .tensor_parallel import tensor_parallel_layer

WARMUP, REPS, REPS_LARGE, LARGE_M = 3, 15, 8, 4096
PROTOCOL = (f"events per rank (cuda events on a GPU); synchronize + barrier before each repetition; {WARMUP} warm-up "
            f"repetitions; median of {REPS} ({REPS_LARGE} from M = {LARGE_M}); a repetition's time is the slowest "
            "rank's")

#: Columns of the CSV, in order. ``M`` is tokens per rank; ``step`` one of :data:`STEPS`;
#: ``bytes`` the most bytes one rank sends to other ranks in that step; ``gbps`` bytes / time.
FIELDS = ["gpu", "driver", "torch", "triton", "nccl", "date", "world", "protocol", "model", "E", "K", "I", "topk",
          "dtype", "case", "M", "step", "ms", "bytes", "gbps", "rel_error", "status"]
#: What a row measured. check_*: correctness (rel_error against the single-device layer, or against
#: float64 for check_ep_fp64). The others are times: the expert-parallel layer's three steps and the
#: whole layer, an all-to-all of dispatch's rows with the same counts (the link alone), the
#: tensor-parallel layer, one device running all ranks' tokens, and equal-split all-to-alls.
STEPS = ("check_ep", "check_tp", "check_ep_fp64", "dispatch", "experts", "combine", "ep_layer", "a2a_same_bytes",
         "tp_layer", "single_gpu", "a2a_equal")


def device() -> torch.device:
    """This rank's device: its GPU under NCCL (the launcher set it), else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def machine_columns(world: int, protocol: str = PROTOCOL) -> dict:
    """:func:`moe_tutorial.perf.timing.machine_info` (gpu, driver, torch, triton, date) plus the
    NCCL version, the world size and the timing ``protocol``."""
    nccl = ".".join(str(v) for v in torch.cuda.nccl.version()) if torch.cuda.is_available() else ""
    return {**machine_info(), "nccl": nccl, "world": world, "protocol": protocol}


def append_row(path, row: dict, fields: list[str] = FIELDS) -> None:
    """Append one row to the CSV at ``path`` with columns ``fields`` (header first when the file is new)."""
    path = Path(path)
    new = not path.exists() or path.stat().st_size == 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        if new:
            writer.writeheader()
        writer.writerow({k: row.get(k, "") for k in fields})


def all_ranks_ok(ok: bool) -> bool:
    """True when ``ok`` on every rank (all ranks get the same answer, so they skip a case together)."""
    flag = torch.tensor([1 if ok else 0], device=device())
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def in_time(deadline: float) -> bool:
    """True while every rank is before ``deadline`` (``time.time()``); all ranks get the same answer."""
    return all_ranks_ok(time.time() <= deadline)


def _synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed_ms(fn, reps: int = REPS, warmup: int = WARMUP) -> float:
    """Median ms of ``fn`` over ``reps`` repetitions after ``warmup``, per :data:`PROTOCOL`."""
    on_gpu = torch.cuda.is_available()
    times = []
    for i in range(warmup + reps):
        _synchronize()
        dist.barrier()
        if on_gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            fn()
            ms = 1e3 * (time.perf_counter() - t0)
        if i >= warmup:
            times.append(ms)
    slowest = torch.tensor(times, device=device())
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return statistics.median(slowest.tolist())


def as_shape(model) -> ModelShape:
    """``model`` as a :class:`ModelShape`: one already, or its name."""
    return model if isinstance(model, ModelShape) else get_shape(model)


def make_weights(shape: ModelShape, num_experts: int, dtype, seed: int = 0):
    """Every expert's ``w13 [E, 2I, K]`` and ``w2 [E, K, I]`` on this device, the same on every rank."""
    dev = device()
    g = torch.Generator(device=dev).manual_seed(seed)
    K, inter = shape.hidden, shape.intermediate
    w13 = torch.empty(num_experts, 2 * inter, K, device=dev, dtype=dtype).normal_(generator=g).mul_(K ** -0.5)
    w2 = torch.empty(num_experts, K, inter, device=dev, dtype=dtype).normal_(generator=g).mul_(inter ** -0.5)
    return w13, w2


def make_batch(tokens_per_rank: list[int], num_experts: int, topk: int, hidden: int, dtype, seed: int,
               experts_used: int | None = None):
    """All ranks' tokens and routing ``(x [M, K], topk_weights, topk_ids, starts)``, the same on
    every rank; rank r owns tokens ``starts[r]:starts[r + 1]``. ``experts_used``: route only to
    experts ``[0, experts_used)``."""
    dev = device()
    g = torch.Generator(device=dev).manual_seed(seed)
    M = sum(tokens_per_rank)
    x = torch.randn(M, hidden, device=dev, generator=g).to(dtype)
    logits = torch.randn(M, num_experts, device=dev, generator=g)
    if experts_used is not None:
        logits[:, experts_used:] = float("-inf")
    topk_weights, topk_ids = route(logits, topk)
    starts = [0]
    for m in tokens_per_rank:
        starts.append(starts[-1] + m)
    return x, topk_weights, topk_ids, starts


def _shape_columns(shape: ModelShape, num_experts: int, dtype) -> dict:
    return {"model": shape.name, "E": num_experts, "K": shape.hidden, "I": shape.intermediate, "topk": shape.topk,
            "dtype": str(dtype).replace("torch.", "")}


def last_error_line() -> str:
    """The last line of the exception being handled: what a row's status says went wrong."""
    return traceback.format_exc(limit=1).strip().splitlines()[-1]


def _emit(csv_path, rank: int, row: dict, fields: list[str] = FIELDS,
          label=(("case", 24), ("step", 14))) -> dict:
    """Rank 0 prints the row (model, the ``label`` columns at their widths, M, ms, error, status)
    and appends it to the CSV of ``fields``; every rank keeps it."""
    if rank == 0:
        ms = row.get("ms", "")
        rel = row.get("rel_error", "")
        tags = " ".join(f"{row.get(key, '')!s:{width}s}" for key, width in label)
        print(f"{row.get('model', ''):14s} {tags} "
              f"M={row.get('M', '')!s:6s} {f'{ms:.4f} ms' if ms != '' else '':>12s} "
              f"{f'rel {rel:.1e}' if rel != '' else '':>12s} {row.get('status', '')}", flush=True)
        if csv_path:
            append_row(csv_path, row, fields)
    return row


#: Correctness cases: (name, tokens of rank 0, of every other rank, route only to rank 0's experts?).
CHECK_CASES = (("uneven", 5, 3, False), ("mid", 256, 200, False), ("large", 4096, 4000, False),
               ("rank 1 receives nothing", 64, 64, True), ("rank 0 owns no tokens", 0, 33, False))


def check_rank(models: list, csv_path: str | None, deadline: float, experts: dict | None = None,
               dtype=torch.bfloat16, cases=CHECK_CASES) -> list[dict]:
    """On every rank: the expert- and tensor-parallel layers against the single-device layer on the
    concatenation of all ranks' tokens (and, for the first case, against float64).

    ``models``: names or :class:`ModelShape`; ``experts``: ``{name: E}`` to run a model with fewer
    experts than it has (memory). Returns the rows (rank 0 also appends them to ``csv_path``).
    """
    rank, world = require_group()
    rows = []
    common = machine_columns(world)
    for model in models:
        shape = as_shape(model)
        E = (experts or {}).get(shape.name, shape.num_experts)
        cols = {**common, **_shape_columns(shape, E, dtype)}
        try:
            w13, w2 = make_weights(shape, E, dtype)
            ep, tp = shard_experts(w13, w2, rank, world), shard_intermediate(w13, w2, rank, world)
            ok, err = True, ""
        except Exception:  # noqa: BLE001  (e.g. out of memory: recorded, and the ranks move on together)
            ok, err = False, last_error_line()
        if not all_ranks_ok(ok):
            rows.append(_emit(csv_path, rank, {**cols, "step": "check_ep",
                                               "status": f"error: {err or 'another rank'}"}))
            continue
        for c, (case, m0, m_other, one_side) in enumerate(cases):
            tokens = [m0] + [m_other] * (world - 1)
            case_cols = {**cols, "case": case, "M": tokens[rank]}
            if not in_time(deadline):
                rows.append(_emit(csv_path, rank, {**case_cols, "step": "check_ep", "status": "skipped: time budget"}))
                continue
            batch = make_batch(tokens, E, shape.topk, shape.hidden, dtype, seed=c,
                               experts_used=E // world if one_side else None)
            for step in ("check_ep", "check_tp", "check_ep_fp64"):
                if step == "check_ep_fp64" and c:
                    continue                  # float64 on the first case only: it loops over experts
                err, status = _check(step, batch, rank, (w13, w2), ep, tp, E, dtype)
                if not all_ranks_ok(status == "ok") and status == "ok":
                    status = "another rank failed"
                rows.append(_emit(csv_path, rank, {**case_cols, "step": step, "rel_error": err, "status": status}))
        del w13, w2, ep, tp
        empty_cache()
    return rows


def _check(step: str, batch, rank: int, full, ep, tp, num_experts: int, dtype) -> tuple[float, str]:
    """One correctness check: ``(relative error, "ok" | "wrong" | "error: ...")``."""
    x, tw, ti, starts = batch
    lo, hi = starts[rank], starts[rank + 1]
    try:
        if step == "check_tp":
            out, ref = tensor_parallel_layer(x, *tp, tw, ti), sorted_moe_layer(x, *full, tw, ti)
        else:
            out = expert_parallel_layer(x[lo:hi], *ep, tw[lo:hi], ti[lo:hi], num_experts=num_experts)
            ref = (reference_moe_layer if step == "check_ep_fp64" else sorted_moe_layer)(x, *full, tw, ti)[lo:hi]
        err = rel_error(out, ref) if out.numel() else 0.0
        return err, "ok" if err <= tolerance(dtype) else "wrong"
    except Exception:  # noqa: BLE001  (recorded; the ranks agree on it before the next collective)
        return float("nan"), "error: " + last_error_line()


def empty_cache() -> None:
    """Give the CUDA caching allocator's free blocks back between cases (nothing without a GPU)."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def timing_rank(model, csv_path: str | None, deadline: float, batch_sizes=BATCH_SIZES, num_experts: int | None = None,
                dtype=torch.bfloat16, reps: int | None = None, warmup: int = WARMUP) -> list[dict]:
    """On every rank: time each step of the expert-parallel layer, the link, the tensor-parallel
    layer and one device at each M (tokens per rank). Returns the rows; rank 0 appends them to the CSV.

    ``reps`` and ``warmup`` override :data:`PROTOCOL`'s repetitions (the CPU tests use 1 and 0).
    """
    rank, world = require_group()
    shape = as_shape(model)
    E = num_experts or shape.num_experts
    common = {**machine_columns(world), **_shape_columns(shape, E, dtype), "case": "uniform routing"}
    if reps is not None:
        common["protocol"] = PROTOCOL.split(";")[0] + f"; {warmup} warm-up repetitions; median of {reps}"
    rows: list[dict] = []
    try:
        w13, w2 = make_weights(shape, E, dtype)
        ep, tp = shard_experts(w13, w2, rank, world), shard_intermediate(w13, w2, rank, world)
        ok, err = True, ""
    except Exception:  # noqa: BLE001
        ok, err = False, last_error_line()
    if not all_ranks_ok(ok):
        return [_emit(csv_path, rank, {**common, "step": "ep_layer", "status": f"error: {err or 'another rank'}"})]
    for M in batch_sizes:
        cols = {**common, "M": M}
        if not in_time(deadline):
            rows.append(_emit(csv_path, rank, {**cols, "step": "ep_layer", "status": "skipped: time budget"}))
            continue
        try:
            steps, ok, err = _timing_steps(M, shape, E, dtype, rank, world, (w13, w2), ep, tp), True, ""
        except Exception:  # noqa: BLE001
            steps, ok, err = {}, False, last_error_line()
        if not all_ranks_ok(ok):
            rows.append(_emit(csv_path, rank, {**cols, "step": "ep_layer",
                                               "status": f"error: {err or 'another rank'}"}))
            continue
        n = reps or (REPS if M < LARGE_M else REPS_LARGE)
        for step, (fn, nbytes) in steps.items():
            try:
                ms, status = timed_ms(fn, n, warmup), "ok"
            except Exception:  # noqa: BLE001  (a failure inside a collective may still stop the run: the CSV keeps the rest)
                ms, status = float("nan"), "error: " + last_error_line()
            gbps = nbytes / (ms * 1e6) if nbytes and ms == ms else ""
            rows.append(_emit(csv_path, rank, {**cols, "step": step, "ms": ms, "bytes": int(nbytes), "gbps": gbps,
                                               "status": status}))
        del steps
        empty_cache()
    return rows


def _timing_steps(M: int, shape: ModelShape, E: int, dtype, rank: int, world: int, full, ep, tp) -> dict:
    """``{step: (call, bytes one rank sends to the others)}`` for one M, inputs built and warmed."""
    K, itemsize = shape.hidden, torch.empty(0, dtype=dtype).element_size()
    x, tw, ti, starts = make_batch([M] * world, E, shape.topk, K, dtype, seed=M)
    lo, hi = starts[rank], starts[rank + 1]
    xr, twr, tir = x[lo:hi], tw[lo:hi], ti[lo:hi]
    d = dispatch(xr, twr, tir, E, method="all_to_all")
    out = local_experts(d, *ep)
    counts = d.plan.counts
    remote = max(int(counts[r].sum() - counts[r, r]) for r in range(world))     # rows of the busiest sender
    send_rows = torch.randn(int(counts[rank].sum()), K, device=x.device).to(dtype)
    recv_rows = x.new_empty(int(counts[:, rank].sum()), K)
    return {
        "dispatch": (lambda: dispatch(xr, twr, tir, E, method="all_to_all"), remote * (K * itemsize + 8)),
        "experts": (lambda: local_experts(d, *ep), 0),
        "combine": (lambda: combine(out, d.plan), remote * K * itemsize),
        "ep_layer": (lambda: expert_parallel_layer(xr, *ep, twr, tir, num_experts=E, method="all_to_all"),
                     remote * (2 * K * itemsize + 8)),
        "a2a_same_bytes": (lambda: dist.all_to_all_single(recv_rows, send_rows, d.plan.recv_counts, d.plan.send_counts),
                           remote * K * itemsize),
        "tp_layer": (lambda: tensor_parallel_layer(x, *tp, tw, ti, check_ranks=False),
                     2 * (world - 1) / world * x.numel() * itemsize),
        "single_gpu": (lambda: sorted_moe_layer(x, *full, tw, ti), 0),
    }


#: Bytes per rank (to all ranks, itself included) of the equal-split all-to-alls that measure the link.
A2A_BYTES = (8 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30)


def link_rank(csv_path: str | None, deadline: float, sizes=A2A_BYTES) -> list[dict]:
    """On every rank: equal-split bf16 all-to-alls of ``sizes`` bytes; ``bytes`` is what one rank
    sends to the others, so ``gbps`` is the link's bandwidth one way (and the smallest shows its latency)."""
    rank, world = require_group()
    common = {**machine_columns(world), "case": "equal split", "dtype": "bfloat16", "step": "a2a_equal"}
    rows = []
    for total in sizes:
        if not in_time(deadline):
            rows.append(_emit(csv_path, rank, {**common, "status": "skipped: time budget"}))
            continue
        n = total // 2 // world * world
        send = torch.randn(n, device=device()).to(torch.bfloat16)
        recv = torch.empty_like(send)
        nbytes = (world - 1) / world * n * 2
        ms = timed_ms(lambda: dist.all_to_all_single(recv, send))
        rows.append(_emit(csv_path, rank, {**common, "ms": ms, "bytes": int(nbytes), "gbps": nbytes / (ms * 1e6),
                                           "status": "ok"}))
    empty_cache()
    return rows


def link_and_check_rank(models: list, csv_path: str | None, link_deadline: float, deadline: float,
                        experts: dict | None = None, sizes=A2A_BYTES, dtype=torch.bfloat16,
                        cases=CHECK_CASES) -> list[dict]:
    """:func:`link_rank`, then :func:`check_rank`: the first stage of ``measurements/scripts/h200x2_ep.py``."""
    return link_rank(csv_path, link_deadline, sizes) + check_rank(models, csv_path, deadline, experts, dtype, cases)


def env_for_ranks() -> dict[str, str]:
    """No NVLink multicast (NVLS) or symmetric memory: the lent machines run with it off."""
    return {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def set_env_for_ranks() -> None:
    """Put :func:`env_for_ranks` into this process's environment (the ranks inherit it)."""
    os.environ.update(env_for_ranks())
