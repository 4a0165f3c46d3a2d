/* trial_moe.c: the doctor's jobs for the moe family (router, top-k, routed
 * SiLU-gated experts, shared expert with its sigmoid gate): job = bucket index
 * over the one MoE shape of the model.
 *
 * Weights are random at the real shape: experts NVFP4 when the model's are
 * (else BF16), the shared expert in its own kind (doc_shapes.sh_nvfp4: BF16
 * next to NVFP4 experts when the checkpoint excludes it, as synth's do),
 * router and shared-expert gate BF16. The oracle is the family's
 * CPU reference (moe_cpu_ref, fp32) on the same inputs. Tokens whose k-th and
 * (k+1)-th router probabilities are within 1e-4 of each other are left out of
 * the comparison (either choice is right; the backends may break the tie
 * differently in their own precision). At most 32 tokens (evenly spaced, the
 * first and last included) go through the CPU reference: tokens are
 * independent, and at 397B shapes the CPU needs ~0.1 s per token; every row
 * is checked for NaN / unwritten / all-zero output. Weights are shared by all timing sets:
 * a layer's experts are far larger than the L2 at real shapes.
 * Tolerance: rel Frobenius <= 2e-2, max error <= 5e-2 of max|ref| (two chained
 * GEMMs with BF16 intermediates on the GPU).
 */
#include "doctor/trial.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOL_REL 2e-2
#define TOL_MAX 5e-2

typedef struct mlin {
    lin_w host, dev;
} mlin;

static int mk_lin(mlin *l, int N, int K, int fp4, float amp, uint64_t *rng, ls_err *e) {
    memset(l, 0, sizeof *l);
    size_t wb = fp4 ? (size_t)N * K / 2 : (size_t)N * K * 2, sb = fp4 ? (size_t)N * K / 16 : 0;
    uint8_t *w = xmalloc(wb), *s = fp4 ? xmalloc(sb) : NULL;
    float s2 = 1.f;
    if (fp4) {
        td_gen_nvfp4(N, K, w, s, &s2, rng);
        s2 *= amp * 4.f;
    } else {
        td_gen_bf16(N, K, (uint16_t *)w, amp, rng);
    }
    l->host = (lin_w){.kind = fp4 ? W_NVFP4 : W_BF16, .N = N, .K = K, .data = w, .scale = s, .scale2 = s2,
                      .name = "doctor"};
    l->dev = l->host;
    if (td_dev()->kind == DEV_CPU) return 0;
    void *dw = td_alloc(wb, e), *ds = fp4 ? td_alloc(sb, e) : NULL;
    if (!dw || (fp4 && !ds)) return ERR_NOMEM;
    int rc = td_put(dw, w, wb, e);
    if (!rc && fp4) rc = td_put(ds, s, sb, e);
    l->dev.data = dw;
    l->dev.scale = ds;
    return rc;
}

static void free_lin(mlin *l) {
    if (td_dev()->kind != DEV_CPU) {
        td_free((void *)l->dev.data);
        td_free((void *)l->dev.scale);
    }
    free((void *)l->host.data);
    free((void *)l->host.scale);
}

enum { MOE_SETS = 4, MOE_SAMPLE = 32 };

typedef struct moe_set {
    const moe_impl *impl;
    int M;
    moe_w *w;
    void *x[MOE_SETS], *y[MOE_SETS];
} moe_set;

static int moe_call(void *p, int set, ls_err *e) {
    moe_set *m = p;
    moe_args a = {.M = m->M, .x = m->x[set % MOE_SETS], .y = m->y[set % MOE_SETS], .w = m->w, .dt = td_act()};
    return m->impl->run(&a, NULL, e);
}

/* The layer: host weights (for the oracle) and device weights (for the backend). */
typedef struct layer {
    mlin router, sh_gate, sh_up, sh_down, sh_gw;
    mlin *gate, *up, *down;
    lin_w *hg, *hu, *hd, *dg, *du, *dd;
    moe_w host, dev;
    int E;
} layer;

