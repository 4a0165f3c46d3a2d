/* test_sampler.c: the sampler against hand-computed distributions and the
 * penalty formulas (HF repetition penalty, OpenAI presence/frequency), seeded
 * determinism, and draw frequencies against the softmax.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"

/* logits = log(w): softmax gives w / sum(w) */
static void log_weights(float *x, const double *w, int n) {
    for (int i = 0; i < n; i++) x[i] = (float)log(w[i]);
}

static ls_sampling params(float temp) {
    ls_sampling p;
    ls_sampling_default(&p);
    p.temperature = temp;
    return p;
}

static void expect_dist(smp_ctx *c, const float *x, const ls_sampling *p, int n_exp,
                        const int32_t *ids_exp, const double *probs_exp) {
    int32_t ids[16];
    double probs[16];
    int n = smp_filtered_dist(c, x, p, ids, probs);
    assert_int_equal(n, n_exp);
    for (int i = 0; i < n; i++) {
        assert_int_equal(ids[i], ids_exp[i]);
        assert_true(fabs(probs[i] - probs_exp[i]) < 1e-6);
    }
}

static const double W4[4] = {1, 2, 3, 4}; /* probs 0.1 0.2 0.3 0.4 */

static void test_top_k_keeps_k_most_likely_renormalised(void **st) {
    (void)st;
    smp_ctx *c = smp_new(4);
    float x[4];
    log_weights(x, W4, 4);
    ls_sampling p = params(1);
    p.top_k = 2;
    expect_dist(c, x, &p, 2, (int32_t[]){3, 2}, (double[]){4 / 7., 3 / 7.});
    p.top_k = 1;
    expect_dist(c, x, &p, 1, (int32_t[]){3}, (double[]){1});
    smp_free(c);
}

static void test_top_p_keeps_smallest_set_reaching_p(void **st) {
    (void)st;
    smp_ctx *c = smp_new(4);
    float x[4];
    log_weights(x, W4, 4);
    ls_sampling p = params(1);
    p.top_p = 0.35f; /* 0.4 alone reaches it */
    expect_dist(c, x, &p, 1, (int32_t[]){3}, (double[]){1});
    p.top_p = 0.65f; /* 0.4 + 0.3 */
    expect_dist(c, x, &p, 2, (int32_t[]){3, 2}, (double[]){4 / 7., 3 / 7.});
    p.top_p = 0.95f;
    expect_dist(c, x, &p, 4, (int32_t[]){3, 2, 1, 0}, (double[]){.4, .3, .2, .1});
    /* top_k first, then top_p on the renormalised top_k set: 4/9, 3/9, 2/9 */
    p.top_k = 3;
    p.top_p = 0.6f;
    expect_dist(c, x, &p, 2, (int32_t[]){3, 2}, (double[]){4 / 7., 3 / 7.});
    smp_free(c);
}

static void test_min_p_drops_tokens_below_fraction_of_max(void **st) {
    (void)st;
    smp_ctx *c = smp_new(4);
    float x[4];
    log_weights(x, W4, 4);
    ls_sampling p = params(1);
    p.min_p = 0.6f; /* threshold 0.24 */
    int32_t ids[4];
    double pr[4];
    int n = smp_filtered_dist(c, x, &p, ids, pr);
    assert_int_equal(n, 2); /* id order when no top_k/top_p sort: 2, 3 */
    double s2 = 0, s3 = 0;
    for (int i = 0; i < n; i++) { if (ids[i] == 2) s2 = pr[i]; if (ids[i] == 3) s3 = pr[i]; }
    assert_true(fabs(s2 - 3 / 7.) < 1e-6 && fabs(s3 - 4 / 7.) < 1e-6);
    p.min_p = 0.45f; /* threshold 0.18: 0.1 goes */
    n = smp_filtered_dist(c, x, &p, ids, pr);
    assert_int_equal(n, 3);
    smp_free(c);
}

