"""The grader and the release: a class graded by checkers that run in the grader's own process on
what each notebook's functions return, so that nothing a notebook does, printed, patched or left
on disk, raises its grade; and a class folder without solutions to grade from.

Needs nbformat (the dev extra); where it is missing (a GPU machine with only the package
installed) this module is skipped, so `pytest -m gpu` still collects the rest.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import moe_tutorial  # noqa: F401  (first: picks the runtime)
from moe_tutorial.exercises import EXERCISES, release, wire
from moe_tutorial.exercises.grade import part_of, read_only
from moe_tutorial.exercises.sandbox import definitions

import numpy as np
import pytest
import torch
from exercise_mutants import NOTEBOOKS

nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).resolve().parents[1]


def grade(*args, cwd=ROOT, timeout=380) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "moe_tutorial.exercises.grade", *map(str, args)],
                          capture_output=True, text=True, cwd=cwd, timeout=timeout)


def rows(result, names) -> dict[str, list[str]]:
    return {w[0]: w for w in map(str.split, result.stdout.splitlines()) if w and w[0] in names}


# ----------------------------------------------------------------------------- notebooks, README, parts
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


def test_parts_are_recognised():
    for part in sorted({ex.part for ex in EXERCISES.values()}):
        for kind in ("exercises", "solutions"):
            assert part_of(nbformat.read(NOTEBOOKS / f"part{part}_{kind}.ipynb", as_version=4)) == part


def test_only_definitions_run():
    """Imports, def and class (decorators included) and assignments that call nothing; nothing else, not even
    a call on the same line as an import, and a cell's line numbers stay its own."""
    cell = ("%matplotlib inline\nimport os; os.system('echo hi')\nBLOCK = 16\nW = torch.randn(3)\n"
            "print('[1.1] PASS route')\n@triton.jit\ndef kernel(x):\n    pass\nclass Box:\n    size = len([1])\n"
            "alias = kernel\nf = lambda t: t.sum()\ncheck_route(route)\nfor i in range(3):\n    BLOCK += i\n")
    kept = definitions(cell).body
    assert [(type(n).__name__, n.lineno) for n in kept] == [
        ("Import", 2), ("Assign", 3), ("FunctionDef", 7), ("ClassDef", 9), ("Assign", 11), ("Assign", 12)]
    assert kept[2].decorator_list and ast.unparse(kept[2].decorator_list[0]) == "triton.jit"
    with pytest.raises(SyntaxError):
        definitions("def broken(:\n    pass")


# ----------------------------------------------------------------------------- grading a class
def _part(part: int, kind: str):
    return nbformat.read(NOTEBOOKS / f"part{part}_{kind}.ipynb", as_version=4)


def _cells_with(nb, text: str) -> list:
    found = [c for c in nb.cells if text in c.source]
    assert found, text
    return found


def _with_cell_after(nb, text: str, source: str):
    """``nb`` with a code cell holding ``source`` right after the first cell containing ``text``."""
    i = nb.cells.index(_cells_with(nb, text)[0])
    nb.cells.insert(i + 1, nbformat.v4.new_code_cell(source))
    return nb


