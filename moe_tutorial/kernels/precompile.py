"""Compile a step's kernels side by side before its first launch (GPU only).

Triton compiles a kernel the first time it is launched with a new specialisation: Python to
Triton IR, MLIR passes, LLVM, ``ptxas``, then a small C launcher built with the host's C compiler
and the binary loaded. A training step's first call launches its kernels one after another, so
it pays those compiles one after another: most of a first call's 8 to 10 s on an H100
(``measurements/scripts/first_call_profile.py``), much of it waiting on ``ptxas`` and the C
compiler, programs that can run beside each other on a many-core host. Compiled side by side,
the first call took about half as long (``moe_tutorial/data/first_call.csv``).

:func:`precompile` runs the step once *dry*: the host-side code runs as usual (it allocates the
buffers and computes every launch's arguments, with no host synchronisation in between), but
each ``kernel[grid](...)`` becomes ``kernel.warmup(...)``, which compiles without launching. Under
Triton's ``AsyncCompileMode`` (in Triton 3.6 and 3.9, not in 3.4) a warmup hands the compile to a thread
pool; each worker then also builds that kernel's launcher and loads it. When the pool is done,
every kernel of the step is in Triton's in-memory cache under the key its real launch looks up,
and the real step runs without compiling. Nothing the dry pass computes is read: its kernels
never ran, and the torch operations between them see uninitialised memory (the one that
indexes, :func:`~moe_tutorial.kernels.align.gather_sorted_rows`, clamps its indices).

The dry pass turns launches into warmups by replacing ``KernelInterface.__getitem__`` for the
length of the pass, and only for the thread running it; other threads launch as usual. On a
Triton without ``AsyncCompileMode`` :func:`precompile` does nothing (the kernels compile at their
first launch, as before).
"""
from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Callable

import torch
import triton
from triton.runtime import KernelInterface

#: Triton's asynchronous compile mode, or None on a Triton that has none.
AsyncCompileMode = getattr(triton, "AsyncCompileMode", None)

_dry = threading.local()          # .requests: the warmups of this thread's dry pass, else absent
_patch_lock = threading.Lock()    # one dry pass patches KernelInterface at a time


def _launch_or_warmup(original):
    def getitem(self, grid):
        requests = getattr(_dry, "requests", None)
        if requests is None:
            return original(self, grid)

        def warmup(*args, **kwargs):
            requests.append(self.warmup(*args, grid=grid, **kwargs))
        return warmup
    return getitem


@contextmanager
def dry_launches():
    """Within the block, this thread's ``kernel[grid](*args)`` compiles the kernel for those
    arguments (``kernel.warmup``) and launches nothing. Yields the list of what the warmups
    returned (compiled kernels, or Triton's futures of them under ``AsyncCompileMode``)."""
    requests = []
    with _patch_lock:
        original = KernelInterface.__getitem__
        KernelInterface.__getitem__ = _launch_or_warmup(original)
        _dry.requests = requests
        try:
            yield requests
        finally:
            del _dry.requests
            KernelInterface.__getitem__ = original


class _CompileAndLoad(ThreadPoolExecutor):
    """A thread pool whose workers, after compiling a kernel, build its launcher and load its
    binary on ``device`` (what the kernel's first launch would do otherwise, one at a time)."""

    def __init__(self, device: torch.device, workers: int):
        super().__init__(max_workers=workers, thread_name_prefix="moe-precompile")
        self.device = device

    def submit(self, fn, /, *args, **kwargs):
        def compile_and_load():
            kernel = fn(*args, **kwargs)
            with torch.cuda.device(self.device):
                kernel.run                     # a property: builds the launcher, loads the binary
            return kernel
        return super().submit(compile_and_load)


def precompile(step: Callable[[], object], device: torch.device, workers: int | None = None) -> int:
    """Compile every kernel ``step`` launches, side by side, without running them.

    Args:
        step: runs the host code of one step (its launches are made dry, see the module); it
            must not read results back to the host, which hold nothing.
        device: the CUDA device the step's tensors live on.
        workers: threads compiling at once; by default one per CPU, at most 16.

    Returns how many launches the dry pass made (0 where Triton has no ``AsyncCompileMode``;
    then nothing ran). Kernels already compiled are looked up, not compiled again.
    """
    if AsyncCompileMode is None or device.type != "cuda":
        return 0
    workers = workers or min(16, os.cpu_count() or 1)
    with _CompileAndLoad(device, workers) as pool:
        with AsyncCompileMode(pool), dry_launches() as requests, torch.no_grad():
            step()
    return len(requests)
