"""Gather the runs of ``gather_layer.py`` (the FP8 layer's gate/up GEMM reading x's rows by index, against
a sorted copy through TMA) into one data file.

    python3 measurements/scripts/gather_table.py RUN.csv ... [--into DATA.csv]

Each ``RUN.csv`` is one process's ``gather_layer.csv``; its rows keep the run's folder as ``source``.
Rows that ran (status ok) are kept, in the columns of ``gluon_fp8.GATHER_FIELDS``. ``--into`` defaults
to ``moe_tutorial/data/h100_fp8_gather.csv``; the file is written anew from the runs given.
"""
from __future__ import annotations

import sys

import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)
from moe_tutorial.experiments.gluon_fp8 import GATHER, GATHER_FIELDS, GATHER_FORMS, gathered_runs
from moe_tutorial.perf.sweep import table_main


def main(argv=None) -> int:
    return table_main(__doc__.splitlines()[0], argv, into=GATHER, fields=GATHER_FIELDS,
                      gather=lambda runs: gathered_runs(runs, GATHER_FORMS), runs_help="gather_layer.csv files")


if __name__ == "__main__":
    sys.exit(main())
