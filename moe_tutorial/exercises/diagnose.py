"""Turn "the output is wrong" into what is wrong: shape, unwritten elements, expert, token, tail.

Each ``expect_*`` function returns quietly when the student's result is right and raises
:class:`~moe_tutorial.exercises.feedback.Fail` with a message naming the first thing a
student can fix otherwise. Everything is compared with the float64 references.
"""
from __future__ import annotations

import torch

from ..activation import silu_and_mul
from ..kernels.interpreter import is_poison_nan
from ..reference import reference_moe_matmul, rel_error
from .feedback import Fail
from .guard import Recorder, never_written
from .problems import Problem


def ranges(indices) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0..2, 5, 7..8"``."""
    idx = sorted(int(i) for i in indices)
    parts, start = [], None
    for a, b in zip(idx, idx[1:] + [None]):
        start = a if start is None else start
        if b != a + 1:
            parts.append(f"{start}" if start == a else f"{start}..{a}")
            start = None
    return ", ".join(parts)


def _columns(cols) -> str:
    """``"column 7"`` or ``"columns 5..7"``."""
    return ("columns " if len(cols) > 1 else "column ") + ranges(cols)


def _named(shape, sizes: dict[str, int]) -> str:
    """``(5, 40, 2)`` -> ``"[M, N, topk]"`` when every size names one axis unambiguously."""
    by_size = {}
    for name, size in sizes.items():
        by_size.setdefault(size, []).append(name)
    if any(len(v) > 1 for v in by_size.values()) or any(s not in by_size for s in shape):
        return ""
    return "[" + ", ".join(by_size[s][0] for s in shape) + "]"


def expect_tensor(out, *, what: str, sizes: dict[str, int], dtype: torch.dtype | None = None,
                  device: torch.device | None = None) -> None:
    """``out`` must be a tensor of shape ``tuple(sizes.values())`` (named axes), dtype, device."""
    shape = tuple(sizes.values())
    layout = "[" + ", ".join(sizes) + "]"
    if not isinstance(out, torch.Tensor):
        raise Fail(f"{what}: expected a torch.Tensor of shape {layout} = {shape}, got {type(out).__name__}")
    got = tuple(out.shape)
    if got != shape:
        msg = f"{what} has the wrong shape: expected {layout} = {shape}, got {got}"
        named = _named(got, sizes)
        ones = [name for name, size in sizes.items() if size == 1]
        if len(got) == len(shape) and sorted(got) == sorted(shape) and named:
            msg += f" = {named}: the axes are in the wrong order"
        elif len(got) == len(shape) and sorted(got) == sorted(shape):
            # Sizes that coincide (M = topk = N) cannot tell which axes moved: say so, do not guess a reshape.
            msg += ": the same sizes in another order, so an axis is out of place (or a reshape is missing)"
        elif len(got) == len(shape) + 1 and tuple(s for s in got if s != 1) == tuple(s for s in shape if s != 1):
            msg += ": an extra axis of size 1 (squeeze it)"
        elif len(got) < len(shape) and ones and got == tuple(s for s in shape if s != 1):
            msg += (f": the axes of size 1 are missing (here {' = '.join(ones)} = 1). A bare .squeeze() drops every "
                    "axis of size 1; name the one you mean (.squeeze(-1)), or index it away ([..., 0])")
        elif out.numel() == torch.Size(shape).numel():
            msg += f": the right number of elements, so a reshape to {layout} is missing"
        raise Fail(msg)
    if dtype is not None and out.dtype != dtype:
        msg = f"{what}: expected dtype {dtype} (x's dtype), got {out.dtype}"
        if out.dtype == torch.get_default_dtype() or out.dtype == torch.float32:
            msg += (": a tensor created without dtype= (torch.zeros(...), torch.empty(...)) is float32 whatever x is. "
                    "Create it with dtype=x.dtype and device=x.device, or x.new_zeros(...) / x.new_empty(...), "
                    "or convert the result with .to(x.dtype)")
        raise Fail(msg)
    if device is not None and out.device != device:
        raise Fail(f"{what}: expected it on x's device {device}, got {out.device}: a tensor created without "
                   "device= lives on the CPU. Create it with device=x.device, or x.new_zeros(...) / x.new_empty(...)")


