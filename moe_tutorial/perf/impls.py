"""What the bench times for each implementation, prepared so that only the work itself is timed.

Each ``first_*`` / ``layer_*`` function takes a :class:`Inputs` and returns a :class:`Prepared`: one callable
per rotation of the inputs (the same work on different tokens and routings, so a CUDA graph of
many calls does not find the last call's weights in L2), and how to turn the first call's
return value into the canonical output for the correctness check. Anything that is set up once
in a real engine (output buffers, the sorted alignment for the "sorted" row, the x rows sorted
by expert for ``torch._grouped_mm``) is built here, outside the timed region.

When an implementation cannot run, its function raises :class:`Skip` with the reason.
:mod:`moe_tutorial.perf.registry` names, labels and colours each implementation and points at
these functions.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import torch

from .. import runtime
from ..activation import silu_and_mul
from ..indexing import indexing_moe_matmul, intermediate_bytes
from ..kernels import sorted_layer  # its launcher through the module: tests replace it
from ..kernels.align import SMALL_BATCH_PAIRS, align_block_size, max_padded_rows
from ..kernels.configs import KernelConfig, get_config, heuristic_config
from ..kernels.fused_kernel import fused_moe_matmul
from ..kernels.minimal_sorted_kernel import minimal_sorted_moe_matmul
from ..kernels.sorted_layer import sorted_moe_layer
from ..layer import moe_layer
from ..loop import loop_moe_matmul
from ..shapes import ModelShape

#: Elements past which int32 offsets wrap.
INT32_LIMIT = 2 ** 31


class Skip(Exception):
    """This implementation does not run on this case; the message says why."""


@dataclass
class Inputs:
    """One case's tensors. ``xs``, ``ids`` and ``weights`` hold one entry per rotation."""

    shape: ModelShape
    M: int
    dtype: torch.dtype
    w13: torch.Tensor                     # [E, 2I, K], also the first GEMM's weight
    w2: torch.Tensor | None               # [E, K, I], only for the layer
    xs: list[torch.Tensor]                # [M, K] each
    ids: list[torch.Tensor]               # [M, topk] int32 each
    weights: list[torch.Tensor]           # [M, topk] fp32 router weights each

    @property
    def touched(self) -> float:
        """Distinct experts the routings use (mean over rotations): what the floor must read."""
        return sum(int(torch.unique(i).numel()) for i in self.ids) / len(self.ids)


@dataclass
class Prepared:
    """``calls[r]()`` does rotation r's work; ``output(calls[0]())`` is the result to check."""

    calls: list[Callable[[], Any]]
    output: Callable[[Any], torch.Tensor] = lambda ret: ret
    graphable: bool = True                 # False: syncs with the host, no CUDA graph
    buffers: list[torch.Tensor] = field(default_factory=list)   # poisoned before the check
    #: ``reference(rows)``: the float64 rows to check against, where the bench's own (of the bf16
    #: inputs) is not the right one: the FP8 rows are checked against their dequantised inputs.
    reference: Callable[[torch.Tensor], torch.Tensor] | None = None


def free_memory_bytes() -> int:
    """Free device memory: ``torch.cuda.mem_get_info`` on a GPU, physical RAM on the CPU."""
    if runtime.ON_GPU:
        return torch.cuda.mem_get_info()[0]
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_indexing_fits(M: int, topk: int, N: int, K: int, itemsize: int, fraction: float = 1 / 3) -> None:
    """Raise :class:`Skip` when Part 2's ``[M, topk, N, K]`` intermediate would not fit.

    A third of the free memory: timing may hold three copies at once (the checked call's, the
    CUDA-graph warm-up's on another stream, and the graph's own pool).
    """
    need = intermediate_bytes(M, topk, N, K, itemsize) + M * topk * N * itemsize
    free = free_memory_bytes()
    if need > fraction * free:
        raise Skip(f"its [M, topk, N, K] intermediate needs {_size(need)}, "
                   f"more than {fraction:.0%} of the {_size(free)} free")


def _size(nbytes: float) -> str:
    """Bytes in GB, or MB below 0.1 GB: '30.1 GB', '0.54 MB'."""
    return f"{nbytes / 1e9:.1f} GB" if nbytes >= 1e8 else f"{nbytes / 1e6:.2f} MB"


def _rotations(inp: Inputs, fn: Callable) -> list[Callable]:
    return [lambda r=r: fn(inp.xs[r], inp.ids[r], inp.weights[r]) for r in range(len(inp.xs))]


