"""Input checks shared by every implementation, with errors that name what was wrong."""
from __future__ import annotations

import operator

import torch
import triton

from . import runtime
from .fp8_format import BLOCK, FP8_DTYPE, nan_codes, scale_shape

_ID_DTYPES = (torch.int32, torch.int64)
_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def fail(kind, name: str, expected: str, got) -> None:
    """Raise ``kind("<name>: expected <expected>, got <got>")``: the one shape of every input error."""
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


def check_power_of_two(name: str, value, least: int = 1, why: str = "") -> int:
    """``value`` (integer-like, read by :func:`as_int`) as an int that is a power of two of at
    least ``least``; else a ValueError naming ``name``, with ``why`` in the expectation."""
    value = as_int(name, value)
    if value < least or value & (value - 1):
        at_least = f" of at least {least}" if least > 1 else ""
        fail(ValueError, name, f"a power of two{at_least}{f' ({why})' if why else ''}", value)
    return value


def check_tensor(name: str, t, ndim: int) -> None:
    """``t`` must be a dense torch.Tensor of rank ``ndim``."""
    if not isinstance(t, torch.Tensor):
        fail(TypeError, name, "a torch.Tensor", type(t).__name__)
    if t.layout != torch.strided:
        fail(TypeError, name, "a dense tensor (call .to_dense() first)", t.layout)
    if t.dim() != ndim:
        fail(ValueError, name, f"a {ndim}-D tensor", f"shape {tuple(t.shape)}")


def check_matmul_inputs(x, weight, topk_ids, *, kernel: bool = False, weight_name: str = "weight",
                        ids: bool = True) -> tuple[int, int, int, int, int]:
    """Check the first-GEMM contract and return ``(M, K, N, E, topk)``.

    x ``[M, K]`` float, weight ``[E, N, K]`` of x's dtype and device, topk_ids ``[M, topk]``
    int32/int64 with values in ``[0, E)`` and ``topk <= E``. With ``kernel=True`` the dtype
    must also be one the Triton kernels accept on the current runtime. Errors call the weight
    ``weight_name`` (the layer's checks pass "w13"). ``ids=False`` leaves the ids' values to
    the caller (:func:`start_ids_check`), who then reads them without a host wait.
    """
    check_tensor("x", x, 2)
    check_tensor(weight_name, weight, 3)
    check_tensor("topk_ids", topk_ids, 2)
    M, K = x.shape
    E, N, Kw = weight.shape
    if E == 0:
        fail(ValueError, weight_name, f"at least one expert ({weight_name} is [E, N, K] with E >= 1)",
              f"shape {tuple(weight.shape)}")
    if Kw != K:
        fail(ValueError, weight_name, f"last dim equal to x's K={K} ({weight_name} is [E, N, K])",
              f"shape {tuple(weight.shape)}")
    topk = check_topk_ids(topk_ids, M, E)
    if x.dtype not in _FLOAT_DTYPES:
        fail(TypeError, "x", "a floating-point dtype", x.dtype)
    if weight.dtype != x.dtype:
        fail(TypeError, weight_name, f"x's dtype {x.dtype}", weight.dtype)
    for name, t in ((weight_name, weight), ("topk_ids", topk_ids)):
        if t.device != x.device:
            fail(ValueError, name, f"x's device {x.device}", t.device)
    if kernel:
        check_kernel_dtype("x", x)
        check_no_grad({"x": x, weight_name: weight})
    check_holds_values("x", x)
    if ids:
        check_ids_in_range(topk_ids, E)
    return M, K, N, E, topk


def check_topk_ids(topk_ids, M: int, E: int) -> int:
    """``topk_ids`` (a 2-D tensor) has ``M`` rows, between 1 and ``E`` columns, and an integer
    dtype the kernels read (int32/int64); returns topk."""
    if topk_ids.shape[0] != M:
        fail(ValueError, "topk_ids", f"{M} rows, one per token of x", f"shape {tuple(topk_ids.shape)}")
    topk = topk_ids.shape[1]
    if topk < 1 or topk > E:
        fail(ValueError, "topk_ids", f"between 1 and E={E} columns (topk <= number of experts)", f"topk={topk}")
    if topk_ids.dtype not in _ID_DTYPES:
        fail(TypeError, "topk_ids", "dtype torch.int32 or torch.int64", topk_ids.dtype)
    return topk


