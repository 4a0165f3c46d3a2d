/* fp4_gemm.cu: the fp4_gemm family on CUDA: y[M,N] (+)= x[M,K] · Wᵀ with W an
 * NVFP4 (ModelOpt) weight [N,K]: codes uint8 [N,K/2] (element 2i in the low
 * nibble), E4M3 block scales [N,K/16], fp32 scale2; x and y BF16, fp32
 * accumulation. W[n,k] = e2m1(code) · e4m3(scale[n,k/16]) · scale2.
 *
 * Backends, three different algorithms:
 *   cuda_w4a16_mma       memory-bound small-M kernel. A block owns 16 weight
 *                        rows and KW warps split K; each lane streams 16-byte
 *                        weight vectors (32 codes = two scale blocks), decodes
 *                        them with byte permutes into bf16 (exact), multiplies
 *                        by the block scale, and feeds mma.sync m16n8k16 with the
 *                        weights as the 16-row A operand and up to 8 tokens per
 *                        n8 tile as B ("swap AB", so M = 1 wastes no weight
 *                        bytes). K is permuted inside each lane's 32-element
 *                        slice identically for A and B (a dot product does not
 *                        care about order). Partial sums of the KW warps meet in
 *                        shared memory; scale2 is applied once at the end.
 *                        At M = 1 the block-column GEMV kernel (nvfp4.cuh)
 *                        when K = KW * PER * 128 fits it: weights, scales and
 *                        x staged with cp.async, unscaled E2M1 into mma.sync,
 *                        the 8 B columns spent on the 8 scale blocks of a
 *                        chunk so that each E4M3 scale is one fp32 FFMA on an
 *                        output instead of a BF16 multiply per weight pair
 *                        (half the instructions of the M <= 8 kernel), each
 *                        lane reading only the x it feeds (fp4_gemv1t_kernel;
 *                        opt-in: half the code words decoded through a
 *                        bank-replicated shared-memory table); else the
 *                        cp.async variant of the M <= 8 kernel.
 *   cuda_dequant_cublas  dequantize the whole weight into a BF16 workspace
 *                        (same register decoder, 16 B in, 64 B out per thread),
 *                        then a cuBLASLt BF16 GEMM with alpha = scale2: large M.
 *   cuda_ref             one thread per output: a plain loop over K with a
 *                        lookup table; the chain-of-trust reference on the GPU.
 * Test-only broken ones (registered under LASTSTAND_TEST_BROKEN_BACKENDS=1):
 *   cuda_broken_nan3072  cuda_ref, then NaN written into the output iff M == 3072
 *   cuda_broken_illegal  a store to an unmapped address (illegal memory access)
 *   cuda_broken_sm100    lives in fp4_gemm_sm100.cu (built for sm_100a only)
 *
 * The gemm family (BF16 weight) is here too: cuda_cublaslt and cuda_ref.
 */
#include "ops/cuda/cu_util.h"
#include "ops/cuda/nvfp4.cuh"

#include <cublasLt.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- shared checks --------------------------------------------------------- */

static int fp4_check_args(const gemm_args *a, ls_err *e) {
    const lin_w *w = a->w;
    if (!w || w->kind != W_NVFP4)
        return errf(e, ERR_INVAL, "fp4_gemm: weight %s is not NVFP4", w && w->name ? w->name : "?");
    if (a->dt != ACT_BF16)
        return errf(e, ERR_UNSUPPORTED, "fp4_gemm on CUDA: activations must be BF16, got %s",
                    act_name(a->dt));
    if (w->K % 16)
        return errf(e, ERR_INVAL, "fp4_gemm: weight %s: K=%d is not a multiple of 16",
                    w->name ? w->name : "?", w->K);
    return 0;
}

static int common_supported(const dev_info *d, const gemm_shape *s, char *why, size_t n) {
    if (d->kind != DEV_CUDA) {
        snprintf(why, n, "needs a CUDA device");
        return 0;
    }
    if (s->dt != ACT_BF16) {
        snprintf(why, n, "activations must be BF16");
        return 0;
    }
    return 1;
}

/* ---- cuda_ref -------------------------------------------------------------- */

/* grid (ceil(M/32), N/8): lane = token, threadIdx.y = weight row. Weight
 * reads are warp-uniform (broadcast); each token row streams through L1. */
__global__ void fp4_ref_kernel(int M, int N, int K, const bf16 *__restrict__ x,
                               const uint8_t *__restrict__ w, const uint8_t *__restrict__ sc,
                               float scale2, bf16 *__restrict__ y, int accumulate) {
    int m = blockIdx.x * 32 + threadIdx.x;
    int n = blockIdx.y * 8 + threadIdx.y;
    if (n >= N) return;
    const uint8_t *wr = w + (size_t)n * (K / 2);
    const uint8_t *sr = sc + (size_t)n * (K / 16);
    const bf16 *xr = x + (size_t)(m < M ? m : 0) * K;
    float acc = 0.f;
    for (int kb = 0; kb < K / 16; kb++) {
        float s = cu_e4m3_to_f32(sr[kb]);
        float part = 0.f;
        for (int i = 0; i < 8; i++) {
            uint8_t b = wr[kb * 8 + i];
            part += cu_e2m1_lut[b & 15] * __bfloat162float(xr[kb * 16 + 2 * i]);
            part += cu_e2m1_lut[b >> 4] * __bfloat162float(xr[kb * 16 + 2 * i + 1]);
        }
        acc += s * part;
    }
    if (m >= M) return;
    acc *= scale2;
    size_t o = (size_t)m * N + n;
    if (accumulate) acc += __bfloat162float(y[o]);
    y[o] = __float2bfloat16_rn(acc);
}

static int fp4_ref_run(const gemm_args *a, ls_stream s, ls_err *e) {
    int rc = fp4_check_args(a, e);
    if (rc) return rc;
    if (a->M <= 0) return 0;
    const lin_w *w = a->w;
    dim3 grid((a->M + 31) / 32, (w->N + 7) / 8), block(32, 8);
    if (grid.y > 65535) return errf(e, ERR_UNSUPPORTED, "cuda_ref: N=%d too large", w->N);
    fp4_ref_kernel<<<grid, block, 0, (cudaStream_t)s>>>(a->M, w->N, w->K, (const bf16 *)a->x,
                                                       (const uint8_t *)w->data, w->scale, w->scale2,
                                                       (bf16 *)a->y, a->accumulate);
    CU_LAUNCHED(e, "fp4_gemm cuda_ref");
    return 0;
}

static int fp4_ref_supported(const dev_info *d, const gemm_shape *s, char *why, size_t n) {
    if (!common_supported(d, s, why, n)) return 0;
    if (s->N > 65535 * 8) {
        snprintf(why, n, "N=%d exceeds the grid limit", s->N);
        return 0;
    }
    return 1;
}

const fp4_gemm_impl fp4_gemm_cuda_ref = {"cuda_ref", DEV_CUDA, 0, fp4_ref_supported, fp4_ref_run, 1};

/* ---- cuda_w4a16_mma ---------------------------------------------------------- */

enum { W4_CHUNK = 128 }; /* K elements per lane-quad per step: 16 B of codes per lane */

/* MT: n8 token tiles per block (tokens m0 .. m0 + 8·MT). KW: warps splitting K.
 * U: chunks loaded before the first use (memory-level parallelism). */
