"""What several checkers share: running a function over problems, tolerances, hints, summaries."""
from __future__ import annotations

import dataclasses
import re
from typing import Callable, Iterable

import torch

from .. import runtime
from ..reference import rel_error, tolerance
from .diagnose import expect_first_gemm, expect_layer
from .feedback import Fail, NotAttempted, call_student, on, run_check
from .guard import Recorder
from .problems import Problem

#: What the checkers call the inputs of a first-GEMM function and of a layer (used in messages and hints).
FIRST_GEMM_NAMES = ("x", "weight", "topk_ids", "topk_weights")
LAYER_NAMES = ("x", "w13", "w2", "topk_weights", "topk_ids")


def kernel_tolerance() -> float:
    """fp32 in the interpreter is exact to 1e-5; a GPU's tl.dot on fp32 defaults to tf32 (~1e-3)."""
    return tolerance(torch.float32) if runtime.INTERPRETED else 5e-3


def name_tokens(name: str) -> list[str]:
    """``"topk_weights_ptr"`` -> ``["topk", "weights", "ptr"]``; camelCase splits too."""
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", str(name))
    return [t for t in re.split(r"[^a-z0-9]+", name.lower()) if t]


def hint_by_name(table, arg: str) -> str:
    """The hint of the first ``(keys, hint)`` row of ``table`` with a key that is a whole part of ``arg``.

    Names are compared by their ``_``-separated words: key ``"out"`` matches ``out_ptr`` and
    ``c_out`` but not ``router_ptr``; key ``"topk_ids"`` matches ``topk_ids_ptr``.
    """
    words = name_tokens(arg)
    for keys, hint in table:
        for key in keys:
            k = name_tokens(key)
            if any(words[i:i + len(k)] == k for i in range(len(words) - len(k) + 1)):
                return hint
    return "check the offsets and the mask of that load or store."


def summary(problems: Iterable[Problem], extra: str = "") -> str:
    """``"right on all 4 problems (the worked example; topk = 1; ...)."``"""
    problems = list(problems)
    labels = [p.label for p in problems if p.label]
    count = {1: "the problem", 2: "both problems"}.get(len(problems), f"all {len(problems)} problems")
    text = f"right on {count} ({'; '.join(labels)})"
    return text + (f"; {extra}" if extra else "") + "."


def strides_note(p: Problem) -> str:
    """Added to a failure on a non-contiguous problem when the same values in contiguous tensors pass:
    which inputs are views here, with their strides."""
    N, K = p.N, p.K
    views = [f"x every other column of a wider tensor (x.stride(1) = {p.x.stride(1)})",
             f"weight the corner of a larger, padded tensor, transposed (weight.stride() = {p.weight.stride()}: "
             f"stride(0) is not N * K = {N * K}, so an expert's offset is expert * weight.stride(0))",
             f"topk_ids a transposed view (topk_ids.stride() = {p.topk_ids.stride()})"]
    if p.topk_weights is not None:
        views.append(f"topk_weights a transposed view (topk_weights.stride() = {p.topk_weights.stride()}: pass "
                     "its strides, or make a contiguous copy of it, before indexing it by pair)")
    return ("With the same values in contiguous tensors your function is right, so a stride is the fault. Here "
            + "; ".join(views) + ": take every stride from the tensors and use each one in the offsets.")


def check_first_gemm_fn(ex_id: str, fn: Callable, problems: list[Problem], tol: float, *,
                        hints: Callable[[str], str] | None = None, weighted: bool = False,
                        then: Callable[[Callable], str] | None = None) -> bool:
    """Exercise ``ex_id``: ``fn(x, weight, topk_ids[, topk_weights]) -> [M, topk, N]`` on every problem,
    then ``then(fn)`` if given (a further check, which returns what to add to the PASS line)."""
    def body() -> str:
        for p in problems:
            with on(p.describe()):
                first_gemm_on(fn, p, max(tol, tolerance(p.x.dtype)), hints=hints, weighted=weighted)
        return summary(problems, then(fn) if then else "")
    return run_check(ex_id, body)


def first_gemm_on(fn: Callable, p: Problem, tol: float, *, hints=None, weighted: bool = False) -> None:
    """Call ``fn(x, weight, topk_ids[, topk_weights])`` and compare with problem ``p``'s first GEMM.

    On a non-contiguous problem a failure is retried with contiguous copies; when those pass,
    the message says that a stride is the fault.
    """
    def attempt(q: Problem) -> None:
        args = (q.x, q.weight, q.topk_ids) + ((q.topk_weights,) if weighted else ())
        recorder = Recorder()
        out = call_student(fn, *args, hints=hints, names=FIRST_GEMM_NAMES[:len(args)], recorder=recorder)
        expect_first_gemm(out, q, tol, recorder)

    try:
        attempt(p)
    except Fail as e:
        if p.strided and _passes(attempt, contiguous_copy(p)):
            raise Fail(f"{e}\n" + strides_note(p)) from None
        if hints is not None and p.N != p.K:
            transposed = _transposed_weight(fn, weighted)
            if transposed:
                # What the failure said about the K loop or the mask follows from the swap: say the swap instead.
                raise Fail(str(e).splitlines()[0] + "\n" + transposed) from None
        raise


#: The kernels' square probe: N = K, so a weight read transposed stays in range and shows as x @ weight[e].
_SQUARE = dict(M=3, N=16, K=16, E=4, topk=2, seed=61)


def _transposed_weight(fn: Callable, weighted: bool) -> str:
    """A kernel that swaps the weight's N and K strides reads out of range, or a K loop that seems to stop
    early, when N != K. On a square problem the same kernel computes x @ weight[e]: if it does, say so."""
    from .problems import random_first_gemm

    q = random_first_gemm(**_SQUARE, weighted=weighted)
    args = (q.x, q.weight, q.topk_ids) + ((q.topk_weights,) if weighted else ())
    try:
        out = call_student(fn, *args, names=FIRST_GEMM_NAMES[:len(args)])
    except (Fail, NotAttempted):
        return ""
    # weight[e] used as if it were [K, N]: out[m, j, n] = sum_k x[m, k] * weight[e, k, n].
    swapped = torch.einsum("mk,mjkn->mjn", q.x.double(), q.weight.double()[q.topk_ids.long()])
    if q.topk_weights is not None:
        swapped = swapped * q.topk_weights.double()[..., None]
    if not isinstance(out, torch.Tensor) or out.shape != swapped.shape or \
            rel_error(out.detach().double(), swapped) > 1e-3:
        return ""
    return ("your kernel reads each expert's weight transposed: on a problem with N = K = 16, where that stays in "
            "range, your output is x @ weight[e] instead of x @ weight[e].T. weight is [E, N, K]: element (n, k) "
            "of expert e is at expert * stride_we + n * stride_wn + k * stride_wk (stride_wn = weight.stride(1) "
            "moves along N, stride_wk = weight.stride(2) along K), and your offsets swap the two.")


def contiguous_copy(p: Problem) -> Problem:
    """Problem ``p`` with every input a contiguous copy of the same values."""
    def c(t):
        return None if t is None else t.contiguous()
    return dataclasses.replace(p, x=c(p.x), weight=c(p.weight), topk_ids=c(p.topk_ids), w2=c(p.w2),
                               topk_weights=c(p.topk_weights), strided=False)


def _passes(attempt: Callable[[Problem], None], q: Problem) -> bool:
    try:
        attempt(q)
    except (Fail, NotAttempted):
        return False
    return True


def check_layer_fn(ex_id: str, fn: Callable, problems: list[Problem]) -> bool:
    """Exercise ``ex_id``: ``fn(x, w13, w2, topk_weights, topk_ids) -> [M, K]`` on every problem."""
    def attempt(q: Problem) -> None:
        out = call_student(fn, q.x, q.weight, q.w2, q.topk_weights, q.topk_ids, names=LAYER_NAMES)
        expect_layer(out, q, tolerance(q.x.dtype))

    def body() -> str:
        for p in problems:
            with on(p.describe()):
                try:
                    attempt(p)
                except Fail as e:
                    if p.strided and _passes(attempt, contiguous_copy(p)):
                        raise Fail(f"{e}\nWith the same values in contiguous tensors your function is right, so "
                                   "it assumes a layout: x, w2 and topk_weights here are views with other strides. "
                                   "Index the tensors (or .reshape them), do not .view or assume their "
                                   "strides.") from None
                    raise
        return summary(problems)
    return run_check(ex_id, body)
