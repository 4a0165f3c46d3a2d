/* moe.cu: the moe family on CUDA (reference/qwen35-and-nvfp4.md 2.5):
 *   p = softmax(x·W_routerᵀ) over E (fp32), top-k (ties: lower index), renormalised
 *   y = Σ_j w_j · down_e(silu(gate_e(x)) · up_e(x)) + sigmoid(x·w_sg) · shared(x)
 * x, y BF16 [M, H]; router and shared-expert gate BF16; experts NVFP4 or BF16;
 * the shared expert NVFP4 or BF16 on its own (ModelOpt NVFP4 checkpoints may
 * exclude `*.mlp.shared_expert.*` from quantization, as synth does).
 *
 * Backends, two different algorithms:
 *   cuda_fused_decode  M <= 8, NVFP4 experts, 4 launches, no host round trip,
 *                      chained by programmatic dependent launch where that was
 *                      measured faster (see pdl_wait and the choice in fused_run):
 *                      (1) router GEMV (4 warps per expert row, x in shared
 *                      memory; one more row for the shared gate's logit);
 *                      (2) softmax, top-k and the shared gate, a block per
 *                      token (per-warp top-k by redux.sync, then every candidate
 *                      ranked by counting, packed 64-bit keys); (3) gate+up: a
 *                      block per (token, chosen expert or shared, 16 rows), the
 *                      NVFP4 rows decoded in registers into mma.sync m16n8k16,
 *                      then SiLU·up; (4) down: a block per (token, 16 output
 *                      rows) sums every chosen expert and the shared one with
 *                      the combine weight · scale2 folded in. Kernel pairs for
 *                      (3)+(4), chosen per shape from H200 runs (fused_run): the
 *                      register-staged pair (weights in registers, h in fp32,
 *                      token in column 0; M = 1 with a BF16 shared expert) and
 *                      the cp.async pair (fp4_gemm's streaming pipeline, h in
 *                      BF16 with the combine weight applied; the rest). Opt-in
 *                      for benchmarks: a persistent gate/up kernel (pairs 3, 4;
 *                      measured slower). At M = 1 the register pair decodes in
 *                      nvfp4.cuh's block-column form (scale blocks in the mma
 *                      columns; LASTSTAND_MOE_BC). The expert
 *                      pointer tables (30 KB for E = 512) live in device
 *                      memory, cached per layer and uploaded only when they
 *                      change (passing them as 20 KB kernel parameters cost
 *                      ~20 us per call on the H200). A BF16 shared expert
 *                      rides in the same launches: its blocks (gate/up) and
 *                      chunks (down, after the routed ones in the round robin)
 *                      stream BF16 rows, 8 weights per 16-byte load instead of
 *                      32, straight into the same mma fragments (the choice
 *                      is block- / warp-uniform; scale2 = 1).
 *   cuda_expert_loop   any M: router through cuBLASLt (fp32 logits), top-k
 *                      kernel, one device->host copy of the choices, tokens
 *                      sorted by expert and gathered, then per expert the
 *                      fp4_gemm backends (cuda_w4a16_mma for <= 64 rows, else
 *                      cuda_dequant_cublas; cuBLASLt for BF16 experts), SiLU·up,
 *                      and one combine kernel (no atomics: each output row sums
 *                      its own k rows).
 * Workspace: per device (cu_ws.h), grown on first use and kept on growth (a
 * captured graph's pointers stay valid); moe calls on one device are
 * serialised by its lock.
 */
#include "ops/cuda/cu_util.h"
#include "ops/cuda/cu_ws.h"
#include "ops/cuda/nvfp4.cuh"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { MOE_MAXE = 512, MOE_MAXK = 16, FUSED_MAXM = 8 };

/* ---- per-device workspace ------------------------------------------------------ */

enum { WS_LOGITS, WS_IDX, WS_WTS, WS_H, WS_PERM, WS_POS, WS_XS, WS_G, WS_U, WS_Y, WS_GS,
       WS_US, WS_S, WS_ZERO, WS_N };
static_assert((int)WS_N <= (int)CU_WS_SLOTS, "moe workspace slots");

typedef struct fused_tables fused_tables;

/* The fused path's expert tables in device memory, cached per moe_w (a layer):
 * rebuilt on the host each call (cheap), uploaded only when they changed. */
enum { TAB_CACHE = 128 };
typedef struct tab_entry {
    const moe_w *key;
    fused_tables *host, *dev;
} tab_entry;

typedef struct moe_ws {
    cu_ws ws; /* lock + the WS_* device buffers (cu_ws.h: kept on grow) */
    fused_tables *scratch;
    tab_entry tabs[TAB_CACHE];
    int next_tab;
    int32_t *h_idx, *h_perm, *h_pos; /* host scratch */
    size_t h_cap;
    int n_sm; /* multiprocessors of the device (0 until first needed) */
} moe_ws;

static moe_ws g_ws[CU_WS_MAX_DEV];

/* This device's workspace, locked (moe calls on one device are serialised). */
static int ws_lock(moe_ws **out, ls_err *e) {
    int dev = 0, rc = cu_ws_device("moe", &dev, e);
    if (rc) return rc;
    cu_ws_lock(&g_ws[dev].ws);
    *out = &g_ws[dev];
    return 0;
}
static void ws_unlock(moe_ws *w) { cu_ws_unlock(&w->ws); }

