#!/usr/bin/env bash
# bench/device/gemmplan.sh: serve takes the doctor's per-bucket choice for BF16 GEMMs too
# (--gemm-backend auto: a plan such as cuda_gemv:8,cuda_cublaslt), checked on the H200
# (DEVICE_ROUNDS.md protocol; under 100 s; no fixtures needed).
#
#   bash bench/device/gemmplan.sh BIN OUTDIR
#     BIN     the laststand binary (its .so files beside it)
#     OUTDIR  logs and the doctor's cache (a fresh XDG_CACHE_HOME under it)
#   env GP_DEVICE=cpu GP_MODEL=build/demo-model GP_BASE=cpu_ref: a dry run of the script's logic
#
# 1. Two servers on synth:qwen3.5-35b-a3b,layers=4:
#      plan      every backend flag at auto: the doctor runs at serve's default buckets
#                (1,8,64,512,2048); serve builds each family's plan from its per-bucket picks,
#                gemm included, and smoke-tests it (prefill chunks + decode steps run every entry)
#      cublaslt  --gemm-backend cuda_cublaslt (the other families at auto, from the cached decision)
#    Printed: both "last backend standing" tables (the gemm row too), the smoke-test lines, what
#    was banned, and the doctor's gemm cells summed over the model's BF16 shapes per bucket.
# 2. VERDICT GEMMPLAN: the gemm plan serve reports (/get_server_info) gives every bucket the
#    backend the doctor chose there (so cuda_gemv at the small M where the doctor chose it).
#    VERDICT PLAN: some family serves with a plan of >= 2 entries (bucket.sh's check).
# 3. VERDICT OUTPUT: the smoke child (`serve --smoke-trial`, what serve's smoke test runs) with the
#    plan server's backends: greedy with --gemm-backend cuda_cublaslt on a fixed 600-token prompt
#    (prefill chunks 1, 8, 591: small-M GEMMs in the prefill too) and 64 decode steps; then the
#    gemm plan teacher-forced on those ids, judged by the smoke test's rules (max |a - b| / max |b|
#    per step <= 0.25, the argmax equal wherever the top-2 margin is clear); and the plan greedy on
#    its own (ids equal to cuBLASLt's: printed, BF16 rounding may flip near-ties).
# 4. Decode step time through each server (CUDA graphs on, as served): a 16-token prompt with 1
#    and 129 new tokens, and 8 requests of 65 new tokens at once (M = 8 decode steps); the servers
#    take turns, 5 rounds, the best of each printed with every round's figure.
# 5. ncu (if present, time permitting): every BF16 GEMM kernel of one M = 1 forward (`logits`
#    with one id) with --gemm-backend cuda_gemv and cuda_cublaslt, the lm_head included (the
#    doctor's gemm shapes do not list it, but a plan's small-M entry runs it at decode).
set -u
BIN=${1:?usage: gemmplan.sh BIN OUTDIR}
OUT=${2:?usage: gemmplan.sh BIN OUTDIR}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$(cd "$(dirname "$BIN")" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader 2>&1 | head -2
python3 - "$BIN" "$OUT" <<'PY'
import json, os, re, signal, socket, struct, subprocess, sys, threading, time, urllib.request

BIN, OUT = sys.argv[1:3]
T0 = time.time()
BUDGET = float(os.environ.get("GP_BUDGET_S", "92"))
DEV = os.environ.get("GP_DEVICE", "cuda")
MODEL = os.environ.get("GP_MODEL", "synth:qwen3.5-35b-a3b,layers=4")
BASE = os.environ.get("GP_BASE", "cuda_cublaslt" if DEV == "cuda" else "cpu_ref")
TOL = 0.25 if DEV == "cuda" else 1e-3  # serve_auto.c's smoke tolerance
FAMS = ("fp4_gemm", "moe", "attention", "gdn", "gemm")
FLAGS = {"fp4_gemm": "--fp4-gemm-backend", "moe": "--moe-runner-backend", "attention": "--attention-backend",
         "gdn": "--gdn-backend", "gemm": "--gemm-backend"}
def el(): return f"{time.time() - T0:5.1f}s"
def left(): return T0 + BUDGET - time.time()

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

env = dict(os.environ, XDG_CACHE_HOME=os.path.join(os.path.abspath(OUT), "cache"))
COMMON = ["--model-path", MODEL, "--device", DEV, "--doctor-timeout", "60", "--max-running-requests", "16",
          "--context-length", "4096", "--max-total-tokens", "32768", "--log-level", "info"]

class Server:
    def __init__(self, tag, extra):
        self.tag, self.port = tag, free_port()
        self.log_path = os.path.join(OUT, f"{tag}.log")
        self.log = open(self.log_path, "w")
        self.p = subprocess.Popen([BIN, "serve", *COMMON, "--port", str(self.port), *extra], stdout=self.log,
                                  stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"
        print(f"{el()} start {tag}: serve {' '.join(extra) or '(all backends auto)'} (pid {self.p.pid})", flush=True)
    def text(self):
        return open(self.log_path, errors="replace").read()
    def healthy(self):
        try:
            urllib.request.urlopen(self.url + "/health", timeout=1).read(); return True
        except Exception:
            return False
    def wait(self, deadline):
        while time.time() < deadline:
            if self.p.poll() is not None:
                return False
            if self.healthy():
                return True
            time.sleep(0.3)
        return False
    def info(self):
        return json.loads(urllib.request.urlopen(self.url + "/get_server_info", timeout=10).read())
    def gen(self, ids, n):
        body = json.dumps({"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": n,
                                                                  "ignore_eos": True}}).encode()
        req = urllib.request.Request(self.url + "/generate", data=body, headers={"Content-Type": "application/json"})
        t = time.time()
        out = json.loads(urllib.request.urlopen(req, timeout=max(5, left())).read())
        return time.time() - t, out.get("output_ids", [])
    def stop(self):
        if self.log.closed:
            return
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill(); self.p.wait()
        self.log.close()

def show_table(s):
    lines = s.text().splitlines()
    starts = [i for i, l in enumerate(lines) if "the last backend standing" in l or "backend check FAILED" in l]
    for l in lines:
        if ("smoke test:" in l or "eliminated, never taken" in l or "backend check: " in l
                or "error" in l.lower() or "no per-bucket" in l) and "doctor: " not in l:
            print(f"   [{s.tag}] {l.split('] ', 1)[-1][:400]}")
    if starts:
        for l in lines[starts[-1]:starts[-1] + 2 + len(FAMS)]:
            print(f"   [{s.tag}] {l.split('] ', 1)[-1][:600]}")
    else:
        print(f"   [{s.tag}] no backend table; log tail:")
        for l in lines[-12:]:
            print(f"   [{s.tag}]   {l[:300]}")

def plan_entry(text, M):
    """The backend a plan text ("a:8,b" or "a") gives a call of M rows (ops_plan_at)."""
    for e in text.split(","):
        name, _, bound = e.partition(":")
        if not bound or M <= int(bound):
            return name
    return text.split(",")[-1].split(":")[0]

def doctor_report(s):
    m = re.search(r"decision cached in (\S+)|the doctor's cached decision (\S+)", s.text())
    path = m and (m.group(1) or m.group(2))
    try:
        return json.load(open(path)), path
    except Exception as ex:
        print(f"{el()} the doctor's report: unreadable ({path}: {ex!r})")
        return None, path

def gemm_sums(rep):
    """{backend: {M: summed ms over the gemm shapes, or None where a shape is not ok}}."""
    sums = {}
    for t in rep.get("tables", []):
        if t.get("family") != "gemm":
            continue
        for name, row in t["cells"].items():
            d = sums.setdefault(name, {})
            for mk, c in row.items():
                ok = c.get("status") == "ok" and (c.get("ms") or 0) > 0
                prev = d.get(int(mk), 0.0)
                d[int(mk)] = None if (prev is None or not ok) else prev + c["ms"]
    return sums

def read_smoke(path):
    import numpy as np
    b = open(path, "rb").read()
    V, L, S = struct.unpack("<3i", b[:12])
    ids = np.frombuffer(b, dtype="<i4", count=L + S, offset=12)
    rows = np.frombuffer(b, dtype="<f4", count=S * V, offset=12 + 4 * (L + S)).reshape(S, V)
    return V, L, S, ids, rows

def smoke_child(tag, names, L, S, chunks, ids=None):
    """One `serve --smoke-trial` child (serve_auto.c): greedy (ids None: fixed ids) or teacher-forced."""
    outp = os.path.join(OUT, f"smoke-{tag}.bin")
    cmd = [BIN, "serve", "--smoke-trial", "--model-path", MODEL, "--device", DEV]
    for f in FAMS:
        cmd += [FLAGS[f], names.get(f) or "auto"]
    if ids is None:
        cmd += ["--smoke-len", str(L)]
    else:
        cmd += ["--smoke-ids", ",".join(str(int(x)) for x in ids), "--smoke-prompt-len", str(L)]
    cmd += ["--smoke-chunks", chunks, "--smoke-steps", str(S), "--smoke-out", outp]
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=max(10, left()))
    if p.returncode:
        print(f"{el()} smoke child {tag}: exit {p.returncode}: {(p.stdout + p.stderr).strip()[-600:]}")
        return None
    print(f"{el()} smoke child {tag}: gemm {names.get('gemm')}, {time.time() - t:.1f} s", flush=True)
    return read_smoke(outp)

