"""Block-scaled FP8 (e4m3), the way DeepSeek-V3-class checkpoints are served: the float64 reference.

FP8 e4m3 has 4 exponent bits and 3 mantissa bits; its largest finite value is 448 and it has no
infinity. To fit real numbers into it, each block of numbers gets one fp32 **scale**, chosen so
that the block's largest magnitude lands on 448:

- **weights** ``[..., N, K]``: one scale per 128 x 128 block, scales ``[..., ceil(N/128), ceil(K/128)]``;
- **activations** ``[M, K]``: one scale per token and 128-wide group along K, scales
  ``[M, ceil(K/128)]``.

``scale = amax / 448`` over the block (or group), ``q = round_to_e4m3(value / scale)``, and the
value is given back as ``q * scale`` (a DeepSeek-V3 checkpoint calls that factor
``weight_scale_inv``: it multiplies, undoing the division). Shapes not divisible by 128 are
handled: the last block along a dimension is partial, and its scale comes from the elements it
has. A block of zeros gets the scale ``MIN_AMAX / 448`` instead of 0, so nothing divides by zero
and it dequantises to exact zeros.

These functions compute in float64 on any device; the layer's Triton kernels quantise activations
themselves (:mod:`moe_tutorial.kernels.fp8_quant`) and are tested against these.
"""
from __future__ import annotations

import math

import torch

from .checks import check_fp8_pair, check_tensor, fail
from .fp8_format import BLOCK, E4M3_MAX, FP8_DTYPE, MIN_AMAX, scale_shape

#: The format's constants and checks, importable from here as before (they live in fp8_format and checks).
__all__ = ["FP8_DTYPE", "E4M3_MAX", "BLOCK", "MIN_AMAX", "scale_shape", "check_fp8_pair", "quantize_weight",
           "quantize_w13", "quantize_activations", "dequantize_weight", "dequantize_activations", "quantize_rowwise",
           "dequantize_rowwise"]


#: Elements handled at once where a whole layer's experts would need a temporary copy of every weight.
_CHUNK = 1 << 26


