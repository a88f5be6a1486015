"""Notebook 03's claims about the kernel, checked on every program: the pointer grid and the scatter the
lesson computes by hand (and the figures draw) are exactly what the running kernel loads and stores;
the published kernel's topk failure names the section that explains it; the lesson's sections exist."""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

import math

import pytest
import torch
from prose import markdown

from moe_tutorial import runtime
from moe_tutorial.figures import part3
from moe_tutorial.kernels.fused_kernel import fused_moe_kernel, fused_moe_matmul
from moe_tutorial.kernels.interpreter import trace_program
from moe_tutorial.kernels.published_kernel import FAULT_1_SECTION, published_fused_moe_matmul
from moe_tutorial.shapes import random_problem
from moe_tutorial.source import sections

interpreted = pytest.mark.skipif(not runtime.INTERPRETED, reason="traces the CPU interpreter")


def lesson_grid(topk_ids, weight, pid_m, pid_n, k_step, N, K, block_n, block_k):
    """Step 2 of the lesson: ``expert * stride_we + n_global * stride_wn + k * stride_wk``, and its mask."""
    cols = part3.program_columns(topk_ids, pid_m, pid_n, N, block_n)
    expert = torch.tensor([c.expert if c.expert is not None else 0 for c in cols])   # other=0 on padding
    n_global = torch.tensor([c.n_global for c in cols])
    ok = torch.tensor([c.valid for c in cols])
    k = k_step * block_k + torch.arange(block_k)
    stride_we, stride_wn, stride_wk = weight.stride()
    offs = (expert * stride_we + n_global * stride_wn)[None, :] + k[:, None] * stride_wk
    return offs, (k < K)[:, None] & ok[None, :], cols


# M = 3, N = 10, K = 7, E = 5, topk = 3 (padded to 4): tails in N and K, a padding slot.
PROBLEMS = [(3, 10, 7, 5, 3, 4, 4), (2, 2, 3, 4, 2, 2, 2), (2, 9, 20, 8, 6, 2, 8)]


@interpreted
@pytest.mark.parametrize("M,N,K,E,topk,block_n,block_k", PROBLEMS)
def test_every_program_loads_the_lessons_grid_and_stores_where_the_lesson_says(M, N, K, E, topk, block_n, block_k):
    x, weight, ids = random_problem(M, N, K, E, topk, seed=M + topk)
    out = torch.empty(M, topk, N)

    def launch():
        return fused_moe_matmul(x, weight, ids, block_n=block_n, block_k=block_k, out=out)

    for pid_m in range(M):
        for pid_n in range(math.ceil(N / block_n)):
            accesses = trace_program(launch, (pid_m, pid_n))
            w_loads = [a for a in accesses if a.op == "load" and a.arg == "w_ptr"]
            assert len(w_loads) == math.ceil(K / block_k)
            for k_step, load in enumerate(w_loads):
                offs, mask, cols = lesson_grid(ids, weight, pid_m, pid_n, k_step, N, K, block_n, block_k)
                assert load.offsets.tolist() == offs.tolist(), (pid_m, pid_n, k_step)
                assert load.mask.tolist() == mask.tolist(), (pid_m, pid_n, k_step)
            (ids_load,) = [a for a in accesses if a.arg == "topk_ids_ptr"]
            assert ids_load.active().tolist() == [pid_m * ids.stride(0) + c.topk_idx * ids.stride(1)
                                                  for c in cols if c.expert is not None]
            (store,) = [a for a in accesses if a.op == "store"]
            assert store.arg == "out_ptr"
            assert store.active().tolist() == [pid_m * out.stride(0) + c.topk_idx * out.stride(1)
                                               + c.n_global * out.stride(2) for c in cols if c.valid]


@interpreted
def test_a_program_outside_the_grid_is_refused_by_both():
    x, weight, ids = random_problem(2, 6, 4, 4, 2)
    with pytest.raises(ValueError, match=r"^program: expected a program of the launch"):
        trace_program(lambda: fused_moe_matmul(x, weight, ids, block_n=4, block_k=4), (0, 2))
    with pytest.raises(ValueError, match=r"^pid_n: expected 0 <= pid_n < 2"):
        part3.program_columns(ids, 0, 2, N=6, block_n=4)


