"""Gather the runs of ``tile_height_layer.py`` (the FP8 layer on 64-row and on 128-row tiles) into one data file.

    python3 measurements/scripts/tile_height_table.py RUN.csv ... [--into DATA.csv]

Each ``RUN.csv`` is one process's ``tile_height_layer.csv``, or a ``half_skip_layer.csv`` of the
twenty-ninth session (the script is in that session's ``half-skip.patch``), whose forms that ran the
kernel as committed are renamed to this file's (:data:`HALF_SKIP_NAMES`; its dispatched layer is
``fp8-64`` where it ran the fused 64-row pair) and whose others are left out. Rows that ran (status
ok) are kept, with the run's folder as ``source`` and an expert's average ``rows``, in the columns of
``gluon_fp8.TILE_HEIGHT_FIELDS``. ``--into`` defaults to
``moe_tutorial/data/h100_fp8_tile_height.csv``; the file is written anew from the runs given.
"""
from __future__ import annotations

import sys
from pathlib import Path

import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)
from moe_tutorial.experiments.gluon_fp8 import TILE_HEIGHT, TILE_HEIGHT_FIELDS, TILE_HEIGHT_FORMS, gathered_runs
from moe_tutorial.kernels.configs import GLUON_FUSED_UP
from moe_tutorial.perf.sweep import table_main
from moe_tutorial.shapes import get_shape

#: The file's forms under ``half_skip_layer.py``'s names: its ``-no-skip`` forms ran the kernel as
#: committed; its others ran the skip, which was not kept, and are left out.
HALF_SKIP_NAMES = {"fp8-no-skip": "fp8", "fp8-rescaled-no-skip": "fp8-128", "sorted": "sorted"}


def renamed(row: dict) -> str:
    """A ``half_skip_layer.csv`` row's form under this file's names: the dispatched layer is the fused
    64-row pair under 256 rows an expert (the rule of that session), as ``tile_height_layer.py`` names it."""
    name = HALF_SKIP_NAMES[row["impl"]]
    return "fp8-64" if name == "fp8" and row["up"] == str(GLUON_FUSED_UP) else name


def run_rows(path: Path) -> list[dict]:
    """One run's rows in this file's forms, each with an expert's average rows."""
    if path.name == "half_skip_layer.csv":
        rows = [{**r, "impl": renamed(r)} for r in gathered_runs([path], HALF_SKIP_NAMES)]
    else:
        rows = gathered_runs([path], TILE_HEIGHT_FORMS)
    for r in rows:
        shape = get_shape(r["model"])
        r["rows"] = r.get("rows") or int(r["M"]) * shape.topk / shape.num_experts
    return rows


def main(argv=None) -> int:
    return table_main(__doc__.splitlines()[0], argv, into=TILE_HEIGHT, fields=TILE_HEIGHT_FIELDS,
                      gather=lambda runs: [r for path in runs for r in run_rows(path)],
                      runs_help="tile_height_layer.csv or half_skip_layer.csv files")


if __name__ == "__main__":
    sys.exit(main())
