"""Part 4's sorted kernel: first GEMM and whole layer against the float64 reference.

In the interpreter the shapes stay small (every program costs about a millisecond); the
``gpu`` tests at the end run bf16 on every model shape of moe_tutorial.shapes.MODEL_SHAPES.
"""
from __future__ import annotations

import dataclasses

from moe_tutorial import (
    align_block_size,
    moe_layer,
    reference_moe_layer,
    reference_moe_matmul,
    rel_error,
    route,
    runtime,
    sorted_moe_layer,
    sorted_moe_matmul,
    worked_example,
)
from moe_tutorial.kernels.configs import KernelConfig, get_config
from moe_tutorial.kernels.sorted_layer import launch_sorted_gemm
from moe_tutorial.mixtral_block import MixtralSparseMoeBlock, pack_weights
from moe_tutorial.reference import tolerance
from moe_tutorial.shapes import MODEL_SHAPES, random_problem, random_topk_ids

import pytest
import torch

DEVICE = runtime.DEVICE
FP32_TOL = tolerance(torch.float32)
needs_gpu = pytest.mark.skipif(not runtime.ON_GPU, reason="needs a CUDA GPU")

#: Configurations the tests pin explicitly (block_m 16/32/64); tl.dot wants every block >= 16.
CONFIGS = [
    KernelConfig(block_m=16, block_n=16, block_k=16, group_m=1, num_warps=4, num_stages=2),
    KernelConfig(block_m=32, block_n=32, block_k=16, group_m=4, num_warps=4, num_stages=2),
    KernelConfig(block_m=64, block_n=16, block_k=32, group_m=8, num_warps=4, num_stages=2),
]


