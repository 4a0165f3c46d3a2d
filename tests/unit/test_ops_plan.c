/* test_ops_plan.c: per-M backend plans (ops.h "per-M plans", src/doctor/select.c
 * doctor_plan), checked on the CPU device.
 *
 * Pinned behaviour:
 * - the text form NAME[:MAXM],...,NAME parses into increasing bounds with an unbounded
 *   last entry and formats back to the same text; every malformed form (empty entry,
 *   bad bound, unordered bounds, bound on the last entry, missing bound, unknown backend,
 *   "auto" inside a plan, too many entries) is ERR_INVAL naming the fault;
 * - dispatch really switches backend by M: with the test-only broken backends
 *   (LASTSTAND_TEST_BROKEN_BACKENDS=1), "cpu_grouped:4,cpu_broken_nan" gives the
 *   reference's output at M <= 4 and NaN above (and the reverse plan the reverse);
 * - attention and gdn dispatch on the step's total new tokens (n_tok), not per sequence;
 * - a named plan whose entry does not take the shape is ERR_UNSUPPORTED with the reason;
 *   an auto plan falls back to another entry of the plan, then to the registry, never to
 *   a banned backend;
 * - while capturing, an auto plan's entry that is not graph_safe is traded for a graph_safe
 *   entry of the plan, never for a banned one (then the capture refuses);
 * - the load-time check (ops_sel_check_*): a named plan is refused when one entry does not
 *   take the shape at either end of its M range (the last entry up to OPS_CHECK_MAX_M),
 *   with the family, the backend, its range, M and the reason; a family left at auto passes;
 * - ops_sel_ban rejects malformed lists;
 * - doctor_plan turns a report's per-bucket times into the plan (fastest ok backend per
 *   bucket among the allowed, runs merged, last unbounded), skipping buckets where a
 *   backend is unsupported, and fails when a bucket has no correct backend. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "doctor/select.h"
#include "ops/ops.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the parser ------------------------------------------------------------------ */

static void test_plan_text_parses_and_formats_back(void **st) {
    (void)st;
    dev_info cpu;
    ops_cpu_dev(&cpu);
    ops_plan p;
    ls_err e = {0};
    assert_int_equal(ops_plan_parse(OPS_FAM_MOE, &cpu, "cpu_grouped:4,cpu_ref:64,cpu_grouped", &p, &e), 0);
    assert_int_equal(p.n, 3);
    assert_ptr_equal(p.impl[0], ops_moe_find("cpu_grouped"));
    assert_ptr_equal(p.impl[1], &moe_cpu_ref);
    assert_int_equal(p.max_m[0], 4);
    assert_int_equal(p.max_m[1], 64);
    assert_int_equal(p.max_m[2], INT_MAX);
    char t[256];
    ops_plan_format(&p, t, sizeof t);
    assert_string_equal(t, "cpu_grouped:4,cpu_ref:64,cpu_grouped");
    /* the entry per M: (0,4], (4,64], (64,inf) */
    assert_ptr_equal(ops_plan_at(&p, 1), p.impl[0]);
    assert_ptr_equal(ops_plan_at(&p, 4), p.impl[0]);
    assert_ptr_equal(ops_plan_at(&p, 5), p.impl[1]);
    assert_ptr_equal(ops_plan_at(&p, 64), p.impl[1]);
    assert_ptr_equal(ops_plan_at(&p, 65), p.impl[2]);
    assert_ptr_equal(ops_plan_at(&p, 1 << 20), p.impl[2]);
    /* one bare name: one entry; spaces around entries are allowed */
    assert_int_equal(ops_plan_parse(OPS_FAM_GDN, &cpu, "cpu_ref", &p, &e), 0);
    assert_int_equal(p.n, 1);
    assert_int_equal(ops_plan_parse(OPS_FAM_GDN, &cpu, "cpu_ref:8, cpu_chunked", &p, &e), 0);
    ops_plan_format(&p, t, sizeof t);
    assert_string_equal(t, "cpu_ref:8,cpu_chunked");
    /* NULL device: a backend of any device */
    assert_int_equal(ops_plan_parse(OPS_FAM_ATTN, NULL, "cpu_ref:1,cpu_ref", &p, &e), 0);
    assert_int_equal(ops_family_index("attention"), OPS_FAM_ATTN);
    assert_string_equal(ops_family_name(OPS_FAM_FP4_GEMM), "fp4_gemm");
    assert_int_equal(ops_family_index("nope"), -1);
}

