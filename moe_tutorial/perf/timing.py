"""How the bench and the tuner time things: the two timing protocols, a guard for slow calls.

Two protocols, each named in every CSV row and table it produces:

- **cold-l2** (the default, how independent measurements of these kernels are made): one call
  captured in a CUDA graph; before each replay a 256 MB buffer, larger than the L2 cache, is
  read, so the call finds none of its data in L2 and L2 holds only clean lines (nothing the
  call must write back first); CUDA events around the replay only; the median of 30 replays.
- **cold-l2-zero** (the protocol of the data measured before 2026-12-02): the same, but the
  256 MB buffer is zeroed instead of read. That leaves L2 full of dirty lines, which the timed
  call then pays to write back: a 25 MiB read ran at 1.67 TB/s after it, 1.99 after a read.
- **rotated**: many calls captured in one CUDA graph, cycling through several inputs and
  routings so that L2 holds none of the previous call's weights; the median of 10 replays,
  divided by the number of calls. Launch gaps shrink as in an inference engine at decode.

On the CPU there is only ``time.perf_counter``, and Triton kernels run in the interpreter: those
numbers say nothing about GPU speed. The ceilings that turn bytes and FLOPs into a floor are
measured under the same protocol (:mod:`moe_tutorial.perf.ceilings`).
"""
from __future__ import annotations

import datetime
import itertools
import platform
import statistics
import subprocess
import time
from typing import Callable, Sequence

import torch
import triton

from .. import runtime

#: The timing protocols (see the module docstring).
PROTOCOLS = ("cold-l2", "cold-l2-zero", "rotated")
#: How each cold protocol flushes L2 before a replay (see :func:`flush_l2`).
FLUSHES = {"cold-l2": "read", "cold-l2-zero": "zero"}
#: What "cold" means: this many bytes pass through L2 before each replay, more than any GPU's L2 holds.
FLUSH_BYTES = 256 << 20
#: Replays per timing: their median is the result.
COLD_REPLAYS, ROTATED_REPLAYS = 30, 10
#: A call slower than this is timed a few times with events instead of in a CUDA graph: its
#: launch is negligible, and 30 replays would take too long.
SLOW_CALL_S = 0.02
#: The names :func:`measure_ms` gives the timers it falls back to.
SLOW_CALL_TIMER = "events, slow call"
HOST_SYNC_TIMER = "events, host syncs"
CAPTURE_FAILED_TIMER = "events, graph capture failed"


class TooSlow(Exception):
    """One call took longer than the case's budget; ``seconds`` says how long."""

    def __init__(self, seconds: float, limit: float):
        super().__init__(f"slower than {limit:g} s per call ({seconds:.2f} s)")
        self.seconds = seconds


def synchronize() -> None:
    if runtime.ON_GPU:
        torch.cuda.synchronize()


def cycle(calls: Sequence[Callable]) -> Callable:
    """One callable that runs ``calls`` in turn, e.g. the same work on rotated inputs.

    A CUDA graph captures each call separately, so the rotation survives graph capture.
    """
    it = itertools.cycle(calls)
    return lambda: next(it)()


def time_one_call(fn: Callable) -> float:
    """Seconds of one call, device work included (synchronises before and after)."""
    synchronize()
    t0 = time.perf_counter()
    fn()
    synchronize()
    return time.perf_counter() - t0


def _perf_counter_ms(fn: Callable, first_s: float, budget_s: float) -> float:
    """Median of a few CPU-timed calls, as many as fit in ``budget_s`` (3 to 20)."""
    reps = max(3, min(20, int(budget_s / max(first_s, 1e-6))))
    return 1e3 * statistics.median(time_one_call(fn) for _ in range(reps))


def _rotated_ms(fn: Callable, rep_ms: float = 20.0, warmup_ms: float = 100.0) -> float:
    """Median ms per call of ``fn``, from replays of one CUDA graph holding enough calls to
    last ``rep_ms`` (the rotated protocol; ``fn`` cycles through rotated inputs)."""
    with torch.cuda.stream(torch.cuda.Stream()):
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        once = torch.cuda.CUDAGraph()
        with torch.cuda.graph(once):
            fn()
        start.record()
        once.replay()
        end.record()
        torch.cuda.synchronize()
        n_calls = max(1, int(rep_ms / max(start.elapsed_time(end), 1e-3)))
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(n_calls):
                fn()
        del once
        _warm_up(graph.replay, warmup_ms)
        times = []
        for _ in range(ROTATED_REPLAYS):
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / n_calls)
        del graph
    return statistics.median(times)


_flush_buffer: torch.Tensor | None = None


