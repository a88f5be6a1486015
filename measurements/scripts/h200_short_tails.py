"""Short tails on and off: Part 4's kernel on the H200 with each configuration from the tables.

Usage, on a GPU: ``python measurements/scripts/h200_short_tails.py OUT.csv``. For each model and problem
(the first GEMM at M = 1024, 4096, 16384; the gated and down GEMMs at M = 4096) it runs the
tuned configuration with ``short_tails`` off and on, checks that both give the same output,
and times them twice each, alternating (off, on, off, on), so that drift hits both alike.
"""
import csv
import dataclasses
import sys

from moe_tutorial.kernels.configs import get_config
from moe_tutorial.perf import bench, timing
from moe_tutorial.perf.tuning import _Problem
from moe_tutorial.reference import rel_error
from moe_tutorial.shapes import MODEL_SHAPES

import torch

PROBLEMS = [("plain", 1024), ("plain", 4096), ("plain", 16384), ("gated", 4096), ("down", 4096)]


def main(out_path: str) -> None:
    rows = []
    print(f"{'model':14s} {'variant':7s} {'M':>6s}  {'config':28s} {'off ms':>8s} {'on ms':>8s} {'gain':>6s}  rel.diff")
    for name in ("Mixtral-8x7B", "Qwen3-30B-A3B", "DeepSeek-V3"):
        shape = MODEL_SHAPES[name]
        w13, w2 = bench.make_weights(shape, torch.bfloat16, with_w2=True)
        for variant, M in PROBLEMS:
            problem = _Problem(shape, variant, M, torch.bfloat16, w13, w2)
            base = get_config(M, shape.num_experts, problem.N, problem.K, shape.topk, torch.bfloat16, variant)
            configs = [dataclasses.replace(base, short_tails=s) for s in (False, True)]
            outs = [problem.run_checked(c) for c in configs]
            times = {c: [] for c in configs}
            for _ in range(2):
                for c in configs:
                    times[c].append(timing.measure_ms(timing.cycle(problem.calls(c)), max_seconds=1.0)[0])
            off, on = (min(times[c]) for c in configs)
            diff = rel_error(outs[1], outs[0])
            label = f"{base.block_m}x{base.block_n}x{base.block_k} w{base.num_warps} s{base.num_stages}" + \
                (" tma" if base.use_tma else "")
            print(f"{name:14s} {variant:7s} {M:6d}  {label:28s} {off:8.4f} {on:8.4f} {off / on:5.2f}x  {diff:.1e}")
            rows.append(dict(model=name, variant=variant, M=M, config=label, off_ms=off, on_ms=on,
                             off_runs=" ".join(f"{t:.4f}" for t in times[configs[0]]),
                             on_runs=" ".join(f"{t:.4f}" for t in times[configs[1]]), rel_diff=diff))
            problem = None
            bench.free_device_memory()
        del w13, w2
        bench.free_device_memory()
    with open(out_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main(sys.argv[1])
