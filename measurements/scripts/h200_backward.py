"""Part 8 on one H200: the training step of the layer, checked, timed and weighed.

1. Times of the forward (autograd on: what training runs), the forward + backward and the backward
   alone (a forward's graph kept and differentiated again), for Mixtral-8x7B, Qwen3-30B-A3B and
   DeepSeek-V3 at T = 4096 to 32768 tokens, under the cold-l2 protocol of
   moe_tutorial/perf/timing.py: one call captured in a CUDA graph, 256 MB read before each replay,
   events around the replay, median of 30; a call slower than 20 ms, or one a graph cannot hold (the
   step and the backward, which autograd runs off the capturing stream, and Liger's forward), is
   timed with events around the call, L2 flushed before each, and the row names that timer. The
   implementations of a case are timed in order, then in reverse order, one alive at a time, the
   lower median kept.
   With them: the memory kept for the backward (allocated after the forward beyond inputs and
   output), the peak of the whole step (torch.cuda.max_memory_allocated), the first call's seconds
   (Triton compiling into an empty cache unless --warm-cache), and the bf16 matmul rate (8192^3)
   measured in the same run. Each row's output is checked against float64 on a few tokens.
2. Gradients on real shapes (real hidden size, intermediate size, E and topk; bf16): ours, the
   torch._grouped_mm composition and Liger-Kernel's fused_moe against autograd through the float64
   reference, by relative error, for the output, dx, dW13, dW2 and the router weights. The tokens
   are routed among the first 16 experts (8 for Mixtral) so that the float64 reference holds only
   those; every other expert must get a gradient of exactly zero.
3. Tiles: a few configurations of each GEMM of the step on one case (default Qwen3-30B-A3B at
   T = 32768), each checked against the heuristic's output and timed alone under cold-l2; the best
   per GEMM is printed and written as a table the package reads (tuned_configs_training.json).

Usage, on one H200 from the repository root (about 8 minutes; torch 2.11, Triton 3.6):

    pip install liger-kernel==0.8.5        # optional, the second anchor; skipped cleanly without it
    python3 measurements/scripts/h200_backward.py --out "$OUT"

Writes ``$OUT/h200_backward.csv`` (commit it as ``moe_tutorial/data/h200_backward.csv``; notebook 08
and docs/results.md read it), ``$OUT/h200_backward_grads.csv``, ``$OUT/h200_backward_tiles.csv`` and
``$OUT/tuned_configs_training.json`` (copy into ``moe_tutorial/data/tuned_configs_training_h200.json``
to ship the best tiles). Liger-Kernel autotunes for minutes per shape; by default it runs with
``LIGER_FUSED_MOE_AUTOTUNE=0`` (one pinned configuration per kernel, as Liger offers), and the
rows say so; ``--liger-autotune`` lets it tune (give it ``--models`` and ``--tokens`` of one case).
``--dry-run`` runs all three steps on a toy shape in Triton's interpreter (no GPU needed, its
timings mean nothing), so the script can be tested anywhere.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)
from moe_tutorial import runtime
from moe_tutorial.experiments.backward import FIELDS, step_flops, tile_name
from moe_tutorial.kernels import gluon_grad_kernel
from moe_tutorial.kernels.align import gather_sorted_rows
from moe_tutorial.kernels.backward_kernel import launch_expert_grad, launch_rows_gemm
from moe_tutorial.kernels.configs import KernelConfig, gpu_name, problem_key
from moe_tutorial.kernels.gluon_kernel import gluon_gate_up
from moe_tutorial.kernels.stable_align import expert_rows, stable_align_block_size
from moe_tutorial.kernels.trainable_layer import trainable_moe_layer
from moe_tutorial.kernels.training_configs import GLUON_GEMMS, VARIANTS, in_tl, training_configs
from moe_tutorial.layer import moe_layer
from moe_tutorial.perf import impls, timing
from moe_tutorial.perf.results import write_csv
from moe_tutorial.reference import reference_layer_grads, reference_moe_layer, rel_error
from moe_tutorial.routing import route
from moe_tutorial.shapes import HEADLINE_MODELS, MODEL_SHAPES, ModelShape

import torch

TOKENS = (4096, 8192, 16384, 32768)
#: The timing step starts no new case after this share of --max-minutes: the gradient check and the
#: tile sweep come after it.
TIMING_SHARE = 0.7
#: The toy of --dry-run: the interpreter runs it in seconds.
DRY_SHAPE = ModelShape("toy", num_experts=6, topk=2, hidden=64, intermediate=32)
DRY_TOKENS = (16,)
GRAD_FIELDS = ["gpu", "torch", "triton", "date", "model", "T", "experts_used", "impl", "tensor", "rel_error",
               "idle_experts_max", "status"]
TILE_FIELDS = ["gpu", "torch", "triton", "date", "protocol", "model", "T", "gemm", "config", "ms", "tflops",
               "rel_error", "timer", "best", "status"]


def ours(x, w13, w2, topk_weights, topk_ids):
    return moe_layer(x, w13, w2, topk_weights, topk_ids, impl="sorted")


def tl_configs(x, w13, w2, topk_ids, gemms=GLUON_GEMMS):
    """The package's configs with the GEMMs ``gemms`` in ``tl`` (the step as it ran before their Gluon kernels)."""
    (M, K), E, inter, topk = x.shape, w13.shape[0], w2.shape[2], topk_ids.shape[1]
    return in_tl(training_configs(M, E, K, inter, topk, x.dtype), M, E, topk, gemms)


