"""Part 7's ``tl`` FP8 kernel at small M: its untuned choice against a few neighbours and vLLM's rule.

    python3 measurements/scripts/fp8_small_m_sweep.py [--models DeepSeek-V3 Qwen3-30B-A3B Kimi-K2]
        [--M 1 8 64 256 1024] [--variants plain gated down]

A GPU without a tuned table for Part 7 (an H100, say) runs ``fp8_heuristic_config``. vLLM 0.34.0's
block-FP8 kernel, with its own default rule, came out ahead of it by 2-5% at a few M on an H100
(measurements/gpu-notes.md, twenty-second session). For each model, GEMM ("plain": the first GEMM;
"gated": the layer's gate/up GEMM with its quantising epilogue; "down") and M, this script times the
heuristic's ``tl`` configuration beside the same configuration with one change (the other of 64 and
128 columns, of 3 and 4 stages, the operands swapped or not, GROUP_M 1, 16-row tiles, the other of
a 128-wide tile at 4 warps and a 256-wide one at 8), the heuristic as it was before these sweeps
(``before``: 128 columns, 4 stages), and vLLM's default rule written as our configuration. Every
candidate must match the heuristic's output first (``tuning.compare_configs``: the tuner's check),
then all are timed cold-l2 in one order and the reverse. Rows go to ``$OUT/fp8_small_m_sweep.csv``:
the least of the two timings and its ratio to the heuristic's.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

import moe_tutorial as mt  # noqa: F401  (first: picks the runtime)
from moe_tutorial import runtime
from moe_tutorial.kernels.configs import KernelConfig, fp8_heuristic_config
from moe_tutorial.perf import bench
from moe_tutorial.perf.results import write_csv
from moe_tutorial.perf.timing import machine_info
from moe_tutorial.perf.tuning import compare_configs, problem_dims
from moe_tutorial.shapes import MODEL_SHAPES, ModelShape

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vllm_fp8_anchor import vllm_config  # noqa: E402

OUT = os.environ.get("OUT", ".")


def vllm_rule(M: int, E: int, inter: int, gated: bool) -> KernelConfig:
    """vLLM 0.34.0's default block-FP8 configuration (``vllm_fp8_anchor.vllm_config`` with no tuned
    file) in our terms: weights through TMA and operands swapped under 64 rows, as its launcher does
    on Hopper; a gate/up tile stays 128 wide (our epilogue quantises whole groups of 128 columns)."""
    cfg, _ = vllm_config(M, E, inter, None, "")
    block_m = cfg["BLOCK_SIZE_M"]
    return KernelConfig(block_m=block_m, block_n=128 if gated else cfg["BLOCK_SIZE_N"], block_k=cfg["BLOCK_SIZE_K"],
                        group_m=cfg["GROUP_SIZE_M"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                        use_tma=True, short_tails=False, swap_ab=block_m < 64)


def candidates(shape: ModelShape, M: int, variant: str) -> dict[str, KernelConfig]:
    """The heuristic's configuration first, then its neighbours and vLLM's rule (duplicates dropped)."""
    N, K = problem_dims(shape, variant)
    E, inter = shape.num_experts, shape.intermediate
    h = fp8_heuristic_config(M, shape.topk, E, variant, N=N, K=K, kernel="tl")
    gated = variant == "gated"
    out = {"heuristic": h}
    if not gated and h.block_m < 64:
        other_n = 128 if h.block_n == 64 else 64
        out[f"n{other_n}"] = replace(h, block_n=other_n)
        # the heuristic of 94c61f2, before this script's sweeps: 128 wide, 4 stages
        out["before"] = replace(h, block_n=128, num_stages=4)
    out["s4" if h.num_stages == 3 else "s3"] = replace(h, num_stages=4 if h.num_stages == 3 else 3)
    if h.block_m < 64:
        out["swap" if not h.swap_ab else "noswap"] = replace(h, swap_ab=not h.swap_ab)
    out["g1"] = replace(h, group_m=1)
    if h.block_m == 32:
        out["m16"] = replace(h, block_m=16)
    if h.block_n == 256:
        out["n128-w4"] = replace(h, block_n=128, num_warps=4)
    elif h.block_m == 64 and not gated:
        out["n256-w8"] = replace(h, block_n=256, num_warps=8)    # the tile of 50d12f0 from 64 rows
    vllm = vllm_rule(M, E, inter, gated)
    if variant != "down" or vllm.block_m == h.block_m:     # the down GEMM keeps the layer's row blocks
        out["vllm-rule"] = vllm
    unique = {}
    for name, c in out.items():
        if c not in unique.values():
            unique[name] = c
    return unique


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["DeepSeek-V3", "Qwen3-30B-A3B", "Kimi-K2"])
    p.add_argument("--M", nargs="+", type=int, default=[1, 8, 64, 256, 1024])
    p.add_argument("--variants", nargs="+", default=["plain", "gated", "down"])
    p.add_argument("--max-seconds", type=float, default=0.5, help="timing budget of one measurement")
    args = p.parse_args(argv)
    if not runtime.ON_GPU:
        print("needs a CUDA GPU: the interpreter has no speed to compare")
        return 2
    info = machine_info()
    rows = []
    for model in args.models:
        shape = MODEL_SHAPES[model]
        w13, w2 = bench.make_weights(shape, torch.bfloat16, with_w2="down" in args.variants)
        for variant in args.variants:
            N, K = problem_dims(shape, variant)
            for M in args.M:
                cands = candidates(shape, M, variant)
                times = compare_configs(shape, variant, M, torch.float8_e4m3fn, cands, w13, w2,
                                        max_seconds=args.max_seconds)
                base = min(times["heuristic"])
                line = []
                for name, c in cands.items():
                    ms = min(times[name])
                    rows.append(dict(info, protocol="cold-l2", model=model, variant=variant, M=M, E=shape.num_experts,
                                     N=N, K=K, topk=shape.topk, candidate=name, config=repr(c), ms=ms,
                                     ms_forward=times[name][0], ms_reverse=times[name][1],
                                     heuristic_over=base / ms))
                    line.append(f"{name} {base / ms:.3f}")
                print(f"{model:14s} {variant:5s} M={M:5d} heuristic {base * 1e3:8.1f} us | " + ", ".join(line[1:]),
                      flush=True)
                write_csv(Path(OUT) / "fp8_small_m_sweep.csv", rows, list(rows[0]))
                torch.cuda.empty_cache()
        del w13, w2
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
