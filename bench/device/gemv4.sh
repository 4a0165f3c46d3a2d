#!/usr/bin/env bash
# bench/device/gemv4.sh BIN OUTDIR: fp4_gemm at M = 1..8 after the gemv4 session's
# changes (src/ops/cuda/fp4_gemv.cu: every cuda_w4a16_mma kernel issues its weight
# loads before griddepcontrol.wait and is launched with programmatic dependent launch;
# src/doctor/trial.c: the doctor times calls in chains of 8 by default), on the
# DEVICE_ROUNDS.md protocol, in under 100 s:
#  1. the doctor, fp4_gemm on the 397B preset's [4096 x 4096] and [16384 x 4096],
#     M = 1, 2, 4, 8, every backend, default settings (chain8 timing, PDL on): the
#     doctor's own table (copy bandwidth, GB/s, % of copy);
#  1b. tests/unit/test_fp4_gemv_cuda.c (beside BIN in tests/): rmsnorm -> three fp4
#     GEMMs chained on one stream under PDL, NaN-poisoned outputs: chained == synced bit
#     for bit (legacy and own stream), 3 graph replays too, fp64 per op; default and the
#     opt-in kernels;
#  2. cuda_w4a16_mma alone (chain8 + PDL unless said): M = 3, 5, 7 (the M = 2..8
#     kernel's other token counts); the defaults before this session's switches (GDEC=1, M8=1) and the timing methods
#     (isolated + no PDL = the earlier sessions' method and launch, chain8 without PDL,
#     isolated with PDL); the 397B's [1024 x 4096], [4096 x 1024] and the 35B shapes with
#     the default and the defaults before this session (GDEC=1, M8=1); GDEC=2 on the two
#     weights;
#  3. the 35B preset's NVFP4 shapes (its GEMV instances), default, M = 1, 2, 8;
#  4. PDL inside CUDA graphs: `generate` greedy on the NVFP4 fixture
#     (.dev/int/fixtures/models/qwen3_5_moe_text-nvfp4, a copy of
#     ../shared/fixtures/models), --fp4-gemm-backend cuda_w4a16_mma, graphs vs
#     --disable-cuda-graph, PDL on vs off: the four id lists must be equal (the
#     engine's own graph-vs-eager check at start-up is in the log: its lines are shown);
#     `logits` PDL on vs off (max |difference|; 0 expected: same kernels, same order) and
#     against --fp4-gemm-backend cuda_ref;
#  5. Nsight Compute (--clock-control none) at M = 1: kernel time of the default GEMV and
#     of the other decode at [16384 x 4096] and [4096 x 4096], as the 100 s allow.
# device-limit: 100
set -u
BIN=${1:?usage: gemv4.sh BIN OUTDIR}
OUT=${2:?usage: gemv4.sh BIN OUTDIR}
FIX=${FIX:-.dev/int/fixtures/models}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$(cd "$(dirname "$BIN")" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset LASTSTAND_FP4_PDL LASTSTAND_DOCTOR_TIMING LASTSTAND_W4A16_GDEC LASTSTAND_W4A16_M8
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | head -1
echo "tree: $(git log -1 --format='%h %s' 2>/dev/null || echo 'no git here')"
T0=$(date +%s)
left() { echo $(( $1 - ($(date +%s) - T0) )); }  # seconds left before a mark
SH=4096x4096,16384x4096
summary() { # summary JSON LABEL
  python3 - "$1" "$2" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as ex:
    print("%-22s no report: %s" % (sys.argv[2], ex)); sys.exit(0)
bw = r.get("device", {}).get("copy_gbs", 0) or 0
for t in r["tables"]:
    c = t["cells"].get("cuda_w4a16_mma", {})
    if not c: continue
    print("%-22s %-12s %s" % (sys.argv[2], t["title"].split("  ")[1][:12], r.get("timing", "?")),
          "  ".join("M=%s %s %.2fus %.0f%%" % (m, "ok" if v["status"] in ("ok", "✅") else v["status"],
                    v.get("ms", 0) * 1e3, 100 * v.get("gbs", 0) / bw if bw else 0) for m, v in c.items()))
    for m, v in c.items():
        if v.get("status") not in ("ok", "✅") and v.get("detail"):
            print("   M=%s: %s" % (m, v["detail"]))
PY
}
doc() { # doc LABEL TIMEOUT "VAR=VALUE ..." ARGS...: sets F (the output prefix)
  local lab=$1 to=$2 ev=$3; shift 3
  F="$OUT/gemv4_$(echo "$lab" | tr '=:/+ ' '__-p_')"
  env $ev timeout "$to" "$BIN" doctor --device cuda --families fp4_gemm --json "$F.json" "$@" > "$F.txt" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && { echo "$lab: doctor exit $rc"; tail -3 "$F.txt"; }
}
echo "== 1. doctor, every backend, default (chain8 timing, PDL on)"
doc default 40 "" --shapes qwen3.5-397b-a17b --fp4-shapes $SH --m 1,2,4,8
sed -n '1,60p' "$F.txt" | grep -vE '^\s*$' | head -40
summary "$F.json" "default"
echo "doctor 1: $(( $(date +%s) - T0 )) s"
echo "== 1b. unit test_fp4_gemv_cuda (rmsnorm -> 3 fp4 GEMMs chained with PDL, eager and graph, vs synced and fp64)"
UT="$(dirname "$BIN")/tests/test_fp4_gemv_cuda"
if [ -x "$UT" ]; then
  for v in "default|" "GDEC=1+M8=1|LASTSTAND_W4A16_GDEC=1 LASTSTAND_W4A16_M8=1" "GDEC=2+M8=2|LASTSTAND_W4A16_GDEC=2 LASTSTAND_W4A16_M8=2"; do
    lab=${v%%|*}; ev=${v#*|}
    env $ev timeout 30 "$UT" > "$OUT/ut_$lab.log" 2>&1
    echo "unit $lab rc=$? $(grep -E 'PASSED|FAILED|SKIPPED' "$OUT/ut_$lab.log" | head -2 | tr '\n' ' ')"
    grep -E 'differs|fp64|capture|chain M|Failure|error' "$OUT/ut_$lab.log" | head -6
  done
else
  echo "unit test_fp4_gemv_cuda: not found at $UT"
fi
echo "== 2. cuda_w4a16_mma: timing x PDL x decode"
# LABEL|ENV|SHAPES|M list, most important first (each later one is skipped past 62 s)
O4=1024x4096,4096x1024
for v in "M=3,5,7|||3,5,7" \
         "GDEC=1+M8=1|LASTSTAND_W4A16_GDEC=1 LASTSTAND_W4A16_M8=1||1,2,8" \
         "isolated+nopdl|LASTSTAND_DOCTOR_TIMING=isolated LASTSTAND_FP4_PDL=0||1,2,8" \
         "chain8+nopdl|LASTSTAND_FP4_PDL=0||1,2,8" "isolated+pdl|LASTSTAND_DOCTOR_TIMING=isolated||1" \
         "397B-other|||1,2,8" "397B-other GDEC=1+M8=1|LASTSTAND_W4A16_GDEC=1 LASTSTAND_W4A16_M8=1||1,2,8" \
         "35B GDEC=1+M8=1|LASTSTAND_W4A16_GDEC=1 LASTSTAND_W4A16_M8=1||1,2,8" \
         "GDEC=2|LASTSTAND_W4A16_GDEC=2||1"; do
  lab=${v%%|*}; rest=${v#*|}; ev=${rest%%|*}; rest=${rest#*|}; ms=${rest#*|}
  [ "$(left 62)" -lt 0 ] && { echo "$lab skipped: time"; continue; }
  case "$lab" in
    397B-other*) doc "$lab" 20 "$ev" --backends cuda_w4a16_mma --shapes qwen3.5-397b-a17b --fp4-shapes $O4 --m $ms ;;
    35B*) doc "$lab" 20 "$ev" --backends cuda_w4a16_mma --shapes qwen3.5-35b-a3b --m $ms ;;
    *) doc "$lab" 20 "$ev" --backends cuda_w4a16_mma --shapes qwen3.5-397b-a17b --fp4-shapes $SH --m $ms ;;
  esac
  summary "$F.json" "$lab"
