"""Tables and figures from benchmark rows: ``bench_report`` and ``figures.perf``.

The rows are made up (never committed) and timed from the traffic model; most tests write them
to a CSV under pytest's tmp_path and read them back through ``moe_tutorial.perf.results``, as the
notebooks read the shipped H200 results.
"""
import math

from moe_tutorial.figures import perf  # noqa: E402
from moe_tutorial.perf import report as bench_report  # noqa: E402
from moe_tutorial.perf import results, traffic
from moe_tutorial.perf.registry import LABELS  # noqa: E402
from moe_tutorial.shapes import ModelShape  # noqa: E402

import numpy as np
import pytest  # noqa: E402

SMALL = ModelShape("custom", num_experts=6, topk=2, hidden=32, intermediate=16)



def bench_rows(fractions: dict, models=("Mixtral-8x7B", "DeepSeek-V3"), Ms=(1, 64, 4096), *, wrong=(), skipped=(),
               gemm="first", dtype="bfloat16") -> list[dict]:
    """Rows shaped like the bench's, each reaching a chosen fraction of its floor.

    Args:
        fractions: ``{impl: fraction}`` or ``{impl: {M: fraction}}``.
        wrong: ``(impl, model)`` pairs whose every case failed the check (timed all the same,
            as the bench does). skipped: ``(impl, model, M)`` cases skipped (not timed).
    """
    N, K, E, topk = 64, 64, 8, 2
    rows = []
    for model in models:
        for impl, frac in fractions.items():
            for M in Ms:
                f = frac[M] if isinstance(frac, dict) else frac
                nbytes, flops = traffic.first_gemm_bytes(M, N, K, E, topk), traffic.first_gemm_flops(M, N, K, topk)
                floor = 1e3 * traffic.floor_seconds(nbytes, flops, 4e12, 600e12)
                row = dict(gpu="Fake", model=model, E=E, N=N, K=K, topk=topk, dtype=dtype, gemm=gemm, impl=impl, M=M,
                           copy_tbps=4.0, matmul_tflops=600.0, floor_ms=floor, status="ok")
                if (impl, model, M) in skipped:
                    row["status"] = "skipped: made up"
                else:
                    ms = floor / f
                    row.update(ms=ms, tflops=flops / ms / 1e9, gbps=nbytes / ms / 1e6, fraction_of_floor=f)
                    if (impl, model) in wrong:
                        row["status"] = "wrong"
                rows.append(row)
    return rows


def via_csv(tmp_path, rows):
    return results.load_rows(results.write_rows(tmp_path / "bench.csv", rows))


# --------------------------------------------------------------------------------------
# Tables
# --------------------------------------------------------------------------------------

def test_tables_show_wrong_and_skipped_cells():
    base = dict(model="m", gemm="first", ms=2.0, floor_ms=1.0, fraction_of_floor=0.5)
    rows = [dict(base, impl="sorted", M=1, status="ok", ms=1.0, fraction_of_floor=1.0),
            dict(base, impl="sorted", M=8, status="ok", fraction_of_floor=0.25, ms=4.0),
            dict(base, impl="fused", M=1, status="wrong"),
            dict(base, impl="fused", M=8, status="ok", ms=8.0),
            dict(base, impl="loop", M=1, status="skipped: slow"),
            dict(base, impl="loop", M=8, status="ok (events, graph capture failed)", ms=40.0)]
    table = bench_report.fraction_table(rows)
    assert "wrong" in table and "0.50" in table
    sorted_line = next(line for line in table.splitlines() if " sorted " in f" {line} ")
    assert sorted_line.split()[-1] == "0.50"                       # geomean of 1.0 and 0.25
    fused_line = next(line for line in table.splitlines() if " fused " in f" {line} ")
    assert fused_line.split()[-3:] == ["wrong", "0.50", "wrong"]   # one wrong M makes the geomean "wrong"
    geo = bench_report.geomean_table(rows)
    assert "wrong" in geo.splitlines()[3] and "(1/2 M)" in geo
    speed = bench_report.speedup_table(rows, "m")
    assert "wrong" in speed and "2.00x" in speed and "10.00x" in speed
    assert "loop (first): slow" in bench_report.skipped_reasons(rows)


