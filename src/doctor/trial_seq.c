/* trial_seq.c: the doctor's jobs for the two sequence families, attention
 * (paged GQA over the KV pool, optional output gate) and gdn (causal conv +
 * gated delta rule with per-slot state): job = bucket index, M = tokens in
 * the step.
 *
 * Batches are heterogeneous on purpose (real failures hide there): a step of
 * M tokens mixes decode rows (one new token after a long cached prefix) with
 * prefill chunks of random lengths and offsets; KV pages are a random
 * permutation of the pool and GDN state slots a random permutation of the
 * slots, with random starting states.
 *
 * Oracles (the families' CPU references, fp32 inputs as the device sees them):
 *   attention: up to 32 sampled rows, each re-asked as a one-token sequence at
 *              its own position over the same pages (a row of causal attention
 *              depends only on its position's prefix); every row is checked for
 *              NaN / unwritten / all-zero output;
 *   gdn:       the sequences are independent, so the reference replays a
 *              subset of them (whole, from the same starting state) up to 512
 *              tokens, and compares their output rows and their final conv and
 *              recurrent states.
 * A gdn cell is the steps a server runs at M tokens: the mixed step above and, for
 * 2 <= M <= GDN_DECODE_MAX_M, a pure decode step of min(M, GDN_DECODE_SEQS) sequences (one
 * new token each: what every step of a server at concurrency M is between prefills, and what
 * its CUDA graphs replay; GDN_DECODE_SEQS = the auto --max-running-requests cap, which also
 * bounds the host memory and time of the set-up at the 397B's 4 MB a slot); the cell's time
 * is the two steps' sum, and either one wrong makes the cell wrong. The mixed step at M >= GDN_LONG_M holds one chunk of M / 2 tokens (a long
 * prompt's prefill chunk). Without these, the mixed batch's many short chunks made a
 * chunked kernel the choice for pure decode steps of 64..512 sequences, which it runs at
 * a third of the recurrent kernel's speed, and a recurrent kernel could have won the
 * largest bucket that long prompts run in.
 * The backends get the ops.h contract: on CUDA the seqs (and attention's page
 * tables) are uploaded to the device, and seqs_host holds the host copy; on
 * the CPU both are the host arrays.
 * Tolerances: attention rel 1e-2 / max 2e-2 (BF16 output); gdn rel 2e-2 /
 * max 5e-2 on outputs and states (fp32 state, BF16 inputs and outputs).
 */
#include "doctor/trial.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SEQ_SAMPLE = 32, GDN_REF_TOKENS = 512, PAGE = 16, GDN_DECODE_MAX_M = 512, GDN_DECODE_SEQS = 256,
       GDN_LONG_M = 1024 };

/* Split M tokens into sequences: up to 4 decode rows (n_new = 1), then (long_chunk and
 * M >= GDN_LONG_M) one chunk of M / 2 tokens, the rest in chunks of 1..512 tokens.
 * Returns the count; lens [M] (enough room). */
static int split_batch(int M, int *lens, uint64_t *rng, int long_chunk) {
    int n = 0, left = M;
    int dec = M >= 2 ? (M / 2 < 4 ? M / 2 : 4) : 1;
    for (int i = 0; i < dec && left > 0; i++, left--) lens[n++] = 1;
    if (long_chunk && M >= GDN_LONG_M) {
        lens[n++] = M / 2;
        left -= M / 2;
    }
    while (left > 0) {
        int c = 1 + (int)(td_rng_next(rng) % (left < 512 ? left : 512));
        lens[n++] = c;
        left -= c;
    }
    return n;
}

static void res_init(td_res *r, const char *ref) {
    memset(r, 0, sizeof *r);
    r->status = "crash";
    r->ref = ref;
    r->rel = r->max = NAN;
}

static int nan_check(const float *y, size_t rows, size_t cols, int M, td_res *r) {
    float *z = xcalloc(rows * cols, sizeof(float));
    int ok = td_check(y, z, rows, cols, NULL, INFINITY, INFINITY, M, r->detail, sizeof r->detail, &r->rel, &r->max);
    free(z);
    r->rel = r->max = NAN;
    if (!ok) r->status = "wrong";
    return ok;
}

