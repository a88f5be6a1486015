"""Text tables from benchmark rows: fraction of the floor per M, geometric means, speed-ups,
Part 4's production steps and the ceilings a run was judged by.

The bench prints them at the end of a run and notebooks 03 to 05 print them from the shipped H200
results. Rows are dicts with :data:`moe_tutorial.perf.results.FIELDS` keys (as ``load_rows`` gives).
A cell reads "wrong" where the result failed its check and "-" where the case was skipped.
Tables name implementations as the CSV does; pass ``labels`` (e.g.
:data:`moe_tutorial.perf.registry.LABELS`) for the series' words.
"""
from __future__ import annotations

import json
import textwrap

from ..kernels.align import SMALL_BATCH_PAIRS
from ..kernels.configs import SHIPPED_DIR, KernelConfig, fp8_heuristic_config, problem_key
from ..shapes import MODEL_SHAPES, get_shape
from .impls import FIRST_STEPS, LAYER_STEPS
from .registry import FIRST_IMPLS, LABELS, LAYER_IMPLS
from .traffic import geomean


def is_ok(row: dict) -> bool:
    """Timed and correct: status "ok", or "ok (<timer used>)"."""
    return str(row.get("status") or "").startswith("ok")


def gemm_title(gemm: str) -> str:
    """What tables and figures call a ``gemm`` column value ("first", "layer" or "step")."""
    return {"first": "gate/up GEMM", "step": "forward + backward"}.get(gemm, "whole layer")


def _ordered(values, order=()) -> list:
    seen = list(dict.fromkeys(values))
    return sorted(seen, key=lambda v: (order.index(v) if v in order else len(order), seen.index(v)))


def model_order(rows: list[dict]) -> list[str]:
    """Models in the series' order (:data:`moe_tutorial.shapes.MODEL_SHAPES`), others as measured."""
    return _ordered((r["model"] for r in rows), tuple(MODEL_SHAPES))


def impl_order(rows: list[dict]) -> list[str]:
    """Implementations in the series' order (loop first, the reference library last)."""
    return _ordered((r["impl"] for r in rows), FIRST_IMPLS + LAYER_IMPLS)


def batch_sizes(rows: list[dict]) -> list[int]:
    return sorted({r["M"] for r in rows})


#: The dtype column of rows whose experts are block-scaled FP8 (Part 7).
FP8_DTYPE_NAME = "float8_e4m3fn"

#: The protocol tables and figures show when the rows hold several and none is asked for.
HEADLINE_PROTOCOL = "cold-l2"


def subset(rows: list[dict], gemm: str | None = None, dtype: str | None = None, impls=None,
           protocol: str | None = None) -> list[dict]:
    """The rows of one ``gemm``, ``dtype`` and timing ``protocol`` (None: any), of the given
    ``impls`` (None: all).

    Tables and figures key a case by model, gemm, implementation and M, so two dtypes or two
    protocols of one case would collide. With ``dtype=None`` each implementation's rows must hold
    a single dtype; with ``protocol=None`` rows of several protocols are narrowed to
    :data:`HEADLINE_PROTOCOL`. Rows of FP8 experts (dtype float8_e4m3fn, bf16 activations; impl
    names of their own) are kept beside those of any ``dtype``.
    """
    rows = [r for r in rows if (gemm is None or r["gemm"] == gemm)
            and (dtype is None or r.get("dtype") in (dtype, FP8_DTYPE_NAME))
            and (impls is None or r["impl"] in impls) and (protocol is None or r.get("protocol") == protocol)]
    by_impl: dict = {}
    for r in rows:
        if r.get("dtype"):
            by_impl.setdefault(r["impl"], set()).add(r["dtype"])
    mixed = sorted(d for ds in by_impl.values() if len(ds) > 1 for d in ds)
    if mixed:
        raise ValueError(f"dtype: the results hold several dtypes {sorted(set(mixed))}; expected one of them, got None")
    protocols = {r.get("protocol") for r in rows}
    if len(protocols) > 1:
        if HEADLINE_PROTOCOL not in protocols:
            raise ValueError(f"protocol: the results hold several protocols {sorted(map(str, protocols))}; "
                             "expected one of them, got None")
        rows = [r for r in rows if r.get("protocol") == HEADLINE_PROTOCOL]
    return rows


