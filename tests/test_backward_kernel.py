"""Part 8: the layer's backward in Triton against autograd through the float64 reference.

Every gradient (dx, dW13, dW2 and the router's) by relative error, on sizes that are no multiple
of any block, topk = 1, an expert nobody chose, values near 1e-5 (where an absolute tolerance
passes a wrong SwiGLU derivative), strided inputs and an empty batch; two runs bitwise equal;
what the forward keeps; bad input refused with a message that names it. In the interpreter
(fp32) on the CPU, and on a GPU (bf16) with ``-m gpu``.
"""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

import dataclasses
import functools
import math
import re

import pytest
import torch
import triton
import triton.language as tl

from moe_tutorial import runtime
from moe_tutorial.experiments.sm90 import compile_report
from moe_tutorial.kernels import backward_kernel, gluon_dact_kernel, gluon_grad_kernel, gluon_kernel
from moe_tutorial.kernels.align import align_block_size
from moe_tutorial.kernels.stable_align import expert_rows, stable_align_block_size
from moe_tutorial.kernels.trainable_layer import trainable_moe_layer
from moe_tutorial.kernels.training_configs import heuristic_training_configs, in_tl, training_configs
from moe_tutorial.layer import moe_layer
from moe_tutorial.reference import LAYER_GRAD_INPUTS, reference_layer_grads, rel_error, tolerance
from moe_tutorial.shapes import MODEL_SHAPES, random_layer_problem

DEV = runtime.DEVICE
LAYER_ARGS = ("x", "w13", "w2", "topk_weights", "topk_ids")


def run_layer(p: dict, fn=trainable_moe_layer, used: int | None = None):
    """``(out, {name: grad})`` of ``fn`` on problem ``p`` with every float input a fresh leaf (a
    view of ``p``'s tensor, not a copy). With ``used``, the experts from ``used`` on must get
    gradients of exactly zero, and only the first ``used`` experts' weight gradients are returned:
    DeepSeek-V3's full ones are 22 GB, and two runs' of them with the weights fill an H100."""
    leaves = {k: (p[k].detach().requires_grad_() if k in LAYER_GRAD_INPUTS else p[k]) for k in LAYER_ARGS}
    out = fn(**leaves)
    out.backward(p["d_out"])
    grads = {k: leaves[k].grad for k in LAYER_GRAD_INPUTS}
    if used is not None:
        for k in ("w13", "w2"):
            assert bool((grads[k][used:] == 0).all()), f"an idle expert's d{k} is not zero"
            grads[k] = grads[k][:used].clone()
    return out, grads


def assert_same_bits(p: dict, first=trainable_moe_layer, second=trainable_moe_layer, used: int | None = None) -> None:
    """The output and every gradient of ``first`` and ``second`` on problem ``p``, bitwise equal
    (with ``used``, as :func:`run_layer` keeps them)."""
    out1, g1 = run_layer(p, first, used)
    out2, g2 = run_layer(p, second, used)
    assert torch.equal(out1, out2)
    for k in LAYER_GRAD_INPUTS:
        assert torch.equal(g1[k], g2[k]), k


def errors(p: dict, grads: dict, used: int | None = None) -> dict:
    """Relative error of each gradient against autograd through the float64 reference; with
    ``used``, on the first ``used`` experts only (whose weight gradients :func:`run_layer` keeps)."""
    ref = reference_layer_grads(p["x"], p["w13"][:used], p["w2"][:used], p["topk_weights"], p["topk_ids"],
                                p["d_out"])
    return {k: rel_error(grads[k], ref[k]) for k in LAYER_GRAD_INPUTS}


# (M, hidden, inter, E, topk): the interpreter's tiles are 16 x 32 x 32, so 40 and 24 are ragged.
CPU_CASES = {
    "ragged K and N": (7, 40, 24, 5, 2),
    "topk = 1": (9, 32, 16, 4, 1),
    "topk = 3, many experts": (6, 24, 40, 16, 3),
}


@pytest.mark.parametrize("case", CPU_CASES)
def test_every_gradient_matches_the_float64_reference(case):
    p = random_layer_problem(*CPU_CASES[case], device=DEV, seed=len(case))
    _, grads = run_layer(p)
    errs = errors(p, grads)
    assert all(e < tolerance(torch.float32) for e in errs.values()), errs


def test_an_expert_nobody_chose_gets_a_zero_gradient():
    p = random_layer_problem(8, 32, 32, 6, 2, device=DEV, seed=3, experts=4)     # experts 4 and 5 get no token
    _, grads = run_layer(p)
    assert torch.equal(grads["w13"][4:], torch.zeros_like(grads["w13"][4:]))
    assert torch.equal(grads["w2"][4:], torch.zeros_like(grads["w2"][4:]))
    errs = errors(p, grads)
    assert all(e < tolerance(torch.float32) for e in errs.values()), errs


@pytest.fixture(scope="module")
def tiny():
    """Values near 1e-5: x scaled down so that every gate is about 1e-5, silu(gate) about half of it."""
    return random_layer_problem(6, 32, 16, 4, 2, device=DEV, seed=5, x_scale=1e-5)


def test_gradients_near_1e_5_by_relative_error(tiny):
    _, grads = run_layer(tiny)
    errs = errors(tiny, grads)
    assert all(e < tolerance(torch.float32) for e in errs.values()), errs