/* Device buffer `slot` of at least n bytes (zeroed when allocated). */
static void *ws_get(moe_ws *w, int slot, size_t n, cudaStream_t st, ls_err *e) {
    return cu_ws_get(&w->ws, slot, n, 1, st, "moe", e);
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

/* fp32 <-> an unsigned key with the same order (for redux.sync max / min) */
__device__ __forceinline__ unsigned f2key(float f) {
    unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key2f(unsigned k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}
/* Programmatic dependent launch (sm_90): with the launch attribute set, a kernel may
 * start while its predecessor in the stream still runs; pdl_wait blocks until the
 * predecessor grid completed with its memory visible, pdl_trigger lets the next
 * kernel launch. Without the attribute both are no-ops, so the kernels below call
 * them unconditionally. Every fused kernel calls pdl_wait before it reads what its
 * predecessor wrote. The gate/up kernels trigger only after their own pdl_wait, so
 * once the down kernel runs the top-k kernel has completed (down reads the choices
 * before its wait, and fetches its weights while gate/up finishes). The top-k kernel
 * triggers first thing, so that gate/up can start during the router; it reads
 * nothing the top-k kernel writes before its pdl_wait, except x, complete before
 * the router (launched without the attribute) started. PDL through a CUDA graph
 * capture was checked on the H200 (engine's graphs-vs-eager check, greedy ids). */
__device__ __forceinline__ void pdl_wait(void) { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_trigger(void) { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

/* ---- cuda_fused_decode ------------------------------------------------------------- */

/* Launch 1: logits [M, E] = x·Wrᵀ. A block of 16 warps takes 4 expert rows, 4
 * warps a row, each a quarter of H with all its 16-byte loads in flight before
 * the first use (x staged once per block in shared memory: M·H bf16, dynamic);
 * the quarters meet in shared memory. Row E, when there is a shared-expert gate,
 * is its logit x·wsg into sgl [M]. (One warp per whole row until 2026-11-29: 6.3
 * us on the H200 for E = 512, H = 4096, every warp a long serial FMA chain.) */
enum { ROUTER_RPB = 4, ROUTER_Q = 4, ROUTER_LD = 8 };
__global__ void __launch_bounds__(32 * ROUTER_RPB * ROUTER_Q, 1) moe_router_kernel(int M, int H, int E,
                                                                            const bf16 *__restrict__ x,
                                                                            const bf16 *__restrict__ wr,
                                                                            const bf16 *__restrict__ wsg,
                                                                            float *logits, float *sgl) {
    extern __shared__ uint4 xs4[];
    __shared__ float part[ROUTER_RPB][ROUTER_Q][FUSED_MAXM];
    pdl_trigger(); /* launched without the attribute: its own inputs are complete */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, r = warp / ROUTER_Q, q = warp % ROUTER_Q;
    const int ex = blockIdx.x * ROUTER_RPB + r;
    const bool active = ex < E || (ex == E && wsg);
    const bf16 *row = ex < E ? wr + (size_t)ex * H : wsg;
    const int hq = H / ROUTER_Q, kb = q * hq, ke = kb + hq;
    uint4 vw[ROUTER_LD];
    if (active) {
#pragma unroll
        for (int c = 0; c < ROUTER_LD; c++)
            if (kb + lane * 8 + 256 * c < ke) vw[c] = cu_ld_stream16(row + kb + lane * 8 + 256 * c);
    }
    const uint4 *xg = reinterpret_cast<const uint4 *>(x);
    for (int i = threadIdx.x; i < M * H / 8; i += blockDim.x) xs4[i] = __ldg(xg + i);
    __syncthreads();
    if (active) {
        float acc[FUSED_MAXM];
#pragma unroll
        for (int m = 0; m < FUSED_MAXM; m++) acc[m] = 0.f;
        for (int k0 = kb + lane * 8; k0 < ke; k0 += 256 * ROUTER_LD) {
            if (k0 != kb + lane * 8) {
#pragma unroll
                for (int c = 0; c < ROUTER_LD; c++)
                    if (k0 + 256 * c < ke) vw[c] = cu_ld_stream16(row + k0 + 256 * c);
            }
#pragma unroll
            for (int c = 0; c < ROUTER_LD; c++) {
                const int kk = k0 + 256 * c;
                if (kk >= ke) break;
                const uint32_t ww[4] = {vw[c].x, vw[c].y, vw[c].z, vw[c].w};
#pragma unroll
                for (int m = 0; m < FUSED_MAXM; m++) {
                    if (m >= M) break;
                    const uint4 vx = xs4[((size_t)m * H + kk) / 8];
                    const uint32_t xx[4] = {vx.x, vx.y, vx.z, vx.w};
#pragma unroll
                    for (int u = 0; u < 4; u++) {
                        float2 a = bf2_to_f2(ww[u]), b = bf2_to_f2(xx[u]);
                        acc[m] = fmaf(a.x, b.x, acc[m]);
                        acc[m] = fmaf(a.y, b.y, acc[m]);
                    }
                }
            }
        }
#pragma unroll
        for (int m = 0; m < FUSED_MAXM; m++) {
            if (m >= M) break;
            const float sum = warp_sum(acc[m]);
            if (lane == 0) part[r][q][m] = sum;
        }
    }
    __syncthreads();
    if (threadIdx.x < ROUTER_RPB * FUSED_MAXM) {
        const int r2 = threadIdx.x / FUSED_MAXM, m = threadIdx.x % FUSED_MAXM;
        const int ex2 = blockIdx.x * ROUTER_RPB + r2;
        if (m < M && (ex2 < E || (ex2 == E && wsg))) {
            float v = 0.f;
#pragma unroll
            for (int qq = 0; qq < ROUTER_Q; qq++) v += part[r2][qq][m];
            if (ex2 < E) logits[(size_t)m * E + ex2] = v;
            else sgl[m] = v;
        }
    }
}

/* Launch 1b: softmax, top-k and the shared gate, a block of TOPK_W warps per
 * token (E <= 64·TOPK_W). Phase 1: warp w takes experts 64w .. 64w + 63 (two per
 * lane) and picks its own top-k, k rounds of two redux.sync (largest
 * order-preserving key, then the lowest index holding it). Phase 2: each of
 * those TOPK_W·k candidates, one per thread, counts the candidates that beat
 * it (rank by counting: no dependent rounds). The global top-k under (logit
 * desc, index asc) is inside the union of the warps' top-k. Until 2026-11-29
 * one warp did all of it: 9 us of dependent instructions on one SM (Nsight
 * Compute, H200, E = 512, k = 10); then phase 2 was k more redux rounds on
 * warp 0 (7.8 us for the kernel). */
enum { TOPK_W = 16 };
/* PACK (the fused path's default; LASTSTAND_MOE_TOPK=1 for the other): phase 2 compares packed
 * 64-bit candidates (key << 32 | ~index: larger is better under the same order, one
 * shared load and one compare each) in an unrolled loop over the nw·k real
 * candidates only, and the warps without experts skip phase 1. */
template <bool PACK>
__global__ void __launch_bounds__(32 * TOPK_W) moe_topk_kernel(int H, int E, int k, int norm,
                                                                    const bf16 *__restrict__ x,
                                                                    const bf16 *__restrict__ wsg, int has_shared,
                                                                    const float *__restrict__ logits,
                                                                    const float *__restrict__ sgl, int32_t *idx,
                                                                    float *wts) {
    __shared__ unsigned ck[TOPK_W][MOE_MAXK];
    __shared__ int ci[TOPK_W][MOE_MAXK];
    __shared__ unsigned long long cp[TOPK_W * MOE_MAXK]; /* PACK: candidate w·k + j */
    __shared__ float rmax[TOPK_W], rsum[TOPK_W];
    __shared__ int rk_i[MOE_MAXK];
    __shared__ float rk_p[MOE_MAXK];
    pdl_trigger(); /* gate/up may launch now: it waits for this kernel before it reads the choices */
    pdl_wait();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, m = blockIdx.x;
    const float *L = logits + (size_t)m * E;
    const int e0 = warp * 64 + lane, e1 = e0 + 32;
    const float a = e0 < E ? L[e0] : -INFINITY, b = e1 < E ? L[e1] : -INFINITY;
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
    for (int j = 0; j < ((PACK && warp >= nw) ? 0 : k); j++) {
        /* this lane's best untaken: a (lower index) unless b is strictly larger */
        const unsigned ua = ta ? 0u : ka, ub = tb ? 0u : kb;
        const unsigned kl = ub > ua ? ub : ua;
        const unsigned il = ub > ua ? (unsigned)e1 : (unsigned)e0;
        const unsigned kmax = __reduce_max_sync(0xffffffffu, kl);
        const unsigned win = __reduce_min_sync(0xffffffffu, kl == kmax ? il : 0xffffffffu);
        if (win == (unsigned)e0) ta = true;
        if (win == (unsigned)e1) tb = true;
        if (lane == 0) {
            ck[warp][j] = kmax;
            ci[warp][j] = (int)win;
            if (PACK) cp[warp * k + j] = (unsigned long long)kmax << 32 | (unsigned)~win;
        }
    }
    __syncthreads();
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < TOPK_W; w++) sum += rsum[w];
    /* phase 2: rank by counting. Candidate c = (warp w, pick j), one per thread;
     * its rank is the number of candidates before it under (logit desc, index
     * asc): no dependent rounds (it was k rounds of two redux.sync on one warp,
     * most of this kernel's 7.8 us on the H200 at E = 512, k = 10). Empty picks
     * (key 0, a warp with fewer than k experts) rank after every real one; real
     * candidates are distinct experts, so ranks 0..k-1 are unique. */
    if (PACK) {
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
    } else if (threadIdx.x < TOPK_W * MOE_MAXK) {
        const int w = threadIdx.x / MOE_MAXK, j = threadIdx.x % MOE_MAXK;
        if (w < nw && j < k) {
            const unsigned key = ck[w][j];
            const int id = ci[w][j];
            int rank = 0;
            for (int w2 = 0; w2 < nw; w2++)
                for (int j2 = 0; j2 < k; j2++) {
                    const unsigned k2 = ck[w2][j2];
                    rank += k2 > key || (k2 == key && ci[w2][j2] < id);
                }
            if (rank < k && key) {
                rk_i[rank] = id;
                rk_p[rank] = __expf(key2f(key) - mx) / sum;
            }
        }
    }
    __syncthreads();
    if (warp) return;
    float psum = 0.f;
    for (int j = 0; j < k; j++) psum += rk_p[j]; /* descending p, as the reference sums */
    float sg = has_shared ? 1.f : 0.f;
    if (has_shared && sgl) sg = 1.f / (1.f + __expf(-__ldcg(sgl + m)));
    else if (has_shared && wsg) sg = 1.f / (1.f + __expf(-dot_bf16_row(x + (size_t)m * H, wsg, H, lane)));
    if (lane < k) {
        idx[(size_t)m * k + lane] = rk_i[lane];
        wts[(size_t)m * (k + 1) + lane] = norm ? rk_p[lane] / psum : rk_p[lane];
    }
    if (lane == 0) wts[(size_t)m * (k + 1) + k] = sg;
}

typedef struct gu_params {
    const uint8_t *gw[MOE_MAXE], *uw[MOE_MAXE];
    const uint8_t *gs[MOE_MAXE], *us[MOE_MAXE];
    float g2[MOE_MAXE], u2[MOE_MAXE];
    const uint8_t *sgw, *suw, *sgs, *sus; /* shared expert; sgs/sus NULL when BF16 */
    float sg2, su2;                       /* 1 when BF16 */
    int sbf;                              /* the shared expert's rows are BF16 [Is, H] */
} gu_params;

typedef struct dn_params {
    const uint8_t *dw[MOE_MAXE];
    const uint8_t *ds[MOE_MAXE];
    float d2[MOE_MAXE];
    const uint8_t *sdw, *sds; /* shared expert's down; sds NULL when BF16 */
    float sd2;                /* 1 when BF16 */
    int sbf;                  /* the shared expert's down rows are BF16 [H, Is] */
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

/* One 128-element K chunk of a 16-row BF16 tile (a BF16 shared expert next to
 * NVFP4 routed experts): w0 / w1 = this lane's 32 weights of rows g and g + 8
 * (4 x 16 B each, K order), xv = the lane's 32 matching B values. The same
 * fragments and K permutation as cu_w4_chunk_mma / decode16: bf16x2 word w of
 * the lane's slice pairs with B word w, so NVFP4 and BF16 tiles of one block
 * accumulate the same way. */
__device__ __forceinline__ void bf16_chunk_mma(const uint4 (&w0)[4], const uint4 (&w1)[4], const uint4 (&xv)[4],
                                               float (&acc)[4]) {
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const uint32_t f0[4] = {w0[q].x, w1[q].x, w0[q].y, w1[q].y};
        const uint32_t f1[4] = {w0[q].z, w1[q].z, w0[q].w, w1[q].w};
        cu_mma_bf16_16816(acc, f0, xv[q].x, xv[q].y);
        cu_mma_bf16_16816(acc, f1, xv[q].z, xv[q].w);
    }
}

/* This lane's 32 BF16 weights of rows r and r + 8 of a row-major [*, K] matrix
 * at element offset k0 (16-byte aligned: K % 128 == 0, k0 % 8 == 0). */
__device__ __forceinline__ void bf16_ld_rows(const bf16 *w, size_t r, int K, size_t k0, uint4 (&w0)[4],
                                             uint4 (&w1)[4]) {
    const bf16 *p0 = w + r * K + k0, *p1 = p0 + (size_t)8 * K;
#pragma unroll
    for (int v = 0; v < 4; v++) {
        w0[v] = cu_ld_stream16(p0 + 8 * v);
        w1[v] = cu_ld_stream16(p1 + 8 * v);
    }
}

/* Block-column form (BC, M = 1 only; nvfp4.cuh's nv4_gemv1_chunk): the mma's 8 B
 * columns hold the chunk's 8 scale blocks instead of 8 copies of the token, so each
 * output is one (row, block) partial and the block scale is an fp32 FFMA (no BF16
 * multiply per decoded pair, the byte tables built once). acc then holds (row g,
 * block 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1): bc_rows leaves the rows' sums
 * in acc[0] (row g) and acc[2] (row g + 8) of the lanes with t == 0, as the standard
 * layout has them. A BF16 chunk in BC mode puts the token in column 0 only (lanes
 * g == 0 supply B, the others zeros), which sums the same way. */
__device__ __forceinline__ void bc_rows(float (&acc)[4]) {
    float r0 = acc[0] + acc[1], r1 = acc[2] + acc[3];
    r0 += __shfl_xor_sync(0xffffffffu, r0, 1);
    r1 += __shfl_xor_sync(0xffffffffu, r1, 1);
    r0 += __shfl_xor_sync(0xffffffffu, r0, 2);
    r1 += __shfl_xor_sync(0xffffffffu, r1, 2);
    acc[0] = r0;
    acc[2] = r1;
}

/* One NVFP4 chunk in BC form: xr = the lane's 32 B-values of the token (4 uint4, K
 * order), zero = 64 readable zero bytes (global); s0 / s1 the E4M3 scale pairs of
 * rows g / g + 8. */
__device__ __forceinline__ void bc_chunk(uint4 w0, uint4 w1, uint16_t s0, uint16_t s1, const uint4 *xr,
                                         const uint4 *zero, int g, int t, const nv4_lut &lut, float (&acc)[4]) {
    const bool act = t == (g >> 1);
    const uint4 *pe = act && !(g & 1) ? xr : zero, *po = act && (g & 1) ? xr + 2 : zero;
    float sg[4];
    nv4_e4m3x2_to_f32x2(s0, sg[0], sg[1]);
    nv4_e4m3x2_to_f32x2(s1, sg[2], sg[3]);
    nv4_gemv1_chunk(w0, w1, __ldg(pe), __ldg(pe + 1), __ldg(po), __ldg(po + 1), sg, lut, acc);
}

/* Launch 2: block (16 rows, slot s = m·(k+1) + j): h[s, rows] = silu(gate)·up, fp32.
 * BC (M = 1): the NVFP4 chunks in block-column form (bc_chunk). */
template <bool BC>
__global__ void __launch_bounds__(256, BC ? 2 : 0) moe_gateup_kernel(const gu_params *__restrict__ P, int M, int H,
                                                         int I, int Is, int k, const bf16 *__restrict__ x,
                                                         const int32_t *__restrict__ idx, float *hws,
                                                         int ldh, const uint4 *__restrict__ zero, int early_sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    /* the shared expert's blocks (j = k) first in launch order: they are the
     * heaviest (Is rows, BF16 in the flagship layout), so they must not start last */
    const int m = blockIdx.y / (k + 1), j = (blockIdx.y + k) % (k + 1), s = m * (k + 1) + j;
    /* early_sh: the shared expert's blocks read only x and weights (h in fp32 without
     * the gate weight), so they need not wait for the top-k kernel at all (see
     * moe_gateup2_kernel for why the down kernel stays safe) */
    if (!(early_sh && j == k)) pdl_wait();
    pdl_trigger();
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
    const nv4_lut lut = nv4_lut_make((threadIdx.x + 1u) * (uint32_t)(H & 127)); /* H % 128 == 0 (BC only) */
    if (j == k && P->sbf) {
        /* BF16 shared expert: 4 x 16 B per row and chunk, one chunk in flight */
        for (int c = cb; c < ce; c++) {
            uint4 g0[4], g1[4], u0[4], u1[4], xv[4];
            bf16_ld_rows(reinterpret_cast<const bf16 *>(gw), n0 + g, H, (size_t)c * 128 + 32 * t, g0, g1);
            bf16_ld_rows(reinterpret_cast<const bf16 *>(uw), n0 + g, H, (size_t)c * 128 + 32 * t, u0, u1);
            const uint4 *xp = reinterpret_cast<const uint4 *>(xm + c * 128 + 32 * t);
#pragma unroll
            for (int v = 0; v < 4; v++) xv[v] = g == 0 ? __ldg(xp + v) : make_uint4(0u, 0u, 0u, 0u);
            bf16_chunk_mma(g0, g1, xv, ag);
            bf16_chunk_mma(u0, u1, xv, au);
        }
    } else
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
            if (BC) {
                const uint4 *xp = reinterpret_cast<const uint4 *>(xm + (c + u) * 128 + 32 * t);
                bc_chunk(wv[u][0], wv[u][1], sv[u][0], sv[u][1], xp, zero, g, t, lut, ag);
                bc_chunk(wv[u][2], wv[u][3], sv[u][2], sv[u][3], xp, zero, g, t, lut, au);
                continue;
            }
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
    if (BC) { /* the BF16 shared expert's B is column 0 only: bc_rows sums it the same way */
        bc_rows(ag);
        bc_rows(au);
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

/* Launch 3: block (16 output rows, token m): y = Σ_j coef_j · down_j(h_j).
 * BC (M = 1): the NVFP4 chunks in block-column form (the B halves built from h). */
template <bool BC>
__global__ void __launch_bounds__(256) moe_down_kernel(const dn_params *__restrict__ P, int M, int H, int I,
                                                       int Is, int k, const int32_t *__restrict__ idx,
                                                       const float *__restrict__ wts,
                                                       const float *__restrict__ hws, int ldh,
                                                       bf16 *__restrict__ y) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int m = blockIdx.y, n0 = blockIdx.x * 16;
    const int cpe = I / 128, cps = Is / 128;
    const int sbf = P->sbf;
    const int npairs = k * cpe + (sbf ? 0 : cps); /* a BF16 shared expert's chunks follow below */
    float acc[4] = {0, 0, 0, 0};
    const nv4_lut lut = nv4_lut_make((threadIdx.x + 1u) * (uint32_t)(I & 127)); /* I % 128 == 0 (BC only) */
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
        pdl_wait(); /* h from gate/up (the weights above are already in flight) */
#pragma unroll
        for (int u = 0; u < 4; u++) {
            if (p0 + 8 * u >= npairs) break;
            if (BC) {
                /* lane (g, t) with t == g / 2 supplies half g % 2 of its 32 values, the rest zeros */
                uint4 h0 = make_uint4(0u, 0u, 0u, 0u), h1 = h0;
                if (t == (g >> 1)) {
                    const float4 *hp = reinterpret_cast<const float4 *>(hws + (size_t)hrow[u] * ldh + kx[u]) + 4 * (g & 1);
                    uint32_t hv[8];
#pragma unroll
                    for (int v = 0; v < 4; v++) {
                        const float4 f = hp[v];
                        __nv_bfloat162 lo = __floats2bfloat162_rn(f.x * coef[u], f.y * coef[u]);
                        __nv_bfloat162 hi = __floats2bfloat162_rn(f.z * coef[u], f.w * coef[u]);
                        hv[2 * v] = *reinterpret_cast<uint32_t *>(&lo);
                        hv[2 * v + 1] = *reinterpret_cast<uint32_t *>(&hi);
                    }
                    h0 = make_uint4(hv[0], hv[1], hv[2], hv[3]);
                    h1 = make_uint4(hv[4], hv[5], hv[6], hv[7]);
                }
                const uint4 z = make_uint4(0u, 0u, 0u, 0u);
                float sg[4];
                nv4_e4m3x2_to_f32x2(sv[u][0], sg[0], sg[1]);
                nv4_e4m3x2_to_f32x2(sv[u][1], sg[2], sg[3]);
                const bool od = g & 1;
                nv4_gemv1_chunk(wv[u][0], wv[u][1], od ? z : h0, od ? z : h1, od ? h0 : z, od ? h1 : z, sg, lut, acc);
                continue;
            }
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
    pdl_wait();
    if (sbf) {
        /* BF16 shared expert: chunk c continues the round robin after the routed pairs */
        const float coef = wts[m * (k + 1) + k];
        const float *hr = hws + (size_t)(m * (k + 1) + k) * ldh;
        for (int c = ((warp - npairs % 8) % 8 + 8) % 8; c < cps; c += 8) {
            uint4 w0[4], w1[4], xv[4];
            bf16_ld_rows(reinterpret_cast<const bf16 *>(P->sdw), n0 + g, Is, (size_t)c * 128 + 32 * t, w0, w1);
            if (g == 0) {
                const float4 *hp = reinterpret_cast<const float4 *>(hr + c * 128 + 32 * t);
#pragma unroll
                for (int v = 0; v < 4; v++) {
                    const float4 f0 = hp[2 * v], f1 = hp[2 * v + 1];
                    __nv_bfloat162 p0 = __floats2bfloat162_rn(f0.x * coef, f0.y * coef);
                    __nv_bfloat162 p1 = __floats2bfloat162_rn(f0.z * coef, f0.w * coef);
                    __nv_bfloat162 p2 = __floats2bfloat162_rn(f1.x * coef, f1.y * coef);
                    __nv_bfloat162 p3 = __floats2bfloat162_rn(f1.z * coef, f1.w * coef);
                    xv[v] = make_uint4(*reinterpret_cast<uint32_t *>(&p0), *reinterpret_cast<uint32_t *>(&p1),
                                       *reinterpret_cast<uint32_t *>(&p2), *reinterpret_cast<uint32_t *>(&p3));
                }
            } else {
#pragma unroll
                for (int v = 0; v < 4; v++) xv[v] = make_uint4(0u, 0u, 0u, 0u);
            }
            bf16_chunk_mma(w0, w1, xv, acc);
        }
    }
    if (BC) bc_rows(acc); /* the BF16 shared expert's B is column 0 only: same sums */
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

/* ---- the streaming pair (default): same load pipeline as fp4_gemm's cp.async kernel ---- */

/* Launch 2: block (16 rows, slot s = m·(k+1) + j), KW warps each owning PER
 * consecutive 128-element chunks of H (H == KW·PER·128): all gate and up bytes of
 * the warp's slice go in flight at once with cp.async (4 x 16 B per lane per
 * chunk), one commit group per chunk, then chunk by chunk: wait, read back,
 * decode, mma. Epilogue: h[s, rows] = silu(gate·g2)·(up·u2)·coef in BF16, coef =
 * the slot's combine weight (or shared gate) times the down projection's scale2,
 * so the down kernel reads h as its ready B operand. */
template <int KW, int PER, bool BC>
__global__ void __launch_bounds__(32 * KW, 32 / KW)
    moe_gateup2_kernel(const gu_params *__restrict__ P, const dn_params *__restrict__ D, int H, int I, int Is,
                       int k, const bf16 *__restrict__ x, const int32_t *__restrict__ idx,
                       const float *__restrict__ wts, bf16 *__restrict__ hout, int ldh, int early_sh,
                       const uint4 *__restrict__ zero) {
    extern __shared__ uint4 st[]; /* [KW][PER][4][32] */
    __shared__ float red[KW][2][16];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    /* the shared expert's blocks (j = k) first in launch order: they are the
     * heaviest (Is rows, BF16 in the flagship layout), so they must not start last */
    const int m = blockIdx.y / (k + 1), j = (blockIdx.y + k) % (k + 1), s = m * (k + 1) + j;
    /* early_sh (fused_early, the default with PDL): the shared expert's
     * blocks need only x (complete before the router started) until their epilogue's
     * gate weight, so they fetch and multiply before waiting for the top-k kernel; the
     * routed blocks still wait before they trigger, which keeps the down kernel's
     * early read of the choices safe */
    if (!(early_sh && j == k)) pdl_wait();
    pdl_trigger();
    const int n0 = blockIdx.x * 16;
    const uint8_t *gw, *uw, *gs, *us;
    float g2, u2, coef;
    int rows;
    if (j < k) {
        const int ex = idx[m * k + j];
        gw = P->gw[ex]; uw = P->uw[ex]; gs = P->gs[ex]; us = P->us[ex]; g2 = P->g2[ex]; u2 = P->u2[ex];
        coef = D->d2[ex];
        rows = I;
    } else {
        gw = P->sgw; uw = P->suw; gs = P->sgs; us = P->sus; g2 = P->sg2; u2 = P->su2;
        coef = D->sd2;
        rows = Is;
    }
    if (n0 >= rows) return;
    const int c0 = warp * PER;
    float ag[4] = {0.f, 0.f, 0.f, 0.f}, au[4] = {0.f, 0.f, 0.f, 0.f};
    if (j == k && P->sbf) {
        /* BF16 shared expert: 4x the bytes of an NVFP4 chunk, streamed through
         * registers (PER chunks' gate and up rows would not fit the cp.async
         * stage), gate then up to stay inside the 64-register budget */
        const uint4 *xr = reinterpret_cast<const uint4 *>(x + (size_t)m * H + c0 * 128 + 32 * t);
#pragma unroll 1
        for (int u = 0; u < PER; u++) {
            uint4 w0[4], w1[4], xv[4];
            const uint4 *xb = !BC || g == 0 ? xr + u * 16 : zero; /* BC: the token in column 0 only */
#pragma unroll
            for (int v = 0; v < 4; v++) xv[v] = __ldg(xb + v);
            bf16_ld_rows(reinterpret_cast<const bf16 *>(gw), n0 + g, H, (size_t)(c0 + u) * 128 + 32 * t, w0, w1);
            bf16_chunk_mma(w0, w1, xv, ag);
            bf16_ld_rows(reinterpret_cast<const bf16 *>(uw), n0 + g, H, (size_t)(c0 + u) * 128 + 32 * t, w0, w1);
            bf16_chunk_mma(w0, w1, xv, au);
        }
        pdl_wait();
        coef *= wts[m * (k + 1) + j];
    } else {
    const size_t rb = (size_t)(n0 + g) * (H / 2) + c0 * 64 + 16 * t, r8 = (size_t)8 * (H / 2);
    uint4 *my = st + (size_t)warp * PER * 4 * 32 + lane;
#pragma unroll
    for (int u = 0; u < PER; u++) {
        cu_cp_async16(my + (u * 4 + 0) * 32, gw + rb + u * 64);
        cu_cp_async16(my + (u * 4 + 1) * 32, gw + rb + r8 + u * 64);
        cu_cp_async16(my + (u * 4 + 2) * 32, uw + rb + u * 64);
        cu_cp_async16(my + (u * 4 + 3) * 32, uw + rb + r8 + u * 64);
        cu_cp_async_commit();
    }
    const size_t sb = (size_t)(n0 + g) * (H / 16) + c0 * 8 + 2 * t, s8 = (size_t)8 * (H / 16);
    uint16_t sg0[PER], sg1[PER], su0[PER], su1[PER];
#pragma unroll
    for (int u = 0; u < PER; u++) {
        sg0[u] = __ldg(reinterpret_cast<const uint16_t *>(gs + sb + u * 8));
        sg1[u] = __ldg(reinterpret_cast<const uint16_t *>(gs + sb + s8 + u * 8));
        su0[u] = __ldg(reinterpret_cast<const uint16_t *>(us + sb + u * 8));
        su1[u] = __ldg(reinterpret_cast<const uint16_t *>(us + sb + s8 + u * 8));
    }
    pdl_wait();
    coef *= wts[m * (k + 1) + j];
    /* every token column is token m: no lane predicated off, column 0 is read */
    const uint4 *xr = reinterpret_cast<const uint4 *>(x + (size_t)m * H + c0 * 128 + 32 * t);
    if (BC) {
        const nv4_lut lut = nv4_lut_make((threadIdx.x + 1u) * (uint32_t)(H & 127)); /* H % 128 == 0 */
#pragma unroll
        for (int u = 0; u < PER; u++) {
            cu_cp_async_wait_dyn(PER - 1 - u);
            bc_chunk(my[(u * 4 + 0) * 32], my[(u * 4 + 1) * 32], sg0[u], sg1[u], xr + u * 16, zero, g, t, lut, ag);
            bc_chunk(my[(u * 4 + 2) * 32], my[(u * 4 + 3) * 32], su0[u], su1[u], xr + u * 16, zero, g, t, lut, au);
        }
    } else {
#pragma unroll
    for (int u = 0; u < PER; u++) {
        uint4 xv[4];
#pragma unroll
        for (int v = 0; v < 4; v++) xv[v] = __ldg(xr + u * 16 + v);
        cu_cp_async_wait_dyn(PER - 1 - u);
        cu_w4_chunk_mma(my[(u * 4 + 0) * 32], my[(u * 4 + 1) * 32], sg0[u], sg1[u], xv, ag);
        cu_w4_chunk_mma(my[(u * 4 + 2) * 32], my[(u * 4 + 3) * 32], su0[u], su1[u], xv, au);
    }
    }
    }
    if (BC) {
        bc_rows(ag);
        bc_rows(au);
    }
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
        for (int w = 0; w < KW; w++) {
            gv += red[w][0][threadIdx.x];
            uv += red[w][1][threadIdx.x];
        }
        gv *= g2;
        uv *= u2;
        hout[(size_t)s * ldh + n0 + threadIdx.x] = __float2bfloat16_rn(gv / (1.f + __expf(-gv)) * uv * coef);
    }
}

/* Launch 3: block (16 output rows, token m): y = Σ_j down_j(h_j) over the
 * (k·I + Is)/128 chunks of the token's experts, dealt round-robin to KW warps;
 * each warp puts up to PMAX chunks in flight with cp.async, then consumes them
 * in order (h rows from L2 as the B operand). The experts' down weights are
 * looked up once per block into shared memory. */
template <int KW, int PMAX, bool BC>
__global__ void __launch_bounds__(32 * KW, 2)
    moe_down2_kernel(const dn_params *__restrict__ P, int H, int I, int Is, int k,
                     const int32_t *__restrict__ idx, const bf16 *__restrict__ hin, int ldh,
                     bf16 *__restrict__ y, const uint4 *__restrict__ zero) {
    extern __shared__ uint4 st[]; /* [KW][PMAX][2][32] */
    __shared__ const uint8_t *sw[MOE_MAXK + 1], *ss[MOE_MAXK + 1];
    __shared__ float red[KW][16];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int m = blockIdx.y, n0 = blockIdx.x * 16;
    if (threadIdx.x < k) {
        const int ex = idx[m * k + threadIdx.x];
        sw[threadIdx.x] = P->dw[ex];
        ss[threadIdx.x] = P->ds[ex];
    } else if (threadIdx.x == k) {
        sw[k] = P->sdw;
        ss[k] = P->sds;
    }
    __syncthreads();
    const int cpe = I / 128, cps = Is / 128;
    const int npairs = k * cpe + (P->sbf ? 0 : cps); /* a BF16 shared expert's chunks follow below */
    uint4 *my = st + (size_t)warp * PMAX * 2 * 32 + lane;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const nv4_lut lut = nv4_lut_make((threadIdx.x + 1u) * (uint32_t)(I & 127)); /* I % 128 == 0 (BC only) */
    for (int base = warp; base < npairs; base += KW * PMAX) {
        uint16_t s0[PMAX], s1[PMAX];
#pragma unroll
        for (int u = 0; u < PMAX; u++) {
            const int p = base + KW * u;
            if (p < npairs) {
                const int j = p < k * cpe ? p / cpe : k, c = p < k * cpe ? p % cpe : p - k * cpe;
                const int K = j < k ? I : Is;
                const size_t rb = (size_t)(n0 + g) * (K / 2) + (size_t)c * 64 + 16 * t;
                const size_t sbb = (size_t)(n0 + g) * (K / 16) + (size_t)c * 8 + 2 * t;
                cu_cp_async16(my + (u * 2 + 0) * 32, sw[j] + rb);
                cu_cp_async16(my + (u * 2 + 1) * 32, sw[j] + rb + (size_t)8 * (K / 2));
                s0[u] = __ldg(reinterpret_cast<const uint16_t *>(ss[j] + sbb));
                s1[u] = __ldg(reinterpret_cast<const uint16_t *>(ss[j] + sbb + (size_t)8 * (K / 16)));
            }
            cu_cp_async_commit();
        }
        pdl_wait(); /* h from gate/up (the weights above are already in flight) */
#pragma unroll
        for (int u = 0; u < PMAX; u++) {
            const int p = base + KW * u;
            if (p >= npairs) break;
            const int j = p < k * cpe ? p / cpe : k, c = p < k * cpe ? p % cpe : p - k * cpe;
            const uint4 *hp = reinterpret_cast<const uint4 *>(hin + (size_t)(m * (k + 1) + j) * ldh + c * 128 + 32 * t);
            if (BC) {
                cu_cp_async_wait_dyn(PMAX - 1 - u);
                bc_chunk(my[(u * 2 + 0) * 32], my[(u * 2 + 1) * 32], s0[u], s1[u], hp, zero, g, t, lut, acc);
            } else {
                uint4 xv[4];
#pragma unroll
                for (int v = 0; v < 4; v++) xv[v] = __ldg(hp + v);
                cu_cp_async_wait_dyn(PMAX - 1 - u);
                cu_w4_chunk_mma(my[(u * 2 + 0) * 32], my[(u * 2 + 1) * 32], s0[u], s1[u], xv, acc);
            }
        }
    }
    pdl_wait();
    if (P->sbf) {
        /* BF16 shared expert: chunk c continues the round robin after the routed pairs */
        const uint4 *hr = reinterpret_cast<const uint4 *>(hin + (size_t)(m * (k + 1) + k) * ldh + 32 * t);
        for (int c = ((warp - npairs % KW) % KW + KW) % KW; c < cps; c += KW) {
            uint4 w0[4], w1[4];
            bf16_ld_rows(reinterpret_cast<const bf16 *>(sw[k]), n0 + g, Is, (size_t)c * 128 + 32 * t, w0, w1);
#pragma unroll
            for (int q = 0; q < 4; q++) { /* bf16_chunk_mma with B read as it goes: no spill */
                const uint4 xq = __ldg(!BC || g == 0 ? hr + c * 16 + q : zero); /* BC: column 0 only */
                const uint32_t f0[4] = {w0[q].x, w1[q].x, w0[q].y, w1[q].y};
                const uint32_t f1[4] = {w0[q].z, w1[q].z, w0[q].w, w1[q].w};
                cu_mma_bf16_16816(acc, f0, xq.x, xq.y);
                cu_mma_bf16_16816(acc, f1, xq.z, xq.w);
            }
        }
    }
    if (BC) bc_rows(acc);
    if (t == 0) {
        red[warp][g] = acc[0];
        red[warp][g + 8] = acc[2];
    }
    __syncthreads();
    if (threadIdx.x < 16) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < KW; w++) v += red[w][threadIdx.x];
        y[(size_t)m * H + n0 + threadIdx.x] = __float2bfloat16_rn(v);
    }
}

enum { DOWN_KW = 16, DOWN_PMAX = 6 };

/* Launch 3, pair 4: moe_down2_kernel with the B operand from shared memory. Each
 * chunk's 256 bytes of h (the token's h row at that chunk) are copied by 16 lanes
 * with cp.async next to the chunk's weights, once the wait for gate/up returns; the
 * weights of the round were issued before it. In moe_down2_kernel every lane
 * reads its 64 bytes of h from L2 inside the consume loop, one dependent L2 round
 * trip per chunk. PMAX = 5 keeps two blocks per SM (100 KB of shared memory each). */
enum { DOWN3_PMAX = 5 };
template <int KW, int PMAX>
__global__ void __launch_bounds__(32 * KW, 2)
    moe_down3_kernel(const dn_params *__restrict__ P, int H, int I, int Is, int k,
                     const int32_t *__restrict__ idx, const bf16 *__restrict__ hin, int ldh,
                     bf16 *__restrict__ y) {
    extern __shared__ uint4 st[]; /* weights [KW][PMAX][2][32], then h [KW][PMAX][16] */
    __shared__ const uint8_t *sw[MOE_MAXK + 1], *ss[MOE_MAXK + 1];
    __shared__ float red[KW][16];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int m = blockIdx.y, n0 = blockIdx.x * 16;
    if (threadIdx.x < k) {
        const int ex = idx[m * k + threadIdx.x];
        sw[threadIdx.x] = P->dw[ex];
        ss[threadIdx.x] = P->ds[ex];
    } else if (threadIdx.x == k) {
        sw[k] = P->sdw;
        ss[k] = P->sds;
    }
    __syncthreads();
    const int cpe = I / 128, cps = Is / 128;
    const int npairs = k * cpe + (P->sbf ? 0 : cps); /* a BF16 shared expert's chunks follow below */
    uint4 *my = st + (size_t)warp * PMAX * 2 * 32 + lane;
    uint4 *hs = st + (size_t)KW * PMAX * 2 * 32 + (size_t)warp * PMAX * 16;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int base = warp; base < npairs; base += KW * PMAX) {
        uint16_t s0[PMAX], s1[PMAX];
#pragma unroll
        for (int u = 0; u < PMAX; u++) {
            const int p = base + KW * u;
            if (p < npairs) {
                const int j = p < k * cpe ? p / cpe : k, c = p < k * cpe ? p % cpe : p - k * cpe;
                const int K = j < k ? I : Is;
                const size_t rb = (size_t)(n0 + g) * (K / 2) + (size_t)c * 64 + 16 * t;
                const size_t sbb = (size_t)(n0 + g) * (K / 16) + (size_t)c * 8 + 2 * t;
                cu_cp_async16(my + (u * 2 + 0) * 32, sw[j] + rb);
                cu_cp_async16(my + (u * 2 + 1) * 32, sw[j] + rb + (size_t)8 * (K / 2));
                s0[u] = __ldg(reinterpret_cast<const uint16_t *>(ss[j] + sbb));
                s1[u] = __ldg(reinterpret_cast<const uint16_t *>(ss[j] + sbb + (size_t)8 * (K / 16)));
            }
        }
        pdl_wait(); /* h from gate/up (the weights above are already in flight) */
#pragma unroll
        for (int u = 0; u < PMAX; u++) {
            const int p = base + KW * u;
            if (p < npairs && lane < 16) {
                const int j = p < k * cpe ? p / cpe : k, c = p < k * cpe ? p % cpe : p - k * cpe;
                cu_cp_async16(hs + u * 16 + lane, hin + (size_t)(m * (k + 1) + j) * ldh + c * 128 + 8 * lane);
            }
        }
        cu_cp_async_commit();
        cu_cp_async_wait<0>();
        __syncwarp(); /* the h segments other lanes copied */
#pragma unroll
        for (int u = 0; u < PMAX; u++) {
            if (base + KW * u >= npairs) break;
            uint4 xv[4];
#pragma unroll
            for (int v = 0; v < 4; v++) xv[v] = hs[u * 16 + 4 * t + v];
            cu_w4_chunk_mma(my[(u * 2 + 0) * 32], my[(u * 2 + 1) * 32], s0[u], s1[u], xv, acc);
        }
        __syncwarp(); /* before the next round overwrites this warp's h segments */
    }
    pdl_wait();
    if (P->sbf) {
        /* BF16 shared expert: chunk c continues the round robin after the routed pairs */
        const uint4 *hr = reinterpret_cast<const uint4 *>(hin + (size_t)(m * (k + 1) + k) * ldh + 32 * t);
        for (int c = ((warp - npairs % KW) % KW + KW) % KW; c < cps; c += KW) {
            uint4 w0[4], w1[4];
            bf16_ld_rows(reinterpret_cast<const bf16 *>(sw[k]), n0 + g, Is, (size_t)c * 128 + 32 * t, w0, w1);
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const uint4 xq = __ldg(hr + c * 16 + q);
                const uint32_t f0[4] = {w0[q].x, w1[q].x, w0[q].y, w1[q].y};
                const uint32_t f1[4] = {w0[q].z, w1[q].z, w0[q].w, w1[q].w};
                cu_mma_bf16_16816(acc, f0, xq.x, xq.y);
                cu_mma_bf16_16816(acc, f1, xq.z, xq.w);
            }
        }
    }
    if (t == 0) {
        red[warp][g] = acc[0];
        red[warp][g + 8] = acc[2];
    }
    __syncthreads();
    if (threadIdx.x < 16) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < KW; w++) v += red[w][threadIdx.x];
        y[(size_t)m * H + n0 + threadIdx.x] = __float2bfloat16_rn(v);
    }
}

