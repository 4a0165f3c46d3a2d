#!/usr/bin/env bash
# Runs every test: the cmocka unit tests, then the pytest suites (end-to-end
# and oracle comparisons). Prints one summary line "N passed, N failed".
# `run_tests.sh unit` runs the cmocka and fuzz binaries only, `run_tests.sh e2e`
# the pytest suites only (make unit / make e2e).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
what=${1:-all}
case "$what" in all|unit|e2e) ;; *) echo "usage: $0 [unit|e2e]" >&2; exit 2;; esac
pass=0; fail=0; failed=()
[ "$what" = e2e ] || for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    case "$t" in *.d) continue;; esac
    echo "=== unit: $t"
    if "$t"; then pass=$((pass+1)); else fail=$((fail+1)); failed+=("$t"); fi
done
[ "$what" = e2e ] || for t in "$BUILD"/fuzz_*; do
    [ -x "$t" ] || continue
    echo "=== fuzz: $t (1000 cases, ASan+UBSan)"
    if "$t" 1000; then pass=$((pass+1)); else fail=$((fail+1)); failed+=("$t"); fi
done
if [ "$what" != unit ]; then
    echo "=== pytest"
    python3 -m pytest -q -p no:cacheprovider tests/ 2>&1 | tee "$BUILD/pytest.log"
    prc=${PIPESTATUS[0]}
    if [ "$prc" -ne 0 ] && [ "$prc" -ne 5 ]; then fail=$((fail+1)); failed+=("pytest"); else pass=$((pass+1)); fi
fi
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "suites: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
