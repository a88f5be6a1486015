"""The tuner: find Part 4's best launch configurations for this GPU and save them for next time.

For each GEMM variant of a model ("plain": the first GEMM as the bench times it, "gated": the
layer's gate/up GEMM with SiLU*up fused, "down": the layer's down GEMM with the router weights
fused, reading its activations in sorted order as the layer hands them over) and each batch
size M, it times a curated set of :class:`KernelConfig` with CUDA graphs, keeps only candidates
whose output matches the heuristic configuration's, and writes the fastest into the JSON table
:func:`moe_tutorial.kernels.configs.get_config` reads
(``{gpu_name: {problem_key: {str(M): config}}}``), merged with what is already there.

The search runs in two stages within a time budget shared evenly by the problems: first the
tile shapes (BLOCK_M near the rows each expert gets, BLOCK_N, BLOCK_K) with sensible warps and
stages, then warps, stages, GROUP_M and the TMA path around the best tile.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import triton

from .. import runtime
from ..kernels import configs
from ..kernels.align import align_block_size
from ..kernels.configs import KernelConfig, fp8_heuristic_config, heuristic_config, problem_key
from ..kernels.sorted_layer import launch_sorted_gemm
from ..quant import dequantize_activations
from ..reference import rel_error
from ..shapes import ModelShape
from .bench import free_device_memory, make_inputs, make_weights, rotations
from .report import format_table
from .timing import cycle, measure_ms, time_both_orders
from .traffic import experts_touched

VARIANTS = ("plain", "gated", "down")
#: At most this many fp32 accumulator elements per thread (more spills registers).
MAX_ACC_PER_THREAD = 256
REFUSAL = ("nothing to tune here: there is no CUDA GPU, so Triton runs the kernels in its CPU "
           "interpreter, where block sizes, warps and stages change nothing that could be measured. "
           "Run `python -m moe_tutorial tune` on a machine with a CUDA GPU.")


class TuneRefused(RuntimeError):
    """Tuning makes no sense on this runtime (no GPU)."""


def problem_dims(shape: ModelShape, variant: str) -> tuple[int, int]:
    """``(N, K)`` of one variant's GEMM, as :func:`configs.problem_key` names them."""
    H, inter = shape.hidden, shape.intermediate
    dims = {"plain": (2 * inter, H), "gated": (inter, H), "down": (H, inter)}
    if variant not in dims:
        raise ValueError(f"variant: expected one of {', '.join(VARIANTS)}, got {variant!r}")
    return dims[variant]


def tma_available() -> bool:
    """The kernel's TMA path for the weights needs a Hopper-or-newer GPU."""
    return runtime.ON_GPU and torch.cuda.get_device_capability()[0] >= 9


def rows_per_expert(M: int, E: int, topk: int) -> float:
    """Average (token, slot) pairs each touched expert gets: what BLOCK_M should be near."""
    return M * topk / max(experts_touched(M, E, topk), 1.0)