static void expect_bad(const char *text, const char *needle) {
    dev_info cpu;
    ops_cpu_dev(&cpu);
    ops_plan p;
    ls_err e = {0};
    assert_int_equal(ops_plan_parse(OPS_FAM_MOE, &cpu, text, &p, &e), ERR_INVAL);
    if (!strstr(e.msg, needle)) fail_msg("'%s': message '%s' lacks '%s'", text, e.msg, needle);
}

static void test_malformed_plans_are_refused_with_the_fault(void **st) {
    (void)st;
    expect_bad("", "moe backend: empty");
    expect_bad("cpu_grouped:4,,cpu_ref", "entry 2 is empty");
    expect_bad("cpu_grouped:4,cpu_ref,", "entry 3 is empty");
    expect_bad(",cpu_ref", "entry 1 is empty");
    expect_bad("cpu_grouped:x,cpu_ref", "the bound 'x' is not an integer");
    expect_bad("cpu_grouped:0,cpu_ref", "the bound '0' is not an integer");
    expect_bad("cpu_grouped:-3,cpu_ref", "the bound '-3' is not an integer");
    expect_bad("cpu_grouped:8x,cpu_ref", "the bound '8x' is not an integer");
    expect_bad("cpu_grouped:,cpu_ref", "the bound '' is not an integer");
    expect_bad("cpu_grouped:8,cpu_ref:8,cpu_grouped", "bounds must increase, but 'cpu_ref:8' follows a bound of 8");
    expect_bad("cpu_grouped:64,cpu_ref:8,cpu_grouped", "bounds must increase");
    expect_bad("cpu_grouped:8", "the last entry 'cpu_grouped:8' must have no bound");
    expect_bad("cpu_grouped:8,cpu_ref:16", "the last entry 'cpu_ref:16' must have no bound");
    expect_bad("cpu_grouped,cpu_ref", "entry 'cpu_grouped' needs a bound");
    expect_bad("nope:4,cpu_ref", "unknown moe backend 'nope' for device cpu (valid: cpu_grouped");
    expect_bad("nope", "unknown moe backend 'nope' for device cpu (valid: auto, cpu_grouped");
    expect_bad("auto:4,cpu_ref", "'auto' cannot be an entry of a plan");
    expect_bad(":4,cpu_ref", "entry 1 has no backend name");
    expect_bad("cpu_ref:1,cpu_ref:2,cpu_ref:3,cpu_ref:4,cpu_ref:5,cpu_ref:6,cpu_ref:7,cpu_ref:8,cpu_ref",
               "more than 8 entries");
    /* a backend of another device */
#ifdef LS_HAVE_CUDA
    expect_bad("cuda_fused_decode:8,cpu_ref", "unknown moe backend 'cuda_fused_decode' for device cpu");
#endif
    /* through ops_select: the same message, the selection refused */
    dev_info cpu;
    ops_cpu_dev(&cpu);
    ops_names n = {.gdn = "cpu_ref:8"};
    ops_sel s;
    ls_err e = {0};
    assert_int_equal(ops_select(&cpu, &n, &s, &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "gdn backend plan 'cpu_ref:8': the last entry"));
}

/* ---- dispatch with the broken backends ---------------------------------------------- */

enum { H = 8, E = 4, I = 8, MMAX = 8 };
static float g_wr[E * H], g_wg[E][I * H], g_wu[E][I * H], g_wd[E][H * I], g_x[MMAX * H];
static lin_w g_g[E], g_u[E], g_d[E];
static moe_w g_w;

static void moe_setup(void) {
    for (int i = 0; i < E * H; i++) g_wr[i] = sinf(i * 0.7f);
    for (int e = 0; e < E; e++) {
        for (int i = 0; i < I * H; i++) {
            g_wg[e][i] = 0.1f * sinf(i * 0.3f + e);
            g_wu[e][i] = 0.1f * cosf(i * 0.2f + e);
            g_wd[e][i] = 0.1f * sinf(i * 0.5f - e);
        }
        g_g[e] = (lin_w){.kind = W_F32, .N = I, .K = H, .data = g_wg[e]};
        g_u[e] = (lin_w){.kind = W_F32, .N = I, .K = H, .data = g_wu[e]};
        g_d[e] = (lin_w){.kind = W_F32, .N = H, .K = I, .data = g_wd[e]};
    }
    for (int i = 0; i < MMAX * H; i++) g_x[i] = cosf(i * 0.37f);
    g_w = (moe_w){.hidden = H, .n_experts = E, .top_k = 2, .inter = I, .norm_topk = 1,
                  .router = {.kind = W_F32, .N = E, .K = H, .data = g_wr}, .gate = g_g, .up = g_u, .down = g_d};
}

