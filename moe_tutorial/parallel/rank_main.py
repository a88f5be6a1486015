"""The body of one rank's process, started by :func:`moe_tutorial.parallel.launch.launch`.

``python -m moe_tutorial.parallel.rank_main FOLDER RANK WORLD BACKEND TIMEOUT_S``: read the job
from ``FOLDER/job.pkl``, join the process group, run the function, and write
``FOLDER/result-RANK.pkl``: ``(True, pickled result)`` or ``(False, (pickled exception, traceback))``.
"""
from __future__ import annotations

import datetime
import os
import pickle
import sys
import traceback
from pathlib import Path


def main(folder: str, rank: int, world_size: int, backend: str, timeout_s: float) -> None:
    import torch
    import torch.distributed as dist

    try:
        with open(Path(folder) / "job.pkl", "rb") as f:
            sys.path[:] = pickle.load(f)             # the parent's path: fn's module is found the same way
            fn, args, kwargs = pickle.load(f)
        options = {}
        if backend == "nccl":
            torch.cuda.set_device(rank)
            options["device_id"] = torch.device("cuda", rank)
        else:
            torch.set_num_threads(1)
        dist.init_process_group(backend, init_method="file://" + os.path.join(folder, "rendezvous"), rank=rank,
                                world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s), **options)
        result = (True, pickle.dumps(fn(*args, **kwargs)))
    except BaseException as exc:  # noqa: BLE001  (every failure goes back to the parent)
        text = traceback.format_exc()
        try:
            blob = pickle.dumps(exc)
        except Exception:  # noqa: BLE001  (an exception that cannot travel: send its text)
            blob = pickle.dumps(RuntimeError(f"{type(exc).__name__}: {exc}"))
        result = (False, (blob, text))
    # Written whole and then renamed, so the parent never reads half a file.
    path = Path(folder) / f"result-{rank}.pkl"
    path.with_suffix(".tmp").write_bytes(pickle.dumps(result))
    os.replace(path.with_suffix(".tmp"), path)
    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001  (a peer may already be gone)
            pass


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5]))
