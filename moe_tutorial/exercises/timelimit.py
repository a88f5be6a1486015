"""The time a checker gives a student's function: one budget for all its calls in one check.

A loop that never ends (``while k < K:`` without ``k += 1``) would otherwise keep a notebook's
check cell running forever. A checker calls the student's function several times (each problem,
and again on a second probe when one fails), so the limit is a budget for the whole check, not
for each call: a check never lasts longer than the limit its message names.

Inside one process the limit is a ``SIGALRM`` timer (it works in the main thread on Linux and
macOS, where Jupyter runs cells; elsewhere, a thread or Windows, the call runs unlimited):
Python code is interrupted at once, a single long operation in C (one huge matmul) only when it
returns. The grader enforces the same budget from outside as well, killing the process that
runs the notebook's code when its time is up, whatever that code does with signals.
"""
from __future__ import annotations

import contextlib
import signal
import threading
import time

#: Seconds all calls of a student's function in one check may take together: the slowest correct
#: answers (Part 4's kernels over all their problems, in the interpreter) take a few seconds.
CHECK_LIMIT_S = 60.0

#: The budgets in force, innermost last: ``(deadline on time.monotonic(), seconds)``.
_BUDGETS: list[tuple[float, float]] = []


class TookTooLong(BaseException):
    """Raised inside the student's function when its time is up. A BaseException, so that the
    student's own ``except Exception:`` cannot swallow it."""


@contextlib.contextmanager
def budget(seconds: float | None = None):
    """While active, :func:`remaining` counts down from ``seconds`` (default :data:`CHECK_LIMIT_S`,
    read when the budget starts). A budget inside another ends no later than the outer one."""
    seconds = CHECK_LIMIT_S if seconds is None else seconds
    _BUDGETS.append((time.monotonic() + seconds, seconds))
    try:
        yield seconds
    finally:
        _BUDGETS.pop()


def remaining() -> float:
    """Seconds left of the budgets in force (the whole :data:`CHECK_LIMIT_S` outside any)."""
    if not _BUDGETS:
        return CHECK_LIMIT_S
    return min(deadline for deadline, _ in _BUDGETS) - time.monotonic()


def total() -> float:
    """The seconds of the budget in force, as its messages name it."""
    return min((seconds for _, seconds in _BUDGETS), default=CHECK_LIMIT_S)


def _can_time() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def time_limit(seconds: float):
    """Run the body for at most ``seconds``, then raise :class:`TookTooLong` in it; any timer set
    before is put back afterwards. ``seconds <= 0`` raises at once."""
    if seconds <= 0:
        raise TookTooLong(seconds)
    if not _can_time():
        yield seconds
        return

    def ring(signum, frame):
        raise TookTooLong(seconds)

    previous = signal.signal(signal.SIGALRM, ring)
    left, interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield seconds
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if left:
            signal.setitimer(signal.ITIMER_REAL, left, interval)   # an outer timer keeps running


def message(seconds: float) -> str:
    """What a student is told when the budget ran out."""
    return (f"your function did not return within {seconds:g} s, the time the checker gives it for this exercise "
            "(all its calls together), so it was stopped. Look for a loop that never ends (a while loop whose "
            "condition never changes, a counter that is never advanced) or work far larger than the problem "
            "(a loop over every element in Python)")
