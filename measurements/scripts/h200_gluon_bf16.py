"""The bf16 layer at prefill on one H200: the Gluon kernel's pipeline against the shipped ``tl`` layer.

    PYTHONPATH=$PWD python3 measurements/scripts/h200_gluon_bf16.py check             # about a minute
    PYTHONPATH=$PWD python3 measurements/scripts/h200_gluon_bf16.py sweep --out $OUT [--models ...] [--M ...]
    ncu --set full -k regex:"gluon_moe_kernel|sorted_moe_kernel" python3 measurements/scripts/h200_gluon_bf16.py \
        profile --models Qwen3-30B-A3B --M 16384 --impls tl-sorted "gluon up128-s4 down256-s3"

``check`` runs, on DeepSeek-V3, Qwen3-30B-A3B, Mixtral-8x7B and DeepSeek-V2-Lite at M = 2048 (and a
toy shape whose K and I are not whole tiles), the gated gate/up GEMM of
:mod:`moe_tutorial.kernels.gluon_kernel` (NaN-poisoned output, read at each pair's sorted row) and
:func:`~moe_tutorial.kernels.gluon_kernel.gluon_layer` with every config pair of the sweep, against
float64 on a few token rows; also Part 4's ``tl`` layer as the baseline. It exits 1 if any is wrong.

``sweep`` times the whole bf16 layer for each model and M (1024, 2048, 4096, 16384): Part 4's layer
as shipped (``moe_layer(..., impl="sorted")``, its tuned table), ``gluon_layer`` with each config
pair (routing alignment inside the call, as the ``tl`` layer does it), and the ``torch._grouped_mm``
composition (:func:`moe_tutorial.perf.impls.grouped_mm_layer`). Each is checked against float64
first; then timed under the cold-l2 protocol (one timer for all, :func:`moe_tutorial.perf.timing.measure_ms`)
twice, in forward and reverse order (the spread is the noise), against the floor from the
ceilings measured in the same run. Rows go to ``$OUT/gluon_bf16_<stage>.csv`` as they are measured;
after ``--deadline`` seconds no new case starts.

``--dry-run`` runs the script's logic on the CPU on a toy shape, every Gluon call failing as
unavailable (its rows say "skipped"): tests/test_gluon_bf16_script.py keeps it from rotting.
"""
from __future__ import annotations

import argparse
import gc
import math
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import moe_tutorial  # noqa: F401  (first: picks the runtime)
from moe_tutorial import runtime
from moe_tutorial.activation import silu_and_mul
from moe_tutorial.kernels import gluon_kernel as gk
from moe_tutorial.kernels.align import align_block_size
from moe_tutorial.kernels.configs import KernelConfig, get_config
from moe_tutorial.kernels.sorted_layer import launch_fitted
from moe_tutorial.kernels.topk_sum import topk_sum
from moe_tutorial.layer import moe_layer
from moe_tutorial.perf import bench, impls, traffic
from moe_tutorial.perf.ceilings import measure_ceilings
from moe_tutorial.perf.results import write_csv
from moe_tutorial.perf.timing import SLOW_CALL_TIMER, machine_info, measure_ms, warm_up_gpu
from moe_tutorial.reference import reference_moe_layer, reference_moe_matmul, rel_error, tolerance
from moe_tutorial.shapes import MODEL_SHAPES, ModelShape

import torch

DTYPE = runtime.DEFAULT_DTYPE
MODELS = ["DeepSeek-V3", "Qwen3-30B-A3B", "Mixtral-8x7B", "DeepSeek-V2-Lite"]
TOY = ModelShape("toy-K320-I192", 8, 2, 320, 192)
#: The dry run's shape: the interpreter takes seconds per call of the layer on TOY.
DRY = ModelShape("dry-K72-I40", 4, 2, 72, 40)
DRY_M = 8


def shape_of(name: str) -> ModelShape:
    """The shape named ``name``: a model's, or the dry run's (kept out of MODEL_SHAPES, which other
    code in the same process reads)."""
    return DRY if name == DRY.name else MODEL_SHAPES[name]


def cfg(bm: int, bn: int, warps: int, stages: int) -> KernelConfig:
    return KernelConfig(block_m=bm, block_n=bn, block_k=64, num_warps=warps, num_stages=stages, short_tails=False)


