"""Part 8: the sorted MoE layer with a backward pass, one ``torch.autograd.Function``.

Forward: the pairs aligned in token order (:mod:`moe_tutorial.kernels.stable_align`), the
gate/up GEMM that writes H (kept) and A (:func:`moe_tutorial.kernels.backward_kernel.rows_gemm_kernel`,
"save_swiglu", or with ``configs.up.gluon`` Part 4's Gluon kernel on a sorted copy of x), Part 4's
down GEMM with the router weights in its epilogue on A in sorted order, Part 4's topk sum. Kept for
the backward: x, H and the alignment (the weights and router weights are the caller's tensors,
referenced, not copied). A is dropped after the down GEMM.

Backward (:mod:`moe_tutorial.kernels.backward_kernel`): dA' with the dSwiGLU epilogue (dH, s * A
and the router gradient's partial sums), dW2 and dW13 as K-grouped GEMMs, dx as an M-grouped GEMM
and the topk sum. dO and x are first copied into sorted order, one at a time (unless
``configs.sorted_copies`` is False), so that the GEMMs reading them take whole tiles. Every sum
has a fixed order: two runs give the same bits.
"""
from __future__ import annotations

import torch
import triton

from ..checks import capturing, check_kernel_dtype, check_layer_inputs, finish_ids_check, start_ids_check
from .align import Alignment, gather_sorted_rows, max_padded_rows
from .backward_kernel import launch_expert_grad, launch_rows_gemm
from .gluon_kernel import gluon_gate_up
from .precompile import precompile as compile_side_by_side
from .sorted_layer import launch_fitted
from .stable_align import expert_rows, stable_align_block_size
from .tma import tma_stacks
from .topk_sum import topk_sum
from .training_configs import TrainingConfigs, in_tl, training_configs


def _forward(x, w13, w2, router, topk_ids, configs: TrainingConfigs):
    """``(out [M, K], H [M * topk, 2I] in pair order, alignment)``; ``router`` [M * topk] fp32."""
    M, K = x.shape
    topk, E, inter = topk_ids.shape[1], w13.shape[0], w2.shape[2]
    pairs = M * topk
    alignment = stable_align_block_size(topk_ids, configs.up.block_m, E)
    max_padded = alignment[0].numel()
    h = x.new_empty(pairs, 2 * inter)           # kept for the backward: one row per pair, no padding
    if configs.up.gluon:
        # Part 4's Gluon gate/up kernel on x's rows copied into sorted order, H saved by its epilogue.
        # The copy is dropped here and the backward makes its own for dW13: kept, it would add a sorted
        # x to what the layer saves.
        act = gluon_gate_up(x, w13, alignment, topk, configs.up, h=h)
    else:
        act = x.new_empty(max_padded, inter)
        launch_rows_gemm(x, w13, alignment, pairs, topk, configs.up, epilogue="save_swiglu", b_layout="nk", h=h,
                         act=act)
    down = x.new_empty(pairs, K)
    launch_fitted(act, w2, down, router, alignment, pairs, 1, configs.down, a_sorted=True)
    return topk_sum(down.view(M, topk, K)), h, alignment


