"""moe_tutorial.experiments.profiling: launch counts that notebooks 01, 02 and 05 print, and memory measurements."""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

import sys

import pytest
import torch

from moe_tutorial.experiments import profiling
from moe_tutorial.indexing import indexing_moe_matmul, intermediate_bytes
from moe_tutorial.shapes import random_problem


def test_one_op_is_one_launch_and_views_are_none():
    a, b = torch.randn(4, 5), torch.randn(5, 3)
    assert profiling.count_launches(torch.mm, a, b).by_op == {"aten::mm": 1}
    views = profiling.count_launches(lambda t: t.view(-1)[:12].view(3, 4).t().unsqueeze(0).expand(2, 4, 3), a)
    assert views.launches == 0 and views.by_op == {}


def test_ops_inside_a_counted_op_count_once():
    """On the CPU ``index_add_`` calls other kernels; on a GPU it is one launch."""
    y, idx, src = torch.zeros(5, 3), torch.tensor([0, 2, 2]), torch.ones(3, 3)
    assert profiling.count_launches(y.index_add_, 0, idx, src).by_op == {"aten::index_add_": 1}


def test_syncs_are_where_and_item():
    t = torch.tensor([0, 3, 0, 5])
    count = profiling.count_launches(lambda: (torch.where(t == 0), t.sum().item()))
    assert count.syncs == 2
    assert count.by_op == {"aten::eq": 1, "aten::where": 1, "aten::sum": 1}


def test_loop_launches_grow_with_experts_and_indexing_does_not():
    loop = [profiling.layer_launches("loop", E, tokens=256) for E in (4, 8, 12)]
    indexing = [profiling.layer_launches("indexing", E, tokens=256) for E in (4, 8, 12)]
    per_four = loop[1].launches - loop[0].launches
    assert per_four >= 4 * 3, "at least a gather, a GEMM and a scatter per expert"
    assert loop[2].launches - loop[1].launches == per_four, "linear in E"
    assert loop[1].syncs - loop[0].syncs == loop[2].syncs - loop[1].syncs == 4, "one sync per expert"
    assert len({c.launches for c in indexing}) == 1 and indexing[0].launches < loop[0].launches


def test_counts_are_deterministic():
    first, second = (profiling.layer_launches("loop", 16, tokens=128, seed=3) for _ in range(2))
    assert first == second


def test_layer_problem_insists_every_expert_has_work():
    x, w13, w2, weights, ids = profiling.layer_problem(8, tokens=64, topk=2, hidden=6, inter=5)
    assert (x.shape, w13.shape, w2.shape, weights.shape) == ((64, 6), (8, 10, 6), (8, 6, 5), (64, 2))
    assert torch.unique(ids).tolist() == list(range(8))
    with pytest.raises(ValueError, match=r"^tokens: expected enough tokens for all 64 experts .*got 3 tokens"):
        profiling.layer_problem(64, tokens=3)


@pytest.mark.parametrize("M, topk, N, K, E", [(4, 2, 16, 8, 4), (9, 3, 7, 5, 6)])
def test_allocations_measure_the_intermediate_tensor(M, topk, N, K, E):
    x, weight, ids = random_problem(M, N, K, E, topk)
    allocated = profiling.allocations(indexing_moe_matmul, x, weight, ids)
    assert allocated["aten::index"] == intermediate_bytes(M, topk, N, K, itemsize=4)
    # The rest of the peak: the output and matmul's copy of x broadcast over topk.
    assert allocated["peak"] == allocated["aten::index"] + 4 * M * topk * (N + K)


def test_stderr_still_works_after_profiling(capfd):
    profiling.count_launches(torch.mm, torch.ones(2, 2), torch.ones(2, 2))
    print("still here", file=sys.stderr)
    assert "still here" in capfd.readouterr().err