#: gluon_layer's (gate/up, down) config pairs. 128-row tiles have two consumer warpgroups (8 warps);
#: the gated form keeps two accumulators, so its tile is 128 wide; the down GEMM's may be 256.
#: 64-row tiles (one warpgroup) for experts with few rows (DeepSeek-V3 at M = 1024: 32 rows each).
GLUON_PAIRS = {
    "gluon up128-s4 down256-s3": (cfg(128, 128, 8, 4), cfg(128, 256, 8, 3)),
    "gluon up128-s4 down128-s4": (cfg(128, 128, 8, 4), cfg(128, 128, 8, 4)),
    "gluon up128-s3 down256-s4": (cfg(128, 128, 8, 3), cfg(128, 256, 8, 4)),
    "gluon up64-s4 down64-s4": (cfg(64, 128, 4, 4), cfg(64, 128, 4, 4)),
}


#: The Gluon gate/up GEMM with Part 4's ``tl`` down GEMM (its tuned tile on the shared block_m): the
#: profile found the Gluon gate/up GEMM faster than the ``tl`` one and its down GEMM slower.
HYBRID = "hybrid: gluon up, tl down"


def hybrid_layer(x, w13, w2, topk_weights, alignment, topk: int, cfg_up: KernelConfig, cfg_down: KernelConfig):
    """``[M, K]``: :func:`~moe_tutorial.kernels.gluon_kernel.gluon_gate_up`, then Part 4's down GEMM
    on its sorted activations as they lie (router weights in its epilogue) and the topk sum."""
    act = gk.gluon_gate_up(x, w13, alignment, topk, cfg_up)
    M, K = x.shape
    down = x.new_empty(M * topk, K)
    launch_fitted(act, w2, down, topk_weights.reshape(-1).float().contiguous(), alignment, M * topk, 1, cfg_down,
                  a_sorted=True)
    return topk_sum(down.view(M, topk, K))


def describe(c: KernelConfig) -> str:
    return f"{c.block_m}x{c.block_n}x{c.block_k} s{c.num_stages} w{c.num_warps} g{c.group_m}"


# ------------------------------------------------------------------ one case

