"""The benchmark sweep: implementations x model shapes x batch sizes, one CSV row per case.

For every case the bench builds random inputs on the device, runs each implementation once with
all its input checks and compares a few output rows with the float64 reference, then times them
(:func:`moe_tutorial.perf.timing.measure_ms`, under one of the two protocols, in forward and reverse
order) and sets each time against the floor of the problem: its bytes and FLOPs
(:mod:`moe_tutorial.perf.traffic`) over the ceilings measured at the start of the run under the
same protocol (:mod:`moe_tutorial.perf.ceilings`).
Rows follow :data:`moe_tutorial.perf.results.FIELDS`. ``python -m moe_tutorial bench`` drives it.
"""
from __future__ import annotations

import gc
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from tqdm.auto import tqdm

from .. import runtime
from ..kernels import configs
from ..reference import (
    FP8_LAYER_TOLERANCE,
    reference_layer_grads,
    reference_moe_layer,
    reference_moe_matmul,
    rel_error,
    tolerance,
)
from ..routing import route
from ..shapes import BATCH_SIZES, HEADLINE_MODELS, ModelShape, get_shape
from . import reached, traffic
from .ceilings import Ceilings, measure_ceilings
from .impls import INT32_LIMIT, Inputs, Skip, step_grad
from .registry import BY_NAME, FIRST_IMPLS, LAYER_IMPLS, STEP_IMPLS, prepare
from .results import write_rows
from .timing import HOST_SYNC_TIMER, PROTOCOLS, SLOW_CALL_TIMER, TooSlow, cycle, machine_info, measure_ms, warm_up_gpu

GEMMS = ("first", "layer")
#: The layer's forward + backward (``bench --backward``): its rows check and time dx.
STEP = "step"
ALL_GEMMS = GEMMS + (STEP,)
GPU_QUICK = (("Qwen3-30B-A3B",), (1, 64, 4096))
#: The CPU default: a toy shape the interpreter runs in well under a second per case.
CPU_SHAPE = ModelShape("custom", num_experts=8, topk=2, hidden=64, intermediate=32)
CPU_BATCH_SIZES = (1, 4, 16)
CPU_QUICK_BATCH_SIZES = (1, 8)

INTERPRETER_NOTE = (
    "NOTE: no CUDA GPU here. Triton kernels run in the CPU interpreter, one program at a time, "
    "and the ceilings are the CPU's: these timings teach nothing about GPU speed. They only show "
    "that every implementation runs and agrees with the float64 reference."
)


@dataclass
class BenchPlan:
    """What one bench run sweeps. ``impls=None`` means each gemm's default list."""

    shapes: list[ModelShape]
    batch_sizes: tuple[int, ...]
    dtype: torch.dtype
    gemms: tuple[str, ...] = GEMMS
    impls: tuple[str, ...] | None = None
    protocol: str = "cold-l2"
    max_seconds: float = 2.0
    max_minutes: float = 0.0          # 0: no overall limit
    seed: int = 0


def default_plan(quick: bool = False) -> BenchPlan:
    """The sweep ``bench`` runs without options: real models on a GPU, a toy shape on the CPU."""
    if runtime.ON_GPU:
        models, sizes = GPU_QUICK if quick else (HEADLINE_MODELS, BATCH_SIZES)
        return BenchPlan([get_shape(m) for m in models], sizes, torch.bfloat16)
    return BenchPlan([CPU_SHAPE], CPU_QUICK_BATCH_SIZES if quick else CPU_BATCH_SIZES, torch.float32)


def has_tuned_config(shape: ModelShape, gemm: str, dtype: torch.dtype) -> bool:
    """True when a tuned table has an entry for this GPU and one of the gemm's problems."""
    E, topk, H, inter = shape.num_experts, shape.topk, shape.hidden, shape.intermediate
    key = configs.problem_key
    keys = ([key(E, 2 * inter, H, topk, dtype, "plain")] if gemm == "first" else
            [key(E, inter, H, topk, dtype, "gated"), key(E, H, inter, topk, dtype, "down")])
    # Through the module: tests stand in another GPU's name with monkeypatch.
    return any(k in table.get(configs.gpu_name(), {}) for table in configs.load_tables() for k in keys)


