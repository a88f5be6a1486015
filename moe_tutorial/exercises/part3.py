"""Checkers for Part 3, one Triton kernel: the fused tile's layout, the gather, any topk, int64.

The student's launchers are called like the package's ``fused_moe_matmul(x, weight,
topk_ids)``. In the interpreter every load and store is bounds-checked, so a wrong pointer
is reported (program, lane, tensor, how far off) instead of reading garbage or crashing.
"""
from __future__ import annotations

import torch

from .. import runtime
from .common import check_first_gemm_fn, hint_by_name, kernel_tolerance, summary
from .diagnose import expect_first_gemm, expect_tensor, ranges
from .feedback import Fail, call_student, on, run_check
from .guard import SparseBuffer
from .problems import TAILS, Problem, kernel_problems, random_first_gemm

#: Hints for an out-of-range access, by what the kernel's pointer argument is called.
_POINTER_HINTS = [
    (("out", "o_ptr", "c_ptr", "y_ptr"),
     "the store reached past the output: mask it with (topk_idx < topk) & (n < N), and check the output "
     "offsets pid_m * stride_om + topk_idx * stride_ot + n * stride_on."),
    (("id",),
     "the expert-id load ran past topk_ids: use pid_m * stride_im + topk_idx * stride_ik and mask the "
     "spare columns (topk_idx < topk)."),
    (("w", "b_ptr"),
     "a weight load out of range: the offset is expert * stride_we + n * stride_wn + k * stride_wk; "
     "mask it with (k < K) & (n < N) (and topk_idx < topk for spare columns)."),
    (("x", "a_ptr"),
     "an x load out of range: the row offset is the token (pid_m * stride_xm); mask the last K block (k < K)."),
]


def pointer_hint(arg: str) -> str:
    """The hint for an out-of-range access through the kernel argument called ``arg``."""
    return hint_by_name(_POINTER_HINTS, arg)


