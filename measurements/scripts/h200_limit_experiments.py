"""Issue 16's levers, each measured against Part 4 as it stands (cold-l2 protocol, one H200).

Round 1, for each headline model and batch size: the tuned first GEMM and layer, then variants:

  first GEMM   bn/2, bn/4  narrower BLOCK_N at decode (more programs in flight)
               xsorted     x gathered into sorted order first, the GEMM reading it as it lies
                           (A through TMA where the configuration takes the weights so); + gather
  layer        sortedact   the gate/up GEMM leaves its rows in sorted order, the down GEMM reads them
               sum-alone   torch's topk sum by itself
  ceiling      read        the read-only kernel over 25 MiB ... 1.9 GB (cold-l2 and rotated)

Round 2 (``--round 2``): the read-only kernel after a flush that leaves L2 clean; two reads of the
bytes of a decode layer's weights (w13, then w2); torch's sum against
:func:`moe_tutorial.kernels.topk_sum.topk_sum`; the down GEMM on sorted activations with other tiles.

Dropped after measuring (the code as run is commit 6d62726, the numbers in measurements/gpu-notes.md):
Triton's warp specialisation of the K loop, a decode path (one block per pair, no sort, and a down
GEMM that adds up each token's experts itself) and a down GEMM that adds its rows into the output
with fp32 atomics.

Usage: python measurements/scripts/h200_limit_experiments.py --out "$OUT" [--round 2] [--models ...] [--batches ...]
Writes ``$OUT/limit_experiments.csv`` and prints one line per timing. ``--dry-run`` runs round 1
on a toy shape in the interpreter so the script can be tested anywhere.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import moe_tutorial  # noqa: E402,F401,I001
from moe_tutorial import runtime  # noqa: E402
from moe_tutorial.kernels.align import align_block_size  # noqa: E402
from moe_tutorial.kernels.configs import get_config  # noqa: E402
from moe_tutorial.kernels.sorted_layer import launch_sorted_gemm  # noqa: E402
from moe_tutorial.experiments import limits  # noqa: E402
from moe_tutorial.perf import bench  # noqa: E402
from moe_tutorial.perf.ceilings import measure_ceilings, read_only_kernel  # noqa: E402
from moe_tutorial.perf.results import write_csv  # noqa: E402
from moe_tutorial.perf.timing import machine_info, measure_ms, warm_up_gpu  # noqa: E402
from moe_tutorial.shapes import BATCH_SIZES, HEADLINE_MODELS, ModelShape, get_shape  # noqa: E402

import torch  # noqa: E402


def timed(fn, protocol="cold-l2"):
    fn()
    if runtime.ON_GPU:
        torch.cuda.synchronize()
    return measure_ms(fn, protocol=protocol, max_seconds=5.0)


def rel(a, b):
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def reader(nbytes: int, programs: int = 264, block: int = 16384, warps: int = 8, words=None):
    """One launch of the read-only kernel over ``nbytes`` of random words (or over ``words``)."""
    if words is None:
        words = torch.empty(nbytes // 4, dtype=torch.int32, device=runtime.DEVICE).random_()
    programs = min(programs, max(1, words.numel() // block))
    sums = torch.empty(programs, dtype=torch.int32, device=runtime.DEVICE)
    return lambda: read_only_kernel[(programs,)](words, sums, words.numel(), BLOCK=block, num_warps=warps)


def read_ms(nbytes: int, protocol: str) -> float:
    """The best of three launch shapes of the read-only kernel over ``nbytes``, under ``protocol``."""
    words = torch.empty(nbytes // 4, dtype=torch.int32, device=runtime.DEVICE).random_()
    sms = torch.cuda.get_device_properties(0).multi_processor_count if runtime.ON_GPU else 1
    return min(timed(reader(nbytes, per_sm * sms, block, warps, words=words), protocol)[0]
               for per_sm, block, warps in ((2, 16384, 8), (4, 8192, 8), (8, 4096, 4)))


def first_variants(shape: ModelShape, M: int, inp, dtype):
    E, N, K = inp.w13.shape
    topk, P = shape.topk, M * shape.topk
    x, ids = inp.xs[0], inp.ids[0]
    cfg = get_config(M, E, N, K, topk, dtype, "plain")
    al = align_block_size(ids, cfg.block_m, E)
    out = x.new_empty(P, N)
    base = lambda: launch_sorted_gemm(x, inp.w13, out, None, al, P, topk, cfg)  # noqa: E731
    yield "base", base, out
    if M <= 64:
        for bn in (cfg.block_n // 2, cfg.block_n // 4):
            if bn >= 16:
                c2 = replace(cfg, block_n=bn)
                o2 = x.new_empty(P, N)
                yield f"bn{bn}", (lambda c2=c2, o2=o2: launch_sorted_gemm(x, inp.w13, o2, None, al, P, topk, c2)), o2
    if M >= 256 and runtime.ON_GPU:
        rows = al[0]
        xs = x.new_zeros(rows.numel(), K)

        def gather():
            torch.index_select(x, 0, rows.clamp(0, P - 1) // topk, out=xs)
        gather()
        o4 = x.new_empty(P, N)
        gemm = lambda: launch_sorted_gemm(xs, inp.w13, o4, None, al, P, 1, cfg, a_sorted=True)  # noqa: E731
        yield "xsorted-gemm", gemm, o4
        yield "xsorted+gather", (lambda: (gather(), gemm())), o4
        yield "gather", gather, None


def layer_variants(shape: ModelShape, M: int, inp, dtype):
    E, H, inter, topk = shape.num_experts, shape.hidden, shape.intermediate, shape.topk
    P = M * topk
    x, ids, w = inp.xs[0], inp.ids[0], inp.weights[0]
    cu = get_config(M, E, inter, H, topk, dtype, "gated")
    cd = get_config(M, E, H, inter, topk, dtype, "down")
    router = w.reshape(-1).float().contiguous()
    act = x.new_empty(P, inter)
    down = x.new_empty(P, H)

    def base():
        au = align_block_size(ids, cu.block_m, E)
        ad = au if cd.block_m == cu.block_m else align_block_size(ids, cd.block_m, E)
        launch_sorted_gemm(x, inp.w13, act, None, au, P, topk, cu, gated=True)
        launch_sorted_gemm(act, inp.w2, down, router, ad, P, 1, cd)
        return down.view(M, topk, H).sum(dim=1)
    yield "base", base

    if cu.block_m == cd.block_m:
        act_s = None

        def sortedact():
            nonlocal act_s
            au = align_block_size(ids, cu.block_m, E)
            if act_s is None or act_s.shape[0] != au[0].numel():
                act_s = x.new_zeros(au[0].numel(), inter)
            launch_sorted_gemm(x, inp.w13, act_s, None, au, P, topk, cu, gated=True, c_sorted=True)
            launch_sorted_gemm(act_s, inp.w2, down, router, au, P, 1, cd, a_sorted=True)
            return down.view(M, topk, H).sum(dim=1)
        yield "sortedact", sortedact

    def sum_only():
        return down.view(M, topk, H).sum(dim=1)
    yield "sum-alone", sum_only


#: Columns of ``limit_experiments.csv`` (committed as ``moe_tutorial/data/h200_limit_experiments.csv``).
FIELDS = ["gpu", "driver", "torch", "triton", "date", "round", "experiment", "protocol",
          "read_tbps", "read_measured_tbps", "matmul_tflops", "launch_us", "model", "M", "variant",
          "bytes", "ms", "floor_ms", "fraction_of_floor", "rate", "rel_error", "status"]
#: The ceilings a row with a floor carries (measured once per run, kept in ``info``).
CEILING_FIELDS = ("read_tbps", "read_measured_tbps", "matmul_tflops", "launch_us")


def keep_ceilings(info: dict, ceil) -> None:
    """Put the run's ceilings in ``info``, for :func:`tidy` to copy into each row with a floor."""
    info.update({k: v for k, v in ceil.columns().items() if k in CEILING_FIELDS})