done
echo "== 3. 35B preset, default"
if [ "$(left 72)" -lt 0 ]; then echo "35B skipped: time"; else
  doc 35B 20 "" --backends cuda_w4a16_mma --shapes qwen3.5-35b-a3b --m 1,2,8
  summary "$F.json" "35B"
fi
echo "doctor: $(( $(date +%s) - T0 )) s"
echo "== 4. PDL inside CUDA graphs (generate greedy, logits)"
M="$FIX/qwen3_5_moe_text-nvfp4"
if [ -f "$M/ref.json" ]; then
  ids=$(python3 -c "import json;print(','.join(map(str,json.load(open('$M/ref.json'))['input_ids'])))")
  for v in "graph+pdl||" "eager+pdl||--disable-cuda-graph" "graph+nopdl|LASTSTAND_FP4_PDL=0|" \
           "eager+nopdl|LASTSTAND_FP4_PDL=0|--disable-cuda-graph"; do
    lab=${v%%|*}; rest=${v#*|}; ev=${rest%%|*}; fl=${rest#*|}
    [ "$(left 90)" -lt 0 ] && { echo "generate $lab skipped: time"; continue; }
    env $ev timeout 25 "$BIN" generate --model-path "$M" --ids "$ids" --max-new-tokens 16 --device cuda \
      --fp4-gemm-backend cuda_w4a16_mma $fl > "$OUT/gen_$lab.json" 2> "$OUT/gen_$lab.err"
    echo "$lab rc=$? ids=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['ids'])" "$OUT/gen_$lab.json" 2>&1 | tail -1)"
    grep -iE 'graph|error' "$OUT/gen_$lab.err" | head -4
  done
  python3 - "$OUT" <<'PY'
