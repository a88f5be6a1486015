"""Every number the prose of notebook 07 states, rendered from the committed FP8 data or the code it
comes from: when ``moe_tutorial/data/h200_fp8_bench.csv`` changes, the stale sentences fail here and
``scripts/update_prose.py`` rewrites them (read the words around each number afterwards)."""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

import csv
import json
import math

import pytest
import torch
from prose import assert_says, fmt2, markdown

from moe_tutorial import quant, runtime
from moe_tutorial.figures import part7
from moe_tutorial.kernels.fp8_quant import cast_to_e4m3
from moe_tutorial.perf import report
from moe_tutorial.perf.results import DATA_DIR, load_rows, select
from moe_tutorial.reference import FP8_LAYER_TOLERANCE
from moe_tutorial.shapes import get_shape

P7 = "07_fp8_experts"
#: The rows of the kernel notebook 07 builds, with its tuned tiles ("fp8" may have run the Gluon kernel).
TL = "fp8-tl"
STEPS = ("fp8-step0", "fp8+swap", "fp8+tma")
WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}


@pytest.fixture(scope="module")
def rows():
    return load_rows(DATA_DIR / "h200_fp8_bench.csv")


def x(v: float) -> str:
    return f"{v:.2f}x"


def speedups(rows, gemm, Ms):
    """``{(model, M): bf16 time / FP8 time}`` at the given M, every model of the run."""
    out = {}
    for model in report.model_order(select(rows, impl=TL)):
        m, s = part7.speedups(rows, model, gemm, faster=TL)
        out.update({(model, int(M)): float(v) for M, v in zip(m, s) if int(M) in Ms})
    return out


def step_sizes(rows, model):
    """The M at which every step of ``model`` timed correctly (the steps' rows that ran the Gluon kernel do not)."""
    ok = [{r["M"] for r in select(rows, model=model, gemm="first", impl=s) if report.is_ok(r)} for s in STEPS]
    return sorted(set.intersection(*ok))


def test_e4m3_worst_rounding_is_a_seventeenth():
    """Half a step at the bottom of a power of two, relative to the number: 1/17, not 2^-4."""
    v = part7.e4m3_values()
    v = v[(v >= 2 ** -6) & (v < 448)]                        # normal values below the largest
    mids = (v[1:] + v[:-1]) / 2
    worst = float(((mids - v[:-1]) / mids).max())
    assert worst == pytest.approx(1 / 17)
    assert_says(P7, "relative to the number itself is largest just above a power of two, halfway to the next "
                    "value: 1/17 = {:.4f} of it", 1 / 17)
    assert "2^-4" not in markdown(P7)


def test_the_interpreters_cast_as_the_notebook_shows_it():
    if not runtime.INTERPRETED:
        pytest.skip("the fault is the CPU interpreter's")
    plain = cast_to_e4m3(torch.tensor([124.3, 100.0, 0.001]), round_first=False).float().tolist()
    assert plain[0] == 64.0, "the interpreter's cast no longer drops the carry: rewrite notebook 07, section 5"
    assert_says(P7, "In the interpreter the cast alone loses the carry when a mantissa rounds up (124.3 becomes "
                    "{:g}, not 128)", plain[0])


def test_scales_and_tolerances():
    s = get_shape("DeepSeek-V3")
    w13 = (s.num_experts, 2 * s.intermediate, s.hidden)
    share = torch.Size(quant.scale_shape(w13, 128)).numel() * 4 / torch.Size(w13).numel()
    assert_says(P7, "Scales add {:.2%} to a weight's bytes", share)
    assert_says(P7, "The GPU tests accept {} there", f"{FP8_LAYER_TOLERANCE:.0e}".replace("e-0", "e-"))


def test_what_fp8_buys(rows):
    first_mid = speedups(rows, "first", (8, 64, 256))
    at_1 = speedups(rows, "first", (1,))
    at_1024, at_16k = speedups(rows, "first", (1024,)), speedups(rows, "first", (16384,))
    layer_mid, layer_16k = speedups(rows, "layer", (8, 64, 256)), speedups(rows, "layer", (16384,))
    models = report.model_order(select(rows, impl=TL))
    assert len(models) == 5
    lo1, hi1 = min(at_1, key=at_1.get), max(at_1, key=at_1.get)
    assert lo1 == ("Qwen3-30B-A3B", 1)
    q = {impl: select(rows, model="Qwen3-30B-A3B", gemm="first", impl=impl, M=1)[0] for impl in (TL, "sorted")}
    no_faster = sorted(m for (m, _), v in at_16k.items() if v < 1)
    assert_says(P7, "From M = 8 to M = 256 the FP8 gate/up GEMM is {} to {} as fast as bf16 on all five models",
                x(min(first_mid.values())), x(max(first_mid.values())))
    assert_says(P7, "At M = 1 it is {} on Qwen3-30B-A3B to {} on {}: Qwen3-30B-A3B's call takes {:.1f} us "
                    "against bf16's {:.1f}, and what FP8 does not halve, one launch of {:.1f} us,",
                x(at_1[lo1]), x(at_1[hi1]), hi1[0], q[TL]["ms"] * 1e3, q["sorted"]["ms"] * 1e3, q[TL]["launch_us"])
    lo1024 = min(at_1024, key=at_1024.get)
    assert lo1024[0] == "Mixtral-8x7B"
    assert_says(P7, "At M = 1024 it is {} (Mixtral-8x7B, already compute-bound there) to {}, and at M = 16384 {} to {}",
                x(at_1024[lo1024]), x(max(at_1024.values())), x(min(at_16k.values())), x(max(at_16k.values())))
    assert_says(P7, "FP8 is no faster than bf16 on {} of the five models", WORDS[len(no_faster)])
    assert_says(P7, "The whole layer follows the gate/up GEMM: {} to {} from M = 8 to 256, {} to {} at M = 16384.",
                x(min(layer_mid.values())), x(max(layer_mid.values())), x(min(layer_16k.values())),
                x(max(layer_16k.values())))


