/* test_sample_cuda.c: the GPU sampler (src/ops/cuda/sample.cu) against the
 * host sampler (src/engine/sampler.c), the oracle whose semantics it copies:
 * greedy ids (lowest id on ties, BF16 rows full of ties), bans and the three
 * penalties, logprobs and top logprobs after temperature, draws that stay in
 * the host's top_k / top_p / min_p kept set with the host's probabilities,
 * seeded reproducibility, NaN/Inf rows reported by index, skipped rows.
 * Needs a CUDA GPU: every test is skipped without one (CPU CI, NO_CUDA builds).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "engine/sampler.h"
#include "ops/ops.h"
#ifdef LS_HAVE_CUDA
#include "ops/cuda/graph.h"
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { V = 5003, ROWS = 4 };

#ifdef LS_HAVE_CUDA
static const dev_mem *g_mem;
static ls_stream g_st;

static int have_gpu(void) {
    static int state = -1;
    if (state >= 0) return state;
    state = 0;
    g_mem = ops_dev_mem(DEV_CUDA);
    dev_info d;
    ls_err e = {0};
    if (g_mem && g_mem->open(0, &d, &g_st, &e) == 0) state = 1;
    else fprintf(stderr, "test_sample_cuda: no CUDA device (%s): skipping\n", e.msg);
    return state;
}

/* Run the device sampler over rows of logits (fp32 or BF16). */
static void dev_sample(const float *x, int rows, int bf16, const smp_row *p, const int32_t *toks, int n_toks,
                       smp_out *out) {
    ls_err e = {0};
    size_t es = bf16 ? 2 : 4, n = (size_t)rows * V;
    void *dx = g_mem->alloc(n * es, &e), *dp = g_mem->alloc(sizeof(smp_row) * rows, &e);
    void *dt = g_mem->alloc(sizeof(int32_t) * (n_toks + 1), &e), *dw = g_mem->alloc(sizeof(float) * n, &e);
    void *dout = g_mem->alloc(sizeof(smp_out) * rows, &e);
    assert_non_null(dx);
    assert_non_null(dout);
    if (bf16) {
        uint16_t *h = malloc(n * 2);
        for (size_t i = 0; i < n; i++) h[i] = f32_to_bf16(x[i]);
        assert_int_equal(g_mem->h2d(dx, h, n * 2, g_st, &e), 0);
        free(h);
    } else {
        assert_int_equal(g_mem->h2d(dx, x, n * 4, g_st, &e), 0);
    }
    assert_int_equal(g_mem->h2d(dp, p, sizeof(smp_row) * rows, g_st, &e), 0);
    if (n_toks) assert_int_equal(g_mem->h2d(dt, toks, sizeof(int32_t) * n_toks, g_st, &e), 0);
    sample_args a = {.rows = rows, .vocab = V, .logits = dx, .dt = bf16 ? ACT_BF16 : ACT_F32, .p = dp, .toks = dt,
                     .work = dw, .out = dout};
    assert_int_equal(sample_cuda.run(&a, g_st, &e), 0);
    assert_int_equal(g_mem->d2h(out, dout, sizeof(smp_out) * rows, g_st, &e), 0);
    g_mem->free(dx); g_mem->free(dp); g_mem->free(dt); g_mem->free(dw); g_mem->free(dout);
}

static void fill(float *x, int rows, unsigned seed, float scale) {
    srand(seed);
    for (int i = 0; i < rows * V; i++) x[i] = scale * ((float)rand() / RAND_MAX * 2.f - 1.f);
}

static smp_row row_from(const ls_sampling *s) {
    return (smp_row){.temperature = s->temperature, .top_p = s->top_p, .min_p = s->min_p, .top_k = s->top_k,
                     .rep_pen = s->repetition_penalty, .freq_pen = s->frequency_penalty,
                     .pres_pen = s->presence_penalty, .forced = -1, .want_lp = s->logprobs,
                     .n_top = s->top_logprobs, .seed = 1, .counter = 0};
}
#endif

#define NEED_GPU()                                 \
    do {                                           \
        if (!have_gpu()) { skip(); return; }       \
    } while (0)

