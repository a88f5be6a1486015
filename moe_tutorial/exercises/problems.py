"""The inputs every checker feeds a student's function: small, seeded, with the awkward cases in.

Sizes are chosen so that a mistake shows: N and K not multiples of any block size (tails),
M, topk and N all different (a swapped axis changes the shape), non-contiguous tensors
(strides must be passed, not assumed), int64 ids next to int32, topk = E, M = 0, M = 1 with
topk = 1 (a bare ``.squeeze()`` drops both), K spanning many K blocks (a K loop that overwrites
or never advances), bfloat16 inputs where the code is plain torch (a buffer made without
``dtype=`` is float32), and router weights that do not add up to 1 (renormalize=False routers).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .. import runtime
from ..examples import worked_example
from ..reference import reference_moe_layer, reference_moe_matmul
from ..routing import route
from ..shapes import random_topk_ids


@dataclass
class Problem:
    """One first-GEMM problem (``w13``/``w2`` set for a layer problem)."""

    x: torch.Tensor
    weight: torch.Tensor
    topk_ids: torch.Tensor
    label: str = ""
    topk_weights: torch.Tensor | None = None
    w2: torch.Tensor | None = None
    #: A compact copy of ``weight`` for the reference when ``weight`` is a huge sparse view.
    compact_weight: torch.Tensor | None = None
    #: True when x, weight and topk_ids are views with unusual strides (see :func:`random_first_gemm`).
    strided: bool = False
    extras: dict = field(default_factory=dict)

    @property
    def M(self) -> int:
        return self.x.shape[0]

    @property
    def K(self) -> int:
        return self.x.shape[1]

    @property
    def N(self) -> int:
        return self.weight.shape[1]

    @property
    def E(self) -> int:
        return self.weight.shape[0]

    @property
    def topk(self) -> int:
        return self.topk_ids.shape[1]

    def describe(self) -> str:
        if self.w2 is not None:
            dims = f"M={self.M}, K={self.K}, I={self.N // 2}, E={self.E}, topk={self.topk}"
        else:
            dims = f"M={self.M}, N={self.N}, K={self.K}, E={self.E}, topk={self.topk}"
        return dims + (f" ({self.label})" if self.label else "")

    def first_gemm_reference(self) -> torch.Tensor:
        """``[M, topk, N]`` float64, times the router weights when the problem has them."""
        weight = self.weight if self.compact_weight is None else self.compact_weight
        ref = reference_moe_matmul(self.x, weight, self.topk_ids)
        if self.topk_weights is not None:
            ref = ref * self.topk_weights.double()[..., None]
        return ref

    def layer_reference(self) -> torch.Tensor:
        """``[M, K]`` float64."""
        return reference_moe_layer(self.x, self.weight, self.w2, self.topk_weights, self.topk_ids)


#: Label of the problem whose N and K are not multiples of any block size.
TAILS = "N and K not multiples of a block"


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def random_first_gemm(M: int, N: int, K: int, E: int, topk: int, *, seed: int, label: str = "",
                      strided: bool = False, ids_dtype=torch.int32, weighted: bool = False,
                      dtype: torch.dtype = torch.float32) -> Problem:
    """A random first-GEMM problem on the runtime's device, in ``dtype`` (float32 unless told).

    ``strided`` gives x every other column of a wider tensor; weight the ``[E, K, N]`` corner of
    a larger, padded ``[E, K + 2, N + 3]`` tensor, transposed (stride_we = (K + 2) * (N + 3), not
    N * K; stride_wk = N + 3, stride_wn = 1); topk_ids and the router weights transposed views.
    ``weighted`` adds float32 router weights: each pair's softmax probability over all E
    experts, not renormalised, so that a token's weights do not add up to 1 (DeepSeek-V2 keeps
    them so) and dividing by their sum shows.
    """
    g = _gen(seed)
    dev = runtime.DEVICE
    if strided:
        # Slice on the device: .to() would make a gapped view contiguous again.
        x = torch.randn(M, 2 * K, generator=g).to(dev, dtype)[:, ::2]
        # Padded rows: an offset written expert * N * K instead of expert * stride_we lands in the padding.
        padded = (torch.randn(E, K + 2, N + 3, generator=g) * K ** -0.5).to(dev, dtype)
        weight = padded[:, :K, :N].transpose(1, 2)
        ids = random_topk_ids(M, E, topk, generator=g, dtype=ids_dtype).t().contiguous().t()
    else:
        x = torch.randn(M, K, generator=g).to(dtype)
        weight = (torch.randn(E, N, K, generator=g) * K ** -0.5).to(dtype)
        ids = random_topk_ids(M, E, topk, generator=g, dtype=ids_dtype)
    problem = Problem(x.to(dev), weight.to(dev), ids.to(dev), label, strided=strided)
    if weighted:
        probs = torch.softmax(torch.randn(M, E, generator=g), dim=-1)
        problem.topk_weights = probs.gather(1, ids.long()).to(dev)
        if strided:     # the same values in a transposed view: topk_weights.stride() = (1, M)
            problem.topk_weights = problem.topk_weights.t().contiguous().t()
    return problem


def worked_first_gemm(weighted: bool = False) -> Problem:
    """The series' worked example (M=2, K=3, N=2, E=4, topk=2), checkable by hand."""
    ex = worked_example(device=runtime.DEVICE)
    problem = Problem(ex.x, ex.weight, ex.topk_ids, "the worked example")
    if weighted:
        problem.topk_weights = torch.tensor([[0.75, 0.25], [0.4, 0.6]], device=runtime.DEVICE)
    return problem


