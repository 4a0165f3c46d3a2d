/* model_qwen3_next.c: the Gated DeltaNet layers of Qwen3-Next and Qwen3.5
 * (reference sections 2.4 and 2.7). Their gated full-attention and MoE parts
 * live in model_qwen3.c.
 *
 *   qkv, z, b, a = projections of x
 *     Qwen3.5:    in_proj_qkv [q | k | v] contiguous, in_proj_z, in_proj_b, in_proj_a
 *     Qwen3-Next: in_proj_qkvz grouped per key head g: [q_g | k_g | v_g (r·dv) | z_g (r·dv)],
 *                 in_proj_ba per key head: [b_g (r) | a_g (r)], r = nv / nk
 *   core = gdn(conv1d + SiLU, l2norm, g/β, delta rule)     (the gdn op family)
 *   y    = (w · rmsnorm(core_j)) · silu(z_j) per value head j
 *   out  = y·W_outᵀ
 */
#include "model/model_impl.h"

#include <stdlib.h>
#include <string.h>

int next_bind_gdn(model *m, int l, ls_err *e) {
    const model_config *c = &m->cfg;
    gdn_layer_w *g = &m->layers[l].gdn;
    const int H = c->hidden, nk = c->lin_k_heads, nv = c->lin_v_heads, dk = c->lin_k_dim,
              dv = c->lin_v_dim, K = c->lin_conv;
    const int key_dim = nk * dk, val_dim = nv * dv, conv_dim = 2 * key_dim + val_dim;
    char p[256];
    int rc;
    mdl_name(m, p, sizeof p, "layers.%d.linear_attn.in_proj_qkvz.weight", l);
    g->fused = mdl_tensor(m, p) != NULL;
    if (g->fused) {
        mdl_name(m, p, sizeof p, "layers.%d.linear_attn.in_proj_qkvz", l);
        if ((rc = mdl_bind_lin(m, p, 2 * key_dim + 2 * val_dim, H, &g->qkvz, e))) return rc;
        mdl_name(m, p, sizeof p, "layers.%d.linear_attn.in_proj_ba", l);
        if ((rc = mdl_bind_lin(m, p, 2 * nv, H, &g->ba, e))) return rc;
    } else {
        mdl_name(m, p, sizeof p, "layers.%d.linear_attn.in_proj_qkv", l);
        if ((rc = mdl_bind_lin(m, p, conv_dim, H, &g->qkv, e))) return rc;
        mdl_name(m, p, sizeof p, "layers.%d.linear_attn.in_proj_z", l);
        if ((rc = mdl_bind_lin(m, p, val_dim, H, &g->z, e))) return rc;
        mdl_name(m, p, sizeof p, "layers.%d.linear_attn.in_proj_b", l);
        if ((rc = mdl_bind_lin(m, p, nv, H, &g->b, e))) return rc;
        mdl_name(m, p, sizeof p, "layers.%d.linear_attn.in_proj_a", l);
        if ((rc = mdl_bind_lin(m, p, nv, H, &g->a, e))) return rc;
    }
    mdl_name(m, p, sizeof p, "layers.%d.linear_attn.out_proj", l);
    if ((rc = mdl_bind_lin(m, p, H, val_dim, &g->out, e))) return rc;
    float *conv_w, *A_log, *dt_bias;
    mdl_name(m, p, sizeof p, "layers.%d.linear_attn.conv1d.weight", l);
    const int64_t cs[3] = {conv_dim, 1, K};
    if ((rc = mdl_bind_vec(m, p, 3, cs, &conv_w, e))) return rc;
    mdl_name(m, p, sizeof p, "layers.%d.linear_attn.A_log", l);
    if ((rc = mdl_bind_vec1(m, p, nv, &A_log, e))) return rc;
    mdl_name(m, p, sizeof p, "layers.%d.linear_attn.dt_bias", l);
    if ((rc = mdl_bind_vec1(m, p, nv, &dt_bias, e))) return rc;
    mdl_name(m, p, sizeof p, "layers.%d.linear_attn.norm.weight", l);
    if ((rc = mdl_bind_vec1(m, p, dv, &g->norm, e))) return rc;
    g->g = (gdn_w){.nk = nk, .nv = nv, .dk = dk, .dv = dv, .conv_k = K,
                   .conv_w = conv_w, .A_log = A_log, .dt_bias = dt_bias};
    return 0;
}

