"""Gather the runs of the Gluon epilogues' store layouts into one data file.

    python3 measurements/scripts/store_layout_table.py STORE=RUN.csv ... [--into DATA.csv]

Each ``STORE=RUN.csv`` names a run's file and the store layout the Gluon kernels had in it: ``mma``
(the MMA's register layout, 4 bytes of a row a thread, before the twenty-fifth session), ``rows``
(16 bytes of one row a thread, :func:`moe_tutorial.kernels.gluon_kernel.store_layout`) or ``none`` (the
experiment with the C tile never written). A run is either ``fp8_grouped_anchor.py``'s CSV (first GEMM:
Part 7's Gluon GEMM alone, ``fp8-gemm``, and CUTLASS's, ``cutlass-fp8``, whose row keeps the store
empty) or the bench's (the FP8 and bf16 layers). ``--into`` defaults to
``moe_tutorial/data/h100_fp8_store_layout.csv``; the file is written anew from the runs given.
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)
from moe_tutorial.experiments.gluon_fp8 import STORE_LAYOUT, STORE_LAYOUT_FIELDS
from moe_tutorial.perf.results import write_csv

#: The implementations kept from each kind of run: what the Gluon store changes, and the anchors beside it.
KEEP = {"fp8-gemm", "cutlass-fp8", "fp8", "sorted"}
STORES = ("mma", "rows", "none")


def rows_of(store: str, path: Path) -> list[dict]:
    """The kept rows of one run, in the data file's columns."""
    with open(path, newline="") as f:
        run = [r for r in csv.DictReader(f) if r["impl"] in KEEP and r["status"] == "ok"]
    out = []
    for r in run:
        gemm = r.get("gemm") or "first"
        anchor = r["impl"] in ("cutlass-fp8", "sorted")
        out.append({**{k: r.get(k, "") for k in STORE_LAYOUT_FIELDS}, "gemm": gemm,
                    "store": "" if anchor else store, "source": f"{path.parent.parent.name}/{path.parent.name}"})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="STORE=PATH, STORE one of mma, rows, none")
    ap.add_argument("--into", type=Path, default=STORE_LAYOUT)
    args = ap.parse_args(argv)
    rows = []
    for item in args.runs:
        store, _, path = item.partition("=")
        if store not in STORES or not path:
            ap.error(f"expected STORE=PATH with STORE one of {', '.join(STORES)}, got {item!r}")
        rows += rows_of(store, Path(path))
    write_csv(args.into, rows, STORE_LAYOUT_FIELDS)
    print(f"wrote {len(rows)} rows to {args.into}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
