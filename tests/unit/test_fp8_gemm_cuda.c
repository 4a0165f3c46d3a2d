/* test_fp8_gemm_cuda.c: FP8 (E4M3) weights x BF16 activations on the gemm backends of
 * CUDA (src/ops/cuda/fp8_gemm.cu): cuda_gemv (the small-M kernel: codes to f16 in
 * registers, x scaled per 64-group to f16, mma.sync m16n8k16), cuda_cublaslt (dequantized
 * to BF16, then cuBLASLt) and cuda_ref (one thread per output), each against an fp64
 * product computed here on the host from the same codes, fp32 scales and BF16 x (E4M3
 * decoded by base.h's fp8_e4m3_to_f32):
 *   - decode shapes ([4096 x 4096], [64 x 2048], [2048 x 4096], [12288 x 2048], and
 *     [200 x 1024], N % 16 != 0) at M = 1, 3, 4, 5, 16, each in the three scale layouts
 *     (per tensor, per row, 128 x 128 blocks), y = and y += (accumulate);
 *   - tensor-parallel views (fs_r0 = 128, fs_c0 = 1024 into a bigger tensor's scales);
 *   - codes covering all 254 non-NaN values (subnormals included) against x with
 *     outliers from 2^-20 to 2^10 inside one 64-group, zeros (+0 and -0) and negative values;
 *   - the grouped launch (run_multi) of 4 weights of different N behind one x;
 *   - bitwise identical repeats, a CUDA graph replay equal to the eager bits (cuda_gemv and
 *     cuda_cublaslt), a chain of programmatic dependent launches that each read the
 *     previous output;
 *   - what cuda_gemv refuses (K % 64 != 0, M > 16, scale blocks that split a 64-column
 *     group, scales that do not cover the view), with the reason, and that cuda_cublaslt /
 *     cuda_ref still take the first ones.
 * Tolerance per element: |y - ref| <= 4e-3·|ref| + 2e-3·max|ref| (the BF16 output rounding
 * plus fp32 sums) for cuda_gemv and cuda_ref, which scale E4M3 in fp32. cuda_cublaslt
 * multiplies W rounded to BF16 (what dequantizing at load did before W_FP8): each weight
 * moves by up to 2^-9, so its bound adds 2^-8·sum_k |w·x| (an x outlier of 2^10 makes that
 * term the largest); the GEMV against it: two independent BF16 roundings of y (2^-7 relative:
 * one BF16 ulp apart is legal) plus that term; the GEMV against cuda_ref (both exact in W):
 * one BF16 ulp plus K·2^-23·sum_k |w·x| (fp32 summation order). The worst error per case is
 * printed.
 * `test_fp8_gemm_cuda --bench [N K M L]`: per-call times of cuda_gemv on FP8 (and BF16 for
 * scale) in a chain of back-to-back launches over rotating weight copies (L2 cold), for the
 * lead's device rounds; with N K M L (L: 0 per tensor, 1 per row, 2 128 x 128) one shape.
 * Needs a CUDA GPU of cc >= 9.0: every test is skipped without one.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ops/ops.h"
#define CUDA_TEST_SEED 8088u
#include "cuda_test.h"
#ifdef LS_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#include "ops/cuda/graph.h"
#include <cuda_runtime_api.h>
#endif

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef LS_HAVE_CUDA
static const dev_mem *g_mem;
static ls_stream g_st;
static dev_info g_dev;

static int have_gpu(void) { return cuda_test_gpu("test_fp8_gemm_cuda", 9, &g_mem, &g_dev, &g_st); }

static const gemm_impl *backend(const char *name) {
    const gemm_impl *g = ops_gemm_find(name);
    assert_non_null(g);
    return g;
}

enum { L_TENSOR = 0, L_ROW, L_BLOCK, L_N };
static const char *const layout_name[L_N] = {"per-tensor", "per-row", "128x128"};

/* One FP8 weight and its inputs: the view [N, K] of a tensor [Nf, Kf] starting at (r0, c0)
 * (the whole tensor when r0 = c0 = 0), its scales laid out for the whole tensor. */
typedef struct fcase {
    int M, N, K;
    uint8_t *w;        /* host codes [N, K] */
    float *fs;         /* host scales (fs_n floats) */
    uint16_t *x, *y0;  /* host BF16 [M, K], [M, N] (what accumulate adds to) */
    void *dw, *dfs, *dx, *dy;
    lin_w lw;
} fcase;

/* A random non-NaN E4M3 code (0x7f / 0xff become 0x7e / 0xfe). */
static uint8_t rnd_code(void) {
    uint8_t b = (uint8_t)(rnd() >> 16); /* the LCG's top byte (its low bits have short periods) */
    return (b & 0x7f) == 0x7f ? (uint8_t)(b ^ 1) : b;
}

