"""How a checker talks to a student: one verdict line, a few lines of detail, never a crash.

A checker's body raises :class:`Fail` with a message a student can act on, or returns a
short summary of what passed. :func:`run_check` turns that into printed feedback and a bool;
:func:`call_student` runs the student's function with poisoned allocations and (in the
interpreter) bounds-checked memory, and turns whatever it raises into a :class:`Fail` or
:class:`NotAttempted`.
"""
from __future__ import annotations

import contextlib
import os
import re
import traceback
from typing import Callable

from .catalog import EXERCISES
from .guard import find_out_of_bounds, memory_guard, poisoned_allocations

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

#: The verdict words; ``grade`` parses them from notebook outputs.
PASS, FAIL, NOT_ATTEMPTED = "PASS", "FAIL", "NOT ATTEMPTED"
VERDICT_RE = re.compile(r"^\[(\d+\.\d+)\] (PASS|FAIL|NOT ATTEMPTED)\b", re.M)


class Fail(Exception):
    """Raised inside a checker: the student's code is wrong, the message says how."""


class NotAttempted(Exception):
    """The student's function is still the stub (it raised NotImplementedError)."""


def run_check(ex_id: str, body: Callable[[], str]) -> bool:
    """Run one checker body, print the verdict for exercise ``ex_id``, return True on success.

    Never raises (except KeyboardInterrupt): a student's notebook keeps running.
    """
    name = EXERCISES[ex_id].function
    try:
        summary = body()
    except NotAttempted as e:
        print(f"[{ex_id}] {NOT_ATTEMPTED} {name}: {e}")
        return False
    except Fail as e:
        print(f"[{ex_id}] {FAIL} {name}\n" + _indent(str(e)))
        return False
    except Exception as e:  # noqa: BLE001  (a checker bug must not stop the student either)
        print(f"[{ex_id}] {FAIL} {name}\n" + _indent(f"the checker itself failed ({type(e).__name__}: {e}); "
                                                      "please tell your instructor"))
        return False
    print(f"[{ex_id}] {PASS} {name}: {summary}")
    return True


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.strip().splitlines())


@contextlib.contextmanager
def on(context: str):
    """Prefix a :class:`Fail` raised inside with the problem it happened on."""
    try:
        yield
    except Fail as e:
        raise Fail(f"on {context}:\n{e}") from None


def call_student(fn: Callable, *args, hints: Callable[[str], str] | None = None, **kwargs):
    """Call ``fn(*args, **kwargs)`` the way every checker does.

    Fresh allocations start poisoned (NaN), kernels run under the interpreter's memory guard.
    A stub's ``NotImplementedError`` becomes :class:`NotAttempted`; any other exception becomes
    a :class:`Fail` explaining it and, for an out-of-range pointer, adding the hint
    ``hints(kernel_argument_name)``.
    """
    if not callable(fn):
        raise Fail(f"expected a function, got {type(fn).__name__}")
    try:
        with poisoned_allocations(), memory_guard():
            return fn(*args, **kwargs)
    except NotImplementedError as e:
        if _raised_by(e, fn):
            raise NotAttempted(str(e) or "the function still raises NotImplementedError") from None
        raise Fail(explain_exception(e)) from None
    except (Fail, NotAttempted):
        raise
    except Exception as e:  # noqa: BLE001
        oob = find_out_of_bounds(e)
        if oob is not None:
            hint = hints(oob.arg) if hints else ""
            raise Fail("out-of-range pointer: " + oob.explain() + (f"\nhint: {hint}" if hint else "")) from None
        raise Fail(explain_exception(e)) from None


def _raised_by(exc: BaseException, fn) -> bool:
    """True when ``exc`` was raised in ``fn``'s own body (a stub), not somewhere below it."""
    code = getattr(fn, "__code__", None)
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    return code is None or (last is not None and last.tb_frame.f_code is code)


_KNOWN = [
    (re.compile(r"arange's range must be a power of 2|power of 2", re.I),
     "tl.arange(0, n) needs n to be a power of two. With topk = 3 or 6, topk * BLOCK_N is not one: "
     "lay out TOPK_PAD = triton.next_power_of_2(topk) experts and mask the extra columns (topk_idx < topk)."),
    (re.compile(r"shapes cannot be multiplied|size mismatch|must match the size", re.I),
     "the matrix shapes do not line up: weight[e] is [N, K], x rows are [K]; did you need a transpose (.T)?"),
    (re.compile(r"index \S+ is out of bounds|out of range", re.I),
     "an index is out of range: check which axis you index with topk_ids (experts) and which with token numbers."),
    (re.compile(r"make_shape_compatible|Cannot broadcast", re.I),
     "two blocks whose shapes do not broadcast: a [BLOCK_K] vector meets a [BLOCK_K, FUSED_N] tile as v[:, None], "
     "a row vector as v[None, :]."),
    (re.compile(r"equal reduction dimensions|dot.*shape", re.I),
     "tl.dot(a, b) multiplies [BLOCK_M, BLOCK_K] by [BLOCK_K, BLOCK_N]: check the order and the shapes of a and b."),
    (re.compile(r"constexpr", re.I),
     "a value used as a block shape or in tl.arange must be a tl.constexpr parameter."),
]


def explain_exception(exc: BaseException) -> str:
    """One or two lines: what was raised, where in the student's code, and a hint if we know one."""
    text = _first_line(exc)
    lines = [f"your code raised {type(exc).__name__}: {text}"]
    where = _student_frame(exc)
    if where:
        lines.append(where)
    full = "\n".join(str(e) for e in _chain(exc))
    for pattern, hint in _KNOWN:
        if pattern.search(full):
            lines.append("hint: " + hint)
            break
    return "\n".join(lines)


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _first_line(exc: BaseException) -> str:
    # Triton wraps interpreter failures as InterpreterError(repr(cause)); show the cause.
    inner = exc.__cause__ if type(exc).__name__ == "InterpreterError" and exc.__cause__ else exc
    msg = str(inner).strip() or type(inner).__name__
    if inner is not exc:
        msg = f"{type(inner).__name__}: {msg}"
    lines = [ln for ln in msg.splitlines() if ln.strip()]
    # Triton's CompilationError puts the source first and the reason last.
    return (lines[-1] if type(exc).__name__ == "CompilationError" else lines[0])[:300] if lines else msg


def _student_frame(exc: BaseException) -> str:
    """The deepest frame that is the student's (not torch, triton or this package)."""
    skip = (os.sep + "site-packages" + os.sep, _PACKAGE_DIR, "<frozen")
    found = None
    for e in _chain(exc):
        for frame in traceback.extract_tb(e.__traceback__):
            if not any(s in frame.filename for s in skip):
                found = frame
    if found is None:
        return ""
    code = f": {found.line.strip()}" if found.line else ""
    return f"in {found.name}, line {found.lineno}{code}"
