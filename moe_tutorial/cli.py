"""``moe-tutorial`` / ``python -m moe_tutorial``: the ``bench`` and ``tune`` commands.

``bench`` sweeps implementations x model shapes x batch sizes on the device it finds and writes
a CSV (:data:`moe_tutorial.perf.results.FIELDS`) and PNG plots; ``tune`` finds Part 4's best launch
configurations for this GPU and saves them where the package looks first.
"""
from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

import matplotlib
import torch

from . import runtime
from .checks import kernel_dtypes_expected
from .figures.perf import save_bench_figures
from .kernels.configs import user_table_path
from .perf import tuning
from .perf.bench import ALL_GEMMS, CPU_BATCH_SIZES, CPU_SHAPE, GEMMS, INTERPRETER_NOTE, STEP, default_plan, run_bench
from .perf.registry import BY_NAME, LAYER_IMPLS
from .perf.report import fraction_table, geomean_table, skipped_reasons, time_table
from .perf.timing import PROTOCOLS
from .perf.tuning import REFUSAL, VARIANTS, results_table
from .shapes import BATCH_SIZES, HEADLINE_MODELS, MODEL_SHAPES, ModelShape, get_shape

#: dtype names accepted on the command line.
DTYPES = {"float32": "float32", "fp32": "float32", "float16": "float16", "fp16": "float16",
          "half": "float16", "bfloat16": "bfloat16", "bf16": "bfloat16"}
#: On the CPU, named model shapes are refused above this much weight memory.
CPU_MAX_WEIGHT_BYTES = 2e9


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def _int_list(text: str) -> tuple[int, ...]:
    items = [t for t in text.replace(" ", "").split(",") if t]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list of positive integers, e.g. 1,64,4096")
    values = []
    for t in items:
        try:
            values.append(_positive_int(t))
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(f"batch sizes must be positive integers, got {t!r} in {text!r}") from None
    return tuple(dict.fromkeys(values))


def _choice_list(choices, what: str):
    def parse(text: str) -> tuple[str, ...]:
        items = [t for t in text.replace(" ", "").split(",") if t]
        bad = [t for t in items if t not in choices]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(map(repr, bad)) or repr(text)}; "
                                             f"choose from {', '.join(choices)}")
        return tuple(dict.fromkeys(items))
    return parse


def _dtype(text: str) -> str:
    if text.lower() not in DTYPES:
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r}; choose from float32, float16, bfloat16")
    return DTYPES[text.lower()]


def _tune_dtype(text: str) -> str:
    """tune's --dtype: the bench's dtypes, or float8_e4m3fn (fp8) for Part 7's FP8 kernel."""
    if text.lower() in ("fp8", "float8_e4m3fn", "e4m3"):
        return "float8_e4m3fn"
    return _dtype(text)


