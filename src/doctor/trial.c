/* trial.c: the child side of the doctor, `laststand doctor --trial`: one
 * backend of one family, on a list of jobs (shape x M), in a fresh process
 * (and so a fresh CUDA context) that the parent may lose to a crash.
 *
 * Protocol (stdout, one line each, flushed): "BEGIN <job>" before a job and
 * "RESULT <job> <json>" after it, json = {"status": ok|wrong|unsupported|
 * crash|unverified, "detail", "ms", "bytes", "flops", "rel", "max", "ref"}.
 * A fault that kills the CUDA context (illegal address...) is printed to
 * stderr and the child aborts: the parent records the crash with the log tail
 * and restarts a child after that job.
 *
 * Per job: random inputs at the real shape (weights: random E2M1 codes and
 * E4M3 scales; activations with rows of very different magnitudes, so that
 * per-row mistakes show), output poisoned with NaN (0xFF bytes) first, the
 * backend run once, then: NaN/Inf/unwritten -> wrong, all zero -> wrong,
 * else compared with the fp64 CPU oracle (small problems) or with the GPU
 * reference kernel cuda_ref (large ones, if the parent trusts it). Then the
 * median of repeated timed runs over rotating input sets > 2x the L2; on CUDA
 * the calls are queued back to back behind a GPU-side hold so that the host's
 * launch latency stays out, and timed in chains of 8 (td_time says how; this is
 * the GPU time the engine's CUDA graphs will see).
 */
#include "doctor/doctor.h"
#include "doctor/trial.h"
#ifdef LS_HAVE_CUDA
#include "ops/cuda/cuda_ops.h"
#endif

#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- device memory ------------------------------------------------------------ */

static dev_info g_dev;
static int g_cuda;

/* Where a job's wall time goes, reported with its result (td_result) and reset there:
 * device allocations and host-to-device copies, and td_time's timed calls. */
static double g_put_s, g_time_s;

void *td_alloc(size_t n, ls_err *e) {
#ifdef LS_HAVE_CUDA
    if (g_cuda) {
        double t0 = now_sec();
        void *p = lsc_malloc(n, e);
        g_put_s += now_sec() - t0;
        return p;
    }
#endif
    void *p = NULL;
    if (posix_memalign(&p, 64, n ? n : 64)) {
        errf(e, ERR_NOMEM, "out of memory (%zu bytes)", n);
        return NULL;
    }
    return p;
}
void td_free(void *p) {
#ifdef LS_HAVE_CUDA
    if (g_cuda) {
        lsc_free(p);
        return;
    }
#endif
    free(p);
}
int td_put(void *dst, const void *src, size_t n, ls_err *e) {
#ifdef LS_HAVE_CUDA
    if (g_cuda) {
        double t0 = now_sec();
        int rc = lsc_h2d(dst, src, n, e);
        g_put_s += now_sec() - t0;
        return rc;
    }
#endif
    memcpy(dst, src, n);
    return 0;
}
int td_get(void *dst, const void *src, size_t n, ls_err *e) {
#ifdef LS_HAVE_CUDA
    if (g_cuda) return lsc_d2h(dst, src, n, e);
#endif
    memcpy(dst, src, n);
    return 0;
}
int td_copy(void *dst, const void *src, size_t n, ls_err *e) {
#ifdef LS_HAVE_CUDA
    if (g_cuda) return lsc_d2d(dst, src, n, e);
#endif
    memcpy(dst, src, n);
    return 0;
}
int td_poison(void *dst, size_t n, ls_err *e) {
#ifdef LS_HAVE_CUDA
    if (g_cuda) return lsc_memset(dst, 0xff, n, e);
#endif
    memset(dst, 0xff, n);
    return 0;
}
int td_zero(void *dst, size_t n, ls_err *e) {
#ifdef LS_HAVE_CUDA
    if (g_cuda) return lsc_memset(dst, 0, n, e);
#endif
    memset(dst, 0, n);
    return 0;
}
/* A kernel fault kills the context: say so on stderr and die, for the parent. */
int td_sync(ls_err *e) {
#ifdef LS_HAVE_CUDA
    if (g_cuda) {
        int sticky = 0;
        int rc = lsc_sync(&sticky, e);
        if (rc && sticky) {
            fprintf(stderr, "doctor trial: fatal CUDA error, context lost: %s\n", e->msg);
            fflush(stderr);
            abort();
        }
        return rc;
    }
#endif
    return 0;
}
size_t td_l2_bytes(void) {
#ifdef LS_HAVE_CUDA
    if (g_cuda) return (size_t)lsc_l2_bytes();
#endif
    return 64u << 20;
}
act_dtype td_act(void) { return g_cuda ? ACT_BF16 : ACT_F32; }
const dev_info *td_dev(void) { return &g_dev; }