def _block_amax(t: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Largest magnitude of each ``rows x cols`` block of the last two dims, float64, the last
    blocks partial; shape ``[..., ceil(R/rows), ceil(C/cols)]``."""
    *lead, R, C = t.shape
    nr, nc = math.ceil(R / rows), math.ceil(C / cols)
    padded = t.new_zeros(*lead, nr * rows, nc * cols, dtype=torch.float64)
    padded[..., :R, :C] = t.abs()
    return padded.view(*lead, nr, rows, nc, cols).amax(dim=(-3, -1))


def _expand(scale: torch.Tensor, rows: int, cols: int, R: int, C: int) -> torch.Tensor:
    """Each block's scale repeated over the block's elements: ``[..., R, C]``."""
    return scale.repeat_interleave(rows, dim=-2)[..., :R, :].repeat_interleave(cols, dim=-1)[..., :C]


@torch.no_grad()
def _quantize(t: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    # No autograd: from an nn.Parameter the graph would keep the float64 copies (8 bytes a weight) alive.
    t = t.detach()
    if t.numel() == 0:                  # no experts, rows or columns: nothing to scale
        return (torch.empty(t.shape, dtype=FP8_DTYPE, device=t.device),
                torch.empty(scale_shape(t.shape, rows), dtype=torch.float32, device=t.device))
    if t.dim() >= 3 and t[0].numel() * 8 < t.numel() and t.numel() > _CHUNK:
        # A layer's experts in float64 would take 8 bytes per weight at once: a few at a time.
        step = max(1, _CHUNK // t[0].numel())
        parts = [_quantize(t[i:i + step], rows, cols) for i in range(0, t.shape[0], step)]
        return torch.cat([q for q, _ in parts]), torch.cat([s for _, s in parts])
    scale = (_block_amax(t, rows, cols).clamp_min(MIN_AMAX) / E4M3_MAX).float()
    full = _expand(scale.double(), rows, cols, *t.shape[-2:])
    q = (t.double() / full).clamp(-E4M3_MAX, E4M3_MAX).to(FP8_DTYPE)
    return q, scale


def _check_float(name: str, t, min_dim: int) -> None:
    if not isinstance(t, torch.Tensor):
        fail(TypeError, name, "a torch.Tensor", type(t).__name__)
    if t.dim() < min_dim:
        fail(ValueError, name, f"a tensor of at least {min_dim} dims", f"shape {tuple(t.shape)}")
    if not t.is_floating_point() or t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
        fail(TypeError, name, "an fp32, fp16, bf16 or fp64 tensor to quantise", t.dtype)
    # along the first dim, _CHUNK elements at a time: DeepSeek-V3's w13 in one piece would need a 7 GB
    # bool copy, more than an 80 GB card has beside the layer's weights
    step = max(1, _CHUNK * max(1, t.shape[0]) // max(1, t.numel()))
    if not all(bool(torch.isfinite(t[i:i + step]).all()) for i in range(0, t.shape[0], step)):
        fail(ValueError, name, "finite values (NaN or Inf has no e4m3 block scale)", "NaN or Inf")


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise weights in 128 x 128 blocks of their last two dims.

    Args:
        w: ``[..., N, K]`` float (``[E, N, K]`` for a layer's experts, ``[N, K]`` for one).

    Returns:
        ``(q, scale)``: ``q`` e4m3 of w's shape, ``scale`` fp32 ``[..., ceil(N/128), ceil(K/128)]``,
        with ``w ~= q * scale`` block by block (:func:`dequantize_weight`).
    """
    _check_float("w", w, 2)
    return _quantize(w, BLOCK, BLOCK)


def quantize_w13(w13: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise a layer's ``[E, 2I, K]`` gate/up weights with the gate and the up halves blocked
    apart, as checkpoints store them (one ``gate_proj`` and one ``up_proj`` per expert).

    Returns ``(q [E, 2I, K] e4m3, scale [E, 2 * ceil(I/128), ceil(K/128)] fp32)``: the gate
    half's scale rows, then the up half's. When 128 divides I this is :func:`quantize_weight`'s
    result; when it does not, no block straddles the two halves.
    """
    _check_float("w13", w13, 3)
    if w13.shape[-2] % 2:
        fail(ValueError, "w13", "an even second dim 2*I (gate rows then up rows)", f"shape {tuple(w13.shape)}")
    inter = w13.shape[-2] // 2
    (qg, sg), (qu, su) = _quantize(w13[..., :inter, :], BLOCK, BLOCK), _quantize(w13[..., inter:, :], BLOCK, BLOCK)
    return torch.cat([qg, qu], dim=-2), torch.cat([sg, su], dim=-2)


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise activations per token in groups of 128 along K.

    Args:
        x: ``[M, K]`` float.

    Returns:
        ``(q [M, K] e4m3, scale [M, ceil(K/128)] fp32)``, ``x ~= q * scale`` group by group.
    """
    _check_float("x", x, 2)
    check_tensor("x", x, 2)
    return _quantize(x, 1, BLOCK)


def quantize_rowwise(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise with one scale per row of the last two dims ("rowwise"): what CUTLASS's FP8 grouped
    GEMM behind ``torch._scaled_grouped_mm`` takes on Hopper, for a token's row of x and for each
    output column of an expert's weights. No scale changes along K, so that kernel has nothing to
    promote inside its K loop: an easier problem than the 128 x 128 blocks, kept only as an anchor.

    Args:
        t: ``[..., R, C]`` float (``[M, K]`` activations, ``[E, N, K]`` weights).

    Returns:
        ``(q, scale)``: ``q`` e4m3 of t's shape, ``scale`` fp32 ``[..., R]``, ``t ~= q * scale[..., None]``.
    """
    _check_float("t", t, 2)
    q, scale = _quantize(t, 1, max(1, t.shape[-1]))
    return q, scale[..., 0]


def dequantize_rowwise(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``q * scale`` row by row, float64; ``q`` and ``scale`` as :func:`quantize_rowwise` returns them."""
    return q.double() * scale.double()[..., None]


def dequantize_weight(q: torch.Tensor, scale: torch.Tensor, *, halves: bool = False) -> torch.Tensor:
    """``q * scale`` block by block, float64: the weights the FP8 kernels multiply by.

    ``q`` ``[..., N, K]`` e4m3 and ``scale`` as :func:`quantize_weight` returns it, or, with
    ``halves=True``, as :func:`quantize_w13` returns it (gate and up blocked apart).
    """
    check_fp8_pair("q", q, "scale", scale, rows=BLOCK, halves=halves)
    if halves:
        inter = q.shape[-2] // 2
        rows = scale.shape[-2] // 2
        return torch.cat([dequantize_weight(q[..., :inter, :], scale[..., :rows, :]),
                          dequantize_weight(q[..., inter:, :], scale[..., rows:, :])], dim=-2)
    return q.double() * _expand(scale.double(), BLOCK, BLOCK, *q.shape[-2:])


def dequantize_activations(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``q * scale`` group by group, float64 ``[M, K]``; ``q`` and ``scale`` as
    :func:`quantize_activations` returns them."""
    check_fp8_pair("q", q, "scale", scale, rows=1)
    return q.double() * _expand(scale.double(), 1, BLOCK, *q.shape[-2:])