def expect_integer(t, what: str) -> None:
    """``t`` must be a tensor of an integer dtype (indices, counts), not floats or bools."""
    if not isinstance(t, torch.Tensor):
        raise Fail(f"{what}: expected a tensor of integers, got {type(t).__name__}")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise Fail(f"{what}: expected an integer tensor (indices), got {t.dtype}: indices and counts stay integers "
                   "(torch.where, nonzero, arange and bincount give int64); drop the conversion to floats")


def expect_index_dtype(t: torch.Tensor, what: str) -> None:
    """An integer tensor ``t`` must be int64 or int32, the dtypes that index as indices."""
    if t.dtype in (torch.int64, torch.int32):
        return
    if t.dtype == torch.uint8:
        raise Fail(f"{what}: expected int64 (or int32) indices, got torch.uint8: torch reads a uint8 tensor used as "
                   "an index as a mask (x[idx] picks the rows where idx is nonzero), not as indices. Keep the int64 "
                   "torch.where gives, or convert with .long()")
    raise Fail(f"{what}: expected int64 (or int32) indices, got {t.dtype}: torch refuses it as an index "
               f"(x[idx] takes int64, int32 or a bool mask), and {t.dtype} holds only up to "
               f"{torch.iinfo(t.dtype).max}. Keep the int64 torch.where gives, or convert with .long()")


# --------------------------------------------------------------------------- first GEMM
def expect_first_gemm(out, problem: Problem, tol: float, recorder: Recorder | None = None) -> None:
    """``out`` must equal ``problem.first_gemm_reference()`` ``[M, topk, N]`` within ``tol``.

    ``recorder``: what the student's kernels did (loads without ``other=``), to explain NaN.
    """
    exp = problem.first_gemm_reference()
    M, topk, N = exp.shape
    expect_tensor(out, what="your output", sizes={"M": M, "topk": topk, "N": N}, dtype=problem.x.dtype,
                  device=problem.x.device)
    if out.numel() == 0:
        return
    o = out.detach().double()
    nan = torch.isnan(o)
    if nan.any():
        unwritten = never_written(out).to(nan.device)
        raise Fail(masked_lane_nan(out, recorder)
                   or (_unwritten(unwritten, problem, recorder) if unwritten.any() else _computed_nan(nan))
                   + _no_other_note(recorder))
    if not torch.isfinite(o).all():
        m, j, n = (int(i) for i in torch.nonzero(~torch.isfinite(o))[0])
        raise Fail(f"out[{m}, {j}, {n}] is {o[m, j, n].item()}: an overflow, or a load from memory that was "
                   "never written")
    err = rel_error(o, exp)
    if err > tol:
        raise Fail(_wrong_pairs(o, exp, problem, tol, err))


def masked_lane_nan(out: torch.Tensor, recorder: Recorder | None) -> str:
    """The message for NaN that came from masked-off lanes of a load without ``other=``, or ``""``."""
    poisoned = is_poison_nan(out)
    if not poisoned.any():
        return ""
    where = f" (your kernel loads {recorder.no_other_text()} that way)" if recorder and recorder.no_other else ""
    return (f"{int(poisoned.sum())} of {out.numel()} output elements are NaN computed from the masked-off lanes of "
            f"a tl.load without other={where}. On a GPU those lanes hold whatever the registers held; the checker "
            "fills them with NaN. Give the load other=0.0, so that a lane past the end of K adds 0 to the sum.")


def _no_other_note(recorder: Recorder | None) -> str:
    if recorder is None or not recorder.no_other:
        return ""
    return (f"\nYour kernel also loads {recorder.no_other_text()} with a mask and no other=: those lanes are "
            "undefined on a GPU (NaN here), so if they reach the result, give the load other=0.0.")


def _computed_nan(nan: torch.Tensor) -> str:
    """NaN that the student's code wrote (not the checker's fill): where, and where NaN comes from."""
    m, j, n = (int(i) for i in torch.nonzero(nan)[0])
    return (f"{int(nan.sum())} of {nan.numel()} output elements are NaN, for example out[{m}, {j}, {n}], yet your code "
            "wrote them (they do not hold the NaN the checker fills new tensors with): the NaN was computed. One NaN "
            "term makes its whole sum NaN. Look for a load whose other= is NaN (masked-off lanes must add 0: "
            "other=0.0), a NaN kept as a guard or placeholder (tl.where(ok, v, float('nan')) that reaches the "
            "sum), 0 / 0 or inf - inf, or a read of memory nobody wrote.")


