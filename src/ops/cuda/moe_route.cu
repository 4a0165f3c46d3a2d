/* moe_route.cu: cuda_grouped_gemm's routing, launches 2 and 3 of the call that moe_grouped.cu's
 * header describes: the top-k kernels (mg_topk_kernel, mg_topk2_kernel, the mid path's
 * mg_topk_block_kernel) -> idx [M, k], wts [M, k + 1], and the plan kernels (the one-block
 * mg_plan_kernel, the multi-block mg_plan_count_kernel + mg_plan_place_kernel) -> the tile table tile_e, the row permutation perm and the tile counts nt;
 * their launchers (moe_grouped_int.cuh) and the test hooks of moe_grouped_test.h
 * (tests/unit/test_moe_plan_cuda.c). No state of its own: the buffers come from moe_grouped.cu's
 * per-device workspace (mg_ws), the variant choice from its knobs (mg_knobs: plan, topk).
 */
#include "ops/cuda/cu_pdl.h"
#include "ops/cuda/cu_util.h"
#include "ops/cuda/cu_ws.h"
#include "ops/cuda/moe_grouped_int.cuh"
#include "ops/cuda/moe_grouped_test.h"
#include "ops/cuda/moe_int.cuh"

/* ---- 2: top-k ------------------------------------------------------------------- */

/* The softmax's statistics over a warp's logits v (expert lane + 32 i; -inf past E): the max
 * (fmaxf: NaN entries left out) and the sum of expf(v - max) over the experts below E. */
template <int NV>
__device__ __forceinline__ void mg_softmax_stats(const float (&v)[NV], int lane, int E, float &mx, float &sum) {
    mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < NV; i++) mx = fmaxf(mx, v[i]);
    mx = warp_max(mx);
    sum = 0.f;
#pragma unroll
    for (int i = 0; i < NV; i++) sum += lane + 32 * i < E ? expf(v[i] - mx) : 0.f;
    sum = warp_sum(sum);
}

/* The top-k's next pick, the same in every lane: the largest logit left in v over the warp (ties:
 * the lower expert index), set to -inf in v; p = its softmax probability expf(v - mx) / sum.
 * NaN logits (no candidate compares greater) yield expert 0 with p NaN. */
template <int NV>
__device__ __forceinline__ int mg_rank_next(float (&v)[NV], int lane, float mx, float sum, float &p) {
    float bv = -INFINITY;
    int bi = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < NV; i++)
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
    if (bi == 0x7fffffff) { /* NaN logits: no candidate compares greater */
        bi = 0;
        p = __int_as_float(0x7fc00000);
    } else {
#pragma unroll
        for (int i = 0; i < NV; i++)
            if (lane + 32 * i == bi) v[i] = -INFINITY;
        p = expf(bv - mx) / sum;
    }
    return bi;
}

/* Warp per token m: softmax over logits[m, E], the k largest (ties: lower index),
 * renormalised if norm -> idx[m, k], wts[m, 0..k-1]; wts[m, k] = the shared
 * expert's weight. A NaN row yields expert 0 with weight NaN, so the output shows it. */