#: What each raw ``gemm`` tag measured, and the unit of ``rate`` there.
EXPERIMENTS = {"first": ("first-gemm", ""), "layer": ("layer", ""), "sum": ("topk-sum", ""),
               "down": ("down-gemm-tiles", "TFLOP/s"), "ceiling": ("read-by-size", "TB/s"),
               "ceiling2": ("read-by-size", "TB/s")}


def tidy(raw: dict, round_: int, info: dict) -> dict:
    """One raw timing as a row of :data:`FIELDS` (reads: ``M`` held MiB, ``variant`` the protocol)."""
    experiment, unit = EXPERIMENTS[raw["gemm"]]
    row = {k: info.get(k, "") for k in ("gpu", "driver", "torch", "triton", "date")}
    row.update(round=round_, experiment=experiment, protocol="cold-l2", model=raw.get("model", ""),
               M=raw.get("M", ""), variant=raw.get("variant", ""), ms=raw.get("ms", ""),
               floor_ms=raw.get("floor_ms", ""), rel_error=raw.get("rel_err", ""), status="ok")
    if raw.get("floor_ms") not in (None, "") and "read_tbps" in info:
        row.update({k: info[k] for k in CEILING_FIELDS})
    if experiment == "read-by-size" and raw["model"] == "read":
        row.update(protocol=raw["variant"], model="", M="", variant="read-only", bytes=int(raw["M"]) << 20,
                   rate=raw["fraction"])
    elif experiment == "read-by-size":
        row.update(experiment="decode-reads")
    elif unit:
        row["rate"] = raw.get("fraction", "")
    elif raw.get("fraction") not in (None, ""):
        row["fraction_of_floor"] = raw["fraction"]
    if round_ == 3:
        row["experiment"] = "cta-clusters"
    if str(raw.get("rel_err", "")).startswith("error"):
        row.update(status=raw["rel_err"], rel_error="")
    return row


