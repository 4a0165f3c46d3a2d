/* test_sample_cuda.c: the GPU sampler (src/ops/cuda/sample.cu) against the
 * host sampler (src/engine/sampler.c), the oracle whose semantics it copies:
 * greedy ids (lowest id on ties, BF16 rows full of ties), bans and the three
 * penalties, logprobs and top logprobs after temperature, draws that stay in
 * the host's top_k / top_p / min_p kept set with the host's probabilities,
 * seeded reproducibility, NaN/Inf rows reported by index, skipped rows; grammar masks and
 * logit_bias (smp_row.n_mask / n_bias) against smp_sample_ex with the same edits.
 * Needs a CUDA GPU: every test is skipped without one (CPU CI, NO_CUDA builds).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "engine/sampler.h"
#include "ops/ops.h"
#include "cuda_test.h"
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
static dev_info g_dev;

/* cc >= 9.0: the cluster form needs thread-block clusters (and the build targets sm_90) */
static int have_gpu(void) { return cuda_test_gpu("test_sample_cuda", 9, &g_mem, &g_dev, &g_st); }

static const sample_impl *g_impl = &sample_cuda_block; /* the form under test (the group's setup) */
static const sample_impl *g_fast = &sample_cuda_fast;   /* the cluster form under test against the one block */

/* Run a device sampler over rows of vocab-wide logits (fp32 or BF16). */
static void dev_sample_with(const sample_impl *impl, int vocab, const float *x, int rows, int bf16, const smp_row *p,
                            const int32_t *toks, int n_toks, smp_out *out) {
    ls_err e = {0};
    size_t es = bf16 ? 2 : 4, n = (size_t)rows * vocab;
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
    sample_args a = {.rows = rows, .vocab = vocab, .logits = dx, .dt = bf16 ? ACT_BF16 : ACT_F32, .p = dp,
                     .toks = dt, .work = dw, .out = dout};
    assert_int_equal(impl->run(&a, g_st, &e), 0);
    dev_fetch(out, dout, sizeof(smp_out) * rows);
    g_mem->free(dx); g_mem->free(dp); g_mem->free(dt); g_mem->free(dw); g_mem->free(dout);
}

