"""Input checks shared by every implementation, with errors that name what was wrong."""
from __future__ import annotations

import operator

import torch

from . import runtime

_ID_DTYPES = (torch.int32, torch.int64)
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def _fail(kind, name: str, expected: str, got) -> None:
    raise kind(f"{name}: expected {expected}, got {got}")


def as_int(name: str, value) -> int:
    """``value`` as a Python int if it is integer-like (``numpy.int64``, a 0-d integer tensor; not
    a bool), else a TypeError naming ``name``: every size and block argument is read this way."""
    if isinstance(value, bool) or (isinstance(value, torch.Tensor) and (value.dtype == torch.bool or value.dim())):
        raise TypeError(f"{name}: expected an int, got {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {value!r}") from None


def check_tensor(name: str, t, ndim: int) -> None:
    """``t`` must be a torch.Tensor of rank ``ndim``."""
    if not isinstance(t, torch.Tensor):
        _fail(TypeError, name, "a torch.Tensor", type(t).__name__)
    if t.dim() != ndim:
        _fail(ValueError, name, f"a {ndim}-D tensor", f"shape {tuple(t.shape)}")


def check_matmul_inputs(x, weight, topk_ids, *, kernel: bool = False,
                        weight_name: str = "weight") -> tuple[int, int, int, int, int]:
    """Check the first-GEMM contract and return ``(M, K, N, E, topk)``.

    x ``[M, K]`` float, weight ``[E, N, K]`` of x's dtype and device, topk_ids ``[M, topk]``
    int32/int64 with values in ``[0, E)`` and ``topk <= E``. With ``kernel=True`` the dtype
    must also be one the Triton kernels accept on the current runtime. Errors call the weight
    ``weight_name`` (the layer's checks pass "w13").
    """
    check_tensor("x", x, 2)
    check_tensor(weight_name, weight, 3)
    check_tensor("topk_ids", topk_ids, 2)
    M, K = x.shape
    E, N, Kw = weight.shape
    if E == 0:
        _fail(ValueError, weight_name, f"at least one expert ({weight_name} is [E, N, K] with E >= 1)",
              f"shape {tuple(weight.shape)}")
    if Kw != K:
        _fail(ValueError, weight_name, f"last dim equal to x's K={K} ({weight_name} is [E, N, K])",
              f"shape {tuple(weight.shape)}")
    topk = check_topk_ids(topk_ids, M, E)
    if x.dtype not in _FLOAT_DTYPES:
        _fail(TypeError, "x", "a floating-point dtype", x.dtype)
    if weight.dtype != x.dtype:
        _fail(TypeError, weight_name, f"x's dtype {x.dtype}", weight.dtype)
    for name, t in ((weight_name, weight), ("topk_ids", topk_ids)):
        if t.device != x.device:
            _fail(ValueError, name, f"x's device {x.device}", t.device)
    if kernel:
        check_kernel_dtype("x", x)
        check_no_grad({"x": x, weight_name: weight})
    check_holds_values("x", x)
    check_ids_in_range(topk_ids, E)
    return M, K, N, E, topk


def check_topk_ids(topk_ids, M: int, E: int) -> int:
    """``topk_ids`` (a 2-D tensor) has ``M`` rows, between 1 and ``E`` columns, and an integer
    dtype the kernels read (int32/int64); returns topk."""
    if topk_ids.shape[0] != M:
        _fail(ValueError, "topk_ids", f"{M} rows, one per token of x", f"shape {tuple(topk_ids.shape)}")
    topk = topk_ids.shape[1]
    if topk < 1 or topk > E:
        _fail(ValueError, "topk_ids", f"between 1 and E={E} columns (topk <= number of experts)", f"topk={topk}")
    if topk_ids.dtype not in _ID_DTYPES:
        _fail(TypeError, "topk_ids", "dtype torch.int32 or torch.int64", topk_ids.dtype)
    return topk


def check_ids_in_range(topk_ids, E: int) -> None:
    """Every expert id in ``[0, E)`` (one host sync on a GPU; skipped while a graph is captured)."""
    if topk_ids.numel() and not _capturing(topk_ids):
        lo, hi = torch.stack(torch.aminmax(topk_ids)).tolist()
        if lo < 0 or hi >= E:
            bad = lo if lo < 0 else hi
            _fail(ValueError, "topk_ids", f"expert ids in [0, {E})", f"an id of {bad}")


def _capturing(t: torch.Tensor) -> bool:
    """True while a CUDA graph is being captured: reading device values would break it, so the
    id-range check is skipped (the graph replays inputs that were checked when captured)."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


#: Why a dtype is refused by the kernels, said after the dtypes they take (the reason depends on the dtype).
_KERNEL_DTYPE_WHY = {
    torch.bfloat16: " (the interpreter computes bf16 silently wrong; it runs on a GPU)",
    torch.float16: " (fp16 runs on a GPU; the interpreter takes fp32 only)",
    torch.float64: " (the kernels have no fp64 path: pass .float(), or use impl='loop' or 'indexing' in fp64)",
}


def check_kernel_dtype(name: str, t: torch.Tensor) -> None:
    """The Triton kernels take fp32 in the interpreter and fp32/fp16/bf16 on a GPU, on the
    runtime's device (:func:`check_kernel_device`)."""
    if t.dtype not in runtime.KERNEL_DTYPES:
        where = "a CUDA GPU" if runtime.ON_GPU else "the CPU interpreter"
        allowed = ", ".join(str(d) for d in runtime.KERNEL_DTYPES)
        _fail(TypeError, name, f"one of {allowed} on {where}{_KERNEL_DTYPE_WHY.get(t.dtype, '')}", t.dtype)
    check_kernel_device(name, t)


