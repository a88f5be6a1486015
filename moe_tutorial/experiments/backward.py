"""Part 8 on one H200: the training step's times, memory and gradients, read back.

``measurements/scripts/h200_backward.py`` times, in one run and under the cold-l2 protocol (a CUDA
graph per call where one can hold it; calls slower than 20 ms with events, L2 flushed before
each), the forward, the forward + backward and the backward alone of three implementations on
real layer shapes: ``ours`` (``moe_layer(impl="sorted")`` with autograd, Part 8's kernels), the
``grouped_mm`` composition (``torch._grouped_mm`` for gate/up and down, SiLU * up, the weighted
sum, autograd's backward) and Liger-Kernel's ``fused_moe`` where installed. One row per (model, T,
implementation) in ``moe_tutorial/data/h200_backward.csv`` (:data:`FIELDS`); the file ships empty
until that run is committed, and every reader here says so instead of inventing numbers.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..perf.report import format_table
from ..perf.results import DATA_DIR, read_csv

BACKWARD = DATA_DIR / "h200_backward.csv"
#: The implementations the script times, as the CSV names them, and how tables label them.
IMPLS = {"ours": "Part 8 (Triton, this series)", "grouped_mm": "torch._grouped_mm composition, autograd",
         "liger": "Liger-Kernel fused_moe"}
#: Ours before its last lever, timed in the same run: dO and x gathered by the kernels, no sorted
#: copies (:func:`sorted_copies_gain` reads it; the tables above leave it out).
GATHERED = "ours-gathered"
#: Ours with the dW GEMMs in ``tl`` (the Gluon dW kernel's baseline, and the sorted copies' other
#: side where the run has it: the gathered row keeps ``tl``'s dW GEMMs too).
TL_DW = "ours-tl-dw"
#: Ours with every GEMM in ``tl`` (dA' too: the Gluon dA' kernel's baseline, and the sorted copies'
#: other side where the run has it: the gathered row keeps ``tl``'s GEMMs too).
TL = "ours-tl"
#: The anchors ours is judged against: the faster of them at each (model, T).
ANCHORS = ("grouped_mm", "liger")
#: The issue's targets: forward + backward at least this much faster than the faster anchor, and the
#: backward alone at least this fraction of the bf16 matmul rate measured in the same run at T = 32768.
STEP_SPEEDUP_TARGET, BACKWARD_MATMUL_TARGET, TARGET_T = 1.25, 0.55, 32768

#: Columns, in order. Times in ms; ``*_timer`` names the timer each phase ended up with
#: (:func:`moe_tutorial.perf.timing.measure_ms`); bytes of device memory: ``kept_bytes`` allocated
#: after the forward beyond its inputs and output (what is saved for the backward), ``peak_bytes``
#: the most allocated during forward and backward beyond the inputs; ``first_call_s`` the first
#: forward + backward of the process on that model (compilation included, no autotuning); ``note``
#: says how an anchor ran (Liger-Kernel: whether it autotuned).
FIELDS = ["gpu", "driver", "torch", "triton", "date", "protocol", "matmul_tflops",
          "model", "E", "hidden", "inter", "topk", "T", "impl",
          "forward_ms", "forward_timer", "step_ms", "step_timer", "backward_ms", "backward_timer",
          "kept_bytes", "peak_bytes", "first_call_s", "rel_error", "status", "note"]
_INT = {"E", "hidden", "inter", "topk", "T", "kept_bytes", "peak_bytes"}
_FLOAT = {"matmul_tflops", "forward_ms", "step_ms", "backward_ms", "first_call_s", "rel_error"}


def load_backward(path: Path | str = BACKWARD) -> list[dict]:
    """The rows of a run of the script (``[]`` when the file has none yet)."""
    path = Path(path)
    if not path.exists() or not path.read_text().strip():
        return []
    return read_csv(path, _INT, _FLOAT)


def step_flops(T: int, hidden: int, inter: int, topk: int) -> dict:
    """FLOPs of the layer's GEMMs: the forward's ``6 T topk hidden inter`` (``2 * 3`` for two
    multiply-adds over three [hidden, inter] matrices), the backward's twice that (dA', dx and
    the two dW), and the step's three times."""
    forward = 6.0 * T * topk * hidden * inter
    return {"forward": forward, "backward": 2 * forward, "step": 3 * forward}


