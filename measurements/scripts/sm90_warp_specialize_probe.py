"""Does Triton's automatic warp specialisation produce producer/consumer warps on Hopper?

Compiles, without a GPU, a plain TMA matmul for sm90 (``triton.compile`` with a GPUTarget) with
``tl.range(..., warp_specialize=True)`` on the K loop and on a persistent tile loop, 4 and 8
warps, and reports what the compiled kernel holds: ``ttg.warp_specialize`` regions (the
partitions), ``setmaxnreg`` (the register split between producer and consumer warps) and the
wgmma count. Run it with the Triton you have:

    python measurements/scripts/sm90_warp_specialize_probe.py

Triton 3.6 (the H200 image's) gave, on 2026-12-01: no partition and no setmaxnreg in any case,
and an NVGPUWarpSpecialization pass failure for the K loop with 4 warps (measurements/gpu-notes.md).
"""
import os
import subprocess
import sys

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource


@triton.jit
def tma_matmul(a_desc, b_desc, c_desc, K, num_tiles, num_pid_n,
               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, WS: tl.constexpr, PERSISTENT: tl.constexpr):
    if PERSISTENT:
        for t in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), flatten=True, warp_specialize=WS):
            pid_m, pid_n = t // num_pid_n, t % num_pid_n
            acc = tl.zeros((BM, BN), tl.float32)
            for k in range(0, tl.cdiv(K, BK)):
                acc = tl.dot(a_desc.load([pid_m * BM, k * BK]), b_desc.load([pid_n * BN, k * BK]).T, acc)
            c_desc.store([pid_m * BM, pid_n * BN], acc.to(tl.bfloat16))
    else:
        pid_m, pid_n = tl.program_id(0), tl.program_id(1)
        acc = tl.zeros((BM, BN), tl.float32)
        for k in tl.range(0, tl.cdiv(K, BK), warp_specialize=WS):
            acc = tl.dot(a_desc.load([pid_m * BM, k * BK]), b_desc.load([pid_n * BN, k * BK]).T, acc)
        c_desc.store([pid_m * BM, pid_n * BN], acc.to(tl.bfloat16))


def probe(persistent: bool, ws: bool, warps: int, BM=128, BN=256, BK=64) -> str:
    signature = {"a_desc": f"tensordesc<bf16[{BM},{BK}]>", "b_desc": f"tensordesc<bf16[{BN},{BK}]>",
                 "c_desc": f"tensordesc<bf16[{BM},{BN}]>", "K": "i32", "num_tiles": "i32", "num_pid_n": "i32",
                 "BM": "constexpr", "BN": "constexpr", "BK": "constexpr", "WS": "constexpr", "PERSISTENT": "constexpr"}
    names = tma_matmul.arg_names
    constexprs = {(names.index(k),): v for k, v in dict(BM=BM, BN=BN, BK=BK, WS=ws, PERSISTENT=persistent).items()}
    try:
        kernel = triton.compile(ASTSource(fn=tma_matmul, signature=signature, constexprs=constexprs),
                                target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=3))
    except Exception as e:  # noqa: BLE001  (a pass failure is a result here)
        return f"compile failed: {str(e).splitlines()[0][:80]}"
    ttgir, ptx = kernel.asm["ttgir"], kernel.asm["ptx"]
    return (f"partitions {ttgir.count('ttg.warp_specialize')}, setmaxnreg {ptx.count('setmaxnreg')}, "
            f"wgmma {ptx.count('wgmma.mma_async')}")


def main() -> None:
    if os.environ.get("TRITON_INTERPRET", "0") != "0":
        # Under the interpreter @triton.jit makes no compilable kernel: run again, compiling for real.
        subprocess.run([sys.executable, __file__], env={**os.environ, "TRITON_INTERPRET": "0"}, check=True)
        return
    print(f"Triton {triton.__version__}, target sm90")
    for persistent in (False, True):
        for ws in (False, True):
            for warps in (4, 8):
                loop = "persistent tile loop" if persistent else "K loop"
                print(f"{loop:20s} warp_specialize={ws!s:5s} {warps} warps: {probe(persistent, ws, warps)}")


if __name__ == "__main__":
    main()
