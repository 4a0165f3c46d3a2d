/* test_ops_device.c: the device-facing parts of ops.h on the CPU: the per-call
 * backend fallback of families chosen by "auto" (a backend that refuses the
 * call's shape hands it to the next backend of the device that takes it; a
 * backend named explicitly is never replaced and its reason is reported),
 * the CPU device-memory table, and the logits row gather. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ops/ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A moe backend that takes at most two tokens and counts its runs. */
static int g_small_runs;
static int small_supported(const dev_info *d, const moe_shape *s, char *why, size_t n) {
    if (s->M > 2) {
        snprintf(why, n, "at most 2 tokens (M=%d)", s->M);
        return 0;
    }
    return 1;
}
static int small_run(const moe_args *a, ls_stream s, ls_err *e) {
    g_small_runs++;
    return moe_cpu_ref.run(a, s, e);
}
static const moe_impl moe_small_only = {"test_small_only", DEV_CPU, 0, small_supported, small_run};

enum { H = 16, E = 2, I = 16, M = 4 };

static void test_auto_falls_back_per_shape_named_does_not(void **st) {
    static float wr[E * H], wg[E][I * H], wu[E][I * H], wd[E][H * I], x[M * H], y[M * H], yref[M * H];
    for (int i = 0; i < E * H; i++) wr[i] = sinf(i * 0.7f);
    for (int e = 0; e < E; e++)
        for (int i = 0; i < I * H; i++) {
            wg[e][i] = 0.1f * cosf(i * 0.3f + e);
            wu[e][i] = 0.1f * sinf(i * 0.2f - e);
            wd[e][i] = 0.1f * cosf(i * 0.5f + 2 * e);
        }
    for (int i = 0; i < M * H; i++) x[i] = sinf(i * 1.3f);
    lin_w g[E], u[E], d[E];
    for (int e = 0; e < E; e++) {
        g[e] = (lin_w){.kind = W_F32, .N = I, .K = H, .data = wg[e]};
        u[e] = (lin_w){.kind = W_F32, .N = I, .K = H, .data = wu[e]};
        d[e] = (lin_w){.kind = W_F32, .N = H, .K = I, .data = wd[e]};
    }
    moe_w w = {.hidden = H, .n_experts = E, .top_k = 1, .inter = I, .norm_topk = 1,
               .router = {.kind = W_F32, .N = E, .K = H, .data = wr}, .gate = g, .up = u, .down = d};
    ops_sel s;
    dev_info cpu;
    ops_cpu_dev(&cpu);
    ls_err e = {0};
    assert_int_equal(ops_select(&cpu, NULL, &s, &e), 0);
    assert_true(s.auto_fam & 4);
    s.moe = &moe_small_only; /* as if "auto" had picked it */
    moe_args a = {.M = 1, .x = x, .y = y, .w = &w, .dt = ACT_F32};
    assert_int_equal(ops_moe_run(&s, &a, &e), 0);
    assert_int_equal(g_small_runs, 1);
    a.M = M; /* refused by test_small_only: the next CPU backend runs it */
    assert_int_equal(ops_moe_run(&s, &a, &e), 0);
    assert_int_equal(g_small_runs, 1);
    moe_args r = a;
    r.y = yref;
    assert_int_equal(moe_cpu_ref.run(&r, NULL, &e), 0);
    for (int i = 0; i < M * H; i++) assert_true(fabsf(y[i] - yref[i]) <= 1e-5f * (1 + fabsf(yref[i])));
    s.auto_fam = 0; /* named explicitly: refused with its reason */
    assert_int_equal(ops_moe_run(&s, &a, &e), ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "test_small_only"));
    assert_non_null(strstr(e.msg, "at most 2 tokens (M=4)"));
    assert_int_equal(g_small_runs, 1);
}

static void test_cpu_memory_table_and_gather(void **st) {
    const dev_mem *m = ops_dev_mem(DEV_CPU);
    assert_non_null(m);
    assert_ptr_equal(m, &dev_mem_cpu);
    ls_err e = {0};
    float *p = m->alloc(8 * sizeof(float), &e);
    assert_non_null(p);
    const float src[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    assert_int_equal(m->h2d(p, src, sizeof src, NULL, &e), 0);
    float back[8] = {0};
    assert_int_equal(m->d2h(back, p, sizeof back, NULL, &e), 0);
    assert_memory_equal(back, src, sizeof src);
    assert_int_equal(m->memset0(p, 4 * sizeof(float), NULL, &e), 0);
    assert_true(p[0] == 0 && p[3] == 0 && p[4] == 5);
    assert_int_equal(m->sync(NULL, &e), 0);
    assert_int_equal(m->bind_thread(0, &e), 0);
    /* rows 3, 0, 3 of a [4, 2] matrix */
    const int32_t idx[3] = {3, 0, 3};
    float y[6];
    assert_int_equal(small_cpu_ref.gather_rows(3, 2, idx, src, y, ACT_F32, NULL), 0);
    const float want[6] = {7, 8, 1, 2, 7, 8};
    assert_memory_equal(y, want, sizeof want);
    m->free(p);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_auto_falls_back_per_shape_named_does_not),
        cmocka_unit_test(test_cpu_memory_table_and_gather),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
