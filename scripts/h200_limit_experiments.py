"""Issue 16's levers, each measured against Part 4 as it stands (cold-l2 protocol, one H200).

For each headline model and batch size, times the tuned first GEMM and layer, then variants:

  first GEMM   ws        the K loop with Triton's warp specialisation (``tl.range(warp_specialize=True)``)
               xsorted   x gathered into sorted order first, then A through TMA (GEMM alone; + gather)
               bn/2      half the tuned BLOCK_N at decode (twice the programs)
  layer        decode    pair_alignment (no sort launch) + gate/up GEMM + decode_down (down GEMM and sum)
               sortedact gate/up writes rows in sorted order; the down GEMM reads them (pointers, TMA)
               atomic    the down GEMM adds each row into an fp32 [M, H] with atomics, then one cast
  ceiling      read      the read-only kernel over as many bytes as the call's weights (same protocol)

Usage: python scripts/h200_limit_experiments.py --out "$OUT" [--models ...] [--batches ...]
Writes ``$OUT/limit_experiments.csv`` and prints one line per timing. ``--dry-run`` runs a toy
shape in the interpreter so the script can be tested anywhere.
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import moe_tutorial  # noqa: E402,F401,I001
from moe_tutorial import runtime  # noqa: E402
from moe_tutorial.kernels.align import align_block_size  # noqa: E402
from moe_tutorial.kernels.configs import get_config  # noqa: E402
from moe_tutorial.kernels.decode_kernel import decode_down, pair_alignment  # noqa: E402
from moe_tutorial.kernels.sorted_kernel import launch_sorted_gemm  # noqa: E402
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


def read_ms(nbytes: int, protocol: str) -> float:
    words = torch.empty(nbytes // 4, dtype=torch.int32, device=runtime.DEVICE).random_()
    sms = torch.cuda.get_device_properties(0).multi_processor_count if runtime.ON_GPU else 1
    best = float("inf")
    for per_sm, block, warps in ((2, 16384, 8), (4, 8192, 8), (8, 4096, 4)):
        programs = min(per_sm * sms, max(1, words.numel() // block))
        sums = torch.empty(programs, dtype=torch.int32, device=runtime.DEVICE)
        ms, _ = timed(lambda: read_only_kernel[(programs,)](words, sums, words.numel(), BLOCK=block,
                                                            num_warps=warps), protocol)
        best = min(best, ms)
    return best


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
    if cfg.use_tma:
        o3 = x.new_empty(P, N)
        yield "ws", (lambda: launch_sorted_gemm(x, inp.w13, o3, None, al, P, topk, cfg, warp_spec=True)), o3
    if M >= 256 and runtime.ON_GPU:
        rows = al[0]
        xs = x.new_zeros(rows.numel(), K)

        def gather():
            torch.index_select(x, 0, rows.clamp(0, P - 1) // topk, out=xs)
        gather()
        o4 = x.new_empty(P, N)
        gemm = lambda: launch_sorted_gemm(xs, inp.w13, o4, None, al, P, 1, cfg, a_sorted=True, a_tma=True)  # noqa: E731
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

    if M <= 64:
        out = x.new_empty(M, H)
        act_d = x.new_empty(P, inter)
        for bn, bk, warps, stages in ((16, 256, 4, 4), (32, 256, 4, 4), (64, 128, 4, 4), (32, 128, 4, 6),
                                      (16, 128, 4, 6)):
            cdd = replace(cd, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages,
                          use_tma=runtime.ON_GPU)

            def dec(cdd=cdd):
                pa = pair_alignment(ids, cu.block_m, E)
                launch_sorted_gemm(x, inp.w13, act_d, None, pa, P, topk, cu, gated=True)
                return decode_down(act_d, inp.w2, ids, router, out, cdd)
            yield f"decode-{bn}x{bk}w{warps}s{stages}", dec

        def pair_only():
            pa = pair_alignment(ids, cu.block_m, E)
            launch_sorted_gemm(x, inp.w13, act_d, None, pa, P, topk, cu, gated=True)
            ad = align_block_size(ids, cd.block_m, E)
            launch_sorted_gemm(act_d, inp.w2, down, router, ad, P, 1, cd)
            return down.view(M, topk, H).sum(dim=1)
        yield "pair-align-only", pair_only

    if cu.block_m == cd.block_m:
        for a_tma in ((False, True) if runtime.ON_GPU else (False,)):
            act_s = None

            def sortedact(a_tma=a_tma):
                nonlocal act_s
                au = align_block_size(ids, cu.block_m, E)
                if act_s is None or act_s.shape[0] != au[0].numel():
                    act_s = x.new_zeros(au[0].numel(), inter)
                launch_sorted_gemm(x, inp.w13, act_s, None, au, P, topk, cu, gated=True, c_mode=1)
                launch_sorted_gemm(act_s, inp.w2, down, router, au, P, 1, cd, a_sorted=True, a_tma=a_tma)
                return down.view(M, topk, H).sum(dim=1)
            yield f"sortedact{'-tma' if a_tma else ''}", sortedact

    acc = torch.empty(M, H, device=x.device, dtype=torch.float32)

    def atomic():
        au = align_block_size(ids, cu.block_m, E)
        ad = au if cd.block_m == cu.block_m else align_block_size(ids, cd.block_m, E)
        launch_sorted_gemm(x, inp.w13, act, None, au, P, topk, cu, gated=True)
        acc.zero_()
        launch_sorted_gemm(act, inp.w2, acc, router, ad, P, 1, cd, c_mode=2, c_row_div=topk)
        return acc.to(x.dtype)
    yield "atomic", atomic

    def sum_only():
        return down.view(M, topk, H).sum(dim=1)
    yield "sum-alone", sum_only


FIELDS = ["model", "M", "gemm", "variant", "ms", "floor_ms", "fraction", "rel_err"]


def save(out: str, rows: list[dict], info: dict) -> None:
    Path(out).mkdir(parents=True, exist_ok=True)
    extra = {k: info.get(k, "") for k in ("gpu", "driver", "torch", "triton", "date")}
    write_csv(Path(out) / "limit_experiments.csv", [{**extra, **r} for r in rows], list(extra) + FIELDS)


def clean_cold_ms(fn, replays: int = 30) -> float:
    """Like cold-l2, but after zeroing, a read of another 256 MB leaves L2 full of clean lines."""
    import statistics

    from moe_tutorial.perf.timing import FLUSH_BYTES, flush_l2
    other = torch.empty(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda").random_()
    sums = torch.empty(264, dtype=torch.int32, device="cuda")
    clean = lambda: read_only_kernel[(264,)](other, sums, other.numel(), BLOCK=16384, num_warps=8)  # noqa: E731
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    events = []
    for _ in range(replays):
        flush_l2()
        clean()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        events.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def reader(nbytes: int):
    words = torch.empty(nbytes // 4, dtype=torch.int32, device=runtime.DEVICE).random_()
    programs = 264
    sums = torch.empty(programs, dtype=torch.int32, device=runtime.DEVICE)
    return lambda: read_only_kernel[(programs,)](words, sums, words.numel(), BLOCK=16384, num_warps=8)


def round2(args, rows, info) -> None:
    from moe_tutorial.kernels.topk_sum import topk_sum
    for mb in (25, 50, 100, 470):
        fn = reader(mb << 20)
        for name, ms in (("cold-l2", timed(fn)[0]), ("clean-flush", clean_cold_ms(fn))):
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
            ref = None
            for name, c in cands:
                al = align_block_size(ids, c.block_m, E)
                act = torch.randn(al[0].numel(), inter, device="cuda", dtype=torch.bfloat16)
                for a_tma in (False, True):
                    fn = lambda: launch_sorted_gemm(act, w2, out, router, al, P, 1, c, a_sorted=True, a_tma=a_tma)  # noqa: E731
                    try:
                        fn()
                        ms = timed(fn)[0]
                    except Exception as e:  # noqa: BLE001
                        print(f"{shape.name} M={M} down {name} tma={a_tma}: ERROR {type(e).__name__}", flush=True)
                        continue
                    flops = 2 * P * H * inter
                    variant = f"{name}{'-atma' if a_tma else ''}"
                    rows.append({"model": shape.name, "M": M, "gemm": "down", "variant": variant,
                                 "ms": ms, "fraction": flops / (ms * 1e-3) / 1e12})
                    print(f"{shape.name} M={M} down {name:18s} a_tma={a_tma!s:5s} {ms * 1e3:8.1f} us "
                          f"{flops / (ms * 1e-3) / 1e12:6.0f} TFLOP/s", flush=True)
        save(args.out, rows, info)
        w13 = w2 = None
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
    if args.round == 2:
        round2(args, rows, info)
        save(args.out, rows, info)
        return 0
    ceil = measure_ceilings(dtype, "cold-l2") if runtime.ON_GPU else None
    if ceil:
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
                    rows.append({"model": shape.name, "M": M, "gemm": gemm, "variant": name, "ms": ms,
                                 "floor_ms": floor, "fraction": frac, "rel_err": err})
                    print(f"{shape.name:14s} M={M:5d} {gemm:5s} {name:22s} {ms * 1e3:10.1f} us  "
                          f"floor {floor * 1e3:9.1f}  frac {frac:5.2f}  err {err if err == '' else f'{err:.1e}'}",
                          flush=True)
            print(f"  ({time.time() - t0:.0f} s)", flush=True)
            save(args.out, rows, info)
        del w13, w2
        if runtime.ON_GPU:
            torch.cuda.empty_cache()
    save(args.out, rows, info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
