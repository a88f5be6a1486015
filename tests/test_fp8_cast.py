"""The cast to e4m3 inside a kernel (notebook 07, section 5): after round_to_e4m3 it is torch's cast
on every e4m3 value and every midpoint; alone it is whatever the runtime's cast does."""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

import pytest
import torch

from moe_tutorial import runtime
from moe_tutorial.figures.part7 import e4m3_values
from moe_tutorial.kernels.fp8_quant import cast_to_e4m3


def every_e4m3_value_and_midpoint() -> torch.Tensor:
    v = e4m3_values()
    v = torch.cat([-v.flip(0), v]).unique()
    return torch.cat([v, (v[1:] + v[:-1]) / 2])


def test_rounded_first_the_kernels_cast_is_torchs():
    x = every_e4m3_value_and_midpoint()
    for chunk in x.split(1024):
        got = cast_to_e4m3(chunk.to(runtime.DEVICE)).cpu()
        assert torch.equal(got.float(), chunk.to(torch.float8_e4m3fn).float())      # -0 and 0 alike
    assert cast_to_e4m3(torch.tensor([124.3], device=runtime.DEVICE)).float().item() == 128.0


def test_the_plain_cast_gives_e4m3_values():
    out = cast_to_e4m3(torch.tensor([124.3, 100.0, 0.001], device=runtime.DEVICE), round_first=False)
    assert out.dtype == torch.float8_e4m3fn and out.shape == (3,)
    if runtime.ON_GPU:                  # the hardware's cast rounds to nearest
        assert out.float().tolist() == [128.0, 96.0, 0.001953125]


@pytest.mark.parametrize("bad,match", [(torch.ones(2, 2), r"^x: expected a 1-D tensor"),
                                       (torch.ones(2000), r"^x: expected at most 1024 fp32 values")])
def test_bad_input_is_named(bad, match):
    with pytest.raises(ValueError, match=match):
        cast_to_e4m3(bad.to(runtime.DEVICE))