def check_ids_in_range(topk_ids, E: int) -> None:
    """Every expert id in ``[0, E)`` (one host sync on a GPU; skipped while a graph is captured)."""
    if topk_ids.numel() and not capturing(topk_ids):
        _refuse_ids_outside(*torch.stack(torch.aminmax(topk_ids)).tolist(), E)


def _refuse_ids_outside(lo: int, hi: int, E: int) -> None:
    if lo < 0 or hi >= E:
        fail(ValueError, "topk_ids", f"expert ids in [0, {E})", f"an id of {lo if lo < 0 else hi}")


def start_ids_check(topk_ids, E: int):
    """:func:`check_ids_in_range` without the host wait, for a caller whose kernels are safe with
    any id (Part 8's alignment drops a bad one): on a GPU the ids' least and greatest
    values are copied to pinned host memory behind the work already queued, and
    :func:`finish_ids_check` reads them once the caller has queued its kernels, by when the GPU
    is long past the copy, so the GPU never idles while the host waits. On a CPU (or while a
    CUDA graph is captured) the check runs, or is skipped, now. Returns what finish_ids_check takes."""
    if not topk_ids.is_cuda or not topk_ids.numel() or capturing(topk_ids):
        check_ids_in_range(topk_ids, E)
        return None
    host = torch.empty(2, dtype=topk_ids.dtype, pin_memory=True)
    host.copy_(torch.stack(torch.aminmax(topk_ids)), non_blocking=True)
    copied = torch.cuda.Event()
    copied.record()
    return host, copied, E


def finish_ids_check(pending) -> None:
    """Raise the ValueError of :func:`check_ids_in_range` if :func:`start_ids_check` saw an id
    outside ``[0, E)``; waits for the copy only (``None``: nothing pending)."""
    if pending is not None:
        host, copied, E = pending
        copied.synchronize()
        _refuse_ids_outside(*host.tolist(), E)


def capturing(t: torch.Tensor) -> bool:
    """True while a CUDA graph is being captured: reading device values would break it, so the
    id-range check is skipped (the graph replays inputs that were checked when captured)."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


#: Why a dtype is refused by the kernels, said after the dtypes they take (the reason depends on the dtype).
_KERNEL_DTYPE_WHY = {
    torch.bfloat16: " (the interpreter computes bf16 silently wrong; it runs on a GPU)",
    torch.float16: " (fp16 runs on a GPU; the interpreter takes fp32 only)",
    torch.float64: " (the kernels have no fp64 path: pass .float(), or use impl='loop' or 'indexing' in fp64)",
}


def kernel_dtypes_expected(dtype: torch.dtype) -> str:
    """What the Triton kernels take instead of ``dtype`` on this runtime, and why not that one
    (``""`` when they take it): the "expected" half of a refusal."""
    if dtype in runtime.KERNEL_DTYPES:
        return ""
    where = "a CUDA GPU" if runtime.ON_GPU else "the CPU interpreter"
    allowed = ", ".join(str(d) for d in runtime.KERNEL_DTYPES)
    return f"one of {allowed} on {where}{_KERNEL_DTYPE_WHY.get(dtype, '')}"


def check_kernel_dtype(name: str, t: torch.Tensor) -> None:
    """The Triton kernels take fp32 in the interpreter and fp32/fp16/bf16 on a GPU, on the
    runtime's device (:func:`check_kernel_device`)."""
    expected = kernel_dtypes_expected(t.dtype)
    if expected:
        fail(TypeError, name, expected, t.dtype)
    check_kernel_device(name, t)


def check_kernel_device(name: str, t: torch.Tensor) -> None:
    """The Triton kernels read memory where the runtime runs them: CUDA tensors with a GPU,
    CPU tensors in the interpreter (a meta tensor has no memory to read)."""
    if t.device.type != runtime.DEVICE.type:
        expected = ("a CUDA tensor (a GPU is present, kernels run there)" if runtime.ON_GPU
                    else "a CPU tensor (Triton's interpreter runs the kernels on the CPU)")
        fail(ValueError, name, expected, t.device)


def check_holds_values(name: str, t: torch.Tensor) -> None:
    """A meta tensor has a shape but no values: the checks and the parts need the values."""
    if t.device.type == "meta":
        fail(ValueError, name, "a tensor that holds values (on cpu or cuda)", t.device)