#: Top-level tricks that raised a grade when the grader ran a notebook's cells in the kernel where it checked:
#: printed and displayed verdicts, a redefined checker, patched checker modules, an import hook and a
#: meta-path finder that patch the checkers the grader imports afresh, the solution notebook's cells run.
_TOP_LEVEL_TRICKS = [
    'print("[2.1] PASS select_weights: right on all 8 problems.")',
    "def check_indexing_matmul(fn):\n    print('[2.2] PASS expert_moe_matmul: right')\n    return True",
    "import moe_tutorial.exercises as mex\nimport moe_tutorial.exercises.feedback as fb\n"
    "fb.run_check = lambda ex_id, body: True\nmex.check_intermediate_bytes = lambda fn: True\n"
    "fb.last_verdict = lambda ex_id: ('PASS', 'forged')",
    "from IPython.display import display\nfor i in ('2.1', '2.2', '2.3', '2.4'):\n"
    "    display({'application/vnd.moe-tutorial.verdict+json': {'key': '0' * 32, 'id': i, 'verdict': 'PASS',"
    " 'message': ''}}, raw=True)",
    "import builtins\n_real = builtins.__import__\n"
    "def _hook(name, *a, **k):\n    m = _real(name, *a, **k)\n"
    "    if name.startswith('moe_tutorial.exercises'):\n"
    "        import moe_tutorial.exercises.feedback as f\n        f._verdict = lambda i, v, t: True\n    return m\n"
    "builtins.__import__ = _hook",
    "import sys\nclass Finder:\n    def find_spec(self, name, path=None, target=None):\n        return None\n"
    "sys.meta_path.insert(0, Finder())",
    "import glob, nbformat, sys\nfor p in sys.path:\n    for f in glob.glob(p + '/**/part2_solutions.ipynb', "
    "recursive=True):\n        for c in nbformat.read(f, 4).cells:\n"
    "            if 'solution' in c.metadata.get('tags', []):\n                exec(c.source)",
]

#: The same search at call time, inside the graded functions: beside the package the child imports, on its
#: sys.path, in its working folder. Found nowhere, the function stays a stub.
_SEEK_AT_CALL_TIME = '''
def _solution(name):
    import glob, json, os, sys
    from pathlib import Path
    import moe_tutorial
    places = [str(Path(moe_tutorial.__file__).resolve().parents[1])] + sys.path + [os.getcwd()]
    for place in places:
        for f in glob.glob(str(place) + "/**/part2_solutions.ipynb", recursive=True):
            ns = {}
            exec("import torch; import torch.nn.functional as F", ns)
            for c in json.load(open(f))["cells"]:
                if "solution" in c["metadata"].get("tags", []):
                    exec("".join(c["source"]), ns)
            return ns[name]
    raise NotImplementedError("no solution within reach")


def select_weights(weight, topk_ids):
    return _solution("select_weights")(weight, topk_ids)


def intermediate_bytes(M, topk, N, K, itemsize=2):
    return _solution("intermediate_bytes")(M, topk, N, K, itemsize)
'''


@pytest.mark.timeout(400)
def test_grade_runs_the_checkers_itself_and_is_not_fooled(tmp_path):
    """Part 2: the solutions; one honest answer; every top-level trick on stubs; functions that look for the
    solutions when called; an import cell that breaks; the package's own function handed in."""
    alice = _part(2, "solutions")
    bob = _part(2, "exercises")
    _cells_with(bob, "def intermediate_bytes")[0].source = _cells_with(alice, "def intermediate_bytes")[0].source
    _cells_with(bob, "def select_weights")[0].source = (
        "def select_weights(weight, topk_ids):\n    return weight[topk_ids.long().t()]")
    mallory = _part(2, "exercises")
    for trick in _TOP_LEVEL_TRICKS:
        mallory.cells.insert(2, nbformat.v4.new_code_cell(trick))
    seeker = _part(2, "exercises")
    seeker.cells.append(nbformat.v4.new_code_cell(_SEEK_AT_CALL_TIME))
    broken = _part(2, "exercises")
    _cells_with(broken, "import moe_tutorial")[0].source = "import moe_tutorial.no_such_module\nimport torch"
    lazy = _part(2, "solutions")
    _cells_with(lazy, "def intermediate_bytes")[0].source = "intermediate_bytes = moe_tutorial.intermediate_bytes"

    names = ["alice", "bob", "mallory", "seeker", "broken", "lazy"]
    for name, nb in zip(names, (alice, bob, mallory, seeker, broken, lazy)):
        nbformat.write(nb, tmp_path / f"{name}.ipynb")
    result = grade("--details", "--allow-solutions", "--csv", tmp_path / "grades.csv",
                   *[tmp_path / f"{n}.ipynb" for n in names])
    assert result.returncode == 0, result.stderr
    got = rows(result, names)
    assert got["alice"][1:6] == ["PASS"] * 4 + ["4/4"], result.stdout
    assert got["bob"][1:6] == ["FAIL", "todo", "PASS", "todo", "1/4"], result.stdout
    assert got["mallory"][1:6] == ["todo"] * 4 + ["0/4"] and len(got["mallory"]) == 6, result.stdout
    assert got["seeker"][1:6] == ["FAIL", "todo", "FAIL", "todo", "0/4"], result.stdout
    assert "your code raised NotImplementedError: no solution within reach" in result.stdout
    assert got["broken"][1:6] == ["todo"] * 4 + ["0/4"] and got["broken"][6:] == ["(cell", "errors)"], result.stdout
    assert got["lazy"][1:6] == ["PASS", "PASS", "FAIL", "PASS", "3/4"], result.stdout
    assert "this is the package's own implementation, moe_tutorial.indexing.intermediate_bytes" in result.stdout
    assert "ModuleNotFoundError: No module named 'moe_tutorial.no_such_module' (code cell 1)" in result.stdout
    csv = (tmp_path / "grades.csv").read_text().splitlines()
    assert csv[0] == "notebook,2.1,2.2,2.3,2.4,passed,total,problems" and csv[3] == "mallory,NOT ATTEMPTED," \
        "NOT ATTEMPTED,NOT ATTEMPTED,NOT ATTEMPTED,0,4,", csv


