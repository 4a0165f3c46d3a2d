/* fp4_gemv.cu: cuda_w4a16_mma, the small-M backend of fp4_gemm on CUDA:
 * y[M,N] (+)= x[M,K] · Wᵀ with W an NVFP4 weight [N,K] (codes uint8 [N,K/2], E4M3
 * block scales [N,K/16], fp32 scale2), x and y BF16, fp32 accumulation. A
 * memory-bound decode: every kernel streams each weight byte once, decodes E2M1
 * exactly into BF16 in registers and feeds mma.sync m16n8k16 with a 16-row weight
 * tile as the A operand ("swap AB": up to 8 tokens in the n8 columns, so M = 1
 * wastes no weight bytes).
 *
 * Kernels, by M (w4_run picks; the H200 device rounds chose them, bench/RESULTS.md):
 *   M = 1, K = KW * PER * 128 (KW warps of PER chunks, KW in 4, 8, 16, PER in 1, 2, 4:
 *     every K of the 397B and 35B presets): one 16-row tile per block, codes, scales
 *     and x staged with cp.async (nvfp4.cuh for the chunk steps). Per instance
 *     (gv_variant): fp4_gemv2_kernel, the bit-placement decode (half of it on the FMA
 *     pipe, the scale as one HMUL2 per pair, tokens in the B columns) where a device
 *     round validated it and found it faster (8 warps x 4 or x 1 chunks);
 *     else the block-column GEMV (unscaled E2M1 into mma.sync, the 8 B columns spent
 *     on the 8 scale blocks of a chunk so that each E4M3 scale is one fp32 FFMA on an
 *     output): fp4_gemv1t_kernel<L = 0> (32 B of x per lane and chunk) on the
 *     instances validated with it, L = 2 (half the code words through a shared-memory
 *     table) on the 35B ones, fp4_gemv1_kernel on the others (knobs: w4_knobs_load).
 *   M = 1, other K: fp4_w4a16_async_kernel (the M <= 8 mapping, weights by cp.async).
 *   M = 2 .. 8: fp4_w4a16_async_kernel<D = 2> (bit-placement decode, weights by
 *     cp.async, tokens in the B columns) on the instances validated with it, else
 *   M = 2 .. 8 and larger: fp4_w4a16_kernel<MT>, weights in registers, MT n8 tiles of
 *     tokens per block, K split over up to 8 warps.
 *
 * Programmatic dependent launch (sm_90): every kernel here is launched with the
 * programmatic-stream-serialization attribute (w4_launch) and
 *   - calls griddepcontrol.launch_dependents first thing, so the next kernel's blocks
 *     may be scheduled as soon as SM room frees up;
 *   - puts its weight and scale loads in flight (cp.async into shared memory or loads
 *     into registers) BEFORE griddepcontrol.wait, and reads x, reads/writes y only
 *     after it. The weights are constants of the model, so they may be read while the
 *     previous kernel (RMSNorm, the previous projection...) still runs; wait returns
 *     once that kernel completed and its memory is visible. Every thread of every
 *     block executes the wait (so this grid never completes before its predecessor:
 *     the chain stays transitive for a PDL kernel launched after this one).
 * Without the attribute (LASTSTAND_FP4_PDL=0, a GPU before sm_90, or a launch that
 * refused it) both instructions are no-ops and the stream orders the kernels as usual.
 * Inside a CUDA graph capture the attribute becomes a programmatic edge.
 */
#include "ops/cuda/cu_pdl.h"
#include "ops/cuda/fp4_gemm.cuh"
#include "ops/cuda/nvfp4.cuh"

#include <stdlib.h>
#include <string.h>

enum { W4_CHUNK = 128 }; /* K elements per lane-quad per step: 16 B of codes per lane */
enum { W4_U = 4 };       /* chunks in flight per warp in fp4_w4a16_kernel */


/* ---- M <= 8 (and larger M): weights in registers -------------------------------- */

/* MT: n8 token tiles per block (tokens m0 .. m0 + 8·MT). KW: warps splitting K,
 * each owning ceil(nchunks / KW) consecutive chunks, W4_U of them in flight at once.
 * Lane (g, t) loads 16 B of codes of rows g and g + 8 (blocks 2t, 2t + 1 of a chunk),
 * decodes them with byte permutes into bf16 (exact), multiplies by the block scale and
 * feeds 8 mma per chunk with token column g of the B tile. K is permuted inside each
 * lane's 32-element slice identically for A and B. Partial sums of the KW warps meet
 * in shared memory; scale2 is applied once at the end. */
