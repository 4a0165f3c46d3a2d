/* test_engine_stats.c: latency histograms: Prometheus "le" placement (a
 * value equal to a bound counts in that bucket), the overflow bucket, sums,
 * and bounds that increase like SGLang's defaults.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>

#include "engine/stats.h"

static void test_values_land_in_le_buckets_and_overflow(void **st) {
    (void)st;
    ls_hist h;
    stats_hist_init(&h, STATS_TTFT);
    stats_observe(&h, 0.0);                 /* <= first bound */
    stats_observe(&h, h.bounds[0]);         /* equal: same bucket (le) */
    stats_observe(&h, h.bounds[3] + 1e-9);  /* just above bound 3: bucket 4 */
    stats_observe(&h, 1e9);                 /* above the last bound: +Inf */
    assert_int_equal((int)h.counts[0], 2);
    assert_int_equal((int)h.counts[4], 1);
    assert_int_equal((int)h.counts[LS_HIST_BUCKETS], 1);
    assert_int_equal((int)h.n, 4);
    assert_true(fabs(h.sum - (h.bounds[0] + h.bounds[3] + 1e-9 + 1e9)) < 1e-3);
}

static void test_bounds_increase_for_every_kind(void **st) {
    (void)st;
    int kinds[] = {STATS_TTFT, STATS_ITL, STATS_E2E};
    for (int k = 0; k < 3; k++) {
        ls_hist h;
        stats_hist_init(&h, kinds[k]);
        assert_int_equal((int)h.n, 0);
        for (int i = 1; i < LS_HIST_BUCKETS; i++) assert_true(h.bounds[i] > h.bounds[i - 1]);
        assert_true(h.bounds[0] > 0);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_values_land_in_le_buckets_and_overflow),
        cmocka_unit_test(test_bounds_increase_for_every_kind),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