/* Upload host floats as the device's activation dtype. */
/* BF16 <-> fp32 conversion of large activation buffers, in parallel. */
typedef struct conv_ctx {
    float *f;
    uint16_t *h;
} conv_ctx;
static void conv_to_bf16(void *p, int64_t i0, int64_t i1) {
    conv_ctx *c = p;
    for (int64_t i = i0; i < i1; i++) c->h[i] = f32_to_bf16(c->f[i]);
}
static void conv_to_f32(void *p, int64_t i0, int64_t i1) {
    conv_ctx *c = p;
    for (int64_t i = i0; i < i1; i++) c->f[i] = bf16_to_f32(c->h[i]);
}

int td_put_act(void *dst, const float *src, size_t n, ls_err *e) {
    if (td_act() == ACT_F32) return td_put(dst, src, n * 4, e);
    uint16_t *t = xmalloc(n * 2);
    conv_ctx cc = {.f = (float *)src, .h = t};
    pool_for((int64_t)n, 1 << 16, conv_to_bf16, &cc);
    int rc = td_put(dst, t, n * 2, e);
    free(t);
    return rc;
}
/* Download n activations as floats. */
int td_get_act(float *dst, const void *src, size_t n, ls_err *e) {
    if (td_act() == ACT_F32) return td_get(dst, src, n * 4, e);
    uint16_t *t = xmalloc(n * 2);
    int rc = td_get(t, src, n * 2, e);
    conv_ctx cc = {.f = dst, .h = t};
    if (!rc) pool_for((int64_t)n, 1 << 16, conv_to_f32, &cc);
    free(t);
    return rc;
}

/* ---- timing --------------------------------------------------------------------- */

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* How a call is timed on CUDA: after a warm-up (and a first touch of a few
 * rotating sets), the host measures how long it takes to enqueue one call, then
 * enqueues a "hold" kernel (lsc_hold: the GPU spins on its own clock for about
 * 1.5x the time the host needs to enqueue all timed calls, at most 200 ms) and
 * behind it the timed calls, so that they run back to back on a busy GPU without
 * the host's launch latency in between. Two methods (td_timing_name):
 *
 *   chain8 (the default): each of the samples is (event, C calls back to back on
 *     the next C rotating sets, event), and the call's time is the pair's elapsed
 *     time / C, median over the samples; C = 8 for fast calls (a warm call and its
 *     sync under 0.1 ms, i.e. kernels under ~50 us), 1 for the others. This is how serve runs
 *     a decode step: kernels queued back to back in a CUDA graph, where a kernel
 *     launched with programmatic dependent launch may start its loads while the
 *     one before it ends. An event between every two calls would stop that
 *     overlap and charge each call a whole kernel boundary (~1.5-2 us on an H200)
 *     that serve does not pay.
 *   isolated (LASTSTAND_DOCTOR_TIMING=isolated; the method before chain8, kept to
 *     compare): every call between its own event pair, median over the pairs.
 *
 * Same method for every family and backend. The number of timed calls is the
 * same either way (about 25 ms of calls, 3 to 50: the doctor's run time does not
 * change). If the hold ran out before the host finished enqueuing, the loop is
 * redone once with a 4x longer hold. A call whose host time is nearly all of its
 * warm-up time waits for the GPU inside (a host round trip, e.g. cuda_expert_loop):
 * no hold can cover that, so it is timed on the idle GPU, host gaps included.
 * On the CPU device: wall time per call, median. */
#ifndef LSC_HOLD_MAX_US
#define LSC_HOLD_MAX_US 200000.0 /* (CPU-only build: never used) */
#endif

/* 1 = isolated, 0 = chain; read once */
static int timing_isolated(void) {
    static int v = -1;
    if (v < 0) {
        const char *t = getenv("LASTSTAND_DOCTOR_TIMING");
        v = t && !strcmp(t, "isolated");
    }
    return v;
}