/* Scales for layout L of a tensor [Nf, Kf]; fills the lin_w's layout fields. */
static void make_scales(fcase *c, int layout, int Nf, int Kf, int r0, int c0) {
    lin_w *w = &c->lw;
    w->fs_r0 = r0, w->fs_c0 = c0;
    if (layout == L_TENSOR) w->fs_br = Nf, w->fs_bc = Kf, w->fs_cols = 1, w->fs_n = 1;
    else if (layout == L_ROW) w->fs_br = 1, w->fs_bc = Kf, w->fs_cols = 1, w->fs_n = (size_t)Nf;
    else {
        w->fs_br = w->fs_bc = 128;
        w->fs_cols = (Kf + 127) / 128;
        w->fs_n = (size_t)((Nf + 127) / 128) * w->fs_cols;
    }
    c->fs = malloc(sizeof(float) * w->fs_n);
    /* magnitudes around 2^-9 (codes reach 448): W values of a few 1e-2, as a checkpoint's */
    for (size_t i = 0; i < w->fs_n; i++) c->fs[i] = (1.5f + urand()) * 1.5e-3f;
}

/* x [M, K]: urand, or (outliers) each row's first 64-group spanning 2^-20 .. 2^10 with
 * random signs and zeros, its second group all zero, row 1 (if any) all zero. */
static void make_x(fcase *c, int outliers) {
    for (size_t i = 0; i < (size_t)c->M * c->K; i++) c->x[i] = f32_to_bf16(urand());
    if (!outliers) return;
    for (int m = 0; m < c->M; m++) {
        uint16_t *xr = c->x + (size_t)m * c->K;
        for (int k = 0; k < 64 && k < c->K; k++) {
            const int p = -20 + (int)(rnd() % 31); /* 2^-20 .. 2^10 */
            float v = ldexpf(1.f + (float)(rnd() % 128) / 128.f, p);
            if (rnd() & 1) v = -v;
            if (k % 9 == 4) v = 0.f;
            if (k == 7) v = 1024.f, v = (m & 1) ? -v : v; /* the group max: 2^10 */
            if (k == 8) v = ldexpf(1.f, -20);
            xr[k] = f32_to_bf16(v);
        }
        for (int k = 64; k < 128 && k < c->K; k++) xr[k] = 0;
        if (m == 1)
            for (int k = 0; k < c->K; k++) xr[k] = (k & 1) ? 0x8000 : 0; /* +0 and -0 */
    }
}

/* codes: 0 random, 1 every non-NaN code in turn (all 254, subnormals included). */
static void case_new_view(fcase *c, int M, int N, int K, int layout, int Nf, int Kf, int r0, int c0, int codes,
                          int outliers) {
    memset(c, 0, sizeof *c);
    c->M = M, c->N = N, c->K = K;
    c->w = malloc((size_t)N * K + 1);
    c->x = malloc(sizeof(uint16_t) * ((size_t)M * K + 1));
    c->y0 = malloc(sizeof(uint16_t) * ((size_t)M * N + 1));
    if (codes) {
        uint8_t all[254];
        int na = 0;
        for (int b = 0; b < 256; b++)
            if ((b & 0x7f) != 0x7f) all[na++] = (uint8_t)b;
        for (size_t i = 0; i < (size_t)N * K; i++) c->w[i] = all[(i * 7 + i / 254) % 254];
    } else {
        for (size_t i = 0; i < (size_t)N * K; i++) c->w[i] = rnd_code();
    }
    c->lw = (lin_w){.kind = W_FP8, .N = N, .K = K, .name = "fp8test"};
    make_scales(c, layout, Nf, Kf, r0, c0);
    make_x(c, outliers);
    for (size_t i = 0; i < (size_t)M * N; i++) c->y0[i] = f32_to_bf16(urand());
    c->dw = dev_copy(c->w, (size_t)N * K + 1);
    c->dfs = dev_copy(c->fs, sizeof(float) * c->lw.fs_n);
    c->dx = dev_copy(c->x, sizeof(uint16_t) * ((size_t)M * K + 1));
    ls_err e = {0};
    c->dy = g_mem->alloc(sizeof(uint16_t) * ((size_t)M * N + 1), &e);
    assert_non_null(c->dy);
    c->lw.data = c->dw;
    c->lw.fscale = c->dfs;
}

static void case_new(fcase *c, int M, int N, int K, int layout) {
    case_new_view(c, M, N, K, layout, N, K, 0, 0, 0, 0);
}

static void case_free(fcase *c) {
    g_mem->free(c->dw); g_mem->free(c->dfs); g_mem->free(c->dx); g_mem->free(c->dy);
    free(c->w); free(c->fs); free(c->x); free(c->y0);
}

/* The host scale of element (n, k): lin_fp8_scale on the host copy. */
static float host_scale(const fcase *c, int n, int k) {
    const lin_w *w = &c->lw;
    return c->fs[(size_t)((n + w->fs_r0) / w->fs_br) * w->fs_cols + (size_t)((k + w->fs_c0) / w->fs_bc)];
}

/* fp64 reference [M, N] (+ y0 when accumulating); *amax = max |ref|; abs (optional, [M, N]):
 * sum_k |w·x| of each output, what rounding W to BF16 can move it by (2^-9 of it). */