@pytest.fixture
def part4_rows(tmp_path):
    """Two models, three implementations; published wrong on DeepSeek-V3, one grouped_mm case skipped."""
    fractions = {"sorted": {1: 0.8, 64: 0.4, 4096: 1.0}, "grouped_mm": {1: 0.5, 64: 0.25, 4096: 1.0},
                 "published": {1: 0.05, 64: 0.025, 4096: 0.1}}
    return via_csv(tmp_path, bench_rows(fractions, models=("DeepSeek-V3", "Mixtral-8x7B"),
                                        wrong={("published", "DeepSeek-V3")},
                                        skipped={("grouped_mm", "Mixtral-8x7B", 4096)}))


def test_floor_geomeans(part4_rows):
    values = bench_report.floor_geomeans(part4_rows, gemm="first")
    assert values["DeepSeek-V3", "published"] == "wrong"
    assert values["Mixtral-8x7B", "sorted"] == pytest.approx((0.8 * 0.4 * 1.0) ** (1 / 3))
    # The skipped M = 4096 row is left out of the mean, not counted as zero.
    assert values["Mixtral-8x7B", "grouped_mm"] == pytest.approx(math.sqrt(0.5 * 0.25))
    assert bench_report.floor_geomeans(part4_rows, gemm="layer") == {}


def test_geomean_table(part4_rows):
    table = bench_report.geomean_table(part4_rows, gemm="first", labels=LABELS)
    lines = table.splitlines()
    assert lines[0].split() == ["gate/up", "GEMM", "Mixtral-8x7B", "DeepSeek-V3"]   # the series' order
    published = next(line for line in lines if line.startswith("Part 3, as published"))
    assert published.split()[-2:] == ["0.05", "wrong"]
    sorted_line = next(line for line in lines if line.startswith("Part 4, tuned"))
    assert sorted_line.split()[-2] == f"{(0.8 * 0.4 * 1.0) ** (1 / 3):.2f}"
    grouped = next(line for line in lines if line.startswith("torch._grouped_mm"))
    assert "(2/3 M)" in grouped                                     # Mixtral's skipped M = 4096


def test_tables_refuse_mixed_dtypes(part4_rows):
    mixed = part4_rows + [dict(part4_rows[0], dtype="float16")]
    with pytest.raises(ValueError, match="several dtypes"):
        bench_report.geomean_table(mixed)
    assert bench_report.geomean_table(mixed, dtype="bfloat16") == bench_report.geomean_table(part4_rows)


@pytest.fixture
def part3_rows(tmp_path):
    """Two models, four implementations: published wrong on DeepSeek-V3, the loop skipped at M = 4096.

    Plus one whole-layer row, which the gate/up GEMM's figures and tables must leave out.
    """
    models = ("Mixtral-8x7B", "DeepSeek-V3")
    rows = bench_rows({"loop": 1 / 40, "published": 0.2, "fused": 0.25, "sorted": 1 / 1.2}, models,
                      wrong={("published", "DeepSeek-V3")}, skipped={("loop", m, 4096) for m in models})
    return via_csv(tmp_path, rows + bench_rows({"fused": 0.5}, ("Mixtral-8x7B",), (1,), gemm="layer"))


def test_one_implementation_fraction_table(part3_rows):
    table = bench_report.fraction_table(part3_rows, "first", impls=["published"]).splitlines()
    assert table[2].split()[3:] == ["0.20"] * 3 + ["0.20"]           # three M, then the geomean
    assert table[3].split()[3:] == ["wrong"] * 4                     # the geomean too, as in geomean_table
    assert "-" in bench_report.fraction_table(part3_rows, "first", impls=["loop"]).splitlines()[2].split()
    named = bench_report.fraction_table(part3_rows, "first", impls=["fused"], labels=LABELS)
    assert "Part 3, fixed" in named and " fused " not in f" {named} "


def test_best_tflops(part3_rows):
    def at(model, M):
        return next(r["tflops"] for r in part3_rows if r["model"] == model and r["impl"] == "fused"
                    and r["gemm"] == "first" and r["M"] == M)
    assert bench_report.best_tflops(part3_rows, "fused") == {"Mixtral-8x7B": pytest.approx(at("Mixtral-8x7B", 4096)),
                                                             "DeepSeek-V3": pytest.approx(at("DeepSeek-V3", 4096))}
    assert list(bench_report.best_tflops(part3_rows, "published")) == ["Mixtral-8x7B"]   # wrong rows do not count


