"""Find, stop and account for every process the browser test starts, using /proc only.

JupyterLab starts each kernel in a session of its own and Playwright starts Chromium in a
process group of its own, so killing one process group is not enough. The tracker remembers
every descendant of the test process it has seen (pid plus start time, so a recycled pid is
not mistaken for ours) and, as a second net, every process whose environment carries the
test's marker variable (inherited by everything started below the test, even when it has
been re-parented to init).
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Proc:
    """One process as /proc shows it."""

    pid: int
    ppid: int
    pgid: int
    state: str
    start: int  # clock ticks after boot: with pid, identifies the process

    @property
    def dead(self) -> bool:
        return self.state in ("Z", "X")


def read_proc(pid: int) -> Proc | None:
    """The /proc/<pid>/stat fields we need, or None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read().decode(errors="replace")
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may itself hold spaces or ')'.
    rest = raw[raw.rindex(")") + 2:].split()
    return Proc(pid=pid, state=rest[0], ppid=int(rest[1]), pgid=int(rest[2]), start=int(rest[19]))


def all_procs() -> dict[int, Proc]:
    """Every process currently visible, keyed by pid."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            proc = read_proc(int(name))
            if proc is not None:
                table[proc.pid] = proc
    return table


def descendants(root: int, table: dict[int, Proc]) -> list[Proc]:
    """All processes below ``root`` in the parent tree (not ``root`` itself)."""
    children: dict[int, list[Proc]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child.pid)
    return found


def has_marker(pid: int, marker: bytes) -> bool:
    """Whether the process was started with ``marker`` (b"NAME=value") in its environment."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return marker in f.read().split(b"\0")
    except OSError:
        return False


def command_line(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
    except OSError:
        return "?"


class ProcessTracker:
    """Remembers the processes started below this test and makes sure none outlive it."""

    def __init__(self, marker_name: str, marker_value: str):
        self.marker_name, self.marker_value = marker_name, marker_value
        self.marker = f"{marker_name}={marker_value}".encode()
        self.seen: dict[tuple[int, int], str] = {}  # (pid, start) -> command line

    def record(self) -> None:
        """Add every current descendant of this process and every marked process."""
        me = os.getpid()
        table = all_procs()
        mine = {p.pid: p for p in descendants(me, table)}
        for proc in table.values():
            if proc.pid != me and proc.pid not in mine and has_marker(proc.pid, self.marker):
                mine[proc.pid] = proc
        for proc in mine.values():
            if not proc.dead:
                self.seen.setdefault((proc.pid, proc.start), command_line(proc.pid))

    def alive(self) -> list[tuple[Proc, str]]:
        """The recorded processes (and any new marked ones) still running."""
        self.record()
        left = []
        for (pid, start), cmd in self.seen.items():
            proc = read_proc(pid)
            if proc is not None and proc.start == start and not proc.dead:
                left.append((proc, cmd))
        return left

    def wait_gone(self, timeout_s: float) -> list[tuple[Proc, str]]:
        """Give processes that are shutting down ``timeout_s`` seconds to finish; returns
        those still running after that."""
        deadline = time.monotonic() + timeout_s
        left = self.alive()
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = self.alive()
        return left

    def stop_all(self, grace_s: float = 5.0) -> list[str]:
        """SIGTERM, then after ``grace_s`` SIGKILL, whatever is still alive.

        Returns a description of each process that had to be stopped here (an empty list
        means everything had already shut down by itself)."""
        left = self.alive()
        stopped = [f"pid {p.pid}: {cmd}" for p, cmd in left]
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            for proc, _ in left:
                _signal(proc, sig)
            deadline = time.monotonic() + wait_s
            while left and time.monotonic() < deadline:
                time.sleep(0.1)
                left = self.alive()
            if not left:
                break
        return stopped


def _signal(proc: Proc, sig: int) -> None:
    try:
        os.kill(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_group(popen: subprocess.Popen, grace_s: float = 10.0) -> None:
    """Stop a process started with ``start_new_session=True`` and its whole process group:
    SIGTERM to the group, up to ``grace_s`` seconds to exit, then SIGKILL to what is left."""
    _killpg(popen.pid, signal.SIGTERM)
    try:
        popen.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        pass
    _killpg(popen.pid, signal.SIGKILL)  # members that outlived the leader, or the leader
    popen.wait(timeout=10)


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
