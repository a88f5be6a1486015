"""Part 6 on GPUs with NCCL: the layers against one GPU in bf16, and the expert-parallel layer
captured in a CUDA graph and replayed with new routings.

Marked ``gpu`` (one GPU: a one-rank NCCL group) or ``gpu2`` (two GPUs), each skipped without
them: ``pytest -m gpu tests/test_parallel_gpu.py``, ``pytest -m gpu2 tests/test_parallel_gpu.py``.
The ranks run without NVLink multicast or symmetric memory (``bench.env_for_ranks``).
"""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before anything imports triton)

import time

import pytest
import torch

from moe_tutorial.parallel import bench, graphs, launch
from moe_tutorial.shapes import ModelShape

needs_one = pytest.mark.skipif(torch.cuda.device_count() < 1, reason="needs a CUDA GPU")
needs_two = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")

#: Mixtral's routing (8 experts, top-2) at a size that compiles and runs in seconds.
SMALL_MIXTRAL = ModelShape("small Mixtral-like", 8, 2, 1024, 2048)
#: DeepSeek-V3's routing (256 experts, top-8) on narrow experts.
SMALL_DEEPSEEK = ModelShape("small DeepSeek-V3-like", 256, 8, 512, 256)


def _replay(world: int, tokens: list[int]) -> list[dict]:
    outs = launch(graphs.graph_replay_shapes_rank, world, [SMALL_MIXTRAL, SMALL_DEEPSEEK], tokens, "bfloat16",
                  backend="nccl", timeout_s=300, collective_timeout_s=60, env=bench.env_for_ranks())
    return [r for by_rank in outs for r in by_rank]


def _check_replays(rows: list[dict], world: int, tokens: list[int]) -> None:
    assert len(rows) == 2 * world * len(graphs.ROUTINGS), rows
    assert all(r["graphed"] for r in rows), "the layer was not captured in a CUDA graph"
    assert {(r["rank"], r["M"]) for r in rows} == set(enumerate(tokens))
    bad = [r for r in rows if not r["ok"]]
    assert not bad, bad


@pytest.mark.gpu
@needs_one
def test_one_rank_nccl_group_captures_and_replays_the_layer():
    """One GPU, a one-rank NCCL group: the collectives are local copies, but they are NCCL's,
    inside the graph; five routings replayed through one capture match Part 4's layer."""
    rows = _replay(1, [37])
    _check_replays(rows, 1, [37])


@pytest.mark.gpu2
@needs_two
def test_two_gpus_capture_and_replay_the_layer():
    """Two GPUs, uneven M (37 and 20 tokens, capacity 37): the same replays across NCCL."""
    rows = _replay(2, [37, 20])
    _check_replays(rows, 2, [37, 20])


@pytest.mark.gpu2
@needs_two
def test_two_gpus_match_one_gpu_in_bf16():
    rows = launch(bench.check_rank, 2, [SMALL_MIXTRAL, SMALL_DEEPSEEK], None, time.time() + 240,
                  backend="nccl", timeout_s=300, collective_timeout_s=60, env=bench.env_for_ranks())[0]
    cases = {(r["model"], r["case"], r["step"]) for r in rows}
    assert len(cases) == 2 * (2 * len(bench.CHECK_CASES) + 1), sorted(cases)
    bad = [r for r in rows if r["status"] != "ok"]
    assert not bad, bad
