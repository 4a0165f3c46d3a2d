/* ref_gdn.c: the CPU reference Gated DeltaNet core (reference section 2.4).
 *
 * Per sequence, token by token (the recurrent form; a prefill chunk is the
 * same recurrence run over n_new tokens):
 *   c_t   = silu( Σ_j conv_w[ch, j] · x_{t-K+1+j}[ch] )   causal depthwise conv,
 *           the K-1 previous inputs kept in the slot's conv state
 *   q, k  = l2norm(c_t[q]), l2norm(c_t[k])  (x·rsqrt(Σx² + 1e-6)), q ·= dk^-0.5
 *   g     = -exp(A_log) · softplus(a_t + dt_bias),  β = sigmoid(b_t)
 *   per value head j (key head j / (nv/nk)):
 *     S ← exp(g)·S;  m = Sᵀk;  δ = β(v − m);  S ← S + k δᵀ;  o_t = Sᵀq
 * Threads: channels for the conv, value heads for the recurrence. A BF16 state (gdn_state.rec16)
 * is read into fp32 at the start of the call and rounded back once at its end.
 */
#include "ops/cpu/cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct gdn_ctx {
    const gdn_args *a;
    const gdn_seq *sq;
    float *c;       /* [n_new, conv_dim]: conv + SiLU output */
    float *gb;      /* [n_new, nv, 2]: g, β */
} gdn_ctx;

static int conv_dim_of(const gdn_w *w) { return 2 * w->nk * w->dk + w->nv * w->dv; }

/* Conv over time for channels [c0, c1), updating the conv state. */
static void conv_channels(void *p, int64_t c0, int64_t c1) {
    const gdn_ctx *c = p;
    const gdn_args *a = c->a;
    const gdn_w *w = a->w;
    const int K = w->conv_k, D = conv_dim_of(w), T = c->sq->n_new;
    float *win = xmalloc(sizeof(float) * (K + T));
    for (int64_t ch = c0; ch < c1; ch++) {
        float *st = a->st->conv + ((size_t)c->sq->slot * D + ch) * (K - 1);
        /* window = [state (K-1 oldest first) | the T new inputs] */
        memcpy(win, st, sizeof(float) * (K - 1));
        for (int t = 0; t < T; t++)
            win[K - 1 + t] = ((const float *)a->qkv)[(size_t)(c->sq->row0 + t) * D + ch];
        const float *cw = w->conv_w + (size_t)ch * K;
        for (int t = 0; t < T; t++) {
            float s = 0;
            for (int j = 0; j < K; j++) s += cw[j] * win[t + j];
            c->c[(size_t)t * D + ch] = cpu_silu(s);
        }
        memcpy(st, win + T, sizeof(float) * (K - 1));
    }
    free(win);
}

static void l2norm(float *x, int n, float scale) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = 1.0f / sqrtf((float)ss + 1e-6f) * scale;
    for (int i = 0; i < n; i++) x[i] *= r;
}

/* The delta rule for value heads [h0, h1) over all the sequence's tokens. */
static void delta_heads(void *p, int64_t h0, int64_t h1) {
    const gdn_ctx *c = p;
    const gdn_args *a = c->a;
    const gdn_w *w = a->w;
    const int nk = w->nk, nv = w->nv, dk = w->dk, dv = w->dv, D = conv_dim_of(w);
    const int ratio = nv / nk;
    float *m = xmalloc(sizeof(float) * dv), *sbuf = a->st->rec16 ? xmalloc(sizeof(float) * dk * dv) : NULL;
    for (int64_t j = h0; j < h1; j++) {
        const int kh = (int)j / ratio;
        float *S = cpu_gdn_S_load(a->st, nv, dk, dv, c->sq->slot, (int)j, sbuf); /* [dk, dv] */
        for (int t = 0; t < c->sq->n_new; t++) {
            const float *ct = c->c + (size_t)t * D;
            const float *q = ct + (size_t)kh * dk;               /* normed + scaled in place */
            const float *k = ct + (size_t)nk * dk + (size_t)kh * dk;
            const float *v = ct + (size_t)2 * nk * dk + (size_t)j * dv;
            const float g = c->gb[((size_t)t * nv + j) * 2], beta = c->gb[((size_t)t * nv + j) * 2 + 1];
            const float decay = expf(g);
            for (int i = 0; i < dk * dv; i++) S[i] *= decay;
            for (int d = 0; d < dv; d++) m[d] = 0;
            for (int i = 0; i < dk; i++)
                for (int d = 0; d < dv; d++) m[d] += S[(size_t)i * dv + d] * k[i];
            for (int d = 0; d < dv; d++) m[d] = beta * (v[d] - m[d]); /* δ */
            for (int i = 0; i < dk; i++)
                for (int d = 0; d < dv; d++) S[(size_t)i * dv + d] += k[i] * m[d];
            float *o = (float *)a->out + ((size_t)(c->sq->row0 + t) * nv + j) * dv;
            for (int d = 0; d < dv; d++) o[d] = 0;
            for (int i = 0; i < dk; i++)
                for (int d = 0; d < dv; d++) o[d] += S[(size_t)i * dv + d] * q[i];
        }
        cpu_gdn_S_store(a->st, nv, dk, dv, c->sq->slot, (int)j, S);
    }
    free(m);
    free(sbuf);
}