def torch_first_gemm_problems() -> list[Problem]:
    """Parts 1 and 2: everything, including M = 0, M = topk = 1, bfloat16 and a real model's E and topk."""
    return [
        worked_first_gemm(),
        random_first_gemm(5, 40, 24, 6, 2, seed=1, label=TAILS),
        random_first_gemm(7, 33, 20, 8, 4, seed=2, strided=True, ids_dtype=torch.int64,
                          label="non-contiguous inputs, int64 ids"),
        random_first_gemm(3, 16, 12, 4, 4, seed=3, label="topk = E"),
        random_first_gemm(4, 24, 32, 60, 4, seed=4, label="Qwen1.5-MoE's E = 60, topk = 4"),
        random_first_gemm(1, 12, 8, 5, 1, seed=6, label=ONE_TOKEN),
        random_first_gemm(4, 24, 16, 6, 3, seed=7, dtype=torch.bfloat16, label="bfloat16 x and weights, topk = 3"),
        random_first_gemm(0, 8, 8, 4, 2, seed=5, label="an empty batch"),
    ]


#: Label of the problems with one token and one expert per token.
ONE_TOKEN = "one token, topk = 1"

#: Label of the float16 kernel problem whose partial sums are far larger than the result.
CANCELLING = "float16, K = 512: partial sums far larger than the result"


def cancelling_first_gemm(M: int, N: int, E: int, topk: int, *, seed: int, weighted: bool = False) -> Problem:
    """A float16 first-GEMM problem, K = 512, where an accumulator in float16 fails and one in float32 is exact.

    x and weight hold small integers (x in 3..4, |weight| in 3..4), so every product, every
    sum of up to 128 of them (at most 2048) and the result are exact in float16. The weight's
    columns are positive for k < 256 and negative after, with the second half repeating the
    first except for one element in eight: a sum climbs past 3000, where float16 holds only
    even integers, and comes back down to a result of a few tens. A float32 accumulator is exact
    for any BLOCK_K up to 128; a float16 one rounds on the way and is off by several percent.
    """
    g = _gen(seed)
    half = 256                                                   # K = 512
    x = torch.randint(3, 5, (M, half), generator=g)
    x = torch.cat([x, x], 1)
    b = torch.randint(3, 5, (E, N, half), generator=g)
    changed = torch.rand(E, N, half, generator=g) < 0.125
    b2 = torch.where(changed, 7 - b, b)                          # 3 <-> 4 on one element in eight
    weight = torch.cat([b, -b2], 2)                              # [E, N, K]
    ids = random_topk_ids(M, E, topk, generator=g)
    dev = runtime.DEVICE
    problem = Problem(x.to(dev, torch.float16), weight.to(dev, torch.float16), ids.to(dev), CANCELLING)
    if weighted:
        probs = torch.softmax(torch.randn(M, E, generator=g), dim=-1)
        problem.topk_weights = probs.gather(1, ids.long()).to(dev)
    return problem

#: Label of the problem whose K spans many blocks of any BLOCK_K up to 128.
MANY_K_BLOCKS = "K = 200: many K blocks"


def kernel_problems(*, any_topk: bool = False, weighted: bool = False) -> list[Problem]:
    """Parts 3 and 4: a few programs each, float32 but for one float16 problem where only a float32
    accumulator is right (:func:`cancelling_first_gemm`). Powers of two for topk unless
    ``any_topk``. Each list has a non-contiguous problem (padded weight rows, transposed router
    weights), and K is larger than every BLOCK_K a student might pick in at least one problem."""
    if any_topk:
        return [
            random_first_gemm(5, 40, 24, 5, 3, seed=11, label="topk = 3", weighted=weighted),
            random_first_gemm(4, 24, 32, 64, 6, seed=12, label="DeepSeek-V2-Lite's E = 64, topk = 6",
                              weighted=weighted),
            random_first_gemm(3, 17, 16, 6, 2, seed=13, label="topk = 2 still", weighted=weighted),
            random_first_gemm(4, 33, 20, 8, 5, seed=14, strided=True, ids_dtype=torch.int64, weighted=weighted,
                              label="non-contiguous inputs, int64 ids, topk = 5"),
            cancelling_first_gemm(2, 16, 4, 3, seed=16, weighted=weighted),
        ]
    return [
        worked_first_gemm(weighted=weighted),
        random_first_gemm(5, 40, 24, 6, 2, seed=1, label=TAILS, weighted=weighted),
        random_first_gemm(7, 33, 20, 8, 4, seed=2, strided=True, ids_dtype=torch.int64, weighted=weighted,
                          label="non-contiguous inputs, int64 ids"),
        random_first_gemm(3, 16, 12, 4, 1, seed=3, label="topk = 1", weighted=weighted),
        random_first_gemm(3, 24, 200, 6, 2, seed=8, label=MANY_K_BLOCKS, weighted=weighted),
        cancelling_first_gemm(2, 16, 4, 2, seed=9, weighted=weighted),
    ]


