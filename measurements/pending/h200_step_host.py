"""Where a short training step's time goes: host (Python and launches) or GPU.

``h200_backward.py`` times the step with events around autograd (no graph), so at T = 4096 a step
can be slower than its graphed forward plus its backward. This script splits one step of each
implementation into the host's time to enqueue the forward, to enqueue the backward, and the wall
time to the last kernel; times the step under cold-l2 (events, no graph) with the training
configurations cached, and with the cache cleared before each step (the lookup of the tables as
before the cache); and profiles five steps of ours (torch.profiler: the CPU ops by self time,
the host syncs, the GPU's busy time). Run on a GPU from the repository root (written after the
last GPU session's time was spent: not run yet, kept here until it has):

    python measurements/pending/h200_step_host.py --out OUT      # CSV in OUT/h200_step_host.csv
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import moe_tutorial  # noqa: F401,E402,I001  (first: picks the runtime)
from moe_tutorial import runtime  # noqa: E402
from moe_tutorial.kernels import training_configs as tc  # noqa: E402
from moe_tutorial.perf import impls, timing  # noqa: E402
from moe_tutorial.perf.results import write_csv  # noqa: E402
from moe_tutorial.shapes import MODEL_SHAPES  # noqa: E402

import torch  # noqa: E402

BACKWARD_SCRIPT = Path(__file__).parents[1] / "scripts" / "h200_backward.py"
spec = importlib.util.spec_from_file_location("h200_backward", BACKWARD_SCRIPT)
hb = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hb)


def host_split(forward, params, d_out, repeats: int = 20) -> dict:
    """Median ms: the host's enqueue of the forward, of the backward, and the wall to the end."""
    fwd, bwd, wall = [], [], []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = forward()
        t1 = time.perf_counter()
        torch.autograd.grad(out, params, d_out, allow_unused=True)
        t2 = time.perf_counter()
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        fwd.append(t1 - t0), bwd.append(t2 - t1), wall.append(t3 - t0)
    return {k: 1e3 * statistics.median(v) for k, v in (("host_forward_ms", fwd), ("host_backward_ms", bwd),
                                                         ("wall_ms", wall))}


def profile(step, steps: int = 5) -> dict:
    """torch.profiler over ``steps`` steps: syncs seen, GPU busy ms per step, the top CPU ops."""
    from torch.profiler import ProfilerActivity
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    avg = prof.key_averages()
    syncs = {e.key: e.count // steps for e in avg
             if "Synchronize" in e.key or e.key in ("aten::_local_scalar_dense", "aten::item", "cudaMemcpyAsync")}
    busy = sum(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)) for e in avg
               if str(getattr(e, "device_type", "")).endswith("CUDA")) / steps / 1e3
    launches = sum(e.count for e in avg if e.key in ("cuLaunchKernel", "cudaLaunchKernel", "cuLaunchKernelEx",
                                                     "cudaLaunchKernelExC")) // steps
    print(avg.table(sort_by="self_cpu_time_total", row_limit=18, max_name_column_width=48))
    return {"syncs_per_step": "; ".join(f"{k} x{v}" for k, v in syncs.items()) or "none",
            "gpu_busy_ms": busy, "launches_per_step": launches}


def measure(model: str, T: int, name: str, fn, p: dict) -> dict:
    """One implementation's row: the host split, the step cached and (ours) uncached, the profile."""
    lv = hb.leaves(p)
    params = [lv[k] for k in hb.PARAMS]

    def fwd():
        return fn(**lv)

    def one_step():
        return torch.autograd.grad(fwd(), params, p["d_out"], allow_unused=True)

    def uncached():
        tc._chosen.cache_clear()
        return one_step()
    for _ in range(3):
        one_step()
    row = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "model": model, "T": T,
           "impl": name, **host_split(fwd, params, p["d_out"])}
    timer = "events, autograd (no graph)"
    row["step_ms"], _ = timing.measure_ms(one_step, protocol="cold-l2", graphable=False, no_graph_timer=timer)
    text = ""
    if name == "ours":
        row["step_uncached_ms"], _ = timing.measure_ms(uncached, protocol="cold-l2", graphable=False,
                                                       no_graph_timer=timer)
        print(f"--- {model} T={T} ours: torch.profiler over five steps")
        row.update(profile(one_step))
        text = (f"  uncached {row['step_uncached_ms']:.2f} ms  GPU busy {row['gpu_busy_ms']:.2f} ms  launches "
                f"{row['launches_per_step']}  syncs {row['syncs_per_step']}")
    print(f"{model:14s} {name:10s} host fwd {row['host_forward_ms']:.2f} ms  host bwd "
          f"{row['host_backward_ms']:.2f} ms  wall {row['wall_ms']:.2f} ms  step (cold-l2) {row['step_ms']:.2f} ms"
          + text, flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="Qwen3-30B-A3B,DeepSeek-V3,Mixtral-8x7B")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    assert runtime.ON_GPU, "a GPU run"
    rows = []
    for model in args.models.split(","):
        p = hb.device_problem(MODEL_SHAPES[model], args.tokens, torch.bfloat16, seed=2)
        for name, fn in (("ours", hb.ours), ("grouped_mm", impls.grouped_mm_layer)):
            rows.append(measure(model, args.tokens, name, fn, p))
        del p
        hb.free()
    args.out.mkdir(parents=True, exist_ok=True)
    fields = list(dict.fromkeys(k for r in rows for k in r))
    write_csv(args.out / "h200_step_host.csv", rows, fields)


if __name__ == "__main__":
    main()