def _swapped_pids(tokens: torch.Tensor, M: int, recorder: Recorder | None) -> str:
    """When only tokens 0..T-1 were written and the grid has M programs on one axis and T on another,
    the token is read from the wrong axis: say so, with the grid."""
    grids = [g for g in (recorder.grids if recorder else []) if g]
    if not grids:
        return ""
    grid = grids[-1]
    written = M - int(tokens.sum())
    if tokens[:written].any() or not tokens[written:].all():
        return ""
    axes = [a for a, size in enumerate(grid) if size == M]
    other = [b for b, size in enumerate(grid) if size == written and b not in axes]
    shown = tuple(grid[:2]) if grid[2] == 1 else tuple(grid)
    if not axes or not other:
        return f" Your kernel ran on a grid of {shown} programs."
    a, b = axes[0], other[0]
    return (f" Your kernel ran on a grid of {shown} programs: axis {a} has the M = {M} programs, yet exactly the "
            f"first {written} tokens, as many as axis {b} has programs, were written. The program ids are swapped: "
            f"pid_m must be tl.program_id(axis={a}), the axis where your grid puts the tokens (and pid_n the other).")


def _unwritten(nan: torch.Tensor, problem: Problem, recorder: Recorder | None = None) -> str:
    M, topk, N = nan.shape
    head = (f"{int(nan.sum())} of {nan.numel()} output elements were never written "
            "(they still hold the NaN the checker fills new tensors with)")
    if nan.all():
        return head + ": nothing was written. Did the kernel run, and do you return the tensor it wrote into?"

    def whole(axis: int) -> torch.Tensor:        # [size of axis]: every element along it unwritten
        return nan.movedim(axis, 0).flatten(1).all(1)

    def only(axis: int, full: torch.Tensor) -> bool:
        return bool(full.any()) and not nan.movedim(axis, 0)[~full].any()

    tokens, slots, cols = whole(0), whole(1), whole(2)
    if only(0, tokens):
        text = head + f": tokens {ranges(tokens.nonzero().flatten())}, all of them."
        swapped = _swapped_pids(tokens.cpu(), M, recorder)
        if "swapped" in swapped:
            return text + swapped
        return text + f" Does your grid (or loop) cover all M = {M} tokens?" + swapped
    if only(1, slots):
        return head + (f": slot(s) {ranges(slots.nonzero().flatten())} of every token. Each of the topk = {topk} "
                       "experts of a token needs its own BLOCK_N columns of the tile, and the store must reach them.")
    if only(2, cols):
        c = cols.nonzero().flatten().tolist()
        if c[-1] == N - 1 and c == list(range(c[0], N)):
            return head + (f": {_columns(c)} (the last) of every token and slot, that is the last, "
                           f"partial block of N = {N}. Is the grid cdiv(N, BLOCK_N), and is the store's mask n < N?")
        return head + f": {_columns(c)} of every token and slot."
    m, j = (int(i) for i in torch.nonzero(nan.any(-1))[0])
    e = int(problem.topk_ids[m, j])
    return head + (f", for example out[{m}, {j}, columns {ranges(nan[m, j].nonzero().flatten())}] "
                   f"(token {m}, slot {j}, expert {e}).")


def _close(a: torch.Tensor, b: torch.Tensor, thr: float) -> torch.Tensor:
    """All-close along the last axis."""
    return ((a - b).abs() <= thr).all(-1)


