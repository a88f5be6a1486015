"""Let a warp yield inside its long runs of multiplies: an edit of the machine code after ``ptxas``.

The rescaled FP8 kernel's MMA warps spend a K step on a run of 64 ``FMUL``s per accumulator (the
rescale), each able to issue the cycle after the last. A warp scheduler keeps issuing from the warp
it issued last until that warp stalls, so another warp on the same scheduler, one whose next
instruction is its warpgroup's MMA, can wait for the whole run; and a warpgroup's MMA starts only
when all four of its warps have issued it. Each Hopper instruction carries scheduling bits beside
its opcode (the *control bits*, which ``ptxas`` sets): a stall count, a *yield* bit (here set means
"do not yield"; clear lets the scheduler switch to another warp after this instruction) and
*reuse* flags (keep an operand in the register reuse cache for the next instruction). A register
kept for reuse is lost when the warp yields, so the two go together.

DeepSeek's DeepGEMM found that clearing the yield bit (and the reuse flag beside it) on every other
multiply of such a run, in an FP8 GEMM's promotion, gains up to about 10% on H800; it edits the
cubin after compiling. This module does the same edit to a Triton cubin, for an experiment:

* :func:`instructions` reads a cubin's machine code (``cuobjdump``, shipped with Triton) with each
  instruction's two 64-bit words;
* :func:`multiply_runs` finds runs of at least 16 ``FMUL``/``FFMA`` in a row;
* :func:`interleave_yields` returns the cubin with every other multiply of each run that keeps its
  second operand for reuse yielding instead, and how many it changed. Only those two bits change:
  the code computes the same (the reuse cache is a hint; without it the operand is read from the
  register file);
* :func:`edit_compiled_forms` has every form of a Triton kernel compiled from then on with a given
  constexpr true edited before it is loaded (a hook Triton calls after each compile);
  :mod:`~moe_tutorial.kernels.gluon_fp8_kernel` asks it for its rescaled forms.

Nothing here needs a GPU: the edit is made to the bytes ``ptxas`` wrote, before they are loaded.
"""
from __future__ import annotations

import re
import struct
import subprocess
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

#: In an instruction's second (high) 64-bit word: the flags that keep operands A, B, C (and a fourth)
#: for reuse, the one of operand B, and the yield bit (set: the warp does not yield after it).
REUSE = 0xF << 58
REUSE_B = 1 << 59
NO_YIELD = 1 << 45
#: Which multiplies of a run yield (:func:`to_yield`).
PATTERNS = ("reuse-alternate", "alternate", "all")
#: The shortest run of multiplies edited. The rescale's runs are about 60 long (64 a warp and
#: accumulator each K step); shorter ones are address and scale arithmetic, left as ptxas wrote them.
#: Runs of multiplies by a constant (the quantiser's) keep no register for reuse, so the shipped
#: pattern leaves them too.
MIN_RUN = 16

_LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\*\s*(0x[0-9a-f]+)\s*\*/")
_HIGH = re.compile(r"^\s*/\*\s*(0x[0-9a-f]+)\s*\*/\s*$")


@dataclass(frozen=True)
class Instruction:
    """One SASS instruction: its ``function``, byte ``address`` in that function's code, its
    ``text`` (``FMUL R93, R93, R156.reuse``) and its two 64-bit words (``low``, ``high``)."""

    function: str
    address: int
    text: str
    low: int
    high: int

    @property
    def opcode(self) -> str:
        """``FMUL`` of ``@P0 FMUL.FTZ R1, ...``: the mnemonic without predicate or modifiers."""
        words = self.text.split()
        return (words[1] if words[0].startswith("@") else words[0]).split(".")[0]


def tool(name: str) -> Path:
    """The path of ``name`` (``cuobjdump``) in the CUDA tools Triton ships."""
    import triton
    return Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name


