/* moe_fused.cu: the moe family's fused decode backend on CUDA, cuda_fused_decode
 * (reference/qwen35-and-nvfp4.md 2.5; the family's other CUDA backends: moe.cu,
 * moe_grouped.cu):
 *   p = softmax(x·W_routerᵀ) over E (fp32), top-k (ties: lower index), renormalised
 *   y = Σ_j w_j · down_e(silu(gate_e(x)) · up_e(x)) + sigmoid(x·w_sg) · shared(x)
 * for M <= 8 tokens, NVFP4 routed experts, the shared expert NVFP4 or BF16 (ModelOpt
 * NVFP4 checkpoints may exclude `*.mlp.shared_expert.*` from quantization: the
 * Qwen3.5-397B-A17B one does, and synth does). Four launches, no host round trip,
 * chained by programmatic dependent launch where that was measured faster (see
 * pdl_wait and the choices in fused_run):
 *   (1) router GEMV (4 warps per expert row, x in shared memory; one more row for
 *       the shared gate's logit);
 *   (2) softmax, top-k and the shared gate, a block per token (moe_int.cuh);
 *   (3) gate+up: a block per (token, chosen expert or shared, 16 rows), NVFP4 rows
 *       decoded in registers into mma.sync m16n8k16, then SiLU·up;
 *   (4) down: a block per (token, 16 output rows) sums every chosen expert and an
 *       NVFP4 shared one with the combine weight · scale2 folded in.
 * Kernel pairs for (3)+(4), chosen per shape from H200 runs (fused_run): the
 * cp.async pair (fp4_gemm's streaming pipeline, h in BF16 with the combine weight
 * applied; the default) and the register-staged pair (weights in registers, h in
 * fp32, token in column 0; where the cp.async pair's H does not fit). NVFP4 decode
 * forms (nvfp4.cuh): byte permutes; block-column at M = 1 (scale blocks in the mma
 * columns; the register pair's default there).
 * A BF16 shared expert (the Qwen3.5-397B-A17B NVFP4 checkpoint's layout) runs inside
 * launches (1) and (2), whose DRAM is otherwise mostly idle and which it does not
 * depend on (SHARED_ROUTE, fused_run): its gate/up rows in the router's grid, its
 * down rows beside the top-k block(s), fp32 results [M, 2·Is] / [M, Is] and ys [M, H];
 * (3) and (4) then take the routed experts only and (4) adds ys. Two forms: one warp a
 * row with FMA, contiguous 512-byte warp loads (2, the default at M <= 2), or m16n8k16
 * tiles with the tokens in the B columns (1, above).
 * At M >= 4 with a BF16 shared expert, three launches (fused_run's DEC, the default there
 * since the H200 round S10 R1): the top-k by the router launch's last blocks (a device
 * ticket), gate/up in 8-warp blocks playing the 16-warp slices (same sums) so that a down
 * block fits beside them and requests its weights during gate/up, and the shared expert's
 * down rows in the down kernel before its wait; bit for bit the four launches' sums in the
 * SHARED_ROUTE=2 form. Those kernels, with the cp.async pair and launch 1's SHARED_ROUTE=2
 * form which the four launches share with them, are in moe_fused_dec.cu (moe_fused_int.cuh:
 * what both files share); this file has the rest and fused_run, which picks the form.
 * The expert pointer tables (30 KB for E = 512) live in device memory, cached per
 * layer and uploaded only when they change (passing them as 20 KB kernel parameters
 * cost ~20 us per call on the H200).
 * Workspace: per device (cu_ws.h), grown on first use and kept on growth (a captured
 * graph's pointers stay valid); calls on one device are serialised by its lock.
 * The same layer in one persistent launch with grid barriers, or in three launches
 * without a top-k launch, was correct and slower (bench/RESULTS.md, "Fused MoE decode,
 * fewer launches (S6)") and was deleted in S7 (last at commit e46fe2c).
 */
#include "ops/cuda/moe_fused_int.cuh"

/* ---- per-device workspace ------------------------------------------------------ */

enum { WS_LOGITS, WS_IDX, WS_WTS, WS_H, WS_ZERO, WS_HS, WS_YS, WS_TICKET, WS_N };
static_assert((int)WS_N <= (int)CU_WS_SLOTS, "moe fused workspace slots");

/* The expert tables in device memory, cached per moe_w (a layer): rebuilt on the
 * host each call (cheap), uploaded only when they changed. */
enum { TAB_CACHE = 128 };
typedef struct tab_entry {
    const moe_w *key;
    fused_tables *host, *dev;
} tab_entry;

