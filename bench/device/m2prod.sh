#!/bin/bash
# bench/device/m2prod.sh: the prefill MoE GEMM m2_kernel (src/ops/cuda/moe_wgmma.cu) with its wgmma
# group committed inside each N branch (LASTSTAND_MG_WGMMA2_CB=1: no dummy HGMMA at the join, so
# wait_group 1 lets the decode of block q + 1 overlap the MMAs of block q; CB=2: that and the
# cp.async refill issued behind the MMAs) against the default (CB=0), same binary, same run.
# S12 task m2prod; bench/RESULTS.md "m2_kernel's decode beside its MMAs".
# device-limit: 90
#
#   bash bench/device/m2prod.sh BIN OUTDIR
#
# 1. doctor moe (fp64 CPU oracle on sampled tokens, every cell checked), m2 forced at every M
#    (MINROWS=0): 35B shapes M = 2048, 4096, 8192 CB=0 / 1 / 2 (+ mw_kernel at 2048, 4096: the
#    default there); 397B M = 8192 CB=0, 2048 + 8192 CB=1, 2; padding (64-row tiles forced,
#    M = 100, 3001) CB=2; synth 35B (BF16 shared expert on m2's BF16 form) M = 8192 CB=0 / 2;
#    CB=2 with balanced groups (LASTSTAND_MG_WGMMA2_BAL=1) at the 35B and padding cells.
#    Verdict lines "m2prod doctor TAG PASS|FAIL", times "m2prod time ...".
# 2. ncu of the first four m2_kernel launches (routed gate/up and down, the BF16 shared expert's)
#    over `BIN generate` synth 35B cut to 4 layers, an 8192-token prompt, CB=2 (then CB=1, CB=0
#    if time is left): duration, SOL, pipes (tensor), scheduler, warp stalls.
# 3. tests/test_gpu_moe_wgmma.py: both bitwise checks (logits of CB=1 == CB=0, CB=2 == CB=0 bit for
#    bit), CB=2's logits vs the CPU, the balanced-group doctor cells (the other CB cells are the
#    doctor runs of part 1).
. "$(dirname "$0")/lib.sh"
dev_init m2prod 88 "$@"
export NCCL_NVLS_ENABLE=0
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
CB0="LASTSTAND_MG_WGMMA2=1 LASTSTAND_MG_WGMMA2_MINROWS=0 LASTSTAND_MG_WGMMA2_CB=0"
CB1="LASTSTAND_MG_WGMMA2=1 LASTSTAND_MG_WGMMA2_MINROWS=0 LASTSTAND_MG_WGMMA2_CB=1"
CB2="LASTSTAND_MG_WGMMA2=1 LASTSTAND_MG_WGMMA2_MINROWS=0 LASTSTAND_MG_WGMMA2_CB=2"
MW="LASTSTAND_MG_WGMMA2=0"
PLANS=(--fp4-gemm-backend cuda_w4a16_mma:64,cuda_dequant_cublas --moe-runner-backend cuda_fused_decode:1,cuda_grouped_gemm
       --attention-backend cuda_flash_prefill --gdn-backend cuda_decode:16,cuda_chunked
       --gemm-backend cuda_gemv:16,cuda_cublaslt --lm-head-backend cuda_cublaslt)
ids() { python3 -c "import sys;n=int(sys.argv[1]);print(','.join(str(1000+(i*7919)%200000) for i in range(n)))" "$1"; }

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

echo "== 1. doctor moe: m2_kernel CB=0 (default) vs CB=1, 2, fp64 oracle $(el)"
doctor cb0-35 "$CB0" qwen3.5-35b-a3b 2048,4096,8192 12
doctor cb1-35 "$CB1" qwen3.5-35b-a3b 2048,4096,8192 12
doctor cb2-35 "$CB2" qwen3.5-35b-a3b 2048,4096,8192 12
doctor cb2-pad "$CB2 LASTSTAND_GROUPED_BM=64" qwen3.5-35b-a3b 100,3001 8
doctor cb0-397 "$CB0" qwen3.5-397b-a17b 8192 12
doctor cb1-397 "$CB1" qwen3.5-397b-a17b 2048,8192 12
doctor cb2-397 "$CB2" qwen3.5-397b-a17b 2048,8192 12
doctor cb0-syn "$CB0 LASTSTAND_MG_WGMMA2_SH=1" "synth:qwen3.5-35b-a3b,layers=1" 8192 8
doctor cb2-syn "$CB2 LASTSTAND_MG_WGMMA2_SH=1" "synth:qwen3.5-35b-a3b,layers=1" 8192 8
doctor bal-35 "$CB2 LASTSTAND_MG_WGMMA2_BAL=1" qwen3.5-35b-a3b 2048,4096,8192 10
doctor bal-pad "$CB2 LASTSTAND_MG_WGMMA2_BAL=1 LASTSTAND_GROUPED_BM=64" qwen3.5-35b-a3b 100,3001 8
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
for sh, t in (("35B", "35"), ("397B", "397"), ("synth35B-bf16sh", "syn")):
    t0, t1, t2 = times(f"cb0-{t}"), times(f"cb1-{t}"), times(f"cb2-{t}")
    for M in sorted(set(t0) | set(t1) | set(t2)):
        f = lambda d, cb: (f"CB={cb} {d[M]:.3f} ms" + (f" ({(d[M] / t0[M] - 1) * 100:+.1f}%)" if cb and M in t0 else "")
                           if M in d else f"CB={cb} -")
        print(f"m2prod time {sh} M {M}: MoE call {f(t0, 0)}, {f(t1, 1)}, {f(t2, 2)}")