def check_no_grad(tensors: dict) -> None:
    """Kernels without a backward pass (all but Part 8's layer) refuse a tensor autograd would
    track, rather than return an output silently cut from the graph. ``tensors`` maps names to arguments;
    anything that is not a tensor is left to the other checks."""
    if not torch.is_grad_enabled():
        return
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor) and t.requires_grad:
            fail(ValueError, name, "a tensor that does not require grad (this Triton kernel has no backward: "
                 "call it under torch.no_grad() or on .detach()ed tensors; for gradients use moe_layer with "
                 "impl='sorted' (Part 8's kernels), 'loop' or 'indexing')", "requires_grad=True")


def check_topk_weights(topk_weights, topk_ids) -> None:
    """Router weights ``[M, topk]`` float on topk_ids' device."""
    check_tensor("topk_weights", topk_weights, 2)
    if topk_weights.shape != topk_ids.shape:
        fail(ValueError, "topk_weights", f"topk_ids' shape {tuple(topk_ids.shape)}",
              f"shape {tuple(topk_weights.shape)}")
    if not topk_weights.is_floating_point():
        fail(TypeError, "topk_weights", "a floating-point dtype", topk_weights.dtype)
    if topk_weights.device != topk_ids.device:
        fail(ValueError, "topk_weights", f"topk_ids' device {topk_ids.device}", topk_weights.device)


def check_layer_inputs(x, w13, w2, topk_weights, topk_ids, *, ids: bool = True) -> tuple[int, int, int, int, int]:
    """Check the whole layer's contract and return ``(M, K, I, E, topk)``.

    w13 ``[E, 2I, K]`` (gate rows then up rows), w2 ``[E, K, I]``; ``ids`` as in
    :func:`check_matmul_inputs`.
    """
    check_tensor("x", x, 2)
    check_tensor("w13", w13, 3)
    check_tensor("w2", w2, 3)
    _check_not_swapped(x.shape[1], w13, w2)
    M, K, N13, E, topk = check_matmul_inputs(x, w13, topk_ids, weight_name="w13", ids=ids)
    if N13 % 2:
        fail(ValueError, "w13", "an even second dim 2*I (gate rows then up rows)", f"shape {tuple(w13.shape)}")
    inter = N13 // 2
    if tuple(w2.shape) != (E, K, inter):
        fail(ValueError, "w2", f"shape (E, K, I) = {(E, K, inter)}", f"shape {tuple(w2.shape)}")
    if w2.dtype != x.dtype:
        fail(TypeError, "w2", f"x's dtype {x.dtype}", w2.dtype)
    if w2.device != x.device:
        fail(ValueError, "w2", f"x's device {x.device}", w2.device)
    check_topk_weights(topk_weights, topk_ids)
    return M, K, inter, E, topk


def check_out(out, shape: tuple, dtype: torch.dtype, *, device: torch.device | None = None,
              inputs: dict | None = None) -> torch.Tensor:
    """A caller's output buffer: the result's shape, dtype and ``device``, every element at
    its own address, no memory shared with ``inputs`` (a dict name -> tensor), and not a
    tensor autograd tracks (the kernels write it behind autograd's back). Returns it."""
    if not isinstance(out, torch.Tensor):
        fail(TypeError, "out", "a torch.Tensor", type(out).__name__)
    if tuple(out.shape) != tuple(shape) or out.dtype != dtype:
        fail(ValueError, "out", f"shape {tuple(shape)} and dtype {dtype}",
              f"shape {tuple(out.shape)} and dtype {out.dtype}")
    if device is not None and out.device != device:
        fail(ValueError, "out", f"x's device {device}", out.device)
    if overlaps_itself(out):
        # An expanded (stride-0) buffer: every write to one address but the last is lost.
        fail(ValueError, "out", "a buffer whose elements do not overlap in memory",
              f"strides {out.stride()} for shape {tuple(out.shape)}")
    for name, t in (inputs or {}).items():
        if isinstance(t, torch.Tensor) and t.numel() and out.numel() \
                and t.untyped_storage().data_ptr() == out.untyped_storage().data_ptr():
            fail(ValueError, "out", "a buffer of its own", f"one that shares memory with {name}")
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


# ----------------------------------------------------------------------------- FP8 (Part 7)
_FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e5m2)


