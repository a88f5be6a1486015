"""Part 6 on the CPU: the expert- and tensor-parallel layers in 2 and 4 gloo processes against the
single-process layer, the checks that make mistakes fail clearly, the launcher, the GPU bench's
code path on tiny shapes, and the cost model, memory table and figures.

Every launch starts fresh processes (about 2 s each on a laptop), so each one runs a whole battery
of cases; the rank programs are top-level functions here because the ranks import them by name.
"""
import moe_tutorial as mt  # noqa: F401,I001  (first: picks the runtime before anything imports triton)

import math
import time
from pathlib import Path

import pytest
import torch

from moe_tutorial.parallel import (
    bench,
    combine,
    cost,
    demos,
    dispatch,
    expert_parallel_layer,
    experts_per_rank,
    graphs,
    launch,
    memory,
    require_group,
    results,
    shard_experts,
    shard_intermediate,
    tensor_parallel_layer,
)
from moe_tutorial.figures import part6
from moe_tutorial.parallel.dispatch import destinations, send_order
from moe_tutorial.parallel.launch import RemoteTraceback
from moe_tutorial.reference import reference_moe_layer, rel_error
from moe_tutorial.shapes import MODEL_SHAPES, ModelShape

SMALL = dict(num_experts=4, topk=2, hidden=16, inter=8)


# --------------------------------------------------------------------------------------
# Rank programs (run inside the launched processes)
# --------------------------------------------------------------------------------------

def layers_on_every_rank(cases: list[dict]) -> list[dict]:
    """For each case: the EP layer, the same by its three steps, and the TP layer, on this rank."""
    rank, world = require_group()
    out = []
    for case in cases:
        case = dict(case)
        int64 = case.pop("int64_ids", False)
        p = demos.make_problem(**case)
        x, tw, ti = demos.own_tokens(p, rank)
        if int64:
            ti = ti.long()
        w13, w2 = shard_experts(p.w13, p.w2, rank, world)
        steps = demos.expert_parallel_demo(case)
        t13, t2 = shard_intermediate(p.w13, p.w2, rank, world)
        out.append({"ep": expert_parallel_layer(x, w13, w2, tw, ti, num_experts=case["num_experts"]),
                    "steps": steps["y"], "counts": steps["counts"], "received": steps["received_ids"],
                    "tp": tensor_parallel_layer(p.x, t13, t2, p.topk_weights, p.topk_ids)})
    return out