static int mk_layer(layer *L, const doc_shapes *s, uint64_t *rng, ls_err *e) {
    const int H = s->hidden, E = s->n_experts, I = s->moe_inter, Is = s->shared_inter, fp4 = s->nvfp4;
    const int sfp4 = s->nvfp4 && s->sh_nvfp4;
    memset(L, 0, sizeof *L);
    L->E = E;
    L->gate = xcalloc(E, sizeof(mlin)); L->up = xcalloc(E, sizeof(mlin)); L->down = xcalloc(E, sizeof(mlin));
    L->hg = xcalloc(E, sizeof(lin_w)); L->hu = xcalloc(E, sizeof(lin_w)); L->hd = xcalloc(E, sizeof(lin_w));
    L->dg = xcalloc(E, sizeof(lin_w)); L->du = xcalloc(E, sizeof(lin_w)); L->dd = xcalloc(E, sizeof(lin_w));
    int rc = mk_lin(&L->router, E, H, 0, 2.f / sqrtf((float)H) * 8.f, rng, e);
    float ain = 1.f / sqrtf((float)H), aout_r = 1.f / sqrtf((float)I);
    for (int x = 0; !rc && x < E; x++) {
        rc = mk_lin(&L->gate[x], I, H, fp4, ain, rng, e);
        if (!rc) rc = mk_lin(&L->up[x], I, H, fp4, ain, rng, e);
        if (!rc) rc = mk_lin(&L->down[x], H, I, fp4, aout_r, rng, e);
        if (rc) break;
        L->hg[x] = L->gate[x].host; L->hu[x] = L->up[x].host; L->hd[x] = L->down[x].host;
        L->dg[x] = L->gate[x].dev; L->du[x] = L->up[x].dev; L->dd[x] = L->down[x].dev;
    }
    if (!rc && Is > 0) {
        float aout_s = 1.f / sqrtf((float)Is);
        rc = mk_lin(&L->sh_gate, Is, H, sfp4, ain, rng, e);
        if (!rc) rc = mk_lin(&L->sh_up, Is, H, sfp4, ain, rng, e);
        if (!rc) rc = mk_lin(&L->sh_down, H, Is, sfp4, aout_s, rng, e);
        if (!rc && s->has_sh_gate) rc = mk_lin(&L->sh_gw, 1, H, 0, ain, rng, e);
    }
    if (rc) return rc;
    moe_w base = {.hidden = H, .n_experts = E, .top_k = s->top_k, .inter = I, .norm_topk = s->norm_topk,
                  .shared_inter = Is, .has_sh_gate = Is > 0 && s->has_sh_gate};
    L->host = base;
    L->host.router = L->router.host;
    L->host.gate = L->hg; L->host.up = L->hu; L->host.down = L->hd;
    L->host.sh_gate = L->sh_gate.host; L->host.sh_up = L->sh_up.host; L->host.sh_down = L->sh_down.host;
    L->host.sh_gate_w = L->sh_gw.host;
    L->dev = base;
    L->dev.router = L->router.dev;
    L->dev.gate = L->dg; L->dev.up = L->du; L->dev.down = L->dd;
    L->dev.sh_gate = L->sh_gate.dev; L->dev.sh_up = L->sh_up.dev; L->dev.sh_down = L->sh_down.dev;
    L->dev.sh_gate_w = L->sh_gw.dev;
    return 0;
}

static void free_layer(layer *L) {
    for (int x = 0; x < L->E; x++) {
        if (L->gate) free_lin(&L->gate[x]);
        if (L->up) free_lin(&L->up[x]);
        if (L->down) free_lin(&L->down[x]);
    }
    free_lin(&L->router); free_lin(&L->sh_gate); free_lin(&L->sh_up); free_lin(&L->sh_down); free_lin(&L->sh_gw);
    free(L->gate); free(L->up); free(L->down);
    free(L->hg); free(L->hu); free(L->hd); free(L->dg); free(L->du); free(L->dd);
}

/* Rows whose top-k boundary is a near tie (fp64 router probabilities), a thread per token. */
typedef struct ties_ctx {
    const moe_w *w;
    const float *x;
    unsigned char *skip;
} ties_ctx;

