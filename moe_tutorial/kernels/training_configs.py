"""Part 8: the launch configuration of each GEMM of a training step, chosen in microseconds.

A training step runs six GEMMs (:class:`TrainingConfigs`): the forward's gate/up (which saves H)
and down, then dA' (with the dSwiGLU epilogue), dx, dW2 and dW13. Each gets its own tiles, looked
up as Part 4's are (:func:`moe_tutorial.kernels.configs.tuned_config`, the user's table before the
shipped ones, the nearest M on a log scale) under the variants of :data:`VARIANTS`, or else from
:func:`heuristic_training_configs`. No autotuning at the first call: a table lookup or a rule.

The four M-grouped GEMMs share one alignment, so they share its ``block_m`` (the gate/up GEMM's);
in the two K-grouped ones ``block_m`` x ``block_n`` is the dW tile and ``block_k`` the rows of the
expert's run taken per step, at most the alignment's ``block_m`` (see
:func:`moe_tutorial.kernels.backward_kernel.launch_expert_grad`). One more choice is the
backward's, not a tile's: ``sorted_copies`` (see :class:`TrainingConfigs`).
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import lru_cache

import torch

from .. import runtime
from . import configs as _tables
from .configs import (
    CPU_CONFIG,
    SMEM_LIMIT,
    KernelConfig,
    check_config,
    fit_shared_memory,
    get_config,
    problem_key,
    smem_limit,
    tuned_config,
)

#: The variants of the tuned tables' problem keys, one per GEMM of :class:`TrainingConfigs`.
VARIANTS = {"up": "train_up", "dact": "train_dact", "dx": "train_dx", "dw2": "train_dw2", "dw13": "train_dw13"}


@dataclass(frozen=True)
class TrainingConfigs:
    """One :class:`KernelConfig` per GEMM of a training step (see the module)."""

    up: KernelConfig      # forward gate/up, writes H and A (rows_gemm_kernel, "save_swiglu")
    down: KernelConfig    # forward down, Part 4's kernel on A in sorted order
    dact: KernelConfig    # dA' = dO W2 with the dSwiGLU epilogue
    dx: KernelConfig      # dH W13, then the topk sum
    dw2: KernelConfig     # K-grouped: dO^T (s A) per expert
    dw13: KernelConfig    # K-grouped: dH^T x per expert
    #: Copy dO and x into sorted order (one row per sorted position) before the backward's GEMMs
    #: that read them: dA' and dW2 then take dO, and dW13 takes x, as whole tiles (through TMA on
    #: a GPU that has it) instead of one gathered row per pair, for one extra pass over each and
    #: a transient buffer of the sorted rows (freed before the next is made). False gathers in
    #: the kernels, as the forward does.
    sorted_copies: bool = True

    def checked(self) -> TrainingConfigs:
        """Every GEMM's field a valid KernelConfig, the M-grouped ones on the gate/up GEMM's ``block_m``;
        ``gluon`` only where a Gluon kernel exists (:data:`GLUON_GEMMS`)."""
        cfgs = {f.name: check_config(getattr(self, f.name), f"configs.{f.name}") for f in fields(self)
                if f.name in GEMMS}
        for name in (n for n in GEMMS if n not in GLUON_GEMMS):
            if cfgs[name].gluon:
                raise ValueError(f"configs.{name}.gluon: only gate/up (up), dA' (dact) and the dW GEMMs (dw2, "
                                 f"dw13) have a Gluon kernel; expected False")
        bm = cfgs["up"].block_m
        for name in ("down", "dact", "dx"):
            cfgs[name] = replace(cfgs[name], block_m=bm)
        if not isinstance(self.sorted_copies, bool):
            raise TypeError(f"configs.sorted_copies must be a bool, got {self.sorted_copies!r}")
        if not self.sorted_copies and any(cfgs[name].gluon for name in ("dact", "dw2", "dw13")):
            raise ValueError("configs: the Gluon kernels read dO and x as whole tiles of their sorted copies; "
                             "expected sorted_copies=True with a gluon dact, dw2 or dw13")
        return TrainingConfigs(**cfgs, sorted_copies=self.sorted_copies)


#: Fewer rows than this per expert (on average) make a short run for the dW tiles.
SHORT_RUN_ROWS = 1024

#: The GEMMs of a training step, the fields of :class:`TrainingConfigs` that are tiles.
GEMMS = ("up", "down", "dact", "dx", "dw2", "dw13")

#: Those with a Gluon kernel (Hopper): gate/up (Part 4's, :mod:`.gluon_kernel`, H saved by its epilogue),
#: dA' (:mod:`.gluon_dact_kernel`) and the dW GEMMs (:mod:`.gluon_grad_kernel`).
GLUON_GEMMS = ("up", "dact", "dw2", "dw13")


#: In the interpreter every GEMM takes Part 4's small CPU tile.
CPU_TRAINING_CONFIGS = TrainingConfigs(*(CPU_CONFIG,) * 6).checked()


def heuristic_training_configs(M: int, E: int, topk: int, itemsize: int = 2,
                               limit: int = SMEM_LIMIT) -> TrainingConfigs:
    """Untuned tiles for a GPU of Hopper's shared memory, from Part 4's tuned prefill tiles.

    Training batches are prefill-sized (thousands of tokens): 128-row blocks once an expert
    averages 64 rows or more, else 64 (and 32 under 16 rows). The gated forward keeps Part 4's
    128 x 128 pair of accumulators; dA' has one accumulator but a heavy epilogue (two H tiles
    read, three tiles written), so 128 x 128 too, four stages deep; dx is a plain GEMM (128 x 256,
    as Part 4's down GEMM). The dW tiles are 128 x 256 with 64 rows of the run per step for long
    runs (the tile sweep on the H200: the best or within 7% of it for dW2 and dW13 on Qwen3-30B-A3B
    at 2048 rows per expert and Mixtral-8x7B at 4096; 128 x 128 was 5-13% slower). Under
    :data:`SHORT_RUN_ROWS` rows per expert each program's K loop is a few steps long, so its loads
    and its store hardly overlap: there one warpgroup per 128 x 128 tile, 32 rows a step, lets two
    programs share an SM (the sweep: 12% to 19% faster at 128 and 256 rows per expert, 3% at 512).
    Weights and sorted operands come through TMA where the GPU has it. The tiles are for 2-byte elements; with
    ``itemsize`` 4 (fp32) each is shrunk until its pipeline fits ``limit`` bytes of shared memory
    (the gated forward and dA', which reads two H tiles, counted as two weight tiles a stage).
    """
    rows_per_expert = max(1, M * topk // E)
    bm = 128 if rows_per_expert >= 64 else 64 if rows_per_expert >= 16 else 32
    warps = 8 if bm == 128 else 4
    up = KernelConfig(block_m=bm, block_n=128, block_k=64, num_warps=warps, num_stages=4, use_tma=True,
                      short_tails=False)
    dact = KernelConfig(block_m=bm, block_n=128, block_k=64, num_warps=warps, num_stages=4, use_tma=True,
                        short_tails=False)
    dx = KernelConfig(block_m=bm, block_n=256 if bm == 128 else 128, block_k=64, num_warps=warps, num_stages=3,
                      use_tma=True, short_tails=False)
    if rows_per_expert < SHORT_RUN_ROWS:
        dw = KernelConfig(block_m=128, block_n=128, block_k=min(32, bm), num_warps=4, num_stages=4, use_tma=True,
                          short_tails=False)
    else:
        dw = KernelConfig(block_m=128, block_n=256, block_k=min(64, bm), num_warps=8, num_stages=3, use_tma=True,
                          short_tails=False)
    up, dact = fit_shared_memory(up, True, itemsize, limit), fit_shared_memory(dact, True, itemsize, limit)
    dx, dw = fit_shared_memory(dx, False, itemsize, limit), fit_shared_memory(dw, False, itemsize, limit)
    return TrainingConfigs(up=up, down=dx, dact=dact, dx=dx, dw2=dw, dw13=dw)


def in_tl(configs: TrainingConfigs, M: int, E: int, topk: int, gemms=GLUON_GEMMS, itemsize: int = 2) -> TrainingConfigs:
    """``configs`` with each GEMM of ``gemms`` that was on a Gluon kernel back in ``tl``, on
    :func:`heuristic_training_configs`' tile: the step before that kernel, or where it cannot run."""
    back = [name for name in gemms if getattr(configs, name).gluon]
    if not back:
        return configs
    guess = heuristic_training_configs(M, E, topk, itemsize)
    return replace(configs, **{name: getattr(guess, name) for name in back}).checked()


def training_configs(M: int, E: int, hidden: int, inter: int, topk: int, dtype: torch.dtype) -> TrainingConfigs:
    """The configurations of one training step of the layer: tuned where a table has them, else
    the heuristic; Part 4's tuned down GEMM for the forward's down (on the shared ``block_m``).
    Already :meth:`TrainingConfigs.checked`: the layer takes it as it comes."""
    if runtime.INTERPRETED:
        return CPU_TRAINING_CONFIGS
    # Looked up once per problem and table version: a training step calls this at every forward,
    # where the six table lookups cost a third of a millisecond of host time.
    return _chosen(M, E, hidden, inter, topk, dtype, _tables.gpu_name(), _tables.table_versions())


@lru_cache(maxsize=256)
def _chosen(M, E, hidden, inter, topk, dtype, gpu, versions) -> TrainingConfigs:
    # ``gpu`` and ``versions`` are read by nothing here: they key the cache, so that another GPU
    # or a rewritten table is looked up anew.
    guess = heuristic_training_configs(M, E, topk, torch.empty(0, dtype=dtype).element_size(), smem_limit())
    shapes = {"up": (inter, hidden), "dact": (inter, hidden), "dx": (hidden, 2 * inter),
              "dw2": (hidden, inter), "dw13": (2 * inter, hidden)}
    chosen = {}
    for name, (N, K) in shapes.items():
        tuned = tuned_config(M, problem_key(E, N, K, topk, dtype, VARIANTS[name]))
        chosen[name] = tuned if tuned is not None else getattr(guess, name)
    down = replace(get_config(M, E, hidden, inter, topk, dtype, "down"), short_tails=False)
    return TrainingConfigs(down=down, **chosen).checked()
