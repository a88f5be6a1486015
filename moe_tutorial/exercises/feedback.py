"""How a checker talks to a student: one verdict line, a few lines of detail, never a crash.

A checker's body raises :class:`Fail` with a message a student can act on, or returns a
short summary of what passed. :func:`run_check` turns that into printed feedback and a bool;
:func:`call_student` runs the student's function on copies of its inputs, with poisoned
allocations and (in the interpreter) bounds-checked memory and poisoned masked-off lanes,
fails when the function changed an input in place, and turns whatever it raises into a
:class:`Fail` or :class:`NotAttempted`.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import re
import traceback
from typing import Callable

import torch

from . import timelimit
from .catalog import EXERCISES
from .guard import Recorder, find_out_of_bounds, memory_guard, poisoned_allocations, poisoned_masked_loads
from .timelimit import TookTooLong, time_limit

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

#: The verdict words a checker prints.
PASS, FAIL, NOT_ATTEMPTED = "PASS", "FAIL", "NOT ATTEMPTED"

#: The last verdict of every exercise checked in this process: ``{id: (verdict, message)}``.
_LAST: dict[str, tuple[str, str]] = {}


def last_verdict(ex_id: str) -> tuple[str, str] | None:
    """``(verdict, message)`` of the last check of exercise ``ex_id`` in this process, or None.

    The grader reads verdicts here, never from printed text, which the student's code could print too.
    """
    return _LAST.get(ex_id)


class Fail(Exception):
    """Raised inside a checker: the student's code is wrong, the message says how."""


class NotAttempted(Exception):
    """The student's function is still the stub (it raised NotImplementedError)."""


def run_check(ex_id: str, body: Callable[[], str]) -> bool:
    """Run one checker body, print the verdict for exercise ``ex_id``, return True on success.

    Never raises (except KeyboardInterrupt): a student's notebook keeps running.
    """
    name = EXERCISES[ex_id].function
    _LAST.pop(ex_id, None)
    try:
        summary = body()
    except NotAttempted as e:
        return _verdict(ex_id, NOT_ATTEMPTED, f"[{ex_id}] {NOT_ATTEMPTED} {name}: {e}")
    except Fail as e:
        return _verdict(ex_id, FAIL, f"[{ex_id}] {FAIL} {name}\n" + _indent(str(e)))
    except Exception as e:  # noqa: BLE001  (a checker bug must not stop the student either)
        return _verdict(ex_id, FAIL, f"[{ex_id}] {FAIL} {name}\n" + _indent(
            f"the checker itself failed ({type(e).__name__}: {e}); please tell your instructor"))
    return _verdict(ex_id, PASS, f"[{ex_id}] {PASS} {name}: {summary}")


def _verdict(ex_id: str, verdict: str, text: str) -> bool:
    _LAST[ex_id] = (verdict, text)
    print(text)
    return verdict == PASS


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.strip().splitlines())


@contextlib.contextmanager
def on(context: str):
    """Prefix a :class:`Fail` raised inside with the problem it happened on."""
    try:
        yield
    except Fail as e:
        raise Fail(f"on {context}:\n{e}") from None


def call_student(fn: Callable, *args, hints: Callable[[str], str] | None = None, names: tuple | None = None,
                 recorder: Recorder | None = None, **kwargs):
    """Call ``fn(*args, **kwargs)`` the way every checker does.

    The function gets copies of the tensor arguments (same strides, same storage layout), so
    the checker's own inputs stay intact, and a copy it changed in place is a :class:`Fail`
    naming the argument (``names``: what to call the arguments, default ``fn``'s parameter names).
    Fresh allocations start poisoned (NaN); in the interpreter, kernels run under the memory
    guard and masked-off lanes of loads without ``other=`` are poisoned too, both noted in
    ``recorder``. A stub's ``NotImplementedError`` becomes :class:`NotAttempted`; any other
    exception a :class:`Fail` explaining it and, for an out-of-range pointer, adding the hint
    ``hints(name)``, where ``name`` is the input the pointer reached past (a name of
    ``names``) or else the kernel's pointer argument.
    """
    if not callable(fn):
        raise Fail(f"expected a function, got {type(fn).__name__}")
    names = tuple(names) if names else _parameter_names(fn, len(args))
    passed, before = zip(*(_protected(a) for a in args)) if args else ((), ())
    recorder = recorder if recorder is not None else Recorder()
    default_dtype = torch.get_default_dtype()
    try:
        with time_limit() as limit, poisoned_allocations(), memory_guard(recorder), poisoned_masked_loads(recorder):
            out = fn(*passed, **kwargs)
    except TookTooLong as e:
        raise Fail(timelimit.message(e.args[0] if e.args else limit)) from None
    except NotImplementedError as e:
        if _raised_by(e, fn):
            raise NotAttempted(str(e) or "the function still raises NotImplementedError") from None
        raise Fail(explain_exception(e)) from None
    except (Fail, NotAttempted):
        raise
    except (Exception, SystemExit) as e:  # noqa: BLE001
        oob = find_out_of_bounds(e)
        if oob is not None:
            name = _input_at(oob.lo, passed, names) or oob.arg
            hint = hints(name) if hints else ""
            text = "out-of-range pointer: " + oob.explain()
            if recorder.no_other:
                text += (f"\nyour kernel loads {recorder.no_other_text()} with a mask and no other=: on a GPU the "
                         "masked-off lanes are undefined (the checker fills them with NaN or a large negative int), "
                         "and an address built from one lands anywhere. If this access uses such a value, give that "
                         "load other= (e.g. other=0), or mask every load and store that uses it")
            raise Fail(text + (f"\nhint: {hint}" if hint else "")) from None
        raise Fail(explain_exception(e)) from None
    finally:
        torch.set_default_dtype(default_dtype)     # a student's set_default_dtype must not leak into the checks
    _expect_unchanged(passed, before, names)
    return out


#: Inputs whose storage is larger than this are passed as they are (the 3.4 test's sparse
#: weight reserves gigabytes it never touches) and only their elements are compared afterwards.
_COPY_LIMIT_BYTES = 1 << 26


def _protected(arg):
    """``(what to pass, snapshot)``: a copy of a tensor with its exact layout, and what it held."""
    if not isinstance(arg, torch.Tensor):
        return arg, None
    snapshot = (tuple(arg.shape), arg.stride(), arg.dtype, arg.detach().clone())
    storage = arg.untyped_storage()
    if storage.nbytes() > _COPY_LIMIT_BYTES:
        return arg, snapshot
    twin = torch.empty(0, dtype=arg.dtype, device=arg.device)
    twin.set_(storage.clone(), arg.storage_offset(), arg.shape, arg.stride())
    return twin, snapshot


def _parameter_names(fn, count: int) -> tuple:
    try:
        params = [p.name for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    return tuple(params[i] if i < len(params) else f"argument {i + 1}" for i in range(count))


def _input_at(address, passed, names) -> str | None:
    """The name of the input whose storage holds ``address``, if one does."""
    if address is None:
        return None
    for t, name in zip(passed, names):
        if isinstance(t, torch.Tensor):
            storage = t.untyped_storage()
            if storage.data_ptr() <= address < storage.data_ptr() + max(storage.nbytes(), 1):
                return name
    return None


def _expect_unchanged(passed, before, names) -> None:
    """Fail when the student's function changed one of its tensor inputs in place."""
    for t, snap, name in zip(passed, before, names):
        if snap is None:
            continue
        shape, stride, dtype, values = snap
        what = f"your function changed its input `{name}` in place"
        if tuple(t.shape) != shape or t.stride() != stride or t.dtype != dtype:
            got = f"shape {tuple(t.shape)}, strides {t.stride()}, {t.dtype}"
            raise Fail(f"{what}: it was shape {shape}, strides {stride}, {dtype}; now {got}. "
                       "Methods ending in _ (unsqueeze_, t_, resize_) change the caller's tensor; use the "
                       "versions without _ (unsqueeze, .t()), which return a new view")
        now = t.detach()
        changed = ~((now == values) | (now.isnan() & values.isnan())) if values.is_floating_point() else now != values
        if changed.any():
            idx = tuple(int(i) for i in changed.nonzero()[0])
            raise Fail(f"{what}: {name}[{', '.join(map(str, idx))}] was {values[idx].item():.9g}, now "
                       f"{now[idx].item():.9g}. The caller still needs its tensor: in-place operations (`/=`, `-=`, "
                       "`.mul_()`, `out=`, writing into it) change it; compute into a new tensor "
                       f"(`{name} = {name} / s` makes one)")


def _raised_by(exc: BaseException, fn) -> bool:
    """True when ``exc`` was raised in ``fn``'s own body (a stub), not somewhere below it."""
    code = getattr(fn, "__code__", None)
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    return code is None or (last is not None and last.tb_frame.f_code is code)


_KNOWN = [
    (re.compile(r"arange's range must be a power of 2|power of 2", re.I),
     "tl.arange(0, n) needs n to be a power of two. With topk = 3 or 6, topk * BLOCK_N is not one: "
     "lay out TOPK_PAD = triton.next_power_of_2(topk) experts and mask the extra columns (topk_idx < topk)."),
    (re.compile(r"shapes cannot be multiplied|size mismatch", re.I),
     "the matrix shapes do not line up: weight[e] is [N, K], x rows are [K]; did you need a transpose (.T)?"),
    # Checked after the matmul pattern: an elementwise operation, where a transpose is rarely the fix.
    (re.compile(r"must match the size of tensor", re.I),
     "two tensors whose shapes do not broadcast in an elementwise operation (*, +, ...): line up their axes, "
     "e.g. one value per row [n] against an [n, N] block needs v[:, None]; print both shapes."),
    (re.compile(r"index \S+ is out of bounds|out of range", re.I),
     "an index is out of range: check which axis you index with topk_ids (experts) and which with token numbers."),
    (re.compile(r"make_shape_compatible|Cannot broadcast", re.I),
     "two blocks whose shapes do not broadcast: a [BLOCK_K] vector meets a [BLOCK_K, FUSED_N] tile as v[:, None], "
     "a row vector as v[None, :]."),
    (re.compile(r"equal reduction dimensions|dot.*shape", re.I),
     "tl.dot(a, b) multiplies [BLOCK_M, BLOCK_K] by [BLOCK_K, BLOCK_N]: check the order and the shapes of a and b."),
    (re.compile(r"constexpr", re.I),
     "a value used as a block shape or in tl.arange must be a tl.constexpr parameter."),
    (re.compile(r"dtypes match|expected scalar type|dtype mismatch|same dtype", re.I),
     "two tensors of different dtypes meet. A tensor created without dtype= (torch.zeros(...), torch.empty(...)) "
     "is float32 whatever x is: create it with dtype=x.dtype (x.new_zeros(...) / x.new_empty(...) take x's dtype "
     "and device)."),
    (re.compile(r"same device|cannot be accessed from Triton|cpu tensor", re.I),
     "tensors on different devices: create new tensors on x's device (device=x.device, or x.new_zeros(...) "
     "/ torch.zeros_like(...), which take x's device and dtype)."),
    (re.compile(r"shape '\[[^\]]*\]' is invalid for input of size", re.I),
     "a view or reshape to a size that does not hold the tensor's elements: take the sizes from the tensors "
     "(topk_ids.shape[1], x.shape[0]) instead of fixing them (topk is 1, 2, 3, 4, 5 or 6 in the checks)."),
]


def explain_exception(exc: BaseException) -> str:
    """One or two lines: what was raised, where in the student's code, and a hint if we know one."""
    text = _first_line(exc)
    lines = [f"your code raised {type(exc).__name__}: {text}"]
    where = _student_frame(exc)
    if where:
        lines.append(where)
    full = "\n".join(str(e) for e in _chain(exc))
    for pattern, hint in _KNOWN:
        if pattern.search(full):
            lines.append("hint: " + hint)
            break
    return "\n".join(lines)


def _chain(exc: BaseException):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _first_line(exc: BaseException) -> str:
    # Triton wraps interpreter failures as InterpreterError(repr(cause)); show the cause.
    inner = exc.__cause__ if type(exc).__name__ == "InterpreterError" and exc.__cause__ else exc
    msg = str(inner).strip() or type(inner).__name__
    if inner is not exc:
        msg = f"{type(inner).__name__}: {msg}"
    lines = [ln for ln in msg.splitlines() if ln.strip()]
    # Triton's CompilationError puts the source first and the reason last.
    return (lines[-1] if type(exc).__name__ == "CompilationError" else lines[0])[:300] if lines else msg


def _student_frame(exc: BaseException) -> str:
    """The deepest frame that is the student's (not torch, triton or this package)."""
    skip = (os.sep + "site-packages" + os.sep, _PACKAGE_DIR, "<frozen")
    found = None
    for e in _chain(exc):
        for frame in traceback.extract_tb(e.__traceback__):
            if not any(s in frame.filename for s in skip):
                found = frame
    if found is None:
        return ""
    code = f": {found.line.strip()}" if found.line else ""
    return f"in {found.name}, line {found.lineno}{code}"
