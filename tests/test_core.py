"""Parts 1 and 2 and what every part shares: routing, the loop, indexing, the layer, the reference, the checks.

Each implementation is compared with the float64 reference on seeded random shapes (odd N
and K, topk 1 to 8, E 1 to 64, int32 and int64 ids, non-contiguous inputs), on the worked
example exactly, on M = 0, and on every bad input ``checks.py`` knows.
"""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

import math
import random

import numpy as np
import pytest
import torch

from moe_tutorial import runtime
from moe_tutorial.examples import WORKED_FIRST_GEMM, WORKED_LAYER, worked_example
from moe_tutorial.checks import capturing, check_kernel_dtype, check_layer_inputs, check_matmul_inputs
from moe_tutorial.indexing import indexing_moe_matmul, intermediate_bytes
from moe_tutorial.layer import IMPLS, moe_layer
from moe_tutorial.loop import loop_moe_layer, loop_moe_matmul
from moe_tutorial.reference import error_text, reference_moe_layer, reference_moe_matmul, rel_error, tolerance
from moe_tutorial.routing import route
from moe_tutorial.shapes import get_shape, random_problem, random_topk_ids

DEV = runtime.DEVICE
MATMULS = {"loop": loop_moe_matmul, "indexing": indexing_moe_matmul}
LAYER_IMPLS = ("loop", "indexing")


# ---------------------------------------------------------------------------------------
# Seeded random problems

def random_case(seed: int) -> dict:
    """Sizes of one random problem: odd N and K, topk 1..8, E from topk to 64."""
    rng = random.Random(seed)
    topk = rng.randint(1, 8)
    return dict(
        M=rng.randint(1, 9), N=rng.randrange(1, 40, 2), K=rng.randrange(1, 40, 2),
        E=rng.randint(topk, 64), topk=topk,
        ids_dtype=rng.choice([torch.int32, torch.int64]),
        layout=rng.choice(["contiguous", "strided"]),
    )


#: Twelve random cases plus the corners: one expert, and topk = E = 8.
CASES = [random_case(s) for s in range(12)] + [
    dict(M=5, N=3, K=7, E=1, topk=1, ids_dtype=torch.int64, layout="strided"),
    dict(M=4, N=9, K=5, E=8, topk=8, ids_dtype=torch.int32, layout="contiguous"),
]
CASE_IDS = [f"M{c['M']}-N{c['N']}-K{c['K']}-E{c['E']}-top{c['topk']}-{str(c['ids_dtype'])[6:]}-{c['layout']}"
            for c in CASES]


def strided(t: torch.Tensor) -> torch.Tensor:
    """The same values in a non-contiguous tensor: the last two dims stored transposed."""
    out = t.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert t.dim() < 2 or min(t.shape[-2:]) < 2 or not out.is_contiguous()
    return out


def matmul_problem(case: dict, seed: int = 0):
    x, weight, ids = random_problem(case["M"], case["N"], case["K"], case["E"], case["topk"],
                                    device=DEV, seed=seed)
    ids = ids.to(case["ids_dtype"])
    if case["layout"] == "strided":
        x, weight, ids = strided(x), strided(weight), strided(ids)
    return x, weight, ids


def layer_problem(case: dict, seed: int = 0):
    """A layer with hidden size K and intermediate size I = N, router weights from :func:`route`."""
    g = torch.Generator().manual_seed(seed)
    M, K, inter, E, topk = case["M"], case["K"], case["N"], case["E"], case["topk"]
    x = torch.randn(M, K, generator=g)
    w13 = torch.randn(E, 2 * inter, K, generator=g) * K ** -0.5
    w2 = torch.randn(E, K, inter, generator=g) * inter ** -0.5
    topk_weights, ids = route(torch.randn(M, E, generator=g), topk)
    tensors = [t.to(DEV) for t in (x, w13, w2, topk_weights, ids.to(case["ids_dtype"]))]
    if case["layout"] == "strided":
        tensors = [strided(t) for t in tensors]
    return tensors


# ---------------------------------------------------------------------------------------
# The router

def test_route_keeps_the_largest_softmax_probabilities():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(7, 10, generator=g)
    weights, ids = route(logits, 3, renormalize=False)
    probs = torch.softmax(logits, dim=-1)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    assert weights.shape == ids.shape == (7, 3)
    torch.testing.assert_close(weights, probs.gather(1, ids.long()))
    # No expert left out is more probable than the least probable expert kept.
    kept = torch.zeros_like(probs, dtype=torch.bool).scatter_(1, ids.long(), True)
    assert (probs.masked_fill(kept, -1).amax(dim=1) <= weights.amin(dim=1)).all()
    assert (weights[:, :-1] >= weights[:, 1:]).all(), "each row sorted by decreasing weight"


