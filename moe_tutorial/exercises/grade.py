"""Grade a class: for each notebook, its functions run in a process of their own, the checkers here.

    python -m moe_tutorial.exercises.grade HANDED_IN/*.ipynb
    python -m moe_tutorial.exercises.grade --details --csv grades.csv HANDED_IN/*.ipynb

Run it from the class folder that ``python -m moe_tutorial.exercises.release`` wrote (``make
setup`` there first): it refuses to grade while a solution notebook lies where the graded code
would find it by looking around (:func:`~moe_tutorial.exercises.release.solutions_within_reach`),
unless told ``--allow-solutions``.

How a notebook is graded, by design rather than by guarding against each trick:

- Nothing the notebook prints or displays is read, and its code never runs in this process. A
  child process (:mod:`~moe_tutorial.exercises.sandbox`) runs only the notebook's imports,
  definitions and assignments that call nothing, with a private copy of the package, in an empty
  temporary folder, so check cells, demos and any other top-level code do not run at all.
- The checkers run here, in the grader: each call of the student's function is sent to the
  child, which runs it under the checkers' guards and sends back plain values (:mod:`~moe_tutorial.exercises.wire`:
  tensors, numbers, containers; nothing that runs code when read). The verdict is made here from
  those values and this process's own references, so whatever the notebook's code does in its
  process (patch the checkers, hook imports, forge outputs) cannot reach it.
- Each exercise has one time budget for all its calls (``--limit``); a child that does not answer
  in time is killed, and the next exercise gets a fresh one.
- Every submission is read before any notebook's code runs, and the installed package is read-only
  meanwhile (where the OS enforces it: not for root) and compared before and after each notebook
  anyway: a change is put back and that notebook's verdicts are void.

The score is out of the number of exercises of the part in the catalogue, so a notebook that
breaks at its import cell scores 0. The exit status is 0 when at least one notebook was graded,
1 when none was (or the CSV could not be written), 2 when the grader refused to grade. Executing a
notebook runs the student's code with your rights: do it in a throwaway account or container.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import io
import os
import secrets
import signal
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .. import exercises as checkers
from . import feedback, timelimit, wire
from .catalog import EXERCISES, for_part
from .feedback import Outcome, Remote
from .release import solutions_within_reach
from .sandbox import BOOTSTRAP

SHORT = {"PASS": "PASS", "FAIL": "FAIL", "NOT ATTEMPTED": "todo"}

_PARTS = sorted({ex.part for ex in EXERCISES.values()})

#: The installed package the grader runs; each child gets a private copy of its files.
PACKAGE_DIR = Path(__file__).resolve().parents[1]

#: Seconds a child may run past an exercise's budget before it is killed (its own alarm rings at the budget).
GRACE_S = 5.0


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


# ----------------------------------------------------------------------------- reading notebooks
def part_of(nb) -> int | None:
    """The part a notebook is for, from the exercises' functions and checkers it names; None if unclear."""
    text = "\n".join(cell.source for cell in nb.cells)
    counts = {part: sum(text.count(ex.checker) + text.count(f"def {ex.function}(") for ex in for_part(part))
              for part in _PARTS}
    best = max(counts.values())
    found = [part for part, n in counts.items() if n == best]
    return found[0] if best > 0 and len(found) == 1 else None


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


# ----------------------------------------------------------------------------- the child processes
class Sandbox:
    """The grading run's temporary folder: a private copy of the package for each child, its
    working folder and its log. ``package`` is the package's files as read when grading began."""

    def __init__(self, root: Path, package: dict[Path, bytes]):
        self.root, self.package, self.count = root, package, 0

    def child(self, cells: list, functions: list[str], timeout: float) -> "Child":
        self.count += 1
        home = self.root / f"child{self.count}"
        for path, data in self.package.items():
            rel = path.relative_to(PACKAGE_DIR)
            if "__pycache__" in rel.parts:
                continue
            target = home / "lib" / "moe_tutorial" / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        for sub in ("work", "cells", "home", "tmp", "triton"):
            (home / sub).mkdir(parents=True, exist_ok=True)
        return Child(home, cells, functions, timeout)