static double *case_ref_abs(const fcase *c, int accumulate, double *amax, double *abs) {
    double *ref = malloc(sizeof(double) * c->M * c->N), *wr = malloc(sizeof(double) * c->K);
    double *xd = malloc(sizeof(double) * c->M * c->K);
    for (size_t i = 0; i < (size_t)c->M * c->K; i++) xd[i] = bf16_to_f32(c->x[i]);
    *amax = 0;
    for (int n = 0; n < c->N; n++) {
        for (int k = 0; k < c->K; k++)
            wr[k] = (double)fp8_e4m3_to_f32(c->w[(size_t)n * c->K + k]) * (double)host_scale(c, n, k);
        for (int m = 0; m < c->M; m++) {
            const double *xr = xd + (size_t)m * c->K;
            double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            int k = 0;
            for (; k + 4 <= c->K; k += 4) {
                s0 += wr[k] * xr[k];
                s1 += wr[k + 1] * xr[k + 1];
                s2 += wr[k + 2] * xr[k + 2];
                s3 += wr[k + 3] * xr[k + 3];
            }
            for (; k < c->K; k++) s0 += wr[k] * xr[k];
            double s = (s0 + s1) + (s2 + s3);
            if (abs) {
                double a = 0;
                for (k = 0; k < c->K; k++) a += fabs(wr[k] * xr[k]);
                abs[(size_t)m * c->N + n] = a;
            }
            if (accumulate) s += bf16_to_f32(c->y0[(size_t)m * c->N + n]);
            ref[(size_t)m * c->N + n] = s;
            if (fabs(s) > *amax) *amax = fabs(s);
        }
    }
    free(wr); free(xd);
    return ref;
}

static double *case_ref(const fcase *c, int accumulate, double *amax) { return case_ref_abs(c, accumulate, amax, NULL); }

/* Run backend `name` on c (y preset to y0 when accumulating, else NaN-poisoned) and fetch y. */
static void case_run(fcase *c, const char *name, int accumulate, uint16_t *out) {
    ls_err e = {0};
    const size_t yb = sizeof(uint16_t) * c->M * c->N;
    uint16_t *init = malloc(yb + 2);
    for (size_t i = 0; i < (size_t)c->M * c->N; i++) init[i] = accumulate ? c->y0[i] : 0x7fc1;
    assert_int_equal(g_mem->h2d(c->dy, init, yb, g_st, &e), 0);
    free(init);
    gemm_args a = {.M = c->M, .x = c->dx, .w = &c->lw, .y = c->dy, .accumulate = accumulate, .dt = ACT_BF16};
    int rc = backend(name)->run(&a, g_st, &e);
    if (rc) fprintf(stderr, "%s M=%d N=%d K=%d: %s\n", name, c->M, c->N, c->K, e.msg);
    assert_int_equal(rc, 0);
    rc = g_mem->d2h(out, c->dy, yb, g_st, &e);
    if (rc) fprintf(stderr, "%s M=%d N=%d K=%d: %s\n", name, c->M, c->N, c->K, e.msg);
    assert_int_equal(rc, 0);
}

/* |y - ref| <= rel·|ref| + 2e-3·amax (+ wabs[i] / 256 when wabs is set) for every element;
 * returns the worst |y - ref| / amax. rel 4e-3: one BF16 rounding of y plus fp32 sums. */
static double check_close_x(const char *what, const fcase *c, const uint16_t *y, const double *ref, double amax,
                            double rel, const double *wabs) {
    double worst = 0;
    int bad = 0;
    for (int m = 0; m < c->M; m++)
        for (int n = 0; n < c->N; n++) {
            const double r = ref[(size_t)m * c->N + n], v = bf16_to_f32(y[(size_t)m * c->N + n]);
            const double err = fabs(v - r);
            const double tol = rel * fabs(r) + 2e-3 * amax + (wabs ? wabs[(size_t)m * c->N + n] / 256 : 0);
            if (!(err <= tol)) {
                if (bad++ < 3)
                    fprintf(stderr, "  %s M=%d [%d x %d]: y[%d,%d] = %.6g, expected %.6g (max|ref| %.4g)\n", what, c->M,
                            c->N, c->K, m, n, v, r, amax);
            }
            if (!(err / amax <= worst)) worst = err / amax;
        }
    assert_int_equal(bad, 0);
    return worst;
}

static double check_close(const char *what, const fcase *c, const uint16_t *y, const double *ref, double amax) {
    return check_close_x(what, c, y, ref, amax, 4e-3, NULL);
}

/* All three backends on c against fp64 (cuda_gemv when gemv is set), and the GEMV against
 * the dequant + cuBLASLt path. cuda_gemv and cuda_ref scale E4M3 in fp32: the tolerance of
 * the top of the file. cuda_cublaslt multiplies W rounded to BF16 (the dequantized
 * weight): that may move an output by up to 2^-9 of sum_k |w·x| more, allowed (2^-8) on
 * top; the GEMV against it: two BF16 roundings of y (2^-7 relative) and that allowance. */
