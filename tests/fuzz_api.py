"""Property-based fuzzing of the public API, run by tests/test_fuzz.py.

Each property draws a problem with Hypothesis: shapes from 0 up (tiny, for the interpreter),
dtypes, layouts (contiguous, transposed, strided, expanded with stride 0), id ranges (valid,
negative, >= E, >= 2^31) and router weights. The drawing knows whether the input is one the
function promises to handle. If it is, the result must equal the float64 reference of
``moe_tutorial.reference`` within ``tolerance(dtype)``; if not, the function must raise a
ValueError or TypeError. Seeded (``derandomize``) with a fixed number of examples, so every run
tries the same cases.

Run one property as ``python tests/fuzz_api.py NAME``: a kernel that crashes takes its own
process down, not pytest's; each example's one-line description is printed before it runs,
so the last line names the culprit.
"""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

import sys
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moe_tutorial import (
    align_block_size,
    indexing_moe_matmul,
    fused_moe_matmul,
    loop_moe_matmul,
    moe_layer,
    route,
    runtime,
    sorted_moe_matmul,
)
from moe_tutorial.kernels.align import MAX_BLOCK_M, MAX_EXPERTS, max_padded_rows
from moe_tutorial.kernels.configs import get_config
from moe_tutorial.reference import reference_moe_layer, reference_moe_matmul, rel_error, tolerance

DEV = runtime.DEVICE
FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
IDS = (torch.int32, torch.int64)
LAYOUTS = ("contiguous", "transposed", "strided", "expanded")
#: Ids outside [0, E): each is an id the checks must refuse and align_block_size must drop.
BAD_IDS = (-1, "E", 2 ** 31, 2 ** 32, 2 ** 32 + 1, -(2 ** 32) + 1)

#: Examples per property: all of them take about 40 s on a 2-core CPU (kernels in the interpreter).
EXAMPLES = {"route": 300, "loop_moe_matmul": 200, "indexing_moe_matmul": 200, "fused_moe_matmul": 200,
            "align_block_size": 250, "sorted_moe_matmul": 200, "moe_layer": 200}


def fuzz_settings(name: str):
    return settings(max_examples=EXAMPLES[name], derandomize=True, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck), print_blob=False)


def lay(t: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values (``expanded``: the first row's, repeated) in another memory layout."""
    if layout == "transposed" and t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "strided":
        junk = torch.full_like(t, float("nan") if t.is_floating_point() else -7)
        return torch.stack([t, junk], dim=-1)[..., 0]          # last dim's stride 2, junk between
    if layout == "expanded" and t.dim() >= 1 and t.shape[0] >= 1:
        return t[:1].expand(t.shape)                            # stride 0 along dim 0
    return t


@dataclass
class Case:
    """One drawn input: the tensors, and whether the function promises to handle it."""
    args: dict
    valid: bool
    why: list = field(default_factory=list)

    def describe(self) -> str:
        parts = []
        for k, v in self.args.items():
            if isinstance(v, torch.Tensor):
                parts.append(f"{k}={tuple(v.shape)}:{str(v.dtype)[6:]}:{v.stride()}")
            else:
                parts.append(f"{k}={v!r}")
        return " ".join(parts) + (f"  invalid: {', '.join(self.why)}" if self.why else "")


#: Examples run per property, and how many of them were valid inputs.
TRIED: dict = {}


def announce(name: str, case: Case) -> None:
    runs, valid = TRIED.get(name, (0, 0))
    TRIED[name] = (runs + 1, valid + case.valid)
    print(f"{name}: {case.describe()}", flush=True)


def expect(fn, case: Case, check) -> None:
    """Valid input: ``check(fn(**args))``. Invalid: a ValueError or TypeError, nothing else."""
    if case.valid:
        check(fn(**case.args))
        return
    try:
        out = fn(**case.args)
    except (ValueError, TypeError):
        return
    raise AssertionError(f"accepted an input it should refuse ({', '.join(case.why)}); returned "
                         f"{type(out).__name__}")


# ---------------------------------------------------------------------------------------
# Strategies

def rarely_bad():
    """False one time in eight: where an input goes wrong, so that most examples are valid."""
    return st.integers(0, 7).map(bool)


@st.composite
def ids_tensor(draw, M: int, topk: int, E: int, case_why: list, *, allow_bad: bool = True):
    """``[M, topk]`` ids, mostly in [0, E), sometimes with out-of-range ids; records why not."""
    dtype = draw(st.sampled_from(IDS))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2 ** 16)))
    ids = torch.randint(0, E, (M, topk), generator=g, dtype=torch.int64) if E > 0 else torch.zeros(M, topk).long()
    if allow_bad and M * topk and not draw(rarely_bad()):
        bad = draw(st.sampled_from(BAD_IDS))
        bad = E if bad == "E" else bad
        if dtype == torch.int32 and not -2 ** 31 <= bad < 2 ** 31:
            dtype = torch.int64
        ids.view(-1)[draw(st.integers(0, M * topk - 1))] = bad
    ids = lay(ids.to(dtype).to(DEV), draw(st.sampled_from(LAYOUTS)))
    outside = [v for v in ids.flatten().tolist() if not 0 <= v < E]     # "expanded" may have copied it away
    if outside:
        case_why.append(f"an id of {outside[0]}")
    return ids