def impls_for(plan: BenchPlan, shape: ModelShape, gemm: str) -> tuple[str, ...]:
    """The implementations a gemm runs: the plan's (those that exist for this gemm) or the defaults.

    The default list leaves out the production steps of Part 4 (named only on request) and
    "sorted-heuristic" unless a tuned table would make "sorted" differ from it.
    """
    known = {"first": FIRST_IMPLS, "layer": LAYER_IMPLS, STEP: STEP_IMPLS}[gemm]
    if plan.impls is not None:
        return tuple(i for i in plan.impls if i in known)
    keep_heuristic = runtime.ON_GPU and has_tuned_config(shape, gemm, plan.dtype)
    return tuple(i for i in known if BY_NAME[i].in_default_sweep and (i != "sorted-heuristic" or keep_heuristic))


def cases(plan: BenchPlan) -> list[tuple[ModelShape, int, str, str]]:
    """``(shape, M, gemm, impl)`` in run order: weights made once per shape, inputs per M."""
    return [(s, M, g, i) for s in plan.shapes for M in plan.batch_sizes
            for g in plan.gemms for i in impls_for(plan, s, g)]


def rotations(M: int, protocol: str) -> int:
    """How many routings a timed case cycles through under the rotated protocol (so L2 holds none
    of the last call's weights); the cold-l2 protocol flushes L2 instead and needs one."""
    if not runtime.ON_GPU or protocol != "rotated":
        return 1
    return 8 if M <= 64 else 2


#: Elements of memory kept in front of a weight tensor of INT32_LIMIT elements or more (see make_weights).
INT32_GUARD = INT32_LIMIT


def make_weights(shape: ModelShape, dtype: torch.dtype, *, with_w2: bool, seed: int = 0):
    """Random ``w13 [E, 2I, H]`` and (if asked) ``w2 [E, H, I]`` on the device, scaled to O(1) outputs.

    A w13 of 2^31 elements or more (DeepSeek-V3's) sits :data:`INT32_GUARD` elements into a
    larger buffer. The published Part 3 kernel computes its weight offsets in int32, and they
    wrap to anywhere in ``[-2^31, 2^31)`` elements around the tensor's start: with the guard in
    front every such read stays in memory we own, so the kernel returns wrong numbers (which the
    check reports) instead of crashing the process. The other implementations never look there.
    """
    E, H, inter = shape.num_experts, shape.hidden, shape.intermediate
    g = torch.Generator(device=runtime.DEVICE).manual_seed(seed)
    numel = E * 2 * inter * H
    guard = INT32_GUARD if numel >= INT32_LIMIT else 0
    storage = torch.empty(guard + numel, device=runtime.DEVICE, dtype=dtype)
    w13 = storage[guard:].view(E, 2 * inter, H).normal_(generator=g).mul_(H ** -0.5)
    w2 = None
    if with_w2:
        w2 = torch.empty(E, H, inter, device=runtime.DEVICE, dtype=dtype).normal_(generator=g).mul_(inter ** -0.5)
    return w13, w2


def make_routings(shape: ModelShape, M: int, *, num_rotations: int = 1, seed: int = 0):
    """The bench's routings for one batch size, on the CPU: ``num_rotations`` pairs ``(topk_weights
    [M, topk] fp32, topk_ids [M, topk])``, each the router softmax over random logits, seeded by M."""
    g = torch.Generator().manual_seed(seed + 1000 * M)
    return [route(torch.randn(M, shape.num_experts, generator=g), shape.topk) for _ in range(num_rotations)]


def make_inputs(shape: ModelShape, M: int, dtype: torch.dtype, w13, w2, *, num_rotations: int = 1,
                seed: int = 0) -> Inputs:
    """Random tokens and routings (:func:`make_routings`) for one batch size."""
    g_dev = torch.Generator(device=runtime.DEVICE).manual_seed(seed + 1000 * M)
    xs = [torch.randn(M, shape.hidden, generator=g_dev, device=runtime.DEVICE, dtype=dtype)
          for _ in range(num_rotations)]
    routings = make_routings(shape, M, num_rotations=num_rotations, seed=seed)
    weights = [w.to(runtime.DEVICE) for w, _ in routings]
    ids = [i.to(runtime.DEVICE) for _, i in routings]
    return Inputs(shape, M, dtype, w13, w2, xs, ids, weights)


