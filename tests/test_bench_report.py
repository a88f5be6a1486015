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
    assert "Part 3, as published: wrong result" in [t.get_text() for t in labels]


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
    assert "Part 3, as published: wrong result" in [t.get_text() for t in fig.legends[0].get_texts()]
    with pytest.raises(ValueError, match="metric"):
        perf.plot_across_models(rows, ["custom"], "first", "speed")
    with pytest.raises(ValueError, match="no timed results"):
        perf.plot_roofline(rows, "custom", "layer")
    ai = perf.intensity(ModelShape("m", 8, 2, 4096, 14336), [1, 16384])
    assert ai[0] < 2 < 150 < ai[1]                        # decode: ~1 FLOP/byte; prefill: far above the ridge
    fig = perf.plot_intensity([SMALL], copy_tbps=4.0, matmul_tflops=600.0)
    curve = next(line for line in fig.axes[0].get_lines() if line.get_label().startswith("custom (E=6, topk=2)"))
    assert curve.get_xdata()[0] == 1 and curve.get_xdata()[-1] == 16384
    assert np.allclose(curve.get_ydata(), perf.intensity(SMALL, curve.get_xdata()))
    assert [150.0, 150.0] in [list(line.get_ydata()) for line in fig.axes[0].get_lines()]     # the ridge
    assert any(t.get_text().startswith("ridge: 150 FLOP/byte") for t in fig.axes[0].texts)
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
