"""The process group a parallel layer runs in, and checks that every rank called it with matching shapes.

A collective only works when every rank of the group calls it with agreeing sizes; a rank with
the wrong hidden size would otherwise hang the others or fail deep inside gloo or NCCL. So the
layers gather a few numbers from every rank first and raise the same clear error on all of them.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def require_group(group=None) -> tuple[int, int]:
    """``(rank, world_size)`` in ``group`` (None: the default group); RuntimeError if there is none."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "process group: expected torch.distributed to be initialised (torch.distributed.init_process_group, "
            "or start the ranks with moe_tutorial.parallel.launch), got none")
    return dist.get_rank(group), dist.get_world_size(group)


def gather_rows(values: torch.Tensor, group=None) -> torch.Tensor:
    """Every rank's ``values`` (a 1-D int64 tensor, the same length on each) stacked: ``[world, n]``.

    On NCCL the tensors must live on the GPU; reading the result on the host waits for it.
    """
    _, world = require_group(group)
    out = [torch.empty_like(values) for _ in range(world)]
    dist.all_gather(out, values.contiguous(), group=group)
    return torch.stack(out).cpu()


def check_same_on_all_ranks(gathered: torch.Tensor, names: list[str]) -> None:
    """Raise ValueError naming the first column of ``gathered`` ``[world, len(names)]`` that differs
    between ranks, with each rank's value. Every rank sees the same table, so all raise alike."""
    for col, name in enumerate(names):
        values = gathered[:, col].tolist()
        if len(set(values)) > 1:
            by_rank = ", ".join(f"{_show(name, v)} on rank {r}" for r, v in enumerate(values))
            raise ValueError(f"{name}: expected the same value on every rank, got {by_rank}")


#: dtypes as small ints, so that they travel in an int64 tensor with the shapes.
DTYPE_CODES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3}


def dtype_code(dtype: torch.dtype) -> int:
    return DTYPE_CODES.get(dtype, len(DTYPE_CODES))


def _show(name: str, value: int) -> str:
    if "dtype" in name:
        names = {code: str(d) for d, code in DTYPE_CODES.items()}
        return names.get(value, "another dtype")
    return str(value)
