"""A cost model of the two parallel layers: bytes over the link against compute on each rank.

Every quantity is an expectation under uniform routing (each pair's expert uniformly random), on
``world`` GPUs with ``M`` tokens per rank:

* expert parallel: each rank sends the pairs whose expert lives elsewhere, ``M * topk * (world -
  1) / world`` rows of K values (plus 8 bytes of id and weight per row), and receives as many
  back in combine. Its experts see ``M * topk`` pairs on average.
* tensor parallel: every rank runs the whole batch (``world * M`` tokens) on its ``I / world``
  columns, then an all-reduce of ``[world * M, K]``: a ring sends ``2 (world - 1) / world`` of it.

A collective costs ``latency + bytes / bandwidth``; compute costs the roofline floor of the
work on that rank (:func:`moe_tutorial.perf.traffic.floor_seconds`). The layers here run the
three steps one after the other, so their times add; an engine that overlaps communication with
compute (two micro-batches, as DeepEP's hooks allow) pays only the larger of the two.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..perf.traffic import experts_touched, floor_seconds, layer_flops
from ..shapes import ModelShape

#: NVLink 4 on an H200: 18 links of 25 GB/s each way, 450 GB/s each way (NVIDIA's specification).
H200_NVLINK_GBPS = 450.0
#: Bytes of metadata that travel with each dispatched row: its expert id and router weight (fp32 each).
META_BYTES = 8
#: Collectives each step issues in :mod:`moe_tutorial.parallel`'s all-to-all exchange (the one
#: this model prices, and the committed data measured): dispatch gathers the counts and sends rows
#: and metadata; combine sends rows back; tensor parallel all-reduces once. (The fixed-capacity
#: exchange issues one all-gather and one reduce-scatter.)
DISPATCH_COLLECTIVES, COMBINE_COLLECTIVES, ALLREDUCE_COLLECTIVES = 3, 1, 1


@dataclass(frozen=True)
class Machine:
    """What the model needs to know about the GPUs: link bandwidth one way (GB/s), the fixed cost
    of one collective (us), read-only memory bandwidth (TB/s) and matmul rate (TFLOP/s)."""

    link_gbps: float
    latency_us: float
    read_tbps: float
    matmul_tflops: float

    def link_seconds(self, nbytes: float, collectives: int = 1) -> float:
        return collectives * self.latency_us * 1e-6 + nbytes / (self.link_gbps * 1e9)

    def compute_seconds(self, nbytes: float, flops: float) -> float:
        return floor_seconds(nbytes, flops, self.read_tbps * 1e12, self.matmul_tflops * 1e12)


def remote_pairs(M: float, topk: int, world: int) -> float:
    """Pairs a rank sends to other ranks: ``M * topk * (world - 1) / world`` (uniform routing)."""
    return M * topk * (world - 1) / world


def dispatch_bytes(M: float, shape: ModelShape, world: int, itemsize: int = 2) -> float:
    """Bytes one rank sends over the link in dispatch: each remote pair's row and its metadata."""
    return remote_pairs(M, shape.topk, world) * (shape.hidden * itemsize + META_BYTES)


def combine_bytes(M: float, shape: ModelShape, world: int, itemsize: int = 2) -> float:
    """Bytes one rank sends over the link in combine: each remote pair's output row."""
    return remote_pairs(M, shape.topk, world) * shape.hidden * itemsize


def allreduce_bytes(M: float, shape: ModelShape, world: int, itemsize: int = 2) -> float:
    """Bytes one rank sends in a ring all-reduce of the ``[world * M, K]`` output (tensor parallel)."""
    return 2 * (world - 1) / world * world * M * shape.hidden * itemsize


def ep_compute(M: float, shape: ModelShape, world: int, itemsize: int = 2) -> tuple[float, float]:
    """``(bytes, flops)`` of one rank's experts in expert parallel: ``M * topk`` pairs on average,
    rows read and written once, the weights of its experts that the batch touches read once."""
    pairs = M * shape.topk
    touched = experts_touched(world * M, shape.num_experts, shape.topk) / world
    nbytes = itemsize * (2 * pairs * shape.hidden + touched * 3 * shape.intermediate * shape.hidden)
    return nbytes, layer_flops(pairs, shape.hidden, shape.intermediate, 1)


