"""Block sizes, warps and stages for Part 4's kernel: found by the tuner, looked up per problem.

Tables are JSON files keyed by GPU name, then by problem (``E,N,K,topk,dtype,variant``), then
by M. The package ships the tables measured for the series (``moe_tutorial/data``); ``python -m
moe_tutorial tune`` writes the reader's own into :func:`user_table_path`, which wins.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path

import torch

from .. import runtime
from ..checks import as_int
from ..fp8_format import BLOCK as FP8_BLOCK
from .gluon_kernel import HAVE_GLUON


@dataclass(frozen=True, kw_only=True)
class KernelConfig:
    """Launch parameters of :func:`moe_tutorial.kernels.sorted_kernel.sorted_moe_kernel`."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    use_tma: bool = False      # B tiles through a Hopper tensor descriptor (GPU only)
    short_tails: bool = True   # blocks at most half full multiply half as many rows (BLOCK_M >= 32)
    swap_ab: bool = False      # FP8 kernel only: small row blocks computed transposed (C^T = B^T A^T)
    persistent: bool = False   # one program per SM walks the tiles (kernels/persistent_kernel.py); no short tails
    gluon: bool = False        # FP8 and Part 8's dW GEMMs: the Gluon kernel (gluon_fp8_kernel.py, gluon_grad_kernel.py)
    rescale: bool = False      # Gluon FP8 only: accumulators rescaled in place, no raw products (256-wide tiles)
    tma_store: bool = False    # Gluon kernels: C out through TMA copies, its rows in sorted order

    def as_dict(self) -> dict:
        return asdict(self)


#: The power-of-two fields of a KernelConfig and their least value: ``tl.dot`` needs every block
#: dimension of at least 16 (the interpreter does not check it, a GPU does).
_POW2_FIELDS = {"block_m": 16, "block_n": 16, "block_k": 16, "num_warps": 1}


def check_config(config, name: str = "config") -> KernelConfig:
    """``config`` as a valid :class:`KernelConfig` (numpy integers read as ints, as ``route``
    reads ``top_k``), or an error naming the field, what it must be and what it was.

    Without this a ``block_n`` of 0 fails as a ZeroDivisionError inside Triton, a ``block_k`` of 24
    as an interpreter error about ``tl.arange``, and a dict as an AttributeError.
    """
    if not isinstance(config, KernelConfig):
        hint = " (build one with KernelConfig(**that_dict))" if isinstance(config, dict) else ""
        raise TypeError(f"{name}: expected a KernelConfig{hint}, got {type(config).__name__}")
    fields = {}
    for field, least in _POW2_FIELDS.items():
        value = as_int(f"{name}.{field}", getattr(config, field))
        if value < least or value & (value - 1):
            raise ValueError(f"{name}.{field}: expected a power of two of at least {least}, got {value}")
        fields[field] = value
    for field in ("group_m", "num_stages"):
        value = as_int(f"{name}.{field}", getattr(config, field))
        if value < 1:
            raise ValueError(f"{name}.{field}: expected an int of at least 1, got {value}")
        fields[field] = value
    for field in ("use_tma", "short_tails", "persistent", "gluon", "rescale", "tma_store"):
        if not isinstance(getattr(config, field), bool):
            raise TypeError(f"{name}.{field}: expected True or False, got {getattr(config, field)!r}")
    return replace(config, **fields)


def check_fp8_config(config, name: str = "config", *, quant_out: bool = False) -> KernelConfig:
    """:func:`check_config`, and the FP8 kernel's own rules: one program per tile (no persistent
    grid), ``block_k`` divides 128 (one scale per K step), and ``block_n`` is 128 where the GEMM
    quantises its output (``quant_out``: the layer's gate/up GEMM writes one scale per row and 128
    columns)."""
    config = check_config(config, name)
    if config.persistent:
        raise ValueError(f"{name}.persistent: the FP8 kernel has no persistent grid (it lost to one program per "
                         f"tile on an H200, measurements/gpu-notes.md); expected False")
    if config.rescale and not config.gluon:
        raise ValueError(f"{name}.rescale: only the Gluon kernel rescales its accumulators in place; expected False "
                         f"or gluon=True")
    if config.tma_store and not config.gluon:
        raise ValueError(f"{name}.tma_store: only the Gluon kernel stores C through TMA; expected False or gluon=True")
    if FP8_BLOCK % config.block_k:
        raise ValueError(f"{name}.block_k: expected a power of two dividing {FP8_BLOCK} (one scale per K step), "
                         f"got {config.block_k}")
    if quant_out and config.block_n != FP8_BLOCK:
        raise ValueError(f"{name}.block_n: expected {FP8_BLOCK}, since this GEMM quantises its output (one scale per "
                         f"row and {FP8_BLOCK} columns), got {config.block_n}")
    return config


