/* test_fp4_gemv_cuda.c: fp4_gemm cuda_w4a16_mma (src/ops/cuda/fp4_gemv.cu) under
 * programmatic dependent launch: its kernels load their weights before
 * griddepcontrol.wait and small.cu's kernels let them launch early, so a missing or
 * misplaced wait would read x before the kernel that writes it has finished. Pinned
 * here, on a decode-like chain on one stream, outputs poisoned with NaN before each run:
 *   rmsnorm (x0 -> x1)  ->  G1: y1 = x1·W1ᵀ [4096 x 4096]  ->  G2: y2 = y1·W2ᵀ
 *   [2048 x 4096]  ->  G3: y2 += y1·W3ᵀ (reads what G1 and G2 wrote)
 * at M = 1 (the GEMV kernels) and M = 4 (the register kernel):
 *   - chained (no sync between the ops, PDL free to overlap) == the same ops with a
 *     device sync after each (nothing can overlap), bit for bit, 8 times over;
 *   - a CUDA graph capture of the chain, replayed 3 times, gives the same bits;
 *   - each GEMM of the synced run against an fp64 product computed here from its
 *     actual input (the device's x1, y1) and the NVFP4 definition.
 * Every knob of fp4_gemv.cu applies (LASTSTAND_W4A16_GDEC=2|1, M8=2 ... run the other
 * kernels; bench/device/gemv5.sh runs this binary once per knob).
 * Needs a CUDA GPU of cc >= 9.0: every test is skipped without one.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ops/ops.h"
#define CUDA_TEST_SEED 2024u
#include "cuda_test.h"
#ifdef LS_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
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

static int have_gpu(void) { return cuda_test_gpu("test_fp4_gemv_cuda", 9, &g_mem, &g_dev, &g_st); }

static const float E2M1[16] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

/* One NVFP4 weight [N, K], host and device. */
typedef struct fw {
    int N, K;
    uint8_t *codes, *scales; /* [N, K/2], [N, K/16] */
    float scale2;
    void *dc, *ds;
    lin_w lw;
} fw;

static void fw_new(fw *w, int N, int K, const char *name) {
    w->N = N, w->K = K;
    w->codes = malloc((size_t)N * K / 2);
    w->scales = malloc((size_t)N * K / 16);
    for (size_t i = 0; i < (size_t)N * K / 2; i++) w->codes[i] = (uint8_t)rnd();
    /* scales 2^-3 .. 2^1 (E4M3 normal), so that the outputs stay O(1) */
    for (size_t i = 0; i < (size_t)N * K / 16; i++) w->scales[i] = f32_to_fp8_e4m3(ldexpf(1.f + (rnd() % 8) / 8.f, (int)(rnd() % 5) - 3));
    w->scale2 = 1.f / 64;
    ls_err e = {0};
    w->dc = g_mem->alloc((size_t)N * K / 2, &e);
    w->ds = g_mem->alloc((size_t)N * K / 16, &e);
    assert_non_null(w->dc);
    assert_non_null(w->ds);
    assert_int_equal(g_mem->h2d(w->dc, w->codes, (size_t)N * K / 2, g_st, &e), 0);
    assert_int_equal(g_mem->h2d(w->ds, w->scales, (size_t)N * K / 16, g_st, &e), 0);
    w->lw = (lin_w){.kind = W_NVFP4, .N = N, .K = K, .data = w->dc, .scale = w->ds, .scale2 = w->scale2, .name = name};
}

static void fw_free(fw *w) {
    g_mem->free(w->dc); g_mem->free(w->ds);
    free(w->codes); free(w->scales);
}

/* fp64 y[m,n] (+)= sum_k x[m,k] W[n,k] against the device's y: within BF16 rounding of
 * the value (2^-8 relative) plus 1e-3 of max|ref| (fp32 accumulation order). */
