"""Make older Triton interpreters run the series' kernels under NumPy 2.4 and later.

In Triton's interpreter every scalar is a one-element NumPy array of shape ``(1,)``, and a loop
``for k in range(0, tl.cdiv(K, BLOCK_K))`` turns its bound into a Python int through the
tensor's ``__index__``. Triton 3.4 to 3.6's interpreters do that with ``int(data)``, which NumPy 2.4
refuses for an array with a dimension ("only 0-dimensional arrays can be converted to Python
scalars"); Triton 3.9 squeezes the array first. :func:`install` gives the older interpreter the
newer one's ``__index__``, so every kernel with a runtime-bounded loop runs on both. Compiled
kernels (a GPU) never go through it.
"""
from __future__ import annotations

import functools

#: Attribute marking the interpreter's patch function as already wrapped here.
_WRAPPED = "_moe_tutorial_index_fix"


def _index(self) -> int:
    """A scalar tensor's value as a Python int, whatever the shape of its one-element array."""
    return int(self.handle.data.squeeze())


def install() -> bool:
    """Wrap the interpreter's per-launch patching of ``tl.tensor`` so that ``__index__`` squeezes.

    Returns True when the wrapper is in place (now or from an earlier call), False when this
    Triton has no interpreter patch function by that name (nothing to fix, or a layout this
    module does not know; the kernels then run as that Triton runs them).
    """
    from triton.runtime import interpreter as interp

    orig = getattr(interp, "_patch_lang_tensor", None)
    if orig is None:
        return False
    if getattr(orig, _WRAPPED, False):
        return True

    @functools.wraps(orig)
    def patch_lang_tensor(tensor, *scope):
        orig(tensor, *scope)
        if scope:                   # Triton 3.5 on: patches live in a scope undone after the launch
            scope[0].set_attr(tensor, "__index__", _index)
        else:                       # Triton 3.4 sets them on the class for good
            tensor.__index__ = _index

    setattr(patch_lang_tensor, _WRAPPED, True)
    interp._patch_lang_tensor = patch_lang_tensor
    return True