/* ---- the persistent gate/up kernel (pair 3: this + moe_down2_kernel) ----------------- */

/* Launch 2, persistent: one block of KW warps per SM walks a fixed list of 16-row
 * tiles (H == KW·PER·128, warp w owns chunks w·PER ..). A tile's NVFP4 gate and up
 * bytes go to a two-stage cp.async ring, so the loads of the next two tiles are in
 * flight while the block decodes the current one (pairs 1 and 2 launch a block per
 * tile and wait for all its bytes before any math). x sits in shared memory, the
 * slots' expert pointers too (resolved once per block). A BF16 shared expert's
 * tiles (3.6x the bytes) are "heavy": block b < nh takes heavy tile b first,
 * streamed through registers, and correspondingly fewer light ones; the light
 * tiles (routed, and an NVFP4 shared expert's) are split into contiguous runs by
 * bytes (gu3_range). Epilogue as moe_gateup2_kernel: h in BF16 with the combine
 * weight and the down projection's scale2 folded in. */
typedef struct gu3_slot {
    const uint8_t *gw, *uw, *gs, *us;
    float g2, u2, coef; /* coef: combine weight (or shared gate) · down scale2 */
} gu3_slot;
enum { GU3_KW = 16, GU3_MAXM = 2, GU3_MAXS = GU3_MAXM * (MOE_MAXK + 1) };