/* Run moe at M tokens through s; returns the count of non-finite outputs (-1: error). */
static int moe_nonfinite(const ops_sel *s, int M, float *y) {
    moe_args a = {.M = M, .x = g_x, .y = y, .w = &g_w, .dt = ACT_F32};
    ls_err e = {0};
    if (ops_moe_run(s, &a, &e)) return -1;
    int bad = 0;
    for (int i = 0; i < M * H; i++) bad += !isfinite(y[i]);
    return bad;
}

static void test_dispatch_switches_backend_by_M(void **st) {
    (void)st;
    moe_setup();
    dev_info cpu;
    ops_cpu_dev(&cpu);
    assert_non_null(ops_moe_find("cpu_broken_nan")); /* LASTSTAND_TEST_BROKEN_BACKENDS=1 (main) */
    ops_names n = {.moe = "cpu_grouped:4,cpu_broken_nan"};
    ops_sel s;
    ls_err e = {0};
    assert_int_equal(ops_select(&cpu, &n, &s, &e), 0);
    assert_int_equal(s.plan[OPS_FAM_MOE].n, 2);
    assert_ptr_equal(s.moe, ops_moe_find("cpu_grouped")); /* the family's pointer: the first entry */
    assert_ptr_equal(ops_sel_for_m(&s, OPS_FAM_MOE, 4), ops_moe_find("cpu_grouped"));
    assert_ptr_equal(ops_sel_for_m(&s, OPS_FAM_MOE, 5), ops_moe_find("cpu_broken_nan"));
    float y[MMAX * H], yref[MMAX * H];
    ops_sel ref;
    assert_int_equal(ops_select(&cpu, &(ops_names){.moe = "cpu_ref"}, &ref, &e), 0);
    for (int M = 1; M <= MMAX; M++) {
        assert_int_equal(moe_nonfinite(&ref, M, yref), 0);
        int bad = moe_nonfinite(&s, M, y);
        if (M <= 4) {
            assert_int_equal(bad, 0);
            for (int i = 0; i < M * H; i++) assert_float_equal(y[i], yref[i], 1e-5);
        } else {
            assert_int_equal(bad, M * H); /* the broken backend ran: every output NaN */
        }
    }
    /* the reverse plan: broken at small M only */
    n.moe = "cpu_broken_nan:2,cpu_grouped";
    assert_int_equal(ops_select(&cpu, &n, &s, &e), 0);
    assert_int_equal(moe_nonfinite(&s, 1, y), H);
    assert_int_equal(moe_nonfinite(&s, 2, y), 2 * H);
    assert_int_equal(moe_nonfinite(&s, 3, y), 0);
    /* a single name is no plan: one backend at every M, as before */
    n.moe = "cpu_grouped";
    assert_int_equal(ops_select(&cpu, &n, &s, &e), 0);
    assert_int_equal(s.plan[OPS_FAM_MOE].n, 0);
    assert_int_equal(moe_nonfinite(&s, 8, y), 0);
}

