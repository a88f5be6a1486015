"""Notice when a student's answer calls the package's own implementation of the exercise.

The checkers compare values with the package's references, so an answer that calls
``moe_tutorial.route`` in exercise 1.1 would pass without being an answer. While a student's
function runs, :func:`watching` replaces each function the exercise names
(:attr:`~moe_tutorial.exercises.catalog.Exercise.package_impls`) with a wrapper that notes the
call, wherever the package's modules or the notebook's namespace hold it, and puts the originals
back afterwards. It is a tripwire for answers written in good faith, not a wall: code that keeps
its own reference to a function from before the check, or copies the package's source, is not
seen; the grader's README says so.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import sys


def _wrapper(fn, name: str, hits: list[str]):
    @functools.wraps(fn)
    def noted(*args, **kwargs):
        if name not in hits:
            hits.append(name)
        return fn(*args, **kwargs)
    return noted


@contextlib.contextmanager
def watching(names=(), namespaces=()):
    """While active, calls of the functions named ``names`` (dotted: ``"moe_tutorial.routing.route"``)
    are noted, in order of first call, in the list this yields. ``namespaces``: dicts besides the
    package's modules where a name may be bound to one of them (a notebook's globals)."""
    hits: list[str] = []
    targets = {}
    for dotted in names:
        module, attr = dotted.rsplit(".", 1)
        fn = getattr(importlib.import_module(module), attr)
        targets[id(fn)] = (fn, dotted)
    places = [vars(m) for n, m in list(sys.modules.items())
              if (n == "moe_tutorial" or n.startswith("moe_tutorial.")) and m is not None]
    places += [ns for ns in namespaces if isinstance(ns, dict)]
    replaced = []
    try:
        for ns in places:
            for key, value in list(ns.items()):
                if id(value) in targets and value is targets[id(value)][0]:
                    fn, dotted = targets[id(value)]
                    ns[key] = _wrapper(fn, dotted, hits)
                    replaced.append((ns, key, value))
        yield hits
    finally:
        for ns, key, value in reversed(replaced):
            ns[key] = value
