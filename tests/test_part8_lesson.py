"""Notebook 08 (Part 8, training) as the series wants a lesson: it reads in both languages, its
excerpts are the package's, and the numbers its prose states come from the data or the code they
describe. (Its reading time and its predict prompts are checked with every lesson's:
tests/test_reading_load.py, tests/test_lesson_form.py.)"""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

import json
import re

import torch
from prose import NOTEBOOKS, assert_says

from moe_tutorial import training
from moe_tutorial.experiments import backward
from moe_tutorial.shapes import MODEL_SHAPES

NOTEBOOK = "08_training"
CJK = re.compile(r"[\u4e00-\u9fff]")


def cells():
    return json.loads((NOTEBOOKS / f"{NOTEBOOK}.ipynb").read_text())["cells"]


def test_objectives_first_recap_and_chinese_summary_last_headings_in_both_languages():
    texts = ["".join(c["source"]) for c in cells() if c["cell_type"] == "markdown"]
    assert "**What you will learn**" in texts[0] and "../docs/seed-article.md" in texts[0]
    assert texts[-2].startswith("## Recap / 回顾") and texts[-1].startswith("## 中文小结")
    assert len(CJK.findall(texts[-1])) > 150 and "../docs/seed-article.md" in texts[-1]
    for text in texts:
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
    verdict = {v["model"]: v for v in backward.verdicts(rows) if v["T"] == T}
    ok = {(r["model"], r["impl"]): r for r in rows if r["status"] == "ok" and r["T"] == T}

    def share(model, impl):
        r = ok[(model, impl)]
        return backward.tflops(r, "backward") / r["matmul_tflops"]

    def kept(model, impl):
        return ok[(model, impl)]["kept_bytes"]

    models = ("Qwen3-30B-A3B", "DeepSeek-V3", "Mixtral-8x7B")
    speed = {m: f"{verdict[m]['step_speedup']:.2f}" for m in models}
    assert all(verdict[m]["faster_anchor"] == "grouped_mm" for m in models)
    assert verdict["Qwen3-30B-A3B"]["step_ok"] and not any(verdict[m]["step_ok"] for m in models[1:])
    assert_says(NOTEBOOK, "At T = {} the aim was a training step {}x as fast as the faster anchor, with the backward "
                "at {} of the matmul rate.", T, backward.STEP_SPEEDUP_TARGET, backward.BACKWARD_MATMUL_TARGET)
    assert_says(NOTEBOOK, "On Qwen3-30B-A3B (128 experts of `I = {}`) ours is {}x as fast as the faster anchor; on "
                "DeepSeek-V3 it is even with it ({}x), and on Mixtral-8x7B's eight large experts behind it ({}x), "
                "where the `torch._grouped_mm` composition's backward reaches {:.2f} of the matmul rate "
                "and ours {:.2f}.",
                MODEL_SHAPES["Qwen3-30B-A3B"].intermediate, speed["Qwen3-30B-A3B"], speed["DeepSeek-V3"],
                speed["Mixtral-8x7B"], share("Mixtral-8x7B", "grouped_mm"), share("Mixtral-8x7B", "ours"))
    assert abs(verdict["DeepSeek-V3"]["step_speedup"] - 1) < 0.05         # "even with it"
    fractions = {m: verdict[m]["backward_fraction"] for m in models}
    met = [m for m in models if verdict[m]["backward_ok"]]
    assert met == ["Mixtral-8x7B"]
    assert_says(NOTEBOOK, "Ours' backward reaches {:.2f} to {:.2f} of that rate: {} or more on Mixtral-8x7B only.",
                min(fractions.values()), max(fractions.values()), backward.BACKWARD_MATMUL_TARGET)
    less = [kept(m, "grouped_mm") / kept(m, "ours") for m in models]
    under = [100 * (1 - kept(m, "ours") / kept(m, "liger")) for m in models]
    assert min(under) > 0                                      # the memory target: no more than Liger keeps
    assert_says(NOTEBOOK, "ours keeps {:.1f}x to {:.1f}x less for the backward than the composition, and {:.2f}% "
                "to {:.2f}% less than Liger-Kernel", min(less), max(less), min(under), max(under))
