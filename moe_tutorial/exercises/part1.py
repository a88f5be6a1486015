"""Checkers for Part 1, the expert view: the router, the pairs of an expert, the loop, the layer."""
from __future__ import annotations

import torch

from .. import runtime
from ..reference import tolerance
from ..routing import route
from .common import check_first_gemm_fn, check_layer_fn
from .diagnose import expect_index_dtype, expect_integer, expect_tensor
from .feedback import Fail, NotAttempted, call_student, on, run_check
from .problems import layer_problems, torch_first_gemm_problems, worked_first_gemm


def _route_cases():
    g = torch.Generator().manual_seed(31)
    dev = runtime.DEVICE
    return [
        ("M=6, E=8, top_k=2", torch.randn(6, 8, generator=g).to(dev), 2, True),
        ("M=6, E=8, top_k=2, renormalize=False", torch.randn(6, 8, generator=g).to(dev), 2, False),
        ("M=5, E=60, top_k=4 (Qwen1.5-MoE)", torch.randn(5, 60, generator=g).to(dev), 4, True),
        ("M=4, E=16, top_k=3, bfloat16 logits", torch.randn(4, 16, generator=g).to(dev, torch.bfloat16), 3, True),
        ("M=7, E=8, top_k=1", torch.randn(7, 8, generator=g).to(dev), 1, False),
        ("M=1, E=6, top_k=1 (one token, one expert)", torch.randn(1, 6, generator=g).to(dev), 1, True),
        ("M=0, E=4, top_k=2 (an empty batch)", torch.randn(0, 4, generator=g).to(dev), 2, True),
        # exp overflows float32 past about 88: a softmax must subtract each row's max first.
        (LARGE_LOGITS, (torch.randn(3, 8, generator=g) * 50 + 150).to(dev), 2, True),
        # ... each row's own max: shifted by the batch's, token 0's exp underflows to 0 and 0 / 0 is NaN.
        (FAR_APART, (torch.randn(2, 8, generator=g) + torch.tensor([[0.0], [120.0]])).to(dev), 2, True),
        # renormalize not passed: every other case passes it, so only here does its default count.
        (DEFAULT_RENORMALIZE, torch.randn(5, 8, generator=g).to(dev), 3, None),
    ]


#: Label of the route case whose logits overflow exp in float32.
LARGE_LOGITS = "M=3, E=8, top_k=2, large logits (about 150)"

#: Label of the route case whose two tokens' logits are far apart (a softmax shifted by the batch's max fails).
FAR_APART = "M=2, E=8, top_k=2, token 1's logits about 120 above token 0's"

#: Label of the route case that leaves ``renormalize`` out (``None`` in :func:`_route_cases`).
DEFAULT_RENORMALIZE = "M=5, E=8, top_k=3, renormalize not passed (its default is True)"


def _route_variant_message(got_w, logits, k, renormalize) -> str:
    """Name the slip whose weights the student's match: no softmax, the wrong axis, (no) renormalisation."""
    def kept(scores):
        top = scores.topk(k, -1).values
        return top, top / top.sum(-1, keepdim=True)

    bases = [(torch.softmax(logits.float(), -1), ""),
             (torch.softmax(logits.float(), 0),
              "the softmax runs over tokens (dim=0); it must be over the experts (dim=-1)."),
             (logits.float(), "these are the logits themselves: take the softmax over the experts first.")]
    for scores, text in bases:
        raw, renormed = kept(scores)
        for w, is_renormed in ((raw, False), (renormed, True)):
            if w.shape != got_w.shape or not torch.allclose(got_w.float(), w, atol=1e-6, rtol=1e-5):
                continue
            if text:
                return text
            if renormalize and not is_renormed:
                return ("the weights are the raw softmax probabilities: with renormalize=True divide the kept "
                        "weights by their sum, so each token's weights add up to 1.")
            if is_renormed and not renormalize:
                return ("the weights add up to 1, but renormalize=False keeps the raw softmax probabilities "
                        "(DeepSeek-V2 does).")
    return ""


