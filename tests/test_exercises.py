"""The exercise checkers: right answers pass, stubs are "not attempted", every mutant is caught.

A checker that cannot fail is a bug, so each one meets known-wrong implementations
(``exercise_mutants.MUTANTS``) and must reject them with the message a student needs.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import moe_tutorial
import moe_tutorial.exercises as exercises
from moe_tutorial import runtime
from moe_tutorial.exercises import EXERCISES
from moe_tutorial.exercises.guard import (
    OutOfBounds,
    find_out_of_bounds,
    memory_guard,
    poisoned_allocations,
)

import nbformat
import pytest
import torch
from exercise_mutants import MUTANTS, NOTEBOOKS, PACKAGE_ANSWERS, solutions, stubs

ROOT = Path(__file__).resolve().parents[1]
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
    return {p: solutions(p) for p in (1, 2, 3, 4)}


@pytest.mark.parametrize("ex_id", list(EXERCISES))
def test_solution_passes(ex_id, solution_modules, capsys):
    module = solution_modules[int(ex_id[0])]
    fn = getattr(module, EXERCISES[ex_id].function)
    ok, out = run(ex_id, fn, capsys)
    assert ok, out
    assert out.startswith(f"[{ex_id}] PASS {EXERCISES[ex_id].function}: right on"), out


@pytest.mark.parametrize("ex_id", sorted(PACKAGE_ANSWERS))
def test_package_implementation_passes(ex_id, capsys):
    ok, out = run(ex_id, PACKAGE_ANSWERS[ex_id], capsys)
    assert ok, out


@pytest.mark.parametrize("ex_id", list(EXERCISES))
def test_stub_is_not_attempted(ex_id, capsys):
    module = stubs(int(ex_id[0]))
    ok, out = run(ex_id, getattr(module, EXERCISES[ex_id].function), capsys)
    assert not ok
    assert out.startswith(f"[{ex_id}] NOT ATTEMPTED {EXERCISES[ex_id].function}: "), out
    assert len(out.strip().splitlines()) == 1, out


@pytest.mark.parametrize("mutant", MUTANTS, ids=[f"{m.ex_id}-{m.name}" for m in MUTANTS])
def test_mutant_is_rejected_with_the_right_message(mutant, capsys):
    if int(mutant.ex_id[0]) in KERNEL_PARTS and not runtime.INTERPRETED:
        pytest.skip("kernel mutants may touch memory out of range: the guard exists only in the interpreter")
    ok, out = run(mutant.ex_id, mutant.build(), capsys)
    assert not ok, out
    assert out.startswith(f"[{mutant.ex_id}] FAIL"), out
    assert mutant.phrase in out, out
    assert "the checker itself failed" not in out, out


def test_every_exercise_has_mutants():
    counts = {ex_id: sum(m.ex_id == ex_id for m in MUTANTS) for ex_id in EXERCISES}
    assert all(n >= 2 or ex_id == "3.4" for ex_id, n in counts.items()), counts


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


def test_wrong_return_types_are_explained(capsys):
    assert not exercises.check_loop_matmul(lambda x, w, ids: x.tolist())
    assert "expected a torch.Tensor of shape [M, topk, N] = (2, 2, 2), got list" in capsys.readouterr().out
    assert not exercises.check_route(lambda logits, k, renormalize=True: logits)
    assert "expected a pair" in capsys.readouterr().out
    assert not exercises.check_route(lambda logits, k, renormalize=True: moe_tutorial.route(logits, k, renormalize)[::-1])
    assert "return (topk_weights, topk_ids)" in capsys.readouterr().out
    assert not exercises.check_loop_matmul(lambda x, w, ids: torch.einsum("mk,enk->men", x, w)[:, :ids.shape[1]].double())
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
    assert (c == torch.iinfo(torch.int32).min).all()
    assert (torch.empty, torch.empty_like, torch.empty_strided, torch.Tensor.new_empty) == originals


# ----------------------------------------------------------------------------- notebooks, README, grading
def test_notebooks_tag_every_exercise():
    for ex in EXERCISES.values():
        for kind, tag in (("exercises", "stub"), ("solutions", "solution")):
            nb = nbformat.read(NOTEBOOKS / f"part{ex.part}_{kind}.ipynb", as_version=4)
            tagged = "\n".join(c.source for c in nb.cells if tag in c.metadata.get("tags", []))
            assert re.search(rf"^def {ex.function}\(|^{ex.function} = ", tagged, re.M), (ex.id, kind)
            calls = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
            assert f"{ex.checker}({ex.function})" in calls, (ex.id, kind)


def test_readme_lists_every_exercise():
    text = (NOTEBOOKS / "README.md").read_text()
    for ex in EXERCISES.values():
        assert f"| {ex.id} " in text and f"`{ex.function}`" in text, ex.id


@pytest.mark.timeout(300)
def test_grade_reports_a_class(tmp_path):
    # Two "students": one handed in the solutions, one the untouched exercises with one answer filled in.
    nb = nbformat.read(NOTEBOOKS / "part2_exercises.ipynb", as_version=4)
    sol = nbformat.read(NOTEBOOKS / "part2_solutions.ipynb", as_version=4)
    answer = next(c.source for c in sol.cells if "def intermediate_bytes" in c.source)
    for cell in nb.cells:
        if "def intermediate_bytes" in cell.source:
            cell.source = answer
        if "def select_weights" in cell.source:
            cell.source = "def select_weights(weight, topk_ids):\n    return weight[topk_ids.long().t()]"
    nbformat.write(nb, tmp_path / "bob.ipynb")
    nbformat.write(sol, tmp_path / "alice.ipynb")
    result = subprocess.run([sys.executable, "-m", "moe_tutorial.exercises.grade", "--csv", str(tmp_path / "grades.csv"),
                             str(tmp_path / "alice.ipynb"), str(tmp_path / "bob.ipynb")],
                            capture_output=True, text=True, cwd=ROOT, timeout=280)
    assert result.returncode == 0, result.stderr
    lines = {line.split()[0]: line.split() for line in result.stdout.splitlines() if line.startswith(("alice", "bob"))}
    assert lines["alice"][1:5] == ["PASS"] * 4 and lines["alice"][-1] == "4/4", result.stdout
    assert lines["bob"][1:5] == ["FAIL", "todo", "PASS", "todo"] and lines["bob"][-1] == "1/4", result.stdout
    csv = (tmp_path / "grades.csv").read_text().splitlines()
    assert csv[0].startswith("notebook,2.1,2.2,2.3,2.4") and "FAIL" in csv[2]
