"""Notebook 08 (Part 8, training) as the series wants a lesson: its stated reading time is the honest
count, it reads in both languages, its excerpts are the package's, and the numbers its prose states
come from the data or the code they describe."""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

import json
import re

import torch
from prose import NOTEBOOKS, assert_says, markdown, prose_words

from moe_tutorial import training
from moe_tutorial.experiments import backward
from moe_tutorial.shapes import MODEL_SHAPES

NOTEBOOK = "08_training"
#: The honest count: prose at 180 words a minute, code at 15 non-blank lines a minute, half a minute
#: per predict prompt; stated rounded to 5 minutes, at most 45.
WORDS_PER_MINUTE, CODE_LINES_PER_MINUTE, MINUTES_PER_PREDICT, MAX_MINUTES = 180, 15, 0.5, 45
CJK = re.compile(r"[\u4e00-\u9fff]")


def cells():
    return json.loads((NOTEBOOKS / f"{NOTEBOOK}.ipynb").read_text())["cells"]


def honest_minutes() -> float:
    code_lines = sum(1 for c in cells() if c["cell_type"] == "code"
                     for line in "".join(c["source"]).splitlines() if line.strip())
    predicts = markdown(NOTEBOOK).count("**Predict**")
    return (prose_words(NOTEBOOK) / WORDS_PER_MINUTE + code_lines / CODE_LINES_PER_MINUTE
            + predicts * MINUTES_PER_PREDICT)


def test_the_stated_reading_time_is_the_honest_count_and_within_45_minutes():
    stated = re.search(r"\*Reading time: about (\d+) minutes, running the cells included\.\*",
                       "".join(cells()[0]["source"]))
    assert stated
    assert int(stated[1]) == 5 * round(honest_minutes() / 5) <= MAX_MINUTES, honest_minutes()


def test_objectives_first_recap_and_chinese_summary_last_headings_in_both_languages():
    texts = ["".join(c["source"]) for c in cells() if c["cell_type"] == "markdown"]
    assert "**What you will learn**" in texts[0] and "../docs/seed-article.md" in texts[0]
    assert texts[-2].startswith("## Recap / 回顾") and texts[-1].startswith("## 中文小结")
    assert len(CJK.findall(texts[-1])) > 150 and "../docs/seed-article.md" in texts[-1]
    for text in texts:
        for line in text.splitlines():
            if re.match(r"#{1,3} ", line):
                assert CJK.search(line) and (line.startswith("## 中文小结") or re.search(r"[A-Za-z]{3}", line)), line


def test_every_predict_prompt_is_answered_by_the_next_cell():
    cs = cells()
    for i, c in enumerate(cs):
        if c["cell_type"] == "markdown" and "**Predict**" in "".join(c["source"]):
            assert cs[i + 1]["cell_type"] == "code" and cs[i + 1]["outputs"], i


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
    assert_says(NOTEBOOK, "at least {:g}x faster than the faster anchor at every T, and the backward alone at least "
                "{:g} of the bf16 matmul rate measured in the same run at T = {}", backward.STEP_SPEEDUP_TARGET,
                backward.BACKWARD_MATMUL_TARGET, backward.TARGET_T)
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
