"""The tuner: its configuration space, the JSON table it writes, and that the package then uses it."""
import itertools
import json
import random

from moe_tutorial import runtime
from moe_tutorial.kernels import configs
from moe_tutorial.kernels.configs import (
    KernelConfig,
    get_config,
    heuristic_config,
    problem_key,
)
from moe_tutorial.perf import tuning
from moe_tutorial.shapes import MODEL_SHAPES, ModelShape

import pytest
import torch

TINY = ModelShape("custom", num_experts=8, topk=2, hidden=64, intermediate=32)


def _random_problems(n=40, seed=0):
    rng = random.Random(seed)
    shapes = list(MODEL_SHAPES.values())
    for _ in range(n):
        s = rng.choice(shapes)
        variant = rng.choice(tuning.VARIANTS)
        N, K = tuning.problem_dims(s, variant)
        yield s, variant, rng.choice([1, 3, 8, 64, 200, 1024, 4096, 16384]), N, K


@pytest.mark.parametrize("s, variant, M, N, K", list(_random_problems()))
def test_space_respects_shared_memory_registers_and_m(s, variant, M, N, K):
    gated = variant == "gated"
    space = tuning.config_space(M, s.num_experts, N, K, s.topk, gated=gated, tma=True)
    assert space, "every problem has something to try"
    assert len(set(space)) == len(space)
    rpe = tuning.rows_per_expert(M, s.num_experts, s.topk)
    halves = 2 if gated else 1
    for c in space:
        assert c.block_k >= 16 and c.block_k in (64, 128, 256)     # tl.dot needs a K tile >= 16
        assert 32 <= c.block_n <= 256 and 16 <= c.block_m <= 128
        assert c.num_warps in (4, 8) and 2 <= c.num_stages <= 5
        assert c.num_stages * (c.block_m * c.block_k + halves * c.block_n * c.block_k) * 2 <= 227 * 1024
        assert c.block_m * c.block_n * halves / (32 * c.num_warps) <= tuning.MAX_ACC_PER_THREAD
        # BLOCK_M follows the rows each expert gets: no 128-row tiles for a handful of rows.
        assert c.block_m <= max(16, 8 * rpe)
        # ... and no tiles far shorter: at least a quarter of those rows (up to 128), so that at prefill an
        # expert's weights are not read once per 16 rows.
        assert c.block_m >= min(rpe, 128) / 4 - 1, (c.block_m, rpe)
    if rpe <= 4:
        assert {c.block_m for c in space} == {16}


def test_space_grows_block_m_with_m():
    s = MODEL_SHAPES["Qwen3-30B-A3B"]
    N, K = tuning.problem_dims(s, "plain")
    small = {c.block_m for c in tuning.config_space(1, s.num_experts, N, K, s.topk)}
    large = {c.block_m for c in tuning.config_space(16384, s.num_experts, N, K, s.topk)}
    assert small == {16} and 128 in large and 16 not in large
    # Mixtral at M = 64: 16 rows per expert on average, uneven: tiles up to 64 rows are tried.
    assert tuning.block_m_range(64, 8, 2) == [16, 32, 64]


def test_space_offers_tma_only_when_asked():
    s = MODEL_SHAPES["Mixtral-8x7B"]
    N, K = tuning.problem_dims(s, "plain")
    assert not any(c.use_tma for c in tuning.config_space(64, 8, N, K, 2))
    assert any(c.use_tma for c in tuning.config_space(64, 8, N, K, 2, tma=True))


def test_problem_dims_match_the_kernel_call_sites():
    s = MODEL_SHAPES["DeepSeek-V3"]
    assert tuning.problem_dims(s, "plain") == (4096, 7168)
    assert tuning.problem_dims(s, "gated") == (2048, 7168)
    assert tuning.problem_dims(s, "down") == (7168, 2048)
    with pytest.raises(ValueError, match="variant"):
        tuning.problem_dims(s, "up")


def test_stage_one_tries_each_tile_once_heuristic_first():
    s = MODEL_SHAPES["Mixtral-8x7B"]
    N, K = tuning.problem_dims(s, "plain")
    for M in (1, 64, 4096):
        space = tuning.config_space(M, 8, N, K, 2)
        h = heuristic_config(M, 2, 8, "plain")
        tiles = tuning.tile_candidates(space, h)
        keys = [(c.block_m, c.block_n, c.block_k) for c in tiles]
        assert len(keys) == len(set(keys)) == len({(c.block_m, c.block_n, c.block_k) for c in space})
        if (h.block_m, h.block_n, h.block_k) in keys:
            assert keys[0] == (h.block_m, h.block_n, h.block_k)
        best = tiles[-1]
        refined = tuning.refinements(space, best)
        assert best not in refined
        assert all((c.block_m, c.block_n, c.block_k) == keys[-1] for c in refined)


def _result(variant, M, config, key=None):
    return tuning.TuneResult(variant, M, key or problem_key(8, 64, 64, 2, torch.float32, variant),
                             heuristic_config(M, 2, 8), 2.0, config, 1.0, 5, 1)


