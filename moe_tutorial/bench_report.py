"""Text tables from benchmark rows: fraction of the floor per M, geometric means, speed-ups.

The bench prints them at the end of a run and notebook 05 prints them from the shipped H200
results. Rows are dicts with :data:`moe_tutorial.results.FIELDS` keys (as ``load_rows`` gives).
A cell reads "wrong" where the result failed its check and "-" where the case was skipped.
"""
from __future__ import annotations

from .bench_impls import FIRST_IMPLS, LAYER_IMPLS
from .traffic import geomean


def is_ok(row: dict) -> bool:
    """Timed and correct: status "ok", or "ok (<timer used>)"."""
    return str(row.get("status") or "").startswith("ok")


def _ordered(values, order=()) -> list:
    seen = list(dict.fromkeys(values))
    return sorted(seen, key=lambda v: (order.index(v) if v in order else len(order), seen.index(v)))


def models(rows: list[dict]) -> list[str]:
    """Models in the order they were measured."""
    return _ordered(r["model"] for r in rows)


def impls(rows: list[dict]) -> list[str]:
    """Implementations in the series' order (loop first, the reference library last)."""
    return _ordered((r["impl"] for r in rows), FIRST_IMPLS + LAYER_IMPLS)


def batch_sizes(rows: list[dict]) -> list[int]:
    return sorted({r["M"] for r in rows})


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


def _cell(row: dict | None) -> str:
    if row is None:
        return ""
    if row.get("status") == "wrong":
        return "wrong"
    if not is_ok(row) or row.get("fraction_of_floor") is None:
        return "-"
    return fraction(row["fraction_of_floor"])


def _index(rows):
    return {(r["model"], r["gemm"], r["impl"], r["M"]): r for r in rows}


def fraction_table(rows: list[dict], gemm: str | None = None) -> str:
    """model, gemm, impl, then the fraction of the floor reached at each M, then the geomean."""
    rows = [r for r in rows if gemm is None or r["gemm"] == gemm]
    index, sizes = _index(rows), batch_sizes(rows)
    body = []
    for model in models(rows):
        for g in _ordered((r["gemm"] for r in rows if r["model"] == model), ("first", "layer")):
            for impl in impls([r for r in rows if r["model"] == model and r["gemm"] == g]):
                cells = [index.get((model, g, impl, M)) for M in sizes]
                fractions = [c["fraction_of_floor"] for c in cells if c and is_ok(c)]
                body.append([model, g, impl] + [_cell(c) for c in cells]
                            + [fraction(geomean(fractions)) if fractions else "-"])
    return format_table(["model", "gemm", "impl"] + [f"M={M}" for M in sizes] + ["geomean"], body)


def geomean_table(rows: list[dict], gemm: str = "first") -> str:
    """DESIGN.md's table: one line per implementation, the geomean fraction of the floor per model.

    A model's cell reads "wrong" when any of its cases failed the check, and counts only the
    M where the implementation ran.
    """
    rows = [r for r in rows if r["gemm"] == gemm]
    names = models(rows)
    body = []
    for impl in impls(rows):
        line = [impl]
        for model in names:
            mine = [r for r in rows if r["impl"] == impl and r["model"] == model]
            if any(r.get("status") == "wrong" for r in mine):
                line.append("wrong")
                continue
            fractions = [r["fraction_of_floor"] for r in mine if is_ok(r)]
            done = fraction(geomean(fractions)) if fractions else "-"
            line.append(done if len(fractions) == len(mine) or not fractions else f"{done} ({len(fractions)}/{len(mine)} M)")
        body.append(line)
    return format_table([f"{gemm} GEMM" if gemm == "first" else "whole layer"] + names, body)


def speedup_table(rows: list[dict], model: str, gemm: str = "first", baseline: str = "sorted") -> str:
    """How many times faster ``baseline`` is than each other implementation, per M."""
    rows = [r for r in rows if r["model"] == model and r["gemm"] == gemm]
    index, sizes = _index(rows), batch_sizes(rows)
    body = []
    for impl in impls(rows):
        if impl == baseline:
            continue
        line = [impl]
        for M in sizes:
            base, other = index.get((model, gemm, baseline, M)), index.get((model, gemm, impl, M))
            if base is None or other is None or not is_ok(base):
                line.append("")
            elif other.get("status") == "wrong":
                line.append("wrong")
            elif not is_ok(other):
                line.append("-")
            else:
                line.append(f"{other['ms'] / base['ms']:.2f}x")
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