def save(out: str, rows: list[dict], info: dict, round_: int = 1, shapes=None) -> None:
    """Write the rows, each run's read ceiling raised to the best rate its calls reached
    (:func:`moe_tutorial.experiments.limits.raise_read_ceiling`); ``shapes`` names the models."""
    Path(out).mkdir(parents=True, exist_ok=True)
    tidied = limits.raise_read_ceiling([tidy(r, round_, info) for r in rows], shapes)
    write_csv(Path(out) / "limit_experiments.csv", tidied, FIELDS)


def round2(args, rows, info) -> None:
    from moe_tutorial.kernels.topk_sum import topk_sum
    for mb in (25, 50, 100, 470):
        fn = reader(mb << 20)
        # The zeroing flush (cold-l2-zero) against one that leaves L2 clean, cold-l2's since 2026-12-02
        # (the committed rows of this round name them so).
        for name, ms in (("cold-l2-zero", timed(fn, "cold-l2-zero")[0]), ("clean-flush", timed(fn, "cold-l2")[0])):
            rows.append({"model": "read", "M": mb, "gemm": "ceiling2", "variant": name, "ms": ms,
                         "fraction": (mb << 20) / (ms * 1e-3) / 1e12})
            print(f"read {mb} MiB {name}: {ms * 1e3:.1f} us", flush=True)
    for shape in [get_shape(m) for m in args.models.split(",")]:
        H, inter, E, topk = shape.hidden, shape.intermediate, shape.num_experts, shape.topk
        w13, w2 = bench.make_weights(shape, torch.bfloat16, with_w2=True)
        warm_up_gpu(200)
        for M in (1, 8):
            inp = bench.make_inputs(shape, M, torch.bfloat16, w13, w2)
            t = inp.touched
            r13, r2 = reader(int(t * 2 * inter * H * 2)), reader(int(t * H * inter * 2))
            r13_only = timed(r13)[0]
            both = timed(lambda: (r13(), r2()))[0]
            for name, ms in (("read-w13", r13_only), ("read-w13+w2", both)):
                rows.append({"model": shape.name, "M": M, "gemm": "ceiling2", "variant": name, "ms": ms})
                print(f"{shape.name} M={M} {name}: {ms * 1e3:.1f} us", flush=True)
        for M in BATCH_SIZES:
            down = torch.randn(M, topk, H, device="cuda", dtype=torch.bfloat16)
            ref = down.sum(dim=1)
            err = rel(topk_sum(down), ref)
            for name, fn in (("torch-sum", lambda: down.sum(dim=1)), ("topk_sum", lambda: topk_sum(down))):
                ms = timed(fn)[0]
                rows.append({"model": shape.name, "M": M, "gemm": "sum", "variant": name, "ms": ms, "rel_err": err})
                print(f"{shape.name} M={M} {name}: {ms * 1e3:.1f} us err {err:.1e}", flush=True)
        for M in (1024, 4096, 16384):
            inp = bench.make_inputs(shape, M, torch.bfloat16, w13, w2)
            P = M * topk
            ids, w = inp.ids[0], inp.weights[0]
            router = w.reshape(-1).float().contiguous()
            cd = get_config(M, E, H, inter, topk, torch.bfloat16, "down")
            out = torch.empty(P, H, device="cuda", dtype=torch.bfloat16)
            cands = [("tuned", cd)] + [(f"{bm}x{bn}x{bk}w{wp}s{st}", replace(cd, block_m=bm, block_n=bn, block_k=bk,
                                                                        num_warps=wp, num_stages=st))
                                        for bm, bn, bk, wp, st in ((128, 128, 64, 4, 3), (128, 128, 64, 8, 3),
                                                                   (128, 128, 128, 4, 2), (128, 256, 64, 8, 3),
                                                                   (128, 256, 64, 4, 3), (64, 256, 64, 4, 3),
                                                                   (128, 128, 64, 4, 4))]
            for name, c in cands:
                al = align_block_size(ids, c.block_m, E)
                act = torch.randn(al[0].numel(), inter, device="cuda", dtype=torch.bfloat16)
                fn = lambda: launch_sorted_gemm(act, w2, out, router, al, P, 1, c, a_sorted=True)  # noqa: E731
                try:
                    fn()
                    ms = timed(fn)[0]
                except Exception as e:  # noqa: BLE001
                    print(f"{shape.name} M={M} down {name}: ERROR {type(e).__name__}", flush=True)
                    continue
                flops = 2 * P * H * inter
                rows.append({"model": shape.name, "M": M, "gemm": "down", "variant": name,
                             "ms": ms, "fraction": flops / (ms * 1e-3) / 1e12})
                print(f"{shape.name} M={M} down {name:18s} {ms * 1e3:8.1f} us "
                      f"{flops / (ms * 1e-3) / 1e12:6.0f} TFLOP/s", flush=True)
        save(args.out, rows, info, 2)
        w13 = w2 = None
        torch.cuda.empty_cache()


