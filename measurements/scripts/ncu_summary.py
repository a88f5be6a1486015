"""Nsight Compute's raw page, a few columns per kernel: what the journal quotes from a profile.

    ncu --clock-control none --set full -o REPORT python3 ...        # on the GPU
    ncu -i REPORT.ncu-rep --page raw --csv > REPORT-raw.csv
    python3 measurements/scripts/ncu_summary.py REPORT-raw.csv [...] > summary.csv

One row per profiled kernel launch: its time, SM clock, the tensor pipe's active share, L2 and
DRAM throughput, registers, shared memory, local-memory spill requests, and the six largest stall
reasons (warps stalled per issued instruction, Nsight Compute's ``smsp__average_warps_issue_stalled_*``).
"""
from __future__ import annotations

import csv
import sys

COLUMNS = {
    "kernel": "Kernel Name",
    "grid": "launch__grid_size",
    "duration": "gpu__time_duration.sum",
    "sm_clock": "sm__cycles_elapsed.avg.per_second",
    "tensor_pipe_pct": "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "l2_pct": "lts__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_read": "dram__bytes_read.sum.per_second",
    "dram_write": "dram__bytes_write.sum.per_second",
    "registers": "launch__registers_per_thread",
    "shared_per_block": "launch__shared_mem_per_block_dynamic",
    "spill_requests": "derived__local_spilling_requests",
}
STALL = "smsp__average_warps_issue_stalled_"


def summarise(path: str) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    start = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
    header, units = rows[start], rows[start + 1]
    out = []
    for values in rows[start + 2:]:
        d, u = dict(zip(header, values)), dict(zip(header, units))
        row = {"report": path}
        for name, metric in COLUMNS.items():
            row[name] = f"{d.get(metric, '')} {u.get(metric, '')}".strip()
        stalls = sorted(((float(d[k].replace(",", "")), k[len(STALL):].split("_per_")[0]) for k in header
                         if k.startswith(STALL) and d[k] not in ("", "no data")), reverse=True)
        row["top_stalls"] = "; ".join(f"{name} {v:.2f}" for v, name in stalls[:6])
        out.append(row)
    return out


def main(paths: list[str]) -> int:
    rows = [r for p in paths for r in summarise(p)]
    if not rows:
        return 1
    w = csv.DictWriter(sys.stdout, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