__global__ void __launch_bounds__(128) mg_topk_kernel(int M, int H, int E, int k, int norm,
                                                      const bf16 *__restrict__ x,
                                                      const bf16 *__restrict__ wsg, int has_shared,
                                                      const float *__restrict__ logits,
                                                      int32_t *__restrict__ idx, float *__restrict__ wts) {
    const int lane = threadIdx.x & 31;
    const int m = blockIdx.x * 4 + (threadIdx.x >> 5);
    if (m >= M) return;
    const float *lg = logits + (size_t)m * E;
    float v[32]; /* expert lane + 32 i */
#pragma unroll
    for (int i = 0; i < 32; i++) {
        int ex = lane + 32 * i;
        v[i] = ex < E ? lg[ex] : -INFINITY;
    }
    float mx, sum;
    mg_softmax_stats(v, lane, E, mx, sum);
    float psum = 0.f, pj[MG_MAXK];
    int ij[MG_MAXK];
    for (int j = 0; j < k; j++) {
        float p;
        const int bi = mg_rank_next(v, lane, mx, sum, p);
        ij[j] = bi;
        pj[j] = p;
        psum += p;
    }
    float sg = has_shared ? 1.f : 0.f;
    if (has_shared && wsg) {
        const bf16 *xm = x + (size_t)m * H;
        float s = 0.f;
        for (int c = lane * 8; c < H; c += 256)
            s = dot_bf16x8(*reinterpret_cast<const uint4 *>(xm + c), *reinterpret_cast<const uint4 *>(wsg + c), s);
        s = warp_sum(s);
        sg = 1.f / (1.f + expf(-s));
    }
    if (lane == 0) {
        for (int j = 0; j < k; j++) {
            idx[(size_t)m * k + j] = ij[j];
            wts[(size_t)m * (k + 1) + j] = norm ? pj[j] / psum : pj[j];
        }
        wts[(size_t)m * (k + 1) + k] = sg;
    }
}

/* mg_topk_kernel with the same outputs, bit for bit (LASTSTAND_MG_TOPK=1, the default): the
 * experts' loops cut to NV = ceil(E/32) registers a lane (NV = 8 at E = 256: a quarter of the
 * compares and expf of the 32-register loops, whose extra entries are -inf, never picked, and add
 * +0.0f to the sum, which changes no bit), the shared gate's x and w_sg loads issued MG_TK_B 16-byte
 * chunks at a time before the first multiply (the old loop waited on one pair of loads per
 * iteration: 8 round trips at H = 2048) and next to the logits' loads, the same fmaf sequence;
 * lane j writes the token's j-th pick (the values every lane holds after the butterflies). */
enum { MG_TK_B = 8 };
template <int NV, int TB = MG_TK_B, int MINB = 0>
__global__ void __launch_bounds__(128, MINB) mg_topk2_kernel(int M, int H, int E, int k, int norm,
                                                       const bf16 *__restrict__ x,
                                                       const bf16 *__restrict__ wsg, int has_shared,
                                                       const float *__restrict__ logits,
                                                       int32_t *__restrict__ idx, float *__restrict__ wts) {
    const int lane = threadIdx.x & 31;
    const int m = blockIdx.x * 4 + (threadIdx.x >> 5);
    if (m >= M) return;
    const float *lg = logits + (size_t)m * E;
    float v[NV]; /* expert lane + 32 i */
#pragma unroll
    for (int i = 0; i < NV; i++) {
        int ex = lane + 32 * i;
        v[i] = ex < E ? lg[ex] : -INFINITY;
    }
    float sg = has_shared ? 1.f : 0.f;
    if (has_shared && wsg) {
        const bf16 *xm = x + (size_t)m * H;
        float s = 0.f;
        for (int c0 = lane * 8; c0 < H; c0 += 256 * TB) {
            uint4 va[TB], vb[TB];
#pragma unroll
            for (int b = 0; b < TB; b++) {
                const int c = c0 + 256 * b;
                if (c < H) {
                    va[b] = *reinterpret_cast<const uint4 *>(xm + c);
                    vb[b] = *reinterpret_cast<const uint4 *>(wsg + c);
                } else {
                    va[b] = vb[b] = make_uint4(0, 0, 0, 0);
                }
            }
#pragma unroll
            for (int b = 0; b < TB; b++) {
                if (c0 + 256 * b >= H) break; /* no extra fmaf: the old kernel's sequence exactly */
                s = dot_bf16x8(va[b], vb[b], s);
            }
        }
        s = warp_sum(s);
        sg = 1.f / (1.f + expf(-s));
    }
    float mx, sum;
    mg_softmax_stats(v, lane, E, mx, sum);
    float psum = 0.f, myp = 0.f;
    int myi = 0;
    for (int j = 0; j < k; j++) {
        float p;
        const int bi = mg_rank_next(v, lane, mx, sum, p);
        if (lane == j) {
            myi = bi;
            myp = p;
        }
        psum += p;
    }
    if (lane < k) {
        idx[(size_t)m * k + lane] = myi;
        wts[(size_t)m * (k + 1) + lane] = norm ? myp / psum : myp;
    }
    if (lane == 0) wts[(size_t)m * (k + 1) + k] = sg;
}

