"""Every lesson at home for readers of the Chinese original: headings in both languages, a 中文小结
at the end of each, the glossary linked from each and defining the terms of every part, the
article's map (docs/seed-article.md) naming every notebook, and at each of the article's faults the
article's section named and its claim restated in English and in Chinese."""
import json
import re

import pytest
from prose import NOTEBOOKS, markdown
from reading import lessons

LESSONS = lessons()
CJK = re.compile(r"[\u4e00-\u9fff]")
GLOSSARY = "../docs/seed-article.md"


def cells(notebook: str) -> list[str]:
    nb = json.loads((NOTEBOOKS / f"{notebook}.ipynb").read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"]


def headings(notebook: str) -> list[str]:
    return [line for text in cells(notebook) for line in text.splitlines() if re.match(r"#{1,3} ", line)]


@pytest.mark.parametrize("notebook", LESSONS)
def test_headings_in_both_languages(notebook):
    for heading in headings(notebook):
        assert CJK.search(heading), f"{notebook}: heading without its Chinese: {heading!r}"
        assert heading.startswith("## 中文小结") or re.search(r"[A-Za-z]{3}", heading), heading


@pytest.mark.parametrize("notebook", LESSONS)
def test_a_chinese_summary_after_the_recap_and_the_glossary_linked(notebook):
    texts = cells(notebook)
    summary = [i for i, t in enumerate(texts) if t.startswith("## 中文小结")]
    recap = [i for i, t in enumerate(texts) if "## Recap / 回顾" in t]
    assert len(summary) == 1 and len(recap) == 1 and summary[0] > recap[0], notebook
    assert GLOSSARY in texts[summary[0]]
    assert len(CJK.findall(texts[summary[0]])) > 150, "a summary, not a line"
    assert GLOSSARY in texts[0] and "中文小结" in texts[0], f"{notebook}: the first cell links the glossary"


def test_each_fault_names_the_articles_section_in_both_languages():
    text = markdown("03_triton_fused_kernel")
    for english, chinese in (("section 03.1 (Grid 划分策略)", "原文 03.1「Grid 划分策略」"),
                             ("section 03.2 步骤一 (step 1) and its test in 03.3", "原文 03.2「步骤一」及 03.3 的测试"),
                             ("section 03.2 步骤二 (step 2) and the kernel of 03.3",
                              "原文 03.2「步骤二」及 03.3 的完整内核"),
                             ("the K loop of its kernel in section 03.3", "原文 03.3 完整内核的 K 循环"),
                             ("section 02 and the opening of 03.2", "原文 02 节与 03.2 开头")):
        assert f"**The article, {english}:**" in text, english
        assert f"**{chinese}：**" in text, chinese


def test_a_notebooks_number_is_its_parts_number():
    assert markdown("05_performance").startswith("# Part 5: the performance chapter")
    assert markdown("06_expert_parallel").startswith("# Part 6: beyond one GPU")
    table = markdown("01_loop_baseline")
    for notebook in LESSONS[1:]:                              # every part in notebook 01's table
        row = f"| {int(notebook[:2])} | `{notebook}.ipynb` |"
        assert row in table, row
    for notebook in LESSONS:
        assert "Part 5, in `06" not in markdown(notebook) and "# Part 5: beyond" not in markdown(notebook)


def test_glossary_defines_the_series_terms():
    glossary = (NOTEBOOKS.parent / "docs" / "seed-article.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in glossary.splitlines() if line.startswith("| ")}
    for term in ("warp", "CTA (thread block)", "issue slot", "Nsight Compute", "cuBLAS / CUTLASS", "atomics",
                 "prefix sum (scan)", "epilogue", "TMA (Tensor Memory Accelerator)", "split-K", "all-to-all"):
        assert term in rows, term
    for term in ("rank", "dispatch / combine", "all-gather", "reduce-scatter", "all-reduce", "tensor parallelism",
                 "FP8 e4m3", "block scale (128 x 128)", "quantisation / dequantisation", "promotion (fp32)"):
        assert term in rows and CJK.search(rows[term].split("|")[2]), f"{term}: not in the glossary with its Chinese"
    assert "processor cores" not in rows["SM (streaming multiprocessor)"]      # an SM is not a core
    assert "after the K loop" in rows["epilogue"]


def test_the_articles_map_names_every_notebook():
    glossary = (NOTEBOOKS.parent / "docs" / "seed-article.md").read_text()
    for notebook in LESSONS:
        assert re.search(rf"^\| `{notebook}`", glossary, re.M), f"docs/seed-article.md does not map {notebook}"
    assert "Part 3 (this article)" in glossary and "continues after the article" in glossary
