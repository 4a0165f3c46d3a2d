/* model_qwen3.c: attention and MLP/MoE layers of Qwen3 and Qwen3-MoE, also
 * used for the full-attention and MoE parts of Qwen3-Next and Qwen3.5.
 *
 * Attention (reference sections 2.3 and 7):
 *   q = x·Wqᵀ (gated: per head [q_h | gate_h]),  k = x·Wkᵀ,  v = x·Wvᵀ
 *   q, k ← per-head RMSNorm (plain w·x̂ for Qwen3/-MoE, (1+w)·x̂ for the hybrids)
 *   q, k ← NeoX RoPE on the first rotary_dim dims (all of them for Qwen3)
 *   K, V → the paged pool;  o = softmax(q·kᵀ/√hd) v over positions ≤ p
 *   o ·= sigmoid(gate) (gated);  out = o·Woᵀ
 * MLP: down(silu(gate(x))·up(x)); MoE: the moe op family.
 */
#include "model/model_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- binding ------------------------------------------------------------- */

int qwen3_bind_attn(model *m, int l, ls_err *e) {
    const model_config *c = &m->cfg;
    attn_layer_w *a = &m->layers[l].attn;
    const int H = c->hidden, hd = c->head_dim, qrows = c->n_heads * hd * (c->attn_output_gate ? 2 : 1);
    char p[256];
    int rc;
    mdl_name(m, p, sizeof p, "layers.%d.self_attn.q_proj", l);
    if ((rc = mdl_bind_lin(m, p, qrows, H, &a->q, e))) return rc;
    if (c->attn_output_gate) {
        /* q_proj rows are per head [q_h | gate_h]: take them apart once, here */
        const int nq = c->n_heads * hd;
        int *rows = xmalloc(sizeof(int) * 2 * nq);
        for (int h = 0; h < c->n_heads; h++)
            for (int i = 0; i < hd; i++) {
                rows[h * hd + i] = h * 2 * hd + i;
                rows[nq + h * hd + i] = h * 2 * hd + hd + i;
            }
        lin_w qg = a->q;
        mdl_take_rows(m, &qg, rows, nq, &a->q);
        mdl_take_rows(m, &qg, rows + nq, nq, &a->gate);
        free(rows);
    }
    mdl_name(m, p, sizeof p, "layers.%d.self_attn.k_proj", l);
    if ((rc = mdl_bind_lin(m, p, c->n_kv_heads * hd, H, &a->k, e))) return rc;
    mdl_name(m, p, sizeof p, "layers.%d.self_attn.v_proj", l);
    if ((rc = mdl_bind_lin(m, p, c->n_kv_heads * hd, H, &a->v, e))) return rc;
    mdl_name(m, p, sizeof p, "layers.%d.self_attn.o_proj", l);
    if ((rc = mdl_bind_lin(m, p, H, c->n_heads * hd, &a->o, e))) return rc;
    mdl_name(m, p, sizeof p, "layers.%d.self_attn.q_norm.weight", l);
    if ((rc = mdl_bind_vec1(m, p, hd, &a->q_norm, e))) return rc;
    mdl_name(m, p, sizeof p, "layers.%d.self_attn.k_norm.weight", l);
    return mdl_bind_vec1(m, p, hd, &a->k_norm, e);
}

/* Experts: per-expert `experts.{e}.{gate,up,down}_proj` (any kind, NVFP4
 * included) or fused 3-D `experts.gate_up_proj [E, 2I, H]` (gate rows first)
 * and `experts.down_proj [E, H, I]` (no .weight suffix). */
static int bind_experts(model *m, int l, layer_w *L, ls_err *e) {
    const model_config *c = &m->cfg;
    const int E = c->n_experts, I = c->moe_inter, H = c->hidden;
    L->experts = mdl_alloc(m, sizeof(lin_w) * 3 * E);
    lin_w *gate = L->experts, *up = gate + E, *down = up + E;
    char p[256];
    int rc;
    mdl_name(m, p, sizeof p, "layers.%d.mlp.experts.gate_up_proj", l);
    const st_tensor *gu = mdl_tensor(m, p);
    if (gu) {
        char pd[256];
        mdl_name(m, pd, sizeof pd, "layers.%d.mlp.experts.down_proj", l);
        const st_tensor *dn = mdl_tensor(m, pd);
        if (!dn) return errf(e, ERR_INVAL, "missing tensor '%s' (beside '%s' in %s)", pd, p, gu->file);
        const struct { const st_tensor *t; const char *name; int64_t s[3]; } want[2] = {
            {gu, p, {E, 2 * I, H}}, {dn, pd, {E, H, I}}};
        for (int i = 0; i < 2; i++) {
            const st_tensor *t = want[i].t;
            if (t->dtype != ST_BF16 && t->dtype != ST_F16 && t->dtype != ST_F32)
                return errf(e, ERR_INVAL, "tensor '%s' in %s: dtype %s, expected BF16, F16 or F32",
                            want[i].name, t->file, st_dtype_name(t->dtype));
            if (t->ndim != 3 || t->shape[0] != want[i].s[0] || t->shape[1] != want[i].s[1] ||
                t->shape[2] != want[i].s[2])
                return errf(e, ERR_INVAL, "tensor '%s' in %s: shape [%lld, %lld, %lld] (ndim %d), "
                            "expected [%lld, %lld, %lld]", want[i].name, t->file,
                            (long long)t->shape[0], (long long)(t->ndim > 1 ? t->shape[1] : 0),
                            (long long)(t->ndim > 2 ? t->shape[2] : 0), t->ndim,
                            (long long)want[i].s[0], (long long)want[i].s[1], (long long)want[i].s[2]);
        }
        w_kind k = gu->dtype == ST_BF16 ? W_BF16 : gu->dtype == ST_F16 ? W_F16 : W_F32;
        w_kind kd = dn->dtype == ST_BF16 ? W_BF16 : dn->dtype == ST_F16 ? W_F16 : W_F32;
        size_t es = st_dtype_size(gu->dtype), eds = st_dtype_size(dn->dtype);
        for (int x = 0; x < E; x++) {
            const char *base = (const char *)gu->data + (size_t)x * 2 * I * H * es;
            gate[x] = (lin_w){.kind = k, .N = I, .K = H, .data = base, .name = gu->name};
            up[x] = (lin_w){.kind = k, .N = I, .K = H, .data = base + (size_t)I * H * es, .name = gu->name};
            down[x] = (lin_w){.kind = kd, .N = H, .K = I,
                              .data = (const char *)dn->data + (size_t)x * H * I * eds, .name = dn->name};
        }
    } else {
        for (int x = 0; x < E; x++) {
            mdl_name(m, p, sizeof p, "layers.%d.mlp.experts.%d.gate_proj", l, x);
            if ((rc = mdl_bind_lin_bf16(m, p, I, H, &gate[x], e))) return rc;
            mdl_name(m, p, sizeof p, "layers.%d.mlp.experts.%d.up_proj", l, x);
            if ((rc = mdl_bind_lin_bf16(m, p, I, H, &up[x], e))) return rc;
            mdl_name(m, p, sizeof p, "layers.%d.mlp.experts.%d.down_proj", l, x);
            if ((rc = mdl_bind_lin_bf16(m, p, H, I, &down[x], e))) return rc;
        }
    }
    L->moe.gate = gate;
    L->moe.up = up;
    L->moe.down = down;
    return 0;
}

int qwen3_bind_mlp(model *m, int l, ls_err *e) {
    const model_config *c = &m->cfg;
    layer_w *L = &m->layers[l];
    const int H = c->hidden;
    char p[256];
    int rc;
    L->dense = c->mlp_only[l];
    if (L->dense) {
        const int I = c->intermediate;
        mdl_name(m, p, sizeof p, "layers.%d.mlp.gate_proj", l);
        if ((rc = mdl_bind_lin(m, p, I, H, &L->mlp.gate, e))) return rc;
        mdl_name(m, p, sizeof p, "layers.%d.mlp.up_proj", l);
        if ((rc = mdl_bind_lin(m, p, I, H, &L->mlp.up, e))) return rc;
        mdl_name(m, p, sizeof p, "layers.%d.mlp.down_proj", l);
        return mdl_bind_lin(m, p, H, I, &L->mlp.down, e);
    }
    moe_w *w = &L->moe;
    w->hidden = H;
    w->n_experts = c->n_experts;
    w->top_k = c->top_k;
    w->inter = c->moe_inter;
    w->norm_topk = c->norm_topk_prob;
    mdl_name(m, p, sizeof p, "layers.%d.mlp.gate", l);
    if ((rc = mdl_bind_lin_bf16(m, p, c->n_experts, H, &w->router, e))) return rc;
    if ((rc = bind_experts(m, l, L, e))) return rc;
    w->shared_inter = c->shared_inter;
    if (c->shared_inter > 0) {
        const int Is = c->shared_inter;
        mdl_name(m, p, sizeof p, "layers.%d.mlp.shared_expert.gate_proj", l);
        if ((rc = mdl_bind_lin_bf16(m, p, Is, H, &w->sh_gate, e))) return rc;
        mdl_name(m, p, sizeof p, "layers.%d.mlp.shared_expert.up_proj", l);
        if ((rc = mdl_bind_lin_bf16(m, p, Is, H, &w->sh_up, e))) return rc;
        mdl_name(m, p, sizeof p, "layers.%d.mlp.shared_expert.down_proj", l);
        if ((rc = mdl_bind_lin_bf16(m, p, H, Is, &w->sh_down, e))) return rc;
        mdl_name(m, p, sizeof p, "layers.%d.mlp.shared_expert_gate", l);
        if ((rc = mdl_bind_lin_bf16(m, p, 1, H, &w->sh_gate_w, e))) return rc;
        w->has_sh_gate = 1;
    }
    return 0;
}