const char *td_timing_name(void) { return timing_isolated() ? "isolated" : "chain8"; }

/* nsamp samples of chain calls each; ms[i] = sample i's time per call */
static int time_cuda(td_call fn, void *ctx, int nsets, int nsamp, int chain, double hold_us, double *ms,
                     int *covered, ls_err *e) {
#ifdef LS_HAVE_CUDA
    lsc_timer *t = lsc_timer_new(nsamp, e);
    if (!t) return ERR_RUNTIME;
    int rc = hold_us > 0 ? lsc_hold(hold_us, e) : 0;
    for (int i = 0, k = 0; i < nsamp && !rc; i++) {
        lsc_timer_start(t, i);
        for (int c = 0; c < chain && !rc; c++) rc = fn(ctx, ++k % nsets, e);
        lsc_timer_stop(t, i);
    }
    *covered = hold_us > 0 && !lsc_hold_over();
    if (!rc) rc = td_sync(e);
    for (int i = 0; !rc && i < nsamp; i++) ms[i] = lsc_timer_ms(t, i) / chain;
    lsc_timer_free(t);
    return rc;
#else
    (void)fn; (void)ctx; (void)nsets; (void)nsamp; (void)chain; (void)hold_us; (void)ms; (void)covered;
    return errf(e, ERR_UNSUPPORTED, "built without CUDA");
#endif
}

static int td_time_(td_call fn, void *ctx, int nsets, double *median_ms, ls_err *e);
int td_time(td_call fn, void *ctx, int nsets, double *median_ms, ls_err *e) {
    double t0 = now_sec();
    int rc = td_time_(fn, ctx, nsets, median_ms, e);
    g_time_s += now_sec() - t0;
    return rc;
}
static int td_time_(td_call fn, void *ctx, int nsets, double *median_ms, ls_err *e) {
    /* warm-up + an estimate of one call */
    double t0 = now_sec();
    int rc = fn(ctx, 0, e);
    if (!rc) rc = td_sync(e);
    if (rc) return rc;
    double est = (now_sec() - t0) * 1e3;
    /* a first call may carry one-time costs (a library loaded, a workspace grown): the
     * estimate is the faster of it and a second, warm call */
    if (g_cuda) {
        t0 = now_sec();
        rc = fn(ctx, 0, e);
        if (!rc) rc = td_sync(e);
        if (rc) return rc;
        const double warm = (now_sec() - t0) * 1e3;
        if (warm < est) est = warm;
    }
    /* about 25 ms of timed calls: up to 50 for fast kernels, 3 for the slow references
     * (the median of that many is stable to a few percent; the doctor runs ~500 jobs) */
    int reps = est > 0 ? (int)(25.0 / est) : 50;
    if (reps < 3) reps = 3;
    if (reps > 50) reps = 50;
    /* chain8: the same calls as reps samples of C (at least 5 samples) */
    const int chain = g_cuda && !timing_isolated() && est < 0.1 ? 8 : 1;
    int nsamp = chain > 1 ? reps / chain : reps;
    if (nsamp < 5 && chain > 1) nsamp = 5;
    double *ms = xcalloc(nsamp, sizeof(double));
    if (g_cuda) {
        /* touch a few sets (first-use costs stay out) and take the host's enqueue time
         * per call: the fastest of these, the GPU possibly busy with the one before */
        double host = est;
        for (int q = 0; q < 3 && est < 10.0 && !rc; q++) {
            double a = now_sec();
            rc = fn(ctx, nsets > 1 ? 1 + q % (nsets - 1) : 0, e);
            double h = (now_sec() - a) * 1e3;
            if (h < host) host = h;
        }
        if (!rc) rc = td_sync(e);
        if (rc) goto out;
        /* + two event records per sample; 1.5x margin */
        double hold_us = host >= 0.8 * est ? 0 : 1.5 * ((double)nsamp * chain * host * 1e3 + nsamp * 2.0) + 50.0;
        int covered = 0;
        rc = time_cuda(fn, ctx, nsets, nsamp, chain, hold_us, ms, &covered, e);
        if (!rc && hold_us > 0 && !covered && hold_us < LSC_HOLD_MAX_US)
            rc = time_cuda(fn, ctx, nsets, nsamp, chain, 4 * hold_us, ms, &covered, e);
        goto out;
    }
    for (int i = 0; i < nsamp && !rc; i++) {
        double a = now_sec();
        rc = fn(ctx, (i + 1) % nsets, e);
        ms[i] = (now_sec() - a) * 1e3;
    }
out:
    if (!rc) {
        qsort(ms, nsamp, sizeof(double), cmp_d);
        *median_ms = ms[nsamp / 2];
    }
    free(ms);
    return rc;
}

