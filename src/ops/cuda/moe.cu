/* moe.cu: the moe family on CUDA (reference/qwen35-and-nvfp4.md 2.5):
 *   p = softmax(x·W_routerᵀ) over E (fp32), top-k (ties: lower index), renormalised
 *   y = Σ_j w_j · down_e(silu(gate_e(x)) · up_e(x)) + sigmoid(x·w_sg) · shared(x)
 * x, y BF16 [M, H]; router and shared-expert gate BF16; experts NVFP4 or BF16.
 *
 * Backends, two different algorithms:
 *   cuda_fused_decode  M <= 8, NVFP4 experts, 3 launches, no host round trip:
 *                      (1) router GEMV (warp per expert row, every token) whose
 *                      last block to finish (atomic ticket) does softmax, top-k
 *                      and the shared gate, a warp per token; (2) gate+up: a
 *                      block per (token, chosen expert or shared, 16 rows), the
 *                      NVFP4 rows decoded in registers into mma.sync m16n8k16 (the
 *                      token in column 0), SiLU·up stored fp32; (3) down: a block
 *                      per (token, 16 output rows) sums every chosen expert and
 *                      the shared one, the combine weight · scale2 folded into
 *                      the B operand. The expert pointer tables (30 KB for
 *                      E = 512) live in device memory, cached per layer and
 *                      uploaded only when they change (passing them as 20 KB
 *                      kernel parameters cost ~20 us per call on the H200).
 *   cuda_expert_loop   any M: router through cuBLASLt (fp32 logits), top-k
 *                      kernel, one device->host copy of the choices, tokens
 *                      sorted by expert and gathered, then per expert the
 *                      fp4_gemm backends (cuda_w4a16_mma for <= 64 rows, else
 *                      cuda_dequant_cublas; cuBLASLt for BF16 experts), SiLU·up,
 *                      and one combine kernel (no atomics: each output row sums
 *                      its own k rows).
 * Workspace: per device, grown on first use (moe calls on one device are
 * serialised by its mutex).
 */
#include "ops/cuda/cu_util.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { MOE_MAXE = 512, MOE_MAXK = 16, FUSED_MAXM = 8, MOE_MAX_DEV = 16 };

/* ---- per-device workspace ------------------------------------------------------ */

enum { WS_LOGITS, WS_IDX, WS_WTS, WS_TICKET, WS_H, WS_PERM, WS_POS, WS_XS, WS_G, WS_U, WS_Y, WS_GS,
       WS_US, WS_S, WS_N };

typedef struct fused_tables fused_tables;

/* The fused path's expert tables in device memory, cached per moe_w (a layer):
 * rebuilt on the host each call (cheap), uploaded only when they changed. */
enum { TAB_CACHE = 128 };
typedef struct tab_entry {
    const moe_w *key;
    fused_tables *host, *dev;
} tab_entry;

typedef struct moe_ws {
    fused_tables *scratch;
    tab_entry tabs[TAB_CACHE];
    int next_tab;
    void *p[WS_N];
    size_t cap[WS_N];
    pthread_mutex_t mu;
    int init;
    int32_t *h_idx, *h_perm, *h_pos; /* host scratch */
    size_t h_cap;
} moe_ws;

static moe_ws g_ws[MOE_MAX_DEV];
static pthread_mutex_t g_ws_mu = PTHREAD_MUTEX_INITIALIZER;

static int ws_lock(moe_ws **out, ls_err *e) {
    int dev = 0;
    CU_TRY(e, cudaGetDevice(&dev), "cudaGetDevice");
    if (dev < 0 || dev >= MOE_MAX_DEV) return errf(e, ERR_UNSUPPORTED, "moe: device %d out of range", dev);
    pthread_mutex_lock(&g_ws_mu);
    if (!g_ws[dev].init) {
        pthread_mutex_init(&g_ws[dev].mu, NULL);
        g_ws[dev].init = 1;
    }
    pthread_mutex_unlock(&g_ws_mu);
    pthread_mutex_lock(&g_ws[dev].mu);
    *out = &g_ws[dev];
    return 0;
}

/* Device buffer `slot` of at least n bytes (zeroed when (re)allocated). */
static void *ws_get(moe_ws *w, int slot, size_t n, ls_err *e) {
    if (n == 0) n = 16;
    if (w->cap[slot] >= n) return w->p[slot];
    if (w->p[slot]) {
        cudaDeviceSynchronize(); /* it may still be in use by queued work */
        cudaFree(w->p[slot]);
    }
    w->p[slot] = NULL;
    w->cap[slot] = 0;
    cudaError_t c = cudaMalloc(&w->p[slot], n);
    if (c != cudaSuccess) {
        cu_fail(e, c, "moe workspace");
        return NULL;
    }
    cudaMemset(w->p[slot], 0, n);
    w->cap[slot] = n;
    return w->p[slot];
}

/* ---- checks ----------------------------------------------------------------------- */

static int moe_common_supported(const dev_info *d, const moe_shape *s, char *why, size_t n) {
    if (d->kind != DEV_CUDA) {
        snprintf(why, n, "needs a CUDA device");
        return 0;
    }
    if (s->dt != ACT_BF16) {
        snprintf(why, n, "activations must be BF16");
        return 0;
    }
    if (s->top_k < 1 || s->top_k > MOE_MAXK || s->top_k > s->E) {
        snprintf(why, n, "top_k %d outside 1..%d", s->top_k, MOE_MAXK);
        return 0;
    }
    if (s->E > 1024) {
        snprintf(why, n, "more than 1024 experts (%d)", s->E);
        return 0;
    }
    return 1;
}

