"""Why does Part 3's kernel stop near 10 TFLOP/s on an H200? Experiments that isolate the cause.

The bench shows Part 3's fused kernel flat at about 10 TFLOP/s from M = 256 on (Mixtral-8x7B,
Qwen3-30B-A3B; 6.6 on DeepSeek-V3). Two explanations have been offered: the weights' bytes
(HBM, or the L2 cache that serves the repeats) and the instructions of ``tl.sum`` on the ordinary
cores. Each experiment below changes one thing (see :mod:`moe_tutorial.experiments.part3_cap`):

  dtype    bf16 vs fp32 weights and x, same tile, same routing (Mixtral-8x7B, Qwen3-30B-A3B, M = 1024)
  routing  uniform vs every token on the same topk experts (the three models, M = 1024, bf16)
  tile     three other BLOCK_N x BLOCK_K x warps (Mixtral-8x7B, M = 1024, bf16)
  decode   M = 1, for scale: a DRAM-bound launch (Mixtral-8x7B, bf16)
  ncu      Nsight Compute on one launch per dtype (Mixtral-8x7B, M = 256), when ``ncu`` is on PATH

Usage, on one GPU (about 2 minutes on an H200; torch and Triton as in the bench), from the
repository root:

    python measurements/scripts/h200_part3_cap.py --out "$OUT"            # experiments + Nsight Compute
    python measurements/scripts/h200_part3_cap.py --out "$OUT" --no-ncu   # experiments only

It prints a table and the verdict, and writes ``$OUT/h200_part3_cap.csv`` (commit it as
``moe_tutorial/data/h200_part3_cap.csv``; notebook 03 reads it) and, with Nsight Compute,
``$OUT/part3_cap_ncu_<dtype>.ncu-rep`` and ``$OUT/part3_cap_ncu_<dtype>_raw.csv`` (every metric).
Each Nsight Compute run is this script in ``--ncu-child`` mode under
``ncu --clock-control none --kernel-name regex:fused_moe_kernel --launch-skip 2 --launch-count 1
--section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis
--section WarpStateStats --section Occupancy --section LaunchStats --section InstructionStats``
(clocks left free, as in the bench). Without a GPU, ``--dry-run`` runs the same code on a toy
shape in Triton's interpreter (its timings mean nothing), so the script can be tested anywhere.
"""
from __future__ import annotations

import argparse
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:            # run from anywhere without installing the package
    sys.path.insert(0, str(REPO))

import moe_tutorial  # noqa: E402,F401,I001  (first: picks the runtime before triton is imported)
from moe_tutorial import runtime  # noqa: E402
from moe_tutorial.experiments import part3_cap  # noqa: E402
from moe_tutorial.kernels.fused_kernel import default_blocks, fused_moe_kernel  # noqa: E402
from moe_tutorial.perf.timing import machine_info, measure_ms  # noqa: E402
from moe_tutorial.reference import reference_moe_matmul, rel_error  # noqa: E402
from moe_tutorial.shapes import ModelShape, get_shape, random_topk_ids  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402

MIXTRAL, QWEN3, DSV3 = "Mixtral-8x7B", "Qwen3-30B-A3B", "DeepSeek-V3"
#: Tokens of the experiments: on the flat part of Part 3's curve in the bench (M >= 256).
M_CAP = 1024
#: Tokens of the Nsight Compute launches: on the flat part too, and a quick launch to replay.
M_NCU = 256
NCU_SECTIONS = ("SpeedOfLight", "MemoryWorkloadAnalysis", "ComputeWorkloadAnalysis", "WarpStateStats",
                "Occupancy", "LaunchStats", "InstructionStats")
#: A toy shape for --dry-run (interpreter): small enough for a few seconds per case.
TOY = ModelShape("toy", 8, 2, 64, 32)


@dataclass(frozen=True)
class Case:
    """One timed launch: what it measures (experiment, variant) and everything that defines it."""

    experiment: str
    variant: str
    model: str
    M: int
    dtype: torch.dtype
    routing: str = "uniform"             # "uniform" or "same experts"
    block_n: int | None = None           # None: the launcher's default for this shape
    block_k: int | None = None
    num_warps: int = 4                   # Triton's default, what the launcher gets