def judge(ref, got):
    """serve_auto.c judge(): per step max|a-b|/max|b| <= TOL; argmax equal unless the reference's
    top-2 margin is within 2·TOL·max|b|. Returns (worst rel, argmax equal steps, faults)."""
    import numpy as np
    V, L, S, rids, rrows = ref
    _, _, _, _, grows = got
    worst, same, faults = 0.0, 0, []
    for s in range(S):
        a, b = grows[s].astype(np.float64), rrows[s].astype(np.float64)
        if not np.all(np.isfinite(a)):
            faults.append(f"step {s}: NaN/Inf"); continue
        bmax = max(float(np.abs(b).max()), 1e-30)
        rel = float(np.abs(a - b).max()) / bmax
        worst = max(worst, rel)
        if rel > TOL:
            faults.append(f"step {s}: rel err {rel:.3g} > {TOL}")
        ta, tb = int(a.argmax()), int(rids[L + s])
        if ta == tb:
            same += 1
        else:
            top2 = np.sort(b)[-2:]
            margin = float(top2[1] - top2[0])
            if margin > 2 * TOL * bmax:
                faults.append(f"step {s}: argmax {ta} vs {tb} with a clear margin {margin:.3g}")
            else:
                print(f"   step {s}: argmax {ta} vs cuBLASLt's {tb}: a near-tie (top-2 margin {margin:.3g}, "
                      f"{margin / bmax:.2g} of max|logit|)")
    return worst, same, faults

