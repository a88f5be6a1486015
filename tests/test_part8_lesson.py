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
