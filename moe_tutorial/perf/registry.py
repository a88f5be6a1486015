"""Every implementation the series measures, in one table: its name, how readers see it, how to run it.

One :class:`Implementation` per row. ``name`` is what CSV files, the ``bench --impls`` option and
(for the four layers) ``moe_layer(impl=...)`` call it; ``label`` is what figures and tables show
readers; ``first`` and ``layer`` prepare the timed calls (:mod:`moe_tutorial.perf.impls`). To add
an implementation, write its ``first_*`` / ``layer_*`` functions there and add one row here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import impls


@dataclass(frozen=True)
class Implementation:
    """One implementation of the first GEMM and/or the whole layer."""

    name: str
    label: str
    color: str
    help: str
    first: Callable | None = None       # Inputs -> Prepared, for the [M, topk, N] GEMM
    layer: Callable | None = None       # Inputs -> Prepared, for the whole layer
    step: Callable | None = None        # Inputs -> Prepared, the layer's forward + backward (bench --backward)
    linestyle: str = "-"
    in_default_sweep: bool = True       # False: timed only when named (``bench --impls``)
    precision: str = "bf16"             # "fp8": e4m3 experts, judged against the FP8 floor

    def prepare(self, gemm: str, inp):
        """The :class:`moe_tutorial.perf.impls.Prepared` calls for ``gemm`` ("first" or "layer")."""
        builder = {"first": self.first, "layer": self.layer, "step": self.step}.get(gemm)
        if builder is None:
            raise ValueError(f"impl: {self.name!r} has no {gemm!r} variant")
        return builder(inp)

    @property
    def style(self) -> dict:
        """``plot`` keywords: colour, line style and label."""
        return {"color": self.color, "ls": self.linestyle, "label": self.label}


IMPLEMENTATIONS: tuple[Implementation, ...] = (
    Implementation(
        "loop", "Part 1, loop", "#9c755f",
        "Part 1, a Python loop over experts (one GEMM launch per expert; host syncs)",
        first=impls.first_loop, layer=impls.layer_of("loop"), step=impls.step_layer("loop")),
    Implementation(
        "indexing", "Part 2, indexing", "#e15759",
        "Part 2, weight[topk_ids] then one broadcast matmul (skipped when its [M, topk, N, K] "
        "intermediate would not fit)",
        first=impls.first_indexing, layer=impls.layer_of("indexing"), step=impls.step_layer("indexing")),
    Implementation(
        "published", "Part 3, as published", "#bab0ac",
        "Part 3's kernel as the seed article published it (skipped where topk is not a power of two: it "
        "does not compile; 'wrong' on DeepSeek-V3, whose int32 offsets wrap)",
        first=impls.first_published),
    Implementation(
        "fused", "Part 3, fixed", "#f28e2b",
        "Part 3's kernel with the article's faults fixed (moe_tutorial.fused_moe_matmul)",
        first=impls.first_fused, layer=impls.layer_of("fused")),
    Implementation(
        "sorted", "Part 4, tuned", "#4e79a7",
        "Part 4's kernel with the tuned table, the GEMM alone: align_block_size runs outside the timed region; "
        "its forward + backward (bench --backward) runs Part 8's kernels",
        first=impls.first_sorted, layer=impls.layer_of("sorted"), step=impls.step_layer("sorted")),
    Implementation(
        "sorted+align", "Part 4, tuned, alignment timed", "#b07aa1",
        "Part 4's kernel with align_block_size inside the timed region",
        first=lambda inp: impls.first_sorted(inp, align_inside=True), linestyle=":"),
    Implementation(
        "sorted-heuristic", "Part 4, heuristic only", "#76b7b2",
        "Part 4's kernel with the untuned heuristic configuration (shows what `tune` gained; in the "
        "default list only where a tuned table exists)",
        first=lambda inp: impls.first_sorted(inp, heuristic=True), layer=impls.layer_sorted_heuristic,
        linestyle="--"),
    Implementation(
        "persistent", "Part 4, persistent grid", "#e15759",
        "Part 4's tiles (tuned table, no short tails) computed by one program per SM walking the tile list "
        "(moe_tutorial/kernels/persistent_kernel.py)",
        first=impls.first_persistent, layer=impls.layer_persistent, linestyle="-", in_default_sweep=False),
    Implementation(
        "gluon", "Part 4, Gluon: persistent, warp-specialised", "#9c755f",
        "a Gluon kernel (moe_tutorial/kernels/gluon_kernel.py): one TMA load warp and the MMA warps hand "
        "tiles over through mbarriers; x gathered into sorted order first (timed); the layer's down GEMM "
        "(Hopper GPU only)", first=impls.first_gluon, layer=impls.layer_gluon, linestyle="-", in_default_sweep=False),
    Implementation(
        "grouped_mm", "torch._grouped_mm", "#59a14f",
        "torch._grouped_mm on x rows pre-sorted by expert (needs a GPU of sm90+ and bf16); with --backward, the "
        "layer as a composition around it (gate/up, SiLU * up, down, weighted sum) and autograd's backward",
        first=impls.first_grouped_mm, step=impls.step_grouped_mm),
    Implementation(
        "cutlass-fp8", "torch._scaled_grouped_mm (CUTLASS), FP8 rowwise", "#2ca02c",
        "CUTLASS's FP8 grouped GEMM (torch._scaled_grouped_mm, Hopper only) on x rows pre-sorted by expert, "
        "one scale per row of x and per output column of the weights: nothing to promote along K, an anchor "
        "for what an FP8 grouped GEMM reaches on the shape", first=impls.first_scaled_grouped_mm,
        precision="fp8", linestyle="--", in_default_sweep=False),
    Implementation(
        "liger", "Liger-Kernel fused_moe", "#8c564b",
        "Liger-Kernel's fused_moe (LigerFusedMoEFunction, pip install liger-kernel), forward + backward only "
        "(bench --backward; skipped where it is not installed or there is no GPU)",
        step=impls.step_liger),
    Implementation(
        "fp8", "Part 7, block FP8", "#d62728",
        "Part 7's kernels on e4m3 experts with 128 x 128 block scales (activations quantised per token "
        "in 128-wide groups; the layer quantises them inside), the tl or the Gluon kernel per M as the "
        "tuned table says; judged against the FP8 floor",
        first=impls.first_fp8, layer=impls.layer_fp8, precision="fp8"),
    Implementation(
        "fp8-tl", "Part 7, tl kernel only (tuned)", "#ff7f0e",
        "Part 7's tl kernel with its tuned tiles at every M: what the Gluon kernel is measured against",
        first=lambda inp: impls.first_fp8(inp, kernel="tl"), layer=lambda inp: impls.layer_fp8(inp, kernel="tl"),
        precision="fp8", in_default_sweep=False),
    # Part 7 built up (notebook 07): each keeps the steps before it; tuned tiles give "fp8".
    Implementation(
        "fp8-step0", "Part 7 step 0: FP8 kernel, pointer loads", "#ff9896",
        "Part 7's kernel with the heuristic's tiles, pointer loads, operands never swapped",
        first=impls.first_fp8_step("fp8-step0"), precision="fp8", linestyle=":", in_default_sweep=False),
    Implementation(
        "fp8+swap", "Part 7 step 1: + swapped operands under 64 rows", "#c49c94",
        "step 0 with row blocks under 64 computed transposed (the weights fill the 64-row tensor-core tile)",
        first=impls.first_fp8_step("fp8+swap"), precision="fp8", linestyle="--", in_default_sweep=False),
    Implementation(
        "fp8+tma", "Part 7 step 2: + TMA weight loads (heuristic)", "#f7b6d2",
        "step 1 with the weights through the Tensor Memory Accelerator: the untuned heuristic",
        first=impls.first_fp8_step("fp8+tma"), precision="fp8", linestyle="-.", in_default_sweep=False),
    # Part 4 built up one production step at a time (notebook 04); each keeps the steps before it.
    Implementation(
        "minimal", "Part 4 step 0: minimal kernel", "#7f7f7f",
        "Part 4's minimal kernel: row-major 2-D grid, pointer loads, the heuristic's tiles",
        first=impls.first_step("minimal"), linestyle=":", in_default_sweep=False),
    Implementation(
        "+grouped", "Part 4 step 1: + grouped order", "#edc948",
        "the production kernel with grouped program order, the heuristic's tiles, no TMA, no short tails",
        first=impls.first_step("+grouped"), linestyle="--", in_default_sweep=False),
    Implementation(
        "+tuned", "Part 4 step 2: + tuned tiles", "#ff9da7",
        "step 1 with the tuned table's tiles", first=impls.first_step("+tuned"), linestyle="-.",
        in_default_sweep=False),
    Implementation(
        "+tma", "Part 4 step 3: + TMA weight loads", "#17becf",
        "step 2 with weights through the Tensor Memory Accelerator where tuned so (short tails, step 4, "
        "gives 'sorted')", first=impls.first_step("+tma"), linestyle="-.", in_default_sweep=False),
    Implementation(
        "unfused", "layer step 0: SiLU*up and router weights as separate ops", "#7f7f7f",
        "the whole layer with separate SiLU*up, router-weight and sum ops, three-launch alignment",
        layer=impls.layer_step("unfused"), linestyle=":", in_default_sweep=False),
    Implementation(
        "+router-epilogue", "layer step 1: + router weights in the epilogue (vLLM-style)", "#edc948",
        "step 0 with the router weights in the down GEMM's epilogue, as vLLM's Triton path does",
        layer=impls.layer_step("+router-epilogue"), linestyle="--", in_default_sweep=False),
    Implementation(
        "+silu-epilogue", "layer step 2: + SiLU*up in the epilogue", "#ff9da7",
        "step 1 with silu(gate) * up in the gate/up GEMM's epilogue", layer=impls.layer_step("+silu-epilogue"),
        linestyle="-.", in_default_sweep=False),
    Implementation(
        "+decode-align", "layer step 3: + one-launch decode alignment", "#17becf",
        "step 2 with the one-launch alignment for batches of up to 64 pairs",
        layer=impls.layer_step("+decode-align"), linestyle="-.", in_default_sweep=False),
    Implementation(
        "+sorted-act", "layer step 4: + sorted activations", "#bcbd22",
        "step 3 with the gate/up GEMM's rows left in sorted order for the down GEMM (the one-launch "
        "topk sum, step 5, gives 'sorted')", layer=impls.layer_step("+sorted-act"), linestyle="--",
        in_default_sweep=False),
)

BY_NAME: dict[str, Implementation] = {impl.name: impl for impl in IMPLEMENTATIONS}
#: Names with a first-GEMM variant, in the series' order.
FIRST_IMPLS: tuple[str, ...] = tuple(i.name for i in IMPLEMENTATIONS if i.first is not None)
#: Names with a whole-layer variant, in the series' order.
LAYER_IMPLS: tuple[str, ...] = tuple(i.name for i in IMPLEMENTATIONS if i.layer is not None)
#: Names with a forward + backward variant (``bench --backward``), in the series' order.
STEP_IMPLS: tuple[str, ...] = tuple(i.name for i in IMPLEMENTATIONS if i.step is not None)
#: Reader-facing label of each name (tables take it as ``labels=``).
LABELS: dict[str, str] = {i.name: i.label for i in IMPLEMENTATIONS}


def get(name: str) -> Implementation:
    """The implementation called ``name``; ValueError lists the known names."""
    if name not in BY_NAME:
        raise ValueError(f"impl: expected one of {', '.join(BY_NAME)}, got {name!r}")
    return BY_NAME[name]


def prepare(gemm: str, name: str, inp):
    """The prepared calls of implementation ``name`` for ``gemm``; may raise ``impls.Skip``."""
    return get(name).prepare(gemm, inp)


def style(name: str) -> dict:
    """``plot`` keywords of an implementation; an unknown name gets grey and its own name."""
    impl = BY_NAME.get(name)
    return impl.style if impl else {"color": "#555555", "ls": "-", "label": name}
