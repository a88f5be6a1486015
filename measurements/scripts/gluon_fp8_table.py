"""Write the Gluon FP8 kernel's wins into the shipped H200 table, from the sweeps' rows.

    python measurements/scripts/gluon_fp8_table.py measurements/logs/2026-12-01-5-gluon-fp8/gluon-fp8-sweep-*.csv

For each model, GEMM and M that ``h200_gluon_fp8.py sweep`` measured, the fastest Gluon variant
replaces the ``tl`` kernel's entry where it ran faster (the least of each variant's two timings);
the displaced ``tl`` entries move to the variant ``<variant>-tl`` (what ``fp8_config(...,
kernel="tl")`` reads). The layer's winner sets both its GEMMs: the fused quantising epilogue
(64-row tiles), the plain gate/up GEMM with a separate SiLU-and-quantise pass (128-row tiles), or
the rescaled form (128-row gate/up tiles with the epilogue, a 256-wide down GEMM).
``EXTRA`` names entries no sweep measured, each with its reason; a sweep given here that measured one
decides it instead.
"""
from __future__ import annotations

import csv
import json
import sys
from dataclasses import asdict

from moe_tutorial.kernels.configs import (
    GLUON_FUSED_DOWN,
    GLUON_FUSED_UP,
    GLUON_PLAIN,
    GLUON_RESCALED,
    GLUON_RESCALED_WIDE,
    SHIPPED_DIR,
    problem_key,
)
from moe_tutorial.shapes import MODEL_SHAPES

import torch

TABLE = SHIPPED_DIR / "tuned_configs_h200.json"
GPU = "NVIDIA H200"
#: The sweeps' variant names and the configurations they ran (h200_gluon_fp8.py's).
FIRST = {"gluon-128x8-s4": GLUON_PLAIN, "gluon-128x256-rescaled-split-s4-g8": GLUON_RESCALED_WIDE}
LAYER = {"gluon-fused-s4-d64s6": (GLUON_FUSED_UP, GLUON_FUSED_DOWN), "gluon-unfused-128": (GLUON_PLAIN, GLUON_PLAIN),
         "gluon-rescaled-split-128": (GLUON_RESCALED, GLUON_RESCALED_WIDE)}
#: Kimi-K2's first GEMM was not measured by the first sweeps (its float64 check ran out of memory); it
#: has DeepSeek-V3's N and K and two thirds of its rows per expert, where Gluon won from M = 4096.
EXTRA = {("Kimi-K2", "first", 4096): "gluon-128x8-s4", ("Kimi-K2", "first", 16384): "gluon-128x8-s4"}


def entry(config) -> dict:
    return {k: v for k, v in asdict(config).items() if v or k in ("block_m", "block_n", "block_k")}


def main(paths: list[str]) -> int:
    best: dict = {}
    for path in paths:
        for r in csv.DictReader(open(path)):
            key = (r["model"], r["gemm"], int(r["M"]))
            best.setdefault(key, {})
            ms = float(r["ms"])
            best[key][r["impl"]] = min(ms, best[key].get(r["impl"], ms))
    table = json.loads(TABLE.read_text())
    by_problem = table[GPU]
    fp8 = torch.float8_e4m3fn
    for (model, gemm, M), times in sorted(best.items()):
        s = MODEL_SHAPES[model]
        choices = FIRST if gemm == "first" else LAYER if gemm == "layer" else {}
        if "tl" not in times or not choices:
            continue
        name = min((n for n in choices if n in times), key=times.get, default=None)
        if name is None or times[name] >= times["tl"]:
            continue
        print(f"{model} {gemm} M={M}: {name} {times[name]:.3f} ms against tl {times['tl']:.3f}")
        write(by_problem, s, gemm, M, choices[name], fp8)
    for (model, gemm, M), name in EXTRA.items():
        if (model, gemm, M) in best:          # a sweep measured it after all: its winner stands
            continue
        print(f"{model} {gemm} M={M}: {name} (not measured: EXTRA)")
        write(by_problem, MODEL_SHAPES[model], gemm, M, (FIRST if gemm == "first" else LAYER)[name], fp8)
    TABLE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    return 0


def write(by_problem: dict, s, gemm: str, M: int, configs, dtype) -> None:
    E, topk, H, inter = s.num_experts, s.topk, s.hidden, s.intermediate
    parts = [("plain", 2 * inter, H)] if gemm == "first" else [("gated", inter, H), ("down", H, inter)]
    configs = [configs] if gemm == "first" else configs
    for (variant, N, K), config in zip(parts, configs):
        key = problem_key(E, N, K, topk, dtype, variant)
        by_m = by_problem.setdefault(key, {})
        old = by_m.get(str(M))
        if old and not old.get("gluon"):
            by_problem.setdefault(key + "-tl", {})[str(M)] = old
        by_m[str(M)] = entry(config)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