template <int MT, int KW>
__global__ void __launch_bounds__(32 * KW, 1)
    fp4_w4a16_kernel(int M, int N, int K, const bf16 *__restrict__ x, const uint8_t *__restrict__ w,
                     const uint8_t *__restrict__ sc, float scale2, bf16 *__restrict__ y, int accumulate) {
    cu_pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * 16;
    const int m0 = blockIdx.y * 8 * MT;
    const int nchunks = K / W4_CHUNK;
    const int per = (nchunks + KW - 1) / KW;
    const int cbeg = warp * per;
    const int cend = min(nchunks, cbeg + per);

    const uint8_t *wr0 = w + (size_t)(n0 + g) * (K / 2) + 16 * t;
    const uint8_t *wr1 = wr0 + (size_t)8 * (K / 2);
    const uint8_t *sr0 = sc + (size_t)(n0 + g) * (K / 16) + 2 * t;
    const uint8_t *sr1 = sr0 + (size_t)8 * (K / 16);

    float acc[MT][4];
#pragma unroll
    for (int i = 0; i < MT; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

    for (int c = cbeg; c < cend; c += W4_U) {
        uint4 wv0[W4_U], wv1[W4_U];
        uint16_t s0[W4_U], s1[W4_U];
#pragma unroll
        for (int u = 0; u < W4_U; u++) {
            if (c + u < cend) {
                wv0[u] = cu_ld_stream16(wr0 + (size_t)(c + u) * 64);
                wv1[u] = cu_ld_stream16(wr1 + (size_t)(c + u) * 64);
                s0[u] = __ldg(reinterpret_cast<const uint16_t *>(sr0 + (size_t)(c + u) * 8));
                s1[u] = __ldg(reinterpret_cast<const uint16_t *>(sr1 + (size_t)(c + u) * 8));
            }
        }
        cu_pdl_wait(); /* x below (a no-op once passed) */
#pragma unroll
        for (int u = 0; u < W4_U; u++) {
            if (c + u >= cend) break;
            /* decode: 32 codes per row -> 16 bf16x2, regs p = 0..7 use scale block 2t, 8..15 block 2t+1 */
            uint32_t a0[16], a1[16];
            {
                uint32_t sa = cu_scale_bf16x2(s0[u] & 0xff), sb = cu_scale_bf16x2(s0[u] >> 8);
                uint32_t sc0 = cu_scale_bf16x2(s1[u] & 0xff), sc1 = cu_scale_bf16x2(s1[u] >> 8);
                const uint32_t wq0[4] = {wv0[u].x, wv0[u].y, wv0[u].z, wv0[u].w};
                const uint32_t wq1[4] = {wv1[u].x, wv1[u].y, wv1[u].z, wv1[u].w};
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    cu_e2m1x8_to_bf16x8(wq0[q], &a0[4 * q]);
                    cu_e2m1x8_to_bf16x8(wq1[q], &a1[4 * q]);
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        a0[4 * q + r] = cu_bf16x2_mul(a0[4 * q + r], q < 2 ? sa : sb);
                        a1[4 * q + r] = cu_bf16x2_mul(a1[4 * q + r], q < 2 ? sc0 : sc1);
                    }
                }
            }
            const int kx = (c + u) * W4_CHUNK + 32 * t; /* this lane's 32 k values */
#pragma unroll
            for (int i = 0; i < MT; i++) {
                const int m = m0 + 8 * i + g;
                uint32_t b[16];
                if (m < M) {
                    const uint4 *xp = reinterpret_cast<const uint4 *>(x + (size_t)m * K + kx);
#pragma unroll
                    for (int v = 0; v < 4; v++) {
                        uint4 xv = __ldg(xp + v);
                        b[4 * v + 0] = xv.x;
                        b[4 * v + 1] = xv.y;
                        b[4 * v + 2] = xv.z;
                        b[4 * v + 3] = xv.w;
                    }
                } else {
#pragma unroll
                    for (int v = 0; v < 16; v++) b[v] = 0u;
                }
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const uint32_t af[4] = {a0[2 * j], a1[2 * j], a0[2 * j + 1], a1[2 * j + 1]};
                    cu_mma_bf16_16816(acc[i], af, b[2 * j], b[2 * j + 1]);
                }
            }
        }
    }
    cu_pdl_wait(); /* the warps without chunks: y below */

    /* c0,c1: row g, tokens 2t, 2t+1; c2,c3: row g+8, same tokens */
    if (KW > 1) {
        __shared__ float red[KW][MT * 4][32];
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int r = 0; r < 4; r++) red[warp][i * 4 + r][lane] = acc[i][r];
        __syncthreads();
        for (int idx = threadIdx.x; idx < MT * 4 * 32; idx += 32 * KW) {
            int el = idx / 32, l = idx % 32;
            float v = 0.f;
#pragma unroll
            for (int ww = 0; ww < KW; ww++) v += red[ww][el][l];
            int i = el / 4, r = el % 4;
            int n = n0 + (l >> 2) + (r >= 2 ? 8 : 0);
            int m = m0 + 8 * i + 2 * (l & 3) + (r & 1);
            if (m < M && n < N) {
                size_t o = (size_t)m * N + n;
                v *= scale2;
                if (accumulate) v += __bfloat162float(y[o]);
                y[o] = __float2bfloat16_rn(v);
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int r = 0; r < 4; r++) {
                int n = n0 + g + (r >= 2 ? 8 : 0);
                int m = m0 + 8 * i + 2 * t + (r & 1);
                if (m < M && n < N) {
                    size_t o = (size_t)m * N + n;
                    float v = acc[i][r] * scale2;
                    if (accumulate) v += __bfloat162float(y[o]);
                    y[o] = __float2bfloat16_rn(v);
                }
            }
    }
}

/* ---- M = 1, K not a GEMV instance: the M <= 8 mapping, weights by cp.async --------- */

/* One 16-row tile per block, KW warps each owning PER consecutive 128-element chunks
 * of K (K == KW * PER * 128). Every weight byte of the warp's slice is put in flight at
 * once with cp.async into shared memory (in-flight data holds no registers), one
 * commit group per chunk; the warp then waits for chunk u alone, reads it back (each
 * lane its own 16 B, no barrier), decodes it and issues its 8 mma. x is read from L2
 * per chunk after the grid-dependency wait, its rows clamped to M - 1 (a token column
 * >= M only feeds an output column that is never stored). Same fragment mapping and
 * K permutation as fp4_w4a16_kernel. D = 2: the bit-placement decode (nv4_gemv2_chunk,
 * x permuted per chunk in registers): the M = 2..8 default on the instances the gemv4
 * session's R2 validated (w4_run). */