def _model_list(text: str):
    if text.strip().lower() == "all":
        return list(MODEL_SHAPES.values())
    try:
        return [get_shape(t) for t in text.split(",") if t.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{e} (or 'all')") from None


def _model(text: str):
    try:
        return get_shape(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the descriptions' line breaks (lists of implementations and models)."""


def _text(template: str) -> str:
    """A description written indented in the source, flush left for ``--help``."""
    return textwrap.dedent(template).strip()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="moe-tutorial",
        description="Benchmark and tune the MoE implementations of the series 'Fused MoE, from loops to Triton'.",
        epilog="Run `moe-tutorial bench --help` or `moe-tutorial tune --help` for each command's options.",
        formatter_class=_Formatter)
    sub = parser.add_subparsers(dest="command", metavar="{bench,tune}")
    sub.required = True
    impl_lines = "\n".join(textwrap.fill(BY_NAME[name].help, 100, initial_indent=f"  {name:17s}",
                                         subsequent_indent=" " * 19) for name in BY_NAME)
    model_lines = "\n".join(f"  {s.name:19s}E={s.num_experts:<4d}topk={s.topk}  hidden={s.hidden:<5d}"
                            f"intermediate={s.intermediate}" for s in MODEL_SHAPES.values())
    c = CPU_SHAPE
    bench = sub.add_parser(
        "bench", formatter_class=_Formatter,
        help="time every implementation on model shapes and batch sizes; CSV + PNG plots",
        description=_text("""\
        Time implementations x model shapes x batch sizes on the device found, check each result
        against a float64 reference, and compare every time with the roofline floor.

        On a GPU the ceilings are measured first, in the same run and under the same timer as the
        cases: the matmul rate (an 8192^3 matmul in the run's dtype), the read-only bandwidth (a
        kernel that only reads 8 GB), the copy bandwidth (for reference) and one kernel launch.
        Each case then runs once with all input checks and is compared with the reference on a
        few rows; the implementations of a case are then timed in order and in reverse order,
        keeping each one's lower median, under the chosen protocol. Results: ms, TFLOP/s, GB/s,
        the floor max(bytes / read bandwidth, FLOPs / matmul rate) + one launch, and the
        fraction of it reached (floor_ms / ms); every row names its protocol.
        Defaults: models {models}; M = {gpu_m}; bfloat16.

        On the CPU: Triton kernels run in the interpreter and are timed with perf_counter; those
        timings teach nothing about GPU speed. Defaults: a toy shape (E={E}, N={N}, K={K},
        topk={topk}), M = {cpu_m}, float32 (the interpreter mishandles bf16). Named model shapes
        are too large for it.

        gemm "first" is the gate/up GEMM [M, topk, N] (N = 2 * intermediate, K = hidden); gemm
        "layer" is the whole layer (moe_layer), whose implementations are {layer_impls}.

        Status column: "ok"; "wrong" (failed the check against the float64 reference: bf16/fp16
        1e-2, fp32 1e-5 relative error; still timed); "skipped: <reason>".
        """).format(models=", ".join(HEADLINE_MODELS), gpu_m=",".join(map(str, BATCH_SIZES)), E=c.num_experts,
                    N=2 * c.intermediate, K=c.hidden, topk=c.topk, cpu_m=",".join(map(str, CPU_BATCH_SIZES)),
                    layer_impls=", ".join(LAYER_IMPLS))
        + f"\n\nImplementations:\n{impl_lines}\n\nModels (--models, case-insensitive):\n{model_lines}")
    shape = bench.add_argument_group("what to run")
    shape.add_argument("--models", type=_model_list, default=None, metavar="NAMES",
                       help="comma-separated model names from the list above, or 'all' "
                            "(default: the three headline models on a GPU, none on the CPU)")
    _add_custom_shape(shape)
    shape.add_argument("--batch-sizes", "-M", type=_int_list, default=None, metavar="M,M,...",
                       help="token counts M to sweep (default: see above; --quick uses fewer)")
    shape.add_argument("--impls", type=_choice_list(tuple(BY_NAME), "implementation"), default=None,
                       metavar="NAMES", help="comma-separated implementations; each gemm runs those it has "
                       "(default: all but Part 4's production steps; sorted-heuristic only where a tuned "
                       "table exists)")
    shape.add_argument("--gemm", type=_choice_list(ALL_GEMMS, "gemm"), default=GEMMS, metavar="first,layer",
                       help="which problems: the first GEMM, the whole layer, or both (default: both); 'step' is "
                            "the layer's forward + backward, as --backward adds it")
    shape.add_argument("--backward", action="store_true",
                       help="also time the layer's forward + backward (gemm 'step', Part 8): moe_layer with "
                            "autograd for loop, indexing and sorted (Part 8's kernels), the torch._grouped_mm "
                            "composition and Liger-Kernel's fused_moe where they run; each checked on dx")
    shape.add_argument("--dtype", type=_dtype, default=None,
                       help="bfloat16 (GPU default), float16, or float32 (the only one on the CPU)")
    shape.add_argument("--quick", action="store_true",
                       help="a short sweep: one model (Qwen3-30B-A3B) and M = 1,64,4096 on a GPU; M = 1,8 on the CPU")
    timing = bench.add_argument_group("how to time")
    timing.add_argument("--protocol", choices=PROTOCOLS, default="cold-l2",
                        help="cold-l2: one call per CUDA graph, a 256 MB buffer read before each replay so "
                             "L2 holds none of the call's data and no dirty lines, events around the replay, "
                             "median of 30 (how independent measurements of these kernels are made). "
                             "cold-l2-zero: the same with the buffer zeroed instead (dirty lines the call pays "
                             "to write back; the protocol of data measured before 2026-12-02). "
                             "rotated: many calls per graph cycling "
                             "through several routings, median of 10 replays per call (launch gaps shrink as in "
                             "an engine at decode). The Part 1 loop waits on the host and is timed with events, "
                             "L2 flushed before each call, either way; so are calls slower than 20 ms. On the "
                             "CPU only perf_counter exists (default: cold-l2)")
    timing.add_argument("--max-seconds-per-case", type=_positive_float, default=2.0, metavar="S",
                        help="one call is timed first; a case slower than S seconds per call is skipped "
                             "('skipped: slower than S s per call'), a slow one is timed a few times only (default: 2)")
    timing.add_argument("--max-minutes", type=_positive_float, default=None, metavar="MIN",
                        help="stop starting new cases after MIN minutes (the rest are 'skipped: over the "
                             "budget'); the CSV is rewritten after every case either way (default: no limit)")
    timing.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    out = bench.add_argument_group("output")
    out.add_argument("--out", type=Path, default=Path("moe_bench"), metavar="DIR",
                     help="folder for bench.csv and one PNG per model (time and fraction of the floor vs M; "
                          "default: ./moe_bench)")
    out.add_argument("--no-progress", action="store_true", help="no progress bar over the cases (it goes to stderr)")
    bench.set_defaults(subparser=bench)   # so that errors print the subcommand's own usage

    tune = sub.add_parser(
        "tune", formatter_class=_Formatter,
        help="find Part 4's best launch configurations for this GPU (GPU only)",
        description=_text("""\
        Search block sizes, GROUP_M, warps, stages (and the TMA path on Hopper) for Part 4's
        sorted kernel on one model's GEMMs (or any shape named with --E --N --K --topk), timing each
        candidate under the cold-l2 protocol (one call per CUDA graph, L2 flushed) and keeping
        only candidates whose output matches the untuned heuristic's (relative error < 1e-2).
        The best configuration per (problem, M) is merged into a JSON table
        {gpu: {problem: {M: config}}} that the package reads before its own tables, so
        `moe-tutorial bench` and every notebook use it from then on (bench then also times
        'sorted-heuristic', the untuned kernel, to show the gain).

        Variants: plain = the first GEMM as the bench times it (x [M, K] by w13 [E, 2I, K]);
        gated = the layer's gate/up GEMM with silu(gate) * up fused ([pairs, I] out);
        down = the layer's down GEMM (w2 [E, K, I]) with the router weights fused, reading its
        activations in sorted order as the layer does.

        Refused on the CPU: the interpreter has no speed to tune.
        """))
    tune.add_argument("--model", type=_model, default=None, metavar="NAME",
                      help=f"the model whose shapes to tune: {', '.join(MODEL_SHAPES)}; or name any other shape "
                           "with --E, --N, --K and --topk")
    _add_custom_shape(tune)
    tune.add_argument("--batch-sizes", "-M", type=_int_list, default=BATCH_SIZES, metavar="M,M,...",
                      help="token counts to tune for; the package takes the nearest tuned M on a log scale "
                           "(default: 1,8,64,256,1024,4096,16384)")
    tune.add_argument("--variants", type=_choice_list(VARIANTS, "variant"), default=VARIANTS,
                      metavar="plain,gated,down", help="which GEMMs to tune (default: all three)")
    tune.add_argument("--dtype", type=_tune_dtype, default="bfloat16",
                      help="bfloat16 (default), float16 or float32 for Part 4's kernel; fp8 (float8_e4m3fn) "
                           "for Part 7's block-FP8 kernel (weights quantised from random bf16 ones)")
    tune.add_argument("--max-minutes", type=_positive_float, default=8.0, metavar="MIN",
                      help="total time budget, shared evenly by the (variant, M) problems; the table is "
                           "written after each problem")
    tune.add_argument("--out", type=Path, default=None, metavar="FILE",
                      help="JSON table to merge into (default: configs.user_table_path(), i.e. "
                           "$MOE_TUTORIAL_CONFIG_DIR/tuned_configs.json or ~/.cache/moe_tutorial/tuned_configs.json)")
    tune.add_argument("--seed", type=int, default=0, help="seed of the random inputs (default: 0)")
    tune.set_defaults(subparser=tune)
    return parser


def _add_custom_shape(group) -> None:
    """The options that name a shape no table knows: --E, --N, --K and --topk, all four together."""
    group.add_argument("--E", type=_positive_int, default=None, help="custom shape: number of experts")
    group.add_argument("--N", type=_positive_int, default=None,
                       help="custom shape: the first GEMM's N = 2 * intermediate (even)")
    group.add_argument("--K", type=_positive_int, default=None, help="custom shape: hidden size K")
    group.add_argument("--topk", type=_positive_int, default=None,
                       help="custom shape: experts per token (1 <= topk <= E). The four custom options "
                            "go together and name a shape called 'custom'")


def _custom_shape(parser, args):
    given = {k: getattr(args, k) for k in ("E", "N", "K", "topk")}
    if not any(v is not None for v in given.values()):
        return None
    missing = [f"--{k}" for k, v in given.items() if v is None]
    if missing:
        parser.error(f"a custom shape needs --E, --N, --K and --topk together; missing {', '.join(missing)}")
    if args.topk > args.E:
        parser.error(f"--topk {args.topk} is larger than --E {args.E}: a token cannot pick more experts than exist")
    if args.N % 2:
        parser.error(f"--N {args.N} must be even: it is the first GEMM's N = 2 * intermediate (gate and up rows)")
    return ModelShape("custom", num_experts=args.E, topk=args.topk, hidden=args.K, intermediate=args.N // 2)


def plan_from_args(parser: argparse.ArgumentParser, args):
    """Turn ``bench``'s arguments into a :class:`moe_tutorial.perf.bench.BenchPlan`, or ``parser.error``."""
    plan = default_plan(quick=args.quick)
    dtype = getattr(torch, args.dtype) if args.dtype else plan.dtype
    if dtype not in runtime.KERNEL_DTYPES:
        parser.error(f"--dtype {args.dtype}: expected {kernel_dtypes_expected(dtype)}")
    custom = _custom_shape(parser, args)
    if args.models is not None or custom is not None:
        plan.shapes = list(args.models or []) + ([custom] if custom else [])
    if not runtime.ON_GPU:
        itemsize = torch.empty(0, dtype=dtype).element_size()
        for s in plan.shapes:
            size = 3 * s.num_experts * s.intermediate * s.hidden * itemsize
            if s.name != "custom" and size > CPU_MAX_WEIGHT_BYTES:
                parser.error(f"--models {s.name}: its weights take {size / 1e9:.1f} GB and the CPU interpreter runs "
                             "about a millisecond per program; on the CPU use a small custom shape "
                             "(--E 8 --N 64 --K 64 --topk 2) or run on a GPU")
    if args.batch_sizes:
        plan.batch_sizes = args.batch_sizes
    plan.dtype = dtype
    plan.gemms = args.gemm + ((STEP,) if args.backward and STEP not in args.gemm else ())
    plan.impls = args.impls
    plan.protocol = args.protocol
    plan.max_seconds = args.max_seconds_per_case
    plan.max_minutes = args.max_minutes or 0.0
    plan.seed = args.seed
    return plan


#: What the CPU run's table is, printed above it instead of fractions of a floor.
CPU_TIMES_HEADING = ("milliseconds per call in Triton's CPU interpreter (each implementation ran and matched the "
                     "float64 reference; no fraction of the floor is printed, since a CPU has no GPU floor):")


def run_bench_command(parser, args) -> int:
    matplotlib.use("Agg")   # files only; no display needed
    plan = plan_from_args(parser, args)
    if not runtime.ON_GPU:
        print(INTERPRETER_NOTE)
    out_dir = Path(args.out)
    csv_path = out_dir / "bench.csv"
    problem = _unwritable(out_dir)
    if problem:
        print(f"moe-tutorial bench: --out {out_dir}: {problem}", file=sys.stderr)
        return 2
    timer = f"protocol {plan.protocol}" if runtime.ON_GPU else "timer perf_counter (CPU only)"
    print(f"bench: {len(plan.shapes)} shape(s) x M = {','.join(map(str, plan.batch_sizes))} x "
          f"{'/'.join(plan.gemms)}, {str(plan.dtype).replace('torch.', '')}, {timer}; "
          f"rows go to {csv_path}")
    rows = run_bench(plan, csv_path=csv_path, progress=not args.no_progress)
    if not rows:
        print("nothing to run: no implementation applies to the chosen gemm(s)")
        return 0
    if runtime.ON_GPU:
        print("\nfraction of the roofline floor reached (1.00 = as fast as the hardware allows):")
        print(fraction_table(rows))
        for gemm in plan.gemms:
            if any(r["gemm"] == gemm for r in rows):
                print(f"\ngeometric mean over M of the fraction of the floor, {gemm}:")
                print(geomean_table(rows, gemm))
    else:
        # A CPU has no GPU floor: a fraction of the CPU's own "ceilings" (a launch of 0 us, a read
        # rate that varies 3x between runs) would read as a verdict it is not.
        print(f"\n{CPU_TIMES_HEADING}")
        print(time_table(rows))
    reasons = skipped_reasons(rows)
    if reasons:
        print("\nskipped cases:\n" + reasons)
    pngs = save_bench_figures(rows, out_dir)
    print(f"\nwrote {csv_path}" + "".join(f"\nwrote {p}" for p in pngs))
    if not runtime.ON_GPU:
        print(INTERPRETER_NOTE)
    return 0


def _unwritable(folder: Path) -> str | None:
    """Why ``folder`` cannot take the bench's files, or None when it can (it is created if needed)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".moe_tutorial_write_test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        return f"cannot write there ({e.strerror or e})"
    return None


def run_tune_command(parser, args) -> int:
    custom = _custom_shape(parser, args)
    if (args.model is None) == (custom is None):
        parser.error("name one shape to tune: --model NAME, or a custom shape with --E, --N, --K and --topk")
    shape = args.model or custom
    if not runtime.ON_GPU:
        print(f"moe-tutorial tune: {REFUSAL}", file=sys.stderr)
        return 1
    dtype = getattr(torch, args.dtype)
    out = args.out or user_table_path()
    print(f"tune: {shape.name} (E={shape.num_experts}, topk={shape.topk}, hidden={shape.hidden}, "
          f"intermediate={shape.intermediate}), variants {','.join(args.variants)}, "
          f"M = {','.join(map(str, args.batch_sizes))}, {args.dtype}, at most {args.max_minutes:g} min; table: {out}")
    results = tuning.tune(shape, args.batch_sizes, args.variants, dtype, out=out, max_minutes=args.max_minutes,
                   seed=args.seed)
    if results:
        same = (f"--models {shape.name}" if args.model else
                f"--E {shape.num_experts} --N {2 * shape.intermediate} --K {shape.hidden} --topk {shape.topk}")
        print("\n" + results_table(results))
        print(f"\nwrote {out}: `moe-tutorial bench {same}` now uses these configurations "
              "(and times 'sorted-heuristic' beside them); so does every launch of that shape")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``) and run the command; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "bench":
        return run_bench_command(args.subparser, args)
    return run_tune_command(args.subparser, args)
