"""Part 8, beyond ``tl``: dA' with its dSwiGLU epilogue as a persistent, warp-specialised Gluon kernel.

The backward's first GEMM, ``dA' = dO W2[e]`` over the sorted pairs, runs in ``tl`` as
:func:`moe_tutorial.kernels.backward_kernel.rows_gemm_kernel` with the "dswiglu" epilogue; Nsight
Compute found it the slowest GEMM of a step by the tensor cores' measure (57% of the tensor
pipe's cycles on Mixtral-8x7B, 66% on DeepSeek-V3, at T = 16384 on an H200). Its epilogue is
heavy: for one accumulator it reads two H tiles (gate and up, at each pair's row) and writes
three (dH's two halves and ``s * A``), and while it runs the tensor cores wait. This kernel gives
the epilogue warps of its own, so that it runs under the next tile's MMAs:

* the **load partition** is Part 4's (:mod:`moe_tutorial.kernels.gluon_kernel`: one warp of TMA
  copies), reading W2 as it lies, ``[E, K, N]`` with the hidden size K down the rows, so B's tiles
  are ``[BLOCK_K, BLOCK_N]`` (``B_KN``);
* the **MMA partition** (the kernel's ``num_warps``, a warpgroup per 64 rows) keeps one
  asynchronous warpgroup MMA in flight, as the dW kernel does; after a tile's last step it writes
  the fp32 accumulator to shared memory, says so on an mbarrier (``acc_full``) and starts the next
  tile at once;
* the **epilogue partition** (4 warps) waits for ``acc_full``, reads the accumulator back in strips
  of ``STRIP`` columns (each strip's H loaded, the ``tl`` kernel's own
  :func:`~moe_tutorial.kernels.dswiglu.dswiglu_epilogue` run on it, its outputs stored, its share of
  the router gradient added to a running sum per row: the whole tile in registers at once would
  overflow them) and hands the buffer back (``acc_free``), which the MMA warps wait for before they
  write it again.

The sums run over the strips in order and each tile is one program's: two runs give the same bits.
Two earlier forms lost to ``tl`` on the GPU and were dropped (the measurements' logs keep them):
the epilogue in the MMA warps themselves, and two warpgroups taking turns at the tensor cores.

dO must lie in sorted order (TMA reads whole tiles of rows): the backward's sorted copy. Gluon does
not run in Triton's CPU interpreter: on a laptop the ``tl`` kernel runs.
"""
from __future__ import annotations

import torch
import triton

from .. import runtime
from .dswiglu import dswiglu_epilogue
from .gluon_kernel import HAVE_GLUON, gluon_descriptor
from .tma import stacked_rows, tma_can_read, tma_stacks

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import mbarrier, warpgroup_mma, warpgroup_mma_wait

    from .gluon_kernel import load_partition, mma_layout, ring_barriers, tile_of

    # A barrier of the partition's own warps; Triton 3.9 renamed it.
    partition_barrier = getattr(gl, "thread_barrier", None) or gl.barrier

#: Why this kernel cannot run here, or None where it can.
UNAVAILABLE = (None if HAVE_GLUON and runtime.ON_GPU and torch.cuda.get_device_capability()[0] == 9
               else "the Gluon dA' kernel needs a Hopper GPU (sm90) and Triton's Gluon; the interpreter cannot run it")

#: Columns of the accumulator the epilogue takes at a time.
STRIP = 32


if HAVE_GLUON:
    @gluon.jit
    def dact_epilogue(acc_smem, first_row, pid_n, N, num_pairs, h_ptr, dh_ptr, sa_ptr, router_w_ptr, ds_ptr,
                      sorted_ids_ptr, stride_hm, stride_dhm, stride_sam, stride_dsm, STRIP: gl.constexpr):
        """[the epilogue] dA' lies in ``acc_smem`` ``[BLOCK_M, BLOCK_N]`` fp32. Strip by strip: H's gate
        and up at each pair's row, dH (gate, then up ``N`` columns on) and ``s * A`` at the sorted rows
        (padding rows as zeros), and ``sum dA' * A`` over the tile's columns to ``ds_ptr[pair, pid_n]``."""
        BLOCK_M: gl.constexpr = acc_smem.type.shape[0]
        BLOCK_N: gl.constexpr = acc_smem.type.shape[1]
        # 8 consecutive columns a thread (16-byte loads of H), a warp over 32 columns of a few rows.
        strip_layout: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (STRIP // 8), STRIP // 8], [gl.num_warps(), 1],
                                                      [1, 0])
        rows_layout: gl.constexpr = gl.SliceLayout(1, strip_layout)
        cols_layout: gl.constexpr = gl.SliceLayout(0, strip_layout)
        offs_m = first_row + gl.arange(0, BLOCK_M, layout=rows_layout)
        pair = gl.load(sorted_ids_ptr + offs_m)
        row_ok = pair < num_pairs                  # padding rows hold num_pairs
        s = gl.load(router_w_ptr + pair, mask=row_ok, other=0.0)
        pair_row = pair.to(gl.int64)[:, None]
        sorted_row = offs_m.to(gl.int64)[:, None]
        partial = gl.zeros([BLOCK_M], gl.float32, rows_layout)
        for c in gl.static_range(BLOCK_N // STRIP):
            dact = acc_smem.slice(c * STRIP, STRIP, dim=1).load(strip_layout)
            offs_n = pid_n * BLOCK_N + c * STRIP + gl.arange(0, STRIP, layout=cols_layout)
            col_ok = offs_n[None, :] < N
            keep = row_ok[:, None] & col_ok
            h_ptrs = h_ptr + pair_row * stride_hm + offs_n[None, :]
            gate = gl.load(h_ptrs, mask=keep, other=0.0).to(gl.float32)
            up = gl.load(h_ptrs + N, mask=keep, other=0.0).to(gl.float32)
            d_gate, d_up, s_act, act = dswiglu_epilogue(dact, gate, up, s)
            dh_ptrs = dh_ptr + sorted_row * stride_dhm + offs_n[None, :]
            gl.store(dh_ptrs, gl.where(keep, d_gate, 0.0).to(dh_ptr.dtype.element_ty), mask=col_ok)
            gl.store(dh_ptrs + N, gl.where(keep, d_up, 0.0).to(dh_ptr.dtype.element_ty), mask=col_ok)
            gl.store(sa_ptr + sorted_row * stride_sam + offs_n[None, :],
                     gl.where(keep, s_act, 0.0).to(sa_ptr.dtype.element_ty), mask=col_ok)
            partial += gl.sum(gl.where(keep, dact * act, 0.0), axis=1)
        # dS = <dA', A>: this tile's share, one partial per column block, added up later in a fixed order.
        gl.store(ds_ptr + pair.to(gl.int64) * stride_dsm + pid_n, partial, mask=row_ok)

    @gluon.jit
    def dact_mma_partition(a_bufs, b_bufs, acc_smem, ready, empty, acc_full, acc_free, num_post_ptr, N, K, group_m):
        """The kernel's warps (two warpgroups): ``acc += dO . W2`` on each ready buffer, one MMA in
        flight, then the tile's accumulator into shared memory for the epilogue warps, and on to the
        next tile's MMAs while they work."""
        STAGES: gl.constexpr = a_bufs.type.shape[0]
        BLOCK_M: gl.constexpr = a_bufs.type.shape[1]
        BLOCK_K: gl.constexpr = a_bufs.type.shape[2]
        BLOCK_N: gl.constexpr = b_bufs.type.shape[2]
        layout: gl.constexpr = mma_layout(BLOCK_M, BLOCK_N, gl.num_warps())
        num_pid_m = gl.cdiv(gl.load(num_post_ptr), BLOCK_M)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        step = 0
        i = 0                                      # the tile's place in this program's walk
        for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
            # Zeroed with no MMA in flight (ptxas serialises every wgmma of a kernel that writes an
            # accumulator while its MMA runs).
            acc = gl.zeros((BLOCK_M, BLOCK_N), dtype=gl.float32, layout=layout)
            for k in range(0, gl.cdiv(K, BLOCK_K)):
                s = step % STAGES
                mbarrier.wait(ready.index(s), (step // STAGES) & 1)
                acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                # The step before has finished: its buffer goes back to the load warp.
                mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES), pred=k > 0)
                step += 1
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES))
            # [hand over]
            # Once the epilogue warps have read the last tile (a fresh barrier counts as read), this one
            # goes to shared memory; every MMA warp's share lands before they are told.
            mbarrier.wait(acc_free, (i & 1) ^ 1)
            acc_smem.store(acc)
            partition_barrier()
            mbarrier.arrive(acc_full)
            i += 1

    @gluon.jit
    def dact_epilogue_partition(acc_smem, acc_full, acc_free, num_post_ptr, N, group_m, num_pairs, h_ptr, dh_ptr,
                                sa_ptr, router_w_ptr, ds_ptr, sorted_ids_ptr, stride_hm, stride_dhm, stride_sam,
                                stride_dsm, STRIP: gl.constexpr):
        """Four warps: the same walk of tiles, each tile's epilogue (:func:`dact_epilogue`) once its
        accumulator is in shared memory, which then goes back to the MMA warps."""
        BLOCK_M: gl.constexpr = acc_smem.type.shape[0]
        BLOCK_N: gl.constexpr = acc_smem.type.shape[1]
        num_pid_m = gl.cdiv(gl.load(num_post_ptr), BLOCK_M)
        num_pid_n = gl.cdiv(N, BLOCK_N)
        i = 0
        for t in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
            pid_m, pid_n = tile_of(t, num_pid_m, num_pid_n, group_m)
            mbarrier.wait(acc_full, i & 1)
            dact_epilogue(acc_smem, pid_m * BLOCK_M, pid_n, N, num_pairs, h_ptr, dh_ptr, sa_ptr, router_w_ptr,
                          ds_ptr, sorted_ids_ptr, stride_hm, stride_dhm, stride_sam, stride_dsm, STRIP)
            partition_barrier()                    # every epilogue warp has read its strips
            mbarrier.arrive(acc_free)
            i += 1

    @gluon.jit
    def gluon_dact_kernel(a_desc, b_desc, h_ptr, dh_ptr, sa_ptr, router_w_ptr, ds_ptr, sorted_ids_ptr,
                          expert_ids_ptr, num_post_ptr, N, K, num_pairs, group_m,
                          stride_hm, stride_dhm, stride_sam, stride_dsm,
                          STAGES: gl.constexpr, STRIP: gl.constexpr):
        """dA' = dO[sorted rows] . W2[expert] for every real ``[BLOCK_M, BLOCK_N]`` tile, and its
        dSwiGLU epilogue; ``b_desc`` is over W2 viewed as ``[E * K, N]``. See the module docstring."""
        BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
        BLOCK_N: gl.constexpr = b_desc.block_type.shape[1]
        a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES] + a_desc.block_type.shape, a_desc.layout)
        b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES] + b_desc.block_type.shape, b_desc.layout)
        acc_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_M, BLOCK_N],
                                             gl.SwizzledSharedLayout(4, 1, 8, order=[1, 0]))
        # The accumulator's hand-over: full (the MMA warps wrote it), free (the epilogue warps read it).
        acc_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        acc_free = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(acc_full, count=1)
        mbarrier.init(acc_free, count=1)
        ready, empty = ring_barriers(STAGES)      # (its fence covers the hand-over's initialisation too)
        gl.warp_specialize([
            (dact_mma_partition, (a_bufs, b_bufs, acc_smem, ready, empty, acc_full, acc_free, num_post_ptr, N, K,
                                  group_m)),
            (dact_epilogue_partition, (acc_smem, acc_full, acc_free, num_post_ptr, N, group_m, num_pairs, h_ptr,
                                       dh_ptr, sa_ptr, router_w_ptr, ds_ptr, sorted_ids_ptr, stride_hm, stride_dhm,
                                       stride_sam, stride_dsm, STRIP)),
            (load_partition, (a_desc, b_desc, a_bufs, b_bufs, b_bufs, ready, empty, expert_ids_ptr, num_post_ptr,
                              N, K, K, 0, group_m, False, True)),
        ], [4, 1], [192, 40])      # the epilogue's registers: a strip's dA', H and results, 32 values each