template <int KW, int PER, int D = 0>
__global__ void __launch_bounds__(32 * KW, KW >= 16 ? 2 : 4)
    fp4_w4a16_async_kernel(int M, int N, int K, const bf16 *__restrict__ x, const uint8_t *__restrict__ w,
                           const uint8_t *__restrict__ sc, float scale2, bf16 *__restrict__ y, int accumulate) {
    __shared__ __align__(16) uint4 stage[KW][PER][2][32];
    __shared__ float red[KW][4][32];
    cu_pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * 16, c0 = warp * PER;
    const uint8_t *wr0 = w + (size_t)(n0 + g) * (K / 2) + c0 * 64 + 16 * t;
    const uint8_t *wr1 = wr0 + (size_t)8 * (K / 2);
#pragma unroll
    for (int u = 0; u < PER; u++) {
        cu_cp_async16(&stage[warp][u][0][lane], wr0 + u * 64);
        cu_cp_async16(&stage[warp][u][1][lane], wr1 + u * 64);
        cu_cp_async_commit();
    }
    const uint8_t *sr0 = sc + (size_t)(n0 + g) * (K / 16) + c0 * 8 + 2 * t;
    const uint8_t *sr1 = sr0 + (size_t)8 * (K / 16);
    uint16_t s0[PER], s1[PER];
#pragma unroll
    for (int u = 0; u < PER; u++) {
        s0[u] = __ldg(reinterpret_cast<const uint16_t *>(sr0 + u * 8));
        s1[u] = __ldg(reinterpret_cast<const uint16_t *>(sr1 + u * 8));
    }
    cu_pdl_wait(); /* x and y below */
    const int m = g < M ? g : M - 1;
    const uint4 *xr = reinterpret_cast<const uint4 *>(x + (size_t)m * K + c0 * W4_CHUNK + 32 * t);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int u = 0; u < PER; u++) {
        uint4 xv[4];
#pragma unroll
        for (int v = 0; v < 4; v++) xv[v] = __ldg(xr + u * (W4_CHUNK / 8) + v);
        cu_cp_async_wait_dyn(PER - 1 - u);
        if constexpr (D == 2) {
            const uint4 xp[4] = {nv4_xperm8(xv[0]), nv4_xperm8(xv[1]), nv4_xperm8(xv[2]), nv4_xperm8(xv[3])};
            nv4_gemv2_chunk(cu_lds16(&stage[warp][u][0][lane]), cu_lds16(&stage[warp][u][1][lane]), s0[u], s1[u], xp,
                            acc);
        } else {
            cu_w4_chunk_mma(cu_lds16(&stage[warp][u][0][lane]), cu_lds16(&stage[warp][u][1][lane]), s0[u], s1[u],
                            xv, acc);
        }
    }
    /* c0,c1: row g, tokens 2t, 2t+1; c2,c3: row g+8, same tokens */
#pragma unroll
    for (int r = 0; r < 4; r++) red[warp][r][lane] = acc[r];
    __syncthreads();
    if (threadIdx.x < 128) {
        const int el = threadIdx.x >> 5, l = threadIdx.x & 31;
        const int mo = 2 * (l & 3) + (el & 1);
        if (mo < M) {
            float v = 0.f;
#pragma unroll
            for (int ww = 0; ww < KW; ww++) v += red[ww][el][l];
            const int n = n0 + (l >> 2) + (el >= 2 ? 8 : 0);
            const size_t o = (size_t)mo * N + n;
            v *= D == 2 ? scale2 * 256.f : scale2; /* D = 2: the decode's 2^-126 against the scales' 2^118 */
            if (accumulate) v += __bfloat162float(y[o]);
            y[o] = __float2bfloat16_rn(v);
        }
    }
}

/* ---- M = 1: the block-column GEMV kernels ----------------------------------------
 *
 * Common structure (one 16-row tile per block, KW warps each owning PER consecutive
 * 128-element chunks of K, K == KW * PER * 128): every code byte and scale of the
 * warp's slice is put in flight with cp.async at once, one commit group per chunk
 * (PER groups); then the grid-dependency wait; then the chunk's 256 B of x, one group
 * per chunk (PER more). Chunk u needs its x group, PER + u, so the warp waits until at
 * most PER - 1 - u groups are pending (groups complete in order: its codes and scales
 * are in too), then runs the chunk step of nvfp4.cuh on it. The 16 row sums meet
 * across the warp's 4 lanes t by shuffles and across the KW warps in shared memory. */

/* The GEMV prologue, first half (every GEMV kernel, before griddepcontrol.wait): this
 * warp's codes of rows g and g + 8 (each lane its 16 B of a chunk, as the chunk step reads
 * them back) and its E4M3 scales (lane i copies scale bytes 4 (i % 2) .. + 3 of row i / 2
 * of each chunk), one commit group per chunk u = 0 .. PER - 1. */
template <int PER>
__device__ __forceinline__ void gv_stage_weights(uint4 (&stage)[PER][2][32], uint32_t (&ss)[PER][32],
                                                 const uint8_t *__restrict__ w, const uint8_t *__restrict__ sc,
                                                 int K, int n0, int c0, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const uint8_t *wr0 = w + (size_t)(n0 + g) * (K / 2) + c0 * 64 + 16 * t;
    const uint8_t *wr1 = wr0 + (size_t)8 * (K / 2);
    const uint8_t *sg0 = sc + (size_t)(n0 + (lane >> 1)) * (K / 16) + c0 * 8 + 4 * (lane & 1);
#pragma unroll
    for (int u = 0; u < PER; u++) {
        cu_cp_async16(&stage[u][0][lane], wr0 + u * 64);
        cu_cp_async16(&stage[u][1][lane], wr1 + u * 64);
        nv4_cp_async4(&ss[u][lane], sg0 + u * 8);
        cu_cp_async_commit();
    }
}

/* Second half (after griddepcontrol.wait): the warp's x, 128 values a chunk (lanes 0..15,
 * 16 B each), one commit group per chunk: group PER + u holds chunk u's x. */
template <int PER>
__device__ __forceinline__ void gv_stage_x(uint4 (&xs)[PER][16], const bf16 *__restrict__ x, int c0, int lane) {
    const bf16 *xg = x + (size_t)c0 * W4_CHUNK + 8 * (lane & 15);
#pragma unroll
    for (int u = 0; u < PER; u++) {
        if (lane < 16) cu_cp_async16(&xs[u][lane], xg + u * W4_CHUNK);
        cu_cp_async_commit();
    }
}

/* The GEMV epilogue: r0 / r1 = this warp's sums of rows g / g + 8 in the lanes t = 0;
 * they meet across the KW warps in red (shared, [KW][16]), and threads 0..15 write
 * y[n0 + i] (+)= scale * the sum of row i, the warps added in order 0..KW-1. */
