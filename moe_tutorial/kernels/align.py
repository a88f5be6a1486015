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

from ..checks import as_int, check_kernel_device, check_tensor


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
    ids = tl.load(ids_ptr + i, mask=ok, other=-1)
    ok = ok & (ids >= 0) & (ids < NUM_EXPERTS)      # before the cast: int64 id 2^32 + 3 is no expert 3
    ids = ids.to(tl.int32)
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
    ids = tl.load(ids_ptr + offs, mask=offs < numel, other=E_PAD - 1)
    ids = _spare_if_invalid(ids, NUM_EXPERTS, E_PAD).to(tl.int32)   # int64 ids are judged before the cast
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
def _place_in_token_order(ids_ptr, numel, sorted_ids_ptr, first_ptr, base,
                          NUM_EXPERTS: tl.constexpr, CHUNK: tl.constexpr, SUB: tl.constexpr):
    """Place the chunk of pairs from ``base``: a pair's row is its chunk's first row in its
    expert's run (``first_ptr[e]``) plus the number of the chunk's earlier pairs of that expert,
    counted by comparing ``[SUB, SUB]`` tiles of ids. No atomics: the same rows on every call."""
    for i0 in range(0, CHUNK, SUB):
        offs_i = base + i0 + tl.arange(0, SUB)
        ok = offs_i < numel
        id_i = tl.load(ids_ptr + offs_i, mask=ok, other=-1)
        ok = ok & (id_i >= 0) & (id_i < NUM_EXPERTS)           # never touch memory for a bad id
        rank = tl.zeros((SUB,), dtype=tl.int32)
        for j0 in range(0, i0 + SUB, SUB):
            offs_j = base + j0 + tl.arange(0, SUB)
            id_j = tl.load(ids_ptr + offs_j, mask=offs_j < numel, other=-1)
            earlier = (id_j[None, :] == id_i[:, None]) & (offs_j[None, :] < offs_i[:, None])
            rank += tl.sum(earlier.to(tl.int32), axis=1)
        expert = tl.where(ok, id_i, 0).to(tl.int32)             # only now: int64 ids are judged whole
        row = tl.load(first_ptr + expert, mask=ok, other=0) + rank
        tl.store(sorted_ids_ptr + row, offs_i, mask=ok)


@triton.jit
def _scatter_and_label_kernel(
    ids_ptr, numel, sorted_ids_ptr, cursor_ptr, ends_ptr, num_post_ptr, expert_ids_ptr, num_blocks, num_scatter,
    NUM_EXPERTS: tl.constexpr, E_PAD: tl.constexpr, BLOCK_M: tl.constexpr,
    CHUNK: tl.constexpr, LABEL_CHUNK: tl.constexpr, STABLE: tl.constexpr,
):
    """Programs below num_scatter place pairs; the others label blocks with their expert.
    ``cursor`` is each run's next free row, or with STABLE each chunk's first row in each run
    (``[num_scatter, E_PAD]``)."""
    pid = tl.program_id(0)
    if pid < num_scatter:
        if STABLE:
            _place_in_token_order(ids_ptr, numel, sorted_ids_ptr, cursor_ptr + pid * E_PAD, pid * CHUNK,
                                  NUM_EXPERTS, CHUNK, 128)
        else:
            # Each pair takes the next free row of its expert's run. Atomic, so the order of pairs
            # inside a run is whatever order the GPU's programs arrive in.
            offs = pid * CHUNK + tl.arange(0, CHUNK)
            ok = offs < numel
            expert = tl.load(ids_ptr + offs, mask=ok, other=0)
            ok = ok & (expert >= 0) & (expert < NUM_EXPERTS)       # never touch memory for a bad id
            expert = expert.to(tl.int32)                           # only now: int64 ids are judged whole
            row = tl.atomic_add(cursor_ptr + expert, 1, mask=ok)
            tl.store(sorted_ids_ptr + row, offs, mask=ok)
    else:
        b = (pid - num_scatter) * LABEL_CHUNK + tl.arange(0, LABEL_CHUNK)
        ends = tl.load(ends_ptr + tl.arange(0, E_PAD))
        _label_blocks(expert_ids_ptr, b, num_blocks, ends, tl.load(num_post_ptr), BLOCK_M)