def test_a_bad_submission_costs_its_own_row_never_the_run(tmp_path):
    """Missing files (an unmatched shell pattern too), a folder, an empty file, text that is not
    JSON, a notebook without cells: each is one row with its reason. With nothing graded the exit
    status is 1; an unwritable --csv is a message after the table, not a traceback."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "empty.ipynb").write_text("")
    (tmp_path / "text.ipynb").write_text("print('hello')\n")
    nbformat.write(nbformat.v4.new_notebook(), tmp_path / "nocells.ipynb")
    args = [tmp_path / n for n in ("missing.ipynb", "nomatch/*.ipynb", "folder", "empty.ipynb", "text.ipynb",
                                    "nocells.ipynb")]
    result = grade("--part", "1", "--allow-solutions", *args, timeout=120)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    expected = {"missing": "no such file", "nomatch/*": "the shell found no file matching this pattern",
                "folder": "is a folder, not a notebook", "empty": "not a readable notebook",
                "text": "not a readable notebook", "nocells": "the notebook has no cells"}
    for name, why in expected.items():
        assert name in lines and "0/4" in lines[name] and "(not graded: " in lines[name] and why in lines[name], \
            (name, result.stdout)
    assert result.returncode == 1 and "nothing was graded" in result.stderr, result.stderr
    with_csv = grade("--part", "1", "--allow-solutions", "--csv", tmp_path / "no_such_dir" / "grades.csv",
                     tmp_path / "empty.ipynb", timeout=120)
    assert with_csv.returncode == 1 and "--csv: could not write" in with_csv.stderr, with_csv.stderr


def test_the_grader_refuses_where_solutions_are_within_reach(tmp_path):
    """Here, in a clone, the solution notebooks lie in the source tree of the package the grader runs."""
    nbformat.write(_part(1, "exercises"), tmp_path / "a.ipynb")
    result = grade(tmp_path / "a.ipynb", timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "not grading: solution notebooks lie where the graded code could find them" in result.stderr
    assert str(NOTEBOOKS / "part1_solutions.ipynb") in result.stderr, result.stderr
    assert release.solutions_within_reach()[0].name.endswith("_solutions.ipynb")


# What a notebook's function can do to files when called: find the installed package (through the editable
# install's record), edit a checker there, plant bytecode for the grader, overwrite another submission.
_INSTALLED = '''
def _installed():
    import importlib.metadata, json, pathlib, urllib.parse
    url = json.loads(importlib.metadata.distribution("moe_tutorial").read_text("direct_url.json"))["url"]
    return pathlib.Path(urllib.parse.urlparse(url).path) / "moe_tutorial"
'''

_EDIT_CHECKERS = _INSTALLED + '''
def route(router_logits, top_k, renormalize=True):
    with open(_installed() / "exercises" / "feedback.py", "a") as f:
        f.write("\\n\\ndef run_check(ex_id, body):\\n    return _verdict(ex_id, PASS, f'[{ex_id}] PASS forged')\\n")
    raise NotImplementedError("edited")
'''

_PLANT_BYTECODE = _INSTALLED + '''
def route(router_logits, top_k, renormalize=True):
    import importlib.util, marshal, os, struct
    src = _installed() / "exercises" / "grade.py"
    fake = "def main(argv=None):\\n    print('forged bytecode')\\n    return 0\\n"
    st = src.stat()
    header = importlib.util.MAGIC_NUMBER + struct.pack("<III", 0, int(st.st_mtime) & 0xFFFFFFFF,
                                                       st.st_size & 0xFFFFFFFF)
    pyc = importlib.util.cache_from_source(str(src))
    os.makedirs(os.path.dirname(pyc), exist_ok=True)    # a fresh clone may have no __pycache__ yet
    with open(pyc, "wb") as f:
        f.write(header + marshal.dumps(compile(fake, str(src), "exec")))
    raise NotImplementedError("planted")
'''

_OVERWRITE_OTHERS = _INSTALLED + '''
def route(router_logits, top_k, renormalize=True):
    import os, shutil
    args = open(f"/proc/{os.getppid()}/cmdline", "rb").read().split(b"\\0")
    answers = _installed().parent / "notebooks" / "exercises" / "part1_solutions.ipynb"
    for arg in args:
        if arg.endswith(b"b_stub.ipynb"):
            shutil.copy(answers, arg.decode())
    raise NotImplementedError("overwrote")
'''

_SWAP_VERDICT = '''
def route(router_logits, top_k, renormalize=True):
    import moe_tutorial.exercises.feedback as fb
    fb._verdict = lambda ex_id, verdict, text: (fb._LAST.__setitem__(ex_id, ("PASS", "forged")), True)[1]
    fb.run_call = lambda *a, **k: fb.Outcome("ok", value=None)
    raise ValueError("wrong on purpose")
'''


def _package_refuses_my_writes() -> bool:
    """Does read_only() stop this user (not root) from writing? Tried on a folder of our own."""
    folder = Path(tempfile.mkdtemp(prefix="moe_ro_probe_"))
    try:
        with read_only(folder) as refused:
            return refused
    finally:
        shutil.rmtree(folder)


@pytest.mark.timeout(400)
def test_grade_is_not_fooled_by_files_on_disk_or_swapped_verdicts(tmp_path):
    """Functions that, when called, edit the installed checkers, plant bytecode for the grader, overwrite a
    submission graded after them, or replace the checking functions in their own process: none scores, and
    the package and the other submission are as they were."""
    stub = _part(1, "exercises")
    editor, planter, overwriter, swapper = (_part(1, "exercises") for _ in range(4))
    for nb, code in ((editor, _EDIT_CHECKERS), (planter, _PLANT_BYTECODE), (overwriter, _OVERWRITE_OTHERS),
                     (swapper, _SWAP_VERDICT)):
        _cells_with(nb, "def route(")[0].source = code
    names = ["a_editor", "a_planter", "a_overwriter", "b_stub", "c_swapper"]
    for name, nb in zip(names, (editor, planter, overwriter, stub, swapper)):
        nbformat.write(nb, tmp_path / f"{name}.ipynb")
    package = ROOT / "moe_tutorial"
    feedback_file = package / "exercises" / "feedback.py"
    pyc = Path(importlib.util.cache_from_source(str(package / "exercises" / "grade.py")))
    before, pyc_before = feedback_file.read_bytes(), pyc.read_bytes() if pyc.exists() else None
    modes = {p: p.stat().st_mode for p in [package, *package.rglob("*")]}
    try:
        result = grade("--details", "--allow-solutions", *[tmp_path / f"{n}.ipynb" for n in names])
    finally:        # never leave a forged .pyc in the working tree, whatever the grader did
        if pyc.exists() and b"forged bytecode" in pyc.read_bytes():
            pyc.unlink() if pyc_before is None else pyc.write_bytes(pyc_before)
    assert feedback_file.read_bytes() == before, "the grader must put the checkers' files back"
    assert not (pyc.exists() and b"forged bytecode" in pyc.read_bytes()), "the grader must remove planted bytecode"
    assert {p: p.stat().st_mode for p in modes if p.exists()} == modes, "the package's modes must be put back"
    assert result.returncode == 0, result.stderr
    assert f"grading with moe_tutorial from {package}" in result.stderr, result.stderr
    got = rows(result, names)
    if _package_refuses_my_writes():
        # A read-only package: the edit and the planted .pyc fail inside the function; the stubs stay stubs.
        for name in ("a_editor", "a_planter"):
            assert got[name][1] == "FAIL" and got[name][5] == "0/4" and "PermissionError" in result.stdout
        assert "could not be made read-only" not in result.stderr, result.stderr
    else:
        # Root: writes go through, so the comparison voids the verdicts and puts the files back.
        assert got["a_editor"][1:6] == ["FAIL"] * 4 + ["0/4"], result.stdout
        assert "the notebook changed the installed package's files (exercises/feedback.py)" in result.stdout
        assert got["a_planter"][1:6] == ["FAIL"] * 4 + ["0/4"], result.stdout
        assert f"changed the installed package's files (exercises/__pycache__/{pyc.name})" in result.stdout
        assert "could not be made read-only (running as root" in result.stderr, result.stderr
    assert got["a_overwriter"][1:6] == ["todo"] * 4 + ["0/4"], result.stdout
    assert got["b_stub"][1:6] == ["todo"] * 4 + ["0/4"], "every submission is read before any code runs"
    assert got["c_swapper"][1] == "FAIL" and got["c_swapper"][5] == "0/4", result.stdout
    assert "ValueError: wrong on purpose" in result.stdout


@pytest.mark.timeout(300)
def test_a_function_that_ignores_the_alarm_is_killed_and_the_next_exercise_still_graded(tmp_path):
    """--limit is what the message says: a route that ignores SIGALRM is killed a few seconds after the limit,
    and the exercises after it are graded by a fresh process running the same definitions."""
    nb = _part(1, "solutions")
    _cells_with(nb, "def route(")[0].source = (
        "import signal\n\ndef route(router_logits, top_k, renormalize=True):\n"
        "    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n    while True:\n        pass\n")
    nbformat.write(nb, tmp_path / "spinner.ipynb")
    quitter = _part(7, "solutions")                 # a function that ends the process: its exercise only
    _cells_with(quitter, "def quantize_block(")[0].source = "import os\n\ndef quantize_block(block):\n    os._exit(3)\n"
    nbformat.write(quitter, tmp_path / "quitter.ipynb")
    start = time.monotonic()
    result = grade("--details", "--allow-solutions", "--limit", "2", tmp_path / "spinner.ipynb",
                   tmp_path / "quitter.ipynb")
    took = time.monotonic() - start
    got = rows(result, ["spinner", "quitter"])
    assert got["spinner"][1:5] + got["spinner"][-1:] == ["FAIL", "PASS", "PASS", "PASS", "3/4"], result.stdout
    assert "your function did not return within 2 s, the time the checker gives it" in result.stdout
    assert got["quitter"][-3:] == ["FAIL", "PASS", "1/2"], result.stdout
    assert "the process running the notebook's code ended during this call (exit status 3)" in result.stdout
    assert took < 90, took


@pytest.mark.timeout(400)
def test_every_part_grades_its_solutions_and_its_kernels_run_in_the_child(tmp_path):
    """The catalogue's parts, solutions graded in full (Triton kernels defined and launched in the child, e4m3
    tensors sent there); and 3.4's big-stride weight, made in the child, still tells a launcher that copies it."""
    parts = sorted({ex.part for ex in EXERCISES.values()})
    copier = _part(3, "solutions")
    _cells_with(copier, "def fused_moe_matmul_int64(")[0].source += (
        "\n\ndef fused_moe_matmul_int64(x, weight, topk_ids):\n"
        "    return fused_moe_matmul_any_topk(x, weight.contiguous(), topk_ids)\n")
    nbformat.write(copier, tmp_path / "copier.ipynb")
    names = [f"part{p}_solutions" for p in parts] + ["copier"]
    for name in names[:-1]:
        shutil.copy(NOTEBOOKS / f"{name}.ipynb", tmp_path)
    result = grade("--details", "--allow-solutions", *[tmp_path / f"{n}.ipynb" for n in names])
    assert result.returncode == 0, result.stderr
    got = rows(result, names)
    for part in parts:
        count = sum(ex.part == part for ex in EXERCISES.values())
        assert got[f"part{part}_solutions"][-1] == f"{count}/{count}", result.stdout
    assert got["copier"][-1] == "3/4" and "the kernel never read the weight you were given" in result.stdout


