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
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ncu_csv  # noqa: E402


def main():
    path, tag = sys.argv[1], sys.argv[2]
    try:
        ks = ncu_csv.load(path)
    except ValueError as err:
        print(f"[{tag}] {err}")
        return 1
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