@st.composite
def matmul_cases(draw, kernel: bool):
    """``x [M, K]``, ``weight [E, N, K]``, ``topk_ids [M, topk]`` and whether they are valid."""
    why = []
    M, K, N = draw(st.integers(0, 4)), draw(st.integers(0, 6)), draw(st.integers(0, 6))
    E = draw(st.integers(1, 5)) if draw(rarely_bad()) or draw(rarely_bad()) else 0     # no experts, rarely
    topk = draw(st.integers(1, E)) if E and draw(rarely_bad()) else draw(st.sampled_from([0, E + 1]))
    if E == 0:
        why.append("no experts (E=0)")
    elif not 1 <= topk <= E:
        why.append(f"topk={topk} for E={E}")
    dtype = draw(st.sampled_from(FLOATS if not kernel or not draw(rarely_bad()) else runtime.KERNEL_DTYPES))
    if kernel and dtype not in runtime.KERNEL_DTYPES:
        why.append(f"{dtype} in a kernel")
    g = torch.Generator().manual_seed(draw(st.integers(0, 2 ** 16)))
    x = lay(torch.randn(M, K, generator=g).to(DEV, dtype), draw(st.sampled_from(LAYOUTS)))
    weight = lay((torch.randn(E, N, K, generator=g) * max(K, 1) ** -0.5).to(DEV, dtype),
                 draw(st.sampled_from(LAYOUTS)))
    ids = draw(ids_tensor(M, topk, E, why, allow_bad=1 <= topk <= E))
    return Case(dict(x=x, weight=weight, topk_ids=ids), valid=not why, why=why)


def check_matmul(case: Case):
    a = case.args
    ref = reference_moe_matmul(a["x"], a["weight"], a["topk_ids"])

    def check(out):
        assert out.shape == ref.shape and out.dtype == a["x"].dtype, (out.shape, out.dtype)
        err = rel_error(out, ref)
        assert err < tolerance(out.dtype), f"relative error {err:.3g}"
    return check


# ---------------------------------------------------------------------------------------
# Properties, one per public function