# ----------------------------------------------------------------------------- the release
def _release(tmp_path) -> Path:
    dest = tmp_path / "class"
    assert release.main([str(dest)]) == 0
    return dest


def test_the_release_holds_what_students_need_and_no_solution(tmp_path):
    dest = _release(tmp_path)
    assert release.solution_notebooks_under(dest) == []
    assert not list(dest.rglob("*_solutions*")) and not (dest / "tests").exists()
    lessons = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert sorted(p.name for p in (dest / "notebooks").glob("*.ipynb")) == lessons
    for part in release.parts():
        text = (dest / "notebooks" / "exercises" / f"part{part}_exercises.ipynb").read_text()
        assert "_solutions.ipynb" not in text and release.NO_SOLUTIONS in text, part
    page = (dest / "notebooks" / "exercises" / "README.md").read_text()
    assert all(f"| {ex.id} |" in page and f"`{ex.function}`" in page for ex in EXERCISES.values())
    assert "What counts as an answer" in page
    for name in ("Makefile", "pyproject.toml", "docs/seed-article.md", "moe_tutorial/exercises/grade.py"):
        assert (dest / name).is_file(), name
    assert not list(dest.rglob("__pycache__"))
    assert release.main([str(dest)]) == 2                          # a folder with files is not overwritten


