"""Notebook 03's toy kernel: doubles any vector, in programs of ``block`` elements, its last one masked."""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

import math

import pytest
import torch

from moe_tutorial import runtime
from moe_tutorial.kernels.interpreter import trace_program
from moe_tutorial.kernels.toy_kernel import double


@pytest.mark.parametrize("n,block", [(1, 1), (10, 4), (17, 16), (64, 8), (0, 4)])
def test_doubles_every_element(n, block):
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(runtime.DEVICE)
    assert torch.equal(double(x, block), 2 * x)


@pytest.mark.skipif(not runtime.INTERPRETED, reason="traces the CPU interpreter")
@pytest.mark.parametrize("n,block", [(10, 4), (12, 4), (5, 8)])
def test_the_last_program_masks_what_lies_past_the_end(n, block):
    x = torch.arange(float(n))
    last = math.ceil(n / block) - 1
    load, store = trace_program(lambda: double(x, block), (last,))
    offs = list(range(last * block, last * block + block))
    assert load.offsets.tolist() == store.offsets.tolist() == offs
    assert load.mask.tolist() == store.mask.tolist() == [o < n for o in offs]


@pytest.mark.parametrize("bad,block,error,match", [
    (torch.ones(2, 3), 4, ValueError, r"^x: expected a 1-D tensor, got shape \(2, 3\)"),
    ([1.0, 2.0], 4, TypeError, r"^x: expected a torch.Tensor, got list"),
    (torch.ones(8), 3, ValueError, r"^block: expected a power of two"),
    (torch.ones(8)[::2], 4, ValueError, r"^x: expected a contiguous tensor"),
    (torch.ones(8), 4.0, TypeError, r"^block: expected an int"),
])
def test_bad_input_is_named(bad, block, error, match):
    if isinstance(bad, torch.Tensor):
        bad = bad.to(runtime.DEVICE)
    with pytest.raises(error, match=match):
        double(bad, block)
