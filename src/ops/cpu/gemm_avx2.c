/* gemm_avx2.c: the "cpu_avx2" gemm and fp4_gemm backends (y = x·Wᵀ).
 *
 * Blocks of 4 weight rows are converted (BF16/F16) or dequantised (NVFP4) to
 * fp32 once, then every activation row is dotted with all 4 at a time with
 * 8-wide FMAs, so each x load feeds 4 multiply-adds and the 4 rows stay in
 * L1. Threads split the row blocks. Registered only when the CPU has AVX2
 * and FMA (checked at run time; the rest of the build targets x86-64-v2).
 * Summation order differs from cpu_ref (8 lanes, FMA), so results agree to
 * fp32 rounding, not bit for bit.
 */
#include "ops/cpu/cpu.h"

#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)

typedef struct avx_ctx {
    int M;
    const float *x; /* [M, K] */
    const lin_w *w; /* [N, K] */
    float *y;       /* [M, N] */
    int accumulate;
} avx_ctx;

__attribute__((target("avx2,fma"))) static float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}

/* Row n of W as fp32, vectorised for BF16 and NVFP4 (same values as lin_row_f32). */
__attribute__((target("avx2,fma"))) static void avx_row_f32(const lin_w *w, int n, float *out) {
    const int K = w->K;
    if (w->kind == W_BF16) {
        const uint16_t *r = (const uint16_t *)w->data + (size_t)n * K;
        int k = 0;
        for (; k + 8 <= K; k += 8) {
            __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(r + k)));
            _mm256_storeu_ps(out + k, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
        }
        for (; k < K; k++) out[k] = bf16_to_f32(r[k]);
    } else if (w->kind == W_NVFP4) {
        /* per block of 16: codes (low nibble first) -> |E2M1| by permute, sign from bit 3 */
        const __m256 lut = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
        const __m128i lo_mask = _mm_set1_epi8(0x0F);
        const __m256i sign_bit = _mm256_set1_epi32(8);
        const uint8_t *codes = (const uint8_t *)w->data + (size_t)n * (K / 2);
        const uint8_t *sc = w->scale + (size_t)n * (K / 16);
        const float *fp8 = ops_fp8_e4m3_table();
        for (int b = 0; b < K / 16; b++) {
            const __m256 s = _mm256_set1_ps(fp8[sc[b]] * w->scale2);
            __m128i by = _mm_loadl_epi64((const __m128i *)(codes + b * 8));
            __m128i lo = _mm_and_si128(by, lo_mask), hi = _mm_and_si128(_mm_srli_epi16(by, 4), lo_mask);
            __m128i el = _mm_unpacklo_epi8(lo, hi); /* 16 codes in element order */
            for (int h = 0; h < 2; h++) {
                __m256i idx = _mm256_cvtepu8_epi32(h ? _mm_srli_si128(el, 8) : el);
                __m256 mag = _mm256_permutevar8x32_ps(lut, idx);
                __m256i sg = _mm256_slli_epi32(_mm256_and_si256(idx, sign_bit), 28);
                __m256 v = _mm256_xor_ps(mag, _mm256_castsi256_ps(sg));
                _mm256_storeu_ps(out + b * 16 + h * 8, _mm256_mul_ps(v, s));
            }
        }
    } else {
        lin_row_f32(w, n, out);
    }
}

__attribute__((target("avx2,fma"))) static void avx_blocks(void *p, int64_t b0, int64_t b1) {
    const avx_ctx *c = p;
    const int K = c->w->K, N = c->w->N, K8 = K & ~7;
    float *buf = aligned_alloc(32, sizeof(float) * 4 * ((K + 7) & ~7));
    for (int64_t blk = b0; blk < b1; blk++) {
        const int n0 = (int)blk * 4, nb = N - n0 < 4 ? N - n0 : 4;
        for (int r = 0; r < nb; r++) avx_row_f32(c->w, n0 + r, buf + (size_t)r * K);
        for (int r = nb; r < 4; r++) memset(buf + (size_t)r * K, 0, sizeof(float) * K);
        const float *w0 = buf, *w1 = buf + K, *w2 = buf + 2 * (size_t)K, *w3 = buf + 3 * (size_t)K;
        for (int m = 0; m < c->M; m++) {
            const float *xm = c->x + (size_t)m * K;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int k = 0; k < K8; k += 8) {
                __m256 xv = _mm256_loadu_ps(xm + k);
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + k), xv, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + k), xv, a1);
                a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + k), xv, a2);
                a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + k), xv, a3);
            }
            float d[4] = {hsum8(a0), hsum8(a1), hsum8(a2), hsum8(a3)};
            for (int k = K8; k < K; k++) {
                d[0] += w0[k] * xm[k];
                d[1] += w1[k] * xm[k];
                d[2] += w2[k] * xm[k];
                d[3] += w3[k] * xm[k];
            }
            float *o = c->y + (size_t)m * N + n0;
            for (int r = 0; r < nb; r++) o[r] = c->accumulate ? o[r] + d[r] : d[r];
        }
    }
    free(buf);
}

