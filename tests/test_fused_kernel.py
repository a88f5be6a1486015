"""Part 3's fixed kernel (moe_tutorial.kernels.fused_kernel) against the float64 reference.

Each fix the issue lists has a test here: any topk (3, 5, 6, 7 included), int64 offsets
(DeepSeek-V3 on the GPU), N and K that are not multiples of the blocks, non-contiguous
inputs, fp16/bf16 with fp32 accumulation (GPU). CPU runs use the interpreter, fp32 only.
"""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

import random

import pytest
import torch

from moe_tutorial import runtime
from moe_tutorial.examples import worked_example
from moe_tutorial.kernels.fused_kernel import fused_moe_matmul
from moe_tutorial.indexing import indexing_moe_matmul
from moe_tutorial.layer import moe_layer
from moe_tutorial.loop import loop_moe_matmul
from moe_tutorial.kernels.published_kernel import published_fused_moe_matmul
from moe_tutorial.reference import reference_moe_layer, reference_moe_matmul, rel_error, tolerance
from moe_tutorial.shapes import get_shape, random_problem, random_topk_ids

DEV = runtime.DEVICE
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def check(out, x, weight, topk_ids, dtype=torch.float32):
    err = rel_error(out, reference_moe_matmul(x, weight, topk_ids))
    assert err < tolerance(dtype), f"relative error {err:.3g}"


def poisoned(shape, dtype=torch.float32):
    """An output buffer full of NaN, so any element the kernel forgets shows up."""
    return torch.full(shape, float("nan"), dtype=dtype, device=DEV)


# ---------------------------------------------------------------------------------------
# Random shapes: every topk from 1 to 8, odd N and K, E up to 64, both id dtypes.

def random_case(seed: int, topk: int):
    rng = random.Random(seed)
    E = rng.randint(topk, 64)
    M, N, K = rng.randint(1, 5), rng.randrange(1, 71, 2), rng.randrange(1, 71, 2)   # odd N, K
    block_n, block_k = rng.choice([4, 8, 16, 32]), rng.choice([8, 16, 32, 64])
    ids_dtype = rng.choice([torch.int32, torch.int64])
    return M, N, K, E, block_n, block_k, ids_dtype


@pytest.mark.parametrize("topk", range(1, 9))
@pytest.mark.parametrize("seed", [0, 1])
def test_random_shapes_match_reference(topk, seed):
    M, N, K, E, block_n, block_k, ids_dtype = random_case(100 * topk + seed, topk)
    x, weight, ids = random_problem(M, N, K, E, topk, device=DEV, seed=seed)
    ids = ids.to(ids_dtype)
    out = fused_moe_matmul(x, weight, ids, block_n=block_n, block_k=block_k, out=poisoned((M, topk, N)))
    check(out, x, weight, ids)


def test_blocks_wider_than_the_problem():
    """N = K = 1 with 32-wide blocks: almost every lane is masked off."""
    x, weight, ids = random_problem(3, 1, 1, 5, 3, device=DEV, seed=7)
    check(fused_moe_matmul(x, weight, ids, block_n=32, block_k=32), x, weight, ids)


def test_default_blocks_many_k_steps():
    """K = 300 with BLOCK_K = 16: the K loop runs 19 times, the last one partial."""
    x, weight, ids = random_problem(2, 40, 300, 6, 2, device=DEV, seed=8)
    check(fused_moe_matmul(x, weight, ids, block_k=16), x, weight, ids)


# ---------------------------------------------------------------------------------------
# Strides are passed, not assumed.

def test_noncontiguous_inputs():
    M, N, K, E, topk = 4, 21, 19, 9, 3
    g = torch.Generator().manual_seed(3)
    x = torch.randn(K, M, generator=g).to(DEV).T                                      # transposed
    weight = torch.randn(E, K, 2 * N, generator=g).to(DEV).permute(0, 2, 1)[:, ::2]   # permuted, strided
    ids = random_topk_ids(M, E, topk, generator=g, device=DEV, dtype=torch.int64)
    ids = torch.stack([ids, torch.zeros_like(ids)], dim=-1)[..., 0]                   # stride 2 on topk
    assert not (x.is_contiguous() or weight.is_contiguous() or ids.is_contiguous())
    check(fused_moe_matmul(x, weight, ids, block_n=8, block_k=8), x, weight, ids)


def test_expert_ids_transposed_view():
    x, weight, ids = random_problem(5, 12, 10, 7, 3, device=DEV, seed=4)
    ids_t = ids.T.contiguous().T                                                       # column-major
    assert ids_t.stride() == (1, 5)
    check(fused_moe_matmul(x, weight, ids_t, block_n=4, block_k=8), x, weight, ids)