template <int KW>
__device__ __forceinline__ void gv_block_store(float (*red)[16], int warp, int lane, float r0, float r1, int n0,
                                               float scale, bf16 *__restrict__ y, int accumulate) {
    if ((lane & 3) == 0) {
        red[warp][lane >> 2] = r0;
        red[warp][(lane >> 2) + 8] = r1;
    }
    __syncthreads();
    if (threadIdx.x < 16) {
        float v = 0.f;
#pragma unroll
        for (int ww = 0; ww < KW; ww++) v += red[ww][threadIdx.x];
        const int n = n0 + threadIdx.x;
        v *= scale;
        if (accumulate) v += __bfloat162float(y[n]);
        y[n] = __float2bfloat16_rn(v);
    }
}

/* The row sums of the block-column chunk step (acc0 + acc1: row g, acc2 + acc3: row
 * g + 8) over the warp's 4 lanes t, left in every lane. */
__device__ __forceinline__ void gv_quad_sum(const float acc[4], float &r0, float &r1) {
    r0 = acc[0] + acc[1];
    r1 = acc[2] + acc[3];
    r0 += __shfl_xor_sync(0xffffffffu, r0, 1);
    r1 += __shfl_xor_sync(0xffffffffu, r1, 1);
    r0 += __shfl_xor_sync(0xffffffffu, r0, 2);
    r1 += __shfl_xor_sync(0xffffffffu, r1, 2);
}

/* The per-chunk step nv4_gemv1_chunk: lanes whose B column is zero for a half read a
 * 32-byte zero row in shared memory instead of x. */
template <int KW, int PER>
__global__ void __launch_bounds__(32 * KW, KW >= 16 ? 2 : KW >= 8 ? 3 : 6)
    fp4_gemv1_kernel(int N, int K, const bf16 *__restrict__ x, const uint8_t *__restrict__ w,
                     const uint8_t *__restrict__ sc, float scale2, bf16 *__restrict__ y, int accumulate) {
    __shared__ __align__(16) uint4 stage[KW][PER][2][32]; /* codes: rows g, g + 8; lane's 16 B */
    __shared__ __align__(16) uint4 xs[KW][PER][16];       /* x: the chunk's 128 values */
    __shared__ __align__(16) uint4 zb[2];                 /* zeros */
    __shared__ uint32_t ss[KW][PER][32];                  /* E4M3 scales: 16 rows x 8 */
    __shared__ float red[KW][16];
    cu_pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * 16, c0 = warp * PER;
    gv_stage_weights<PER>(stage[warp], ss[warp], w, sc, K, n0, c0, lane);
    cu_pdl_wait(); /* x and y below */
    gv_stage_x<PER>(xs[warp], x, c0, lane);
    if (threadIdx.x < 2) zb[threadIdx.x] = make_uint4(0u, 0u, 0u, 0u);
    __syncthreads();
    /* B column g is this lane's at slot t iff t == g / 2: first half of the slice for
     * even g, second half for odd g; every other (lane, half) reads zeros */
    const bool on = t == (g >> 1);
    const uint4 *pe = on && !(g & 1) ? &xs[warp][0][4 * t] : zb;
    const uint4 *po = on && (g & 1) ? &xs[warp][0][4 * t + 2] : zb;
    const int se = on && !(g & 1) ? 16 : 0, so = on && (g & 1) ? 16 : 0;
    /* K % 128 == 0: a per-thread zero the compiler cannot fold (see nv4_lut_make) */
    const nv4_lut lut = nv4_lut_make((threadIdx.x + 1u) * (uint32_t)(K & 127));
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int u = 0; u < PER; u++) {
        cu_cp_async_wait_dyn(PER - 1 - u);
        __syncwarp(); /* x and scales of chunk u were copied by other lanes */
        const uint16_t *s16 = reinterpret_cast<const uint16_t *>(ss[warp][u]); /* [row][4] */
        float sg[4];
        nv4_e4m3x2_to_f32x2(s16[4 * g + t], sg[0], sg[1]);
        nv4_e4m3x2_to_f32x2(s16[4 * (g + 8) + t], sg[2], sg[3]);
        nv4_gemv1_chunk(cu_lds16(&stage[warp][u][0][lane]), cu_lds16(&stage[warp][u][1][lane]), pe[u * se],
                        pe[u * se + 1], po[u * so], po[u * so + 1], sg, lut, acc);
    }
    /* row g: acc0 + acc1, row g + 8: acc2 + acc3, summed over the 4 lanes t, then the warps */
    float r0, r1;
    gv_quad_sum(acc, r0, r1);
    gv_block_store<KW>(red, warp, lane, r0, r1, n0, scale2, y, accumulate);
}

/* The per-chunk step nv4_gemv1t_chunk<L>: each lane reads only the 32 B of x it feeds
 * (both halves of its block's columns take the same registers), and L of the 4 code
 * word pairs per chunk are decoded through a 32 KB byte -> bf16x2 table (lane i's copy
 * in bank i), built by the block while its loads are in flight (L = 0: no table).
 * Dynamic shared memory, table first (128-byte aligned): gvt_smem_bytes(KW, PER, L). */
static size_t gvt_smem_bytes(int kw, int per, int l) {
    return (l ? NV4_TAB_BYTES : 0) + (size_t)kw * per * (2 * 32 * 16 + 16 * 16 + 32 * 4) + 32 + (size_t)kw * 16 * 4;
}