template <int MT, int KW, int U>
__global__ void __launch_bounds__(32 * KW, KW >= 16 ? 2 : 1) fp4_w4a16_kernel(int M, int N, int K,
                                                          const bf16 *__restrict__ x,
                                                          const uint8_t *__restrict__ w,
                                                          const uint8_t *__restrict__ sc,
                                                          float scale2, bf16 *__restrict__ y,
                                                          int accumulate) {
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

    for (int c = cbeg; c < cend; c += U) {
        uint4 wv0[U], wv1[U];
        uint16_t s0[U], s1[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (c + u < cend) {
                wv0[u] = cu_ld_stream16(wr0 + (size_t)(c + u) * 64);
                wv1[u] = cu_ld_stream16(wr1 + (size_t)(c + u) * 64);
                s0[u] = __ldg(reinterpret_cast<const uint16_t *>(sr0 + (size_t)(c + u) * 8));
                s1[u] = __ldg(reinterpret_cast<const uint16_t *>(sr1 + (size_t)(c + u) * 8));
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
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

/* The M <= 8 streaming kernel (the default at M = 1 since 2026-11-29): one
 * 16-row tile per block, KW warps each owning PER consecutive 128-element chunks of
 * K (K == KW * PER * 128 exactly). Every weight byte of the warp's slice is put in
 * flight at once with cp.async into shared memory (so in-flight data holds no
 * registers: 64 registers, 32 warps per SM instead of 16), one commit group per
 * chunk; the warp then waits for chunk u alone, reads it back (each lane its own
 * 16 B, no barrier), decodes it and issues its 8 mma. x is read from L2 per chunk
 * just before that wait, its rows clamped to M - 1 (a token column >= M only
 * feeds an output column that is never stored, so no lane is predicated off).
 * Same fragment mapping and K permutation as fp4_w4a16_kernel. */
template <int KW, int PER>
__global__ void __launch_bounds__(32 * KW, KW >= 16 ? 2 : 4)
    fp4_w4a16_async_kernel(int M, int N, int K, const bf16 *__restrict__ x, const uint8_t *__restrict__ w,
                           const uint8_t *__restrict__ sc, float scale2, bf16 *__restrict__ y, int accumulate) {
    __shared__ __align__(16) uint4 stage[KW][PER][2][32];
    __shared__ float red[KW][4][32];
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
    const int m = g < M ? g : M - 1;
    const uint4 *xr = reinterpret_cast<const uint4 *>(x + (size_t)m * K + c0 * W4_CHUNK + 32 * t);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int u = 0; u < PER; u++) {
        uint4 xv[4];
#pragma unroll
        for (int v = 0; v < 4; v++) xv[v] = __ldg(xr + u * (W4_CHUNK / 8) + v);
        cu_cp_async_wait_dyn(PER - 1 - u);
        cu_w4_chunk_mma(cu_lds16(&stage[warp][u][0][lane]), cu_lds16(&stage[warp][u][1][lane]), s0[u], s1[u], xv,
                        acc);
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
            v *= scale2;
            if (accumulate) v += __bfloat162float(y[o]);
            y[o] = __float2bfloat16_rn(v);
        }
    }
}

/* The M = 1 GEMV kernel (nvfp4.cuh, block-column form): one 16-row tile per block,
 * KW warps each owning PER consecutive 128-element chunks of K (K == KW * PER * 128).
 * Every weight byte of the warp's slice and the matching 256 B of x per chunk are
 * put in flight at once with cp.async (one commit group per chunk); the warp then
 * waits for chunk u alone and runs nv4_gemv1_chunk on it: unscaled E2M1 weights
 * into mma.sync, the 8 B columns carrying the token's x block by block, the E4M3
 * block scales applied as fp32 FFMAs on the 4 outputs (no BF16 multiply per
 * weight). Lanes whose B column is zero for a half read a 32-byte zero row in
 * shared memory instead of x. */
template <int KW, int PER>
__global__ void __launch_bounds__(32 * KW, KW >= 16 ? 2 : KW >= 8 ? 3 : 6)
    fp4_gemv1_kernel(int N, int K, const bf16 *__restrict__ x, const uint8_t *__restrict__ w,
                     const uint8_t *__restrict__ sc, float scale2, bf16 *__restrict__ y, int accumulate) {
    __shared__ __align__(16) uint4 stage[KW][PER][2][32]; /* codes: rows g, g + 8; lane's 16 B */
    __shared__ __align__(16) uint4 xs[KW][PER][16];       /* x: the chunk's 128 values */
    __shared__ __align__(16) uint4 zb[2];                 /* zeros */
    __shared__ uint32_t ss[KW][PER][32];                  /* E4M3 scales: 16 rows x 8 */
    __shared__ float red[KW][16];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * 16, c0 = warp * PER;
    const uint8_t *wr0 = w + (size_t)(n0 + g) * (K / 2) + c0 * 64 + 16 * t;
    const uint8_t *wr1 = wr0 + (size_t)8 * (K / 2);
    const bf16 *xg = x + (size_t)c0 * W4_CHUNK + 8 * (lane & 15);
    /* lane i copies scale bytes 4 (i % 2) .. + 3 of row i / 2 of each chunk */
    const uint8_t *sg0 = sc + (size_t)(n0 + (lane >> 1)) * (K / 16) + c0 * 8 + 4 * (lane & 1);
#pragma unroll
    for (int u = 0; u < PER; u++) {
        cu_cp_async16(&stage[warp][u][0][lane], wr0 + u * 64);
        cu_cp_async16(&stage[warp][u][1][lane], wr1 + u * 64);
        nv4_cp_async4(&ss[warp][u][lane], sg0 + u * 8);
        if (lane < 16) cu_cp_async16(&xs[warp][u][lane], xg + u * W4_CHUNK);
        cu_cp_async_commit();
    }
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
    float r0 = acc[0] + acc[1], r1 = acc[2] + acc[3];
    r0 += __shfl_xor_sync(0xffffffffu, r0, 1);
    r1 += __shfl_xor_sync(0xffffffffu, r1, 1);
    r0 += __shfl_xor_sync(0xffffffffu, r0, 2);
    r1 += __shfl_xor_sync(0xffffffffu, r1, 2);
    if (t == 0) {
        red[warp][g] = r0;
        red[warp][g + 8] = r1;
    }
    __syncthreads();
    if (threadIdx.x < 16) {
        float v = 0.f;
#pragma unroll
        for (int ww = 0; ww < KW; ww++) v += red[ww][threadIdx.x];
        const int n = n0 + threadIdx.x;
        v *= scale2;
        if (accumulate) v += __bfloat162float(y[n]);
        y[n] = __float2bfloat16_rn(v);
    }
}

/* The persistent form of fp4_gemv1_kernel for weights with many more 16-row tiles
 * than resident blocks: a grid of (resident blocks) walks the tiles (tile =
 * blockIdx.x + i * gridDim.x); each warp keeps its K slice (PER chunks) for every
 * tile and, while it decodes tile i from one shared-memory stage, the cp.async loads
 * of its slice of tile i + 1 fill the other stage (one commit group per tile). x is
 * loaded once. The KW warps' partial sums meet in a double-buffered reduction array
 * (one barrier per tile). Same lane mapping and nv4_gemv1_chunk as the one-shot kernel.
 * Dynamic shared memory: sizeof(gvp_smem<KW, PER>). Opt-in (LASTSTAND_W4A16_GPERSIST=1):
 * on the H200 it measured slower than one tile per block (the kernel is bound by the
 * integer pipe's issue rate, not by load latency; bench/RESULTS.md). */
template <int KW, int PER>
struct gvp_smem {
    uint4 xs[KW][PER][16];           /* x: the warp's chunks, loaded once */
    uint4 zb[2];                     /* zeros */
    uint4 stage[2][KW][PER][2][32];  /* codes, two tiles in flight */
    uint32_t ss[2][KW][PER][32];     /* E4M3 scales, two tiles */
    float red[2][KW][16];            /* per-warp row sums, alternating tiles */
};

template <int KW, int PER>
__device__ __forceinline__ void gvp_issue(gvp_smem<KW, PER> &sm, int st, int tile, int K, const uint8_t *__restrict__ w,
                                          const uint8_t *__restrict__ sc, int lane, int warp) {
    const int g = lane >> 2, t = lane & 3, n0 = tile * 16, c0 = warp * PER;
    const uint8_t *wr0 = w + (size_t)(n0 + g) * (K / 2) + c0 * 64 + 16 * t;
    const uint8_t *wr1 = wr0 + (size_t)8 * (K / 2);
    const uint8_t *sg0 = sc + (size_t)(n0 + (lane >> 1)) * (K / 16) + c0 * 8 + 4 * (lane & 1);
#pragma unroll
    for (int u = 0; u < PER; u++) {
        cu_cp_async16(&sm.stage[st][warp][u][0][lane], wr0 + u * 64);
        cu_cp_async16(&sm.stage[st][warp][u][1][lane], wr1 + u * 64);
        nv4_cp_async4(&sm.ss[st][warp][u][lane], sg0 + u * 8);
    }
}

template <int KW, int PER>
__global__ void __launch_bounds__(32 * KW, 2)
    fp4_gemv1p_kernel(int N, int K, const bf16 *__restrict__ x, const uint8_t *__restrict__ w,
                      const uint8_t *__restrict__ sc, float scale2, bf16 *__restrict__ y, int accumulate, int ntiles) {
    extern __shared__ __align__(16) unsigned char gvp_raw[];
    gvp_smem<KW, PER> &sm = *reinterpret_cast<gvp_smem<KW, PER> *>(gvp_raw);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int c0 = warp * PER;
    int tile = blockIdx.x; /* gridDim.x <= ntiles */
    if (lane < 16) {
        const bf16 *xg = x + (size_t)c0 * W4_CHUNK + 8 * lane;
#pragma unroll
        for (int u = 0; u < PER; u++) cu_cp_async16(&sm.xs[warp][u][lane], xg + u * W4_CHUNK);
    }
    gvp_issue<KW, PER>(sm, 0, tile, K, w, sc, lane, warp);
    cu_cp_async_commit(); /* group of tile 0 (and x) */
    if (threadIdx.x < 2) sm.zb[threadIdx.x] = make_uint4(0u, 0u, 0u, 0u);
    __syncthreads();
    const bool on = t == (g >> 1);
    const uint4 *pe = on && !(g & 1) ? &sm.xs[warp][0][4 * t] : sm.zb;
    const uint4 *po = on && (g & 1) ? &sm.xs[warp][0][4 * t + 2] : sm.zb;
    const int se = on && !(g & 1) ? 16 : 0, so = on && (g & 1) ? 16 : 0;
    const nv4_lut lut = nv4_lut_make((threadIdx.x + 1u) * (uint32_t)(K & 127)); /* K % 128 == 0 */
    for (int i = 0;; i++) {
        const int nt = tile + gridDim.x, st = i & 1;
        __syncwarp(); /* every lane is done with stage st ^ 1 (tile i - 1) */
        if (nt < ntiles) gvp_issue<KW, PER>(sm, st ^ 1, nt, K, w, sc, lane, warp);
        cu_cp_async_commit(); /* possibly empty: keeps one group per tile */
        cu_cp_async_wait<1>();
        __syncwarp(); /* tile i's codes, scales (and x) copied by the warp's lanes */
        float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int u = 0; u < PER; u++) {
            const uint16_t *s16 = reinterpret_cast<const uint16_t *>(sm.ss[st][warp][u]); /* [row][4] */
            float sg[4];
            nv4_e4m3x2_to_f32x2(s16[4 * g + t], sg[0], sg[1]);
            nv4_e4m3x2_to_f32x2(s16[4 * (g + 8) + t], sg[2], sg[3]);
            nv4_gemv1_chunk(cu_lds16(&sm.stage[st][warp][u][0][lane]), cu_lds16(&sm.stage[st][warp][u][1][lane]),
                            pe[u * se], pe[u * se + 1], po[u * so], po[u * so + 1], sg, lut, acc);
        }
        float r0 = acc[0] + acc[1], r1 = acc[2] + acc[3];
        r0 += __shfl_xor_sync(0xffffffffu, r0, 1);
        r1 += __shfl_xor_sync(0xffffffffu, r1, 1);
        r0 += __shfl_xor_sync(0xffffffffu, r0, 2);
        r1 += __shfl_xor_sync(0xffffffffu, r1, 2);
        if (t == 0) {
            sm.red[st][warp][g] = r0;
            sm.red[st][warp][g + 8] = r1;
        }
        /* red[st] is rewritten two tiles later, after every warp passed the next barrier,
         * which warp 0 reaches only after reading it here */
        __syncthreads();
        if (threadIdx.x < 16) {
            float v = 0.f;
#pragma unroll
            for (int ww = 0; ww < KW; ww++) v += sm.red[st][ww][threadIdx.x];
            const int n = tile * 16 + threadIdx.x;
            v *= scale2;
            if (accumulate) v += __bfloat162float(y[n]);
            y[n] = __float2bfloat16_rn(v);
        }
        if (nt >= ntiles) break;
        tile = nt;
    }
}

/* Raise a kernel's dynamic shared-memory limit (and prefer shared memory over L1)
 * once per device: function attributes belong to the device's context, so a flag per
 * process would leave the second GPU of --tp 2 at the 48 KB default (a failed launch).
 * done: one bit per device, shared by the threads that drive the GPUs. */
static void w4_smem_attr(const void *fn, size_t smem, unsigned *done) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev > 31) dev = 31; /* set it anyway */
    const unsigned bit = 1u << dev;
    if (__atomic_load_n(done, __ATOMIC_ACQUIRE) & bit && dev != 31) return;
    cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    __atomic_fetch_or(done, bit, __ATOMIC_ACQ_REL);
}

