"""kernels/interpreter.py: tracing one program of an interpreted kernel."""
import moe_tutorial as mt
from moe_tutorial import runtime
from moe_tutorial.kernels.interpreter import trace_program

import pytest
import torch

pytestmark = pytest.mark.skipif(not runtime.INTERPRETED, reason="traces the CPU interpreter")


def test_trace_gives_the_fused_kernels_gather_offsets(worked):
    """Token 1 of the worked example chose experts 2 and 3: its weight loads are those experts' rows."""
    accesses = trace_program(lambda: mt.fused_moe_matmul(worked.x, worked.weight, worked.topk_ids,
                                                         block_n=2, block_k=2), (1, 0))
    w_loads = [a for a in accesses if a.op == "load" and a.arg == "w_ptr"]
    E, N, K = worked.weight.shape
    stride_e, stride_n, stride_k = worked.weight.stride()
    expert = torch.tensor([2, 2, 3, 3])
    n = torch.tensor([0, 1, 0, 1])
    for step, load in enumerate(w_loads):
        k = torch.arange(2 * step, 2 * step + 2)
        grid = expert[None, :] * stride_e + n[None, :] * stride_n + k[:, None] * stride_k
        assert load.offsets.tolist() == grid.tolist()
        assert load.mask.tolist() == (k[:, None] < K).expand(2, 4).tolist()
    stores = [a for a in accesses if a.op == "store"]
    assert len(stores) == 1 and stores[0].arg == "out_ptr" and stores[0].active().tolist() == [4, 5, 6, 7]


def test_trace_refuses_a_program_outside_the_grid(worked):
    with pytest.raises(ValueError, match=r"^program: expected a program of the launch .* got \(2, 0, 0\)"):
        trace_program(lambda: mt.fused_moe_matmul(worked.x, worked.weight, worked.topk_ids, block_n=2, block_k=2),
                      (2, 0))
