"""Gather the runs of ``tma_store_layer.py`` (the FP8 layer's tiles stored by the warps or copied out
through TMA) into one data file.

    python3 measurements/scripts/tma_store_table.py RUN.csv ... [--into DATA.csv]

Each ``RUN.csv`` is one process's ``tma_store_layer.csv``; its rows keep the run's folder as
``source`` (two runs of one case show the run-to-run spread). Only the FP8 forms and Part 4's bf16
layer, where they ran, are kept. ``--into`` defaults to ``moe_tutorial/data/h100_fp8_tma_store.csv``;
the file is written anew from the runs given.
"""
from __future__ import annotations

import sys

import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)
from moe_tutorial.experiments.gluon_fp8 import TMA_FORMS, TMA_STORE, TMA_STORE_FIELDS, gathered_runs
from moe_tutorial.perf.sweep import table_main


def main(argv=None) -> int:
    return table_main(__doc__.splitlines()[0], argv, into=TMA_STORE, fields=TMA_STORE_FIELDS,
                      gather=lambda runs: gathered_runs(runs, TMA_FORMS), runs_help="tma_store_layer.csv files")


if __name__ == "__main__":
    sys.exit(main())
