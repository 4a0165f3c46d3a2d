/* moe_int.cuh: what the moe family's CUDA files share (never included from C):
 * moe.cu (cuda_expert_loop), moe_fused.cu (cuda_fused_decode), moe_grouped.cu and
 * moe_mid.cu (cuda_grouped_gemm). The size limits, the shape and weight checks, warp
 * helpers, and the routing of one token (softmax over E, top-k, renormalisation, the
 * shared expert's sigmoid gate) as the body of a block of TOPK_W warps, moe_topk_block
 * (each file wraps it in its own kernel): static or inline, each file compiles its own
 * copy. Last, cuda_grouped_gemm's expert table and the launchers of its mid-batch path,
 * defined in moe_mid.cu and called by moe_grouped.cu.
 */
#ifndef LS_MOE_INT_CUH
#define LS_MOE_INT_CUH

#include "ops/cuda/cu_util.h"
#include "ops/cuda/cu_ws.h"

#include <stdlib.h>
#include <string.h>

enum { MOE_MAXE = 512, MOE_MAXK = 16, TOPK_W = 16 };

/* ---- checks ----------------------------------------------------------------------- */

static inline int moe_common_supported(const dev_info *d, const moe_shape *s, char *why, size_t n) {
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

static inline int moe_check_w(const moe_args *a, ls_err *e) {
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

/* s + the dot product of 8 BF16 pairs (16 bytes each), fmaf in element order */
__device__ __forceinline__ float dot_bf16x8(uint4 va, uint4 vb, float s) {
    const uint32_t xa[4] = {va.x, va.y, va.z, va.w}, xb[4] = {vb.x, vb.y, vb.z, vb.w};
#pragma unroll
    for (int q = 0; q < 4; q++) {
        float2 p = bf2_to_f2(xa[q]), r = bf2_to_f2(xb[q]);
        s = fmaf(p.x, r.x, s);
        s = fmaf(p.y, r.y, s);
    }
    return s;
}

__device__ __forceinline__ float dot_bf16_row(const bf16 *a, const bf16 *b, int H, int lane) {
    float s = 0.f;
#pragma unroll 4
    for (int k = lane * 8; k < H; k += 256)
        s = dot_bf16x8(*reinterpret_cast<const uint4 *>(a + k), *reinterpret_cast<const uint4 *>(b + k), s);
    return warp_sum(s);
}

/* fp32 <-> an unsigned key with the same order (for redux.sync max / min) */
__device__ __forceinline__ unsigned f2key(float f) {
    unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key2f(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

/* The routing of token m, the body of a block of TOPK_W warps (E <= 64·TOPK_W):
 * softmax over E, top-k, renormalisation, the shared gate; writes idx [M, k] and
 * wts [M, k + 1] (the last column: the shared expert's sigmoid gate, 1 without a
 * gate, 0 without a shared expert; from its logit sgl[m] when sgl is set, else
 * x·wsg here). Phase 1: warp w takes experts 64w .. 64w + 63 (two per lane) and
 * picks its own top-k, k rounds of two redux.sync (largest order-preserving key,
 * then the lowest index holding it); warps without experts skip it. Phase 2: each
 * of the nw·k candidates, one per thread, counts the candidates that beat it
 * (rank by counting, no dependent rounds), compared as packed 64-bit keys (key <<
 * 32 | ~index: larger is better under (logit desc, index asc), one shared load
 * and one compare each). The global top-k is inside the union of the warps'
 * top-k. History (Nsight Compute, H200, E = 512, k = 10): one warp doing all of
 * it cost 9 us of dependent instructions on one SM, phase 2 as k redux rounds on
 * warp 0 7.8 us, ranks by counting over unpacked (key, index) pairs 5.8 us, packed
 * 5.2 us (bench/RESULTS.md). The logits and sgl are read through L2 (ld.cg). */
__device__ __forceinline__ void moe_topk_block(int m, int H, int E, int k, int norm, const bf16 *__restrict__ x,
                                               const bf16 *__restrict__ wsg, int has_shared,
                                               const float *__restrict__ logits, const float *__restrict__ sgl,
                                               int32_t *idx, float *wts) {
    __shared__ unsigned long long cp[TOPK_W * MOE_MAXK]; /* candidate w·k + j */
    __shared__ float rmax[TOPK_W], rsum[TOPK_W];
    __shared__ int rk_i[MOE_MAXK];
    __shared__ float rk_p[MOE_MAXK];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float *L = logits + (size_t)m * E;
    const int e0 = warp * 64 + lane, e1 = e0 + 32;
    const float a = e0 < E ? __ldcg(L + e0) : -INFINITY, b = e1 < E ? __ldcg(L + e1) : -INFINITY;
    /* the shared gate's logit, fetched with the logits (warp 0 needs it last) */
    const float sgv = has_shared && sgl && warp == 0 ? __ldcg(sgl + m) : 0.f;
    /* softmax denominator over all E */
    float mx = warp_max(fmaxf(a, b));
    if (lane == 0) rmax[warp] = mx;
    __syncthreads();
    mx = rmax[0];
#pragma unroll
    for (int w = 1; w < TOPK_W; w++) mx = fmaxf(mx, rmax[w]);
    float sm = warp_sum((e0 < E ? __expf(a - mx) : 0.f) + (e1 < E ? __expf(b - mx) : 0.f));
    if (lane == 0) rsum[warp] = sm;
    /* phase 1: this warp's top-k of its 64 */
    const unsigned ka = e0 < E ? f2key(a) : 0u, kb = e1 < E ? f2key(b) : 0u;
    bool ta = false, tb = false;
    const int nw = (E + 63) / 64; /* warps that have experts */
    for (int j = 0; j < (warp >= nw ? 0 : k); j++) {
        /* this lane's best untaken: a (lower index) unless b is strictly larger */
        const unsigned ua = ta ? 0u : ka, ub = tb ? 0u : kb;
        const unsigned kl = ub > ua ? ub : ua;
        const unsigned il = ub > ua ? (unsigned)e1 : (unsigned)e0;
        const unsigned kmax = __reduce_max_sync(0xffffffffu, kl);
        const unsigned win = __reduce_min_sync(0xffffffffu, kl == kmax ? il : 0xffffffffu);
        if (win == (unsigned)e0) ta = true;
        if (win == (unsigned)e1) tb = true;
        if (lane == 0) cp[warp * k + j] = (unsigned long long)kmax << 32 | (unsigned)~win;
    }
    __syncthreads();
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < TOPK_W; w++) sum += rsum[w];
    /* phase 2: candidate c = (warp w, pick j), one per thread; its rank is the number
     * of candidates before it. Empty picks (key 0, a warp with fewer than k experts)
     * rank after every real one; real candidates are distinct experts, so ranks
     * 0..k-1 are unique. */
    if (threadIdx.x < nw * k) {
        const unsigned long long me = cp[threadIdx.x];
        int rank = 0;
#pragma unroll 8
        for (int i = 0; i < nw * k; i++) rank += cp[i] > me;
        const unsigned key = (unsigned)(me >> 32);
        if (rank < k && key) {
            rk_i[rank] = (int)~(unsigned)me;
            rk_p[rank] = __expf(key2f(key) - mx) / sum;
        }
    }
    __syncthreads();
    if (warp) return;
    float psum = 0.f;
    for (int j = 0; j < k; j++) psum += rk_p[j]; /* descending p, as the reference sums */
    float sg = has_shared ? 1.f : 0.f;
    if (has_shared && sgl) sg = 1.f / (1.f + __expf(-sgv));
    else if (has_shared && wsg) sg = 1.f / (1.f + __expf(-dot_bf16_row(x + (size_t)m * H, wsg, H, lane)));
    if (lane < k) {
        idx[(size_t)m * k + lane] = rk_i[lane];
        wts[(size_t)m * (k + 1) + lane] = norm ? rk_p[lane] / psum : rk_p[lane];
    }
    if (lane == 0) wts[(size_t)m * (k + 1) + k] = sg;
}

/* ---- cuda_grouped_gemm: moe_grouped.cu and its mid-batch path, moe_mid.cu ---------- */

/* One expert's weights for the kernels; entry E is the shared expert. */
typedef struct mg_expert {
    const uint8_t *w[3]; /* gate [I, H/2], up [I, H/2], down [H, I/2] E2M1 codes */
    const uint8_t *s[3]; /* E4M3 block scales [I, H/16], [I, H/16], [H, I/16] */
    float s2[3];         /* weight_scale_2 of gate, up, down */
    int inter;           /* I of this expert (rows of gate/up, K of down) */
} mg_expert;

/* The mid-batch launchers (moe_mid.cu, where each is described). Arguments as
 * mg_gemm_kernel's: tab [E + 1] on the device, the plan's tile_e [tiles], perm [tiles·16],
 * nt [2] (all tiles, routed tiles), x [M, H], hbuf [R, ldh], wts [M, k + 1], dbuf
 * [M·(k + 1), H]; sh_only: the shared expert's tiles nt[1] .. only. */
typedef struct mv_cfg {
    int kw, per, rt;
} mv_cfg;
/* mv_kernel's instance for K of the gate/up (gateup) or down GEMM, {0} when none */
mv_cfg mv_pick(bool gateup, int K);
template <bool GATEUP>
cudaError_t mv_launch(int K, int n_out, int tiles_max, const mg_expert *tab, const int32_t *tile_e,
                      const int32_t *perm, const int32_t *nt, int H, int k, const bf16 *x, bf16 *hbuf, int ldh,
                      const float *wts, bf16 *dbuf, int sh_only, int alt, int pdl, cudaStream_t st);
/* mvd_kernel's PER for K, 0 when there is no instance */
int mvd_per(int K);
cudaError_t mvd_launch(int K, int tiles_max, const mg_expert *tab, const int32_t *tile_e, const int32_t *perm,
                       const int32_t *nt, int H, int k, const bf16 *x, bf16 *hbuf, int ldh, const float *wts,
                       bf16 *dbuf, int pdl, cudaStream_t st);
/* mvb_kernel's PER for K, 0 when there is no instance */
int mvb_per(int K);
template <bool GATEUP>
cudaError_t mvb_launch(int K, int n_out, int sh_tiles, const mg_expert *tab, const int32_t *tile_e,
                       const int32_t *perm, const int32_t *nt, int H, int k, const bf16 *x, bf16 *hbuf, int ldh,
                       const float *wts, bf16 *dbuf, int dm, cudaStream_t st);
/* the router logits [M, E] fp32 by mr_kernel; 0 = no instance fits (not launched), else 1
 * with the launch's status in *c. pdl: 0 a plain launch, 1 with PDL releasing the next kernel
 * before its wait, 2 with PDL releasing it after the wait */
int mr_launch(int M, int H, int E, const bf16 *w, const bf16 *x, float *logits, int pdl, cudaStream_t st,
              cudaError_t *c);

#endif
