"""Compile Part 7's kernels for Hopper (sm90) on any machine, no GPU needed, and read what came out.

Triton compiles to PTX and then, with the ``ptxas`` it ships, to machine code (SASS) for a
target it is told about; nothing needs a GPU until the launch. So a laptop can answer the
questions notebook 07 asks of the compiled FP8 kernels:

* does each K step's warpgroup MMA wait for itself (``wgmma.wait_group 0`` right after the MMAs,
  the ``tl`` kernel's promotion) or leave one in flight (``wgmma.wait_group 1``, the Gluon kernel)?
* did ``ptxas`` keep that schedule? It serialises every wgmma of a kernel whose accumulator
  registers are read or written while an MMA runs, and says so (advisories C7514, C7515);
* how many registers, and any spills?

The same questions hold for the bf16 Gluon kernel at prefill (:data:`BF16_KERNELS`): does its
gated form keep a step's gate and up MMAs in flight (``wgmma.wait_group 2``), and do its stages
fit the shared memory?

:func:`compile_report` runs the compile in a child process (the notebooks run the kernels in
Triton's interpreter, and a kernel is compiled or interpreted from the moment it is decorated),
with ``TRITON_INTERPRET=0`` and a stand-in driver that names sm90 as the current target.
"""
from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

#: What :func:`compile_report` can compile: a name per kernel and launch.
KERNELS = ("tl-plain", "gluon-plain", "gluon-plain-nooverlap", "gluon-gated", "gluon-two-wave",
           "gluon-rescaled-plain", "gluon-rescaled-gated", "gluon-rescaled-plain-split")

#: The Gluon FP8 forms whose C goes out through TMA copies (``tma_store``: rows in sorted order, a
#: plain form's with router weights, as the layer's down GEMM writes them), as the layer launches
#: them: name -> (block_m, warps, stages).
TMA_KERNELS = {"gluon-gated-tma": (64, 8, 4), "gluon-plain-tma": (64, 4, 6), "gluon-plain-128-tma": (128, 8, 4),
               "gluon-rescaled-gated-split-tma": (128, 4, 4), "gluon-rescaled-plain-split-tma": (128, 4, 3),
               "gluon-rescaled-plain-tma": (128, 8, 3),
               # A read from x's rows by index (cp.async) instead of a sorted copy through TMA, by four
               # load warps or by one
               "gluon-rescaled-gated-split-tma-gather": (128, 4, 4),
               "gluon-rescaled-gated-split-tma-gather-1w": (128, 4, 4)}
KERNELS += tuple(TMA_KERNELS)

#: The bf16 Gluon kernel (:mod:`moe_tutorial.kernels.gluon_kernel`) at prefill, as
#: :func:`~moe_tutorial.kernels.gluon_kernel.gluon_layer` runs it: name -> (block_n, stages), all
#: 128 rows, 64 of K and 8 warps (two consumer warpgroups). The plain ones are the down GEMM.
BF16_KERNELS = {"gluon-bf16-gated": (128, 4), "gluon-bf16-plain": (128, 4), "gluon-bf16-plain-256": (256, 3),
                # Part 8's forward: the gated form that also keeps H at each pair's row.
                "gluon-bf16-gated-save-h": (128, 4),
                # C out through TMA copies (config.tma_store): the down GEMM's rows then left sorted.
                "gluon-bf16-gated-tma": (128, 4), "gluon-bf16-plain-tma": (128, 4),
                "gluon-bf16-plain-256-tma": (256, 3)}
KERNELS += tuple(BF16_KERNELS)

#: Part 8's K-grouped dW GEMM in Gluon (:mod:`moe_tutorial.kernels.gluon_grad_kernel`), dW13's shape:
#: name -> (block_n, rows a step, stages); 128 rows of dW, 8 warps.
GRAD_KERNELS = {"gluon-bf16-dw": (256, 64, 3), "gluon-bf16-dw-128": (128, 64, 4)}
KERNELS += tuple(GRAD_KERNELS)