#ifdef LS_HAVE_CUDA
static void test_greedy_logprobs_and_penalties_match_the_host_sampler(void **st) {
    (void)st;
    NEED_GPU();
    static float x[ROWS * V];
    fill(x, ROWS, 7, 6.f);
    x[123] = x[4000] = 40.f; /* a tie at the top: the lower id wins */
    const int32_t prompt[] = {5, 9, 9, 123, 77}, outp[] = {9, 300, 300, 300, 4000};
    const int32_t ban[] = {11, 4000};
    smp_ctx *c = smp_new(V);
    ls_sampling s[ROWS];
    for (int r = 0; r < ROWS; r++) {
        ls_sampling_default(&s[r]);
        s[r].temperature = 0;
        s[r].logprobs = 1;
        s[r].top_logprobs = 5;
    }
    s[1].repetition_penalty = 1.7f;
    s[2].frequency_penalty = 0.9f;
    s[2].presence_penalty = -0.4f;
    s[3].temperature = 0.7f;
    s[3].top_k = 1; /* greedy, logprobs at temperature 0.7 */
    /* the token lists: row 0 bans, row 1 distinct prompt + output, row 2 (id, count) */
    int32_t toks[64];
    int nt = 0;
    smp_row p[ROWS];
    for (int r = 0; r < ROWS; r++) p[r] = row_from(&s[r]);
    p[0].ban_off = nt; p[0].n_ban = 2; toks[nt++] = ban[0]; toks[nt++] = ban[1];
    const int32_t distinct[] = {5, 9, 123, 77, 300, 4000};
    p[1].rep_off = nt; p[1].n_rep = 6; for (int i = 0; i < 6; i++) toks[nt++] = distinct[i];
    const int32_t pairs[] = {9, 1, 300, 3, 4000, 1};
    p[2].cnt_off = nt; p[2].n_cnt = 3; for (int i = 0; i < 6; i++) toks[nt++] = pairs[i];
    smp_out o[ROWS];
    dev_sample(x, ROWS, 0, p, toks, nt, o);
    for (int r = 0; r < ROWS; r++) {
        smp_hist h = {prompt, 5, outp, 5};
        smp_rng rng;
        smp_rng_seed(&rng, 1);
        smp_result hr;
        ls_err e = {0};
        assert_int_equal(smp_sample(c, x + (size_t)r * V, &s[r], &h, r == 0 ? ban : NULL, r == 0 ? 2 : 0, &rng, -1,
                                    &hr, &e), 0);
        assert_int_equal(o[r].bad_idx, -1);
        assert_int_equal(o[r].token, hr.token);
        assert_true(fabsf(o[r].logprob - hr.logprob) < 1e-4f);
        assert_int_equal(o[r].n_top, hr.n_top);
        for (int i = 0; i < hr.n_top; i++) {
            assert_int_equal(o[r].top_ids[i], hr.top_ids[i]);
            assert_true(fabsf(o[r].top_lp[i] - hr.top_logprobs[i]) < 1e-4f);
        }
    }
    assert_int_equal(o[0].token, 123); /* 4000 banned; 123 wins the tie anyway */
    smp_free(c);
}

static void test_bf16_ties_go_to_the_lowest_id(void **st) {
    (void)st;
    NEED_GPU();
    static float x[ROWS * V];
    for (int i = 0; i < ROWS * V; i++) x[i] = bf16_to_f32(f32_to_bf16(0.25f * (float)((i * 7919) % 13)));
    smp_row p[ROWS];
    ls_sampling s;
    ls_sampling_default(&s);
    s.temperature = 0;
    s.logprobs = 1;
    s.top_logprobs = 20; /* the top 20 are all tied: ids ascending */
    for (int r = 0; r < ROWS; r++) p[r] = row_from(&s);
    smp_out o[ROWS];
    dev_sample(x, ROWS, 1, p, NULL, 0, o);
    smp_ctx *c = smp_new(V);
    for (int r = 0; r < ROWS; r++) {
        smp_hist h = {0};
        smp_rng rng;
        smp_rng_seed(&rng, 1);
        smp_result hr;
        ls_err e = {0};
        assert_int_equal(smp_sample(c, x + (size_t)r * V, &s, &h, NULL, 0, &rng, -1, &hr, &e), 0);
        assert_int_equal(o[r].token, hr.token);
        for (int i = 0; i < 20; i++) assert_int_equal(o[r].top_ids[i], hr.top_ids[i]);
    }
    smp_free(c);
}

