"""Every number the prose of notebooks 01 to 03 states, rendered from the committed data or the code it
comes from: when the H200 data, a model shape or a default changes, the stale sentence fails here."""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

import inspect
import math

import pytest
from prose import assert_says, fmt2, markdown

from moe_tutorial import intermediate_bytes
from moe_tutorial.examples import WORKED_FIRST_GEMM, WORKED_LAYER, worked_example
from moe_tutorial.figures import part2, part3
from moe_tutorial.figures.part2 import H200_MEMORY_BYTES, format_bytes
from moe_tutorial.kernels.fused_kernel import default_blocks
from moe_tutorial.kernels.published_kernel import int32_offset
from moe_tutorial.experiments import profiling
from moe_tutorial.perf import report, results, traffic
from moe_tutorial.shapes import MODEL_SHAPES, get_shape

P1, P2, P3 = "01_loop_baseline", "02_vectorised_indexing", "03_triton_fused_kernel"


@pytest.fixture(scope="module")
def rows():
    return results.load_rows(results.H200_RESULTS)


def copy_tbps(rows) -> float:
    """The copy bandwidth the notebooks read from the data (the lowest of its runs)."""
    return min(r["copy_tbps"] for r in rows)


def read_tbps(rows, impl) -> float:
    """The read-only bandwidth of the run that timed ``impl`` (cold-l2)."""
    return report.headline_ceilings(rows, impl, protocol="cold-l2")["read_tbps"]


def ms(rows, model, impl, M) -> float:
    (row,) = [r for r in results.select(rows, model=model, impl=impl, M=M, gemm="first") if r["ms"]]
    return row["ms"]


def first_slower(rows, model, impl, than) -> int:
    """The first M from which ``impl`` takes longer than ``than`` (and stays so while both ran)."""
    sizes = report.batch_sizes(rows)
    for i, M in enumerate(sizes):
        later = [m for m in sizes[i:] if results.select(rows, model=model, impl=impl, M=m, gemm="first")[0]["ms"]]
        if all(ms(rows, model, impl, m) > ms(rows, model, than, m) for m in later):
            return M
    raise AssertionError(f"{impl} is never slower than {than} on {model}")


def test_the_worked_example_everywhere():
    ex = worked_example()
    layer = "`y = [[{}]*3, [{}]*3]`".format(*(row[0] for row in WORKED_LAYER))
    first = str([[[int(v) for v in pair] for pair in token] for token in WORKED_FIRST_GEMM])
    for notebook in (P1, P2):
        assert_says(notebook, layer)
        assert_says(notebook, "`{}`", first)
    assert_says(P1, "`M = {}` tokens of size `K = {}`, `E = {}` experts with `N = {}` outputs each, `topk = {}`",
                ex.M, ex.K, ex.E, ex.N, ex.topk)
    assert_says(P2, "(`M = {}`, `K = {}`, `N = {}`, `E = {}`, `topk = {}`", ex.M, ex.K, ex.N, ex.E, ex.topk)
    assert_says(P3, "`M = {}` tokens, `K = {}`, `N = {}`, `E = {}` experts, `topk = {}`",
                ex.M, ex.K, ex.N, ex.E, ex.topk)
    assert_says(P3, "weight has strides `{}`", tuple(ex.weight.stride()))
    # Offset 15 of the worked weight is expert 2's row 1, k 0: a lane of program (0, 0) reads it.
    assert divmod(15, ex.weight.stride(0)) == (2, 3)


# --------------------------------------------------------------------------------------
# 01: the loop

def test_01_models_and_their_experts():
    mixtral, v3 = get_shape("Mixtral-8x7B"), get_shape("DeepSeek-V3")
    assert_says(P1, "Mixtral-8x7B uses {} of {} experts; DeepSeek-V3 uses {} of {}.",
                mixtral.topk, mixtral.num_experts, v3.topk, v3.num_experts)
    experts = [s.num_experts for s in MODEL_SHAPES.values()]
    assert_says(P1, "real models have {} to {} of them", min(experts), max(experts))
    for s in MODEL_SHAPES.values():
        assert_says(P1, "| {} | {} | {} | {} | {} |", s.name, s.num_experts, s.topk, s.hidden, s.intermediate)
    assert_says(P1, "Qwen3-30B-A3B, whose {} experts", get_shape("Qwen3-30B-A3B").num_experts)


