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

    ``strided`` gives x every other column of a wider tensor, weight stored as ``[E, K, N]``
    and transposed (stride_wk = N, stride_wn = 1), and topk_ids as a transposed view.
    ``weighted`` adds float32 router weights: each pair's softmax probability over all E
    experts, not renormalised, so that a token's weights do not add up to 1 (DeepSeek-V2 keeps
    them so) and dividing by their sum shows.
    """
    g = _gen(seed)
    dev = runtime.DEVICE
    if strided:
        # Slice on the device: .to() would make a gapped view contiguous again.
        x = torch.randn(M, 2 * K, generator=g).to(dev, dtype)[:, ::2]
        weight = (torch.randn(E, K, N, generator=g) * K ** -0.5).to(dtype).transpose(1, 2)
        ids = random_topk_ids(M, E, topk, generator=g, dtype=ids_dtype).t().contiguous().t()
    else:
        x = torch.randn(M, K, generator=g).to(dtype)
        weight = (torch.randn(E, N, K, generator=g) * K ** -0.5).to(dtype)
        ids = random_topk_ids(M, E, topk, generator=g, dtype=ids_dtype)
    problem = Problem(x.to(dev), weight.to(dev), ids.to(dev), label, strided=strided)
    if weighted:
        probs = torch.softmax(torch.randn(M, E, generator=g), dim=-1)
        problem.topk_weights = probs.gather(1, ids.long()).to(dev)
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

#: Label of the problem whose K spans many blocks of any BLOCK_K up to 128.
MANY_K_BLOCKS = "K = 200: many K blocks"


def kernel_problems(*, any_topk: bool = False, weighted: bool = False) -> list[Problem]:
    """Parts 3 and 4: a few programs each, float32 (the interpreter's dtype). Powers of two for topk
    unless ``any_topk``. Each list has a non-contiguous problem, and K is larger than every
    BLOCK_K a student might pick in at least one problem."""
    if any_topk:
        return [
            random_first_gemm(5, 40, 24, 5, 3, seed=11, label="topk = 3", weighted=weighted),
            random_first_gemm(4, 24, 32, 64, 6, seed=12, label="DeepSeek-V2-Lite's E = 64, topk = 6",
                              weighted=weighted),
            random_first_gemm(3, 17, 16, 6, 2, seed=13, label="topk = 2 still", weighted=weighted),
            random_first_gemm(4, 33, 20, 8, 5, seed=14, strided=True, ids_dtype=torch.int64, weighted=weighted,
                              label="non-contiguous inputs, int64 ids, topk = 5"),
        ]
    return [
        worked_first_gemm(weighted=weighted),
        random_first_gemm(5, 40, 24, 6, 2, seed=1, label=TAILS, weighted=weighted),
        random_first_gemm(7, 33, 20, 8, 4, seed=2, strided=True, ids_dtype=torch.int64, weighted=weighted,
                          label="non-contiguous inputs, int64 ids"),
        random_first_gemm(3, 16, 12, 4, 1, seed=3, label="topk = 1", weighted=weighted),
        random_first_gemm(3, 24, 200, 6, 2, seed=8, label=MANY_K_BLOCKS, weighted=weighted),
    ]


def layer_problems() -> list[Problem]:
    """Whole-layer problems: the worked example, random ones, router weights that do not add up
    to 1, one token with topk = 1, bfloat16, an empty batch."""
    ex = worked_example(device=runtime.DEVICE)
    problems = [Problem(ex.x, ex.w13, ex.topk_ids, "the worked example", topk_weights=ex.topk_weights, w2=ex.w2)]
    specs = [  # M, K, I, E, topk, strided, renormalize, dtype, label
        (5, 24, 16, 6, 2, False, True, torch.float32, "random"),
        (4, 16, 12, 8, 4, True, True, torch.float32, "non-contiguous x and w2"),
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
        dev = runtime.DEVICE
        problems.append(Problem(x.to(dev, dtype), w13.to(dev, dtype), ids.to(dev), label, topk_weights=weights.to(dev),
                                w2=w2.to(dev, dtype), strided=strided))
    return problems