template <int KW, int PER>
static void gvp_launch(const gemm_args *a, cudaStream_t st, int sms) {
    static int occ = 0; /* resident blocks per SM, once per instance */
    static unsigned attr = 0;
    const size_t smem = sizeof(gvp_smem<KW, PER>);
    w4_smem_attr((const void *)fp4_gemv1p_kernel<KW, PER>, smem, &attr);
    if (!occ) {
        int o = 0;
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o, fp4_gemv1p_kernel<KW, PER>, 32 * KW, smem);
        occ = o > 0 ? o : 1;
    }
    const lin_w *w = a->w;
    const int ntiles = w->N / 16;
    const int grid = occ * sms < ntiles ? occ * sms : ntiles;
    fp4_gemv1p_kernel<KW, PER><<<grid, 32 * KW, smem, st>>>(w->N, w->K, (const bf16 *)a->x, (const uint8_t *)w->data,
                                                            w->scale, w->scale2, (bf16 *)a->y, a->accumulate, ntiles);
}

static void gvp_run_kw(int kw, int per, const gemm_args *a, cudaStream_t st, int sms) {
    if (kw == 16) {
        if (per == 1) gvp_launch<16, 1>(a, st, sms);
        else gvp_launch<16, 2>(a, st, sms);
    } else if (kw == 8) {
        if (per == 1) gvp_launch<8, 1>(a, st, sms);
        else if (per == 2) gvp_launch<8, 2>(a, st, sms);
        else gvp_launch<8, 4>(a, st, sms);
    } else {
        if (per == 1) gvp_launch<4, 1>(a, st, sms);
        else if (per == 2) gvp_launch<4, 2>(a, st, sms);
        else gvp_launch<4, 4>(a, st, sms);
    }
}

/* The M = 1 GEMV with the bit-placement decode (nvfp4.cuh nv4_gemv2_chunk), opt-in
 * (LASTSTAND_W4A16_GDEC=2) until a device round has validated and timed it: same
 * one-shot cp.async structure as fp4_gemv1_kernel, but the codes are decoded with
 * half their instructions on the FMA pipe (the block-column kernel is bound by the
 * integer pipe) and the scale is applied to A by one BF16 multiply per pair; every
 * B column carries the token, whose x each warp permutes once per chunk in shared
 * memory into the (i, i + 4) pairing of the decode. */
template <int KW, int PER>
__global__ void __launch_bounds__(32 * KW, KW >= 16 ? 2 : KW >= 8 ? 3 : 6)
    fp4_gemv2_kernel(int N, int K, const bf16 *__restrict__ x, const uint8_t *__restrict__ w,
                     const uint8_t *__restrict__ sc, float scale2, bf16 *__restrict__ y, int accumulate) {
    __shared__ __align__(16) uint4 stage[KW][PER][2][32]; /* codes: rows g, g + 8; lane's 16 B */
    __shared__ __align__(16) uint4 xs[KW][PER][16];       /* x: the chunk's 128 values, then permuted */
    __shared__ uint32_t ss[KW][PER][32];                  /* E4M3 scales: 16 rows x 8 */
    __shared__ float red[KW][16];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * 16, c0 = warp * PER;
    const uint8_t *wr0 = w + (size_t)(n0 + g) * (K / 2) + c0 * 64 + 16 * t;
    const uint8_t *wr1 = wr0 + (size_t)8 * (K / 2);
    const bf16 *xg = x + (size_t)c0 * W4_CHUNK + 8 * (lane & 15);
    const uint8_t *sg0 = sc + (size_t)(n0 + (lane >> 1)) * (K / 16) + c0 * 8 + 4 * (lane & 1);
#pragma unroll
    for (int u = 0; u < PER; u++) {
        cu_cp_async16(&stage[warp][u][0][lane], wr0 + u * 64);
        cu_cp_async16(&stage[warp][u][1][lane], wr1 + u * 64);
        nv4_cp_async4(&ss[warp][u][lane], sg0 + u * 8);
        if (lane < 16) cu_cp_async16(&xs[warp][u][lane], xg + u * W4_CHUNK);
        cu_cp_async_commit();
    }
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
    /* token 0 is column 0: lanes t = 0 hold rows g (c0) and g + 8 (c2) */
    if (t == 0) {
        red[warp][g] = acc[0];
        red[warp][g + 8] = acc[2];
    }
    __syncthreads();
    if (threadIdx.x < 16) {
        float v = 0.f;
#pragma unroll
        for (int ww = 0; ww < KW; ww++) v += red[ww][threadIdx.x];
        const int n = n0 + threadIdx.x;
        v *= scale2 * 256.f; /* the decode's 2^-126 against the scales' 2^118 */
        if (accumulate) v += __bfloat162float(y[n]);
        y[n] = __float2bfloat16_rn(v);
    }
}

template <int KW, int PER>
static void gv2_launch(const gemm_args *a, cudaStream_t st) {
    static int carve = 0;
    if (!carve) {
        cudaFuncSetAttribute(fp4_gemv2_kernel<KW, PER>, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared);
        carve = 1;
    }
    const lin_w *w = a->w;
    fp4_gemv2_kernel<KW, PER><<<w->N / 16, 32 * KW, 0, st>>>(w->N, w->K, (const bf16 *)a->x, (const uint8_t *)w->data,
                                                           w->scale, w->scale2, (bf16 *)a->y, a->accumulate);
}

static void gv2_run_kw(int kw, int per, const gemm_args *a, cudaStream_t st) {
    if (kw == 16) {
        if (per == 1) gv2_launch<16, 1>(a, st);
        else gv2_launch<16, 2>(a, st);
    } else if (kw == 8) {
        if (per == 1) gv2_launch<8, 1>(a, st);
        else if (per == 2) gv2_launch<8, 2>(a, st);
        else gv2_launch<8, 4>(a, st);
    } else {
        if (per == 1) gv2_launch<4, 1>(a, st);
        else if (per == 2) gv2_launch<4, 2>(a, st);
        else gv2_launch<4, 4>(a, st);
    }
}

/* The M = 1 GEMV with the table decode (nvfp4.cuh nv4_gemv1t_chunk<L>), the default
 * at M = 1 on the validated instances (gvt_default: L = 0 on the 397B shapes, where
 * its halved x reads are the gain and the table a loss; L = 2 on the 35B ones);
 * LASTSTAND_W4A16_LUT=L picks L = 1, 2 or 4 word pairs of 4 by table,
 * 12: L = 2 and R = 1 below, 10: L = 0 (no table), 0: fp4_gemv1_kernel instead.
 * fp4_gemv1_kernel's one-shot cp.async structure and
 * block-column scales, plus a 32 KB byte -> bf16x2 table (lane i's copy in bank i)
 * built by the block while its loads are in flight, and one 32-byte x read per lane
 * and chunk (see nv4_gemv1t_chunk). Dynamic shared memory, table first (128-byte
 * aligned): gvt_smem_bytes(KW, PER, R, L). */
static size_t gvt_smem_bytes(int kw, int per, int r, int l) {
    return (l ? NV4_TAB_BYTES : 0) + (size_t)kw * per * ((r ? 0 : 2 * 32 * 16) + 16 * 16 + 32 * 4) + 32 +
           (size_t)kw * 16 * 4;
}

/* R = 1: the codes go straight into registers (LDG.128, all PER chunks at once)
 * instead of through shared memory (cp.async then LDS.128): a quarter fewer
 * shared-memory wavefronts per chunk, for PER x 8 registers; no stage array (the
 * block's shared memory drops from 77 to 45 KB at 8 warps x 4 chunks: 3 blocks per
 * SM instead of 2, as fp4_gemv1_kernel). */
template <int KW, int PER, int L, int R>
__global__ void __launch_bounds__(32 * KW, KW >= 16 ? 2 : KW >= 8 ? 2 + R : 4)
    fp4_gemv1t_kernel(int N, int K, const bf16 *__restrict__ x, const uint8_t *__restrict__ w,
                      const uint8_t *__restrict__ sc, float scale2, bf16 *__restrict__ y, int accumulate) {
    extern __shared__ __align__(128) unsigned char gvt_raw[];
    /* table [256][32] u32, then stage[KW][PER][2][32] uint4 (codes), xs[KW][PER][16] uint4,
     * ss[KW][PER][32] u32 (scales), zb[2] uint4 (zeros), red[KW][16] f32 */
    constexpr int TB = L ? NV4_TAB_BYTES : 0;       /* L = 0: no table (the x reads alone) */
    constexpr int SO = TB + (R ? 0 : KW * PER * 1024); /* past the table and the stage */
    uint4(*stage)[PER][2][32] = reinterpret_cast<uint4(*)[PER][2][32]>(gvt_raw + TB); /* R = 0 only */
    uint4(*xs)[PER][16] = reinterpret_cast<uint4(*)[PER][16]>(gvt_raw + SO);
    uint32_t(*ss)[PER][32] = reinterpret_cast<uint32_t(*)[PER][32]>(gvt_raw + SO + KW * PER * 256);
    uint4 *zb = reinterpret_cast<uint4 *>(gvt_raw + SO + KW * PER * 384);
    float(*red)[16] = reinterpret_cast<float(*)[16]>(gvt_raw + SO + KW * PER * 384 + 32);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * 16, c0 = warp * PER;
    const uint8_t *wr0 = w + (size_t)(n0 + g) * (K / 2) + c0 * 64 + 16 * t;
    const uint8_t *wr1 = wr0 + (size_t)8 * (K / 2);
    const bf16 *xg = x + (size_t)c0 * W4_CHUNK + 8 * (lane & 15);
    const uint8_t *sg0 = sc + (size_t)(n0 + (lane >> 1)) * (K / 16) + c0 * 8 + 4 * (lane & 1);
    uint4 wv0[PER], wv1[PER];
#pragma unroll
    for (int u = 0; u < PER; u++) {
        if (R) {
            wv0[u] = cu_ld_stream16(wr0 + u * 64);
            wv1[u] = cu_ld_stream16(wr1 + u * 64);
        } else {
            cu_cp_async16(&stage[warp][u][0][lane], wr0 + u * 64);
            cu_cp_async16(&stage[warp][u][1][lane], wr1 + u * 64);
        }
        nv4_cp_async4(&ss[warp][u][lane], sg0 + u * 8);
        if (lane < 16) cu_cp_async16(&xs[warp][u][lane], xg + u * W4_CHUNK);
        cu_cp_async_commit();
    }
    /* K % 128 == 0: a per-thread zero the compiler cannot fold (see nv4_lut_make) */
    const nv4_lut lut = nv4_lut_make((threadIdx.x + 1u) * (uint32_t)(K & 127));
    const uint32_t tab = (uint32_t)__cvta_generic_to_shared(gvt_raw);
    if (L) nv4_tab_build(tab, threadIdx.x, 32 * KW, lut); /* under the loads */
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
        nv4_gemv1t_chunk<L>(R ? wv0[u] : cu_lds16(&stage[warp][u][0][lane]),
                            R ? wv1[u] : cu_lds16(&stage[warp][u][1][lane]), px[u * sx], px[u * sx + 1], sg, lut, tl,
                            acc);
    }
    float r0 = acc[0] + acc[1], r1 = acc[2] + acc[3];
    r0 += __shfl_xor_sync(0xffffffffu, r0, 1);
    r1 += __shfl_xor_sync(0xffffffffu, r1, 1);
    r0 += __shfl_xor_sync(0xffffffffu, r0, 2);
    r1 += __shfl_xor_sync(0xffffffffu, r1, 2);
    if (t == 0) {
        red[warp][g] = r0;
        red[warp][g + 8] = r1;
    }
    __syncthreads();
    if (threadIdx.x < 16) {
        float v = 0.f;
#pragma unroll
        for (int ww = 0; ww < KW; ww++) v += red[ww][threadIdx.x];
        const int n = n0 + threadIdx.x;
        v *= scale2;
        if (accumulate) v += __bfloat162float(y[n]);
        y[n] = __float2bfloat16_rn(v);
    }
}

