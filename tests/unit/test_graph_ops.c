/* test_graph_ops.c: what ops.h promises for CUDA graph capture, checked on
 * the CPU: while ops_sel.capturing is set, the run helpers refuse a backend
 * whose graph_safe flag is 0 (ERR_UNSUPPORTED naming the family and the
 * backend, and the backend never runs) unless the family was chosen by
 * "auto" and a capture-safe backend takes the shape (then that one runs),
 * run one whose flag is 1, refuse nothing in the rehearsal (capturing = 2),
 * and behave as before once capturing is cleared; every CPU backend declares itself not
 * capture-safe (the CPU never captures). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ops/ops.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int g_runs;
static int counting_run(const moe_args *a, ls_stream s, ls_err *e) {
    g_runs++;
    return moe_cpu_ref.run(a, s, e);
}
static const moe_impl moe_unsafe = {"test_unsafe", DEV_CPU, 0, NULL, counting_run, 0};
static const moe_impl moe_safe = {"test_safe", DEV_CPU, 0, NULL, counting_run, 1};

enum { H = 8, E = 2, I = 8, M = 2 };

static void test_capture_refuses_backends_not_graph_safe(void **st) {
    (void)st;
    static float wr[E * H], wg[E][I * H], wu[E][I * H], wd[E][H * I], x[M * H], y[M * H];
    for (int i = 0; i < E * H; i++) wr[i] = sinf(i * 0.7f);
    for (int e = 0; e < E; e++)
        for (int i = 0; i < I * H; i++) wg[e][i] = wu[e][i] = wd[e][i] = 0.01f * (float)(i % 7);
    for (int i = 0; i < M * H; i++) x[i] = cosf(i * 0.3f);
    lin_w g[E], u[E], d[E];
    for (int e = 0; e < E; e++) {
        g[e] = (lin_w){.kind = W_F32, .N = I, .K = H, .data = wg[e]};
        u[e] = (lin_w){.kind = W_F32, .N = I, .K = H, .data = wu[e]};
        d[e] = (lin_w){.kind = W_F32, .N = H, .K = I, .data = wd[e]};
    }
    moe_w w = {.hidden = H, .n_experts = E, .top_k = 1, .inter = I, .norm_topk = 1,
               .router = {.kind = W_F32, .N = E, .K = H, .data = wr}, .gate = g, .up = u, .down = d};
    moe_args a = {.M = M, .x = x, .y = y, .w = &w, .dt = ACT_F32};
    dev_info cpu;
    ops_cpu_dev(&cpu);
    ops_sel s;
    ls_err e = {0};
    assert_int_equal(ops_select(&cpu, NULL, &s, &e), 0);
    s.moe = &moe_unsafe;
    s.capturing = 1;
    g_runs = 0;
    assert_int_equal(ops_moe_run(&s, &a, &e), ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "moe backend 'test_unsafe' is not capture-safe"));
    assert_int_equal(g_runs, 0);
    s.moe = &moe_safe;
    assert_int_equal(ops_moe_run(&s, &a, &e), 0);
    assert_int_equal(g_runs, 1);
    s.moe = &moe_unsafe;
    s.capturing = 2; /* the rehearsal before a capture: nothing refused */
    assert_int_equal(ops_moe_run(&s, &a, &e), 0);
    assert_int_equal(g_runs, 2);
    s.capturing = 0;
    assert_int_equal(ops_moe_run(&s, &a, &e), 0);
    assert_int_equal(g_runs, 3);
    /* a family chosen by auto trades the unsafe backend for a capture-safe one that takes the shape */
    assert_int_equal(ops_moe_register(&moe_safe), 0);
    s.capturing = 1;
    assert_true(s.auto_fam & 4);
    g_runs = 0;
    assert_int_equal(ops_moe_run(&s, &a, &e), 0);
    assert_int_equal(g_runs, 1);
    s.auto_fam &= ~4u; /* named: never replaced, refused */
    assert_int_equal(ops_moe_run(&s, &a, &e), ERR_UNSUPPORTED);
    assert_int_equal(g_runs, 1);
    s.capturing = 0;
    /* a linear through the CPU gemm while capturing: refused, naming it */
    float wl[4 * H], yl[M * 4];
    for (int i = 0; i < 4 * H; i++) wl[i] = 0.1f * i;
    lin_w lw = {.kind = W_F32, .N = 4, .K = H, .data = wl, .name = "test.proj"};
    s.capturing = 1;
    assert_int_equal(ops_linear(&s, M, x, &lw, yl, 0, &e), ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "not capture-safe"));
}

static void test_cpu_backends_are_not_graph_safe(void **st) {
    (void)st;
    int n = 0;
    for (int i = 0; i < ops_gemm_count(); i++)
        if (ops_gemm_at(i)->dev == DEV_CPU) { assert_int_equal(ops_gemm_at(i)->graph_safe, 0); n++; }
    for (int i = 0; i < ops_fp4_gemm_count(); i++)
        if (ops_fp4_gemm_at(i)->dev == DEV_CPU) assert_int_equal(ops_fp4_gemm_at(i)->graph_safe, 0);
    for (int i = 0; i < ops_moe_count(); i++) /* test_safe: registered by the test above */
        if (ops_moe_at(i)->dev == DEV_CPU && strcmp(ops_moe_at(i)->name, "test_safe"))
            assert_int_equal(ops_moe_at(i)->graph_safe, 0);
    for (int i = 0; i < ops_attn_count(); i++)
        if (ops_attn_at(i)->dev == DEV_CPU) assert_int_equal(ops_attn_at(i)->graph_safe, 0);
    for (int i = 0; i < ops_gdn_count(); i++)
        if (ops_gdn_at(i)->dev == DEV_CPU) assert_int_equal(ops_gdn_at(i)->graph_safe, 0);
    for (int i = 0; i < ops_small_count(); i++)
        if (ops_small_at(i)->dev == DEV_CPU) assert_int_equal(ops_small_at(i)->graph_safe, 0);
    assert_true(n >= 1);
#ifdef LS_HAVE_CUDA
    /* the CUDA flags this build relies on: the host round trip of the expert loop is not capturable */
    assert_int_equal(ops_moe_find("cuda_expert_loop")->graph_safe, 0);
    assert_int_equal(ops_moe_find("cuda_fused_decode")->graph_safe, 1);
    assert_int_equal(ops_moe_find("cuda_grouped_gemm")->graph_safe, 1);
    assert_int_equal(ops_attn_find("cuda_flash_prefill")->graph_safe, 1); /* plans from ctx_cap on the device */
    assert_int_equal(ops_gdn_find("cuda_chunked")->graph_safe, 1);
    assert_int_equal(ops_attn_find("cuda_flash_decode")->graph_safe, 1);
    assert_int_equal(ops_gdn_find("cuda_recurrent")->graph_safe, 1);
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capture_refuses_backends_not_graph_safe),
        cmocka_unit_test(test_cpu_backends_are_not_graph_safe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
