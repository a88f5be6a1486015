"""Part 7's build-up steps are steps of the ``tl`` kernel at every M: on Hopper the plain heuristic
takes the Gluon kernel for large experts, and a step timed there would be Gluon's time."""
from moe_tutorial.kernels import configs
from moe_tutorial.perf.impls import FP8_STEPS, step_config
from moe_tutorial.shapes import get_shape

import pytest


@pytest.mark.parametrize("M", [1, 64, 4096, 16384])
def test_every_step_runs_the_tl_kernel_even_where_the_heuristic_takes_gluon(monkeypatch, M):
    monkeypatch.setattr(configs, "gluon_fp8_available", lambda: True)          # as on an H200
    s = get_shape("DeepSeek-V3")
    shipped = configs.fp8_heuristic_config(M, s.topk, s.num_experts, "plain", N=2 * s.intermediate)
    assert shipped.gluon == (M * s.topk // s.num_experts >= configs.GLUON_MIN_ROWS["plain"])
    steps = {step: step_config(step, M, s.topk, s.num_experts, 2 * s.intermediate) for step in FP8_STEPS}
    assert not any(c.gluon for c in steps.values())
    assert not steps["fp8-step0"].swap_ab and not steps["fp8-step0"].use_tma and not steps["fp8+swap"].use_tma
    assert steps["fp8+tma"].use_tma and steps["fp8+tma"].swap_ab == steps["fp8+swap"].swap_ab
