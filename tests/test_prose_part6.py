"""Notebook 06's reading of the two-H200 results states the numbers the committed data gives."""
from moe_tutorial.parallel import results

import pytest
from prose import assert_says, fmt2, markdown

P6 = "06_expert_parallel"


@pytest.fixture(scope="module")
def rows():
    rows = results.load()
    if rows is None:
        pytest.skip("the two-H200 results are not committed")
    return rows


def ms(rows, model, step, M):
    (row,) = results.ok_rows(rows, model=model, step=step, M=M)
    return row["ms"]


def test_decode_is_fixed_costs(rows):
    m = "Mixtral-8x7B"
    assert_says(P6, "On Mixtral-8x7B at `M = 1` the EP layer takes {:.2f} ms against {:.2f} ms for one GPU running "
                    "both ranks' tokens: its dispatch alone takes {:.2f} ms, while an all-to-all of the same bytes "
                    "takes {:.2f} ms", ms(rows, m, "ep_layer", 1), ms(rows, m, "single_gpu", 1),
                ms(rows, m, "dispatch", 1), ms(rows, m, "a2a_same_bytes", 1))


def test_prefill_speedups(rows):
    sp = {m: ms(rows, m, "single_gpu", 16384) / ms(rows, m, "ep_layer", 16384) for m in ("Mixtral-8x7B", "DeepSeek-V3")}
    assert_says(P6, "At `M = 16384` tokens per rank two GPUs run the layer {}x (Mixtral-8x7B) and {}x "
                    "(DeepSeek-V3) as fast as one", fmt2(sp["Mixtral-8x7B"]), fmt2(sp["DeepSeek-V3"]))
    tp_faster = [M for M in (1, 8, 64, 256, 1024, 4096, 16384)
                 if ms(rows, "Mixtral-8x7B", "tp_layer", M) < ms(rows, "Mixtral-8x7B", "ep_layer", M)]
    assert len(tp_faster) == 7
    assert_says(P6, "On Mixtral-8x7B the tensor-parallel layer is faster than ours at every M measured")


def test_the_collectives_hide_nothing(rows):
    """The layer's steps run one after another: at prefill its time is their sum, nothing overlaps."""
    m, M = "Mixtral-8x7B", 16384
    steps = [ms(rows, m, s, M) for s in ("dispatch", "experts", "combine")]
    assert sum(steps) == pytest.approx(ms(rows, m, "ep_layer", M), rel=0.02)
    assert_says(P6, "nothing hides the collectives, which run one after another: on Mixtral-8x7B dispatch, experts "
                    "and combine take {:.2f} + {:.2f} + {:.2f} ms, the layer {:.2f} ms.", *steps,
                ms(rows, m, "ep_layer", M))
    assert "hide part of their cost" not in markdown(P6)


def test_the_cost_model_states_its_error_and_its_fit(rows):
    from moe_tutorial.perf import report
    from moe_tutorial.perf import results as bench_results

    ceil = report.headline_ceilings(bench_results.load_rows())
    machine = results.measured_machine(rows, ceil["read_tbps"], ceil["matmul_tflops"])
    err = {(m, f): results.model_error(rows, m, machine, fitted=f) for m in ("Mixtral-8x7B", "DeepSeek-V3")
           for f in (False, True)}
    assert all(lo > 1 for (m, f), (lo, hi) in err.items() if not f)          # the ideal model: always optimistic
    assert all(hi / lo < 2.5 for (m, f), (lo, hi) in err.items() if f)       # fitted: within a factor of 2.5
    assert_says(P6, "Section 6's model (dotted) is too optimistic by {:.2f}x to {:.2f}x on Mixtral-8x7B and {:.2f}x "
                    "to {:.2f}x on DeepSeek-V3", *err["Mixtral-8x7B", False], *err["DeepSeek-V3", False])
    assert_says(P6, "within {:.2f}x to {:.2f}x of every measured layer on Mixtral-8x7B and {:.2f}x to {:.2f}x on "
                    "DeepSeek-V3", *err["Mixtral-8x7B", True], *err["DeepSeek-V3", True])
    assert_says(P6, "is too optimistic by up to {:.0f}x; fitted to them with four numbers, it is within {:.1f}x",
                max(hi for (_, f), (_, hi) in err.items() if not f),
                max(max(hi, 1 / lo) for (_, f), (lo, hi) in err.items() if f))