@st.composite
def route_cases(draw):
    why = []
    M, E = draw(st.integers(0, 4)), draw(st.integers(1, 6))
    dtype = draw(st.sampled_from(FLOATS))
    values = draw(st.lists(st.floats(-30, 30, width=16), min_size=M * E, max_size=M * E))
    for _ in range(draw(st.integers(0, 2)) if M * E else 0):        # -inf masks an expert; the others are bad
        special = draw(st.sampled_from([float("-inf"), float("-inf"), float("-inf"), float("inf"), float("nan")]))
        values[draw(st.integers(0, M * E - 1))] = special
    logits = torch.tensor(values, dtype=torch.float64).reshape(M, E).to(DEV, dtype)
    logits = lay(logits, draw(st.sampled_from(LAYOUTS)))
    k = draw(st.integers(1, E)) if draw(rarely_bad()) else draw(st.sampled_from([0, E + 1]))
    kinds = ["int", "np.int64", "tensor"] if draw(rarely_bad()) else ["float", "bool"]
    top_k = draw(st.sampled_from(kinds))
    top_k = {"int": k, "np.int64": np.int64(k), "tensor": torch.tensor(k), "float": float(k), "bool": k == 1}[top_k]
    if isinstance(top_k, (float, bool)):
        why.append(f"top_k={top_k!r}")
    elif not 1 <= k <= E:
        why.append(f"top_k={k} for E={E}")
    as32 = logits.float()
    if bool((as32.isnan() | (as32 == float("inf"))).any() | (as32 == float("-inf")).all(dim=1).any()):
        why.append("a row without a softmax")
    # renormalize: a bool (numpy's too), rarely something merely truthy or falsy ("no" must not mean True).
    renormalize = draw(st.sampled_from([True, False, np.bool_(True)] if draw(rarely_bad()) else ["no", 0, None]))
    if not isinstance(renormalize, (bool, np.bool_)):
        why.append(f"renormalize={renormalize!r}")
    return Case(dict(router_logits=logits, top_k=top_k, renormalize=renormalize), valid=not why, why=why)


@fuzz_settings("route")
@given(route_cases())
def fuzz_route(case):
    announce("route", case)
    a = case.args

    def check(result):
        weights, ids = result
        M, E = a["router_logits"].shape
        k = int(a["top_k"])
        assert weights.dtype == torch.float32 and ids.dtype == torch.int32
        assert weights.shape == ids.shape == (M, k)
        probs = torch.softmax(a["router_logits"].float().double(), dim=-1)
        kept = torch.topk(probs, k, dim=-1).values
        if a["renormalize"]:
            kept = kept / kept.sum(dim=-1, keepdim=True)
        assert torch.allclose(weights.double(), kept, rtol=1e-5, atol=1e-6)
        chosen = probs.gather(1, ids.long())                     # ties: any of equal experts will do
        if a["renormalize"]:
            chosen = chosen / chosen.sum(dim=-1, keepdim=True)
        assert torch.allclose(weights.double(), chosen, rtol=1e-5, atol=1e-6)
        assert all(len(set(row)) == k for row in ids.tolist()), "an expert chosen twice for one token"
    expect(route, case, check)


@fuzz_settings("loop_moe_matmul")
@given(matmul_cases(kernel=False))
def fuzz_loop_moe_matmul(case):
    announce("loop_moe_matmul", case)
    expect(loop_moe_matmul, case, check_matmul(case) if case.valid else None)


@fuzz_settings("indexing_moe_matmul")
@given(matmul_cases(kernel=False))
def fuzz_indexing_moe_matmul(case):
    announce("indexing_moe_matmul", case)
    expect(indexing_moe_matmul, case, check_matmul(case) if case.valid else None)


@fuzz_settings("fused_moe_matmul")
@given(matmul_cases(kernel=True), st.sampled_from([None, "fresh", "expanded"]))
def fuzz_fused_moe_matmul(case, out):
    if out is not None and case.valid:
        M, topk, N = case.args["x"].shape[0], case.args["topk_ids"].shape[1], case.args["weight"].shape[1]
        buffer = torch.full((M, topk, N), float("nan"), dtype=case.args["x"].dtype, device=DEV)
        if out == "expanded" and M > 1 and topk * N:
            buffer, case.valid = buffer[:1].expand(M, topk, N), False
            case.why.append("an expanded out=")
        case.args["out"] = buffer
    announce("fused_moe_matmul", case)
    expect(fused_moe_matmul, case, check_matmul(case) if case.valid else None)


