#!/usr/bin/env python3
"""prefill8k_ncu.py: one block per kernel of an ncu raw CSV with sections (bench/device/prefill8k.sh).

usage: prefill8k_ncu.py NCU_RAW.csv [MIN_BLOCKS]

MIN_BLOCKS: skip launches whose grid has fewer blocks (the engine's warm-up steps: decode-sized).

The CSV is `ncu --import R --csv --page raw` of a run profiled with the sections SpeedOfLight,
ComputeWorkloadAnalysis, WarpStateStats, Occupancy and LaunchStats. Columns are found by name
(so a metric this ncu version lacks shows as '?'): duration, SM / memory / DRAM throughput (% of
peak), the tensor pipe's and the other pipes' utilisation, issue slots busy, achieved occupancy,
registers and shared memory per block, and the five largest stall reasons (warp cycles per
issued instruction).
"""
import csv
import sys


def main():
    lines = open(sys.argv[1], errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        print("no ncu table: " + " | ".join(lines[:3])[:300])
        return 1
    rows = list(csv.reader(lines[start:]))
    hdr = rows[0]
    units = rows[1] if len(rows) > 1 and not rows[1][0].strip().isdigit() else None
    data = rows[1 + (units is not None):]

    def col(*keys):
        for key in keys:
            for i, h in enumerate(hdr):
                if h == key:
                    return i
        return None

    def cols_like(*subs):
        return [i for i, h in enumerate(hdr) if all(s in h for s in subs)]

    want = [("us", col("gpu__time_duration.sum")),
            ("SM%", col("sm__throughput.avg.pct_of_peak_sustained_elapsed")),
            ("mem%", col("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed")),
            ("dram%", col("dram__throughput.avg.pct_of_peak_sustained_elapsed", "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed")),
            ("issue%", col("sm__inst_issued.avg.pct_of_peak_sustained_active", "smsp__issue_active.avg.pct_of_peak_sustained_active")),
            ("occ%", col("sm__warps_active.avg.pct_of_peak_sustained_active")),
            ("regs", col("launch__registers_per_thread")),
            ("smemKB", col("launch__shared_mem_per_block_dynamic"))]
    pipes = [i for i in cols_like("sm__inst_executed_pipe_", "pct_of_peak_sustained_active")
             + cols_like("sm__pipe_", "cycles_active", "pct_of_peak_sustained_active")]
    stalls = cols_like("smsp__average_warp", "issue_stalled_", "per_issue_active.ratio")
    cn, cg, cb = col("Kernel Name"), col("Grid Size"), col("Block Size")
    tscale = 1e-3 if units and want[0][1] is not None and units[want[0][1]].lower().startswith("n") else 1.0

    def num(r, i):
        try:
            return float(r[i].replace(",", ""))
        except (ValueError, IndexError, TypeError, AttributeError):
            return None

    min_blocks = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    skipped = 0
    for r in data:
        if not r or not r[0].strip():
            continue
        if min_blocks and cg is not None:
            dims = [int(v) for v in r[cg].strip("()").replace(" ", "").split(",") if v.isdigit()]
            n = 1
            for v in dims:
                n *= v
            if n < min_blocks:
                skipped += 1
                continue
        name = r[cn] if cn is not None else "?"
        name = name.split("(")[0][:90]
        parts = []
        for lab, i in want:
            v = num(r, i) if i is not None else None
            if v is None:
                parts.append(f"{lab} ?")
            elif lab == "us":
                parts.append(f"{v * tscale:.1f} us")
            elif lab == "smemKB":
                parts.append(f"smem {v / 1024:.0f} KB")
            else:
                parts.append(f"{lab} {v:.0f}")
        print(f"{name}  grid {r[cg] if cg is not None else '?'} x {r[cb] if cb is not None else '?'}")
        print("    " + ", ".join(parts))
        pv = sorted(((num(r, i) or 0.0, hdr[i]) for i in pipes), reverse=True)[:5]
        print("    pipes: " + ", ".join(f"{h.replace('sm__inst_executed_pipe_', '').replace('sm__pipe_', '').split('.')[0]} {v:.0f}%"
                                      for v, h in pv if v > 0))
        sv = sorted(((num(r, i) or 0.0, hdr[i]) for i in stalls), reverse=True)[:5]
        print("    stalls (cycles per issue): " + ", ".join(
            f"{h.split('issue_stalled_')[1].split('_per_issue')[0]} {v:.2f}" for v, h in sv if v > 0))
    if skipped:
        print(f"({skipped} launches of fewer than {min_blocks} blocks skipped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