def cases(dry_run: bool) -> list[Case]:
    """The experiments, grouped by (model, dtype) so that one set of weights serves each group."""
    bf16, fp32 = torch.bfloat16, torch.float32
    if dry_run:
        f = torch.float32
        return [Case("dtype", "float32", "toy", 4, f), Case("routing", "same experts", "toy", 4, f, "same experts"),
                Case("tile", "8x16, 2 warps", "toy", 4, f, block_n=8, block_k=16, num_warps=2)]
    out = []
    for model in (MIXTRAL, QWEN3):
        out.append(Case("dtype", "bfloat16", model, M_CAP, bf16))
        out.append(Case("routing", "uniform", model, M_CAP, bf16))
        out.append(Case("routing", "same experts", model, M_CAP, bf16, "same experts"))
        if model == MIXTRAL:
            out += [Case("tile", f"{bn}x{bk}, {w} warps", model, M_CAP, bf16, block_n=bn, block_k=bk, num_warps=w)
                    for bn, bk, w in ((128, 64, 4), (64, 64, 4), (128, 32, 8))]
            out.append(Case("decode", "M = 1", model, 1, bf16))
        out.append(Case("dtype", "float32", model, M_CAP, fp32))
    out.append(Case("routing", "uniform", DSV3, M_CAP, bf16))
    out.append(Case("routing", "same experts", DSV3, M_CAP, bf16, "same experts"))
    return out


def shape_of(model: str) -> ModelShape:
    return TOY if model == "toy" else get_shape(model)


def make_weight(shape: ModelShape, dtype: torch.dtype) -> torch.Tensor:
    """Random ``[E, N, K]`` weights of the first GEMM on the device, scaled for O(1) outputs."""
    N, K = shape.first_gemm
    g = torch.Generator(device=runtime.DEVICE).manual_seed(0)
    w = torch.empty(shape.num_experts, N, K, device=runtime.DEVICE, dtype=dtype)
    return w.normal_(generator=g).mul_(K ** -0.5)


def make_ids(shape: ModelShape, M: int, routing: str) -> torch.Tensor:
    """``[M, topk]`` int32 ids: uniform (distinct random experts per token) or the same ``0 .. topk-1`` for all."""
    if routing == "same experts":
        return torch.arange(shape.topk, dtype=torch.int32, device=runtime.DEVICE).repeat(M, 1)
    return random_topk_ids(M, shape.num_experts, shape.topk, generator=torch.Generator().manual_seed(M),
                           device=runtime.DEVICE)


def launch(x, weight, ids, out, block_n: int, block_k: int, num_warps: int):
    """Part 3's kernel launched as ``fused_moe_matmul`` launches it, plus a choice of warps per program."""
    M, K = x.shape
    N = weight.shape[1]
    topk = ids.shape[1]
    fused_moe_kernel[(M, triton.cdiv(N, block_n))](
        x, weight, ids, out, N, K, topk,
        x.stride(0), x.stride(1), *weight.stride(), *ids.stride(), *out.stride(),
        BLOCK_N=block_n, BLOCK_K=block_k, TOPK_PAD=triton.next_power_of_2(topk), num_warps=num_warps)
    return out


def loaded_bytes(M: int, N: int, K: int, topk: int, block_n: int, itemsize: int) -> float:
    """What the programs load and store: every pair's [N, K] weights, x once per program, ids, out."""
    programs = M * math.ceil(N / block_n)
    return itemsize * (M * topk * N * K + programs * K + M * topk * N) + 4 * programs * topk


