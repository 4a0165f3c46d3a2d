/* model_backends.c: which backends a model's ops run on, past ops_select (model.c,
 * open_device): the lm_head's own gemm selection, and the check at open that every backend
 * named on the command line can run the model's shapes.
 *
 * lm_head: the vocab projection [V, H] (the embedding when tied) is far larger than the
 * other projections, so it has a plan of its own (model_opts.lm_head_backend, the doctor's
 * "lm_head" rows; "auto" or none: the gemm family's). mdl_lm_select parses it and the
 * "lm_head:NAME" bans at open; mdl_lm_ops hands the forward pass (and the check below) a
 * selection with that plan, the stream and everything else as m->ops has them now.
 *
 * Named backends: a family named by a flag never falls back, so a backend that cannot take
 * one of the model's shapes would fail the first request that reaches it (e.g. a decode
 * step); mdl_check_named_backends refuses it at open instead (ops_sel_check_*), on the
 * shapes that run (a tensor-parallel rank's slices), naming the flag, the plan as given,
 * the layer and the tensor or op, with ERR_INVAL (a flag's fault: exit 2).
 * Owns nothing: it writes m->lm_plan, lm_auto, lm_ban and reads the bound weights.
 */
#include "model/model_impl.h"

#include <limits.h>
#include <string.h>

/* ---- the lm_head's selection ----------------------------------------------------- */

/* The banned backends (model_opts.banned_backends) on m->ops, but "lm_head:NAME", which
 * with the gemm family's bans keep the lm_head's fallbacks off NAME; then the lm_head's own
 * backend or plan (model_opts.lm_head_backend; "auto" or none: the gemm family's). */
int mdl_lm_select(model *m, const dev_info *d, const model_opts *o, ls_err *e) {
    buf ops_b, lm_b;
    buf_init(&ops_b);
    buf_init(&lm_b);
    for (const char *p = o->banned_backends; p && *p;) {
        size_t len = strcspn(p, ",");
        if (len > 8 && !strncmp(p, "lm_head:", 8))
            buf_printf(&lm_b, "%sgemm:%.*s", lm_b.len ? "," : "", (int)len - 8, p + 8);
        else
            buf_printf(&ops_b, "%s%.*s", ops_b.len ? "," : "", (int)len, p);
        p += len + (p[len] == ',');
    }
    int rc = ops_b.len ? ops_sel_ban(&m->ops, ops_b.data, e) : 0;
    ops_sel t;
    memset(&t, 0, sizeof t);
    t.n_ban[OPS_FAM_GEMM] = m->ops.n_ban[OPS_FAM_GEMM];
    memcpy(t.ban[OPS_FAM_GEMM], m->ops.ban[OPS_FAM_GEMM], sizeof t.ban[0]);
    if (!rc && lm_b.len) rc = ops_sel_ban(&t, lm_b.data, e);
    m->n_lm_ban = t.n_ban[OPS_FAM_GEMM];
    memcpy(m->lm_ban, t.ban[OPS_FAM_GEMM], sizeof m->lm_ban);
    buf_free(&ops_b);
    buf_free(&lm_b);
    const char *lm = o->lm_head_backend;
    m->lm_plan.n = 0;
    m->lm_auto = (o->auto_families & MODEL_AUTO_LM_HEAD) != 0;
    if (rc || !lm || !*lm || !strcmp(lm, "auto")) return rc;
    if ((rc = ops_plan_parse(OPS_FAM_GEMM, d, lm, &m->lm_plan, e))) return err_prefix(e, "--lm-head-backend");
    return 0;
}

const ops_sel *mdl_lm_ops(const model *m, ops_sel *tmp) {
    if (!m->lm_plan.n) return &m->ops;
    *tmp = m->ops; /* the stream, device, capture state and the other families as they are now */
    tmp->gemm = m->lm_plan.impl[0];
    tmp->plan[OPS_FAM_GEMM] = m->lm_plan;
    if (m->lm_plan.n == 1) tmp->plan[OPS_FAM_GEMM].n = 0; /* one backend: no plan, as ops_select has it */
    tmp->auto_fam = (tmp->auto_fam & ~(1u << OPS_FAM_GEMM)) | (m->lm_auto ? 1u << OPS_FAM_GEMM : 0u);
    tmp->n_ban[OPS_FAM_GEMM] = m->n_lm_ban;
    memcpy(tmp->ban[OPS_FAM_GEMM], m->lm_ban, sizeof tmp->ban[0]);
    return tmp;
}

/* ---- backends named on the command line ------------------------------------------ */

