"""What several checkers share: running a function over problems, tolerances, summaries."""
from __future__ import annotations

from typing import Callable, Iterable

import torch

from .. import runtime
from ..reference import tolerance
from .diagnose import expect_first_gemm, expect_layer
from .feedback import call_student, on, run_check
from .problems import Problem


def kernel_tolerance() -> float:
    """fp32 in the interpreter is exact to 1e-5; a GPU's tl.dot on fp32 defaults to tf32 (~1e-3)."""
    return tolerance(torch.float32) if runtime.INTERPRETED else 5e-3


def hint_by_name(table, arg: str) -> str:
    """The hint of the first ``(keys, hint)`` row of ``table`` whose key is in the name ``arg``."""
    name = arg.lower()
    for keys, hint in table:
        if any(k in name for k in keys):
            return hint
    return "check the offsets and the mask of that load or store."


def summary(problems: Iterable[Problem], extra: str = "") -> str:
    """``"right on all 4 problems (the worked example, topk = 1, ...)."``"""
    problems = list(problems)
    labels = [p.label for p in problems if p.label]
    count = "the problem" if len(problems) == 1 else f"all {len(problems)} problems"
    text = f"right on {count} ({', '.join(labels)})"
    return text + (f"; {extra}" if extra else "") + "."


def check_first_gemm_fn(ex_id: str, fn: Callable, problems: list[Problem], tol: float, *,
                        hints: Callable[[str], str] | None = None, weighted: bool = False, extra: str = "") -> bool:
    """Exercise ``ex_id``: ``fn(x, weight, topk_ids[, topk_weights]) -> [M, topk, N]`` on every problem."""
    def body() -> str:
        for p in problems:
            args = (p.x, p.weight, p.topk_ids) + ((p.topk_weights,) if weighted else ())
            with on(p.describe()):
                expect_first_gemm(call_student(fn, *args, hints=hints), p, tol)
        return summary(problems, extra)
    return run_check(ex_id, body)


def check_layer_fn(ex_id: str, fn: Callable, problems: list[Problem]) -> bool:
    """Exercise ``ex_id``: ``fn(x, w13, w2, topk_weights, topk_ids) -> [M, K]`` on every problem."""
    def body() -> str:
        for p in problems:
            with on(p.describe()):
                expect_layer(call_student(fn, p.x, p.weight, p.w2, p.topk_weights, p.topk_ids), p, tolerance(p.x.dtype))
        return summary(problems)
    return run_check(ex_id, body)