def format_table(header: list[str], body: list[list[str]]) -> str:
    """Columns padded to their widest cell; first column left-aligned, the rest right-aligned."""
    widths = [max(len(str(c)) for c in col) for col in zip(header, *body)]
    lines = []
    for i, line in enumerate([header] + body):
        cells = [str(c).ljust(w) if j == 0 else str(c).rjust(w) for j, (c, w) in enumerate(zip(line, widths))]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def fraction(value: float) -> str:
    """Two decimals, or one significant digit below 0.01 (CPU runs reach 0.0001 of the floor)."""
    return f"{value:.2f}" if value >= 0.01 else f"{value:.0e}"


def _cell(row: dict | None, show) -> str:
    """A case's cell: "" where there is none, "wrong", "-" where it was not timed, else ``show(row)``."""
    if row is None:
        return ""
    if row.get("status") == "wrong":
        return "wrong"
    return show(row) if is_ok(row) else "-"


def _fraction_cell(row: dict) -> str:
    return "-" if row.get("fraction_of_floor") is None else fraction(row["fraction_of_floor"])


def _geomean_cell(value) -> str:
    """A :func:`floor_geomeans` value as a cell: "wrong", the geomean, or "-" where nothing ran."""
    return "-" if value is None else value if value == "wrong" else fraction(value)


def _index(rows):
    return {(r["model"], r["gemm"], r["impl"], r["M"]): r for r in rows}


def fraction_table(rows: list[dict], gemm: str | None = None, *, impls=None, dtype: str | None = None,
                   labels: dict | None = None, protocol: str | None = None) -> str:
    """model, gemm, impl, then the fraction of the floor reached at each M, then :func:`floor_geomeans`.

    ``gemm``, ``dtype`` and ``impls`` pick rows as :func:`subset` does; ``labels`` maps an
    implementation to the name its line shows.
    """
    rows = subset(rows, gemm, dtype, impls, protocol)
    index, sizes, labels = _index(rows), batch_sizes(rows), labels or {}
    gemms = _ordered((r["gemm"] for r in rows), ("first", "layer"))
    geomeans = {g: floor_geomeans(rows, g) for g in gemms}
    body = []
    for model in model_order(rows):
        for g in [g for g in gemms if any(r["model"] == model and r["gemm"] == g for r in rows)]:
            for impl in impl_order([r for r in rows if r["model"] == model and r["gemm"] == g]):
                cells = [_cell(index.get((model, g, impl, M)), _fraction_cell) for M in sizes]
                body.append([model, g, labels.get(impl, impl)] + cells
                            + [_geomean_cell(geomeans[g].get((model, impl)))])
    return format_table(["model", "gemm", "impl"] + [f"M={M}" for M in sizes] + ["geomean"], body)


def time_table(rows: list[dict], gemm: str | None = None) -> str:
    """model, gemm, impl, then the milliseconds of one call at each M: what a CPU run has to show.

    Without a GPU the floor is no GPU's, so a fraction of it means nothing; the times only show
    that each implementation ran (and passed its check) and how slow the interpreter is.
    """
    rows = subset(rows, gemm)
    index, sizes = _index(rows), batch_sizes(rows)
    gemms = _ordered((r["gemm"] for r in rows), ("first", "layer"))
    body = []
    for model in model_order(rows):
        for g in [g for g in gemms if any(r["model"] == model and r["gemm"] == g for r in rows)]:
            for impl in impl_order([r for r in rows if r["model"] == model and r["gemm"] == g]):
                body.append([model, g, impl] + [_cell(index.get((model, g, impl, M)), lambda r: f"{r['ms']:.3g}")
                                                for M in sizes])
    return format_table(["model", "gemm", "impl"] + [f"M={M} ms" for M in sizes], body)


