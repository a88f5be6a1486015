"""Part 6 on two GPUs (two H200s, NVLink multicast off): correctness with NCCL, then timings.

Usage, from the repository root on a machine with two GPUs:

    python3 measurements/scripts/h200x2_ep.py --out "$OUT"

Three stages, each a fresh pair of processes (so that a crash in one loses nothing of the others),
each under its own deadline; the whole run stays under ``--budget-s`` (default 270 s):

1. the link: equal-split all-to-alls of 8 KiB ... 1 GiB per rank; then correctness in bf16 of the
   expert-parallel layer (experts halved across the two GPUs) and of the tensor-parallel layer
   against the single-GPU layer on the concatenation of both ranks' tokens, on Mixtral-8x7B and
   DeepSeek-V3 (uneven batches, a rank that receives nothing, a rank with no tokens; float64 once);
2. timings on Mixtral-8x7B at M = 1 ... 16384 tokens per rank: dispatch, experts, combine, the
   whole expert-parallel layer, an all-to-all of dispatch's bytes with the same counts, the
   tensor-parallel layer, and one GPU running both ranks' tokens;
3. the same on DeepSeek-V3.

Rank 0 appends every row to ``OUT/h200x2_ep.csv`` as soon as it is measured (columns in
``moe_tutorial.parallel.bench.FIELDS``; the timing protocol is in each row); at the end a short
table is printed. Copy the CSV to ``moe_tutorial/data/h200x2_ep.csv`` for notebook 06.
"""
import os

# Before torch or NCCL start anywhere (the ranks inherit the environment): no NVLink multicast
# (NVLS) and no symmetric memory on the lent machines.
os.environ.update({"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})

import argparse  # noqa: E402
import csv  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import moe_tutorial  # noqa: E402,F401,I001  (picks the runtime first)
from moe_tutorial.parallel import bench  # noqa: E402
from moe_tutorial.parallel.launch import launch  # noqa: E402

import torch  # noqa: E402

MODELS = ("Mixtral-8x7B", "DeepSeek-V3")


def run_stage(name: str, fn, args: tuple, deadline: float) -> None:
    """Launch one stage on two GPUs; report a failure and carry on with the next stage."""
    limit = deadline - time.time() + 30           # the ranks stop starting cases at the deadline
    if limit < 35:
        print(f"== {name}: skipped, out of time", flush=True)
        return
    print(f"== {name} (limit {limit:.0f} s)", flush=True)
    t0 = time.time()
    try:
        launch(fn, 2, *args, backend="nccl", timeout_s=limit, collective_timeout_s=60, echo=True,
               env=bench.env_for_ranks())
        print(f"== {name}: done in {time.time() - t0:.0f} s", flush=True)
    except Exception as exc:  # noqa: BLE001  (the next stage still runs; the CSV keeps what was measured)
        print(f"== {name}: FAILED after {time.time() - t0:.0f} s: {type(exc).__name__}: {exc}", flush=True)


def summary(path: Path) -> None:
    """Correctness per model, then per model and M: single GPU, EP and TP layers, EP's steps and the link."""
    if not path.exists():
        print("no results were written")
        return
    rows = list(csv.DictReader(open(path)))
    print("\ncorrectness (relative error against the single-GPU layer; fp64: against float64):")
    for r in rows:
        if r["step"].startswith("check"):
            rel = f"{float(r['rel_error']):.1e}" if r["rel_error"] else ""
            print(f"  {r['model']:14s} {r['case']:24s} {r['step']:14s} {rel:>9s} {r['status']}")
    link = [r for r in rows if r["step"] == "a2a_equal" and r["ms"]]
    if link:
        print("\nlink, equal-split all-to-all: " + ", ".join(
            f"{int(r['bytes']) / 2**20:.3g} MiB one way {float(r['ms']) * 1e3:.0f} us ({float(r['gbps']):.0f} GB/s)"
            for r in link))
    ms = {(r["model"], r["M"], r["step"]): r for r in rows if r["ms"] and r["status"] == "ok"}
    for model in MODELS:
        sizes = sorted({int(m) for (mod, m, _) in ms if mod == model})
        if not sizes:
            continue
        print(f"\n{model}: ms per call, M tokens per rank (one GPU runs 2M); speedup = single / EP layer")
        head = ["single", "ep_layer", "tp_layer", "dispatch", "experts", "combine", "a2a_same_bytes"]
        print(f"{'M':>6s} " + " ".join(f"{h:>14s}" for h in head)
              + f" {'speedup':>8s} {'disp GB/s':>9s} {'a2a GB/s':>9s}")
        for M in sizes:
            get = {s: ms.get((model, str(M), s)) for s in head[1:] + ["single_gpu"]}
            t = [get["single_gpu"]] + [get[s] for s in head[1:]]
            cells = " ".join(f"{float(r['ms']):14.4f}" if r else f"{'-':>14s}" for r in t)
            speed = f"{float(t[0]['ms']) / float(t[1]['ms']):8.2f}" if t[0] and t[1] else f"{'-':>8s}"
            gb = [f"{float(get[s]['gbps']):9.1f}" if get[s] and get[s]["gbps"] else f"{'-':>9s}"
                  for s in ("dispatch", "a2a_same_bytes")]
            print(f"{M:6d} {cells} {speed} {gb[0]} {gb[1]}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for h200x2_ep.csv (default $OUT)")
    parser.add_argument("--budget-s", type=float, default=270.0, help="the whole run's time budget")
    args = parser.parse_args(argv)
    if torch.cuda.device_count() < 2:
        sys.exit(f"needs 2 CUDA GPUs, found {torch.cuda.device_count()}")
    path = Path(args.out) / "h200x2_ep.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    start = time.time()
    budget = args.budget_s
    print(f"{torch.cuda.device_count()} x {torch.cuda.get_device_name()}, torch {torch.__version__}; "
          f"budget {budget:.0f} s; writing {path}", flush=True)
    # Shares of the budget: the link and correctness, then each model's timings.
    run_stage("link and correctness", bench.link_and_check_rank,
              (list(MODELS), str(path), start + 0.08 * budget, start + 0.30 * budget), start + 0.30 * budget)
    run_stage("timings, Mixtral-8x7B", bench.timing_rank, ("Mixtral-8x7B", str(path), start + 0.58 * budget),
              start + 0.58 * budget)
    run_stage("timings, DeepSeek-V3", bench.timing_rank, ("DeepSeek-V3", str(path), start + 0.88 * budget),
              start + 0.88 * budget)
    summary(path)
    print(f"\ntotal {time.time() - start:.0f} s; results in {path}")


if __name__ == "__main__":
    main()
