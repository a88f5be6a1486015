"""Every number the prose of notebooks 04 and 05 states, rendered from the committed H200 data or the
code it comes from: when the data (``moe_tutorial/data/h200_bench.csv``), a shape or a constant
changes, the stale sentence fails here, and the failure shows what the notebook says instead.

Qualitative claims that hang on the data ("above 1", "the earliest crossing is past a few hundred
tokens", "rotated reads higher at M = 1") are asserted too, with a message saying which paragraph to
rewrite when a new run contradicts them.
"""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

import inspect
import json

import numpy as np
import pytest
from prose import NOTEBOOKS, assert_says, fmt2, markdown

from moe_tutorial import intermediate_bytes
from moe_tutorial.figures import part4, perf
from moe_tutorial.figures.part2 import H200_MEMORY_BYTES, format_bytes
from moe_tutorial.kernels.align import SMALL_BATCH_PAIRS
from moe_tutorial.perf import bench, reached, report, results, timing, traffic
from moe_tutorial.perf import impls as bench_impls
from moe_tutorial.shapes import BATCH_SIZES, HEADLINE_MODELS, get_shape

P4, P5 = "04_sorted_production_kernel", "05_performance"
SMALL, LARGE, DECODE = (1, 8, 64, 256), (1024, 4096, 16384), (1, 8, 64)


@pytest.fixture(scope="module")
def rows():
    return results.load_rows(results.H200_RESULTS)


@pytest.fixture(scope="module")
def ceil(rows):
    """The ceilings both notebooks quote: those of the cold-l2 run that timed Part 4."""
    return report.headline_ceilings(rows)


def code(notebook: str) -> str:
    """All code cells of a notebook, joined."""
    cells = json.loads((NOTEBOOKS / f"{notebook}.ipynb").read_text())["cells"]
    return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def x(gain: float) -> str:
    return f"{gain:.2f}x"


def gains(rows, before, after, Ms=None, gemm="first") -> str:
    """A step's gain range as the prose states it: '1.01x to 1.15x'."""
    lo, hi = report.gain_range(rows, gemm, before, after, Ms=Ms)
    return f"{x(lo)} to {x(hi)}"


def largest(rows, before, after, Ms=None, gemm="first") -> str:
    gain, model, M = report.largest_gain(rows, gemm, before, after, Ms=Ms)
    return f"{model} at M = {M} ({x(gain)})"


def trio(values: dict, impl: str) -> str:
    """Three models' values, 'a / b / c', in the series' order."""
    return " / ".join(fmt2(values[m, impl]) for m in HEADLINE_MODELS)


# --------------------------------------------------------------------------------------
# Both notebooks


@pytest.mark.parametrize("notebook", [P4, P5])
def test_no_design_brief_no_hard_coded_ceilings(notebook):
    for text in (markdown(notebook), code(notebook)):
        assert "DESIGN" + ".md" not in text     # the series' old design brief, not in the repository
        assert "H200_COPY_TBPS" not in text and "H200_MATMUL_TFLOPS" not in text
        assert "copy engine" not in text        # TMA is the Tensor Memory Accelerator


def test_titles():
    assert markdown(P5).startswith("# Part 5: the performance chapter, measured against what the hardware allows ")
    assert markdown(P4).startswith("# Part 4: ")


# --------------------------------------------------------------------------------------
# 04: the idea, then one production step at a time


def test_04_part3_against_tensor_cores(rows, ceil):
    peak = max(report.best_tflops(rows, "fused").values())
    assert_says(P4, "On the H200, Part 3's kernel peaked at {:.1f} TFLOP/s (notebook 03 measures why), against {:.0f} "
                    "TFLOP/s for a bf16 matmul on tensor cores in the run that timed Part 4.",
                peak, ceil["matmul_tflops"])


def test_04_accurate_about_vllm_and_tma():
    text = markdown(P4)
    assert "what vLLM and SGLang actually run" not in text
    assert_says(P4, "The result is vLLM-style")
    assert_says(P4, "plus SiLU(gate) * up in the gate/up GEMM's epilogue and short tails, which vLLM's Triton path "
                    "does not have (it runs SiLU * up as a separate op)")
    assert_says(P4, "The **Tensor Memory Accelerator** (TMA)")
    assert_says(P4, "Part 4's layer is vLLM-style, plus SiLU(gate) * up in the epilogue and short tails (appendix F")
    assert_says(P4, "[`exercises/part4_exercises.ipynb`](exercises/part4_exercises.ipynb)")
    # Appendix F's map: vLLM's Triton path has no swapped operands; notebook 07's FP8 kernel has them.
    assert_says(P4, "**Swapped operands** are not in the Triton path")
    assert_says(P4, "notebook 07's Triton FP8 kernel does the same (`SWAP_AB`)")
    assert "SWAP_AB" in inspect.getsource(__import__("moe_tutorial.kernels.fp8_kernel", fromlist=["_"]))
    assert (NOTEBOOKS / "exercises" / "part4_exercises.ipynb").exists()