class Child:
    """One notebook's code in a process of its own: started with its definitions run (or failed),
    then asked to call its functions. ``errors``: what running the definitions raised, cell by cell;
    ``functions``: ``{name: (kind, module)}`` of the exercises' functions; ``ended``: why the process
    is gone, "" while it runs."""

    def __init__(self, home: Path, cells: list, functions: list[str], timeout: float):
        self.home, self.errors, self.functions, self.ended = home, [], {}, ""
        to_child, self._w = os.pipe()
        self._r, from_child = os.pipe()
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON") and k not in ("PWD", "OLDPWD")}
        env.update(HOME=str(home / "home"), TMPDIR=str(home / "tmp"), TRITON_CACHE_DIR=str(home / "triton"))
        self.log = open(home / "log.txt", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-B", "-c", BOOTSTRAP, str(home / "lib"), str(to_child), str(from_child)],
            pass_fds=(to_child, from_child), cwd=home / "work", env=env, stdin=subprocess.DEVNULL,
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        os.close(to_child)
        os.close(from_child)
        answer = self._ask(("define", cells, functions, str(home / "cells")), timeout, "its definitions")
        if isinstance(answer, str):
            self.errors.append(f"the notebook's imports and definitions did not finish within {timeout:g} s "
                               "(--timeout)" if answer == "timeout" else answer)
            return
        self.errors = [f"{text} (code cell {number})" for number, text in answer.get("errors", [])]
        self.functions = {str(k): (str(v[0]), str(v[1])) for k, v in answer.get("functions", {}).items()}

    def _ask(self, request, timeout: float, during: str = "this call"):
        """The child's answer as a dict, or why there is none ("timeout", or how the process ended)."""
        if self.ended:
            return self.ended
        try:
            wire.send(self._w, wire.request(request))
            return wire.unpack(wire.receive(self._r, timeout=timeout))
        except wire.TimedOut:
            self.stop("it ran past its time and was stopped")
            return "timeout"
        except (wire.Closed, BrokenPipeError, OSError):
            code = self.proc.wait()
            self.stop(f"the process running the notebook's code ended during {during} ({_exit_text(code)}): "
                      "did its code call exit() or os._exit(), or crash the interpreter?")
            return self.ended
        except wire.TooLarge:
            self.stop("it answered more than the grader takes")
            return self.ended
        except Exception as e:  # noqa: BLE001  (an answer that is not plain values)
            self.stop(f"its answer could not be read ({type(e).__name__})")
            return self.ended

    def call(self, name: str, args, kwargs, names, limit: float, watch) -> Outcome:
        answer = self._ask(("call", name, args, kwargs, names, limit, watch), limit + GRACE_S)
        if answer == "timeout":
            return Outcome("timeout")
        if isinstance(answer, str):
            return Outcome("died", text=answer)
        return _outcome(answer)

    def stop(self, why: str = "stopped") -> None:
        if not self.ended:
            self.ended = why
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)      # the child and anything it started
            self.proc.wait()
            for fd in (self._r, self._w):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self.log.close()


def _exit_text(code: int) -> str:
    return f"killed by signal {-code}" if code < 0 else f"exit status {code}"


_KINDS = {"ok", "not_attempted", "not_callable", "package", "package_call", "raised", "oob", "changed", "timeout",
          "died"}


def _outcome(answer: dict) -> Outcome:
    """The child's answer as an Outcome, every field checked to be what it should be."""
    def strings(v, n=50):
        return [str(x)[:200] for x in v[:n]] if isinstance(v, (list, tuple)) else []

    kind = answer.get("kind") if answer.get("kind") in _KINDS else "raised"
    grids = [tuple(int(i) for i in g) if isinstance(g, (list, tuple)) and all(isinstance(i, int) for i in g) else None
             for g in (answer.get("grids") or [])[:1000]]
    launches = answer.get("launches")
    return Outcome(kind, value=wire.from_plain(answer.get("value")), text=str(answer.get("text", ""))[:20000],
                   oob_name=str(answer.get("oob_name", ""))[:200], no_other=strings(answer.get("no_other")),
                   grids=grids, launches=launches if isinstance(launches, int) else 0,
                   inputs_launched=[i for i in (answer.get("inputs_launched") or []) if isinstance(i, int)][:100],
                   package_calls=strings(answer.get("package_calls")))


class RemoteFunction(Remote):
    """A notebook's function, living in a :class:`Child`: the checkers call it through ``call_student``."""

    def __init__(self, child: Child, name: str):
        self.child, self.name = child, name

    def remote_call(self, args, kwargs, names, limit, watch) -> Outcome:
        return self.child.call(self.name, args, kwargs, names, limit, watch)


# ----------------------------------------------------------------------------- grading
@dataclass
class Submission:
    """A notebook as read before any notebook's code runs: ``nb``, or ``why`` it cannot be graded."""

    path: Path
    name: str
    nb: object = None
    why: str = ""


