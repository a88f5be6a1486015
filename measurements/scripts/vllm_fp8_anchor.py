"""vLLM's block-FP8 Triton MoE kernel beside Part 7's first GEMM: one process, one timer, one flush.

    python3 measurements/scripts/vllm_fp8_anchor.py --vllm-file PATH/fused_moe.py \\
        [--vllm-configs PATH/configs] [--vllm-device NVIDIA_H200] [--table-of "NVIDIA H200"] \\
        [--models DeepSeek-V3 Qwen3-30B-A3B Kimi-K2] [--M 1 8 64 256 1024 4096 16384]

Issue 31 asks Part 7's first GEMM for 1.15x vLLM's FP8 path (geomean over M) and never less than
1x. vLLM is no dependency of this repository and none of its code is in it: the script reads
vLLM's ``vllm/model_executor/layers/fused_moe/fused_moe.py`` from the path given (a file from a
vLLM wheel or checkout, carried to the GPU beside the repository), takes its ``@triton.jit``
functions out of it and launches ``fused_moe_kernel`` the way vLLM's launcher does for block FP8
(128 x 128 weight blocks, per-token activation groups of 128): operands swapped for row blocks
under 64 on Hopper, weights through a TMA descriptor where the shapes allow, the config from
vLLM's JSON for this expert shape and device (``--vllm-configs``, ``--vllm-device``), else its
default rule for block FP8. What vLLM does in CUDA ops stands in from this package: the
alignment (``align_block_size``, the same sorted ids, expert ids and padded count as vLLM's
``moe_align_block_size``) and the activations' quantisation (done once, outside the timing, for
both kernels).

Both first GEMMs are checked against float64 on the dequantised inputs, then timed (cold-l2: L2
flushed before each call, one call per CUDA graph replay, the bench's timer), in one order and
then the reverse, keeping the faster. Rows go to ``$OUT/vllm_fp8_anchor.csv`` with the run's
ceilings, the FP8 floor, the config vLLM ran and ``vllm_over_ours`` (vLLM's time over ours);
``vllm_file`` is the file's folder and name (keep vLLM's version in the folder's name).
``--table-of`` runs another GPU's tuned table for ours (see ``h200_fp8_decode.py``).
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import inspect
import json
import os
import sys
import tempfile
from pathlib import Path

import moe_tutorial as mt  # noqa: F401  (first: picks the runtime)
from moe_tutorial import runtime
from moe_tutorial.kernels import configs
from moe_tutorial.kernels.align import align_block_size
from moe_tutorial.kernels.fp8_quant import quantize_rows
from moe_tutorial.perf import bench, impls
from moe_tutorial.perf.ceilings import measure_ceilings
from moe_tutorial.perf.results import write_csv
from moe_tutorial.perf.timing import machine_info, time_both_orders
from moe_tutorial.perf.traffic import geomean
from moe_tutorial.reference import rel_error
from moe_tutorial.shapes import MODEL_SHAPES, ModelShape

import torch
import triton
import triton.language as tl

OUT = os.environ.get("OUT", ".")
TOY = ModelShape("toy-K256-I128", 8, 2, 256, 128)
#: vLLM's block size for FP8 weights (block_shape [128, 128]).
GROUP = 128


def load_vllm_kernels(path: str | Path):
    """vLLM's ``@triton.jit`` functions from its ``fused_moe.py``, as a module: the file imports
    vLLM itself, so only those functions (their source as written, with ``triton`` and ``tl`` in
    scope) are written to a temporary file and imported from there (Triton reads a kernel's source)."""
    source = Path(path).read_text()
    lines = source.splitlines()
    chunks = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
            first = min(d.lineno for d in node.decorator_list) - 1
            chunks.append("\n".join(lines[first:node.end_lineno]))
    if not any("def fused_moe_kernel(" in c for c in chunks):
        raise ValueError(f"--vllm-file: no @triton.jit fused_moe_kernel in {path}")
    folder = Path(tempfile.mkdtemp(prefix="vllm_kernels_"))
    file = folder / "vllm_fused_moe_kernels.py"
    file.write_text("import triton\nimport triton.language as tl\n\n\n" + "\n\n\n".join(chunks) + "\n")
    spec = importlib.util.spec_from_file_location("vllm_fused_moe_kernels", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def vllm_config(M: int, E: int, inter: int, configs_dir: str | None, device: str) -> tuple[dict, str]:
    """``(config, where it came from)``: vLLM's tuned entry for this expert shape and device at the
    nearest M (its JSON files are named by E, the intermediate size N and the device), else its
    default rule for block FP8 on CUDA (vLLM 0.34's ``get_default_config``)."""
    name = f"E={E},N={inter},device_name={device},dtype=fp8_w8a8,block_shape=[{GROUP},{GROUP}].json"
    path = Path(configs_dir or "") / name
    if configs_dir and path.exists():
        table = {int(m): c for m, c in json.loads(path.read_text()).items()}
        return dict(table[min(table, key=lambda m: abs(m - M))]), name
    small = M <= 8
    return {"BLOCK_SIZE_M": 16 if M <= 64 else 64, "BLOCK_SIZE_N": 64 if small else GROUP, "BLOCK_SIZE_K": GROUP,
            "GROUP_SIZE_M": 1 if M <= 16 else 32, "num_warps": 4,
            "num_stages": (4 if M <= 4 else 3) if small else 3}, "default"


def vllm_first_gemm(kernels, x_q, x_scale, w, w_scale, out, alignment, M: int, topk: int, config: dict) -> None:
    """One launch of vLLM's ``fused_moe_kernel`` as its launcher makes it for block FP8: ``x_q``
    ``[M, K]`` e4m3 with ``x_scale`` ``[M, K / 128]``, ``w`` ``[E, N, K]`` e4m3 with ``w_scale``
    ``[E, N / 128, K / 128]``, ``out`` ``[M, topk, N]`` bf16, ``alignment`` for BLOCK_SIZE_M."""
    cfg = dict(config)
    block_m, block_n, block_k = cfg.pop("BLOCK_SIZE_M"), cfg.pop("BLOCK_SIZE_N"), min(cfg.pop("BLOCK_SIZE_K"), GROUP)
    sorted_ids, expert_ids, num_post = alignment
    N, K = w.shape[1:]
    em = sorted_ids.numel()
    if M < block_m:                 # vLLM's small-batch bound on the row blocks worth launching
        em = min(em, M * topk * block_m)
    hopper = runtime.ON_GPU and torch.cuda.get_device_capability()[0] == 9
    use_tma_b = hopper and w.is_contiguous() and N % block_n == 0 and K % block_k == 0
    b_desc = None
    if use_tma_b:
        from triton.tools.tensor_descriptor import TensorDescriptor
        b_desc = TensorDescriptor.from_tensor(w, [1, block_n, block_k])
    args = dict(
        a_ptr=x_q, b_ptr=w, b_desc=b_desc, c_ptr=out, b_bias_ptr=None, a_scale_ptr=x_scale, b_scale_ptr=w_scale,
        topk_weights_ptr=None, sorted_token_ids_ptr=sorted_ids, expert_ids_ptr=expert_ids,
        num_tokens_post_padded_ptr=num_post, a_desc=None, N=N, K=K, EM=em, num_valid_tokens=M * topk,
        stride_am=x_q.stride(0), stride_ak=x_q.stride(1), stride_be=w.stride(0), stride_bk=w.stride(2),
        stride_bn=w.stride(1), stride_cm=out.stride(1), stride_cn=out.stride(2), stride_asm=x_scale.stride(0),
        stride_ask=x_scale.stride(1), stride_bse=w_scale.stride(0), stride_bsk=w_scale.stride(2),
        stride_bsn=w_scale.stride(1), stride_bbe=0, stride_bbn=0, group_n=GROUP, group_k=GROUP,
        naive_block_assignment=False, BLOCK_SIZE_M=block_m, BLOCK_SIZE_N=block_n, BLOCK_SIZE_K=block_k,
        GROUP_SIZE_M=cfg.pop("GROUP_SIZE_M"), SPLIT_K=1, MUL_ROUTED_WEIGHT=False, top_k=topk,
        compute_type=tl.bfloat16 if out.dtype == torch.bfloat16 else tl.float32, use_fp8_w8a8=True,
        use_int8_w8a8=False, use_int8_w8a16=False, per_channel_quant=False, HAS_BIAS=False,
        SWAP_AB=hopper and block_m < 64 and block_n >= 64, USE_TD=False, USE_TMA_B=use_tma_b, USE_TMA_A=False,
        C_IS_SORTED=False)
    kernel = kernels.fused_moe_kernel
    params = inspect.signature(kernel.fn).parameters
    missing = [a for a, q in params.items() if a not in args and q.default is inspect.Parameter.empty]
    if missing:
        raise ValueError(f"this vLLM kernel takes arguments the script does not know: {missing}")
    grid = (triton.cdiv(em, block_m) * triton.cdiv(N, block_n),)
    kernel[grid](**{a: args[a] for a in params if a in args}, num_warps=cfg.pop("num_warps", 4),
                 num_stages=cfg.pop("num_stages", 3))


def case_rows(kernels, shape: ModelShape, M: int, w13, ceil, info: dict, args) -> list[dict]:
    """Check, then time ours (``impls.first_fp8``: the dispatcher, tl or Gluon per the table) and
    vLLM's first GEMM on one batch; one row each."""
    inp = bench.make_inputs(shape, M, runtime.DEFAULT_DTYPE, w13, None)
    ours = impls.first_fp8(inp)
    wq, ws = impls.fp8_experts(inp, layer=False)
    xq, xs = quantize_rows(inp.xs[0])         # as ours quantises them (deterministic: the same bits)
    cfg, source = vllm_config(M, shape.num_experts, shape.intermediate, args.vllm_configs, args.vllm_device)
    if args.dry_run:            # vLLM indexes its one weight scale per tile as a vector (b_scale[None, :]):
        cfg["BLOCK_SIZE_N"] = 2 * GROUP    # compiled Triton accepts it, the interpreter only for wider tiles
    alignment = align_block_size(inp.ids[0], cfg["BLOCK_SIZE_M"], shape.num_experts)
    out = torch.empty(M, shape.topk, wq.shape[1], dtype=torch.bfloat16 if runtime.ON_GPU else torch.float32,
                      device=wq.device)
    calls = {"fp8": ours.calls[0],
             "vllm-fp8": lambda: vllm_first_gemm(kernels, xq, xs, wq, ws, out, alignment, M, shape.topk, cfg)}
    rows = torch.arange(min(M, 4), device=wq.device)
    expected = ours.reference(rows)
    calls["vllm-fp8"]()
    errors = {"fp8": rel_error(ours.output(calls["fp8"]())[rows].float(), expected),
              "vllm-fp8": rel_error(out[rows].float(), expected)}
    floor = ceil.floor_ms(*bench.traffic_of("first", inp, "fp8"), "fp8")
    times = time_both_orders(calls)
    best = {k: min(v) for k, v in times.items()}
    print(f"{shape.name:14s} M={M:5d}: floor {floor * 1e3:8.1f} us | ours {best['fp8'] * 1e3:8.1f} | vLLM "
          f"{best['vllm-fp8'] * 1e3:8.1f} ({source}) | vLLM / ours {best['vllm-fp8'] / best['fp8']:.3f} | errors "
          f"{errors['fp8']:.1e} {errors['vllm-fp8']:.1e}", flush=True)
    return [dict(info, model=shape.name, M=M, E=shape.num_experts, N=wq.shape[1], K=wq.shape[2], topk=shape.topk,
                 impl=name, ms=best[name], ms_forward=times[name][0], ms_reverse=times[name][1],
                 floor_ms=floor, fraction_of_floor=floor / best[name], rel_error=errors[name],
                 vllm_over_ours=best["vllm-fp8"] / best["fp8"],
                 vllm_config=json.dumps(cfg, sort_keys=True) if name == "vllm-fp8" else "",
                 vllm_config_source=source if name == "vllm-fp8" else "") for name in calls]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vllm-file", required=True, help="vLLM's vllm/model_executor/layers/fused_moe/fused_moe.py")
    p.add_argument("--vllm-configs", default=None, help="vLLM's fused_moe/configs folder (tuned JSON files)")
    p.add_argument("--vllm-device", default=None, help="the device name in vLLM's config files (default: this GPU's)")
    p.add_argument("--table-of", default=None, help="a GPU name whose tuned tables ours runs (default: this GPU's)")
    p.add_argument("--models", nargs="+", default=["DeepSeek-V3", "Qwen3-30B-A3B", "Kimi-K2"])
    p.add_argument("--M", nargs="+", type=int, default=[1, 8, 64, 256, 1024, 4096, 16384])
    p.add_argument("--dry-run", action="store_true", help="on a CPU: the toy shape in the interpreter")
    args = p.parse_args(argv)
    if args.table_of:
        configs.gpu_name = lambda: args.table_of     # what tuned_config looks up
    if args.vllm_device is None:
        args.vllm_device = torch.cuda.get_device_name().replace(" ", "_") if runtime.ON_GPU else "cpu"
    if args.dry_run:
        MODEL_SHAPES[TOY.name] = TOY
        args.models, args.M = [TOY.name], [1, 3]
    elif not runtime.ON_GPU:
        print("needs a CUDA GPU")
        return 2
    kernels = load_vllm_kernels(args.vllm_file)
    ceil = measure_ceilings(runtime.DEFAULT_DTYPE, "cold-l2")
    vllm_file = Path(args.vllm_file)
    info = {**machine_info(), **ceil.columns(), "tables": args.table_of or "",
            "vllm_file": f"{vllm_file.parent.name}/{vllm_file.name}"}
    rows = []
    for model in args.models:
        shape = MODEL_SHAPES[model]
        w13, _ = bench.make_weights(shape, runtime.DEFAULT_DTYPE, with_w2=False)
        for M in args.M:
            rows += case_rows(kernels, shape, M, w13, ceil, info, args)
            write_csv(Path(OUT) / "vllm_fp8_anchor.csv", rows, list(rows[0]))
            if runtime.ON_GPU:
                torch.cuda.empty_cache()
        del w13
        ratios = [r["vllm_over_ours"] for r in rows if r["model"] == model and r["impl"] == "fp8"]
        print(f"{model}: vLLM / ours geomean {geomean(ratios):.3f}, least {min(ratios):.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