def test_out_view_is_filled_and_nothing_else_is_touched():
    """A strided ``out=``: every element of the view written, the gaps left as they were."""
    M, N, K, E, topk = 3, 10, 12, 6, 3
    x, weight, ids = random_problem(M, N, K, E, topk, device=DEV, seed=5)
    buffer = poisoned((M, 2 * N, topk))
    view = buffer.permute(0, 2, 1)[:, :, ::2]                                          # [M, topk, N]
    out = fused_moe_matmul(x, weight, ids, block_n=4, block_k=8, out=view)
    assert out.data_ptr() == view.data_ptr()
    check(out, x, weight, ids)
    assert torch.isnan(buffer.permute(0, 2, 1)[:, :, 1::2]).all()


@pytest.mark.parametrize("make, match", [
    (lambda: poisoned((3, 1, 10)).expand(3, 3, 10), r"^out: expected a buffer whose elements do not overlap"),
    (lambda: poisoned((3, 10, 1)).expand(3, 10, 3).transpose(1, 2), r"got strides \(10, 0, 1\) for shape"),
    (lambda: poisoned((3, 3, 10)).transpose(0, 1), None),
], ids=["expanded-slots", "expanded-topk-dim", "transposed-is-fine"])
def test_out_whose_elements_alias_is_refused(make, match):
    """Every write to an address but the last would be lost: torch refuses such in-place writes too."""
    M, N, K, E, topk = 3, 10, 12, 6, 3
    x, weight, ids = random_problem(M, N, K, E, topk, device=DEV, seed=5)
    out = make()
    if match is None:
        check(fused_moe_matmul(x, weight, ids, out=out), x, weight, ids)
        return
    with pytest.raises(ValueError, match=match):
        fused_moe_matmul(x, weight, ids, out=out)


def test_out_sharing_memory_with_x_is_refused():
    M, N, K, E, topk = 2, 4, 12, 6, 2
    x, weight, ids = random_problem(M, N, K, E, topk, device=DEV, seed=5)
    out = x.view(M, topk, N + 2)[:, :, :N]          # x's own memory: the kernel would read what it wrote
    with pytest.raises(ValueError, match=r"^out: expected a buffer of its own, got one that shares memory with x"):
        fused_moe_matmul(x, weight, ids, out=out)


# ---------------------------------------------------------------------------------------
# The series' worked example and the other parts.

def test_article_worked_example_exactly():
    """The article's test: its inputs, BLOCK_N = BLOCK_K = 2, its expected output, bit for bit."""
    ex = worked_example(device=DEV)
    out = fused_moe_matmul(ex.x, ex.weight, ex.topk_ids, block_n=2, block_k=2, out=poisoned((2, 2, 2)))
    assert torch.equal(out, ex.first_gemm)
    assert torch.equal(fused_moe_matmul(ex.x, ex.weight, ex.topk_ids), ex.first_gemm)


def test_agrees_with_parts_1_and_2():
    x, weight, ids = random_problem(6, 33, 45, 12, 6, device=DEV, seed=9)
    out = fused_moe_matmul(x, weight, ids, block_n=16, block_k=16)
    for other in (loop_moe_matmul(x, weight, ids), indexing_moe_matmul(x, weight, ids)):
        assert rel_error(out, other.double()) < 1e-5


def test_real_shape_deepseek_v2_lite_topk6():
    """DeepSeek-V2-Lite's first GEMM (N = 2816, K = 2048, topk = 6); 8 experts and wide blocks keep it quick on CPU."""
    shape = get_shape("DeepSeek-V2-Lite")
    N, K = shape.first_gemm
    x, weight, ids = random_problem(1, N, K, 8, shape.topk, device=DEV, seed=10)
    check(fused_moe_matmul(x, weight, ids, block_n=256, block_k=256), x, weight, ids)


def test_layer_fused_matches_reference():
    M, K, inter, E, topk = 5, 24, 10, 8, 3
    g = torch.Generator().manual_seed(11)
    x = torch.randn(M, K, generator=g).to(DEV)
    w13 = (torch.randn(E, 2 * inter, K, generator=g) * K ** -0.5).to(DEV)
    w2 = (torch.randn(E, K, inter, generator=g) * inter ** -0.5).to(DEV)
    weights, ids = moe_tutorial.route(torch.randn(M, E, generator=g).to(DEV), topk)
    y = moe_layer(x, w13, w2, weights, ids, impl="fused")
    assert rel_error(y, reference_moe_layer(x, w13, w2, weights, ids)) < 1e-5


def test_layer_fused_worked_example():
    ex = worked_example(device=DEV)
    y = moe_layer(ex.x, ex.w13, ex.w2, ex.topk_weights, ex.topk_ids, impl="fused")
    assert torch.allclose(y, ex.layer, atol=1e-4, rtol=0)


# ---------------------------------------------------------------------------------------
# Bad inputs and edge cases.

