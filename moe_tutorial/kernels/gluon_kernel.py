"""Part 4, beyond ``tl``: a persistent, warp-specialised MoE GEMM written in Gluon (GPU only).

Triton's automatic warp specialisation makes no producer/consumer warps for Hopper (sm90) in
Triton 3.6 or 3.9 (``measurements/scripts/sm90_warp_specialize_probe.py``). Gluon
(``triton.experimental.gluon``) lets the kernel say it itself:

* a **load partition** of one warp only issues TMA copies: for each K step of each tile, it waits
  until a shared-memory buffer of the ring is *empty*, then asks the TMA engine to copy A's and
  B's tiles into it; the copy's completion marks the buffer *ready* (an mbarrier, a counter in
  shared memory that warps can wait on);
* the **default partition** (the kernel's ``num_warps`` warps) waits until a buffer is ready,
  issues the tensor cores' asynchronous warpgroup MMA on it, and marks the buffer before it
  empty once that MMA has finished; after the last K step it runs the epilogue (router weights,
  the store of each row to its pair) while the load warp already fills the ring for its next tile.
  Where C's rows lie in sorted order the tile can leave through a TMA copy instead
  (``config.tma_store``, :func:`copy_out`): the warps write it into shared memory and go on to the
  next tile's MMAs while the copy engine writes it.

The layer's gate/up GEMM (``GATED``) reads two B tiles per stage, the expert's gate rows and its
up rows (``I`` rows further on in ``w13``), against the same A tile, and keeps two accumulators.
Its MMA warps issue a step's two MMAs and wait until at most those two are in flight, so the
step before has finished and its buffer goes back to the load warp while the tensor cores work.
The epilogue writes ``silu(gate) * up`` in bf16 at the sorted rows, the down GEMM's A as it must
lie for TMA: :func:`gluon_layer` runs the layer on this kernel alone (a gather, two launches and
the sum over each token's slots). Part 8's training forward takes the gated form with ``SAVE_H``,
whose epilogue also keeps the gate and up tiles (H) at each pair's row for the backward.

Both partitions walk the same tiles in the same order: the persistent grid of
:mod:`moe_tutorial.kernels.persistent_kernel`, one program per SM, the tile list ending at the
real number of row blocks (read on the device). A must lie in sorted order (TMA cannot gather
rows on Hopper): the down GEMM's activations already do (sorted activations); for the first
GEMM :func:`gather_sorted_rows` copies x's rows into sorted order first.

Gluon does not run in Triton's CPU interpreter: on a laptop Part 4's ``tl`` kernel runs, and
the tests of this module skip there with that reason.
"""
from __future__ import annotations

import torch
import triton

from .. import runtime
from .align import gather_sorted_rows, sorted_positions
from .tma import stacked_rows
from .topk_sum import sorted_topk_sum, topk_sum

try:   # Gluon ships with Triton 3.4+; its Hopper module is what this kernel needs.
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor
    # Triton 3.7 renamed the TMA copies (3.9 removed the old names).
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    HAVE_GLUON = True
except ImportError:  # pragma: no cover  (older Triton)
    HAVE_GLUON = False

#: Why this kernel cannot run here, or None where it can.
UNAVAILABLE = (None if HAVE_GLUON and runtime.ON_GPU and torch.cuda.get_device_capability()[0] == 9
               else "the Gluon kernel needs a Hopper GPU (sm90) and Triton's Gluon; the interpreter cannot run it")