def tp_compute(M: float, shape: ModelShape, world: int, itemsize: int = 2) -> tuple[float, float]:
    """``(bytes, flops)`` of one rank in tensor parallel: all ``world * M`` tokens, ``I / world``
    columns of every touched expert."""
    tokens = world * M
    touched = experts_touched(tokens, shape.num_experts, shape.topk)
    inter = shape.intermediate / world
    nbytes = itemsize * (2 * tokens * shape.hidden + touched * 3 * inter * shape.hidden)
    return nbytes, layer_flops(tokens, shape.hidden, inter, shape.topk)


def single_compute(tokens: float, shape: ModelShape, itemsize: int = 2) -> tuple[float, float]:
    """``(bytes, flops)`` of the whole layer on one GPU holding every expert."""
    return tp_compute(tokens, shape, 1, itemsize)


@dataclass(frozen=True)
class Calibration:
    """What a measured (eager) layer adds to the ideal model, fitted by :func:`calibrate`: seconds
    of host work per layer call (Python launchers, one synchronise), per dispatch and per combine
    beyond their collectives' latency and bytes (the host reading the counts), and the kernels'
    efficiency, the share of their roofline floor's speed they reach."""

    call_s: float = 0.0
    dispatch_s: float = 0.0
    combine_s: float = 0.0
    efficiency: float = 1.0


def calibrate(measured: dict, shape: ModelShape, world: int, machine: Machine,
              small: int = 1, large: int = 16384, itemsize: int = 2) -> Calibration:
    """Fit a :class:`Calibration` to measurements ``{step: {M: seconds}}`` of "single_gpu",
    "dispatch" and "combine" (tokens per rank M; the single GPU runs ``world * M`` tokens).

    One GPU's layer at ``small`` and ``large`` M gives two equations, ``t = call_s + floor /
    efficiency``; dispatch and combine at ``small`` M give their host time beyond the link model.
    Measured at one M only, the kernels keep the ideal efficiency 1.
    """
    lo, hi = predict(small, shape, world, machine, itemsize), predict(large, shape, world, machine, itemsize)
    single = measured["single_gpu"]
    inverse = (single[large] - single[small]) / (hi["single"] - lo["single"]) if large != small else 1.0
    return Calibration(call_s=single[small] - lo["single"] * inverse,
                       dispatch_s=measured["dispatch"][small] - lo["dispatch"],
                       combine_s=measured["combine"][small] - lo["combine"], efficiency=1 / inverse)


def predict(M: float, shape: ModelShape, world: int, machine: Machine, itemsize: int = 2,
            calibration: Calibration | None = None) -> dict:
    """Predicted seconds of each step at ``M`` tokens per rank.

    Returns ``dispatch``, ``experts``, ``combine``, ``ep`` (their sum), ``tp_compute``,
    ``allreduce``, ``tp`` (their sum), ``single`` (one GPU running all ``world * M`` tokens),
    and ``ep_comm_share``: the fraction of the expert-parallel layer spent communicating.
    With a ``calibration`` every compute step costs ``call_s + floor / efficiency``, dispatch and
    combine their host time more (and tensor parallel's all-reduce combine's): the model fitted to
    an eager measurement (:func:`calibrate`).
    """
    c = calibration or Calibration()

    def compute(nbytes, flops):
        return (c.call_s + machine.compute_seconds(nbytes, flops) / c.efficiency) if calibration else \
            machine.compute_seconds(nbytes, flops)
    t = {
        "dispatch": machine.link_seconds(dispatch_bytes(M, shape, world, itemsize), DISPATCH_COLLECTIVES)
        + c.dispatch_s,
        "experts": compute(*ep_compute(M, shape, world, itemsize)),
        "combine": machine.link_seconds(combine_bytes(M, shape, world, itemsize), COMBINE_COLLECTIVES) + c.combine_s,
        "tp_compute": compute(*tp_compute(M, shape, world, itemsize)),
        "allreduce": machine.link_seconds(allreduce_bytes(M, shape, world, itemsize), ALLREDUCE_COLLECTIVES)
        + c.combine_s,
        "single": compute(*single_compute(world * M, shape, itemsize)),
    }
    t["ep"] = t["dispatch"] + t["experts"] + t["combine"]
    t["tp"] = t["tp_compute"] + t["allreduce"]
    t["ep_comm_share"] = (t["dispatch"] + t["combine"]) / t["ep"]
    return t
