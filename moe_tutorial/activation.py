"""The gated expert's activation: ``silu(gate) * up``."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(h: torch.Tensor) -> torch.Tensor:
    """``[..., 2I] -> [..., I]``: SiLU of the first half (gate) times the second half (up).

    This is why w13 stacks gate rows then up rows: one GEMM gives both halves.
    """
    inter = h.shape[-1] // 2
    return F.silu(h[..., :inter]) * h[..., inter:]
