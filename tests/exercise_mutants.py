"""Known-wrong implementations ("mutants") of every exercise, what the checker must say, and
correct implementations written differently ("alternatives") that every checker must accept.

A mutant is a right implementation with one small edit: the solution notebooks' code (cells
tagged "solution") with exact text replacements, or with a function added (``extra``). Each
replacement must match exactly as often as it says (once unless told), so a mutant that stops
applying fails loudly instead of testing nothing. An alternative is built the same way.
"""
from __future__ import annotations

import importlib.util
import itertools
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import moe_tutorial
from moe_tutorial.exercises import EXERCISES

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks" / "exercises"
_DIR = Path(tempfile.mkdtemp(prefix="moe_exercise_mutants_"))
_count = itertools.count()


def notebook_code(name: str, tag: str) -> str:
    """The setup cell and every code cell tagged ``tag`` of ``notebooks/exercises/<name>``, as a module."""
    # Read as plain JSON, not with nbformat: the GPU tests (`pytest -m gpu`) use the mutants on
    # machines where only the package's own dependencies are installed.
    cells = json.loads((NOTEBOOKS / name).read_text())["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    source = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"] for c in code]
    setup = "\n".join(line for line in source[0].splitlines() if not line.startswith(("%", "#")))
    tagged = [s for c, s in zip(code, source) if tag in c.get("metadata", {}).get("tags", [])]
    return "\n\n\n".join([setup, *tagged]) + "\n"


def load(source: str, replacements=(), label: str = "mutant", extra: str = "") -> ModuleType:
    """Apply ``(old, new)`` or ``(old, new, count)`` replacements (each must match ``count`` times,
    once by default), append ``extra``, and import the result from a file.

    A file, not ``exec``: ``@triton.jit`` reads its function's source with ``inspect``.
    """
    for old, new, *count in replacements:
        want = count[0] if count else 1
        found = source.count(old)
        if found != want:
            raise AssertionError(f"{label}: {old!r} occurs {found} times, expected {want}")
        source = source.replace(old, new)
    source += ("\n\n" + extra.strip("\n") + "\n") if extra else ""
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
class Variant:
    """The solutions of exercise ``ex_id``'s part with ``edits`` and ``extra`` code; hand in
    ``function`` (default: the exercise's)."""

    ex_id: str
    name: str
    edits: tuple = ()
    function: str = ""
    extra: str = ""

    def build(self):
        source = notebook_code(f"part{self.ex_id[0]}_solutions.ipynb", "solution")
        module = load(source, self.edits, label=f"{self.ex_id} {self.name}", extra=self.extra)
        return getattr(module, self.function or EXERCISES[self.ex_id].function)


@dataclass(frozen=True)
class Mutant(Variant):
    """A wrong answer: its checker must fail and say ``phrase``.

    ``kind`` is the kind of mistake (:data:`KINDS`); ``gpu_only`` mutants are right on the CPU
    (a tensor created without ``device=`` is on the CPU there) and are checked on a GPU only.
    """

    phrase: str = ""
    kind: str = "classic"
    gpu_only: bool = False


@dataclass(frozen=True)
class Alternative(Variant):
    """A right answer written differently: its checker must pass. ``kind`` says how it differs."""

    kind: str = ""


#: The kinds of mistakes the mutants cover (the categories of the exercises' issue), besides the classics.
KINDS = {
    "shape": "shapes the problems used to miss: top_k = 1, M = 1 with topk = 1, topk != 2, K > BLOCK_K, "
             "non-contiguous inputs",
    "value": "values the problems used to miss: router weights that do not add up to 1, offsets past 2**32, "
             "a copied weight",
    "masked lane": "masked-off lanes of a tl.load without other= that reach the result or an address",
    "in place": "changing the caller's tensors in place",
    "dtype": "buffers of the wrong dtype or device, indices and counts returned as floats",
    "message": "faults whose message used to name the wrong cause",
    "classic": "the mistakes the checkers always caught",
}

# Source lines of the solutions that several mutants edit.
_P1_PAIRS = "    return idx, slot\n"
_P1_LOOP_OUT = "    out = x.new_empty(M, topk, N)\n    counts"
_P2_MATMUL = "return torch.matmul(selected, x[:, None, :, None]).squeeze(-1)"
_P3_X_LOAD = "x = tl.load(x_ptr + pid_m * stride_xm + k * stride_xk, mask=k_ok, other=0.0)   # [BLOCK_K]"
_P3_ANY_LAUNCH = ("fused_kernel_any_topk[grid](x, weight, topk_ids, out, N, K,\n"
                  "                                x.stride(0), x.stride(1),")
_P3_W_COLS = "w_cols = w_ptr + expert * stride_we + n * stride_wn                          #"
_P3_ACC = ("acc = tl.zeros((FUSED_N,), dtype=tl.float32)\n    for k0 in range(0, K, BLOCK_K):\n"
           "        k = k0 + tl.arange(0, BLOCK_K)\n        k_ok = k < K\n        " + _P3_X_LOAD)
_P4_DOT_AND_WEIGHTS = '''        acc = tl.dot(a, b, acc)
    if ROUTER_WEIGHTS:
        w = tl.load(router_ptr + pair, mask=row_ok, other=0.0)    # one weight per pair
        acc = acc * w[:, None]
'''
_P4_ROUTER = "router = out if topk_weights is None else topk_weights.reshape(-1).float().contiguous()"
_P8_ACT = "act = F.silu(h[:inter]) * h[inter:]"
_P8_PADDING = ("        if pair == M * topk:                           # a padding row of the run\n"
               "            continue\n")
_P4_B_LOAD = ("        b = tl.load(w_ptr + expert * stride_we + n[None, :] * stride_wn + k[:, None] * stride_wk,\n"
              "                    mask=(k[:, None] < K) & (n[None, :] < N), other=0.0)")