/* This block's run [l0, l1) of the nl light tiles, when blocks 0..nh-1 also take one
 * heavy tile of weight wh (light = 1) and nh < G. */
__device__ __forceinline__ void gu3_range(int b, int G, int nh, int nl, float wh, int &l0, int &l1) {
    float ch = ((float)nl + nh * wh) / G - wh, cl = ((float)nl + nh * wh) / G;
    if (ch < 0.f) {
        ch = 0.f;
        cl = (float)nl / (G - nh);
    }
    const float v0 = b <= nh ? b * ch : nh * ch + (b - nh) * cl;
    const float v1 = b + 1 <= nh ? (b + 1) * ch : nh * ch + (b + 1 - nh) * cl;
    l0 = min(nl, (int)(v0 + 0.5f));
    l1 = b == G - 1 ? nl : min(nl, (int)(v1 + 0.5f));
}

/* light tile l -> slot and first row: the NVFP4 shared expert's tiles first (nls of
 * them, tps per token), then the routed ones (tpr per slot) */
__device__ __forceinline__ void gu3_tile(int l, int nls, int tps, int tpr, int k, int &s, int &n0) {
    if (l < nls) {
        s = (l / tps) * (k + 1) + k;
        n0 = (l % tps) * 16;
    } else {
        const int r = l - nls, q = r / tpr;
        s = (q / k) * (k + 1) + q % k;
        n0 = (r % tpr) * 16;
    }
}