def test_tables_merge_without_losing_entries(tmp_path):
    path = tmp_path / "t.json"
    assert tuning.read_table(path) == {}
    a = KernelConfig(block_m=32, block_n=64, block_k=64, group_m=1, num_warps=4, num_stages=3)
    b = KernelConfig(block_m=64, block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=4)
    tuning.save_results([_result("plain", 1, a), _result("plain", 64, a)], path, gpu="GPU A")
    tuning.save_results([_result("plain", 64, b), _result("down", 64, b)], path, gpu="GPU A")
    tuning.save_results([_result("plain", 1, b)], path, gpu="GPU B")
    table = json.loads(path.read_text())
    key = problem_key(8, 64, 64, 2, torch.float32, "plain")
    assert table["GPU A"][key] == {"1": a.as_dict(), "64": b.as_dict()}      # 64 overwritten, 1 kept
    assert table["GPU A"][problem_key(8, 64, 64, 2, torch.float32, "down")] == {"64": b.as_dict()}
    assert table["GPU B"][key] == {"1": b.as_dict()}
    assert not list(tmp_path.glob("*.tmp"))
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        tuning.read_table(path)


@pytest.fixture
def pretend_gpu(monkeypatch, tmp_path):
    """A runtime where get_config consults the tables (as on a GPU) for a GPU named 'Fake H200'."""
    monkeypatch.setenv("MOE_TUTORIAL_CONFIG_DIR", str(tmp_path))
    monkeypatch.setattr(runtime, "INTERPRETED", False)
    monkeypatch.setattr(configs, "gpu_name", lambda: "Fake H200")
    return tmp_path


def test_get_config_picks_the_written_table(pretend_gpu):
    s = MODEL_SHAPES["Qwen3-30B-A3B"]
    N, K = tuning.problem_dims(s, "gated")
    key = problem_key(s.num_experts, N, K, s.topk, torch.bfloat16, "gated")
    small = KernelConfig(block_m=16, block_n=32, block_k=256, group_m=1, num_warps=4, num_stages=5)
    large = KernelConfig(block_m=128, block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=3)
    assert get_config(64, s.num_experts, N, K, s.topk, torch.bfloat16, "gated") == \
        heuristic_config(64, s.topk, s.num_experts, "gated")
    path = tuning.save_results([_result("gated", 1, small, key), _result("gated", 4096, large, key)])
    assert path == configs.user_table_path()
    assert get_config(2, s.num_experts, N, K, s.topk, torch.bfloat16, "gated") == small
    assert get_config(8192, s.num_experts, N, K, s.topk, torch.bfloat16, "gated") == large
    # Another dtype or variant is another problem: untouched.
    assert get_config(2, s.num_experts, N, K, s.topk, torch.float16, "gated") == \
        heuristic_config(2, s.topk, s.num_experts, "gated")


def test_training_configs_are_cached_and_see_a_table_written_later(pretend_gpu):
    from moe_tutorial.kernels.training_configs import VARIANTS, training_configs
    s = MODEL_SHAPES["Qwen3-30B-A3B"]
    problem = (4096, s.num_experts, s.hidden, s.intermediate, s.topk, torch.bfloat16)
    first = training_configs(*problem)
    assert training_configs(*problem) is first           # one lookup per problem, not one per step
    tile = KernelConfig(block_m=128, block_n=64, block_k=32, group_m=4, num_warps=4, num_stages=2, use_tma=True,
                        short_tails=False)
    assert first.up != tile
    key = problem_key(s.num_experts, s.intermediate, s.hidden, s.topk, torch.bfloat16, VARIANTS["up"])
    tuning.save_results([_result("train_up", 4096, tile, key)])
    again = training_configs(*problem)
    assert again.up == tile and again.dact == first.dact


@pytest.mark.skipif(runtime.ON_GPU, reason="the refusal is for the CPU")
def test_tune_refuses_on_the_cpu(tmp_path):
    with pytest.raises(tuning.TuneRefused, match="nothing to tune"):
        tuning.tune(TINY, [1], out=tmp_path / "t.json")
    assert not (tmp_path / "t.json").exists()