if HAVE_GLUON:
    @gluon.constexpr_function
    def mma_layout(BLOCK_M, BLOCK_N, num_warps, instr_k=16):
        """The accumulator's register layout for Hopper's warpgroup MMA: warps stacked along M
        (16 rows each) as far as BLOCK_M allows, the widest instruction N that divides BLOCK_N;
        ``instr_k`` is 32 bytes of K (16 for bf16, 32 for e4m3)."""
        BLOCK_M, BLOCK_N, num_warps, instr_k = (int(getattr(v, "value", v))
                                                for v in (BLOCK_M, BLOCK_N, num_warps, instr_k))
        warps = [4, 1]
        while warps[0] * warps[1] != num_warps:
            if BLOCK_M > 16 * warps[0]:
                warps[0] *= 2
            else:
                warps[1] *= 2
        n = 256
        while n > max(BLOCK_N // warps[1], 8) or BLOCK_N % n:
            n -= 8
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=warps, instr_shape=[16, n, instr_k])

    @gluon.jit
    def tile_of(t, num_pid_m, num_pid_n, group_m):
        """Part 4's grouped order (``sorted_kernel.grouped_tile``), in Gluon."""
        per_group = group_m * num_pid_n
        first_m = (t // per_group) * group_m
        rows = gl.minimum(num_pid_m - first_m, group_m)
        return first_m + (t % per_group) % rows, (t % per_group) // rows

    @gluon.constexpr_function
    def store_layout(bits, block_n, num_warps):
        """The layout a ``[rows, block_n]`` tile of ``bits``-bit elements is stored from: 16 consecutive
        bytes of one row a thread, a warp's threads side by side along its rows (two rows of 128 bf16,
        four of 128 e4m3), so that a store writes whole 32-byte sectors."""
        bits, block_n, num_warps = (int(getattr(v, "value", v)) for v in (bits, block_n, num_warps))
        per_thread = 128 // bits
        along = min(32, block_n // per_thread)
        return gl.BlockedLayout([1, per_thread], [32 // along, along], [num_warps, 1], [1, 0])

    @gluon.jit
    def weighted_rows(acc, first_row, router_w_ptr, sorted_ids_ptr, num_pairs, rows_layout: gl.constexpr):
        """``acc``'s rows (sorted rows ``first_row ..``) times their pairs' router weights; padding rows by 0."""
        BLOCK_M: gl.constexpr = acc.type.shape[0]
        pair = gl.load(sorted_ids_ptr + first_row + gl.arange(0, BLOCK_M, layout=rows_layout))
        return acc * gl.load(router_w_ptr + pair, mask=pair < num_pairs, other=0.0)[:, None]

    @gluon.jit
    def copy_out(tile, c_desc, c_bufs, buf, row, col):
        """[a TMA copy out] ``tile`` (registers) into shared-memory buffer ``buf`` of ``c_bufs`` in C's
        dtype, then one TMA copy of it to C at ``(row, col)``: the copy engine writes it while the
        warps go on. The buffers are used in turn (0, 1, .. then 0 again): before one is written,
        the copies of all but the last ``len(c_bufs) - 1`` are waited for, so the one that read it
        has finished. Whoever copies out waits for its last copies (``tma.store_wait(0)``) before
        the program ends."""
        tma.store_wait(c_bufs.type.shape[0] - 1)
        c_bufs.index(buf).store(tile.to(c_desc.dtype))
        fence_async_shared()         # the warps' writes to shared memory, seen by the copy engine
        tma_store(c_desc, [row, col], c_bufs.index(buf))

    @gluon.jit
    def tile_out(acc, first_row, pid_n, c_ptr, c_desc, c_bufs, buf, router_w_ptr, sorted_ids_ptr, N, num_pairs,
                 stride_cm, rows_layout: gl.constexpr, C_SORTED: gl.constexpr, ROUTER_WEIGHTS: gl.constexpr,
                 TMA_C: gl.constexpr):
        """[epilogue] The tile out as C's ``pid_n``-th block of ``acc``'s width, its rows times their
        router weights with ROUTER_WEIGHTS. With TMA_C (C sorted) through :func:`copy_out` from buffer
        ``buf`` of ``c_bufs``: the copy runs during the next tile's MMAs; padding rows are written too
        (they lie in C's sorted rows and nothing reads them), columns past C's width are clipped by
        the copy. Else through ``gl.store`` (:func:`store_rows`)."""
        if TMA_C:
            if ROUTER_WEIGHTS:
                acc = weighted_rows(acc, first_row, router_w_ptr, sorted_ids_ptr, num_pairs, rows_layout)
            copy_out(acc, c_desc, c_bufs, buf, first_row, pid_n * acc.type.shape[1])
        else:
            store_rows(acc, first_row, pid_n, c_ptr, router_w_ptr, sorted_ids_ptr, N, num_pairs, stride_cm,
                       rows_layout, C_SORTED, ROUTER_WEIGHTS)

    @gluon.jit
    def store_rows(acc, first_row, pid_n, c_ptr, router_w_ptr, sorted_ids_ptr, N, num_pairs, stride_cm,
                   rows_layout: gl.constexpr,
                   C_SORTED: gl.constexpr, ROUTER_WEIGHTS: gl.constexpr):
        """[epilogue] Each row of ``acc`` is one (token, slot) pair: its router weight, then its row of C
        (at the pair's row, or at its sorted position), padding rows and columns past N masked.

        The MMA's layout gives a thread two neighbouring columns of a row, so a warp's store would write
        4 bytes in each of 8 rows; the tile is first moved (through shared memory) into
        :func:`store_layout`, 16 bytes of one row a thread, and a warp writes whole rows."""
        BLOCK_M: gl.constexpr = acc.type.shape[0]
        BLOCK_N: gl.constexpr = acc.type.shape[1]
        if ROUTER_WEIGHTS:
            acc = weighted_rows(acc, first_row, router_w_ptr, sorted_ids_ptr, num_pairs, rows_layout)
        # [16 bytes of a row a thread]
        layout: gl.constexpr = store_layout(c_ptr.dtype.element_ty.primitive_bitwidth, BLOCK_N, gl.num_warps())
        c = gl.convert_layout(acc.to(c_ptr.dtype.element_ty), layout)
        offs_m = first_row + gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, layout))
        offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
        pair = gl.load(sorted_ids_ptr + offs_m)
        row_ok = pair < num_pairs
        if C_SORTED:
            c_row = offs_m.to(gl.int64)
        else:
            c_row = pair.to(gl.int64)
        gl.store(c_ptr + c_row[:, None] * stride_cm + offs_n[None, :], c, mask=row_ok[:, None] & (offs_n[None, :] < N))

    @gluon.jit
    def silu_mul(gate, up):
        """``silu(gate) * up``, the gated epilogues' activation, in the accumulators' fp32."""
        return gate / (1.0 + gl.exp(-gate)) * up

    @gluon.jit
    def ring_barriers(STAGES: gl.constexpr, EMPTY_ARRIVALS: gl.constexpr = 1):
        """The ring's two rows of mbarriers, ``(ready, empty)``, one of each per stage: a stage is
        *ready* when its TMA copies have landed (one arrival, the load warp's ``expect``) and *empty*
        once ``EMPTY_ARRIVALS`` consumers have released it."""
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=EMPTY_ARRIVALS)
        fence_async_shared()
        return ready, empty

    @gluon.jit
    def load_partition(a_desc, b_desc, a_bufs, b_bufs, bu_bufs, ready, empty, expert_ids_ptr, num_post_ptr,
                       N, K, b_rows_per_expert, up_rows, group_m, GATED: gl.constexpr, B_KN: gl.constexpr = False):
        """One warp: TMA copies of A's and B's tiles (with GATED, also the up rows' tile, ``up_rows``
        rows further on) into the ring, as fast as buffers free up. B's tiles are ``[BLOCK_N, BLOCK_K]``
        of weights stored ``[E, N, K]``, or with B_KN ``[BLOCK_K, BLOCK_N]`` of weights stored
        ``[E, K, N]`` (Part 8's backward reads W2 and W13 so)."""
        STAGES: gl.constexpr = a_bufs.type.shape[0]
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[1] if B_KN else b_desc.block_type.shape[0]
        nbytes: gl.constexpr = a_desc.block_type.nbytes + (2 if GATED else 1) * b_desc.block_type.nbytes
        num_pid_m = gl.cdiv(gl.load(num_post_ptr), BLOCK_M)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        step = 0
        for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
            pid_m, pid_n = tile_of(t, num_pid_m, num_pid_n, group_m)
            b_row = gl.load(expert_ids_ptr + pid_m) * b_rows_per_expert
            for k in range(0, gl.cdiv(K, BLOCK_K)):
                s = step % STAGES
                # Wait until the consumer has released this buffer (a fresh barrier counts as released).
                mbarrier.wait(empty.index(s), ((step // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(s), nbytes)
                tma_load(a_desc, [pid_m * BLOCK_M, k * BLOCK_K], ready.index(s), a_bufs.index(s))
                if B_KN:
                    tma_load(b_desc, [b_row + k * BLOCK_K, pid_n * BLOCK_N], ready.index(s), b_bufs.index(s))
                else:
                    tma_load(b_desc, [b_row + pid_n * BLOCK_N, k * BLOCK_K], ready.index(s), b_bufs.index(s))
                if GATED:
                    tma_load(b_desc, [b_row + pid_n * BLOCK_N + up_rows, k * BLOCK_K], ready.index(s),
                             bu_bufs.index(s))
                step += 1

    @gluon.jit
    def mma_partition(a_desc, b_desc, a_bufs, b_bufs, bu_bufs, ready, empty, num_post_ptr, N, K, group_m,
                      c_ptr, router_w_ptr, sorted_ids_ptr, num_pairs, stride_cm, h_ptr, stride_hm, c_desc, c_bufs,
                      GATED: gl.constexpr, C_SORTED: gl.constexpr, ROUTER_WEIGHTS: gl.constexpr,
                      SAVE_H: gl.constexpr = False, TMA_C: gl.constexpr = False):
        """The kernel's warps: MMAs on each ready buffer (with GATED, a gate and an up MMA), then the
        epilogue of each tile (with GATED, ``silu(gate) * up``; with SAVE_H, the gate and up tiles
        themselves first, at each pair's row of ``h_ptr``, as Part 8's forward keeps them). With TMA_C
        C's tile (at the sorted rows) leaves through a TMA copy (:func:`tile_out`)."""
        STAGES: gl.constexpr = a_bufs.type.shape[0]
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        # One MMA instruction covers 32 bytes of K: 16 bf16 values, 32 e4m3 ones.
        layout: gl.constexpr = mma_layout(BLOCK_M, BLOCK_N, gl.num_warps(), 256 // a_desc.dtype.primitive_bitwidth)
        rows_layout: gl.constexpr = gl.SliceLayout(1, layout)
        num_pid_m = gl.cdiv(gl.load(num_post_ptr), BLOCK_M)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        step = 0
        for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
            pid_m, pid_n = tile_of(t, num_pid_m, num_pid_n, group_m)
            # Zeroed with no MMA in flight (the last tile's were waited for): ptxas would serialise
            # every wgmma of the kernel if an accumulator were written while its MMA runs.
            acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
            up = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)     # GATED only
            for k in range(0, gl.cdiv(K, BLOCK_K)):
                s = step % STAGES
                mbarrier.wait(ready.index(s), (step // STAGES) & 1)
                acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, is_async=True)
                # Keep this step's MMAs in flight: the step before has finished, so its buffer is free.
                if GATED:
                    up = warpgroup_mma(a_bufs.index(s), bu_bufs.index(s).permute((1, 0)), up, is_async=True)
                    acc, up = warpgroup_mma_wait(num_outstanding=2, deps=(acc, up))
                else:
                    acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES), pred=k > 0)
                step += 1
            if GATED:
                acc, up = warpgroup_mma_wait(num_outstanding=0, deps=(acc, up))
            else:
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES))

            if SAVE_H:      # H = [gate | up], one row per pair: what the training step's backward reads
                store_rows(acc, pid_m * BLOCK_M, pid_n, h_ptr, h_ptr, sorted_ids_ptr, N, num_pairs, stride_hm,
                           rows_layout, False, False)
                store_rows(up, pid_m * BLOCK_M, pid_n, h_ptr + N, h_ptr, sorted_ids_ptr, N, num_pairs, stride_hm,
                           rows_layout, False, False)
            if GATED:       # the last buffer is back with the load warp: it fills the ring meanwhile
                acc = silu_mul(acc, up)
            tile_out(acc, pid_m * BLOCK_M, pid_n, c_ptr, c_desc, c_bufs, 0, router_w_ptr, sorted_ids_ptr, N, num_pairs,
                     stride_cm, rows_layout, C_SORTED, ROUTER_WEIGHTS, TMA_C)
        if TMA_C:
            tma.store_wait(0)           # the last copy has read the buffer before the program ends

    @gluon.jit
    def gluon_moe_kernel(a_desc, b_desc, c_ptr, router_w_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_ptr,
                         N, K, num_pairs, b_rows_per_expert, up_rows, stride_cm, group_m, h_ptr, stride_hm, c_desc,
                         STAGES: gl.constexpr, GATED: gl.constexpr, C_SORTED: gl.constexpr,
                         ROUTER_WEIGHTS: gl.constexpr, SAVE_H: gl.constexpr, TMA_C: gl.constexpr):
        """C[pair] = A[sorted position] . B[expert]^T for every real tile; see the module docstring.

        With GATED, B holds gate rows then up rows (``up_rows`` further on) and C receives
        ``silu(gate) * up`` at the sorted rows; with SAVE_H too, ``h_ptr`` the gate and up tiles at
        each pair's row (``[gate | up]``, N columns each). With TMA_C C's tiles (sorted rows) leave
        through TMA copies, ``c_desc`` over C in tiles, from one shared-memory buffer."""
        a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
        b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
        if GATED:
            bu_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
        else:
            bu_bufs = b_bufs
        if TMA_C:
            c_bufs = gl.allocate_shared_memory(c_desc.dtype, [1] + c_desc.block_type.shape, c_desc.layout)
        else:
            c_bufs = a_bufs        # (not used)
        ready, empty = ring_barriers(STAGES)
        gl.warp_specialize([
            (mma_partition, (a_desc, b_desc, a_bufs, b_bufs, bu_bufs, ready, empty, num_post_ptr, N, K, group_m,
                             c_ptr, router_w_ptr, sorted_ids_ptr, num_pairs, stride_cm, h_ptr, stride_hm, c_desc,
                             c_bufs, GATED, C_SORTED, ROUTER_WEIGHTS, SAVE_H, TMA_C)),
            (load_partition, (a_desc, b_desc, a_bufs, b_bufs, bu_bufs, ready, empty, expert_ids_ptr, num_post_ptr,
                              N, K, b_rows_per_expert, up_rows, group_m, GATED)),
        ], [1], [40])


def sorted_rows(alignment, block_m: int) -> int:
    """How many rows the sorted operands hold: the alignment's bound, rounded up to whole tiles
    (so every TMA box lies inside, and the transposed scales' rows stay 16-byte aligned)."""
    return triton.cdiv(alignment[0].numel(), block_m) * block_m


#: The operand dtypes the kernel takes. e4m3 is FP8 with one scale per tensor, which the caller
#: applies to C: the tensor cores' own accumulation, no promotion (Part 7's block scales need one).
GLUON_DTYPES = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16,
                torch.float8_e4m3fn: gl.float8e4nv} if HAVE_GLUON else {}


