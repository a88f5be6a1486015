"""Part 7's decode experiment on one H200: two launches against the package layer's five, per model and M.

    python3 measurements/scripts/h200_fp8_decode.py --models DeepSeek-V3 Qwen3-30B-A3B Kimi-K2 --M 1 2 4 8

For each model and batch size this checks, then times (cold-l2: L2 flushed before each call, one
call per CUDA graph replay, the bench's timer), the bf16 layer (Part 4's, the bench's "sorted"),
the package's FP8 layer (``fp8_moe_layer`` with the tuned table's configs, the aligned path) and
the decode path (:mod:`moe_tutorial.experiments.fp8_decode`) under each :func:`decode_variants`
config. (The committed run, ``moe_tutorial/data/h200_fp8_decode.csv``, also has ``fp8-package``
rows: the layer while it sent M = 1 down the decode path, before the measurement said no.) Every
call is timed twice, in one order and then the reverse, and the faster is kept; ``noise`` is the
two timings' difference over it. Rows go to ``$OUT/h200_fp8_decode.csv``, with the ceilings of the
same run and the layer's FP8 floor (the weights of the routed experts read once at the measured
read rate). ``--dry-run``: a toy shape in the interpreter (checks the script on a CPU).

``--variants`` with no names leaves the decode path out; ``--table-of "NVIDIA H200"`` runs another
GPU's tuned tiles (bf16 and FP8) on this one: what an H100 can say about the H200's table.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys

import moe_tutorial as mt  # noqa: F401  (first: picks the runtime)
from moe_tutorial import runtime
from moe_tutorial.experiments.fp8_decode import DecodeConfig, fp8_decode_layer
from moe_tutorial.kernels import configs
from moe_tutorial.kernels.fp8_layer import fp8_moe_layer, layer_configs
from moe_tutorial.perf import bench, impls
from moe_tutorial.perf.ceilings import measure_ceilings
from moe_tutorial.perf.timing import machine_info, time_both_orders
from moe_tutorial.quant import quantize_w13, quantize_weight
from moe_tutorial.reference import FP8_LAYER_TOLERANCE, reference_fp8_moe_layer, rel_error
from moe_tutorial.shapes import MODEL_SHAPES, ModelShape

import torch

OUT = os.environ.get("OUT", ".")
TOY = ModelShape("toy-K256-I128", 8, 2, 256, 128)


def decode_variants() -> dict[str, DecodeConfig]:
    """The decode path's configs to time: column blocks of the two kernels, pipeline depth."""
    out = {}
    for form in ("words", "e4m3"):
        for up in (4, 8, 16):
            for down in (8, 16):
                out[f"decode-{up}x{down}-{form}"] = DecodeConfig(up, down, num_stages=3, x_form=form)
    out["decode-8x16-values"] = DecodeConfig(8, 16, num_stages=3, x_form="values")   # x value by value: no prefetch
    out["decode-8x16-words-s4"] = DecodeConfig(8, 16, num_stages=4)
    out["decode-8x16-words-w8"] = DecodeConfig(8, 16, num_stages=3, num_warps=8)
    return out


def sync() -> None:
    if runtime.ON_GPU:
        torch.cuda.synchronize()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["DeepSeek-V3", "Qwen3-30B-A3B", "Kimi-K2"])
    p.add_argument("--M", nargs="+", type=int, default=[1, 2, 4, 8])
    p.add_argument("--variants", nargs="*", default=None, help="decode variants to time (default: all)")
    p.add_argument("--table-of", default=None, help="a GPU name whose tuned tables to run (default: this GPU's)")
    p.add_argument("--dry-run", action="store_true")
    args = p.parse_args(argv)
    if args.table_of:
        configs.gpu_name = lambda: args.table_of     # what tuned_config looks up
    if args.dry_run:
        MODEL_SHAPES[TOY.name] = TOY
        args.models, args.M, args.variants = [TOY.name], [1, 2], ["decode-8x16-e4m3"]
    elif not runtime.ON_GPU:
        print("needs a CUDA GPU")
        return 2
    dtype = runtime.DEFAULT_DTYPE
    ceil = measure_ceilings(dtype, "cold-l2")
    info = {**machine_info(), **ceil.columns()}
    print(f"ceilings: read {ceil.read_tbps:.2f} TB/s, launch {ceil.launch_us:.2f} us", flush=True)
    variants = {k: v for k, v in decode_variants().items() if args.variants is None or k in args.variants}
    rows = []
    for model in args.models:
        shape = MODEL_SHAPES[model]
        w13, w2 = bench.make_weights(shape, dtype, with_w2=True)
        experts = (w13, w2, *quantize_w13(w13), *quantize_weight(w2))
        for M in args.M:
            rows += case_rows(shape, M, experts, ceil, dict(info, tables=args.table_of or ""), variants)
            write(rows)
            if runtime.ON_GPU:
                torch.cuda.empty_cache()
        del w13, w2, experts
        if runtime.ON_GPU:
            torch.cuda.empty_cache()
    write(rows)
    return 0