def test_the_promotion_and_the_steps(rows):
    rates = [r["tflops"] / r["fp8_tflops"] for r in select(rows, gemm="first", impl=TL) if r["M"] >= 4096]
    assert max(rates) < 0.5                                  # "under half"
    assert_says(P7, "at M >= 4096 the kernel reaches {} to {} of the FP8 matmul rate", fmt2(min(rates)),
                fmt2(max(rates)))
    noise = report.spread_percent(report.fp8_same_kernel_pairs(rows))
    Ms = step_sizes(rows, "DeepSeek-V3")
    best = {r["M"]: r["ms"] for r in select(rows, model="DeepSeek-V3", gemm="first", impl=TL)}
    rel = [r["ms"] / best[r["M"]] for s in STEPS for r in select(rows, model="DeepSeek-V3", gemm="first", impl=s)
           if r["M"] in Ms]
    assert_says(P7, "On DeepSeek-V3, up to M = {}, every step's time is within {} to {} of the tuned kernel's, against "
                    "two timings of one kernel up to {:.1f}% apart", max(Ms), x(min(rel)), x(max(rel)), noise)
    assert max(abs(v - 1) for v in rel) < 0.05, "a step now changes DeepSeek-V3's time: rewrite section 7"
    beyond = [r for s in STEPS for r in select(rows, model="DeepSeek-V3", gemm="first", impl=s) if r["M"] > max(Ms)]
    if beyond:
        assert all(r["status"].startswith("not a tl step") for r in beyond)
        assert_says(P7, "Past M = {} the run has no `tl` step of DeepSeek-V3", max(Ms))
    else:
        assert "the run has no `tl` step" not in markdown(P7), "every step ran: drop the sentence"
    qM = step_sizes(rows, "Qwen3-30B-A3B")
    g = report.floor_geomeans([r for r in select(rows, model="Qwen3-30B-A3B") if r["M"] in qM], "first")
    q = [g["Qwen3-30B-A3B", s] for s in (*STEPS, TL)]
    assert q[1] - q[0] > max(abs(q[2] - q[1]), abs(q[3] - q[1])), "the swap is no longer Qwen3's step that pays"
    assert_says(P7, "over M = 1 to {} its geometric mean goes from {} of the floor to {}, then {} with TMA and {} with "
                    "the tuned table", max(qM), *map(fmt2, q))
    text = markdown(P7)
    assert "within noise" not in text and "the tuned table's gain" not in text


def test_against_its_floor(rows):
    small = speedups(rows, "first", (1, 8, 64, 256))
    fr = [r["fraction_of_floor"] for r in select(rows, gemm="first", impl=TL) if r["M"] <= 256]
    rates = [r["tflops"] / r["fp8_tflops"] for r in select(rows, gemm="first", impl=TL) if r["M"] >= 4096]
    assert_says(P7, "At M ≤ 256 the FP8 gate/up GEMM is {} to {} faster than bf16 and reaches {} to {} of its floor; "
                    "at M ≥ 4096 it reaches at most {} of the FP8 matmul rate", x(min(small.values())),
                x(max(small.values())), fmt2(min(fr)), fmt2(max(fr)), fmt2(max(rates)))
    text = markdown(P7)
    assert "meets its targets" not in text and "0.55 to 0.72" not in text and "We did not run vLLM" not in text


def test_recap(rows):
    mid = speedups(rows, "first", (8, 64, 256))
    no_faster = [m for (m, _), v in speedups(rows, "first", (16384,)).items() if v < 1]
    assert_says(P7, "On an H200 it is {} to {} as fast as bf16 from M = 8 to 256", x(min(mid.values())),
                x(max(mid.values())))
    assert_says(P7, "and on {} of five models it is no faster than bf16", WORDS[len(no_faster)])
    summary = markdown(P7).split("## 中文小结")[1]
    assert f"比 bf16 快 {min(mid.values()):.2f} 到 {max(mid.values()):.2f} 倍" in summary
    assert f"在五个模型中有{'一二三四五'[len(no_faster) - 1]}个不比 bf16 快" in summary


def test_the_gluon_section(rows):
    """Section 9 and Appendix A: the Gluon kernel's gain, the layer, vLLM's path, the levers and the profile."""
    from moe_tutorial.experiments import gluon_fp8

    def ms(model, gemm, impl, M):
        return next(r["ms"] for r in select(rows, model=model, gemm=gemm, impl=impl) if r["M"] == M and report.is_ok(r))

    def rate(M):
        r = next(r for r in select(rows, model="DeepSeek-V3", gemm="first", impl="fp8") if r["M"] == M)
        return r["tflops"] / r["fp8_tflops"]
    sizes = sorted({r["M"] for r in rows})
    gain16 = ms("DeepSeek-V3", "first", TL, 16384) / ms("DeepSeek-V3", "first", "fp8", 16384)
    assert_says(P7, "on DeepSeek-V3 at M = 16384 it is {}x the `tl` kernel and reaches {} of the FP8 matmul rate "
                    "({} at M = 4096,", fmt2(gain16), fmt2(rate(16384)), fmt2(rate(4096)))
    # Where the table takes Gluon: the first M at which the package beats the tl kernel by more than noise.
    first = {m: min(M for M in sizes if ms(m, "first", TL, M) / ms(m, "first", "fp8", M) > 1.1)
             for m in ("DeepSeek-V3", "Mixtral-8x7B")}
    assert first == {"DeepSeek-V3": 4096, "Mixtral-8x7B": 1024}
    assert_says(P7, "(from M = 4096 here; M = 1024 on Mixtral-8x7B's large experts)")
    layer = {m: [ms(m, "layer", "sorted", M) / ms(m, "layer", "fp8", M) for M in (4096, 16384)]
             for m in ("DeepSeek-V3", "Kimi-K2", "Qwen3-30B-A3B")}
    big, small = layer["DeepSeek-V3"] + layer["Kimi-K2"], layer["Qwen3-30B-A3B"]
    assert_says(P7, "The whole FP8 layer is {}x to {}x as fast as bf16 at M >= 4096 on DeepSeek-V3 and Kimi-K2, "
                    "but only {}x to {}x on Qwen3-30B-A3B", *map(fmt2, (min(big), max(big), min(small), max(small))))
    models = ("DeepSeek-V3", "Qwen3-30B-A3B", "Kimi-K2")
    vs = {m: [ms(m, "first", "vllm-fp8", M) / ms(m, "first", "fp8", M) for M in sizes] for m in models}
    gm = [math.prod(vs[m]) ** (1 / len(vs[m])) for m in models]
    worst = min((min(v), m, sizes[v.index(min(v))]) for m, v in vs.items())
    assert_says(P7, "the geometric mean is {}x on DeepSeek-V3, {}x on Qwen3-30B-A3B and {}x on Kimi-K2; the "
                    "smallest margin, {}x ({}, M = {}),", *map(fmt2, gm), fmt2(worst[0]), worst[1], worst[2])
    levers = gluon_fp8.load_levers()
    slow = gluon_fp8.lever_slowdowns(levers, "DeepSeek-V3", 16384)
    median, _ = gluon_fp8.noise(levers)
    assert_says(P7, "without it the same kernel is {}x slower at M = 16384 on DeepSeek-V3, and two warpgroups "
                    "(128-row tiles) beat one by {}x there",
                fmt2(slow["gluon-128x8-s4-nooverlap"]), fmt2(slow["gluon-64x4-s6"]))
    assert_says(P7, "so their promotion waits again ({}x slower). A fifth pipeline stage changes nothing ({}x); "
                    "the tile order moves a few percent (GROUP_M 1: {}x), against a {:.1%} median spread",
                fmt2(slow["gluon-256x8-2wave-s3"]), fmt2(slow["gluon-128x8-s5"]), fmt2(slow["gluon-128x8-s4-g1"]),
                median)
    profile = gluon_fp8.load_profile()
    before, tl_p = profile["gluon-128x8-s4", 16384], profile["tl", 16384]
    gl, at_4096 = (profile["gluon-128x8-s4, scales read ahead", M] for M in (16384, 4096))
    assert_says(P7, "with the tensor pipe busy {:.0%} of the time ({:.0%} before that lever, at about the same speed: "
                    "{:.2f} against {:.2f} ms), the clock falls to {:.2f} GHz (the power the FP8 tensor cores draw; "
                    "the `tl` kernel ran at {:.2f})",
                gl["tensor_pipe_active"], before["tensor_pipe_active"], gl["duration_ms"], before["duration_ms"],
                gl["sm_clock_ghz"], tl_p["sm_clock_ghz"])
    assert abs(gl["duration_ms"] / before["duration_ms"] - 1) < 0.02          # "about the same speed"
    assert_says(P7, "At M = 4096 it is the weights' read: L2 busy at {:.0%} of its peak, DRAM reading {:.2f} TB/s.",
                at_4096["l2_throughput"], at_4096["dram_read_tbps"])
    assert at_4096["l2_throughput"] > 0.8 > gl["l2_throughput"]
    assert 0.6 < gl["tensor_pipe_active"] < 0.72                       # "about two thirds"
    assert_says(P7, "with the tensor pipe busy about two thirds of the time")


