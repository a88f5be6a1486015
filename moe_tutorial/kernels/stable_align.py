"""Part 8: the alignment for training, with each expert's pairs in token order.

:func:`moe_tutorial.kernels.align.align_block_size` places the pairs of a large batch with
atomics, so the order of the pairs inside an expert's run is the order in which the GPU's
programs happened to arrive. The forward pass does not care: each output row depends on its
own pair only. The backward's weight gradients do: ``dW[e]`` sums over the rows of expert e's run,
and floating-point addition in another order gives other last bits. Here the pairs are sorted by
expert with a stable sort, so each run lists its pairs in token order, the same on every call,
and a training step is bitwise reproducible.

The result is the same :class:`moe_tutorial.kernels.align.Alignment` (runs end to end in expert
order, each padded to ``block_m`` with the sentinel ``M * topk``), so Part 4's kernels take it
as they take their own; :func:`expert_rows` adds where each expert's run starts, which the
K-grouped GEMMs of the backward need. A handful of PyTorch launches, no host synchronisation.
"""
from __future__ import annotations

import torch

from .align import Alignment, check_align_inputs


def stable_align_block_size(topk_ids: torch.Tensor, block_m: int, num_experts: int) -> Alignment:
    """:func:`moe_tutorial.kernels.align.align_block_size` with every run in token order.

    Args:
        topk_ids: ``[M, topk]`` int32/int64 in ``[0, num_experts)``, on the kernels' device.
        block_m: rows per block, a power of two up to 256.
        num_experts: E.

    Returns:
        An :class:`Alignment`: ``sorted_token_ids`` int32 ``[max_padded_rows]`` (pairs
        ``m * topk + j`` grouped by expert, ascending inside each run, padding ``M * topk``),
        ``expert_ids`` int32 (``-1`` past the used rows) and ``num_tokens_post_padded`` int32 ``[1]``.
    """
    block_m, num_experts, max_padded = check_align_inputs(topk_ids, block_m, num_experts)
    numel = topk_ids.numel()
    device = topk_ids.device
    flat = topk_ids.reshape(-1).long()
    # Stable: pairs of one expert keep their order, pair m * topk + j before (m + 1) * topk + j.
    order = torch.argsort(flat, stable=True)
    # Counted with index_add_, not bincount, which waits on the host for its size (integer sums are exact:
    # the order of the additions changes nothing).
    counts = torch.zeros(num_experts, dtype=torch.int64, device=device).index_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    run_starts = torch.cumsum(padded, 0) - padded              # first row of each expert's run
    pair_starts = torch.cumsum(counts, 0) - counts             # first place of each expert in `order`
    expert_of = flat[order]
    rows = run_starts[expert_of] + torch.arange(numel, device=device) - pair_starts[expert_of]
    sorted_ids = torch.full((max_padded,), numel, dtype=torch.int32, device=device)
    sorted_ids[rows] = order.to(torch.int32)
    num_post = padded.sum().reshape(1).to(torch.int32)
    # Block b holds the expert whose run contains row b * block_m; -1 past the used rows.
    first_rows = torch.arange(0, max_padded, block_m, device=device)
    run_ends = torch.cumsum(padded, 0)
    expert_ids = torch.searchsorted(run_ends, first_rows, right=True).to(torch.int32)
    expert_ids = torch.where(first_rows < num_post, expert_ids, -1).to(torch.int32)
    return Alignment((sorted_ids, expert_ids, num_post), block_m=block_m, num_experts=num_experts,
                     topk_ids=topk_ids)


def expert_rows(alignment: Alignment) -> torch.Tensor:
    """``[E + 1]`` int32: expert e's run is sorted rows ``[rows[e], rows[e + 1])`` (padding
    included; an expert with no pairs has an empty run). Works for any :class:`Alignment`, whose
    runs lie end to end in expert order. On the device, no host synchronisation."""
    _, expert_ids, _ = alignment
    E = alignment.num_experts
    labels = torch.where(expert_ids < 0, E, expert_ids.long())      # blocks past the end sort last
    bounds = torch.searchsorted(labels, torch.arange(E + 1, device=labels.device))
    return (bounds * alignment.block_m).to(torch.int32)
