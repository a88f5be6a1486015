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
    assert_says(P6, "At `M = 1` the EP layer takes {:.2f} ms against {:.2f} ms for one GPU running both ranks' "
                    "tokens: its dispatch alone takes {:.2f} ms, while an all-to-all of the same bytes takes "
                    "{:.2f} ms", ms(rows, m, "ep_layer", 1), ms(rows, m, "single_gpu", 1), ms(rows, m, "dispatch", 1),
                ms(rows, m, "a2a_same_bytes", 1))


def test_prefill_speedups(rows):
    sp = {m: ms(rows, m, "single_gpu", 16384) / ms(rows, m, "ep_layer", 16384) for m in ("Mixtral-8x7B", "DeepSeek-V3")}
    assert_says(P6, "At `M = 16384` tokens per rank two GPUs run the layer {}x (Mixtral-8x7B) and {}x "
                    "(DeepSeek-V3) as fast as one", fmt2(sp["Mixtral-8x7B"]), fmt2(sp["DeepSeek-V3"]))
    tp_faster = [M for M in (1, 8, 64, 256, 1024, 4096, 16384)
                 if ms(rows, "Mixtral-8x7B", "tp_layer", M) < ms(rows, "Mixtral-8x7B", "ep_layer", M)]
    assert len(tp_faster) == 7
    assert_says(P6, "On Mixtral-8x7B the tensor-parallel layer is faster than ours at every M measured")