def floor_geomeans(rows: list[dict], gemm: str = "first", *, dtype: str | None = None,
                   protocol: str | None = None) -> dict:
    """``{(model, impl): value}``: the geometric mean over M of the fraction of the floor.

    ``value`` is a float over the M where the implementation timed correctly (skipped M are
    left out, not counted as zero), or "wrong" when any of that model's cases failed its
    check. Pairs with no timed M are absent.
    """
    rows = subset(rows, gemm, dtype, protocol=protocol)
    out: dict = {}
    for model in model_order(rows):
        for impl in impl_order(rows):
            mine = [r for r in rows if r["model"] == model and r["impl"] == impl]
            if any(r.get("status") == "wrong" for r in mine):
                out[model, impl] = "wrong"
                continue
            fractions = [r["fraction_of_floor"] for r in mine if is_ok(r) and r.get("fraction_of_floor")]
            if fractions:
                out[model, impl] = geomean(fractions)
    return out


def geomean_table(rows: list[dict], gemm: str = "first", *, dtype: str | None = None,
                  labels: dict | None = None, protocol: str | None = None) -> str:
    """The headline table: one line per implementation, :func:`floor_geomeans` per model.

    A cell that counts only some of the M reads e.g. "0.10 (3/7 M)". ``labels`` maps an
    implementation to the name its line shows.
    """
    rows = subset(rows, gemm, dtype, protocol=protocol)
    values, names, labels = floor_geomeans(rows, gemm), model_order(rows), labels or {}
    body = []
    for impl in impl_order(rows):
        line = [labels.get(impl, impl)]
        for model in names:
            value = values.get((model, impl))
            mine = [r for r in rows if r["impl"] == impl and r["model"] == model]
            timed = sum(1 for r in mine if is_ok(r) and r.get("fraction_of_floor"))
            partial = isinstance(value, float) and timed < len(mine)
            line.append(_geomean_cell(value) + (f" ({timed}/{len(mine)} M)" if partial else ""))
        body.append(line)
    return format_table([gemm_title(gemm)] + names, body)


def best_tflops(rows: list[dict], impl: str = "fused", gemm: str = "first", *,
                protocol: str | None = None) -> dict[str, float]:
    """``{model: the highest TFLOP/s impl reached at any M}`` over rows that timed correctly."""
    best: dict[str, float] = {}
    for r in subset(rows, gemm, impls=(impl,), protocol=protocol):
        if is_ok(r) and r.get("tflops") is not None:
            best[r["model"]] = max(best.get(r["model"], 0.0), r["tflops"])
    return best


def speedup_table(rows: list[dict], model: str, gemm: str = "first", baseline: str = "sorted", *,
                  protocol: str | None = None, labels: dict | None = None) -> str:
    """How many times faster ``baseline`` is than each other implementation, per M."""
    rows = [r for r in subset(rows, gemm, protocol=protocol) if r["model"] == model]
    index, sizes, labels = _index(rows), batch_sizes(rows), labels or {}
    body = []
    for impl in impl_order(rows):
        if impl == baseline:
            continue
        line = [labels.get(impl, impl)]
        for M in sizes:
            base, other = index.get((model, gemm, baseline, M)), index.get((model, gemm, impl, M))
            ok = base is not None and is_ok(base)
            line.append(_cell(other, lambda r: f"{r['ms'] / base['ms']:.2f}x") if ok else "")
        body.append(line)
    return format_table([f"{labels.get(baseline, baseline)} vs"] + [f"M={M}" for M in sizes], body)


def family_speedups(rows: list[dict], family: str, baseline: str) -> dict[tuple[str, int], float]:
    """``{(model, M): baseline's ms / the fastest ms of the impls named ``family...``}`` over rows that
    timed correctly (above 1: the best of the family is faster), e.g. the Gluon layer's config pairs
    against Part 4's ``tl`` layer in ``data/h200_gluon_bf16_bench.csv``."""
    base = {(r["model"], r["M"]): r["ms"] for r in rows if r["impl"] == baseline and is_ok(r)}
    best: dict[tuple[str, int], float] = {}
    for r in rows:
        key = (r["model"], r["M"])
        if r["impl"].startswith(family) and is_ok(r) and key in base:
            best[key] = min(best.get(key, float("inf")), r["ms"])
    return {key: base[key] / ms for key, ms in best.items()}