def layer_problem(M, K, inter, E, topk, *, seed=0, dtype=torch.float32, ids_dtype=torch.int32):
    """Random ``(x, w13, w2, topk_weights, topk_ids)`` with O(1) outputs, routed by ``route``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g)
    w13 = torch.randn(E, 2 * inter, K, generator=g) * K ** -0.5
    w2 = torch.randn(E, K, inter, generator=g) * inter ** -0.5
    topk_weights, topk_ids = route(torch.randn(M, E, generator=g), topk)
    to = dict(device=DEVICE, dtype=dtype)
    return (x.to(**to), w13.to(**to), w2.to(**to), topk_weights.to(DEVICE),
            topk_ids.to(device=DEVICE, dtype=ids_dtype))


# --------------------------------------------------------------------------------------
# First GEMM
# --------------------------------------------------------------------------------------

SHAPES = [
    # (M, N, K, E, topk)
    (1, 32, 32, 1, 1),
    (1, 17, 45, 8, 2),       # odd N and K; K not a multiple of block_k
    (3, 33, 16, 4, 3),       # topk = 3: not a power of two
    (5, 3, 7, 64, 6),        # N and K below every block size; 64 experts, topk = 6
    (7, 40, 70, 16, 8),
    (16, 24, 48, 2, 2),      # few experts: several blocks per expert
    (24, 50, 33, 64, 1),
]


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("M,N,K,E,topk", SHAPES)
def test_first_gemm_random_shapes(M, N, K, E, topk, ids_dtype):
    x, weight, ids = random_problem(M, N, K, E, topk, device=DEVICE, seed=M + N + K)
    ids = ids.to(ids_dtype)
    out = sorted_moe_matmul(x, weight, ids)
    assert out.shape == (M, topk, N) and out.dtype == x.dtype
    assert rel_error(out, reference_moe_matmul(x, weight, ids)) < FP32_TOL


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"bm{c.block_m}-bn{c.block_n}-bk{c.block_k}-g{c.group_m}")
@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "router_weights"])
def test_first_gemm_explicit_configs(config, weighted):
    M, N, K, E, topk = 20, 37, 50, 4, 2
    x, weight, ids = random_problem(M, N, K, E, topk, device=DEVICE, seed=config.block_m)
    ref = reference_moe_matmul(x, weight, ids)
    topk_weights = None
    if weighted:
        topk_weights = torch.rand(M, topk, generator=torch.Generator().manual_seed(1)).to(DEVICE) + 0.1
        ref = ref * topk_weights.double()[..., None]
    out = sorted_moe_matmul(x, weight, ids, topk_weights, config=config)
    assert rel_error(out, ref) < FP32_TOL


def _tail_ids(topk: int) -> torch.Tensor:
    """Runs of 16, 17, 48 and 1 pairs for experts 0..3: with BLOCK_M = 32, blocks exactly half
    full, one row past half, a full block followed by a half one, and a single row."""
    flat = torch.cat([torch.full((n,), e, dtype=torch.int32) for e, n in enumerate((16, 17, 48, 1))])
    flat = flat[torch.randperm(flat.numel(), generator=torch.Generator().manual_seed(0))]
    return flat.view(-1, topk).to(DEVICE)


@pytest.mark.parametrize("topk", [1, 2])
def test_short_tails_match_full_tiles(topk):
    """A block at most half full takes the half-height path; the result must not change."""
    ids = _tail_ids(topk)
    M, N, K, E = ids.shape[0], 24, 40, 4
    x, weight, _ = random_problem(M, N, K, E, topk, device=DEVICE, seed=11)
    w = torch.rand(M, topk, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    ref = reference_moe_matmul(x, weight, ids) * w.double()[..., None]
    outs = []
    for short in (False, True):
        config = KernelConfig(block_m=32, block_n=16, block_k=16, group_m=4, num_warps=4, num_stages=2,
                              short_tails=short)
        outs.append(sorted_moe_matmul(x, weight, ids, w, config=config))
        assert rel_error(outs[-1], ref) < FP32_TOL, short
    assert rel_error(outs[0], outs[1]) < 1e-6


def test_short_tails_in_the_layer():
    """Both GEMMs of the layer (SiLU*up epilogue, router weights) with short tails on and off."""
    ids = _tail_ids(2)
    M, K, inter, E = ids.shape[0], 32, 24, 4
    x, w13, w2, _, _ = layer_problem(M, K, inter, E, 2)
    w = torch.rand(M, 2, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    ref = reference_moe_layer(x, w13, w2, w, ids)
    for short in (False, True):
        cfg = KernelConfig(block_m=32, block_n=16, block_k=16, group_m=4, num_warps=4, num_stages=2, short_tails=short)
        assert rel_error(sorted_moe_layer(x, w13, w2, w, ids, configs=(cfg, cfg)), ref) < FP32_TOL, short


def test_precomputed_alignment():
    M, N, K, E, topk = 9, 20, 24, 8, 2
    x, weight, ids = random_problem(M, N, K, E, topk, device=DEVICE, seed=4)
    config = CONFIGS[1]
    alignment = align_block_size(ids, config.block_m, E)
    out = sorted_moe_matmul(x, weight, ids, config=config, alignment=alignment)
    assert rel_error(out, reference_moe_matmul(x, weight, ids)) < FP32_TOL


def _mismatched_alignments():
    """(alignment builder, error) for M=9, topk=2, E=8 run with CONFIGS[1] (block_m 32)."""
    def other_ids(ids):
        return align_block_size(torch.flip(ids, dims=[0]).contiguous(), 32, 8)

    def written_since(ids):
        alignment = align_block_size(ids, 32, 8)
        ids[0, 0] = (ids[0, 0] + 1) % 8              # ids change; the alignment does not
        return alignment

    return {
        # Another block size: the kernel would read expert_ids past their end (a segfault in
        # the interpreter); other ids: rows of the wrong pairs, silently.
        "block_m": (lambda ids: align_block_size(ids, 16, 8), r"^alignment: .*block_m = 32, got .*block_m = 16"),
        "num_experts": (lambda ids: align_block_size(ids, 32, 16), r"^alignment: .*num_experts = 8, got .* = 16"),
        "other-ids": (other_ids, r"^alignment: expected one built from this topk_ids, got one built from another"),
        "fewer-pairs": (lambda ids: align_block_size(ids[:4], 32, 8), r"^alignment: .*num_pairs \(M \* topk\) = 18"),
        "written-since": (written_since, r"^alignment: expected one built from topk_ids as they are now"),
        "plain-tuple": (lambda ids: tuple(align_block_size(ids, 32, 8)), r"^alignment: expected the Alignment"),
    }


@pytest.mark.parametrize("what", _mismatched_alignments())
def test_mismatched_alignment_is_refused(what):
    build, match = _mismatched_alignments()[what]
    M, N, K, E, topk = 9, 20, 24, 8, 2
    x, weight, ids = random_problem(M, N, K, E, topk, device=DEVICE, seed=4)
    alignment = build(ids)
    kind = TypeError if what == "plain-tuple" else ValueError
    with pytest.raises(kind, match=match):
        sorted_moe_matmul(x, weight, ids, config=CONFIGS[1], alignment=alignment)


@pytest.mark.parametrize("what", ["block_m", "num_experts", "fewer-pairs", "plain-tuple"])
def test_launcher_refuses_a_mismatched_alignment(what):
    """launch_sorted_gemm (the bench and the tuner call it) has no ids, but knows the rest."""
    build, match = _mismatched_alignments()[what]
    M, N, K, E, topk = 9, 20, 24, 8, 2
    x, weight, ids = random_problem(M, N, K, E, topk, device=DEVICE, seed=4)
    c = torch.full((M * topk, N), float("nan"), device=DEVICE)
    with pytest.raises(TypeError if what == "plain-tuple" else ValueError, match=match):
        launch_sorted_gemm(x, weight, c, None, build(ids), M * topk, topk, CONFIGS[1])
    assert c.isnan().all(), "nothing was launched"


def test_launcher_refuses_inputs_that_require_grad():
    """launch_sorted_gemm's own message names the buffers as it sees them."""
    M, N, K, E, topk = 4, 16, 16, 4, 2
    x, weight, ids = random_problem(M, N, K, E, topk, device=DEVICE, seed=5)
    c = torch.empty(M * topk, N, device=DEVICE)
    alignment = align_block_size(ids, CONFIGS[0].block_m, E)
    for tracked, name in ((x, r"x \(or the activations\)"), (weight, "the expert weights")):
        args = [x, weight]
        args[tracked is weight] = tracked.clone().requires_grad_()
        with pytest.raises(ValueError, match=rf"^{name}: expected a tensor that does not require grad"):
            launch_sorted_gemm(*args, c, None, alignment, M * topk, topk, CONFIGS[0])