int td_nsets(size_t set_bytes) {
    if (!g_cuda) return 1;
    size_t want = 2 * td_l2_bytes() + (16u << 20);
    size_t n = (want + set_bytes - 1) / (set_bytes ? set_bytes : 1);
    if (n < 2) n = 2;
    if (n > 256) n = 256;
    return (int)n;
}

/* ---- random inputs ---------------------------------------------------------------- */

uint64_t td_rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
float td_rng_unit(uint64_t *s) { return (float)((td_rng_next(s) >> 40) * (1.0 / 16777216.0)) * 2.f - 1.f; }

/* Random tensors are generated in parallel, one RNG stream per row seeded from
 * one draw of the caller's stream: the values depend on the seed and the shape
 * only, never on the thread count (generation of the 397B layer's 512 experts
 * single-threaded took most of a moe trial's time). */
typedef struct gen_ctx {
    int kind; /* 0 activations (float), 1 NVFP4 codes + scales, 2 BF16 weight, 3 FP8 codes */
    int K;
    uint64_t base;
    float amp;
    void *a, *b;
} gen_ctx;

static uint64_t row_seed(uint64_t base, int64_t row) { return base ^ ((uint64_t)(row + 1) * 0xD1B54A32D192ED03ull); }

static void gen_rows(void *p, int64_t r0, int64_t r1) {
    const gen_ctx *g = p;
    const size_t K = (size_t)g->K;
    for (int64_t r = r0; r < r1; r++) {
        uint64_t rng = row_seed(g->base, r);
        if (g->kind == 0) {
            float *x = (float *)g->a + (size_t)r * K;
            float mag = ldexpf(1.f, (int)(td_rng_next(&rng) % 13) - 6);
            for (size_t k = 0; k < K; k++) {
                float v = td_rng_unit(&rng) * mag;
                x[k] = td_act() == ACT_BF16 ? bf16_to_f32(f32_to_bf16(v)) : v;
            }
        } else if (g->kind == 1) {
            uint8_t *codes = (uint8_t *)g->a + (size_t)r * (K / 2), *sc = (uint8_t *)g->b + (size_t)r * (K / 16);
            for (size_t i = 0; i < K / 2; i += 8) {
                uint64_t v = td_rng_next(&rng);
                for (size_t j = 0; j < 8 && i + j < K / 2; j++) codes[i + j] = (uint8_t)(v >> (8 * j));
            }
            for (size_t i = 0; i < K / 16; i++) {
                uint64_t v = td_rng_next(&rng);
                int ex = 2 + (int)(v % 9); /* biased exponent 2..10: 2^-5 .. 2^3 */
                sc[i] = (uint8_t)((ex << 3) | ((v >> 8) & 7));
            }
        } else if (g->kind == 3) {
            uint8_t *w = (uint8_t *)g->a + (size_t)r * K;
            for (size_t k = 0; k < K; k += 8) {
                uint64_t v = td_rng_next(&rng);
                for (size_t j = 0; j < 8 && k + j < K; j++) {
                    uint8_t b = (uint8_t)(v >> (8 * j));
                    w[k + j] = (b & 0x7f) == 0x7f ? (uint8_t)(b ^ 1) : b; /* every code but the NaNs */
                }
            }
        } else {
            uint16_t *w = (uint16_t *)g->a + (size_t)r * K;
            for (size_t k = 0; k < K; k++) w[k] = f32_to_bf16(td_rng_unit(&rng) * g->amp);
        }
    }
}

static void gen_par(int kind, int rows, int K, float amp, void *a, void *b, uint64_t *rng) {
    gen_ctx g = {.kind = kind, .K = K, .base = td_rng_next(rng), .amp = amp, .a = a, .b = b};
    int64_t per = (int64_t)(65536 / (K > 0 ? K : 1));
    pool_for(rows, per > 0 ? per : 1, gen_rows, &g);
}