# ---------------------------------------------------------------- the first GEMM, [M, topk, N]

def first_loop(inp: Inputs) -> Prepared:
    return Prepared(_rotations(inp, lambda x, ids, _: loop_moe_matmul(x, inp.w13, ids)), graphable=False)


def first_indexing(inp: Inputs) -> Prepared:
    E, N, K = inp.w13.shape
    check_indexing_fits(inp.M, inp.shape.topk, N, K, inp.w13.element_size())
    return Prepared(_rotations(inp, lambda x, ids, _: indexing_moe_matmul(x, inp.w13, ids)))


def first_published(inp: Inputs) -> Prepared:
    try:
        from ..kernels.published_kernel import published_fused_moe_matmul
    except ImportError as e:
        raise Skip(f"moe_tutorial.kernels.published_kernel is not available ({e})") from None
    topk = inp.shape.topk
    if topk & (topk - 1):
        raise Skip(f"topk={topk} is not a power of two: the published tl.arange(0, topk * BLOCK_N) "
                   "does not compile")
    if inp.w13.numel() >= INT32_LIMIT and inp.w13.storage_offset() < INT32_LIMIT:
        # bench.make_weights puts a guard in front of such weights; without one, don't run it.
        raise Skip(f"wrong results: its int32 offsets wrap past 2^31 weight elements (this weight has "
                   f"{inp.w13.numel():.2e}); not run, since the wrapped addresses may lie before "
                   "the tensor and crash the process")
    out = inp.xs[0].new_empty(inp.M, topk, inp.w13.shape[1])
    return Prepared(_rotations(inp, lambda x, ids, _: published_fused_moe_matmul(x, inp.w13, ids, out=out)),
                    buffers=[out])


def first_fused(inp: Inputs) -> Prepared:
    out = inp.xs[0].new_empty(inp.M, inp.shape.topk, inp.w13.shape[1])
    return Prepared(_rotations(inp, lambda x, ids, _: fused_moe_matmul(x, inp.w13, ids, out=out)),
                    buffers=[out])


def first_sorted(inp: Inputs, *, align_inside: bool = False, heuristic: bool = False, config=None) -> Prepared:
    """Part 4's first GEMM with the tuned configuration, the heuristic's (``heuristic``), or
    ``config``; alignment outside the timed calls unless ``align_inside``."""
    E, N, K = inp.w13.shape
    M, topk = inp.M, inp.shape.topk
    if config is None:
        config = (heuristic_config(M, topk, E, "plain", N=N) if heuristic
                  else get_config(M, E, N, K, topk, inp.dtype, "plain"))
    out = inp.xs[0].new_empty(M * topk, N)
    if align_inside:
        def run(x, ids, _):
            alignment = align_block_size(ids, config.block_m, E)
            sorted_layer.launch_sorted_gemm(x, inp.w13, out, None, alignment, M * topk, topk, config)
            return out
        calls = _rotations(inp, run)
    else:
        alignments = [align_block_size(ids, config.block_m, E) for ids in inp.ids]
        calls = [lambda r=r: sorted_layer.launch_sorted_gemm(inp.xs[r], inp.w13, out, None, alignments[r], M * topk,
                                                              topk, config)
                 for r in range(len(inp.xs))]
    return Prepared(calls, output=lambda _: out.view(M, topk, N), buffers=[out])


# ------------------------------------------- Part 4 built up: each production step on its own

#: The first GEMM's production steps, in the order notebook 04 adds them. Each step keeps all
#: the steps before it: "+tuned" is the grouped-order kernel with tuned tiles, and so on; the
#: last step, short tails, gives "sorted".
FIRST_STEPS = ("minimal", "+grouped", "+tuned", "+tma")


