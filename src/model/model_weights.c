/* model_weights.c: the model's weights on its device, copied once at open (mdl_upload_weights,
 * from model_open and for each tensor-parallel rank's slice, model_tp.c).
 *
 * Two passes over every weight (visit_all): the first counts the bytes, each piece 256-byte
 * aligned; then one device allocation (m->dev_weights, freed at close) and the second pass
 * copies each piece host -> device on the model's stream and repoints the model at it: a
 * lin_w's data (BF16 as is; NVFP4 packed E2M1 codes) and its E4M3 block scales, the fp32 1-D
 * parameters (norms, GDN conv weights, A_log, dt_bias). The tied lm_head is not copied: after
 * the upload it is the embedding's device copy. On the CPU, and for a tensor-parallel
 * coordinator (its ranks hold the slices), the weights stay views into the safetensors
 * mapping and nothing is copied.
 */
#include "model/model_impl.h"

/* ---- weights on the device ------------------------------------------------ */

/* Visit every weight of the model: lin_w (data + scales) and the fp32 1-D
 * parameters with their lengths. The tied lm_head is skipped (it is the
 * embedding). */
typedef struct wvisit {
    model *m;
    char *dev;       /* pass 2: the device allocation */
    size_t off;      /* bytes placed so far (pass 1: counted) */
    ls_err *e;
    int rc;
} wvisit;

static void *place(wvisit *v, const void *src, size_t n) {
    void *dst = v->dev ? v->dev + v->off : NULL;
    v->off += align256(n);
    if (v->dev && !v->rc && n) v->rc = v->m->mem->h2d(dst, src, n, v->m->ops.stream, v->e);
    return dst;
}

static void visit_lin(wvisit *v, lin_w *w) {
    if (!w->data) return;
    size_t nk = (size_t)w->N * w->K;
    size_t db = w->kind == W_NVFP4 ? nk / 2 : lin_bytes(w);
    const void *d = place(v, w->data, db);
    const void *s = w->kind == W_NVFP4 ? place(v, w->scale, nk / 16) : NULL;
    if (v->dev) {
        w->data = d;
        w->scale = s;
    }
}

static void visit_vec(wvisit *v, float **p, size_t n) {
    if (!*p) return;
    float *d = place(v, *p, n * sizeof(float));
    if (v->dev) *p = d;
}

static void visit_all(wvisit *v) {
    model *m = v->m;
    const model_config *c = &m->cfg;
    const int H = c->hidden, hd = c->head_dim;
    const size_t conv_dim = (size_t)2 * c->lin_k_heads * c->lin_k_dim + (size_t)c->lin_v_heads * c->lin_v_dim;
    visit_lin(v, &m->embed);
    if (!c->tie_embeddings) visit_lin(v, &m->lm_head);
    visit_vec(v, &m->final_norm, H);
    for (int l = 0; l < c->n_layers; l++) {
        layer_w *L = &m->layers[l];
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
    }
    if (v->dev && c->tie_embeddings) m->lm_head = m->embed;
}

/* Copy every weight to the device once (no-op on the CPU, and for a
 * tensor-parallel coordinator: its ranks upload their slices). */
int mdl_upload_weights(model *m, ls_err *e) {
    if (m->ops.dev.kind == DEV_CPU || m->rank_m) return 0;
    wvisit v = {.m = m, .e = e};
    visit_all(&v); /* pass 1: sizes */
    size_t total = v.off;
    if (!(m->dev_weights = m->mem->alloc(total, e)))
        return err_prefix(e, "%s: %.2f GiB of weights on %s", m->path, total / 1073741824.0,
                          m->ops.dev.name);
    v.dev = m->dev_weights;
    v.off = 0;
    visit_all(&v); /* pass 2: copy, repoint */
    if (!v.rc) v.rc = m->mem->sync(m->ops.stream, e);
    if (v.rc) return err_prefix(e, "%s: uploading the weights", m->path);
    log_info("%s: %.2f GiB of weights on %s", m->path, total / 1073741824.0, m->ops.dev.name);
    return 0;
}
