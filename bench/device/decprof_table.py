#!/usr/bin/env python3
"""decprof_table.py: one forward pass's kernels out of an ncu raw CSV (bench/device/decprof.sh).

usage: decprof_table.py NCU_RAW.csv TAG

The CSV is `ncu --import R --csv --page raw --print-units base` of a whole `laststand generate`
run with the metrics gpu__time_duration.sum, dram__bytes_read.sum, dram__bytes_write.sum. The
kernel sequence is split into forward passes at the embedding kernel (sm_embed*): what precedes
the first one is start-up. The last forward is tabulated: one row per kernel (µs, DRAM MB read +
written, GB/s), then one row per kernel name (count, total µs, % of the step's kernel time,
MB, GB/s). The forward before it is compared by kernel names (a decode step should repeat).
"""
import csv
import sys


def short(name):
    """`void f<A>(int, ...)` -> `f<A>` (parameter list and return type dropped)."""
    n = name.strip()
    if n.endswith(")"):
        depth = 0
        for i in range(len(n) - 1, -1, -1):
            if n[i] == ")":
                depth += 1
            elif n[i] == "(":
                depth -= 1
                if depth == 0:
                    n = n[:i]
                    break
    for p in ("void ", "static "):
        if n.startswith(p):
            n = n[len(p):]
    return n.strip()


def num(s):
    s = (s or "").replace(",", "").strip()
    try:
        return float(s)
    except ValueError:
        return float("nan")


def main():
    path, tag = sys.argv[1], sys.argv[2]
    lines = open(path, errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        print(f"[{tag}] no ncu table in {path}: " + " | ".join(lines[:3])[:300])
        return 1
    rows = list(csv.reader(lines[start:]))
    head = rows[0]
    col = {h: i for i, h in enumerate(head)}

    def find(key):
        for h, i in col.items():
            if h == key or h.startswith(key):
                return i
        return None

    ci_name, ci_grid, ci_block = find("Kernel Name"), find("Grid Size"), find("Block Size")
    ci_t, ci_r, ci_w = find("gpu__time_duration.sum"), find("dram__bytes_read.sum"), find("dram__bytes_write.sum")
    if ci_name is None or ci_t is None:
        print(f"[{tag}] columns missing in {path}: {head}")
        return 1
    units = rows[1] if len(rows) > 1 and not rows[1][0].strip().isdigit() else None
    tscale = 1e-3  # ns -> us
    if units and ci_t < len(units):
        u = units[ci_t].lower()
        tscale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(u, 1e-3)
    bscale = 1.0
    if units and ci_r is not None and ci_r < len(units):
        bscale = {"byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9}.get(units[ci_r].lower(), 1.0)
    ks = []
    for r in rows[1 + (units is not None):]:
        if len(r) <= ci_t or not r[0].strip():
            continue
        ks.append(dict(name=short(r[ci_name]), grid=r[ci_grid] if ci_grid is not None else "",
                       block=r[ci_block] if ci_block is not None else "", us=num(r[ci_t]) * tscale,
                       rd=num(r[ci_r]) * bscale if ci_r is not None else float("nan"),
                       wr=num(r[ci_w]) * bscale if ci_w is not None else float("nan")))
    starts = [i for i, k in enumerate(ks) if k["name"].startswith("sm_embed")]
    print(f"[{tag}] {len(ks)} kernels profiled, {len(starts)} forward passes (split at sm_embed), "
          f"{starts[0] if starts else len(ks)} before the first")
    if not starts:
        return 1
    fw = [ks[a:b] for a, b in zip(starts, starts[1:] + [len(ks)])]
    step = fw[-1]
    if len(fw) >= 2:
        prev = fw[-2]
        same = [k["name"] for k in prev] == [k["name"] for k in step]
        print(f"[{tag}] forward sizes (kernels): {[len(f) for f in fw]}; last two "
              f"{'have the same kernel sequence' if same else 'DIFFER'}; kernel-time sums (us): "
              + ", ".join(f"{sum(k['us'] for k in f):.1f}" for f in fw))
    tot = sum(k["us"] for k in step)
    print(f"[{tag}] the last forward: {len(step)} kernels, {tot:.1f} us of kernel time (serialized by ncu)")
    print(f"{'#':>4} {'kernel':58s} {'grid':>14s} {'block':>12s} {'us':>8s} {'MB':>8s} {'GB/s':>6s}")
    for i, k in enumerate(step):
        mb = (k["rd"] + k["wr"]) / 1e6
        gbs = mb * 1e6 / (k["us"] * 1e-6) / 1e9 if k["us"] > 0 else 0
        print(f"{i:4d} {k['name'][:58]:58s} {k['grid'][:14]:>14s} {k['block'][:12]:>12s} "
              f"{k['us']:8.2f} {mb:8.2f} {gbs:6.0f}")
    agg = {}
    for k in step:
        a = agg.setdefault(k["name"], [0, 0.0, 0.0])
        a[0] += 1
        a[1] += k["us"]
        a[2] += k["rd"] + k["wr"]
    print(f"[{tag}] per kernel name, by total time:")
    print(f"{'kernel':62s} {'n':>4s} {'total us':>9s} {'%':>6s} {'us/call':>8s} {'MB':>8s} {'GB/s':>6s}")
    for name, (n, us, b) in sorted(agg.items(), key=lambda x: -x[1][1]):
        print(f"{name[:62]:62s} {n:4d} {us:9.1f} {100 * us / tot:6.1f} {us / n:8.2f} {b / 1e6:8.1f} "
              f"{b / (us * 1e-6) / 1e9 if us > 0 else 0:6.0f}")
    mb = sum(k["rd"] + k["wr"] for k in step) / 1e6
    print(f"[{tag}] total {tot:.1f} us, {mb:.1f} MB DRAM, {mb * 1e6 / (tot * 1e-6) / 1e9:.0f} GB/s over the step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