def sass(cubin: bytes) -> str:
    """``cubin``'s machine code as ``cuobjdump --dump-sass`` lists it: each instruction with its two
    64-bit words in comments."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "k.cubin"
        path.write_bytes(cubin)
        return subprocess.run([str(tool("cuobjdump")), "--dump-sass", str(path)],
                              capture_output=True, text=True, check=True).stdout


def instructions(cubin: bytes) -> list[Instruction]:
    """Every instruction of every function in ``cubin`` (bytes of an sm90 ELF), in address order."""
    out, function, lines = [], "", sass(cubin).splitlines()
    for i, line in enumerate(lines):
        if "Function :" in line:
            function = line.split("Function :")[1].strip()
        elif (m := _LINE.search(line)) and i + 1 < len(lines) and (h := _HIGH.match(lines[i + 1])):
            out.append(Instruction(function, int(m.group(1), 16), m.group(2).strip(), int(m.group(3), 16),
                                   int(h.group(1), 16)))
    return out


def multiply_runs(code: list[Instruction], min_run: int = MIN_RUN) -> list[list[Instruction]]:
    """The runs of at least ``min_run`` ``FMUL``/``FFMA`` back to back (one function, adjacent
    addresses)."""
    runs, run = [], []
    for ins in code + [None]:
        if (ins is not None and ins.opcode in ("FMUL", "FFMA") and
                (not run or (ins.function == run[-1].function and ins.address == run[-1].address + 16))):
            run.append(ins)
            continue
        if len(run) >= min_run:
            runs.append(run)
        run = [ins] if ins is not None and ins.opcode in ("FMUL", "FFMA") else []
    return runs


def to_yield(run: list[Instruction], pattern: str = "reuse-alternate") -> list[Instruction]:
    """The instructions of ``run`` to edit. ``reuse-alternate`` (DeepGEMM's choice): every other one
    of those that keep operand B for reuse, starting with the first, so the reuse chain still saves
    every other register read; ``alternate``: every other multiply; ``all``: every multiply."""
    if pattern == "reuse-alternate":
        return [ins for ins in run if ins.high & REUSE_B][::2]
    if pattern == "alternate":
        return run[::2]
    if pattern == "all":
        return list(run)
    raise ValueError(f"pattern: one of {PATTERNS}, got {pattern!r}")


def text_offsets(cubin: bytes) -> dict[str, int]:
    """``{function: file offset of its code}``: the ELF sections ``.text.<function>``."""
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)

    def section(i):                    # (name offset, file offset, size)
        name, _, _, _, offset, size = struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize)
        return name, offset, size

    _, names_at, _ = section(shstrndx)
    out = {}
    for i in range(shnum):
        name_at, offset, _ = section(i)
        end = cubin.index(b"\0", names_at + name_at)
        name = cubin[names_at + name_at:end].decode()
        if name.startswith(".text."):
            out[name[len(".text."):]] = offset
    return out


def interleave_yields(cubin: bytes, min_run: int = MIN_RUN, pattern: str = "reuse-alternate") -> tuple[bytes, int]:
    """``cubin`` with :func:`to_yield`'s instructions of every run of multiplies set to yield (the
    yield bit and its reuse flags cleared: a yielding warp keeps nothing for reuse), and how many were
    changed."""
    code = bytearray(cubin)
    offsets = text_offsets(cubin)
    changed = 0
    for run in multiply_runs(instructions(cubin), min_run):
        for ins in to_yield(run, pattern):
            at = offsets[ins.function] + ins.address
            low, high = struct.unpack_from("<QQ", code, at)
            if (low, high) != (ins.low, ins.high):
                raise ValueError(f"{ins.function}+{ins.address:#x}: the listing and the cubin disagree")
            new = high & ~(REUSE | NO_YIELD)
            if new != high:                    # one that yields already is not counted
                struct.pack_into("<Q", code, at + 8, new)
                changed += 1
    return bytes(code), changed


#: The pattern :func:`edit_compiled_forms` uses: the one measured (``data/h100_fp8_yield.csv``).
PATTERN = "reuse-alternate"
#: ``{a JITFunction's Python function: (name of the constexpr that selects the forms edited, pattern)}``.
_EDITED: dict = {}
#: The hook that was installed before ours (called first), once ours is in.
_previous_hook: list = []


def _after_compile(**kwargs):
    """Triton's ``jit_post_compile_hook``: any hook that was there first; then the form just compiled
    (and put in its kernel's cache), edited if its kernel asked for it and its constexpr says so. The
    unedited bytes stay in the compiled kernel's ``unedited``."""
    ret = _previous_hook[0](**kwargs) if _previous_hook and _previous_hook[0] else None
    try:
        jit_fn, compile = kwargs["fn"].jit_function, kwargs["compile"]
        if jit_fn.fn not in _EDITED:
            return ret
        flag, pattern = _EDITED[jit_fn.fn]
        if compile["constants"].get((jit_fn.arg_names.index(flag),)):
            kernel = jit_fn.device_caches[compile["device"]][0][kwargs["key"]]
            edited, n = interleave_yields(kernel.kernel, pattern=pattern)
            kernel.unedited, kernel.kernel, kernel.yield_edits = kernel.kernel, edited, n
            # Loaded already (a compile pool may load what it compiled): clearing Triton's handles,
            # ``_run`` among them, makes its next launch load the edit (the first module stays loaded).
            kernel.module = kernel.function = kernel._run = None
    except Exception as e:  # noqa: BLE001  (only scheduling is lost: the form runs as ptxas wrote it)
        warnings.warn(f"yield_edit: a compiled form left unedited ({type(e).__name__}: {e})", stacklevel=2)
    return ret


def edit_compiled_forms(jit_fn, flag: str, pattern: str = PATTERN) -> None:
    """From now on, every form of ``jit_fn`` (a Triton ``JITFunction``) that Triton compiles, or takes
    from its cache, with the constexpr argument ``flag`` true is edited by :func:`interleave_yields`
    before it is loaded; its compiled kernel's ``yield_edits`` says how many instructions changed and
    ``unedited`` keeps ptxas's bytes. Idempotent: the hook goes in once, before any other installed
    later; forms already in the process's cache stay as they are. :func:`stop_editing` undoes it."""
    if _previous_hook and _EDITED.get(jit_fn.fn) == (flag, pattern):
        return                             # asked at every launch: nothing to do after the first
    if pattern not in PATTERNS:
        raise ValueError(f"pattern: one of {PATTERNS}, got {pattern!r}")
    if flag not in jit_fn.arg_names:
        raise ValueError(f"flag: {flag!r} is not an argument of {jit_fn}")
    from triton import knobs
    _EDITED[jit_fn.fn] = (flag, pattern)
    if not _previous_hook:                 # once: a hook chained after ours is never taken as "previous"
        _previous_hook.append(knobs.runtime.jit_post_compile_hook)
        knobs.runtime.jit_post_compile_hook = _after_compile


def stop_editing(jit_fn) -> None:
    """Forms of ``jit_fn`` compiled from now on are loaded as ptxas wrote them (those compiled before
    stay as they are)."""
    _EDITED.pop(jit_fn.fn, None)
