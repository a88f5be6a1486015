"""The skeleton of a measurement script: implementations checked, then timed side by side; models
one by one, batch sizes within, one CSV rewritten as the rows come (a run cut short keeps its rows).

``measurements/scripts/fp8_grouped_anchor.py`` and the layer scripts (``tma_store_layer.py``,
``gather_layer.py``, ...) are built on it: each says what to prepare for one case and which columns its
rows add (:func:`layer_row`); this module runs them.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Callable

import torch

from .. import runtime
from ..reference import rel_error
from ..shapes import MODEL_SHAPES, ModelShape
from . import bench
from .ceilings import measure_ceilings
from .results import write_csv
from .timing import machine_info, time_both_orders

#: The dry run's model: small enough for the interpreter, a few seconds on a CPU.
TOY = ModelShape("toy-K256-I128", 8, 2, 256, 128)


def sweep_parser(description: str, batch_sizes: list[int]) -> argparse.ArgumentParser:
    """A script's command line: ``--models`` (the three FP8 models by default), ``--M`` and ``--dry-run``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--models", nargs="+", default=["Qwen3-30B-A3B", "DeepSeek-V3", "Kimi-K2"])
    p.add_argument("--M", nargs="+", type=int, default=batch_sizes)
    p.add_argument("--dry-run", action="store_true", help="on a CPU: the toy shape in the interpreter")
    return p


def cases(args) -> tuple[list[str], list[int]] | None:
    """``(models, batch sizes)`` to run: with ``--dry-run`` :data:`TOY` at M = 3 (registered among the
    model shapes until the caller removes it); None, having said why, where there is no GPU to time on."""
    if args.dry_run:
        MODEL_SHAPES[TOY.name] = TOY
        return [TOY.name], [3]
    if not runtime.ON_GPU:
        print("needs a CUDA GPU")
        return None
    return args.models, args.M


def skip_reason(e: Exception) -> str:
    """An exception in one line for a row's status: its type and the first line of its message."""
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0][:160] if text else ''}"


def prepared_or_reason(build: Callable[[], Any]) -> Any:
    """``build()`` (an implementation prepared for one case), or why it raised in one line (a Skip, a
    runtime without the kernel, a torch that refuses the call): the case's row then says why."""
    try:
        return build()
    except Exception as e:  # noqa: BLE001  (the row says why)
        return skip_reason(e)


def print_case(model: str, M: int, rows: list[dict], figure: Callable[[dict], str]) -> None:
    """One case on the console: each row's time in microseconds with ``figure(row)`` beside it (``-``
    where it did not run), then the reason of each that did not."""
    line = " | ".join(f"{r['impl']} {r['ms'] * 1e3:8.1f} us ({figure(r)})" if "ms" in r else f"{r['impl']} -"
                      for r in rows)
    print(f"{model:14s} M={M:5d}: {line}", flush=True)
    for r in rows:
        if r["status"] != "ok":
            print(f"    {r['impl']}: {r['status']}", flush=True)


def timed(pair: list[float]) -> dict:
    """A form's two timings from :func:`check_then_time` (``[ms, ms reversed]``) as a row's columns:
    ``ms`` the faster, ``ms_forward``, ``ms_reverse``, and ``noise`` their difference over the faster."""
    best = min(pair)
    return dict(ms=best, ms_forward=pair[0], ms_reverse=pair[1], noise=abs(pair[0] - pair[1]) / best)