def family_speedup_table(rows: list[dict], family: str, baseline: str) -> str:
    """:func:`family_speedups` as a table: one line per model, one column per M."""
    speedups = family_speedups(rows, family, baseline)
    sizes = sorted({M for _, M in speedups})
    body = [[model] + [f"{speedups[model, M]:.2f}x" if (model, M) in speedups else "-" for M in sizes]
            for model in model_order(rows) if any(m == model for m, _ in speedups)]
    return format_table([f"best {family} vs {baseline}"] + [f"M={M}" for M in sizes], body)


def skipped_reasons(rows: list[dict]) -> str:
    """One line per distinct reason a case was skipped, with how many cases it covers."""
    reasons: dict[str, int] = {}
    for r in rows:
        status = str(r.get("status") or "")
        if status.startswith("skipped"):
            key = f"{r['impl']} ({r['gemm']}): {status[len('skipped: '):]}"
            reasons[key] = reasons.get(key, 0) + 1
    return "\n".join(f"  {n:3d} x {k}" for k, n in reasons.items())


def skipped_table(rows: list[dict], *, labels: dict | None = None) -> str:
    """One line per implementation, gemm and model with skipped cases: which M, and why (the
    reason's first clause; :func:`skipped_reasons` gives every reason in full)."""
    labels, groups = labels or {}, {}
    for r in rows:
        status = str(r.get("status") or "")
        if status.startswith("skipped"):
            reason = status[len("skipped: "):]
            reason = reason.split(" needs ")[0] + (" does not fit in memory" if " needs " in reason else "")
            groups.setdefault((r["impl"], r["gemm"], r["model"], reason.split(" (")[0]), []).append(r["M"])
    order, models = impl_order(rows), model_order(rows)
    body = [[labels.get(impl, impl), gemm_title(gemm), model, ", ".join(map(str, sorted(Ms))), reason]
            for (impl, gemm, model, reason), Ms in sorted(groups.items(), key=lambda kv: (
                order.index(kv[0][0]), kv[0][1], models.index(kv[0][2])))]
    return format_table(["implementation", "", "model", "skipped M", "why"], body)


def ceilings_table(rows: list[dict]) -> str:
    """One line per bench run (rows sharing a date and protocol): the ceilings measured in it and
    what it timed. "read kernels" is what the read-only kernels got alone, "read ceiling" the best
    rate anything in the run reached (:mod:`moe_tutorial.perf.reached`), which the floors use."""
    runs: dict[tuple, list[dict]] = {}
    for r in rows:
        runs.setdefault((r.get("date") or "", r.get("protocol") or ""), []).append(r)

    def tbps(value) -> str:
        return f"{value:.2f}" if value else "-"
    body = []
    for (date, protocol), run in sorted(runs.items()):
        r = run[0]
        body.append([date, protocol, tbps(r.get("read_measured_tbps")), tbps(r.get("read_tbps")),
                     tbps(r.get("copy_tbps")), f"{r['matmul_tflops']:.0f}",
                     f"{r['launch_us']:.1f}" if r.get("launch_us") is not None else "-", _parts(run)])
    return format_table(["run", "protocol", "read kernels TB/s", "read ceiling TB/s", "copy TB/s", "matmul TFLOP/s",
                         "one launch (us)", "timed"], body)


def run_summary(rows: list[dict], *, labels: dict | None = None, width: int = 110) -> str:
    """Per bench run (rows sharing a date and protocol): its cases, models and what it timed, by ``labels``."""
    labels, runs = labels or {}, {}
    for r in rows:
        runs.setdefault((r.get("date") or "", r.get("protocol") or ""), []).append(r)
    out = []
    for (date, protocol), run in sorted(runs.items()):
        out.append(f"run of {date} ({protocol}): {len(run)} cases on {', '.join(model_order(run))}")
        timed = "; ".join(labels.get(i, i) for i in impl_order(run))
        out.append(textwrap.fill(timed, width, initial_indent="  timed: ", subsequent_indent="         "))
    return "\n".join(out)


