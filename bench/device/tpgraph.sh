#!/usr/bin/env bash
# bench/device/tpgraph.sh: CUDA graphs of decode steps under tensor parallelism
# (--tp 2, NCCL all-reduces captured inside every rank's graph), checked on a
# 2-GPU machine (DEVICE_ROUNDS.md protocol).
# device-limit: 150
#
#   bash bench/device/tpgraph.sh BIN OUTDIR [FIXTURES]
#     BIN       the laststand binary (its .so files beside it)
#     FIXTURES  default .dev/int/fixtures/models (a copy of ../shared/fixtures/models;
#               reads qwen3 and qwen3_5_moe_text)
#
# Prints SKIP unless `nvidia-smi -L` lists at least 2 GPUs. Then, through `generate`
# (greedy, --device cuda), three runs per model:
#   tp2-graph  --tp 2                       (graphs captured on both ranks)
#   tp2-eager  --tp 2 --disable-cuda-graph  (the eager TP steps: the baseline)
#   tp1-graph  --tp 1                       (one GPU, graphs: the single-GPU path)
# on the fixture qwen3 (dense; attention pinned to cuda_flash_decode as graph.sh pins it,
# so eager and captured steps run the same kernels), on synth:qwen3.5-35b-a3b,layers=4
# (GDN + NVFP4 MoE, same pin) and on the fixture qwen3_5_moe_text with auto backends,
# whose MoE slices under --tp 2 (48 / 2 = 24 columns) fit no capture-safe backend: there
# the tp2 graph run must fall back to eager steps with the reason logged.
# Verdicts: tp2-graph ids == tp2-eager ids (PASS/FAIL), the engine's graph lines (captured
# on every rank + self-check, "N steps replayed"), tp2 vs tp1 agreement (info: the
# all-reduce rounds in a different order), and the engine's mean decode step time per run
# (its shutdown line "N decode steps ... ms each"), with the tp2 eager/graph ratio. Then
# two servers `serve --tp 2` (graphs / --disable-cuda-graph) on the qwen3 fixture, 12
# concurrent greedy /generate requests of different lengths (padded buckets 16..1)
# against each: outputs equal (PASS/FAIL), and the servers' graph lines. Every run is
# under a timeout (a hang in a collective is reported as TIMEOUT with its log tail);
# logs are in OUTDIR.
set -u
BIN=${1:?usage: tpgraph.sh BIN OUTDIR [FIXTURES]}
OUT=${2:?usage: tpgraph.sh BIN OUTDIR [FIXTURES]}
FIX=${3:-.dev/int/fixtures/models}
mkdir -p "$OUT"
n_gpu=$(nvidia-smi -L 2>/dev/null | wc -l)
# TPGRAPH_DEVICE=cpu: a dry run of this script's own logic on the CPU (no pins, no synth, no graphs)
if [ "${TPGRAPH_DEVICE:-cuda}" = cuda ] && [ "${n_gpu:-0}" -lt 2 ]; then
    echo "SKIP: tpgraph needs 2 GPUs; nvidia-smi -L lists ${n_gpu:-0}"
    exit 0
fi
export LD_LIBRARY_PATH="$(cd "$(dirname "$BIN")" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
# libnccl.so.2: the system's, else the one PyTorch's wheel brings
if ! ldconfig -p 2>/dev/null | grep -q 'libnccl.so.2'; then
    nd=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
    if [ -n "$nd" ] && [ -f "$nd/libnccl.so.2" ]; then
        export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$nd"
        echo "libnccl.so.2 from $nd"
    else
        echo "libnccl.so.2: not in ldconfig and no nvidia.nccl wheel (TP runs will say so)"
    fi
fi
nvidia-smi --query-gpu=index,name,driver_version,memory.used --format=csv,noheader 2>&1 | head -4
python3 - "$BIN" "$OUT" "$FIX" <<'PY'
import json, os, re, signal, socket, subprocess, sys, time, urllib.request
from concurrent.futures import ThreadPoolExecutor

BIN, OUT, FIX = sys.argv[1:4]
T0 = time.time()
DEADLINE = T0 + float(os.environ.get("TPGRAPH_BUDGET_S", "135"))
def el(): return f"{time.time() - T0:5.1f}s"
def left(): return DEADLINE - time.time()
def verdict(name, ok, detail):
    print(f"{el()} {name:<34} {'PASS' if ok else 'FAIL'}  {detail}", flush=True)
def info(name, detail):
    print(f"{el()} {name:<34} info  {detail}", flush=True)

DEV = os.environ.get("TPGRAPH_DEVICE", "cuda")
PIN_DENSE = ["--attention-backend", "cuda_flash_decode"]
if DEV != "cuda":
    PIN_DENSE = []
