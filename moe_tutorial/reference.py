"""Float64 references that every implementation is tested against, and the error measure."""
from __future__ import annotations

import math

import torch

from .activation import silu_and_mul


def reference_moe_matmul(x: torch.Tensor, weight: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
    """``[M, topk, N]`` float64 on x's device: ``out[m, j] = weight[topk_ids[m, j]] @ x[m]``.

    Written straight from the definition, pair by expert, so it shares no code with the parts.
    """
    M, topk = topk_ids.shape
    N = weight.shape[1]
    out = torch.full((M * topk, N), float("nan"), dtype=torch.float64, device=x.device)
    pairs_expert = topk_ids.reshape(-1).long()
    for e in pairs_expert.unique().tolist():
        pairs = (pairs_expert == e).nonzero().flatten()
        out[pairs] = x[pairs // topk].double() @ weight[e].double().T
    return out.view(M, topk, N)


def reference_moe_layer(x, w13, w2, topk_weights, topk_ids) -> torch.Tensor:
    """``[M, K]`` float64: ``y[m] = sum_j w[m, j] * w2[e] @ (silu(gate) * up)``, e = topk_ids[m, j]."""
    M, topk = topk_ids.shape
    inter, hidden = w2.shape[2], w2.shape[1]
    h = silu_and_mul(reference_moe_matmul(x, w13, topk_ids))        # [M, topk, I] float64
    down = reference_moe_matmul(h.reshape(M * topk, inter), w2.double(), topk_ids.reshape(M * topk, 1))
    return (down.view(M, topk, hidden) * topk_weights.double()[..., None]).sum(dim=1)


#: rel_error compares tensors in slices of this many elements: a float64 copy of a whole
#: DeepSeek-V3 dW13 (7.5 G values) would need 56 GiB more than the GPU has beside it.
REL_ERROR_CHUNK = 1 << 26


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64; NaN anywhere in ``out`` gives ``inf``. Any shape, the
    two equal; the squares are summed in slices of :data:`REL_ERROR_CHUNK` elements."""
    if tuple(out.shape) != tuple(ref.shape):
        raise ValueError(f"out: expected shape {tuple(ref.shape)}, got {tuple(out.shape)}")
    out, ref = out.reshape(-1), ref.reshape(-1)
    diff2 = denom2 = 0.0
    for start in range(0, out.numel(), REL_ERROR_CHUNK):
        o = out[start:start + REL_ERROR_CHUNK].double().to(ref.device)
        r = ref[start:start + REL_ERROR_CHUNK].double()
        if not torch.isfinite(o).all():
            return float("inf")
        diff2 += (o - r).square().sum().item()
        denom2 += r.square().sum().item()
    return math.sqrt(diff2 / denom2) if denom2 else math.sqrt(diff2)


#: The FP8 layer on a GPU against :func:`reference_fp8_moe_layer`. That reference quantises the
#: intermediate exactly; the GPU's gate/up values differ from it by about 1e-3 (Hopper's FP8
#: tensor cores keep fewer bits than fp32 inside each 128-wide K step), and each value that lands
#: on the other side of an e4m3 rounding boundary moves by a whole e4m3 step (6-12%). Measured on
#: an H200: 1.2e-2 to 1.9e-2 on every shape (the interpreter, exact, stays under 1e-6).
FP8_LAYER_TOLERANCE = 3e-2


#: Relative errors below this are fp32 rounding; their digits depend on the CPU and the summation order.
ROUNDING_BOUND = 1e-6


def error_text(err: float) -> str:
    """A relative error as a stored output may show it, the same on every machine: "below 1e-6" at
    fp32 rounding level (whose digits depend on the CPU, the thread count and the order of a sum),
    else one significant digit ("3e-3"), two from 0.1 on ("0.98"), or "inf" where the output held
    NaN or inf."""
    if err < ROUNDING_BOUND:
        return f"below {ROUNDING_BOUND:.0e}".replace("e-0", "e-")
    if err < 0.1:
        return f"{err:.0e}".replace("e-0", "e-")
    return f"{err:.2g}"


def tolerance(dtype: torch.dtype) -> float:
    """Relative-error bound for a dtype: fp32 1e-5, bf16/fp16 1e-2 (tf32 dots land near 1e-3)."""
    return 1e-5 if dtype in (torch.float32, torch.float64) else 1e-2


def reference_fp8_moe_layer(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids) -> torch.Tensor:
    """``[M, K]`` float64: the FP8 layer's own steps, every one of them exact.

    x is quantised per token in 128-wide groups (:func:`moe_tutorial.quant.quantize_activations`),
    the experts' e4m3 weights are dequantised with their block scales, the gate/up GEMM and
    ``silu(gate) * up`` run in float64, and that intermediate is quantised the same way before the
    down GEMM, as the FP8 layer quantises it for its second GEMM. What remains between this and
    the kernels is fp32 accumulation and the odd rounding flip, not the quantisation itself.
    """
    from .quant import dequantize_activations, dequantize_weight, quantize_activations

    M, topk = topk_ids.shape
    inter = w2.shape[2]
    x_deq = dequantize_activations(*quantize_activations(x))
    h = silu_and_mul(reference_moe_matmul(x_deq, dequantize_weight(w13, w13_scale, halves=True), topk_ids))
    h_deq = dequantize_activations(*quantize_activations(h.reshape(M * topk, inter)))
    down = reference_moe_matmul(h_deq, dequantize_weight(w2, w2_scale), topk_ids.reshape(M * topk, 1))
    return (down.view(M, topk, -1) * topk_weights.double()[..., None]).sum(dim=1)


#: The names of the layer's differentiable inputs, in :func:`reference_moe_layer`'s order.
LAYER_GRAD_INPUTS = ("x", "w13", "w2", "topk_weights")


def reference_layer_grads(x, w13, w2, topk_weights, topk_ids, d_out) -> dict:
    """Autograd through :func:`reference_moe_layer` in float64: the gradients of
    ``<d_out, layer(...)>`` by input, ``{"x": [M, K], "w13": [E, 2I, K], "w2": [E, K, I],
    "topk_weights": [M, topk]}``, all float64 (``d_out`` ``[M, K]``, any float dtype)."""
    leaves = [t.detach().double().requires_grad_() for t in (x, w13, w2, topk_weights)]
    with torch.enable_grad():
        reference_moe_layer(*leaves, topk_ids).backward(d_out.double())
    return dict(zip(LAYER_GRAD_INPUTS, (t.grad for t in leaves)))
