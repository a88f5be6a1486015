"""Grade a class: run each student's exercise notebook, then run the checkers on the functions it defined.

    python -m moe_tutorial.exercises.grade submissions/*.ipynb
    python -m moe_tutorial.exercises.grade --details --csv grades.csv submissions/*.ipynb

Nothing a notebook prints counts. Each notebook runs top to bottom in its own kernel (a fresh
temporary copy of its folder as working directory, errors allowed so that one broken cell does not
hide the rest) with its check cells left out. While it runs, the installed package's files and
folders are read-only (where the OS enforces it: not for root), and its files are compared before
and after anyway, and put back if the notebook changed them. Then, in that kernel, the grader drops
every ``moe_tutorial`` module the notebook may have imported or patched, imports the checkers
afresh from the installed package's source (a fresh bytecode cache, every module's file checked)
and runs the checker of each
exercise of the notebook's part on the function of the exercise's name (``route`` for 1.1, ...).
Each verdict comes back as a display output tagged with a key drawn for this run, so text the
notebook prints, or outputs it forges, are never read. The score is out of the number of
exercises of the part in the catalogue: a notebook that breaks at its import cell scores 0/4.
Executing a notebook runs the student's code: do it in a throwaway environment.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import csv
import os
import secrets
import shutil
import signal
import stat
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .catalog import EXERCISES, for_part

SHORT = {"PASS": "PASS", "FAIL": "FAIL", "NOT ATTEMPTED": "todo"}

#: The MIME type of the grader's verdict outputs.
VERDICT_MIME = "application/vnd.moe-tutorial.verdict+json"

_CHECKERS = {ex.checker for ex in EXERCISES.values()}
_PARTS = sorted({ex.part for ex in EXERCISES.values()})

# Run in the student's kernel, once per exercise, after every cell of the notebook. It first drops
# the package's modules and puts the installed package's folder first on sys.path (taking out the
# notebook's own folder, where it may have written a package of that name), clears the import
# system's cached finders and points the bytecode cache at a folder it makes (a .pyc planted in the
# package's __pycache__ is never read), so that the checkers it imports are the
# installed source files, not objects the notebook replaced or patched. It checks that every
# moe_tutorial module came from the installed package before running any of it: a fake would
# write its own verdict.
_GRADE_CELL = """\
import sys as _moe_sys, os as _moe_os
for _moe_name in [n for n in _moe_sys.modules if n == "moe_tutorial" or n.startswith("moe_tutorial.")]:
    del _moe_sys.modules[_moe_name]
_moe_sys.path[:] = [{root!r}] + [p for p in _moe_sys.path
                                 if _moe_os.path.realpath(p or ".") != _moe_os.path.realpath(_moe_os.getcwd())]
_moe_sys.path_importer_cache.clear()        # finders the notebook's imports cached, for its own folder too
# Bytecode compiled afresh into a folder made now, under a name the notebook's code could not know
# (kept for this notebook's next grading cells under an attribute named after the run's key), never
# read from the package's __pycache__.
_moe_pyc = getattr(_moe_sys, "_moe_grade_pyc_{key}", None)
if _moe_pyc is None:
    import tempfile as _moe_tempfile
    _moe_pyc = _moe_tempfile.mkdtemp(dir={pycache!r})
    setattr(_moe_sys, "_moe_grade_pyc_{key}", _moe_pyc)
_moe_sys.pycache_prefix = _moe_pyc
_moe_sys.dont_write_bytecode = False
import moe_tutorial as _moe_pkg
import moe_tutorial.exercises.grade as _moe_grade
_moe_files = {{str(getattr(m, "__file__", None)) for n, m in list(_moe_sys.modules.items())
               if n == "moe_tutorial" or n.startswith("moe_tutorial.")}}
_moe_from = sorted(f for f in _moe_files if not _moe_os.path.realpath(f).startswith({package!r} + _moe_os.sep))
if _moe_from:
    from IPython.display import display as _moe_display
    _moe_display({{{mime!r}: {{"key": {key!r}, "id": {ex_id!r}, "verdict": "FAIL", "message":
        "[{ex_id}] FAIL: moe_tutorial was imported from " + ", ".join(_moe_from[:3]) + ", not from the installed "
        "package at {package}"}}}}, raw=True)
else:
    _moe_grade.verdict_cell({key!r}, {ex_id!r}, get_ipython().user_ns)