def _parts(rows: list[dict]) -> str:
    """Which parts of the series ``rows`` time, in few words: "Part 1, Part 2", "Part 4, torch._grouped_mm"."""
    parts = []
    for impl in impl_order(rows):
        label = LABELS.get(impl, impl)
        part = "Part 4" if label.startswith(("Part 4", "layer step")) else label.split(",")[0]
        if part not in parts:
            parts.append(part)
    return ", ".join(parts)


def ceiling_text(row: dict) -> str:
    """The ceilings a row was judged by, in words: 'read 4.59 TB/s, bfloat16 matmul 727 TFLOP/s, ...'."""
    parts = []
    if row.get("read_tbps"):
        parts.append(f"read {row['read_tbps']:.2f} TB/s")
    if row.get("copy_tbps"):
        parts.append(f"copy {row['copy_tbps']:.2f} TB/s")
    parts.append(f"{row['dtype']} matmul {row['matmul_tflops']:.0f} TFLOP/s")
    if row.get("launch_us") is not None:
        parts.append(f"one launch {row['launch_us']:.1f} us")
    return ", ".join(parts)


def run_lines(rows: list[dict]) -> str:
    """One line per bench run in ``rows`` (a run: rows sharing a model and a date), with the
    ceilings measured in it and the implementations it timed, in the series' order."""
    runs: dict[tuple, list[dict]] = {}
    for r in rows:
        runs.setdefault((r["model"], r.get("date") or ""), []).append(r)
    models = model_order(rows)
    lines = []
    for (model, date), run in sorted(runs.items(), key=lambda kv: (models.index(kv[0][0]), kv[0][1])):
        r = run[0]
        lines.append(f"  {model}, run of {date or 'unknown date'} ({r.get('protocol') or 'protocol not recorded'}): "
                     f"{ceiling_text(r)}; {', '.join(impl_order(run))}")
    return "\n".join(lines)


def headline_ceilings(rows: list[dict], impl: str = "sorted", *, protocol: str | None = None) -> dict:
    """The ceilings of the run that timed ``impl`` (Part 4 by default) under ``protocol``.

    Returns the row's ``protocol``, ``date``, ``read_tbps`` (the read ceiling), ``read_measured_tbps``
    (what the read kernels got alone, :mod:`moe_tutorial.perf.reached`), ``copy_tbps``,
    ``matmul_tflops`` and ``launch_us``: the one source for the ceilings a notebook quotes.
    ValueError if no row of ``impl`` carries them, or if its rows come from runs with different ceilings.
    """
    keys = ("protocol", "date", "read_tbps", "read_measured_tbps", "copy_tbps", "matmul_tflops", "launch_us")
    mine = [r for r in subset(rows, impls=(impl,), protocol=protocol) if r.get("read_tbps")]
    runs = {tuple(r.get(k) for k in keys) for r in mine}
    if len(runs) != 1:
        raise ValueError(f"rows: expected the rows of {impl!r} to come from one run with its ceilings, "
                         f"got {len(runs)} runs")
    return dict(zip(keys, runs.pop()))


# --------------------------------------------------------------------------------------
# Part 4, one production step at a time (notebook 04)
# --------------------------------------------------------------------------------------

#: Part 4's steps in the order notebook 04 adds them, each keeping the ones before it; the last
#: one, "sorted", is Part 4 as shipped (the first GEMM's last step is short tails; the layer's,
#: the topk sum in one Triton launch).
LADDERS = {"first": FIRST_STEPS + ("sorted",), "layer": LAYER_STEPS + ("sorted",)}


def times(rows: list[dict], gemm: str, impl: str, *, protocol: str | None = None) -> dict:
    """``{(model, M): ms}`` of ``impl``'s timed, correct rows."""
    return {(r["model"], r["M"]): r["ms"] for r in subset(rows, gemm, impls=(impl,), protocol=protocol)
            if is_ok(r) and r.get("ms")}


