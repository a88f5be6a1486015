"""Part 6's two exchanges on N H200s (N = 1 or 2, NVLink multicast off): graph replay, then timings.

Usage, from the repository root:

    python3 measurements/scripts/h200_ep_graphs.py --gpus 1 --out "$OUT"                 # one GPU, ~4 min
    python3 measurements/scripts/h200_ep_graphs.py --gpus 2 --out "$OUT" --budget-s 500  # two GPUs

Stages, each a fresh group of N processes (a crash in one loses nothing of the others), each
under its own deadline, the whole run under ``--budget-s``:

1. correctness under graph replay: the fixed-capacity expert-parallel layer captured once in a
   CUDA graph (NCCL collectives inside; with one GPU a one-rank NCCL group), replayed with five
   routings (a rank that receives nothing, an expert with no token, uneven M), each against
   Part 4's layer on all tokens, on small Mixtral- and DeepSeek-V3-like shapes;
2. timings on Mixtral-8x7B at M = 1 ... 16384 tokens per rank
   (:mod:`moe_tutorial.parallel.exchange_bench`): dispatch, experts, combine, dispatch + combine
   and the layer for the host-synchronised all-to-all and for the fixed-capacity all-gather, two
   ``all_to_all_single`` of the same bytes for each, the TP layer, one GPU's layer, and a replay
   check at the real shape;
3. the same on DeepSeek-V3 (all 256 experts; halved across two GPUs).

Rank 0 appends every row to ``OUT/h200x{N}_ep_graphs.csv`` as soon as it is measured (the
protocol in each row); at the end a table per model is printed. With two GPUs, copy the CSV to
``moe_tutorial/data/h200x2_ep_graphs.csv`` for notebook 06.
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
from moe_tutorial.parallel import bench, exchange_bench, graphs  # noqa: E402
from moe_tutorial.parallel.launch import launch  # noqa: E402
from moe_tutorial.shapes import BATCH_SIZES, ModelShape  # noqa: E402

import torch  # noqa: E402

MODELS = ("Mixtral-8x7B", "DeepSeek-V3")
SMALL = (ModelShape("small Mixtral-like", 8, 2, 1024, 2048), ModelShape("small DeepSeek-V3-like", 256, 8, 512, 256))


#: The ranks' backend (the CPU test of this script sets "gloo").
BACKEND = "nccl"


def run_stage(name: str, fn, world: int, args: tuple, deadline: float):
    """Launch one stage on ``world`` GPUs; report a failure and carry on with the next stage."""
    limit = deadline - time.time() + 30           # the ranks stop starting cases at the deadline
    if limit < 35:
        print(f"== {name}: skipped, out of time", flush=True)
        return None
    print(f"== {name} (limit {limit:.0f} s)", flush=True)
    t0 = time.time()
    try:
        # The timings' barriers run over a gloo group: all ranks are on this host, so loopback.
        env = {**bench.env_for_ranks(), "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
        out = launch(fn, world, *args, backend=BACKEND, timeout_s=limit, collective_timeout_s=60, echo=True, env=env)
        print(f"== {name}: done in {time.time() - t0:.0f} s", flush=True)
        return out
    except Exception as exc:  # noqa: BLE001  (the next stage still runs; the CSV keeps what was measured)
        print(f"== {name}: FAILED after {time.time() - t0:.0f} s: {type(exc).__name__}: {exc}", flush=True)
        return None


def replay_stage(world: int, path: Path, deadline: float, shapes=SMALL, dtype_name: str = "bfloat16") -> None:
    """Stage 1, all ``shapes`` in one launch; the replays' errors go to the CSV as check rows."""
    tokens = [37] if world == 1 else [37] + [20] * (world - 1)
    out = run_stage("graph replay, small shapes", graphs.graph_replay_shapes_rank, world,
                    (list(shapes), tokens, dtype_name), deadline)
    machine = bench.machine_columns(world, protocol="")      # each row names its own protocol
    by_name = {s.name: s for s in shapes}
    for by_rank in out or []:
        for r in by_rank:
            s = by_name[r["model"]]
            common = {**machine, "model": s.name, "E": s.num_experts, "K": s.hidden, "I": s.intermediate,
                      "topk": s.topk, "dtype": dtype_name, "method": "all_gather",
                      "protocol": "captured once, replayed with each routing; eager layers beside"}
            for kind in ("graph", "all_gather", "all_to_all"):
                err = r[f"rel_error_{kind}"]
                ok = err <= r["tol"] and (r["graphed"] or not torch.cuda.is_available())
                bench.append_row(path, {**common, "M": r["M"], "capacity": r["capacity"],
                                        "step": f"check_{kind}: {r['case']} (rank {r['rank']})", "rel_error": err,
                                        "status": "ok" if ok else "wrong"}, exchange_bench.FIELDS)