def _expect_route(got, logits, k: int, renorm: bool) -> None:
    exp_w, exp_ids = route(logits, k, renorm)
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise Fail(f"expected a pair (topk_weights, topk_ids), got {type(got).__name__}")
    w, ids = got
    if isinstance(w, torch.Tensor) and isinstance(ids, torch.Tensor) and ids.is_floating_point() \
            and not w.is_floating_point():
        raise Fail("the pair is the wrong way round: return (topk_weights, topk_ids)")
    sizes = {"M": logits.shape[0], "top_k": k}
    expect_tensor(w, what="topk_weights", sizes=sizes)
    expect_tensor(ids, what="topk_ids", sizes=sizes)
    if ids.is_floating_point() or ids.dtype == torch.bool:
        raise Fail(f"topk_ids: expected dtype torch.int32, got {ids.dtype}: expert ids are indices, keep them "
                   "integers (torch.topk's indices, then .to(torch.int32))")
    if not w.is_floating_point():
        raise Fail(f"topk_weights: expected dtype torch.float32, got {w.dtype}")
    if ids.dtype != torch.int32:
        raise Fail(f"topk_ids: expected dtype torch.int32, got {ids.dtype}; convert with .to(torch.int32) "
                   "(the kernels load ids as int32)")
    if w.dtype != torch.float32:
        raise Fail(f"topk_weights: expected dtype torch.float32, got {w.dtype}: do the softmax in float32 "
                   "(router_logits.float()), whatever the logits' dtype")
    if w.numel() and not bool(torch.isfinite(w.float()).all()):
        _expect_finite_weights(w, logits, k)
    hint = _route_variant_message(w, logits, k, renorm)
    for m in range(logits.shape[0]):
        want, have = exp_ids[m].tolist(), ids[m].tolist()
        if want == have:
            continue
        if sorted(want) == sorted(have):
            raise Fail(f"token {m}'s experts {have} are the right ones but not in order of decreasing "
                       f"weight {want} (torch.topk sorts them for you)")
        raise Fail(f"token {m} should go to experts {want} (its {k} largest probabilities), yours are {have}"
                   + (f"; {hint}" if hint else ""))
    if not torch.allclose(w.float(), exp_w, atol=1e-6, rtol=1e-5):
        m = int(((w.float() - exp_w).abs() > 1e-6).any(1).nonzero()[0])
        raise Fail(f"token {m}'s weights should be {[round(v, 5) for v in exp_w[m].tolist()]}, yours are "
                   f"{[round(v, 5) for v in w[m].float().tolist()]}" + (f": {hint}" if hint else ""))


def _expect_finite_weights(w, logits, k: int) -> None:
    """Fail for NaN or inf weights, naming the softmax slip that gives them."""
    rows = (~torch.isfinite(w.float())).any(1).nonzero().flatten().tolist()
    l = logits.float()                                                              # noqa: E741
    e = (l - l.max()).exp()                                                         # shifted by the batch's max
    batch = (e / e.sum(-1, keepdim=True)).topk(k, -1).values
    if rows == (~torch.isfinite(batch)).any(1).nonzero().flatten().tolist() and len(l) > 1:
        m = rows[0]
        below = float(l.max() - l[m].max())
        raise Fail(f"topk_weights holds NaN for token {m}, whose logits are about {below:.0f} below the batch's "
                   "largest: your softmax subtracts one max for the whole batch, so exp() of this token's logits "
                   "underflows to 0 and 0 / 0 is NaN. Subtract each token's own max, "
                   "l - l.max(dim=-1, keepdim=True).values, or use torch.softmax(l, dim=-1), which does")
    if float(l.abs().max()) > 80:
        raise Fail(f"topk_weights holds NaN or inf on logits up to {float(l.max()):.0f}: exp() overflows "
                   "float32 past about 88, so exp(l) / sum(exp(l)) is inf / inf. Subtract each row's max logit "
                   "before exp (the result is the same), or use torch.softmax, which does")
    raise Fail(f"topk_weights holds NaN or inf for token {rows[0]}, on finite logits: the softmax must give each "
               "token's weights in [0, 1]")


def check_route(fn) -> bool:
    """Exercise 1.1: ``fn(router_logits [M, E], top_k, renormalize=True) -> (weights fp32, ids int32)``."""
    def body():
        cases = _route_cases()
        for label, logits, k, renorm in cases:
            with on(label):
                kwargs = {} if renorm is None else {"renormalize": renorm}
                got = call_student(fn, logits, k, names=("router_logits", "top_k"), **kwargs)
                try:
                    _expect_route(got, logits, k, True if renorm is None else renorm)
                except Fail as e:
                    if renorm is None and _passes_route(fn, logits, k):
                        raise Fail(f"{e}\nWith renormalize=True passed your function is right: its default must "
                                   "be True, as in the stub's signature def route(router_logits, top_k, "
                                   "renormalize=True)") from None
                    raise
        return (f"right on all {len(cases)} cases (renormalize on, off and left at its default, E = 60, bfloat16 "
                "logits, top_k = 1, one token, an empty batch, large logits, tokens whose logits are far apart).")
    return run_check("1.1", body)


