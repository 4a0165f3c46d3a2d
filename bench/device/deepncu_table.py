"""deepncu_table.py DETAILS SASS_CSV: the summary of one kernel's ncu --set full report (deepncu.sh).

DETAILS: `ncu --import R --page details` (text); SASS_CSV: `ncu --import R --page source --csv
--print-source sass`. Prints the details' headline lines (time, throughput, occupancy, issue,
pipes, stall reasons), the executed warp instructions by opcode (share of the kernel's total),
and the instructions with the most stall samples.
"""
import csv
import re
import sys
from collections import defaultdict

KEYS = ("Duration", "DRAM Throughput", "Memory Throughput", "Registers Per Thread", "Achieved Occupancy",
        "Theoretical Occupancy", "Issue Slots Busy", "Issued Ipc Active", "Executed Ipc Active",
        "No Eligible", "Active Warps Per Scheduler", "Eligible Warps Per Scheduler",
        "Warp Cycles Per Issued Instruction", "Executed Instructions", "Block Limit", "Grid Size",
        "Block Size", "Dynamic Shared Memory Per Block", "L2 Hit Rate", "L1/TEX Hit Rate",
        "Mem Pipes Busy", "SM Busy", "Waves Per SM")


def details(path):
    try:
        lines = open(path, errors="replace").read().splitlines()
    except OSError as e:
        print(f"details: {e}")
        return
    for ln in lines:
        s = ln.strip()
        if any(s.startswith(k) for k in KEYS):
            print("  " + re.sub(r"\s{2,}", "  ", s))
    # the rule texts that name pipes and stalls (ncu's own analysis), shortened
    for ln in lines:
        s = ln.strip()
        if re.search(r"(pipe|stall|Stall|bank conflict|uncoalesced)", s) and len(s) > 40:
            print("  > " + s[:220])


def num(s):
    try:
        return float((s or "").replace(",", ""))
    except ValueError:
        return 0.0


def sass(path):
    try:
        rows = list(csv.reader(open(path, errors="replace")))
    except OSError as e:
        print(f"sass: {e}")
        return
    hdr_i = next((i for i, r in enumerate(rows) if any(c.strip() == "Source" for c in r)), None)
    if hdr_i is None:
        print("sass: no header with Source; first lines:", rows[:3])
        return
    hdr = [c.strip() for c in rows[hdr_i]]
    src = hdr.index("Source")
    ex = next((i for i, c in enumerate(hdr) if c == "Instructions Executed"), None)
    st = next((i for i, c in enumerate(hdr) if c.startswith("Warp Stall Sampling (All")), None)
    print(f"  sass columns: {len(hdr)}; executed col {ex}, stall col {st}")
    stall_cols = [i for i, c in enumerate(hdr) if c.startswith("stall_") or "Stall" in c and i != st]
    ops, tot, tot_st = defaultdict(float), 0.0, 0.0
    body = [r for r in rows[hdr_i + 1:] if len(r) == len(hdr)]
    for r in body:
        ins = r[src].strip()
        op = re.sub(r"^@!?U?P\w+\s+", "", ins).split(" ")[0]
        n = num(r[ex]) if ex is not None else 0.0
        ops[op] += n
        tot += n
        tot_st += num(r[st]) if st is not None else 0.0
    print(f"  warp instructions executed: {tot:.0f}; stall samples: {tot_st:.0f}")
    for op, n in sorted(ops.items(), key=lambda t: -t[1])[:28]:
        print(f"    {op:<22} {n:>12.0f} {100 * n / max(tot, 1):6.2f}%")
    if st is not None:
        print("  top instructions by stall samples (share; executed; the largest stall columns):")
        for r in sorted(body, key=lambda r: -num(r[st]))[:24]:
            extra = sorted(((num(r[i]), hdr[i]) for i in stall_cols), reverse=True)[:3]
            ex_s = f"{num(r[ex]):.0f}" if ex is not None else "-"
            print(f"    {100 * num(r[st]) / max(tot_st, 1):5.1f}%  {ex_s:>9}  {r[src].strip()[:70]:<70} "
                  + " ".join(f"{h}={v:.0f}" for v, h in extra if v > 0))


if __name__ == "__main__":
    details(sys.argv[1])
    sass(sys.argv[2])