def check_fp8_pair(name: str, q, scale_name: str, scale, *, rows: int, halves: bool = False,
                   values: bool = True) -> None:
    """An e4m3 tensor and its fp32 scales, as the FP8 kernels take them; errors name what is wrong.

    ``q`` must be ``torch.float8_e4m3fn`` (e5m2, with 2 mantissa bits, is another format); ``scale``
    an fp32 tensor of :func:`~moe_tutorial.fp8_format.scale_shape` on q's device. With ``values``
    (one host read) every scale must also be finite and not negative: 0 is allowed, since it
    dequantises its block to zeros, as a block of zeros may be stored. The entry points pass
    ``values=False`` and read every value they check at once (:func:`check_values`).
    """
    if not isinstance(q, torch.Tensor):
        fail(TypeError, name, "a torch.Tensor", type(q).__name__)
    if q.dtype == torch.float8_e5m2:
        fail(TypeError, name, "torch.float8_e4m3fn (e4m3: 3 mantissa bits, the format of block-scaled "
             "checkpoints; e5m2 has 2 and a different range)", q.dtype)
    if q.dtype != FP8_DTYPE:
        fail(TypeError, name, "torch.float8_e4m3fn (quantise it first: moe_tutorial.quant)", q.dtype)
    if scale is None:
        fail(ValueError, scale_name, f"the fp32 block scales of {name} (FP8 values mean nothing without them)",
             "None")
    if not isinstance(scale, torch.Tensor):
        fail(TypeError, scale_name, "a torch.Tensor", type(scale).__name__)
    if scale.dtype != torch.float32:
        fail(TypeError, scale_name, "torch.float32", scale.dtype)
    if q.dim() < 2:
        fail(ValueError, name, "a tensor of at least 2 dims", f"shape {tuple(q.shape)}")
    expected = scale_shape(q.shape, rows, halves=halves)
    if tuple(scale.shape) != expected:
        block = "128 x 128 block" if rows == BLOCK else "token and 128-wide group"
        fail(ValueError, scale_name, f"shape {expected} (one scale per {block} of {name} {tuple(q.shape)})",
             f"shape {tuple(scale.shape)}")
    if scale.device != q.device:
        fail(ValueError, scale_name, f"{name}'s device {q.device}", scale.device)
    check_holds_values(name, q)
    if values:
        check_values(scales={scale_name: scale})


def check_values(*, topk_ids=None, num_experts: int = 0, finite=None, scales=None, e4m3=None) -> None:
    """The value checks of an entry point, read back at once (one host sync on a GPU).

    ``topk_ids``: every id in ``[0, num_experts)``; ``finite``: ``{name: tensor}`` whose values must
    all be finite (NaN or Inf has no e4m3 scale); ``scales``: ``{name: fp32 scales}``, finite and
    not negative; ``e4m3``: ``{name: e4m3 tensor}`` without NaN codes, checked in Triton's CPU
    interpreter only, which reads a NaN code as +-480 (a GPU reads it as NaN, and NaN comes out).
    Skipped while a CUDA graph is captured: there the FP8 quantiser gives a group with NaN or Inf
    a NaN scale, so such a row comes out NaN, never finite. Only when something is wrong does a
    second read find the first bad element, which the error names.
    """
    checks = []            # (name, tensor, elementwise "wrong", what was expected, how to show a bad value)
    for name, t in (finite or {}).items():
        checks.append((name, t, lambda t: ~torch.isfinite(t), "finite values (NaN or Inf has no e4m3 block scale)",
                       None))
    for name, s in (scales or {}).items():
        checks.append((name, s, lambda s: ~(torch.isfinite(s) & (s >= 0)),
                       "finite scales, none negative (0 for a block of zeros)", None))
    if runtime.INTERPRETED:
        for name, q in (e4m3 or {}).items():
            checks.append((name, q, nan_codes, "no e4m3 NaN codes (0x7F, 0xFF): Triton's CPU interpreter reads "
                           "them as +-480, where a GPU gives NaN", "a NaN code"))
    checks = [c for c in checks if c[1].numel()]
    ids = topk_ids is not None and topk_ids.numel() > 0
    tensors = [c[1] for c in checks] + ([topk_ids] if ids else [])
    if not tensors or any(capturing(t) for t in tensors):
        return
    flags = [wrong(t).any() for _, t, wrong, _, _ in checks]
    if ids:
        flags.append(((topk_ids < 0) | (topk_ids >= num_experts)).any())
    found = torch.stack(flags).tolist()
    if ids and found[-1]:
        check_ids_in_range(topk_ids, num_experts)        # names the id
    for (name, t, wrong, expected, shown), bad in zip(checks, found):
        if bad:
            _refuse_first(name, t, wrong(t), expected, shown=shown, where="block " if name.endswith("scale") else "")


