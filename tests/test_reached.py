"""The read ceiling is the best rate anything in the run reached (perf/reached.py): no call beats its floor."""
import random

from moe_tutorial.perf import bench, ceilings, reached, results, traffic
from moe_tutorial.shapes import ModelShape

import pytest
import torch

SHAPE = ModelShape("custom", num_experts=6, topk=2, hidden=32, intermediate=16)


def run_rows(rng, date, read_tbps=4.5, matmul_tflops=800.0, launch_us=3.0, n=40, fastest=1.15):
    """One made-up run: real floors of random first-GEMM and layer calls, times around them
    (the floor over 0.85 to ``fastest``: some calls 'beat' the measured read ceiling, none the compute roof)."""
    c = ceilings.Ceilings(read_tbps=read_tbps, matmul_tflops=matmul_tflops, launch_us=launch_us)
    rows = []
    for _ in range(n):
        E, topk = rng.choice([(8, 2), (64, 6), (256, 8)])
        N, K, M, gemm = rng.choice([2048, 4096, 28672]), rng.choice([2048, 4096, 7168]), rng.choice(
            [1, 8, 64, 1024, 16384]), rng.choice(["first", "layer"])
        if gemm == "first":
            nbytes, flops = traffic.first_gemm_bytes(M, N, K, E, topk), traffic.first_gemm_flops(M, N, K, topk)
        else:
            nbytes = traffic.layer_bytes(M, K, N // 2, E, topk)
            flops = traffic.layer_flops(M, K, N // 2, topk)
        floor = c.floor_ms(nbytes, flops)
        # Faster than the read ceiling at times, never faster than the matmul rate (reached.py's premise).
        ms = max(floor / rng.uniform(0.85, fastest), c.floor_ms(0.0, flops))
        rows.append({"gpu": "g", "date": date, **c.columns(), "model": "m", "E": E, "N": N, "K": K, "topk": topk,
                     "dtype": "bfloat16", "gemm": gemm, "impl": "sorted", "M": M, "ms": ms,
                     "tflops": flops / (ms * 1e-3) / 1e12, "gbps": nbytes / (ms * 1e-3) / 1e9,
                     "floor_ms": floor, "fraction_of_floor": floor / ms, "status": "ok"})
    return rows


@pytest.mark.parametrize("seed", range(5))
def test_no_call_beats_its_floor_and_the_ceiling_is_one_a_call_reached(seed):
    rng = random.Random(seed)
    a, b = run_rows(rng, "run-a"), run_rows(rng, "run-b", read_tbps=4.6, launch_us=0.7)
    skipped = dict(a[0], ms=None, tflops=None, gbps=None, fraction_of_floor=None, status="skipped: slow")
    rows = a + b + [skipped]
    out = reached.raise_read_ceiling(rows)
    for run, measured in (("run-a", 4.5), ("run-b", 4.6)):
        mine = [(r, o) for r, o in zip(rows, out) if r["date"] == run]
        ceiling = mine[0][1]["read_tbps"]
        assert all(o["read_tbps"] == ceiling and o["read_measured_tbps"] == measured for _, o in mine)
        # The ceiling is the best bytes / (ms - launch) of the run's bandwidth-bound calls, or the measured one.
        rates = [r["gbps"] * r["ms"] / (r["ms"] - r["launch_us"] * 1e-3) / 1e3 for r, _ in mine
                 if r["status"] == "ok" and r["gbps"] * r["ms"] * 1e6 / (r["read_tbps"] * 1e12)
                 > r["tflops"] * r["ms"] * 1e9 / (r["matmul_tflops"] * 1e12)]
        assert ceiling == pytest.approx(max([measured] + rates), rel=1e-12)
        for r, o in mine:                           # each floor as if computed with the raised ceiling
            if r["status"] == "ok":
                nbytes = r["gbps"] * 1e9 * r["ms"] * 1e-3
                flops = r["tflops"] * 1e12 * r["ms"] * 1e-3
                c = ceilings.Ceilings(read_tbps=ceiling, matmul_tflops=r["matmul_tflops"], launch_us=r["launch_us"])
                assert o["floor_ms"] == pytest.approx(c.floor_ms(nbytes, flops), rel=1e-12)
                assert o["fraction_of_floor"] == pytest.approx(o["floor_ms"] / r["ms"], rel=1e-12)
                assert o["fraction_of_floor"] <= 1 + 1e-12
    assert out[-1]["floor_ms"] == out[0]["floor_ms"] and out[-1]["fraction_of_floor"] is None
    _same(reached.raise_read_ceiling(out), out)


def _same(x, y):
    """Rows equal up to rounding in the last bits: applying it twice changes nothing."""
    for r, s in zip(x, y):
        for k, v in r.items():
            assert v == s[k] or v == pytest.approx(s[k], rel=1e-12), (k, v, s[k])


def test_a_run_no_call_outran_keeps_its_measured_ceiling():
    rows = run_rows(random.Random(0), "run", fastest=1.0)
    out = reached.raise_read_ceiling(rows)
    assert [o["floor_ms"] for o in out] == pytest.approx([r["floor_ms"] for r in rows], rel=1e-12)
    assert {o["read_tbps"] for o in out} == {4.5}


def test_compute_bound_and_wrong_calls_do_not_raise_the_read_ceiling():
    rows = run_rows(random.Random(1), "run", fastest=1.0)          # no call beats its floor
    fast_wrong = dict(rows[0], ms=rows[0]["ms"] / 100, status="wrong")
    out = reached.raise_read_ceiling(rows + [fast_wrong])
    assert {o["read_tbps"] for o in out} == {4.5}


def test_fp8_rows_are_judged_by_the_fp8_rate():
    row = {"gpu": "g", "date": "d", "protocol": "cold-l2", "read_tbps": 4.0, "matmul_tflops": 800.0,
           "fp8_tflops": 1600.0, "launch_us": 0.0, "dtype": reached.FP8_DTYPE, "gemm": "first",
           "M": 16384, "N": 4096, "K": 4096, "topk": 8, "status": "ok"}
    flops = reached.bench_row_flops(row)
    assert flops == traffic.first_gemm_flops(16384, 4096, 4096, 8)
    assert reached.floor_terms_ms(dict(row, floor_ms=1.0), flops)[1] == pytest.approx(flops / 1.6e15 * 1e3)


def test_the_bench_raises_the_ceiling_its_calls_outran(tmp_path):
    """A CPU run judged by a read ceiling far below what torch's CPU calls read: raised, every
    fraction at most 1, the CSV written with the same rows."""
    plan = bench.BenchPlan([SHAPE], (1, 4), torch.float32, gemms=("first",), impls=("loop", "indexing"))
    logged = []
    low = ceilings.Ceilings(read_tbps=1e-9, matmul_tflops=1e9, protocol="perf_counter")
    rows = bench.run_bench(plan, csv_path=tmp_path / "b.csv", progress=False, log=logged.append, ceilings=low)
    assert all(r["read_measured_tbps"] == 1e-9 and r["read_tbps"] > 1e-9 for r in rows)
    assert max(r["fraction_of_floor"] for r in rows) == pytest.approx(1.0)
    assert any(line.startswith("read ceiling raised from 1e-09 TB/s") for line in logged)
    saved = results.load_rows(tmp_path / "b.csv")
    assert [r["floor_ms"] for r in saved] == pytest.approx([r["floor_ms"] for r in rows])


def test_rows_of_one_run_with_two_measured_ceilings_are_refused():
    rows = run_rows(random.Random(2), "run", n=2)
    rows[1]["read_tbps"] = rows[1]["read_measured_tbps"] = 3.0
    with pytest.raises(ValueError, match=r"^rows: expected one read ceiling per run"):
        reached.raise_read_ceiling(rows)