@pytest.mark.parametrize("top_k", [1, 2, 6, 8])
def test_route_renormalises_to_one(top_k):
    g = torch.Generator().manual_seed(top_k)
    logits = torch.randn(5, 8, generator=g, dtype=torch.float64)
    weights, ids = route(logits, top_k)
    raw, raw_ids = route(logits, top_k, renormalize=False)
    torch.testing.assert_close(weights.sum(dim=1), torch.ones(5))
    assert torch.equal(ids, raw_ids)
    torch.testing.assert_close(weights, raw / raw.sum(dim=1, keepdim=True))
    assert all(len(set(row)) == top_k for row in ids.tolist()), "an expert at most once per token"


def test_route_works_in_fp32_whatever_the_logits_dtype():
    logits = torch.randn(4, 6, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    weights, ids = route(logits, 2)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32
    expected, _ = route(logits.float(), 2)
    torch.testing.assert_close(weights, expected)


def test_route_of_no_tokens_is_empty():
    weights, ids = route(torch.empty(0, 8), 2)
    assert weights.shape == ids.shape == (0, 2)


@pytest.mark.parametrize("logits, top_k, kind, match", [
    (torch.randn(8), 2, ValueError, r"^router_logits: expected a 2-D tensor"),
    ([[0.0, 1.0]], 1, TypeError, r"^router_logits: expected a torch.Tensor"),
    (torch.ones(3, 4, dtype=torch.int64), 2, TypeError, r"^router_logits: expected a floating-point"),
    (torch.randn(3, 4), 0, ValueError, r"^top_k: expected an int between 1 and E=4, got 0"),
    (torch.randn(3, 4), 5, ValueError, r"^top_k: expected an int between 1 and E=4, got 5"),
    (torch.randn(3, 4), 2.0, TypeError, r"^top_k: expected an int, got 2.0"),
    (torch.randn(3, 4), True, TypeError, r"^top_k: expected an int, got True"),
    (torch.randn(3, 4), torch.tensor(2.0), TypeError, r"^top_k: expected an int, got tensor\(2.\)"),
    (torch.randn(3, 4), torch.tensor([2]), TypeError, r"^top_k: expected an int, got tensor\(\[2\]\)"),
    (torch.randn(3, 4), np.float64(2.0), TypeError, r"^top_k: expected an int"),
    (torch.randn(3, 4), np.int64(5), ValueError, r"^top_k: expected an int between 1 and E=4, got 5"),
    (torch.randn(3, 4, device="meta"), 2, ValueError, r"^router_logits: expected a tensor that holds values"),
], ids=["1-D", "list", "int-logits", "zero", "more-than-E", "float", "bool", "float-tensor", "1-element-tensor",
        "np-float", "np-int-above-E", "meta"])
def test_route_rejects_bad_input(logits, top_k, kind, match):
    with pytest.raises(kind, match=match):
        route(logits, top_k)


@pytest.mark.parametrize("top_k", [np.int64(2), np.int32(2), torch.tensor(2), torch.tensor(2, dtype=torch.int32)],
                         ids=["np.int64", "np.int32", "0-d-tensor", "0-d-int32-tensor"])
def test_route_takes_integer_like_top_k(top_k):
    logits = torch.randn(5, 6, generator=torch.Generator().manual_seed(0))
    weights, ids = route(logits, top_k)
    expected_weights, expected_ids = route(logits, 2)
    assert torch.equal(weights, expected_weights) and torch.equal(ids, expected_ids)


@pytest.mark.parametrize("bad, what", [(float("nan"), "a NaN"), (float("inf"), r"\+inf")], ids=["nan", "+inf"])
def test_route_refuses_logits_without_a_softmax(bad, what):
    """A NaN or +inf logit would make the whole row's weights NaN: refused, naming the row."""
    logits = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    logits[2, 3] = bad
    with pytest.raises(ValueError, match=rf"^router_logits: expected finite logits or -inf .*got {what} in row 2"):
        route(logits, 2)
    logits[2] = float("-inf")                           # a row with no expert at all
    with pytest.raises(ValueError, match=r"got only -inf in row 2"):
        route(logits, 2)


def test_route_minus_inf_masks_an_expert():
    logits = torch.zeros(3, 4)
    logits[:, 1] = float("-inf")
    weights, ids = route(logits, 3, renormalize=False)
    assert not bool((ids == 1).any()) and torch.allclose(weights, torch.full((3, 3), 1 / 3))
    weights, ids = route(logits, 4)                     # every expert kept: the masked one with weight 0
    assert ids[:, -1].tolist() == [1, 1, 1] and weights[:, -1].tolist() == [0.0, 0.0, 0.0]
    assert torch.allclose(weights.sum(dim=1), torch.ones(3))


# ---------------------------------------------------------------------------------------
# The first GEMM: loop (Part 1) and indexing (Part 2) against the float64 reference

@pytest.mark.parametrize("impl", MATMULS)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_matmul_matches_reference(impl, case):
    x, weight, ids = matmul_problem(case)
    out = MATMULS[impl](x, weight, ids)
    assert out.shape == (case["M"], case["topk"], case["N"]) and out.dtype == x.dtype
    err = rel_error(out, reference_moe_matmul(x, weight, ids))
    assert err < tolerance(x.dtype), f"relative error {err:.3g}"


def test_loop_and_indexing_agree():
    x, weight, ids = random_problem(16, 33, 17, 12, 4, device=DEV, seed=5)
    assert rel_error(loop_moe_matmul(x, weight, ids), indexing_moe_matmul(x, weight, ids).double()) < 1e-6


def test_expert_moe_matmul_is_a_deprecated_alias_of_indexing_moe_matmul():
    """Part 2's old name still works for a release: same numbers, same errors, and a DeprecationWarning."""
    x, weight, ids = random_problem(5, 7, 9, 4, 2, device=DEV, seed=3)
    with pytest.warns(DeprecationWarning, match="indexing_moe_matmul"):
        old = moe_tutorial.expert_moe_matmul(x, weight, ids)
    assert torch.equal(old, moe_tutorial.indexing_moe_matmul(x, weight, ids))
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="topk_ids"):
        moe_tutorial.expert_moe_matmul(x, weight, ids[:-1])
    assert "expert_moe_matmul" in moe_tutorial.__all__ and "indexing_moe_matmul" in moe_tutorial.__all__


def test_matmul_in_float64_is_exact_to_rounding():
    x, weight, ids = random_problem(6, 11, 13, 5, 3, dtype=torch.float64, device=DEV, seed=2)
    ref = reference_moe_matmul(x, weight, ids)
    for impl, fn in MATMULS.items():
        assert rel_error(fn(x, weight, ids), ref) < 1e-14, impl


def test_reference_is_the_definition():
    """``out[m, j] = weight[topk_ids[m, j]] @ x[m]``, written out as an einsum."""
    x, weight, ids = random_problem(5, 7, 9, 6, 3, device=DEV, seed=4)
    expected = torch.einsum("mjnk,mk->mjn", weight.double()[ids.long()], x.double())
    ref = reference_moe_matmul(x, weight, ids)
    assert ref.dtype == torch.float64
    torch.testing.assert_close(ref, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["DeepSeek-V2-Lite", "Qwen1.5-MoE-A2.7B"])
def test_matmul_on_a_real_down_projection(name):
    """A real model's second GEMM (N = hidden, K = intermediate, its topk), with E = topk experts
    so that the weights stay small on a laptop."""
    shape = get_shape(name)
    N, K = shape.second_gemm
    x, weight, ids = random_problem(2, N, K, shape.topk, shape.topk, device=DEV, seed=1)
    ref = reference_moe_matmul(x, weight, ids)
    for impl, fn in MATMULS.items():
        assert rel_error(fn(x, weight, ids), ref) < tolerance(x.dtype), impl


def test_intermediate_bytes_is_the_size_of_selected():
    x, weight, ids = random_problem(3, 5, 7, 4, 2, device=DEV)
    selected = weight[ids.long()]
    assert intermediate_bytes(3, 2, 5, 7, itemsize=4) == selected.numel() * selected.element_size()
    # Mixtral's first GEMM in bf16: about 470 MB per token, about 30 GB at M = 64.
    n, k = get_shape("Mixtral-8x7B").first_gemm
    assert round(intermediate_bytes(1, 2, n, k) / 1e6) == 470
    assert round(intermediate_bytes(64, 2, n, k) / 1e9) == 30


# ---------------------------------------------------------------------------------------
# The whole layer

@pytest.mark.parametrize("impl", LAYER_IMPLS)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_layer_matches_reference(impl, case):
    x, w13, w2, topk_weights, ids = layer_problem(case)
    out = moe_layer(x, w13, w2, topk_weights, ids, impl=impl)
    assert out.shape == x.shape and out.dtype == x.dtype
    err = rel_error(out, reference_moe_layer(x, w13, w2, topk_weights, ids))
    assert err < tolerance(x.dtype), f"relative error {err:.3g}"


def test_layer_with_unnormalised_weights():
    """DeepSeek-V2 keeps the raw softmax weights: nothing assumes they sum to one."""
    case = dict(M=6, N=5, K=7, E=10, topk=6, ids_dtype=torch.int64, layout="contiguous")
    x, w13, w2, _, ids = layer_problem(case)
    weights = torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)).to(DEV) * 3
    ref = reference_moe_layer(x, w13, w2, weights, ids)
    for impl in LAYER_IMPLS:
        assert rel_error(moe_layer(x, w13, w2, weights, ids, impl=impl), ref) < 1e-5, impl


def test_layer_of_a_token_is_its_weighted_experts():
    """One token, written out by hand: ``y = sum_j w_j * w2[e] @ (silu(w1 x) * (w3 x))``."""
    case = dict(M=1, N=4, K=6, E=5, topk=3, ids_dtype=torch.int32, layout="contiguous")
    x, w13, w2, weights, ids = (t.cpu().double() if t.is_floating_point() else t.cpu()
                                for t in layer_problem(case))
    y = torch.zeros(6, dtype=torch.float64)
    for j, e in enumerate(ids[0].tolist()):
        gate, up = w13[e, :4] @ x[0], w13[e, 4:] @ x[0]
        y += weights[0, j] * (w2[e] @ (torch.nn.functional.silu(gate) * up))
    for impl in LAYER_IMPLS:
        torch.testing.assert_close(moe_layer(x, w13, w2, weights, ids, impl=impl)[0], y)
    torch.testing.assert_close(reference_moe_layer(x, w13, w2, weights, ids)[0], y)


# ---------------------------------------------------------------------------------------
# The worked example, exactly

@pytest.mark.parametrize("impl", MATMULS)
def test_worked_example_first_gemm(impl, worked):
    out = MATMULS[impl](worked.x, worked.weight, worked.topk_ids)
    assert out.tolist() == [[[3, 3], [9, 9]], [[18, 18], [24, 24]]]


def test_worked_example_reference(worked):
    out = reference_moe_matmul(worked.x, worked.weight, worked.topk_ids)
    assert out.tolist() == [[[3, 3], [9, 9]], [[18, 18], [24, 24]]]
    layer = reference_moe_layer(worked.x, worked.w13, worked.w2, worked.topk_weights, worked.topk_ids)
    assert [[round(v, 4) for v in row] for row in layer.tolist()] == [[251.5432] * 3, [3276.0] * 3]


@pytest.mark.parametrize("impl", LAYER_IMPLS)
def test_worked_example_layer(impl, worked):
    y = moe_layer(worked.x, worked.w13, worked.w2, worked.topk_weights, worked.topk_ids, impl=impl)
    assert [[round(v, 4) for v in row] for row in y.tolist()] == [[251.5432] * 3, [3276.0] * 3]


def test_worked_example_by_hand():
    """The layer's definition in plain Python floats on the example's own tensors, against the
    constants the series quotes (WORKED_FIRST_GEMM, WORKED_LAYER) and the float64 reference."""
    ex = worked_example(torch.float64)
    x, w13, w2 = ex.x.tolist(), ex.w13.tolist(), ex.w2.tolist()
    ids, weights = ex.topk_ids.tolist(), ex.topk_weights.tolist()
    first, y = [], []
    for m in range(ex.M):
        first.append([[sum(a * b for a, b in zip(row, x[m])) for row in ex.weight[e].tolist()] for e in ids[m]])
        out = [0.0] * ex.K
        for e, w in zip(ids[m], weights[m]):
            h = [sum(a * b for a, b in zip(row, x[m])) for row in w13[e]]            # gate rows, then up rows
            act = [g / (1 + math.exp(-g)) * u for g, u in zip(h[:ex.I], h[ex.I:])]   # silu(gate) * up
            for k in range(ex.K):
                out[k] += w * sum(a * b for a, b in zip(w2[e][k], act))
        y.append(out)
    assert first == WORKED_FIRST_GEMM
    assert [[round(v, 4) for v in row] for row in y] == WORKED_LAYER
    ref = reference_moe_layer(ex.x, ex.w13, ex.w2, ex.topk_weights, ex.topk_ids)
    assert torch.allclose(ref, torch.tensor(y, dtype=torch.float64), rtol=1e-12, atol=0)


# ---------------------------------------------------------------------------------------
# Empty batches

@pytest.mark.parametrize("impl", MATMULS)
@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
def test_matmul_of_no_tokens_is_empty(impl, ids_dtype):
    x, weight, ids = random_problem(0, 5, 7, 4, 2, device=DEV)
    out = MATMULS[impl](x, weight, ids.to(ids_dtype))
    assert out.shape == (0, 2, 5) and out.dtype == x.dtype
    assert reference_moe_matmul(x, weight, ids).shape == (0, 2, 5)


@pytest.mark.parametrize("impl", LAYER_IMPLS)
def test_layer_of_no_tokens_is_empty(impl):
    case = dict(M=0, N=3, K=5, E=4, topk=2, ids_dtype=torch.int32, layout="contiguous")
    x, w13, w2, weights, ids = layer_problem(case)
    y = moe_layer(x, w13, w2, weights, ids, impl=impl)
    assert y.shape == (0, 5) and y.dtype == x.dtype
    assert loop_moe_layer(x, w13, w2, weights, ids).shape == (0, 5)


def test_reference_layer_of_no_tokens_is_empty():
    case = dict(M=0, N=3, K=5, E=4, topk=2, ids_dtype=torch.int32, layout="contiguous")
    assert reference_moe_layer(*layer_problem(case)).shape == (0, 5)


# ---------------------------------------------------------------------------------------
# rel_error and tolerance

def test_rel_error():
    ref = torch.tensor([3.0, 4.0], dtype=torch.float64)
    assert rel_error(ref.float(), ref) == 0.0
    assert rel_error(torch.tensor([3.0, 4.5]), ref) == pytest.approx(0.1)
    assert rel_error(torch.tensor([float("nan"), 4.0]), ref) == float("inf")
    assert rel_error(torch.tensor([float("inf"), 4.0]), ref) == float("inf")
    assert rel_error(torch.tensor([0.0, 2.0]), torch.zeros(2, dtype=torch.float64)) == 2.0
    with pytest.raises(ValueError, match=r"^out: expected shape \(2,\), got \(3,\)"):
        rel_error(torch.zeros(3), ref)


def test_rel_error_of_a_large_tensor_is_summed_in_slices(monkeypatch):
    """The sums go in slices of REL_ERROR_CHUNK elements (a whole float64 copy of a
    DeepSeek-V3 weight gradient does not fit beside it): the same error, NaN in any slice found."""
    import moe_tutorial.reference as reference
    g = torch.Generator().manual_seed(0)
    ref = torch.randn(7, 13, generator=g, dtype=torch.float64)
    out = (ref + 1e-3 * torch.randn(7, 13, generator=g, dtype=torch.float64)).float()
    whole = rel_error(out, ref)
    monkeypatch.setattr(reference, "REL_ERROR_CHUNK", 10)           # ten slices, the last one short
    assert rel_error(out, ref) == pytest.approx(whole, rel=1e-12) and whole > 1e-4
    assert rel_error(out.t().contiguous().t(), ref) == pytest.approx(whole, rel=1e-12)   # strided too
    out[6, 12] = float("nan")
    assert rel_error(out, ref) == float("inf")
    assert rel_error(torch.ones(7, 13), torch.zeros(7, 13, dtype=torch.float64)) == pytest.approx(91 ** 0.5)
    with pytest.raises(ValueError, match=r"^out: expected shape \(7, 13\), got \(13, 7\)"):
        rel_error(out.t(), ref)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
def test_tolerance_separates_rounding_from_a_wrong_expert(dtype):
    """An implementation that only rounds in ``dtype`` passes; one pair of 32 sent to the wrong
    expert fails, and so does a float32 result rounded to bf16 when float32 is promised."""
    x, weight, ids = random_problem(16, 32, 64, 8, 2, seed=3)
    x, weight = x.to(dtype), weight.to(dtype)
    ref = reference_moe_matmul(x, weight, ids)
    assert rel_error(indexing_moe_matmul(x, weight, ids), ref) < tolerance(dtype)
    wrong = ids.clone()
    wrong[5, 1] = (wrong[5, 1] + 1) % 8 if (wrong[5, 1] + 1) % 8 != wrong[5, 0] else (wrong[5, 1] + 2) % 8
    assert rel_error(indexing_moe_matmul(x, weight, wrong), ref) > tolerance(dtype)
    if dtype in (torch.float32, torch.float64):
        assert rel_error(ref.to(torch.bfloat16), ref) > tolerance(dtype)


# ---------------------------------------------------------------------------------------
# Bad inputs: each gets a ValueError or TypeError naming the argument, expected and got.
# Base problem: M=3, K=5, N=4, E=6, topk=2.

def _base():
    x, weight, ids = random_problem(3, 4, 5, 6, 2)
    return dict(x=x, weight=weight, topk_ids=ids)


def _variant(base, **changes):
    """A builder of ``base()``'s arguments with some replaced: ``changes[name](old) -> new``."""
    def build():
        args = base()
        for key, fn in changes.items():
            args[key] = fn(args[key])
        return args
    return build


def _with(**changes):
    return _variant(_base, **changes)


META = torch.device("meta")
BAD_MATMUL_INPUTS = {
    "x-not-a-tensor": (_with(x=lambda t: t.tolist()), TypeError, r"^x: expected a torch.Tensor, got list"),
    "x-1d": (_with(x=lambda t: t[0]), ValueError, r"^x: expected a 2-D tensor, got shape \(5,\)"),
    "weight-2d": (_with(weight=lambda t: t[0]), ValueError, r"^weight: expected a 3-D tensor, got shape \(4, 5\)"),
    "ids-1d": (_with(topk_ids=lambda t: t[:, 0]), ValueError, r"^topk_ids: expected a 2-D tensor"),
    "ids-not-a-tensor": (_with(topk_ids=lambda t: t.tolist()), TypeError, r"^topk_ids: expected a torch.Tensor"),
    "K-mismatch": (_with(weight=lambda t: t[:, :, :4]), ValueError,
                   r"^weight: expected last dim equal to x's K=5 .*got shape \(6, 4, 4\)"),
    "ids-rows": (_with(topk_ids=lambda t: t[:2]), ValueError, r"^topk_ids: expected 3 rows, .*got shape \(2, 2\)"),
    "topk-above-E": (_with(topk_ids=lambda t: torch.zeros(3, 7, dtype=t.dtype)), ValueError,
                     r"^topk_ids: expected between 1 and E=6 columns .*got topk=7"),
    "topk-zero": (_with(topk_ids=lambda t: t[:, :0]), ValueError, r"^topk_ids: .*got topk=0"),
    "ids-float": (_with(topk_ids=lambda t: t.float()), TypeError,
                  r"^topk_ids: expected dtype torch.int32 or torch.int64, got torch.float32"),
    "ids-int16": (_with(topk_ids=lambda t: t.to(torch.int16)), TypeError, r"^topk_ids: .*got torch.int16"),
    "x-int": (_with(x=lambda t: t.to(torch.int32), weight=lambda t: t.to(torch.int32)), TypeError,
              r"^x: expected a floating-point dtype, got torch.int32"),
    "mixed-dtypes": (_with(weight=lambda t: t.double()), TypeError,
                     r"^weight: expected x's dtype torch.float32, got torch.float64"),
    "weight-other-device": (_with(weight=lambda t: t.to(META)), ValueError,
                            r"^weight: expected x's device cpu, got meta"),
    "ids-other-device": (_with(topk_ids=lambda t: t.to(META)), ValueError,
                         r"^topk_ids: expected x's device cpu, got meta"),
    "id-too-large": (_with(topk_ids=lambda t: t.index_fill(1, torch.tensor([1]), 6)), ValueError,
                     r"^topk_ids: expected expert ids in \[0, 6\), got an id of 6"),
    "id-negative": (_with(topk_ids=lambda t: t.index_fill(1, torch.tensor([0]), -1)), ValueError,
                    r"^topk_ids: expected expert ids in \[0, 6\), got an id of -1"),
}


@pytest.mark.parametrize("fn", [check_matmul_inputs, *MATMULS.values()], ids=["check", *MATMULS])
@pytest.mark.parametrize("bad", BAD_MATMUL_INPUTS, ids=list(BAD_MATMUL_INPUTS))
def test_matmul_rejects_bad_input(fn, bad):
    build, kind, match = BAD_MATMUL_INPUTS[bad]
    with pytest.raises(kind, match=match):
        fn(**build())


def test_the_base_problem_is_valid():
    """The bad-input cases above differ from this problem only in what they name."""
    assert check_matmul_inputs(**_base()) == (3, 5, 4, 6, 2)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_kernel_dtypes_follow_the_runtime(dtype):
    args = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in _base().items()}
    check_matmul_inputs(**args)                              # fine for the PyTorch parts
    if dtype in runtime.KERNEL_DTYPES:
        check_matmul_inputs(**{k: v.to(DEV) for k, v in args.items()}, kernel=True)
    else:
        with pytest.raises(TypeError, match=rf"^x: expected one of .*, got {dtype}"):
            check_matmul_inputs(**args, kernel=True)
        with pytest.raises(TypeError, match=r"^x: expected one of torch.float32"):
            check_kernel_dtype("x", args["x"])


@pytest.mark.skipif(not runtime.ON_GPU, reason="only a GPU runtime requires CUDA tensors")
def test_kernels_need_cuda_tensors_when_a_gpu_is_present():
    with pytest.raises(ValueError, match=r"^x: expected a CUDA tensor"):
        check_kernel_dtype("x", torch.zeros(2, 2, device="cpu"))


def _layer_base():
    case = dict(M=3, N=4, K=5, E=6, topk=2, ids_dtype=torch.int32, layout="contiguous")
    return dict(zip(("x", "w13", "w2", "topk_weights", "topk_ids"), (t.cpu() for t in layer_problem(case))))


def _layer_with(**changes):
    return _variant(_layer_base, **changes)


BAD_LAYER_INPUTS = {
    "w13-2d": (_layer_with(w13=lambda t: t[0]), ValueError, r"^w13: expected a 3-D tensor"),
    "w2-2d": (_layer_with(w2=lambda t: t[0]), ValueError, r"^w2: expected a 3-D tensor"),
    "w13-odd": (_layer_with(w13=lambda t: t[:, :7]), ValueError,
                r"^w13: expected an even second dim 2\*I .*got shape \(6, 7, 5\)"),
    "w2-shape": (_layer_with(w2=lambda t: t[:, :, :3]), ValueError,
                 r"^w2: expected shape \(E, K, I\) = \(6, 5, 4\), got shape \(6, 5, 3\)"),
    "w2-dtype": (_layer_with(w2=lambda t: t.double()), TypeError,
                 r"^w2: expected x's dtype torch.float32, got torch.float64"),
    "w2-device": (_layer_with(w2=lambda t: t.to(META)), ValueError, r"^w2: expected x's device cpu, got meta"),
    "weights-1d": (_layer_with(topk_weights=lambda t: t[:, 0]), ValueError, r"^topk_weights: expected a 2-D tensor"),
    "weights-shape": (_layer_with(topk_weights=lambda t: t[:, :1]), ValueError,
                      r"^topk_weights: expected topk_ids' shape \(3, 2\), got shape \(3, 1\)"),
    "weights-int": (_layer_with(topk_weights=lambda t: t.to(torch.int32)), TypeError,
                    r"^topk_weights: expected a floating-point dtype, got torch.int32"),
    "weights-device": (_layer_with(topk_weights=lambda t: t.to(META)), ValueError,
                       r"^topk_weights: expected topk_ids' device cpu, got meta"),
    "ids-out-of-range": (_layer_with(topk_ids=lambda t: t + 6), ValueError,
                         r"^topk_ids: expected expert ids in \[0, 6\)"),
    "w13-K-mismatch": (_layer_with(w13=lambda t: t[:, :, :4]), ValueError,
                       r"^w13: expected last dim equal to x's K=5 .*got shape \(6, 8, 4\)"),
    "w13-device": (_layer_with(w13=lambda t: t.to(META)), ValueError, r"^w13: expected x's device cpu, got meta"),
    "x-mixed-dtype": (_layer_with(x=lambda t: t.double()), TypeError,
                      r"^w13: expected x's dtype torch.float64, got torch.float32"),
}


@pytest.mark.parametrize("impl", ["check", *IMPLS])
@pytest.mark.parametrize("bad", BAD_LAYER_INPUTS, ids=list(BAD_LAYER_INPUTS))
def test_layer_rejects_bad_input(impl, bad):
    build, kind, match = BAD_LAYER_INPUTS[bad]
    fn = check_layer_inputs if impl == "check" else lambda **a: moe_layer(**a, impl=impl)
    with pytest.raises(kind, match=match):
        fn(**build())




def test_layer_rejects_an_unknown_impl():
    with pytest.raises(ValueError, match=r"^impl: expected one of loop, indexing, fused, sorted, got 'fast'"):
        moe_layer(**_layer_base(), impl="fast")


@pytest.mark.parametrize("impl", ["fused", "sorted"])
def test_kernel_layers_reject_float64(impl):
    args = {k: (v.double() if v.is_floating_point() else v) for k, v in _layer_base().items()}
    with pytest.raises(TypeError, match=r"^x: expected one of .*got torch.float64"):
        moe_layer(**args, impl=impl)


def test_random_topk_ids_are_distinct_per_token():
    ids = random_topk_ids(50, 9, 4, generator=torch.Generator().manual_seed(0))
    assert ids.dtype == torch.int32 and ids.shape == (50, 4)
    assert all(len(set(row)) == 4 for row in ids.tolist())
    assert 0 <= int(ids.min()) and int(ids.max()) < 9


def test_check_out_names_the_buffer():
    from moe_tutorial.checks import check_out

    good = torch.empty(2, 3)
    assert check_out(good, (2, 3), torch.float32) is good
    with pytest.raises(ValueError, match=r"^out: expected shape \(2, 3\) and dtype torch.float32, got shape \(3, 2\)"):
        check_out(torch.empty(3, 2), (2, 3), torch.float32)
    with pytest.raises(ValueError, match="dtype torch.float64"):
        check_out(good, (2, 3), torch.float64)
    with pytest.raises(TypeError, match="^out: expected a torch.Tensor"):
        check_out([[0.0] * 3] * 2, (2, 3), torch.float32)


@pytest.mark.parametrize("make, match", [
    (lambda: torch.empty(1, 3).expand(2, 3), r"^out: expected a buffer whose elements do not overlap in memory, "
                                             r"got strides \(0, 1\) for shape \(2, 3\)"),
    (lambda: torch.empty(4).as_strided((2, 3), (1, 1)), r"got strides \(1, 1\)"),
    (lambda: torch.empty(2, 3, device="meta"), r"^out: expected x's device cpu, got meta"),
    (lambda: torch.empty(2, 3, requires_grad=True), r"^out: expected a tensor that does not require grad"),
], ids=["expanded", "overlapping-strides", "meta", "requires-grad"])
def test_check_out_refuses_buffers_the_kernels_cannot_write(make, match):
    from moe_tutorial.checks import check_out

    with pytest.raises(ValueError, match=match):
        check_out(make(), (2, 3), torch.float32, device=torch.device("cpu"))


def test_check_out_refuses_a_buffer_that_shares_an_input():
    from moe_tutorial.checks import check_out, overlaps_itself

    x = torch.zeros(4, 6)
    with pytest.raises(ValueError, match=r"^out: expected a buffer of its own, got one that shares memory with x"):
        check_out(x[2:].view(2, 2, 3), (2, 2, 3), torch.float32, inputs={"x": x})
    own = torch.zeros(2, 2, 3)
    assert check_out(own, (2, 2, 3), torch.float32, inputs={"x": x}) is own     # a buffer of its own is used as is
    # Layouts torch makes without overlap pass: transposed, sliced, empty.
    assert not any(overlaps_itself(t) for t in (x.t(), x[:, ::2], x[1:3, 1:], torch.empty(0, 3).expand(0, 3)))


# ---------------------------------------------------------------------------------------
# Every entry point: no values (meta), autograd. The PyTorch parts are differentiable; the
# kernels have no backward and refuse inputs autograd tracks rather than cut the graph.