template <int KW, int PER, int L, int R>
static void gvt_launch(const gemm_args *a, cudaStream_t st) {
    static unsigned attr = 0;
    const size_t smem = gvt_smem_bytes(KW, PER, R, L);
    w4_smem_attr((const void *)fp4_gemv1t_kernel<KW, PER, L, R>, smem, &attr);
    const lin_w *w = a->w;
    fp4_gemv1t_kernel<KW, PER, L, R><<<w->N / 16, 32 * KW, smem, st>>>(
        w->N, w->K, (const bf16 *)a->x, (const uint8_t *)w->data, w->scale, w->scale2, (bf16 *)a->y, a->accumulate);
}

/* The M = 1 default per (warps, chunks per warp) instance, from the device rounds
 * (H200, 2026-11-29; the doctor's fp64 check on the 397B and 35B shapes, bench/RESULTS.md):
 * 0 = fp4_gemv1_kernel; 10 = fp4_gemv1t_kernel without a table (its halved x reads
 * alone: R4, [16384 x 4096] 20.83 -> 19.94 us, the fastest; validated at 16 x 2, 8 x 4,
 * 8 x 1); 2 = with the table for half the words (validated in R3 and R4 at 16 x 1 and
 * 4 x 1, the 35B shapes, where no other variant was run; as fast as 0 there). */
static int gvt_default(int kw, int per) {
    if ((kw == 16 && per == 2) || (kw == 8 && (per == 1 || per == 4))) return 10;
    if ((kw == 16 && per == 1) || (kw == 4 && per == 1)) return 2;
    return 0;
}

template <int L, int R>
static void gvt_run_kw(int kw, int per, const gemm_args *a, cudaStream_t st) {
    if (kw == 16) {
        if (per == 1) gvt_launch<16, 1, L, R>(a, st);
        else gvt_launch<16, 2, L, R>(a, st);
    } else if (kw == 8) {
        if (per == 1) gvt_launch<8, 1, L, R>(a, st);
        else if (per == 2) gvt_launch<8, 2, L, R>(a, st);
        else gvt_launch<8, 4, L, R>(a, st);
    } else {
        if (per == 1) gvt_launch<4, 1, L, R>(a, st);
        else if (per == 2) gvt_launch<4, 2, L, R>(a, st);
        else gvt_launch<4, 4, L, R>(a, st);
    }
}

/* The M = 2..8 kernel with the table decode (nvfp4.cuh nv4_w4_chunk_tab<2>), opt-in
 * (LASTSTAND_W4A16_LUT8=1) until a device round has validated and timed it: one 16-row
 * tile per block, KW warps each owning PER consecutive chunks of K (K == KW * PER *
 * 128); the codes of all PER chunks are loaded into registers at once (LDG.128), the
 * scales and x by __ldg, tokens in the B columns (rows clamped to M - 1) as in
 * fp4_w4a16_async_kernel; half of the words decoded through the block's 32 KB table
 * (built under the loads), the other half by byte permutes, one HMUL2 per pair for
 * the block scale. Dynamic shared memory: the table, then red[KW][4][32]. */
template <int KW, int PER>
__global__ void __launch_bounds__(32 * KW, KW >= 16 ? 2 : 3)
    fp4_w4a16t_kernel(int M, int N, int K, const bf16 *__restrict__ x, const uint8_t *__restrict__ w,
                      const uint8_t *__restrict__ sc, float scale2, bf16 *__restrict__ y, int accumulate) {
    extern __shared__ __align__(128) unsigned char w4t_raw[];
    float(*red)[4][32] = reinterpret_cast<float(*)[4][32]>(w4t_raw + NV4_TAB_BYTES);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * 16, c0 = warp * PER;
    const uint8_t *wr0 = w + (size_t)(n0 + g) * (K / 2) + c0 * 64 + 16 * t;
    const uint8_t *wr1 = wr0 + (size_t)8 * (K / 2);
    uint4 wv0[PER], wv1[PER];
#pragma unroll
    for (int u = 0; u < PER; u++) {
        wv0[u] = cu_ld_stream16(wr0 + u * 64);
        wv1[u] = cu_ld_stream16(wr1 + u * 64);
    }
    const uint8_t *sr0 = sc + (size_t)(n0 + g) * (K / 16) + c0 * 8 + 2 * t;
    const uint8_t *sr1 = sr0 + (size_t)8 * (K / 16);
    uint16_t s0[PER], s1[PER];
#pragma unroll
    for (int u = 0; u < PER; u++) {
        s0[u] = __ldg(reinterpret_cast<const uint16_t *>(sr0 + u * 8));
        s1[u] = __ldg(reinterpret_cast<const uint16_t *>(sr1 + u * 8));
    }
    const nv4_lut lut = nv4_lut_make((threadIdx.x + 1u) * (uint32_t)(K & 127)); /* K % 128 == 0 */
    const uint32_t tab = (uint32_t)__cvta_generic_to_shared(w4t_raw);
    nv4_tab_build(tab, threadIdx.x, 32 * KW, lut);
    __syncthreads();
    const uint32_t tl = tab + 4u * (uint32_t)lane;
    const int m = g < M ? g : M - 1;
    const uint4 *xr = reinterpret_cast<const uint4 *>(x + (size_t)m * K + c0 * W4_CHUNK + 32 * t);
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int u = 0; u < PER; u++) {
        uint4 xv[4];
#pragma unroll
        for (int v = 0; v < 4; v++) xv[v] = __ldg(xr + u * (W4_CHUNK / 8) + v);
        nv4_w4_chunk_tab<2>(wv0[u], wv1[u], s0[u], s1[u], xv, lut, tl, acc);
    }
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
            v *= scale2;
            if (accumulate) v += __bfloat162float(y[o]);
            y[o] = __float2bfloat16_rn(v);
        }
    }
}

template <int KW, int PER>
static void w4t_launch(const gemm_args *a, cudaStream_t st) {
    static unsigned attr = 0;
    const size_t smem = NV4_TAB_BYTES + (size_t)KW * 4 * 32 * 4;
    w4_smem_attr((const void *)fp4_w4a16t_kernel<KW, PER>, smem, &attr);
    const lin_w *w = a->w;
    fp4_w4a16t_kernel<KW, PER><<<w->N / 16, 32 * KW, smem, st>>>(a->M, w->N, w->K, (const bf16 *)a->x,
                                                                (const uint8_t *)w->data, w->scale, w->scale2,
                                                                (bf16 *)a->y, a->accumulate);
}

static void w4t_run_kw(int kw, int per, const gemm_args *a, cudaStream_t st) {
    if (kw == 16) {
        if (per == 1) w4t_launch<16, 1>(a, st);
        else w4t_launch<16, 2>(a, st);
    } else if (kw == 8) {
        if (per == 1) w4t_launch<8, 1>(a, st);
        else if (per == 2) w4t_launch<8, 2>(a, st);
        else w4t_launch<8, 4>(a, st);
    } else {
        if (per == 1) w4t_launch<4, 1>(a, st);
        else if (per == 2) w4t_launch<4, 2>(a, st);
        else w4t_launch<4, 4>(a, st);
    }
}

template <int KW, int PER>
static void gv_launch(const gemm_args *a, cudaStream_t st) {
    static int carve = 0; /* shared memory before L1: several blocks of 40 KB per SM */
    if (!carve) {
        cudaFuncSetAttribute(fp4_gemv1_kernel<KW, PER>, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared);
        carve = 1;
    }
    const lin_w *w = a->w;
    fp4_gemv1_kernel<KW, PER><<<w->N / 16, 32 * KW, 0, st>>>(w->N, w->K, (const bf16 *)a->x, (const uint8_t *)w->data,
                                                           w->scale, w->scale2, (bf16 *)a->y, a->accumulate);
}

/* 0 when no instance fits (K must be KW * PER * 128 with KW in 4, 8, 16 and PER in
 * 1, 2, 4; 16 x 4 is over the 48 KB of static shared memory). The width tried first:
 * want_kw when given, else 16 warps when the tiles barely fill the GPU twice (the
 * latency-bound small weights), else 8; then 16, 8, 4. */
