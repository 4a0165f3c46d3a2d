#!/usr/bin/env python3
"""dectrace_table.py: where a decode step's time goes on the GPU timeline (bench/device/dectrace.sh).

usage: dectrace_table.py CUDA_GPU_TRACE.csv TAG [N_STEPS]

The CSV is bench/tools/cutrace.c's (CUPTI activity records, CUDA graph nodes one by one) of a
`laststand generate` run. Kernels are split into forward passes at the embedding kernel (sm_embed*);
the last N_STEPS (default 16) passes with the most common kernel sequence (names and grids) are
the graph-replayed decode steps. For each kernel position: the mean duration, the mean gap from the previous kernel's
end to its start (negative: it started before its predecessor ended, PDL), and its share of the
step: end_i - max(end_j, j < i) (the time by which it moves the step's end; these sum to the span
from the first kernel's start to the last one's end, with the first kernel's duration). Tables:
per kernel name, and the first GDN layer's and first attention layer's positions in detail.
"""
import csv
import re
import subprocess
import sys
from collections import Counter, defaultdict


def demangle(names):
    """c++filt where the machine has it, else the identifier after _Z<len>"""
    try:
        r = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, timeout=20)
        out = r.stdout.split("\n")
        if r.returncode == 0 and len(out) >= len(names):
            return out[: len(names)]
    except (OSError, subprocess.SubprocessError):
        pass
    res = []
    for n in names:
        m = re.match(r"_Z(\d+)", n)
        res.append(n[m.end(): m.end() + int(m.group(1))] if m else n)
    return res


def load(path):
    """rows of cutrace.c's CSV (start_ns,dur_ns,gx,gy,gz,bx,graph,stream,name), by start"""
    rows = []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            try:
                rows.append((int(row["start_ns"]), int(row["dur_ns"]), row["name"],
                             f"({row['gx']},{row['gy']},{row['gz']})"))
            except (KeyError, ValueError):
                continue
    uniq = sorted({r[2] for r in rows})
    dm = dict(zip(uniq, demangle(uniq)))
    short = {n: re.sub(r"^void ", "", dm[n].split("(")[0])[:54] for n in uniq}
    ks = [(s, d, short[n] + " " + g) for s, d, n, g in rows]
    ks.sort()
    return ks


def main():
    path, tag = sys.argv[1], sys.argv[2]
    n_keep = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    ks = load(path)
    starts = [i for i, k in enumerate(ks) if k[2].startswith("sm_embed")]
    fw = [ks[a:b] for a, b in zip(starts, starts[1:] + [len(ks)])]
    if not fw:
        print(f"[{tag}] no forward passes in {len(ks)} kernels")
        return 1
    # the decode steps: the forwards with the most common kernel sequence (names with grids, so
    # that steps of another batch size, e.g. while requests join or finish, are left out)
    seqs = [tuple(k[2] for k in f) for f in fw]
    common = Counter(seqs).most_common(1)[0][0]
    n_k = len(common)
    steps = [f for f, q in zip(fw, seqs) if q == common][-n_keep:]
    print(f"[{tag}] {len(ks)} kernels, {len(fw)} forwards; {len(steps)} steps of {n_k} kernels tabulated "
          f"(the most common kernel sequence, {seqs.count(common)} forwards)")
    dur = [0.0] * n_k
    gap = [0.0] * n_k
    inc = [0.0] * n_k
    spans = []
    for st in steps:
        end_max = st[0][0]
        prev_end = st[0][0]
        for i, (s, d, _) in enumerate(st):
            e = s + d
            dur[i] += d / 1e3
            gap[i] += (s - prev_end) / 1e3 if i else 0.0
            inc[i] += max(0, e - end_max) / 1e3
            end_max = max(end_max, e)
            prev_end = e
        spans.append((end_max - st[0][0]) / 1e3)
    ns = len(steps)
    dur = [x / ns for x in dur]
    gap = [x / ns for x in gap]
    inc = [x / ns for x in inc]
    names = [k[2] for k in steps[-1]]
    span = sum(spans) / ns
    period = [(b[0][0] - a[0][0]) / 1e3 for a, b in zip(steps, steps[1:])]
    if period:
        print(f"[{tag}] step period (embedding start to the next one's) mean {sum(period) / len(period):.1f} us")
    # next step's start after this step's end: the host / sampler gap between steps
    print(f"[{tag}] step span (first kernel start .. last end) mean {span:.1f} us; "
          f"sum of durations {sum(dur):.1f} us; min/max span {min(spans):.1f} / {max(spans):.1f}")
    by = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for i, n in enumerate(names):
        b = by[n]
        b[0] += 1
        b[1] += dur[i]
        b[2] += inc[i]
        b[3] += gap[i]
    print(f"{'kernel':<62} {'n':>4} {'dur us':>8} {'share us':>9} {'%':>5} {'share/call':>10} {'gap/call':>8}")
    for n, (c, d, s, g) in sorted(by.items(), key=lambda kv: -kv[1][2]):
        print(f"{n[:62]:<62} {c:>4} {d:8.1f} {s:9.1f} {100 * s / span:5.1f} {s / c:10.2f} {g / c:8.2f}")
    # detail: the positions of the first layer that has a gd_kernel and of the first with fp_dec
    def detail(key):
        try:
            j = next(i for i, n in enumerate(names) if n.startswith(key))
        except StopIteration:
            return
        a = j
        while a > 0 and not names[a].startswith("sm_add_rmsnorm"):
            a -= 1
        b = a + 1
        while b < n_k and not names[b].startswith("sm_add_rmsnorm"):
            b += 1
        b += 1
        while b < n_k and not names[b].startswith("sm_add_rmsnorm"):
            b += 1
        print(f"[{tag}] the layer around position {j} ({key}), positions {a}..{b - 1}:")
        print(f"  {'#':>4} {'kernel':<52} {'dur':>7} {'gap':>7} {'share':>7}")
        for i in range(a, b):
            print(f"  {i:>4} {names[i][:52]:<52} {dur[i]:7.2f} {gap[i]:7.2f} {inc[i]:7.2f}")
        print(f"  layer total: dur {sum(dur[a:b]):.1f}, share {sum(inc[a:b]):.1f} us")
    detail("gd_kernel")
    detail("fp_dec")
    print(f"[{tag}] last 6 positions:")
    for i in range(max(0, n_k - 6), n_k):
        print(f"  {i:>4} {names[i][:52]:<52} {dur[i]:7.2f} {gap[i]:7.2f} {inc[i]:7.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