/* Counting backends: they record that they ran and touch nothing. */
static int g_a, g_b, g_safe, g_unsafe;
static int run_attn_a(const attn_args *a, ls_stream s, ls_err *e) { g_a++; return 0; }
static int run_attn_b(const attn_args *a, ls_stream s, ls_err *e) { g_b++; return 0; }
static int run_gdn_a(const gdn_args *a, ls_stream s, ls_err *e) { g_a++; return 0; }
static int run_gdn_b(const gdn_args *a, ls_stream s, ls_err *e) { g_b++; return 0; }
static int run_moe_safe(const moe_args *a, ls_stream s, ls_err *e) { g_safe++; return 0; }
static int run_moe_unsafe(const moe_args *a, ls_stream s, ls_err *e) { g_unsafe++; return 0; }
static int small_only(const dev_info *d, const moe_shape *s, char *why, size_t n) {
    if (s->M <= 2) return 1;
    snprintf(why, n, "takes M <= 2 (M=%d)", s->M);
    return 0;
}
static const attn_impl attn_a = {"tcount_a", DEV_CPU, 0, NULL, run_attn_a, 0};
static const attn_impl attn_b = {"tcount_b", DEV_CPU, 0, NULL, run_attn_b, 0};
static const gdn_impl gdn_a = {"tcount_a", DEV_CPU, 0, NULL, run_gdn_a, 0};
static const gdn_impl gdn_b = {"tcount_b", DEV_CPU, 0, NULL, run_gdn_b, 0};
static const moe_impl moe_small = {"tsmall", DEV_CPU, 0, small_only, run_moe_unsafe, 0};
static const moe_impl moe_safe = {"tsafe", DEV_CPU, 0, NULL, run_moe_safe, 1};
static const moe_impl moe_unsafe = {"tunsafe", DEV_CPU, 0, NULL, run_moe_unsafe, 0};

static void register_counters(void) {
    static int done;
    if (done) return;
    done = 1;
    assert_int_equal(ops_attn_register(&attn_a), 0);
    assert_int_equal(ops_attn_register(&attn_b), 0);
    assert_int_equal(ops_gdn_register(&gdn_a), 0);
    assert_int_equal(ops_gdn_register(&gdn_b), 0);
    assert_int_equal(ops_moe_register(&moe_small), 0);
    assert_int_equal(ops_moe_register(&moe_safe), 0);
    assert_int_equal(ops_moe_register(&moe_unsafe), 0);
}

static void test_attention_and_gdn_dispatch_on_the_steps_total_tokens(void **st) {
    (void)st;
    register_counters();
    dev_info cpu;
    ops_cpu_dev(&cpu);
    ops_names n = {.attention = "tcount_a:4,tcount_b", .gdn = "tcount_a:4,tcount_b"};
    ops_sel s;
    ls_err e = {0};
    assert_int_equal(ops_select(&cpu, &n, &s, &e), 0);
    /* 3 decode rows (3 tokens) -> a; 3 decode rows + one 3-token prefill chunk (6 tokens) -> b,
     * although every sequence alone has <= 4 new tokens */
    attn_seq seqs[4] = {{.n_new = 1, .row0 = 0}, {.n_new = 1, .row0 = 1}, {.n_new = 1, .row0 = 2}, {.n_new = 3, .row0 = 3}};
    attn_args aa = {.n_seq = 3, .seqs = seqs, .seqs_host = seqs, .n_tok = 3, .n_heads = 2, .n_kv_heads = 1,
                    .head_dim = 8, .dt = ACT_F32};
    g_a = g_b = 0;
    assert_int_equal(ops_attn_run(&s, &aa, 8, &e), 0);
    assert_int_equal(g_a, 1);
    aa.n_seq = 4;
    aa.n_tok = 6;
    assert_int_equal(ops_attn_run(&s, &aa, 8, &e), 0);
    assert_int_equal(g_b, 1);
    gdn_w gw = {.nk = 1, .nv = 1, .dk = 4, .dv = 4, .conv_k = 4};
    gdn_seq gs[4] = {{.slot = 0, .n_new = 1}, {.slot = 1, .n_new = 1}, {.slot = 2, .n_new = 1}, {.slot = 3, .n_new = 3}};
    gdn_args ga = {.n_seq = 3, .seqs = gs, .seqs_host = gs, .n_tok = 3, .w = &gw, .dt = ACT_F32};
    g_a = g_b = 0;
    assert_int_equal(ops_gdn_run(&s, &ga, &e), 0);
    assert_int_equal(g_a, 1);
    ga.n_seq = 4;
    ga.n_tok = 6;
    assert_int_equal(ops_gdn_run(&s, &ga, &e), 0);
    assert_int_equal(g_b, 1);
    assert_int_equal(g_a, 1);
}

