"""Watching Triton's CPU interpreter run a kernel: each launch's tensors, every load and store of every program.

In the interpreter a kernel is plain Python and its pointers are numbers. :func:`watch` hooks
the interpreter's builder so that a callback sees, before each access happens, which program
makes it, which kernel argument the pointer was built from, the element addresses and the mask.
Two tools build on it:

- :func:`trace_program` records what one program reads and writes, as element offsets from the
  start of each tensor argument, so a notebook or a test can compare a kernel's real index
  arithmetic with the same arithmetic written in plain torch.
- The exercises' memory guard (:func:`moe_tutorial.exercises.guard.memory_guard`) stops an
  access outside every tensor of the launch before it happens.

:func:`poison_masked_loads` changes one thing the interpreter does: the masked-off lanes of a
``tl.load`` without ``other=`` get poison instead of zeros, as undefined as they are on a GPU.

Nothing here works on a GPU, where kernels are compiled: there :func:`watch` does nothing.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import triton.language as tl

from .. import runtime


@dataclass(frozen=True)
class Extent:
    """The bytes one tensor argument of a launch can reach: ``[lo, hi)``."""

    name: str
    lo: int
    hi: int
    itemsize: int

    @classmethod
    def of(cls, name: str, t: torch.Tensor) -> "Extent":
        lo = t.data_ptr()
        if t.numel() == 0:
            return cls(name, lo, lo, t.element_size())
        reach = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
        return cls(name, lo, lo + reach * t.element_size(), t.element_size())


@dataclass(frozen=True)
class Access:
    """One load, store or atomic of one program.

    ``offsets`` are element offsets from the first element of argument ``arg``, shaped like the
    block that made the access (what the kernel added to ``arg``'s pointer); ``mask`` says which
    lanes touch memory (all of them for an unmasked access).
    """

    op: str                 # "load", "store" or "atomic"
    program: tuple
    arg: str | None
    offsets: np.ndarray
    mask: np.ndarray

    def active(self) -> np.ndarray:
        """The offsets of the lanes that touch memory, flattened in lane order."""
        return self.offsets[self.mask]


#: Attribute of an interpreter TensorHandle naming the kernel argument a pointer was built from.
_BASE = "_moe_tutorial_base"

#: The builder methods that touch memory: (operation, position of the pointers, of the mask).
_ACCESSES = {
    "create_masked_load": ("load", 0, 1),
    "create_masked_store": ("store", 0, 2),
    "create_atomic_rmw": ("atomic", 1, 3),
    "create_atomic_cas": ("atomic", 0, None),
}


def current_program() -> tuple:
    """The running program's ids, trailing axes of size 1 dropped: ``(pid_m, pid_n)`` or ``(pid,)``."""
    from triton.runtime import interpreter as interp

    builder = interp.interpreter_builder
    idx, dims = list(builder.grid_idx or (0,)), list(builder.grid_dim or (1,))
    while len(idx) > 1 and dims[len(idx) - 1] == 1:
        idx.pop()
    return tuple(int(i) for i in idx)


def current_grid() -> tuple:
    """The running launch's grid, all three axes: ``(x, y, z)``."""
    from triton.runtime import interpreter as interp

    return tuple(int(d) for d in (interp.interpreter_builder.grid_dim or (1, 1, 1)))


def addresses(ptrs) -> np.ndarray:
    """The byte addresses an interpreter pointer block holds."""
    return np.asarray(ptrs.data, dtype=np.uint64)


def lane_mask(ptrs, mask) -> np.ndarray:
    """Which lanes of ``ptrs`` an access touches, as a boolean array of the block's shape."""
    shape = np.shape(ptrs.data)
    return np.ones(shape, bool) if mask is None else np.broadcast_to(np.asarray(mask.data, bool), shape)


def base_of(ptrs) -> str | None:
    """The name of the kernel argument ``ptrs`` was built from, if it was built from one."""
    return getattr(ptrs, _BASE, None)


def _tensor_args(pairs):
    """The tensors among a launch's ``(name, value)`` arguments; a tuple argument's tensors are
    named by their place in it (``alignment[0]``), as the kernel unpacks them."""
    for name, value in pairs:
        if isinstance(value, torch.Tensor):
            yield name, value
        elif isinstance(value, tuple):
            yield from _tensor_args((f"{name}[{i}]", v) for i, v in enumerate(value))


@contextlib.contextmanager
def watch(on_launch: Callable[[list[Extent]], None] | None = None,
          on_access: Callable[[str, object, object], None] | None = None):
    """While active, call ``on_launch(extents)`` as each interpreted launch starts and
    ``on_access(op, ptrs, mask)`` before each of its loads, stores and atomics.

    ``ptrs`` and ``mask`` are the interpreter's handles (see :func:`addresses`,
    :func:`lane_mask`, :func:`base_of`); :func:`current_program` says which program runs. An
    exception raised by a callback stops the kernel (Triton re-raises it as ``InterpreterError``
    with the original as ``__cause__``). A no-op when kernels are compiled for a GPU.
    """
    if not runtime.INTERPRETED:
        yield
        return
    from triton.runtime import interpreter as interp

    builder = interp.interpreter_builder
    executor_cls = interp.GridExecutor
    orig_init = executor_cls._init_args_hst
    extents: list[Extent] = []

    def init_args(self, args_dev, kwargs):
        args_hst, kwargs_hst = orig_init(self, args_dev, kwargs)
        pairs = list(zip(self.arg_names, args_hst)) + list(kwargs_hst.items())
        extents[:] = [Extent.of(n, a) for n, a in _tensor_args(pairs)]
        if on_launch is not None:
            on_launch(list(extents))
        return args_hst, kwargs_hst

    def tag(arg, converted):
        # A tensor argument becomes a pointer handle: remember which argument it was.
        if isinstance(arg, torch.Tensor) and hasattr(converted, "handle"):
            names = [e.name for e in extents if e.lo == arg.data_ptr()]
            if names:
                setattr(converted.handle, _BASE, names[0])
        return converted

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

    def observed(name):
        orig = getattr(builder, name)
        op, ptr_pos, mask_pos = _ACCESSES[name]

        def method(*args):
            if on_access is not None:
                on_access(op, args[ptr_pos], None if mask_pos is None else args[mask_pos])
            return orig(*args)
        return method

    patches = {name: propagating(getattr(builder, name)) for name in dir(builder)
               if name.startswith("create_") and callable(getattr(builder, name))}
    patches.update({name: observed(name) for name in _ACCESSES})
    orig_cvt = interp._implicit_cvt
    try:
        executor_cls._init_args_hst = init_args
        interp._implicit_cvt = lambda arg: tag(arg, orig_cvt(arg))
        with _patched(builder, patches):
            yield
    finally:
        executor_cls._init_args_hst = orig_init
        interp._implicit_cvt = orig_cvt


@contextlib.contextmanager
def _patched(builder, methods: dict):
    """Set ``methods`` on the interpreter's builder, and put back exactly what was there before.

    Restoring the previous instance attribute (not just dropping ours) lets patches nest: a
    :func:`watch` inside :func:`poison_masked_loads`, or the other way round, leaves the outer one working.
    """
    saved = {name: builder.__dict__[name] for name in methods if name in builder.__dict__}
    try:
        for name, method in methods.items():
            setattr(builder, name, method)
        yield
    finally:
        for name in methods:
            if name in saved:
                setattr(builder, name, saved[name])
            else:
                # The originals are bound methods of the class: dropping the instance attribute restores them.
                builder.__dict__.pop(name, None)


#: What :func:`poison_masked_loads` puts in the masked-off lanes of a float load without ``other=``:
#: a quiet NaN with its own payload, so that a NaN in a result can be traced back to such a lane.
POISON_NAN_BITS = {np.dtype(np.float32): 0x7FC0BAD0, np.dtype(np.float64): 0x7FF80BAD00000000,
                   np.dtype(np.float16): 0x7E5D}


#: What :func:`poison_masked_loads` puts in the masked-off lanes of a 32- or 64-bit signed integer load
#: without ``other=``: large, negative and odd, so that an offset built from it (``expert * stride``,
#: even after int32 wraps around) lands far outside every tensor. The most negative int would not:
#: ``-2**31 * stride`` wraps to 0 in int32 whenever the stride is even.
POISON_INT = -0x5A5A5A5B


def poison_value(dtype) -> object:
    """The poison :func:`poison_masked_loads` writes for a numpy ``dtype``: a NaN with the payload of
    :data:`POISON_NAN_BITS` for floats, :data:`POISON_INT` for 32- and 64-bit signed integers (the most
    negative value for narrower ones), the largest value for unsigned ones; None for booleans (left as
    they are)."""
    dtype = np.dtype(dtype)
    if dtype in POISON_NAN_BITS:
        bits = np.array(POISON_NAN_BITS[dtype], dtype=f"u{dtype.itemsize}")
        return bits.view(dtype)[()]
    if dtype.kind == "f":
        return dtype.type(np.nan)
    if dtype.kind == "i":
        return dtype.type(POISON_INT) if dtype.itemsize >= 4 else np.iinfo(dtype).min
    if dtype.kind == "u":
        return np.iinfo(dtype).max
    return None


def is_poison_nan(values: torch.Tensor) -> torch.Tensor:
    """Elementwise: does a float32/float64/float16 tensor hold :func:`poison_masked_loads`' NaN?"""
    np_dtype = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16}.get(values.dtype)
    if np_dtype is None:
        return torch.zeros(values.shape, dtype=torch.bool)
    int_dtype = {4: torch.int32, 8: torch.int64, 2: torch.int16}[values.element_size()]
    bits = int(np.array(POISON_NAN_BITS[np.dtype(np_dtype)], dtype=f"u{values.element_size()}")
               .view(f"i{values.element_size()}"))
    return values.detach().cpu().contiguous().view(int_dtype) == bits


