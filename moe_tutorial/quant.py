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

from .checks import capturing, check_tensor, fail

#: The FP8 format the series uses: e4m3 without infinities ("fn"), largest finite value 448.
FP8_DTYPE = torch.float8_e4m3fn
#: Largest finite e4m3 value.
E4M3_MAX = 448.0
#: Block edge for weights and group width for activations.
BLOCK = 128
#: A block whose largest magnitude is below this is scaled as if it were this (no division by 0).
MIN_AMAX = 1e-12


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


def _quantize(t: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    if t.dim() >= 3 and t[0].numel() * 8 < t.numel() and t.numel() > 1 << 26:
        # A layer's experts in float64 would take 8 bytes per weight at once: a few at a time.
        step = max(1, (1 << 26) // t[0].numel())
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
    if not torch.isfinite(t).all():
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


def scale_shape(shape, rows: int = BLOCK, *, halves: bool = False) -> tuple[int, ...]:
    """The scale tensor's shape for an e4m3 tensor of ``shape``: 128-wide blocks along the last
    dim, ``rows``-tall along the one before (128 for weights, 1 for activations); with ``halves``
    the two halves of that dim blocked apart (:func:`quantize_w13`)."""
    *lead, R, C = shape
    nr = 2 * math.ceil(R // 2 / rows) if halves else math.ceil(R / rows)
    return (*lead, nr, math.ceil(C / BLOCK))


def check_fp8_pair(name: str, q, scale_name: str, scale, *, rows: int, halves: bool = False) -> None:
    """An e4m3 tensor and its fp32 scales, as the FP8 kernels take them; errors name what is wrong.

    ``q`` must be ``torch.float8_e4m3fn`` (e5m2, with 2 mantissa bits, is another format); ``scale``
    a finite, positive fp32 tensor of :func:`scale_shape` on q's device.
    """
    if not isinstance(q, torch.Tensor):
        fail(TypeError, name, "a torch.Tensor", type(q).__name__)
    if q.dtype == torch.float8_e5m2:
        fail(TypeError, name, "torch.float8_e4m3fn (e4m3: 3 mantissa bits, the format of block-scaled "
              "checkpoints; e5m2 has 2 and a different range)", q.dtype)
    if q.dtype != FP8_DTYPE:
        fail(TypeError, name, "torch.float8_e4m3fn (quantise it first: moe_tutorial.quant)", q.dtype)
    if scale is None:
        fail(ValueError, scale_name, f"the fp32 block scales of {name} (FP8 values mean nothing without them)",
              "None")
    if not isinstance(scale, torch.Tensor):
        fail(TypeError, scale_name, "a torch.Tensor", type(scale).__name__)
    if scale.dtype != torch.float32:
        fail(TypeError, scale_name, "torch.float32", scale.dtype)
    if q.dim() < 2:
        fail(ValueError, name, "a tensor of at least 2 dims", f"shape {tuple(q.shape)}")
    expected = scale_shape(q.shape, rows, halves=halves)
    if tuple(scale.shape) != expected:
        block = "128 x 128 block" if rows == BLOCK else "token and 128-wide group"
        fail(ValueError, scale_name, f"shape {expected} (one scale per {block} of {name} {tuple(q.shape)})",
              f"shape {tuple(scale.shape)}")
    if scale.device != q.device:
        fail(ValueError, scale_name, f"{name}'s device {q.device}", scale.device)
    if scale.numel() and not capturing(scale) and not bool((torch.isfinite(scale) & (scale > 0)).all()):
        fail(ValueError, scale_name, "finite, positive scales", "NaN, Inf, zero or negative scales")