def gluon_descriptor(t: torch.Tensor, block) -> GluonDescriptor:
    """A TMA descriptor over the 2-D ``t`` in ``block`` tiles, laid out in shared memory the way the
    warpgroup MMAs read them (the default NVMMA layout of ``t``'s dtype: a :data:`GLUON_DTYPES` one,
    or fp32 for scales). Every Gluon launcher of the package builds its descriptors here."""
    dtype = gl.float32 if t.dtype == torch.float32 else GLUON_DTYPES[t.dtype]
    return GluonDescriptor.from_tensor(t, list(block), gl.NVMMASharedLayout.get_default_for(list(block), dtype))


def launch_gluon_gemm(a_sorted: torch.Tensor, b: torch.Tensor, c: torch.Tensor, router_weights, alignment,
                      num_pairs: int, config, *, c_sorted: bool = False, gated: bool = False, h=None) -> None:
    """One launch of :func:`gluon_moe_kernel` on a Hopper GPU.

    ``a_sorted`` ``[max_padded, K]`` bf16/fp16 rows in sorted order (or e4m3, with ``b`` in e4m3: an FP8
    GEMM with one scale per tensor, left to the caller); ``b`` ``[E, N, K]`` contiguous
    experts; ``c`` ``[num_pairs, N]`` (or ``[max_padded, N]`` with ``c_sorted``); ``router_weights``
    ``[num_pairs]`` fp32 or None; ``alignment`` from ``align_block_size`` with ``config.block_m``.

    With ``gated`` the launch is the layer's gate/up GEMM: ``b`` is ``w13`` ``[E, 2I, K]`` (gate rows,
    then up rows), ``c`` ``[R, I]`` in a's dtype (``R`` at least ``max_padded``, e.g.
    :func:`sorted_rows`) receives ``silu(gate) * up`` at the sorted rows, padding rows and the rows
    past the real tiles left unwritten; no router weights. K a multiple of 8 (TMA's 16-byte rows).
    With ``h`` ``[num_pairs, 2I]`` (unit column stride, gated only) the epilogue also writes the gate and
    up tiles before the activation there, at each pair's row: Part 8's forward, which keeps H.
    With ``config.tma_store`` C (sorted: ``c_sorted`` or ``gated``) leaves through TMA copies, whole
    tiles of it: padding rows are written too (nothing reads them), the rows past the real tiles not.
    """
    if h is not None and not gated:
        raise ValueError("h: the gate and up tiles exist in the gated launch only; expected gated=True")
    if gated and (router_weights is not None or b.shape[1] != 2 * c.shape[1]):
        raise ValueError(f"gated: expected no router weights (the epilogue is silu(gate) * up) and b of 2 * "
                         f"{c.shape[1]} rows (gate, then up) for c of {c.shape[1]} columns, got "
                         f"router_weights={'a tensor' if router_weights is not None else None}, b {tuple(b.shape)}")
    if a_sorted.dtype != b.dtype:
        raise TypeError(f"a_sorted, b: expected one dtype, got {a_sorted.dtype} and {b.dtype}")
    if config.tma_store:
        check_tma_out(c, c_sorted or gated)
    if UNAVAILABLE:
        raise RuntimeError(UNAVAILABLE)
    if a_sorted.dtype not in GLUON_DTYPES:
        raise TypeError(f"a_sorted: expected one of {', '.join(map(str, GLUON_DTYPES))}, got {a_sorted.dtype}")
    sorted_ids, expert_ids, num_post = alignment
    rows, K = b.shape[1], b.shape[2]
    N = c.shape[1]
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    a_desc, b_desc = gluon_descriptor(a_sorted, [bm, bk]), gluon_descriptor(stacked_rows(b), [bn, bk])
    c_desc = gluon_descriptor(c, [bm, bn]) if config.tma_store else a_desc
    max_tiles = triton.cdiv(sorted_ids.numel(), bm) * triton.cdiv(N, bn)
    gluon_moe_kernel[(max(1, min(runtime.sm_count(), max_tiles)),)](
        a_desc, b_desc, c, router_weights if router_weights is not None else c, sorted_ids, expert_ids, num_post,
        N, K, num_pairs, rows, N if gated else 0, c.stride(0), config.group_m, h if h is not None else c,
        h.stride(0) if h is not None else 0, c_desc, STAGES=config.num_stages, GATED=gated,
        C_SORTED=c_sorted or gated, ROUTER_WEIGHTS=router_weights is not None, SAVE_H=h is not None,
        TMA_C=config.tma_store, num_warps=config.num_warps)


