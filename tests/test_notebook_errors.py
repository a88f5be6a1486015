"""A reader's mistake in a notebook cell ends in a short message (moe_tutorial.notebook), not a
traceback through the package's frames; errors from elsewhere keep IPython's full traceback."""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

import contextlib
import io

import pytest

from moe_tutorial import notebook


@pytest.fixture(scope="module")
def shell():
    from IPython.core.interactiveshell import InteractiveShell

    sh = InteractiveShell.instance()
    sh.run_cell("import torch\nimport moe_tutorial as mt")
    assert notebook.install(sh)
    yield sh
    notebook.full_tracebacks(sh)


def run(shell, code: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stderr(out), contextlib.redirect_stdout(out):
        shell.run_cell(code)
    return out.getvalue()


def test_a_wrong_shape_is_one_message_and_the_readers_line(shell):
    text = run(shell, "x = torch.randn(4, 8)\nw = torch.randn(3, 6, 7)\nids = torch.zeros(4, 2, dtype=torch.int32)\n"
                      "y = mt.loop_moe_matmul(x, w, ids)")
    lines = text.strip().splitlines()
    assert lines[0].startswith("ValueError: weight: expected last dim equal to x's K=8")
    assert "in your line 4: y = mt.loop_moe_matmul(x, w, ids)" in text
    assert len(lines) == 3 and "Traceback" not in text and "checks.py" not in text


def test_a_failing_edited_kernel_is_short_too(shell):
    text = run(shell, "from moe_tutorial import edited_kernel\nids = torch.full((2, 3), 9)\n"
                      "edited_kernel.run_edited(mt.fused_moe_kernel, torch.randn(2, 8), torch.randn(4, 16, 8), ids)")
    lines = text.strip().splitlines()
    assert lines[0].startswith("KernelError: your kernel failed: ValueError: topk_ids")
    assert len(lines) == 3 and "Traceback" not in text


def test_errors_raised_outside_the_package_keep_their_traceback(shell):
    text = run(shell, "def f():\n    raise ValueError('mine')\nf()")
    assert "Traceback" in text or "----" in text
    assert "moe_tutorial.notebook.full_tracebacks" not in text


def test_short_message_only_for_the_packages_own_raises():
    try:
        raise ValueError("outside")
    except ValueError as error:
        assert notebook.short_message(type(error), error, error.__traceback__) is None