template <int PER>
__device__ __forceinline__ void gu3_issue(const gu3_slot *sd, int l, int l1, int nls, int tps, int tpr, int k, int H,
                                          int c0, int g, int t, uint4 *my, uint16_t (&sc)[PER][4]) {
    if (l < l1) {
        int s, n0;
        gu3_tile(l, nls, tps, tpr, k, s, n0);
        const gu3_slot &d = sd[s];
        const size_t rb = (size_t)(n0 + g) * (H / 2) + c0 * 64 + 16 * t, r8 = (size_t)8 * (H / 2);
#pragma unroll
        for (int u = 0; u < PER; u++) {
            cu_cp_async16(my + (u * 4 + 0) * 32, d.gw + rb + u * 64);
            cu_cp_async16(my + (u * 4 + 1) * 32, d.gw + rb + r8 + u * 64);
            cu_cp_async16(my + (u * 4 + 2) * 32, d.uw + rb + u * 64);
            cu_cp_async16(my + (u * 4 + 3) * 32, d.uw + rb + r8 + u * 64);
        }
        const size_t sb = (size_t)(n0 + g) * (H / 16) + c0 * 8 + 2 * t, s8 = (size_t)8 * (H / 16);
#pragma unroll
        for (int u = 0; u < PER; u++) {
            sc[u][0] = __ldg(reinterpret_cast<const uint16_t *>(d.gs + sb + u * 8));
            sc[u][1] = __ldg(reinterpret_cast<const uint16_t *>(d.gs + sb + s8 + u * 8));
            sc[u][2] = __ldg(reinterpret_cast<const uint16_t *>(d.us + sb + u * 8));
            sc[u][3] = __ldg(reinterpret_cast<const uint16_t *>(d.us + sb + s8 + u * 8));
        }
    }
    cu_cp_async_commit(); /* empty past the run: the group count stays uniform */
}

