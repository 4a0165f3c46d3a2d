/* ref_small.c: the CPU reference small ops: RMSNorm (plain w·x̂ and
 * zero-centred (1+w)·x̂), gated RMSNorm (w·x̂·silu(z)), NeoX RoPE on the first
 * rot_dim dims of each head (alone, or after the q/k head norm), embedding
 * lookup, SiLU-mul, residual add (alone, or fused with the following RMSNorm),
 * the KV-page writes, the row gather. x̂ = x·rsqrt(mean(x²) + eps), all in fp32.
 */
#include "ops/cpu/cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- RMSNorm ------------------------------------------------------------- */

typedef struct norm_ctx {
    int cols;
    const float *x, *z, *w;
    float *y;
    rms_kind kind;
    float eps;
} norm_ctx;

static float rms_scale(const float *x, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    return 1.0f / sqrtf((float)(ss / n) + eps);
}

static void norm_rows(void *p, int64_t r0, int64_t r1) {
    const norm_ctx *c = p;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = c->x + r * c->cols;
        float *y = c->y + r * c->cols;
        float s = rms_scale(x, c->cols, c->eps);
        for (int i = 0; i < c->cols; i++) {
            float xh = x[i] * s;
            y[i] = c->kind == RMS_ZC ? xh * (1.0f + c->w[i]) : c->w[i] * xh;
        }
    }
}

static void norm_gated_rows(void *p, int64_t r0, int64_t r1) {
    const norm_ctx *c = p;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = c->x + r * c->cols, *z = c->z + r * c->cols;
        float *y = c->y + r * c->cols;
        float s = rms_scale(x, c->cols, c->eps);
        for (int i = 0; i < c->cols; i++) y[i] = c->w[i] * (x[i] * s) * cpu_silu(z[i]);
    }
}

static int64_t row_chunk(int cols) { return cols >= 4096 ? 1 : 4096 / cols; }

static int ref_rmsnorm(int rows, int cols, const void *x, const float *w, rms_kind kind, float eps,
                       void *y, act_dtype dt, ls_stream s) {
    if (dt != ACT_F32) return ERR_UNSUPPORTED;
    norm_ctx c = {cols, x, NULL, w, y, kind, eps};
    pool_for(rows, row_chunk(cols), norm_rows, &c);
    return 0;
}

static int ref_rmsnorm_gated(int rows, int cols, const void *x, const void *z, const float *w,
                             float eps, void *y, act_dtype dt, ls_stream s) {
    if (dt != ACT_F32) return ERR_UNSUPPORTED;
    norm_ctx c = {cols, x, z, w, y, RMS_PLAIN, eps};
    pool_for(rows, row_chunk(cols), norm_gated_rows, &c);
    return 0;
}

/* ---- RoPE ---------------------------------------------------------------- */

static int ref_rope(int n_tok, int n_heads, int head_dim, int rot_dim, const int32_t *pos,
                    double theta, void *xv, act_dtype dt, ls_stream s) {
    if (dt != ACT_F32) return ERR_UNSUPPORTED;
    float *x = xv;
    const int half = rot_dim / 2;
    float *cs = xmalloc(sizeof(float) * half * 2);
    for (int t = 0; t < n_tok; t++) {
        /* transformers: inv_freq_i = theta^(-2i/rot_dim) in fp32, angle = pos · inv_freq */
        for (int i = 0; i < half; i++) {
            float inv = (float)(1.0 / pow(theta, (double)(2 * i) / rot_dim));
            float ang = (float)pos[t] * inv;
            cs[i] = cosf(ang);
            cs[half + i] = sinf(ang);
        }
        for (int h = 0; h < n_heads; h++) {
            float *v = x + ((size_t)t * n_heads + h) * head_dim;
            for (int i = 0; i < half; i++) {
                /* x·cos + rotate_half(x)·sin, rotate_half(x) = [-x2, x1] */
                float a = v[i], b = v[i + half];
                v[i] = a * cs[i] - b * cs[half + i];
                v[i + half] = b * cs[i] + a * cs[half + i];
            }
        }
    }
    free(cs);
    return 0;
}

/* ---- embedding, elementwise --------------------------------------------- */

