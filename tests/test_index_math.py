"""Python copies of the kernels' index arithmetic, checked against what the kernels really do.

The figures and the exercise checkers redo a kernel's index arithmetic in plain Python (which
program writes which columns, which tile a program id takes). Here each copy is compared with
the accesses the kernel itself makes, traced program by program in Triton's interpreter
(:func:`moe_tutorial.kernels.interpreter.trace_program`), so a kernel change cannot silently
leave a figure or a checker wrong.
"""
import moe_tutorial as mt
from moe_tutorial import runtime
from moe_tutorial.exercises.part3 import _expected_columns
from moe_tutorial.figures import part3
from moe_tutorial.kernels.configs import KernelConfig
from moe_tutorial.kernels.interpreter import trace_program
from moe_tutorial.kernels.sorted_kernel import pid_to_tile
from moe_tutorial.shapes import random_problem

import pytest
import torch

pytestmark = pytest.mark.skipif(not runtime.INTERPRETED, reason="traces kernels in the interpreter")


def fused_stores(x, weight, ids, block_n, program):
    """``(out offsets, weight offsets of the first K step)`` of one program of the fused kernel."""
    accesses = trace_program(lambda: mt.fused_moe_matmul(x, weight, ids, block_n=block_n, block_k=16), program)
    (store,) = [a for a in accesses if a.op == "store"]
    first_w = next(a for a in accesses if a.op == "load" and a.arg == "w_ptr")
    return store, first_w


@pytest.mark.parametrize("topk,N,block_n", [(2, 10, 4), (3, 7, 4), (1, 5, 8)])
def test_figures_program_columns_are_the_fused_kernels(topk, N, block_n):
    M, K, E = 3, 20, 5
    x, weight, ids = random_problem(M, N, K, E, topk, seed=topk + N)
    out_strides = (topk * N, N, 1)                 # the launcher's contiguous [M, topk, N] output
    for pid_m in range(M):
        for pid_n in range(-(-N // block_n)):
            store, w_load = fused_stores(x, weight, ids, block_n, (pid_m, pid_n))
            cols = part3.program_columns(ids, pid_m, pid_n, N, block_n)
            assert store.mask.tolist() == [c.valid for c in cols]
            expected = [pid_m * out_strides[0] + c.topk_idx * out_strides[1] + c.n_global * out_strides[2]
                        for c in cols if c.valid]
            assert store.active().tolist() == expected
            # The column's expert: the weight row block its first K step reads from.
            experts = (w_load.offsets[0] // weight.stride(0)).tolist()
            assert [e for e, c in zip(experts, cols) if c.valid] == [c.expert for c in cols if c.valid]


@pytest.mark.parametrize("topk,N,block_n", [(2, 10, 4), (4, 8, 2)])
def test_exercise_column_layout_is_the_fused_kernels(topk, N, block_n):
    """3.1's expected (slot, column) per lane, for a power-of-two topk (no padding lanes)."""
    slots, columns = _expected_columns(N, topk, block_n)
    ids = torch.arange(topk, dtype=torch.int32)[None, :].expand(1, topk).contiguous()
    for pid_n in range(-(-N // block_n)):
        cols = part3.program_columns(ids, 0, pid_n, N, block_n)
        assert slots[pid_n].tolist() == [c.topk_idx if c.valid else -1 for c in cols]
        assert columns[pid_n].tolist() == [c.n_global if c.valid else -1 for c in cols]


@pytest.mark.parametrize("group_m", [1, 2, 3])
def test_pid_to_tile_is_the_sorted_kernels_order(group_m):
    """Each program's stored rows and columns give its (pid_m, pid_n); pid_to_tile must agree."""
    M, N, K, E, topk = 12, 40, 32, 3, 2
    x, weight, ids = random_problem(M, N, K, E, topk, seed=group_m)
    config = KernelConfig(block_m=16, block_n=16, block_k=32, group_m=group_m, num_warps=4, num_stages=1)
    alignment = mt.align_block_size(ids, config.block_m, E)
    sorted_ids = alignment[0].tolist()
    num_pid_m, num_pid_n = -(-len(sorted_ids) // config.block_m), -(-N // config.block_n)
    checked = 0
    for pid in range(num_pid_m * num_pid_n):
        accesses = trace_program(lambda: mt.sorted_moe_matmul(x, weight, ids, config=config, alignment=alignment),
                                 (pid,))
        stores = [a for a in accesses if a.op == "store"]
        if not stores:               # a block past the last padded row: the program returns at once
            continue
        offsets = stores[0].active()
        pairs, cols = offsets // N, offsets % N          # the output is [M * topk, N], contiguous
        pid_m = {sorted_ids.index(int(p)) // config.block_m for p in pairs}
        pid_n = {int(c) // config.block_n for c in cols}
        assert (pid_m.pop(), pid_n.pop()) == pid_to_tile(pid, num_pid_m, num_pid_n, group_m)
        assert not pid_m and not pid_n                   # one tile per program
        checked += 1
    assert checked >= num_pid_n * 2                      # several row blocks were really checked
