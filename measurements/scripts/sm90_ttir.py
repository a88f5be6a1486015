"""Compile the production kernels for Hopper (sm90) on a CPU and keep their TTIR: a refactor's check.

A change that should leave a kernel as it was (arguments regrouped into tuples, flags renamed, a
module split) must leave its Triton IR as it was too, for the same flags, apart from names. This
compiles every launch the package makes of Part 4's kernel (plain, router weights, gated, sorted
activations through pointers and TMA, ragged K, fp32, short tails off), the persistent variant,
Part 7's ``tl`` FP8 kernel (plain, gated with a quantised output, down, swapped operands) and
Part 8's two backward kernels, through the package's own launchers, with bf16 or e4m3 CPU
tensors and a stand-in driver that names sm90 (``moe_tutorial.experiments.sm90``), and writes
each one's ``kernel.asm["ttir"]``, raw and with names and locations stripped:

    python3 measurements/scripts/sm90_ttir.py dump OUT_DIR              # this checkout's package
    python3 measurements/scripts/sm90_ttir.py compare OLD_CHECKOUT      # OLD_CHECKOUT's package against this one's

``compare`` dumps both (each in a child process with ``TRITON_INTERPRET=0``, the old one with
``PYTHONPATH`` set to OLD_CHECKOUT) and prints, per launch, "same" or the normalised diff.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import inspect
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

#: This checkout: the folder above this script that holds pyproject.toml.
ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())


#: An SSA value's name as MLIR prints it: %a_ptr, %arg3, %12, %acc:3 (its results), %acc#1 (one of them).
_VALUE = r"%[\w.$-]+(?:#\d+)?"


def normalise(ttir: str) -> str:
    """``ttir`` without source locations, function names and value names: what remains is the
    computation, its types and its argument specialisations (divisibility, constexprs folded).

    Constants are named by their value and type and listed sorted at the top: the canonicaliser
    hoists them to the function's entry in the order it met them, which says nothing about the
    computation. Every other value is numbered in the order it is defined or first used."""
    lines = [line for line in ttir.splitlines() if not line.startswith("#loc")]
    text = "\n".join(lines)
    loc = re.compile(r"\s*loc\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)")
    text = loc.sub("", text)
    text = re.sub(r"@[\w.$-]+", "@F", text)                       # function and callee names
    constant = re.compile(rf"^\s*({_VALUE}) = arith\.constant (.+)$")
    names: dict[str, str] = {}
    constants, body = set(), []
    for line in text.splitlines():
        m = constant.match(line)
        if m:
            names[m.group(1)] = f"%const<{m.group(2)}>"
            constants.add(f"    {names[m.group(1)]} = arith.constant {m.group(2)}")
        else:
            body.append(line)

    def rename(m: re.Match) -> str:                                 # %a_ptr, %arg3, %12 -> %v0, %v1 ...
        return names.setdefault(m.group(0), f"%v{len(names) - len(constants)}")
    renamed = [re.sub(_VALUE, rename, line) for line in body]
    return "\n".join(sorted(constants) + renamed) + "\n"


def k_loops(norm: str) -> list[str]:
    """The K loops of a normalised TTIR (each ``scf.for`` that carries values, to its closing
    brace), their values numbered afresh: what a change outside the loops leaves alone."""
    lines, loops = norm.splitlines(), []
    for i, line in enumerate(lines):
        if "scf.for" in line and "iter_args" in line:
            indent = len(line) - len(line.lstrip())
            end = next(j for j in range(i + 1, len(lines))
                       if lines[j].strip().startswith("}") and len(lines[j]) - len(lines[j].lstrip()) == indent)
            names: dict[str, str] = {}
            loops.append("\n".join(re.sub(r"%v\d+", lambda m: names.setdefault(m.group(0), f"%l{len(names)}"),
                                          x.strip()) for x in lines[i:end + 1]))    # depth apart too
    return loops


# ------------------------------------------------------------------ in the child process

def _patch_everywhere(name_or_obj, value, saved: list) -> None:
    """Bind ``value`` wherever a loaded moe_tutorial module holds ``name_or_obj`` (an attribute
    name, or the very object), so that the launchers find it whatever module they live in."""
    for module in [m for n, m in sys.modules.items() if n.startswith("moe_tutorial") and m is not None]:
        for attr, held in list(vars(module).items()):
            if (attr == name_or_obj) if isinstance(name_or_obj, str) else (held is name_or_obj):
                saved.append((module, attr, held))
                setattr(module, attr, value)


def _launcher(name: str, *modules: str):
    """``moe_tutorial.kernels.<module>.<name>`` from the first of ``modules`` that has it: the
    launchers moved between modules, and the comparison runs the old checkout's too."""
    for module in modules:
        try:
            found = importlib.import_module(f"moe_tutorial.kernels.{module}")
        except ImportError:
            continue
        if hasattr(found, name):
            return getattr(found, name)
    raise ImportError(f"{name} in none of {modules}")


