"""The scripts under scripts/, and the GPU session scripts under measurements/scripts/, still fit the
package: the GPU ones run only on a lent GPU, so nothing else would notice when the package they call
changes under them."""
import ast
import importlib.util
import itertools
import sys
import types
from pathlib import Path

import pytest

SCRIPTS = sorted((Path(__file__).resolve().parents[1] / "scripts").glob("*.py")) + sorted(
    (Path(__file__).resolve().parents[1] / "measurements" / "scripts").glob("*.py"))


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_script_imports_and_every_package_name_it_uses_exists(path, capsys):
    """Importing checks the ``from moe_tutorial... import name`` lines; the names a script reaches
    through a module (``timing.cold_l2_ms``) are looked up here, and a script with an argument
    parser must build it (``--help`` exits 0 with a usage line)."""
    spec = importlib.util.spec_from_file_location(f"script_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclasses look their module up there
    try:
        spec.loader.exec_module(module)      # module level only: each script's work is behind __main__
    finally:
        del sys.modules[spec.name]
    entry = getattr(module, "main", None) or getattr(module, "strip", None)
    assert callable(entry), f"{path.name}: expected a main() (or strip()) behind __main__"
    packages = {name: value for name, value in vars(module).items()
                if isinstance(value, types.ModuleType) and value.__name__.startswith("moe_tutorial")}
    missing = [f"{node.value.id}.{node.attr} (line {node.lineno})" for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in packages
               and not hasattr(packages[node.value.id], node.attr)]
    assert not missing, f"{path.name} uses names the package no longer has: {missing}"
    if "argparse" in path.read_text():
        with pytest.raises(SystemExit) as done:
            module.main(["--help"])
        assert done.value.code == 0 and "usage:" in capsys.readouterr().out, path.name


def load_script(name: str):
    """The GPU session script ``measurements/scripts/<name>``, imported as a module (its work stays behind main)."""
    path = next(p for p in SCRIPTS if p.name == name)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dry_run_rows(script: str, tmp_path) -> tuple:
    """``measurements/scripts/<script>`` run with ``--dry-run`` (its output into ``tmp_path``): the
    module and its CSV's rows by form (``{impl: row}``), the CSV named as the script."""
    import csv

    module = load_script(script)
    module.OUT = str(tmp_path)
    assert module.main(["--dry-run"]) == 0
    with open(tmp_path / script.replace(".py", ".csv")) as f:
        return module, {r["impl"]: r for r in csv.DictReader(f)}


def test_limit_experiments_dry_run_writes_the_data_schema(tmp_path):
    """The script behind moe_tutorial/data/h200_limit_experiments.csv, on a toy shape in the interpreter:
    its rows have the shipped file's columns and the experiments the notebook reads."""
    from moe_tutorial.experiments import limits

    module = load_script("h200_limit_experiments.py")
    assert module.main(["--dry-run", "--batches", "1", "--out", str(tmp_path)]) == 0
    rows = limits.load_limits(tmp_path / "limit_experiments.csv")
    shipped = limits.load_limits()
    assert list(rows[0]) == list(shipped[0]) == module.FIELDS
    assert {r["experiment"] for r in rows} == {"first-gemm", "layer"}
    assert all(r["status"] == "ok" for r in rows)
    assert limits.lever_gains(rows, "layer", "base", "sortedact")


def test_gluon_fp8_dry_run_reaches_every_variant(tmp_path, monkeypatch):
    """measurements/scripts/h200_gluon_fp8.py on the CPU: its check builds every Gluon variant's call
    (each fails as unavailable in the interpreter) and checks the ``tl`` layer against float64, so a
    variant whose spec the script cannot unpack fails here, not on the lent GPU."""
    from moe_tutorial.kernels import gluon_fp8_kernel
    from moe_tutorial.kernels.align import align_block_size
    from moe_tutorial.perf.results import read_csv

    import torch

    if gluon_fp8_kernel.UNAVAILABLE is None:
        pytest.skip("the dry run is the CPU's: here Gluon runs")
    module = load_script("h200_gluon_fp8.py")
    monkeypatch.setattr(module, "OUT", str(tmp_path))
    assert module.main(["check", "--dry-run"]) == 1          # the Gluon rows cannot pass without a GPU
    rows = read_csv(tmp_path / "gluon_fp8_check.csv", floats={"rel_error"})
    for variant in [*module.gluon_variants(), *module.per_tensor_variants()]:
        assert any(r["impl"].startswith(f"{variant} (RuntimeError") for r in rows if r["gemm"] == "first"), variant
    tl = [r for r in rows if (r["gemm"], r["impl"]) == ("layer", "tl")]
    assert len(tl) == 1 and tl[0]["ok"] == "True" and tl[0]["rel_error"] < 1e-5
    for variant in [v for v in module.quantiser_variants() if "unfused" not in v]:   # the toy's I = 192: fused only
        assert any(r["impl"].startswith(f"{variant} (RuntimeError") for r in rows if r["gemm"] == "layer"), variant
    # The sweep's two ways to the first GEMM's sorted e4m3 rows, run here (plain Triton kernels).
    case = module.Case(module.TOY, 24, *module.model_weights(module.TOY))
    (a, s), (b, t) = case.quantise_call(16, False)(), case.quantise_call(16, True)()
    n = int(align_block_size(case.ids, 16, module.TOY.num_experts)[2])
    real = align_block_size(case.ids, 16, module.TOY.num_experts)[0][:n] < 24 * module.TOY.topk
    assert torch.equal(a[:n][real].view(torch.uint8), b[:n][real].view(torch.uint8))
    assert torch.equal(s[:, :n][:, real], t[:, :n][:, real])


def test_step_host_split_dry_run(tmp_path, capsys):
    """measurements/scripts/h200_step_host.py, the next GPU session's look at Part 8's short steps,
    on the toy shape in the interpreter: a row per implementation with every phase timed and ours
    profiled, also with the configs' cache cleared and without the id check."""
    from moe_tutorial.perf.results import read_csv

    module = load_script("h200_step_host.py")
    assert module.main(["--dry-run", "--out", str(tmp_path)]) == 0
    assert "torch.profiler over 1 steps" in capsys.readouterr().out
    timed = ("host_forward_ms", "host_backward_ms", "wall_ms", "step_ms", "step_uncached_ms", "step_unchecked_ms")
    rows = read_csv(tmp_path / "h200_step_host.csv", floats=set(timed))
    (ours,) = [r for r in rows if r["impl"] == "ours"]
    assert all(ours[k] > 0 for k in timed)
    assert ours["wall_ms"] >= ours["host_forward_ms"] and ours["syncs_per_step"]


def test_fp8_decode_profile_dry_run(tmp_path, monkeypatch):
    """measurements/scripts/h200_fp8_decode_profile.py (issue 31's decode end) on the toy shape in
    the interpreter: a row for the FP8 layer, one for the decode experiment, one for bf16."""
    from moe_tutorial.perf.results import read_csv

    module = load_script("h200_fp8_decode_profile.py")
    monkeypatch.setattr(module, "OUT", str(tmp_path))
    impls = []
    real = module.mt.moe_layer
    monkeypatch.setattr(module.mt, "moe_layer", lambda *a, **kw: impls.append(kw.get("impl")) or real(*a, **kw))
    assert module.main(["--dry-run"]) == 0
    assert set(impls) == {"sorted"}                       # Part 4's layer, not the default (Part 1's loop)
    rows = read_csv(tmp_path / "h200_fp8_decode_profile.csv", floats={"wall_us"})
    assert [r["impl"] for r in rows] == ["fp8", "fp8-decode", "bf16"] and all(r["wall_us"] > 0 for r in rows)


def test_fp8_decode_dry_run(tmp_path, monkeypatch):
    """measurements/scripts/h200_fp8_decode.py on the toy shape: every call checked against the
    float64 layer, then timed; the rows name the two layers and the decode config asked for."""
    from moe_tutorial.perf.results import read_csv

    module = load_script("h200_fp8_decode.py")
    monkeypatch.setattr(module, "OUT", str(tmp_path))
    assert module.main(["--dry-run"]) == 0
    rows = read_csv(tmp_path / "h200_fp8_decode.csv", floats={"ms", "rel_error"})
    assert {r["impl"] for r in rows} == {"bf16-sorted", "fp8-aligned", "decode-8x16-e4m3"}
    assert {r["M"] for r in rows} == {"1", "2"} or {r["M"] for r in rows} == {1, 2}
    assert all(r["rel_error"] < 1e-5 for r in rows if r["impl"] != "bf16-sorted")


def test_vllm_anchor_reads_only_vllms_kernels_and_its_configs(tmp_path):
    """measurements/scripts/vllm_fp8_anchor.py without vLLM: from a file that imports vLLM it takes the
    ``@triton.jit`` functions alone (they import and run here), refuses a file without the kernel, and
    picks vLLM's tuned entry at the nearest M, or its default rule where no file names the shape."""
    import json

    module = load_script("vllm_fp8_anchor.py")
    src = tmp_path / "fused_moe.py"
    src.write_text("import vllm.envs as envs\nfrom vllm.triton_utils import tl, triton\n\n\n"
                   "@triton.jit\ndef helper(x):\n    return x + 1\n\n\n"
                   "@triton.jit\ndef fused_moe_kernel(x_ptr, N: tl.constexpr = 4):\n"
                   "    tl.store(x_ptr, helper(tl.load(x_ptr)))\n\n\ndef launcher():\n    return envs.X\n")
    kernels = module.load_vllm_kernels(src)
    assert hasattr(kernels, "fused_moe_kernel") and hasattr(kernels, "helper") and not hasattr(kernels, "launcher")
    (tmp_path / "bad.py").write_text("def fused_moe_kernel():\n    pass\n")
    with pytest.raises(ValueError, match="no @triton.jit fused_moe_kernel"):
        module.load_vllm_kernels(tmp_path / "bad.py")
    cfg, where = module.vllm_config(5, 128, 768, str(tmp_path), "NVIDIA_H200")
    assert where == "default" and (cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["num_stages"]) == (16, 64, 3)
    name = "E=128,N=768,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    (tmp_path / name).write_text(json.dumps({"1": {"BLOCK_SIZE_M": 16}, "16": {"BLOCK_SIZE_M": 64}}))
    assert module.vllm_config(10, 128, 768, str(tmp_path), "NVIDIA_H200") == ({"BLOCK_SIZE_M": 64}, name)
    assert module.vllm_config(5, 128, 768, str(tmp_path), "NVIDIA_H200")[0] == {"BLOCK_SIZE_M": 16}


def test_small_m_sweep_changes_one_thing_per_candidate():
    """measurements/scripts/fp8_small_m_sweep.py: the heuristic first; each neighbour differs from it
    where its name says; gate/up tiles stay 128 wide (whole quantisation groups); the down GEMM keeps
    the layer's row blocks; vLLM's rule is the anchor script's default, in our terms."""
    from dataclasses import asdict

    from moe_tutorial.kernels.configs import fp8_heuristic_config
    from moe_tutorial.perf.tuning import problem_dims
    from moe_tutorial.shapes import MODEL_SHAPES

    module = load_script("fp8_small_m_sweep.py")
    fields = {"n64": {"block_n"}, "n128": {"block_n"}, "s3": {"num_stages"}, "s4": {"num_stages"},
              "swap": {"swap_ab"}, "noswap": {"swap_ab"}, "g1": {"group_m"}, "m16": {"block_m"},
              "n128-w4": {"block_n", "num_warps"}, "n256-w8": {"block_n", "num_warps"}}
    seen = set()
    for M, model, variant in itertools.product((1, 8, 64, 256, 1024, 2048), ("DeepSeek-V3", "Qwen3-30B-A3B"),
                                               ("plain", "gated", "down")):
        shape = MODEL_SHAPES[model]
        cands = module.candidates(shape, M, variant)
        N, K = problem_dims(shape, variant)
        h = fp8_heuristic_config(M, shape.topk, shape.num_experts, variant, N=N, K=K, kernel="tl")
        assert list(cands)[0] == "heuristic" and cands["heuristic"] == h
        assert len(set(cands.values())) == len(cands)
        seen |= set(cands)
        for name, c in cands.items():
            changed = {f for f, v in asdict(c).items() if v != asdict(h)[f]}
            if name in fields:
                assert changed == fields[name], (M, model, variant, name)
            if name == "before":
                assert (c.block_n, c.num_stages) == (128, 4) and changed <= {"block_n", "num_stages"}
            if variant == "gated":
                assert c.block_n == 128
            if variant == "down" and name != "m16":
                assert c.block_m == h.block_m
        vllm, _ = module.vllm_config(M, shape.num_experts, shape.intermediate, None, "")
        rule = module.vllm_rule(M, shape.num_experts, shape.intermediate, variant == "gated")
        assert (rule.block_m, rule.block_k, rule.group_m, rule.num_warps, rule.num_stages) == (
            vllm["BLOCK_SIZE_M"], vllm["BLOCK_SIZE_K"], vllm["GROUP_SIZE_M"], vllm["num_warps"], vllm["num_stages"])
        assert rule.block_n == (128 if variant == "gated" else vllm["BLOCK_SIZE_N"])
        assert rule.swap_ab == (rule.block_m < 64) and rule.use_tma
    assert {"n128-w4", "n256-w8"} <= seen       # the two widths from 64 rows an expert, each beside the other


def test_fp8_grouped_anchor_dry_run_writes_one_row_per_implementation(tmp_path):
    """measurements/scripts/fp8_grouped_anchor.py on the toy shape in the interpreter: a row for each
    implementation in order, each judged in its own precision; the kernels that run here agree with
    float64, and those that need a Hopper GPU say so in their row instead of a time."""

    from moe_tutorial import runtime
    from moe_tutorial.perf import impls

    module, rows = dry_run_rows("fp8_grouped_anchor.py", tmp_path)
    assert list(rows) == list(module.PRECISION)
    assert {n: r["precision"] for n, r in rows.items()} == module.PRECISION
    for name in ("fp8", "sorted"):
        assert rows[name]["status"] == "ok" and float(rows[name]["rel_error"]) < 1e-2, rows[name]
    if not runtime.ON_GPU:
        assert rows["cutlass-fp8"]["status"] == f"skipped: Skip: {impls.scaled_grouped_mm_support()}"
        assert rows["cutlass-fp8"]["ms"] == "" and "tl kernel" in rows["fp8-gemm"]["status"]


def test_tma_store_layer_dry_run_writes_one_row_per_form(tmp_path):
    """measurements/scripts/tma_store_layer.py on the toy shape in the interpreter: a row for each form
    in order; the layers that run here agree with float64, and the TMA forms (the Gluon kernel's) say
    why they did not run. Then tma_store_table.py gathers the run into the data file's columns."""

    from moe_tutorial import runtime
    module, rows = dry_run_rows("tma_store_layer.py", tmp_path)
    assert list(rows) == list(module.FORMS)
    if not runtime.ON_GPU:
        assert "Hopper" in rows["gluon-bf16-tma"]["status"]
    assert rows["gluon-bf16-tma"]["down"] == "gluon-128x256-w8-s3-tma_store"
    for name in ("fp8", "sorted"):
        assert rows[name]["status"] == "ok" and float(rows[name]["rel_error"]) < 5e-2, rows[name]
    if not runtime.ON_GPU:
        assert all("tl kernel" in rows[n]["status"] for n in ("fp8-tma-up", "fp8-tma-down", "fp8-tma"))
        assert rows["fp8"]["ms"] == "nan" and rows["fp8"]["up"].startswith("tl-")     # no timer on a CPU
    table = load_script("tma_store_table.py")
    assert table.main([str(tmp_path / "tma_store_layer.csv"), "--into", str(tmp_path / "data.csv")]) == 0
    from moe_tutorial.experiments import gluon_fp8
    kept = gluon_fp8.load_tma_store(tmp_path / "data.csv")
    assert [r["impl"] for r in kept] == [n for n in module.FORMS if n in gluon_fp8.TMA_FORMS
                                         and rows[n]["status"] == "ok"] == ["fp8", "sorted"]
    assert gluon_fp8.tma_store_gains(kept) == []           # no TMA form ran here: no case to compare


def test_gather_layer_dry_run_runs_both_forms_and_compares_their_bits(tmp_path):
    """measurements/scripts/gather_layer.py on the toy shape in the interpreter: a row for each form, the
    FP8 forms (the same launches here: the toy's tiles are not the rescaled split form) bit for bit the
    same and against float64, and ``GATHER_A`` and ``GATHER_WARPS`` as they were after the run. Then
    gather_table.py gathers the run into the data file's columns."""

    from moe_tutorial.kernels import gluon_fp8_kernel
    module, rows = dry_run_rows("gather_layer.py", tmp_path)
    assert list(rows) == ["fp8", "fp8-gather", "fp8-gather-1w", "sorted"]
    assert all(r["status"] == "ok" and float(r["rel_error"]) < 5e-2 for r in rows.values()), rows
    assert {rows[n]["same_bits"] for n in ("fp8", "fp8-gather", "fp8-gather-1w")} == {"True"}
    assert gluon_fp8_kernel.GATHER_A is None and gluon_fp8_kernel.GATHER_WARPS == 4
    # gather_table.py gathers the run; the toy's gate/up form is not the split one: no case to compare.
    table = load_script("gather_table.py")
    assert table.main([str(tmp_path / "gather_layer.csv"), "--into", str(tmp_path / "data.csv")]) == 0
    from moe_tutorial.experiments import gluon_fp8
    kept = gluon_fp8.load_gather(tmp_path / "data.csv")
    assert [r["impl"] for r in kept] == list(gluon_fp8.GATHER_FORMS)
    assert gluon_fp8.gather_gains(kept) == []


def test_tile_height_layer_dry_run_writes_one_row_per_form_with_its_tile_counts(tmp_path):
    """measurements/scripts/tile_height_layer.py on the toy shape in the interpreter: a row for each form
    in order, the layers that run here against float64, the Gluon pairs saying why they did not run,
    and the tile counts of the routings (8 experts, 3 tokens, top-2: 6 pairs, at most 6 tiles)."""
    import csv

    from moe_tutorial import runtime
    module, rows = dry_run_rows("tile_height_layer.py", tmp_path)
    assert list(rows) == ["fp8", "fp8-64", "fp8-128", "sorted"]
    for name in ("fp8", "sorted"):
        assert rows[name]["status"] == "ok" and float(rows[name]["rel_error"]) < 5e-2, rows[name]
    if not runtime.ON_GPU:
        assert all("Hopper" in rows[n]["status"] for n in ("fp8-64", "fp8-128"))
    row = rows["fp8"]
    assert 1 <= float(row["tiles128"]) == float(row["tiles64"]) <= 6       # under 64 rows an expert: one tile each
    assert float(row["rows"]) == 3 * 2 / 8
    # tile_height_table.py gathers the run, and renames a half_skip_layer.csv's forms that ran the
    # committed kernel (its skip forms, not kept, are left out)
    from moe_tutorial.experiments import gluon_fp8
    from moe_tutorial.kernels import configs
    skip_run = tmp_path / "call-k" / "k" / "Kimi-K2-4096" / "half_skip_layer.csv"
    skip_run.parent.mkdir(parents=True)
    with open(tmp_path / "tile_height_layer.csv") as f:
        ran = [r for r in csv.DictReader(f) if r["status"] == "ok"]
    with open(skip_run, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[k for k in ran[0] if k != "rows"])
        writer.writeheader()
        up = str(configs.GLUON_FUSED_UP)                                # the dispatched layer ran the 64-row pair
        for impl, ms in (("fp8", 8.4), ("fp8-no-skip", 8.5), ("fp8-rescaled", 7.4), ("fp8-rescaled-no-skip", 7.45),
                         ("sorted", 12.8)):
            writer.writerow({k: v for k, v in ran[0].items() if k != "rows"} | dict(model="Kimi-K2", M=4096, impl=impl,
                                                                                 ms=ms, noise=0.01, up=up))
    table = load_script("tile_height_table.py")
    assert table.main([str(tmp_path / "tile_height_layer.csv"), str(skip_run), "--into", str(tmp_path / "d.csv")]) == 0
    kept = gluon_fp8.load_tile_height(tmp_path / "d.csv")
    assert [r["impl"] for r in kept] == [n for n in rows if rows[n]["status"] == "ok"] + ["fp8-64", "fp8-128", "sorted"]
    assert [r["ms"] for r in kept[-3:]] == [8.5, 7.45, 12.8] and kept[-1]["rows"] == 4096 * 8 / 384
    assert kept[-1]["source"] == "call-k/k/Kimi-K2-4096"
    (gain,) = gluon_fp8.tile_height_gains(kept)                # the toy run has no 128-row form: one case
    assert gain["model"] == "Kimi-K2" and gain["gain"] == pytest.approx(8.5 / 7.45)


def test_ncu_source_stalls_sorts_each_instructions_samples_into_its_kind(tmp_path):
    """measurements/scripts/ncu_source_stalls.py on a made-up source page of one launch: the spare warps'
    NOP, the load warp's and the MMA warps' mbarrier waits (told apart by the TMA loads near them), the
    MMA wait and issue, a multiply, one waiting on a global read, and the rest, each counted where it
    belongs; a try-wait it cannot tell apart, and a launch without samples, are refused."""
    import csv

    module = load_script("ncu_source_stalls.py")
    code = [("BAR.SYNC.DEFER_BLOCKING 0x1", 0, 0), ("NOP", 40, 0), ("USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0x78", 0, 0),
            ("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R4+UR33+0x100], R3", 6, 0), ("@!P0  BRA 0x90", 4, 0),
            ("UTMALDG.2D [UR8], [UR14]", 0, 0)] + [("IADD3 R1, R1, 0x1, RZ", 0, 0)] * 70 + [
            ("SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [R2+UR33+0xe0], R3", 10, 0), ("@!P1  BRA 0x400", 5, 0),
            ("@!P1  BRA 0x500", 2, 0),                       # a second branch: not the try-wait's retry
            ("WARPGROUP.DEPBAR.LE gsb0, 0x0", 7, 0), ("QGMMA.64x128x32.F32.E4M3.E4M3 R24, gdesc[UR20], R24", 3, 0),
            ("FMUL R18, R92, R17", 14, 1), ("FMUL R13, R21, R14", 6, 4), ("ISETP.GE.AND P0, PT, R17, UR18, PT", 3, 0)]

    def page(rows):
        path = tmp_path / "source.csv"
        with open(path, "w", newline="") as f:
            f.write('"Kernel Name","gluon_fp8_moe_kernel",\n')
            w = csv.writer(f, quoting=csv.QUOTE_ALL)
            w.writerow(["Address", "Source", module.SAMPLES, module.LONG_SCOREBOARD])
            for i, (src, samples, long_sb) in enumerate(rows):
                w.writerow([hex(16 * i), src, samples, long_sb])
        return path

    path = page(code)
    (launch,) = module.kernels(path.read_text())
    assert {k: round(v * 100) for k, v in module.shares(launch).items()} == {
        "idle": 40, "fmul": 14, "global wait": 6, "data wait": 15, "slot wait": 10, "mma wait": 7, "mma issue": 3,
        "other": 5}
    gathering = [(src.replace("UTMALDG.2D [UR8], [UR14]", "LDGSTS.E.BYPASS.128 desc[UR44][R10.64], P6, [R45]"), *n)
                 for src, *n in code]          # load warps that copy rows by index (cp.async)
    assert module.shares(module.kernels(page(gathering).read_text())[0]) == module.shares(launch)
    assert module.shares(module.kernels(page(code[6:]).read_text())[0])["slot wait"] == 0   # no copies near
    path = page(code)
    out = tmp_path / "stalls.csv"
    out.touch()
    assert module.main([str(path), "--gemms", "down", "--model", "toy", "--M", "1", "--date", "2026-12-07",
                        "--into", str(out)]) == 0
    with open(out) as f:
        assert [r["kind"] for r in csv.DictReader(f)] == list(module.KINDS)
    with pytest.raises(SystemExit):
        module.main([str(path), "--gemms", "up", "down", "--model", "toy", "--M", "1", "--date", "2026-12-07"])
    with pytest.raises(ValueError, match="no offset"):
        module.shares(module.kernels(page([("SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R4], R3", 1, 0)]).read_text())[0])
    with pytest.raises(ValueError, match="no stall samples"):
        module.shares(module.kernels(page([("NOP", 0, 0)]).read_text())[0])