MUTANTS = [
    # ------------------------------------------------------------------ 1.1 route
    Mutant("1.1", "no renormalisation", (("    if renormalize:\n", "    if False:\n"),),
           phrase="raw softmax probabilities"),
    Mutant("1.1", "softmax over tokens", (("router_logits.float(), dim=-1)", "router_logits.float(), dim=0)"),),
           phrase="dim=0"),
    Mutant("1.1", "int64 ids", (("topk_ids.to(torch.int32)", "topk_ids"),), phrase="expected dtype torch.int32"),
    Mutant("1.1", "bf16 softmax", (("torch.softmax(router_logits.float(),", "torch.softmax(router_logits,"),),
           phrase="do the softmax in float32"),
    Mutant("1.1", "bare squeeze", (("return topk_weights, topk_ids.to(torch.int32)",
                                    "return topk_weights.squeeze(), topk_ids.to(torch.int32).squeeze()"),),
           phrase="A bare .squeeze() drops every axis of size 1", kind="shape"),
    Mutant("1.1", "softmax shifted in place",
           (("    probs = torch.softmax(",
             "    router_logits -= router_logits.max(dim=-1, keepdim=True).values\n    probs = torch.softmax("),),
           phrase="changed its input `router_logits` in place", kind="in place"),
    Mutant("1.1", "ids as floats", (("topk_ids.to(torch.int32)", "topk_ids.float()"),),
           phrase="topk_ids: expected dtype torch.int32, got torch.float32: expert ids are indices", kind="dtype"),
    Mutant("1.1", "softmax without subtracting the max",
           (("    probs = torch.softmax(router_logits.float(), dim=-1)",
             "    e = router_logits.float().exp()\n    probs = e / e.sum(dim=-1, keepdim=True)"),),
           phrase="Subtract each row's max logit before exp"),
    Mutant("1.1", "renormalize defaults to False",
           (("def route(router_logits, top_k, renormalize=True):",
             "def route(router_logits, top_k, renormalize=False):"),),
           phrase="its default must be True", kind="value"),
    Mutant("1.1", "softmax shifted by the batch's max",
           (("    probs = torch.softmax(router_logits.float(), dim=-1)",
             "    logits = router_logits.float()\n"
             "    e = (logits - (logits.max() if logits.numel() else 0.0)).exp()\n"
             "    probs = e / e.sum(dim=-1, keepdim=True)"),),
           phrase="your softmax subtracts one max for the whole batch", kind="value"),
    # ------------------------------------------------------------------ 1.2 expert_pairs
    Mutant("1.2", "(slot, idx)", (("    return idx, slot\n", "    return slot, idx\n"),),
           phrase="you returned (slot, idx)"),
    Mutant("1.2", "first slot only", (("torch.where(topk_ids == e)", "torch.where(topk_ids[:, :1] == e)"),),
           phrase="was chosen by"),
    Mutant("1.2", "topk = 2 hard-coded", (("torch.where(topk_ids == e)", "torch.where(topk_ids[:, :2] == e)"),),
           phrase="does your code assume topk = 2?", kind="shape"),
    Mutant("1.2", "[P, 1] index tensors", (("    return idx, slot\n", "    return idx[:, None], slot[:, None]\n"),),
           phrase="an extra axis of size 1", kind="shape"),
    Mutant("1.2", "indices as floats", (("    return idx, slot\n", "    return idx.float(), slot.float()\n"),),
           phrase="idx: expected an integer tensor (indices), got torch.float32", kind="dtype"),
    Mutant("1.2", "indices as uint8", ((_P1_PAIRS, "    return idx.to(torch.uint8), slot.to(torch.uint8)\n"),),
           phrase="idx: expected int64 (or int32) indices, got torch.uint8: torch reads a uint8 tensor used as an "
                  "index as a mask", kind="dtype"),
    Mutant("1.2", "indices as int16", ((_P1_PAIRS, "    return idx.to(torch.int16), slot.to(torch.int16)\n"),),
           phrase="idx: expected int64 (or int32) indices, got torch.int16: torch refuses it as an index",
           kind="dtype"),
    # ------------------------------------------------------------------ 1.3 the loop
    Mutant("1.3", "wrong expert index", (("idx, slot = expert_pairs(topk_ids, e)\n        out[",
                                          "idx, slot = expert_pairs(topk_ids.flip(1), e)\n        out["),),
           phrase="should use expert"),
    Mutant("1.3", "swapped axes", (("out = x.new_empty(M, topk, N)", "out = x.new_empty(M, N, topk)"),
                                   ("out[idx, slot] = x[idx]", "out[idx, :, slot] = x[idx]")), phrase="wrong order"),
    Mutant("1.3", "missing transpose", (("x[idx] @ weight[e].T", "x[idx] @ weight[e]"),), phrase="(.T)"),
    Mutant("1.3", "last expert skipped", (("counts.nonzero().flatten().tolist():",
                                           "counts.nonzero().flatten().tolist()[:-1]:"),), phrase="never written"),
    Mutant("1.3", "buffer of the default dtype", ((_P1_LOOP_OUT, "    out = torch.zeros(M, topk, N, device=x.device)\n"
                                                                 "    counts"),),
           phrase="A tensor created without dtype= (torch.zeros(...), torch.empty(...)) is float32", kind="dtype"),
    Mutant("1.3", "buffer on the CPU",
           ((_P1_LOOP_OUT, "    out = torch.zeros(M, topk, N, dtype=x.dtype)\n    counts"),),
           phrase="device", kind="dtype", gpu_only=True),
    # ------------------------------------------------------------------ 1.4 the layer
    Mutant("1.4", "no router weights", ((" * topk_weights[idx, slot, None].float()", ""),),
           phrase="without router weights"),
    Mutant("1.4", "silu on up", (("F.silu(h[:, :inter]) * h[:, inter:]", "F.silu(h[:, inter:]) * h[:, :inter]"),),
           phrase="wrong half"),
    Mutant("1.4", "no silu", (("F.silu(h[:, :inter]) * h[:, inter:]", "h[:, :inter] * h[:, inter:]"),),
           phrase="silu is missing"),
    Mutant("1.4", "gelu for silu", (("F.silu(h[:, :inter]) * h[:, inter:]", "F.gelu(h[:, :inter]) * h[:, inter:]"),),
           phrase="the activation is gelu(gate) * up"),
    Mutant("1.4", "gate/up split alternating",
           (("F.silu(h[:, :inter]) * h[:, inter:]", "F.silu(h[:, 0::2]) * h[:, 1::2]"),),
           phrase="gate and up are split the wrong way"),
    Mutant("1.4", "router weights as a row", (("topk_weights[idx, slot, None]", "topk_weights[None, idx, slot]"),),
           phrase="do not broadcast in an elementwise operation", kind="shape"),
    Mutant("1.4", "sum starts from empty", (("y = torch.zeros(M, K,", "y = torch.empty(M, K,"),),
           phrase="never written"),
    Mutant("1.4", "renormalised router weights",
           ((" * topk_weights[idx, slot, None].float()",
             " * (topk_weights / topk_weights.sum(-1, keepdim=True))[idx, slot, None].float()"),),
           phrase="your router weights were divided by their sum", kind="value"),
    Mutant("1.4", "/= on the router weights",
           (("    y = torch.zeros(M, K,",
             "    topk_weights /= topk_weights.sum(-1, keepdim=True)\n    y = torch.zeros(M, K,"),),
           phrase="changed its input `topk_weights` in place", kind="in place"),
    Mutant("1.4", "result left in float32", (("    return y.to(x.dtype)", "    return y"),),
           phrase="convert the result with .to(x.dtype)", kind="dtype"),
    Mutant("1.4", "sum over the slots in bfloat16",
           (("    y = torch.zeros(M, K, dtype=torch.float32, device=x.device)", "    y = torch.zeros_like(x)"),
            ("rows = (act @ w2[e].T).float() * topk_weights[idx, slot, None].float()",
             "rows = (act @ w2[e].T) * topk_weights[idx, slot, None].to(x.dtype)")),
           phrase="the products or the sum over the slots are kept in torch.bfloat16", kind="dtype"),
    Mutant("1.4", "router weight on the activation, in bfloat16",
           (("rows = (act @ w2[e].T).float() * topk_weights[idx, slot, None].float()",
             "rows = ((act * topk_weights[idx, slot, None].to(x.dtype)) @ w2[e].T).float()"),),
           phrase="or the router weight multiplies the activation before the down GEMM", kind="dtype"),
    # ------------------------------------------------------------------ 2.1 select_weights
    Mutant("2.1", "ids transposed", (("return weight[topk_ids.long()]", "return weight[topk_ids.long().t()]"),),
           phrase="wrong order"),
    Mutant("2.1", "first slot only", (("return weight[topk_ids.long()]", "return weight[topk_ids.long()[:, 0]]"),),
           phrase="wrong shape"),
    Mutant("2.1", "each expert's weights transposed", (("return weight[topk_ids.long()]",
                                                        "return weight.transpose(1, 2)[topk_ids.long()]"),),
           phrase="= [M, topk, K, N]: each expert's weights are transposed", kind="message"),
    # ------------------------------------------------------------------ 2.2 the vectorised matmul
    Mutant("2.2", "every token uses x[0]", (("x[:, None, :, None]", "x[:1, None, :, None]"),),
           phrase="applied to token 0's row of x"),
    Mutant("2.2", "wrong expert", (("selected = select_weights(weight, topk_ids)",
                                    "selected = select_weights(weight, topk_ids.flip(1))"),),
           phrase="should use expert"),
    Mutant("2.2", "no squeeze", ((").squeeze(-1)  #", ")  #"),), phrase="extra axis of size 1"),
    Mutant("2.2", "bare squeeze", ((").squeeze(-1)  #", ").squeeze()  #"),),
           phrase="the axes of size 1 are missing (here M = topk = 1)", kind="shape"),
    # ------------------------------------------------------------------ 2.3 intermediate_bytes
    Mutant("2.3", "forgot topk", (("return M * topk * N * K * itemsize", "return M * N * K * itemsize"),),
           phrase="each token has topk experts"),
    Mutant("2.3", "elements, not bytes", (("return M * topk * N * K * itemsize", "return M * topk * N * K"),),
           phrase="counts elements"),
    Mutant("2.3", "int32 overflow", (("return M * topk * N * K * itemsize",
                                      "return int(torch.tensor(M, dtype=torch.int32) * topk * N * K * itemsize)"),),
           phrase="wrapped around"),
    Mutant("2.3", "a float result", (("return M * topk * N * K * itemsize", "return M * topk * N * K * itemsize / 1"),),
           phrase="expected a number of bytes (an int), got float", kind="dtype"),
    Mutant("2.3", "a float32 product", (("return M * topk * N * K * itemsize",
                                         "return int(torch.tensor(float(M)) * topk * N * K * itemsize)"),),
           phrase="off by 59,434: a rounding", kind="value"),
    # ------------------------------------------------------------------ 2.4 the layer from one function
    Mutant("2.4", "no router weights", ((" * topk_weights[..., None].float()", ""),), phrase="without router weights"),
    Mutant("2.4", "slot 0 only", (("return weighted.sum(dim=1).to(x.dtype)", "return weighted[:, 0].to(x.dtype)"),),
           phrase="only slot 0"),
    Mutant("2.4", "mean over slots", (("return weighted.sum(dim=1).to(x.dtype)",
                                       "return weighted.mean(dim=1).to(x.dtype)"),),
           phrase="weighted mean"),
    Mutant("2.4", "topk = 2 hard-coded", (("down.view(M, topk, x.shape[1])", "down.view(M, 2, x.shape[1])"),),
           phrase="instead of fixing them", kind="shape"),
    Mutant("2.4", "renormalised router weights",
           ((" * topk_weights[..., None].float()",
             " * (topk_weights / topk_weights.sum(-1, keepdim=True))[..., None]"),),
           phrase="your router weights were divided by their sum", kind="value"),
    Mutant("2.4", "unsqueeze_ on the router weights", (("topk_weights[..., None].float()",
                                                        "topk_weights.unsqueeze_(-1)"),),
           phrase="unsqueeze_", kind="in place"),
    Mutant("2.4", "weighted sum in bfloat16",
           (("weighted = down.view(M, topk, x.shape[1]).float() * topk_weights[..., None].float()",
             "weighted = down.view(M, topk, x.shape[1]) * topk_weights[..., None].to(x.dtype)"),),
           phrase="the products or the sum over the slots are kept in torch.bfloat16", kind="dtype"),
    # ------------------------------------------------------------------ 3.1 the fused tile's layout
    Mutant("3.1", "// and % swapped", (("topk_idx = lane // BLOCK_N                  # 0 0",
                                        "topk_idx = lane % BLOCK_N                  # 0 0"),
                                       ("n = pid_n * BLOCK_N + lane % BLOCK_N        # the same",
                                        "n = pid_n * BLOCK_N + lane // BLOCK_N        # the same")), phrase="swapped"),
    Mutant("3.1", "no pid_n offset", (("n = pid_n * BLOCK_N + lane % BLOCK_N        # the same",
                                       "n = lane % BLOCK_N        # the same"),), phrase="ignore pid_n"),
    Mutant("3.1", "mask off by one", (("ok = n < N                                  # the last",
                                       "ok = n < N - 1                              # the last"),),
           phrase="an off-by-one masks a real column"),
    Mutant("3.1", "no mask", (("ok = n < N                                  # the last",
                               "ok = n >= 0                                 # the last"),),
           phrase="must be masked off"),
    Mutant("3.1", "mask compares the lane", (("ok = n < N                                  # the last",
                                               "ok = lane < N                               # the last"),),
           phrase="compares the lane number with N", kind="message"),
    Mutant("3.1", "mask n <= N", (("ok = n < N                                  # the last",
                                   "ok = n <= N                                 # the last"),),
           phrase="lets column N through", kind="message"),
    Mutant("3.1", "column one too far", (("n = pid_n * BLOCK_N + lane % BLOCK_N        # the same",
                                          "n = pid_n * BLOCK_N + lane % BLOCK_N + 1    # the same"),),
           phrase="expected slot 0, column 0; got slot 0, column 1", kind="message"),
    Mutant("3.1", "float tables", (("slot = torch.empty(grid[0], topk * block_n, dtype=torch.int32,",
                                    "slot = torch.empty(grid[0], topk * block_n, dtype=torch.float32,"),),
           phrase="slot: expected an integer tensor", kind="dtype"),
    # ------------------------------------------------------------------ 3.2 the gather
    Mutant("3.2", "store without mask", (("topk_idx * stride_ot + n * stride_on, acc, mask=n_ok)",
                                          "topk_idx * stride_ot + n * stride_on, acc)"),),
           phrase="out-of-range pointer"),
    Mutant("3.2", "every slot uses slot 0's expert", (("topk_idx * stride_ik)       # [FUSED_N]",
                                                       "0 * stride_ik)       # [FUSED_N]"),), phrase="slot 0's expert"),
    Mutant("3.2", "swapped output axes", (("topk_idx * stride_ot + n * stride_on, acc, mask=n_ok)",
                                          "topk_idx * stride_on + n * stride_ot, acc, mask=n_ok)"),),
           phrase="wrong order"),
    Mutant("3.2", "N mask off by one",
           (("    n_ok = n < N\n    expert = tl.load(ids_ptr + pid_m * stride_im + topk_idx * stride_ik)  ",
             "    n_ok = n < N - 1\n    expert = tl.load(ids_ptr + pid_m * stride_im + topk_idx * stride_ik)  "),),
           phrase="never written"),
    Mutant("3.2", "K mask off by one",
           (("k_ok = k < K\n        " + _P3_X_LOAD, "k_ok = k < K - 1\n        " + _P3_X_LOAD),),
           phrase="stop at k"),
    Mutant("3.2", "x row ignored", ((_P3_X_LOAD, _P3_X_LOAD.replace("pid_m * stride_xm + ", "")),),
           phrase="applied to token 0's row of x"),
    Mutant("3.2", "assumes a contiguous weight",
           (("w_cols = w_ptr + expert * stride_we + n * stride_wn                          #",
             "w_cols = w_ptr + expert * N * K + n * K                          #"),), phrase="a stride is the fault"),
    Mutant("3.2", "expert offset expert * N * K",
           ((_P3_W_COLS, _P3_W_COLS.replace("expert * stride_we", "expert * N * K")),),
           phrase="stride(0) is not N * K", kind="shape"),
    Mutant("3.2", "accumulator in x's dtype", ((_P3_ACC, _P3_ACC.replace("tl.float32", "x_ptr.dtype.element_ty")),),
           phrase="the sum is kept in float16", kind="dtype"),
    Mutant("3.2", "grid too small", (("grid = (M, triton.cdiv(N, BLOCK_N))\n    fused_kernel[grid]",
                                      "grid = (M, N // BLOCK_N)\n    fused_kernel[grid]"),), phrase="never written"),
    Mutant("3.2", "x loaded without other=", ((_P3_X_LOAD, _P3_X_LOAD.replace(", other=0.0", "")),),
           phrase="computed from the masked-off lanes of a tl.load without other= (your kernel loads `x_ptr`",
           kind="masked lane"),
    Mutant("3.2", "K loop overwrites",
           (("        acc += tl.sum(x[:, None] * w, axis=0)\n    tl.store(out_ptr + pid_m * stride_om + topk_idx * "
             "stride_ot + n * stride_on, acc, mask=n_ok)",
             "        acc = tl.sum(x[:, None] * w, axis=0)\n    tl.store(out_ptr + pid_m * stride_om + topk_idx * "
             "stride_ot + n * stride_on, acc, mask=n_ok)"),),
           phrase="replaces acc instead of adding to it", kind="shape"),
    Mutant("3.2", "x's masked lanes loaded as NaN",
           ((_P3_X_LOAD, _P3_X_LOAD.replace("other=0.0", 'other=float("nan")')),),
           phrase="yet your code wrote them", kind="message"),
    Mutant("3.2", "program ids swapped", (("    pid_m = tl.program_id(axis=0)\n    pid_n = tl.program_id(axis=1)\n"
                                           "    FUSED_N: tl.constexpr = TOPK * BLOCK_N",
                                           "    pid_m = tl.program_id(axis=1)\n    pid_n = tl.program_id(axis=0)\n"
                                           "    FUSED_N: tl.constexpr = TOPK * BLOCK_N"),),
           phrase="The program ids are swapped: pid_m must be tl.program_id(axis=0)", kind="message"),
    # ------------------------------------------------------------------ 3.3 any topk
    Mutant("3.3", "TOPK_PAD = topk", (("TOPK_PAD=triton.next_power_of_2(topk)", "TOPK_PAD=topk", 2),),
           phrase="power of two"),
    Mutant("3.3", "spare slots stored", (("n * stride_on, acc, mask=col_ok)", "n * stride_on, acc, mask=n < N)", 2),),
           phrase="out-of-range pointer"),
    Mutant("3.3", "spare slots read ids", (("topk_idx * stride_ik, mask=slot_ok, other=0)\n",
                                           "topk_idx * stride_ik)\n"),), phrase="ids_ptr"),
    Mutant("3.3", "the 3.2 kernel", (), function="fused_moe_matmul", phrase="power of two"),
    Mutant("3.3", "x strides assumed", ((_P3_ANY_LAUNCH, _P3_ANY_LAUNCH.replace("x.stride(0), x.stride(1),",
                                                                                "K, 1,")),),
           phrase="a stride is the fault", kind="shape"),
    Mutant("3.3", "ids without other=, spare slots' weights not masked",
           (("topk_idx * stride_ik, mask=slot_ok, other=0)\n", "topk_idx * stride_ik, mask=slot_ok)\n"),
            ("mask=k_ok[:, None] & col_ok[None, :], other=0.0)",
             "mask=k_ok[:, None] & (n < N)[None, :], other=0.0)", 2)),
           phrase="your kernel loads `ids_ptr` with a mask and no other=", kind="masked lane"),
    # ------------------------------------------------------------------ 3.4 int64
    Mutant("3.4", "the 3.3 kernel (int32 offsets)", (), function="fused_moe_matmul_any_topk",
           phrase="in int32 it wraps around"),
    Mutant("3.4", "uint32 offsets", (("other=0).to(tl.int64)", "other=0).to(tl.uint32)"),),
           phrase="your offsets are 32 bits without a sign (tl.uint32?)", kind="value"),
    Mutant("3.4", "launcher copies the weight", (), function="fused_moe_matmul_copying",
           extra="def fused_moe_matmul_copying(x, weight, topk_ids):\n"
                 "    return fused_moe_matmul_any_topk(x, weight.contiguous(), topk_ids)",
           phrase="the kernel never read the weight you were given", kind="value"),
    # ------------------------------------------------------------------ 4.1 align_block_size
    Mutant("4.1", "pads exact multiples", (("padded = (counts + block_m - 1) // block_m * block_m",
                                            "padded = (counts // block_m + 1) * block_m"),),
           phrase="already a multiple"),
    Mutant("4.1", "pads with 0", (("torch.full((num_post,), num_pairs,", "torch.full((num_post,), 0,"),),
           phrase="sentinel"),
    Mutant("4.1", "pads with -1", (("torch.full((num_post,), num_pairs,", "torch.full((num_post,), -1,"),),
           phrase="neither a pair"),
    Mutant("4.1", "one label per row", (("num_experts, device=flat.device), padded // block_m)",
                                         "num_experts, device=flat.device), padded)"),), phrase="labelled expert"),
    Mutant("4.1", "post without padding", (("torch.tensor([num_post], dtype=torch.int32",
                                            "torch.tensor([num_pairs], dtype=torch.int32"),),
           phrase="num_tokens_post_padded"),
    Mutant("4.1", "num_tokens_post_padded as a float", (("torch.tensor([num_post], dtype=torch.int32",
                                                         "torch.tensor([num_post], dtype=torch.float32"),),
           phrase="num_tokens_post_padded: expected an integer", kind="dtype"),
    Mutant("4.1", "sorted ids as floats", (("torch.full((num_post,), num_pairs, dtype=torch.int32,",
                                            "torch.full((num_post,), num_pairs, dtype=torch.float32,"),
                                           ("order.to(torch.int32)", "order.float()")),
           phrase="sorted_token_ids: expected a 1-D integer tensor", kind="dtype"),
    Mutant("4.1", "expert ids in int8", (("return sorted_ids, expert_ids.to(torch.int32),",
                                          "return sorted_ids, expert_ids.to(torch.int8),"),),
           phrase="expert_ids: expected an int32 (or int64) tensor, got torch.int8", kind="dtype"),
    Mutant("4.1", "sorted ids in uint8", (("torch.full((num_post,), num_pairs, dtype=torch.int32,",
                                           "torch.full((num_post,), num_pairs, dtype=torch.uint8,"),
                                          ("order.to(torch.int32)", "order.to(torch.uint8)")),
           phrase="sorted_token_ids: expected an int32 (or int64) tensor, got torch.uint8", kind="dtype"),
    # ------------------------------------------------------------------ 4.2 grouped_pid
    Mutant("4.2", "no min for the last group", (("group_rows = min(num_pid_m - first_m, group_m)",
                                                 "group_rows = group_m"),),
           phrase="last group"),
    Mutant("4.2", "row-major", (("pid_m = first_m + (pid % pids_per_group) % group_rows", "pid_m = pid // num_pid_n"),
                                ("pid_n = (pid % pids_per_group) // group_rows", "pid_n = pid % num_pid_n")),
           phrase="row-major"),
    Mutant("4.2", "the last group's rows counted from pid 0",
           (("pid_m = first_m + (pid % pids_per_group) % group_rows", "pid_m = first_m + pid % group_rows"),),
           phrase="is in the last group, which starts at pid", kind="shape"),
    # ------------------------------------------------------------------ 4.3 the sorted kernel
    Mutant("4.3", "A load without the row mask", (("mask=row_ok[:, None] & (k[None, :] < K), other=0.0)",
                                                   "mask=k[None, :] < K, other=0.0)"),), phrase="sentinel"),
    Mutant("4.3", "store without the row mask", (("mask=row_ok[:, None] & (n[None, :] < N))", "mask=n[None, :] < N)"),),
           phrase="store to"),
    Mutant("4.3", "no early exit", (("    if pid_m * BLOCK_M >= tl.load(num_post_ptr):\n        return\n", ""),),
           phrase="out-of-range pointer"),
    Mutant("4.3", "wrong expert", (("expert = tl.load(expert_ids_ptr + pid_m)",
                                    "expert = tl.load(expert_ids_ptr + pid_n)"),),
           phrase="should use expert"),
    Mutant("4.3", "K loop overwrites", (("acc = tl.dot(a, b, acc)", "acc = tl.dot(a, b)"),),
           phrase="replaces acc instead of adding to it", kind="shape"),
    Mutant("4.3", "K offset ignored", (("        k = k0 + tl.arange(0, BLOCK_K)\n        a = tl.load(",
                                        "        k = tl.arange(0, BLOCK_K)\n        a = tl.load("),),
           phrase="reads the same first BLOCK_K columns", kind="shape"),
    Mutant("4.3", "B loaded without other=", (("mask=(k[:, None] < K) & (n[None, :] < N), other=0.0)",
                                               "mask=(k[:, None] < K) & (n[None, :] < N))"),),
           phrase="loads `w_ptr`", kind="masked lane"),
    Mutant("4.3", "weight read transposed", ((_P4_B_LOAD, _P4_B_LOAD.replace(
        "n[None, :] * stride_wn + k[:, None] * stride_wk", "n[None, :] * stride_wk + k[:, None] * stride_wn")),),
           phrase="your kernel reads each expert's weight transposed", kind="message"),
    Mutant("4.3", "weight read transposed, masks swapped too", ((_P4_B_LOAD, _P4_B_LOAD.replace(
        "n[None, :] * stride_wn + k[:, None] * stride_wk", "n[None, :] * stride_wk + k[:, None] * stride_wn").replace(
        "mask=(k[:, None] < K) & (n[None, :] < N)", "mask=(k[:, None] < N) & (n[None, :] < K)")),),
           phrase="your kernel reads each expert's weight transposed", kind="message"),
    Mutant("4.3", "expert offset expert * N * K", (("b = tl.load(w_ptr + expert * stride_we + n[None, :]",
                                                     "b = tl.load(w_ptr + expert * N * K + n[None, :]"),),
           phrase="stride(0) is not N * K", kind="shape"),
    Mutant("4.3", "accumulator in x's dtype",
           (("acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
             "acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=x_ptr.dtype.element_ty)"),
            ("acc = tl.dot(a, b, acc)", "acc += tl.dot(a, b).to(acc.dtype)")),
           phrase="the sum is kept in float16", kind="dtype"),
    Mutant("4.3", "int32 expert offsets", ((".to(tl.int64)   # expert * stride_we passes 2**31", "   # 2**31"),),
           phrase="in int32 it wraps around", kind="value"),
    # ------------------------------------------------------------------ 4.4 the epilogue
    Mutant("4.4", "no router weights", (("acc = acc * w[:, None]", "acc = acc"),), phrase="without the router weights"),
    Mutant("4.4", "weights by token", (("router_ptr + pair, mask=row_ok", "router_ptr + pair // TOPK, mask=row_ok"),),
           phrase="not the token"),
    Mutant("4.4", "weights twice", (("acc = acc * w[:, None]", "acc = acc * w[:, None] * w[:, None]"),),
           phrase="twice"),
    Mutant("4.4", "router weight inside the K loop",
           ((_P4_DOT_AND_WEIGHTS, '''        acc = tl.dot(a, b, acc)
        if ROUTER_WEIGHTS:
            w = tl.load(router_ptr + pair, mask=row_ok, other=0.0)
            acc = acc * w[:, None]
'''),), phrase="the router weight is applied inside the K loop", kind="shape"),
    Mutant("4.4", "renormalised router weights",
           ((_P4_ROUTER, "router = out if topk_weights is None else "
                         "(topk_weights / topk_weights.sum(-1, keepdim=True)).reshape(-1).float().contiguous()"),),
           phrase="your router weights were divided by their sum", kind="value"),
    Mutant("4.4", "router load without mask", (("router_ptr + pair, mask=row_ok, other=0.0)", "router_ptr + pair)"),),
           phrase="hint: the router-weight load reached past topk_weights", kind="message"),
    Mutant("4.4", "router weights' strides assumed", ((_P4_ROUTER, "router = out if topk_weights is None else "
                                                                  "topk_weights.float()"),),
           phrase="topk_weights a transposed view (topk_weights.stride() = (1, 7)", kind="shape"),
    # ------------------------------------------------------------------ 7.1 quantise one block
    Mutant("7.1", "scale = amax", (("scale = (amax / 448.0).float()", "scale = amax.float()"),),
           phrase="should be amax / 448"),
    Mutant("7.1", "signed max", (("amax = block.abs().max()", "amax = block.max()"),), phrase="largest magnitude",
           kind="value"),
    Mutant("7.1", "multiplies by the scale", (("(block / scale)", "(block * scale)"),), phrase="divide by the scale"),
    Mutant("7.1", "no floor for zero blocks", ((".clamp_min(1e-12)", ""),), phrase="finite, positive", kind="value"),
    Mutant("7.1", "stays float32", ((".to(torch.float8_e4m3fn)", ""),), phrase="float8_e4m3fn", kind="dtype"),
    Mutant("7.1", "amax skips row 0", (("amax = block.abs().max()", "amax = block[1:].abs().max()"),),
           phrase="your amax skips row 0 of the block", kind="value"),
    Mutant("7.1", "amax skips the last column", (("amax = block.abs().max()", "amax = block[:, :-1].abs().max()"),),
           phrase="your amax skips the last column (127) of the block", kind="value"),
    Mutant("7.1", "floor at 1e-8", ((".clamp_min(1e-12)", ".clamp_min(1e-8)"),),
           phrase="is your floor larger than 1e-12?", kind="value"),
    Mutant("7.1", "floor only for all-zero blocks", ((".clamp_min(1e-12)", ".where(block.abs().max() > 0, 1e-12)"),),
           phrase="so a floor applies to tiny blocks too", kind="value"),
    # ------------------------------------------------------------------ 7.2 the scaled K loop
    Mutant("7.2", "no scales", (("(a @ w.T) * a_scale[:, g, None] * w_scale[col_scale_row, g][None, :]", "(a @ w.T)"),),
           phrase="never applied"),
    Mutant("7.2", "no weight scales", ((" * w_scale[col_scale_row, g][None, :]", ""),),
           phrase="weight-block scales are missing"),
    Mutant("7.2", "one scale column for all groups", (("a_scale[:, g, None]", "a_scale[:, 0, None]"),),
           phrase="which scale column", kind="shape"),
    Mutant("7.2", "every column takes the first weight-block row",
           (("torch.arange(N) // 128", "torch.zeros(N, dtype=torch.long)"),), phrase="which weight-block row",
           kind="shape"),
    Mutant("7.2", "bf16 accumulator", (("dtype=torch.float32)", "dtype=torch.bfloat16)"),), phrase="float32 sums",
           kind="dtype"),
    # ------------------------------------------------------------------ 8.1 the router gradient
    Mutant("8.1", "no silu", ((_P8_ACT, "act = h[:inter] * h[inter:]"),), phrase="A is silu(gate) * up"),
    Mutant("8.1", "gate and up swapped", ((_P8_ACT, "act = F.silu(h[inter:]) * h[:inter]"),),
           phrase="the gate rows first"),
    Mutant("8.1", "W2 not transposed", (("d_act = w2[e].T @ d_out[t]", "d_act = w2[e] @ d_out[t]"),),
           phrase="dA' = W2[e]^T dO_t", kind="shape"),
    Mutant("8.1", "sigmoid for silu", ((_P8_ACT, "act = torch.sigmoid(h[:inter]) * h[inter:]"),),
           phrase="silu(gate) = gate * sigmoid(gate)", kind="value"),
    Mutant("8.1", "a flat dS", (("    return ds", "    return ds.flatten()"),), phrase="not flat", kind="shape"),
    # ------------------------------------------------------------------ 8.2 one tile of dW2
    Mutant("8.2", "padding rows not skipped", ((_P8_PADDING, ""),),
           phrase="padding rows hold M * topk"),
    Mutant("8.2", "d_out's row is the pair", (("token = pair // topk", "token = pair"),), phrase="one per token"),
    Mutant("8.2", "s_act's row is the pair", (("s_act[r, q0:q0 + block]", "s_act[pair, q0:q0 + block]"),),
           phrase="s_act is in sorted order"),
    Mutant("8.2", "the edge tile not cut", (("tile = torch.zeros(min(block, K - p0), min(block, inter - q0))",
                                            "tile = torch.zeros(block, block)"),),
           phrase="the tile is cut where dW2 [K, I] = (40, 24) ends", kind="shape"),
]


