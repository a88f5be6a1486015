"""The problem whose expert offsets pass 2**31 and 2**32, and its check (exercises 3.4 and 4.3).

DeepSeek-V3's last experts start near element 7.5e9 of their weight: ``expert * stride_we``
computed in int32 wraps around. The checkers run a student's launcher on a weight whose experts
lie :data:`BIG_STRIDE` elements apart in reserved, mostly untouched memory, in the interpreter
(on a GPU an overflowing kernel would crash the CUDA context, so there the test is skipped and
the PASS line says so), and check that the kernel read that weight itself, not a compact copy.
"""
from __future__ import annotations

import torch

from .. import runtime
from .common import FIRST_GEMM_NAMES, kernel_tolerance
from .diagnose import expect_first_gemm
from .feedback import Fail, call_student, on
from .guard import Recorder, SparseWeight
from .problems import Problem, random_first_gemm

#: The big problem's expert stride: fits in int32 (so Triton passes it as int32), but expert 2's
#: offset passes 2**31 and experts 3 and 4's pass 2**32, as DeepSeek-V3's last experts' (about 7.5e9) do.
BIG_STRIDE = 2**31 - 2**20

#: The big problem's experts: pairs of every expert, so each offset range shows.
_BIG_IDS = [[4, 0], [1, 4], [2, 3], [3, 2]]

#: Label of the problem whose experts lie BIG_STRIDE elements apart.
BIG_STRIDE_LABEL = "experts 2**31 - 2**20 elements apart"


def big_stride_problem() -> Problem | None:
    """A weight ``[5, 24, 16]`` whose experts lie ``BIG_STRIDE`` elements apart (43 GB of address
    space, a few KB of memory), so that ``expert * BIG_STRIDE`` passes ``2**31`` for expert 2 and
    ``2**32`` for experts 3 and 4. The weight is a :class:`~moe_tutorial.exercises.guard.SparseWeight`,
    made where the student's function runs.

    None where the address space cannot be reserved.
    """
    small = random_first_gemm(len(_BIG_IDS), 24, 16, 5, 2, seed=41)
    if not SparseWeight.possible(small.E * BIG_STRIDE):
        return None
    ids = torch.tensor(_BIG_IDS, dtype=torch.int32)
    return Problem(small.x, SparseWeight(small.weight, BIG_STRIDE), ids, BIG_STRIDE_LABEL, compact_weight=small.weight)


def big_stride_check(fn) -> str:
    """Run ``fn`` (a first-GEMM launcher) on :func:`big_stride_problem` in the interpreter and fail
    if its offsets wrap; returns what to add to the PASS line (what ran, or why it was skipped)."""
    if not runtime.INTERPRETED:
        return "the int32-overflow test runs only in the CPU interpreter and was skipped"
    p = big_stride_problem()
    if p is None:
        return "the int32-overflow test was skipped: could not reserve 43 GB of address space"
    with on(p.describe()):
        _expect_big_stride(fn, p)
    return "and with experts 2**31 - 2**20 elements apart, where expert * stride_we passes 2**31 and 2**32"


def _expect_big_stride(fn, p: Problem) -> None:
    recorder = Recorder()
    try:
        # No pointer hint here: the "Why" below is the hint.
        out = call_student(fn, p.x, p.weight, p.topk_ids, names=FIRST_GEMM_NAMES[:3], recorder=recorder)
    except Fail as e:
        raise Fail(f"{e}\n{_OVERFLOW}") from None
    if not recorder.launch_count:
        raise Fail("no Triton kernel ran: this exercise is about the kernel's offsets, so the launcher must launch it")
    if 1 not in recorder.inputs:
        raise Fail("the kernel never read the weight you were given: your launcher handed it a copy (.contiguous(), "
                   ".clone(), .to(...)?). A real DeepSeek-V3 weight is 7.5e9 elements whichever way it is stored, "
                   "so a copy does not avoid the overflow, and it costs a copy of every weight on every call. "
                   "Pass the weight and its strides as they are, and compute the offsets in int64.")
    try:
        expect_first_gemm(out, p, kernel_tolerance(), recorder)
    except Fail as e:
        raise Fail(f"{e}\n{_why_wrong(out, p)}") from None


def _why_wrong(out, p: Problem) -> str:
    """Which experts' pairs are wrong says how wide the student's offsets are."""
    ref = p.first_gemm_reference()
    if not isinstance(out, torch.Tensor) or out.shape != ref.shape:
        return _OVERFLOW
    close = ((out.detach().double() - ref).abs() <= 1e-3 * ref.abs().max()).all(-1)      # [M, topk]
    ids = p.topk_ids.long()
    right = {e: bool(close[ids == e].all()) for e in ids.unique().tolist()}
    past_32 = [e for e in right if e * BIG_STRIDE >= 2**32]
    below_32 = [e for e in right if 2**31 <= e * BIG_STRIDE < 2**32]
    if past_32 and below_32 and all(right[e] for e in below_32) and not any(right[e] for e in past_32):
        offsets = ", ".join(f"{e * BIG_STRIDE}" for e in past_32)
        return (f"Why: the pairs of experts {', '.join(map(str, past_32))}, whose weights start past 2**32 "
                f"({offsets} elements), are wrong, while expert {below_32[0]}'s, past 2**31 but below 2**32, are "
                "right: your offsets are 32 bits without a sign (tl.uint32?), which wrap around at 2**32 = "
                "4294967296. DeepSeek-V3's last experts start near 7.5e9: cast to int64 before multiplying, "
                "expert.to(tl.int64) * stride_we.")
    return _OVERFLOW


_OVERFLOW = (f"Why: expert e's weights start at element e * stride_we, and here stride_we = 2**31 - 2**20 = "
             f"{BIG_STRIDE} (a real model's expert stride is N * K: DeepSeek-V3's last expert starts near 7.5e9). "
             f"Expert 2's offset, {2 * BIG_STRIDE}, is past 2**31 - 1: in int32 it wraps around to "
             f"{2 * BIG_STRIDE - 2**32}. Experts 3 and 4 start past 2**32, where an unsigned 32-bit offset "
             "wraps too. Cast to int64 before multiplying: expert.to(tl.int64) * stride_we.")
