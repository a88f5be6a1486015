"""The committed measurements keep the rules the notebooks' claims rest on: a floor is a floor."""
import csv

from moe_tutorial.experiments import limits
from moe_tutorial.perf import reached, results

import pytest

DATA = sorted(results.DATA_DIR.glob("*.csv"))
WITH_FRACTIONS = [p for p in DATA if "fraction_of_floor" in next(csv.reader(open(p)))]
BENCH = [p for p in DATA if next(csv.reader(open(p))) == results.FIELDS]


def test_the_data_files_with_fractions_are_all_found():
    """Guards the two lists below against a renamed column: the bench's files and the limit runs."""
    assert {p.name for p in WITH_FRACTIONS} >= {"h200_bench.csv", "h200_fp8_bench.csv", "h200_limit_experiments.csv"}
    assert {p.name for p in BENCH} >= {"h200_bench.csv", "h200_fp8_bench.csv"}


@pytest.mark.parametrize("path", WITH_FRACTIONS, ids=lambda p: p.name)
def test_no_committed_call_beats_its_floor(path):
    fractions = [float(r["fraction_of_floor"]) for r in csv.DictReader(open(path)) if r["fraction_of_floor"]]
    assert fractions and max(fractions) <= 1.0 + 1e-12, (path.name, max(fractions))


@pytest.mark.parametrize("path", BENCH, ids=lambda p: p.name)
def test_committed_bench_runs_carry_their_raised_read_ceiling(path):
    """Each run's read ceiling is already raised to what its calls reached (re-deriving changes
    nothing), never below what the read kernels measured."""
    rows = results.load_rows(path)
    again = reached.raise_read_ceiling(rows)
    for r, s in zip(rows, again):
        assert r["read_tbps"] >= r["read_measured_tbps"] > 0, r
        assert s["read_tbps"] == pytest.approx(r["read_tbps"], rel=1e-12)
        assert s["floor_ms"] == pytest.approx(r["floor_ms"], rel=1e-12)


def test_committed_limit_runs_carry_their_raised_read_ceiling():
    rows = limits.load_limits()
    floored = [r for r in rows if r["floor_ms"] is not None]
    assert floored and all(r["read_tbps"] >= r["read_measured_tbps"] > 0 for r in floored)
    again = limits.raise_read_ceiling(rows)
    assert [s["floor_ms"] for s in again if s["floor_ms"] is not None] == pytest.approx(
        [r["floor_ms"] for r in floored], rel=1e-12)