static int moe_check_w(const moe_args *a, ls_err *e) {
    const moe_w *w = a->w;
    if (a->dt != ACT_BF16) return errf(e, ERR_UNSUPPORTED, "moe on CUDA: activations must be BF16");
    if (w->router.kind != W_BF16)
        return errf(e, ERR_UNSUPPORTED, "moe on CUDA: router weight must be BF16, got %s", w_kind_name(w->router.kind));
    if (w->has_sh_gate && w->sh_gate_w.kind != W_BF16)
        return errf(e, ERR_UNSUPPORTED, "moe on CUDA: shared_expert_gate must be BF16");
    if (w->top_k < 1 || w->top_k > MOE_MAXK || w->top_k > w->n_experts)
        return errf(e, ERR_INVAL, "moe: top_k %d of %d experts", w->top_k, w->n_experts);
    if (w->n_experts > 1024) return errf(e, ERR_UNSUPPORTED, "moe on CUDA: %d experts > 1024", w->n_experts);
    if (w->hidden % 8) return errf(e, ERR_UNSUPPORTED, "moe on CUDA: hidden %d not a multiple of 8", w->hidden);
    return 0;
}

/* ---- warp helpers ----------------------------------------------------------------- */

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* bf16x2 word -> two floats */
__device__ __forceinline__ float2 bf2_to_f2(uint32_t w) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

__device__ __forceinline__ float dot_bf16_row(const bf16 *a, const bf16 *b, int H, int lane) {
    float s = 0.f;
#pragma unroll 4
    for (int k = lane * 8; k < H; k += 256) {
        uint4 va = *reinterpret_cast<const uint4 *>(a + k), vb = *reinterpret_cast<const uint4 *>(b + k);
        const uint32_t xa[4] = {va.x, va.y, va.z, va.w}, xb[4] = {vb.x, vb.y, vb.z, vb.w};
#pragma unroll
        for (int q = 0; q < 4; q++) {
            float2 p = bf2_to_f2(xa[q]), r = bf2_to_f2(xb[q]);
            s = fmaf(p.x, r.x, s);
            s = fmaf(p.y, r.y, s);
        }
    }
    return warp_sum(s);
}

/* Softmax over logits[E], top-k (largest logit first, ties to the lower index),
 * renormalised if norm; the shared gate sigmoid(sgl) or sigmoid(x·wsg) (1
 * without a gate, 0 without a shared expert) into wts[k]. One warp. */
__device__ void warp_topk(const float *logits, int E, int k, int norm, const float *sgl, const bf16 *x,
                          const bf16 *wsg, int H, int has_shared, int32_t *idx, float *wts) {
    const int lane = threadIdx.x & 31;
    float v[32];
#pragma unroll
    for (int i = 0; i < 32; i++) {
        int ex = lane + 32 * i;
        v[i] = ex < E ? __ldcg(logits + ex) : -INFINITY; /* written by other blocks: skip L1 */
    }
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < 32; i++) mx = fmaxf(mx, v[i]);
    mx = warp_max(mx);
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < 32; i++) sum += lane + 32 * i < E ? __expf(v[i] - mx) : 0.f;
    sum = warp_sum(sum);
    float psum = 0.f, pj[MOE_MAXK];
    int ij[MOE_MAXK];
    for (int j = 0; j < k; j++) {
        float bv = -INFINITY;
        int bi = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < 32; i++)
            if (v[i] > bv) { /* ascending index within a lane: strict > keeps the lower one */
                bv = v[i];
                bi = lane + 32 * i;
            }
#pragma unroll
        for (int o = 16; o; o >>= 1) {
            float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
#pragma unroll
        for (int i = 0; i < 32; i++)
            if (lane + 32 * i == bi) v[i] = -INFINITY;
        ij[j] = bi;
        pj[j] = __expf(bv - mx) / sum;
        psum += pj[j];
    }
    float sg = has_shared ? 1.f : 0.f;
    if (has_shared && sgl) sg = 1.f / (1.f + __expf(-__ldcg(sgl)));
    else if (has_shared && wsg) sg = 1.f / (1.f + __expf(-dot_bf16_row(x, wsg, H, lane)));
    if (lane == 0) {
        for (int j = 0; j < k; j++) {
            idx[j] = ij[j];
            wts[j] = norm ? pj[j] / psum : pj[j];
        }
        wts[k] = sg;
    }
}

/* ---- cuda_fused_decode ------------------------------------------------------------- */

/* Launch 1: logits [M, E] = x·Wrᵀ (warp per expert row; one more warp computes
 * the shared-expert gate's logit x·wsg into sgl [M]), then the last block does
 * top-k for every token (warp per token). */