def ours_tl_dw(x, w13, w2, topk_weights, topk_ids):
    """Ours with the dW GEMMs in ``tl``: the Gluon dW kernel's gain is ``ours`` against this, in the same run."""
    return trainable_moe_layer(x, w13, w2, topk_weights, topk_ids,
                               configs=tl_configs(x, w13, w2, topk_ids, ("dw2", "dw13")))


def ours_tl(x, w13, w2, topk_weights, topk_ids):
    """Ours with every GEMM in ``tl``: the Gluon dA' kernel's gain is ``ours-tl-dw`` against this."""
    return trainable_moe_layer(x, w13, w2, topk_weights, topk_ids, configs=tl_configs(x, w13, w2, topk_ids))


def ours_gathered(x, w13, w2, topk_weights, topk_ids):
    """Ours without the backward's sorted copies of dO and x (the kernels gather their rows), every
    GEMM in ``tl``: the copies' measured gain is ``ours-tl`` against this, in the same run."""
    cfg = replace(tl_configs(x, w13, w2, topk_ids), sorted_copies=False)
    return trainable_moe_layer(x, w13, w2, topk_weights, topk_ids, configs=cfg)


def grouped_mm_schema() -> str:
    """The schema of this torch's ``_grouped_mm`` (the composition's call is written for
    ``_grouped_mm(Tensor self, Tensor mat2, Tensor? offs, ...)``), or why there is none."""
    try:
        return str(torch.ops.aten._grouped_mm.default._schema)
    except (AttributeError, RuntimeError) as e:
        return f"none ({type(e).__name__}: {e})"


def available_impls(dry_run: bool) -> dict:
    """The implementations that run here, and why the others do not."""
    found, skipped = {"ours": ours, "ours-tl-dw": ours_tl_dw, "ours-tl": ours_tl, "ours-gathered": ours_gathered}, {}
    reason = impls.grouped_mm_support(torch.bfloat16)
    if reason:
        skipped["grouped_mm"] = reason
    else:
        found["grouped_mm"] = impls.grouped_mm_layer
    reason = impls.liger_support()
    if reason:
        skipped["liger"] = reason
    else:
        found["liger"] = impls.liger_layer
    return found, skipped


def device_problem(shape: ModelShape, T: int, dtype, *, seed: int = 0, experts: int | None = None,
                   weights=None) -> dict:
    """Inputs made on the device (DeepSeek-V3's weights are 11 G values: too many for the CPU's
    generator), routing from a softmax over random logits on the CPU (only the first ``experts``)."""
    dev = runtime.DEVICE
    g = torch.Generator(device=dev).manual_seed(seed)
    E, H, inter = shape.num_experts, shape.hidden, shape.intermediate
    if weights is None:
        w13 = torch.empty(E, 2 * inter, H, device=dev, dtype=dtype).normal_(generator=g).mul_(H ** -0.5)
        w2 = torch.empty(E, H, inter, device=dev, dtype=dtype).normal_(generator=g).mul_(inter ** -0.5)
    else:
        w13, w2 = weights
    logits = torch.randn(T, E, generator=torch.Generator().manual_seed(seed + T))
    if experts is not None:
        logits[:, experts:] = float("-inf")
    topk_weights, topk_ids = route(logits, shape.topk)
    return dict(x=torch.randn(T, H, generator=g, device=dev, dtype=dtype), w13=w13, w2=w2,
                topk_weights=topk_weights.to(dev), topk_ids=topk_ids.to(dev),
                d_out=torch.randn(T, H, generator=g, device=dev, dtype=dtype))


PARAMS = ("x", "w13", "w2", "topk_weights")


def leaves(p: dict) -> dict:
    return {k: (p[k].detach().requires_grad_() if k in PARAMS else p[k]) for k in PARAMS + ("topk_ids",)}


