"""Part 7: block-scaled FP8. Quantisation against float64, the Triton quantiser, the FP8 kernel and
layer in the interpreter (and on a GPU where there is one), checkpoints, bad input.

The ``gpu`` tests at the end run the FP8 layer on real model shapes.
"""
import moe_tutorial as mt  # noqa: I001  (first: picks the runtime)

import math

import pytest
import torch

from moe_tutorial import checkpoint, checks, quant, runtime
from moe_tutorial.kernels import fp8_layer
from moe_tutorial.kernels.configs import KernelConfig
from moe_tutorial.kernels.fp8_layer import fp8_moe_layer, fp8_moe_matmul
from moe_tutorial.kernels.fp8_quant import quantize_rows
from moe_tutorial.reference import FP8_LAYER_TOLERANCE, reference_fp8_moe_layer, reference_moe_matmul, rel_error

needs_gpu = pytest.mark.skipif(not runtime.ON_GPU, reason="needs a CUDA GPU")
DEV = runtime.DEVICE
#: The interpreter accumulates fp32 products of e4m3 values exactly enough for this; a GPU's
#: fp32 accumulation of FP8 tensor-core products lands near 1e-6 (bf16 output: 1e-2).
TOL = 1e-5 if runtime.INTERPRETED else 1e-2


def _all_e4m3() -> torch.Tensor:
    """Every finite e4m3 value, float32 (254 of the 256 codes; two are NaN)."""
    vals = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    return vals[torch.isfinite(vals)]


# ----------------------------------------------------------------- the float64 reference

@pytest.mark.parametrize("seed", range(6))
def test_quantize_weight_blocks_property(seed):
    g = torch.Generator().manual_seed(seed)
    E, N, K = (int(v) for v in torch.randint(1, 300, (3,), generator=g))
    E = E % 3 + 1
    w = torch.randn(E, N, K, generator=g) * float(torch.rand(1, generator=g) * 10 + 0.01)
    q, s = quant.quantize_weight(w)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    assert tuple(s.shape) == (E, math.ceil(N / 128), math.ceil(K / 128))
    # Each block's largest magnitude lands on 448 (the scale is amax / 448)
    blocks = quant._block_amax(q.float(), 128, 128)
    assert torch.allclose(blocks, torch.full_like(blocks, 448.0))
    # Rounding to 3 mantissa bits: each element within half an e4m3 step (2^-4 relative), or
    # within half the subnormal step 2^-10 times the scale
    deq = quant.dequantize_weight(q, s)
    full_s = quant._expand(s.double(), 128, 128, N, K)
    err = (deq - w.double()).abs()
    assert bool((err <= w.double().abs() * 2 ** -4 + full_s * 2 ** -10 + 1e-12).all())


def test_quantize_is_exact_on_e4m3_values_and_handles_zero_blocks():
    vals = _all_e4m3()
    x = torch.zeros(3, 300)
    x[0, : vals.numel()] = vals
    q, s = quant.quantize_activations(x)
    assert tuple(s.shape) == (3, 3)
    assert torch.equal(quant.dequantize_activations(q, s).float(), x)      # 448-max groups: scale 1
    assert bool((s[1:] > 0).all())                                           # zero rows: no division by zero
    assert torch.equal(quant.dequantize_activations(q, s)[1:], torch.zeros(2, 300, dtype=torch.float64))


def test_quantize_w13_blocks_halves_apart():
    w13 = torch.randn(2, 2 * 200, 130)
    q, s = quant.quantize_w13(w13)
    assert tuple(s.shape) == (2, 4, 2)                                       # 2 * ceil(200/128)
    qg, sg = quant.quantize_weight(w13[:, :200])
    assert torch.equal(q[:, :200].view(torch.uint8), qg.view(torch.uint8)) and torch.equal(s[:, :2], sg)
    assert rel_error(quant.dequantize_weight(q, s, halves=True), w13.double()) < 0.05
    q256, s256 = quant.quantize_w13(torch.randn(1, 256, 128))                # 128 | I: same as one block grid
    assert torch.equal(s256, quant.quantize_weight(quant.dequantize_weight(q256, s256, halves=True))[1])


