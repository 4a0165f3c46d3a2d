#!/bin/bash
# bench/device/gdnprep.sh: gdn cuda_chunked's preparation, the vector kernel gc_prep8_kernel
# (LASTSTAND_GDN_PREP=1, the default; 4 channels a thread) against the old gc_prep_kernel (=0).
# (S12 R3 also timed the forms since deleted: 8 channels a thread, and SiLU's divisions by a
# branch-free fast path; see bench/RESULTS.md.)
# 1. tests/unit/test_gdn_prep_cuda: x16 / (g, β) / conv states bitwise equal to the old kernel's
#    (35B, 397B, dk 64, dk 32 shapes; one 8192-token prompt, mixed 1/63/65/3000/0, short ones,
#    rows of extremes), and the whole cuda_chunked call. Then ncu of its 8192-token case: both
#    kernels side by side (L2 flushed), and the new one's sections.
# 2. ncu (--clock-control none --cache-control none, prefill8k.sh's command and plans, -k
#    regex:gc_prep) over `BIN generate` of synth Qwen3.5-35B cut to 4 layers (3 GDN layers), one
#    8192-token step, new and old: µs and DRAM TB/s; the greedy id of each.
# 3. the doctor's fp64 gdn cells for cuda_chunked with the new kernel: the 35B shape at M = 512,
#    3072 (serial form) and 3072 with LASTSTAND_GDN_WY=1, the 397B at 3072.
# Verdict lines: "PASS ..." / "FAIL ...".
# device-limit: 90
. "$(dirname "$0")/lib.sh"
dev_init gdnprep 88 "$@"
export NCCL_NVLS_ENABLE=0
PLANS=("${DEV_PLANS_PREFILL[@]}")
UT="$D/tests/test_gdn_prep_cuda"
T8K=test_prep_vector_form_same_bits_on_one_8k_prefill

echo "== bitwise: test_gdn_prep_cuda $(el)"
timeout -k 3 30 "$UT" >"$OUT/unit.log" 2>&1
rc=$?
grep -E "^\[  (PASSED|FAILED|  SKIPPED) |^\[ +(OK|FAILED) +\]|differs|did not|asked|skipping|error" "$OUT/unit.log" | head -24
if [ $rc = 0 ] && ! grep -q SKIPPED "$OUT/unit.log"; then
    echo "PASS bitwise prep form 1 == 0, and the whole call (test_gdn_prep_cuda)"
else
    echo "FAIL bitwise (test_gdn_prep_cuda rc=$rc)"
fi

if [ -n "$NCU" ] && [ "$(left)" -gt 60 ]; then
    echo "== ncu: test_gdn_prep_cuda's 8192-token prep at the 35B shape, forms 0 and 1, L2 flushed $(el)"
    LS_TEST_FILTER=$T8K timeout -k 3 25 "$NCU" --clock-control none -k regex:gc_prep \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        -o "$OUT/ncu-unit" "$UT" >"$OUT/ncu-unit.out" 2>&1
    echo "rc=$? $(el)"
    if [ -f "$OUT/ncu-unit.ncu-rep" ]; then
        timeout 15 "$NCU" --import "$OUT/ncu-unit.ncu-rep" --csv --page raw --print-units base \
            --print-kernel-base demangled >"$OUT/ncu-unit.csv" 2>/dev/null
        timeout 10 python3 bench/device/gdnprep_table.py "$OUT/ncu-unit.csv" unit
    fi
    echo "== ncu sections of gc_prep8_kernel $(el)"
    dev_ncu_test "$OUT/ncu-sec.txt" 25 "gc_prep8_kernel" "$T8K" "$UT"
    grep -E "gc_prep8_kernel|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Issued Warp Per Scheduler|No Eligible|Warp Cycles Per Issued|Active Warps Per Scheduler|Eligible Warps" \
        "$OUT/ncu-sec.txt" | sed -E 's/ +/ /g' | head -60
fi