import json, sys
o = sys.argv[1]
try:
    g = {k: json.load(open(f"{o}/gen_{k}.json"))["ids"] for k in ("graph+pdl", "eager+pdl", "graph+nopdl", "eager+nopdl")}
    print("greedy ids graph/eager x PDL on/off:", "ALL EQUAL" if len({str(v) for v in g.values()}) == 1 else "DIFFERENT")
except Exception as ex:
    print("greedy compare: no result:", ex)
PY
  for v in "pdl|" "nopdl|LASTSTAND_FP4_PDL=0"; do
    lab=${v%%|*}; ev=${v#*|}
    env $ev timeout 20 "$BIN" logits --model-path "$M" --ids "$ids" --device cuda --fp4-gemm-backend cuda_w4a16_mma \
      > "$OUT/logits_$lab.json" 2> "$OUT/logits_$lab.err" || { echo "logits $lab failed:"; tail -2 "$OUT/logits_$lab.err"; }
  done
  timeout 20 "$BIN" logits --model-path "$M" --ids "$ids" --device cuda --fp4-gemm-backend cuda_ref \
    > "$OUT/logits_ref.json" 2> "$OUT/logits_ref.err" || { echo "logits cuda_ref failed:"; tail -2 "$OUT/logits_ref.err"; }
  python3 - "$OUT" <<'PY'
import json, sys
import numpy as np
o = sys.argv[1]
try:
    a = np.array(json.load(open(f"{o}/logits_pdl.json"))["logits"], dtype=np.float64)
    b = np.array(json.load(open(f"{o}/logits_nopdl.json"))["logits"], dtype=np.float64)
    r = np.array(json.load(open(f"{o}/logits_ref.json"))["logits"], dtype=np.float64)
    rel = float((np.abs(a - r).max(axis=1) / np.abs(r).max(axis=1)).max())
    print(f"logits PDL on vs off: max |diff| {np.abs(a - b).max():.3g}; cuda_w4a16_mma vs --fp4-gemm-backend cuda_ref: "
          f"rel {rel:.3g}, argmax {int((a.argmax(1) == r.argmax(1)).sum())}/{len(r)} (the fixture's CUDA-vs-CPU gap, 1.05, is "
          f"the same with cuda_ref: accu-R3)")
except Exception as ex:
    print("logits compare: no result:", ex)
PY
else
  echo "fixture $M missing: step 4 skipped"
fi
echo "graphs: $(( $(date +%s) - T0 )) s"
if command -v ncu >/dev/null 2>&1; then
  for sv in "4096x4096|" "16384x4096|"; do
    s=${sv%%|*}; ev=${sv#*|}
    [ "$(left 88)" -lt 0 ] && { echo "ncu $s $ev skipped: time"; continue; }
    env $ev timeout 12 ncu --clock-control none --target-processes all -k regex:fp4_gemv -c 1 --section SpeedOfLight \
      "$BIN" doctor --device cuda --shapes qwen3.5-397b-a17b --families fp4_gemm --backends cuda_w4a16_mma \
      --fp4-shapes $s --m 1 --trial-timeout 10 > "$OUT/ncu_$s$ev.txt" 2>&1
    echo "ncu $s M=1 $ev: $(grep -E '^  [a-z_].*\(' "$OUT/ncu_$s$ev.txt" | head -1 | cut -c3-44)" \
      "$(grep -E ' Duration|DRAM Throughput|SM Frequency' "$OUT/ncu_$s$ev.txt" | awk '{print $1, $2, $(NF-1), $NF}' | tr '\n' ' ')"
  done
fi
echo "total: $(( $(date +%s) - T0 )) s"