static void test_temperature_sharpens_softmax(void **st) {
    (void)st;
    smp_ctx *c = smp_new(4);
    float x[4];
    log_weights(x, W4, 4);
    ls_sampling p = params(0.5f); /* p^2: 1 4 9 16 over 30 */
    p.top_p = 0.999f;             /* forces the sorted order */
    expect_dist(c, x, &p, 4, (int32_t[]){3, 2, 1, 0}, (double[]){16 / 30., 9 / 30., 4 / 30., 1 / 30.});
    smp_free(c);
}

static double *g_e;
static int by_prob_desc(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (g_e[x] != g_e[y]) return g_e[x] > g_e[y] ? -1 : 1;
    return x < y ? -1 : x > y;
}

static void test_top_p_threshold_search_matches_full_sort(void **st) {
    (void)st;
    enum { V = 50000 };
    smp_ctx *c = smp_new(V);
    float *x = malloc(V * sizeof *x);
    int32_t *ids = malloc(V * sizeof *ids), *ref = malloc(V * sizeof *ref);
    double *pr = malloc(V * sizeof *pr);
    smp_rng r;
    smp_rng_seed(&r, 7);
    for (int i = 0; i < V; i++) x[i] = (float)(smp_rng_uniform(&r) * 12.0 - 6.0);
    float top_ps[] = {0.5f, 0.9f, 0.99f, 0.9999f};
    for (int t = 0; t < 4; t++) {
        ls_sampling p = params(0.7f);
        p.top_p = top_ps[t];
        int n = smp_filtered_dist(c, x, &p, ids, pr);
        /* oracle: qsort of all probabilities in double, then the cumulative cut */
        double mx = -INFINITY, z = 0;
        for (int i = 0; i < V; i++) if (x[i] * (1.0f / 0.7f) > mx) mx = x[i] * (1.0f / 0.7f);
        g_e = malloc(V * sizeof *g_e);
        for (int i = 0; i < V; i++) { g_e[i] = exp((double)(x[i] * (1.0f / 0.7f)) - mx); z += g_e[i]; ref[i] = i; }
        qsort(ref, V, sizeof *ref, by_prob_desc);
        int keep = 0;
        double cum = 0;
        while (keep < V && cum < (double)p.top_p * z) cum += g_e[ref[keep++]];
        assert_int_equal(n, keep);
        for (int i = 0; i < n; i++) assert_int_equal(ids[i], ref[i]);
        free(g_e);
        double s = 0;
        for (int i = 0; i < n; i++) s += pr[i];
        assert_true(fabs(s - 1) < 1e-9);
    }
    free(x); free(ids); free(ref); free(pr);
    smp_free(c);
}

static void test_penalties_follow_hf_and_openai_formulas(void **st) {
    (void)st;
    smp_ctx *c = smp_new(5);
    float x[5] = {2, -2, 1, 0.5f, 3};
    ls_sampling p = params(1);
    p.repetition_penalty = 1.5f;
    p.frequency_penalty = 0.25f;
    p.presence_penalty = 0.5f;
    int32_t prompt[] = {0, 1, 0}, out[] = {2, 2, 4};
    smp_hist h = {prompt, 3, out, 3};
    smp_apply_penalties(c, x, &p, &h);
    assert_true(fabs(x[0] - 2 / 1.5f) < 1e-6);                 /* prompt, positive: divided once */
    assert_true(fabs(x[1] - -2 * 1.5f) < 1e-6);                /* prompt, negative: multiplied */
    assert_true(fabs(x[2] - (1 / 1.5f - 2 * 0.25f - 0.5f)) < 1e-6); /* output twice */
    assert_true(fabs(x[3] - 0.5f) < 1e-6);                      /* untouched */
    assert_true(fabs(x[4] - (3 / 1.5f - 0.25f - 0.5f)) < 1e-6);
    /* the count scratch is left clean: applying again to fresh logits gives the same */
    float y[5] = {2, -2, 1, 0.5f, 3};
    smp_apply_penalties(c, y, &p, &h);
    for (int i = 0; i < 5; i++) assert_true(x[i] == y[i]);
    smp_free(c);
}

