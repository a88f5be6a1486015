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
from dataclasses import dataclass

import numpy as np
import torch
import triton.language as tl

from .. import runtime

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


@dataclass
class _Extent:
    name: str
    lo: int          # first byte of the view
    hi: int          # one past the last byte it can reach
    itemsize: int


def _extent(name: str, t: torch.Tensor) -> _Extent:
    lo = t.data_ptr()
    if t.numel() == 0:
        return _Extent(name, lo, lo, t.element_size())
    reach = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    return _Extent(name, lo, lo + reach * t.element_size(), t.element_size())


#: Attribute of an interpreter TensorHandle naming the kernel argument a pointer was built from.
_BASE = "_moe_tutorial_base"


class _Guard:
    def __init__(self, interp):
        self.interp = interp
        self.extents: list[_Extent] = []

    def record(self, executor, args_hst, kwargs_hst):
        names = list(executor.arg_names)
        pairs = list(zip(names, args_hst)) + list(kwargs_hst.items())
        self.extents = [_extent(n, a) for n, a in pairs if isinstance(a, torch.Tensor)]

    def tag(self, arg, converted):
        """Mark a pointer argument's handle with the argument's name (see :func:`memory_guard`)."""
        if isinstance(arg, torch.Tensor) and hasattr(converted, "handle"):
            names = [e.name for e in self.extents if e.lo == arg.data_ptr()]
            if names:
                setattr(converted.handle, _BASE, names[0])
        return converted

    def check(self, op: str, ptrs, mask):
        addrs = np.asarray(ptrs.data, dtype=np.uint64)
        active = np.ones(addrs.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask.data, bool), addrs.shape)
        itemsize = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
        ok = ~active
        for ext in self.extents:
            ok = ok | ((addrs >= ext.lo) & (addrs + itemsize <= ext.hi))
        if ok.all():
            return
        lane = tuple(int(i) for i in np.argwhere(~ok)[0])
        addr = int(addrs[lane]) if addrs.ndim else int(addrs)
        if not self.extents:
            raise OutOfBounds(op, self._program(), lane, "?", addr, 0)
        # Report the offset from the argument the pointer was built from (else the nearest tensor).
        base = getattr(ptrs, _BASE, None)
        named = [e for e in self.extents if e.name == base]
        ext = named[0] if named else min(
            self.extents, key=lambda e: 0 if e.lo <= addr < e.hi else min(abs(addr - e.lo), abs(addr - e.hi)))
        offset = (addr - ext.lo) // ext.itemsize
        raise OutOfBounds(op, self._program(), lane, ext.name, offset, (ext.hi - ext.lo) // ext.itemsize)

    def _program(self) -> tuple:
        """The running program's ids, trailing axes of size 1 dropped: ``(pid_m, pid_n)`` or ``(pid,)``."""
        builder = self.interp.interpreter_builder
        idx, dims = list(builder.grid_idx or (0,)), list(builder.grid_dim or (1,))
        while len(idx) > 1 and dims[len(idx) - 1] == 1:
            idx.pop()
        return tuple(int(i) for i in idx)


@contextlib.contextmanager
def memory_guard():
    """Bounds-check every load, store and atomic of interpreted kernels while active.

    Allowed memory is, per launch, the elements reachable from the tensors passed to that
    launch. A bad access raises :class:`OutOfBounds` inside the kernel; Triton re-raises it
    as ``InterpreterError`` with the original as ``__cause__`` (see :func:`find_out_of_bounds`).
    A no-op when kernels are compiled for a GPU.
    """
    if not runtime.INTERPRETED:
        yield
        return
    from triton.runtime import interpreter as interp

    guard = _Guard(interp)
    builder = interp.interpreter_builder
    executor_cls = interp.GridExecutor
    orig_init = executor_cls._init_args_hst

    def init_args(self, args_dev, kwargs):
        args_hst, kwargs_hst = orig_init(self, args_dev, kwargs)
        guard.record(self, args_hst, kwargs_hst)
        return args_hst, kwargs_hst

    def guarded(name, op, ptr_pos, mask_pos):
        orig = getattr(builder, name)

        def method(*args):
            guard.check(op, args[ptr_pos], None if mask_pos is None else args[mask_pos])
            return orig(*args)
        return method

    def propagating(orig):
        # A pointer built from a tagged pointer (addptr, broadcast, expand_dims, ...) keeps the tag.
        def method(*args):
            out = orig(*args)
            if isinstance(out, interp.TensorHandle) and isinstance(out.dtype, tl.pointer_type):
                base = next((getattr(a, _BASE) for a in args if hasattr(a, _BASE)), None)
                if base is not None:
                    setattr(out, _BASE, base)
            return out
        return method

    patches = {name: propagating(getattr(builder, name)) for name in dir(builder)
               if name.startswith("create_") and callable(getattr(builder, name))}
    patches.update({    # argument positions as the interpreter's builder takes them
        "create_masked_load": guarded("create_masked_load", "load from", 0, 1),
        "create_masked_store": guarded("create_masked_store", "store to", 0, 2),
        "create_atomic_rmw": guarded("create_atomic_rmw", "update atomically", 1, 3),
        "create_atomic_cas": guarded("create_atomic_cas", "update atomically", 0, None),
    })
    orig_cvt = interp._implicit_cvt
    try:
        executor_cls._init_args_hst = init_args
        interp._implicit_cvt = lambda arg: guard.tag(arg, orig_cvt(arg))
        for name, method in patches.items():
            setattr(builder, name, method)
        yield
    finally:
        executor_cls._init_args_hst = orig_init
        interp._implicit_cvt = orig_cvt
        for name in patches:
            # The originals are bound methods of the class: dropping the instance attribute restores them.
            builder.__dict__.pop(name, None)


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
