"""Inputs that used to get a wrong or a confusing message: each error names the argument, what it
must be and what it was."""
from __future__ import annotations

import re

import moe_tutorial as mt  # noqa: I001  (first: picks the runtime)
from moe_tutorial import runtime
from moe_tutorial.kernels import configs
from moe_tutorial.kernels.configs import KernelConfig

import numpy as np
import pytest
import torch

DEVICE = runtime.DEVICE
CFG = dict(block_m=16, block_n=32, block_k=32, group_m=1, num_warps=4, num_stages=1)


def _problem(M=3, K=32, N=32, E=4, topk=2, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(M, K, generator=g).to(DEVICE, dtype)
    w = torch.randn(E, N, K, generator=g).to(DEVICE, dtype)
    ids = torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(M)]).to(DEVICE, torch.int32)
    return x, w, ids


@pytest.mark.parametrize("change,kind,message", [
    (dict(block_n=0), ValueError, "config.block_n: expected a power of two of at least 16, got 0"),
    (dict(block_k=24), ValueError, "config.block_k: expected a power of two of at least 16, got 24"),
    (dict(block_m=8), ValueError, "config.block_m: expected a power of two of at least 16, got 8"),
    (dict(num_warps=3), ValueError, "config.num_warps: expected a power of two of at least 1, got 3"),
    (dict(group_m=0), ValueError, "config.group_m: expected an int of at least 1, got 0"),
    (dict(num_stages=1.5), TypeError, "config.num_stages: expected an int, got 1.5"),
    (dict(use_tma="yes"), TypeError, "config.use_tma: expected True or False, got 'yes'"),
])
def test_a_bad_config_is_named_before_triton_sees_it(change, kind, message):
    x, w, ids = _problem()
    with pytest.raises(kind, match=f"^{re.escape(message)}$"):
        mt.sorted_moe_matmul(x, w, ids, config=KernelConfig(**{**CFG, **change}))


def test_a_dict_for_config_says_how_to_build_one():
    x, w, ids = _problem()
    with pytest.raises(TypeError, match=r"^config: expected a KernelConfig \(build one with KernelConfig\(\*\*that_dict"
                                        r"\)\), got dict$"):
        mt.sorted_moe_matmul(x, w, ids, config=CFG)
    w13, w2 = torch.zeros(4, 64, 32, device=DEVICE), torch.zeros(4, 32, 32, device=DEVICE)
    with pytest.raises(ValueError, match=r"^config.block_k: expected a power of two of at least 16, got 24$"):
        mt.sorted_moe_layer(x, w13, w2, torch.ones(3, 2, device=DEVICE), ids,
                            configs=(KernelConfig(**CFG), KernelConfig(**{**CFG, "block_k": 24})))


def test_numpy_integers_in_a_config_are_ints():
    """As ``route`` takes ``top_k=np.int64(2)``, a config takes numpy block sizes."""
    x, w, ids = _problem()
    want = mt.sorted_moe_matmul(x, w, ids, config=KernelConfig(**CFG))
    got = mt.sorted_moe_matmul(x, w, ids, config=KernelConfig(**{**CFG, "block_n": np.int64(32),
                                                                    "block_m": np.int32(16)}))
    assert torch.equal(got, want)


@pytest.mark.parametrize("impl", ["loop", "indexing", "fused", "sorted"])
def test_no_experts_blames_the_empty_weight(impl):
    x, _, ids = _problem()
    w13, w2 = torch.zeros(0, 64, 32, device=DEVICE), torch.zeros(0, 32, 32, device=DEVICE)
    with pytest.raises(ValueError, match=r"^w13: expected at least one expert \(w13 is \[E, N, K\] with E >= 1\), "
                                         r"got shape \(0, 64, 32\)$"):
        mt.moe_layer(x, w13, w2, torch.ones(3, 2, device=DEVICE), ids, impl=impl)
    with pytest.raises(ValueError, match=r"^weight: expected at least one expert"):
        mt.sorted_moe_matmul(x, torch.zeros(0, 32, 32, device=DEVICE), ids)


@pytest.mark.skipif(runtime.ON_GPU, reason="the CPU interpreter's dtypes")
@pytest.mark.parametrize("dtype,why", [
    (torch.float64, "the kernels have no fp64 path: pass .float(), or use impl='loop' or 'indexing' in fp64"),
    (torch.float16, "fp16 runs on a GPU; the interpreter takes fp32 only"),
    (torch.bfloat16, "the interpreter computes bf16 silently wrong; it runs on a GPU"),
])
def test_kernel_dtype_refusals_give_the_reason_for_that_dtype(dtype, why):
    x, w, ids = _problem(dtype=dtype)
    for run in (lambda: mt.sorted_moe_matmul(x, w, ids), lambda: mt.fused_moe_matmul(x, w, ids)):
        with pytest.raises(TypeError, match=r"^x: expected one of torch.float32 on the CPU interpreter") as e:
            run()
        assert why in str(e.value) and str(e.value).endswith(f"got {dtype}")
        if dtype != torch.bfloat16:
            assert "bf16" not in str(e.value)


@pytest.mark.parametrize("value", ["no", "False", 0, 1, None])
def test_renormalize_must_be_a_bool(value):
    with pytest.raises(TypeError, match=rf"^renormalize: expected True or False, got {re.escape(repr(value))}$"):
        mt.route(torch.randn(3, 4), 2, renormalize=value)
    assert torch.allclose(mt.route(torch.randn(3, 4), 2, renormalize=np.bool_(True))[0].sum(-1), torch.ones(3))


@pytest.mark.parametrize("text,found", [("{not json", "expected JSON, got an error at line 1 column 2"),
                                        ("[1, 2]", "expected a JSON object"), ("", "expected JSON")])
def test_a_malformed_tuned_table_names_the_file(tmp_path, monkeypatch, text, found):
    monkeypatch.setenv("MOE_TUTORIAL_CONFIG_DIR", str(tmp_path))
    path = configs.user_table_path()
    path.write_text(text)
    with pytest.raises(ValueError, match=re.escape(f"tuned-config table {path}: {found}")):
        configs.load_tables()


def test_route_refuses_sparse_logits_and_no_experts_by_their_names():
    with pytest.raises(TypeError, match=r"^router_logits: expected a dense tensor \(call .to_dense\(\) first\), got "
                                        r"torch.sparse_coo$"):
        mt.route(torch.randn(3, 4).to_sparse(), 2)
    with pytest.raises(ValueError, match=r"^router_logits: expected at least one expert .*, got shape \(3, 0\)$"):
        mt.route(torch.randn(3, 0), 1)            # it blamed top_k: "between 1 and E=0"


def test_numpy_block_sizes_are_ints_in_parts_3_and_4():
    """``block_n=np.int64(16)`` was refused as "expected a power of two, got 16"."""
    x, w, ids = _problem()
    want = mt.fused_moe_matmul(x, w, ids, block_n=16, block_k=32)
    assert torch.equal(mt.fused_moe_matmul(x, w, ids, block_n=np.int64(16), block_k=np.int32(32)), want)
    with pytest.raises(ValueError, match=r"^block_n: expected a power of two, got 12$"):
        mt.fused_moe_matmul(x, w, ids, block_n=np.int64(12))
    from moe_tutorial.kernels.minimal_sorted_kernel import minimal_sorted_moe_matmul

    want = minimal_sorted_moe_matmul(x, w, ids, block_m=16)
    assert torch.equal(minimal_sorted_moe_matmul(x, w, ids, block_m=np.int64(16)), want)
    with pytest.raises(ValueError, match=r"^block_k: expected a power of two of at least 16 \(tl.dot's minimum\), "
                                         "got 8$"):
        minimal_sorted_moe_matmul(x, w, ids, block_k=8)
