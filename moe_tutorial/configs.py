"""Block sizes, warps and stages for Part 4's kernel: found by the tuner, looked up per problem.

Tables are JSON files keyed by GPU name, then by problem (``E,N,K,topk,dtype,variant``), then
by M. The package ships the tables measured for the series (``moe_tutorial/data``); ``python -m
moe_tutorial tune`` writes the reader's own into :func:`user_table_path`, which wins.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import torch

from . import runtime


@dataclass(frozen=True)
class KernelConfig:
    """Launch parameters of :func:`moe_tutorial.sorted_kernel.sorted_moe_kernel`."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    use_tma: bool = False      # B tiles through a Hopper tensor descriptor (GPU only)

    def as_dict(self) -> dict:
        return asdict(self)


#: In the interpreter warps and stages mean nothing and every program costs about a
#: millisecond: one small, fixed configuration.
CPU_CONFIG = KernelConfig(block_m=16, block_n=32, block_k=32, group_m=1, num_warps=4, num_stages=1)

SHIPPED_DIR = Path(__file__).parent / "data"


def user_table_path() -> Path:
    """Where ``tune`` writes: ``$MOE_TUTORIAL_CONFIG_DIR`` or ``~/.cache/moe_tutorial``."""
    root = os.environ.get("MOE_TUTORIAL_CONFIG_DIR") or Path.home() / ".cache" / "moe_tutorial"
    return Path(root) / "tuned_configs.json"


def problem_key(E: int, N: int, K: int, topk: int, dtype: torch.dtype, variant: str) -> str:
    """Key of one GEMM problem. ``variant`` is "plain", "gated" (SiLU*up epilogue) or "down"."""
    return f"E={E},N={N},K={K},topk={topk},dtype={str(dtype).replace('torch.', '')},variant={variant}"


def gpu_name() -> str:
    return torch.cuda.get_device_name() if runtime.ON_GPU else "cpu"


@lru_cache(maxsize=None)
def _load(path: str, mtime: float) -> dict:
    with open(path) as f:
        return json.load(f)


def load_tables() -> list[dict]:
    """The user's table first, then the shipped ones; each ``{gpu: {problem: {M: config}}}``."""
    paths = [user_table_path()] + sorted(SHIPPED_DIR.glob("tuned_configs*.json"))
    return [_load(str(p), p.stat().st_mtime) for p in paths if p.exists()]


def heuristic_config(M: int, topk: int, E: int) -> KernelConfig:
    """A reasonable untuned choice: BLOCK_M near the average rows per expert."""
    rows_per_expert = max(1, M * topk // E)
    if rows_per_expert <= 16:
        return KernelConfig(16, 64, 128, 1, 4, 4)
    if rows_per_expert <= 64:
        return KernelConfig(32, 128, 64, 8, 4, 4)
    if rows_per_expert <= 256:
        return KernelConfig(64, 128, 64, 8, 4, 4)
    return KernelConfig(128, 128, 64, 8, 8, 3)


def get_config(M: int, E: int, N: int, K: int, topk: int, dtype: torch.dtype, variant: str) -> KernelConfig:
    """The configuration for one launch: tuned if a table has this problem, else a heuristic.

    Within a problem's table the entry with the nearest M (on a log scale) is taken.
    """
    if runtime.INTERPRETED:
        return CPU_CONFIG
    key = problem_key(E, N, K, topk, dtype, variant)
    for table in load_tables():
        by_m = table.get(gpu_name(), {}).get(key)
        if by_m:
            nearest = min(by_m, key=lambda m: abs(math.log2(int(m)) - math.log2(max(M, 1))))
            return KernelConfig(**by_m[nearest])
    return heuristic_config(M, topk, E)
