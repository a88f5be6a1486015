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
from .tma import stacked_rows

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
    # Triton 3.7 renamed the TMA copy into shared memory (3.9 removed the old name).
    tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
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

    @gluon.jit
    def store_rows(acc, first_row, pid_n, c_ptr, router_w_ptr, sorted_ids_ptr, N, num_pairs, stride_cm,
                   rows_layout: gl.constexpr, cols_layout: gl.constexpr,
                   C_SORTED: gl.constexpr, ROUTER_WEIGHTS: gl.constexpr):
        """[epilogue] Each row of ``acc`` is one (token, slot) pair: its router weight, then its row of C
        (at the pair's row, or at its sorted position), padding rows and columns past N masked."""
        BLOCK_M: gl.constexpr = acc.type.shape[0]
        BLOCK_N: gl.constexpr = acc.type.shape[1]
        offs_m = first_row + gl.arange(0, BLOCK_M, layout=rows_layout)
        offs_n = pid_n * BLOCK_N + gl.arange(0, BLOCK_N, layout=cols_layout)
        pair = gl.load(sorted_ids_ptr + offs_m)
        row_ok = pair < num_pairs
        if ROUTER_WEIGHTS:
            acc = acc * gl.load(router_w_ptr + pair, mask=row_ok, other=0.0)[:, None]
        if C_SORTED:
            c_row = offs_m.to(gl.int64)
        else:
            c_row = pair.to(gl.int64)
        ptrs = c_ptr + c_row[:, None] * stride_cm + offs_n[None, :]
        gl.store(ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & (offs_n[None, :] < N))

    @gluon.jit
    def load_partition(a_desc, b_desc, a_bufs, b_bufs, ready, empty, expert_ids_ptr, num_post_ptr,
                       N, K, b_rows_per_expert, group_m):
        """One warp: TMA copies of A's and B's tiles into the ring, as fast as buffers free up."""
        STAGES: gl.constexpr = a_bufs.type.shape[0]
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        num_pid_m = gl.cdiv(gl.load(num_post_ptr), BLOCK_M)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        step = 0
        for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
            pid_m, pid_n = tile_of(t, num_pid_m, num_pid_n, group_m)
            b_row = gl.load(expert_ids_ptr + pid_m) * b_rows_per_expert + pid_n * BLOCK_N
            for k in range(0, gl.cdiv(K, BLOCK_K)):
                s = step % STAGES
                # Wait until the consumer has released this buffer (a fresh barrier counts as released).
                mbarrier.wait(empty.index(s), ((step // STAGES) & 1) ^ 1)
                mbarrier.expect(ready.index(s), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
                tma_load(a_desc, [pid_m * BLOCK_M, k * BLOCK_K], ready.index(s), a_bufs.index(s))
                tma_load(b_desc, [b_row, k * BLOCK_K], ready.index(s), b_bufs.index(s))
                step += 1

    @gluon.jit
    def mma_partition(a_desc, b_desc, a_bufs, b_bufs, ready, empty, expert_ids_ptr, num_post_ptr,
                      N, K, b_rows_per_expert, group_m,
                      c_ptr, router_w_ptr, sorted_ids_ptr, num_pairs, stride_cm,
                      C_SORTED: gl.constexpr, ROUTER_WEIGHTS: gl.constexpr):
        """The kernel's warps: MMAs on each ready buffer, then the epilogue of each tile."""
        STAGES: gl.constexpr = a_bufs.type.shape[0]
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
        layout: gl.constexpr = mma_layout(BLOCK_M, BLOCK_N, gl.num_warps())
        rows_layout: gl.constexpr = gl.SliceLayout(1, layout)
        cols_layout: gl.constexpr = gl.SliceLayout(0, layout)
        num_pid_m = gl.cdiv(gl.load(num_post_ptr), BLOCK_M)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        step = 0
        for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
            pid_m, pid_n = tile_of(t, num_pid_m, num_pid_n, group_m)
            acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
            for k in range(0, gl.cdiv(K, BLOCK_K)):
                s = step % STAGES
                mbarrier.wait(ready.index(s), (step // STAGES) & 1)
                acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, is_async=True)
                # Keep one MMA in flight: the one before it has finished, so its buffer is free.
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES), pred=k > 0)
                step += 1
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES))

            store_rows(acc, pid_m * BLOCK_M, pid_n, c_ptr, router_w_ptr, sorted_ids_ptr, N, num_pairs, stride_cm,
                       rows_layout, cols_layout, C_SORTED, ROUTER_WEIGHTS)

    @gluon.jit
    def gluon_moe_kernel(a_desc, b_desc, c_ptr, router_w_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_ptr,
                         N, K, num_pairs, b_rows_per_expert, stride_cm, group_m,
                         STAGES: gl.constexpr, C_SORTED: gl.constexpr, ROUTER_WEIGHTS: gl.constexpr):
        """C[pair] = A[sorted position] . B[expert]^T for every real tile; see the module docstring."""
        a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
        b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        fence_async_shared()
        gl.warp_specialize([
            (mma_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, expert_ids_ptr, num_post_ptr,
                             N, K, b_rows_per_expert, group_m, c_ptr, router_w_ptr, sorted_ids_ptr, num_pairs,
                             stride_cm, C_SORTED, ROUTER_WEIGHTS)),
            (load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, expert_ids_ptr, num_post_ptr,
                              N, K, b_rows_per_expert, group_m)),
        ], [1], [40])


