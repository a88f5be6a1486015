"""Short errors in Jupyter for a reader's mistake.

When a reader's edited cell calls the package with a wrong argument, the error is raised deep in
the package (an input check, a launcher, the interpreter), and IPython prints 40 to 50 lines of
frames the reader never wrote. :func:`install` (done on import inside IPython) registers a
handler for the errors the package raises on purpose (``ValueError``, ``TypeError``,
``IndexError`` and :class:`moe_tutorial.edited_kernel.KernelError`): when the innermost frame is inside
``moe_tutorial``, it prints the message and the reader's own line, and nothing else. Any other
error, and any error raised outside the package, keeps IPython's full traceback;
:func:`full_tracebacks` switches the handler off.
"""
from __future__ import annotations

import sys
import traceback
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
SHORT_ERRORS = (ValueError, TypeError, IndexError)


def _inside(filename: str) -> bool:
    try:
        return Path(filename).resolve().is_relative_to(PACKAGE)
    except (OSError, ValueError):
        return False


def short_message(etype, value, tb) -> str | None:
    """The short form of an error the package raised, or None when it should keep its traceback."""
    frames = traceback.extract_tb(tb)
    if not frames or not _inside(frames[-1].filename):
        return None
    mine = [f for f in frames if not _inside(f.filename)]
    text = f"{etype.__name__}: {value}"
    if mine:
        text += f"\n  in your line {mine[-1].lineno}: {(mine[-1].line or '').strip()}"
    return text + "\n  (moe_tutorial.notebook.full_tracebacks() shows every frame)"


def _handler(shell, etype, value, tb, tb_offset=None):
    text = short_message(etype, value, tb)
    if text is None:
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
    else:
        print(text, file=sys.stderr)
    return None


def install(shell=None) -> bool:
    """Register the short-error handler on ``shell`` (default: the running IPython); False outside IPython."""
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return False
        shell = get_ipython()
    if shell is None:
        return False
    from .edited_kernel import KernelError

    shell.set_custom_exc(SHORT_ERRORS + (KernelError,), _handler)
    return True


def full_tracebacks(shell=None) -> None:
    """Undo :func:`install`: every error shows IPython's full traceback again."""
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    if shell is not None:
        shell.set_custom_exc((), None)