static void test_named_plan_refuses_auto_plan_falls_back_never_to_a_banned_backend(void **st) {
    (void)st;
    register_counters();
    moe_setup();
    dev_info cpu;
    ops_cpu_dev(&cpu);
    ops_names n = {.moe = "tsmall:8,tsafe"};
    ops_sel s;
    ls_err e = {0};
    assert_int_equal(ops_select(&cpu, &n, &s, &e), 0);
    float y[MMAX * H];
    moe_args a = {.M = 2, .x = g_x, .y = y, .w = &g_w, .dt = ACT_F32};
    g_unsafe = g_safe = 0;
    assert_int_equal(ops_moe_run(&s, &a, &e), 0); /* M=2: tsmall takes it */
    assert_int_equal(g_unsafe, 1);
    a.M = 4; /* M=4: the plan says tsmall, which does not take it */
    assert_int_equal(ops_moe_run(&s, &a, &e), ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "moe backend 'tsmall' does not take this shape: takes M <= 2 (M=4)"));
    assert_int_equal(g_unsafe + g_safe, 1);
    /* the same plan chosen by auto: another entry of the plan takes it */
    s.auto_fam |= 1u << OPS_FAM_MOE;
    assert_int_equal(ops_moe_run(&s, &a, &e), 0);
    assert_int_equal(g_safe, 1);
    /* ...unless banned: then the registry's first non-test-only backend that takes it */
    assert_int_equal(ops_sel_ban(&s, "moe:tsafe", &e), 0);
    assert_true(ops_sel_is_banned(&s, OPS_FAM_MOE, &moe_safe));
    assert_int_equal(ops_moe_run(&s, &a, &e), 0);
    assert_int_equal(g_safe, 1);
    assert_int_equal(g_unsafe, 1); /* cpu_grouped ran (first in the registry), not tsafe */
    /* an unbanned registry fallback never includes a banned one: ban every real one, the
     * fallback finds nothing and the call is refused with the plan entry's reason */
    assert_int_equal(ops_sel_ban(&s, "moe:cpu_grouped,moe:tunsafe,moe:cpu_ref", &e), 0);
    assert_int_equal(ops_moe_run(&s, &a, &e), ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "'tsmall' does not take this shape"));
}

static void test_named_plan_checked_at_load_over_its_M_range(void **st) {
    (void)st;
    register_counters();
    moe_setup();
    dev_info cpu;
    ops_cpu_dev(&cpu);
    ops_sel s;
    ls_err e = {0};
    /* tsmall takes M <= 2: as the entry for M 1..2 it passes, for 1..8 it does not */
    assert_int_equal(ops_select(&cpu, &(ops_names){.moe = "tsmall:2,tsafe"}, &s, &e), 0);
    assert_int_equal(ops_sel_check_moe(&s, &g_w, &e), 0);
    assert_int_equal(ops_select(&cpu, &(ops_names){.moe = "tsmall:8,tsafe"}, &s, &e), 0);
    assert_int_equal(ops_sel_check_moe(&s, &g_w, &e), ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "moe backend 'tsmall' (its entry for M 1..8) does not take this model's moe shape"));
    assert_non_null(strstr(e.msg, "at M = 8: takes M <= 2 (M=8)"));
    /* as the last entry: checked at its first M and at OPS_CHECK_MAX_M */
    assert_int_equal(ops_select(&cpu, &(ops_names){.moe = "tsafe:1,tsmall"}, &s, &e), 0);
    assert_int_equal(ops_sel_check_moe(&s, &g_w, &e), ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "(its entry for M >= 2)"));
    assert_non_null(strstr(e.msg, "at M = 8192"));
    /* one name alone is checked over every M */
    assert_int_equal(ops_select(&cpu, &(ops_names){.moe = "tsmall"}, &s, &e), 0);
    assert_int_equal(ops_sel_check_moe(&s, &g_w, &e), ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "moe backend 'tsmall' does not take"));
    /* the same plan chosen by auto passes (it falls back per call) */
    s.auto_fam |= 1u << OPS_FAM_MOE;
    assert_int_equal(ops_sel_check_moe(&s, &g_w, &e), 0);
    /* the other families: the CPU backends take every shape */
    assert_int_equal(ops_select(&cpu, &(ops_names){.attention = "cpu_ref", .gdn = "cpu_ref"}, &s, &e), 0);
    attn_shape as = {.n_heads = 2, .n_kv_heads = 1, .head_dim = 8, .dt = ACT_F32};
    gdn_shape gs = {.nk = 1, .nv = 1, .dk = 4, .dv = 4, .conv_k = 4, .dt = ACT_F32};
    assert_int_equal(ops_sel_check_attn(&s, &as, &e), 0);
    assert_int_equal(ops_sel_check_gdn(&s, &gs, &e), 0);
}