def test_one_outlier_spoils_a_per_tensor_scale_not_a_block_scale():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(256, 256, generator=g)
    w[0, 0] = 1e5            # one outlier: the others fall to e4m3's subnormals under a per-tensor scale
    per_tensor = w.abs().max() / 448
    q_t = (w / per_tensor).clamp(-448, 448).to(torch.float8_e4m3fn).double() * per_tensor
    blocked = quant.dequantize_weight(*quant.quantize_weight(w))
    rest = torch.ones_like(w, dtype=torch.bool)
    rest[:128, :128] = False                                 # the three blocks without the outlier
    assert rel_error(blocked[rest], w.double()[rest]) < 0.04 < 0.1 < rel_error(q_t[rest], w.double()[rest])


@pytest.mark.parametrize("seed", range(4))
def test_quantize_rowwise_property(seed):
    """One scale per row (the anchor's CUTLASS kernel's format): each row's largest magnitude lands
    on 448, every element within half an e4m3 step of the float64 value, zero rows stay zero."""
    g = torch.Generator().manual_seed(seed)
    E, N, K = (int(v) for v in torch.randint(1, 200, (3,), generator=g))
    w = torch.randn(E % 3 + 1, N, K, generator=g) * float(torch.rand(1, generator=g) * 10 + 0.01)
    w[0, 0] = 0.0
    q, s = quant.quantize_rowwise(w)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32 and tuple(s.shape) == tuple(w.shape[:-1])
    amax = q[:, 1:].float().abs().amax(dim=-1)
    assert torch.equal(amax, torch.full_like(amax, 448.0))
    deq = quant.dequantize_rowwise(q, s)
    assert bool(((deq - w.double()).abs() <= w.double().abs() * 2 ** -4 + s.double()[..., None] * 2 ** -10).all())
    assert bool((s[0, 0] > 0) & (deq[0, 0] == 0).all())
    # the rows of a [M, K] batch: the same numbers as one 128-wide group each when K = 128
    x = torch.randn(5, 128, generator=g)
    assert torch.equal(quant.quantize_rowwise(x)[1], quant.quantize_activations(x)[1][:, 0])
    with pytest.raises(ValueError, match="at least 2 dims"):
        quant.quantize_rowwise(torch.ones(4))


@pytest.mark.parametrize("bad, kind, words", [
    (torch.tensor([[1.0, float("nan")]]), ValueError, "finite"),
    (torch.tensor([[1.0, float("inf")]]), ValueError, "finite"),
    (torch.ones(2, 2).to(torch.float8_e4m3fn), TypeError, "to quantise"),
    (torch.ones(4), ValueError, "at least 2 dims"),
])
def test_quantize_refuses(bad, kind, words):
    with pytest.raises(kind, match=words):
        quant.quantize_weight(bad)


# ---------------------------------------------------------------- the Triton quantiser

def test_round_to_e4m3_matches_torch_cast_everywhere():
    """Every e4m3 value, every midpoint between neighbours (ties to even), and values beside them:
    the kernel's rounding gives torch's cast (Triton 3.9's interpreter alone drops carries)."""
    vals = _all_e4m3().unique()
    mids = (vals[1:] + vals[:-1]) / 2
    near = torch.cat([mids * (1 + 1e-6), mids * (1 - 1e-6), torch.linspace(-448, 448, 20001)])
    x = torch.cat([vals, mids, near]).clamp(-448, 448)
    rows = x.numel() // 128
    x = x[: rows * 128].view(rows, 128)
    x[:, 0] = 448.0                                          # scale 1: q is x rounded
    q, s = quantize_rows(x.to(DEV))
    assert torch.equal(s.cpu(), torch.ones_like(s.cpu()))
    got, want = q.cpu().float(), x.to(torch.float8_e4m3fn).float()
    assert torch.equal(got, want), f"{(got != want).sum()} values differ, e.g. {x[got != want][:4].tolist()}"


@pytest.mark.parametrize("M, K", [(1, 128), (5, 200), (17, 384), (33, 50)])
def test_quantize_rows_equals_reference(M, K):
    g = torch.Generator().manual_seed(M * K)
    x = torch.randn(M, K, generator=g) * torch.logspace(-3, 3, M)[:, None]
    q, s = quantize_rows(x.to(DEV).to(runtime.DEFAULT_DTYPE))
    rq, rs = quant.quantize_activations(x.to(runtime.DEFAULT_DTYPE).float())
    assert torch.allclose(s.cpu(), rs, rtol=1e-6, atol=0)
    # fp32 x / scale against float64: a value on a rounding tie may land one e4m3 step away
    diff = (q.cpu().float() - rq.float()).abs()
    assert (diff > 0).float().mean() < 0.01
    assert bool((diff <= rq.float().abs() * 0.125 + 2 ** -9).all())


