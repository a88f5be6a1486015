"""The ``bench`` and ``tune`` commands: a real CPU run, every option documented, nonsense refused."""
import argparse
import math
import os
import subprocess
import sys
from pathlib import Path

from moe_tutorial import cli, runtime
from moe_tutorial.cli import CPU_TIMES_HEADING
from moe_tutorial.perf import results
from moe_tutorial.perf.bench import INTERPRETER_NOTE
from moe_tutorial.perf.registry import BY_NAME, FIRST_IMPLS, LAYER_IMPLS

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ("published", "fused", "sorted", "sorted+align")


def run_module(*args, timeout=300, **env):
    """``python -m moe_tutorial ARGS`` in a fresh process; returns the CompletedProcess."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.run([sys.executable, "-m", "moe_tutorial", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=full_env)


@pytest.fixture(scope="module")
def quick_bench(tmp_path_factory):
    """One ``bench --quick`` run on this machine, shared by the tests that read its output."""
    if runtime.ON_GPU:
        pytest.skip("the quick CPU run is what this checks; on a GPU it would time real models")
    out = tmp_path_factory.mktemp("bench")
    proc = run_module("bench", "--quick", "--out", str(out), "--no-progress",
                      MOE_TUTORIAL_CONFIG_DIR=str(out / "no-tables"))
    return proc, out


def test_quick_bench_runs_and_says_cpu_timings_mean_nothing(quick_bench):
    proc, out = quick_bench
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert INTERPRETER_NOTE in proc.stdout
    # No fractions of a GPU floor on a CPU: the times, said to be what they are.
    assert "fraction of the roofline floor reached" not in proc.stdout and "as fast as the hardware" not in proc.stdout
    assert "geometric mean over M of the fraction" not in proc.stdout
    assert CPU_TIMES_HEADING in proc.stdout and "M=1 ms" in proc.stdout
    both = proc.stdout + proc.stderr
    assert "one launch 0 us" not in both and "no GPU floor is judged here" in both
    header = next(line for line in proc.stdout.splitlines() if line.startswith("bench: "))
    assert "timer perf_counter (CPU" in header and "protocol" not in header
    assert (out / "custom.png").stat().st_size > 10_000


def test_quick_bench_csv_has_one_checked_row_per_case(quick_bench):
    proc, out = quick_bench
    rows = results.load_rows(out / "bench.csv")
    default = {name for name, impl in BY_NAME.items() if impl.in_default_sweep and name != "sorted-heuristic"}
    expected = {("first", i, M) for i in FIRST_IMPLS if i in default for M in (1, 8)}
    expected |= {("layer", i, M) for i in LAYER_IMPLS if i in default for M in (1, 8)}
    assert {(r["gemm"], r["impl"], r["M"]) for r in rows} == expected
    for r in rows:
        assert r["gpu"].startswith("cpu") and r["torch"] and r["triton"] and r["date"]
        assert r["driver"] is None                      # no nvidia-smi on the CPU: left empty
        assert r["read_tbps"] > 0 and r["copy_tbps"] > 0 and r["matmul_tflops"] > 0 and r["launch_us"] == 0
        assert r["protocol"] == "perf_counter"
        experts = "float8_e4m3fn" if BY_NAME[r["impl"]].precision == "fp8" else "float32"  # Part 7's e4m3 experts
        assert (r["model"], r["E"], r["N"], r["K"], r["topk"], r["dtype"]) == ("custom", 8, 64, 64, 2, experts)
        if r["impl"] == "grouped_mm":
            assert r["status"].startswith("skipped: ") and "sm90" in r["status"]
            continue
        assert r["status"] == "ok", r
        assert r["rel_error"] < 1e-5
        assert math.isclose(r["fraction_of_floor"], r["floor_ms"] / r["ms"], rel_tol=1e-9)
        assert r["tflops"] > 0 and r["gbps"] > 0
    assert {r["impl"] for r in rows if r["status"] == "ok"} >= set(KERNELS)


def test_bench_to_an_unwritable_folder_says_so_in_one_line(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    proc = run_module("bench", "--quick", "--out", str(blocker / "inside"), "--no-progress")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith(f"moe-tutorial bench: --out {blocker / 'inside'}: ")
    assert "Traceback" not in proc.stderr


def _options(parser: argparse.ArgumentParser):
    return [a for a in parser._actions if a.option_strings and a.dest != "help"]


def test_every_option_is_explained_in_help():
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(subparsers) == {"bench", "tune"}
    for name, sub in subparsers.items():
        text = sub.format_help()
        for action in _options(sub):
            assert action.help and len(action.help) > 15, f"{name} {action.option_strings} has no real help"
            assert action.option_strings[0] in text
    bench_help = subparsers["bench"].format_help()
    for impl in FIRST_IMPLS:                        # every implementation and model is described
        assert f"\n  {impl} " in bench_help
    assert "teach nothing about GPU speed" in bench_help


def test_help_from_the_command_line():
    for args in (["--help"], ["bench", "--help"], ["tune", "--help"]):
        proc = run_module(*args, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "usage: moe-tutorial" in proc.stdout


NONSENSE = [
    (["bench", "--models", "GPT-5"], "model: expected one of"),
    (["bench", "--batch-sizes", "1,-4"], "positive integers"),
    (["bench", "-M", "0"], "positive integers"),
    (["bench", "-M", "abc"], "positive integers"),
    (["bench", "--impls", "sorted,fastest"], "unknown implementation 'fastest'"),
    (["bench", "--gemm", "second"], "unknown gemm 'second'"),
    (["bench", "--E", "4", "--N", "64", "--K", "64", "--topk", "8"], "--topk 8 is larger than --E 4"),
    (["bench", "--E", "4", "--N", "64"], "missing --K, --topk"),
    (["bench", "--E", "4", "--N", "63", "--K", "64", "--topk", "2"], "must be even"),
    (["bench", "--E", "0", "--N", "64", "--K", "64", "--topk", "2"], "positive integer"),
    (["bench", "--dtype", "int8"], "unknown dtype 'int8'"),
    (["bench", "--protocol", "stopwatch"], "invalid choice"),
    (["bench", "--max-seconds-per-case", "-1"], "positive number"),
    (["bench", "--max-minutes", "0"], "positive number"),
    (["bench", "--frobnicate"], "unrecognized arguments"),
    (["tune"], "--model"),
    (["tune", "--model", "nope"], "model: expected one of"),
    (["tune", "--model", "Mixtral-8x7B", "--variants", "up"], "unknown variant 'up'"),
    (["tune", "--model", "Mixtral-8x7B", "-M", "-1"], "positive integers"),
    (["frobnicate"], "invalid choice"),
]
if not runtime.ON_GPU:
    NONSENSE += [
        (["bench", "--dtype", "bf16"], "the interpreter computes bf16 silently wrong"),
        # Each dtype's own reason: float16 is refused here because the interpreter takes fp32 only, not for bf16's.
        (["bench", "--dtype", "float16"], "expected one of torch.float32 on the CPU interpreter (fp16 runs on a GPU"),
        (["bench", "--models", "DeepSeek-V3"], "on the CPU use a small custom shape"),
    ]


@pytest.mark.parametrize("argv, message", NONSENSE, ids=[" ".join(a) for a, _ in NONSENSE])
def test_nonsense_gets_a_one_line_error_and_exit_code_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("moe-tutorial") and "error:" in last, err
    assert message in last, err


@pytest.mark.skipif(runtime.ON_GPU, reason="the refusal is for the CPU")
def test_tune_refuses_on_the_cpu():
    proc = run_module("tune", "--model", "Mixtral-8x7B", timeout=120)
    assert proc.returncode == 1
    assert "nothing to tune here" in proc.stderr and "interpreter" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_entry_point_is_declared_and_installed():
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["moe-tutorial"] == "moe_tutorial.cli:main"
    exe = Path(sys.executable).parent / "moe-tutorial"
    if not exe.exists():
        pytest.skip("the package is not installed in this environment (pip install -e .)")
    proc = subprocess.run([str(exe), "bench", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--max-seconds-per-case" in proc.stdout


def test_module_main_returns_zero_after_a_tiny_run(tmp_path, capsys):
    if runtime.ON_GPU:
        pytest.skip("CPU-sized run")
    code = cli.main(["bench", "--E", "4", "--N", "32", "--K", "32", "--topk", "2", "-M", "2",
                     "--impls", "loop,sorted", "--gemm", "first", "--out", str(tmp_path), "--no-progress"])
    assert code == 0
    rows = results.load_rows(tmp_path / "bench.csv")
    assert [(r["model"], r["impl"], r["status"]) for r in rows] == [("custom", "loop", "ok"),
                                                                     ("custom", "sorted", "ok")]
    assert "custom" in capsys.readouterr().out


def test_tune_command_wiring_on_a_pretend_gpu(monkeypatch, tmp_path, capsys):
    """What `tune` passes to the tuner and prints, with the GPU and the search stubbed out."""
    from moe_tutorial.kernels.configs import KernelConfig
    from moe_tutorial.perf import tuning

    import torch

    seen = {}

    def fake_tune(shape, batch_sizes, variants, dtype, *, out, max_minutes, seed):
        seen.update(shape=shape.name, batch_sizes=batch_sizes, variants=variants, dtype=dtype, out=out,
                    max_minutes=max_minutes)
        c = KernelConfig(block_m=16, block_n=64, block_k=128, group_m=1, num_warps=4, num_stages=3)
        return [tuning.TuneResult("plain", 1, "key", c, 2.0, c, 1.0, 3, 0)]
    monkeypatch.setattr(runtime, "ON_GPU", True)
    monkeypatch.setattr(tuning, "tune", fake_tune)
    out = tmp_path / "t.json"
    assert cli.main(["tune", "--model", "qwen3-30b-a3b", "-M", "1,64", "--variants", "plain,down",
                     "--dtype", "fp16", "--max-minutes", "3", "--out", str(out)]) == 0
    assert seen == dict(shape="Qwen3-30B-A3B", batch_sizes=(1, 64), variants=("plain", "down"),
                        dtype=torch.float16, out=out, max_minutes=3.0)
    printed = capsys.readouterr().out
    assert "2.00x" in printed and str(out) in printed


def test_tune_takes_any_shape_a_user_names(monkeypatch, tmp_path, capsys):
    """A shape no table knows (topk = 1 included) is tuned like a named model; one shape, no more."""
    from moe_tutorial.perf import tuning

    seen = {}
    monkeypatch.setattr(runtime, "ON_GPU", True)
    monkeypatch.setattr(tuning, "tune", lambda shape, *a, **k: seen.update(shape=shape) or [])
    assert cli.main(["tune", "--E", "40", "--N", "1024", "--K", "512", "--topk", "1", "--out",
                     str(tmp_path / "t.json")]) == 0
    s = seen["shape"]
    assert (s.name, s.num_experts, s.topk, s.hidden, s.intermediate) == ("custom", 40, 1, 512, 512)
    for argv, message in ((["tune"], "name one shape to tune"),
                          (["tune", "--model", "Mixtral-8x7B", "--E", "8", "--N", "64", "--K", "64", "--topk", "2"],
                           "name one shape to tune"),
                          (["tune", "--E", "8", "--N", "64"], "missing --K, --topk")):
        with pytest.raises(SystemExit):
            cli.main(argv)
        assert message in capsys.readouterr().err
