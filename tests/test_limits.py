"""The limit experiments' reader (experiments.limits) and its figure, on synthetic rows and the shipped data."""
from __future__ import annotations

import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)
from moe_tutorial.experiments import limits
from moe_tutorial.figures import perf
from moe_tutorial.perf import results


def _row(**kw):
    base = dict(round=1, experiment="first-gemm", protocol="cold-l2-zero", model="m", M=1, variant="base", bytes=None,
                ms=1.0, status="ok")
    return {**base, **kw}


def test_lever_gains_pairs_within_a_run_and_keeps_failures():
    rows = [_row(M=1, ms=2.0), _row(M=1, variant="ws", ms=1.0),
            _row(M=8, ms=3.0), _row(M=8, variant="ws", ms=None, status="error: RuntimeError"),
            _row(round=2, M=64, variant="ws", ms=1.0)]          # no baseline in its run: left out
    assert limits.lever_gains(rows, "first-gemm", "base", "ws") == {("m", 1): 2.0, ("m", 8): "error: RuntimeError"}
    table = limits.lever_table(rows, levers=(("first-gemm", "base", "ws", "the lever", "dropped"),))
    assert "2.00x  2.00x  2.00x" in table and "1 of 2" in table and "M = 1..8" in table


def test_read_rates_keep_the_best_of_repeats():
    rows = [_row(experiment="read-by-size", variant="read-only", model="", M=None, bytes=100 << 20, ms=0.05),
            _row(experiment="read-by-size", variant="read-only", model="", M=None, bytes=100 << 20, ms=0.04),
            _row(experiment="read-by-size", variant="read-only", protocol="clean-flush", model="", M=None,
                 bytes=100 << 20, ms=0.03)]
    rates = limits.read_rates(rows)
    assert rates["cold-l2-zero", 100] == (100 << 20) / 0.04e-3 / 1e12
    assert set(rates) == {("cold-l2-zero", 100), ("clean-flush", 100)}
    assert "clean-flush (TB/s)" in limits.read_rate_table(rows)


def test_shipped_data_has_every_lever_and_the_read_curve():
    rows = limits.load_limits()
    assert {r["gpu"] for r in rows} == {"NVIDIA H200"} and all(r["date"] and r["triton"] for r in rows)
    for experiment, base, variant, *_ in limits.LEVERS:
        assert limits.lever_gains(rows, experiment, base, variant), variant
    rates = limits.read_rates(rows)
    cold = [rates[p, mib] for p, mib in sorted(rates) if p == "cold-l2-zero"]
    assert len(cold) >= 5 and cold == sorted(cold)            # bigger reads run faster under cold-l2-zero
    assert set(limits.decode_reads(rows)) == {(m, M) for m in ("Mixtral-8x7B", "Qwen3-30B-A3B", "DeepSeek-V3")
                                             for M in (1, 8)}


def test_read_by_size_figure_places_part4():
    rows = limits.load_limits()
    bench = results.load_rows(results.H200_RESULTS)
    fig = perf.plot_read_by_size(limits.read_rates(rows), bench, read_tbps=4.4)
    ax = fig.axes[0]
    labels = [line.get_label() for line in ax.lines]
    assert "read-only kernel, L2 flushed by zeroing" in labels and "read-only kernel, L2 flushed clean" in labels
    assert sum(label.startswith("Part 4") for label in labels) == 6         # 3 models x (GEMM, layer)


def test_a_fraction_of_the_floor_means_one_thing_in_every_row():
    """fraction_of_floor is floor_ms / ms of the whole GEMM or layer the row times; rows that time a
    piece of it (the gather alone, the topk sum alone) have neither column."""
    rows = limits.load_limits()
    parts = [r for r in rows if limits.is_part(r)]
    assert {(r["experiment"], r["variant"]) for r in parts} == set(limits.PARTS)
    assert all(r["floor_ms"] is None and r["fraction_of_floor"] is None and r["ms"] > 0 for r in parts)
    timed = [r for r in rows if r["fraction_of_floor"] is not None]
    assert timed and all(not limits.is_part(r) for r in timed)
    for r in timed:
        assert abs(r["fraction_of_floor"] - r["floor_ms"] / r["ms"]) < 1e-9 * r["fraction_of_floor"], r
        assert r["fraction_of_floor"] < 1.1, r          # a whole call cannot beat its floor by more than noise
