"""The GPU script of Part 8 on a toy shape in the interpreter: it runs its three steps end to end and
writes rows the notebook's reader takes (moe_tutorial/experiments/backward.py)."""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from moe_tutorial.experiments import backward
from moe_tutorial.perf.results import read_csv

SCRIPT = Path(__file__).resolve().parents[1] / "measurements" / "scripts" / "h200_backward.py"


def load(name: str):
    """The script ``name`` beside :data:`SCRIPT`, imported as a module (its work stays behind main)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPT.parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dry_run_checks_times_and_sweeps(tmp_path, capsys):
    module = load("h200_backward")
    # A generous --max-seconds: on a busy CPU one interpreted launch can take seconds.
    assert module.main(["--dry-run", "--max-seconds", "120", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "1. times" in out and "2. gradients" in out and "3. tiles" in out
    rows = backward.load_backward(tmp_path / "h200_backward.csv")
    assert rows and all(r["status"] == "ok" for r in rows)
    assert {r["impl"] for r in rows} == {"ours", backward.TL_DW, backward.TL, backward.GATHERED}
    assert all(r[f"{p}_ms"] > 0 for r in rows for p in ("forward", "step", "backward"))
    grads = read_csv(tmp_path / "h200_backward_grads.csv", floats={"rel_error"})
    assert {g["tensor"] for g in grads} == {"out", "x", "w13", "w2", "topk_weights"}
    assert all(g["rel_error"] < 1e-5 for g in grads)
    tiles = read_csv(tmp_path / "h200_backward_tiles.csv")
    assert {t["gemm"] for t in tiles} == {"up", "dact", "dx", "dw2", "dw13"}
    assert all(t["status"] == "ok" for t in tiles), [t["status"] for t in tiles]
    assert sum(t["best"] == "True" for t in tiles) == 5
    assert (tmp_path / "tuned_configs_training.json").exists()


def test_the_shipped_data_file_has_the_readers_columns():
    header = backward.BACKWARD.read_text().splitlines()[0].split(",")
    assert header == backward.FIELDS


def test_bench_backward_times_the_step_on_the_cpus_toy_shape(tmp_path):
    from moe_tutorial import cli
    from moe_tutorial.perf.results import load_rows

    assert cli.main(["bench", "--backward", "--gemm", "step", "-M", "3", "--impls", "indexing,sorted,liger",
                     "--no-progress", "--out", str(tmp_path)]) == 0
    rows = load_rows(tmp_path / "bench.csv")
    by_impl = {r["impl"]: r for r in rows}
    assert {r["gemm"] for r in rows} == {"step"}
    assert by_impl["sorted"]["status"] == by_impl["indexing"]["status"] == "ok"
    assert by_impl["sorted"]["rel_error"] < 1e-5
    assert by_impl["liger"]["status"].startswith("skipped: ")


def test_every_part8_kernel_compiles_for_sm90_in_bf16():
    """The compile script, Triton's whole GPU pipeline run on the CPU: a fault only a GPU compile would hit
    shows here. And no variant spills registers: the dA' epilogue on whole 128 x 128 tiles did (255
    registers, 69.6 M spill requests in Nsight Compute on the H200), so it runs on half the columns."""
    path = SCRIPT.parent / "sm90_compile_backward.py"
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(SCRIPT.parents[2])}
    run = subprocess.run([sys.executable, str(path)], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [line for line in run.stdout.splitlines() if " warps, " in line]
    assert len(lines) >= 9 and all(": ok: " in line for line in lines), run.stdout
    assert all(line.endswith(" 0 bytes spilled") for line in lines), run.stdout


def test_the_sorted_copies_gain_pairs_ours_with_its_gathered_self():
    def row(impl, T, bwd, peak, status="ok"):
        return {"model": "m", "T": T, "impl": impl, "backward_ms": bwd, "peak_bytes": peak, "status": status}

    rows = [row("ours", 4096, 2.0, 5e9), row(backward.GATHERED, 4096, 3.0, 4e9), row("liger", 4096, 9.0, 1e9),
            row("ours", 8192, 4.0, 9e9), row(backward.GATHERED, 8192, None, 0, "skipped: too slow")]
    gains = backward.sorted_copies_gain(rows)
    assert [(g["T"], g["speedup"], g["extra_peak_bytes"]) for g in gains] == [(4096, 1.5, 1e9)]
    table = backward.sorted_copies_table(rows)
    assert "1.50x" in table and "+1.00" in table and "8192" not in table
    assert backward.sorted_copies_table(rows[2:3]) == backward.NOT_MEASURED
    assert backward.GATHERED not in backward.IMPLS        # the summary tables leave it out
    # With a tl-dW row in the case, the gathered row is paired with it: the same dW GEMMs on both sides.
    rows.append(row(backward.TL_DW, 4096, 2.4, 5e9))
    assert [round(g["speedup"], 6) for g in backward.sorted_copies_gain(rows)] == [1.25]
    # With an all-tl row (dA' in tl too), that one: the gathered side runs every GEMM in tl.
    rows.append(row(backward.TL, 4096, 2.5, 5e9))
    assert [round(g["speedup"], 6) for g in backward.sorted_copies_gain(rows)] == [1.2]


def test_the_gluon_readers_pair_each_step_with_its_tl_selves():
    def row(impl, T, step, status="ok"):
        return {"model": "m", "T": T, "impl": impl, "step_ms": step, "status": status}

    rows = [row("ours", 4096, 8.0), row(backward.TL_DW, 4096, 10.0), row("grouped_mm", 4096, 12.0),
            row("liger", 4096, 11.0), row("ours", 8192, 8.0), row("grouped_mm", 8192, 9.0),
            row("ours", 16384, 8.0), row(backward.TL_DW, 16384, 9.0), row(backward.TL, 16384, 10.0),
            row("grouped_mm", 16384, 10.0)]
    steps = backward.gluon_step(rows)
    assert [(s["T"], s["speedup"], s["tl_dw_speedup"], s["tl_speedup"]) for s in steps] == [
        (4096, 11 / 8, 1.1, None), (16384, 1.25, 10 / 9, 1.0)]
    table = backward.gluon_step_table(steps)
    assert "8.00 (1.375x)" in table and "10.00 (1.000x)" in table and " - " in table
    tile = {"block_m": 128, "block_n": 256, "block_k": 64, "num_warps": 8, "num_stages": 3}
    sweep = [{"model": "m", "T": 4096, "gemm": g, "status": st, "ms": ms, "tile": {**tile, "gluon": gl}}
             for g in ("dw13", "dw2") for gl, ms, st in ((False, 4.0, "ok"), (False, 3.0, "wrong"), (True, 2.0, "ok"))]
    gains = backward.gluon_gains(sweep)
    assert [(g["gemm"], g["tl_ms"], g["gluon_ms"], g["speedup"]) for g in gains] == [("dw2", 4.0, 2.0, 2.0),
                                                                                     ("dw13", 4.0, 2.0, 2.0)]
    assert gains[0]["gluon_tile"] == backward.tile_name(tile) == "128x256x64 w8 s3"


def test_the_merge_of_runs_replaces_what_a_run_timed_again(tmp_path):
    module = load("merge_backward_rows")

    def row(model, impl, date):
        return {"model": model, "impl": impl, "date": date}
    old = [row("a", "ours", 1), row("a", "liger", 1), row("a", backward.GATHERED, 1), row("b", "ours", 1),
           row("b", "grouped_mm", 1)]
    run = [row("b", "ours", 2), row("b", backward.TL, 2)]
    merged = module.merge(old, [run])
    assert merged == old[:3] + [row("b", "grouped_mm", 1), row("b", "ours", 2), row("b", backward.TL, 2)]


def test_the_merge_of_sweeps_updates_the_table_m_by_m(tmp_path):
    module = load("merge_training_table")
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"g": {"k": {"4096": {"a": 1}, "16384": {"a": 2}}}, "other": {"k": {}}}))
    (tmp_path / "s.json").write_text(json.dumps({"g": {"k": {"16384": {"a": 3}}, "new": {"32768": {"a": 4}}}}))
    merged = module.merge([tmp_path / "s.json", tmp_path / "missing.json"], "g", table)
    assert merged == {"g": {"k": {"4096": {"a": 1}, "16384": {"a": 3}}, "new": {"32768": {"a": 4}}}, "other": {"k": {}}}