@triton.jit
def _wrong_dswiglu(dact, gate, up, s):
    """The derivative of silu(g) * u with d_up = dA' * sigmoid(g): the g of silu(g) = g * sigmoid(g) forgotten."""
    sig = tl.sigmoid(gate)
    silu = gate * sig
    d_gate = dact * up * sig * (1.0 + gate * (1.0 - sig)) * s[:, None]
    return d_gate, dact * sig * s[:, None], silu * up * s[:, None], silu * up


@pytest.mark.skipif(not runtime.INTERPRETED, reason="patches a @triton.jit helper, which only the interpreter "
                                                    "looks up at run time")
def test_a_wrong_swiglu_passes_an_absolute_tolerance_and_fails_the_relative_one(tiny, monkeypatch):
    ref = reference_layer_grads(*(tiny[k] for k in LAYER_ARGS), tiny["d_out"])
    monkeypatch.setattr(backward_kernel, "dswiglu_epilogue", _wrong_dswiglu)
    _, wrong = run_layer(tiny)
    # dW13 = dH x^T flows through d_up: wrong by a factor of about 1 / gate = 1e5 ...
    assert rel_error(wrong["w13"], ref["w13"]) > 1.0
    # ... yet every element is within an atol of 1.4e-2 of the truth: an absolute test would pass it.
    assert float((wrong["w13"].double() - ref["w13"]).abs().max()) < 1.4e-2


def test_two_runs_give_the_same_bits():
    p = random_layer_problem(20, 32, 32, 4, 2, device=DEV, seed=7)
    assert_same_bits(p)


def configs_of(p: dict):
    """The training configs the layer picks for problem ``p``."""
    M, E = p["x"].shape[0], p["w13"].shape[0]
    return training_configs(M, E, p["x"].shape[1], p["w2"].shape[2], p["topk_ids"].shape[1], p["x"].dtype)


def tl_configs_of(p: dict):
    """:func:`configs_of` with every GEMM in ``tl`` (the GPU's tables choose Gluon for some shapes)."""
    return in_tl(configs_of(p), p["x"].shape[0], p["w13"].shape[0], p["topk_ids"].shape[1])


def layer_in_tl(p: dict):
    """The layer of problem ``p`` with every GEMM in ``tl`` (the baseline of the two below)."""
    return functools.partial(trainable_moe_layer, configs=tl_configs_of(p))


def without_sorted_copies(p: dict):
    """The layer of problem ``p`` in ``tl`` with dO and x gathered inside the kernels (no sorted copies)."""
    return functools.partial(trainable_moe_layer, configs=dataclasses.replace(tl_configs_of(p), sorted_copies=False))


def with_persistent_rows_gemms(p: dict):
    """The layer of problem ``p`` in ``tl`` with its M-grouped GEMMs (gate/up, dA', dx) on the persistent grid."""
    cfg = tl_configs_of(p)
    persistent = {name: dataclasses.replace(getattr(cfg, name), persistent=True) for name in ("up", "dact", "dx")}
    return functools.partial(trainable_moe_layer, configs=dataclasses.replace(cfg, **persistent))


@pytest.mark.parametrize("case", ["ragged K and N", "topk = 1"])
def test_the_persistent_grid_computes_the_same_tiles(case):
    """A few programs walking every tile (the interpreter runs three) give each tile's bits, as
    one program per tile does: the same tile, the same K loop, only the loop around it."""
    p = random_layer_problem(*CPU_CASES[case], device=DEV, seed=3)
    assert_same_bits(p, layer_in_tl(p), with_persistent_rows_gemms(p))


@pytest.mark.parametrize("case", CPU_CASES)
def test_sorted_copies_move_rows_not_sums(case):
    """With dO and x copied into sorted order the GEMMs read the same values in the same order:
    the same bits as gathering them in the kernels, and the copies are on by default."""
    p = random_layer_problem(*CPU_CASES[case], device=DEV, seed=len(case) + 1)
    assert training_configs(7, 5, 40, 24, 2, torch.float32).sorted_copies
    assert_same_bits(p, layer_in_tl(p), without_sorted_copies(p))


def test_sorted_copies_must_be_a_bool():
    cfg = heuristic_training_configs(64, 4, 2)
    with pytest.raises(TypeError, match="configs.sorted_copies must be a bool"):
        dataclasses.replace(cfg, sorted_copies="yes").checked()


def test_strided_inputs_and_only_some_inputs_requiring_grad():
    p = random_layer_problem(5, 32, 16, 4, 2, device=DEV, seed=9)
    x = torch.stack([p["x"], -p["x"]], dim=2).flatten(1)[:, ::2]       # every other column of a wider tensor
    assert torch.equal(x, p["x"]) and x.stride(1) == 2
    w2 = p["w2"].transpose(1, 2).contiguous().transpose(1, 2)           # same values, [E, I, K] in memory
    w13 = p["w13"].clone().requires_grad_()
    out = moe_layer(x, w13, w2, p["topk_weights"], p["topk_ids"], impl="sorted")
    out.backward(p["d_out"])
    ref = reference_layer_grads(*(p[k] for k in LAYER_ARGS), p["d_out"])
    assert rel_error(w13.grad, ref["w13"]) < tolerance(torch.float32)


