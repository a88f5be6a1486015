"""moe_tutorial.edited_kernel: the three suggested edits of notebook 03's kernel end in one-line messages."""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

import importlib.util

import pytest

from moe_tutorial import edited_kernel, runtime
from moe_tutorial.kernels.fused_kernel import fused_moe_kernel
from moe_tutorial.shapes import random_problem
from moe_tutorial.source import source_of

interpreted = pytest.mark.skipif(not runtime.INTERPRETED, reason="the memory guard needs Triton's interpreter")

EDITS = {
    "no padding mask": ("col_ok = (topk_idx < TOPK) & (n_global < N)", "col_ok = n_global < N"),
    "int32 offsets": ("mask=topk_idx < TOPK, other=0).to(tl.int64)", "mask=topk_idx < TOPK, other=0)"),
    "swapped ids": ("pid_m = tl.program_id(axis=0).to(tl.int64)\n    pid_n = tl.program_id(axis=1)",
                    "pid_m = tl.program_id(axis=1).to(tl.int64)\n    pid_n = tl.program_id(axis=0)"),
}


def edited(tmp_path, name):
    old, new = EDITS[name]
    source = source_of(fused_moe_kernel)
    assert old in source, f"the edit {name!r} no longer applies to the kernel: update notebook 03's suggestions"
    path = tmp_path / f"edited_{abs(hash(name))}.py"
    path.write_text("import triton\nimport triton.language as tl\n\n\n" + source.replace(old, new))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.fused_moe_kernel


def problem():
    return random_problem(2, 16, 8, 4, 3, device=runtime.DEVICE)   # grid (2, 4): not square


@interpreted
def test_unedited_kernel_agrees_and_is_int64(capsys):
    edited_kernel.run_edited(fused_moe_kernel, *problem(), block_n=4, block_k=4)
    assert edited_kernel.wrap_probe(fused_moe_kernel) == 147 * edited_kernel.DEEPSEEK_V3_EXPERT_STRIDE
    assert "equals the float64 reference" in capsys.readouterr().out


@interpreted
def test_dropping_the_padding_mask_stores_past_out(tmp_path):
    with pytest.raises(edited_kernel.KernelError) as excinfo:
        edited_kernel.run_edited(edited(tmp_path, "no padding mask"), *problem(), block_n=4, block_k=4)
    message = str(excinfo.value)
    assert "tried to store to element" in message and "`out_ptr`" in message
    assert excinfo.value.__cause__ is None and excinfo.value.__suppress_context__     # no interpreter frames


@interpreted
def test_int32_offsets_wrap_at_deepseek_v3s_stride(tmp_path, capsys):
    true = 147 * edited_kernel.DEEPSEEK_V3_EXPERT_STRIDE
    assert edited_kernel.wrap_probe(edited(tmp_path, "int32 offsets")) == true - 2 ** 32
    assert "int32 arithmetic" in capsys.readouterr().out


@interpreted
def test_swapped_program_ids_read_tokens_that_do_not_exist(tmp_path):
    with pytest.raises(edited_kernel.KernelError, match="tried to load from element .* of `topk_ids_ptr`"):
        edited_kernel.run_edited(edited(tmp_path, "swapped ids"), *problem(), block_n=4, block_k=4)


@interpreted
def test_a_kernel_that_does_not_compile_says_so_in_one_line(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("import triton\nimport triton.language as tl\n\n\n"
                    + source_of(fused_moe_kernel).replace("offs = tl.arange(0, FUSED_N)", "offs = tl.arange(0, N)"))
    spec = importlib.util.spec_from_file_location("broken", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with pytest.raises(edited_kernel.KernelError) as excinfo:
        edited_kernel.run_edited(module.fused_moe_kernel, *problem(), block_n=4, block_k=4)
    assert str(excinfo.value).startswith("your kernel failed: ") and "\n" not in str(excinfo.value)