/* The mid-batch path's top-k (LASTSTAND_MG_MID): token m = block m of TOPK_W warps, moe_int.cuh's
 * moe_topk_block (the fused decode's routing: the softmax's and the top-k's work spread over 16
 * warps instead of one warp per token; ranks by counting). Same outputs and tie rule (lower
 * index) as mg_topk_kernel; a NaN row yields NaN weights (the plan clamps indices). */
__global__ void __launch_bounds__(32 * TOPK_W)
    mg_topk_block_kernel(int H, int E, int k, int norm, const bf16 *__restrict__ x, const bf16 *__restrict__ wsg,
                         int has_shared, const float *__restrict__ logits, int32_t *__restrict__ idx,
                         float *__restrict__ wts) {
    cu_pdl_trigger();
    cu_pdl_wait(); /* (with the PDL attribute: the router's logits; no-ops without) */
    moe_topk_block(blockIdx.x, H, E, k, norm, x, wsg, has_shared, logits, NULL, idx, wts);
}

/* ---- 3: plan -------------------------------------------------------------------- */

/* One block of 1024 threads. Slots S = E + has_shared (slot E: the shared
 * expert, M rows). Rows of expert e: [off[e], off[e] + P_e), P_e = c_e rounded
 * up to bm (the GEMM's tile height); the first c_e hold its pairs (any order), the rest are padding
 * (perm = -1). tile_e[t] = the expert of rows [t·BM, (t+1)·BM); *n_tiles = the
 * number of tiles. perm[row] = m·(k+1) + j. */
__global__ void __launch_bounds__(1024) mg_plan_kernel(int M, int E, int k, int has_shared, int bm,
                                                       const int32_t *__restrict__ idx,
                                                       int32_t *__restrict__ tile_e, int32_t *__restrict__ perm,
                                                       int32_t *__restrict__ n_tiles) {
    __shared__ int s_cnt[MG_MAXE + 1], s_off[MG_MAXE + 2], s_cur[MG_MAXE + 1];
    __shared__ int s_wsum[32];
    cu_pdl_trigger();
    cu_pdl_wait(); /* (launched with PDL on the mid-batch path: idx from the top-k) */
    const int tid = threadIdx.x, S = E + (has_shared ? 1 : 0);
    const int Mk = M * k;
    for (int e = tid; e < S; e += 1024) s_cnt[e] = 0;
    __syncthreads();
    /* an index outside 0..E-1 (never from the top-k kernels; a guard for shared memory) counts as expert 0 */
    for (int i = tid; i < Mk; i += 1024) atomicAdd(&s_cnt[(unsigned)idx[i] < (unsigned)E ? idx[i] : 0], 1);
    if (has_shared && tid == 0) s_cnt[E] = M;
    __syncthreads();
    /* exclusive scan of the padded counts; thread tid owns slots 2tid, 2tid+1 */
    const int a0 = 2 * tid, a1 = 2 * tid + 1;
    const int p0 = a0 < S ? (s_cnt[a0] + bm - 1) / bm * bm : 0;
    const int p1 = a1 < S ? (s_cnt[a1] + bm - 1) / bm * bm : 0;
    const int lane = tid & 31, warp = tid >> 5;
    int incl = p0 + p1;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        int t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
    }
    if (lane == 31) s_wsum[warp] = incl;
    __syncthreads();
    if (warp == 0) {
        int w = s_wsum[lane], wi = w;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int t = __shfl_up_sync(0xffffffffu, wi, o);
            if (lane >= o) wi += t;
        }
        s_wsum[lane] = wi - w; /* exclusive prefix of the warp totals */
    }
    __syncthreads();
    const int excl = s_wsum[warp] + incl - (p0 + p1);
    if (a0 < S) s_off[a0] = excl;
    if (a1 < S) s_off[a1] = excl + p0;
    if (tid == 1023) s_off[S] = excl + p0 + p1; /* total rows: the last thread's inclusive sum */
    __syncthreads();
    for (int e = tid; e < S; e += 1024) {
        const int o = s_off[e], c = s_cnt[e], pe = s_off[e + 1] - o;
        for (int t = o / bm; t < (o + pe) / bm; t++) tile_e[t] = e;
        for (int r = o + c; r < o + pe; r++) perm[r] = -1;
        s_cur[e] = o;
    }
    if (tid == 0) {
        n_tiles[0] = s_off[S] / bm;
        n_tiles[1] = s_off[E] / bm; /* the routed experts' tiles; the shared expert's follow */
    }
    __syncthreads();
    for (int i = tid; i < Mk; i += 1024) {
        const int m = i / k, j = i - m * k;
        const int r = atomicAdd(&s_cur[(unsigned)idx[i] < (unsigned)E ? idx[i] : 0], 1);
        perm[r] = m * (k + 1) + j;
    }
    if (has_shared)
        for (int m = tid; m < M; m += 1024) perm[s_off[E] + m] = m * (k + 1) + k;
}