def test_the_later_vllm_beside_it():
    """Section 9's note on vLLM 0.34.0 (``data/h100_vllm_fp8_anchor.csv``): geometric means, the worst
    M, and M = 16384, each from the run's ratios of vLLM's time to the package's."""
    from moe_tutorial.experiments import gluon_fp8

    summary = gluon_fp8.vllm_summary()
    assert set(summary["geomeans"]) == {"DeepSeek-V3", "Qwen3-30B-A3B", "Kimi-K2"}
    gm, worst, big = summary["geomeans"].values(), summary["worst"], summary["at_16384"].values()
    with open(gluon_fp8.VLLM_ANCHOR) as f:
        rows = list(csv.DictReader(f))
    spread = summary["worst_spread"]
    assert 0 < 1 - worst[0] < spread and 1 < min(gm)     # "behind at no M by more than ..., inside ..."
    assert_says(P7, "the package is {}x to {}x faster by geometric mean, behind at no M by more than {:.1%} ({}, "
                    "M = {}, inside the {:.1%} between its two timing orders), and {}x to {}x faster at M = 16384,",
                fmt2(min(gm)), fmt2(max(gm)), 1 - worst[0], worst[1], worst[2], spread, fmt2(min(big)), fmt2(max(big)))
    assert {r["gpu"] for r in rows} == {"NVIDIA H100 80GB HBM3"} and {r["tables"] for r in rows} == {""}
    assert {r["vllm_file"] for r in rows} == {"vllm-0.34.0/fused_moe.py"}
    assert_says(P7, "vLLM 0.34.0's kernel loads the weights through TMA and swaps the operands under 64 rows")


def test_how_far_ahead_of_vllm_any_kernel_could_be():
    """Section 9's bound: up to M = 1024 vLLM's time over the FP8 floor caps any kernel's margin."""
    from moe_tutorial.experiments import gluon_fp8
    from moe_tutorial.perf.traffic import first_gemm_flops

    bound = gluon_fp8.vllm_ceiling()
    with open(gluon_fp8.VLLM_ANCHOR) as f:
        small = [r for r in csv.DictReader(f) if int(r["M"]) <= 1024]
    for r in small:                                # "wait on the weights": the multiplies take less time
        flops = first_gemm_flops(int(r["M"]), int(r["N"]), int(r["K"]), int(r["topk"]))
        assert flops / (float(r["fp8_tflops"]) * 1e9) < float(r["floor_ms"]) / 2, (r["model"], r["M"])
    reached = [f for by_m in bound["reached"].values() for f in by_m.values()]
    ceilings = bound["ceiling"].values()
    assert all(0 < f <= 1 for f in reached)                       # no kernel beats its floor
    margins = gluon_fp8.vllm_summary()["geomeans"]
    assert all(bound["ceiling"][m] > margins[m] for m in margins)   # the bound lies above what ran
    assert_says(P7, "Up to M = 1024 both kernels wait on the weights they read, and vLLM's already reaches "
                    "{:.2f} to {:.2f} of the FP8 floor of the same run", min(reached), max(reached))
    assert_says(P7, "would be only {}x to {}x faster by geometric mean.", fmt2(min(ceilings)), fmt2(max(ceilings)))
    assert max(ceilings) < 1.15                                     # "little left to win"


def test_what_the_block_scales_still_cost():
    """Appendix A's last section: the same pipeline with one scale per tensor, from
    ``data/h200_fp8_scale_cost.csv`` (one run, the shipped kernel beside it)."""
    from moe_tutorial.experiments import gluon_fp8

    def e(v):
        return f"{v:.1e}".replace("e-0", "e-")

    costs = gluon_fp8.load_scale_cost()
    models = ("DeepSeek-V3", "Qwen3-30B-A3B", "Kimi-K2")
    at = {m: gluon_fp8.scale_cost(costs, m, 16384) for m in models}
    assert all(len(c) == 3 for c in at.values())
    shipped, tensor, wide = gluon_fp8.SHIPPED, *gluon_fp8.PER_TENSOR
    saved = [1 - at[m][tensor]["ms"] / at[m][shipped]["ms"] for m in models]
    noise = {m: max(at[m][k]["noise"] for k in (shipped, tensor)) for m in models}   # the two compared
    assert_says(P7, "At M = 16384 the kernel without promotion is {:.0%} to {:.0%} faster", min(saved), max(saved))
    assert_says(P7, "tensor) is only {:.0%} to {:.0%} faster at M = 16384", min(saved), max(saved))
    clear, close = ("DeepSeek-V3", "Kimi-K2"), "Qwen3-30B-A3B"
    assert all(saved[models.index(m)] > noise[m] for m in clear)                   # "more than ... differed"
    assert abs(saved[models.index(close)] - noise[close]) < 0.01                    # "about as large"
    assert_says(P7, "On DeepSeek-V3 and Kimi-K2 that is more than the two timings of either kernel differed (at "
                    "most {:.0%}); on Qwen3-30B-A3B it is about as large as they did ({:.0%})",
                max(noise[m] for m in clear), noise[close])
    rates = [at[m][tensor]["rate"] for m in models]
    assert_says(P7, "the pipeline with nothing to promote reaches only {:.2f} to {:.2f} of the FP8 rate",
                min(rates), max(rates))
    assert max(rates) < 0.70                                           # "would still fall short of 0.70"
    q, d = at["Qwen3-30B-A3B"], at["DeepSeek-V3"]
    assert_says(P7, "either: {:.2f} against {:.2f} on Qwen3-30B-A3B, within the noise, and {:.2f} against {:.2f} on "
                    "DeepSeek-V3", q[wide]["rate"], q[tensor]["rate"], d[wide]["rate"], d[tensor]["rate"])
    assert abs(q[wide]["ms"] / q[tensor]["ms"] - 1) < noise["Qwen3-30B-A3B"]
    assert_says(P7, "over DeepSeek-V3's K = 7168 are off by {}, where the block kernel is off by {}",
                e(d[tensor]["error"]), e(d[shipped]["error"]))
    assert d[tensor]["error"] > d[shipped]["error"]


