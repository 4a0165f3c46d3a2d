/* test_engine_kvpool.c: the page / slot free list: order, exhaustion, reuse,
 * counts, and that no index is ever handed out twice under random churn.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "engine/kvpool.h"
#include "engine/sampler.h"

static void test_fresh_pool_hands_out_lowest_first_then_empty(void **st) {
    (void)st;
    kvpool p;
    kvpool_init(&p, 4);
    for (int i = 0; i < 4; i++) assert_int_equal(kvpool_get(&p), i);
    assert_int_equal(kvpool_get(&p), -1);
    assert_int_equal(kvpool_avail(&p), 0);
    assert_int_equal(kvpool_used(&p), 4);
    kvpool_free(&p);
}

static void test_freed_index_is_reused_first(void **st) {
    (void)st;
    kvpool p;
    kvpool_init(&p, 8);
    for (int i = 0; i < 5; i++) kvpool_get(&p);
    kvpool_put(&p, 2);
    kvpool_put(&p, 0);
    assert_int_equal(kvpool_avail(&p), 5);
    assert_int_equal(kvpool_get(&p), 0);
    assert_int_equal(kvpool_get(&p), 2);
    assert_int_equal(kvpool_get(&p), 5);
    kvpool_free(&p);
}

static void test_random_churn_never_double_allocates(void **st) {
    (void)st;
    enum { N = 257 };
    kvpool p;
    kvpool_init(&p, N);
    int held[N], n_held = 0;
    uint8_t mine[N];
    memset(mine, 0, sizeof mine);
    smp_rng r;
    smp_rng_seed(&r, 3);
    for (int it = 0; it < 20000; it++) {
        if (smp_rng_uniform(&r) < 0.55) {
            int32_t i = kvpool_get(&p);
            if (n_held == N) { assert_int_equal(i, -1); continue; }
            assert_true(i >= 0 && i < N);
            assert_int_equal(mine[i], 0);
            mine[i] = 1;
            held[n_held++] = i;
        } else if (n_held) {
            int k = (int)(smp_rng_uniform(&r) * n_held);
            int32_t i = held[k];
            held[k] = held[--n_held];
            mine[i] = 0;
            kvpool_put(&p, i);
        }
        assert_int_equal(kvpool_used(&p), n_held);
        assert_int_equal(kvpool_avail(&p), N - n_held);
    }
    kvpool_free(&p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fresh_pool_hands_out_lowest_first_then_empty),
        cmocka_unit_test(test_freed_index_is_reused_first),
        cmocka_unit_test(test_random_churn_never_double_allocates),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
