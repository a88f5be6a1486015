"""Part 4, step one: sort the (token, slot) pairs by expert and pad each expert's run.

After this, every BLOCK_M consecutive entries of ``sorted_token_ids`` belong to one expert,
so a program that owns them can multiply a ``[BLOCK_M, K]`` tile by one expert's weights with
``tl.dot`` on tensor cores. No host synchronisation: one Triton launch for decode-sized batches
(up to SMALL_BATCH_PAIRS pairs); for larger ones three (count per chunk in parallel, plan the
runs in one program, then place the pairs and label the blocks in parallel).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..checks import check_tensor


@triton.jit
def _spare_if_invalid(ids, NUM_EXPERTS: tl.constexpr, E_PAD: tl.constexpr):
    """Ids outside [0, E) go to the spare bin: they are never counted, placed or stored."""
    return tl.where((ids >= 0) & (ids < NUM_EXPERTS), ids, E_PAD - 1)


@triton.jit
def _runs_from_counts(counts, NUM_EXPERTS: tl.constexpr, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr):
    """Pad each expert's count to a multiple of BLOCK_M and lay the runs end to end."""
    is_expert = tl.arange(0, E_PAD) < NUM_EXPERTS
    counts = tl.where(is_expert, counts, 0)       # drop the spare bin of masked lanes
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    return counts, ends - padded, ends, is_expert


@triton.jit
def _fill_padding(sorted_ids_ptr, counts, starts, ends, is_expert, numel,
                  E_PAD: tl.constexpr, BLOCK_M: tl.constexpr):
    """The padding rows of each run, at most BLOCK_M - 1 of them, get the sentinel ``numel``."""
    for j in range(0, BLOCK_M - 1):
        row = starts + counts + j
        tl.store(sorted_ids_ptr + row, tl.zeros((E_PAD,), dtype=tl.int32) + numel,
                 mask=is_expert & (row < ends))


@triton.jit
def _label_blocks(expert_ids_ptr, b, num_blocks, ends, total, BLOCK_M: tl.constexpr):
    """Block b starts at row b * BLOCK_M; its expert is the number of runs ending at or before it."""
    first_row = b * BLOCK_M
    block_expert = tl.sum((ends[None, :] <= first_row[:, None]).to(tl.int32), axis=1)
    block_expert = tl.where(first_row < total, block_expert, -1)
    tl.store(expert_ids_ptr + b, block_expert, mask=b < num_blocks)


@triton.jit
def _align_small_kernel(
    ids_ptr, numel, sorted_ids_ptr, expert_ids_ptr, num_post_ptr, num_blocks,
    NUM_EXPERTS: tl.constexpr, BLOCK_M: tl.constexpr, SMALL: tl.constexpr,
):
    """Decode-sized batches (numel <= SMALL): one program, one launch, every pair compared
    with every other. The work is SMALL x SMALL whatever the number of experts, so a batch of
    8 pairs costs the same for 8 experts as for 256.
    """
    i = tl.arange(0, SMALL)
    ok = i < numel
    ids = tl.load(ids_ptr + i, mask=ok, other=-1).to(tl.int32)
    ok = ok & (ids >= 0) & (ids < NUM_EXPERTS)
    same = (ids[:, None] == ids[None, :]) & ok[:, None] & ok[None, :]      # [SMALL, SMALL]
    count = tl.sum(same.to(tl.int32), axis=1)                 # pairs sharing my expert
    rank = tl.sum((same & (i[None, :] < i[:, None])).to(tl.int32), axis=1)   # ... before me
    opens = ok & (rank == 0)                                  # I am my expert's first pair
    padded = (count + BLOCK_M - 1) // BLOCK_M * BLOCK_M      # my expert's run length
    # My run starts after the runs of all smaller experts, each counted once, by its first pair.
    before = opens[None, :] & (ids[None, :] < ids[:, None])
    start = tl.sum(tl.where(before, padded[None, :], 0), axis=1)
    total = tl.sum(tl.where(opens, padded, 0), axis=0)
    tl.store(num_post_ptr, total)
    tl.store(sorted_ids_ptr + start + rank, i, mask=ok)
    # Each run's first pair writes the run's padding rows: at most BLOCK_M - 1 of them.
    t = tl.arange(0, BLOCK_M)
    pad_rows = (start + count)[:, None] + t[None, :]
    is_pad = opens[:, None] & (t[None, :] < (padded - count)[:, None])
    tl.store(sorted_ids_ptr + pad_rows, tl.zeros((SMALL, BLOCK_M), dtype=tl.int32) + numel, mask=is_pad)
    # Block b (num_blocks <= numel <= SMALL) takes the expert of the run holding row b * BLOCK_M.
    first_row = i * BLOCK_M
    holds = opens[None, :] & (start[None, :] <= first_row[:, None]) & (first_row[:, None] < (start + padded)[None, :])
    label = tl.sum(tl.where(holds, ids[None, :], 0), axis=1)
    tl.store(expert_ids_ptr + i, tl.where(first_row < total, label, -1), mask=i < num_blocks)


