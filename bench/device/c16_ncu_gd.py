#!/usr/bin/env python3
"""c16_ncu_gd.py: one line per profiled kernel of an ncu text report (default sections printed),
for bench/device/c16.sh, gdn16.sh and c16moe.sh: name, grid x block, duration, registers,
theoretical / achieved occupancy, issued warps per scheduler, % cycles with no eligible warp, DRAM throughput and the
first stall sentence of WarpStateStats (+ the DRAM bytes read where the report has dram__bytes_read.sum,
c16moe.sh's metric).

usage: c16_ncu_gd.py NCU.txt [GRID_Y]   (GRID_Y: keep only grids whose y is that, e.g. 16 sequences)
"""
import re
import sys


def main():
    path = sys.argv[1]
    want_y = sys.argv[2] if len(sys.argv) > 2 else None
    ks, cur = [], None
    head = re.compile(r"^  (?:void )?([A-Za-z_][\w:]*(?:<[^(]*>)?)\(.*\) \((\d+), (\d+), (\d+)\)x\((\d+), (\d+), (\d+)\)")
    for line in open(path, errors="replace"):
        m = head.match(line)
        if m:
            cur = dict(name=m.group(1), grid=f"{m.group(2)}x{m.group(3)}", y=m.group(3), block=m.group(5))
            ks.append(cur)
            continue
        if cur is None:
            continue
        t = line.split()
        def val():
            return t[-1] if t else ""
        if line.strip().startswith("Duration"):
            cur["us"] = val() + (" " + t[-2] if len(t) >= 2 and t[-2] in ("us", "ms", "ns", "usecond", "msecond") else "")
        elif "Registers Per Thread" in line:
            cur["regs"] = val()
        elif "Theoretical Occupancy" in line:
            cur["theo"] = val()
        elif "Achieved Occupancy" in line:
            cur["ach"] = val()
        elif "Issued Warp Per Scheduler" in line:
            cur["issue"] = val()
        elif line.strip().startswith("No Eligible"):
            cur["noel"] = val()
        elif line.strip().startswith("DRAM Throughput"):
            cur["dram"] = val()
        elif line.strip().startswith("dram__bytes_read.sum"):
            cur["rd"] = " ".join(t[1:])
        elif "stalled" in line and "stall" not in cur:
            cur["stall"] = " ".join(t)[:110]
    for k in ks:
        if want_y and k["y"] != want_y:
            continue
        print(f"  {k['name'][:26]:26s} grid {k['grid']:>8s} x{k['block']:>4s}: {k.get('us', '?'):>10s}, regs {k.get('regs', '?')}, "
              f"occ {k.get('theo', '?')}/{k.get('ach', '?')} %, issue {k.get('issue', '?')}, no-elig {k.get('noel', '?')} %, "
              f"DRAM {k.get('dram', '?')} %" + (f", read {k['rd']}" if "rd" in k else ""))
        if "stall" in k:
            print(f"      {k['stall']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