def first_step(step: str):
    """Prepare the first GEMM as Part 4 stands after ``step`` (one of :data:`FIRST_STEPS`).

    minimal: the minimal kernel (2-D grid in row-major order, pointer loads) with the heuristic's
    tiles, warps and stages; +grouped: the production kernel (grouped order), same tiles, no TMA,
    no short tails; +tuned: the tuned table's tiles, still without TMA and short tails; +tma: the
    tuned configuration with its TMA choice, without short tails. None of them runs the persistent
    grid, whatever the table says: that is the last step ("persistent"). Alignment outside the timing.
    """
    if step not in FIRST_STEPS:
        raise ValueError(f"step: expected one of {', '.join(FIRST_STEPS)}, got {step!r}")

    def prepare(inp: Inputs) -> Prepared:
        E, N, K = inp.w13.shape
        M, topk = inp.M, inp.shape.topk
        config = heuristic_config(M, topk, E, "plain", N=N) if step in ("minimal", "+grouped") else \
            get_config(M, E, N, K, topk, inp.dtype, "plain")
        # The persistent grid is the step after these (it has its own row, "persistent").
        config = replace(config, short_tails=False, persistent=False, use_tma=config.use_tma and step == "+tma")
        if step != "minimal":
            return first_sorted(inp, config=config)
        alignments = [align_block_size(ids, config.block_m, E) for ids in inp.ids]
        out = inp.xs[0].new_empty(M, topk, N)
        calls = [lambda r=r: minimal_sorted_moe_matmul(
            inp.xs[r], inp.w13, inp.ids[r], block_m=config.block_m, block_n=config.block_n,
            block_k=config.block_k, alignment=alignments[r], out=out,
            num_warps=config.num_warps, num_stages=config.num_stages) for r in range(len(inp.xs))]
        return Prepared(calls, output=lambda _: out, buffers=[out])
    return prepare


#: The whole layer's production steps (alignment included, as in every layer row): no fused
#: epilogue; + the router weights in the down GEMM's epilogue (what vLLM's Triton path does);
#: + SiLU(gate) * up in the gate/up GEMM's epilogue; + the one-launch alignment of decode
#: batches; + sorted activations (the gate/up GEMM leaves its rows in sorted order, the down GEMM
#: reads them as they lie, through TMA at prefill). The last step, the topk sum as one Triton
#: launch instead of torch's sum, gives "sorted".
LAYER_STEPS = ("unfused", "+router-epilogue", "+silu-epilogue", "+decode-align", "+sorted-act")


def layer_step(step: str):
    """Prepare the whole layer as Part 4 stands after ``step`` (one of :data:`LAYER_STEPS`); tuned
    configurations throughout; the three-launch alignment for every batch before "+decode-align"."""
    if step not in LAYER_STEPS:
        raise ValueError(f"step: expected one of {', '.join(LAYER_STEPS)}, got {step!r}")
    rung = LAYER_STEPS.index(step)

    def prepare(inp: Inputs) -> Prepared:
        s = inp.shape
        E, topk, H, inter, M = s.num_experts, s.topk, s.hidden, s.intermediate, inp.M
        pairs = M * topk
        gated = rung >= LAYER_STEPS.index("+silu-epilogue")
        small = SMALL_BATCH_PAIRS if rung >= LAYER_STEPS.index("+decode-align") else 0
        cfg_up = get_config(M, E, inter if gated else 2 * inter, H, topk, inp.dtype, "gated" if gated else "plain")
        cfg_up = replace(cfg_up, persistent=False)     # the plain up GEMM as the table had it before that step
        cfg_down = get_config(M, E, H, inter, topk, inp.dtype, "down")
        sorted_act = step == "+sorted-act" and cfg_down.block_m == cfg_up.block_m
        up_rows = max_padded_rows(pairs, cfg_up.block_m, E) if sorted_act else pairs
        up = inp.xs[0].new_empty(up_rows, inter if gated else 2 * inter)
        down = inp.xs[0].new_empty(pairs, H)

        def run(x, ids, w):
            a_up = align_block_size(ids, cfg_up.block_m, E, small_batch_pairs=small)
            a_down = a_up if cfg_down.block_m == cfg_up.block_m else \
                align_block_size(ids, cfg_down.block_m, E, small_batch_pairs=small)
            sorted_layer.launch_sorted_gemm(x, inp.w13, up, None, a_up, pairs, topk, cfg_up, gated=gated,
                                             c_sorted=sorted_act)
            act = up if gated else silu_and_mul(up)
            router = w.reshape(-1).float().contiguous()
            if step == "unfused":
                sorted_layer.launch_sorted_gemm(act, inp.w2, down, None, a_down, pairs, 1, cfg_down)
                return (down.view(M, topk, H) * w[..., None].to(down.dtype)).sum(dim=1)
            sorted_layer.launch_sorted_gemm(act, inp.w2, down, router, a_down, pairs, 1, cfg_down, a_sorted=sorted_act)
            return down.view(M, topk, H).sum(dim=1)
        return Prepared(_rotations(inp, run))
    return prepare