def reference_rows(gemm: str, inp: Inputs, max_rows: int | None = None):
    """``(rows, ref)``: a few evenly spread token rows and their float64 reference output.

    The whole output when M is small; else 16 rows of the first GEMM or 8 of the layer (the
    layer's reference converts the touched experts' weights to float64, which is large).
    """
    max_rows = max_rows or (16 if gemm == "first" else 8)
    M = inp.M
    rows = torch.linspace(0, M - 1, min(M, max_rows)).round().long().unique().to(runtime.DEVICE)
    x, ids = inp.xs[0][rows], inp.ids[0][rows]
    if gemm == "first":
        return rows, reference_moe_matmul(x, inp.w13, ids)
    # Only the experts these rows use, renumbered, so float64 copies stay small.
    used = torch.unique(ids)
    local = torch.searchsorted(used, ids.long()).to(torch.int32)
    if gemm == STEP:
        # A token's dx depends on its own row of x and of d_out only: these rows alone give it.
        return rows, reference_layer_grads(x, inp.w13[used], inp.w2[used], inp.weights[0][rows], local,
                                           step_grad(inp)[rows])["x"]
    return rows, reference_moe_layer(x, inp.w13[used], inp.w2[used], inp.weights[0][rows], local)


def traffic_of(gemm: str, inp: Inputs, precision: str = "bf16") -> tuple[float, float]:
    """``(bytes, flops)`` of the case, with the measured number of distinct experts; with
    ``precision="fp8"`` the bytes of e4m3 experts and activations with their scales."""
    s, M, itemsize = inp.shape, inp.M, inp.w13.element_size()
    if precision == "fp8":
        if gemm == "first":
            N, K = 2 * s.intermediate, s.hidden
            return (traffic.fp8_first_gemm_bytes(M, N, K, s.num_experts, s.topk, touched=inp.touched),
                    traffic.first_gemm_flops(M, N, K, s.topk))
        return (traffic.fp8_layer_bytes(M, s.hidden, s.intermediate, s.num_experts, s.topk, touched=inp.touched),
                traffic.layer_flops(M, s.hidden, s.intermediate, s.topk))
    if gemm == "first":
        N, K = 2 * s.intermediate, s.hidden
        return (traffic.first_gemm_bytes(M, N, K, s.num_experts, s.topk, itemsize, touched=inp.touched),
                traffic.first_gemm_flops(M, N, K, s.topk))
    if gemm == STEP:
        return (traffic.step_bytes(M, s.hidden, s.intermediate, s.num_experts, s.topk, itemsize, touched=inp.touched),
                traffic.step_flops(M, s.hidden, s.intermediate, s.topk))
    return (traffic.layer_bytes(M, s.hidden, s.intermediate, s.num_experts, s.topk, itemsize, touched=inp.touched),
            traffic.layer_flops(M, s.hidden, s.intermediate, s.topk))


#: Timers a case may end up with that still count as plain "ok": calls too slow to repeat 30
#: times in a graph (their launch is negligible) and calls that wait on the host (no graph can
#: hold them), both timed with L2 flushed before each call.
EXPECTED_TIMERS = {"perf_counter", SLOW_CALL_TIMER, HOST_SYNC_TIMER}


def check_case(gemm: str, impl: str, inp: Inputs, ref, ceilings: Ceilings, plan: BenchPlan):
    """Prepare one implementation on one case, run it once with all input checks and compare it
    with the reference. Returns ``(row, prepared)``; ``prepared`` is None when the case ends here
    (skipped, or failed), and the row then says why in its status.

    ``ref`` is ``(rows, expected)`` from :func:`reference_rows`.
    """
    row = _skeleton(inp.shape, inp.dtype, gemm, impl, inp.M)
    precision = BY_NAME[impl].precision
    row["floor_ms"] = ceilings.floor_ms(*traffic_of(gemm, inp, precision), precision)
    try:
        prepared = prepare(gemm, impl, inp)
        for buf in prepared.buffers:            # unwritten elements must show as NaN
            buf.fill_(float("nan"))
        t0 = time.perf_counter()
        out = prepared.output(prepared.calls[0]())  # with every input check; compiles the kernel
        if not runtime.ON_GPU and time.perf_counter() - t0 > plan.max_seconds:
            # No compile time in the interpreter: this call already says the case is too slow.
            raise TooSlow(time.perf_counter() - t0, plan.max_seconds)
        rows, expected = ref
        if prepared.reference is not None:
            expected = prepared.reference(rows)
        row["rel_error"] = rel_error(out[rows], expected) if bool(torch.isfinite(out).all()) else math.inf
        return row, prepared
    except (Skip, TooSlow) as e:
        return {**row, "status": f"skipped: {e}"}, None
    except Exception as e:  # noqa: BLE001  (a failing implementation must not end the sweep)
        return {**row, "status": f"skipped: error: {_first_line(e)}"}, None


