"""Notebook 03's first Triton kernel, before Part 3's: a program id, offsets, a mask, one load, one store.

``double_kernel`` doubles a vector. It holds only what every Triton kernel of the series starts
with, so that the 55 lines of Part 3's kernel later add gathers and a K loop to something already
read: which elements a program owns (``tl.program_id`` and ``tl.arange``), which of them exist
(the mask), and a masked load and store.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..checks import as_int, check_kernel_dtype, check_tensor


@triton.jit
def double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """out[i] = 2 * x[i] for i < n; program p owns elements p * BLOCK ... p * BLOCK + BLOCK - 1."""
    pid = tl.program_id(axis=0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)       # the elements this program owns
    mask = offs < n                                 # False past the end of x: no memory touched there
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, 2 * x, mask=mask)


def double(x: torch.Tensor, block: int = 4) -> torch.Tensor:
    """``2 * x`` for a contiguous 1-D float tensor ``[n]``, one program per ``block`` elements
    (a power of two): grid ``(cdiv(n, block),)``. Returns a new ``[n]`` tensor of x's dtype."""
    check_tensor("x", x, 1)
    check_kernel_dtype("x", x)
    if not x.is_contiguous():
        raise ValueError(f"x: expected a contiguous tensor, got strides {tuple(x.stride())}")
    block = as_int("block", block)
    if block < 1 or block & (block - 1):
        raise ValueError(f"block: expected a power of two (tl.arange takes nothing else), got {block}")
    out = torch.empty_like(x)
    if x.numel():
        double_kernel[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), BLOCK=block)
    return out