@contextlib.contextmanager
def poison_masked_loads(on_poison: Callable[[object, np.ndarray], None] | None = None):
    """While active, a masked ``tl.load`` without ``other=`` fills its masked-off lanes with poison.

    On a GPU those lanes hold whatever was in the registers; the interpreter gives 0, which
    hides code that uses them (a ``[BLOCK_K]`` row of ``x`` loaded without ``other=0.0`` times a
    weight tile masked with ``other=0.0`` is right in the interpreter, NaN or garbage on a GPU).
    Here floats get a NaN whose payload :func:`is_poison_nan` recognises, signed integers
    :data:`POISON_INT` (an address built from it is far out of range). ``on_poison(ptrs,
    lanes)`` is called for every such load with masked-off lanes (``lanes``: boolean, the
    block's shape), before it happens. Loads with ``other=`` and unmasked loads are unchanged.
    A no-op when kernels are compiled for a GPU.
    """
    if not runtime.INTERPRETED:
        yield
        return
    from triton.runtime import interpreter as interp

    builder = interp.interpreter_builder
    orig = getattr(builder, "create_masked_load")

    def create_masked_load(ptrs, mask, other, *rest):
        if other is None and mask is not None:
            off = ~np.broadcast_to(np.asarray(mask.data, bool), np.shape(ptrs.data))
            if off.any():
                if on_poison is not None:
                    on_poison(ptrs, off)
                out = orig(ptrs, mask, other, *rest)
                value = poison_value(out.data.dtype)
                if value is not None:
                    data = np.array(out.data, copy=True)
                    data[off] = value
                    out = type(out)(data, out.dtype)
                return out
        return orig(ptrs, mask, other, *rest)

    with _patched(builder, {"create_masked_load": create_masked_load}):
        yield