static void check_fp64(const fw *w, int M, const uint16_t *x, const uint16_t *y0, const uint16_t *y, const char *what) {
    double *ref = malloc(sizeof(double) * M * w->N), amax = 0, *wrow = malloc(sizeof(double) * w->K);
    float *xf = malloc(sizeof(float) * M * w->K);
    for (size_t i = 0; i < (size_t)M * w->K; i++) xf[i] = bf16_to_f32(x[i]);
    for (int n = 0; n < w->N; n++) {
        for (int k = 0; k < w->K; k++) {
            const uint8_t b = w->codes[((size_t)n * w->K + k) / 2];
            wrow[k] = E2M1[k & 1 ? b >> 4 : b & 15] * (double)fp8_e4m3_to_f32(w->scales[((size_t)n * w->K + k) / 16]);
        }
        for (int m = 0; m < M; m++) {
            double s = 0;
            for (int k = 0; k < w->K; k++) s += wrow[k] * xf[(size_t)m * w->K + k];
            s *= w->scale2;
            if (y0) s += bf16_to_f32(y0[(size_t)m * w->N + n]);
            ref[(size_t)m * w->N + n] = s;
            if (fabs(s) > amax) amax = fabs(s);
        }
    }
    free(wrow);
    free(xf);
    int bad = 0;
    for (size_t i = 0; i < (size_t)M * w->N; i++) {
        const double v = bf16_to_f32(y[i]), err = fabs(v - ref[i]);
        if (!(err <= fabs(ref[i]) / 256 + 1e-3 * amax) && bad++ < 3)
            fprintf(stderr, "%s M=%d [%d x %d]: y[%zu] = %g, fp64 %g\n", what, M, w->N, w->K, i, v, ref[i]);
    }
    free(ref);
    assert_int_equal(bad, 0);
}

typedef struct chain {
    int M;
    fw w1, w2, w3;
    float *nw;              /* rmsnorm weight [4096], device */
    void *x0, *x1, *y1, *y2; /* device BF16 */
    uint16_t *hx0;
} chain;

enum { H = 4096, N2 = 2048 };

static void chain_new(chain *c, int M) {
    memset(c, 0, sizeof *c);
    c->M = M;
    fw_new(&c->w1, H, H, "w1");
    fw_new(&c->w2, N2, H, "w2");
    fw_new(&c->w3, N2, H, "w3");
    ls_err e = {0};
    float hw[H];
    for (int i = 0; i < H; i++) hw[i] = 1.f + 0.25f * urand();
    c->hx0 = malloc(sizeof(uint16_t) * M * H);
    for (size_t i = 0; i < (size_t)M * H; i++) c->hx0[i] = f32_to_bf16(urand() * (1 + (int)(i / H)));
    c->nw = g_mem->alloc(sizeof hw, &e);
    c->x0 = g_mem->alloc((size_t)M * H * 2, &e);
    c->x1 = g_mem->alloc((size_t)M * H * 2, &e);
    c->y1 = g_mem->alloc((size_t)M * H * 2, &e);
    c->y2 = g_mem->alloc((size_t)M * N2 * 2, &e);
    assert_true(c->nw && c->x0 && c->x1 && c->y1 && c->y2);
    assert_int_equal(g_mem->h2d(c->nw, hw, sizeof hw, g_st, &e), 0);
    assert_int_equal(g_mem->h2d(c->x0, c->hx0, (size_t)M * H * 2, g_st, &e), 0);
    assert_int_equal(g_mem->sync(g_st, &e), 0);
}

static void chain_free(chain *c) {
    fw_free(&c->w1); fw_free(&c->w2); fw_free(&c->w3);
    g_mem->free(c->nw); g_mem->free(c->x0); g_mem->free(c->x1); g_mem->free(c->y1); g_mem->free(c->y2);
    free(c->hx0);
}

/* NaN into x1, y1, y2 (the outputs of the chain), synced. */
static void chain_poison(chain *c) {
    ls_err e = {0};
    assert_int_equal(lsc_memset(c->x1, 0xff, (size_t)c->M * H * 2, &e), 0);
    assert_int_equal(lsc_memset(c->y1, 0xff, (size_t)c->M * H * 2, &e), 0);
    assert_int_equal(lsc_memset(c->y2, 0xff, (size_t)c->M * N2 * 2, &e), 0);
    assert_int_equal(lsc_sync(NULL, &e), 0);
}

/* Enqueue the chain on s; sync_each: a device sync after every op. */
static int chain_run(chain *c, ls_stream s, int sync_each, ls_err *e) {
    const small_ops *sm = ops_small_find("cuda");
    const fp4_gemm_impl *g = ops_fp4_gemm_find("cuda_w4a16_mma");
    if (!sm || !g) return errf(e, ERR_RUNTIME, "cuda small ops or cuda_w4a16_mma not registered");
    int rc = sm->rmsnorm(c->M, H, c->x0, c->nw, RMS_ZC, 1e-6f, c->x1, ACT_BF16, s);
    if (!rc && sync_each) rc = g_mem->sync(s, e);
    gemm_args a1 = {.M = c->M, .x = c->x1, .w = &c->w1.lw, .y = c->y1, .accumulate = 0, .dt = ACT_BF16};
    if (!rc) rc = g->run(&a1, s, e);
    if (!rc && sync_each) rc = g_mem->sync(s, e);
    gemm_args a2 = {.M = c->M, .x = c->y1, .w = &c->w2.lw, .y = c->y2, .accumulate = 0, .dt = ACT_BF16};
    if (!rc) rc = g->run(&a2, s, e);
    if (!rc && sync_each) rc = g_mem->sync(s, e);
    gemm_args a3 = {.M = c->M, .x = c->y1, .w = &c->w3.lw, .y = c->y2, .accumulate = 1, .dt = ACT_BF16};
    if (!rc) rc = g->run(&a3, s, e);
    return rc;
}