#: Up to this many (token, slot) pairs, one program aligns them in a single launch.
SMALL_BATCH_PAIRS = 64

#: The largest ``block_m``. The sorted kernel's configurations use 16 to 128 rows; a run's
#: padding is written one row at a time (up to ``block_m - 1`` steps), so a block far larger
#: than any tile only wastes rows and time (65536 ran for minutes in the interpreter).
MAX_BLOCK_M = 256

#: The most experts. The three-launch path keeps one counter per expert in a single program,
#: ``E + 1`` rounded up to a power of two, and labels blocks with a ``[16, that]`` tile, which
#: must stay within what Triton will hold (2^20 elements) and what one GPU program can carry.
MAX_EXPERTS = 4096

#: Rows are int32 and the padding value is the number of pairs: both must fit.
MAX_ROWS = 2 ** 31 - 1


class Alignment(tuple):
    """What :func:`align_block_size` returns: the triple ``(sorted_token_ids, expert_ids,
    num_tokens_post_padded)``, unpacked like any tuple, and what it was built for.

    ``block_m``, ``num_experts``, ``num_pairs`` (``M * topk``) and ``topk_ids``, the very tensor
    it sorted. Every function that takes an alignment calls :func:`check_alignment`, which
    compares them with its own launch on the host, without reading a device value: the
    kernel trusts the alignment blindly (another block_m reads out of bounds, other ids give
    wrong rows). Holding ``topk_ids`` keeps their memory from being reused by other ids.
    """

    def __new__(cls, tensors, *, block_m: int, num_experts: int, topk_ids: torch.Tensor):
        self = super().__new__(cls, tensors)
        self.block_m, self.num_experts, self.num_pairs = block_m, num_experts, topk_ids.numel()
        self.topk_ids = topk_ids
        self._ids_version = _version(topk_ids)
        return self


def _version(t: torch.Tensor) -> int | None:
    """Torch's in-place write counter of ``t`` (shared with its views); inference tensors have none."""
    return None if t.is_inference() else t._version


