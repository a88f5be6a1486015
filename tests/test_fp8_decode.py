"""Part 7's decode experiment (two launches, no alignment): against the float64 layer, against
the package's aligned layer, on strided weights, bad input, real shapes on a GPU, and the
reading of its H200 run."""
import moe_tutorial as mt  # noqa: I001  (first: picks the runtime)

import pytest
import torch

from moe_tutorial import quant, runtime
from moe_tutorial.experiments.fp8_decode import DecodeConfig, decode_summary, fp8_decode_layer, load_decode
from moe_tutorial.kernels.fp8_layer import fp8_moe_layer, layer_configs
from moe_tutorial.reference import FP8_LAYER_TOLERANCE, reference_fp8_moe_layer, rel_error
from test_fp8 import real_shape_problem

needs_gpu = pytest.mark.skipif(not runtime.ON_GPU, reason="needs a CUDA GPU")
DEV = runtime.DEVICE
TOL = 1e-5 if runtime.INTERPRETED else 1e-2


def problem(seed, M, K, inter, E, topk, device="cpu"):
    """Random x, quantised experts and a routing; weights scaled so outputs are O(1)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g)
    w13 = torch.randn(E, 2 * inter, K, generator=g) * K ** -0.5
    w2 = torch.randn(E, K, inter, generator=g) * inter ** -0.5
    tw, ti = mt.route(torch.randn(M, E, generator=g), topk)
    q13, s13 = quant.quantize_w13(w13)
    q2, s2 = quant.quantize_weight(w2)
    return [t.to(device) for t in (x.to(runtime.DEFAULT_DTYPE), q13, s13, q2, s2, tw, ti)]


@pytest.mark.parametrize("seed", range(4))
def test_decode_layer_against_float64_on_random_shapes(seed):
    g = torch.Generator().manual_seed(100 + seed)
    M = int(torch.randint(1, 4, (1,), generator=g))
    K = int(torch.randint(100, 400, (1,), generator=g))           # a last group shorter than 128, often
    inter = int(torch.randint(60, 300, (1,), generator=g))
    E = int(torch.randint(2, 9, (1,), generator=g))
    topk = int(torch.randint(1, E + 1, (1,), generator=g))
    cfg = DecodeConfig(block_n_up=(4, 16, 32, 8)[seed], block_n_down=(16, 4, 8, 32)[seed])
    x, q13, s13, q2, s2, tw, ti = problem(seed, M, K, inter, E, topk, DEV)
    y = fp8_decode_layer(x, q13, s13, q2, s2, tw, ti, cfg)
    assert y.shape == (M, K) and y.dtype == x.dtype
    ref = reference_fp8_moe_layer(x.cpu().float(), q13.cpu(), s13.cpu(), q2.cpu(), s2.cpu(), tw.cpu(), ti.cpu())
    assert rel_error(y.cpu(), ref) < TOL


def test_decode_layer_takes_the_aligned_paths_operands():
    """The same quantised operands and K steps as the aligned layer: only the last sum differs
    (fp32 here, rows rounded to x's dtype there), so in the interpreter's fp32 they agree closely."""
    x, q13, s13, q2, s2, tw, ti = problem(7, 2, 256, 192, 6, 3, DEV)
    aligned = fp8_moe_layer(x, q13, s13, q2, s2, tw, ti, configs=layer_configs(2, 6, 192, 256, 3))
    y = fp8_decode_layer(x, q13, s13, q2, s2, tw, ti)
    assert rel_error(y.cpu(), aligned.cpu().float()) < TOL


def test_decode_layer_reads_strided_weights():
    """Weights that are views with other strides (an expert-major copy transposed back) read right."""
    x, q13, s13, q2, s2, tw, ti = problem(3, 1, 256, 128, 4, 2, DEV)
    q13_t = q13.transpose(1, 2).contiguous().transpose(1, 2)          # same values, K no longer innermost
    q2_t = q2.transpose(1, 2).contiguous().transpose(1, 2)
    assert q13_t.stride(2) != 1 and q2_t.stride(2) != 1
    y = fp8_decode_layer(x, q13_t, s13, q2_t, s2, tw, ti)
    assert rel_error(y.cpu(), fp8_decode_layer(x, q13, s13, q2, s2, tw, ti).cpu()) == 0


def test_the_decode_path_refuses_an_id_out_of_range():
    """The decode kernels index the weights by id directly: the layer's checks must stop a bad one."""
    x, q13, s13, q2, s2, tw, ti = problem(5, 1, 128, 128, 4, 2, DEV)
    bad = ti.clone()
    bad[0, 1] = 4
    with pytest.raises(ValueError, match="topk_ids"):
        fp8_decode_layer(x, q13, s13, q2, s2, tw, bad)
    with pytest.raises(ValueError, match="w2"):
        fp8_decode_layer(x, q13, s13, q2[:, :, :64], s2, tw, ti)


def test_decode_path_refuses_more_than_16_experts_a_token():
    x, q13, s13, q2, s2, tw, ti = problem(6, 1, 128, 128, 18, 17, DEV)
    with pytest.raises(ValueError, match="at most 16"):
        fp8_decode_layer(x, q13, s13, q2, s2, tw, ti)


def test_decode_layer_empty_batch():
    x, q13, s13, q2, s2, tw, ti = problem(0, 1, 128, 128, 4, 2, DEV)
    assert fp8_decode_layer(x[:0], q13, s13, q2, s2, tw[:0], ti[:0]).shape == (0, 128)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("model", ["DeepSeek-V3", "Qwen3-30B-A3B", "Kimi-K2", "Mixtral-8x7B"])
@pytest.mark.parametrize("M", [1, 2, 8])
def test_decode_layer_on_real_shapes_on_gpu(model, M):
    x, q13, s13, q2, s2, tw, ti = real_shape_problem(model, M, 32)
    used = torch.unique(ti)
    local = torch.searchsorted(used, ti.long()).to(torch.int32)
    ref = reference_fp8_moe_layer(x.float(), q13[used], s13[used], q2[used], s2[used], tw, local)
    for cfg in (DecodeConfig(), DecodeConfig(4, 32, x_form="e4m3"), DecodeConfig(32, 8, num_warps=8, num_stages=3,
                                                                                 x_form="values")):
        y = fp8_decode_layer(x, q13, s13, q2, s2, tw, ti, cfg)
        assert rel_error(y, ref) < FP8_LAYER_TOLERANCE, cfg


def test_the_ways_of_reading_x_agree():
    """The gate/up kernel's x: quantised beforehand ("e4m3"), or in the kernel from values read one
    by one, or (a bf16 x, on a GPU: the interpreter refuses bf16) two per 32-bit word: the same
    quantised operands, so the same output."""
    x, q13, s13, q2, s2, tw, ti = problem(11, 2, 384, 128, 4, 2, DEV)
    forms = ("values", "e4m3") + (("words",) if runtime.ON_GPU else ())
    out = {form: fp8_decode_layer(x, q13, s13, q2, s2, tw, ti, DecodeConfig(x_form=form)) for form in forms}
    assert all(torch.equal(out["values"], out[form]) for form in forms)
    ref = reference_fp8_moe_layer(x.cpu().float(), q13.cpu(), s13.cpu(), q2.cpu(), s2.cpu(), tw.cpu(), ti.cpu())
    assert rel_error(out["values"].cpu(), ref) < TOL


def test_the_h200_run_is_read_per_model_and_m():
    """Every case of the committed run has its bf16, aligned and best decode time; the best is the
    least of the decode rows; the run covered the three FP8 models at M = 1, 2, 4 and 8."""
    rows = load_decode()
    summary = decode_summary(rows)
    assert {(c["model"], c["M"]) for c in summary} == {(m, M) for m in ("DeepSeek-V3", "Qwen3-30B-A3B", "Kimi-K2")
                                                       for M in (1, 2, 4, 8)}
    for c in summary:
        decode = [float(r["ms"]) * 1e3 for r in rows
                  if (r["model"], int(r["M"])) == (c["model"], c["M"]) and r["impl"].startswith("decode")]
        assert c["best_us"] == min(decode) and c["aligned_over_best"] == c["aligned_us"] / c["best_us"]
        assert c["bf16_us"] > c["aligned_us"] > 0
