"""gdnprep_table.py: the gc_ kernels of one ncu raw CSV (bench/device/gdnprep.sh), grouped by name:
launches, µs each (mean over the GDN layers), DRAM MB each, GB/s; one line per kernel and a total.
   python3 gdnprep_table.py CSV LABEL
"""
import sys

sys.path.insert(0, __import__("os").path.dirname(__file__))
import ncu_csv  # noqa: E402

path, label = sys.argv[1], sys.argv[2]
ks = [k for k in ncu_csv.load(path) if k["name"].startswith("gc_")]
if not ks:
    print(f"  {label}: no gc_ kernel in the report")
    sys.exit(1)
order, by = [], {}
for k in ks:
    if k["name"] not in by:
        order.append(k["name"])
        by[k["name"]] = []
    by[k["name"]].append(k)
tot = 0.0
for n in order:
    v = by[n]
    us = sum(k["us"] for k in v) / len(v)
    mb = sum(k["mb"] for k in v) / len(v)
    tot += us * len(v)
    print(f"  {label:4s} {n:40s} x{len(v)}  grid {v[0]['grid']:>14s}  {us:8.1f} us  {mb:8.1f} MB  "
          f"{mb / us if us else 0:6.2f} TB/s")
print(f"  {label:4s} gc_ kernels total {tot:.1f} us over {len(ks)} launches")