/* The plan by the whole GPU (LASTSTAND_MG_PLAN=1, the default off the mid-batch path): the same
 * tile_e, n_tiles and padding rows as mg_plan_kernel, and the same rows of each expert, in a fixed
 * order: a stable counting sort of the pairs i = m·k + j by expert (ascending i within an expert;
 * mg_plan_kernel's shared-memory atomics leave that order to the warps' timing). The order cannot
 * change y: a row's sums do not depend on its position in a tile, and the down GEMM writes each
 * row to its pair's own place in dbuf (tests/unit/test_moe_plan_cuda.c compares y bit for bit).
 * mg_plan_kernel ran one block of 1024 threads over all M·k pairs: 82 µs at M = 8192, k = 8.
 * Two launches of G = ceil(M·k / MGP_CHUNK) blocks, each block a contiguous chunk of pairs, warp
 * w of it MGP_PER_WARP consecutive pairs (32 at a time, in order):
 *   count  block b's histogram hist[b][e]; the last block out (a device ticket, counted after the
 *          block's stores are fenced; it resets the ticket for the next call or graph replay)
 *          turns the G histograms into pre[b][e] = Σ_{b' < b} hist[b'][e], cnt[e], and the slots'
 *          padded offsets off[0..S] (S = E + has_shared; off[S] = all rows)
 *   place  block b again: warp histograms, seeded with off[e] + pre[b][e] and scanned across the
 *          warps; each pair's row = its warp's base + its rank among the earlier lanes of its
 *          round with the same expert (__match_any_sync) + the earlier rounds'; then, spread over
 *          the grid, tile_e, the padding rows (-1), the shared expert's rows and n_tiles.
 * place is launched with programmatic dependent launch: count lets it go at once (its blocks wait
 * in griddepcontrol.wait, which returns only once count has completed with its memory visible:
 * place reads and writes nothing before that wait, so the early release only hides the launch). */
enum { MGP_THREADS = 256, MGP_WARPS = MGP_THREADS / 32, MGP_ROUNDS = 4, MGP_PER_WARP = 32 * MGP_ROUNDS,
       MGP_CHUNK = MGP_WARPS * MGP_PER_WARP, MGP_LDB = 32 };

/* the expert of pair i, or -1 past the end (an index outside 0..E-1 counts as expert 0, as in
 * mg_plan_kernel) */