def case_rows(shape: ModelShape, M: int, experts, ceil, info: dict, variants: dict) -> list[dict]:
    """Check, then time every call for one model and M; one row each (a call whose error exceeds
    the layer's tolerance, or which fails, is reported and not timed)."""
    w13, w2, q13, s13, q2, s2 = experts
    E, topk, inter, K = shape.num_experts, shape.topk, shape.intermediate, shape.hidden
    inp = bench.make_inputs(shape, M, runtime.DEFAULT_DTYPE, w13, w2)
    x, ids, tw = inp.xs[0], inp.ids[0], inp.weights[0]
    floor = ceil.floor_ms(*bench.traffic_of("layer", inp, "fp8"), "fp8")
    used = torch.unique(ids)
    local = torch.searchsorted(used, ids.long()).to(torch.int32)
    ref = reference_fp8_moe_layer(x.float(), q13[used], s13[used], q2[used], s2[used], tw, local)
    aligned = layer_configs(M, E, inter, K, topk)
    calls = {"bf16-sorted": impls.layer_of("sorted")(inp).calls[0],
             "fp8-aligned": lambda: fp8_moe_layer(x, q13, s13, q2, s2, tw, ids, configs=aligned)}
    for name, cfg in variants.items():
        calls[name] = lambda cfg=cfg: fp8_decode_layer(x, q13, s13, q2, s2, tw, ids, cfg)
    errors = {}
    for name, fn in list(calls.items()):
        try:
            y = fn()
            sync()
            errors[name] = rel_error(y.float(), ref) if name != "bf16-sorted" else ""
            if name != "bf16-sorted" and not errors[name] < FP8_LAYER_TOLERANCE:
                print(f"  {shape.name} M={M} {name}: error {errors[name]:.3g}, not timed", flush=True)
                del calls[name]
        except Exception as e:  # noqa: BLE001
            print(f"  {shape.name} M={M} {name}: {type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)
            del calls[name]
    times = time_both_orders(calls)
    bf16_ms = min(times["bf16-sorted"]) if "bf16-sorted" in times else float("nan")
    rows = []
    for name, ts in times.items():
        ms = min(ts)
        rows.append(dict(info, model=shape.name, M=M, E=E, inter=inter, K=K, topk=topk, impl=name, ms=ms,
                         ms_forward=ts[0], ms_reverse=ts[1], noise=abs(ts[0] - ts[1]) / ms,
                         floor_ms=floor, fraction_of_floor=floor / ms if name != "bf16-sorted" else "",
                         bf16_over_this=bf16_ms / ms, rel_error=errors.get(name, "")))
    best = min((k for k in times if k.startswith("decode")), key=lambda k: min(times[k]), default=None)
    line = "  ".join(f"{k}={min(times[k]) * 1e3:.1f}" for k in ("bf16-sorted", "fp8-aligned")
                     if k in times)
    if best:
        line += f"  best {best}={min(times[best]) * 1e3:.1f} us"
    print(f"{shape.name} M={M}: floor {floor * 1e3:.1f} us | {line}", flush=True)
    return rows


def write(rows: list[dict]) -> None:
    if not rows:
        return
    with open(f"{OUT}/h200_fp8_decode.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    sys.exit(main())
