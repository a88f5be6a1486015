"""The router: which ``topk`` experts each token goes to, and with what weight."""
from __future__ import annotations

import numpy as np
import torch

from .checks import as_int, capturing, check_holds_values, check_tensor


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over experts in fp32, keep the ``top_k`` largest, optionally renormalise.

    Args:
        router_logits: ``[M, E]`` float, the gate's output for each token. ``-inf`` masks an
            expert out (weight 0); a NaN or ``+inf``, or a row of nothing but ``-inf``, has no
            softmax and is refused with a ValueError naming the row (reading that verdict back
            is one host sync on a GPU).
        top_k: experts per token, ``1 <= top_k <= E``: an int, or anything integer-like
            (``numpy.int64``, a 0-d integer tensor).
        renormalize: divide the kept weights by their sum so each token's weights add to 1
            (Mixtral, Qwen3); DeepSeek-V2 keeps the raw softmax weights.

    Returns:
        ``(topk_weights, topk_ids)``: fp32 ``[M, top_k]`` and int32 ``[M, top_k]``, each row
        sorted by decreasing weight.
    """
    check_tensor("router_logits", router_logits, 2)
    if not router_logits.is_floating_point():
        raise TypeError(f"router_logits: expected a floating-point dtype, got {router_logits.dtype}")
    check_holds_values("router_logits", router_logits)
    num_experts = router_logits.shape[1]
    if num_experts == 0:
        raise ValueError(f"router_logits: expected at least one expert (router_logits is [M, E] with E >= 1), got "
                         f"shape {tuple(router_logits.shape)}")
    top_k = as_int("top_k", top_k)
    if not isinstance(renormalize, (bool, np.bool_)):
        # A string like "no" is truthy: taken as True it would renormalise against the caller's wish.
        raise TypeError(f"renormalize: expected True or False, got {renormalize!r}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k: expected an int between 1 and E={num_experts}, got {top_k!r}")
    probs = torch.softmax(router_logits.float(), dim=-1)
    topk_weights, topk_ids = torch.topk(probs, top_k, dim=-1)
    # topk ranks NaN above every number, so a row without a softmax shows up in its first weight.
    if topk_weights.numel() and not capturing(topk_weights) and bool(topk_weights[:, 0].isnan().any()):
        _refuse_logits(router_logits)
    if renormalize:
        topk_weights = topk_weights / topk_weights.sum(dim=-1, keepdim=True)
    return topk_weights, topk_ids.to(torch.int32)


def _refuse_logits(router_logits: torch.Tensor) -> None:
    """Name the first row whose softmax is undefined, and why."""
    logits = router_logits.float()
    for what, bad in (("a NaN", logits.isnan().any(dim=1)), ("+inf", (logits == float("inf")).any(dim=1)),
                      ("only -inf", (logits == float("-inf")).all(dim=1))):
        rows = bad.nonzero().flatten().tolist()
        if rows:
            raise ValueError(f"router_logits: expected finite logits or -inf (which masks an expert), "
                             f"got {what} in row {rows[0]}")
    raise ValueError("router_logits: expected logits whose softmax is defined, got NaN weights")