@st.composite
def align_cases(draw):
    why = []
    M, topk = draw(st.integers(0, 40)), draw(st.integers(1, 4))      # up to 160 pairs: both launch paths
    E = draw(st.sampled_from([1, 2, 3, 5, 8, 64, MAX_EXPERTS, MAX_EXPERTS + 1]))
    block_m = draw(st.sampled_from([1, 2, 4, 16, 32, MAX_BLOCK_M, 3, 2 * MAX_BLOCK_M]))
    if E > MAX_EXPERTS:
        why.append(f"num_experts={E}")
    if block_m > MAX_BLOCK_M or block_m & (block_m - 1):
        why.append(f"block_m={block_m}")
    ids = draw(ids_tensor(M, topk, min(E, MAX_EXPERTS), []))         # out-of-range ids are dropped, not refused
    if draw(st.booleans()):
        block_m = np.int64(block_m)                                   # numpy integers are ints, as in route
    return Case(dict(topk_ids=ids, block_m=block_m, num_experts=E), valid=not why, why=why)


@fuzz_settings("align_block_size")
@given(align_cases())
def fuzz_align_block_size(case):
    announce("align_block_size", case)
    a = case.args
    ids, block_m, E = a["topk_ids"], a["block_m"], a["num_experts"]

    def check(alignment):
        sorted_ids, expert_ids, num_post = alignment
        numel = ids.numel()
        rows = max_padded_rows(numel, block_m, E)
        assert sorted_ids.shape == (rows,) and expert_ids.shape == (-(-rows // block_m),)
        assert (alignment.block_m, alignment.num_experts, alignment.num_pairs) == (block_m, E, numel)
        flat = ids.reshape(-1).cpu().long()
        valid = (flat >= 0) & (flat < E)
        counts = torch.bincount(flat[valid], minlength=E)
        post = int(num_post)
        assert post == int(((counts + block_m - 1) // block_m * block_m).sum())
        used = sorted_ids[:post].cpu().long()
        assert torch.equal(used[used != numel].sort().values, valid.nonzero().flatten()), "each valid pair once"
        labels = expert_ids.cpu().long()
        assert bool((labels[post // block_m:] == -1).all())
        blocks = used.view(-1, block_m)
        for b in range(post // block_m):
            real = blocks[b][blocks[b] != numel]
            assert bool((flat[real] == labels[b]).all()), f"block {b} holds a pair of another expert"
    expect(align_block_size, case, check)


#: Configurations for sorted_moe_matmul's ``config=``: None (its own), valid ones (numpy sizes
#: included), and ones it must refuse by name: a zero or non-power-of-two block, a dict.
CONFIGS = (None, None, None, dict(block_n=64), dict(block_n=np.int64(16), block_k=np.int32(16)),
           dict(block_n=0), dict(block_k=24), dict(block_m=8), "a dict")


def draw_config(M: int, E: int, N: int, K: int, topk: int, dtype, choice, case: Case):
    """The ``config=`` of :data:`CONFIGS` entry ``choice``, recording in ``case`` why it is bad."""
    if choice is None:
        return None
    base = get_config(M, E, N, K, topk, dtype, "plain")
    if choice == "a dict":
        case.valid = False
        case.why.append("a dict for config")
        return base.as_dict()
    bad = [f"{k}={v}" for k, v in choice.items() if v < 16 or v & (v - 1)]
    if bad:
        case.valid = False
        case.why.append("config " + ", ".join(bad))
    return replace(base, **choice)


@fuzz_settings("sorted_moe_matmul")
@given(matmul_cases(kernel=True), st.sampled_from([None, "router"]), st.sampled_from([None, "own", "other-block"]),
       st.sampled_from(CONFIGS))
def fuzz_sorted_moe_matmul(case, router, alignment, config):
    a = case.args
    M, topk = a["topk_ids"].shape
    E = a["weight"].shape[0]
    if config is not None:
        a["config"] = draw_config(M, max(E, 1), a["weight"].shape[1], a["x"].shape[1], topk, a["x"].dtype, config,
                                  case)
        alignment = None if a["config"] is None or isinstance(a["config"], dict) else alignment
    if router:
        g = torch.Generator().manual_seed(M * 7 + topk)
        a["topk_weights"] = lay(torch.rand(M, topk, generator=g).to(DEV) - 0.25, "transposed")
    own = a.get("config")
    block_m = own.block_m if own is not None and not isinstance(own, dict) else \
        get_config(M, E, a["weight"].shape[1], a["x"].shape[1], topk, a["x"].dtype, "plain").block_m
    if alignment and case.valid and M * a["weight"].shape[1]:
        a["alignment"] = align_block_size(a["topk_ids"], block_m if alignment == "own" else 2 * block_m, E)
        if alignment == "other-block":
            case.valid = False
            case.why.append("an alignment of another block_m")
    announce("sorted_moe_matmul", case)

    def check(out):
        ref = reference_moe_matmul(a["x"], a["weight"], a["topk_ids"])
        if router:
            ref = ref * a["topk_weights"].double()[..., None]
        assert out.shape == ref.shape and out.dtype == a["x"].dtype
        err = rel_error(out, ref)
        assert err < tolerance(out.dtype), f"relative error {err:.3g}"
    expect(sorted_moe_matmul, case, check)


@st.composite
def layer_cases(draw):
    why = []
    impl = draw(st.sampled_from(["loop", "indexing", "fused", "sorted"]))
    M, K, inter = draw(st.integers(0, 3)), draw(st.integers(0, 5)), draw(st.integers(0, 3))
    E = draw(st.integers(1, 4))
    topk = draw(st.integers(1, E))
    kernel = impl in ("fused", "sorted")
    dtype = draw(st.sampled_from(FLOATS if not kernel or not draw(rarely_bad()) else runtime.KERNEL_DTYPES))
    if kernel and dtype not in runtime.KERNEL_DTYPES:
        why.append(f"{dtype} in a kernel")
    g = torch.Generator().manual_seed(draw(st.integers(0, 2 ** 16)))
    x = torch.randn(M, K, generator=g)
    w13 = torch.randn(E, 2 * inter, K, generator=g) * max(K, 1) ** -0.5
    w2 = torch.randn(E, K, inter, generator=g) * max(inter, 1) ** -0.5
    weights = torch.rand(M, topk, generator=g)
    x, w13, w2 = (lay(t.to(DEV, dtype), draw(st.sampled_from(LAYOUTS))) for t in (x, w13, w2))
    weights = lay(weights.to(DEV), draw(st.sampled_from(LAYOUTS)))
    ids = draw(ids_tensor(M, topk, E, why))
    return Case(dict(x=x, w13=w13, w2=w2, topk_weights=weights, topk_ids=ids, impl=impl), valid=not why, why=why)


@fuzz_settings("moe_layer")
@given(layer_cases())
def fuzz_moe_layer(case):
    announce("moe_layer", case)
    a = case.args

    def check(y):
        ref = reference_moe_layer(a["x"], a["w13"], a["w2"], a["topk_weights"], a["topk_ids"])
        assert y.shape == ref.shape and y.dtype == a["x"].dtype, (y.shape, y.dtype)
        err = rel_error(y, ref)
        assert err < tolerance(y.dtype), f"relative error {err:.3g}"
    expect(moe_layer, case, check)


PROPERTIES = {name: globals()[f"fuzz_{name}"] for name in EXAMPLES}

if __name__ == "__main__":
    names = sys.argv[1:] or list(PROPERTIES)
    for name in names:
        PROPERTIES[name]()
        runs, valid = TRIED[name]
        print(f"{name}: passed {runs} examples, {valid} of them valid inputs", flush=True)
        # A fuzz that only ever met refusals would prove little about the results.
        assert valid >= runs // 3, f"{name}: only {valid} of {runs} examples were valid inputs"