static void avx_gemm(const gemm_args *a) {
    if (a->M <= 0) return;
    avx_ctx c = {a->M, a->x, a->w, a->y, a->accumulate};
    int64_t blocks = (a->w->N + 3) / 4;
    int64_t per = (int64_t)a->M * a->w->K * 4;
    pool_for(blocks, per >= 65536 ? 1 : 65536 / (per ? per : 1), avx_blocks, &c);
}

static int cpu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

static int supported(const dev_info *d, const gemm_shape *s, int nvfp4, char *why, size_t n) {
    if (d->kind != DEV_CPU) { if (why) snprintf(why, n, "CPU backend"); return 0; }
    if (!cpu_has_avx2()) { if (why) snprintf(why, n, "the CPU lacks AVX2/FMA"); return 0; }
    if ((s->wk == W_NVFP4) != nvfp4) { if (why) snprintf(why, n, "weight kind %s", w_kind_name(s->wk)); return 0; }
    return cpu_supports_dt(s->dt, why, n);
}
static int gemm_supported(const dev_info *d, const gemm_shape *s, char *why, size_t n) {
    return supported(d, s, 0, why, n);
}
static int fp4_supported(const dev_info *d, const gemm_shape *s, char *why, size_t n) {
    if (s->K % 16) { if (why) snprintf(why, n, "K=%d not a multiple of 16", s->K); return 0; }
    return supported(d, s, 1, why, n);
}

static int run(const gemm_args *a, int nvfp4, ls_err *e) {
    if (a->dt != ACT_F32)
        return errf(e, ERR_UNSUPPORTED, "cpu_avx2: activations must be f32, got %s", act_name(a->dt));
    if ((a->w->kind == W_NVFP4) != nvfp4)
        return errf(e, ERR_INVAL, "%s: weight %s is %s", nvfp4 ? "fp4_gemm" : "gemm",
                    a->w->name ? a->w->name : "?", w_kind_name(a->w->kind));
    avx_gemm(a);
    return 0;
}
static int gemm_run(const gemm_args *a, ls_stream s, ls_err *e) { return run(a, 0, e); }
static int fp4_run(const gemm_args *a, ls_stream s, ls_err *e) { return run(a, 1, e); }

static const gemm_impl gemm_cpu_avx2 = {"cpu_avx2", DEV_CPU, 0, gemm_supported, gemm_run};
static const fp4_gemm_impl fp4_gemm_cpu_avx2 = {"cpu_avx2", DEV_CPU, 0, fp4_supported, fp4_run};

void cpu_gemm_fast_f32(int M, const float *x, const lin_w *w, float *y, int accumulate) {
    static int have = -1;
    if (have < 0) have = cpu_has_avx2();
    if (!have) { cpu_gemm_f32(M, x, w, y, accumulate); return; }
    gemm_args a = {.M = M, .x = x, .w = w, .y = y, .accumulate = accumulate, .dt = ACT_F32};
    avx_gemm(&a);
}

void cpu_register_avx2(void) {
    if (!cpu_has_avx2()) return;
    ops_gemm_register(&gemm_cpu_avx2);
    ops_fp4_gemm_register(&fp4_gemm_cpu_avx2);
}

#else
void cpu_gemm_fast_f32(int M, const float *x, const lin_w *w, float *y, int accumulate) {
    cpu_gemm_f32(M, x, w, y, accumulate);
}
void cpu_register_avx2(void) {}
#endif
