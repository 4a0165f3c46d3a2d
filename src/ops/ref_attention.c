/* ref_attention.c: the CPU reference attention over the paged KV pool.
 *
 * For new token i of a sequence (position p = n_past + i) and query head h:
 *   s_j = scale · q·k_j  for j in [0, p]  (causal), kv head h / (nh / nkv)
 *   o   = Σ_j softmax(s)_j · v_j          (softmax in fp32, max-subtracted)
 *   o  *= sigmoid(gate)                    (when a gate is given)
 * Prefill chunks and decode rows of different sequences mix freely.
 * Threads split the (token, head) pairs.
 */
#include "ops/cpu/cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct attn_ctx {
    const attn_args *a;
    const int *row_seq; /* [n_tok] -> sequence index */
} attn_ctx;

static void attn_pairs(void *p, int64_t i0, int64_t i1) {
    const attn_ctx *c = p;
    const attn_args *a = c->a;
    const kv_layer *kv = a->kv;
    const int nh = a->n_heads, hd = a->head_dim, grp = a->n_heads / a->n_kv_heads;
    const size_t kv_row = (size_t)a->n_kv_heads * hd;
    int max_ctx = 0;
    for (int s = 0; s < a->n_seq; s++)
        if (a->seqs[s].n_past + a->seqs[s].n_new > max_ctx) max_ctx = a->seqs[s].n_past + a->seqs[s].n_new;
    float *sc = xmalloc(sizeof(float) * (max_ctx ? max_ctx : 1));
    double *acc = xmalloc(sizeof(double) * hd);
    for (int64_t pi = i0; pi < i1; pi++) {
        int t = (int)(pi / nh), h = (int)(pi % nh), kvh = h / grp;
        const attn_seq *sq = &a->seqs[c->row_seq[t]];
        int pos = sq->n_past + (t - sq->row0);
        const float *q = (const float *)a->q + ((size_t)t * nh + h) * hd;
        float mx = -INFINITY;
        for (int j = 0; j <= pos; j++) {
            size_t off = ((size_t)sq->pages[j / kv->page_size] * kv->page_size + j % kv->page_size) * kv_row +
                         (size_t)kvh * hd;
            sc[j] = cpu_dot(q, (const float *)kv->k + off, hd) * a->scale;
            if (sc[j] > mx) mx = sc[j];
        }
        double sum = 0;
        for (int j = 0; j <= pos; j++) sum += (sc[j] = expf(sc[j] - mx));
        memset(acc, 0, sizeof(double) * hd);
        for (int j = 0; j <= pos; j++) {
            size_t off = ((size_t)sq->pages[j / kv->page_size] * kv->page_size + j % kv->page_size) * kv_row +
                         (size_t)kvh * hd;
            const float *v = (const float *)kv->v + off;
            for (int d = 0; d < hd; d++) acc[d] += (double)sc[j] * v[d];
        }
        float *o = (float *)a->out + ((size_t)t * nh + h) * hd;
        const float *g = a->gate ? (const float *)a->gate + ((size_t)t * nh + h) * hd : NULL;
        for (int d = 0; d < hd; d++) {
            o[d] = (float)(acc[d] / sum);
            if (g) o[d] *= cpu_sigmoid(g[d]);
        }
    }
    free(sc);
    free(acc);
}

static int ref_supported(const dev_info *d, const attn_shape *s, char *why, size_t n) {
    if (d->kind != DEV_CPU) { if (why) snprintf(why, n, "CPU backend"); return 0; }
    return cpu_supports_dt(s->dt, why, n);
}

static int ref_run(const attn_args *a, ls_stream s, ls_err *e) {
    if (a->dt != ACT_F32 || a->kv->dt != ACT_F32)
        return errf(e, ERR_UNSUPPORTED, "attention cpu_ref: f32 activations and KV only");
    if (a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads)
        return errf(e, ERR_INVAL, "attention: %d heads over %d kv heads", a->n_heads, a->n_kv_heads);
    int *row_seq = xmalloc(sizeof(int) * (a->n_tok ? a->n_tok : 1));
    for (int q = 0; q < a->n_seq; q++) {
        const attn_seq *sq = &a->seqs[q];
        if (sq->row0 < 0 || sq->row0 + sq->n_new > a->n_tok) {
            free(row_seq);
            return errf(e, ERR_INVAL, "attention: sequence %d rows [%d, %d) outside %d tokens", q,
                        sq->row0, sq->row0 + sq->n_new, a->n_tok);
        }
        for (int i = 0; i < sq->n_new; i++) row_seq[sq->row0 + i] = q;
    }
    attn_ctx c = {a, row_seq};
    pool_for((int64_t)a->n_tok * a->n_heads, 1, attn_pairs, &c);
    free(row_seq);
    return 0;
}

const attn_impl attn_cpu_ref = {"cpu_ref", DEV_CPU, 0, ref_supported, ref_run};