/* Activations [M, K]: uniform(-1, 1) times a per-row magnitude spanning 2^-6..2^6,
 * rounded to what the device stores (bf16 on CUDA) so host and device agree. */
void td_gen_act(float *x, int M, int K, uint64_t *rng) { gen_par(0, M, K, 1.f, x, NULL, rng); }

/* n floats uniform in (-amp, amp) (act_round: rounded to the device's activation type), in parallel:
 * one RNG stream per 64 Ki-element piece seeded from one draw of the caller's stream. */
typedef struct uni_ctx {
    float *p;
    size_t n;
    uint64_t base;
    float amp;
    int act_round;
} uni_ctx;
enum { UNI_PIECE = 1 << 16 };

static void gen_uniform_pieces(void *p, int64_t q0, int64_t q1) {
    const uni_ctx *u = p;
    const int bf = u->act_round && td_act() == ACT_BF16;
    for (int64_t q = q0; q < q1; q++) {
        uint64_t rng = row_seed(u->base, q);
        size_t i0 = (size_t)q * UNI_PIECE, i1 = i0 + UNI_PIECE < u->n ? i0 + UNI_PIECE : u->n;
        for (size_t i = i0; i < i1; i++) {
            float v = td_rng_unit(&rng) * u->amp;
            u->p[i] = bf ? bf16_to_f32(f32_to_bf16(v)) : v;
        }
    }
}

void td_gen_uniform(float *p, size_t n, float amp, int act_round, uint64_t *rng) {
    uni_ctx u = {p, n, td_rng_next(rng), amp, act_round};
    pool_for((int64_t)((n + UNI_PIECE - 1) / UNI_PIECE), 1, gen_uniform_pieces, &u);
}

/* NVFP4 weight [N, K] on the host: every code, positive E4M3 scales of 2^-5..2^3. */
void td_gen_nvfp4(int N, int K, uint8_t *codes, uint8_t *scales, float *scale2, uint64_t *rng) {
    gen_par(1, N, K, 1.f, codes, scales, rng);
    *scale2 = 1.0f / (6.0f * 448.0f) * (1.0f + 0.5f * td_rng_unit(rng));
}

/* FP8 weight [N, K] on the host: E4M3 codes of every non-NaN value (2^-9 .. 448, both signs),
 * n_scales positive fp32 scales of 2^-12 .. 2^-6. */
void td_gen_fp8(int N, int K, uint8_t *codes, float *scales, size_t n_scales, uint64_t *rng) {
    gen_par(3, N, K, 1.f, codes, NULL, rng);
    for (size_t i = 0; i < n_scales; i++) scales[i] = ldexpf(1.f + 0.5f * td_rng_unit(rng), -12 + (int)(td_rng_next(rng) % 7));
}

/* BF16 weight [N, K]: uniform(-amp, amp). */
void td_gen_bf16(int N, int K, uint16_t *w, float amp, uint64_t *rng) { gen_par(2, N, K, amp, w, NULL, rng); }

/* ---- comparison -------------------------------------------------------------------- */

/* Per-row partial results of td_check, reduced in row order afterwards (so the
 * verdict does not depend on the thread count); rows are checked in parallel
 * (outputs of 8192 x 16384 took most of a large trial's host time). */
typedef struct chk_row {
    double se, sr, me, mr;
    size_t at, bad, first;
    int nonzero;
} chk_row;
typedef struct chk_ctx {
    const float *y, *ref;
    size_t cols;
    const unsigned char *skip;
    chk_row *rows;
} chk_ctx;

static void chk_rows(void *p, int64_t r0, int64_t r1) {
    const chk_ctx *c = p;
    for (int64_t r = r0; r < r1; r++) {
        chk_row *o = &c->rows[r];
        memset(o, 0, sizeof *o);
        o->first = (size_t)-1;
        const float *y = c->y + (size_t)r * c->cols, *ref = c->ref + (size_t)r * c->cols;
        const int use = !(c->skip && c->skip[r]);
        for (size_t k = 0; k < c->cols; k++) {
            if (!isfinite(y[k])) {
                if (o->first == (size_t)-1) o->first = (size_t)r * c->cols + k;
                o->bad++;
                continue;
            }
            if (y[k] != 0.f) o->nonzero = 1;
            if (!use) continue;
            double d = fabs((double)y[k] - (double)ref[k]);
            o->se += d * d;
            o->sr += (double)ref[k] * ref[k];
            if (d > o->me) {
                o->me = d;
                o->at = (size_t)r * c->cols + k;
            }
            if (fabs(ref[k]) > o->mr) o->mr = fabs(ref[k]);
        }
    }
}