def _wrong_pairs(o, exp, problem: Problem, tol: float, err: float) -> str:
    M, topk, N = exp.shape
    rms = exp.pow(2).mean().sqrt().clamp_min(1e-30).item()
    thr = max(20 * tol, 1e-4) * rms
    bad = (o - exp).abs() > thr
    head = f"relative error {err:.3g} (allowed {tol:g})"
    if not bad.any():
        return head + (": small errors everywhere, none large. Do you accumulate in float32 "
                       "(tl.zeros(..., dtype=tl.float32))?")
    bad_pair = bad.any(-1)
    head = f"{int(bad_pair.sum())} of {M * topk} (token, slot) pairs are wrong, {head}"
    ids = problem.topk_ids.long()
    x = problem.x.double()
    weight = (problem.weight if problem.compact_weight is None else problem.compact_weight).double()
    scale = torch.ones(M, topk, dtype=torch.float64, device=exp.device) if problem.topk_weights is None \
        else problem.topk_weights.double()
    m, j = (int(i) for i in bad_pair.nonzero()[0])
    e = int(ids[m, j])
    where = f"token {m}'s slot {j}"
    for detail in (_low_precision_detail, _transposed_detail, _weights_detail, _expert_detail, _token_detail,
                   _moved_detail, _column_detail, _k_loop_detail, _k_tail_detail, _factor_detail):
        try:
            text = detail(o=o, exp=exp, problem=problem, x=x, weight=weight, scale=scale, ids=ids,
                          bad=bad, bad_pair=bad_pair, thr=thr, m=m, j=j, e=e, where=where)
        except Exception:  # noqa: BLE001  (a diagnosis that does not apply must not hide the plain message)
            text = ""
        if text:
            return head + ".\n" + text
    n = int(bad[m, j].nonzero()[0])
    return head + (f".\n{where} (expert {e}), column {n}: expected {exp[m, j, n].item():.5g}, "
                   f"got {o[m, j, n].item():.5g}. "
                   f"Wrong columns of this pair: {ranges(bad[m, j].nonzero().flatten())}.")


def _low_precision_detail(*, o, exp, problem, x, weight, scale, ids, **_):
    """A sum kept in x's 16-bit dtype: every error within a few roundings of the running sum's size."""
    dtype = problem.x.dtype
    if dtype not in (torch.float16, torch.bfloat16):
        return ""
    # |x| @ |w|: how large a partial sum of each output can get, whatever the order of the terms.
    reach = torch.einsum("mk,mjnk->mjn", x.abs(), weight[ids].abs()) * scale.abs()[..., None]
    eps = torch.finfo(dtype).eps
    if not ((o - exp).abs() <= 4 * eps * reach).all():
        return ""
    name = str(dtype).replace("torch.", "")
    return (f"every error is within a few {name} roundings of the partial sums, which here can reach "
            f"{reach.max().item():.0f} while the results are about {exp.abs().mean().item():.0f}: the sum is kept "
            f"in {name}. Accumulate in float32 (acc = tl.zeros(..., dtype=tl.float32), acc = tl.dot(a, b, acc) or "
            "acc += ...) and convert to x's dtype only in the store.")


def _transposed_detail(*, o, exp, thr, **_):
    # Square problems (the worked example) hide a swapped axis from the shape check.
    for perm, names in (((0, 2, 1), "[M, N, topk]"), ((1, 0, 2), "[topk, M, N]")):
        if o.permute(*perm).shape == exp.shape and _close(o.permute(*perm), exp, thr).all():
            return f"your output is laid out as {names}: the axes are in the wrong order, it must be [M, topk, N]."
    return ""


def _weights_detail(*, o, exp, problem, scale, bad_pair, thr, m, j, where, **_):
    if problem.topk_weights is None:
        return ""
    plain = exp / scale[..., None]                           # the product without router weights
    if _close(o, plain, thr)[bad_pair].all():
        return ("your values are the products without the router weights: multiply each output row "
                "by topk_weights[m, j] in the epilogue.")
    renormed = plain * (scale / scale.sum(-1, keepdim=True))[..., None]
    if _close(o, renormed, thr)[bad_pair].all():
        return ("your router weights were divided by their sum: use topk_weights as given. A token's weights "
                "add up to 1 only when the router renormalised them; with renormalize=False (DeepSeek-V2) they do not.")
    u = plain[m, j]
    r = float((o[m, j] * u).sum() / (u * u).sum())
    if not _close(o[m, j], r * u, thr):
        return ""
    flat = scale.flatten()
    if abs(r - scale[m, j].item() ** 2) < 1e-4:
        return f"{where} is scaled by topk_weights[{m}, {j}] twice."
    hits = [p for p in range(flat.numel()) if abs(flat[p].item() - r) < 1e-5]
    if hits:
        p, topk = hits[0], scale.shape[1]
        text = (f"{where} is scaled by the router weight of pair {p} (token {p // topk}, slot {p % topk}), "
                f"not of pair {m * scale.shape[1] + j}.")
        if p == m:
            text += (" topk_weights has one weight per (token, slot) pair: index it with the pair m * topk + j, "
                     "not the token.")
        return text
    return f"{where} is scaled by {r:.4g}; its router weight is topk_weights[{m}, {j}] = {scale[m, j].item():.4g}."


