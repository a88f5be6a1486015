"""The grader's child process: a notebook's imports and definitions, and nothing else, then its functions on call.

The grader (:mod:`moe_tutorial.exercises.grade`) starts one such process per notebook, with a
private copy of the package first on ``sys.path``, a fresh empty working folder, and two pipes.
The child runs, of each code cell, only what defines something (:func:`definitions`): imports,
``def`` and ``class`` statements (decorators included) and assignments whose value calls
nothing. Then, on request, it calls the notebook's functions on the arguments the grader sends,
through :func:`~moe_tutorial.exercises.feedback.run_call` with every guard of a check, and sends
back the :class:`~moe_tutorial.exercises.feedback.Outcome` as plain values
(:mod:`~moe_tutorial.exercises.wire`). The verdicts are made in the grader from those values:
nothing this process does reaches them.
"""
from __future__ import annotations

import ast
import builtins
import sys
from pathlib import Path

from . import wire
from .feedback import Outcome, run_call

#: How the grader starts the child: ``python -I -B -c BOOTSTRAP <lib folder> <read fd> <write fd>``.
BOOTSTRAP = ("import sys; sys.path.insert(0, sys.argv[1]); from moe_tutorial.exercises import sandbox; "
             "sandbox.serve(int(sys.argv[2]), int(sys.argv[3]))")


def blank_magics(source: str) -> str:
    """The cell with its IPython lines (``%magic``, ``!shell``) blanked, line numbers kept."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.split("\n"))


def definitions(source: str) -> ast.Module:
    """The statements of a cell the grader runs: imports, ``def`` and ``class`` (with their
    decorators), and assignments to plain names whose value and annotation call nothing
    (``BLOCK_N = 16``, ``fused_moe_matmul_int64 = fused_moe_matmul_any_topk``). Everything else
    (calls, loops, prints, checks, demos) is left out. The statements keep their line numbers.
    Raises SyntaxError for a cell that is not Python."""
    tree = ast.parse(blank_magics(source))
    tree.body = [node for node in tree.body if _defines(node)]
    return tree


def _defines(node: ast.stmt) -> bool:
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return True
    if isinstance(node, ast.Assign):
        return all(_plain_target(t) for t in node.targets) and not _calls(node.value)
    if isinstance(node, ast.AnnAssign):
        return _plain_target(node.target) and not _calls(node.annotation) and \
            (node.value is None or not _calls(node.value))
    return False


def _plain_target(target: ast.expr) -> bool:
    if isinstance(target, ast.Name):
        return True
    return isinstance(target, (ast.Tuple, ast.List)) and all(_plain_target(t) for t in target.elts)


def _calls(expr: ast.expr) -> bool:
    """Does evaluating ``expr`` call anything (lambda bodies, which it does not run, aside)?"""
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr)):
            return True
        if isinstance(node, ast.Lambda):
            stack.extend(node.args.defaults + [d for d in node.args.kw_defaults if d is not None])
            continue
        stack.extend(ast.iter_child_nodes(node))
    return False


# ----------------------------------------------------------------------------- in the child
def serve(read_fd: int, write_fd: int) -> None:
    """Answer the grader's requests until it closes the pipe or says "quit"."""
    _forget_editable_finders()
    namespace = {"__name__": "__notebook__", "__builtins__": builtins}
    while True:
        try:
            request = wire.read_request(wire.receive(read_fd))
        except wire.Closed:
            return
        op, *rest = request
        if op == "quit":
            return
        answer = define(namespace, *rest) if op == "define" else call(namespace, *rest)
        wire.send(write_fd, answer)


def _forget_editable_finders() -> None:
    """Drop the import hooks of an editable install of the package: this process imports its private copy."""
    sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in type(f).__module__
                        and "__editable__" not in getattr(f, "__module__", "")]


def define(namespace: dict, cells: list, functions: list, folder: str) -> bytes:
    """Run the definitions of ``cells`` (``[(cell number, source)]``) in ``namespace``; each cell's
    source is written to a file in ``folder`` first, so that ``@triton.jit`` can read it back.
    Answers ``{"errors": [[cell, text]], "functions": {name: [kind, module]}}``, where kind is
    "function" (callable), "missing", or the type of what the name holds."""
    errors = []
    for number, source in cells:
        path = Path(folder) / f"cell_{number}.py"
        path.write_text(blank_magics(source))
        try:
            code = compile(definitions(source), str(path), "exec")
        except SyntaxError as e:
            errors.append([number, f"SyntaxError: {e.msg} (line {e.lineno})"])
            continue
        try:
            exec(code, namespace)
        except BaseException as e:  # noqa: BLE001  (a cell's error is the notebook's, reported, not fatal)
            first = (str(e).strip().splitlines() or [""])[0][:300]
            errors.append([number, f"{type(e).__name__}: {first}" if first else type(e).__name__])
    seen = {}
    for name in functions:
        value = namespace.get(name, _MISSING)
        kind = "missing" if value is _MISSING else "function" if callable(value) else type(value).__name__
        seen[name] = [kind, str(getattr(value, "__module__", "") or "")]
    return wire.pack({"errors": errors, "functions": seen})


_MISSING = object()


def call(namespace: dict, name: str, args: tuple, kwargs: dict, names, limit: float, watch: tuple) -> bytes:
    """Call ``namespace[name]`` through :func:`run_call` and answer its Outcome as plain values."""
    outcome = run_call(namespace.get(name), args, kwargs, names=names, limit=limit, watch=watch,
                       namespaces=(namespace,))
    try:
        value = wire.to_plain(outcome.value)
        answer = wire.pack({**vars(outcome), "value": value})
        if len(answer) > wire.MAX_BYTES:
            raise wire.TooLarge()
    except wire.TooLarge:
        too = Outcome("raised", text=f"your function returned more than the grader takes ({wire.MAX_BYTES >> 20} MB, "
                                     "or values nested too deep): return the tensor the exercise asks for")
        answer = wire.pack({**vars(too), "value": None})
    return answer
