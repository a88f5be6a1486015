"""Checkers for Part 8, training: the router gradient, and one tile of a weight gradient."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..examples import worked_example
from ..kernels.stable_align import expert_rows, stable_align_block_size
from ..reference import reference_layer_grads, rel_error
from ..shapes import random_layer_problem
from .feedback import Fail, call_student, on, run_check

#: Both checkers compare by relative error: some problems have values near 1e-5, where an absolute
#: tolerance would pass a wrong answer.
TOLERANCE = 1e-5


def _as_tensor(out, shape: tuple, what: str) -> torch.Tensor:
    if not isinstance(out, torch.Tensor):
        raise Fail(f"expected a tensor {what} of shape {shape}, got {type(out).__name__}")
    if tuple(out.shape) != shape:
        hint = " (one number per (token, slot) pair, [M, topk], not flat)" if out.numel() == torch.Size(shape).numel() \
            else ""
        raise Fail(f"expected {what} of shape {shape}, got {tuple(out.shape)}{hint}")
    if not out.is_floating_point():
        raise Fail(f"expected a floating-point {what}, got {out.dtype}")
    return out.detach().double()


# --------------------------------------------------------------------------- 8.1
def _router_problems():
    ex = worked_example(torch.float32)
    worked = dict(x=ex.x, w13=ex.w13, w2=ex.w2, topk_weights=ex.topk_weights, topk_ids=ex.topk_ids,
                  d_out=torch.ones(2, 3))
    return [
        ("K = I = 16 (a square W2)", random_layer_problem(5, 16, 16, 3, 2, seed=7)),
        ("the worked example, dO all ones", worked),
        ("M=7, K=40, I=24, E=5, topk=2", random_layer_problem(7, 40, 24, 5, 2, seed=1)),
        ("topk = 1, M=9, K=32, I=16, E=4", random_layer_problem(9, 32, 16, 4, 1, seed=2)),
        ("x near 1e-5 (so is every gate; dS near 1e-10)", random_layer_problem(6, 32, 16, 4, 2, seed=5, x_scale=1e-5)),
    ]


def _router_variants(p: dict) -> dict:
    """The usual wrong answers, computed in float64: what each one would return on problem ``p``."""
    x, w13, w2, ids, d_out = (p[k].double() if p[k].is_floating_point() else p[k]
                              for k in ("x", "w13", "w2", "topk_ids", "d_out"))
    inter = w2.shape[2]
    out = {k: torch.zeros(ids.shape, dtype=torch.float64) for k in ("no silu", "halves swapped", "w2 transposed",
                                                                      "sigmoid")}
    for t in range(ids.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            h = w13[e] @ x[t]
            g, u = h[:inter], h[inter:]
            d_act = w2[e].T @ d_out[t]
            out["no silu"][t, k] = d_act @ (g * u)
            out["halves swapped"][t, k] = d_act @ (F.silu(u) * g)
            out["sigmoid"][t, k] = d_act @ (torch.sigmoid(g) * u)
            if w2.shape[1] == inter:
                out["w2 transposed"][t, k] = (w2[e] @ d_out[t]) @ (F.silu(g) * u)
    if w2.shape[1] != inter:
        del out["w2 transposed"]
    return out


_ROUTER_HINTS = {
    "no silu": "your dS uses gate * up for A: A is silu(gate) * up, the activation the down GEMM multiplies",
    "halves swapped": "your dS takes the second half of H as the gate: w13 holds the gate rows first, then the up "
                      "rows (H[:I] is the gate, H[I:] the up)",
    "w2 transposed": "your dA' multiplies W2[e] by dO: dA' = W2[e]^T dO_t (w2 is [E, K, I]; dA' has I values, one "
                     "per column of W2[e])",
    "sigmoid": "your dS uses sigmoid(gate) * up: silu(gate) = gate * sigmoid(gate)",
}


def check_router_grad(fn) -> bool:
    """Exercise 8.1: ``fn(x [M, K], w13 [E, 2I, K], w2 [E, K, I], topk_ids [M, topk], d_out [M, K]) ->
    dS [M, topk]``, the gradient of the loss with respect to each router weight, ``<dA', A>``."""
    def body():
        problems = _router_problems()
        for what, p in problems:
            with on(what):
                ref = reference_layer_grads(p["x"], p["w13"], p["w2"], p["topk_weights"], p["topk_ids"],
                                            p["d_out"])["topk_weights"]
                out = call_student(fn, p["x"], p["w13"], p["w2"], p["topk_ids"], p["d_out"],
                                   names=("x", "w13", "w2", "topk_ids", "d_out"))
                got = _as_tensor(out, tuple(ref.shape), "dS")
                err = rel_error(got, ref)
                if err <= TOLERANCE:
                    continue
                s = p["topk_weights"].double()
                if rel_error(got, ref * s) < 1e-4:
                    raise Fail("your dS is the right one times the router weight s: dS = <dO, Y> has no s in it "
                               "(s multiplies Y in the forward; its own gradient is what Y contributes)")
                for name, wrong in _router_variants(p).items():
                    if rel_error(got, wrong) < 1e-4:
                        raise Fail(_ROUTER_HINTS[name] + f" (relative error {err:.1e})")
                raise Fail(f"relative error {err:.2e} against autograd through the float64 reference (allowed "
                           f"{TOLERANCE:g}): dS[t, k] = <dA', A> with dA' = W2[e]^T dO_t and A = silu(gate) * up of "
                           f"H = W13[e] x_t, e = topk_ids[t, k]")
        return (f"right on all {len(problems)} problems (a square W2, the worked example, topk = 1, values near "
                "1e-5), by relative error.")
    return run_check("8.1", body)


