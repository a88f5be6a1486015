"""The bf16 Gluon GPU script (measurements/scripts/h200_gluon_bf16.py) on the CPU: its dry run goes
through check and sweep on a toy shape, every Gluon call failing as unavailable, so the script
cannot rot between GPU sessions."""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime)

import importlib.util
from pathlib import Path

import pytest

from moe_tutorial.kernels import gluon_kernel
from moe_tutorial.perf.results import read_csv
from moe_tutorial.shapes import MODEL_SHAPES

SCRIPT = Path(__file__).resolve().parents[1] / "measurements" / "scripts" / "h200_gluon_bf16.py"

pytestmark = pytest.mark.skipif(gluon_kernel.UNAVAILABLE is None, reason="the dry run is the CPU's: here Gluon runs")


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("h200_gluon_bf16", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dry_run_checks_the_tl_layer_and_skips_every_gluon_call(script, tmp_path):
    assert script.main(["check", "--dry-run", "--out", str(tmp_path)]) == 0
    rows = read_csv(tmp_path / "gluon_bf16_check.csv", floats={"rel_error"})
    by_impl = {(r["gemm"], r["impl"]): r for r in rows}
    assert by_impl[("layer", "tl-sorted")]["status"] == "ok" and by_impl[("layer", "tl-sorted")]["rel_error"] < 1e-5
    gluon = [r for r in rows if r["impl"].startswith("gluon")]
    assert {r["gemm"] for r in gluon} == {"gated", "layer"}
    assert len([r for r in gluon if r["gemm"] == "layer"]) == len(script.GLUON_PAIRS)
    assert all(r["status"] == f"skipped: {gluon_kernel.UNAVAILABLE}" for r in gluon)


def test_the_dry_run_sweep_times_the_tl_layer_and_writes_every_column(script, tmp_path):
    assert script.main(["sweep", "--dry-run", "--out", str(tmp_path)]) == 0
    rows = read_csv(tmp_path / "gluon_bf16_sweep.csv")
    assert {r["impl"] for r in rows} == {"tl-sorted", "grouped-mm", script.HYBRID, *script.GLUON_PAIRS}
    for column in ("gpu", "torch", "triton", "date", "protocol", "model", "M", "impl", "config", "ms", "tflops",
                   "fraction_of_floor", "status"):
        assert column in rows[0], column
    tl = next(r for r in rows if r["impl"] == "tl-sorted")
    assert tl["status"] == "ok" and float(tl["ms"]) > 0 and float(tl["ms_forward"]) > 0 and float(tl["ms_reverse"]) > 0
    assert all(r["status"].startswith("skipped: ") and r["ms"] is None for r in rows if r["impl"] != "tl-sorted")
    # The dry run's toy shape stays out of the package's table, which other tests in this process read.
    assert script.DRY.name not in MODEL_SHAPES


def test_past_the_deadline_the_sweep_starts_no_case(script, tmp_path, capsys):
    assert script.main(["sweep", "--dry-run", "--deadline", "0", "--out", str(tmp_path)]) == 0
    assert "deadline" in capsys.readouterr().out
    assert not (tmp_path / "gluon_bf16_sweep.csv").exists()