def block_m_range(M: int, E: int, topk: int) -> list[int]:
    """BLOCK_M values worth trying: around the rows each touched expert gets, up to 4x more.

    A tile taller than an expert's rows computes padding; a shorter one makes the expert's
    weights be read once per block of rows (the H200 exploration found BLOCK_M up to 4x the
    average best near a block's worth of rows per expert, since routing is uneven).
    """
    rpe = rows_per_expert(M, E, topk)
    upper = min(128, max(16, triton.next_power_of_2(max(1, round(4 * rpe)))))
    lower = max(16, min(128, triton.next_power_of_2(max(1, round(rpe)))) // 4)
    return [b for b in (16, 32, 64, 128) if lower <= b <= upper]


def config_space(M: int, E: int, N: int, K: int, topk: int, *, gated: bool = False, itemsize: int = 2,
                 tma: bool = False) -> list[KernelConfig]:
    """Every configuration worth trying for one problem, pruned by what fits and what M needs.

    - BLOCK_M from :func:`block_m_range` (16 at decode, up to 128 at prefill);
    - BLOCK_N in 32..256 (64 and up for tiles of 64 rows or more) and BLOCK_K in 64..256, no
      wider than N and K need (tl.dot needs a K tile of at least 16, which all of these are);
    - 4 or 8 warps, 2 to 5 stages; GROUP_M 8 only when there are enough row blocks to group;
      the TMA path for the weights when ``tma`` (a Hopper GPU); for the plain GEMM with tiles of
      64 rows or more, the persistent grid too (it lost with two accumulators, ``gated``);
    - dropped: tiles whose pipelined A and B buffers exceed ``configs.SMEM_LIMIT``
      (:func:`configs.smem_bytes`), or whose fp32 accumulators exceed
      :data:`MAX_ACC_PER_THREAD` per thread (``gated`` doubles both B and the accumulators).
    """
    block_ns = [b for b in (32, 64, 128, 256) if b <= max(32, triton.next_power_of_2(N))]
    block_ks = [b for b in (64, 128, 256) if b <= max(64, triton.next_power_of_2(K))]
    halves = 2 if gated else 1
    space = []
    for bm in block_m_range(M, E, topk):
        row_blocks = M * topk / bm + min(E, M * topk)      # roughly, padding included
        for bn, bk, warps, stages in itertools.product(block_ns, block_ks, (4, 8), (2, 3, 4, 5)):
            if bm * bn * halves / (32 * warps) > MAX_ACC_PER_THREAD or (bm >= 64 and bn < 64):
                continue                                    # spills, or a tall thin tile
            for group in ((1, 8) if row_blocks > 8 else (1,)):
                for use_tma, persistent in itertools.product((False, True) if tma else (False,),
                                                             (False, True) if bm >= 64 and not gated else (False,)):
                    extra = {"use_tma": True} if use_tma else {}
                    if persistent:
                        extra.update(persistent=True, short_tails=False)
                    config = KernelConfig(block_m=bm, block_n=bn, block_k=bk, group_m=group, num_warps=warps,
                                          num_stages=stages, **extra)
                    if configs.smem_bytes(config, gated, itemsize) <= configs.SMEM_LIMIT:
                        space.append(config)
    return space


def fp8_config_space(M: int, E: int, N: int, K: int, topk: int, *, gated: bool = False,
                     tma: bool = False, gluon: bool = False) -> list[KernelConfig]:
    """The FP8 kernel's configurations worth trying: BLOCK_K 128 (one scale group per step) or 64,
    BLOCK_N 128 (the gate/up GEMM quantises its output per 128 columns; 64 and 256 elsewhere),
    BLOCK_M from :func:`block_m_range`, swapped operands for row blocks under 64, 4 or 8 warps,
    3 to 5 stages, TMA for the weights when ``tma``; pruned like :func:`config_space` (e4m3: one
    byte per element)."""
    block_ns = (128,) if gated else tuple(b for b in (64, 128, 256) if b <= max(64, triton.next_power_of_2(N)))
    halves = 2 if gated else 1
    space = []
    for bm in block_m_range(M, E, topk):
        row_blocks = M * topk / bm + min(E, M * topk)
        for bn, bk, warps, stages, swap in itertools.product(block_ns, (64, 128), (4, 8), (3, 4, 5),
                                                             (False, True) if bm < 64 else (False,)):
            # The per-step product needs a second accumulator's worth of registers.
            if 2 * bm * bn * halves / (32 * warps) > MAX_ACC_PER_THREAD + 128 or (bm >= 64 and bn < 64):
                continue
            for group in ((1, 8) if row_blocks > 8 else (1,)):
                for use_tma in ((False, True) if tma else (False,)):
                    config = KernelConfig(block_m=bm, block_n=bn, block_k=bk, group_m=group, num_warps=warps,
                                          num_stages=stages, use_tma=use_tma, short_tails=False, swap_ab=swap)
                    if configs.smem_bytes(config, gated, 1) <= configs.SMEM_LIMIT:
                        space.append(config)
    if gluon:       # the Gluon kernel's two tile shapes (kernels/gluon_fp8_kernel.py), first GEMM only
        space += [configs.GLUON_PLAIN, configs.GLUON_FUSED_DOWN]
    return space


def _tile(c: KernelConfig) -> tuple[int, int, int, bool]:
    return c.block_m, c.block_n, c.block_k, c.gluon


def tile_candidates(space: list[KernelConfig], heuristic: KernelConfig) -> list[KernelConfig]:
    """Stage 1: one configuration per tile shape, the heuristic's tile first, then its neighbours.

    Each tile gets 4 warps (8 for 128x128 and up), the most stages up to 4 that fit, GROUP_M 8
    where allowed, and TMA for the weights as the heuristic has it where the space offers it, so
    that tiles are compared on equal terms (TMA alone is worth 7-15% at large M on an H200).
    """
    by_tile: dict = {}
    for c in space:
        want_warps = 8 if c.block_m * c.block_n >= 128 * 128 else 4
        score = (c.use_tma != heuristic.use_tma, c.persistent != heuristic.persistent, c.num_warps != want_warps,
                 -min(c.num_stages, 4),
                 c.num_stages > 4, -c.group_m)
        if _tile(c) not in by_tile or score < by_tile[_tile(c)][0]:
            by_tile[_tile(c)] = (score, c)

    def distance(tile):
        sizes = sum(abs(math.log2(a) - math.log2(b)) for a, b in zip(tile[:3], _tile(heuristic)[:3]))
        return sizes + (tile[3] != heuristic.gluon)
    return [by_tile[t][1] for t in sorted(by_tile, key=lambda t: (distance(t), -t[1]))]


def refinements(space: list[KernelConfig], best: KernelConfig) -> list[KernelConfig]:
    """Stage 2: the best tile with other warps, stages, GROUP_M and TMA; one change at a time first."""
    same = [c for c in space if _tile(c) == _tile(best) and c != best]

    def changes(c):
        return sum(getattr(c, f) != getattr(best, f)
                   for f in ("group_m", "num_warps", "num_stages", "use_tma", "swap_ab", "persistent"))
    return sorted(same, key=changes)


@dataclass
class TuneResult:
    """One problem's outcome; times in ms."""

    variant: str
    M: int
    key: str
    heuristic: KernelConfig
    heuristic_ms: float
    best: KernelConfig
    best_ms: float
    tried: int
    failed: int

    @property
    def gain(self) -> float:
        """How many times faster the best configuration is than the heuristic one."""
        return self.heuristic_ms / self.best_ms


class _Problem:
    """Tensors and launches of one (variant, M) problem, on rotated routings."""

    def __init__(self, shape: ModelShape, variant: str, M: int, dtype: torch.dtype, w13, w2, seed: int = 0):
        self.shape, self.variant, self.M = shape, variant, M
        self.N, self.K = problem_dims(shape, variant)
        inp = make_inputs(shape, M, torch.bfloat16 if dtype == torch.float8_e4m3fn else dtype, w13, w2,
                          num_rotations=rotations(M, "cold-l2"), seed=seed)
        self.ids = inp.ids
        pairs = M * shape.topk
        self.pairs = pairs
        if variant == "down":
            g = torch.Generator(device=runtime.DEVICE).manual_seed(seed + 7)
            self.a = [torch.randn(pairs, shape.intermediate, generator=g, device=runtime.DEVICE, dtype=w2.dtype)
                      for _ in inp.ids]
            self.b, self.router, self.a_row_div = w2, [w.reshape(-1).float().contiguous() for w in inp.weights], 1
        else:
            self.a, self.b, self.router, self.a_row_div = inp.xs, w13, [None] * len(inp.ids), shape.topk
        self.fp8 = dtype == torch.float8_e4m3fn
        if self.fp8:
            self._quantise(variant, w13, w2)
        self.out = self.a[0].new_empty(pairs, self.N) if not self.fp8 else \
            torch.empty(pairs, self.N, dtype=torch.bfloat16, device=runtime.DEVICE)
        self._alignments: dict = {}
        self._sorted_acts: dict = {}
        # Rows compared between candidates: a strided sample, so big outputs stay cheap.
        self.rows = torch.arange(0, pairs, max(1, pairs // 4096), device=runtime.DEVICE)

    def _quantise(self, variant: str, w13, w2) -> None:
        """FP8 problems: e4m3 weights with block scales, e4m3 activations with group scales; the
        gate/up GEMM writes e4m3 rows and their scales, as the FP8 layer does."""
        from ..kernels.fp8_quant import quantize_rows
        from ..quant import quantize_w13, quantize_weight

        self.b_q = quantize_w13(w13) if variant == "gated" else quantize_weight(w2 if variant == "down" else w13)
        self.a_q = [quantize_rows(a) for a in self.a]
        self.c_scale = (torch.empty(self.pairs, triton.cdiv(self.N, 128), device=runtime.DEVICE)
                        if variant == "gated" else None)

    def alignments(self, block_m: int):
        if block_m not in self._alignments:
            self._alignments[block_m] = [align_block_size(i, block_m, self.shape.num_experts) for i in self.ids]
        return self._alignments[block_m]

    def sorted_activations(self, block_m: int) -> list[torch.Tensor]:
        """The down GEMM's input as the layer hands it over: row i is the pair at sorted position i."""
        if block_m not in self._sorted_acts:
            self._sorted_acts[block_m] = [a[al[0].clamp(0, self.pairs - 1).long()]
                                          for a, al in zip(self.a, self.alignments(block_m))]
        return self._sorted_acts[block_m]

    def calls(self, config: KernelConfig) -> list[Callable]:
        if self.fp8:
            return self.fp8_calls(config)

        aligned = self.alignments(config.block_m)
        gated = self.variant == "gated"
        if self.variant == "down":    # as sorted_moe_layer runs it: activations in sorted order
            acts = self.sorted_activations(config.block_m)
            return [lambda r=r: launch_sorted_gemm(acts[r], self.b, self.out, self.router[r], aligned[r], self.pairs,
                                                   1, config, a_sorted=True)
                    for r in range(len(self.a))]
        return [lambda r=r: launch_sorted_gemm(self.a[r], self.b, self.out, self.router[r], aligned[r], self.pairs,
                                               self.a_row_div, config, gated=gated)
                for r in range(len(self.a))]

    def fp8_calls(self, config: KernelConfig) -> list[Callable]:
        """The FP8 kernel's launches; the gate/up GEMM's e4m3 output goes to ``out`` viewed as
        bytes' worth of e4m3 (half of it), so candidates compare on the same buffer."""
        from ..kernels.fp8_layer import launch_fp8_gemm

        aligned = self.alignments(config.block_m)
        b, b_s = self.b_q
        if self.variant == "gated":
            c = self.out.view(torch.uint8)[:, : self.N].view(torch.float8_e4m3fn)
            return [lambda r=r: launch_fp8_gemm(*self.a_q[r], b, b_s, c, aligned[r], self.pairs, self.a_row_div, config,
                                                c_scale=self.c_scale, gated=True) for r in range(len(self.a))]
        return [lambda r=r: launch_fp8_gemm(*self.a_q[r], b, b_s, self.out, aligned[r], self.pairs, self.a_row_div,
                                            config, router_weights=self.router[r]) for r in range(len(self.a))]

    def run_checked(self, config: KernelConfig) -> torch.Tensor:
        """Run rotation 0 into a NaN-poisoned buffer (compiles); return the sampled rows, or raise."""
        self.out.fill_(float("nan"))
        if self.fp8 and self.c_scale is not None:
            self.c_scale.fill_(float("nan"))
        self.calls(config)[0]()
        out = self.out
        if self.fp8 and self.variant == "gated":      # e4m3 values and their scales, as numbers
            out = dequantize_activations(self.out.view(torch.uint8)[:, : self.N].view(torch.float8_e4m3fn),
                                         self.c_scale)
        if not bool(torch.isfinite(out).all()):
            raise ValueError("left elements unwritten (NaN)")
        return out[self.rows].clone()


def check_against(problem: _Problem, config: KernelConfig, expected: torch.Tensor,
                  log: Callable[[str], None] = print) -> bool:
    """Run ``config`` once (it compiles) and compare its sampled rows with ``expected``: True if they
    match (relative error < 1e-2); False, with the reason logged, if it fails to compile or launch
    (out of shared memory, say) or computes something else."""
    try:
        err = rel_error(problem.run_checked(config), expected)
        if not err < 1e-2:
            raise ValueError(f"differs from the heuristic configuration's result (rel. error {err:.1e})")
        return True
    except Exception as e:  # noqa: BLE001  (out of shared memory, compile errors, wrong results)
        first_line = str(e).strip().splitlines()[0][:120] if str(e).strip() else ""
        log(f"    rejected {config}: {type(e).__name__}: {first_line}")
        if runtime.ON_GPU:
            torch.cuda.synchronize()
        return False


def compare_configs(shape: ModelShape, variant: str, M: int, dtype: torch.dtype, candidates: dict[str, KernelConfig],
                    w13: torch.Tensor, w2: torch.Tensor | None, *, seed: int = 0, max_seconds: float = 1.0,
                    log: Callable[[str], None] = print) -> dict[str, list[float]]:
    """Named configurations of one (variant, M) problem side by side, as the tuner sees them.

    The first candidate is the reference: each other one must match its output (as the tuner
    checks a candidate against the heuristic). Then all that pass are timed by
    :func:`timing.time_both_orders` (cold-l2, rotated routings); returns ``{name: [ms, ms reversed]}``,
    ``[inf, inf]`` for a candidate that failed its check. ``w13`` ``[E, 2 * inter, hidden]`` and
    ``w2`` ``[E, hidden, inter]`` (None unless ``variant`` is "down") in bf16 for FP8 problems, as
    :func:`tune` makes them.
    """
    problem = _Problem(shape, variant, M, dtype, w13, w2, seed=seed)
    names = list(candidates)
    expected = problem.run_checked(candidates[names[0]])
    passed = {name: cycle(problem.calls(candidates[name])) for name in names
              if name == names[0] or check_against(problem, candidates[name], expected, log)}
    times = time_both_orders(passed, max_seconds=max_seconds)
    return {name: times.get(name, [math.inf, math.inf]) for name in names}


def tune_problem(problem: _Problem, dtype: torch.dtype, deadline: float, *,
                 measure: Callable | None = None, log: Callable[[str], None] = print) -> TuneResult:
    """Search one problem until ``deadline`` (``time.monotonic()``); the heuristic is always timed."""
    # The cold-l2 protocol, as the bench measures: a configuration that wins there wins in the results.
    measure = measure or (lambda fn: measure_ms(fn, protocol="cold-l2", max_seconds=1.0)[0])
    s, M = problem.shape, problem.M
    E, topk = s.num_experts, s.topk
    gated = problem.variant == "gated"
    if problem.fp8:
        # The layer's two GEMMs stay on the tl kernel here: the layer's Gluon form is chosen on the
        # whole layer (measurements/scripts/h200_gluon_fp8.py), since its gate/up GEMM and down GEMM go together.
        plain = problem.variant == "plain"
        heuristic = fp8_heuristic_config(M, topk, E, problem.variant, N=problem.N, K=problem.K,
                                         kernel=None if plain else "tl")
        space = fp8_config_space(M, E, problem.N, problem.K, topk, gated=gated, tma=tma_available(),
                                 gluon=plain and configs.gluon_fp8_available())
    else:
        heuristic = heuristic_config(M, topk, E, problem.variant, N=problem.N)
        space = config_space(M, E, problem.N, problem.K, topk, gated=gated,
                             itemsize=torch.empty(0, dtype=dtype).element_size(), tma=tma_available())
    expected = problem.run_checked(heuristic)
    heuristic_ms = measure(cycle(problem.calls(heuristic)))
    results = {heuristic: heuristic_ms}
    failed = 0

    def attempt(config: KernelConfig) -> None:
        nonlocal failed
        if config in results or time.monotonic() > deadline:
            return
        if check_against(problem, config, expected, log):
            results[config] = measure(cycle(problem.calls(config)))
        else:
            failed += 1
            results[config] = math.inf

    for config in tile_candidates(space, heuristic):
        attempt(config)
    best_tile = min(results, key=results.get)
    for config in refinements(space, best_tile):
        attempt(config)
    best = min(results, key=results.get)
    return TuneResult(problem.variant, M, problem_key(E, problem.N, problem.K, topk, dtype, problem.variant),
                      heuristic, heuristic_ms, best, results[best], len(results), failed)


def read_table(path) -> dict:
    """A tuned table as a dict (empty when the file does not exist)."""
    path = Path(path)
    if not path.exists():
        return {}
    with open(path) as f:
        table = json.load(f)
    if not isinstance(table, dict):
        raise ValueError(f"{path}: expected a JSON object {{gpu: {{problem: {{M: config}}}}}}")
    return table


def merge_results(table: dict, gpu: str, results: list[TuneResult]) -> dict:
    """``table`` with each result's best configuration set at ``[gpu][key][str(M)]`` (in place)."""
    for r in results:
        table.setdefault(gpu, {}).setdefault(r.key, {})[str(r.M)] = r.best.as_dict()
    return table


def write_table(path, table: dict) -> Path:
    """Write ``table`` as JSON, atomically (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    return path


def save_results(results: list[TuneResult], path=None, gpu: str | None = None) -> Path:
    """Merge ``results`` into the table at ``path`` (default :func:`configs.user_table_path`)."""
    path = Path(path) if path is not None else configs.user_table_path()
    return write_table(path, merge_results(read_table(path), gpu or configs.gpu_name(), results))


def tune(shape: ModelShape, batch_sizes, variants=VARIANTS, dtype: torch.dtype = torch.bfloat16, *,
         out=None, max_minutes: float = 8.0, seed: int = 0, log: Callable[[str], None] = print,
         measure: Callable | None = None, allow_cpu: bool = False) -> list[TuneResult]:
    """Tune every (variant, M) of ``shape`` within ``max_minutes``; save and return the results.

    The table is rewritten after each problem, so a run cut short keeps what it found.
    ``allow_cpu`` and ``measure`` exist for tests, which exercise the search in the interpreter.
    """
    if not runtime.ON_GPU and not allow_cpu:
        raise TuneRefused(REFUSAL)

    start = time.monotonic()
    end = start + 60 * max_minutes
    # FP8 problems start from bf16 weights and quantise them (as a checkpoint's were).
    w13, w2 = make_weights(shape, torch.bfloat16 if dtype == torch.float8_e4m3fn else dtype,
                           with_w2="down" in variants, seed=seed)
    todo = [(v, M) for v in variants for M in batch_sizes]
    results = []
    for i, (variant, M) in enumerate(todo):
        now = time.monotonic()
        if now > end:
            log(f"  time budget used up: {variant} M={M} and later problems are not tuned")
            break
        deadline = now + (end - now) / (len(todo) - i)   # an even share of what is left
        try:
            problem = _Problem(shape, variant, M, dtype, w13, w2, seed=seed)
            r = tune_problem(problem, dtype, deadline, measure=measure, log=log)
        except Exception as e:  # noqa: BLE001  (one problem failing must not lose the others)
            log(f"  {variant:5s} M={M:<6d} failed: {type(e).__name__}: {e}")
            continue
        finally:
            problem = None
            free_device_memory()
        results.append(r)
        log(f"  {variant:5s} M={M:<6d} heuristic {r.heuristic_ms:.4f} ms, best {r.best_ms:.4f} ms "
            f"({r.gain:.2f}x, {r.tried} tried, {r.failed} rejected): {format_config(r.best)}")
        save_results(results, out)
    return results


def format_config(c: KernelConfig) -> str:
    """``BM x BN x BK, group, warps, stages[, tma][, swap][, persistent]`` in one short string."""
    text = f"{c.block_m}x{c.block_n}x{c.block_k} g{c.group_m} w{c.num_warps} s{c.num_stages}"
    flags = [name for name, on in (("tma", c.use_tma), ("swap", c.swap_ab), ("persistent", c.persistent)) if on]
    return " ".join([text, *flags])


def results_table(results: list[TuneResult]) -> str:
    """Per problem: the heuristic's time, the best time, the gain and the best configuration."""
    body = [[r.variant, str(r.M), f"{r.heuristic_ms:.4f}", f"{r.best_ms:.4f}", f"{r.gain:.2f}x",
             format_config(r.heuristic), format_config(r.best)] for r in results]
    return format_table(["variant", "M", "heuristic ms", "best ms", "gain", "heuristic", "best"], body)