/* ---- attention ---------------------------------------------------------------------- */

typedef struct attn_call {
    const attn_impl *impl;
    attn_args a;
} attn_call;

static int attn_call_fn(void *p, int set, ls_err *e) {
    attn_call *c = p;
    return c->impl->run(&c->a, NULL, e);
}

static void attn_job(const td_job_ctx *c, int job, int M, td_res *r) {
    const doc_shapes *s = c->s;
    const int nh = s->n_heads, nkv = s->n_kv_heads, hd = s->head_dim;
    ls_err e = {0};
    res_init(r, "cpu_ref");
    const attn_impl *impl = ops_attn_find(c->backend);
    uint64_t rng = c->seed * 0x9E3779B97F4A7C15ull + (uint64_t)job * 104729 + 3;
    int *lens = xmalloc(sizeof(int) * M);
    int ns = split_batch(M, lens, &rng, 0);
    /* benchmarks (bench/device/attngraph.sh): LASTSTAND_DOCTOR_ATTN_CTX=N makes the step M decode
     * rows (one new token each) at context N, as a CUDA-graph decode step is */
    const char *fc = getenv("LASTSTAND_DOCTOR_ATTN_CTX");
    const int fixed_ctx = fc ? atoi(fc) : 0;
    if (fixed_ctx > 0)
        for (ns = 0; ns < M; ns++) lens[ns] = 1;
    /* LASTSTAND_DOCTOR_ATTN_PREFILL=P (P >= 0): the step is one prompt of M new tokens after P cached
     * ones (an 8k prefill's causal attention at P = 0; bench/device/attnpre.sh) */
    const char *fp = getenv("LASTSTAND_DOCTOR_ATTN_PREFILL");
    const int one_past = fp && fp[0] >= '0' && fp[0] <= '9' ? atoi(fp) : -1;
    if (one_past >= 0 && fixed_ctx <= 0) {
        ns = 1;
        lens[0] = M;
    }
    attn_seq *seqs = xcalloc(ns, sizeof(attn_seq));
    int32_t **pages = xcalloc(ns, sizeof(int32_t *));
    int total_pages = 0, max_ctx = 0, row = 0;
    for (int i = 0; i < ns; i++) {
        seqs[i].n_new = lens[i];
        seqs[i].n_past = lens[i] == 1 ? 1 + (int)(td_rng_next(&rng) % 2048) : (int)(td_rng_next(&rng) % 1025);
        if (fixed_ctx > 0) seqs[i].n_past = fixed_ctx - 1;
        if (one_past >= 0 && fixed_ctx <= 0) seqs[i].n_past = one_past;
        seqs[i].row0 = row;
        row += lens[i];
        int ctx = seqs[i].n_past + seqs[i].n_new;
        if (ctx > max_ctx) max_ctx = ctx;
        total_pages += (ctx + PAGE - 1) / PAGE;
    }
    /* a random permutation of the pool's pages, handed out in order */
    int32_t *perm = xmalloc(sizeof(int32_t) * total_pages);
    for (int i = 0; i < total_pages; i++) perm[i] = i;
    for (int i = total_pages - 1; i > 0; i--) {
        int j = (int)(td_rng_next(&rng) % (uint64_t)(i + 1));
        int32_t t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
    for (int i = 0, at = 0; i < ns; i++) {
        int np = (seqs[i].n_past + seqs[i].n_new + PAGE - 1) / PAGE;
        pages[i] = xmalloc(sizeof(int32_t) * np);
        memcpy(pages[i], perm + at, sizeof(int32_t) * np);
        at += np;
        seqs[i].pages = pages[i];
    }
    r->bytes = (double)M * nh * hd * 3 * act_size(td_act());
    r->flops = 0;
    for (int i = 0; i < ns; i++)
        for (int t = 0; t < seqs[i].n_new; t++) {
            double ctx = seqs[i].n_past + t + 1;
            r->flops += 4.0 * nh * hd * ctx;
        }
    r->bytes += (double)total_pages * PAGE * nkv * hd * 2 * act_size(td_act());

    size_t qn = (size_t)M * nh * hd, kvn = (size_t)total_pages * PAGE * nkv * hd;
    float *hq = xmalloc(sizeof(float) * qn), *hg = s->gated ? xmalloc(sizeof(float) * qn) : NULL;
    float *hk = xmalloc(sizeof(float) * kvn), *hv = xmalloc(sizeof(float) * kvn), *hy = xmalloc(sizeof(float) * qn);
    void *dq = NULL, *dg = NULL, *dk = NULL, *dv = NULL, *dy = NULL, *dpg = NULL, *dseq = NULL;
    attn_shape sh = {.n_tok = M, .n_seq = ns, .max_ctx = max_ctx, .n_heads = nh, .n_kv_heads = nkv,
                     .head_dim = hd, .gated = s->gated, .dt = td_act()};
    char why[256] = "";
    if (!impl || impl->dev != td_dev()->kind) {
        r->status = "unsupported";
        snprintf(r->detail, sizeof r->detail, "no backend '%s' for this device", c->backend);
        goto done;
    }
    if (!impl->supported(td_dev(), &sh, why, sizeof why)) {
        r->status = "unsupported";
        snprintf(r->detail, sizeof r->detail, "%s", why[0] ? why : "declared unsupported");
        goto done;
    }
    td_gen_uniform(hq, qn, 1.f, 1, &rng);
    if (hg) td_gen_uniform(hg, qn, 2.f, 1, &rng);
    td_gen_uniform(hk, kvn, 1.f, 1, &rng);
    td_gen_uniform(hv, kvn, 1.f, 1, &rng);
    size_t as = act_size(td_act());
    int rc = 0;
    if (!(dq = td_alloc(qn * as, &e)) || !(dk = td_alloc(kvn * as, &e)) || !(dv = td_alloc(kvn * as, &e)) ||
        !(dy = td_alloc(qn * as, &e)) || (hg && !(dg = td_alloc(qn * as, &e))))
        rc = ERR_NOMEM;
    if (!rc) rc = td_put_act(dq, hq, qn, &e);
    if (!rc && hg) rc = td_put_act(dg, hg, qn, &e);
    if (!rc) rc = td_put_act(dk, hk, kvn, &e);
    if (!rc) rc = td_put_act(dv, hv, kvn, &e);
    if (!rc) rc = td_poison(dy, qn * as, &e);
    /* the contract (ops.h): seqs and their page tables in device memory, the host copy in seqs_host */
    const attn_seq *dev_seqs = seqs;
    if (!rc && td_dev()->kind != DEV_CPU) {
        attn_seq *tmp = xcalloc(ns, sizeof(attn_seq));
        if (!(dpg = td_alloc(sizeof(int32_t) * total_pages, &e)) || !(dseq = td_alloc(sizeof(attn_seq) * ns, &e)))
            rc = ERR_NOMEM;
        if (!rc) rc = td_put(dpg, perm, sizeof(int32_t) * total_pages, &e);
        for (int i = 0, at = 0; !rc && i < ns; i++) {
            tmp[i] = seqs[i];
            tmp[i].pages = (const int32_t *)dpg + at;
            at += (seqs[i].n_past + seqs[i].n_new + PAGE - 1) / PAGE;
        }
        if (!rc) rc = td_put(dseq, tmp, sizeof(attn_seq) * ns, &e);
        free(tmp);
        dev_seqs = dseq;
    }
    if (rc) {
        snprintf(r->detail, sizeof r->detail, "set-up: %.503s", e.msg);
        goto done;
    }
    kv_layer kv = {.k = dk, .v = dv, .n_pages = total_pages, .page_size = PAGE, .dt = td_act()};
    attn_call call = {impl, {.n_seq = ns, .seqs = dev_seqs, .seqs_host = seqs, .n_tok = M, .n_heads = nh,
                             .n_kv_heads = nkv,
                             .head_dim = hd, .scale = 1.0f / sqrtf((float)hd), .q = dq, .gate = dg,
                             .kv = &kv, .out = dy, .dt = td_act()}};
    rc = attn_call_fn(&call, 0, &e);
    if (!rc) rc = td_sync(&e);
    if (rc) {
        r->status = rc == ERR_UNSUPPORTED ? "unsupported" : "crash";
        snprintf(r->detail, sizeof r->detail, "%.511s", e.msg);
        goto done;
    }
    if ((rc = td_get_act(hy, dy, qn, &e))) {
        snprintf(r->detail, sizeof r->detail, "read back: %.500s", e.msg);
        goto done;
    }
    if (!nan_check(hy, M, (size_t)nh * hd, M, r)) goto done;
    {
        /* sampled rows as one-token sequences at their own positions */
        int nsamp = M < SEQ_SAMPLE ? M : SEQ_SAMPLE;
        attn_seq *rs = xcalloc(nsamp, sizeof(attn_seq));
        float *rq = xmalloc(sizeof(float) * nsamp * nh * hd), *rg = hg ? xmalloc(sizeof(float) * nsamp * nh * hd) : NULL;
        float *ry = xmalloc(sizeof(float) * nsamp * nh * hd), *yy = xmalloc(sizeof(float) * nsamp * nh * hd);
        for (int i = 0; i < nsamp; i++) {
            int t = nsamp == M ? i : (int)((long)i * (M - 1) / (nsamp - 1));
            int q = 0;
            while (q + 1 < ns && seqs[q + 1].row0 <= t) q++;
            rs[i] = (attn_seq){.n_past = seqs[q].n_past + (t - seqs[q].row0), .n_new = 1, .row0 = i,
                               .pages = seqs[q].pages};
            size_t w = (size_t)nh * hd;
            memcpy(rq + i * w, hq + (size_t)t * w, sizeof(float) * w);
            if (rg) memcpy(rg + i * w, hg + (size_t)t * w, sizeof(float) * w);
            memcpy(yy + i * w, hy + (size_t)t * w, sizeof(float) * w);
        }
        kv_layer hkv = {.k = hk, .v = hv, .n_pages = total_pages, .page_size = PAGE, .dt = ACT_F32};
        attn_args ra = {.n_seq = nsamp, .seqs = rs, .seqs_host = rs, .n_tok = nsamp, .n_heads = nh,
                        .n_kv_heads = nkv,
                        .head_dim = hd, .scale = 1.0f / sqrtf((float)hd), .q = rq, .gate = rg, .kv = &hkv,
                        .out = ry, .dt = ACT_F32};
        rc = attn_cpu_ref.run(&ra, NULL, &e);
        int ok = !rc && td_check(yy, ry, nsamp, (size_t)nh * hd, NULL, 1e-2, 2e-2, M, r->detail, sizeof r->detail,
                                 &r->rel, &r->max);
        if (rc) snprintf(r->detail, sizeof r->detail, "CPU reference: %.496s", e.msg);
        free(rs); free(rq); free(rg); free(ry); free(yy);
        if (!ok) {
            r->status = rc ? "crash" : "wrong";
            goto done;
        }
        if (nsamp < M) r->ref = "cpu_ref on 32 sampled rows";
    }
    r->status = "ok";
    if ((rc = td_time(attn_call_fn, &call, 1, &r->ms, &e))) {
        r->status = rc == ERR_UNSUPPORTED ? "unsupported" : "crash";
        snprintf(r->detail, sizeof r->detail, "timing: %.503s", e.msg);
    }
done:
    td_free(dq); td_free(dg); td_free(dk); td_free(dv); td_free(dy); td_free(dpg); td_free(dseq);
    free(hq); free(hg); free(hk); free(hv); free(hy);
    for (int i = 0; i < ns; i++) free(pages[i]);
    free(pages); free(seqs); free(perm); free(lens);
}

int td_run_attn_jobs(const td_job_ctx *c, int start) {
    for (int job = start; job < c->n_ms; job++) {
        printf("BEGIN %d\n", job);
        fflush(stdout);
        td_res r;
        attn_job(c, job, c->ms[job], &r);
        td_result(job, &r);
    }
    return 0;
}

/* ---- gdn ----------------------------------------------------------------------------- */

typedef struct gdn_call {
    const gdn_impl *impl;
    gdn_args a;
} gdn_call;

static int gdn_call_fn(void *p, int set, ls_err *e) {
    gdn_call *c = p;
    return c->impl->run(&c->a, NULL, e);
}

/* fp32 device buffer of n floats from the host */
static float *put_f32(const float *h, size_t n, ls_err *e) {
    float *d = td_alloc(n * sizeof(float), e);
    if (d && td_put(d, h, n * sizeof(float), e)) {
        td_free(d);
        return NULL;
    }
    return d;
}

/* One step of M tokens: decode = 1 a pure decode step (M sequences of one token), else the
 * mixed step (split_batch). */
static void gdn_step(const td_job_ctx *c, int job, int M, int decode, td_res *r) {
    const doc_shapes *s = c->s;
    const int nk = s->nk, nv = s->nv, dk = s->dk, dv = s->dv, ck = s->conv_k;
    const int sbf = s->state_bf16; /* the state stored in BF16 (es bytes an element) */
    const size_t es = sbf ? sizeof(uint16_t) : sizeof(float);
    const int cd = 2 * nk * dk + nv * dv;
    ls_err e = {0};
    res_init(r, "cpu_ref");
    const gdn_impl *impl = ops_gdn_find(c->backend);
    uint64_t rng = c->seed * 0x9E3779B97F4A7C15ull + (uint64_t)job * 15485863 + 5 + (uint64_t)decode * 7919;
    int *lens = xmalloc(sizeof(int) * M);
    int ns = 0;
    if (decode)
        for (; ns < M; ns++) lens[ns] = 1;
    else
        ns = split_batch(M, lens, &rng, 1);
    int n_slots = ns + 2;
    gdn_seq *seqs = xcalloc(ns, sizeof(gdn_seq));
    int *slotp = xmalloc(sizeof(int) * n_slots);
    for (int i = 0; i < n_slots; i++) slotp[i] = i;
    for (int i = n_slots - 1; i > 0; i--) {
        int j = (int)(td_rng_next(&rng) % (uint64_t)(i + 1));
        int t = slotp[i]; slotp[i] = slotp[j]; slotp[j] = t;
    }
    for (int i = 0, row = 0; i < ns; i++) {
        seqs[i] = (gdn_seq){.slot = slotp[i], .n_new = lens[i], .row0 = row};
        row += lens[i];
    }
    /* the sequences the CPU reference replays: whole ones, up to GDN_REF_TOKENS tokens; in a
     * decode step SEQ_SAMPLE of them (the others' outputs are still checked for NaN / unwritten
     * rows). Only their recurrent states are random; the others start at zero (the kernels'
     * work does not depend on the values): at the 397B's 4 MB a slot, a decode step of 256
     * sequences no longer draws, copies and compares 1 GB of state per backend. */
    int nsub = 0, ntok = 0;
    gdn_seq *sub = xcalloc(ns, sizeof(gdn_seq));
    for (int i = 0; i < ns && (!decode || nsub < SEQ_SAMPLE); i++) {
        if (ntok > 0 && ntok + seqs[i].n_new > GDN_REF_TOKENS) continue;
        sub[nsub] = seqs[i];
        sub[nsub].row0 = ntok;
        ntok += seqs[i].n_new;
        nsub++;
    }
    const size_t convn = (size_t)n_slots * cd * (ck - 1), recn = (size_t)n_slots * nv * dk * dv;
    const size_t qkvn = (size_t)M * cd, abn = (size_t)M * nv, outn = (size_t)M * nv * dv;
    r->bytes = (qkvn + 2 * abn + outn) * act_size(td_act()) + 2.0 * es * (double)ns * nv * dk * dv;
    r->flops = 6.0 * M * nv * dk * dv;
    float *cw = xmalloc(sizeof(float) * cd * ck), *alog = xmalloc(sizeof(float) * nv), *dtb = xmalloc(sizeof(float) * nv);
    const size_t rs = (size_t)nv * dk * dv; /* one slot's recurrent state */
    /* the replayed sequences' starting states, compact (sequence i of sub at i · rs) */
    float *conv0 = xmalloc(sizeof(float) * convn), *rec0 = xmalloc(sizeof(float) * (nsub ? nsub : 1) * rs);
    float *hqkv = xmalloc(sizeof(float) * qkvn), *ha = xmalloc(sizeof(float) * abn), *hb = xmalloc(sizeof(float) * abn);
    float *hy = xmalloc(sizeof(float) * outn);
    float *dcw = NULL, *dal = NULL, *ddt = NULL, *dconv = NULL;
    char *drec = NULL; /* the device state, es bytes an element */
    void *dqkv = NULL, *da = NULL, *db = NULL, *dy = NULL, *dseq = NULL;
    gdn_shape sh = {.n_tok = M, .n_seq = ns, .nk = nk, .nv = nv, .dk = dk, .dv = dv, .conv_k = ck, .dt = td_act(),
                    .state_bf16 = sbf};
    char why[256] = "";
    int rc = 0;
    if (!impl || impl->dev != td_dev()->kind) {
        r->status = "unsupported";
        snprintf(r->detail, sizeof r->detail, "no backend '%s' for this device", c->backend);
        goto done;
    }
    if (!impl->supported(td_dev(), &sh, why, sizeof why)) {
        r->status = "unsupported";
        snprintf(r->detail, sizeof r->detail, "%s", why[0] ? why : "declared unsupported");
        goto done;
    }
    for (size_t i = 0; i < (size_t)cd * ck; i++) cw[i] = td_rng_unit(&rng) * 0.5f;
    for (int i = 0; i < nv; i++) {
        alog[i] = td_rng_unit(&rng);
        dtb[i] = td_rng_unit(&rng);
    }
    td_gen_uniform(conv0, convn, 1.f, 0, &rng);
    td_gen_uniform(rec0, (size_t)nsub * rs, 0.1f, 0, &rng);
    uint16_t *rec0h = NULL; /* a BF16 state: the starting states as stored (the reference starts from them) */
    if (sbf) {
        rec0h = xmalloc(sizeof(uint16_t) * ((size_t)nsub * rs + 1));
        for (size_t i = 0; i < (size_t)nsub * rs; i++) {
            rec0h[i] = f32_to_bf16(rec0[i]);
            rec0[i] = bf16_to_f32(rec0h[i]);
        }
    }
    td_gen_uniform(hqkv, qkvn, 1.f, 1, &rng);
    td_gen_uniform(ha, abn, 2.f, 1, &rng);
    td_gen_uniform(hb, abn, 2.f, 1, &rng);
    size_t as = act_size(td_act());
    if (!(dcw = put_f32(cw, (size_t)cd * ck, &e)) || !(dal = put_f32(alog, nv, &e)) || !(ddt = put_f32(dtb, nv, &e)) ||
        !(dconv = put_f32(conv0, convn, &e)) || !(drec = td_alloc(recn * es, &e)) ||
        !(dqkv = td_alloc(qkvn * as, &e)) || !(da = td_alloc(abn * as, &e)) || !(db = td_alloc(abn * as, &e)) ||
        !(dy = td_alloc(outn * as, &e)))
        rc = ERR_NOMEM;
    /* every other slot's state starts at zero: the kernels' work does not depend on it */
    if (!rc) rc = td_zero(drec, recn * es, &e);
    for (int i = 0; !rc && i < nsub; i++)
        rc = td_put(drec + (size_t)sub[i].slot * rs * es,
                    sbf ? (const void *)(rec0h + (size_t)i * rs) : (const void *)(rec0 + (size_t)i * rs), rs * es, &e);
    free(rec0h);
    if (!rc) rc = td_put_act(dqkv, hqkv, qkvn, &e);
    if (!rc) rc = td_put_act(da, ha, abn, &e);
    if (!rc) rc = td_put_act(db, hb, abn, &e);
    if (!rc) rc = td_poison(dy, outn * as, &e);
    /* the contract (ops.h): seqs in device memory, the host copy in seqs_host */
    const gdn_seq *dev_seqs = seqs;
    if (!rc && td_dev()->kind != DEV_CPU) {
        if (!(dseq = td_alloc(sizeof(gdn_seq) * ns, &e)))
            rc = ERR_NOMEM;
        else
            rc = td_put(dseq, seqs, sizeof(gdn_seq) * ns, &e);
        dev_seqs = dseq;
    }
    if (rc) {
        snprintf(r->detail, sizeof r->detail, "set-up: %.503s", e.msg);
        goto done;
    }
    gdn_w w = {.nk = nk, .nv = nv, .dk = dk, .dv = dv, .conv_k = ck, .conv_w = dcw, .A_log = dal, .dt_bias = ddt};
    gdn_state st = {.conv = dconv, .rec = sbf ? NULL : (float *)drec, .n_slots = n_slots,
                    .rec16 = sbf ? (uint16_t *)drec : NULL};
    gdn_call call = {impl, {.n_seq = ns, .seqs = dev_seqs, .seqs_host = seqs, .n_tok = M, .w = &w, .qkv = dqkv,
                            .a = da, .b = db,
                            .st = &st, .out = dy, .dt = td_act()}};
    rc = gdn_call_fn(&call, 0, &e);
    if (!rc) rc = td_sync(&e);
    if (rc) {
        r->status = rc == ERR_UNSUPPORTED ? "unsupported" : "crash";
        snprintf(r->detail, sizeof r->detail, "%.511s", e.msg);
        goto done;
    }
    if ((rc = td_get_act(hy, dy, outn, &e))) {
        snprintf(r->detail, sizeof r->detail, "read back: %.500s", e.msg);
        goto done;
    }
    if (!nan_check(hy, M, (size_t)nv * dv, M, r)) goto done;
    {
        /* replay the subset on the CPU reference; read back the subset's recurrent states only
         * (the untouched pages of rec1 / r0s stay unmapped) */
        float *conv1 = xmalloc(sizeof(float) * convn), *rec1 = xcalloc(recn, sizeof(float));
        int rc2 = td_get(conv1, dconv, convn * sizeof(float), &e);
        uint16_t *r16 = sbf ? xmalloc(sizeof(uint16_t) * rs) : NULL;
        for (int i = 0; !rc2 && i < nsub; i++) {
            float *dst = rec1 + (size_t)sub[i].slot * rs;
            rc2 = td_get(sbf ? (void *)r16 : (void *)dst, drec + (size_t)sub[i].slot * rs * es, rs * es, &e);
            for (size_t q = 0; !rc2 && sbf && q < rs; q++) dst[q] = bf16_to_f32(r16[q]);
        }
        free(r16);
        float *sq = xmalloc(sizeof(float) * ntok * cd), *sa = xmalloc(sizeof(float) * ntok * nv);
        float *sb = xmalloc(sizeof(float) * ntok * nv), *sy = xmalloc(sizeof(float) * ntok * nv * dv);
        float *yy = xmalloc(sizeof(float) * ntok * nv * dv);
        for (int i = 0; i < nsub; i++) {
            int src = 0;
            while (seqs[src].slot != sub[i].slot) src++;
            int n = sub[i].n_new, r0 = seqs[src].row0, d0 = sub[i].row0;
            memcpy(sq + (size_t)d0 * cd, hqkv + (size_t)r0 * cd, sizeof(float) * n * cd);
            memcpy(sa + (size_t)d0 * nv, ha + (size_t)r0 * nv, sizeof(float) * n * nv);
            memcpy(sb + (size_t)d0 * nv, hb + (size_t)r0 * nv, sizeof(float) * n * nv);
            memcpy(yy + (size_t)d0 * nv * dv, hy + (size_t)r0 * nv * dv, sizeof(float) * n * nv * dv);
        }
        float *c0 = xmalloc(sizeof(float) * convn), *r0s = xcalloc(recn, sizeof(float));
        memcpy(c0, conv0, sizeof(float) * convn);
        for (int i = 0; i < nsub; i++)
            memcpy(r0s + (size_t)sub[i].slot * rs, rec0 + (size_t)i * rs, sizeof(float) * rs);
        gdn_w hw = {.nk = nk, .nv = nv, .dk = dk, .dv = dv, .conv_k = ck, .conv_w = cw, .A_log = alog, .dt_bias = dtb};
        gdn_state hst = {.conv = c0, .rec = r0s, .n_slots = n_slots};
        gdn_args ra = {.n_seq = nsub, .seqs = sub, .seqs_host = sub, .n_tok = ntok, .w = &hw, .qkv = sq, .a = sa,
                       .b = sb,
                       .st = &hst, .out = sy, .dt = ACT_F32};
        if (!rc2) rc2 = gdn_cpu_ref.run(&ra, NULL, &e);
        int ok = !rc2 && td_check(yy, sy, ntok, (size_t)nv * dv, NULL, 2e-2, 5e-2, M, r->detail, sizeof r->detail,
                                  &r->rel, &r->max);
        /* the replayed sequences' final states */
        for (int i = 0; ok && i < nsub; i++) {
            size_t cs = (size_t)cd * (ck - 1), sl = sub[i].slot;
            double rrel, rmax;
            char d2[256];
            if (!td_check(rec1 + sl * rs, r0s + sl * rs, nv, (size_t)dk * dv, NULL, 2e-2, 5e-2, M, d2, sizeof d2, &rrel,
                          &rmax) ||
                (ck > 1 && !td_check(conv1 + sl * cs, c0 + sl * cs, cd, ck - 1, NULL, 2e-2, 5e-2, M, d2, sizeof d2,
                                     &rrel, &rmax))) {
                snprintf(r->detail, sizeof r->detail, "final state of slot %zu: %s", sl, d2);
                ok = 0;
            }
        }
        if (rc2) snprintf(r->detail, sizeof r->detail, "CPU reference: %.496s", e.msg);
        free(conv1); free(rec1); free(sq); free(sa); free(sb); free(sy); free(yy); free(c0); free(r0s);
        if (!ok) {
            r->status = rc2 ? "crash" : "wrong";
            goto done;
        }
        if (nsub < ns)
            r->ref = decode ? "cpu_ref on 32 of the step's sequences" : "cpu_ref on whole sequences up to 512 tokens";
    }
    r->status = "ok";
    if ((rc = td_time(gdn_call_fn, &call, 1, &r->ms, &e))) {
        r->status = rc == ERR_UNSUPPORTED ? "unsupported" : "crash";
        snprintf(r->detail, sizeof r->detail, "timing: %.503s", e.msg);
    }
done:
    td_free(dcw); td_free(dal); td_free(ddt); td_free(dconv); td_free(drec);
    td_free(dqkv); td_free(da); td_free(db); td_free(dy); td_free(dseq);
    free(cw); free(alog); free(dtb); free(conv0); free(rec0); free(hqkv); free(ha); free(hb); free(hy);
    free(seqs); free(slotp); free(lens); free(sub);
}

/* The cell: the mixed step, then (2 <= M <= GDN_DECODE_MAX_M) the pure decode step of
 * min(M, GDN_DECODE_SEQS) sequences; the worse verdict of the two, the sum of their times and
 * byte / flop counts. */
static void gdn_job(const td_job_ctx *c, int job, int M, td_res *r) {
    gdn_step(c, job, M, 0, r);
    if (M < 2 || M > GDN_DECODE_MAX_M || strcmp(r->status, "ok")) return;
    const int md = M < GDN_DECODE_SEQS ? M : GDN_DECODE_SEQS;
    td_res d;
    gdn_step(c, job, md, 1, &d);
    if (strcmp(d.status, "ok")) {
        *r = d;
        char t[sizeof r->detail];
        snprintf(t, sizeof t, "decode step of %d sequences: %.470s", md, d.detail);
        memcpy(r->detail, t, sizeof t);
        return;
    }
    r->ms += d.ms;
    r->bytes += d.bytes;
    r->flops += d.flops;
    if (d.rel > r->rel) r->rel = d.rel;
    if (d.max > r->max) r->max = d.max;
}

int td_run_gdn_jobs(const td_job_ctx *c, int start) {
    for (int job = start; job < c->n_ms; job++) {
        printf("BEGIN %d\n", job);
        fflush(stdout);
        td_res r;
        gdn_job(c, job, c->ms[job], &r);
        td_result(job, &r);
    }
    return 0;
}