static void test_greedy_is_argmax_lowest_id_on_ties(void **st) {
    (void)st;
    smp_ctx *c = smp_new(4);
    float x[4] = {1, 3, 3, 2};
    ls_sampling p = params(0);
    smp_hist h = {0};
    smp_result r;
    smp_rng rng;
    smp_rng_seed(&rng, 1);
    assert_int_equal(smp_sample(c, x, &p, &h, NULL, 0, &rng, -1, &r, NULL), 0);
    assert_int_equal(r.token, 1);
    /* a banned argmax (min_tokens before EOS) is skipped */
    int32_t ban[] = {1, 2};
    assert_int_equal(smp_sample(c, x, &p, &h, ban, 2, &rng, -1, &r, NULL), 0);
    assert_int_equal(r.token, 3);
    smp_free(c);
}

static void test_logprobs_are_log_softmax_after_temperature(void **st) {
    (void)st;
    smp_ctx *c = smp_new(4);
    float x[4];
    log_weights(x, W4, 4);
    ls_sampling p = params(0);
    p.logprobs = 1;
    p.top_logprobs = 3;
    smp_hist h = {0};
    smp_result r;
    smp_rng rng;
    smp_rng_seed(&rng, 1);
    assert_int_equal(smp_sample(c, x, &p, &h, NULL, 0, &rng, -1, &r, NULL), 0);
    assert_int_equal(r.token, 3);
    assert_true(fabs(r.logprob - log(0.4)) < 1e-5);
    assert_int_equal(r.n_top, 3);
    assert_int_equal(r.top_ids[0], 3);
    assert_int_equal(r.top_ids[1], 2);
    assert_int_equal(r.top_ids[2], 1);
    assert_true(fabs(r.top_logprobs[1] - log(0.3)) < 1e-5);
    /* temperature 0.5: p^2 / 30; a forced token reports its own logprob */
    p.temperature = 0.5f;
    assert_int_equal(smp_sample(c, x, &p, &h, NULL, 0, &rng, 0, &r, NULL), 0);
    assert_int_equal(r.token, 0);
    assert_true(fabs(r.logprob - log(1 / 30.)) < 1e-5);
    assert_true(fabs(r.top_logprobs[0] - log(16 / 30.)) < 1e-5);
    smp_free(c);
}

static void test_nan_logits_are_an_error_naming_the_index(void **st) {
    (void)st;
    smp_ctx *c = smp_new(4);
    float x[4] = {0, 1, NAN, 2};
    ls_sampling p = params(1);
    smp_hist h = {0};
    smp_result r;
    smp_rng rng;
    smp_rng_seed(&rng, 1);
    ls_err e = {0};
    assert_int_equal(smp_sample(c, x, &p, &h, NULL, 0, &rng, -1, &r, &e), ERR_RUNTIME);
    assert_non_null(strstr(e.msg, "logits[2]"));
    x[2] = INFINITY;
    assert_int_equal(smp_sample(c, x, &p, &h, NULL, 0, &rng, -1, &r, &e), ERR_RUNTIME);
    smp_free(c);
}

static void draw_many(smp_ctx *c, const float *x, const ls_sampling *p, uint64_t seed, int n,
                      int32_t *out) {
    smp_rng rng;
    smp_rng_seed(&rng, seed);
    smp_hist h = {0};
    smp_result r;
    for (int i = 0; i < n; i++) {
        assert_int_equal(smp_sample(c, x, p, &h, NULL, 0, &rng, -1, &r, NULL), 0);
        out[i] = r.token;
    }
}

static void test_same_seed_same_tokens_other_seed_differs(void **st) {
    (void)st;
    smp_ctx *c = smp_new(4);
    float x[4];
    log_weights(x, W4, 4);
    ls_sampling p = params(1);
    int32_t a[64], b[64], d[64];
    draw_many(c, x, &p, 42, 64, a);
    draw_many(c, x, &p, 42, 64, b);
    draw_many(c, x, &p, 43, 64, d);
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, d, sizeof a);
    smp_free(c);
}

