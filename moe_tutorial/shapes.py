"""Real model shapes the series measures, and random problems built from them."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .routing import route


@dataclass(frozen=True)
class ModelShape:
    """An MoE layer's sizes. The first GEMM has ``N = 2 * intermediate`` and ``K = hidden``."""

    name: str
    num_experts: int
    topk: int
    hidden: int
    intermediate: int

    @property
    def first_gemm(self) -> tuple[int, int]:
        """``(N, K)`` of the gate/up GEMM."""
        return 2 * self.intermediate, self.hidden

    @property
    def second_gemm(self) -> tuple[int, int]:
        """``(N, K)`` of the down GEMM."""
        return self.hidden, self.intermediate


MODEL_SHAPES: dict[str, ModelShape] = {
    s.name: s
    for s in (
        ModelShape("Mixtral-8x7B", 8, 2, 4096, 14336),
        ModelShape("Qwen1.5-MoE-A2.7B", 60, 4, 2048, 1408),
        ModelShape("DeepSeek-V2-Lite", 64, 6, 2048, 1408),
        ModelShape("Qwen3-30B-A3B", 128, 8, 2048, 768),
        ModelShape("DeepSeek-V3", 256, 8, 7168, 2048),
        ModelShape("Kimi-K2", 384, 8, 7168, 2048),
    )
}


#: The three models every measurement of the series covers: few large experts, many small ones,
#: and many large ones.
HEADLINE_MODELS = ("Mixtral-8x7B", "Qwen3-30B-A3B", "DeepSeek-V3")
#: Tokens per batch the GPU results sweep, from one-token decode to a long prefill.
BATCH_SIZES = (1, 8, 64, 256, 1024, 4096, 16384)


def get_shape(name: str) -> ModelShape:
    """Look a model up by name (case-insensitive); ValueError lists the known names."""
    for key, shape in MODEL_SHAPES.items():
        if key.lower() == name.lower():
            return shape
    raise ValueError(f"model: expected one of {', '.join(MODEL_SHAPES)}, got {name!r}")


def random_topk_ids(M: int, num_experts: int, topk: int, *, generator=None, device="cpu",
                    dtype=torch.int32) -> torch.Tensor:
    """``[M, topk]`` ids, distinct within each row, uniformly spread over experts."""
    scores = torch.rand(M, num_experts, generator=generator, device="cpu")
    return scores.topk(topk, dim=1).indices.to(device=device, dtype=dtype)


def random_problem(M: int, N: int, K: int, num_experts: int, topk: int, *, dtype=torch.float32, device="cpu",
                   seed: int = 0, scale: float | None = None):
    """Random first-GEMM inputs ``(x [M, K], weight [E, N, K], topk_ids [M, topk] int32)``.

    Values are ~N(0, 1) for x and scaled by ``1/sqrt(K)`` for the weights so outputs stay O(1).
    """
    g = torch.Generator().manual_seed(seed)
    scale = max(K, 1) ** -0.5 if scale is None else scale
    x = torch.randn(M, K, generator=g).to(device=device, dtype=dtype)
    weight = (torch.randn(num_experts, N, K, generator=g) * scale).to(device=device, dtype=dtype)
    ids = random_topk_ids(M, num_experts, topk, generator=g, device=device)
    return x, weight, ids


def random_layer_problem(M: int, hidden: int, inter: int, num_experts: int, topk: int, *, dtype=torch.float32,
                         device="cpu", seed: int = 0, x_scale: float = 1.0, experts: int | None = None) -> dict:
    """Random inputs of the whole layer and a gradient for its output, for the backward's checks.

    Returns ``{"x": [M, hidden], "w13": [E, 2I, hidden], "w2": [E, hidden, I], "topk_weights":
    [M, topk] fp32, "topk_ids": [M, topk] int32, "d_out": [M, hidden]}``: weights scaled so that
    activations stay O(x_scale), routing from a softmax over random logits (:func:`route`) among
    the first ``experts`` experts only if given (the others get no token; ``topk <= experts``).
    Made on the CPU from ``seed``, then moved: the same values on every device.
    """
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, hidden, generator=g) * x_scale
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=g) * hidden ** -0.5
    w2 = torch.randn(num_experts, hidden, inter, generator=g) * inter ** -0.5
    logits = torch.randn(M, num_experts, generator=g)
    if experts is not None:
        logits[:, experts:] = float("-inf")
    topk_weights, topk_ids = route(logits, topk)
    d_out = torch.randn(M, hidden, generator=g)
    tensors = dict(x=x, w13=w13, w2=w2, topk_weights=topk_weights, topk_ids=topk_ids, d_out=d_out)
    return {k: v.to(device=device, dtype=dtype if v.is_floating_point() and k != "topk_weights" else v.dtype)
            for k, v in tensors.items()}