def time_case(prepared, plan: BenchPlan) -> tuple[float, str]:
    """``(median ms, timer used)`` of a checked case under the plan's protocol; may raise TooSlow.

    Inside a CUDA graph capture the wrappers skip their host-side id check (checks.py), which
    the correctness run has done.
    """
    return measure_ms(prepared.calls[0], protocol=plan.protocol, max_seconds=plan.max_seconds,
                      graphable=prepared.graphable, rotated_fn=cycle(prepared.calls))


def finish_row(row: dict, ms: float, how: str, inp: Inputs) -> dict:
    """Fill the measured columns and the status of a timed case."""
    nbytes, flops = traffic_of(row["gemm"], inp, BY_NAME[row["impl"]].precision)
    row.update(ms=ms, tflops=flops / (ms * 1e-3) / 1e12, gbps=nbytes / (ms * 1e-3) / 1e9,
               fraction_of_floor=row["floor_ms"] / ms)
    fp8_layer = row["gemm"] == "layer" and BY_NAME[row["impl"]].precision == "fp8" and runtime.ON_GPU
    if not row["rel_error"] <= (FP8_LAYER_TOLERANCE if fp8_layer else tolerance(inp.dtype)):
        row["status"] = "wrong"
    elif how in EXPECTED_TIMERS or how in PROTOCOLS:
        row["status"] = "ok"
    else:                                       # a graph capture failed: launch gaps included
        row["status"] = f"ok ({how})"
    return row


def run_case(gemm: str, impl: str, inp: Inputs, ref, ceilings: Ceilings, plan: BenchPlan) -> dict:
    """Check and time one implementation on one case, once; return the row's measured columns."""
    return run_group(gemm, [impl], inp, ref, ceilings, plan)[0]


def run_group(gemm: str, impls, inp: Inputs, ref, ceilings: Ceilings, plan: BenchPlan) -> list[dict]:
    """Check every implementation on one case, then time them all in order and again in reverse
    order (after a short GPU warm-up), keeping each one's lower median: a place early or late in
    the sweep, a clock still rising or a GPU heating up, then favours no implementation."""
    checked = [check_case(gemm, impl, inp, ref, ceilings, plan) for impl in impls]
    times: dict[int, list] = {i: [] for i, (_, prepared) in enumerate(checked) if prepared is not None}
    orders = [list(times), list(reversed(times))] if runtime.ON_GPU else [list(times)]
    warm_up_gpu()
    for order in orders:
        for i in order:
            if isinstance(times[i], Exception):
                continue
            try:
                times[i].append(time_case(checked[i][1], plan))
            except TooSlow as e:
                times[i] = e
            except Exception as e:  # noqa: BLE001
                times[i] = RuntimeError(f"error: {_first_line(e)}")
    rows = []
    for i, (row, prepared) in enumerate(checked):
        if prepared is None:
            rows.append(row)
        elif isinstance(times[i], Exception):
            rows.append({**row, "status": f"skipped: {times[i]}"})
        else:
            rows.append(finish_row(row, *min(times[i]), inp))
    checked = times = None                      # free every buffer before the next case
    return rows


def _first_line(e: Exception) -> str:
    lines = str(e).strip().splitlines()
    return f"{type(e).__name__}: {lines[0][:200] if lines else ''}"


def free_device_memory() -> None:
    gc.collect()
    if runtime.ON_GPU:
        torch.cuda.empty_cache()