#: What notebook 04's map (section 11) states about vLLM, as read in vLLM's source (vllm-project/vllm:
#: vllm/model_executor/layers/fused_moe/fused_moe.py at 13cb3e4, csrc/moe/moe_align_sum_kernels.cu,
#: csrc/quantization/cutlass_w8a8/moe/grouped_mm_c3x_sm90.cu). vLLM is not installed here, so these are
#: recorded once, in this place; re-read the source and update both when the map moves to a newer commit.
VLLM = dict(commit="13cb3e4", small_align_pairs=1024, small_align_experts=64, swap_rows=64, swap_tile=(128, 16),
            default_small_block_m=16, split_k=1)


def test_04_vllm_map_states_what_the_source_does():
    v = VLLM
    assert_says(P4, "(read at commit `{}`:", v["commit"])
    assert_says(P4, "`get_default_config`, {}-row tiles when M ≤ E", v["default_small_block_m"])
    assert_says(P4, "`moe_align_block_size` runs one block for fewer than {} pairs and at most {} experts",
                v["small_align_pairs"], v["small_align_experts"])
    assert_says(P4, "the launcher sets `SPLIT_K` to {} and the kernel never reads it", v["split_k"])
    assert_says(P4, "swaps A and B when A has at most {} rows, so the weights fill the tile's {}-row side and the "
                    "tokens its {}-wide side", v["swap_rows"], *v["swap_tile"])
    assert "swap_ab" not in markdown(P4).split("## Recap")[0], \
        "the map (appendix F) is where vLLM's swapped operands are placed"


def test_04_examples_match_their_cells():
    src = code(P4)
    assert "random_topk_ids(64, 8, 2," in src
    assert_says(P4, "for a Mixtral-like routing (8 experts, top-2)")
    assert "M, topk, E, block_m = 6, 2, 4, 4" in src
    assert_says(P4, "Here is a small case: 6 tokens, top-2 of 4 experts, `block_m = 4`.")
    assert "torch.randn(M, 8, generator=g), torch.randn(E, 4, 8, generator=g)" in src
    assert_says(P4, "(`x [6, 8]`, weights `[4 experts, 4 outputs, 8]`)")
    assert_says(P4, "together write each of the {} rows exactly once", 6 * 2)
    # The worked example's results are stated in notebooks 01 and 02; 04's cells check against them.
    assert "ex.first_gemm" in src and "ex.layer" in src
    assert_says(P4, "On the worked example, against its known result and the production kernel (appendix D: random "
                    "problems with awkward sizes")
    assert_says(P4, "The worked example's layer, then a random layer through Parts 1 to 4")


def test_04_padding_at_decode():
    mixtral, block = get_shape("Mixtral-8x7B"), 16
    rows_used = mixtral.topk * block               # one block per chosen expert, one real row each
    assert_says(P4, "At M = 1 almost every row is padding ({} of {} on Mixtral)", rows_used - mixtral.topk, rows_used)


def test_04_minimal_against_finished(rows):
    assert_says(P4, "the finished kernel of this notebook is {} as fast as this one", gains(rows, "minimal", "sorted",
                                                                                            DECODE))
    assert_says(P4, "At M ≥ 1024, where the GEMM is bound by arithmetic, it is {} as fast.",
                gains(rows, "minimal", "sorted", LARGE))
    top = x(report.gain_range(rows, "first", "minimal", "sorted", Ms=DECODE)[1])
    assert_says(P4, "At M ≤ 64 the finished kernel is at most {} faster.", top)


def test_04_noise_from_same_kernel_pairs(rows):
    pairs = report.same_kernel_pairs(rows)
    first, layer = report.spread_percent(pairs, "first"), report.spread_percent(pairs, "layer")
    assert_says(P4, "Two timings of the same kernel differ by up to {:.1f}% (GEMM) and {:.1f}% (layer)", first, layer)
    assert_says(P4, "layer step 3 above {} pairs): their two timings measure the noise, and a gain inside it is no "
                    "evidence", SMALL_BATCH_PAIRS)


