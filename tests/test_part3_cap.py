"""part3_cap: the file of the cap experiments, and the one explanation it supports; the script that writes it."""
import moe_tutorial  # noqa: F401,I001  (first: picks the runtime before triton is imported)

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from moe_tutorial import runtime
from moe_tutorial.experiments import part3_cap

SCRIPT = Path(__file__).resolve().parent.parent / "measurements" / "scripts" / "h200_part3_cap.py"
MODELS = {"Mixtral-8x7B": (8, 28672, 4096, 2), "Qwen3-30B-A3B": (128, 1536, 2048, 8)}


def timing(experiment, variant, model, tflops, *, dtype="bfloat16", routing="uniform", M=1024):
    E, N, K, topk = MODELS[model]
    itemsize = 4 if dtype == "float32" else 2
    ms = 2 * M * topk * N * K / tflops / 1e9
    return dict(gpu="NVIDIA H200", experiment=experiment, variant=variant, model=model, E=E, N=N, K=K, topk=topk,
                M=M, dtype=dtype, routing=routing, block_n=128, block_k=32, num_warps=4, ms=ms, tflops=tflops,
                loaded_tbps=tflops * itemsize / 2, rel_error=1e-3)


def ncu_row(metric, value, dtype="bfloat16"):
    E, N, K, topk = MODELS["Mixtral-8x7B"]
    return dict(experiment="ncu", variant=dtype, model="Mixtral-8x7B", E=E, N=N, K=K, topk=topk, M=256,
                dtype=dtype, metric=metric, value=value, note="raw name")


def measured(fp32_over_bf16: float, same_over_uniform: float, ncu=()) -> list[dict]:
    rows = []
    for model, bf16 in (("Mixtral-8x7B", 10.0), ("Qwen3-30B-A3B", 9.8)):
        rows += [timing("dtype", "bfloat16", model, bf16),
                 timing("dtype", "float32", model, bf16 * fp32_over_bf16, dtype="float32"),
                 timing("routing", "uniform", model, bf16),
                 timing("routing", "same experts", model, bf16 * same_over_uniform, routing="same experts")]
    rows += [timing("tile", "64x64, 4 warps", "Mixtral-8x7B", 9.1),
             timing("tile", "128x32, 8 warps", "Mixtral-8x7B", 9.7)]
    return rows + [ncu_row(k, v) for k, v in ncu]


def test_bytes_on_chip_when_fp32_halves_the_rate_and_routing_does_not_matter():
    rows = measured(0.5, 1.02, ncu=[("l1_pct", 40.0), ("l2_pct", 91.0), ("dram_pct", 12.0), ("issue_pct", 35.0)])
    verdict = part3_cap.explain(rows)
    assert verdict.cause == "bytes: on chip"
    assert "busiest: L2" in verdict.text and "0.50 times its bf16 TFLOP/s" in verdict.text
    assert "L2 91%" in verdict.text and "9.1 to 9.7 TFLOP/s" in verdict.text


def test_bytes_from_hbm_when_routing_to_the_same_experts_is_much_faster():
    assert part3_cap.explain(measured(0.52, 2.0), hbm_tbps=20.0).cause == "bytes: HBM"


def test_bytes_faster_than_hbm_come_from_the_caches_whatever_the_routing():
    """10 TB/s of weights cannot come from a 4.5 TB/s HBM: the routing gain is a cache effect."""
    rows = measured(0.5, 1.4, ncu=[("l1_pct", 80.0), ("l2_pct", 93.0), ("dram_pct", 3.5)])
    verdict = part3_cap.explain(rows, hbm_tbps=4.5)
    assert verdict.cause == "bytes: on chip" and "busiest: L2" in verdict.text
    assert "more than HBM can deliver (4.50 TB/s read-only" in verdict.text


def test_instructions_when_fp32_keeps_the_rate():
    rows = measured(0.97, 1.0, ncu=[("issue_pct", 88.0), ("warp_inst", 2.0e9)])
    verdict = part3_cap.explain(rows)
    assert verdict.cause == "instructions"
    assert "issue slots busy 88%" in verdict.text
    # 2e9 warp instructions x 32 lanes over M * topk * N * K = 256 * 2 * 28672 * 4096 weight elements
    assert f"{32 * 2.0e9 / (256 * 2 * 28672 * 4096):.1f} instructions per weight element" in verdict.text


