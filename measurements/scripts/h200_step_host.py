"""Where a short training step's time goes: host (Python and launches) or GPU.

``h200_backward.py`` times the step with events around autograd (no graph), so at T = 4096 a step
can be slower than its graphed forward plus its backward. This script splits one step of each
implementation into the host's time to enqueue the forward, to enqueue the backward, and the wall
time to the last kernel; times the step under cold-l2 (events, no graph) with the training
configurations cached, with the cache cleared before each step (the tables looked up as before
the cache) and without the expert-id range check (a pinned copy, read after the forward's
kernels are queued); and profiles a quarter of the split's steps of ours (torch.profiler: the CPU
ops by self time, the host syncs, the GPU's busy time; cProfile: the Python side). Run on a GPU
from the repository root:

    python measurements/scripts/h200_step_host.py --out OUT      # CSV in OUT/h200_step_host.csv
    python measurements/scripts/h200_step_host.py --dry-run --out OUT   # a toy in the interpreter

(written after a session's device time was spent; its dry run is tested, the GPU run not made yet).
"""
from __future__ import annotations

import argparse
import cProfile
import importlib.util
import pstats
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import moe_tutorial  # noqa: F401,E402,I001  (first: picks the runtime)
from moe_tutorial import runtime  # noqa: E402
from moe_tutorial.kernels import trainable_layer  # noqa: E402
from moe_tutorial.kernels import training_configs as tc  # noqa: E402
from moe_tutorial.perf import timing  # noqa: E402
from moe_tutorial.perf.results import write_csv  # noqa: E402
from moe_tutorial.shapes import MODEL_SHAPES  # noqa: E402

import torch  # noqa: E402

BACKWARD_SCRIPT = Path(__file__).with_name("h200_backward.py")
spec = importlib.util.spec_from_file_location("h200_backward", BACKWARD_SCRIPT)
hb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hb)


def sync() -> None:
    if runtime.ON_GPU:
        torch.cuda.synchronize()


def host_split(forward, params, d_out, repeats: int) -> dict:
    """Median ms: the host's enqueue of the forward, of the backward, and the wall to the end."""
    fwd, bwd, wall = [], [], []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        out = forward()
        t1 = time.perf_counter()
        torch.autograd.grad(out, params, d_out, allow_unused=True)
        t2 = time.perf_counter()
        sync()
        t3 = time.perf_counter()
        fwd.append(t1 - t0), bwd.append(t2 - t1), wall.append(t3 - t0)
    return {k: 1e3 * statistics.median(v) for k, v in (("host_forward_ms", fwd), ("host_backward_ms", bwd),
                                                         ("wall_ms", wall))}


def profile(step, steps: int) -> dict:
    """torch.profiler over ``steps`` steps: syncs seen, GPU busy ms per step, the top CPU ops."""
    from torch.profiler import ProfilerActivity
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if runtime.ON_GPU else [])
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        sync()
    avg = prof.key_averages()
    syncs = {e.key: e.count // steps for e in avg
             if "Synchronize" in e.key or e.key in ("aten::_local_scalar_dense", "aten::item", "cudaMemcpyAsync")}
    busy = sum(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) for e in avg
               if str(getattr(e, "device_type", "")).endswith("CUDA")) / steps / 1e3
    launches = sum(e.count for e in avg if e.key in ("cuLaunchKernel", "cudaLaunchKernel", "cuLaunchKernelEx",
                                                     "cudaLaunchKernelExC")) // steps
    print(avg.table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=48))
    # The Python side, which torch.profiler does not see (Triton's launcher, the checks, the wrappers).
    py = cProfile.Profile()
    py.enable()
    for _ in range(steps):
        step()
    py.disable()
    sync()
    print(f"cProfile over {steps} steps, by own time:")
    pstats.Stats(py, stream=sys.stdout).sort_stats("tottime").print_stats(30)
    return {"syncs_per_step": "; ".join(f"{k} x{v}" for k, v in syncs.items()) or "none",
            "gpu_busy_ms": busy, "launches_per_step": launches}