def test_an_empty_batch_backpropagates_zeros():
    p = random_layer_problem(0, 32, 16, 4, 2, device=DEV)
    out, grads = run_layer(p)
    assert out.shape == (0, 32)
    assert grads["x"].shape == (0, 32) and float(grads["w13"].abs().sum()) == 0.0


def test_moe_layer_sorted_keeps_the_inference_path_without_autograd(monkeypatch):
    p = random_layer_problem(5, 32, 16, 4, 2, device=DEV, seed=2)
    calls = []
    monkeypatch.setattr(backward_kernel, "rows_gemm_kernel", _Spy(backward_kernel.rows_gemm_kernel, calls))
    with torch.no_grad():
        moe_layer(*(p[k].clone().requires_grad_() if k in LAYER_GRAD_INPUTS else p[k] for k in LAYER_ARGS),
                  impl="sorted")
    assert calls == [], "without autograd, moe_layer(impl='sorted') is Part 4's forward and saves nothing"


class _Spy:
    def __init__(self, kernel, calls):
        self.kernel, self.calls = kernel, calls

    def __getitem__(self, grid):
        self.calls.append(grid)
        return self.kernel[grid]


def test_the_forward_keeps_x_h_and_the_alignment_only():
    M, hidden, inter, E, topk = 9, 32, 16, 4, 2
    p = random_layer_problem(M, hidden, inter, E, topk, device=DEV, seed=4)
    saved = []

    def pack(t):
        saved.append(t)
        return t

    leaves = {k: (p[k].clone().requires_grad_() if k in LAYER_GRAD_INPUTS else p[k]) for k in LAYER_ARGS}
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        trainable_moe_layer(**leaves)
    inputs = {id(leaves[k]) for k in ("x", "w13", "w2", "topk_ids")}
    new = [t for t in saved if id(t) not in inputs]
    shapes = sorted(tuple(t.shape) for t in new)
    block_m = training_configs(M, E, hidden, inter, topk, p["x"].dtype).up.block_m
    alignment = stable_align_block_size(p["topk_ids"], block_m, E)
    expected = sorted([(M * topk,), (M * topk, 2 * inter)] + [tuple(t.shape) for t in alignment])
    assert shapes == expected, "kept: the router weights flat, H one row per pair, the alignment; nothing of A or Y"


# --------------------------------------------------------------------------- the stable alignment

@pytest.mark.parametrize("M, E, topk, block_m, dtype", [
    (7, 5, 2, 4, torch.int32), (40, 8, 2, 16, torch.int32), (33, 64, 6, 16, torch.int64), (3, 4, 1, 1, torch.int32),
    # Past one chunk of 1024 pairs: the chunks' prefix sum places the later ones.
    (700, 16, 4, 64, torch.int32), (300, 128, 8, 16, torch.int64)])
