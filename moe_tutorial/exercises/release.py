"""An instructor's release: the class's copy of the series, without the solution notebooks.

    python -m moe_tutorial.exercises.release CLASS_FOLDER

run from a clone of the series, writes into a new (or empty) folder what students need: the
package, the lesson notebooks, each part's exercise notebook (its link to the worked answers
replaced), a students' page for the exercises, and what ``make setup`` and ``make lab`` read.
It leaves out the solution notebooks, the tests (which read them) and the measurement notes,
then checks that no notebook in the folder holds a solution. Students work in a copy of that
folder; the instructor grades from it too (``make setup`` there, then the grader), so that no
solution notebook lies beside the package the grader runs: the grader refuses to grade where one
does (:func:`solutions_within_reach`).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from .catalog import EXERCISES, for_part
from .timelimit import CHECK_LIMIT_S

#: The package the release copies, and the clone it lives in.
PACKAGE_DIR = Path(__file__).resolve().parents[1]
SOURCE_ROOT = PACKAGE_DIR.parent

#: Files and folders of the clone a class needs besides the notebooks (what make setup and make lab read).
_COPIED = ("Makefile", "pyproject.toml", "environment.yml", "docs/seed-article.md")

#: What replaces an exercise notebook's line about its solution notebook.
NO_SOLUTIONS = "Worked answers: from your instructor, after the exercises are handed in."

#: The tag of the cells that hold a worked answer, in the solution notebooks.
SOLUTION_TAG = "solution"


def parts() -> list[int]:
    """The parts that have exercises, from the catalogue."""
    return sorted({ex.part for ex in EXERCISES.values()})


def is_solution_notebook(path: Path) -> bool:
    """A notebook named ``*_solutions.ipynb``, or one with a cell tagged "solution"."""
    if path.name.endswith("_solutions.ipynb"):
        return True
    try:
        if path.stat().st_size > 64 << 20:
            return False
        cells = json.loads(path.read_text(errors="replace")).get("cells", [])
    except (OSError, ValueError, AttributeError):
        return False
    return any(SOLUTION_TAG in (c.get("metadata", {}).get("tags") or []) for c in cells if isinstance(c, dict))


def solution_notebooks_under(root: Path, *, limit: int = 5) -> list[Path]:
    """Up to ``limit`` solution notebooks in ``root``'s tree (hidden folders and caches skipped)."""
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in ("__pycache__", "node_modules"))
        for name in sorted(files):
            if name.endswith(".ipynb") and is_solution_notebook(Path(folder) / name):
                found.append(Path(folder) / name)
                if len(found) >= limit:
                    return found
    return found


def solutions_within_reach() -> list[Path]:
    """Solution notebooks where a notebook's code, run by the grader, would find them by looking
    around it: in the source tree of the package the grader runs (a clone of the series) and in the
    folders on ``sys.path``. (The graded code gets neither the submissions' folder nor the grader's
    working folder.) It cannot search the whole disk: a machine or account that also holds a clone
    of the series holds its solutions, and code written to look for them could find them."""
    roots = [PACKAGE_DIR.parent] + [Path(p) for p in sys.path if p and Path(p).is_dir()]
    seen, found = [], []
    for root in sorted({r.resolve() for r in roots}, key=lambda r: len(r.parts)):
        if any(root == s or s in root.parents for s in seen):
            continue                                  # inside a tree already searched
        seen.append(root)
        found += solution_notebooks_under(root)
    return found


def _exercise_notebook(source: Path, dest: Path) -> None:
    """Copy an exercise notebook with its lines about the solution notebook replaced."""
    nb = json.loads(source.read_text())
    for cell in nb["cells"]:
        text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if "_solutions.ipynb" in text:
            lines = [NO_SOLUTIONS if "_solutions.ipynb" in line else line for line in text.split("\n")]
            cell["source"] = "\n".join(lines)
        if SOLUTION_TAG in cell.get("metadata", {}).get("tags", []):
            raise ValueError(f"{source}: a cell tagged {SOLUTION_TAG!r} in an exercise notebook")
    dest.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def students_page() -> str:
    """The exercises' page in the class folder (``notebooks/exercises/README.md``), from the catalogue."""
    rows = "\n".join(f"| {ex.id} | {ex.title} | `{ex.function}` | {ex.level} | {ex.minutes} |"
                     for ex in EXERCISES.values())
    return f"""# Exercises

Open `partN_exercises.ipynb` for the part you have read (lesson `0N_...ipynb` in the folder above),
run its first cell, then for each exercise replace the stub (a function whose body raises
`NotImplementedError`) and run the check cell below it. The checker prints one line: `PASS`,
`FAIL` with what is wrong and where to look, or `NOT ATTEMPTED` while the function is still the
stub.

| id | exercise | function | level | minutes |
|---|---|---|---|---|
{rows}

**What counts as an answer.** Your function must compute its result itself. Calling the package's
own implementation of the step you are writing (`moe_tutorial.route` in 1.1, one of the
package's first GEMMs in 1.3, 2.2, 3.2 to 3.4, 4.3 and 4.4, its gradients in 8.1 and 8.2, ...)
is not an answer: the checker says so and fails it. Where an exercise gives you a step of an
earlier one from the package (4.3 uses `moe_tutorial.align_block_size`), use it.

**How your notebook is graded.** The grader runs only your notebook's imports, `def` and `class`
statements and simple assignments (`BLOCK_N = 16`), each in a fresh process, then calls each
exercise's function and checks what it returns, as the check cells do. Code outside functions
(prints, demos, the check cells) is not run, so a function must not depend on it. Each exercise
gets one time budget for all its checker's calls ({CHECK_LIMIT_S:g} seconds unless your instructor
says otherwise).
"""


