"""Part 8: the backward of the SwiGLU activation, the one piece of arithmetic both dA' kernels share.

``rows_gemm_kernel``'s "dswiglu" epilogue (``tl``, :mod:`moe_tutorial.kernels.backward_kernel`) and
the Gluon dA' kernel's epilogue warps (:mod:`moe_tutorial.kernels.gluon_dact_kernel`) call it on
their fp32 tiles: a Gluon kernel can call a ``triton.jit`` function.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def dswiglu_epilogue(dact, gate, up, s):
    """The backward of ``a = silu(gate) * up`` on fp32 tiles, and the router weight ``s`` [rows].

    Returns ``(d_gate, d_up, s * a, a)``: with sigma the sigmoid, silu(g) = g * sigma(g) and
    silu'(g) = sigma(g) * (1 + g * (1 - sigma(g))), so d_gate = s * dA' * up * silu'(g) and
    d_up = s * dA' * silu(g).
    """
    sig = tl.sigmoid(gate)
    silu = gate * sig
    a = silu * up
    d_gate = dact * up * sig * (1.0 + gate * (1.0 - sig)) * s[:, None]
    d_up = dact * silu * s[:, None]
    return d_gate, d_up, a * s[:, None], a
