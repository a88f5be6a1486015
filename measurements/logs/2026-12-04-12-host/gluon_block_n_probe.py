"""Does Gluon take a tile width that is not a power of two (issue 31's "BLOCK_N other than a power
of two" lever)? Compiles one e4m3 warpgroup MMA of a [64, 128] A tile by a [BLOCK_N, 128] B tile
for sm90 on the CPU, no GPU needed, and prints what the compiler says for each width:

    PYTHONPATH=DIR_WITH_TRITON_3_6 python gluon_block_n_probe.py     # the GPU image's Triton
"""
import os

os.environ["TRITON_INTERPRET"] = "0"

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.experimental import gluon  # noqa: E402
from triton.experimental.gluon import language as gl  # noqa: E402
from triton.experimental.gluon.language.nvidia.hopper import warpgroup_mma, warpgroup_mma_wait  # noqa: E402


@gluon.jit
def one_mma(c_ptr, BLOCK_N: gl.constexpr):
    layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 32])
    a = gl.allocate_shared_memory(gl.float8e4nv, [64, 128],
                                  gl.NVMMASharedLayout.get_default_for([64, 128], gl.float8e4nv))
    b = gl.allocate_shared_memory(gl.float8e4nv, [BLOCK_N, 128],
                                  gl.NVMMASharedLayout.get_default_for([BLOCK_N, 128], gl.float8e4nv))
    acc = gl.zeros((64, BLOCK_N), dtype=gl.float32, layout=layout)
    acc = warpgroup_mma(a, b.permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    offs_m = gl.arange(0, 64, layout=gl.SliceLayout(1, layout))
    offs_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, layout))
    gl.store(c_ptr + offs_m[:, None] * BLOCK_N + offs_n[None, :], acc)


print("triton", triton.__version__)
for block_n in (64, 128, 160, 192, 256):
    src = gluon._runtime.GluonASTSource(fn=one_mma, signature={"c_ptr": "*fp32", "BLOCK_N": "constexpr"},
                                        constexprs={(1,): block_n})
    try:
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
        mmas = sorted({line.split()[0] for line in ptx.splitlines() if "wgmma.mma_async" in line})
        print(f"BLOCK_N = {block_n}: compiled, {', '.join(mmas)}")
    except Exception as e:  # noqa: BLE001  (a refusal is the answer)
        text = f"{e}\n{e.__cause__}"
        why = next((line.strip() for line in text.splitlines() if "power of 2" in line or "power-of-2" in line),
                   type(e).__name__)
        print(f"BLOCK_N = {block_n}: refused: {why}")