def free() -> None:
    gc.collect()
    if runtime.ON_GPU:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------ 1. gradients

def check_gradients(models, found, dtype, machine, log) -> list[dict]:
    rows = []
    for shape in models:
        used = min(shape.num_experts, 8 if shape.num_experts <= 8 else 16)
        T = 64 if not runtime.ON_GPU else 512
        p = device_problem(shape, T, dtype, seed=1, experts=used)
        ref = reference_layer_grads(p["x"], p["w13"][:used], p["w2"][:used], p["topk_weights"], p["topk_ids"],
                                    p["d_out"])
        ref_out = reference_moe_layer(p["x"], p["w13"][:used], p["w2"][:used], p["topk_weights"], p["topk_ids"])
        for name, fn in found.items():
            base = {**machine, "model": shape.name, "T": T, "experts_used": used, "impl": name}
            try:
                lv = leaves(p)
                out = fn(**lv)
                grads = dict(zip(PARAMS, torch.autograd.grad(out, [lv[k] for k in PARAMS], p["d_out"],
                                                             allow_unused=True)))
                missing = [k for k, g in grads.items() if g is None]
                if missing:
                    raise RuntimeError(f"no gradient for {', '.join(missing)}")
            except Exception as e:  # noqa: BLE001  (an anchor that fails is a result)
                rows.append({**base, "tensor": "all", "status": f"error: {type(e).__name__}: {str(e)[:160]}"})
                log(f"  {shape.name:14s} {name:11s} error: {type(e).__name__}: {str(e)[:120]}")
                continue
            idle = max((float(g[used:].abs().max()) if g[used:].numel() else 0.0) for g in (grads["w13"], grads["w2"]))
            errs = {"out": rel_error(out, ref_out), "x": rel_error(grads["x"], ref["x"]),
                    "w13": rel_error(grads["w13"][:used], ref["w13"]), "w2": rel_error(grads["w2"][:used], ref["w2"]),
                    "topk_weights": rel_error(grads["topk_weights"], ref["topk_weights"])}
            for tensor, err in errs.items():
                rows.append({**base, "tensor": tensor, "rel_error": err, "idle_experts_max": idle, "status": "ok"})
            log(f"  {shape.name:14s} {name:11s} " + "  ".join(f"{k} {v:.1e}" for k, v in errs.items())
                + f"  idle experts' |dW| max {idle:g}")
            out = grads = lv = None
            free()
        p = ref = ref_out = None
        free()
    return rows


# ------------------------------------------------------------------------------ 2. times

#: What a row's timer says where no CUDA graph is tried: autograd's backward runs where the
#: forward ran, not on the capturing stream, so a capture of the step or the backward always fails
#: (and each failed capture leaked its memory: 110 GB over Qwen3-30B-A3B's nine cases); Liger-Kernel's
#: forward does not capture either.
UNCAPTURED = {"step": "events, autograd (no graph)", "backward": "events, autograd (no graph)",
              "liger": "events, no graph (Liger)"}


def timed(fn, max_seconds: float, uncaptured: str | None = None) -> tuple[float | None, str]:
    """``(median ms, timer)`` under cold-l2, or ``(None, why)`` for a call too slow or one that failed.
    With ``uncaptured`` (the timer's name) no graph is tried: events around each call, L2 flushed
    before each."""
    try:
        if uncaptured is None:
            return timing.measure_ms(fn, protocol="cold-l2", max_seconds=max_seconds)
        return timing.measure_ms(fn, protocol="cold-l2", max_seconds=max_seconds, graphable=False,
                                 no_graph_timer=uncaptured)
    except timing.TooSlow as e:
        return None, f"skipped: {e}"
    except Exception as e:  # noqa: BLE001  (out of memory, say: the row says so, the run goes on)
        free()
        return None, f"error: {type(e).__name__}: {str(e)[:120]}"


def prepare_case(name, fn, p):
    """The three timed calls of one implementation on one case, and a kept forward for the backward."""
    lv = leaves(p)
    params = [lv[k] for k in PARAMS]

    def forward():
        return fn(**lv)

    def step():
        return torch.autograd.grad(forward(), params, p["d_out"], allow_unused=True)

    kept = forward()

    def backward():
        return torch.autograd.grad(kept, params, p["d_out"], retain_graph=True, allow_unused=True)
    return forward, step, backward, kept


def memory_of(fn, p) -> tuple[int, int]:
    """``(kept, peak)`` bytes: allocated after a forward beyond inputs and output, and the most
    allocated during forward and backward beyond the inputs (0, 0 on the CPU)."""
    if not runtime.ON_GPU:
        return 0, 0
    free()
    lv = leaves(p)
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn(**lv)
    torch.cuda.synchronize()
    kept = torch.cuda.memory_allocated() - before - out.numel() * out.element_size()
    grads = torch.autograd.grad(out, [lv[k] for k in PARAMS], p["d_out"], allow_unused=True)
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out, grads, lv
    return int(kept), int(peak)


