"""The form every numbered lesson keeps: a question before each section's answer, in both languages
and answered by the next cell; a first cell that only sets up; and no words of the project's own
making (issue numbers, "targets") in the lesson, where a reader has no use for them."""
import re

import pytest
from reading import PREDICT, cells, lessons, source, split

LESSONS = lessons()
PREDICT_IN_CHINESE = "**预测：**"
SECTION = re.compile(r"^## (\d+)\. ", re.M)
#: Words that belong to the project's bookkeeping, not to the lesson.
PROJECT_WORDS = re.compile(r"\bissues? #?\d+|\b(?:the|its|our|meets?|set) targets?\b|seed article|in preparation|"
                           r"\bTODO\b|\bhelper\b|\bthe lead\b|committed runs?", re.I)
MAX_FIRST_CELL_IMPORTS, MAX_FIRST_CELL_LINES = 5, 12


def predictions(notebook: str) -> list[tuple[int, str]]:
    return [(i, source(c)) for i, c in enumerate(cells(notebook))
            if c["cell_type"] == "markdown" and PREDICT in source(c)]


@pytest.mark.parametrize("notebook", LESSONS)
def test_every_numbered_section_asks_before_it_answers(notebook):
    lesson, _ = split(notebook)
    asked, section = {}, None
    for cell in lesson:
        text = source(cell)
        if cell["cell_type"] == "markdown" and (heading := SECTION.search(text)):
            section = int(heading[1])
            asked[section] = 0
        if section is not None and cell["cell_type"] == "markdown":
            asked[section] += text.count(PREDICT)
    assert asked and not [s for s, n in asked.items() if n == 0], \
        f"{notebook}: sections without a {PREDICT} prompt: {[s for s, n in asked.items() if n == 0]}"


@pytest.mark.parametrize("notebook", LESSONS)
def test_a_prediction_is_answered_by_the_next_cell(notebook):
    all_cells = cells(notebook)
    for i, text in predictions(notebook):
        after = text.split(PREDICT, 1)[1]
        assert text.count(PREDICT) == 1, f"{notebook} cell {i}: one prompt a cell"
        assert not re.search(r"\n\s*\n\s*\S", after), \
            f"{notebook} cell {i}: the prompt ends its cell, so that what follows is the cell that answers it"
        assert PREDICT_IN_CHINESE in after, f"{notebook} cell {i}: the prompt has no Chinese line"
        assert i + 1 < len(all_cells) and all_cells[i + 1]["cell_type"] == "code", \
            f"{notebook} cell {i}: the next cell is not the code that answers the prompt"


@pytest.mark.parametrize("notebook", LESSONS)
def test_the_first_cell_only_sets_up(notebook):
    first = next(source(c) for c in cells(notebook) if c["cell_type"] == "code")
    lines = [line for line in first.splitlines() if line.strip()]
    imports = [line for line in lines if line.startswith(("import ", "from "))]
    assert len(imports) <= MAX_FIRST_CELL_IMPORTS and len(lines) <= MAX_FIRST_CELL_LINES, (
        f"{notebook}: the first code cell has {len(imports)} imports and {len(lines)} lines; import what a "
        "section needs where it needs it")


@pytest.mark.parametrize("notebook", LESSONS)
def test_no_project_vocabulary_in_the_lesson(notebook):
    lesson, _ = split(notebook)
    found = [(i, m[0]) for i, c in enumerate(lesson) for m in PROJECT_WORDS.finditer(source(c))]
    assert not found, f"{notebook}: words of the project's bookkeeping in the lesson (move them to docs/): {found}"
