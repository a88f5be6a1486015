"""Checkers for Part 7, block-scaled FP8: quantise one block, and the scaled K loop."""
from __future__ import annotations

import torch

from ..quant import (
    BLOCK,
    E4M3_MAX,
    FP8_DTYPE,
    MIN_AMAX,
    dequantize_activations,
    dequantize_weight,
    quantize_activations,
    quantize_weight,
)
from ..reference import rel_error
from .feedback import Fail, call_student, on, run_check


def _block_cases():
    """``(what, block)``: blocks that tell the usual mistakes apart."""
    g = torch.Generator().manual_seed(7)
    neg = torch.randn(128, 128, generator=g)
    neg[3, 5] = -40.0                          # the largest magnitude is negative
    small = torch.randn(128, 128, generator=g) * 1e-3
    ragged = torch.randn(100, 37, generator=g) * 5   # a partial last block of a weight
    zeros = torch.zeros(128, 128)
    wide = torch.randn(128, 128, generator=g) * torch.logspace(-3, 2, 128)[None, :]
    # The largest magnitude in a corner: an amax that skips a row or a column of the block misses it.
    first, last = torch.rand(128, 128, generator=g), torch.rand(100, 37, generator=g) - 0.5
    first[0, 0], last[-1, -1] = 9.0, -9.0
    tiny = torch.randn(128, 128, generator=g) * 1e-12           # amax about 4e-12: above the floor, far below 1e-8
    below = torch.randn(64, 64, generator=g) * 1e-14            # amax about 4e-14: below the floor, which applies
    return [("a 128 x 128 block of randn", torch.randn(128, 128, generator=g)),
            ("a block whose largest magnitude is negative (-40)", neg),
            ("a block of values near 1e-3 (far below 448: it must be scaled up)", small),
            ("a partial block, 100 x 37, as at the edge of a weight", ragged),
            ("values spread over five decades", wide),
            ("a block whose largest magnitude is at [0, 0]", first),
            ("a partial block whose largest magnitude is at its last element [99, 36]", last),
            (TINY, tiny),
            ("a block of zeros (the scale must stay finite and positive)", zeros),
            (BELOW_FLOOR, below)]


#: Labels of the 7.1 blocks whose largest magnitude is tiny: above the 1e-12 floor, and below it.
TINY = "a block whose largest magnitude is tiny (about 4e-12, above the 1e-12 floor)"
BELOW_FLOOR = "a block whose largest magnitude is below the 1e-12 floor (about 4e-14)"


def _scale_slip(s: float, block: torch.Tensor, want: float) -> str:
    """Why the scale ``s`` is not ``want``, when it matches a known slip; else ``""``."""
    R, C = block.shape
    mags = block.abs()
    parts = {"row 0": mags[1:], f"the last row ({R - 1})": mags[:-1], "column 0": mags[:, 1:],
             f"the last column ({C - 1})": mags[:, :-1]}
    for what, rest in parts.items():
        if rest.numel() and abs(s - max(float(rest.max()), MIN_AMAX) / E4M3_MAX) <= 1e-6 * s:
            return (f"your amax skips {what} of the block, where its largest magnitude is: take the largest "
                    "magnitude over every element (block.abs().max())")
    amax = float(mags.max())
    floor = s * E4M3_MAX
    if amax < MIN_AMAX and abs(floor - amax) <= 1e-6 * amax:
        return (f"this block's largest magnitude, {amax:.3g}, is below the floor {MIN_AMAX:g}: the scale must be "
                f"max(amax, {MIN_AMAX:g}) / 448, so a floor applies to tiny blocks too, not only to all-zero ones")
    if floor > 1.5 * max(amax, MIN_AMAX):
        return (f"amax * 448 would be {floor:.3g}, above this block's largest magnitude {amax:.3g}: is your floor "
                f"larger than {MIN_AMAX:g}? Floor amax at {MIN_AMAX:g}, so that only blocks below it use the floor")
    return ""