static void case_check_all_g(fcase *c, int accumulate, const char *label, int gemv) {
    double amax;
    const size_t ny = (size_t)c->M * c->N;
    double *wabs = malloc(sizeof(double) * ny);
    double *ref = case_ref_abs(c, accumulate, &amax, wabs);
    uint16_t *yg = malloc(ny * 2 + 2), *yl = malloc(ny * 2 + 2), *yr = malloc(ny * 2 + 2);
    double wg = -1;
    if (gemv) {
        case_run(c, "cuda_gemv", accumulate, yg);
        wg = check_close("cuda_gemv", c, yg, ref, amax);
    }
    case_run(c, "cuda_cublaslt", accumulate, yl);
    const double wl = check_close_x("cuda_cublaslt", c, yl, ref, amax, 4e-3, wabs);
    case_run(c, "cuda_ref", accumulate, yr);
    const double wr = check_close("cuda_ref", c, yr, ref, amax);
    double wgl = -1;
    if (gemv) { /* the GEMV against the dequantized path */
        double *rl = malloc(sizeof(double) * ny), lmax = 0;
        for (size_t i = 0; i < ny; i++) {
            rl[i] = bf16_to_f32(yl[i]);
            if (fabs(rl[i]) > lmax) lmax = fabs(rl[i]);
        }
        wgl = check_close_x("cuda_gemv vs cuda_cublaslt", c, yg, rl, lmax, 1.0 / 128, wabs);
        free(rl);
        /* the GEMV against cuda_ref, both E4M3 · fp32 scale exactly: the same values but for the
         * order of the fp32 sums (K·2^-23 of sum_k |w·x| at most) and each y's one BF16 rounding
         * (a BF16 ulp apart at most, 2^-7 relative): much tighter than against fp64 */
        int bad = 0;
        for (size_t i = 0; i < ny; i++) {
            const double g = bf16_to_f32(yg[i]), r = bf16_to_f32(yr[i]);
            if (!(fabs(g - r) <= fabs(r) / 128 + (double)c->K * 0x1p-23 * wabs[i] + 1e-30) && bad++ < 3)
                fprintf(stderr, "  cuda_gemv vs cuda_ref M=%d [%d x %d]: y[%zu] = %.6g, cuda_ref %.6g\n", c->M, c->N,
                        c->K, i, g, r);
        }
        assert_int_equal(bad, 0);
    }
    free(wabs);
    fprintf(stderr, "  %-22s M=%-2d [%5d x %5d] acc=%d  worst |err|/max|ref|: gemv %.2e  cublaslt %.2e  ref %.2e"
                    "  gemv-vs-lt %.2e\n",
            label, c->M, c->N, c->K, accumulate, wg, wl, wr, wgl);
    free(ref); free(yg); free(yl); free(yr);
}

static void case_check_all(fcase *c, int accumulate, const char *label) {
    case_check_all_g(c, accumulate, label, c->M <= 16);
}
#endif

static void test_fp8_backends_match_fp64_on_decode_shapes(void **st) {
    (void)st;
#ifdef LS_HAVE_CUDA
    if (!have_gpu()) skip();
    static const int NK[][2] = {
        {4096, 4096},  /* q / o projections: one 16-row tile per block */
        {64, 2048},    /* a GDN in_proj_ba: K split over a cluster */
        {2048, 4096},  /* o_proj / out_proj */
        {12288, 2048}, /* a dense MLP's gate+up */
        {200, 1024},   /* N % 16 != 0: a partial row tile */
    };
    static const int Ms[] = {1, 3, 4, 5, 16};
    for (size_t s = 0; s < sizeof NK / sizeof NK[0]; s++)
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
            for (int L = 0; L < L_N; L++) {
                fcase c;
                case_new(&c, Ms[mi], NK[s][0], NK[s][1], L);
                case_check_all(&c, (int)(mi + L) % 2, layout_name[L]);
                case_free(&c);
            }
#else
    skip();
#endif
}

/* Tensor-parallel views: rows [128, 128 + N) and columns [1024, 1024 + K) of a bigger
 * tensor, whose scales (128 x 128 blocks, per row, per tensor) the view shares. */
static void test_fp8_tensor_parallel_views_read_the_right_scales(void **st) {
    (void)st;
#ifdef LS_HAVE_CUDA
    if (!have_gpu()) skip();
    static const int Ms[] = {1, 5, 16};
    for (int L = 0; L < L_N; L++)
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++) {
            fcase c;
            case_new_view(&c, Ms[mi], 1024, 2048, L, 1024 + 512, 2048 + 2048, 128, 1024, 0, 0);
            char label[48];
            snprintf(label, sizeof label, "TP view %s", layout_name[L]);
            case_check_all(&c, (int)mi % 2, label);
            case_free(&c);
        }
#else
    skip();
#endif
}

/* Every non-NaN code (subnormals too) against x with outliers 2^-20 .. 2^10 in one group,
 * zero groups, a zero row (+0 and -0), negative values. */