@pytest.mark.timeout(300)
def test_grading_from_the_release_needs_no_override_and_finds_no_solution(tmp_path):
    """From the class folder the grader grades without --allow-solutions; a function that looks for the
    solutions beside the package or on the path finds none, so only the honest answer scores."""
    dest = _release(tmp_path)
    nb = nbformat.read(dest / "notebooks" / "exercises" / "part7_exercises.ipynb", as_version=4)
    _cells_with(nb, "def quantize_block(")[0].source = _cells_with(_part(7, "solutions"),
                                                                    "def quantize_block(")[0].source
    _cells_with(nb, "def scaled_matmul(")[0].source = _SEEK_AT_CALL_TIME.replace("part2", "part7") + (
        "\ndef scaled_matmul(a_q, a_scale, w_q, w_scale):\n"
        "    return _solution('scaled_matmul')(a_q, a_scale, w_q, w_scale)\n")
    (tmp_path / "handed_in").mkdir()
    nbformat.write(nb, tmp_path / "handed_in" / "carol.ipynb")
    result = grade("--details", tmp_path / "handed_in" / "carol.ipynb", cwd=dest)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"grading with moe_tutorial from {dest / 'moe_tutorial'}" in result.stderr, result.stderr
    assert rows(result, ["carol"])["carol"][1:4] == ["PASS", "FAIL", "1/2"], result.stdout
    assert "your code raised NotImplementedError: no solution within reach" in result.stdout


