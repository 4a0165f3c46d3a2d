#!/usr/bin/env bash
# bench/device/bucket.sh: serve with `auto` dispatches the doctor's per-batch-size plan
# (one backend per M bucket and op family), checked on the H200 (DEVICE_ROUNDS.md protocol).
#
#   bash bench/device/bucket.sh BIN OUTDIR
#     BIN     the laststand binary (its .so files beside it, the cmocka tests in tests/)
#     OUTDIR  logs and the doctor's cache (a fresh XDG_CACHE_HOME under it)
#   env BUCKET_DEVICE=cpu BUCKET_MODEL=build/demo-model: a dry run of the script's own logic
#
# 1. unit test_ops_plan (the parser and the per-M dispatch, CPU only) from BIN's tests/.
# 2. Two servers on synth:qwen3.5-35b-a3b,layers=4 (no fixtures needed):
#      plan       every backend flag at auto: the doctor runs at the default buckets
#                 (1,8,64,512,2048), serve builds a plan per family from its per-bucket
#                 picks, the smoke test runs every entry (prefill chunks + decode steps)
#      recurrent  --gdn-backend cuda_recurrent (the other families at auto; the doctor's
#                 decision comes from the cache the first server wrote)
#    Printed: each server's "last backend standing" table, its smoke-test lines and the
#    backends it banned from fallbacks and captures.
# 3. Per server (one at a time on the GPU): a 3000-token prompt (prefill in steps of 2048 +
#    952 tokens; gdn M = the step's tokens) with 1 new token, 3 timed runs after a warm-up,
#    and a 16-token prompt with 1 and 65 new tokens (decode time per token); greedy ids of
#    both printed, and compared between the servers (equal ids are expected on most
#    positions, not all: the gdn kernels round differently in BF16).
# 4. Verdicts: PLAN (some family serves with a plan of >= 2 entries), SERVES (both
#    answer), PREFILL (the plan's prefill is faster than cuda_recurrent's).
set -u
BIN=${1:?usage: bucket.sh BIN OUTDIR}
OUT=${2:?usage: bucket.sh BIN OUTDIR}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$(cd "$(dirname "$BIN")" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader 2>&1 | head -2
UT="$(dirname "$BIN")/tests/test_ops_plan"
[ -x "$UT" ] || UT="$(dirname "$BIN")/../tests/test_ops_plan"
if [ -x "$UT" ]; then
    timeout 30 "$UT" > "$OUT/test_ops_plan.log" 2>&1
    echo "unit test_ops_plan rc=$? ($(grep -E '^\[  (PASSED|FAILED) ' "$OUT/test_ops_plan.log" | tr '\n' ' '))"
    grep -E "FAILED|Failure|ERROR  " "$OUT/test_ops_plan.log" | head -8
else
    echo "unit test_ops_plan: not found beside $BIN"
fi
python3 - "$BIN" "$OUT" <<'PY'
import json, os, random, signal, socket, subprocess, sys, time, urllib.request

BIN, OUT = sys.argv[1:3]
T0 = time.time()
BUDGET = float(os.environ.get("BUCKET_BUDGET_S", "140"))
DEV = os.environ.get("BUCKET_DEVICE", "cuda")
MODEL = os.environ.get("BUCKET_MODEL", "synth:qwen3.5-35b-a3b,layers=4")
LONG = int(os.environ.get("BUCKET_LONG", "3000"))
def el(): return f"{time.time() - T0:5.1f}s"
def left(): return T0 + BUDGET - time.time()

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

env = dict(os.environ, XDG_CACHE_HOME=os.path.join(os.path.abspath(OUT), "cache"))
COMMON = ["--model-path", MODEL, "--device", DEV, "--doctor-timeout", "60", "--max-running-requests", "16",
          "--context-length", "8192", "--max-total-tokens", "65536", "--log-level", "info"]

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
            time.sleep(0.5)
        return False
    def gen(self, ids, n):
        body = json.dumps({"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": n,
                                                                  "ignore_eos": True}}).encode()
        req = urllib.request.Request(self.url + "/generate", data=body, headers={"Content-Type": "application/json"})
        t = time.time()
        out = json.loads(urllib.request.urlopen(req, timeout=max(5, left())).read())
        return time.time() - t, out.get("output_ids", [])
    def stop(self):
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
        if ("smoke test:" in l or "eliminated, never taken" in l or "backend check: the doctor" in l
                or "error" in l.lower()) and "doctor: " not in l:
            print(f"   [{s.tag}] {l.split('] ', 1)[-1][:400]}")
    if starts:
        for l in lines[starts[-1]:starts[-1] + 8]:  # the header, then fp4_gemm moe attention gdn gemm
            print(f"   [{s.tag}] {l.split('] ', 1)[-1][:600]}")
    else:
        print(f"   [{s.tag}] no backend table; log tail:")
        for l in lines[-12:]:
            print(f"   [{s.tag}]   {l[:300]}")

