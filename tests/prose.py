"""Checking the numbers a notebook's prose states against the data or code they come from.

A notebook's text says things like "the loop reaches 0.34 / 0.01 / 0.12 of the limit". Those
numbers live in committed data (``moe_tutorial/data``) or follow from code; when the data changes,
the sentence must change too. A prose test computes the numbers, renders the sentence with them,
and asserts that the notebook's markdown contains it, so drift fails CI with the stale sentence:

    def test_loop_fractions():
        loop = [fmt2(v) for v in geomeans("first", "loop")]
        assert_says("01_loop_baseline", "reaches {} / {} / {} of the limit", *loop)

Whitespace (line breaks inside markdown paragraphs) is ignored when matching.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def markdown(notebook: str) -> str:
    """All markdown cells of ``notebooks/<notebook>.ipynb`` (or a path under notebooks/), joined,
    with runs of whitespace folded to one space."""
    path = NOTEBOOKS / (notebook if notebook.endswith(".ipynb") else f"{notebook}.ipynb")
    cells = json.loads(path.read_text())["cells"]
    text = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return re.sub(r"\s+", " ", text)


def assert_says(notebook: str, template: str, *values, **named) -> None:
    """Assert that the notebook's markdown contains ``template.format(*values, **named)``."""
    sentence = re.sub(r"\s+", " ", template.format(*values, **named))
    text = markdown(notebook)
    if sentence not in text:
        # Show the nearest stale version: the text around the template's first fixed words.
        anchor = re.split(r"\{[^}]*\}", template)[0].strip()
        at = text.find(anchor) if anchor else -1
        found = text[at:at + len(sentence) + 40] if at >= 0 else "(the sentence's opening words are not there either)"
        raise AssertionError(f"{notebook} should say {sentence!r}; it says {found!r}")


def fmt2(value: float) -> str:
    """Two decimals, the way the series prints fractions and ratios."""
    return f"{value:.2f}"
