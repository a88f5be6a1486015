"""The bench where a reader edits Part 3's kernel and breaks it (notebook 03, "Break it yourself").

Notebook 03 holds a copy of :func:`moe_tutorial.kernels.fused_kernel.fused_moe_kernel` in a cell
(``tests/test_part3_lesson.py`` keeps it equal to the package's source). The reader edits the
copy and runs it through these helpers. In Triton's interpreter every launch runs under the
exercises' memory guard (:func:`moe_tutorial.exercises.guard.memory_guard`), so an edit that
sends a pointer outside its tensors stops before the access, and the helpers say in one line
which program touched what, instead of a traceback through the interpreter's frames.
"""
from __future__ import annotations

import torch

from . import runtime
from .exercises.guard import find_out_of_bounds, memory_guard
from .kernels.fused_kernel import fused_moe_matmul
from .reference import error_text, reference_moe_matmul, rel_error

#: DeepSeek-V3's gate/up expert stride, N * K elements (the wrap probe's default).
DEEPSEEK_V3_EXPERT_STRIDE = 4096 * 7168


class KernelError(Exception):
    """An edited kernel failed; the message says how, in a sentence or two."""


def run_edited(kernel, x: torch.Tensor, weight: torch.Tensor, topk_ids: torch.Tensor, *,
               block_n: int = 2, block_k: int = 2) -> torch.Tensor:
    """Launch ``kernel`` (with ``fused_moe_kernel``'s arguments) as Part 3's launcher does, guarded.

    Prints whether the result equals the float64 reference; returns it. Raises
    :class:`KernelError`, with a short message and no interpreter frames, when the kernel does not
    compile or touches memory outside its tensors.
    """
    try:
        with memory_guard():
            out = fused_moe_matmul(x, weight, topk_ids, block_n=block_n, block_k=block_k, kernel=kernel)
    except Exception as error:           # noqa: BLE001  (any failure of the reader's kernel)
        raise KernelError(_explain(error)) from None
    err = rel_error(out, reference_moe_matmul(x, weight, topk_ids))
    verdict = "equals the float64 reference" if err < 1e-5 else "is WRONG"
    print(f"your kernel, M = {x.shape[0]}, N = {weight.shape[1]}, K = {x.shape[1]}, E = {weight.shape[0]}, "
          f"topk = {topk_ids.shape[1]}: relative error {error_text(err)}, it {verdict}")
    return out


def wrap_probe(kernel, expert: int = 147, stride_we: int = DEEPSEEK_V3_EXPERT_STRIDE) -> int:
    """Where ``kernel`` points expert ``expert``'s first weight load, with DeepSeek-V3's expert stride.

    The tensors are tiny (no 15 GB of weights): the launch claims the expert stride is ``stride_we``
    and the memory guard stops the load, which is out of range either way, before it happens. The
    offset it was going to read says whether the offset arithmetic is int64 (``expert * stride_we``)
    or int32 (that product modulo 2^32). Interpreter only; returns the offset in elements.
    """
    if not runtime.INTERPRETED:
        raise KernelError("wrap_probe needs Triton's interpreter (no GPU, or TRITON_INTERPRET=1)")
    w = torch.zeros(2, 4, 8)
    x = torch.ones(1, 8)
    ids = torch.tensor([[expert]], dtype=torch.int32)
    out = torch.zeros(1, 1, 4)
    try:
        with memory_guard():
            kernel[(1, 1)](x, w, ids, out, 4, 8, 1, x.stride(0), x.stride(1), stride_we, w.stride(1), w.stride(2),
                           ids.stride(0), ids.stride(1), out.stride(0), out.stride(1), out.stride(2),
                           BLOCK_N=4, BLOCK_K=8, TOPK_PAD=1)
    except Exception as error:           # noqa: BLE001
        oob = find_out_of_bounds(error)
        if oob is None or oob.arg != "w_ptr":
            raise KernelError(_explain(error)) from None
        true = expert * stride_we
        wrapped = (true + 2**31) % 2**32 - 2**31
        kind = ("the true offset: int64 arithmetic" if oob.offset == true else
                f"the true offset {true:,} wrapped modulo 2^32: int32 arithmetic" if oob.offset == wrapped else
                f"neither the true offset {true:,} nor its int32 wrap")
        print(f"expert {expert} x stride {stride_we:,}: the kernel's first weight load points at element "
              f"{oob.offset:,} ({kind})")
        return oob.offset
    raise KernelError(f"the kernel loaded no weight of expert {expert}: did you remove the weight load?")


def _explain(error: BaseException) -> str:
    oob = find_out_of_bounds(error)
    if oob is not None:
        return f"your kernel: {oob.explain()}"
    root = error
    while root.__cause__ is not None or root.__context__ is not None:
        root = root.__cause__ or root.__context__
    words = str(root).strip().splitlines()
    return f"your kernel failed: {type(root).__name__}: {words[-1] if words else ''}".rstrip(": ")