def check_fp8_configs(configs) -> tuple[KernelConfig, KernelConfig]:
    """The FP8 layer's ``(gate/up, down)`` pair, each checked by :func:`check_fp8_config`, with one
    ``block_m``: both GEMMs read one alignment."""
    if not isinstance(configs, (tuple, list)) or len(configs) != 2:
        got = f"{len(configs)} items" if isinstance(configs, (tuple, list)) else type(configs).__name__
        raise TypeError(f"configs: expected a pair (gate/up KernelConfig, down KernelConfig), got {got}")
    up = check_fp8_config(configs[0], "configs[0]", quant_out=True)
    down = check_fp8_config(configs[1], "configs[1]")
    if up.block_m != down.block_m:
        raise ValueError(f"configs: the two GEMMs share one alignment, so one block_m; got {up.block_m} "
                         f"and {down.block_m}")
    return up, down


#: In the interpreter warps and stages mean nothing and every program costs about a
#: millisecond: one small, fixed configuration.
CPU_CONFIG = KernelConfig(block_m=16, block_n=32, block_k=32, group_m=1, num_warps=4, num_stages=1)

SHIPPED_DIR = Path(__file__).parent.parent / "data"


def user_table_path() -> Path:
    """Where ``tune`` writes: ``$MOE_TUTORIAL_CONFIG_DIR`` or ``~/.cache/moe_tutorial``."""
    root = os.environ.get("MOE_TUTORIAL_CONFIG_DIR") or Path.home() / ".cache" / "moe_tutorial"
    return Path(root) / "tuned_configs.json"


def problem_key(E: int, N: int, K: int, topk: int, dtype: torch.dtype, variant: str) -> str:
    """Key of one GEMM problem. ``variant`` is "plain", "gated" (SiLU*up epilogue) or "down"."""
    return f"E={E},N={N},K={K},topk={topk},dtype={str(dtype).replace('torch.', '')},variant={variant}"


def gpu_name() -> str:
    return torch.cuda.get_device_name() if runtime.ON_GPU else "cpu"


@lru_cache(maxsize=None)
def _load(path: str, mtime: float) -> dict:
    """One table file; a file that is not a JSON table is an error that names it (a table the
    tuner was writing when it was stopped, or one edited by hand)."""
    try:
        with open(path) as f:
            table = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"tuned-config table {path}: expected JSON, got an error at line {e.lineno} column "
                         f"{e.colno} ({e.msg}); fix or delete the file (`python -m moe_tutorial tune` writes "
                         f"it anew)") from None
    if not isinstance(table, dict):
        raise ValueError(f"tuned-config table {path}: expected a JSON object {{gpu: {{problem: {{M: config}}}}}}, "
                         f"got a {type(table).__name__}")
    return table


@lru_cache(maxsize=None)
def _shipped_paths() -> tuple[Path, ...]:
    # The package's own tables do not come and go while it runs: listed once, not at every launch.
    return tuple(sorted(SHIPPED_DIR.glob("tuned_configs*.json")))


def table_versions() -> tuple[tuple[str, float], ...]:
    """``(path, mtime)`` of every table that exists, the user's first: a lookup cached under these
    sees a table that ``tune`` rewrites, and costs a few ``stat`` calls, not a directory listing."""
    versions = []
    for path in (user_table_path(), *_shipped_paths()):
        try:
            versions.append((str(path), path.stat().st_mtime))
        except FileNotFoundError:
            pass
    return tuple(versions)


def load_tables() -> list[dict]:
    """The user's table first, then the shipped ones; each ``{gpu: {problem: {M: config}}}``."""
    return [_load(path, mtime) for path, mtime in table_versions()]


