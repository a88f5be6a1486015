"""Argument checks for the figure helpers: a reader who edits a cell gets one clear sentence.

A notebook invites edits ("try M = 5, topk = 3", "move the explorer to pid_n = 4"). Without
checks a bad value surfaces deep inside matplotlib or as an IndexError about some list; with
them the error names the argument, the range it must lie in and why, and what was given, in
the house form ``name: expected ..., got ...``.
"""
from __future__ import annotations

import math

from ..checks import fail

__all__ = ["fail", "check_int", "check_power_of_two", "id_rows"]   # fail: the package's one, for the figures


def check_int(name: str, value, lo: int | None = None, hi: int | None = None, why: str = "") -> int:
    """``value`` must be an int (not a bool) with ``lo <= value < hi`` (either bound optional)."""
    if isinstance(value, bool) or not isinstance(value, int):
        if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:   # a 0-d tensor or numpy int
            value = value.item()
        if isinstance(value, bool) or not isinstance(value, int):
            fail(TypeError, name, "an int", f"{type(value).__name__} {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value >= hi):
        if lo is not None and hi is not None:
            bound = f"{lo} <= {name} < {hi}" if hi - lo > 1 else f"{name} = {lo}"
        elif lo is not None:
            bound = f"{name} >= {lo}"
        else:
            bound = f"{name} < {hi}"
        fail(ValueError, name, bound + (f" ({why})" if why else ""), value)
    return value


def check_power_of_two(name: str, value, why: str = "the kernel's tl.arange takes only powers of two") -> int:
    """``value`` must be a positive power of two: the block sizes the kernels accept."""
    check_int(name, value, 1)
    if value & (value - 1):
        fail(ValueError, name, f"a power of two ({why})", value)
    return value


def id_rows(name: str, topk_ids) -> list[list[int]]:
    """``topk_ids`` (a 2-D tensor or a list of equal-length lists) as nested Python ints."""
    rows = topk_ids.tolist() if hasattr(topk_ids, "tolist") else topk_ids
    if not isinstance(rows, (list, tuple)) or not rows or not all(isinstance(r, (list, tuple)) for r in rows):
        shape = tuple(topk_ids.shape) if hasattr(topk_ids, "shape") else type(topk_ids).__name__
        fail(ValueError, name, "a 2-D [M, topk] table of expert ids with M >= 1", shape)
    widths = {len(r) for r in rows}
    if len(widths) != 1 or 0 in widths:
        fail(ValueError, name, "rows of one length topk >= 1", f"row lengths {sorted(widths)}")
    return [[int(e) for e in r] for r in rows]


def check_ids_below(name: str, rows: list[list[int]], num_experts: int) -> None:
    """Every id of ``rows`` must be an expert of ``[0, num_experts)``."""
    check_int("num_experts", num_experts, 1)
    flat = [e for r in rows for e in r]
    bad = [e for e in flat if not 0 <= e < num_experts]
    if bad:
        fail(ValueError, name, f"expert ids in [0, num_experts={num_experts})", f"an id of {bad[0]}")


def check_same_shape(name: str, t, like_name: str, like) -> None:
    """``t`` must have ``like``'s shape (tensors or anything with ``.shape``)."""
    if tuple(t.shape) != tuple(like.shape):
        fail(ValueError, name, f"{like_name}'s shape {tuple(like.shape)}", f"shape {tuple(t.shape)}")


def check_program(pid_m: int, pid_n: int, M: int, N: int, block_n: int) -> None:
    """``(pid_m, pid_n)`` must be a program of Part 3's grid ``(M, cdiv(N, BLOCK_N))``."""
    check_int("pid_m", pid_m, 0, M, f"one program per token: the grid's axis 0 has M = {M} programs")
    blocks = math.ceil(N / block_n)
    check_int("pid_n", pid_n, 0, blocks,
              f"the grid's axis 1 has cdiv(N={N}, BLOCK_N={block_n}) = {blocks} column blocks")


def check_k_step(k_step: int, K: int, block_k: int) -> None:
    """``k_step`` must be a turn of the K loop: ``0 <= k_step < cdiv(K, BLOCK_K)``."""
    steps = math.ceil(K / block_k)
    check_int("k_step", k_step, 0, steps, f"the K loop makes cdiv(K={K}, BLOCK_K={block_k}) = {steps} steps")
