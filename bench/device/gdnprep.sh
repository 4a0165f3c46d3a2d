#!/bin/bash
# bench/device/gdnprep.sh: gdn cuda_chunked's preparation, the vector kernel gc_prep8_kernel
# (LASTSTAND_GDN_PREP=1, the default) against the old gc_prep_kernel (=0).
# 1. tests/unit/test_gdn_prep_cuda: the two forms' x16 / (g, β) / conv states bitwise equal
#    (35B, 397B, dk 64, dk 32 shapes; one 8192-token prompt, mixed 1/63/65/3000/0, short ones).
#    Then ncu of its 8192-token case: gc_prep_kernel, gc_prep8_kernel<4, 8> (LASTSTAND_GDN_PREP=1)
#    and <4, 4> (=2) side by side.
# 2. ncu (--clock-control none --cache-control none, prefill8k.sh's command and plans, -k
#    regex:gc_) over `BIN generate` of synth Qwen3.5-35B cut to 4 layers (3 GDN layers), one
#    8192-token step: new (LASTSTAND_GDN_PREP=1 and LASTSTAND_GDN_UPF=1: the serial pass's U
#    loaded a chunk ahead) then old (both 0): per kernel µs and DRAM TB/s; the greedy id of both.
# 3. the doctor's fp64 gdn cells for cuda_chunked with the new forms on: the 35B shape at
#    M = 512, 3072 (serial form) and 3072 with LASTSTAND_GDN_WY=1 (chunk-parallel), the 397B at 3072.
# Verdict lines: "PASS ..." / "FAIL ...".
# device-limit: 90
. "$(dirname "$0")/lib.sh"
dev_init gdnprep 88 "$@"
export NCCL_NVLS_ENABLE=0
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:1,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode:16,cuda_chunked
       --gemm-backend cuda_gemv:16,cuda_cublaslt --lm-head-backend cuda_cublaslt)
ids() { python3 -c "import sys;n=int(sys.argv[1]);print(','.join(str(1000+(i*7919)%200000) for i in range(n)))" "$1"; }
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)

echo "== bitwise: test_gdn_prep_cuda $(el)"
timeout -k 3 25 "$D/tests/test_gdn_prep_cuda" >"$OUT/unit.log" 2>&1
rc=$?
grep -E "^\[  (PASSED|FAILED|  SKIPPED) |^\[ +(OK|FAILED) +\]|differs|did not|skipping|error" "$OUT/unit.log" | head -20
if [ $rc = 0 ] && ! grep -q SKIPPED "$OUT/unit.log"; then echo "PASS bitwise prep forms 1, 2 == 0 and whole call new == old (test_gdn_prep_cuda)"; else echo "FAIL bitwise (test_gdn_prep_cuda rc=$rc)"; fi

if [ -n "$NCU" ] && [ "$(left)" -gt 50 ]; then
    echo "== ncu: test_gdn_prep_cuda's 8192-token prep at the 35B shape, the three forms (0 old, 1 CPT 8, 2 CPT 4), L2 flushed $(el)"
    LS_TEST_FILTER=test_prep_vector_form_same_bits_on_one_8k_prefill timeout -k 3 25 "$NCU" --clock-control none \
        -k regex:gc_prep --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
        -o "$OUT/ncu-unit" "$D/tests/test_gdn_prep_cuda" >"$OUT/ncu-unit.out" 2>&1
    echo "rc=$? $(el)"
    if [ -f "$OUT/ncu-unit.ncu-rep" ]; then
        timeout 15 "$NCU" --import "$OUT/ncu-unit.ncu-rep" --csv --page raw --print-units base \
            --print-kernel-base demangled >"$OUT/ncu-unit.csv" 2>/dev/null
        timeout 10 python3 bench/device/gdnprep_table.py "$OUT/ncu-unit.csv" unit
    fi
fi

IDS=$(ids 8192)
for form in 1 0; do # form 1: PREP=1 UPF=1; 0: PREP=0 UPF=0
    [ -n "$NCU" ] && [ "$(left)" -gt 30 ] || { echo "== ncu prep=$form: skipped (time or no ncu)"; continue; }
    echo "== ncu: generate synth 35B layers=4, 8192-token prompt, -k regex:gc_, LASTSTAND_GDN_PREP=$form LASTSTAND_GDN_UPF=$form $(el)"
    LASTSTAND_GDN_PREP=$form LASTSTAND_GDN_UPF=$form timeout -k 3 22 "$NCU" --clock-control none --cache-control none -k regex:gc_ \
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
a=$(grep -o '"ids": *\[[^]]*\]' "$OUT/ncu-1.out" 2>/dev/null | head -1)
b=$(grep -o '"ids": *\[[^]]*\]' "$OUT/ncu-0.out" 2>/dev/null | head -1)
if [ -n "$a" ] && [ "$a" = "$b" ]; then echo "PASS same greedy id under ncu, new (PREP=1 UPF=1) vs old (0 0)"; elif [ -n "$a$b" ]; then echo "FAIL greedy id differs: $a vs $b"; fi

doc() { # doctor fp64 gdn cells of cuda_chunked: PRESET MS [VAR=VALUE]; the new forms on
    local p=$1 ms=$2 tag=$1-${2//,/_}${3:+-wy}
    [ "$(left)" -gt 12 ] || { echo "== doctor $tag: skipped (time)"; return; }
    echo "== doctor fp64 gdn cuda_chunked $p M=$ms ${3:-} LASTSTAND_GDN_PREP=1 LASTSTAND_GDN_UPF=1 $(el)"
    env ${3:-} LASTSTAND_GDN_PREP=1 LASTSTAND_GDN_UPF=1 XDG_CACHE_HOME="$OUT/cache-$tag" timeout -k 3 $(( $(left) - 4 )) "$BIN" doctor --device cuda \
        --families gdn --backends cuda_chunked --shapes "$p" --m "$ms" --json "$OUT/doc-$tag.json" >"$OUT/doc-$tag.txt" 2>&1
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
doc qwen3.5-35b-a3b 512,3072
doc qwen3.5-397b-a17b 3072
doc qwen3.5-35b-a3b 3072 LASTSTAND_GDN_WY=1
echo "total $(( $(date +%s) - T0 )) s"