def _cases():
    """``(name, call)`` for each launch; ``call()`` runs the package's launcher once."""
    import moe_tutorial  # noqa: F401,I001  (first: the package's modules, loaded for the launchers below)
    import torch
    from moe_tutorial.kernels import align, backward_kernel
    from moe_tutorial.kernels.configs import KernelConfig

    launch_sorted_gemm = _launcher("launch_sorted_gemm", "sorted_layer", "sorted_kernel")
    launch_fp8_gemm = _launcher("launch_fp8_gemm", "fp8_layer", "fp8_kernel")

    E, M, topk = 8, 64, 2
    pairs = M * topk
    ids = (torch.arange(pairs, dtype=torch.int32) % E).view(M, topk)

    def alignment(block_m: int):          # its shapes only: nothing may run on the CPU here
        rows = align.max_padded_rows(pairs, block_m, E)
        tensors = (torch.arange(rows, dtype=torch.int32), torch.zeros(rows // block_m, dtype=torch.int32),
                   torch.tensor([rows // block_m * block_m], dtype=torch.int32))
        return align.Alignment(tensors, block_m=block_m, num_experts=E, topk_ids=ids)

    def cfg(**kw):
        base = dict(block_m=64, block_n=128, block_k=64, group_m=8, num_warps=4, num_stages=3)
        return KernelConfig(**{**base, **kw})

    bf16, fp8 = torch.bfloat16, torch.float8_e4m3fn
    N, K = 1024, 2048
    cases = []

    def sorted_case(name, config, *, dtype=bf16, k=K, gated=False, router=False, a_sorted=False, c_sorted=False,
                    a_row_div=topk):
        def call():
            al = alignment(config.block_m)
            rows = al[0].numel()
            a = torch.zeros(rows if a_sorted else (M if a_row_div == topk else pairs), k, dtype=dtype)
            b = torch.zeros(E, 2 * N if gated else N, k, dtype=dtype)
            c = torch.zeros(rows if c_sorted else pairs, N, dtype=dtype)
            w = torch.ones(pairs) if router else None
            launch_sorted_gemm(a, b, c, w, al, pairs, 1 if a_sorted else a_row_div, config, gated=gated,
                               a_sorted=a_sorted, c_sorted=c_sorted)
        cases.append((name, call))

    sorted_case("sorted-plain", cfg(use_tma=False))
    sorted_case("sorted-plain-router-tma", cfg(use_tma=True), router=True)
    sorted_case("sorted-plain-ragged-k", cfg(use_tma=False, short_tails=False), k=2000)
    sorted_case("sorted-plain-fp32", cfg(use_tma=False), dtype=torch.float32)
    sorted_case("sorted-plain-bm16", cfg(block_m=16, block_n=64, use_tma=True))
    sorted_case("sorted-gated", cfg(use_tma=False), gated=True)
    sorted_case("sorted-gated-c-sorted-tma", cfg(use_tma=True), gated=True, c_sorted=True)
    sorted_case("sorted-down-gathered", cfg(use_tma=True), router=True, a_row_div=1)
    sorted_case("sorted-down-a-sorted", cfg(block_m=32, use_tma=True), router=True, a_sorted=True)
    sorted_case("sorted-down-a-sorted-tma", cfg(block_m=64, use_tma=True), router=True, a_sorted=True)
    sorted_case("sorted-down-a-sorted-ptrs", cfg(block_m=64, use_tma=False), router=True, a_sorted=True)
    persistent = dict(persistent=True, short_tails=False, block_m=128, block_n=128)
    sorted_case("persistent-plain-tma", cfg(use_tma=True, **persistent))
    sorted_case("persistent-plain", cfg(use_tma=False, **persistent), router=True)
    sorted_case("persistent-gated-c-sorted", cfg(use_tma=True, **persistent), gated=True, c_sorted=True)
    sorted_case("persistent-down-a-sorted-tma", cfg(use_tma=True, **persistent), router=True, a_sorted=True)

    def fp8_case(name, config, *, gated=False, quant=False, router=False, down=False):
        def call():
            al = alignment(config.block_m)
            rows = al[0].numel()
            n = N
            a = torch.zeros(rows if down else M, K, dtype=fp8)
            a_s = torch.ones(a.shape[0], K // 128)
            b = torch.zeros(E, 2 * n if gated else n, K, dtype=fp8)
            b_s = torch.ones(E, b.shape[1] // 128, K // 128)
            c = torch.zeros(rows if quant else pairs, n, dtype=fp8 if quant else bf16)
            c_s = torch.ones(rows, n // 128) if quant else None
            w = torch.ones(pairs) if router else None
            if "sorted_rows" in inspect.signature(launch_fp8_gemm).parameters:   # before Part 4's vocabulary
                launch_fp8_gemm(a, a_s, b, b_s, c, al, pairs, 0 if down else topk, config, router_weights=w,
                                c_scale=c_s, gated=gated, sorted_rows=quant or down)
            else:
                launch_fp8_gemm(a, a_s, b, b_s, c, al, pairs, 1 if down else topk, config, router_weights=w,
                                c_scale=c_s, gated=gated, a_sorted=down, c_sorted=quant)
        cases.append((name, call))

    steps = dict(block_k=128, short_tails=False)
    fp8_case("fp8-plain", cfg(use_tma=False, **steps))
    fp8_case("fp8-plain-router-tma", cfg(use_tma=True, **steps), router=True)
    fp8_case("fp8-gated-quant-tma", cfg(use_tma=True, **steps), gated=True, quant=True)
    fp8_case("fp8-gated-quant", cfg(use_tma=False, **steps), gated=True, quant=True)
    fp8_case("fp8-down-tma", cfg(use_tma=True, **steps), router=True, down=True)
    fp8_case("fp8-swapped-plain", cfg(block_m=16, use_tma=True, swap_ab=True, **steps))
    fp8_case("fp8-swapped-gated-quant", cfg(block_m=16, use_tma=True, swap_ab=True, **steps), gated=True, quant=True)
    fp8_case("fp8-swapped-down", cfg(block_m=16, use_tma=True, swap_ab=True, **steps), router=True, down=True)

    def rows_case(name, epilogue, b_layout, *, a_sorted=False, tma=True):
        def call():
            config = cfg(block_m=64, use_tma=tma)
            al = alignment(64)
            rows = al[0].numel()
            inter = N
            if epilogue == "save_swiglu":
                a, b = torch.zeros(M, K, dtype=bf16), torch.zeros(E, 2 * inter, K, dtype=bf16)
                kw = dict(h=torch.zeros(rows, 2 * inter, dtype=bf16), act=torch.zeros(rows, inter, dtype=bf16))
                div = topk
            elif epilogue == "dswiglu":
                a, b = torch.zeros(M, K, dtype=bf16), torch.zeros(E, K, inter, dtype=bf16)
                kw = dict(out=torch.zeros(rows, 2 * inter, dtype=bf16), h=torch.zeros(rows, 2 * inter, dtype=bf16),
                          act=torch.zeros(rows, inter, dtype=bf16), router_weights=torch.ones(pairs),
                          ds_partial=torch.zeros(pairs, inter // 128))
                div = topk
            else:
                a, b = torch.zeros(rows, 2 * inter, dtype=bf16), torch.zeros(E, 2 * inter, K, dtype=bf16)
                kw = dict(out=torch.zeros(pairs, K, dtype=bf16))
                div = 1
            backward_kernel.launch_rows_gemm(a, b, al, pairs, div, config, epilogue=epilogue, b_layout=b_layout,
                                             a_sorted=a_sorted, **kw)
        cases.append((name, call))

    rows_case("rows-save-swiglu", "save_swiglu", "nk")
    rows_case("rows-dswiglu", "dswiglu", "kn")
    rows_case("rows-scatter-dx", "scatter", "kn", a_sorted=True)
    rows_case("rows-scatter-dx-ptrs", "scatter", "kn", a_sorted=True, tma=False)

    def grad_case(name, left_sorted, right_sorted):
        def call():
            al = alignment(64)
            rows = al[0].numel()
            P, Q = K, N
            left = torch.zeros(rows if left_sorted else M, P, dtype=bf16)
            right = torch.zeros(rows if right_sorted else M, Q, dtype=bf16)
            out = torch.zeros(E, P, Q, dtype=bf16)
            starts = torch.arange(E + 1, dtype=torch.int32) * (rows // E)
            backward_kernel.launch_expert_grad(left, right, out, al, starts, pairs, topk, cfg(block_m=128),
                                               left_sorted=left_sorted, right_sorted=right_sorted)
        cases.append((name, call))

    grad_case("grad-dw2", False, True)
    grad_case("grad-dw13", True, False)
    return cases


def dump(out: Path) -> int:
    """Compile every case with this process's package (TRITON_INTERPRET=0) and write its TTIR."""
    if os.environ.get("TRITON_INTERPRET", "0") != "0":
        print("run with TRITON_INTERPRET=0 (compare does)", file=sys.stderr)
        return 2
    from moe_tutorial.experiments.sm90 import _Capture, _Sm90Driver  # noqa: I001  (moe_tutorial before triton)
    import triton
    from triton.runtime import driver

    driver.set_active(_Sm90Driver())
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.*"):
        old.unlink()
    cases = _cases()
    saved: list = []
    _patch_everywhere("_tma_can_read", lambda t: True, saved)      # CPU tensors, read as Hopper would
    _patch_everywhere("tma_can_read", lambda t: True, saved)
    _patch_everywhere("sm_count", lambda: 132, saved)
    kernels = {m.__name__ + "." + n: obj for m in list(sys.modules.values())
               if m is not None and getattr(m, "__name__", "").startswith("moe_tutorial.kernels")
               for n, obj in vars(m).items() if isinstance(obj, triton.runtime.jit.JITFunction)
               and n.endswith("_kernel")}
    captures = {}
    for obj in {id(k): k for k in kernels.values()}.values():
        captures[id(obj)] = _Capture(obj)
        _patch_everywhere(obj, captures[id(obj)], saved)
    failed = 0
    for name, call in cases:
        for capture in captures.values():
            capture.compiled.clear()
        try:
            call()
            compiled = [c for capture in captures.values() for c in capture.compiled]
            (out / f"{name}.ttir").write_text("\n\n".join(c.asm["ttir"] for c in compiled))
            (out / f"{name}.norm").write_text("".join(normalise(c.asm["ttir"]) for c in compiled))
            print(f"{name}: {len(compiled)} kernel(s)")
        except Exception as err:       # a case that does not compile is reported, the rest go on
            failed += 1
            cause = f"\ncaused by {type(err.__cause__).__name__}: {err.__cause__}" if err.__cause__ else ""
            (out / f"{name}.error").write_text(f"{type(err).__name__}: {err}{cause}")
            print(f"{name}: FAILED {type(err).__name__}: {str(err)[:300]}{cause[:300]}")
    print(f"triton {triton.__version__}, {len(cases) - failed} of {len(cases)} compiled")
    return 0


def _dump_in_child(checkout: Path, out: Path) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": str(checkout)}
    run = subprocess.run([sys.executable, str(Path(__file__).resolve()), "dump", str(out)], env=env, cwd=checkout,
                         capture_output=True, text=True)
    print(f"== {checkout}\n{run.stdout}{run.stderr[-3000:] if run.returncode else ''}")


def compare(old: Path, new: Path, keep: Path | None, verbose: bool = False) -> int:
    """Dump both checkouts and print per case "same" or the normalised diff; 1 if any differs."""
    with tempfile.TemporaryDirectory() as tmp:
        base = keep or Path(tmp)
        _dump_in_child(old, base / "old")
        _dump_in_child(new, base / "new")
        differ = 0
        for path in sorted((base / "old").glob("*.norm")):
            mine = base / "new" / path.name
            if not mine.exists():
                print(f"{path.stem}: missing in {new}")
                differ += 1
                continue
            a, b = path.read_text().splitlines(), mine.read_text().splitlines()
            if a == b:
                print(f"{path.stem}: same ({len(a)} lines)")
            else:
                differ += 1
                same_loops = k_loops(path.read_text()) == k_loops(mine.read_text())
                print(f"{path.stem}: DIFFERS ({len(a)} lines, {len(b)} now); its K loop"
                      f"{' is the same' if same_loops else ' differs too'}")
                if verbose:
                    print("\n".join(list(difflib.unified_diff(a, b, "old", "new", lineterm="", n=1))[:60]))
        print(f"{differ} launch(es) differ" if differ else "every launch's TTIR is the same, names apart")
        return 1 if differ else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dump", help="write OUT_DIR/<launch>.ttir and .norm for this checkout")
    d.add_argument("out", type=Path)
    c = sub.add_parser("compare", help="OLD_CHECKOUT's TTIR against this checkout's, names apart")
    c.add_argument("old", type=Path)
    c.add_argument("--keep", type=Path, help="keep both dumps here")
    c.add_argument("--diff", action="store_true", help="print the start of each differing launch's diff")
    args = parser.parse_args(argv)
    if args.command == "dump":
        return dump(args.out)
    return compare(args.old.resolve(), ROOT, args.keep, args.diff)


if __name__ == "__main__":
    sys.exit(main())
