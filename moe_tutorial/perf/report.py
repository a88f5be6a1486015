"""Text tables from benchmark rows: fraction of the floor per M, geometric means, speed-ups.

The bench prints them at the end of a run and notebooks 03 to 05 print them from the shipped H200
results. Rows are dicts with :data:`moe_tutorial.perf.results.FIELDS` keys (as ``load_rows`` gives).
A cell reads "wrong" where the result failed its check and "-" where the case was skipped.
Tables name implementations as the CSV does; pass ``labels`` (e.g.
:data:`moe_tutorial.perf.registry.LABELS`) for the series' words.
"""
from __future__ import annotations

from ..shapes import MODEL_SHAPES
from .registry import FIRST_IMPLS, LAYER_IMPLS
from .traffic import geomean


def is_ok(row: dict) -> bool:
    """Timed and correct: status "ok", or "ok (<timer used>)"."""
    return str(row.get("status") or "").startswith("ok")


def gemm_title(gemm: str) -> str:
    """What tables and figures call a ``gemm`` column value ("first" or "layer")."""
    return "gate/up GEMM" if gemm == "first" else "whole layer"


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


#: The protocol tables and figures show when the rows hold several and none is asked for.
HEADLINE_PROTOCOL = "cold-l2"


def subset(rows: list[dict], gemm: str | None = None, dtype: str | None = None, impls=None,
           protocol: str | None = None) -> list[dict]:
    """The rows of one ``gemm``, ``dtype`` and timing ``protocol`` (None: any), of the given
    ``impls`` (None: all).

    Tables and figures key a case by model, gemm, implementation and M, so two dtypes or two
    protocols of one case would collide. With ``dtype=None`` the rows must hold a single dtype;
    with ``protocol=None`` rows of several protocols are narrowed to :data:`HEADLINE_PROTOCOL`.
    """
    rows = [r for r in rows if (gemm is None or r["gemm"] == gemm) and (dtype is None or r.get("dtype") == dtype)
            and (impls is None or r["impl"] in impls) and (protocol is None or r.get("protocol") == protocol)]
    dtypes = sorted({r["dtype"] for r in rows if r.get("dtype")})
    if len(dtypes) > 1:
        raise ValueError(f"dtype: the results hold several dtypes {dtypes}; expected one of them, got None")
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
                  protocol: str | None = None) -> str:
    """How many times faster ``baseline`` is than each other implementation, per M."""
    rows = [r for r in subset(rows, gemm, protocol=protocol) if r["model"] == model]
    index, sizes = _index(rows), batch_sizes(rows)
    body = []
    for impl in impl_order(rows):
        if impl == baseline:
            continue
        line = [impl]
        for M in sizes:
            base, other = index.get((model, gemm, baseline, M)), index.get((model, gemm, impl, M))
            ok = base is not None and is_ok(base)
            line.append(_cell(other, lambda r: f"{r['ms'] / base['ms']:.2f}x") if ok else "")
        body.append(line)
    return format_table([f"{baseline} vs"] + [f"M={M}" for M in sizes], body)


def skipped_reasons(rows: list[dict]) -> str:
    """One line per distinct reason a case was skipped, with how many cases it covers."""
    reasons: dict[str, int] = {}
    for r in rows:
        status = str(r.get("status") or "")
        if status.startswith("skipped"):
            key = f"{r['impl']} ({r['gemm']}): {status[len('skipped: '):]}"
            reasons[key] = reasons.get(key, 0) + 1
    return "\n".join(f"  {n:3d} x {k}" for k, n in reasons.items())


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
