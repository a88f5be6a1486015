"""Where the first training step's seconds go: a profile of one fresh process's first forward +
backward of the layer, Triton's cache empty (the issue's "first call with the shipped table").

    python3 measurements/scripts/first_call_profile.py --model Mixtral-8x7B --tokens 4096 --out "$OUT"

Prints the first call's seconds, then the seconds spent in Triton's compiler (per kernel it
compiled), in building launchers, in ptxas and in the rest; writes the profile's top lines to
``first_call_profile.txt`` and a row to ``first_call.csv`` (:data:`FIELDS`) under ``--out``. By
default the layer compiles its kernels side by side before the step runs
(:mod:`moe_tutorial.kernels.precompile`; the profile, of the main thread only, then shows the wait
for the pool); ``--serial`` compiles each at its first launch. GPU only.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)
from moe_tutorial.kernels.trainable_layer import trainable_moe_layer
from moe_tutorial.perf import timing
from moe_tutorial.perf.results import read_csv, write_csv
from moe_tutorial.shapes import MODEL_SHAPES

import torch
from triton import knobs

sys.path.insert(0, str(Path(__file__).parent))
from h200_backward import PARAMS, device_problem, leaves  # noqa: E402

#: The columns of ``first_call.csv``: where, which model and T, how the kernels compiled ("side by
#: side" or "one by one"), whether torch's one-time import was taken out first, the seconds.
FIELDS = ["gpu", "driver", "torch", "triton", "date", "cpus", "model", "T", "compile", "warm_torch",
          "first_call_s", "second_ms", "kernels", "protocol"]
PROTOCOL = "a fresh process, Triton's cache empty; forward and backward given a gradient, then a sync"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="Mixtral-8x7B")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--warm-torch", action="store_true",
                    help="first a tiny backward with a gradient given (torch imports sympy there, once a process)")
    ap.add_argument("--serial", action="store_true", help="no side-by-side compile: each kernel at its launch")
    args = ap.parse_args(argv)
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="first_call_triton_")   # read at each compile
    p = device_problem(MODEL_SHAPES[args.model], args.tokens, torch.bfloat16, seed=2)
    timing.warm_up_gpu()
    if args.warm_torch:
        w = torch.ones(2, device="cuda", requires_grad=True)
        torch.autograd.grad(w * 2, [w], torch.ones_like(w))
    compiled = []
    knobs.runtime.jit_post_compile_hook = lambda *a, **k: compiled.append(k.get("repr", "?").split("[")[0])
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    lv = leaves(p)
    torch.autograd.grad(trainable_moe_layer(**lv, precompile=not args.serial), [lv[k] for k in PARAMS], p["d_out"])
    torch.cuda.synchronize()
    prof.disable()
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    lv = leaves(p)
    torch.autograd.grad(trainable_moe_layer(**lv), [lv[k] for k in PARAMS], p["d_out"])
    torch.cuda.synchronize()
    second = time.perf_counter() - t0
    stats = pstats.Stats(prof)
    by_name = {}
    for (file, _, fn), (_, calls, _, cum, _) in stats.stats.items():
        totals = by_name.setdefault(f"{Path(file).parent.name}/{Path(file).name}:{fn}", [0, 0.0])
        totals[0] += calls
        totals[1] += cum
    tag = ("_warm_torch" if args.warm_torch else "") + ("_serial" if args.serial else "")
    print(f"{args.model} T={args.tokens}{tag}: first call {first:.2f} s, second {second * 1e3:.1f} ms; "
          f"{len(compiled)} kernels compiled")
    print("  compiled:", ", ".join(compiled))
    for key in ("compiler/compiler.py:compile", "runtime/build.py:compile_module_from_src",
                "runtime/build.py:_build", "nvidia/compiler.py:make_cubin", "nvidia/compiler.py:make_ptx",
                "nvidia/compiler.py:make_llir", "nvidia/compiler.py:make_ttgir", "nvidia/compiler.py:make_ttir",
                "nvidia/driver.py:__init__", "nvidia/driver.py:make_launcher", "subprocess.py:run",
                "compiler/compiler.py:_init_handles"):
        calls, cum = by_name.get(key, (0, 0.0))
        print(f"  {key:45s} {calls:4d} calls {cum:7.2f} s")
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(60)
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
    args.out.mkdir(parents=True, exist_ok=True)
    csv_path = args.out / "first_call.csv"
    rows = read_csv(csv_path) if csv_path.exists() else []
    rows.append({**timing.machine_info(), "cpus": os.cpu_count(), "model": args.model, "T": args.tokens,
                 "compile": "one by one" if args.serial else "side by side", "warm_torch": args.warm_torch,
                 "first_call_s": round(first, 3), "second_ms": round(second * 1e3, 2), "kernels": len(compiled),
                 "protocol": PROTOCOL})
    write_csv(csv_path, rows, FIELDS)
    (args.out / f"first_call_profile_{args.model}_{args.tokens}{tag}.txt").write_text(buf.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
