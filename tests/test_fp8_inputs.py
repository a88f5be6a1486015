"""Part 7's bad input: every way the FP8 API used to accept input it should refuse, or to refuse it
with the wrong name, now refused with an error that names the argument (and the element or the
file); and what cannot be refused without reading device values (inside a CUDA graph) comes out
NaN, never as finite numbers that look right.

The ``gpu`` tests at the end check the same on a GPU, where reading values back costs a host sync.
"""
import moe_tutorial as mt  # noqa: I001  (first: picks the runtime)

import json

import numpy as np
import pytest
import torch

from moe_tutorial import checkpoint, checks, quant, runtime
from moe_tutorial.kernels.configs import CPU_FP8_CONFIG, KernelConfig
from moe_tutorial.kernels.fp8_layer import fp8_moe_layer, fp8_moe_matmul
from moe_tutorial.kernels.fp8_quant import launch_quantize_rows, quantize_rows
from moe_tutorial.reference import reference_fp8_moe_layer, reference_moe_matmul, rel_error

needs_gpu = pytest.mark.skipif(not runtime.ON_GPU, reason="needs a CUDA GPU")
interpreter_only = pytest.mark.skipif(not runtime.INTERPRETED, reason="the CPU interpreter's behaviour")
DEV = runtime.DEVICE
DTYPE = runtime.DEFAULT_DTYPE


def _layer(M=4, K=256, inter=128, E=3, topk=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g)
    q13, s13 = quant.quantize_w13(torch.randn(E, 2 * inter, K, generator=g) * 0.1)
    q2, s2 = quant.quantize_weight(torch.randn(E, K, inter, generator=g) * 0.1)
    tw, ti = mt.route(torch.randn(M, E, generator=g), topk)
    return {"x": x.to(DEV, DTYPE), "w13": q13.to(DEV), "w13_scale": s13.to(DEV), "w2": q2.to(DEV),
            "w2_scale": s2.to(DEV), "topk_weights": tw.to(DEV), "topk_ids": ti.to(DEV)}


def _first_gemm(M=3, K=256, N=128, E=2, seed=1):
    g = torch.Generator().manual_seed(seed)
    xq, xs = quant.quantize_activations(torch.randn(M, K, generator=g))
    wq, ws = quant.quantize_weight(torch.randn(E, N, K, generator=g))
    ids = torch.randint(0, E, (M, 1), generator=g, dtype=torch.int32)
    return {"x_q": xq.to(DEV), "x_scale": xs.to(DEV), "weight": wq.to(DEV), "weight_scale": ws.to(DEV),
            "topk_ids": ids.to(DEV)}


# ----------------------------------------------------------------------------- NaN and Inf in x
@pytest.mark.parametrize("bad, shown", [(float("nan"), "nan"), (float("inf"), "inf"), (-float("inf"), "-inf")])
def test_quantize_rows_refuses_nan_and_inf_naming_the_element(bad, shown):
    x = torch.randn(3, 200)
    x[2, 150] = bad
    with pytest.raises(ValueError, match=rf"x: expected finite values .*, got {shown} at \[2, 150\]"):
        quantize_rows(x.to(DEV, DTYPE))
    with pytest.raises(ValueError, match=r"x: expected finite values"):
        quant.quantize_activations(x)                      # the float64 reference refuses it too


@pytest.mark.parametrize("where", [(0, 0, 0), (6, 3, 17), (11, 7, 31)])
def test_the_weight_quantisers_find_nan_in_any_piece_they_check(monkeypatch, where):
    """The finiteness check walks a layer's experts a piece at a time (a whole DeepSeek-V3 w13 at
    once would need a 7 GB bool copy): with pieces of two experts, a NaN in the first, a middle or
    the last piece is refused all the same, and an empty or a finite layer is not."""
    monkeypatch.setattr(quant, "_CHUNK", 2 * 8 * 32)
    w = torch.randn(12, 8, 32)
    quant.quantize_weight(w)
    quant.quantize_w13(torch.empty(0, 8, 32))
    w[where] = float("nan")
    for quantise in (quant.quantize_weight, quant.quantize_w13):
        with pytest.raises(ValueError, match=r"expected finite values"):
            quantise(w)


def test_the_quantiser_gives_a_group_with_nan_or_inf_a_nan_scale():
    """Where the values are not read back (a CUDA graph), the kernel itself marks the group: its
    scale is NaN, where tl.max alone would skip a NaN (stored as -448) and an Inf made the scale Inf."""
    x = torch.randn(3, 256)
    x[0, 3], x[1, 200] = float("nan"), float("inf")
    q, s = launch_quantize_rows(x.to(DEV, DTYPE))
    s = s.cpu()
    assert s[0, 0].isnan() and s[1, 1].isnan(), s
    assert torch.isfinite(s[0, 1]) and torch.isfinite(s[1, 0]) and torch.isfinite(s[2]).all(), s
    good, ref = launch_quantize_rows(x[2:].to(DEV, DTYPE)), quant.quantize_activations(x[2:])
    assert torch.allclose(good[1].cpu(), ref[1], rtol=1e-6)


def test_fp8_layer_refuses_nan_in_x_and_gives_nan_where_it_cannot_read(monkeypatch):
    args = _layer()
    x = args["x"].clone()
    x[1, 7] = float("nan")
    with pytest.raises(ValueError, match=r"x: expected finite values .*, got nan at \[1, 7\]"):
        fp8_moe_layer(**{**args, "x": x})
    # As inside a CUDA graph's capture, where no value can be read back: token 1 comes out NaN, the others right.
    monkeypatch.setattr(checks, "capturing", lambda t: True)
    y = fp8_moe_layer(**{**args, "x": x}).cpu()
    assert y[1].isnan().all() and torch.isfinite(y[[0, 2, 3]]).all()
    good = fp8_moe_layer(**args).cpu()
    assert torch.equal(y[[0, 2, 3]], good[[0, 2, 3]])


def test_the_fp8_layer_reads_its_inputs_values_once(monkeypatch):
    """The ids' range, x's values and both weights' scales in one read back (one host sync on a GPU;
    it was three, without x's values)."""
    reads = []
    real = checks.check_values

    def counted(**kw):
        reads.append(sorted(k for k, v in kw.items() if v is not None))
        return real(**kw)

    monkeypatch.setattr(checks, "check_values", counted)
    fp8_moe_layer(**_layer())
    assert reads == [["e4m3", "finite", "num_experts", "scales", "topk_ids"]], reads


# ----------------------------------------------------------------------------- quantize_rows' input
@pytest.mark.parametrize("bad, kind, words", [
    ([[1.0, 2.0]], TypeError, r"x: expected a torch.Tensor \[M, K\], got list"),
    (np.ones((2, 128), dtype=np.float32), TypeError, "x: expected a torch.Tensor .*, got ndarray"),
    (torch.ones(128), ValueError, r"x: expected a 2-D tensor, got shape \(128,\)"),
    (torch.ones(2, 128, dtype=torch.complex64), TypeError, "x: expected a real floating-point tensor"),
    (torch.ones(2, 128, dtype=torch.int32), TypeError, "x: expected a real floating-point tensor"),
    (torch.ones(2, 128).to(torch.float8_e4m3fn), TypeError, "the FP8 path quantises them itself"),
    (torch.ones(2, 128, device="meta"), ValueError, "x: expected a tensor that holds values"),
])
def test_quantize_rows_refuses_what_is_not_activations(bad, kind, words):
    with pytest.raises(kind, match=words):
        quantize_rows(bad)


# ----------------------------------------------------------------------------- experts and weights
def test_no_experts_names_the_weight():
    q, s = quant.quantize_weight(torch.zeros(0, 128, 256))            # was an IndexError inside quant.py
    assert q.shape == (0, 128, 256) and s.shape == (0, 1, 2)
    args = _first_gemm()
    with pytest.raises(ValueError, match="weight: expected at least one expert"):
        fp8_moe_matmul(**{**args, "weight": q.to(DEV), "weight_scale": s.to(DEV)})
    layer = _layer()
    q13, s13 = quant.quantize_w13(torch.zeros(0, 256, 256))
    q2, s2 = quant.quantize_weight(torch.zeros(0, 256, 128))
    with pytest.raises(ValueError, match="w13: expected at least one expert"):
        fp8_moe_layer(**{**layer, "w13": q13.to(DEV), "w13_scale": s13.to(DEV), "w2": q2.to(DEV),
                         "w2_scale": s2.to(DEV)})


def test_swapped_w13_and_w2_are_called_swapped():
    args = _layer()
    swapped = {**args, "w13": args["w2"], "w13_scale": args["w2_scale"], "w2": args["w13"],
               "w2_scale": args["w13_scale"]}
    with pytest.raises(ValueError, match=r"w13, w2: .*, got w13 \(3, 256, 128\) and w2 \(3, 256, 256\): they are "
                                         "swapped"):
        fp8_moe_layer(**swapped)
    x, w13, w2 = torch.randn(2, 8), torch.randn(3, 12, 8), torch.randn(3, 8, 6)
    tw, ti = mt.route(torch.randn(2, 3), 2)
    with pytest.raises(ValueError, match="they are swapped"):                  # the bf16 layer too
        mt.moe_layer(x, w2, w13, tw, ti, impl="loop")


def test_a_zero_scale_for_a_block_of_zeros_is_allowed_and_a_negative_one_named():
    args = _first_gemm(N=256)
    wq, ws = args["weight"].clone(), args["weight_scale"].clone()
    wq[1, 128:, :128] = 0                              # expert 1's block (1, 0) all zero, stored with scale 0
    ws[1, 1, 0] = 0.0
    out = fp8_moe_matmul(**{**args, "weight": wq, "weight_scale": ws})
    ref = reference_moe_matmul(quant.dequantize_activations(args["x_q"].cpu(), args["x_scale"].cpu()),
                               quant.dequantize_weight(wq.cpu(), ws.cpu()), args["topk_ids"].cpu())
    assert rel_error(out.cpu(), ref) < (1e-5 if runtime.INTERPRETED else 1e-2)
    ws[1, 1, 1] = -0.5
    with pytest.raises(ValueError, match=r"weight_scale: expected finite scales, none negative .*, got -0.5 at "
                                         r"block \[1, 1, 1\]"):
        fp8_moe_matmul(**{**args, "weight": wq, "weight_scale": ws})


def test_quantising_a_parameter_builds_no_graph():
    w = torch.nn.Parameter(torch.randn(2, 130, 140))
    for q, s in (quant.quantize_weight(w), quant.quantize_w13(w[:, :130]), quant.quantize_activations(w[0])):
        assert not q.requires_grad and not s.requires_grad and q.grad_fn is None and s.grad_fn is None


@interpreter_only
def test_nan_codes_are_refused_where_the_interpreter_would_read_them_as_480():
    args = _first_gemm()
    xq = args["x_q"].clone()
    xq.view(torch.uint8)[2, 5] = 0xFF                  # -NaN
    with pytest.raises(ValueError, match=r"x_q: expected no e4m3 NaN codes .* \+-480.*, got a NaN code at \[2, 5\]"):
        fp8_moe_matmul(**{**args, "x_q": xq})
    layer = _layer()
    w2 = layer["w2"].clone()
    w2.view(torch.uint8)[0, 1, 2] = 0x7F
    with pytest.raises(ValueError, match=r"w2: expected no e4m3 NaN codes .*, got a NaN code at \[0, 1, 2\]"):
        fp8_moe_layer(**{**layer, "w2": w2})


# ----------------------------------------------------------------------------- configs
_CFG = dict(block_m=16, block_n=128, block_k=128, group_m=1, num_warps=4, num_stages=1)


@pytest.mark.parametrize("config, kind, words", [
    (KernelConfig(**{**_CFG, "block_k": 0}), ValueError, "config.block_k: expected a power of two of at least 16"),
    (KernelConfig(**{**_CFG, "block_k": 256}), ValueError, "config.block_k: expected a power of two dividing 128"),
    (dict(_CFG), TypeError, r"config: expected a KernelConfig \(build one with KernelConfig\(\*\*that_dict\)\)"),
])
def test_fp8_matmul_checks_its_config(config, kind, words):
    with pytest.raises(kind, match=words):
        fp8_moe_matmul(**_first_gemm(), config=config)


@pytest.mark.parametrize("configs, kind, words", [
    (CPU_FP8_CONFIG, TypeError, r"configs: expected a pair \(gate/up KernelConfig, down KernelConfig\), got "
                                "KernelConfig"),
    ((CPU_FP8_CONFIG,) * 3, TypeError, "configs: expected a pair .*, got 3 items"),
    ((KernelConfig(**{**_CFG, "block_n": 64}), CPU_FP8_CONFIG), ValueError,
     "configs.0..block_n: expected 128, since this GEMM quantises its output"),
    ((CPU_FP8_CONFIG, KernelConfig(**{**_CFG, "block_k": 0})), ValueError, "configs.1..block_k: expected a power"),
    ((CPU_FP8_CONFIG, dict(_CFG)), TypeError, r"configs.1.: expected a KernelConfig"),
    ((CPU_FP8_CONFIG, KernelConfig(**{**_CFG, "block_m": 32})), ValueError, "one block_m; got 16 and 32"),
])
def test_fp8_layer_checks_its_configs(configs, kind, words):
    with pytest.raises(kind, match=words):
        fp8_moe_layer(**_layer(), configs=configs)
    with pytest.raises(kind, match=words):                 # an empty batch too: a bad pair is bad anyway
        fp8_moe_layer(**{k: v[:0] if k in ("x", "topk_weights", "topk_ids") else v for k, v in _layer().items()},
                      configs=configs)


# ----------------------------------------------------------------------------- checkpoints
def _save_sharded(folder, E=4, I=128, K=128, prefix="model.layers.1.mlp."):  # noqa: E741
    """A layer's experts in two shards (experts 0-1, 2-3) and the index that lists them."""
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(3)
    q13, s13 = quant.quantize_w13(torch.randn(E, 2 * I, K, generator=g))
    q2, s2 = quant.quantize_weight(torch.randn(E, K, I, generator=g))
    sd = checkpoint.expert_state_dict(checkpoint.Fp8Experts(q13, s13, q2, s2), prefix)
    weight_map = {}
    for shard, experts in (("model-00001-of-00002.safetensors", (0, 1)), ("model-00002-of-00002.safetensors", (2, 3))):
        part = {k: v for k, v in sd.items() if int(k[len(prefix) + len("experts."):].split(".")[0]) in experts}
        save_file(part, folder / shard)
        weight_map.update({k: shard for k in part})
    (folder / checkpoint.INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return prefix, sd


def test_a_missing_shard_is_named_with_what_it_holds(tmp_path):
    prefix, sd = _save_sharded(tmp_path)
    assert checkpoint.load_experts(tmp_path, prefix).num_experts == 4
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"model-00002-of-00002.safetensors missing \(no such file; it holds "
                                                "12 of them, e.g. model.layers.1.mlp.experts.2."):
        checkpoint.load_experts(tmp_path, prefix)


def test_a_shard_left_out_of_the_files_given_is_named(tmp_path):
    prefix, _ = _save_sharded(tmp_path)
    with pytest.raises(FileNotFoundError, match="model-00002-of-00002.safetensors missing .not among the files given"):
        checkpoint.load_experts([tmp_path / "model-00001-of-00002.safetensors"], prefix)


def test_a_tensor_the_index_puts_in_a_shard_must_be_there(tmp_path):
    from safetensors.torch import load_file, save_file

    prefix, _ = _save_sharded(tmp_path)
    shard = tmp_path / "model-00001-of-00002.safetensors"
    tensors = load_file(shard)
    del tensors[prefix + "experts.1.up_proj.weight"]
    save_file(tensors, shard)
    with pytest.raises(KeyError, match=r"'model.layers.1.mlp.experts.1.up_proj.weight' in .*model-00001-of-00002"
                                       r".safetensors, as model.safetensors.index.json says"):
        checkpoint.load_experts(tmp_path, prefix)


@pytest.mark.parametrize("damage", ["empty", "truncated", "text", "pickle"])
def test_an_unreadable_file_is_named(tmp_path, damage):
    prefix, _ = _save_sharded(tmp_path)
    shard = tmp_path / "model-00002-of-00002.safetensors"
    data = shard.read_bytes()
    if damage == "pickle":
        torch.save({"a": torch.zeros(3)}, shard)
    else:
        shard.write_bytes({"empty": b"", "truncated": data[:len(data) // 2], "text": b"not tensors at all"}[damage])
    with pytest.raises(ValueError, match=r"paths: expected .safetensors files, got .*model-00002-of-00002.safetensors"
                                         ", which is empty, truncated or of another format"):
        checkpoint.load_experts(tmp_path, prefix)


def test_fewer_experts_than_the_model_has_is_an_error_when_told(tmp_path):
    prefix, sd = _save_sharded(tmp_path)
    first_two = {k: v for k, v in sd.items() if ".experts.2." not in k and ".experts.3." not in k}
    assert checkpoint.stack_experts(first_two, prefix).num_experts == 2
    with pytest.raises(KeyError, match=r"expected 4 experts under 'model.layers.1.mlp.' \(num_experts\), got "
                                       "experts 0 to 1"):
        checkpoint.stack_experts(first_two, prefix, num_experts=4)


# ----------------------------------------------------------------------------- on a GPU
@pytest.mark.gpu
@needs_gpu
def test_nan_in_x_on_a_gpu_refused_and_nan_inside_a_cuda_graph():
    """On a GPU: refused at the door (the one read back the layer makes anyway); inside a CUDA graph,
    where nothing is read back, a replay with NaN in a token gives that token NaN, the others right."""
    args = _layer(M=8, K=512, inter=256, E=8, topk=2)
    x = args["x"].clone()
    x[3, 10] = float("nan")
    with pytest.raises(ValueError, match=r"x: expected finite values .*, got nan at \[3, 10\]"):
        fp8_moe_layer(**{**args, "x": x})
    with pytest.raises(ValueError, match=r"got nan at \[3, 10\]"):
        quantize_rows(x)
    static = args["x"].clone()
    side = torch.cuda.Stream()                             # compile and warm up on a side stream, then capture
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fp8_moe_layer(**{**args, "x": static})
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = fp8_moe_layer(**{**args, "x": static})
    static.copy_(x)
    graph.replay()
    torch.cuda.synchronize()
    rows = [r for r in range(8) if r != 3]
    assert y[3].isnan().all() and torch.isfinite(y[rows]).all()
    ref = reference_fp8_moe_layer(x[rows].float(), args["w13"], args["w13_scale"], args["w2"], args["w2_scale"],
                                  args["topk_weights"][rows], args["topk_ids"][rows])
    assert rel_error(y[rows], ref) < 5e-2


@pytest.mark.gpu
@needs_gpu
def test_a_nan_code_on_a_gpu_gives_nan():
    """The interpreter-only guard is not needed on a GPU: the tensor cores read a NaN code as NaN."""
    args = _first_gemm()
    xq = args["x_q"].clone()
    xq.view(torch.uint8)[2, 5] = 0x7F
    out = fp8_moe_matmul(**{**args, "x_q": xq})
    assert out[2].isnan().all() and torch.isfinite(out[:2]).all()