def grade_notebook(sub: Submission, sandbox: Sandbox, *, timeout: float = 300, part: int | None = None) -> Report:
    """Grade every exercise of the notebook's part: its definitions in a child process, each
    exercise's checker here. The installed package is read-only meanwhile (:func:`read_only`); a
    notebook that changed its files on disk all the same (as root) has them put back and every
    verdict void."""
    if sub.nb is None:
        return Report(sub.name, part, not_graded=sub.why)
    report = Report(sub.name, part if part is not None else part_of(sub.nb))
    if report.part is None:
        report.not_graded = "cannot tell which part this notebook is for (pass --part)"
        return report
    cells = [(n, cell.source) for n, cell in enumerate((c for c in sub.nb.cells if c.cell_type == "code"), start=1)]
    exercises = for_part(report.part)
    functions = [ex.function for ex in exercises]
    before = snapshot()
    try:
        with read_only() as report.read_only:
            child = sandbox.child(cells, functions, timeout)
            report.errors += child.errors
            try:
                for ex in exercises:
                    if child.ended:           # killed or ended in an earlier exercise: a fresh one
                        child.stop()
                        child = sandbox.child(cells, functions, timeout)
                    report.verdicts[ex.id] = _grade_exercise(ex, child)
            finally:
                child.stop()
    finally:
        changed = restore(before)
    if changed:
        for ex in exercises:
            report.verdicts[ex.id] = ("FAIL", f"[{ex.id}] FAIL {ex.function}\n  the notebook changed the installed "
                                              f"package's files ({', '.join(changed[:5])}); its verdicts are void "
                                              "(the files are restored)")
    return report


def _grade_exercise(ex, child: Child) -> tuple[str, str]:
    """Exercise ``ex``'s verdict: its checker, run here, on the child's function of its name."""
    kind, _ = child.functions.get(ex.function, ("missing", ""))
    if child.ended and not child.functions:
        return "FAIL", f"[{ex.id}] FAIL {ex.function}\n  no verdict: {child.ended}"
    if kind == "missing":
        return "FAIL", (f"[{ex.id}] FAIL {ex.function}\n  the notebook defines no `{ex.function}`. The grader runs "
                        "only a notebook's imports, def and class statements and assignments that call nothing: a "
                        "function made any other way, or defined in a cell that fails, is not seen")
    with contextlib.redirect_stdout(io.StringIO()):
        getattr(checkers, ex.checker)(RemoteFunction(child, ex.function))
    return feedback.last_verdict(ex.id) or ("FAIL", f"[{ex.id}] FAIL {ex.function}\n  the checker gave no verdict")


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
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds a notebook's imports and definitions may take (default 300)")
    parser.add_argument("--limit", type=float, default=timelimit.CHECK_LIMIT_S,
                        help=f"seconds each exercise's checks may spend in the student's function, all calls "
                             f"together (default {timelimit.CHECK_LIMIT_S:g})")
    parser.add_argument("--details", action="store_true", help="print every FAIL message and cell error")
    parser.add_argument("--csv", type=Path, help="also write the table as CSV")
    parser.add_argument("--allow-solutions", action="store_true",
                        help="grade even where solution notebooks lie within reach of the graded code (a development "
                             "clone): a notebook written to find them could then score with them")
    args = parser.parse_args(argv)
    import nbformat  # noqa: F401  (the grader's own dependency: read before any notebook's code runs)

    # Every module this process needs is imported; from here on it writes no bytecode into the package, so
    # that the comparison of the package's files before and after each notebook sees only the notebook's doing.
    sys.dont_write_bytecode = True

    # SIGTERM as an exception, so that read_only() puts the package's modes back on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    print(f"grading with moe_tutorial from {PACKAGE_DIR}", file=sys.stderr)
    subs = [Submission(path, name) for path, name in zip(args.notebooks, _names(args.notebooks))]
    for sub in subs:                          # every submission read before any notebook's code runs
        sub.nb, sub.why = read_submission(sub.path)
    found = solutions_within_reach()
    if found and not args.allow_solutions:
        print(f"not grading: solution notebooks lie where the graded code could find them by looking around it, "
              f"e.g. {found[0]}. Grade from the class folder that `python -m moe_tutorial.exercises.release` "
              "writes (make setup there, then this command from there), with no clone of the series beside it; or "
              "pass --allow-solutions to grade here all the same (notebooks/exercises/README.md says what that "
              "costs)", file=sys.stderr)
        return 2
    timelimit.CHECK_LIMIT_S = args.limit
    reports = []
    with tempfile.TemporaryDirectory(prefix="moe_grade_") as tmp:
        sandbox = Sandbox(Path(tmp), snapshot())
        for sub in subs:
            print(f"grading {sub.name} ...", file=sys.stderr)
            reports.append(grade_notebook(sub, sandbox, timeout=args.timeout, part=args.part))
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
    status = 0
    if not any(r.part is not None and not r.not_graded for r in reports):
        print("\nnothing was graded: no notebook could be read and matched to a part (see the reasons above)",
              file=sys.stderr)
        status = 1
    if args.csv:
        try:
            write_csv(args.csv, reports)
        except OSError as e:
            print(f"\n--csv: could not write {args.csv} ({e.strerror or e}); the table above is complete",
                  file=sys.stderr)
            return 1
    return status


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