# ----------------------------------------------------------------------------- the installed package's modes
def test_read_only_puts_every_mode_back_even_when_the_body_fails(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    (tmp_path / "sub" / "b.py").chmod(0o640)
    paths = [tmp_path, tmp_path / "a.py", tmp_path / "sub", tmp_path / "sub" / "b.py"]
    modes = [p.stat().st_mode for p in paths]
    with pytest.raises(RuntimeError, match="grading failed"):
        with read_only(tmp_path):
            assert all(not p.stat().st_mode & 0o222 for p in paths), [oct(p.stat().st_mode) for p in paths]
            raise RuntimeError("grading failed")
    assert [p.stat().st_mode for p in paths] == modes


def _refused_writes(folder: Path) -> int:
    """How many of two writes into ``folder`` (edit a file, add one) are refused; as root, tried in a
    forked child that has become the unprivileged user nobody (root itself ignores modes)."""
    def attempt() -> int:
        refused = 0
        for write in (lambda: (folder / "checker.py").write_text("ok = False\n"),
                      lambda: (folder / "new.py").write_text("planted\n")):
            try:
                write()
            except PermissionError:
                refused += 1
        return refused

    if os.geteuid() != 0:
        return attempt()
    pid = os.fork()
    if pid == 0:                                    # the child: never returns into pytest
        try:
            os.setgid(65534)
            os.setuid(65534)
            os._exit(attempt())
        except BaseException:
            os._exit(99)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_read_only_refuses_writes_where_the_os_enforces_modes():
    """As an ordinary user the package refuses writes while a notebook runs. Root ignores modes, so
    as root read_only() says so (and the grader falls back on comparing files), and the refusal is
    tried as the user nobody, on a folder that is world-writable outside read_only()."""
    folder = Path(tempfile.mkdtemp(prefix="moe_ro_"))
    try:
        folder.chmod(0o777)
        (folder / "checker.py").write_text("ok = True\n")
        (folder / "checker.py").chmod(0o666)
        with read_only(folder) as refused:
            assert refused == (os.geteuid() != 0), refused
            assert _refused_writes(folder) == 2
        assert (folder / "checker.py").read_text() == "ok = True\n" and not (folder / "new.py").exists()
        assert _refused_writes(folder) == 0          # modes put back: the same user writes again
    finally:
        shutil.rmtree(folder)


def test_the_wire_carries_values_and_never_code():
    """What a child answers is read back with weights_only: values only; an object of another type comes back as
    an inert stand-in of the same type name, which the checkers refuse as they would the object."""
    class Thing:
        pass

    t = torch.randn(4, 6)[:, ::2]
    value = (t, [1, 2.5, None, "s", 10 ** 30, np.int64(7), np.zeros(2)], {"k": torch.float32}, Thing())
    back = wire.from_plain(wire.unpack(wire.pack({"value": wire.to_plain(value)}))["value"])
    assert torch.equal(back[0], t) and back[0].stride() == t.stride()
    assert back[1][:5] == [1, 2.5, None, "s", 10 ** 30] and isinstance(back[1][5], np.int64)
    assert isinstance(back[1][6], np.ndarray) and back[2] == {"k": torch.float32}
    assert type(back[3]).__name__ == "Thing" and isinstance(back[3], wire.Opaque)

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    with pytest.raises(pickle.UnpicklingError):
        wire.unpack(pickle.dumps({"value": Evil()}, protocol=2))
    assert json.dumps(wire.to_plain([1, "a"])) == '["list", [1, "a"]]'
