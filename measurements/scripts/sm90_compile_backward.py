"""Compile Part 8's kernels for Hopper (sm90) with bf16 signatures, without a GPU.

Every variant the training step launches on an H200 (the heuristic's tiles, TMA on): the
forward gate/up GEMM that saves H, dA' with the dSwiGLU epilogue, dx, and the two K-grouped
weight gradients. ``triton.compile`` with a GPUTarget runs the whole GPU pipeline (TTIR, TTGIR,
LLIR, PTX) on the CPU, so a fault that only a GPU compile would hit (a block dimension under 16,
a layout ``tl.trans`` cannot take, a descriptor of the wrong rank) shows here first:

    python measurements/scripts/sm90_compile_backward.py

It prints one line per variant: the wgmma instructions (tensor cores on Hopper), whether shared
memory fits, and what the ``ptxas`` that Triton ships makes of the PTX (registers, spill stores).
The signatures say what a launch on the GPU tells Triton: pointers and sizes divisible by 16, unit
strides constant, so the registers match what Nsight Compute reports for the same tiles.
"""
import os
import subprocess
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

if os.environ.get("TRITON_INTERPRET", "0") == "0":
    # Only with the interpreter off does @triton.jit make a kernel triton.compile accepts.
    from moe_tutorial.experiments.sm90 import ptxas_stats
    from moe_tutorial.kernels.backward_kernel import expert_grad_kernel, rows_gemm_kernel


def _signature(kernel, types: dict, constexprs: dict):
    names = kernel.arg_names
    signature = {n: ("constexpr" if n in constexprs else types[n]) for n in names}
    return signature, {(names.index(k),): v for k, v in constexprs.items()}


def rows_variant(epilogue: str, a_rows: str, b_layout: str, b_tma: bool, bm=128, bn=128, bk=64, persistent=False):
    desc_b = f"tensordesc<bf16[{bn},{bk}]>" if b_layout == "nk" else f"tensordesc<bf16[{bk},{bn}]>"
    types = {"a_ptr": "*bf16", "a_desc": f"tensordesc<bf16[{bm},{bk}]>", "b_ptr": "*bf16", "b_desc": desc_b,
             "c_ptr": "*bf16", "h_ptr": "*bf16", "act_ptr": "*bf16", "router_w_ptr": "*fp32", "ds_ptr": "*fp32",
             "sorted_ids_ptr": "*i32", "expert_ids_ptr": "*i32", "num_post_ptr": "*i32"}
    types.update({n: "i32" for n in ("N", "K", "num_pairs", "max_padded", "a_row_div", "b_rows_per_expert",
                                     "stride_am", "stride_ak", "stride_be", "stride_bn", "stride_bk", "stride_cm",
                                     "stride_cn", "stride_hm", "stride_actm", "stride_dsm")})
    types["stride_be"] = "i64"
    constexprs = dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, A_ROWS=a_rows, B_LAYOUT=b_layout, B_TMA=b_tma,
                      EPILOGUE=epilogue, EVEN_K=True, DOT_PRECISION="tf32", PERSISTENT=persistent)
    if a_rows != "sorted_tma":
        constexprs["a_desc"] = None
    if not b_tma:
        constexprs["b_desc"] = None
    return rows_gemm_kernel, types, constexprs


def grad_variant(l_rows: str, r_rows: str, bp=128, bq=128, br=64):
    types = {"l_ptr": "*bf16", "l_desc": f"tensordesc<bf16[{br},{bp}]>", "r_ptr": "*bf16",
             "r_desc": f"tensordesc<bf16[{br},{bq}]>", "c_ptr": "*bf16", "sorted_ids_ptr": "*i32",
             "expert_rows_ptr": "*i32"}
    types.update({n: "i32" for n in ("P", "Q", "num_pairs", "row_div", "stride_lm", "stride_rm", "stride_ce",
                                     "stride_cp", "stride_cq")})
    constexprs = dict(BLOCK_P=bp, BLOCK_Q=bq, BLOCK_R=br, GROUP_M=8, L_ROWS=l_rows, R_ROWS=r_rows, EVEN_P=True,
                      EVEN_Q=True, DOT_PRECISION="tf32")
    if l_rows != "sorted_tma":
        constexprs["l_desc"] = None
    if r_rows != "sorted_tma":
        constexprs["r_desc"] = None
    return expert_grad_kernel, types, constexprs