def _refuse_first(name: str, t: torch.Tensor, bad: torch.Tensor, expected: str, *, where: str = "",
                  shown: str | None = None) -> None:
    """Raise ValueError for the first element of ``t`` where ``bad`` holds, with its index and value."""
    idx = tuple(int(i) for i in bad.nonzero()[0])
    value = shown or f"{t[idx].item():g}"
    fail(ValueError, name, expected, f"{value} at {where}[{', '.join(map(str, idx))}]")


def check_fp8_activations(name: str, x) -> None:
    """Activations to quantise in a Triton kernel: an ``[M, K]`` real floating tensor of a dtype the
    kernels take on this runtime, holding values (no values read here: see :func:`check_values`)."""
    if not isinstance(x, torch.Tensor):
        fail(TypeError, name, "a torch.Tensor [M, K]", type(x).__name__)
    if x.dtype in _FP8_DTYPES:
        fail(TypeError, name, "bf16/fp32 activations (the FP8 path quantises them itself)", x.dtype)
    if not x.is_floating_point():
        fail(TypeError, name, "a real floating-point tensor", x.dtype)
    check_tensor(name, x, 2)
    check_holds_values(name, x)
    check_kernel_dtype(name, x)


def check_fp8_matmul_inputs(x_q, x_scale, weight, weight_scale, topk_ids,
                            topk_weights=None) -> tuple[int, int, int, int, int]:
    """The FP8 first GEMM's contract (:func:`moe_tutorial.kernels.fp8_layer.fp8_moe_matmul`);
    returns ``(M, K, N, E, topk)``.

    x_q ``[M, K]`` e4m3 with x_scale ``[M, ceil(K/128)]``, weight ``[E, N, K]`` e4m3 with
    weight_scale ``[E, ceil(N/128), ceil(K/128)]``, all fp32 scales; topk_ids ``[M, topk]``
    int32/int64 in ``[0, E)``; optional topk_weights ``[M, topk]`` float. The values are read once.
    """
    check_fp8_pair("x_q", x_q, "x_scale", x_scale, rows=1, values=False)
    check_fp8_pair("weight", weight, "weight_scale", weight_scale, rows=BLOCK, values=False)
    if x_q.dim() != 2 or weight.dim() != 3:
        fail(ValueError, "x_q, weight", "[M, K] and [E, N, K]", f"shapes {tuple(x_q.shape)}, {tuple(weight.shape)}")
    check_tensor("topk_ids", topk_ids, 2)
    M, K = x_q.shape
    E, N, Kw = weight.shape
    _check_experts("weight", weight)
    if Kw != K:
        fail(ValueError, "weight", f"last dim equal to x_q's K={K}", f"shape {tuple(weight.shape)}")
    for name, t in (("x_q", x_q), ("weight", weight), ("topk_ids", topk_ids)):
        check_kernel_device(name, t)
    topk = check_topk_ids(topk_ids, M, E)
    if topk_weights is not None:
        check_topk_weights(topk_weights, topk_ids)
        check_no_grad({"topk_weights": topk_weights})
    check_values(topk_ids=topk_ids, num_experts=E, scales={"x_scale": x_scale, "weight_scale": weight_scale},
                 e4m3={"x_q": x_q, "weight": weight})
    return M, K, N, E, topk