#: Part 8's dA' GEMM with its dSwiGLU epilogue in Gluon (:mod:`moe_tutorial.kernels.gluon_dact_kernel`):
#: name -> (block_n, stages); 128 rows, 64 of K, 8 MMA warps.
DACT_KERNELS = {"gluon-bf16-dact": (128, 4)}
KERNELS += tuple(DACT_KERNELS)

#: The same Gluon kernel on e4m3 operands (FP8 with one scale per tensor: the tensor cores
#: accumulate, nothing is promoted), the first GEMM's shape: name -> (block_n, stages), 128 rows,
#: 128 of K, 8 warps. What Part 7's block scales cost is the gap to it.
PER_TENSOR_KERNELS = {"gluon-e4m3-plain": (128, 4), "gluon-e4m3-plain-256": (256, 4)}
KERNELS += tuple(PER_TENSOR_KERNELS)


def compile_report(kernel: str, *, timeout: float = 300.0) -> dict:
    """Compile ``kernel`` (one of :data:`KERNELS`) for sm90 in a child process.

    Returns a dict: ``ptx`` and ``sass`` (text), ``registers``, ``spill_bytes``, ``serialised``
    (ptxas's advisory line, or "" when it kept the asynchronous MMAs), ``wait_groups`` (the
    ``wgmma.wait_group N`` values in the PTX, in order), ``shared`` (bytes of shared memory per
    program), ``triton`` (the version used), ``cubin`` (the machine code as the launch would load
    it, base64), ``yield_edits`` (instructions ``kernels/yield_edit.py`` edited in it, or 0) and
    ``cubin_ptxas`` (the machine code as ptxas wrote it).
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel: expected one of {', '.join(KERNELS)}, got {kernel!r}")
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        run = subprocess.run([sys.executable, "-m", "moe_tutorial.experiments.sm90", kernel, str(out)],
                             env=env, capture_output=True, text=True, timeout=timeout)
        if run.returncode != 0 or not out.exists():
            raise RuntimeError(f"compiling {kernel} for sm90 failed:\n{run.stderr[-2000:]}")
        return json.loads(out.read_text())


# ------------------------------------------------------------------ in the child process

class _Sm90Driver:
    """The part of Triton's driver a compile asks for, naming sm90 as the current GPU."""

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        import torch
        return torch.device("cpu")


class _Capture:
    """Stands in for a kernel: ``kernel[grid](...)`` compiles (``warmup``) and keeps the result."""

    def __init__(self, kernel):
        self.kernel, self.compiled = kernel, []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.compiled.append(self.kernel.run(*args, grid=grid, warmup=True, **kwargs))

    def __getattr__(self, name):           # the rest (arg_names, fn) is the kernel's
        return getattr(self.kernel, name)


@contextmanager
def _captured(module, name: str):
    capture = _Capture(getattr(module, name))
    setattr(module, name, capture)
    try:
        yield capture
    finally:
        setattr(module, name, capture.kernel)


