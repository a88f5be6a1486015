"""Where Part 4's kernel loses time at its weakest points: Nsight Compute on one launch of each.

Run from the repository root on a GPU machine with Nsight Compute (no Jupyter needed):

    PYTHONPATH=. python measurements/scripts/h200_sorted_profile.py --out "$OUT"

It profiles the tuned first GEMM (the bench's "sorted" row, alignment outside) at the points
the H200 results show furthest from the floor, writes every metric Nsight Compute reports to
``$OUT/sorted_profile_raw.csv`` and a short table of the ones that say what limits the kernel
(time, SM and tensor-pipe activity, DRAM and L2 throughput, occupancy, the top warp stalls) to
``$OUT/sorted_profile.csv``. measurements/gpu-notes.md quotes it. The child mode (``--child``) is what
``ncu`` runs: one launch per case, after a warm-up launch that compiles it.
"""
from __future__ import annotations

import argparse
import csv
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import moe_tutorial  # noqa: F401,I001  (picks the runtime before triton loads)

import torch

#: (model, M): the weakest points of the cold-l2 results, and a decode point for contrast.
CASES = (("Mixtral-8x7B", 16384), ("Mixtral-8x7B", 1024), ("Qwen3-30B-A3B", 4096), ("DeepSeek-V3", 4096),
         ("Qwen3-30B-A3B", 1))
#: Metric names (or name fragments) worth a column in the short table.
KEYS = ("gpu__time_duration.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed", "lts__throughput.avg.pct_of_peak_sustained_elapsed",
        "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread",
        "launch__grid_size", "launch__shared_mem_per_block")


def child() -> None:
    from moe_tutorial.kernels.align import align_block_size
    from moe_tutorial.kernels.configs import get_config
    from moe_tutorial.kernels.sorted_layer import launch_sorted_gemm
    from moe_tutorial.routing import route
    from moe_tutorial.shapes import get_shape

    for model, M in CASES:
        s = get_shape(model)
        N, K = s.first_gemm
        g = torch.Generator(device="cuda").manual_seed(0)
        w = torch.randn(s.num_experts, N, K, device="cuda", dtype=torch.bfloat16, generator=g) * K ** -0.5
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
        _, ids = route(torch.randn(M, s.num_experts, generator=torch.Generator().manual_seed(M)), s.topk)
        ids = ids.cuda()
        config = get_config(M, s.num_experts, N, K, s.topk, torch.bfloat16, "plain")
        alignment = align_block_size(ids, config.block_m, s.num_experts)
        out = torch.empty(M * s.topk, N, device="cuda", dtype=torch.bfloat16)
        for _ in range(2):                       # the first compiles; ncu skips it (--launch-skip-before-match)
            launch_sorted_gemm(x, w, out, None, alignment, M * s.topk, s.topk, config)
        torch.cuda.synchronize()
        print(f"{model} M={M}: {config}", flush=True)
        del w, x, out


def parse(text: str) -> list[dict]:
    """Rows of ``ncu --csv --page raw``: a header, a units line, then one line per kernel."""
    lines = [line for line in text.splitlines() if line.startswith('"')]
    reader = list(csv.reader(io.StringIO("\n".join(lines))))
    header, rows = reader[0], reader[2:]
    return [dict(zip(header, row)) for row in rows]


def number(value: str):
    try:
        return float(value.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child()
        return 0
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    args.out.mkdir(parents=True, exist_ok=True)
    report = args.out / "sorted_profile"
    # Every other launch of the kernel: the second (warm) launch of each case.
    cmd = [ncu, "--clock-control", "none", "--kernel-name", "regex:sorted_moe_kernel", "--launch-skip", "1",
           "--launch-count", str(2 * len(CASES) - 1), "--set", "full", "--force-overwrite", "--export", str(report),
           sys.executable, __file__, "--child"]
    print(" ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420)
    print(proc.stdout[-3000:], proc.stderr[-2000:])
    raw = subprocess.run([ncu, "--import", str(report) + ".ncu-rep", "--csv", "--page", "raw"],
                         capture_output=True, text=True, timeout=120).stdout
    (args.out / "sorted_profile_raw.csv").write_text(raw)
    kernels = parse(raw)[::2]                   # launches 2, 4, ...: one warm launch per case
    table = []
    for (model, M), k in zip(CASES, kernels):
        row = {"model": model, "M": M, **{key: number(k.get(key, "")) for key in KEYS}}
        tensor = {n: number(v) for n, v in k.items()
                  if "pipe_tensor" in n and n.endswith("pct_of_peak_sustained_active")}
        row.update({f"tensor: {n}": v for n, v in tensor.items() if v is not None})
        stalls = {n: number(v) for n, v in k.items()
                  if n.startswith("smsp__average_warp_latency_issue_stalled_") and n.endswith(".ratio")}
        top = sorted(((v, n) for n, v in stalls.items() if v), reverse=True)[:4]
        row["top stalls"] = "; ".join(f"{n.split('stalled_')[1].split('.')[0]} {v:.2f}" for v, n in top)
        table.append(row)
        print(row, flush=True)
    fields = sorted({f for r in table for f in r}, key=lambda f: (f not in ("model", "M"), f))
    with open(args.out / "sorted_profile.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