# --------------------------------------------------------------------------- 3.1
def _expected_columns(N: int, topk: int, block_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    lane = torch.arange(topk * block_n)
    pid = torch.arange(-(-N // block_n))[:, None]
    slot = (lane // block_n).expand(len(pid), -1)
    col = pid * block_n + lane % block_n
    ok = col < N
    return torch.where(ok, slot, -1), torch.where(ok, col, -1)


def _expect_columns(got, N: int, topk: int, block_n: int) -> None:
    want_slot, want_col = _expected_columns(N, topk, block_n)
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise Fail(f"expected a pair (slot, col), got {type(got).__name__}")
    sizes = {"cdiv(N, BLOCK_N)": want_slot.shape[0], "FUSED_N": want_slot.shape[1]}
    for name, t in zip(("slot", "col"), got):
        expect_tensor(t, what=name, sizes=sizes)
    slot, col = (t.detach().long().cpu() for t in got)
    never = (slot == torch.iinfo(got[0].dtype).min) | (col == torch.iinfo(got[1].dtype).min)
    if never.any():
        p = int(never.any(1).nonzero()[0])
        raise Fail(f"program pid_n={p} never wrote lanes {ranges(never[p].nonzero().flatten())} "
                   "(they still hold the checker's poison): store all FUSED_N lanes")
    if torch.equal(slot, want_slot) and torch.equal(col, want_col):
        return
    valid = want_col >= 0
    lane = torch.arange(topk * block_n).expand_as(slot)
    if torch.equal(slot[valid], (lane % block_n)[valid]):
        raise Fail("slot = lane % BLOCK_N: the roles of // and % are swapped. Lane l belongs to expert "
                   "slot l // BLOCK_N (0 0 0 .. 1 1 1 ..) and column l % BLOCK_N inside the block")
    if torch.equal(col[valid], (lane % block_n)[valid]) and len(slot) > 1:
        raise Fail("the columns ignore pid_n: program pid_n covers columns pid_n * BLOCK_N + lane % BLOCK_N")
    if torch.equal(slot[valid], want_slot[valid]) and torch.equal(col[valid], want_col[valid]):
        late = (~valid) & (col >= 0)
        if late.any():
            p, lane_ = (int(i) for i in late.nonzero()[0])
            raise Fail(f"program pid_n={p}, lane {lane_} has column {int(col[p, lane_])} >= N = {N} but is not "
                       "marked -1: the last block of N is partial, so lanes with n >= N must be masked off")
    early = valid & ((col < 0) | (slot < 0))
    if early.any():
        p, lane_ = (int(i) for i in early.nonzero()[0])
        raise Fail(f"program pid_n={p}, lane {lane_} (column {int(want_col[p, lane_])} < N = {N}) is marked -1: "
                   "the mask is n < N (an off-by-one masks a real column)")
    p, lane_ = (int(i) for i in ((slot != want_slot) | (col != want_col)).nonzero()[0])
    raise Fail(f"program pid_n={p}, lane {lane_}: expected slot {int(want_slot[p, lane_])}, column "
               f"{int(want_col[p, lane_])}; got slot {int(slot[p, lane_])}, column {int(col[p, lane_])}")


def check_fused_columns(fn) -> bool:
    """Exercise 3.1: ``fn(N, topk, block_n) -> (slot, col)``, int ``[cdiv(N, block_n), topk * block_n]``.

    Lane ``l`` of program ``pid_n`` computes expert slot ``l // block_n`` and column
    ``pid_n * block_n + l % block_n``; lanes whose column is ``>= N`` hold -1 in both.
    """
    def body():
        cases = [(40, 2, 16), (37, 4, 8), (16, 1, 16), (5, 2, 8)]
        for N, topk, block_n in cases:
            with on(f"N={N}, topk={topk}, BLOCK_N={block_n}"):
                _expect_columns(call_student(fn, N, topk, block_n, hints=lambda a: "store only inside the "
                                             "[cdiv(N, BLOCK_N), FUSED_N] tables: row pid_n, lanes 0..FUSED_N-1."),
                                N, topk, block_n)
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
#: The big problem's expert stride: fits in int32, but 4 * stride does not (like DeepSeek-V3's).
BIG_STRIDE = 2**29 + 4096


def big_stride_problem() -> tuple[Problem, SparseBuffer] | None:
    """A weight ``[5, 24, 16]`` whose experts lie ``BIG_STRIDE`` elements apart (8.6 GB of address
    space, a few KB of memory), so that expert 4's offset ``4 * BIG_STRIDE`` passes ``2**31 - 1``.

    None where the address space cannot be reserved.
    """
    small = random_first_gemm(3, 24, 16, 5, 2, seed=41)
    E, N, K = small.weight.shape
    buf = SparseBuffer.create(E * BIG_STRIDE)
    if buf is None:
        return None
    weight = buf.tensor.as_strided((E, N, K), (BIG_STRIDE, K, 1))
    weight.copy_(small.weight)
    ids = torch.tensor([[4, 0], [1, 4], [2, 3]], dtype=torch.int32)   # expert 4 in two of three tokens
    problem = Problem(small.x, weight, ids, "experts 2**29 + 4096 elements apart", compact_weight=small.weight)
    return problem, buf


def check_fused_int64(fn) -> bool:
    """Exercise 3.4: the launcher must survive offsets past ``2**31``: ``expert * stride_we`` in int64.

    The interpreter runs it on a weight whose expert stride is ``2**29 + 4096`` elements,
    reserved but mostly never touched. On a GPU that part is skipped (an overflowing kernel
    would crash the CUDA context); the ordinary problem still runs.
    """
    def body():
        problems = [random_first_gemm(5, 40, 24, 6, 2, seed=1, label=TAILS)]
        for p in problems:
            with on(p.describe()):
                expect_first_gemm(call_student(fn, p.x, p.weight, p.topk_ids, hints=pointer_hint), p, kernel_tolerance())
        if not runtime.INTERPRETED:
            return summary(problems, "the int32-overflow test runs only in the CPU interpreter and was skipped")
        made = big_stride_problem()
        if made is None:
            return summary(problems, "the int32-overflow test was skipped: could not reserve 8.6 GB of address space")
        p, buf = made
        try:
            with on(p.describe()):
                try:
                    # No pointer hint here: the "Why" below is the hint.
                    expect_first_gemm(call_student(fn, p.x, p.weight, p.topk_ids), p, kernel_tolerance())
                except Fail as e:
                    raise Fail(f"{e}\n{_OVERFLOW}") from None
        finally:
            p.weight = None
            buf.close()
        return summary(problems, "and with experts 2**29 + 4096 elements apart, where expert * stride_we "
                                 "passes 2**31")
    return run_check("3.4", body)


_OVERFLOW = (f"Why: expert 4's weights start at element 4 * stride_we = 4 * {BIG_STRIDE} = {4 * BIG_STRIDE}, "
             f"past 2**31 - 1. In int32 that offset wraps around to {4 * BIG_STRIDE - 2**32}. "
             "Cast before multiplying: expert.to(tl.int64) * stride_we.")
