"""Nsight Compute's source page (SASS, warp stall samples per instruction) summed into a few kinds of
instruction: where a kernel's warps spend their sampled time.

    ncu --set full -o REPORT python3 ...                                   # on the GPU
    ncu -i REPORT.ncu-rep --page source --csv --print-source sass > SOURCE.csv
    python3 measurements/scripts/ncu_source_stalls.py SOURCE.csv --gemms gate/up down --model M ... \\
        [--into moe_tutorial/data/h100_fp8_stall_sources.csv]

The ``barrier`` stall of the raw page's summary counts every warp, also those that do no work: a
warp-specialized kernel's spare warps sit at the partitions' closing barrier (``BAR.SYNC 0x1``, then a
``NOP`` with the register reallocation) from start to end. Sampled instruction by instruction they
show as themselves, and the working warps' time splits into its kinds:

* ``idle``: those spare warps;
* ``fmul``: fp32 multiplies (the rescaling, one per accumulator element and K step; the epilogue's);
* ``global wait``: any instruction with most of its samples on the long scoreboard, waiting for a
  read from global memory (a weight scale, a router weight);
* ``data wait``: the MMA warps at a stage's *ready* mbarrier (the operands not there yet);
* ``slot wait``: the load warp at an *empty* one (every stage still in use);
* ``mma wait`` (``WARPGROUP.DEPBAR``: waiting for the tensor cores), ``mma issue``;
* ``other``: integer and uniform arithmetic, selects, branches, stores.

An mbarrier is an *empty* one where the loads into shared memory (TMA's ``UTMALDG``, or cp.async's
``LDGSTS`` where the load warps gather rows by index) are issued near its ``TRYWAIT`` (the load
warps' code); the MMA warps' ``TRYWAIT`` are at the *ready* ones.
"""
from __future__ import annotations

import argparse
import collections
import csv
import io
import re
import sys
from pathlib import Path

KINDS = ("idle", "fmul", "global wait", "data wait", "slot wait", "mma wait", "mma issue", "other")
FIELDS = ("gpu", "torch", "triton", "date", "tool", "model", "M", "gemm", "kind", "share")
SAMPLES = "Warp Stall Sampling (All Samples)"
LONG_SCOREBOARD = "stall_long_sb"
#: How many instructions either side of a TRYWAIT count as its code; how far after it its retry branch lies.
NEAR, RETRY = 60, 14
TRYWAIT = re.compile(r"TRYWAIT \w+, \[([^\]]*)\]")
OFFSET = re.compile(r"\+(0x[0-9a-f]+)$")
#: The load warps' copies into shared memory: TMA, or cp.async.
LOADS = re.compile(r"\b(UTMALDG|LDGSTS)\b")


def kernels(text: str) -> list[list[dict]]:
    """The source page's instruction rows, one list per profiled kernel launch."""
    return [list(csv.DictReader(io.StringIO(part.split("\n", 1)[1]))) for part in text.split('"Kernel Name"')[1:]]


def number(value: str) -> float:
    """A number as the page writes it (``"1,234"``, or empty for 0)."""
    return float(value.replace(",", "")) if value else 0.0


def barrier_of(source: str) -> str | None:
    """The mbarrier a ``TRYWAIT`` polls (its address's offset), None for any other instruction."""
    m = TRYWAIT.search(source)
    if m is None:
        return None
    if (offset := OFFSET.search(m.group(1))) is None:
        raise ValueError(f"a TRYWAIT whose mbarrier has no offset to tell it by: {source!r}")
    return offset.group(1)


def shares(rows: list[dict]) -> dict[str, float]:
    """``{kind: share of the launch's stall samples}`` over :data:`KINDS`. An instruction with more than
    half its samples on the long scoreboard (a global read it waits for) is a ``global wait``."""
    producer = {b for i, r in enumerate(rows) if (b := barrier_of(r["Source"]))
                and any(LOADS.search(x["Source"]) for x in rows[max(0, i - NEAR):i + NEAR])}
    out, waiting = collections.Counter(), None
    for i, r in enumerate(rows):
        src, samples = r["Source"], number(r[SAMPLES])
        near = " ".join(rows[j]["Source"] for j in range(max(0, i - 3), min(len(rows), i + 3)))
        barrier = barrier_of(src)
        retry = "BRA" in src and "@!P" in src and waiting is not None and i - waiting[0] <= RETRY
        if barrier:
            waiting = (i, barrier)
        if "NOP" in src and ("BAR.SYNC.DEFER_BLOCKING 0x1" in near or "USETMAXREG" in near):
            kind = "idle"
        elif barrier or retry:
            kind = "slot wait" if waiting[1] in producer else "data wait"
            waiting = waiting if barrier else None           # one retry branch a try-wait
        elif "WARPGROUP.DEPBAR" in src:
            kind = "mma wait"
        elif "GMMA" in src:
            kind = "mma issue"
        elif number(r.get(LONG_SCOREBOARD, "")) > samples / 2:
            kind = "global wait"
        elif re.search(r"\bFMUL\b", src):
            kind = "fmul"
        else:
            kind = "other"
        out[kind] += samples
    total = sum(out.values())
    if not total:
        raise ValueError("a launch with no stall samples: nothing to share out")
    return {k: out[k] / total for k in KINDS}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("source", type=Path, help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--gemms", nargs="+", required=True, help="a name per profiled launch, in order")
    ap.add_argument("--model", required=True)
    ap.add_argument("--M", type=int, required=True)
    ap.add_argument("--gpu", default="NVIDIA H100 80GB HBM3")
    ap.add_argument("--versions", default="2.11.0+cu130,3.6.0", help="torch,triton")
    ap.add_argument("--date", required=True)
    ap.add_argument("--tool", default="Nsight Compute 2025.3.1, --set full, --clock-control none, source page")
    ap.add_argument("--into", type=Path, help="append the rows to this CSV (else print them)")
    args = ap.parse_args(argv)
    launches = kernels(args.source.read_text())
    if len(launches) != len(args.gemms):
        ap.error(f"{args.source} holds {len(launches)} launches; --gemms names {len(args.gemms)}")
    torch_v, triton_v = args.versions.split(",")
    rows = [dict(gpu=args.gpu, torch=torch_v, triton=triton_v, date=args.date, tool=args.tool, model=args.model,
                 M=args.M, gemm=gemm, kind=kind, share=round(share, 4))
            for gemm, launch in zip(args.gemms, launches) for kind, share in shares(launch).items()]
    out = open(args.into, "a", newline="") if args.into else sys.stdout
    writer = csv.DictWriter(out, fieldnames=FIELDS, lineterminator="\n")
    if not args.into or args.into.stat().st_size == 0:
        writer.writeheader()
    writer.writerows(rows)
    if args.into:
        out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