def _count_checks(monkeypatch) -> dict:
    """Spy on the checks behind the sorted kernel's doors: how often each tensor reaches each one."""
    import moe_tutorial.checks as checks
    import moe_tutorial.kernels.sorted_layer as sk

    seen: dict = {}

    def spy(name, real, tensors_of):
        def wrapper(*args, **kwargs):
            for t in tensors_of(*args, **kwargs):
                seen[name, id(t)] = seen.get((name, id(t)), 0) + 1
            return real(*args, **kwargs)
        return wrapper

    no_grad = spy("no_grad", checks.check_no_grad, lambda tensors: [t for t in tensors.values() if t is not None])
    monkeypatch.setattr(checks, "check_no_grad", no_grad)
    monkeypatch.setattr(sk, "check_no_grad", no_grad)
    monkeypatch.setattr(sk, "check_alignment", spy("alignment", sk.check_alignment, lambda al, **k: [al]))
    return seen


def test_inputs_are_checked_once_at_the_door(monkeypatch):
    """sorted_moe_matmul and sorted_moe_layer check each input once; their launches trust them."""
    seen = _count_checks(monkeypatch)
    M, N, K, E, topk = 5, 16, 16, 4, 2
    x, weight, ids = random_problem(M, N, K, E, topk, device=DEVICE, seed=6)
    weights = torch.rand(M, topk, device=DEVICE)
    alignment = align_block_size(ids, CONFIGS[0].block_m, E)
    sorted_moe_matmul(x, weight, ids, weights, config=CONFIGS[0], alignment=alignment)
    assert seen == {("no_grad", id(x)): 1, ("no_grad", id(weight)): 1, ("no_grad", id(weights)): 1,
                    ("alignment", id(alignment)): 1}
    seen.clear()
    x, w13, w2, weights, ids = layer_problem(M, K, 16, E, topk)
    sorted_moe_layer(x, w13, w2, weights, ids, configs=(CONFIGS[0], CONFIGS[0]))
    assert seen == {("no_grad", id(t)): 1 for t in (x, w13, w2, weights)}


