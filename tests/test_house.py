"""The house rules docs/ARCHITECTURE.md states that a test can hold: imports run one way, no module
reaches for another's private names, and the production kernels' signatures stay small enough
to hold in one's head."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "moe_tutorial"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(name: str) -> set[str]:
    """The package's modules that module ``name`` imports anywhere in it (at the top or in a
    function): ``from . import x`` names module ``x`` where there is one, else the package."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if base not in MODULES:
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in MODULES else base)
    found.discard(name)
    return found


def cycles() -> list[list[str]]:
    """Every import cycle between the package's modules, each as the path that closes it (packages'
    ``__init__`` left out: importing a submodule runs its package first, which is no cycle)."""
    graph = {m: {d for d in imported_modules(m) if MODULES[d].name != "__init__.py"} for m in MODULES
             if MODULES[m].name != "__init__.py"}
    found, state = [], {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = "open"
        for d in sorted(graph.get(m, ())):
            if state.get(d) == "open":
                found.append(path[path.index(d):] + [d])
            elif d not in state:
                visit(d, path + [d])
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    return found


def test_the_import_graph_finds_what_it_should():
    assert "moe_tutorial.kernels.sorted_kernel" in imported_modules("moe_tutorial.kernels.sorted_layer")
    assert "moe_tutorial.kernels.persistent_kernel" in imported_modules("moe_tutorial.kernels.sorted_layer")
    assert "moe_tutorial.runtime" in imported_modules("moe_tutorial.kernels.tma")


def test_imports_run_one_way():
    """No module imports one that imports it back, not even inside a function: the structure the
    import graph shows is the structure there is."""
    assert cycles() == []


def test_no_module_imports_another_modules_private_names():
    """A helper another module needs is public (``tma.tma_can_read``, ``sorted_layer.launch_fitted``),
    so a reader can tell a module's own helpers from what it offers."""
    reaching = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("moe_tutorial")):
                reaching += [f"{name}: from {'.' * node.level}{node.module or ''} import {a.name}"
                             for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert reaching == []


def signature_counts(kernel) -> tuple[int, int]:
    """``(parameters, meta-parameters)`` of a ``@triton.jit`` kernel; a tuple argument counts once."""
    params = inspect.signature(kernel.fn).parameters.values()
    return len(params), sum(1 for p in params if "constexpr" in str(p.annotation))


#: The production kernels (docs/ARCHITECTURE.md): each takes at most 28 parameters, 8 of them
#: meta-parameters, so that a reader holds the signature in mind and a new flag is one edit.
KERNELS = ["sorted_kernel.sorted_moe_kernel", "persistent_kernel.persistent_moe_kernel", "fp8_kernel.fp8_moe_kernel"]


@pytest.mark.parametrize("kernel", KERNELS)
def test_production_kernels_take_a_signature_a_reader_can_hold(kernel):
    import importlib

    module, _, name = kernel.partition(".")
    params, meta = signature_counts(getattr(importlib.import_module(f"moe_tutorial.kernels.{module}"), name))
    assert params <= 28 and meta <= 8, (kernel, params, meta)
