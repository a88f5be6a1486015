"""Start N processes that form one torch.distributed group, call a function in each, collect the results.

On a laptop the ranks are CPU processes talking through gloo; on a machine with GPUs, one process
per GPU talking through NCCL. Each rank is a fresh Python (``python -m
moe_tutorial.parallel.rank_main``), which works the same from a script, pytest or a Jupyter
notebook, so the function the ranks run must be importable by name: a top-level function of a
module, not one typed into a notebook cell.

    results = launch(my_module.my_rank_program, 2, arg1, arg2)   # [rank 0's return, rank 1's]
"""
from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: Backends the launcher knows: gloo for CPU processes, nccl for one GPU per process.
BACKENDS = ("gloo", "nccl")
#: After one rank fails, how long the others get to finish before they are stopped (they are
#: often waiting in a collective that the failed rank will never join).
GRACE_S = 5.0


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a rank, shown as the cause of the re-raised error."""

    def __init__(self, text: str):
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return "\n" + self.text


def check_importable(fn) -> None:
    """``fn`` must be a top-level function of an importable module: each rank imports it by name."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    if not callable(fn) or module in (None, "__main__", "__mp_main__") or "<" in qualname:
        where = f"{qualname or type(fn).__name__} from module {module}"
        raise TypeError(f"fn: expected a function defined at the top level of an importable module "
                        f"(each rank is a new process that imports it by name), got {where}")


