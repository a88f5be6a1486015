"""Lead's GPU session script: correctness of every kernel on real shapes, then a first look at
Part 4's speed against the roofline floor. Prints a short table; writes CSVs under $OUT.

Run on the GPU machine:  PYTHONUNBUFFERED=1 python3 scripts/gpu_explore.py
"""
from __future__ import annotations

import csv
import itertools
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import moe_tutorial as mt  # noqa: E402
from moe_tutorial import traffic  # noqa: E402
from moe_tutorial.align import align_block_size  # noqa: E402
from moe_tutorial.configs import KernelConfig  # noqa: E402
from moe_tutorial.sorted_kernel import launch_sorted_gemm  # noqa: E402

OUT = os.environ.get("OUT", "/tmp/out")
os.makedirs(OUT, exist_ok=True)
dev = "cuda"
T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def graph_time(fns, reps=20):
    """Median ms per call of fns (a list of callables run in turn), captured in one CUDA graph."""
    for f in fns:
        f()
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fns:
            f()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize()
        times.append(a.elapsed_time(b) / len(fns))
    times.sort()
    return times[len(times) // 2]


def ceilings():
    # Matmul first: it also brings the clocks up from idle before the copy is timed.
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    for _ in range(50):
        a @ b
    n = 1 << 30  # 1 Gi bf16 elements = 2 GiB
    src = torch.randn(n, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    t = graph_time([lambda: dst.copy_(src)] * 4, reps=20)
    bw = 2 * n * 2 / (t * 1e-3)
    del src, dst
    t = graph_time([lambda: a @ b] * 4, reps=10)
    rate = 2 * 8192 ** 3 / (t * 1e-3)
    return bw, rate


def correctness():
    rows = []
    torch.manual_seed(0)
    for name, s in mt.MODEL_SHAPES.items():
        N, K = s.first_gemm
        dtypes = (torch.bfloat16,) if name == "DeepSeek-V3" else (torch.bfloat16, torch.float16, torch.float32)
        for dtype in dtypes:
            w = (torch.randn(s.num_experts, N, K, device=dev) * K ** -0.5).to(dtype)
            for M in (4, 64):
                x = torch.randn(M, K, device=dev).to(dtype)
                ids = mt.shapes.random_topk_ids(M, s.num_experts, s.topk, device=dev)
                if name == "DeepSeek-V3":   # make sure the highest experts (offsets past 2^31) are used
                    ids[0] = torch.arange(s.num_experts - s.topk, s.num_experts, device=dev, dtype=ids.dtype)
                ref = mt.reference_moe_matmul(x, w, ids)
                for fn in (mt.fused_moe_matmul, mt.sorted_moe_matmul):
                    rows.append((name, M, str(dtype), fn.__name__, mt.rel_error(fn(x, w, ids), ref)))
            del w
            torch.cuda.empty_cache()
        # whole layer, small M
        M = 16
        I, H = s.intermediate, s.hidden
        x = torch.randn(M, H, device=dev).to(torch.bfloat16)
        w13 = (torch.randn(s.num_experts, 2 * I, H, device=dev) * H ** -0.5).to(torch.bfloat16)
        w2 = (torch.randn(s.num_experts, H, I, device=dev) * I ** -0.5).to(torch.bfloat16)
        tw, ids = mt.route(torch.randn(M, s.num_experts, device=dev), s.topk)
        ref = mt.reference_moe_layer(x, w13, w2, tw, ids)
        for impl in ("loop", "naive", "sorted"):
            rows.append((name, M, "bf16", f"layer:{impl}", mt.rel_error(mt.moe_layer(x, w13, w2, tw, ids, impl=impl), ref)))
        del w13, w2
        torch.cuda.empty_cache()
    return rows


def candidate_configs(M, topk, E):
    """Tiles by regime; both the pointer and the TMA path for each."""
    rpe = max(1, M * topk // E)
    if rpe <= 4:
        space = itertools.product([16], [32, 64, 128], [128, 256], [4], [3, 4, 5])
    elif rpe <= 512:
        bms = [bm for bm in (16, 32, 64, 128) if bm <= max(16, 4 * rpe)]
        space = itertools.product(bms, [64, 128], [64, 128], [4], [3, 4])
    else:
        space = [(bm, bn, bk, wp, st) for (bm, bn, bk) in ((128, 256, 64), (128, 128, 64), (64, 256, 64), (128, 128, 128), (64, 128, 128))
                 for wp in (4, 8) for st in (3, 4)]
    out = []
    for bm, bn, bk, wp, st in space:
        if (bm * bk + bk * bn) * 2 * st > 220 * 1024 or bm * bn // (wp * 32) > 256:
            continue
        for tma in (False, True):
            out.append(KernelConfig(bm, bn, bk, 8, wp, st, tma))
    return out


def explore(bw, rate, models=("Mixtral-8x7B", "Qwen3-30B-A3B", "DeepSeek-V3"), Ms=(1, 8, 64, 256, 1024, 4096, 16384), cap=20):
    rows = []
    for name in models:
        s = mt.get_shape(name)
        N, K = s.first_gemm
        w = (torch.randn(s.num_experts, N, K, device=dev) * K ** -0.5).to(torch.bfloat16)
        for M in Ms:
            R = 8 if M <= 64 else 2   # rotate routing so L2 holds no previous call's weights
            xs = [torch.randn(M, K, device=dev, dtype=torch.bfloat16) for _ in range(R)]
            idss = [mt.shapes.random_topk_ids(M, s.num_experts, s.topk, device=dev) for _ in range(R)]
            touched = sum(len(torch.unique(i)) for i in idss) / R
            nbytes = traffic.first_gemm_bytes(M, N, K, s.num_experts, s.topk, touched=touched)
            flops = traffic.first_gemm_flops(M, N, K, s.topk)
            floor = traffic.floor_seconds(nbytes, flops, bw, rate) * 1e3
            results = []
            cands = candidate_configs(M, s.topk, s.num_experts)
            t_start = time.time()
            outs = [torch.empty(M * s.topk, N, device=dev, dtype=torch.bfloat16) for _ in range(R)]
            for cfg in cands:
                if time.time() - t_start > cap:
                    break
                try:
                    aligns = [align_block_size(i, cfg.block_m, s.num_experts) for i in idss]
                    fns = [lambda j=j: launch_sorted_gemm(xs[j], w, outs[j], None, aligns[j], M * s.topk, s.topk, cfg) for j in range(R)]
                    t = graph_time(fns, reps=10)
                except Exception as e:  # noqa: BLE001
                    log("config failed", cfg, type(e).__name__, str(e)[:80])
                    continue
                results.append((t, cfg))
            results.sort(key=lambda r: r[0])
            best = results[0]
            best_ptr = next(r for r in results if not r[1].use_tma)
            best_tma = next((r for r in results if r[1].use_tma), (float("nan"), None))
            out = mt.sorted_moe_matmul(xs[0], w, idss[0], config=best[1])
            ref = mt.reference_moe_matmul(xs[0][:4], w, idss[0][:4])
            err = mt.rel_error(out[:4], ref)
            ta = graph_time([lambda j=j: align_block_size(idss[j], best[1].block_m, s.num_experts) for j in range(R)], reps=10)
            rows.append(dict(model=name, M=M, floor_ms=floor, best_ms=best[0], frac=floor / best[0], ptr_ms=best_ptr[0],
                             tma_ms=best_tma[0], align_ms=ta, cfg=str(best[1]), err=err, tried=len(results), n_cands=len(cands)))
            log(f"{name:14s} M={M:6d} floor={floor:.4f} best={best[0]:.4f} frac={floor / best[0]:.2f} ptr={best_ptr[0]:.4f} tma={best_tma[0]:.4f} "
                f"align={ta:.4f} err={err:.1e} tried {len(results)}/{len(cands)} {best[1]}")
        del w
        torch.cuda.empty_cache()
    return rows


def copy_bandwidths():
    n = 1 << 31  # 4 GiB of bf16
    src = torch.randn(n // 2, device=dev, dtype=torch.float32).view(torch.bfloat16)
    dst = torch.empty_like(src)
    for _ in range(5):
        dst.copy_(src)
    torch.cuda.synchronize()
    ts = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); dst.copy_(src); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    ev = 2 * n * 2 / (ts[len(ts) // 2] * 1e-3)
    gr = 2 * n * 2 / (graph_time([lambda: dst.copy_(src)] * 2, reps=10) * 1e-3)
    return ev, gr


def main():
    import triton
    log("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())
    bw, rate = ceilings()
    log(f"copy {bw / 1e12:.2f} TB/s, bf16 matmul {rate / 1e12:.0f} TFLOP/s")
    ev, gr = copy_bandwidths()
    log(f"4 GiB copy: events {ev / 1e12:.2f} TB/s, graph {gr / 1e12:.2f} TB/s")
    bw = max(bw, ev, gr)
    what = sys.argv[1:] or ["correct", "explore"]
    if "correct" in what:
        rows = correctness()
        bad = 0
        for r in rows:
            tol = 1e-5 if "float32" in r[2] else 2e-2
            ok = r[4] < tol
            bad += not ok
            print(f"{r[0]:18s} M={r[1]:3d} {r[2]:14s} {r[3]:22s} rel_err={r[4]:.2e} {'ok' if ok else 'FAIL'}")
        log("correctness failures:", bad)
    if "explore" in what:
        rows = explore(bw, rate)
        with open(os.path.join(OUT, "explore.csv"), "w", newline="") as f:
            wr = csv.DictWriter(f, fieldnames=list(rows[0]))
            wr.writeheader(); wr.writerows(rows)
        for name in ("Mixtral-8x7B", "Qwen3-30B-A3B", "DeepSeek-V3"):
            fr = [r["frac"] for r in rows if r["model"] == name]
            log(f"{name}: geomean frac {traffic.geomean(fr):.3f} min {min(fr):.3f}")


if __name__ == "__main__":
    main()
