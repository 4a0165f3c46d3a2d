/* moe_grouped.c: the "cpu_grouped" MoE backend: tokens grouped by expert.
 *
 * 1. router logits for all tokens in one gemm, then softmax/top-k/renorm
 *    per token (moe_route);
 * 2. the (token, weight) pairs sorted by expert (counting sort);
 * 3. per expert with rows: gather its tokens X_e [n_e, H], G = X_e·gateᵀ,
 *    U = X_e·upᵀ, Hh = silu(G)·U, D = Hh·downᵀ, scatter-add w·D;
 * 4. the shared expert as dense gemms over all tokens, scaled by
 *    sigmoid(x·w_sg).
 * Each expert's weight rows are dequantised once per call instead of once per
 * token, and the gemms (AVX2/FMA when the CPU has it) thread over the output rows, so decode
 * (M = 1) uses every core too. Routed contributions are summed in expert
 * order rather than top-k order; the result equals cpu_ref up to fp32
 * rounding.
 */
#include "ops/cpu/cpu.h"

#include <stdlib.h>
#include <string.h>

int moe_cpu_supported(const dev_info *d, const moe_shape *s, char *why, size_t n);
int moe_check_args(const moe_args *a, ls_err *e);

static int grouped_run(const moe_args *a, ls_stream s, ls_err *e) {
    int rc = moe_check_args(a, e);
    if (rc) return rc;
    const moe_w *w = a->w;
    const int M = a->M, H = w->hidden, E = w->n_experts, k = w->top_k, I = w->inter;
    const float *x = a->x;
    float *y = a->y;
    memset(y, 0, sizeof(float) * (size_t)M * H);
    if (M == 0) return 0;

    /* 1. route */
    float *logits = xmalloc(sizeof(float) * (size_t)M * E);
    cpu_gemm_fast_f32(M, x, &w->router, logits, 0);
    int32_t *idx = xmalloc(sizeof(int32_t) * (size_t)M * k);
    float *wt = xmalloc(sizeof(float) * (size_t)M * k);
    for (int m = 0; m < M; m++)
        moe_route(logits + (size_t)m * E, E, k, w->norm_topk, idx + (size_t)m * k, wt + (size_t)m * k);

    /* 2. group by expert: start[e] .. start[e+1] index into tok/tw */
    int *start = xcalloc(E + 1, sizeof(int));
    for (int i = 0; i < M * k; i++) start[idx[i] + 1]++;
    for (int e = 0; e < E; e++) start[e + 1] += start[e];
    int *fill = xmalloc(sizeof(int) * E), *tok = xmalloc(sizeof(int) * M * k);
    float *tw = xmalloc(sizeof(float) * M * k);
    memcpy(fill, start, sizeof(int) * E);
    for (int i = 0; i < M * k; i++) {
        int e = idx[i], at = fill[e]++;
        tok[at] = i / k;
        tw[at] = wt[i];
    }

    /* 3. one pass per expert over its rows */
    int Imax = I > w->shared_inter ? I : w->shared_inter;
    float *xe = xmalloc(sizeof(float) * (size_t)M * H);
    float *g = xmalloc(sizeof(float) * (size_t)M * Imax), *u = xmalloc(sizeof(float) * (size_t)M * Imax);
    float *d = xmalloc(sizeof(float) * (size_t)M * H);
    for (int e = 0; e < E; e++) {
        int n = start[e + 1] - start[e];
        if (!n) continue;
        for (int r = 0; r < n; r++)
            memcpy(xe + (size_t)r * H, x + (size_t)tok[start[e] + r] * H, sizeof(float) * H);
        cpu_gemm_fast_f32(n, xe, &w->gate[e], g, 0);
        cpu_gemm_fast_f32(n, xe, &w->up[e], u, 0);
        for (size_t i = 0; i < (size_t)n * I; i++) g[i] = cpu_silu(g[i]) * u[i];
        cpu_gemm_fast_f32(n, g, &w->down[e], d, 0);
        for (int r = 0; r < n; r++) {
            float *yr = y + (size_t)tok[start[e] + r] * H, sc = tw[start[e] + r];
            const float *dr = d + (size_t)r * H;
            for (int h = 0; h < H; h++) yr[h] += sc * dr[h];
        }
    }

    /* 4. shared expert */
    if (w->shared_inter > 0) {
        const int Is = w->shared_inter;
        float *sg = xmalloc(sizeof(float) * M);
        if (w->has_sh_gate) cpu_gemm_fast_f32(M, x, &w->sh_gate_w, sg, 0);
        cpu_gemm_fast_f32(M, x, &w->sh_gate, g, 0);
        cpu_gemm_fast_f32(M, x, &w->sh_up, u, 0);
        for (size_t i = 0; i < (size_t)M * Is; i++) g[i] = cpu_silu(g[i]) * u[i];
        cpu_gemm_fast_f32(M, g, &w->sh_down, d, 0);
        for (int m = 0; m < M; m++) {
            float sc = w->has_sh_gate ? cpu_sigmoid(sg[m]) : 1.0f;
            for (int h = 0; h < H; h++) y[(size_t)m * H + h] += sc * d[(size_t)m * H + h];
        }
        free(sg);
    }
    if (a->topk_idx) memcpy(a->topk_idx, idx, sizeof(int32_t) * M * k);
    if (a->topk_w) memcpy(a->topk_w, wt, sizeof(float) * M * k);
    free(logits); free(idx); free(wt); free(start); free(fill); free(tok); free(tw);
    free(xe); free(g); free(u); free(d);
    return 0;
}

const moe_impl moe_cpu_grouped = {"cpu_grouped", DEV_CPU, 0, moe_cpu_supported, grouped_run};
