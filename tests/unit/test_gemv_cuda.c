/* test_gemv_cuda.c: the gemm backend cuda_gemv (src/ops/cuda/gemv.cu) against
 * an fp64 product computed here on the host from the same BF16 inputs: the
 * model's decode shapes the doctor does not list (the GDN in_proj_ba weights,
 * N = 2·nv = 128 and 64), partial tiles (N % 16 != 0), K not a multiple of 32
 * (a partial 32-wide column), long K (split over a cluster), both token-tile
 * widths (M = 1, 3, 8, 9, 16); y += x·Wᵀ (accumulate); bitwise identical
 * results over repeated runs (no float atomics); the same bits from a CUDA graph
 * replay as from the eager call; the grouped launch of several weights behind one x
 * (run_multi); a chain of programmatic dependent launches that each read the previous
 * output; and the shapes it refuses, with their reason.
 * Needs a CUDA GPU: every test is skipped without one (CPU CI, NO_CUDA builds).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ops/ops.h"
#define CUDA_TEST_SEED 12345u
#include "cuda_test.h"
#ifdef LS_HAVE_CUDA
#include "ops/cuda/graph.h"
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LS_HAVE_CUDA
static const dev_mem *g_mem;
static ls_stream g_st;
static dev_info g_dev;

static int have_gpu(void) { return cuda_test_gpu("test_gemv_cuda", 9, &g_mem, &g_dev, &g_st); }

static const gemm_impl *gemv(void) {
    const gemm_impl *g = ops_gemm_find("cuda_gemv");
    assert_non_null(g);
    return g;
}

typedef struct gcase {
    int M, N, K;
    uint16_t *w, *x, *y0;   /* host BF16: [N,K], [M,K], [M,N] (the y that accumulate adds to) */
    void *dw, *dx, *dy;
} gcase;

static void case_new(gcase *c, int M, int N, int K) {
    memset(c, 0, sizeof *c);
    c->M = M, c->N = N, c->K = K;
    c->w = malloc(sizeof(uint16_t) * N * K);
    c->x = malloc(sizeof(uint16_t) * M * K);
    c->y0 = malloc(sizeof(uint16_t) * M * N);
    for (size_t i = 0; i < (size_t)N * K; i++) c->w[i] = f32_to_bf16(urand() * 0.05f);
    for (size_t i = 0; i < (size_t)M * K; i++) c->x[i] = f32_to_bf16(urand());
    for (size_t i = 0; i < (size_t)M * N; i++) c->y0[i] = f32_to_bf16(urand());
    ls_err e = {0};
    c->dw = g_mem->alloc(sizeof(uint16_t) * N * K, &e);
    c->dx = g_mem->alloc(sizeof(uint16_t) * M * K, &e);
    c->dy = g_mem->alloc(sizeof(uint16_t) * M * N, &e);
    assert_non_null(c->dw);
    assert_non_null(c->dx);
    assert_non_null(c->dy);
    assert_int_equal(g_mem->h2d(c->dw, c->w, sizeof(uint16_t) * N * K, g_st, &e), 0);
    assert_int_equal(g_mem->h2d(c->dx, c->x, sizeof(uint16_t) * M * K, g_st, &e), 0);
}

static void case_free(gcase *c) {
    g_mem->free(c->dw); g_mem->free(c->dx); g_mem->free(c->dy);
    free(c->w); free(c->x); free(c->y0);
}

/* Run cuda_gemv on c (y preset to y0 when accumulating) and fetch y [M,N]. */
static void case_run(gcase *c, int accumulate, uint16_t *out) {
    ls_err e = {0};
    const size_t yb = sizeof(uint16_t) * c->M * c->N;
    if (accumulate) assert_int_equal(g_mem->h2d(c->dy, c->y0, yb, g_st, &e), 0);
    else assert_int_equal(g_mem->memset0(c->dy, yb, g_st, &e), 0);
    lin_w w = {.kind = W_BF16, .N = c->N, .K = c->K, .data = c->dw, .name = "test"};
    gemm_args a = {.M = c->M, .x = c->dx, .w = &w, .y = c->dy, .accumulate = accumulate, .dt = ACT_BF16};
    int rc = gemv()->run(&a, g_st, &e);
    if (rc) fprintf(stderr, "cuda_gemv M=%d N=%d K=%d: %s\n", c->M, c->N, c->K, e.msg);
    assert_int_equal(rc, 0);
    rc = g_mem->d2h(out, c->dy, yb, g_st, &e);
    if (rc) fprintf(stderr, "cuda_gemv M=%d N=%d K=%d: %s\n", c->M, c->N, c->K, e.msg);
    assert_int_equal(rc, 0);
}

