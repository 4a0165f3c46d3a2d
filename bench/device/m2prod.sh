#!/bin/bash
# bench/device/m2prod.sh: the prefill MoE GEMM m2_kernel (src/ops/cuda/moe_wgmma.cu) in its S12
# form (every step commits its wgmma group inside the branch on N, so the decode of block q + 1
# overlaps the MMAs of block q; the NVFP4 down's token rows by TMA) against the down's cp.async form
# (LASTSTAND_MG_WGMMA2_TMA=0) and mw_kernel, same binary, same run; and where a step's time goes
# (ncu source counters: the SASS lines with the most stall samples). S12 task m2prod; bench/RESULTS.md
# "m2_kernel's decode beside its MMAs" (its R2 and R3 also timed S11's kernel, deleted since).
# device-limit: 90
#
#   bash bench/device/m2prod.sh BIN OUTDIR
#
# 1. doctor moe (fp64 CPU oracle on sampled tokens, every cell checked), m2 forced at every M
#    (MINROWS=0): 35B shapes M = 2048, 4096, 8192, 397B M = 2048, 8192: default vs TMA=0; padding
#    (64-row tiles forced, M = 100, 3001) both; synth 35B (BF16 shared expert on m2's BF16 form)
#    M = 8192; mw_kernel at 2048, 4096 (the default below MINROWS). Verdict lines
#    "m2prod doctor TAG PASS|FAIL", times "m2prod time ...".
# 2. ncu of the first four m2_kernel launches (routed gate/up and down, the BF16 shared expert's)
#    over `BIN generate` synth 35B cut to 4 layers, an 8192-token prompt, the defaults: duration,
#    pipes, warp stalls, and (SourceCounters) the top SASS lines by warp stall samples.
# 3. tests/test_gpu_moe_wgmma.py (doctor cells, logits vs the CPU, TMA == cp.async bit for bit).
. "$(dirname "$0")/lib.sh"
dev_init m2prod 88 "$@"
export NCCL_NVLS_ENABLE=0
NEW="LASTSTAND_MG_WGMMA2=1 LASTSTAND_MG_WGMMA2_MINROWS=0"
NOTMA="$NEW LASTSTAND_MG_WGMMA2_TMA=0"
MW="LASTSTAND_MG_WGMMA2=0"
PLANS=("${DEV_PLANS_PREFILL[@]}")

# doctor TAG ENVS PRESET MS MAXS (PRESET: a --shapes preset, or synth:... for --model-path)
doctor() {
    local tag=$1 envs=$2 preset=$3 ms=$4 t=$5 l rc src
    l=$(( $(left) - 3 )); [ "$l" -lt "$t" ] && t=$l
    [ "$t" -ge 6 ] || { echo "m2prod doctor $tag SKIPPED (time)"; return 1; }
    case $preset in synth:*) src=--model-path ;; *) src=--shapes ;; esac
    env $envs timeout -k 2 "$t" "$BIN" doctor --device cuda --families moe $src "$preset" --m "$ms" \
        --backends cuda_grouped_gemm --trial-timeout 30 >"$OUT/doc-$tag.txt" 2>"$OUT/doc-$tag.err"
    rc=$?
    grep -E "^ +[0-9]+ " "$OUT/doc-$tag.txt" | sed "s/^/  $tag /"
    grep -iE "error|fault|illegal" "$OUT/doc-$tag.err" | head -3 | cut -c1-250
    if [ $rc -eq 0 ] && ! grep -q "❌" "$OUT/doc-$tag.txt" && grep -q "✅" "$OUT/doc-$tag.txt"; then
        echo "m2prod doctor $tag PASS $(el)"
    else
        echo "m2prod doctor $tag FAIL rc=$rc $(el)"; tail -n 3 "$OUT/doc-$tag.err" | cut -c1-250
    fi
}

echo "== 1. doctor moe: m2_kernel (the down's tokens by TMA) vs TMA=0 (cp.async), fp64 oracle $(el)"
doctor new-35 "$NEW" qwen3.5-35b-a3b 2048,4096,8192 12
doctor notma-35 "$NOTMA" qwen3.5-35b-a3b 2048,4096,8192 12
doctor new-pad "$NEW LASTSTAND_GROUPED_BM=64" qwen3.5-35b-a3b 100,3001 8
doctor notma-pad "$NOTMA LASTSTAND_GROUPED_BM=64" qwen3.5-35b-a3b 100,3001 8
doctor new-397 "$NEW" qwen3.5-397b-a17b 2048,8192 14
doctor notma-397 "$NOTMA" qwen3.5-397b-a17b 2048,8192 14
doctor new-syn "$NEW LASTSTAND_MG_WGMMA2_SH=1" "synth:qwen3.5-35b-a3b,layers=1" 8192 8
doctor mw-35 "$MW" qwen3.5-35b-a3b 2048,4096 8
python3 - "$OUT" <<'PY'
import os, re, sys
def times(tag):
    p = os.path.join(sys.argv[1], f"doc-{tag}.txt")
    r = {}
    if os.path.exists(p):
        for ln in open(p):
            m = re.match(r"\s+(\d+)\s+\S+\s+([\d.]+) (µs|ms)", ln)
            if m:
                r[int(m.group(1))] = float(m.group(2)) * (1e-3 if m.group(3) == "µs" else 1.0)
    return r