# ---------------------------------------------------------------------------------- alternatives
ALTERNATIVES = [
    # ------------------------------------------------------------------ 1.1
    Alternative("1.1", "softmax over the kept logits", kind="softmax over kept logits", function="route_kept", extra='''
def route_kept(router_logits, top_k, renormalize=True):
    logits = router_logits.float()
    if renormalize:        # softmax of the top-k logits = the top-k probabilities renormalised
        kept, ids = logits.topk(top_k, dim=-1)
        return torch.softmax(kept, dim=-1), ids.to(torch.int32)
    weights, ids = torch.softmax(logits, dim=-1).topk(top_k, dim=-1)
    return weights, ids.int()
'''),
    Alternative("1.1", "sort, slice and /= on a new tensor", kind="torch.sort and an in-place op on a new tensor",
                function="route_sorted", extra='''
def route_sorted(router_logits, top_k, renormalize=True):
    probs = F.softmax(router_logits, dim=-1, dtype=torch.float32)
    weights, ids = probs.sort(dim=-1, descending=True)
    weights = weights[:, :top_k].clone()
    if renormalize:
        weights /= weights.sum(dim=-1, keepdim=True)
    return weights, ids[:, :top_k].to(torch.int32)
'''),
    Alternative("1.1", "softmax by hand, max subtracted",
                (("    probs = torch.softmax(router_logits.float(), dim=-1)",
                  "    s = router_logits.float()\n    e = (s - s.max(dim=-1, keepdim=True).values).exp()\n"
                  "    probs = e / e.sum(dim=-1, keepdim=True)"),),
                kind="softmax written out"),
    # ------------------------------------------------------------------ 1.2
    Alternative("1.2", "nonzero(as_tuple=True)", (("torch.where(topk_ids == e)",
                                                   "(topk_ids == e).nonzero(as_tuple=True)"),),
                kind="nonzero instead of where"),
    Alternative("1.2", "nonzero().T", (("    idx, slot = torch.where(topk_ids == e)      # rows (tokens), "
                                        "then columns (slots)\n    return idx, slot\n",
                                        "    return (topk_ids == e).nonzero().T\n"),),
                kind="a [2, P] tensor that unpacks into the pair"),
    Alternative("1.2", "nonzero columns as int32", (("    idx, slot = torch.where(topk_ids == e)      # rows (tokens), "
                                                    "then columns (slots)\n    return idx, slot\n",
                                                    "    pairs = (topk_ids == e).nonzero().int()\n"
                                                    "    return pairs[:, 0], pairs[:, 1]\n"),),
                kind="int32 index tensors"),
    # ------------------------------------------------------------------ 1.3
    Alternative("1.3", "einsum per expert, every expert, zeros", kind="einsum, a zeros buffer, no bincount",
                function="loop_einsum", extra='''
def loop_einsum(x, weight, topk_ids):
    out = torch.zeros(*topk_ids.shape, weight.shape[1], dtype=x.dtype, device=x.device)
    for e in range(weight.shape[0]):                 # experts nobody chose too: their pairs are empty
        idx, slot = expert_pairs(topk_ids, e)
        out[idx, slot] = torch.einsum("pk,nk->pn", x[idx], weight[e])
    return out
'''),
    Alternative("1.3", "one pair at a time with F.linear", kind="a loop over pairs", function="loop_pairs", extra='''
def loop_pairs(x, weight, topk_ids):
    M, topk = topk_ids.shape
    out = x.new_zeros(M, topk, weight.shape[1])
    for m in range(M):
        for j in range(topk):
            out[m, j] = F.linear(x[m], weight[int(topk_ids[m, j])])
    return out
'''),
    # ------------------------------------------------------------------ 1.4
    Alternative("1.4", "y[idx] +=, chunk, silu by hand", kind="y[idx] += and silu written out",
                function="layer_by_hand", extra='''
def layer_by_hand(x, w13, w2, topk_weights, topk_ids):
    y = x.new_zeros(x.shape, dtype=torch.float32)
    for e in range(w13.shape[0]):
        idx, slot = expert_pairs(topk_ids, e)
        if idx.numel() == 0:
            continue
        gate, up = torch.chunk(F.linear(x[idx], w13[e]), 2, dim=-1)
        act = gate * torch.sigmoid(gate) * up
        y[idx] += F.linear(act, w2[e]).float() * topk_weights[idx, slot].float()[:, None]
    return y.to(x.dtype)
'''),
    # ------------------------------------------------------------------ 2.1
    Alternative("2.1", "index_select and view", (("return weight[topk_ids.long()]",
                                                  "return weight.index_select(0, topk_ids.reshape(-1).long())"
                                                  ".view(*topk_ids.shape, *weight.shape[1:])"),),
                kind="index_select instead of indexing"),
    Alternative("2.1", "int32 ids as the index", (("return weight[topk_ids.long()]", "return weight[topk_ids]"),),
                kind="int32 ids used directly"),
    # ------------------------------------------------------------------ 2.2
    Alternative("2.2", "einsum", ((_P2_MATMUL, "return torch.einsum(\"mjnk,mk->mjn\", selected, x)"),),
                kind="einsum instead of matmul"),
    Alternative("2.2", "broadcast multiply and sum",
                ((_P2_MATMUL, "return (selected * x[:, None, None, :]).sum(-1)"),),
                kind="a broadcast product summed over K"),
    Alternative("2.2", "index the trailing axis away",
                ((_P2_MATMUL, "return (selected @ x[:, None, :, None])[..., 0]"),),
                kind="[..., 0] instead of squeeze"),
    # ------------------------------------------------------------------ 2.3
    Alternative("2.3", "math.prod", (("return M * topk * N * K * itemsize",
                                      "return math.prod((M, topk, N, K, itemsize))"),),
                kind="math.prod", extra="import math"),
    Alternative("2.3", "numpy int64", (("return M * topk * N * K * itemsize",
                                        "return np.prod([M, topk, N, K, itemsize], dtype=np.int64)"),),
                kind="a numpy int64 product", extra="import numpy as np"),
    # ------------------------------------------------------------------ 2.4
    Alternative("2.4", "unflatten and an einsum over slots", kind="einsum for the weighted sum",
                function="layer_einsum", extra='''
def layer_einsum(x, w13, w2, topk_weights, topk_ids):
    M, topk = topk_ids.shape
    inter = w2.shape[2]
    gate, up = expert_moe_matmul(x, w13, topk_ids).chunk(2, dim=-1)
    act = (F.silu(gate) * up).flatten(0, 1)                                   # [M * topk, I]
    down = expert_moe_matmul(act, w2, topk_ids.flatten()[:, None])[:, 0].unflatten(0, (M, topk))   # [M, topk, K]
    return torch.einsum("mjk,mj->mk", down.float(), topk_weights.float()).to(x.dtype)
'''),
    # ------------------------------------------------------------------ 3.1
    Alternative("3.1", "column without %", (("n = pid_n * BLOCK_N + lane % BLOCK_N        # the same",
                                             "n = pid_n * BLOCK_N + (lane - topk_idx * BLOCK_N)  # the same"),),
                kind="lane - slot * BLOCK_N instead of %"),
    # ------------------------------------------------------------------ 3.2
    Alternative("3.2", "clamped columns",
                (("w_cols = w_ptr + expert * stride_we + n * stride_wn                          #",
                  "w_cols = w_ptr + expert * stride_we + tl.minimum(n, N - 1) * stride_wn  #"),
                 ("mask=k_ok[:, None] & n_ok[None, :], other=0.0)", "mask=k_ok[:, None], other=0.0)")),
                kind="clamped columns instead of a masked weight load"),
    Alternative("3.2", "other block sizes", (("    BLOCK_N, BLOCK_K = 16, 16\n    grid = (M, triton.cdiv(N, BLOCK_N))\n"
                                              "    fused_kernel[grid]",
                                              "    BLOCK_N, BLOCK_K = 8, 64\n    grid = (M, triton.cdiv(N, BLOCK_N))\n"
                                              "    fused_kernel[grid]"),),
                kind="other block sizes"),
    Alternative("3.2", "weight tile loaded [FUSED_N, BLOCK_K] and tl.trans",
                (("        w = tl.load(w_cols[None, :] + k[:, None] * stride_wk,                           "
                  "# [BLOCK_K, FUSED_N]\n                    mask=k_ok[:, None] & n_ok[None, :], other=0.0)\n",
                  "        w = tl.trans(tl.load(w_cols[:, None] + k[None, :] * stride_wk,\n"
                  "                             mask=n_ok[:, None] & k_ok[None, :], other=0.0))\n"),),
                kind="tl.trans"),
    Alternative("3.2", "grid (N blocks, M)", (("    pid_m = tl.program_id(axis=0)\n    pid_n = tl.program_id(axis=1)\n"
                                               "    FUSED_N: tl.constexpr = TOPK * BLOCK_N",
                                               "    pid_m = tl.program_id(axis=1)\n    pid_n = tl.program_id(axis=0)\n"
                                               "    FUSED_N: tl.constexpr = TOPK * BLOCK_N"),
                                              ("grid = (M, triton.cdiv(N, BLOCK_N))\n    fused_kernel[grid]",
                                               "grid = (triton.cdiv(N, BLOCK_N), M)\n    fused_kernel[grid]")),
                kind="the grid's axes swapped"),
    Alternative("3.2", "a transposed product summed over axis 1",
                (("        acc += tl.sum(x[:, None] * w, axis=0)\n    tl.store(out_ptr + pid_m * stride_om + "
                  "topk_idx * stride_ot + n * stride_on, acc, mask=n_ok)",
                  "        acc += tl.sum(tl.trans(w) * x[None, :], axis=1)\n    tl.store(out_ptr + pid_m * stride_om + "
                  "topk_idx * stride_ot + n * stride_on, acc, mask=n_ok)"),),
                kind="a transposed product reduced over axis 1"),
    # ------------------------------------------------------------------ 3.3
    Alternative("3.3", "ids loaded without other=, every use masked",
                (("topk_idx * stride_ik, mask=slot_ok, other=0)\n", "topk_idx * stride_ik, mask=slot_ok)\n"),),
                kind="a masked load without other= whose lanes are never used"),
    Alternative("3.3", "clamped slot", (("    expert = tl.load(ids_ptr + pid_m * stride_im + topk_idx * stride_ik, "
                                         "mask=slot_ok, other=0)\n",
                                         "    expert = tl.load(ids_ptr + pid_m * stride_im + tl.minimum(topk_idx, "
                                         "TOPK - 1) * stride_ik)\n"),),
                kind="clamped slot index instead of a masked id load"),
    # ------------------------------------------------------------------ 3.4
    Alternative("3.4", "int64 ids converted in the launcher", kind="int64 ids converted in the launcher",
                function="fused_int64_ids", extra='''
def fused_int64_ids(x, weight, topk_ids):
    return fused_moe_matmul_any_topk(x, weight, topk_ids.to(torch.int64))   # ids loaded as int64
'''),
    Alternative("3.4", "the stride cast to int64", (("other=0).to(tl.int64)\n    w_cols = w_ptr + expert * stride_we",
                                                    "other=0)\n    w_cols = w_ptr + expert * stride_we.to(tl.int64)"),),
                kind="stride_we.to(tl.int64) instead of the ids"),
    # ------------------------------------------------------------------ 4.1
    Alternative("4.1", "padding first in each run",
                (("sorted_ids[starts[expert] + rank]",
                  "sorted_ids[starts[expert] + (padded - counts)[expert] + rank]"),),
                kind="padding placed first in a run"),
    Alternative("4.1", "a Python loop, worst-case buffers, an int count", kind="a loop, longer buffers, an int",
                function="align_loop", extra='''
def align_loop(topk_ids, block_m, num_experts):
    flat = topk_ids.flatten().tolist()
    sentinel = len(flat)
    rows, labels = [], []
    for e in reversed(range(num_experts)):              # any order of runs works
        pairs = [p for p, chosen in enumerate(flat) if chosen == e][::-1]
        if pairs:
            size = -(-len(pairs) // block_m) * block_m
            rows += pairs + [sentinel] * (size - len(pairs))
            labels += [e] * (size // block_m)
    capacity = len(flat) + num_experts * (block_m - 1)  # the most rows any routing can need
    sorted_ids = torch.full((capacity,), sentinel, dtype=torch.int64, device=topk_ids.device)
    sorted_ids[:len(rows)] = torch.tensor(rows, dtype=torch.int64)
    expert_ids = torch.full((-(-capacity // block_m),), -1, dtype=torch.int64, device=topk_ids.device)
    expert_ids[:len(labels)] = torch.tensor(labels, dtype=torch.int64)
    return sorted_ids, expert_ids, len(rows)
'''),
    # ------------------------------------------------------------------ 4.2
    Alternative("4.2", "the Triton tutorial's names, divmod, a list", kind="divmod and a list",
                function="grouped_divmod", extra='''
def grouped_divmod(pid, num_pid_m, num_pid_n, group_m):
    num_pid_in_group = group_m * num_pid_n
    group_id, in_group = divmod(pid, num_pid_in_group)
    first_pid_m = group_id * group_m
    group_size_m = min(num_pid_m - first_pid_m, group_m)
    pid_n, row = divmod(in_group, group_size_m)
    return [first_pid_m + row, pid_n]
'''),
    # ------------------------------------------------------------------ 4.3
    Alternative("4.3", "B loaded [BLOCK_N, BLOCK_K] and tl.trans",
                (("        b = tl.load(w_ptr + expert * stride_we + n[None, :] * stride_wn + k[:, None] * stride_wk,\n"
                  "                    mask=(k[:, None] < K) & (n[None, :] < N), other=0.0)              "
                  "# [BLOCK_K, BLOCK_N]\n        acc = tl.dot(a, b, acc)",
                  "        b = tl.load(w_ptr + expert * stride_we + n[:, None] * stride_wn + k[None, :] * stride_wk,\n"
                  "                    mask=(n[:, None] < N) & (k[None, :] < K), other=0.0)\n"
                  "        acc = tl.dot(a, tl.trans(b), acc)"),),
                kind="tl.trans"),
    Alternative("4.3", "acc += tl.dot(a, b)", (("acc = tl.dot(a, b, acc)", "acc += tl.dot(a, b)"),), kind="acc +="),
    Alternative("4.3", "pointers advanced each pass",
                (('''    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(x_ptr + token[:, None] * stride_xm + k[None, :] * stride_xk,
                    mask=row_ok[:, None] & (k[None, :] < K), other=0.0)               # [BLOCK_M, BLOCK_K]
        b = tl.load(w_ptr + expert * stride_we + n[None, :] * stride_wn + k[:, None] * stride_wk,
                    mask=(k[:, None] < K) & (n[None, :] < N), other=0.0)              # [BLOCK_K, BLOCK_N]
''', '''    k = tl.arange(0, BLOCK_K)
    a_ptrs = x_ptr + token[:, None] * stride_xm + k[None, :] * stride_xk
    b_ptrs = w_ptr + expert * stride_we + n[None, :] * stride_wn + k[:, None] * stride_wk
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=row_ok[:, None] & (k0 + k[None, :] < K), other=0.0)
        b = tl.load(b_ptrs, mask=(k0 + k[:, None] < K) & (n[None, :] < N), other=0.0)
        a_ptrs += BLOCK_K * stride_xk
        b_ptrs += BLOCK_K * stride_wk
'''),), kind="pointers advanced instead of offsets recomputed"),
    Alternative("4.3", "other block sizes", (("BLOCK_M, BLOCK_N, BLOCK_K = 16, 32, 32",
                                              "BLOCK_M, BLOCK_N, BLOCK_K = 32, 16, 64"),),
                kind="other block sizes"),
    # ------------------------------------------------------------------ 4.4
    # A's rows scaled in float32 (and multiplied in full fp32, not tf32): scaled 16-bit rows would be rounded.
    Alternative("4.4", "scaling A's rows", ((_P4_DOT_AND_WEIGHTS, '''        if ROUTER_WEIGHTS:
            acc = tl.dot(a.to(tl.float32) * w[:, None], b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
'''), ("    token = pair // TOPK\n    for k0 in range(0, K, BLOCK_K):",
       "    token = pair // TOPK\n    if ROUTER_WEIGHTS:\n"
       "        w = tl.load(router_ptr + pair, mask=row_ok, other=0.0)\n    for k0 in range(0, K, BLOCK_K):")),
                kind="scaling A's rows instead of the output"),
    Alternative("4.4", "each block's product scaled",
                ((_P4_DOT_AND_WEIGHTS, '''        if ROUTER_WEIGHTS:
            acc += tl.dot(a, b) * tl.load(router_ptr + pair, mask=row_ok, other=0.0)[:, None]
        else:
            acc = tl.dot(a, b, acc)
'''),), kind="the weight applied to each K block's product"),
]

#: The package's implementation of each exercise, where it has one with the same signature.
PACKAGE_ANSWERS = {
    "1.1": moe_tutorial.route,
    "1.3": moe_tutorial.loop_moe_matmul,
    "1.4": moe_tutorial.loop_moe_layer,
    "2.2": moe_tutorial.indexing_moe_matmul,
    "2.3": moe_tutorial.intermediate_bytes,
    "3.2": moe_tutorial.fused_moe_matmul,
    "3.3": moe_tutorial.fused_moe_matmul,
    "3.4": moe_tutorial.fused_moe_matmul,
    "4.1": moe_tutorial.align_block_size,
    "4.3": moe_tutorial.sorted_moe_matmul,
    "4.4": moe_tutorial.sorted_moe_matmul,
}