# --------------------------------------------------------------------------- 8.2
def _tile_problem(M, K, inter, E, topk, seed, experts=None):
    """A layer, its stable alignment (block_m 4), dO and s * A in sorted rows (padding rows zero),
    and the float64 reference dW2."""
    p = random_layer_problem(M, K, inter, E, topk, seed=seed, experts=experts)
    alignment = stable_align_block_size(p["topk_ids"], 4, E)
    sorted_ids = alignment[0].clone()
    s_act = torch.zeros(sorted_ids.numel(), inter)
    for r, pair in enumerate(sorted_ids.tolist()):
        if pair < M * topk:
            t, k = divmod(pair, topk)
            e = int(p["topk_ids"][t, k])
            h = (p["w13"][e].double() @ p["x"][t].double())
            s_act[r] = (p["topk_weights"][t, k].double() * F.silu(h[:inter]) * h[inter:]).float()
    ref = reference_layer_grads(p["x"], p["w13"], p["w2"], p["topk_weights"], p["topk_ids"], p["d_out"])["w2"]
    return p, sorted_ids, s_act, expert_rows(alignment).tolist(), ref


def _tile_cases():
    p1 = _tile_problem(9, 40, 24, 3, 2, seed=4)
    p2 = _tile_problem(7, 32, 16, 4, 1, seed=6)
    p3 = _tile_problem(6, 24, 16, 4, 2, seed=8, experts=3)            # expert 3 gets no pair
    # Expert 0 of p1 has 6 pairs in a run of 8 rows, expert 3 of p2 one pair in 4: runs with padding.
    return [("M=9, K=40, I=24, E=3, topk=2: an inner tile of expert 0 (6 pairs, 2 padding rows)", p1, 0, 16, 0),
            ("the same: the last tile of expert 2, cut at K = 40 and I = 24", p1, 2, 32, 16),
            ("topk = 1, M=7, K=32, I=16, E=4: expert 3's first tile (1 pair, 3 padding rows)", p2, 3, 0, 0),
            ("an expert that received no pair (expert 3)", p3, 3, 16, 0)]


