"""Fixtures shared by the package tests. Kept small: a test module's own helpers live in it."""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before anything imports triton)

import matplotlib
import pytest
import torch

matplotlib.use("Agg")   # figures render off-screen, the same on every machine

from moe_tutorial import runtime
from moe_tutorial.examples import worked_example

import matplotlib.pyplot as plt  # noqa: E402


@pytest.fixture
def device() -> torch.device:
    """Where this runtime's tensors live: the GPU when there is one, else the CPU."""
    return runtime.DEVICE


@pytest.fixture
def worked(device):
    """The series' worked example (M=2, K=3, N=2, E=4, topk=2) in fp32 on ``device``."""
    return worked_example(torch.float32, device)


@pytest.fixture(autouse=True)
def close_figures():
    """Every test starts with no open figures (matplotlib keeps them all otherwise)."""
    yield
    plt.close("all")


@pytest.fixture(autouse=True)
def model_shapes_restored():
    """Every test leaves the model shapes as it found them: a measurement script's dry run registers its
    toy shape among them, and tests that read every model (``parallel.memory_table``) must not see it."""
    from moe_tutorial.shapes import MODEL_SHAPES
    before = dict(MODEL_SHAPES)
    yield
    MODEL_SHAPES.clear()
    MODEL_SHAPES.update(before)