def output_error(out, p, rows: int = 4) -> float:
    """The output's relative error against float64 on a few token rows (their experts only)."""
    take = torch.linspace(0, p["x"].shape[0] - 1, rows).round().long().to(p["x"].device)
    ids = p["topk_ids"][take]
    used = torch.unique(ids)
    local = torch.searchsorted(used, ids.long()).to(torch.int32)
    ref = reference_moe_layer(p["x"][take], p["w13"][used], p["w2"][used], p["topk_weights"][take], local)
    return rel_error(out[take], ref)


def describe(row: dict, matmul: float) -> str:
    """One printed line per timed row: ms and TFLOP/s of each phase, memory, error, first call."""
    flops = step_flops(row["T"], row["hidden"], row["inter"], row["topk"])
    parts = []
    for phase, label in (("forward", "fwd"), ("step", "fwd+bwd"), ("backward", "bwd")):
        ms = row.get(f"{phase}_ms")
        rate = flops[phase] / (ms * 1e-3) / 1e12 if ms else float("nan")
        parts.append(f"{label} {ms or float('nan'):8.2f} ms ({rate:4.0f})")
    bwd = flops["backward"] / (row["backward_ms"] * 1e-3) / 1e12 / matmul if row.get("backward_ms") else float("nan")
    text = (f"  {row['model']:14s} T={row['T']:6d} {row['impl']:11s} " + "  ".join(parts)
            + f"  bwd {bwd:.2f} of matmul  kept {row['kept_bytes'] / 1e9:5.2f} GB"
            + f"  peak {row['peak_bytes'] / 1e9:5.2f} GB  err {row['rel_error']:.1e}")
    return text + (f"  first call {row['first_call_s']:.1f} s" if row.get("first_call_s") else "")


def time_models(models, tokens, found, skipped, dtype, machine, matmul, args, started, log) -> list[dict]:
    """Part 1's rows. One implementation's tensors live at a time: each is prepared (its first call,
    its check, its memory), timed and freed, then the next; the order is run forwards, then
    backwards, each implementation prepared again, the lower median kept. (Keeping all three alive
    for both passes ran DeepSeek-V3 at T = 32768 out of the H200's memory.)"""
    rows = []
    names = list(found)
    for shape in models:
        weights = None
        first_call = {}
        for T in tokens:
            base = {**machine, "protocol": "cold-l2" if runtime.ON_GPU else "perf_counter", "matmul_tflops": matmul,
                    "model": shape.name, "E": shape.num_experts, "hidden": shape.hidden,
                    "inter": shape.intermediate, "topk": shape.topk, "T": T}
            if time.monotonic() - started > 60 * args.max_minutes * TIMING_SHARE:
                rows += [{**base, "impl": n, "status": "skipped: over the --max-minutes budget"} for n in names]
                continue
            p = device_problem(shape, T, dtype, seed=2, weights=weights)
            weights = (p["w13"], p["w2"])
            timing.warm_up_gpu()
            case = {n: {**base, "impl": n} for n in names}
            times = {n: {} for n in names}
            orders = [names, names[::-1]] if runtime.ON_GPU else [names]
            for n in (n for order in orders for n in order):
                row, fn = case[n], found[n]
                if "status" in row:                      # failed on the first pass
                    continue
                try:
                    if n not in first_call:
                        t0 = time.perf_counter()
                        lv = leaves(p)
                        torch.autograd.grad(fn(**lv), [lv[k] for k in PARAMS], p["d_out"], allow_unused=True)
                        timing.synchronize()
                        first_call[n] = row["first_call_s"] = time.perf_counter() - t0
                        lv = None
                    if "rel_error" not in row:
                        row["kept_bytes"], row["peak_bytes"] = memory_of(fn, p)
                    calls = prepare_case(n, fn, p)
                    if "rel_error" not in row:
                        row["rel_error"] = output_error(calls[3].detach(), p)
                    for phase, call in zip(("forward", "step", "backward"), calls[:3]):
                        ms, how = timed(call, args.max_seconds,
                                        UNCAPTURED.get(phase) or (UNCAPTURED["liger"] if n == "liger" else None))
                        best = times[n].get(phase)
                        if best is None or (ms is not None and (best[0] is None or ms < best[0])):
                            times[n][phase] = (ms, how)
                except Exception as e:  # noqa: BLE001  (a second pass that fails keeps the first's times)
                    if not times[n]:
                        row["status"] = f"error: {type(e).__name__}: {str(e)[:160]}"
                    log(f"  {shape.name} T={T} {n}: error {type(e).__name__}: {str(e)[:120]}")
                calls = None
                free()
            for n in names:
                row = case[n]
                for phase in ("forward", "step", "backward"):
                    row[f"{phase}_ms"], row[f"{phase}_timer"] = times[n].get(phase, (None, ""))
                if "status" not in row:
                    row["status"] = "ok" if row["rel_error"] < 2e-2 else "wrong"
                    log(describe(row, matmul))
                rows.append(row)
            case = times = p = None
            free()
        for name, why in skipped.items():
            log(f"  {shape.name}: {name} skipped: {why}")
        weights = None
        free()
    return rows