def check_fp8_layer_inputs(x, w13, w13_scale, w2, w2_scale, topk_weights, topk_ids, *,
                           dtype: torch.dtype) -> tuple[int, int, int, int, int]:
    """The FP8 layer's contract (:func:`moe_tutorial.kernels.fp8_layer.fp8_moe_layer`); returns
    ``(M, K, I, E, topk)``.

    x ``[M, K]`` of ``dtype`` (what the layer returns on this runtime), finite; w13 ``[E, 2I, K]``
    e4m3 (gate rows then up rows) with w13_scale ``[E, 2 * ceil(I/128), ceil(K/128)]``; w2
    ``[E, K, I]`` e4m3 with w2_scale ``[E, ceil(K/128), ceil(I/128)]``; the router's output as for
    the bf16 layer. Every value checked (ids, x, scales) is read back at once.
    """
    check_fp8_activations("x", x)
    check_tensor("w13", w13, 3)
    check_tensor("w2", w2, 3)
    M, K = x.shape
    _check_not_swapped(K, w13, w2)
    check_fp8_pair("w13", w13, "w13_scale", w13_scale, rows=BLOCK, halves=True, values=False)
    check_fp8_pair("w2", w2, "w2_scale", w2_scale, rows=BLOCK, values=False)
    E, N13, Kw = w13.shape
    _check_experts("w13", w13)
    if Kw != K:
        fail(ValueError, "w13", f"last dim equal to x's K={K} (w13 is [E, 2I, K])", f"shape {tuple(w13.shape)}")
    if N13 % 2:
        fail(ValueError, "w13", "an even second dim 2*I (gate rows then up rows)", f"shape {tuple(w13.shape)}")
    inter = N13 // 2
    if tuple(w2.shape) != (E, K, inter):
        fail(ValueError, "w2", f"shape (E, K, I) = {(E, K, inter)}", f"shape {tuple(w2.shape)}")
    check_tensor("topk_ids", topk_ids, 2)
    for name, t in (("w13", w13), ("w2", w2), ("topk_ids", topk_ids)):
        check_kernel_device(name, t)
    topk = check_topk_ids(topk_ids, M, E)
    check_topk_weights(topk_weights, topk_ids)
    if x.dtype != dtype:
        fail(TypeError, "x", f"{dtype} on this runtime", x.dtype)
    check_no_grad({"x": x, "topk_weights": topk_weights})
    check_values(topk_ids=topk_ids, num_experts=E, finite={"x": x},
                 scales={"w13_scale": w13_scale, "w2_scale": w2_scale}, e4m3={"w13": w13, "w2": w2})
    return M, K, inter, E, topk


def _check_experts(name: str, weight: torch.Tensor) -> None:
    """At least one expert: with E = 0 every id is out of range, and the error would blame topk_ids."""
    if weight.shape[0] == 0:
        fail(ValueError, name, f"at least one expert ({name} is [E, ...] with E >= 1)", f"shape {tuple(weight.shape)}")


def _check_not_swapped(K: int, w13: torch.Tensor, w2: torch.Tensor) -> None:
    """w13 ``[E, 2I, K]`` and w2 ``[E, K, I]`` handed in the other way round: say so, not that a shape is off."""
    def fits(a, b) -> bool:         # a as w13 [E, 2I, K], b as w2 [E, K, I]
        return a.shape[-1] == K and a.shape[1] % 2 == 0 and tuple(b.shape) == (a.shape[0], K, a.shape[1] // 2)

    if not fits(w13, w2) and fits(w2, w13):
        fail(ValueError, "w13, w2", f"w13 [E, 2I, K] and w2 [E, K, I] with x's K={K}",
             f"w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)}: they are swapped")


#: Triton releases whose e4m3 ``tl.dot`` was checked: natively on a GPU (FP8 tensor cores need
#: compute capability 8.9+: Ada, Hopper and later), in the CPU interpreter with 3.9.
MIN_TRITON_GPU = (3, 2)
MIN_TRITON_INTERPRETER = (3, 9)


def check_fp8_runtime() -> None:
    """Refuse, with the reason, a runtime where e4m3 kernels cannot run or were never checked: the
    first check of Part 7's entry points."""
    version = tuple(int(p) for p in triton.__version__.split(".")[:2])
    if runtime.INTERPRETED:
        if version < MIN_TRITON_INTERPRETER:
            raise RuntimeError(f"FP8 kernels: Triton's CPU interpreter runs e4m3 tl.dot from Triton "
                               f"{'.'.join(map(str, MIN_TRITON_INTERPRETER))} on; this is Triton {triton.__version__}")
        return
    if version < MIN_TRITON_GPU:
        raise RuntimeError(f"FP8 kernels: expected Triton {'.'.join(map(str, MIN_TRITON_GPU))} or newer, "
                           f"got {triton.__version__}")
    major, minor = torch.cuda.get_device_capability()
    if (major, minor) < (8, 9):
        raise RuntimeError(f"FP8 kernels: need FP8 tensor cores (compute capability 8.9+), "
                           f"this GPU is sm{major}{minor}")
