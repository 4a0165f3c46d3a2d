/* ref_linear.c: the CPU reference gemm and fp4_gemm (y = x·Wᵀ).
 *
 * W row n is converted (BF16/F16) or dequantised (NVFP4:
 * E2M1(code)·fp8(scale[n, k/16])·scale2, low nibble first) to fp32 once, then
 * dotted with every activation row. Threads split the N rows.
 */
#include "ops/cpu/cpu.h"

#include <stdlib.h>
#include <string.h>

int cpu_supports_dt(act_dtype dt, char *why, size_t n) {
    if (dt == ACT_F32) return 1;
    if (why) snprintf(why, n, "CPU backends take fp32 activations, not %s", act_name(dt));
    return 0;
}

typedef struct gemm_ctx {
    int M;
    const float *x; /* [M, K] */
    const lin_w *w; /* [N, K] */
    float *y;       /* [M, N] */
    int accumulate;
} gemm_ctx;

static void gemm_rows(void *p, int64_t n0, int64_t n1) {
    const gemm_ctx *c = p;
    const int K = c->w->K, N = c->w->N;
    float *row = xmalloc(sizeof(float) * K);
    for (int64_t n = n0; n < n1; n++) {
        lin_row_f32(c->w, (int)n, row);
        for (int m = 0; m < c->M; m++) {
            float d = cpu_dot(c->x + (size_t)m * K, row, K);
            float *o = c->y + (size_t)m * N + n;
            *o = c->accumulate ? *o + d : d;
        }
    }
    free(row);
}

void cpu_gemm_f32(int M, const float *x, const lin_w *w, float *y, int accumulate) {
    if (M <= 0) return;
    gemm_ctx c = {M, x, w, y, accumulate};
    /* chunks of >= 64K multiply-adds keep the pool overhead small */
    int64_t per = (int64_t)M * w->K;
    int64_t chunk = per >= 65536 ? 1 : 65536 / (per ? per : 1);
    pool_for(w->N, chunk, gemm_rows, &c);
}

static int check_args(const gemm_args *a, int nvfp4, ls_err *e) {
    const lin_w *w = a->w;
    if (a->dt != ACT_F32)
        return errf(e, ERR_UNSUPPORTED, "cpu_ref: activations must be f32, got %s", act_name(a->dt));
    if ((w->kind == W_NVFP4) != nvfp4)
        return errf(e, ERR_INVAL, "%s: weight %s is %s", nvfp4 ? "fp4_gemm" : "gemm",
                    w->name ? w->name : "?", w_kind_name(w->kind));
    if (nvfp4 && w->K % 16)
        return errf(e, ERR_INVAL, "fp4_gemm: K=%d of %s is not a multiple of 16", w->K,
                    w->name ? w->name : "?");
    return 0;
}

static int gemm_supported(const dev_info *d, const gemm_shape *s, char *why, size_t n) {
    if (d->kind != DEV_CPU) { if (why) snprintf(why, n, "CPU backend"); return 0; }
    if (s->wk == W_NVFP4) { if (why) snprintf(why, n, "NVFP4 weights go to fp4_gemm"); return 0; }
    return cpu_supports_dt(s->dt, why, n);
}

static int fp4_supported(const dev_info *d, const gemm_shape *s, char *why, size_t n) {
    if (d->kind != DEV_CPU) { if (why) snprintf(why, n, "CPU backend"); return 0; }
    if (s->wk != W_NVFP4) { if (why) snprintf(why, n, "weight is not NVFP4"); return 0; }
    if (s->K % 16) { if (why) snprintf(why, n, "K=%d not a multiple of 16", s->K); return 0; }
    return cpu_supports_dt(s->dt, why, n);
}

static int gemm_run(const gemm_args *a, ls_stream s, ls_err *e) {
    int rc = check_args(a, 0, e);
    if (rc) return rc;
    cpu_gemm_f32(a->M, a->x, a->w, a->y, a->accumulate);
    return 0;
}

static int fp4_run(const gemm_args *a, ls_stream s, ls_err *e) {
    int rc = check_args(a, 1, e);
    if (rc) return rc;
    cpu_gemm_f32(a->M, a->x, a->w, a->y, a->accumulate);
    return 0;
}

const gemm_impl gemm_cpu_ref = {"cpu_ref", DEV_CPU, 0, gemm_supported, gemm_run};
const fp4_gemm_impl fp4_gemm_cpu_ref = {"cpu_ref", DEV_CPU, 0, fp4_supported, fp4_run};