@triton.jit
def _count_chunks_kernel(ids_ptr, numel, partial_ptr,
                         NUM_EXPERTS: tl.constexpr, E_PAD: tl.constexpr, CHUNK: tl.constexpr):
    """Each program counts its chunk's pairs per expert into its own row of ``partial``."""
    pid = tl.program_id(0)
    offs = pid * CHUNK + tl.arange(0, CHUNK)
    # Out-of-range lanes land in the spare bin E_PAD - 1 >= NUM_EXPERTS, dropped later.
    ids = tl.load(ids_ptr + offs, mask=offs < numel, other=E_PAD - 1).to(tl.int32)
    ids = _spare_if_invalid(ids, NUM_EXPERTS, E_PAD)
    tl.store(partial_ptr + pid * E_PAD + tl.arange(0, E_PAD), tl.histogram(ids, E_PAD))


@triton.jit
def _plan_blocks_kernel(
    partial_ptr, num_chunks, numel, sorted_ids_ptr, cursor_ptr, ends_ptr, num_post_ptr,
    NUM_EXPERTS: tl.constexpr, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
):
    """One program: add up the chunk counts, pad each to BLOCK_M, prefix-sum the runs."""
    e_offs = tl.arange(0, E_PAD)
    counts = tl.zeros((E_PAD,), dtype=tl.int32)
    for c in range(0, num_chunks):
        counts += tl.load(partial_ptr + c * E_PAD + e_offs)
    counts, starts, ends, is_expert = _runs_from_counts(counts, NUM_EXPERTS, E_PAD, BLOCK_M)
    tl.store(num_post_ptr, tl.sum(ends - starts, axis=0))
    tl.store(cursor_ptr + e_offs, starts, mask=is_expert)   # next free row of each run
    tl.store(ends_ptr + e_offs, ends)
    _fill_padding(sorted_ids_ptr, counts, starts, ends, is_expert, numel, E_PAD, BLOCK_M)


@triton.jit
def _scatter_and_label_kernel(
    ids_ptr, numel, sorted_ids_ptr, cursor_ptr, ends_ptr, num_post_ptr, expert_ids_ptr, num_blocks, num_scatter,
    NUM_EXPERTS: tl.constexpr, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
    CHUNK: tl.constexpr, LABEL_CHUNK: tl.constexpr,
):
    """Programs below num_scatter place pairs; the others label blocks with their expert."""
    pid = tl.program_id(0)
    if pid < num_scatter:
        # Each pair takes the next free row of its expert's run. Atomic, so the order of pairs
        # inside a run is whatever order the GPU's programs arrive in.
        offs = pid * CHUNK + tl.arange(0, CHUNK)
        ok = offs < numel
        expert = tl.load(ids_ptr + offs, mask=ok, other=0).to(tl.int32)
        ok = ok & (expert >= 0) & (expert < NUM_EXPERTS)       # never touch memory for a bad id
        row = tl.atomic_add(cursor_ptr + expert, 1, mask=ok)
        tl.store(sorted_ids_ptr + row, offs, mask=ok)
    else:
        b = (pid - num_scatter) * LABEL_CHUNK + tl.arange(0, LABEL_CHUNK)
        ends = tl.load(ends_ptr + tl.arange(0, E_PAD))
        _label_blocks(expert_ids_ptr, b, num_blocks, ends, tl.load(num_post_ptr), BLOCK_M)


#: Up to this many (token, slot) pairs, one program aligns them in a single launch.
SMALL_BATCH_PAIRS = 64


def max_padded_rows(numel: int, block_m: int, num_experts: int) -> int:
    """An upper bound on ``num_tokens_post_padded`` known on the host without a sync.

    Each expert pads at most ``block_m - 1`` rows, and no expert needs more than one block
    per pair.
    """
    return min(numel + num_experts * (block_m - 1), numel * block_m)