def grouped_mm_support(dtype: torch.dtype) -> str | None:
    """None if ``torch._grouped_mm`` can run here in ``dtype``, else the reason it cannot."""
    if not hasattr(torch, "_grouped_mm"):
        return f"this torch ({torch.__version__}) has no torch._grouped_mm"
    if not runtime.ON_GPU:
        return "torch._grouped_mm is timed on a CUDA GPU of compute capability 9.0+ (sm90) only"
    major, minor = torch.cuda.get_device_capability()
    if major < 9:
        return f"torch._grouped_mm needs sm90+, this GPU is sm{major}{minor}"
    if dtype != torch.bfloat16:
        return f"torch._grouped_mm takes bf16 only, not {str(dtype).replace('torch.', '')}"
    return None


def sort_rows_by_expert(x: torch.Tensor, topk_ids: torch.Tensor, num_experts: int):
    """``(x_sorted [M*topk, K], offs int32 [E], order [M*topk])`` for a grouped GEMM.

    ``order`` lists the flat pairs ``m * topk + j`` expert by expert; ``x_sorted[i]`` is the
    token row of pair ``order[i]``; ``offs[e]`` is where expert e's rows end.
    """
    topk = topk_ids.shape[1]
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    offs = torch.cumsum(torch.bincount(flat, minlength=num_experts), 0).to(torch.int32)
    return x[order // topk].contiguous(), offs, order


def first_grouped_mm(inp: Inputs) -> Prepared:
    reason = grouped_mm_support(inp.dtype)
    if reason:
        raise Skip(reason)
    E, N, K = inp.w13.shape
    M, topk = inp.M, inp.shape.topk
    w_t = inp.w13.transpose(1, 2)           # [E, K, N], a view: "column-major" B as cuBLAS likes
    sorted_inputs = [sort_rows_by_expert(x, ids, E) for x, ids in zip(inp.xs, inp.ids)]
    calls = [lambda xs=xs, offs=offs: torch._grouped_mm(xs, w_t, offs=offs) for xs, offs, _ in sorted_inputs]
    order = sorted_inputs[0][2]

    def unsort(ret):
        out = ret.new_empty(M * topk, N)
        out[order] = ret
        return out.view(M, topk, N)
    return Prepared(calls, output=unsort)


def scaled_grouped_mm_support() -> str | None:
    """None if ``torch._scaled_grouped_mm`` (FP8, rowwise scales) can run here, else why not."""
    if not hasattr(torch, "_scaled_grouped_mm"):
        return f"this torch ({torch.__version__}) has no torch._scaled_grouped_mm"
    if not runtime.ON_GPU:
        return "torch._scaled_grouped_mm is timed on a CUDA GPU of compute capability 9.0 (Hopper) only"
    if torch.cuda.get_device_capability() != (9, 0):
        major, minor = torch.cuda.get_device_capability()
        return f"torch._scaled_grouped_mm with rowwise FP8 scales runs on sm90 only, this GPU is sm{major}{minor}"
    return None


def first_scaled_grouped_mm(inp: Inputs, fast_accum: bool = True) -> Prepared:
    """CUTLASS's FP8 grouped GEMM through ``torch._scaled_grouped_mm``: x and the weights quantised
    with one scale per row (:func:`moe_tutorial.quant.quantize_rowwise`, once, outside the timing),
    x's rows pre-sorted by expert as for ``torch._grouped_mm``. With one scale along all of K the
    kernel promotes nothing inside its loop, so it is an anchor for what an FP8 grouped GEMM reaches
    on the shape, not a rival to Part 7's 128 x 128 blocks. ``fast_accum`` False asks for CUTLASS's
    periodic promotion of the tensor cores' sums into fp32. Checked against float64 on its own
    dequantised inputs; ``[M, topk, N]`` bf16."""
    from ..quant import FP8_DTYPE, dequantize_rowwise, quantize_rowwise
    from ..reference import reference_moe_matmul

    if reason := scaled_grouped_mm_support():
        raise Skip(reason)
    cache = inp.__dict__.setdefault("_fp8_rowwise", {})
    if "w13" not in cache:
        cache["w13"] = quantize_rowwise(inp.w13)
    wq, ws = cache["w13"]
    E, N, K = wq.shape
    M, topk = inp.M, inp.shape.topk
    w_t = wq.transpose(1, 2)                    # [E, K, N] "column-major", as CUTLASS takes B
    quantised = [quantize_rowwise(x) for x in inp.xs]
    runs = []
    for (xq, xs), ids in zip(quantised, inp.ids):
        # e4m3 rows moved as bytes: indexing needs no float8 kernel that way
        a, offs, order = sort_rows_by_expert(xq.view(torch.uint8), ids, E)
        runs.append((a.view(FP8_DTYPE), xs[order // topk].contiguous(), offs, order))
    calls = [lambda a=a, s=s, offs=offs: torch._scaled_grouped_mm(a, w_t, s, ws, offs=offs, out_dtype=torch.bfloat16,
                                                                  use_fast_accum=fast_accum)
             for a, s, offs, _ in runs]
    order = runs[0][3]

    def unsort(ret):
        out = ret.new_empty(M * topk, N)
        out[order] = ret
        return out.view(M, topk, N)

    def reference(rows):
        used, local = _used_experts(inp.ids[0][rows])
        xq, xs = quantised[0]
        return reference_moe_matmul(dequantize_rowwise(xq[rows], xs[rows]), dequantize_rowwise(wq[used], ws[used]),
                                    local)
    return Prepared(calls, output=unsort, reference=reference)


# ---------------------------------------------------------------- the whole layer, [M, K]

def layer_of(impl: str):
    def prepare(inp: Inputs) -> Prepared:
        if impl == "indexing":
            E, N13, K = inp.w13.shape
            check_indexing_fits(inp.M, inp.shape.topk, N13, K, inp.w13.element_size())
        return Prepared(_rotations(inp, lambda x, ids, w: moe_layer(x, inp.w13, inp.w2, w, ids, impl=impl)),
                        graphable=impl != "loop")
    return prepare


def layer_sorted_heuristic(inp: Inputs) -> Prepared:
    s = inp.shape
    configs = (heuristic_config(inp.M, s.topk, s.num_experts, "gated", N=s.intermediate),
               heuristic_config(inp.M, s.topk, s.num_experts, "down", N=s.hidden))
    return Prepared(_rotations(inp, lambda x, ids, w: sorted_moe_layer(x, inp.w13, inp.w2, w, ids, configs=configs)))


def persistent_of(config: KernelConfig) -> KernelConfig:
    """``config`` run by the persistent kernel (short tails have no place there)."""
    return replace(config, persistent=True, short_tails=False)


def first_persistent(inp: Inputs) -> Prepared:
    """Part 4's first GEMM with the tuned tiles, computed by the persistent grid."""
    E, N, K = inp.w13.shape
    return first_sorted(inp, config=persistent_of(get_config(inp.M, E, N, K, inp.shape.topk, inp.dtype, "plain")))


def layer_persistent(inp: Inputs) -> Prepared:
    """Part 4's layer with the down GEMM on the persistent grid (the gate/up GEMM as tuned: with
    two accumulators per tile it lost on the persistent grid, measurements/gpu-notes.md)."""
    s = inp.shape
    configs = (get_config(inp.M, s.num_experts, s.intermediate, s.hidden, s.topk, inp.dtype, "gated"),
               persistent_of(get_config(inp.M, s.num_experts, s.hidden, s.intermediate, s.topk, inp.dtype, "down")))
    return Prepared(_rotations(inp, lambda x, ids, w: sorted_moe_layer(x, inp.w13, inp.w2, w, ids, configs=configs)))


GLUON_TALL_TILES = "the Gluon kernel takes tiles of 64 rows or more (one warpgroup MMA is 64 rows)"


def gluon_support(dtype: torch.dtype) -> str | None:
    """Why the Gluon kernel cannot run this case, or None."""
    from ..kernels import gluon_kernel
    if gluon_kernel.UNAVAILABLE:
        return gluon_kernel.UNAVAILABLE
    return None if dtype in (torch.bfloat16, torch.float16) else f"the Gluon kernel takes bf16/fp16, not {dtype}"


def first_gluon(inp: Inputs) -> Prepared:
    """The first GEMM with the Gluon kernel (persistent, warp-specialised): x gathered into sorted
    order (inside the timed call), then one launch; the tuned table's tiles."""
    from ..kernels.gluon_kernel import gather_sorted_rows, launch_gluon_gemm
    if reason := gluon_support(inp.dtype):
        raise Skip(reason)
    E, N, K = inp.w13.shape
    M, topk = inp.M, inp.shape.topk
    config = get_config(M, E, N, K, topk, inp.dtype, "plain")
    if config.block_m < 64:
        raise Skip(GLUON_TALL_TILES)
    out = inp.xs[0].new_empty(M * topk, N)
    alignments = [align_block_size(ids, config.block_m, E) for ids in inp.ids]

    def run(r):
        a = gather_sorted_rows(inp.xs[r], alignments[r][0], M * topk, topk)
        launch_gluon_gemm(a, inp.w13, out, None, alignments[r], M * topk, config)
    return Prepared([lambda r=r: run(r) for r in range(len(inp.xs))], output=lambda _: out.view(M, topk, N),
                    buffers=[out])


def layer_gluon(inp: Inputs) -> Prepared:
    """The layer with the down GEMM on the Gluon kernel: Part 4's gate/up GEMM leaves its rows in
    sorted order, which is what TMA needs; router weights in the Gluon epilogue; then the sum."""
    from ..kernels.gluon_kernel import launch_gluon_gemm
    from ..kernels.topk_sum import topk_sum
    if reason := gluon_support(inp.dtype):
        raise Skip(reason)
    s = inp.shape
    E, topk, H, inter, M = s.num_experts, s.topk, s.hidden, s.intermediate, inp.M
    cfg_up = get_config(M, E, inter, H, topk, inp.dtype, "gated")
    cfg_down = replace(get_config(M, E, H, inter, topk, inp.dtype, "down"), block_m=cfg_up.block_m)
    if cfg_up.block_m < 64:
        raise Skip(GLUON_TALL_TILES)
    pairs = M * topk

    def run(x, ids, w):
        alignment = align_block_size(ids, cfg_up.block_m, E)
        act = x.new_empty(alignment[0].numel(), inter)
        sorted_layer.launch_sorted_gemm(x, inp.w13, act, None, alignment, pairs, topk, cfg_up, gated=True,
                                         c_sorted=True)
        down = x.new_empty(pairs, H)
        launch_gluon_gemm(act, inp.w2, down, w.reshape(-1).float().contiguous(), alignment, pairs, cfg_down)
        return topk_sum(down.view(M, topk, H))
    return Prepared(_rotations(inp, run))


def gluon_layer_with(inp: Inputs, configs) -> Prepared:
    """The bf16 layer wholly on the Gluon kernel (:func:`~moe_tutorial.kernels.gluon_kernel.gluon_layer`:
    x gathered, the gated GEMM, the down GEMM, the sum) with the ``(gate/up, down)`` configs given."""
    from ..kernels.gluon_kernel import gluon_layer
    if reason := gluon_support(inp.dtype):
        raise Skip(reason)
    up, down = configs
    s = inp.shape
    return Prepared(_rotations(inp, lambda x, ids, w: gluon_layer(
        x, inp.w13, inp.w2, w, align_block_size(ids, up.block_m, s.num_experts), s.topk, up, down)))


# ------------------------------------------------------- Part 7: block-scaled FP8 experts

def fp8_experts(inp: Inputs, layer: bool):
    """The case's weights in block FP8, quantised once per case (outside any timing): for the first
    GEMM ``(w13_q, w13_scale)`` blocked as one ``[E, 2I, K]`` weight, for the layer
    ``(w13_q, w13_scale, w2_q, w2_scale)`` with gate and up blocked apart."""
    from ..checks import check_fp8_runtime
    from ..quant import quantize_w13, quantize_weight

    try:                                        # both FP8 rows need a runtime that runs e4m3
        check_fp8_runtime()
    except RuntimeError as e:
        raise Skip(str(e)) from None
    cache = inp.__dict__.setdefault("_fp8", {})
    if layer not in cache:
        cache.clear()                           # one copy at a time: Kimi-K2's is 16 GB
        cache[layer] = (*quantize_w13(inp.w13), *quantize_weight(inp.w2)) if layer else quantize_weight(inp.w13)
    return cache[layer]


def _used_experts(ids: torch.Tensor):
    """``(used, local)``: the experts ``ids`` name, and ``ids`` renumbered into them."""
    used = torch.unique(ids)
    return used, torch.searchsorted(used, ids.long()).to(torch.int32)


def first_fp8(inp: Inputs, config=None, kernel: str | None = None) -> Prepared:
    """Part 7's FP8 first GEMM on e4m3 activations quantised beforehand (their bytes and scales
    are the floor's); checked against float64 on the dequantised inputs. ``kernel`` "tl" keeps to
    the ``tl`` kernel where the table would take the Gluon one."""
    from ..kernels.align import align_block_size
    from ..kernels.configs import fp8_config
    from ..kernels.fp8_layer import launch_fp8_gemm, out_dtype
    from ..kernels.fp8_quant import quantize_rows
    from ..quant import dequantize_activations, dequantize_weight
    from ..reference import reference_moe_matmul

    wq, ws = fp8_experts(inp, layer=False)
    E, N, K = wq.shape
    M, topk = inp.M, inp.shape.topk
    config = config or fp8_config(M, E, N, K, topk, "plain", kernel=kernel)
    quantised = [quantize_rows(x) for x in inp.xs]
    alignments = [align_block_size(ids, config.block_m, E) for ids in inp.ids]
    out = torch.empty(M * topk, N, dtype=out_dtype(), device=wq.device)
    calls = [lambda r=r: launch_fp8_gemm(*quantised[r], wq, ws, out, alignments[r], M * topk, topk, config)
             for r in range(len(inp.xs))]

    def reference(rows):
        used, local = _used_experts(inp.ids[0][rows])
        xq, xs = quantised[0]
        return reference_moe_matmul(dequantize_activations(xq[rows], xs[rows]),
                                    dequantize_weight(wq[used], ws[used]), local)
    return Prepared(calls, output=lambda _: out.view(M, topk, N), buffers=[out], reference=reference)


#: Part 7's first GEMM built up (notebook 07), all on the ``tl`` kernel: the heuristic's tiles with
#: pointer loads, then swapped operands for row blocks under 64, then weights through TMA (the tl
#: heuristic as shipped); "fp8-tl" adds the tuned tiles ("fp8" may take the Gluon kernel instead).
FP8_STEPS = ("fp8-step0", "fp8+swap", "fp8+tma")


def step_config(step: str, M: int, topk: int, E: int, N: int, K: int | None = None):
    """The ``tl`` kernel's configuration for ``step``: the tl heuristic's (never the Gluon kernel's,
    which the plain heuristic takes for large experts on Hopper), less what later steps add."""
    from dataclasses import replace

    from ..kernels.configs import fp8_heuristic_config

    config = fp8_heuristic_config(M, topk, E, "plain", N=N, K=K, kernel="tl")
    return replace(config, swap_ab=config.swap_ab and step != "fp8-step0", use_tma=step == "fp8+tma")


def first_fp8_step(step: str):
    """Prepare the FP8 first GEMM as Part 7 stands after ``step`` (one of :data:`FP8_STEPS`)."""
    if step not in FP8_STEPS:
        raise ValueError(f"step: expected one of {', '.join(FP8_STEPS)}, got {step!r}")

    def prepare(inp: Inputs) -> Prepared:
        s = inp.shape
        config = step_config(step, inp.M, s.topk, s.num_experts, 2 * s.intermediate, s.hidden)
        return first_fp8(inp, config=config)
    return prepare


def layer_fp8(inp: Inputs, configs=None, kernel: str | None = None) -> Prepared:
    """Part 7's whole FP8 layer (x quantised inside, as an engine runs it); checked against the
    float64 layer that takes the same quantisation steps (reference_fp8_moe_layer). ``kernel``
    "tl" keeps both GEMMs on the ``tl`` kernel."""
    from ..kernels.fp8_layer import fp8_moe_layer, layer_configs
    from ..reference import reference_fp8_moe_layer

    q13, s13, q2, s2 = fp8_experts(inp, layer=True)
    s = inp.shape
    if kernel is not None and configs is None:
        configs = layer_configs(inp.M, s.num_experts, s.intermediate, s.hidden, s.topk, kernel=kernel)

    def reference(rows):
        used, local = _used_experts(inp.ids[0][rows])
        return reference_fp8_moe_layer(inp.xs[0][rows].float(), q13[used], s13[used], q2[used], s2[used],
                                       inp.weights[0][rows], local)
    return Prepared(_rotations(inp, lambda x, ids, w: fp8_moe_layer(x, q13, s13, q2, s2, w, ids, configs=configs)),
                    reference=reference)


# ---------------------------------------------------- Part 8: the layer's forward + backward

def grouped_mm_layer(x, w13, w2, topk_weights, topk_ids):
    """The layer as a composition of PyTorch operations around ``torch._grouped_mm``, the way
    torchtitan writes it, differentiable by autograd: x's rows gathered in expert order, the
    gate/up grouped GEMM, ``silu(gate) * up``, the down grouped GEMM, the router weights, and the
    sum back into each token's row with ``index_add_``. ``[M, K]`` in x's dtype (bf16, sm90+).

    ``torch._grouped_mm(mat_a [rows, K], mat_b [E, K, N], offs=int32 group ends)``; the weights
    go in as transposed views, so autograd reaches w13 and w2 themselves.
    """
    M, topk = topk_ids.shape
    E = w13.shape[0]
    inter = w2.shape[2]
    flat = topk_ids.reshape(-1).long()
    order = torch.argsort(flat, stable=True)
    # histc, not bincount: no wait on the host for the output size (torchtitan counts so too).
    counts = torch.histc(flat.float(), bins=E, min=-0.5, max=E - 0.5)
    offs = torch.cumsum(counts, 0).to(torch.int32)
    token = order // topk
    h = torch._grouped_mm(x[token], w13.transpose(1, 2), offs=offs)              # [pairs, 2I]
    act = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
    y = torch._grouped_mm(act, w2.transpose(1, 2), offs=offs)                    # [pairs, K]
    y = y * topk_weights.reshape(-1)[order, None].to(y.dtype)
    return torch.zeros_like(x).index_add_(0, token, y)


def liger_support() -> str | None:
    """None if Liger-Kernel's ``fused_moe`` can be imported here, else why not."""
    if not runtime.ON_GPU:
        return "Liger-Kernel's fused_moe runs on a CUDA GPU only"
    try:
        from liger_kernel.ops.fused_moe import LigerFusedMoEFunction  # noqa: F401  (optional package)
    except ImportError as e:
        return f"liger-kernel is not installed ({e})"
    return None


def liger_layer(x, w13, w2, topk_weights, topk_ids):
    """Liger-Kernel's ``LigerFusedMoEFunction.apply(x, gate_up_proj [E, 2I, K], down_proj [E, K, I],
    top_k_index [M, topk] int32, top_k_weights [M, topk])`` (liger-kernel 0.8.5): the same layout
    as the series' w13 (gate rows then up rows) and w2."""
    from liger_kernel.ops.fused_moe import LigerFusedMoEFunction  # optional package
    return LigerFusedMoEFunction.apply(x, w13, w2, topk_ids.to(torch.int32), topk_weights.to(x.dtype))


def step_grad(inp: Inputs) -> torch.Tensor:
    """The gradient of the layer's output that every "step" row backpropagates: ``[M, K]`` in the
    case's dtype, made once per case from a fixed seed (so the check has one reference)."""
    cache = inp.__dict__.setdefault("_step", {})
    if "d_out" not in cache:
        g = torch.Generator(device=runtime.DEVICE).manual_seed(7 + inp.M)
        cache["d_out"] = torch.randn(inp.M, inp.shape.hidden, generator=g, device=runtime.DEVICE, dtype=inp.dtype)
    return cache["d_out"]


def step_of(layer: Callable, *, graphable: bool = True, support: Callable[[Inputs], str | None] = lambda inp: None):
    """Prepare the layer's forward + backward: ``layer(x, w13, w2, topk_weights, topk_ids)`` with
    autograd on and every float input a leaf, then ``torch.autograd.grad`` of :func:`step_grad`;
    the call returns dx, which the bench checks on a few rows against float64."""
    def prepare(inp: Inputs) -> Prepared:
        if reason := support(inp):
            raise Skip(reason)
        d_out = step_grad(inp)
        w13, w2 = inp.w13.detach().requires_grad_(), inp.w2.detach().requires_grad_()   # views: no copy

        def run(x, ids, w):
            x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
            return torch.autograd.grad(layer(x, w13, w2, w, ids), (x, w13, w2, w), d_out)[0]
        return Prepared(_rotations(inp, run), graphable=graphable)
    return prepare


def _indexing_fits(inp: Inputs) -> str | None:
    E, N13, K = inp.w13.shape
    try:
        check_indexing_fits(inp.M, inp.shape.topk, N13, K, inp.w13.element_size(), fraction=1 / 6)
    except Skip as e:
        return str(e)
    return None


def step_layer(impl: str):
    """``moe_layer(impl=...)``'s forward + backward ("loop", "indexing", "sorted": Part 8's kernels)."""
    def layer(x, w13, w2, w, ids):
        return moe_layer(x, w13, w2, w, ids, impl=impl)
    return step_of(layer, graphable=impl != "loop", support=_indexing_fits if impl == "indexing" else lambda inp: None)


step_grouped_mm = step_of(grouped_mm_layer, support=lambda inp: grouped_mm_support(inp.dtype))
step_liger = step_of(liger_layer, support=lambda inp: liger_support())