__global__ void __launch_bounds__(128) moe_router_topk_kernel(int M, int H, int E, int k, int norm,
                                                              const bf16 *__restrict__ x,
                                                              const bf16 *__restrict__ wr,
                                                              const bf16 *__restrict__ wsg, int has_shared,
                                                              float *logits, float *sgl, int32_t *idx,
                                                              float *wts, unsigned *ticket) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int ex = blockIdx.x * 4 + warp;
    if (ex < E || (ex == E && wsg)) {
        float acc[FUSED_MAXM];
#pragma unroll
        for (int m = 0; m < FUSED_MAXM; m++) acc[m] = 0.f;
        const bf16 *row = ex < E ? wr + (size_t)ex * H : wsg;
        /* 8 loads of 16 B in flight per lane before the first use */
        for (int k0 = lane * 8; k0 < H; k0 += 256 * 8) {
            uint4 vw[8];
#pragma unroll
            for (int c = 0; c < 8; c++)
                if (k0 + 256 * c < H) vw[c] = cu_ld_stream16(row + k0 + 256 * c);
#pragma unroll
            for (int c = 0; c < 8; c++) {
                const int kk = k0 + 256 * c;
                if (kk >= H) break;
                const uint32_t ww[4] = {vw[c].x, vw[c].y, vw[c].z, vw[c].w};
#pragma unroll
                for (int m = 0; m < FUSED_MAXM; m++) {
                    if (m >= M) break;
                    uint4 vx = __ldg(reinterpret_cast<const uint4 *>(x + (size_t)m * H + kk));
                    const uint32_t xx[4] = {vx.x, vx.y, vx.z, vx.w};
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        float2 a = bf2_to_f2(ww[q]), b = bf2_to_f2(xx[q]);
                        acc[m] = fmaf(a.x, b.x, acc[m]);
                        acc[m] = fmaf(a.y, b.y, acc[m]);
                    }
                }
            }
        }
#pragma unroll
        for (int m = 0; m < FUSED_MAXM; m++) {
            if (m >= M) break;
            float s = warp_sum(acc[m]);
            if (lane == 0) {
                if (ex < E) logits[m * E + ex] = s;
                else sgl[m] = s;
            }
        }
    }
    __threadfence();
    __syncthreads();
    __shared__ unsigned last;
    if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int m = warp; m < M; m += 4)
        warp_topk(logits + m * E, E, k, norm, wsg ? sgl + m : NULL, x + (size_t)m * H, wsg, H, has_shared,
                  idx + m * k, wts + m * (k + 1));
    if (threadIdx.x == 0) *ticket = 0;
}

typedef struct gu_params {
    const uint8_t *gw[MOE_MAXE], *uw[MOE_MAXE];
    const uint8_t *gs[MOE_MAXE], *us[MOE_MAXE];
    float g2[MOE_MAXE], u2[MOE_MAXE];
    const uint8_t *sgw, *suw, *sgs, *sus;
    float sg2, su2;
} gu_params;

typedef struct dn_params {
    const uint8_t *dw[MOE_MAXE];
    const uint8_t *ds[MOE_MAXE];
    float d2[MOE_MAXE];
    const uint8_t *sdw, *sds;
    float sd2;
} dn_params;

struct fused_tables {
    gu_params gu;
    dn_params dn;
};

/* Decode 16 B of codes + their two block scales into 16 bf16x2 (A fragments). */
__device__ __forceinline__ void decode16(uint4 v, uint16_t s, uint32_t out[16]) {
    uint32_t sa = cu_scale_bf16x2(s & 0xff), sb = cu_scale_bf16x2(s >> 8);
    const uint32_t q[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        cu_e2m1x8_to_bf16x8(q[i], &out[4 * i]);
#pragma unroll
        for (int r = 0; r < 4; r++) out[4 * i + r] = cu_bf16x2_mul(out[4 * i + r], i < 2 ? sa : sb);
    }
}

