"""Part 7's Gluon FP8 kernel: the sorted-order gather (interpreter and GPU), the compiled schedule
for Hopper (any machine: Triton compiles for sm90 without a GPU), and the kernel itself against
float64 (GPU tests: Gluon does not run in the interpreter)."""
import moe_tutorial as mt  # noqa: I001  (first: picks the runtime)

import base64
import re
from dataclasses import replace

import pytest
import torch

from moe_tutorial import runtime
from moe_tutorial.exercises.guard import memory_guard
from moe_tutorial.experiments.gluon_fp8 import promoted_and_rescaled
from moe_tutorial.experiments.sm90 import KERNELS, compile_report
from moe_tutorial.kernels import gluon_fp8_kernel as gk
from moe_tutorial.kernels.align import align_block_size, sorted_positions
from moe_tutorial.kernels import configs, yield_edit
from moe_tutorial.kernels.configs import KernelConfig, check_fp8_config
from moe_tutorial.kernels.fp8_layer import fp8_moe_layer, fp8_moe_matmul
from moe_tutorial.kernels.fp8_quant import quantize_rows, quantize_rows_sorted
from moe_tutorial.kernels.gluon_kernel import HAVE_GLUON
from moe_tutorial.quant import dequantize_activations, dequantize_weight, quantize_w13, quantize_weight
from moe_tutorial.reference import FP8_LAYER_TOLERANCE, reference_fp8_moe_layer, reference_moe_matmul, rel_error
from moe_tutorial.shapes import get_shape

DEV = runtime.DEVICE
needs_hopper = pytest.mark.skipif(gk.UNAVAILABLE is not None, reason=gk.UNAVAILABLE or "")


# ------------------------------------------------------------------ the gather, on every runtime