static void test_draw_frequencies_match_softmax(void **st) {
    (void)st;
    enum { N = 40000 };
    smp_ctx *c = smp_new(4);
    float x[4];
    log_weights(x, W4, 4);
    int32_t *t = malloc(N * sizeof *t);
    ls_sampling p = params(1);
    draw_many(c, x, &p, 5, N, t);
    int cnt[4] = {0};
    for (int i = 0; i < N; i++) cnt[t[i]]++;
    /* binomial sd <= 0.0025 at N = 40000; allow 5 sd */
    for (int i = 0; i < 4; i++) assert_true(fabs(cnt[i] / (double)N - W4[i] / 10) < 0.0125);
    /* top_k = 2: only 3 and 2, at 4/7 and 3/7 */
    p.top_k = 2;
    draw_many(c, x, &p, 6, N, t);
    memset(cnt, 0, sizeof cnt);
    for (int i = 0; i < N; i++) cnt[t[i]]++;
    assert_int_equal(cnt[0] + cnt[1], 0);
    assert_true(fabs(cnt[3] / (double)N - 4 / 7.) < 0.0125);
    free(t);
    smp_free(c);
}

/* Constrained decoding's edits: refused ids get -inf, so greedy takes the best allowed id,
 * logprobs renormalise over the allowed ones and top_logprobs list only them; logit_bias is
 * added to the raw logits first. */
static void test_mask_and_logit_bias_renormalise(void **st) {
    (void)st;
    smp_ctx *c = smp_new(4);
    const double w[4] = {1, 2, 3, 4};
    float x[4];
    log_weights(x, w, 4);
    ls_sampling p = params(0);
    p.logprobs = 1;
    p.top_logprobs = 4;
    smp_hist h = {0};
    smp_rng rng;
    smp_rng_seed(&rng, 1);
    uint32_t allow = (1u << 0) | (1u << 2);
    smp_edit ed = {.allow = &allow};
    smp_result r;
    ls_err e = {0};
    assert_int_equal(smp_sample_ex(c, x, &p, &h, NULL, 0, &ed, &rng, -1, &r, &e), 0);
    assert_int_equal(r.token, 2);
    assert_true(fabs(r.logprob - log(3.0 / 4.0)) < 1e-5);
    assert_int_equal(r.n_top, 2);
    assert_int_equal(r.top_ids[0], 2);
    assert_int_equal(r.top_ids[1], 0);
    assert_true(fabs(r.top_logprobs[1] - log(1.0 / 4.0)) < 1e-5);
    /* +log 3 on id 0: weights 3 and 3 among the allowed, the lower id wins the tie */
    int32_t bid = 0;
    float bias = (float)log(3.0);
    ed.bias_ids = &bid;
    ed.bias = &bias;
    ed.n_bias = 1;
    assert_int_equal(smp_sample_ex(c, x, &p, &h, NULL, 0, &ed, &rng, -1, &r, &e), 0);
    assert_int_equal(r.token, 0);
    assert_true(fabs(r.logprob - log(0.5)) < 1e-5);
    /* sampled: only allowed ids ever come out */
    p.temperature = 1;
    ed.n_bias = 0;
    int seen[4] = {0};
    for (int i = 0; i < 2000; i++) {
        assert_int_equal(smp_sample_ex(c, x, &p, &h, NULL, 0, &ed, &rng, -1, &r, &e), 0);
        seen[r.token]++;
    }
    assert_int_equal(seen[1] + seen[3], 0);
    assert_true(fabs(seen[2] / 2000.0 - 0.75) < 0.05);
    smp_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_top_k_keeps_k_most_likely_renormalised),
        cmocka_unit_test(test_top_p_keeps_smallest_set_reaching_p),
        cmocka_unit_test(test_min_p_drops_tokens_below_fraction_of_max),
        cmocka_unit_test(test_temperature_sharpens_softmax),
        cmocka_unit_test(test_top_p_threshold_search_matches_full_sort),
        cmocka_unit_test(test_penalties_follow_hf_and_openai_formulas),
        cmocka_unit_test(test_greedy_is_argmax_lowest_id_on_ties),
        cmocka_unit_test(test_logprobs_are_log_softmax_after_temperature),
        cmocka_unit_test(test_nan_logits_are_an_error_naming_the_index),
        cmocka_unit_test(test_same_seed_same_tokens_other_seed_differs),
        cmocka_unit_test(test_draw_frequencies_match_softmax),
        cmocka_unit_test(test_mask_and_logit_bias_renormalise),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