/* Qwen3-Next's per-key-head layout -> contiguous qkv [T, conv_dim], z [T, nv·dv], b, a [T, nv]. */
static void unfuse(const model_config *c, int T, const float *qkvz, const float *ba, float *qkv,
                   float *z, float *b, float *a) {
    const int nk = c->lin_k_heads, nv = c->lin_v_heads, dk = c->lin_k_dim, dv = c->lin_v_dim;
    const int r = nv / nk, key_dim = nk * dk, val_dim = nv * dv;
    const int grp = 2 * dk + 2 * r * dv, conv_dim = 2 * key_dim + val_dim;
    for (int t = 0; t < T; t++) {
        const float *src = qkvz + (size_t)t * nk * grp;
        float *dst = qkv + (size_t)t * conv_dim;
        for (int g = 0; g < nk; g++) {
            const float *s = src + (size_t)g * grp;
            memcpy(dst + (size_t)g * dk, s, sizeof(float) * dk);                            /* q_g */
            memcpy(dst + key_dim + (size_t)g * dk, s + dk, sizeof(float) * dk);             /* k_g */
            memcpy(dst + 2 * key_dim + (size_t)g * r * dv, s + 2 * dk, sizeof(float) * r * dv); /* v */
            memcpy(z + (size_t)t * val_dim + (size_t)g * r * dv, s + 2 * dk + r * dv,
                   sizeof(float) * r * dv);                                                 /* z */
            const float *sba = ba + (size_t)t * 2 * nv + (size_t)g * 2 * r;
            memcpy(b + (size_t)t * nv + (size_t)g * r, sba, sizeof(float) * r);
            memcpy(a + (size_t)t * nv + (size_t)g * r, sba + r, sizeof(float) * r);
        }
    }
}

int next_gdn_forward(fwd_ctx *f, int l, const float *u, float *out, ls_err *e) {
    model *m = f->m;
    const model_config *c = &m->cfg;
    const gdn_layer_w *g = &m->layers[l].gdn;
    const int T = f->n_tok, nv = c->lin_v_heads, dv = c->lin_v_dim;
    const int val_dim = nv * dv, conv_dim = 2 * c->lin_k_heads * c->lin_k_dim + val_dim;
    int rc;
    float *qkv = xmalloc(sizeof(float) * (size_t)T * conv_dim);
    float *z = xmalloc(sizeof(float) * (size_t)T * val_dim);
    float *b = xmalloc(sizeof(float) * (size_t)T * nv), *a = xmalloc(sizeof(float) * (size_t)T * nv);
    float *core = xmalloc(sizeof(float) * (size_t)T * val_dim);
    float *fused = NULL, *fba = NULL;
    if (g->fused) {
        fused = xmalloc(sizeof(float) * (size_t)T * g->qkvz.N);
        fba = xmalloc(sizeof(float) * (size_t)T * g->ba.N);
        if ((rc = ops_linear(&m->ops, T, u, &g->qkvz, fused, 0, e))) goto done;
        if ((rc = ops_linear(&m->ops, T, u, &g->ba, fba, 0, e))) goto done;
        unfuse(c, T, fused, fba, qkv, z, b, a);
    } else {
        if ((rc = ops_linear(&m->ops, T, u, &g->qkv, qkv, 0, e))) goto done;
        if ((rc = ops_linear(&m->ops, T, u, &g->z, z, 0, e))) goto done;
        if ((rc = ops_linear(&m->ops, T, u, &g->b, b, 0, e))) goto done;
        if ((rc = ops_linear(&m->ops, T, u, &g->a, a, 0, e))) goto done;
    }
    const int li = m->layers[l].cache_idx;
    const mcache *mc = f->c;
    gdn_state st = {
        .conv = mc->conv + (size_t)li * mc->n_slots * conv_dim * (c->lin_conv - 1),
        .rec = mc->rec + (size_t)li * mc->n_slots * nv * c->lin_k_dim * dv,
        .n_slots = mc->n_slots};
    gdn_args ga = {.n_seq = f->n_seq, .seqs = f->gseq, .n_tok = T, .w = &g->g, .qkv = qkv,
                   .a = a, .b = b, .st = &st, .out = core, .dt = m->ops.act};
    if ((rc = m->ops.gdn->run(&ga, NULL, e))) goto done;
    m->ops.small->rmsnorm_gated(T * nv, dv, core, z, g->norm, c->rms_eps, core, m->ops.act, NULL);
    rc = ops_linear(&m->ops, T, core, &g->out, out, 0, e);
done:
    free(qkv); free(z); free(b); free(a); free(core); free(fused); free(fba);
    return rc;
}
