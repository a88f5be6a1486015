"""The two-GPU measurements shipped with the series, and the link numbers the cost model takes from them.

``moe_tutorial/data/h200x2_ep.csv`` is written by ``measurements/scripts/h200x2_ep.py`` (columns in
:data:`moe_tutorial.parallel.bench.FIELDS`). Until it is committed, :func:`load` returns None and
notebook 06 says so.
"""
from __future__ import annotations

from pathlib import Path

from ..perf.results import committed_ceilings, read_csv
from ..shapes import ModelShape
from .cost import Calibration, Machine, calibrate, predict

H200X2_RESULTS = Path(__file__).parent.parent / "data" / "h200x2_ep.csv"
#: Both exchanges under graph replay on two H200s (``measurements/scripts/h200_ep_graphs.py --gpus 2``,
#: columns in :data:`moe_tutorial.parallel.exchange_bench.FIELDS`); not measured yet while absent.
H200X2_GRAPHS = Path(__file__).parent.parent / "data" / "h200x2_ep_graphs.csv"
#: The same script on one H200 (a one-rank group): the host wait removed, graph capture checked.
H200X1_GRAPHS = Path(__file__).parent.parent / "data" / "h200x1_ep_graphs.csv"
_INT = {"world", "E", "K", "I", "topk", "M", "bytes", "capacity"}
_FLOAT = {"ms", "gbps", "rel_error"}


def load(path=H200X2_RESULTS) -> list[dict] | None:
    """The rows of the results CSV (numbers parsed, empty cells None), or None if there is no file."""
    return read_csv(path, _INT, _FLOAT) if Path(path).exists() else None


def ok_rows(rows: list[dict], **where) -> list[dict]:
    """Rows with status "ok" whose columns equal every ``where`` item."""
    return [r for r in rows if r.get("status") == "ok" and all(r.get(k) == v for k, v in where.items())]


def link_from(rows: list[dict]) -> tuple[float, float]:
    """``(latency in us, bandwidth in GB/s one way)`` of the link, from the equal-split all-to-alls:
    the time of the smallest one, and the best rate of the others."""
    a2a = sorted(ok_rows(rows, step="a2a_equal"), key=lambda r: r["bytes"])
    if len(a2a) < 2:
        raise ValueError(f"rows: expected at least two ok 'a2a_equal' rows, got {len(a2a)}")
    return a2a[0]["ms"] * 1e3, max(r["gbps"] for r in a2a[1:])


def measured_machine(rows: list[dict], read_tbps: float | None = None,
                     matmul_tflops: float | None = None) -> Machine:
    """The cost model's :class:`Machine` with the link measured in ``rows`` and the given ceilings
    (default: the committed single-GPU run's, :func:`moe_tutorial.perf.results.committed_ceilings`)."""
    if read_tbps is None or matmul_tflops is None:
        read, matmul = committed_ceilings()
        read_tbps, matmul_tflops = read_tbps or read, matmul_tflops or matmul
    latency_us, gbps = link_from(rows)
    return Machine(link_gbps=gbps, latency_us=latency_us, read_tbps=read_tbps, matmul_tflops=matmul_tflops)


def layer_shape(rows: list[dict], model: str) -> ModelShape:
    """The shape the rows of ``model`` measured (their E, topk, K and I columns)."""
    (r0, *_) = ok_rows(rows, model=model, step="ep_layer")
    return ModelShape(model, r0["E"], r0["topk"], r0["K"], r0["I"])


def measured_seconds(rows: list[dict], model: str, step: str) -> dict:
    """``{M: seconds}`` of one step of ``model`` (tokens per rank M)."""
    return {r["M"]: r["ms"] * 1e-3 for r in ok_rows(rows, model=model, step=step)}


def calibration(rows: list[dict], model: str, machine: Machine) -> Calibration:
    """The cost model fitted to ``model``'s measurements (:func:`moe_tutorial.parallel.cost.calibrate`)
    at the smallest and the largest M measured."""
    world = ok_rows(rows, model=model, step="ep_layer")[0]["world"]
    measured = {step: measured_seconds(rows, model, step) for step in ("single_gpu", "dispatch", "combine")}
    sizes = sorted(set(measured["single_gpu"]) & set(measured["dispatch"]) & set(measured["combine"]))
    return calibrate(measured, layer_shape(rows, model), world, machine, small=sizes[0], large=sizes[-1])


#: The measured steps the model predicts, and its keys for them.
MODEL_KEYS = {"single_gpu": "single", "ep_layer": "ep", "tp_layer": "tp"}


def model_error(rows: list[dict], model: str, machine: Machine, fitted: bool) -> tuple[float, float]:
    """``(lowest, highest)`` measured time over predicted time of ``model``'s three layers (one GPU,
    expert parallel, tensor parallel) at every M: the ideal model, or the one fitted to the rows."""
    shape, world = layer_shape(rows, model), ok_rows(rows, model=model, step="ep_layer")[0]["world"]
    fit = calibration(rows, model, machine) if fitted else None
    ratios = [t / predict(M, shape, world, machine, calibration=fit)[key]
              for step, key in MODEL_KEYS.items() for M, t in measured_seconds(rows, model, step).items()]
    return min(ratios), max(ratios)