static void dev_sample(const float *x, int rows, int bf16, const smp_row *p, const int32_t *toks, int n_toks,
                       smp_out *out) {
    dev_sample_with(g_impl, V, x, rows, bf16, p, toks, n_toks, out);
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

/* The cluster forms against the one-block form on a full Qwen3.5 vocabulary (248320, BF16,
 * where each of the cluster's blocks holds ~30k ids): the same greedy ids, bad indices, top
 * logprob ids, the same seeded draws, logprobs to 1e-5; greedy rows also against the host. */
enum { VB = 248320, RB = 7 };
static void test_wide_matches_one_block_on_a_full_vocab_row(void **st) {
    (void)st;
    NEED_GPU();
    float *x = malloc(sizeof(float) * (size_t)RB * VB);
    srand(5);
    for (size_t i = 0; i < (size_t)RB * VB; i++) {
        float u = (float)rand() / RAND_MAX;
        x[i] = bf16_to_f32(f32_to_bf16(12.f * u * u * u - 2.f)); /* a long tail, a few high logits */
    }
    x[3 * (size_t)VB + 200000] = x[3 * (size_t)VB + 7] = 30.f; /* a tie at the top across blocks */
    ls_sampling s[RB];
    for (int r = 0; r < RB; r++) ls_sampling_default(&s[r]);
    s[0].temperature = 0;                                        /* plain greedy */
    s[1].temperature = 0; s[1].logprobs = 1; s[1].top_logprobs = 20;
    s[2].temperature = 0.7f; s[2].top_p = 0.9f; s[2].logprobs = 1; s[2].top_logprobs = 5;
    s[3].temperature = 0; s[3].repetition_penalty = 1.3f;        /* greedy, penalised, the tie */
    s[4].temperature = 1.0f; s[4].top_k = 40; s[4].top_p = 0.95f; s[4].min_p = 0.02f;
    s[5].temperature = 1.3f;                                     /* the whole vocabulary */
    s[6].temperature = 0.9f; s[6].top_k = 1000;
    smp_row p[RB];
    for (int r = 0; r < RB; r++) { p[r] = row_from(&s[r]); p[r].seed = 77 + r; p[r].counter = 3; }
    const int32_t toks[] = {5, 9, 123, 200000, 7, 150000};
    p[3].rep_off = 0; p[3].n_rep = 6;
    p[4].ban_off = 3; p[4].n_ban = 3;
    smp_out *ob = malloc(sizeof(smp_out) * RB), *ow = malloc(sizeof(smp_out) * RB);
    for (int bf = 0; bf < 2; bf++) {
        dev_sample_with(&sample_cuda_block, VB, x, RB, bf, p, toks, 6, ob);
        /* the row in global memory, in shared memory, each without and with the top_k bound */
        const sample_impl *forms[] = {&sample_cuda_fast, &sample_cuda_fast_lb, &sample_cuda_fast_sm,
                                      &sample_cuda_fast_smlb};
        for (int form = 0; form < 4; form++) {
            dev_sample_with(forms[form], VB, x, RB, bf, p, toks, 6, ow);
            for (int r = 0; r < RB; r++) {
                assert_int_equal(ob[r].bad_idx, -1);
                assert_int_equal(ow[r].bad_idx, -1);
                assert_int_equal(ow[r].token, ob[r].token);
                assert_true(fabsf(ow[r].logprob - ob[r].logprob) < 1e-5f);
                assert_int_equal(ow[r].n_top, ob[r].n_top);
                for (int i = 0; i < ob[r].n_top; i++) {
                    assert_int_equal(ow[r].top_ids[i], ob[r].top_ids[i]);
                    assert_true(fabsf(ow[r].top_lp[i] - ob[r].top_lp[i]) < 1e-5f);
                }
            }
        }
    }
    assert_int_equal(ow[3].token, 7); /* the tie: the lower id, in another block than 200000 */
    smp_ctx *c = smp_new(VB);
    for (int r = 0; r < 2; r++) {
        smp_hist h = {0};
        smp_rng rng;
        smp_rng_seed(&rng, 1);
        smp_result hr;
        ls_err e = {0};
        assert_int_equal(smp_sample(c, x + (size_t)r * VB, &s[r], &h, NULL, 0, &rng, -1, &hr, &e), 0);
        assert_int_equal(ow[r].token, hr.token);
        if (r == 1) {
            assert_true(fabsf(ow[r].logprob - hr.logprob) < 1e-4f);
            assert_int_equal(ow[r].n_top, hr.n_top);
            for (int i = 0; i < hr.n_top; i++) assert_int_equal(ow[r].top_ids[i], hr.top_ids[i]);
        }
    }
    /* the draws lie in the host's kept sets */
    int32_t *ids = malloc(sizeof(int32_t) * VB);
    double *probs = malloc(sizeof(double) * VB);
    const int drawn[] = {2, 5, 6};
    for (int k = 0; k < 3; k++) {
        int r = drawn[k], n = smp_filtered_dist(c, x + (size_t)r * VB, &s[r], ids, probs), in = 0;
        for (int i = 0; i < n; i++) in |= ids[i] == ow[r].token;
        assert_true(in);
    }
    /* a NaN in a late block: reported by its index, as the one-block form does */
    x[(size_t)VB * 2 + 240001] = NAN;
    dev_sample_with(&sample_cuda_fast_sm, VB, x, RB, 1, p, toks, 6, ow);
    assert_int_equal(ow[2].bad_idx, 240001);
    assert_int_equal(ow[2].token, -1);
    assert_int_equal(ow[1].bad_idx, -1);
    free(ids); free(probs); smp_free(c);
    free(x); free(ob); free(ow);
}

/* ---- the wide-digit top_k / top_p (the cluster forms) -------------------------------------
 * Its kept set must be the host's (and so the one-block descent's): the draw is the same code,
 * so with the same seed and counter the forms draw the same token wherever the kept sets agree
 * (up to the last bits of the masses, summed in another order), and every draw lies in the
 * host's kept set. */

/* rows copies of one vocab-wide row x, seeds seed0.., through both cluster forms: the same
 * tokens, each in the host's kept set for s (and, when want_all, every kept token of host
 * probability >= 5% drawn at least once). Returns the number of distinct tokens drawn. */
static int fast_vs_old(int vocab, const float *x, int bf16, const ls_sampling *s, const int32_t *ban, int n_ban,
                       int rows, uint64_t seed0, int want_all) {
    float *xs = malloc(sizeof(float) * (size_t)rows * vocab);
    for (int r = 0; r < rows; r++) memcpy(xs + (size_t)r * vocab, x, sizeof(float) * vocab);
    smp_row *p = malloc(sizeof(smp_row) * rows);
    smp_out *of = malloc(sizeof(smp_out) * rows), *oo = malloc(sizeof(smp_out) * rows);
    for (int r = 0; r < rows; r++) {
        p[r] = row_from(s);
        p[r].seed = seed0 + r;
        p[r].counter = 9;
        if (n_ban) { p[r].ban_off = 0; p[r].n_ban = n_ban; }
    }
    dev_sample_with(g_fast, vocab, xs, rows, bf16, p, ban, n_ban, of);
    dev_sample_with(&sample_cuda_block, vocab, xs, rows, bf16, p, ban, n_ban, oo);
    /* the host's kept set, on the row as the GPU sees it (BF16-rounded, bans applied) */
    float *xh = malloc(sizeof(float) * vocab);
    for (int i = 0; i < vocab; i++) xh[i] = bf16 ? bf16_to_f32(f32_to_bf16(x[i])) : x[i];
    for (int j = 0; j < n_ban; j++) xh[ban[j]] = -INFINITY;
    smp_ctx *c = smp_new(vocab);
    int32_t *ids = malloc(sizeof(int32_t) * vocab);
    double *probs = malloc(sizeof(double) * vocab);
    int n = smp_filtered_dist(c, xh, s, ids, probs);
    char *in = calloc((size_t)vocab, 1), *seen = calloc((size_t)vocab, 1);
    for (int i = 0; i < n; i++) in[ids[i]] = 1;
    int distinct = 0;
    for (int r = 0; r < rows; r++) {
        assert_int_equal(of[r].bad_idx, -1);
        if (of[r].token != oo[r].token)
            fprintf(stderr, "  row %d: cluster %d, one block %d (T %.2f top_k %d top_p %g min_p %g)\n", r, of[r].token,
                    oo[r].token, s->temperature, s->top_k, s->top_p, s->min_p);
        assert_int_equal(of[r].token, oo[r].token);
        assert_true(of[r].token >= 0 && of[r].token < vocab);
        assert_true(in[of[r].token]);
        distinct += !seen[of[r].token];
        seen[of[r].token] = 1;
        assert_true(fabsf(of[r].logprob - oo[r].logprob) < 1e-5f);
    }
    if (want_all)
        for (int i = 0; i < n; i++)
            if (probs[i] >= 0.05) assert_true(seen[ids[i]]);
    fprintf(stderr, "  V %d T %.2f top_k %d top_p %g min_p %g%s: host keeps %d, %d distinct draws of %d\n", vocab,
            s->temperature, s->top_k, s->top_p, s->min_p, n_ban ? " (bans)" : "", n, distinct, rows);
    free(in); free(seen); free(ids); free(probs); free(xh); smp_free(c);
    free(xs); free(p); free(of); free(oo);
    return distinct;
}

static ls_sampling smp_of(float t, int k, float top_p, float min_p) {
    ls_sampling s;
    ls_sampling_default(&s);
    s.temperature = t;
    s.top_k = k;
    s.top_p = top_p;
    s.min_p = min_p;
    return s;
}

static void test_fast_kept_sets_match_the_host_and_the_old_form(void **st) {
    (void)st;
    NEED_GPU();
    static float x[V];
    fill(x, 1, 21, 5.f);
    const struct { float t; int k; float p, mp; } cs[] = {
        {0.7f, 20, 1.f, 0.f},    {1.0f, 50, 1.f, 0.f},    {1.0f, 256, 1.f, 0.f},     {1.0f, 257, 1.f, 0.f},
        {1.2f, 4096, 1.f, 0.f},  {1.0f, V, 1.f, 0.f},     {1.0f, V + 7, 1.f, 0.f},   {0.7f, -1, 0.9f, 0.f},
        {1.0f, -1, 0.5f, 0.f},   {1.0f, -1, 1e-6f, 0.f},  {1.0f, -1, 0.999999f, 0.f}, {0.7f, 20, 0.8f, 0.f},
        {0.7f, 50, 0.95f, 0.f},  {1.0f, 1000, 0.9f, 0.f}, {1.0f, 300, 0.3f, 0.f},    {1.0f, 40, 1.f, 0.05f},
        {0.6f, 20, 0.95f, 0.2f}, {1.0f, -1, 1.f, 0.1f},
    };
    for (int bf = 0; bf < 2; bf++)
        for (size_t j = 0; j < sizeof cs / sizeof cs[0]; j++) {
            ls_sampling s = smp_of(cs[j].t, cs[j].k, cs[j].p, cs[j].mp);
            fast_vs_old(V, x, bf, &s, NULL, 0, 200, 100 + j, 0);
        }
    /* top_p 1e-6 keeps the argmax alone */
    ls_sampling s1 = smp_of(1.f, -1, 1e-6f, 0.f);
    assert_int_equal(fast_vs_old(V, x, 0, &s1, NULL, 0, 64, 7, 1), 1);
    /* bans (-inf) inside the top_k and the nucleus */
    int32_t ban[40];
    int top = 0;
    for (int i = 1; i < V; i++) if (x[i] > x[top]) top = i;
    ban[0] = top;
    for (int j = 1; j < 40; j++) ban[j] = (j * 131) % V;
    ls_sampling sb = smp_of(0.8f, 30, 0.9f, 0.f);
    fast_vs_old(V, x, 0, &sb, ban, 40, 200, 900, 0);
    sb = smp_of(1.0f, -1, 0.6f, 0.f);
    fast_vs_old(V, x, 1, &sb, ban, 40, 200, 1900, 0);
}

/* All logits equal: the kept set is the lowest ids (top_k 7: ids 0..6; top_p: the first
 * ceil(top_p · V) ids), every one of them drawn. */
static void test_fast_flat_rows_keep_the_lowest_ids(void **st) {
    (void)st;
    NEED_GPU();
    static float x[V];
    for (int i = 0; i < V; i++) x[i] = 1.5f;
    ls_sampling s = smp_of(1.f, 7, 1.f, 0.f);
    assert_int_equal(fast_vs_old(V, x, 1, &s, NULL, 0, 300, 1, 1), 7);
    s = smp_of(0.7f, -1, 0.001f, 0.f); /* 0.001 · 5003 = 5.003: six tokens */
    assert_int_equal(fast_vs_old(V, x, 0, &s, NULL, 0, 300, 2, 1), 6);
    s = smp_of(1.f, 300, 0.01f, 0.f); /* 3 of the 300 */
    assert_int_equal(fast_vs_old(V, x, 0, &s, NULL, 0, 300, 3, 1), 3);
    s = smp_of(1.f, 2000, 0.5f, 0.f); /* 1000 of the 2000: a histogram top_p inside a top_k */
    fast_vs_old(V, x, 1, &s, NULL, 0, 200, 4, 0);
}

/* A near-tie at the top_p boundary, exact in both arithmetics: three tokens of logit 0 (mass 1
 * each, ids 10 < 20 < 30), the rest at -30 (mass 9.4e-14 each: below 2^-41, zero in the fixed
 * point, 4.7e-10 of the host's z). top_p = the float nearest 2/3 (a little above: lim =
 * 2.00000006) needs the third token; the float below it (lim = 1.99999988) does not. */
static void test_fast_top_p_near_tie_at_the_boundary(void **st) {
    (void)st;
    NEED_GPU();
    static float x[V];
    for (int i = 0; i < V; i++) x[i] = -30.f;
    x[10] = x[20] = x[30] = 0.f;
    const float above = 2.f / 3.f, below = nextafterf(above, 0.f);
    assert_true((double)above * 3 > 2.0 && (double)below * 3 < 2.0);
    ls_sampling s = smp_of(1.f, -1, above, 0.f);
    assert_int_equal(fast_vs_old(V, x, 0, &s, NULL, 0, 200, 50, 1), 3);
    s.top_p = below;
    assert_int_equal(fast_vs_old(V, x, 0, &s, NULL, 0, 200, 50, 1), 2);
    s.top_k = 3; /* the same cut inside a top_k set */
    assert_int_equal(fast_vs_old(V, x, 1, &s, NULL, 0, 200, 60, 1), 2);
    s.top_p = above;
    assert_int_equal(fast_vs_old(V, x, 1, &s, NULL, 0, 200, 60, 1), 3);
}

/* 248320-wide rows (the Qwen3.5 vocabulary: the id half of the key searched below bit 18) at
 * batch 16 with mixed parameters: the fast form equals the old cluster form (tokens, logprobs,
 * top logprobs), and each row alone at batch 1 draws what it drew in the batch. */
static void test_fast_full_vocab_batch_16_mixed(void **st) {
    (void)st;
    NEED_GPU();
    enum { R = 16 };
    float *x = malloc(sizeof(float) * (size_t)R * VB);
    srand(17);
    for (size_t i = 0; i < (size_t)R * VB; i++) {
        float u = (float)rand() / RAND_MAX;
        x[i] = bf16_to_f32(f32_to_bf16(12.f * u * u * u - 2.f));
    }
    for (int i = 0; i < VB; i++) x[(size_t)4 * VB + i] = 2.f;                      /* row 4: flat */
    for (int i = 0; i < VB; i++) /* row 5: the bench's */
        x[(size_t)5 * VB + i] = bf16_to_f32(f32_to_bf16(8.f * (float)rand() / RAND_MAX));
    ls_sampling s[R];
    const struct { float t; int k; float p, mp; int lp; } cs[R] = {
        {0.7f, 20, 0.95f, 0.f, 0}, {0.7f, -1, 0.9f, 0.f, 5}, {0.7f, 50, 0.95f, 0.f, 0}, {1.0f, 20, 1.f, 0.f, 20},
        {1.0f, 20, 0.5f, 0.f, 20}, {0.7f, -1, 0.9f, 0.f, 0}, {1.0f, 4096, 1.f, 0.f, 0}, {1.0f, -1, 1e-6f, 0.f, 1},
        {1.0f, -1, 0.999999f, 0.f, 0}, {0.9f, 20, 0.8f, 0.1f, 0}, {0.f, -1, 1.f, 0.f, 3}, {1.3f, -1, 1.f, 0.f, 0},
        {0.7f, 64, 0.95f, 0.f, 0}, {0.7f, 2000, 0.95f, 0.f, 0}, {1.0f, -1, 1.f, 0.05f, 0}, {0.5f, 20, 0.8f, 0.f, 20},
    };
    smp_row p[R];
    for (int r = 0; r < R; r++) {
        s[r] = smp_of(cs[r].t, cs[r].k, cs[r].p, cs[r].mp);
        s[r].logprobs = 1;
        s[r].top_logprobs = cs[r].lp;
        p[r] = row_from(&s[r]);
        p[r].seed = 300 + r;
        p[r].counter = 11;
    }
    const int32_t ban[] = {3, 77, 1000, 240000};
    p[12].ban_off = 0; p[12].n_ban = 4;
    smp_out of[R], oo[R], o2[R], o1;
    dev_sample_with(g_fast, VB, x, R, 1, p, ban, 4, of);
    dev_sample_with(&sample_cuda_block, VB, x, R, 1, p, ban, 4, oo);
    /* with or without the bound: the same thresholds, so the same results; the row in shared
     * memory: the same tokens, draws and top ids (its Z of a greedy row sums in another order:
     * logprobs within 1e-6) */
    const sample_impl *same[] = {&sample_cuda_fast, &sample_cuda_fast_lb, &sample_cuda_fast_sm, &sample_cuda_fast_smlb};
    for (int f = 0; f < 4; f++) {
        if (same[f] == g_fast) continue;
        const int sm_f = same[f] == &sample_cuda_fast_sm || same[f] == &sample_cuda_fast_smlb;
        const int sm_g = g_fast == &sample_cuda_fast_sm || g_fast == &sample_cuda_fast_smlb;
        const int exact = sm_f == sm_g;
        dev_sample_with(same[f], VB, x, R, 1, p, ban, 4, o2);
        for (int r = 0; r < R; r++) {
            assert_int_equal(o2[r].token, of[r].token);
            if (exact) assert_int_equal(memcmp(&o2[r].logprob, &of[r].logprob, sizeof(float)), 0);
            else assert_true(fabsf(o2[r].logprob - of[r].logprob) <= 1e-6f * fmaxf(1.f, fabsf(of[r].logprob)));
            assert_int_equal(o2[r].n_top, of[r].n_top);
            for (int i = 0; i < of[r].n_top; i++) assert_int_equal(o2[r].top_ids[i], of[r].top_ids[i]);
        }
    }
    for (int r = 0; r < R; r++) {
        assert_int_equal(of[r].bad_idx, -1);
        if (of[r].token != oo[r].token)
            fprintf(stderr, "  row %d: cluster %d, one block %d\n", r, of[r].token, oo[r].token);
        assert_int_equal(of[r].token, oo[r].token);
        assert_true(fabsf(of[r].logprob - oo[r].logprob) < 1e-5f);
        assert_int_equal(of[r].n_top, oo[r].n_top);
        for (int i = 0; i < of[r].n_top; i++) {
            assert_int_equal(of[r].top_ids[i], oo[r].top_ids[i]);
            assert_true(fabsf(of[r].top_lp[i] - oo[r].top_lp[i]) < 1e-5f);
        }
        dev_sample_with(g_fast, VB, x + (size_t)r * VB, 1, 1, &p[r], ban, 4, &o1);
        assert_int_equal(o1.token, of[r].token);
        assert_int_equal(memcmp(&o1.logprob, &of[r].logprob, sizeof(float)), 0);
    }
    for (int i = 0; i < 20; i++) assert_int_equal(of[4].top_ids[i], i); /* the flat row: ids ascending */
    assert_true(of[4].token >= 0 && of[4].token < 20);
    /* the draws lie in the host's kept sets */
    smp_ctx *c = smp_new(VB);
    int32_t *ids = malloc(sizeof(int32_t) * VB);
    double *probs = malloc(sizeof(double) * VB);
    for (int r = 0; r < R; r++) {
        if (!(s[r].temperature > 0)) continue;
        float *xr = x + (size_t)r * VB;
        float keep[4];
        if (r == 12) for (int j = 0; j < 4; j++) { keep[j] = xr[ban[j]]; xr[ban[j]] = -INFINITY; }
        int n = smp_filtered_dist(c, xr, &s[r], ids, probs), in = 0;
        if (r == 12) for (int j = 0; j < 4; j++) xr[ban[j]] = keep[j];
        for (int i = 0; i < n; i++) in |= ids[i] == of[r].token;
        if (!in) fprintf(stderr, "  row %d: token %d not in the host's %d kept\n", r, of[r].token, n);
        assert_true(in);
    }
    free(ids); free(probs); smp_free(c); free(x);
}

/* ---- constrained rows: grammar masks and logit_bias (smp_row.n_mask / n_bias, S9) ----------
 * The host oracle is smp_sample_ex with the same smp_edit (bias added to the raw logits, then
 * refused ids -inf, before bans / penalties / temperature / filters / logprobs). The table is
 * laid out as the engine stages it (eg_stage_row): a row's mask words, then its bias ids and
 * their float bits, all in toks. */

/* Append a mask (words of V ids) and a bias list to toks at *nt; p's offsets set. */
static void stage_edit(smp_row *p, int32_t *toks, int *nt, const uint32_t *mask, int vocab, const int32_t *bid,
                       const float *bv, int nb) {
    const int W = (vocab + 31) / 32;
    if (mask) {
        p->mask_off = *nt;
        p->n_mask = W;
        memcpy(toks + *nt, mask, sizeof(uint32_t) * W);
        *nt += W;
    }
    if (nb) {
        p->bias_off = *nt;
        p->n_bias = nb;
        memcpy(toks + *nt, bid, sizeof(int32_t) * nb);
        memcpy(toks + *nt + nb, bv, sizeof(float) * nb);
        *nt += 2 * nb;
    }
}

static void mask_set(uint32_t *m, int id, int on) {
    if (on) m[id >> 5] |= 1u << (id & 31);
    else m[id >> 5] &= ~(1u << (id & 31));
}

/* The device row against the host: greedy (or forced to the device's draw) token, logprob,
 * top logprobs; a draw must lie in the host's kept set of the edited row. */
static void check_vs_host(int vocab, const float *x, const ls_sampling *s, const smp_hist *h, const int32_t *ban,
                          int n_ban, const smp_edit *ed, const smp_out *o, const char *what) {
    smp_ctx *c = smp_new(vocab);
    smp_rng rng;
    smp_rng_seed(&rng, 1);
    smp_result hr;
    ls_err e = {0};
    const int greedy = !(s->temperature > 0) || s->top_k == 1;
    assert_int_equal(o->bad_idx, -1);
    assert_int_equal(smp_sample_ex(c, x, s, h, ban, n_ban, ed, &rng, greedy ? -1 : o->token, &hr, &e), 0);
    if (o->token != hr.token || o->n_top != hr.n_top)
        fprintf(stderr, "  %s: device %d (lp %g, %d top), host %d (lp %g, %d top)\n", what, o->token,
                (double)o->logprob, o->n_top, hr.token, (double)hr.logprob, hr.n_top);
    assert_int_equal(o->token, hr.token);
    if (s->logprobs || s->top_logprobs > 0) assert_true(fabsf(o->logprob - hr.logprob) < 1e-4f);
    assert_int_equal(o->n_top, hr.n_top);
    for (int i = 0; i < hr.n_top; i++) {
        assert_int_equal(o->top_ids[i], hr.top_ids[i]);
        assert_true(fabsf(o->top_lp[i] - hr.top_logprobs[i]) < 1e-4f);
    }
    if (ed && ed->allow) assert_true((ed->allow[o->token >> 5] >> (o->token & 31)) & 1u);
    if (!greedy) { /* the kept set of the edited row */
        float *xe = malloc(sizeof(float) * vocab);
        memcpy(xe, x, sizeof(float) * vocab);
        for (int i = 0; ed && i < ed->n_bias; i++) xe[ed->bias_ids[i]] += ed->bias[i];
        for (int i = 0; ed && ed->allow && i < vocab; i++)
            if (!((ed->allow[i >> 5] >> (i & 31)) & 1u)) xe[i] = -INFINITY;
        for (int i = 0; i < n_ban; i++) xe[ban[i]] = -INFINITY;
        int32_t *ids = malloc(sizeof(int32_t) * vocab);
        double *probs = malloc(sizeof(double) * vocab);
        int n = smp_filtered_dist(c, xe, s, ids, probs), in = 0;
        for (int i = 0; i < n; i++) in |= ids[i] == o->token && probs[i] > 0;
        assert_true(in);
        free(xe); free(ids); free(probs);
    }
    smp_free(c);
}

enum { RM = 8 };
static void test_masked_and_biased_rows_match_the_host_sampler(void **st) {
    (void)st;
    NEED_GPU();
    enum { W = (V + 31) / 32 };
    static float x[RM * V];
    fill(x, RM, 21, 6.f);
    for (int i = 0; i < RM * V; i++) x[i] = bf16_to_f32(f32_to_bf16(x[i])); /* the same row in both dtypes */
    static uint32_t mask[RM][W];
    srand(5);
    for (int r = 0; r < RM; r++)
        for (int i = 0; i < V; i++) mask_set(mask[r], i, rand() % 3 == 0); /* a third allowed */
    /* row 0: the raw argmax refused; row 1: three ids (fewer than its 10 top logprobs) */
    int am = 0;
    for (int i = 1; i < V; i++) if (x[i] > x[am]) am = i;
    mask_set(mask[0], am, 0);
    memset(mask[1], 0, sizeof mask[1]);
    mask_set(mask[1], 10, 1); mask_set(mask[1], 2000, 1); mask_set(mask[1], V - 1, 1);
    memset(mask[5], 0, sizeof mask[5]);
    mask_set(mask[5], 4321, 1);
    memset(mask[6], 0xff, sizeof mask[6]);
    int am2 = 0;
    for (int i = 1; i < V; i++) if (x[2 * V + i] > x[2 * V + am2]) am2 = i;
    int a3 = -1, r3 = -1; /* row 3: an allowed id and a refused one */
    for (int i = 100; i < V && (a3 < 0 || r3 < 0); i++) {
        int on = (mask[3][i >> 5] >> (i & 31)) & 1;
        if (on && a3 < 0) a3 = i;
        if (!on && r3 < 0) r3 = i;
    }
    const int32_t b2id[] = {am2, 77}, b3id[] = {a3, r3, 4999};
    const float b2v[] = {-100.f, 30.f}, b3v[] = {20.f, 50.f, -3.5f};
    const int32_t ban3[] = {a3}, rep3[] = {5, 9, 123, 77};
    ls_sampling s[RM];
    for (int r = 0; r < RM; r++) {
        ls_sampling_default(&s[r]);
        s[r].temperature = 0;
        s[r].logprobs = 1;
        s[r].top_logprobs = 5;
    }
    s[1].top_logprobs = 10;
    s[3].repetition_penalty = 1.5f;
    s[4].temperature = 0.8f; s[4].top_k = 40; s[4].top_p = 0.9f; s[4].top_logprobs = 3;
    s[5].temperature = 1.0f;
    s[6].temperature = 0.7f; s[6].top_p = 0.9f;
    s[7] = s[6];
    s[7].logprobs = 0; s[7].top_logprobs = 0; /* and greedy-free: the draw's fast paths */
    s[6].logprobs = 0; s[6].top_logprobs = 0;
    static int32_t toks[RM * (W + 16)];
    int nt = 0;
    smp_row p[RM];
    smp_edit ed[RM];
    memset(ed, 0, sizeof ed);
    for (int r = 0; r < RM; r++) {
        p[r] = row_from(&s[r]);
        p[r].seed = 9;
        p[r].counter = 2;
    }
    const int with_mask[RM] = {1, 1, 0, 1, 1, 1, 1, 0};
    for (int r = 0; r < RM; r++) {
        const int32_t *bid = r == 2 ? b2id : r == 3 ? b3id : NULL;
        const float *bv = r == 2 ? b2v : r == 3 ? b3v : NULL;
        int nb = r == 2 ? 2 : r == 3 ? 3 : 0;
        stage_edit(&p[r], toks, &nt, with_mask[r] ? mask[r] : NULL, V, bid, bv, nb);
        ed[r] = (smp_edit){.allow = with_mask[r] ? mask[r] : NULL, .bias_ids = bid, .bias = bv, .n_bias = nb};
    }
    p[3].ban_off = nt; p[3].n_ban = 1; toks[nt++] = ban3[0];
    p[3].rep_off = nt; p[3].n_rep = 4; for (int i = 0; i < 4; i++) toks[nt++] = rep3[i];
    smp_out o[RM];
    for (int bf = 0; bf < 2; bf++) {
        dev_sample(x, RM, bf, p, toks, nt, o);
        for (int r = 0; r < RM; r++) {
            char what[48];
            snprintf(what, sizeof what, "row %d (%s)", r, bf ? "BF16" : "fp32");
            smp_hist h = {rep3, r == 3 ? 4 : 0, NULL, 0};
            if (r < 6)
                check_vs_host(V, x + (size_t)r * V, &s[r], &h, r == 3 ? ban3 : NULL, r == 3 ? 1 : 0, &ed[r], &o[r],
                              what);
        }
        assert_int_not_equal(o[0].token, am);     /* refused */
        assert_int_equal(o[1].n_top, 3);          /* only allowed ids are listed */
        assert_int_equal(o[2].token, 77);         /* the bias made it the best */
        assert_int_not_equal(o[3].token, a3);     /* biased to the top, but banned */
        assert_int_equal(o[5].token, 4321);       /* the one allowed id, probability 1 */
        assert_true(fabsf(o[5].logprob) < 1e-6f);
        /* an all-ones mask changes nothing: row 6 draws row 7's token (same seed, same row data) */
    }
    memcpy(x + 7 * (size_t)V, x + 6 * (size_t)V, sizeof(float) * V);
    for (int bf = 0; bf < 2; bf++) {
        dev_sample(x, RM, bf, p, toks, nt, o);
        assert_int_equal(o[6].token, o[7].token);
        assert_int_equal(memcmp(&o[6].logprob, &o[7].logprob, sizeof(float)), 0);
    }
}

/* Full-vocabulary BF16 rows (248320 ids: the 16-byte loads, each cluster block's share, the row
 * in shared memory) with masks shaped like a grammar's (runs of allowed ids, a few sparse ones),
 * biases and bans, at batch 12: every form gives the one-block form's tokens (seeded draws
 * too), logprobs and top logprobs, the greedy and forced ones the host's. */
static void test_masked_full_vocab_rows_agree_across_forms_and_with_the_host(void **st) {
    (void)st;
    NEED_GPU();
    enum { R = 12, WB = (VB + 31) / 32 };
    float *x = malloc(sizeof(float) * (size_t)R * VB);
    srand(23);
    for (size_t i = 0; i < (size_t)R * VB; i++) {
        float u = (float)rand() / RAND_MAX;
        x[i] = bf16_to_f32(f32_to_bf16(12.f * u * u * u - 2.f));
    }
    uint32_t *mask = calloc((size_t)R * WB, sizeof(uint32_t));
    for (int r = 0; r < R; r++) {
        uint32_t *m = mask + (size_t)r * WB;
        const int runs = r % 3 == 0 ? 1 : 8, len = r % 3 == 0 ? 150000 : 40 + 300 * r;
        for (int k = 0; k < runs; k++) {
            int a = (rand() % (VB - len));
            for (int i = a; i < a + len; i++) mask_set(m, i, 1);
        }
        for (int k = 0; k < 50; k++) mask_set(m, rand() % VB, 1);
        mask_set(m, VB - 1, 1); /* the last word's last id */
    }
    const struct { float t; int k; float p, mp; int lp; int bias; } cs[R] = {
        {0.f, -1, 1.f, 0.f, 0, 0},   {0.f, -1, 1.f, 0.f, 5, 0},    {0.f, -1, 1.f, 0.f, 20, 1},
        {0.7f, 20, 0.95f, 0.f, 0, 0}, {0.7f, -1, 0.9f, 0.f, 5, 0},  {1.0f, -1, 1.f, 0.f, 0, 1},
        {1.0f, 50, 1.f, 0.f, 3, 0},  {0.7f, 20, 0.95f, 0.f, 0, 1}, {1.0f, -1, 1.f, 0.05f, 0, 0},
        {0.f, -1, 1.f, 0.f, 20, 0},  {0.9f, 4096, 0.8f, 0.f, 0, 0}, {0.f, 1, 1.f, 0.f, 1, 1},
    };
    int32_t *toks = malloc(sizeof(int32_t) * ((size_t)R * (WB + 16) + 16));
    int nt = 0;
    ls_sampling s[R];
    smp_row p[R];
    smp_edit ed[R];
    int32_t bid[R][3];
    float bv[R][3] = {{0}};
    for (int r = 0; r < R; r++) {
        s[r] = smp_of(cs[r].t, cs[r].k, cs[r].p, cs[r].mp);
        s[r].logprobs = cs[r].lp > 0; /* row 0: plain greedy, the widen's argmax of the masked row */
        s[r].top_logprobs = cs[r].lp;
        p[r] = row_from(&s[r]);
        p[r].seed = 500 + r;
        p[r].counter = 4;
        const uint32_t *m = mask + (size_t)r * WB;
        int nb = 0;
        if (cs[r].bias) { /* an allowed id lifted to the top, a refused one too (stays refused), one lowered */
            int a = -1, q = -1;
            for (int i = 1000 + 97 * r; i < VB && (a < 0 || q < 0); i++) {
                int on = (m[i >> 5] >> (i & 31)) & 1;
                if (on && a < 0) a = i;
                if (!on && q < 0) q = i;
            }
            bid[r][0] = a; bv[r][0] = 25.f;
            bid[r][1] = q; bv[r][1] = 90.f;
            bid[r][2] = VB - 1; bv[r][2] = -7.25f;
            nb = 3;
        }
        stage_edit(&p[r], toks, &nt, m, VB, bid[r], bv[r], nb);
        ed[r] = (smp_edit){.allow = m, .bias_ids = bid[r], .bias = bv[r], .n_bias = nb};
    }
    const int32_t ban[] = {VB - 1, 7};
    p[9].ban_off = nt; p[9].n_ban = 2; toks[nt++] = ban[0]; toks[nt++] = ban[1];
    smp_out ob[R], ow[R];
    dev_sample_with(&sample_cuda_block, VB, x, R, 1, p, toks, nt, ob);
    const sample_impl *forms[] = {&sample_cuda, &sample_cuda_fast, &sample_cuda_fast_lb, &sample_cuda_fast_sm,
                                  &sample_cuda_fast_smlb};
    for (int f = 0; f < 5; f++) {
        /* the shared-memory forms hold at most 8 rows: the first 8 alone */
        const int rows = f >= 3 ? 8 : R;
        dev_sample_with(forms[f], VB, x, rows, 1, p, toks, nt, ow);
        for (int r = 0; r < rows; r++) {
            if (ow[r].token != ob[r].token) fprintf(stderr, "  form %d row %d: %d, one block %d\n", f, r, ow[r].token, ob[r].token);
            assert_int_equal(ow[r].bad_idx, -1);
            assert_int_equal(ow[r].token, ob[r].token);
            assert_true(fabsf(ow[r].logprob - ob[r].logprob) < 1e-5f);
            assert_int_equal(ow[r].n_top, ob[r].n_top);
            for (int i = 0; i < ob[r].n_top; i++) {
                assert_int_equal(ow[r].top_ids[i], ob[r].top_ids[i]);
                assert_true(fabsf(ow[r].top_lp[i] - ob[r].top_lp[i]) < 1e-5f);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        char what[32];
        snprintf(what, sizeof what, "full-vocab row %d", r);
        smp_hist h = {0};
        check_vs_host(VB, x + (size_t)r * VB, &s[r], &h, r == 9 ? ban : NULL, r == 9 ? 2 : 0, &ed[r], &ob[r], what);
    }
    free(x); free(mask); free(toks);
}

static int setup_block(void **st) { (void)st; g_impl = &sample_cuda_block; return 0; }
static int setup_fast(void **st) { (void)st; g_impl = g_fast = &sample_cuda_fast; return 0; }
static int setup_fast_sm(void **st) { (void)st; g_impl = g_fast = &sample_cuda_fast_sm; return 0; }
static int setup_fast_lb(void **st) { (void)st; g_impl = g_fast = &sample_cuda_fast_lb; return 0; }
static int setup_fast_smlb(void **st) { (void)st; g_impl = g_fast = &sample_cuda_fast_smlb; return 0; }
static int setup_engine(void **st) { (void)st; g_impl = &sample_cuda; return 0; }

/* `test_sample_cuda --bench`: microseconds a call over 248320-wide BF16 rows, batch 1 and 16,
 * eager launches back to back: greedy and sampled modes, the cluster form with the row in global
 * memory (sample_cuda_fast) and in shared memory (sample_cuda_fast_sm), each without and with the
 * top_k / top logprobs bound (_lb, _smlb), on two rows: uniform in
 * [0, 8) (BF16: ~1000 ties a value, the id half of the key searched) and a long-tailed one (12 u^3
 * - 2: a few high logits, the shape of a model's). The one-block form only for greedy (its
 * sampled rows take hundreds of µs). */
#include <time.h>
static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static int bench(void) {
    if (!have_gpu()) return 1;
    ls_err e = {0};
    const int BMAX = 16;
    size_t n = (size_t)BMAX * VB;
    uint16_t *h = malloc(n * 2);
    void *dx = g_mem->alloc(n * 2, &e), *dw = g_mem->alloc(n * 4, &e), *dp = g_mem->alloc(sizeof(smp_row) * BMAX, &e);
    void *dout = g_mem->alloc(sizeof(smp_out) * BMAX, &e), *dt = g_mem->alloc(16, &e);
    if (!dx || !dw || !dp || !dout || !dt) { fprintf(stderr, "bench: %s\n", e.msg); return 1; }
    const sample_impl *impls[] = {&sample_cuda_block, &sample_cuda_fast, &sample_cuda_fast_lb, &sample_cuda_fast_sm,
                                  &sample_cuda_fast_smlb};
    enum { NI = 5 }; /* the row-0 tokens of the last three checked against the first cluster form's */
    static const struct { const char *name; float t; int k; float p, mp; } modes[] = {
        {"greedy", 0.f, -1, 1.f, 0.f},
        {"T 0.7 top_p 0.9", 0.7f, -1, 0.9f, 0.f},
        {"T 0.7 top_k 50 top_p 0.95", 0.7f, 50, 0.95f, 0.f},
        {"T 0.7 top_k 20 top_p 0.95", 0.7f, 20, 0.95f, 0.f},
        {"T 0.7 top_k 20", 0.7f, 20, 1.f, 0.f},
        {"T 0.7 top_k 20 min_p 0.05", 0.7f, 20, 1.f, 0.05f},
        {"T 0.7 top_p 0.8 min_p 0.05", 0.7f, -1, 0.8f, 0.05f},
        {"T 0.7 (no filter)", 0.7f, -1, 1.f, 0.f}, /* the passes around the thresholds: max, Z, draw */
    };
    for (int data = 0; data < 2; data++) {
        srand(9);
        for (size_t i = 0; i < n; i++) {
            float u = (float)rand() / RAND_MAX;
            h[i] = f32_to_bf16(data ? 12.f * u * u * u - 2.f : 8.f * u);
        }
        g_mem->h2d(dx, h, n * 2, g_st, &e);
        for (int mode = 0; mode < (int)(sizeof modes / sizeof modes[0]); mode++)
            for (int bi = 0; bi < 2; bi++) {
                int b = bi ? 16 : 1;
                ls_sampling s = smp_of(modes[mode].t, modes[mode].k, modes[mode].p, modes[mode].mp);
                smp_row p[16];
                for (int r = 0; r < b; r++) { p[r] = row_from(&s); p[r].seed = 5 + r; }
                g_mem->h2d(dp, p, sizeof(smp_row) * b, g_st, &e);
                double us[NI] = {0};
                int tok[NI];
                for (int k = 0; k < NI; k++) tok[k] = -1;
                for (int k = mode ? 1 : 0; k < NI; k++) {
                    sample_args a = {.rows = b, .vocab = VB, .logits = dx, .dt = ACT_BF16, .p = dp, .toks = dt,
                                     .work = dw, .out = dout};
                    const int IT = 200;
                    for (int it = 0; it < 5; it++) impls[k]->run(&a, g_st, &e);
                    g_mem->sync(g_st, &e);
                    double t0 = now_us();
                    for (int it = 0; it < IT; it++) impls[k]->run(&a, g_st, &e);
                    if (g_mem->sync(g_st, &e)) { fprintf(stderr, "bench: %s\n", e.msg); return 1; }
                    us[k] = (now_us() - t0) / IT;
                    smp_out o;
                    g_mem->d2h(&o, dout, sizeof o, g_st, &e);
                    tok[k] = o.token;
                }
                char blk[40] = "";
                if (!mode) snprintf(blk, sizeof blk, ", one block %.1f us", us[0]);
                printf("sampler V=%d %-6s batch %2d %-27s: global row %5.1f us, + bound %5.1f (x%.2f); row in shared "
                       "memory %5.1f (x%.2f), + bound %5.1f (x%.2f)%s%s, row 0 tokens %d %d %d %d\n",
                       VB, data ? "tailed" : "flat8", b, modes[mode].name, us[1], us[2], us[1] / us[2], us[3],
                       us[1] / us[3], us[4], us[1] / us[4],
                       tok[2] == tok[1] && tok[3] == tok[1] && tok[4] == tok[1] ? "" : " MISMATCH", blk, tok[1], tok[2],
                       tok[3], tok[4]);
            }
    }
    g_mem->free(dx); g_mem->free(dw); g_mem->free(dp); g_mem->free(dout); g_mem->free(dt);
    free(h);
    return 0;
}

/* `test_sample_cuda --bench-mask`: microseconds a call of the engine's sampler (sample_cuda) over
 * tailed 248320-wide BF16 rows at batch 1 and 16, eager launches back to back: no edits, a
 * grammar mask of 150k allowed ids (a JSON string state), one of ~500 (a structural state), and
 * the sparse mask with 3 logit_bias entries; the rows' tables staged as eg_stage_row does. */
static int bench_mask(void) {
    if (!have_gpu()) return 1;
    ls_err e = {0};
    enum { BM = 16, WB = (VB + 31) / 32 };
    size_t n = (size_t)BM * VB;
    uint16_t *h = malloc(n * 2);
    srand(9);
    for (size_t i = 0; i < n; i++) {
        float u = (float)rand() / RAND_MAX;
        h[i] = f32_to_bf16(12.f * u * u * u - 2.f);
    }
    uint32_t *dense = calloc(WB, 4), *sparse = calloc(WB, 4);
    for (int i = 50000; i < 200000; i++) mask_set(dense, i, 1);
    for (int k = 0; k < 500; k++) mask_set(sparse, (k * 7919) % VB, 1);
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)BM * (WB + 8));
    void *dx = g_mem->alloc(n * 2, &e), *dw = g_mem->alloc(n * 4, &e), *dp = g_mem->alloc(sizeof(smp_row) * BM, &e);
    void *dout = g_mem->alloc(sizeof(smp_out) * BM, &e), *dt = g_mem->alloc(sizeof(int32_t) * (size_t)BM * (WB + 8), &e);
    if (!dx || !dw || !dp || !dout || !dt) { fprintf(stderr, "bench-mask: %s\n", e.msg); return 1; }
    g_mem->h2d(dx, h, n * 2, g_st, &e);
    static const struct { const char *name; float t; int k; float p; int lp; } modes[] = {
        {"greedy", 0.f, -1, 1.f, 0},
        {"greedy + 5 top logprobs", 0.f, -1, 1.f, 5},
        {"T 0.7 top_k 20 top_p 0.95", 0.7f, 20, 0.95f, 0},
        {"T 1.0 (no filter)", 1.0f, -1, 1.f, 0},
    };
    static const char *edits[] = {"none", "mask 150k", "mask 500", "mask 500 + bias"};
    const int32_t bid[] = {7919, 15838, 100};
    const float bv[] = {5.f, -5.f, 50.f};
    for (size_t mode = 0; mode < sizeof modes / sizeof modes[0]; mode++)
        for (int bi = 0; bi < 2; bi++) {
            const int b = bi ? 16 : 1;
            double us[4];
            int tok[4];
            for (int ed = 0; ed < 4; ed++) {
                ls_sampling s = smp_of(modes[mode].t, modes[mode].k, modes[mode].p, 0.f);
                s.logprobs = modes[mode].lp > 0;
                s.top_logprobs = modes[mode].lp;
                smp_row p[BM];
                int nt = 0;
                for (int r = 0; r < b; r++) {
                    p[r] = row_from(&s);
                    p[r].seed = 5 + r;
                    if (ed) stage_edit(&p[r], toks, &nt, ed == 1 ? dense : sparse, VB, bid, bv, ed == 3 ? 3 : 0);
                }
                g_mem->h2d(dp, p, sizeof(smp_row) * b, g_st, &e);
                if (nt) g_mem->h2d(dt, toks, sizeof(int32_t) * nt, g_st, &e);
                sample_args a = {.rows = b, .vocab = VB, .logits = dx, .dt = ACT_BF16, .p = dp, .toks = dt, .work = dw,
                                 .out = dout};
                const int IT = 200;
                for (int it = 0; it < 5; it++) sample_cuda.run(&a, g_st, &e);
                g_mem->sync(g_st, &e);
                double t0 = now_us();
                for (int it = 0; it < IT; it++) sample_cuda.run(&a, g_st, &e);
                if (g_mem->sync(g_st, &e)) { fprintf(stderr, "bench-mask: %s\n", e.msg); return 1; }
                us[ed] = (now_us() - t0) / IT;
                smp_out o;
                g_mem->d2h(&o, dout, sizeof o, g_st, &e);
                tok[ed] = o.token;
            }
            printf("sampler+mask V=%d batch %2d %-26s:", VB, b, modes[mode].name);
            for (int ed = 0; ed < 4; ed++) printf(" %s %5.1f us%s", edits[ed], us[ed], ed < 3 ? "," : "");
            printf("  (row 0 tokens %d %d %d %d)\n", tok[0], tok[1], tok[2], tok[3]);
        }
    g_mem->free(dx); g_mem->free(dw); g_mem->free(dp); g_mem->free(dout); g_mem->free(dt);
    free(h); free(dense); free(sparse); free(toks);
    return 0;
}

/* `test_sample_cuda --phases`: where a sampled row's time goes in the form with the row in shared
 * memory (sample_cuda_profile: rank 0's clock64 at each phase boundary), a tailed 248320-wide
 * BF16 row at batch 1, the median of 21 launches a mode; µs at 1.98 GHz (the H200's SM clock
 * in the device rounds; the cycles are printed too). */
static int phases(void) {
    if (!have_gpu()) return 1;
    ls_err e = {0};
    uint16_t *h = malloc((size_t)VB * 2);
    srand(9);
    for (int i = 0; i < VB; i++) {
        float u = (float)rand() / RAND_MAX;
        h[i] = f32_to_bf16(12.f * u * u * u - 2.f);
    }
    void *dx = g_mem->alloc((size_t)VB * 2, &e), *dw = g_mem->alloc((size_t)VB * 4, &e);
    void *dp = g_mem->alloc(sizeof(smp_row), &e), *dout = g_mem->alloc(sizeof(smp_out), &e), *dt = g_mem->alloc(16, &e);
    if (!dx || !dw || !dp || !dout || !dt) { fprintf(stderr, "phases: %s\n", e.msg); return 1; }
    g_mem->h2d(dx, h, (size_t)VB * 2, g_st, &e);
    static const struct { const char *name; float t; int k; float p; int lp; } modes[] = {
        {"T 0.7 top_k 20 top_p 0.95", 0.7f, 20, 0.95f, 0}, {"T 0.7 top_k 20", 0.7f, 20, 1.f, 0},
        {"T 0.7 top_p 0.9", 0.7f, -1, 0.9f, 0},            {"T 0.7 (no filter)", 0.7f, -1, 1.f, 0},
        {"T 0.7 top_k 50 top_p 0.95", 0.7f, 50, 0.95f, 0}, {"greedy + 5 top logprobs", 0.f, -1, 1.f, 5},
    };
    static const char *ph[] = {"widen", "max/Z", "top_k", "top_p", "draw sums", "pick", "Z", "top lp", "end"};
    enum { N = 10, RUNS = 21 };
    for (int lb = 0; lb < 2; lb++) {
        for (size_t k = 0; k < sizeof modes / sizeof modes[0]; k++) {
            ls_sampling s = smp_of(modes[k].t, modes[k].k, modes[k].p, 0.f);
            s.logprobs = modes[k].lp > 0;
            s.top_logprobs = modes[k].lp;
            smp_row p = row_from(&s);
            g_mem->h2d(dp, &p, sizeof p, g_st, &e);
            sample_args a = {.rows = 1, .vocab = VB, .logits = dx, .dt = ACT_BF16, .p = dp, .toks = dt, .work = dw,
                             .out = dout};
            long long st[RUNS][N];
            for (int r = 0; r < RUNS; r++)
                if (sample_cuda_profile(&a, g_st, lb, st[r], N, &e) < 0) {
                    fprintf(stderr, "phases: %s\n", e.msg);
                    return 1;
                }
            printf("phases%s %-27s (us at 1.98 GHz, median of %d; cycles from the start in brackets):",
                   lb ? " +bound" : "", modes[k].name, RUNS);
            long long prev = 0;
            for (int j = 1; j < N; j++) {
                long long d[RUNS];
                int nd = 0;
                for (int r = 0; r < RUNS; r++)
                    if (st[r][j]) d[nd++] = st[r][j] - st[r][0];
                if (!nd) continue;
                for (int u = 1; u < nd; u++) /* insertion sort */
                    for (int v = u; v > 0 && d[v] < d[v - 1]; v--) {
                        const long long t = d[v];
                        d[v] = d[v - 1];
                        d[v - 1] = t;
                    }
                const long long med = d[nd / 2];
                printf(" %s %.1f [%lld]", ph[j - 1], (med - prev) / 1980.0, med);
                prev = med;
            }
            printf("\n");
        }
    }
    g_mem->free(dx); g_mem->free(dw); g_mem->free(dp); g_mem->free(dout); g_mem->free(dt);
    free(h);
    return 0;
}

/* `test_sample_cuda --profile`: exactly three launches of the fast form (no warm-up), for a
 * profiler (bench/device/fastsample.sh runs ncu over them): a tailed 248320-wide BF16 row at
 * batch 1 with T 0.7 top_k 20 top_p 0.95, T 0.7 top_p 0.9, and T 0.7 without a filter. */
static int profile(void) {
    if (!have_gpu()) return 1;
    ls_err e = {0};
    uint16_t *h = malloc((size_t)VB * 2);
    srand(9);
    for (int i = 0; i < VB; i++) {
        float u = (float)rand() / RAND_MAX;
        h[i] = f32_to_bf16(12.f * u * u * u - 2.f);
    }
    void *dx = g_mem->alloc((size_t)VB * 2, &e), *dw = g_mem->alloc((size_t)VB * 4, &e);
    void *dp = g_mem->alloc(sizeof(smp_row), &e), *dout = g_mem->alloc(sizeof(smp_out), &e), *dt = g_mem->alloc(16, &e);
    if (!dx || !dw || !dp || !dout || !dt) { fprintf(stderr, "profile: %s\n", e.msg); return 1; }
    g_mem->h2d(dx, h, (size_t)VB * 2, g_st, &e);
    const ls_sampling modes[] = {smp_of(0.7f, 20, 0.95f, 0.f), smp_of(0.7f, -1, 0.9f, 0.f), smp_of(0.7f, -1, 1.f, 0.f)};
    for (int k = 0; k < 3; k++) {
        smp_row p = row_from(&modes[k]);
        g_mem->h2d(dp, &p, sizeof p, g_st, &e);
        sample_args a = {.rows = 1, .vocab = VB, .logits = dx, .dt = ACT_BF16, .p = dp, .toks = dt, .work = dw,
                         .out = dout};
        if (sample_cuda_fast.run(&a, g_st, &e) || g_mem->sync(g_st, &e)) { fprintf(stderr, "profile: %s\n", e.msg); return 1; }
        smp_out o;
        g_mem->d2h(&o, dout, sizeof o, g_st, &e);
        printf("profile launch %d: token %d\n", k, o.token);
    }
    g_mem->free(dx); g_mem->free(dw); g_mem->free(dp); g_mem->free(dout); g_mem->free(dt);
    free(h);
    return 0;
}
#endif

int main(int argc, char **argv) {
#ifdef LS_HAVE_CUDA
    if (argc > 1 && !strcmp(argv[1], "--bench")) return bench();
    if (argc > 1 && !strcmp(argv[1], "--profile")) return profile();
    if (argc > 1 && !strcmp(argv[1], "--phases")) return phases();
    if (argc > 1 && !strcmp(argv[1], "--bench-mask")) return bench_mask();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_logprobs_and_penalties_match_the_host_sampler),
        cmocka_unit_test(test_bf16_ties_go_to_the_lowest_id),
        cmocka_unit_test(test_draws_follow_the_host_distribution),
        cmocka_unit_test(test_seeded_draws_repeat_and_nan_rows_are_reported),
        cmocka_unit_test(test_masked_and_biased_rows_match_the_host_sampler),
    };
    const struct CMUnitTest cross[] = {
        cmocka_unit_test(test_wide_matches_one_block_on_a_full_vocab_row),
        cmocka_unit_test(test_masked_full_vocab_rows_agree_across_forms_and_with_the_host),
    };
    const struct CMUnitTest fast[] = {
        cmocka_unit_test(test_fast_kept_sets_match_the_host_and_the_old_form),
        cmocka_unit_test(test_fast_flat_rows_keep_the_lowest_ids),
        cmocka_unit_test(test_fast_top_p_near_tie_at_the_boundary),
        cmocka_unit_test(test_fast_full_vocab_batch_16_mixed),
    };
    int rc = cmocka_run_group_tests_name("one block a row", tests, setup_block, NULL);
    rc |= cmocka_run_group_tests_name("a cluster a row, wide-digit top_k / top_p", tests, setup_fast, NULL);
    rc |= cmocka_run_group_tests_name("the engine's sampler (sample_cuda: the form the environment picks)", tests,
                                      setup_engine, NULL);
    rc |= cmocka_run_group_tests_name("a cluster a row, the top_k bound", tests, setup_fast_lb, NULL);
    rc |= cmocka_run_group_tests_name("a cluster a row, the row in shared memory", tests, setup_fast_sm, NULL);
    rc |= cmocka_run_group_tests_name("a cluster a row, the row in shared memory, the bound", tests, setup_fast_smlb,
                                      NULL);
    rc |= cmocka_run_group_tests_name("cluster vs block", cross, NULL, NULL);
    rc |= cmocka_run_group_tests_name("wide-digit top_k / top_p vs the one block", fast, setup_fast, NULL);
    rc |= cmocka_run_group_tests_name("the top_k bound vs the one block", fast, setup_fast_lb, NULL);
    rc |= cmocka_run_group_tests_name("the row in shared memory vs the one block", fast, setup_fast_sm, NULL);
    rc |= cmocka_run_group_tests_name("the row in shared memory, the bound, vs the one block", fast, setup_fast_smlb,
                                      NULL);
    return rc;
#else
    (void)argc;
    (void)argv;
    fprintf(stderr, "test_sample_cuda: built without CUDA: nothing to test\n");
    return 0;
#endif
}