def run_case(case: Case, weight: torch.Tensor, common: dict, max_seconds: float) -> dict:
    shape = shape_of(case.model)
    N, K = shape.first_gemm
    dn, dk = default_blocks(shape.topk, N, K)
    bn, bk = case.block_n or dn, case.block_k or dk
    x = torch.randn(case.M, K, generator=torch.Generator(device=runtime.DEVICE).manual_seed(1),
                    device=runtime.DEVICE, dtype=case.dtype)
    ids = make_ids(shape, case.M, case.routing)
    out = torch.full((case.M, shape.topk, N), float("nan"), device=runtime.DEVICE, dtype=case.dtype)
    row = {**common, "experiment": case.experiment, "variant": case.variant, "model": case.model,
           "E": shape.num_experts, "N": N, "K": K, "topk": shape.topk, "M": case.M,
           "dtype": str(case.dtype).replace("torch.", ""), "routing": case.routing,
           "block_n": bn, "block_k": bk, "num_warps": case.num_warps}
    try:
        launch(x, weight, ids, out, bn, bk, case.num_warps)        # compiles
        rows = torch.tensor([0, case.M - 1], device=runtime.DEVICE).unique()
        err = rel_error(out[rows], reference_moe_matmul(x[rows], weight, ids[rows]))
        ms, how = measure_ms(lambda: launch(x, weight, ids, out, bn, bk, case.num_warps), max_seconds=max_seconds)
    except Exception as e:  # noqa: BLE001  (one failing case must not end the run)
        return {**row, "note": f"error: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"}
    flops = 2.0 * case.M * shape.topk * N * K
    nbytes = loaded_bytes(case.M, N, K, shape.topk, bn, weight.element_size())
    tol = 1e-2 if case.dtype in (torch.bfloat16, torch.float16) else 1e-4
    note = f"timer: {how}" + ("" if err <= tol else f"; WRONG: relative error {err:.2e} > {tol}")
    return {**row, "ms": ms, "tflops": flops / ms / 1e9, "loaded_tbps": nbytes / ms / 1e9, "rel_error": err,
            "note": note}


def run_experiments(dry_run: bool, max_seconds: float, path: Path, log=print) -> list[dict]:
    """Every case of :func:`cases`; the rows so far are rewritten to ``path`` after each one."""
    common = machine_info()
    rows: list[dict] = []
    weight, weight_key = None, None
    for case in cases(dry_run):
        key = (case.model, case.dtype)
        if key != weight_key:
            weight = None
            if runtime.ON_GPU:
                torch.cuda.empty_cache()
            weight, weight_key = make_weight(shape_of(case.model), case.dtype), key
        t0 = time.perf_counter()
        row = run_case(case, weight, common, max_seconds)
        rows.append(row)
        part3_cap.write(path, rows)
        shown = f"{row['tflops']:6.2f} TFLOP/s  {row['loaded_tbps']:6.2f} TB/s" if row.get("tflops") else row["note"]
        log(f"  {case.experiment:8s} {case.variant:16s} {case.model:14s} M={case.M:<5d} {shown}  "
            f"({time.perf_counter() - t0:.1f} s)")
    return rows


# --------------------------------------------------------------------------------------
# Nsight Compute

def ncu_child(dtype_name: str) -> None:
    """What ``ncu`` profiles: three launches of Mixtral-8x7B at M_NCU (the third is measured)."""
    dtype = getattr(torch, dtype_name)
    shape = get_shape(MIXTRAL)
    N, K = shape.first_gemm
    bn, bk = default_blocks(shape.topk, N, K)
    weight = make_weight(shape, dtype)
    x = torch.randn(M_NCU, K, device=runtime.DEVICE, dtype=dtype)
    ids = make_ids(shape, M_NCU, "uniform")
    out = torch.empty(M_NCU, shape.topk, N, device=runtime.DEVICE, dtype=dtype)
    for _ in range(3):
        launch(x, weight, ids, out, bn, bk, 4)
    torch.cuda.synchronize()


def ncu_binary() -> str | None:
    return shutil.which("ncu") or next((p for p in ("/usr/local/cuda/bin/ncu",) if os.path.exists(p)), None)


def parse_raw_csv(text: str) -> dict[str, float]:
    """``{metric name: value}`` of the one kernel in ``ncu --csv --page raw`` output (header, units, values)."""
    import csv
    import io

    lines = [line for line in text.splitlines() if line.startswith('"')]
    table = list(csv.reader(io.StringIO("\n".join(lines))))
    if len(table) < 3:
        return {}
    header, values = table[0], table[-1]
    out = {}
    for name, value in zip(header, values):
        try:
            out[name] = float(value.replace(",", ""))
        except ValueError:
            continue
    return out


