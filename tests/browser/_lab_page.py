"""Driving a JupyterLab notebook page with Playwright: open, run all, read cell states,
find error outputs, move an ipywidgets slider, fingerprint a widget's image.

Selectors follow JupyterLab 4 and ipywidgets 8 (noUiSlider sliders).
"""
from __future__ import annotations

import re
import time

#: State of every code cell of the visible notebook: its prompt ("[3]:", "[*]:", "[ ]:")
#: and the kernel status shown in the notebook toolbar.
CELL_STATES_JS = """
() => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  if (!panel) return null;
  const indicator = panel.querySelector('.jp-Notebook-ExecutionIndicator');
  return {
    status: indicator ? indicator.dataset.status : null,
    prompts: [...panel.querySelectorAll('.jp-Notebook .jp-CodeCell')].map(
      c => (c.querySelector('.jp-InputArea-prompt') || {}).textContent || ''),
  };
}
"""

#: Text of every output that is an error. JupyterLab renders an error output with the
#: stderr MIME type (which warnings use too), so errors are told apart by their text: a
#: traceback or a line that starts with an exception name. ipywidgets' own rendering
#: failures ("Error displaying widget") count as errors as well.
ERROR_OUTPUTS_JS = r"""
() => {
  const panel = document.querySelector('.jp-NotebookPanel:not(.lm-mod-hidden)');
  const found = [];
  const cells = panel ? [...panel.querySelectorAll('.jp-Notebook .jp-Cell')] : [];
  cells.forEach((cell, index) => {
    for (const out of cell.querySelectorAll('.jp-OutputArea-output')) {
      const mime = out.dataset.mimeType || '';
      const text = out.innerText || '';
      const isError = mime === 'application/vnd.jupyter.error'
        || (mime === 'application/vnd.jupyter.stderr'
            && (/Traceback \(most recent call last\)/.test(text)
                || /^\s*\w*(Error|Exception|Interrupt)\b/m.test(text)))
        || /Error displaying widget/.test(text);
      if (isError) found.push(`cell ${index}: ${text.slice(0, 2000)}`);
    }
  });
  return found;
}
"""

#: SHA-256 of the bytes behind every <img> in an element (data: and blob: URLs alike), so
#: "the image changed" means the PNG changed, not merely its URL. An ipywidgets Image
#: revokes its old blob URL when it updates: a read that loses that race says UNREADABLE.
UNREADABLE = "unreadable"
IMAGE_DIGESTS_JS = """
async (root) => {
  const digests = [];
  for (const img of root.querySelectorAll('img')) {
    if (!img.src) continue;
    try {
      const bytes = await (await fetch(img.src)).arrayBuffer();
      const hash = await crypto.subtle.digest('SHA-256', bytes);
      digests.push([...new Uint8Array(hash)].map(b => b.toString(16).padStart(2, '0')).join(''));
    } catch (err) {
      digests.push('%s');
    }
  }
  return digests;
}
""" % UNREADABLE


def open_notebook(page, server, name: str, timeout_s: float = 90.0, settle_s: float = 1.0) -> None:
    """Open notebook ``name`` in JupyterLab and wait until its kernel is connected and idle.

    The toolbar says "idle" for a moment before the kernel is even connected, so the
    server's view (a session for the notebook, its kernel idle with a client connected)
    must agree with the page, steadily for ``settle_s`` seconds."""
    page.goto(server.url(f"lab/tree/{name}"), wait_until="domcontentloaded", timeout=60_000)
    page.locator(".jp-NotebookPanel .jp-Notebook").first.wait_for(state="visible", timeout=60_000)
    deadline = time.monotonic() + timeout_s
    ready_since, states, kernel = None, None, None
    while time.monotonic() < deadline:
        accept_kernel_dialog(page)
        states = page.evaluate(CELL_STATES_JS)
        kernel = server.kernel_of(name)
        ready = (states is not None and states["status"] == "idle" and kernel is not None
                 and kernel.get("execution_state") == "idle" and kernel.get("connections", 0) > 0)
        if not ready:
            ready_since = None
        elif ready_since is None:
            ready_since = time.monotonic()
        elif time.monotonic() - ready_since >= settle_s:
            return
        time.sleep(0.25)
    raise TimeoutError(f"the notebook's kernel was not ready within {timeout_s:.0f} s "
                       f"(toolbar status: {states and states['status']}, server: {kernel})")


def accept_kernel_dialog(page) -> None:
    """If JupyterLab asks which kernel to start (the notebook names an unknown kernel),
    take its default choice."""
    dialog = page.locator(".jp-Dialog")
    if dialog.count() and "kernel" in dialog.first.inner_text().lower():
        dialog.first.locator(".jp-mod-accept").click()