int td_check(const float *y, const float *ref, size_t rows, size_t cols, const unsigned char *skip_row,
             double tol_rel, double tol_max, int M, char *detail, size_t dn, double *rel_out,
             double *max_out) {
    const size_t n = rows * cols;
    chk_row *pr = xcalloc(rows ? rows : 1, sizeof(chk_row));
    chk_ctx cc = {.y = y, .ref = ref, .cols = cols, .skip = skip_row, .rows = pr};
    int64_t per = (int64_t)((1u << 16) / (cols ? cols : 1));
    pool_for((int64_t)rows, per > 0 ? per : 1, chk_rows, &cc);
    size_t bad = 0, first = (size_t)-1, at = 0;
    int nonzero = 0;
    double se = 0, sr = 0, me = 0, mr = 0;
    for (size_t r = 0; r < rows; r++) {
        const chk_row *o = &pr[r];
        bad += o->bad;
        if (first == (size_t)-1 && o->first != (size_t)-1) first = o->first;
        nonzero |= o->nonzero;
        se += o->se;
        sr += o->sr;
        if (o->me > me) {
            me = o->me;
            at = o->at;
        }
        if (o->mr > mr) mr = o->mr;
    }
    free(pr);
    *rel_out = *max_out = NAN;
    if (bad) {
        snprintf(detail, dn, "M=%d: %zu of %zu outputs NaN/Inf or unwritten (first at row %zu col %zu)", M,
                 bad, n, first / cols, first % cols);
        return 0;
    }
    if (!nonzero) {
        snprintf(detail, dn, "M=%d: output is all zero", M);
        return 0;
    }
    double rel = sr > 0 ? sqrt(se / sr) : sqrt(se);
    double mx = mr > 0 ? me / mr : me;
    *rel_out = rel;
    *max_out = mx;
    if (rel > tol_rel || mx > tol_max) {
        snprintf(detail, dn, "M=%d: rel err %.3g (tol %.0e), max err %.3g of max|ref| at row %zu col %zu (tol %.0e)",
                 M, rel, tol_rel, mx, at / cols, at % cols, tol_max);
        return 0;
    }
    snprintf(detail, dn, "rel err %.2g, max err %.2g", rel, mx);
    return 1;
}

/* ---- result lines ------------------------------------------------------------------ */

void td_result(int job, const td_res *r) {
    json_t *o = json_pack("{s:s,s:s,s:f,s:f,s:f,s:s}", "status", r->status, "detail", r->detail, "ms",
                          r->ms, "bytes", r->bytes, "flops", r->flops, "ref", r->ref);
    if (isfinite(r->rel)) json_object_set_new(o, "rel", json_real(r->rel));
    if (isfinite(r->max)) json_object_set_new(o, "max", json_real(r->max));
    json_object_set_new(o, "put_s", json_real(g_put_s));
    json_object_set_new(o, "time_s", json_real(g_time_s));
    g_put_s = g_time_s = 0;
    char *t = json_dumps(o, JSON_COMPACT);
    printf("RESULT %d %s\n", job, t);
    fflush(stdout);
    free(t);
    json_decref(o);
}

/* ---- the run's shared references -------------------------------------------------------- */

void doctor_ref_path(const char *prefix, const char *family, int job, char *out, size_t n) {
    snprintf(out, n, "%s.ref.%s.%d", prefix, family, job);
}

typedef struct ref_head {
    uint64_t magic, key, n;
} ref_head;
#define REF_MAGIC 0x4c53524546303031ull /* "LSREF001" */

