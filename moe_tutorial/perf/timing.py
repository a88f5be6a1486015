"""How the bench and the tuner time things: GPU timers, a guard for slow calls, the two ceilings.

On a GPU a call is timed either with ``triton.testing.do_bench`` (CUDA events around each
call, L2 flushed before each one) or by :func:`_cudagraph_ms` (many calls captured in one CUDA
graph and replayed after a warm-up, so the host's launch gaps vanish, as in an inference engine
at decode). On the CPU there is only ``time.perf_counter``, and Triton kernels run in the
interpreter: those numbers say nothing about GPU speed.

The ceilings are measured in the same run as the cases, so each floor uses the machine's own
numbers: copy bandwidth from a large device-to-device copy, matmul rate from an 8192^3 matmul.
"""
from __future__ import annotations

import datetime
import functools
import itertools
import platform
import statistics
import subprocess
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .. import runtime

#: Timer names: "cudagraph" (graph replay, no launch gaps) or "events" (one call at a time).
TIMERS = ("cudagraph", "events")
#: A call slower than this is timed a few times by hand instead of by ``triton.testing``,
#: whose fixed repetition counts would take far too long.
SLOW_CALL_S = 0.02
#: The name :func:`measure_ms` gives that timer.
SLOW_CALL_TIMER = "events, slow call"


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


def _few_events_ms(fn: Callable, reps: int) -> float:
    """Median of ``reps`` calls, each between two CUDA events (for slow calls)."""
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def _perf_counter_ms(fn: Callable, first_s: float, budget_s: float) -> float:
    """Median of a few CPU-timed calls, as many as fit in ``budget_s`` (3 to 20)."""
    reps = max(3, min(20, int(budget_s / max(first_s, 1e-6))))
    return 1e3 * statistics.median(time_one_call(fn) for _ in range(reps))


def _cudagraph_ms(fn: Callable, rep_ms: float = 20.0, warmup_ms: float = 100.0, replays: int = 10) -> float:
    """Median ms per call of ``fn``, from replays of one CUDA graph holding enough calls to
    last ``rep_ms``.

    Like ``triton.testing.do_bench_cudagraph``, plus ``warmup_ms`` of replays before timing,
    so that a case follows its compile and correctness check (an idle GPU) under load, as the
    ceilings are timed after a warm-up too. Heat alone moved an H200's times by 2-4%
    (notes/gpu-notes.md).
    """
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
        times = []
        warm_until = time.perf_counter() + warmup_ms / 1e3
        while time.perf_counter() < warm_until:
            graph.replay()
            torch.cuda.synchronize()
        for _ in range(replays):
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / n_calls)
        del graph
    return statistics.median(times)


def measure_ms(fn: Callable, *, timer: str = "cudagraph", max_seconds: float = 2.0,
               graphable: bool = True) -> tuple[float, str]:
    """Time ``fn`` (already warmed up: compiled, checked) and return ``(median ms, how)``.

    ``how`` names the timer used: "cudagraph", "events", "events, slow call",
    "events, graph capture failed" or "perf_counter" on the CPU. One call is timed first;
    if it takes longer than ``max_seconds`` the case raises :class:`TooSlow`, and a call slower
    than :data:`SLOW_CALL_S` is timed a few times by hand so the case stays within budget.
    ``graphable=False`` says ``fn`` syncs with the host (Python loops over expert ids), which a
    CUDA graph cannot capture: it is timed with events.
    """
    if timer not in TIMERS:
        raise ValueError(f"timer: expected one of {', '.join(TIMERS)}, got {timer!r}")
    first = time_one_call(fn)
    if first > max_seconds:
        raise TooSlow(first, max_seconds)
    if not runtime.ON_GPU:
        return _perf_counter_ms(fn, first, min(max_seconds, 0.3)), "perf_counter"
    import triton.testing

    if first > SLOW_CALL_S:
        reps = max(1, min(10, int(max_seconds / first)))
        return _few_events_ms(fn, reps), SLOW_CALL_TIMER
    if timer == "cudagraph" and graphable:
        try:
            return _cudagraph_ms(fn), "cudagraph"
        except Exception:  # noqa: BLE001  (any capture failure: fall back, and say so)
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
            return ms, "events, graph capture failed"
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"), "events"


@dataclass(frozen=True)
class Ceilings:
    """The machine's two roofs: copy bandwidth (TB/s) and matmul rate (TFLOP/s) in one dtype."""

    copy_tbps: float
    matmul_tflops: float

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP/byte) where the two roofs meet."""
        return self.matmul_tflops / self.copy_tbps

    def floor_ms(self, nbytes: float, flops: float) -> float:
        from .traffic import floor_seconds

        return 1e3 * floor_seconds(nbytes, flops, self.copy_tbps * 1e12, self.matmul_tflops * 1e12)


def measure_ceilings(dtype: torch.dtype | None = None, *, copy_bytes: int | None = None,
                     matmul_n: int | None = None) -> Ceilings:
    """Measure copy bandwidth and matmul rate on this machine, in ``dtype``.

    GPU: an 8192^3 matmul on random data (2 n^3 over the median time; first, so that it also
    brings the clocks up) and a 4 GiB ``copy_`` (bytes read + written over the median time),
    both with ``do_bench``, CUDA events around each call: the same copy replayed in a CUDA
    graph reads only about 2.75 TB/s on an H200 (notes/gpu-notes.md), not a fair ceiling. CPU: a 64 MiB copy and a
    1024^3 matmul with ``perf_counter``, only so that a CPU run fills every column.
    """
    dtype = dtype or runtime.DEFAULT_DTYPE
    device = runtime.DEVICE
    copy_bytes = copy_bytes or (4 << 30 if runtime.ON_GPU else 64 << 20)
    matmul_n = matmul_n or (8192 if runtime.ON_GPU else 1024)
    g = torch.Generator(device=device).manual_seed(0)

    # The matmul first: it also brings the GPU's clocks up from idle before the copy is timed.
    a = torch.randn(matmul_n, matmul_n, generator=g, device=device, dtype=dtype)
    b = torch.randn(matmul_n, matmul_n, generator=g, device=device, dtype=dtype)
    c = torch.empty_like(a)
    mm_ms = _ceiling_ms(functools.partial(torch.matmul, a, b, out=c))
    a = b = c = None
    # Random fp32 bits viewed in the run's dtype: a copy moves bits, and fp32 randn keeps the
    # generator's element count below 2^31.
    src = torch.randn(copy_bytes // 4, generator=g, device=device, dtype=torch.float32).view(dtype)
    dst = torch.empty_like(src)
    copy_ms = _ceiling_ms(functools.partial(dst.copy_, src))
    src = dst = None
    if runtime.ON_GPU:
        torch.cuda.empty_cache()
    return Ceilings(copy_tbps=2 * copy_bytes / (copy_ms * 1e-3) / 1e12,
                    matmul_tflops=2 * matmul_n ** 3 / (mm_ms * 1e-3) / 1e12)


def _ceiling_ms(fn: Callable) -> float:
    fn()
    if runtime.ON_GPU:
        import triton.testing

        return triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")
    return 1e3 * statistics.median(time_one_call(fn) for _ in range(5))


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
    import triton

    gpu = torch.cuda.get_device_name() if runtime.ON_GPU else f"cpu ({platform.machine()}, interpreter)"
    return {
        "gpu": gpu,
        "driver": gpu_driver() if runtime.ON_GPU else "",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }
