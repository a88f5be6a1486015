"""Checkers for Part 2, the token view: the gather, the broadcast matmul, its cost, the layer."""
from __future__ import annotations

import operator

import torch

from ..indexing import intermediate_bytes
from ..reference import tolerance
from ..shapes import get_shape
from .common import check_first_gemm_fn, check_layer_fn
from .diagnose import expect_tensor
from .feedback import Fail, call_student, on, run_check
from .problems import layer_problems, torch_first_gemm_problems


def _expect_selected(got, p) -> None:
    sizes = {"M": p.M, "topk": p.topk, "N": p.N, "K": p.K}
    if isinstance(got, torch.Tensor) and tuple(got.shape) == (p.M, p.topk, p.K, p.N) and p.N != p.K:
        raise Fail(f"selected has the wrong shape: expected [M, topk, N, K] = {tuple(sizes.values())}, got "
                   f"{tuple(got.shape)} = [M, topk, K, N]: each expert's weights are transposed. weight[topk_ids] "
                   "keeps weight's own [N, K] axes: index the weight as it is, without .T or transpose(1, 2)")
    expect_tensor(got, what="selected", sizes=sizes, dtype=p.weight.dtype, device=p.weight.device)
    ids = p.topk_ids.long()
    for m in range(p.M):
        for j in range(p.topk):
            if not torch.equal(got[m, j], p.weight[ids[m, j]]):
                same = [e for e in range(p.E) if torch.equal(got[m, j], p.weight[e])]
                what = f"expert {same[0]}'s weights" if same else "not any expert's weights"
                raise Fail(f"selected[{m}, {j}] should be weight[{int(ids[m, j])}] (expert topk_ids[{m}, {j}]), "
                           f"yours is {what}")


def check_select_weights(fn) -> bool:
    """Exercise 2.1: ``fn(weight [E, N, K], topk_ids [M, topk]) -> weight[topk_ids]`` ``[M, topk, N, K]``."""
    def body():
        problems = torch_first_gemm_problems()
        # First a problem whose M, topk, N and K all differ: on the worked example (M = topk = N = 2)
        # a transposed or swapped axis has a shape that cannot say which axes moved.
        problems.sort(key=lambda p: len({p.M, p.topk, p.N, p.K}) < 4)
        for p in problems:
            with on(p.describe()):
                _expect_selected(call_student(fn, p.weight, p.topk_ids, names=("weight", "topk_ids")), p)
        return (f"right on all {len(problems)} problems, non-contiguous and bfloat16 weights, topk = 1 and an empty "
                "batch included.")
    return run_check("2.1", body)


def check_indexing_matmul(fn) -> bool:
    """Exercise 2.2: the vectorised first GEMM ``fn(x, weight, topk_ids) -> [M, topk, N]``."""
    return check_first_gemm_fn("2.2", fn, torch_first_gemm_problems(), tolerance(torch.float32))


def _bytes_cases():
    mixtral, ds3 = get_shape("Mixtral-8x7B"), get_shape("DeepSeek-V3")
    return [   # the first case tells the factors apart: topk, itemsize and M all differ
        ("fp32", (5, 3, 10, 6), 4),
        ("one Mixtral-8x7B token, bf16", (1, mixtral.topk, *mixtral.first_gemm), 2),
        ("4096 DeepSeek-V3 tokens, bf16", (4096, ds3.topk, *ds3.first_gemm), 2),
        ("an empty batch", (0, 2, 8, 8), 2),
        ("one token, one expert", (1, 1, 16, 8), 4),
        ("itemsize left at its default, 2", (5, 2, 12, 16), None),
        # Odd sizes whose product passes 2**24 and 2**31: float32 rounds it (off by 59434), int32 wraps.
        (ODD_SIZES, (4097, 7, 4099, 7167), 2),
    ]


#: Label of the 2.3 case whose product a float32 rounds.
ODD_SIZES = "odd sizes, 1.7e12 bytes"


def _expect_bytes(got, dims, itemsize: int) -> None:
    want = intermediate_bytes(*dims, itemsize)
    if isinstance(got, bool) or not hasattr(got, "__index__") or \
            (isinstance(got, torch.Tensor) and (got.is_floating_point() or got.is_complex() or got.numel() != 1)):
        kind = f"{type(got).__name__} {got!r}" if isinstance(got, (int, float)) else type(got).__name__
        why = (": a byte count is a whole number, and a float holds whole numbers exactly only up to 2**53 "
               "(float32: 2**24), so a product of sizes in floating point is off on large sizes. Multiply the "
               "Python ints themselves (and use // if you divide)") if isinstance(got, float) or (
                   isinstance(got, torch.Tensor) and got.is_floating_point()) else ""
        raise Fail(f"expected a number of bytes (an int), got {kind}{why}")
    try:
        value = operator.index(got)
    except Exception:  # noqa: BLE001  (an object that claims to be an integer and is not)
        raise Fail(f"expected a number of bytes (an int), got {type(got).__name__}") from None
    if value == want:
        return
    text = f"expected {want:,} bytes, got {value!r}"
    M, topk = dims[0], dims[1]
    for factor, why in ((topk, "each token has topk experts, each with its own [N, K] weights"),
                        (itemsize, "that counts elements: multiply by itemsize for bytes"),
                        (M, "that is one token's share: the tensor holds all M tokens")):
        if factor > 1 and value * factor == want:
            raise Fail(text + f", {factor} times too small: {why}")
    if value < 0 or want >= 2**31 > abs(value):
        raise Fail(text + ": the number wrapped around. int32 holds at most 2**31 - 1; "
                          "Python ints never overflow (avoid int32 tensors or numpy scalars here)")
    if abs(value - want) <= 1e-6 * want:
        raise Fail(text + f", off by {value - want:,}: a rounding. The product was computed in floating point, which "
                          "holds whole numbers exactly only up to 2**24 (float32) or 2**53 (float64); multiply "
                          "Python ints")
    raise Fail(text)


def check_intermediate_bytes(fn) -> bool:
    """Exercise 2.3: ``fn(M, topk, N, K, itemsize=2) -> int``, bytes of ``selected [M, topk, N, K]``."""
    def body():
        cases = _bytes_cases()
        for label, dims, itemsize in cases:
            args = dims if itemsize is None else (*dims, itemsize)
            sizes = ", ".join(f"{n}={v}" for n, v in zip(("M", "topk", "N", "K"), dims))
            with on(f"{sizes} ({label})"):
                _expect_bytes(call_student(fn, *args), dims, itemsize or 2)
        mixtral = get_shape("Mixtral-8x7B")
        per_token = intermediate_bytes(1, mixtral.topk, *mixtral.first_gemm) / 1e6
        return (f"right on all {len(cases)} cases: one Mixtral token's selected weights are "
                f"{per_token:.0f} MB, written to HBM and read back.")
    return run_check("2.3", body)


def check_indexing_layer(fn) -> bool:
    """Exercise 2.4: the layer built from the vectorised first GEMM ``fn(x, w13, w2, topk_weights, topk_ids)``."""
    return check_layer_fn("2.4", fn, layer_problems())