static void ties_rows(void *p, int64_t m0, int64_t m1) {
    const ties_ctx *c = p;
    const moe_w *w = c->w;
    const int H = w->hidden, E = w->n_experts, k = w->top_k;
    float *row = xmalloc(sizeof(float) * H);
    double *lg = xmalloc(sizeof(double) * E);
    for (int64_t m = m0; m < m1; m++) {
        double mx = -INFINITY;
        for (int x2 = 0; x2 < E; x2++) {
            lin_row_f32(&w->router, x2, row);
            double s = 0;
            for (int h = 0; h < H; h++) s += (double)row[h] * c->x[(size_t)m * H + h];
            lg[x2] = s;
            if (s > mx) mx = s;
        }
        /* k-th and (k+1)-th largest */
        double a = -INFINITY, b = -INFINITY;
        for (int r = 0; r <= k && r < E; r++) {
            double best = -INFINITY;
            int bi = -1;
            for (int x2 = 0; x2 < E; x2++)
                if (lg[x2] > best) { best = lg[x2]; bi = x2; }
            if (bi >= 0) lg[bi] = -INFINITY;
            if (r == k - 1) a = best;
            if (r == k) b = best;
        }
        c->skip[m] = k < E && (exp(a - mx) - exp(b - mx)) < 1e-4 * exp(a - mx) + 1e-12;
    }
    free(row);
    free(lg);
}

static void near_ties(const layer *L, const float *x, int M, unsigned char *skip) {
    ties_ctx c = {&L->host, x, skip};
    pool_for(M, 1, ties_rows, &c);
}

