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
    assert_int_equal(g_mem->d2h(out, dout, sizeof(smp_out) * rows, g_st, &e), 0);
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

/* The cluster form against the one-block form on a full Qwen3.5 vocabulary (248320, BF16,
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
        for (int form = 0; form < 2; form++) { /* the cluster form, then with 16-byte passes */
            dev_sample_with(form ? &sample_cuda_wide_vec : &sample_cuda_wide, VB, x, RB, bf, p, toks, 6, ow);
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
    dev_sample_with(&sample_cuda_wide, VB, x, RB, 1, p, toks, 6, ow);
    assert_int_equal(ow[2].bad_idx, 240001);
    assert_int_equal(ow[2].token, -1);
    assert_int_equal(ow[1].bad_idx, -1);
    free(ids); free(probs); smp_free(c);
    free(x); free(ob); free(ow);
}

static int setup_block(void **st) { (void)st; g_impl = &sample_cuda_block; return 0; }
static int setup_wide(void **st) { (void)st; g_impl = &sample_cuda_wide; return 0; }
static int setup_wide_vec(void **st) { (void)st; g_impl = &sample_cuda_wide_vec; return 0; }

/* `test_sample_cuda --bench`: microseconds a call of each form over a 248320-wide BF16 row,
 * batch 1 and 16, greedy and sampled (T 0.7 with top_p 0.9, or top_k 50 and top_p 0.95), eager
 * launches back to back. */
#include <time.h>
static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static int bench(void) {
    if (!have_gpu()) return 1;
    ls_err e = {0};
    const int BMAX = 16, IT = 200;
    size_t n = (size_t)BMAX * VB;
    uint16_t *h = malloc(n * 2);
    srand(9);
    for (size_t i = 0; i < n; i++) h[i] = f32_to_bf16(8.f * (float)rand() / RAND_MAX);
    void *dx = g_mem->alloc(n * 2, &e), *dw = g_mem->alloc(n * 4, &e), *dp = g_mem->alloc(sizeof(smp_row) * BMAX, &e);
    void *dout = g_mem->alloc(sizeof(smp_out) * BMAX, &e), *dt = g_mem->alloc(16, &e);
    if (!dx || !dw || !dp || !dout || !dt) { fprintf(stderr, "bench: %s\n", e.msg); return 1; }
    g_mem->h2d(dx, h, n * 2, g_st, &e);
    const sample_impl *impls[] = {&sample_cuda_block, &sample_cuda_wide, &sample_cuda_wide_vec};
    static const char *const mode_name[] = {"greedy", "T 0.7 top_p 0.9", "T 0.7 top_k 50 top_p 0.95"};
    for (int mode = 0; mode < 3; mode++)
        for (int bi = 0; bi < 2; bi++) {
            int b = bi ? 16 : 1;
            ls_sampling s;
            ls_sampling_default(&s);
            if (mode == 0) s.temperature = 0;
            else { s.temperature = 0.7f; s.top_p = mode == 1 ? 0.9f : 0.95f; s.top_k = mode == 2 ? 50 : -1; }
            smp_row p[16];
            for (int r = 0; r < b; r++) { p[r] = row_from(&s); p[r].seed = 5 + r; }
            g_mem->h2d(dp, p, sizeof(smp_row) * b, g_st, &e);
            double us[3];
            int tok[3];
            for (int k = 0; k < 3; k++) {
                sample_args a = {.rows = b, .vocab = VB, .logits = dx, .dt = ACT_BF16, .p = dp, .toks = dt,
                                 .work = dw, .out = dout};
                for (int it = 0; it < 10; it++) impls[k]->run(&a, g_st, &e);
                g_mem->sync(g_st, &e);
                double t0 = now_us();
                for (int it = 0; it < IT; it++) impls[k]->run(&a, g_st, &e);
                if (g_mem->sync(g_st, &e)) { fprintf(stderr, "bench: %s\n", e.msg); return 1; }
                us[k] = (now_us() - t0) / IT;
                smp_out o;
                g_mem->d2h(&o, dout, sizeof o, g_st, &e);
                tok[k] = o.token;
            }
            printf("sampler V=%d batch %2d %-25s: one block a row %7.1f us, a cluster a row %6.1f us (x%.1f), "
                   "16-byte passes %6.1f us, row 0 token %d / %d / %d\n", VB, b, mode_name[mode], us[0], us[1],
                   us[0] / us[1], us[2], tok[0], tok[1], tok[2]);
        }
    g_mem->free(dx); g_mem->free(dw); g_mem->free(dp); g_mem->free(dout); g_mem->free(dt);
    free(h);
    return 0;
}
#endif

int main(int argc, char **argv) {
#ifdef LS_HAVE_CUDA
    if (argc > 1 && !strcmp(argv[1], "--bench")) return bench();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_logprobs_and_penalties_match_the_host_sampler),
        cmocka_unit_test(test_bf16_ties_go_to_the_lowest_id),
        cmocka_unit_test(test_draws_follow_the_host_distribution),
        cmocka_unit_test(test_seeded_draws_repeat_and_nan_rows_are_reported),
    };
    const struct CMUnitTest cross[] = {
        cmocka_unit_test(test_wide_matches_one_block_on_a_full_vocab_row),
    };
    int rc = cmocka_run_group_tests_name("one block a row", tests, setup_block, NULL);
    rc |= cmocka_run_group_tests_name("a cluster a row", tests, setup_wide, NULL);
    rc |= cmocka_run_group_tests_name("a cluster a row, 16-byte passes", tests, setup_wide_vec, NULL);
    rc |= cmocka_run_group_tests_name("cluster vs block", cross, NULL, NULL);
    return rc;
#else
    (void)argc;
    (void)argv;
    fprintf(stderr, "test_sample_cuda: built without CUDA: nothing to test\n");
    return 0;
#endif
}
