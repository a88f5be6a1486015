"""Part 8, beyond ``tl``: the K-grouped weight gradients as a persistent, warp-specialised Gluon kernel.

:func:`moe_tutorial.kernels.backward_kernel.expert_grad_kernel` computes ``dW[e] = L_e^T R_e``
over each expert's run of sorted rows, one output tile per program, in ``tl``. Its K loop is the
run: 128 to 1024 rows at training sizes, a few steps, so every program spends much of its life
filling its pipeline and storing its tile. This kernel is Part 4's Gluon kernel
(:mod:`moe_tutorial.kernels.gluon_kernel`) turned to that shape:

* a **load partition** of one warp walks the tiles of a persistent grid (one program per SM) and,
  for each tile, the rows of its expert's run, ``BLOCK_R`` at a time: for each step it waits for an
  empty buffer of the ring and asks TMA for the step's rows of L (``[BLOCK_R, BLOCK_P]``) and of R
  (``[BLOCK_R, BLOCK_Q]``). It does not wait for a tile's store: it is already loading the next
  tile's first rows;
* the **default partition** (two warpgroups, ``num_warps`` 8) issues the asynchronous warpgroup
  MMA ``acc += L^T R`` on each ready buffer, the L tile read transposed from shared memory as it
  lies (wgmma takes a 16-bit operand in either order), one MMA in flight while the buffer before
  goes back to the load warp. After the run it writes the tile to shared memory in bf16 and hands
  it to TMA's bulk store, which runs while the next tile's MMAs start.

Both operands must lie in sorted order (TMA reads whole tiles of rows): the backward's sorted
copies of dO and x, dH and ``s * A``. Their padding rows hold zeros or values that the other
operand's zeros cancel, so every step is a full tile and nothing is masked. The store's tile must
not reach the next expert's rows, so ``P`` is a multiple of ``BLOCK_P``. Every sum runs over the
run's rows in order: two runs give the same bits.

Gluon does not run in Triton's CPU interpreter: on a laptop the ``tl`` kernel runs.
"""
from __future__ import annotations

import torch
import triton

from .. import runtime
from .gluon_kernel import HAVE_GLUON, gluon_descriptor
from .tma import stacked_rows, tma_can_read

if HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from .gluon_kernel import copy_out, mma_layout, ring_barriers, tile_of, tma_load

#: Why this kernel cannot run here, or None where it can.
UNAVAILABLE = (None if HAVE_GLUON and runtime.ON_GPU and torch.cuda.get_device_capability()[0] == 9
               else "the Gluon dW kernel needs a Hopper GPU (sm90) and Triton's Gluon; the interpreter cannot run it")