def gluon_dact_refusal(d_rows: torch.Tensor, w2: torch.Tensor, dh: torch.Tensor, config) -> str | None:
    """Why :func:`launch_gluon_dact` cannot take these operands and tile, or None if it can."""
    if UNAVAILABLE:
        return UNAVAILABLE
    if not (d_rows.dtype == w2.dtype == dh.dtype) or d_rows.dtype not in (torch.bfloat16, torch.float16):
        return f"expected one 16-bit dtype for dO, W2 and dH, got {d_rows.dtype}, {w2.dtype}, {dh.dtype}"
    if not (tma_can_read(d_rows) and tma_stacks(w2)):
        return ("TMA reads dO's sorted rows and W2: unit column stride, 16-byte aligned rows, W2's experts one "
                "after another")
    if w2.shape[1] % config.block_k:
        return (f"W2's {w2.shape[1]} rows an expert (the hidden size) must be a multiple of block_k "
                f"({config.block_k}), or a tile's last K step would read the next expert's rows")
    if config.block_n % STRIP or (config.block_m, config.num_warps) not in ((64, 4), (128, 8)):
        return (f"expected block_n a multiple of {STRIP} and a warpgroup per 64 rows (block_m 64 and 4 warps, or "
                f"128 and 8), got block_n {config.block_n}, block_m {config.block_m}, {config.num_warps} warps")
    return None


