/* trial_gemm.c: the doctor's jobs for fp4_gemm (NVFP4 weight) and gemm (BF16
 * or FP8 weight): job = shape index · n_ms + bucket index, over the shapes the
 * parent handed over (doc_shapes.fp4 / .bf16; doc_lin.fp8: E4M3 codes of every
 * non-NaN value with fp32 scales per 128 x 128 block, Hugging Face's layout).
 *
 * Oracle: y_ref[m,n] = Σ_k W[n,k]·x[m,k] in fp64 on the CPU (threads over n)
 * at M = 1 and while M·N·K <= TD_CPU_REF_MACS; above, the GPU reference kernel
 * cuda_ref (trusted only if the parent says it passed the small jobs).
 * td_run_lm_head_jobs: the same jobs on the one [vocab x hidden] shape of the
 * doctor's "lm_head" row group.
 * Tolerance: BF16 output rounding (2^-9 relative) plus fp32 accumulation
 * order: rel Frobenius <= 1e-2 and max error <= 2e-2 of max|ref|.
 */
#include "doctor/trial.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL_REL 1e-2
#define TOL_MAX 2e-2

typedef struct oracle_ctx {
    int fp4, M, N, K;
    const uint8_t *codes, *scales;
    float scale2;
    const lin_w *w8; /* FP8: the host weight (lin_row_f32's values) */
    const uint16_t *wbf;
    const float *x;
    float *ref;
} oracle_ctx;

static void oracle_rows(void *p, int64_t n0, int64_t n1) {
    const oracle_ctx *c = p;
    double *row = xmalloc(sizeof(double) * c->K);
    for (int64_t n = n0; n < n1; n++) {
        if (c->fp4) {
            for (int k = 0; k < c->K; k++) {
                uint8_t b = c->codes[(size_t)n * (c->K / 2) + k / 2];
                double v = E2M1_LUT[(k & 1) ? b >> 4 : b & 15];
                row[k] = v * fp8_e4m3_to_f32(c->scales[(size_t)n * (c->K / 16) + k / 16]) * (double)c->scale2;
            }
        } else if (c->w8) {
            for (int k = 0; k < c->K; k++)
                row[k] = (double)fp8_e4m3_to_f32(((const uint8_t *)c->w8->data)[(size_t)n * c->K + k]) *
                         lin_fp8_scale(c->w8, (int)n, k);
        } else {
            for (int k = 0; k < c->K; k++) row[k] = bf16_to_f32(c->wbf[(size_t)n * c->K + k]);
        }
        for (int m = 0; m < c->M; m++) {
            const float *x = c->x + (size_t)m * c->K;
            double s = 0;
            for (int k = 0; k < c->K; k++) s += row[k] * x[k];
            c->ref[(size_t)m * c->N + n] = (float)s;
        }
    }
    free(row);
}

/* Device-side buffers of one job, nsets rotating copies. */
typedef struct gjob {
    const gemm_impl *impl;
    int fp4, fp8, M, N, K, nsets;
    size_t wbytes, sbytes, xbytes, ybytes;
    void **w, **sc, **x, **y;
    float scale2;
    lin_w *lw;
} gjob;

static int gjob_call(void *p, int set, ls_err *e) {
    gjob *j = p;
    gemm_args a = {.M = j->M, .x = j->x[set], .w = &j->lw[set], .y = j->y[set], .accumulate = 0,
                   .dt = td_act()};
    return j->impl->run(&a, NULL, e);
}

/* The device copies of the current shape's weight, shared by its buckets (a job used to
 * allocate and upload them itself: 10 uploads of the 2 GB lm_head weight took ~3 s of a
 * backend's trial). Copy 0 is the upload, copies 1.. its device copies for the rotating timing
 * sets, made as a job first needs them. Owned here, never by a gjob. */
enum { DWC_MAX = 256 };
static struct {
    int fp4, fp8, N, K, n;
    void *w[DWC_MAX], *sc[DWC_MAX];
} dwc;

static void dwc_clear(void) {
    for (int i = 0; i < dwc.n; i++) {
        td_free(dwc.w[i]);
        td_free(dwc.sc[i]);
    }
    memset(&dwc, 0, sizeof dwc);
}

