#!/usr/bin/env bash
# device-limit: 120
# bench/device/stepfuse.sh: fewer, shorter kernels in the single-stream decode step of synth
# Qwen3.5-35B-A3B (GDN and attention layers), for the integrator's device rounds (notes
# DEVICE_ROUNDS.md).
#
#   bash bench/device/stepfuse.sh BIN OUTDIR
#
# The session's switches (VARIANTS below) are timed against the defaults.
# 1. cmocka (beside BIN: tests/): test_gdn_decode_cuda (the fused gated norm against
#    cuda_decode + rmsnorm_gated, bitwise), test_gemv_cuda,
#    test_small_cuda, test_attn_cuda's graph-replay check (fp64 reference, eager bits).
# 2. The doctor's fp64 verdicts of cuda_gemv, cuda_flash_prefill and cuda_decode at the 35B
#    shapes, M = 1 and 8, defaults.
# 3. The engine's mean decode step with CUDA graphs (`generate`, 512-token prompt + 129 new
#    tokens: "128 decode steps ..., X ms each"), full 40-layer model, every variant; the
#    greedy ids of each against the defaults' (a switch that keeps every sum's order must
#    give the same ids).
# 4. (time left; STEPFUSE_NCU=0: skipped) ncu list of one 8-layer decode step with the
#    defaults (NCU_ENV: other switches), eager, as decprof.sh makes it.
# 5. (time left) Fixture models (dir-of-BIN/fixtures/models = ../shared/fixtures/models): CUDA
#    logits of each variant against the defaults' (max |diff| / max |ref|; 0 = bit for bit)
#    and 12 greedy tokens, CUDA graphs == eager.
# Each step is bounded by `timeout`; the whole script stays under 120 s.
. "$(dirname "$0")/lib.sh"
dev_init stepfuse 115 "$@"
PLANS=("${DEV_PLANS_DECODE[@]}")

# VARIANTS: "tag:VAR=V ..." against the defaults (base). Since S7-R1 the defaults include the
# gated norm inside gd_kernel (gdn_decode.cu, LASTSTAND_GDN_NORM) and cuda_gemv's K split for
# the under-filling [2048 x 4096] projections (gemv.cu, LASTSTAND_GEMV_FILL=2), since R2
# fp_dec_kernel's early fetch of past keys (attention_prefill.cu, LASTSTAND_FP_EARLY); "old"
# turns the three off, "noearly" the last one. Opt-in, timed for the record: ck64 = attention
# decode in 64-key chunks (faster at M = 1, slower for batches). (The add + norm fused in front of
# / behind the GEMVs, LASTSTAND_GEMV_PRENORM / POSTNORM, measured slower in S7, were deleted in S8;
# gd_kernel1, LASTSTAND_GDN_T1, R2: +0.074 ms at M = 1, is timed at 16 rows by c16.sh.)
OLD="LASTSTAND_GDN_NORM=0 LASTSTAND_GEMV_FILL=1 LASTSTAND_FP_EARLY=0"
VARIANTS=("base:" "old:$OLD" "noearly:LASTSTAND_FP_EARLY=0" "ck64:LASTSTAND_FP_CHUNK=64")

