"""The interpreter fix that lets older Tritons run the kernels, and the pass that proves it.

``make test-triton-min`` runs this module with the kernel tests under the oldest triton that
pyproject.toml allows (MOE_EXPECT_TRITON names it); in the main pass the first test skips.
"""
from __future__ import annotations

import os

import moe_tutorial  # noqa: F401  (first: picks the runtime)
from moe_tutorial import runtime
from moe_tutorial.kernels import interpreter_compat

import numpy as np
import pytest
import triton
import triton.language as tl


def test_this_pass_runs_the_triton_it_names():
    want = os.environ.get("MOE_EXPECT_TRITON")
    if want is None:
        pytest.skip("only in `make test-triton-min`")
    assert triton.__version__ == want, f"expected triton {want}, imported {triton.__version__} from {triton.__file__}"


class _Scope:
    def __init__(self):
        self.set = {}

    def set_attr(self, obj, name, value):
        self.set[name] = value


class _Handle:
    data = np.array([7], dtype=np.int32)       # how the interpreter holds a scalar: shape (1,)


class _Tensor:
    handle = _Handle()


@pytest.mark.parametrize("with_scope", [True, False], ids=["triton 3.5+ (scope)", "triton 3.4 (class)"])
def test_install_gives_an_old_interpreter_an_index_that_squeezes(monkeypatch, with_scope):
    """An interpreter whose ``__index__`` is ``int(data)`` (refused by NumPy 2.4 for shape (1,))
    gets one that squeezes first, whichever way that Triton patches ``tl.tensor``."""
    from triton.runtime import interpreter as interp

    def old_patch(tensor, *scope):
        index = lambda self: int(self.handle.data)    # noqa: E731  (Triton 3.6's own line)
        scope[0].set_attr(tensor, "__index__", index) if scope else setattr(tensor, "__index__", index)

    monkeypatch.setattr(interp, "_patch_lang_tensor", old_patch)
    assert interpreter_compat.install() and interpreter_compat.install()    # twice: wrapped once
    tensor_cls = type("T", (_Tensor,), {})
    scope = _Scope()
    interp._patch_lang_tensor(tensor_cls, *([scope] if with_scope else []))
    index = scope.set["__index__"] if with_scope else tensor_cls.__index__
    assert index(_Tensor()) == 7
    assert interp._patch_lang_tensor.__wrapped__ is old_patch


@triton.jit
def _count_blocks(out_ptr, K, BLOCK: tl.constexpr):
    n = 0
    for _ in range(0, tl.cdiv(K, BLOCK)):          # a runtime-bounded loop: __index__ in the interpreter
        n += 1
    tl.store(out_ptr, n)


@pytest.mark.skipif(not runtime.INTERPRETED, reason="the interpreter's loop bound only")
def test_a_runtime_bounded_loop_runs_in_this_interpreter():
    import torch

    out = torch.zeros(1, dtype=torch.int32)
    _count_blocks[(1,)](out, 40, BLOCK=16)
    assert out.item() == 3