/* Weight copy s of this job's shape (hw / hs: the host weight, uploaded for copy 0). */
static int dwc_get(const gjob *j, int s, const void *hw, const void *hs, void **w, void **sc, ls_err *e) {
    if (dwc.n && (dwc.fp4 != j->fp4 || dwc.fp8 != j->fp8 || dwc.N != j->N || dwc.K != j->K)) dwc_clear();
    dwc.fp4 = j->fp4; dwc.fp8 = j->fp8; dwc.N = j->N; dwc.K = j->K;
    if (s >= DWC_MAX) return errf(e, ERR_INVAL, "doctor: %d timing sets", s + 1);
    while (dwc.n <= s) {
        const int i = dwc.n;
        void *dw = td_alloc(j->wbytes, e), *ds = j->sbytes ? td_alloc(j->sbytes, e) : NULL;
        if (!dw || (j->sbytes && !ds)) {
            td_free(dw);
            td_free(ds);
            return ERR_NOMEM;
        }
        int rc = i == 0 ? td_put(dw, hw, j->wbytes, e) : td_copy(dw, dwc.w[0], j->wbytes, e);
        if (!rc && ds) rc = i == 0 ? td_put(ds, hs, j->sbytes, e) : td_copy(ds, dwc.sc[0], j->sbytes, e);
        if (rc) {
            td_free(dw);
            td_free(ds);
            return rc;
        }
        dwc.w[i] = dw;
        dwc.sc[i] = ds;
        dwc.n++;
    }
    *w = dwc.w[s];
    *sc = dwc.sc[s];
    return 0;
}

static void gjob_free(gjob *j) {
    for (int s = 0; s < j->nsets; s++) {
        if (j->x) td_free(j->x[s]);
        if (j->y) td_free(j->y[s]);
    }
    free(j->w); free(j->sc); free(j->x); free(j->y); free(j->lw);
    memset(j, 0, sizeof *j);
}

/* The doctor's FP8 weight: codes [N, K], fp32 scales per 128 x 128 block. */
#define FP8_BLK 128
static void fp8_view(lin_w *w, int N, int K, const void *codes, const void *scales) {
    *w = (lin_w){.kind = W_FP8, .N = N, .K = K, .data = codes, .name = "doctor", .fscale = scales,
                 .fs_br = FP8_BLK, .fs_bc = FP8_BLK, .fs_cols = (K + FP8_BLK - 1) / FP8_BLK,
                 .fs_n = (size_t)((N + FP8_BLK - 1) / FP8_BLK) * ((K + FP8_BLK - 1) / FP8_BLK)};
}

/* Allocate sets [from, nsets): x / y of their own (x a copy of set 0's when from > 0), the
 * weight from the shape's device copies (hw / hs: the host weight). */
static int gjob_alloc(gjob *j, int from, const void *hw, const void *hs, ls_err *e) {
    if (from == 0) {
        j->w = xcalloc(j->nsets, sizeof(void *));
        j->sc = xcalloc(j->nsets, sizeof(void *));
        j->x = xcalloc(j->nsets, sizeof(void *));
        j->y = xcalloc(j->nsets, sizeof(void *));
        j->lw = xcalloc(j->nsets, sizeof(lin_w));
    }
    for (int s = from; s < j->nsets; s++) {
        int rc = dwc_get(j, s, hw, hs, &j->w[s], &j->sc[s], e);
        if (rc) return rc;
        if (!(j->x[s] = td_alloc(j->xbytes, e))) return ERR_NOMEM;
        if (!(j->y[s] = td_alloc(j->ybytes, e))) return ERR_NOMEM;
        j->lw[s] = (lin_w){.kind = j->fp4 ? W_NVFP4 : W_BF16, .N = j->N, .K = j->K, .data = j->w[s],
                           .scale = j->sc[s], .scale2 = j->scale2, .name = "doctor"};
        if (j->fp8) fp8_view(&j->lw[s], j->N, j->K, j->w[s], j->sc[s]);
        if (s > 0 && (rc = td_copy(j->x[s], j->x[0], j->xbytes, e))) return rc;
    }
    return 0;
}

