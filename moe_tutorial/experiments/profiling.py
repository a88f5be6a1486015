"""Count what a forward pass costs besides arithmetic: kernel launches, host syncs, memory.

Everything here is measured with ``torch.profiler`` on the CPU side, where PyTorch records each
ATen operator it dispatches. That record is the same whether the tensors live on a GPU or on the
CPU, so the counts are deterministic and a laptop shows what an H200 would launch.
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.profiler import ProfilerActivity, profile

from ..layer import moe_layer
from ..routing import route

#: ATen ops that run one kernel on a GPU. Views (``view``, ``slice``, ``expand``, ...),
#: allocations (``empty``) and dispatch wrappers (``matmul``, ``to``, ``reshape``) are not here:
#: they launch nothing themselves, and whatever they call that does launch is counted instead.
KERNEL_OPS = frozenset({
    # GEMMs
    "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::mv", "aten::addmv", "aten::dot",
    # gathers and scatters
    "aten::index", "aten::index_put_", "aten::_index_put_impl_", "aten::index_add_",
    "aten::index_select", "aten::gather", "aten::scatter_", "aten::scatter_add_",
    "aten::masked_select", "aten::nonzero", "aten::bincount",
    # elementwise and reductions
    "aten::eq", "aten::ne", "aten::lt", "aten::le", "aten::gt", "aten::ge", "aten::where",
    "aten::add", "aten::add_", "aten::sub", "aten::mul", "aten::mul_", "aten::div", "aten::div_",
    "aten::silu", "aten::sigmoid", "aten::_softmax", "aten::topk", "aten::sort", "aten::cumsum",
    "aten::sum", "aten::min", "aten::max", "aten::amin", "aten::amax", "aten::aminmax",
    # copies and fills
    "aten::copy_", "aten::fill_", "aten::zero_", "aten::cat", "aten::stack",
})

#: ATen ops that make the host wait for the device: ``.item()`` copies a scalar back, and
#: ``nonzero`` (``torch.where(mask)``) must learn its output size before it can allocate it.
SYNC_OPS = frozenset({"aten::_local_scalar_dense", "aten::nonzero"})


@dataclass(frozen=True)
class LaunchCount:
    """What one call dispatched.

    Attributes:
        launches: ATen ops that would each be one GPU kernel launch (see :data:`KERNEL_OPS`).
        syncs: ops that make the host wait for the GPU (see :data:`SYNC_OPS`).
        by_op: launches per op name, most frequent first.
    """

    launches: int
    syncs: int
    by_op: dict[str, int] = field(default_factory=dict)


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 for a moment.

    Kineto, the profiler's C++ back end, prints time-stamped lines to stderr on every start and
    stop; in a notebook they would land in the stored output and differ on every run.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(devnull)
        os.close(saved)


def _profile(fn, args, kwargs, *, memory: bool = False):
    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=memory) as prof:
        fn(*args, **kwargs)
    return prof.events()


def _has_kernel_ancestor(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name in KERNEL_OPS:
            return True
        parent = parent.cpu_parent
    return False


def count_launches(fn, *args, **kwargs) -> LaunchCount:
    """Run ``fn(*args, **kwargs)`` once under ``torch.profiler`` and count its kernel launches.

    An op of :data:`KERNEL_OPS` counts once, at its outermost occurrence: when ``aten::index_add_``
    calls ``aten::scatter_add_`` on the CPU, that is still one kernel on a GPU. Triton kernels
    are not ATen ops and are not counted.

    Returns:
        A :class:`LaunchCount`; the same inputs always give the same counts.
    """
    events = _profile(fn, args, kwargs)
    ops = Counter(ev.name for ev in events if ev.name in KERNEL_OPS and not _has_kernel_ancestor(ev))
    syncs = sum(1 for ev in events if ev.name in SYNC_OPS)
    return LaunchCount(launches=sum(ops.values()), syncs=syncs, by_op=dict(ops.most_common()))


def layer_problem(num_experts: int, *, tokens: int = 2048, topk: int = 2, hidden: int = 16,
                  inter: int = 8, dtype=torch.float32, device="cpu", seed: int = 0):
    """A small random MoE layer in which every expert gets at least one token.

    Launch counts depend on how many experts have work, not on the matrix sizes, so tiny
    ``hidden``/``inter`` keep it fast while ``tokens`` makes sure every expert is busy.

    Returns:
        ``(x [tokens, hidden], w13 [E, 2*inter, hidden], w2 [E, hidden, inter],
        topk_weights [tokens, topk] fp32, topk_ids [tokens, topk] int32)``.
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g)
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=g) * hidden ** -0.5
    w2 = torch.randn(num_experts, hidden, inter, generator=g) * inter ** -0.5
    topk_weights, topk_ids = route(torch.randn(tokens, num_experts, generator=g), topk)
    idle = num_experts - int(torch.unique(topk_ids).numel())
    if idle:
        raise ValueError(f"tokens: expected enough tokens for all {num_experts} experts to get work, "
                         f"got {tokens} tokens leaving {idle} experts idle")
    to = dict(dtype=dtype, device=device)
    return x.to(**to), w13.to(**to), w2.to(**to), topk_weights.to(device), topk_ids.to(device)


def layer_launches(impl: str, num_experts: int, **problem) -> LaunchCount:
    """Kernel launches of one ``moe_layer(..., impl=impl)`` forward on :func:`layer_problem`."""
    x, w13, w2, topk_weights, topk_ids = layer_problem(num_experts, **problem)
    return count_launches(moe_layer, x, w13, w2, topk_weights, topk_ids, impl=impl)


def allocations(fn, *args, **kwargs) -> dict[str, int]:
    """Bytes each ATen op allocated itself while ``fn(*args, **kwargs)`` ran (CPU tensors).

    Keys are op names, values add up over repeated calls of the op; ``"peak"`` holds the most
    bytes live at once during the call (allocations minus frees, in time order), counting only
    what the call itself allocated.
    """
    by_op: Counter = Counter()
    changes = []
    for ev in _profile(fn, args, kwargs, memory=True):
        delta = ev.self_cpu_memory_usage
        if delta > 0:
            if ev.name != "[memory]":
                by_op[ev.name] += delta
            changes.append((ev.time_range.start, delta))
        elif delta < 0:
            # An op's own net negative is a temporary it freed before returning (matmul frees
            # the broadcast copy it made); "[memory]" events are frees at one instant.
            changes.append((ev.time_range.end, delta))
    live = peak = 0
    for _, delta in sorted(changes, key=lambda c: c[0]):
        live += delta
        peak = max(peak, live)
    return {**dict(by_op.most_common()), "peak": peak}