def _passes_route(fn, logits, k: int) -> bool:
    """Is ``fn`` right on these logits with ``renormalize=True`` passed explicitly?"""
    try:
        _expect_route(call_student(fn, logits, k, renormalize=True, names=("router_logits", "top_k")), logits, k, True)
    except (Fail, NotAttempted):
        return False
    return True


def _index_list(t, what: str) -> list[int]:
    """The entries of a 1-D int64 or int32 tensor (or a list of Python ints) as a list."""
    if isinstance(t, torch.Tensor):
        expect_integer(t, what)
        expect_index_dtype(t, what)
        if t.dim() != 1:
            extra = (f": an extra axis of size 1 (take [:, 0], or .squeeze(1)); {what} is used to index x's rows"
                     if t.dim() == 2 and t.shape[1] == 1 else "")
            raise Fail(f"{what}: expected a 1-D tensor [P] (one entry per pair), got shape {tuple(t.shape)}{extra}")
        return [int(v) for v in t.tolist()]
    if isinstance(t, (list, tuple)) and all(isinstance(v, int) and not isinstance(v, bool) for v in t):
        return list(t)
    raise Fail(f"{what}: expected a 1-D integer tensor, got {type(t).__name__}")


def _expect_pairs(got, ids: torch.Tensor, e: int) -> None:
    if isinstance(got, torch.Tensor) and got.dim() == 2 and got.shape[0] == 2:
        got = tuple(got)      # nonzero().T: a [2, P] tensor unpacks into (idx, slot) exactly like the pair
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise Fail(f"expected a pair (idx, slot), got {type(got).__name__}")
    idx, slot = _index_list(got[0], "idx"), _index_list(got[1], "slot")
    if len(idx) != len(slot):
        raise Fail(f"idx has {len(idx)} entries but slot has {len(slot)}: one entry per pair in each")
    want = {(m, j) for m, j in torch.nonzero(ids == e).tolist()}
    have = list(zip(idx, slot))
    if set(have) == want and len(have) == len(want):
        return
    if {(j, m) for m, j in have} == want:
        raise Fail("you returned (slot, idx): the token numbers come first "
                   "(torch.where(topk_ids == e) returns rows, then columns)")
    if len(have) != len(want):
        text = (f"expert {e} was chosen by {len(want)} (token, slot) pairs, you returned {len(have)}: "
                f"{sorted(have)}; expected {sorted(want)}")
        missing = want - set(have)
        topk = ids.shape[1]
        if missing and topk != 2 and all(j >= 2 for _, j in missing) and all(j < 2 for _, j in have):
            text += (f". The missing pairs are all in slots 2 and up: does your code assume topk = 2? Here "
                     f"topk_ids has topk = {topk} columns; compare the whole [M, topk] tensor")
        raise Fail(text)
    m, j = next(p for p in have if p not in want)
    raise Fail(f"(token {m}, slot {j}) is in your answer, but topk_ids[{m}, {j}] is not {e}; expected {sorted(want)}")


def check_expert_pairs(fn) -> bool:
    """Exercise 1.2: ``fn(topk_ids [M, topk], e) -> (idx, slot)``, the pairs with ``topk_ids[idx, slot] == e``."""
    def body():
        g = torch.Generator().manual_seed(32)
        dev = runtime.DEVICE
        cases = [worked_first_gemm().topk_ids,
                 torch.rand(6, 5, generator=g).topk(2, 1).indices.to(dev, torch.int32),
                 torch.rand(5, 6, generator=g).topk(3, 1).indices.to(dev, torch.int32),      # topk = 3
                 torch.rand(4, 3, generator=g).topk(1, 1).indices.to(dev, torch.int64),      # topk = 1, int64
                 torch.tensor([[3, 1]], dtype=torch.int32, device=dev)]                       # one token
        checked = 0
        for ids in cases:
            for e in range(int(ids.max()) + 2):          # + 2: one expert nobody chose
                with on(f"topk_ids = {ids.tolist()}, e = {e}"):
                    _expect_pairs(call_student(fn, ids, e, names=("topk_ids", "e")), ids, e)
                checked += 1
        return (f"right on all {checked} (topk_ids, expert) cases: topk = 1, 2 and 3, one token, "
                "experts nobody chose.")
    return run_check("1.2", body)


def check_loop_matmul(fn) -> bool:
    """Exercise 1.3: the expert-view loop ``fn(x, weight, topk_ids) -> [M, topk, N]``."""
    return check_first_gemm_fn("1.3", fn, torch_first_gemm_problems(), tolerance(torch.float32))


def check_loop_layer(fn) -> bool:
    """Exercise 1.4: the whole layer ``fn(x, w13, w2, topk_weights, topk_ids) -> [M, K]``."""
    return check_layer_fn("1.4", fn, layer_problems())
