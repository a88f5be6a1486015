"""Known-wrong implementations ("mutants") of every exercise, and what the checker must say.

A mutant is a right implementation with one small edit: the solution notebooks' code (cells
tagged "solution") with an exact text replacement. Each replacement must
match exactly once, so a mutant that stops applying fails loudly instead of testing nothing.
"""
from __future__ import annotations

import importlib.util
import itertools
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import moe_tutorial
from moe_tutorial.exercises import EXERCISES

import nbformat

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks" / "exercises"
_DIR = Path(tempfile.mkdtemp(prefix="moe_exercise_mutants_"))
_count = itertools.count()


def notebook_code(name: str, tag: str) -> str:
    """The setup cell and every code cell tagged ``tag`` of ``notebooks/exercises/<name>``, as a module."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    setup = "\n".join(line for line in code[0].source.splitlines() if not line.startswith(("%", "#")))
    tagged = [c.source for c in code if tag in c.metadata.get("tags", [])]
    return "\n\n\n".join([setup, *tagged]) + "\n"


def load(source: str, replacements=(), label: str = "mutant") -> ModuleType:
    """Apply ``(old, new)`` replacements (each must match once) and import the result from a file.

    A file, not ``exec``: ``@triton.jit`` reads its function's source with ``inspect``.
    """
    for old, new in replacements:
        found = source.count(old)
        if found != 1:
            raise AssertionError(f"{label}: {old!r} occurs {found} times, expected exactly once")
        source = source.replace(old, new)
    stem = "".join(c if c.isalnum() else "_" for c in label)
    path = _DIR / f"m{next(_count)}_{stem}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def solutions(part: int) -> ModuleType:
    return load(notebook_code(f"part{part}_solutions.ipynb", "solution"), label=f"solutions{part}")


def stubs(part: int) -> ModuleType:
    return load(notebook_code(f"part{part}_exercises.ipynb", "stub"), label=f"stubs{part}")


@dataclass(frozen=True)
class Mutant:
    """The solution of exercise ``ex_id`` with ``edits``; its checker must fail and say ``phrase``.

    ``function`` names another function of the solutions to hand in (default: the exercise's).
    """

    ex_id: str
    name: str
    edits: tuple
    phrase: str
    function: str = ""

    def build(self):
        source = notebook_code(f"part{self.ex_id[0]}_solutions.ipynb", "solution")
        module = load(source, self.edits, label=f"{self.ex_id} {self.name}")
        return getattr(module, self.function or EXERCISES[self.ex_id].function)


MUTANTS = [
    # --- 1.1 route
    Mutant("1.1", "no renormalisation", (("    if renormalize:\n", "    if False:\n"),), "raw softmax probabilities"),
    Mutant("1.1", "softmax over tokens", (("router_logits.float(), dim=-1)", "router_logits.float(), dim=0)"),), "dim=0"),
    Mutant("1.1", "int64 ids", (("topk_ids.to(torch.int32)", "topk_ids"),), "expected dtype torch.int32"),
    Mutant("1.1", "bf16 softmax", (("torch.softmax(router_logits.float(),", "torch.softmax(router_logits,"),),
           "do the softmax in float32"),
    # --- 1.2 expert_pairs
    Mutant("1.2", "(slot, idx)", (("    return idx, slot\n", "    return slot, idx\n"),),
           "you returned (slot, idx)"),
    Mutant("1.2", "first slot only", (("torch.where(topk_ids == e)", "torch.where(topk_ids[:, :1] == e)"),),
           "was chosen by"),
    # --- 1.3 the loop
    Mutant("1.3", "wrong expert index", (("idx, slot = expert_pairs(topk_ids, e)\n        out[",
                                          "idx, slot = expert_pairs(topk_ids.flip(1), e)\n        out["),), "should use expert"),
    Mutant("1.3", "swapped axes", (("out = x.new_empty(M, topk, N)", "out = x.new_empty(M, N, topk)"),
                                   ("out[idx, slot] = x[idx]", "out[idx, :, slot] = x[idx]")), "wrong order"),
    Mutant("1.3", "missing transpose", (("x[idx] @ weight[e].T", "x[idx] @ weight[e]"),), "(.T)"),
    Mutant("1.3", "last expert skipped", (("counts.nonzero().flatten().tolist():", "counts.nonzero().flatten().tolist()[:-1]:"),),
           "never written"),
    # --- 1.4 the layer
    Mutant("1.4", "no router weights", ((" * topk_weights[idx, slot, None].float()", ""),), "without router weights"),
    Mutant("1.4", "silu on up", (("F.silu(h[:, :inter]) * h[:, inter:]", "F.silu(h[:, inter:]) * h[:, :inter]"),), "wrong half"),
    Mutant("1.4", "no silu", (("F.silu(h[:, :inter]) * h[:, inter:]", "h[:, :inter] * h[:, inter:]"),), "silu is missing"),
    Mutant("1.4", "sum starts from empty", (("y = torch.zeros(M, K,", "y = torch.empty(M, K,"),), "never written"),
    # --- 2.1 select_weights
    Mutant("2.1", "ids transposed", (("return weight[topk_ids.long()]", "return weight[topk_ids.long().t()]"),), "wrong order"),
    Mutant("2.1", "first slot only", (("return weight[topk_ids.long()]", "return weight[topk_ids.long()[:, 0]]"),), "wrong shape"),
    # --- 2.2 the vectorised matmul
    Mutant("2.2", "every token uses x[0]", (("x[:, None, :, None]", "x[:1, None, :, None]"),), "applied to token 0's row of x"),
    Mutant("2.2", "wrong expert", (("selected = select_weights(weight, topk_ids)", "selected = select_weights(weight, topk_ids.flip(1))"),),
           "should use expert"),
    Mutant("2.2", "no squeeze", ((").squeeze(-1)  #", ")  #"),), "extra axis of size 1"),
    # --- 2.3 intermediate_bytes
    Mutant("2.3", "forgot topk", (("return M * topk * N * K * itemsize", "return M * N * K * itemsize"),),
           "each token has topk experts"),
    Mutant("2.3", "elements, not bytes", (("return M * topk * N * K * itemsize", "return M * topk * N * K"),),
           "counts elements"),
    Mutant("2.3", "int32 overflow", (("return M * topk * N * K * itemsize",
                                      "return int(torch.tensor(M, dtype=torch.int32) * topk * N * K * itemsize)"),),
           "wrapped around"),
    # --- 2.4 the layer from one function
    Mutant("2.4", "no router weights", ((" * topk_weights[..., None].float()", ""),), "without router weights"),
    Mutant("2.4", "slot 0 only", (("return weighted.sum(dim=1).to(x.dtype)", "return weighted[:, 0].to(x.dtype)"),), "only slot 0"),
    Mutant("2.4", "mean over slots", (("return weighted.sum(dim=1).to(x.dtype)", "return weighted.mean(dim=1).to(x.dtype)"),),
           "weighted mean"),
    # --- 3.1 the fused tile's layout
    Mutant("3.1", "// and % swapped", (("topk_idx = lane // BLOCK_N                  # 0 0",
                                        "topk_idx = lane % BLOCK_N                  # 0 0"),
                                       ("n = pid_n * BLOCK_N + lane % BLOCK_N        # the same",
                                        "n = pid_n * BLOCK_N + lane // BLOCK_N        # the same")), "swapped"),
    Mutant("3.1", "no pid_n offset", (("n = pid_n * BLOCK_N + lane % BLOCK_N        # the same",
                                       "n = lane % BLOCK_N        # the same"),), "ignore pid_n"),
    Mutant("3.1", "mask off by one", (("ok = n < N                                  # the last",
                                       "ok = n < N - 1                              # the last"),), "off-by-one"),
    Mutant("3.1", "no mask", (("ok = n < N                                  # the last",
                              "ok = n >= 0                                 # the last"),), "must be masked off"),
    # --- 3.2 the gather
    Mutant("3.2", "store without mask", (("topk_idx * stride_ot + n * stride_on, acc, mask=n_ok)",
                                          "topk_idx * stride_ot + n * stride_on, acc)"),), "out-of-range pointer"),
    Mutant("3.2", "every slot uses slot 0's expert", (("topk_idx * stride_ik)       # [FUSED_N]", "0 * stride_ik)       # [FUSED_N]"),),
           "slot 0's expert"),
    Mutant("3.2", "swapped output axes", (("topk_idx * stride_ot + n * stride_on, acc, mask=n_ok)",
                                          "topk_idx * stride_on + n * stride_ot, acc, mask=n_ok)"),), "wrong order"),
    Mutant("3.2", "N mask off by one", (("    n_ok = n < N\n    expert = tl.load(ids_ptr + pid_m * stride_im + topk_idx * stride_ik)  ",
                                         "    n_ok = n < N - 1\n    expert = tl.load(ids_ptr + pid_m * stride_im + topk_idx * stride_ik)  "),),
           "never written"),
    Mutant("3.2", "K mask off by one", (("k_ok = k < K\n        x = tl.load(x_ptr + pid_m * stride_xm + k * stride_xk, mask=k_ok, other=0.0)   #",
                                         "k_ok = k < K - 1\n        x = tl.load(x_ptr + pid_m * stride_xm + k * stride_xk, mask=k_ok, other=0.0)   #"),),
           "stop at k"),
    Mutant("3.2", "x row ignored", (("x_ptr + pid_m * stride_xm + k * stride_xk, mask=k_ok, other=0.0)   #",
                                     "x_ptr + k * stride_xk, mask=k_ok, other=0.0)   #"),), "applied to token 0's row of x"),
    Mutant("3.2", "assumes a contiguous weight", (("w_cols = w_ptr + expert * stride_we + n * stride_wn                          #",
                                                   "w_cols = w_ptr + expert * N * K + n * K                          #"),),
           "non-contiguous"),
    Mutant("3.2", "grid too small", (("grid = (M, triton.cdiv(N, BLOCK_N))\n    fused_kernel[grid]",
                                      "grid = (M, N // BLOCK_N)\n    fused_kernel[grid]"),), "never written"),
    # --- 3.3 any topk
    Mutant("3.3", "TOPK_PAD = topk", (("TOPK_PAD=triton.next_power_of_2(topk)", "TOPK_PAD=topk"),), "power of two"),
    Mutant("3.3", "spare slots stored", (("n * stride_on, acc, mask=col_ok)", "n * stride_on, acc, mask=n < N)"),),
           "out-of-range pointer"),
    Mutant("3.3", "spare slots read ids", (("topk_idx * stride_ik, mask=slot_ok, other=0)", "topk_idx * stride_ik)"),),
           "ids_ptr"),
    Mutant("3.3", "the 3.2 kernel", (), "power of two", function="fused_moe_matmul"),
    # --- 3.4 int64
    Mutant("3.4", "the 3.3 kernel (int32 offsets)", (), "wrapped around", function="fused_moe_matmul_any_topk"),
    # --- 4.1 align_block_size
    Mutant("4.1", "pads exact multiples", (("padded = (counts + block_m - 1) // block_m * block_m",
                                            "padded = (counts // block_m + 1) * block_m"),), "already a multiple"),
    Mutant("4.1", "pads with 0", (("torch.full((num_post,), num_pairs,", "torch.full((num_post,), 0,"),), "sentinel"),
    Mutant("4.1", "pads with -1", (("torch.full((num_post,), num_pairs,", "torch.full((num_post,), -1,"),), "neither a pair"),
    Mutant("4.1", "one label per row", (("num_experts, device=flat.device), padded // block_m)",
                                         "num_experts, device=flat.device), padded)"),), "labelled expert"),
    Mutant("4.1", "post without padding", (("torch.tensor([num_post], dtype=torch.int32",
                                            "torch.tensor([num_pairs], dtype=torch.int32"),), "num_tokens_post_padded"),
    # --- 4.2 grouped_pid
    Mutant("4.2", "no min for the last group", (("group_rows = min(num_pid_m - first_m, group_m)", "group_rows = group_m"),),
           "last group"),
    Mutant("4.2", "row-major", (("pid_m = first_m + (pid % pids_per_group) % group_rows", "pid_m = pid // num_pid_n"),
                                ("pid_n = (pid % pids_per_group) // group_rows", "pid_n = pid % num_pid_n")), "row-major"),
    # --- 4.3 the sorted kernel
    Mutant("4.3", "A load without the row mask", (("mask=row_ok[:, None] & (k[None, :] < K), other=0.0)",
                                                   "mask=k[None, :] < K, other=0.0)"),), "sentinel"),
    Mutant("4.3", "store without the row mask", (("mask=row_ok[:, None] & (n[None, :] < N))", "mask=n[None, :] < N)"),),
           "store to"),
    Mutant("4.3", "no early exit", (("    if pid_m * BLOCK_M >= tl.load(num_post_ptr):\n        return\n", ""),),
           "out-of-range pointer"),
    Mutant("4.3", "wrong expert", (("expert = tl.load(expert_ids_ptr + pid_m)", "expert = tl.load(expert_ids_ptr + pid_n)"),),
           "should use expert"),
    # --- 4.4 the epilogue
    Mutant("4.4", "no router weights", (("acc = acc * w[:, None]", "acc = acc"),), "without the router weights"),
    Mutant("4.4", "weights by token", (("router_ptr + pair, mask=row_ok", "router_ptr + pair // TOPK, mask=row_ok"),),
           "not the token"),
    Mutant("4.4", "weights twice", (("acc = acc * w[:, None]", "acc = acc * w[:, None] * w[:, None]"),), "twice"),
]

#: The package's implementation of each exercise, where it has one with the same signature.
PACKAGE_ANSWERS = {
    "1.1": moe_tutorial.route,
    "1.3": moe_tutorial.loop_moe_matmul,
    "1.4": moe_tutorial.loop_moe_layer,
    "2.2": moe_tutorial.expert_moe_matmul,
    "2.3": moe_tutorial.intermediate_bytes,
    "3.2": moe_tutorial.fused_moe_matmul,
    "3.3": moe_tutorial.fused_moe_matmul,
    "3.4": moe_tutorial.fused_moe_matmul,
    "4.1": moe_tutorial.align_block_size,
    "4.3": moe_tutorial.sorted_moe_matmul,
    "4.4": moe_tutorial.sorted_moe_matmul,
}