class Case:
    """One model at one M: its routing and tokens (bench.make_inputs), a few rows' float64 references."""

    def __init__(self, shape: ModelShape, M: int, w13: torch.Tensor, w2: torch.Tensor):
        self.shape, self.M, self.w13, self.w2 = shape, M, w13, w2
        self.inp = bench.make_inputs(shape, M, DTYPE, w13, w2)
        self.x, self.ids, self.tw = self.inp.xs[0], self.inp.ids[0], self.inp.weights[0]
        # float64 copies of the experts these rows touch: fewer rows where each touches 8 of hundreds
        n = min(M, 16 if shape.num_experts < 256 else 6)
        self.rows = torch.linspace(0, M - 1, n).round().long().unique().to(self.x.device)
        self.used = torch.unique(self.ids[self.rows])
        self.local = torch.searchsorted(self.used, self.ids[self.rows].long()).to(torch.int32)
        self._layer_ref = self._gated_ref = None

    def layer_reference(self) -> torch.Tensor:
        if self._layer_ref is None:
            r = self.rows
            self._layer_ref = reference_moe_layer(self.x[r], self.w13[self.used], self.w2[self.used], self.tw[r],
                                                  self.local)
        return self._layer_ref

    def gated_reference(self) -> torch.Tensor:
        """``[rows, topk, I]`` float64: silu(gate) * up of each of these rows' pairs."""
        if self._gated_ref is None:
            self._gated_ref = silu_and_mul(reference_moe_matmul(self.x[self.rows], self.w13[self.used], self.local))
        return self._gated_ref

    def layer_call(self, impl: str):
        """A zero-argument call of the whole layer, ``[M, K]``."""
        x, w13, w2, tw, ids = self.x, self.w13, self.w2, self.tw, self.ids
        if impl == "tl-sorted":
            return lambda: moe_layer(x, w13, w2, tw, ids, impl="sorted")
        if impl == "grouped-mm":
            if reason := impls.grouped_mm_support(DTYPE):
                raise impls.Skip(reason)
            return lambda: impls.grouped_mm_layer(x, w13, w2, tw, ids)
        E, topk = self.shape.num_experts, self.shape.topk
        if impl == HYBRID:
            up, down = self.hybrid_configs()
            return lambda: hybrid_layer(x, w13, w2, tw, align_block_size(ids, up.block_m, E), topk, up, down)
        up, down = GLUON_PAIRS[impl]
        return lambda: gk.gluon_layer(x, w13, w2, tw, align_block_size(ids, up.block_m, E), topk, up, down)

    def hybrid_configs(self) -> tuple[KernelConfig, KernelConfig]:
        """The hybrid's tiles: Gluon's 128-row gate/up tile, Part 4's tuned down tile on 128 rows."""
        s = self.shape
        down = get_config(self.M, s.num_experts, s.hidden, s.intermediate, s.topk, DTYPE, "down")
        return cfg(128, 128, 8, 4), replace(down, block_m=128)

    def config_of(self, impl: str) -> str:
        if impl == HYBRID:
            up, down = self.hybrid_configs()
            return f"up {describe(up)} (Gluon) / down {describe(down)} (tl, tuned tile on 128 rows)"
        if impl in GLUON_PAIRS:
            up, down = GLUON_PAIRS[impl]
            return f"up {describe(up)} / down {describe(down)}"
        if impl == "tl-sorted":
            s = self.shape
            up = get_config(self.M, s.num_experts, s.intermediate, s.hidden, s.topk, DTYPE, "gated")
            down = get_config(self.M, s.num_experts, s.hidden, s.intermediate, s.topk, DTYPE, "down")
            return f"up {describe(up)} / down {describe(down)} (tuned table)"
        return ""

    def gated_error(self, config: KernelConfig) -> float:
        """The gated Gluon GEMM alone, output NaN-poisoned, read at the sorted row of each checked pair."""
        E, topk, inter = self.shape.num_experts, self.shape.topk, self.shape.intermediate
        pairs = self.M * topk
        al = align_block_size(self.ids, config.block_m, E)
        a = gk.gather_sorted_rows(self.x, al[0], pairs, topk)
        act = torch.full((gk.sorted_rows(al, config.block_m), inter), float("nan"), dtype=DTYPE, device=self.x.device)
        gk.launch_gluon_gemm(a, self.w13, act, None, al, pairs, config, gated=True)
        n = int(al[2])
        pair = al[0][:n].long()
        real = pair < pairs
        position = torch.full((pairs,), -1, dtype=torch.long, device=self.x.device)
        position[pair[real]] = torch.nonzero(real).flatten()
        want = (self.rows[:, None] * topk + torch.arange(topk, device=self.x.device)).reshape(-1)
        return rel_error(act[position[want]].view(len(self.rows), topk, inter), self.gated_reference())


def layer_error(case: Case, call) -> float:
    out = call()
    sync()
    return rel_error(out[case.rows], case.layer_reference())


def attempt(fn) -> tuple[float, str]:
    """``(value, status)``: "ok", "skipped: why" (Gluon off Hopper, no torch._grouped_mm) or "error: ..."."""
    try:
        return fn(), "ok"
    except impls.Skip as e:
        return math.nan, f"skipped: {e}"
    except RuntimeError as e:
        if str(e) == str(gk.UNAVAILABLE):
            return math.nan, f"skipped: {e}"
        return math.nan, f"error: {type(e).__name__}: {first_line(e)}"
    except Exception as e:  # noqa: BLE001  (any failure is a row, not the end of the run)
        return math.nan, f"error: {type(e).__name__}: {first_line(e)}"


def judged(err: float, status: str) -> str:
    if status != "ok":
        return status
    return "ok" if err < tolerance(DTYPE) else f"wrong (rel.err {err:.1e})"


def first_line(e: Exception) -> str:
    return (str(e).splitlines() or [""])[0][:120]


def sync() -> None:
    if runtime.ON_GPU:
        torch.cuda.synchronize()


def free() -> None:
    gc.collect()
    if runtime.ON_GPU:
        torch.cuda.empty_cache()


def model_weights(shape: ModelShape):
    """w13 ``[E, 2I, K]`` and w2 ``[E, K, I]`` made on the device (DeepSeek-V3's are 22 GB in bf16)."""
    return bench.make_weights(shape, DTYPE, with_w2=True)


