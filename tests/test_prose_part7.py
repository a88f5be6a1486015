"""Every number the prose of notebook 07 states, rendered from the committed FP8 data or the code it
comes from: when ``moe_tutorial/data/h200_fp8_bench.csv`` changes, the stale sentences fail here and
``scripts/update_prose.py`` rewrites them (read the words around each number afterwards)."""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

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


@pytest.fixture(scope="module")
def rows():
    return load_rows(DATA_DIR / "h200_fp8_bench.csv")


def x(v: float) -> str:
    return f"{v:.2f}x"


def speedups(rows, gemm, Ms):
    """``{(model, M): bf16 time / FP8 time}`` at the given M, every model of the run."""
    out = {}
    for model in report.model_order(select(rows, impl="fp8")):
        m, s = part7.speedups(rows, model, gemm)
        out.update({(model, int(M)): float(v) for M, v in zip(m, s) if int(M) in Ms})
    return out


def fraction(rows, model, M, impl="fp8"):
    (r,) = select(rows, model=model, gemm="first", impl=impl, M=M)
    return r["fraction_of_floor"]


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
    models = report.model_order(select(rows, impl="fp8"))
    assert len(models) == 5
    lo1 = min(at_1, key=at_1.get)
    assert lo1 == ("Qwen3-30B-A3B", 1) and max(at_1, key=at_1.get)[0] == "DeepSeek-V3"
    q = {impl: select(rows, model="Qwen3-30B-A3B", gemm="first", impl=impl, M=1)[0] for impl in ("fp8", "sorted")}
    slower = sorted(m for (m, _), v in at_16k.items() if v < 1)
    assert_says(P7, "From M = 8 to M = 256 the FP8 gate/up GEMM is {} to {} as fast as bf16 on all five models",
                x(min(first_mid.values())), x(max(first_mid.values())))
    assert_says(P7, "At M = 1 it is {} on Qwen3-30B-A3B to {} on DeepSeek-V3: Qwen3-30B-A3B's call takes {:.1f} us "
                    "against bf16's {:.1f}, and what FP8 does not halve, one launch of {:.1f} us,",
                x(at_1[lo1]), x(at_1["DeepSeek-V3", 1]), q["fp8"]["ms"] * 1e3, q["sorted"]["ms"] * 1e3,
                q["fp8"]["launch_us"])
    lo1024 = min(at_1024, key=at_1024.get)
    assert lo1024[0] == "Mixtral-8x7B"
    assert_says(P7, "At M = 1024 it is {} (Mixtral-8x7B, already compute-bound there) to {}, and at M = 16384 {} to {}",
                x(at_1024[lo1024]), x(max(at_1024.values())), x(min(at_16k.values())), x(max(at_16k.values())))
    words = {1: "one", 2: "two", 3: "three", 4: "four"}
    assert_says(P7, "FP8 is slower than bf16 on {} of the five models", words[len(slower)])
    assert_says(P7, "The whole layer follows the gate/up GEMM: {} to {} from M = 8 to 256, {} to {} at M = 16384.",
                x(min(layer_mid.values())), x(max(layer_mid.values())), x(min(layer_16k.values())),
                x(max(layer_16k.values())))


def test_the_promotion_and_the_steps(rows):
    rates = [r["tflops"] / r["fp8_tflops"] for r in select(rows, gemm="first", impl="fp8") if r["M"] >= 4096]
    assert max(rates) < 0.5                                  # "well under half"
    assert_says(P7, "at M >= 4096 the kernel reaches {} to {} of the FP8 matmul rate", fmt2(min(rates)),
                fmt2(max(rates)))
    noise = report.spread_percent(report.fp8_same_kernel_pairs(rows))
    assert_says(P7, "most differences between the steps sit inside the band of {:.1f}%", noise)
    best = {r["M"]: r["ms"] for r in select(rows, model="DeepSeek-V3", gemm="first", impl="fp8")}
    rel = {step: {r["M"]: r["ms"] / best[r["M"]] for r in select(rows, model="DeepSeek-V3", gemm="first", impl=step)}
           for step in ("fp8-step0", "fp8+swap", "fp8+tma")}
    assert rel["fp8+tma"][1] > 1 + noise / 100
    at16k = [rel[s][16384] for s in rel]
    assert_says(P7, "TMA costs {} at M = 1, and every step before the tuned tiles takes {} to {} the tuned kernel's "
                    "time at M = 16384", x(rel["fp8+tma"][1]), x(min(at16k)), x(max(at16k)))
    g = report.floor_geomeans(select(rows, model="Qwen3-30B-A3B"), "first")
    q = [g["Qwen3-30B-A3B", s] for s in ("fp8-step0", "fp8+swap", "fp8+tma", "fp8")]
    assert q[1] - q[0] > max(abs(q[2] - q[1]), abs(q[3] - q[1])), "the swap is no longer Qwen3's step that pays"
    assert_says(P7, "its geometric mean goes from {} of the floor to {}, then {} with TMA and {} with the tuned table",
                *map(fmt2, q))
    assert "within noise" not in markdown(P7) and "the tuned table's gain" not in markdown(P7)


def test_against_its_floor(rows):
    small = speedups(rows, "first", (1, 8, 64, 256))
    fr = [r["fraction_of_floor"] for r in select(rows, gemm="first", impl="fp8") if r["M"] <= 256]
    rates = [r["tflops"] / r["fp8_tflops"] for r in select(rows, gemm="first", impl="fp8") if r["M"] >= 4096]
    assert_says(P7, "At M ≤ 256 the FP8 gate/up GEMM is {} to {} faster than bf16 and reaches {} to {} of its floor; "
                    "at M ≥ 4096 it reaches at most {} of the FP8 matmul rate", x(min(small.values())),
                x(max(small.values())), fmt2(min(fr)), fmt2(max(fr)), fmt2(max(rates)))
    assert_says(P7, "We did not run vLLM's block-FP8 path, so this notebook has no vLLM numbers.")
    text = markdown(P7)
    assert "meets its targets" not in text and "0.55 to 0.72" not in text


def test_recap(rows):
    mid = speedups(rows, "first", (8, 64, 256))
    slower = [m for (m, _), v in speedups(rows, "first", (16384,)).items() if v < 1]
    assert len(slower) == 3
    assert_says(P7, "On an H200 it is {} to {} as fast as bf16 from M = 8 to 256", x(min(mid.values())),
                x(max(mid.values())))
    assert_says(P7, "and on three of five models below bf16")