# --------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------

def test_time_plot_lines_crosses_and_floor(part3_rows):
    fig = perf.plot_across_models(part3_rows, highlight="fused")
    assert [ax.get_title() for ax in fig.axes] == ["Mixtral-8x7B", "DeepSeek-V3"]
    mixtral, v3 = fig.axes
    lines = mixtral.get_lines()
    assert [line.get_label() for line in lines] == ["Part 1, loop", "Part 3, as published", "Part 3, fixed",
                                                    "Part 4, tuned", "roofline floor"]
    assert len(lines[0].get_xdata()) == 2                          # the skipped M = 4096 is left out
    assert len(lines[2].get_xdata()) == 3                          # the whole-layer row is left out
    assert lines[2].get_linewidth() > lines[3].get_linewidth()     # the highlighted implementation
    assert "Part 3, as published" not in [line.get_label() for line in v3.get_lines()]
    assert len(v3.collections) == 1                                # its wrong results are crosses
    # ... drawn above the panel (axes y = 1), not low on a log time axis where they would read as fast runs
    assert {float(y) for _, y in v3.collections[0].get_offsets()} == {1.0}
    fig = perf.plot_across_models(part3_rows, impls=("fused", "sorted"))
    assert [line.get_label() for line in fig.axes[0].get_lines()] == ["Part 3, fixed", "Part 4, tuned",
                                                                      "roofline floor"]


def test_time_plot_needs_rows():
    with pytest.raises(ValueError, match="^rows: "):
        perf.plot_across_models([])


@pytest.mark.parametrize("metric", ["ms", "fraction_of_floor"])
def test_plot_across_models(part4_rows, metric):
    fig = perf.plot_across_models(part4_rows, gemm="first", metric=metric)
    assert [ax.get_title() for ax in fig.axes[:2]] == ["Mixtral-8x7B", "DeepSeek-V3"]
    labels = fig.legends[0].get_texts()
    assert "Part 3, as published: wrong result (no time)" in [t.get_text() for t in labels]


def test_plot_across_models_wraps_many_models(part4_rows):
    extra = [dict(r, model=m) for r in part4_rows for m in ("Qwen3-30B-A3B", "DeepSeek-V2-Lite")]
    fig = perf.plot_across_models(part4_rows + extra, metric="fraction_of_floor")
    assert len(fig.axes) == 6 and sum(ax.axison for ax in fig.axes) == 4


def test_plot_across_models_bad_input(part4_rows):
    with pytest.raises(ValueError, match="metric"):
        perf.plot_across_models(part4_rows, metric="tflops")
    with pytest.raises(ValueError, match="no results"):
        perf.plot_across_models(part4_rows, gemm="layer")
    with pytest.raises(ValueError, match="several dtypes"):
        perf.plot_across_models(part4_rows + [dict(part4_rows[0], dtype="float16")])
    # dtype= keeps that dtype's rows: the figure is the one the bf16 rows alone give, without the
    # (distinctively slow) fp16 row.
    fp16 = dict(part4_rows[0], dtype="float16", ms=123.0)
    kept = perf.plot_across_models(part4_rows + [fp16], dtype="bfloat16")
    assert plotted_lines(kept) == plotted_lines(perf.plot_across_models(part4_rows))
    assert all(123.0 not in ys for _, _, ys in plotted_lines(kept))
    assert any(123.0 in ys for _, _, ys in plotted_lines(perf.plot_across_models(part4_rows + [fp16],
                                                                                 dtype="float16")))


def plotted_lines(fig) -> list[tuple]:
    """Every line of every panel as (label, x values, y values): what a reader sees plotted."""
    return [(line.get_label(), [float(v) for v in line.get_xdata()], [float(v) for v in line.get_ydata()])
            for ax in fig.axes for line in ax.get_lines()]