"""

#: The installed package the grader runs: the graded kernels must import this one.
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def snapshot(folder: Path = PACKAGE_DIR) -> dict[Path, bytes]:
    """Every file of the installed package, bytecode caches included, as bytes: what a notebook must
    leave unchanged (the graded kernel writes no bytecode, so a new .pyc is the notebook's)."""
    return {p: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def restore(before: dict[Path, bytes], folder: Path = PACKAGE_DIR) -> list[str]:
    """Put the package's files back as ``before`` had them; returns those that had changed
    (edited, removed or added), relative to the package's folder."""
    changed = []
    now = snapshot(folder)
    for p, data in before.items():
        if now.get(p) != data:
            changed.append(str(p.relative_to(folder)))
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
    for p in now.keys() - before.keys():
        changed.append(str(p.relative_to(folder)))
        p.unlink()
    return sorted(changed)


@contextlib.contextmanager
def read_only(folder: Path = PACKAGE_DIR):
    """Take the write bits off every file and folder under ``folder`` while active, and put each
    mode back afterwards, also when the body raises (or the grader gets SIGTERM).

    Yields True when writing is really refused: False where the OS ignores the modes (root, or
    CAP_DAC_OVERRIDE) or where the modes could not be changed (files of another user); then only
    the before-and-after comparison (:func:`snapshot`, :func:`restore`) protects the package.
    """
    paths = [folder, *sorted(folder.rglob("*"))]
    modes = {}
    try:
        for path in paths:
            if path.is_symlink():
                continue
            mode = stat.S_IMODE(path.stat().st_mode)
            modes[path] = mode
            try:
                path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
            except OSError:
                pass            # not ours: the probe below says whether writes are refused all the same
        yield _writes_refused(folder)
    finally:
        for path, mode in reversed(list(modes.items())):
            with contextlib.suppress(OSError):
                path.chmod(mode)


def _writes_refused(folder: Path) -> bool:
    """Does creating a file in ``folder`` fail? (Root creates it whatever the modes say.)"""
    probe = folder / f".moe_grade_probe_{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError:
        return True
    os.close(fd)
    probe.unlink()
    return False


@dataclass
class Report:
    """One notebook's grades: its part, ``{exercise id: (verdict, message)}``, and cell errors."""

    name: str
    part: int | None = None
    verdicts: dict[str, tuple[str, str]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    #: Why the notebook could not be graded at all (missing, a folder, not a notebook, ...), or "".
    not_graded: str = ""
    #: Whether the installed package refused writes while the notebook ran (False as root; None: not run).
    read_only: bool | None = None

    @property
    def parts(self) -> set[int]:
        return {self.part} if self.part is not None else set()

    def score(self) -> tuple[int, int]:
        """``(passed, exercises of the part)``; the denominator comes from the catalogue."""
        if self.part is None:
            return 0, 0
        ids = [ex.id for ex in for_part(self.part)]
        return sum(self.verdicts.get(i, ("",))[0] == "PASS" for i in ids), len(ids)


# ----------------------------------------------------------------------------- in the student's kernel
def verdict_cell(key: str, ex_id: str, namespace: dict) -> None:
    """Run exercise ``ex_id``'s checker on ``namespace[<the exercise's function>]`` and display the
    verdict as a :data:`VERDICT_MIME` output tagged with ``key``. Runs inside the graded kernel."""
    import contextlib
    import importlib
    import io

    from IPython.display import display

    from . import feedback

    checkers = importlib.import_module(__package__)        # moe_tutorial.exercises, as fresh as this module

    ex = EXERCISES[ex_id]
    fn = namespace.get(ex.function)
    head = f"[{ex_id}] {feedback.FAIL} {ex.function}\n  "
    if fn is None:
        verdict = (feedback.FAIL, head + f"the notebook defines no `{ex.function}`")
    elif (getattr(fn, "__module__", None) or "").split(".")[0] == "moe_tutorial":
        verdict = (feedback.FAIL, head + f"`{ex.function}` is the package's own implementation "
                                         f"({fn.__module__}), not the student's")
    else:
        # What the verdict depends on, taken before the student's code runs inside the checker: if
        # any of it is replaced during the call, the verdict is void.
        checker, store = getattr(checkers, ex.checker), feedback._LAST
        machinery = {name: getattr(feedback, name)
                     for name in ("run_check", "_verdict", "last_verdict", "call_student")}
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            returned = checker(fn)
        swapped = [name for name, f in machinery.items() if getattr(feedback, name) is not f]
        if feedback._LAST is not store or getattr(checkers, ex.checker) is not checker:
            swapped.append("the checker or its verdict store")
        verdict = store.get(ex_id) or (feedback.FAIL, head + "the checker gave no verdict")
        if swapped:
            verdict = (feedback.FAIL,
                       head + f"the checker's own functions were replaced while it ran ({', '.join(swapped)})")
        elif (returned is True) != (verdict[0] == feedback.PASS):
            verdict = (feedback.FAIL,
                       head + "the checker's verdict and its return value disagree (changed while it ran)")
    display({VERDICT_MIME: {"key": key, "id": ex_id, "verdict": verdict[0], "message": verdict[1]}}, raw=True)


# ----------------------------------------------------------------------------- reading notebooks
def part_of(nb) -> int | None:
    """The part a notebook is for, from the exercises' functions and checkers it names; None if unclear."""
    text = "\n".join(cell.source for cell in nb.cells)
    counts = {part: sum(text.count(ex.checker) + text.count(f"def {ex.function}(") for ex in for_part(part))
              for part in _PARTS}
    best = max(counts.values())
    found = [part for part, n in counts.items() if n == best]
    return found[0] if best > 0 and len(found) == 1 else None


def is_check_cell(source: str) -> bool:
    """True for a cell that only calls checkers (``check_route(route)``): the grader runs those itself."""
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return False
    calls = [node.value for node in tree.body if isinstance(node, ast.Expr)]
    return bool(tree.body) and len(calls) == len(tree.body) and all(
        isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id in _CHECKERS for c in calls)


def read_submission(path: Path):
    """``(notebook, None)``, or ``(None, why it cannot be graded)`` for anything that is not a
    readable notebook with cells: one bad submission costs its own row, never the class's run."""
    import nbformat

    if not path.exists():
        why = f"no such file: {path}"
        if any(c in str(path) for c in "*?["):
            why += " (the shell found no file matching this pattern, so it passed the pattern itself)"
        return None, why
    if path.is_dir():
        return None, f"{path} is a folder, not a notebook (name the .ipynb files in it, e.g. {path}/*.ipynb)"
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as e:                        # empty, not JSON, not a notebook, unreadable
        first = (str(e).strip().splitlines() or [""])[0][:200]
        return None, f"not a readable notebook ({type(e).__name__}: {first or 'empty file'})"
    if not nb.get("cells"):
        return None, "the notebook has no cells"
    return nb, None


def grade_notebook(path: Path, name: str, *, timeout: int = 300, part: int | None = None) -> Report:
    """Execute one notebook without its check cells, in a fresh temporary copy of its folder, then
    grade every exercise of its part. The installed package is read-only meanwhile (:func:`read_only`);
    a notebook that changed its files on disk all the same (as root) has them put back and every
    verdict void."""
    nb, why = read_submission(path)
    if nb is None:
        return Report(name, part, not_graded=why)
    report = Report(name, part if part is not None else part_of(nb))
    if report.part is None:
        report.not_graded = "cannot tell which part this notebook is for (pass --part)"
        return report
    with tempfile.TemporaryDirectory(prefix="moe_grade_") as tmp:
        # A fresh copy of the notebook's folder: what an earlier notebook wrote there is not seen.
        work = Path(tmp) / "work"
        shutil.copytree(path.parent, work, ignore=shutil.ignore_patterns(".*", "__pycache__"), symlinks=True)
        before = snapshot()
        try:
            with read_only() as report.read_only:
                pycache = Path(tmp) / "pycache"     # the grading cells make their bytecode folder in it
                pycache.mkdir()
                _execute(nb, report, work, timeout, pycache)
        finally:
            changed = restore(before)
    if changed:
        for ex in for_part(report.part):
            report.verdicts[ex.id] = ("FAIL", f"[{ex.id}] FAIL {ex.function}\n  the notebook changed the installed "
                                              f"package's files ({', '.join(changed[:5])}); its verdicts are void "
                                              "(the files are restored)")
    return report


def _execute(nb, report: Report, work: Path, timeout: int, pycache: Path) -> None:
    """Run ``nb`` without its check cells in ``work`` and put each exercise's verdict in ``report``;
    the grading cells compile the package into a bytecode cache they make inside ``pycache``."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import DeadKernelError

    graded = copy.deepcopy(nb)
    for cell in graded.cells:
        if cell.cell_type == "code" and is_check_cell(cell.source):
            cell.source = ""          # nbclient skips empty cells
            cell.outputs = []
    first = len(graded.cells)
    key = secrets.token_hex(16)
    exercises = for_part(report.part)
    for ex in exercises:
        graded.cells.append(nbformat.v4.new_code_cell(_GRADE_CELL.format(
            key=key, ex_id=ex.id, mime=VERDICT_MIME, root=str(PACKAGE_DIR.parent), package=str(PACKAGE_DIR),
            pycache=str(pycache))))

    client = NotebookClient(graded, timeout=timeout, allow_errors=True, interrupt_on_timeout=True,
                            error_on_timeout={"ename": "Timeout", "evalue": f"the cell ran longer than {timeout} s"},
                            resources={"metadata": {"path": str(work)}})
    died = ""
    # No bytecode written by the kernel: the notebook's own imports of the package leave its folder as it was.
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        client.execute(env=env)
    except DeadKernelError as e:
        died = f"the kernel died ({str(e).splitlines()[0] if str(e) else 'no reason given'})"
    for cell in graded.cells[:first]:
        report.errors += _cell_errors(cell, timeout)
    for ex, cell in zip(exercises, graded.cells[first:]):
        why = died or (_cell_errors(cell, timeout) or ["the grading cell did not run"])[0]
        report.verdicts[ex.id] = _verdict_from(cell, key, ex.id) or (
            "FAIL", f"[{ex.id}] FAIL {ex.function}\n  no verdict: {why}")
    if died:
        report.errors.append(died)


def _verdict_from(cell, key: str, ex_id: str) -> tuple[str, str] | None:
    """The verdict this run's grading cell displayed, if it did; nothing else is believed."""
    for out in cell.get("outputs", []):
        data = out.get("data", {}) if out.get("output_type") == "display_data" else {}
        v = data.get(VERDICT_MIME)
        if isinstance(v, dict) and v.get("key") == key and v.get("id") == ex_id and v.get("verdict") in SHORT:
            return v["verdict"], str(v.get("message", ""))
    return None


def _cell_errors(cell, timeout: int) -> list[str]:
    """The errors a cell's outputs show; an interrupted cell ran past the time limit."""
    errors = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            if out.get("ename") == "KeyboardInterrupt":
                errors.append(f"interrupted after {timeout} s (--timeout)")
            else:
                errors.append(f"{out.get('ename')}: {out.get('evalue')}")
    return errors


# ----------------------------------------------------------------------------- the table
def _names(paths: list[Path]) -> list[str]:
    """Short unique names: the paths relative to their common folder, without ``.ipynb``."""
    paths = [p.resolve() for p in paths]
    root = Path(os.path.commonpath([p.parent for p in paths])) if paths else Path(".")
    return [str(p.relative_to(root).with_suffix("")) for p in paths]


def _columns(reports: list[Report]) -> list[str]:
    return [ex_id for ex_id, ex in EXERCISES.items() if any(ex.part in r.parts for r in reports)]


def table(reports: list[Report]) -> str:
    """Rows of notebooks, a column per exercise of the parts graded, and the score."""
    ids = _columns(reports)
    width = max([len("notebook")] + [len(r.name) for r in reports])
    lines = [f"{'notebook':<{width}}  " + "  ".join(f"{i:<4}" for i in ids) + "  score"]
    for r in reports:
        cells = [SHORT.get(r.verdicts.get(i, ("-",))[0], "-") for i in ids]
        passed, total = r.score()
        lines.append(f"{r.name:<{width}}  " + "  ".join(f"{c:<4}" for c in cells)
                     + f"  {passed}/{total if total else '?'}" + ("  (cell errors)" if r.errors else "")
                     + (f"  (not graded: {r.not_graded})" if r.not_graded else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moe_tutorial.exercises.grade",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path, help="the students' exercise notebooks")
    parser.add_argument("--part", type=int, choices=_PARTS, help="the part, when a notebook does not show it")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell (default 300)")
    parser.add_argument("--details", action="store_true", help="print every FAIL message and cell error")
    parser.add_argument("--csv", type=Path, help="also write the table as CSV")
    args = parser.parse_args(argv)

    # SIGTERM as an exception, so that read_only() puts the package's modes back on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    print(f"grading with moe_tutorial from {PACKAGE_DIR}", file=sys.stderr)
    reports = []
    for path, name in zip(args.notebooks, _names(args.notebooks)):
        print(f"grading {name} ...", file=sys.stderr)
        reports.append(grade_notebook(path, name, timeout=args.timeout, part=args.part))
    if any(r.read_only is False for r in reports):
        print("note: the package could not be made read-only (running as root, or its files are not yours): its "
              "files were compared before and after each notebook instead, and put back where changed",
              file=sys.stderr)
    print(table(reports))
    print("\nPASS: right on every problem; FAIL: wrong (--details says how); todo: still the stub; "
          "-: not an exercise of this notebook's part")
    if args.details:
        for r in reports:
            fails = [msg for verdict, msg in r.verdicts.values() if verdict == "FAIL"]
            if fails or r.errors:
                print(f"\n== {r.name}")
                print("\n".join(fails + [f"cell error: {e}" for e in r.errors]))
    if args.csv:
        try:
            write_csv(args.csv, reports)
        except OSError as e:
            print(f"\n--csv: could not write {args.csv} ({e.strerror or e}); the table above is complete",
                  file=sys.stderr)
            return 1
    return 0


def write_csv(path: Path, reports: list[Report]) -> None:
    """The table as CSV: a row per notebook, the verdict per exercise, passed and total, and the
    reason a notebook could not be graded, or its cell errors (empty when there were none)."""
    ids = _columns(reports)
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["notebook", *ids, "passed", "total", "problems"])
        for r in reports:
            writer.writerow([r.name, *[r.verdicts.get(i, ("",))[0] for i in ids], *r.score(),
                             r.not_graded or "; ".join(r.errors)])


if __name__ == "__main__":
    sys.exit(main())