def launch_gluon_dact(d_rows: torch.Tensor, w2: torch.Tensor, alignment, num_pairs: int, config, *,
                      dh: torch.Tensor, h: torch.Tensor, s_act: torch.Tensor, router_weights: torch.Tensor,
                      ds_partial: torch.Tensor) -> None:
    """One launch of :func:`gluon_dact_kernel` on a Hopper GPU: the "dswiglu" launch of
    :func:`moe_tutorial.kernels.backward_kernel.launch_rows_gemm` (which calls this with ``config.gluon``).

    ``d_rows`` ``[max_padded, K]`` dO in sorted order; ``w2`` ``[E, K, I]`` contiguous; ``h``
    ``[num_pairs, 2I]`` (pair order); writes ``dh`` ``[max_padded, 2I]`` and ``s_act``
    ``[max_padded, I]`` (sorted rows, padding rows zero) and ``ds_partial`` ``[num_pairs,
    cdiv(I, block_n)]`` fp32; ``router_weights`` ``[num_pairs]`` fp32. All 16-bit but the fp32 ones.
    ValueError where :func:`gluon_dact_refusal` says why not.
    """
    why = gluon_dact_refusal(d_rows, w2, dh, config)
    if why:
        raise ValueError(f"the Gluon dA' kernel: {why}")
    sorted_ids, expert_ids, num_post = alignment
    K, N = w2.shape[1], w2.shape[2]
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    tiles = triton.cdiv(sorted_ids.numel(), bm) * triton.cdiv(N, bn)
    gluon_dact_kernel[(max(1, min(runtime.sm_count(), tiles)),)](
        gluon_descriptor(d_rows, [bm, bk]), gluon_descriptor(stacked_rows(w2), [bk, bn]), h, dh, s_act,
        router_weights, ds_partial, sorted_ids, expert_ids, num_post, N, K, num_pairs, config.group_m,
        h.stride(0), dh.stride(0), s_act.stride(0), ds_partial.stride(0),
        STAGES=config.num_stages, STRIP=STRIP, num_warps=config.num_warps)


__all__ = ["UNAVAILABLE", "STRIP", "gluon_dact_refusal", "launch_gluon_dact"]