def test_e4m3_dot_runs_in_this_runtime():
    """tl.dot on e4m3 operands: on the FP8 tensor cores on a GPU, in numpy in the interpreter."""
    x = torch.randn(16, 128)
    w = torch.randn(1, 32, 128)
    xq, xs = quant.quantize_activations(x)
    wq, ws = quant.quantize_weight(w)
    ids = torch.zeros(16, 1, dtype=torch.int32)
    out = fp8_moe_matmul(xq.to(DEV), xs.to(DEV), wq.to(DEV), ws.to(DEV), ids.to(DEV))
    ref = reference_moe_matmul(quant.dequantize_activations(xq, xs), quant.dequantize_weight(wq, ws), ids)
    assert rel_error(out.cpu(), ref) < TOL


# ------------------------------------------------------------------------- the kernel

def _problem(seed, M, K, N, E, topk):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g)
    w = torch.randn(E, N, K, generator=g) * 0.05
    ids = torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(M)]).to(torch.int32)
    return x, w, ids


CONFIGS = [None, KernelConfig(block_m=16, block_n=32, block_k=64, group_m=2, num_stages=1, swap_ab=True),
           KernelConfig(block_m=32, block_n=64, block_k=128, group_m=1, num_stages=1),
           # 256 columns span two weight-scale blocks: one scale per column, not one per tile
           KernelConfig(block_m=16, block_n=256, block_k=128, group_m=1, num_stages=1)]


@pytest.mark.parametrize("seed, M, K, N, E, topk", [(0, 5, 256, 160, 4, 2), (1, 3, 200, 64, 3, 3),
                                                    (2, 9, 128, 130, 6, 1), (3, 1, 384, 96, 8, 8)])
@pytest.mark.parametrize("cfg", range(len(CONFIGS)))
def test_fp8_first_gemm_against_float64_on_dequantised_inputs(seed, M, K, N, E, topk, cfg):
    x, w, ids = _problem(seed, M, K, N, E, topk)
    xq, xs = quantize_rows(x.to(DEV))
    wq, ws = quant.quantize_weight(w)
    out = fp8_moe_matmul(xq, xs, wq.to(DEV), ws.to(DEV), ids.to(DEV), config=CONFIGS[cfg])
    assert out.shape == (M, topk, N) and out.dtype == fp8_layer.out_dtype()
    ref = reference_moe_matmul(quant.dequantize_activations(xq.cpu(), xs.cpu()), quant.dequantize_weight(wq, ws), ids)
    assert rel_error(out.cpu(), ref) < TOL


def test_fp8_first_gemm_router_weights_and_empty_batch():
    x, w, ids = _problem(4, 4, 128, 64, 4, 2)
    tw = torch.rand(4, 2)
    xq, xs = quantize_rows(x.to(DEV))
    wq, ws = quant.quantize_weight(w)
    plain = fp8_moe_matmul(xq, xs, wq.to(DEV), ws.to(DEV), ids.to(DEV)).cpu().float()
    weighted = fp8_moe_matmul(xq, xs, wq.to(DEV), ws.to(DEV), ids.to(DEV), tw.to(DEV)).cpu().float()
    assert rel_error(weighted, plain * tw[..., None]) < TOL
    empty = fp8_moe_matmul(xq[:0], xs[:0], wq.to(DEV), ws.to(DEV), ids[:0].to(DEV))
    assert empty.shape == (0, 2, 64)


@pytest.mark.parametrize("seed, M, K, I, E, topk", [(0, 5, 256, 192, 4, 2), (1, 7, 130, 128, 5, 3),
                                                    (2, 1, 128, 256, 8, 8)])
def test_fp8_layer_against_its_float64_reference(seed, M, K, I, E, topk):  # noqa: E741
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g)
    w13 = torch.randn(E, 2 * I, K, generator=g) * 0.1
    w2 = torch.randn(E, K, I, generator=g) * 0.1
    tw, ti = mt.route(torch.randn(M, E, generator=g), topk)
    q13, s13 = quant.quantize_w13(w13)
    q2, s2 = quant.quantize_weight(w2)
    y = fp8_moe_layer(x.to(DEV).to(runtime.DEFAULT_DTYPE), q13.to(DEV), s13.to(DEV), q2.to(DEV), s2.to(DEV),
                      tw.to(DEV), ti.to(DEV))
    assert y.shape == (M, K)
    ref = reference_fp8_moe_layer(x.to(runtime.DEFAULT_DTYPE).float(), q13, s13, q2, s2, tw, ti)
    assert rel_error(y.cpu(), ref) < TOL
    # ... and the quantisation's own cost, against the layer with unquantised weights
    assert rel_error(y.cpu(), mt.reference_moe_layer(x, w13, w2, tw, ti)) < 0.15


# ---------------------------------------------------------------------------- bad input

def _fp8_inputs():
    x, w, ids = _problem(5, 3, 128, 64, 2, 1)
    xq, xs = quantize_rows(x.to(DEV))
    wq, ws = quant.quantize_weight(w)
    return xq, xs, wq.to(DEV), ws.to(DEV), ids.to(DEV)


@pytest.mark.parametrize("change, kind, words", [
    (lambda a: {**a, "weight_scale": None}, ValueError, "weight_scale: expected the fp32 block scales"),
    (lambda a: {**a, "weight_scale": a["weight_scale"][:, :0]}, ValueError,
     r"weight_scale: expected shape \(2, 1, 1\)"),
    (lambda a: {**a, "weight_scale": a["weight_scale"].half()}, TypeError, "weight_scale: expected torch.float32"),
    (lambda a: {**a, "weight": a["weight"].float().to(torch.float8_e5m2)}, TypeError,
     "weight: expected torch.float8_e4m3fn"),
    (lambda a: {**a, "weight": a["weight"].float()}, TypeError, "quantise it first"),
    (lambda a: {**a, "weight_scale": a["weight_scale"] * float("nan")}, ValueError,
     r"weight_scale: expected finite scales, none negative .*, got nan at block \[0, 0, 0\]"),
    (lambda a: {**a, "x_scale": a["x_scale"] * float("inf")}, ValueError,
     r"x_scale: expected finite scales, none negative .*, got inf at block \[0, 0\]"),
    (lambda a: {**a, "x_scale": a["x_scale"][:, :0]}, ValueError, "x_scale: expected shape"),
    (lambda a: {**a, "topk_ids": a["topk_ids"] + 5}, ValueError, r"expert ids in \[0, 2\)"),
])
def test_fp8_matmul_refuses(change, kind, words):
    xq, xs, wq, ws, ids = _fp8_inputs()
    args = change({"x_q": xq, "x_scale": xs, "weight": wq, "weight_scale": ws, "topk_ids": ids})
    with pytest.raises(kind, match=words):
        fp8_moe_matmul(**args)


def test_fp8_layer_refuses_fp8_x_and_unscaled_halves():
    x = torch.randn(2, 128).to(DEV).to(runtime.DEFAULT_DTYPE)
    q13, s13 = quant.quantize_w13(torch.randn(2, 512, 128))
    q2, s2 = quant.quantize_weight(torch.randn(2, 128, 256))
    tw, ti = mt.route(torch.randn(2, 2), 1)
    args = [q13.to(DEV), s13.to(DEV), q2.to(DEV), s2.to(DEV), tw.to(DEV), ti.to(DEV)]
    with pytest.raises(TypeError, match="the FP8 path quantises them itself"):
        fp8_moe_layer(x.to(torch.float8_e4m3fn), *args)
    with pytest.raises(ValueError, match="w13_scale: expected shape"):
        fp8_moe_layer(x, args[0], args[1][:, :1], *args[2:])
    with pytest.raises(ValueError, match=r"w2: expected shape \(E, K, I\)"):
        fp8_moe_layer(x, *args[:2], args[2][:, :, :128], args[3][:, :, :1], *args[4:])


def test_fp8_refuses_a_triton_too_old(monkeypatch):
    monkeypatch.setattr(checks.triton, "__version__", "3.1.0")
    with pytest.raises(RuntimeError, match="FP8 kernels: .*3.1.0"):
        fp8_moe_matmul(*_fp8_inputs())


# ---------------------------------------------------------------------------- checkpoints

def _experts(E=3, I=192, K=256, seed=0):  # noqa: E741
    g = torch.Generator().manual_seed(seed)
    q13, s13 = quant.quantize_w13(torch.randn(E, 2 * I, K, generator=g))
    q2, s2 = quant.quantize_weight(torch.randn(E, K, I, generator=g))
    return checkpoint.Fp8Experts(q13, s13, q2, s2)


def test_checkpoint_round_trip_through_safetensors(tmp_path):
    from safetensors.torch import save_file

    experts = _experts()
    prefix = "model.layers.3.mlp."
    sd = checkpoint.expert_state_dict(experts, prefix)
    assert sd[prefix + "experts.2.gate_proj.weight"].shape == (192, 256)
    assert sd[prefix + "experts.2.down_proj.weight_scale_inv"].shape == (2, 2)
    sd["model.layers.3.mlp.gate.weight"] = torch.randn(3, 256)         # the router: not an expert
    save_file(sd, tmp_path / "model-00001-of-00002.safetensors")
    other_layer = {"model.layers.4.mlp.experts.0.gate_proj.weight": torch.zeros(1)}
    save_file(other_layer, tmp_path / "model-00002-of-00002.safetensors")
    loaded = checkpoint.load_experts(tmp_path, prefix)
    for name in ("w13", "w13_scale", "w2", "w2_scale"):
        a, b = getattr(loaded, name), getattr(experts, name)
        assert a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def test_checkpoint_refuses_missing_scales_and_e5m2():
    sd = checkpoint.expert_state_dict(_experts(), "")
    no_scale = {k: v for k, v in sd.items() if k != "experts.1.up_proj.weight_scale_inv"}
    with pytest.raises(KeyError, match="experts.1.up_proj.weight_scale_inv.*need their block scales"):
        checkpoint.stack_experts(no_scale)
    e5 = {**sd, "experts.0.down_proj.weight": sd["experts.0.down_proj.weight"].float().to(torch.float8_e5m2)}
    with pytest.raises(TypeError, match="experts.0.down_proj.weight: expected torch.float8_e4m3fn"):
        checkpoint.stack_experts(e5)
    gap = {k: v for k, v in sd.items() if not k.startswith("experts.1.")}
    with pytest.raises(KeyError, match=r"none for expert\(s\) \[1\]"):
        checkpoint.stack_experts(gap)
    with pytest.raises(KeyError, match="none under that prefix"):
        checkpoint.stack_experts(sd, "model.layers.9.mlp.")


def test_checkpoint_experts_run_through_the_fp8_layer():
    experts = _experts(E=4, I=128, K=128, seed=1)
    stacked = checkpoint.stack_experts(checkpoint.expert_state_dict(experts, "p."), "p.")
    x = torch.randn(3, 128)
    tw, ti = mt.route(torch.randn(3, 4), 2)
    y = fp8_moe_layer(x.to(DEV).to(runtime.DEFAULT_DTYPE), *(t.to(DEV) for t in (stacked.w13, stacked.w13_scale,
                      stacked.w2, stacked.w2_scale)), tw.to(DEV), ti.to(DEV))
    ref = reference_fp8_moe_layer(x.to(runtime.DEFAULT_DTYPE).float(), experts.w13, experts.w13_scale, experts.w2,
                                  experts.w2_scale, tw, ti)
    assert rel_error(y.cpu(), ref) < TOL


# ------------------------------------------------------------------ real shapes on a GPU

def real_shape_problem(model: str, M: int, max_experts: int):
    """``(x, q13, s13, q2, s2, tw, ti)`` on the GPU: a model's expert shapes with at most
    ``max_experts`` experts (the same tiles, less memory), block-quantised, bf16 x, a routing."""
    s = mt.get_shape(model)
    E = min(s.num_experts, max_experts)
    g = torch.Generator(device="cuda").manual_seed(M)
    w13 = torch.randn(E, 2 * s.intermediate, s.hidden, device="cuda", generator=g) * 0.02
    w2 = torch.randn(E, s.hidden, s.intermediate, device="cuda", generator=g) * 0.02
    q13, s13 = quant.quantize_w13(w13)
    q2, s2 = quant.quantize_weight(w2)
    del w13, w2
    x = torch.randn(M, s.hidden, device="cuda", generator=g).bfloat16()
    tw, ti = mt.route(torch.randn(M, E, device="cuda", generator=g), min(s.topk, E))
    return x, q13, s13, q2, s2, tw, ti


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("model", ["DeepSeek-V3", "Qwen3-30B-A3B", "Kimi-K2", "Mixtral-8x7B"])
@pytest.mark.parametrize("M", [1, 64, 2048])
def test_fp8_layer_on_real_shapes_on_gpu(model, M):
    x, q13, s13, q2, s2, tw, ti = real_shape_problem(model, M, 64)
    y = fp8_moe_layer(x, q13, s13, q2, s2, tw, ti)
    rows = torch.arange(min(M, 4), device="cuda")
    used = torch.unique(ti[rows])
    local = torch.searchsorted(used, ti[rows].long()).to(torch.int32)
    ref = reference_fp8_moe_layer(x[rows].float(), q13[used], s13[used], q2[used], s2[used], tw[rows], local)
    assert rel_error(y[rows], ref) < FP8_LAYER_TOLERANCE
    xq, xs = quantize_rows(x)
    first = fp8_moe_matmul(xq, xs, q13, s13, ti)
    ref1 = reference_moe_matmul(quant.dequantize_activations(xq[rows], xs[rows]),
                                quant.dequantize_weight(q13[used], s13[used]), local)
    assert rel_error(first[rows], ref1) < 1e-2


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("block_m, block_k, swap, tma, warps", [
    (16, 128, True, True, 4), (16, 128, False, True, 4), (32, 64, True, False, 4), (64, 128, False, True, 4),
    (128, 128, False, True, 8), (128, 64, False, False, 8)])
def test_fp8_kernel_flavours_compile_and_agree_on_gpu(block_m, block_k, swap, tma, warps):
    """Every switch of the FP8 kernel, through the tensor-core path, on a DeepSeek-V3-sized expert."""
    E, N, K, M, topk = 8, 512, 7168, 96, 2
    g = torch.Generator(device="cuda").manual_seed(block_m)
    wq, ws = quant.quantize_weight(torch.randn(E, N, K, device="cuda", generator=g) * 0.02)
    x = torch.randn(M, K, device="cuda", generator=g).bfloat16()
    ids = torch.stack([torch.randperm(E, device="cuda", generator=g)[:topk] for _ in range(M)]).int()
    xq, xs = quantize_rows(x)
    cfg = KernelConfig(block_m=block_m, block_n=128, block_k=block_k, num_warps=warps, num_stages=3, use_tma=tma,
                       short_tails=False, swap_ab=swap)
    out = fp8_moe_matmul(xq, xs, wq, ws, ids, config=cfg)
    ref = reference_moe_matmul(quant.dequantize_activations(xq, xs), quant.dequantize_weight(wq, ws), ids)
    assert rel_error(out, ref) < 1e-2
    q13, s13 = quant.quantize_w13(torch.randn(E, 2 * 256, K, device="cuda", generator=g) * 0.02)
    q2, s2 = quant.quantize_weight(torch.randn(E, K, 256, device="cuda", generator=g) * 0.02)
    tw, ti = mt.route(torch.randn(M, E, device="cuda", generator=g), topk)
    y = fp8_moe_layer(x, q13, s13, q2, s2, tw, ti, configs=(cfg, cfg))
    assert rel_error(y, reference_fp8_moe_layer(x.float(), q13, s13, q2, s2, tw, ti)) < FP8_LAYER_TOLERANCE


def test_the_fp8_kernel_refuses_the_persistent_grid():
    """Part 4's persistent grid lost in the FP8 kernel on every H200 case and left it: a config that
    asks for it is refused at the door, naming the field, not run another way."""
    import dataclasses

    from moe_tutorial.kernels.configs import CPU_FP8_CONFIG

    g = torch.Generator().manual_seed(4)
    M, K, inter, E, topk = 20, 256, 128, 4, 2
    x = torch.randn(M, K, generator=g)
    w13q, w13s = quant.quantize_w13(torch.randn(E, 2 * inter, K, generator=g) / 16)
    w2q, w2s = quant.quantize_weight(torch.randn(E, K, inter, generator=g) / 16)
    tw, ids = torch.topk(torch.softmax(torch.randn(M, E, generator=g), -1), topk)
    walk = dataclasses.replace(CPU_FP8_CONFIG, persistent=True)
    with pytest.raises(ValueError, match=r"^configs\[0\]\.persistent: the FP8 kernel has no persistent grid"):
        fp8_moe_layer(x, w13q, w13s, w2q, w2s, tw, ids, configs=(walk, CPU_FP8_CONFIG))
    xq, xs = quantize_rows(x)
    with pytest.raises(ValueError, match=r"^config\.persistent: the FP8 kernel has no persistent grid"):
        fp8_moe_matmul(xq, xs, w13q, w13s, ids, config=walk)