static int gv_pick(int nchunks, int ntiles, int sms, int want_kw, int *kw_out, int *per_out) {
    int first = want_kw == 4 || want_kw == 8 || want_kw == 16 ? want_kw
                : nchunks % 16 == 0 && nchunks / 16 <= 2 && ntiles <= 2 * sms ? 16
                                                                              : 8;
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

static void gv_run_kw(int kw, int per, const gemm_args *a, cudaStream_t st) {
    if (kw == 16) {
        if (per == 1) gv_launch<16, 1>(a, st);
        else gv_launch<16, 2>(a, st);
    } else if (kw == 8) {
        if (per == 1) gv_launch<8, 1>(a, st);
        else if (per == 2) gv_launch<8, 2>(a, st);
        else gv_launch<8, 4>(a, st);
    } else {
        if (per == 1) gv_launch<4, 1>(a, st);
        else if (per == 2) gv_launch<4, 2>(a, st);
        else gv_launch<4, 4>(a, st);
    }
}

template <int KW, int PER>
static void w4a_launch(const gemm_args *a, cudaStream_t st) {
    static int carve = 0; /* shared memory before L1, so that 4 blocks of 36 KB fit an SM */
    if (!carve) {
        cudaFuncSetAttribute(fp4_w4a16_async_kernel<KW, PER>, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared);
        carve = 1;
    }
    const lin_w *w = a->w;
    fp4_w4a16_async_kernel<KW, PER><<<w->N / 16, 32 * KW, 0, st>>>(
        a->M, w->N, w->K, (const bf16 *)a->x, (const uint8_t *)w->data, w->scale, w->scale2, (bf16 *)a->y,
        a->accumulate);
}

/* per = chunks per warp: 1, 2, or 4 (4 only with 8 warps: 48 KB of static shared memory) */
template <int KW>
static void w4a_launch_per(int per, const gemm_args *a, cudaStream_t st) {
    if (per == 1) w4a_launch<KW, 1>(a, st);
    else if (per == 2) w4a_launch<KW, 2>(a, st);
    else if constexpr (KW <= 8) w4a_launch<KW, 4>(a, st);
}

/* The M <= 8 decode kernel, persistent and software-pipelined: a grid of
 * (occupancy x SMs) blocks of 8 warps walks the 16-row tiles; each warp owns
 * a fixed K slice of up to U chunks and, while it decodes and multiplies the
 * current tile, the loads of its slice of the next tile are already in flight
 * (two register buffers, A and B, alternate). Same fragment mapping as
 * fp4_w4a16_kernel. */
template <int U>
struct w4_buf {
    uint4 w0[U], w1[U];
    uint16_t s0[U], s1[U];
};

template <int U>
__device__ __forceinline__ void w4p_load(w4_buf<U> &b, const uint8_t *__restrict__ w, const uint8_t *__restrict__ sc,
                                         int K, int n0, int g, int t, int cb, int ce) {
    const uint8_t *wr0 = w + (size_t)(n0 + g) * (K / 2) + 16 * t, *wr1 = wr0 + (size_t)8 * (K / 2);
    const uint8_t *sr0 = sc + (size_t)(n0 + g) * (K / 16) + 2 * t, *sr1 = sr0 + (size_t)8 * (K / 16);
#pragma unroll
    for (int u = 0; u < U; u++)
        if (cb + u < ce) {
            b.w0[u] = cu_ld_stream16(wr0 + (size_t)(cb + u) * 64);
            b.w1[u] = cu_ld_stream16(wr1 + (size_t)(cb + u) * 64);
            b.s0[u] = __ldg(reinterpret_cast<const uint16_t *>(sr0 + (size_t)(cb + u) * 8));
            b.s1[u] = __ldg(reinterpret_cast<const uint16_t *>(sr1 + (size_t)(cb + u) * 8));
        }
}

template <int U>
__device__ __forceinline__ void w4p_compute(const w4_buf<U> &b, float (&red)[8][4][32], int M, int N, int K,
                                            const bf16 *__restrict__ x, float scale2, bf16 *__restrict__ y,
                                            int accumulate, int n0, int lane, int warp, int cb, int ce) {
    const int g = lane >> 2, t = lane & 3;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int u = 0; u < U; u++) {
        if (cb + u >= ce) break;
        uint32_t a0[16], a1[16];
        {
            uint32_t sa = cu_scale_bf16x2(b.s0[u] & 0xff), sb = cu_scale_bf16x2(b.s0[u] >> 8);
            uint32_t sc0 = cu_scale_bf16x2(b.s1[u] & 0xff), sc1 = cu_scale_bf16x2(b.s1[u] >> 8);
            const uint32_t q0[4] = {b.w0[u].x, b.w0[u].y, b.w0[u].z, b.w0[u].w};
            const uint32_t q1[4] = {b.w1[u].x, b.w1[u].y, b.w1[u].z, b.w1[u].w};
#pragma unroll
            for (int q = 0; q < 4; q++) {
                cu_e2m1x8_to_bf16x8(q0[q], &a0[4 * q]);
                cu_e2m1x8_to_bf16x8(q1[q], &a1[4 * q]);
#pragma unroll
                for (int r = 0; r < 4; r++) {
                    a0[4 * q + r] = cu_bf16x2_mul(a0[4 * q + r], q < 2 ? sa : sb);
                    a1[4 * q + r] = cu_bf16x2_mul(a1[4 * q + r], q < 2 ? sc0 : sc1);
                }
            }
        }
        uint32_t bx[16];
        if (g < M) {
            const uint4 *xp = reinterpret_cast<const uint4 *>(x + (size_t)g * K + (cb + u) * W4_CHUNK + 32 * t);
#pragma unroll
            for (int v = 0; v < 4; v++) {
                uint4 xv = __ldg(xp + v);
                bx[4 * v] = xv.x; bx[4 * v + 1] = xv.y; bx[4 * v + 2] = xv.z; bx[4 * v + 3] = xv.w;
            }
        } else {
#pragma unroll
            for (int v = 0; v < 16; v++) bx[v] = 0u;
        }
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const uint32_t af[4] = {a0[2 * j], a1[2 * j], a0[2 * j + 1], a1[2 * j + 1]};
            cu_mma_bf16_16816(acc, af, bx[2 * j], bx[2 * j + 1]);
        }
    }
#pragma unroll
    for (int r = 0; r < 4; r++) red[warp][r][lane] = acc[r];
    __syncthreads();
    if (threadIdx.x < 128) {
        int el = threadIdx.x >> 5, l = threadIdx.x & 31;
        float v = 0.f;
#pragma unroll
        for (int ww = 0; ww < 8; ww++) v += red[ww][el][l];
        int n = n0 + (l >> 2) + (el >= 2 ? 8 : 0);
        int m = 2 * (l & 3) + (el & 1);
        if (m < M) {
            size_t o = (size_t)m * N + n;
            v *= scale2;
            if (accumulate) v += __bfloat162float(y[o]);
            y[o] = __float2bfloat16_rn(v);
        }
    }
    __syncthreads(); /* red is rewritten by the next tile */
}

template <int U>
__global__ void __launch_bounds__(256, U >= 8 ? 1 : 2) fp4_w4a16_persist_kernel(int M, int N, int K, const bf16 *__restrict__ x,
                                                                   const uint8_t *__restrict__ w,
                                                                   const uint8_t *__restrict__ sc, float scale2,
                                                                   bf16 *__restrict__ y, int accumulate, int ntiles) {
    __shared__ float red[8][4][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int nchunks = K / W4_CHUNK, per = (nchunks + 7) / 8;
    const int cb = warp * per, ce = min(nchunks, cb + per);
    int tile = blockIdx.x;
    if (tile >= ntiles) return;
    w4_buf<U> A, B;
    w4p_load<U>(A, w, sc, K, tile * 16, g, t, cb, ce);
    for (;;) {
        int nt = tile + gridDim.x;
        if (nt < ntiles) w4p_load<U>(B, w, sc, K, nt * 16, g, t, cb, ce);
        w4p_compute<U>(A, red, M, N, K, x, scale2, y, accumulate, tile * 16, lane, warp, cb, ce);
        if (nt >= ntiles) break;
        tile = nt;
        nt = tile + gridDim.x;
        if (nt < ntiles) w4p_load<U>(A, w, sc, K, nt * 16, g, t, cb, ce);
        w4p_compute<U>(B, red, M, N, K, x, scale2, y, accumulate, tile * 16, lane, warp, cb, ce);
        if (nt >= ntiles) break;
        tile = nt;
    }
}

template <int U>
static void w4p_launch(const gemm_args *a, cudaStream_t st) {
    static int occ = 0; /* blocks per SM, once per instance */
    if (!occ) {
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, fp4_w4a16_persist_kernel<U>, 256, 0);
        if (occ < 1) occ = 1;
    }
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    const lin_w *w = a->w;
    int ntiles = w->N / 16;
    int grid = occ * (sms > 0 ? sms : 1);
    if (grid > ntiles) grid = ntiles;
    fp4_w4a16_persist_kernel<U><<<grid, 256, 0, st>>>(a->M, w->N, w->K, (const bf16 *)a->x,
                                                     (const uint8_t *)w->data, w->scale, w->scale2,
                                                     (bf16 *)a->y, a->accumulate, ntiles);
}

template <int MT, int KW, int U>
static void w4_launch(dim3 grid, cudaStream_t st, const gemm_args *a) {
    const lin_w *w = a->w;
    fp4_w4a16_kernel<MT, KW, U><<<grid, 32 * KW, 0, st>>>(
        a->M, w->N, w->K, (const bf16 *)a->x, (const uint8_t *)w->data, w->scale, w->scale2,
        (bf16 *)a->y, a->accumulate);
}

template <int MT, int U>
static void w4_launch_kw(int kw, dim3 grid, cudaStream_t st, const gemm_args *a) {
    switch (kw) {
    case 1: w4_launch<MT, 1, U>(grid, st, a); break;
    case 2: w4_launch<MT, 2, U>(grid, st, a); break;
    case 4: w4_launch<MT, 4, U>(grid, st, a); break;
    case 16:
        if (MT == 1 && U == 2) {
            w4_launch<1, 16, 2>(grid, st, a);
            break;
        } /* fall through */
    default: w4_launch<MT, 8, U>(grid, st, a); break;
    }
}

/* Tuning knobs for bench/kernels (unset in production): LASTSTAND_W4A16_ASYNC = the
 * largest M that takes the cp.async kernel (default 1; 0 = never), LASTSTAND_W4A16_AKW
 * = its warps per tile (8 or 16; default by grid size); LASTSTAND_W4A16_PERSIST=1
 * selects the persistent M <= 8 kernel (measured on the H200, 2026-11-29: no faster
 * than one tile per block, 1575 vs 1747 GB/s at [16384 x 4096], so off); and LASTSTAND_W4A16_KW = warps
 * splitting K (1, 2, 4, 8; 16 with U = 2) and LASTSTAND_W4A16_U = chunks in flight per warp at
 * M <= 8 (2, 4 or 8) shape the register-staged one-tile-per-block kernel;
 * LASTSTAND_W4A16_GEMV=0 turns off the M = 1 block-column GEMV kernel (fp4_gemv1_kernel,
 * the default at M = 1 where K fits it), LASTSTAND_W4A16_GKW = its warps per tile
 * (4, 8 or 16; default by grid size), LASTSTAND_W4A16_GPERSIST=1 selects its
 * persistent form (fp4_gemv1p_kernel; default off, slower on the H200),
 * LASTSTAND_W4A16_GDEC=2 the bit-placement decode kernel (fp4_gemv2_kernel; opt-in
 * until a device round validates it), LASTSTAND_W4A16_LUT=L (1, 2 or 4) the table
 * decode kernel with L of the 4 word pairs per chunk by table (fp4_gemv1t_kernel;
 * 12 = L 2 with the codes loaded into registers, 10 = no table: that kernel's halved x
 * reads alone; 0 or any other value = off, fp4_gemv1_kernel). Unset: per instance
 * as the device rounds found (gvt_default: 10 on the 397B shapes, 2 on the 35B ones,
 * bench/RESULTS.md); LASTSTAND_W4A16_LUT8=1 the table kernel at
 * M = 2..8 (fp4_w4a16t_kernel; opt-in likewise). Read once. */
