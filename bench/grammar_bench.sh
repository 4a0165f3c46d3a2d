#!/bin/bash
# bench/grammar_bench.sh [BIN] [TOKENIZER_DIR]: microseconds per constrained-decoding token
# mask by automaton state, on a real vocabulary (default: ../shared/tokenizers/qwen3, 151,669
# ids) at the Qwen3.5 mask width (248,320 ids: the ids above the tokenizer's are never
# allowed). cold = the first mask of that state (fills the string-state cache), warm = the
# median of 200 (the steady state of a request). One CPU thread. The last line is the worst
# warm mask. Recorded in bench/RESULTS.md, "Constrained decoding (S8)".
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${1:-$ROOT/build/laststand}
TOK=${2:-$ROOT/../shared/tokenizers/qwen3}
exec "$BIN" grammar --tokenizer-path "$TOK" --bench --vocab 248320 --reps 200