def _expert_detail(*, o, x, weight, scale, ids, bad_pair, thr, m, j, e, where, **_):
    # What every expert would give for every pair: [M, topk, E, N].
    per_expert = torch.einsum("mk,enk->men", x, weight)[:, None] * scale[..., None, None]
    match = _close(o[:, :, None, :], per_expert, thr)          # [M, topk, E]
    hit = match[m, j].nonzero().flatten().tolist()
    if not hit or e in hit:
        return ""
    e2 = hit[0]
    text = f"{where} should use expert {e} = topk_ids[{m}, {j}], but your values are expert {e2}'s output."
    pairs = bad_pair.nonzero().tolist()
    found = {(a, b): match[a, b].nonzero().flatten().tolist() for a, b in pairs}
    if all(f and f[0] == int(ids[a, 0]) for (a, b), f in found.items()):
        return text + (" Every slot got slot 0's expert: the expert id of column j of the tile is topk_ids[m, j], "
                       "so the load must depend on the slot (topk_idx * stride).")
    if all(b in f for (a, b), f in found.items()):
        return text + " That is the slot number used as the expert id: look the expert up in topk_ids[m, j]."
    if all(f and f[0] == 0 for f in found.values()):
        return text + " Expert 0 everywhere: are the expert ids loaded at all (a masked load's other=0)?"
    others = [int(ids[m, jj]) for jj in range(ids.shape[1]) if jj != j]
    if e2 in others:
        return text + (f" That is the expert of another slot of token {m}: check how the slot picks its column "
                       "of topk_ids.")
    return text + (" topk_ids is [M, topk]: the expert of token m's slot j is topk_ids[m, j] (row stride, "
                   "column stride).")


def _token_detail(*, o, x, weight, scale, thr, m, j, e, where, **_):
    # The right expert, applied to another token's row of x.
    rows = torch.einsum("tk,nk->tn", x, weight[e]) * scale[m, j]           # [M, N]: expert e on every token
    hit = [t for t in _close(o[m, j][None], rows, thr).nonzero().flatten().tolist() if t != m]
    if not hit or _close(o[m, j], rows[m], thr):
        return ""
    return (f"{where} has the right expert {e} applied to token {hit[0]}'s row of x: check the row offset "
            "of x (the token, pid_m * stride_xm).")


def _moved_detail(*, o, exp, thr, m, j, where, **_):
    # Is this the right answer for another (token, slot): a wrong row of x, or stored in the wrong place?
    M, topk, N = exp.shape
    match = _close(o[m, j][None], exp.reshape(M * topk, N), thr).nonzero().flatten().tolist()
    match = [p for p in match if p != m * topk + j]
    if not match:
        return ""
    m2, j2 = divmod(match[0], topk)
    if j2 == j:
        return (f"{where} holds token {m2}'s result: check the row offset of x (the token) "
                "and of the output (pid_m * stride).")
    return (f"out[{m}, {j}] holds the result that belongs at out[{m2}, {j2}] (token {m2}, slot {j2}): "
            "check the output's strides (stride_om, stride_ot, stride_on) in the store.")


def _column_detail(*, bad, exp, **_):
    N = exp.shape[2]
    cols = bad.any(0).any(0).nonzero().flatten().tolist()
    if len(cols) == N:
        return ""
    if cols[-1] == N - 1 and cols == list(range(cols[0], N)):
        return (f"only {_columns(cols)} wrong, the rest right: that is the last, partial block "
                f"of N = {N}. Check the mask on n (n < N) in the loads and the store.")
    return f"only {_columns(cols)} wrong, the rest right."


