"""The seed article's kernel as published (moe_tutorial.kernels.published_kernel): right where the article
tested it, and each fault the fixed kernel removes, shown to happen.

The real int32 overflow (DeepSeek-V3's 7.5e9-element weights) needs a GPU and lives in
test_fused_kernel.py; here the same wrap-around is shown on a tiny tensor, on any runtime.
"""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

import pytest
import torch

from moe_tutorial import runtime
from moe_tutorial.examples import worked_example
from moe_tutorial.kernels.fused_kernel import fused_moe_matmul
from moe_tutorial.kernels.published_kernel import int32_offset, published_fused_moe_kernel, published_fused_moe_matmul
from moe_tutorial.reference import reference_moe_matmul, rel_error
from moe_tutorial.shapes import get_shape, random_problem

DEV = runtime.DEVICE


def test_article_worked_example_exactly():
    """The article's own test: its inputs, BLOCK_N = BLOCK_K = 2, FUSED_N = 4, its output."""
    ex = worked_example(device=DEV)
    out = published_fused_moe_matmul(ex.x, ex.weight, ex.topk_ids, block_n=2, block_k=2)
    assert torch.equal(out, ex.first_gemm)


@pytest.mark.parametrize("topk", [1, 2, 4, 8])
def test_power_of_two_topk_is_right(topk):
    x, weight, ids = random_problem(3, 37, 45, 16, topk, device=DEV, seed=topk)
    out = published_fused_moe_matmul(x, weight, ids, block_n=8, block_k=16)
    assert rel_error(out, reference_moe_matmul(x, weight, ids)) < 1e-5


def raised_text(excinfo) -> str:
    """The error and its causes: the compiler wraps the ValueError that names arange."""
    texts, e = [], excinfo.value
    while e is not None:
        texts.append(str(e))
        e = e.__cause__
    return " | ".join(texts)


@pytest.mark.parametrize("topk", [3, 5, 6, 7])
def test_non_power_of_two_topk_does_not_compile(topk):
    """FUSED_N = topk * BLOCK_N is not a power of two, and tl.arange refuses it."""
    x, weight, ids = random_problem(2, 16, 16, 8, topk, device=DEV)
    with pytest.raises(Exception) as excinfo:
        published_fused_moe_matmul(x, weight, ids, block_n=8, block_k=16)
    assert "power of 2" in raised_text(excinfo)
    # The fixed kernel pads topk to the next power of two and masks the padding.
    out = fused_moe_matmul(x, weight, ids, block_n=8, block_k=16)
    assert rel_error(out, reference_moe_matmul(x, weight, ids)) < 1e-5


def test_deepseek_v2_lite_topk_does_not_compile():
    shape = get_shape("DeepSeek-V2-Lite")
    assert shape.topk == 6
    x, weight, ids = random_problem(1, 8, 8, shape.num_experts, shape.topk, device=DEV)
    with pytest.raises(Exception) as excinfo:
        published_fused_moe_matmul(x, weight, ids)
    assert "power of 2" in raised_text(excinfo)


def test_int32_offset_arithmetic_at_deepseek_v3():
    N, K = get_shape("DeepSeek-V3").first_gemm
    stride = N * K
    assert int32_offset(73, stride) == 73 * stride                 # the last expert still right
    assert int32_offset(74, stride) < 0                            # wraps below the tensor
    assert int32_offset(147, stride) == 147 * stride - 2 ** 32     # wraps into expert 0
    assert 0 <= int32_offset(219, stride) < 73 * stride
    assert int32_offset(220, stride) < 0


def test_int32_offsets_wrap_in_the_kernel():
    """Expert 4 at an expert stride of 2^30 should sit 2^32 elements in; in int32 that is 0.

    The kernel is launched by hand with that stride on a 2-expert tensor. With int32 ids the
    offset wraps to 0, so it reads expert 0, which is in bounds. (Only the wrap makes this
    safe: the true address is 16 GB away, so never launch the fixed kernel like this.)
    """
    N, K = 4, 8
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(2, N, K, generator=g).to(DEV)
    x = torch.randn(1, K, generator=g).to(DEV)
    ids = torch.tensor([[4]], dtype=torch.int32, device=DEV)
    out = torch.full((1, 1, N), float("nan"), device=DEV)
    stride_we = 2 ** 30
    assert int32_offset(4, stride_we) == 0
    published_fused_moe_kernel[(1, 1)](
        x, weight, ids, out, 1, K, N, 1,
        x.stride(0), x.stride(1), stride_we, weight.stride(1), weight.stride(2),
        ids.stride(0), ids.stride(1), out.stride(0), out.stride(1), out.stride(2),
        BLOCK_M=1, BLOCK_K=8, BLOCK_N=4, FUSED_N=4,
    )
    assert torch.allclose(out[0, 0], weight[0] @ x[0], rtol=1e-5, atol=1e-6)     # expert 0's answer


@pytest.mark.skipif(runtime.ON_GPU, reason="bf16 is accepted on a GPU")
def test_bf16_on_cpu_is_refused_naming_x():
    ex = worked_example()
    with pytest.raises(TypeError, match=r"^x: "):
        published_fused_moe_matmul(ex.x.bfloat16(), ex.weight.bfloat16(), ex.topk_ids)


def test_empty_batch():
    x, weight, ids = random_problem(0, 8, 8, 4, 2, device=DEV)
    assert published_fused_moe_matmul(x, weight, ids).shape == (0, 2, 8)


@pytest.mark.parametrize("bad", [0, 3])
def test_block_sizes_checked_like_the_fixed_kernel(bad):
    """The launcher shares the fixed kernel's block-size rules (our addition, not the article's)."""
    ex = worked_example(device=runtime.DEVICE)
    with pytest.raises(ValueError, match=f"block_k: expected a power of two, got {bad}"):
        published_fused_moe_matmul(ex.x, ex.weight, ex.topk_ids, block_k=bad)


def test_wrong_out_buffer_is_refused():
    ex = worked_example(device=runtime.DEVICE)
    with pytest.raises(ValueError, match=r"^out: expected shape \(2, 2, 2\)"):
        published_fused_moe_matmul(ex.x, ex.weight, ex.topk_ids, out=torch.zeros(2, 2, 3, device=runtime.DEVICE))


def test_out_whose_elements_alias_is_refused():
    ex = worked_example(device=runtime.DEVICE)
    out = torch.zeros(2, 1, 2, device=runtime.DEVICE).expand(2, 2, 2)    # both slots at one address
    with pytest.raises(ValueError, match=r"^out: expected a buffer whose elements do not overlap in memory"):
        published_fused_moe_matmul(ex.x, ex.weight, ex.topk_ids, out=out)
