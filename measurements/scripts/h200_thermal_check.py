"""Does a hot GPU time slower? The ceilings and Part 4's kernel, before and after 15 s of load.

Why: in the bench the same configuration read up to 12% apart at M >= 1024 depending on what
ran just before it (measurements/gpu-notes.md). Usage, on a GPU: ``python measurements/scripts/h200_thermal_check.py``.
Prints one table: matmul ceiling, the Mixtral-8x7B first GEMM at M = 4096 (tuned "sorted") and
the SM clock, cold and after heating.
"""
import subprocess
import time

from moe_tutorial.perf import bench, ceilings, timing
from moe_tutorial.perf.registry import prepare
from moe_tutorial.shapes import MODEL_SHAPES

import torch


def sm_clock() -> str:
    return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.strip()


def main() -> None:
    shape, M = MODEL_SHAPES["Mixtral-8x7B"], 4096
    w13, w2 = bench.make_weights(shape, torch.bfloat16, with_w2=False)
    inp = bench.make_inputs(shape, M, torch.bfloat16, w13, w2, num_rotations=1)
    sorted_call = prepare("first", "sorted", inp).calls[0]
    sorted_call()
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    c = torch.empty_like(a)
    print("state  matmul TFLOP/s  sorted ms  sorted/matmul-rate  clock,power,temp")
    for state in ("cold", "hot", "hot again"):
        if state != "cold":
            end = time.perf_counter() + 15
            while time.perf_counter() < end:
                for _ in range(20):
                    torch.matmul(a, a, out=c)
                torch.cuda.synchronize()
        clock = sm_clock()
        ceil = ceilings.measure_ceilings(torch.bfloat16, "cold-l2", read_bytes=1 << 30)
        ms = timing.measure_ms(sorted_call, protocol="cold-l2")[0]
        flops = 2 * M * shape.topk * 2 * shape.intermediate * shape.hidden
        share = flops / ms / 1e9 / ceil.matmul_tflops
        print(f"{state:9s} {ceil.matmul_tflops:8.0f} {ms:10.3f} {share:12.2f}   {clock}")


if __name__ == "__main__":
    main()