def table_row(s, fam):
    import re
    for l in reversed(s.text().splitlines()):
        m = re.search(r"\]\s+%s\s+(\S+)" % fam, l)
        if m:
            return m.group(1)
    return None

servers = {}
try:
    servers["plan"] = Server("plan", [])
    # the second server reuses the doctor's decision: start it once the first has cached it
    while left() > 60 and servers["plan"].p.poll() is None and "decision cached in" not in servers["plan"].text() \
            and "cached decision" not in servers["plan"].text():
        time.sleep(0.5)
    print(f"{el()} the doctor's decision is cached", flush=True)
    servers["recurrent"] = Server("recurrent", ["--gdn-backend", "cuda_recurrent" if DEV == "cuda" else "cpu_ref"])
    ok = {t: s.wait(T0 + BUDGET - 25) for t, s in servers.items()}
    for t, s in servers.items():
        print(f"{el()} {t}: {'healthy' if ok[t] else 'NOT healthy'}", flush=True)
        show_table(s)
    plan_gdn = table_row(servers["plan"], "gdn")
    rows = [table_row(servers["plan"], f) or "" for f in ("fp4_gemm", "moe", "attention", "gdn", "gemm")]
    print(f"{el()} VERDICT PLAN: {'ok' if any(',' in r for r in rows) else 'FAIL'} (some family serves with a plan) "
          f"(gdn serves with '{plan_gdn}'; moe '{table_row(servers['plan'], 'moe')}', attention "
          f"'{table_row(servers['plan'], 'attention')}', fp4_gemm '{table_row(servers['plan'], 'fp4_gemm')}', gemm "
          f"'{table_row(servers['plan'], 'gemm')}')", flush=True)
    rng = random.Random(7)
    long_ids = [rng.randrange(10, 2000) for _ in range(LONG)]
    short_ids = [rng.randrange(10, 2000) for _ in range(16)]
    res = {}
    for t, s in servers.items():
        if not ok[t] or left() < 8:
            print(f"{el()} {t}: measurements SKIPPED ({'not healthy' if not ok[t] else 'time budget spent'})")
            continue
        try:
            s.gen(long_ids, 1)  # warm-up (workspaces grow to the prefill's size)
            pre = []
            for _ in range(3):
                if left() < 4: break
                dt, lid = s.gen(long_ids, 1); pre.append(dt)
            d1, _ = s.gen(short_ids, 1)
            d65, sid = s.gen(short_ids, 65)
            _, lid16 = s.gen(long_ids, 16)
            res[t] = dict(prefill=min(pre) if pre else float("nan"), decode=(d65 - d1) / 64, long_ids=lid16,
                          short_ids=sid)
            print(f"{el()} {t}: prefill of {LONG} tokens + 1 new: {min(pre) * 1e3:.1f} ms (best of {len(pre)}: "
                  f"{', '.join(f'{x * 1e3:.1f}' for x in pre)}); decode {res[t]['decode'] * 1e3:.2f} ms/token "
                  f"(16-token prompt, 64 tokens)", flush=True)
            print(f"   long prompt, 16 greedy ids: {lid16}")
            print(f"   short prompt, first 24 of 65 greedy ids: {sid[:24]}")
        except Exception as ex:
            print(f"{el()} {t}: request FAILED: {ex!r}")
            for l in s.text().splitlines()[-8:]:
                print(f"   [{t}]   {l[:300]}")
    print(f"{el()} VERDICT SERVES: {'ok' if len(res) == 2 else 'FAIL'} ({', '.join(res) or 'none'} answered)")
    if len(res) == 2:
        a, b = res["plan"], res["recurrent"]
        same_l = sum(x == y for x, y in zip(a["long_ids"], b["long_ids"]))
        same_s = sum(x == y for x, y in zip(a["short_ids"], b["short_ids"]))
        print(f"{el()} plan vs recurrent: greedy ids equal on {same_l}/{len(a['long_ids'])} (long prompt) and "
              f"{same_s}/{len(a['short_ids'])} (short prompt)")
        r = b["prefill"] / a["prefill"] if a["prefill"] > 0 else float("nan")
        print(f"{el()} VERDICT PREFILL: {'ok' if r > 1.0 else 'FAIL'}: {LONG}-token prefill {a['prefill'] * 1e3:.1f} ms "
              f"with the plan vs {b['prefill'] * 1e3:.1f} ms with gdn cuda_recurrent ({r:.2f}x); decode "
              f"{a['decode'] * 1e3:.2f} vs {b['decode'] * 1e3:.2f} ms/token")
finally:
    for s in servers.values():
        s.stop()
    for s in servers.values():
        for l in s.text().splitlines():
            if "CUDA graphs" in l or "captured" in l.lower() and "graph" in l.lower():
                print(f"   [{s.tag}] {l.split('] ', 1)[-1][:300]}")
                break
    print(f"{el()} done (logs in {OUT})")
PY
