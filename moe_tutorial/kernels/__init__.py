"""Every kernel of the series (Parts 3, 4, 7 and 8), the alignment that sorts pairs by expert, the configurations.

A kernel family is a ``*_kernel.py`` module holding the ``@triton.jit`` code a notebook shows
(``sorted_kernel`` and ``persistent_kernel``, ``fp8_kernel``) and, beside it, the module that
launches it behind the public entry points (``sorted_layer``, ``fp8_layer``); Part 8's
``backward_kernel`` keeps its two launchers with its kernels, and ``trainable_layer`` is its entry
point. ``tma`` holds what they all share about TMA descriptors. Imports run from the entry points
down to the kernels, never back.

Import :mod:`moe_tutorial` first: it picks the runtime (GPU, or Triton's CPU interpreter) before
any ``@triton.jit`` here runs.
"""
from .. import runtime  # noqa: I001  (the runtime is picked before triton is imported)

if runtime.INTERPRETED:
    # Triton 3.6's interpreter cannot end a runtime-bounded loop under NumPy 2.4 (see the module).
    from .interpreter_compat import install as _install_interpreter_compat

    _install_interpreter_compat()