def gather_sorted_rows(x: torch.Tensor, sorted_ids: torch.Tensor, num_pairs: int, topk: int) -> torch.Tensor:
    """``[len(sorted_ids), K]``: row ``i`` is x's row of the pair at sorted position ``i``
    (padding positions, and the unwritten ones past ``num_tokens_post_padded``, take row 0 or
    the last pair's: their outputs are never stored)."""
    return x.index_select(0, sorted_ids.clamp(0, num_pairs - 1) // topk)


def launch_gluon_gemm(a_sorted: torch.Tensor, b: torch.Tensor, c: torch.Tensor, router_weights, alignment,
                      num_pairs: int, config, *, c_sorted: bool = False) -> None:
    """One launch of :func:`gluon_moe_kernel` on a Hopper GPU.

    ``a_sorted`` ``[max_padded, K]`` bf16/fp16 rows in sorted order; ``b`` ``[E, N, K]`` contiguous
    experts; ``c`` ``[num_pairs, N]`` (or ``[max_padded, N]`` with ``c_sorted``); ``router_weights``
    ``[num_pairs]`` fp32 or None; ``alignment`` from ``align_block_size`` with ``config.block_m``.
    """
    if UNAVAILABLE:
        raise RuntimeError(UNAVAILABLE)
    sorted_ids, expert_ids, num_post = alignment
    rows, K = b.shape[1], b.shape[2]
    N = c.shape[1]
    dtype = gl.bfloat16 if a_sorted.dtype == torch.bfloat16 else gl.float16
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    a_desc = GluonDescriptor.from_tensor(a_sorted, [bm, bk], gl.NVMMASharedLayout.get_default_for([bm, bk], dtype))
    b_desc = GluonDescriptor.from_tensor(stacked_rows(b), [bn, bk],
                                         gl.NVMMASharedLayout.get_default_for([bn, bk], dtype))
    max_tiles = triton.cdiv(sorted_ids.numel(), bm) * triton.cdiv(N, bn)
    sms = torch.cuda.get_device_properties(c.device).multi_processor_count
    gluon_moe_kernel[(max(1, min(sms, max_tiles)),)](
        a_desc, b_desc, c, router_weights if router_weights is not None else c, sorted_ids, expert_ids, num_post,
        N, K, num_pairs, rows, c.stride(0), config.group_m, STAGES=config.num_stages,
        C_SORTED=c_sorted, ROUTER_WEIGHTS=router_weights is not None, num_warps=config.num_warps)