/* Draws over seeds stay in the host's kept set with the host's frequencies. */
static void draws_follow_host(float temp, int top_k, float top_p, float min_p) {
    static float x[V];
    fill(x, 1, 11, 4.f);
    ls_sampling s;
    ls_sampling_default(&s);
    s.temperature = temp;
    s.top_k = top_k;
    s.top_p = top_p;
    s.min_p = min_p;
    smp_ctx *c = smp_new(V);
    static int32_t ids[V];
    static double probs[V], q[V];
    int n = smp_filtered_dist(c, x, &s, ids, probs);
    memset(q, 0, sizeof q);
    for (int i = 0; i < n; i++) q[ids[i]] = probs[i];
    enum { N = 4000, B = 250 };
    static float xs[B * V];
    static int cnt[V];
    memset(cnt, 0, sizeof cnt);
    for (int r = 0; r < B; r++) memcpy(xs + (size_t)r * V, x, sizeof x);
    smp_row p[B];
    smp_out o[B];
    for (int done = 0; done < N; done += B) {
        for (int r = 0; r < B; r++) {
            p[r] = row_from(&s);
            p[r].seed = 1000 + done + r;
        }
        dev_sample(xs, B, 0, p, NULL, 0, o);
        for (int r = 0; r < B; r++) {
            assert_true(o[r].token >= 0 && o[r].token < V);
            assert_true(q[o[r].token] > 0); /* never outside the kept set */
            cnt[o[r].token]++;
        }
    }
    /* chi-square over cells with >= 5 expected, the rest pooled */
    double chi = 0, rest_o = 0, rest_e = 0;
    int cells = 0;
    for (int i = 0; i < V; i++) {
        double ex = q[i] * N;
        if (ex >= 5) { chi += (cnt[i] - ex) * (cnt[i] - ex) / ex; cells++; }
        else { rest_o += cnt[i]; rest_e += ex; }
    }
    if (rest_e > 0) { chi += (rest_o - rest_e) * (rest_o - rest_e) / rest_e; cells++; }
    int dof = cells > 1 ? cells - 1 : 1;
    double crit = dof * pow(1 - 2.0 / (9 * dof) + 3.09 * sqrt(2.0 / (9 * dof)), 3); /* p = 0.001 */
    fprintf(stderr, "  T %.2f top_k %d top_p %.2f min_p %.2f: %d kept, chi2 %.1f < %.1f (dof %d)\n", temp, top_k,
            top_p, min_p, n, chi, crit, dof);
    assert_true(chi < crit);
    smp_free(c);
}

static void test_draws_follow_the_host_distribution(void **st) {
    (void)st;
    NEED_GPU();
    draws_follow_host(0.8f, 40, 0.9f, 0.f);
    draws_follow_host(1.0f, -1, 0.5f, 0.f);
    draws_follow_host(1.3f, 200, 1.0f, 0.05f);
    draws_follow_host(0.05f, -1, 1.0f, 0.f); /* nearly greedy */
}

static void test_seeded_draws_repeat_and_nan_rows_are_reported(void **st) {
    (void)st;
    NEED_GPU();
    static float x[ROWS * V];
    fill(x, ROWS, 3, 1.f);
    for (int r = 1; r < ROWS; r++) memcpy(x + (size_t)r * V, x, sizeof(float) * V);
    x[2 * V + 17] = NAN;
    x[2 * V + 99] = INFINITY;
    ls_sampling s;
    ls_sampling_default(&s);
    smp_row p[ROWS];
    for (int r = 0; r < ROWS; r++) { p[r] = row_from(&s); p[r].seed = 42; p[r].counter = 5; }
    p[3].forced = SMP_ROW_SKIP;
    smp_out o[ROWS], o2[ROWS];
    dev_sample(x, ROWS, 0, p, NULL, 0, o);
    dev_sample(x, ROWS, 0, p, NULL, 0, o2);
    assert_int_equal(o[0].token, o[1].token); /* same seed and counter, same row: same draw */
    assert_int_equal(o[0].token, o2[0].token);
    assert_int_equal(o[2].bad_idx, 17);
    assert_true(isnan(o[2].bad_val));
    assert_int_equal(o[3].token, -1);
    int differ = 0;
    for (int k = 0; k < 8; k++) {
        p[1].counter = 6 + k;
        dev_sample(x, ROWS, 0, p, NULL, 0, o2);
        differ += o2[1].token != o[0].token;
    }
    assert_true(differ > 0); /* the counter moves the draw */
}
#endif

int main(void) {
#ifdef LS_HAVE_CUDA
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_logprobs_and_penalties_match_the_host_sampler),
        cmocka_unit_test(test_bf16_ties_go_to_the_lowest_id),
        cmocka_unit_test(test_draws_follow_the_host_distribution),
        cmocka_unit_test(test_seeded_draws_repeat_and_nan_rows_are_reported),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
#else
    fprintf(stderr, "test_sample_cuda: built without CUDA: nothing to test\n");
    return 0;
#endif
}