def test_the_stable_alignment_is_part_4s_with_each_run_in_token_order(M, E, topk, block_m, dtype):
    ids = torch.rand(M, E, generator=torch.Generator().manual_seed(M)).topk(topk, dim=1).indices.to(dtype).to(DEV)
    stable, part4 = stable_align_block_size(ids, block_m, E), align_block_size(ids, block_m, E)
    assert int(stable[2]) == int(part4[2])
    used = int(stable[2])
    assert torch.equal(stable[1][:used // block_m], part4[1][:used // block_m])
    assert bool((stable[1][used // block_m:] == -1).all()) and bool((stable[0][used:] == M * topk).all())
    assert stable[0].dtype == stable[1].dtype == stable[2].dtype == torch.int32
    assert stable[1].numel() == part4[1].numel() and stable[0].numel() == part4[0].numel()
    rows = expert_rows(stable).tolist()
    flat = ids.flatten().tolist()
    for e in range(E):
        run = [p for p in stable[0][rows[e]:rows[e + 1]].tolist() if p != M * topk]
        assert run == [p for p, i in enumerate(flat) if i == e], e
    assert rows == expert_rows(part4).tolist()


def test_the_stable_alignment_refuses_bad_input():
    with pytest.raises(ValueError, match=r"^block_m: expected a power of two"):
        stable_align_block_size(torch.zeros(2, 1, dtype=torch.int32, device=DEV), 3, 4)
    with pytest.raises(TypeError, match=r"^topk_ids: expected dtype torch.int32 or torch.int64"):
        stable_align_block_size(torch.zeros(2, 1, device=DEV), 4, 4)


# --------------------------------------------------------------------------- bad input

def _bad_inputs():
    p = random_layer_problem(3, 32, 16, 4, 2, device=DEV)
    base = {k: p[k] for k in LAYER_ARGS}
    return {
        "w2 of the wrong shape": (dict(base, w2=base["w2"][:, :, :8]), ValueError, r"^w2: expected shape"),
        "ids out of range": (dict(base, topk_ids=base["topk_ids"] + 4), ValueError, r"^topk_ids: expected expert ids"),
        "float64": ({k: (v.double() if v.is_floating_point() else v) for k, v in base.items()}, TypeError,
                    r"^x: expected one of"),
        "weights' dtype differs": (dict(base, w13=base["w13"].half()), TypeError, r"^w13: expected x's dtype"),
    }


@pytest.mark.parametrize("case", list(_bad_inputs()))
def test_bad_input_is_refused_with_its_name(case):
    args, kind, message = _bad_inputs()[case]
    args = {k: (v.requires_grad_() if k == "x" and v.is_floating_point() else v) for k, v in args.items()}
    with pytest.raises(kind, match=message):
        trainable_moe_layer(**args)


def test_the_fused_kernel_still_refuses_autograd():
    p = random_layer_problem(3, 32, 16, 4, 2, device=DEV)
    args = {k: (p[k].clone().requires_grad_() if k == "x" else p[k]) for k in LAYER_ARGS}
    with pytest.raises(ValueError, match=r"^x: expected a tensor that does not require grad"):
        moe_layer(**args, impl="fused")


def test_training_configs_are_valid_and_share_one_block_m():
    for s in MODEL_SHAPES.values():
        for M in (4096, 32768):
            cfg = heuristic_training_configs(M, s.num_experts, s.topk).checked()
            assert cfg.up.block_m == cfg.down.block_m == cfg.dact.block_m == cfg.dx.block_m
            assert cfg.dw13.block_k <= cfg.up.block_m and cfg.up.block_m % cfg.dw13.block_k == 0
    chosen = training_configs(4096, 8, 64, 32, 2, torch.float32)       # the layer does not check it again
    assert chosen == chosen.checked()


@pytest.mark.parametrize("itemsize", [2, 4], ids=["bf16", "fp32"])
def test_training_tiles_fit_in_shared_memory(itemsize):
    """Every heuristic tile's pipeline fits Hopper's shared memory in the step's dtype (an fp32
    notebook problem once asked for 254 KB of 227), and the bf16 tiles are the ones measured."""
    from moe_tutorial.kernels.configs import SMEM_LIMIT, smem_bytes

    for M in (1, 6, 64, 4096, 32768):
        for E, topk in ((3, 2), (8, 2), (128, 8), (256, 8)):
            cfg = heuristic_training_configs(M, E, topk, itemsize).checked()
            for name, gated in (("up", True), ("dact", True), ("dx", False), ("dw13", False)):
                assert smem_bytes(getattr(cfg, name), gated, itemsize) <= SMEM_LIMIT, (M, E, topk, name)
    bf16 = heuristic_training_configs(32768, 8, 2)
    assert (bf16.up.block_m, bf16.up.block_n, bf16.up.block_k, bf16.up.num_stages) == (128, 128, 64, 4)
    # The dW tile by run length: 8192 rows per expert take 128 x 256, 128 rows (DeepSeek-V3 at
    # T = 4096) one warpgroup's 128 x 128, as the H200's tile sweeps chose.
    tile = lambda c: (c.block_m, c.block_n, c.block_k, c.num_warps, c.num_stages)  # noqa: E731
    assert tile(bf16.dw13) == tile(bf16.dw2) == (128, 256, 64, 8, 3)
    short = heuristic_training_configs(4096, 256, 8)
    assert tile(short.dw13) == tile(short.dw2) == (128, 128, 32, 4, 4)
    fp32 = heuristic_training_configs(6, 3, 2, 4)
    assert smem_bytes(fp32.up, True, 4) < smem_bytes(heuristic_training_configs(6, 3, 2).up, True, 4)


# --------------------------------------------------------------------------- on a GPU, bf16

GPU_SHAPES = {  # (model, tokens, experts that get tokens): real hidden, intermediate, E and topk
    "Qwen3-30B-A3B": ("Qwen3-30B-A3B", 512, 32),
    "Mixtral-8x7B": ("Mixtral-8x7B", 256, 8),
    "DeepSeek-V3": ("DeepSeek-V3", 256, 16),
}
#: bf16 inputs and outputs, fp32 accumulation: what a bf16 training step may differ from float64 by.
BF16_GRAD_TOLERANCE = 2e-2


def real_shape_problem(case: str, token_scale: int = 1) -> tuple[dict, int]:
    """``(problem, experts used)`` of a GPU_SHAPES case in bf16, with ``token_scale`` times its tokens.
    The experts that get tokens are made at random (on the CPU, as everywhere), the others zeros:
    DeepSeek-V3's 256 experts would be 11 G random values on the CPU, and an idle expert's weights
    change nothing."""
    name, M, used = GPU_SHAPES[case]
    s = MODEL_SHAPES[name]
    p = random_layer_problem(M * token_scale, s.hidden, s.intermediate, used, s.topk, device=DEV,
                             dtype=torch.bfloat16)
    for name_, t in (("w13", p["w13"]), ("w2", p["w2"])):
        p[name_] = torch.cat([t, t.new_zeros(s.num_experts - used, *t.shape[1:])])
    return p, used


@pytest.mark.gpu
@pytest.mark.skipif(not runtime.ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", GPU_SHAPES)
def test_bf16_gradients_on_real_shapes(case):
    p, used = real_shape_problem(case)
    _, grads = run_layer(p, used=used)
    errs = errors(p, grads, used)
    assert all(e < BF16_GRAD_TOLERANCE for e in errs.values()), errs


@pytest.mark.gpu
@pytest.mark.skipif(not runtime.ON_GPU, reason="needs a CUDA GPU")
def test_bf16_two_runs_give_the_same_bits_where_part_4s_alignment_would_not():
    s = MODEL_SHAPES["Qwen3-30B-A3B"]
    p = random_layer_problem(4096, s.hidden, s.intermediate, s.num_experts, s.topk, device=DEV, dtype=torch.bfloat16)
    assert_same_bits(p)


@pytest.mark.gpu
@pytest.mark.skipif(not runtime.ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", GPU_SHAPES)
def test_bf16_sorted_copies_through_tma_give_the_gathered_bits(case):
    p, used = real_shape_problem(case, token_scale=4)
    assert_same_bits(p, layer_in_tl(p), without_sorted_copies(p), used)


@pytest.mark.gpu
@pytest.mark.skipif(not runtime.ON_GPU, reason="needs a CUDA GPU")
@pytest.mark.parametrize("case", ["Qwen3-30B-A3B", "DeepSeek-V3"])
def test_bf16_the_persistent_grid_computes_the_same_tiles(case):
    p, used = real_shape_problem(case, token_scale=4)
    assert_same_bits(p, layer_in_tl(p), with_persistent_rows_gemms(p), used)


@pytest.mark.gpu
@pytest.mark.skipif(not runtime.ON_GPU, reason="needs a CUDA GPU")
def test_bf16_gradients_near_1e_5_by_relative_error():
    p = random_layer_problem(256, 2048, 768, 16, 4, device=DEV, dtype=torch.bfloat16, x_scale=1e-5)
    _, grads = run_layer(p)
    errs = errors(p, grads)
    assert all(e < BF16_GRAD_TOLERANCE for e in errs.values()), errs
    assert math.isfinite(sum(errs.values()))


# ------------------------------------------------------------------ the dW GEMMs in Gluon (Hopper)

#: The Gluon dW kernel's tile as the H200 sweep's first candidate: 128 x 256 of dW, 64 rows a step.
GLUON_DW = dict(block_m=128, block_n=256, block_k=64, num_warps=8, num_stages=3, gluon=True)
#: The Gluon dA' kernel's tile: 128 x 128, 64 of K a step, four stages, 8 MMA warps (the backward's
#: block_m stays the alignment's; the tests' shapes align on 128 rows, or on 64 with 4 warps).
GLUON_DACT = dict(block_n=128, block_k=64, num_warps=8, num_stages=4, gluon=True)


def with_gluon(p: dict, which=("dw2", "dw13")):
    """The layer of problem ``p`` with the GEMMs ``which`` on their Gluon kernels."""
    cfg = configs_of(p)
    # gate/up and dA' keep the alignment's block_m, with a warpgroup of MMA warps per 64 rows of it.
    rows = dict(GLUON_DACT, num_warps=8 if cfg.dact.block_m == 128 else 4)
    gluon = {name: dataclasses.replace(getattr(cfg, name), **(rows if name in ("up", "dact") else GLUON_DW))
             for name in which}
    return functools.partial(trainable_moe_layer, configs=dataclasses.replace(cfg, **gluon))


@pytest.mark.parametrize("gemm", ["up", "dact", "dw2"])
def test_gluon_is_for_gate_up_dact_and_the_dw_gemms_only_and_the_backwards_need_the_sorted_copies(gemm):
    cfg = heuristic_training_configs(4096, 8, 2)
    for name in ("down", "dx"):
        with pytest.raises(ValueError, match=rf"^configs\.{name}\.gluon: only gate/up \(up\), dA' \(dact\) and"):
            dataclasses.replace(cfg, **{name: dataclasses.replace(getattr(cfg, name), gluon=True)}).checked()
    gluon = dataclasses.replace(cfg, **{gemm: dataclasses.replace(getattr(cfg, gemm), gluon=True)})
    assert getattr(gluon.checked(), gemm).gluon
    without = dataclasses.replace(gluon, sorted_copies=False)
    if gemm == "up":           # the forward copies x into sorted order itself
        assert without.checked().up.gluon
    else:
        with pytest.raises(ValueError, match="sorted_copies=True"):
            without.checked()


def test_strided_weights_take_gate_up_and_dact_back_to_tl_where_the_table_chose_gluon():
    """The tables are measured on contiguous weights; a caller's w13 or w2 that TMA cannot read as it
    lies (here, in [E, K, N] memory order, or any CPU tensor) gets the heuristic's tl tile instead of an error."""
    from moe_tutorial.kernels.trainable_layer import weights_fit

    cfg = heuristic_training_configs(4096, 8, 2)
    gluon = dataclasses.replace(cfg, up=dataclasses.replace(cfg.up, **GLUON_DACT),
                                dact=dataclasses.replace(cfg.dact, **GLUON_DACT)).checked()
    w13 = torch.zeros(8, 32, 128, dtype=torch.bfloat16).transpose(1, 2).contiguous().transpose(1, 2)
    w2 = torch.zeros(8, 64, 32, dtype=torch.bfloat16).transpose(1, 2).contiguous().transpose(1, 2)
    fitted = weights_fit(gluon, w13, w2, 4096, 2)
    assert not fitted.up.gluon and not fitted.dact.gluon and fitted.dact == cfg.dact and fitted.dw2 == gluon.dw2
    assert weights_fit(cfg, w13, w2, 4096, 2) is cfg


@pytest.mark.skipif(runtime.ON_GPU, reason="off Hopper the layer must say why; on a GPU the GPU tests run it")
@pytest.mark.parametrize("gemm, name", [("dw2", "dW"), ("dact", "dA'")])
def test_the_gluon_kernels_say_why_they_cannot_run_here(gemm, name):
    p = random_layer_problem(*CPU_CASES["ragged K and N"], device=DEV, seed=3)
    with pytest.raises(ValueError, match=f"the Gluon {name} kernel: .*needs a Hopper GPU"):
        run_layer(p, with_gluon(p, (gemm,)))


@pytest.mark.skipif(runtime.ON_GPU, reason="off Hopper the layer must say why; on a GPU the GPU tests run it")
def test_the_gluon_gate_up_kernel_says_why_it_cannot_run_here():
    p = random_layer_problem(*CPU_CASES["ragged K and N"], device=DEV, seed=3)
    with pytest.raises(RuntimeError, match="the Gluon kernel needs a Hopper GPU"):
        run_layer(p, with_gluon(p, ("up",)))


@pytest.mark.skipif(not gluon_kernel.HAVE_GLUON, reason="this Triton has no Gluon")
def test_the_gluon_dw_kernel_keeps_one_mma_in_flight_on_transposed_operands():
    """Compiled for sm90 on any machine: each step waits with one wgmma group outstanding (the step
    before has finished, its buffer goes back), ptxas kept it, the MMA reads both operands as they
    lie in shared memory (L transposed: ``imm-trans-a`` 1), the tile goes out through TMA's bulk
    store, and three stages of 64 rows plus the 128 x 256 store buffer fit Hopper's 227 KB."""
    from moe_tutorial.kernels.configs import SMEM_LIMIT

    r = compile_report("gluon-bf16-dw")
    assert 1 in r["wait_groups"] and r["spill_bytes"] == 0 and r["serialised"] == ""
    mma = re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.bf16\.bf16 [^;]*, (\d), (\d);", r["ptx"])
    assert mma and mma.groups() == ("1", "1")          # both operands MN-major: L^T and R as they lie
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in r["ptx"]
    assert 3 * (64 * 128 + 64 * 256) * 2 + 128 * 256 * 2 <= r["shared"] <= SMEM_LIMIT


@pytest.mark.skipif(not gluon_kernel.HAVE_GLUON, reason="this Triton has no Gluon")
def test_the_gluon_dact_kernel_hands_each_accumulator_to_its_epilogue_warps():
    """Compiled for sm90 on any machine: the MMA warps wait per step with one wgmma group in flight,
    kept by ptxas; W2's tile read as it lies (``[K, N]``: B MN-major, ``imm-trans-b`` 1); the MMA
    warps (256 threads) and the epilogue warps (128) each meet at a barrier of their own, which the
    others never wait at; the ring plus one fp32 accumulator within Hopper's 227 KB. The unrolled
    epilogue spills a few registers (126 bytes with Triton 3.6 at 128 columns)."""
    from moe_tutorial.kernels.configs import SMEM_LIMIT

    block_n, stages = 128, 4
    r = compile_report("gluon-bf16-dact")
    assert 1 in r["wait_groups"] and r["serialised"] == "" and r["spill_bytes"] <= 256
    mma = re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{block_n}k16\.f32\.bf16\.bf16 [^;]*, (\d), (\d);",
                    r["ptx"])
    assert mma and mma.groups() == ("0", "1")
    assert re.search(r"bar\.sync \t\d+, 256;", r["ptx"]) and re.search(r"bar\.sync \t\d+, 128;", r["ptx"])
    ring, acc = stages * (128 * 64 + 64 * block_n) * 2, 128 * block_n * 4
    assert ring + acc <= r["shared"] <= SMEM_LIMIT


@pytest.mark.gpu
@pytest.mark.skipif(gluon_grad_kernel.UNAVAILABLE is not None, reason="needs a Hopper GPU")
@pytest.mark.parametrize("case", GPU_SHAPES)
def test_bf16_the_gluon_dw_kernel_on_real_shapes(case):
    """dW2 and dW13 by the Gluon kernel within bf16 tolerance of float64, and an idle expert's
    exactly zero (its empty run stores a tile of zeros)."""
    p, used = real_shape_problem(case)
    _, grads = run_layer(p, with_gluon(p), used)
    errs = errors(p, grads, used)
    assert all(errs[k] < BF16_GRAD_TOLERANCE for k in ("w13", "w2")), errs


@pytest.mark.gpu
@pytest.mark.skipif(gluon_dact_kernel.UNAVAILABLE is not None, reason="needs a Hopper GPU")
@pytest.mark.parametrize("case", GPU_SHAPES)
def test_bf16_the_gluon_dact_kernel_on_real_shapes(case):
    """Every gradient with dA' (and so dH, s * A and the router gradient) from the Gluon kernel,
    within bf16 tolerance of float64, and an idle expert's dW exactly zero. Four times the tokens of
    the other real-shape tests: the Gluon kernel's tiles are 64 or 128 rows (DeepSeek-V3's 256 tokens
    align on 32)."""
    p, used = real_shape_problem(case, token_scale=4)
    assert configs_of(p).dact.block_m >= 64
    _, grads = run_layer(p, with_gluon(p, ("dact", "dw2", "dw13")), used)
    errs = errors(p, grads, used)
    assert all(e < BF16_GRAD_TOLERANCE for e in errs.values()), errs


@pytest.mark.gpu
@pytest.mark.skipif(gluon_kernel.UNAVAILABLE is not None, reason="needs a Hopper GPU")
@pytest.mark.parametrize("case", GPU_SHAPES)
def test_bf16_the_gluon_gate_up_kernel_keeps_h_on_real_shapes(case):
    """The forward's gate/up GEMM on Part 4's Gluon kernel, H kept by its epilogue: the output and
    every gradient (all read H) within bf16 tolerance of float64, and the same bits twice."""
    p, used = real_shape_problem(case, token_scale=4)
    layer = with_gluon(p, ("up",))
    out, grads = run_layer(p, layer, used)
    errs = errors(p, grads, used)
    assert all(e < BF16_GRAD_TOLERANCE for e in errs.values()), errs
    out2, _ = run_layer(p, layer, used)
    assert torch.equal(out, out2)


@pytest.mark.gpu
@pytest.mark.skipif(gluon_dact_kernel.UNAVAILABLE is not None, reason="needs a Hopper GPU")
def test_bf16_the_gluon_dact_kernel_gives_the_same_bits_twice():
    """The two warpgroups take the tiles in a fixed order and each tile's sums run in a fixed order:
    the router gradient's partial sums and every other output, bitwise equal across two runs."""
    s = MODEL_SHAPES["Qwen3-30B-A3B"]
    p = random_layer_problem(4096, s.hidden, s.intermediate, s.num_experts, s.topk, device=DEV, dtype=torch.bfloat16)
    layer = with_gluon(p, ("dact",))
    assert_same_bits(p, layer, layer)


@pytest.mark.gpu
@pytest.mark.skipif(gluon_dact_kernel.UNAVAILABLE is not None, reason="needs a Hopper GPU")
def test_bf16_the_gluon_dact_kernel_with_ragged_columns_and_values_near_1e_5():
    """I = 200 (the last 128-column tile cut by TMA's bounds, its strips masked) and x near 1e-5 (a
    wrong dSwiGLU would pass an absolute tolerance): every gradient by relative error, and against
    the ``tl`` kernel's; a hidden size that is no multiple of block_k is refused, with the reason."""
    p = random_layer_problem(1500, 384, 200, 6, 2, device=DEV, dtype=torch.bfloat16, seed=5, x_scale=1e-5)
    _, grads = run_layer(p, with_gluon(p, ("dact",)))
    _, tl_grads = run_layer(p)
    errs = errors(p, grads)
    assert all(e < BF16_GRAD_TOLERANCE for e in errs.values()), errs
    assert all(rel_error(grads[k], tl_grads[k]) < 1e-2 for k in LAYER_GRAD_INPUTS)
    q = random_layer_problem(300, 96, 128, 4, 2, device=DEV, dtype=torch.bfloat16, seed=6)
    with pytest.raises(ValueError, match=r"W2's 96 rows an expert .* multiple of block_k \(64\)"):
        run_layer(q, with_gluon(q, ("dact",)))


@pytest.mark.gpu
@pytest.mark.skipif(gluon_grad_kernel.UNAVAILABLE is not None, reason="needs a Hopper GPU")
def test_bf16_the_gluon_dw_kernel_gives_the_same_bits_twice():
    s = MODEL_SHAPES["Qwen3-30B-A3B"]
    p = random_layer_problem(4096, s.hidden, s.intermediate, s.num_experts, s.topk, device=DEV, dtype=torch.bfloat16)
    layer = with_gluon(p)
    assert_same_bits(p, layer, layer)


@pytest.mark.gpu
@pytest.mark.skipif(gluon_grad_kernel.UNAVAILABLE is not None, reason="needs a Hopper GPU")
def test_bf16_the_gluon_dw_kernel_with_ragged_columns_and_long_runs():
    """dW2 ``[E, 384, 200]``: the last column tile is cut by TMA's bounds (loads read zeros, the
    store writes only what lies inside); 1500 tokens over 6 experts, runs of about 500 rows. dW13's
    400 rows an expert are no multiple of 128: refused, with the reason."""
    p = random_layer_problem(1500, 384, 200, 6, 2, device=DEV, dtype=torch.bfloat16, seed=5)
    _, grads = run_layer(p, with_gluon(p, ("dw2",)))
    _, tl_grads = run_layer(p)
    ref = reference_layer_grads(*(p[k] for k in LAYER_ARGS), p["d_out"])
    assert rel_error(grads["w2"], ref["w2"]) < BF16_GRAD_TOLERANCE
    assert rel_error(grads["w2"], tl_grads["w2"]) < 1e-2
    with pytest.raises(ValueError, match=r"400 rows an expert must be a multiple of block_m \(128\)"):
        run_layer(p, with_gluon(p, ("dw13",)))


def test_expert_tile_is_the_tile_each_program_of_the_kernel_stores():
    """Launch the first n programs only, for n = 1, 2, ...: the tile that appears is program n - 1's."""
    from moe_tutorial.kernels.backward_kernel import expert_grad_kernel, expert_tile

    E, P, Q, bp, bq, group = 2, 40, 24, 16, 16, 2
    ids = torch.tensor([[0], [1], [0]], dtype=torch.int32, device=DEV)
    alignment = stable_align_block_size(ids, 16, E)
    rows = expert_rows(alignment)
    left, right = torch.ones(3, P, device=DEV), torch.ones(3, Q, device=DEV)
    tiles = E * -(-P // bp) * -(-Q // bq)
    for n in range(1, tiles + 1):
        out = torch.full((E, P, Q), float("nan"), device=DEV)
        expert_grad_kernel[(n,)](left, None, right, None, out, alignment[0], rows, P=P, Q=Q, num_pairs=3, row_div=1,
                                 stride_lm=P, stride_rm=Q, stride_ce=P * Q, stride_cp=Q, stride_cq=1,
                                 BLOCK_P=bp, BLOCK_Q=bq, BLOCK_R=16, GROUP_M=group, L_ROWS="gathered",
                                 R_ROWS="gathered", EVEN_P=False, EVEN_Q=False, DOT_PRECISION="ieee")
        e, tp, tq = expert_tile(n - 1, P, Q, bp, bq, group)
        assert not out[e, tp * bp:(tp + 1) * bp, tq * bq:(tq + 1) * bq].isnan().any(), n
        owned = {expert_tile(i, P, Q, bp, bq, group) for i in range(n)}
        assert len(owned) == n                      # no two programs own one tile
        assert int((~out.isnan()).sum()) == sum(min(bp, P - a * bp) * min(bq, Q - b * bq) for _, a, b in owned)


# ------------------------------------------------------------ bad expert ids, checked without a wait

def test_the_stable_alignment_drops_a_bad_id_where_the_layer_refuses_it():
    """The layer reads the ids' range after its kernels are queued (no host wait before them), so
    its alignment must stay in bounds with any id: a bad one is dropped, as Part 4's alignment
    drops it, and the layer still refuses it with the message of every other part."""
    ids = torch.tensor([[0, 5], [-1, 2], [1, 2]], device=DEV)
    alignment = stable_align_block_size(ids, 4, 3)
    rows = expert_rows(alignment).tolist()
    runs = [[p for p in alignment[0][rows[e]:rows[e + 1]].tolist() if p != ids.numel()] for e in range(3)]
    assert runs == [[0], [4], [3, 5]]
    many = torch.randint(0, 3, (600, 4), generator=torch.Generator().manual_seed(1)).to(DEV)   # three chunks
    many[5, 1], many[400, 0], many[599, 3] = 3, -1, 7
    alignment = stable_align_block_size(many, 16, 3)
    rows, flat = expert_rows(alignment).tolist(), many.flatten().tolist()
    for e in range(3):
        run = [p for p in alignment[0][rows[e]:rows[e + 1]].tolist() if p != many.numel()]
        assert run == [p for p, i in enumerate(flat) if i == e], e
    p = random_layer_problem(3, 8, 4, 3, 2, device=DEV)
    leaves = {k: (p[k].clone().requires_grad_() if k in LAYER_GRAD_INPUTS else p[k]) for k in LAYER_ARGS}
    with pytest.raises(ValueError, match=r"^topk_ids: expected expert ids in \[0, 3\), got an id of -1$"):
        trainable_moe_layer(**{**leaves, "topk_ids": ids})


def test_finish_ids_check_refuses_what_start_ids_check_copied():
    """The deferred check's second half, with the GPU's pinned copy and event stood in for."""
    from types import SimpleNamespace

    from moe_tutorial.checks import finish_ids_check, start_ids_check

    copied = SimpleNamespace(synchronize=lambda: None)
    with pytest.raises(ValueError, match=r"^topk_ids: expected expert ids in \[0, 3\), got an id of -1$"):
        finish_ids_check((torch.tensor([-1, 2]), copied, 3))
    with pytest.raises(ValueError, match=r"got an id of 3$"):
        finish_ids_check((torch.tensor([0, 3]), copied, 3))
    finish_ids_check((torch.tensor([0, 2]), copied, 3))
    finish_ids_check(None)
    if not runtime.ON_GPU:            # on a CPU the check runs at once: nothing is left pending
        assert start_ids_check(torch.tensor([[0, 2]]), 3) is None
        with pytest.raises(ValueError, match=r"got an id of 3$"):
            start_ids_check(torch.tensor([[0, 3]]), 3)


@pytest.mark.gpu
@pytest.mark.skipif(not runtime.ON_GPU, reason="needs a CUDA GPU")
def test_bf16_a_bad_id_is_refused_after_the_forward_and_leaves_the_gpu_usable():
    p, _ = real_shape_problem("Qwen3-30B-A3B")
    E = p["w13"].shape[0]
    bad = p["topk_ids"].clone()
    bad[7, 1] = E
    leaves = {k: (p[k].clone().requires_grad_() if k in LAYER_GRAD_INPUTS else p[k]) for k in LAYER_ARGS}
    with pytest.raises(ValueError, match=rf"^topk_ids: expected expert ids in \[0, {E}\), got an id of {E}$"):
        trainable_moe_layer(**{**leaves, "topk_ids": bad})
    torch.cuda.synchronize()          # no device-side error was left behind
    out, grads = run_layer(p)
    assert bool(torch.isfinite(out).all()) and all(bool(torch.isfinite(g).all()) for g in grads.values())
