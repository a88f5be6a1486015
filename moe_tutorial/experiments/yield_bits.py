"""Part 7's compiled FP8 forms and their yield-edited twins side by side in one process, for timing.

:class:`Yielding` runs a call with a Triton kernel's compiled forms swapped for the twins
:func:`~moe_tutorial.kernels.yield_edit.interleave_yields` made of them, so that one process, one
timer, times both (``measurements/scripts/yield_layer.py``).
"""
from __future__ import annotations

import copy

from ..kernels.yield_edit import interleave_yields


class Yielding:
    """``Yielding(jit_fn, pattern)(call)``: ``call()`` with every form of ``jit_fn`` compiled so far
    swapped for a twin made from ptxas's bytes (a form the package edited keeps them in ``unedited``):
    edited by :func:`interleave_yields` in ``pattern``, or with ``pattern`` None left as ptxas wrote
    them. The twins are made once and kept, and a CUDA graph captured inside holds their code. Call
    ``call()`` once plainly first: a form compiled inside is not swapped. ``changed`` counts the edited
    instructions of each form."""

    def __init__(self, jit_fn, pattern: str | None = "reuse-alternate"):
        self.jit_fn = jit_fn
        self.pattern = pattern
        self.twins: dict[int, object] = {}
        self.changed: dict[str, int] = {}

    def twin(self, kernel):
        """``kernel``'s twin (a Triton ``CompiledKernel`` whose bytes are this pattern's), made once."""
        if id(kernel) not in self.twins:
            twin = copy.copy(kernel)       # metadata shared; the module is loaded anew from the edit
            ptxas = getattr(kernel, "unedited", kernel.kernel)
            twin.kernel, n = interleave_yields(ptxas, pattern=self.pattern) if self.pattern else (ptxas, 0)
            # Triton's handles, its private _run among them: cleared, the twin's launch loads its own bytes.
            twin.module = twin.function = twin._run = None
            self.twins[id(kernel)] = (kernel, twin)
            self.changed[kernel.hash] = n
        return self.twins[id(kernel)][1]

    def __call__(self, call):
        swapped, twins = [], {id(t) for _, t in self.twins.values()}
        for cache, *_ in self.jit_fn.device_caches.values():
            for key, kernel in list(cache.items()):
                if id(kernel) in twins:
                    continue
                swapped.append((cache, key, kernel))
                cache[key] = self.twin(kernel)
        try:
            return call()
        finally:
            for cache, key, kernel in swapped:
                cache[key] = kernel