class SortedMoEFunction(torch.autograd.Function):
    """``apply(x, w13, w2, topk_weights, topk_ids, configs)`` -> ``[M, K]``; gradients for x,
    w13, w2 and topk_weights (inputs checked by :func:`trainable_moe_layer`, which calls it)."""

    @staticmethod
    def forward(ctx, x, w13, w2, topk_weights, topk_ids, configs):
        x = x.contiguous()                    # the K-grouped dW13 reads x's rows with unit stride
        router = topk_weights.reshape(-1).float().contiguous()
        out, h, alignment = _forward(x, w13, w2, router, topk_ids, configs)
        ctx.save_for_backward(x, w13, w2, router, h, topk_ids, *alignment)
        ctx.configs, ctx.block_m, ctx.weights_dtype = configs, alignment.block_m, topk_weights.dtype
        return out

    @staticmethod
    def backward(ctx, d_out):
        x, w13, w2, router, h, topk_ids, *tensors = ctx.saved_tensors
        cfg = ctx.configs
        M, K = x.shape
        E, topk, inter = w13.shape[0], topk_ids.shape[1], w2.shape[2]
        pairs = M * topk
        alignment = Alignment(tensors, block_m=ctx.block_m, num_experts=E, topk_ids=topk_ids)
        need_x, need_w13, need_w2, need_s = ctx.needs_input_grad[:4]
        d_out = d_out.to(x.dtype).contiguous()
        copies = cfg.sorted_copies
        # [dA', dH, s*A and dS]
        # Sorted rows, padding included: the K-grouped GEMMs below read whole runs.
        max_padded = alignment[0].numel()
        dh = x.new_empty(max_padded, 2 * inter)
        s_act = x.new_empty(max_padded, inter)
        ds_partial = torch.empty(pairs, triton.cdiv(inter, cfg.dact.block_n), dtype=torch.float32, device=x.device)
        # With sorted copies, dO's rows are laid out once in sorted order, each row repeated for
        # its topk pairs: dA' and dW2 then read tiles, not one gathered row per pair.
        d_rows = gather_sorted_rows(d_out, alignment[0], pairs, topk) if copies else d_out
        launch_rows_gemm(d_rows, w2, alignment, pairs, topk, cfg.dact, epilogue="dswiglu", b_layout="kn",
                         a_sorted=copies, out=dh, h=h, act=s_act, router_weights=router, ds_partial=ds_partial)
        d_weights = ds_partial.sum(dim=1).view(M, topk).to(ctx.weights_dtype) if need_s else None
        # [the weight gradients]
        rows = expert_rows(alignment)
        dw2 = dw13 = dx = None
        if need_w2:
            dw2 = torch.empty(w2.shape, dtype=w2.dtype, device=w2.device)
            launch_expert_grad(d_rows, s_act, dw2, alignment, rows, pairs, topk, cfg.dw2,
                               left_sorted=copies, right_sorted=True)
        del d_rows, s_act                     # freed before x's sorted copy is made
        if need_w13:
            dw13 = torch.empty(w13.shape, dtype=w13.dtype, device=w13.device)
            x_rows = gather_sorted_rows(x, alignment[0], pairs, topk) if copies else x
            launch_expert_grad(dh, x_rows, dw13, alignment, rows, pairs, topk, cfg.dw13, left_sorted=True,
                               right_sorted=copies)
            del x_rows
        # [dx]
        if need_x:
            dx_rows = x.new_empty(pairs, K)
            launch_rows_gemm(dh, w13, alignment, pairs, 1, cfg.dx, epilogue="scatter", b_layout="kn", a_sorted=True,
                             out=dx_rows)
            dx = topk_sum(dx_rows.view(M, topk, K))
        return dx, dw13, dw2, d_weights, None, None


def trainable_moe_layer(x, w13, w2, topk_weights, topk_ids, *, configs: TrainingConfigs | None = None,
                        precompile: bool = True) -> torch.Tensor:
    """The layer of :func:`moe_tutorial.layer.moe_layer`, differentiable: gradients reach x, w13,
    w2 and topk_weights when they require them (``moe_layer(impl="sorted")`` calls this then).

    Args as :func:`moe_tutorial.layer.moe_layer` (fp32 in the interpreter; fp32/fp16/bf16 on a
    GPU, accumulated in fp32); ``configs`` a :class:`TrainingConfigs`, by default
    :func:`moe_tutorial.kernels.training_configs.training_configs`. With ``precompile`` (on a GPU,
    when a gradient is needed) the first call for these shapes compiles the step's kernels side by
    side before it runs (:func:`precompile_step`); False leaves each to compile at its first launch.
    Returns ``[M, K]`` in x's dtype.
    """
    M, K, inter, E, topk = check_layer_inputs(x, w13, w2, topk_weights, topk_ids, ids=False)
    check_kernel_dtype("x", x)
    if M == 0:
        # Nothing to compute; still tied to the inputs, so that a backward gives zeros, not an error.
        return x[:0] * 0 + (w13.sum() + w2.sum() + topk_weights.sum()) * 0
    # training_configs' choice is checked once, when first looked up; a caller's is checked here.
    if configs is not None:
        configs = configs.checked()
    else:
        configs = weights_fit(training_configs(M, E, K, inter, topk, x.dtype), w13, w2, M, topk)
    if precompile:
        precompile_step(x, w13, w2, topk_weights, topk_ids, configs)
    # The ids' range is read after the forward's kernels are queued, not before (a host wait
    # there left the GPU idle while the host queued them); the alignment drops a bad id, so
    # those kernels stay in bounds, and their output is dropped with the error.
    pending = start_ids_check(topk_ids, E)
    out = SortedMoEFunction.apply(x, w13, w2, topk_weights, topk_ids, configs)
    finish_ids_check(pending)
    return out