def test_what_holds_the_pipeline():
    """Appendix A's profile of the per-tensor kernels (``data/h200_fp8_profile.csv``)."""
    from moe_tutorial.experiments import gluon_fp8

    profile = gluon_fp8.load_profile()
    narrow, wide = (profile[f"one scale per tensor, 128 x {n}", 16384] for n in (128, 256))
    block = profile["gluon-128x8-s4, beside the per-tensor kernels", 16384]
    assert block["tensor_pipe_active"] < narrow["tensor_pipe_active"]       # the promotion still costs some
    assert_says(P7, "finds the tensor pipe busy {:.0%} of the time", narrow["tensor_pipe_active"])
    assert_says(P7, "and it ran at {:.0%} of it", narrow["l2_throughput"])
    need = 2 * 128 * 128 / 512 * narrow["sm_clock_ghz"] * 1e9 * 132 / 1e12
    assert need >= 0.98 * narrow["l2_to_sm_tbps"] / narrow["l2_throughput"]     # "asks for the L2 at 100%"

    def read(p):
        return p["dram_read_tbps"] * p["duration_ms"]
    assert_says(P7, "reads {:.1f} GB from DRAM, where the 128-wide tile reads {:.1f}, and the L2 runs at {:.0%}",
                read(wide), read(narrow), wide["l2_throughput"])
    assert wide["duration_ms"] > narrow["duration_ms"] and wide["l2_throughput"] > 0.9


def test_the_sorted_quantiser():
    """Appendix A's first step, both ways (``data/h200_fp8_quantiser.csv``)."""
    from moe_tutorial.experiments import gluon_fp8

    rows = gluon_fp8.load_quantiser()
    gains = gluon_fp8.quantiser_gains(rows)
    step = [g["step_gather"] / g["step_sorted"] for g in gains]
    assert min(step) > 1                                               # faster alone in every case
    assert_says(P7, "Alone, the step is {} to {} faster", x(min(step)), x(max(step)))
    saved = [g["layer_gather"] - g["layer_sorted"] for g in gains]
    worst = min(range(len(gains)), key=lambda i: saved[i])
    g = gains[worst]
    noise = next(r["noise"] for r in rows if (r["model"], r["M"]) == (g["model"], g["M"])
                 and r["impl"].endswith("+gather") and r["ms"] == g["layer_gather"])
    assert_says(P7, "the sorted quantiser is faster in {} of the {} cases and slower in {}, by at most {:.2f} ms "
                    "({} at M = {}, where the two timings of the gathering layer differed by {:.0%})",
                sum(s > 0 for s in saved), len(saved), sum(s <= 0 for s in saved), -saved[worst], g["model"], g["M"],
                noise)
    assert -saved[worst] / g["layer_gather"] < noise                  # the slowdown is within that spread


def test_the_decode_experiment():
    """Appendix A's decode path in two launches (``data/h200_fp8_decode.csv``)."""
    from moe_tutorial.experiments import fp8_decode

    cases = {(c["model"], c["M"]): c for c in fp8_decode.decode_summary(fp8_decode.load_decode())}
    speed = {key: c["aligned_over_best"] for key, c in cases.items()}
    assert_says(P7, "At M = 1 the decode path runs at {:.2f}x the layer's speed on DeepSeek-V3 and {:.2f}x on "
                    "Kimi-K2, and at {:.2f}x on Qwen3-30B-A3B",
                speed["DeepSeek-V3", 1], speed["Kimi-K2", 1], speed["Qwen3-30B-A3B", 1])
    assert speed["DeepSeek-V3", 1] < 1 and speed["Kimi-K2", 1] < 1 < speed["Qwen3-30B-A3B", 1]
    assert_says(P7, "({:.2f}x at M = 2, and behind the layer again by M = 8)", speed["Qwen3-30B-A3B", 2])
    assert speed["Qwen3-30B-A3B", 8] < 1 < speed["Qwen3-30B-A3B", 2]
    assert all(speed[model, M] < 1 for model in ("DeepSeek-V3", "Kimi-K2") for M in (1, 2, 4, 8))   # "every M"
    bf16 = {m: cases[m, 1]["bf16_us"] / cases[m, 1]["aligned_us"] for m in ("DeepSeek-V3", "Kimi-K2", "Qwen3-30B-A3B")}
    assert_says(P7, "In this run it is {}x as fast as bf16 at M = 1 on DeepSeek-V3, {}x on Kimi-K2 and {}x on "
                    "Qwen3-30B-A3B", *(f"{bf16[m]:.2f}" for m in ("DeepSeek-V3", "Kimi-K2", "Qwen3-30B-A3B")))
    gains = [speed["Qwen3-30B-A3B", M] - 1 for M in (1, 2, 4, 8) if speed["Qwen3-30B-A3B", M] > 1]
    assert_says(P7, "a second path for a gain of {:.0%} to {:.0%} on one model", min(gains), max(gains))