static void test_fp8_all_codes_and_outliers(void **st) {
    (void)st;
#ifdef LS_HAVE_CUDA
    if (!have_gpu()) skip();
    static const int Ms[] = {1, 3, 5, 16};
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
        for (int L = 0; L < L_N; L++) {
            fcase c;
            case_new_view(&c, Ms[mi], 272, 1024, L, 272, 1024, 0, 0, 1, 1);
            char label[48];
            snprintf(label, sizeof label, "codes+outliers %s", layout_name[L]);
            case_check_all(&c, L == 1, label);
            case_free(&c);
        }
#else
    skip();
#endif
}

#ifdef LS_HAVE_CUDA
/* run_multi over the n cases (x = case 0's), y poisoned first; capture: inside a CUDA graph
 * on its own stream, then replayed. Fetches each y into out[i]. */
static void multi_run(fcase *c, int n, int capture, uint16_t **out) {
    ls_err e = {0};
    gemm_args a[8];
    for (int i = 0; i < n; i++) {
        const size_t yb = sizeof(uint16_t) * c[i].M * c[i].N;
        uint16_t *nan = malloc(yb);
        for (size_t j = 0; j < yb / 2; j++) nan[j] = 0x7fc1;
        assert_int_equal(g_mem->h2d(c[i].dy, nan, yb, g_st, &e), 0);
        free(nan);
        a[i] = (gemm_args){.M = c[i].M, .x = c[0].dx, .w = &c[i].lw, .y = c[i].dy, .accumulate = 0, .dt = ACT_BF16};
    }
    assert_int_equal(g_mem->sync(g_st, &e), 0);
    const gemm_impl *g = backend("cuda_gemv");
    assert_non_null(g->run_multi);
    if (!capture) {
        int rc = g->run_multi(n, a, g_st, &e);
        if (rc) fprintf(stderr, "cuda_gemv run_multi: %s\n", e.msg);
        assert_int_equal(rc, 0);
    } else {
        ls_stream cs;
        assert_int_equal(cug_stream_new(&cs, &e), 0);
        assert_int_equal(cug_begin(cs, &e), 0);
        int rc = g->run_multi(n, a, cs, &e);
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
    for (int i = 0; i < n; i++) dev_fetch(out[i], c[i].dy, sizeof(uint16_t) * c[i].M * c[i].N);
}
#endif

/* The grouped launch: 4 weights of different N (and scale layouts) behind one x, one launch;
 * each y against fp64; repeated and graph-replayed bit for bit. */
static void test_fp8_grouped_weights_match_fp64(void **st) {
    (void)st;
#ifdef LS_HAVE_CUDA
    if (!have_gpu()) skip();
    static const int Ns[4] = {2048, 512, 64, 200};
    static const int Ms[] = {1, 5, 16};
    const int K = 2048;
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
        for (int mix = 0; mix < 2; mix++) { /* mix 0: all per-row (one scale a row); 1: layouts mixed */
            const int M = Ms[mi];
            fcase c[4];
            uint16_t *y[4], *y2[4];
            for (int i = 0; i < 4; i++) {
                case_new(&c[i], M, Ns[i], K, mix ? i % L_N : L_ROW);
                y[i] = malloc(sizeof(uint16_t) * M * Ns[i]);
                y2[i] = malloc(sizeof(uint16_t) * M * Ns[i]);
            }
            ls_err e = {0};
            for (int i = 1; i < 4; i++) { /* share case 0's x */
                memcpy(c[i].x, c[0].x, sizeof(uint16_t) * M * K);
                assert_int_equal(g_mem->h2d(c[i].dx, c[0].x, sizeof(uint16_t) * M * K, g_st, &e), 0);
            }
            multi_run(c, 4, 0, y);
            for (int i = 0; i < 4; i++) {
                double amax;
                double *ref = case_ref(&c[i], 0, &amax);
                const double wst = check_close("cuda_gemv grouped", &c[i], y[i], ref, amax);
                fprintf(stderr, "  cuda_gemv grouped %d/4 %s M=%-2d [%5d x %5d]: worst |err|/max|ref| %.2e\n", i,
                        layout_name[c[i].lw.fs_cols > 1 ? L_BLOCK : c[i].lw.fs_n > 1 ? L_ROW : L_TENSOR], M,
                        c[i].N, K, wst);
                free(ref);
            }
            multi_run(c, 4, 0, y2);
            for (int i = 0; i < 4; i++) assert_memory_equal(y[i], y2[i], sizeof(uint16_t) * M * c[i].N);
            multi_run(c, 4, 1, y2);
            for (int i = 0; i < 4; i++) assert_memory_equal(y[i], y2[i], sizeof(uint16_t) * M * c[i].N);
            for (int i = 0; i < 4; i++) {
                free(y[i]);
                free(y2[i]);
                case_free(&c[i]);
            }
        }
#else
    skip();
#endif
}

/* Bitwise identical repeats; a CUDA graph replay gives the eager bits (cuda_gemv, and
 * cuda_cublaslt whose BF16 workspace the eager call grew first). */
static void test_fp8_repeats_and_graph_replay_are_bitwise_equal(void **st) {
    (void)st;
#ifdef LS_HAVE_CUDA
    if (!have_gpu()) skip();
    static const int shapes[][4] = {{1, 4096, 4096, L_BLOCK}, {16, 64, 2048, L_ROW}, {5, 2048, 4096, L_TENSOR},
                                    {13, 12288, 2048, L_BLOCK}};
    static const char *const names[] = {"cuda_gemv", "cuda_cublaslt"};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int b = 0; b < 2; b++) {
            fcase c;
            case_new(&c, shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3]);
            const size_t n = (size_t)c.M * c.N;
            uint16_t *a = malloc(n * 2), *r = malloc(n * 2);
            case_run(&c, names[b], 1, a);
            for (int k = 0; k < 4; k++) {
                case_run(&c, names[b], 1, r);
                assert_memory_equal(a, r, n * 2);
            }
            /* the graph: y preset to y0 on the capture stream's side, then the captured call */
            ls_err e = {0};
            ls_stream cs;
            assert_int_equal(cug_stream_new(&cs, &e), 0);
            assert_int_equal(g_mem->h2d(c.dy, c.y0, n * 2, g_st, &e), 0);
            assert_int_equal(g_mem->sync(g_st, &e), 0);
            gemm_args ga = {.M = c.M, .x = c.dx, .w = &c.lw, .y = c.dy, .accumulate = 1, .dt = ACT_BF16};
            assert_int_equal(cug_begin(cs, &e), 0);
            int rc = backend(names[b])->run(&ga, cs, &e);
            void *exec = NULL;
            int rc2 = cug_end(cs, rc == 0, &exec, &e);
            if (rc || rc2) fprintf(stderr, "capture %s: %s\n", names[b], e.msg);
            assert_int_equal(rc, 0);
            assert_int_equal(rc2, 0);
            assert_int_equal(cug_launch(exec, cs, &e), 0);
            assert_int_equal(g_mem->sync(cs, &e), 0);
            dev_fetch(r, c.dy, n * 2);
            assert_memory_equal(a, r, n * 2);
            cug_destroy(exec);
            cug_stream_free(cs);
            free(a); free(r);
            case_free(&c);
        }
