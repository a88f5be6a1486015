"""Grade a class: run every student's exercise notebook and tabulate the checkers' verdicts.

    python -m moe_tutorial.exercises.grade submissions/*.ipynb
    python -m moe_tutorial.exercises.grade --no-execute --details --csv grades.csv submissions/*.ipynb

Each notebook is executed top to bottom (its own kernel, its own folder as working directory,
errors allowed so one broken cell does not hide the rest), then every ``[n.k] PASS/FAIL/NOT
ATTEMPTED`` line the checkers printed is collected; the last verdict of an exercise counts.
``--no-execute`` reads the outputs stored in the files instead (faster, but a student could
have edited them). Executing runs the students' code: do it in a throwaway environment.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .catalog import EXERCISES
from .feedback import VERDICT_RE

SHORT = {"PASS": "PASS", "FAIL": "FAIL", "NOT ATTEMPTED": "todo"}


@dataclass
class Report:
    """One notebook's verdicts: ``{exercise id: (verdict, message)}`` and cell errors."""

    name: str
    verdicts: dict[str, tuple[str, str]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def parts(self) -> set[int]:
        return {int(ex_id.split(".")[0]) for ex_id in self.verdicts}

    def score(self) -> tuple[int, int]:
        ids = [ex for ex in EXERCISES.values() if ex.part in self.parts]
        return sum(self.verdicts.get(ex.id, ("",))[0] == "PASS" for ex in ids), len(ids)


def verdicts_in(text: str) -> dict[str, tuple[str, str]]:
    """Every ``[n.k] VERDICT ...`` block in ``text``; a later one replaces an earlier one."""
    found = {}
    matches = list(VERDICT_RE.finditer(text))
    for m, nxt in zip(matches, matches[1:] + [None]):
        block = text[m.start(): nxt.start() if nxt else len(text)]
        body = [ln for ln in block.splitlines()[1:] if ln.startswith("  ")]   # a FAIL's indented detail
        found[m.group(1)] = (m.group(2), "\n".join([block.splitlines()[0], *body]))
    return found


def _outputs(nb) -> tuple[str, list[str]]:
    text, errors = [], []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stdout":
                text.append(out.get("text", ""))
            elif out.get("output_type") == "error":
                errors.append(f"{out.get('ename')}: {out.get('evalue')}")
    return "".join(text), errors


def grade_notebook(path: Path, name: str, *, execute: bool = True, timeout: int = 300) -> Report:
    """Execute (or just read) one notebook and collect its verdicts."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    report = Report(name)
    if execute:
        from nbclient import NotebookClient
        from nbclient.exceptions import CellTimeoutError, DeadKernelError

        client = NotebookClient(nb, timeout=timeout, allow_errors=True,
                                resources={"metadata": {"path": str(path.parent)}})
        try:
            client.execute()
        except (CellTimeoutError, DeadKernelError) as e:
            report.errors.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    text, errors = _outputs(nb)
    report.verdicts = verdicts_in(text)
    report.errors += errors
    return report


def _names(paths: list[Path]) -> list[str]:
    """Short unique names: the paths relative to their common folder, without ``.ipynb``."""
    paths = [p.resolve() for p in paths]
    root = Path(os.path.commonpath([p.parent for p in paths])) if paths else Path(".")
    return [str(p.relative_to(root).with_suffix("")) for p in paths]


def table(reports: list[Report]) -> str:
    """Rows of notebooks, a column per exercise seen, and the score."""
    ids = [ex_id for ex_id in EXERCISES if any(ex_id in r.verdicts or int(ex_id[0]) in r.parts for r in reports)]
    width = max([len("notebook")] + [len(r.name) for r in reports])
    lines = [f"{'notebook':<{width}}  " + "  ".join(f"{i:<4}" for i in ids) + "  score"]
    for r in reports:
        cells = [SHORT.get(r.verdicts.get(i, ("-",))[0], "-") for i in ids]
        passed, total = r.score()
        lines.append(f"{r.name:<{width}}  " + "  ".join(f"{c:<4}" for c in cells) + f"  {passed}/{total}"
                     + ("  (cell errors)" if r.errors else ""))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moe_tutorial.exercises.grade", description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path, help="the students' exercise notebooks")
    parser.add_argument("--no-execute", action="store_true", help="read stored outputs instead of running")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per cell (default 300)")
    parser.add_argument("--details", action="store_true", help="print every FAIL message and cell error")
    parser.add_argument("--csv", type=Path, help="also write the table as CSV")
    args = parser.parse_args(argv)

    reports = []
    for path, name in zip(args.notebooks, _names(args.notebooks)):
        print(f"grading {name} ...", file=sys.stderr)
        reports.append(grade_notebook(path, name, execute=not args.no_execute, timeout=args.timeout))
    print(table(reports))
    print("\nPASS: right on every problem; FAIL: wrong (--details says how); todo: still the stub; -: no verdict printed")
    if args.details:
        for r in reports:
            fails = [msg for verdict, msg in r.verdicts.values() if verdict == "FAIL"]
            if fails or r.errors:
                print(f"\n== {r.name}")
                print("\n".join(fails + [f"cell error: {e}" for e in r.errors]))
    if args.csv:
        ids = [ex_id for ex_id in EXERCISES if any(int(ex_id[0]) in r.parts for r in reports)]
        with open(args.csv, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["notebook", *ids, "passed", "total"])
            for r in reports:
                writer.writerow([r.name, *[r.verdicts.get(i, ("",))[0] for i in ids], *r.score()])
    return 0


if __name__ == "__main__":
    sys.exit(main())