def test_the_rescaled_form_on_an_h200():
    """Appendix A's reading of the H200 run (``data/h200_fp8_rescaled.csv``), and the tuned table that
    took its winners (``scripts/gluon_fp8_table.py``)."""
    from moe_tutorial.experiments import gluon_fp8
    from moe_tutorial.kernels import configs

    rows = gluon_fp8.load_rescaled(gluon_fp8.H200_RESCALED)
    assert {r["gpu"] for r in rows} == {"NVIDIA H200"}
    gains = gluon_fp8.rescaled_gains(rows)
    first = [g["first"] / g["first_rescaled"] for g in gains]
    layer = [g["layer"] / g["layer_rescaled"] for g in gains]
    assert min(first) > 1 and min(layer) > 1 and len(gains) == 6
    ds = next(g for g in gains if (g["model"], g["M"]) == ("DeepSeek-V3", 4096))
    h100 = next(g for g in gluon_fp8.rescaled_gains(gluon_fp8.load_rescaled())
                if (g["model"], g["M"]) == ("DeepSeek-V3", 4096))
    small = sorted(g["rows"] for g in gains if g["rows"] < configs.GLUON_RESCALED_ROWS)
    assert_says(P7, "Here the 256-wide first GEMM gains on all three models, {} to {}, DeepSeek-V3's too ({} at "
                    "M = 4096, where the H100 lost {}); and the rescaled layer is the fastest form in all six "
                    "cases, {} to {}, also at {} and {} rows an expert, where the H100 found it slower.",
                x(min(first)), x(max(first)),
                x(ds["first"] / ds["first_rescaled"]), x(h100["first"] / h100["first_rescaled"]), x(min(layer)),
                x(max(layer)), *small)
    big = [g["layer_bf16"] / g["layer_rescaled"] for g in gains if g["model"] != "Qwen3-30B-A3B"]
    qwen = [g["layer_bf16"] / g["layer_rescaled"] for g in gains if g["model"] == "Qwen3-30B-A3B"]
    assert_says(P7, "The FP8 layer runs {} to {} as fast as the bf16 layer on DeepSeek-V3 and Kimi-K2, {} to {} on "
                    "Qwen3-30B-A3B.", x(min(big)), x(max(big)), x(min(qwen)), x(max(qwen)))
    rate = max(r["fp8_rate_fraction"] for r in rows if r["gemm"] == "first" and r["impl"] == gluon_fp8.RESCALED)
    assert_says(P7, "The fastest first GEMM still reaches {:.2f} of the FP8 rate measured in the same run.", rate)
    table = json.loads((configs.SHIPPED_DIR / "tuned_configs_h200.json").read_text())["NVIDIA H200"]
    for g in gains:
        s = get_shape(g["model"])
        key = configs.problem_key(s.num_experts, s.intermediate, s.hidden, s.topk, torch.float8_e4m3fn, "gated")
        assert table[key][str(g["M"])]["rescale"], (g["model"], g["M"])      # "the H200's tuned table takes them"


