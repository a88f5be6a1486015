"""Put a new run's rows of Part 8's step into the committed data file, model by model.

    python3 measurements/scripts/merge_backward_rows.py RUN/h200_backward.csv ... [--into DATA.csv]

``--into`` defaults to ``moe_tutorial/data/h200_backward.csv``. For every model a run timed, the
committed rows of the implementations that run timed are replaced by the run's (each model's rows
of one run stay together, as the readers pair them); the rows of implementations it did not time
(Liger-Kernel, timed apart; ``ours-gathered``) stay as they were.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)
from moe_tutorial.experiments.backward import BACKWARD, FIELDS, load_backward
from moe_tutorial.perf.results import write_csv


def merge(old: list[dict], runs: list[list[dict]]) -> list[dict]:
    """``old`` with each run's rows in place of the ones they measure again, in the old rows' model order."""
    rows = list(old)
    for run in runs:
        timed = {(r["model"], r["impl"]) for r in run}
        kept = [r for r in rows if (r["model"], r["impl"]) not in timed]
        order = list(dict.fromkeys(r["model"] for r in rows + run))
        rows = sorted(kept + run, key=lambda r: order.index(r["model"]))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--into", type=Path, default=BACKWARD)
    args = ap.parse_args(argv)
    rows = merge(load_backward(args.into), [load_backward(p) for p in args.runs])
    write_csv(args.into, rows, FIELDS)
    print(f"wrote {len(rows)} rows to {args.into}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
