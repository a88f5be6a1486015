"""Bytes, FLOPs and the roofline floor of the MoE GEMMs: the numbers every speed claim uses.

The floor of a call is ``max(bytes / read bandwidth, flops / matmul rate) + one launch``: the
fewest bytes it must move (each input read once, each output written once) and the FLOPs it must
do, over the ceilings measured on the same GPU in the same run (:mod:`moe_tutorial.perf.ceilings`).
"""
from __future__ import annotations

import math


def experts_touched(M: int, num_experts: int, topk: int) -> float:
    """Expected number of distinct experts M tokens route to (uniform routing)."""
    return num_experts * (1.0 - (1.0 - topk / num_experts) ** M)


def first_gemm_flops(M: int, N: int, K: int, topk: int) -> float:
    """``2 * M * topk * N * K``: one multiply-add per (pair, n, k)."""
    return 2.0 * M * topk * N * K


def first_gemm_bytes(M: int, N: int, K: int, num_experts: int, topk: int, itemsize: int = 2,
                     touched: float | None = None) -> float:
    """Fewest bytes of the first GEMM: x once, each touched expert's ``[N, K]`` once, out once."""
    touched = experts_touched(M, num_experts, topk) if touched is None else touched
    return itemsize * (M * K + touched * N * K + M * topk * N)


def layer_flops(M: int, hidden: int, inter: int, topk: int) -> float:
    """Both GEMMs of the layer: ``2 * M * topk * (2I * H + H * I)``."""
    return 2.0 * M * topk * 3 * inter * hidden


def layer_bytes(M: int, hidden: int, inter: int, num_experts: int, topk: int, itemsize: int = 2,
                touched: float | None = None) -> float:
    """Fewest bytes of the layer: x and y once, each touched expert's w13 and w2 once."""
    touched = experts_touched(M, num_experts, topk) if touched is None else touched
    return itemsize * (2 * M * hidden + touched * 3 * inter * hidden)


#: Bytes per e4m3 element, counting its share of an fp32 scale: a weight shares one with a
#: 128 x 128 block, an activation with a 128-wide group.
FP8_WEIGHT_BYTES = 1 + 4 / (128 * 128)
FP8_ACTIVATION_BYTES = 1 + 4 / 128


def fp8_first_gemm_bytes(M: int, N: int, K: int, num_experts: int, topk: int, touched: float | None = None) -> float:
    """Fewest bytes of the FP8 first GEMM: e4m3 x and its group scales, each touched expert's e4m3
    ``[N, K]`` and its block scales, bf16 out."""
    touched = experts_touched(M, num_experts, topk) if touched is None else touched
    return M * K * FP8_ACTIVATION_BYTES + touched * N * K * FP8_WEIGHT_BYTES + 2 * M * topk * N


def fp8_layer_bytes(M: int, hidden: int, inter: int, num_experts: int, topk: int,
                    touched: float | None = None) -> float:
    """Fewest bytes of the FP8 layer: bf16 x in and y out (the layer quantises x itself), each
    touched expert's e4m3 w13 and w2 and their block scales."""
    touched = experts_touched(M, num_experts, topk) if touched is None else touched
    return 2 * 2 * M * hidden + touched * 3 * inter * hidden * FP8_WEIGHT_BYTES


def per_pair_bytes(M: int, N: int, K: int, topk: int, itemsize: int = 2) -> float:
    """Bytes of the first GEMM when every (token, slot) pair reads its expert's ``[N, K]``: no reuse.

    What Part 3's one-token programs load when no repeated expert hits in L2, and the read half
    of Part 2's gather: :func:`first_gemm_bytes` with each of the ``M * topk`` pairs counted as
    an expert of its own.
    """
    return first_gemm_bytes(M, N, K, M * topk, topk, itemsize, touched=M * topk)


def indexing_bytes(M: int, N: int, K: int, topk: int, itemsize: int = 2) -> float:
    """Part 2's first GEMM: the per-pair gather plus ``selected`` written to HBM and read back."""
    return per_pair_bytes(M, N, K, topk, itemsize) + indexing_extra_bytes(M, N, K, topk, itemsize)


def indexing_extra_bytes(M: int, N: int, K: int, topk: int, itemsize: int = 2) -> float:
    """What Part 2 adds: ``selected [M, topk, N, K]`` written once and read back once."""
    return 2.0 * itemsize * M * topk * N * K


def floor_seconds(nbytes: float, flops: float, bytes_per_s: float, matmul_flops_per_s: float,
                  launch_s: float = 0.0) -> float:
    """The floor of a call: the larger of the memory time and the compute time, plus one launch.

    ``bytes_per_s`` is the read-only bandwidth and ``launch_s`` one kernel launch, both measured
    under the timer that times the call (:mod:`moe_tutorial.perf.ceilings`).
    """
    return max(nbytes / bytes_per_s, flops / matmul_flops_per_s) + launch_s


def arithmetic_intensity(nbytes: float, flops: float) -> float:
    """FLOPs per byte moved."""
    return flops / nbytes if nbytes else math.inf


def geomean(values) -> float:
    """Geometric mean of positive numbers (NaN if there are none)."""
    values = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def step_flops(M: int, hidden: int, inter: int, topk: int) -> float:
    """A training step of the layer, forward and backward: three times :func:`layer_flops` (the
    backward's dA', dx and the two weight gradients are twice the forward's two GEMMs)."""
    return 3.0 * layer_flops(M, hidden, inter, topk)


def step_bytes(M: int, hidden: int, inter: int, num_experts: int, topk: int, itemsize: int = 2,
               touched: float | None = None) -> float:
    """The least a training step moves: the forward's :func:`layer_bytes`, then the backward reads
    the touched experts' weights again and writes their gradients (as many bytes each), reads dO
    and writes dx (as many as x and y): three times the forward's bytes."""
    return 3.0 * layer_bytes(M, hidden, inter, num_experts, topk, itemsize, touched=touched)

