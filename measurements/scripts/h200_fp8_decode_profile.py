"""Part 7 at decode on one H200: where an FP8 layer call's time goes, kernel by kernel, beside bf16's.

    python3 measurements/scripts/h200_fp8_decode_profile.py --models DeepSeek-V3 Qwen3-30B-A3B --M 1 64 256
    ncu --clock-control none --section SpeedOfLight --section LaunchStats -k regex:"fp8|quantize|align|topk" \
        python3 measurements/scripts/h200_fp8_decode_profile.py --models DeepSeek-V3 --M 1 --calls 2

Issue 31 asks the whole FP8 layer for 1.7x the bf16 one at M <= 256 on DeepSeek-V3 and Kimi-K2
(1.4x on Qwen3-30B-A3B); the bench measured 1.58x and 1.06x at M = 1. For each model and M this
runs the package's FP8 layer (``fp8_moe_layer``, the tuned table's tiles), the decode experiment
(:func:`moe_tutorial.experiments.fp8_decode.fp8_decode_layer`, its default config) and Part 4's
bf16 layer (``moe_layer(..., impl="sorted")``) under ``torch.profiler`` and
prints, per call, the GPU time of each kernel, their sum and the wall time of the call: a call
whose wall time exceeds its kernels' sum is waiting on launches (the host), not on the weights'
read. Rows go to ``$OUT/h200_fp8_decode_profile.csv``.
The weights are random e4m3 with unit scales (timing only; at decode only the routed experts'
weights are read). ``--dry-run``: the toy shape in the interpreter (checks the script).
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import time

import moe_tutorial as mt  # noqa: F401  (first: picks the runtime)
from moe_tutorial import runtime
from moe_tutorial.experiments.fp8_decode import fp8_decode_layer
from moe_tutorial.kernels.fp8_layer import fp8_moe_layer
from moe_tutorial.quant import BLOCK, FP8_DTYPE
from moe_tutorial.shapes import MODEL_SHAPES, ModelShape

import torch
import triton

OUT = os.environ.get("OUT", ".")
TOY = ModelShape("toy-K256-I128", 8, 2, 256, 128)
#: The bf16 layer the FP8 one is compared with: Part 4's (the bench's "sorted" layer).
BF16_IMPL = "sorted"


def fp8_weights(shape: ModelShape, device) -> tuple:
    """Random e4m3 ``w13``, ``w2`` and unit block scales in the layer's layouts."""
    E, K, inter = shape.num_experts, shape.hidden, shape.intermediate
    g = torch.Generator(device=device).manual_seed(0)
    w13 = (torch.randn(E, 2 * inter, K, device=device, generator=g) * 0.1).to(FP8_DTYPE)
    w2 = (torch.randn(E, K, inter, device=device, generator=g) * 0.1).to(FP8_DTYPE)
    ki, kk = triton.cdiv(inter, BLOCK), triton.cdiv(K, BLOCK)
    return w13, torch.ones(E, 2 * ki, kk, device=device), w2, torch.ones(E, kk, ki, device=device)


def calls_of(shape: ModelShape, M: int, weights, dtype):
    """``{"fp8": call, "fp8-decode": call, "bf16": call}`` for one batch: the package's FP8 layer,
    the decode experiment, and the bf16 layer on the FP8 weights cast up. (In the committed logs of
    the fifteenth session "fp8" was the decode path at M = 1, the package's then, and
    "fp8-aligned" the layer as it is now.)"""
    device = runtime.DEVICE
    g = torch.Generator(device=device).manual_seed(M)
    x = torch.randn(M, shape.hidden, device=device, generator=g).to(dtype)
    tw, ids = mt.route(torch.randn(M, shape.num_experts, device=device, generator=g), shape.topk)
    w13, s13, w2, s2 = weights
    w13_16, w2_16 = w13.to(dtype), w2.to(dtype)
    return {"fp8": lambda: fp8_moe_layer(x, w13, s13, w2, s2, tw, ids),
            "fp8-decode": lambda: fp8_decode_layer(x, w13, s13, w2, s2, tw, ids),
            "bf16": lambda: mt.moe_layer(x, w13_16, w2_16, tw, ids, impl=BF16_IMPL)}


def profile_call(fn, calls: int) -> dict:
    """Run ``fn`` ``calls`` times after one warm-up, then ``calls`` times under the profiler; per call:
    the kernels' GPU time by name (us), their sum, and the wall time (us) of the unprofiled calls
    (the profiler's own cost per launch would inflate it)."""
    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
        sync()
    wall = time.perf_counter() - t0
    kernels: dict[str, float] = {}
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if runtime.ON_GPU
                                                          else [])
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
            sync()
    for ev in prof.key_averages():
        # Kernels only: the aten ops' device time is their kernels' again, the runtime calls are the host's.
        t = ev.device_time_total if runtime.ON_GPU else 0.0
        if t and ev.key and not ev.key.startswith(("cuda", "aten::", "Memcpy", "Memset")):
            kernels[ev.key] = t / calls
    return {"kernels": kernels, "kernel_us": sum(kernels.values()), "wall_us": wall / calls * 1e6}


def sync() -> None:
    if runtime.ON_GPU:
        torch.cuda.synchronize()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["DeepSeek-V3", "Qwen3-30B-A3B", "Kimi-K2"])
    p.add_argument("--M", nargs="+", type=int, default=[1, 64, 256])
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--dry-run", action="store_true", help="on a CPU: the toy shape in the interpreter")
    args = p.parse_args(argv)
    if args.dry_run:
        MODEL_SHAPES[TOY.name] = TOY
        args.models, args.M, args.calls = [TOY.name], [2], 1
    elif not runtime.ON_GPU:
        print("needs a CUDA GPU (the FP8 layer's tuned tiles are the H200's)")
        return 2
    rows = []
    for model in args.models:
        shape = MODEL_SHAPES[model]
        weights = fp8_weights(shape, runtime.DEVICE)
        for M in args.M:
            for impl, fn in calls_of(shape, M, weights, runtime.DEFAULT_DTYPE).items():
                r = profile_call(fn, args.calls)
                top = sorted(r["kernels"].items(), key=lambda kv: -kv[1])
                print(f"{model:14s} M={M:4d} {impl:4s} wall {r['wall_us']:8.1f} us, kernels {r['kernel_us']:8.1f} us "
                      f"in {len(top)}: " + "; ".join(f"{k[:40]} {v:.1f}" for k, v in top[:6]), flush=True)
                rows.append(dict(model=model, M=M, impl=impl, wall_us=r["wall_us"], kernel_us=r["kernel_us"],
                                 kernels=len(top), top=" | ".join(f"{k} {v:.2f}" for k, v in top)))
            del fn              # it holds this batch's bf16 copies of the weights
        del weights
        if runtime.ON_GPU:
            torch.cuda.empty_cache()
    with open(f"{OUT}/h200_fp8_decode_profile.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