def run_all_cells(page) -> None:
    """Menu Run > Run All Cells, as a reader would."""
    page.locator(".lm-MenuBar-item", has_text=re.compile(r"^\s*Run\s*$")).click()
    page.locator(".lm-Menu-item").filter(has=page.locator(
        ".lm-Menu-itemLabel", has_text=re.compile(r"^\s*Run All Cells\s*$"))).click()


def wait_until_run(page, timeout_s: float, settle_s: float = 1.5) -> dict:
    """Wait until no cell is queued or running ("[*]") and the kernel is idle, steadily for
    ``settle_s`` seconds; return the final cell states. A cell that raises stops Run All,
    and the cells after it go back to "[ ]": that is a finished run too (with errors)."""
    deadline = time.monotonic() + timeout_s
    quiet_since = None
    while time.monotonic() < deadline:
        accept_kernel_dialog(page)
        states = page.evaluate(CELL_STATES_JS)
        busy = states is None or states["status"] != "idle" or any("*" in p for p in states["prompts"])
        if busy:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since >= settle_s:
            return states
        time.sleep(0.25)
    raise TimeoutError(f"Run All did not finish within {timeout_s:.0f} s: {states}")


def error_outputs(page) -> list[str]:
    return page.evaluate(ERROR_OUTPUTS_JS)


def find_slider(scope, label: str):
    """The ipywidgets sliders whose description is exactly ``label``, inside ``scope`` (a
    page or a locator)."""
    exact = re.compile(rf"^\s*{re.escape(label)}\s*$")
    page = getattr(scope, "page", scope)  # `has=` wants a locator of the page itself
    return scope.locator(".widget-slider").filter(
        has=page.locator(".widget-label", has_text=exact))


def widget_root(slider):
    """The notebook output (one displayed widget) that holds ``slider``."""
    return slider.locator(
        "xpath=ancestor::div[contains(concat(' ', normalize-space(@class), ' '),"
        " ' jp-OutputArea-output ')][1]")


def slider_value(slider) -> int:
    return int(slider.locator(".noUi-handle").first.get_attribute("aria-valuenow").split(".")[0])


def step_slider(slider) -> tuple[int, int]:
    """Move the slider one step with the keyboard (right, or left when at its maximum).
    Returns (old value, new value)."""
    handle = slider.locator(".noUi-handle").first
    old = slider_value(slider)
    top = int(float(handle.get_attribute("aria-valuemax")))
    handle.focus()
    handle.press("ArrowRight" if old < top else "ArrowLeft")
    deadline = time.monotonic() + 10
    while slider_value(slider) == old and time.monotonic() < deadline:
        time.sleep(0.1)
    return old, slider_value(slider)


def image_digests(root) -> list[str]:
    return root.evaluate(IMAGE_DIGESTS_JS)


def wait_for_images(root, differ_from: list[str] | None, timeout_s: float,
                    settle_s: float = 1.0) -> list[str]:
    """Wait until the element shows at least one image, different from ``differ_from``
    when given, and unchanged for ``settle_s`` seconds (a redraw can come in several
    updates: clear, then draw). Returns the image digests."""
    deadline = time.monotonic() + timeout_s
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        digests = image_digests(root)
        if digests != last:
            last, since = digests, time.monotonic()
        elif (digests and UNREADABLE not in digests and digests != differ_from
              and time.monotonic() - since >= settle_s):
            return digests
        time.sleep(0.2)
    want = "a new image" if differ_from else "an image"
    raise TimeoutError(f"the widget did not show {want} within {timeout_s:.0f} s "
                       f"(digests before: {differ_from}, now: {last})")


def diagnostics(page, server, shot_path) -> str:
    """What a failed run shows: visible error text, open dialogs, console, server log."""
    parts = []
    try:
        page.screenshot(path=str(shot_path), full_page=True, timeout=5_000)
        parts.append(f"screenshot of the failure: {shot_path}")
    except Exception as exc:  # the page may be gone
        parts.append(f"(no screenshot: {exc})")
    for name, fn in (("error outputs", lambda: error_outputs(page)),
                     ("dialogs", lambda: page.locator(".jp-Dialog").all_inner_texts()),
                     ("cell states", lambda: page.evaluate(CELL_STATES_JS))):
        try:
            parts.append(f"{name}: {fn()}")
        except Exception as exc:
            parts.append(f"{name}: (unavailable: {exc})")
    console = getattr(page, "console_log", [])
    parts.append("browser console (last 20):\n  " + "\n  ".join(console[-20:]))
    parts.append("JupyterLab server log (tail):\n" + server.log_tail(40))
    return "\n".join(parts)