/* Refuse, at open, a backend named on the command line that cannot run one of the
 * model's shapes (ops_sel_check_*): a named family never falls back, so it would fail
 * the first request that reaches the shape (e.g. a decode step). Under tensor
 * parallelism the ranks' sliced shapes are the ones that run. The error names the flag,
 * the plan as given, the layer and the tensor or op. */
static const char *const k_backend_flag[OPS_N_FAM] = {"--gemm-backend", "--fp4-gemm-backend",
                                                      "--moe-runner-backend", "--attention-backend",
                                                      "--gdn-backend"};

static int named_fault(const ops_sel *ops, int fam, const char *flag, int layer, ls_err *e) {
    char plan[256];
    const void *one = fam == OPS_FAM_GEMM ? (const void *)ops->gemm : fam == OPS_FAM_FP4_GEMM ? (const void *)ops->fp4_gemm
                    : fam == OPS_FAM_MOE ? (const void *)ops->moe : fam == OPS_FAM_ATTN ? (const void *)ops->attn
                    : (const void *)ops->gdn;
    ops_plan single = {.n = 1, .max_m = {INT_MAX}, .impl = {one}};
    ops_plan_format(ops->plan[fam].n ? &ops->plan[fam] : &single, plan, sizeof plan);
    if (!flag) flag = k_backend_flag[fam];
    if (layer >= 0) err_prefix(e, "%s %s: layer %d", flag, plan, layer);
    else err_prefix(e, "%s %s", flag, plan);
    e->code = ERR_INVAL; /* a flag's fault: exit 2 */
    return ERR_INVAL;
}

/* flag: NULL = the family's own (the lm_head passes --lm-head-backend when it has its own plan) */
static int check_lin(const ops_sel *ops, const lin_w *w, const char *flag, int layer, ls_err *e) {
    if (!w->data) return 0;
    int rc = ops_sel_check_linear(ops, w, e);
    return rc ? named_fault(ops, w->kind == W_NVFP4 ? OPS_FAM_FP4_GEMM : OPS_FAM_GEMM, flag, layer, e) : 0;
}

int mdl_check_named_backends(const model *m, ls_err *e) {
    const model *r = m->rank_m ? m->rank_m[0] : m;
    const model_config *c = &r->cfg;
    /* the lm_head with its own plan when it has one (mdl_lm_ops; rank 0 computes the logits) */
    ops_sel lm_tmp;
    const ops_sel *lo = mdl_lm_ops(r, &lm_tmp);
    int rc = check_lin(lo, &m->lm_head, r->lm_plan.n ? "--lm-head-backend" : NULL, -1, e);
    if (rc || (r->ops.auto_fam & 31u) == 31u) return rc;
    for (int l = 0; !rc && l < c->n_layers; l++) {
        const layer_w *L = &r->layers[l];
        if (L->type == LAYER_FULL_ATTN) {
            const attn_layer_w *a = &L->attn;
            const lin_w *ws[5] = {&a->q, &a->gate, &a->k, &a->v, &a->o};
            for (int i = 0; !rc && i < 5; i++) rc = check_lin(&r->ops, ws[i], NULL, l, e);
            attn_shape sh = {.n_tok = 1, .n_seq = 1, .max_ctx = 1, .n_heads = c->n_heads,
                             .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim,
                             .gated = c->attn_output_gate, .dt = r->ops.act};
            if (!rc && (rc = ops_sel_check_attn(&r->ops, &sh, e))) rc = named_fault(&r->ops, OPS_FAM_ATTN, NULL, l, e);
        } else {
            const gdn_layer_w *g = &L->gdn;
            const lin_w *ws[5] = {&g->qkv, &g->z, &g->b, &g->a, &g->out};
            for (int i = 0; !rc && i < 5; i++) rc = check_lin(&r->ops, ws[i], NULL, l, e);
            gdn_shape sh = {.n_tok = 1, .n_seq = 1, .nk = g->g.nk, .nv = g->g.nv, .dk = g->g.dk, .dv = g->g.dv,
                            .conv_k = g->g.conv_k, .dt = r->ops.act, .state_bf16 = c->state_bf16};
            if (!rc && (rc = ops_sel_check_gdn(&r->ops, &sh, e))) rc = named_fault(&r->ops, OPS_FAM_GDN, NULL, l, e);
        }
        if (rc) break;
        if (L->dense) {
            const lin_w *ws[3] = {&L->mlp.gate, &L->mlp.up, &L->mlp.down};
            for (int i = 0; !rc && i < 3; i++) rc = check_lin(&r->ops, ws[i], NULL, l, e);
        } else if ((rc = ops_sel_check_moe(&r->ops, &L->moe, e))) {
            rc = named_fault(&r->ops, OPS_FAM_MOE, NULL, l, e);
        }
    }
    return rc;
}