# ------------------------------------------------------------------------------ 3. tiles

#: The Gluon tiles the sweep tries for the M-grouped GEMMs that have a Gluon kernel: (block_n, stages).
GLUON_ROWS_TILES = {"dact": ((128, 4), (128, 3)), "up": ((128, 4), (128, 3), (64, 4))}


def tile_candidates(gemm: str, base: KernelConfig, gluon_only: bool = False) -> list[KernelConfig]:
    """A few tiles around the heuristic's, on its block_m where the alignment fixes it (with
    ``gluon_only`` the Gluon kernels' tiles alone)."""
    bm = base.block_m
    if gemm in ("dw2", "dw13"):
        shapes = [(128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 128, 32, 4, 4),
                  (64, 128, 64, 4, 4), (128, 64, 64, 4, 4), (128, 128, 128, 8, 3), (128, 256, 32, 8, 4),
                  # Two stages and fewer registers: for short runs (a few hundred rows per expert, a K
                  # loop of a few steps) two or three programs share an SM, one storing while one loads.
                  (128, 128, 64, 4, 2), (128, 128, 64, 8, 2), (128, 256, 64, 8, 2), (64, 256, 64, 4, 2)]
        # The Gluon kernel (kernels/gluon_grad_kernel.py): a persistent grid whose load warp fetches the
        # next tile's rows while a tile is stored; 128 rows of dW, two consumer warpgroups.
        gluon = [(128, 256, 64, 8, 3), (128, 128, 64, 8, 4), (128, 256, 32, 8, 5), (128, 128, 32, 8, 6)]
        # (first: a sweep cut short by its time budget still measures them)
        return ([replace(base, block_m=p, block_n=q, block_k=min(r, bm), num_warps=w, num_stages=s, gluon=True)
                 for p, q, r, w, s in gluon]
                + [replace(base, block_m=p, block_n=q, block_k=min(r, bm), num_warps=w, num_stages=s)
                   for p, q, r, w, s in shapes if not gluon_only])
    # The M-grouped Gluon kernels, on the alignment's block_m with a warpgroup of MMA warps per 64 rows:
    # dA' (kernels/gluon_dact_kernel.py, its epilogue in warps of its own; 64 x 6 lost everywhere and
    # 256 x 2 fails in ptxas 12.9) and Part 4's gate/up (kernels/gluon_kernel.py, H kept by its epilogue).
    gluon = [replace(base, block_n=n, block_k=64, num_warps=8 if bm == 128 else 4, num_stages=s, persistent=False,
                     gluon=True) for n, s in GLUON_ROWS_TILES.get(gemm, ())]
    if gluon_only:
        return gluon
    shapes = [(128, 64, 8, 3), (128, 64, 8, 4), (256, 64, 8, 3), (64, 128, 4, 4), (128, 128, 8, 3), (64, 64, 4, 4)]
    if gemm == "up":
        shapes = [(128, 64, 8, 4), (128, 64, 8, 3), (64, 64, 4, 4), (64, 128, 4, 3), (128, 32, 8, 4)]
    # Three on the persistent grid too (one program per SM walks the tiles, so a tile's epilogue
    # overlaps the next tile's first loads): the heuristic's and the first two shapes.
    tiles = [replace(base, block_n=n, block_k=k, num_warps=w, num_stages=s) for n, k, w, s in shapes]
    return gluon + tiles + [replace(t, persistent=True) for t in [base] + tiles[:2]]