def check_tma_out(c: torch.Tensor, sorted_out: bool) -> None:
    """What a TMA copy out (``config.tma_store``) needs of C: its rows in sorted order (a copy writes a
    tile's rows as they lie; rows to their pairs would be a scatter, which Hopper's TMA cannot do),
    unit column stride and 16-byte aligned rows."""
    if not sorted_out:
        raise ValueError("config.tma_store: a TMA copy writes a tile's rows as they lie, so C must be in sorted "
                         "order (c_sorted=True, or the gate/up GEMM's output); got C with one row per pair")
    if c.stride(1) != 1 or (c.stride(0) * c.element_size()) % 16 or c.data_ptr() % 16:
        raise ValueError(f"c: a TMA copy needs unit column stride and 16-byte aligned rows, got strides "
                         f"{tuple(c.stride())} of {c.element_size()}-byte elements")


def gluon_gate_up(x: torch.Tensor, w13: torch.Tensor, alignment, topk: int, cfg_up, h=None) -> torch.Tensor:
    """The bf16 layer's first half on the Gluon kernel: x's rows gathered into sorted order (one
    launch), then the gate/up GEMM with ``silu(gate) * up`` in its epilogue (one): the sorted
    activations ``[sorted_rows(alignment, cfg_up.block_m), I]`` in x's dtype, as a down GEMM on
    sorted rows reads them. Arguments as :func:`gluon_layer`'s; with ``h`` ``[M * topk, 2I]`` the
    epilogue also keeps H there, one row per pair (Part 8's forward)."""
    if UNAVAILABLE:
        raise RuntimeError(UNAVAILABLE)
    num_pairs = x.shape[0] * topk
    a = gather_sorted_rows(x, alignment[0], num_pairs, topk)
    act = x.new_empty(sorted_rows(alignment, cfg_up.block_m), w13.shape[1] // 2)
    launch_gluon_gemm(a, w13, act, None, alignment, num_pairs, cfg_up, gated=True, h=h)
    return act


def gluon_layer(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor, alignment,
                topk: int, cfg_up, cfg_down) -> torch.Tensor:
    """The bf16 layer on the Gluon kernel, inputs checked by the caller.

    :func:`gluon_gate_up` (x's rows gathered into sorted order, then the gate/up GEMM with
    ``silu(gate) * up`` in its epilogue into the sorted activations ``[R, I]``), the down GEMM on
    them as they lie, router weights in its epilogue, into ``[M * topk, K]`` (one launch), the sum
    over each token's topk rows (one). With ``cfg_down.tma_store`` the down GEMM leaves its rows in
    sorted order (TMA copies) and the sum gathers them through their positions (two launches more).

    Args:
        x: ``[M, K]`` bf16/fp16; ``w13`` ``[E, 2I, K]`` and ``w2`` ``[E, K, I]`` contiguous, x's dtype;
            K and I multiples of 8 (TMA reads 16-byte rows).
        topk_weights: ``[M, topk]`` float router weights.
        alignment: ``align_block_size(topk_ids, cfg_up.block_m, E)``, shared by both GEMMs.
        cfg_up, cfg_down: the two GEMMs' :class:`~moe_tutorial.kernels.configs.KernelConfig`, one ``block_m``.

    Returns ``[M, K]`` in x's dtype. Off Hopper: RuntimeError(:data:`UNAVAILABLE`).
    """
    if cfg_up.block_m != cfg_down.block_m:
        raise ValueError(f"configs: the two GEMMs share one alignment, so one block_m; got {cfg_up.block_m} "
                         f"and {cfg_down.block_m}")
    act = gluon_gate_up(x, w13, alignment, topk, cfg_up)
    router_weights = topk_weights.reshape(-1).float().contiguous()
    return down_then_sum(x, act.shape[0], topk, alignment, cfg_down.tma_store, lambda down, c_sorted: launch_gluon_gemm(
        act, w2, down, router_weights, alignment, x.shape[0] * topk, cfg_down, c_sorted=c_sorted))


def down_then_sum(x: torch.Tensor, rows: int, topk: int, alignment, sorted_out: bool, launch, positions=None):
    """The Gluon layers' last two steps: ``launch(down, c_sorted)`` runs the down GEMM into ``down``, then
    each token's sum over its topk rows, ``[M, K]`` in x's dtype. With ``sorted_out`` (its tiles copied out
    through TMA) ``down`` is ``[rows, K]`` in sorted order and the sum gathers each pair's row through
    ``positions`` (:func:`~moe_tutorial.kernels.align.sorted_positions`, computed here if not given);
    else ``down`` is ``[M * topk, K]``, one row per pair."""
    M, K = x.shape
    if sorted_out:
        down = x.new_empty(rows, K)
        launch(down, True)
        positions = sorted_positions(alignment, M * topk) if positions is None else positions
        return sorted_topk_sum(down, positions.view(M, topk))
    down = x.new_empty(M * topk, K)
    launch(down, False)
    return topk_sum(down.view(M, topk, K))
