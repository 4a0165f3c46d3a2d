#!/usr/bin/env bash
# device-limit: 170
# bench/device/decprof.sh: where the time of one decode step goes, synth Qwen3.5-35B-A3B on one
# GPU, for the integrator's device rounds (notes: DEVICE_ROUNDS.md).
#
#   bash bench/device/decprof.sh BIN OUTDIR
#
# The session's switches (VARIANTS below; on by default since device round R1 but the opt-in
# add_rmsnorm kernel) are compared against the defaults throughout.
# 0. Correctness: the cmocka test_gemv_cuda and test_small_cuda (grouped launch, PDL chain,
#    graph replay, fp64 / host references, the fused attention prologue bitwise against the
#    three ops); 48 greedy tokens of the 8-layer synth 35B from CUDA graphs twice and eagerly
#    (a race shows as a difference); on the fixture models (dir-of-BIN/fixtures/models, copied
#    from ../shared/fixtures/models) logits vs the CPU and 12 greedy tokens, CUDA graphs and
#    eager, vs the CPU's, for the defaults, the old behaviour and addnorm.
# 1. The engine's mean decode step with CUDA graphs (`generate`, 512-token prompt, 128 decode
#    steps; the engine logs "N decode steps ..., X ms each (forward + sampling)"), 8 layers and
#    the full 40, defaults / old / addnorm, then the other variants on 8 layers.
# 2. Wall-clock TPOT as a client sees it: `serve` with the served plans named (--trust-backend:
#    no doctor, no smoke children) + `BIN bench` at concurrency 1 and 16, 512 in / 128 out,
#    8 layers, defaults (R1 ran the old behaviour the same way: 1.07 ms at c = 1).
# 3. ncu (--clock-control none --cache-control none: the card's own clocks, caches as the step
#    leaves them) over `BIN generate` of the 8-layer model, eager (each kernel one launch), the
#    plans named: a 256-token prompt, then 3 new tokens = 3 forward passes. Forwards are split
#    at the embedding kernel (sm_embed_*); the last one is a decode step at M = 1 (checked
#    against the one before it). decprof_table.py prints the raw per-kernel table (µs, DRAM MB
#    read + written, GB/s) and an aggregate per kernel name (count, total µs, % of the step's
#    kernel time, GB/s). prof() also takes a 16-token prompt + 1 token (one forward of M = 16
#    rows) and the doctor lines at the end run when time is left (R1 printed both).
# Each step is bounded by `timeout`; the whole script stays under 170 s.
set -u
BIN=${1:?usage: decprof.sh BIN OUTDIR}
OUT=${2:?usage: decprof.sh BIN OUTDIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
export LD_LIBRARY_PATH="$(dirname "$BIN")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
T0=$(date +%s)
el() { echo "($(( $(date +%s) - T0 )) s)"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv,noheader 2>&1 | head -2
git log --oneline -1 2>/dev/null
MODEL8="synth:qwen3.5-35b-a3b,layers=8"
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:8,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode --gemm-backend cuda_gemv:8,cuda_cublaslt)
ids() { python3 -c "import sys;n=int(sys.argv[1]);print(','.join(str(1000+(i*7919)%200000) for i in range(n)))" "$1"; }

NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
prof() { # tag prompt_len new_tokens timeout
    local tag=$1 np=$2 nt=$3 lim=$4
    echo "== ncu $tag: generate, prompt $np, $nt new tokens, eager${NCU_ENV:+, env $NCU_ENV} $(el)"
    rm -f "$OUT/ncu-$tag.ncu-rep"
    env ${NCU_ENV:-} timeout -k 3 "$lim" "$NCU" --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        -o "$OUT/ncu-$tag" "$BIN" generate --model-path "$MODEL8" --ids "$(ids "$np")" --max-new-tokens "$nt" \
        --device cuda --disable-cuda-graph "${PLANS[@]}" >"$OUT/ncu-$tag.out" 2>&1
    echo "rc=$? $(el)"
    grep -E "==ERROR|==WARNING|error:" "$OUT/ncu-$tag.out" | head -5
    tail -c 300 "$OUT/ncu-$tag.out" | grep -v "^==PROF==" | tail -3
    if [ -f "$OUT/ncu-$tag.ncu-rep" ]; then
        timeout 30 "$NCU" --import "$OUT/ncu-$tag.ncu-rep" --csv --page raw --print-units base \
            --print-kernel-base demangled >"$OUT/ncu-$tag.csv" 2>"$OUT/ncu-$tag.csv.err"
        timeout 20 python3 bench/device/decprof_table.py "$OUT/ncu-$tag.csv" "$tag" || head -c 400 "$OUT/ncu-$tag.csv.err"
    fi
}
# gen: tag, preset, timeout, env assignments...: the engine's mean decode step with CUDA graphs
gen() {
    local tag=$1 preset=$2 lim=$3
    shift 3
    echo "== gen $tag: generate synth:$preset, 512-token prompt + 129 new tokens, CUDA graphs${*:+, env $*} $(el)"
    env "$@" timeout -k 3 "$lim" "$BIN" generate --model-path "synth:$preset" --ids "$(ids 512)" --max-new-tokens 129 \
        --device cuda "${PLANS[@]}" >"$OUT/gen-$tag.out" 2>&1
    echo "rc=$? $(el)"
    grep -E "decode steps of|CUDA graphs|loaded in|rror" "$OUT/gen-$tag.out" | cut -c1-220 | head -5
}
# e2e: tag, preset, timeout, env assignments...: serve + bench, TPOT as a client sees it
e2e() {
    local tag=$1 preset=$2 lim=$3
    shift 3
    echo "== e2e $tag: serve synth:$preset, named plans, CUDA graphs${*:+, env $*} $(el)"
    env "$@" BIN="$BIN" PORT=30777 CONCURRENCY=1,16 NUM_PROMPTS=6,32 INPUT_LEN=512 OUTPUT_LEN=128 WARMUP=2 \
        HEALTH_TIMEOUT=$(( lim - 12 )) timeout -k 5 "$lim" bash bench/run_e2e.sh "$OUT/e2e-$tag" "$preset" -- \
        --device cuda "${PLANS[@]}" --trust-backend >"$OUT/e2e-$tag.out" 2>&1
    echo "rc=$? $(el)"
    grep -E "startup_s" "$OUT/e2e-$tag/meta.txt" 2>/dev/null
    [ -f "$OUT/e2e-$tag/SUMMARY.md" ] && echo "  conc | ok | out tok/s | TPOT p50 ms | TPOT p99 ms | ITL p50 ms" &&
        grep -E "^\| (1|16) \|" "$OUT/e2e-$tag/SUMMARY.md" | cut -d'|' -f2,4,6,10,11,12 | sed 's/^/  /'
    grep -E "CUDA graphs|loaded in|ERROR|error" "$OUT/e2e-$tag/server.log" 2>/dev/null | cut -c1-220 | head -4
    [ -f "$OUT/e2e-$tag/SUMMARY.md" ] || tail -5 "$OUT/e2e-$tag.out"
}
left() { echo $(( 165 - ($(date +%s) - T0) )); }

# VARIANTS: "tag:VAR=V VAR=V": the knobs this session added. Since device round R1 the
# first six are on by default, so "old" is the behaviour before the session; "addnorm" is the
# one-round-trip add_rmsnorm kernel, opt-in (LASTSTAND_SMALL_ADDNORM=1) until a round checks it.
VARIANTS=("old:LASTSTAND_GEMV_PDL=0 LASTSTAND_GEMV_MULTI=0 LASTSTAND_GDN_PDL=0 LASTSTAND_SMALL_PDL=0 LASTSTAND_MOE_ROUTER_PDL=0 LASTSTAND_SMALL_QKV=0"
          "addnorm:LASTSTAND_SMALL_ADDNORM=1"
          "fill2:LASTSTAND_GEMV_FILL=2"
          "nopdl:LASTSTAND_GEMV_PDL=0 LASTSTAND_GDN_PDL=0 LASTSTAND_SMALL_PDL=0 LASTSTAND_MOE_ROUTER_PDL=0")
OLDENV=${VARIANTS[0]#*:}
ADDENV=${VARIANTS[1]#*:}
D=$(dirname "$BIN")

# the session's cmocka tests (defaults; test_small_cuda forces its two kernels on itself)
for t in test_gemv_cuda test_small_cuda; do
    echo "== cmocka $t $(el)"
    if [ -x "$D/tests/$t" ]; then
        timeout -k 3 40 "$D/tests/$t" >"$OUT/$t.log" 2>&1
        echo "rc=$? (0: every test passed) $(el)"
        grep -E "PASSED|FAILED|SKIPPED|differs|rror" "$OUT/$t.log" | head -8
    else
        echo "missing: $D/tests/$t"
    fi
done

# the doctor's fp64 verdicts and chained times of the changed backends at the 35B shapes
# (cuda_gemv: grouped launch + PDL; gdn cuda_decode: PDL; moe cuda_fused_decode: router PDL),
# then cuda_gemv's cells with LASTSTAND_GEMV_FILL=2 (the [2048 x 4096] projections split)
for fill in 1 2; do
    fam=gemm,gdn,moe be=cuda_gemv,cuda_decode,cuda_fused_decode
    [ $fill = 2 ] && fam=gemm be=cuda_gemv
    echo "== doctor $fam ($be), LASTSTAND_GEMV_FILL=$fill $(el)"
    LASTSTAND_GEMV_FILL=$fill timeout -k 3 25 "$BIN" doctor --device cuda --shapes qwen3.5-35b-a3b \
        --families $fam --m 1,8 --backends $be --json "$OUT/doctor-f$fill.json" >"$OUT/doctor-f$fill.txt" \
        2>"$OUT/doctor-f$fill.err"
    echo "rc=$? $(el)"
    grep -E "^(gemm|gdn|moe) |^ +(1|8) " "$OUT/doctor-f$fill.txt" | cut -c1-110
    grep -iE "crash|error|wrong|timeout" "$OUT/doctor-f$fill.err" | head -3
done

# races: the same greedy tokens from CUDA graphs (twice) and eager steps, defaults and addnorm
echo "== synth 35B 8 layers, 48 greedy tokens: graphs x2 vs eager, defaults and $ADDENV $(el)"
for v in "" "$ADDENV"; do
    for g in g1 g2 eager; do
        env $v timeout 20 "$BIN" generate --model-path "synth:qwen3.5-35b-a3b,layers=8" --ids "$(ids 100)" \
            --max-new-tokens 48 --device cuda "${PLANS[@]}" $([ $g = eager ] && echo --disable-cuda-graph) \
            2>/dev/null | head -c 2000 >"$OUT/race-${v:+addnorm-}$g.json"
    done
    r="$OUT/race-${v:+addnorm-}"
    echo "  ${v:-defaults}: graphs run 1 == run 2: $(cmp -s ${r}g1.json ${r}g2.json && echo yes || echo NO);" \
        "graphs == eager: $(cmp -s ${r}g1.json ${r}eager.json && echo yes || echo NO); $(head -c 80 ${r}g1.json)"
done
echo "$(el)"

FIX=$D/fixtures/models
echo "== fixtures: greedy 12 tokens cuda (graphs, eager) vs cpu, logits vs cpu: defaults, old ($OLDENV), addnorm $(el)"
timeout 45 python3 - "$BIN" "$FIX" "$OLDENV" "$ADDENV" <<'PY'
import json, os, subprocess, sys
import numpy as np
BIN, FIX, OLDENV, ADDENV = sys.argv[1:5]
envof = lambda e: dict(os.environ, **dict(kv.split("=", 1) for kv in e.split()))
def run(args, env=None, t=10):
    try:
        return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=t, env=env)
    except subprocess.TimeoutExpired:
        return None
def err(p):
    return "TIMEOUT" if p is None else p.stderr.strip()[-300:]
for name, extra in (("qwen3_5_moe_text", []), ("qwen3_next", [])):
    d = os.path.join(FIX, name)
    if not os.path.exists(os.path.join(d, "ref.json")):
        print(f"{name}: no fixture at {d}"); continue
    ids = ",".join(map(str, json.load(open(os.path.join(d, "ref.json")))["input_ids"][:16]))  # M <= 16: gemv
    p = run(["logits", "--model-path", d, "--ids", ids, "--device", "cpu"])
    if p is None or p.returncode:
        print(f"{name} cpu logits: {err(p)}"); continue
    cpu = np.array(json.loads(p.stdout)["logits"], dtype=np.float64)
    p = run(["generate", "--model-path", d, "--ids", ids, "--max-new-tokens", "12", "--device", "cpu"])
    gcpu = json.loads(p.stdout)["ids"] if p is not None and p.returncode == 0 else None
    for tag, env in (("default", None), ("old", envof(OLDENV)), ("addnorm", envof(ADDENV))):
        p = run(["logits", "--model-path", d, "--ids", ids, "--device", "cuda", "--gemm-backend", "cuda_gemv:16,cuda_cublaslt",
                 *extra], env)
        if p is None or p.returncode:
            print(f"{name:22s} {tag:7s} logits: {err(p)}"); continue
        x = np.array(json.loads(p.stdout)["logits"], dtype=np.float64)
        rel = float((np.abs(x - cpu).max(axis=1) / np.abs(cpu).max(axis=1)).max())
        out = []
        for g in ([], ["--disable-cuda-graph"]):
            q = run(["generate", "--model-path", d, "--ids", ids, "--max-new-tokens", "12", "--device", "cuda",
                     "--gemm-backend", "cuda_gemv:16,cuda_cublaslt", *extra, *g], env)
            out.append(json.loads(q.stdout)["ids"] if q is not None and q.returncode == 0 else "ERR " + err(q))
        def pre(a):
            if isinstance(a, str) or not gcpu:
                return str(a)[:200]
            n = 0
            while n < min(len(a), len(gcpu)) and a[n] == gcpu[n]:
                n += 1
            return f"{n}/12"
        print(f"{name:22s} {tag:7s} logits rel {rel:.2e} (M = {len(cpu)})  greedy = cpu's for graphs {pre(out[0])}, "
              f"eager {pre(out[1])}; graphs == eager: {'yes' if out[0] == out[1] else 'NO'}")
PY
echo "rc=$? $(el)"

L8="qwen3.5-35b-a3b,layers=8"
gen l8 "$L8" 20
gen l8-old "$L8" 20 $OLDENV
gen l8-addnorm "$L8" 20 $ADDENV
gen l40 qwen3.5-35b-a3b 35
gen l40-old qwen3.5-35b-a3b 35 $OLDENV
gen l40-addnorm qwen3.5-35b-a3b 35 $ADDENV
for v in "${VARIANTS[@]:2}"; do [ "$(left)" -gt 60 ] && gen "l8-${v%%:*}" "$L8" 20 ${v#*:}; done
[ "$(left)" -gt 50 ] && e2e l8 "$L8" 30
if [ -n "$NCU" ] && [ "$(left)" -gt 40 ]; then NCU_ENV="$ADDENV" prof m1-addnorm 256 3 35; fi
if [ "$(left)" -gt 30 ]; then
    echo "== doctor: served backends at the 35B shapes, M = 1, 16 $(el)"
    timeout -k 3 25 "$BIN" doctor --device cuda --shapes qwen3.5-35b-a3b --m 1,16 \
        --backends cuda_w4a16_mma,cuda_gemv,cuda_cublaslt,cuda_fused_decode,cuda_grouped_gemm,cuda_flash_prefill,cuda_decode \
        --json "$OUT/doctor.json" >"$OUT/doctor.txt" 2>"$OUT/doctor.err"
    echo "rc=$? $(el)"
    grep -E "^(fp4_gemm|gemm|moe|attention|gdn) |^ +(1|16) |measured device copy" "$OUT/doctor.txt" | cut -c1-160
    grep -iE "crash|error|wrong|timeout" "$OUT/doctor.err" | head -5
fi
echo "total $(( $(date +%s) - T0 )) s"
