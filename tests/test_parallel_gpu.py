"""Part 6 on two GPUs with NCCL: the expert- and tensor-parallel layers against one GPU, in bf16.

Marked ``gpu2`` and skipped unless two CUDA GPUs are present: ``pytest -m gpu2 tests/test_parallel_gpu.py``.
The ranks run without NVLink multicast or symmetric memory (``bench.env_for_ranks``).
"""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before anything imports triton)

import time

import pytest
import torch

from moe_tutorial.parallel import bench, launch
from moe_tutorial.shapes import ModelShape

pytestmark = [
    pytest.mark.gpu2,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"),
]

#: Mixtral's routing (8 experts, top-2) at a size that compiles and runs in seconds.
SMALL_MIXTRAL = ModelShape("small Mixtral-like", 8, 2, 1024, 2048)
#: DeepSeek-V3's routing (256 experts, top-8) on narrow experts.
SMALL_DEEPSEEK = ModelShape("small DeepSeek-V3-like", 256, 8, 512, 256)


def test_two_gpus_match_one_gpu_in_bf16():
    rows = launch(bench.check_rank, 2, [SMALL_MIXTRAL, SMALL_DEEPSEEK], None, time.time() + 240,
                  backend="nccl", timeout_s=300, collective_timeout_s=60, env=bench.env_for_ranks())[0]
    cases = {(r["model"], r["case"], r["step"]) for r in rows}
    assert len(cases) == 2 * (2 * len(bench.CHECK_CASES) + 1), sorted(cases)
    bad = [r for r in rows if r["status"] != "ok"]
    assert not bad, bad
