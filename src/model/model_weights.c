/* model_weights.c: the model's weights on its device, copied part by part as they are bound
 * (model_open streams the checkpoint: the non-layer weights, then one layer at a time, each
 * copied before the next is generated or read, model.c), and for each tensor-parallel rank's
 * slices (model_tp.c).
 *
 * A part (-1: embedding, lm_head, final norm; l: layer l) is visited twice (visit_part): the
 * first pass counts the bytes, each piece 256-byte aligned; then one device allocation per part
 * (m->dev_part[part + 1], freed at close) and the second pass copies each piece host -> device
 * on the model's stream and repoints the model at it: a lin_w's data (BF16 as is; NVFP4 packed
 * E2M1 codes; FP8 E4M3 codes) and its scales (NVFP4's E4M3 blocks, FP8's fp32 ones), the fp32 1-D parameters (norms, GDN conv weights,
 * A_log, dt_bias). After the stream drained, the host blocks the model owned for those pieces
 * (mdl_alloc'd: fp32 vectors, permuted or sliced rows) are freed, so host memory holds a part
 * at a time, never the model. The tied lm_head is not copied: after the upload it is the
 * embedding's device copy. On the CPU, and for a tensor-parallel coordinator (its ranks hold
 * the slices), nothing is copied.
 */
#include "model/model_impl.h"

#include <stdlib.h>
#include <string.h>

#ifdef LS_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

/* ---- weights on the device ------------------------------------------------ */

/* Visit every weight of the model: lin_w (data + scales) and the fp32 1-D
 * parameters with their lengths. The tied lm_head is skipped (it is the
 * embedding). */
typedef struct wvisit {
    model *m;
    char *dev;       /* pass 2: the device allocation */
    size_t off;      /* bytes placed so far (pass 1: counted) */
    const void **old;/* pass 2: the host pieces copied (freed afterwards when the model owns them) */
    int n_old, cap_old;
    ls_err *e;
    int rc;
} wvisit;

static void *place(wvisit *v, const void *src, size_t n) {
    void *dst = v->dev ? v->dev + v->off : NULL;
    v->off += align256(n);
    if (v->dev && !v->rc && n) v->rc = v->m->mem->h2d(dst, src, n, v->m->ops.stream, v->e);
    if (v->dev && src) {
        if (v->n_old == v->cap_old) {
            v->cap_old = v->cap_old ? 2 * v->cap_old : 256;
            v->old = xrealloc(v->old, sizeof(*v->old) * v->cap_old);
        }
        v->old[v->n_old++] = src;
    }
    return dst;
}

static void visit_lin(wvisit *v, lin_w *w) {
    if (!w->data) return;
    size_t nk = (size_t)w->N * w->K;
    size_t db = w->kind == W_NVFP4 ? nk / 2 : w->kind == W_FP8 ? nk : lin_bytes(w);
    const void *d = place(v, w->data, db);
    const void *s = w->kind == W_NVFP4 ? place(v, w->scale, nk / 16) : NULL;
    const void *fs = w->kind == W_FP8 ? place(v, w->fscale, sizeof(float) * w->fs_n) : NULL;
    if (v->dev) {
        w->data = d;
        w->scale = s;
        w->fscale = fs;
    }
}

static void visit_vec(wvisit *v, float **p, size_t n) {
    if (!*p) return;
    float *d = place(v, *p, n * sizeof(float));
    if (v->dev) *p = d;
}

/* part -1: the embedding, lm_head and final norm; part l: layer l's weights */
static void visit_part(wvisit *v, int part) {
    model *m = v->m;
    const model_config *c = &m->cfg;
    const int H = c->hidden, hd = c->head_dim;
    const size_t conv_dim = (size_t)2 * c->lin_k_heads * c->lin_k_dim + (size_t)c->lin_v_heads * c->lin_v_dim;
    if (part < 0) {
        visit_lin(v, &m->embed);
        if (!c->tie_embeddings) visit_lin(v, &m->lm_head);
        visit_vec(v, &m->final_norm, H);
        if (v->dev && c->tie_embeddings) m->lm_head = m->embed;
        return;
    }
    {
        layer_w *L = &m->layers[part];
        visit_vec(v, &L->in_norm, H);
        visit_vec(v, &L->post_norm, H);
        if (L->type == LAYER_FULL_ATTN) {
            attn_layer_w *a = &L->attn;
            visit_lin(v, &a->q);
            visit_lin(v, &a->gate);
            visit_lin(v, &a->k);
            visit_lin(v, &a->v);
            visit_lin(v, &a->o);
            visit_vec(v, &a->q_norm, hd);
            visit_vec(v, &a->k_norm, hd);
        } else {
            gdn_layer_w *g = &L->gdn;
            visit_lin(v, &g->qkv);
            visit_lin(v, &g->z);
            visit_lin(v, &g->b);
            visit_lin(v, &g->a);
            visit_lin(v, &g->out);
            visit_vec(v, &g->norm, c->lin_v_dim);
            float *cw = (float *)g->g.conv_w, *al = (float *)g->g.A_log, *db = (float *)g->g.dt_bias;
            visit_vec(v, &cw, conv_dim * c->lin_conv);
            visit_vec(v, &al, c->lin_v_heads);
            visit_vec(v, &db, c->lin_v_heads);
            g->g.conv_w = cw;
            g->g.A_log = al;
            g->g.dt_bias = db;
        }
        if (L->dense) {
            visit_lin(v, &L->mlp.gate);
            visit_lin(v, &L->mlp.up);
            visit_lin(v, &L->mlp.down);
        } else {
            moe_w *w = &L->moe;
            visit_lin(v, &w->router);
            for (int x = 0; x < 3 * w->n_experts; x++) visit_lin(v, &L->experts[x]);
            visit_lin(v, &w->sh_gate);
            visit_lin(v, &w->sh_up);
            visit_lin(v, &w->sh_down);
            visit_lin(v, &w->sh_gate_w);
        }
        if (L->mtp) {
            visit_lin(v, &L->mtp->fc_e);
            visit_lin(v, &L->mtp->fc_h);
            visit_vec(v, &L->mtp->pre_e, H);
            visit_vec(v, &L->mtp->pre_h, H);
            visit_vec(v, &L->mtp->norm, H);
        }
    }
}