static int g_w4_kw = -1, g_w4_u = -1, g_w4_persist = 1, g_w4_async = 1, g_w4_akw = 0, g_w4_gemv = 1, g_w4_gkw = 0, g_w4_gpers = -1, g_w4_gdec = 1, g_w4_lut = -2, g_w4_lut8 = 0;
static void w4_knobs(void) {
    if (g_w4_kw >= 0) return;
    const char *k = getenv("LASTSTAND_W4A16_KW"), *u = getenv("LASTSTAND_W4A16_U");
    const char *p = getenv("LASTSTAND_W4A16_PERSIST");
    const char *as = getenv("LASTSTAND_W4A16_ASYNC"), *akw = getenv("LASTSTAND_W4A16_AKW");
    int kv = k ? atoi(k) : 0, uv = u ? atoi(u) : 0;
    g_w4_persist = p && !strcmp(p, "1");
    g_w4_async = as ? atoi(as) : 1; /* the cp.async kernel up to this M (H200: M = 1 only pays) */
    g_w4_akw = akw ? atoi(akw) : 0;
    const char *gv = getenv("LASTSTAND_W4A16_GEMV"), *gkw = getenv("LASTSTAND_W4A16_GKW");
    g_w4_gemv = gv ? atoi(gv) : 1;
    g_w4_gkw = gkw ? atoi(gkw) : 0;
    const char *gp = getenv("LASTSTAND_W4A16_GPERSIST");
    g_w4_gpers = gp ? !!atoi(gp) : -1;
    const char *gd = getenv("LASTSTAND_W4A16_GDEC");
    g_w4_gdec = gd && atoi(gd) == 2 ? 2 : 1;
    const char *lt = getenv("LASTSTAND_W4A16_LUT");
    g_w4_lut = lt ? atoi(lt) : -2; /* -2: the default per instance, gvt_default */
    if (lt && g_w4_lut != 1 && g_w4_lut != 2 && g_w4_lut != 4 && g_w4_lut != 10 && g_w4_lut != 12) g_w4_lut = 0;
    const char *l8 = getenv("LASTSTAND_W4A16_LUT8");
    g_w4_lut8 = l8 && atoi(l8) == 1;
    g_w4_u = uv == 2 || uv == 4 || uv == 8 ? uv : 4;
    g_w4_kw = kv == 1 || kv == 2 || kv == 4 || kv == 8 || kv == 16 ? kv : 0;
}