static void one_job(const td_job_ctx *c, int fp4, int job, const doc_lin *L, int M, td_res *r) {
    ls_err e = {0};
    const int N = L->N, K = L->K;
    const gemm_impl *impl = fp4 ? ops_fp4_gemm_find(c->backend) : ops_gemm_find(c->backend);
    memset(r, 0, sizeof *r);
    r->status = "crash";
    r->ref = "none";
    r->rel = r->max = NAN;
    const int fp8 = !fp4 && L->fp8;
    const size_t n_fs = (size_t)((N + FP8_BLK - 1) / FP8_BLK) * ((K + FP8_BLK - 1) / FP8_BLK);
    r->bytes = fp4 ? (double)N * K / 2 + (double)N * K / 16 : fp8 ? (double)N * K + 4.0 * n_fs : (double)N * K * 2;
    r->bytes += (double)M * K * act_size(td_act()) + (double)M * N * act_size(td_act());
    r->flops = 2.0 * M * N * K;
    if (!impl || impl->dev != td_dev()->kind) {
        r->status = "unsupported";
        snprintf(r->detail, sizeof r->detail, "no backend '%s' for this device", c->backend);
        return;
    }
    gemm_shape sh = {.M = M, .N = N, .K = K, .wk = fp4 ? W_NVFP4 : fp8 ? W_FP8 : W_BF16, .dt = td_act()};
    char why[256] = "";
    if (!impl->supported(td_dev(), &sh, why, sizeof why)) {
        r->status = "unsupported";
        snprintf(r->detail, sizeof r->detail, "%s", why[0] ? why : "declared unsupported");
        return;
    }
    uint64_t rng = c->seed * 0x9E3779B97F4A7C15ull + (uint64_t)job * 7919 + 1;
    gjob j = {.impl = impl, .fp4 = fp4, .fp8 = fp8, .M = M, .N = N, .K = K, .nsets = 1};
    j.wbytes = fp4 ? (size_t)N * K / 2 : fp8 ? (size_t)N * K : (size_t)N * K * 2;
    j.sbytes = fp4 ? (size_t)N * K / 16 : fp8 ? sizeof(float) * n_fs : 0;
    j.xbytes = (size_t)M * K * act_size(td_act());
    j.ybytes = (size_t)M * N * act_size(td_act());
    /* one random weight per shape, shared by its buckets (generation is the slow part) */
    static struct { int fp4, fp8, N, K; uint8_t *w, *s; float scale2; } wc;
    if (!wc.w || wc.fp4 != fp4 || wc.fp8 != fp8 || wc.N != N || wc.K != K) {
        free(wc.w);
        free(wc.s);
        wc.fp4 = fp4; wc.fp8 = fp8; wc.N = N; wc.K = K;
        wc.w = xmalloc(j.wbytes);
        wc.s = j.sbytes ? xmalloc(j.sbytes) : NULL;
        uint64_t wr = c->seed * 0x2545F4914F6CDD1Dull + (uint64_t)N * 131 + (uint64_t)K;
        if (fp4) {
            td_gen_nvfp4(N, K, wc.w, wc.s, &wc.scale2, &wr);
        } else if (fp8) {
            td_gen_fp8(N, K, wc.w, (float *)wc.s, n_fs, &wr);
        } else {
            td_gen_bf16(N, K, (uint16_t *)wc.w, 0.05f, &wr);
        }
    }
    const uint8_t *hw = wc.w, *hs = wc.s;
    j.scale2 = wc.scale2;
    float *hx = xmalloc(sizeof(float) * M * K), *hy = xmalloc(sizeof(float) * M * N), *ref = NULL;
    td_gen_act(hx, M, K, &rng);
    int rc = gjob_alloc(&j, 0, hw, hs, &e);
    if (!rc) rc = td_put_act(j.x[0], hx, (size_t)M * K, &e);
    if (!rc) rc = td_poison(j.y[0], j.ybytes, &e);
    if (rc) { snprintf(r->detail, sizeof r->detail, "set-up: %.503s", e.msg); goto done; }

    rc = gjob_call(&j, 0, &e);
    if (!rc) rc = td_sync(&e);
    if (rc) {
        r->status = rc == ERR_UNSUPPORTED ? "unsupported" : "crash";
        snprintf(r->detail, sizeof r->detail, "%.511s", e.msg);
        goto done;
    }
    if ((rc = td_get_act(hy, j.y[0], (size_t)M * N, &e))) {
        snprintf(r->detail, sizeof r->detail, "read back: %.500s", e.msg);
        goto done;
    }

    ref = xmalloc(sizeof(float) * M * N);
    int have_ref = 1;
    /* M = 1 always on the CPU: the lm_head's [vocab x hidden] (5e8 MACs at 248320 x 2048) is above
     * the limit even there, and its row group then checks cuda_ref against fp64 itself */
    if (M == 1 || (uint64_t)M * N * K <= TD_CPU_REF_MACS || td_dev()->kind == DEV_CPU) {
        lin_w hw8;
        fp8_view(&hw8, N, K, hw, hs);
        oracle_ctx oc = {fp4, M, N, K, hw, hs, j.scale2, fp8 ? &hw8 : NULL, (const uint16_t *)hw, hx, ref};
        pool_for(N, 16, oracle_rows, &oc);
        r->ref = "cpu-fp64";
    } else if (!strcmp(c->backend, "cuda_ref")) {
        memcpy(ref, hy, sizeof(float) * M * N);
        r->ref = "self (checked against the CPU on smaller M)";
    } else if (!c->gpu_ref_ok) {
        have_ref = 0;
    } else {
        const gemm_impl *gr = fp4 ? ops_fp4_gemm_find("cuda_ref") : ops_gemm_find("cuda_ref");
        void *yr = td_alloc(j.ybytes, &e);
        gemm_args a = {.M = M, .x = j.x[0], .w = &j.lw[0], .y = yr, .accumulate = 0, .dt = td_act()};
        rc = (!gr || !yr) ? ERR_RUNTIME : gr->run(&a, NULL, &e);
        if (!rc) rc = td_sync(&e);
        if (!rc) rc = td_get_act(ref, yr, (size_t)M * N, &e);
        td_free(yr);
        if (rc) {
            snprintf(r->detail, sizeof r->detail, "GPU reference failed: %.489s", e.msg);
            goto done;
        }
        r->ref = "cuda_ref";
    }
    if (!have_ref) {
        /* still catch NaN / unwritten / all-zero outputs */
        float *z = xcalloc((size_t)M * N, sizeof(float));
        int ok = td_check(hy, z, M, N, NULL, INFINITY, INFINITY, M, r->detail, sizeof r->detail, &r->rel, &r->max);
        free(z);
        r->status = ok ? "unverified" : "wrong";
        if (ok) snprintf(r->detail, sizeof r->detail, "M=%d: no trusted reference (cuda_ref failed its CPU check)", M);
        r->rel = r->max = NAN;
        if (!ok) goto done;
    } else if (!td_check(hy, ref, M, N, NULL, TOL_REL, TOL_MAX, M, r->detail, sizeof r->detail, &r->rel,
                         &r->max)) {
        r->status = "wrong";
        goto done;
    } else {
        r->status = "ok";
    }

    /* timing over rotating sets */
    size_t set_bytes = j.wbytes + j.sbytes + j.xbytes + j.ybytes;
    int want = td_nsets(set_bytes);
    j.nsets = want;
    void **ow = j.w, **os = j.sc, **ox = j.x, **oy = j.y;
    lin_w *olw = j.lw;
    j.w = xcalloc(want, sizeof(void *)); j.sc = xcalloc(want, sizeof(void *));
    j.x = xcalloc(want, sizeof(void *)); j.y = xcalloc(want, sizeof(void *));
    j.lw = xcalloc(want, sizeof(lin_w));
    j.w[0] = ow[0]; j.sc[0] = os[0]; j.x[0] = ox[0]; j.y[0] = oy[0]; j.lw[0] = olw[0];
    free(ow); free(os); free(ox); free(oy); free(olw);
    rc = gjob_alloc(&j, 1, hw, hs, &e);
    if (!rc) rc = td_time(gjob_call, &j, j.nsets, &r->ms, &e);
    if (rc) {
        r->status = rc == ERR_UNSUPPORTED ? "unsupported" : "crash";
        snprintf(r->detail, sizeof r->detail, "timing: %.503s", e.msg);
    }
done:
    gjob_free(&j);
    free(hx); free(hy); free(ref);
}

static int run_lins(const td_job_ctx *c, int fp4, const doc_lin *lins, int nl, int start) {
    for (int job = start; job < nl * c->n_ms; job++) {
        const doc_lin *L = &lins[job / c->n_ms];
        int M = c->ms[job % c->n_ms];
        printf("BEGIN %d\n", job);
        fflush(stdout);
        td_res r;
        one_job(c, fp4, job, L, M, &r);
        td_result(job, &r);
    }
    return 0;
}

int td_run_gemm_jobs(const td_job_ctx *c, int fp4, int start) {
    return run_lins(c, fp4, fp4 ? c->s->fp4 : c->s->bf16, fp4 ? c->s->n_fp4 : c->s->n_bf16, start);
}

int td_run_lm_head_jobs(const td_job_ctx *c, int start) {
    doc_lin L = {.N = c->s->vocab, .K = c->s->hidden};
    snprintf(L.label, sizeof L.label, "lm_head");
    return run_lins(c, 0, &L, c->s->vocab > 0 && c->s->hidden > 0, start);
}