def step_gains(rows: list[dict], gemm: str, before: str, after: str, *, protocol: str | None = None) -> dict:
    """``{(model, M): time of before / time of after}``: above 1 where ``after`` is faster."""
    old, new = times(rows, gemm, before, protocol=protocol), times(rows, gemm, after, protocol=protocol)
    return {key: old[key] / new[key] for key in old if key in new}


def gain_range(rows: list[dict], gemm: str, before: str, after: str, *, Ms=None, models=None,
               protocol: str | None = None) -> tuple[float, float]:
    """``(lowest, highest)`` of :func:`step_gains` over the given ``Ms`` and ``models`` (None: all)."""
    gains = [g for (model, M), g in step_gains(rows, gemm, before, after, protocol=protocol).items()
             if (Ms is None or M in Ms) and (models is None or model in models)]
    if not gains:
        raise ValueError(f"rows: no M where both {before!r} and {after!r} were timed ({gemm})")
    return min(gains), max(gains)


def largest_gain(rows: list[dict], gemm: str, before: str, after: str, *, Ms=None,
                 protocol: str | None = None) -> tuple[float, str, int]:
    """``(gain, model, M)`` of the largest :func:`step_gains` over ``Ms`` (None: all)."""
    gains = [(g, model, M) for (model, M), g in step_gains(rows, gemm, before, after, protocol=protocol).items()
             if Ms is None or M in Ms]
    if not gains:
        raise ValueError(f"rows: no M where both {before!r} and {after!r} were timed ({gemm})")
    return max(gains)


def gain_line(rows: list[dict], gemm: str, before: str, after: str, *, split: int = 256,
              protocol: str | None = None) -> str:
    """A step's gain in one line (:func:`step_gains`): its range up to M = ``split`` and above it,
    and where it is largest, e.g. "M <= 256: 1.00x to 1.03x; M > 256: 1.04x to 1.28x; most 1.28x,
    Qwen3-30B-A3B at M = 16384". :func:`step_gain_table` gives every M."""
    gains = step_gains(rows, gemm, before, after, protocol=protocol)
    if not gains:
        raise ValueError(f"rows: no M where both {before!r} and {after!r} were timed ({gemm})")
    parts = []
    for name, keep in ((f"M <= {split}", lambda M: M <= split), (f"M > {split}", lambda M: M > split)):
        mine = [g for (_, M), g in gains.items() if keep(M)]
        if mine:
            parts.append(f"{name}: {min(mine):.2f}x to {max(mine):.2f}x")
    best, model, M = max((g, model, M) for (model, M), g in gains.items())
    return "; ".join(parts) + f"; most {best:.2f}x, {model} at M = {M}"


def step_gain_table(rows: list[dict], gemm: str, before: str, after: str, *, protocol: str | None = None) -> str:
    """One line per model: how many times faster ``after`` runs than ``before`` at each M."""
    gains = step_gains(rows, gemm, before, after, protocol=protocol)
    models = [m for m in model_order(subset(rows, gemm, protocol=protocol)) if any(k[0] == m for k in gains)]
    sizes = sorted({M for _, M in gains})
    body = [[model] + [f"{gains[model, M]:.2f}x" if (model, M) in gains else "-" for M in sizes] for model in models]
    return format_table(["speed-up (time before / after)"] + [f"M={M}" for M in sizes], body)


def tuned_config(model: str, M: int, variant: str = "plain", dtype: str = "bfloat16",
                 gpu: str = "NVIDIA H200") -> KernelConfig:
    """The configuration the shipped tuned table holds for ``model``'s ``variant`` GEMM at exactly ``M``.

    What the committed bench ran as "+tuned" and "sorted" (the bench's M are the tuned M), read
    on any machine: ``get_config`` answers for the machine it runs on. ``variant`` is "plain"
    (the gate/up GEMM alone), "gated" or "down".
    """
    s = get_shape(model)
    N, K = {"plain": s.first_gemm, "gated": (s.intermediate, s.hidden), "down": s.second_gemm}[variant]
    key = problem_key(s.num_experts, N, K, s.topk, dtype, variant)
    for path in sorted(SHIPPED_DIR.glob("tuned_configs*.json")):
        by_m = json.loads(path.read_text()).get(gpu, {}).get(key, {})
        if str(M) in by_m:
            return KernelConfig(**by_m[str(M)])
    raise ValueError(f"M: expected a batch size the shipped table holds for {key} on {gpu}, got {M}")