#: Shared memory per multiprocessor on Hopper (227 KB usable by one program).
SMEM_LIMIT = 227 * 1024


def smem_limit() -> int:
    """Shared memory one program may use on this GPU (Hopper's on the CPU, for planning)."""
    if runtime.ON_GPU:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return getattr(props, "shared_memory_per_block_optin", SMEM_LIMIT) or SMEM_LIMIT
    return SMEM_LIMIT


def shrink(config: KernelConfig) -> KernelConfig | None:
    """The next smaller configuration to try when one does not fit: fewer pipeline stages,
    then a shorter K tile, then a narrower N tile; None when nothing is left to shrink."""
    if config.num_stages > 2:
        return replace(config, num_stages=config.num_stages - 1)
    if config.block_k > 32:
        return replace(config, block_k=config.block_k // 2)
    if config.block_n > 32:
        return replace(config, block_n=config.block_n // 2)
    return None


def smem_bytes(config: KernelConfig, gated: bool = False, itemsize: int = 2) -> int:
    """Shared memory the software pipeline needs: ``num_stages`` copies of the A and B tiles
    (two B tiles when gated)."""
    b_tiles = 2 if gated else 1
    per_stage = config.block_m * config.block_k + b_tiles * config.block_k * config.block_n
    return per_stage * itemsize * config.num_stages


def fit_shared_memory(config: KernelConfig, gated: bool, itemsize: int, limit: int) -> KernelConfig:
    """``config`` shrunk (:func:`shrink`) until its pipeline fits ``limit`` bytes of shared memory
    with ``itemsize``-byte elements (:func:`smem_bytes`), or as small as it goes."""
    while smem_bytes(config, gated, itemsize) > limit and shrink(config) is not None:
        config = shrink(config)
    return config


def heuristic_config(M: int, topk: int, E: int, variant: str = "plain", itemsize: int = 2,
                     limit: int = SMEM_LIMIT, *, N: int | None = None) -> KernelConfig:
    """An untuned choice from what the tuner found on an H200 (measurements/gpu-notes.md).

    Decode (a few rows per expert) is memory-bound: one 16-row block per expert and long K
    tiles keep many weight bytes in flight; with ``N`` known, BLOCK_N is halved (down to 32)
    until the blocks give at least one program per two SMs, or a few experts with a narrow N
    would stream their weights through a handful of SMs. In between, BLOCK_M about twice an
    expert's average rows (the tuner's choice on all three models: routing is uneven, and a
    shorter block makes the busiest experts' weights be read twice). Prefill is compute-bound:
    the largest tiles, 8 warps, weights through TMA, and for the plain GEMM with 256 rows or more
    per expert the persistent grid (:mod:`moe_tutorial.kernels.persistent_kernel`). The result
    is shrunk until its pipeline fits ``limit`` bytes of shared memory with ``itemsize``-byte elements.
    """
    gated = variant == "gated"
    rows_per_expert = max(1, M * topk // E)
    if rows_per_expert <= 4:
        cfg = KernelConfig(block_m=16, block_n=128, block_k=256, group_m=8, num_warps=4, num_stages=3, use_tma=True)
        row_blocks = min(M * topk, E)
        while N is not None and cfg.block_n > 32 and row_blocks * math.ceil(N / cfg.block_n) < runtime.sm_count() // 2:
            cfg = replace(cfg, block_n=cfg.block_n // 2)
    elif rows_per_expert <= 16:
        cfg = KernelConfig(block_m=32, block_n=128, block_k=128, group_m=8, num_warps=4, num_stages=3, use_tma=False)
    elif rows_per_expert < 64:
        # Gated: two weight tiles per stage; a 64-wide N keeps four stages in shared memory.
        cfg = KernelConfig(block_m=64, block_n=64 if gated else 128, block_k=128, group_m=8, num_warps=4,
                           num_stages=4, use_tma=False)
    elif gated:
        # Two accumulators: a 128x256 pair spills registers (measurements/gpu-notes.md, tuning).
        cfg = KernelConfig(block_m=128, block_n=128, block_k=64, group_m=8, num_warps=8, num_stages=4, use_tma=True)
    elif variant == "plain" and rows_per_expert >= 256:
        # Many row blocks per expert: the persistent grid won on all three models (measurements/gpu-notes.md).
        cfg = KernelConfig(block_m=128, block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3, use_tma=True,
                           persistent=True, short_tails=False)
    else:
        cfg = KernelConfig(block_m=128, block_n=256, block_k=64, group_m=8, num_warps=8, num_stages=3, use_tma=True)
    return fit_shared_memory(cfg, gated, itemsize, limit)


def tuned_config(M: int, key: str) -> KernelConfig | None:
    """This GPU's tuned configuration for problem ``key`` at the nearest M (log scale), or None."""
    for table in load_tables():
        by_m = table.get(gpu_name(), {}).get(key)
        if by_m:
            nearest = min(by_m, key=lambda m: abs(math.log2(int(m)) - math.log2(max(M, 1))))
            return KernelConfig(**by_m[nearest])
    return None


def get_config(M: int, E: int, N: int, K: int, topk: int, dtype: torch.dtype, variant: str) -> KernelConfig:
    """The configuration for one launch: tuned if a table has this problem, else a heuristic.

    Within a problem's table the entry with the nearest M (on a log scale) is taken.
    """
    if runtime.INTERPRETED:
        return CPU_CONFIG
    tuned = tuned_config(M, problem_key(E, N, K, topk, dtype, variant))
    if tuned is not None:
        return tuned
    itemsize = torch.empty(0, dtype=dtype).element_size()
    return heuristic_config(M, topk, E, variant, itemsize, smem_limit(), N=N)


#: The FP8 kernel in the interpreter: K steps of one 128-wide scale group each.
CPU_FP8_CONFIG = KernelConfig(block_m=16, block_n=128, block_k=128, group_m=1, num_warps=4, num_stages=1)


#: The Gluon FP8 kernel's configurations (kernels/gluon_fp8_kernel.py), as measured on one H200:
#: 128-row tiles for the plain GEMM (two warpgroups of 64 rows), and for the layer either the fused
#: quantising epilogue (64 rows: what the registers hold) or the plain kernel plus a separate
#: SiLU-and-quantise pass, each with its down GEMM on the same alignment.
GLUON_PLAIN = KernelConfig(block_m=128, block_n=128, block_k=128, group_m=8, num_warps=8, num_stages=4,
                           short_tails=False, gluon=True)
GLUON_FUSED_UP = replace(GLUON_PLAIN, block_m=64)
GLUON_FUSED_DOWN = replace(GLUON_PLAIN, block_m=64, num_warps=4, num_stages=6)
#: The sums rescaled in place (``rescale``): one fp32 tile per 128 columns, so the gate/up tile holds
#: gate and up for 128 rows with its quantising epilogue, and a plain or down tile is 256 wide; each
#: warpgroup is its own partition (``num_warps`` 4, the split form: the faster of the two measured).
GLUON_RESCALED = replace(GLUON_PLAIN, num_warps=4, rescale=True)
GLUON_RESCALED_WIDE = replace(GLUON_RESCALED, block_n=256)
#: A 256-wide tile copied out through TMA holds 64 KB of bf16 in shared memory beside its stages:
#: room for 3 (measured level with 4 in the seventeenth session's sweep).
TMA_WIDE_STAGES = 3
#: The FP8 layer copies out tiles of this many rows or more, where an expert averages
#: :data:`GLUON_RESCALED_ROWS` rows or more (:func:`layer_copies_out`).
TMA_STORE_MIN_BLOCK_M = 128


def copied_out(config: KernelConfig) -> KernelConfig:
    """``config`` with its tiles leaving through TMA copies (``tma_store``), as the FP8 layer runs its
    Gluon GEMMs: their C is in sorted order, which a copy needs. A 256-wide tile keeps at most
    :data:`TMA_WIDE_STAGES` stages; the ``tl`` kernel and the two-wave form (256 rows) are returned
    as they are (they store with ``tl.store`` / ``gl.store``)."""
    if not config.gluon or config.block_m > 128:
        return config
    stages = min(config.num_stages, TMA_WIDE_STAGES) if config.block_n > 128 else config.num_stages
    return replace(config, tma_store=True, num_stages=stages)


#: Where the heuristic takes the Gluon kernel, in an expert's average rows (measured: the first GEMM
#: gains from 128 rows on, the layer from 32). From :data:`GLUON_RESCALED_ROWS` the layer takes the
#: 128-row rescaled pair instead of the fused 64-row one: measured on an H100 with the kernel as it
#: stands (split, copied out, yield-edited) at the batch sizes of three models in
#: ``data/h100_fp8_tile_height.csv`` (notebook 07's Appendix A, which counts them), it was faster at
#: every one from 171 rows an expert up and slower at all but one from 128 to 160; under 128 rows now
#: one and now the other won, with no order in the rows, and the 64-row pair stays there.
GLUON_MIN_ROWS = {"plain": 128, "gated": 32}
GLUON_RESCALED_ROWS = 168


def layer_copies_out(config: KernelConfig, rows_per_expert: int) -> bool:
    """Whether the FP8 layer copies its Gluon tiles out through TMA (:func:`copied_out`): tiles of
    :data:`TMA_STORE_MIN_BLOCK_M` rows where an expert averages :data:`GLUON_RESCALED_ROWS` rows or
    more. From 256 rows the copies made the layer faster in every run on an H100
    (``data/h100_fp8_tma_store.csv``, read in notebook 07's Appendix A); from 168 the 128-row pair
    was measured copied out against the 64-row pair (``data/h100_fp8_tile_height.csv``). The fused
    64-row forms measured level or slower with the copies and keep ``gl.store``, and so do 128-row
    tiles under :data:`GLUON_RESCALED_ROWS`, which a tuned table may choose: not measured with the copies."""
    return config.gluon and config.block_m >= TMA_STORE_MIN_BLOCK_M and rows_per_expert >= GLUON_RESCALED_ROWS


#: Where the ``tl`` kernel's untuned tiles count K as long (DeepSeek-V3's and Kimi-K2's hidden size;
#: Qwen3-30B-A3B's GEMMs and every down GEMM here are shorter): 3 stages up to 16 rows an expert,
#: 256-wide tiles from 64 (both measured on an H100, measurements/scripts/fp8_small_m_sweep.py).
LONG_K = 4096
#: The most weight bytes one wave of 256-wide plain tiles may stream at once and still find them in
#: the L2 (50 MB on an H100 or H200) beside the activations: see :func:`wave_weight_bytes`.
RESCALED_WAVE_BYTES = 40 << 20


def wave_weight_bytes(rows_per_expert: int, K: int, block_n: int = 256, block_m: int = 128) -> int:
    """The e4m3 weight bytes that one wave of tiles (one program per SM) reads at once.

    In the grouped order the tiles of one weight column block run side by side, one per row block
    of its expert; a wave of ``sm_count()`` tiles then covers ``SMs / row blocks`` column blocks of
    ``block_n x K`` bytes each. On an H100 the 256-wide tile won where this stayed under the L2
    (Qwen3-30B-A3B, 9 and 35 MB) and lost where it did not (DeepSeek-V3 at M = 16384, 60 MB: the L2
    at 100% of its peak and DRAM at 2.7 TB/s in Nsight Compute; Qwen3 at M = 1024, 69 MB).
    """
    row_blocks = max(1.0, rows_per_expert / block_m)
    return int(runtime.sm_count() / row_blocks * block_n * K)


def gluon_fp8_available() -> bool:
    """A Hopper GPU and a Triton with Gluon: where the Gluon FP8 kernel runs."""
    return HAVE_GLUON and runtime.ON_GPU and torch.cuda.get_device_capability()[0] == 9


def fp8_heuristic_config(M: int, topk: int, E: int, variant: str = "plain", *, N: int | None = None,
                         K: int | None = None, kernel: str | None = None) -> KernelConfig:
    """An untuned choice for Part 7's FP8 GEMMs on a GPU: ``kernel`` "tl" (:mod:`.fp8_kernel`'s
    kernel), "gluon" (:mod:`.gluon_fp8_kernel`'s) or None (Gluon where it ran faster, on Hopper).

    K steps are 128 wide (one scale group each). BLOCK_N is 128 for the gate/up GEMM: it quantises
    its output per 128 columns in the epilogue, so its tiles must hold whole groups. For the ``tl``
    kernel, row blocks follow the bf16 heuristic (about twice an expert's rows); under 64 rows the
    operands are swapped, so the weights' rows fill the tensor cores' 64-row tile instead of 16
    tokens, and up to 16 rows an expert the other GEMMs take 64-wide tiles (3 stages where ``K``,
    given, is :data:`LONG_K` or more). From 64 rows an expert they take 256-wide tiles at 8 warps,
    unless ``K`` is given and under :data:`LONG_K` (then 128 wide at 4 warps). The Gluon kernel takes the configurations
    above once an expert has enough rows (:data:`GLUON_MIN_ROWS`); the down GEMM follows the gate/up
    GEMM's choice (the layer's). From
    :data:`GLUON_RESCALED_ROWS` the layer rescales its sums in place, and so does the plain GEMM where
    one wave's weights fit the L2 (``K`` given, :func:`wave_weight_bytes`).
    """
    rows_per_expert = max(1, M * topk // E)
    gated = variant == "gated"
    if kernel == "gluon" or (kernel is None and variant in GLUON_MIN_ROWS and gluon_fp8_available()
                             and rows_per_expert >= GLUON_MIN_ROWS[variant]):
        if variant == "plain":
            fits = K is not None and wave_weight_bytes(rows_per_expert, K) <= RESCALED_WAVE_BYTES
            return GLUON_RESCALED_WIDE if fits else GLUON_PLAIN
        if rows_per_expert >= GLUON_RESCALED_ROWS:
            return GLUON_RESCALED if variant == "gated" else GLUON_RESCALED_WIDE
        return GLUON_FUSED_UP if variant == "gated" else GLUON_FUSED_DOWN
    if rows_per_expert <= 16:
        # Without the quantising epilogue a tile may be 64 wide: twice the programs over the few
        # weight rows a decode step reads, and over a long K (the hidden size of DeepSeek-V3 or
        # Kimi-K2) 3 stages, so more programs fit an SM (measured on an H100:
        # measurements/scripts/fp8_small_m_sweep.py).
        long_k = K is not None and K >= LONG_K
        cfg = KernelConfig(block_m=16 if rows_per_expert <= 4 else 32, block_n=128 if gated else 64, block_k=128,
                           num_warps=4, num_stages=3 if long_k and not gated else 4, use_tma=True,
                           short_tails=False, swap_ab=True)
    elif rows_per_expert < 64:
        cfg = KernelConfig(block_m=64, block_n=128, block_k=128, num_warps=4, num_stages=4, use_tma=True,
                           short_tails=False)
    else:
        # 64-row tiles, as the tuner chose on all three FP8 models at M >= 1024 (H200); gated
        # 128x128 tiles keep three fp32 tiles live per K step and spill (6x slower). Over a shorter K
        # 128-wide tiles at 4 warps beat 256-wide ones at 8 (1.03x to 1.16x on an H100); a caller
        # without K keeps the wide tile, as before that sweep.
        wide = not gated and (K is None or K >= LONG_K)
        cfg = KernelConfig(block_m=64, block_n=256 if wide else 128, block_k=128, num_warps=8 if wide else 4,
                           num_stages=4, use_tma=True, short_tails=False)
    return cfg


def fp8_config(M: int, E: int, N: int, K: int, topk: int, variant: str, kernel: str | None = None) -> KernelConfig:
    """Part 7's configuration for one FP8 GEMM: tuned (dtype ``float8_e4m3fn`` in the tables) or the
    heuristic. The table's entry says which kernel won at that M (``gluon``); ``kernel="tl"`` asks
    for the ``tl`` kernel's best (kept under the variant ``<variant>-tl`` where Gluon displaced it)."""
    if kernel not in (None, "tl", "gluon"):
        raise ValueError(f"kernel: expected None, 'tl' or 'gluon', got {kernel!r}")
    if runtime.INTERPRETED:
        return CPU_FP8_CONFIG
    key = problem_key(E, N, K, topk, torch.float8_e4m3fn, variant)
    tuned = tuned_config(M, key)
    if kernel == "tl" and (tuned is None or tuned.gluon):
        tuned = tuned_config(M, key + "-tl")
    if tuned is not None and (kernel is None or tuned.gluon == (kernel == "gluon")):
        if not tuned.gluon or gluon_fp8_available():
            return tuned
    return fp8_heuristic_config(M, topk, E, variant, N=N, K=K, kernel=kernel or ("tl" if not gluon_fp8_available()
                                                                                 else None))