@pytest.mark.parametrize("topk", [3, 6])
def test_the_published_kernels_topk_failure_points_at_the_lesson(topk):
    x, weight, ids = random_problem(2, 16, 16, 8, topk, device=runtime.DEVICE)
    with pytest.raises(ValueError) as excinfo:
        published_fused_moe_matmul(x, weight, ids, block_n=8, block_k=16)
    message = str(excinfo.value)
    assert message.startswith("topk_ids: expected topk * BLOCK_N to be a power of 2")
    assert f"got topk = {topk}, BLOCK_N = 8, FUSED_N = {8 * topk}" in message
    assert FAULT_1_SECTION in message and f"TOPK_PAD = {part3.topk_pad(topk)}" in message
    root = excinfo.value
    while root.__cause__ is not None:
        root = root.__cause__
    assert "arange" in str(root) and "power of 2" in str(root)       # Triton's own words, kept as the cause
    # The section it names is there, under that title.
    section = FAULT_1_SECTION.split("'")[1]
    assert f"## 4. {section}" in markdown("03_triton_fused_kernel")


def test_the_lesson_shows_each_step_from_a_marked_section():
    assert sections(fused_moe_kernel) == ["Step 0: the grid", "Step 1: the fused-topk encoding",
                                          "Step 2: the gather pointer grid", "Step 3: the K loop",
                                          "Step 3: the scatter"]
    assert sections(fused_moe_matmul) == ["Step 0: the grid"]
    text = markdown("03_triton_fused_kernel")
    for title in ("Step 0: the grid", "Step 1: the fused-topk encoding", "Step 2: the gather pointer grid",
                  "Step 3: the K loop, the accumulation, the scatter"):
        assert f". {title}" in text


@interpreted
def test_steps_0_to_3_follow_a_readers_own_example():
    """The reader replaces the worked example (M = 5, topk = 3, blocks of 4) and picks program (4, 1): every
    cell of Steps 0 to 3 still runs, and the hand-built grid and scatter still equal the kernel's."""
    import nbformat
    from nbclient import NotebookClient
    from prose import NOTEBOOKS

    nb = nbformat.read(NOTEBOOKS / "03_triton_fused_kernel.ipynb", as_version=4)
    ids = [c.get("id") for c in nb.cells]
    nb.cells = nb.cells[:ids.index("p3-step3-kernel") + 1]
    edits = {"p3-step0-table": [("x, weight, topk_ids = ex.x, ex.weight, ex.topk_ids",
                                 "x, weight, topk_ids = mt.random_problem(5, 6, 7, 4, 3)"),
                                ("BLOCK_N, BLOCK_K = 2, 2", "BLOCK_N, BLOCK_K = 4, 4")],
             "p3-step1-lanes": [("pid_m, pid_n = 0, 0", "pid_m, pid_n = 4, 1")]}
    for cell in nb.cells:
        for old, new in edits.get(cell.get("id"), []):
            assert old in cell.source
            cell.source = cell.source.replace(old, new)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "M = 5, K = 7, N = 6, E = 4, topk = 3; BLOCK_N = 4, BLOCK_K = 4" in text
    assert "topk = 3, TOPK_PAD = 4, FUSED_N = 16" in text
    assert text.count("equal to w_offs and w_mask, element for element: True") == 2      # cdiv(7, 4) K steps
    assert "element for element: False" not in text
    assert "the kernel's store (Step 2's trace) wrote the same offsets: True" in text
    assert "close: True" in text


def test_default_blocks_can_say_what_a_gpu_would_use():
    """Notebook 03 counts a GPU launch's programs on any machine: BLOCK_N = 256 // TOPK_PAD, within [16, 128]."""
    from moe_tutorial.kernels.fused_kernel import default_blocks

    assert default_blocks(8, 1536, 2048, interpreted=False) == (32, 32)          # Qwen3-30B-A3B: 48 programs
    assert default_blocks(2, 28672, 4096, interpreted=False) == (128, 32)        # Mixtral-8x7B
    assert default_blocks(6, 2816, 2048, interpreted=False) == (32, 32)          # topk 6 pads to 8
    assert default_blocks(8, 1536, 2048) == default_blocks(8, 1536, 2048, interpreted=runtime.INTERPRETED)