/* Launch 2: block (16 rows, slot s = m·(k+1) + j): h[s, rows] = silu(gate)·up, fp32. */
__global__ void __launch_bounds__(256) moe_gateup_kernel(const gu_params *__restrict__ P, int M, int H,
                                                         int I, int Is, int k, const bf16 *__restrict__ x,
                                                         const int32_t *__restrict__ idx, float *hws,
                                                         int ldh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int s = blockIdx.y, m = s / (k + 1), j = s % (k + 1);
    const int n0 = blockIdx.x * 16;
    const uint8_t *gw, *uw, *gs, *us;
    float g2, u2;
    int rows;
    if (j < k) {
        int ex = idx[m * k + j];
        gw = P->gw[ex]; uw = P->uw[ex]; gs = P->gs[ex]; us = P->us[ex]; g2 = P->g2[ex]; u2 = P->u2[ex];
        rows = I;
    } else {
        gw = P->sgw; uw = P->suw; gs = P->sgs; us = P->sus; g2 = P->sg2; u2 = P->su2;
        rows = Is;
    }
    if (n0 >= rows) return;
    const int nchunks = H / 128, per = (nchunks + 7) / 8;
    const int cb = warp * per, ce = min(nchunks, cb + per);
    const size_t rb = (size_t)(n0 + g) * (H / 2) + 16 * t, sb = (size_t)(n0 + g) * (H / 16) + 2 * t;
    const size_t r8 = (size_t)8 * (H / 2), s8 = (size_t)8 * (H / 16);
    const bf16 *xm = x + (size_t)m * H;
    float ag[4] = {0, 0, 0, 0}, au[4] = {0, 0, 0, 0};
    for (int c = cb; c < ce; c += 2) {
        uint4 wv[2][4];
        uint16_t sv[2][4];
#pragma unroll
        for (int u = 0; u < 2; u++)
            if (c + u < ce) {
                size_t o = (size_t)(c + u) * 64, os = (size_t)(c + u) * 8;
                wv[u][0] = cu_ld_stream16(gw + rb + o);
                wv[u][1] = cu_ld_stream16(gw + rb + r8 + o);
                wv[u][2] = cu_ld_stream16(uw + rb + o);
                wv[u][3] = cu_ld_stream16(uw + rb + r8 + o);
                sv[u][0] = __ldg(reinterpret_cast<const uint16_t *>(gs + sb + os));
                sv[u][1] = __ldg(reinterpret_cast<const uint16_t *>(gs + sb + s8 + os));
                sv[u][2] = __ldg(reinterpret_cast<const uint16_t *>(us + sb + os));
                sv[u][3] = __ldg(reinterpret_cast<const uint16_t *>(us + sb + s8 + os));
            }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            if (c + u >= ce) break;
            uint32_t b[16];
            if (g == 0) {
                const uint4 *xp = reinterpret_cast<const uint4 *>(xm + (c + u) * 128 + 32 * t);
#pragma unroll
                for (int v = 0; v < 4; v++) {
                    uint4 xv = __ldg(xp + v);
                    b[4 * v] = xv.x; b[4 * v + 1] = xv.y; b[4 * v + 2] = xv.z; b[4 * v + 3] = xv.w;
                }
            } else {
#pragma unroll
                for (int v = 0; v < 16; v++) b[v] = 0u;
            }
            uint32_t a0[16], a1[16];
            decode16(wv[u][0], sv[u][0], a0);
            decode16(wv[u][1], sv[u][1], a1);
#pragma unroll
            for (int q = 0; q < 8; q++) {
                const uint32_t af[4] = {a0[2 * q], a1[2 * q], a0[2 * q + 1], a1[2 * q + 1]};
                cu_mma_bf16_16816(ag, af, b[2 * q], b[2 * q + 1]);
            }
            decode16(wv[u][2], sv[u][2], a0);
            decode16(wv[u][3], sv[u][3], a1);
#pragma unroll
            for (int q = 0; q < 8; q++) {
                const uint32_t af[4] = {a0[2 * q], a1[2 * q], a0[2 * q + 1], a1[2 * q + 1]};
                cu_mma_bf16_16816(au, af, b[2 * q], b[2 * q + 1]);
            }
        }
    }
    /* column 0 (the token) lives in lanes with t == 0: c0 = row g, c2 = row g + 8 */
    __shared__ float red[8][2][16];
    if (t == 0) {
        red[warp][0][g] = ag[0];
        red[warp][0][g + 8] = ag[2];
        red[warp][1][g] = au[0];
        red[warp][1][g + 8] = au[2];
    }
    __syncthreads();
    if (threadIdx.x < 16) {
        float gv = 0.f, uv = 0.f;
#pragma unroll
        for (int w = 0; w < 8; w++) {
            gv += red[w][0][threadIdx.x];
            uv += red[w][1][threadIdx.x];
        }
        gv *= g2;
        uv *= u2;
        hws[(size_t)s * ldh + n0 + threadIdx.x] = gv / (1.f + __expf(-gv)) * uv;
    }
}

/* Launch 3: block (16 output rows, token m): y = Σ_j coef_j · down_j(h_j). */
__global__ void __launch_bounds__(256) moe_down_kernel(const dn_params *__restrict__ P, int M, int H, int I,
                                                       int Is, int k, const int32_t *__restrict__ idx,
                                                       const float *__restrict__ wts,
                                                       const float *__restrict__ hws, int ldh,
                                                       bf16 *__restrict__ y) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int m = blockIdx.y, n0 = blockIdx.x * 16;
    const int cpe = I / 128, cps = Is / 128;
    const int npairs = k * cpe + cps;
    float acc[4] = {0, 0, 0, 0};
    for (int p0 = warp; p0 < npairs; p0 += 8 * 4) {
        uint4 wv[4][2];
        uint16_t sv[4][2];
        float coef[4];
        int hrow[4], kx[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int p = p0 + 8 * u;
            if (p >= npairs) break;
            const uint8_t *w, *sc;
            int K, c, j;
            float s2;
            if (p < k * cpe) {
                j = p / cpe;
                c = p % cpe;
                int ex = idx[m * k + j];
                w = P->dw[ex]; sc = P->ds[ex]; s2 = P->d2[ex]; K = I;
            } else {
                j = k;
                c = p - k * cpe;
                w = P->sdw; sc = P->sds; s2 = P->sd2; K = Is;
            }
            coef[u] = wts[m * (k + 1) + j] * s2;
            hrow[u] = m * (k + 1) + j;
            kx[u] = c * 128 + 32 * t;
            size_t rb = (size_t)(n0 + g) * (K / 2) + (size_t)c * 64 + 16 * t;
            size_t sbb = (size_t)(n0 + g) * (K / 16) + (size_t)c * 8 + 2 * t;
            wv[u][0] = cu_ld_stream16(w + rb);
            wv[u][1] = cu_ld_stream16(w + rb + (size_t)8 * (K / 2));
            sv[u][0] = __ldg(reinterpret_cast<const uint16_t *>(sc + sbb));
            sv[u][1] = __ldg(reinterpret_cast<const uint16_t *>(sc + sbb + (size_t)8 * (K / 16)));
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            if (p0 + 8 * u >= npairs) break;
            uint32_t b[16];
            if (g == 0) {
                const float4 *hp = reinterpret_cast<const float4 *>(hws + (size_t)hrow[u] * ldh + kx[u]);
#pragma unroll
                for (int v = 0; v < 8; v++) {
                    float4 f = hp[v];
                    __nv_bfloat162 lo = __floats2bfloat162_rn(f.x * coef[u], f.y * coef[u]);
                    __nv_bfloat162 hi = __floats2bfloat162_rn(f.z * coef[u], f.w * coef[u]);
                    b[2 * v] = *reinterpret_cast<uint32_t *>(&lo);
                    b[2 * v + 1] = *reinterpret_cast<uint32_t *>(&hi);
                }
            } else {
#pragma unroll
                for (int v = 0; v < 16; v++) b[v] = 0u;
            }
            uint32_t a0[16], a1[16];
            decode16(wv[u][0], sv[u][0], a0);
            decode16(wv[u][1], sv[u][1], a1);
#pragma unroll
            for (int q = 0; q < 8; q++) {
                const uint32_t af[4] = {a0[2 * q], a1[2 * q], a0[2 * q + 1], a1[2 * q + 1]};
                cu_mma_bf16_16816(acc, af, b[2 * q], b[2 * q + 1]);
            }
        }
    }
    __shared__ float red[8][16];
    if (t == 0) {
        red[warp][g] = acc[0];
        red[warp][g + 8] = acc[2];
    }
    __syncthreads();
    if (threadIdx.x < 16) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < 8; w++) v += red[w][threadIdx.x];
        y[(size_t)m * H + n0 + threadIdx.x] = __float2bfloat16_rn(v);
    }
}