def check_dw2_tile(fn) -> bool:
    """Exercise 8.2: ``fn(d_out [M, K], s_act [rows, I], sorted_ids [rows], start, end, topk, p0, q0, block)
    -> tile``: rows ``p0:p0 + block`` and columns ``q0:q0 + block`` (cut at K and I) of ``dW2[e]``, the sum
    over the sorted rows ``start:end`` of expert e's run of ``outer(d_out[pair // topk], s_act[row])``."""
    def body():
        cases = _tile_cases()
        block = 16
        for what, (p, sorted_ids, s_act, rows, ref), e, p0, q0 in cases:
            with on(what):
                M, topk = p["topk_ids"].shape
                start, end = rows[e], rows[e + 1]
                want = ref[e, p0:p0 + block, q0:q0 + block]
                try:
                    out = call_student(fn, p["d_out"], s_act, sorted_ids, start, end, topk, p0, q0, block,
                                       names=("d_out", "s_act", "sorted_ids", "start", "end", "topk", "p0", "q0",
                                              "block"))
                except Fail as e:
                    if "IndexError" in str(e) or "out of bounds" in str(e):
                        raise Fail(f"{e}\nd_out has M = {M} rows, one per token: pair p's row is p // topk; the "
                                   f"run's padding rows hold M * topk = {M * topk} and have no row: skip them") \
                            from None
                    if "must match the size" in str(e):
                        raise Fail(f"{e}\nthe tile is cut where dW2 [K, I] = {tuple(ref.shape[1:])} ends: "
                                   "min(block, K - p0) rows and min(block, I - q0) columns") from None
                    raise
                if isinstance(out, torch.Tensor) and tuple(out.shape) == (block, block) != tuple(want.shape):
                    raise Fail(f"expected the tile cut at the edge of dW2 [K, I] = {tuple(ref.shape[1:])}: shape "
                               f"{tuple(want.shape)}, got {tuple(out.shape)}")
                if isinstance(out, torch.Tensor) and out.dim() == 2 and tuple(out.shape) == tuple(want.shape)[::-1] \
                        and want.shape[0] != want.shape[1]:
                    raise Fail(f"your tile is [I, K]-shaped {tuple(out.shape)}: dW2[e] is [K, I], rows from d_out's "
                               "columns, columns from s_act's: outer(d_out row, s_act row)")
                got = _as_tensor(out, tuple(want.shape), "the tile")
                err = rel_error(got, want)
                if err <= TOLERANCE:
                    continue
                raise Fail(_tile_diagnosis(got, p, sorted_ids, s_act, start, end, topk, p0, q0, block, err))
        return (f"right on all {len(cases)} tiles (inner, cut at both edges, topk = 1, an expert with no pair), "
                "by relative error.")
    return run_check("8.2", body)


def _tile_diagnosis(got, p, sorted_ids, s_act, start, end, topk, p0, q0, block, err) -> str:
    """Which usual mistake ``got`` is, from the same sum with one thing changed."""
    d_out = p["d_out"].double()
    M = d_out.shape[0]

    def tile(row_of_dout, row_of_act):
        acc = torch.zeros(got.shape, dtype=torch.float64)
        for r in range(start, end):
            pair = int(sorted_ids[r])
            if pair >= M * topk:
                continue
            a, b = row_of_dout(r, pair), row_of_act(r, pair)
            if a is None or b is None:
                return None
            acc += torch.outer(d_out[a, p0:p0 + block], s_act[b, q0:q0 + block].double())
        return acc

    tries = {
        "d_out's row is the token, pair // topk, not the pair": tile(
            lambda r, pair: pair if pair < M else None, lambda r, pair: r),
        "d_out has one row per token, pair // topk: not the sorted position": tile(
            lambda r, pair: r if r < M else None, lambda r, pair: r),
        "s_act is in sorted order: its row is the sorted position r, not the pair": tile(
            lambda r, pair: pair // topk, lambda r, pair: pair),
    }
    for why, wrong in tries.items():
        if wrong is not None and rel_error(got, wrong) < 1e-4:
            return f"{why} (relative error {err:.1e})"
    return (f"relative error {err:.2e} against autograd through the float64 reference: the tile is the sum over "
            f"r in [start, end) with sorted_ids[r] < M * topk of outer(d_out[sorted_ids[r] // topk, p0:p0 + block], "
            f"s_act[r, q0:q0 + block])")