/* Sum the warps' partial tiles (red: [KW][2][16]) and write h[s, n0 ..] (threads < 16). */
template <int KW>
__device__ __forceinline__ void gu3_finish(float (*red)[2][16], const float (&ag)[4], const float (&au)[4],
                                           const gu3_slot *sd, int s, int n0, int warp, int g, int t,
                                           bf16 *__restrict__ hout, int ldh) {
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
        for (int w = 0; w < KW; w++) {
            gv += red[w][0][threadIdx.x];
            uv += red[w][1][threadIdx.x];
        }
        const gu3_slot &d = sd[s];
        gv *= d.g2;
        uv *= d.u2;
        hout[(size_t)s * ldh + n0 + threadIdx.x] = __float2bfloat16_rn(gv / (1.f + __expf(-gv)) * uv * d.coef);
    }
}

template <int PER>
__device__ __forceinline__ void gu3_step(const gu3_slot *sd, int l, int l1, int nls, int tps, int tpr, int k, int H,
                                         int c0, int warp, int g, int t, uint4 *my, uint16_t (&sc)[PER][4],
                                         const uint4 *xs4, float (*red)[2][16], bf16 *__restrict__ hout, int ldh) {
    int s, n0;
    gu3_tile(l, nls, tps, tpr, k, s, n0);
    cu_cp_async_wait<1>(); /* this tile's group; the next tile's may still fly */
    float ag[4] = {0.f, 0.f, 0.f, 0.f}, au[4] = {0.f, 0.f, 0.f, 0.f};
    const uint4 *xr = xs4 + ((size_t)(s / (k + 1)) * H + c0 * 128 + 32 * t) / 8;
#pragma unroll
    for (int u = 0; u < PER; u++) {
        uint4 xv[4];
#pragma unroll
        for (int v = 0; v < 4; v++) xv[v] = xr[u * 16 + v];
        cu_w4_chunk_mma(my[(u * 4 + 0) * 32], my[(u * 4 + 1) * 32], sc[u][0], sc[u][1], xv, ag);
        cu_w4_chunk_mma(my[(u * 4 + 2) * 32], my[(u * 4 + 3) * 32], sc[u][2], sc[u][3], xv, au);
    }
    gu3_finish<GU3_KW>(red, ag, au, sd, s, n0, warp, g, t, hout, ldh);
    /* this warp is done with its slice of the stage: refill it with tile l + 2 */
    gu3_issue<PER>(sd, l + 2, l1, nls, tps, tpr, k, H, c0, g, t, my, sc);
}

