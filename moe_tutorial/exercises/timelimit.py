"""A time limit on one call of a student's function, so that a checker never hangs.

A loop that never ends (``while k < K:`` without ``k += 1``) would otherwise keep a notebook's
check cell running forever; the grader has its own per-cell limit, a student at a laptop does not.
The limit uses ``SIGALRM`` (a timer signal), so it works in the main thread on Linux and macOS,
where Jupyter runs cells; elsewhere (a thread, Windows) the call runs unlimited. Python code is
interrupted at once; a single long operation in C (one huge matmul) only when it returns.
"""
from __future__ import annotations

import contextlib
import signal
import threading

#: Seconds one call of a student's function may take: the slowest correct answers (Part 3's
#: kernels on the 3.4 problem, in the interpreter) take a few seconds.
CALL_LIMIT_S = 60.0


class TookTooLong(BaseException):
    """Raised inside the student's function when its time is up. A BaseException, so that the
    student's own ``except Exception:`` cannot swallow it."""


def _can_time() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def time_limit(seconds: float | None = None):
    """Run the body for at most ``seconds`` (default :data:`CALL_LIMIT_S`), then raise
    :class:`TookTooLong` in it; any timer set before is put back afterwards."""
    seconds = CALL_LIMIT_S if seconds is None else seconds
    if not _can_time() or seconds <= 0:
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
    """What a student is told when a call ran out of time."""
    return (f"your function did not return within {seconds:g} s, so the checker stopped it. Look for a loop "
            "that never ends (a while loop whose condition never changes, a counter that is never advanced) "
            "or work far larger than the problem (a loop over every element in Python)")