def _record_descriptors(monkeypatch) -> list:
    """Spy on the launcher's choice of weight path: each launch appends its TMA descriptor or None."""
    import moe_tutorial.kernels.sorted_layer as sk

    made, real = [], sk.weight_descriptor
    monkeypatch.setattr(sk, "weight_descriptor", lambda b, block: made.append(real(b, block)) or made[-1])
    return made


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("M,N,K,E,topk", [(6, 40, 64, 4, 2), (5, 33, 45, 8, 3)])
def test_use_tma_config(M, N, K, E, topk, monkeypatch):
    """``use_tma`` takes the tensor-descriptor path on Hopper when K's rows are 16-byte
    aligned (K = 64 in fp32) and falls back to pointer loads otherwise (K = 45, or before
    Hopper); either way the result is right, and equal to the pointer path's."""
    x, weight, ids = random_problem(M, N, K, E, topk, device=DEVICE, seed=K)
    topk_weights = torch.rand(M, topk, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    ref = reference_moe_matmul(x, weight, ids) * topk_weights.double()[..., None]
    made = _record_descriptors(monkeypatch)
    outs = {}
    for use_tma in (True, False):
        config = KernelConfig(block_m=16, block_n=32, block_k=32, group_m=1, use_tma=use_tma)
        outs[use_tma] = sorted_moe_matmul(x, weight, ids, topk_weights, config=config)
        assert rel_error(outs[use_tma], ref) < FP32_TOL, use_tma
    hopper = torch.cuda.get_device_capability()[0] >= 9
    assert len(made) == 1, "only the use_tma=True launch asks for a descriptor"
    assert (made[0] is not None) == (hopper and K * weight.element_size() % 16 == 0), (K, made[0])
    assert rel_error(outs[True], outs[False].double()) < FP32_TOL


def test_use_tma_falls_back_in_the_interpreter(monkeypatch):
    """The interpreter has no copy engine: a use_tma config loads through pointers there."""
    if not runtime.INTERPRETED:
        pytest.skip("the GPU's side is test_use_tma_config")
    x, weight, ids = random_problem(5, 40, 64, 4, 2, device=DEVICE, seed=1)
    made = _record_descriptors(monkeypatch)
    config = KernelConfig(block_m=16, block_n=32, block_k=32, group_m=1, use_tma=True)
    out = sorted_moe_matmul(x, weight, ids, config=config)
    assert made == [None]
    assert rel_error(out, reference_moe_matmul(x, weight, ids)) < FP32_TOL


def test_all_tokens_on_one_expert():
    """Many full blocks of one expert, the others idle: the grouped order walks down them."""
    M, N, K, E, topk = 70, 40, 32, 8, 1
    x, weight, _ = random_problem(M, N, K, E, topk, device=DEVICE, seed=5)
    ids = torch.full((M, 1), 6, dtype=torch.int32, device=DEVICE)
    out = sorted_moe_matmul(x, weight, ids, config=dataclasses.replace(CONFIGS[0], group_m=4))
    assert rel_error(out, reference_moe_matmul(x, weight, ids)) < FP32_TOL


@pytest.mark.parametrize("layout", ["x", "weight", "both"])
def test_non_contiguous_inputs(layout):
    M, N, K, E, topk = 6, 24, 40, 4, 2
    x, weight, ids = random_problem(M, N, K, E, topk, device=DEVICE, seed=6)
    if layout in ("x", "both"):
        x = x.t().contiguous().t()                      # [M, K] with strides (1, M)
    if layout in ("weight", "both"):
        weight = weight.transpose(1, 2).contiguous().transpose(1, 2)   # [E, N, K], K-major
    assert not (x.is_contiguous() and weight.is_contiguous())
    assert rel_error(sorted_moe_matmul(x, weight, ids), reference_moe_matmul(x, weight, ids)) < FP32_TOL


def test_sliced_inputs():
    """Views into larger tensors: a row stride that is not K, every other expert."""
    M, N, K, E, topk = 5, 16, 24, 6, 2
    x_big, w_big, _ = random_problem(M, N, 2 * K, 2 * E, topk, device=DEVICE, seed=8)
    x, weight = x_big[:, :K], w_big[::2, :, K:]
    ids = random_topk_ids(M, E, topk, generator=torch.Generator().manual_seed(8), device=DEVICE)
    assert rel_error(sorted_moe_matmul(x, weight, ids), reference_moe_matmul(x, weight, ids)) < FP32_TOL


@pytest.mark.parametrize("variant", ["plain", "router_weights", "gated"])
def test_every_element_written(variant):
    """Poison the output with NaN: every (pair, n) must be overwritten by the kernel."""
    M, N, K, E, topk = 11, 35, 20, 8, 3
    x, weight, ids = random_problem(M, N, K, E, topk, device=DEVICE, seed=9)
    num_pairs, config = M * topk, CONFIGS[0]
    alignment = align_block_size(ids, config.block_m, E)
    ref = reference_moe_matmul(x, weight, ids).view(num_pairs, N)
    router = None
    if variant == "router_weights":
        router = torch.rand(num_pairs, generator=torch.Generator().manual_seed(2)).to(DEVICE)
        ref = ref * router.double()[:, None]
    out_n = N
    if variant == "gated":
        out_n = N // 2 + 1
        weight = torch.cat([weight, weight[:, :2 * out_n - N]], dim=1)   # 2 * out_n rows: gate then up
        full = reference_moe_matmul(x, weight, ids).view(num_pairs, 2 * out_n)
        ref = torch.nn.functional.silu(full[:, :out_n]) * full[:, out_n:]
    c = torch.full((num_pairs, out_n), float("nan"), device=DEVICE)
    launch_sorted_gemm(x, weight, c, router, alignment, num_pairs, topk, config, gated=variant == "gated")
    assert not c.isnan().any(), "some output elements were never written"
    assert rel_error(c, ref) < FP32_TOL


def test_router_weights_on_the_gated_gemm_are_refused():
    """The kernel's epilogue is one of silu(gate) * up and the router weights (the layer's two GEMMs):
    the door refuses both at once rather than run one of them."""
    M, N, K, E, topk = 4, 8, 16, 4, 2
    x, weight, ids = random_problem(M, 2 * N, K, E, topk, device=DEVICE, seed=3)
    alignment = align_block_size(ids, CONFIGS[0].block_m, E)
    c = torch.empty(M * topk, N, device=DEVICE)
    with pytest.raises(ValueError, match=r"^router_weights: expected None with gated=True"):
        launch_sorted_gemm(x, weight, c, torch.ones(M * topk, device=DEVICE), alignment, M * topk, topk, CONFIGS[0],
                           gated=True)


def test_worked_example_exact():
    ex = worked_example(device=DEVICE)
    assert torch.equal(sorted_moe_matmul(ex.x, ex.weight, ex.topk_ids), ex.first_gemm)
    weighted = sorted_moe_matmul(ex.x, ex.weight, ex.topk_ids, ex.topk_weights)
    assert torch.equal(weighted, ex.first_gemm * 0.5)
    layer = moe_layer(ex.x, ex.w13, ex.w2, ex.topk_weights, ex.topk_ids, impl="sorted")
    assert torch.allclose(layer, ex.layer, rtol=0, atol=1e-4)


def test_empty_batch():
    x, weight, ids = random_problem(0, 8, 16, 4, 2, device=DEVICE)
    assert sorted_moe_matmul(x, weight, ids).shape == (0, 2, 8)
    x, w13, w2, tw, ids = layer_problem(0, 16, 8, 4, 2)
    assert moe_layer(x, w13, w2, tw, ids, impl="sorted").shape == (0, 16)
    assert sorted_moe_layer(x, w13, w2, tw, ids).shape == (0, 16)


@pytest.mark.parametrize("config", [CONFIGS[0], dataclasses.replace(CONFIGS[2], use_tma=True)], ids=["16", "64-tma"])
def test_sorted_activations_round_trip(config):
    """The gate/up GEMM writes each pair's row at its sorted position; the down GEMM reads them as
    they lie. Padding rows stay NaN (never written) and must not leak into any real output row,
    also where TMA (GPU) loads whole blocks, padding rows included."""
    M, K, inter, E, topk = 9, 32, 24, 4, 3
    x, w13, w2, tw, ids = layer_problem(M, K, inter, E, topk, seed=21)
    pairs = M * topk
    alignment = align_block_size(ids, config.block_m, E)
    sorted_ids = alignment[0]
    act = torch.full((sorted_ids.numel(), inter), float("nan"), device=DEVICE, dtype=x.dtype)
    launch_sorted_gemm(x, w13, act, None, alignment, pairs, topk, config, gated=True, c_sorted=True)
    full = reference_moe_matmul(x, w13, ids).view(pairs, 2 * inter)
    ref_act = torch.nn.functional.silu(full[:, :inter]) * full[:, inter:]
    real = (sorted_ids[: int(alignment[2])] < pairs).nonzero().flatten()
    assert real.numel() == pairs
    assert rel_error(act[real], ref_act[sorted_ids[real].long()]) < FP32_TOL
    assert act[int(alignment[2]):].isnan().all() or act.shape[0] == int(alignment[2])
    down = torch.full((pairs, K), float("nan"), device=DEVICE, dtype=x.dtype)
    router = tw.reshape(-1).float().contiguous()
    launch_sorted_gemm(act, w2, down, router, alignment, pairs, 1, config, a_sorted=True)
    assert not down.isnan().any()
    out = down.view(M, topk, K).sum(dim=1)
    assert rel_error(out, reference_moe_layer(x, w13, w2, tw, ids)) < FP32_TOL


@pytest.mark.gpu
@needs_gpu
def test_sorted_activations_through_tma_on_gpu():
    """bf16 with a prefill configuration: the down GEMM's A tiles come through TMA, NaN padding rows
    included, and none of it reaches the output."""
    M, K, inter, E, topk = 300, 256, 128, 8, 2
    x, w13, w2, tw, ids = layer_problem(M, K, inter, E, topk, seed=23, dtype=torch.bfloat16)
    config = KernelConfig(block_m=128, block_n=128, block_k=64, num_warps=8, num_stages=3, use_tma=True)
    pairs = M * topk
    alignment = align_block_size(ids, config.block_m, E)
    act = torch.full((alignment[0].numel(), inter), float("nan"), device=DEVICE, dtype=x.dtype)
    launch_sorted_gemm(x, w13, act, None, alignment, pairs, topk, config, gated=True, c_sorted=True)
    down = torch.full((pairs, K), float("nan"), device=DEVICE, dtype=x.dtype)
    launch_sorted_gemm(act, w2, down, tw.reshape(-1).float().contiguous(), alignment, pairs, 1, config,
                       a_sorted=True)
    assert not down.isnan().any()
    assert rel_error(down.view(M, topk, K).sum(dim=1), reference_moe_layer(x, w13, w2, tw, ids)) < tolerance(x.dtype)


@pytest.mark.parametrize("side", ["a", "c"])
def test_sorted_rows_need_one_row_per_position(side):
    x, w13, w2, tw, ids = layer_problem(5, 32, 16, 4, 2, seed=22)
    config = CONFIGS[0]
    alignment = align_block_size(ids, config.block_m, 4)
    act = torch.empty(10, 16, device=DEVICE)      # one row per pair, fewer than the sorted positions
    with pytest.raises(ValueError, match="one row per sorted position"):
        if side == "c":
            launch_sorted_gemm(x, w13, act, None, alignment, 10, 2, config, gated=True, c_sorted=True)
        else:
            launch_sorted_gemm(act, w2, torch.empty(10, 32, device=DEVICE), None, alignment, 10, 1, config,
                               a_sorted=True)


# --------------------------------------------------------------------------------------
# The whole layer
# --------------------------------------------------------------------------------------

LAYER_SHAPES = [
    # (M, K, I, E, topk)
    (1, 32, 16, 1, 1),
    (4, 24, 20, 8, 2),
    (9, 48, 24, 16, 6),
    (13, 40, 36, 4, 3),
]


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("M,K,inter,E,topk", LAYER_SHAPES)
def test_layer_matches_reference_and_loop(M, K, inter, E, topk, ids_dtype):
    x, w13, w2, tw, ids = layer_problem(M, K, inter, E, topk, seed=M * K, ids_dtype=ids_dtype)
    out = moe_layer(x, w13, w2, tw, ids, impl="sorted")
    assert out.shape == (M, K) and out.dtype == x.dtype
    assert rel_error(out, reference_moe_layer(x, w13, w2, tw, ids)) < FP32_TOL
    assert rel_error(out, moe_layer(x, w13, w2, tw, ids, impl="loop").double()) < FP32_TOL


def test_layer_agrees_with_every_part():
    x, w13, w2, tw, ids = layer_problem(6, 32, 24, 8, 2, seed=11)
    ref = reference_moe_layer(x, w13, w2, tw, ids)
    sorted_out = moe_layer(x, w13, w2, tw, ids, impl="sorted")
    for impl in ("loop", "indexing", "fused"):
        other = moe_layer(x, w13, w2, tw, ids, impl=impl)
        assert rel_error(other, ref) < FP32_TOL, impl
        assert rel_error(sorted_out, other.double()) < 2 * FP32_TOL, impl


@pytest.mark.parametrize("pair", [(CONFIGS[0], CONFIGS[0]), (CONFIGS[1], CONFIGS[2]), (CONFIGS[2], CONFIGS[0])],
                         ids=["same", "32-then-64", "64-then-16"])
def test_layer_explicit_configs(pair):
    """Different block_m for the two GEMMs makes the layer align twice."""
    x, w13, w2, tw, ids = layer_problem(10, 40, 24, 4, 2, seed=12)
    out = sorted_moe_layer(x, w13, w2, tw, ids, configs=pair)
    assert rel_error(out, reference_moe_layer(x, w13, w2, tw, ids)) < FP32_TOL


def test_layer_non_contiguous_weights():
    x, w13, w2, tw, ids = layer_problem(5, 32, 16, 4, 2, seed=13)
    w13_t = w13.transpose(1, 2).contiguous().transpose(1, 2)
    w2_t = w2.transpose(1, 2).contiguous().transpose(1, 2)
    x_t = x.t().contiguous().t()
    out = moe_layer(x_t, w13_t, w2_t, tw, ids, impl="sorted")
    assert rel_error(out, reference_moe_layer(x, w13, w2, tw, ids)) < FP32_TOL


def test_layer_matches_mixtral_block():
    """A Hugging Face style Mixtral block, packed into w13/w2 and routed by ``route``."""
    torch.manual_seed(0)
    block = MixtralSparseMoeBlock(hidden=32, intermediate=24, num_experts=8, top_k=2).to(DEVICE)
    x = torch.randn(12, 32, device=DEVICE)
    with torch.no_grad():
        expected, logits = block(x)
    w13, w2 = pack_weights(block)
    topk_weights, topk_ids = route(logits, 2)
    out = moe_layer(x, w13, w2, topk_weights, topk_ids, impl="sorted")
    assert rel_error(out, expected.double()) < 1e-5


# --------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------

def _good():
    return random_problem(4, 8, 16, 4, 2, device=DEVICE)


def test_bad_k():
    x, weight, ids = _good()
    with pytest.raises(ValueError, match="weight.*K=16"):
        sorted_moe_matmul(x, weight[:, :, :8], ids)


@pytest.mark.parametrize("bad_id", [-1, 4])
def test_bad_expert_ids(bad_id):
    x, weight, ids = _good()
    ids[0, 0] = bad_id
    with pytest.raises(ValueError, match=r"topk_ids.*\[0, 4\)"):
        sorted_moe_matmul(x, weight, ids)


def test_topk_larger_than_experts():
    x, weight, _ = _good()
    ids = torch.zeros(4, 5, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="topk"):
        sorted_moe_matmul(x, weight, ids)


def test_bad_ranks_and_rows():
    x, weight, ids = _good()
    with pytest.raises(ValueError, match="x"):
        sorted_moe_matmul(x[0], weight, ids)
    with pytest.raises(ValueError, match="weight"):
        sorted_moe_matmul(x, weight[0], ids)
    with pytest.raises(ValueError, match="topk_ids"):
        sorted_moe_matmul(x, weight, ids[:3])


def test_bad_dtypes():
    x, weight, ids = _good()
    with pytest.raises(TypeError, match="topk_ids"):
        sorted_moe_matmul(x, weight, ids.float())
    with pytest.raises(TypeError, match="weight"):
        sorted_moe_matmul(x, weight.double(), ids)
    with pytest.raises(TypeError, match="x"):
        sorted_moe_matmul(x.double(), weight.double(), ids)     # float64: no kernel takes it


@pytest.mark.skipif(runtime.ON_GPU, reason="bf16 is only refused in the interpreter")
def test_bf16_refused_in_interpreter():
    x, weight, ids = _good()
    with pytest.raises(TypeError, match="interpreter"):
        sorted_moe_matmul(x.bfloat16(), weight.bfloat16(), ids)
    x, w13, w2, tw, ids = layer_problem(2, 16, 8, 4, 2)
    with pytest.raises(TypeError, match="interpreter"):
        moe_layer(x.bfloat16(), w13.bfloat16(), w2.bfloat16(), tw, ids, impl="sorted")


def test_bad_topk_weights():
    x, weight, ids = _good()
    with pytest.raises(ValueError, match="topk_weights"):
        sorted_moe_matmul(x, weight, ids, torch.ones(4, 3, device=DEVICE))
    with pytest.raises(TypeError, match="topk_weights"):
        sorted_moe_matmul(x, weight, ids, torch.ones(4, 2, dtype=torch.int32, device=DEVICE))


def test_bad_layer_shapes():
    x, w13, w2, tw, ids = layer_problem(3, 16, 8, 4, 2)
    with pytest.raises(ValueError, match="w13"):
        moe_layer(x, w13[:, :-1], w2, tw, ids, impl="sorted")
    with pytest.raises(ValueError, match="w2"):
        moe_layer(x, w13, w2[:, :, :-1], tw, ids, impl="sorted")


# --------------------------------------------------------------------------------------
# On a GPU: bf16 on every model shape of moe_tutorial.shapes.MODEL_SHAPES
# --------------------------------------------------------------------------------------

def _gpu_weights(E, N, K, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(E, N, K, generator=g, device="cuda", dtype=dtype) * K ** -0.5


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("M", [4, 64])
@pytest.mark.parametrize("model", list(MODEL_SHAPES))
def test_first_gemm_model_shapes_bf16(model, M):
    """Includes DeepSeek-V3's first GEMM: 256 * 4096 * 7168 weights, past 2^31 (int64 offsets)."""
    s = MODEL_SHAPES[model]
    N, K = s.first_gemm
    weight = _gpu_weights(s.num_experts, N, K, torch.bfloat16, seed=M)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    ids = random_topk_ids(M, s.num_experts, s.topk, generator=torch.Generator().manual_seed(M), device="cuda")
    if model == "DeepSeek-V3":
        assert weight.numel() > 2 ** 31
        # Make sure the last experts, whose offsets pass 2^31, are used.
        ids[0] = torch.arange(s.num_experts - s.topk, s.num_experts, device="cuda", dtype=ids.dtype)
    ref = reference_moe_matmul(x, weight, ids)
    assert rel_error(sorted_moe_matmul(x, weight, ids), ref) < 1e-2
    tw = torch.rand(M, s.topk, device="cuda")
    default = get_config(M, s.num_experts, N, K, s.topk, torch.bfloat16, "plain")
    for use_tma in (False, True):       # both weight-load paths, whatever the tuned table says
        config = dataclasses.replace(default, use_tma=use_tma)
        out_w = sorted_moe_matmul(x, weight, ids, tw, config=config)
        assert rel_error(out_w, ref * tw.double()[..., None]) < 1e-2, f"use_tma={use_tma}"


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("M", [4, 64])
@pytest.mark.parametrize("model", list(MODEL_SHAPES))
def test_layer_model_shapes_bf16(model, M):
    s = MODEL_SHAPES[model]
    E, K, inter = s.num_experts, s.hidden, s.intermediate
    w13 = _gpu_weights(E, 2 * inter, K, torch.bfloat16, seed=M)
    w2 = _gpu_weights(E, K, inter, torch.bfloat16, seed=M + 1)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    tw, ids = route(torch.randn(M, E, device="cuda"), s.topk)
    ref = reference_moe_layer(x, w13, w2, tw, ids)
    assert rel_error(moe_layer(x, w13, w2, tw, ids, impl="sorted"), ref) < 1e-2
    configs = (get_config(M, E, inter, K, s.topk, torch.bfloat16, "gated"),
               get_config(M, E, K, inter, s.topk, torch.bfloat16, "down"))
    for use_tma in (False, True):
        pair = tuple(dataclasses.replace(c, use_tma=use_tma) for c in configs)
        assert rel_error(sorted_moe_layer(x, w13, w2, tw, ids, configs=pair), ref) < 1e-2, f"use_tma={use_tma}"


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("M,N,K,E,topk", SHAPES)
def test_small_shapes_on_gpu(M, N, K, E, topk, dtype):
    """tl.dot on the GPU has size rules the interpreter does not check: tiny N and K too."""
    x, weight, ids = random_problem(M, N, K, E, topk, device="cuda", dtype=dtype, seed=M + N)
    out = sorted_moe_matmul(x, weight, ids)
    assert rel_error(out, reference_moe_matmul(x, weight, ids)) < tolerance(dtype)


def test_launch_shrinks_a_config_that_does_not_fit(monkeypatch):
    """A table tuned on an H200 can ask for more shared memory than a smaller GPU has."""
    import moe_tutorial.kernels.sorted_layer as sk

    from triton.runtime.errors import OutOfResources

    tried = []

    def fake_launch(*args, config, **kwargs):
        tried.append(config)
        if config.num_stages > 2 or config.block_k > 64:
            raise OutOfResources(300_000, 100_000, "shared memory")

    monkeypatch.setattr(sk, "_launch", lambda *a, **k: fake_launch(*a[:-1], config=a[-1], **k))
    monkeypatch.setattr(sk, "_FITTED", {})
    big = KernelConfig(block_m=16, block_n=128, block_k=256, group_m=8, num_warps=4, num_stages=4)
    a = torch.empty(0, 8)
    sk.launch_fitted(a, None, None, None, None, 0, 1, big)
    assert [(c.num_stages, c.block_k) for c in tried] == [(4, 256), (3, 256), (2, 256), (2, 128), (2, 64)]
    tried.clear()
    sk.launch_fitted(a, None, None, None, None, 0, 1, big)   # remembered: one launch
    assert [(c.num_stages, c.block_k) for c in tried] == [(2, 64)]