def run_ncu(dtype_name: str, out_dir: Path, common: dict, log=print) -> list[dict]:
    """Profile one launch under Nsight Compute; rows of :data:`moe_tutorial.experiments.part3_cap.NCU_METRICS`."""
    shape = get_shape(MIXTRAL)
    N, K = shape.first_gemm
    bn, bk = default_blocks(shape.topk, N, K)
    base = {**common, "experiment": "ncu", "variant": dtype_name, "model": MIXTRAL, "E": shape.num_experts,
            "N": N, "K": K, "topk": shape.topk, "M": M_NCU, "dtype": dtype_name, "routing": "uniform",
            "block_n": bn, "block_k": bk, "num_warps": 4}
    ncu = ncu_binary()
    if ncu is None:
        return [{**base, "note": "ncu: not found on PATH"}]
    report = out_dir / f"part3_cap_ncu_{dtype_name}"
    cmd = [ncu, "--clock-control", "none", "--kernel-name", "regex:fused_moe_kernel",
           "--launch-skip", "2", "--launch-count", "1"]
    for section in NCU_SECTIONS:
        cmd += ["--section", section]
    cmd += ["--force-overwrite", "--export", str(report), sys.executable, str(Path(__file__).resolve()),
            "--ncu-child", dtype_name]
    log("  " + " ".join(cmd))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    except subprocess.TimeoutExpired:
        return [{**base, "note": "ncu: timed out after 240 s"}]
    rep = report.with_suffix(".ncu-rep")
    if proc.returncode != 0 or not rep.exists():
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
        return [{**base, "note": f"ncu: exit {proc.returncode}: {tail[:300]}"}]
    text = ""
    for extra in (["--print-units", "base"], []):
        imp = subprocess.run([ncu, "--import", str(rep), "--csv", "--page", "raw", *extra],
                             capture_output=True, text=True, timeout=120)
        if imp.returncode == 0 and imp.stdout.strip():
            text = imp.stdout
            break
    (out_dir / f"part3_cap_ncu_{dtype_name}_raw.csv").write_text(text)
    raw = parse_raw_csv(text)
    rows = []
    for key, names in part3_cap.NCU_METRICS.items():
        name = next((n for n in names if n in raw), None)
        if name is not None:
            rows.append({**base, "metric": key, "value": raw[name], "note": name})
    return rows or [{**base, "note": "ncu: the report held none of the expected metrics"}]


# --------------------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."),
                        help="directory for h200_part3_cap.csv and the ncu reports (default: $OUT, else .)")
    parser.add_argument("--no-ncu", action="store_true", help="skip Nsight Compute")
    parser.add_argument("--dry-run", action="store_true", help="a toy shape in the interpreter (no GPU needed)")
    parser.add_argument("--max-seconds", type=float, default=5.0, help="budget of one case's timing")
    parser.add_argument("--ncu-child", metavar="DTYPE", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ncu_child:
        ncu_child(args.ncu_child)
        return 0
    if not runtime.ON_GPU and not args.dry_run:
        parser.error("no CUDA GPU here: the experiments need one (--dry-run runs a toy in the interpreter)")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    print(f"Part 3's cap, on {machine_info()['gpu']}:")
    path = out_dir / "h200_part3_cap.csv"
    rows = run_experiments(args.dry_run, args.max_seconds, path)
    if runtime.ON_GPU and not args.no_ncu and not args.dry_run:
        common = machine_info()
        for dtype_name in ("bfloat16", "float32"):
            torch.cuda.empty_cache()
            rows += run_ncu(dtype_name, out_dir, common)
            part3_cap.write(path, rows)
    part3_cap.write(path, rows)
    print()
    print(part3_cap.table(rows))
    for dtype, metrics in part3_cap.ncu(rows).items():
        print(f"ncu {dtype}: " + ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()))
    for r in rows:
        if str(r.get("note") or "").startswith(("ncu:", "error")) or "WRONG" in str(r.get("note") or ""):
            print(f"note ({r['experiment']}, {r['variant']}): {r['note']}")
    print()
    print(part3_cap.explain(rows).text)
    print(f"\nwrote {path} in {time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

