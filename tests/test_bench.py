"""The bench's pieces that a GPU run depends on, exercised on the CPU: timers, skips, references."""
import dataclasses
import math

from moe_tutorial import runtime
from moe_tutorial.kernels import sorted_layer
from moe_tutorial.perf import bench, ceilings, registry, timing
from moe_tutorial.perf import impls as bench_impls
from moe_tutorial.reference import reference_moe_layer, reference_moe_matmul, rel_error
from moe_tutorial.shapes import ModelShape

import pytest
import torch

SHAPE = ModelShape("custom", num_experts=6, topk=2, hidden=32, intermediate=16)


def inputs(M=5, rotations=1, shape=SHAPE, seed=0):
    w13, w2 = bench.make_weights(shape, torch.float32, with_w2=True, seed=seed)
    return bench.make_inputs(shape, M, torch.float32, w13, w2, num_rotations=rotations, seed=seed)


def test_inputs_are_random_reproducible_and_rotated():
    a, b = inputs(M=7, rotations=3), inputs(M=7, rotations=3)
    assert len(a.xs) == len(a.ids) == len(a.weights) == 3
    assert all(torch.equal(x, y) for x, y in zip(a.xs, b.xs))
    assert not torch.equal(a.xs[0], a.xs[1]) and not torch.equal(a.ids[0], a.ids[1])
    assert a.w13.abs().min() > 0 and a.xs[0].std() > 0.5           # random, never zeros
    assert all(torch.allclose(w.sum(1), torch.ones(7)) for w in a.weights)
    assert a.touched == sum(len(torch.unique(i)) for i in a.ids) / 3


@pytest.mark.parametrize("M", [1, 3, 40])
def test_layer_reference_on_renumbered_experts_matches_the_full_one(M):
    inp = inputs(M=M)
    rows, ref = bench.reference_rows("layer", inp, max_rows=4)
    full = reference_moe_layer(inp.xs[0], inp.w13, inp.w2, inp.weights[0], inp.ids[0])
    assert torch.allclose(ref, full[rows], rtol=1e-12, atol=1e-12)
    rows, ref = bench.reference_rows("first", inp)
    assert torch.allclose(ref, reference_moe_matmul(inp.xs[0], inp.w13, inp.ids[0])[rows], rtol=1e-12, atol=1e-12)
    assert len(rows) == min(M, 16)


