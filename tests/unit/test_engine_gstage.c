/* test_engine_gstage.c: how the engine stages a constrained row for the device sampler
 * (engine_grammar.c eg_stage_row, eg_bias_has_dup, eg_dev_ok; S9). The table is read back the
 * way the CUDA sampler reads it (ops.h smp_row.n_mask / n_bias: mask words at mask_off, bias ids
 * at bias_off, their float bits right after), so a layout drift between the two shows here on a
 * CPU-only machine; the kernels themselves are pinned against the host sampler by
 * test_sample_cuda and end to end by tests/test_gpu_grammar.py.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "engine/engine_grammar.h"

enum { VOC = 1000, WORDS = (VOC + 31) / 32 };

static float bias_at(const int32_t *toks, const smp_row *p, int j) {
    float f;
    memcpy(&f, &toks[p->bias_off + p->n_bias + j], sizeof f);
    return f;
}

static void test_stage_row_appends_the_mask_then_the_bias_ids_and_their_bits(void **st) {
    (void)st;
    ls_engine e;
    memset(&e, 0, sizeof e);
    e.vocab = VOC;
    uint32_t allow[WORDS];
    for (int w = 0; w < WORDS; w++) allow[w] = 0x9e3779b9u * (uint32_t)(w + 1);
    const int32_t ids[] = {3, 999, 500};
    const float bias[] = {-100.f, 2.5f, 0.125f};
    smp_edit ed = {.allow = allow, .bias_ids = ids, .bias = bias, .n_bias = 3};
    smp_row p;
    memset(&p, 0, sizeof p);
    /* after 7 entries of other lists: the table grows from nothing */
    e.cap_stoks = 7;
    e.stoks = calloc(7, sizeof *e.stoks);
    int n = eg_stage_row(&e, &ed, &p, 7);
    assert_int_equal(n, 7 + WORDS + 6);
    assert_true(e.cap_stoks >= n);
    assert_int_equal(p.mask_off, 7);
    assert_int_equal(p.n_mask, WORDS);
    assert_memory_equal(e.stoks + p.mask_off, allow, sizeof allow);
    assert_int_equal(p.bias_off, 7 + WORDS);
    assert_int_equal(p.n_bias, 3);
    for (int j = 0; j < 3; j++) {
        assert_int_equal(e.stoks[p.bias_off + j], ids[j]);
        assert_true(bias_at(e.stoks, &p, j) == bias[j]);
    }
    /* a second row after it: its own offsets, the first row's entries untouched */
    smp_row q;
    memset(&q, 0, sizeof q);
    smp_edit only_bias = {.bias_ids = ids, .bias = bias, .n_bias = 1};
    int n2 = eg_stage_row(&e, &only_bias, &q, n);
    assert_int_equal(n2, n + 2);
    assert_int_equal(q.n_mask, 0);
    assert_int_equal(q.bias_off, n);
    assert_int_equal(e.stoks[q.bias_off], 3);
    assert_true(bias_at(e.stoks, &q, 0) == -100.f);
    assert_memory_equal(e.stoks + p.mask_off, allow, sizeof allow);
    /* a gated grammar step with no bias: nothing staged */
    smp_row z;
    memset(&z, 0, sizeof z);
    smp_edit none = {0};
    assert_int_equal(eg_stage_row(&e, &none, &z, n2), n2);
    assert_int_equal(z.n_mask, 0);
    assert_int_equal(z.n_bias, 0);
    free(e.stoks);
}

static void test_repeated_bias_ids_are_found(void **st) {
    (void)st;
    const int32_t a[] = {5, 1, 9, 7}, b[] = {5, 1, 9, 1}, c[] = {42};
    assert_int_equal(eg_bias_has_dup(a, 4), 0);
    assert_int_equal(eg_bias_has_dup(b, 4), 1);
    assert_int_equal(eg_bias_has_dup(c, 1), 0);
    assert_int_equal(eg_bias_has_dup(NULL, 0), 0);
}

/* The host adds a repeated id's biases one after another; the device adds a list of distinct
 * ids in parallel: such a request stays on the host. */
static void test_a_request_with_repeated_bias_ids_stays_on_the_host(void **st) {
    (void)st;
    ls_engine e;
    memset(&e, 0, sizeof e);
    e.vocab = VOC;
    ereq r;
    memset(&r, 0, sizeof r);
    r.n_lb = 2;
    assert_int_equal(eg_dev_ok(&e, &r), 1);
    r.lb_dup = 1;
    assert_int_equal(eg_dev_ok(&e, &r), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stage_row_appends_the_mask_then_the_bias_ids_and_their_bits),
        cmocka_unit_test(test_repeated_bias_ids_are_found),
        cmocka_unit_test(test_a_request_with_repeated_bias_ids_stays_on_the_host),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