IDS=$(ids 8192)
for form in 1 0; do
    [ -n "$NCU" ] && [ "$(left)" -gt 25 ] || { echo "== ncu prep=$form: skipped (time or no ncu)"; continue; }
    echo "== ncu: generate synth 35B layers=4, 8192-token prompt, -k regex:gc_prep, LASTSTAND_GDN_PREP=$form $(el)"
    LASTSTAND_GDN_PREP=$form timeout -k 3 20 "$NCU" --clock-control none --cache-control none -k regex:gc_prep \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum -o "$OUT/ncu-$form" \
        "$BIN" generate --model-path "synth:qwen3.5-35b-a3b,layers=4" --ids "$IDS" --max-new-tokens 1 \
        --device cuda --disable-cuda-graph --prefix-cache off "${PLANS[@]}" >"$OUT/ncu-$form.out" 2>&1
    echo "rc=$? $(el)"
    grep -E "==ERROR|error:" "$OUT/ncu-$form.out" | head -3
    grep -o '"ids": *\[[^]]*\]' "$OUT/ncu-$form.out" | head -1 | sed "s/^/  prep=$form generated /"
    if [ -f "$OUT/ncu-$form.ncu-rep" ]; then
        timeout 15 "$NCU" --import "$OUT/ncu-$form.ncu-rep" --csv --page raw --print-units base \
            --print-kernel-base demangled >"$OUT/ncu-$form.csv" 2>/dev/null
        timeout 10 python3 bench/device/gdnprep_table.py "$OUT/ncu-$form.csv" "p=$form"
    fi
done
b=$(grep -o '"ids": *\[[^]]*\]' "$OUT/ncu-0.out" 2>/dev/null | head -1)
for form in 1; do
    a=$(grep -o '"ids": *\[[^]]*\]' "$OUT/ncu-$form.out" 2>/dev/null | head -1)
    [ -n "$a$b" ] || continue
    if [ "$a" = "$b" ]; then echo "PASS same greedy id under ncu, prep=$form vs prep=0"; else echo "FAIL greedy id prep=$form $a vs prep=0 $b"; fi
done

doc() { # doctor fp64 gdn cells of cuda_chunked: FORM PRESET MS [VAR=VALUE]
    local f=$1 p=$2 ms=$3 tag=p$1-$2-${3//,/_}${4:+-wy}
    [ "$(left)" -gt 8 ] || { echo "== doctor $tag: skipped (time)"; return; }
    echo "== doctor fp64 gdn cuda_chunked $p M=$ms ${4:-} LASTSTAND_GDN_PREP=$f $(el)"
    env ${4:-} LASTSTAND_GDN_PREP=$f XDG_CACHE_HOME="$OUT/cache-$tag" timeout -k 3 $(( $(left) - 4 )) "$BIN" doctor \
        --device cuda --families gdn --backends cuda_chunked --shapes "$p" --m "$ms" --json "$OUT/doc-$tag.json" \
        >"$OUT/doc-$tag.txt" 2>&1
    echo "rc=$? $(el)"
    python3 - "$OUT/doc-$tag.json" "$tag" <<'PY'
import json, sys
try:
    t = [t for t in json.load(open(sys.argv[1]))["tables"] if t["family"] == "gdn"][0]
    cells = t["cells"]["cuda_chunked"]
    bad = {m: (c["status"], c.get("detail", "")[:120]) for m, c in cells.items() if c["status"] != "ok"}
    print(("PASS" if cells and not bad else "FAIL") + f" doctor fp64 gdn cuda_chunked {sys.argv[2]}: "
          + ", ".join(f"M={m} {c['status']}" for m, c in cells.items()) + (f" {bad}" if bad else ""))
except Exception as err:
    print(f"FAIL doctor {sys.argv[2]}: no report ({err})")
PY
}
doc 1 qwen3.5-35b-a3b 512,3072
doc 1 qwen3.5-397b-a17b 3072
doc 1 qwen3.5-35b-a3b 3072 LASTSTAND_GDN_WY=1
echo "total $(( $(date +%s) - T0 )) s"
