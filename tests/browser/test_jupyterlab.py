"""Notebook 03 in a real browser: JupyterLab in headless Chromium runs every cell without an
error, and its pid explorer redraws when a slider moves.

Run with `make test-browser` (installs Debian's chromium first), or
`.venv/bin/python -m pytest tests/browser -m browser -p no:cacheprovider -s`.
Screenshots of the explorer before and after the slider moves go to artifacts/browser/.
`MOE_BROWSER_NOTEBOOK=<path>` points the test at another notebook with the same explorer
(for developing the test itself).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import _lab_page as lp
import pytest

#: The explorer's contract with notebook 03: sliders with exactly these descriptions.
SLIDERS = ("pid_m", "pid_n", "k step")
MOVED = "pid_n"


def code_cell_sources(path) -> list[str]:
    cells = json.loads(path.read_text())["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


@pytest.mark.browser
@pytest.mark.timeout(300, method="signal")  # signal: fixtures still tear down on timeout
def test_notebook_03_runs_and_explorer_redraws(notebook, lab, page, tracker, artifacts):
    stem = notebook.stem
    for stale in artifacts.glob(f"{stem}_*.png"):  # from an earlier run
        stale.unlink()
    shots: list[Path] = []
    timings: dict[str, float] = {}
    clock = time.monotonic()

    def lap(name: str) -> None:
        nonlocal clock
        timings[name] = time.monotonic() - clock
        clock = time.monotonic()

    def capture(state: str, root) -> bytes:
        """Screenshots of the page and of the explorer; returns the explorer image's pixels."""
        root.scroll_into_view_if_needed()
        for what, target, options in (("page", page, {"full_page": True}), ("explorer", root, {})):
            path = artifacts / f"{stem}_{what}_{state}.png"
            target.screenshot(path=str(path), **options)
            shots.append(path)
        return root.locator("img").first.screenshot()

    try:
        lp.open_notebook(page, lab, notebook.name)
        tracker.record()  # the kernel now runs
        lap("open")

        # 1. Run > Run All Cells; every code cell gets an execution count, none errors.
        lp.run_all_cells(page)
        states = lp.wait_until_run(page, timeout_s=180)
        tracker.record()
        lap("run all")
        errors = lp.error_outputs(page)
        assert not errors, "cells show errors:\n" + "\n".join(errors)
        sources = code_cell_sources(notebook)
        assert len(states["prompts"]) == len(sources), (
            f"the page shows {len(states['prompts'])} code cells, the file has {len(sources)}")
        unrun = [i for i, (prompt, src) in enumerate(zip(states["prompts"], sources))
                 if src.strip() and not any(ch.isdigit() for ch in prompt)]
        assert not unrun, f"code cells without an execution count: {unrun} ({states['prompts']})"

        # 2. The pid explorer: the widget that holds all three sliders.
        slider = lp.find_slider(page, MOVED)
        assert slider.count() >= 1, f"no slider labelled {MOVED!r} on the page"
        slider = slider.first
        root = lp.widget_root(slider)
        for label in SLIDERS:
            assert lp.find_slider(root, label).count() == 1, (
                f"the explorer holding {MOVED!r} has no single slider labelled {label!r}")
        root.scroll_into_view_if_needed()
        digests_before = lp.wait_for_images(root, differ_from=None, timeout_s=30)
        pixels_before = capture("before", root)

        # 3. Move pid_n one step: the image must be redrawn with other pixels.
        old, new = lp.step_slider(slider)
        assert new != old, f"the {MOVED} slider did not move (value stayed {old})"
        digests_after = lp.wait_for_images(root, differ_from=digests_before, timeout_s=60)
        pixels_after = capture("after", root)
        lap("explorer")
        assert digests_after != digests_before and pixels_after != pixels_before, (
            f"the explorer's image did not change when {MOVED} went {old} -> {new}")
        assert not lp.error_outputs(page), "moving the slider produced an error output"
    except BaseException as exc:  # also pytest-timeout's Failed: explain what the page shows
        report = lp.diagnostics(page, lab, artifacts / f"{stem}_failure.png")
        raise AssertionError(f"{exc}\n\n{report}") from exc

    print(f"\n{notebook.name}: {len(sources)} code cells ran without errors; "
          f"{MOVED} {old} -> {new} redrew the explorer")
    print("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
    for path in shots:
        print(f"screenshot: {path}")
