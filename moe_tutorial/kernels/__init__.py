"""The Triton kernels of Parts 3 and 4, the alignment that sorts pairs by expert, and their launch configurations.

Import :mod:`moe_tutorial` first: it picks the runtime (GPU, or Triton's CPU interpreter) before
any ``@triton.jit`` here runs.
"""
from .. import runtime  # noqa: I001  (the runtime is picked before triton is imported)

if runtime.INTERPRETED:
    # Triton 3.6's interpreter cannot end a runtime-bounded loop under NumPy 2.4 (see the module).
    from .interpreter_compat import install as _install_interpreter_compat

    _install_interpreter_compat()