def _message(fn) -> str:
    try:
        fn()
    except (ValueError, TypeError, RuntimeError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def mistakes_on_every_rank() -> dict:
    """Each mistake made on every rank (or differing between ranks); the message each rank gets.
    After every error the ranks are still in step, which the last, correct call shows."""
    rank, world = require_group()
    p = demos.make_problem([3, 3], **SMALL)
    x, tw, ti = demos.own_tokens(p, rank)
    w13, w2 = shard_experts(p.w13, p.w2, rank, world)
    t13, t2 = shard_intermediate(p.w13, p.w2, rank, world)
    other = demos.make_problem([3, 3], num_experts=4, topk=2, hidden=8, inter=8)     # K = 8 instead of 16
    ox, otw, oti = demos.own_tokens(other, rank)
    o13, o2 = shard_experts(other.w13, other.w2, rank, world)
    wide = demos.make_problem([3, 3], num_experts=8, topk=2, hidden=16, inter=8)     # E = 8 instead of 4
    wx, wtw, wti = demos.own_tokens(wide, rank)
    w8_13, w8_2 = shard_experts(wide.w13, wide.w2, rank, world)
    r1 = rank == 1
    messages = {
        "E not divisible": _message(lambda: expert_parallel_layer(x, w13[:1], w2[:1], tw, ti, num_experts=3)),
        "K differs": _message(lambda: expert_parallel_layer(ox if r1 else x, o13 if r1 else w13, o2 if r1 else w2,
                                                            otw if r1 else tw, oti if r1 else ti, num_experts=4)),
        "topk differs": _message(lambda: expert_parallel_layer(x, w13, w2, tw[:, :1] if r1 else tw,
                                                               ti[:, :1] if r1 else ti, num_experts=4)),
        "E differs": _message(lambda: expert_parallel_layer(wx if r1 else x, w8_13 if r1 else w13,
                                                            w8_2 if r1 else w2, wtw if r1 else tw,
                                                            wti if r1 else ti, num_experts=8 if r1 else 4)),
        "E differs, same weights": _message(lambda: expert_parallel_layer(x, w13, w2, tw, ti,
                                                                          num_experts=8 if r1 else 4)),
        "TP batch differs": _message(lambda: tensor_parallel_layer(p.x[:5] if r1 else p.x, t13, t2,
                                                                   p.topk_weights[:5] if r1 else p.topk_weights,
                                                                   p.topk_ids[:5] if r1 else p.topk_ids)),
        "TP I not divisible": _message(lambda: shard_intermediate(p.w13[:, :6], p.w2[:, :, :3], rank, 2)),
        "id out of range": _message(lambda: expert_parallel_layer(x, w13, w2, tw, torch.full_like(ti, 9),
                                                                  num_experts=4)),
        "combine rows": _message(lambda: combine(x, dispatch(x, tw, ti, 4).plan)),
    }
    y = expert_parallel_layer(x, w13, w2, tw, ti, num_experts=4)
    messages["still in step"] = rel_error(y, reference_moe_layer(x, *(p.w13, p.w2), tw, ti))
    return messages


def bad_weights_on_rank_1() -> None:
    """Rank 1 passes 3 experts where E / world = 2: it raises alone, rank 0 waits in the exchange."""
    rank, world = require_group()
    p = demos.make_problem([2, 2], **SMALL)
    x, tw, ti = demos.own_tokens(p, rank)
    w13, w2 = (p.w13[:3], p.w2[:3]) if rank == 1 else shard_experts(p.w13, p.w2, rank, world)
    expert_parallel_layer(x, w13, w2, tw, ti, num_experts=4)


def sleep_forever() -> None:
    time.sleep(3600)


TINY = ModelShape("tiny", 4, 2, 32, 16)


def bench_on_cpu(csv_path: str) -> list[dict]:
    """The GPU script's stages on a tiny shape in fp32, one repetition each, and a deadline already past."""
    cases = (("uneven", 5, 3, False), ("rank 1 receives nothing", 4, 4, True), ("rank 0 owns no tokens", 0, 3, False))
    far = time.time() + 120
    rows = bench.link_and_check_rank([TINY], csv_path, far, far, None, (1 << 10, 1 << 14), torch.float32, cases)
    rows += bench.timing_rank(TINY, csv_path, far, (1, 4), None, torch.float32, reps=1, warmup=0)
    rows += bench.timing_rank(TINY, None, 0.0, (8,), None, torch.float32, reps=1, warmup=0)
    return rows


# --------------------------------------------------------------------------------------
# The layers against the single-process layer
# --------------------------------------------------------------------------------------

def _expected_counts(ids_by_rank, per: int, world: int) -> torch.Tensor:
    return torch.stack([torch.bincount(ids.reshape(-1).long() // per, minlength=world) for ids in ids_by_rank])


def _check_cases(cases, world: int, outs) -> None:
    for case, by_rank in zip(cases, zip(*outs)):
        case = {k: v for k, v in case.items() if k != "int64_ids"}
        p = demos.make_problem(**case)
        ref = reference_moe_layer(p.x, p.w13, p.w2, p.topk_weights, p.topk_ids)
        single = mt.moe_layer(p.x, p.w13, p.w2, p.topk_weights, p.topk_ids)
        what = f"{case} on {world} ranks"
        ep = torch.cat([r["ep"] for r in by_rank])
        assert ep.shape == ref.shape, what
        if ref.numel():
            assert rel_error(ep, ref) <= 1e-5, what
            assert rel_error(ep, single) <= 1e-5, what
            assert rel_error(torch.cat([r["steps"] for r in by_rank]), ref) <= 1e-5, what
            for r in by_rank:
                assert rel_error(r["tp"], ref) <= 1e-5, what
        per = case["num_experts"] // world
        ids_by_rank = [demos.own_tokens(p, r)[2] for r in range(world)]
        counts = _expected_counts(ids_by_rank, per, world)
        for rank, r in enumerate(by_rank):
            assert torch.equal(r["counts"], counts), what                    # every rank knows the whole table
            expected_local = torch.cat([ids[(ids // per) == rank] - rank * per for ids in ids_by_rank])
            assert sorted(r["received"].tolist()) == sorted(expected_local.tolist()), what


CASES_2 = [
    dict(tokens_per_rank=[3, 5], **SMALL, seed=0),
    dict(tokens_per_rank=[4, 4], **SMALL, seed=1, experts_used=[0, 1]),      # rank 1 receives nothing
    dict(tokens_per_rank=[0, 6], **SMALL, seed=2),                           # rank 0 owns no tokens
    dict(tokens_per_rank=[5, 2], **SMALL, seed=3, experts_used=[0, 2, 3]),   # expert 1 gets no pair
    dict(tokens_per_rank=[0, 0], **SMALL, seed=4),                           # nothing at all
    dict(tokens_per_rank=[3, 3], num_experts=2, topk=1, hidden=16, inter=8, seed=5),
    dict(tokens_per_rank=[2, 3], **SMALL, seed=6, int64_ids=True),
] + [  # random sizes, experts and topk, drawn once from a seeded generator
    dict(tokens_per_rank=[int(m) for m in torch.randint(0, 7, (2,), generator=torch.Generator().manual_seed(s))],
         num_experts=e, topk=1 + s % e, hidden=16, inter=8, seed=10 + s)
    for s, e in ((0, 2), (1, 4), (2, 6))
]


def test_two_ranks_match_the_single_process_layer():
    outs = launch(layers_on_every_rank, 2, CASES_2, timeout_s=90)
    _check_cases(CASES_2, 2, outs)


CASES_4 = [
    dict(tokens_per_rank=[2, 0, 3, 1], num_experts=8, topk=2, hidden=16, inter=8, seed=0),
    dict(tokens_per_rank=[2, 2, 2, 2], num_experts=8, topk=2, hidden=16, inter=8, seed=1,
         experts_used=[0, 1, 6, 7]),                                        # ranks 1 and 2 receive nothing
]


def test_four_ranks_match_the_single_process_layer():
    outs = launch(layers_on_every_rank, 4, CASES_4, timeout_s=90)
    _check_cases(CASES_4, 4, outs)


# --------------------------------------------------------------------------------------
# Mistakes: clear errors, the same on every rank
# --------------------------------------------------------------------------------------

def test_mistakes_give_clear_errors_on_every_rank():
    msgs = launch(mistakes_on_every_rank, 2, timeout_s=90)
    for m in msgs:
        assert m["E not divisible"].startswith("ValueError: world size: expected a divisor of the number of "
                                               "experts E=3"), m["E not divisible"]
        assert m["K differs"] == ("ValueError: x.shape[1] (hidden size K): expected the same value on every rank, "
                                  "got 16 on rank 0, 8 on rank 1")
        assert m["topk differs"].startswith("ValueError: topk_ids.shape[1] (topk): expected the same value"), m
        assert m["E differs"].startswith("ValueError: num_experts: expected the same value on every rank, "
                                         "got 4 on rank 0, 8 on rank 1"), m
        # Rank 1's w13 is the right size for E = 4, not for its own E = 8: the error names num_experts.
        assert m["E differs, same weights"] == ("ValueError: num_experts: expected the same value on every rank, "
                                                "got 4 on rank 0, 8 on rank 1"), m["E differs, same weights"]
        assert m["TP batch differs"].startswith("ValueError: x.shape[0] (tokens M; every rank runs the same batch)")
        assert m["TP I not divisible"].startswith("ValueError: world size: expected a divisor of the intermediate "
                                                  "size I=3")
        assert m["id out of range"] == "ValueError: topk_ids: expected expert ids in [0, 4), got an id of 9"
        assert m["combine rows"].startswith("ValueError: expert_out: expected ")
        assert m["still in step"] <= 1e-5


def test_a_rank_failing_alone_is_reported_with_its_rank_and_traceback():
    with pytest.raises(ValueError, match=r"^rank 1: w13: expected this rank's E / world = 2 experts") as info:
        launch(bad_weights_on_rank_1, 2, timeout_s=60)
    assert isinstance(info.value.__cause__, RemoteTraceback)
    assert "check_local_weights" in info.value.__cause__.text


def test_no_process_group_is_a_clear_error():
    p = demos.make_problem([3], **SMALL)
    with pytest.raises(RuntimeError, match="process group: expected torch.distributed to be initialised"):
        expert_parallel_layer(p.x, p.w13, p.w2, p.topk_weights, p.topk_ids, num_experts=4)
    with pytest.raises(RuntimeError, match="process group"):
        tensor_parallel_layer(p.x, p.w13, p.w2, p.topk_weights, p.topk_ids)
    with pytest.raises(RuntimeError, match="process group"):
        dispatch(p.x, p.topk_weights, p.topk_ids, 4)


def test_launcher_arguments():
    with pytest.raises(TypeError, match="fn: expected a function defined at the top level of an importable module"):
        launch(lambda: 1, 2)

    def local():
        return 1

    with pytest.raises(TypeError, match="fn: expected a function defined at the top level"):
        launch(local, 2)
    with pytest.raises(ValueError, match="world_size: expected a positive int, got 0"):
        launch(sleep_forever, 0)
    with pytest.raises(ValueError, match="backend: expected one of gloo, nccl, got 'mpi'"):
        launch(sleep_forever, 1, backend="mpi")


def test_launcher_stops_ranks_that_never_return():
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"ranks \[0\] returned nothing within 4 s"):
        launch(sleep_forever, 1, timeout_s=4)
    assert time.monotonic() - t0 < 15


# --------------------------------------------------------------------------------------
# The GPU bench's code path, on the CPU
# --------------------------------------------------------------------------------------

def test_bench_stages_run_and_write_the_csv(tmp_path):
    path = tmp_path / "ep.csv"
    rows = launch(bench_on_cpu, 2, str(path), timeout_s=120)[0]
    saved = results.load(path)
    assert len(saved) == len(rows) - 1               # the last call wrote no CSV
    checks = [r for r in saved if r["step"].startswith("check")]
    assert {r["case"] for r in checks} == {"uneven", "rank 1 receives nothing", "rank 0 owns no tokens"}
    assert all(r["status"] == "ok" and r["rel_error"] <= 1e-5 for r in checks), checks
    timed = [r for r in saved if r["step"] not in ("check_ep", "check_tp", "check_ep_fp64")]
    for M in (1, 4):
        assert {r["step"] for r in timed if r["M"] == M} == set(bench.STEPS[3:-1])
    assert all(r["status"] == "ok" and r["ms"] > 0 for r in timed)
    # Bytes over the link: dispatch moves rows and metadata, combine rows, the plain all-to-all rows.
    for M in (1, 4):
        by = {r["step"]: r for r in timed if r["M"] == M}
        assert by["dispatch"]["bytes"] == by["a2a_same_bytes"]["bytes"] // (TINY.hidden * 4) * (TINY.hidden * 4 + 8)
        assert by["combine"]["bytes"] == by["a2a_same_bytes"]["bytes"]
    assert [r["status"] for r in rows if r.get("M") == 8] == ["skipped: time budget"]    # the deadline had passed
    latency_us, gbps = results.link_from(saved)
    assert latency_us > 0 and gbps > 0
    assert saved[0]["gpu"].startswith("cpu") and saved[0]["torch"] and saved[0]["date"] and saved[0]["protocol"]
    # Notebook 06 draws these rows once the two-GPU data exists: 3 steps (+ the model line), 3 layers x 3 lines
    # (measured, the model fitted to them, the ideal model).
    machine = results.measured_machine(saved)
    ax = part6.plot_steps_vs_bytes(saved, ["tiny"], machine).axes[0]
    assert len(ax.lines) == 3 + 1
    axes = part6.plot_layer_throughput(saved, ["tiny", "absent"], machine).axes
    assert len(axes[0].lines) == 3 * 3 and len(axes[1].lines) == 0


# --------------------------------------------------------------------------------------
# Pieces that need no processes
# --------------------------------------------------------------------------------------

def test_experts_per_rank_and_shards():
    assert experts_per_rank(256, 8) == 32
    with pytest.raises(ValueError, match=r"world size: expected a divisor of the number of experts E=8 "
                                         r"\(each rank holds E / world experts: \[1, 2, 4, 8\]\), got 3"):
        experts_per_rank(8, 3)
    p = demos.make_problem([4], **SMALL)
    w13, w2 = shard_experts(p.w13, p.w2, 1, 2)
    assert torch.equal(w13, p.w13[2:4]) and torch.equal(w2, p.w2[2:4])
    with pytest.raises(ValueError, match=r"rank: expected an int in \[0, 2\), got 2"):
        shard_experts(p.w13, p.w2, 2, 2)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_tensor_parallel_shards_add_up_to_the_layer(world):
    """Plain torch, one process: the layer on each rank's columns, summed, is the whole layer."""
    p = demos.make_problem([5], num_experts=4, topk=2, hidden=12, inter=8, seed=world)
    parts = [reference_moe_layer(p.x, *shard_intermediate(p.w13, p.w2, r, world), p.topk_weights, p.topk_ids)
             for r in range(world)]
    ref = reference_moe_layer(p.x, p.w13, p.w2, p.topk_weights, p.topk_ids)
    assert rel_error(sum(parts), ref) <= 1e-12
    w13, w2 = shard_intermediate(p.w13, p.w2, 0, world)
    assert w13.shape == (4, 2 * 8 // world, 12) and w2.shape == (4, 12, 8 // world)


def test_send_order_groups_pairs_by_destination_in_token_order():
    ids = torch.tensor([[3, 0], [1, 2], [2, 3]])                 # E = 4 on 2 ranks: experts 0-1 on rank 0
    dest = destinations(ids, 2)
    assert dest.tolist() == [1, 0, 0, 1, 1, 1]
    order, counts = send_order(dest, 2)
    assert order.tolist() == [1, 2, 0, 3, 4, 5] and counts.tolist() == [2, 4]


def test_cost_model_bytes_by_hand():
    s = MODEL_SHAPES["DeepSeek-V3"]
    # 2 GPUs, 1024 tokens per rank: half of the 8192 pairs leave, 7168 bf16 values each (+ 8 bytes in dispatch).
    assert cost.dispatch_bytes(1024, s, 2) == 4096 * (7168 * 2 + 8)
    assert cost.combine_bytes(1024, s, 2) == 4096 * 7168 * 2
    assert cost.allreduce_bytes(1024, s, 2) == 2048 * 7168 * 2          # ring: 2 (w-1)/w of [2048, K]
    assert cost.remote_pairs(10, 2, 1) == 0
    m = cost.Machine(link_gbps=100.0, latency_us=10.0, read_tbps=4.0, matmul_tflops=500.0)
    t = cost.predict(64, s, 2, m)
    assert t["dispatch"] == pytest.approx(3 * 10e-6 + cost.dispatch_bytes(64, s, 2) / 100e9)
    assert t["ep"] == pytest.approx(t["dispatch"] + t["experts"] + t["combine"])
    assert 0 < t["ep_comm_share"] < 1
    # With uniform routing each rank's experts see M * topk pairs: the same FLOPs as TP's share.
    assert cost.ep_compute(64, s, 2)[1] == pytest.approx(cost.tp_compute(64, s, 2)[1])


@pytest.mark.parametrize("truth", [cost.Calibration(5e-4, 6e-4, 1e-4, 0.7), cost.Calibration(1e-3, 0.0, 2e-4, 0.5)])
def test_the_cost_models_fit_recovers_what_made_the_measurements(truth):
    """Measurements made by a calibrated model give back that calibration, and the fitted model
    reproduces every step at every M; the ideal model is faster than all of them."""
    s = MODEL_SHAPES["Mixtral-8x7B"]
    m = cost.Machine(link_gbps=300.0, latency_us=40.0, read_tbps=4.6, matmul_tflops=790.0)
    Ms = (1, 8, 64, 1024, 16384)
    made = {M: cost.predict(M, s, 2, m, calibration=truth) for M in Ms}
    measured = {step: {M: made[M][key] for M in Ms} for step, key in
                (("single_gpu", "single"), ("dispatch", "dispatch"), ("combine", "combine"))}
    fit = cost.calibrate(measured, s, 2, m)
    for field in ("call_s", "dispatch_s", "combine_s", "efficiency"):
        assert getattr(fit, field) == pytest.approx(getattr(truth, field), rel=1e-9, abs=1e-12), field
    for M in Ms:
        again = cost.predict(M, s, 2, m, calibration=fit)
        assert again["ep"] == pytest.approx(made[M]["ep"]) and again["tp"] == pytest.approx(made[M]["tp"])
        assert cost.predict(M, s, 2, m)["ep"] < made[M]["ep"]


@pytest.mark.parametrize("world", [2, 4, 8, 16])
def test_expert_parallel_sends_less_than_an_all_reduce_once_world_exceeds_topk(world):
    """Per rank, EP moves ~2 M topk K bytes and TP's all-reduce ~2 world M K: EP wins when world > topk."""
    for s in MODEL_SHAPES.values():
        ep = cost.dispatch_bytes(256, s, world) + cost.combine_bytes(256, s, world)
        tp = cost.allreduce_bytes(256, s, world)
        if world > s.topk:
            assert ep < tp, (s.name, world)
        elif world < s.topk:
            assert ep > tp, (s.name, world)
        else:
            # At world == topk they move the same rows; dispatch adds each row's id and weight
            # (8 bytes on the hidden * 2 bf16 bytes of each way): EP is exactly 1 + 2 / hidden times TP.
            assert ep == pytest.approx(tp * (1 + 2 / s.hidden), rel=1e-12), (s.name, world)


def test_memory_table():
    s = MODEL_SHAPES["DeepSeek-V3"]
    assert memory.expert_bytes(s) == 58 * 3 * 256 * 2048 * 7168 * 2
    rows = {r["model"]: r for r in memory.memory_table((1, 8))}
    assert set(rows) == set(MODEL_SHAPES)
    assert rows["DeepSeek-V3"][8] == pytest.approx(rows["DeepSeek-V3"]["total_gb"] / 8)
    with pytest.raises(ValueError, match="shape: expected one of"):
        memory.expert_bytes(TINY)


def test_results_loading(tmp_path):
    assert results.load(tmp_path / "missing.csv") is None
    rows = [dict(step="a2a_equal", status="ok", bytes=b, ms=ms, gbps=b / (ms * 1e6))
            for b, ms in ((4096, 0.02), (1 << 20, 0.03), (1 << 28, 0.8))]
    latency, gbps = results.link_from(rows)
    assert latency == pytest.approx(20.0) and gbps == pytest.approx((1 << 28) / 0.8e6)
    with pytest.raises(ValueError, match="rows: expected at least two ok 'a2a_equal' rows, got 0"):
        results.link_from([])
    m = results.measured_machine(rows, read_tbps=4.0, matmul_tflops=600.0)
    assert m.latency_us == pytest.approx(20.0) and math.isclose(m.read_tbps, 4.0)


def test_dispatch_picture_matches_the_count_table():
    p = demos.make_problem([3, 4], **SMALL, seed=3)
    ids = [demos.own_tokens(p, r)[2] for r in range(2)]
    sends, recvs = part6.exchange(ids, 2)
    counts = _expected_counts(ids, 2, 2)
    for r in range(2):
        assert [d for *_, d in sends[r]] == sorted(d for *_, d in sends[r])          # grouped by destination
        assert len(recvs[r]) == int(counts[:, r].sum())
        assert [s for s, _ in recvs[r]] == sorted(s for s, _ in recvs[r])            # rank 0's rows first
    for combine_too in (False, True):
        fig = part6.plot_all_to_all(ids, 2, combine=combine_too)
        arrows = [c for c in fig.axes[0].texts if getattr(c, "arrow_patch", None) is not None]
        assert len(arrows) == (3 + 4) * 2                                            # one per pair
    texts = [t.get_text() for t in part6.plot_counts(counts, row_bytes=64).axes[0].texts]
    assert texts == [f"{int(counts[s, d])}\n{int(counts[s, d]) * 64} B" for s in range(2) for d in range(2)]


def test_memory_and_weight_split_pictures():
    table = memory.memory_table((1, 8))
    ax = part6.plot_memory(table, (1, 8)).axes[0]
    hatched = [bar for bar in ax.patches if bar.get_hatch()]
    # DeepSeek-V3 and Kimi-K2 do not fit one H200 even on 8 GPUs in bf16; every other model fits on one.
    assert len(hatched) == 4 and len(ax.patches) == 2 * len(table)
    ax_ep, ax_tp = part6.plot_weight_split(4, 2, inter_cells=4).axes
    owners = lambda ax: [t.get_text() for t in ax.texts if t.get_text() in ("r0", "r1")]  # noqa: E731
    assert owners(ax_ep) == ["r0"] * 8 + ["r1"] * 8
    assert owners(ax_tp) == ["r0", "r0", "r1", "r1"] * 4


def test_comm_share_picture_has_one_line_per_machine():
    machines = {f"{lat} us": cost.Machine(450.0, lat, 4.27, 672.0) for lat in (0, 30)}
    fig = part6.plot_comm_share([MODEL_SHAPES["Mixtral-8x7B"], MODEL_SHAPES["DeepSeek-V3"]], machines)
    for ax in fig.axes:
        shares = [line.get_ydata() for line in ax.lines]
        assert len(shares) == 2 and all(((0 <= y) & (y <= 1)).all() for y in shares)
        assert (shares[1] >= shares[0]).all()                                    # latency only adds


def test_notebook_06_prose_states_the_numbers_code_gives():
    from prose import assert_says

    nb = "06_expert_parallel"
    mix, ds = (memory.expert_bytes(MODEL_SHAPES[n]) / 1e9 for n in ("Mixtral-8x7B", "DeepSeek-V3"))
    h200 = memory.H200_MEMORY_GB
    assert mix < h200 < ds / 8
    assert_says(nb, "An H200 has {:.0f} GB. Mixtral-8x7B's experts ({:.0f} GB) fit on one", h200, mix)
    assert_says(nb, "take {:.0f} GB in bf16, more than {} H200s hold: even on 8 GPUs each would need {:.0f} GB",
                ds, int(ds // h200), ds / 8)
    assert_says(nb, "take more than {} H200s hold in bf16", int(ds // h200))
    assert_says(nb, "plus {} bytes of expert id and router weight per row", cost.META_BYTES)
    assert_says(nb, "Our dispatch makes {} collectives (the counts, the rows, the ids and weights), combine one",
                cost.DISPATCH_COLLECTIVES)
    assert cost.COMBINE_COLLECTIVES == 1
    assert_says(nb, "paid {} times per layer", cost.DISPATCH_COLLECTIVES + cost.COMBINE_COLLECTIVES)
    assert_says(nb, "NVIDIA specifies {:.0f} GB/s each way for an H200", cost.H200_NVLINK_GBPS)


# --------------------------------------------------------------------------------------
# The fixed-capacity exchange: no host synchronisation, static shapes, no dropped token
# --------------------------------------------------------------------------------------

#: Python's ways of reading a tensor's values on the host; a CUDA graph can hold none of them.
HOST_READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy")


def no_host_reads_on_every_rank(cases: list[dict]) -> list[dict]:
    """The all_gather layer with ``check_ranks=False`` while every host read of a tensor raises.

    Dispatch and combine run with the reads forbidden; the local experts too, except inside
    Triton's interpreter (a CPU stand-in for the GPU, which reads its arguments through numpy).
    Also returns the shapes of what dispatch delivered, to check they depend on no routing.
    """
    from moe_tutorial.parallel.expert_parallel import local_experts

    import triton.runtime.interpreter as interp

    rank, world = require_group()
    out = []
    for case in cases:
        p = demos.make_problem(**case)
        x, tw, ti = demos.own_tokens(p, rank)
        w13, w2 = shard_experts(p.w13, p.w2, rank, world)
        capacity = max(case["tokens_per_rank"])
        forbidden = {name: getattr(torch.Tensor, name) for name in HOST_READS}
        calls = []

        def refuse(name):
            def read(t, *args, **kwargs):
                if interp_depth[0]:                     # the interpreter's own reads of kernel arguments
                    return forbidden[name](t, *args, **kwargs)
                calls.append(name)
                raise AssertionError(f"torch.Tensor.{name} called on the host")
            return read

        interp_depth = [0]
        run = interp.GridExecutor.__call__

        def interpreted(self, *args, **kwargs):
            interp_depth[0] += 1
            try:
                return run(self, *args, **kwargs)
            finally:
                interp_depth[0] -= 1

        for name in HOST_READS:
            setattr(torch.Tensor, name, refuse(name))
        interp.GridExecutor.__call__ = interpreted
        try:
            d = dispatch(x, tw, ti, case["num_experts"], capacity=capacity, check_ranks=False)
            y_steps = combine(local_experts(d, w13, w2), d.plan)
            y = expert_parallel_layer(x, w13, w2, tw, ti, num_experts=case["num_experts"], capacity=capacity,
                                      check_ranks=False)
        finally:
            for name, fn in forbidden.items():
                setattr(torch.Tensor, name, fn)
            interp.GridExecutor.__call__ = run
        out.append({"y": y, "y_steps": y_steps, "calls": calls,
                    "shapes": [tuple(d.x.shape), tuple(d.expert_ids.shape), tuple(d.weights.shape)]})
    return out


def capacity_mistakes_on_every_rank() -> dict:
    """Capacities that would drop a token or that differ between ranks: the same error on every rank."""
    rank, world = require_group()
    p = demos.make_problem([3, 5], **SMALL)
    x, tw, ti = demos.own_tokens(p, rank)
    w13, w2 = shard_experts(p.w13, p.w2, rank, world)

    def layer(**kw):
        return expert_parallel_layer(x, w13, w2, tw, ti, num_experts=4, **kw)

    messages = {
        "too small": _message(lambda: layer(capacity=4)),
        "differs": _message(lambda: layer(capacity=5 + rank)),
        "unchecked without capacity": _message(lambda: layer(check_ranks=False)),
        "unchecked too small": _message(lambda: layer(capacity=2, check_ranks=False)),   # both ranks' M exceed it
        "bad method": _message(lambda: layer(method="broadcast")),
        "negative": _message(lambda: layer(capacity=-1)),
    }
    y = layer(capacity=7)                                    # padding beyond the largest M is fine
    messages["padded"] = rel_error(y, reference_moe_layer(p.x, p.w13, p.w2, p.topk_weights, p.topk_ids)[
        p.starts[rank]:p.starts[rank + 1]])
    return messages


def test_all_gather_reads_nothing_on_the_host_and_has_static_shapes():
    cases = [dict(tokens_per_rank=[4, 4], **SMALL, seed=20),
             dict(tokens_per_rank=[4, 4], **SMALL, seed=21, experts_used=[0, 1]),      # rank 1 receives nothing
             dict(tokens_per_rank=[4, 2], **SMALL, seed=22, experts_used=[0, 2, 3])]   # uneven, expert 1 idle
    outs = launch(no_host_reads_on_every_rank, 2, cases, timeout_s=90)
    for case, by_rank in zip(cases, zip(*outs)):
        p = demos.make_problem(**case)
        ref = reference_moe_layer(p.x, p.w13, p.w2, p.topk_weights, p.topk_ids)
        for r in by_rank:
            assert r["calls"] == [], (case, r["calls"])
            # What arrives is world * capacity rows of K values and topk ids and weights, whatever the routing.
            assert r["shapes"] == [(8, 16), (8, 2), (8, 2)], r["shapes"]
        assert rel_error(torch.cat([r["y"] for r in by_rank]), ref) <= 1e-5, case
        assert rel_error(torch.cat([r["y_steps"] for r in by_rank]), ref) <= 1e-5, case


def test_host_reads_are_caught_by_the_patch():
    """The test above would see a read: the old exchange, run the same way, is caught reading its counts."""
    out = launch(old_exchange_reads_the_host, 2, timeout_s=60)
    assert all(r == "AssertionError: torch.Tensor.tolist called on the host" for r in out), out


def old_exchange_reads_the_host() -> str:
    rank, world = require_group()
    p = demos.make_problem([2, 2], **SMALL)
    x, tw, ti = demos.own_tokens(p, rank)
    forbidden = torch.Tensor.tolist

    def refuse(t, *args, **kwargs):
        raise AssertionError("torch.Tensor.tolist called on the host")

    torch.Tensor.tolist = refuse
    try:
        message = _message_any(lambda: dispatch(x, tw, ti, 4, method="all_to_all"))
    finally:
        torch.Tensor.tolist = forbidden
    dist_barrier()
    return message


def dist_barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


def _message_any(fn) -> str:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def test_capacity_mistakes_give_clear_errors_on_every_rank():
    msgs = launch(capacity_mistakes_on_every_rank, 2, timeout_s=90)
    for m in msgs:
        assert m["too small"] == ("ValueError: capacity: expected at least every rank's number of tokens (rank 1 has 5;"
                                  " a token beyond the capacity would be dropped), got 4"), m["too small"]
        assert m["differs"] == ("ValueError: capacity: expected the same value on every rank, got 5 on rank 0, "
                                "6 on rank 1")
        assert m["unchecked without capacity"].startswith("ValueError: capacity: expected an int"), m
        assert m["bad method"] == "ValueError: method: expected one of all_gather, all_to_all, got 'broadcast'"
        assert m["negative"] == "ValueError: capacity: expected a non-negative int, got -1"
        assert m["padded"] <= 1e-5
    # Unchecked, each rank compares its own M with the capacity before any exchange.
    for rank, m in enumerate((3, 5)):
        assert msgs[rank]["unchecked too small"] == (f"ValueError: capacity: expected at least this rank's {m} tokens "
                                                     "(a token beyond it would be dropped), got 2")


@pytest.mark.parametrize("world", [2, 4])
def test_static_layer_replays_new_routings(world):
    """The GPU tests' graph-replay program on gloo: one set of static inputs, five routings copied in."""
    tokens = [5, 3] if world == 2 else [2, 0, 3, 1]
    E = 4 if world == 2 else 8
    # Four CPU processes are slow on a 2-core runner: there, the three routings that name a case.
    routings = graphs.ROUTINGS if world == 2 else graphs.ROUTINGS[1:4]
    outs = launch(graphs.graph_replay_rank, world, tokens, E, 2, 16, 8, "float32", routings, timeout_s=120)
    assert all(len(o) == len(routings) for o in outs)
    for by_rank in zip(*outs):
        for r in by_rank:
            assert r["ok"] and not r["graphed"], r
            assert r["capacity"] == max(tokens)
    assert [r["M"] for r in (o[0] for o in outs)] == tokens


def exchange_bench_on_cpu(csv_path: str) -> list[dict]:
    from moe_tutorial.parallel import exchange_bench

    far = time.time() + 120
    rows = exchange_bench.timing_rank(TINY, csv_path, far, (1, 3), None, torch.float32, reps=1)
    rows += exchange_bench.timing_rank(TINY, None, 0.0, (2,), None, torch.float32, reps=1)
    return rows


@pytest.mark.parametrize("world", [1, 2])
def test_exchange_bench_runs_every_step_and_writes_the_csv(tmp_path, world):
    """The GPU script's timing program on a tiny shape: every step of both methods, the replay check."""
    from moe_tutorial.parallel import exchange_bench

    path = tmp_path / "graphs.csv"
    rows = launch(exchange_bench_on_cpu, world, str(path), timeout_s=120)[0]
    saved = results.load(path)
    assert len(saved) == len([r for r in rows if r["M"] != 2])
    want = {(m, s) for m in ("all_gather", "all_to_all") for s in exchange_bench.METHOD_STEPS}
    want |= {("", "tp_layer"), ("", "single_gpu"), ("all_gather", "check_graph_replay")}
    for M in (1, 3):
        got = {(r["method"] or "", r["step"]) for r in saved if r["M"] == M}
        assert got == want, sorted(got ^ want)
    bad = [r for r in saved if r["status"] != "ok"]
    assert not bad, bad
    assert all(r["rel_error"] <= 1e-5 for r in saved if r["step"] == "check_graph_replay")
    assert all(r["ms"] > 0 for r in saved if not r["step"].startswith("check"))
    by = {(r["M"], r["method"], r["step"]): r for r in saved}
    # The all-gather moves (world - 1) * M packed rows out and as many rows of K back.
    row_bytes = exchange_bench.packed_layout(TINY.hidden, TINY.topk, torch.float32)[2]
    assert by[(3, "all_gather", "dispatch_combine")]["bytes"] == (world - 1) * 3 * (row_bytes + TINY.hidden * 4)
    assert by[(3, "all_gather", "a2a_x2_same_bytes")]["bytes"] == by[(3, "all_gather", "dispatch_combine")]["bytes"]
    assert by[(3, "all_to_all", "a2a_x2_same_bytes")]["bytes"] == by[(3, "all_to_all", "dispatch_combine")]["bytes"]
    assert saved[0]["world"] == world and saved[0]["gpu"].startswith("cpu") and saved[0]["date"]
    assert {r["status"] for r in rows if r["M"] == 2} == {"skipped: time budget"}
    if world == 2:                                   # the GPU script's summary reads this CSV
        import importlib.util

        script = Path(__file__).resolve().parents[1] / "measurements" / "scripts" / "h200_ep_graphs.py"
        spec = importlib.util.spec_from_file_location("h200_ep_graphs", script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.BACKEND = "gloo"
        module.replay_stage(2, path, time.time() + 90, shapes=[TINY], dtype_name="float32")
        checks = [r for r in results.load(path) if r["step"].startswith("check_") and "rank" in r["step"]]
        assert len(checks) == 3 * 2 * len(graphs.ROUTINGS) and all(r["status"] == "ok" for r in checks), checks
        module.summary(path)


@pytest.mark.parametrize("R,topk", [(5, 2), (40, 2), (24, 4)])       # 80 and 96 pairs: the three-launch alignment
def test_local_moe_layer_skips_other_ranks_slots(R, topk):
    """One process: slots with ids outside [0, E_local) add exactly nothing, whatever their rows held."""
    from moe_tutorial.kernels.topk_sum import local_topk_sum
    from moe_tutorial.parallel import local_moe_layer

    g = torch.Generator().manual_seed(R + topk)
    E, K, inter = 3, 16, 8
    x = torch.randn(R, K, generator=g)
    w13, w2 = torch.randn(E, 2 * inter, K, generator=g) * 0.3, torch.randn(E, K, inter, generator=g) * 0.3
    tw = torch.rand(R, topk, generator=g)
    ids = torch.randint(-4, E + 3, (R, topk), generator=g, dtype=torch.int32)   # about half of them not here
    ids[0] = -1                                                                  # a token with no local slot
    here = (ids >= 0) & (ids < E)
    ref = reference_moe_layer(x, w13, w2, tw * here, torch.where(here, ids, 0))  # weight 0: contributes nothing
    y = local_moe_layer(x, w13, w2, tw, ids)
    assert y.shape == (R, K) and rel_error(y, ref) <= 1e-5
    assert torch.equal(y[0], torch.zeros(K))
    # The sum reads no row of a slot that is not here: NaN there changes nothing.
    rows = torch.randn(R, topk, K, generator=g)
    rows[~here] = float("nan")
    assert torch.allclose(local_topk_sum(rows, ids, E), torch.where(here[..., None], rows, 0).sum(1), atol=1e-5)
    with pytest.raises(ValueError, match=r"ids: expected shape \(5, 2\)"):
        local_topk_sum(rows[:5, :2], ids[:4, :2], E)