class _HandContext:
    """Stands in for autograd's ``ctx`` when :func:`step_by_hand` runs the Function's forward and
    backward itself."""

    def __init__(self, needs_input_grad):
        self.needs_input_grad = needs_input_grad

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors


def step_by_hand(x, w13, w2, topk_weights, topk_ids, configs: TrainingConfigs, d_out=None, needs=(True,) * 4):
    """:class:`SortedMoEFunction`'s forward, then its backward given ``d_out`` (uninitialised
    when None), called directly rather than through autograd: ``(out, (dx, dw13, dw2,
    d_topk_weights))``, a gradient None where ``needs`` (x, w13, w2, topk_weights) says False.
    Inputs as :func:`trainable_moe_layer` passes them; no checks."""
    ctx = _HandContext((*needs, False, False))
    out = SortedMoEFunction.forward(ctx, x.detach(), w13.detach(), w2.detach(), topk_weights.detach(), topk_ids,
                                    configs)
    grads = SortedMoEFunction.backward(ctx, torch.empty_like(out) if d_out is None else d_out)
    return out, grads[:4]


_precompiled: set = set()


def precompile_step(x, w13, w2, topk_weights, topk_ids, configs: TrainingConfigs) -> int:
    """Compile the kernels of a forward and backward with these inputs side by side, before the
    first such step runs them (:mod:`moe_tutorial.kernels.precompile`): a dry pass of
    :func:`step_by_hand`, which launches nothing. Only on a GPU, with a gradient needed, once per
    process for each set of shapes, strides, dtypes and configs. Returns the launches the dry
    pass made (0 when it did not run)."""
    needs = tuple(t.requires_grad for t in (x, w13, w2, topk_weights))
    if not (torch.is_grad_enabled() and any(needs)) or capturing(x):     # off a GPU, precompile does nothing
        return 0
    key = (configs, needs, x.device, *((t.shape, t.stride(), t.dtype) for t in (x, w13, w2, topk_weights, topk_ids)))
    if key in _precompiled:
        return 0
    launches = compile_side_by_side(lambda: step_by_hand(x, w13, w2, topk_weights, topk_ids, configs, needs=needs),
                                    x.device)
    _precompiled.add(key)
    return launches


def weights_fit(configs: TrainingConfigs, w13: torch.Tensor, w2: torch.Tensor, M: int, topk: int) -> TrainingConfigs:
    """``configs`` as the tables chose them, with the gate/up GEMM and dA' in ``tl`` where their Gluon
    kernels cannot read ``w13`` or ``w2`` as it lies (:func:`~moe_tutorial.kernels.tma.tma_stacks`):
    the tables are measured on contiguous weights, and a caller's strided weights should run, not fail."""
    unreadable = [name for name, w in (("up", w13), ("dact", w2)) if not tma_stacks(w)]
    return in_tl(configs, M, w2.shape[0], topk, unreadable, w2.element_size())


def saved_bytes(M: int, E: int, hidden: int, inter: int, topk: int, block_m: int, itemsize: int = 2) -> dict:
    """What one layer keeps for its backward, in bytes, by tensor: ``x``, ``H`` (one row per pair)
    and the alignment (at the host-side bound of its padded rows); beside them (not kept) what
    saving Y and A instead of recomputing would add. The weights are the model's and not counted."""
    pairs = M * topk
    padded = max_padded_rows(pairs, block_m, E)
    return {
        "x": M * hidden * itemsize,
        "H": pairs * 2 * inter * itemsize,
        "alignment": 4 * (padded + triton.cdiv(padded, block_m) + 1),
        "A (recomputed)": pairs * inter * itemsize,
        "Y (never formed)": pairs * hidden * itemsize,
    }