int td_ref_load(const td_job_ctx *c, const char *family, int job, uint64_t key, void *buf, size_t n) {
    if (!c->ref_cache) return 0;
    char path[512];
    doctor_ref_path(c->ref_cache, family, job, path, sizeof path);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    ref_head h;
    int ok = fread(&h, sizeof h, 1, f) == 1 && h.magic == REF_MAGIC && h.key == key && h.n == n &&
             fread(buf, 1, n, f) == n && fgetc(f) == EOF;
    fclose(f);
    return ok;
}

void td_ref_store(const td_job_ctx *c, const char *family, int job, uint64_t key, const void *buf, size_t n) {
    if (!c->ref_cache) return;
    char path[512], tmp[540];
    doctor_ref_path(c->ref_cache, family, job, path, sizeof path);
    snprintf(tmp, sizeof tmp, "%s.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return; /* a cache: the next child computes it again */
    ref_head h = {REF_MAGIC, key, n};
    int ok = fwrite(&h, sizeof h, 1, f) == 1 && fwrite(buf, 1, n, f) == n;
    ok = fclose(f) == 0 && ok;
    if (!ok || rename(tmp, path)) unlink(tmp);
}

/* ---- main ----------------------------------------------------------------------------- */

int doctor_trial_main(int argc, char **argv) {
    const char *device = "cpu", *family = NULL, *backend = NULL, *shapes_file = NULL, *ms_s = NULL;
    int start = 0, gpu_ref_ok = 1;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--trial")) continue;
        if (!strcmp(a, "--gpu-ref-untrusted")) { gpu_ref_ok = 0; continue; }
        if (!v) { fprintf(stderr, "doctor --trial: %s needs a value\n", a); return 2; }
        if (!strcmp(a, "--device")) device = v;
        else if (!strcmp(a, "--family")) family = v;
        else if (!strcmp(a, "--backend")) backend = v;
        else if (!strcmp(a, "--shapes-file")) shapes_file = v;
        else if (!strcmp(a, "--ms")) ms_s = v;
        else if (!strcmp(a, "--start")) start = atoi(v);
        else if (!strcmp(a, "--seed")) seed = strtoull(v, NULL, 10);
        else { fprintf(stderr, "doctor --trial: unknown flag %s\n", a); return 2; }
        i++;
    }
    if (!family || !backend || !shapes_file || !ms_s) {
        fprintf(stderr, "doctor --trial: needs --family --backend --shapes-file --ms\n");
        return 2;
    }
    ls_err e = {0};
    size_t len;
    char *text = read_file(shapes_file, &len, &e);
    if (!text) { fprintf(stderr, "doctor --trial: %s\n", e.msg); return 2; }
    doc_shapes s;
    int rc = doc_shapes_parse_json(text, &s, &e);
    free(text);
    if (rc) { fprintf(stderr, "doctor --trial: %s\n", e.msg); return 2; }
    int32_t *ms = NULL;
    int n_ms = parse_int_list(ms_s, &ms);
    if (n_ms <= 0) { fprintf(stderr, "doctor --trial: bad --ms\n"); return 2; }

    if (!strcmp(device, "cuda")) {
#ifdef LS_HAVE_CUDA
        g_cuda = 1;
        char drv[64];
        if (lsc_device_count(&e) <= 0 || lsc_device_open(0, &g_dev, drv, sizeof drv, &e)) {
            fprintf(stderr, "doctor --trial: %s\n", e.msg);
            return 1;
        }
#else
        fprintf(stderr, "doctor --trial: this build has no CUDA\n");
        return 1;
#endif
    } else {
        ops_cpu_dev(&g_dev);
    }
    td_job_ctx jc = {&s, ms, n_ms, backend, gpu_ref_ok, seed, shapes_file};
    if (!strcmp(family, "fp4_gemm") || !strcmp(family, "gemm"))
        rc = td_run_gemm_jobs(&jc, !strcmp(family, "fp4_gemm"), start);
    else if (!strcmp(family, "lm_head"))
        rc = td_run_lm_head_jobs(&jc, start);
    else if (!strcmp(family, "moe"))
        rc = td_run_moe_jobs(&jc, start);
    else if (!strcmp(family, "attention"))
        rc = td_run_attn_jobs(&jc, start);
    else if (!strcmp(family, "gdn"))
        rc = td_run_gdn_jobs(&jc, start);
    else {
        fprintf(stderr, "doctor --trial: unknown family %s\n", family);
        rc = 2;
    }
    free(ms);
    return rc;
}