def sweep_tiles(shape: ModelShape, T: int, dtype, machine, started, args, log) -> tuple[list[dict], dict]:
    p = device_problem(shape, T, dtype, seed=3)
    x, w13, w2, d_out = p["x"], p["w13"], p["w2"], p["d_out"]
    E, topk, H, inter = shape.num_experts, shape.topk, shape.hidden, shape.intermediate
    heur = training_configs(T, E, H, inter, topk, dtype)
    pairs = T * topk
    alignment = stable_align_block_size(p["topk_ids"], heur.up.block_m, E)
    rows_of = expert_rows(alignment)
    padded = alignment[0].numel()
    router = p["topk_weights"].reshape(-1).float().contiguous()
    h, act = x.new_empty(padded, 2 * inter), x.new_empty(padded, inter)
    dh, s_act = x.new_empty(padded, 2 * inter), x.new_empty(padded, inter)
    launch_rows_gemm(x, w13, alignment, pairs, topk, heur.up, epilogue="save_swiglu", b_layout="nk", h=h, act=act)

    def dact_buffers(cfg):
        return torch.empty(pairs, -(-inter // cfg.block_n), device=x.device, dtype=torch.float32)

    ds0 = dact_buffers(heur.dact)
    # dA' and the K-grouped GEMMs read dO and x as the backward does: in sorted copies where it makes them.
    copies = heur.sorted_copies
    d_rows = gather_sorted_rows(d_out, alignment[0], pairs, topk) if copies else d_out
    x_rows = gather_sorted_rows(x, alignment[0], pairs, topk) if copies else x
    if copies:
        for what, t in (("dO", d_out), ("x", x)):
            ms, how = timed(lambda t=t: gather_sorted_rows(t, alignment[0], pairs, topk), args.max_seconds)
            log(f"  the sorted copy of {what}: " + (f"{ms:.3f} ms" if ms else how))
    launch_rows_gemm(d_rows, w2, alignment, pairs, topk, heur.dact, epilogue="dswiglu", b_layout="kn",
                     a_sorted=copies, out=dh, h=h, act=s_act, router_weights=router, ds_partial=ds0)
    gemms = args.tile_gemms.split(",")
    # Buffers only for the GEMMs swept, and none of the weights for a sweep of the dW GEMMs alone
    # (DeepSeek-V3's weights are 22.5 GB and its dW13 14 GB: a full sweep does not fit an 80 GB card).
    if not set(gemms) - {"dw2", "dw13"}:
        del w13, w2, p["w13"], p["w2"], h, act
    dx_shape, dw2_shape, dw13_shape = (pairs, H), (E, H, inter), (E, 2 * inter, H)
    # Zeros: the rows past the alignment's used rows are never written, and the check compares whole buffers.
    h_try, act_try = (torch.zeros_like(h), torch.zeros_like(act)) if "up" in gemms else (None, None)
    dh_try, sa_try = (torch.zeros_like(dh), torch.zeros_like(s_act)) if "dact" in gemms else (None, None)

    def launcher(gemm, cfg, other_rows=False):
        """The launch of one GEMM with ``cfg``, and its output. dO and x are read as the package
        reads them (the forward gathers x; the backward takes the sorted copies where the configs
        make them), or with ``other_rows`` the other way: what the copies gain, GEMM by GEMM."""
        sorted_in = other_rows if gemm == "up" else copies != other_rows
        d_in, x_in = (d_rows, x_rows) if sorted_in else (d_out, x)
        if gemm == "up" and cfg.gluon:            # the copy of x into sorted order is part of its time
            return lambda: gluon_gate_up(x, w13, alignment, topk, cfg, h=h_try), h_try
        if gemm == "up":
            return lambda: launch_rows_gemm(x_in, w13, alignment, pairs, topk, cfg, epilogue="save_swiglu",
                                            b_layout="nk", a_sorted=sorted_in, h=h_try, act=act_try), h_try
        if gemm == "dact":
            ds = dact_buffers(cfg)
            return lambda: launch_rows_gemm(d_in, w2, alignment, pairs, topk, cfg, epilogue="dswiglu", b_layout="kn",
                                            a_sorted=sorted_in, out=dh_try, h=h, act=sa_try, router_weights=router,
                                            ds_partial=ds), dh_try
        if gemm == "dx":
            out = x.new_empty(dx_shape)
            return lambda: launch_rows_gemm(dh, w13, alignment, pairs, 1, cfg, epilogue="scatter", b_layout="kn",
                                            a_sorted=True, out=out), out
        if gemm == "dw2":
            out = x.new_empty(dw2_shape)
            return lambda: launch_expert_grad(d_in, s_act, out, alignment, rows_of, pairs, topk, cfg,
                                              left_sorted=sorted_in, right_sorted=True), out
        out = x.new_empty(dw13_shape)
        return lambda: launch_expert_grad(dh, x_in, out, alignment, rows_of, pairs, topk, cfg, left_sorted=True,
                                          right_sorted=sorted_in), out

    flops = {"up": 2 * pairs * 2 * inter * H, "dact": 2 * pairs * inter * H, "dx": 2 * pairs * 2 * inter * H,
             "dw2": 2 * pairs * inter * H, "dw13": 2 * pairs * 2 * inter * H}
    base_row = {**machine, "protocol": "cold-l2" if runtime.ON_GPU else "perf_counter", "model": shape.name, "T": T}
    rows, best = [], {}
    for gemm in gemms:
        ref_fn, reference = launcher(gemm, getattr(heur, gemm))
        ref_fn()
        # The gate/up and dA' candidates write into one shared buffer: their reference is a copy.
        # The others' outputs are their own (one less 14 GB dW13 alive at a time).
        ref_fn, reference = None, reference.clone() if gemm in ("up", "dact") else reference
        candidates = [getattr(heur, gemm)] + [c for c in tile_candidates(gemm, getattr(heur, gemm), args.gluon_only)
                                              if c != getattr(heur, gemm)]
        if gluon_grad_kernel.UNAVAILABLE:          # no Gluon kernel here (the interpreter's dry run)
            candidates = [c for c in candidates if not c.gluon]
        if not runtime.ON_GPU:
            candidates = candidates[:2]
        results = []
        for cfg in candidates:
            if time.monotonic() - started > 60 * args.max_minutes:
                rows.append({**base_row, "gemm": gemm, "config": json.dumps(asdict(cfg)),
                             "status": "skipped: over the --max-minutes budget"})
                continue
            row = {**base_row, "gemm": gemm, "config": json.dumps(asdict(cfg))}
            fn = out = None
            try:
                fn, out = launcher(gemm, cfg)
                fn()
                row["rel_error"] = rel_error(out, reference)
                ms, how = timed(fn, args.max_seconds)
                row.update(ms=ms, timer=how, tflops=flops[gemm] / (ms * 1e-3) / 1e12 if ms else None,
                           status=how if ms is None else "ok" if row["rel_error"] < 1e-2 else "wrong")
            except Exception as e:  # noqa: BLE001  (a tile that does not fit or compile is a result)
                row["status"] = f"error: {type(e).__name__}: {str(e)[:120]}"
            rows.append(row)
            if row.get("status") == "ok":
                results.append((row["ms"], cfg, row))
        if results:
            ms, cfg, row = min(results, key=lambda r: r[0])
            row["best"] = True
            best[gemm] = cfg
            log(f"  {gemm:5s} best {tile_name(asdict(cfg))}: "
                f"{ms:.3f} ms ({row['tflops']:.0f} TFLOP/s); heuristic's: "
                + next((f"{r['ms']:.3f} ms" for r in rows if r["gemm"] == gemm and r.get("ms")), "-"))
            if gemm != "dx" and not cfg.gluon:       # the Gluon kernel reads sorted copies only
                fn = out = None
                fn, out = launcher(gemm, cfg, other_rows=True)
                fn()
                ms_o, how = timed(fn, args.max_seconds)
                other_out, fn, out = out.clone(), None, None      # one copy alive at a time: DS-V3's dW13 is 14 GB
                fn, out = launcher(gemm, cfg)
                fn()
                other = "gathered by the kernel" if (gemm != "up" and copies) else "from a sorted copy (TMA)"
                log(f"        the same tile with dO and x {other}: " + (f"{ms_o:.3f} ms" if ms_o else how)
                    + f", output equal: {torch.equal(out, other_out)}")
                other_out = fn = out = None
    key_shapes = {"up": (inter, H), "dact": (inter, H), "dx": (H, 2 * inter), "dw2": (H, inter), "dw13": (2 * inter, H)}
    table = {gpu_name(): {problem_key(E, *key_shapes[g], topk, dtype, VARIANTS[g]): {str(T): asdict(c)}
                          for g, c in best.items()}}
    return rows, table


# ------------------------------------------------------------------------------ main

#: The matmul whose rate the run measures (a small one in the interpreter's dry run).
MATMUL_N = 8192 if runtime.ON_GPU else 256


def matmul_tflops(dtype) -> float:
    n = MATMUL_N
    a, b = (torch.randn(n, n, device=runtime.DEVICE, dtype=dtype) for _ in range(2))
    c = torch.empty_like(a)
    ms, _ = timing.measure_ms(lambda: torch.matmul(a, b, out=c), protocol="cold-l2", max_seconds=10)
    return 2 * n ** 3 / (ms * 1e-3) / 1e12


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="Part 8 on one H200: gradients, times and memory of the training step.")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")), help="folder for the CSVs")
    ap.add_argument("--models", default=",".join(HEADLINE_MODELS), help="comma-separated model names")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="comma-separated token counts T")
    ap.add_argument("--tile-case", default="Qwen3-30B-A3B:32768", help="MODEL:T for the tile sweep")
    ap.add_argument("--no-tiles", action="store_true", help="skip the tile sweep")
    ap.add_argument("--no-times", action="store_true", help="skip the timing step (a sweep only)")
    ap.add_argument("--tile-gemms", default="up,dact,dx,dw2,dw13", help="the GEMMs the tile sweep times")
    ap.add_argument("--gluon-only", action="store_true",
                    help="the tile sweep times the chosen tile and the Gluon kernels' tiles only")
    ap.add_argument("--impls", help="comma-separated implementations to time (default: every one that runs here)")
    ap.add_argument("--no-grads", action="store_true", help="skip the gradient check")
    ap.add_argument("--liger-autotune", action="store_true", help="let Liger-Kernel autotune (minutes per shape)")
    ap.add_argument("--max-minutes", type=float, default=7.5, help="start no new case after this (default 7.5)")
    ap.add_argument("--max-seconds", type=float, default=5.0, help="a call slower than this is skipped")
    ap.add_argument("--warm-cache", action="store_true", help="keep Triton's cache (the first call may not compile)")
    ap.add_argument("--dry-run", action="store_true", help="a toy shape in the interpreter (no GPU needed)")
    return ap