def summary(path: Path) -> None:
    """Checks, then per model and M: the two exchanges against two all-to-alls, and the layers."""
    if not path.exists():
        print("no results were written")
        return
    rows = list(csv.DictReader(open(path)))
    checks = [r for r in rows if r["step"].startswith("check")]
    print(f"\ncorrectness: {sum(r['status'] == 'ok' for r in checks)} of {len(checks)} checks ok")
    for r in checks:
        if r["status"] != "ok":
            print(f"  NOT OK: {r['model']} M={r['M']} {r['step']} {r['rel_error']} {r['status']}")
    failed = [r for r in rows if r["status"].startswith("error")]
    for r in failed:
        print(f"  ERROR: {r['model']} M={r['M']} {r['method']} {r['step']}: {r['status']}")
    graphed = {(r["method"], r["step"]) for r in rows if r["protocol"].startswith("cuda graph")}
    print(f"captured in a CUDA graph: {sorted(graphed)}")
    ms = {(r["model"], r["M"], r["method"], r["step"]): float(r["ms"]) for r in rows if r["ms"] and r["status"] == "ok"}
    cols = [("all_to_all", "dispatch", "old disp"), ("all_gather", "dispatch", "new disp"),
            ("all_to_all", "dispatch_combine", "old d+c"), ("all_to_all", "a2a_x2_same_bytes", "old 2a2a"),
            ("all_gather", "dispatch_combine", "new d+c"), ("all_gather", "a2a_x2_same_bytes", "new 2a2a"),
            ("all_to_all", "ep_layer", "EP old"), ("all_gather", "ep_layer", "EP new"), ("", "tp_layer", "TP"),
            ("", "single_gpu", "1 GPU")]
    for model in MODELS:
        sizes = sorted({int(m) for (mod, m, _, _) in ms if mod == model})
        if not sizes:
            continue
        print(f"\n{model}: ms per call, M tokens per rank (one GPU runs world * M); "
              "new d+c / 2a2a = the exchange over two all-to-alls of its bytes")
        print(f"{'M':>6s} " + " ".join(f"{c[2]:>9s}" for c in cols) + f" {'new/2a2a':>9s} {'1GPU/EPnew':>10s}")
        for M in sizes:
            get = [ms.get((model, str(M), m, s)) for m, s, _ in cols]
            cells = " ".join(f"{v:9.4f}" if v is not None else f"{'-':>9s}" for v in get)
            ratio = f"{get[4] / get[5]:9.2f}" if get[4] and get[5] else f"{'-':>9s}"
            speed = f"{get[9] / get[7]:10.2f}" if get[9] and get[7] else f"{'-':>10s}"
            print(f"{M:6d} {cells} {ratio} {speed}")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=None, help="ranks, one GPU each (default: every visible GPU, "
                        "at most 2)")
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for the CSV (default $OUT)")
    parser.add_argument("--budget-s", type=float, default=230.0, help="the whole run's time budget")
    parser.add_argument("--sizes", default=",".join(str(m) for m in BATCH_SIZES),
                        help="tokens per rank to time, comma-separated (default %(default)s)")
    args = parser.parse_args(argv)
    world = args.gpus or min(2, torch.cuda.device_count())
    if world < 1 or torch.cuda.device_count() < world:
        sys.exit(f"needs {max(world, 1)} CUDA GPU(s), found {torch.cuda.device_count()}")
    path = Path(args.out) / f"h200x{world}_ep_graphs.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    start, budget = time.time(), args.budget_s
    print(f"{world} x {torch.cuda.get_device_name()}, torch {torch.__version__}; budget {budget:.0f} s; "
          f"writing {path}", flush=True)
    sizes = tuple(int(m) for m in args.sizes.split(","))
    replay_stage(world, path, start + 0.25 * budget)
    for model, share in zip(MODELS, (0.6, 0.95)):
        run_stage(f"timings, {model}", exchange_bench.timing_rank, world,
                  (model, str(path), start + share * budget, sizes), start + share * budget)
    summary(path)
    print(f"\ntotal {time.time() - start:.0f} s; results in {path}")


if __name__ == "__main__":
    main()