/* Check y against the fp64 product: every output within BF16 rounding of its
 * own value (2^-8 relative) plus 1e-3 of the largest |ref| (fp32 accumulation
 * order). Returns the worst error / max|ref|. */
static double case_check(const gcase *c, int accumulate, const uint16_t *y) {
    double *ref = malloc(sizeof(double) * c->M * c->N), amax = 0;
    float *wf = malloc(sizeof(float) * c->K), *xf = malloc(sizeof(float) * c->M * c->K);
    for (size_t i = 0; i < (size_t)c->M * c->K; i++) xf[i] = bf16_to_f32(c->x[i]);
    for (int n = 0; n < c->N; n++) {
        for (int k = 0; k < c->K; k++) wf[k] = bf16_to_f32(c->w[(size_t)n * c->K + k]);
        for (int m = 0; m < c->M; m++) {
            double s = accumulate ? bf16_to_f32(c->y0[(size_t)m * c->N + n]) : 0.0;
            const float *xr = xf + (size_t)m * c->K;
            for (int k = 0; k < c->K; k++) s += (double)wf[k] * xr[k];
            ref[(size_t)m * c->N + n] = s;
            if (fabs(s) > amax) amax = fabs(s);
        }
    }
    double worst = 0;
    int bad = 0;
    for (int m = 0; m < c->M; m++)
        for (int n = 0; n < c->N; n++) {
            const double r = ref[(size_t)m * c->N + n], v = bf16_to_f32(y[(size_t)m * c->N + n]);
            const double err = fabs(v - r);
            if (!(err <= fabs(r) / 256 + 1e-3 * amax)) {
                if (bad++ < 3)
                    fprintf(stderr, "cuda_gemv M=%d N=%d K=%d acc=%d: y[%d,%d] = %g, fp64 %g\n", c->M, c->N, c->K,
                            accumulate, m, n, v, r);
            }
            if (!(err / amax <= worst)) worst = err / amax;
        }
    free(ref); free(wf); free(xf);
    assert_int_equal(bad, 0);
    return worst;
}

static void one_shape(int M, int N, int K) {
    gcase c;
    case_new(&c, M, N, K);
    uint16_t *y = malloc(sizeof(uint16_t) * M * N);
    for (int acc = 0; acc < 2; acc++) {
        case_run(&c, acc, y);
        double w = case_check(&c, acc, y);
        fprintf(stderr, "  cuda_gemv M=%-2d [%5d x %5d] accumulate=%d: worst |err|/max|ref| %.2e\n", M, N, K, acc, w);
    }
    free(y);
    case_free(&c);
}
#endif

static void test_gemv_matches_fp64_on_decode_and_edge_shapes(void **st) {
    (void)st;
#ifdef LS_HAVE_CUDA
    if (!have_gpu()) skip();
    static const int NK[][2] = {
        {128, 4096},  /* qwen3.5-397b gdn in_proj_ba (2·nv): 8 row tiles */
        {64, 2048},   /* qwen3.5-35b gdn in_proj_ba */
        {512, 4096},  /* router, attn k/v_proj: cluster split of K */
        {4096, 1024}, /* shared expert down */
        {100, 72},    /* partial row tile, partial 32-wide column, tiny K */
        {1000, 8200}, /* K % 32 != 0, long K */
        {4096, 8192}, /* attn o_proj: long K */
    };
    static const int Ms[] = {1, 3, 8, 9, 16};
    for (size_t s = 0; s < sizeof NK / sizeof NK[0]; s++)
        for (size_t m = 0; m < sizeof Ms / sizeof Ms[0]; m++) {
            if ((double)NK[s][0] * NK[s][1] * Ms[m] > 2e8) continue; /* keep the fp64 loop short */
            one_shape(Ms[m], NK[s][0], NK[s][1]);
        }
#else
    skip();
#endif
}