def run_bench(plan: BenchPlan, *, csv_path: str | Path | None = None, progress: bool = True,
              log: Callable[[str], None] = print, ceilings: Ceilings | None = None) -> list[dict]:
    """Run every case of ``plan``; return the rows (and rewrite ``csv_path`` after each case group).

    The ceilings are measured first, in the plan's dtype and under its protocol, unless given.
    The implementations of one (shape, M, gemm) are checked, then timed together in both orders
    (:func:`run_group`). At the end (and in each rewrite of the CSV) the read ceiling is raised to
    the best rate a bandwidth-bound call of the run reached, and every floor and fraction
    recomputed with it (:func:`moe_tutorial.perf.reached.raise_read_ceiling`): no call beats its floor.
    """
    todo = cases(plan)
    machine = machine_info()
    if ceilings is None:
        how = f"under the {plan.protocol} protocol" if runtime.ON_GPU else "with perf_counter"
        log(f"measuring the ceilings {how} (matmul, read-only and copy bandwidth, one launch) ...")
        ceilings = measure_ceilings(plan.dtype, plan.protocol)
    what = "ceilings" if runtime.ON_GPU else "CPU rates, kept in the CSV only (no GPU floor is judged here)"
    log(f"{what} on {machine['gpu']} ({ceilings.protocol}): read {ceilings.read_tbps:.3g} TB/s, "
        f"copy {ceilings.copy_tbps or float('nan'):.3g} TB/s, {str(plan.dtype).replace('torch.', '')} matmul "
        f"{ceilings.matmul_tflops:.3g} TFLOP/s"
        + (f", one launch {ceilings.launch_us:.3g} us" if runtime.ON_GPU else ""))
    common = {**machine, **ceilings.columns()}
    rows: list[dict] = []
    start = time.monotonic()
    bar = tqdm(total=len(todo), desc="bench", unit="case", disable=not progress, dynamic_ncols=True)
    groups: dict[tuple, list[str]] = {}
    for shape, M, gemm, impl in todo:
        groups.setdefault((shape, M, gemm), []).append(impl)
    weights_for = inputs_for = inp = w13 = w2 = None
    refs: dict = {}
    try:
        for (shape, M, gemm), impls in groups.items():
            bar.set_postfix_str(f"{shape.name} {gemm} M={M}")
            if plan.max_minutes and time.monotonic() - start > 60 * plan.max_minutes:
                group_rows = [{**_skeleton(shape, plan.dtype, gemm, impl, M),
                               "status": f"skipped: over the --max-minutes {plan.max_minutes:g} budget"}
                              for impl in impls]
            else:
                try:
                    if weights_for != shape.name:
                        weights_for, inputs_for, refs, inp, w13, w2 = shape.name, None, {}, None, None, None
                        free_device_memory()
                        w13, w2 = make_weights(shape, plan.dtype, with_w2=bool({"layer", STEP} & set(plan.gemms)),
                                               seed=plan.seed)
                    if inputs_for != M:
                        inputs_for, refs, inp = M, {}, None
                        free_device_memory()
                        inp = make_inputs(shape, M, plan.dtype, w13, w2, num_rotations=rotations(M, plan.protocol),
                                          seed=plan.seed)
                    if gemm not in refs:
                        refs[gemm] = reference_rows(gemm, inp)
                    group_rows = run_group(gemm, impls, inp, refs[gemm], ceilings, plan)
                except Exception as e:  # noqa: BLE001  (inputs or reference failed, e.g. out of memory)
                    weights_for = inputs_for = None     # build them again for the next case
                    group_rows = [{**_skeleton(shape, plan.dtype, gemm, impl, M),
                                   "status": f"skipped: error while preparing inputs: {_first_line(e)}"}
                                  for impl in impls]
            rows.extend({**common, **row} for row in group_rows)
            free_device_memory()
            if csv_path is not None:
                write_rows(csv_path, reached.raise_read_ceiling(rows))
            bar.update(len(impls))
    finally:
        bar.close()
        w13 = w2 = inp = refs = None
        free_device_memory()
    rows = reached.raise_read_ceiling(rows)
    if rows and rows[0]["read_tbps"] > ceilings.read_tbps:
        log(f"read ceiling raised from {ceilings.read_tbps:.3g} TB/s (the read kernels) to {rows[0]['read_tbps']:.3g}: "
            "the best rate a bandwidth-bound call of this run reached (perf/reached.py)")
    return rows


def _skeleton(shape: ModelShape, dtype: torch.dtype, gemm: str, impl: str, M: int) -> dict:
    """The columns that name a case. N and K are the first GEMM's (N = 2I, K = hidden) for both gemms."""
    if impl in BY_NAME and BY_NAME[impl].precision == "fp8":
        dtype = torch.float8_e4m3fn             # the experts' dtype (activations in and out: bf16)
    return {"model": shape.name, "E": shape.num_experts, "N": 2 * shape.intermediate, "K": shape.hidden,
            "topk": shape.topk, "dtype": str(dtype).replace("torch.", ""), "gemm": gemm, "impl": impl, "M": M}