servers = {}
try:
    servers["plan"] = Server("plan", [])
    while left() > 50 and servers["plan"].p.poll() is None and "decision cached in" not in servers["plan"].text() \
            and "cached decision" not in servers["plan"].text():
        time.sleep(0.3)
    print(f"{el()} the doctor's decision is cached", flush=True)
    servers["cublaslt"] = Server("cublaslt", ["--gemm-backend", BASE])
    ok = {t: s.wait(T0 + BUDGET - 45) for t, s in servers.items()}
    for t, s in servers.items():
        print(f"{el()} {t}: {'healthy' if ok[t] else 'NOT healthy'}", flush=True)
        show_table(s)
    info = {t: (s.info() if ok[t] else {}) for t, s in servers.items()}
    pb = info["plan"].get("backends", {})
    print(f"{el()} /get_server_info backends: plan {pb}; cublaslt {info['cublaslt'].get('backends')}")
    print(f"{el()} VERDICT PLAN: {'ok' if any(',' in (pb.get(f) or '') for f in FAMS) else 'FAIL'} (some family "
          f"serves with a plan: {', '.join(f'{f} {pb.get(f)}' for f in FAMS)})")

    # the doctor's gemm choice per bucket against the plan serve reports
    rep, rpath = doctor_report(servers["plan"])
    gplan = pb.get("gemm")
    if rep and gplan:
        choice = {int(k): v for k, v in rep.get("choice", {}).get("gemm", {}).items()}
        sums = gemm_sums(rep)
        names = sorted(sums)
        print(f"{el()} the doctor's gemm cells ({rpath}), summed over the model's BF16 shapes, ms:")
        print("      M  " + "  ".join(f"{n:>14}" for n in names) + "  doctor's choice  plan's entry")
        bad = []
        for M in sorted(choice):
            cells = "  ".join(f"{(sums[n].get(M) if sums[n].get(M) is not None else float('nan')):14.4f}" for n in names)
            ent = plan_entry(gplan, M)
            print(f"  {M:5d}  {cells}  {choice[M]:>15}  {ent}")
            if ent != choice[M]:
                bad.append(f"M={M}: plan {ent}, doctor {choice[M]}")
        gemv_ms = [M for M in sorted(choice) if choice[M] == "cuda_gemv"]
        if bad:
            print(f"{el()} VERDICT GEMMPLAN: FAIL: the served gemm plan '{gplan}' differs from the doctor's choice: "
                  f"{'; '.join(bad)}")
        elif gemv_ms:
            print(f"{el()} VERDICT GEMMPLAN: ok: gemm serves '{gplan}': cuda_gemv at M={','.join(map(str, gemv_ms))} "
                  f"where the doctor chose it, the doctor's pick at every bucket")
        else:
            print(f"{el()} VERDICT GEMMPLAN: ok (n/a): the doctor chose cuda_gemv at no bucket; gemm serves "
                  f"'{gplan}', the doctor's pick at every bucket")
    else:
        print(f"{el()} VERDICT GEMMPLAN: FAIL: no doctor report ({rpath}) or no gemm backend in /get_server_info")

    # greedy output: cuBLASLt-only vs the gemm plan, through serve's own smoke child
    if gplan and left() > 25:
        others = {f: pb.get(f) for f in FAMS if f != "gemm"}
        L, S, chunks = 600, 64, "1,8,591"
        ref = smoke_child("cublaslt", dict(others, gemm=BASE), L, S, chunks)
        tf = ref and smoke_child("plan-forced", dict(others, gemm=gplan), L, S, chunks, ids=ref[3][:L + S - 1])
        if ref and tf:
            worst, same, faults = judge(ref, tf)
            print(f"{el()} VERDICT OUTPUT: {'FAIL' if faults else 'ok'}: gemm '{gplan}' teacher-forced on cuBLASLt's "
                  f"greedy ids ({L}-token prompt in chunks {chunks}, {S} decode steps): max logits rel err {worst:.3g} "
                  f"(smoke tolerance {TOL}), argmax equal at {same}/{S} steps{'; ' + '; '.join(faults[:4]) if faults else ''}")
            if left() > 12:
                gr = smoke_child("plan-greedy", dict(others, gemm=gplan), L, S, chunks)
                if gr:
                    a, b = list(ref[3][L:]), list(gr[3][L:])
                    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
                    print(f"{el()} greedy ids, plan vs cuBLASLt alone: equal on {sum(x == y for x, y in zip(a, b))}/{S}"
                          f"{'' if first is None else f', first difference at step {first}'}")
                    print(f"   cuBLASLt: {[int(x) for x in a[:16]]}")
                    print(f"   plan:     {[int(x) for x in b[:16]]}")
        else:
            print(f"{el()} VERDICT OUTPUT: FAIL: a smoke child failed (above)")
    else:
        print(f"{el()} VERDICT OUTPUT: SKIPPED ({'no gemm plan' if not gplan else 'time budget spent'})")

    # decode step time, as served (CUDA graphs): the servers take turns, 5 rounds, best of each
    short = [(i * 37 + 11) % 2000 + 10 for i in range(16)]
    live = {t: s for t, s in servers.items() if ok[t]}
    one, many, m8 = ({t: [] for t in live} for _ in range(3))
    def eight(s):
        th = [threading.Thread(target=s.gen, args=(short, 65)) for _ in range(8)]
        t8 = time.time(); [x.start() for x in th]; [x.join() for x in th]
        return time.time() - t8
    try:
        for s in live.values():
            s.gen(short, 8)  # warm-up
            eight(s)
        for rnd in range(5):
            if left() < 6:
                break
            for t, s in live.items():
                one[t].append(s.gen(short, 1)[0])
                many[t].append(s.gen(short, 129)[0])
                m8[t].append(eight(s))
    except Exception as ex:
        print(f"{el()} decode timing: request FAILED: {ex!r}")
    res = {}
    for t in live:
        if not many[t]:
            print(f"{el()} {t}: decode timing SKIPPED"); continue
        o = min(one[t])
        res[t] = ((min(many[t]) - o) / 128, (min(m8[t]) - o) / 64)
        print(f"{el()} {t}: decode {res[t][0] * 1e3:.3f} ms/step at M=1 (16-token prompt, 128 steps; per round "
              f"{', '.join(f'{(x - o) / 128 * 1e3:.3f}' for x in many[t])}); ~{res[t][1] * 1e3:.3f} ms/step at M=8 "
              f"(8 requests x 64 steps; per round {', '.join(f'{(x - o) / 64 * 1e3:.3f}' for x in m8[t])})", flush=True)
    if len(res) == 2:
        a, b = res["plan"], res["cublaslt"]
        print(f"{el()} DECODE: M=1 {a[0] * 1e3:.3f} ms/step with gemm '{gplan}' vs {b[0] * 1e3:.3f} with {BASE} "
              f"({b[0] / a[0]:.3f}x); M=8 {a[1] * 1e3:.3f} vs {b[1] * 1e3:.3f} ({b[1] / a[1]:.3f}x) (best of "
              f"{len(many['plan'])} rounds, the servers taking turns)")

    for s in servers.values():  # the GPU to ncu alone
        s.stop()

    # where the time goes: every BF16 GEMM kernel of one M = 1 forward (`logits`, 1 id), lm_head included
    try:
        import shutil
        if DEV == "cuda" and shutil.which("ncu"):
            for g in ("cuda_gemv", BASE):
                lim = min(22, left() - 4)
                if lim < 8:
                    print(f"{el()} ncu {g}: SKIPPED (time budget)"); continue
                csvp = os.path.join(OUT, f"ncu-{g}.csv")
                p = subprocess.run(["timeout", str(int(lim)), "ncu", "--clock-control", "none", "--csv", "--print-units", "base", "--log-file", csvp,
                                    "--metrics", "gpu__time_duration.sum", "-k", "regex:gv_kernel|nvjet|splitKreduce|xmma|cutlass",
                                    BIN, "logits", "--model-path", MODEL, "--device", "cuda", "--ids", "5", "--gemm-backend", g],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
                import csv
                rows = [r for r in csv.reader(open(csvp, errors="replace")) if len(r) > 10] if os.path.exists(csvp) else []
                if not rows:
                    print(f"{el()} ncu {g}: rc={p.returncode}, no rows; {p.stderr.strip()[-300:]}"); continue
                h = rows[0]
                ki, gi, vi = h.index("Kernel Name"), h.index("Grid Size"), h.index("Metric Value")
                ts = [(r[ki][:44], r[gi], float(r[vi].replace(",", ""))) for r in rows[1:]]
                print(f"{el()} ncu {g}: {len(ts)} BF16 GEMM kernels in one M=1 forward, {sum(t for *_, t in ts) / 1e3:.1f} us "
                      f"in all (rc={p.returncode}); the longest (lm_head first if it is BF16):")
                for name, grid, t in sorted(ts, key=lambda x: -x[2])[:6]:
                    print(f"   {t / 1e3:8.2f} us  {grid:>14}  {name}")
    except Exception as ex:
        print(f"{el()} ncu step FAILED: {ex!r}")
finally:
    for s in servers.values():
        s.stop()
    for s in servers.values():
        for l in s.text().splitlines():
            if "CUDA graphs" in l:
                print(f"   [{s.tag}] {l.split('] ', 1)[-1][:300]}")
                break
    print(f"{el()} done (logs in {OUT})")
PY