static void test_capture_takes_a_graph_safe_plan_entry_never_a_banned_one(void **st) {
    (void)st;
    register_counters();
    moe_setup();
    dev_info cpu;
    ops_cpu_dev(&cpu);
    ops_names n = {.moe = "tunsafe:4,tsafe"};
    ops_sel s;
    ls_err e = {0};
    assert_int_equal(ops_select(&cpu, &n, &s, &e), 0);
    float y[MMAX * H];
    moe_args a = {.M = 2, .x = g_x, .y = y, .w = &g_w, .dt = ACT_F32};
    s.capturing = 1;
    g_unsafe = g_safe = 0;
    /* named: the entry for M=2 is not capture-safe: refused */
    assert_int_equal(ops_moe_run(&s, &a, &e), ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "moe backend 'tunsafe' is not capture-safe"));
    /* auto: the plan's capture-safe entry instead */
    s.auto_fam |= 1u << OPS_FAM_MOE;
    assert_int_equal(ops_moe_run(&s, &a, &e), 0);
    assert_int_equal(g_safe, 1);
    assert_int_equal(g_unsafe, 0);
    /* the entry for M=8 is capture-safe itself */
    a.M = 8;
    assert_int_equal(ops_moe_run(&s, &a, &e), 0);
    assert_int_equal(g_safe, 2);
    /* a banned backend is never the capture substitute: the capture is refused instead */
    a.M = 2;
    assert_int_equal(ops_sel_ban(&s, "moe:tsafe", &e), 0);
    assert_int_equal(ops_moe_run(&s, &a, &e), ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "not capture-safe"));
    assert_int_equal(g_safe, 2);
    /* without a plan the same: a family at auto whose only graph_safe backend is banned */
    assert_int_equal(ops_select(&cpu, &(ops_names){.moe = "tunsafe"}, &s, &e), 0);
    s.auto_fam |= 1u << OPS_FAM_MOE;
    s.capturing = 1;
    assert_int_equal(ops_moe_run(&s, &a, &e), 0); /* tsafe substitutes */
    assert_int_equal(g_safe, 3);
    assert_int_equal(ops_sel_ban(&s, "moe:tsafe", &e), 0);
    assert_int_equal(ops_moe_run(&s, &a, &e), ERR_UNSUPPORTED);
    assert_int_equal(g_safe, 3);
}

static void test_ban_list_errors(void **st) {
    (void)st;
    dev_info cpu;
    ops_cpu_dev(&cpu);
    ops_sel s;
    ls_err e = {0};
    assert_int_equal(ops_select(&cpu, NULL, &s, &e), 0);
    assert_int_equal(ops_sel_ban(&s, NULL, &e), 0);
    assert_int_equal(ops_sel_ban(&s, "", &e), 0);
    assert_int_equal(ops_sel_ban(&s, "moe", &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "'moe' is not FAMILY:NAME"));
    assert_int_equal(ops_sel_ban(&s, "mlp:cpu_ref", &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "'mlp:cpu_ref' is not FAMILY:NAME"));
    assert_int_equal(ops_sel_ban(&s, "moe:nope", &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "no moe backend 'nope'"));
    assert_int_equal(ops_sel_ban(&s, "moe:cpu_ref,,gdn:cpu_ref", &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "an empty item"));
    assert_int_equal(ops_sel_ban(&s, "moe:cpu_ref,gdn:cpu_ref,moe:cpu_ref", &e), 0);
    assert_int_equal(s.n_ban[OPS_FAM_MOE], 1); /* once */
    assert_int_equal(s.n_ban[OPS_FAM_GDN], 1);
}

/* ---- the doctor's plan -------------------------------------------------------------- */

/* gdn at buckets 1, 8, 64, 512 over two shapes: rec fastest at 1 and 8, chunk above;
 * dec takes M <= 8 only (unsupported above) and is fastest at 8 on the sum of shapes;
 * bad is wrong at 512 (callers exclude it); slow is ok everywhere. */