def _entry_points():
    from moe_tutorial.kernels.fused_kernel import fused_moe_matmul
    from moe_tutorial.kernels.published_kernel import published_fused_moe_matmul
    from moe_tutorial.kernels.sorted_layer import sorted_moe_layer, sorted_moe_matmul

    def layer(impl):
        return lambda **a: moe_layer(**a, impl=impl)

    return {  # name: (function, takes a layer problem, runs a Triton kernel)
        "loop_moe_matmul": (loop_moe_matmul, False, False),
        "indexing_moe_matmul": (indexing_moe_matmul, False, False),
        "fused_moe_matmul": (fused_moe_matmul, False, True),
        "published_fused_moe_matmul": (published_fused_moe_matmul, False, True),
        "sorted_moe_matmul": (sorted_moe_matmul, False, True),
        **{f"moe_layer-{impl}": (layer(impl), True, impl in ("fused", "sorted")) for impl in IMPLS},
        "sorted_moe_layer": (sorted_moe_layer, True, True),
    }


ENTRY_POINTS = list(_entry_points())


def _entry_problem(name: str) -> tuple:
    fn, is_layer, kernel = _entry_points()[name]
    args = _layer_base() if is_layer else _base()
    if name == "sorted_moe_matmul":
        args["topk_weights"] = torch.rand(3, 2, generator=torch.Generator().manual_seed(1))
    return fn, {k: v.to(DEV) for k, v in args.items()}, kernel


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_meta_tensors_get_a_device_error(name):
    """The kernels' device error, or (layers: the shared layer check comes first) a plainer one."""
    fn, args, kernel = _entry_problem(name)
    expected = (("a CUDA tensor" if runtime.ON_GPU else "a CPU tensor") if kernel and "layer" not in name
                else "a tensor that holds values")
    with pytest.raises(ValueError, match=rf"^x: expected {expected} .*got meta"):
        fn(**{k: v.to("meta") for k, v in args.items()})


def _differentiable(args: dict) -> list[str]:
    return [k for k, v in args.items() if v.is_floating_point()]


#: Entry points whose kernels have a backward (Part 8): they track gradients instead of refusing.
DIFFERENTIABLE_KERNELS = ("moe_layer-sorted",)


@pytest.mark.parametrize("name", [n for n in ENTRY_POINTS if _entry_points()[n][2] and n not in DIFFERENTIABLE_KERNELS])
def test_kernels_refuse_inputs_that_require_grad(name):
    fn, args, _ = _entry_problem(name)
    with torch.no_grad():
        expected = fn(**args)
    for arg in _differentiable(args):
        tracked = dict(args, **{arg: args[arg].clone().requires_grad_()})
        with pytest.raises(ValueError, match=rf"^{arg}: expected a tensor that does not require grad .*"
                                             r"got requires_grad=True"):
            fn(**tracked)
        with torch.no_grad():                                        # nothing to track: computed as usual
            assert torch.equal(fn(**tracked), expected), arg


@pytest.mark.parametrize("impl", MATMULS)
def test_torch_first_gemms_pass_gradcheck(impl):
    x, weight, ids = random_problem(3, 4, 5, 4, 2, dtype=torch.float64, seed=1)
    x, weight = x.to(DEV).requires_grad_(), weight.to(DEV).requires_grad_()
    assert torch.autograd.gradcheck(lambda a, b: MATMULS[impl](a, b, ids.to(DEV)), (x, weight))


@pytest.mark.parametrize("impl", LAYER_IMPLS + ("sorted",))
def test_torch_layers_backpropagate_like_the_reference(impl):
    """The layers sum in fp32 (too coarse for gradcheck's finite differences): their gradients
    are compared with autograd's through the float64 reference instead ("sorted": Part 8's kernels)."""
    args = {k: v.to(DEV) for k, v in _layer_base().items()}
    names = _differentiable(args)
    probe = torch.randn(3, 5, generator=torch.Generator().manual_seed(2), dtype=torch.float64).to(DEV)
    grads = {}
    for which, fn in (("impl", lambda **a: moe_layer(**a, impl=impl)), ("ref", reference_moe_layer)):
        leaves = {k: (v.clone().requires_grad_() if k in names else v) for k, v in args.items()}
        (fn(**leaves).double() * probe).sum().backward()
        grads[which] = {k: leaves[k].grad for k in names}
    for k in names:
        assert grads["impl"][k] is not None, k
        assert rel_error(grads["impl"][k], grads["ref"][k]) < tolerance(torch.float32), k


@pytest.mark.parametrize("err,text", [(0.0, "below 1e-6"), (4.4e-8, "below 1e-6"), (2.3e-7, "below 1e-6"),
                                      (2.6e-3, "3e-3"), (6.7e-2, "7e-2"), (0.98, "0.98"), (float("inf"), "inf")])
def test_errors_are_shown_the_same_on_every_machine(err, text):
    """fp32 rounding becomes a bound, larger errors one significant digit: no CPU-dependent digits."""
    assert error_text(err) == text


def test_capturing_asks_torch_whether_the_stream_captures(monkeypatch):
    """checks.capturing is what keeps the id check out of a CUDA graph; on a CPU it never reaches
    torch.cuda, so this calls the GPU branch with torch's answer replaced, once each way."""
    from types import SimpleNamespace

    assert capturing(torch.zeros(1)) is False
    for answer in (True, False):
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda answer=answer: answer)
        assert capturing(SimpleNamespace(is_cuda=True)) is answer