static int fused_supported(const dev_info *d, const moe_shape *s, char *why, size_t n) {
    if (!moe_common_supported(d, s, why, n)) return 0;
    if (s->M > FUSED_MAXM) {
        snprintf(why, n, "the fused decode path takes M <= %d (M=%d)", FUSED_MAXM, s->M);
        return 0;
    }
    if (s->wk != W_NVFP4) {
        snprintf(why, n, "needs NVFP4 experts");
        return 0;
    }
    if (s->E > MOE_MAXE || s->H % 128 || s->I % 128 || s->Is % 128) {
        snprintf(why, n, "needs E <= %d and H, I, shared I multiples of 128 (E=%d H=%d I=%d Is=%d)", MOE_MAXE,
                 s->E, s->H, s->I, s->Is);
        return 0;
    }
    return 1;
}

static int fused_run(const moe_args *a, ls_stream s, ls_err *e) {
    int rc = moe_check_w(a, e);
    if (rc) return rc;
    const moe_w *w = a->w;
    const int M = a->M, H = w->hidden, E = w->n_experts, k = w->top_k, I = w->inter,
              Is = w->shared_inter > 0 ? w->shared_inter : 0;
    if (M <= 0) return 0;
    if (M > FUSED_MAXM || E > MOE_MAXE || H % 128 || I % 128 || Is % 128)
        return errf(e, ERR_UNSUPPORTED, "cuda_fused_decode: needs M <= %d, E <= %d, H/I multiples of 128",
                    FUSED_MAXM, MOE_MAXE);
    moe_ws *ws;
    if ((rc = ws_lock(&ws, e))) return rc;
    if (!ws->scratch) ws->scratch = (fused_tables *)xcalloc(1, sizeof(fused_tables));
    gu_params &gp = ws->scratch->gu;
    dn_params &dp = ws->scratch->dn;
    for (int x = 0; x < E; x++) {
        const lin_w *gl = &w->gate[x], *ul = &w->up[x], *dl = &w->down[x];
        if (gl->kind != W_NVFP4 || ul->kind != W_NVFP4 || dl->kind != W_NVFP4) {
            pthread_mutex_unlock(&ws->mu);
            return errf(e, ERR_UNSUPPORTED, "cuda_fused_decode: expert %d is not NVFP4", x);
        }
        gp.gw[x] = (const uint8_t *)gl->data; gp.gs[x] = gl->scale; gp.g2[x] = gl->scale2;
        gp.uw[x] = (const uint8_t *)ul->data; gp.us[x] = ul->scale; gp.u2[x] = ul->scale2;
        dp.dw[x] = (const uint8_t *)dl->data; dp.ds[x] = dl->scale; dp.d2[x] = dl->scale2;
    }
    if (Is) {
        if (w->sh_gate.kind != W_NVFP4 || w->sh_up.kind != W_NVFP4 || w->sh_down.kind != W_NVFP4) {
            pthread_mutex_unlock(&ws->mu);
            return errf(e, ERR_UNSUPPORTED, "cuda_fused_decode: shared expert is not NVFP4");
        }
        gp.sgw = (const uint8_t *)w->sh_gate.data; gp.sgs = w->sh_gate.scale; gp.sg2 = w->sh_gate.scale2;
        gp.suw = (const uint8_t *)w->sh_up.data; gp.sus = w->sh_up.scale; gp.su2 = w->sh_up.scale2;
        dp.sdw = (const uint8_t *)w->sh_down.data; dp.sds = w->sh_down.scale; dp.sd2 = w->sh_down.scale2;
    }
    tab_entry *te = NULL;
    for (int i = 0; i < TAB_CACHE; i++)
        if (ws->tabs[i].key == w) te = &ws->tabs[i];
    if (!te || memcmp(te->host, ws->scratch, sizeof(fused_tables))) {
        if (!te) {
            te = &ws->tabs[ws->next_tab];
            ws->next_tab = (ws->next_tab + 1) % TAB_CACHE;
        }
        if (!te->host) {
            te->host = (fused_tables *)xmalloc(sizeof(fused_tables));
            cudaError_t c = cudaMalloc(&te->dev, sizeof(fused_tables));
            if (c != cudaSuccess) {
                free(te->host);
                te->host = NULL;
                te->dev = NULL;
                pthread_mutex_unlock(&ws->mu);
                return cu_fail(e, c, "cuda_fused_decode tables");
            }
        }
        te->key = w;
        memcpy(te->host, ws->scratch, sizeof(fused_tables));
        /* from pageable memory: the stream's earlier work (readers of the old table) completes first */
        cudaError_t c = cudaMemcpyAsync(te->dev, te->host, sizeof(fused_tables), cudaMemcpyHostToDevice,
                                        (cudaStream_t)s);
        if (c != cudaSuccess) {
            te->key = NULL;
            pthread_mutex_unlock(&ws->mu);
            return cu_fail(e, c, "cuda_fused_decode tables");
        }
    }
    const gu_params *dgp = &te->dev->gu;
    const dn_params *ddp = &te->dev->dn;
    const int ldh = I > Is ? I : Is;
    float *logits = (float *)ws_get(ws, WS_LOGITS, sizeof(float) * FUSED_MAXM * 1024, e);
    int32_t *idx = (int32_t *)ws_get(ws, WS_IDX, sizeof(int32_t) * FUSED_MAXM * MOE_MAXK, e);
    float *wts = (float *)ws_get(ws, WS_WTS, sizeof(float) * FUSED_MAXM * (MOE_MAXK + 1), e);
    unsigned *ticket = (unsigned *)ws_get(ws, WS_TICKET, 64, e);
    float *hws = (float *)ws_get(ws, WS_H, sizeof(float) * FUSED_MAXM * (MOE_MAXK + 1) * ldh, e);
    if (!logits || !idx || !wts || !ticket || !hws) {
        pthread_mutex_unlock(&ws->mu);
        return e->code ? e->code : ERR_NOMEM;
    }
    cudaStream_t st = (cudaStream_t)s;
    moe_router_topk_kernel<<<(E + 1 + 3) / 4, 128, 0, st>>>(M, H, E, k, w->norm_topk, (const bf16 *)a->x,
                                                        (const bf16 *)w->router.data,
                                                        w->has_sh_gate ? (const bf16 *)w->sh_gate_w.data : NULL,
                                                        Is > 0, logits, logits + FUSED_MAXM * MOE_MAXE, idx, wts,
                                                        ticket);
    cudaError_t c = cudaGetLastError();
    if (c == cudaSuccess) {
        dim3 g2d(ldh / 16, M * (k + 1));
        moe_gateup_kernel<<<g2d, 256, 0, st>>>(dgp, M, H, I, Is, k, (const bf16 *)a->x, idx, hws, ldh);
        c = cudaGetLastError();
    }
    if (c == cudaSuccess) {
        dim3 g3d(H / 16, M);
        moe_down_kernel<<<g3d, 256, 0, st>>>(ddp, M, H, I, Is, k, idx, wts, hws, ldh, (bf16 *)a->y);
        c = cudaGetLastError();
    }
    if (c == cudaSuccess && (a->topk_idx || a->topk_w)) {
        /* optional outputs: device copies of the choices */
        if (a->topk_idx) c = cudaMemcpyAsync(a->topk_idx, idx, sizeof(int32_t) * M * k, cudaMemcpyDeviceToDevice, st);
        if (c == cudaSuccess && a->topk_w)
            c = cudaMemcpy2DAsync(a->topk_w, sizeof(float) * k, wts, sizeof(float) * (k + 1), sizeof(float) * k, M,
                                  cudaMemcpyDeviceToDevice, st);
    }
    pthread_mutex_unlock(&ws->mu);
    if (c != cudaSuccess) return cu_fail(e, c, "moe cuda_fused_decode");
    return 0;
}

