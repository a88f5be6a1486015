"""Part 3's kernel as the seed article published it, faults included, for tests and benchmarks.

This is a re-implementation of the published design, not the kernel the series teaches with
(that is :mod:`moe_tutorial.kernels.fused_kernel`). It keeps the three faults on purpose, so that tests
can show each one and the benchmark can time the kernel as readers first met it:

1. ``FUSED_N = topk * BLOCK_N`` is handed to ``tl.arange``, which only takes powers of two:
   topk = 3, 5, 6 or 7 does not compile (DeepSeek-V2-Lite routes to 6 experts).
2. Every offset is int32 arithmetic. With int32 expert ids (what routers return),
   ``expert * stride_we`` wraps once it passes 2^31: on DeepSeek-V3's first GEMM
   (E = 256, N = 4096, K = 7168) experts 74 and above read the wrong memory.
3. The products ``x * w`` are formed in the input dtype, and ``tl.sum`` adds them over a K
   block in that dtype too (Triton keeps a float input's dtype); only the running total is
   fp32. Harmless in fp32, a little precision lost in bf16/fp16.

Use :func:`published_fused_moe_matmul` rather than launching the kernel yourself.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .. import runtime  # noqa: F401  (the runtime must be chosen before @triton.jit runs)
from ..checks import check_matmul_inputs, first_gemm_out
from .fused_kernel import resolve_blocks


@triton.jit
def published_fused_moe_kernel(
    x_ptr, w_ptr, topk_ids_ptr, out_ptr,
    M, K, N, topk,
    stride_xm, stride_xk,
    stride_we, stride_wn, stride_wk,
    stride_im, stride_ik,
    stride_om, stride_ot, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, FUSED_N: tl.constexpr,
):
    """out[m, j, n] = sum_k x[m, k] * w[topk_ids[m, j], n, k], one token per program (as published).

    The local names are the article's (``fused_n_offsets``, ``expert_ids``, ``k_offsets_col``,
    ``w_ptrs``, ...); the arguments keep the package's names, as the launcher passes them.
    """
    # [Step 0: the grid]
    # program_id is int32 and nothing below widens it: every offset is int32 (fault 2).
    pid_m = tl.program_id(axis=0)
    pid_n = tl.program_id(axis=1)

    # [Step 1: the fused-topk encoding]
    # The topk experts side by side, FUSED_N = topk * BLOCK_N wide. arange needs a power of
    # two, and nothing pads topk up to one (fault 1).
    fused_n_offsets = tl.arange(0, FUSED_N)[None, :]          # [1, FUSED_N]
    topk_idx = fused_n_offsets // BLOCK_N                      # which of the token's experts
    n_inner = fused_n_offsets % BLOCK_N
    n_global = pid_n * BLOCK_N + n_inner

    # [Step 2: the gather pointer grid]
    expert_ids_ptr = topk_ids_ptr + pid_m * stride_im + topk_idx * stride_ik
    expert_ids_mask = topk_idx < topk
    expert_ids = tl.load(expert_ids_ptr, mask=expert_ids_mask, other=0)

    # [Step 3: the K loop]
    acc = tl.zeros((1, FUSED_N), dtype=tl.float32)
    k_offsets_row = tl.arange(0, BLOCK_K)[None, :]            # [1, BLOCK_K] for x
    k_offsets_col = tl.arange(0, BLOCK_K)[:, None]            # [BLOCK_K, 1] for the weights
    for k in range(0, K, BLOCK_K):
        x_ptrs = x_ptr + pid_m * stride_xm + (k + k_offsets_row) * stride_xk
        x_mask = (k + k_offsets_row) < K
        x_chunk = tl.load(x_ptrs, mask=x_mask, other=0.0)
        # int32 expert ids times an int32 stride: wraps past 2^31 elements (fault 2).
        w_ptrs = w_ptr + expert_ids * stride_we + n_global * stride_wn + (k + k_offsets_col) * stride_wk
        w_mask = ((k + k_offsets_col) < K) & (n_global < N) & (topk_idx < topk)
        w_chunk = tl.load(w_ptrs, mask=w_mask, other=0.0)
        # Multiply and reduce in the input dtype; only the sum meets the fp32 accumulator (fault 3).
        acc += tl.sum(tl.trans(x_chunk) * w_chunk, axis=0)[None, :]

    # [Step 3: the scatter]
    out_ptrs = out_ptr + pid_m * stride_om + topk_idx * stride_ot + n_global * stride_on
    out_mask = (n_global < N) & (topk_idx < topk)
    tl.store(out_ptrs, acc, mask=out_mask)


def int32_offset(expert: int, stride: int) -> int:
    """What ``expert * stride`` becomes in the published kernel's int32 arithmetic.

    Two's-complement wrap-around, as on the GPU and in the interpreter: for DeepSeek-V3's
    first GEMM (``stride = N * K = 29_360_128``) expert 73 is still right, expert 74 comes out
    negative (below the tensor) and expert 147 lands 20_971_520 elements in, inside expert 0.
    """
    wrapped = (int(expert) * int(stride)) % 2 ** 32
    return wrapped - 2 ** 32 if wrapped >= 2 ** 31 else wrapped


def published_fused_moe_matmul(x: torch.Tensor, weight: torch.Tensor, topk_ids: torch.Tensor, *,
                               block_n: int | None = None, block_k: int | None = None,
                               out: torch.Tensor | None = None) -> torch.Tensor:
    """First GEMM with the kernel as published: grid ``(M, cdiv(N, BLOCK_N))``, BLOCK_M = 1.

    Args:
        x: ``[M, K]`` fp32 (interpreter) or fp32/fp16/bf16 (GPU).
        weight: ``[E, N, K]`` x's dtype. More than 2^31 elements gives wrong numbers with
            int32 ids (offsets wrap) and may read outside the tensor.
        topk_ids: ``[M, topk]`` int32/int64 in ``[0, E)``. ``topk * block_n`` must be a power
            of two: otherwise ``tl.arange`` refuses to compile the kernel, and this raises a
            ValueError that says so (the Triton error that names ``arange`` is its ``__cause__``).
        block_n, block_k: defaults from :func:`moe_tutorial.kernels.fused_kernel.resolve_blocks`,
            the same tiles the fixed kernel uses, so timings compare like with like.
        out: optional ``[M, topk, N]`` buffer of x's dtype; by default zeros, as published.

    Returns:
        ``[M, topk, N]`` in x's dtype.
    """
    # The published launcher checks nothing; we keep the input checks so that misuse still
    # gets a clear error, and leave the kernel's own faults alone.
    M, K, N, E, topk = check_matmul_inputs(x, weight, topk_ids, kernel=True)
    out = first_gemm_out(out, x, weight, topk_ids, zeros=True)    # zeros, as published
    block_n, block_k = resolve_blocks(topk, N, K, block_n, block_k)
    if M == 0 or N == 0:
        return out
    grid = (M, triton.cdiv(N, block_n))
    try:
        published_fused_moe_kernel[grid](
            x, weight, topk_ids, out,
            M, K, N, topk,
            x.stride(0), x.stride(1),
            weight.stride(0), weight.stride(1), weight.stride(2),
            topk_ids.stride(0), topk_ids.stride(1),
            out.stride(0), out.stride(1), out.stride(2),
            BLOCK_M=1, BLOCK_K=block_k, BLOCK_N=block_n, FUSED_N=topk * block_n,
        )
    except Exception as error:  # noqa: BLE001  (the compiler and the interpreter wrap it differently)
        if not _is_arange_refusal(error):
            raise
        raise ValueError(non_power_of_two_message(topk, block_n)) from error
    return out


#: Where the series explains fault 1, for the error that reports it.
FAULT_1_SECTION = "notebook 03_triton_fused_kernel, section 'Step 1: the fused-topk encoding'"


def non_power_of_two_message(topk: int, block_n: int) -> str:
    """The error the published launcher raises when ``topk * block_n`` is not a power of two."""
    fused_n = topk * block_n
    pad = triton.next_power_of_2(topk)
    return (f"topk_ids: expected topk * BLOCK_N to be a power of 2 (it is the published kernel's FUSED_N, "
            f"and tl.arange takes nothing else), got topk = {topk}, BLOCK_N = {block_n}, FUSED_N = {fused_n}. "
            f"This is the article's fault 1, explained in {FAULT_1_SECTION}; "
            f"moe_tutorial.fused_moe_matmul pads topk to TOPK_PAD = {pad} and masks the padding.")


def _is_arange_refusal(error: BaseException) -> bool:
    """True when ``error`` (or what it wraps) is tl.arange refusing a range that is not a power of 2."""
    while error is not None:
        text = str(error)
        if "arange" in text and "power of 2" in text:
            return True
        error = error.__cause__ or error.__context__
    return False
