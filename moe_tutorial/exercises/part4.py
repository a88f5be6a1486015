"""Checkers for Part 4, the production kernel: sort and pad, grouped order, tl.dot, the epilogue."""
from __future__ import annotations

from collections import Counter

import torch

from .. import runtime
from ..kernels.sorted_kernel import pid_to_tile  # the kernel's grouped order, in Python
from ..shapes import random_topk_ids
from .big_stride import big_stride_check
from .common import check_first_gemm_fn, hint_by_name, kernel_tolerance
from .diagnose import ranges
from .feedback import Fail, call_student, on, run_check
from .problems import kernel_problems, random_first_gemm


# --------------------------------------------------------------------------- 4.1
def _align_cases():
    g = torch.Generator().manual_seed(42)
    dev = runtime.DEVICE
    crafted = torch.tensor([[2, 0], [2, 0], [2, 0], [2, 3], [2, 3], [0, 3]], dtype=torch.int32)
    return [
        ("counts per expert 4, 0, 5, 3 with block_m=4", crafted.to(dev), 4, 4),
        ("M=9, topk=3, E=8, block_m=4, int64 ids",
         random_topk_ids(9, 8, 3, generator=g, dtype=torch.int64).to(dev), 4, 8),
        ("M=1, topk=1, E=3, block_m=2", torch.tensor([[1]], dtype=torch.int32, device=dev), 2, 3),
        ("M=5, topk=2, E=4, block_m=1: no padding", random_topk_ids(5, 4, 2, generator=g).to(dev), 1, 4),
        ("M=7, topk=6, E=64, block_m=16 (DeepSeek-V2-Lite)", random_topk_ids(7, 64, 6, generator=g).to(dev), 16, 64),
        ("M=5, topk=8, E=256, block_m=4 (DeepSeek-V3: expert ids past 127)",
         random_topk_ids(5, 256, 8, generator=g).to(dev), 4, 256),
        ("an empty batch, E=4, block_m=4", torch.zeros(0, 2, dtype=torch.int32, device=dev), 4, 4),
    ]


def _as_int(value, what: str) -> int:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise Fail(f"{what}: expected one number (a [1] tensor or an int), got shape {tuple(value.shape)}")
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise Fail(f"{what}: expected an integer (a [1] int32 tensor or an int), got {value.dtype}: it is a "
                       "row count, and the kernel compares it with integer row indices")
        return int(value.reshape(-1)[0])
    if isinstance(value, float) or not hasattr(value, "__index__"):
        raise Fail(f"{what}: expected an integer (a [1] int32 tensor or an int), got {type(value).__name__}")
    try:
        return int(value)
    except Exception:  # noqa: BLE001  (an object that claims to be an integer and is not)
        raise Fail(f"{what}: expected an integer (a [1] int32 tensor or an int), got {type(value).__name__}") from None


def _as_list(value, what: str) -> list[int]:
    if not isinstance(value, torch.Tensor) or value.dim() != 1 or value.is_floating_point() or value.is_complex() \
            or value.dtype == torch.bool:
        got = f"shape {tuple(value.shape)} {value.dtype}" if isinstance(value, torch.Tensor) else type(value).__name__
        raise Fail(f"{what}: expected a 1-D integer tensor, got {got}")
    if value.dtype not in (torch.int32, torch.int64):
        raise Fail(f"{what}: expected an int32 (or int64) tensor, got {value.dtype}: the kernel loads it as int32 "
                   f"indices, and {value.dtype} holds only {torch.iinfo(value.dtype).min} to "
                   f"{torch.iinfo(value.dtype).max} (DeepSeek-V3 has 256 experts, and a batch many more pairs)")
    return value.tolist()


