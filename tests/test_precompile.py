"""Part 8's first call: a training step's kernels compiled side by side before it runs.

On the CPU: the dry pass turns this thread's launches into warmups, leaves other threads' alone
and undoes itself after an error. With ``-m gpu``: in a fresh process with an empty Triton cache,
the dry pass compiles the step's kernels and the real step then compiles none, with the same
bits as a step whose kernels compiled at their launches.
"""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

import json
import os
import subprocess
import sys
import threading

import pytest
import torch
from triton.runtime import KernelInterface

from moe_tutorial import runtime
from moe_tutorial.kernels.precompile import dry_launches, precompile
from moe_tutorial.kernels.trainable_layer import precompile_step, step_by_hand, trainable_moe_layer
from moe_tutorial.kernels.training_configs import training_configs
from moe_tutorial.shapes import random_layer_problem


class Recorder(KernelInterface):
    """A kernel that records how it was run instead of running."""

    def __init__(self):
        self.calls = []

    def run(self, *args, grid, warmup, **kwargs):
        self.calls.append((args, grid, warmup, kwargs))
        return f"compiled {args}"


def test_dry_launches_compile_instead_of_launching():
    k = Recorder()
    k[(3,)](1, BLOCK=2)
    with dry_launches() as requests:
        k[(4, 5)](6, BLOCK=7)
    k[(8,)](9)
    assert [(grid, warmup) for _, grid, warmup, _ in k.calls] == [((3,), False), ((4, 5), True), ((8,), False)]
    assert k.calls[1][0] == (6,) and k.calls[1][3] == {"BLOCK": 7}
    assert requests == ["compiled (6,)"]


def test_other_threads_launch_as_usual():
    k = Recorder()
    with dry_launches() as requests:
        other = threading.Thread(target=lambda: k[(1,)](0))
        other.start()
        other.join()
        k[(2,)](0)
    assert [warmup for _, _, warmup, _ in k.calls] == [False, True]
    assert len(requests) == 1


def test_restored_after_an_error():
    original = KernelInterface.__getitem__
    with pytest.raises(ValueError, match="in the step"):
        with dry_launches():
            raise ValueError("in the step")
    assert KernelInterface.__getitem__ is original
    k = Recorder()
    k[(1,)](0)
    assert k.calls[0][2] is False


def test_nothing_runs_off_a_gpu():
    ran = []
    assert precompile(lambda: ran.append(1), torch.device("cpu")) == 0
    assert ran == []


@pytest.mark.parametrize("needs", [(True, True, True, True), (False, True, False, True)])
def test_the_step_by_hand_is_autograds(needs):
    """The dry pass runs the Function's forward and backward by hand: what they compute so is
    what autograd gets from them (and None where no gradient is asked for)."""
    M, K, inter, E, topk = 37, 24, 40, 4, 2
    p = random_layer_problem(M, K, inter, E, topk, dtype=runtime.DEFAULT_DTYPE, device=runtime.DEVICE, seed=3)
    names = ("x", "w13", "w2", "topk_weights")
    leaves = {k: p[k].detach().requires_grad_(need) for k, need in zip(names, needs)}
    out = trainable_moe_layer(**leaves, topk_ids=p["topk_ids"])
    out.backward(p["d_out"])
    cfg = training_configs(M, E, K, inter, topk, runtime.DEFAULT_DTYPE)
    out2, grads = step_by_hand(*(p[k] for k in names), p["topk_ids"], cfg, p["d_out"], needs)
    assert torch.equal(out.detach(), out2)
    for k, need, g in zip(names, needs, grads):
        assert (g is None) == (not need), k
        if need:
            assert torch.equal(leaves[k].grad, g), k
    if not runtime.ON_GPU:
        assert precompile_step(*leaves.values(), p["topk_ids"], cfg) == 0      # the interpreter compiles nothing


# A fresh process with an empty Triton cache: one training step of a small Qwen3-like layer,
# counting Triton's compiles in the dry pass and in the step itself.
FIRST_STEP = r"""
import json, os, sys, tempfile
os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="precompile_test_")
import moe_tutorial
import torch
from triton import knobs
from moe_tutorial.kernels.trainable_layer import precompile_step, trainable_moe_layer, weights_fit
from moe_tutorial.kernels.training_configs import training_configs
from moe_tutorial.shapes import random_layer_problem
side_by_side = sys.argv[1] == "1"
p = random_layer_problem(300, 512, 384, 8, 2, dtype=torch.bfloat16, device="cuda", seed=5)
leaves = {k: (p[k].detach().requires_grad_() if k != "topk_ids" else p[k])
          for k in ("x", "w13", "w2", "topk_weights", "topk_ids")}
compiled = []
knobs.runtime.jit_post_compile_hook = lambda *a, **k: compiled.append(1)
launches = 0
if side_by_side:
    cfg = weights_fit(training_configs(300, 8, 512, 384, 2, torch.bfloat16), p["w13"], p["w2"], 300, 2)
    launches = precompile_step(*leaves.values(), cfg)
in_dry_pass = len(compiled)
out = trainable_moe_layer(**leaves, precompile=side_by_side)
out.backward(p["d_out"])
torch.cuda.synchronize()
grads = [out] + [leaves[k].grad for k in ("x", "w13", "w2", "topk_weights")]
torch.save([g.cpu() for g in grads], sys.argv[2])
print(json.dumps({"launches": launches, "in_dry_pass": in_dry_pass, "in_step": len(compiled) - in_dry_pass}))
"""


def first_step(side_by_side: bool, tmp_path) -> tuple[dict, list]:
    out = tmp_path / f"grads_{int(side_by_side)}.pt"
    done = subprocess.run([sys.executable, "-c", FIRST_STEP, str(int(side_by_side)), str(out)],
                          capture_output=True, text=True, timeout=300, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), torch.load(out)


@pytest.mark.gpu
@pytest.mark.skipif(not runtime.ON_GPU, reason="compiles for a GPU")
def test_the_step_compiles_nothing_after_the_dry_pass(tmp_path):
    counts, grads = first_step(True, tmp_path)
    serial, serial_grads = first_step(False, tmp_path)
    assert counts["launches"] >= 8, counts          # the forward's and the backward's kernels
    assert counts["in_dry_pass"] >= 6, counts       # distinct kernels, compiled in the pool
    assert counts["in_step"] == 0, counts
    assert serial["in_step"] == counts["in_dry_pass"], (serial, counts)
    for a, b in zip(grads, serial_grads):
        assert torch.equal(a, b)
