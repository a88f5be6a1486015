"""align_block_size: every pair sorted by expert exactly once, runs padded to block_m.

The order of pairs inside one expert's run is not specified (atomics on a GPU), so runs are
compared as sets.
"""
from __future__ import annotations

import re

from moe_tutorial import align_block_size, runtime
from moe_tutorial.kernels.align import MAX_BLOCK_M, MAX_EXPERTS, max_padded_rows
from moe_tutorial.kernels.align import check_alignment as check_alignment_matches
from moe_tutorial.shapes import random_topk_ids

import numpy as np
import pytest
import torch

DEVICE = runtime.DEVICE
needs_gpu = pytest.mark.skipif(not runtime.ON_GPU, reason="needs a CUDA GPU")


def check_alignment(topk_ids: torch.Tensor, block_m: int, num_experts: int, alignment) -> None:
    """Assert every documented property of ``align_block_size``'s result."""
    sorted_ids, expert_ids, num_post_t = alignment
    flat = topk_ids.reshape(-1).long().cpu()
    numel = flat.numel()
    max_padded = max_padded_rows(numel, block_m, num_experts)

    # Device tensors of sizes known on the host: nothing had to be read back to allocate them.
    for name, t in (("sorted_ids", sorted_ids), ("expert_ids", expert_ids), ("num_post", num_post_t)):
        assert isinstance(t, torch.Tensor) and t.device == topk_ids.device, name
        assert t.dtype == torch.int32, name
    assert sorted_ids.shape == (max_padded,)
    assert expert_ids.shape == (-(-max_padded // block_m),)
    assert num_post_t.shape == (1,)

    sorted_ids, expert_ids = sorted_ids.cpu().long(), expert_ids.cpu().long()
    num_post = int(num_post_t.item())
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    assert num_post == int(padded.sum()), "num_post is the sum of the padded run lengths"
    assert num_post % block_m == 0
    n_blocks = num_post // block_m

    used = sorted_ids[:num_post]
    real = used[used != numel]
    # Every (token, slot) pair exactly once; everything else is the padding value M * topk.
    assert torch.equal(real.sort().values, torch.arange(numel)), "each pair appears exactly once"
    assert int((used == numel).sum()) == num_post - numel
    assert int(used.min()) >= 0 and int(used.max()) <= numel

    blocks = expert_ids[:n_blocks]
    assert bool((blocks >= 0).all()) and bool((blocks < num_experts).all())
    assert bool((blocks[1:] >= blocks[:-1]).all()), "runs are in expert order"
    assert bool((expert_ids[n_blocks:] == -1).all()), "blocks past num_post are -1"
    # Each expert's run: ceil(count / block_m) blocks, holding exactly that expert's pairs.
    assert torch.equal(torch.bincount(blocks, minlength=num_experts) * block_m, padded)
    rows = used.view(n_blocks, block_m)
    for b in range(n_blocks):
        pairs = rows[b][rows[b] != numel]
        assert bool((flat[pairs] == blocks[b]).all()), f"block {b} holds a pair of another expert"
    for e in counts.nonzero().flatten().tolist():
        run = rows[blocks == e].flatten()
        assert set(run[run != numel].tolist()) == set((flat == e).nonzero().flatten().tolist())


CASES = [
    # (M, topk, E, block_m)
    (1, 1, 1, 16),
    (1, 2, 8, 16),
    (1, 8, 256, 16),
    (1, 8, 256, 128),
    (3, 1, 1, 64),
    (5, 3, 7, 32),
    (16, 6, 64, 16),
    (33, 2, 8, 64),
    (64, 8, 128, 32),
    (100, 4, 60, 128),
    (257, 8, 256, 64),
    (600, 2, 8, 16),     # 1200 pairs: more than one scatter program
    (7, 2, 4, 1),        # block_m = 1: no padding at all
    (9, 2, 4, 2),
    (32, 2, 8, 16),      # 64 pairs: the largest batch of the one-launch path
    (65, 1, 8, 16),      # 65 pairs: the smallest of the multi-launch path
    (2, 4, 1024, 16),    # many experts, a tiny batch: still one launch
    (1, 8, 4096, 128),   # more experts than the multi-launch path's histogram would hold
    (16, 8, 8, 128),     # every expert's run holds many pairs, one launch
]


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("M,topk,E,block_m", CASES)
def test_random_routing(M, topk, E, block_m, ids_dtype):
    g = torch.Generator().manual_seed(M * 1000 + E * 10 + topk)
    ids = random_topk_ids(M, E, topk, generator=g, device=DEVICE, dtype=ids_dtype)
    check_alignment(ids, block_m, E, align_block_size(ids, block_m, E))


@pytest.mark.parametrize("block_m", [16, 32, 64, 128])
def test_skewed_routing(block_m):
    """Most experts idle, one expert with many blocks, the last expert used once."""
    M, E = 300, 64
    ids = torch.zeros(M, 2, dtype=torch.int32)
    ids[:, 1] = 5
    ids[-1, 1] = E - 1
    ids = ids.to(DEVICE)
    check_alignment(ids, block_m, E, align_block_size(ids, block_m, E))


def test_many_pairs_several_chunks():
    """More pairs than one counting chunk (4096) and many scatter programs."""
    M, topk, E = 1024, 8, 256
    ids = random_topk_ids(M, E, topk, generator=torch.Generator().manual_seed(7), device=DEVICE)
    check_alignment(ids, 64, E, align_block_size(ids, 64, E))


@pytest.mark.parametrize("layout", ["transposed", "strided"])
def test_non_contiguous_ids(layout):
    M, topk, E = 40, 4, 16
    dense = random_topk_ids(M, E, topk, generator=torch.Generator().manual_seed(3), device=DEVICE, dtype=torch.int64)
    if layout == "transposed":
        ids = dense.t().contiguous().t()                   # [M, topk] with strides (1, M)
    else:
        wide = torch.full((M, 2 * topk), -7, dtype=torch.int64, device=DEVICE)
        wide[:, ::2] = dense
        ids = wide[:, ::2]                                  # every other column; junk in between
    assert not ids.is_contiguous() and torch.equal(ids, dense)
    check_alignment(ids, 16, E, align_block_size(ids, 16, E))


def test_worked_example_layout():
    """The worked example's ids [[0, 2], [2, 3]]: runs of experts 0, 2, 3, expert 1 empty."""
    ids = torch.tensor([[0, 2], [2, 3]], dtype=torch.int32, device=DEVICE)
    sorted_ids, expert_ids, num_post = align_block_size(ids, 4, 4)
    assert int(num_post) == 12
    assert expert_ids[:3].tolist() == [0, 2, 3]
    assert sorted_ids[0:4].tolist() == [0, 4, 4, 4]
    assert sorted(sorted_ids[4:6].tolist()) == [1, 2] and sorted_ids[6:8].tolist() == [4, 4]
    assert sorted_ids[8:12].tolist() == [3, 4, 4, 4]


def _corruptions():
    """Ways an alignment can be wrong, each a function of (sorted_ids, expert_ids, num_post)."""
    def swap_across_blocks(s, e, n):
        s[[0, 4]] = s[[4, 0]]
    def duplicate_pair(s, e, n):
        s[1] = s[0]
    def wrong_expert(s, e, n):
        e[1] = (e[1] + 1) % 4
    def short_count(s, e, n):
        n -= 4
    def stale_tail(s, e, n):
        e[-1] = 0
    def padding_value(s, e, n):
        s[s == 8] = 9
    return [swap_across_blocks, duplicate_pair, wrong_expert, short_count, stale_tail, padding_value]


@pytest.mark.parametrize("corrupt", _corruptions(), ids=lambda f: f.__name__)
def test_checker_catches_mistakes(corrupt):
    """The property check above is only worth something if it rejects wrong alignments."""
    ids = torch.tensor([[0, 1], [1, 2], [0, 3], [3, 1]], dtype=torch.int32, device=DEVICE)
    alignment = [t.clone() for t in align_block_size(ids, 4, 4)]
    check_alignment(ids, 4, 4, alignment)
    corrupt(*alignment)
    with pytest.raises(AssertionError):
        check_alignment(ids, 4, 4, alignment)


def check_invalid_ids_dropped(ids: torch.Tensor, block_m: int, E: int, alignment) -> None:
    """Ids outside [0, E) appear nowhere; the valid pairs are aligned as if alone."""
    sorted_ids, expert_ids, num_post = alignment
    flat = ids.reshape(-1).cpu().long()
    valid = (flat >= 0) & (flat < E)
    counts = torch.bincount(flat[valid], minlength=E)
    num_post = int(num_post)
    assert num_post == int(((counts + block_m - 1) // block_m * block_m).sum())
    used = sorted_ids[:num_post].cpu().long()
    real = used[used != flat.numel()]
    assert torch.equal(real.sort().values, valid.nonzero().flatten())
    labels = expert_ids[: num_post // block_m].cpu().long()
    assert bool((labels >= 0).all())
    rows = used.view(-1, block_m)
    for b in range(labels.numel()):
        pairs = rows[b][rows[b] != flat.numel()]
        assert bool((flat[pairs] == labels[b]).all()), f"block {b} holds a pair of another expert"


@pytest.mark.parametrize("M,topk", [(3, 4), (200, 2)])     # one-launch path, multi-launch path
def test_ids_out_of_range_are_dropped(M, topk):
    E, block_m = 8, 16
    ids = random_topk_ids(M, E, topk, generator=torch.Generator().manual_seed(M), device=DEVICE)
    ids[0, 0], ids[-1, -1] = -1, E
    check_invalid_ids_dropped(ids, block_m, E, align_block_size(ids, block_m, E))


@pytest.mark.parametrize("M,topk", [(3, 4), (200, 2)])     # one-launch path, multi-launch path
def test_int64_ids_of_2_pow_31_and_more_are_dropped(M, topk):
    """The kernels work in int32: an id is judged before the cast, so 2^32 + 3 is no expert 3."""
    E, block_m = 8, 4
    ids = random_topk_ids(M, E, topk, generator=torch.Generator().manual_seed(M), device=DEVICE, dtype=torch.int64)
    huge = [2 ** 31, 2 ** 32, 2 ** 32 + 3, 2 ** 63 - 1, -2 ** 32 + 1, -2 ** 63]   # int32 would see ..., 0, 3, -1, 1, 0
    flat = ids.view(-1)
    flat[torch.arange(len(huge)) * (flat.numel() // len(huge))] = torch.tensor(huge, device=DEVICE)
    check_invalid_ids_dropped(ids, block_m, E, align_block_size(ids, block_m, E))


def test_empty_batch():
    ids = torch.empty(0, 2, dtype=torch.int32, device=DEVICE)
    sorted_ids, expert_ids, num_post = align_block_size(ids, 16, 8)
    assert sorted_ids.numel() == 0 and expert_ids.numel() == 0 and int(num_post) == 0


@pytest.mark.parametrize("block_m", [0, 3, 24, -16, 2 * MAX_BLOCK_M, 65536, np.int64(24)])
@pytest.mark.parametrize("M", [2, 50])                     # one-launch path, multi-launch path
def test_bad_block_m(block_m, M):
    ids = torch.zeros(M, 2, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=rf"^block_m: expected a power of two from 1 to {MAX_BLOCK_M}, got"):
        align_block_size(ids, block_m, 4)


@pytest.mark.parametrize("num_experts", [0, -1, MAX_EXPERTS + 1, 65536])
@pytest.mark.parametrize("M", [2, 50])
def test_bad_num_experts(num_experts, M):
    ids = torch.zeros(M, 2, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=rf"^num_experts: expected an int from 1 to {MAX_EXPERTS}, got"):
        align_block_size(ids, 16, num_experts)


@pytest.mark.parametrize("name,value", [("block_m", 16.0), ("block_m", True), ("block_m", None),
                                        ("num_experts", 2.0), ("num_experts", True), ("num_experts", "4")])
def test_sizes_that_are_not_ints_are_a_type_error_naming_the_argument(name, value):
    """Not an int is a TypeError, as ``route`` says for ``top_k``; numpy integers are ints."""
    ids = torch.zeros(2, 2, dtype=torch.int32, device=DEVICE)
    args = {"block_m": 16, "num_experts": 4, name: value}
    with pytest.raises(TypeError, match=rf"^{name}: expected an int, got {re.escape(repr(value))}$"):
        align_block_size(ids, args["block_m"], args["num_experts"])


def test_numpy_integer_sizes_are_taken_as_ints():
    ids = torch.tensor([[0, 3], [1, 3]], dtype=torch.int32, device=DEVICE)
    (s1, e1, n1), (s2, e2, n2) = align_block_size(ids, np.int64(16), np.int32(4)), align_block_size(ids, 16, 4)
    used = int(n2)                       # past num_tokens_post_padded the buffers hold nothing defined
    assert int(n1) == used and torch.equal(s1[:used], s2[:used]) and torch.equal(e1[:used // 16], e2[:used // 16])


@pytest.mark.parametrize("M,topk", [(8, 8), (100, 1)])     # one-launch path, multi-launch path
def test_the_largest_block_m_and_expert_count_work(M, topk):
    """The bounds are what the kernels can do, not below it: both paths at both limits."""
    ids = random_topk_ids(M, MAX_EXPERTS, topk, generator=torch.Generator().manual_seed(M), device=DEVICE)
    ids[0, 0] = MAX_EXPERTS - 1
    check_alignment(ids, MAX_BLOCK_M, MAX_EXPERTS, align_block_size(ids, MAX_BLOCK_M, MAX_EXPERTS))


def test_more_rows_than_int32_is_refused():
    """2^31 pairs (an expanded tensor: no memory behind it) cannot be numbered in int32."""
    ids = torch.zeros(1, 1, dtype=torch.int32, device=DEVICE).expand(2 ** 31, 1)
    with pytest.raises(ValueError, match=r"^topk_ids: expected at most 2147483647 padded rows .*got 2147483648 pairs"):
        align_block_size(ids, 1, 4)


def test_meta_ids_get_the_device_error():
    ids = torch.zeros(2, 2, dtype=torch.int32, device="meta")
    kind = "CUDA" if runtime.ON_GPU else "CPU"
    with pytest.raises(ValueError, match=rf"^topk_ids: expected a {kind} tensor .*got meta"):
        align_block_size(ids, 16, 4)


# ---------------------------------------------------------------------------------------
# What an alignment records, and the check every consumer makes

def test_an_alignment_unpacks_and_records_what_it_was_built_for():
    ids = torch.tensor([[0, 2], [2, 3], [1, 0]], dtype=torch.int32, device=DEVICE)
    alignment = align_block_size(ids, 4, 5)
    sorted_ids, expert_ids, num_post = alignment                 # notebooks unpack it like this
    assert isinstance(alignment, tuple) and len(alignment) == 3
    assert alignment[0] is sorted_ids and alignment[2] is num_post
    assert repr(alignment) == repr((sorted_ids, expert_ids, num_post))
    assert (alignment.block_m, alignment.num_experts, alignment.num_pairs) == (4, 5, 6)
    assert alignment.topk_ids is ids
    check_alignment_matches(alignment, block_m=4, num_pairs=6, num_experts=5, device=ids.device, topk_ids=ids)
    check_alignment_matches(alignment, block_m=4, num_pairs=6, num_experts=5, topk_ids=ids[:])   # a view: same ids


def _mismatches():
    """(what changes, check_alignment's keywords, error) for an alignment of ids [3, 2], block_m 4, E 5."""
    return {
        "block_m": (lambda ids: dict(block_m=8), r"^alignment: expected one built for block_m = 8, got .*block_m = 4"),
        "num_experts": (lambda ids: dict(num_experts=6),
                        r"^alignment: expected one built for num_experts = 6, got .*num_experts = 5"),
        "num_pairs": (lambda ids: dict(num_pairs=5),
                      r"^alignment: expected one built for num_pairs \(M \* topk\) = 5, got .* = 6"),
        "other-ids": (lambda ids: dict(topk_ids=ids.clone()),
                      r"^alignment: expected one built from this topk_ids, got one built from another tensor"),
        "transposed-ids": (lambda ids: dict(topk_ids=ids.t().contiguous().t()), r"another tensor"),
        "ids-written-since": (lambda ids: dict(topk_ids=ids.index_fill_(1, torch.tensor([0], device=DEVICE), 1)),
                              r"^alignment: expected one built from topk_ids as they are now, got one built before"),
        "device": (lambda ids: dict(device=torch.device("meta")), r"^alignment: expected one on meta, got one on"),
    }


@pytest.mark.parametrize("what", _mismatches())
def test_a_mismatched_alignment_is_refused(what):
    change, match = _mismatches()[what]
    ids = torch.tensor([[0, 2], [2, 3], [1, 0]], dtype=torch.int32, device=DEVICE)
    alignment = align_block_size(ids, 4, 5)
    kwargs = dict(block_m=4, num_pairs=6, num_experts=5, device=ids.device, topk_ids=ids)
    kwargs.update(change(ids))
    with pytest.raises(ValueError, match=match):
        check_alignment_matches(alignment, **kwargs)


def test_a_plain_triple_is_not_an_alignment():
    ids = torch.tensor([[0, 2]], dtype=torch.int32, device=DEVICE)
    triple = tuple(align_block_size(ids, 4, 4))
    with pytest.raises(TypeError, match=r"^alignment: expected the Alignment align_block_size returns .*got tuple"):
        check_alignment_matches(triple, block_m=4, num_pairs=2, num_experts=4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, torch.uint8, torch.bool])
def test_bad_dtype(dtype):
    ids = torch.zeros(2, 2, dtype=dtype, device=DEVICE)
    with pytest.raises(TypeError, match="topk_ids.*int32"):
        align_block_size(ids, 16, 4)


@pytest.mark.parametrize("shape", [(4,), (2, 2, 2), ()])
def test_bad_rank(shape):
    ids = torch.zeros(shape, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="topk_ids.*2-D"):
        align_block_size(ids, 16, 4)


def test_not_a_tensor():
    with pytest.raises(TypeError, match="topk_ids"):
        align_block_size([[0, 1]], 16, 4)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("M,topk,E,block_m", [(1, 8, 256, 16), (4096, 8, 256, 64), (64, 2, 8, 128)])
def test_no_host_sync_on_gpu(M, topk, E, block_m):
    """On a GPU, torch's sync debug mode raises if anything waits for the device."""
    ids = random_topk_ids(M, E, topk, generator=torch.Generator().manual_seed(0), device=DEVICE)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        alignment = align_block_size(ids, block_m, E)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    check_alignment(ids, block_m, E, alignment)


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("M", [1, 8, 64, 1024, 16384])
@pytest.mark.parametrize("E,topk", [(8, 2), (60, 4), (64, 6), (128, 8), (256, 8)])
def test_model_shapes_on_gpu(M, E, topk):
    """Every routing shape of MODEL_SHAPES, with the block sizes the tuner picks from."""
    ids = random_topk_ids(M, E, topk, generator=torch.Generator().manual_seed(M + E), device=DEVICE)
    for block_m in (16, 32, 64, 128):
        check_alignment(ids, block_m, E, align_block_size(ids, block_m, E))
