"""The Gluon kernel (persistent, warp-specialised; Hopper only) against the float64 reference.

Gluon does not run in Triton's CPU interpreter: on a CPU the kernel tests skip with that reason;
what runs there is the compiled schedule of the gated form (any machine: Triton compiles for
sm90 without a GPU) and the launchers' argument checks.
"""
from __future__ import annotations

from moe_tutorial import align_block_size, reference_moe_layer, reference_moe_matmul, rel_error, route
from moe_tutorial.activation import silu_and_mul
from moe_tutorial.experiments.sm90 import compile_report
from moe_tutorial.kernels import gluon_kernel
from moe_tutorial.kernels.configs import SMEM_LIMIT, KernelConfig
from moe_tutorial.reference import tolerance
from moe_tutorial.shapes import random_topk_ids

import pytest
import torch

gpu = [pytest.mark.gpu, pytest.mark.skipif(gluon_kernel.UNAVAILABLE is not None,
                                           reason=str(gluon_kernel.UNAVAILABLE))]


def needs_hopper(test):
    for mark in gpu:
        test = mark(test)
    return test


@needs_hopper
def test_unavailable_says_why():
    assert gluon_kernel.UNAVAILABLE is None     # only reached where the kernel can run


@needs_hopper
@pytest.mark.parametrize("M,N,K,E,topk,bm,bn,bk,warps,stages", [
    (200, 256, 256, 4, 2, 128, 128, 64, 8, 3),     # several tiles per program, K of 4 steps
    (77, 320, 200, 8, 2, 64, 128, 64, 4, 4),       # N and K ragged: TMA zero-fills, the store masks
    (1024, 1536, 2048, 128, 8, 128, 256, 64, 8, 4),  # Qwen3-30B-A3B's first GEMM
])
def test_first_gemm_matches_the_reference(M, N, K, E, topk, bm, bn, bk, warps, stages):
    g = torch.Generator(device="cuda").manual_seed(M)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16, generator=g) * K ** -0.5
    ids = random_topk_ids(M, E, topk, generator=torch.Generator().manual_seed(M), device="cuda")
    tw = torch.rand(M, topk, device="cuda")
    config = KernelConfig(block_m=bm, block_n=bn, block_k=bk, num_warps=warps, num_stages=stages)
    alignment = align_block_size(ids, bm, E)
    a = gluon_kernel.gather_sorted_rows(x, alignment[0], M * topk, topk)
    out = torch.full((M * topk, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    gluon_kernel.launch_gluon_gemm(a, w, out, tw.reshape(-1).contiguous(), alignment, M * topk, config)
    ref = reference_moe_matmul(x, w, ids) * tw.double()[..., None]
    assert rel_error(out.view(M, topk, N), ref) < 1e-2


@needs_hopper
@pytest.mark.parametrize("bn,stages", [(128, 4), (256, 4)])
def test_e4m3_operands_give_the_raw_products_sums(bn, stages):
    """FP8 with one scale per tensor (Part 7's measure of what block scales cost): e4m3 rows and
    weights in, the float64 sums of their raw products out, within the tensor cores' own
    accumulation error over K = 2048 (no promotion)."""
    M, N, K, E, topk = 300, 512, 2048, 8, 2
    g = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn(M, K, device="cuda", generator=g).to(torch.float8_e4m3fn)
    w = (torch.randn(E, N, K, device="cuda", generator=g) * 0.5).to(torch.float8_e4m3fn)
    ids = random_topk_ids(M, E, topk, generator=torch.Generator().manual_seed(3), device="cuda")
    config = KernelConfig(block_m=128, block_n=bn, block_k=128, num_warps=8, num_stages=stages)
    alignment = align_block_size(ids, 128, E)
    a = gluon_kernel.gather_sorted_rows(x.view(torch.uint8), alignment[0], M * topk, topk).view(x.dtype)
    out = torch.full((M * topk, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    gluon_kernel.launch_gluon_gemm(a, w, out, None, alignment, M * topk, config)
    assert rel_error(out.view(M, topk, N), reference_moe_matmul(x.double(), w.double(), ids)) < 1e-2


@needs_hopper
def test_sorted_rows_in_and_out():
    """The down GEMM's case: A already in sorted order, C written at the sorted positions."""
    M, N, K, E, topk = 96, 128, 192, 4, 2
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16, generator=g) * K ** -0.5
    _, ids = route(torch.randn(M, E, device="cuda", generator=g), topk)
    config = KernelConfig(block_m=64, block_n=128, block_k=64, num_warps=4, num_stages=3)
    alignment = align_block_size(ids, 64, E)
    a = gluon_kernel.gather_sorted_rows(x, alignment[0], M * topk, topk)
    out = torch.zeros(alignment[0].numel(), N, device="cuda", dtype=torch.bfloat16)
    gluon_kernel.launch_gluon_gemm(a, w, out, None, alignment, M * topk, config, c_sorted=True)
    sorted_ids = alignment[0].long()
    # Positions past num_tokens_post_padded were never written by the alignment: leave them out.
    used = torch.arange(sorted_ids.numel(), device="cuda") < alignment[2].long()
    real = used & (sorted_ids < M * topk)
    ref = reference_moe_matmul(x, w, ids).reshape(M * topk, N)[sorted_ids[real]]
    assert rel_error(out[real], ref) < 1e-2


# ------------------------------------------------------------------ the gated form and the layer

def _cfg(bm, bn, warps, stages, **kw):
    return KernelConfig(block_m=bm, block_n=bn, block_k=64, num_warps=warps, num_stages=stages, short_tails=False,
                        **kw)


#: (gate/up, down) pairs: the prefill tiles (two consumer warpgroups) and 64-row tiles (one); each also
#: with its tiles copied out through TMA (the down GEMM's rows then left sorted).
LAYER_CONFIGS = {"128": (_cfg(128, 128, 8, 4), _cfg(128, 256, 8, 3)), "64": (_cfg(64, 128, 4, 3), _cfg(64, 128, 4, 4)),
                 "128, tma": (_cfg(128, 128, 8, 4, tma_store=True), _cfg(128, 256, 8, 3, tma_store=True)),
                 "64, tma": (_cfg(64, 128, 4, 3, tma_store=True), _cfg(64, 128, 4, 4, tma_store=True))}


def _layer_problem(M, E, inter, K, topk, seed=0):
    """bf16 tokens and experts, the routing of random logits with expert 0 picked by no token."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16, generator=g)
    w13 = torch.randn(E, 2 * inter, K, device="cuda", dtype=torch.bfloat16, generator=g) * K ** -0.5
    w2 = torch.randn(E, K, inter, device="cuda", dtype=torch.bfloat16, generator=g) * inter ** -0.5
    logits = torch.randn(M, E, device="cuda", generator=g)
    logits[:, 0] = -1e9
    tw, ids = route(logits, topk)
    return x, w13, w2, tw, ids


@needs_hopper
@pytest.mark.parametrize("name", LAYER_CONFIGS)
@pytest.mark.parametrize("M,E,inter,K,topk", [(200, 8, 192, 320, 2), (77, 4, 200, 264, 1), (300, 16, 136, 128, 8)])
def test_gated_gemm_writes_silu_gate_times_up_at_the_sorted_rows(name, M, E, inter, K, topk):
    """I and K past whole tiles (the last tile's gate box runs into the up rows, the up box into the next
    expert: their columns must not be stored), an expert with no tokens; padding rows stay unwritten
    (through TMA copies they are written: whole tiles of sorted rows, which nothing reads)."""
    x, w13, _, _, ids = _layer_problem(M, E, inter, K, topk)
    config = LAYER_CONFIGS[name][0]
    alignment = align_block_size(ids, config.block_m, E)
    a = gluon_kernel.gather_sorted_rows(x, alignment[0], M * topk, topk)
    act = torch.full((gluon_kernel.sorted_rows(alignment, config.block_m), inter), float("nan"), device="cuda",
                     dtype=torch.bfloat16)
    gluon_kernel.launch_gluon_gemm(a, w13, act, None, alignment, M * topk, config, gated=True)
    pos = torch.arange(act.shape[0], device="cuda")
    pair = torch.full_like(pos, M * topk)
    pair[: alignment[0].numel()] = alignment[0].long()
    real = (pos < alignment[2].long()) & (pair < M * topk)
    ref = silu_and_mul(reference_moe_matmul(x, w13, ids)).reshape(M * topk, inter)
    assert rel_error(act[real], ref[pair[real]]) < tolerance(torch.bfloat16)
    assert bool(torch.isnan(act[~real]).all()) or config.tma_store
    if config.tma_store:        # the rows past the real tiles are in no tile: nothing copies them
        assert bool(torch.isnan(act[pos >= alignment[2].long()]).all())


@needs_hopper
@pytest.mark.parametrize("name", LAYER_CONFIGS)
@pytest.mark.parametrize("M,E,inter,K,topk", [(200, 8, 192, 320, 2), (77, 4, 200, 264, 1), (300, 16, 136, 392, 8),
                                              (1024, 128, 768, 2048, 8)])
def test_gluon_layer_matches_the_float64_reference(name, M, E, inter, K, topk):
    x, w13, w2, tw, ids = _layer_problem(M, E, inter, K, topk, seed=M)
    cfg_up, cfg_down = LAYER_CONFIGS[name]
    out = gluon_kernel.gluon_layer(x, w13, w2, tw, align_block_size(ids, cfg_up.block_m, E), topk, cfg_up, cfg_down)
    assert out.shape == (M, K) and out.dtype == torch.bfloat16
    assert rel_error(out, reference_moe_layer(x, w13, w2, tw, ids)) < tolerance(torch.bfloat16)


@needs_hopper
@pytest.mark.parametrize("name", ["128", "64"])
def test_tma_copies_out_give_the_gluon_layer_the_same_bits(name):
    """The same tiles stored through gl.store (down rows to their pairs) or copied out through TMA (down
    rows left sorted, summed through their positions): the same bits, I and K past whole tiles."""
    M, E, inter, K, topk = 300, 16, 136, 392, 8
    x, w13, w2, tw, ids = _layer_problem(M, E, inter, K, topk, seed=1)
    alignment = align_block_size(ids, LAYER_CONFIGS[name][0].block_m, E)
    outs = [gluon_kernel.gluon_layer(x, w13, w2, tw, alignment, topk, *LAYER_CONFIGS[form])
            for form in (name, name + ", tma")]
    assert bool(torch.isfinite(outs[1]).all()) and torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("c_sorted, c, match", [(False, torch.empty(8, 16), "C must be in sorted order"),
                                                (True, torch.empty(8, 9), "16-byte aligned rows")])
def test_a_tma_copy_out_refuses_c_it_cannot_write(c_sorted, c, match):
    a, b = torch.empty(8, 16), torch.empty(2, c.shape[1], 16)
    with pytest.raises(ValueError, match=match):
        gluon_kernel.launch_gluon_gemm(a, b, c, None, None, 8, _cfg(64, 128, 4, 3, tma_store=True), c_sorted=c_sorted)


def test_the_layers_two_gemms_share_one_block_m():
    """Checked before anything runs (on any machine): one alignment serves both GEMMs."""
    with pytest.raises(ValueError, match="one block_m"):
        gluon_kernel.gluon_layer(None, None, None, None, None, 1, _cfg(128, 128, 8, 4), _cfg(64, 128, 4, 4))


@pytest.mark.parametrize("router, b_rows", [(torch.ones(4), 8), (None, 6)])
def test_the_gated_launch_refuses_router_weights_and_a_w13_of_other_rows(router, b_rows):
    b, c = torch.empty(2, b_rows, 16), torch.empty(4, 4)
    with pytest.raises(ValueError, match="gated"):
        gluon_kernel.launch_gluon_gemm(torch.empty(4, 16), b, c, router, None, 4, _cfg(64, 128, 4, 3), gated=True)


def test_the_launch_refuses_operands_of_two_dtypes():
    """e4m3 rows against bf16 weights would reach the MMA as bytes of the wrong format."""
    a, b = torch.empty(4, 16, dtype=torch.float8_e4m3fn), torch.empty(2, 8, 16, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="one dtype"):
        gluon_kernel.launch_gluon_gemm(a, b, torch.empty(4, 8), None, None, 4, _cfg(64, 128, 4, 3))


@pytest.mark.skipif(not gluon_kernel.HAVE_GLUON, reason="this Triton has no Gluon")
def test_the_gated_kernel_keeps_a_steps_two_mmas_in_flight_and_fits_shared_memory():
    """Compiled for sm90 on any machine: the K loop waits with two wgmma groups outstanding (gate and up
    of this step; the step before has finished), ptxas kept it (``WARPGROUP.DEPBAR.LE gsb0, 0x2``), and
    four stages of one A and two B tiles fit Hopper's 227 KB."""
    r = compile_report("gluon-bf16-gated")
    assert 2 in r["wait_groups"] and "WARPGROUP.DEPBAR.LE gsb0, 0x2" in r["sass"]
    assert r["spill_bytes"] == 0 and r["serialised"] == ""
    assert 4 * (128 * 64 + 2 * 128 * 64) * 2 <= r["shared"] <= SMEM_LIMIT
