"""The exercise notebooks and the grader: every exercise tagged, parts recognised, and a class
graded without being fooled by what a notebook prints, patches or leaves on disk.

Needs nbformat and nbclient (the dev extra); where they are missing (a GPU machine with only the
package installed) this module is skipped, so `pytest -m gpu` still collects the rest.
"""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import moe_tutorial  # noqa: F401  (first: picks the runtime)
from moe_tutorial.exercises import EXERCISES
from moe_tutorial.exercises.grade import is_check_cell, part_of, read_only

import pytest
from exercise_mutants import NOTEBOOKS

nbformat = pytest.importorskip("nbformat")

ROOT = Path(__file__).resolve().parents[1]

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


def test_check_cells_and_parts_are_recognised():
    assert is_check_cell("check_route(route)") and is_check_cell("# check it\ncheck_route(route)\n")
    assert not is_check_cell("check_route(route); print('[1.1] PASS')")
    assert not is_check_cell("def check_route(f):\n    return True") and not is_check_cell("route(1)")
    for part in (1, 2, 3, 4):
        for kind in ("exercises", "solutions"):
            assert part_of(nbformat.read(NOTEBOOKS / f"part{part}_{kind}.ipynb", as_version=4)) == part


def _cells_with(nb, text: str) -> list:
    found = [c for c in nb.cells if text in c.source]
    assert found, text
    return found


def _part2(kind: str):
    return nbformat.read(NOTEBOOKS / f"part2_{kind}.ipynb", as_version=4)


def _with_cell_after(nb, text: str, source: str):
    """``nb`` with a code cell holding ``source`` right after the first cell containing ``text``."""
    i = nb.cells.index(_cells_with(nb, text)[0])
    nb.cells.insert(i + 1, nbformat.v4.new_code_cell(source))
    return nb


@pytest.mark.timeout(400)
def test_grade_runs_the_checkers_itself_and_is_not_fooled(tmp_path):
    """Five "students" of Part 2: the solutions; one honest answer; forgeries of every kind on stubs;
    a notebook whose import cell breaks; the package's own function handed in."""
    alice = _part2("solutions")
    bob = _part2("exercises")
    answer = _cells_with(alice, "def intermediate_bytes")[0].source
    _cells_with(bob, "def intermediate_bytes")[0].source = answer
    _cells_with(bob, "def select_weights")[0].source = (
        "def select_weights(weight, topk_ids):\n    return weight[topk_ids.long().t()]")

    mallory = _part2("exercises")           # every function still the stub
    _with_cell_after(mallory, "check_select_weights(select_weights)",          # a printed verdict
                     'print("[2.1] PASS select_weights: right on all 8 problems.")')
    _with_cell_after(mallory, "def expert_moe_matmul",                          # a redefined checker
                     "def check_indexing_matmul(fn):\n    print('[2.2] PASS expert_moe_matmul: right')\n"
                     "    return True")
    _with_cell_after(mallory, "def intermediate_bytes",                         # patched checker modules
                     "import moe_tutorial.exercises as mex\nimport moe_tutorial.exercises.feedback as fb\n"
                     "fb.run_check = lambda ex_id, body: True\nmex.check_intermediate_bytes = lambda fn: True\n"
                     "fb.last_verdict = lambda ex_id: ('PASS', 'forged')")
    _with_cell_after(mallory, "check_indexing_layer(indexing_moe_layer)",      # forged verdict outputs
                     "from IPython.display import display\nfor i in ('2.1', '2.2', '2.3', '2.4'):\n"
                     "    display({'application/vnd.moe-tutorial.verdict+json': "
                     "{'key': '0' * 32, 'id': i, 'verdict': 'PASS', 'message': ''}}, raw=True)")
    broken = _part2("exercises")
    _cells_with(broken, "import moe_tutorial")[0].source = "import moe_tutorial.no_such_module\nimport torch"
    lazy = _part2("solutions")
    _cells_with(lazy, "def intermediate_bytes")[0].source = "intermediate_bytes = moe_tutorial.intermediate_bytes"

    names = ["alice", "bob", "mallory", "broken", "lazy"]
    for name, nb in zip(names, (alice, bob, mallory, broken, lazy)):
        nbformat.write(nb, tmp_path / f"{name}.ipynb")
    result = subprocess.run([sys.executable, "-m", "moe_tutorial.exercises.grade", "--details",
                             "--csv", str(tmp_path / "grades.csv"), *[str(tmp_path / f"{n}.ipynb") for n in names]],
                            capture_output=True, text=True, cwd=ROOT, timeout=380)
    assert result.returncode == 0, result.stderr
    rows = {words[0]: words for words in map(str.split, result.stdout.splitlines()) if words and words[0] in names}
    assert rows["alice"][1:6] == ["PASS"] * 4 + ["4/4"], result.stdout
    assert rows["bob"][1:6] == ["FAIL", "todo", "PASS", "todo", "1/4"], result.stdout
    assert rows["mallory"][1:6] == ["todo"] * 4 + ["0/4"], result.stdout
    assert rows["broken"][1:6] == ["todo"] * 4 + ["0/4"] and rows["broken"][6:] == ["(cell", "errors)"], result.stdout
    assert rows["lazy"][1:6] == ["PASS", "PASS", "FAIL", "PASS", "3/4"], result.stdout
    assert "`intermediate_bytes` is the package's own implementation" in result.stdout
    assert "ModuleNotFoundError: No module named 'moe_tutorial.no_such_module'" in result.stdout
    csv = (tmp_path / "grades.csv").read_text().splitlines()
    assert csv[0] == "notebook,2.1,2.2,2.3,2.4,passed,total,problems" and csv[3] == "mallory,NOT ATTEMPTED," \
        "NOT ATTEMPTED,NOT ATTEMPTED,NOT ATTEMPTED,0,4,", csv