@pytest.mark.skipif(runtime.ON_GPU, reason="bf16 is accepted on a GPU")
def test_bf16_on_cpu_is_refused_naming_x():
    ex = worked_example()
    with pytest.raises(TypeError, match=r"^x: .*bfloat16"):
        fused_moe_matmul(ex.x.bfloat16(), ex.weight.bfloat16(), ex.topk_ids)


@pytest.mark.parametrize("name,value", [("block_n", 3), ("block_k", 12), ("block_n", -4)])
def test_block_sizes_must_be_powers_of_two(name, value):
    ex = worked_example(device=DEV)
    with pytest.raises(ValueError, match=rf"{name}: expected a power of two, got {value}"):
        fused_moe_matmul(ex.x, ex.weight, ex.topk_ids, **{name: value})


def test_bad_shapes_and_ids_are_named():
    ex = worked_example(device=DEV)
    with pytest.raises(ValueError, match="^weight: "):
        fused_moe_matmul(ex.x, ex.weight[:, :, :2], ex.topk_ids)
    with pytest.raises(ValueError, match=r"^topk_ids: expected expert ids in \[0, 4\)"):
        fused_moe_matmul(ex.x, ex.weight, ex.topk_ids + 2)
    with pytest.raises(ValueError, match="^out: "):
        fused_moe_matmul(ex.x, ex.weight, ex.topk_ids, out=poisoned((2, 2, 3)))


def test_empty_batch():
    x, weight, ids = random_problem(0, 8, 8, 4, 2, device=DEV)
    out = fused_moe_matmul(x, weight, ids)
    assert out.shape == (0, 2, 8)


def test_zero_k_gives_zeros():
    x, weight, ids = random_problem(2, 8, 0, 4, 2, device=DEV)
    assert torch.equal(fused_moe_matmul(x, weight, ids), torch.zeros(2, 2, 8, device=DEV))


@pytest.mark.parametrize("bad, kind", [(0, ValueError), (2.0, TypeError), (True, TypeError)])
def test_block_sizes_zero_or_not_int_are_rejected(bad, kind):
    """0 must not silently mean "use the default"; floats and bools are not block sizes (not ints at all)."""
    x, weight, ids = random_problem(2, 8, 8, 4, 2, device=DEV)
    with pytest.raises(kind, match="block_n: expected a"):
        fused_moe_matmul(x, weight, ids, block_n=bad)


# ---------------------------------------------------------------------------------------
# GPU only: half precision with fp32 accumulation, and offsets past 2^31.

@pytest.mark.parametrize("model", ["DeepSeek-V2-Lite", "Qwen1.5-MoE-A2.7B"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.gpu
@requires_cuda
def test_half_precision_real_shapes(model, dtype):
    shape = get_shape(model)
    N, K = shape.first_gemm
    x, weight, ids = random_problem(77, N, K, shape.num_experts, shape.topk, dtype=dtype, device="cuda", seed=12)
    out = fused_moe_matmul(x, weight, ids, out=poisoned((77, shape.topk, N), dtype))
    assert out.dtype == dtype
    check(out, x, weight, ids, dtype)


@pytest.mark.gpu
@requires_cuda
def test_deepseek_v3_offsets_past_2_to_the_31():
    """E = 256, N = 4096, K = 7168 in bf16: 7.5e9 weight elements, more than int32 can address.

    Tokens go to experts 147..219, whose int32 offset wraps to somewhere inside the tensor
    (other experts wrap below it, which could fault): the published kernel reads the wrong
    expert and is wrong; the fixed kernel, with int64 offsets, is right. Needs ~16 GB.
    """
    shape = get_shape("DeepSeek-V3")
    N, K = shape.first_gemm
    E, topk = shape.num_experts, shape.topk
    assert E * N * K > 2 ** 31
    g = torch.Generator(device="cuda").manual_seed(13)
    weight = torch.randn(E, N, K, generator=g, device="cuda", dtype=torch.bfloat16).mul_(K ** -0.5)
    x = torch.randn(4, K, generator=g, device="cuda", dtype=torch.bfloat16)
    ids = torch.stack([torch.randperm(73, generator=g, device="cuda")[:topk] + 147 for _ in range(4)]).int()
    ref = reference_moe_matmul(x, weight, ids)
    assert rel_error(fused_moe_matmul(x, weight, ids), ref) < 1e-2
    assert rel_error(published_fused_moe_matmul(x, weight, ids), ref) > 0.5
    # Experts that wrap below the tensor (74..146, 220..255) are right in the fixed kernel too.
    low = torch.tensor([[74, 100, 146, 220, 230, 255, 0, 73]], device="cuda", dtype=torch.int32)
    check(fused_moe_matmul(x[:1], weight, low), x[:1], weight, low, torch.bfloat16)
