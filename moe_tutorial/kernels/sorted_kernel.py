"""Part 4: the production kernel. Pairs sorted by expert, one expert per program, ``tl.dot``.

:func:`moe_tutorial.kernels.align.align_block_size` groups the (token, slot) pairs by expert in runs
padded to BLOCK_M. Each program then owns one block of BLOCK_M pairs (all of one expert) and
one BLOCK_N slice of the output, gathers the pairs' input rows, and multiplies them by the
expert's weights on tensor cores. Epilogues fuse SiLU(gate) * up and the router weights. In
the layer, the gate/up GEMM leaves its rows in sorted order and the down GEMM reads them as they
lie (sorted activations).

The kernel is built from small ``@triton.jit`` functions, one production step each (grouped
order, TMA weight loads, short tails, the two epilogues), so that notebook 04 can show each
step's lines on their own; :mod:`moe_tutorial.kernels.minimal_sorted_kernel` is the same idea
with none of them.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.errors import OutOfResources
from triton.tools.tensor_descriptor import TensorDescriptor

from .. import runtime
from ..checks import (
    check_kernel_dtype,
    check_layer_inputs,
    check_matmul_inputs,
    check_no_grad,
    check_topk_weights,
)
from .align import align_block_size, check_alignment
from .configs import KernelConfig, check_config, get_config, shrink
from .topk_sum import topk_sum


@triton.jit
def grouped_tile(pid, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """``(pid_m, pid_n)`` of program ``pid`` in grouped order: GROUP_M row blocks down a column,
    then the next column, so the programs that run together share expert weights in L2."""
    pids_per_group = GROUP_M * num_pid_n
    first_m = (pid // pids_per_group) * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % pids_per_group) % group_rows
    pid_n = (pid % pids_per_group) // group_rows
    return pid_m, pid_n


def pid_to_tile(pid: int, num_pid_m: int, num_pid_n: int, group_m: int) -> tuple[int, int]:
    """:func:`grouped_tile` in plain Python, for the figures and the exercise checkers:
    ``(pid_m, pid_n)`` of program ``pid``. ``group_m = 1`` is plain row-major order.

    Keep the two in step: tests/test_index_math.py checks this against the tiles the kernel's
    programs really store.
    """
    pids_per_group = group_m * num_pid_n
    first_m = (pid // pids_per_group) * group_m
    group_rows = min(num_pid_m - first_m, group_m)
    return first_m + (pid % pids_per_group) % group_rows, (pid % pids_per_group) // group_rows


@triton.jit
def second_half_is_padding(sorted_ids_ptr, pid_m, num_pairs, BLOCK_M: tl.constexpr):
    """True when the last BLOCK_M // 2 rows of row block ``pid_m`` are all padding.

    A run's padding comes after its pairs, so a block's real rows are a prefix of it: the last
    block of an expert's run often holds a few rows and needs only half the multiply.
    """
    offs_half = pid_m * BLOCK_M + BLOCK_M // 2 + tl.arange(0, BLOCK_M // 2)
    return tl.min(tl.load(sorted_ids_ptr + offs_half)) == num_pairs


@triton.jit
def load_weight_tile(b_ptrs, b_desc, b_row, k0, k_ok, USE_TMA: tl.constexpr, EVEN_K: tl.constexpr):
    """One ``[BLOCK_K, BLOCK_N]`` tile of the expert's weights, K elements from ``k0`` on.

    With USE_TMA, the Tensor Memory Accelerator (TMA, Hopper's engine for bulk tensor copies into
    shared memory) fetches the tile through the descriptor ``b_desc`` at row ``b_row``, leaving
    the threads free; rows past this expert's N belong to the next expert, and the store masks
    them. Otherwise the threads load it through ``b_ptrs``, masking K only where K is ragged.
    """
    if USE_TMA:
        b = b_desc.load([b_row, k0]).T
    elif EVEN_K:
        b = tl.load(b_ptrs)
    else:
        b = tl.load(b_ptrs, mask=k_ok[:, None], other=0.0)
    return b


@triton.jit
def silu_and_mul_epilogue(gate, up):
    """``silu(gate) * up`` on the fp32 accumulators, before anything is written to memory."""
    return gate * tl.sigmoid(gate) * up


@triton.jit
def router_weight_epilogue(acc, router_w_ptr, pair, row_ok):
    """Each row (one (token, slot) pair) times its router weight, still in fp32 registers."""
    w = tl.load(router_w_ptr + pair, mask=row_ok, other=0.0)
    return acc * w[:, None]


@triton.jit
def sorted_tile(
    # What differs between a whole row block and half a one (short tails): A's TMA descriptor
    # (None unless A_ROWS is "sorted_tma") and how many rows the tile has.
    a_desc, ROWS: tl.constexpr,
    # Pointers: A, B (the experts' weights) and its TMA descriptor (None unless B_TMA), C, the
    # router weights and the sorted pairs.
    a_ptr, b_ptr, b_desc, c_ptr, router_w_ptr, sorted_ids_ptr,
    # Which tile: row block, column block, and the expert that owns the row block.
    pid_m, pid_n, expert,
    # Sizes
    N, K, num_pairs, a_row_div, stride_b_up, b_rows_per_expert,
    # Strides
    stride_am, stride_ak,
    stride_be, stride_bn, stride_bk,
    stride_cm, stride_cn,
    # Meta-parameters: the tile, then what the launch does (see sorted_moe_kernel)
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    A_ROWS: tl.constexpr, B_TMA: tl.constexpr, C_ROWS: tl.constexpr,
    GATED: tl.constexpr, ROUTER_WEIGHTS: tl.constexpr, EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """The first ROWS rows of row block ``pid_m`` times one expert's ``[BLOCK_N, K]`` slice."""
    # [gather the rows]
    offs_m = pid_m * BLOCK_M + tl.arange(0, ROWS)
    pair = tl.load(sorted_ids_ptr + offs_m)
    row_ok = pair < num_pairs                       # padding rows hold num_pairs
    if A_ROWS == "gathered":
        a_row = (pair // a_row_div).to(tl.int64)
    else:
        # A is already in sorted order (the gate/up GEMM wrote it so): row = position, no gather.
        a_row = offs_m.to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_row[:, None] * stride_am + offs_k[None, :] * stride_ak

    # [the expert's weights]
    # Columns wrap modulo N so that loads stay in bounds without a mask; the store masks them.
    offs_n = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
    b_ptrs = b_ptr + expert * stride_be + offs_n[None, :].to(tl.int64) * stride_bn + offs_k[:, None] * stride_bk
    b_row = (expert * b_rows_per_expert + pid_n * BLOCK_N).to(tl.int32)   # TMA path only

    # [the K loop]
    acc = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    acc_up = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_ok = offs_k < K - k * BLOCK_K
        if A_ROWS == "sorted_tma":
            # Sorted rows are contiguous, so TMA fetches A too. Padding rows bring whatever is
            # there; each output row depends on its own A row only, and padding rows are never stored.
            a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
        elif EVEN_K:
            a = tl.load(a_ptrs, mask=row_ok[:, None], other=0.0)
        else:
            a = tl.load(a_ptrs, mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        b = load_weight_tile(b_ptrs, b_desc, b_row, k * BLOCK_K, k_ok, B_TMA, EVEN_K)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        if GATED:
            # The up rows sit N rows (stride_b_up elements) after the gate rows of the same expert.
            b_up = load_weight_tile(b_ptrs + stride_b_up, b_desc, b_row + N, k * BLOCK_K, k_ok, B_TMA, EVEN_K)
            acc_up = tl.dot(a, b_up, acc_up, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    # [epilogues]
    if GATED:
        acc = silu_and_mul_epilogue(acc, acc_up)
    if ROUTER_WEIGHTS:
        acc = router_weight_epilogue(acc, router_w_ptr, pair, row_ok)

    # [scatter the rows]
    offs_cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    # With C_ROWS = "sorted" the rows stay in sorted order, where the down GEMM reads them as whole blocks.
    if C_ROWS == "sorted":
        c_row = offs_m.to(tl.int64)
    else:
        c_row = pair.to(tl.int64)
    c_ptrs = c_ptr + c_row[:, None] * stride_cm + offs_cn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=row_ok[:, None] & (offs_cn[None, :] < N))


@triton.jit
def sorted_moe_kernel(
    # Pointers: A, B (the experts' weights) and C; TMA descriptors over A (whole and half row
    # blocks) and B, None where unused; the router weights; the alignment.
    a_ptr, a_desc, a_desc_half, b_ptr, b_desc, c_ptr, router_w_ptr,
    sorted_ids_ptr, expert_ids_ptr, num_post_ptr,
    # Sizes
    N, K, num_pairs, max_padded, a_row_div, stride_b_up, b_rows_per_expert,
    # Strides
    stride_am, stride_ak,
    stride_be, stride_bn, stride_bk,
    stride_cm, stride_cn,
    # Meta-parameters: the tile and its order...
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    # ... where A's and C's rows are, whether B comes through TMA ...
    A_ROWS: tl.constexpr, B_TMA: tl.constexpr, C_ROWS: tl.constexpr,
    # ... and what else the launch does.
    GATED: tl.constexpr, ROUTER_WEIGHTS: tl.constexpr, SHORT_TAILS: tl.constexpr,
    EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """C[pair, n] = A[pair // a_row_div] . B[expert(pair), n] for one [BLOCK_M, BLOCK_N] tile.

    Pairs are flat indices m * topk + j. For the first GEMM A is x and a_row_div = topk; for
    the down GEMM A holds one row per pair and a_row_div = 1.

    * A_ROWS: "gathered" (row ``pair // a_row_div``, through pointers), or in sorted order
      (sorted activations: row = sorted position, no gather) through pointers, "sorted", or
      through TMA, "sorted_tma" (``a_desc``, ``a_desc_half`` for half blocks).
    * B_TMA (Hopper): B tiles come through ``b_desc``, a tensor descriptor over B viewed as
      ``[E * b_rows_per_expert, K]``.
    * C_ROWS: "scattered" (row ``pair``), or "sorted" (row = sorted position; C has
      max_padded rows).
    * GATED: B has 2N rows (gate then up, the up rows stride_b_up further on) and
      C = silu(A.B_gate) * (A.B_up). ROUTER_WEIGHTS: each row times its pair's router weight.
    * SHORT_TAILS: a block whose second half is padding multiplies only its first BLOCK_M // 2 rows.
    """
    # [which tile]
    num_pid_m = tl.cdiv(max_padded, BLOCK_M)
    pid_m, pid_n = grouped_tile(tl.program_id(axis=0), num_pid_m, tl.cdiv(N, BLOCK_N), GROUP_M)
    # max_padded is a host-side bound; blocks past the real end have nothing to do.
    if pid_m * BLOCK_M >= tl.load(num_post_ptr):
        return
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    # [short tails]
    half_full = False
    if SHORT_TAILS:
        half_full = second_half_is_padding(sorted_ids_ptr, pid_m, num_pairs, BLOCK_M)
    # [the tile, whole or half]
    # The two calls differ in their first line only: A's descriptor, and the rows of the tile.
    if half_full:
        sorted_tile(a_desc_half, BLOCK_M // 2,
                    a_ptr, b_ptr, b_desc, c_ptr, router_w_ptr, sorted_ids_ptr, pid_m, pid_n, expert,
                    N, K, num_pairs, a_row_div, stride_b_up, b_rows_per_expert,
                    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
                    BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, A_ROWS=A_ROWS, B_TMA=B_TMA, C_ROWS=C_ROWS,
                    GATED=GATED, ROUTER_WEIGHTS=ROUTER_WEIGHTS, EVEN_K=EVEN_K, DOT_PRECISION=DOT_PRECISION)
    else:
        sorted_tile(a_desc, BLOCK_M,
                    a_ptr, b_ptr, b_desc, c_ptr, router_w_ptr, sorted_ids_ptr, pid_m, pid_n, expert,
                    N, K, num_pairs, a_row_div, stride_b_up, b_rows_per_expert,
                    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
                    BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, A_ROWS=A_ROWS, B_TMA=B_TMA, C_ROWS=C_ROWS,
                    GATED=GATED, ROUTER_WEIGHTS=ROUTER_WEIGHTS, EVEN_K=EVEN_K, DOT_PRECISION=DOT_PRECISION)


def _tma_can_read(t: torch.Tensor) -> bool:
    """TMA needs a Hopper GPU (compute capability 9+), unit stride along the last dimension and
    16-byte aligned rows; otherwise the kernel falls back to pointer loads."""
    if runtime.INTERPRETED or not t.is_cuda or torch.cuda.get_device_capability(t.device)[0] < 9:
        return False
    return t.stride(-1) == 1 and (t.stride(-2) * t.element_size()) % 16 == 0 and t.data_ptr() % 16 == 0


def _weight_descriptor(b: torch.Tensor, config: KernelConfig):
    """A TMA descriptor over ``b`` as ``[E * rows, K]``, or None where TMA cannot be used
    (see :func:`_tma_can_read`; the experts must also lie one after another)."""
    E, rows, K = b.shape
    if not _tma_can_read(b) or b.stride(0) != rows * b.stride(1):
        return None
    flat = b.as_strided((E * rows, K), (b.stride(1), 1))
    return TensorDescriptor.from_tensor(flat, [config.block_n, config.block_k])


#: Configurations that did not fit this GPU's shared memory, and what ran instead.
_FITTED: dict = {}


def launch_sorted_gemm(a, b, c, router_weights, alignment, num_pairs: int, a_row_div: int,
                       config: KernelConfig, *, gated: bool = False, a_sorted: bool = False,
                       c_sorted: bool = False) -> None:
    """Launch :func:`sorted_moe_kernel` on buffers the caller built (the bench and the tuner do):
    the checked door to :func:`_launch_fitted`.

    Refuses, with the arguments as :func:`_launch` takes them, an ``alignment`` built for another
    launch (a ValueError, not a wild read; host-side, no sync), tensors autograd would track
    (the kernel has no backward), and with ``a_sorted`` / ``c_sorted`` a side with fewer rows
    than the alignment's sorted positions.
    """
    check_alignment(alignment, block_m=config.block_m, num_pairs=num_pairs, num_experts=b.shape[0], device=a.device)
    check_no_grad({"x (or the activations)": a, "the expert weights": b, "topk_weights": router_weights})
    max_padded = alignment[0].numel()
    for name, t, flag in (("a", a, a_sorted), ("c", c, c_sorted)):
        if flag and t.shape[0] < max_padded:
            raise ValueError(f"{name}: expected one row per sorted position ({max_padded}) with {name}_sorted, "
                             f"got {t.shape[0]} rows")
    _launch_fitted(a, b, c, router_weights, alignment, num_pairs, a_row_div, config, gated=gated,
                   a_sorted=a_sorted, c_sorted=c_sorted)


def _launch_fitted(a, b, c, router_weights, alignment, num_pairs: int, a_row_div: int,
                   config: KernelConfig, *, gated: bool = False, a_sorted: bool = False,
                   c_sorted: bool = False) -> None:
    """:func:`_launch`, shrinking ``config`` if this GPU lacks the shared memory it needs (a table
    tuned on an H200 may ask for more than a smaller GPU has); the shrunk configuration is
    remembered per process. Trusts its caller, as :func:`_launch` does.
    """
    config = check_config(config)     # the layer's configs too (notebook 04 shows sorted_moe_layer as it was)
    key = (config, gated, a.dtype)
    config = _FITTED.get(key, config)
    while True:
        try:
            return _launch(a, b, c, router_weights, alignment, num_pairs, a_row_div, config, gated=gated,
                           a_sorted=a_sorted, c_sorted=c_sorted)
        except OutOfResources:
            smaller = shrink(config)
            if smaller is None:
                raise
            config = _FITTED[key] = smaller


def _activation_descriptors(a: torch.Tensor, config: KernelConfig):
    """TMA descriptors over activations in sorted order, for whole and half row blocks, or
    ``(None, None)`` where TMA cannot or should not be used.

    Only with the configurations that take the weights through TMA too, 64-row tiles or taller
    (the prefill end): on an H200 it paid there and not at decode (measurements/gpu-notes.md, the
    second 2026-12-01 session, "Sorted activations").
    """
    if not config.use_tma or config.block_m < 64 or not _tma_can_read(a):
        return None, None
    return (TensorDescriptor.from_tensor(a, [config.block_m, config.block_k]),
            TensorDescriptor.from_tensor(a, [config.block_m // 2, config.block_k]))


def _launch(a, b, c, router_weights, alignment, num_pairs: int, a_row_div: int,
            config: KernelConfig, *, gated: bool = False, a_sorted: bool = False, c_sorted: bool = False) -> None:
    """Launch :func:`sorted_moe_kernel` once. Shapes as flat pairs: ``c`` is ``[num_pairs, N]``.

    ``a`` ``[rows, K]``, ``b`` ``[E, N or 2N, K]``, ``router_weights`` ``[num_pairs]`` fp32 or
    None, ``alignment`` from :func:`align_block_size` built with ``config.block_m`` for these
    ``num_pairs`` and ``b``'s experts. Sorted activations: with ``c_sorted`` C's rows are the
    alignment's sorted positions, with ``a_sorted`` A's rows are; that side then needs
    ``len(alignment[0])`` rows. Nothing is checked here: the public functions check their
    inputs at the door (:func:`launch_sorted_gemm`, :func:`sorted_moe_matmul`,
    :func:`sorted_moe_layer`).
    """
    sorted_ids, expert_ids, num_post = alignment
    N, K = c.shape[1], a.shape[1]
    max_padded = sorted_ids.numel()
    max_tiles = triton.cdiv(max_padded, config.block_m) * triton.cdiv(N, config.block_n)
    b_desc = _weight_descriptor(b, config) if config.use_tma else None
    a_desc, a_desc_half = _activation_descriptors(a, config) if a_sorted else (None, None)
    args = dict(
        N=N, K=K, num_pairs=num_pairs, a_row_div=a_row_div,
        stride_b_up=N * b.stride(1), b_rows_per_expert=b.shape[1],
        stride_am=a.stride(0), stride_ak=a.stride(1),
        stride_be=b.stride(0), stride_bn=b.stride(1), stride_bk=b.stride(2),
        stride_cm=c.stride(0), stride_cn=c.stride(1),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=config.group_m,
        A_ROWS=("sorted_tma" if a_desc is not None else "sorted") if a_sorted else "gathered",
        B_TMA=b_desc is not None, C_ROWS="sorted" if c_sorted else "scattered",
        GATED=gated, ROUTER_WEIGHTS=router_weights is not None,
        EVEN_K=K % config.block_k == 0, DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    router = router_weights if router_weights is not None else c
    if config.persistent:
        # Imported here: persistent_kernel builds on this module's sorted_tile.
        from .persistent_kernel import persistent_grid, persistent_moe_kernel
        persistent_moe_kernel[persistent_grid(max_tiles)](
            a, a_desc, b, b_desc, c, router, sorted_ids, expert_ids, num_post, **args,
            FLATTEN=not runtime.INTERPRETED, WARP_SPECIALIZE=config.warp_specialize and not runtime.INTERPRETED)
        return
    sorted_moe_kernel[(max_tiles,)](
        a, a_desc, a_desc_half, b, b_desc, c, router, sorted_ids, expert_ids, num_post,
        max_padded=max_padded, SHORT_TAILS=config.short_tails and config.block_m >= 32, **args)


def sorted_moe_matmul(x: torch.Tensor, weight: torch.Tensor, topk_ids: torch.Tensor,
                      topk_weights: torch.Tensor | None = None, *,
                      config: KernelConfig | None = None, alignment=None) -> torch.Tensor:
    """First GEMM with Part 4's kernel, optionally scaled by the router weights.

    Args:
        x: ``[M, K]`` fp32 (interpreter) or fp32/fp16/bf16 (GPU); any strides.
        weight: ``[E, N, K]`` x's dtype; any strides.
        topk_ids: ``[M, topk]`` int32/int64 in ``[0, E)``.
        topk_weights: optional ``[M, topk]`` float; multiplied into each output row.
        config: launch parameters; default from :func:`moe_tutorial.kernels.configs.get_config`.
        alignment: a precomputed ``align_block_size(topk_ids, config.block_m, E)`` of these very
            ``topk_ids``; one built for anything else is refused with a ValueError.

    No backward pass: inputs that require grad are refused unless autograd is off.

    Returns:
        ``[M, topk, N]`` in x's dtype, accumulated in fp32.
    """
    # The door: every input checked once here (x and weight's autograd state included), then
    # the launch trusts them.
    M, K, N, E, topk = check_matmul_inputs(x, weight, topk_ids, kernel=True)
    if topk_weights is not None:
        check_topk_weights(topk_weights, topk_ids)
        check_no_grad({"topk_weights": topk_weights})
    if config is not None:
        config = check_config(config)           # before the empty-batch return: a bad config is bad anyway
    out = x.new_empty(M, topk, N)
    if M == 0 or N == 0:
        return out
    config = config or get_config(M, E, N, K, topk, x.dtype, "plain")
    if alignment is None:
        alignment = align_block_size(topk_ids, config.block_m, E)
    else:
        check_alignment(alignment, block_m=config.block_m, num_pairs=M * topk, num_experts=E, topk_ids=topk_ids)
    router = None if topk_weights is None else topk_weights.reshape(-1).float().contiguous()
    _launch_fitted(x, weight, out.view(M * topk, N), router, alignment, M * topk, topk, config)
    return out


def sorted_moe_layer(x, w13, w2, topk_weights, topk_ids, *, configs=None) -> torch.Tensor:
    """The whole layer with Part 4's kernel: two GEMMs with fused epilogues, then a sum.

    1. gate/up GEMM with ``silu(gate) * up`` in its epilogue -> ``[M * topk, I]``, rows left in
       sorted order when both GEMMs use the same BLOCK_M (they then share one alignment);
    2. down GEMM with the router weights in its epilogue -> ``[M * topk, K]``;
    3. the sum over each token's topk rows (:func:`moe_tutorial.kernels.topk_sum.topk_sum`, fp32).

    Args as :func:`moe_tutorial.layer.moe_layer`; ``configs`` an optional pair of
    :class:`KernelConfig` for the two GEMMs. Returns ``[M, K]`` in x's dtype.
    """
    # The door: every input checked once here, then the launches trust them. The kernels have no
    # backward: what autograd would track is refused first, as moe_layer always did.
    check_no_grad({"x": x, "w13": w13, "w2": w2, "topk_weights": topk_weights})
    M, K, inter, E, topk = check_layer_inputs(x, w13, w2, topk_weights, topk_ids)
    check_kernel_dtype("x", x)
    if M == 0:
        return x.new_empty(0, K)
    cfg_up, cfg_down = configs or (
        get_config(M, E, inter, K, topk, x.dtype, "gated"),
        get_config(M, E, K, inter, topk, x.dtype, "down"),
    )
    # [two GEMMs and a sum]
    num_pairs = M * topk
    align_up = align_block_size(topk_ids, cfg_up.block_m, E)
    router = topk_weights.reshape(-1).float().contiguous()
    down = x.new_empty(num_pairs, K)
    if cfg_down.block_m == cfg_up.block_m:
        # Sorted activations: the gate/up GEMM leaves its rows in sorted order (padding rows
        # included, never written), and the down GEMM reads each block of rows as it lies.
        act = x.new_empty(align_up[0].numel(), inter)
        _launch_fitted(x, w13, act, None, align_up, num_pairs, topk, cfg_up, gated=True, c_sorted=True)
        _launch_fitted(act, w2, down, router, align_up, num_pairs, 1, cfg_down, a_sorted=True)
    else:
        act = x.new_empty(num_pairs, inter)
        _launch_fitted(x, w13, act, None, align_up, num_pairs, topk, cfg_up, gated=True)
        align_down = align_block_size(topk_ids, cfg_down.block_m, E)
        _launch_fitted(act, w2, down, router, align_down, num_pairs, 1, cfg_down)
    return topk_sum(down.view(M, topk, K))
