#!/usr/bin/env python3
"""c16_table.py: one pure-decode forward of R rows out of an ncu raw CSV (bench/device/c16.sh).

usage: c16_table.py NCU_RAW.csv TAG [ROWS]

The CSV is `ncu --import R --csv --page raw --print-units base` of a whole `laststand serve` run
(eager, --disable-cuda-graph) with the metrics gpu__time_duration.sum, dram__bytes_read.sum,
dram__bytes_write.sum, under `laststand bench` at concurrency ROWS (default 16). The kernel
sequence is split into forward passes at the embedding kernel (sm_embed*, one block per token:
its grid is the forward's token count). The last forward whose embedding grid is ROWS and that
runs the decode kernels (gd_kernel / fp_dec_kernel) and no prefill kernel is a decode step of
ROWS rows (a prefill of ROWS tokens of one sequence would run the chunked GDN kernels instead).

Printed: every kernel of one GDN layer and of one attention layer (the middle ones of their kind)
and of the step's head and tail (embedding, final norm, lm_head, sampling) with µs, DRAM MB read +
written and GB/s; then per layer kind the mean layer (µs, MB) x the layer count; then the step
total and one row per kernel name (count, µs, %). Layers are cut at the last RMSNorm kernel before
each layer's core kernel (gd_kernel for GDN, fp_dec_kernel for attention).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ncu_csv  # noqa: E402

CORE = {"gd_kernel": "gdn", "gd_kernel1": "gdn", "fp_dec_kernel": "attn"}
PREFILL = ("fp_kernel", "gc_", "gdn_conv", "gdn_rec")


def base(n):
    """template arguments dropped: `f<A, B>` -> `f`."""
    i = n.find("<")
    return n[:i] if i > 0 else n


def load(path):
    try:
        return ncu_csv.load(path)
    except ValueError as err:
        raise SystemExit(str(err))


def gbs(mb, us):
    return mb / us * 1e3 if us > 0 else 0.0  # MB/us = TB/s


def tok_count(grid):
    g = grid.strip("() ").split(",")
    try:
        return int(g[0])
    except ValueError:
        return -1


def row(k, i=None):
    return (f"{'' if i is None else i:>4} {k['name'][:60]:60s} {k['grid'][:13]:>13s} {k['block'][:12]:>12s} "
            f"{k['us']:8.2f} {k['mb']:8.2f} {gbs(k['mb'], k['us']):6.0f}")


def main():
    path, tag = sys.argv[1], sys.argv[2]
    want = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    ks = load(path)
    starts = [i for i, k in enumerate(ks) if k["name"].startswith("sm_embed")]
    fw = [ks[a:b] for a, b in zip(starts, starts[1:] + [len(ks)])]
    sizes = [tok_count(f[0]["grid"]) for f in fw]
    print(f"[{tag}] {len(ks)} kernels, {len(fw)} forwards; tokens per forward: {sizes}")
    pick = None
    for f, n in zip(fw, sizes):
        names = [base(k["name"]) for k in f]
        if n == want and any(x in CORE for x in names) and not any(x.startswith(PREFILL) for x in names):
            pick = f
    if pick is None:
        print(f"[{tag}] no pure-decode forward of {want} rows")
        return 1
    # layers: cut at the last norm kernel before each core kernel
    core = [i for i, k in enumerate(pick) if base(k["name"]) in CORE]
    norm = [i for i, k in enumerate(pick) if "rmsnorm" in k["name"]]
    cuts = []
    prev = 0
    for c in core:
        cand = [j for j in norm if prev < j < c]
        cuts.append(cand[-1] if cand else prev + 1)
        prev = c
    tail0 = max((j for j in norm if j > core[-1]), default=len(pick))  # the final norm
    # the final norm is the last norm of the forward; the last layer's MoE sits between
    layers = []
    for li, c in enumerate(core):
        a = cuts[li]
        b = cuts[li + 1] if li + 1 < len(core) else tail0
        layers.append((CORE[base(pick[c]["name"])], pick[a:b]))
    head, tail = pick[:cuts[0]], pick[tail0:]
    tot = sum(k["us"] for k in pick)
    mbt = sum(k["mb"] for k in pick)
    print(f"[{tag}] decode step of {want} rows: {len(pick)} kernels, {tot:.1f} us kernel time (serialized by ncu), "
          f"{mbt:.1f} MB DRAM, {gbs(mbt, tot):.0f} GB/s; {len(layers)} layers "
          f"({sum(1 for t, _ in layers if t == 'gdn')} gdn, {sum(1 for t, _ in layers if t == 'attn')} attn)")
    hdr = f"{'#':>4} {'kernel':60s} {'grid':>13s} {'block':>12s} {'us':>8s} {'MB':>8s} {'GB/s':>6s}"
    for kind in ("gdn", "attn"):
        ls = [l for t, l in layers if t == kind]
        if not ls:
            continue
        mid = ls[len(ls) // 2]
        print(f"[{tag}] one {kind} layer (#{len(ls) // 2} of {len(ls)}):")
        print(hdr)
        for i, k in enumerate(mid):
            print(row(k, i))
        us = [sum(k["us"] for k in l) for l in ls]
        mb = [sum(k["mb"] for k in l) for l in ls]
        print(f"  {kind} layer: mean {sum(us) / len(us):.1f} us (min {min(us):.1f}, max {max(us):.1f}), "
              f"{sum(mb) / len(mb):.1f} MB, x {len(ls)} = {sum(us):.1f} us")
    print(f"[{tag}] head and tail (embedding; final norm, lm_head, sampling):")
    print(hdr)
    for k in head + tail:
        print(row(k))
    print(f"  head + tail {sum(k['us'] for k in head + tail):.1f} us, {sum(k['mb'] for k in head + tail):.1f} MB")
    agg = {}
    for k in pick:
        a = agg.setdefault(k["name"], [0, 0.0, 0.0])
        a[0] += 1
        a[1] += k["us"]
        a[2] += k["mb"]
    print(f"[{tag}] per kernel name, by total time:")
    print(f"{'kernel':66s} {'n':>4s} {'total us':>9s} {'%':>6s} {'us/call':>8s} {'MB':>8s} {'GB/s':>6s}")
    for name, (n, us, b) in sorted(agg.items(), key=lambda x: -x[1][1]):
        print(f"{name[:66]:66s} {n:4d} {us:9.1f} {100 * us / tot:6.1f} {us / n:8.2f} {b:8.1f} {gbs(b, us):6.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
