"""A Mixtral-style sparse MoE block written the way Hugging Face's ``transformers`` writes it.

It is an outside witness for the series' layer: the router is a Linear, softmax, top-k and
renormalise; each expert is ``w2(silu(w1 x) * w3 x)`` with three bias-free Linears; a Python
loop over experts adds each expert's weighted output into its tokens. :func:`pack_weights`
turns its parameters into the series' ``w13 [E, 2I, K]`` and ``w2 [E, K, I]``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MixtralExpert(nn.Module):
    """One expert: ``w2(silu(w1(x)) * w3(x))``, hidden -> intermediate -> hidden."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.w1 = nn.Linear(hidden, intermediate, bias=False)   # gate
        self.w3 = nn.Linear(hidden, intermediate, bias=False)   # up
        self.w2 = nn.Linear(intermediate, hidden, bias=False)   # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MixtralSparseMoeBlock(nn.Module):
    """Router plus ``num_experts`` experts; each token goes to its ``top_k`` best experts.

    ``forward(x [M, hidden]) -> (y [M, hidden], router_logits [M, E])``, in x's dtype.
    """

    def __init__(self, hidden: int, intermediate: int, num_experts: int, top_k: int):
        super().__init__()
        if not 1 <= top_k <= num_experts:
            raise ValueError(f"top_k: expected an int between 1 and num_experts={num_experts}, got {top_k!r}")
        self.top_k = top_k
        self.gate = nn.Linear(hidden, num_experts, bias=False)
        self.experts = nn.ModuleList(MixtralExpert(hidden, intermediate) for _ in range(num_experts))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        router_logits = self.gate(x)
        # Softmax in fp32 over all experts, keep the top_k, renormalise them to sum to one.
        weights = F.softmax(router_logits, dim=-1, dtype=torch.float)
        weights, chosen = torch.topk(weights, self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        y = torch.zeros_like(x)
        # expert_mask[e, j, m] is 1 when token m's j-th choice is expert e.
        expert_mask = F.one_hot(chosen, num_classes=len(self.experts)).permute(2, 1, 0)
        for e, expert in enumerate(self.experts):
            slot, token = torch.where(expert_mask[e])
            if token.numel():
                out = expert(x[token]) * weights[token, slot, None]
                y.index_add_(0, token, out.to(x.dtype))
        return y, router_logits


def pack_weights(block: MixtralSparseMoeBlock) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's experts as the series' tensors: ``w13 [E, 2I, K]`` (w1 rows then w3 rows)
    and ``w2 [E, K, I]``, with K = hidden and I = intermediate, in the block's dtype.

    ``nn.Linear`` stores its weight as ``[out_features, in_features]``, which is already the
    series' ``[N, K]`` layout, so packing is stacking.
    """
    with torch.no_grad():
        w13 = torch.stack([torch.cat([ex.w1.weight, ex.w3.weight]) for ex in block.experts])
        w2 = torch.stack([ex.w2.weight for ex in block.experts])
    return w13.contiguous(), w2.contiguous()
