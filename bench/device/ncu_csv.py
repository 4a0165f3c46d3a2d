"""ncu_csv.py: the kernels of an ncu raw CSV, shared by decprof_table.py and c16_table.py.

The CSV is `ncu --import R --csv --page raw --print-units base` with the metrics
gpu__time_duration.sum, dram__bytes_read.sum, dram__bytes_write.sum. load() gives one dict a
kernel launch, in launch order: name (return type and parameter list dropped), grid, block,
us, rd and wr (DRAM bytes; NaN when the metric is missing), mb (rd + wr in MB, missing as 0).
"""
import csv
import math


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


TIME_UNITS = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
BYTE_UNITS = {"byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9}


def load(path):
    """The kernels of the CSV at path; raises ValueError naming what is missing."""
    lines = open(path, errors="replace").read().splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        raise ValueError(f"no ncu table in {path}: " + " | ".join(lines[:3])[:300])
    rows = list(csv.reader(lines[start:]))
    col = {h: i for i, h in enumerate(rows[0])}

    def find(key):
        return next((i for h, i in col.items() if h == key or h.startswith(key)), None)

    cn, cg, cb = find("Kernel Name"), find("Grid Size"), find("Block Size")
    ct, cr, cw = find("gpu__time_duration.sum"), find("dram__bytes_read.sum"), find("dram__bytes_write.sum")
    if cn is None or ct is None:
        raise ValueError(f"columns missing in {path}: {rows[0]}")
    units = rows[1] if len(rows) > 1 and not rows[1][0].strip().isdigit() else None
    ts = TIME_UNITS.get(units[ct].lower(), 1e-3) if units and ct < len(units) else 1e-3
    bs = BYTE_UNITS.get(units[cr].lower(), 1.0) if units and cr is not None and cr < len(units) else 1.0
    ks = []
    for r in rows[1 + (units is not None):]:
        if len(r) <= ct or not r[0].strip():
            continue
        rd = num(r[cr]) * bs if cr is not None else float("nan")
        wr = num(r[cw]) * bs if cw is not None else float("nan")
        ks.append(dict(name=short(r[cn]), grid=r[cg] if cg is not None else "",
                       block=r[cb] if cb is not None else "", us=num(r[ct]) * ts, rd=rd, wr=wr,
                       mb=((0 if math.isnan(rd) else rd) + (0 if math.isnan(wr) else wr)) / 1e6))
    return ks
