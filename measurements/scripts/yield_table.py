"""Gather the runs of ``yield_layer.py`` (the FP8 layer with its multiply runs edited to yield, against
itself unedited) into one data file.

    python3 measurements/scripts/yield_table.py RUN.csv ... [--into DATA.csv]

Each ``RUN.csv`` is one process's ``yield_layer.csv``; its rows keep the run's folder as ``source``.
Rows that ran (status ok) are kept, in the columns of ``gluon_fp8.YIELD_FIELDS``. ``--into`` defaults
to ``moe_tutorial/data/h100_fp8_yield.csv``; the file is written anew from the runs given.
"""
from __future__ import annotations

import sys

import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)
from moe_tutorial.experiments.gluon_fp8 import YIELD, YIELD_FIELDS, YIELD_FORMS, gathered_runs
from moe_tutorial.perf.sweep import table_main


def main(argv=None) -> int:
    return table_main(__doc__.splitlines()[0], argv, into=YIELD, fields=YIELD_FIELDS,
                      gather=lambda runs: gathered_runs(runs, YIELD_FORMS), runs_help="yield_layer.csv files")


if __name__ == "__main__":
    sys.exit(main())