static int cmp_ptr(const void *a, const void *b) {
    uintptr_t x = (uintptr_t) * (const void *const *)a, y = (uintptr_t) * (const void *const *)b;
    return x < y ? -1 : x > y;
}

/* Free the blocks of m->owned that are among old[0..n) (sorted here). */
static void free_owned_among(model *m, const void **old, int n) {
    if (!n) return;
    qsort(old, n, sizeof *old, cmp_ptr);
    int k = 0;
    for (int i = 0; i < m->n_owned; i++) {
        void *p = m->owned[i];
        if (bsearch(&p, old, n, sizeof *old, cmp_ptr)) free(p);
        else m->owned[k++] = p;
    }
    m->n_owned = k;
}

int mdl_uploads(const model *m) {
    static int test = -1;
    if (test < 0) {
        const char *v = getenv("LASTSTAND_TEST_CPU_UPLOAD");
        test = v && !strcmp(v, "1");
    }
    return m->ops.dev.kind != DEV_CPU || test;
}

int mdl_upload_part(model *m, int part, ls_err *e) {
    if (!mdl_uploads(m) || m->rank_m) return 0;
    const int np = m->cfg.n_layers + 1 + m->n_mtp;
    if (!m->dev_part) m->dev_part = xcalloc((size_t)np, sizeof *m->dev_part);
    if (m->dev_part[part + 1]) return 0; /* already there */
    wvisit v = {.m = m, .e = e};
    visit_part(&v, part); /* pass 1: sizes */
    size_t total = v.off;
    char what[64];
    if (part < 0) snprintf(what, sizeof what, "the embedding, lm_head and final norm");
    else if (part == m->cfg.n_layers) snprintf(what, sizeof what, "the MTP head");
    else snprintf(what, sizeof what, "layer %d", part);
    if (!total) return 0;
    if (!(m->dev_part[part + 1] = m->mem->alloc(total, e)))
        return err_prefix(e, "%s: %s: %.2f GiB of weights on %s (%.2f GiB placed before it)", m->path, what,
                          total / 1073741824.0, m->ops.dev.name, m->weight_bytes / 1073741824.0);
    v.dev = m->dev_part[part + 1];
    v.off = 0;
    visit_part(&v, part); /* pass 2: copy, repoint */
    if (!v.rc) v.rc = m->mem->sync(m->ops.stream, e);
    if (!v.rc) free_owned_among(m, v.old, v.n_old); /* the host copies are no longer read */
    free(v.old);
    if (v.rc) return err_prefix(e, "%s: uploading %s", m->path, what);
    m->weight_bytes += total;
    return 0;
}

/* Copy every weight to the device once (no-op on the CPU, and for a
 * tensor-parallel coordinator: its ranks upload their slices). */
int mdl_upload_weights(model *m, ls_err *e) {
    if (!mdl_uploads(m) || m->rank_m) return 0;
    for (int part = -1; part < m->cfg.n_layers + m->n_mtp; part++) {
        int rc = mdl_upload_part(m, part, e);
        if (rc) return rc;
    }
    return 0;
}

int mdl_dev_mem_info(model *m, size_t *free_b, size_t *total_b) {
    *free_b = *total_b = 0;
#ifdef LS_HAVE_CUDA
    if (m->ops.dev.kind == DEV_CUDA) {
        size_t f = 0, t = 0;
        if (m->mem->bind_thread(m->ops.dev.ordinal, NULL) || cudaMemGetInfo(&f, &t) != cudaSuccess) return -1;
        *free_b = f;
        *total_b = t;
        return 0;
    }
#endif
    return -1;
}

int mdl_check_fits(model *m, double weights, int tp, ls_err *e) {
    size_t fr = 0, tot = 0;
    if (weights <= 0 || mdl_dev_mem_info(m, &fr, &tot)) return 0;
    const double GiB = 1073741824.0, headroom = GiB; /* context, workspace, a minimal cache */
    if ((double)fr >= weights + headroom) return 0;
    return errf(e, ERR_NOMEM, "GPU %d (%s): the weights need %.2f GiB per GPU at --tp %d (+ %.0f GiB for "
                "caches and workspace), only %.2f of its %.2f GiB are free: spread the model over more GPUs "
                "(--tp) or load fewer layers", m->ops.dev.ordinal, m->ops.dev.name, weights / GiB, tp,
                headroom / GiB, fr / GiB, tot / GiB);
}

int model_gpu_mem(model *m, int *ordinal, size_t *free_b, size_t *total_b) {
    *ordinal = -1;
    *free_b = *total_b = 0;
    const int n = m->rank_m ? m->tp : 1;
    int rc = -1;
    for (int r = 0; r < n; r++) {
        model *rm = m->rank_m ? m->rank_m[r] : m;
        size_t f, t;
        if (mdl_dev_mem_info(rm, &f, &t)) continue;
        if (rc || f < *free_b) {
            *ordinal = rm->ops.dev.ordinal;
            *free_b = f;
            *total_b = t;
        }
        rc = 0;
    }
    if (m->rank_m) m->mem->bind_thread(m->rank_m[0]->ops.dev.ordinal, NULL);
    return rc;
}
