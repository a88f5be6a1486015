"""Part 7, the promotion off the tensor cores' critical path: a block-FP8 MoE GEMM in Gluon (Hopper only).

Part 7's ``tl`` kernel (:mod:`moe_tutorial.kernels.fp8_kernel`) promotes each 128-wide K step
with ``acc += tl.dot(a, w) * scales``. The product is used inside the loop, so Triton's Hopper
pipeliner waits for each step's warpgroup MMA (``wgmma.wait_group 0``) before the CUDA cores
scale it, and the tensor cores sit idle while they do. This kernel says the schedule itself:

* a **load warp** (one warp, few registers) copies, for every K step of every tile, A's
  ``[BLOCK_M, 128]`` e4m3 tile, the ``BLOCK_M`` activation scales of that step and B's
  ``[BLOCK_N, 128]`` e4m3 tile into a ring of shared-memory stages with TMA, as fast as the
  consumers free the stages (``ready``/``empty`` mbarriers);
* the **MMA warps** (two warpgroups, 64 rows each) issue step k+1's MMA into a fresh raw
  accumulator *before* they promote step k's raw product into the fp32 accumulator:
  ``warpgroup_mma(..., is_async=True)`` then ``warpgroup_mma_wait(num_outstanding=1)`` leaves
  step k+1 on the tensor cores while the CUDA cores scale step k. Three register accumulators
  (the sum and two raw products in flight) are what this costs.

A is read in sorted order, because Hopper's TMA cannot gather rows: in the layer the quantiser
writes each token's e4m3 row at its pairs' sorted positions
(:func:`~moe_tutorial.kernels.fp8_quant.quantize_rows_sorted`), and for the first GEMM alone, whose
input comes quantised, :func:`gather_sorted_fp8` copies them there; both write the scales
transposed (``[K / 128, rows]``), so that one TMA copy brings a step's ``BLOCK_M`` scales. The
grid is persistent (one program per SM walks the real tiles in Part 4's grouped order, read on
the device), and the weight block scales (one per 128 x 128 block, so one per tile and step
for BLOCK_N = 128) are read by the MMA warps two steps ahead.

Each tile leaves through ``gl.store`` in whole rows (:func:`~moe_tutorial.kernels.gluon_kernel.store_rows`),
the MMA warps waiting while they issue the stores. With ``config.tma_store`` (the layer's choice:
:func:`~moe_tutorial.kernels.configs.copied_out`; measured by ``measurements/scripts/tma_store_layer.py``)
they write the tile into shared memory and hand it to a TMA copy instead, which writes it while they
start the next tile's MMAs. A copy writes a box of rows as they lie, so C must be in sorted order: the gate/up
GEMM's output is; the layer's down GEMM then leaves its rows sorted too, and the sum over each
token's rows gathers them (:func:`~moe_tutorial.kernels.topk_sum.sorted_topk_sum`).

Gluon does not run in Triton's CPU interpreter: on a laptop Part 7's ``tl`` kernel runs, and the
source of this one is there to read (notebook 07).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import runtime
from ..quant import BLOCK, FP8_DTYPE
from .align import sorted_positions
from .fp8_quant import (
    E4M3_MAX_C,
    MIN_AMAX_C,
    launch_quantize_rows,
    quantize_group,
    quantize_rows_sorted,
    silu_mul_quantize,
)
from .gluon_kernel import HAVE_GLUON, check_tma_out, down_then_sum, gluon_descriptor, sorted_rows
from .tma import stacked_rows
from .yield_edit import edit_compiled_forms, stop_editing

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    #: cp.async into shared memory: ``async_load`` from Triton 3.9, ``async_copy_global_to_shared`` before.
    async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
    #: all the partition's warps meet: ``barrier`` from Triton 3.9, ``thread_barrier`` before.
    warps_meet = getattr(gl, "barrier", None) or gl.thread_barrier

    from .gluon_kernel import mma_layout, ring_barriers, silu_mul, store_rows, tile_of, tile_out, tma_load

#: Why the Gluon FP8 kernel cannot run here, or None where it can.
UNAVAILABLE = (None if HAVE_GLUON and runtime.ON_GPU and torch.cuda.get_device_capability()[0] == 9
               else "the Gluon FP8 kernel needs a Hopper GPU (sm90) and Triton's Gluon; the interpreter cannot run it")
#: The rescaled forms' runs of multiplies (the rescale, 64 a warp and accumulator each K step) let a warp
#: yield every other multiply that keeps an operand for reuse: ``yield_edit.edit_compiled_forms`` edits
#: them after ptxas. Same bits out; measured in ``data/h100_fp8_yield.csv``.
YIELD_RESCALED = True
#: The gate/up GEMM's rescaled split form reading x's rows by index (cp.async, x quantised once)
#: instead of a sorted e4m3 copy through TMA (each token's row written once per expert it goes to).
#: Taken where an expert's intermediate size I is at most this: measured on an H100
#: (``data/h100_fp8_gather.csv``, notebook 07's Appendix A) the layer gained on Qwen3-30B-A3B
#: (I = 768) at every M where it applies and lost on DeepSeek-V3 and Kimi-K2 (I = 2048). The copy it saves
#: shrinks against the GEMM as I grows, while the gathering load warps' instructions (the copies and
#: their addresses) take issue slots from the MMA warps' rescaling all along.
GATHER_MAX_INTER = 768
#: Overrides the choice for experiments: True or False for every split-form launch, None by
#: :data:`GATHER_MAX_INTER`.
GATHER_A = None
#: The gathering load partition's warps (4 or 1) and, by warps, the registers a thread gets: a tile's
#: 128 row offsets are held 8 a thread in four warps, 32 in one. Both compile for sm90 without spills
#: at these counts; one warp at 120 takes registers the MMA warps need (they spill, and ptxas
#: serialises their MMAs). One warp made the layer slower than four in every case timed (the same data).
GATHER_WARPS = 4
GATHER_REGS = {1: 104, 4: 56}
#: The load warps hold the rows' offsets in 32 bits: x must have fewer elements than this.
GATHER_MAX_ELEMENTS = 2 ** 31


# ------------------------------------------------------------------ A in sorted order (plain Triton)

@triton.jit
def gather_sorted_fp8_kernel(x_ptr, xs_ptr, a_ptr, as_ptr, sorted_ids_ptr, num_post_ptr, num_sorted, num_pairs, topk,
                             K, stride_xm, stride_xsm, stride_am, stride_ask,
                             ROWS: tl.constexpr, GROUP: tl.constexpr):
    """Rows ``ROWS`` sorted positions from ``program_id(0) * ROWS``, K group ``program_id(1)``:
    ``a[i] = x[pair(i) // topk]`` (e4m3) and ``a_scale_t[g, i] = x_scale[pair(i) // topk, g]``."""
    first = tl.program_id(0) * ROWS
    if first < tl.load(num_post_ptr):                # past the real end nothing will read the rows
        rows = first + tl.arange(0, ROWS)
        pair = tl.load(sorted_ids_ptr + rows, mask=rows < num_sorted, other=num_pairs)
        # Padding rows carry the sentinel num_pairs: any real row will do, its output is never stored.
        src = (tl.minimum(tl.maximum(pair, 0), num_pairs - 1) // topk).to(tl.int64)
        g = tl.program_id(1)
        cols = g * GROUP + tl.arange(0, GROUP)
        # The last program's rows may run past the sorted rows (R need not be a multiple of ROWS).
        in_rows = rows < num_sorted
        ok = in_rows[:, None] & (cols[None, :] < K)
        q = tl.load(x_ptr + src[:, None] * stride_xm + cols[None, :], mask=ok)
        tl.store(a_ptr + rows.to(tl.int64)[:, None] * stride_am + cols[None, :], q, mask=ok)
        tl.store(as_ptr + g * stride_ask + rows, tl.load(xs_ptr + src * stride_xsm + g), mask=in_rows)


def gather_sorted_fp8(x_q: torch.Tensor, x_scale: torch.Tensor, alignment, num_pairs: int, topk: int,
                      block_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """x's e4m3 rows and scales in sorted order, one launch.

    Args:
        x_q, x_scale: ``[M, K]`` e4m3 and ``[M, ceil(K/128)]`` fp32 (any row stride, unit column stride).
        alignment: ``align_block_size(topk_ids, block_m, E)``; ``num_pairs = M * topk``.

    Returns:
        ``(a [R, K] e4m3, a_scale_t [ceil(K/128), R] fp32)`` with ``R = sorted_rows(alignment, block_m)``;
        rows past the alignment's real end are left unwritten (no tile reads them).
    """
    sorted_ids, _, num_post = alignment
    K = x_q.shape[1]
    R = sorted_rows(alignment, block_m)
    a = torch.empty(R, K, dtype=FP8_DTYPE, device=x_q.device)
    a_scale_t = torch.empty(triton.cdiv(K, BLOCK), R, dtype=torch.float32, device=x_q.device)
    rows = 32
    gather_sorted_fp8_kernel[(triton.cdiv(R, rows), triton.cdiv(K, BLOCK))](
        x_q, x_scale, a, a_scale_t, sorted_ids, num_post, sorted_ids.numel(), num_pairs, topk, K,
        x_q.stride(0), x_scale.stride(0), a.stride(0), a_scale_t.stride(0), ROWS=rows, GROUP=BLOCK, num_warps=4)
    return a, a_scale_t


# ------------------------------------------------------------------ the Gluon kernel

if HAVE_GLUON:
    @gluon.jit
    def fp8_load_partition(a_desc, as_desc, b_desc, a_bufs, as_bufs, b_bufs, bu_bufs, ready, empty,
                           expert_ids_ptr, num_post_ptr, N, K, b_rows_per_expert, second_rows, group_m,
                           TWO_B: gl.constexpr, TILE_N: gl.constexpr):
        """One warp: for each K step of each tile (``TILE_N`` output columns), A's tile, its row scales
        and B's tile into a free stage; with TWO_B also a second B tile ``second_rows`` rows further on
        (the up rows of a gated tile, or the right half of a 256-wide one)."""
        STAGES: gl.constexpr = a_bufs.type.shape[0]
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
        num_pid_m = gl.cdiv(gl.load(num_post_ptr), BLOCK_M)
        num_pid_n = gl.cdiv(N, TILE_N)
        nbytes: gl.constexpr = (a_desc.block_type.nbytes + as_desc.block_type.nbytes
                                + (2 if TWO_B else 1) * b_desc.block_type.nbytes)
        step = 0
        for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
            pid_m, pid_n = tile_of(t, num_pid_m, num_pid_n, group_m)
            b_row = gl.load(expert_ids_ptr + pid_m) * b_rows_per_expert + pid_n * TILE_N
            for k in range(0, gl.cdiv(K, BLOCK_K)):
                s = step % STAGES
                # A fresh barrier counts as released: the first lap waits on the opposite phase.
                mbarrier.wait(empty.index(s), ((step // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(s), nbytes)
                tma_load(a_desc, [pid_m * BLOCK_M, k * BLOCK_K], ready.index(s),
                                                a_bufs.index(s))
                tma_load(as_desc, [k, pid_m * BLOCK_M], ready.index(s), as_bufs.index(s))
                tma_load(b_desc, [b_row, k * BLOCK_K], ready.index(s), b_bufs.index(s))
                if TWO_B:
                    tma_load(b_desc, [b_row + second_rows, k * BLOCK_K], ready.index(s),
                                                    bu_bufs.index(s))
                step += 1

    @gluon.jit
    def gather_offsets(sorted_ids_ptr, first_row, num_pairs, topk, stride, ROWS: gl.constexpr,
                       layout: gl.constexpr):
        """Once a tile: where each of its ``ROWS`` sorted rows starts in x (or in x's scales), in
        elements, and whether the row is real. Sorted row r reads token ``sorted_ids[r] // topk``; a
        padding row reads nothing (zeros)."""
        pair = gl.load(sorted_ids_ptr + first_row + gl.arange(0, ROWS, layout=layout))
        ok = pair < num_pairs
        return gl.where(ok, pair // topk, 0) * stride, ok

    @gluon.jit
    def fp8_gather_load_partition(a_bufs, as_bufs, b_desc, b_bufs, bu_bufs, ready, empty, x_ptr, xs_ptr,
                                  sorted_ids_ptr, expert_ids_ptr, num_post_ptr, N, K, num_pairs, topk, stride_xm,
                                  stride_xsm, b_rows_per_expert, second_rows, group_m, TWO_B: gl.constexpr,
                                  TILE_N: gl.constexpr):
        """:func:`fp8_load_partition` with A and its row scales read from x's rows *by index*
        (cp.async, 16 bytes a thread) instead of from a sorted copy through TMA; B still through TMA.
        The rows' offsets are loaded once a tile, not once a K step: a load of ``sorted_ids`` in
        every step put its latency in front of every stage. A stage is ready once both have landed:
        every thread's cp.async arrive (which first adds itself to the barrier's count) is made,
        and the partition's warps meet, before the TMA's expected bytes, so that the phase cannot
        complete on B alone."""
        STAGES: gl.constexpr = a_bufs.type.shape[0]
        BLOCK_M: gl.constexpr = a_bufs.type.shape[1]
        BLOCK_K: gl.constexpr = a_bufs.type.shape[2]
        W: gl.constexpr = gl.num_warps()
        rows_l: gl.constexpr = gl.BlockedLayout([1, 16], [32 * 16 // BLOCK_K, BLOCK_K // 16], [W, 1], [1, 0])
        scale_l: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, W], [1, 0])
        cols = gl.arange(0, BLOCK_K, layout=gl.SliceLayout(0, rows_l))
        num_pid_m = gl.cdiv(gl.load(num_post_ptr), BLOCK_M)
        num_pid_n = gl.cdiv(N, TILE_N)
        nbytes: gl.constexpr = (2 if TWO_B else 1) * b_desc.block_type.nbytes
        step = 0
        for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
            pid_m, pid_n = tile_of(t, num_pid_m, num_pid_n, group_m)
            b_row = gl.load(expert_ids_ptr + pid_m) * b_rows_per_expert + pid_n * TILE_N
            a_off, a_ok = gather_offsets(sorted_ids_ptr, pid_m * BLOCK_M, num_pairs, topk, stride_xm, BLOCK_M,
                                         gl.SliceLayout(1, rows_l))
            s_off, s_ok = gather_offsets(sorted_ids_ptr, pid_m * BLOCK_M, num_pairs, topk, stride_xsm, BLOCK_M,
                                         gl.SliceLayout(0, scale_l))
            # [each K step: A by index, then B]
            for k in range(0, gl.cdiv(K, BLOCK_K)):
                s = step % STAGES
                kk = k * BLOCK_K + cols
                mbarrier.wait(empty.index(s), ((step // STAGES) & 1) ^ 1)
                async_load(a_bufs.index(s), x_ptr + a_off[:, None] + kk[None, :], a_ok[:, None] & (kk < K)[None, :])
                async_load(as_bufs.index(s), (xs_ptr + s_off + k)[None, :], s_ok[None, :])
                async_copy.mbarrier_arrive(ready.index(s))
                warps_meet()
                mbarrier.expect(ready.index(s), nbytes)
                tma_load(b_desc, [b_row, k * BLOCK_K], ready.index(s), b_bufs.index(s))
                if TWO_B:
                    tma_load(b_desc, [b_row + second_rows, k * BLOCK_K], ready.index(s), bu_bufs.index(s))
                step += 1

    @gluon.jit
    def row_scales(as_bufs, s, rows_layout: gl.constexpr, ROW0: gl.constexpr = 0, ROWS: gl.constexpr = 0):
        """Stage ``s``'s activation scales, one per accumulator row, in registers: all ``BLOCK_M`` of
        the tile, or (``ROWS`` > 0) those of its rows ``ROW0 .. ROW0 + ROWS``."""
        n: gl.constexpr = ROWS if ROWS > 0 else as_bufs.type.shape[2]
        v = as_bufs.index(s).slice(ROW0, n, dim=1).load(gl.AutoLayout()).reshape((n,))
        return gl.set_auto_layout(v, rows_layout)

    @gluon.jit
    def settled(acc):
        """``acc`` itself, through an empty non-pure asm: LLVM may not move the promotion that made
        ``acc`` past the next MMA (which reuses the promoted product's registers), so no register
        is copied while an MMA runs."""
        return gl.inline_asm_elementwise("", "=r,0", [acc], dtype=gl.float32, is_pure=False, pack=1)

    @gluon.jit
    def issue_step(a_bufs, as_bufs, b_bufs, ready, spare, step, b_scale, rows_layout: gl.constexpr,
                   OVERLAP: gl.constexpr):
        """Wait for stage ``step``'s tiles, start their MMA into ``spare``'s registers (not added to:
        ``use_acc=False``), and form the step's scales from its row scales (in the stage) and its weight
        block's ``b_scale`` (loaded steps before): ``(raw product in flight, row scales, step + 1)``."""
        STAGES: gl.constexpr = a_bufs.type.shape[0]
        s = step % STAGES
        mbarrier.wait(ready.index(s), (step // STAGES) & 1)
        raw = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), spare, use_acc=False, is_async=True)
        # A tensor again; its MMA may still run. Without OVERLAP it has finished (the `tl` kernel's
        # schedule: the promotion that follows waits for nothing, but the tensor cores wait for it).
        raw = warpgroup_mma_wait(num_outstanding=1 if OVERLAP else 0, deps=(raw,))
        return raw, row_scales(as_bufs, s, rows_layout) * b_scale, step + 1

    @gluon.jit
    def weight_scale(bs_ptr, k, num_k, stride_bsk):
        """Step ``k``'s weight-block scale (0 past the last step): loaded two steps before it is used,
        so the MMA warps never wait on a global load between two MMAs."""
        return gl.load(bs_ptr + k * stride_bsk, mask=k < num_k, other=0.0)

    @gluon.jit
    def fp8_mma_partition(a_bufs, as_bufs, b_bufs, ready, empty, b_scale_ptr, c_ptr, router_w_ptr,
                          sorted_ids_ptr, expert_ids_ptr, num_post_ptr, N, K, num_pairs,
                          stride_bse, stride_bsn, stride_bsk, stride_cm, group_m, c_desc, c_bufs,
                          C_SORTED: gl.constexpr, ROUTER_WEIGHTS: gl.constexpr, OVERLAP: gl.constexpr,
                          TMA_C: gl.constexpr):
        """The MMA warps: step k+1 on the tensor cores while step k is promoted; then each tile's epilogue
        (with TMA_C through a TMA copy at the sorted rows: ``gluon_kernel.tile_out``)."""
        STAGES: gl.constexpr = a_bufs.type.shape[0]
        BLOCK_M: gl.constexpr = a_bufs.type.shape[1]
        BLOCK_K: gl.constexpr = a_bufs.type.shape[2]
        BLOCK_N: gl.constexpr = b_bufs.type.shape[1]
        layout: gl.constexpr = mma_layout(BLOCK_M, BLOCK_N, gl.num_warps(), 32)
        rows_layout: gl.constexpr = gl.SliceLayout(1, layout)
        num_pid_m = gl.cdiv(gl.load(num_post_ptr), BLOCK_M)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        num_k = gl.cdiv(K, BLOCK_K)
        # The two raw accumulators live across tiles, written only by MMAs: zeroing them while an
        # MMA runs would also make ptxas serialise (it counts that as writing an accumulator in flight).
        x = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
        y = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
        step = 0
        for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
            pid_m, pid_n = tile_of(t, num_pid_m, num_pid_n, group_m)
            expert = gl.load(expert_ids_ptr + pid_m).to(gl.int64)
            # One weight scale per 128 x 128 block: BLOCK_N = 128 columns share one per K step.
            bs_ptr = b_scale_ptr + expert * stride_bse + ((pid_n * BLOCK_N) // 128) * stride_bsn
            acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)

            # [issue step k+1, then promote step k]
            # x and y take turns; two steps a turn, so neither is ever copied while its MMA runs.
            b1, b2 = weight_scale(bs_ptr, 1, num_k, stride_bsk), weight_scale(bs_ptr, 2, num_k, stride_bsk)
            x, scale_x, step = issue_step(a_bufs, as_bufs, b_bufs, ready, x, step, gl.load(bs_ptr), rows_layout,
                                          OVERLAP)
            for k in range(1, num_k - 1, 2):
                # b1, b2: the weight scales of steps k and k + 1; fetch those of k + 2 and k + 3 now.
                n1, n2 = weight_scale(bs_ptr, k + 2, num_k, stride_bsk), weight_scale(bs_ptr, k + 3, num_k, stride_bsk)
                y, scale_y, step = issue_step(a_bufs, as_bufs, b_bufs, ready, y, step, b1, rows_layout, OVERLAP)
                x, y = warpgroup_mma_wait(num_outstanding=1, deps=(x, y))      # step k-1 done, step k running
                mbarrier.arrive(empty.index((step + STAGES - 2) % STAGES))
                acc = settled(acc + x * scale_x[:, None])
                x, scale_x, step = issue_step(a_bufs, as_bufs, b_bufs, ready, x, step, b2, rows_layout, OVERLAP)
                y, x = warpgroup_mma_wait(num_outstanding=1, deps=(y, x))      # step k done, step k+1 running
                mbarrier.arrive(empty.index((step + STAGES - 2) % STAGES))
                acc = settled(acc + y * scale_y[:, None])
                b1, b2 = n1, n2
            # [the last steps]
            if num_k % 2 == 0:                       # one step left over: no overlap for the last one
                y, scale_y, step = issue_step(a_bufs, as_bufs, b_bufs, ready, y, step, b1, rows_layout, OVERLAP)
                x, y = warpgroup_mma_wait(num_outstanding=0, deps=(x, y))
                mbarrier.arrive(empty.index((step + STAGES - 2) % STAGES))
                acc = acc + x * scale_x[:, None] + y * scale_y[:, None]
            else:
                x = warpgroup_mma_wait(num_outstanding=0, deps=(x,))
                acc = acc + x * scale_x[:, None]
            mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES))

            # [epilogue]
            tile_out(acc, pid_m * BLOCK_M, pid_n, c_ptr, c_desc, c_bufs, 0, router_w_ptr, sorted_ids_ptr, N, num_pairs,
                     stride_cm, rows_layout, C_SORTED, ROUTER_WEIGHTS, TMA_C)
        if TMA_C:
            tma.store_wait(0)           # the last copies have read the buffers before the program ends

    @gluon.jit
    def fp8_two_wave_mma_partition(a_bufs, as_bufs, b_bufs, ready, empty, b_scale_ptr, c_ptr, router_w_ptr,
                                   sorted_ids_ptr, expert_ids_ptr, num_post_ptr, N, K, num_pairs,
                                   stride_bse, stride_bsn, stride_bsk, stride_cm, group_m,
                                   C_SORTED: gl.constexpr, ROUTER_WEIGHTS: gl.constexpr):
        """256-row tiles as two waves of 128 (each B tile feeds both): wave 0's MMA, its promotion,
        wave 1's, its promotion; one raw accumulator, so each promotion waits for its MMA."""
        STAGES: gl.constexpr = a_bufs.type.shape[0]
        BLOCK_M: gl.constexpr = a_bufs.type.shape[1]
        BLOCK_K: gl.constexpr = a_bufs.type.shape[2]
        BLOCK_N: gl.constexpr = b_bufs.type.shape[1]
        WAVE: gl.constexpr = BLOCK_M // 2
        layout: gl.constexpr = mma_layout(WAVE, BLOCK_N, gl.num_warps(), 32)
        rows_layout: gl.constexpr = gl.SliceLayout(1, layout)
        num_pid_m = gl.cdiv(gl.load(num_post_ptr), BLOCK_M)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        num_k = gl.cdiv(K, BLOCK_K)
        raw = gl.zeros((WAVE, BLOCK_N), dtype=gl.float32, layout=layout)
        step = 0
        for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
            pid_m, pid_n = tile_of(t, num_pid_m, num_pid_n, group_m)
            expert = gl.load(expert_ids_ptr + pid_m).to(gl.int64)
            bs_ptr = b_scale_ptr + expert * stride_bse + ((pid_n * BLOCK_N) // 128) * stride_bsn
            acc0 = gl.zeros((WAVE, BLOCK_N), dtype=gl.float32, layout=layout)
            acc1 = gl.zeros((WAVE, BLOCK_N), dtype=gl.float32, layout=layout)
            for k in range(0, num_k):
                s = step % STAGES
                mbarrier.wait(ready.index(s), (step // STAGES) & 1)
                b = b_bufs.index(s).permute((1, 0))
                b_s = gl.load(bs_ptr + k * stride_bsk)
                scales = as_bufs.index(s)
                raw = warpgroup_mma(a_bufs.index(s).slice(0, WAVE, dim=0), b, raw, use_acc=False, is_async=True)
                raw = warpgroup_mma_wait(num_outstanding=0, deps=(raw,))
                s0 = gl.set_auto_layout(scales.slice(0, WAVE, dim=1).load(gl.AutoLayout()).reshape((WAVE,)),
                                        rows_layout)
                acc0 = settled(acc0 + raw * (s0 * b_s)[:, None])
                raw = warpgroup_mma(a_bufs.index(s).slice(WAVE, WAVE, dim=0), b, raw, use_acc=False, is_async=True)
                raw = warpgroup_mma_wait(num_outstanding=0, deps=(raw,))
                s1 = gl.set_auto_layout(scales.slice(WAVE, WAVE, dim=1).load(gl.AutoLayout()).reshape((WAVE,)),
                                        rows_layout)
                acc1 = settled(acc1 + raw * (s1 * b_s)[:, None])
                mbarrier.arrive(empty.index(s))
                step += 1
            store_rows(acc0, pid_m * BLOCK_M, pid_n, c_ptr, router_w_ptr, sorted_ids_ptr, N, num_pairs, stride_cm,
                       rows_layout, C_SORTED, ROUTER_WEIGHTS)
            store_rows(acc1, pid_m * BLOCK_M + WAVE, pid_n, c_ptr, router_w_ptr, sorted_ids_ptr, N, num_pairs,
                       stride_cm, rows_layout, C_SORTED, ROUTER_WEIGHTS)

    @gluon.jit
    def issue_gated_step(a_bufs, as_bufs, b_bufs, bu_bufs, ready, g_spare, u_spare, step, bs_gate, bs_up,
                         rows_layout: gl.constexpr):
        """:func:`issue_step` for the gate/up GEMM: two MMAs on one A tile, the gate rows' and the up
        rows'; ``(gate product, up product, gate row scales, up row scales, step + 1)``."""
        STAGES: gl.constexpr = a_bufs.type.shape[0]
        s = step % STAGES
        mbarrier.wait(ready.index(s), (step // STAGES) & 1)
        g = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), g_spare, use_acc=False, is_async=True)
        u = warpgroup_mma(a_bufs.index(s), bu_bufs.index(s).permute((1, 0)), u_spare, use_acc=False,
                          is_async=True)
        g, u = warpgroup_mma_wait(num_outstanding=2, deps=(g, u))
        a_s = row_scales(as_bufs, s, rows_layout)
        return g, u, a_s * bs_gate, a_s * bs_up, step + 1

    @gluon.jit
    def fp8_gated_mma_partition(a_bufs, as_bufs, b_bufs, bu_bufs, ready, empty, b_scale_ptr, c_ptr, cs_ptr,
                                sorted_ids_ptr, expert_ids_ptr, num_post_ptr, N, K, num_pairs, up_scale_rows,
                                stride_bse, stride_bsn, stride_bsk, stride_cm, stride_csn, group_m, c_desc, c_bufs,
                                TMA_C: gl.constexpr):
        """The gate/up GEMM's MMA warps: gate and up products for the same rows and columns, each
        promoted one step behind; the epilogue forms ``silu(gate) * up`` and quantises it, per row and
        128 columns, into the down GEMM's e4m3 input (rows in sorted order, scales transposed)."""
        STAGES: gl.constexpr = a_bufs.type.shape[0]
        BLOCK_M: gl.constexpr = a_bufs.type.shape[1]
        BLOCK_K: gl.constexpr = a_bufs.type.shape[2]
        BLOCK_N: gl.constexpr = b_bufs.type.shape[1]
        layout: gl.constexpr = mma_layout(BLOCK_M, BLOCK_N, gl.num_warps(), 32)
        rows_layout: gl.constexpr = gl.SliceLayout(1, layout)
        cols_layout: gl.constexpr = gl.SliceLayout(0, layout)
        num_pid_m = gl.cdiv(gl.load(num_post_ptr), BLOCK_M)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        num_k = gl.cdiv(K, BLOCK_K)
        xg = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
        xu = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
        yg = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
        yu = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
        step = 0
        for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
            pid_m, pid_n = tile_of(t, num_pid_m, num_pid_n, group_m)
            expert = gl.load(expert_ids_ptr + pid_m).to(gl.int64)
            bs_ptr = b_scale_ptr + expert * stride_bse + ((pid_n * BLOCK_N) // 128) * stride_bsn
            bus_ptr = bs_ptr + up_scale_rows * stride_bsn
            acc_g = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
            acc_u = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
            g1, u1 = weight_scale(bs_ptr, 1, num_k, stride_bsk), weight_scale(bus_ptr, 1, num_k, stride_bsk)
            g2, u2 = weight_scale(bs_ptr, 2, num_k, stride_bsk), weight_scale(bus_ptr, 2, num_k, stride_bsk)
            xg, xu, sg_x, su_x, step = issue_gated_step(a_bufs, as_bufs, b_bufs, bu_bufs, ready, xg, xu, step,
                                                        gl.load(bs_ptr), gl.load(bus_ptr), rows_layout)
            for k in range(1, num_k - 1, 2):
                ng1 = weight_scale(bs_ptr, k + 2, num_k, stride_bsk)
                nu1 = weight_scale(bus_ptr, k + 2, num_k, stride_bsk)
                ng2 = weight_scale(bs_ptr, k + 3, num_k, stride_bsk)
                nu2 = weight_scale(bus_ptr, k + 3, num_k, stride_bsk)
                yg, yu, sg_y, su_y, step = issue_gated_step(a_bufs, as_bufs, b_bufs, bu_bufs, ready, yg, yu, step,
                                                            g1, u1, rows_layout)
                xg, xu, yg, yu = warpgroup_mma_wait(num_outstanding=2, deps=(xg, xu, yg, yu))
                mbarrier.arrive(empty.index((step + STAGES - 2) % STAGES))
                acc_g = settled(acc_g + xg * sg_x[:, None])
                acc_u = settled(acc_u + xu * su_x[:, None])
                xg, xu, sg_x, su_x, step = issue_gated_step(a_bufs, as_bufs, b_bufs, bu_bufs, ready, xg, xu, step,
                                                            g2, u2, rows_layout)
                yg, yu, xg, xu = warpgroup_mma_wait(num_outstanding=2, deps=(yg, yu, xg, xu))
                mbarrier.arrive(empty.index((step + STAGES - 2) % STAGES))
                acc_g = settled(acc_g + yg * sg_y[:, None])
                acc_u = settled(acc_u + yu * su_y[:, None])
                g1, u1, g2, u2 = ng1, nu1, ng2, nu2
            if num_k % 2 == 0:
                yg, yu, sg_y, su_y, step = issue_gated_step(a_bufs, as_bufs, b_bufs, bu_bufs, ready, yg, yu, step,
                                                            g1, u1, rows_layout)
                xg, xu, yg, yu = warpgroup_mma_wait(num_outstanding=0, deps=(xg, xu, yg, yu))
                mbarrier.arrive(empty.index((step + STAGES - 2) % STAGES))
                acc_g = acc_g + xg * sg_x[:, None] + yg * sg_y[:, None]
                acc_u = acc_u + xu * su_x[:, None] + yu * su_y[:, None]
            else:
                xg, xu = warpgroup_mma_wait(num_outstanding=0, deps=(xg, xu))
                acc_g = acc_g + xg * sg_x[:, None]
                acc_u = acc_u + xu * su_x[:, None]
            mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES))

            store_quantised(acc_g, acc_u, pid_m * BLOCK_M, pid_n, c_ptr, cs_ptr, sorted_ids_ptr, N, num_pairs,
                            stride_cm, stride_csn, c_desc, c_bufs, rows_layout, cols_layout, TMA_C)
        if TMA_C:
            tma.store_wait(0)

    @gluon.jit
    def store_quantised(acc_g, acc_u, first_row, pid_n, c_ptr, cs_ptr, sorted_ids_ptr, N, num_pairs, stride_cm,
                        stride_csn, c_desc, c_bufs, rows_layout: gl.constexpr, cols_layout: gl.constexpr,
                        TMA_C: gl.constexpr):
        """[quantising epilogue] ``silu(gate) * up``, then per row one scale for these 128 columns: the
        down GEMM's e4m3 input at the sorted rows, its scales transposed (``cs[pid_n, row]``). The
        scales are taken in the MMA's layout (a row's 128 columns lie in four threads); the tile, its
        values already e4m3's, then goes out through ``gluon_kernel.tile_out``: :func:`store_rows` (16
        columns a thread), or with TMA_C one TMA copy from its buffer ``c_bufs`` of one."""
        BLOCK_M: gl.constexpr = acc_g.type.shape[0]
        BLOCK_N: gl.constexpr = acc_g.type.shape[1]
        offs_m = first_row + gl.arange(0, BLOCK_M, layout=rows_layout)
        offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=cols_layout)
        row_ok = gl.load(sorted_ids_ptr + offs_m) < num_pairs
        h = gl.where((offs_n < N)[None, :], silu_mul(acc_g, acc_u), 0.0)
        q, scale = quantize_group(h, E4M3_MAX_C, MIN_AMAX_C)
        gl.store(cs_ptr + pid_n * stride_csn + offs_m.to(gl.int64), scale, mask=row_ok)
        tile_out(q, first_row, pid_n, c_ptr, c_desc, c_bufs, 0, c_ptr, sorted_ids_ptr, N, num_pairs, stride_cm,
                 rows_layout, True, False, TMA_C)

    @gluon.jit
    def rescale_by(acc, unit, new_unit):
        """``acc`` (a sum in units of ``unit``, per row) re-expressed in units of ``new_unit`` before
        the next MMA adds a product in those units: ``(acc * unit / new_unit, the unit it is now in)``.
        A step whose scale is 0 (a block of zeros) adds nothing true and keeps the unit; a NaN scale
        makes the row NaN, as the tl kernel's promotion does."""
        zero = new_unit == 0.0
        factor = gl.where(zero, 1.0, unit / new_unit)
        return settled(acc * factor[:, None]), gl.where(zero, unit, new_unit)

    @gluon.jit
    def fp8_rescaled_mma_partition(a_bufs, as_bufs, b_bufs, bu_bufs, ready, empty, b_scale_ptr, c_ptr, cs_ptr,
                                   router_w_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_ptr, N, K, num_pairs,
                                   second_scale_rows, stride_bse, stride_bsn, stride_bsk, stride_cm, stride_csn,
                                   group_m, c_desc, c_bufs, GATED: gl.constexpr, C_SORTED: gl.constexpr,
                                   ROUTER_WEIGHTS: gl.constexpr, ROW0: gl.constexpr, ROWS: gl.constexpr,
                                   TMA_C: gl.constexpr, GATHER_A: gl.constexpr = False):
        """The MMA warps with two accumulators of 128 columns (gate and up, or a 256-wide tile's two
        halves) and no raw product at all: before each K step's MMA adds into an accumulator, the
        accumulator is *rescaled in place* into that step's units (``acc * old scale / new scale``,
        per row), and one multiply by the last step's scales ends the tile. Two register tiles of 128
        columns instead of three per 128 columns: a tile 256 wide (or gate and up of 128 rows) fits,
        and a step brings a third more arithmetic per byte than a 128 x 128 tile. While half 1 is
        rescaled, half 0's MMA runs; half 0 is rescaled while the other warpgroup's MMAs run.

        The partition takes the tile's rows ``ROW0 .. ROW0 + ROWS``: all of them, or with SPLIT one
        warpgroup's 64, each warpgroup then a partition of its own that frees stages alone (no
        barrier of both warpgroups at every step, so one's MMAs can run while the other rescales)."""
        STAGES: gl.constexpr = a_bufs.type.shape[0]
        BLOCK_M: gl.constexpr = a_bufs.type.shape[1]
        BLOCK_K: gl.constexpr = a_bufs.type.shape[2]
        HALF: gl.constexpr = b_bufs.type.shape[1]
        TILE_N: gl.constexpr = HALF if GATED else 2 * HALF
        layout: gl.constexpr = mma_layout(ROWS, HALF, gl.num_warps(), 32)
        rows_layout: gl.constexpr = gl.SliceLayout(1, layout)
        cols_layout: gl.constexpr = gl.SliceLayout(0, layout)
        num_pid_m = gl.cdiv(gl.load(num_post_ptr), BLOCK_M)
        num_pid_n = gl.cdiv(N, TILE_N)
        num_k = gl.cdiv(K, BLOCK_K)
        step = 0
        for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
            pid_m, pid_n = tile_of(t, num_pid_m, num_pid_n, group_m)
            expert = gl.load(expert_ids_ptr + pid_m).to(gl.int64)
            bs0_ptr = b_scale_ptr + expert * stride_bse + ((pid_n * TILE_N) // 128) * stride_bsn
            bs1_ptr = bs0_ptr + second_scale_rows * stride_bsn
            # A 256-wide tile's right half may lie past N: its scales read as 0, its columns are not stored.
            num_k1 = num_k if GATED else num_k * (pid_n * TILE_N + HALF < N).to(gl.int32)
            acc0 = gl.zeros((ROWS, HALF), dtype=gl.float32, layout=layout)
            acc1 = gl.zeros((ROWS, HALF), dtype=gl.float32, layout=layout)

            # [step 0: both halves start]
            # Not added to (use_acc=False): the sums start in units of step 0's scales.
            w0, w1 = weight_scale(bs0_ptr, 0, num_k, stride_bsk), weight_scale(bs1_ptr, 0, num_k1, stride_bsk)
            n0 = weight_scale(bs0_ptr, 1, num_k, stride_bsk)        # step 1's weight scales, read a step early
            n1 = weight_scale(bs1_ptr, 1, num_k1, stride_bsk)
            s = step % STAGES
            mbarrier.wait(ready.index(s), (step // STAGES) & 1)
            if GATHER_A:            # A came by cp.async (the generic proxy); the MMA reads it through the async one
                fence_async_shared()
            a_s = row_scales(as_bufs, s, rows_layout, ROW0, ROWS)
            unit0, unit1 = a_s * w0, a_s * w1
            a = a_bufs.index(s).slice(ROW0, ROWS, dim=0)
            acc0 = warpgroup_mma(a, b_bufs.index(s).permute((1, 0)), acc0, use_acc=False, is_async=True)
            acc1 = warpgroup_mma(a, bu_bufs.index(s).permute((1, 0)), acc1, use_acc=False, is_async=True)
            step += 1
            # [steps 1 on: rescale, then add]
            # Both halves of step k-1 done, then half 1 is rescaled while half 0's MMA of step k
            # runs. (Rescaling half 0 while half 1's MMA still ran would be the full overlap,
            # but ptxas serialises every wgmma of a kernel that touches an accumulator between two
            # MMAs that add into it with any MMA in flight: it checks the chain, not which one waits.)
            for k in range(1, num_k):
                w0, w1 = n0, n1
                n0 = weight_scale(bs0_ptr, k + 1, num_k, stride_bsk)
                n1 = weight_scale(bs1_ptr, k + 1, num_k1, stride_bsk)
                s = step % STAGES
                mbarrier.wait(ready.index(s), (step // STAGES) & 1)
                if GATHER_A:
                    fence_async_shared()
                a_s = row_scales(as_bufs, s, rows_layout, ROW0, ROWS)
                acc0, acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1))
                mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES))    # step k-1's stage is read
                a = a_bufs.index(s).slice(ROW0, ROWS, dim=0)
                acc0, unit0 = rescale_by(acc0, unit0, a_s * w0)
                acc0 = warpgroup_mma(a, b_bufs.index(s).permute((1, 0)), acc0, is_async=True)
                acc1, unit1 = rescale_by(acc1, unit1, a_s * w1)
                acc1 = warpgroup_mma(a, bu_bufs.index(s).permute((1, 0)), acc1, is_async=True)
                step += 1
            acc0, acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1))
            mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES))
            acc0 = acc0 * unit0[:, None]
            acc1 = acc1 * unit1[:, None]

            # [epilogue]
            first_row = pid_m * BLOCK_M + ROW0
            if GATED:
                store_quantised(acc0, acc1, first_row, pid_n, c_ptr, cs_ptr, sorted_ids_ptr, N, num_pairs, stride_cm,
                                stride_csn, c_desc, c_bufs, rows_layout, cols_layout, TMA_C)
            else:                   # with TMA_C a buffer a half: half 0's copy runs while half 1 is written
                tile_out(acc0, first_row, 2 * pid_n, c_ptr, c_desc, c_bufs, 0, router_w_ptr, sorted_ids_ptr, N,
                         num_pairs, stride_cm, rows_layout, C_SORTED, ROUTER_WEIGHTS, TMA_C)
                tile_out(acc1, first_row, 2 * pid_n + 1, c_ptr, c_desc, c_bufs, 1, router_w_ptr, sorted_ids_ptr, N,
                         num_pairs, stride_cm, rows_layout, C_SORTED, ROUTER_WEIGHTS, TMA_C)
        if TMA_C:
            tma.store_wait(0)

    @gluon.jit
    def gluon_fp8_moe_kernel(a_desc, as_desc, b_desc, b_scale_ptr, c_ptr, cs_ptr, router_w_ptr, c_desc,
                             sorted_ids_ptr, expert_ids_ptr, num_post_ptr,
                             N, K, num_pairs, b_rows_per_expert, second_rows, second_scale_rows,
                             stride_bse, stride_bsn, stride_bsk, stride_cm, stride_csn, group_m,
                             x_ptr, xs_ptr, topk, stride_xm, stride_xsm,
                             STAGES: gl.constexpr, GATED: gl.constexpr, RESCALE: gl.constexpr,
                             SPLIT: gl.constexpr, TWO_B: gl.constexpr, TILE_N: gl.constexpr,
                             C_SORTED: gl.constexpr, ROUTER_WEIGHTS: gl.constexpr, OVERLAP: gl.constexpr,
                             TMA_C: gl.constexpr, GATHER_WARPS: gl.constexpr, GATHER_REGS: gl.constexpr):
        """C[pair] = (A[sorted position] . B[expert]^T) with block scales, for every real tile.

        With GATED, B holds gate rows then up rows (``second_rows`` further on, their scales
        ``second_scale_rows`` further on) and C receives ``silu(gate) * up`` in e4m3 at the sorted rows,
        one scale per row and 128 columns in ``cs`` (transposed: ``[N / 128, rows]``). With RESCALE
        the accumulators are rescaled in place (:func:`fp8_rescaled_mma_partition`); a plain tile is
        then two B tiles wide (``TILE_N`` = 256, the second ``second_rows`` = 128 rows on), and with
        SPLIT its two MMA warpgroups are two partitions of 4 warps (the kernel's ``num_warps`` is 4).

        With TMA_C (C at the sorted rows) the tiles go out through TMA copies, ``c_desc`` over C in
        boxes of one partition's rows by 128 columns: each partition has a shared-memory buffer per
        box it writes (two for a 256-wide tile), so a tile's copies run during the next tile's MMAs."""
        a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
        as_bufs = gl.allocate_shared_memory(as_desc.dtype, [STAGES] + as_desc.block_type.shape, as_desc.layout)
        b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
        if TWO_B:
            bu_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
        else:
            bu_bufs = b_bufs
        ready, empty = ring_barriers(STAGES, 2 if SPLIT else 1)     # each MMA partition frees a stage
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        HALF_M: gl.constexpr = BLOCK_M // 2
        FIRST: gl.constexpr = 0
        BOXES: gl.constexpr = 2 if RESCALE and not GATED else 1        # C's boxes a partition writes a tile
        if TMA_C:
            c0 = gl.allocate_shared_memory(c_desc.dtype, [BOXES] + c_desc.block_type.shape, c_desc.layout)
            if SPLIT:
                c1 = gl.allocate_shared_memory(c_desc.dtype, [BOXES] + c_desc.block_type.shape, c_desc.layout)
            else:
                c1 = c0
        else:
            c0 = a_bufs            # (not used)
            c1 = a_bufs
        # (each branch names the load partition in full: a constexpr passed inside a tuple stops being one)
        if GATHER_WARPS > 0:    # the rescaled split form with A read from x's rows by index
            gl.warp_specialize([
                (fp8_rescaled_mma_partition, (a_bufs, as_bufs, b_bufs, bu_bufs, ready, empty, b_scale_ptr, c_ptr,
                                              cs_ptr, router_w_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_ptr, N,
                                              K, num_pairs, second_scale_rows, stride_bse, stride_bsn, stride_bsk,
                                              stride_cm, stride_csn, group_m, c_desc, c0, GATED, C_SORTED,
                                              ROUTER_WEIGHTS, FIRST, HALF_M, TMA_C, True)),
                (fp8_rescaled_mma_partition, (a_bufs, as_bufs, b_bufs, bu_bufs, ready, empty, b_scale_ptr, c_ptr,
                                              cs_ptr, router_w_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_ptr, N,
                                              K, num_pairs, second_scale_rows, stride_bse, stride_bsn, stride_bsk,
                                              stride_cm, stride_csn, group_m, c_desc, c1, GATED, C_SORTED,
                                              ROUTER_WEIGHTS, HALF_M, HALF_M, TMA_C, True)),
                (fp8_gather_load_partition, (a_bufs, as_bufs, b_desc, b_bufs, bu_bufs, ready, empty, x_ptr, xs_ptr,
                                             sorted_ids_ptr, expert_ids_ptr, num_post_ptr, N, K, num_pairs, topk,
                                             stride_xm, stride_xsm, b_rows_per_expert, second_rows, group_m,
                                             TWO_B, TILE_N))], [4, GATHER_WARPS], [232, GATHER_REGS])
        elif RESCALE and SPLIT:
            gl.warp_specialize([
                (fp8_rescaled_mma_partition, (a_bufs, as_bufs, b_bufs, bu_bufs, ready, empty, b_scale_ptr, c_ptr,
                                              cs_ptr, router_w_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_ptr, N,
                                              K, num_pairs, second_scale_rows, stride_bse, stride_bsn, stride_bsk,
                                              stride_cm, stride_csn, group_m, c_desc, c0, GATED, C_SORTED,
                                              ROUTER_WEIGHTS, FIRST, HALF_M, TMA_C)),
                (fp8_rescaled_mma_partition, (a_bufs, as_bufs, b_bufs, bu_bufs, ready, empty, b_scale_ptr, c_ptr,
                                              cs_ptr, router_w_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_ptr, N,
                                              K, num_pairs, second_scale_rows, stride_bse, stride_bsn, stride_bsk,
                                              stride_cm, stride_csn, group_m, c_desc, c1, GATED, C_SORTED,
                                              ROUTER_WEIGHTS, HALF_M, HALF_M, TMA_C)),
                (fp8_load_partition, (a_desc, as_desc, b_desc, a_bufs, as_bufs, b_bufs, bu_bufs, ready, empty,
                                      expert_ids_ptr, num_post_ptr, N, K, b_rows_per_expert, second_rows, group_m,
                                      TWO_B, TILE_N))], [4, 1], [232, 40])
        elif RESCALE:
            gl.warp_specialize([
                (fp8_rescaled_mma_partition, (a_bufs, as_bufs, b_bufs, bu_bufs, ready, empty, b_scale_ptr, c_ptr,
                                              cs_ptr, router_w_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_ptr, N,
                                              K, num_pairs, second_scale_rows, stride_bse, stride_bsn, stride_bsk,
                                              stride_cm, stride_csn, group_m, c_desc, c0, GATED, C_SORTED,
                                              ROUTER_WEIGHTS, FIRST, BLOCK_M, TMA_C)),
                (fp8_load_partition, (a_desc, as_desc, b_desc, a_bufs, as_bufs, b_bufs, bu_bufs, ready, empty,
                                      expert_ids_ptr, num_post_ptr, N, K, b_rows_per_expert, second_rows, group_m,
                                      TWO_B, TILE_N))], [1], [40])
        elif GATED:
            gl.warp_specialize([
                (fp8_gated_mma_partition, (a_bufs, as_bufs, b_bufs, bu_bufs, ready, empty, b_scale_ptr, c_ptr, cs_ptr,
                                           sorted_ids_ptr, expert_ids_ptr, num_post_ptr, N, K, num_pairs,
                                           second_scale_rows, stride_bse, stride_bsn, stride_bsk, stride_cm,
                                           stride_csn, group_m, c_desc, c0, TMA_C)),
                (fp8_load_partition, (a_desc, as_desc, b_desc, a_bufs, as_bufs, b_bufs, bu_bufs, ready, empty,
                                      expert_ids_ptr, num_post_ptr, N, K, b_rows_per_expert, second_rows, group_m,
                                      TWO_B, TILE_N))], [1], [40])
        elif a_desc.block_type.shape[0] == 256:
            gl.warp_specialize([
                (fp8_two_wave_mma_partition, (a_bufs, as_bufs, b_bufs, ready, empty, b_scale_ptr, c_ptr, router_w_ptr,
                                              sorted_ids_ptr, expert_ids_ptr, num_post_ptr, N, K, num_pairs,
                                              stride_bse, stride_bsn, stride_bsk, stride_cm, group_m, C_SORTED,
                                              ROUTER_WEIGHTS)),
                (fp8_load_partition, (a_desc, as_desc, b_desc, a_bufs, as_bufs, b_bufs, bu_bufs, ready, empty,
                                      expert_ids_ptr, num_post_ptr, N, K, b_rows_per_expert, second_rows, group_m,
                                      TWO_B, TILE_N))], [1], [40])
        else:
            gl.warp_specialize([
                (fp8_mma_partition, (a_bufs, as_bufs, b_bufs, ready, empty, b_scale_ptr, c_ptr, router_w_ptr,
                                     sorted_ids_ptr, expert_ids_ptr, num_post_ptr, N, K, num_pairs,
                                     stride_bse, stride_bsn, stride_bsk, stride_cm, group_m, c_desc, c0, C_SORTED,
                                     ROUTER_WEIGHTS, OVERLAP, TMA_C)),
                (fp8_load_partition, (a_desc, as_desc, b_desc, a_bufs, as_bufs, b_bufs, bu_bufs, ready, empty,
                                      expert_ids_ptr, num_post_ptr, N, K, b_rows_per_expert, second_rows, group_m,
                                      TWO_B, TILE_N))], [1], [40])


def _descriptors(a: torch.Tensor, a_scale_t: torch.Tensor, b: torch.Tensor, block_m: int):
    """TMA descriptors: A ``[R, K]`` by ``[block_m, 128]``, its scales ``[K/128, R]`` by ``[1, block_m]``,
    B ``[E, rows, K]`` viewed as ``[E * rows, K]`` by ``[128, 128]`` (a 256-wide tile loads two)."""
    return (gluon_descriptor(a, [block_m, BLOCK]), gluon_descriptor(a_scale_t, [1, block_m]),
            gluon_descriptor(stacked_rows(b), [BLOCK, BLOCK]))


def split_form(config) -> bool:
    """Whether ``config`` is the rescaled split form: 128-row tiles whose two MMA warpgroups (4 warps
    each) hold 64 rows apiece."""
    return config.rescale and config.num_warps == 4 and config.block_m == 128


def gathers_a(cfg_up, x_elements: int, inter: int) -> bool:
    """Whether the layer's gate/up GEMM reads x's rows by index: only its rescaled split form can, x
    must have fewer than :data:`GATHER_MAX_ELEMENTS` elements, and then :data:`GATHER_A` if set, else
    whether ``inter`` (an expert's intermediate size I) is at most :data:`GATHER_MAX_INTER`."""
    if not split_form(cfg_up) or x_elements >= GATHER_MAX_ELEMENTS:
        return False
    return inter <= GATHER_MAX_INTER if GATHER_A is None else GATHER_A


def launch_gluon_fp8_gemm(a: torch.Tensor, a_scale_t: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
                          c: torch.Tensor, alignment, num_pairs: int, config, *, router_weights=None,
                          c_scale_t: torch.Tensor | None = None, c_sorted: bool = False,
                          overlap: bool = True, gather_scales: torch.Tensor | None = None, topk: int = 1) -> None:
    """One launch of :func:`gluon_fp8_moe_kernel` on a Hopper GPU, inputs checked by the caller.

    ``a`` ``[R, K]`` e4m3 rows in sorted order with ``a_scale_t`` ``[ceil(K/128), R]`` fp32
    (:func:`gather_sorted_fp8`, or the gate/up GEMM's output); ``b`` ``[E, N, K]`` e4m3 with
    ``b_scale`` ``[E, ceil(N/128), ceil(K/128)]``; ``c`` ``[num_pairs, N]`` bf16/fp32 (``[R, N]`` with
    ``c_sorted``); ``router_weights`` ``[num_pairs]`` fp32 or None. With ``c_scale_t`` the launch is
    the gate/up GEMM: ``b`` ``[E, 2I, K]`` (gate rows, then up rows, blocked apart in ``b_scale``),
    ``c`` ``[R, I]`` e4m3 receives ``silu(gate) * up`` at the sorted rows and ``c_scale_t``
    ``[ceil(I/128), R]`` its scales. ``config.block_k`` is 128 and ``config.block_n`` (output columns
    per tile) 128, or 256 for a plain GEMM with ``config.rescale``: the accumulators rescaled in place
    (:func:`fp8_rescaled_mma_partition`), which with ``c_scale_t`` holds gate and up for 128 rows;
    such a tile of 128 rows on 4 warps runs as two partitions of one warpgroup each.

    With ``config.tma_store`` C must lie in sorted order (``c_sorted``, or the gate/up GEMM's output)
    with 16-byte aligned rows: its tiles go out through TMA copies, padding rows included.

    With ``gather_scales`` ``[M, ceil(K/128)]`` fp32, ``a`` is x's e4m3 rows ``[M, K]`` as quantised
    (not sorted) and the load warp reads each sorted row's token row by index (cp.async): the
    rescaled split form only (128 rows, 4 warps).
    """
    gated = c_scale_t is not None
    tile_n = 2 * BLOCK if config.rescale and not gated else BLOCK
    if config.block_n != tile_n or config.block_k != BLOCK:
        raise ValueError(f"config: the Gluon FP8 kernel takes block_k = {BLOCK} and block_n = {tile_n} here (one "
                         f"weight scale per 128 columns and step; 256 only for a plain GEMM rescaled in place), "
                         f"got block_n = {config.block_n}, block_k = {config.block_k}")
    # Rescaled 128-row tiles on 4 warps: the two warpgroups as two partitions (the kernel's 4 warps and
    # a worker of 4), each on 64 rows, freeing stages alone.
    split = split_form(config)
    if config.rescale and not split and config.num_warps * 16 != config.block_m:
        raise ValueError(f"config: the rescaled kernel takes 16 rows a warp (8 warps, or 4 warps split in two "
                         f"partitions, for 128 rows), got block_m = {config.block_m}, num_warps = {config.num_warps}")
    if config.tma_store:
        if config.block_m == 256 and not config.rescale:
            raise ValueError("config.tma_store: the two-wave form (block_m = 256) stores through gl.store; expected "
                             "tma_store=False there")
        check_tma_out(c, gated or c_sorted)
    gather = gather_scales is not None
    if gather and not (split and gated):
        raise ValueError("gather_scales: A is read by index only in the gate/up GEMM's rescaled split form (128 "
                         f"rows, 4 warps, rescale); got {config}")
    if gather and a.numel() >= GATHER_MAX_ELEMENTS:
        raise ValueError(f"gather_scales: x must have fewer than {GATHER_MAX_ELEMENTS} elements, got "
                         f"{tuple(a.shape)}")
    if UNAVAILABLE:
        raise RuntimeError(UNAVAILABLE)
    if config.rescale:
        if YIELD_RESCALED:
            edit_compiled_forms(gluon_fp8_moe_kernel, "RESCALE")
        else:
            stop_editing(gluon_fp8_moe_kernel)
    sorted_ids, expert_ids, num_post = alignment
    E, rows, K = b.shape
    N = c.shape[1]
    if gather:      # the descriptors of A and its scales give the stages' layouts only
        a_scale_t = torch.empty(1, config.block_m, dtype=torch.float32, device=a.device)
    a_desc, as_desc, b_desc = _descriptors(a, a_scale_t, b, config.block_m)
    # A box of C: the rows one MMA partition holds, by one 128-column half (or gate/up tile).
    c_desc = gluon_descriptor(c, [config.block_m // 2 if split else config.block_m, BLOCK]) if config.tma_store \
        else a_desc
    max_tiles = triton.cdiv(sorted_ids.numel(), config.block_m) * triton.cdiv(N, tile_n)
    # The second B tile of a step: the up rows (gated) or the next 128 rows (a 256-wide tile).
    second_rows, second_scale_rows = (N, b_scale.shape[1] // 2) if gated else (BLOCK, 1)
    gluon_fp8_moe_kernel[(max(1, min(runtime.sm_count(), max_tiles)),)](
        a_desc, as_desc, b_desc, b_scale, c, c_scale_t if gated else b_scale,
        router_weights if router_weights is not None else b_scale, c_desc,
        sorted_ids, expert_ids, num_post,
        N, K, num_pairs, rows, second_rows, second_scale_rows,
        b_scale.stride(0), b_scale.stride(1), b_scale.stride(2), c.stride(0), c_scale_t.stride(0) if gated else 0,
        config.group_m, a, gather_scales if gather else a_scale_t, topk, a.stride(0),
        gather_scales.stride(0) if gather else 0,
        STAGES=config.num_stages, GATED=gated, RESCALE=config.rescale, SPLIT=split,
        TWO_B=gated or config.rescale, TILE_N=tile_n, C_SORTED=c_sorted or gated,
        ROUTER_WEIGHTS=router_weights is not None, OVERLAP=overlap, TMA_C=config.tma_store,
        GATHER_WARPS=GATHER_WARPS if gather else 0, GATHER_REGS=GATHER_REGS[GATHER_WARPS] if gather else 0,
        num_warps=config.num_warps)


# ------------------------------------------------------------------ the first GEMM and the layer

def gluon_fp8_first_gemm(x_q: torch.Tensor, x_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                         out: torch.Tensor, alignment, num_pairs: int, topk: int, config, router_weights=None) -> None:
    """Part 7's first GEMM through the Gluon kernel: x's rows gathered into sorted order (one
    launch), then one launch of the kernel writing each pair's row of ``out`` ``[num_pairs, N]``."""
    a, a_scale_t = gather_sorted_fp8(x_q, x_scale, alignment, num_pairs, topk, config.block_m)
    launch_gluon_fp8_gemm(a, a_scale_t, w, w_scale, out, alignment, num_pairs, config, router_weights=router_weights)


def gluon_fp8_layer(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                    w2_scale: torch.Tensor, topk_weights: torch.Tensor, alignment, topk: int,
                    cfg_up, cfg_down, *, sorted_quantiser: bool = True, gather_a: bool | None = None) -> torch.Tensor:
    """The FP8 layer on the Gluon kernel, inputs checked by :func:`moe_tutorial.kernels.fp8_kernel.fp8_moe_layer`.

    x's e4m3 rows in sorted order, the gate/up GEMM, the down GEMM with the router weights (one
    launch), the sum over each token's topk rows (one). With ``sorted_quantiser`` (the default) the
    quantiser writes each token's rows straight into sorted order (three launches: the alignment
    inverted, a -1 fill and a scatter, by :func:`~moe_tutorial.kernels.align.sorted_positions`, then
    :func:`~moe_tutorial.kernels.fp8_quant.quantize_rows_sorted`); without it x is quantised (one
    launch) and its rows gathered into sorted order (one). The first is faster on one H200
    (``data/h200_fp8_quantiser.csv``, notebook 07's Appendix A). The gate/up GEMM takes one of two
    forms, by ``cfg_up``:

    * fused (``block_m`` 64, or ``rescale``): ``silu(gate) * up`` quantised in its epilogue (one
      launch). Its tile must hold 128 output columns (one scale group) of gate *and* up: with three
      accumulators of each for the overlapped promotion only 64 rows fit in the registers; rescaled
      in place (one accumulator of each), 128 rows do;
    * otherwise (128 rows, promoted): the plain kernel over w13's ``2I`` rows into a bf16 buffer, then
      one launch of :func:`moe_tutorial.kernels.fp8_quant.silu_mul_quantize`: one more pass over memory.

    With ``cfg_down.tma_store`` the down GEMM writes its rows in sorted order through TMA copies, and
    the sum over each token's rows gathers them (:func:`~moe_tutorial.kernels.topk_sum.sorted_topk_sum`).

    With ``gather_a`` (None: :func:`gathers_a`) x is quantised once and the gate/up GEMM reads each
    sorted row's token row by index.

    Returns ``[M, K]`` in x's dtype.
    """
    inter = w2.shape[2]
    num_pairs = x.shape[0] * topk
    R = sorted_rows(alignment, cfg_up.block_m)
    if gather_a is None:
        gather_a = gathers_a(cfg_up, x.numel(), inter)
    # Where each pair's row sits: the sorted quantiser writes there, and the down GEMM's sum may read them.
    positions = sorted_positions(alignment, num_pairs) if gather_a or sorted_quantiser else None
    by_index = {}
    if gather_a:        # x quantised once; the gate/up GEMM reads each sorted row's token row by index
        a, x_s = launch_quantize_rows(x)
        a_scale_t, by_index = None, dict(gather_scales=x_s, topk=topk)
    elif sorted_quantiser:                      # x was checked at the door (fp8_moe_layer)
        a, a_scale_t = quantize_rows_sorted(x, positions, topk, R)
    else:
        x_q, x_s = launch_quantize_rows(x)
        a, a_scale_t = gather_sorted_fp8(x_q, x_s, alignment, num_pairs, topk, cfg_up.block_m)
    if cfg_up.block_m == 64 or cfg_up.rescale:
        act = torch.empty(R, inter, dtype=FP8_DTYPE, device=x.device)
        act_scale_t = torch.empty(triton.cdiv(inter, BLOCK), R, dtype=torch.float32, device=x.device)
        launch_gluon_fp8_gemm(a, a_scale_t, w13, w13_scale, act, alignment, num_pairs, cfg_up, c_scale_t=act_scale_t,
                              **by_index)
    else:
        if inter % BLOCK:
            raise ValueError(f"config: the plain gate/up GEMM reads one scale block per 128 rows of w13, so it needs "
                             f"I a multiple of {BLOCK}; got I = {inter} (use block_m = 64, the fused epilogue)")
        h = torch.empty(R, 2 * inter, dtype=torch.bfloat16, device=x.device)
        launch_gluon_fp8_gemm(a, a_scale_t, w13, w13_scale, h, alignment, num_pairs, cfg_up, c_sorted=True)
        act, act_scale_t = silu_mul_quantize(h, alignment[2])
    router_weights = topk_weights.reshape(-1).float().contiguous()
    return down_then_sum(x, R, topk, alignment, cfg_down.tma_store, lambda down, c_sorted: launch_gluon_fp8_gemm(
        act, act_scale_t, w2, w2_scale, down, alignment, num_pairs, cfg_down, router_weights=router_weights,
        c_sorted=c_sorted), positions)