# ------------------------------------------------------------------ stages

def check(args) -> int:
    rows, bad = [], 0
    plans = [(TOY, 300)] + [(shape_of(m), 2048) for m in args.models] if not args.dry_run else [(DRY, DRY_M)]
    ups = {describe(up): up for up, _ in GLUON_PAIRS.values()}
    for shape, M in plans:
        w13, w2 = model_weights(shape)
        case = Case(shape, M, w13, w2)
        results = []
        for name, up in ups.items():
            results.append(("gated", f"gluon {name}", *attempt(lambda c=up: case.gated_error(c))))
        for impl in ("tl-sorted", *GLUON_PAIRS, HYBRID):
            results.append(("layer", impl, *attempt(lambda i=impl: layer_error(case, case.layer_call(i)))))
        for gemm, impl, err, status in results:
            status = judged(err, status)
            bad += not (status == "ok" or status.startswith("skipped"))
            rows.append(dict(model=shape.name, M=M, gemm=gemm, impl=impl, rel_error=err, status=status))
            print(f"{shape.name:16s} M={M:5d} {gemm:5s} {impl:28s} rel.err {err:.2e} {status}", flush=True)
        case = w13 = w2 = None
        free()
    write(Path(args.out) / "gluon_bf16_check.csv", rows)
    print(f"check: {len(rows) - bad} of {len(rows)} ok or skipped")
    return 1 if bad else 0


def timed(fn) -> tuple[float, str]:
    return measure_ms(fn, protocol="cold-l2", max_seconds=5.0)


def sweep(args) -> int:
    t_end = time.monotonic() + args.deadline
    ceil = measure_ceilings(DTYPE, "cold-l2")
    info = {**machine_info(), **ceil.columns()}
    print(f"{info['gpu']}, torch {info['torch']}, triton {info['triton']}; ceilings: read {ceil.read_tbps:.2f} TB/s, "
          f"matmul {ceil.matmul_tflops:.0f} TFLOP/s, launch {ceil.launch_us:.1f} us", flush=True)
    path = Path(args.out) / "gluon_bf16_sweep.csv"
    rows, stopped = [], False
    for model in args.models:
        if stopped:
            break
        shape = shape_of(model)
        w13, w2 = model_weights(shape)
        for M in args.M:
            if time.monotonic() > t_end:
                print(f"deadline ({args.deadline:.0f} s) reached: no new case", flush=True)
                stopped = True
                break
            rows += sweep_case(Case(shape, M, w13, w2), ceil, info)
            write(path, rows)
            free()
        w13 = w2 = None
        free()
    write(path, rows)
    summary(rows)
    return 0


def sweep_case(case: Case, ceil, info: dict) -> list[dict]:
    """Every impl of one case: checked, then timed forward and in reverse; one row each."""
    s, M = case.shape, case.M
    nbytes, flops = bench.traffic_of("layer", case.inp)
    floor = ceil.floor_ms(nbytes, flops)
    calls, rows = {}, {}
    for impl in ("tl-sorted", *GLUON_PAIRS, HYBRID, "grouped-mm"):
        rows[impl] = dict(info, model=s.name, M=M, E=s.num_experts, topk=s.topk, hidden=s.hidden,
                          inter=s.intermediate, impl=impl, config=case.config_of(impl), ms="", ms_forward="",
                          ms_reverse="", noise="", timer="", tflops="", floor_ms=floor, fraction_of_floor="",
                          rel_error="")
        call, status = attempt(lambda i=impl: case.layer_call(i))
        if status == "ok":                              # correctness and compile before any timing
            err, status = attempt(lambda c=call: layer_error(case, c))
            status = judged(err, status)
            rows[impl]["rel_error"] = err
        rows[impl]["status"] = status
        if status == "ok":
            calls[impl] = call
    times = {impl: [] for impl in calls}
    if runtime.ON_GPU:
        warm_up_gpu()
    for order in (list(calls), list(reversed(calls))):
        for impl in order:
            timing, status = attempt(lambda i=impl: timed(calls[i]))
            if status != "ok":
                rows[impl]["status"] = status
                continue
            times[impl].append(timing[0])
            rows[impl]["timer"] = timing[1]
            if timing[1] not in ("cold-l2", "perf_counter", SLOW_CALL_TIMER):
                rows[impl]["status"] = f"ok ({timing[1]})"     # a graph capture failed: launch gaps included
    for impl, ts in times.items():
        if len(ts) < 2:
            continue
        ms = min(ts)
        rows[impl].update(ms=ms, ms_forward=ts[0], ms_reverse=ts[1], noise=abs(ts[0] - ts[1]) / ms,
                          tflops=flops / (ms * 1e-3) / 1e12, fraction_of_floor=floor / ms)
    print(f"\n{s.name} M={M}: floor {floor:.3f} ms ({traffic.arithmetic_intensity(nbytes, flops):.0f} FLOP/byte)")
    print(f"  {'impl':28s} {'ms':>8s} {'TFLOP/s':>8s} {'floor':>6s}  status")
    for r in rows.values():
        timing = (f"{r['ms']:8.3f} {r['tflops']:8.0f} {r['fraction_of_floor']:6.2f}" if r["ms"] != ""
                  else f"{'':8s} {'':8s} {'':6s}")
        print(f"  {r['impl']:28s} {timing}  {r['status']}", flush=True)
    return list(rows.values())


