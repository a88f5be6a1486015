"""Classroom exercises: one ``check_...(student_function)`` per exercise, with precise feedback.

Each checker runs the student's function on copies of random and edge-case inputs, compares with
the package's float64 references, prints one verdict line (``[1.3] PASS ...``, ``FAIL`` with what
is wrong, or ``NOT ATTEMPTED`` while the function is still a stub) and returns True or False.
It never raises, so an exercise notebook full of stubs still runs top to bottom. The grader
(``python -m moe_tutorial.exercises.grade``) runs the same checkers on a class's notebooks, in
its own process, with each notebook's functions in a child process; ``python -m
moe_tutorial.exercises.release`` writes the class's copy of the series without the solutions.
"""
from .catalog import EXERCISES, Exercise, for_part
from .part1 import check_expert_pairs, check_loop_layer, check_loop_matmul, check_route
from .part2 import (
    check_indexing_layer,
    check_indexing_matmul,
    check_intermediate_bytes,
    check_select_weights,
)
from .part3 import (
    check_fused_any_topk,
    check_fused_columns,
    check_fused_int64,
    check_fused_matmul,
)
from .part4 import (
    check_align,
    check_grouped_pid,
    check_router_epilogue,
    check_sorted_matmul,
)
from .part7 import check_quantize_block, check_scaled_matmul
from .part8 import check_dw2_tile, check_router_grad

__all__ = [
    "EXERCISES", "Exercise", "for_part",
    "check_route", "check_expert_pairs", "check_loop_matmul", "check_loop_layer",
    "check_select_weights", "check_indexing_matmul", "check_intermediate_bytes", "check_indexing_layer",
    "check_fused_columns", "check_fused_matmul", "check_fused_any_topk", "check_fused_int64",
    "check_align", "check_grouped_pid", "check_sorted_matmul", "check_router_epilogue",
    "check_quantize_block", "check_scaled_matmul",
    "check_router_grad", "check_dw2_tile",
]
