"""The machine's ceilings, measured in the same run and under the same timer as the kernels they judge.

- **read-only bandwidth**: the best of a few kernels that only read (8 GB on a GPU) and write one
  number per program, and of ``torch.sum`` over the same bytes. The MoE GEMMs mostly read weights,
  and a stream of reads outruns a copy (which reads and writes), so this, not the copy, is the
  memory roof a GEMM could reach. A GEMM can still read faster than all of them; after a run the
  bench raises the read ceiling to the best rate the run's calls reached
  (:mod:`moe_tutorial.perf.reached`), so that a floor stays a floor.
- **copy bandwidth**: a large device-to-device copy, bytes read plus written; reported beside the
  read-only figure so readers see why it is not the yardstick.
- **matmul rate**: an 8192^3 matmul in the run's dtype on random data.
- **FP8 matmul rate**: an 8192^3 e4m3 ``torch._scaled_mm`` (bf16 out) on GPUs with FP8 tensor
  cores: the compute roof of the FP8 kernels (Part 7).
- **one launch**: a kernel that does nothing, timed like every case. No call can take less.

The floor of a call is ``max(bytes / read bandwidth, FLOPs / matmul rate) + one launch``
(:meth:`Ceilings.floor_ms`): something a kernel could actually reach.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

import torch
import triton
import triton.language as tl

from .. import runtime
from . import timing, traffic


@dataclass(frozen=True)
class Ceilings:
    """Roofs measured under one timing protocol: TB/s, TFLOP/s and microseconds."""

    read_tbps: float
    matmul_tflops: float
    launch_us: float = 0.0
    copy_tbps: float | None = None
    protocol: str = "cold-l2"
    fp8_tflops: float | None = None    # e4m3 matmul rate; None where there are no FP8 tensor cores

    def compute_tflops(self, precision: str = "bf16") -> float:
        """The compute roof of a call in ``precision``: "bf16" (the run's dtype) or "fp8" (the e4m3
        rate; the run's own rate where none was measured, as on the CPU, whose floors mean nothing)."""
        if precision not in ("bf16", "fp8"):
            raise ValueError(f"precision: expected 'bf16' or 'fp8', got {precision!r}")
        return self.fp8_tflops if precision == "fp8" and self.fp8_tflops else self.matmul_tflops

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP/byte) where the two roofs meet."""
        return self.matmul_tflops / self.read_tbps

    def floor_ms(self, nbytes: float, flops: float, precision: str = "bf16") -> float:
        """The floor of a call moving ``nbytes`` and doing ``flops`` in ``precision``, in ms (one
        launch included)."""
        return 1e3 * traffic.floor_seconds(nbytes, flops, self.read_tbps * 1e12,
                                           self.compute_tflops(precision) * 1e12, self.launch_us * 1e-6)

    def columns(self) -> dict:
        """The columns every results row carries about the ceilings it was judged by."""
        return {"protocol": self.protocol, "read_tbps": self.read_tbps, "read_measured_tbps": self.read_tbps,
                "copy_tbps": self.copy_tbps,
                "matmul_tflops": self.matmul_tflops, "fp8_tflops": self.fp8_tflops, "launch_us": self.launch_us}


@triton.jit
def read_only_kernel(x_ptr, sums_ptr, n, BLOCK: tl.constexpr, EVICT_FIRST: tl.constexpr = False):
    """Program p adds up blocks p, p + P, p + 2P, ... of ``x`` and writes one number: reads only.

    With EVICT_FIRST the loads tell the cache not to keep what they bring: nothing is read twice.
    """
    pid = tl.program_id(0)
    step = tl.num_programs(0).to(tl.int64) * BLOCK
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK,), dtype=tl.int32)
    for start in range(0, n, step):
        if EVICT_FIRST:
            acc += tl.load(x_ptr + start + offs, mask=start + offs < n, other=0, eviction_policy="evict_first")
        else:
            acc += tl.load(x_ptr + start + offs, mask=start + offs < n, other=0)
    tl.store(sums_ptr + pid, tl.sum(acc, axis=0))


#: Launch shapes tried for the read-only ceiling, ``(programs per SM, BLOCK, num_warps, evict_first)``:
#: the bandwidth a GPU gives a pure read depends on how many bytes are in flight, so the ceiling
#: is the best of a few reasonable kernels, not one guess.
READ_VARIANTS = ((8, 4096, 4, False), (4, 8192, 8, False), (8, 8192, 8, True), (16, 4096, 4, True),
                 (2, 16384, 8, False))


@triton.jit
def empty_kernel(x_ptr):
    """Does nothing a caller can see: what one launch costs."""
    if tl.program_id(0) < 0:
        tl.store(x_ptr, 0)


def _timed(fn: Callable, protocol: str) -> float:
    if runtime.ON_GPU:
        return timing.measure_ms(fn, protocol=protocol, max_seconds=10.0)[0]
    fn()
    return 1e3 * statistics.median(timing.time_one_call(fn) for _ in range(5))


def measure_ceilings(dtype: torch.dtype | None = None, protocol: str = "cold-l2", *,
                     read_bytes: int | None = None, matmul_n: int | None = None) -> Ceilings:
    """Measure the ceilings on this machine, in ``dtype``, under ``protocol`` (see :mod:`timing`).

    GPU: the matmul first (it also brings the clocks up from idle), then an 8 GB read
    (``read_bytes``, at most a quarter of the free memory; the best of :data:`READ_VARIANTS` and
    ``torch.sum``), a copy
    of half of those bytes (so it
    moves as many: half read, half written) timed with events (a copy
    replayed in a CUDA graph read only 2.75 TB/s on an H200, measurements/gpu-notes.md), and an empty
    launch. CPU: a 64 MiB sum and copy and a 1024^3 matmul with ``perf_counter``, only so that a
    CPU run fills every column; on the CPU the launch is taken as 0 and the protocol is
    "perf_counter", the only timer there.
    """
    if protocol not in timing.PROTOCOLS:
        raise ValueError(f"protocol: expected one of {', '.join(timing.PROTOCOLS)}, got {protocol!r}")
    dtype = dtype or runtime.DEFAULT_DTYPE
    device = runtime.DEVICE
    matmul_n = matmul_n or (8192 if runtime.ON_GPU else 1024)
    if read_bytes is None:
        read_bytes = min(8 << 30, torch.cuda.mem_get_info()[0] // 4) if runtime.ON_GPU else 64 << 20
    read_bytes -= read_bytes % (1 << 20)
    g = torch.Generator(device=device).manual_seed(0)

    a = torch.randn(matmul_n, matmul_n, generator=g, device=device, dtype=dtype)
    b = torch.randn(matmul_n, matmul_n, generator=g, device=device, dtype=dtype)
    c = torch.empty_like(a)
    mm_ms = _timed(lambda: torch.matmul(a, b, out=c), protocol)
    a = b = c = None
    fp8_ms = _fp8_matmul_ms(matmul_n, g, protocol) if has_fp8_tensor_cores() else None

    # Random int32 words: a read moves bits, whatever they mean.
    words = torch.randint(-2**31, 2**31 - 1, (read_bytes // 4,), generator=g, device=device, dtype=torch.int32)
    if runtime.ON_GPU:
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        read_ms = min([_read_ms(words, per_sm * sms, block, warps, evict, protocol)
                       for per_sm, block, warps, evict in READ_VARIANTS] + [_timed(lambda: words.sum(), protocol)])
        copy_ms = _copy_ms(words[: words.numel() // 2])
        flag = torch.zeros(1, device=device, dtype=torch.int32)
        # The least of three: noise only ever adds to a launch (one H200 run read 22 us once, 3.9 after).
        launch_us = 1e3 * min(_timed(lambda: empty_kernel[(1,)](flag), protocol) for _ in range(3))
    else:   # the interpreter would take minutes over 64 MiB: torch reads them instead
        read_ms = _timed(lambda: words.sum(), protocol)
        half = words[: words.numel() // 2]
        copy_ms = _timed(lambda: half.clone(), protocol)
        launch_us = 0.0
    words = None
    if runtime.ON_GPU:
        torch.cuda.empty_cache()
    return Ceilings(read_tbps=read_bytes / (read_ms * 1e-3) / 1e12,
                    matmul_tflops=2 * matmul_n ** 3 / (mm_ms * 1e-3) / 1e12,
                    launch_us=launch_us, copy_tbps=read_bytes / (copy_ms * 1e-3) / 1e12,
                    protocol=protocol if runtime.ON_GPU else "perf_counter",
                    fp8_tflops=2 * matmul_n ** 3 / (fp8_ms * 1e-3) / 1e12 if fp8_ms else None)


def has_fp8_tensor_cores() -> bool:
    """A GPU of compute capability 8.9+ (Ada, Hopper and later) with ``torch._scaled_mm``."""
    return runtime.ON_GPU and torch.cuda.get_device_capability() >= (8, 9) and hasattr(torch, "_scaled_mm")


def _fp8_matmul_ms(n: int, g: torch.Generator, protocol: str) -> float:
    """One ``n^3`` e4m3 product through ``torch._scaled_mm`` (cuBLAS), unit scales, bf16 out."""
    device = runtime.DEVICE
    a = torch.randn(n, n, generator=g, device=device).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, generator=g, device=device).to(torch.float8_e4m3fn).t()   # column-major, as cuBLAS needs
    one = torch.ones((), device=device)
    return _timed(lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16), protocol)


def _read_ms(words: torch.Tensor, programs: int, block: int, warps: int, evict_first: bool, protocol: str) -> float:
    sums = torch.empty(programs, device=words.device, dtype=torch.int32)
    return _timed(lambda: read_only_kernel[(programs,)](words, sums, words.numel(), BLOCK=block,
                                                        EVICT_FIRST=evict_first, num_warps=warps), protocol)


def _copy_ms(src: torch.Tensor) -> float:
    """Median of 20 copies of ``src``, CUDA events around each."""
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