static void one_chain(int M) {
    chain c;
    chain_new(&c, M);
    ls_err e = {0};
    const size_t nx = (size_t)M * H * 2, ny = (size_t)M * N2 * 2;
    uint16_t *x1 = malloc(nx), *y1 = malloc(nx), *y2 = malloc(ny), *y2m = malloc(ny), *y2c = malloc(ny);
    /* the synced run, checked op by op against fp64 */
    chain_poison(&c);
    int rc = chain_run(&c, g_st, 1, &e);
    if (!rc) rc = g_mem->sync(g_st, &e);
    if (rc) fprintf(stderr, "chain M=%d: %s\n", M, e.msg);
    assert_int_equal(rc, 0);
    dev_fetch(x1, c.x1, nx);
    dev_fetch(y1, c.y1, nx);
    dev_fetch(y2, c.y2, ny);
    check_fp64(&c.w1, M, x1, NULL, y1, "G1");
    /* G2 then G3: y2 = y1·W2ᵀ (rounded to BF16) + y1·W3ᵀ */
    ls_stream s = g_st;
    {
        chain_poison(&c);
        assert_int_equal(g_mem->h2d(c.y1, y1, nx, s, &e), 0);
        gemm_args a2 = {.M = M, .x = c.y1, .w = &c.w2.lw, .y = c.y2, .accumulate = 0, .dt = ACT_BF16};
        assert_int_equal(ops_fp4_gemm_find("cuda_w4a16_mma")->run(&a2, s, &e), 0);
        dev_fetch(y2m, c.y2, ny);
        check_fp64(&c.w2, M, y1, NULL, y2m, "G2");
        check_fp64(&c.w3, M, y1, y2m, y2, "G3");
    }
    /* chained, on the legacy stream and on a stream of our own, 8 times each */
    ls_stream cs;
    assert_int_equal(cug_stream_new(&cs, &e), 0);
    for (int r = 0; r < 16; r++) {
        ls_stream on = r & 1 ? cs : g_st;
        chain_poison(&c);
        rc = chain_run(&c, on, 0, &e);
        if (!rc) rc = g_mem->sync(on, &e);
        assert_int_equal(rc, 0);
        dev_fetch(y2c, c.y2, ny);
        if (memcmp(y2, y2c, ny)) fprintf(stderr, "chain M=%d run %d (%s stream): differs from the synced run\n", M, r, r & 1 ? "own" : "legacy");
        assert_memory_equal(y2, y2c, ny);
    }
    /* captured into a graph, replayed 3 times */
    chain_poison(&c);
    assert_int_equal(cug_begin(cs, &e), 0);
    rc = chain_run(&c, cs, 0, &e);
    void *exec = NULL;
    int rc2 = cug_end(cs, rc == 0, &exec, &e);
    if (rc || rc2) fprintf(stderr, "capture M=%d: %s\n", M, e.msg);
    assert_int_equal(rc, 0);
    assert_int_equal(rc2, 0);
    for (int r = 0; r < 3; r++) {
        chain_poison(&c);
        assert_int_equal(cug_launch(exec, cs, &e), 0);
        assert_int_equal(g_mem->sync(cs, &e), 0);
        dev_fetch(y2c, c.y2, ny);
        assert_memory_equal(y2, y2c, ny);
    }
    cug_destroy(exec);
    cug_stream_free(cs);
    fprintf(stderr, "  fp4 chain M=%d: fp64 ok, 16 chained runs and 3 graph replays bit-identical to the synced run\n", M);
    free(x1); free(y1); free(y2); free(y2m); free(y2c);
    chain_free(&c);
}
#endif

static void test_pdl_chain_matches_synced_run_and_fp64(void **st) {
    (void)st;
#ifdef LS_HAVE_CUDA
    if (!have_gpu()) skip();
    one_chain(1);
    one_chain(4);
#else
    skip();
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pdl_chain_matches_synced_run_and_fp64),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
