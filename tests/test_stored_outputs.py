"""Stored outputs that nbval compares must not depend on the CPU, the thread count or the order of a sum.

The rule the notebooks keep: a number that fp32 (or fp64) rounding decides is printed as a bound
("below 1e-6") or as a rounded magnitude (:func:`moe_tutorial.reference.error_text`), never as its
rounding noise ("2.3e-07", "3276.0007"). Two checks: a scan of every stored output for numbers at
rounding level, and every lesson run again with one thread against its stored outputs (nbval, in a
child process with ``OMP_NUM_THREADS=1``; the main nbval run uses all cores).
"""
import json
import os
import re
import subprocess
import sys

import pytest
from reading import NOTEBOOKS, lessons

ALL_NOTEBOOKS = sorted(NOTEBOOKS.glob("*.ipynb")) + sorted(NOTEBOOKS.glob("exercises/*.ipynb"))
#: A number in scientific notation: mantissa, exponent.
SCIENTIFIC = re.compile(r"(?<![\w.])(\d(?:\.\d+)?)e([-+]?\d+)\b")
#: A decimal number (not part of a name, a version or a longer number).
DECIMAL = re.compile(r"(?<![\w.,])\d+\.\d+(?![\w.])")
#: fp32 keeps about 7 significant digits: an 8th printed digit is rounding noise, or a constant's
#: binary expansion (124.30000305175781), which says nothing to a reader either.
MAX_DIGITS = 7
#: Below this, a relative error is rounding, not a verdict: show it as a bound.
ROUNDING_LEVEL = 1e-5


def compared_text(cell: dict) -> str:
    """The text of a code cell's outputs that nbval compares (images and rendered source aside)."""
    if "NBVAL_IGNORE_OUTPUT" in "".join(cell["source"]):
        return ""
    texts = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            texts.append("".join(out["text"]))
        elif "text/plain" in out.get("data", {}) and "image/png" not in out["data"] and "text/html" not in out["data"]:
            texts.append("".join(out["data"]["text/plain"]))
    return "\n".join(texts)


def rounding_level_numbers(text: str) -> list[str]:
    """The numbers in ``text`` printed at rounding level (see the module's docstring)."""
    found = [m[0] for m in SCIENTIFIC.finditer(text)
             if float(m[0]) < ROUNDING_LEVEL and m[1] != "1"]          # 1e-6 is a bound, 4.4e-08 a measurement
    found += [m[0] for m in DECIMAL.finditer(text) if len(m[0].replace(".", "").strip("0")) > MAX_DIGITS]
    return found


def test_the_scan_finds_what_it_should():
    assert rounding_level_numbers("relative error 4.4e-08, and 2.3e-07") == ["4.4e-08", "2.3e-07"]
    assert rounding_level_numbers("[3276.0007, 124.30000305175781]") == ["3276.0007", "124.30000305175781"]
    assert rounding_level_numbers("below 1e-6; 6.7e-02; 251.5432; 3276.0000; v3.6.0; 29,360,128.5") == []


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=lambda p: p.name)
def test_no_stored_output_prints_rounding_noise(path):
    cells = json.loads(path.read_text())["cells"]
    found = {i: hits for i, c in enumerate(cells) if c["cell_type"] == "code"
             and (hits := rounding_level_numbers(compared_text(c)))}
    assert not found, (f"{path.name}: cells {found} print numbers at fp32 rounding level, which differ between "
                       "CPUs: print a bound or a rounded magnitude (moe_tutorial.reference.error_text)")


@pytest.mark.parametrize("path", ALL_NOTEBOOKS, ids=lambda p: p.name)
def test_every_cell_has_its_own_id(path):
    """nbformat 4.5 names each cell (nbval warns of a missing id; a later nbformat refuses it):
    ``scripts/strip_notebook_metadata.py`` gives a cell added by hand one."""
    nb = json.loads(path.read_text())
    ids = [c.get("id") for c in nb["cells"]]
    assert (nb["nbformat"], nb["nbformat_minor"]) >= (4, 5)
    assert None not in ids and len(set(ids)) == len(ids), f"{path.name}: cells without an id, or ids twice"


@pytest.mark.parametrize("notebook", lessons())
def test_a_lesson_gives_its_stored_outputs_on_one_thread(notebook):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval",
                          "--nbval-current-env", str(NOTEBOOKS / f"{notebook}.ipynb")],
                         capture_output=True, text=True, env=env, cwd=NOTEBOOKS.parent, timeout=900)
    assert run.returncode == 0, f"{notebook} differs from its stored outputs on one thread:\n{run.stdout[-4000:]}"