static void test_gemv_is_bitwise_reproducible(void **st) {
    (void)st;
#ifdef LS_HAVE_CUDA
    if (!have_gpu()) skip();
    static const int shapes[][3] = {{1, 512, 4096}, {16, 128, 4096}, {13, 1024, 4096}, {5, 4096, 8192}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        gcase c;
        case_new(&c, shapes[s][0], shapes[s][1], shapes[s][2]);
        const size_t n = (size_t)c.M * c.N;
        uint16_t *a = malloc(n * 2), *b = malloc(n * 2);
        case_run(&c, 1, a);
        for (int r = 0; r < 5; r++) {
            case_run(&c, 1, b);
            assert_memory_equal(a, b, n * 2);
        }
        free(a); free(b);
        case_free(&c);
    }
#else
    skip();
#endif
}

static void test_gemv_graph_replay_gives_the_eager_bits(void **st) {
    (void)st;
#ifdef LS_HAVE_CUDA
    if (!have_gpu()) skip();
    gcase c;
    case_new(&c, 4, 512, 4096);
    const size_t n = (size_t)c.M * c.N;
    uint16_t *eager = malloc(n * 2), *replay = malloc(n * 2);
    case_run(&c, 0, eager); /* also the warm-up */
    ls_err e = {0};
    ls_stream cs;
    assert_int_equal(cug_stream_new(&cs, &e), 0);
    assert_int_equal(g_mem->memset0(c.dy, n * 2, g_st, &e), 0);
    assert_int_equal(g_mem->sync(g_st, &e), 0);
    lin_w w = {.kind = W_BF16, .N = c.N, .K = c.K, .data = c.dw, .name = "test"};
    gemm_args a = {.M = c.M, .x = c.dx, .w = &w, .y = c.dy, .accumulate = 0, .dt = ACT_BF16};
    assert_int_equal(cug_begin(cs, &e), 0);
    int rc = gemv()->run(&a, cs, &e);
    void *exec = NULL;
    int rc2 = cug_end(cs, rc == 0, &exec, &e);
    if (rc || rc2) fprintf(stderr, "capture: %s\n", e.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(rc2, 0);
    assert_int_equal(cug_launch(exec, cs, &e), 0);
    assert_int_equal(g_mem->sync(cs, &e), 0);
    dev_fetch(replay, c.dy, n * 2);
    assert_memory_equal(eager, replay, n * 2);
    cug_destroy(exec);
    cug_stream_free(cs);
    free(eager); free(replay);
    case_free(&c);
#else
    skip();
#endif
}

#ifdef LS_HAVE_CUDA
/* n cases of one M and K sharing case 0's x (host and device). */
static void cases_share_x(gcase *c, int n) {
    ls_err e = {0};
    const size_t xb = sizeof(uint16_t) * c[0].M * c[0].K;
    for (int i = 1; i < n; i++) {
        memcpy(c[i].x, c[0].x, xb);
        assert_int_equal(g_mem->h2d(c[i].dx, c[0].x, xb, g_st, &e), 0);
    }
}

/* run_multi over the n cases (x = case 0's), y poisoned first; capture: inside a CUDA
 * graph on its own stream, then replayed. Fetches each y into out[i]. */
static void multi_run(gcase *c, int n, int capture, uint16_t **out) {
    ls_err e = {0};
    lin_w w[8];
    gemm_args a[8];
    for (int i = 0; i < n; i++) {
        const size_t yb = sizeof(uint16_t) * c[i].M * c[i].N;
        uint16_t *nan = malloc(yb);
        for (size_t j = 0; j < yb / 2; j++) nan[j] = 0x7fc1;
        assert_int_equal(g_mem->h2d(c[i].dy, nan, yb, g_st, &e), 0);
        free(nan);
        w[i] = (lin_w){.kind = W_BF16, .N = c[i].N, .K = c[i].K, .data = c[i].dw, .name = "test"};
        a[i] = (gemm_args){.M = c[i].M, .x = c[0].dx, .w = &w[i], .y = c[i].dy, .accumulate = 0, .dt = ACT_BF16};
    }
    assert_int_equal(g_mem->sync(g_st, &e), 0);
    assert_non_null(gemv()->run_multi);
    if (!capture) {
        int rc = gemv()->run_multi(n, a, g_st, &e);
        if (rc) fprintf(stderr, "cuda_gemv run_multi: %s\n", e.msg);
        assert_int_equal(rc, 0);
    } else {
        ls_stream cs;
        assert_int_equal(cug_stream_new(&cs, &e), 0);
        assert_int_equal(cug_begin(cs, &e), 0);
        int rc = gemv()->run_multi(n, a, cs, &e);
        void *exec = NULL;
        int rc2 = cug_end(cs, rc == 0, &exec, &e);
        if (rc || rc2) fprintf(stderr, "capture: %s\n", e.msg);
        assert_int_equal(rc, 0);
        assert_int_equal(rc2, 0);
        assert_int_equal(cug_launch(exec, cs, &e), 0);
        assert_int_equal(g_mem->sync(cs, &e), 0);
        cug_destroy(exec);
        cug_stream_free(cs);
    }
    for (int i = 0; i < n; i++)
        dev_fetch(out[i], c[i].dy, sizeof(uint16_t) * c[i].M * c[i].N);
}
#endif

/* The grouped launch (gemm_impl.run_multi, what ops_linear_multi takes for a GDN layer's
 * qkv / z / b / a and an attention layer's q / gate / k / v): every matrix's y against
 * fp64, the 35B GDN in-projections and a group of 5 (two launches) with partial tiles, at
 * M = 1, 9 and 16 (one and two n8 token tiles);
 * bitwise reproducible; a CUDA graph replay gives the eager bits. */
static void test_gemv_grouped_weights_match_fp64(void **st) {
    (void)st;
#ifdef LS_HAVE_CUDA
    if (!have_gpu()) skip();
    static const int sets[][6] = {
        {4, 8192, 4096, 32, 32, 0},   /* qwen3.5-35b gdn in_proj qkv, z, b, a (K = 2048) */
        {5, 100, 16, 1000, 33, 512},  /* partial tiles; 5 > GV_MAX_MATS: two launches */
    };
    static const int Ks[] = {2048, 200};
    static const int Ms[] = {1, 9, 16}; /* 16: a decode step at concurrency 16 (the plan cuda_gemv:16) */
    for (int si = 0; si < 2; si++)
        for (int mi = 0; mi < 3; mi++) {
            const int n = sets[si][0], M = Ms[mi], K = Ks[si];
            gcase c[5];
            uint16_t *y[5], *y2[5];
            for (int i = 0; i < n; i++) {
                case_new(&c[i], M, sets[si][1 + i], K);
                y[i] = malloc(sizeof(uint16_t) * M * c[i].N);
                y2[i] = malloc(sizeof(uint16_t) * M * c[i].N);
            }
            cases_share_x(c, n);
            multi_run(c, n, 0, y);
            for (int i = 0; i < n; i++) {
                double wst = case_check(&c[i], 0, y[i]);
                fprintf(stderr, "  cuda_gemv grouped %d/%d M=%d [%5d x %5d]: worst |err|/max|ref| %.2e\n", i, n, M,
                        c[i].N, K, wst);
            }
            multi_run(c, n, 0, y2);
            for (int i = 0; i < n; i++) assert_memory_equal(y[i], y2[i], sizeof(uint16_t) * M * c[i].N);
            multi_run(c, n, 1, y2);
            for (int i = 0; i < n; i++) assert_memory_equal(y[i], y2[i], sizeof(uint16_t) * M * c[i].N);
            for (int i = 0; i < n; i++) {
                free(y[i]);
                free(y2[i]);
                case_free(&c[i]);
            }
        }
#else
    skip();
#endif
}

/* Programmatic dependent launch: a chain of launches back to back, each reading the y the
 * one before it wrote (y1 = x·W1ᵀ, y2 = y1·W2ᵀ, y3 = y2·W3ᵀ, the buffers poisoned with NaN
 * before the chain): every link must wait for its input (griddepcontrol.wait before x is
 * staged); checked against fp64 from the device's own y1 / y2 bits. 20 rounds. */
static void test_gemv_dependent_chain_waits_for_its_input(void **st) {
    (void)st;
#ifdef LS_HAVE_CUDA
    if (!have_gpu()) skip();
    const int M = 2;
    gcase c[3];
    case_new(&c[0], M, 2048, 4096);  /* x [M,4096] -> y1 [M,2048] */
    case_new(&c[1], M, 8192, 2048);  /* y1 -> y2 [M,8192] */
    case_new(&c[2], M, 512, 8192);   /* y2 -> y3 [M,512] */
    ls_err e = {0};
    uint16_t *h[3];
    for (int i = 0; i < 3; i++) h[i] = malloc(sizeof(uint16_t) * M * c[i].N);
    lin_w w[3];
    for (int i = 0; i < 3; i++) w[i] = (lin_w){.kind = W_BF16, .N = c[i].N, .K = c[i].K, .data = c[i].dw, .name = "chain"};
    for (int round = 0; round < 20; round++) {
        for (int i = 0; i < 3; i++) {
            const size_t yb = sizeof(uint16_t) * M * c[i].N;
            for (size_t j = 0; j < yb / 2; j++) h[i][j] = 0x7fc1;
            assert_int_equal(g_mem->h2d(c[i].dy, h[i], yb, g_st, &e), 0);
        }
        for (int i = 0; i < 3; i++) {
            gemm_args a = {.M = M, .x = i ? c[i - 1].dy : c[0].dx, .w = &w[i], .y = c[i].dy, .accumulate = 0,
                           .dt = ACT_BF16};
            assert_int_equal(gemv()->run(&a, g_st, &e), 0);
        }
        for (int i = 0; i < 3; i++)
            dev_fetch(h[i], c[i].dy, sizeof(uint16_t) * M * c[i].N);
        if (round % 5 == 0) { /* the fp64 loops are the slow part */
            memcpy(c[1].x, h[0], sizeof(uint16_t) * M * c[0].N);
            memcpy(c[2].x, h[1], sizeof(uint16_t) * M * c[1].N);
            for (int i = 0; i < 3; i++) case_check(&c[i], 0, h[i]);
        } else {
            for (int i = 0; i < 3; i++)
                for (int j = 0; j < M * c[i].N; j++) assert_true(h[i][j] != 0x7fc1);
        }
    }
    for (int i = 0; i < 3; i++) {
        free(h[i]);
        case_free(&c[i]);
    }
#else
    skip();
#endif
}

static void test_gemv_refuses_what_it_does_not_take(void **st) {
    (void)st;
#ifdef LS_HAVE_CUDA
    if (!have_gpu()) skip();
    char why[256];
    const gemm_impl *g = gemv();
    gemm_shape s = {.M = 17, .N = 512, .K = 4096, .wk = W_BF16, .dt = ACT_BF16};
    assert_false(g->supported(&g_dev, &s, why, sizeof why));
    assert_non_null(strstr(why, "M=17"));
    s.M = 1, s.K = 4100;
    assert_false(g->supported(&g_dev, &s, why, sizeof why));
    assert_non_null(strstr(why, "K=4100 is not a multiple of 8"));
    s.K = 4096, s.wk = W_NVFP4;
    assert_false(g->supported(&g_dev, &s, why, sizeof why));
    assert_non_null(strstr(why, "BF16"));
    s.wk = W_BF16;
    assert_true(g->supported(&g_dev, &s, why, sizeof why));
    s.M = 16, s.N = 248320, s.K = 4096; /* an lm_head at M = 16 */
    assert_true(g->supported(&g_dev, &s, why, sizeof why));
    s.K = 1 << 20; /* x cannot be staged */
    assert_false(g->supported(&g_dev, &s, why, sizeof why));
    assert_non_null(strstr(why, "too long"));
#else
    skip();
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemv_matches_fp64_on_decode_and_edge_shapes),
        cmocka_unit_test(test_gemv_is_bitwise_reproducible),
        cmocka_unit_test(test_gemv_graph_replay_gives_the_eager_bits),
        cmocka_unit_test(test_gemv_grouped_weights_match_fp64),
        cmocka_unit_test(test_gemv_dependent_chain_waits_for_its_input),
        cmocka_unit_test(test_gemv_refuses_what_it_does_not_take),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