t0, tb = times("cb0-35"), times("bal-35")
for M in sorted(tb):
    print(f"m2prod time 35B M {M}: MoE call CB=2 + BAL=1 {tb[M]:.3f} ms"
          + (f" ({(tb[M] / t0[M] - 1) * 100:+.1f}% vs CB=0)" if M in t0 else ""))
tm = times("mw-35")
for M, t in sorted(tm.items()):
    print(f"m2prod time 35B M {M}: mw_kernel {t:.3f} ms (the default below 112 rows an expert)")
PY

# 2. ncu over generate (prefill8k.sh's command), the first four m2 launches
ncu_run() {
    local tag=$1 envs=$2 lim
    lim=$(( $(left) - 20 )); [ $lim -gt 22 ] && lim=22
    [ -n "$NCU" ] && [ $lim -ge 12 ] || { echo "m2prod ncu $tag SKIPPED (time or no ncu)"; return; }
    echo "== 2. ncu $tag: generate synth 35B (4 layers), 8192-token prompt, -k m2_kernel x4 (limit $lim s) $(el)"
    env $envs timeout -k 2 $lim "$NCU" --clock-control none --cache-control none -k regex:m2_kernel --launch-count 4 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats \
        --section LaunchStats -o "$OUT/ncu-$tag" \
        "$BIN" generate --model-path "synth:qwen3.5-35b-a3b,layers=4" --ids "$(ids 8192)" --max-new-tokens 1 \
        --device cuda --disable-cuda-graph --prefix-cache off "${PLANS[@]}" >"$OUT/ncu-$tag.out" 2>&1
    echo "rc=$? $(el)"
    grep -E "==ERROR|error:" "$OUT/ncu-$tag.out" | head -3 | cut -c1-200
    if [ -f "$OUT/ncu-$tag.ncu-rep" ]; then
        timeout 10 "$NCU" --import "$OUT/ncu-$tag.ncu-rep" --csv --page raw --print-units base \
            --print-kernel-base demangled >"$OUT/ncu-$tag.csv" 2>/dev/null
        timeout 10 python3 bench/device/moepre_ncu.py "$OUT/ncu-$tag.csv" 2>&1 | sed "s/^/  $tag /" | head -24
    fi
}
ncu_run cb2 "LASTSTAND_MG_WGMMA2_CB=2"

if [ "$(left)" -gt 20 ] && python3 -c "import pytest" 2>/dev/null; then
    lim=$(( $(left) - 2 )); [ $lim -gt 30 ] && lim=30
    echo "== 3. pytest tests/test_gpu_moe_wgmma.py -k 'bit_identical or m2cb2-bal or logits and m2cb2' (limit $lim s) $(el)"
    env BUILD=$D LS_SHARED=$D timeout -k 3 $lim python3 -m pytest -q -p no:cacheprovider -rfEs \
        -k "bit_identical or m2cb2-bal or logits and m2cb2" tests/test_gpu_moe_wgmma.py 2>&1 | grep -vE "^\s*$" | tail -10
    rc=${PIPESTATUS[0]}
    echo "m2prod pytest $([ "$rc" = 0 ] && echo PASS || { [ "$rc" = 124 ] && echo "TIMEOUT (see above)" || echo "FAIL rc=$rc"; }) $(el)"
else
    echo "m2prod pytest SKIPPED (time or no pytest)"
fi
ncu_run cb1 "LASTSTAND_MG_WGMMA2_CB=1"
ncu_run cb0 "LASTSTAND_MG_WGMMA2_CB=0"
echo "total $(( $(date +%s) - T0 )) s"