@pytest.mark.parametrize("model, M", [(m, M) for m in ("DeepSeek-V3", "Qwen3-30B-A3B", "Kimi-K2", "Mixtral-8x7B")
                                      for M in (1, 8, 64, 256) if (m, M) != ("Mixtral-8x7B", 256)])
def test_the_untuned_small_m_tiles_as_the_h100_sweeps_chose_them(model, M):
    """``fp8_heuristic_config`` up to 16 rows an expert (measurements/gpu-notes.md, twenty-third
    session): swapped 16- or 32-row tiles; the gate/up GEMM 128 wide (its epilogue quantises whole
    groups), the others 64 wide with 3 stages over a K of 4096 or more; each one the kernel accepts."""
    from moe_tutorial.kernels.configs import check_fp8_config, fp8_heuristic_config
    from moe_tutorial.perf.tuning import problem_dims
    from moe_tutorial.shapes import get_shape

    s = get_shape(model)
    rows = M * s.topk // s.num_experts
    assert rows <= 16                 # Mixtral-8x7B at M = 256 has 64: past this branch
    for variant in ("plain", "gated", "down"):
        N, K = problem_dims(s, variant)
        c = fp8_heuristic_config(M, s.topk, s.num_experts, variant, N=N, K=K, kernel="tl")
        check_fp8_config(c, quant_out=variant == "gated")
        assert c.swap_ab and c.use_tma and c.block_m == (16 if max(rows, 1) <= 4 else 32)
        assert c.block_n == (128 if variant == "gated" else 64)
        assert c.num_stages == (3 if variant != "gated" and K >= 4096 else 4), (variant, K)
    # without K (a caller that does not know it) the deeper pipeline stays
    assert fp8_heuristic_config(M, s.topk, s.num_experts, "plain", kernel="tl").num_stages == 4


@pytest.mark.parametrize("model, M", [("Qwen3-30B-A3B", 1024), ("DeepSeek-V3", 2048), ("Kimi-K2", 4096),
                                      ("Mixtral-8x7B", 256)])
def test_the_untuned_tiles_from_64_rows_an_expert(model, M):
    """``fp8_heuristic_config`` from 64 rows an expert (measurements/gpu-notes.md, twenty-fourth
    session): 64-row tiles; 256 wide at 8 warps over a K of 4096 or more, else (and for the gate/up
    GEMM) 128 wide at 4 warps; each one the kernel accepts."""
    from moe_tutorial.kernels.configs import check_fp8_config, fp8_heuristic_config
    from moe_tutorial.perf.tuning import problem_dims
    from moe_tutorial.shapes import get_shape

    s = get_shape(model)
    assert 64 <= M * s.topk // s.num_experts < 128            # this branch, and the tl kernel's rows
    for variant in ("plain", "gated", "down"):
        N, K = problem_dims(s, variant)
        c = fp8_heuristic_config(M, s.topk, s.num_experts, variant, N=N, K=K, kernel="tl")
        check_fp8_config(c, quant_out=variant == "gated")
        wide = variant != "gated" and K >= 4096
        assert (c.block_m, c.block_n, c.num_warps, c.swap_ab) == (64, 256 if wide else 128, 8 if wide else 4, False), (
            variant, K)
    # without K the wide tile stays, as before the sweep
    assert fp8_heuristic_config(M, s.topk, s.num_experts, "plain", kernel="tl").block_n == 256


@pytest.mark.parametrize("seed", range(5))
def test_row_tiles_pads_each_expert_to_whole_tiles(seed):
    """``row_tiles`` against a count by hand over random routings: an expert with no rows has no tile,
    one with n rows has ceil(n / block_m), and the padded rows cover every routed pair."""
    from moe_tutorial.experiments.gluon_fp8 import row_tiles

    g = torch.Generator().manual_seed(seed)
    E, topk, M = int(torch.randint(2, 40, (1,), generator=g)), 2, int(torch.randint(1, 300, (1,), generator=g))
    ids = torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(M)])
    by_hand = {b: sum(math.ceil(int((ids == e).sum()) / b) for e in range(E)) for b in (16, 64, 128)}
    for b, tiles in by_hand.items():
        assert row_tiles(ids, E, b) == tiles and b * tiles >= M * topk
    assert row_tiles(torch.zeros(0, topk, dtype=torch.long), E, 64) == 0