@pytest.mark.parametrize("seed", range(5))
def test_gather_puts_each_pairs_row_and_scales_at_its_sorted_position(seed):
    g = torch.Generator().manual_seed(seed)
    M, K, E, topk = (int(v) for v in (torch.randint(1, 70, ()), torch.randint(1, 400, ()),
                                      torch.randint(1, 9, ()), torch.randint(1, 4, ())))
    topk = min(topk, E)
    block_m = (16, 64, 128)[seed % 3]
    if seed == 4:       # 16 sorted rows, one program of 32: its last 16 rows lie past the buffer
        M, E, topk, block_m = 1, 1, 1, 16
    x = torch.randn(M, K, generator=g).to(DEV)
    ids = torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(M)]).to(torch.int32).to(DEV)
    x_q, x_s = quantize_rows(x)
    alignment = align_block_size(ids, block_m, E)
    with memory_guard():            # every load and store inside the tensors it was given (interpreter)
        a, a_st = gk.gather_sorted_fp8(x_q, x_s, alignment, M * topk, topk, block_m)
    rows = gk.sorted_rows(alignment, block_m)
    assert a.shape == (rows, K) and a_st.shape == ((K + 127) // 128, rows) and rows % block_m == 0
    n = int(alignment[2])
    pair = alignment[0][:n].long()
    real = pair < M * topk
    src = pair[real] // topk
    assert torch.equal(a[:n][real].view(torch.uint8), x_q[src].view(torch.uint8))
    assert torch.equal(a_st[:, :n][:, real], x_s[src].t())


@pytest.mark.parametrize("seed", range(5))
def test_the_sorted_quantiser_writes_what_quantise_then_gather_writes(seed):
    """Part 7's quantiser into sorted order (each token quantised once, stored at its topk sorted
    rows) against the two launches it replaces: the same bits on every real row, a dropped pair
    (bad id) left without a position; random shapes, K not a multiple of 128, topk = 1 among them."""
    g = torch.Generator().manual_seed(100 + seed)
    M, K, E, topk = (int(v) for v in (torch.randint(1, 60, ()), torch.randint(1, 300, ()),
                                      torch.randint(1, 9, ()), torch.randint(1, 4, ())))
    topk = 1 if seed == 0 else min(topk, E)
    block_m = (16, 64, 128)[seed % 3]
    x = (torch.randn(M, K, generator=g) * torch.rand(M, 1, generator=g) * 10).to(DEV)
    ids = torch.stack([torch.randperm(E, generator=g)[:topk] for _ in range(M)]).to(torch.int32)
    if seed == 3:
        ids[0, 0] = E                                         # an id the alignment drops
    ids = ids.to(DEV)
    alignment = align_block_size(ids, block_m, E)
    pos = sorted_positions(alignment, M * topk)
    n = int(alignment[2])
    pair = alignment[0][:n].long()
    real = pair < M * topk
    assert torch.equal(pos[pair[real]].long(), torch.arange(n, device=pair.device)[real])   # the inverse
    assert (pos < 0).sum() == (1 if seed == 3 else 0)
    rows = gk.sorted_rows(alignment, block_m)
    with memory_guard():
        a, a_st = quantize_rows_sorted(x, pos, topk, rows)
    ref, ref_st = gk.gather_sorted_fp8(*quantize_rows(x), alignment, M * topk, topk, block_m)
    assert a.shape == ref.shape and a_st.shape == ref_st.shape
    assert torch.equal(a[:n][real].view(torch.uint8), ref[:n][real].view(torch.uint8))
    assert torch.equal(a_st[:, :n][:, real], ref_st[:, :n][:, real])


# ------------------------------------------------------------------ the schedule, compiled for sm90

@pytest.fixture(scope="module")
def reports():
    if not HAVE_GLUON:
        pytest.skip("this Triton has no Gluon")
    return {}


def _report(reports, kernel):
    if kernel not in reports:
        reports[kernel] = compile_report(kernel)
    return reports[kernel]


#: Spills a kernel is known to have, bytes: Part 8's dA' kernel spills in its epilogue warps (its
#: 32-column strips, unrolled; none in the MMA warps' K loop), 126 bytes with Triton 3.6 and 136 with
#: 3.9; tests/test_backward_kernel.py bounds them too.
KNOWN_SPILLS = {"gluon-bf16-dact": 256}


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_gluon_kernel_compiles_for_hopper_without_spills_or_serialised_mmas(reports, kernel):
    r = _report(reports, kernel)
    assert r["spill_bytes"] <= KNOWN_SPILLS.get(kernel, 0), f"{kernel}: {r['spill_bytes']} bytes of spills"
    assert r["serialised"] == "", f"{kernel}: ptxas serialised its wgmmas: {r['serialised']}"
    assert "wgmma.mma_async" in r["ptx"] and ("QGMMA" in r["sass"] or "HGMMA" in r["sass"])


@pytest.mark.parametrize("kernel", ["gluon-plain", "gluon-rescaled-plain-split", "gluon-rescaled-gated",
                                    "gluon-bf16-plain", "gluon-bf16-plain-256"])
def test_the_gluon_epilogues_store_16_bytes_a_thread(reports, kernel):
    """``gluon_kernel.store_layout``: the tile's stores to global memory are 16-byte vectors
    (``st.global.v4.b32``), not the MMA layout's 4-byte (bf16 pairs) or 2-byte (e4m3 pairs) pieces.
    The gated epilogue's only narrow stores are its row scales (one fp32 each)."""
    stores = re.findall(r"^\s*(?:@%p\d+\s+)?(st\.global[\w.]*)", _report(reports, kernel)["ptx"], re.M)
    wide = stores.count("st.global.v4.b32")
    narrow = [s for s in stores if s != "st.global.v4.b32"]
    assert wide >= 4, f"{kernel}: {stores}"
    assert not narrow if "gated" not in kernel else set(narrow) == {"st.global.b32"} and len(narrow) <= 2, (
        f"{kernel}: narrow stores {narrow}")


@pytest.mark.parametrize("kernel", [k for k in KERNELS if k.endswith("-tma")])
def test_the_tma_forms_copy_their_tiles_out_through_tma(reports, kernel):
    """``config.tma_store``: the tile leaves shared memory in TMA copies (``cp.async.bulk.tensor``),
    each buffer written again only after its last copy has read it (``cp.async.bulk.wait_group.read``);
    no ``st.global`` of the tile is left (the gated form stores only its row scales), and the copies'
    buffers fit beside the ring in the 232,448 bytes of shared memory a program may have."""
    r = _report(reports, kernel)
    copies = re.findall(r"cp\.async\.bulk\.tensor\.2d\.global\.shared::cta", r["ptx"])
    stores = re.findall(r"^\s*(?:@%p\d+\s+)?(st\.global[\w.]*)", r["ptx"], re.M)
    assert copies and "cp.async.bulk.wait_group.read" in r["ptx"], kernel
    assert set(stores) <= ({"st.global.b32"} if "gated" in kernel else set()), f"{kernel}: {stores}"
    assert r["shared"] <= 232448, f"{kernel}: {r['shared']} bytes of shared memory"


def test_the_tl_kernel_waits_for_every_mma_and_the_gluon_kernel_keeps_one_in_flight(reports):
    """What notebook 07 shows: the ``tl`` kernel's K loop has one ``wgmma.wait_group 0`` (each
    step's MMA finished before its promotion); the Gluon kernel's loop waits with 1 outstanding,
    and ptxas kept it (``WARPGROUP.DEPBAR.LE gsb0, 0x1`` in the machine code)."""
    tl_report, gluon = _report(reports, "tl-plain"), _report(reports, "gluon-plain")
    assert set(tl_report["wait_groups"]) == {0}
    assert 1 in gluon["wait_groups"] and "WARPGROUP.DEPBAR.LE gsb0, 0x1" in gluon["sass"]
    assert 2 in _report(reports, "gluon-gated")["wait_groups"]     # gate and up in flight together


@pytest.mark.parametrize("kernel,warps", [("gluon-rescaled-gated-split-tma-gather", 4),
                                          ("gluon-rescaled-gated-split-tma-gather-1w", 1)])
def test_the_gather_form_reads_a_by_index_and_fences_it_before_the_mmas(reports, kernel, warps):
    """``gluon_fp8_kernel.GATHER_A``'s form, compiled for sm90 with four load warps or one: A's 128 x 128
    e4m3 tile arrives in 16-byte ``cp.async`` copies (1024 over the load warps' threads) and its 128
    row scales in 4-byte ones, with no global load in the load warps' K loop (the rows' ids are read
    once a tile), one ``cp.async.mbarrier.arrive`` and a meeting of the load warps come
    before the stage's expected bytes, only B still comes through TMA (2 loads a step, against 4 with
    A and its scales), and each MMA partition fences the generic proxy's writes from the MMAs' reads
    after every wait for a stage."""
    gather, sorted_copy = (_report(reports, k) for k in (kernel, "gluon-rescaled-gated-split-tma"))
    ptx = gather["ptx"]
    assert len(re.findall(r"cp\.async\.cg\.shared\.global \[[^]]*\], \[[^]]*\], 0x10", ptx)) == 1024 // (32 * warps)
    assert len(re.findall(r"cp\.async\.ca\.shared\.global \[[^]]*\], \[[^]]*\], 0x4", ptx)) == 128 // (32 * warps)
    assert ptx.count("cp.async.mbarrier.arrive") == 1
    arrive, expect = ptx.index("cp.async.mbarrier.arrive"), ptx.index("mbarrier.arrive.expect_tx")
    back = re.search(r"@%p\d+ bra \t(\$L__BB\d+_\d+);", ptx[arrive:])         # the K loop's branch back
    k_loop = ptx[ptx.index(back.group(1) + ":"):arrive + back.end()]
    assert "cp.async.mbarrier.arrive" in k_loop and "ld.global" not in k_loop     # the ids: once a tile
    assert re.search(r"\bbar(rier)?\.sync" if warps > 1 else r"\bbar\.warp\.sync", ptx[arrive:expect])
    loads = [len(re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::\w+\.global", r["ptx"]))
             for r in (gather, sorted_copy)]
    assert loads == [2, 4], loads
    fences = [r["ptx"].count("fence.proxy.async") for r in (gather, sorted_copy)]
    assert fences[0] - fences[1] == 4, fences             # two waits for a stage in each of two partitions


@pytest.mark.parametrize("kernel", ["gluon-rescaled-gated-split-tma", "gluon-rescaled-plain-split-tma",
                                    "gluon-rescaled-plain", "gluon-plain-tma", "gluon-gated"])
def test_the_rescaled_forms_are_loaded_with_their_multiply_runs_yielding(reports, kernel):
    """``gk.YIELD_RESCALED``: a rescaled form, compiled through the layer's own launch, has its runs of
    multiplies edited before it is loaded (``yield_edit``: the warp yields at every other multiply
    that kept an operand for reuse); the promoted forms are left as ptxas wrote them. Only picked
    multiplies change, each now yielding and keeping nothing for reuse."""
    r = _report(reports, kernel)
    before, after = (yield_edit.instructions(base64.b64decode(r[key])) for key in ("cubin_ptxas", "cubin"))
    changed = [(a, b) for a, b in zip(before, after) if a != b]
    assert len(before) == len(after)
    if kernel.startswith("gluon-rescaled"):
        picked = [i for run in yield_edit.multiply_runs(before) for i in yield_edit.to_yield(run, yield_edit.PATTERN)]
        assert r["yield_edits"] >= 50 and len(changed) == r["yield_edits"] <= len(picked)
        assert {(a.function, a.address) for a, _ in changed} <= {(i.function, i.address) for i in picked}
        assert all(not b.high & (yield_edit.REUSE | yield_edit.NO_YIELD) for _, b in changed)
    else:
        assert r["yield_edits"] == 0 and not changed


@pytest.mark.parametrize("pattern", yield_edit.PATTERNS)
def test_the_yield_edit_changes_only_the_scheduling_bits_of_multiplies_in_runs(reports, pattern):
    """``interleave_yields`` on a form ptxas wrote: the same instructions at the same addresses, the
    same first words; in the second words only the yield bit and reuse flags, only of multiplies in a
    run, as many as ``to_yield`` picks."""
    cubin = base64.b64decode(_report(reports, "gluon-plain-tma")["cubin"])
    before = yield_edit.instructions(cubin)
    edited, n = yield_edit.interleave_yields(cubin, pattern=pattern)
    after = yield_edit.instructions(edited)
    in_runs = {(i.function, i.address) for run in yield_edit.multiply_runs(before) for i in run}
    changed = [(a, b) for a, b in zip(before, after) if a != b]
    assert len(after) == len(before) and len(edited) == len(cubin)
    picks = sum(len(yield_edit.to_yield(run, pattern)) for run in yield_edit.multiply_runs(before))
    assert 0 < n == len(changed) <= picks
    if pattern != "reuse-alternate":             # every pick yields now: a second edit finds nothing to change
        assert yield_edit.interleave_yields(edited, pattern=pattern)[1] == 0
    for a, b in changed:
        assert (a.function, a.address) in in_runs and a.low == b.low
        assert (a.high ^ b.high) & ~(yield_edit.REUSE | yield_edit.NO_YIELD) == 0 and not b.high & yield_edit.NO_YIELD
        assert a.text.replace(".reuse", "") == b.text


def test_the_yield_edit_refuses_what_it_does_not_know():
    with pytest.raises(ValueError, match="pattern"):
        yield_edit.to_yield([], "every third")
    with pytest.raises(ValueError, match="not an argument"):
        yield_edit.edit_compiled_forms(gk.gather_sorted_fp8_kernel, "RESCALE")


# ------------------------------------------------------------------ the kernel on a Hopper GPU

def _cfg(bm, warps, stages, block_n=128, **kw):
    return KernelConfig(block_m=bm, block_n=block_n, block_k=128, num_warps=warps, num_stages=stages,
                        short_tails=False, gluon=True, **kw)


FIRST_CONFIGS = {"128x8": _cfg(128, 8, 4), "64x4": _cfg(64, 4, 6), "256 two waves": _cfg(256, 8, 3),
                 "group 1": _cfg(128, 8, 3, group_m=1), "128x256 rescaled": _cfg(128, 8, 4, 256, rescale=True),
                 "128x256 rescaled, group 1": _cfg(128, 8, 3, 256, rescale=True, group_m=1),
                 "128x256 rescaled, split": _cfg(128, 4, 4, 256, rescale=True)}
#: The layer's Gluon forms: (gate/up config, down config).
LAYER_CONFIGS = {"fused": (_cfg(64, 8, 4), _cfg(64, 4, 6)), "unfused": (_cfg(128, 8, 4), _cfg(128, 8, 4)),
                 "rescaled": (_cfg(128, 8, 4, rescale=True), _cfg(128, 8, 4, 256, rescale=True)),
                 "rescaled, split": (_cfg(128, 4, 4, rescale=True), _cfg(128, 4, 4, 256, rescale=True)),
                 # C out through TMA copies (the down GEMM's rows left in sorted order): the 256-wide
                 # down tile's four buffers take a stage's room.
                 "fused, tma": (_cfg(64, 8, 4, tma_store=True), _cfg(64, 4, 6, tma_store=True)),
                 "rescaled, split, tma": (_cfg(128, 4, 4, rescale=True, tma_store=True),
                                          _cfg(128, 4, 3, 256, rescale=True, tma_store=True)),
                 "rescaled, tma": (_cfg(128, 8, 4, rescale=True, tma_store=True),
                                   _cfg(128, 8, 3, 256, rescale=True, tma_store=True))}


def _problem(M, E, N, K, topk, seed=0, skip_expert=None):
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(M, K, device=DEV, generator=g, dtype=torch.bfloat16)
    w = torch.randn(E, N, K, device=DEV, generator=g, dtype=torch.bfloat16) * K ** -0.5
    logits = torch.randn(M, E, device=DEV, generator=g)
    if skip_expert is not None:
        logits[:, skip_expert] = -1e9                        # an expert no token picks
    tw, ids = mt.route(logits, topk)
    return x, w, tw, ids


def _fp8_layer_problem(M, E, inter, K, topk):
    """A layer's problem (:func:`_problem`, expert 0 picked by no token) with its experts quantised as
    the FP8 layer takes them: ``x, q13, s13, q2, s2, tw, ids``. The bf16 experts are not kept
    (DeepSeek-V3's are 22 GB, beside the float64 experts of a reference)."""
    x, w13, tw, ids = _problem(M, E, 2 * inter, K, topk, skip_expert=0)
    w2 = torch.randn(E, K, inter, device=DEV, dtype=torch.bfloat16) * inter ** -0.5
    return x, *quantize_w13(w13), *quantize_weight(w2), tw, ids


@needs_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("name", FIRST_CONFIGS)
@pytest.mark.parametrize("M,E,N,K,topk", [(200, 8, 384, 320, 2), (1, 4, 256, 256, 2), (3000, 64, 1408, 2048, 6)])
def test_gluon_first_gemm_matches_float64(name, M, E, N, K, topk):
    x, w, _, ids = _problem(M, E, N, K, topk, skip_expert=E - 1)
    x_q, x_s = quantize_rows(x)
    w_q, w_s = quantize_weight(w)
    out = fp8_moe_matmul(x_q, x_s, w_q, w_s, ids, config=FIRST_CONFIGS[name])
    ref = reference_moe_matmul(dequantize_activations(x_q, x_s), dequantize_weight(w_q, w_s), ids)
    assert bool(torch.isfinite(out).all())
    assert rel_error(out, ref) < 1e-2


@needs_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("form", LAYER_CONFIGS)
@pytest.mark.parametrize("M,E,inter,K,topk", [(300, 8, 192, 320, 2), (2048, 128, 768, 2048, 8),
                                              (512, 256, 2048, 7168, 8)])
def test_gluon_layer_matches_its_step_exact_float64_reference(form, M, E, inter, K, topk):
    x, q13, s13, q2, s2, tw, ids = _fp8_layer_problem(M, E, inter, K, topk)
    configs = LAYER_CONFIGS[form]
    if form == "unfused" and inter % 128:
        with pytest.raises(ValueError, match="multiple of 128"):
            fp8_moe_layer(x, q13, s13, q2, s2, tw, ids, configs=configs)
        return
    out = fp8_moe_layer(x, q13, s13, q2, s2, tw, ids, configs=configs)
    # float64 copies of the experts these rows touch: 6 rows where each touches 8 of 256 experts,
    # so that DeepSeek-V3's case fits an 80 GB card (16 rows took 128 experts, 60 GB)
    rows = torch.linspace(0, M - 1, 16 if E < 256 else 6, device=DEV).round().long().unique()
    used = torch.unique(ids[rows])
    local = torch.searchsorted(used, ids[rows].long()).to(torch.int32)
    ref = reference_fp8_moe_layer(x[rows].float(), q13[used], s13[used], q2[used], s2[used], tw[rows], local)
    assert bool(torch.isfinite(out).all())
    assert rel_error(out[rows], ref) < FP8_LAYER_TOLERANCE
    # The same numbers as the tl kernel's layer, within the rounding flips both allow.
    assert rel_error(out.float(), fp8_moe_layer(x, q13, s13, q2, s2, tw, ids).float()) < FP8_LAYER_TOLERANCE


@needs_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("form", LAYER_CONFIGS)
def test_the_sorted_quantiser_gives_the_layer_the_same_bits(form):
    """The Gluon layer with its quantiser writing into sorted order: bitwise the layer that
    quantises, then gathers (the same e4m3 rows and scales reach the same GEMMs)."""
    M, E, inter, K, topk = 700, 16, 256, 512, 4
    x, q13, s13, q2, s2, tw, ids = _fp8_layer_problem(M, E, inter, K, topk)
    up, down = LAYER_CONFIGS[form]
    alignment = align_block_size(ids, up.block_m, E)
    outs = [gk.gluon_fp8_layer(x, q13, s13, q2, s2, tw, alignment, topk, up, down, sorted_quantiser=flag)
            for flag in (False, True)]
    assert bool(torch.isfinite(outs[1]).all()) and torch.equal(outs[0], outs[1])


@needs_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("form", ["fused", "rescaled, split", "rescaled"])
def test_tma_copies_out_give_the_layer_the_same_bits(form):
    """The same tiles, stored through ``gl.store`` (down rows to their pairs) or through TMA copies
    (down rows left in sorted order, summed through their positions): the same bits, an expert
    with no tokens and a padded last row block included."""
    M, E, inter, K, topk = 700, 16, 256, 512, 4
    x, q13, s13, q2, s2, tw, ids = _fp8_layer_problem(M, E, inter, K, topk)
    outs = [fp8_moe_layer(x, q13, s13, q2, s2, tw, ids, configs=LAYER_CONFIGS[name]) for name in (form, form + ", tma")]
    assert bool(torch.isfinite(outs[1]).all()) and torch.equal(outs[0], outs[1])


@needs_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("warps", [4, 1])
@pytest.mark.parametrize("form", ["rescaled, split", "rescaled, split, tma"])
@pytest.mark.parametrize("M,E,inter,K,topk", [(700, 16, 256, 512, 4), (2048, 128, 768, 2048, 8), (5, 8, 256, 384, 2)])
def test_reading_a_by_index_gives_the_layer_the_same_bits(form, M, E, inter, K, topk, warps, monkeypatch):
    """The gate/up GEMM reading x's rows by index (cp.async, ``gather_a``, four load warps or one)
    against reading a sorted copy through TMA: the same e4m3 rows and scales reach the same MMAs, so
    the same bits, an expert with no tokens, a padded last row block and a K of three steps included."""
    monkeypatch.setattr(gk, "GATHER_WARPS", warps)
    x, q13, s13, q2, s2, tw, ids = _fp8_layer_problem(M, E, inter, K, topk)
    up, down = LAYER_CONFIGS[form]
    alignment = align_block_size(ids, up.block_m, E)
    outs = [gk.gluon_fp8_layer(x, q13, s13, q2, s2, tw, alignment, topk, up, down, gather_a=flag)
            for flag in (False, True)]
    assert bool(torch.isfinite(outs[1]).all()) and torch.equal(outs[0], outs[1])


def test_the_layer_reads_a_by_index_where_the_h100_run_found_it_faster(monkeypatch):
    """``gathers_a``: only the gate/up GEMM's split form, x under 2**31 elements, and then the measured
    rule (I at most ``GATHER_MAX_INTER``) or the experiments' override. The rule agrees with every case
    of ``data/h100_fp8_gather.csv`` read with four load warps: faster by index exactly where it holds."""
    from moe_tutorial.experiments import gluon_fp8

    split, fused = LAYER_CONFIGS["rescaled, split"][0], LAYER_CONFIGS["fused"][0]
    assert gk.split_form(split) and not gk.split_form(fused)
    assert gk.gathers_a(split, 4096 * 2048, 768) and not gk.gathers_a(split, 4096 * 7168, 2048)
    assert not gk.gathers_a(fused, 4096 * 2048, 768) and not gk.gathers_a(split, gk.GATHER_MAX_ELEMENTS, 768)
    monkeypatch.setattr(gk, "GATHER_A", True)
    assert gk.gathers_a(split, 10, 2048) and not gk.gathers_a(fused, 10, 768)
    monkeypatch.setattr(gk, "GATHER_A", False)
    assert not gk.gathers_a(split, 10, 768)
    monkeypatch.setattr(gk, "GATHER_A", None)
    cases = [g for g in gluon_fp8.gather_gains(gluon_fp8.load_gather()) if g["warps"] == "4 load warps"]
    assert {g["model"] for g in cases} == {"Qwen3-30B-A3B", "DeepSeek-V3", "Kimi-K2"}
    assert all(g["same_bits"] for g in cases)
    for g in cases:
        shape = get_shape(g["model"])
        assert (g["gain"] > 1) == gk.gathers_a(split, g["M"] * shape.hidden, shape.intermediate), g


def test_reading_a_by_index_is_refused_outside_the_gate_up_split_form():
    """``gather_scales``: only the gate/up GEMM's rescaled split form has the load warp that reads A by
    index; any other form (or the down GEMM) is refused with the form named, before any launch."""
    x_q = torch.zeros(8, 256, dtype=torch.float8_e4m3fn)
    x_s = torch.ones(8, 2)
    w, w_s = torch.zeros(4, 512, 256, dtype=torch.float8_e4m3fn), torch.ones(4, 4, 2)
    alignment = (torch.zeros(64, dtype=torch.int32), torch.zeros(1, dtype=torch.int32), torch.tensor([64]))
    act, act_st = torch.empty(64, 256, dtype=torch.float8_e4m3fn), torch.empty(2, 64)
    for form, gated in (("fused", True), ("rescaled", True), ("rescaled, split", False)):
        config = LAYER_CONFIGS[form][0 if gated else 1]        # the down GEMM's split form, 256 wide
        kwargs = dict(c_scale_t=act_st) if gated else dict(c_sorted=True)
        out = act if gated else torch.empty(64, 512, dtype=torch.bfloat16)
        with pytest.raises(ValueError, match="read by index only in the gate/up GEMM's rescaled split form"):
            gk.launch_gluon_fp8_gemm(x_q, None, w, w_s, out, alignment, 16, config, gather_scales=x_s, topk=2,
                                     **kwargs)


@needs_hopper
@pytest.mark.gpu
@pytest.mark.parametrize("pattern", yield_edit.PATTERNS)
def test_the_yield_edit_gives_the_layer_the_same_bits(pattern):
    """The rescaled layer as ptxas wrote it (its forms swapped for unedited twins) and edited in each
    pattern: only scheduling bits changed, so the same bits out (an expert with no tokens included)."""
    from moe_tutorial.experiments.yield_bits import Yielding
    M, E, inter, K, topk = 700, 16, 256, 512, 4
    x, q13, s13, q2, s2, tw, ids = _fp8_layer_problem(M, E, inter, K, topk)

    def call():
        return fp8_moe_layer(x, q13, s13, q2, s2, tw, ids, configs=LAYER_CONFIGS["rescaled, split, tma"])
    call()                                                   # compiled (edited or not, as the layer ships)
    plain, yielding = Yielding(gk.gluon_fp8_moe_kernel, None)(call), Yielding(gk.gluon_fp8_moe_kernel, pattern)
    edited = yielding(call)
    assert sum(yielding.changed.values()) > 0
    assert bool(torch.isfinite(edited).all()) and torch.equal(plain, edited)


@needs_hopper
@pytest.mark.gpu
def test_a_layer_that_mixes_the_two_kernels_is_refused():
    x, w13, tw, ids = _problem(64, 8, 256, 256, 2)
    q13, s13 = quantize_w13(w13)
    q2, s2 = quantize_weight(torch.randn(8, 256, 128, device=DEV, dtype=torch.bfloat16))
    tl_cfg = KernelConfig(block_m=64, block_n=128, block_k=128, short_tails=False)
    with pytest.raises(ValueError, match="both configs or neither"):
        fp8_moe_layer(x, q13, s13, q2, s2, tw, ids, configs=(_cfg(64, 8, 4), tl_cfg))


@needs_hopper
@pytest.mark.gpu
def test_the_rescaled_kernel_gives_blocks_of_zeros_stored_with_scale_0_nothing():
    """Rescaling in place divides by each step's scales: a block of zeros stored with scale 0 (as a
    checkpoint may hold it) must add nothing and leave the sum's units alone, at the first K step
    (an activation block) and at a later one (a weight block); the rest as the float64 reference."""
    x, w, _, ids = _problem(300, 8, 512, 640, 2)
    x_q, x_s = quantize_rows(x)
    w_q, w_s = quantize_weight(w)
    x_q.view(torch.uint8)[0, :128] = 0       # e4m3's zero is the byte 0
    x_s[0, 0] = 0.0                          # token 0's first K block: zeros, scale 0
    w_q.view(torch.uint8)[1, 128:256, 256:384] = 0
    w_s[1, 1, 2] = 0.0                       # expert 1, rows 128-255, third K block
    out = fp8_moe_matmul(x_q, x_s, w_q, w_s, ids, config=FIRST_CONFIGS["128x256 rescaled"])
    ref = reference_moe_matmul(dequantize_activations(x_q, x_s), dequantize_weight(w_q, w_s), ids)
    assert bool(torch.isfinite(out).all())
    assert rel_error(out, ref) < 1e-2
    assert rel_error(out[0], ref[0]) < 1e-2


@pytest.mark.parametrize("changes", [{"block_n": 64}, {"block_n": 256}, {"rescale": True}])
def test_the_gluon_kernel_refuses_tiles_it_does_not_have(changes):
    bad = KernelConfig(**{**_cfg(128, 8, 4).as_dict(), **changes})
    with pytest.raises(ValueError, match="block_k = 128 and block_n = (128|256) here"):
        gk.launch_gluon_fp8_gemm(None, None, torch.empty(1, 1, 1), None, torch.empty(1, 1), (None, None, None), 1,
                                 bad)


def test_the_rescaled_kernel_refuses_rows_its_warps_do_not_hold():
    bad = _cfg(64, 8, 4, 256, rescale=True)
    with pytest.raises(ValueError, match="16 rows a warp .* got block_m = 64, num_warps = 8"):
        gk.launch_gluon_fp8_gemm(None, None, torch.empty(1, 1, 1), None, torch.empty(1, 1), (None, None, None), 1,
                                 bad)


@pytest.mark.parametrize("bad,c,match", [
    (_cfg(128, 8, 4, tma_store=True), torch.empty(1, 1), "C must be in sorted order"),
    (_cfg(256, 8, 3, tma_store=True), torch.empty(4, 8), "two-wave form"),
    (_cfg(128, 8, 4, tma_store=True), torch.empty(4, 9), "16-byte aligned rows")])
def test_a_tma_copy_out_refuses_c_it_cannot_write(bad, c, match):
    with pytest.raises(ValueError, match=match):
        gk.launch_gluon_fp8_gemm(None, None, torch.empty(1, 1, 1), None, c, (None, None, None), 1, bad,
                                 c_sorted=c.shape != (1, 1))


def test_only_the_gluon_kernel_rescales():
    with pytest.raises(ValueError, match="config.rescale: only the Gluon kernel"):
        check_fp8_config(KernelConfig(block_m=64, block_n=128, block_k=128, rescale=True))
    with pytest.raises(ValueError, match="config.tma_store: only the Gluon kernel"):
        check_fp8_config(KernelConfig(block_m=64, block_n=128, block_k=128, tma_store=True))


def tma_form(config, gated: bool) -> str:
    """The name of the sm90 compile target (``experiments/sm90.py``'s TMA_KERNELS) that is ``config``'s
    TMA form, as the layer launches it."""
    if config.rescale:
        return f"gluon-rescaled-{'gated' if gated else 'plain'}{'-split' if config.num_warps == 4 else ''}-tma"
    return "gluon-gated-tma" if gated else ("gluon-plain-128-tma" if config.block_m == 128 else "gluon-plain-tma")


@pytest.mark.parametrize("model,M", [("Qwen3-30B-A3B", 16384), ("Qwen3-30B-A3B", 4096), ("Qwen3-30B-A3B", 3072),
                                     ("Qwen3-30B-A3B", 1024), ("DeepSeek-V3", 6144), ("DeepSeek-V3", 4096),
                                     ("DeepSeek-V3", 256), ("Kimi-K2", 16384), ("Kimi-K2", 8192), ("Kimi-K2", 7680),
                                     ("Kimi-K2", 4096)])
@pytest.mark.parametrize("table", [None, "NVIDIA H200"])
def test_the_layer_copies_its_tiles_out_through_tma_where_measured_in_forms_compiled_for_sm90(monkeypatch, model,
                                                                                            M, table):
    """``layer_configs`` sets ``tma_store`` on both Gluon GEMMs where their tiles have 128 rows and an
    expert averages ``configs.GLUON_RESCALED_ROWS`` rows or more (``configs.layer_copies_out``; the
    cases include both sides of that line), each exactly one form the compile
    test above builds for sm90, a 256-wide tile on 3 stages (its shared memory); elsewhere, with the
    ``tl`` kernel, and with ``tma_store=False`` the configurations are unchanged. Under the heuristic
    (any Hopper) and under the H200's tuned table, whose 128-row tiles start at fewer rows an expert."""
    from moe_tutorial.experiments.sm90 import TMA_KERNELS
    from moe_tutorial.kernels.fp8_layer import layer_configs

    monkeypatch.setattr(configs, "gluon_fp8_available", lambda: True)
    monkeypatch.setattr(configs.runtime, "INTERPRETED", False)           # the GPU's choice, not the CPU's
    if table is None:
        monkeypatch.setattr(configs, "tuned_config", lambda *a, **k: None)
    else:
        monkeypatch.setattr(configs, "gpu_name", lambda: table)
    s = get_shape(model)
    args = (M, s.num_experts, s.intermediate, s.hidden, s.topk)
    rows = M * s.topk // s.num_experts
    copied = 0
    for kernel in (None, "gluon", "tl"):
        pair, before = layer_configs(*args, kernel=kernel), layer_configs(*args, kernel=kernel, tma_store=False)
        expect = before[0].gluon and before[0].block_m == 128 and rows >= configs.GLUON_RESCALED_ROWS
        for c, c0, gated in zip(pair, before, (True, False)):
            check_fp8_config(c)
            assert not c0.tma_store
            assert c.tma_store == expect, (c, rows)
            if c.tma_store:
                copied += 1
                assert (c.block_m, c.num_warps, c.num_stages) == TMA_KERNELS[tma_form(c, gated)], c
                assert c.num_stages == (3 if c.block_n == 256 else c0.num_stages)
                assert c == replace(c0, tma_store=True, num_stages=c.num_stages)
            else:
                assert c == c0
        if kernel == "tl":
            assert not pair[0].gluon
        elif kernel == "gluon":
            assert pair[0].gluon and pair[1].gluon
    assert (copied > 0) == (rows >= configs.GLUON_RESCALED_ROWS)


# (model, M) -> (plain GEMM, gate/up, down) as the H100 sweep of 2026-12-06 ranked them: where the
# rescaled form won ("rescaled") and where the 128-wide Gluon kernel, the tl kernel (under 128 rows an
# expert) or the fused 64-row layer did. Kimi-K2's first GEMM did not fit the H100 (its entry is the rule's).
HEURISTIC_CASES = {("Qwen3-30B-A3B", 16384): ("rescaled", "rescaled"),
                   ("Qwen3-30B-A3B", 4096): ("rescaled", "rescaled"),
                   ("Qwen3-30B-A3B", 1024): ("tl", "fused"),
                   ("DeepSeek-V3", 16384): ("128 wide", "rescaled"),
                   ("DeepSeek-V3", 4096): ("128 wide", "fused"),
                   ("Kimi-K2", 16384): ("128 wide", "rescaled")}


@pytest.mark.parametrize("model,M", HEURISTIC_CASES)
def test_the_untuned_choice_rescales_where_the_h100_sweep_found_it_faster(monkeypatch, model, M):
    """Without a tuned entry (any Hopper but the H200, whose table holds its own measurements) the
    heuristic takes the rescaled form where it won: the plain GEMM where one wave's weights fit the
    L2, the layer from ``configs.GLUON_RESCALED_ROWS`` rows an expert (these cases lie on either side
    of it; the rows near it are the tile-height test's, tests/test_prose_part7.py)."""
    monkeypatch.setattr(configs, "gluon_fp8_available", lambda: True)
    s = get_shape(model)
    E, topk, H, inter = s.num_experts, s.topk, s.hidden, s.intermediate
    plain = configs.fp8_heuristic_config(M, topk, E, "plain", N=2 * inter, K=H)
    up = configs.fp8_heuristic_config(M, topk, E, "gated", N=inter, K=H)
    down = configs.fp8_heuristic_config(M, topk, E, "down", N=H, K=inter, kernel="gluon")   # as layer_configs
    want_plain, want_layer = HEURISTIC_CASES[model, M]
    if want_plain == "tl":
        assert not plain.gluon
    else:
        assert plain == (configs.GLUON_RESCALED_WIDE if want_plain == "rescaled" else configs.GLUON_PLAIN)
    if want_layer == "rescaled":
        assert (up, down) == (configs.GLUON_RESCALED, configs.GLUON_RESCALED_WIDE)
    else:
        assert (up, down) == (configs.GLUON_FUSED_UP, configs.GLUON_FUSED_DOWN)
    for config in (plain, up, down):
        check_fp8_config(config)


# ------------------------------------------------------------------ rescaling in place, the arithmetic

@pytest.mark.parametrize("seed", range(4))
def test_rescaling_in_place_sums_what_promotion_sums(seed):
    """Over a DeepSeek-V3-long K (56 steps) of random products and scales spanning six orders of
    magnitude, the sum kept in the last step's units equals the promoted sum within fp32 rounding,
    both against float64."""
    g = torch.Generator().manual_seed(seed)
    products = torch.randn(56, 64, generator=g) * 3e5
    scales = 10 ** (torch.rand(56, 64, generator=g) * 6 - 7)
    exact = (products.double() * scales.double()).sum(0)
    promoted, rescaled = promoted_and_rescaled(products, scales)
    assert rel_error(promoted, exact) < 1e-6 and rel_error(rescaled, exact) < 1e-6


def test_rescaling_in_place_keeps_zero_scales_and_nan():
    products = torch.tensor([[0.0, 5.0, 2.0], [4.0, 0.0, 1.0], [2.0, 3.0, 7.0]])
    scales = torch.tensor([[0.0, 0.5, 1.0], [2.0, 0.0, 1.0], [0.25, 4.0, float("nan")]])
    promoted, rescaled = promoted_and_rescaled(products, scales)
    assert torch.equal(rescaled[:2], torch.tensor([8.5, 14.5])) and torch.equal(promoted[:2], rescaled[:2])
    assert rescaled[2].isnan() and promoted[2].isnan()