def _compile(kernel: str):
    """Launch ``kernel`` on CPU tensors of a DeepSeek-V3-like problem (E = 8 here), compiling only."""
    import torch

    from ..kernels import fp8_kernel, fp8_layer, gluon_fp8_kernel, gluon_kernel
    from ..kernels.align import max_padded_rows
    from ..kernels.configs import KernelConfig
    from ..quant import FP8_DTYPE

    E, inter, K, M, topk = 8, 1024, 2048, 256, 8

    def align_block_size(ids, block_m, num_experts):     # its shapes only: nothing may run on the CPU here
        rows = max_padded_rows(ids.numel(), block_m, num_experts)
        return (torch.arange(rows, dtype=torch.int32), torch.zeros(-(-rows // block_m), dtype=torch.int32),
                torch.tensor([rows // block_m * block_m], dtype=torch.int32))

    ids = torch.zeros(M, topk, dtype=torch.int32)
    x_q = torch.zeros(M, K, dtype=FP8_DTYPE)
    x_s = torch.ones(M, K // 128)
    w = torch.zeros(E, 2 * inter, K, dtype=FP8_DTYPE)
    w_s = torch.ones(E, 2 * inter // 128, K // 128)
    pairs = M * topk
    if kernel in BF16_KERNELS:
        return _compile_bf16(kernel, gluon_kernel, align_block_size(ids, 128, E), pairs, E, inter, K)
    if kernel in GRAD_KERNELS:
        return _compile_grad(kernel, E, 2 * inter, K, max_padded_rows(pairs, 128, E))
    if kernel in DACT_KERNELS:
        return _compile_dact(kernel, align_block_size(ids, 128, E), pairs, E, inter, K)
    if kernel in PER_TENSOR_KERNELS:
        block_n, stages = PER_TENSOR_KERNELS[kernel]
        config = KernelConfig(block_m=128, block_n=block_n, block_k=128, num_warps=8, num_stages=stages,
                              short_tails=False)
        alignment = align_block_size(ids, 128, E)
        a = torch.zeros(gluon_kernel.sorted_rows(alignment, 128), K, dtype=FP8_DTYPE)
        out = torch.empty(pairs, 2 * inter, dtype=torch.bfloat16)
        gluon_kernel.UNAVAILABLE = None              # compiling, not running
        with _captured(gluon_kernel, "gluon_moe_kernel") as cap:
            gluon_kernel.launch_gluon_gemm(a, w, out, None, alignment, pairs, config)
        return cap.compiled[0]
    if kernel == "tl-plain":
        config = KernelConfig(block_m=64, block_n=128, block_k=128, num_warps=4, num_stages=4, short_tails=False)
        out = torch.empty(pairs, 2 * inter, dtype=torch.bfloat16)
        with _captured(fp8_kernel, "fp8_moe_kernel") as cap:
            fp8_layer.launch_fp8_gemm(x_q, x_s, w, w_s, out, align_block_size(ids, 64, E), pairs, topk, config)
        return cap.compiled[0]
    bm, warps, stages = {"gluon-gated": (64, 8, 4), "gluon-two-wave": (256, 8, 3),
                         "gluon-rescaled-plain-split": (128, 4, 4), **TMA_KERNELS}.get(kernel, (128, 8, 4))
    rescale = kernel.startswith("gluon-rescaled")
    tma_store = kernel in TMA_KERNELS
    config = KernelConfig(block_m=bm, block_n=256 if kernel.startswith("gluon-rescaled-plain") else 128, block_k=128,
                          num_warps=warps, num_stages=stages, short_tails=False, gluon=True, rescale=rescale,
                          tma_store=tma_store)
    alignment = align_block_size(ids, bm, E)
    rows = gluon_fp8_kernel.sorted_rows(alignment, bm)
    a, a_st = torch.zeros(rows, K, dtype=FP8_DTYPE), torch.ones(K // 128, rows)
    gluon_fp8_kernel.UNAVAILABLE = None              # compiling, not running
    with _captured(gluon_fp8_kernel, "gluon_fp8_moe_kernel") as cap:
        if "-gather" in kernel:
            gluon_fp8_kernel.GATHER_WARPS = 1 if kernel.endswith("-1w") else 4
            act = torch.empty(a.shape[0], inter, dtype=FP8_DTYPE)
            act_st = torch.empty(inter // 128, a.shape[0])
            gluon_fp8_kernel.launch_gluon_fp8_gemm(x_q, None, w, w_s, act, alignment, pairs, config, c_scale_t=act_st,
                                                   gather_scales=x_s, topk=topk)
        elif kernel in ("gluon-gated", "gluon-rescaled-gated") or "gated" in kernel and tma_store:
            act = torch.empty(a.shape[0], inter, dtype=FP8_DTYPE)
            act_st = torch.empty(inter // 128, a.shape[0])
            gluon_fp8_kernel.launch_gluon_fp8_gemm(a, a_st, w, w_s, act, alignment, pairs, config, c_scale_t=act_st)
        elif tma_store:     # the down GEMM's epilogue: router weights, rows left in sorted order
            out = torch.empty(rows, 2 * inter, dtype=torch.bfloat16)
            gluon_fp8_kernel.launch_gluon_fp8_gemm(a, a_st, w, w_s, out, alignment, pairs, config,
                                                   router_weights=torch.ones(pairs), c_sorted=True)
        else:
            out = torch.empty(pairs, 2 * inter, dtype=torch.bfloat16)
            gluon_fp8_kernel.launch_gluon_fp8_gemm(a, a_st, w, w_s, out, alignment, pairs, config,
                                                   overlap=kernel != "gluon-plain-nooverlap")
    return cap.compiled[0]


def _compile_bf16(kernel: str, gluon_kernel, alignment, pairs: int, E: int, inter: int, K: int):
    """The bf16 layer's gate/up GEMM (``w13`` ``[E, 2I, K]``, x gathered) or its down GEMM
    (``w2`` ``[E, K, I]`` on the sorted activations, router weights, rows to their pairs)."""
    import torch

    from ..kernels.configs import KernelConfig

    block_n, stages = BF16_KERNELS[kernel]
    tma_store = kernel.endswith("-tma")
    config = KernelConfig(block_m=128, block_n=block_n, block_k=64, num_warps=8, num_stages=stages,
                          short_tails=False, tma_store=tma_store)
    rows = gluon_kernel.sorted_rows(alignment, config.block_m)
    gluon_kernel.UNAVAILABLE = None                  # compiling, not running
    with _captured(gluon_kernel, "gluon_moe_kernel") as cap:
        if kernel.startswith("gluon-bf16-gated"):
            a, w13 = torch.zeros(rows, K, dtype=torch.bfloat16), torch.zeros(E, 2 * inter, K, dtype=torch.bfloat16)
            act = torch.empty(rows, inter, dtype=torch.bfloat16)
            h = torch.empty(pairs, 2 * inter, dtype=torch.bfloat16) if kernel.endswith("save-h") else None
            gluon_kernel.launch_gluon_gemm(a, w13, act, None, alignment, pairs, config, gated=True, h=h)
        else:
            act, w2 = torch.zeros(rows, inter, dtype=torch.bfloat16), torch.zeros(E, K, inter, dtype=torch.bfloat16)
            out = torch.empty(rows if tma_store else pairs, K, dtype=torch.bfloat16)
            gluon_kernel.launch_gluon_gemm(act, w2, out, torch.ones(pairs), alignment, pairs, config,
                                           c_sorted=tma_store)
    return cap.compiled[0]


def _compile_grad(kernel: str, E: int, P: int, Q: int, rows: int):
    """dW13's K-grouped GEMM: ``dW [E, P, Q]`` from dH ``[rows, P]`` and x ``[rows, Q]`` in sorted order."""
    import torch

    from ..kernels import gluon_grad_kernel
    from ..kernels.configs import KernelConfig

    block_n, block_r, stages = GRAD_KERNELS[kernel]
    config = KernelConfig(block_m=128, block_n=block_n, block_k=block_r, num_warps=8, num_stages=stages,
                          short_tails=False, gluon=True)
    left, right = torch.zeros(rows, P, dtype=torch.bfloat16), torch.zeros(rows, Q, dtype=torch.bfloat16)
    out = torch.empty(E, P, Q, dtype=torch.bfloat16)
    run_rows = torch.arange(E + 1, dtype=torch.int32) * (rows // E)
    gluon_grad_kernel.UNAVAILABLE = None             # compiling, not running
    gluon_grad_kernel.tma_can_read = lambda t: True  # CPU tensors: TMA's rules are the GPU's to check
    with _captured(gluon_grad_kernel, "gluon_expert_grad_kernel") as cap:
        gluon_grad_kernel.launch_gluon_expert_grad(left, right, out, run_rows, block_r, config)
    return cap.compiled[0]


def _compile_dact(kernel: str, alignment, pairs: int, E: int, inter: int, K: int):
    """dA' with its epilogue: dO ``[rows, K]`` in sorted order against ``w2`` ``[E, K, I]``."""
    import torch

    from ..kernels import gluon_dact_kernel
    from ..kernels.configs import KernelConfig

    block_n, stages = DACT_KERNELS[kernel]
    config = KernelConfig(block_m=128, block_n=block_n, block_k=64, num_warps=8, num_stages=stages,
                          short_tails=False, gluon=True)
    rows = alignment[0].numel()
    bf16 = dict(dtype=torch.bfloat16)
    d_rows, w2 = torch.zeros(rows, K, **bf16), torch.zeros(E, K, inter, **bf16)
    gluon_dact_kernel.UNAVAILABLE = None             # compiling, not running
    # CPU tensors: TMA's rules are the GPU's to check.
    gluon_dact_kernel.tma_can_read = gluon_dact_kernel.tma_stacks = lambda t: True
    with _captured(gluon_dact_kernel, "gluon_dact_kernel") as cap:
        gluon_dact_kernel.launch_gluon_dact(
            d_rows, w2, alignment, pairs, config, dh=torch.empty(rows, 2 * inter, **bf16),
            h=torch.empty(pairs, 2 * inter, **bf16), s_act=torch.empty(rows, inter, **bf16),
            router_weights=torch.ones(pairs), ds_partial=torch.empty(pairs, -(-inter // block_n)))
    return cap.compiled[0]


def ptxas_stats(ptx: str, *, sass: bool = False) -> dict:
    """What the ptxas Triton runs for sm90 says of ``ptx`` with ``-v``: ``registers``, ``spill_bytes``
    and ``serialised`` (its advisory that the wgmmas were serialised, or ""); with ``sass`` also the
    machine code (``cuobjdump``)."""
    from triton.backends.nvidia.compiler import get_ptxas

    from ..kernels.yield_edit import sass as listing
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        src.write_text(ptx)
        # Triton's own ptxas run is silent; -v prints the register count and the advisories.
        # The ptxas Triton itself ran (its release names which one), again with -v.
        run = subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", str(src), "-o", str(cubin)],
                             capture_output=True, text=True)
        if run.returncode:
            raise RuntimeError(f"ptxas failed: {run.stderr[-1500:]}")
        ptxas = run.stderr
        code = listing(cubin.read_bytes()) if sass else None
    used = re.search(r"Used (\d+) registers", ptxas)
    serialised = next((line.split("Potential Performance Loss: ")[-1] for line in ptxas.splitlines()
                       if "wgmma.mma_async instructions are serialized" in line), "")
    stats = {"registers": int(used.group(1)) if used else None,
             "spill_bytes": sum(int(n) for n in re.findall(r"(\d+) bytes spill stores", ptxas)),
             "serialised": serialised}
    return {**stats, "sass": code} if sass else stats


def _report(compiled) -> dict:
    import triton
    ptx = compiled.asm["ptx"]
    return {"triton": triton.__version__, "ptx": ptx, **ptxas_stats(ptx, sass=True), "shared": compiled.metadata.shared,
            "cubin": base64.b64encode(compiled.kernel).decode(), "yield_edits": getattr(compiled, "yield_edits", 0),
            "cubin_ptxas": base64.b64encode(getattr(compiled, "unedited", compiled.kernel)).decode(),
            "wait_groups": [int(n) for n in re.findall(r"wgmma\.wait_group\.sync\.aligned (\d+)", ptx)]}


def main(argv: list[str]) -> int:
    if os.environ.get("TRITON_INTERPRET", "0") != "0":
        print("run with TRITON_INTERPRET=0 (compile_report does)", file=sys.stderr)
        return 2
    kernel, out = argv
    from triton.runtime import driver
    driver.set_active(_Sm90Driver())
    Path(out).write_text(json.dumps(_report(_compile(kernel))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