def align_block_size(topk_ids: torch.Tensor, block_m: int, num_experts: int, *,
                     small_batch_pairs: int = SMALL_BATCH_PAIRS):
    """Sort (token, slot) pairs by expert; pad each expert's run to a multiple of ``block_m``.

    Args:
        topk_ids: ``[M, topk]`` int32/int64 in ``[0, num_experts)``.
        block_m: rows per block, a power of two.
        num_experts: E.
        small_batch_pairs: up to this many pairs, one launch; 0 always takes the three launches
            (the benchmark times both to show what the one-launch path buys).

    Returns:
        ``(sorted_token_ids, expert_ids, num_tokens_post_padded)``:
        - ``sorted_token_ids`` int32 ``[max_padded_rows]``: flat pair indices ``m * topk + j``
          grouped by expert; padding rows hold ``M * topk``; rows from
          ``num_tokens_post_padded`` on are unspecified.
        - ``expert_ids`` int32 ``[max_padded_rows // block_m]``: the expert of each block,
          -1 for blocks past ``num_tokens_post_padded``.
        - ``num_tokens_post_padded`` int32 ``[1]``: rows actually used, a device tensor.
        Ids outside ``[0, num_experts)`` are dropped (their pairs appear nowhere); checking
        them would cost a host sync, so callers validate (``check_matmul_inputs`` does).
        The order of pairs inside one expert's run is not specified (atomics on a GPU for
        more than SMALL_BATCH_PAIRS pairs; token order below that).
    """
    check_tensor("topk_ids", topk_ids, 2)
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_ids: expected dtype torch.int32 or torch.int64, got {topk_ids.dtype}")
    if isinstance(block_m, bool) or not isinstance(block_m, int) or block_m < 1 or block_m & (block_m - 1):
        raise ValueError(f"block_m: expected a power of two, got {block_m!r}")
    if isinstance(num_experts, bool) or not isinstance(num_experts, int) or num_experts < 1:
        raise ValueError(f"num_experts: expected a positive int, got {num_experts!r}")
    ids = topk_ids.reshape(-1).contiguous()
    numel = ids.numel()
    device = topk_ids.device
    max_padded = max_padded_rows(numel, block_m, num_experts)
    sorted_ids = torch.empty(max_padded, dtype=torch.int32, device=device)
    expert_ids = torch.empty(triton.cdiv(max_padded, block_m), dtype=torch.int32, device=device)
    if numel == 0:
        return sorted_ids, expert_ids, torch.zeros(1, dtype=torch.int32, device=device)
    num_post = torch.empty(1, dtype=torch.int32, device=device)    # a kernel writes it: no memset launch
    num_blocks = expert_ids.numel()
    if numel <= min(small_batch_pairs, SMALL_BATCH_PAIRS):
        # Sized to the batch: SMALL x SMALL tensors, about 16 elements per thread. On an H200:
        # 1.7 us for 8 pairs, 3.3 us for 64; 128 pairs took 9.7 us (the three-launch path
        # takes 7 us for 512), hence the limit of 64.
        small = max(16, triton.next_power_of_2(numel))
        _align_small_kernel[(1,)](
            ids, numel, sorted_ids, expert_ids, num_post, num_blocks,
            NUM_EXPERTS=num_experts, BLOCK_M=block_m, SMALL=small,
            num_warps=max(1, min(8, small * small // (32 * 16))),
        )
        return sorted_ids, expert_ids, num_post
    e_pad = triton.next_power_of_2(num_experts + 1)   # + 1: a spare bin for masked lanes
    chunk, label_chunk = 1024, max(16, 8192 // e_pad)
    num_chunks = triton.cdiv(numel, chunk)
    partial = torch.empty(num_chunks, e_pad, dtype=torch.int32, device=device)
    cursor = torch.empty(e_pad, dtype=torch.int32, device=device)
    ends = torch.empty(e_pad, dtype=torch.int32, device=device)
    _count_chunks_kernel[(num_chunks,)](ids, numel, partial, NUM_EXPERTS=num_experts, E_PAD=e_pad, CHUNK=chunk)
    _plan_blocks_kernel[(1,)](
        partial, num_chunks, numel, sorted_ids, cursor, ends, num_post,
        NUM_EXPERTS=num_experts, E_PAD=e_pad, BLOCK_M=block_m,
    )
    grid = (num_chunks + triton.cdiv(num_blocks, label_chunk),)
    _scatter_and_label_kernel[grid](
        ids, numel, sorted_ids, cursor, ends, num_post, expert_ids, num_blocks, num_chunks,
        NUM_EXPERTS=num_experts, E_PAD=e_pad, BLOCK_M=block_m, CHUNK=chunk, LABEL_CHUNK=label_chunk,
    )
    return sorted_ids, expert_ids, num_post