#else
    skip();
#endif
}

/* Programmatic dependent launch: y1 = x·W1ᵀ, y2 = y1·W2ᵀ, y3 = y2·W3ᵀ back to back on one
 * stream (outputs NaN-poisoned first): each link must wait for its input before staging
 * it; checked against fp64 from the device's own y1 / y2. */
static void test_fp8_dependent_chain_waits_for_its_input(void **st) {
    (void)st;
#ifdef LS_HAVE_CUDA
    if (!have_gpu()) skip();
    const int M = 3;
    fcase c[3];
    case_new(&c[0], M, 2048, 4096, L_BLOCK); /* x [M,4096] -> y1 [M,2048] */
    case_new(&c[1], M, 8192, 2048, L_ROW);   /* y1 -> y2 [M,8192] */
    case_new(&c[2], M, 512, 8192, L_TENSOR); /* y2 -> y3 [M,512] */
    ls_err e = {0};
    uint16_t *h[3];
    for (int i = 0; i < 3; i++) h[i] = malloc(sizeof(uint16_t) * M * c[i].N);
    for (int round = 0; round < 10; round++) {
        for (int i = 0; i < 3; i++) {
            const size_t yb = sizeof(uint16_t) * M * c[i].N;
            for (size_t j = 0; j < yb / 2; j++) h[i][j] = 0x7fc1;
            assert_int_equal(g_mem->h2d(c[i].dy, h[i], yb, g_st, &e), 0);
        }
        for (int i = 0; i < 3; i++) {
            gemm_args a = {.M = M, .x = i ? c[i - 1].dy : c[0].dx, .w = &c[i].lw, .y = c[i].dy, .accumulate = 0,
                           .dt = ACT_BF16};
            assert_int_equal(backend("cuda_gemv")->run(&a, g_st, &e), 0);
        }
        for (int i = 0; i < 3; i++) dev_fetch(h[i], c[i].dy, sizeof(uint16_t) * M * c[i].N);
        if (round % 5 == 0) {
            memcpy(c[1].x, h[0], sizeof(uint16_t) * M * c[0].N);
            memcpy(c[2].x, h[1], sizeof(uint16_t) * M * c[1].N);
            for (int i = 0; i < 3; i++) {
                double amax;
                double *ref = case_ref(&c[i], 0, &amax);
                check_close("chain", &c[i], h[i], ref, amax);
                free(ref);
            }
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

/* cuda_gemv refuses K % 64 != 0, M > 16 and scale blocks that split a 64-column group, with
 * the reason; cuda_cublaslt and cuda_ref take those and stay right. */
static void test_fp8_gemv_refuses_what_it_does_not_take(void **st) {
    (void)st;
#ifdef LS_HAVE_CUDA
    if (!have_gpu()) skip();
    char why[256];
    const gemm_impl *g = backend("cuda_gemv");
    gemm_shape s = {.M = 17, .N = 512, .K = 4096, .wk = W_FP8, .dt = ACT_BF16};
    assert_false(g->supported(&g_dev, &s, why, sizeof why));
    assert_non_null(strstr(why, "M=17"));
    s.M = 4, s.K = 1000;
    assert_false(g->supported(&g_dev, &s, why, sizeof why));
    assert_non_null(strstr(why, "K=1000 is not a multiple of 64"));
    s.K = 4096;
    assert_true(g->supported(&g_dev, &s, why, sizeof why));
    assert_true(backend("cuda_cublaslt")->supported(&g_dev, &s, why, sizeof why));
    assert_true(backend("cuda_ref")->supported(&g_dev, &s, why, sizeof why));

    /* K = 1000 at run time: refused by the GEMV with its reason; the other two are right */
    fcase c;
    case_new(&c, 3, 200, 1000, L_ROW);
    ls_err e = {0};
    gemm_args a = {.M = c.M, .x = c.dx, .w = &c.lw, .y = c.dy, .accumulate = 0, .dt = ACT_BF16};
    assert_int_equal(g->run(&a, g_st, &e), ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "not a multiple of 64"));
    fprintf(stderr, "  refused: %s\n", e.msg);
    case_check_all_g(&c, 1, "K=1000 (no gemv)", 0);
    case_free(&c);

    /* scale blocks of 96 columns: 64-column groups straddle them */
    case_new_view(&c, 2, 256, 1024, L_BLOCK, 256, 1024, 0, 0, 0, 0);
    c.lw.fs_bc = 96;
    c.lw.fs_cols = (1024 + 95) / 96;
    const size_t fn = (size_t)2 * c.lw.fs_cols;
    free(c.fs);
    c.fs = malloc(sizeof(float) * fn);
    for (size_t i = 0; i < fn; i++) c.fs[i] = (1.5f + urand()) * 1.5e-3f;
    g_mem->free(c.dfs);
    c.dfs = dev_copy(c.fs, sizeof(float) * fn);
    c.lw.fscale = c.dfs, c.lw.fs_n = fn;
    a = (gemm_args){.M = c.M, .x = c.dx, .w = &c.lw, .y = c.dy, .accumulate = 0, .dt = ACT_BF16};
    memset(&e, 0, sizeof e);
    assert_int_equal(g->run(&a, g_st, &e), ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "64-column group"));
    fprintf(stderr, "  refused: %s\n", e.msg);
    /* a TP slice starting inside a 64-group of 128-blocks: refused too */
    c.lw.fs_bc = 128, c.lw.fs_cols = 9, c.lw.fs_c0 = 32;
    memset(&e, 0, sizeof e);
    assert_int_equal(g->run(&a, g_st, &e), ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "64-column group"));
    c.lw.fs_bc = 96, c.lw.fs_cols = (1024 + 95) / 96, c.lw.fs_c0 = 0;
    case_check_all_g(&c, 0, "96-col blocks (no gemv)", 0);
    /* scales that do not cover the view: refused by all three */
    c.lw.fs_n = fn - 1;
    static const char *const all[] = {"cuda_gemv", "cuda_cublaslt", "cuda_ref"};
    for (int i = 0; i < 3; i++) {
        memset(&e, 0, sizeof e);
        assert_int_equal(backend(all[i])->run(&a, g_st, &e), ERR_UNSUPPORTED);
        assert_non_null(strstr(e.msg, "do not cover"));
    }
    case_free(&c);
#else
    skip();
#endif
}

