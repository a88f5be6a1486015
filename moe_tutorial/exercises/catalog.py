"""The exercises of the series: one entry each, used by the checkers, the grader and the README."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Exercise:
    """One exercise: ``id`` "part.n", the function the student writes, and what it is for.

    ``package_impls``: the package's own functions that compute this exercise's answer (dotted
    names). An answer that calls one is not an answer: the checker fails it, naming the function
    (:mod:`moe_tutorial.exercises.tripwire`). Steps of earlier exercises are not listed: an answer
    may take them from the package where the exercise says so (4.3 takes ``align_block_size``).
    """

    id: str
    function: str
    checker: str
    title: str
    teaches: str
    level: str       # "warm-up", "medium" or "hard"
    minutes: int
    package_impls: tuple[str, ...] = ()

    @property
    def part(self) -> int:
        return int(self.id.split(".")[0])


#: The package's first GEMMs (Parts 1 to 4) and whole layers: each computes the answer of several exercises.
FIRST_GEMMS = ("moe_tutorial.loop.loop_moe_matmul", "moe_tutorial.indexing.indexing_moe_matmul",
               "moe_tutorial.indexing.expert_moe_matmul", "moe_tutorial.reference.reference_moe_matmul",
               "moe_tutorial.kernels.fused_kernel.fused_moe_matmul",
               "moe_tutorial.kernels.published_kernel.published_fused_moe_matmul",
               "moe_tutorial.kernels.minimal_sorted_kernel.minimal_sorted_moe_matmul",
               "moe_tutorial.kernels.sorted_layer.sorted_moe_matmul")
LAYERS = ("moe_tutorial.loop.loop_moe_layer", "moe_tutorial.layer.moe_layer", "moe_tutorial.layer.two_gemm_layer",
          "moe_tutorial.reference.reference_moe_layer", "moe_tutorial.kernels.sorted_layer.sorted_moe_layer")
_QUANTISERS = ("moe_tutorial.quant.quantize_weight", "moe_tutorial.quant.quantize_w13",
               "moe_tutorial.quant.quantize_activations", "moe_tutorial.kernels.fp8_quant.quantize_rows",
               "moe_tutorial.kernels.fp8_quant.launch_quantize_rows")
_DEQUANTISED = ("moe_tutorial.quant.dequantize_weight", "moe_tutorial.quant.dequantize_activations",
                "moe_tutorial.kernels.fp8_layer.fp8_moe_matmul")
#: Part 8: the package's gradients (autograd through its layers too).
_GRADIENTS = ("moe_tutorial.reference.reference_layer_grads",
              "moe_tutorial.kernels.trainable_layer.trainable_moe_layer", *LAYERS)
_ROUTER_GRADS = (*_GRADIENTS, "moe_tutorial.kernels.backward_kernel.launch_rows_gemm")
_WEIGHT_GRADS = (*_GRADIENTS, "moe_tutorial.kernels.backward_kernel.launch_expert_grad")


_ALL = [
    Exercise("1.1", "route", "check_route", "The router",
             "softmax in fp32, top-k, renormalise; ids and weights are the input of everything after", "warm-up", 10,
             package_impls=("moe_tutorial.routing.route",)),
    Exercise("1.2", "expert_pairs", "check_expert_pairs", "Who chose expert e?",
             "the expert view: torch.where(topk_ids == e) gives the tokens and the slots", "warm-up", 5),
    Exercise("1.3", "loop_moe_matmul", "check_loop_matmul", "The expert-view loop",
             "one small GEMM per expert, results scattered back to out[idx, slot]", "medium", 15,
             package_impls=FIRST_GEMMS),
    Exercise("1.4", "loop_moe_layer", "check_loop_layer", "The whole layer, by loop",
             "gate/up GEMM, silu(gate) * up, down GEMM, router weights, sum over slots", "hard", 20,
             package_impls=LAYERS),
    Exercise("2.1", "select_weights", "check_select_weights", "Gather the chosen weights",
             "advanced indexing weight[topk_ids] and the [M, topk, N, K] shape it makes", "warm-up", 5),
    Exercise("2.2", "expert_moe_matmul", "check_indexing_matmul", "Vectorise the loop",
             "one broadcast matmul instead of a loop: which axes broadcast, which contract", "medium", 15,
             package_impls=FIRST_GEMMS),
    Exercise("2.3", "intermediate_bytes", "check_intermediate_bytes", "What the gather costs",
             "the size of the [M, topk, N, K] intermediate; Python ints, not int32", "warm-up", 5,
             package_impls=("moe_tutorial.indexing.intermediate_bytes",)),
    Exercise("2.4", "indexing_moe_layer", "check_indexing_layer", "The layer from one first-GEMM function",
             "the down GEMM as M * topk one-expert tokens: reshape instead of a second design", "hard", 20,
             package_impls=LAYERS),
    Exercise("3.1", "fused_columns", "check_fused_columns", "Decode the fused tile",
             "pid decoding and FUSED_N = topk * BLOCK_N: slot = lane // BLOCK_N, column = lane % BLOCK_N",
             "warm-up", 10,
             package_impls=("moe_tutorial.figures.part3.program_columns",)),
    Exercise("3.2", "fused_moe_matmul", "check_fused_matmul", "The gather pointer grid",
             "per-column expert ids, a [BLOCK_K, FUSED_N] pointer grid, masks, the scatter store", "hard", 35,
             package_impls=FIRST_GEMMS),
    Exercise("3.3", "fused_moe_matmul_any_topk", "check_fused_any_topk", "topk = 6",
             "tl.arange needs powers of two: pad to TOPK_PAD and mask the spare columns", "medium", 15,
             package_impls=FIRST_GEMMS),
    Exercise("3.4", "fused_moe_matmul_int64", "check_fused_int64", "DeepSeek-V3 and int32",
             "expert * stride_we passes 2**31 on big models: cast to int64 before multiplying", "medium", 10,
             package_impls=FIRST_GEMMS),
    Exercise("4.1", "align_block_size", "check_align", "Sort and pad",
             "group (token, slot) pairs by expert, pad each run to BLOCK_M with a sentinel", "hard", 25,
             package_impls=("moe_tutorial.kernels.align.align_block_size",)),
    Exercise("4.2", "grouped_pid", "check_grouped_pid", "Grouped program order",
             "map a 1-D pid to (pid_m, pid_n) walking GROUP_M row blocks first; the last group is short", "medium", 10,
             package_impls=("moe_tutorial.kernels.sorted_kernel.pid_to_tile", "moe_tutorial.figures.part4.tile_pids")),
    Exercise("4.3", "sorted_moe_matmul", "check_sorted_matmul", "The sorted kernel",
             "one expert per program, tl.dot on [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N], padding rows masked",
             "hard", 40,
             package_impls=FIRST_GEMMS),
    Exercise("4.4", "sorted_moe_matmul_weighted", "check_router_epilogue", "Router weights in the epilogue",
             "scale each output row by its pair's router weight before the store", "medium", 10,
             package_impls=FIRST_GEMMS),
    Exercise("7.1", "quantize_block", "check_quantize_block", "Quantise one block",
             "scale = amax / 448 of the magnitudes, divide, clamp to +-448, round to e4m3", "warm-up", 10,
             package_impls=_QUANTISERS),
    Exercise("7.2", "scaled_matmul", "check_scaled_matmul", "The scaled K loop",
             "each 128-wide K group's e4m3 product times its activation and weight-block scales, summed in fp32",
             "medium", 20,
             package_impls=_DEQUANTISED),
    Exercise("8.1", "router_grad", "check_router_grad", "The router gradient",
             "dS = <dA', A>: dA' = W2[e]^T dO_t, A = silu(gate) * up recomputed from H = W13[e] x_t; no Y needed",
             "medium", 15, package_impls=_ROUTER_GRADS),
    Exercise("8.2", "dw2_tile", "check_dw2_tile", "One tile of dW2",
             "a K-grouped GEMM's tile: the sum over an expert's sorted run of outer(dO[token], s * A[row]), "
             "padding rows skipped", "medium", 15, package_impls=_WEIGHT_GRADS),
]

#: Every exercise by id, in order.
EXERCISES: dict[str, Exercise] = {ex.id: ex for ex in _ALL}


def for_part(part: int) -> list[Exercise]:
    """The exercises of one part, in order."""
    return [ex for ex in _ALL if ex.part == part]
