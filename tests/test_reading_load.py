"""A lesson takes the time it says: every numbered notebook states the honest count of
``tests/reading.py`` (within a quarter), no lesson takes over 45 minutes, Parts 1 to 4 together
take at most 130; and notebook 03's editable kernel stays a copy of the package's."""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

import json

import pytest
from reading import NOTEBOOKS, lessons, reading, rounded, stated_minutes

from moe_tutorial.kernels.fused_kernel import fused_moe_kernel
from moe_tutorial.source import source_of

LESSONS = lessons()
MAX_LESSON_MINUTES = 45
#: Parts 1 to 4, the path from the loop to the production kernel, in one sitting of about two hours.
FIRST_FOUR, FIRST_FOUR_MINUTES = LESSONS[:4], 130
WITHIN = 0.25


def test_every_part_is_counted():
    assert len(LESSONS) >= 7 and LESSONS[0].startswith("01_") and all(
        int(n[:2]) == i + 1 for i, n in enumerate(LESSONS)), LESSONS


@pytest.mark.parametrize("notebook", LESSONS)
def test_the_stated_time_is_the_count(notebook):
    (lesson, appendix), (stated, stated_appendix) = reading(notebook), stated_minutes(notebook)
    detail = (f"{notebook}: {lesson.words} words, {lesson.code_lines} lines of code, {lesson.predictions} "
              f"predictions = {lesson.minutes:.1f} minutes; it says {stated} (write {rounded(lesson.minutes)})")
    assert abs(stated - lesson.minutes) <= WITHIN * lesson.minutes, detail
    if appendix.minutes:
        assert stated_appendix is not None, f"{notebook}: its appendix ({appendix.minutes:.1f} minutes) states no time"
        assert abs(stated_appendix - appendix.minutes) <= max(WITHIN * appendix.minutes, 2.5), (
            f"{notebook}: the appendix counts {appendix.minutes:.1f} minutes; it says {stated_appendix}")
    else:
        assert stated_appendix is None, f"{notebook}: states an appendix it does not have"


@pytest.mark.parametrize("notebook", LESSONS)
def test_no_lesson_over_45_minutes(notebook):
    lesson, _ = reading(notebook)
    assert lesson.minutes <= MAX_LESSON_MINUTES, f"{notebook}: {lesson.minutes:.1f} minutes of lesson"


def test_parts_1_to_4_in_about_two_hours():
    minutes = {n: round(reading(n)[0].minutes, 1) for n in FIRST_FOUR}
    assert sum(minutes.values()) <= FIRST_FOUR_MINUTES, f"Parts 1 to 4 take {sum(minutes.values()):.1f}: {minutes}"


def test_notebook_03_holds_an_exact_copy_of_the_package_kernel():
    cells = json.loads((NOTEBOOKS / "03_triton_fused_kernel.ipynb").read_text())["cells"]
    (cell,) = [c for c in cells if c.get("id") == "p3-my-kernel"]
    copy = "".join(cell["source"])
    assert copy.rstrip().endswith(source_of(fused_moe_kernel).rstrip()), \
        "notebook 03's editable kernel differs from moe_tutorial/kernels/fused_kernel.py: paste the package's source"
    header = copy[: len(copy.rstrip()) - len(source_of(fused_moe_kernel).rstrip())]
    assert all(line.startswith(("#", "import ")) or not line.strip() for line in header.splitlines())