if HAVE_GLUON:
    @gluon.jit
    def grad_tile(t, num_p, num_q, group_m, expert_rows_ptr):
        """Tile ``t`` of the persistent walk: its expert (experts one after another, so that the
        programs at work share one expert's runs in the L2), its place in the expert's dW, and the
        expert's run of sorted rows ``[first, end)``."""
        expert = t // (num_p * num_q)
        pid_p, pid_q = tile_of(t % (num_p * num_q), num_p, num_q, group_m)
        first = gl.load(expert_rows_ptr + expert)
        end = gl.load(expert_rows_ptr + expert + 1)
        return expert, pid_p, pid_q, first, end

    @gluon.jit
    def grad_load_partition(l_desc, r_desc, l_bufs, r_bufs, ready, empty, expert_rows_ptr, num_tiles, num_p, num_q,
                            group_m):
        """One warp: each step's rows of L and R, by TMA, into the ring as buffers free up."""
        STAGES: gl.constexpr = l_bufs.type.shape[0]
        BLOCK_R: gl.constexpr = l_desc.block_type.shape[0]
        BLOCK_P: gl.constexpr = l_desc.block_type.shape[1]
        BLOCK_Q: gl.constexpr = r_desc.block_type.shape[1]
        nbytes: gl.constexpr = l_desc.block_type.nbytes + r_desc.block_type.nbytes
        step = 0
        for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
            expert, pid_p, pid_q, first, end = grad_tile(t, num_p, num_q, group_m, expert_rows_ptr)
            for r0 in range(first, end, BLOCK_R):
                s = step % STAGES
                mbarrier.wait(empty.index(s), ((step // STAGES) & 1) ^ 1)     # a fresh barrier counts as empty
                mbarrier.expect(ready.index(s), nbytes)
                tma_load(l_desc, [r0, pid_p * BLOCK_P], ready.index(s), l_bufs.index(s))
                tma_load(r_desc, [r0, pid_q * BLOCK_Q], ready.index(s), r_bufs.index(s))
                step += 1

    @gluon.jit
    def grad_mma_partition(l_bufs, r_bufs, c_smem, ready, empty, c_desc, expert_rows_ptr, num_tiles, num_p, num_q,
                           group_m, P):
        """The kernel's warps: ``acc += L^T R`` on each ready buffer, then the tile's store by TMA."""
        STAGES: gl.constexpr = l_bufs.type.shape[0]
        BLOCK_R: gl.constexpr = l_bufs.type.shape[1]
        BLOCK_P: gl.constexpr = c_desc.block_type.shape[0]
        BLOCK_Q: gl.constexpr = c_desc.block_type.shape[1]
        layout: gl.constexpr = mma_layout(BLOCK_P, BLOCK_Q, gl.num_warps())
        step = 0
        for t in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
            expert, pid_p, pid_q, first, end = grad_tile(t, num_p, num_q, group_m, expert_rows_ptr)
            # Zeroed with no MMA in flight (ptxas serialises every wgmma of a kernel that writes an
            # accumulator while its MMA runs); an expert with no rows stores this tile of zeros.
            acc = gl.zeros((BLOCK_P, BLOCK_Q), dtype=gl.float32, layout=layout)
            for r0 in range(first, end, BLOCK_R):
                s = step % STAGES
                mbarrier.wait(ready.index(s), (step // STAGES) & 1)
                acc = warpgroup_mma(l_bufs.index(s).permute((1, 0)), r_bufs.index(s), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
                # The step before has finished: its buffer goes back to the load warp.
                mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES), pred=r0 > first)
                step += 1
            acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
            mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES), pred=end > first)
            # [the store] Through c_smem (one buffer: the last tile's copy must have left it first).
            copy_out(acc, c_desc, c_smem, 0, expert * P + pid_p * BLOCK_P, pid_q * BLOCK_Q)
        tma.store_wait(0)

    @gluon.jit
    def gluon_expert_grad_kernel(l_desc, r_desc, c_desc, expert_rows_ptr, num_experts, P, Q, group_m,
                                 STAGES: gl.constexpr):
        """``dW[e] = L_e^T R_e`` for every expert ``e``, ``[BLOCK_P, BLOCK_Q]`` tiles on a persistent
        grid; ``c_desc`` is over dW viewed as ``[E * P, Q]``. See the module docstring."""
        BLOCK_P: gl.constexpr = c_desc.block_type.shape[0]
        BLOCK_Q: gl.constexpr = c_desc.block_type.shape[1]
        l_bufs = gl.allocate_shared_memory(l_desc.dtype, [STAGES] + l_desc.block_type.shape, l_desc.layout)
        r_bufs = gl.allocate_shared_memory(r_desc.dtype, [STAGES] + r_desc.block_type.shape, r_desc.layout)
        c_smem = gl.allocate_shared_memory(c_desc.dtype, [1] + c_desc.block_type.shape, c_desc.layout)
        ready, empty = ring_barriers(STAGES)
        num_p = gl.cdiv(P, BLOCK_P)
        num_q = gl.cdiv(Q, BLOCK_Q)
        num_tiles = num_experts * num_p * num_q
        gl.warp_specialize([
            (grad_mma_partition, (l_bufs, r_bufs, c_smem, ready, empty, c_desc, expert_rows_ptr, num_tiles, num_p,
                                  num_q, group_m, P)),
            (grad_load_partition, (l_desc, r_desc, l_bufs, r_bufs, ready, empty, expert_rows_ptr, num_tiles, num_p,
                                   num_q, group_m)),
        ], [1], [40])


def gluon_grad_refusal(left: torch.Tensor, right: torch.Tensor, out: torch.Tensor, block_r: int, config) -> str | None:
    """Why :func:`launch_gluon_expert_grad` cannot take these operands and tile, or None if it can."""
    if UNAVAILABLE:
        return UNAVAILABLE
    if not (left.dtype == right.dtype == out.dtype) or left.dtype not in (torch.bfloat16, torch.float16):
        return f"expected one 16-bit dtype for both operands and dW, got {left.dtype}, {right.dtype}, {out.dtype}"
    if not all(tma_can_read(t) for t in (left, right, out)) or not out.is_contiguous():
        return "TMA reads the operands and writes dW: unit column stride, 16-byte aligned rows, dW contiguous"
    if out.shape[1] % config.block_m:
        return (f"dW's {out.shape[1]} rows an expert must be a multiple of block_m ({config.block_m}), or a "
                f"tile's store would reach the next expert")
    if block_r % 16 or config.num_warps != 8:
        return f"expected 16-row steps and 8 warps (two consumer warpgroups), got {block_r} rows, {config.num_warps}"
    return None


def launch_gluon_expert_grad(left: torch.Tensor, right: torch.Tensor, out: torch.Tensor, rows: torch.Tensor,
                             block_r: int, config) -> None:
    """One launch of :func:`gluon_expert_grad_kernel` on a Hopper GPU: ``out [E, P, Q]`` = per expert
    ``left^T right`` over its run (``rows`` ``[E + 1]`` int32, as
    :func:`moe_tutorial.kernels.stable_align.expert_rows`).

    ``left [R, P]`` and ``right [R, Q]`` bf16/fp16 in sorted order (padding rows zero, or cancelled
    by the other's zeros); ``config.block_m`` x ``config.block_n`` the dW tile, ``block_r`` rows a
    step (a divisor of the alignment's block_m), ``config.num_stages`` buffers in the ring.
    ValueError where :func:`gluon_grad_refusal` says why not.
    """
    why = gluon_grad_refusal(left, right, out, block_r, config)
    if why:
        raise ValueError(f"the Gluon dW kernel: {why}")
    E, P, Q = out.shape
    bp, bq = config.block_m, config.block_n
    tiles = E * triton.cdiv(P, bp) * triton.cdiv(Q, bq)
    gluon_expert_grad_kernel[(max(1, min(runtime.sm_count(), tiles)),)](
        gluon_descriptor(left, [block_r, bp]), gluon_descriptor(right, [block_r, bq]),
        gluon_descriptor(stacked_rows(out), [bp, bq]), rows, E, P, Q,
        config.group_m, STAGES=config.num_stages, num_warps=config.num_warps)


__all__ = ["UNAVAILABLE", "gluon_grad_refusal", "launch_gluon_expert_grad"]
