#!/usr/bin/env bash
# device-limit: 560
# bench/device/gdndoc.sh BIN OUTDIR: the gdn family's doctor cells (a mixed step + a decode step of
# M sequences) at the synth Qwen3.5-35B-A3B's shapes, then serve on auto (the doctor's plans) and
# the bench at concurrency CONC (default 1,16,64,128,256; 1024 in / 256 out): the step kinds a
# server runs at each concurrency, against batchdec.sh's and the earlier e2e's numbers.
. "$(dirname "$0")/lib.sh"
dev_init gdndoc 555 "$@"
echo "== doctor: gdn, synth 35B shapes $(el)"
timeout -k 3 120 "$BIN" doctor --device cuda --model-path "synth:qwen3.5-35b-a3b,layers=1" --families gdn \
    --m 1,8,16,64,512,2048 --json "$OUT/doctor-gdn.json" >"$OUT/doctor-gdn.txt" 2>"$OUT/doctor-gdn.err"
echo "rc=$? $(el)"
grep -vE "^\s*$" "$OUT/doctor-gdn.txt" | head -30
echo "== serve on auto + bench $(el)"
XDG_CACHE_HOME="$OUT/cache" BIN=$BIN CONCURRENCY=${CONC:-1,16,64,128,256} NUM_PROMPTS=${NP:-8,32,128,256,512} \
    INPUT_LEN=1024 OUTPUT_LEN=256 WARMUP=2 HEALTH_TIMEOUT=300 PORT=$((32000 + $$ % 2000)) \
    timeout $(( $(left) - 10 )) bash bench/run_e2e.sh "$OUT/e2e" qwen3.5-35b-a3b -- --device cuda 2>&1 | tail -9
grep -E "standing|^\[.*INFO\]   [a-z0-9_]+ +cuda|refused|decode steps|graphs:" "$OUT/e2e/server.log" | cut -c1-260
echo "done $(el)"