@pytest.mark.skipif(runtime.ON_GPU, reason="exercises the search in the interpreter")
def test_search_keeps_only_correct_candidates_and_saves_the_fastest(pretend_gpu, monkeypatch):
    """The whole search in the interpreter, with a fake clock: later candidates are 'faster'."""
    counter = itertools.count()
    fake_ms = lambda fn: 10.0 / (1 + next(counter))          # noqa: E731
    # tried in stage 2 around the 16x32x64 tile
    rejected = KernelConfig(block_m=16, block_n=32, block_k=64, group_m=1, num_warps=8, num_stages=2)
    real_run = tuning._Problem.run_checked

    def run_checked(self, config):
        out = real_run(self, config)
        return out * 2 if config == rejected else out            # a candidate with wrong results
    monkeypatch.setattr(tuning._Problem, "run_checked", run_checked)
    monkeypatch.setattr(runtime, "INTERPRETED", True)          # the kernels do run in the interpreter
    logs = []
    out = pretend_gpu / "tuned.json"
    results = tuning.tune(TINY, [4], ["plain", "gated", "down"], torch.float32, out=out, max_minutes=2,
                          measure=fake_ms, allow_cpu=True, log=logs.append)
    assert [r.variant for r in results] == ["plain", "gated", "down"]
    for r in results:
        assert r.best_ms <= r.heuristic_ms and r.gain >= 1
        assert r.best != rejected and r.tried >= 2
    assert any("rejected" in line and "differs" in line for line in logs)
    table = json.loads(out.read_text())["Fake H200"]
    for r in results:
        assert table[r.key] == {"4": r.best.as_dict()}
    monkeypatch.setattr(runtime, "INTERPRETED", False)         # now look it up as a GPU would
    monkeypatch.setenv("MOE_TUTORIAL_CONFIG_DIR", str(pretend_gpu))
    out.rename(configs.user_table_path())
    N, K = tuning.problem_dims(TINY, "down")
    assert get_config(4, 8, N, K, 2, torch.float32, "down") == results[2].best
    assert "gain" in tuning.results_table(results)


@pytest.mark.skipif(runtime.ON_GPU, reason="exercises the comparison in the interpreter")
def test_compare_configs_checks_each_against_the_first_then_times_them_both_ways(monkeypatch):
    """Named configurations side by side (measurements/scripts/fp8_small_m_sweep.py): a candidate
    that computes something else is not timed (inf), every other one gets two readings."""
    from moe_tutorial.perf import bench

    first = KernelConfig(block_m=16, block_n=32, block_k=32)
    other = KernelConfig(block_m=16, block_n=16, block_k=32)
    wrong = KernelConfig(block_m=16, block_n=32, block_k=64)
    real_run = tuning._Problem.run_checked
    monkeypatch.setattr(tuning._Problem, "run_checked",
                        lambda self, c: real_run(self, c) * (1.5 if c == wrong else 1.0))
    w13, w2 = bench.make_weights(TINY, torch.float32, with_w2=True)
    logs = []
    times = tuning.compare_configs(TINY, "down", 4, torch.float32, {"first": first, "other": other, "wrong": wrong},
                                   w13, w2, max_seconds=5.0, log=logs.append)
    assert list(times) == ["first", "other", "wrong"]
    assert all(len(times[n]) == 2 and all(0 < t < float("inf") for t in times[n]) for n in ("first", "other"))
    assert times["wrong"] == [float("inf")] * 2
    assert any("differs" in line for line in logs)


def test_stage_one_compares_tiles_with_the_heuristics_weight_path():
    """Large M: the heuristic loads weights through TMA, so every stage-1 tile does too
    (where the space offers it); at decode without TMA in the space, none does."""
    s = MODEL_SHAPES["Mixtral-8x7B"]
    N, K = tuning.problem_dims(s, "plain")
    h = heuristic_config(4096, 2, 8, "plain")
    assert h.use_tma
    tiles = tuning.tile_candidates(tuning.config_space(4096, 8, N, K, 2, tma=True), h)
    assert len(tiles) > 3 and all(c.use_tma for c in tiles)
    tiles = tuning.tile_candidates(tuning.config_space(4096, 8, N, K, 2, tma=False), h)
    assert not any(c.use_tma for c in tiles)


@pytest.mark.parametrize("variant", ["plain", "gated", "down"])
def test_heuristic_block_m_is_the_tuned_one(variant):
    """Untuned shapes rely on the heuristic: its BLOCK_M (the choice that sets how often each
    expert's weights are read) is the one the tuner found for every headline model and batch."""
    from moe_tutorial.perf.report import tuned_config
    from moe_tutorial.shapes import BATCH_SIZES, HEADLINE_MODELS

    for model in HEADLINE_MODELS:
        s = MODEL_SHAPES[model]
        for M in BATCH_SIZES:
            h = heuristic_config(M, s.topk, s.num_experts, variant)
            assert h.block_m == tuned_config(model, M, variant).block_m, (model, M)


def test_the_fp8_tuner_offers_the_gluon_kernel_for_the_first_gemm_only():
    """Gluon candidates join the plain GEMM's space where the kernel runs; the layer's GEMMs stay on tl
    (its Gluon form is chosen on the whole layer), and a Gluon tile is its own bucket in stage 1."""
    from moe_tutorial.kernels.configs import GLUON_PLAIN
    plain = tuning.fp8_config_space(4096, 256, 4096, 7168, 8, tma=True, gluon=True)
    gated = tuning.fp8_config_space(4096, 256, 2048, 7168, 8, gated=True, tma=True, gluon=False)
    assert GLUON_PLAIN in plain and not any(c.gluon for c in gated)
    heuristic = next(c for c in plain if not c.gluon and c.block_m == 64)
    picked = tuning.tile_candidates(plain, heuristic)
    assert GLUON_PLAIN in picked and any(not c.gluon and c.block_m == 128 for c in picked)