def same_kernel_pairs(rows: list[dict], *, protocol: str | None = None, gpu: str = "NVIDIA H200") -> list[dict]:
    """Pairs of neighbouring steps that launched the very same kernels: their two timings show
    how far apart two measurements of one thing fall.

    - "+tuned" and "+tma" where the tuned configuration does not use TMA;
    - "+tma" and "sorted" where the tuned BLOCK_M is below 32 (short tails need 32 rows);
    - the layer's "+silu-epilogue" and "+decode-align" above SMALL_BATCH_PAIRS pairs (both take
      the three-launch alignment there).

    Each pair is ``{"model", "gemm", "M", "impls": (a, b), "ratio": ms of a / ms of b, "why"}``.
    """
    out = []
    for gemm in ("first", "layer"):
        for (model, M), ratio_tma in step_gains(rows, gemm, "+tuned", "+tma", protocol=protocol).items():
            if not tuned_config(model, M, gpu=gpu).use_tma:
                out.append(dict(model=model, gemm=gemm, M=M, impls=("+tuned", "+tma"), ratio=ratio_tma,
                                why="the tuned tile does not use TMA"))
        for (model, M), ratio in step_gains(rows, gemm, "+tma", "sorted", protocol=protocol).items():
            if tuned_config(model, M, gpu=gpu).block_m < 32:
                out.append(dict(model=model, gemm=gemm, M=M, impls=("+tma", "sorted"), ratio=ratio,
                                why="BLOCK_M < 32: no short tails"))
        for (model, M), ratio in step_gains(rows, gemm, "+silu-epilogue", "+decode-align", protocol=protocol).items():
            if M * get_shape(model).topk > SMALL_BATCH_PAIRS:
                out.append(dict(model=model, gemm=gemm, M=M, impls=("+silu-epilogue", "+decode-align"), ratio=ratio,
                                why=f"over {SMALL_BATCH_PAIRS} pairs: the same alignment"))
    order = model_order(rows)
    return sorted(out, key=lambda p: (p["gemm"] != "first", LADDERS[p["gemm"]].index(p["impls"][0]),
                                      order.index(p["model"]), p["M"]))


def fp8_same_kernel_pairs(rows: list[dict], *, protocol: str | None = None) -> list[dict]:
    """The FP8 run's pairs of steps that launched the very same kernel: "fp8-step0" and "fp8+swap"
    wherever the heuristic configuration does not swap operands (an expert with 16 rows or more),
    so that both run it unswapped. Same form as :func:`same_kernel_pairs`."""
    out = []
    for (model, M), ratio in step_gains(rows, "first", "fp8-step0", "fp8+swap", protocol=protocol).items():
        s = get_shape(model)
        if not fp8_heuristic_config(M, s.topk, s.num_experts, "plain", N=2 * s.intermediate).swap_ab:
            out.append(dict(model=model, gemm="first", M=M, impls=("fp8-step0", "fp8+swap"), ratio=ratio,
                            why="the heuristic does not swap here"))
    order = model_order(rows)
    return sorted(out, key=lambda p: (order.index(p["model"]), p["M"]))


def spread_percent(pairs: list[dict], gemm: str | None = None) -> float:
    """How far apart, in percent, the two timings of the most distant same-kernel pair fall."""
    ratios = [p["ratio"] for p in pairs if gemm is None or p["gemm"] == gemm]
    if not ratios:
        raise ValueError(f"pairs: none for gemm={gemm!r}")
    return 100 * (max(max(r, 1 / r) for r in ratios) - 1)