def _k_loop_detail(*, o, x, weight, scale, ids, thr, problem, **_):
    """A K loop that overwrites acc, never advances k, or applies the router weight on every pass."""
    K = x.shape[1]
    for bk in (8, 16, 32, 64, 128):
        nb = -(-K // bk)
        if nb < 2:
            continue
        blocks = [torch.einsum("mk,mjnk->mjn", x[:, b * bk:(b + 1) * bk], weight[ids][..., b * bk:(b + 1) * bk])
                  for b in range(nb)]                                      # [M, topk, N] per K block
        s = scale[..., None]
        if _close(o, blocks[-1] * s, thr).all():
            return (f"your sums hold only the terms k = {(nb - 1) * bk}..{K - 1}, the last K block's: every pass "
                    "of the K loop replaces acc instead of adding to it. Accumulate: acc = tl.dot(a, b, acc) or "
                    "acc += ..., never acc = tl.dot(a, b).")
        if _close(o, nb * blocks[0] * s, thr).all():
            return (f"your sums are {nb} times the first K block's terms (BLOCK_K = {bk}): every pass of the K loop "
                    "reads the same first BLOCK_K columns. The offsets must move with the loop: "
                    "k = k0 + tl.arange(0, BLOCK_K) (or advance the pointers by BLOCK_K * stride each pass).")
        if problem.topk_weights is not None:
            repeated = sum(b * s ** (nb - i) for i, b in enumerate(blocks))
            if _close(o, repeated, thr).all():
                return (f"the router weight is applied inside the K loop (BLOCK_K = {bk}): acc is multiplied by it "
                        f"on every pass, so the first K block's terms end up times w**{nb}. Multiply once, "
                        "after the loop (or scale only the new block's product).")
    return ""


def _k_tail_detail(*, o, x, weight, scale, ids, thr, **_):
    K = x.shape[1]
    for kt in sorted({K - K % b for b in (2, 4, 8, 16, 32, 64, 128) if 0 < K - K % b < K}, reverse=True):
        partial = torch.einsum("mk,mjnk->mjn", x[:, :kt], weight[ids][..., :kt]) * scale[..., None]
        if _close(o, partial, thr).all():
            return (f"your sums stop at k = {kt}: the last {K - kt} of the K = {K} terms are missing. "
                    "The K loop must run to cdiv(K, BLOCK_K) blocks and mask the last one with k < K.")
    return ""


def _factor_detail(*, o, exp, thr, **_):
    c = float((o * exp).sum() / (exp * exp).sum())
    if abs(c - 1) > 1e-3 and _close(o, c * exp, thr).all():
        return f"every value is {c:.4g} times the right one."
    return ""


# --------------------------------------------------------------------------- the layer
_LAYER_VARIANTS = [
    ("without router weights", dict(weights="ones"),
     "your output is the layer without router weights: scale each expert's output by topk_weights[m, j] "
     "before summing over the slots."),
    ("silu on the up half", dict(act=lambda h: silu_and_mul(h.roll(h.shape[-1] // 2, dims=-1))),
     "silu is applied to the wrong half: w13 holds the gate rows first (w13[e, :I]), then the up rows; "
     "the activation is silu(gate) * up."),
    ("no silu", dict(act=lambda h: h[..., :h.shape[-1] // 2] * h[..., h.shape[-1] // 2:]),
     "the silu is missing: the activation is silu(gate) * up, not gate * up."),
    ("gelu", dict(act=lambda h: torch.nn.functional.gelu(h[..., :h.shape[-1] // 2]) * h[..., h.shape[-1] // 2:]),
     "the activation is gelu(gate) * up: this layer uses silu (x * sigmoid(x)), silu(gate) * up."),
    ("interleaved split", dict(act=lambda h: silu_and_mul(torch.cat([h[..., 0::2], h[..., 1::2]], -1))),
     "gate and up are split the wrong way: w13[e] holds the I gate rows first, then the I up rows "
     "(h[..., :I] and h[..., I:]), not alternating rows."),
    ("slot 0 only", dict(weights="first"),
     "only slot 0 of each token is in your sum: add the outputs of all topk experts of the token."),
    ("mean", dict(weights="mean"),
     "your output is the router-weighted mean, divided by topk: the layer sums the weighted outputs."),
    ("renormalised", dict(weights="renormalised"),
     "your router weights were divided by their sum: use topk_weights as given. A token's weights add up to 1 "
     "only when the router renormalised them; with renormalize=False (DeepSeek-V2) they do not."),
]


def _layer_variant(problem: Problem, act=silu_and_mul, weights: str = "as given") -> torch.Tensor:
    M, topk = problem.topk_ids.shape
    h = act(reference_moe_matmul(problem.x, problem.weight, problem.topk_ids))          # [M, topk, I]
    down = reference_moe_matmul(h.reshape(M * topk, -1), problem.w2.double(), problem.topk_ids.reshape(-1, 1))
    w = problem.topk_weights.double()
    if weights == "ones":
        w = torch.ones_like(w)
    elif weights == "first":
        w = torch.cat([w[:, :1], torch.zeros_like(w[:, 1:])], 1)
    elif weights == "mean":
        w = w / topk
    elif weights == "renormalised":
        w = w / w.sum(-1, keepdim=True)
    elif weights == "abs":      # no cancellation: how large the slots' terms and their partial sums get
        return (down.view(M, topk, -1) * w[..., None]).abs().sum(1)
    return (down.view(M, topk, -1) * w[..., None]).sum(1)


def expect_layer(out, problem: Problem, tol: float) -> None:
    """``out`` must equal the float64 layer ``[M, K]`` within ``tol``."""
    M, K = problem.x.shape
    expect_tensor(out, what="your output", sizes={"M": M, "K": K}, dtype=problem.x.dtype, device=problem.x.device)
    if out.numel() == 0:
        return
    exp = problem.layer_reference()
    o = out.detach().double()
    nan = torch.isnan(o)
    if nan.any():
        rows = nan.any(1).nonzero().flatten()
        raise Fail(f"rows {ranges(rows)} of your output hold NaN: never written (the checker fills new tensors "
                   "with NaN), or computed from memory that was never written. Start the sum from torch.zeros.")
    err = rel_error(o, exp)
    if err <= tol:
        return
    head = f"relative error {err:.3g} (allowed {tol:g})"
    # The known slip this output is closest to, if it is much closer to it than to the answer.
    fits = [(rel_error(o, _layer_variant(problem, **kwargs)), text) for _, kwargs, text in _LAYER_VARIANTS
            if not (problem.topk == 1 and kwargs.get("weights") in ("first", "mean"))]
    best, text = min(fits, key=lambda f: f[0])
    if best <= 10 * tol and best < 0.1 * err:
        raise Fail(f"{head}: {text}")
    rms = exp.pow(2).mean().sqrt().item()
    thr = max(20 * tol, 1e-4) * rms
    rows = ((o - exp).abs() > thr).any(1).nonzero().flatten().tolist()
    if problem.x.dtype in (torch.float16, torch.bfloat16):
        # The slots' terms, each as large as it gets: a sum (or products) kept in x's dtype errs by their roundings.
        terms = _layer_variant(problem, weights="abs")
        if ((o - exp).abs() <= 4 * torch.finfo(problem.x.dtype).eps * terms).all():
            raise Fail(f"{head}: every error is within a few {problem.x.dtype} roundings of the slots' terms "
                       f"(here up to {terms.max().item():.3g}, while the results are about "
                       f"{exp.abs().mean().item():.2g}): the products or the sum over the slots are kept in "
                       f"{problem.x.dtype}, or the router weight multiplies the activation before the down GEMM "
                       f"(where that product rounds to {problem.x.dtype}). Multiply each down-GEMM output row by "
                       "topk_weights.float() and sum in float32 (y = torch.zeros(..., dtype=torch.float32)), then "
                       "convert with .to(x.dtype) at the end.")
    if not rows:
        raise Fail(f"{head}: small errors everywhere; accumulate the sum in float32.")
    m = rows[0]
    raise Fail(f"{head}: tokens {ranges(rows)} of {M} are wrong; token {m} (experts "
               f"{problem.topk_ids[m].tolist()}, weights {[round(w, 4) for w in problem.topk_weights[m].tolist()]}): "
               f"expected {exp[m, 0].item():.5g} in column 0, got {o[m, 0].item():.5g}.")
