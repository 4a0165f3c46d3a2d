"""moepre_ncu.py: the MoE GEMM kernels of an ncu raw CSV (`ncu --import R --csv --page raw
--print-units base`), one block a launch: time, throughputs, pipes, issue, the top stall reasons,
registers and shared memory. Usage: python3 moepre_ncu.py FILE.csv FLOPS_GU FLOPS_DN
(FLOPs of the gate/up and down launches, for TFLOP/s; launches alternate gate/up, down).
"""
import csv
import re
import sys


def num(v):
    try:
        return float(v.replace(",", ""))
    except (ValueError, AttributeError):
        return None


def main():
    rows = list(csv.reader(open(sys.argv[1])))
    fl = [float(sys.argv[2]), float(sys.argv[3])] if len(sys.argv) > 3 else None
    hi = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    head = rows[hi]
    data = [r for r in rows[hi + 1:] if len(r) == len(head) and r[head.index("Kernel Name")]]
    data = [r for r in data if num(r[head.index("gpu__time_duration.sum")]) is not None] if \
        "gpu__time_duration.sum" in head else data
    keys = [
        ("gpu__time_duration.sum", "time ns"),
        ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "SM %"),
        ("gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed", "mem %"),
        ("lts__throughput.avg.pct_of_peak_sustained_elapsed", "L2 %"),
        ("l1tex__throughput.avg.pct_of_peak_sustained_active", "L1 %"),
        ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "DRAM %"),
        ("smsp__issue_active.avg.pct_of_peak_sustained_active", "issue %"),
        ("sm__warps_active.avg.pct_of_peak_sustained_active", "occupancy %"),
        ("launch__registers_per_thread", "regs"),
        ("launch__shared_mem_per_block_dynamic", "dyn smem"),
        ("smsp__average_warp_latency_per_inst_issued.ratio", "cycles/issue"),
    ]
    for n, r in enumerate(data):
        name = r[head.index("Kernel Name")][:90]
        print(f"-- launch {n}: {name}  grid {r[head.index('Grid Size')] if 'Grid Size' in head else '?'}")
        out = []
        for k, lab in keys:
            if k in head:
                out.append(f"{lab} {r[head.index(k)]}")
        print("   " + "; ".join(out))
        if fl and "gpu__time_duration.sum" in head:
            t = num(r[head.index("gpu__time_duration.sum")])
            if t:
                print(f"   {fl[n % 2] / (t * 1e-9) / 1e12:.1f} TFLOP/s ({'gate/up' if n % 2 == 0 else 'down'} FLOPs)")
        pipes = []
        for i, h in enumerate(head):
            m = re.match(r"^sm__(inst_executed_pipe_\w+|pipe_\w+)\.avg\.pct_of_peak_sustained_active$", h)
            if m and num(r[i]) is not None and num(r[i]) >= 3:
                pipes.append((num(r[i]), h.replace("sm__", "").replace(".avg.pct_of_peak_sustained_active", "")))
        pipes.sort(reverse=True)
        print("   pipes: " + ", ".join(f"{h} {v:.0f}%" for v, h in pipes[:10]))
        st = []
        for i, h in enumerate(head):
            m = re.match(r"smsp__average_warps?_(?:latency_)?issue_stalled_(\w+?)_per_issue_active\.ratio$", h)
            if m and num(r[i]) is not None:
                st.append((num(r[i]), m.group(1)))
        st.sort(reverse=True)
        print("   stalls (cycles per issue): " + ", ".join(f"{s} {v:.2f}" for v, s in st[:9]))
        bank = [(h, r[i]) for i, h in enumerate(head) if "bank_conflict" in h and num(r[i])]
        if bank:
            print("   " + "; ".join(f"{h} {v}" for h, v in bank[:4]))


if __name__ == "__main__":
    main()