def same_kernel_table(pairs: list[dict]) -> str:
    """The pairs of :func:`same_kernel_pairs`, one line each, named by their place on the ladder
    (:data:`LADDERS`: "step 3 = step 4"), with the ratio of their two times."""
    body = [[gemm_title(p["gemm"]), p["model"], str(p["M"]),
             " = ".join(f"step {LADDERS[p['gemm']].index(i)}" for i in p["impls"]), p["why"], f"{p['ratio']:.3f}"]
            for p in pairs]
    return format_table(["", "model", "M", "same kernels", "why", "time ratio"], body)


# --------------------------------------------------------------------------------------
# Notebook 05: one table, two protocols
# --------------------------------------------------------------------------------------

def summary_table(rows: list[dict], impls, *, labels: dict | None = None, protocol: str | None = None,
                  markdown: bool = False) -> str:
    """One line per implementation, one column per model: the geometric-mean fraction of the
    floor of the gate/up GEMM, then of the whole layer ("GEMM / layer"; "-" where the
    implementation has no such variant). A mean over only some M says how many, e.g. "(3/7 M)".
    ``markdown=True`` gives the same table in Markdown (docs/results.md's)."""
    labels = labels or {}
    rows = subset(rows, protocol=protocol)
    models = model_order(rows)
    values = {g: floor_geomeans(rows, g) for g in ("first", "layer")}

    def cell(g, impl, model):
        mine = [r for r in rows if r["gemm"] == g and r["impl"] == impl and r["model"] == model]
        if not mine:
            return "-"
        value = values[g].get((model, impl))
        timed = sum(1 for r in mine if is_ok(r) and r.get("fraction_of_floor"))
        partial = isinstance(value, float) and timed < len(mine)
        return _geomean_cell(value) + (f" ({timed}/{len(mine)} M)" if partial else "")

    body = [[labels.get(impl, impl)] + [f"{cell('first', impl, m)} / {cell('layer', impl, m)}" for m in models]
            for impl in impls]
    header = ["gate/up GEMM / whole layer"] + models
    if markdown:
        return "\n".join("| " + " | ".join(line) + " |" for line in [header, ["---"] * len(header)] + body)
    return format_table(header, body)


def speedup_geomeans(rows: list[dict], gemm: str, faster: str, slower: str, *, protocol: str | None = None) -> dict:
    """``{model: geometric mean over M of time(slower) / time(faster)}`` where both were timed."""
    gains = step_gains(rows, gemm, slower, faster, protocol=protocol)
    return {m: geomean([g for (model, _), g in gains.items() if model == m])
            for m in model_order(subset(rows, gemm, protocol=protocol)) if any(k[0] == m for k in gains)}


def protocol_table(rows: list[dict], impls, gemm: str = "first", *, labels: dict | None = None) -> str:
    """The geometric-mean fraction of the floor of ``impls`` under each timing protocol, per model."""
    labels = labels or {}
    protocols = sorted({r.get("protocol") for r in rows if r.get("protocol")}, key=lambda p: p != HEADLINE_PROTOCOL)
    per = {p: floor_geomeans(rows, gemm, protocol=p) for p in protocols}
    models = model_order(subset(rows, gemm))
    body = []
    for impl in impls:
        for p in protocols:
            if any((m, impl) in per[p] for m in models):
                body.append([labels.get(impl, impl), p] + [_geomean_cell(per[p].get((m, impl))) for m in models])
    return format_table([gemm_title(gemm), "protocol"] + models, body)


def fraction_range(rows: list[dict], gemm: str, impl: str, *, Ms=None, protocol: str | None = None) -> tuple:
    """``(lowest, highest)`` fraction of the floor ``impl`` reached over ``Ms`` (None: all) and every model."""
    fracs = [r["fraction_of_floor"] for r in subset(rows, gemm, impls=(impl,), protocol=protocol)
             if is_ok(r) and r.get("fraction_of_floor") and (Ms is None or r["M"] in Ms)]
    if not fracs:
        raise ValueError(f"rows: no timed {impl!r} rows for gemm={gemm!r}")
    return min(fracs), max(fracs)