__device__ __forceinline__ int mgp_expert(const int32_t *__restrict__ idx, int i, int Mk, int E) {
    if (i >= Mk) return -1;
    const int v = idx[i];
    return (unsigned)v < (unsigned)E ? v : 0;
}

__global__ void __launch_bounds__(MGP_THREADS) mg_plan_count_kernel(int M, int E, int k, int has_shared, int bm,
                                                                    const int32_t *__restrict__ idx,
                                                                    int32_t *__restrict__ hist,
                                                                    int32_t *__restrict__ pre,
                                                                    int32_t *__restrict__ cnt,
                                                                    int32_t *__restrict__ off,
                                                                    unsigned *__restrict__ ticket) {
    __shared__ int s_h[MG_MAXE + 1];
    __shared__ int s_wsum[MGP_WARPS];
    __shared__ int s_last;
    cu_pdl_trigger(); /* place may start: it waits for this grid's completion before any access */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, G = gridDim.x, b = blockIdx.x;
    const int Mk = M * k, S = E + (has_shared ? 1 : 0);
    for (int e = tid; e < E; e += MGP_THREADS) s_h[e] = 0;
    __syncthreads();
    const int i0 = b * MGP_CHUNK + warp * MGP_PER_WARP + lane;
    int ex[MGP_ROUNDS]; /* every load issued before the first shared-memory add (one round trip) */
#pragma unroll
    for (int r = 0; r < MGP_ROUNDS; r++) ex[r] = mgp_expert(idx, i0 + 32 * r, Mk, E);
#pragma unroll
    for (int r = 0; r < MGP_ROUNDS; r++) {
        const int e = ex[r];
        const unsigned mask = __match_any_sync(0xffffffffu, e);
        if (e >= 0 && lane == __ffs(mask) - 1) atomicAdd(&s_h[e], __popc(mask));
    }
    __syncthreads();
    for (int e = tid; e < E; e += MGP_THREADS) hist[(size_t)b * E + e] = s_h[e];
    __threadfence(); /* this thread's histogram entries visible before the ticket */
    __syncthreads();
    if (tid == 0) s_last = atomicAdd(ticket, 1u) == (unsigned)G - 1;
    __syncthreads();
    if (!s_last) return;
    __threadfence();
    /* the last block: column prefix sums over the blocks, MGP_LDB loads in flight (L2: __ldcg) */
    for (int e = tid; e < E; e += MGP_THREADS) {
        int run = 0;
        for (int b0 = 0; b0 < G; b0 += MGP_LDB) {
            int h[MGP_LDB];
#pragma unroll
            for (int q = 0; q < MGP_LDB; q++) h[q] = b0 + q < G ? __ldcg(hist + (size_t)(b0 + q) * E + e) : 0;
#pragma unroll
            for (int q = 0; q < MGP_LDB; q++)
                if (b0 + q < G) {
                    pre[(size_t)(b0 + q) * E + e] = run;
                    run += h[q];
                }
        }
        s_h[e] = run;
    }
    if (has_shared && tid == 0) s_h[E] = M;
    __syncthreads();
    /* exclusive scan of the padded counts: thread tid owns slots tid·P .. tid·P + P - 1 */
    const int P = (S + MGP_THREADS - 1) / MGP_THREADS;
    int loc = 0;
    for (int q = 0; q < P; q++) {
        const int sl = tid * P + q;
        if (sl < S) loc += (s_h[sl] + bm - 1) / bm * bm;
    }
    int incl = loc;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
    }
    if (lane == 31) s_wsum[warp] = incl;
    __syncthreads();
    int wbase = 0;
    for (int w = 0; w < warp; w++) wbase += s_wsum[w];
    int run = wbase + incl - loc;
    for (int q = 0; q < P; q++) {
        const int sl = tid * P + q;
        if (sl < S) {
            off[sl] = run;
            cnt[sl] = s_h[sl];
            run += (s_h[sl] + bm - 1) / bm * bm;
        }
    }
    if (tid == MGP_THREADS - 1) off[S] = run; /* all rows: the last thread's inclusive sum */
    if (tid == 0) *ticket = 0u; /* every block has counted itself; none reads it again */
}

