"""How long a lesson takes to read, counted the same way for every notebook.

A reader takes a minute for 180 words of prose, a minute for 15 non-blank lines of code (the
code cells, the package source a cell shows with ``show_source``, code fenced in markdown) and half
a minute for each prediction asked of them (a ``**Predict.**`` prompt). The 中文小结 and the
Chinese lines beside the English are for the other readership and are not counted. A notebook's
*lesson* runs up to its first ``## Appendix`` heading; what follows is its appendix, counted apart,
so that a lesson states the time of the lesson and, separately, what its appendices add.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"

WORDS_PER_MINUTE = 180
CODE_LINES_PER_MINUTE = 15
MINUTES_PER_PREDICTION = 0.5

#: Tokens in Chinese (the lines for readers of the Chinese original).
CJK = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")
PREDICT = "**Predict.**"
APPENDIX = re.compile(r"^## Appendix", re.M)
FENCED = re.compile(r"```.*?```", re.S)


def lessons() -> list[str]:
    """Every numbered lesson notebook (``NN_name.ipynb``), in order: whatever parts exist."""
    return [p.stem for p in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))]


def cells(notebook: str) -> list[dict]:
    return json.loads((NOTEBOOKS / f"{notebook}.ipynb").read_text())["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"])


def is_summary_in_chinese(cell: dict) -> bool:
    return cell["cell_type"] == "markdown" and source(cell).startswith("## 中文小结")


def shown_code(cell: dict) -> str:
    """The source a code cell displays with ``show_source`` (an IPython ``Code`` object, rendered
    as highlighted HTML beside its plain text)."""
    shown = []
    for out in cell.get("outputs", []):
        data = out.get("data", {})
        if 'class="highlight"' in "".join(data.get("text/html", "")):
            shown.append("".join(data.get("text/plain", "")))
    return "\n".join(shown)


@dataclass(frozen=True)
class Reading:
    """What a reader reads in part of a notebook: words, lines of code, predictions."""

    words: int = 0
    code_lines: int = 0
    predictions: int = 0

    @property
    def minutes(self) -> float:
        return (self.words / WORDS_PER_MINUTE + self.code_lines / CODE_LINES_PER_MINUTE
                + self.predictions * MINUTES_PER_PREDICTION)

    def __add__(self, other: "Reading") -> "Reading":
        return Reading(self.words + other.words, self.code_lines + other.code_lines,
                       self.predictions + other.predictions)


def non_blank(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip())


def cell_reading(cell: dict) -> Reading:
    text = source(cell)
    if cell["cell_type"] == "code":
        return Reading(code_lines=non_blank(text) + non_blank(shown_code(cell)))
    if cell["cell_type"] != "markdown" or is_summary_in_chinese(cell):
        return Reading()
    fenced = sum(non_blank("\n".join(block.splitlines()[1:-1])) for block in FENCED.findall(text))
    words = sum(1 for token in FENCED.sub(" ", text).split() if not CJK.search(token))
    return Reading(words=words, code_lines=fenced, predictions=text.count(PREDICT))


def split(notebook: str) -> tuple[list[dict], list[dict]]:
    """``(lesson cells, appendix cells)``: the appendix starts at the first ``## Appendix`` heading."""
    all_cells = cells(notebook)
    start = next((i for i, c in enumerate(all_cells) if c["cell_type"] == "markdown"
                  and APPENDIX.search(source(c))), len(all_cells))
    return all_cells[:start], all_cells[start:]


def reading(notebook: str) -> tuple[Reading, Reading]:
    """``(lesson, appendix)`` readings of a notebook."""
    lesson, appendix = split(notebook)
    return sum(map(cell_reading, lesson), Reading()), sum(map(cell_reading, appendix), Reading())


#: The statement in a notebook's first cell: "*Reading time: about 40 minutes, running the cells
#: included; the appendices add about 10.*" (the second part only where there are appendices).
STATED = re.compile(r"\*Reading time: about (\d+) minutes, running the cells included"
                    r"(?:; (?:the appendix adds|the appendices add) about (\d+))?\.\*")


def stated_minutes(notebook: str) -> tuple[int, int | None]:
    """``(lesson minutes, appendix minutes or None)`` as the first cell states them; ValueError if it does not."""
    found = STATED.search(source(cells(notebook)[0]))
    if not found:
        raise ValueError(f"{notebook}: the first cell states no reading time in the form {STATED.pattern!r}")
    return int(found[1]), int(found[2]) if found[2] else None


def rounded(minutes: float) -> int:
    """The time a notebook states for ``minutes``: to the nearest 5, at least 5."""
    return max(5, 5 * round(minutes / 5))