/* graph_safe: no host round trip; its tables are uploaded on the first call per layer (up to
 * TAB_CACHE layers per device) and its buffers have fixed sizes, so after a warm-up call a
 * capture records kernels only */
const moe_impl moe_cuda_fused_decode = {"cuda_fused_decode", DEV_CUDA, 0, fused_supported, fused_run, 1};

/* ---- cuda_expert_loop ------------------------------------------------------------- */

__global__ void moe_topk_kernel(int M, int H, int E, int k, int norm, const bf16 *__restrict__ x,
                                const bf16 *__restrict__ wsg, int has_shared, const float *__restrict__ logits,
                                int32_t *idx, float *wts) {
    int m = blockIdx.x;
    warp_topk(logits + (size_t)m * E, E, k, norm, NULL, x + (size_t)m * H, wsg, H, has_shared, idx + (size_t)m * k,
              wts + (size_t)m * (k + 1));
}

/* xs[i] = x[perm[i]], rows of H bf16 */
__global__ void moe_gather_kernel(int n, int H, const bf16 *__restrict__ x, const int32_t *__restrict__ perm,
                                  bf16 *__restrict__ xs) {
    int i = blockIdx.x;
    const uint4 *src = reinterpret_cast<const uint4 *>(x + (size_t)perm[i] * H);
    uint4 *dst = reinterpret_cast<uint4 *>(xs + (size_t)i * H);
    for (int v = threadIdx.x; v < H / 8; v += blockDim.x) dst[v] = src[v];
}