#ifdef LS_HAVE_CUDA
/* --bench: per-call time of cuda_gemv in a chain of back-to-back launches (programmatic
 * dependent launch free to overlap them) over R rotating weight copies, queued behind a
 * timing hold; FP8 and the same shape in BF16. */
static double bench_one(int fp8, int M, int N, int K, int layout) {
    ls_err e = {0};
    const size_t wb = (size_t)N * K * (fp8 ? 1 : 2);
    int R = (int)((400u << 20) / wb);
    if (R < 2) R = 2;
    if (R > 16) R = 16;
    void *dw[16];
    uint8_t *hw = malloc(wb);
    for (size_t i = 0; i < wb; i++) hw[i] = fp8 ? rnd_code() : (uint8_t)(rnd() & 0x3f); /* BF16: small, finite */
    for (int r = 0; r < R; r++) dw[r] = dev_copy(hw, wb);
    free(hw);
    fcase c;
    memset(&c, 0, sizeof c);
    c.M = M, c.N = N, c.K = K;
    c.lw = (lin_w){.kind = W_FP8, .N = N, .K = K, .name = "bench"};
    make_scales(&c, layout, N, K, 0, 0);
    void *dfs = dev_copy(c.fs, sizeof(float) * c.lw.fs_n);
    uint16_t *hx = malloc(sizeof(uint16_t) * M * K);
    for (size_t i = 0; i < (size_t)M * K; i++) hx[i] = f32_to_bf16(urand());
    void *dx = dev_copy(hx, sizeof(uint16_t) * M * K);
    void *dy = g_mem->alloc(sizeof(uint16_t) * M * N, &e);
    lin_w w[16];
    for (int r = 0; r < R; r++) {
        w[r] = c.lw;
        w[r].data = dw[r];
        w[r].fscale = dfs;
        if (!fp8) w[r].kind = W_BF16;
    }
    const gemm_impl *g = backend("cuda_gemv");
    ls_stream cs;
    assert_int_equal(cug_stream_new(&cs, &e), 0);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    const int calls = 64;
    double best = 1e30;
    for (int rep = 0; rep < 4; rep++) {
        assert_int_equal(g_mem->sync(g_st, &e), 0);
        assert_int_equal(lsc_hold(3000, &e), 0);
        cudaEventRecord(e0, (cudaStream_t)cs);
        for (int i = 0; i < calls; i++) {
            gemm_args a = {.M = M, .x = dx, .w = &w[i % R], .y = dy, .accumulate = 0, .dt = ACT_BF16};
            int rc = g->run(&a, cs, &e);
            if (rc) fprintf(stderr, "bench: %s\n", e.msg);
            assert_int_equal(rc, 0);
        }
        cudaEventRecord(e1, (cudaStream_t)cs);
        assert_int_equal(cudaEventSynchronize(e1), cudaSuccess);
        float ms = 0;
        cudaEventElapsedTime(&ms, e0, e1);
        const double us = ms * 1e3 / calls;
        if (rep > 0 && us < best) best = us; /* rep 0: warm-up */
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cug_stream_free(cs);
    for (int r = 0; r < R; r++) g_mem->free(dw[r]);
    g_mem->free(dfs); g_mem->free(dx); g_mem->free(dy);
    free(c.fs); free(hx);
    return best;
}

/* --bench N K M L: one configuration (L: 0 per tensor, 1 per row, 2 128 x 128), FP8 only. */
static int bench(int argc, char **argv) {
    if (!have_gpu()) return 0;
    if (argc >= 6) {
        const int N = atoi(argv[2]), K = atoi(argv[3]), M = atoi(argv[4]), L = atoi(argv[5]);
        const double t = bench_one(1, M, N, K, L);
        fprintf(stderr, "%dx%d %s M=%d: %.2f us, %.0f GB/s\n", N, K, layout_name[L], M, t, (double)N * K / t / 1e3);
        return 0;
    }
    ls_err e = {0};
    const double copy = lsc_copy_bw_gbs((size_t)1 << 30, 10, &e);
    fprintf(stderr, "copy bandwidth (read + write): %.0f GB/s\n", copy);
    static const int NK[][2] = {{4096, 4096}, {16384, 4096}, {2048, 4096}, {12288, 2048}, {64, 2048}, {1024, 4096}};
    static const int Ms[] = {1, 4, 8, 16};
    fprintf(stderr, "%-15s %-9s %3s %9s %8s %9s %8s\n", "shape", "layout", "M", "fp8 us", "GB/s", "bf16 us", "GB/s");
    for (size_t s = 0; s < sizeof NK / sizeof NK[0]; s++)
        for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
            for (int L = 0; L < L_N; L += 2) { /* per tensor, 128 x 128 */
                const int N = NK[s][0], K = NK[s][1], M = Ms[mi];
                const double t8 = bench_one(1, M, N, K, L);
                const double t16 = L == 0 ? bench_one(0, M, N, K, L) : 0;
                char sh[32];
                snprintf(sh, sizeof sh, "%dx%d", N, K);
                fprintf(stderr, "%-15s %-9s %3d %9.2f %8.0f %9.2f %8.0f\n", sh, layout_name[L], M, t8,
                        (double)N * K / t8 / 1e3, t16, t16 > 0 ? 2.0 * N * K / t16 / 1e3 : 0.0);
            }
    return 0;
}
#endif

int main(int argc, char **argv) {
    const char *f = getenv("LS_TEST_FILTER");
    if (f && *f) cmocka_set_test_filter(f);
#ifdef LS_HAVE_CUDA
    if (argc > 1 && !strcmp(argv[1], "--bench")) return bench(argc, argv);
#else
    (void)argv;
    if (argc > 1) return 0;
#endif
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fp8_backends_match_fp64_on_decode_shapes),
        cmocka_unit_test(test_fp8_tensor_parallel_views_read_the_right_scales),
        cmocka_unit_test(test_fp8_all_codes_and_outliers),
        cmocka_unit_test(test_fp8_grouped_weights_match_fp64),
        cmocka_unit_test(test_fp8_repeats_and_graph_replay_are_bitwise_equal),
        cmocka_unit_test(test_fp8_dependent_chain_waits_for_its_input),
        cmocka_unit_test(test_fp8_gemv_refuses_what_it_does_not_take),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