for te in test_gdn_decode_cuda test_gemv_cuda test_small_cuda "test_attn_cuda:LS_ATTN_TEST=check"; do
    t=${te%%:*}
    env=""
    [ "$t" != "$te" ] && env=${te#*:}
    echo "== cmocka $t${env:+ ($env)} $(el)"
    if [ -x "$D/tests/$t" ]; then
        env $env timeout -k 3 30 "$D/tests/$t" >"$OUT/$t${env:+-env}.log" 2>&1
        echo "rc=$? (0: every test passed) $(el)"
        grep -E "PASSED|FAILED|SKIPPED|differs|rror|skipping" "$OUT/$t${env:+-env}.log" | head -8
    else
        echo "missing: $D/tests/$t"
    fi
done

# the doctor's fp64 verdicts of the backends this session changed, at the 35B shapes, defaults
if [ "$(left)" -gt 85 ]; then
    for fam in "gemm:cuda_gemv:" "attention:cuda_flash_prefill:" "gdn:cuda_decode:"; do
        f=${fam%%:*}; r=${fam#*:}; be=${r%%:*}; env=${r#*:}
        echo "== doctor $f ($be) at qwen3.5-35b-a3b, M = 1, 8${env:+, env $env} $(el)"
        env $env timeout -k 3 15 "$BIN" doctor --device cuda --shapes qwen3.5-35b-a3b --families "$f" --m 1,8 \
            --backends "$be" --json "$OUT/doctor-$f.json" >"$OUT/doctor-$f.txt" 2>"$OUT/doctor-$f.err"
        echo "rc=$? $(el)"
        grep -E "^(gemm|attention|gdn) |^ +(1|8) " "$OUT/doctor-$f.txt" | cut -c1-110
        grep -iE "crash|error|wrong|timeout" "$OUT/doctor-$f.err" | head -3
    done
fi

# gen tag preset timeout env...: mean decode step (the engine's "decode steps" line) and the ids
gen() {
    local tag=$1 preset=$2 lim=$3
    shift 3
    env "$@" timeout -k 3 "$lim" "$BIN" generate --model-path "synth:$preset" --ids "$(ids 512)" --max-new-tokens 129 \
        --device cuda "${PLANS[@]}" >"$OUT/gen-$tag.out" 2>&1
    local rc=$?
    printf '  %-10s rc=%d %s | %s\n' "$tag" $rc "$(grep -oE '[0-9]+ decode steps[^|]*ms each' "$OUT/gen-$tag.out" | head -1)" \
        "$(grep -oE '"ids": *\[[0-9, ]{0,50}' "$OUT/gen-$tag.out" | head -1)"
    [ $rc = 0 ] || grep -iE "error|fail|fault" "$OUT/gen-$tag.out" | head -3
    grep -oE "(cuda_gemv|gdn cuda_decode): [a-z +-]*(fused)[^(]*" "$OUT/gen-$tag.out" | sort -u | sed 's/^/      /'
}
same_ids() { # tag tag
    local a b
    a=$(grep -oE '"ids": *\[[0-9, ]*' "$OUT/gen-$1.out" 2>/dev/null)
    b=$(grep -oE '"ids": *\[[0-9, ]*' "$OUT/gen-$2.out" 2>/dev/null)
    echo "  ids $2 == $1: $([ -n "$a" ] && [ "$a" = "$b" ] && echo yes || echo NO)"
}
echo "== decode step, full synth 35B (40 layers), CUDA graphs: ${VARIANTS[*]} $(el)"
for v in "${VARIANTS[@]}"; do
    [ "$(left)" -gt 40 ] || { echo "  ${v%%:*}: skipped (time)"; continue; }
    gen "${v%%:*}" qwen3.5-35b-a3b 25 ${v#*:}
done
for v in "${VARIANTS[@]:1}"; do same_ids base "${v%%:*}"; done

if [ -n "$NCU" ] && [ "$(left)" -gt 28 ] && [ "${STEPFUSE_NCU:-1}" != 0 ]; then
    tag=m1-defaults
    echo "== ncu $tag: generate synth 35B 8 layers, prompt 256, 3 new tokens, eager${NCU_ENV:+, env $NCU_ENV} $(el)"
    env ${NCU_ENV:-} timeout -k 3 $(( $(left) - 3 )) "$NCU" --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum -o "$OUT/ncu-$tag" \
        "$BIN" generate --model-path "synth:qwen3.5-35b-a3b,layers=8" --ids "$(ids 256)" --max-new-tokens 3 \
        --device cuda --disable-cuda-graph "${PLANS[@]}" >"$OUT/ncu-$tag.out" 2>&1
    echo "rc=$? $(el)"
    grep -E "==ERROR|error:" "$OUT/ncu-$tag.out" | head -3
    if [ -f "$OUT/ncu-$tag.ncu-rep" ]; then
        timeout 15 "$NCU" --import "$OUT/ncu-$tag.ncu-rep" --csv --page raw --print-units base \
            --print-kernel-base demangled >"$OUT/ncu-$tag.csv" 2>"$OUT/ncu-$tag.csv.err"
        timeout 10 python3 bench/device/decprof_table.py "$OUT/ncu-$tag.csv" "$tag" ||
            head -c 400 "$OUT/ncu-$tag.csv.err"
    fi
fi
FIX=$D/fixtures/models
if [ "$(left)" -gt 20 ]; then
    echo "== fixtures: CUDA logits of each variant vs the defaults', 12 greedy tokens graphs == eager $(el)"
    timeout $(( $(left) - 2 )) python3 - "$BIN" "$FIX" "${VARIANTS[@]:1}" <<'PY'
import json, os, subprocess, sys
import numpy as np
BIN, FIX, VARS = sys.argv[1], sys.argv[2], sys.argv[3:]
def env_of(spec):
    return dict(os.environ, **dict(kv.split("=", 1) for kv in spec.split(":", 1)[1].split()))
def run(args, env=None, t=8):
    try:
        return subprocess.run([BIN, *args], capture_output=True, text=True, timeout=t, env=env)
    except subprocess.TimeoutExpired:
        return None
for name in ("qwen3_5_moe_text", "qwen3_next"):
    d = os.path.join(FIX, name)
    if not os.path.exists(os.path.join(d, "ref.json")):
        print(f"{name}: no fixture at {d}"); continue
    ids = ",".join(map(str, json.load(open(os.path.join(d, "ref.json")))["input_ids"][:16]))
    common = ["--model-path", d, "--ids", ids, "--device", "cuda", "--gemm-backend", "cuda_gemv:16,cuda_cublaslt",
              "--gdn-backend", "cuda_decode"]
    def logits(env):
        p = run(["logits", *common], env)
        return None if p is None or p.returncode else np.array(json.loads(p.stdout)["logits"], dtype=np.float64)
    def greedy(env, eager):
        p = run(["generate", *common, "--max-new-tokens", "12", *(["--disable-cuda-graph"] if eager else [])], env)
        return json.loads(p.stdout)["ids"] if p is not None and p.returncode == 0 else "ERR " + ("TIMEOUT" if p is None else p.stderr[-200:])
    base, gb = logits(None), greedy(None, False)
    for spec in VARS:
        env = env_of(spec)
        x = logits(env)
        rel = "ERR" if x is None or base is None else f"{float(np.abs(x - base).max() / np.abs(base).max()):.2e}"
        g, e = greedy(env, False), greedy(env, True)
        print(f"{name:18s} {spec.split(':')[0]:6s} logits vs defaults {rel} (M = 16); greedy == defaults': "
              f"{'yes' if g == gb else 'NO'}; graphs == eager: {'yes' if g == e else 'NO ' + str(g)[:80] + ' / ' + str(e)[:80]}")
PY
    echo "rc=$? $(el)"
fi

echo "total $(( $(date +%s) - T0 )) s"