float *cpu_gdn_S_load(const gdn_state *st, int nv, int dk, int dv, int slot, int j, float *buf) {
    const size_t off = ((size_t)slot * nv + j) * dk * dv;
    if (!st->rec16) return st->rec + off;
    const uint16_t *h = st->rec16 + off;
    for (size_t i = 0; i < (size_t)dk * dv; i++) buf[i] = bf16_to_f32(h[i]);
    return buf;
}

void cpu_gdn_S_store(const gdn_state *st, int nv, int dk, int dv, int slot, int j, const float *S) {
    if (!st->rec16) return;
    uint16_t *h = st->rec16 + ((size_t)slot * nv + j) * dk * dv;
    for (size_t i = 0; i < (size_t)dk * dv; i++) h[i] = f32_to_bf16(S[i]);
}

int cpu_gdn_supported(const dev_info *d, const gdn_shape *s, char *why, size_t n) {
    if (d->kind != DEV_CPU) { if (why) snprintf(why, n, "CPU backend"); return 0; }
    return cpu_supports_dt(s->dt, why, n);
}

int cpu_gdn_check_args(const gdn_args *a, ls_err *e) {
    const gdn_w *w = a->w;
    if (a->dt != ACT_F32) return errf(e, ERR_UNSUPPORTED, "gdn: CPU backends take f32 activations");
    if (w->nk <= 0 || w->nv % w->nk || w->conv_k < 1)
        return errf(e, ERR_INVAL, "gdn: bad head layout nk=%d nv=%d conv_k=%d", w->nk, w->nv, w->conv_k);
    for (int s = 0; s < a->n_seq; s++) {
        const gdn_seq *sq = &a->seqs[s];
        if (sq->slot < 0 || sq->slot >= a->st->n_slots)
            return errf(e, ERR_INVAL, "gdn: slot %d outside [0, %d)", sq->slot, a->st->n_slots);
        if (sq->row0 < 0 || sq->n_new < 0 || sq->row0 + sq->n_new > a->n_tok)
            return errf(e, ERR_INVAL, "gdn: sequence %d rows outside %d tokens", s, a->n_tok);
    }
    return 0;
}

void cpu_gdn_prepare(const gdn_args *a, const gdn_seq *sq, float *c_out, float *gb_out) {
    const gdn_w *w = a->w;
    const int D = conv_dim_of(w), nk = w->nk, nv = w->nv, dk = w->dk;
    const float qscale = 1.0f / sqrtf((float)dk);
    gdn_ctx c = {a, sq, c_out, gb_out};
    pool_for(D, 64, conv_channels, &c);
    for (int t = 0; t < sq->n_new; t++) {
        float *ct = c.c + (size_t)t * D;
        for (int h = 0; h < nk; h++) {
            l2norm(ct + (size_t)h * dk, dk, qscale);
            l2norm(ct + (size_t)nk * dk + (size_t)h * dk, dk, 1.0f);
        }
        const float *ar = (const float *)a->a + (size_t)(sq->row0 + t) * nv;
        const float *br = (const float *)a->b + (size_t)(sq->row0 + t) * nv;
        for (int j = 0; j < nv; j++) {
            c.gb[((size_t)t * nv + j) * 2] = -expf(w->A_log[j]) * cpu_softplus(ar[j] + w->dt_bias[j]);
            c.gb[((size_t)t * nv + j) * 2 + 1] = cpu_sigmoid(br[j]);
        }
    }
}

static int ref_run(const gdn_args *a, ls_stream s, ls_err *e) {
    int rc = cpu_gdn_check_args(a, e);
    if (rc) return rc;
    const int D = conv_dim_of(a->w), nv = a->w->nv;
    for (int si = 0; si < a->n_seq; si++) {
        const gdn_seq *sq = &a->seqs[si];
        if (sq->n_new == 0) continue;
        gdn_ctx c = {a, sq, xmalloc(sizeof(float) * sq->n_new * D),
                     xmalloc(sizeof(float) * sq->n_new * nv * 2)};
        cpu_gdn_prepare(a, sq, c.c, c.gb);
        pool_for(nv, 1, delta_heads, &c);
        free(c.c);
        free(c.gb);
    }
    return 0;
}

const gdn_impl gdn_cpu_ref = {"cpu_ref", DEV_CPU, 0, cpu_gdn_supported, ref_run};