def _same_ids(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same memory read the same way: what the kernel sees is then the same ids."""
    return (a.device == b.device and a.dtype == b.dtype and a.shape == b.shape and a.stride() == b.stride()
            and a.data_ptr() == b.data_ptr())


def check_alignment(alignment, *, block_m: int, num_pairs: int, num_experts: int,
                    device: torch.device | None = None, topk_ids: torch.Tensor | None = None) -> None:
    """Refuse an alignment built for another launch: a TypeError if it is not an
    :class:`Alignment`, a ValueError naming what differs otherwise. Host-side only, no sync.

    Args:
        alignment: from :func:`align_block_size`.
        block_m, num_pairs, num_experts: the launch's ``config.block_m``, ``M * topk`` and E.
        device: where the launch runs, if known.
        topk_ids: the ids of the launch, if it has them; the alignment must have been built
            from this very tensor, and it must not have been written since.
    """
    if not isinstance(alignment, Alignment):
        raise TypeError("alignment: expected the Alignment align_block_size returns (it records what it was "
                        f"built for), got {type(alignment).__name__}")
    for what, want, got in (("block_m", block_m, alignment.block_m), ("num_experts", num_experts,
                            alignment.num_experts), ("num_pairs (M * topk)", num_pairs, alignment.num_pairs)):
        if want != got:
            raise ValueError(f"alignment: expected one built for {what} = {want}, got one built for {what} = {got}")
    if device is not None and alignment[0].device != device:
        raise ValueError(f"alignment: expected one on {device}, got one on {alignment[0].device}")
    if topk_ids is not None:
        if not _same_ids(topk_ids, alignment.topk_ids):
            raise ValueError("alignment: expected one built from this topk_ids, got one built from another "
                             "tensor; align_block_size(topk_ids, block_m, E) with the ids you pass")
        if _version(topk_ids) != alignment._ids_version:
            raise ValueError("alignment: expected one built from topk_ids as they are now, got one built "
                             "before they were written in place; align them again")


def max_padded_rows(numel: int, block_m: int, num_experts: int) -> int:
    """An upper bound on ``num_tokens_post_padded`` known on the host without a sync.

    Each expert pads at most ``block_m - 1`` rows, and no expert needs more than one block
    per pair.
    """
    return min(numel + num_experts * (block_m - 1), numel * block_m)


def gather_sorted_rows(x: torch.Tensor, sorted_ids: torch.Tensor, num_pairs: int, topk: int) -> torch.Tensor:
    """``[len(sorted_ids), K]`` in x's dtype, from ``x [tokens, K]`` and ``sorted_ids`` int32
    (an alignment's first tensor): row ``i`` is x's row of the pair at sorted position ``i``, so
    a GEMM over sorted pairs reads whole tiles of it (through TMA, which cannot gather rows on
    Hopper). Padding positions, and the unwritten ones past ``num_tokens_post_padded``, take row
    0 or the last pair's: finite values whose outputs are never stored, and which the weight
    gradients multiply by the zero rows of the other operand."""
    return x.index_select(0, sorted_ids.clamp(0, num_pairs - 1) // topk)


@triton.jit
def _sorted_positions_kernel(sorted_ids_ptr, num_post_ptr, pos_ptr, num_rows, num_pairs, BLOCK: tl.constexpr):
    """``pos[sorted_ids[i]] = i`` for the real rows ``i`` of this program's BLOCK."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    used = (i < num_rows) & (i < tl.load(num_post_ptr))
    pair = tl.load(sorted_ids_ptr + i, mask=used, other=num_pairs)
    tl.store(pos_ptr + pair, i, mask=used & (pair >= 0) & (pair < num_pairs))


def sorted_positions(alignment, num_pairs: int) -> torch.Tensor:
    """Where each (token, slot) pair sits in sorted order: the alignment's first tensor inverted.

    Returns ``pos`` int32 ``[num_pairs]``: ``sorted_ids[pos[p]] == p``, and -1 for a pair the
    alignment dropped (an id outside ``[0, E)``). Two launches (the -1 fill, the scatter). With it
    a kernel that walks tokens can write each token's row straight to its ``topk`` sorted rows
    (Part 7's quantiser, :func:`moe_tutorial.kernels.fp8_quant.quantize_rows_sorted`).
    """
    sorted_ids, _, num_post = alignment
    pos = torch.full((num_pairs,), -1, dtype=torch.int32, device=sorted_ids.device)
    rows, block = sorted_ids.numel(), 1024
    if num_pairs and rows:
        _sorted_positions_kernel[(triton.cdiv(rows, block),)](sorted_ids, num_post, pos, rows, num_pairs, BLOCK=block)
    return pos


def check_align_inputs(topk_ids, block_m, num_experts) -> tuple[int, int, int]:
    """The checks of :func:`align_block_size`'s arguments (Part 8's stable alignment shares them):
    returns ``(block_m, num_experts, max_padded_rows)`` as ints, or raises naming the argument."""
    check_tensor("topk_ids", topk_ids, 2)
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_ids: expected dtype torch.int32 or torch.int64, got {topk_ids.dtype}")
    check_kernel_device("topk_ids", topk_ids)
    block_m, num_experts = as_int("block_m", block_m), as_int("num_experts", num_experts)   # numpy ints too
    if block_m < 1 or block_m & (block_m - 1) or block_m > MAX_BLOCK_M:
        raise ValueError(f"block_m: expected a power of two from 1 to {MAX_BLOCK_M}, got {block_m!r}")
    if not 1 <= num_experts <= MAX_EXPERTS:
        raise ValueError(f"num_experts: expected an int from 1 to {MAX_EXPERTS}, got {num_experts!r}")
    numel = topk_ids.numel()
    max_padded = max_padded_rows(numel, block_m, num_experts)
    if max_padded > MAX_ROWS:
        raise ValueError(f"topk_ids: expected at most {MAX_ROWS} padded rows (int32 row numbers), got "
                         f"{numel} pairs, up to {max_padded} rows with block_m = {block_m}")
    return block_m, num_experts, max_padded


def align_block_size(topk_ids: torch.Tensor, block_m: int, num_experts: int, *,
                     small_batch_pairs: int = SMALL_BATCH_PAIRS, stable: bool = False) -> Alignment:
    """Sort (token, slot) pairs by expert; pad each expert's run to a multiple of ``block_m``.

    Args:
        topk_ids: ``[M, topk]`` int32/int64 in ``[0, num_experts)``, on the kernels' device.
        block_m: rows per block, a power of two up to :data:`MAX_BLOCK_M`.
        num_experts: E, up to :data:`MAX_EXPERTS`.
        small_batch_pairs: up to this many pairs, one launch; 0 always takes the three launches
            (the benchmark times both to show what the one-launch path buys).
        stable: every run in token order, on every call (Part 8's
            :func:`moe_tutorial.kernels.stable_align.stable_align_block_size`): the third launch
            places each chunk's pairs by rank instead of with atomics.

    Returns:
        An :class:`Alignment`, the triple ``(sorted_token_ids, expert_ids, num_tokens_post_padded)``
        that also records what it was built for:
        - ``sorted_token_ids`` int32 ``[max_padded_rows]``: flat pair indices ``m * topk + j``
          grouped by expert; padding rows hold ``M * topk``; rows from
          ``num_tokens_post_padded`` on are unspecified.
        - ``expert_ids`` int32 ``[max_padded_rows // block_m]``: the expert of each block,
          -1 for blocks past ``num_tokens_post_padded``.
        - ``num_tokens_post_padded`` int32 ``[1]``: rows actually used, a device tensor.
        Ids outside ``[0, num_experts)`` are dropped (their pairs appear nowhere), int64 ids of
        2^31 and more included; checking them would cost a host sync, so callers validate
        (``check_matmul_inputs`` does).
        The order of pairs inside one expert's run is not specified (atomics on a GPU for
        more than SMALL_BATCH_PAIRS pairs; token order below that), unless ``stable``.
    """
    block_m, num_experts, max_padded = check_align_inputs(topk_ids, block_m, num_experts)
    numel = topk_ids.numel()
    ids = topk_ids.reshape(-1).contiguous()
    device = topk_ids.device
    if stable:      # every row defined, the unused ones as padding: two calls agree to the bit
        sorted_ids = torch.full((max_padded,), numel, dtype=torch.int32, device=device)
    else:
        sorted_ids = torch.empty(max_padded, dtype=torch.int32, device=device)
    expert_ids = torch.empty(triton.cdiv(max_padded, block_m), dtype=torch.int32, device=device)

    def result(num_post: torch.Tensor) -> Alignment:
        return Alignment((sorted_ids, expert_ids, num_post), block_m=block_m, num_experts=num_experts,
                         topk_ids=topk_ids)

    if numel == 0:
        return result(torch.zeros(1, dtype=torch.int32, device=device))
    num_post = torch.empty(1, dtype=torch.int32, device=device)    # a kernel writes it: no memset launch
    num_blocks = expert_ids.numel()
    if numel <= min(small_batch_pairs, SMALL_BATCH_PAIRS):
        # Sized to the batch: SMALL x SMALL tensors, about 16 elements per thread. Past 64 pairs
        # the three launches are faster (timings in measurements/gpu-notes.md, "decode alignment").
        small = max(16, triton.next_power_of_2(numel))
        _align_small_kernel[(1,)](
            ids, numel, sorted_ids, expert_ids, num_post, num_blocks,
            NUM_EXPERTS=num_experts, BLOCK_M=block_m, SMALL=small,
            num_warps=max(1, min(8, small * small // (32 * 16))),
        )
        return result(num_post)
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
    if stable:
        # Each chunk's first row in each run: the run's first row plus the pairs of earlier chunks.
        cursor = cursor + (torch.cumsum(partial, 0, dtype=torch.int32) - partial)
    grid = (num_chunks + triton.cdiv(num_blocks, label_chunk),)
    _scatter_and_label_kernel[grid](
        ids, numel, sorted_ids, cursor, ends, num_post, expert_ids, num_blocks, num_chunks,
        NUM_EXPERTS=num_experts, E_PAD=e_pad, BLOCK_M=block_m, CHUNK=chunk, LABEL_CHUNK=label_chunk,
        STABLE=stable,
    )
    return result(num_post)
