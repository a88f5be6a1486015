"""The FP8 format the series uses, in one place: e4m3, its largest value, the 128-wide blocks.

:mod:`moe_tutorial.quant` quantises to this format, :mod:`moe_tutorial.checks` checks tensors
against it, and the kernels read the same constants; none of them defines its own copy.
"""
from __future__ import annotations

import math

import torch

#: e4m3 without infinities ("fn"): 4 exponent bits, 3 mantissa bits, largest finite value 448.
FP8_DTYPE = torch.float8_e4m3fn
#: Largest finite e4m3 value.
E4M3_MAX = 448.0
#: Block edge for weights and group width for activations.
BLOCK = 128
#: A block whose largest magnitude is below this is scaled as if it were this (no division by 0).
MIN_AMAX = 1e-12


def scale_shape(shape, rows: int = BLOCK, *, halves: bool = False) -> tuple[int, ...]:
    """The scale tensor's shape for an e4m3 tensor of ``shape``: 128-wide blocks along the last
    dim, ``rows``-tall along the one before (128 for weights, 1 for activations); with ``halves``
    the two halves of that dim blocked apart (:func:`moe_tutorial.quant.quantize_w13`)."""
    *lead, R, C = shape
    nr = 2 * math.ceil(R // 2 / rows) if halves else math.ceil(R / rows)
    return (*lead, nr, math.ceil(C / BLOCK))


def nan_codes(q: torch.Tensor) -> torch.Tensor:
    """Elementwise: is this e4m3 code a NaN (0x7F or 0xFF, the only two; e4m3fn has no infinity)?"""
    return (q.view(torch.uint8) & 0x7F) == 0x7F
