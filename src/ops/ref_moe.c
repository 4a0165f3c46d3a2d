/* ref_moe.c: the CPU reference sparse-MoE block (reference section 2.5).
 *
 * For each token x (threads split the tokens):
 *   p        = softmax(x·W_routerᵀ) over all E experts (fp32)
 *   idx, w   = top-k of p, renormalised to sum 1 when norm_topk
 *   routed   = Σ_j w_j · down_e(silu(gate_e(x)) · up_e(x)),  e = idx_j
 *   shared   = down_s(silu(gate_s(x)) · up_s(x)),  scaled by sigmoid(x·w_sg)
 *   y        = routed + shared
 * Every weight row is dequantised on the fly (lin_row_f32), so the same code
 * serves BF16 and NVFP4 experts.
 */
#include "ops/cpu/cpu.h"

#include <stdlib.h>
#include <string.h>

/* y[N] = W·x for one token, W [N, K], row by row (row scratch [K]). */
static void matvec(const lin_w *w, const float *x, float *y, float *row) {
    for (int n = 0; n < w->N; n++) {
        lin_row_f32(w, n, row);
        y[n] = cpu_dot(x, row, w->K);
    }
}

/* out += scale · down(silu(gate(x)) · up(x)) */
static void expert_ffn(const lin_w *gate, const lin_w *up, const lin_w *down, const float *x,
                       float scale, float *out, float *g, float *u, float *row, float *tmp) {
    matvec(gate, x, g, row);
    matvec(up, x, u, row);
    for (int i = 0; i < gate->N; i++) g[i] = cpu_silu(g[i]) * u[i];
    matvec(down, g, tmp, row);
    for (int h = 0; h < down->N; h++) out[h] += scale * tmp[h];
}

typedef struct moe_ctx {
    const moe_args *a;
} moe_ctx;

static void moe_tokens(void *p, int64_t m0, int64_t m1) {
    const moe_args *a = ((const moe_ctx *)p)->a;
    const moe_w *w = a->w;
    const int H = w->hidden, E = w->n_experts, k = w->top_k;
    int I = w->inter > w->shared_inter ? w->inter : w->shared_inter;
    int R = H > I ? H : I; /* longest weight row */
    float *logits = xmalloc(sizeof(float) * E), *wt = xmalloc(sizeof(float) * k);
    int32_t *idx = xmalloc(sizeof(int32_t) * k);
    float *g = xmalloc(sizeof(float) * I), *u = xmalloc(sizeof(float) * I);
    float *row = xmalloc(sizeof(float) * R), *tmp = xmalloc(sizeof(float) * H);
    for (int64_t m = m0; m < m1; m++) {
        const float *x = (const float *)a->x + (size_t)m * H;
        float *y = (float *)a->y + (size_t)m * H;
        memset(y, 0, sizeof(float) * H);
        matvec(&w->router, x, logits, row);
        moe_route(logits, E, k, w->norm_topk, idx, wt);
        for (int j = 0; j < k; j++) {
            int e = idx[j];
            expert_ffn(&w->gate[e], &w->up[e], &w->down[e], x, wt[j], y, g, u, row, tmp);
        }
        if (w->shared_inter > 0) {
            float sg = 1.0f;
            if (w->has_sh_gate) {
                lin_row_f32(&w->sh_gate_w, 0, row);
                sg = cpu_sigmoid(cpu_dot(x, row, H));
            }
            expert_ffn(&w->sh_gate, &w->sh_up, &w->sh_down, x, sg, y, g, u, row, tmp);
        }
        if (a->topk_idx) memcpy(a->topk_idx + (size_t)m * k, idx, sizeof(int32_t) * k);
        if (a->topk_w) memcpy(a->topk_w + (size_t)m * k, wt, sizeof(float) * k);
    }
    free(logits); free(wt); free(idx); free(g); free(u); free(row); free(tmp);
}

int moe_cpu_supported(const dev_info *d, const moe_shape *s, char *why, size_t n) {
    if (d->kind != DEV_CPU) { if (why) snprintf(why, n, "CPU backend"); return 0; }
    return cpu_supports_dt(s->dt, why, n);
}

int moe_check_args(const moe_args *a, ls_err *e) {
    const moe_w *w = a->w;
    if (a->dt != ACT_F32) return errf(e, ERR_UNSUPPORTED, "moe: CPU backends take f32 activations");
    if (w->top_k < 1 || w->top_k > w->n_experts)
        return errf(e, ERR_INVAL, "moe: top_k %d of %d experts", w->top_k, w->n_experts);
    return 0;
}

static int ref_run(const moe_args *a, ls_stream s, ls_err *e) {
    int rc = moe_check_args(a, e);
    if (rc) return rc;
    moe_ctx c = {a};
    pool_for(a->M, 1, moe_tokens, &c);
    return 0;
}

const moe_impl moe_cpu_ref = {"cpu_ref", DEV_CPU, 0, moe_cpu_supported, ref_run};
