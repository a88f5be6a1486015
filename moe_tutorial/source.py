"""Showing the package's own source in a notebook, highlighted, whole or one marked section at a time.

A kernel lives in the package; a notebook shows it with ``show_source(fused_moe_kernel)``, or
only the lines of one step with ``show_source(fused_moe_kernel, "the gather")``. A section starts
at a comment line ``# [the gather]`` (any text in the brackets) and runs up to the next such
marker, or the end of the function. Markers are part of the kernel's comments, so the code a
notebook shows is always the code that runs.
"""
from __future__ import annotations

import inspect
import re
import textwrap

#: A section marker: a line holding only ``# [name]``.
_MARKER = re.compile(r"^\s*# \[(?P<name>[^\]]+)\]\s*$")


def source_of(obj) -> str:
    """The source of a function, class or module; a ``@triton.jit`` kernel gives its Python function's."""
    return inspect.getsource(getattr(obj, "fn", obj))


def sections(obj) -> list[str]:
    """The names of the sections marked in ``obj``'s source, in order."""
    return [m["name"] for line in source_of(obj).splitlines() if (m := _MARKER.match(line))]


def section_source(obj, name: str) -> str:
    """The lines of section ``name`` of ``obj``'s source (marker excluded), dedented.

    Raises ValueError naming the sections there are when ``name`` is not one of them.
    """
    lines = source_of(obj).splitlines()
    starts = [i for i, line in enumerate(lines) if _MARKER.match(line)]
    for i in starts:
        if _MARKER.match(lines[i])["name"] == name:
            end = next((j for j in starts if j > i), len(lines))
            return textwrap.dedent("\n".join(lines[i + 1:end])).strip("\n") + "\n"
    known = ", ".join(repr(s) for s in sections(obj)) or "none"
    raise ValueError(f"section: expected one of the sections marked in {_name(obj)} ({known}), got {name!r}")


def show_source(obj, section: str | None = None):
    """``obj``'s source (or one marked section of it) as highlighted Python for a notebook cell.

    Returns an ``IPython.display.Code`` object: Jupyter renders it with syntax highlighting, and
    its plain-text form (what a terminal or nbval sees) is the source itself.
    """
    from IPython.display import Code

    text = source_of(obj) if section is None else section_source(obj, section)
    return Code(text, language="python")


def _name(obj) -> str:
    fn = getattr(obj, "fn", obj)
    return getattr(fn, "__qualname__", getattr(fn, "__name__", repr(obj)))