/* ---- forward ------------------------------------------------------------- */

int qwen3_attn_forward(fwd_ctx *f, int l, const void *u, void *out, ls_err *e) {
    model *m = f->m;
    const model_config *c = &m->cfg;
    const attn_layer_w *a = &m->layers[l].attn;
    const small_ops *so = m->ops.small;
    const act_dtype dt = m->ops.act;
    const ls_stream st = m->ops.stream;
    mws *w = f->ws;
    const int T = f->n_tok, nh = c->n_heads, nkv = c->n_kv_heads, hd = c->head_dim;
    int rc;
    {   /* q, (gate,) k, v: the projections of u, one launch where the gemm backend groups them */
        const lin_w *pw[4] = {&a->q, &a->k, &a->v, &a->gate};
        void *const py[4] = {w->q, w->k, w->v, w->gate};
        if ((rc = ops_linear_multi(&m->ops, T, u, c->attn_output_gate ? 4 : 3, pw, py, e))) return rc;
    }
    const int li = m->layers[l].cache_idx;
    const size_t pool = (size_t)f->c->n_pages * f->c->page_size * nkv * hd * act_size(m->kv_dt);
    char *kv0 = f->c->kv;
    kv_layer kv = {.k = kv0 + (size_t)li * 2 * pool, .v = kv0 + ((size_t)li * 2 + 1) * pool,
                   .n_pages = f->c->n_pages, .page_size = f->c->page_size, .dt = m->kv_dt};
    if (so->qk_norm_rope_kv) { /* the three steps below in as few launches as the device can */
        if ((rc = so->qk_norm_rope_kv(T, nh, nkv, hd, w->q, w->k, w->v, a->q_norm, a->k_norm, m->norm_kind,
                                      c->rms_eps, c->rotary_dim, f->pos, c->rope_theta, &kv, f->n_seq, f->aseq, dt,
                                      st)))
            return errf(e, rc, "layer %d: q/k norm + rope + KV write failed (a page outside the pool, or dtype %s)",
                        l, act_name(dt));
    } else {
        /* q/k norm and RoPE fused: one rounding to the activation dtype, not two */
        if ((rc = mdl_op_err(so->qk_norm_rope(T, nh, hd, w->q, a->q_norm, m->norm_kind, c->rms_eps, c->rotary_dim,
                                              f->pos, c->rope_theta, dt, st), "q_norm + rope(q)", l, e)) ||
            (rc = mdl_op_err(so->qk_norm_rope(T, nkv, hd, w->k, a->k_norm, m->norm_kind, c->rms_eps,
                                              c->rotary_dim, f->pos, c->rope_theta, dt, st), "k_norm + rope(k)", l, e)))
            return rc;
        if ((rc = so->kv_write(&kv, f->n_seq, f->aseq, nkv, hd, w->k, w->v, dt, st)))
            return errf(e, rc, "layer %d: KV write failed (a page outside the pool, or dtype %s)", l,
                        act_name(dt));
    }
    attn_args aa = {.n_seq = f->n_seq, .seqs = f->aseq, .n_tok = T, .n_heads = nh,
                    .n_kv_heads = nkv, .head_dim = hd, .scale = 1.0f / sqrtf((float)hd),
                    .q = w->q, .gate = c->attn_output_gate ? w->gate : NULL, .kv = &kv,
                    .out = w->ao, .dt = dt, .seqs_host = f->aseq_host, .ctx_cap = f->ctx_cap,
                    .scratch = f->attn_scratch, .scratch_bytes = f->attn_scratch_bytes};
    if ((rc = ops_attn_run(&m->ops, &aa, f->max_ctx, e))) return rc;
    return ops_linear(&m->ops, T, w->ao, &a->o, out, 0, e);
}

int qwen3_mlp_forward(fwd_ctx *f, int l, const void *u, void *out, ls_err *e) {
    model *m = f->m;
    const layer_w *L = &m->layers[l];
    const int T = f->n_tok;
    mws *w = f->ws;
    int rc;
    if (!L->dense) {
        moe_args a = {.M = T, .x = u, .y = out, .w = &L->moe, .dt = m->ops.act};
        return ops_moe_run(&m->ops, &a, e);
    }
    const int I = L->mlp.gate.N;
    if ((rc = ops_linear(&m->ops, T, u, &L->mlp.gate, w->g, 0, e)) ||
        (rc = ops_linear(&m->ops, T, u, &L->mlp.up, w->up, 0, e)))
        return rc;
    if ((rc = mdl_op_err(m->ops.small->silu_mul((int64_t)T * I, w->g, w->up, w->g, m->ops.act,
                                                m->ops.stream), "silu_mul", l, e)))
        return rc;
    return ops_linear(&m->ops, T, w->g, &L->mlp.down, out, 0, e);
}
