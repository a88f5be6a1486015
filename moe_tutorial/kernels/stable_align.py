"""Part 8: the alignment for training, with each expert's pairs in token order.

:func:`moe_tutorial.kernels.align.align_block_size` places the pairs of a large batch with
atomics, so the order of the pairs inside an expert's run is the order in which the GPU's
programs happened to arrive. The forward pass does not care: each output row depends on its
own pair only. The backward's weight gradients do: ``dW[e]`` sums over the rows of expert e's run,
and floating-point addition in another order gives other last bits. Here each run lists its
pairs in token order, the same on every call, and a training step is bitwise reproducible.

It is Part 4's alignment with one step changed (``stable=True``): after the chunks are counted
and the runs planned, each chunk's first row in each run is its run's first row plus the pairs of
the earlier chunks (a prefix sum over the chunk counts), and a pair's row is that plus the number
of its chunk's earlier pairs of the same expert. The result is the same
:class:`moe_tutorial.kernels.align.Alignment`, so Part 4's kernels take it as they take their own;
:func:`expert_rows` adds where each expert's run starts, which the K-grouped GEMMs of the backward
need. Four launches (three Triton kernels and one prefix sum), no host synchronisation.
"""
from __future__ import annotations

import torch

from .align import Alignment, align_block_size


def stable_align_block_size(topk_ids: torch.Tensor, block_m: int, num_experts: int) -> Alignment:
    """:func:`moe_tutorial.kernels.align.align_block_size` with every run in token order.

    Args:
        topk_ids: ``[M, topk]`` int32/int64 in ``[0, num_experts)``, on the kernels' device
            (an id outside is dropped, as Part 4's alignment drops it: callers check, as
            :func:`moe_tutorial.kernels.trainable_layer.trainable_moe_layer` does).
        block_m: rows per block, a power of two up to 256.
        num_experts: E.

    Returns:
        An :class:`Alignment`: ``sorted_token_ids`` int32 ``[max_padded_rows]`` (pairs
        ``m * topk + j`` grouped by expert, ascending inside each run; padding, and the rows
        past the used ones, ``M * topk``), ``expert_ids`` int32 (``-1`` past the used rows)
        and ``num_tokens_post_padded`` int32 ``[1]``.
    """
    return align_block_size(topk_ids, block_m, num_experts, stable=True)


def expert_rows(alignment: Alignment) -> torch.Tensor:
    """``[E + 1]`` int32: expert e's run is sorted rows ``[rows[e], rows[e + 1])`` (padding
    included; an expert with no pairs has an empty run). Works for any :class:`Alignment`, whose
    runs lie end to end in expert order. On the device, no host synchronisation."""
    _, expert_ids, _ = alignment
    E = alignment.num_experts
    labels = torch.where(expert_ids < 0, E, expert_ids.long())      # blocks past the end sort last
    bounds = torch.searchsorted(labels, torch.arange(E + 1, device=labels.device))
    return (bounds * alignment.block_m).to(torch.int32)