def check_kernel_device(name: str, t: torch.Tensor) -> None:
    """The Triton kernels read memory where the runtime runs them: CUDA tensors with a GPU,
    CPU tensors in the interpreter (a meta tensor has no memory to read)."""
    if t.device.type != runtime.DEVICE.type:
        expected = ("a CUDA tensor (a GPU is present, kernels run there)" if runtime.ON_GPU
                    else "a CPU tensor (Triton's interpreter runs the kernels on the CPU)")
        _fail(ValueError, name, expected, t.device)


def check_holds_values(name: str, t: torch.Tensor) -> None:
    """A meta tensor has a shape but no values: the checks and the parts need the values."""
    if t.device.type == "meta":
        _fail(ValueError, name, "a tensor that holds values (on cpu or cuda)", t.device)


def check_no_grad(tensors: dict) -> None:
    """Kernels without a backward pass (all but Part 8's layer) refuse a tensor autograd would
    track, rather than return an output silently cut from the graph. ``tensors`` maps names to arguments;
    anything that is not a tensor is left to the other checks."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.requires_grad:
            _fail(ValueError, name, "a tensor that does not require grad (this Triton kernel has no backward: "
                  "call it under torch.no_grad() or on .detach()ed tensors; for gradients use moe_layer with "
                  "impl='sorted' (Part 8's kernels), 'loop' or 'indexing')", "requires_grad=True")


def check_topk_weights(topk_weights, topk_ids) -> None:
    """Router weights ``[M, topk]`` float on topk_ids' device."""
    check_tensor("topk_weights", topk_weights, 2)
    if topk_weights.shape != topk_ids.shape:
        _fail(ValueError, "topk_weights", f"topk_ids' shape {tuple(topk_ids.shape)}",
              f"shape {tuple(topk_weights.shape)}")
    if not topk_weights.is_floating_point():
        _fail(TypeError, "topk_weights", "a floating-point dtype", topk_weights.dtype)
    if topk_weights.device != topk_ids.device:
        _fail(ValueError, "topk_weights", f"topk_ids' device {topk_ids.device}", topk_weights.device)


def check_layer_inputs(x, w13, w2, topk_weights, topk_ids) -> tuple[int, int, int, int, int]:
    """Check the whole layer's contract and return ``(M, K, I, E, topk)``.

    w13 ``[E, 2I, K]`` (gate rows then up rows), w2 ``[E, K, I]``.
    """
    check_tensor("w13", w13, 3)
    check_tensor("w2", w2, 3)
    M, K, N13, E, topk = check_matmul_inputs(x, w13, topk_ids, weight_name="w13")
    if N13 % 2:
        _fail(ValueError, "w13", "an even second dim 2*I (gate rows then up rows)", f"shape {tuple(w13.shape)}")
    inter = N13 // 2
    if tuple(w2.shape) != (E, K, inter):
        _fail(ValueError, "w2", f"shape (E, K, I) = {(E, K, inter)}", f"shape {tuple(w2.shape)}")
    if w2.dtype != x.dtype:
        _fail(TypeError, "w2", f"x's dtype {x.dtype}", w2.dtype)
    if w2.device != x.device:
        _fail(ValueError, "w2", f"x's device {x.device}", w2.device)
    check_topk_weights(topk_weights, topk_ids)
    return M, K, inter, E, topk


def check_out(out, shape: tuple, dtype: torch.dtype, *, device: torch.device | None = None,
              inputs: dict | None = None) -> torch.Tensor:
    """A caller's output buffer: the result's shape, dtype and ``device``, every element at
    its own address, no memory shared with ``inputs`` (a dict name -> tensor), and not a
    tensor autograd tracks (the kernels write it behind autograd's back). Returns it."""
    if not isinstance(out, torch.Tensor):
        _fail(TypeError, "out", "a torch.Tensor", type(out).__name__)
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype:
        _fail(ValueError, "out", f"shape {tuple(shape)} and dtype {dtype}",
              f"shape {tuple(out.shape)} and dtype {out.dtype}")
    if device is not None and out.device != device:
        _fail(ValueError, "out", f"x's device {device}", out.device)
    if overlaps_itself(out):
        # An expanded (stride-0) buffer: every write to one address but the last is lost.
        _fail(ValueError, "out", "a buffer whose elements do not overlap in memory",
              f"strides {out.stride()} for shape {tuple(out.shape)}")
    for name, t in (inputs or {}).items():
        if isinstance(t, torch.Tensor) and t.numel() and out.numel() \
                and t.untyped_storage().data_ptr() == out.untyped_storage().data_ptr():
            _fail(ValueError, "out", "a buffer of its own", f"one that shares memory with {name}")
    check_no_grad({"out": out})
    return out


def first_gemm_out(out, x: torch.Tensor, weight: torch.Tensor, topk_ids: torch.Tensor, *,
                   zeros: bool = False) -> torch.Tensor:
    """The ``[M, topk, N]`` buffer a first-GEMM launcher writes: a new one (uninitialised, or
    zeros with ``zeros=True``), or the caller's ``out`` checked by :func:`check_out`."""
    shape = (x.shape[0], topk_ids.shape[1], weight.shape[1])
    if out is None:
        return x.new_zeros(shape) if zeros else x.new_empty(shape)
    return check_out(out, shape, x.dtype, device=x.device, inputs={"x": x, "weight": weight, "topk_ids": topk_ids})


def overlaps_itself(t: torch.Tensor) -> bool:
    """True if two elements of ``t`` may share an address (a stride-0, expanded dim, or strides
    too small for the dims below them). Conservative: an interleaved layout that happens not to
    overlap also counts; no torch operation produces one."""
    if t.numel() == 0:
        return False
    reach = 0                                     # the largest offset the smaller strides reach
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz > 1):
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False
