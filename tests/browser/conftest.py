"""Fixtures of the browser test: a process tracker, a JupyterLab server, a headless Chromium.

Teardown order matters: the page and the server depend on the tracker, so pytest closes the
browser, then stops the server (and its kernels), and only then lets the tracker check that
no process started by the test is still running.
"""
from __future__ import annotations

import os
import shutil
import time
import uuid
from pathlib import Path

import pytest
from _lab_server import LabServer
from _processes import ProcessTracker

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = REPO / "artifacts" / "browser"
MARKER = "MOE_TUTORIAL_BROWSER_TEST"
_LOADED_AT = time.time()  # screenshots newer than this come from this run
#: The notebook under test. MOE_BROWSER_NOTEBOOK may name another one with the same explorer
#: (a path, absolute or relative to the repository), for developing the test itself.
NOTEBOOK = REPO / os.environ.get("MOE_BROWSER_NOTEBOOK", "notebooks/03_triton_fused_kernel.ipynb")

#: Headless Chromium on a machine without network or GPU. The background-networking flags
#: matter: with the network closed, Chromium's own connections are refused and slow it down.
CHROMIUM_ARGS = [
    "--no-sandbox",  # CI runs as root, where the sandbox cannot start
    "--disable-gpu",
    "--disable-dev-shm-usage",  # small /dev/shm in containers
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def tracker():
    """Marks every process the test starts (an environment variable they all inherit) and,
    after the other fixtures have shut down, fails if any of them is still running."""
    tracker = ProcessTracker(MARKER, uuid.uuid4().hex)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(tracker.marker_name, tracker.marker_value)
        yield tracker
    leftover = tracker.wait_gone(timeout_s=10.0)
    stopped = tracker.stop_all() if leftover else []
    assert not stopped, (
        "processes started by the browser test were still running after the browser and "
        "the server had shut down (now killed):\n  " + "\n  ".join(stopped)
    )


@pytest.fixture
def notebook():
    """The notebook under test, in the repository (the test opens a copy of it)."""
    if not NOTEBOOK.exists():
        pytest.fail(f"{NOTEBOOK} does not exist")
    return NOTEBOOK


@pytest.fixture
def lab(tracker, notebook, tmp_path):
    """JupyterLab serving a copy of the notebook's folder (notebooks/), so the committed
    notebooks are never touched."""
    root = tmp_path / "root"
    shutil.copytree(notebook.parent, root,
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    server = LabServer(root, tmp_path / "jupyter", env=os.environ)
    try:
        server.start()
        tracker.record()
        yield server
    finally:
        server.stop()


@pytest.fixture
def page(tracker, tmp_path):
    """A page in headless Debian Chromium (a fresh profile), driven by Playwright."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: run `bash scripts/ensure_chromium.sh` "
                    "(or `make test-browser`, which does)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright for Python is missing: pip install -e '.[browser]'")
    with sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000}, timeout=60_000,
        )
        try:
            tracker.record()
            context.set_default_timeout(30_000)
            page = context.pages[0] if context.pages else context.new_page()
            page.console_log = []  # what the page logged, for failure reports
            page.on("console", lambda msg: page.console_log.append(f"{msg.type}: {msg.text}"))
            page.on("pageerror", lambda err: page.console_log.append(f"pageerror: {err}"))
            yield page
        finally:
            context.close()


def pytest_terminal_summary(terminalreporter, config):
    """List the screenshots this run saved, whether the test passed or failed."""
    saved = sorted(p for p in ARTIFACTS.glob("*.png") if p.stat().st_mtime >= _LOADED_AT)
    if saved:
        terminalreporter.section("browser test screenshots")
        for path in saved:
            terminalreporter.line(str(path))


@pytest.fixture
def artifacts():
    """artifacts/browser/ in the repository (git-ignored): screenshots for humans."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS
