"""How a checker talks to a student: one verdict line, a few lines of detail, never a crash.

A checker's body raises :class:`Fail` with a message a student can act on, or returns a
short summary of what passed. :func:`run_check` turns that into printed feedback and a bool,
within one time budget for the whole check (:mod:`~moe_tutorial.exercises.timelimit`).
:func:`call_student` is the only way a checker calls the student's function. The call itself,
:func:`run_call`, runs where the function lives: in this process for a notebook's own check
cells, or in the grader's child process for a :class:`Remote` function. It passes copies of the
inputs, with poisoned allocations and (in the interpreter) bounds-checked memory and poisoned
masked-off lanes, notes calls of the package's own answer (:mod:`~moe_tutorial.exercises.tripwire`),
and sums up what happened as an :class:`Outcome` of plain values; :func:`call_student` turns
that into the returned value, a :class:`Fail` or :class:`NotAttempted`, here, where the checker runs.
"""
from __future__ import annotations

import contextlib
import inspect
import os
import re
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

import torch

from . import timelimit, tripwire
from .catalog import EXERCISES
from .guard import Lazy, Recorder, find_out_of_bounds, memory_guard, poisoned_allocations, poisoned_masked_loads
from .timelimit import TookTooLong, time_limit

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep

#: The verdict words a checker prints.
PASS, FAIL, NOT_ATTEMPTED = "PASS", "FAIL", "NOT ATTEMPTED"

#: The last verdict of every exercise checked in this process: ``{id: (verdict, message)}``.
_LAST: dict[str, tuple[str, str]] = {}

#: The exercise whose check is running (set by :func:`run_check`), for the tripwire's list.
_CURRENT: list[str] = []


def last_verdict(ex_id: str) -> tuple[str, str] | None:
    """``(verdict, message)`` of the last check of exercise ``ex_id`` in this process, or None.

    The grader reads verdicts here, in its own process, never from printed text.
    """
    return _LAST.get(ex_id)


class Fail(Exception):
    """Raised inside a checker: the student's code is wrong, the message says how."""


class NotAttempted(Exception):
    """The student's function is still the stub (it raised NotImplementedError)."""


def run_check(ex_id: str, body: Callable[[], str]) -> bool:
    """Run one checker body, print the verdict for exercise ``ex_id``, return True on success.

    All calls of the student's function share one time budget (:data:`timelimit.CHECK_LIMIT_S`).
    Never raises (except KeyboardInterrupt): a student's notebook keeps running.
    """
    name = EXERCISES[ex_id].function
    _LAST.pop(ex_id, None)
    _CURRENT.append(ex_id)
    try:
        with timelimit.budget():
            summary = body()
    except NotAttempted as e:
        return _verdict(ex_id, NOT_ATTEMPTED, f"[{ex_id}] {NOT_ATTEMPTED} {name}: {e}")
    except Fail as e:
        return _verdict(ex_id, FAIL, f"[{ex_id}] {FAIL} {name}\n" + _indent(str(e)))
    except Exception as e:  # noqa: BLE001  (a checker bug must not stop the student either)
        return _verdict(ex_id, FAIL, f"[{ex_id}] {FAIL} {name}\n" + _indent(
            f"the checker itself failed ({type(e).__name__}: {e}); please tell your instructor"))
    finally:
        _CURRENT.pop()
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


@dataclass
class Outcome:
    """What one call of a student's function did, in plain values (it crosses processes).

    ``kind``: "ok" (``value`` holds the result), "not_attempted", "not_callable", "package" (the
    package's own function handed in), "package_call" (it called the package's answer), "raised",
    "oob" (an out-of-range pointer, in ``oob_name``'s memory), "changed" (an input changed in
    place), "timeout", or "died" (the grader's child process ended). ``text``: the message, or
    what it is built from. The rest is what the guards saw (:class:`~moe_tutorial.exercises.guard.Recorder`).
    """

    kind: str
    value: object = None
    text: str = ""
    oob_name: str = ""
    no_other: list = field(default_factory=list)
    grids: list = field(default_factory=list)
    launches: int = 0
    #: Indices of the inputs whose memory some kernel launch received.
    inputs_launched: list = field(default_factory=list)
    package_calls: list = field(default_factory=list)
    seconds: float = 0.0


class Remote:
    """A student's function that lives in another process (the grader's child): calling it goes
    through :meth:`remote_call`, which runs :func:`run_call` there and returns its :class:`Outcome`."""

    def remote_call(self, args: tuple, kwargs: dict, names: tuple | None, limit: float,
                    watch: tuple[str, ...]) -> Outcome:
        raise NotImplementedError


def call_student(fn: Callable, *args, hints: Callable[[str], str] | None = None, names: tuple | None = None,
                 recorder: Recorder | None = None, **kwargs):
    """Call ``fn(*args, **kwargs)`` the way every checker does, and return what it returned.

    The function gets copies of the tensor arguments (same strides, same storage layout), so
    the checker's own inputs stay intact, and a copy it changed in place is a :class:`Fail`
    naming the argument (``names``: what to call the arguments, default ``fn``'s parameter names).
    Fresh allocations start poisoned (NaN); in the interpreter, kernels run under the memory
    guard and masked-off lanes of loads without ``other=`` are poisoned too, both noted in
    ``recorder``. A stub's ``NotImplementedError`` becomes :class:`NotAttempted`; any other
    exception a :class:`Fail` explaining it and, for an out-of-range pointer, adding the hint
    ``hints(name)``, where ``name`` is the input the pointer reached past (a name of
    ``names``) or else the kernel's pointer argument. A call of the package's own answer to the
    running exercise, a call past the check's time budget, or the package's function handed in
    as the answer, is a :class:`Fail` too. Arguments may be lazy (:class:`~moe_tutorial.exercises.guard.Lazy`):
    they are made where the function runs.
    """
    limit = timelimit.remaining()
    if limit <= 0:
        raise Fail(timelimit.message(timelimit.total()))
    watch = EXERCISES[_CURRENT[-1]].package_impls if _CURRENT else ()
    if isinstance(fn, Remote):
        outcome = fn.remote_call(args, kwargs, names, limit, watch)
    else:
        outcome = run_call(fn, args, kwargs, names=names, limit=limit, watch=watch)
    if recorder is not None:
        recorder.absorb(outcome)
    return _result(outcome, hints)


def _result(outcome: Outcome, hints) -> object:
    """The value of an "ok" :class:`Outcome`; for any other kind, the Fail or NotAttempted it means."""
    kind, text = outcome.kind, outcome.text
    if kind == "ok":
        return outcome.value
    if kind == "not_attempted":
        raise NotAttempted(text or "the function still raises NotImplementedError")
    if kind == "timeout":
        raise Fail(timelimit.message(timelimit.total()))
    if kind == "not_callable":
        raise Fail(f"expected a function, got {text}")
    if kind == "package":
        raise Fail(f"this is the package's own implementation, {text}, handed in as the answer: write the function "
                   "yourself (the checker compares your function with the package's)")
    if kind == "package_call":
        calls = ", ".join(f"`{name}`" for name in outcome.package_calls)
        raise Fail(f"your function calls the package's own {calls}, which computes this exercise's answer (the checker "
                   "compares with it): that is not an answer. Write this step yourself; the package may do only the "
                   "steps of earlier exercises, where the exercise says so")
    if kind == "oob":
        hint = hints(outcome.oob_name) if hints else ""
        message = "out-of-range pointer: " + text
        if outcome.no_other:
            loaded = ", ".join(f"`{name}`" for name in outcome.no_other)
            message += (f"\nyour kernel loads {loaded} with a mask and no other=: on a GPU the masked-off lanes are "
                        "undefined (the checker fills them with NaN or a large negative int), and an address built "
                        "from one lands anywhere. If this access uses such a value, give that load other= (e.g. "
                        "other=0), or mask every load and store that uses it")
        raise Fail(message + (f"\nhint: {hint}" if hint else ""))
    raise Fail(text)        # "raised", "changed", "died"


