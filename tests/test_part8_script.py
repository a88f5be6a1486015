"""The GPU script of Part 8 on a toy shape in the interpreter: it runs its three steps end to end and
writes rows the notebook's reader takes (moe_tutorial/experiments/backward.py)."""
import importlib.util
from pathlib import Path

from moe_tutorial.experiments import backward
from moe_tutorial.perf.results import read_csv

SCRIPT = Path(__file__).resolve().parents[1] / "measurements" / "scripts" / "h200_backward.py"


def test_the_dry_run_checks_times_and_sweeps(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("h200_backward", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # A generous --max-seconds: on a busy CPU one interpreted launch can take seconds.
    assert module.main(["--dry-run", "--max-seconds", "120", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "1. times" in out and "2. gradients" in out and "3. tiles" in out
    rows = backward.load_backward(tmp_path / "h200_backward.csv")
    assert rows and all(r["status"] == "ok" and r["impl"] == "ours" for r in rows)
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
    shows here (it starts a process of its own with the interpreter off)."""
    path = SCRIPT.parent / "sm90_compile_backward.py"
    spec = importlib.util.spec_from_file_location("sm90_compile_backward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main() == 0