template <int PER>
__global__ void __launch_bounds__(32 * GU3_KW, 1)
    moe_gateup3_kernel(const gu_params *__restrict__ P, const dn_params *__restrict__ D, int M, int H, int I,
                       int Is, int k, const bf16 *__restrict__ x, const int32_t *__restrict__ idx,
                       const float *__restrict__ wts, bf16 *__restrict__ hout, int ldh) {
    constexpr int KW = GU3_KW;
    extern __shared__ uint4 sm3[]; /* stages [2][KW][PER][4][32], then x [M][H] bf16 */
    __shared__ float red[2][KW][2][16];
    __shared__ gu3_slot sd[GU3_MAXS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int S = M * (k + 1), sbf = P->sbf, tps = Is / 16, tpr = I / 16;
    const int nh = sbf ? M * tps : 0, nls = sbf ? 0 : M * tps, nl = nls + M * k * tpr;
    int l0, l1;
    gu3_range(blockIdx.x, gridDim.x, nh, nl, 3.5f, l0, l1);
    const int c0 = warp * PER;
    uint4 *my0 = sm3 + (size_t)(0 * KW + warp) * PER * 4 * 32 + lane;
    uint4 *my1 = sm3 + (size_t)(1 * KW + warp) * PER * 4 * 32 + lane;
    uint4 *xs4 = sm3 + (size_t)2 * KW * PER * 4 * 32;
    /* x was complete before the router started, and the shared expert does not depend
     * on the routing: its heavy tile runs before the wait for the top-k kernel */
    const uint4 *xg = reinterpret_cast<const uint4 *>(x);
    for (int i = threadIdx.x; i < M * H / 8; i += blockDim.x) xs4[i] = __ldg(xg + i);
    __syncthreads();
    const bool heavy = (int)blockIdx.x < nh;
    const int hm = heavy ? blockIdx.x / tps : 0, hn0 = heavy ? (blockIdx.x % tps) * 16 : 0;
    float hg[4] = {0.f, 0.f, 0.f, 0.f}, hu[4] = {0.f, 0.f, 0.f, 0.f};
    if (heavy) {
        /* the heavy tile: BF16 shared expert rows through registers, gate then up */
        const uint4 *xr = xs4 + ((size_t)hm * H + c0 * 128 + 32 * t) / 8;
#pragma unroll 1
        for (int u = 0; u < PER; u++) {
            uint4 w0[4], w1[4], xv[4];
#pragma unroll
            for (int v = 0; v < 4; v++) xv[v] = xr[u * 16 + v];
            bf16_ld_rows(reinterpret_cast<const bf16 *>(P->sgw), hn0 + g, H, (size_t)(c0 + u) * 128 + 32 * t, w0, w1);
            bf16_chunk_mma(w0, w1, xv, hg);
            bf16_ld_rows(reinterpret_cast<const bf16 *>(P->suw), hn0 + g, H, (size_t)(c0 + u) * 128 + 32 * t, w0, w1);
            bf16_chunk_mma(w0, w1, xv, hu);
        }
    }
    pdl_wait(); /* the top-k choices and weights */
    pdl_trigger();
    if (threadIdx.x < S) {
        const int m = threadIdx.x / (k + 1), j = threadIdx.x % (k + 1);
        gu3_slot d;
        if (j < k) {
            const int ex = idx[m * k + j];
            d.gw = P->gw[ex]; d.uw = P->uw[ex]; d.gs = P->gs[ex]; d.us = P->us[ex];
            d.g2 = P->g2[ex]; d.u2 = P->u2[ex];
            d.coef = D->d2[ex] * wts[m * (k + 1) + j];
        } else {
            d.gw = P->sgw; d.uw = P->suw; d.gs = P->sgs; d.us = P->sus;
            d.g2 = P->sg2; d.u2 = P->su2;
            d.coef = D->sd2 * wts[m * (k + 1) + k];
        }
        sd[threadIdx.x] = d;
    }
    __syncthreads();
    uint16_t sc0[PER][4], sc1[PER][4];
    gu3_issue<PER>(sd, l0, l1, nls, tps, tpr, k, H, c0, g, t, my0, sc0);
    gu3_issue<PER>(sd, l0 + 1, l1, nls, tps, tpr, k, H, c0, g, t, my1, sc1);
    if (heavy) gu3_finish<KW>(red[1], hg, hu, sd, hm * (k + 1) + k, hn0, warp, g, t, hout, ldh);
    for (int l = l0; l < l1; l += 2) {
        gu3_step<PER>(sd, l, l1, nls, tps, tpr, k, H, c0, warp, g, t, my0, sc0, xs4, red[0], hout, ldh);
        if (l + 1 >= l1) break;
        gu3_step<PER>(sd, l + 1, l1, nls, tps, tpr, k, H, c0, warp, g, t, my1, sc1, xs4, red[1], hout, ldh);
    }
    cu_cp_async_wait<0>(); /* nothing may be left in flight into shared memory at exit */
}


/* Raise kernel K's dynamic shared memory limit to `bytes` once it needs more than
 * the default 48 KB (remembered per kernel and per device: a function attribute
 * applies to the current device only, and tensor-parallel ranks launch the same
 * kernel on other GPUs from their own threads; the largest so far per device). */
template <auto K>
static cudaError_t fused_smem(size_t bytes) {
    static size_t have[CU_WS_MAX_DEV];
    int dev = 0;
    cudaError_t c = cudaGetDevice(&dev);
    if (c != cudaSuccess) return c;
    if (dev < 0 || dev >= CU_WS_MAX_DEV) return cudaErrorInvalidDevice;
    size_t h = __atomic_load_n(&have[dev], __ATOMIC_ACQUIRE);
    if (!h) { /* shared memory before L1, so that two blocks of 96 KB fit an SM */
        cudaFuncSetAttribute(K, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
        h = 48 << 10;
        __atomic_store_n(&have[dev], h, __ATOMIC_RELEASE);
    }
    if (bytes <= h) return cudaSuccess;
    c = cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (c == cudaSuccess) __atomic_store_n(&have[dev], bytes, __ATOMIC_RELEASE);
    return c;
}

/* Launch kernel K on st, as a programmatic dependent launch when pdl is set (the
 * kernel may start before its predecessor ends; see pdl_wait). */
template <typename... KArgs, typename... Args>
static cudaError_t fused_launch(int pdl, void (*K)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    cudaError_t c = cudaLaunchKernelEx(&cfg, K, args...);
    return c == cudaSuccess ? cudaGetLastError() : c;
}

/* An integer knob from the environment, read once into *v: def when unset, else
 * the value if it is lo..hi (one digit), else def. Benchmarks only. */
static int fused_knob(int *v, const char *name, int lo, int hi, int def) {
    if (*v < -1) {
        const char *ev = getenv(name);
        *v = ev && ev[0] >= '0' + lo && ev[0] <= '0' + hi && !ev[1] ? ev[0] - '0' : -1;
    }
    return *v >= 0 ? *v : def;
}

/* The shared expert's gate/up blocks before the top-k wait (with PDL): 1 = in the
 * cp.async pair (the default since the H200 round of 17:56: 397B M = 1 57.1 -> 55.4 us,
 * M = 2 92.9 -> 90.9), 2 = in both pairs (until validated), 0 = off:
 * LASTSTAND_MOE_SHARED_EARLY. */
static int fused_early(void) {
    static int force_early = -2;
    return fused_knob(&force_early, "LASTSTAND_MOE_SHARED_EARLY", 0, 2, 1);
}

template <int KW, int PER>
static cudaError_t gateup2_launch(int pdl, int bc, dim3 grid, size_t smem, cudaStream_t st, const gu_params *P,
                                  const dn_params *D, int H, int I, int Is, int k, const void *x, const int32_t *idx,
                                  const float *wts, void *h, int ldh, const uint4 *zero) {
    const int early = fused_early() >= 1;
    auto K = bc ? moe_gateup2_kernel<KW, PER, true> : moe_gateup2_kernel<KW, PER, false>;
    cudaError_t c = bc ? fused_smem<moe_gateup2_kernel<KW, PER, true>>(smem)
                       : fused_smem<moe_gateup2_kernel<KW, PER, false>>(smem);
    if (c != cudaSuccess) return c;
    return fused_launch(pdl, K, grid, dim3(32 * KW), smem, st, P, D, H, I, Is, k, (const bf16 *)x, idx, wts,
                        (bf16 *)h, ldh, early, zero);
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
    if (s->Is > 0 && moe_shared_kind(s) != W_NVFP4 && moe_shared_kind(s) != W_BF16) {
        snprintf(why, n, "needs an NVFP4 or BF16 shared expert, got %s", w_kind_name(moe_shared_kind(s)));
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
            ws_unlock(ws);
            return errf(e, ERR_UNSUPPORTED, "cuda_fused_decode: expert %d is not NVFP4", x);
        }
        gp.gw[x] = (const uint8_t *)gl->data; gp.gs[x] = gl->scale; gp.g2[x] = gl->scale2;
        gp.uw[x] = (const uint8_t *)ul->data; gp.us[x] = ul->scale; gp.u2[x] = ul->scale2;
        dp.dw[x] = (const uint8_t *)dl->data; dp.ds[x] = dl->scale; dp.d2[x] = dl->scale2;
    }
    gp.sbf = dp.sbf = 0;
    if (Is) {
        const w_kind sk = w->sh_gate.kind;
        if ((sk != W_NVFP4 && sk != W_BF16) || w->sh_up.kind != sk || w->sh_down.kind != sk) {
            ws_unlock(ws);
            return errf(e, ERR_UNSUPPORTED,
                        "cuda_fused_decode: shared expert must be all NVFP4 or all BF16 (gate %s, up %s, down %s)",
                        w_kind_name(sk), w_kind_name(w->sh_up.kind), w_kind_name(w->sh_down.kind));
        }
        if (sk == W_BF16) {
            if (((uintptr_t)w->sh_gate.data | (uintptr_t)w->sh_up.data | (uintptr_t)w->sh_down.data) & 15) {
                ws_unlock(ws);
                return errf(e, ERR_UNSUPPORTED, "cuda_fused_decode: BF16 shared expert weights not 16-byte aligned");
            }
            gp.sgw = (const uint8_t *)w->sh_gate.data; gp.sgs = NULL; gp.sg2 = 1.f;
            gp.suw = (const uint8_t *)w->sh_up.data; gp.sus = NULL; gp.su2 = 1.f;
            dp.sdw = (const uint8_t *)w->sh_down.data; dp.sds = NULL; dp.sd2 = 1.f;
            gp.sbf = dp.sbf = 1;
        } else {
            gp.sgw = (const uint8_t *)w->sh_gate.data; gp.sgs = w->sh_gate.scale; gp.sg2 = w->sh_gate.scale2;
            gp.suw = (const uint8_t *)w->sh_up.data; gp.sus = w->sh_up.scale; gp.su2 = w->sh_up.scale2;
            dp.sdw = (const uint8_t *)w->sh_down.data; dp.sds = w->sh_down.scale; dp.sd2 = w->sh_down.scale2;
        }
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
                ws_unlock(ws);
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
            ws_unlock(ws);
            return cu_fail(e, c, "cuda_fused_decode tables");
        }
    }
    const gu_params *dgp = &te->dev->gu;
    const dn_params *ddp = &te->dev->dn;
    const int ldh = I > Is ? I : Is;
    cudaStream_t st = (cudaStream_t)s;
    float *logits = (float *)ws_get(ws, WS_LOGITS, sizeof(float) * FUSED_MAXM * 1024, st, e);
    int32_t *idx = (int32_t *)ws_get(ws, WS_IDX, sizeof(int32_t) * FUSED_MAXM * MOE_MAXK, st, e);
    float *wts = (float *)ws_get(ws, WS_WTS, sizeof(float) * FUSED_MAXM * (MOE_MAXK + 1), st, e);
    float *hws = (float *)ws_get(ws, WS_H, sizeof(float) * FUSED_MAXM * (MOE_MAXK + 1) * ldh, st, e);
    const uint4 *zero = (const uint4 *)ws_get(ws, WS_ZERO, 64, st, e); /* zeroed once, never written */
    if (!logits || !idx || !wts || !hws || !zero) {
        ws_unlock(ws);
        return e->code ? e->code : ERR_NOMEM;
    }
    /* the streaming pair needs H = KW·PER·128 with KW = 16, PER <= 2 or KW = 8, PER <= 4 */
    const int nch = H / 128;
    const int gkw = nch % 16 == 0 && nch / 16 <= 2 ? 16 : nch % 8 == 0 && nch / 8 <= 4 && nch / 8 != 3 ? 8 : 0;
    /* Kernel pair and programmatic dependent launch per shape, from the H200 rounds of
     * 2026-11-29 17:10 and 17:56 (bench/RESULTS.md, doctor, every cell checked): M >= 2:
     * the cp.async pair with PDL (397B M = 2: 100.7 -> 92.6 us NVFP4 shared, 125.5 ->
     * 117.3 BF16 shared; M = 8 and the 35B layer gain too). M = 1 with an NVFP4 shared
     * expert: the cp.async pair with PDL (397B 66.1 -> 58.1 us, 35B 26.5 -> 25.2). M = 1
     * with a BF16 shared expert: the register pair, with PDL on the 35B layer (31.8 ->
     * 27.2 us) but not on the 397B one (66.0 us; 76.2 with PDL, 79.9 with the cp.async
     * pair and PDL: that pair streams the BF16 shared rows through too few registers).
     * LASTSTAND_MOE_FUSED_PAIR = 1 .. 4 and LASTSTAND_MOE_PDL = 0 / 1 / 2 force one
     * (benchmarks only; PDL 2 = not on the register pair's down launch; pair 3 = the
     * persistent gate/up kernel with the cp.async down, 4 = the same with h through
     * shared memory in the down kernel, where they apply: M <= 2, H = 2048 or 4096,
     * fewer BF16 shared tiles than SMs) */
    static int force_pair = -2, force_pdl = -2;
    int pair = M >= 2 || !gp.sbf ? 2 : 1;
    pair = fused_knob(&force_pair, "LASTSTAND_MOE_FUSED_PAIR", 1, 4, pair);
    const int pdl = fused_knob(&force_pdl, "LASTSTAND_MOE_PDL", 0, 2, !(M == 1 && H >= 4096 && gp.sbf));
    if (pair == 2 && !gkw) pair = 1;
    /* the block-column decode (nvfp4.cuh) at M = 1: the default in the register pair
     * since the H200 round of 18:27 (397B BF16 shared 62.2 -> 60.7 us, 35B 25.4 -> 25.1);
     * no gain in the cp.async pair (57.7 vs 57.1, 22.8 vs 22.7), so off there;
     * LASTSTAND_MOE_BC=0 / 1 forces it */
    static int force_bc = -2;
    const int bc = M == 1 && fused_knob(&force_bc, "LASTSTAND_MOE_BC", 0, 1, pair == 1);
    if (pair >= 3) {
        if (!ws->n_sm) {
            int dev = 0, n = 0;
            if (cudaGetDevice(&dev) != cudaSuccess ||
                cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0)
                n = 1;
            ws->n_sm = n;
        }
        const int nh = gp.sbf ? M * (Is / 16) : 0;
        if (M > GU3_MAXM || (nch != GU3_KW && nch != 2 * GU3_KW) || nh >= ws->n_sm) pair = M >= 2 && gkw ? 2 : 1;
    }
    const size_t xsm = sizeof(bf16) * (size_t)M * H;
    cudaError_t c = fused_smem<moe_router_kernel>(xsm);
    float *sgl = logits + FUSED_MAXM * MOE_MAXE;
    const bf16 *wsg = w->has_sh_gate ? (const bf16 *)w->sh_gate_w.data : NULL;
    if (c == cudaSuccess) {
        moe_router_kernel<<<(E + ROUTER_RPB) / ROUTER_RPB, 32 * ROUTER_RPB * ROUTER_Q, xsm, st>>>(
            M, H, E, (const bf16 *)a->x, (const bf16 *)w->router.data, wsg, logits, sgl);
        c = cudaGetLastError();
    }
    if (c == cudaSuccess) {
        static int force_topk = -2;
        /* packed phase 2: the default since the H200 round of 17:56 (397B M = 1 57.1 ->
         * 52.5 us NVFP4 shared, 65.7 -> 61.5 BF16 shared; every preset and M faster);
         * LASTSTAND_MOE_TOPK=1 for the one before */
        const int pack = fused_knob(&force_topk, "LASTSTAND_MOE_TOPK", 1, 2, 2) == 2;
        c = fused_launch(pdl, pack ? moe_topk_kernel<true> : moe_topk_kernel<false>, dim3(M), dim3(32 * TOPK_W), 0, st,
                         H, E, k, (int)w->norm_topk, (const bf16 *)a->x, wsg, (int)(Is > 0), (const float *)logits,
                         (const float *)(wsg ? sgl : NULL), idx, wts);
    }
    if (c == cudaSuccess && pair >= 3) {
        const size_t gsm = (size_t)32 * H + sizeof(bf16) * (size_t)M * H; /* 2 stages of 16 B per 16 rows x 2 matrices x 128 codes per chunk, + x */
        if (nch == GU3_KW) {
            c = fused_smem<moe_gateup3_kernel<1>>(gsm);
            if (c == cudaSuccess)
                c = fused_launch(pdl, moe_gateup3_kernel<1>, dim3(ws->n_sm), dim3(32 * GU3_KW), gsm, st, dgp, ddp, M,
                                 H, I, Is, k, (const bf16 *)a->x, (const int32_t *)idx, (const float *)wts,
                                 (bf16 *)hws, ldh);
        } else {
            c = fused_smem<moe_gateup3_kernel<2>>(gsm);
            if (c == cudaSuccess)
                c = fused_launch(pdl, moe_gateup3_kernel<2>, dim3(ws->n_sm), dim3(32 * GU3_KW), gsm, st, dgp, ddp, M,
                                 H, I, Is, k, (const bf16 *)a->x, (const int32_t *)idx, (const float *)wts,
                                 (bf16 *)hws, ldh);
        }
        const size_t dsm = (size_t)DOWN_KW * DOWN_PMAX * 2 * 32 * 16, dsm3 = (size_t)DOWN_KW * DOWN3_PMAX * 80 * 16;
        dim3 g3d(H / 16, M);
        if (c == cudaSuccess && pair == 3) {
            c = fused_smem<moe_down2_kernel<DOWN_KW, DOWN_PMAX, false>>(dsm);
            if (c == cudaSuccess)
                c = fused_launch(pdl, moe_down2_kernel<DOWN_KW, DOWN_PMAX, false>, g3d, dim3(32 * DOWN_KW), dsm, st,
                                 ddp, H, I, Is, k, (const int32_t *)idx, (const bf16 *)hws, ldh, (bf16 *)a->y, zero);
        } else if (c == cudaSuccess) {
            c = fused_smem<moe_down3_kernel<DOWN_KW, DOWN3_PMAX>>(dsm3);
            if (c == cudaSuccess)
                c = fused_launch(pdl, moe_down3_kernel<DOWN_KW, DOWN3_PMAX>, g3d, dim3(32 * DOWN_KW), dsm3, st, ddp,
                                 H, I, Is, k, (const int32_t *)idx, (const bf16 *)hws, ldh, (bf16 *)a->y);
        }
    } else if (c == cudaSuccess && pair == 2) {
        dim3 g2d(ldh / 16, M * (k + 1));
        const size_t gsm = (size_t)gkw * (nch / gkw) * 4 * 32 * 16;
        if (gkw == 16 && nch == 16) c = gateup2_launch<16, 1>(pdl, bc, g2d, gsm, st, dgp, ddp, H, I, Is, k, a->x, idx, wts, hws, ldh, zero);
        else if (gkw == 16) c = gateup2_launch<16, 2>(pdl, bc, g2d, gsm, st, dgp, ddp, H, I, Is, k, a->x, idx, wts, hws, ldh, zero);
        else if (nch == 8) c = gateup2_launch<8, 1>(pdl, bc, g2d, gsm, st, dgp, ddp, H, I, Is, k, a->x, idx, wts, hws, ldh, zero);
        else if (nch == 16) c = gateup2_launch<8, 2>(pdl, bc, g2d, gsm, st, dgp, ddp, H, I, Is, k, a->x, idx, wts, hws, ldh, zero);
        else c = gateup2_launch<8, 4>(pdl, bc, g2d, gsm, st, dgp, ddp, H, I, Is, k, a->x, idx, wts, hws, ldh, zero);
        if (c == cudaSuccess) c = cudaGetLastError();
        const size_t dsm = (size_t)DOWN_KW * DOWN_PMAX * 2 * 32 * 16;
        if (c == cudaSuccess)
            c = bc ? fused_smem<moe_down2_kernel<DOWN_KW, DOWN_PMAX, true>>(dsm)
                   : fused_smem<moe_down2_kernel<DOWN_KW, DOWN_PMAX, false>>(dsm);
        if (c == cudaSuccess) {
            dim3 g3d(H / 16, M);
            c = fused_launch(pdl, bc ? moe_down2_kernel<DOWN_KW, DOWN_PMAX, true> : moe_down2_kernel<DOWN_KW, DOWN_PMAX, false>,
                             g3d, dim3(32 * DOWN_KW), dsm, st, ddp, H, I, Is, k, (const int32_t *)idx,
                             (const bf16 *)hws, ldh, (bf16 *)a->y, zero);
        }
    } else {
        if (c == cudaSuccess) {
            dim3 g2d(ldh / 16, M * (k + 1));
            c = fused_launch(pdl, bc ? moe_gateup_kernel<true> : moe_gateup_kernel<false>, g2d, dim3(256), 0, st, dgp,
                             M, H, I, Is, k, (const bf16 *)a->x, (const int32_t *)idx, hws, ldh, zero,
                             (int)(fused_early() >= 2));
        }
        if (c == cudaSuccess) {
            dim3 g3d(H / 16, M);
            c = fused_launch(pdl == 1, bc ? moe_down_kernel<true> : moe_down_kernel<false>, g3d, dim3(256), 0, st, ddp, M,
                             H, I, Is, k, (const int32_t *)idx, (const float *)wts, (const float *)hws, ldh,
                             (bf16 *)a->y);
        }
    }
    if (c == cudaSuccess && (a->topk_idx || a->topk_w)) {
        /* optional outputs: device copies of the choices */
        if (a->topk_idx) c = cudaMemcpyAsync(a->topk_idx, idx, sizeof(int32_t) * M * k, cudaMemcpyDeviceToDevice, st);
        if (c == cudaSuccess && a->topk_w)
            c = cudaMemcpy2DAsync(a->topk_w, sizeof(float) * k, wts, sizeof(float) * (k + 1), sizeof(float) * k, M,
                                  cudaMemcpyDeviceToDevice, st);
    }
    ws_unlock(ws);
    if (c != cudaSuccess) return cu_fail(e, c, "moe cuda_fused_decode");
    return 0;
}