def test_performance_figures_draw_every_implementation(tmp_path):
    rows = bench_rows({"sorted": 0.9, "fused": 0.2, "sorted+align": 0.7, "published": 0.1}, ("custom",), (1, 8, 64),
                      wrong={("published", "custom")})
    fig = perf.plot_roofline(rows, "custom")
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert {"Part 4, tuned", "Part 3, fixed", "Part 4, tuned, alignment timed"} <= set(labels)
    assert labels[0].startswith("roof")
    assert "Part 3, as published" not in labels                     # a wrong result has no place on the roofline
    fig = perf.plot_across_models(rows, ["custom"], "first", "fraction_of_floor")
    assert "Part 3, as published: wrong result (no time)" in [t.get_text() for t in fig.legends[0].get_texts()]
    with pytest.raises(ValueError, match="metric"):
        perf.plot_across_models(rows, ["custom"], "first", "speed")
    with pytest.raises(ValueError, match="no timed results"):
        perf.plot_roofline(rows, "custom", "layer")
    panels = perf.plot_rooflines(rows + [dict(r, model="other") for r in rows], ["custom", "other"])
    assert len(panels.axes) == 2 and all(ax.get_legend() is None for ax in panels.axes)
    assert [t.get_text() for t in panels.legends[0].get_texts()][0].startswith("roof")   # one legend for both
    for ax in panels.axes:                     # only Part 4 names its first and last M
        assert [t.get_text() for t in ax.texts] == ["M = 1", "M = 64"]
    ai = perf.intensity(ModelShape("m", 8, 2, 4096, 14336), [1, 16384])
    assert ai[0] < 2 < 150 < ai[1]                        # decode: ~1 FLOP/byte; prefill: far above the ridge
    fig = perf.plot_intensity([SMALL], read_tbps=4.0, matmul_tflops=600.0)
    curve = next(line for line in fig.axes[0].get_lines() if line.get_label().startswith("custom (E=6, topk=2)"))
    assert curve.get_xdata()[0] == 1 and curve.get_xdata()[-1] == 16384
    assert np.allclose(curve.get_ydata(), perf.intensity(SMALL, curve.get_xdata()))
    assert [150.0, 150.0] in [list(line.get_ydata()) for line in fig.axes[0].get_lines()]     # the ridge
    assert any(t.get_text().startswith("ridge: 150 FLOP/byte") for t in fig.axes[0].texts)
    with pytest.raises(TypeError, match="read_tbps"):
        perf.plot_intensity([SMALL], matmul_tflops=600.0)        # no default ceiling: the data's run gives it
    assert [p.name for p in perf.save_bench_figures(rows, tmp_path)] == ["custom.png"]


def test_run_lines_one_per_model_and_date():
    rows = bench_rows({"sorted": 0.9, "loop": 0.3}, Ms=(1, 64))
    for r in rows:
        r["date"] = "2026-01-02T03:04:05" if r["impl"] == "loop" else "2026-01-02T04:00:00"
    for r in rows:
        if r["impl"] == "loop" and r["model"] == "Mixtral-8x7B":
            r["matmul_tflops"] = 650.0          # the ceiling of that run
    lines = bench_report.run_lines(rows).splitlines()
    assert len(lines) == 4                      # 2 models x 2 runs, earlier run first
    assert lines[0].startswith("  Mixtral-8x7B, run of 2026-01-02T03:04:05") and lines[0].endswith("; loop")
    assert "bfloat16 matmul 650 TFLOP/s" in lines[0] and "matmul 600 TFLOP/s" in lines[1]
    assert lines[1].endswith("; sorted") and lines[2].startswith("  DeepSeek-V3")


def test_tables_keep_one_protocol(part4_rows):
    """Rows timed under two protocols: tables show the headline one unless told otherwise."""
    rotated = [dict(r, protocol="rotated", fraction_of_floor=r["fraction_of_floor"] and r["fraction_of_floor"] / 2)
               for r in part4_rows]
    cold = [dict(r, protocol="cold-l2") for r in part4_rows]
    both = cold + rotated
    assert bench_report.geomean_table(both) == bench_report.geomean_table(cold)
    assert bench_report.geomean_table(both, protocol="rotated") == bench_report.geomean_table(rotated)
    assert bench_report.geomean_table(rotated) != bench_report.geomean_table(cold)
    with pytest.raises(ValueError, match=r"^protocol: the results hold several protocols \['a', 'b'\]"):
        bench_report.subset([dict(r, protocol="a") for r in part4_rows] + [dict(r, protocol="b") for r in part4_rows])