static const char *PLAN_REPORT =
    "{\"tables\": ["
    " {\"family\": \"gdn\", \"backends\": [\"slow\", \"rec\", \"chunk\", \"dec\", \"bad\"], \"test_only\": [],"
    "  \"cells\": {"
    "   \"slow\":  {\"1\": {\"status\": \"ok\", \"ms\": 9}, \"8\": {\"status\": \"ok\", \"ms\": 9},"
    "              \"64\": {\"status\": \"ok\", \"ms\": 9}, \"512\": {\"status\": \"ok\", \"ms\": 90}},"
    "   \"rec\":   {\"1\": {\"status\": \"ok\", \"ms\": 1}, \"8\": {\"status\": \"ok\", \"ms\": 2},"
    "              \"64\": {\"status\": \"ok\", \"ms\": 8}, \"512\": {\"status\": \"ok\", \"ms\": 60}},"
    "   \"chunk\": {\"1\": {\"status\": \"ok\", \"ms\": 2}, \"8\": {\"status\": \"ok\", \"ms\": 3},"
    "              \"64\": {\"status\": \"ok\", \"ms\": 4}, \"512\": {\"status\": \"ok\", \"ms\": 10}},"
    "   \"dec\":   {\"1\": {\"status\": \"ok\", \"ms\": 1.5}, \"8\": {\"status\": \"ok\", \"ms\": 0.5},"
    "              \"64\": {\"status\": \"unsupported\"}, \"512\": {\"status\": \"unsupported\"}},"
    "   \"bad\":   {\"1\": {\"status\": \"ok\", \"ms\": 0.1}, \"8\": {\"status\": \"ok\", \"ms\": 0.1},"
    "              \"64\": {\"status\": \"ok\", \"ms\": 0.1}, \"512\": {\"status\": \"wrong\"}}}},"
    " {\"family\": \"gdn\", \"backends\": [\"slow\", \"rec\", \"chunk\", \"dec\", \"bad\"], \"test_only\": [],"
    "  \"cells\": {"
    "   \"slow\":  {\"1\": {\"status\": \"ok\", \"ms\": 9}, \"8\": {\"status\": \"ok\", \"ms\": 9},"
    "              \"64\": {\"status\": \"ok\", \"ms\": 9}, \"512\": {\"status\": \"ok\", \"ms\": 90}},"
    "   \"rec\":   {\"1\": {\"status\": \"ok\", \"ms\": 1}, \"8\": {\"status\": \"ok\", \"ms\": 2},"
    "              \"64\": {\"status\": \"ok\", \"ms\": 8}, \"512\": {\"status\": \"ok\", \"ms\": 60}},"
    "   \"chunk\": {\"1\": {\"status\": \"ok\", \"ms\": 2}, \"8\": {\"status\": \"ok\", \"ms\": 3},"
    "              \"64\": {\"status\": \"ok\", \"ms\": 4}, \"512\": {\"status\": \"ok\", \"ms\": 10}},"
    "   \"dec\":   {\"1\": {\"status\": \"ok\", \"ms\": 1.5}, \"8\": {\"status\": \"ok\", \"ms\": 2},"
    "              \"64\": {\"status\": \"unsupported\"}, \"512\": {\"status\": \"unsupported\"}},"
    "   \"bad\":   {\"1\": {\"status\": \"ok\", \"ms\": 0.1}, \"8\": {\"status\": \"ok\", \"ms\": 0.1},"
    "              \"64\": {\"status\": \"ok\", \"ms\": 0.1}}}}"
    "]}";