MODES = {"tp2-graph": ["--tp", "2"], "tp2-eager": ["--tp", "2", "--disable-cuda-graph"], "tp1-graph": ["--tp", "1"]}
KEEP = ("CUDA graph", "eagerly", "disagree", "tensor parallel", "NCCL", "decode steps of", "error", "WARN")

def run(tag, args, limit):
    """BIN args with stderr to OUT/tag.log under a timeout; (rc, stdout, stderr); rc None: timed out."""
    logp = os.path.join(OUT, tag + ".log")
    with open(logp, "w") as lf:
        p = subprocess.Popen([BIN, *args], stdout=subprocess.PIPE, stderr=lf, text=True)
        try:
            out, _ = p.communicate(timeout=max(5, limit))
            rc = p.returncode
        except subprocess.TimeoutExpired:
            p.kill(); out, _ = p.communicate(); rc = None
    return rc, out, open(logp).read()

def ids_of(out):
    """generate's JSON line (NCCL_DEBUG may print its banner on stdout first)."""
    line = next((l for l in reversed(out.splitlines()) if l.startswith("{")), None)
    if line is None: raise ValueError(f"no JSON on stdout: {out[-300:]!r}")
    return json.loads(line)["ids"]

def step_ms(log):
    m = re.search(r"decode steps of [\d.]+ sequences on average, ([\d.]+) ms each", log)
    return float(m.group(1)) if m else float("nan")

def gen_model(label, path, ids, n_new, pin, limit, expect_graphs=True):
    """expect_graphs False: a model whose TP slices no capture-safe backend takes (the fixtures'
    MoE: 48 / 2 = 24 columns, grouped GEMM needs multiples of 16, fused decode NVFP4): the tp2
    graph run must fall back to eager steps with the reason logged, and still give the same ids."""
    res = {}
    for mode, fl in MODES.items():
        if left() < 15:
            info(f"{label} [{mode}]", "SKIP (the script's time budget is spent)"); continue
        tag = f"gen-{label}-{mode}"
        rc, out, log = run(tag, ["generate", "--model-path", path, "--device", DEV, "--ids", ",".join(map(str, ids)),
                                 "--max-new-tokens", str(n_new), *fl, *pin], min(limit, left() - 5))
        if mode == "tp2-graph" or rc != 0:
            for l in log.splitlines():
                if any(k in l for k in KEEP): print(f"   [{label} {mode}] {l[-230:]}")
        if rc is None:
            verdict(f"{label} [{mode}]", False, f"TIMEOUT after {limit:.0f} s (a hang?); log tail:\n" + log[-1500:]); continue
        if rc != 0:
            verdict(f"{label} [{mode}]", False, f"rc={rc}: {log[-800:]}"); continue
        res[mode] = (ids_of(out), step_ms(log), log)
    if "tp2-graph" in res and "tp2-eager" in res:
        g, e = res["tp2-graph"][0], res["tp2-eager"][0]
        same = sum(a == b for a, b in zip(g, e))
        first = next((i for i, (a, b) in enumerate(zip(g, e)) if a != b), None)
        det = f"{same}/{len(e)} tokens equal" + (f"; first difference at {first}: graph {g[first:first+4]} eager {e[first:first+4]}"
                                               if first is not None else f"; first 8 {g[:8]}")
        verdict(f"{label} tp2 graph == tp2 eager", g == e, det)
        gl = res["tp2-graph"][2]
        ok = "captured on every tensor-parallel rank and checked" in gl
        m = re.search(r"CUDA graphs: (\d+) steps replayed, (\d+) steps eager", gl)
        if expect_graphs:
            verdict(f"{label} tp2 graphs replayed", ok and m is not None and int(m.group(1)) >= n_new - 1,
                    f"self-check {'passed' if ok else 'NOT passed'}; " + (m.group(0) if m else "no graph stats line"))
        else:
            why = [l for l in gl.splitlines() if "run eagerly" in l or "CUDA graphs off:" in l]
            verdict(f"{label} tp2 eager fallback", bool(why) and not ok and (m is None or m.group(1) == "0"),
                    (why[0][-200:] if why else "no fallback line") + "; " + (m.group(0) if m else "no graph stats line"))
    if "tp2-graph" in res and "tp1-graph" in res:
        a, b = res["tp2-graph"][0], res["tp1-graph"][0]
        info(f"{label} tp2 vs tp1", f"{sum(x == y for x, y in zip(a, b))}/{len(b)} tokens equal (BF16 all-reduce order differs)")
    if res:
        print(f"{el()} {label} decode step (engine mean, 1 sequence): " +
              "  ".join(f"{m} {v[1]:.3f} ms" for m, v in res.items()), flush=True)
    if "tp2-graph" in res and "tp2-eager" in res:
        print(f"{el()} {label} tp2 speed-up graph vs eager: {res['tp2-eager'][1] / res['tp2-graph'][1]:.2f}x", flush=True)
    return res

