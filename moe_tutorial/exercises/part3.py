"""Checkers for Part 3, one Triton kernel: the fused tile's layout, the gather, any topk, int64.

The student's launchers are called like the package's ``fused_moe_matmul(x, weight,
topk_ids)``. In the interpreter every load and store is bounds-checked, so a wrong pointer
is reported (program, lane, tensor, how far off) instead of reading garbage or crashing.
"""
from __future__ import annotations

import torch

from .big_stride import big_stride_check
from .common import check_first_gemm_fn, first_gemm_on, hint_by_name, kernel_tolerance, summary
from .diagnose import expect_integer, expect_tensor, ranges
from .feedback import Fail, call_student, on, run_check
from .guard import int_poison
from .problems import TAILS, kernel_problems, random_first_gemm

#: Hints for an out-of-range access, by the input it reached past (x, weight, topk_ids) or else by
#: the kernel's pointer argument; names match by whole words (``out`` matches ``out_ptr``, not ``router``).
_POINTER_HINTS = [
    (("out", "output", "o", "c", "y", "dst", "result", "res"),
     "the store reached past the output: mask it with (topk_idx < topk) & (n < N), and check the output "
     "offsets pid_m * stride_om + topk_idx * stride_ot + n * stride_on."),
    (("topk_ids", "ids", "id", "idx", "indices"),
     "the expert-id load ran past topk_ids: use pid_m * stride_im + topk_idx * stride_ik and mask the "
     "spare columns (topk_idx < topk)."),
    (("weight", "weights", "w", "b", "w1", "w13", "wt"),
     "a weight load out of range: the offset is expert * stride_we + n * stride_wn + k * stride_wk; "
     "mask it with (k < K) & (n < N) (and topk_idx < topk for spare columns)."),
    (("x", "a", "inp", "input", "hidden", "hidden_states", "act", "tokens"),
     "an x load out of range: the row offset is the token (pid_m * stride_xm); mask the last K block (k < K)."),
]


def pointer_hint(arg: str) -> str:
    """The hint for an out-of-range access through the input or kernel argument called ``arg``."""
    return hint_by_name(_POINTER_HINTS, arg)


