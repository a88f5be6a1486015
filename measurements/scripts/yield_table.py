"""Gather the runs of ``yield_layer.py`` (the FP8 layer with its multiply runs edited to yield, against
itself unedited) into one data file.

    python3 measurements/scripts/yield_table.py RUN.csv ... [--into DATA.csv]

Each ``RUN.csv`` is one process's ``yield_layer.csv``; its rows keep the run's folder as ``source``.
Rows that ran (status ok) are kept, in the columns of ``gluon_fp8.YIELD_FIELDS``. ``--into`` defaults
to ``moe_tutorial/data/h100_fp8_yield.csv``; the file is written anew from the runs given.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)
from moe_tutorial.experiments.gluon_fp8 import YIELD, YIELD_FIELDS, YIELD_FORMS, gathered_runs
from moe_tutorial.perf.results import write_csv


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path, help="yield_layer.csv files")
    ap.add_argument("--into", type=Path, default=YIELD)
    args = ap.parse_args(argv)
    rows = gathered_runs(args.runs, YIELD_FORMS)
    write_csv(args.into, rows, list(YIELD_FIELDS))
    print(f"wrote {len(rows)} rows to {args.into}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