static void test_doctor_plan_from_per_bucket_times(void **st) {
    (void)st;
    json_t *r = json_loads(PLAN_REPORT, 0, NULL);
    assert_non_null(r);
    const int ms[] = {512, 1, 64, 8}; /* any order */
    const char *ok[] = {"slow", "rec", "chunk", "dec"};
    doc_plan p;
    ls_err e = {0};
    char t[256];
    assert_int_equal(doctor_plan(r, "gdn", ms, 4, ok, 4, &p, &e), 0);
    doctor_plan_text(&p, t, sizeof t);
    /* M=1: rec 2 < dec 3 < chunk 4; M=8: dec 2.5 < rec 4; M=64, 512: chunk */
    assert_string_equal(t, "rec:1,dec:8,chunk");
    /* per bucket: ok with the summed time, or the first failing status */
    double x = 0;
    char stt[32];
    assert_true(doctor_bucket(r, "gdn", "dec", 8, &x, stt, sizeof stt));
    assert_float_equal(x, 2.5, 1e-12);
    assert_false(doctor_bucket(r, "gdn", "dec", 64, &x, stt, sizeof stt));
    assert_string_equal(stt, "unsupported");
    assert_false(doctor_bucket(r, "gdn", "bad", 512, &x, stt, sizeof stt));
    assert_string_equal(stt, "wrong");
    assert_false(doctor_bucket(r, "gdn", "bad", 8, &x, stt, sizeof stt) && 0);
    assert_false(doctor_bucket(r, "gdn", "nope", 8, &x, stt, sizeof stt));
    assert_string_equal(stt, "missing");
    assert_false(doctor_bucket(r, "moe", "rec", 8, &x, stt, sizeof stt)); /* no such family */
    /* without dec: rec up to 8, chunk above; one name: one entry */
    assert_int_equal(doctor_plan(r, "gdn", ms, 4, ok, 3, &p, &e), 0);
    doctor_plan_text(&p, t, sizeof t);
    assert_string_equal(t, "rec:8,chunk");
    assert_int_equal(doctor_plan(r, "gdn", ms, 4, ok, 1, &p, &e), 0);
    doctor_plan_text(&p, t, sizeof t);
    assert_string_equal(t, "slow");
    assert_int_equal(p.n, 1);
    /* the text is what ops_plan_parse reads: bounds increase, the last unbounded */
    assert_int_equal(doctor_plan(r, "gdn", ms, 4, ok, 4, &p, &e), 0);
    assert_int_equal(p.max_m[0], 1);
    assert_int_equal(p.max_m[1], 8);
    assert_int_equal(p.max_m[2], 0);
    /* within 5% of the fastest, the previous bucket's pick keeps its run (noise does not split
     * a plan): chunk at 512 is 10 on the sum of shapes; a 'near' backend at 10.4 there that
     * won M=64 keeps M=512; at 10.6 it does not */
    {
        json_t *r2 = json_loads(
            "{\"tables\": [{\"family\": \"gdn\", \"backends\": [\"near\", \"chunk\"], \"test_only\": [],"
            " \"cells\": {\"near\":  {\"64\": {\"status\": \"ok\", \"ms\": 3}, \"512\": {\"status\": \"ok\", \"ms\": 10.4}},"
            "             \"chunk\": {\"64\": {\"status\": \"ok\", \"ms\": 4}, \"512\": {\"status\": \"ok\", \"ms\": 10}}}}]}",
            0, NULL);
        assert_non_null(r2);
        const int m2[] = {64, 512};
        const char *nm2[] = {"chunk", "near"};
        assert_int_equal(doctor_plan(r2, "gdn", m2, 2, nm2, 2, &p, &e), 0);
        doctor_plan_text(&p, t, sizeof t);
        assert_string_equal(t, "near");
        json_object_set_new(json_object_get(json_object_get(json_object_get(json_array_get(json_object_get(r2, "tables"), 0),
                                                                            "cells"), "near"), "512"),
                            "ms", json_real(10.6));
        assert_int_equal(doctor_plan(r2, "gdn", m2, 2, nm2, 2, &p, &e), 0);
        doctor_plan_text(&p, t, sizeof t);
        assert_string_equal(t, "near:64,chunk");
        json_decref(r2);
    }
    /* a bucket where none of the names is correct: refused, naming it */
    const char *only_dec[] = {"dec"};
    assert_int_equal(doctor_plan(r, "gdn", ms, 4, only_dec, 1, &p, &e), ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "no correct gdn backend at M=64"));
    json_decref(r);
}

int main(void) {
    setenv("LASTSTAND_TEST_BROKEN_BACKENDS", "1", 1); /* before the registries fill */
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_text_parses_and_formats_back),
        cmocka_unit_test(test_malformed_plans_are_refused_with_the_fault),
        cmocka_unit_test(test_dispatch_switches_backend_by_M),
        cmocka_unit_test(test_attention_and_gdn_dispatch_on_the_steps_total_tokens),
        cmocka_unit_test(test_named_plan_refuses_auto_plan_falls_back_never_to_a_banned_backend),
        cmocka_unit_test(test_named_plan_checked_at_load_over_its_M_range),
        cmocka_unit_test(test_capture_takes_a_graph_safe_plan_entry_never_a_banned_one),
        cmocka_unit_test(test_ban_list_errors),
        cmocka_unit_test(test_doctor_plan_from_per_bucket_times),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