def refused_without_gpu(dry_run: bool) -> bool:
    """True (and says why) when there is no GPU and no ``--dry-run``: Part 8's GPU scripts share it."""
    if runtime.ON_GPU or dry_run:
        return False
    print("no CUDA GPU here: the script needs one (--dry-run runs a toy in the interpreter)", file=sys.stderr)
    return True


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if refused_without_gpu(args.dry_run):
        return 2
    # Read when liger_kernel is first imported (by impls.liger_support below).
    os.environ.setdefault("LIGER_FUSED_MOE_AUTOTUNE", "1" if args.liger_autotune else "0")
    if not args.warm_cache and runtime.ON_GPU:
        # An empty Triton cache, so that the first call pays for compiling what it launches, as on a fresh machine.
        os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="h200_backward_triton_")
    started = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    machine = timing.machine_info()
    dtype = torch.bfloat16 if runtime.ON_GPU else torch.float32
    if args.dry_run:
        models, tokens, tile_case = [DRY_SHAPE], DRY_TOKENS, (DRY_SHAPE, DRY_TOKENS[-1])
    else:
        models = [MODEL_SHAPES[m] for m in args.models.split(",")]
        tokens = tuple(int(t) for t in args.tokens.split(","))
        name, T = args.tile_case.split(":")
        tile_case = (MODEL_SHAPES[name], int(T))
    found, skipped = available_impls(args.dry_run)
    if args.impls:
        chosen = args.impls.split(",")
        skipped.update({k: "not in --impls" for k in found if k not in chosen})
        found = {k: v for k, v in found.items() if k in chosen}
    matmul = matmul_tflops(dtype)
    print(f"{machine['gpu']}, torch {machine['torch']}, Triton {machine['triton']}; "
          f"{str(dtype).replace('torch.', '')} matmul {matmul:.0f} TFLOP/s (cold-l2, {MATMUL_N}^3)")
    print(f"torch._grouped_mm here: {grouped_mm_schema()}")
    print(f"implementations: {', '.join(found)}" + "".join(f"; {k} skipped: {v}" for k, v in skipped.items())
          + f"; Liger autotune {os.environ['LIGER_FUSED_MOE_AUTOTUNE']}")
    if not args.no_times:
        print("\n1. times (cold-l2; TFLOP/s in brackets: forward 6 T topk H I FLOPs, backward twice that), "
              "memory, first call (Triton compiling into an empty cache):")
        rows = time_models(models, tokens, found, skipped, dtype, machine, matmul, args, started, print)
        for row in rows:
            if row["impl"] == "liger":
                row["note"] = f"LIGER_FUSED_MOE_AUTOTUNE={os.environ['LIGER_FUSED_MOE_AUTOTUNE']}"
        write_csv(args.out / "h200_backward.csv", rows, FIELDS)
    if not args.no_grads:
        print("\n2. gradients against autograd through the float64 reference (relative error):")
        write_csv(args.out / "h200_backward_grads.csv", check_gradients(models, found, dtype, machine, print),
                  GRAD_FIELDS)
    if not args.no_tiles:
        shape, T = tile_case
        print(f"\n3. tiles of each GEMM of the step, {shape.name} at T = {T} (cold-l2, each alone):")
        tile_rows, table = sweep_tiles(shape, T, dtype, machine, started, args, print)
        write_csv(args.out / "h200_backward_tiles.csv", tile_rows, TILE_FIELDS)
        (args.out / "tuned_configs_training.json").write_text(json.dumps(table, indent=1) + "\n")
    print(f"\nwrote {args.out}/h200_backward*.csv in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