def test_01_launch_counts():
    small, large = profiling.layer_launches("loop", 8), profiling.layer_launches("loop", 256)
    per_expert = (large.launches - small.launches) // (256 - 8)
    assert per_expert == 10
    assert_says(P1, "It costs about ten kernel launches and one host sync **per busy expert**: {} launches for 8 "
                    "experts, {:,} for 256.", small.launches, large.launches)
    assert_says(P1, "({:,} tokens, enough", inspect.signature(profiling.layer_problem).parameters["tokens"].default)


def test_01_launch_time_against_the_bytes(rows):
    v3, M, launch_s = get_shape("DeepSeek-V3"), 64, 5e-6
    per_expert, fixed = 10, 6
    busy = traffic.experts_touched(M, v3.num_experts, v3.topk)
    launches = per_expert * busy + fixed
    nbytes = traffic.layer_bytes(M, v3.hidden, v3.intermediate, v3.num_experts, v3.topk)
    assert_says(P1, "Assume about {:g} microseconds of host time per launch", launch_s * 1e6)
    assert_says(P1, "With {} tokens, DeepSeek-V3's loop needs about {:,.0f} launches, some {:.1f} ms of launching "
                    "alone, while reading the weights of its ~{:.0f} busy experts (about {:.1f} GB) takes an H200 "
                    "about {:.1f} ms at the {:.2f} TB/s it read in that run.", M, launches, launches * launch_s * 1e3,
                busy, nbytes / 1e9, nbytes / (read_tbps(rows, "loop") * 1e12) * 1e3, read_tbps(rows, "loop"))
    # The rate is the read-only one of the run that timed the loop, and the prose calls it so (issue 22, 1).
    assert read_tbps(rows, "loop") != copy_tbps(rows)
    assert_says(P1, "at the **read-only bandwidth** (the rate of a kernel that only reads memory) that an H200 "
                    "reached in the benchmark run that timed Parts 1 to 3")
    assert "at the copy bandwidth an H200 reached" not in markdown(P1)


def test_01_sync_count_names_its_ops():
    count = profiling.layer_launches("loop", 8)
    busy = 8
    assert count.by_op["aten::where"] == busy and count.by_op["aten::nonzero"] == 1
    assert count.syncs == busy + 1          # every where (a nonzero inside) and the one nonzero; no .tolist()
    assert_says(P1, "Of the {} host syncs, {} are the experts' `where`s (each runs a `nonzero` inside) and 1 is the "
                    "`nonzero` that lists the busy experts.", count.syncs, busy)
    assert_says(P1, "The input check's `.tolist()` waits for the GPU too, but the profiler records no operator for "
                    "it, so this count leaves it out.")
    assert "the check's `.item()`s" not in markdown(P1)


def test_01_loop_fractions_of_the_floor(rows):
    g = report.floor_geomeans(rows, "first")
    assert_says(P1, "The loop reaches {} of the floor on Mixtral-8x7B, {} on DeepSeek-V3, and {} on Qwen3-30B-A3B",
                fmt2(g["Mixtral-8x7B", "loop"]), fmt2(g["DeepSeek-V3", "loop"]), fmt2(g["Qwen3-30B-A3B", "loop"]))


def test_01_calls_its_count_a_lower_bound():
    assert_says(P1, "so the count is a lower bound of what an H200 would launch")
    assert "the count here is what an H200 would launch" not in markdown(P1)


# --------------------------------------------------------------------------------------
# 02: indexing

def test_02_sizes_of_selected():
    s = get_shape("Mixtral-8x7B")
    N, K = s.first_gemm
    per_token = intermediate_bytes(1, s.topk, N, K)
    all_weights = s.num_experts * N * K * 2
    fills_from = int(H200_MEMORY_BYTES // per_token) + 1
    assert_says(P2, "Mixtral-8x7B needs {} **per token**: at `M = 64` the copy is {}, {:.0f} times the size of all "
                    "eight experts' gate/up weights together ({}), and from {} tokens it no longer fits in an H200's "
                    "{} at all.", format_bytes(per_token), format_bytes(64 * per_token),
                64 * per_token / all_weights, format_bytes(all_weights), fills_from, format_bytes(H200_MEMORY_BYTES))
    assert s.num_experts == 8     # "all eight experts"
    assert_says(P2, "(Mixtral at `M = 64`: about {:.0f} GB)", 64 * per_token / 1e9)
    assert_says(P2, "{} per token for Mixtral, {} at `M = 64`, more than an H200 holds from {} tokens",
                format_bytes(per_token), format_bytes(64 * per_token), fills_from)
    v3 = get_shape("DeepSeek-V3")
    assert s.topk * N * K == v3.topk * v3.first_gemm[0] * v3.first_gemm[1]
    assert_says(P2, "`{} * {} * {} = {} * {} * {}`", s.topk, N, K, v3.topk, *v3.first_gemm)
    kimi = get_shape("Kimi-K2")
    assert kimi.topk * kimi.first_gemm[0] * kimi.first_gemm[1] == v3.topk * v3.first_gemm[0] * v3.first_gemm[1]
    assert_says(P2, "Mixtral-8x7B, DeepSeek-V3 and Kimi-K2 share one line in the plot below")
    assert_says(P2, "Mixtral-8x7B's first GEMM has `topk = {}`, `N = {}`, `K = {}`", s.topk, N, K)


def test_02_round_trip(rows):
    """The round trip at the copy rate, against the series' floor (notebook 05's: the read ceiling, the
    matmul rate and one launch of the run that timed Part 4), not the fewest bytes at the copy rate."""
    s = get_shape("Mixtral-8x7B")
    N, K = s.first_gemm
    ceil = report.headline_ceilings(rows)
    copy = ceil["copy_tbps"] * 1e12
    one = traffic.indexing_extra_bytes(1, N, K, s.topk) / traffic.first_gemm_bytes(1, N, K, s.num_experts, s.topk)
    assert round(one) == 2                                   # "twice"
    x64 = traffic.indexing_extra_bytes(64, N, K, s.topk) / traffic.first_gemm_bytes(64, N, K, s.num_experts, s.topk)
    floor = traffic.floor_seconds(traffic.first_gemm_bytes(64, N, K, s.num_experts, s.topk),
                                  traffic.first_gemm_flops(64, N, K, s.topk), ceil["read_tbps"] * 1e12,
                                  ceil["matmul_tflops"] * 1e12, ceil["launch_us"] * 1e-6)
    assert_says(P2, "at `M = 64` it adds {:.0f} times as much, {:.2f} ms of pure copying for a GEMM whose floor is "
                    "{:.2f} ms. At `M = 256`, `selected` alone is {}", x64,
                traffic.indexing_extra_bytes(64, N, K, s.topk) / copy * 1e3, floor * 1e3,
                format_bytes(intermediate_bytes(256, s.topk, N, K)))
    assert_says(P2, "({} on an H200, copied at {:.2f} TB/s in the series' benchmark)",
                format_bytes(H200_MEMORY_BYTES), ceil["copy_tbps"])
    assert_says(P2, "(registers, shared memory and caches; on an H200 {})", part2.on_chip_text())
    assert "tens of MB" not in markdown(P2)
    assert_says(P2, "trips 2 and 3, a write and a read of {}, are gone",
                format_bytes(intermediate_bytes(64, s.topk, N, K)))


def test_02_counts_three_trips_of_the_weights():
    assert_says(P2, "the chosen weights cross between HBM and the chip three times, and then the output is written")
    assert "travel four times" not in markdown(P2)


# --------------------------------------------------------------------------------------
# 03: the fused kernel

def test_03_hbm_size():
    assert_says(P3, "its large off-chip memory, {} on an H200", format_bytes(H200_MEMORY_BYTES))


def test_03_topk_padding_facts():
    dsv2 = get_shape("DeepSeek-V2-Lite")
    assert_says(P3, "DeepSeek-V2-Lite routes each token to {} experts", dsv2.topk)
    assert_says(P3, "**`topk` = {}, padded to {}.**", dsv2.topk, part3.topk_pad(dsv2.topk))
    powers = [t for t in range(1, 9) if t & (t - 1) == 0]
    assert_says(P3, "works for `topk` = {}, {}, {}, {} and fails for any other", *powers)
    assert_says(P3, "`tl.arange` refuses {}, {}, {} and {}", *[t for t in range(3, 8) if t & (t - 1)])


def test_03_int32_wrap(rows):
    v3 = get_shape("DeepSeek-V3")
    N, K = v3.first_gemm
    first_wrong = next(e for e in range(v3.num_experts) if int32_offset(e, N * K) != e * N * K)
    assert first_wrong == 74 and int32_offset(147, N * K) == 147 * N * K - 2 ** 32     # wrap_probe's expert 147
    assert_says(P3, "`wrap_probe` points expert 147 at the true offset minus 2^32")
    assert_says(P3, "`torch.topk` returns int64 ids, whose products do not wrap")
    assert "routers return int32" not in markdown(P3)
    errors = [r["rel_error"] for r in results.select(rows, impl="published", model="DeepSeek-V3", gemm="first")]
    assert all(r["status"] == "wrong" for r in results.select(rows, impl="published", model="DeepSeek-V3"))
    assert_says(P3, "found relative errors of {} to {}: the result is noise", fmt2(min(errors)), fmt2(max(errors)))


def test_03_why_fuse_numbers():
    extras, programs = [], {}
    for name in ("Mixtral-8x7B", "Qwen3-30B-A3B", "DeepSeek-V3"):
        s = get_shape(name)
        N, K = s.first_gemm
        block_n, _ = default_blocks(s.topk, N, K, interpreted=False)
        programs[name] = math.ceil(N / block_n)
        x_fused, x_unfused, weights = 2 * programs[name] * K, 2 * s.topk * programs[name] * K, 2 * s.topk * N * K
        extras.append((x_unfused - x_fused) / (weights + x_unfused))
    assert_says(P3, "fusing saves at most {:.1%} of all the bytes", max(extras))
    assert_says(P3, "An H200 has {} *SMs*", part3.H200_SMS)
    fewer = [m for m, p in programs.items() if p < part3.H200_SMS]
    assert len(fewer) == 2
    assert_says(P3, "fewer than the H200 has SMs on two of the three models")
    assert_says(P3, "{} on Qwen3-30B-A3B and {} on DeepSeek-V3 against the H200's {} SMs",
                programs["Qwen3-30B-A3B"], programs["DeepSeek-V3"], part3.H200_SMS)


def test_03_roofline_numbers(rows):
    part3_read = next(r["read_tbps"] for r in rows if r["impl"] == "fused")   # the run that timed Part 3
    assert_says(P3, "From HBM alone, then, the kernel would stop near {:.1f} TFLOP/s", part3_read)
    best = report.best_tflops(rows, "fused")
    assert_says(P3, "Its TFLOP/s flatten at about {:.0f} on Mixtral-8x7B and Qwen3-30B-A3B ({:.1f} on DeepSeek-V3)",
                (best["Mixtral-8x7B"] + best["Qwen3-30B-A3B"]) / 2, best["DeepSeek-V3"])
    assert round(best["Mixtral-8x7B"]) == round(best["Qwen3-30B-A3B"]) == 10
    assert_says(P3, "The benchmark measured it at about {:.0f} at large `M`", best["Mixtral-8x7B"])
    matmul = min(r["matmul_tflops"] for r in rows)
    best_share = max(best.values()) / matmul
    assert best_share < 0.02
    assert_says(P3, "under 2% of the tensor cores")


def test_03_the_verdict(rows):
    q, v3, mix = "Qwen3-30B-A3B", "DeepSeek-V3", "Mixtral-8x7B"
    wins = [m for m in (mix, q, v3) if ms(rows, m, "fused", 1) < ms(rows, m, "indexing", 1)]
    assert wins == [mix], f"at M = 1 Part 3 beats Part 2 on {wins}: rewrite notebook 03's verdict"
    assert_says(P3, "At `M = 1` it beats Part 2 only on Mixtral-8x7B")
    assert_says(P3, "overtakes it on Mixtral-8x7B from `M = {}`, on DeepSeek-V3 from `M = {}` and on Qwen3-30B-A3B "
                    "from `M = {}`.", first_slower(rows, mix, "fused", "loop"), first_slower(rows, v3, "fused", "loop"),
                first_slower(rows, q, "fused", "loop"))


def test_03_names_the_article_and_the_seed_page():
    text = markdown(P3)
    for needed in ("从循环到融合：理解 Fused MoE 算子原理（三）", "DatenLord (达坦科技)", "../docs/seed-article.md",
                   "exercises/part3_exercises.ipynb"):
        assert needed in text, needed
    for notebook, exercises in ((P1, "exercises/part1_exercises.ipynb"), (P2, "exercises/part2_exercises.ipynb")):
        assert exercises in markdown(notebook)


def test_03_every_section_asks_a_prediction():
    """Each numbered section of notebook 03 (## 1. ... ## 14.) holds a Predict paragraph."""
    import re

    sections = re.split(r"## \d+\. ", markdown(P3))[1:]            # the text before §1 is the introduction
    missing = [s[:40] for s in sections if "**Predict.**" not in s]
    assert not missing, f"sections without a prediction: {missing}"


def test_03_does_not_blame_two_causes():
    text = markdown(P3)
    assert "hit the GPU's L2 cache instead of HBM, which is a few times faster. That can lift" not in text
    assert "measurements/scripts/h200_part3_cap.py" in text


def test_03_fault_3_shown_from_the_data(rows):
    """Fault 3 (bf16 products) is shown with the benchmark's correctness check, not only asserted."""
    err = {impl: [r["rel_error"] for m in ("Mixtral-8x7B", "Qwen3-30B-A3B")
                  for r in results.select(rows, model=m, impl=impl, gemm="first") if r["status"] == "ok"]
           for impl in ("published", "fused")}
    assert len(err["published"]) == len(err["fused"]) == 14
    for impl, values in err.items():
        assert f"{min(values):.1e}" == f"{max(values):.1e}", impl        # one number on every M
    def sci(v):
        return f"{v:.1e}".replace("e-0", "e-")
    assert_says(P3, "the article's kernel is off by {} and the fixed kernel by {}: about {} times the error",
                sci(err["published"][0]), sci(err["fused"][0]), "three")
    assert round(err["published"][0] / err["fused"][0]) == 3


def test_03_m1_is_not_only_too_few_programs(rows):
    fr = {r["model"]: r["fraction_of_floor"] for r in results.select(rows, impl="fused", M=1, gemm="first")}
    programs = {}
    for name in ("Mixtral-8x7B", "Qwen3-30B-A3B", "DeepSeek-V3"):
        N, K = get_shape(name).first_gemm
        programs[name] = math.ceil(N / default_blocks(get_shape(name).topk, N, K, interpreted=False)[0])
    assert programs["Mixtral-8x7B"] > part3.H200_SMS
    assert_says(P3, "still reaches only {} / {} / {} of the floor (Mixtral-8x7B / Qwen3-30B-A3B / DeepSeek-V3)",
                fmt2(fr["Mixtral-8x7B"]), fmt2(fr["Qwen3-30B-A3B"]), fmt2(fr["DeepSeek-V3"]))
    assert_says(P3, "Mixtral-8x7B's {} programs give every SM work and still reach only {}.",
                programs["Mixtral-8x7B"], fmt2(fr["Mixtral-8x7B"]))


def test_03_names_the_run_of_its_ceilings():
    assert_says(P3, "measured in the benchmark run that timed Parts 1 to 3")