def tflops(row: dict, phase: str) -> float | None:
    """TFLOP/s of one phase ("forward", "backward" or "step") of a row, or None if not timed."""
    ms = row.get(f"{phase}_ms")
    if not ms:
        return None
    return step_flops(row["T"], row["hidden"], row["inter"], row["topk"])[phase] / (ms * 1e-3) / 1e12


def verdicts(rows: list[dict]) -> list[dict]:
    """Per (model, T): ours against the faster anchor (forward + backward) and the backward's
    fraction of the run's matmul rate, each with the issue's target; rows without ours are left out."""
    out = []
    for (model, T) in sorted({(r["model"], r["T"]) for r in rows}, key=lambda k: (k[0], k[1])):
        case = {r["impl"]: r for r in rows if r["model"] == model and r["T"] == T and r["status"] == "ok"}
        if "ours" not in case:
            continue
        ours = case["ours"]
        anchors = {k: case[k]["step_ms"] for k in ANCHORS if k in case and case[k]["step_ms"]}
        faster = min(anchors, key=anchors.get) if anchors else None
        speedup = anchors[faster] / ours["step_ms"] if faster else None
        backward_fraction = tflops(ours, "backward") / ours["matmul_tflops"] if ours["backward_ms"] else None
        out.append({"model": model, "T": T, "faster_anchor": faster, "step_speedup": speedup,
                    "step_ok": speedup is not None and speedup >= STEP_SPEEDUP_TARGET,
                    "backward_fraction": backward_fraction,
                    "backward_ok": None if T != TARGET_T else backward_fraction >= BACKWARD_MATMUL_TARGET})
    return out


NOT_MEASURED = ("not measured yet: `measurements/scripts/h200_backward.py` writes the rows, "
                "`moe_tutorial/data/h200_backward.csv` ships them")


def summary_table(rows: list[dict], markdown: bool = False) -> str:
    """Forward + backward ms of each implementation per (model, T), ours' speed-up over the faster
    anchor, and ours' backward as a fraction of the matmul rate; :data:`NOT_MEASURED` without rows."""
    if not rows:
        return NOT_MEASURED
    impls = [i for i in IMPLS if any(r["impl"] == i for r in rows)]
    lines = []
    for v in verdicts(rows):
        cells = [v["model"], str(v["T"])]
        for impl in impls:
            row = next((r for r in rows if r["model"] == v["model"] and r["T"] == v["T"] and r["impl"] == impl), None)
            cells.append(f"{row['step_ms']:.2f}" if row and row["status"] == "ok" and row["step_ms"] else "-")
        # Three digits: a speed-up of 1.249 must not read as the aim of 1.25.
        cells.append(f"{v['step_speedup']:.3f}x" if v["step_speedup"] else "-")
        cells.append(f"{v['backward_fraction']:.2f}" if v["backward_fraction"] else "-")
        lines.append(cells)
    header = ["model", "T"] + [f"{i} fwd+bwd ms" for i in impls] + ["ours vs faster anchor", "ours bwd / matmul"]
    return _table(header, lines, markdown)


