"""smallops_table.py: the row-wise norms of ncu raw CSVs of one `generate` each (synth 35B cut to
4 layers: 3 GDN + 1 attention, an 8192-token prompt, then decode steps) under the forms of
LASTSTAND_SMALL_ROWS, side by side; the first is the baseline (the block kernels, =0).

    python3 smallops_table.py TOKENS old=OLD.csv rows=ROWS.csv pipe=PIPE.csv ...

Families: norm (sm_rmsnorm_kernel / sm_rmsnorm_rows_kernel: the GDN gated norm at prefill) and
qk (sm_qk_norm_rope_kv_kernel / sm_qk_rows_kernel and the unfused sm_qk_norm_rope_kernel);
phase: prefill (grid >= 512 blocks or >= 10 MB moved) or decode. Per family and phase: launches, µs a launch, MB
a launch (DRAM read + write), GB/s; then the prefill step's saving scaled to the 40-layer model
(30 GDN layers, 10 attention layers).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ncu_csv  # noqa: E402


def family(name):
    if name.startswith("sm_rmsnorm"):
        return "norm"
    if name.startswith("sm_qk_"):
        return "qk"
    return None


def grid_x(g):
    try:
        return int(g.strip("() ").split(",")[0])
    except ValueError:
        return 0


def table(path):
    out = {}
    for k in ncu_csv.load(path):
        f = family(k["name"])
        if f is None:
            continue
        ph = "prefill" if grid_x(k["grid"]) >= 512 or k["mb"] >= 10 else "decode"
        e = out.setdefault((f, ph), dict(n=0, us=0.0, mb=0.0, names=set()))
        e["n"] += 1
        e["us"] += k["us"]
        e["mb"] += k["mb"]
        e["names"].add(k["name"] + " " + k["grid"].replace(" ", ""))
    return out


def main():
    tok = int(sys.argv[1])
    forms = []
    for a in sys.argv[2:]:
        tag, path = a.split("=", 1)
        try:
            forms.append((tag, table(path)))
        except (OSError, ValueError) as err:
            print(f"FAIL {tag}: {err}")
    if not forms:
        return
    print(f"{'family':6s} {'phase':8s} {'form':5s} {'n':>3s} {'us/launch':>10s} {'MB/launch':>10s} {'GB/s':>7s}  kernels")
    per = {}
    keys = sorted(set().union(*[set(t) for _, t in forms]))
    for key in keys:
        for form, t in forms:
            e = t.get(key)
            if not e:
                print(f"{key[0]:6s} {key[1]:8s} {form:5s}   0")
                continue
            us, mb = e["us"] / e["n"], e["mb"] / e["n"]
            per[(key, form)] = us
            print(f"{key[0]:6s} {key[1]:8s} {form:5s} {e['n']:3d} {us:10.2f} {mb:10.2f} {mb / us * 1e3:7.0f}  "
                  + "; ".join(sorted(e["names"]))[:160])
    base = forms[0][0]
    for form, _ in forms[1:]:
        save = 0.0
        for f, layers in (("norm", 30), ("qk", 10)):
            for ph in ("prefill", "decode"):
                a, b = per.get(((f, ph), form)), per.get(((f, ph), base))
                if a is None or b is None:
                    continue
                print(f"VERDICT {form} {f} {ph}: {a:.2f} us, {base} {b:.2f} us a launch ({b / a:.2f}x) "
                      f"{'FASTER' if a < b else 'SLOWER'}")
                if ph == "prefill":
                    save += (b - a) * layers
        print(f"{form}: prefill step of {tok} tokens, 40-layer model (30 GDN norms + 10 qk launches): "
              f"{save / 1e3:.2f} ms saved against {base}")


main()