def test_the_rescaled_form():
    """Appendix A's sums rescaled in place, measured on an H100 (``data/h100_fp8_rescaled.csv`` and its
    profile), and the rule the untuned choice follows from them."""
    from moe_tutorial.experiments import gluon_fp8
    from moe_tutorial.kernels import configs

    rows = gluon_fp8.load_rescaled()
    assert {r["gpu"] for r in rows} == {"NVIDIA H100 80GB HBM3"}
    gains = {(g["model"], g["M"]): g for g in gluon_fp8.rescaled_gains(rows)}

    def first(model, M):
        return gains[model, M]["first"] / gains[model, M]["first_rescaled"]
    assert_says(P7, "Qwen3-30B-A3B's first GEMM gains {} at M = 16384 and {} at 4096; DeepSeek-V3's loses ({} at "
                    "M = 4096)", x(first("Qwen3-30B-A3B", 16384)), x(first("Qwen3-30B-A3B", 4096)),
                x(first("DeepSeek-V3", 4096)))
    assert first("DeepSeek-V3", 4096) < 1 < first("Qwen3-30B-A3B", 4096)
    profile = gluon_fp8.load_rescaled_profile()
    wide, narrow = profile["DeepSeek-V3", gluon_fp8.RESCALED], profile["DeepSeek-V3", gluon_fp8.SHIPPED]
    assert_says(P7, "reads {:.2f} TB/s from DRAM where the 128-wide tile reads {:.2f}, and the L2 runs at {:.0%} of",
                wide["dram_read_tbps"], narrow["dram_read_tbps"], wide["l2_throughput"])
    assert wide["duration_ms"] > narrow["duration_ms"]
    sms = 132                                                   # an H100's, as the CPU plans with
    assert runtime.sm_count() == sms
    deepseek, qwen = get_shape("DeepSeek-V3"), get_shape("Qwen3-30B-A3B")
    wave = configs.wave_weight_bytes(gains["DeepSeek-V3", 16384]["rows"], deepseek.hidden)
    assert_says(P7, "a wave of {} tiles covers {} of the expert's column blocks, {:.0f} MB of", sms,
                sms // (gains["DeepSeek-V3", 16384]["rows"] // 128), wave / 1e6)
    assert_says(P7, "Qwen3-30B-A3B's wave at M = 16384 needs {:.0f} MB",
                configs.wave_weight_bytes(gains["Qwen3-30B-A3B", 16384]["rows"], qwen.hidden) / 1e6)
    assert wave > configs.RESCALED_WAVE_BYTES
    # the layer: from 256 rows an expert the rescaled form won every case, under 256 it lost every case
    big = [g for g in gains.values() if g["rows"] >= configs.GLUON_RESCALED_ROWS]
    small = [g for g in gains.values() if g["rows"] < configs.GLUON_RESCALED_ROWS]
    assert len(big) == 4 and all(g["layer_rescaled"] < g["layer"] for g in big)
    assert small and all(g["layer_rescaled"] > g["layer"] for g in small)
    ratio = [g["layer"] / g["layer_rescaled"] for g in big]
    spread = max(r["noise"] for r in rows for g in big if g["model"] in ("DeepSeek-V3", "Kimi-K2")
                 and (r["model"], r["M"], r["gemm"]) == (g["model"], g["M"], "layer")
                 and r["impl"] in (gluon_fp8.RESCALED_LAYER, g["layer_form"]))
    assert_says(P7, "the fastest form on all three models, {} to {} over the best earlier one (on DeepSeek-V3 and "
                    "Kimi-K2 within the spread of the two orders' timings, up to {:.0%})", x(min(ratio)), x(max(ratio)),
                spread)
    assert all(g["layer"] / g["layer_rescaled"] - 1 < spread for g in big if g["model"] != "Qwen3-30B-A3B")
    q = next(r for r in rows if (r["model"], r["M"], r["impl"]) == ("Qwen3-30B-A3B", 16384, gluon_fp8.RESCALED))
    best = max(r["fp8_rate_fraction"] for r in rows if r["gemm"] == "first" and r["impl"] == gluon_fp8.RESCALED)
    assert q["fp8_rate_fraction"] == best
    p = profile["Qwen3-30B-A3B", gluon_fp8.RESCALED]
    assert_says(P7, "still runs at {:.2f} of the FP8 rate (Qwen3-30B-A3B, M = 16384): its tensor pipe is busy {:.0%} "
                    "of the time, the L2 at {:.0%}", best, p["tensor_pipe_active"], p["l2_throughput"])
    assert p["stall_barrier"] > p["stall_long_scoreboard"]                # "its warps wait most at barriers"


def test_appendix_a_store_layout_numbers():
    """Appendix A's epilogue section (``data/h100_fp8_store_layout.csv``): what whole-row stores gained on
    the first GEMM and the layer, what the stores still cost, and CUTLASS beside it."""
    from moe_tutorial.experiments import gluon_fp8

    g = {(r["model"], r["M"], r["gemm"]): r for r in gluon_fp8.store_layout_gains(gluon_fp8.load_store_layout())}
    q4, q16 = g["Qwen3-30B-A3B", 4096, "first"], g["Qwen3-30B-A3B", 16384, "first"]
    assert_says(P7, "Whole rows made Qwen3-30B-A3B's first GEMM {}x faster at M = 4096 and {}x at M = 16384, where "
                "it now runs at {} of the FP8 rate, past CUTLASS's {} on the same rows.", fmt2(q4["gain"]),
                fmt2(q16["gain"]), fmt2(q16["rate_rows"]), fmt2(q16["rate_cutlass"]))
    assert q16["rate_rows"] > q16["rate_cutlass"] and q16["rows"] < q16["cutlass"]
    assert_says(P7, "the stores would save another {}x at M = 4096 and {}x at 16384", fmt2(q4["rows"] / q4["none"]),
                fmt2(q16["rows"] / q16["none"]))
    layers = [g[m, M, "layer"] for m in ("Qwen3-30B-A3B", "DeepSeek-V3") for M in (4096, 16384)]
    assert_says(P7, "The layer gains {}x and {}x on Qwen3-30B-A3B and {}x and {}x on DeepSeek-V3",
                *(fmt2(r["gain"]) for r in layers))
    assert_says(P7, "the FP8 layer is now {}x and {}x as fast as the bf16 one on Qwen3-30B-A3B at M = 4096 and "
                "16384, and {}x and {}x on DeepSeek-V3", *(fmt2(r["bf16"] / r["rows"]) for r in layers))


def test_appendix_a_store_count_by_hand():
    """The epilogue section's count: the MMA layout's stores against 16 bytes a thread, as the prose says."""
    from moe_tutorial.experiments import gluon_fp8

    mma, rows = gluon_fp8.store_cost(64, 128, 2, 4, 8), gluon_fp8.store_cost(64, 128, 2, 16, 2)
    assert mma == (32, 16, 256) and rows == (8, 256, 128)
    words = {2: "twice", 4: "Four times"}
    assert_says(P7, "{} the instructions and {} the sector writes", words[mma[0] // rows[0]],
                words[mma[2] // rows[2]])


def test_appendix_a_tma_copy_out_numbers():
    """Appendix A's TMA section (``data/h100_fp8_tma_store.csv``, ``h100_fp8_rescaled_profile.csv``,
    ``h100_fp8_stall_sources.csv``): what copying the tiles out gained on 128-row and 64-row tiles, run
    by run, the spread beside it, the bf16 / FP8 ratio after, the profile's numbers, and the by-hand
    count behind the prediction; the dispatcher's rule follows the data."""
    from moe_tutorial.experiments import gluon_fp8
    from moe_tutorial.kernels import configs

    rows = gluon_fp8.load_tma_store()
    gains, runs = gluon_fp8.tma_store_gains(rows), gluon_fp8.tma_store_runs(rows)
    assert all(g["same_bits"] for g in gains)
    big = [g for g in gains if g["rows"] >= configs.GLUON_RESCALED_ROWS]
    small = [g for g in gains if g["rows"] < configs.GLUON_RESCALED_ROWS]
    assert len(big) >= 4 and len(small) >= 3
    assert all(r["store"] > r["tma"] for r in runs if r["rows"] >= configs.GLUON_RESCALED_ROWS)   # "every run"
    assert_says(P7, "Where the layer's tiles were 128 rows (from {} rows an expert, the rule then), the copies made it "
                "faster in every run: by {} to {} (each case's median)", min(g["rows"] for g in big),
                x(min(g["gain"] for g in big)), x(max(g["gain"] for g in big)))
    q16 = next(g for g in big if (g["model"], g["M"]) == ("Qwen3-30B-A3B", 16384))
    assert q16["up"] < q16["down"]                             # the down GEMM's copies gave most of it
    assert_says(P7, "on Qwen3-30B-A3B at M = 16384 by {} to {} in each of its {} runs", x(q16["gain_lo"]),
                x(q16["gain_hi"]), q16["runs"])
    kimi = next(g for g in big if (g["model"], g["M"]) == ("Kimi-K2", 16384))
    assert kimi["runs"] == 1 and kimi["spread"] > kimi["gain"] - 1 and "Kimi-K2 at M = 16384 ran once" in \
        " ".join(markdown(P7).split())
    assert_says(P7, "On the 64-row tiles they gave {} to {}", x(min(g["gain"] for g in small)),
                x(max(g["gain"] for g in small)))
    assert configs.TMA_STORE_MIN_BLOCK_M == configs.GLUON_RESCALED.block_m > configs.GLUON_FUSED_UP.block_m
    assert_says(P7, "So the layer copies out its {}-row tiles wherever the untuned choice takes them",
                configs.TMA_STORE_MIN_BLOCK_M)
    q16_runs = [r["bf16"] / r["tma"] for r in runs if (r["model"], r["M"]) == ("Qwen3-30B-A3B", 16384)]
    assert_says(P7, "The FP8 layer is now {} as fast as the bf16 one on Qwen3-30B-A3B at M = 16384 (the median of its "
                "runs; {} to {})", x(q16["over_tma"]), x(min(q16_runs)), x(max(q16_runs)))
    profile = gluon_fp8.load_rescaled_profile()
    up = profile["Qwen3-30B-A3B", "gluon-128x128-rescaled-split-s4-tma"]
    down = profile["Qwen3-30B-A3B", "gluon-128x256-rescaled-split-s3-tma"]
    assert_says(P7, "the tensor pipe is busy {:.0%} of the time in the gate/up GEMM and {:.0%} in the down GEMM. The "
                "summary's largest stall is \"barrier\"", up["tensor_pipe_active"], down["tensor_pipe_active"])
    assert all(p["stall_barrier"] > p["stall_long_scoreboard"] for p in (up, down))
    sources = gluon_fp8.load_stall_sources()

    def both(kind):
        return [sources[g, kind] for g in ("gate/up", "down")]
    assert_says(P7, "parked at the partitions' closing barrier from start to end: {:.0%} and {:.0%} of the samples",
                *both("idle"))
    assert_says(P7, "the rescaling's multiplies ({:.0%}: one per accumulator element and K step) and the bookkeeping "
                "around them ({:.0%}: integer arithmetic, selects, branches)", sources["gate/up", "fmul"],
                sources["gate/up", "other"])
    waits = ("global wait", "data wait", "slot wait", "mma wait", "mma issue")
    work = {g: sources[g, "fmul"] + sources[g, "other"] for g in ("gate/up", "down")}
    assert work["gate/up"] > 0.5 * (1 - sources["gate/up", "idle"])          # "most of the MMA warps' samples"
    assert work["down"] < sum(sources["down", k] for k in waits)            # "less so" in the down GEMM
    assert_says(P7, "In the down GEMM, whose tiles have only {} K steps, these take {:.0%} and {:.0%}, and waits for "
                "reads from global memory {:.0%}", get_shape("Qwen3-30B-A3B").intermediate // 128,
                sources["down", "fmul"], sources["down", "other"], sources["down", "global wait"])
    assert sources["gate/up", "global wait"] < 0.01 < sources["down", "global wait"]
    assert_says(P7, "The MMA warps wait for a stage's data {:.0%} and {:.0%} of the samples and for the MMAs {:.0%} "
                "and {:.0%}, while the load warp waits for a free stage {:.0%} and {:.0%}", *both("data wait"),
                *both("mma wait"), *both("slot wait"))
    for g in ("gate/up", "down"):
        assert abs(sum(v for (gemm, _), v in sources.items() if gemm == g) - 1) < 1e-3
    # The prediction's answer: the 128-row down tile writes ten times the bytes a K step of the 64-row one.
    per_step = {}
    for model, cfg in (("Qwen3-30B-A3B", configs.GLUON_RESCALED_WIDE), ("DeepSeek-V3", configs.GLUON_FUSED_DOWN)):
        s = get_shape(model)
        per_step[model] = cfg.block_m * cfg.block_n * 2 / (s.intermediate // cfg.block_k)
    assert per_step["Qwen3-30B-A3B"] > 10 * per_step["DeepSeek-V3"]
    by_case = {(g["model"], g["M"]): g for g in gains}
    assert by_case["Qwen3-30B-A3B", 16384]["gain"] > by_case["DeepSeek-V3", 4096]["gain"]


def test_appendix_a_yield_edit_numbers():
    """Appendix A's yield section (``data/h100_fp8_yield.csv``): the gains run by run with the spread
    beside them, the bf16 / FP8 ratio before and after, the same bits in every run, the profile's
    shares it cites, and the rule: the rescaled forms are edited, the promoted ones are not."""
    from moe_tutorial.experiments import gluon_fp8
    from moe_tutorial.kernels import gluon_fp8_kernel, yield_edit

    gains = {(g["model"], g["M"]): g for g in gluon_fp8.yield_gains(gluon_fp8.load_yield())
             if g["pattern"] == yield_edit.PATTERN}
    assert all(g["same_bits"] for g in gains.values()) and all(g["gain"] > 1 for g in gains.values())
    q16, d16, q4 = gains["Qwen3-30B-A3B", 16384], gains["DeepSeek-V3", 16384], gains["Qwen3-30B-A3B", 4096]

    def x3(v):
        return f"{v:.3f}x"
    assert q16["gain_lo"] > 1 and 0 < q16["apart"] < q16["runs"]
    assert_says(P7, "on Qwen3-30B-A3B at M = 16384 by {} ({} to {} in {} runs; in {} of them both orders of the edited "
                "layer were faster than both orders of the unedited one), taking the bf16 layer over the FP8 one "
                "from {} to {}",
                x3(q16["gain"]), x3(q16["gain_lo"]), x3(q16["gain_hi"]), q16["runs"], q16["apart"],
                x(q16["over_plain"]), x(q16["over_edited"]))
    assert d16["spread"] > d16["gain_hi"] - 1 and x3(d16["gain_lo"]) == x3(d16["gain_hi"])   # "in each of"
    assert_says(P7, "on DeepSeek-V3 at M = 16384 by {} in each of its {} runs, within their spread ({:.1%})",
                x3(d16["gain"]), d16["runs"], d16["spread"])
    assert q4["gain_lo"] > 1 and q4["spread"] > q4["gain_hi"] - 1
    assert_says(P7, "at M = 4096 by {} ({} to {} in {} runs), less than their spread", x3(q4["gain"]),
                x3(q4["gain_lo"]), x3(q4["gain_hi"]), q4["runs"])
    other = {(g["model"], g["M"], g["pattern"]): g for g in gluon_fp8.yield_gains(gluon_fp8.load_yield())}
    q16_alt, d16_alt = other["Qwen3-30B-A3B", 16384, "alternate"], other["DeepSeek-V3", 16384, "alternate"]
    every = [g["gain"] for g in other.values() if g["pattern"] == "all"]
    assert abs(q16_alt["gain"] - q16["gain"]) < q16["spread"] and d16_alt["gain"] < 1 < d16["gain"]   # "as well", "not"
    assert d16_alt["runs"] == 1 and len(every) == 3 and max(every) < 1                                # "in every case"
    assert_says(P7, "(`alternate`) did as well on Qwen3-30B-A3B at M = 16384 ({}) but not on DeepSeek-V3 ({}, one "
                "run), and yielding at every multiply (`all`) was slower in every case ({} to {})",
                x3(q16_alt["gain"]), x3(d16_alt["gain"]), x3(min(every)), x3(max(every)))
    sources = gluon_fp8.load_stall_sources()
    assert_says(P7, "the rescale's multiplies are {:.0%} of the samples, the bookkeeping around them {:.0%}",
                sources["gate/up", "fmul"], sources["gate/up", "other"])
    assert gluon_fp8_kernel.YIELD_RESCALED and yield_edit.PATTERN == "reuse-alternate"


def test_appendix_a_tile_height_numbers():
    """Appendix A's "How tall a tile" (``data/h100_fp8_tile_height.csv``): Kimi-K2 at M = 4096, 7680 and
    8192 with the tiles its count cell prints, M = 4096's neighbours (other routings, the same rows),
    the bands over every batch size measured, and the untuned rule between the last loss and the first
    win above it, as the dispatcher applies it."""
    from moe_tutorial.experiments import gluon_fp8
    from moe_tutorial.kernels import configs
    from moe_tutorial.perf.bench import make_routings

    gains = {(g["model"], g["M"]): g for g in gluon_fp8.tile_height_gains(gluon_fp8.load_tile_height())}
    assert len(gains) == 37 and {g["model"] for g in gains.values()} == {"Qwen3-30B-A3B", "DeepSeek-V3", "Kimi-K2"}
    assert_says(P7, "Then the measured ratio, at {} batch sizes of three models", len(gains))
    k4, k7, k8 = gains["Kimi-K2", 4096], gains["Kimi-K2", 7680], gains["Kimi-K2", 8192]
    assert k4["gain_lo"] > 1 and k7["gain_hi"] < 1 < k8["gain_lo"] and k7["runs"] == 1
    assert_says(P7, "At M = 4096 the 128-row pair was {} faster ({} runs) while", x(k4["gain"]), k4["runs"])
    near = [gains["Kimi-K2", M] for M in (4032, 4095, 4097, 4160)]           # other routings, the same rows
    assert all(g["gain"] > 1 and 84 <= g["rows"] < 88 for g in near)
    assert_says(P7, "at M = 4032, 4095, 4097 and 4160 (other routings, {:.0f} to {:.0f} rows an expert) it was {} to "
                "{}.", min(g["rows"] for g in near), max(g["rows"] for g in near),
                x(min(g["gain"] for g in near)), x(max(g["gain"] for g in near)))
    assert_says(P7, "At M = 7680 it was {} and at 8192 {} ({} runs)", x(k7["gain"]), x(k8["gain"]), k8["runs"])
    kimi, run = get_shape("Kimi-K2"), {}
    for M in (4096, 7680, 8192):                                # the count cell's routings
        ((_, ids),) = make_routings(kimi, M)
        run[M] = {b: b * gluon_fp8.row_tiles(ids, kimi.num_experts, b) for b in (64, 128)}   # rows run
    assert abs(run[4096][64] / run[4096][128] - 1) < 0.01                  # "the same rows"
    assert abs(run[7680][128] / run[8192][128] - 1) < 0.01                 # "as many tiles at both"
    more = [run[M][128] / run[M][64] for M in (7680, 8192)]
    assert all(1.28 < m < 1.38 for m in more) and abs(more[0] - more[1]) < 0.02   # "a third more rows at both"
    rule = configs.GLUON_RESCALED_ROWS
    above = [g for g in gains.values() if g["rows"] >= rule]
    middle = [g for g in gains.values() if 128 <= g["rows"] < rule]
    under = [g for g in gains.values() if g["rows"] < 128]
    (odd,) = [g for g in middle if g["gain"] > 1]                             # "all but one"
    assert (odd["model"], odd["rows"]) == ("DeepSeek-V3", 160) and all(g["gain"] > 1 for g in above)
    assert any(g["gain"] > 1 for g in under) and any(g["gain"] < 1 for g in under)
    assert_says(P7, "faster at each one from {:.0f} rows an expert up ({} to {}), slower at all but one from 128 to "
                "{:.0f} rows (down to {}; the one, DeepSeek-V3 at 160 rows, {}), and under 128 rows now ahead and now "
                "behind ({} to {})", min(g["rows"] for g in above), x(min(g["gain"] for g in above)),
                x(max(g["gain"] for g in above)), max(g["rows"] for g in middle), x(min(g["gain"] for g in middle)),
                x(odd["gain"]), x(min(g["gain"] for g in under)), x(max(g["gain"] for g in under)))
    assert max(g["rows"] for g in gains.values() if g["gain"] < 1) < rule <= min(g["rows"] for g in above)
    assert_says(P7, "takes the 128-row pair, copied out through TMA, from {} rows an expert", rule)
    # the untuned choice: Kimi-K2 at M = 7680 (160 rows) on the 64-row pair, at 8192 (170) on the 128-row one,
    # copied out (the interpreter takes its own tiles, so the GPU's choice is asked for by name)
    for M, tall in ((7680, False), (8192, True)):
        up = configs.fp8_heuristic_config(M, kimi.topk, kimi.num_experts, "gated", kernel="gluon")
        down = configs.fp8_heuristic_config(M, kimi.topk, kimi.num_experts, "down", kernel="gluon")
        assert (up, down) == ((configs.GLUON_RESCALED, configs.GLUON_RESCALED_WIDE) if tall
                              else (configs.GLUON_FUSED_UP, configs.GLUON_FUSED_DOWN))
        assert configs.layer_copies_out(up, M * kimi.topk // kimi.num_experts) == tall


def test_appendix_a_reading_rows_by_index():
    """Appendix A's "Or no copy at all" (``data/h100_fp8_gather.csv``, the gathering GEMM's stall
    sources): both load-warp counts against the sorted copy, the profile, the rule the layer follows
    and what it gives Qwen3-30B-A3B."""
    from moe_tutorial.experiments import gluon_fp8
    from moe_tutorial.kernels import gluon_fp8_kernel

    gains = gluon_fp8.gather_gains(gluon_fp8.load_gather())
    four = [g for g in gains if g["warps"] == "4 load warps"]
    qwen = [g for g in four if g["model"] == "Qwen3-30B-A3B"]
    wide = [g for g in four if g["model"] != "Qwen3-30B-A3B"]
    one = [g for g in gains if g["warps"] == "1 load warp"]
    assert {g["model"] for g in wide} == {"DeepSeek-V3", "Kimi-K2"} and all(g["same_bits"] for g in gains)
    assert_says(P7, "With four load warps the layer is {} to {} as fast on Qwen3-30B-A3B at every M where its "
                "gate/up GEMM takes the split form (M = {} to {}", x(min(g["gain_lo"] for g in qwen)),
                x(max(g["gain_hi"] for g in qwen)), min(g["M"] for g in qwen), max(g["M"] for g in qwen))
    assert min(g["gain_lo"] for g in qwen) > 1 > max(g["gain_hi"] for g in wide + one)
    assert_says(P7, "and {} to {} as fast on DeepSeek-V3 and Kimi-K2. One load warp is slower in every case ({} to {})",
                x(min(g["gain_lo"] for g in wide)), x(max(g["gain_hi"] for g in wide)),
                x(min(g["gain_lo"] for g in one)), x(max(g["gain_hi"] for g in one)))
    s = gluon_fp8.load_stall_sources()
    by_index, copy = "gate/up, by index", "gate/up"
    assert_says(P7, "the MMA warps wait for a stage's data in {:.0%} of the samples ({:.0%} with the sorted copy), and "
                "the load warps wait for a free stage in {:.0%}", s[by_index, "data wait"], s[copy, "data wait"],
                s[by_index, "slot wait"])
    assert s[by_index, "data wait"] <= s[copy, "data wait"]                   # "the rows arriving in time"
    assert_says(P7, "three warps of a block sat idle ({:.0%} of the samples); now four copy rows and compute their "
                "addresses (idle: {:.0%})", s[copy, "idle"], s[by_index, "idle"])
    inter = {g["model"]: g["inter"] for g in four}
    assert_says(P7, "So the layer reads by index where I is at most {} (`gluon_fp8_kernel.GATHER_MAX_INTER`",
                gluon_fp8_kernel.GATHER_MAX_INTER)
    assert inter["Qwen3-30B-A3B"] <= gluon_fp8_kernel.GATHER_MAX_INTER < min(inter[g["model"]] for g in wide)
    at = {g["M"]: g for g in qwen}
    assert_says(P7, "this lifts bf16 / FP8 from {:.2f}x to {:.2f}x at M = 4096 and from {:.2f}x to {:.2f}x at "
                "M = 16384 (medians of {} runs)", at[4096]["over_copy"], at[4096]["over_index"],
                at[16384]["over_copy"], at[16384]["over_index"], WORDS[at[16384]["runs"]])
    assert at[4096]["runs"] == at[16384]["runs"]