def summary(rows: list[dict]) -> None:
    """Per model and M: the best Gluon pair against the tl layer and torch._grouped_mm."""
    print("\nbest gluon_layer against the tl layer (speed-up > 1: Gluon faster)")
    cases = dict.fromkeys((r["model"], r["M"]) for r in rows)
    for model, M in cases:
        ms = {r["impl"]: r["ms"] for r in rows if (r["model"], r["M"]) == (model, M) and r["ms"] != ""}
        gluon = {k: v for k, v in ms.items() if k in GLUON_PAIRS}
        if not gluon:
            print(f"  {model:16s} M={M:5d}: no Gluon time")
            continue
        best = min(gluon, key=gluon.get)
        vs = "  ".join(f"vs {k} x{ms[k] / gluon[best]:.2f}" for k in ("tl-sorted", "grouped-mm") if k in ms)
        print(f"  {model:16s} M={M:5d}: {best} {gluon[best]:.3f} ms  {vs}")
        if HYBRID in ms and "tl-sorted" in ms:
            print(f"  {'':16s}         {HYBRID} {ms[HYBRID]:.3f} ms  vs tl-sorted x{ms['tl-sorted'] / ms[HYBRID]:.2f}")


def write(path: Path, rows: list[dict]) -> None:
    if rows:
        write_csv(path, rows, list(dict.fromkeys(k for r in rows for k in r)))


def profile(args) -> int:
    """Call the layer of each of ``--impls`` a few times on the first model and M, untimed: for
    Nsight Compute to catch its GEMMs (``-k regex:"gluon_moe_kernel|sorted_moe_kernel"``)."""
    shape = shape_of(args.models[0])
    case = Case(shape, args.M[0], *model_weights(shape))
    for impl in args.impls:
        call = case.layer_call(impl)
        for _ in range(3):
            call()
        sync()
        print(f"profiled {impl}", flush=True)
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("stage", choices=("check", "sweep", "profile"))
    p.add_argument("--impls", nargs="+", default=["tl-sorted", "gluon up128-s4 down256-s3"],
                   help="profile: whose layer to run")
    p.add_argument("--models", nargs="+", default=MODELS, choices=sorted(MODEL_SHAPES))
    p.add_argument("--M", nargs="+", type=int, default=[1024, 2048, 4096, 16384])
    p.add_argument("--deadline", type=float, default=400.0, help="seconds after which the sweep starts no new case")
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the CSV files")
    p.add_argument("--dry-run", action="store_true",
                   help="on a CPU: the toy shape only, every Gluon call failing as unavailable (checks the script)")
    args = p.parse_args(argv)
    if args.dry_run:
        args.models, args.M = [DRY.name], [DRY_M]
    elif gk.UNAVAILABLE:
        print(f"needs a Hopper GPU: {gk.UNAVAILABLE}")
        return 2
    return {"check": check, "sweep": sweep, "profile": profile}[args.stage](args)


if __name__ == "__main__":
    sys.exit(main())
