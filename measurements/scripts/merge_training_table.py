"""Merge the winners of Part 8's tile sweeps into a training table, on the GPU that measured them.

    python3 measurements/scripts/merge_training_table.py SWEEP/tuned_configs_training.json ... --copy table.json

Each argument is the ``tuned_configs_training.json`` a sweep of ``h200_backward.py`` wrote (missing
files are skipped: a sweep cut short). On an H200 the entries go into the shipped table,
``moe_tutorial/data/tuned_configs_training_h200.json`` (commit it); on any other GPU into the user's
table (:func:`moe_tutorial.kernels.configs.user_table_path`), which the package reads first, so that a
step timed next in the same call runs them. ``--copy`` writes the merged table there as well.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)
from moe_tutorial.kernels.configs import SHIPPED_DIR, gpu_name, user_table_path
from moe_tutorial.perf.tuning import read_table, write_table

SHIPPED_H200 = SHIPPED_DIR / "tuned_configs_training_h200.json"


def merge(sweeps: list[Path], gpu: str, path: Path) -> dict:
    """The table at ``path`` (empty if none) with every sweep's entries for ``gpu`` added, M by M."""
    table = read_table(path)
    for sweep in sweeps:
        if not sweep.exists():
            print(f"skipped (no such file): {sweep}")
            continue
        for key, by_m in read_table(sweep).get(gpu, {}).items():
            table.setdefault(gpu, {}).setdefault(key, {}).update(by_m)
            print(f"merged: {key} {sorted(by_m, key=int)}")
    return table


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweeps", nargs="+", type=Path)
    ap.add_argument("--copy", type=Path, help="also write the merged table here")
    args = ap.parse_args(argv)
    gpu = gpu_name()
    path = SHIPPED_H200 if gpu == "NVIDIA H200" else user_table_path()
    print(f"{gpu}: merging into {path}")
    table = merge(args.sweeps, gpu, path)
    for out in (path, args.copy) if args.copy else (path,):
        write_table(out, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