/* g = silu(g) · u, bf16, computed in fp32 */
__global__ void moe_silu_mul_kernel(size_t n, bf16 *g, const bf16 *__restrict__ u) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float a = __bfloat162float(g[i]), b = __bfloat162float(u[i]);
    g[i] = __float2bfloat16_rn(a / (1.f + __expf(-a)) * b);
}

/* y[m] = Σ_j wts[m,j] · Y[pos[m,j]] + wts[m,k] · S[m] (S may be NULL) */
__global__ void moe_combine_kernel(int M, int H, int k, const float *__restrict__ wts,
                                   const int32_t *__restrict__ pos, const bf16 *__restrict__ Y,
                                   const bf16 *__restrict__ S, bf16 *__restrict__ y) {
    int m = blockIdx.x;
    for (int h = threadIdx.x; h < H; h += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < k; j++)
            acc += wts[(size_t)m * (k + 1) + j] * __bfloat162float(Y[(size_t)pos[(size_t)m * k + j] * H + h]);
        if (S) acc += wts[(size_t)m * (k + 1) + k] * __bfloat162float(S[(size_t)m * H + h]);
        y[(size_t)m * H + h] = __float2bfloat16_rn(acc);
    }
}

/* y[rows, N] = x[rows, K]·Wᵀ through the fp4_gemm / gemm backends */
static int lin_run(const lin_w *w, int rows, const void *x, void *y, cudaStream_t st, ls_err *e) {
    gemm_args a = {.M = rows, .x = x, .w = w, .y = y, .accumulate = 0, .dt = ACT_BF16};
    if (w->kind == W_BF16) return gemm_cuda_cublaslt.run(&a, st, e);
    if (w->kind != W_NVFP4) return errf(e, ERR_UNSUPPORTED, "cuda_expert_loop: %s expert weights", w_kind_name(w->kind));
    if (rows <= 64 && w->K % 128 == 0 && w->N % 16 == 0 && !((uintptr_t)w->scale & 1))
        return fp4_gemm_cuda_w4a16_mma.run(&a, st, e);
    if (w->K % 32 == 0) return fp4_gemm_cuda_dequant_cublas.run(&a, st, e);
    return fp4_gemm_cuda_ref.run(&a, st, e);
}

static int loop_supported(const dev_info *d, const moe_shape *s, char *why, size_t n) {
    if (!moe_common_supported(d, s, why, n)) return 0;
    if (s->wk != W_NVFP4 && s->wk != W_BF16) {
        snprintf(why, n, "experts must be NVFP4 or BF16");
        return 0;
    }
    return 1;
}

