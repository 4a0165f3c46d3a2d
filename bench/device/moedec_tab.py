"""moedec_tab.py: tables for bench/device/moedec.sh (the fused MoE decode, S10).

  python3 moedec_tab.py ncu FILE.csv      ncu --csv (raw metrics, one row a metric) -> one line a kernel
  python3 moedec_tab.py nsys FILE.csv     nsys stats cuda_gpu_trace CSV -> the chain of one call:
                                          each moe kernel's start and end relative to the call's
                                          first kernel (median over the calls), and the call's span
"""
import collections
import csv
import statistics
import sys


def fnum(s):
    try:
        return float((s or "").replace(",", ""))
    except ValueError:
        return float("nan")


def short(k):
    return k.split("(")[0].replace("void ", "").replace("moe_", "").replace("_kernel", "")[:44]


def ncu(path):
    rows = [r for r in csv.reader(l for l in open(path, errors="replace") if l.startswith('"'))]
    if not rows:
        print("  (no ncu rows)")
        return
    h = rows[0]
    ik, im, iv, iu, iid = (h.index(x) for x in ("Kernel Name", "Metric Name", "Metric Value", "Metric Unit", "ID"))
    by = collections.OrderedDict()
    for r in rows[1:]:
        by.setdefault((r[iid], r[ik]), {})[r[im]] = (r[iv], r[iu])
    tot = 0.0
    for (i, k), m in by.items():
        g = lambda n: m.get(n, ("nan", ""))[0]
        us = fnum(g("gpu__time_duration.sum"))
        unit = m.get("gpu__time_duration.sum", ("", ""))[1]
        us = us / 1e3 if unit in ("ns", "nsecond") else us * 1e3 if unit in ("ms", "msecond") else us
        tot += us if us == us else 0.0
        rd = fnum(g("dram__bytes_read.sum"))
        ru = m.get("dram__bytes_read.sum", ("", ""))[1].lower()
        rd *= {"byte": 1e-6, "kbyte": 1e-3, "mbyte": 1.0, "gbyte": 1e3}.get(ru, 1e-6)
        print(f"  {short(k):44s} {us:6.2f} us  {rd:6.2f} MB  dram {fnum(g('dram__throughput.avg.pct_of_peak_sustained_elapsed')):5.1f}%"
              f"  warps {fnum(g('sm__warps_active.avg.pct_of_peak_sustained_active')):5.1f}%"
              f"  issue {fnum(g('smsp__issue_active.avg.pct_of_peak_sustained_active')):5.1f}%"
              f"  regs {g('launch__registers_per_thread')} grid {g('launch__grid_size')} x {g('launch__block_size')}"
              f"  occ-lim regs {g('launch__occupancy_limit_registers')} smem {g('launch__occupancy_limit_shared_mem')}")
        st = sorted(((fnum(v[0]), n.split("stalled_")[1].split("_per")[0]) for n, v in m.items() if "stalled_" in n),
                    reverse=True)
        if st:
            print("      stalls/issue: " + " ".join(f"{n} {v:.2f}" for v, n in st[:7] if v == v))
    print(f"  sum of the kernels: {tot:.1f} us")


def nsys(path):
    rows = list(csv.reader(open(path, errors="replace")))
    hi = next((i for i, r in enumerate(rows) if "Start (ns)" in r and "Name" in r), None)
    if hi is None:
        print("  (no nsys rows)")
        return
    h = rows[hi]
    i0, idur, iname = h.index("Start (ns)"), h.index("Duration (ns)"), h.index("Name")
    ks = [(fnum(r[i0]), fnum(r[idur]), r[iname]) for r in rows[hi + 1:] if len(r) > iname and "moe_" in r[iname]]
    # a call starts at a router kernel (route_rows / router)
    calls, cur = [], []
    for s, d, n in ks:
        if ("route_rows" in n or "router_kernel" in n) and cur:
            calls.append(cur)
            cur = []
        cur.append((s, d, n))
    if cur:
        calls.append(cur)
    if not calls:
        print("  (no calls)")
        return
    n = collections.Counter(len(c) for c in calls).most_common(1)[0][0]
    calls = [c for c in calls if len(c) == n][len(calls) // 4:]  # past the warm-up
    print(f"  {len(calls)} calls of {n} kernels; median us relative to the first kernel's start:")
    for j in range(n):
        st = statistics.median(c[j][0] - c[0][0] for c in calls) / 1e3
        en = statistics.median(c[j][0] + c[j][1] - c[0][0] for c in calls) / 1e3
        print(f"    {short(calls[0][j][2]):44s} start {st:6.2f}  end {en:6.2f}  (dur {en - st:5.2f})")
    span = [(c[-1][0] + c[-1][1] - c[0][0]) / 1e3 for c in calls]
    gap = [(calls[i + 1][0][0] - calls[i][-1][0] - calls[i][-1][1]) / 1e3 for i in range(len(calls) - 1)]
    print(f"    call span median {statistics.median(span):.2f} us; next call's first kernel starts "
          f"{statistics.median(gap) if gap else float('nan'):.2f} us after this call's last ends (median)")


if __name__ == "__main__":
    {"ncu": ncu, "nsys": nsys}[sys.argv[1]](sys.argv[2])
