"""The series' worked example, small enough to check by hand (notebook 01 computes it)."""
from __future__ import annotations

from types import SimpleNamespace

import torch

#: First GEMM of the worked example, ``[M=2, topk=2, N=2]``.
WORKED_FIRST_GEMM = [[[3.0, 3.0], [9.0, 9.0]], [[18.0, 18.0], [24.0, 24.0]]]
#: The whole layer's output, ``[M=2, K=3]``, to 4 decimals.
WORKED_LAYER = [[251.5432] * 3, [3276.0] * 3]


def worked_example(dtype: torch.dtype = torch.float32, device="cpu") -> SimpleNamespace:
    """M = 2, K = 3, N = 2, E = 4, topk = 2; every weight of expert e equals e + 1.

    Returns a namespace with ``x [2, 3]``, ``weight [4, 2, 3]``, ``topk_ids [2, 2]`` int32,
    ``topk_weights [2, 2]`` (all 0.5), ``w13 [4, 4, 3]`` (w1 = w3, I = 2), ``w2 [4, 3, 2]``,
    and the expected ``first_gemm`` and ``layer`` outputs.
    """
    kw = dict(dtype=dtype, device=device)
    fill = torch.arange(1, 5, **kw)[:, None, None]                   # expert e -> e + 1
    return SimpleNamespace(
        M=2, K=3, N=2, E=4, topk=2, I=2,
        x=torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]], **kw),
        weight=fill.expand(4, 2, 3).contiguous(),
        topk_ids=torch.tensor([[0, 2], [2, 3]], dtype=torch.int32, device=device),
        topk_weights=torch.full((2, 2), 0.5, dtype=torch.float32, device=device),
        w13=fill.expand(4, 4, 3).contiguous(),
        w2=fill.expand(4, 3, 2).contiguous(),
        first_gemm=torch.tensor(WORKED_FIRST_GEMM, **kw),
        layer=torch.tensor(WORKED_LAYER, **kw),
    )
