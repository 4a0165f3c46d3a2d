#!/usr/bin/env bash
# Runs every test: the cmocka unit tests, then the pytest suites (end-to-end
# and oracle comparisons). Prints one summary line "N passed, N failed".
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
pass=0; fail=0; failed=()
for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    case "$t" in *.d) continue;; esac
    echo "=== unit: $t"
    if "$t"; then pass=$((pass+1)); else fail=$((fail+1)); failed+=("$t"); fi
done
for t in "$BUILD"/fuzz_*; do
    [ -x "$t" ] || continue
    echo "=== fuzz: $t (1000 cases, ASan+UBSan)"
    if "$t" 1000; then pass=$((pass+1)); else fail=$((fail+1)); failed+=("$t"); fi
done
echo "=== pytest"
python3 -m pytest -q -p no:cacheprovider tests/ 2>&1 | tee "$BUILD/pytest.log"
prc=${PIPESTATUS[0]}
if [ "$prc" -ne 0 ] && [ "$prc" -ne 5 ]; then fail=$((fail+1)); failed+=("pytest"); else pass=$((pass+1)); fi
[ ${#failed[@]} -gt 0 ] && echo "failed: ${failed[*]}"
echo "suites: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