def test_roofline_draws_the_given_impls_under_the_given_ceilings():
    rows = bench_rows({"sorted": 0.9, "fused": 0.2, "loop": 0.1}, ("custom",), (1, 8, 64))
    for r in rows:
        r["read_tbps"] = 4.0
    fig = perf.plot_roofline(rows, "custom", impls=("sorted", "loop"),
                             ceilings={"read_tbps": 5.0, "matmul_tflops": 700})
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert labels == ["roof: 5.00 TB/s, 700 TFLOP/s", "Part 1, loop", "Part 4, tuned"]
    roof = fig.axes[0].get_lines()[0]
    assert max(roof.get_ydata()) == 700 and np.allclose(roof.get_ydata()[:3], 5.0 * roof.get_xdata()[:3])
    assert perf.plot_roofline(rows, "custom").axes[0].get_legend_handles_labels()[1][0].startswith("roof: 4.00 TB/s")
    bare = [{k: v for k, v in r.items() if k not in ("read_tbps", "copy_tbps")} for r in rows]
    with pytest.raises(ValueError, match="^rows: expected rows that carry the ceilings"):
        perf.plot_roofline(bare, "custom")


# --------------------------------------------------------------------------------------
# Part 4's steps (notebook 04) and the one table (notebook 05)
# --------------------------------------------------------------------------------------

def ladder_rows(gemm="first", models=("Mixtral-8x7B",), Ms=(1, 64, 1024)):
    """Every step of ``gemm``'s ladder, each 10% faster than the one before at M >= 1024 and
    equal below: the gains are known exactly."""
    steps = bench_report.LADDERS[gemm]
    fractions = {step: {M: 0.5 * (1.1 ** i if M >= 1024 else 1.0) for M in Ms} for i, step in enumerate(steps)}
    return bench_rows(fractions, models, Ms, gemm=gemm)


def test_step_gains_and_their_table():
    rows = ladder_rows(models=("Mixtral-8x7B", "DeepSeek-V3"))
    gains = bench_report.step_gains(rows, "first", "minimal", "+grouped")
    assert gains == pytest.approx({(m, M): 1.1 if M >= 1024 else 1.0 for m in ("Mixtral-8x7B", "DeepSeek-V3")
                                   for M in (1, 64, 1024)})
    assert bench_report.gain_range(rows, "first", "minimal", "sorted", Ms=(1024,)) == pytest.approx((1.1 ** 4,) * 2)
    assert bench_report.gain_range(rows, "first", "minimal", "+tma") == pytest.approx((1.0, 1.1 ** 3))
    gain, model, M = bench_report.largest_gain(rows, "first", "minimal", "+tuned", Ms=(1, 64))
    assert gain == pytest.approx(1.0) and M in (1, 64)
    table = bench_report.step_gain_table(rows, "first", "+tuned", "+tma").splitlines()
    assert table[0].split()[-3:] == ["M=1", "M=64", "M=1024"]
    assert table[2].split() == ["Mixtral-8x7B", "1.00x", "1.00x", "1.10x"]      # the series' model order
    assert table[3].startswith("DeepSeek-V3")
    with pytest.raises(ValueError, match="no M where both 'minimal' and 'loop' were timed"):
        bench_report.gain_range(rows, "first", "minimal", "loop")
    line = bench_report.gain_line(rows, "first", "+tuned", "+tma")
    assert line.startswith("M <= 256: 1.00x to 1.00x; M > 256: 1.10x to 1.10x; most 1.10x, ")
    assert line.endswith("at M = 1024")
    wide = bench_report.gain_line(rows, "first", "+tuned", "+tma", split=1024)
    assert wide.startswith("M <= 1024: 1.00x to 1.10x; most")
    with pytest.raises(ValueError, match="no M where both 'minimal' and 'loop' were timed"):
        bench_report.gain_line(rows, "first", "minimal", "loop")
    skipped = bench_rows({"minimal": 0.5, "+grouped": 0.5}, ("Mixtral-8x7B",), (1, 8),
                         skipped={("+grouped", "Mixtral-8x7B", 8)})
    assert list(bench_report.step_gains(skipped, "first", "minimal", "+grouped")) == [("Mixtral-8x7B", 1)]


