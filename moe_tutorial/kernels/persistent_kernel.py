"""Part 4's last step: the same tiles, computed by a persistent grid.

:func:`moe_tutorial.kernels.sorted_kernel.sorted_moe_kernel` launches one program per
(row block, column block) of the padded upper bound ``max_padded``; programs past the real end
of the sorted pairs return at once, and every program pays its own start (address arithmetic,
the pipeline's fill) and its own epilogue, with nothing to overlap them. Here the grid is one
program per SM. Each program walks the tile list with a stride of the grid size: tile
``t`` is ``grouped_tile(t)`` as before, but the list stops at the real number of row blocks,
read on the device from ``num_tokens_post_padded`` (no host synchronisation, no idle programs).
Because a program owns many tiles in one loop, Triton can pipeline across them: the next tile's
first loads are in flight while this tile's epilogue runs (``flatten=True``). (Triton's
``tl.range(..., warp_specialize=True)`` would split the loop into producer and consumer warps;
for Hopper it makes none, ``measurements/scripts/sm90_warp_specialize_probe.py`` shows, so the
flag is not here: :mod:`moe_tutorial.kernels.gluon_kernel` writes those warps out by hand.)

The tile itself, its K loop and both epilogues are :func:`sorted_tile`, unchanged; only the
loop around it is new. Short tails (half tiles) are left out: two tile shapes in one loop
would stop Triton from pipelining across tiles.
"""
from __future__ import annotations

import triton
import triton.language as tl

from .. import runtime
from .sorted_kernel import grouped_tile, sorted_tile


@triton.jit
def persistent_moe_kernel(
    # As sorted_moe_kernel, less the half-block descriptor: short tails are not used here.
    a_ptr, a_desc, b_ptr, b_desc, c_ptr, router_w_ptr, alignment,
    N, K, num_pairs, a_row_div, stride_b_up, b_rows_per_expert, group_m,
    stride_a, stride_b, stride_c,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    A_ROWS: tl.constexpr, C_ROWS: tl.constexpr, EPILOGUE: tl.constexpr, EVEN_K: tl.constexpr,
):
    """The tiles of :func:`sorted_moe_kernel`, ``tl.num_programs(0)`` programs sharing them."""
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr = alignment
    # What every tile shares, bundled for sorted_tile as in sorted_moe_kernel.
    shared = (a_ptr, b_ptr, b_desc, c_ptr, router_w_ptr, sorted_ids_ptr,
              N, K, num_pairs, a_row_div, stride_b_up, b_rows_per_expert, stride_a, stride_b, stride_c)
    # [each program's tiles]
    # The real row blocks only: read on the device, not bounded on the host.
    num_pid_m = tl.cdiv(tl.load(num_post_ptr), BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    # t = this program, then every num_programs-th tile after it.
    for t in tl.range(tl.program_id(axis=0), num_tiles, tl.num_programs(axis=0), flatten=True):
        pid_m, pid_n = grouped_tile(t, num_pid_m, num_pid_n, group_m)
        expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
        # [one tile]
        sorted_tile(a_desc, BLOCK_M, pid_m, pid_n, expert, shared,
                    BLOCK_M, BLOCK_N, BLOCK_K, A_ROWS, C_ROWS, EPILOGUE, EVEN_K)


#: Programs of the persistent grid in Triton's CPU interpreter: a few, so that each one walks
#: several tiles and the tests see the stride.
INTERPRETER_PROGRAMS = 3


def persistent_grid(max_tiles: int, num_sms: int | None = None) -> tuple[int]:
    """One program per SM (``num_sms``, by default this GPU's, or :data:`INTERPRETER_PROGRAMS` in
    the interpreter), never more programs than the upper bound of tiles."""
    if num_sms is None:
        num_sms = INTERPRETER_PROGRAMS if runtime.INTERPRETED else runtime.sm_count()
    return (max(1, min(num_sms, max_tiles)),)


__all__ = ["persistent_moe_kernel", "persistent_grid", "INTERPRETER_PROGRAMS"]