def measure(model: str, T: int, name: str, fn, p: dict, repeats: int) -> dict:
    """One implementation's row: the host split, the step cached and (ours) uncached, the profile
    (``repeats`` steps for the split, a quarter of them profiled)."""
    lv = hb.leaves(p)
    params = [lv[k] for k in hb.PARAMS]

    def fwd():
        return fn(**lv)

    def one_step():
        return torch.autograd.grad(fwd(), params, p["d_out"], allow_unused=True)

    def uncached():
        tc._chosen.cache_clear()
        return one_step()

    def unchecked():
        # The layer's expert-id range check (its pinned copy, read after the forward) left out: what it costs.
        saved, trainable_layer.start_ids_check = trainable_layer.start_ids_check, lambda topk_ids, E: None
        try:
            return one_step()
        finally:
            trainable_layer.start_ids_check = saved
    for _ in range(min(3, repeats)):
        one_step()
    row = {**timing.machine_info(), "model": model, "T": T, "impl": name,
           **host_split(fwd, params, p["d_out"], repeats)}
    timer = "events, autograd (no graph)"
    row["step_ms"], row["timer"] = timing.measure_ms(one_step, protocol="cold-l2", graphable=False,
                                                     no_graph_timer=timer)
    text = ""
    if name == "ours":
        row["step_uncached_ms"], _ = timing.measure_ms(uncached, protocol="cold-l2", graphable=False,
                                                       no_graph_timer=timer)
        row["step_unchecked_ms"], _ = timing.measure_ms(unchecked, protocol="cold-l2", graphable=False,
                                                        no_graph_timer=timer)
        steps = max(1, repeats // 4)
        print(f"--- {model} T={T} ours: torch.profiler over {steps} steps")
        row.update(profile(one_step, steps))
        text = (f"  uncached {row['step_uncached_ms']:.2f} ms  no id check {row['step_unchecked_ms']:.2f} ms"
                f"  GPU busy {row['gpu_busy_ms']:.2f} ms  launches {row['launches_per_step']}"
                f"  syncs {row['syncs_per_step']}")
    print(f"{model:14s} {name:10s} host fwd {row['host_forward_ms']:.2f} ms  host bwd "
          f"{row['host_backward_ms']:.2f} ms  wall {row['wall_ms']:.2f} ms  step ({row['timer']}) "
          f"{row['step_ms']:.2f} ms" + text, flush=True)
    return row


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="Qwen3-30B-A3B,DeepSeek-V3,Mixtral-8x7B")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=20, help="steps for the host split (default 20)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dry-run", action="store_true", help="a toy shape in the interpreter (no GPU needed)")
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if hb.refused_without_gpu(args.dry_run):
        return 2
    if args.dry_run:
        cases, dtype, repeats = [(hb.DRY_SHAPE, hb.DRY_TOKENS[-1])], torch.float32, min(args.repeats, 2)
    else:
        cases = [(MODEL_SHAPES[m], args.tokens) for m in args.models.split(",")]
        dtype, repeats = torch.bfloat16, args.repeats
    found, skipped = hb.available_impls(args.dry_run)
    names = [n for n in ("ours", "grouped_mm") if n in found]
    print(f"implementations: {', '.join(names)}" + "".join(f"; {k} skipped: {v}" for k, v in skipped.items()))
    rows = []
    for shape, T in cases:
        p = hb.device_problem(shape, T, dtype, seed=2)
        for name in names:
            rows.append(measure(shape.name, T, name, found[name], p, repeats))
        del p
        hb.free()
    fields = list(dict.fromkeys(k for r in rows for k in r))
    write_csv(args.out / "h200_step_host.csv", rows, fields)
    print(f"wrote {args.out}/h200_step_host.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
