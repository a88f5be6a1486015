"""Which runtime the kernels use: a CUDA GPU natively, or Triton's interpreter on the CPU.

Triton decides between compiling and interpreting when ``@triton.jit`` runs, that is when a
kernel module is imported. This module must therefore be imported before any kernel module;
``moe_tutorial/__init__.py`` imports it first.
"""
from __future__ import annotations

import os
import sys
import warnings

import torch

#: True when a CUDA GPU is present and kernels compile natively.
ON_GPU: bool = torch.cuda.is_available()

if not ON_GPU:
    if "triton.language" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        # triton.language builds its own helpers (tl.zeros, ...) for the runtime chosen when it
        # was imported; too late to switch them to the interpreter now.
        warnings.warn(
            "triton was imported before moe_tutorial on a machine without a GPU, so its kernels "
            "cannot run in the interpreter. Restart Python and import moe_tutorial first "
            "(or set TRITON_INTERPRET=1 before starting it).", RuntimeWarning, stacklevel=2)
    # Must happen before triton.jit decorates anything.
    os.environ.setdefault("TRITON_INTERPRET", "1")

#: True when Triton kernels run in the CPU interpreter.
INTERPRETED: bool = os.environ.get("TRITON_INTERPRET", "0") == "1"

#: The device the series' tensors live on.
DEVICE: torch.device = torch.device("cuda" if ON_GPU else "cpu")

#: The dtype examples use by default: bf16 on a GPU, fp32 on the CPU, where the
#: interpreter mishandles bf16.
DEFAULT_DTYPE: torch.dtype = torch.bfloat16 if ON_GPU else torch.float32

#: dtypes the Triton kernels accept on this runtime.
KERNEL_DTYPES: tuple[torch.dtype, ...] = (
    (torch.float32, torch.float16, torch.bfloat16) if ON_GPU else (torch.float32,)
)


def sm_count() -> int:
    """Streaming multiprocessors of this GPU (an H200's 132 on the CPU, for planning)."""
    if ON_GPU:
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return 132


_announced = False


def describe() -> str:
    """One line saying where kernels run, e.g. for a notebook's first cell."""
    if ON_GPU:
        return f"moe_tutorial: kernels compile for {torch.cuda.get_device_name()} (default dtype bfloat16)"
    return (
        "moe_tutorial: no CUDA GPU, so Triton kernels run in its CPU interpreter "
        "(default dtype float32; timings here say nothing about GPU speed)"
    )


def announce() -> None:
    """Print :func:`describe` once per process."""
    global _announced
    if not _announced:
        _announced = True
        print(describe())