VARIANTS = {
    "forward gate/up, saves H (TMA weights)": (rows_variant, ("save_swiglu", "gathered", "nk", True), 8, 4),
    "forward gate/up, saves H (pointer loads)": (rows_variant, ("save_swiglu", "gathered", "nk", False), 8, 4),
    "dA' + dSwiGLU epilogue (TMA weights)": (rows_variant, ("dswiglu", "gathered", "kn", True), 8, 3),
    "dA' + dSwiGLU epilogue, 64-row blocks": (rows_variant, ("dswiglu", "gathered", "kn", True, 64, 128, 64), 4, 3),
    "dx = dH W13 (TMA for dH and W13)": (rows_variant, ("scatter", "sorted_tma", "kn", True, 128, 256, 64), 8, 3),
    "dx = dH W13 (pointer loads)": (rows_variant, ("scatter", "sorted", "kn", False, 64, 128, 64), 4, 3),
    "dW2 = dO^T (s A) (s A through TMA)": (grad_variant, ("gathered", "sorted_tma"), 8, 3),
    "dW13 = dH^T x (dH through TMA)": (grad_variant, ("sorted_tma", "gathered"), 8, 3),
    "dW13, pointer loads, 32-row steps": (grad_variant, ("sorted", "gathered", 128, 128, 32), 8, 3),
    "dA' + dSwiGLU, dO's sorted copy through TMA": (rows_variant, ("dswiglu", "sorted_tma", "kn", True, 128, 128, 128),
                                                    8, 3),
    "dW2, dO's sorted copy and s A through TMA": (grad_variant, ("sorted_tma", "sorted_tma"), 8, 3),
    "dA' + dSwiGLU, dO's copy, persistent grid": (rows_variant, ("dswiglu", "sorted_tma", "kn", True, 128, 128, 64,
                                                                 True), 8, 4),
    "dx, persistent grid": (rows_variant, ("scatter", "sorted_tma", "kn", True, 128, 256, 64, True), 8, 3),
    "dW13, short-run tile": (grad_variant, ("sorted_tma", "sorted_tma", 128, 128, 32), 4, 4),
    "dW13, dH and x's sorted copy through TMA": (grad_variant, ("sorted_tma", "sorted_tma"), 8, 3),
}


#: Arguments a launch on the GPU passes as 1 (Triton then compiles them in as constants).
UNIT_STRIDES = {"rows_gemm_kernel": {"nk": ("stride_ak", "stride_cn", "stride_bk"),
                                     "kn": ("stride_ak", "stride_cn", "stride_bn")}}
#: Integer arguments a real launch passes as multiples of 16 (Triton assumes their divisibility).
DIVISIBLE = ("N", "K", "P", "Q", "max_padded", "b_rows_per_expert")


def _gpu_like(kernel, types: dict, constexprs: dict, args) -> dict:
    """Make ``constexprs`` hold the unit strides and return the divisibility hints of a GPU launch."""
    name = kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__
    for stride in UNIT_STRIDES.get(name, {}).get(args[2] if len(args) > 2 else "", ()):
        constexprs[stride] = 1
    names = kernel.arg_names
    hinted = [n for n in names if n not in constexprs
              and (types[n].startswith("*") or n in DIVISIBLE or n.startswith("stride"))]
    return {(names.index(n),): [["tt.divisibility", 16]] for n in hinted}


def ptxas_report(ptx: str) -> str:
    """Registers and spill bytes, from the ptxas Triton runs for sm90 (``ptxas -v``)."""
    stats = ptxas_stats(ptx)
    return f"{stats['registers']} registers, {stats['spill_bytes']} bytes spilled"


def compile_one(build, args, warps: int, stages: int) -> str:
    kernel, types, constexprs = build(*args)
    attrs = _gpu_like(kernel, types, constexprs, args)
    signature, constants = _signature(kernel, types, constexprs)
    try:
        compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=attrs),
                                  target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))
    except Exception as e:  # noqa: BLE001  (a compile failure is the result here)
        return "FAILED: " + " ".join(str(e).split())[:300]
    smem = compiled.metadata.shared
    return f"ok: wgmma {compiled.asm['ptx'].count('wgmma.mma_async')}, shared memory {smem / 1024:.0f} KB" + \
        (" (over the 227 KB of an H200)" if smem > 227 * 1024 else "") + f"; {ptxas_report(compiled.asm['ptx'])}"


def main() -> int:
    if os.environ.get("TRITON_INTERPRET", "0") != "0":
        # Importing moe_tutorial without a GPU turns the interpreter on; compile in a fresh process without it.
        return subprocess.run([sys.executable, __file__], env={**os.environ, "TRITON_INTERPRET": "0"}).returncode
    print(f"Triton {triton.__version__}, target sm90, bf16")
    failed = 0
    for name, (build, args, warps, stages) in VARIANTS.items():
        result = compile_one(build, args, warps, stages)
        failed += result.startswith("FAILED")
        print(f"{name:45s} {warps} warps, {stages} stages: {result}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
