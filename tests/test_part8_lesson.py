"""Notebook 08 (Part 8, training) as the series wants a lesson: it reads in both languages, its
excerpts are the package's, and the numbers its prose states come from the data or the code they
describe. (Its reading time and its predict prompts are checked with every lesson's:
tests/test_reading_load.py, tests/test_lesson_form.py.)"""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

import csv
import json
import re
from pathlib import Path

import torch
from prose import NOTEBOOKS, assert_says
from reading import split

from moe_tutorial import training
from moe_tutorial.experiments import backward
from moe_tutorial.shapes import MODEL_SHAPES

NOTEBOOK = "08_training"
#: Nsight Compute on Mixtral-8x7B's step at T = 16384 after the Gluon levers (one row per GEMM of the step).
MIXTRAL_PROFILE = (Path(__file__).resolve().parents[1] / "measurements" / "logs" / "2026-12-06-19-gluon-dact"
                   / "call-e" / "ncu-step-Mixtral-8x7B-T16384-summary.csv")


def ncu_summary(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
CJK = re.compile(r"[\u4e00-\u9fff]")


def cells():
    return json.loads((NOTEBOOKS / f"{NOTEBOOK}.ipynb").read_text())["cells"]


def test_objectives_first_recap_and_chinese_summary_last_headings_in_both_languages():
    lesson, appendix = split(NOTEBOOK)
    texts = ["".join(c["source"]) for c in lesson if c["cell_type"] == "markdown"]
    assert "".join(appendix[0]["source"]).startswith("## Appendix: ")     # the lesson ends, then the appendix
    assert "**What you will learn**" in texts[0] and "../docs/seed-article.md" in texts[0]
    assert texts[-2].startswith("## Recap / 回顾") and texts[-1].startswith("## 中文小结")
    assert len(CJK.findall(texts[-1])) > 150 and "../docs/seed-article.md" in texts[-1]
    for text in texts + ["".join(c["source"]) for c in appendix if c["cell_type"] == "markdown"]:
        for line in text.splitlines():
            if re.match(r"#{1,3} ", line):
                assert CJK.search(line) and (line.startswith("## 中文小结") or re.search(r"[A-Za-z]{3}", line)), line


def test_the_kernels_are_shown_from_the_package_never_pasted():
    for c in cells():
        text = "".join(c["source"])
        if c["cell_type"] == "code":
            assert "@triton.jit" not in text and "tl.load" not in text


def test_the_numbers_the_prose_states():
    inter = MODEL_SHAPES["Qwen3-30B-A3B"].intermediate
    assert -(-inter // 128) == 6
    assert_says(NOTEBOOK, "(`I = {}`) with `BLOCK_N = 128`", inter)
    assert_says(NOTEBOOK, "Six. Atomic adds land in whatever order")
    flops = backward.step_flops(4096, 2048, 768, 8)
    assert flops["step"] == 3 * flops["forward"] == 1.5 * flops["backward"]
    assert_says(NOTEBOOK, "How many times the forward's FLOPs is a whole training step?")
    task = training.make_task()
    assert torch.allclose(task.weights[:-1] / task.weights[1:], torch.full((3,), 2.0, dtype=torch.float64))
    assert_says(NOTEBOOK, "Cluster 0 is drawn twice as often as cluster 1")


def test_without_balancing_the_busiest_expert_carries_more_than_twice_the_even_share():
    cs = cells()
    out = "".join("".join(o["text"]) for c in cs if c.get("id") == "p8-learn" for o in c["outputs"] if "text" in o)
    shares = {line.split(":")[0].strip(): float(re.search(r"busiest expert ([\d.]+)x", line)[1])
              for line in out.splitlines() if "busiest" in line}
    assert shares["none"] > 2 > max(shares["aux loss"], shares["bias"])
    losses = {line.split(":")[0].strip(): float(re.search(r"-> ([\d.]+)", line)[1])
              for line in out.splitlines() if "busiest" in line}
    assert losses["none"] < min(losses["aux loss"], losses["bias"])        # "both pay for it in loss"
    assert_says(NOTEBOOK, "and here both pay for it in loss")
    assert_says(NOTEBOOK, "More than twice the even share")
    assert "1 expert(s) idle" in out


def test_what_the_h200_run_shows():
    """Section 10's reading of the table: each number is the committed run's (data/h200_backward.csv)."""
    rows = backward.load_backward()
    T = backward.TARGET_T
    verdict = {(v["model"], v["T"]): v for v in backward.verdicts(rows)}
    ok = {(r["model"], r["T"], r["impl"]): r for r in rows if r["status"] == "ok"}
    qwen, ds, mixtral = "Qwen3-30B-A3B", "DeepSeek-V3", "Mixtral-8x7B"

    def speed(model, t, digits=2):
        return f"{verdict[(model, t)]['step_speedup']:.{digits}f}"

    Ts = (4096, 16384, T)
    assert all(v["faster_anchor"] == "grouped_mm" for v in verdict.values())
    assert {k for k, v in verdict.items() if v["step_ok"]} == {(m, t) for m in (qwen, ds) for t in Ts}
    assert_says(NOTEBOOK, "The aim was a training step {}x as fast as the faster anchor at every T, with the backward "
                "at {} of the matmul rate at T = {}.", backward.STEP_SPEEDUP_TARGET,
                backward.BACKWARD_MATMUL_TARGET, T)
    assert_says(NOTEBOOK, "On Qwen3-30B-A3B (128 experts of `I = {}`) ours reaches it at every T: {}x, {}x and {}x as "
                "fast as the faster anchor at T = 4096, 16384 and {}.", MODEL_SHAPES[qwen].intermediate,
                *(speed(qwen, t) for t in Ts), T)
    ds_rows = [r for r in rows if r["model"] == ds]
    ours_dates = {r["date"] for r in ds_rows if r["impl"] not in ("liger", backward.GATHERED)}
    assert len(ours_dates) == 1 and min(ours_dates) > max(r["date"] for r in ds_rows if r["impl"] == "liger")
    assert {r["impl"] for r in ds_rows} >= {backward.TL_DW, backward.TL}   # "with its dA' and dW GEMMs in Gluon"
    assert_says(NOTEBOOK, "DeepSeek-V3, in a later run with its dA' and dW GEMMs in Gluon where they win (the "
                "appendix; Liger-Kernel's rows are from the run before), reaches it at every T as well ({}x, {}x and "
                "{}x). Mixtral-8x7B's eight large experts stay under it ({}x, {}x and {}x)",
                *(speed(ds, t, 3) for t in Ts), *(speed(mixtral, t) for t in Ts))
    assert max(verdict[(mixtral, t)]["step_speedup"] for t in Ts) < min(verdict[(ds, t)]["step_speedup"] for t in Ts)
    # "four of ours' six at 90% to 97% of the tensor pipe's cycles and the other two at 75% and 77%":
    # the Nsight Compute summary of Mixtral-8x7B's step at T = 16384 after the levers (call e).
    pipe = sorted(round(float(r["tensor_pipe_pct"].rstrip(" %"))) for r in ncu_summary(MIXTRAL_PROFILE))
    assert pipe[:2] == [75, 77] and 90 <= pipe[2] and pipe[-1] <= 97
    assert_says(NOTEBOOK, "four of ours' six at {}% to {}% of the tensor pipe's cycles and the other two at {}% and "
                "{}%", pipe[2], pipe[-1], *pipe[:2])

    def gap(impl):
        r = ok[(qwen, 4096, impl)]
        return r["step_ms"] - r["forward_ms"] - r["backward_ms"]
    assert gap("ours") > gap("grouped_mm") > 0
    assert_says(NOTEBOOK, "on Qwen3-30B-A3B ours' step is {:.2f} ms longer than its forward (one graph replay) plus "
                "its backward timed alone, the composition's {:.2f} ms", gap("ours"), gap("grouped_mm"))
    fractions = [verdict[(m, T)]["backward_fraction"] for m in (qwen, ds, mixtral)]
    assert all(verdict[(m, T)]["backward_ok"] for m in (qwen, ds, mixtral))
    assert_says(NOTEBOOK, "Ours' backward reaches {:.2f}, {:.2f} and {:.2f} of the matmul rate at T = {} "
                "(Qwen3-30B-A3B in {:.2f} ms), {} or more on every model.", *sorted(fractions), T,
                ok[(qwen, T, "ours")]["backward_ms"], backward.BACKWARD_MATMUL_TARGET)
    assert ok[(qwen, T, "ours")]["backward_ms"] <= 11.4                  # the Qwen3 figure
    cases = [(m, t) for (m, t, i) in ok if i == "ours"]
    less = [ok[(m, t, "grouped_mm")]["kept_bytes"] / ok[(m, t, "ours")]["kept_bytes"] for m, t in cases]
    under = [100 * (1 - ok[(m, t, "ours")]["kept_bytes"] / ok[(m, t, "liger")]["kept_bytes"]) for m, t in cases]
    assert min(under) > 0                                      # the memory target: no more than Liger keeps
    assert_says(NOTEBOOK, "ours keeps {:.1f}x to {:.1f}x less for the backward than the composition, and {:.2f}% "
                "to {:.2f}% less than Liger-Kernel", min(less), max(less), min(under), max(under))


def test_what_the_sorted_copies_gain():
    gains = backward.sorted_copies_gain(backward.load_backward())
    assert min(g["speedup"] for g in gains) > 1                                # "faster in every case"
    assert max(gains, key=lambda g: g["speedup"])["model"] == "Mixtral-8x7B"
    assert_says(NOTEBOOK, "Faster in every case, {:.2f}x to {:.2f}x, the most on Mixtral-8x7B; the extra peak "
                "memory, the copy alive at that moment, is at most {:.2f} GB.",
                min(g["speedup"] for g in gains), max(g["speedup"] for g in gains),
                max(g["extra_peak_bytes"] for g in gains) / 1e9)


def test_what_the_gluon_dw_kernel_gains():
    """The appendix's reading of the H200 sweep (data/h200_dw_tiles.csv) and the H100's (data/h100_dw_tiles.csv)."""
    gains = {(g["model"], g["T"], g["gemm"]): g for g in backward.gluon_gains(backward.load_tiles())}
    ds, mixtral = "DeepSeek-V3", "Mixtral-8x7B"
    short = [gains[(ds, 4096, m)]["speedup"] for m in ("dw2", "dw13")]
    long_ = [gains[(ds, T, m)]["speedup"] for T in (16384, 32768) for m in ("dw2", "dw13")]
    assert min(short) > max(long_) > min(long_) > 1                       # "the short runs gain the most"
    assert all(g["gluon_tile"].startswith("128x256") for g in gains.values())
    assert_says(NOTEBOOK, "on DeepSeek-V3 at T = 4096 the Gluon kernel is faster by {:.2f}x on dW2 and {:.2f}x on "
                "dW13, at 16384 and 32768 by {:.2f}x to {:.2f}x, every time with a 128 x 256 tile.", *short,
                min(long_), max(long_))
    m_short = [gains[(mixtral, 4096, m)]["speedup"] for m in ("dw2", "dw13")]
    m_long = [gains[(mixtral, T, m)]["speedup"] for T in (16384, 32768) for m in ("dw2", "dw13")]
    assert MODEL_SHAPES[mixtral].topk * 4096 // MODEL_SHAPES[mixtral].num_experts == 1024
    assert_says(NOTEBOOK, "(1024 rows an expert at T = 4096): {:.2f}x and {:.2f}x there, {:.2f}x to {:.2f}x beyond.",
                *m_short, min(m_long), max(m_long))
    same = {r["tile"]["gluon"]: r["ms"] for r in backward.load_tiles() if r["model"] == ds and r["T"] == 16384
            and r["gemm"] == "dw2" and backward.tile_name(r["tile"]) == "128x256x64 w8 s3"}
    assert same[True] < same[False]
    assert_says(NOTEBOOK, "128 x 256 x 64 tile with 8 warps and 3 stages takes {:.2f} ms in `tl` and {:.2f} in Gluon",
                same[False], same[True])
    h100 = {(g["T"], g["gemm"]): g for g in backward.gluon_gains(backward.load_tiles(backward.H100_DW_TILES))}
    assert abs(h100[(4096, "dw13")]["speedup"] - 1) < 0.01 and h100[(4096, "dw2")]["speedup"] < short[0]
    assert_says(NOTEBOOK, "An H100 saw less at T = 4096 (`moe_tutorial/data/h100_dw_tiles.csv`): {:.2f}x on dW2, "
                "none on dW13.", h100[(4096, "dw2")]["speedup"])
    assert {r["gpu"] for r in backward.load_tiles()} == {"NVIDIA H200"}
    assert_says(NOTEBOOK, "Measured on one H200")
    assert {r["gpu"] for r in backward.load_tiles(backward.H100_DW_TILES)} == {"NVIDIA H100 80GB HBM3"}


def test_what_the_gluon_dact_kernel_gains():
    """The appendix's reading of the dA' sweep (data/h200_dact_tiles.csv) and of the step with every GEMM
    in tl, with the Gluon dA' and with the Gluon dW too (section 10's run)."""
    gains = {(g["model"], g["T"]): g for g in backward.gluon_gains(backward.load_tiles(backward.H200_DACT_TILES))}
    mixtral = [g["speedup"] for (m, _), g in gains.items() if m == "Mixtral-8x7B"]
    assert len(mixtral) == 3 and min(mixtral) > gains[("DeepSeek-V3", 16384)]["speedup"] > 1     # "Mixtral gains more"
    assert {g["gluon_tile"] for g in gains.values()} == {g["tl_tile"] for g in gains.values()} == {"128x128x64 w8 s4"}
    assert_says(NOTEBOOK, "Mixtral-8x7B gains {:.2f}x to {:.2f}x, DeepSeek-V3 {:.2f}x at T = 16384, with the same "
                "128 x 128 x 64 tile as `tl`'s.", min(mixtral), max(mixtral), gains[("DeepSeek-V3", 16384)]["speedup"])
    assert {r["gpu"] for r in backward.load_tiles(backward.H200_DACT_TILES)} == {"NVIDIA H200"}
    steps = {(s["model"], s["T"]): s for s in backward.gluon_step(backward.load_backward())}
    assert all(s["speedup"] > s["tl_speedup"] for s in steps.values())

    def moves(model):
        return [v for T in (4096, 16384, 32768) for v in (steps[(model, T)]["tl_speedup"],
                                                          steps[(model, T)]["speedup"])]
    assert_says(NOTEBOOK, "DeepSeek-V3's step goes from {:.3f}x to {:.3f}x the faster anchor at T = 4096, from {:.3f}x "
                "to {:.3f}x at 16384 and from {:.3f}x to {:.3f}x at 32768; Mixtral-8x7B's from {:.3f}x to {:.3f}x, "
                "{:.3f}x to {:.3f}x and {:.3f}x to {:.3f}x.", *moves("DeepSeek-V3"), *moves("Mixtral-8x7B"))
    # The H200 table takes the Gluon dA' kernel only where its sweep measured it winning.
    from moe_tutorial.kernels.configs import SHIPPED_DIR
    from moe_tutorial.perf.tuning import read_table
    table = read_table(SHIPPED_DIR / "tuned_configs_training_h200.json")["NVIDIA H200"]
    chosen = {(key.split(",")[0], int(m)) for key, by_m in table.items() if key.endswith("variant=train_dact")
              for m, cfg in by_m.items() if cfg["gluon"]}
    assert chosen == {("E=8", 4096), ("E=8", 16384), ("E=8", 32768), ("E=256", 16384)}




def test_what_the_first_call_costs():
    """Section 10's first call: the kernels' count and the H100's seconds, one by one against side by side."""
    rows = [r for r in backward.load_first_call() if not r["warm_torch"] and r["T"] == 4096]
    kernels = sorted({r["kernels"] for r in rows})
    serial = [r["first_call_s"] for r in rows if r["compile"] == "one by one"]
    side = [r["first_call_s"] for r in rows if r["compile"] == "side by side"]
    assert len(serial) == len(side) == 3 and max(side) < min(serial)
    words = {9: "nine", 10: "ten"}
    assert_says(NOTEBOOK, "compiles its kernels: {} or {} of them", *(words.get(k, k) for k in kernels))
    assert_says(NOTEBOOK, "that took {:.2f} s to {:.2f} s on an H100 with an empty cache", min(serial), max(serial))
    assert_says(NOTEBOOK, "and the first call took {:.2f} s to {:.2f} s", min(side), max(side))