def _expect_alignment(got, ids: torch.Tensor, block_m: int, E: int) -> None:
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        raise Fail("expected a triple (sorted_token_ids, expert_ids, num_tokens_post_padded), "
                   f"got {type(got).__name__}")
    flat = ids.reshape(-1).tolist()
    num_pairs, topk = len(flat), ids.shape[1]
    sentinel = num_pairs
    counts = torch.bincount(ids.reshape(-1).long().cpu(), minlength=E).tolist()
    padded = [-(-c // block_m) * block_m for c in counts]
    post = _as_int(got[2], "num_tokens_post_padded")
    rows, labels = _as_list(got[0], "sorted_token_ids"), _as_list(got[1], "expert_ids")
    if post % block_m:
        raise Fail(f"num_tokens_post_padded = {post} is not a multiple of block_m = {block_m}: every run is "
                   "padded to one")
    if len(rows) < post or len(labels) < post // block_m:
        raise Fail(f"num_tokens_post_padded = {post} rows, but sorted_token_ids has {len(rows)} entries and "
                   f"expert_ids {len(labels)} (one per block of {block_m} rows)")
    rows, labels = rows[:post], labels[:post // block_m]

    for i, r in enumerate(rows):
        if r != sentinel and not 0 <= r < num_pairs:
            raise Fail(f"sorted_token_ids[{i}] = {r} is neither a pair (0..{num_pairs - 1}) nor the padding "
                       f"sentinel M * topk = {sentinel}: pad with the sentinel, a row the kernel can mask")
    seen = Counter(r for r in rows if r != sentinel)
    twice = sorted(p for p, c in seen.items() if c > 1)
    if twice:
        p = twice[0]
        raise Fail(f"pair {p} (token {p // topk}, slot {p % topk}) appears {seen[p]} times in sorted_token_ids. "
                   f"If those are padding rows, pad with the sentinel M * topk = {sentinel} instead: {p} is a real "
                   "pair, and the kernel would compute it again")
    missing = [p for p in range(num_pairs) if p not in seen]
    if missing:
        raise Fail(f"pairs {ranges(missing)} are missing from the first num_tokens_post_padded = {post} rows "
                   "of sorted_token_ids: every (token, slot) pair must appear exactly once")
    for b, e in enumerate(labels):
        if not 0 <= e < E:
            raise Fail(f"expert_ids[{b}] = {e} is not an expert (0..{E - 1}), yet block {b} is below "
                       f"num_tokens_post_padded = {post}")
        for i in range(b * block_m, (b + 1) * block_m):
            r = rows[i]
            if r != sentinel and flat[r] != e:
                raise Fail(f"block {b} (rows {b * block_m}..{(b + 1) * block_m - 1}) is labelled expert {e} in "
                           f"expert_ids, but row {i} holds pair {r} (token {r // topk}, slot {r % topk}), which chose "
                           f"expert {flat[r]}: each block must hold pairs of its one expert")
    have = Counter(labels)
    for e in range(E):
        got_rows = have[e] * block_m
        if got_rows == padded[e]:
            continue
        text = f"expert {e} has {counts[e]} pairs, so its run is {padded[e]} rows; yours is {got_rows}"
        if counts[e] == 0:
            text += ": an expert nobody chose needs no block at all"
        elif counts[e] % block_m == 0 and got_rows == padded[e] + block_m:
            text += (f": {counts[e]} is already a multiple of block_m = {block_m}; round up with "
                     "(count + block_m - 1) // block_m * block_m, which leaves multiples alone")
        raise Fail(text)
    if post != sum(padded):
        raise Fail(f"num_tokens_post_padded: expected {sum(padded)} (the runs {padded}), got {post}")


def check_align(fn) -> bool:
    """Exercise 4.1: ``fn(topk_ids, block_m, num_experts) -> (sorted_token_ids, expert_ids, num_tokens_post_padded)``.

    Checked as the kernel needs it, not against one fixed order: in the first
    ``num_tokens_post_padded`` rows every pair appears once, padding rows hold ``M * topk``,
    block ``b``'s rows all belong to ``expert_ids[b]``, and each expert's run is its count
    rounded up to a multiple of ``block_m``.
    """
    def body():
        cases = _align_cases()
        for label, ids, block_m, E in cases:
            with on(f"{label}, topk_ids = {ids.tolist()}" if ids.numel() <= 12 else label):
                got = call_student(fn, ids, block_m, E, names=("topk_ids", "block_m", "num_experts"))
                _expect_alignment(got, ids, block_m, E)
        return (f"right on all {len(cases)} cases (an empty expert, a count that is already a multiple, "
                "block_m = 1, E = 64 and 256, an empty batch).")
    return run_check("4.1", body)


# --------------------------------------------------------------------------- 4.2
def _expect_order(fn, num_pid_m: int, num_pid_n: int, group_m: int) -> None:
    got = {}
    for pid in range(num_pid_m * num_pid_n):
        out = call_student(fn, pid, num_pid_m, num_pid_n, group_m)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise Fail(f"pid {pid}: expected a pair (pid_m, pid_n), got {out!r}")
        try:
            pm, pn = (_as_int(v, "pid_m" if i == 0 else "pid_n") for i, v in enumerate(out))
        except Fail as e:
            raise Fail(f"pid {pid}: {e}") from None
        if not (0 <= pm < num_pid_m and 0 <= pn < num_pid_n):
            text = f"pid {pid} maps to (pid_m={pm}, pid_n={pn}), outside the {num_pid_m} x {num_pid_n} grid of tiles"
            first_m = pid // (group_m * num_pid_n) * group_m
            if pm >= num_pid_m and num_pid_m - first_m < group_m:
                text += (f": the last group has only {num_pid_m - first_m} row blocks, not GROUP_M = {group_m}; "
                         "use group_rows = min(num_pid_m - first_m, GROUP_M)")
            raise Fail(text)
        got[pid] = (pm, pn)
    by_tile = {}
    for pid, tile in got.items():
        if tile in by_tile:
            raise Fail(f"pids {by_tile[tile]} and {pid} both map to tile {tile}: it is computed twice and "
                       "another tile never")
        by_tile[tile] = pid
    want = {pid: pid_to_tile(pid, num_pid_m, num_pid_n, group_m) for pid in got}
    if got == want:
        return
    pid = next(p for p in got if got[p] != want[p])
    text = f"every tile is covered once, but pid {pid} should be {want[pid]}, got {got[pid]}"
    per_group = group_m * num_pid_n
    first_pid, first_m = pid // per_group * per_group, pid // per_group * group_m
    rows = min(num_pid_m - first_m, group_m)
    if all(got[p] == divmod(p, num_pid_n) for p in got):
        text += (": that is plain row-major order. Walk GROUP_M row blocks down before moving right, so the "
                 "programs running together share columns of weights")
    elif rows < group_m and first_m > 0 and all(got[p] == want[p] for p in range(first_pid)):
        # Only the last, short group is wrong, and it is not the first: its pids start at a multiple of
        # GROUP_M * num_pid_n, not of its own height, so counting from pid 0 shifts its rows.
        text += (f": every group before it is right. pid {pid} is in the last group, which starts at pid "
                 f"{first_pid} (row block {first_m}) and has only {rows} row blocks, not GROUP_M = {group_m}: "
                 f"count inside the group, pid_m = first_pid_m + (pid % (GROUP_M * num_pid_n)) % group_rows and "
                 "pid_n = (pid % (GROUP_M * num_pid_n)) // group_rows, with group_rows = min(num_pid_m - "
                 "first_pid_m, GROUP_M)")
    raise Fail(text)


def check_grouped_pid(fn) -> bool:
    """Exercise 4.2: ``fn(pid, num_pid_m, num_pid_n, group_m) -> (pid_m, pid_n)`` in grouped order."""
    def body():
        # (5, 3, 3): a last group of 2 row blocks (neither 1 nor GROUP_M) that starts at pid 9, not a
        # multiple of 2: counting its rows from pid 0 instead of from the group's first pid shows only there.
        grids = [(5, 3, 2), (7, 4, 3), (4, 4, 4), (3, 5, 8), (6, 2, 1), (1, 1, 1), (5, 3, 3)]
        for grid in grids:
            with on("num_pid_m={}, num_pid_n={}, GROUP_M={}".format(*grid)):
                _expect_order(fn, *grid)
        return (f"right on all {len(grids)} grids (short last groups of 1 and 2 row blocks, GROUP_M = 1, "
                "GROUP_M > num_pid_m).")
    return run_check("4.2", body)


# --------------------------------------------------------------------------- 4.3 and 4.4
#: Hints for an out-of-range access, by the input it reached past or else the kernel's pointer
#: argument, matched by whole words (``out`` matches ``out_ptr``, not ``router_ptr``).
_SORTED_HINTS = [
    (("topk_weights", "router", "routing", "rw", "topk_w", "gate", "scales"),
     "the router-weight load reached past topk_weights: it has M * topk entries, one per pair; mask padding rows "
     "(pair < M * topk)."),
    (("out", "output", "o", "c", "y", "dst", "result", "res"),
     "the store reached past the output: padding rows hold the sentinel M * topk, one row past the last "
     "pair; mask the store with (pair < M * topk) & (n < N)."),
    (("x", "a", "inp", "input", "hidden", "hidden_states", "act", "tokens"),
     "padding rows hold the sentinel M * topk, so pair // topk = M is one row past x: mask the A load "
     "with pair < M * topk (and k < K on the last K block). Blocks at or past num_tokens_post_padded hold "
     "no rows at all: return before loading anything for them."),
    (("weight", "weights", "w", "b", "w1", "w13", "wt"),
     "a weight load out of range: blocks past num_tokens_post_padded have expert -1, so exit early for "
     "them; the offset is expert * stride_we + n * stride_wn + k * stride_wk, masked with k < K."),
    (("sorted", "expert", "ids", "id", "num", "post"),
     "the grid covers cdiv(len(sorted_token_ids), BLOCK_M) blocks: row and block indices must stay below that."),
]


def sorted_pointer_hint(arg: str) -> str:
    """The hint for an out-of-range access through the kernel argument called ``arg``."""
    return hint_by_name(_SORTED_HINTS, arg)


def _sorted_problems(weighted: bool):
    return kernel_problems(weighted=weighted) + [
        random_first_gemm(5, 40, 72, 5, 3, seed=11, label="topk = 3, K = 72", weighted=weighted)]


def check_sorted_matmul(fn) -> bool:
    """Exercise 4.3: the sorted kernel's launcher ``fn(x, weight, topk_ids) -> [M, topk, N]``; in the
    interpreter also on 3.4's weight whose expert offsets pass 2**31 and 2**32 (:mod:`.big_stride`)."""
    return check_first_gemm_fn("4.3", fn, _sorted_problems(False), kernel_tolerance(), hints=sorted_pointer_hint,
                               then=big_stride_check)


def check_router_epilogue(fn) -> bool:
    """Exercise 4.4: ``fn(x, weight, topk_ids, topk_weights)``: each output row times its pair's router weight."""
    return check_first_gemm_fn("4.4", fn, _sorted_problems(True), kernel_tolerance(), hints=sorted_pointer_hint,
                               weighted=True)