def trace_program(launch: Callable[[], object], program: tuple) -> list[Access]:
    """Run ``launch()`` in the interpreter and return every access program ``program`` made, in order.

    ``program`` is the program's ids, ``(pid_m, pid_n)`` for a 2-D grid, ``(pid,)`` for a 1-D
    one (missing axes count as 0). Offsets are in elements from the first element of
    the argument each pointer was built from. Raises RuntimeError on a GPU, where kernels do not
    run in Python, and ValueError when that program never ran (outside the launch's grid).
    """
    if not runtime.INTERPRETED:
        raise RuntimeError("trace_program needs Triton's interpreter (no GPU, or TRITON_INTERPRET=1)")
    program = _padded(program)
    extents: dict[str, Extent] = {}
    seen: set[tuple] = set()
    accesses: list[Access] = []

    def on_launch(launch_extents):
        extents.clear()
        extents.update({e.name: e for e in launch_extents})

    def on_access(op, ptrs, mask):
        here = _padded(current_program())
        seen.add(here)
        if here != program:
            return
        arg = base_of(ptrs)
        addr = addresses(ptrs).astype(np.int64)
        ext = extents.get(arg)
        offsets = (addr - ext.lo) // ext.itemsize if ext else addr
        accesses.append(Access(op, current_program(), arg, offsets, lane_mask(ptrs, mask).copy()))

    with watch(on_launch, on_access):
        launch()
    if program not in seen:
        ran = sorted(seen)
        span = f"ids from {ran[0]} to {ran[-1]}" if ran else "none touched memory"
        raise ValueError(f"program: expected a program of the launch (ids as (x, y, z): {span}), got {program}")
    return accesses


def _padded(program) -> tuple:
    ids = tuple(int(p) for p in program)
    return ids + (0,) * (3 - len(ids))
