"""Part 7 on one H200: the Gluon block-FP8 kernel checked against float64, then each lever timed.

    python3 measurements/scripts/h200_gluon_fp8.py check            # correctness, about a minute
    python3 measurements/scripts/h200_gluon_fp8.py sweep [--models ...] [--M ...] [--deadline S]

``check`` runs every Gluon variant (the plain first GEMM with 128- and 64-row tiles, 256-row tiles
as two waves, the promotion without overlap, the same pipeline with one scale per tensor, the
whole layer with the quantising gate/up epilogue) on a toy shape whose K and N are not multiples
of 128 and on three model shapes, with NaN-poisoned outputs, against the float64 references; it exits 1 if any is wrong.

``sweep`` times, under the cold-l2 protocol with the ceilings measured in the same run, for each
model and M: the first GEMM with Part 7's ``tl`` kernel (its tuned table) and with each Gluon
variant (tiles, stages, GROUP_M, two waves, no overlap), the sorted-order gather alone, and the
whole layer (``tl``; Gluon with the fused quantising epilogue; Gluon with a plain gate/up GEMM and
a separate SiLU-and-quantise pass; Part 4's bf16 layer for the speed-up). Every case is timed
twice, in forward and in reverse order: the spread between the two is the noise of the
measurement. Rows go to ``$OUT/gluon_fp8_<stage>.csv`` as they are measured.
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from dataclasses import replace

import moe_tutorial  # noqa: F401  (first: picks the runtime)
from moe_tutorial import runtime
from moe_tutorial.kernels import gluon_fp8_kernel as gk
from moe_tutorial.kernels.align import align_block_size, sorted_positions
from moe_tutorial.kernels.configs import GLUON_RESCALED, GLUON_RESCALED_WIDE, KernelConfig, fp8_config
from moe_tutorial.kernels.fp8_layer import fp8_moe_layer, launch_fp8_gemm
from moe_tutorial.kernels.fp8_quant import launch_quantize_rows, quantize_rows, quantize_rows_sorted
from moe_tutorial.kernels.gluon_kernel import launch_gluon_gemm
from moe_tutorial.perf import bench, impls
from moe_tutorial.perf.ceilings import measure_ceilings
from moe_tutorial.perf.timing import machine_info, measure_ms, warm_up_gpu
from moe_tutorial.quant import (
    BLOCK,
    dequantize_activations,
    dequantize_weight,
    quantize_w13,
    quantize_weight,
)
from moe_tutorial.reference import FP8_LAYER_TOLERANCE, reference_fp8_moe_layer, reference_moe_matmul, rel_error
from moe_tutorial.shapes import MODEL_SHAPES, ModelShape

import torch

OUT = os.environ.get("OUT", ".")

#: Gluon first-GEMM variants: name -> the arguments of Case.first_call after the config (config, overlap).
def gluon_variants() -> dict:
    def cfg(bm, warps, stages, group=8):
        return KernelConfig(block_m=bm, block_n=128, block_k=128, group_m=group, num_warps=warps,
                            num_stages=stages, short_tails=False, gluon=True)
    return {
        "gluon-128x8-s4": (cfg(128, 8, 4), True),
        "gluon-128x8-s5": (cfg(128, 8, 5), True),
        "gluon-128x8-s4-g1": (cfg(128, 8, 4, 1), True),
        "gluon-64x4-s6": (cfg(64, 4, 6), True),
        "gluon-64x8-s6": (cfg(64, 8, 6), True),
        "gluon-128x8-s4-g16": (cfg(128, 8, 4, 16), True),
        "gluon-128x8-s4-g32": (cfg(128, 8, 4, 32), True),
        "gluon-256x8-2wave-s3": (cfg(256, 8, 3), True),
        "gluon-128x8-s4-nooverlap": (cfg(128, 8, 4), False),
        # 256-wide tiles, the accumulators rescaled in place (no raw products: two 128-column tiles)
        **{f"gluon-128x256-rescaled-s{stages}-g{group}": (replace(cfg(128, 8, stages, group), block_n=256,
                                                                  rescale=True), True)
           for stages, group in ((4, 8), (3, 8), (4, 4), (4, 16), (4, 1))},
        # the same with its two warpgroups as two partitions, each freeing stages alone (the package's form)
        "gluon-128x256-rescaled-split-s4-g8": (GLUON_RESCALED_WIDE, True),
    }


#: The same pipeline on e4m3 with one scale per tensor (Part 4's Gluon kernel on FP8 operands: the
#: tensor cores accumulate the whole K, nothing is promoted): what the block scales cost, at the
#: shipped tile and at a 256-wide one (whose promoted form would need 384 registers a thread).
def per_tensor_variants() -> dict:
    def cfg(bn, stages):
        return KernelConfig(block_m=128, block_n=bn, block_k=128, group_m=8, num_warps=8, num_stages=stages,
                            short_tails=False, gluon=True)
    return {"pertensor-128x128-s4": cfg(128, 4), "pertensor-128x256-s4": cfg(256, 4)}


def first_variants() -> dict:
    """Every Gluon first-GEMM variant: name -> the arguments of Case.first_call (config, overlap, per_tensor)."""
    return {**{name: (*spec, False) for name, spec in gluon_variants().items()},
            **{name: (config, True, True) for name, config in per_tensor_variants().items()}}


#: The layer's Gluon variants: name -> (gate/up config, down config, fused epilogue).
def layer_variants() -> dict:
    def cfg(bm, warps, stages):
        return KernelConfig(block_m=bm, block_n=128, block_k=128, group_m=8, num_warps=warps, num_stages=stages,
                            short_tails=False, gluon=True)
    rescaled = replace(cfg(128, 8, 4), rescale=True)
    return {
        "gluon-fused-s4-d64s6": (cfg(64, 8, 4), cfg(64, 4, 6), True),
        "gluon-unfused-128": (cfg(128, 8, 4), cfg(128, 8, 4), False),
        # gate and up of 128 rows rescaled in place (quantising epilogue), the down GEMM 256 wide or 128
        "gluon-rescaled-128": (rescaled, replace(rescaled, block_n=256), True),
        "gluon-rescaled-up-d128": (rescaled, cfg(128, 8, 4), True),
        "gluon-rescaled-split-128": (GLUON_RESCALED, GLUON_RESCALED_WIDE, True),
    }


#: The layer's Gluon variants called directly (the alignment, then ``gluon_fp8_layer``), with x
#: quantised and then gathered into sorted order, or quantised straight into sorted order.
def quantiser_variants() -> dict:
    return {f"{name}+{how}": (name, how == "qsorted") for name in layer_variants() for how in ("gather", "qsorted")}


# ------------------------------------------------------------------ one case

class Case:
    """One model at one M: bf16 weights, their FP8 copies, a routing, quantised activations."""

    def __init__(self, shape: ModelShape, M: int, w13, w2, q13, q2, q1):
        self.shape, self.M = shape, M
        self.inp = bench.make_inputs(shape, M, runtime.DEFAULT_DTYPE, w13, w2)
        self.w13, self.w2 = w13, w2
        self.q13, self.s13, self.q2, self.s2 = q13 + q2   # layer weights: gate/up blocked apart
        self.q1, self.s1 = q1                             # first GEMM: w13 blocked as one weight
        self.x = self.inp.xs[0]
        self.ids = self.inp.ids[0]
        self.tw = self.inp.weights[0]
        self.xq, self.xs = quantize_rows(self.x)
        # float64 copies of the experts these rows touch: fewer rows where each touches 8 of hundreds
        self.rows = torch.linspace(0, M - 1, min(M, 16 if shape.num_experts < 256 else 6)).round().long().unique()
        self.rows = self.rows.to(self.x.device)
        self.used = torch.unique(self.ids[self.rows])
        self.local = torch.searchsorted(self.used, self.ids[self.rows].long()).to(torch.int32)

    def first_call(self, config, overlap=True, per_tensor=False):
        """A zero-argument call of the first GEMM (alignment outside it, as the bench times) and its output;
        ``per_tensor``: the raw e4m3 products, no block scale applied (:func:`per_tensor_variants`)."""
        M, topk, E = self.M, self.shape.topk, self.shape.num_experts
        N = self.q1.shape[1]
        out = torch.empty(M * topk, N, dtype=runtime.DEFAULT_DTYPE, device=self.x.device)
        al = align_block_size(self.ids, config.block_m, E)
        if per_tensor:
            def call():
                a, _ = gk.gather_sorted_fp8(self.xq, self.xs, al, M * topk, topk, config.block_m)
                launch_gluon_gemm(a, self.q1, out, None, al, M * topk, config)
        elif config.gluon:
            def call():
                a, a_st = gk.gather_sorted_fp8(self.xq, self.xs, al, M * topk, topk, config.block_m)
                gk.launch_gluon_fp8_gemm(a, a_st, self.q1, self.s1, out, al, M * topk, config, overlap=overlap)
        else:
            def call():
                launch_fp8_gemm(self.xq, self.xs, self.q1, self.s1, out, al, M * topk, topk, config)
        return call, out

    def gather_call(self, block_m):
        al = align_block_size(self.ids, block_m, self.shape.num_experts)
        return lambda: gk.gather_sorted_fp8(self.xq, self.xs, al, self.M * self.shape.topk, self.shape.topk, block_m)

    def quantise_call(self, block_m, into_sorted):
        """x (bf16) to the first GEMM's sorted e4m3 rows: quantised, then gathered; or quantised into
        sorted order (the alignment inverted first)."""
        al = align_block_size(self.ids, block_m, self.shape.num_experts)
        pairs, topk = self.M * self.shape.topk, self.shape.topk
        if into_sorted:
            return lambda: quantize_rows_sorted(self.x, sorted_positions(al, pairs), topk, gk.sorted_rows(al, block_m))
        return lambda: gk.gather_sorted_fp8(*launch_quantize_rows(self.x), al, pairs, topk, block_m)

    def first_reference(self):
        if getattr(self, "_first_ref", None) is None:
            self._first_ref = self._first_reference()
        return self._first_ref

    def per_tensor_reference(self):
        """The float64 sums of the raw e4m3 products (no scale): what a per-tensor launch returns."""
        return reference_moe_matmul(self.xq[self.rows].double(), self.q1[self.used].double(), self.local)

    def _first_reference(self):
        return reference_moe_matmul(dequantize_activations(self.xq[self.rows], self.xs[self.rows]),
                                    dequantize_weight(self.q1[self.used], self.s1[self.used]), self.local)

    def layer_reference(self):
        return reference_fp8_moe_layer(self.x[self.rows].float(), self.q13[self.used], self.s13[self.used],
                                       self.q2[self.used], self.s2[self.used], self.tw[self.rows], self.local)

    def layer_call(self, variant):
        if variant == "tl":
            return lambda: fp8_moe_layer(self.x, self.q13, self.s13, self.q2, self.s2, self.tw, self.ids)
        if variant in quantiser_variants():
            base, into_sorted = quantiser_variants()[variant]
            up, down, _ = layer_variants()[base]
            E, topk = self.shape.num_experts, self.shape.topk
            return lambda: gk.gluon_fp8_layer(self.x, self.q13, self.s13, self.q2, self.s2, self.tw,
                                              align_block_size(self.ids, up.block_m, E), topk, up, down,
                                              sorted_quantiser=into_sorted)
        up, down, _ = layer_variants()[variant]     # 64-row gate/up tiles: fused epilogue; 128: unfused
        return lambda: fp8_moe_layer(self.x, self.q13, self.s13, self.q2, self.s2, self.tw, self.ids,
                                     configs=(up, down))


def model_weights(shape: ModelShape):
    w13, w2 = bench.make_weights(shape, runtime.DEFAULT_DTYPE, with_w2=True)
    return w13, w2, quantize_w13(w13), quantize_weight(w2), quantize_weight(w13)


def sync() -> None:
    if runtime.ON_GPU:
        torch.cuda.synchronize()


def first_error(case: Case, call, out, per_tensor=False) -> float:
    out.fill_(float("nan"))
    call()
    sync()
    got = out.view(case.M, case.shape.topk, -1)[case.rows]
    ref = case.per_tensor_reference() if per_tensor else case.first_reference()
    return rel_error(got, ref) if bool(torch.isfinite(out).all()) else math.inf


#: The per-tensor launches sum 7168-long rows of e4m3 products in the tensor cores' own accumulator:
#: their error is what the promotion avoids, printed and kept, checked only against gross mistakes.
PER_TENSOR_TOLERANCE = 5e-2


# ------------------------------------------------------------------ stages

TOY = ModelShape("toy-K320-I192", 8, 2, 320, 192)


def check(args) -> int:
    rows, bad = [], 0
    plans = [(TOY, 200), (MODEL_SHAPES["DeepSeek-V3"], 1024), (MODEL_SHAPES["Qwen3-30B-A3B"], 4096),
             (MODEL_SHAPES["Kimi-K2"], 512)] if not args.dry_run else [(TOY, 24)]
    for shape, M in plans:
        w = model_weights(shape)
        case = Case(shape, M, *w)
        for name, spec in first_variants().items():
            per_tensor = spec[2]
            try:
                err = first_error(case, *case.first_call(*spec), per_tensor)
            except Exception as e:  # noqa: BLE001
                err, name = math.inf, f"{name} ({type(e).__name__}: {str(e).splitlines()[0][:80]})"
            ok = err < (PER_TENSOR_TOLERANCE if per_tensor else 1e-2)
            bad += not ok
            rows.append(dict(model=shape.name, M=M, gemm="first", impl=name, rel_error=err, ok=ok))
            print(f"{shape.name:16s} M={M:5d} first {name:36s} rel.err {err:.2e} {'ok' if ok else 'WRONG'}", flush=True)
        ref = case.layer_reference()
        for name in ("tl", *layer_variants(), *quantiser_variants()):
            if "unfused" in name and shape.intermediate % BLOCK:
                continue            # its plain gate/up GEMM reads one scale block per 128 rows of w13
            try:
                got = case.layer_call(name)()
                err = rel_error(got[case.rows], ref) if bool(torch.isfinite(got).all()) else math.inf
            except Exception as e:  # noqa: BLE001
                err, name = math.inf, f"{name} ({type(e).__name__}: {str(e).splitlines()[0][:80]})"
            ok = err < FP8_LAYER_TOLERANCE
            bad += not ok
            rows.append(dict(model=shape.name, M=M, gemm="layer", impl=name, rel_error=err, ok=ok))
            print(f"{shape.name:16s} M={M:5d} layer {name:36s} rel.err {err:.2e} {'ok' if ok else 'WRONG'}", flush=True)
        del case, w
        free()
    write(f"{OUT}/gluon_fp8_check.csv", rows)
    print(f"check: {len(rows) - bad} of {len(rows)} ok")
    return 1 if bad else 0


def free() -> None:
    if runtime.ON_GPU:
        torch.cuda.empty_cache()


def timed(fn) -> float:
    return measure_ms(fn, protocol="cold-l2", max_seconds=5.0)[0]


def sweep(args) -> int:
    t_end = time.monotonic() + args.deadline
    ceil = measure_ceilings(runtime.DEFAULT_DTYPE, "cold-l2")
    info = {**machine_info(), **ceil.columns()}
    print(f"ceilings: read {ceil.read_tbps:.2f} TB/s, bf16 {ceil.matmul_tflops:.0f}, fp8 {ceil.fp8_tflops} "
          f"TFLOP/s, launch {ceil.launch_us:.1f} us", flush=True)
    fp8_rate = ceil.compute_tflops("fp8")
    path = f"{OUT}/gluon_fp8_sweep.csv"
    rows = []
    for model in args.models:
        shape = MODEL_SHAPES[model]
        w = model_weights(shape)
        for M in args.M:
            if time.monotonic() > t_end:
                print("deadline reached", flush=True)
                break
            case = Case(shape, M, *w)
            E, topk, N, K = shape.num_experts, shape.topk, 2 * shape.intermediate, shape.hidden
            first_floor = ceil.floor_ms(*bench.traffic_of("first", case.inp, "fp8"), "fp8")
            layer_floor = ceil.floor_ms(*bench.traffic_of("layer", case.inp, "fp8"), "fp8")
            flops_first = bench.traffic_of("first", case.inp, "fp8")[1]
            calls = {}
            tl_cfg = replace(fp8_config(M, E, N, K, topk, "plain"), gluon=False)
            calls[("first", "tl")] = case.first_call(tl_cfg)
            for name, spec in first_variants().items():
                if args.variants is None or name in args.variants:
                    calls[("first", name)] = case.first_call(*spec)
            calls[("gather", "gather-128")] = (case.gather_call(128), None)
            calls[("gather", "quantise+gather-128")] = (case.quantise_call(128, False), None)
            calls[("gather", "quantise-sorted-128")] = (case.quantise_call(128, True), None)
            bf16 = {"first": impls.first_sorted(case.inp), "layer": impls.layer_of("sorted")(case.inp)}
            calls[("first", "bf16-sorted")] = (bf16["first"].calls[0], None)
            calls[("layer", "bf16-sorted")] = (bf16["layer"].calls[0], None)
            for v in ("tl", *layer_variants(), *quantiser_variants()):
                if args.layers is None or v in args.layers:
                    calls[("layer", v)] = (case.layer_call(v), None)
            ok, errors = {}, {}
            for key, (fn, out) in calls.items():      # correctness and compile before any timing
                try:
                    if out is not None:
                        per_tensor = key[1] in per_tensor_variants()
                        err = first_error(case, fn, out, per_tensor)
                        ok[key] = err < (PER_TENSOR_TOLERANCE if per_tensor else 1e-2)
                        errors[key] = err
                    else:
                        fn()
                        sync()
                        ok[key] = True
                except Exception as e:  # noqa: BLE001
                    print(f"  {key}: {type(e).__name__}: {str(e).splitlines()[0][:100]}", flush=True)
                    ok[key] = False
            times = {k: [] for k in calls if ok[k]}
            if runtime.ON_GPU:
                warm_up_gpu()
            for order in (list(times), list(reversed(times))):
                for key in order:
                    times[key].append(timed(calls[key][0]))
            for key, ts in times.items():
                gemm, impl = key
                ms = min(ts)
                floor = first_floor if gemm == "first" else layer_floor
                row = dict(info, model=model, M=M, E=E, N=N, K=K, topk=topk, gemm=gemm, impl=impl, ms=ms,
                           ms_forward=ts[0], ms_reverse=ts[1], noise=abs(ts[0] - ts[1]) / ms,
                           floor_ms=floor if gemm in ("first", "layer") else "",
                           fraction_of_floor=floor / ms if gemm in ("first", "layer") and not impl.startswith("bf16")
                           else "",
                           fp8_rate_fraction=flops_first / (ms * 1e-3) / 1e12 / fp8_rate if gemm == "first"
                           else "", rel_error=errors.get(key, ""))
                rows.append(row)
            summary = "  ".join(f"{k[1]}={min(v):.3f}" for k, v in times.items() if k[0] == "first")
            lay = "  ".join(f"{k[1]}={min(v):.3f}" for k, v in times.items() if k[0] == "layer")
            print(f"{model} M={M}: floor {first_floor:.3f} | first {summary}", flush=True)
            print(f"{model} M={M}: layer floor {layer_floor:.3f} | {lay}", flush=True)
            write(path, rows)
            # fn and out (the checking loop's last call) hold the case too: left bound, they keep a
            # model's tensors alive while the next model's weights are made (the thirteenth session's
            # call q ran out of memory there, Kimi-K2 after DeepSeek-V3).
            del case, calls, bf16, fn, out
            free()
        del w
        free()
    write(path, rows)
    return 0


def profile(args) -> int:
    """Run the named first-GEMM variants a few times each, untimed: for Nsight Compute to catch."""
    shape = MODEL_SHAPES[args.models[0]]
    case = Case(shape, args.M[0], *model_weights(shape))
    E, topk, N, K = shape.num_experts, shape.topk, 2 * shape.intermediate, shape.hidden
    variants = {"tl": (replace(fp8_config(case.M, E, N, K, topk, "plain"), gluon=False), True), **first_variants()}
    for name in args.variants or ["tl", "gluon-128x8-s4"]:
        call, _ = case.first_call(*variants[name])
        for _ in range(3):
            call()
        sync()
        print(f"profiled {name}", flush=True)
    return 0


def write(path: str, rows: list[dict]) -> None:
    if not rows:
        return
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=("check", "sweep", "profile"))
    p.add_argument("--variants", nargs="+", default=None,
                   help="profile: which to run (default tl and gluon-128x8-s4); sweep: which Gluon first-GEMM "
                        "variants to time (default all; tl always)")
    p.add_argument("--layers", nargs="+", default=None,
                   help="sweep: which layer variants to time beside tl (default all, the quantiser's forms too)")
    p.add_argument("--models", nargs="+", default=["DeepSeek-V3", "Qwen3-30B-A3B", "Kimi-K2"])
    p.add_argument("--M", nargs="+", type=int, default=[1024, 4096, 16384])
    p.add_argument("--deadline", type=float, default=420.0, help="seconds before the sweep stops starting cases")
    p.add_argument("--dry-run", action="store_true",
                   help="on a CPU: the toy shape only, every Gluon call failing as unavailable (checks the script)")
    args = p.parse_args(argv)
    if args.dry_run:
        MODEL_SHAPES[TOY.name] = TOY
        args.models, args.M = [TOY.name], [24]
    elif not runtime.ON_GPU:
        print("needs a CUDA GPU (Hopper): the Gluon kernel does not run in the interpreter")
        return 2
    return {"check": check, "sweep": sweep, "profile": profile}[args.stage](args)


if __name__ == "__main__":
    sys.exit(main())