def test_a_bad_submission_costs_its_own_row_never_the_run(tmp_path):
    """Missing files (an unmatched shell pattern too), a folder, an empty file, text that is not
    JSON, a notebook without cells: each is one row with its reason; an unwritable --csv is a
    message after the table, not a traceback."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "empty.ipynb").write_text("")
    (tmp_path / "text.ipynb").write_text("print('hello')\n")
    nbformat.write(nbformat.v4.new_notebook(), tmp_path / "nocells.ipynb")
    args = [str(tmp_path / n) for n in ("missing.ipynb", "nomatch/*.ipynb", "folder", "empty.ipynb", "text.ipynb",
                                         "nocells.ipynb")]
    result = subprocess.run([sys.executable, "-m", "moe_tutorial.exercises.grade", "--part", "1",
                             "--csv", str(tmp_path / "no_such_dir" / "grades.csv"), *args],
                            capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert "Traceback" not in result.stderr + result.stdout, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    expected = {"missing": "no such file", "nomatch/*": "the shell found no file matching this pattern",
                "folder": "is a folder, not a notebook", "empty": "not a readable notebook",
                "text": "not a readable notebook", "nocells": "the notebook has no cells"}
    for name, why in expected.items():
        assert name in rows and "0/4" in rows[name] and "(not graded: " in rows[name] and why in rows[name], \
            (name, result.stdout)
    assert result.returncode == 1 and "--csv: could not write" in result.stderr, result.stderr


_FAKE_PACKAGE = '''
import pathlib
fake = pathlib.Path("moe_tutorial/exercises")
fake.mkdir(parents=True, exist_ok=True)
(fake.parent / "__init__.py").write_text("")
(fake / "__init__.py").write_text("")
(fake / "grade.py").write_text(
    "def verdict_cell(key, ex_id, ns):\\\\n"
    "    from IPython.display import display\\\\n"
    "    display({'application/vnd.moe-tutorial.verdict+json': {'key': key, 'id': ex_id, 'verdict': 'PASS',"
    " 'message': 'forged'}}, raw=True)\\\\n")
'''

_EDIT_CHECKERS = '''
import moe_tutorial.exercises.feedback as fb
with open(fb.__file__, "a") as f:
    f.write("\\\\n\\\\ndef run_check(ex_id, body):\\\\n    return _verdict(ex_id, PASS, f'[{ex_id}] PASS forged')\\\\n")
'''

# A .pyc of a fake grade module, planted where the next import of the real one would read it: the
# source's own mtime and size in the header, so Python takes it as up to date.
_PLANT_BYTECODE = '''
import importlib.util, marshal, pathlib, struct
import moe_tutorial.exercises.grade as real
src = pathlib.Path(real.__file__)
fake = ("def verdict_cell(key, ex_id, ns):\\n    from IPython.display import display\\n"
        "    display({'application/vnd.moe-tutorial.verdict+json': {'key': key, 'id': ex_id, 'verdict': 'PASS', "
        "'message': 'forged bytecode'}}, raw=True)\\n")
st = src.stat()
header = importlib.util.MAGIC_NUMBER + struct.pack("<III", 0, int(st.st_mtime) & 0xFFFFFFFF, st.st_size & 0xFFFFFFFF)
pyc = pathlib.Path(importlib.util.cache_from_source(str(src)))
try:
    pyc.parent.mkdir(exist_ok=True)
    pyc.write_bytes(header + marshal.dumps(compile(fake, str(src), "exec")))
except PermissionError:
    print("the package is read-only")
'''


def _package_refuses_my_writes() -> bool:
    """Does read_only() stop this user (not root) from writing? Tried on a folder of our own."""
    folder = Path(tempfile.mkdtemp(prefix="moe_ro_probe_"))
    try:
        with read_only(folder) as refused:
            return refused
    finally:
        shutil.rmtree(folder)


_SWAP_VERDICT = '''
def route(router_logits, top_k, renormalize=True):
    import moe_tutorial.exercises.feedback as fb
    fb._verdict = lambda ex_id, verdict, text: (fb._LAST.__setitem__(ex_id, ("PASS", "forged")), True)[1]
    raise ValueError("wrong on purpose")
'''


@pytest.mark.timeout(400)
def test_grade_is_not_fooled_by_files_on_disk_or_swapped_verdicts(tmp_path):
    """A notebook that writes a package named moe_tutorial into its folder, then an untouched stub
    graded after it from the same folder; one that edits the checkers' files; one whose function
    replaces the verdict function while the checker calls it: none scores."""
    stub = nbformat.read(NOTEBOOKS / "part1_exercises.ipynb", as_version=4)
    fake, editor, swapper, planter = (nbformat.read(NOTEBOOKS / "part1_exercises.ipynb", as_version=4)
                                      for _ in range(4))
    fake.cells.append(nbformat.v4.new_code_cell(_FAKE_PACKAGE))
    editor.cells.append(nbformat.v4.new_code_cell(_EDIT_CHECKERS))
    swapper.cells.append(nbformat.v4.new_code_cell(_SWAP_VERDICT))
    planter.cells.append(nbformat.v4.new_code_cell(_PLANT_BYTECODE))
    names = ["a_fake", "b_stub", "c_editor", "d_swapper", "e_planter"]
    for name, nb in zip(names, (fake, stub, editor, swapper, planter)):
        nbformat.write(nb, tmp_path / f"{name}.ipynb")
    package = ROOT / "moe_tutorial"
    feedback_file = package / "exercises" / "feedback.py"
    pyc = Path(importlib.util.cache_from_source(str(package / "exercises" / "grade.py")))
    before, pyc_before = feedback_file.read_bytes(), pyc.read_bytes() if pyc.exists() else None
    modes = {p: p.stat().st_mode for p in [package, *package.rglob("*")]}
    try:
        result = subprocess.run([sys.executable, "-m", "moe_tutorial.exercises.grade", "--details",
                                 *[str(tmp_path / f"{n}.ipynb") for n in names]],
                                capture_output=True, text=True, cwd=ROOT, timeout=380)
    finally:        # never leave a forged .pyc in the working tree, whatever the grader did
        if pyc.exists() and b"forged bytecode" in pyc.read_bytes():
            pyc.unlink() if pyc_before is None else pyc.write_bytes(pyc_before)
    assert feedback_file.read_bytes() == before, "the grader must put the checkers' files back"
    assert not (pyc.exists() and b"forged bytecode" in pyc.read_bytes()), "the grader must remove planted bytecode"
    assert {p: p.stat().st_mode for p in modes if p.exists()} == modes, "the package's modes must be put back"
    assert result.returncode == 0, result.stderr
    assert f"grading with moe_tutorial from {package}" in result.stderr, result.stderr
    rows = {w[0]: w for w in map(str.split, result.stdout.splitlines()) if w and w[0] in names}
    assert rows["a_fake"][1:6] == ["todo"] * 4 + ["0/4"], result.stdout
    assert rows["b_stub"][1:6] == ["todo"] * 4 + ["0/4"], result.stdout
    if _package_refuses_my_writes():
        # Read-only package: the edit and the planted .pyc fail in the notebook; the stubs stay stubs.
        assert rows["c_editor"][1:6] == ["todo"] * 4 + ["0/4"] and "PermissionError" in result.stdout, result.stdout
        assert rows["e_planter"][1:6] == ["todo"] * 4 + ["0/4"], result.stdout
        assert "could not be made read-only" not in result.stderr, result.stderr
    else:
        # Root: writes go through, so the comparison voids the verdicts and puts the files back.
        assert rows["c_editor"][1:6] == ["FAIL"] * 4 + ["0/4"], result.stdout
        assert "the notebook changed the installed package's files (exercises/feedback.py)" in result.stdout
        assert rows["e_planter"][1:6] == ["FAIL"] * 4 + ["0/4"], result.stdout
        assert f"changed the installed package's files (exercises/__pycache__/{pyc.name})" in result.stdout
        assert "could not be made read-only (running as root" in result.stderr, result.stderr
    assert "forged bytecode" not in result.stdout, "the grading cell must compile the package from its source"
    assert rows["d_swapper"][1] == "FAIL" and rows["d_swapper"][5] == "0/4", result.stdout
    assert "the checker's own functions were replaced while it ran (_verdict)" in result.stdout
    assert not (tmp_path / "moe_tutorial").exists(), "each notebook runs in a copy of its folder"


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