def test_mixed_and_unknown():
    assert part3_cap.explain(measured(0.75, 1.0)).cause == "mixed"
    assert part3_cap.explain([timing("routing", "uniform", "Mixtral-8x7B", 10.0)]).cause == "unknown"


def test_file_round_trip_and_missing_file(tmp_path):
    rows = measured(0.5, 1.0, ncu=[("l2_pct", 90.0)])
    path = part3_cap.write(tmp_path / "cap.csv", rows)
    back = part3_cap.load(path)
    assert part3_cap.explain(back) == part3_cap.explain(rows)
    assert part3_cap.ncu(back) == {"bfloat16": {"l2_pct": 90.0}}
    assert "loaded TB/s" in part3_cap.table(back).splitlines()[0]
    assert part3_cap.load(tmp_path / "absent.csv") is None


def test_notebook_03_shows_the_committed_file_or_says_it_is_missing():
    """With the file committed, the notebook's stored output states its verdict; without, it says so."""
    cells = json.loads((Path(__file__).resolve().parent.parent / "notebooks" / "03_triton_fused_kernel.ipynb")
                       .read_text())["cells"]
    outputs = "\n".join("".join(o.get("text", "")) for c in cells if c["cell_type"] == "code"
                        for o in c.get("outputs", []))
    rows = part3_cap.load()
    if rows is None:
        assert "not committed yet" in outputs
    else:
        assert rows[0]["gpu"] and rows[0]["torch"] and rows[0]["triton"] and rows[0]["date"]
        # The whole verdict, as the notebook's output wraps it (any run of whitespace is one space).
        flat = " ".join(outputs.split())
        assert " ".join(part3_cap.explain(rows).text.split()) in flat


def load_script():
    spec = importlib.util.spec_from_file_location("h200_part3_cap", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module         # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_the_gpu_experiments_change_one_thing_each():
    script = load_script()
    cases = script.cases(dry_run=False)
    dtype = [c for c in cases if c.experiment == "dtype"]
    assert {(c.model, str(c.dtype)) for c in dtype} == {(m, d) for m in MODELS for d in ("torch.bfloat16",
                                                                                          "torch.float32")}
    for model in ("Mixtral-8x7B", "Qwen3-30B-A3B", "DeepSeek-V3"):
        assert {c.routing for c in cases if c.experiment == "routing" and c.model == model} == {"uniform",
                                                                                               "same experts"}
    # Consecutive cases share weights: each (model, dtype) group is contiguous.
    keys = [(c.model, c.dtype) for c in cases]
    assert len({k for k in keys}) == sum(1 for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k)


def test_the_ncu_csv_parser():
    script = load_script()
    text = ('==PROF== Disconnected\n"ID","Kernel Name","lts__throughput.avg.pct_of_peak_sustained_elapsed",'
            '"smsp__inst_executed.sum"\n"","","%","inst"\n"0","fused_moe_kernel","91.5","1,234,567"\n')
    assert script.parse_raw_csv(text) == {"ID": 0.0, "lts__throughput.avg.pct_of_peak_sustained_elapsed": 91.5,
                                          "smsp__inst_executed.sum": 1234567.0}


@pytest.mark.skipif(not runtime.INTERPRETED, reason="the dry run is the interpreter's toy")
def test_the_script_dry_run_writes_a_file_the_module_reads(tmp_path):
    script = load_script()
    assert script.main(["--dry-run", "--out", str(tmp_path)]) == 0
    rows = part3_cap.load(tmp_path / "h200_part3_cap.csv")
    assert [r["experiment"] for r in rows] == ["dtype", "routing", "tile"]
    assert all(r["tflops"] > 0 and r["rel_error"] < 1e-5 for r in rows)
    assert rows[0]["gpu"].startswith("cpu") and rows[0]["date"]