def check_quantize_block(fn) -> bool:
    """Exercise 7.1: ``fn(block [R, C] float32) -> (q [R, C] float8_e4m3fn, scale: 0-dim float32)``,
    ``scale = amax / 448`` (amax the largest magnitude; a tiny floor for all-zero blocks) and
    ``q = round(block / scale)`` in e4m3, clamped to +-448."""
    def body():
        cases = _block_cases()
        for what, block in cases:
            with on(what):
                out = call_student(fn, block, names=("block",))
                if not isinstance(out, tuple) or len(out) != 2:
                    raise Fail(f"expected a pair (q, scale), got {type(out).__name__}")
                q, scale = out
                if not isinstance(q, torch.Tensor) or q.dtype != FP8_DTYPE:
                    raise Fail(f"q: expected a torch.float8_e4m3fn tensor, got "
                               f"{getattr(q, 'dtype', type(q).__name__)} (cast with .to(torch.float8_e4m3fn))")
                if tuple(q.shape) != tuple(block.shape):
                    raise Fail(f"q: expected the block's shape {tuple(block.shape)}, got {tuple(q.shape)}")
                scale = torch.as_tensor(scale)
                if scale.numel() != 1 or scale.dtype != torch.float32:
                    raise Fail(f"scale: expected one float32 number, got {scale.numel()} of {scale.dtype}")
                s = float(scale)
                want_q, want_s = (t[0] for t in quantize_weight(block[None]))
                want = float(want_s.flatten()[0])
                amax = float(block.abs().max())
                if not (s > 0 and torch.isfinite(scale)):
                    raise Fail(f"scale: expected a finite, positive number, got {s} (an all-zero block still needs "
                               "one: floor amax at a tiny value before dividing)")
                if amax > 0 and abs(s - amax) <= 1e-6 * amax:
                    raise Fail(f"scale is amax ({amax:.4g}): it should be amax / {E4M3_MAX:g}, so that the largest "
                               "magnitude lands on e4m3's largest value, 448, not on 1")
                if amax > 0 and abs(s - float(block.max()) / E4M3_MAX) < 1e-6 * s and abs(s - want) > 1e-6 * want:
                    raise Fail("scale comes from the largest value, not the largest magnitude: take block.abs().max()")
                if amax > 0 and abs(s - want) > 1e-5 * want:
                    slip = _scale_slip(s, block, want)
                    raise Fail(f"scale: expected max(amax, 1e-12) / 448 = {want:.6g}, got {s:.6g}"
                               + (f": {slip}" if slip else ""))
                deq = q.double() * s
                if not torch.isfinite(deq).all():
                    raise Fail("q holds NaN: values past +-448 do not saturate when cast; clamp block / scale to "
                               "[-448, 448] first")
                err = rel_error(deq, block.double()) if amax > 0 else float(deq.abs().max())
                want_err = rel_error(want_q.double() * want, block.double()) if amax > 0 else 0.0
                if err > want_err * 1.05 + 1e-12:
                    raise Fail(f"q * scale is {err:.2e} away from the block (relative), a correct rounding gives "
                               f"{want_err:.2e}: divide by the scale (not multiply) and round to the nearest e4m3 "
                               "value, which .to(torch.float8_e4m3fn) does")
        return (f"right on all {len(cases)} blocks: signs, tiny values, the largest magnitude in a corner, "
                "partial and all-zero blocks included.")
    return run_check("7.1", body)


def _loop_cases():
    g = torch.Generator().manual_seed(11)
    out = []
    for what, (M, N, K) in (("one 128-wide group", (4, 8, 128)), ("three groups", (5, 6, 384)),
                            ("K = 300: a partial last group", (3, 4, 300)), ("one token", (1, 130, 256))):
        # Groups of very different size, so that a scale applied to the wrong group shows.
        groups = (K + BLOCK - 1) // BLOCK
        a = torch.randn(M, K, generator=g) * torch.logspace(-2, 2, groups).repeat_interleave(BLOCK)[:K]
        w = torch.randn(N, K, generator=g) * torch.logspace(1, -1, groups).repeat_interleave(BLOCK)[:K]
        aq, as_ = quantize_activations(a)
        wq, ws = quantize_weight(w)
        out.append((f"{what} (M={M}, N={N}, K={K})", aq, as_, wq, ws))
    return out


def check_scaled_matmul(fn) -> bool:
    """Exercise 7.2: ``fn(a_q [M, K] e4m3, a_scale [M, ceil(K/128)], w_q [N, K] e4m3, w_scale
    [ceil(N/128), ceil(K/128)]) -> [M, N] float32``: each 128-wide K group's product of the e4m3
    values, times that group's activation scales (per row) and weight-block scales (per column),
    accumulated in float32."""
    def body():
        cases = _loop_cases()
        for what, aq, as_, wq, ws in cases:
            with on(what):
                out = call_student(fn, aq, as_, wq, ws, names=("a_q", "a_scale", "w_q", "w_scale"))
                M, N = aq.shape[0], wq.shape[0]
                if not isinstance(out, torch.Tensor) or tuple(out.shape) != (M, N):
                    raise Fail(f"expected an [M, N] = {(M, N)} tensor, got "
                               f"{tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__}")
                if out.dtype != torch.float32:
                    raise Fail(f"expected float32 sums, got {out.dtype} (accumulate in float32: the e4m3 products "
                               "are promoted into float32 every group)")
                a = dequantize_activations(aq, as_)
                want = a @ dequantize_weight(wq, ws).T
                err = rel_error(out, want)
                if err < 1e-5:
                    continue
                plain = aq.double() @ wq.double().T
                if rel_error(out, plain) < 1e-5:
                    raise Fail("the scales were never applied: each group's product must be multiplied by "
                               "a_scale[:, g] and w_scale[n // 128, g]")
                once = plain * as_.double().mean(1, keepdim=True) * ws.double().mean(1).repeat_interleave(BLOCK)[:N]
                if rel_error(out, once) < 1e-3:
                    raise Fail("the scales were applied once, after the whole K sum: they change every 128 along K, "
                               "so each group's product needs its own")
                no_w = a @ wq.double().T
                if rel_error(out, no_w) < 1e-5:
                    raise Fail("the weight-block scales are missing (the activation scales are there)")
                raise Fail(f"relative error {err:.2e} against the dequantised product: check which scale column "
                           "each group takes (g = k // 128) and which weight-block row each output column takes "
                           "(n // 128)")
        return f"right on all {len(cases)} problems: several groups, a partial last group and one token included."
    return run_check("7.2", body)