def test_grouped_mm_preparation_sorts_and_unsorts(monkeypatch):
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("no torch._grouped_mm in this torch")
    monkeypatch.setattr(bench_impls, "grouped_mm_support", lambda dtype: None)
    inp = inputs(M=9, rotations=2)
    prepared = registry.prepare("first", "grouped_mm", inp)
    out = prepared.output(prepared.calls[0]())
    ref = reference_moe_matmul(inp.xs[0], inp.w13, inp.ids[0])
    assert rel_error(out, ref) < 1e-5
    xs, offs, order = bench_impls.sort_rows_by_expert(inp.xs[0], inp.ids[0], 6)
    assert offs.dtype == torch.int32 and int(offs[-1]) == 18 and torch.all(offs[1:] >= offs[:-1])
    assert torch.equal(xs, inp.xs[0][order // 2])


def test_grouped_mm_states_why_it_cannot_run_here():
    reason = bench_impls.grouped_mm_support(torch.float32)
    if runtime.ON_GPU and reason is None:
        pytest.skip("this GPU runs it")
    assert reason and ("sm90" in reason or "bf16" in reason or "no torch._grouped_mm" in reason)


def test_indexing_is_skipped_with_the_size_when_it_would_not_fit(monkeypatch):
    monkeypatch.setattr(bench_impls, "free_memory_bytes", lambda: 200_000)
    inp = inputs(M=64)
    with pytest.raises(bench_impls.Skip, match=r"intermediate needs 0\.54 MB, more than 33% of the 0\.20 MB free"):
        registry.prepare("first", "indexing", inp)
    row = bench.run_case("layer", "indexing", inp, bench.reference_rows("layer", inp),
                         ceilings.Ceilings(1.0, 1.0), bench.BenchPlan([SHAPE], (64,), torch.float32))
    assert row["status"].startswith("skipped: its [M, topk, N, K] intermediate") and row.get("ms") is None


def test_published_kernel_is_not_run_where_its_offsets_overflow():
    big = torch.zeros(1, 1, 1).expand(8, 2 ** 14, 2 ** 14)        # 2^31 elements, no memory
    inp = bench_impls.Inputs(ModelShape("big", 8, 2, 2 ** 14, 2 ** 13), 2, torch.float32, big, None,
                             [torch.zeros(2, 2 ** 14)], [torch.zeros(2, 2, dtype=torch.int32)], [torch.ones(2, 2)])
    with pytest.raises(bench_impls.Skip, match="int32 offsets wrap"):
        registry.prepare("first", "published", inp)
    odd = bench_impls.Inputs(ModelShape("odd", 8, 3, 16, 8), 1, torch.float32, torch.zeros(8, 16, 16), None,
                             [torch.zeros(1, 16)], [torch.zeros(1, 3, dtype=torch.int32)], [torch.ones(1, 3)])
    with pytest.raises(bench_impls.Skip, match="power of two"):
        registry.prepare("first", "published", odd)


def test_big_weights_get_a_guard_so_the_published_kernel_can_run(monkeypatch):
    """Scaled down: pretend int32 wraps past 64 elements."""
    monkeypatch.setattr(bench_impls, "INT32_LIMIT", 64)
    monkeypatch.setattr(bench, "INT32_LIMIT", 64)
    monkeypatch.setattr(bench, "INT32_GUARD", 64)
    inp = inputs(M=3)
    assert inp.w13.storage_offset() == 64 and inp.w13.is_contiguous()
    assert inp.w2.storage_offset() == 0
    prepared = registry.prepare("first", "published", inp)      # runs: reads stay inside the buffer
    out = prepared.output(prepared.calls[0]())
    assert rel_error(out, reference_moe_matmul(inp.xs[0], inp.w13, inp.ids[0])) < 1e-5
    unguarded = bench_impls.Inputs(SHAPE, 3, torch.float32, inp.w13.clone(), None, inp.xs, inp.ids, inp.weights)
    with pytest.raises(bench_impls.Skip, match="int32 offsets wrap"):
        registry.prepare("first", "published", unguarded)


def test_wrong_results_are_flagged_and_still_timed(monkeypatch):
    inp = inputs(M=3)
    rows, ref = bench.reference_rows("first", inp)
    plan = bench.BenchPlan([SHAPE], (3,), torch.float32)
    ok = bench.run_case("first", "sorted", inp, (rows, ref), ceilings.Ceilings(1.0, 1.0), plan)
    assert ok["status"] == "ok" and ok["rel_error"] < 1e-5 and ok["ms"] > 0
    wrong = bench.run_case("first", "sorted", inp, (rows, ref * 1.1), ceilings.Ceilings(1.0, 1.0), plan)
    assert wrong["status"] == "wrong" and wrong["ms"] > 0 and wrong["rel_error"] > 0.05


def test_unwritten_outputs_count_as_wrong(monkeypatch):
    """The kernels' output buffers are poisoned with NaN, so a launch that writes nothing fails."""
    inp = inputs(M=3)
    monkeypatch.setattr(sorted_layer, "launch_sorted_gemm", lambda *a, **k: None)
    row = bench.run_case("first", "sorted", inp, bench.reference_rows("first", inp), ceilings.Ceilings(1.0, 1.0),
                         bench.BenchPlan([SHAPE], (3,), torch.float32))
    assert row["status"] == "wrong" and row["rel_error"] == math.inf


def test_slow_cases_are_skipped_with_the_limit(monkeypatch):
    monkeypatch.setattr(timing, "time_one_call", lambda fn: 5.0)
    with pytest.raises(timing.TooSlow, match="slower than 2 s per call"):
        timing.measure_ms(lambda: None, max_seconds=2.0)
    with pytest.raises(ValueError, match=r"^protocol: expected one of cold-l2, cold-l2-zero, rotated, got 'stopwatch'"):
        timing.measure_ms(lambda: None, protocol="stopwatch")


@pytest.fixture
def gpu_timers(monkeypatch):
    """The GPU branch of measure_ms with the device timers replaced by recorders."""
    monkeypatch.setattr(runtime, "ON_GPU", True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    calls = []

    def use(capture_fails=False):
        def graph_timer(name, ms):
            def timer(fn, *args, **kwargs):
                calls.append((name, fn))
                if capture_fails:
                    raise RuntimeError("operation not permitted when stream is capturing")
                return ms
            return timer
        monkeypatch.setattr(timing, "cold_l2_ms", graph_timer("cold-l2", 0.5))
        monkeypatch.setattr(timing, "_rotated_ms", graph_timer("rotated", 0.4))
        monkeypatch.setattr(timing, "_cold_events_ms",
                            lambda fn, reps, how="read": calls.append(("events", reps)) or 0.7)
        return calls
    return use


def test_gpu_timer_choice_and_fallback(gpu_timers, monkeypatch):
    monkeypatch.setattr(timing, "time_one_call", lambda fn: 0.001)
    one, rotating = (lambda: None), (lambda: None)
    calls = gpu_timers()
    assert timing.measure_ms(one) == (0.5, "cold-l2")
    assert timing.measure_ms(one, protocol="rotated", rotated_fn=rotating) == (0.4, "rotated")
    assert calls[:2] == [("cold-l2", one), ("rotated", rotating)]       # the rotated graph cycles the inputs
    assert timing.measure_ms(one, graphable=False) == (0.7, timing.HOST_SYNC_TIMER)
    assert calls[-1] == ("events", timing.COLD_REPLAYS)
    assert timing.measure_ms(one, graphable=False, no_graph_timer="events, autograd (no graph)") == (
        0.7, "events, autograd (no graph)")              # the caller names what stops the graph
    gpu_timers(capture_fails=True)
    assert timing.measure_ms(one) == (0.7, timing.CAPTURE_FAILED_TIMER)
    monkeypatch.setattr(timing, "time_one_call", lambda fn: 0.5)   # slow: a few events by hand
    assert timing.measure_ms(one, max_seconds=2.0) == (0.7, timing.SLOW_CALL_TIMER)
    assert calls[-1] == ("events", 4)


def test_statuses_name_only_unusual_timers(monkeypatch):
    inp = inputs(M=2)
    ref = bench.reference_rows("first", inp)
    plan = bench.BenchPlan([SHAPE], (2,), torch.float32)
    for how, status in (("perf_counter", "ok"), (timing.SLOW_CALL_TIMER, "ok"), ("cold-l2", "ok"),
                        (timing.HOST_SYNC_TIMER, "ok"),
                        ("events, graph capture failed", "ok (events, graph capture failed)")):
        monkeypatch.setattr(bench, "measure_ms", lambda fn, how=how, **kw: (1.0, how))
        assert bench.run_case("first", "fused", inp, ref, ceilings.Ceilings(1.0, 1.0), plan)["status"] == status


def test_failing_implementation_does_not_end_the_sweep(monkeypatch, tmp_path):
    def boom(inp):
        raise RuntimeError("CUDA error: out of memory\nmore text")
    monkeypatch.setitem(registry.BY_NAME, "fused", dataclasses.replace(registry.BY_NAME["fused"], first=boom))
    plan = bench.BenchPlan([SHAPE], (1, 2), torch.float32, gemms=("first",), impls=("fused", "loop"))
    rows = bench.run_bench(plan, csv_path=tmp_path / "b.csv", progress=False, log=lambda s: None,
                           ceilings=ceilings.Ceilings(1.0, 1.0))
    assert [(r["impl"], r["M"], r["status"][:20]) for r in rows] == [
        ("fused", 1, "skipped: error: Runt"), ("loop", 1, "ok"),
        ("fused", 2, "skipped: error: Runt"), ("loop", 2, "ok")]
    assert rows[0]["status"] == "skipped: error: RuntimeError: CUDA error: out of memory"
    assert (tmp_path / "b.csv").exists()


def test_failing_inputs_skip_the_case_and_the_next_one_rebuilds(monkeypatch):
    real = bench.reference_rows
    calls = []

    def flaky(gemm, inp, max_rows=None):
        calls.append(inp.M)
        if len(calls) == 1:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 30 GiB")
        return real(gemm, inp, max_rows)
    monkeypatch.setattr(bench, "reference_rows", flaky)
    plan = bench.BenchPlan([SHAPE], (1, 2), torch.float32, gemms=("first",), impls=("loop",))
    rows = bench.run_bench(plan, progress=False, log=lambda s: None, ceilings=ceilings.Ceilings(1.0, 1.0))
    assert rows[0]["status"] == ("skipped: error while preparing inputs: OutOfMemoryError: "
                                 "CUDA out of memory. Tried to allocate 30 GiB")
    assert rows[1]["status"] == "ok" and calls == [1, 2]


def test_time_budget_skips_the_rest(monkeypatch):
    clock = iter(range(0, 10_000, 100))
    monkeypatch.setattr(bench.time, "monotonic", lambda: next(clock))
    plan = bench.BenchPlan([SHAPE], (1, 2, 3), torch.float32, gemms=("first",), impls=("loop",), max_minutes=3)
    rows = bench.run_bench(plan, progress=False, log=lambda s: None, ceilings=ceilings.Ceilings(1.0, 1.0))
    assert [r["status"] for r in rows] == ["ok", "skipped: over the --max-minutes 3 budget",
                                           "skipped: over the --max-minutes 3 budget"]


@pytest.mark.gpu
@pytest.mark.skipif(not runtime.ON_GPU, reason="needs a CUDA GPU")
def test_both_protocols_agree_with_events_on_a_long_kernel():
    """On a GPU, a 4096^3 matmul (launch and L2 negligible) reads the same under every timer."""
    import triton.testing

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    c = torch.empty_like(a)
    events = triton.testing.do_bench(lambda: torch.matmul(a, a, out=c), return_mode="median")
    for protocol in timing.PROTOCOLS:
        ms, how = timing.measure_ms(lambda: torch.matmul(a, a, out=c), protocol=protocol)
        assert how == protocol and 0.05 < ms < 5.0
        assert abs(ms / events - 1) < 0.2, (protocol, ms, events)


@pytest.mark.gpu
@pytest.mark.skipif(not runtime.ON_GPU, reason="needs a CUDA GPU")
def test_ceilings_on_a_gpu_are_plausible():
    """Read-only bandwidth beats the copy, a launch costs microseconds, the matmul runs at tensor-core speed."""
    c = ceilings.measure_ceilings(torch.bfloat16, "cold-l2", read_bytes=2 << 30)
    assert c.read_tbps > 0.5 and c.copy_tbps > 0.3 and c.matmul_tflops > 50 and 0.5 < c.launch_us < 30


@pytest.mark.skipif(not runtime.INTERPRETED, reason="runs the read-only kernel in the interpreter")
@pytest.mark.parametrize("programs,block,evict_first", [(3, 512, False), (4, 256, True)])
def test_read_only_kernel_reads_every_word_once(programs, block, evict_first):
    words = torch.arange(10_000, dtype=torch.int32)
    sums = torch.empty(programs, dtype=torch.int32)
    ceilings.read_only_kernel[(programs,)](words, sums, words.numel(), BLOCK=block, EVICT_FIRST=evict_first)
    assert int(sums.sum()) == int(words.sum())


def test_floor_adds_one_launch_to_the_larger_roof():
    c = ceilings.Ceilings(read_tbps=4.0, matmul_tflops=800.0, launch_us=3.0, fp8_tflops=1600.0)
    assert c.floor_ms(4e9, 1.0) == pytest.approx(1.0 + 0.003)        # memory-bound: 4 GB at 4 TB/s
    assert c.floor_ms(1.0, 8e11) == pytest.approx(1.0 + 0.003)       # compute-bound: 0.8 TFLOP at 800 TFLOP/s
    assert c.floor_ms(1.0, 8e11, "fp8") == pytest.approx(0.5 + 0.003)  # ... at the FP8 rate, twice as fast
    assert c.columns() == {"protocol": "cold-l2", "read_tbps": 4.0, "read_measured_tbps": 4.0, "copy_tbps": None,
                           "matmul_tflops": 800.0,
                           "fp8_tflops": 1600.0, "launch_us": 3.0}
    with pytest.raises(ValueError, match="precision: expected 'bf16' or 'fp8'"):
        c.floor_ms(1.0, 1.0, "int8")


def test_cpu_ceilings_fill_every_column():
    c = ceilings.measure_ceilings(torch.float32, "cold-l2", read_bytes=4 << 20, matmul_n=128)
    assert c.read_tbps > 0 and c.copy_tbps > 0 and c.matmul_tflops > 0
    assert c.protocol == ("cold-l2" if runtime.ON_GPU else "perf_counter")
    with pytest.raises(ValueError, match=r"^protocol: expected one of cold-l2, cold-l2-zero, rotated, got 'warm'"):
        ceilings.measure_ceilings(torch.float32, "warm")


def test_part4_steps_compute_the_same_first_gemm_and_layer():
    """Each production step of notebook 04 is timed as an implementation: all of them agree."""
    plan = bench.BenchPlan([SHAPE], (5,), torch.float32, impls=("sorted",) + bench_impls.FIRST_STEPS
                           + bench_impls.LAYER_STEPS)
    rows = bench.run_bench(plan, progress=False, log=lambda s: None, ceilings=ceilings.Ceilings(1.0, 1.0))
    assert {(r["gemm"], r["impl"]) for r in rows} == (
        {("first", i) for i in ("sorted",) + bench_impls.FIRST_STEPS}
        | {("layer", i) for i in ("sorted",) + bench_impls.LAYER_STEPS})
    for r in rows:
        assert r["status"] == "ok" and r["rel_error"] < 1e-5, r
    with pytest.raises(ValueError, match=r"^step: expected one of minimal, \+grouped, \+tuned, \+tma, got 'fast'"):
        bench_impls.first_step("fast")


def test_default_sweep_leaves_the_steps_out():
    plan = bench.BenchPlan([SHAPE], (1,), torch.float32)
    names = {impl for _, _, _, impl in bench.cases(plan)}
    assert "sorted" in names and not names & set(bench_impls.FIRST_STEPS + bench_impls.LAYER_STEPS)


def test_time_both_orders_times_each_call_forward_then_in_reverse(monkeypatch):
    """The scripts' comparisons: each call timed once in the given order and once in reverse, so that
    the second reading of the first call comes last."""
    seen = []
    monkeypatch.setattr(timing, "measure_ms", lambda fn, **kw: (fn(), (len(seen) + 0.5, "stub"))[1])
    times = timing.time_both_orders({"a": lambda: seen.append("a"), "b": lambda: seen.append("b"),
                                     "c": lambda: seen.append("c")})
    assert seen == ["a", "b", "c", "c", "b", "a"]
    assert times == {"a": [1.5, 6.5], "b": [2.5, 5.5], "c": [3.5, 4.5]}


def test_make_inputs_routes_with_the_routings_make_routings_gives():
    """One definition of the bench's routing: ``make_inputs`` holds ``make_routings``' rotations (which
    notebook 07 counts tiles of), each a different draw, seeded by M."""
    from moe_tutorial.perf import bench
    from moe_tutorial.shapes import get_shape

    shape = get_shape("Qwen3-30B-A3B")
    routings = bench.make_routings(shape, 37, num_rotations=2)
    inp = bench.make_inputs(shape, 37, torch.float32, None, None, num_rotations=2)
    for (w, i), w_in, i_in in zip(routings, inp.weights, inp.ids):
        assert torch.equal(i, i_in.cpu()) and torch.equal(w, w_in.cpu())
        assert i.shape == (37, shape.topk)
    assert not torch.equal(routings[0][1], routings[1][1])
    assert torch.equal(bench.make_routings(shape, 37)[0][1], routings[0][1])
    assert not torch.equal(bench.make_routings(shape, 38)[0][1][:37], routings[0][1])


def test_timed_gives_a_rows_timing_columns_from_both_orders():
    """``sweep.timed``: the faster of the two orders as ``ms``, both kept, and their difference over
    the faster as ``noise``, whichever order was faster; NaN (no GPU) stays NaN."""
    from moe_tutorial.perf import sweep

    assert sweep.timed([2.0, 1.0]) == dict(ms=1.0, ms_forward=2.0, ms_reverse=1.0, noise=1.0)
    assert sweep.timed([1.5, 3.0]) == dict(ms=1.5, ms_forward=1.5, ms_reverse=3.0, noise=1.0)
    assert all(math.isnan(v) for v in sweep.timed([float("nan")] * 2).values())