def layer_row(info: dict, shape, M: int, name: str, inp, ceil, times: dict, errors: dict, status: dict, *,
              precision: str, **columns) -> dict:
    """One form's row in a layer script's CSV (:func:`check_then_time`'s results for form ``name``): the
    run's ``info``, the case, the script's own ``columns`` after the form, the floor of the layer in
    ``precision`` ("bf16" or "fp8") from ``ceil``, the status, and where the form ran its timings
    (:func:`timed`), the bf16 layer's time (form ``sorted``, NaN if absent) over its own and its error
    against float64."""
    nbytes, flops = bench.traffic_of("layer", inp, precision)
    row = dict(info, model=shape.name, M=M, impl=name, precision=precision, **columns,
               floor_ms=ceil.floor_ms(nbytes, flops, precision), status=status.get(name, "ok"))
    if name in times:
        bf16_ms = min(times["sorted"]) if "sorted" in times else float("nan")
        row.update(timed(times[name]), bf16_over=bf16_ms / min(times[name]), rel_error=errors[name])
    return row


def check_then_time(prepared: dict, rows, expected, *, keep_outputs: bool = False) -> tuple[dict, dict, dict, dict]:
    """Each of ``prepared`` (``{name: Prepared, or the reason it does not run}``) called once, its
    output's ``rows`` checked against float64 (its own reference where it has one, else ``expected``),
    then every one that ran timed cold-l2 in both orders (:func:`time_both_orders`; NaN off a GPU).

    Returns ``(times, outputs, errors, status)``: ``{name: [ms, ms reversed]}``, ``{name: output}``
    (with ``keep_outputs``; else empty, so that the timing has the memory), ``{name: relative error}``
    and ``{name: "skipped: why"}`` for those that did not run or raised.
    """
    calls, outputs, errors, status = {}, {}, {}, {}
    for name, p in prepared.items():
        if isinstance(p, str):
            status[name] = f"skipped: {p}"
            continue
        try:
            out = p.output(p.calls[0]())
            ref = p.reference(rows) if p.reference is not None else expected
            errors[name] = rel_error(out[rows].float(), ref)
            calls[name] = p.calls[0]
            if keep_outputs:
                outputs[name] = out
        except Exception as e:  # noqa: BLE001  (the row says why)
            status[name] = f"skipped: {skip_reason(e)}"
    times = time_both_orders(calls) if runtime.ON_GPU else {n: [float("nan")] * 2 for n in calls}
    return times, outputs, errors, status


def sweep_models(models, batch_sizes, case_rows: Callable, csv_path: Path, *, with_w2: bool) -> list[dict]:
    """For each model (weights made once, :func:`bench.make_weights`) and each M:
    ``case_rows(shape, M, w13, w2, caches, ceilings, info)`` -> its rows, the CSV rewritten after each.
    The run's ceilings are measured first (cold-l2); ``caches`` lives as long as one model's weights
    (the scripts keep their quantised experts there); ``info`` is the machine and the ceilings' columns."""
    ceil = measure_ceilings(runtime.DEFAULT_DTYPE, "cold-l2")
    info = {**machine_info(), **ceil.columns()}
    rows: list[dict] = []
    for model in models:
        shape = MODEL_SHAPES[model]
        w13, w2 = bench.make_weights(shape, runtime.DEFAULT_DTYPE, with_w2=with_w2)
        caches: dict = {}
        for M in batch_sizes:
            rows += case_rows(shape, M, w13, w2, caches, ceil, info)
            write_csv(csv_path, rows, list(dict.fromkeys(k for r in rows for k in r)))
            if runtime.ON_GPU:
                torch.cuda.empty_cache()
        del w13, w2, caches
    return rows


def table_main(description: str, argv, *, into: Path, fields, gather: Callable[[list[Path]], list[dict]],
               runs_help: str) -> int:
    """A gathering script's command line, ``RUN.csv ... [--into DATA.csv]``: the rows ``gather(runs)``
    returns, written anew into ``--into`` (``into`` by default) in the columns ``fields``."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("runs", nargs="+", type=Path, help=runs_help)
    ap.add_argument("--into", type=Path, default=into)
    args = ap.parse_args(argv)
    rows = gather(args.runs)
    write_csv(args.into, rows, list(fields))
    print(f"wrote {len(rows)} rows to {args.into}")
    return 0
