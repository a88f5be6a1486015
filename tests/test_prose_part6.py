"""Notebook 06's reading of the two-H200 results states the numbers the committed data gives."""
from moe_tutorial.parallel import results

import pytest
from prose import assert_says, fmt2

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
    one = results.load(results.H200X1_GRAPHS)
    assert one is not None and {r["world"] for r in one} == {1} and {r["gpu"] for r in one} == {"NVIDIA H200"}
    ms = {(r["method"], r["model"], r["M"]): r["ms"] for r in results.ok_rows(one, step="dispatch")}
    new = [v for (m, *_), v in ms.items() if m == "all_gather"]
    old = [v for (m, *_), v in ms.items() if m == "all_to_all"]
    sizes = sorted({M for (_, _, M) in ms})
    assert max(new) < min(old)                     # every new dispatch beats every old one
    assert_says(P6, "Dispatch takes {:.3f} to {:.2f} ms at M = {} to {} against the old exchange's {:.2f} to {:.2f} ms",
                min(new), max(new), sizes[0], sizes[-1], min(old), max(old))
    checks = [r for r in one if r["step"].startswith("check")]
    assert_says(P6, "routing ({} of {} checks)", sum(r["status"] == "ok" for r in checks), len(checks))
    assert results.load(results.H200X2_GRAPHS) is None, "two-GPU data arrived: write notebook 06's verdict"