#: Label of the bfloat16 layer problem whose two slots nearly cancel.
CANCELLING_LAYER = "bfloat16, two experts whose outputs nearly cancel"


def cancelling_layer_problem() -> Problem:
    """A bfloat16 layer (M=4, K=4, I=2, E = topk = 2) where a sum in bfloat16 fails and one in float32 passes.

    Small integers make every step up to the down GEMM exact in bfloat16: gate = 3 * (x's row
    sum) is 12 to 24, where silu(gate) rounds to gate itself; up is 0 to 4; each expert's output
    is an integer below 256. Expert 1's down weights are minus expert 0's, and the router weights
    are close to 1/2 each, so a token's two terms (about 50 each) cancel to a result of about 1.
    Rounding each term or the running sum to bfloat16 (8 bits) loses most of that difference;
    products and the sum in float32 keep it.
    """
    g = _gen(28)
    M, K, inter, E = 4, 4, 2, 2
    x = torch.randint(1, 3, (M, K), generator=g)
    gate = torch.full((inter, K), 3)
    up = (torch.rand(inter, K, generator=g) < 0.5).long()
    w13 = torch.cat([gate, up], 0)[None].expand(E, -1, -1)          # the same gate/up rows for both experts
    down = torch.randint(-1, 2, (K, inter), generator=g)
    w2 = torch.stack([down, -down])
    weights, ids = route(torch.randn(M, E, generator=g) * 0.05, E)
    dev, dtype = runtime.DEVICE, torch.bfloat16
    return Problem(x.to(dev, dtype), w13.to(dev, dtype).contiguous(), ids.to(dev), CANCELLING_LAYER,
                   topk_weights=weights.to(dev), w2=w2.to(dev, dtype))


def layer_problems() -> list[Problem]:
    """Whole-layer problems: the worked example, random ones, router weights that do not add up
    to 1 (and a transposed view of them), one token with topk = 1, bfloat16, slots that nearly
    cancel in bfloat16, an empty batch."""
    ex = worked_example(device=runtime.DEVICE)
    problems = [Problem(ex.x, ex.w13, ex.topk_ids, "the worked example", topk_weights=ex.topk_weights, w2=ex.w2)]
    specs = [  # M, K, I, E, topk, strided, renormalize, dtype, label
        (5, 24, 16, 6, 2, False, True, torch.float32, "random"),
        (4, 16, 12, 8, 4, True, True, torch.float32, "non-contiguous x, w2 and router weights"),
        (6, 16, 8, 8, 3, False, False, torch.float32, "router weights that do not add up to 1 (renormalize=False)"),
        (1, 12, 8, 4, 1, False, False, torch.float32, ONE_TOKEN),
        (4, 16, 8, 6, 2, False, True, torch.bfloat16, "bfloat16 x and weights"),
        (0, 8, 4, 4, 2, False, True, torch.float32, "an empty batch"),
    ]
    for seed, (M, K, inter, E, topk, strided, renorm, dtype, label) in enumerate(specs, start=21):
        g = _gen(seed)
        x = torch.randn(M, 2 * K, generator=g).to(runtime.DEVICE)[:, ::2] if strided else torch.randn(M, K, generator=g)
        w13 = torch.randn(E, 2 * inter, K, generator=g) * K ** -0.5
        w2 = torch.randn(E, K, inter, generator=g) * inter ** -0.5
        if strided:     # same values, stored [E, I, K] and viewed as [E, K, I]
            w2 = w2.transpose(1, 2).contiguous().transpose(1, 2)
        weights, ids = route(torch.randn(M, E, generator=g), topk, renormalize=renorm)
        if strided:     # the same values in a transposed view
            weights = weights.t().contiguous().t()
        dev = runtime.DEVICE
        problems.append(Problem(x.to(dev, dtype), w13.to(dev, dtype), ids.to(dev), label, topk_weights=weights.to(dev),
                                w2=w2.to(dev, dtype), strided=strided))
    return problems[:-1] + [cancelling_layer_problem(), problems[-1]]   # the empty batch last