template <int KW, int PER, int L>
__global__ void __launch_bounds__(32 * KW, KW >= 16 ? 2 : KW >= 8 ? 2 : 4)
    fp4_gemv1t_kernel(int N, int K, const bf16 *__restrict__ x, const uint8_t *__restrict__ w,
                      const uint8_t *__restrict__ sc, float scale2, bf16 *__restrict__ y, int accumulate) {
    extern __shared__ __align__(128) unsigned char gvt_raw[];
    /* table [256][32] u32 (L > 0), then stage[KW][PER][2][32] uint4 (codes), xs[KW][PER][16]
     * uint4, ss[KW][PER][32] u32 (scales), zb[2] uint4 (zeros), red[KW][16] f32 */
    constexpr int TB = L ? NV4_TAB_BYTES : 0;
    constexpr int SO = TB + KW * PER * 1024; /* past the table and the stage */
    uint4(*stage)[PER][2][32] = reinterpret_cast<uint4(*)[PER][2][32]>(gvt_raw + TB);
    uint4(*xs)[PER][16] = reinterpret_cast<uint4(*)[PER][16]>(gvt_raw + SO);
    uint32_t(*ss)[PER][32] = reinterpret_cast<uint32_t(*)[PER][32]>(gvt_raw + SO + KW * PER * 256);
    uint4 *zb = reinterpret_cast<uint4 *>(gvt_raw + SO + KW * PER * 384);
    float(*red)[16] = reinterpret_cast<float(*)[16]>(gvt_raw + SO + KW * PER * 384 + 32);
    cu_pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * 16, c0 = warp * PER;
    gv_stage_weights<PER>(stage[warp], ss[warp], w, sc, K, n0, c0, lane);
    /* K % 128 == 0: a per-thread zero the compiler cannot fold (see nv4_lut_make) */
    const nv4_lut lut = nv4_lut_make((threadIdx.x + 1u) * (uint32_t)(K & 127));
    const uint32_t tab = (uint32_t)__cvta_generic_to_shared(gvt_raw);
    if (L) nv4_tab_build(tab, threadIdx.x, 32 * KW, lut); /* under the loads */
    cu_pdl_wait(); /* x and y below */
    gv_stage_x<PER>(xs[warp], x, c0, lane);
    if (threadIdx.x < 2) zb[threadIdx.x] = make_uint4(0u, 0u, 0u, 0u);
    __syncthreads();
    /* the lane's 32 B of x (its half of its slice) iff t == g / 2, else zeros */
    const bool on = t == (g >> 1);
    const uint4 *px = on ? &xs[warp][0][4 * t + 2 * (g & 1)] : zb;
    const int sx = on ? 16 : 0;
    const uint32_t tl = tab + 4u * (uint32_t)lane;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int u = 0; u < PER; u++) {
        cu_cp_async_wait_dyn(PER - 1 - u);
        __syncwarp(); /* x and scales of chunk u were copied by other lanes */
        const uint16_t *s16 = reinterpret_cast<const uint16_t *>(ss[warp][u]); /* [row][4] */
        float sg[4];
        nv4_e4m3x2_to_f32x2(s16[4 * g + t], sg[0], sg[1]);
        nv4_e4m3x2_to_f32x2(s16[4 * (g + 8) + t], sg[2], sg[3]);
        nv4_gemv1t_chunk<L>(cu_lds16(&stage[warp][u][0][lane]), cu_lds16(&stage[warp][u][1][lane]), px[u * sx],
                            px[u * sx + 1], sg, lut, tl, acc);
    }
    float r0, r1;
    gv_quad_sum(acc, r0, r1);
    gv_block_store<KW>(red, warp, lane, r0, r1, n0, scale2, y, accumulate);
}

/* The per-chunk step nv4_gemv2_chunk (the default at 8 x 4 and 8 x 1, gv_variant): the
 * codes decoded by bit placement, half of the decode's instructions on the FMA pipe (the
 * block-column kernels are bound by the integer pipe), the scale applied to A by one
 * BF16 multiply per pair; every B column carries the token, whose x each warp permutes
 * once per chunk in shared memory into the (i, i + 4) pairing of the decode. 45
 * registers: 4 blocks of 8 warps an SM where fp4_gemv1t_kernel fits 3 (gemv4 session:
 * [16384 x 4096] 17.7 -> 14.8 us a chained call). */
template <int KW, int PER>
__global__ void __launch_bounds__(32 * KW, KW >= 16 ? 2 : KW >= 8 ? 3 : 6)
    fp4_gemv2_kernel(int N, int K, const bf16 *__restrict__ x, const uint8_t *__restrict__ w,
                     const uint8_t *__restrict__ sc, float scale2, bf16 *__restrict__ y, int accumulate) {
    __shared__ __align__(16) uint4 stage[KW][PER][2][32]; /* codes: rows g, g + 8; lane's 16 B */
    __shared__ __align__(16) uint4 xs[KW][PER][16];       /* x: the chunk's 128 values, then permuted */
    __shared__ uint32_t ss[KW][PER][32];                  /* E4M3 scales: 16 rows x 8 */
    __shared__ float red[KW][16];
    cu_pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * 16, c0 = warp * PER;
    gv_stage_weights<PER>(stage[warp], ss[warp], w, sc, K, n0, c0, lane);
    cu_pdl_wait(); /* x and y below */
    gv_stage_x<PER>(xs[warp], x, c0, lane);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int u = 0; u < PER; u++) {
        cu_cp_async_wait_dyn(PER - 1 - u);
        if (lane < 16) xs[warp][u][lane] = nv4_xperm8(xs[warp][u][lane]); /* its own copy */
        __syncwarp(); /* permuted x and the scales of chunk u, written by other lanes */
        const uint16_t *s16 = reinterpret_cast<const uint16_t *>(ss[warp][u]); /* [row][4] */
        const uint4 xp[4] = {xs[warp][u][4 * t], xs[warp][u][4 * t + 1], xs[warp][u][4 * t + 2],
                             xs[warp][u][4 * t + 3]};
        nv4_gemv2_chunk(cu_lds16(&stage[warp][u][0][lane]), cu_lds16(&stage[warp][u][1][lane]), s16[4 * g + t],
                        s16[4 * (g + 8) + t], xp, acc);
    }
    /* token 0 is column 0: lanes t = 0 hold rows g (c0) and g + 8 (c2); 256: the
     * decode's 2^-126 against the scales' 2^118 */
    gv_block_store<KW>(red, warp, lane, acc[0], acc[2], n0, scale2 * 256.f, y, accumulate);
}

/* ---- host side ------------------------------------------------------------------ */

/* Per device: SM count, compute capability, and whether launches carry the PDL
 * attribute (1 = yes, 0 = no: knob off, before sm_90, or a launch refused it). */
typedef struct w4_dev {
    int init, sms, pdl;
} w4_dev;
static w4_dev g_w4_dev[CU_WS_MAX_DEV];

/* Knobs, read once (benchmarks and the device rounds; unset in production):
 *   LASTSTAND_FP4_PDL=0        launch without programmatic dependent launch
 *   LASTSTAND_W4A16_GDEC=2     the bit-placement GEMV kernel at M = 1 (fp4_gemv2_kernel) on
 *                              every instance; =1 on none (the byte-permute kernels); unset:
 *                              where a device round validated it (gv_variant)
 *   LASTSTAND_W4A16_M8=2|1     M = 2..8: the cp.async kernel with the bit-placement decode
 *                              on every instance that fits (2) or none (1: the register
 *                              kernel); unset: on the validated ones (w4_run) */
static int g_knob_pdl = -1, g_knob_gdec = 0, g_knob_m8 = 0;
static pthread_once_t g_knob_once = PTHREAD_ONCE_INIT;
static void w4_knobs_load(void) {
    const char *p = getenv("LASTSTAND_FP4_PDL"), *gd = getenv("LASTSTAND_W4A16_GDEC");
    g_knob_pdl = p && !strcmp(p, "0") ? 0 : 1;
    g_knob_gdec = gd && !strcmp(gd, "2") ? 2 : gd && !strcmp(gd, "1") ? 1 : 0;
    const char *m8 = getenv("LASTSTAND_W4A16_M8");
    g_knob_m8 = m8 && !strcmp(m8, "2") ? 2 : m8 && !strcmp(m8, "1") ? 1 : 0;
}

static int w4_dev_get(w4_dev **out, ls_err *e) {
    pthread_once(&g_knob_once, w4_knobs_load);
    int dev = 0;
    CU_TRY(e, cudaGetDevice(&dev), "cudaGetDevice");
    if (dev < 0 || dev >= CU_WS_MAX_DEV)
        return errf(e, ERR_UNSUPPORTED, "cuda_w4a16_mma: device %d out of range (max %d)", dev, CU_WS_MAX_DEV);
    w4_dev *d = &g_w4_dev[dev];
    if (!__atomic_load_n(&d->init, __ATOMIC_ACQUIRE)) {
        int sms = 0, cc = 0;
        CU_TRY(e, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
        CU_TRY(e, cudaDeviceGetAttribute(&cc, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute");
        d->sms = sms > 0 ? sms : 1;
        __atomic_store_n(&d->pdl, g_knob_pdl && cc >= 9, __ATOMIC_RELAXED);
        __atomic_store_n(&d->init, 1, __ATOMIC_RELEASE);
    }
    *out = d;
    return 0;
}

/* Launch kernel K (after its per-device function attributes), with the PDL attribute
 * when the device takes it. A launch that refuses the attribute is retried without it
 * and PDL is turned off for the device. */
template <typename... KArgs, typename... Args>
static int w4_launch(w4_dev *d, void (*K)(KArgs...), size_t have[CU_WS_MAX_DEV], dim3 grid, dim3 block, size_t smem,
                     cudaStream_t st, const char *what, ls_err *e, Args... args) {
    CU_TRY(e, fp4_func_attr((const void *)K, smem, have), what);
    const int pdl = __atomic_load_n(&d->pdl, __ATOMIC_RELAXED);
    cudaError_t c = cu_launch_pdl(pdl, K, grid, block, smem, st, args...);
    if (c != cudaSuccess && pdl) {
        (void)cudaGetLastError();
        c = cu_launch_pdl(0, K, grid, block, smem, st, args...);
        if (c == cudaSuccess) {
            __atomic_store_n(&d->pdl, 0, __ATOMIC_RELAXED);
            log_warn("cuda_w4a16_mma: programmatic dependent launch refused, launching without it");
        }
    }
    if (c == cudaSuccess) c = cudaGetLastError();
    if (c != cudaSuccess) return cu_fail(e, c, what);
    return 0;
}

/* Shorthands: the kernel arguments every fp4 kernel here takes. */
#define W4_ARGS_MNK(a) (a)->M, (a)->w->N, (a)->w->K
#define W4_ARGS_REST(a)                                                                                         \
    (const bf16 *)(a)->x, (const uint8_t *)(a)->w->data, (const uint8_t *)(a)->w->scale, (a)->w->scale2,     \
        (bf16 *)(a)->y, (a)->accumulate

template <int MT, int KW>
static int w4_reg_launch(w4_dev *d, dim3 grid, const gemm_args *a, cudaStream_t st, ls_err *e) {
    static size_t have[CU_WS_MAX_DEV];
    return w4_launch(d, fp4_w4a16_kernel<MT, KW>, have, grid, dim3(32 * KW), 0, st, "fp4_gemm cuda_w4a16_mma", e,
                     W4_ARGS_MNK(a), W4_ARGS_REST(a));
}

template <int MT>
static int w4_reg_launch_kw(w4_dev *d, int kw, dim3 grid, const gemm_args *a, cudaStream_t st, ls_err *e) {
    switch (kw) {
    case 1: return w4_reg_launch<MT, 1>(d, grid, a, st, e);
    case 2: return w4_reg_launch<MT, 2>(d, grid, a, st, e);
    case 4: return w4_reg_launch<MT, 4>(d, grid, a, st, e);
    default: return w4_reg_launch<MT, 8>(d, grid, a, st, e);
    }
}

template <int KW, int PER, int D = 0>
static int w4a_launch(w4_dev *d, const gemm_args *a, cudaStream_t st, ls_err *e) {
    static size_t have[CU_WS_MAX_DEV];
    return w4_launch(d, fp4_w4a16_async_kernel<KW, PER, D>, have, dim3(a->w->N / 16), dim3(32 * KW), 0, st,
                     "fp4_gemm cuda_w4a16_mma (cp.async)", e, W4_ARGS_MNK(a), W4_ARGS_REST(a));
}

/* The GEMV kernel variants at M = 1. */
enum { GV_V1 = 1, GV_T0, GV_T2, GV_V2 };

template <int KW, int PER>
static int gv_launch(w4_dev *d, int v, const gemm_args *a, cudaStream_t st, ls_err *e) {
    const dim3 grid(a->w->N / 16), block(32 * KW);
    const int N = a->w->N, K = a->w->K;
    if (v == GV_T0 || v == GV_T2) {
        static size_t have0[CU_WS_MAX_DEV], have2[CU_WS_MAX_DEV];
        const size_t smem = gvt_smem_bytes(KW, PER, v == GV_T2 ? 2 : 0);
        if (v == GV_T0)
            return w4_launch(d, fp4_gemv1t_kernel<KW, PER, 0>, have0, grid, block, smem, st,
                             "fp4_gemm cuda_w4a16_mma (gemv)", e, N, K, W4_ARGS_REST(a));
        return w4_launch(d, fp4_gemv1t_kernel<KW, PER, 2>, have2, grid, block, smem, st,
                         "fp4_gemm cuda_w4a16_mma (gemv, table decode)", e, N, K, W4_ARGS_REST(a));
    }
    static size_t have1[CU_WS_MAX_DEV], havev2[CU_WS_MAX_DEV];
    if (v == GV_V2)
        return w4_launch(d, fp4_gemv2_kernel<KW, PER>, havev2, grid, block, 0, st,
                         "fp4_gemm cuda_w4a16_mma (gemv, bit-placement decode)", e, N, K, W4_ARGS_REST(a));
    return w4_launch(d, fp4_gemv1_kernel<KW, PER>, have1, grid, block, 0, st, "fp4_gemm cuda_w4a16_mma (gemv)", e,
                     N, K, W4_ARGS_REST(a));
}

static int gv_launch_kw(w4_dev *d, int kw, int per, int v, const gemm_args *a, cudaStream_t st, ls_err *e) {
    if (kw == 16) return per == 1 ? gv_launch<16, 1>(d, v, a, st, e) : gv_launch<16, 2>(d, v, a, st, e);
    if (kw == 8)
        return per == 1 ? gv_launch<8, 1>(d, v, a, st, e)
               : per == 2 ? gv_launch<8, 2>(d, v, a, st, e)
                          : gv_launch<8, 4>(d, v, a, st, e);
    return per == 1 ? gv_launch<4, 1>(d, v, a, st, e)
           : per == 2 ? gv_launch<4, 2>(d, v, a, st, e)
                      : gv_launch<4, 4>(d, v, a, st, e);
}

/* 0 when no GEMV instance fits (K must be KW * PER * 128 with KW in 4, 8, 16 and PER
 * in 1, 2, 4; 16 x 4 is over the 48 KB of static shared memory of fp4_gemv1_kernel).
 * The width tried first: 16 warps when the tiles barely fill the GPU twice (the
 * latency-bound small weights; 8-warp blocks measured slower there in the gemv4
 * session, also with the next GEMV's blocks loading beside them), else 8; then 16, 8, 4. */
static int gv_pick(int nchunks, int ntiles, int sms, int *kw_out, int *per_out) {
    const int first = nchunks % 16 == 0 && nchunks / 16 <= 2 && ntiles <= 2 * sms ? 16 : 8;
    const int order[4] = {first, 16, 8, 4};
    for (int i = 0; i < 4; i++) {
        int k = order[i];
        if (k > nchunks || nchunks % k) continue;
        int per = nchunks / k;
        if ((per == 1 || per == 2 || per == 4) && !(k == 16 && per == 4)) {
            *kw_out = k;
            *per_out = per;
            return 1;
        }
    }
    return 0;
}

/* The M = 1 default per (warps, chunks per warp) instance, from the device rounds
 * (H200, 2026-11-29; the doctor's fp64 check on the 397B and 35B shapes, bench/RESULTS.md):
 * fp4_gemv2_kernel (bit placement) at 8 x 4, the [16384 x 4096] instance (gemv4 session
 * R1: 17.72 -> 14.82 us a chained call, 50% -> 60% of copy bandwidth) and 8 x 1, the
 * [4096 x 1024] one (R2 / R3: 3.09 / 3.00 us against 3.24); at 16 x 2 ([4096 x 4096],
 * [1024 x 4096]) it was as fast or slower (5.82 vs 5.80, 3.46 vs 3.39 us), at 16 x 1 and
 * 4 x 1 (the 35B shapes) as fast (2.41 vs 2.40, 2.15 vs 2.16 us): not switched there;
 * fp4_gemv1t_kernel without a table (its halved x reads: R4, [16384 x 4096] 20.83 ->
 * 19.94 us) where it was validated, 16 x 2; with the table for half the words
 * where that was (R3 and R4 at 16 x 1 and 4 x 1, the 35B shapes, as fast as
 * fp4_gemv1_kernel there); fp4_gemv1_kernel elsewhere. */
static int gv_variant(int kw, int per) {
    if (g_knob_gdec == 2) return GV_V2;
    if (g_knob_gdec != 1 && kw == 8 && (per == 4 || per == 1)) return GV_V2; /* gemv4 R1 / R3, below */
    if ((kw == 16 && per == 2) || (kw == 8 && (per == 1 || per == 4))) return GV_T0;
    if ((kw == 16 && per == 1) || (kw == 4 && per == 1)) return GV_T2;
    return GV_V1;
}

static int w4_supported(const dev_info *d, const gemm_shape *s, char *why, size_t n) {
    if (!fp4_common_supported(d, s, why, n)) return 0;
    if (d->cc_major < 8) {
        snprintf(why, n, "mma.sync bf16 needs compute capability >= 8.0, this GPU is %d.%d", d->cc_major,
                 d->cc_minor);
        return 0;
    }
    if (s->K % W4_CHUNK || s->N % 16) {
        snprintf(why, n, "needs K %% 128 == 0 and N %% 16 == 0 (N=%d K=%d)", s->N, s->K);
        return 0;
    }
    return 1;
}

static int w4_run(const gemm_args *a, ls_stream s, ls_err *e) {
    int rc = fp4_check_args(a, e);
    if (rc) return rc;
    const lin_w *w = a->w;
    if (w->K % W4_CHUNK || w->N % 16)
        return errf(e, ERR_UNSUPPORTED, "cuda_w4a16_mma: needs K %% 128 == 0 and N %% 16 == 0 (N=%d K=%d)", w->N,
                    w->K);
    if (((uintptr_t)a->x | (uintptr_t)w->data) & 15 || (uintptr_t)w->scale & 1)
        return errf(e, ERR_UNSUPPORTED, "cuda_w4a16_mma: x and weight must be 16-byte aligned, scales 2-byte");
    if (a->M <= 0) return 0;
    w4_dev *d;
    if ((rc = w4_dev_get(&d, e))) return rc;
    cudaStream_t st = (cudaStream_t)s;
    const int nchunks = w->K / W4_CHUNK;
    int kw = 0, per = 0;
    /* the GEMV kernels copy the scales 4 bytes at a time (rows are K / 16 bytes, K % 128 == 0) */
    if (a->M == 1 && !((uintptr_t)w->scale & 3) && gv_pick(nchunks, w->N / 16, d->sms, &kw, &per))
        return gv_launch_kw(d, kw, per, gv_variant(kw, per), a, st, e);
    if (a->M >= 2 && a->M <= 8 && g_knob_m8 != 1) {
        /* the cp.async kernel with the bit-placement decode at M = 2..8, where a device
         * round validated it and found it faster (gemv4 R2, every cell ✅: 16 x 2 at
         * [4096 x 4096] M = 2 / 4 / 8 7.64 / 7.73 / 8.27 -> 6.33 / 6.70 / 7.69 us; 8 x 4
         * at [16384 x 4096] 23.20 / 24.04 / 25.64 -> 17.49 / 18.14 / 22.85 us, against
         * the register kernel; R3: 16 x 1, the 35B's [512 x 2048], M = 2 / 8 3.46 / 3.55
         * -> 2.69 / 3.00 us); not at 8 x 1 ([4096 x 1024]: M = 2 3.37 -> 3.26, M = 8
         * 3.56 -> 3.64 us); everywhere it fits with LASTSTAND_W4A16_M8=2 */
        kw = nchunks % 16 == 0 && nchunks / 16 <= 2 && w->N / 16 <= 2 * d->sms ? 16 : 8;
        per = nchunks / kw;
        const int validated = (kw == 16 && per <= 2) || (kw == 8 && per == 4);
        if (!(nchunks % kw) && (per == 1 || per == 2 || (per == 4 && kw == 8)) && (validated || g_knob_m8 == 2)) {
            if (kw == 16) return per == 1 ? w4a_launch<16, 1, 2>(d, a, st, e) : w4a_launch<16, 2, 2>(d, a, st, e);
            return per == 1 ? w4a_launch<8, 1, 2>(d, a, st, e)
                   : per == 2 ? w4a_launch<8, 2, 2>(d, a, st, e)
                              : w4a_launch<8, 4, 2>(d, a, st, e);
        }
    }
    if (a->M == 1) {
        /* the cp.async kernel: 16 warps a tile when the tiles barely fill the GPU twice,
         * else 8 (H200, 2026-11-29: [4096 x 4096] 9.3 vs 9.8 us, [16384 x 4096] 21.1 vs
         * 21.8 us); 1, 2 or 4 chunks per warp (4 only with 8 warps: 48 KB of static
         * shared memory) */
        kw = nchunks % 16 == 0 && nchunks / 16 <= 2 && w->N / 16 <= 2 * d->sms ? 16 : 8;
        per = nchunks / kw;
        if (!(nchunks % kw) && (per == 1 || per == 2 || (per == 4 && kw == 8))) {
            if (kw == 16) return per == 1 ? w4a_launch<16, 1>(d, a, st, e) : w4a_launch<16, 2>(d, a, st, e);
            return per == 1 ? w4a_launch<8, 1>(d, a, st, e)
                   : per == 2 ? w4a_launch<8, 2>(d, a, st, e)
                              : w4a_launch<8, 4>(d, a, st, e);
        }
    }
    /* M <= 8: split K as wide as the chunks allow (the H200 sweep in bench/RESULTS.md:
     * 8 warps of 4 chunks beat 2 warps of 16 at [16384 x 4096]); larger M: about 16
     * warps per SM with loads in flight */
    const int mt = a->M <= 8 ? 1 : a->M <= 16 ? 2 : 4;
    const int mtiles = (a->M + 8 * mt - 1) / (8 * mt);
    if (mtiles > 65535) return errf(e, ERR_UNSUPPORTED, "cuda_w4a16_mma: M=%d too large", a->M);
    const long tiles = (long)(w->N / 16) * mtiles;
    kw = 1;
    if (mt == 1)
        while (kw < 8 && nchunks >= 2 * kw) kw *= 2;
    else
        while (kw < 8 && tiles * kw < 2048 && nchunks >= 2 * kw) kw *= 2;
    const dim3 grid(w->N / 16, mtiles);
    if (mt == 1) return w4_reg_launch_kw<1>(d, kw, grid, a, st, e);
    if (mt == 2) return w4_reg_launch_kw<2>(d, kw, grid, a, st, e);
    return w4_reg_launch_kw<4>(d, kw, grid, a, st, e);
}

const fp4_gemm_impl fp4_gemm_cuda_w4a16_mma = {"cuda_w4a16_mma", DEV_CUDA, 0, w4_supported, w4_run, 1};