class _WithCtas:
    """``sorted_moe_kernel`` launched with ``num_ctas`` programs per cluster (round 3)."""

    def __init__(self, kernel, num_ctas: int):
        self.kernel, self.num_ctas = kernel, num_ctas

    def __getitem__(self, grid):
        return lambda *args, **kw: self.kernel[grid](*args, num_ctas=self.num_ctas, **kw)


def round3(args, rows, info) -> None:
    """CTA clusters (``num_ctas=2``), alone and with 256-row tiles, on the first GEMM at prefill."""
    from moe_tutorial.kernels import sorted_kernel as sk
    from moe_tutorial.kernels import sorted_layer
    kernel = sk.sorted_moe_kernel
    ceil = measure_ceilings(torch.bfloat16, "cold-l2")
    keep_ceilings(info, ceil)
    print(ceil, flush=True)
    for shape in [get_shape(m) for m in args.models.split(",")]:
        w13, _ = bench.make_weights(shape, torch.bfloat16, with_w2=False)
        warm_up_gpu(200)
        E, N, K = w13.shape
        for M in (1024, 4096, 16384):
            inp = bench.make_inputs(shape, M, torch.bfloat16, w13, None)
            x, ids, topk = inp.xs[0], inp.ids[0], shape.topk
            P = M * topk
            floor = ceil.floor_ms(*bench.traffic_of("first", inp))
            cfg = get_config(M, E, N, K, topk, torch.bfloat16, "plain")
            out = x.new_empty(P, N)
            ref = None
            whole = replace(cfg, short_tails=False)      # one tile shape: PlanCTA fails on two
            for name, c, ctas in (("tuned", cfg, 1), ("tuned-ctas2", cfg, 2), ("notails", whole, 1),
                                  ("notails-ctas2", whole, 2),
                                  ("notails-256x128-ctas2", replace(whole, block_m=256, block_n=128), 2),
                                  ("notails-256x256-ctas2", replace(whole, block_m=256, block_n=256, num_stages=3), 2)):
                sk.sorted_moe_kernel = _WithCtas(kernel, ctas) if ctas > 1 else kernel
                al = align_block_size(ids, c.block_m, E)
                fn = lambda: sorted_layer._launch(x, w13, out, None, al, P, topk, c)  # noqa: E731
                try:
                    fn()
                    err = 0.0 if ref is None else rel(out, ref)
                    ref = out.clone() if ref is None else ref
                    ms = timed(fn)[0]
                except Exception as e:  # noqa: BLE001
                    print(f"{shape.name} M={M} {name}: ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)
                    rows.append({"model": shape.name, "M": M, "gemm": "first", "variant": name, "floor_ms": floor,
                                 "rel_err": f"error: {type(e).__name__}"})
                    torch.cuda.synchronize()
                    continue
                finally:
                    sk.sorted_moe_kernel = kernel
                rows.append({"model": shape.name, "M": M, "gemm": "first", "variant": name, "ms": ms,
                             "floor_ms": floor, "fraction": floor / ms, "rel_err": err})
                print(f"{shape.name:14s} M={M:5d} {name:16s} {ms * 1e3:9.1f} us frac {floor / ms:.2f} err {err:.1e}",
                      flush=True)
        save(args.out, rows, info, 3)
        w13 = None
        torch.cuda.empty_cache()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/out")
    ap.add_argument("--models", default=",".join(HEADLINE_MODELS))
    ap.add_argument("--batches", default=",".join(map(str, BATCH_SIZES)))
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--round", type=int, default=1)
    args = ap.parse_args(argv)
    dtype = torch.bfloat16 if runtime.ON_GPU else torch.float32
    info = machine_info() if runtime.ON_GPU else {}
    print(info, flush=True)
    rows = []
    if args.round in (2, 3):
        (round2 if args.round == 2 else round3)(args, rows, info)
        save(args.out, rows, info, args.round)
        return 0
    ceil = measure_ceilings(dtype, "cold-l2") if runtime.ON_GPU else None
    if ceil:
        keep_ceilings(info, ceil)
        print(ceil, flush=True)
        for mb in (25, 50, 100, 235, 470, 1880):
            for protocol in ("cold-l2", "rotated"):
                ms = read_ms(mb << 20, protocol)
                rows.append({"model": "read", "M": mb, "gemm": "ceiling", "variant": protocol, "ms": ms,
                             "floor_ms": "", "fraction": (mb << 20) / (ms * 1e-3) / 1e12, "rel_err": ""})
                print(f"read {mb} MiB {protocol}: {ms * 1e3:.1f} us, {rows[-1]['fraction']:.2f} TB/s", flush=True)
    models = [get_shape(m) for m in args.models.split(",")]
    if args.dry_run:
        models = [ModelShape("toy", 6, 3, 64, 48)]
    for shape in models:
        w13, w2 = bench.make_weights(shape, dtype, with_w2=True)
        warm_up_gpu(200)
        for M in map(int, args.batches.split(",")):
            if args.dry_run and M > 64:
                continue
            t0 = time.time()
            inp = bench.make_inputs(shape, M, dtype, w13, w2)
            for gemm, gen in (("first", first_variants), ("layer", layer_variants)):
                nbytes, flops = bench.traffic_of(gemm, inp)
                floor = ceil.floor_ms(nbytes, flops) if ceil else float("nan")
                ref = None
                for item in gen(shape, M, inp, dtype):
                    name, fn = item[0], item[1]
                    try:
                        ret = fn()
                        got = item[2] if gemm == "first" else ret
                        if ref is None:
                            ref = None if got is None else got.clone()
                        err = rel(got, ref) if got is not None and ref is not None else ""
                        ms, how = timed(fn)
                    except Exception as e:  # noqa: BLE001
                        print(f"{shape.name} M={M} {gemm} {name}: ERROR {type(e).__name__}: {str(e)[:300]}",
                              flush=True)
                        rows.append({"model": shape.name, "M": M, "gemm": gemm, "variant": name, "ms": "",
                                     "floor_ms": floor, "fraction": "", "rel_err": f"error: {type(e).__name__}"})
                        continue
                    frac = floor / ms if ceil else float("nan")
                    # A piece of the GEMM or layer (limits.PARTS): the whole one's floor is not its floor.
                    whole = (EXPERIMENTS[gemm][0], name) not in limits.PARTS
                    rows.append({"model": shape.name, "M": M, "gemm": gemm, "variant": name, "ms": ms,
                                 "floor_ms": floor if whole else "", "fraction": frac if whole else "",
                                 "rel_err": err})
                    print(f"{shape.name:14s} M={M:5d} {gemm:5s} {name:22s} {ms * 1e3:10.1f} us  "
                          f"floor {floor * 1e3:9.1f}  frac {frac:5.2f}  err {err if err == '' else f'{err:.1e}'}",
                          flush=True)
            print(f"  ({time.time() - t0:.0f} s)", flush=True)
            save(args.out, rows, info, shapes={s.name: s for s in models})
        del w13, w2
        if runtime.ON_GPU:
            torch.cuda.empty_cache()
    save(args.out, rows, info, shapes={s.name: s for s in models})
    return 0


if __name__ == "__main__":
    sys.exit(main())