def run_call(fn: Callable, args: tuple, kwargs: dict, *, names: tuple | None = None, limit: float | None = None,
             watch: tuple[str, ...] = (), namespaces: tuple = ()) -> Outcome:
    """Call the student's ``fn`` once, in this process, under every guard; never raises (but for
    KeyboardInterrupt). ``limit``: seconds it may take (default the whole check budget);
    ``watch``: the package's functions it must not call (dotted names), looked for in the
    package's modules, ``fn``'s globals and ``namespaces``."""
    if not callable(fn):
        return Outcome("not_callable", text=type(fn).__name__)
    module = getattr(fn, "__module__", None) or ""
    if module.split(".")[0] == "moe_tutorial":
        return Outcome("package", text=f"{module}.{getattr(fn, '__qualname__', '?')}")
    names = tuple(names) if names else _parameter_names(fn, len(args))
    try:
        made = [a.make() if isinstance(a, Lazy) else None for a in args]
    except Exception as e:  # noqa: BLE001  (the checker's input, not the student's code)
        return Outcome("raised", text=f"the checker could not prepare an input here ({type(e).__name__}: {e}); "
                                      "please tell your instructor")
    args = tuple(m[0] if m is not None else a for m, a in zip(made, args))
    passed, before = zip(*(_protected(a) for a in args)) if args else ((), ())
    recorder = Recorder()
    default_dtype = torch.get_default_dtype()
    start = time.monotonic()
    hits: list[str] = []
    try:
        with time_limit(timelimit.CHECK_LIMIT_S if limit is None else limit), poisoned_allocations(), \
                memory_guard(recorder), poisoned_masked_loads(recorder), \
                tripwire.watching(watch, (getattr(fn, "__globals__", None), *namespaces)) as hits:
            out = fn(*passed, **kwargs)
    except TookTooLong:
        outcome = Outcome("timeout")
    except NotImplementedError as e:
        outcome = (Outcome("not_attempted", text=str(e)) if _raised_by(e, fn)
                   else Outcome("raised", text=explain_exception(e)))
    except (Exception, SystemExit) as e:  # noqa: BLE001
        oob = find_out_of_bounds(e)
        outcome = (Outcome("oob", text=oob.explain(), oob_name=_input_at(oob.lo, passed, names) or oob.arg)
                   if oob is not None else Outcome("raised", text=explain_exception(e)))
    else:
        changed = _changed_in_place(passed, before, names)
        outcome = Outcome("changed", text=changed) if changed else Outcome("ok", value=out)
    finally:
        torch.set_default_dtype(default_dtype)     # a student's set_default_dtype must not leak into the checks
        for m in made:
            if m is not None:
                m[1]()
    if hits:
        outcome = Outcome("package_call")
    outcome.seconds = time.monotonic() - start
    outcome.package_calls = list(hits)
    outcome.no_other, outcome.grids = list(recorder.no_other), list(recorder.grids)
    outcome.launches = len(recorder.launches)
    outcome.inputs_launched = recorder.inputs_launched(passed)
    return outcome


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


def _changed_in_place(passed, before, names) -> str:
    """The message when the student's function changed one of its tensor inputs in place, else ``""``."""
    for t, snap, name in zip(passed, before, names):
        if snap is None:
            continue
        shape, stride, dtype, values = snap
        what = f"your function changed its input `{name}` in place"
        if tuple(t.shape) != shape or t.stride() != stride or t.dtype != dtype:
            got = f"shape {tuple(t.shape)}, strides {t.stride()}, {t.dtype}"
            return (f"{what}: it was shape {shape}, strides {stride}, {dtype}; now {got}. "
                    "Methods ending in _ (unsqueeze_, t_, resize_) change the caller's tensor; use the "
                    "versions without _ (unsqueeze, .t()), which return a new view")
        now = t.detach()
        changed = ~((now == values) | (now.isnan() & values.isnan())) if values.is_floating_point() else now != values
        if changed.any():
            idx = tuple(int(i) for i in changed.nonzero()[0])
            return (f"{what}: {name}[{', '.join(map(str, idx))}] was {values[idx].item():.9g}, now "
                    f"{now[idx].item():.9g}. The caller still needs its tensor: in-place operations (`/=`, `-=`, "
                    "`.mul_()`, `out=`, writing into it) change it; compute into a new tensor "
                    f"(`{name} = {name} / s` makes one)")
    return ""


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