# --------------------------------------------------------------------------- 3.1
def _expected_columns(N: int, topk: int, block_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    lane = torch.arange(topk * block_n)
    pid = torch.arange(-(-N // block_n))[:, None]
    slot = (lane // block_n).expand(len(pid), -1)
    col = pid * block_n + lane % block_n
    ok = col < N
    return torch.where(ok, slot, -1), torch.where(ok, col, -1)


def _lane_text(p: int, lane: int, col: int) -> str:
    return f"program pid_n={p}, lane {lane} (column {col})"


def _layout(N: int, topk: int, block_n: int):
    """Every lane's ``(lane, pid, n)`` as ``[cdiv(N, block_n), topk * block_n]`` tables (n also past N)."""
    programs = -(-N // block_n)
    lane = torch.arange(topk * block_n).expand(programs, -1)
    pid = torch.arange(programs)[:, None].expand_as(lane)
    return lane, pid, pid * block_n + lane % block_n


def _mask_causes(N: int, topk: int, block_n: int) -> list[tuple[torch.Tensor, str]]:
    """The wrong masks students write, as ``(which lanes it keeps, what to say)``."""
    lane, pid, n = _layout(N, topk, block_n)
    return [
        (n < N - 1, "the mask is n < N - 1: an off-by-one masks a real column, N - 1. It must be n < N"),
        (n <= N, "the mask lets column N through (n <= N): one past the last column. It must be n < N"),
        (lane < N, "the mask compares the lane number with N, but lanes count across all topk slots: compare "
                   "the column, n < N"),
        (lane % block_n < N, "the mask ignores pid_n: compare the column n = pid_n * BLOCK_N + lane % BLOCK_N "
                             "with N"),
        (pid * block_n + lane < N, "the mask uses pid_n * BLOCK_N + lane, without % BLOCK_N: compare the column "
                                   "n = pid_n * BLOCK_N + lane % BLOCK_N with N"),
        (torch.ones_like(n, dtype=torch.bool), "no lane is marked -1: the last block of N is partial, so lanes "
                                               "with n >= N must be masked off (ok = n < N)"),
    ]


def _kept_lanes(got, shape) -> torch.Tensor | None:
    """Which lanes the student's tables call real (both entries not -1), or None if they are not tables."""
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return None
    if not all(isinstance(t, torch.Tensor) and tuple(t.shape) == shape and not t.is_floating_point() for t in got):
        return None
    slot, col = (t.detach().long().cpu() for t in got)
    return (slot != -1) & (col != -1)


def _expect_columns(got, N: int, topk: int, block_n: int, causes: set[int] | None = None) -> None:
    """``causes``: which of :func:`_mask_causes` fit the student's masks on every case (None: all)."""
    want_slot, want_col = _expected_columns(N, topk, block_n)
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise Fail(f"expected a pair (slot, col), got {type(got).__name__}")
    sizes = {"cdiv(N, BLOCK_N)": want_slot.shape[0], "FUSED_N": want_slot.shape[1]}
    for name, t in zip(("slot", "col"), got):
        expect_tensor(t, what=name, sizes=sizes)
        expect_integer(t, name)
    slot, col = (t.detach().long().cpu() for t in got)
    never = (slot == int_poison(got[0].dtype)) | (col == int_poison(got[1].dtype))
    if never.any():
        p = int(never.any(1).nonzero()[0])
        raise Fail(f"program pid_n={p} never wrote lanes {ranges(never[p].nonzero().flatten())} "
                   "(they still hold the checker's poison): store all FUSED_N lanes")
    if torch.equal(slot, want_slot) and torch.equal(col, want_col):
        return
    lane, pid, n = _layout(N, topk, block_n)
    want_ok, ok = n < N, (slot != -1) & (col != -1)

    # First the values on the lanes both call real: a wrong column must not be blamed on the mask.
    both = want_ok & ok
    if not (torch.equal(slot[both], want_slot[both]) and torch.equal(col[both], want_col[both])):
        if torch.equal(slot[both], (lane % block_n)[both]) and topk > 1:
            raise Fail("slot = lane % BLOCK_N: the roles of // and % are swapped. Lane l belongs to expert "
                       "slot l // BLOCK_N (0 0 0 .. 1 1 1 ..) and column l % BLOCK_N inside the block")
        if torch.equal(col[both], (lane % block_n)[both]) and (both & (pid > 0)).any():
            raise Fail("the columns ignore pid_n: program pid_n covers columns pid_n * BLOCK_N + lane % BLOCK_N")
        p, lane_ = (int(i) for i in (both & ((slot != want_slot) | (col != want_col))).nonzero()[0])
        raise Fail(f"program pid_n={p}, lane {lane_}: expected slot {int(want_slot[p, lane_])}, column "
                   f"{int(want_col[p, lane_])}; got slot {int(slot[p, lane_])}, column {int(col[p, lane_])}")

    half = (slot == -1) != (col == -1)
    if half.any():
        p, lane_ = (int(i) for i in half.nonzero()[0])
        raise Fail(f"program pid_n={p}, lane {lane_} has slot {int(slot[p, lane_])} and column {int(col[p, lane_])}: "
                   "a lane whose column does not exist is -1 in both tables (tl.where(ok, ..., -1) in both stores)")

    # Then the mask: name a cause only when the student's masks are exactly that mistake on every case.
    for i, (cause, text) in enumerate(_mask_causes(N, topk, block_n)):
        if (causes is None or i in causes) and torch.equal(ok, cause):
            p, lane_ = (int(v) for v in (ok != want_ok).nonzero()[0])
            state = "is marked -1" if want_ok[p, lane_] else "is not marked -1"
            raise Fail(f"{_lane_text(p, lane_, int(n[p, lane_]))} {state} (N = {N}): {text}")
    late = ~want_ok & ok
    if late.any():
        p, lane_ = (int(i) for i in late.nonzero()[0])
        raise Fail(f"{_lane_text(p, lane_, int(n[p, lane_]))} has column >= N = {N} but is not marked -1: "
                   "the last block of N is partial, so lanes with n >= N must be masked off")
    p, lane_ = (int(i) for i in (want_ok & ~ok).nonzero()[0])
    raise Fail(f"{_lane_text(p, lane_, int(n[p, lane_]))} is marked -1, but columns "
               f"{ranges(n[want_ok & ~ok].unique())} all exist (N = {N}): the mask must be exactly n < N, "
               "with n = pid_n * BLOCK_N + lane % BLOCK_N")


def check_fused_columns(fn) -> bool:
    """Exercise 3.1: ``fn(N, topk, block_n) -> (slot, col)``, int ``[cdiv(N, block_n), topk * block_n]``.

    Lane ``l`` of program ``pid_n`` computes expert slot ``l // block_n`` and column
    ``pid_n * block_n + l % block_n``; lanes whose column is ``>= N`` hold -1 in both. Every
    case runs before any is judged, so that a wrong mask is named by the one cause that fits all.
    """
    def hint(_arg: str) -> str:
        return "store only inside the [cdiv(N, BLOCK_N), FUSED_N] tables: row pid_n, lanes 0..FUSED_N-1."

    def body():
        cases = [(40, 2, 16), (37, 4, 8), (16, 1, 16), (5, 2, 8), (70, 4, 32)]
        results = []
        for N, topk, block_n in cases:
            with on(f"N={N}, topk={topk}, BLOCK_N={block_n}"):
                results.append(call_student(fn, N, topk, block_n, hints=hint, names=("N", "topk", "block_n")))
        causes = set(range(len(_mask_causes(*cases[0]))))
        for (N, topk, block_n), got in zip(cases, results):
            kept = _kept_lanes(got, tuple(_expected_columns(N, topk, block_n)[0].shape))
            if kept is not None:
                causes &= {i for i, (cause, _) in enumerate(_mask_causes(N, topk, block_n)) if torch.equal(kept, cause)}
        for (N, topk, block_n), got in zip(cases, results):
            with on(f"N={N}, topk={topk}, BLOCK_N={block_n}"):
                _expect_columns(got, N, topk, block_n, causes)
        return f"right on all {len(cases)} layouts (topk = 1, 2, 4; N a multiple of BLOCK_N or not)."
    return run_check("3.1", body)


# --------------------------------------------------------------------------- 3.2 and 3.3
def check_fused_matmul(fn) -> bool:
    """Exercise 3.2: the Part 3 kernel's launcher ``fn(x, weight, topk_ids) -> [M, topk, N]``, topk a power of two."""
    return check_first_gemm_fn("3.2", fn, kernel_problems(), kernel_tolerance(), hints=pointer_hint)


def check_fused_any_topk(fn) -> bool:
    """Exercise 3.3: the same launcher for any topk: 3, and DeepSeek-V2-Lite's 6."""
    return check_first_gemm_fn("3.3", fn, kernel_problems(any_topk=True), kernel_tolerance(), hints=pointer_hint)


# --------------------------------------------------------------------------- 3.4
def check_fused_int64(fn) -> bool:
    """Exercise 3.4: the launcher must survive offsets past ``2**31`` and ``2**32``: ``expert * stride_we`` in int64.

    The interpreter runs it on a weight whose expert stride is ``2**31 - 2**20`` elements,
    reserved but mostly never touched, and checks that the kernel read that weight (a launcher
    that copies it into a compact one dodges a test the real model would not). On a GPU that
    part is skipped (an overflowing kernel would crash the CUDA context); the ordinary problems
    still run.
    """
    def body():
        problems = [random_first_gemm(5, 40, 24, 6, 2, seed=1, label=TAILS),
                    random_first_gemm(4, 33, 20, 8, 3, seed=15, strided=True, ids_dtype=torch.int64,
                                      label="non-contiguous inputs, int64 ids, topk = 3")]
        for p in problems:
            with on(p.describe()):
                first_gemm_on(fn, p, kernel_tolerance(), hints=pointer_hint)
        return summary(problems, big_stride_check(fn))
    return run_check("3.4", body)