def test_tuned_config_reads_the_shipped_table():
    import json

    from moe_tutorial.kernels.configs import SHIPPED_DIR, KernelConfig

    table = json.loads((SHIPPED_DIR / "tuned_configs_h200.json").read_text())["NVIDIA H200"]
    key = "E=8,N=28672,K=4096,topk=2,dtype=bfloat16,variant=plain"
    for M, config in table[key].items():
        assert bench_report.tuned_config("Mixtral-8x7B", int(M)) == KernelConfig(**config)
    gated = table["E=8,N=14336,K=4096,topk=2,dtype=bfloat16,variant=gated"]["1024"]
    assert bench_report.tuned_config("Mixtral-8x7B", 1024, "gated") == KernelConfig(**gated)
    with pytest.raises(ValueError, match="^M: expected a batch size the shipped table holds"):
        bench_report.tuned_config("Mixtral-8x7B", 3)


def test_same_kernel_pairs_follow_the_tuned_table():
    """Mixtral's tuned plain GEMM at M = 1: BLOCK_M 16, no TMA; at 1024: BLOCK_M 128 with TMA."""
    first = bench_rows({"+tuned": 0.5, "+tma": 0.51, "sorted": 0.5}, ("Mixtral-8x7B",), (1, 1024))
    layer = bench_rows({"+silu-epilogue": 0.5, "+decode-align": 0.55}, ("Mixtral-8x7B",), (8, 64), gemm="layer")
    pairs = bench_report.same_kernel_pairs(first + layer)
    assert [(p["gemm"], p["M"], p["impls"]) for p in pairs] == [
        ("first", 1, ("+tuned", "+tma")), ("first", 1, ("+tma", "sorted")),
        ("layer", 64, ("+silu-epilogue", "+decode-align"))]   # M = 8: 16 pairs, the one-launch alignment differs
    assert pairs[0]["ratio"] == pytest.approx(0.51 / 0.5) and pairs[2]["ratio"] == pytest.approx(0.55 / 0.5)
    assert bench_report.spread_percent(pairs, "first") == pytest.approx(2.0)
    assert bench_report.spread_percent(pairs, "layer") == pytest.approx(10.0)
    assert bench_report.spread_percent(pairs) == pytest.approx(10.0)
    with pytest.raises(ValueError, match="^pairs: none for gemm='layer'"):
        bench_report.spread_percent(pairs[:2], "layer")
    table = bench_report.same_kernel_table(pairs).splitlines()
    assert "step 2 = step 3" in table[2] and "step 3 = step 4" in table[3] and "step 2 = step 3" in table[4]
    assert table[2].split()[-1] == "1.020"


def test_headline_ceilings_come_from_one_run(part4_rows):
    rows = [dict(r, read_tbps=4.5, read_measured_tbps=4.4, launch_us=3.0, protocol="cold-l2", date="d1")
            for r in part4_rows]
    ceilings = bench_report.headline_ceilings(rows)
    assert ceilings == {"protocol": "cold-l2", "date": "d1", "read_tbps": 4.5, "read_measured_tbps": 4.4,
                        "copy_tbps": 4.0, "matmul_tflops": 600.0, "launch_us": 3.0}
    assert bench_report.headline_ceilings(rows, "grouped_mm")["read_tbps"] == 4.5
    two_runs = rows + [dict(rows[0], date="d2", read_tbps=4.6, M=2)]
    with pytest.raises(ValueError, match="^rows: expected the rows of 'sorted' to come from one run"):
        bench_report.headline_ceilings(two_runs)
    with pytest.raises(ValueError, match="got 0 runs"):
        bench_report.headline_ceilings(rows, "loop")