for sh, t in (("35B", "35"), ("padding", "pad"), ("397B", "397")):
    t0, t1 = times(f"notma-{t}"), times(f"new-{t}")
    for M in sorted(set(t0) & set(t1)):
        print(f"m2prod time {sh} M {M}: MoE call TMA=0 {t0[M]:.3f} ms, default {t1[M]:.3f} ms ({(t1[M] / t0[M] - 1) * 100:+.1f}%)")
for M, t in sorted(times("new-syn").items()):
    print(f"m2prod time synth35B-bf16sh M {M}: MoE call {t:.3f} ms")
for M, t in sorted(times("mw-35").items()):
    print(f"m2prod time 35B M {M}: mw_kernel {t:.3f} ms (the default below 112 rows an expert)")
PY

# 2. ncu over generate (prefill8k.sh's command), the first four m2 launches, with source counters
if [ -n "$NCU" ] && [ "$(left)" -gt 60 ]; then
    lim=$(( $(left) - 45 )); [ $lim -gt 20 ] && lim=20
    echo "== 2. ncu: generate synth 35B (4 layers), 8192-token prompt, -k m2_kernel x4, defaults (limit $lim s) $(el)"
    timeout -k 2 $lim "$NCU" --clock-control none --cache-control none -k regex:m2_kernel --launch-count 4 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SourceCounters \
        -o "$OUT/ncu-new" \
        "$BIN" generate --model-path "synth:qwen3.5-35b-a3b,layers=4" --ids "$(ids 8192)" --max-new-tokens 1 \
        --device cuda --disable-cuda-graph --prefix-cache off "${PLANS[@]}" >"$OUT/ncu-new.out" 2>&1
    echo "rc=$? $(el)"
    grep -E "==ERROR|error:" "$OUT/ncu-new.out" | head -3 | cut -c1-200
    if [ -f "$OUT/ncu-new.ncu-rep" ]; then
        timeout 8 "$NCU" --import "$OUT/ncu-new.ncu-rep" --csv --page raw --print-units base \
            --print-kernel-base demangled >"$OUT/ncu-new.csv" 2>/dev/null
        timeout 8 python3 bench/device/moepre_ncu.py "$OUT/ncu-new.csv" 2>&1 | grep -vE "bank" | sed "s/^/  new /" | head -20
        timeout 10 "$NCU" --import "$OUT/ncu-new.ncu-rep" --csv --page source --print-source sass \
            >"$OUT/ncu-src.csv" 2>"$OUT/ncu-src.err"
        echo "source page rc=$? $(wc -l <"$OUT/ncu-src.csv") lines $(el)"
        timeout 8 python3 - "$OUT/ncu-src.csv" <<'PY' || head -c 600 "$OUT/ncu-src.err"
# the SASS lines with the most warp stall samples, per profiled kernel, and samples by opcode
import csv, re, sys
from collections import Counter
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
blocks, cur, head = [], None, None
for r in rows:
    if "Source" in r and any("Sampling" in c for c in r):
        head = r
        cur = []
        blocks.append((head, cur))
    elif head is not None and len(r) == len(head):
        cur.append(r)
if not blocks:
    print("  no source table; first lines:")
    for r in rows[:4]:
        print("  ", ",".join(r)[:200])
for n, (head, data) in enumerate(blocks[:4]):
    src = head.index("Source")
    cols = [i for i, c in enumerate(head) if "Sampling" in c and "All" in c] or \
           [i for i, c in enumerate(head) if "Sampling" in c]
    sc = cols[0]
    def v(r):
        try:
            return float(r[sc].replace(",", ""))
        except ValueError:
            return 0.0
    tot = sum(v(r) for r in data) or 1.0
    by = Counter()
    for r in data:
        op = re.sub(r"^@!?U?P\w+\s+", "", r[src].strip()).split(" ")[0]
        by[op.split(".")[0]] += v(r)
    print(f"  src kernel {n}: {len(data)} SASS lines, {head[sc]} total {tot:.0f}; by opcode: "
          + ", ".join(f"{k} {100 * x / tot:.0f}%" for k, x in by.most_common(10)))
    for r in sorted(data, key=v, reverse=True)[:12]:
        addr = r[head.index("Address")] if "Address" in head else "?"
        print(f"  src kernel {n}  {100 * v(r) / tot:5.1f}%  {addr}  {r[src].strip()[:90]}")
PY
    fi
else
    echo "m2prod ncu SKIPPED (time or no ncu)"
fi
if [ "$(left)" -gt 15 ] && python3 -c "import pytest" 2>/dev/null; then
    lim=$(( $(left) - 2 ))
    echo "== 3. pytest tests/test_gpu_moe_wgmma.py (limit $lim s) $(el)"
    env BUILD=$D LS_SHARED=$D timeout -k 3 $lim python3 -m pytest -q -p no:cacheprovider -rfEs \
        tests/test_gpu_moe_wgmma.py 2>&1 | grep -vE "^\s*$" | tail -10
    rc=${PIPESTATUS[0]}
    echo "m2prod pytest $([ "$rc" = 0 ] && echo PASS || { [ "$rc" = 124 ] && echo "TIMEOUT (see above)" || echo "FAIL rc=$rc"; }) $(el)"
else
    echo "m2prod pytest SKIPPED (time or no pytest)"
fi
echo "total $(( $(date +%s) - T0 )) s"