__global__ void __launch_bounds__(MGP_THREADS) mg_plan_place_kernel(int M, int E, int k, int has_shared, int bm,
                                                                    const int32_t *__restrict__ idx,
                                                                    const int32_t *__restrict__ pre,
                                                                    const int32_t *__restrict__ cnt,
                                                                    const int32_t *__restrict__ off,
                                                                    int32_t *__restrict__ tile_e,
                                                                    int32_t *__restrict__ perm,
                                                                    int32_t *__restrict__ n_tiles) {
    __shared__ int s_w[MGP_WARPS][MG_MAXE];
    __shared__ int s_off[MG_MAXE + 2];
    cu_pdl_wait(); /* count's pre, cnt, off (read through L2, __ldcg: no L1 line of this launch's
                    * start can hold them; and the top-k's idx, complete before count began) */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, G = gridDim.x, b = blockIdx.x;
    const int Mk = M * k, S = E + (has_shared ? 1 : 0);
    const int gt = b * MGP_THREADS + tid, gs = G * MGP_THREADS;
    /* every global load issued first (one round trip): the pairs' experts, this block's prefix of
     * the experts tid + 256 q, the padding count of slot gt, the offsets */
    const int i0 = b * MGP_CHUNK + warp * MGP_PER_WARP + lane;
    int ex[MGP_ROUNDS], pv[MG_MAXE / MGP_THREADS];
    unsigned mk[MGP_ROUNDS];
#pragma unroll
    for (int r = 0; r < MGP_ROUNDS; r++) ex[r] = mgp_expert(idx, i0 + 32 * r, Mk, E);
#pragma unroll
    for (int q = 0; q < MG_MAXE / MGP_THREADS; q++)
        pv[q] = tid + q * MGP_THREADS < E ? __ldcg(pre + (size_t)b * E + tid + q * MGP_THREADS) : 0;
    const int c_gt = gt < S ? __ldcg(cnt + gt) : 0;
    for (int sl = tid; sl <= S; sl += MGP_THREADS) s_off[sl] = __ldcg(off + sl);
    for (int e = lane; e < E; e += 32) s_w[warp][e] = 0;
    __syncwarp();
#pragma unroll
    for (int r = 0; r < MGP_ROUNDS; r++) {
        mk[r] = __match_any_sync(0xffffffffu, ex[r]);
        if (ex[r] >= 0 && lane == __ffs(mk[r]) - 1) s_w[warp][ex[r]] += __popc(mk[r]);
        __syncwarp();
    }
    __syncthreads();
#pragma unroll
    for (int q = 0; q < MG_MAXE / MGP_THREADS; q++) {
        const int e = tid + q * MGP_THREADS;
        if (e >= E) break;
        int run = s_off[e] + pv[q];
#pragma unroll
        for (int w = 0; w < MGP_WARPS; w++) {
            const int t = s_w[w][e];
            s_w[w][e] = run;
            run += t;
        }
    }
    __syncthreads();
    const unsigned lt = (1u << lane) - 1u;
#pragma unroll
    for (int r = 0; r < MGP_ROUNDS; r++) {
        const int e = ex[r];
        if (e >= 0) {
            const int i = i0 + 32 * r;
            perm[s_w[warp][e] + __popc(mk[r] & lt)] = i + i / k; /* m·(k+1) + j */
        }
        __syncwarp();
        if (e >= 0 && lane == __ffs(mk[r]) - 1) s_w[warp][e] += __popc(mk[r]);
        __syncwarp();
    }
    /* the tables, spread over the grid */
    const int total = s_off[S];
    for (int t = gt; t < total / bm; t += gs) {
        const int r0 = t * bm;
        int lo = 0, hi = S - 1; /* the last slot whose rows start at or before r0: the non-empty one */
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (s_off[mid] <= r0) lo = mid;
            else hi = mid - 1;
        }
        tile_e[t] = lo;
    }
    for (int sl = gt; sl < S; sl += gs)
        for (int r = s_off[sl] + (sl == gt ? c_gt : __ldcg(cnt + sl)); r < s_off[sl + 1]; r++) perm[r] = -1;
    if (has_shared)
        for (int m = gt; m < M; m += gs) perm[s_off[E] + m] = m * (k + 1) + k;
    if (gt == 0) {
        n_tiles[0] = total / bm;
        n_tiles[1] = s_off[E] / bm; /* the routed experts' tiles; the shared expert's follow */
    }
}

