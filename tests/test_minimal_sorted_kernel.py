"""Part 4's minimal sorted kernel: right on its own, and the same numbers as the production kernel."""
from moe_tutorial import reference_moe_matmul, rel_error, runtime, sorted_moe_matmul, worked_example
from moe_tutorial.kernels.minimal_sorted_kernel import minimal_sorted_moe_matmul
from moe_tutorial.reference import tolerance
from moe_tutorial.shapes import MODEL_SHAPES, random_problem

import pytest
import torch

DEVICE = runtime.DEVICE


def test_worked_example_exact():
    ex = worked_example(device=DEVICE)
    assert torch.equal(minimal_sorted_moe_matmul(ex.x, ex.weight, ex.topk_ids), ex.first_gemm)


@pytest.mark.parametrize("M,N,K,E,topk", [(1, 17, 45, 8, 2), (3, 33, 16, 4, 3), (5, 3, 7, 64, 6),
                                          (16, 24, 48, 2, 2), (9, 40, 70, 16, 8)])
def test_random_shapes_match_reference_and_production(M, N, K, E, topk):
    x, weight, ids = random_problem(M, N, K, E, topk, device=DEVICE, seed=M * N + K)
    out = minimal_sorted_moe_matmul(x, weight, ids)
    assert out.shape == (M, topk, N) and out.dtype == x.dtype
    assert rel_error(out, reference_moe_matmul(x, weight, ids)) < (1e-5 if runtime.INTERPRETED else 3e-3)
    # fp32 dots: IEEE in the interpreter and in the production kernel, TF32 in the minimal one on a GPU.
    assert rel_error(out, sorted_moe_matmul(x, weight, ids).double()) < (1e-6 if runtime.INTERPRETED else 3e-3)


def test_every_element_written_and_strides_respected():
    x, weight, ids = random_problem(6, 40, 64, 4, 2, device=DEVICE, seed=3)
    wt = weight.transpose(1, 2).contiguous().transpose(1, 2)      # same values, K no longer contiguous
    xt = x.t().contiguous().t()
    out = minimal_sorted_moe_matmul(xt, wt, ids)
    assert torch.isfinite(out).all()
    assert rel_error(out, reference_moe_matmul(x, weight, ids)) < (1e-5 if runtime.INTERPRETED else 3e-3)


@pytest.mark.parametrize("name,value", [("block_m", 8), ("block_n", 48)])
def test_block_sizes_are_checked(name, value):
    x, weight, ids = random_problem(2, 16, 16, 4, 2, device=DEVICE)
    with pytest.raises(ValueError, match=rf"^{name}: expected a power of two of at least 16 .*got {value!r}"):
        minimal_sorted_moe_matmul(x, weight, ids, **{name: value})
    with pytest.raises(TypeError, match=rf"^{name}: expected an int, got True$"):       # a bool is not a size
        minimal_sorted_moe_matmul(x, weight, ids, **{name: True})


def test_empty_batch():
    x, weight, ids = random_problem(0, 16, 16, 4, 2, device=DEVICE)
    assert minimal_sorted_moe_matmul(x, weight, ids).shape == (0, 2, 16)


@pytest.mark.gpu
@pytest.mark.skipif(not runtime.ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("model", list(MODEL_SHAPES))
def test_model_shapes_bf16_match_production(model):
    s = MODEL_SHAPES[model]
    N, K = s.first_gemm
    E = min(s.num_experts, 16)          # weights of a few experts are enough to exercise the shape
    x, weight, ids = random_problem(64, N, K, E, min(s.topk, E), device=DEVICE, dtype=torch.bfloat16, seed=1)
    out = minimal_sorted_moe_matmul(x, weight, ids)
    ref = reference_moe_matmul(x, weight, ids)
    assert rel_error(out, ref) < tolerance(torch.bfloat16)
    assert rel_error(out, sorted_moe_matmul(x, weight, ids).double()) < tolerance(torch.bfloat16)


def test_a_precomputed_alignment_must_fit():
    from moe_tutorial import align_block_size

    x, weight, ids = random_problem(4, 32, 32, 4, 2, device=DEVICE)
    good = align_block_size(ids, 16, 4)
    assert rel_error(minimal_sorted_moe_matmul(x, weight, ids, block_m=16, alignment=good),
                     reference_moe_matmul(x, weight, ids)) < (1e-5 if runtime.INTERPRETED else 3e-3)
    with pytest.raises(ValueError, match=r"^alignment: expected one built for block_m = 32, got one built for "
                                         r"block_m = 16"):
        minimal_sorted_moe_matmul(x, weight, ids, block_m=32, alignment=good)
