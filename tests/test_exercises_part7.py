"""Part 7's exercises: the solutions pass, the stubs are not attempted, and each plausible wrong
answer (a mutant of the solution) fails with a message that names its fault."""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime)

import pytest

pytest.importorskip("nbformat", reason="the exercise notebooks are read with nbformat")

from moe_tutorial.exercises import check_quantize_block, check_scaled_matmul  # noqa: E402
from moe_tutorial.exercises.feedback import last_verdict  # noqa: E402

from exercise_mutants import load, notebook_code  # noqa: E402

CHECKERS = {"7.1": (check_quantize_block, "quantize_block"), "7.2": (check_scaled_matmul, "scaled_matmul")}
SOLUTIONS = notebook_code("part7_solutions.ipynb", "solution")

MUTANTS = [
    ("7.1", "scale = amax", (("scale = (amax / 448.0).float()", "scale = amax.float()"),), "should be amax / 448"),
    ("7.1", "signed max", (("amax = block.abs().max()", "amax = block.max()"),), "largest magnitude"),
    ("7.1", "multiplies by the scale", (("(block / scale)", "(block * scale)"),), "divide by the scale"),
    ("7.1", "no floor for zero blocks", ((".clamp_min(1e-12)", ""),), "finite, positive"),
    ("7.1", "stays float32", ((".to(torch.float8_e4m3fn)", ""),), "float8_e4m3fn"),
    ("7.2", "no scales", (("(a @ w.T) * a_scale[:, g, None] * w_scale[col_scale_row, g][None, :]", "(a @ w.T)"),),
     "never applied"),
    ("7.2", "no weight scales", ((" * w_scale[col_scale_row, g][None, :]", ""),), "weight-block scales are missing"),
    ("7.2", "one scale column for all groups", (("a_scale[:, g, None]", "a_scale[:, 0, None]"),), "which scale column"),
    ("7.2", "every column takes the first weight-block row",
     (("torch.arange(N) // 128", "torch.zeros(N, dtype=torch.long)"),), "which weight-block row"),
    ("7.2", "bf16 accumulator", (("dtype=torch.float32)", "dtype=torch.bfloat16)"),), "float32 sums"),
]


@pytest.mark.parametrize("ex_id", CHECKERS)
def test_solutions_pass_and_stubs_are_not_attempted(ex_id, capsys):
    check, name = CHECKERS[ex_id]
    assert check(getattr(load(SOLUTIONS, label="solutions7"), name)) is True
    stubs = load(notebook_code("part7_exercises.ipynb", "stub"), label="stubs7")
    assert check(getattr(stubs, name)) is False
    assert last_verdict(ex_id)[0] == "NOT ATTEMPTED"


@pytest.mark.parametrize("ex_id, name, edits, phrase", MUTANTS, ids=[f"{m[0]} {m[1]}" for m in MUTANTS])
def test_mutants_fail_and_say_why(ex_id, name, edits, phrase):
    check, fn = CHECKERS[ex_id]
    mutant = getattr(load(SOLUTIONS, edits, label=f"{ex_id} {name}"), fn)
    assert check(mutant) is False
    verdict, text = last_verdict(ex_id)
    assert verdict == "FAIL"
    if phrase:
        assert phrase in text, text