def release(dest: Path, source_root: Path = SOURCE_ROOT) -> list[Path]:
    """Write the class folder ``dest`` (new or empty) from the clone at ``source_root``; returns
    the files written. Raises ValueError where the clone lacks a notebook or the result would hold a
    solution."""
    notebooks = source_root / "notebooks"
    exercises = [notebooks / "exercises" / f"part{p}_exercises.ipynb" for p in parts()]
    missing = [str(p) for p in exercises + [source_root / c for c in _COPIED] if not p.exists()]
    if missing or not (source_root / "moe_tutorial").is_dir():
        raise ValueError(f"release: expected a clone of the series at {source_root}, missing "
                         f"{', '.join(missing) or 'moe_tutorial/'}")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ValueError(f"release: expected a new or empty folder, got {dest}, which "
                         f"{'holds files' if dest.is_dir() else 'is a file'}")
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source_root / "moe_tutorial", dest / "moe_tutorial",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in _COPIED:
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source_root / name, dest / name)
    (dest / "notebooks" / "exercises").mkdir(parents=True)
    for lesson in sorted(notebooks.glob("[0-9][0-9]_*.ipynb")):
        shutil.copy2(lesson, dest / "notebooks" / lesson.name)
    for nb in exercises:
        _exercise_notebook(nb, dest / "notebooks" / "exercises" / nb.name)
    (dest / "notebooks" / "exercises" / "README.md").write_text(students_page())
    (dest / "README.md").write_text(_class_readme())
    found = solution_notebooks_under(dest)
    if found:
        raise ValueError(f"release: {found[0]} holds solutions; the class folder must not")
    _check_stubs(dest)
    return sorted(p for p in dest.rglob("*") if p.is_file())


def _check_stubs(dest: Path) -> None:
    """Every exercise of the catalogue has its stub (a cell tagged "stub" defining its function) in the release."""
    for part in parts():
        nb = json.loads((dest / "notebooks" / "exercises" / f"part{part}_exercises.ipynb").read_text())
        stubs = "\n".join("".join(c["source"]) for c in nb["cells"] if "stub" in c.get("metadata", {}).get("tags", []))
        for ex in for_part(part):
            if f"def {ex.function}(" not in stubs and f"\n{ex.function} = " not in "\n" + stubs:
                raise ValueError(f"release: part{part}_exercises.ipynb has no stub for {ex.id} ({ex.function})")


def _class_readme() -> str:
    return """# Fused MoE, from loops to Triton: the class's copy

The lesson notebooks are in `notebooks/` (`01_...` to the last part), the exercises in
`notebooks/exercises/` (see its README). To start, with Python 3 and pip:

    make lab        # sets up .venv, then opens JupyterLab on notebooks/

No GPU is needed: without one, Triton's interpreter runs the kernels on the CPU.
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moe_tutorial.exercises.release",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("dest", type=Path, help="the class folder to write (new or empty)")
    args = parser.parse_args(argv)
    try:
        files = release(args.dest)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    print(f"wrote {len(files)} files to {args.dest}, without solutions:\n"
          f"  students: a copy of {args.dest} each, then `make lab` there "
          f"(exercises: notebooks/exercises/part{{{','.join(map(str, parts()))}}}_exercises.ipynb)\n"
          f"  grading: `make setup` in {args.dest}, then from there\n"
          f"    .venv/bin/python -m moe_tutorial.exercises.grade --details --csv grades.csv HANDED_IN/*.ipynb")
    return 0


if __name__ == "__main__":
    sys.exit(main())