static int w4_supported(const dev_info *d, const gemm_shape *s, char *why, size_t n) {
    if (!common_supported(d, s, why, n)) return 0;
    if (d->cc_major < 8) {
        snprintf(why, n, "mma.sync bf16 needs compute capability >= 8.0, this GPU is %d.%d",
                 d->cc_major, d->cc_minor);
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
        return errf(e, ERR_UNSUPPORTED, "cuda_w4a16_mma: needs K %% 128 == 0 and N %% 16 == 0 (N=%d K=%d)",
                    w->N, w->K);
    if (((uintptr_t)a->x | (uintptr_t)w->data) & 15 || (uintptr_t)w->scale & 1)
        return errf(e, ERR_UNSUPPORTED, "cuda_w4a16_mma: x and weight must be 16-byte aligned, scales 2-byte");
    if (a->M <= 0) return 0;
    int nchunks = w->K / W4_CHUNK;
    int mt = a->M <= 8 ? 1 : a->M <= 16 ? 2 : 4;
    int mtiles = (a->M + 8 * mt - 1) / (8 * mt);
    /* Split K over more warps until about 16 warps per SM have loads in flight
     * (132 SMs on an H200), never below one chunk per warp. */
    w4_knobs();
    cudaStream_t st = (cudaStream_t)s;
    static int sms = 0;
    if (!sms) {
        int dev = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (sms < 1) sms = 1;
    }
    int gkw = 0, gper = 0;
    /* the GEMV kernels copy the scales 4 bytes at a time (rows are K / 16 bytes, K % 128 == 0) */
    if (a->M == 1 && g_w4_gemv && !((uintptr_t)w->scale & 3) &&
        gv_pick(nchunks, w->N / 16, sms, g_w4_gkw, &gkw, &gper)) {
        /* one tile per block by default: the persistent form (loads of the next tile
         * under the decode of this one) measured slower on the H200 (2026-11-29,
         * [16384 x 4096] 21.1 vs 19.8 us: the kernel is bound by the integer pipe,
         * not by load latency; bench/RESULTS.md); LASTSTAND_W4A16_GPERSIST=1 forces it */
        int pers = g_w4_gpers > 0;
        /* the default table decode yields to an explicitly asked GDEC=2 / GPERSIST=1 */
        const int lut = g_w4_lut != -2 ? g_w4_lut : g_w4_gdec != 2 && !pers ? gvt_default(gkw, gper) : 0;
        if (lut > 0) {
            if (lut == 1) gvt_run_kw<1, 0>(gkw, gper, a, st);
            else if (lut == 10) gvt_run_kw<0, 0>(gkw, gper, a, st); /* no table, the x reads alone */
            else if (lut == 2) gvt_run_kw<2, 0>(gkw, gper, a, st);
            else if (lut == 4) gvt_run_kw<4, 0>(gkw, gper, a, st);
            else gvt_run_kw<2, 1>(gkw, gper, a, st); /* 12: L = 2, codes in registers */
            CU_LAUNCHED(e, "fp4_gemm cuda_w4a16_mma (gemv, table decode)");
            return 0;
        }
        if (g_w4_gdec == 2) {
            gv2_run_kw(gkw, gper, a, st);
            CU_LAUNCHED(e, "fp4_gemm cuda_w4a16_mma (gemv, bit-placement decode)");
            return 0;
        }
        if (pers) gvp_run_kw(gkw, gper, a, st, sms);
        else gv_run_kw(gkw, gper, a, st);
        CU_LAUNCHED(e, pers ? "fp4_gemm cuda_w4a16_mma (gemv, persistent)" : "fp4_gemm cuda_w4a16_mma (gemv)");
        return 0;
    }
    if (mt == 1 && a->M >= 2 && g_w4_lut8 && gv_pick(nchunks, w->N / 16, sms, g_w4_gkw, &gkw, &gper)) {
        w4t_run_kw(gkw, gper, a, st);
        CU_LAUNCHED(e, "fp4_gemm cuda_w4a16_mma (M <= 8, table decode)");
        return 0;
    }
    if (mt == 1 && a->M <= g_w4_async && !g_w4_persist) {
        /* the cp.async streaming kernel: 16 warps a tile when the tiles barely fill the
         * GPU twice, else 8 (H200, 2026-11-29: [4096 x 4096] 9.3 vs 9.8 us, [16384 x 4096]
         * 21.1 vs 21.8 us); 1..4 chunks per warp */
        int kw = 0;
        if (g_w4_akw == 8 || g_w4_akw == 16) kw = g_w4_akw;
        else if (nchunks % 16 == 0 && nchunks / 16 <= 2 && w->N / 16 <= 2 * sms) kw = 16;
        else kw = 8;
        int per = nchunks / kw;
        if (nchunks % kw || per > (kw == 16 ? 2 : 4) || per == 3) kw = 0;
        if (kw) {
            if (kw == 16) w4a_launch_per<16>(per, a, st);
            else w4a_launch_per<8>(per, a, st);
            CU_LAUNCHED(e, "fp4_gemm cuda_w4a16_mma (cp.async)");
            return 0;
        }
    }
    if (mt == 1 && g_w4_persist && nchunks <= 64) {
        int per = (nchunks + 7) / 8;
        if (per <= 1) w4p_launch<1>(a, st);
        else if (per <= 2) w4p_launch<2>(a, st);
        else if (per <= 4) w4p_launch<4>(a, st);
        else w4p_launch<8>(a, st);
        CU_LAUNCHED(e, "fp4_gemm cuda_w4a16_mma (persistent)");
        return 0;
    }
    /* M <= 8: split K as wide as the chunks allow (the H200 sweep in
     * bench/RESULTS.md: 8 warps of 4 chunks beat 2 warps of 16 at [16384 x 4096]);
     * larger M: about 16 warps per SM with loads in flight */
    long tiles = (long)(w->N / 16) * mtiles;
    int kw = 1;
    if (mt == 1)
        while (kw < 8 && nchunks >= 2 * kw) kw *= 2;
    else
        while (kw < 8 && tiles * kw < 2048 && nchunks >= 2 * kw) kw *= 2;
    if (g_w4_kw > 0 && nchunks >= g_w4_kw) kw = g_w4_kw;
    if (mtiles > 65535) return errf(e, ERR_UNSUPPORTED, "cuda_w4a16_mma: M=%d too large", a->M);
    dim3 grid(w->N / 16, mtiles);
    if (mt == 1 && g_w4_u == 8) w4_launch_kw<1, 8>(kw, grid, st, a);
    else if (mt == 1 && g_w4_u == 2) w4_launch_kw<1, 2>(kw, grid, st, a);
    else if (mt == 1) w4_launch_kw<1, 4>(kw, grid, st, a);
    else if (mt == 2) w4_launch_kw<2, 4>(kw, grid, st, a);
    else w4_launch_kw<4, 4>(kw, grid, st, a);
    CU_LAUNCHED(e, "fp4_gemm cuda_w4a16_mma");
    return 0;
}

const fp4_gemm_impl fp4_gemm_cuda_w4a16_mma = {"cuda_w4a16_mma", DEV_CUDA, 0, w4_supported, w4_run, 1};

/* ---- cuBLASLt, loaded on first use ------------------------------------------------ */
/* libcublasLt is 540 MB: linking it made every start of the binary (every CLI
 * call, every doctor child) pay ~0.6 s before main(). It is dlopen()ed the first
 * time a backend needs it instead; the binary's RUNPATH ($CUDA_HOME/lib64) and
 * the usual library path are searched. */
typedef struct lt_api {
    decltype(&cublasLtCreate) Create;
    decltype(&cublasLtGetStatusString) GetStatusString;
    decltype(&cublasLtMatmul) Matmul;
    decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
    decltype(&cublasLtMatmulDescCreate) MatmulDescCreate;
    decltype(&cublasLtMatmulDescDestroy) MatmulDescDestroy;
    decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
    decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
    decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
    decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
    decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
    decltype(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
} lt_api;
static lt_api g_api;
static char g_api_err[256];
static pthread_once_t g_api_once = PTHREAD_ONCE_INIT;

static void lt_api_load(void) {
    static const char *const libs[] = {"libcublasLt.so.13", "libcublasLt.so", "/usr/local/cuda/lib64/libcublasLt.so.13"};
    void *h = NULL;
    for (size_t i = 0; !h && i < sizeof libs / sizeof libs[0]; i++) h = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(g_api_err, sizeof g_api_err, "cannot load libcublasLt.so.13: %s", dlerror());
        return;
    }
    if (!(g_api.Create = (decltype(&cublasLtCreate))dlsym(h, "cublasLtCreate"))) {
        snprintf(g_api_err, sizeof g_api_err, "libcublasLt has no cublasLtCreate");
        return;
    }
    if (!(g_api.GetStatusString = (decltype(&cublasLtGetStatusString))dlsym(h, "cublasLtGetStatusString"))) {
        snprintf(g_api_err, sizeof g_api_err, "libcublasLt has no cublasLtGetStatusString");
        return;
    }
    if (!(g_api.Matmul = (decltype(&cublasLtMatmul))dlsym(h, "cublasLtMatmul"))) {
        snprintf(g_api_err, sizeof g_api_err, "libcublasLt has no cublasLtMatmul");
        return;
    }
    if (!(g_api.MatmulAlgoGetHeuristic = (decltype(&cublasLtMatmulAlgoGetHeuristic))dlsym(h, "cublasLtMatmulAlgoGetHeuristic"))) {
        snprintf(g_api_err, sizeof g_api_err, "libcublasLt has no cublasLtMatmulAlgoGetHeuristic");
        return;
    }
    if (!(g_api.MatmulDescCreate = (decltype(&cublasLtMatmulDescCreate))dlsym(h, "cublasLtMatmulDescCreate"))) {
        snprintf(g_api_err, sizeof g_api_err, "libcublasLt has no cublasLtMatmulDescCreate");
        return;
    }
    if (!(g_api.MatmulDescDestroy = (decltype(&cublasLtMatmulDescDestroy))dlsym(h, "cublasLtMatmulDescDestroy"))) {
        snprintf(g_api_err, sizeof g_api_err, "libcublasLt has no cublasLtMatmulDescDestroy");
        return;
    }
    if (!(g_api.MatmulDescSetAttribute = (decltype(&cublasLtMatmulDescSetAttribute))dlsym(h, "cublasLtMatmulDescSetAttribute"))) {
        snprintf(g_api_err, sizeof g_api_err, "libcublasLt has no cublasLtMatmulDescSetAttribute");
        return;
    }
    if (!(g_api.MatmulPreferenceCreate = (decltype(&cublasLtMatmulPreferenceCreate))dlsym(h, "cublasLtMatmulPreferenceCreate"))) {
        snprintf(g_api_err, sizeof g_api_err, "libcublasLt has no cublasLtMatmulPreferenceCreate");
        return;
    }
    if (!(g_api.MatmulPreferenceDestroy = (decltype(&cublasLtMatmulPreferenceDestroy))dlsym(h, "cublasLtMatmulPreferenceDestroy"))) {
        snprintf(g_api_err, sizeof g_api_err, "libcublasLt has no cublasLtMatmulPreferenceDestroy");
        return;
    }
    if (!(g_api.MatmulPreferenceSetAttribute = (decltype(&cublasLtMatmulPreferenceSetAttribute))dlsym(h, "cublasLtMatmulPreferenceSetAttribute"))) {
        snprintf(g_api_err, sizeof g_api_err, "libcublasLt has no cublasLtMatmulPreferenceSetAttribute");
        return;
    }
    if (!(g_api.MatrixLayoutCreate = (decltype(&cublasLtMatrixLayoutCreate))dlsym(h, "cublasLtMatrixLayoutCreate"))) {
        snprintf(g_api_err, sizeof g_api_err, "libcublasLt has no cublasLtMatrixLayoutCreate");
        return;
    }
    if (!(g_api.MatrixLayoutDestroy = (decltype(&cublasLtMatrixLayoutDestroy))dlsym(h, "cublasLtMatrixLayoutDestroy"))) {
        snprintf(g_api_err, sizeof g_api_err, "libcublasLt has no cublasLtMatrixLayoutDestroy");
        return;
    }
}

/* 0, or ERR_UNSUPPORTED naming what is missing */
static int lt_api_get(ls_err *e) {
    pthread_once(&g_api_once, lt_api_load);
    if (g_api_err[0]) return errf(e, ERR_UNSUPPORTED, "cuBLASLt: %s", g_api_err);
    return 0;
}

/* ---- cuBLASLt state (per device, lazily) ------------------------------------- */

enum { LT_MAX_DEV = 16, LT_WS_BYTES = 32 << 20, LT_CACHE = 64 };

typedef struct lt_algo_entry {
    int M, N, K, beta1, d32;
    cublasLtMatmulAlgo_t algo;
    int valid;
} lt_algo_entry;

typedef struct lt_state {
    cublasLtHandle_t h;
    void *ws;                 /* cuBLASLt workspace, LT_WS_BYTES */
    void *wbuf;               /* dequantized BF16 weight */
    size_t wbuf_cap;
    lt_algo_entry cache[LT_CACHE];
    int n_cache;
    pthread_mutex_t mu;
    int init;
} lt_state;

static lt_state g_lt[LT_MAX_DEV];
static pthread_mutex_t g_lt_mu = PTHREAD_MUTEX_INITIALIZER;

static int lt_get(lt_state **out, ls_err *e) {
    int rc = lt_api_get(e);
    if (rc) return rc;
    int dev = 0;
    CU_TRY(e, cudaGetDevice(&dev), "cudaGetDevice");
    if (dev < 0 || dev >= LT_MAX_DEV) return errf(e, ERR_UNSUPPORTED, "cuBLASLt: device %d out of range", dev);
    lt_state *L = &g_lt[dev];
    pthread_mutex_lock(&g_lt_mu);
    if (!L->init) {
        cublasStatus_t st = g_api.Create(&L->h);
        if (st != CUBLAS_STATUS_SUCCESS) {
            pthread_mutex_unlock(&g_lt_mu);
            return errf(e, ERR_RUNTIME, "cublasLtCreate: %s", g_api.GetStatusString(st));
        }
        cudaError_t c = cudaMalloc(&L->ws, LT_WS_BYTES);
        if (c != cudaSuccess) {
            pthread_mutex_unlock(&g_lt_mu);
            return cu_fail(e, c, "cuBLASLt workspace");
        }
        pthread_mutex_init(&L->mu, NULL);
        L->init = 1;
    }
    pthread_mutex_unlock(&g_lt_mu);
    *out = L;
    return 0;
}

/* D[M,N] = alpha · A[M,K] · Wᵀ + beta · D (all BF16 row-major), as the
 * column-major product Dᵀ[N,M] = W[N,K] · Aᵀ: opA = T on W (K x N col-major),
 * opB = N on A (K x M col-major). Caller holds L->mu. */
static int lt_matmul(lt_state *L, int M, int N, int K, const void *W, const void *A, void *D, int d32,
                     float alpha, float beta, cudaStream_t st, ls_err *e) {
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasStatus_t s;
    int rc = 0;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
#define LT_TRY(x)                                                                       \
    do {                                                                                \
        s = (x);                                                                        \
        if (s != CUBLAS_STATUS_SUCCESS) {                                               \
            rc = errf(e, ERR_RUNTIME, "cuBLASLt %s: %s", #x, g_api.GetStatusString(s)); \
            goto done;                                                                  \
        }                                                                               \
    } while (0)
    LT_TRY(g_api.MatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_TRY(g_api.MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_TRY(g_api.MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT_TRY(g_api.MatrixLayoutCreate(&la, CUDA_R_16BF, K, N, K));
    LT_TRY(g_api.MatrixLayoutCreate(&lb, CUDA_R_16BF, K, M, K));
    LT_TRY(g_api.MatrixLayoutCreate(&lc, d32 ? CUDA_R_32F : CUDA_R_16BF, N, M, N));
    {
        int beta1 = beta != 0.f;
        lt_algo_entry *hit = NULL;
        for (int i = 0; i < L->n_cache; i++)
            if (L->cache[i].M == M && L->cache[i].N == N && L->cache[i].K == K &&
                L->cache[i].beta1 == beta1 && L->cache[i].d32 == d32)
                hit = &L->cache[i];
        if (!hit) {
            cublasLtMatmulPreference_t pref = NULL;
            cublasLtMatmulHeuristicResult_t res;
            int nres = 0;
            size_t wsb = LT_WS_BYTES;
            LT_TRY(g_api.MatmulPreferenceCreate(&pref));
            s = g_api.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &wsb, sizeof wsb);
            if (s == CUBLAS_STATUS_SUCCESS)
                s = g_api.MatmulAlgoGetHeuristic(L->h, op, la, lb, lc, lc, pref, 1, &res, &nres);
            g_api.MatmulPreferenceDestroy(pref);
            if (s != CUBLAS_STATUS_SUCCESS || nres < 1) {
                rc = errf(e, ERR_UNSUPPORTED, "cuBLASLt has no algorithm for M=%d N=%d K=%d: %s", M, N,
                          K, g_api.GetStatusString(s));
                goto done;
            }
            int slot = L->n_cache < LT_CACHE ? L->n_cache++ : (M + N + K) % LT_CACHE;
            L->cache[slot] = (lt_algo_entry){M, N, K, beta1, d32, res.algo, 1};
            hit = &L->cache[slot];
        }
        LT_TRY(g_api.Matmul(L->h, op, &alpha, W, la, A, lb, &beta, D, lc, D, lc, &hit->algo, L->ws,
                              LT_WS_BYTES, st));
    }
done:
#undef LT_TRY
    if (lc) g_api.MatrixLayoutDestroy(lc);
    if (lb) g_api.MatrixLayoutDestroy(lb);
    if (la) g_api.MatrixLayoutDestroy(la);
    if (op) g_api.MatmulDescDestroy(op);
    return rc;
}

/* ---- cuda_dequant_cublas ------------------------------------------------------- */

/* One thread: 16 code bytes (32 elements, 2 scale blocks) -> 64 B of bf16. */
__global__ void fp4_dequant_kernel(size_t n16, int K, const uint8_t *__restrict__ w,
                                   const uint8_t *__restrict__ sc, bf16 *__restrict__ out) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n16) return;
    uint4 v = cu_ld_stream16(w + i * 16);
    size_t e0 = i * 32; /* first element; K % 32 == 0 so both blocks are in one row */
    size_t row = e0 / K, kk = e0 % K;
    const uint8_t *sr = sc + row * (K / 16) + kk / 16;
    uint32_t sa = cu_scale_bf16x2(sr[0]), sb = cu_scale_bf16x2(sr[1]);
    const uint32_t q[4] = {v.x, v.y, v.z, v.w};
    uint4 *o = reinterpret_cast<uint4 *>(out + e0);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t r[4];
        cu_e2m1x8_to_bf16x8(q[j], r);
        uint32_t s = j < 2 ? sa : sb;
        o[j] = make_uint4(cu_bf16x2_mul(r[0], s), cu_bf16x2_mul(r[1], s), cu_bf16x2_mul(r[2], s),
                          cu_bf16x2_mul(r[3], s));
    }
}

static int dq_supported(const dev_info *d, const gemm_shape *s, char *why, size_t n) {
    if (!common_supported(d, s, why, n)) return 0;
    if (s->K % 32) {
        snprintf(why, n, "needs K %% 32 == 0 (K=%d)", s->K);
        return 0;
    }
    return 1;
}

static int dq_run(const gemm_args *a, ls_stream s, ls_err *e) {
    int rc = fp4_check_args(a, e);
    if (rc) return rc;
    const lin_w *w = a->w;
    if (w->K % 32) return errf(e, ERR_UNSUPPORTED, "cuda_dequant_cublas: needs K %% 32 == 0 (K=%d)", w->K);
    if ((uintptr_t)w->data & 15)
        return errf(e, ERR_UNSUPPORTED, "cuda_dequant_cublas: weight must be 16-byte aligned");
    if (a->M <= 0) return 0;
    lt_state *L;
    if ((rc = lt_get(&L, e))) return rc;
    pthread_mutex_lock(&L->mu);
    size_t need = (size_t)w->N * w->K * 2;
    if (need > L->wbuf_cap) {
        if (L->wbuf) cudaFree(L->wbuf);
        L->wbuf = NULL;
        L->wbuf_cap = 0;
        cudaError_t c = cudaMalloc(&L->wbuf, need);
        if (c != cudaSuccess) {
            pthread_mutex_unlock(&L->mu);
            return cu_fail(e, c, "cuda_dequant_cublas workspace");
        }
        L->wbuf_cap = need;
    }
    cudaStream_t st = (cudaStream_t)s;
    size_t n16 = (size_t)w->N * w->K / 32;
    fp4_dequant_kernel<<<(unsigned)((n16 + 255) / 256), 256, 0, st>>>(
        n16, w->K, (const uint8_t *)w->data, w->scale, (bf16 *)L->wbuf);
    cudaError_t c = cudaGetLastError();
    if (c != cudaSuccess) {
        pthread_mutex_unlock(&L->mu);
        return cu_fail(e, c, "fp4_gemm cuda_dequant_cublas (dequant)");
    }
    rc = lt_matmul(L, a->M, w->N, w->K, L->wbuf, a->x, a->y, 0, w->scale2, a->accumulate ? 1.f : 0.f, st,
                   e);
    pthread_mutex_unlock(&L->mu);
    return rc;
}

/* graph_safe: the BF16 buffer only grows with the largest weight, reached by the warm-up pass */
const fp4_gemm_impl fp4_gemm_cuda_dequant_cublas = {"cuda_dequant_cublas", DEV_CUDA, 0, dq_supported,
                                                    dq_run, 1};

/* ---- test-only broken backends ------------------------------------------------- */

__global__ void poison_nan_kernel(size_t n, bf16 *y) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 97;
    if (i < n) y[i] = __float2bfloat16_rn(__int_as_float(0x7fc00000));
}