/* graph_safe: no host round trip; its tables are uploaded on the first call per layer (up to
 * TAB_CACHE layers per device) and its buffers have fixed sizes, so after a warm-up call a
 * capture records kernels only */
const moe_impl moe_cuda_fused_decode = {"cuda_fused_decode", DEV_CUDA, 0, fused_supported, fused_run, 1};

/* ---- cuda_expert_loop ------------------------------------------------------------- */


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
    float *logits = (float *)ws_get(ws, WS_LOGITS, sizeof(float) * M * E, st, e);
    int32_t *idx = (int32_t *)ws_get(ws, WS_IDX, sizeof(int32_t) * Mk, st, e);
    float *wts = (float *)ws_get(ws, WS_WTS, sizeof(float) * M * (k + 1), st, e);
    int32_t *perm = (int32_t *)ws_get(ws, WS_PERM, sizeof(int32_t) * Mk, st, e);
    int32_t *pos = (int32_t *)ws_get(ws, WS_POS, sizeof(int32_t) * Mk, st, e);
    bf16 *xs = (bf16 *)ws_get(ws, WS_XS, sizeof(bf16) * Mk * H, st, e);
    bf16 *G = (bf16 *)ws_get(ws, WS_G, sizeof(bf16) * Mk * I, st, e);
    bf16 *U = (bf16 *)ws_get(ws, WS_U, sizeof(bf16) * Mk * I, st, e);
    bf16 *Y = (bf16 *)ws_get(ws, WS_Y, sizeof(bf16) * Mk * H, st, e);
    if (!logits || !idx || !wts || !perm || !pos || !xs || !G || !U || !Y) return e->code ? e->code : ERR_NOMEM;
    bf16 *Gs = NULL, *Us = NULL, *S = NULL;
    if (Is) {
        Gs = (bf16 *)ws_get(ws, WS_GS, sizeof(bf16) * M * Is, st, e);
        Us = (bf16 *)ws_get(ws, WS_US, sizeof(bf16) * M * Is, st, e);
        S = (bf16 *)ws_get(ws, WS_S, sizeof(bf16) * M * H, st, e);
        if (!Gs || !Us || !S) return e->code ? e->code : ERR_NOMEM;
    }
    int rc = cu_lt_gemm(M, E, H, w->router.data, a->x, logits, 1, 1.f, 0.f, st, e);
    if (rc) return err_prefix(e, "cuda_expert_loop router");
    moe_topk_kernel<false><<<M, 32 * TOPK_W, 0, st>>>(H, E, k, w->norm_topk, (const bf16 *)a->x,
                                               w->has_sh_gate ? (const bf16 *)w->sh_gate_w.data : NULL, Is > 0,
                                               logits, NULL, idx, wts);
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
    ws_unlock(ws);
    return rc;
}

const moe_impl moe_cuda_expert_loop = {"cuda_expert_loop", DEV_CUDA, 0, loop_supported, loop_run};