typedef struct fused_ws {
    cu_ws ws; /* lock + the WS_* device buffers (cu_ws.h: kept on grow) */
    fused_tables *scratch;
    tab_entry tabs[TAB_CACHE];
    int next_tab;
    int sms; /* the device's SM count, 0 until the first call asks */
} fused_ws;

static fused_ws g_ws[CU_WS_MAX_DEV];

/* This device's workspace, locked (calls on one device are serialised). */
static int ws_lock(fused_ws **out, ls_err *e) {
    int dev = 0, rc = cu_ws_device("moe", &dev, e);
    if (rc) return rc;
    cu_ws_lock(&g_ws[dev].ws);
    *out = &g_ws[dev];
    return 0;
}
static void ws_unlock(fused_ws *w) { cu_ws_unlock(&w->ws); }

/* Device buffer `slot` of at least n bytes (zeroed when allocated). */
static void *ws_get(fused_ws *w, int slot, size_t n, cudaStream_t st, ls_err *e) {
    return cu_ws_get(&w->ws, slot, n, 1, st, "moe", e);
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
 * the router triggers: the router (launched with the attribute by default;
 * LASTSTAND_MOE_ROUTER_PDL=0 without) triggers only after its own pdl_wait
 * (router_wait_trigger), once its weight loads are in flight. PDL through a CUDA graph
 * capture was checked on the H200 (engine's graphs-vs-eager check, greedy ids). */

/* ---- cuda_fused_decode ------------------------------------------------------------- */

/* ---- BF16 fragments --------------------------------------------------------------- */

/* One 128-element K chunk of a 16-row BF16 tile (SHARED_ROUTE=1's shared-expert
 * tiles): w0 / w1 = this lane's 32 weights of rows g and g + 8 (4 x 16 B each, K
 * order), xv = the lane's 32 matching B values (B column g = token g). The same
 * fragments and K permutation as cu_w4_chunk_mma / decode16: bf16x2 word w of the
 * lane's slice pairs with B word w. */
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

/* Launch 1: logits [M, E] = x·Wrᵀ. A block of 16 warps takes 4 expert rows, 4
 * warps a row, each a quarter of H with all its 16-byte loads in flight before
 * the first use (x staged once per block in shared memory: M·H bf16, dynamic);
 * the quarters meet in shared memory. Row E, when there is a shared-expert gate,
 * is its logit x·wsg into sgl [M]. (One warp per whole row until 2026-11-29: 6.3
 * us on the H200 for E = 512, H = 4096, every warp a long serial FMA chain.)
 * LD: 16-byte loads per lane in flight per row quarter (the sums' order does not
 * depend on it). SH (SHARED_ROUTE): block b also computes the BF16 shared expert's
 * gate and up rows 8b .. 8b + 7 as one m16n8k16 tile (A row g = gate row 8b + g,
 * row g + 8 = up row 8b + g; B column n = token n): its 16 warps split H by
 * 128-element chunks, a warp's first SH_CPW chunks (2 x 64 B of each row per lane)
 * requested right after the router rows' loads; hs [M, Is] = silu(gate)·up
 * in fp32. Its grid is max(router blocks, Is / 8): 129 blocks on the 397B layer (128
 * of them with a shared tile), one an SM. */
template <bool SH, int LD>
__global__ void __launch_bounds__(32 * ROUTER_NW, 1)
    moe_router_kernel(int M, int H, int E, const bf16 *__restrict__ x, const bf16 *__restrict__ wr,
                      const bf16 *__restrict__ wsg, float *logits, float *sgl, const bf16 *__restrict__ shg,
                      const bf16 *__restrict__ shu, int Is, float *__restrict__ hs) {
    extern __shared__ uint4 xs4[];
    __shared__ float part[ROUTER_RPB][ROUTER_Q][FUSED_MAXM];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint4 vw[LD];
    const router_part rp = router_issue<LD>(blockIdx.x, H, E, wr, wsg, vw);
    /* SH: this block's shared tile, its first chunks' weights requested right after the
     * router row's */
    const int g = lane >> 2, t = lane & 3, n0 = blockIdx.x * 8, nch = H / 128;
    const bool sh = SH && n0 < Is;
    uint4 sw[SH ? SH_CPW : 1][2][4];
    if (sh) {
#pragma unroll
        for (int u = 0; u < SH_CPW; u++)
            if (warp + ROUTER_NW * u < nch) {
                const size_t o = (size_t)(n0 + g) * H + (size_t)(warp + ROUTER_NW * u) * 128 + 32 * t;
#pragma unroll
                for (int v = 0; v < 4; v++) {
                    sw[u][0][v] = cu_ld_stream16(shg + o + 8 * v);
                    sw[u][1][v] = cu_ld_stream16(shu + o + 8 * v);
                }
            }
    }
    router_wait_trigger();
    const uint4 *xg = reinterpret_cast<const uint4 *>(x);
    for (int i = threadIdx.x; i < M * H / 8; i += blockDim.x) xs4[i] = __ldg(xg + i);
    __syncthreads();
    router_finish<LD>(rp, blockIdx.x, M, H, E, wsg, xs4, vw, part, logits, sgl);
    if (SH && sh) {
        __shared__ float shred[SH ? ROUTER_NW : 1][32][4]; /* [warp][lane][accumulator] */
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        for (int cb = warp; cb < nch; cb += ROUTER_NW * SH_CPW) {
            if (cb != warp) { /* H > 128·ROUTER_NW·SH_CPW: the next chunks */
#pragma unroll
                for (int u = 0; u < SH_CPW; u++)
                    if (cb + ROUTER_NW * u < nch) {
                        const size_t o = (size_t)(n0 + g) * H + (size_t)(cb + ROUTER_NW * u) * 128 + 32 * t;
#pragma unroll
                        for (int v = 0; v < 4; v++) {
                            sw[u][0][v] = cu_ld_stream16(shg + o + 8 * v);
                            sw[u][1][v] = cu_ld_stream16(shu + o + 8 * v);
                        }
                    }
            }
#pragma unroll
            for (int u = 0; u < SH_CPW; u++) {
                const int c = cb + ROUTER_NW * u;
                if (c >= nch) break;
                uint4 xv[4]; /* B column g = token g (zeros past M) */
#pragma unroll
                for (int v = 0; v < 4; v++)
                    xv[v] = g < M ? xs4[((size_t)g * H + (size_t)c * 128 + 32 * t) / 8 + v] : make_uint4(0u, 0u, 0u, 0u);
                bf16_chunk_mma(sw[u][0], sw[u][1], xv, acc);
            }
        }
#pragma unroll
        for (int i = 0; i < 4; i++) shred[warp][lane][i] = acc[i];
        __syncthreads();
        if ((int)threadIdx.x < 8 * M) {
            /* gate row rr, token n: lane (rr, n / 2), accumulator n % 2; up: + 2 */
            const int rr = threadIdx.x & 7, n = threadIdx.x >> 3, l = rr * 4 + (n >> 1);
            float gv = 0.f, uv = 0.f;
#pragma unroll
            for (int w = 0; w < ROUTER_NW; w++) {
                gv += shred[w][l][n & 1];
                uv += shred[w][l][2 + (n & 1)];
            }
            hs[(size_t)n * Is + n0 + rr] = gv / (1.f + __expf(-gv)) * uv;
        }
    }
}
/* Launch 1b: the routing of token m = block m (moe_int.cuh's moe_topk_block). It
 * triggers its dependents first thing, so that gate/up can launch during the router.
 * SH (SHARED_ROUTE): blocks M .. also compute the BF16 shared expert's down
 * projection, ys [M, H] fp32 = gate_m · down_s(hs_m), in tiles of 16 output rows:
 * a tile's Is/128 chunks go to wpt warps (16 / wpt tiles a block), each warp
 * requests its first chunk's weights before it waits for launch 1 (hs and the gate
 * logit); B column n = token n's h times its sigmoid gate in BF16 (the rounding
 * the down kernels apply to h). (Starting the top-k once the router rows were
 * written, counted in device memory, instead of after all of launch 1 was no faster:
 * 60.2 vs 60.0 us, H200 round R1.) */
template <bool SH>
__global__ void __launch_bounds__(32 * TOPK_W)
    moe_topk_kernel(int M, int H, int E, int k, int norm, const bf16 *__restrict__ x, const bf16 *__restrict__ wsg,
                    int has_shared, const float *__restrict__ logits, const float *__restrict__ sgl, int32_t *idx,
                    float *wts, const bf16 *__restrict__ sdw, int Is, int wpt, const float *__restrict__ hs,
                    float *__restrict__ ys) {
    cu_pdl_trigger(); /* gate/up may launch now: it waits for this kernel before it reads the choices */
    if (!SH || (int)blockIdx.x < M) {
        cu_pdl_wait();
        moe_topk_block(blockIdx.x, H, E, k, norm, x, wsg, has_shared, logits, sgl, idx, wts);
        return;
    }
    if constexpr (SH) {
        __shared__ float dred[TOPK_W][32][4]; /* [warp][lane][accumulator] */
        const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
        const int tpb = TOPK_W / wpt, tb = ((int)blockIdx.x - M) * tpb, n0 = (tb + warp / wpt) * 16;
        const int nchs = Is / 128;
        const bool on = n0 < H;
        int c = warp % wpt;
        uint4 w0[4], w1[4];
        if (on && c < nchs) bf16_ld_rows(sdw, n0 + g, Is, (size_t)c * 128 + 32 * t, w0, w1);
        cu_pdl_wait(); /* hs and the gate logit from launch 1 */
        const float cg = g < M ? (wsg ? 1.f / (1.f + __expf(-__ldcg(sgl + g))) : 1.f) : 0.f;
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
        while (on && c < nchs) {
            uint4 xv[4];
            if (g < M) {
                const float4 *hp = reinterpret_cast<const float4 *>(hs + (size_t)g * Is + (size_t)c * 128 + 32 * t);
#pragma unroll
                for (int v = 0; v < 4; v++) {
                    const float4 f0 = __ldcg(hp + 2 * v), f1 = __ldcg(hp + 2 * v + 1);
                    __nv_bfloat162 p0 = __floats2bfloat162_rn(f0.x * cg, f0.y * cg);
                    __nv_bfloat162 p1 = __floats2bfloat162_rn(f0.z * cg, f0.w * cg);
                    __nv_bfloat162 p2 = __floats2bfloat162_rn(f1.x * cg, f1.y * cg);
                    __nv_bfloat162 p3 = __floats2bfloat162_rn(f1.z * cg, f1.w * cg);
                    xv[v] = make_uint4(*reinterpret_cast<uint32_t *>(&p0), *reinterpret_cast<uint32_t *>(&p1),
                                       *reinterpret_cast<uint32_t *>(&p2), *reinterpret_cast<uint32_t *>(&p3));
                }
            } else {
#pragma unroll
                for (int v = 0; v < 4; v++) xv[v] = make_uint4(0u, 0u, 0u, 0u);
            }
            bf16_chunk_mma(w0, w1, xv, acc);
            c += wpt;
            if (c < nchs) bf16_ld_rows(sdw, n0 + g, Is, (size_t)c * 128 + 32 * t, w0, w1);
        }
#pragma unroll
        for (int i = 0; i < 4; i++) dred[warp][lane][i] = acc[i];
        __syncthreads();
        for (int o = threadIdx.x; o < tpb * 16 * M; o += blockDim.x) {
            /* row rr of tile tl, token n: lane (rr % 8, n / 2), accumulator n % 2 (+ 2 for rows 8 ..) */
            const int tl = o / (16 * M), rr = o % 16, n = (o / 16) % M, r0 = (tb + tl) * 16;
            if (r0 >= H) continue;
            const int l = (rr & 7) * 4 + (n >> 1), ai = (n & 1) + 2 * (rr >> 3);
            float v = 0.f;
            for (int w = tl * wpt; w < (tl + 1) * wpt; w++) v += dred[w][l][ai];
            ys[(size_t)n * H + r0 + rr] = v;
        }
    }
}

/* Launch 1b, SHARED_ROUTE=2: blocks b < M the routing of token b (moe_topk_block, after
 * the wait for launch 1); blocks b >= M one output row of the BF16 shared expert's down
 * projection a warp, its Is weights requested before that wait (lane l: 16 B of every
 * 256, 512 contiguous bytes a warp-instruction); then h [M, Is] = silu(gate)·up·sigmoid
 * gate in fp32, staged once per block in shared memory, and ys [M, H] fp32 = h·rowᵀ.
 * Two blocks an SM: M + H/16 blocks, one wave on the 397B layer. */
__global__ void __launch_bounds__(32 * TOPK_W, 2)
    moe_topk_rows_kernel(int M, int H, int E, int k, int norm, const bf16 *__restrict__ x,
                         const bf16 *__restrict__ wsg, const float *__restrict__ logits,
                         const float *__restrict__ sgl, int32_t *idx, float *wts, const bf16 *__restrict__ sdw,
                         int Is, const float *__restrict__ hgu, float *__restrict__ ys) {
    extern __shared__ float hsm[]; /* [M][Is] */
    cu_pdl_trigger(); /* gate/up may launch now: it waits for this kernel before it reads the choices */
    if ((int)blockIdx.x < M) {
        cu_pdl_wait();
        moe_topk_block(blockIdx.x, H, E, k, norm, x, wsg, 1, logits, sgl, idx, wts);
        return;
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int r = ((int)blockIdx.x - M) * TOPK_W + warp;
    const bool on = r < H;
    const bf16 *row = sdw + (size_t)r * Is;
    uint4 vw[SHD_LD];
    if (on) {
#pragma unroll
        for (int c = 0; c < SHD_LD; c++)
            if (lane * 8 + 256 * c < Is) vw[c] = cu_ld_stream16(row + lane * 8 + 256 * c);
    }
    cu_pdl_wait(); /* hgu and the gate logit from launch 1 */
    for (int i = threadIdx.x; i < M * Is; i += blockDim.x) {
        const int m = i / Is, j = i - m * Is;
        const float g = __ldcg(hgu + (size_t)m * 2 * Is + j), u = __ldcg(hgu + (size_t)m * 2 * Is + Is + j);
        const float cg = wsg ? 1.f / (1.f + __expf(-__ldcg(sgl + m))) : 1.f;
        hsm[i] = g / (1.f + __expf(-g)) * u * cg;
    }
    __syncthreads();
    if (!on) return;
    float acc[FUSED_MAXM];
#pragma unroll
    for (int m = 0; m < FUSED_MAXM; m++) acc[m] = 0.f;
    for (int k0 = lane * 8; k0 < Is; k0 += 256 * SHD_LD) {
        if (k0 != lane * 8) {
#pragma unroll
            for (int c = 0; c < SHD_LD; c++)
                if (k0 + 256 * c < Is) vw[c] = cu_ld_stream16(row + k0 + 256 * c);
        }
#pragma unroll
        for (int c = 0; c < SHD_LD; c++) {
            const int kk = k0 + 256 * c;
            if (kk >= Is) break;
            const uint32_t ww[4] = {vw[c].x, vw[c].y, vw[c].z, vw[c].w};
#pragma unroll
            for (int m = 0; m < FUSED_MAXM; m++) {
                if (m >= M) break;
                const float4 h0 = *reinterpret_cast<const float4 *>(hsm + (size_t)m * Is + kk);
                const float4 h1 = *reinterpret_cast<const float4 *>(hsm + (size_t)m * Is + kk + 4);
                const float hv[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const float2 a = bf2_to_f2(ww[u]);
                    acc[m] = fmaf(a.x, hv[2 * u], acc[m]);
                    acc[m] = fmaf(a.y, hv[2 * u + 1], acc[m]);
                }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < FUSED_MAXM; m++) {
        if (m >= M) break;
        const float v = warp_sum(acc[m]);
        if (lane == 0) ys[(size_t)m * H + r] = v;
    }
}
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
/* Launch 2: block (16 rows, slot s = m·(k+1) + j): h[s, rows] = silu(gate)·up, fp32.
 * BC (M = 1): the NVFP4 chunks in block-column form (bc_chunk). */
template <bool BC>
__global__ void __launch_bounds__(256, BC ? 2 : 0) moe_gateup_kernel(const gu_params *__restrict__ P, int M, int H,
                                                         int I, int Is, int k, const bf16 *__restrict__ x,
                                                         const int32_t *__restrict__ idx, float *hws,
                                                         int ldh, const uint4 *__restrict__ zero, int sr) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    /* the shared expert's blocks (j = k) first in launch order (the longest when Is > I);
     * sr (SHARED_ROUTE): routed slots only, the shared expert ran in launches 1 and 1b */
    const int m = sr ? blockIdx.y / k : blockIdx.y / (k + 1), j = sr ? blockIdx.y % k : (blockIdx.y + k) % (k + 1);
    const int s = m * (k + 1) + j;
    cu_pdl_wait();
    cu_pdl_trigger();
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
    if (BC) {
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
                                                       bf16 *__restrict__ y, const float *__restrict__ ys) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int m = blockIdx.y, n0 = blockIdx.x * 16;
    const int cpe = I / 128, cps = Is / 128;
    const int npairs = k * cpe + (ys ? 0 : cps); /* ys (SHARED_ROUTE): the shared expert's result, added at the end */
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
        cu_pdl_wait(); /* h from gate/up (the weights above are already in flight) */
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
    cu_pdl_wait();
    if (BC) bc_rows(acc);
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
        if (ys) v += __ldcg(ys + (size_t)m * H + n0 + threadIdx.x);
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
    fused_ws *ws;
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
    int sbf = 0; /* a BF16 shared expert: launches 1 and 1b take it (SHARED_ROUTE) */
    gp.sgw = gp.suw = gp.sgs = gp.sus = dp.sdw = dp.sds = NULL;
    gp.sg2 = gp.su2 = dp.sd2 = 1.f;
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
            sbf = 1;
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
    /* the streaming pair needs H = KW·PER·128 with KW = 16, PER <= 2 or KW = 8, PER <= 4 (8
     * warps where 16 fit was slower: 397B M = 1 61.4 vs 60.0 us, NVFP4 shared 53.0 vs
     * 50.7, H200 round R1 of 2026-11-29); PER = 3 (H 3072, the 122B) since S13 */
    const int nch = H / 128;
    const int gkw = nch % 16 == 0 && nch / 16 <= 2 ? 16 : nch % 8 == 0 && nch / 8 <= 4 ? 8 : 0;
    /* Where a BF16 shared expert runs (LASTSTAND_MOE_SHARED_ROUTE=1|2 forces one): inside
     * the router and top-k launches, as m16n8k16 tiles (1) or one warp a row (2); 2 at
     * M <= 2, 1 above, from the H200 rounds R1 / R2 of 2026-11-29 (every cell ok; µs,
     * 397B / 35B layer):      M = 1        M = 2        M = 8
     *   in gate/up and down   59.2 / 22.9  111.7 / 35.9  395.4 / 106.3  (removed)
     *   1                     60.0 / 24.1   93.3 / 31.6  294.3 /  82.6
     *   2                     55.4 / 21.3   92.4 / 29.4  312.9 /  90.2
     * (1's tiles read half a sector per lane and instruction; 2 spends 8 FMAs per weight
     * at M = 8 where 1 spends one mma per 16 x 16). */
    static int force_sr = -2;
    int sr = sbf ? fused_knob(&force_sr, "LASTSTAND_MOE_SHARED_ROUTE", 1, 2, M <= 2 ? 2 : 1) : 0;
    /* Kernel pair: the cp.async pair with PDL wherever its H fits (H200 rounds of
     * 2026-11-29 17:10 and 17:56: 397B M = 2 100.7 -> 92.6 us, M = 1 66.1 -> 58.1 with an
     * NVFP4 shared expert; with a BF16 shared expert in the same launches the register
     * pair was faster at M = 1, which SHARED_ROUTE made moot), else the register pair.
     * LASTSTAND_MOE_FUSED_PAIR = 1 / 2 and LASTSTAND_MOE_PDL = 0 / 1 force one
     * (benchmarks). A persistent gate/up kernel (a two-stage cp.async ring over a
     * balanced tile list, with and without h through shared memory in the down kernel)
     * lost (74-87 us at M = 1, round of 17:10) and was removed. */
    static int force_pair = -2, force_pdl = -2;
    int pair = fused_knob(&force_pair, "LASTSTAND_MOE_FUSED_PAIR", 1, 2, 2);
    const int pdl = fused_knob(&force_pdl, "LASTSTAND_MOE_PDL", 0, 1, 1);
    /* launch 1 with the attribute too (router_wait_trigger; H200 device round R1 of
     * 2026-11-29 23:07, with the other decode-step PDL switches: 8-layer synth 35B decode
     * step 1.023 -> 0.941 ms); LASTSTAND_MOE_ROUTER_PDL=0 launches it without */
    static int force_rpdl = -2;
    const int rpdl = pdl && fused_knob(&force_rpdl, "LASTSTAND_MOE_ROUTER_PDL", 0, 1, 1);
    if (pair == 2 && !gkw) pair = 1;
    /* the block-column decode (nvfp4.cuh) at M = 1: the default in the register pair
     * since the H200 round of 18:27 (397B BF16 shared 62.2 -> 60.7 us, 35B 25.4 -> 25.1);
     * no gain in the cp.async pair (57.7 vs 57.1, 22.8 vs 22.7), so off there;
     * LASTSTAND_MOE_BC=0 / 1 forces it */
    static int force_bc = -2;
    const int bc = M == 1 && fused_knob(&force_bc, "LASTSTAND_MOE_BC", 0, 1, pair == 1);
    const size_t xsm = sizeof(bf16) * (size_t)M * H;
    float *sgl = logits + FUSED_MAXM * MOE_MAXE;
    const bf16 *wsg = w->has_sh_gate ? (const bf16 *)w->sh_gate_w.data : NULL;
    const int nrb = (E + ROUTER_RPB) / ROUTER_RPB; /* router blocks: E rows and the shared gate's */
    /* Three launches (DEC = 1) where the BF16 shared expert's layout allows: (1) router rows +
     * the shared expert's gate/up rows (one warp a row), the top-k by the last M router blocks
     * to finish (a device ticket; no top-k launch); (2) gate/up of the routed slots, 8 warps
     * playing the 16-warp slices (V = 2: the same sums, and a down block fits beside two of
     * them on an SM), the expert tables prefetched into L2 (pf); (3) down, with the shared
     * expert's down rows computed before its wait (moe_down2_kernel SHB). The same sums as the
     * SHARED_ROUTE=2 chain bit for bit. H200 round S10 R1 (doctor, chained, µs, four launches
     * -> three, every cell ok against the fp64 reference):
     *   35B            M = 1 20.7 -> 18.2   M = 2 28.8 -> 28.3   M = 4  48.9 -> 44.6   M = 8  83.8 -> 76.7
     *   397B TP-2 rank       36.4 -> 36.5          56.8 -> 57.0         103.7 -> 97.6         177.2 -> 171.5
     *   397B                 57.4 -> 56.6          97.7 -> 94.7                              308.2 -> 305.3
     * but the 40-layer synth 35B decode step (M = 1, CUDA graphs) 2.500 -> 2.527 ms, greedy ids
     * equal: the default from M = 4 on, the four launches below. LASTSTAND_MOE_DEC=0|1 forces
     * one (=3, the four launches with the top-k moved into launch 1, was slower: 35B M = 1 21.3
     * vs 19.4 us, 40-layer step 2.552 vs 2.465 ms; deleted in S11, last at e4fc8bf: bench/RESULTS.md,
     * tidy2). LASTSTAND_MOE_GU_V=1|2,
     * LASTSTAND_MOE_PF=0|1 force those parts (R1: DEC with V = 1 20.1 us at the 35B layer, M = 1;
     * pf no difference in the doctor; the prefetch exists in the V = 2 kernels only, so that
     * the four launches' V = 1 kernels compile as before). The shared gate/up rows as launch 2's first blocks,
     * without a wait (DEC=2 in R1: 35B M = 1 21.5 us, decode step 2.587 ms), were removed. */
    static int force_dec = -2, force_gv = -2, force_pf = -2;
    const int npr = k * (I / 128); /* the down kernel's routed chunks of a token */
    int dec = 0;
    if (sbf && pair == 2 && !bc && Is <= 256 * SHD_LD && npr >= DOWN_KW && npr <= DOWN_KW * DOWN_PMAX) {
        const int def = M >= 4 ? 1 : 0;
        dec = fused_knob(&force_dec, "LASTSTAND_MOE_DEC", 0, 1, def);
    }
    /* V = 2 (8-warp blocks, four an SM) also where the 16-warp blocks (two an SM) would need a second
     * wave: the same sums. H200, S14 (bench/device/genvar.sh, 48-layer synth Qwen3-30B-A3B NVFP4,
     * M = 1: I 768 gives 48 x 9 = 432 blocks for 264 slots): decode step 2.737 -> 2.686 ms, the 129
     * greedy ids identical; the 35B's 256 blocks stay V = 1 (S10 R1: V = 2 slower there) */
    if (!ws->sms) {
        int dev = 0, n = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) !=
                                                      cudaSuccess || n <= 0)
            n = 132;
        ws->sms = n;
    }
    /* gate/up over (rows, slots): the routed slots only with SHARED_ROUTE (always so with DEC) */
    const dim3 g2d(sr ? I / 16 : ldh / 16, sr ? M * k : M * (k + 1)), g3d(H / 16, M);
    const int gv_def = dec == 1 || (gkw == 16 && (long)g2d.x * g2d.y > 2L * ws->sms) ? 2 : 1;
    const int gv2 = fused_knob(&force_gv, "LASTSTAND_MOE_GU_V", 1, 2, gv_def) == 2;
    const int pf = fused_knob(&force_pf, "LASTSTAND_MOE_PF", 0, 1, dec == 1);
    cudaError_t c;
    float *hs = NULL, *ys = NULL;
    int wpt = 1;
    const fused_call fc = {M, H, E, I, Is, k, (int)w->norm_topk, nrb, nch, gkw, ldh, pdl, rpdl, (const bf16 *)a->x,
                           (const bf16 *)w->router.data, wsg, (const bf16 *)w->sh_gate.data,
                           (const bf16 *)w->sh_up.data, (const bf16 *)w->sh_down.data, dgp, ddp, logits, sgl, idx,
                           wts, hws, zero, a->y, st};
    if (dec == 1) { /* moe_fused_dec.cu */
        hs = (float *)ws_get(ws, WS_HS, sizeof(float) * FUSED_MAXM * 2 * Is, st, e);
        unsigned *ticket = (unsigned *)ws_get(ws, WS_TICKET, 64, st, e); /* zeroed once; the kernel resets it */
        if (!hs || !ticket) {
            ws_unlock(ws);
            return e->code ? e->code : ERR_NOMEM;
        }
        c = moe_fused_dec(&fc, gv2, pf, hs, ticket);
    } else {
        if (sr == 2) {
            /* one warp a BF16 shared row in launches 1 and 1b: hgu [M, 2·Is], ys [M, H], fp32 */
            hs = (float *)ws_get(ws, WS_HS, sizeof(float) * FUSED_MAXM * 2 * Is, st, e);
            ys = (float *)ws_get(ws, WS_YS, sizeof(float) * FUSED_MAXM * H, st, e);
            if (!hs || !ys) {
                ws_unlock(ws);
                return e->code ? e->code : ERR_NOMEM;
            }
            c = moe_fused_route_rows(&fc, 0, hs, NULL);
            const size_t hsm = sizeof(float) * (size_t)M * Is;
            if (c == cudaSuccess) c = fused_smem<moe_topk_rows_kernel>(hsm);
            if (c == cudaSuccess)
                c = fused_launch(pdl, moe_topk_rows_kernel, dim3(M + (H + TOPK_W - 1) / TOPK_W), dim3(32 * TOPK_W), hsm,
                                 st, M, H, E, k, (int)w->norm_topk, (const bf16 *)a->x, wsg, (const float *)logits,
                                 (const float *)(wsg ? sgl : NULL), idx, wts, (const bf16 *)w->sh_down.data, Is,
                                 (const float *)hs, ys);
        } else if (sr) {
            hs = (float *)ws_get(ws, WS_HS, sizeof(float) * FUSED_MAXM * Is, st, e);
            ys = (float *)ws_get(ws, WS_YS, sizeof(float) * FUSED_MAXM * H, st, e);
            if (!hs || !ys) {
                ws_unlock(ws);
                return e->code ? e->code : ERR_NOMEM;
            }
            /* shared down: wpt warps a 16-row tile (a power of two, at most the tile's chunks) */
            while (2 * wpt <= Is / 128 && 2 * wpt <= TOPK_W) wpt *= 2;
            c = fused_smem<moe_router_kernel<true, 4>>(xsm);
            const int g1 = nrb > Is / 8 ? nrb : Is / 8;
            if (c == cudaSuccess)
                c = fused_launch(rpdl, moe_router_kernel<true, 4>, dim3(g1), dim3(32 * ROUTER_NW), xsm, st, M, H, E,
                                 (const bf16 *)a->x, (const bf16 *)w->router.data, wsg, logits, sgl,
                                 (const bf16 *)w->sh_gate.data, (const bf16 *)w->sh_up.data, Is, hs);
            const int tpb = TOPK_W / wpt, nsd = (H / 16 + tpb - 1) / tpb;
            if (c == cudaSuccess)
                c = fused_launch(pdl, moe_topk_kernel<true>, dim3(M + nsd), dim3(32 * TOPK_W), 0, st, M, H, E, k,
                                 (int)w->norm_topk, (const bf16 *)a->x, wsg, 1, (const float *)logits,
                                 (const float *)(wsg ? sgl : NULL), idx, wts, (const bf16 *)w->sh_down.data, Is, wpt,
                                 (const float *)hs, ys);
        } else {
            c = fused_smem<moe_router_kernel<false, ROUTER_LD>>(xsm);
            if (c == cudaSuccess)
                c = fused_launch(rpdl, moe_router_kernel<false, ROUTER_LD>, dim3(nrb), dim3(32 * ROUTER_NW), xsm, st, M, H,
                                 E, (const bf16 *)a->x, (const bf16 *)w->router.data, wsg, logits, sgl,
                                 (const bf16 *)nullptr, (const bf16 *)nullptr, 0, (float *)nullptr);
            if (c == cudaSuccess)
                c = fused_launch(pdl, moe_topk_kernel<false>, dim3(M), dim3(32 * TOPK_W), 0, st, M, H, E, k,
                                 (int)w->norm_topk, (const bf16 *)a->x, wsg, (int)(Is > 0), (const float *)logits,
                                 (const float *)(wsg ? sgl : NULL), idx, wts, (const bf16 *)NULL, 0, 1,
                                 (const float *)NULL, (float *)NULL);
        }
        if (c == cudaSuccess && pair == 2) {
            c = moe_fused_gateup2(&fc, bc, gv2, pf, g2d, sr);
            if (c == cudaSuccess) c = cudaGetLastError();
            if (c == cudaSuccess) c = moe_fused_down2(&fc, bc, g3d, ys);
        } else if (c == cudaSuccess) {
            c = fused_launch(pdl, bc ? moe_gateup_kernel<true> : moe_gateup_kernel<false>, g2d, dim3(256), 0, st, dgp, M, H,
                             I, Is, k, (const bf16 *)a->x, (const int32_t *)idx, hws, ldh, zero, sr);
            if (c == cudaSuccess)
                c = fused_launch(pdl, bc ? moe_down_kernel<true> : moe_down_kernel<false>, g3d, dim3(256), 0, st, ddp, M,
                                 H, I, Is, k, (const int32_t *)idx, (const float *)wts, (const float *)hws, ldh,
                                 (bf16 *)a->y, (const float *)ys);
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
