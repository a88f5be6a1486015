"""The Tensor Memory Accelerator's side of the launchers: what it can read, and the descriptors.

TMA, Hopper's engine for bulk copies between global and shared memory, reads a tile through a
*tensor descriptor* (a base, a shape, strides and the tile's shape) while the threads do other
work. The kernels of Parts 4, 7 and 8 take a descriptor over the experts' weights, stacked as one
matrix of rows (``[E, R, C]`` read as ``[E * R, C]``), and over rows in sorted order; where TMA
cannot read a tensor they get None and load through pointers instead. The Gluon kernels build
their own descriptor class over the same stacked view (:func:`stacked_rows`).
"""
from __future__ import annotations

import torch
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import runtime


def tma_can_read(t: torch.Tensor) -> bool:
    """TMA needs a Hopper GPU (compute capability 9+), unit stride along the last dimension and
    16-byte aligned rows; otherwise the kernels fall back to pointer loads."""
    if runtime.INTERPRETED or not t.is_cuda or torch.cuda.get_device_capability(t.device)[0] < 9:
        return False
    return t.stride(-1) == 1 and (t.stride(-2) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0


def stacked_rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` ``[E, R, C]`` as ``[E * R, C]``: expert ``e``'s row ``r`` is row ``e * R + r``. Only for
    experts that lie one after another with unit column stride (:func:`weight_descriptor` checks)."""
    E, R, C = t.shape
    return t.as_strided((E * R, C), (t.stride(1), 1))


def tma_stacks(t: torch.Tensor) -> bool:
    """Whether TMA can read ``t`` ``[E, R, C]`` as :func:`stacked_rows`: :func:`tma_can_read`, and the
    experts one after another (``[E, C, R]`` memory transposed back, say, does not)."""
    return tma_can_read(t) and t.stride(0) == t.shape[1] * t.stride(1)


def weight_descriptor(b: torch.Tensor, block_shape) -> TensorDescriptor | None:
    """A TMA descriptor over ``b`` ``[E, R, C]`` read as ``[E * R, C]`` in ``block_shape`` tiles, or
    None where TMA cannot read it that way (:func:`tma_stacks`)."""
    if not tma_stacks(b):
        return None
    return TensorDescriptor.from_tensor(stacked_rows(b), list(block_shape))


def rows_descriptor(t: torch.Tensor, block_shape) -> TensorDescriptor | None:
    """A TMA descriptor over the rows of ``t`` ``[R, C]`` (activations in sorted order) in
    ``block_shape`` tiles, or None where TMA cannot read it."""
    if not tma_can_read(t):
        return None
    return TensorDescriptor.from_tensor(t, list(block_shape))


__all__ = ["tma_can_read", "stacked_rows", "tma_stacks", "weight_descriptor", "rows_descriptor"]