def _table(header: list[str], lines: list[list[str]], markdown: bool) -> str:
    """Aligned text, or with ``markdown`` a Markdown table (docs/results.md pastes them)."""
    if markdown:
        return "\n".join(["| " + " | ".join(header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
                         + ["| " + " | ".join(c) + " |" for c in lines])
    return format_table(header, lines)


def sorted_copies_gain(rows: list[dict]) -> list[dict]:
    """Per (model, T) where both ran: the backward's ms with dO and x gathered by the kernels
    (:data:`GATHERED`) and with their sorted copies (ours, or :data:`TL` or :data:`TL_DW` where the
    run has it: the same ``tl`` GEMMs on both sides), the speed-up, and the extra peak
    memory of the step in bytes (the transient copy)."""
    out = []
    for (model, T) in sorted({(r["model"], r["T"]) for r in rows}):
        case = {r["impl"]: r for r in rows if r["model"] == model and r["T"] == T and r["status"] == "ok"}
        ours = case.get(TL, case.get(TL_DW, case.get("ours")))
        if ours is None or GATHERED not in case or not ours["backward_ms"]:
            continue
        before = case[GATHERED]
        out.append({"model": model, "T": T, "gathered_ms": before["backward_ms"], "sorted_ms": ours["backward_ms"],
                    "speedup": before["backward_ms"] / ours["backward_ms"],
                    "extra_peak_bytes": ours["peak_bytes"] - before["peak_bytes"]})
    return out


def sorted_copies_table(rows: list[dict]) -> str:
    """:func:`sorted_copies_gain` as a table (:data:`NOT_MEASURED` without rows)."""
    gains = sorted_copies_gain(rows)
    if not gains:
        return NOT_MEASURED
    return format_table(["model", "T", "bwd ms, gathered", "bwd ms, sorted copies", "speed-up", "extra peak GB"],
                        [[g["model"], str(g["T"]), f"{g['gathered_ms']:.2f}", f"{g['sorted_ms']:.2f}",
                          f"{g['speedup']:.2f}x", f"{g['extra_peak_bytes'] / 1e9:+.2f}"] for g in gains])


# ------------------------------------------------------------- the dW and dA' GEMMs in Gluon

#: The dW tile sweep on one H200 (the script's step 3, DeepSeek-V3): one row per (T, GEMM, tile),
#: each GEMM alone; the step it chose is in :data:`BACKWARD`, ``ours`` beside :data:`TL_DW`.
H200_DW_TILES = DATA_DIR / "h200_dw_tiles.csv"
#: The same sweep and step on one H100, the first GPU the kernel ran on (its tiles are the H100's table).
H100_DW_TILES = DATA_DIR / "h100_dw_tiles.csv"
H100_BACKWARD = DATA_DIR / "h100_backward.csv"
#: The dA' tile sweep on one H200 (``--gluon-only``: the table's ``tl`` tile against the Gluon dA'
#: kernel's), Mixtral-8x7B at every T and DeepSeek-V3 at 16384; ``ours-tl-dw`` beside :data:`TL` is its step.
H200_DACT_TILES = DATA_DIR / "h200_dact_tiles.csv"


def load_tiles(path: Path | str = H200_DW_TILES) -> list[dict]:
    """The rows of a tile sweep, each with its ``tile`` parsed from the JSON config."""
    rows = read_csv(path, {"T"}, {"ms", "tflops", "rel_error"})
    for r in rows:
        r["tile"] = json.loads(r["config"])
    return rows


def tile_name(tile: dict) -> str:
    """``"128x256x64 w8 s3"``: rows x columns x K (or run rows) a step, warps, stages."""
    return f"{tile['block_m']}x{tile['block_n']}x{tile['block_k']} w{tile['num_warps']} s{tile['num_stages']}"


def gluon_gains(rows: list[dict]) -> list[dict]:
    """Per (model, T, GEMM) of a sweep: the fastest ``tl`` tile and the fastest Gluon tile, their ms,
    and ``speedup`` (tl's time over Gluon's: above 1 the Gluon kernel is faster)."""
    out = []
    for key in sorted({(r["model"], r["T"], r["gemm"]) for r in rows}, key=lambda k: (k[0], k[1], k[2] != "dw2")):
        ok = [r for r in rows if (r["model"], r["T"], r["gemm"]) == key and r["status"] == "ok"]
        tl = min((r for r in ok if not r["tile"]["gluon"]), key=lambda r: r["ms"])
        gl = min((r for r in ok if r["tile"]["gluon"]), key=lambda r: r["ms"])
        out.append({"model": key[0], "T": key[1], "gemm": key[2], "tl_ms": tl["ms"], "tl_tile": tile_name(tl["tile"]),
                    "gluon_ms": gl["ms"], "gluon_tile": tile_name(gl["tile"]), "speedup": tl["ms"] / gl["ms"]})
    return out


def gluon_gains_table(gains: list[dict]) -> str:
    """:func:`gluon_gains` as a table."""
    return format_table(["model", "T", "GEMM", "tl ms", "tl's fastest tile", "Gluon ms", "Gluon's fastest tile",
                         "speed-up"],
                        [[g["model"], str(g["T"]), g["gemm"], f"{g['tl_ms']:.2f}", g["tl_tile"], f"{g['gluon_ms']:.2f}",
                          g["gluon_tile"], f"{g['speedup']:.2f}x"] for g in gains])


def gluon_step(rows: list[dict]) -> list[dict]:
    """Per (model, T) of a run with :data:`TL_DW` rows: the step (forward + backward) with the table's
    Gluon kernels (``ours_ms``), with the dW GEMMs in ``tl`` (``tl_dw_ms``) and, where the run has it,
    with every GEMM in ``tl`` (``tl_ms``, else None), and each against the faster anchor."""
    out = []
    for (model, T) in sorted({(r["model"], r["T"]) for r in rows}):
        case = {r["impl"]: r for r in rows if r["model"] == model and r["T"] == T and r["status"] == "ok"}
        anchors = {k: case[k]["step_ms"] for k in ANCHORS if k in case}
        if "ours" not in case or TL_DW not in case or not anchors:
            continue
        anchor = min(anchors.values())
        ours, tl_dw = case["ours"]["step_ms"], case[TL_DW]["step_ms"]
        tl = case[TL]["step_ms"] if TL in case else None
        out.append({"model": model, "T": T, "ours_ms": ours, "tl_dw_ms": tl_dw, "tl_ms": tl, "anchor_ms": anchor,
                    "speedup": anchor / ours, "tl_dw_speedup": anchor / tl_dw,
                    "tl_speedup": anchor / tl if tl else None})
    return out


def gluon_step_table(steps: list[dict], markdown: bool = False) -> str:
    """:func:`gluon_step` as a table: each step's ms and its speed-up over the faster anchor, from every
    GEMM in ``tl`` to the table's Gluon dA' (``+ dA'``) and dW (``+ dW``) kernels."""
    def cell(ms, speedup):
        return f"{ms:.2f} ({speedup:.3f}x)" if ms else "-"
    return _table(["model", "T", "faster anchor ms", "all tl", "+ Gluon dA'", "+ Gluon dW (ours)"],
                  [[s["model"], str(s["T"]), f"{s['anchor_ms']:.2f}", cell(s["tl_ms"], s["tl_speedup"]),
                    cell(s["tl_dw_ms"], s["tl_dw_speedup"]), cell(s["ours_ms"], s["speedup"])] for s in steps],
                  markdown)


# ------------------------------------------------------------- the first call

#: ``measurements/scripts/first_call_profile.py``'s rows: a fresh process's first forward + backward,
#: Triton's cache empty, the kernels compiled ``"side by side"`` (the layer's default,
#: :mod:`moe_tutorial.kernels.precompile`) or ``"one by one"`` at their launches.
FIRST_CALL = DATA_DIR / "first_call.csv"
#: The issue's aim for a first call with the shipped table, in seconds.
FIRST_CALL_AIM_S = 10.0


def load_first_call(path: Path | str = FIRST_CALL) -> list[dict]:
    """The rows of :data:`FIRST_CALL` (``warm_torch`` as a bool)."""
    rows = read_csv(path, {"T", "cpus", "kernels"}, {"first_call_s", "second_ms"})
    for r in rows:
        r["warm_torch"] = r["warm_torch"] == "True"
    return rows