FXM = os.path.join(FIX, "qwen3_5_moe_text")
FXD = os.path.join(FIX, "qwen3")
# qwen3 (dense): graphs on both ranks; qwen3_5_moe_text (GDN + MoE) with auto backends: its MoE
# slices fit no capture-safe backend, so the bucket must fall back to eager steps cleanly
for name, pin, expect in (("qwen3", PIN_DENSE, True), ("qwen3_5_moe_text", [], False)):
    d = os.path.join(FIX, name)
    try:
        ids = json.load(open(os.path.join(d, "ref.json")))["input_ids"]
        gen_model(name + ("" if pin or DEV != "cuda" else " (auto)"), d, ids, 32, pin, 60, expect)
    except Exception as ex:
        verdict(f"{name}", False, f"error: {ex}")
SYN = "synth:qwen3.5-35b-a3b,layers=4"
syn_ids = [(i * 2654435761) % 248000 + 3 for i in range(32)]
try:
    if DEV == "cuda": gen_model("synth-35b-l4", SYN, syn_ids, 96, PIN_DENSE, 60)
except Exception as ex:
    verdict("synth-35b-l4", False, f"error: {ex}")
# ---- serve --tp 2: graphs vs eager, concurrent greedy requests -------------------------------
def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

class Server:
    def __init__(self, mode, extra):
        self.mode, self.port = mode, free_port()
        self.log = os.path.join(OUT, f"serve-{mode}.log")
        self.p = subprocess.Popen([BIN, "serve", "--model-path", FXD, "--device", DEV, "--tp", "2", "--port", str(self.port),
                                   "--max-running-requests", "16", "--max-total-tokens", "65536", "--context-length", "4096",
                                   "--log-level", "info", "--doctor-buckets", "1", "--doctor-timeout", "30",
                                   *PIN_DENSE, *extra],
                                  stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{self.port}"
    def wait(self, until):
        while time.time() < until:
            if self.p.poll() is not None: return False
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1).read(); return True
            except Exception:
                time.sleep(0.5)
        return False
    def gen(self, ids, n):
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True}}
        rq = urllib.request.Request(self.url + "/generate", data=json.dumps(body).encode(),
                                    headers={"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(rq, timeout=max(5, min(60, left()))).read())["output_ids"]
    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try: self.p.wait(15)
            except subprocess.TimeoutExpired: self.p.kill(); self.p.wait()
    def lines(self):
        try: return [l.rstrip() for l in open(self.log) if any(k in l for k in KEEP)]
        except Exception: return []
    def tail(self, n=10):
        try: return "".join(open(self.log).readlines()[-n:])
        except Exception: return ""

if left() < 40:
    info("serve --tp 2", "SKIP (the script's time budget is spent)")
else:
    # one after the other: concurrent start-up doctors race on their cache file
    srv = {"graph": Server("graph", [])}
    try:
        up = {"graph": srv["graph"].wait(time.time() + min(50, left() - 30))}
        srv["eager"] = Server("eager", ["--disable-cuda-graph"])
        up["eager"] = srv["eager"].wait(time.time() + min(40, left() - 15))
        for m, ok in up.items():
            if not ok: verdict(f"serve tp2 start [{m}]", False, "not healthy:\n" + srv[m].tail(14))
        if all(up.values()):
            print(f"{el()} serve --tp 2: both servers up", flush=True)
            lens = [4 + (7 * i) % 20 for i in range(12)]
            ps = [[(31 * i + 17 * j) % 1000 + 3 for j in range(3 + (5 * i) % 40)] for i in range(12)]  # vocab 1024
            outs = {}
            for m, s in srv.items():
                with ThreadPoolExecutor(12) as ex:
                    outs[m] = list(ex.map(lambda a: s.gen(a[0], a[1]), zip(ps, lens)))
            same = sum(a == b for a, b in zip(outs["graph"], outs["eager"]))
            tok = sum(sum(x == y for x, y in zip(a, b)) for a, b in zip(outs["graph"], outs["eager"]))
            verdict("serve tp2 12 concurrent greedy", same == 12,
                    f"{same}/12 sequences, {tok}/{sum(lens)} tokens equal to the eager server's")
            seq = [srv["graph"].gen(ps[0], lens[0]), srv["graph"].gen(ps[0], lens[0])]
            verdict("serve tp2 alone == in the batch", seq[0] == seq[1] == outs["graph"][0],
                    f"request 0 alone twice: {seq[0]}, in the batch of 12: {outs['graph'][0]}")
    except Exception as ex:
        verdict("serve tp2", False, f"error: {ex}")
    finally:
        for s in srv.values(): s.stop()
        for m, s in srv.items():
            for l in s.lines(): print(f"   [serve {m}] {l[-230:]}")
print(f"{el()} done")
PY
