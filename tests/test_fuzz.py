"""Property-based fuzzing of the public API (the properties live in tests/fuzz_api.py).

The PyTorch parts run here; every property that launches a Triton kernel runs in a
subprocess of its own, so that a kernel that crashes the interpreter fails one test, with the
example that did it, instead of taking pytest down. All of it takes about 40 s on a 2-core CPU.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import fuzz_api
import pytest

HERE = Path(__file__).resolve().parent
IN_PROCESS = ("route", "loop_moe_matmul", "indexing_moe_matmul")
KERNELS = ("fused_moe_matmul", "align_block_size", "sorted_moe_matmul", "moe_layer")


def test_every_public_function_is_fuzzed():
    assert set(IN_PROCESS) | set(KERNELS) == set(fuzz_api.PROPERTIES)


@pytest.mark.parametrize("name", IN_PROCESS)
def test_fuzz_in_process(name):
    fuzz_api.PROPERTIES[name]()
    runs, valid = fuzz_api.TRIED[name]
    assert runs >= fuzz_api.EXAMPLES[name] and valid >= runs // 3, (runs, valid)


@pytest.mark.parametrize("name", KERNELS)
def test_fuzz_in_a_subprocess(name):
    result = subprocess.run([sys.executable, str(HERE / "fuzz_api.py"), name], capture_output=True, text=True,
                            timeout=300)
    if result.returncode:
        lines = result.stdout.splitlines()
        last = lines[-1] if lines else "(nothing printed)"
        pytest.fail(f"{name} fuzzing failed (exit code {result.returncode}); the last example run was:\n  {last}\n"
                    f"{result.stderr[-4000:]}", pytrace=False)
    assert f"{name}: passed" in result.stdout