/* ---- launchers ------------------------------------------------------------------ */

/* The top-k launch off the mid path: mg_topk2_kernel at NV = ceil(E/32) (topk), else mg_topk_kernel. */
cudaError_t mg_topk_launch(int topk, int M, int H, int E, int k, int norm, const bf16 *x, const bf16 *wsg,
                           int hs, const float *logits, int32_t *idx, float *wts, cudaStream_t st) {
    const dim3 grid((unsigned)((M + 3) / 4)), blk(128);
    if (!topk)
        mg_topk_kernel<<<grid, blk, 0, st>>>(M, H, E, k, norm, x, wsg, hs, logits, idx, wts);
    else if (E <= 256)
        mg_topk2_kernel<8><<<grid, blk, 0, st>>>(M, H, E, k, norm, x, wsg, hs, logits, idx, wts);
    else if (E <= 512)
        mg_topk2_kernel<16><<<grid, blk, 0, st>>>(M, H, E, k, norm, x, wsg, hs, logits, idx, wts);
    else
        mg_topk2_kernel<32><<<grid, blk, 0, st>>>(M, H, E, k, norm, x, wsg, hs, logits, idx, wts);
    return cudaGetLastError();
}

/* The mid path's top-k (moe_grouped_int.cuh). */
cudaError_t mg_topk_block_launch(int pdl, int M, int H, int E, int k, int norm, const bf16 *x, const bf16 *wsg,
                                 int hs, const float *logits, int32_t *idx, float *wts, cudaStream_t st) {
    return cu_launch_pdl(pdl, mg_topk_block_kernel, dim3(M), dim3(32 * TOPK_W), 0, st, H, E, k, norm, x, wsg, hs,
                         logits, idx, wts);
}

/* The plan: plan 0 mg_plan_kernel (launched with PDL when pdl: the mid path), 1 / 2 the multi-block
 * plan (its place launch with / without PDL); their buffers from ws (MG_PLANB; MG_TICKET: word 0
 * count's ticket). */
int mg_plan_launch(mg_ws *ws, int plan, int pdl, int M, int E, int k, int hs, int bm, const int32_t *idx,
                   int32_t *tile_e, int32_t *perm, int32_t *nt, cudaStream_t st, ls_err *e) {
    if (!plan) {
        CU_TRY(e, cu_launch_pdl(pdl, mg_plan_kernel, dim3(1), dim3(1024), 0, st, M, E, k, hs, bm, idx, tile_e, perm, nt),
               "cuda_grouped_gemm plan");
        return 0;
    }
    const int S = E + hs;
    const int G = (int)(((size_t)M * k + MGP_CHUNK - 1) / MGP_CHUNK);
    const size_t ge = (size_t)G * E;
    int32_t *pb = (int32_t *)mg_get(ws, MG_PLANB, sizeof(int32_t) * (2 * ge + 2 * (size_t)S + 1), st, e);
    unsigned *ticket = (unsigned *)cu_ws_get(&ws->ws, MG_TICKET, 64, 1, st, "cuda_grouped_gemm", e);
    if (!pb || !ticket) return e->code ? e->code : ERR_NOMEM;
    int32_t *hist = pb, *pre = pb + ge, *cnt = pb + 2 * ge, *off = cnt + S;
    mg_plan_count_kernel<<<G, MGP_THREADS, 0, st>>>(M, E, k, hs, bm, idx, hist, pre, cnt, off, ticket);
    CU_LAUNCHED(e, "cuda_grouped_gemm plan count");
    CU_TRY(e,
           cu_launch_pdl(plan == 1, mg_plan_place_kernel, dim3(G), dim3(MGP_THREADS), 0, st, M, E, k, hs, bm, idx,
                         (const int32_t *)pre, (const int32_t *)cnt, (const int32_t *)off, tile_e, perm, nt),
           "cuda_grouped_gemm plan place");
    return 0;
}

/* ---- test hooks (moe_grouped_test.h) --------------------------------------------------- */

extern "C" size_t cuda_mg_plan_tiles_max(int M, int E, int k, int hs, int bm) { return mg_tiles_max(M, E, k, hs, bm); }

/* Time reps calls (after one warm-up) with events on st; *us = the mean. */
template <typename F>
static int mg_time(int reps, float *us, cudaStream_t st, ls_err *e, F call) {
    int rc = call();
    if (rc || reps <= 0) return rc;
    cudaEvent_t a, b;
    CU_TRY(e, cudaEventCreate(&a), "cuda_grouped_gemm test events");
    CU_TRY(e, cudaEventCreate(&b), "cuda_grouped_gemm test events");
    cudaEventRecord(a, st);
    for (int i = 0; i < reps && !rc; i++) rc = call();
    cudaEventRecord(b, st);
    cudaError_t c = cudaEventSynchronize(b);
    float ms = 0.f;
    if (c == cudaSuccess) c = cudaEventElapsedTime(&ms, a, b);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    if (c != cudaSuccess) return cu_fail(e, c, "cuda_grouped_gemm test timing");
    *us = ms * 1000.f / (float)reps;
    return rc;
}

extern "C" int cuda_mg_plan_test(int plan, int M, int E, int k, int hs, int bm, const int32_t *idx, int32_t *tile_e,
                                 int32_t *perm, int32_t *nt, int reps, float *us, ls_stream s, ls_err *e) {
    if (M <= 0 || k < 1 || k > MG_MAXK || E < k || E > MG_MAXE || (bm != 16 && bm != 32 && bm != 64))
        return errf(e, ERR_INVAL, "cuda_mg_plan_test: M=%d E=%d k=%d bm=%d out of range", M, E, k, bm);
    mg_ws *ws;
    int rc = mg_lock(&ws, e);
    if (rc) return rc;
    cudaStream_t st = (cudaStream_t)s;
    rc = mg_time(reps, us, st, e, [&]() {
        return mg_plan_launch(ws, plan, 0, M, E, k, hs ? 1 : 0, bm, idx, tile_e, perm, nt, st, e);
    });
    cu_ws_unlock(&ws->ws);
    return rc;
}

extern "C" int cuda_mg_topk_test(int topk, int M, int H, int E, int k, int norm, const void *x, const void *wsg,
                                 int hs, const float *logits, int32_t *idx, float *wts, int reps, float *us, ls_stream s,
                                 ls_err *e) {
    if (M <= 0 || k < 1 || k > MG_MAXK || E < k || E > MG_MAXE || H % 16)
        return errf(e, ERR_INVAL, "cuda_mg_topk_test: M=%d H=%d E=%d k=%d out of range", M, H, E, k);
    cudaStream_t st = (cudaStream_t)s;
    return mg_time(reps, us, st, e, [&]() {
        cudaError_t c = mg_topk_launch(topk, M, H, E, k, norm, (const bf16 *)x, (const bf16 *)wsg, hs, logits, idx,
                                       wts, st);
        return c == cudaSuccess ? 0 : cu_fail(e, c, "cuda_mg_topk_test");
    });
}
