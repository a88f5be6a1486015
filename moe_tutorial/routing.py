"""The router: which ``topk`` experts each token goes to, and with what weight."""
from __future__ import annotations

import torch

from .checks import check_tensor


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over experts in fp32, keep the ``top_k`` largest, optionally renormalise.

    Args:
        router_logits: ``[M, E]`` float, the gate's output for each token.
        top_k: experts per token, ``1 <= top_k <= E``.
        renormalize: divide the kept weights by their sum so each token's weights add to 1
            (Mixtral, Qwen3); DeepSeek-V2 keeps the raw softmax weights.

    Returns:
        ``(topk_weights, topk_ids)``: fp32 ``[M, top_k]`` and int32 ``[M, top_k]``, each row
        sorted by decreasing weight.
    """
    check_tensor("router_logits", router_logits, 2)
    if not router_logits.is_floating_point():
        raise TypeError(f"router_logits: expected a floating-point dtype, got {router_logits.dtype}")
    num_experts = router_logits.shape[1]
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k: expected an int between 1 and E={num_experts}, got {top_k!r}")
    probs = torch.softmax(router_logits.float(), dim=-1)
    topk_weights, topk_ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids.to(torch.int32)