def flush_l2(how: str = "read") -> None:
    """Evict whatever L2 holds by passing :data:`FLUSH_BYTES` of device memory through it.

    ``how="read"`` (cold-l2) reads the buffer: the evicted dirty lines are written back now,
    outside the timed call, and L2 is left holding clean lines only. ``how="zero"``
    (cold-l2-zero) zeroes it, leaving 256 MB of dirty lines for the next call to write back.
    """
    global _flush_buffer
    if _flush_buffer is None:
        _flush_buffer = torch.zeros(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    if how == "read":
        _flush_buffer.amax()         # a reduction reads every byte and writes one number
    elif how == "zero":
        _flush_buffer.zero_()
    else:
        raise ValueError(f"how: expected 'read' or 'zero', got {how!r}")


def cold_l2_ms(fn: Callable, replays: int = COLD_REPLAYS, flush: Callable[[], None] | None = None,
               protocol: str = "cold-l2") -> float:
    """Median ms of one call of ``fn`` captured in a CUDA graph, L2 flushed before each replay
    and events around the replay only (the cold-l2 protocols). ``flush`` replaces the flush
    ``protocol`` names (:data:`FLUSHES`)."""
    flush = flush or (lambda: flush_l2(FLUSHES[protocol]))
    with torch.cuda.stream(torch.cuda.Stream()):
        fn()                                     # outside capture: allocations, autotuning, compilation
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        graph.replay()
        events = []
        for _ in range(replays):
            flush()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()
        del graph
    return statistics.median(s.elapsed_time(e) for s, e in events)


def _cold_events_ms(fn: Callable, reps: int, how: str = "read") -> float:
    """Median of ``reps`` calls, L2 flushed before each (``how`` as :func:`flush_l2`), events
    around the call: for calls a CUDA graph cannot hold (they wait on the host) or too slow to
    repeat 30 times."""
    times = []
    for _ in range(reps):
        flush_l2(how)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _warm_up(fn: Callable, ms: float) -> None:
    until = time.perf_counter() + ms / 1e3
    while time.perf_counter() < until:
        fn()
        torch.cuda.synchronize()


def warm_up_gpu(ms: float = 100.0) -> None:
    """Keep the GPU busy for ``ms`` (matmuls), so a timing that follows an idle spell (a
    compile, a correctness check) finds the clocks where they run under load."""
    if runtime.ON_GPU:
        # Its own generator: a graph capture that failed earlier can leave the default one expecting
        # to be captured ("Offset increment outside graph capture"), seen after an autograd capture.
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, generator=g)
        _warm_up(lambda: a @ a, ms)


def measure_ms(fn: Callable, *, protocol: str = "cold-l2", max_seconds: float = 2.0,
               graphable: bool = True, rotated_fn: Callable | None = None,
               no_graph_timer: str = HOST_SYNC_TIMER) -> tuple[float, str]:
    """Time ``fn`` (already warmed up: compiled, checked) under ``protocol``; return ``(median ms, how)``.

    ``fn`` is one call; the rotated protocol times ``rotated_fn`` (one call per invocation, cycling
    through rotated inputs) when given. ``how`` names the timer used: "cold-l2", "rotated",
    "events, slow call", "events, host syncs", "events, graph capture failed", or "perf_counter"
    on the CPU. One call is timed first; if it takes longer than ``max_seconds`` the case raises
    :class:`TooSlow`, and a call slower than :data:`SLOW_CALL_S` is timed a few times with events
    so the case stays within budget. ``graphable=False`` says a CUDA graph cannot capture ``fn``
    (it waits on the host, Python loops over expert ids, say): it is timed with events, and the
    timer is named ``no_graph_timer`` (what stops the graph; "events, host syncs" by default).
    Every GPU timer flushes L2 before each timed call except the rotated protocol's graph.
    """
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol: expected one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    first = time_one_call(fn)
    if first > max_seconds:
        raise TooSlow(first, max_seconds)
    if not runtime.ON_GPU:
        return _perf_counter_ms(fn, first, min(max_seconds, 0.3)), "perf_counter"
    how = FLUSHES.get(protocol, "read")
    if first > SLOW_CALL_S:
        reps = max(1, min(10, int(max_seconds / first)))
        return _cold_events_ms(fn, reps, how), SLOW_CALL_TIMER
    if not graphable:
        reps = max(3, min(COLD_REPLAYS, int(max_seconds / max(first, 1e-6))))
        return _cold_events_ms(fn, reps, how), no_graph_timer
    try:
        if protocol == "rotated":
            return _rotated_ms(rotated_fn or fn), "rotated"
        return cold_l2_ms(fn, protocol=protocol), protocol
    except Exception:  # noqa: BLE001  (any capture failure: fall back, and say so)
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        return _cold_events_ms(fn, COLD_REPLAYS, how), CAPTURE_FAILED_TIMER


def time_both_orders(calls: dict[str, Callable], *, protocol: str = "cold-l2",
                     max_seconds: float = 5.0) -> dict[str, list[float]]:
    """``{name: [ms in call order, ms in reverse order]}``: the GPU warmed up, then every call of
    ``calls`` timed by :func:`measure_ms` in the dict's order and again in reverse, so that a drift
    of the clocks over the run favours neither; the caller keeps the faster, and the two readings'
    difference is the noise of the comparison."""
    warm_up_gpu()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for order in (list(calls), list(reversed(calls))):
        for name in order:
            times[name].append(measure_ms(calls[name], protocol=protocol, max_seconds=max_seconds)[0])
    return times


def gpu_driver() -> str:
    """The NVIDIA driver version from ``nvidia-smi``, or "" where there is none."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.strip().splitlines()[0].strip() if out.strip() else ""


def machine_info() -> dict:
    """The columns that say where a result was measured: gpu, driver, torch, triton, date."""
    gpu = torch.cuda.get_device_name() if runtime.ON_GPU else f"cpu ({platform.machine()}, interpreter)"
    return {
        "gpu": gpu,
        "driver": gpu_driver() if runtime.ON_GPU else "",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }
