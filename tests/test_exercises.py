"""The exercise checkers: right answers pass, stubs are "not attempted", every mutant is caught.

A checker that cannot fail is a bug, so each one meets known-wrong implementations
(``exercise_mutants.MUTANTS``) and must reject them with the message a student needs; a
checker that rejects a right answer written differently is a bug too
(``exercise_mutants.ALTERNATIVES``). The notebooks and the grader: tests/test_grade.py.
"""
from __future__ import annotations

import time
from pathlib import Path

import moe_tutorial
import moe_tutorial.exercises as exercises
from moe_tutorial import runtime
from moe_tutorial.exercises import EXERCISES
from moe_tutorial.exercises.feedback import Fail, call_student, last_verdict
from moe_tutorial.exercises.guard import (
    OutOfBounds,
    Recorder,
    find_out_of_bounds,
    int_poison,
    memory_guard,
    never_written,
    poisoned_allocations,
    poisoned_masked_loads,
)
from moe_tutorial.exercises.part3 import pointer_hint
from moe_tutorial.exercises.part4 import sorted_pointer_hint
from moe_tutorial.kernels import interpreter

import numpy as np
import pytest
import torch
from exercise_mutants import ALTERNATIVES, KINDS, MUTANTS, PACKAGE_ANSWERS, notebook_code, solutions, stubs

KERNEL_PARTS = {3, 4}
interpreter_only = pytest.mark.skipif(not runtime.INTERPRETED,
                                      reason="a wrong pointer is caught only by the interpreter's guard; "
                                             "on a GPU it would crash the CUDA context")


def run(ex_id: str, fn, capsys) -> tuple[bool, str]:
    checker = getattr(exercises, EXERCISES[ex_id].checker)
    capsys.readouterr()                       # drop what loading the solutions printed
    ok = checker(fn)
    return ok, capsys.readouterr().out


@pytest.fixture(scope="module")
def solution_modules():
    return {p: solutions(p) for p in (1, 2, 3, 4, 7, 8)}


@pytest.mark.parametrize("ex_id", list(EXERCISES))
def test_solution_passes(ex_id, solution_modules, capsys):
    module = solution_modules[int(ex_id[0])]
    fn = getattr(module, EXERCISES[ex_id].function)
    ok, out = run(ex_id, fn, capsys)
    assert ok, out
    assert out.startswith(f"[{ex_id}] PASS {EXERCISES[ex_id].function}: right on"), out


def _through_float32(fn):
    """``fn`` with float16 inputs run in float32 and the result converted back: the package's kernels
    take float32 only in the interpreter, and the kernel checkers have one float16 problem."""
    def wrapped(x, weight, *args):
        if x.dtype != torch.float16:
            return fn(x, weight, *args)
        return fn(x.float(), weight.float(), *args).to(torch.float16)
    return wrapped


def _held(fn):
    """``fn`` called through a closure that holds it: the checker's values test, without its refusal of the package's
    own function handed in, or called through the package's names (the tripwire replaces those, not this reference)."""
    def held(*args, **kwargs):
        return fn(*args, **kwargs)
    return held


@pytest.mark.parametrize("ex_id", sorted(PACKAGE_ANSWERS))
def test_package_implementation_passes(ex_id, capsys):
    fn = _held(PACKAGE_ANSWERS[ex_id])
    if int(ex_id[0]) in KERNEL_PARTS and ex_id != "4.1" and not runtime.ON_GPU:
        fn = _through_float32(fn)
    ok, out = run(ex_id, fn, capsys)
    assert ok, out


@pytest.mark.parametrize("ex_id", sorted(PACKAGE_ANSWERS))
def test_the_package_answer_is_no_answer(ex_id, capsys):
    """Handed in as is, or called from the student's function, the package's own answer fails, named."""
    fn = PACKAGE_ANSWERS[ex_id]
    ok, out = run(ex_id, fn, capsys)
    assert not ok and "this is the package's own implementation, moe_tutorial." in out, out
    module = __import__(fn.__module__, fromlist=["_"])
    ok, out = run(ex_id, lambda *args, **kwargs: getattr(module, fn.__name__)(*args, **kwargs), capsys)
    assert not ok and f"your function calls the package's own `{fn.__module__}.{fn.__name__}`" in out, out


@pytest.mark.parametrize("ex_id", list(EXERCISES))
def test_stub_is_not_attempted(ex_id, capsys):
    module = stubs(int(ex_id[0]))
    ok, out = run(ex_id, getattr(module, EXERCISES[ex_id].function), capsys)
    assert not ok
    assert out.startswith(f"[{ex_id}] NOT ATTEMPTED {EXERCISES[ex_id].function}: "), out
    assert len(out.strip().splitlines()) == 1, out


CPU_MUTANTS = [m for m in MUTANTS if not m.gpu_only]
GPU_MUTANTS = [m for m in MUTANTS if m.gpu_only]


def _expect_rejected(mutant, capsys) -> str:
    ok, out = run(mutant.ex_id, mutant.build(), capsys)
    assert not ok, out
    assert out.startswith(f"[{mutant.ex_id}] FAIL"), out
    assert mutant.phrase and mutant.phrase in out, out
    assert "the checker itself failed" not in out, out
    return out


@pytest.mark.parametrize("mutant", CPU_MUTANTS, ids=[f"{m.ex_id}-{m.name}" for m in CPU_MUTANTS])
def test_mutant_is_rejected_with_the_right_message(mutant, capsys):
    if int(mutant.ex_id[0]) in KERNEL_PARTS and not runtime.INTERPRETED:
        pytest.skip("kernel mutants may touch memory out of range: the guard exists only in the interpreter")
    _expect_rejected(mutant, capsys)


@pytest.mark.gpu
@pytest.mark.skipif(not runtime.ON_GPU, reason="needs a CUDA GPU: on the CPU a tensor made without device= is right")
@pytest.mark.parametrize("mutant", GPU_MUTANTS, ids=[f"{m.ex_id}-{m.name}" for m in GPU_MUTANTS])
def test_device_mutant_is_rejected_on_a_gpu(mutant, capsys):
    _expect_rejected(mutant, capsys)


@pytest.mark.parametrize("alt", ALTERNATIVES, ids=[f"{a.ex_id}-{a.name}" for a in ALTERNATIVES])
def test_correct_alternative_passes(alt, capsys):
    ok, out = run(alt.ex_id, alt.build(), capsys)
    assert ok, out


def test_every_exercise_has_mutants_and_every_kind_of_mistake_is_covered():
    counts = {ex_id: sum(m.ex_id == ex_id for m in MUTANTS) for ex_id in EXERCISES}
    assert all(n >= 2 for n in counts.values()), counts
    kinds = {m.kind for m in MUTANTS}
    assert kinds == set(KINDS), kinds ^ set(KINDS)


def test_at_least_25_kinds_of_correct_alternatives():
    kinds = {a.kind for a in ALTERNATIVES}
    assert len(kinds) >= 25, sorted(kinds)
    assert all(sum(a.ex_id[0] == part for a in ALTERNATIVES) >= 3 for part in "1234")


def test_int32_offsets_pass_the_ordinary_checks(capsys):
    """The 3.3 solution keeps int32 offsets: right at small sizes, caught only by 3.4's big stride."""
    fn = solutions(3).fused_moe_matmul_any_topk
    assert run("3.3", fn, capsys)[0]


def test_checkers_never_raise(capsys):
    def broken(*args, **kwargs):
        raise ValueError("boom")

    for ex in EXERCISES.values():
        ok = getattr(exercises, ex.checker)(broken)
        out = capsys.readouterr().out
        assert not ok and out.startswith(f"[{ex.id}] FAIL"), out
        assert "ValueError: boom" in out and "in broken, line" in out, out
    assert not exercises.check_loop_matmul("not a function")
    assert "expected a function" in capsys.readouterr().out


class _Opaque:
    """Claims to be a number and a sequence, and is neither."""

    def __int__(self):
        raise RuntimeError("no int")

    def __index__(self):
        raise RuntimeError("no index")

    def __len__(self):
        return 2

    def __iter__(self):
        raise RuntimeError("no iteration")


ODD_RETURNS = [None, 3, 2.5, "text", [1, 2], (None, None), (None, None, None), {"a": 1}, torch.tensor(1.0),
               torch.zeros(0), torch.ones(2, 2, dtype=torch.bool), torch.ones(3, dtype=torch.complex64), np.zeros(3),
               _Opaque(), (_Opaque(), _Opaque()), (torch.tensor([1.5]), torch.tensor([2.5])),
               (torch.zeros(3, dtype=torch.int32), torch.zeros(3, dtype=torch.int32), _Opaque()),
               (torch.full((4,), float("nan")), torch.zeros(2, dtype=torch.int64), torch.tensor([float("inf")])),
               float("nan"), -1, 10**30]


@pytest.mark.parametrize("ex_id", list(EXERCISES))
def test_odd_returns_fail_without_blaming_the_checker(ex_id, capsys):
    """Whatever the student's function returns, the verdict is the student's FAIL, never a checker crash."""
    for value in ODD_RETURNS:
        ok, out = run(ex_id, lambda *args, value=value, **kwargs: value, capsys)
        assert not ok and out.startswith(f"[{ex_id}] FAIL"), (value, out)
        assert "the checker itself failed" not in out, (value, out)


def test_an_input_changed_in_place_fails_even_when_the_result_is_right(solution_modules, capsys):
    def route_and_scale(router_logits, top_k, renormalize=True):
        result = solution_modules[1].route(router_logits, top_k, renormalize)
        router_logits.mul_(2)
        return result

    ok, out = run("1.1", route_and_scale, capsys)
    assert not ok and "changed its input `router_logits` in place" in out, out


def test_student_code_gets_copies_with_the_same_layout():
    x = torch.randn(4, 10)[:, ::2]
    seen = {}

    def look(t):
        seen["stride"], seen["contiguous"], seen["same"] = t.stride(), t.is_contiguous(), t.data_ptr() == x.data_ptr()
        return t.sum()

    assert torch.equal(call_student(look, x), x.sum())
    assert seen == {"stride": x.stride(), "contiguous": False, "same": False}
    torch.set_default_dtype(torch.float32)
    call_student(lambda: torch.set_default_dtype(torch.float64))
    assert torch.get_default_dtype() == torch.float32          # a student's global change does not leak
    with pytest.raises(Fail, match="changed its input `x` in place"):
        call_student(lambda t: t.add_(1), x.clone(), names=("x",))


def test_hints_match_whole_names():
    out_hint, router_hint = sorted_pointer_hint("out_ptr"), sorted_pointer_hint("router_ptr")
    assert "store reached past the output" in out_hint and "router-weight" in router_hint
    assert "store reached past the output" not in pointer_hint("router_ptr")
    assert sorted_pointer_hint("topk_weights") == router_hint           # an input's own name
    assert pointer_hint("c_out") == pointer_hint("out_ptr") == pointer_hint("outPtr")
    assert "weight load" in pointer_hint("weights_ptr") and "weight load" in pointer_hint("w13_ptr")
    assert "x load" in pointer_hint("x") and "expert-id" in pointer_hint("topk_ids_ptr")


def test_wrong_return_types_are_explained(solution_modules, capsys):
    assert not exercises.check_loop_matmul(lambda x, w, ids: x.tolist())
    assert "expected a torch.Tensor of shape [M, topk, N] = (2, 2, 2), got list" in capsys.readouterr().out
    assert not exercises.check_route(lambda logits, k, renormalize=True: logits)
    assert "expected a pair" in capsys.readouterr().out
    assert not exercises.check_route(lambda logits, k, renormalize=True:
                                     solution_modules[1].route(logits, k, renormalize)[::-1])
    assert "return (topk_weights, topk_ids)" in capsys.readouterr().out
    assert not exercises.check_loop_matmul(lambda x, w, ids:
                                           torch.einsum("mk,enk->men", x, w)[:, :ids.shape[1]].double())
    assert "expected dtype torch.float32 (x's dtype), got torch.float64" in capsys.readouterr().out


# ----------------------------------------------------------------------------- the safety nets
@interpreter_only
def test_guard_reports_an_out_of_range_load():
    import triton
    import triton.language as tl

    @triton.jit
    def copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs <= n), mask=offs < n)   # <= : off by one

    src, dst = torch.arange(10.0), torch.empty(10)
    with memory_guard(), pytest.raises(Exception) as info:
        copy_kernel[(2,)](src, dst, 10, BLOCK=8)
    oob = find_out_of_bounds(info.value)
    assert isinstance(oob, OutOfBounds)
    assert (oob.arg, oob.offset, oob.length, oob.program, oob.lane) == ("src_ptr", 10, 10, (1,), (2,))
    copy_kernel[(2,)](src, dst, 9, BLOCK=8)        # the guard is gone again: a legal launch runs
    assert torch.equal(dst[:9], src[:9])


def test_poisoned_allocations_show_unwritten_memory():
    originals = (torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty)
    with poisoned_allocations():
        a, b, c = torch.empty(3), torch.zeros(2).new_empty(4), torch.empty(2, dtype=torch.int32)
        d, e = torch.empty_like(a), torch.empty_strided((2, 2), (1, 2))
    assert a.isnan().all() and b.isnan().all() and d.isnan().all() and e.isnan().all()
    assert (c == int_poison(torch.int32)).all()
    assert (torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty) == originals


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_never_written_tells_the_fill_from_a_computed_nan(dtype):
    """The fill's NaN has its own payload: a NaN the code computed (0 / 0, NaN * 0) is written, not unwritten."""
    with poisoned_allocations():
        fresh = torch.empty(4, dtype=dtype)
        strided = torch.empty_strided((2, 3), (1, 2), dtype=dtype)
    assert never_written(fresh).all() and never_written(strided).all()
    fresh[1] = 0.0
    fresh[2] = torch.tensor(0.0, dtype=dtype) / 0.0
    fresh[3] = float("nan") * torch.tensor(0.0, dtype=dtype)
    assert fresh[2:].isnan().all()
    assert never_written(fresh).tolist() == [True, False, False, False]


@interpreter_only
def test_masked_off_lanes_of_a_load_without_other_are_poisoned():
    import triton
    import triton.language as tl

    @triton.jit
    def copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr, OTHER: tl.constexpr):
        offs = tl.arange(0, BLOCK)
        if OTHER:
            v = tl.load(src_ptr + offs, mask=offs < n, other=7)
        else:
            v = tl.load(src_ptr + offs, mask=offs < n)
        tl.store(dst_ptr + offs, v)

    for dtype in (torch.float32, torch.int32, torch.int64):
        src, dst = torch.arange(8).to(dtype), torch.zeros(8, dtype=dtype)
        recorder = Recorder()
        # Both nestings with the memory guard: each must leave the other working, and both gone after.
        with poisoned_masked_loads(recorder), memory_guard():
            copy_kernel[(1,)](src, dst, 5, BLOCK=8, OTHER=False)
        assert torch.equal(dst[:5], src[:5]) and recorder.no_other == ["src_ptr"]
        if dtype.is_floating_point:
            assert interpreter.is_poison_nan(dst).tolist() == [False] * 5 + [True] * 3
        else:
            assert (dst[5:] == interpreter.POISON_INT).all()
        with memory_guard(), poisoned_masked_loads():
            copy_kernel[(1,)](src, dst, 5, BLOCK=8, OTHER=True)       # other= given: untouched
        assert dst[5:].tolist() == [7, 7, 7]
        copy_kernel[(1,)](src, dst, 5, BLOCK=8, OTHER=False)          # outside: the interpreter's zeros again
        assert dst[5:].tolist() == [0, 0, 0]
    assert not interpreter.is_poison_nan(torch.tensor([float("nan"), 1.0])).any()   # an ordinary NaN is not poison


def test_gpu_tests_collect_without_nbformat(tmp_path):
    """A GPU machine may have only the package's dependencies: `pytest -m gpu` must still collect."""
    import subprocess
    import sys

    blocker = tmp_path / "nbformat"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'nbformat'\", name='nbformat')\n")
    tests = Path(__file__).resolve().parent
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q", "-p", "no:cacheprovider",
         "-p", "no:nbval",   # nbval needs nbformat too, and is missing with it
         str(tests / "test_exercises.py"), str(tests / "test_grade.py")],
        capture_output=True, text=True, cwd=tests.parent, timeout=300,
        env={**__import__("os").environ, "PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "test_device_mutant_is_rejected_on_a_gpu" in result.stdout, result.stdout[-3000:]


def test_last_verdict_records_what_the_checker_decided(capsys):
    exercises.check_intermediate_bytes(_held(moe_tutorial.intermediate_bytes))
    assert last_verdict("2.3")[0] == "PASS"
    exercises.check_intermediate_bytes(lambda *a: print("[2.3] PASS intermediate_bytes: forged") or 0)
    assert last_verdict("2.3")[0] == "FAIL" and "[2.3] FAIL" in last_verdict("2.3")[1]


def test_a_function_that_never_returns_times_out_with_a_clear_message(capsys, monkeypatch):
    from moe_tutorial.exercises import timelimit

    monkeypatch.setattr(timelimit, "CHECK_LIMIT_S", 1.0)

    def forever(router_logits, top_k, renormalize=True):
        while True:
            try:
                pass
            except Exception:          # a student's broad except must not swallow the limit
                pass

    start = time.monotonic()
    ok, out = run("1.1", forever, capsys)
    assert time.monotonic() - start < 1.5
    assert not ok and "did not return within 1 s, the time the checker gives it for this exercise" in out, out
    assert "loop that never ends" in out, out


@pytest.mark.parametrize("ex_id", ["1.3", "3.2", "4.2"])
def test_the_time_limit_is_for_the_whole_check_not_each_call(ex_id, solution_modules, capsys, monkeypatch):
    """A checker calls the function many times (each problem, each pid in 4.2, a second probe after a failure); the
    limit its message names is what the whole check takes at most. A right answer that takes 0.4 s a call is stopped
    after 1 s in all, not let run for 0.4 s times the number of calls (it used to be allowed each call's limit)."""
    from moe_tutorial.exercises import timelimit

    monkeypatch.setattr(timelimit, "CHECK_LIMIT_S", 1.0)
    right = getattr(solution_modules[int(ex_id[0])], EXERCISES[ex_id].function)

    def slow(*args, **kwargs):
        time.sleep(0.4)
        return right(*args, **kwargs)

    start = time.monotonic()
    ok, out = run(ex_id, slow, capsys)
    assert time.monotonic() - start < 1.6, out
    assert not ok and "did not return within 1 s, the time the checker gives it for this exercise" in out, out


def test_calling_the_package_is_fine_for_an_earlier_exercise_step(solution_modules, capsys):
    """4.3 takes the alignment from the package's align_block_size (4.1's step), as its text says."""
    assert "moe_tutorial.align_block_size(" in notebook_code("part4_solutions.ipynb", "solution")
    assert run("4.3", solution_modules[4].sorted_moe_matmul, capsys)[0]