def test_04_grouped_order(rows):
    assert_says(P4, "5 row blocks, 3 column blocks, `GROUP_M = 2`")
    assert "num_pid_m, num_pid_n, GROUP_M = 5, 3, 2" in code(P4)
    # "The last group has only one row block.": the row blocks each group of GROUP_M * num_pid_n = 6 pids covers.
    pids = part4.tile_pids(5, 3, 2)
    rows_of_group = [sorted({m for m in range(5) for p in pids[m] if p // 6 == g}) for g in range(3)]
    assert rows_of_group == [[0, 1], [2, 3], [4]], rows_of_group
    assert part4.tile_pids(5, 3, 2)[4, 1] == 13     # the answer the reader predicts
    assert_says(P4, "40 tokens with top-2 of 4 experts, `BLOCK_M = 8`, 12 column blocks, in three orders:")
    assert "random_topk_ids(40, 4, 2," in code(P4) and "num_pid_n=12" in code(P4)
    # "Whole columns load the fewest weight tiles and the most x blocks; row-major the reverse; grouped order sits
    # between and loads the least in all", on the figure's example.
    from moe_tutorial import align_block_size
    from moe_tutorial.shapes import random_topk_ids

    import torch

    experts = align_block_size(random_topk_ids(40, 4, 2, generator=torch.Generator().manual_seed(0)), 8, 4)[1].tolist()
    loads = {g: part4.wave_loads(part4.tile_pids(len(experts), 12, g), experts, 12) for g in (len(experts), 1, 4)}
    columns, row_major, grouped = loads[len(experts)], loads[1], loads[4]
    assert columns[1] < grouped[1] < row_major[1] and columns[0] > grouped[0] > row_major[0]
    assert sum(grouped) < min(sum(columns), sum(row_major))
    mixtral = get_shape("Mixtral-8x7B")
    gathered = 16384 * mixtral.topk * mixtral.hidden * 2
    assert_says(P4, "M = 16384 Mixtral's gate/up GEMM gathers {} rows of {} bf16 values ({:.0f} MB",
                16384 * mixtral.topk, mixtral.hidden, gathered / 1e6)
    assert_says(P4, "At M ≤ 256 the step moves the time by {}", gains(rows, "minimal", "+grouped", SMALL))
    assert_says(P4, "At M ≥ 1024 it gains {}, most on {}:", gains(rows, "minimal", "+grouped", LARGE),
                largest(rows, "minimal", "+grouped"))


def test_04_tuned_tiles(rows):
    assert_says(P4, "The heuristic was written from what the tuner found on these three models, so here tuning "
                    "changes little: at most {}.", largest(rows, "+grouped", "+tuned"))
    worst = min((g, m, M) for (m, M), g in report.step_gains(rows, "first", "+grouped", "+tuned").items())
    assert_says(P4, "tuned tile can even come out slower: {} on {} at M = {}.", x(worst[0]), worst[1], worst[2])


def test_04_tma(rows):
    # "At M ≥ 4096, where every model uses TMA"
    assert all(report.tuned_config(m, M).use_tma for m in HEADLINE_MODELS for M in (4096, 16384)), \
        "the tuned table no longer uses TMA at M >= 4096 everywhere: rewrite notebook 04's step 3 paragraph"
    assert_says(P4, "At M ≥ 4096, where every model uses TMA and the GEMM is bound by arithmetic, TMA gains {}:",
                gains(rows, "+tuned", "+tma", (4096, 16384)))
    assert_says(P4, "At small M it gains most on {}.", largest(rows, "+tuned", "+tma", DECODE))


def test_04_short_tails(rows, ceil):
    ridge = ceil["matmul_tflops"] / ceil["read_tbps"]
    ai = {m: float(perf.intensity(get_shape(m), 1024)) for m in HEADLINE_MODELS}
    assert ai["Mixtral-8x7B"] > ridge > 2 * max(ai["Qwen3-30B-A3B"], ai["DeepSeek-V3"]), \
        "at M = 1024 Mixtral should be past the ridge and the other two far below it (notebook 04, step 4)"
    assert_says(P4, "Short tails gain {} at M = 4096, and {} on Mixtral-8x7B at M = 1024",
                gains(rows, "+tma", "sorted", (4096,)), x(report.step_gains(rows, "first", "+tma", "sorted")[
                    "Mixtral-8x7B", 1024]))
    assert_says(P4, "those GEMMs do only {:.0f} and {:.0f} FLOPs per byte, far below the {:.0f} at which the H200 "
                    "stops waiting on memory (the run that timed Part 4)", ai["Qwen3-30B-A3B"], ai["DeepSeek-V3"],
                ridge)
    assert_says(P4, "Short tails are on only for `BLOCK_M >= 32`.")
    assert "config.block_m >= 32" in inspect.getsource(__import__(
        "moe_tutorial.kernels.sorted_layer", fromlist=["_launch"])._launch)


def test_04_layer_steps(rows, ceil):
    qwen = get_shape("Qwen3-30B-A3B")
    assert_says(P4, "at M = 16384 on Qwen3-30B-A3B (top-{}, K = {}, bf16)", qwen.topk, qwen.hidden)
    unfused, router = report.times(rows, "layer", "unfused"), report.times(rows, "layer", "+router-epilogue")
    for m in HEADLINE_MODELS:
        s = get_shape(m)
        predicted_ms = 2 * (16384 * s.topk * s.hidden * 2) / (ceil["read_tbps"] * 1e12) * 1e3
        assert unfused[m, 16384] - router[m, 16384] > predicted_ms, \
            f"{m}: the router step no longer saves more than its bytes explain (notebook 04, layer step 1)"
    assert_says(P4, "output is large next to the weights: {}.",
                largest(rows, "unfused", "+router-epilogue", gemm="layer"))
    assert_says(P4, "It gains most on {}.", largest(rows, "+router-epilogue", "+silu-epilogue", gemm="layer"))


def test_04_one_launch_alignment(rows):
    assert_says(P4, "For up to {} pairs, `align_block_size` takes one launch", SMALL_BATCH_PAIRS)
    small = {m: [M for M in BATCH_SIZES if M * get_shape(m).topk <= SMALL_BATCH_PAIRS] for m in HEADLINE_MODELS}
    assert all(Ms == [1, 8] for Ms in small.values())
    assert_says(P4, "The step can only matter where the batch has at most {} pairs: M = 1 and 8 on all three models.",
                SMALL_BATCH_PAIRS)
    assert_says(P4, "At M = 1 and 8 it gains {}, most on {}, whose layer takes the least time",
                gains(rows, "+silu-epilogue", "+decode-align", (1, 8), gemm="layer"),
                largest(rows, "+silu-epilogue", "+decode-align", (1, 8), gemm="layer"))
    fastest = min(HEADLINE_MODELS, key=lambda m: report.times(rows, "layer", "+decode-align")[m, 1])
    assert report.largest_gain(rows, "layer", "+silu-epilogue", "+decode-align", Ms=(1, 8))[1:] == (fastest, 1)
    assert_says(P4, "Above {} pairs the two steps run the same kernels", SMALL_BATCH_PAIRS)


def test_04_sorted_activations(rows):
    assert_says(P4, "It gains most on {}, where the GEMMs are bound by arithmetic",
                largest(rows, "+decode-align", "+sorted-act", gemm="layer"))
    assert report.largest_gain(rows, "layer", "+decode-align", "+sorted-act")[2] >= 4096
    band = 1 + report.spread_percent(report.same_kernel_pairs(rows, protocol="cold-l2"), "layer") / 100
    small = report.gain_range(rows, "layer", "+decode-align", "+sorted-act", Ms=(1, 8, 64, 256))
    assert 1 / band <= small[0] and small[1] <= band, "at M <= 256 the step is no longer inside the noise"
    assert_says(P4, "At M ≤ 256 every gain is inside the noise of section 4")


def test_04_one_launch_topk_sum(rows):
    assert_says(P4, "The sum is a small part of the layer, so the step is small: {}, most of it inside the noise",
                gains(rows, "+sorted-act", "sorted", gemm="layer"))
    share = {m: report.times(rows, "layer", "sorted")[m, 16384] for m in HEADLINE_MODELS}
    sum_bytes = {m: 16384 * get_shape(m).topk * get_shape(m).hidden * 2 for m in HEADLINE_MODELS}
    assert max(HEADLINE_MODELS, key=lambda m: sum_bytes[m] / share[m]) == "Qwen3-30B-A3B", \
        "notebook 04, layer step 5: the sum's share of the layer is no longer largest on Qwen3-30B-A3B"
    assert_says(P4, "which gains {} at M = 16384.", x(report.step_gains(rows, "layer", "+sorted-act", "sorted")[
        "Qwen3-30B-A3B", 16384]))


# --------------------------------------------------------------------------------------
# 05: the performance chapter


def test_05_every_section_asks_a_prediction_before_its_cell():
    """Like notebook 03, each numbered section of 05 holds a **Predict.** paragraph, and the first
    markdown cell tells the reader to answer before running (issue 22)."""
    import re

    text = markdown(P5)
    assert "**Predict, then run**" in text.split("## 1. ")[0]
    sections = re.split(r"## \d+\. ", text.split("## Recap")[0])[1:]
    missing = [s[:40] for s in sections if "**Predict.**" not in s]
    assert len(sections) == 7 and not missing, f"sections without a prediction: {missing}"
    cells = json.loads((NOTEBOOKS / f"{P5}.ipynb").read_text())["cells"]
    for i, c in enumerate(cells):       # a prediction comes before the code that answers it
        if c["cell_type"] == "markdown" and "**Predict.**" in "".join(c["source"]):
            assert cells[i + 1]["cell_type"] == "code", "".join(c["source"])[:60]


def test_05_floor_by_hand():
    s = get_shape("Mixtral-8x7B")
    assert_says(P5, "One token of Mixtral-8x7B (top-{} of {} experts, N = {}, K = {})", s.topk, s.num_experts,
                *s.first_gemm)


def test_05_the_yardstick(rows, ceil):
    parts13 = report.headline_ceilings(rows, "fused")
    assert_says(P5, "In the run that timed Part 4 the read-only kernel read {:.2f} TB/s on its own and the copy "
                    "moved {:.2f} TB/s.", ceil["read_measured_tbps"], ceil["copy_tbps"])
    part4_run = [r for r in report.subset(rows) if r["date"] == ceil["date"]]
    rate, best = reached.reached_read_tbps(part4_run, reached.bench_row_flops)
    assert rate == pytest.approx(ceil["read_tbps"]) and rate > ceil["read_measured_tbps"], (
        "the read kernel is no longer beaten in the run that timed Part 4: rewrite notebook 05's paragraph")
    assert (best["gemm"], best["impl"] in ("sorted",) + bench_impls.FIRST_STEPS) == ("first", True), best
    assert_says(P5, "Part 4's gate/up GEMM for {} at M = {} moved its bytes at {:.2f} TB/s", best["model"], best["M"],
                rate)
    assert_says(P5, "{:.2f} TB/s here, and in the run that timed Parts 1 to 3, {:.2f} (copy {:.2f}).",
                ceil["read_tbps"], parts13["read_tbps"], parts13["copy_tbps"])
    top = max(r["fraction_of_floor"] for r in rows if r.get("fraction_of_floor"))
    assert top <= 1.0 + 1e-12
    assert_says(P5, "no point below exceeds {} of its floor", fmt2(top))
    q = get_shape("Qwen3-30B-A3B")
    nbytes = traffic.first_gemm_bytes(1, *q.first_gemm, q.num_experts, q.topk)
    read_us = nbytes / (ceil["read_tbps"] * 1e12) * 1e6
    assert_says(P5, "One launch costs {:.1f} us under this timer:", ceil["launch_us"])
    assert_says(P5, "M = 1 moves {:.0f} MB, {:.0f} us at the read bandwidth, so the launch is {:.0%} of its floor.",
                nbytes / 1e6, read_us, ceil["launch_us"] / (read_us + ceil["launch_us"]))
    assert_says(P5, "Before each replay {} MB", timing.FLUSH_BYTES >> 20)
    assert_says(P5, "the result is the median of {} replays.", timing.COLD_REPLAYS)
    assert "reversed(times)" in inspect.getsource(bench.run_group)    # "in order and in reverse order"


def test_05_intensity(ceil):
    ridge = ceil["matmul_tflops"] / ceil["read_tbps"]
    assert_says(P5, "(matmul rate over read bandwidth, {:.0f} FLOP/byte on this H200 in the run that timed Part 4)",
                ridge)
    assert_says(P5, "where each expert gets about {:.0f} rows, at `M = ridge x E / topk`", ridge)
    Ms = np.arange(1, 65537)
    cross = {(m, g): int(Ms[np.argmax(perf.intensity(get_shape(m), Ms, g) >= ridge)])
             for m in HEADLINE_MODELS for g in ("first", "layer")}
    assert max(v for (m, _), v in cross.items() if m == "Mixtral-8x7B") < 1000 <= min(
        v for (m, _), v in cross.items() if m != "Mixtral-8x7B"), "rewrite '05: a few hundred tokens ... thousands'"
    assert min(cross.values()) > 256
    assert_says(P5, "(the earliest crossing is at M = {})", min(cross.values()))


def test_05_part2_bound_and_table(rows):
    at_1 = [r["fraction_of_floor"] for r in report.subset(rows, "first", impls=("indexing",)) if r["M"] == 1]
    assert all(0.25 < f < 1 / 3 for f in at_1), "Part 2 at M = 1 is no longer just under 1/3 (notebook 05, section 6)"
    text = f"{fmt2(min(at_1))} on all three models" if fmt2(min(at_1)) == fmt2(max(at_1)) else \
        f"{fmt2(min(at_1))} to {fmt2(max(at_1))}"
    assert_says(P5, "**Part 2, indexing** | lands at {} at M = 1, just under the 1/3 its copy allows", text)
    skip = {m: min(r["M"] for r in report.subset(rows, "first", impls=("indexing",))
                   if r["model"] == m and str(r["status"]).startswith("skipped")) for m in HEADLINE_MODELS}
    copy = {m: intermediate_bytes(skip[m], get_shape(m).topk, *get_shape(m).first_gemm) for m in HEADLINE_MODELS}
    assert all(H200_MEMORY_BYTES / 3 < b < H200_MEMORY_BYTES for b in copy.values())   # fits, but over a third
    assert_says(P5, "from M = {} on Mixtral-8x7B, {} on DeepSeek-V3 and {} on Qwen3-30B-A3B the bench skips it: its "
                    "copy there ({}, {} and {}) would still fit in the H200's {}, but not in the third of free memory "
                    "the bench allows it (appendix B).", skip["Mixtral-8x7B"], skip["DeepSeek-V3"],
                skip["Qwen3-30B-A3B"], *(format_bytes(copy[m]) for m in ("Mixtral-8x7B", "DeepSeek-V3",
                                                                           "Qwen3-30B-A3B")),
                format_bytes(H200_MEMORY_BYTES))
    assert "its copy no longer fits in memory" not in markdown(P5)
    assert "0.10 (3/7 M)" in report.summary_table(rows, ("indexing",))
    assert_says(P5, '"0.10 (3/7 M)" counts 3 of the 7 batch sizes')


def test_05_reading_the_table(rows, ceil):
    g1, gl = report.floor_geomeans(rows, "first"), report.floor_geomeans(rows, "layer")
    assert_says(P5, "With Mixtral-8x7B's 8 large experts that overhead is amortised ({} of the floor); with "
                    "Qwen3-30B-A3B's 128 small ones it dominates ({}); DeepSeek-V3's 256 large ones land between ({}).",
                fmt2(g1["Mixtral-8x7B", "loop"]), fmt2(g1["Qwen3-30B-A3B", "loop"]), fmt2(g1["DeepSeek-V3", "loop"]))
    assert_says(P5, "Its TFLOP/s never pass {:.1f}; notebook 03 measures why.",
                max(report.best_tflops(rows, "fused").values()))
    lo, hi = report.fraction_range(rows, "first", "sorted", Ms=SMALL)
    assert_says(P5, "**Part 4** | reaches {} of the floor, and {} to {} from M = 1 to 256.", trio(g1, "sorted"),
                fmt2(lo), fmt2(hi))
    weak = min((r["fraction_of_floor"], r["model"], r["M"], r["floor_ms"])
               for r in report.subset(rows, "first", impls=("sorted",)))
    assert_says(P5, "Its weakest point is {} at M = {} ({}), whose floor is only {:.0f} us, {:.1f} us of it one "
                    "launch.", weak[1], weak[2], fmt2(weak[0]), weak[3] * 1e3, ceil["launch_us"])
    at = {M: [r["tflops"] for r in report.subset(rows, "first", impls=("sorted",), protocol="cold-l2") if r["M"] == M]
          for M in (4096, 16384)}
    assert_says(P5, "At M = 16384 it reaches {:.0f} to {:.0f} TFLOP/s against the {:.0f} of a plain matmul, at M = "
                    "4096 {:.0f} to {:.0f}.", min(at[16384]), max(at[16384]), ceil["matmul_tflops"],
                min(at[4096]), max(at[4096]))
    assert_says(P5, "The heuristic alone ({}) is close behind the tuned table; with the alignment inside the "
                    "timing, {}.", trio(g1, "sorted-heuristic"), trio(g1, "sorted+align"))
    speed = report.speedup_geomeans(rows, "first", "sorted", "grouped_mm")
    assert all(v > 1 for v in speed.values())     # the recap: "beats torch._grouped_mm on all three models"
    assert_says(P5, "reaches {}: Part 4 is {} faster, geometric mean over M.", trio(g1, "grouped_mm"),
                " / ".join(x(speed[m]) for m in HEADLINE_MODELS))
    assert_says(P5, "**The whole layer** | with Part 4: {}.", trio(gl, "sorted"))
    assert_says(P5, "We did not run vLLM, so this chapter has no vLLM numbers.")
    assert_says(P5, "SiLU * up as a separate op): {} of the floor.", trio(gl, "+router-epilogue"))


def test_05_runs_and_protocols(rows, ceil):
    runs = {(r["date"], r["protocol"]) for r in rows}
    assert len(runs) == 4 and sorted(p for _, p in runs) == ["cold-l2", "cold-l2", "cold-l2", "rotated"]
    assert_says(P5, "One GPU, four runs of `bench`")
    rotated = report.headline_ceilings(rows, "sorted", protocol="rotated")
    assert_says(P5, "one launch costs {:.1f} us there, against {:.1f} us cold.", rotated["launch_us"],
                ceil["launch_us"])
    assert_says(P5, "Part of that is its floor, which counts {:.2f} us for one launch (its launches overlap) where "
                    "cold-l2's counts {:.1f} us.", rotated["launch_us"], ceil["launch_us"])
    geo = {p: report.floor_geomeans(rows, "first", protocol=p) for p in ("cold-l2", "rotated")}
    mean_diff = max(abs(geo["cold-l2"][k] - v) for k, v in geo["rotated"].items())
    point = {p: {(r["model"], r["M"]): r["fraction_of_floor"]
                 for r in report.subset(rows, "first", impls=("sorted",), protocol=p)} for p in ("cold-l2", "rotated")}
    worst = max((abs(point["cold-l2"][k] - v), *k) for k, v in point["rotated"].items())
    assert_says(P5, "On the geometric means the two protocols agree within {}. Point by point they differ more, by up "
                    "to {} ({}, M = {})", fmt2(mean_diff), fmt2(worst[0]), worst[1], worst[2])
    lower = sum(point["rotated"][k] < point["cold-l2"][k] for k in point["rotated"])
    assert_says(P5, "and the rotated protocol reads lower at {} of the {} points.", lower, len(point["rotated"]))


def test_04_small_facts(rows):
    from moe_tutorial.kernels.minimal_sorted_kernel import minimal_sorted_kernel
    from moe_tutorial.source import source_of

    assert 30 <= len(source_of(minimal_sorted_kernel).splitlines()) <= 50       # "a kernel of about forty lines"
    assert_says(P4, "first a kernel of about forty lines")
    v3 = get_shape("DeepSeek-V3")
    assert v3.num_experts * v3.first_gemm[0] * v3.first_gemm[1] > 2 ** 31
    assert_says(P4, "DeepSeek-V3's gate/up weights pass `2^31` elements")
    steps = report.subset(rows, "first", impls=report.LADDERS["first"])
    assert sorted({r["M"] for r in steps}) == list(BATCH_SIZES) == [1, 8, 64, 256, 1024, 4096, 16384]
    assert {r["model"] for r in steps} == set(HEADLINE_MODELS)
    assert_says(P4, "The H200 data times the gate/up GEMM after each step toward `kernels/sorted_kernel.py`.")


def test_05_small_facts(rows):
    from moe_tutorial.perf import impls

    v3 = get_shape("DeepSeek-V3")
    assert traffic.experts_touched(64, v3.num_experts, v3.topk) > 0.8 * v3.num_experts
    assert_says(P5, "DeepSeek-V3 touches {} experts per token, and by M = 64 nearly all {} of them", v3.topk,
                v3.num_experts)
    assert inspect.signature(impls.check_indexing_fits).parameters["fraction"].default == pytest.approx(1 / 3)
    assert any("slower than 1 s per call" in str(r["status"]) for r in rows)
    assert_says(P5, "A case is skipped when Part 2's copy would not fit in a third of the GPU's free memory, or when "
                    "one call takes more than a second.")
    assert_says(P5, "Each line is one implementation, climbing from M = 1 (left) to M = 16384 (right).")


# --------------------------------------------------------------------------------------
# 05, appendix E: the limit experiments


def test_05_decode_gemms_beat_a_read_of_their_size(rows):
    from moe_tutorial.experiments import limits

    rates = limits.read_rates(limits.load_limits())
    line = sorted((mib * 2 ** 20, tbps) for (p, mib), tbps in rates.items() if p == "clean-flush")
    for r in report.subset(rows, "first", impls=("sorted",), protocol="cold-l2"):
        if r["M"] in (1, 8):
            nbytes = r["gbps"] * 1e9 * r["ms"] * 1e-3
            assert r["gbps"] / 1e3 >= np.interp(nbytes, *zip(*line)), (r["model"], r["M"])
    assert_says(P5, "Every gate/up GEMM at M = 1 and 8 (timed with the clean flush) sits above the read-only kernel's "
                    "clean-flush line")
    assert all(rates["clean-flush", mib] > rates["cold-l2-zero", mib] for p, mib in rates if p == "clean-flush")


def test_05_levers_as_described():
    from moe_tutorial.experiments import limits

    lim = limits.load_limits()

    def gains(experiment, base, variant):
        return limits.lever_gains(lim, experiment, base, variant)
    ws = gains("first-gemm", "base", "ws")
    failed = {key for key, g in ws.items() if isinstance(g, str)}
    assert failed and all(M <= 64 for _, M in failed) and max(g for g in ws.values() if not isinstance(g, str)) < 1.015
    assert all(isinstance(g, str) for g in gains("cta-clusters", "tuned", "tuned-ctas2").values())
    assert all(g < 1 for g in gains("cta-clusters", "tuned", "notails-ctas2").values())
    gather = gains("first-gemm", "base", "xsorted+gather")
    assert {key for key, g in gather.items() if g > 1} <= {("Mixtral-8x7B", 4096), ("Mixtral-8x7B", 16384)}
    decode = gains("layer", "base", "decode-32x256w4s4")
    assert sum(g > 1 for (_, M), g in decode.items() if M == 1) == 2 and max(decode.values()) < 1.05
    assert all(g < 1 for (_, M), g in decode.items() if M >= 8)
    assert all(g < 1 for (_, M), g in gains("layer", "base", "atomic").items() if M >= 4096)
    assert_says(P5, "except on Mixtral-8x7B at M ≥ 4096")
    assert_says(P5, "a few percent at M = 1 on two of the three models, and a loss from M = 8 on")


def test_04_names_the_run_of_its_ceilings():
    """Ceilings quoted in notebook 04 are the Part 4 run's, and the text says which run (issue 22, 5)."""
    assert_says(P4, "both measured in the benchmark run that timed Part 4")


def test_05_timer_in_brief_then_in_the_appendix():
    assert_says(P5, "the median of {} replays (details in appendix C)", timing.COLD_REPLAYS)
    assert_says(P5, "Before each replay {} MB, more than the H200's L2 cache holds, are {}",
                timing.FLUSH_BYTES >> 20, {"read": "read", "zero": "zeroed"}[timing.FLUSHES["cold-l2"]])
    text = markdown(P5)
    assert text.index("**The timer (the cold-l2 protocol).**") > text.index("## Appendix C")


# --------------------------------------------------------------------------------------
# 04, section 12: the persistent grid and the Gluon kernel


def test_04_persistent_step():
    from moe_tutorial.figures import persistent

    rows = results.load_rows(results.H200_RESULTS)
    gains = persistent.persistent_gains(rows, HEADLINE_MODELS)
    many = {k: v for k, v in gains.items() if k[1] * get_shape(k[0]).topk // get_shape(k[0]).num_experts >= 256}
    few = {k: v for k, v in gains.items() if k not in many}
    best = max(many, key=many.get)
    assert_says(P4, "where an expert has 256 rows or more it gains {} to {} (most on {} at M = {});",
                x(min(many.values())), x(max(many.values())), best[0], best[1])
    assert_says(P4, "with fewer rows, where there are few tiles per SM to walk, it is {} to {}.",
                x(min(few.values())), x(max(few.values())))
    assert persistent.tile_schedule(10, 4)[1] == [1, 5, 9]
    gluon = report.floor_geomeans(results.load_rows(results.DATA_DIR / "h200_gluon_bench.csv"), "first")
    assert_says(P4, "its first GEMM reaches {} of the floor against the persistent `tl` kernel's {}",
                " / ".join(fmt2(gluon[m, "gluon"]) for m in HEADLINE_MODELS),
                " / ".join(fmt2(gluon[m, "persistent"]) for m in HEADLINE_MODELS))


def test_04_gluon_layer_against_the_tl_layer():
    """Appendix E's reading of the whole-layer Gluon run (data/h200_gluon_bf16_bench.csv)."""
    rows = results.load_rows(results.DATA_DIR / "h200_gluon_bf16_bench.csv")
    speedups = report.family_speedups(rows, "gluon", "tl-sorted")
    large = [v for (m, _), v in speedups.items() if m == "Mixtral-8x7B"]
    many = [v for (m, _), v in speedups.items() if m != "Mixtral-8x7B"]
    assert min(large) > 1 and sum(v > 1 for v in many) == 1 and len(many) == 12
    assert_says(P4, "ahead on Mixtral-8x7B at every M ({} to {}), behind on the three shapes of many experts at "
                "all but one point ({} to {}).", x(min(large)), x(max(large)), x(min(many)), x(max(many)))
    noise = max(float(r["noise"]) for r in rows if r["status"] == "ok")
    assert_says(P4, "The same M timed in the other order differs by up to {:.0f}%,", 100 * noise)


def test_04_short_tails_on_real_shapes():
    """Section 8's sentence on how many row blocks are at most half full, from appendix C's count."""
    from moe_tutorial.shapes import random_topk_ids

    import torch

    share = {}
    for name in HEADLINE_MODELS:
        s, bm = get_shape(name), report.tuned_config(name, 1024).block_m
        ids = random_topk_ids(1024, s.num_experts, s.topk, generator=torch.Generator().manual_seed(1024))
        counts = torch.bincount(ids.flatten().long(), minlength=s.num_experts)
        blocks = (counts + bm - 1) // bm
        last = counts - (blocks - 1) * bm
        share[name] = int(((last <= bm // 2) & (counts > 0)).sum()) / int(blocks.sum())
    assert all(0.45 <= share[m] <= 0.55 for m in ("Qwen3-30B-A3B", "DeepSeek-V3")), share     # "about half"
    assert 0.15 <= share["Mixtral-8x7B"] <= 0.25, share                                        # "a fifth"
    assert_says(P4, "about half of the row blocks are at most half full at M = 1024 on Qwen3-30B-A3B and "
                    "DeepSeek-V3, a fifth on Mixtral-8x7B (appendix C)")