def child_environment(backend: str) -> dict[str, str]:
    """What a rank's process needs in its environment before Python starts in it.

    gloo ranks are CPU ranks: no GPU (so moe_tutorial picks Triton's interpreter there even on a
    GPU machine) and one thread each, since several of them share a laptop's few cores. They all
    run on this machine, so gloo talks over the loopback interface (unless told otherwise): a
    laptop's host name does not always resolve to an address gloo can use.
    """
    if backend == "gloo":
        env = {"CUDA_VISIBLE_DEVICES": "", "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
        loopback = {"linux": "lo", "darwin": "lo0"}.get(sys.platform)
        if loopback and "GLOO_SOCKET_IFNAME" not in os.environ:
            env["GLOO_SOCKET_IFNAME"] = loopback
        return env
    return {}


def launch(fn, world_size: int, *args, backend: str = "gloo", timeout_s: float = 120.0, echo: bool = False,
           env: dict[str, str] | None = None, collective_timeout_s: float | None = None, **kwargs) -> list:
    """Run ``fn(*args, **kwargs)`` in ``world_size`` new processes that form one process group.

    Each process joins the default group (``torch.distributed.init_process_group``, rendezvous
    through a file in a temporary folder) with its rank, so inside ``fn``, ``dist.get_rank()``
    and ``dist.get_world_size()`` say who it is. With ``backend="nccl"`` rank r uses GPU r.

    Args:
        fn: a top-level function of an importable module; its arguments and return value must
            pickle (tensors do).
        world_size: number of processes, at least 1.
        backend: "gloo" (CPU processes; Triton kernels run in the interpreter there) or "nccl".
        timeout_s: the whole run's limit; ranks still running then are stopped.
        echo: let the ranks print to this process's terminal (otherwise their output is kept
            and shown only when a rank dies without a result).
        env: extra environment variables for the ranks.
        collective_timeout_s: how long a rank waits in one collective before giving up
            (default: ``timeout_s``); shorter lets a run report a hang before its own limit.

    Returns:
        ``[fn's return value on rank 0, on rank 1, ...]``.

    Raises:
        The first rank's exception to arrive (same type, message prefixed with ``rank r:``, the
        rank's traceback as its cause); TimeoutError when ranks did not finish in time.
    """
    check_importable(fn)
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: expected a positive int, got {world_size!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {', '.join(BACKENDS)}, got {backend!r}")
    tmp = Path(tempfile.mkdtemp(prefix="moe_tutorial_ranks_"))
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        with open(tmp / "job.pkl", "wb") as f:
            pickle.dump(list(sys.path), f)          # first, so a rank can import fn's module
            pickle.dump((fn, args, kwargs), f)
        # The ranks import moe_tutorial from where this process found it, wherever they start.
        package_root = str(Path(__file__).resolve().parent.parent.parent)
        path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
        child_env = {**os.environ, **child_environment(backend), **(env or {}), "PYTHONPATH": path}
        for rank in range(world_size):
            cmd = [sys.executable, "-m", "moe_tutorial.parallel.rank_main", str(tmp), str(rank), str(world_size),
                   backend, str(collective_timeout_s or timeout_s)]
            log = None if echo else open(tmp / f"log-{rank}.txt", "wb")
            logs.append(log)
            procs.append(subprocess.Popen(cmd, env=child_env, stdout=log, stderr=subprocess.STDOUT if log else None))
        done, errors = _collect(procs, tmp, timeout_s)
    finally:
        for p in procs:                             # only the processes started above
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            if log is not None:
                log.close()
        texts = {r: (tmp / f"log-{r}.txt").read_text(errors="replace") if not echo else "" for r in range(len(procs))}
        shutil.rmtree(tmp, ignore_errors=True)
    if errors:
        # The first error to arrive is the cause; the others are usually ranks whose collective
        # broke when the failed rank left.
        rank = next(iter(errors))
        raise rank_error(rank, *errors[rank], log=texts.get(rank, ""))
    missing = [r for r in range(world_size) if r not in done]
    if missing:
        raise TimeoutError(f"ranks {missing} returned nothing within {timeout_s:g} s; a rank that waits in a "
                           "collective which another rank never calls waits forever")
    return [pickle.loads(done[r]) for r in range(world_size)]


def _collect(procs: list, tmp: Path, timeout_s: float) -> tuple[dict, dict]:
    """Wait for the ranks' result files until all are in, one failed (plus a grace period for the
    others), or the time is up. Returns ``({rank: pickled result}, {rank: (pickled error, traceback)})``
    with errors in the order they arrived."""
    done: dict[int, bytes] = {}
    errors: dict[int, tuple[bytes, str]] = {}
    deadline = time.monotonic() + timeout_s
    first_error_at = None
    while len(done) + len(errors) < len(procs):
        now = time.monotonic()
        if now > deadline or (first_error_at is not None and now > first_error_at + GRACE_S):
            break
        waiting = [r for r in range(len(procs)) if r not in done and r not in errors]
        # Results that appeared since the last look, oldest first: when a failed rank makes the
        # others fail too, its own (earlier) error must come first.
        found = sorted((p.stat().st_mtime_ns, r, p) for r in waiting if (p := tmp / f"result-{r}.pkl").exists())
        for _, rank, path in found:
            ok, payload = pickle.loads(path.read_bytes())
            (done if ok else errors)[rank] = payload
        for rank in waiting:
            if rank not in done and rank not in errors and procs[rank].poll() is not None \
                    and not (tmp / f"result-{rank}.pkl").exists():
                errors[rank] = (pickle.dumps(RuntimeError(f"the process exited with code {procs[rank].returncode} "
                                                          "without a result")), "")
        if errors and first_error_at is None:
            first_error_at = now
        time.sleep(0.05)
    return done, errors


def rank_error(rank: int, blob: bytes, text: str, log: str = "") -> BaseException:
    """The rank's exception, re-created here with ``rank r:`` in front of its message and the
    rank's traceback (or, when it died without one, the end of its output) as its cause."""
    exc = pickle.loads(blob)
    try:
        again = type(exc)(f"rank {rank}: {exc}")
    except Exception:  # noqa: BLE001  (an exception type with its own constructor)
        again = RuntimeError(f"rank {rank}: {type(exc).__name__}: {exc}")
    cause = text or "\n".join(log.splitlines()[-30:])
    if cause:
        again.__cause__ = RemoteTraceback(cause)
    return again
