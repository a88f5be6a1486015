"""Safety nets around a student's code: poisoned allocations and, in the interpreter, bounds checks.

Three things a checker wants to see that a plain run hides:

- **Elements never written.** :func:`poisoned_allocations` makes every ``torch.empty``-style
  allocation made by the student's code start as NaN (floats) or a large negative odd integer
  (:func:`int_poison`), so an element the code forgot to write shows up instead of holding whatever the allocator
  left there (often the right answer from a previous run).
- **Pointers out of range.** Triton's interpreter loads and stores through raw addresses: a
  wrong offset reads garbage or kills the Python process. :func:`memory_guard` checks every
  unmasked address of every load and store against the tensors passed to that launch and
  raises :class:`OutOfBounds` (program id, lane, which tensor, how far off) before the access
  happens. It only exists in the interpreter; on a GPU it does nothing.
- **Lanes a masked load left undefined.** A ``tl.load`` with a mask and no ``other=`` gives
  zeros in the interpreter but whatever the registers held on a GPU. :func:`poisoned_masked_loads`
  makes those lanes NaN (with a payload the checkers recognise) or a large negative integer,
  so code that uses them shows here too. Interpreter only.

A :class:`Recorder` collects what the guards saw during one call (the tensors of every launch,
the loads without ``other=``), for checks made after the student's function returned.
"""
from __future__ import annotations

import contextlib
import mmap
import sys
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from ..kernels import interpreter

_EMPTY_FUNCS = ("empty", "empty_like", "empty_strided")


def int_poison(dtype: torch.dtype) -> int:
    """What a new integer tensor of ``dtype`` is filled with: the interpreter's
    :data:`~moe_tutorial.kernels.interpreter.POISON_INT` for 32- and 64-bit signed integers (an index
    built from it lands far outside every tensor, even times an even stride in int32), else the
    most negative value (0 for unsigned dtypes)."""
    info = torch.iinfo(dtype)
    if info.bits >= 32 and info.min < 0:
        return interpreter.POISON_INT
    return info.min


#: The bits of the NaN new float tensors are filled with: a quiet NaN with its own payload (not the
#: masked-load poison's, not the NaN arithmetic makes), so that an element still holding it was never written.
ALLOC_NAN_BITS = {torch.float32: (torch.int32, 0x7FC0E0E0), torch.float64: (torch.int64, 0x7FF80E0E0E0E0E0E),
                  torch.float16: (torch.int16, 0x7E0E), torch.bfloat16: (torch.int16, 0x7FCE)}


def never_written(t: torch.Tensor) -> torch.Tensor:
    """Elementwise, on the CPU: does float tensor ``t`` still hold the NaN :func:`poisoned_allocations` filled it with?

    A NaN the code computed (0 / 0, a NaN ``other=``, one read from elsewhere) has other bits. For
    dtypes without a payload of their own, every NaN counts as never written.
    """
    t = t.detach().cpu()
    if t.dtype not in ALLOC_NAN_BITS:
        return torch.isnan(t) if t.is_floating_point() or t.is_complex() else torch.zeros(t.shape, dtype=torch.bool)
    int_dtype, bits = ALLOC_NAN_BITS[t.dtype]
    return t.contiguous().view(int_dtype) == torch.tensor(bits, dtype=torch.int64).to(int_dtype)


def _poison(t: torch.Tensor) -> torch.Tensor:
    if t.dtype in ALLOC_NAN_BITS and t.numel():
        int_dtype, bits = ALLOC_NAN_BITS[t.dtype]
        t.view(int_dtype).fill_(torch.tensor(bits, dtype=torch.int64).to(int_dtype).item())
    elif t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype != torch.bool and t.numel():
        t.fill_(int_poison(t.dtype))
    return t


@contextlib.contextmanager
def poisoned_allocations():
    """While active, ``torch.empty``, ``empty_like``, ``empty_strided`` and ``Tensor.new_empty``
    return tensors filled with NaN (floats) or :func:`int_poison` (integers)."""
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


@dataclass
class Recorder:
    """What a student's kernels did during one call.

    ``launches``: the tensor arguments of every launch, in order (:class:`~moe_tutorial.kernels.interpreter.Extent`),
    and ``grids`` their grids;
    ``no_other``: the kernel arguments read by a masked ``tl.load`` without ``other=`` whose mask
    was off somewhere, in order of first use. All stay empty on a GPU. A checker gets these
    facts as plain values (:meth:`absorb`), wherever the call ran: ``launch_count`` and
    ``inputs``, the indices of the call's inputs whose memory some launch received.
    """

    launches: list = field(default_factory=list)
    no_other: list[str] = field(default_factory=list)
    #: Each launch's grid ``(x, y, z)``, seen at its first access (None for a launch that touched no memory).
    grids: list = field(default_factory=list)
    launch_count: int = 0
    inputs: list[int] = field(default_factory=list)

    def on_launch(self, extents) -> None:
        self.launches.append(list(extents))
        self.grids.append(None)

    def on_access(self, grid: tuple) -> None:
        if self.grids and self.grids[-1] is None:
            self.grids[-1] = grid

    def on_poison(self, ptrs, lanes) -> None:
        name = interpreter.base_of(ptrs) or "?"
        if name not in self.no_other:
            self.no_other.append(name)

    def inputs_launched(self, inputs) -> list[int]:
        """The indices of ``inputs`` (a call's arguments) whose storage holds the first element of a
        tensor some launch got: the kernel read that input itself, not a copy of it."""
        found = set()
        for i, t in enumerate(inputs):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                lo = t.untyped_storage().data_ptr()
                hi = lo + max(t.untyped_storage().nbytes(), 1)
                if any(lo <= e.lo < hi for extents in self.launches for e in extents):
                    found.add(i)
        return sorted(found)

    def absorb(self, outcome) -> None:
        """Take the facts of a call's :class:`~moe_tutorial.exercises.feedback.Outcome`."""
        self.no_other, self.grids = list(outcome.no_other), list(outcome.grids)
        self.launch_count, self.inputs = outcome.launches, list(outcome.inputs_launched)

    def no_other_text(self) -> str:
        """``"`x_ptr`"`` or ``"`x_ptr`, `w_ptr`"``: the arguments loaded with a mask and no other=."""
        return ", ".join(f"`{name}`" for name in self.no_other)


class OutOfBounds(Exception):
    """A kernel in the interpreter touched memory outside every tensor of its launch.

    ``lo``: the address of the first element of the tensor the offset is counted from.
    """

    def __init__(self, op: str, program: tuple, lane: tuple, arg: str, offset: int, length: int,
                 lo: int | None = None):
        self.op, self.program, self.lane, self.arg = op, program, lane, arg
        self.offset, self.length, self.lo = offset, length, lo
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
                     "nobody wrote: an element of a new tensor or a masked-off lane of a tl.load without other= "
                     "(the checker fills both with NaN or a large negative int)")
        return text


class _Guard:
    """Refuses any access outside every tensor of the running launch."""

    def __init__(self, recorder: Recorder | None = None):
        self.extents: list[interpreter.Extent] = []
        self.recorder = recorder

    def on_launch(self, extents):
        self.extents = extents
        if self.recorder is not None:
            self.recorder.on_launch(extents)

    def check(self, op: str, ptrs, mask):
        if self.recorder is not None:
            self.recorder.on_access(interpreter.current_grid())
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
        raise OutOfBounds(_VERB[op], program, lane, ext.name, offset, (ext.hi - ext.lo) // ext.itemsize, lo=ext.lo)


_VERB = {"load": "load from", "store": "store to", "atomic": "update atomically"}


@contextlib.contextmanager
def memory_guard(recorder: Recorder | None = None):
    """Bounds-check every load, store and atomic of interpreted kernels while active.

    Allowed memory is, per launch, the elements reachable from the tensors passed to that
    launch. A bad access raises :class:`OutOfBounds` inside the kernel; Triton re-raises it
    as ``InterpreterError`` with the original as ``__cause__`` (see :func:`find_out_of_bounds`).
    Each launch's tensors are appended to ``recorder.launches`` when a :class:`Recorder` is given.
    A no-op when kernels are compiled for a GPU.
    """
    guard = _Guard(recorder)
    with interpreter.watch(guard.on_launch, guard.check):
        yield


@contextlib.contextmanager
def poisoned_masked_loads(recorder: Recorder | None = None):
    """While active, the masked-off lanes of a ``tl.load`` without ``other=`` hold poison (see
    :func:`moe_tutorial.kernels.interpreter.poison_masked_loads`); the kernel arguments read
    that way are noted in ``recorder.no_other``. A no-op when kernels are compiled for a GPU."""
    with interpreter.poison_masked_loads(recorder.on_poison if recorder is not None else None):
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


class Lazy:
    """An argument made where the student's function runs, not sent there (a sparse buffer of
    43 GB of address space cannot be copied into another process). :meth:`make` returns
    ``(the argument, a function that releases it)``."""

    def make(self) -> tuple[object, Callable[[], None]]:
        raise NotImplementedError


class SparseBuffer:
    """A float32 CPU buffer of billions of elements of which only the touched pages cost memory.

    Used to build a weight whose expert stride fits in int32 while ``expert * stride`` does not,
    as DeepSeek-V3's does, without allocating gigabytes: the pages of untouched experts' gaps
    are never written. Linux only; :meth:`create` returns None where it cannot reserve.
    """

    def __init__(self, mm: mmap.mmap):
        self._mm = mm
        self.tensor = torch.frombuffer(mm, dtype=torch.float32)
        #: The buffer's bytes ``[lo, hi)``.
        self.lo = self.tensor.data_ptr()
        self.hi = self.lo + self.tensor.numel() * 4

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


@dataclass
class SparseWeight(Lazy):
    """The weight ``[E, N, K]`` whose experts lie ``stride`` elements apart in a :class:`SparseBuffer`,
    holding ``compact``'s values: made by :meth:`make` where the student's function runs."""

    compact: torch.Tensor
    stride: int

    @property
    def shape(self) -> torch.Size:
        return self.compact.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.compact.dtype

    def make(self):
        E, N, K = self.compact.shape
        buf = SparseBuffer.create(E * self.stride)
        if buf is None:
            raise RuntimeError("could not reserve the address space of the big-stride weight")
        weight = buf.tensor.as_strided((E, N, K), (self.stride, K, 1))
        weight.copy_(self.compact)

        def release():
            nonlocal weight
            weight = None
            buf.close()
        return weight, release

    @staticmethod
    def possible(numel: int) -> bool:
        """Can this machine reserve ``numel`` float32 elements of address space?"""
        buf = SparseBuffer.create(numel)
        if buf is None:
            return False
        buf.close()
        return True
