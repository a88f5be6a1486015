"""Part 4's last step: the persistent grid computes exactly the tiles of the one-program-per-tile grid.

In the interpreter a few programs walk the tile list (``INTERPRETER_PROGRAMS``), so every test
exercises the stride; the ``gpu`` tests run bf16 on the model shapes at prefill sizes, where the
persistent kernel is meant to run.
"""
from __future__ import annotations

import dataclasses

from moe_tutorial import reference_moe_layer, reference_moe_matmul, rel_error, route, runtime
from moe_tutorial.kernels.configs import KernelConfig, check_config, get_config
from moe_tutorial.kernels.persistent_kernel import INTERPRETER_PROGRAMS, persistent_grid
from moe_tutorial.kernels.sorted_layer import sorted_moe_layer, sorted_moe_matmul
from moe_tutorial.reference import tolerance
from moe_tutorial.shapes import MODEL_SHAPES, random_problem

import pytest
import torch

DEVICE = runtime.DEVICE
needs_gpu = pytest.mark.skipif(not runtime.ON_GPU, reason="needs a CUDA GPU")
PERSISTENT = [KernelConfig(block_m=16, block_n=16, block_k=16, group_m=1, num_warps=4, num_stages=2,
                           persistent=True, short_tails=False),
              KernelConfig(block_m=32, block_n=32, block_k=16, group_m=4, num_warps=4, num_stages=2,
                           persistent=True, short_tails=False)]


@pytest.mark.parametrize("config", PERSISTENT, ids=["16x16", "32x32-grouped"])
@pytest.mark.parametrize("M,N,K,E,topk", [(1, 17, 45, 8, 2), (7, 40, 70, 16, 8), (16, 24, 48, 2, 2),
                                         (24, 50, 33, 5, 1)])
def test_persistent_first_gemm_equals_the_reference(M, N, K, E, topk, config):
    x, weight, ids = random_problem(M, N, K, E, topk, device=DEVICE, seed=M + N)
    tw = torch.rand(M, topk, device=DEVICE)
    out = sorted_moe_matmul(x, weight, ids, tw, config=config)
    ref = reference_moe_matmul(x, weight, ids) * tw.double()[..., None]
    assert rel_error(out, ref) < tolerance(x.dtype)
    # The same tiles as the one-program-per-tile grid, to the bit.
    plain = dataclasses.replace(config, persistent=False)
    assert torch.equal(out, sorted_moe_matmul(x, weight, ids, tw, config=plain))


def test_persistent_layer_equals_the_reference():
    g = torch.Generator().manual_seed(3)
    M, K, inter, E, topk = 19, 48, 40, 6, 2
    x = torch.randn(M, K, generator=g).to(DEVICE)
    w13 = (torch.randn(E, 2 * inter, K, generator=g) * K ** -0.5).to(DEVICE)
    w2 = (torch.randn(E, K, inter, generator=g) * inter ** -0.5).to(DEVICE)
    tw, ids = route(torch.randn(M, E, generator=g).to(DEVICE), topk)
    out = sorted_moe_layer(x, w13, w2, tw, ids, configs=(PERSISTENT[0], PERSISTENT[0]))
    assert rel_error(out, reference_moe_layer(x, w13, w2, tw, ids)) < tolerance(x.dtype)


def test_grid_is_one_program_per_sm_at_most_the_tiles():
    assert persistent_grid(10_000, num_sms=132) == (132,)
    assert persistent_grid(7, num_sms=132) == (7,)
    assert persistent_grid(0, num_sms=132) == (1,)
    if runtime.INTERPRETED:         # a few programs, so that each walks several tiles
        assert persistent_grid(10_000) == (INTERPRETER_PROGRAMS,)


def test_persistent_is_a_flag():
    with pytest.raises(TypeError, match="persistent"):
        check_config(KernelConfig(block_m=64, block_n=64, block_k=64, persistent=1))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("M", [1024, 4096])
@pytest.mark.parametrize("model", ["Mixtral-8x7B", "Qwen3-30B-A3B", "DeepSeek-V3"])
def test_persistent_model_shapes_bf16(model, M):
    s = MODEL_SHAPES[model]
    E, K, inter = s.num_experts, s.hidden, s.intermediate
    g = torch.Generator(device="cuda").manual_seed(M)
    w13 = torch.randn(E, 2 * inter, K, device="cuda", dtype=torch.bfloat16, generator=g) * K ** -0.5
    w2 = torch.randn(E, K, inter, device="cuda", dtype=torch.bfloat16, generator=g) * inter ** -0.5
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
    tw, ids = route(torch.randn(M, E, device="cuda", generator=g), s.topk)
    cfg = dataclasses.replace(get_config(M, E, 2 * inter, K, s.topk, torch.bfloat16, "plain"),
                              persistent=True, short_tails=False)
    first = sorted_moe_matmul(x, w13, ids, config=cfg)
    assert rel_error(first, reference_moe_matmul(x, w13, ids)) < 1e-2
    configs = tuple(dataclasses.replace(get_config(M, E, n, k, s.topk, torch.bfloat16, v), persistent=True,
                                        short_tails=False)
                    for n, k, v in ((inter, K, "gated"), (K, inter, "down")))
    assert rel_error(sorted_moe_layer(x, w13, w2, tw, ids, configs=configs),
                     reference_moe_layer(x, w13, w2, tw, ids)) < 1e-2