def test_the_ceilings_are_the_run_that_timed_part_4():
    import json

    from prose import NOTEBOOKS

    cells = json.loads((NOTEBOOKS / f"{P6}.ipynb").read_text())["cells"]
    (code,) = [c for c in cells if "H200 ceilings from the single-GPU benchmark run that timed Part 4"
               in "".join(c["source"])]
    assert "report.headline_ceilings(" in "".join(code["source"]) and "bench_rows[0]" not in "".join(code["source"])


def test_decode_times_name_their_protocol(rows):
    """06's 1-token times are eager (no CUDA graph); 05's are one graphed call: the prose says why they differ."""
    from moe_tutorial.perf import report
    from moe_tutorial.perf import results as bench_results

    bench = bench_results.load_rows(bench_results.H200_RESULTS)
    (layer,) = [r for r in report.subset(bench, "layer", impls=("sorted",), protocol="cold-l2")
                if r["model"] == "Mixtral-8x7B" and r["M"] == 1]
    assert ms(rows, "Mixtral-8x7B", "single_gpu", 1) > 3 * layer["ms"]
    assert "synchronize + barrier before each repetition" in rows[0]["protocol"]
    assert_says(P6, "(These times are not notebook 05's, where Part 4's whole layer takes {:.1f} us for one "
                    "Mixtral-8x7B token.", layer["ms"] * 1e3)
    assert_says(P6, "every repetition runs eagerly, after a synchronise and a barrier have left the GPU idle")


def test_dispatch_is_host_bound_whatever_the_bytes(rows):
    """Section 8 states the range of dispatch and of one all-to-all of the same bytes, M = 1 ... 1024."""
    m = "Mixtral-8x7B"
    sizes = (1, 8, 64, 256, 1024)
    disp = [ms(rows, m, "dispatch", M) for M in sizes]
    a2a = [ms(rows, m, "a2a_same_bytes", M) for M in sizes]
    assert max(a2a) < min(disp) / 5
    assert_says(P6, "On Mixtral-8x7B, from `M = 1` to `M = 1024` tokens per rank, dispatch takes {:.2f} to {:.2f} ms "
                    "while one all-to-all of the same bytes takes {:.2f} to {:.2f} ms", min(disp), max(disp),
                min(a2a), max(a2a))


def test_one_gpu_run_of_the_new_exchange():
    """Both exchanges' dispatch + combine, each under the timer it can have: the new one replayed
    from a CUDA graph, the old one eagerly (it waits on the host), and the prose says so."""
    one = results.load(results.H200X1_GRAPHS)
    assert one is not None and {r["world"] for r in one} == {1} and {r["gpu"] for r in one} == {"NVIDIA H200"}
    rows = results.ok_rows(one, step="dispatch_combine")
    ms = {(r["method"], r["model"], r["M"]): r["ms"] for r in rows}
    assert {r["protocol"].split(";")[0] for r in rows if r["method"] == "all_gather"} == {
        "cuda graph of one call, replayed"}
    assert {r["protocol"].split(";")[0] for r in rows if r["method"] == "all_to_all"} == {
        "eager call (it waits on the host)"}
    new = [v for (m, *_), v in ms.items() if m == "all_gather"]
    old = [v for (m, *_), v in ms.items() if m == "all_to_all"]
    sizes = sorted({M for (_, _, M) in ms})
    assert max(new) < min(old)                     # every new exchange beats every old one
    assert_says(P6, "Dispatch and combine take {:.3f} to {:.2f} ms at M = {} to {}, captured in a CUDA graph and "
                    "replayed, against the old exchange's {:.2f} to {:.2f} ms, timed eagerly", min(new), max(new),
                sizes[0], sizes[-1], min(old), max(old))
    checks = [r for r in one if r["step"].startswith("check")]
    assert_says(P6, "routing ({} of {} checks)", sum(r["status"] == "ok" for r in checks), len(checks))
    assert results.load(results.H200X2_GRAPHS) is None, "two-GPU data arrived: write notebook 06's verdict"