static int nan3072_run(const gemm_args *a, ls_stream s, ls_err *e) {
    int rc = fp4_ref_run(a, s, e);
    if (rc || a->M != 3072) return rc;
    size_t n = (size_t)a->M * a->w->N;
    size_t thr = (n + 96) / 97;
    poison_nan_kernel<<<(unsigned)((thr + 255) / 256), 256, 0, (cudaStream_t)s>>>(n, (bf16 *)a->y);
    CU_LAUNCHED(e, "fp4_gemm cuda_broken_nan3072");
    return 0;
}

const fp4_gemm_impl fp4_gemm_cuda_broken_nan3072 = {"cuda_broken_nan3072", DEV_CUDA, 1,
                                                    fp4_ref_supported, nan3072_run};

__global__ void illegal_kernel(bf16 *y) {
    /* far past any allocation: the store faults with an illegal address */
    bf16 *bad = y + ((size_t)1 << 40) + threadIdx.x;
    *reinterpret_cast<volatile bf16 *>(bad) = __float2bfloat16_rn(1.f);
}

static int illegal_run(const gemm_args *a, ls_stream s, ls_err *e) {
    int rc = fp4_check_args(a, e);
    if (rc) return rc;
    illegal_kernel<<<1, 32, 0, (cudaStream_t)s>>>((bf16 *)a->y);
    CU_LAUNCHED(e, "fp4_gemm cuda_broken_illegal");
    return 0;
}

const fp4_gemm_impl fp4_gemm_cuda_broken_illegal = {"cuda_broken_illegal", DEV_CUDA, 1,
                                                    common_supported, illegal_run};

static int sm100_run(const gemm_args *a, ls_stream s, ls_err *e) {
    int rc = fp4_check_args(a, e);
    if (rc) return rc;
    return lsc_broken_sm100_launch(a, s, e);
}

/* Declares itself supported everywhere, as a kernel library that only checks
 * the device's name would: the missing sm_90 image is found by the launch. */
const fp4_gemm_impl fp4_gemm_cuda_broken_sm100 = {"cuda_broken_sm100", DEV_CUDA, 1, common_supported,
                                                  sm100_run};

/* ---- gemm (BF16 weight) ---------------------------------------------------------- */

static int bf_check(const gemm_args *a, const char *who, ls_err *e) {
    if (!a->w || a->w->kind != W_BF16)
        return errf(e, ERR_UNSUPPORTED, "gemm %s: weight %s is %s, needs BF16", who,
                    a->w && a->w->name ? a->w->name : "?", a->w ? w_kind_name(a->w->kind) : "?");
    if (a->dt != ACT_BF16)
        return errf(e, ERR_UNSUPPORTED, "gemm %s: activations must be BF16", who);
    return 0;
}

static int bf_supported(const dev_info *d, const gemm_shape *s, char *why, size_t n) {
    if (!common_supported(d, s, why, n)) return 0;
    if (s->wk != W_BF16) {
        snprintf(why, n, "weight must be BF16, got %s", w_kind_name(s->wk));
        return 0;
    }
    return 1;
}

static int lt_run(const gemm_args *a, ls_stream s, ls_err *e) {
    int rc = bf_check(a, "cuda_cublaslt", e);
    if (rc) return rc;
    if (a->M <= 0) return 0;
    lt_state *L;
    if ((rc = lt_get(&L, e))) return rc;
    pthread_mutex_lock(&L->mu);
    rc = lt_matmul(L, a->M, a->w->N, a->w->K, a->w->data, a->x, a->y, 0, 1.f, a->accumulate ? 1.f : 0.f,
                   (cudaStream_t)s, e);
    pthread_mutex_unlock(&L->mu);
    return rc;
}

const gemm_impl gemm_cuda_cublaslt = {"cuda_cublaslt", DEV_CUDA, 0, bf_supported, lt_run, 1};

/* The BF16 reference: a plain shared-memory tiled product, fp32 accumulation
 * in k order; a 64 x 64 output tile per block of 16 x 16 threads, 4 x 4 each. */
__global__ void bf_ref_kernel(int M, int N, int K, const bf16 *__restrict__ x, const bf16 *__restrict__ w,
                              bf16 *__restrict__ y, int accumulate) {
    __shared__ float xs[16][65], ws[16][65];
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 16 + tx;
    const int m0 = blockIdx.x * 64, n0 = blockIdx.y * 64;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += 16) {
        for (int i = tid; i < 16 * 64; i += 256) {
            int r = i / 16, kk = i % 16; /* r: row within the tile, kk: k within the step */
            int m = m0 + r, n = n0 + r, k = k0 + kk;
            xs[kk][r] = m < M && k < K ? __bfloat162float(x[(size_t)m * K + k]) : 0.f;
            ws[kk][r] = n < N && k < K ? __bfloat162float(w[(size_t)n * K + k]) : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < 16; kk++)
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(xs[kk][ty + 16 * i], ws[kk][tx + 16 * j], acc[i][j]);
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
            if (m >= M || n >= N) continue;
            size_t o = (size_t)m * N + n;
            float v = acc[i][j];
            if (accumulate) v += __bfloat162float(y[o]);
            y[o] = __float2bfloat16_rn(v);
        }
}

static int bf_ref_run(const gemm_args *a, ls_stream s, ls_err *e) {
    int rc = bf_check(a, "cuda_ref", e);
    if (rc) return rc;
    if (a->M <= 0) return 0;
    dim3 grid((a->M + 63) / 64, (a->w->N + 63) / 64), block(16, 16);
    if (grid.y > 65535) return errf(e, ERR_UNSUPPORTED, "gemm cuda_ref: N=%d too large", a->w->N);
    bf_ref_kernel<<<grid, block, 0, (cudaStream_t)s>>>(a->M, a->w->N, a->w->K, (const bf16 *)a->x,
                                                      (const bf16 *)a->w->data, (bf16 *)a->y,
                                                      a->accumulate);
    CU_LAUNCHED(e, "gemm cuda_ref");
    return 0;
}

const gemm_impl gemm_cuda_ref = {"cuda_ref", DEV_CUDA, 0, bf_supported, bf_ref_run, 1};

/* D[M,N] = alpha · A[M,K]·Wᵀ (+ beta·D), W and A BF16, D BF16 or (d32) fp32:
 * for the other families of this module (the MoE router's fp32 logits). */
int cu_lt_gemm(int M, int N, int K, const void *W, const void *A, void *D, int d32, float alpha,
               float beta, cudaStream_t st, ls_err *e) {
    lt_state *L;
    int rc = lt_get(&L, e);
    if (rc) return rc;
    pthread_mutex_lock(&L->mu);
    rc = lt_matmul(L, M, N, K, W, A, D, d32, alpha, beta, st, e);
    pthread_mutex_unlock(&L->mu);
    return rc;
}