static int ref_embed(int n, const int32_t *ids, const lin_w *table, void *y, act_dtype dt,
                     ls_stream s) {
    if (dt != ACT_F32 || table->kind == W_NVFP4) return ERR_UNSUPPORTED;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= table->N) return ERR_INVAL;
        lin_row_f32(table, ids[i], (float *)y + (size_t)i * table->K);
    }
    return 0;
}

static int ref_silu_mul(int64_t n, const void *g, const void *u, void *y, act_dtype dt,
                        ls_stream s) {
    if (dt != ACT_F32) return ERR_UNSUPPORTED;
    const float *gf = g, *uf = u;
    float *yf = y;
    for (int64_t i = 0; i < n; i++) yf[i] = cpu_silu(gf[i]) * uf[i];
    return 0;
}

static int ref_add(int64_t n, const void *x, void *y, act_dtype dt, ls_stream s) {
    if (dt != ACT_F32) return ERR_UNSUPPORTED;
    const float *xf = x;
    float *yf = y;
    for (int64_t i = 0; i < n; i++) yf[i] += xf[i];
    return 0;
}

/* h (+)= x, then y = norm(h): the same arithmetic as add followed by rmsnorm. */
static int ref_add_rmsnorm(int rows, int cols, float *h, const void *x, int init, const float *w,
                           rms_kind kind, float eps, void *y, act_dtype dt, ls_stream s) {
    if (dt != ACT_F32) return ERR_UNSUPPORTED;
    const size_t n = (size_t)rows * cols;
    const float *xf = x;
    if (init)
        memcpy(h, xf, sizeof(float) * n);
    else
        for (size_t i = 0; i < n; i++) h[i] += xf[i];
    return ref_rmsnorm(rows, cols, h, w, kind, eps, y, dt, s);
}

static int ref_qk_norm_rope(int n_tok, int n_heads, int head_dim, void *x, const float *w,
                            rms_kind kind, float eps, int rot_dim, const int32_t *pos, double theta,
                            act_dtype dt, ls_stream s) {
    int rc = ref_rmsnorm(n_tok * n_heads, head_dim, x, w, kind, eps, x, dt, s);
    return rc ? rc : ref_rope(n_tok, n_heads, head_dim, rot_dim, pos, theta, x, dt, s);
}

static int ref_kv_write(const kv_layer *kv, int n_seq, const attn_seq *seqs, int n_kv_heads,
                        int head_dim, const void *k, const void *v, act_dtype dt, ls_stream s) {
    if (dt != ACT_F32 || kv->dt != ACT_F32) return ERR_UNSUPPORTED;
    const size_t row = (size_t)n_kv_heads * head_dim;
    for (int q = 0; q < n_seq; q++) {
        const attn_seq *sq = &seqs[q];
        for (int i = 0; i < sq->n_new; i++) {
            int p = sq->n_past + i;
            int32_t page = sq->pages[p / kv->page_size];
            if (page < 0 || page >= kv->n_pages) return ERR_INVAL;
            size_t off = ((size_t)page * kv->page_size + p % kv->page_size) * row;
            memcpy((float *)kv->k + off, (const float *)k + (size_t)(sq->row0 + i) * row, row * 4);
            memcpy((float *)kv->v + off, (const float *)v + (size_t)(sq->row0 + i) * row, row * 4);
        }
    }
    return 0;
}

static int ref_gather_rows(int n, int cols, const int32_t *idx, const void *x, void *y,
                           act_dtype dt, ls_stream s) {
    if (dt != ACT_F32) return ERR_UNSUPPORTED;
    for (int i = 0; i < n; i++)
        memcpy((float *)y + (size_t)i * cols, (const float *)x + (size_t)idx[i] * cols,
               sizeof(float) * cols);
    return 0;
}

const small_ops small_cpu_ref = {
    .name = "cpu_ref",
    .dev = DEV_CPU,
    .rmsnorm = ref_rmsnorm,
    .rmsnorm_gated = ref_rmsnorm_gated,
    .rope = ref_rope,
    .embed = ref_embed,
    .silu_mul = ref_silu_mul,
    .add = ref_add,
    .kv_write = ref_kv_write,
    .gather_rows = ref_gather_rows,
    .add_rmsnorm = ref_add_rmsnorm,
    .qk_norm_rope = ref_qk_norm_rope,
};