static int loop_run_locked(moe_ws *ws, const moe_args *a, cudaStream_t st, ls_err *e) {
    const moe_w *w = a->w;
    const int M = a->M, H = w->hidden, E = w->n_experts, k = w->top_k, I = w->inter,
              Is = w->shared_inter > 0 ? w->shared_inter : 0;
    const size_t Mk = (size_t)M * k;
    float *logits = (float *)ws_get(ws, WS_LOGITS, sizeof(float) * M * E, e);
    int32_t *idx = (int32_t *)ws_get(ws, WS_IDX, sizeof(int32_t) * Mk, e);
    float *wts = (float *)ws_get(ws, WS_WTS, sizeof(float) * M * (k + 1), e);
    int32_t *perm = (int32_t *)ws_get(ws, WS_PERM, sizeof(int32_t) * Mk, e);
    int32_t *pos = (int32_t *)ws_get(ws, WS_POS, sizeof(int32_t) * Mk, e);
    bf16 *xs = (bf16 *)ws_get(ws, WS_XS, sizeof(bf16) * Mk * H, e);
    bf16 *G = (bf16 *)ws_get(ws, WS_G, sizeof(bf16) * Mk * I, e);
    bf16 *U = (bf16 *)ws_get(ws, WS_U, sizeof(bf16) * Mk * I, e);
    bf16 *Y = (bf16 *)ws_get(ws, WS_Y, sizeof(bf16) * Mk * H, e);
    if (!logits || !idx || !wts || !perm || !pos || !xs || !G || !U || !Y) return e->code ? e->code : ERR_NOMEM;
    bf16 *Gs = NULL, *Us = NULL, *S = NULL;
    if (Is) {
        Gs = (bf16 *)ws_get(ws, WS_GS, sizeof(bf16) * M * Is, e);
        Us = (bf16 *)ws_get(ws, WS_US, sizeof(bf16) * M * Is, e);
        S = (bf16 *)ws_get(ws, WS_S, sizeof(bf16) * M * H, e);
        if (!Gs || !Us || !S) return e->code ? e->code : ERR_NOMEM;
    }
    int rc = cu_lt_gemm(M, E, H, w->router.data, a->x, logits, 1, 1.f, 0.f, st, e);
    if (rc) return err_prefix(e, "cuda_expert_loop router");
    moe_topk_kernel<<<M, 32, 0, st>>>(M, H, E, k, w->norm_topk, (const bf16 *)a->x,
                                      w->has_sh_gate ? (const bf16 *)w->sh_gate_w.data : NULL, Is > 0, logits,
                                      idx, wts);
    CU_LAUNCHED(e, "cuda_expert_loop top-k");
    /* the shared expert does not depend on the routing: queue it before the host waits */
    if (Is) {
        if ((rc = lin_run(&w->sh_gate, M, a->x, Gs, st, e)) || (rc = lin_run(&w->sh_up, M, a->x, Us, st, e)))
            return rc;
        size_t n = (size_t)M * Is;
        moe_silu_mul_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(n, Gs, Us);
        CU_LAUNCHED(e, "cuda_expert_loop shared silu");
        if ((rc = lin_run(&w->sh_down, M, Gs, S, st, e))) return rc;
    }
    if (ws->h_cap < Mk) {
        free(ws->h_idx); free(ws->h_perm); free(ws->h_pos);
        ws->h_idx = (int32_t *)xmalloc(sizeof(int32_t) * Mk);
        ws->h_perm = (int32_t *)xmalloc(sizeof(int32_t) * Mk);
        ws->h_pos = (int32_t *)xmalloc(sizeof(int32_t) * Mk);
        ws->h_cap = Mk;
    }
    CU_TRY(e, cudaMemcpyAsync(ws->h_idx, idx, sizeof(int32_t) * Mk, cudaMemcpyDeviceToHost, st), "top-k to host");
    CU_TRY(e, cudaStreamSynchronize(st), "cuda_expert_loop routing");
    /* counting sort of (token, j) entries by expert */
    int *cnt = (int *)xcalloc(E + 1, sizeof(int));
    for (size_t i = 0; i < Mk; i++) {
        int ex = ws->h_idx[i];
        if (ex < 0 || ex >= E) {
            free(cnt);
            return errf(e, ERR_RUNTIME, "cuda_expert_loop: top-k returned expert %d of %d", ex, E);
        }
        cnt[ex + 1]++;
    }
    for (int x = 0; x < E; x++) cnt[x + 1] += cnt[x];
    int *fill = (int *)xmalloc(sizeof(int) * E);
    memcpy(fill, cnt, sizeof(int) * E);
    for (size_t i = 0; i < Mk; i++) {
        int ex = ws->h_idx[i], at = fill[ex]++;
        ws->h_perm[at] = (int32_t)(i / k);
        ws->h_pos[i] = at;
    }
    free(fill);
    cudaError_t c = cudaMemcpyAsync(perm, ws->h_perm, sizeof(int32_t) * Mk, cudaMemcpyHostToDevice, st);
    if (c == cudaSuccess) c = cudaMemcpyAsync(pos, ws->h_pos, sizeof(int32_t) * Mk, cudaMemcpyHostToDevice, st);
    if (c == cudaSuccess) c = cudaStreamSynchronize(st); /* the host arrays are reused next call */
    if (c != cudaSuccess) {
        free(cnt);
        return cu_fail(e, c, "cuda_expert_loop: token order to device");
    }
    moe_gather_kernel<<<(unsigned)Mk, 128, 0, st>>>((int)Mk, H, (const bf16 *)a->x, perm, xs);
    c = cudaGetLastError();
    for (int x = 0; c == cudaSuccess && !rc && x < E; x++) {
        int n = cnt[x + 1] - cnt[x];
        if (!n) continue;
        size_t off = cnt[x];
        rc = lin_run(&w->gate[x], n, xs + off * H, G + off * I, st, e);
        if (!rc) rc = lin_run(&w->up[x], n, xs + off * H, U + off * I, st, e);
    }
    if (c == cudaSuccess && !rc) {
        size_t n = Mk * I;
        moe_silu_mul_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(n, G, U);
        c = cudaGetLastError();
    }
    for (int x = 0; c == cudaSuccess && !rc && x < E; x++) {
        int n = cnt[x + 1] - cnt[x];
        if (!n) continue;
        size_t off = cnt[x];
        rc = lin_run(&w->down[x], n, G + off * I, Y + off * H, st, e);
    }
    free(cnt);
    if (rc) return err_prefix(e, "cuda_expert_loop");
    if (c == cudaSuccess) {
        moe_combine_kernel<<<M, 256, 0, st>>>(M, H, k, wts, pos, Y, S, (bf16 *)a->y);
        c = cudaGetLastError();
    }
    if (c == cudaSuccess && a->topk_idx)
        c = cudaMemcpyAsync(a->topk_idx, idx, sizeof(int32_t) * Mk, cudaMemcpyDeviceToDevice, st);
    if (c == cudaSuccess && a->topk_w)
        c = cudaMemcpy2DAsync(a->topk_w, sizeof(float) * k, wts, sizeof(float) * (k + 1), sizeof(float) * k, M,
                              cudaMemcpyDeviceToDevice, st);
    if (c != cudaSuccess) return cu_fail(e, c, "moe cuda_expert_loop");
    return 0;
}

static int loop_run(const moe_args *a, ls_stream s, ls_err *e) {
    int rc = moe_check_w(a, e);
    if (rc || a->M <= 0) return rc;
    moe_ws *ws;
    if ((rc = ws_lock(&ws, e))) return rc;
    rc = loop_run_locked(ws, a, (cudaStream_t)s, e);
    pthread_mutex_unlock(&ws->mu);
    return rc;
}

const moe_impl moe_cuda_expert_loop = {"cuda_expert_loop", DEV_CUDA, 0, loop_supported, loop_run};
