"""Safety nets around a student's code: poisoned allocations and, in the interpreter, bounds checks.

Two things a checker wants to see that a plain run hides:

- **Elements never written.** :func:`poisoned_allocations` makes every ``torch.empty``-style
  allocation made by the student's code start as NaN (floats) or the most negative integer,
  so an element the code forgot to write shows up instead of holding whatever the allocator
  left there (often the right answer from a previous run).
- **Pointers out of range.** Triton's interpreter loads and stores through raw addresses: a
  wrong offset reads garbage or kills the Python process. :func:`memory_guard` checks every
  unmasked address of every load and store against the tensors passed to that launch and
  raises :class:`OutOfBounds` (program id, lane, which tensor, how far off) before the access
  happens. It only exists in the interpreter; on a GPU it does nothing.
"""
from __future__ import annotations

import contextlib
import mmap
import sys

import numpy as np
import torch

from ..kernels import interpreter

_EMPTY_FUNCS = ("empty", "empty_like", "empty_strided")


def _poison(t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype != torch.bool and t.numel():
        t.fill_(torch.iinfo(t.dtype).min)
    return t


@contextlib.contextmanager
def poisoned_allocations():
    """While active, ``torch.empty``, ``empty_like``, ``empty_strided`` and ``Tensor.new_empty``
    return tensors filled with NaN (floats) or ``iinfo.min`` (integers)."""
    saved = {name: getattr(torch, name) for name in _EMPTY_FUNCS}
    saved_new_empty = torch.Tensor.new_empty

    def wrap(fn):
        def poisoned(*args, **kwargs):
            return _poison(fn(*args, **kwargs))
        return poisoned

    try:
        for name, fn in saved.items():
            setattr(torch, name, wrap(fn))
        torch.Tensor.new_empty = wrap(saved_new_empty)
        yield
    finally:
        for name, fn in saved.items():
            setattr(torch, name, fn)
        torch.Tensor.new_empty = saved_new_empty


class OutOfBounds(Exception):
    """A kernel in the interpreter touched memory outside every tensor of its launch."""

    def __init__(self, op: str, program: tuple, lane: tuple, arg: str, offset: int, length: int):
        self.op, self.program, self.lane, self.arg = op, program, lane, arg
        self.offset, self.length = offset, length
        super().__init__(self.explain())

    @property
    def wrapped(self) -> bool:
        """An offset billions of elements away almost always means int32 arithmetic wrapped."""
        return abs(self.offset) >= 2**30

    def explain(self) -> str:
        if self.offset < 0:
            where = f"{-self.offset} elements before the start of `{self.arg}`"
        else:
            where = f"element {self.offset} of `{self.arg}`, which has only {self.length} elements"
        pid = ", ".join(str(p) for p in self.program)
        text = (f"program ({pid}) tried to {self.op} {where} "
                f"(lane {self.lane} of the block, not masked off)")
        if self.wrapped:
            text += ("; an offset that far off comes from an int32 offset that wrapped around, or from an index "
                     "loaded from memory nobody wrote (the checker fills new tensors with NaN or the most negative int)")
        return text


class _Guard:
    """Refuses any access outside every tensor of the running launch."""

    def __init__(self):
        self.extents: list[interpreter.Extent] = []

    def on_launch(self, extents):
        self.extents = extents

    def check(self, op: str, ptrs, mask):
        addrs = interpreter.addresses(ptrs)
        active = interpreter.lane_mask(ptrs, mask)
        itemsize = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
        ok = ~active
        for ext in self.extents:
            ok = ok | ((addrs >= ext.lo) & (addrs + itemsize <= ext.hi))
        if ok.all():
            return
        lane = tuple(int(i) for i in np.argwhere(~ok)[0])
        addr = int(addrs[lane]) if addrs.ndim else int(addrs)
        program = interpreter.current_program()
        if not self.extents:
            raise OutOfBounds(_VERB[op], program, lane, "?", addr, 0)
        # Report the offset from the argument the pointer was built from (else the nearest tensor).
        base = interpreter.base_of(ptrs)
        named = [e for e in self.extents if e.name == base]
        ext = named[0] if named else min(
            self.extents, key=lambda e: 0 if e.lo <= addr < e.hi else min(abs(addr - e.lo), abs(addr - e.hi)))
        offset = (addr - ext.lo) // ext.itemsize
        raise OutOfBounds(_VERB[op], program, lane, ext.name, offset, (ext.hi - ext.lo) // ext.itemsize)


_VERB = {"load": "load from", "store": "store to", "atomic": "update atomically"}


@contextlib.contextmanager
def memory_guard():
    """Bounds-check every load, store and atomic of interpreted kernels while active.

    Allowed memory is, per launch, the elements reachable from the tensors passed to that
    launch. A bad access raises :class:`OutOfBounds` inside the kernel; Triton re-raises it
    as ``InterpreterError`` with the original as ``__cause__`` (see :func:`find_out_of_bounds`).
    A no-op when kernels are compiled for a GPU.
    """
    guard = _Guard()
    with interpreter.watch(guard.on_launch, guard.check):
        yield


def find_out_of_bounds(exc: BaseException) -> OutOfBounds | None:
    """The :class:`OutOfBounds` behind an exception chain, if there is one."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OutOfBounds):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


# MAP_NORESERVE: reserve address space without committing memory (Linux; 0x4000 on x86 and arm).
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)


class SparseBuffer:
    """A float32 CPU buffer of billions of elements of which only the touched pages cost memory.

    Used to build a weight whose expert stride fits in int32 while ``expert * stride`` does not,
    as DeepSeek-V3's does, without allocating gigabytes: the pages of untouched experts' gaps
    are never written. Linux only; :meth:`create` returns None where it cannot reserve.
    """

    def __init__(self, mm: mmap.mmap):
        self._mm = mm
        self.tensor = torch.frombuffer(mm, dtype=torch.float32)

    @classmethod
    def create(cls, numel: int) -> "SparseBuffer | None":
        if not sys.platform.startswith("linux"):
            return None
        try:
            mm = mmap.mmap(-1, numel * 4, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE)
        except (OSError, ValueError, OverflowError):
            return None
        return cls(mm)

    def close(self) -> None:
        self.tensor = None
        try:
            self._mm.close()
        except BufferError:   # a view is still alive somewhere; the OS frees it at exit
            pass