def test_summary_table_pairs_the_gemm_with_the_layer(tmp_path):
    first = bench_rows({"sorted": 0.8, "grouped_mm": 0.5}, ("Mixtral-8x7B",), (1, 64),
                       skipped={("grouped_mm", "Mixtral-8x7B", 64)})
    layer = bench_rows({"sorted": 0.6}, ("Mixtral-8x7B",), (1, 64), gemm="layer")
    table = bench_report.summary_table(via_csv(tmp_path, first + layer), ("sorted", "grouped_mm", "loop"),
                                       labels=LABELS).splitlines()
    assert table[0].split() == ["gate/up", "GEMM", "/", "whole", "layer", "Mixtral-8x7B"]
    assert table[2].endswith("0.80 / 0.60") and table[2].startswith("Part 4, tuned")
    assert table[3].endswith("0.50 (1/2 M) / -")
    assert table[4].endswith("- / -")


def test_protocol_table_and_speedups(part4_rows):
    cold = [dict(r, protocol="cold-l2") for r in part4_rows]
    rotated = [dict(r, protocol="rotated", fraction_of_floor=r["fraction_of_floor"] and r["fraction_of_floor"] / 2)
               for r in part4_rows if r["impl"] == "sorted"]
    lines = bench_report.protocol_table(cold + rotated, ("sorted", "grouped_mm"), labels=LABELS).splitlines()
    assert [line.split()[-3] for line in lines[2:]] == ["cold-l2", "rotated", "cold-l2"]
    g = (0.8 * 0.4 * 1.0) ** (1 / 3)
    assert lines[2].split()[-2:] == [f"{g:.2f}"] * 2 and lines[3].split()[-2:] == [f"{g / 2:.2f}"] * 2
    speed = bench_report.speedup_geomeans(part4_rows, "first", "sorted", "grouped_mm")
    # grouped_mm's time over sorted's: 0.8/0.5 and 0.4/0.25 at M = 1 and 64, 1.0 at 4096 (Mixtral skipped it)
    assert speed["DeepSeek-V3"] == pytest.approx((1.6 * 1.6 * 1.0) ** (1 / 3))
    assert speed["Mixtral-8x7B"] == pytest.approx(1.6)
    assert bench_report.fraction_range(part4_rows, "first", "sorted", Ms=(1, 64)) == pytest.approx((0.4, 0.8))
    with pytest.raises(ValueError, match="no timed 'loop' rows"):
        bench_report.fraction_range(part4_rows, "first", "loop")


def test_run_tables_and_skips(part3_rows):
    rows = [dict(r, date="2026-01-02", protocol="cold-l2", read_tbps=4.5, launch_us=3.0) for r in part3_rows]
    rows += [dict(r, date="2026-01-03", protocol="rotated", read_tbps=4.6, launch_us=0.5)
             for r in part3_rows if r["impl"] == "sorted"]
    ceilings = bench_report.ceilings_table(rows).splitlines()
    assert ceilings[2].split() == ["2026-01-02", "cold-l2", "-", "4.50", "4.00", "600", "3.0", "Part", "1,", "Part",
                                   "3,", "Part", "4"]
    assert ceilings[3].split()[:7] == ["2026-01-03", "rotated", "-", "4.60", "4.00", "600", "0.5"]
    raised = [dict(r, read_measured_tbps=4.4) for r in rows]
    assert bench_report.ceilings_table(raised).splitlines()[2].split()[2:4] == ["4.40", "4.50"]
    summary = bench_report.run_summary(rows, labels=LABELS).splitlines()
    assert summary[0].startswith("run of 2026-01-02 (cold-l2): ") and "Mixtral-8x7B, DeepSeek-V3" in summary[0]
    assert summary[1] == "  timed: Part 1, loop; Part 3, as published; Part 3, fixed; Part 4, tuned"
    skipped = bench_report.skipped_table(part3_rows, labels=LABELS).splitlines()
    assert [line.split()[:4] for line in skipped[2:]] == [["Part", "1,", "loop", "gate/up"]] * 2
    assert "Mixtral-8x7B" in skipped[2] and "DeepSeek-V3" in skipped[3] and skipped[2].rstrip().endswith("made up")
    big = [dict(part3_rows[0], status="skipped: its [M, topk, N, K] intermediate needs 52.0 GB, more than 33%")]
    assert bench_report.skipped_table(big).splitlines()[2].endswith(
        "its [M, topk, N, K] intermediate does not fit in memory")