int td_run_moe_jobs(const td_job_ctx *c, int start) {
    const doc_shapes *s = c->s;
    ls_err e = {0};
    const moe_impl *impl = ops_moe_find(c->backend);
    uint64_t rng = c->seed * 0x9E3779B97F4A7C15ull + 17; /* the layer's weights */
    layer L;
    int built = 0;
    for (int job = start; job < c->n_ms; job++) {
        int M = c->ms[job];
        /* the job's tokens: a function of (seed, job) alone, whichever jobs this child ran before
         * (a backend that skips buckets, a child restarted after a crash), so that every backend
         * gets the same tokens and the CPU reference can be shared (td_ref_load) */
        uint64_t jrng = c->seed * 0xBF58476D1CE4E5B9ull + (uint64_t)job * 0x94D049BB133111EBull + 29;
        printf("BEGIN %d\n", job);
        fflush(stdout);
        td_res r;
        memset(&r, 0, sizeof r);
        r.status = "crash";
        r.ref = "cpu_ref";
        r.rel = r.max = NAN;
        const int H = s->hidden, k = s->top_k;
        double wexp = (double)k * 3 * s->moe_inter * H + 3.0 * s->shared_inter * H;
        r.flops = 2.0 * M * (wexp + (double)s->n_experts * H);
        r.bytes = (double)M * H * 2 * act_size(td_act());
        {
            /* weight bytes read: at most every expert once */
            double per = (s->nvfp4 ? 0.5625 : 2.0) * 3 * s->moe_inter * H;
            double used = (double)M * k < s->n_experts ? (double)M * k : s->n_experts;
            r.bytes += per * used + (s->nvfp4 && s->sh_nvfp4 ? 0.5625 : 2.0) * 3 * s->shared_inter * H;
        }
        moe_shape sh = {.M = M, .H = H, .E = s->n_experts, .top_k = k, .I = s->moe_inter,
                        .Is = s->shared_inter, .wk = s->nvfp4 ? W_NVFP4 : W_BF16, .dt = td_act(),
                        .sk = s->nvfp4 && s->sh_nvfp4 ? W_NVFP4 : W_BF16};
        char why[256] = "";
        if (!impl || impl->dev != td_dev()->kind) {
            r.status = "unsupported";
            snprintf(r.detail, sizeof r.detail, "no backend '%s' for this device", c->backend);
            td_result(job, &r);
            continue;
        }
        if (!impl->supported(td_dev(), &sh, why, sizeof why)) {
            r.status = "unsupported";
            snprintf(r.detail, sizeof r.detail, "%s", why[0] ? why : "declared unsupported");
            td_result(job, &r);
            continue;
        }
        if (!built) {
            if (mk_layer(&L, s, &rng, &e)) {
                snprintf(r.detail, sizeof r.detail, "set-up: %.503s", e.msg);
                td_result(job, &r);
                return 1;
            }
            built = 1;
        }
        /* rows checked against the CPU: all of them up to MOE_SAMPLE, else an even
         * sample with the first and the last (tokens are independent); every row
         * is still checked for NaN / unwritten / all-zero output */
        int ns = M <= MOE_SAMPLE ? M : MOE_SAMPLE;
        float *hx = xmalloc(sizeof(float) * M * H), *hy = xmalloc(sizeof(float) * M * H);
        float *xsub = xmalloc(sizeof(float) * ns * H), *ref = xmalloc(sizeof(float) * ns * H);
        float *ysub = xmalloc(sizeof(float) * ns * H);
        unsigned char *skip = xcalloc(ns, 1);
        size_t xb = (size_t)M * H * act_size(td_act());
        moe_set ms = {.impl = impl, .M = M, .w = &L.dev};
        int rc = 0;
        /* distinct tokens per timing set, so that repeated calls choose other experts */
        for (int q = MOE_SETS - 1; q >= 0 && !rc; q--) {
            td_gen_act(hx, M, H, &jrng);
            ms.x[q] = td_alloc(xb, &e);
            ms.y[q] = td_alloc(xb, &e);
            if (!ms.x[q] || !ms.y[q]) rc = ERR_NOMEM;
            if (!rc) rc = td_put_act(ms.x[q], hx, (size_t)M * H, &e);
        } /* hx ends as set 0's tokens */
        if (!rc) rc = td_poison(ms.y[0], xb, &e);
        if (rc) {
            snprintf(r.detail, sizeof r.detail, "set-up: %.503s", e.msg);
            goto next;
        }
        rc = moe_call(&ms, 0, &e);
        if (!rc) rc = td_sync(&e);
        if (rc) {
            r.status = rc == ERR_UNSUPPORTED ? "unsupported" : "crash";
            snprintf(r.detail, sizeof r.detail, "%.511s", e.msg);
            goto next;
        }
        if ((rc = td_get_act(hy, ms.y[0], (size_t)M * H, &e))) {
            snprintf(r.detail, sizeof r.detail, "read back: %.500s", e.msg);
            goto next;
        }
        {
            float *zero = xcalloc((size_t)M * H, sizeof(float));
            int ok = td_check(hy, zero, M, H, NULL, INFINITY, INFINITY, M, r.detail, sizeof r.detail, &r.rel, &r.max);
            free(zero);
            if (!ok) {
                r.status = "wrong";
                goto next;
            }
        }
        for (int i = 0; i < ns; i++) {
            int row = ns == M ? i : (int)((long)i * (M - 1) / (ns - 1));
            memcpy(xsub + (size_t)i * H, hx + (size_t)row * H, sizeof(float) * H);
            memcpy(ysub + (size_t)i * H, hy + (size_t)row * H, sizeof(float) * H);
        }
        {
            /* the reference and the near-tie rows, shared by the backends (the same tokens) */
            const size_t rn = sizeof(float) * ns * H;
            unsigned char *rb = xmalloc(rn + ns);
            const uint64_t key = (uint64_t)M * 1000003u + (uint64_t)H * 131u + (uint64_t)ns;
            if (td_ref_load(c, "moe", job, key, rb, rn + ns)) {
                memcpy(ref, rb, rn);
                memcpy(skip, rb + rn, ns);
            } else {
                moe_args a = {.M = ns, .x = xsub, .y = ref, .w = &L.host, .dt = ACT_F32};
                if ((rc = moe_cpu_ref.run(&a, NULL, &e))) {
                    snprintf(r.detail, sizeof r.detail, "CPU reference: %.496s", e.msg);
                    free(rb);
                    goto next;
                }
                near_ties(&L, xsub, ns, skip);
                memcpy(rb, ref, rn);
                memcpy(rb + rn, skip, ns);
                td_ref_store(c, "moe", job, key, rb, rn + ns);
            }
            free(rb);
        }
        if (!td_check(ysub, ref, ns, H, skip, TOL_REL, TOL_MAX, M, r.detail, sizeof r.detail, &r.rel, &r.max)) {
            r.status = "wrong";
            goto next;
        }
        if (ns < M) r.ref = "cpu_ref on 32 sampled tokens";
        r.status = "ok";
        if ((rc = td_time(moe_call, &ms, td_dev()->kind == DEV_CPU ? 1 : MOE_SETS, &r.ms, &e))) {
            r.status = rc == ERR_UNSUPPORTED ? "unsupported" : "crash";
            snprintf(r.detail, sizeof r.detail, "timing: %.503s", e.msg);
        }
    next:
        for (int q = 0; q < MOE_SETS; q++) {
            td_free(ms.x[q]);
            td_free(ms.y[q]);
        }
        free(hx); free(hy); free(ref); free(skip); free(xsub); free(ysub);
        td_result(job, &r);
    }
    if (built) free_layer(&L);
    return 0;
}
