/* gemv_floor.cu: the physical floor of the M = 1 NVFP4 GEMV in the doctor's harness
 * (gemv5 session). Standalone (not part of the server): nvcc -O3 -std=c++17 -Isrc
 * -gencode=arch=compute_90a,code=sm_90a -o gemv_floor bench/kernels/gemv_floor.cu;
 * bench/device/gemv5.sh builds and runs it.
 *
 * A streaming-read kernel that moves exactly the bytes of an NVFP4 weight [N x K]
 * (codes N*K/2 + E4M3 scales N*K/16: 9,437,184 B at [4096 x 4096]) in the grid shape of
 * fp4_gemv.cu's GEMV (one block per R-row tile, 16 rows: 256 blocks at N = 4096), every
 * byte by 16-byte cp.async into shared memory (as the GEMV stages them), then a trivial
 * XOR reduction (so no load is dead) and one word per block written after
 * griddepcontrol.wait (as the GEMV writes y). Optionally a synthetic "decode" of D
 * dependent integer/FMA-pipe instructions per 16 B staged, to see how a decode cost
 * per byte moves the chained time. Timed as the doctor times (src/doctor/trial.c,
 * chain8): (event, 8 calls back to back on 8 rotating weight sets > L2, event), per-call
 * time = elapsed / 8, median of 200 samples; with and without programmatic dependent
 * launch (griddepcontrol.launch_dependents first thing, griddepcontrol.wait before the
 * write). Blocks per SM are forced with padded dynamic shared memory.
 * Also the device-to-device copy bandwidth (bytes read + written) as the doctor
 * measures it, so that the % column matches the doctor's.
 *
 * x (16 B a thread, 8 KB a block; the decode depends on it) is read after griddepcontrol.wait, as
 * the GEMV must (the previous kernel writes x), or, xb = 1, before it: what the chain
 * would cost without that serial step. hot/nl: 1 = one weight set, no rotation (the
 * weight streams from L2); 2 = no loads at all (the chain of launches, waits and writes).
 *
 * Then the real [4096 x 4096] default GEMV decomposed (gv_kernel below).
 *
 * `gemv_floor graph` (gtime session) runs only the graph section instead: the no-load chain,
 * the pure read and the real default at [4096 x 4096] (and its 8 x 4 / 4 x 8 forms at their
 * natural occupancy), each timed three ways (time_chain): on the stream as above, on the stream
 * behind a hold kernel (the host's enqueue rate off the clock, as the doctor's lsc_hold does;
 * the sections above have no hold, so their short chains include the host's ~4 us per launch),
 * and as a captured CUDA graph behind a hold (how the engine replays a decode step).
 *
 * `gemv_floor fp8` (gtime session): the FP8 split-x prototype g8_kernel against the shipped BF16
 * form on random data (y compared with each other and with fp64 on a sample of rows), then
 * timed as in the graph section. Measured bit-identical and 9% slower (bench/RESULTS.md).
 *
 * Output: one line per configuration: shape, rows/block, threads, blocks/SM (fit /
 * asked), bytes in flight per SM, PDL, D, pf, xb, hot/nl, us per call, GB/s, % of copy. */
#include <cuda_runtime.h>
#include <cuda_fp8.h>
#include <math.h>

#include "ops/cuda/cu_pdl.h" /* cu_pdl_wait / cu_pdl_trigger / cu_launch_pdl, as the GEMV */
#include "ops/cuda/nvfp4.cuh" /* the real chunk step of the GEMV (header-only device code) */

#include <algorithm>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#define CK(x)                                                                                                  \
    do {                                                                                                       \
        cudaError_t e_ = (x);                                                                                  \
        if (e_ != cudaSuccess) {                                                                               \
            fprintf(stderr, "gemv_floor: %s: %s (line %d)\n", #x, cudaGetErrorString(e_), __LINE__);           \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)

/* cp.async.wait_group n for n known after unrolling (as cu_util.h's cu_cp_async_wait_dyn) */
__device__ __forceinline__ void wait_dyn(int n) {
    switch (n) {
    case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;\n" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;\n" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;\n" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 7;\n" ::: "memory"); break;
    }
}

__device__ __forceinline__ void cp16(void *s, const void *g) {
    unsigned a = (unsigned)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(a), "l"(g));
}

/* Block b: rows [R b, R b + R) of codes (R * K/2 B) and scales (R * K/16 B), contiguous
 * in their arrays (row-major). Every thread copies its 16-byte pieces (strided by the
 * block size) at once, commits one group, waits, reads its own pieces back. */
__global__ void floor_kernel(const uint8_t *__restrict__ w, const uint8_t *__restrict__ sc, int K, int R, int D,
                             int pf, int xb, const uint32_t *__restrict__ xin, uint32_t *__restrict__ out) {
    extern __shared__ __align__(16) uint4 st[];
    cu_pdl_trigger();
    const size_t cb = (size_t)R * (K / 2), sb = (size_t)R * (K / 16);
    const uint4 *wg = reinterpret_cast<const uint4 *>(w + blockIdx.x * cb);
    const uint4 *sg = reinterpret_cast<const uint4 *>(sc + blockIdx.x * sb);
    const int nc = R ? (int)(cb / 16) : 0, ns = R ? (int)(sb / 16) : 0; /* R = 0: no loads (the launch chain alone) */
    for (int i = threadIdx.x; i < nc; i += blockDim.x) cp16(&st[i], wg + i);
    for (int i = threadIdx.x; i < ns; i += blockDim.x) cp16(&st[nc + i], sg + i);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    if ((int)blockIdx.x < pf) { /* as fp4_gemv.cu's gv_l2_prefetch: the whole weight into L2 */
        const size_t piece = 32768, wb = (size_t)gridDim.x * cb, sbb = (size_t)gridDim.x * sb;
        const size_t nw = (wb + piece - 1) / piece, nsb = (sbb + piece - 1) / piece;
        for (size_t i = blockIdx.x + (size_t)pf * threadIdx.x; i < nw + nsb; i += (size_t)pf * blockDim.x) {
            const size_t o = (i < nw ? i : i - nw) * piece, len = i < nw ? wb : sbb;
            const unsigned n = (unsigned)(len - o < piece ? len - o : piece);
            asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"((i < nw ? w : sc) + o), "r"(n)
                         : "memory");
        }
    }
    /* the "x" read: after the wait (as the GEMV must: the previous kernel writes x), or,
     * xb = 1, before it (what the chain would cost without that serial step; wrong for a
     * real GEMV, harmless here: nothing writes xin) */
    /* 16 B a thread from L2 (ld.global.cg, as the GEMV's cp.async.cg): a 512-thread block
     * reads the whole 8 KB of x at [4096 x 4096], as every GEMV block does */
    const uint4 *xg = reinterpret_cast<const uint4 *>(xin) + (threadIdx.x & 511);
    uint4 xv = make_uint4(0u, 0u, 0u, 0u);
    if (xb) xv = __ldcg(xg);
    cu_pdl_wait();
    if (!xb) xv = __ldcg(xg);
    uint32_t a = xv.x ^ xv.y ^ xv.z ^ xv.w;
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    for (int i = threadIdx.x; i < nc + ns; i += blockDim.x) {
        uint4 v = st[i];
        uint32_t h = v.x ^ v.y ^ v.z ^ v.w ^ a; /* the decode needs x, as the mma does */
        for (int d = 0; d < D; d += 4) { /* synthetic decode: 4 dependent ops a step */
            h = h * 0x9E3779B1u + (h >> 7);
            h ^= (h << 3) & 0x01C001C0u;
        }
        a ^= h;
    }
    for (int o = 16; o; o >>= 1) a ^= __shfl_xor_sync(0xffffffffu, a, o);
    __shared__ uint32_t red[32];
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = a;
    __syncthreads();
    if (threadIdx.x == 0) {
        uint32_t v = 0;
        for (int i = 0; i < (int)(blockDim.x >> 5); i++) v ^= red[i];
        out[blockIdx.x] = v;
    }
}

/* ---- the real [4096 x 4096] default, decomposed ---------------------------------
 * gv_kernel<XB, DEC> is fp4_gemv1t_kernel<16, 2, 0> of src/ops/cuda/fp4_gemv.cu (the M = 1
 * default at 16 warps x 2 chunks; same prologue, waits, chunk step nv4_gemv1t_chunk<0> from
 * nvfp4.cuh, epilogue; a copy of its skeleton as of the gemv5 session, for this
 * decomposition only) with two diagnostic switches that a real GEMV must not have:
 *   XB = 1: x copied before griddepcontrol.wait (nothing writes x in this bench), so the
 *           serial step "previous call complete -> x from L2" leaves the critical path;
 *   DEC = 0: no decode or mma: each chunk's codes and x are XORed into the sum instead.
 * Timed like the floor kernel (chain8, rotating sets or one hot set, PDL). */
enum { GK_KW = 16, GK_PER = 2, GK_PAD = 60 << 10 };
template <int XB, int DEC, int KW = GK_KW, int PER = GK_PER, int MINB = 2>
__global__ void __launch_bounds__(32 * KW, MINB)
    gv_kernel(int N, int K, const __nv_bfloat16 *__restrict__ x, const uint8_t *__restrict__ w,
              const uint8_t *__restrict__ sc, float scale2, __nv_bfloat16 *__restrict__ y) {
    __shared__ __align__(16) uint4 stage[KW][PER][2][32];
    __shared__ __align__(16) uint4 xs[KW][PER][16];
    __shared__ __align__(16) uint4 zb[2];
    __shared__ uint32_t ss[KW][PER][32];
    __shared__ float red[KW][16];
    cu_pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * 16, c0 = warp * PER;
    const uint8_t *wr0 = w + (size_t)(n0 + g) * (K / 2) + c0 * 64 + 16 * t;
    const uint8_t *wr1 = wr0 + (size_t)8 * (K / 2);
    const uint8_t *sg0 = sc + (size_t)(n0 + (lane >> 1)) * (K / 16) + c0 * 8 + 4 * (lane & 1);
#pragma unroll
    for (int u = 0; u < PER; u++) {
        cp16(&stage[warp][u][0][lane], wr0 + u * 64);
        cp16(&stage[warp][u][1][lane], wr1 + u * 64);
        nv4_cp_async4(&ss[warp][u][lane], sg0 + u * 8);
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    const nv4_lut lut = nv4_lut_make((threadIdx.x + 1u) * (uint32_t)(K & 127));
    const __nv_bfloat16 *xg = x + (size_t)c0 * 128 + 8 * (lane & 15);
    if (!XB) cu_pdl_wait();
#pragma unroll
    for (int u = 0; u < PER; u++) {
        if (lane < 16) cp16(&xs[warp][u][lane], xg + u * 128);
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    if (XB) cu_pdl_wait(); /* still before y */
    if (threadIdx.x < 2) zb[threadIdx.x] = make_uint4(0u, 0u, 0u, 0u);
    __syncthreads();
    const bool on = t == (g >> 1);
    const uint4 *px = on ? &xs[warp][0][4 * t + 2 * (g & 1)] : zb;
    const int sx = on ? 16 : 0;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int u = 0; u < PER; u++) {
        wait_dyn(PER - 1 - u);
        __syncwarp();
        const uint16_t *s16 = reinterpret_cast<const uint16_t *>(ss[warp][u]);
        float sg[4];
        nv4_e4m3x2_to_f32x2(s16[4 * g + t], sg[0], sg[1]);
        nv4_e4m3x2_to_f32x2(s16[4 * (g + 8) + t], sg[2], sg[3]);
        const uint4 a0 = stage[warp][u][0][lane], a1 = stage[warp][u][1][lane];
        const uint4 x0 = px[u * sx], x1 = px[u * sx + 1];
        if (DEC) {
            nv4_gemv1t_chunk<0>(a0, a1, x0, x1, sg, lut, 0u, acc);
        } else {
            acc[0] += __uint_as_float((a0.x ^ a1.y ^ x0.x ^ x1.w) & 0x3fffffffu) * sg[0];
            acc[2] += __uint_as_float((a0.z ^ a1.w ^ x0.y ^ x1.z) & 0x3fffffffu) * sg[2];
        }
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
        y[n0 + threadIdx.x] = __float2bfloat16_rn(v * scale2);
    }
}

template <int XB, int DEC>
static cudaError_t gv_launch(int pdl, int N, int K, cudaStream_t st, const __nv_bfloat16 *x, const uint8_t *w,
                             const uint8_t *sc, __nv_bfloat16 *y) {
    /* GK_PAD: every variant at 2 blocks an SM, as the GEMV (DEC = 0 needs 32 registers) */
    return cu_launch_pdl(pdl, gv_kernel<XB, DEC>, dim3(N / 16), dim3(32 * GK_KW), GK_PAD, st, N, K, x, w, sc, 1.0f, y);
}

/* the real kernel at KW warps x PER chunks, natural occupancy (no padding) */
template <int KW, int PER, int MINB = 2>
static cudaError_t gv_launch_kp(int pdl, int N, int K, cudaStream_t st, const __nv_bfloat16 *x, const uint8_t *w,
                                const uint8_t *sc, __nv_bfloat16 *y) {
    return cu_launch_pdl(pdl, gv_kernel<0, 1, KW, PER, MINB>, dim3(N / 16), dim3(32 * KW), 0, st, N, K, x, w, sc, 1.0f, y);
}

static cudaError_t launch(int pdl, dim3 grid, dim3 block, size_t smem, cudaStream_t st, const uint8_t *w,
                          const uint8_t *sc, int K, int R, int D, int pf, int xb, const uint32_t *xin,
                          uint32_t *out) {
    return cu_launch_pdl(pdl, floor_kernel, grid, block, smem, st, w, sc, K, R, D, pf, xb, xin, out);
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}


/* ---- the timing modes of the graph section (argv[1] == "graph", gtime session) ----
 * A hold kernel keeps the GPU busy (spinning on %globaltimer) while the host enqueues a
 * sample, as the doctor's lsc_hold does, so the host's launch rate stays off the clock. */
__global__ void hold_kernel(long long ns) {
    long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

/* mode 0: (event, chain calls, event) on the stream, no hold (the sections above);
 * 1: the same behind a hold; 2: the chain captured once as a CUDA graph (one graph per
 * group of chain consecutive sets, launched in turn), (event, graph launch, event) behind
 * a hold: how the engine runs a decode step. us per call, median of nsamp samples. */
template <class F>
static double time_chain(cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, int mode, int chain, int nsets, int nsamp,
                         F launch_k) {
    std::vector<cudaGraphExec_t> gx;
    if (mode == 2) {
        const int ng = (nsets + chain - 1) / chain;
        for (int g = 0; g < ng; g++) {
            cudaGraph_t gr;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            for (int i = 0; i < chain; i++) CK(launch_k(g * chain + i));
            CK(cudaStreamEndCapture(st, &gr));
            cudaGraphExec_t x;
            CK(cudaGraphInstantiateWithFlags(&x, gr, 0));
            CK(cudaGraphDestroy(gr));
            gx.push_back(x);
        }
        for (size_t g = 0; g < gx.size(); g++) CK(cudaGraphLaunch(gx[g], st)); /* warm-up (upload) */
    }
    int k = 0;
    for (int i = 0; i < 16; i++, k++) CK(launch_k(k));
    CK(cudaStreamSynchronize(st));
    std::vector<double> t;
    for (int smp = 0; smp < nsamp; smp++) {
        if (mode >= 1) hold_kernel<<<1, 1, 0, st>>>(mode == 2 ? 30000 : 20000 + 6000LL * chain);
        CK(cudaEventRecord(e0, st));
        if (mode == 2)
            CK(cudaGraphLaunch(gx[smp % gx.size()], st));
        else
            for (int i = 0; i < chain; i++, k++) CK(launch_k(k));
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        t.push_back(ms * 1e3 / chain);
    }
    CK(cudaGetLastError());
    for (cudaGraphExec_t x : gx) CK(cudaGraphExecDestroy(x));
    return median(t);
}

static int graph_section(const cudaDeviceProp &p, cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, double copy_gbs);


/* ---- the FP8 split-x form of the M = 1 GEMV (gtime prototype, `gemv_floor fp8`) ----------
 * The same tile, staging and epilogue as gv_kernel (16 rows a block, 16 warps x 2 chunks of
 * 128 k), but the arithmetic on FP8 tensor cores: mma.sync m16n8k32 e4m3 x e4m3 -> fp32.
 * - Weights: an E2M1 nibble (s e1 e0 m) placed as the E4M3 byte s 0 0 e1 e0 m 0 0 is exactly
 *   its value x 2^-6 (normals and the 0.5 subnormal alike); 5 integer ops per 8 weights.
 *   Low nibbles of a code word go to the A fragment's first k half, high nibbles to the second.
 * - x: per 16-element block a power of two fx (the block max scaled into [128, 256)), then
 *   hi = e4m3(x fx) and lo = e4m3(x fx - hi): 8 significant bits, as BF16 has. Converted by
 *   the warp (4 values a lane) into shared memory in the fragments' k order.
 * - Columns: B column g holds lane group t = g's k slice: hi for g < 4, lo for g >= 4, zero
 *   elsewhere, so each D column is one 16-k scale block's partial sum (block 2 tg + j / 2 for
 *   mma j), scaled by the weight's E4M3 block scale / fx afterwards in fp32; all 8 columns
 *   used, 4 mma a chunk (the BF16 form: 8 mma and ~3x the decode instructions). */
__device__ __forceinline__ void mma_e4m3_16832(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
/* E2M1 nibbles at even offsets (low nibble of each byte) / odd offsets -> E4M3 bytes, x 2^-6 */
__device__ __forceinline__ uint32_t e2m1_even_e4m3(uint32_t c) { return ((c << 2) & 0x1C1C1C1Cu) | ((c & 0x08080808u) << 4); }
__device__ __forceinline__ uint32_t e2m1_odd_e4m3(uint32_t c) { return ((c >> 2) & 0x1C1C1C1Cu) | (c & 0x80808080u); }
__device__ __forceinline__ uint32_t f2_e4m3(float a, float b) { /* a -> low byte */
    return (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE, __NV_E4M3);
}
__device__ __forceinline__ float2 e4m3_f2(uint32_t v) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)v, __NV_E4M3);
    return __half22float2(*reinterpret_cast<__half2 *>(&h));
}

template <int KW, int PER>
__global__ void __launch_bounds__(32 * KW, 2)
    g8_kernel(int N, int K, const __nv_bfloat16 *__restrict__ x, const uint8_t *__restrict__ w,
              const uint8_t *__restrict__ sc, float scale2, __nv_bfloat16 *__restrict__ y) {
    __shared__ __align__(16) uint4 stage[KW][PER][2][32];
    __shared__ __align__(16) uint8_t xq[KW][PER][2][128]; /* e4m3 hi / lo, fragment order */
    __shared__ float xf[KW][PER][8];                       /* 1 / fx per 16-k block */
    __shared__ uint32_t ss[KW][PER][32];
    __shared__ float red[KW][16];
    cu_pdl_trigger();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int n0 = blockIdx.x * 16, c0 = warp * PER;
    const uint8_t *wr0 = w + (size_t)(n0 + g) * (K / 2) + c0 * 64 + 16 * t;
    const uint8_t *wr1 = wr0 + (size_t)8 * (K / 2);
    const uint8_t *sg0 = sc + (size_t)(n0 + (lane >> 1)) * (K / 16) + c0 * 8 + 4 * (lane & 1);
#pragma unroll
    for (int u = 0; u < PER; u++) {
        cp16(&stage[warp][u][0][lane], wr0 + u * 64);
        cp16(&stage[warp][u][1][lane], wr1 + u * 64);
        nv4_cp_async4(&ss[warp][u][lane], sg0 + u * 8);
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    /* x (the previous kernel's output) after the wait: 4 values a lane a chunk, straight from L2 */
    cu_pdl_wait();
    uint2 xr[PER];
#pragma unroll
    for (int u = 0; u < PER; u++) xr[u] = __ldcg(reinterpret_cast<const uint2 *>(x + (size_t)(c0 + u) * 128) + lane);
    float acc0 = 0.f, acc1 = 0.f; /* rows g, g + 8 */
#pragma unroll
    for (int u = 0; u < PER; u++) {
        /* x of the chunk -> hi / lo E4M3 in fragment order: lane L takes k = 4L .. 4L + 3 */
        {
            const uint2 raw = xr[u];
            const float2 v01 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&raw.x));
            const float2 v23 = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(&raw.y));
            float m = fmaxf(fmaxf(fabsf(v01.x), fabsf(v01.y)), fmaxf(fabsf(v23.x), fabsf(v23.y)));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
            /* fx = 2^(7 - floor(log2 m)): the block max lands in [128, 256) */
            int ex = (int)((__float_as_uint(m) >> 23) & 0xff) - 127;
            ex = ex < -120 ? -120 : ex; /* 0 and subnormal blocks: any scale is exact enough */
            const float fx = __uint_as_float((uint32_t)(127 + 7 - ex) << 23);
            const float s0 = v01.x * fx, s1 = v01.y * fx, s2 = v23.x * fx, s3 = v23.y * fx;
            const uint32_t h02 = f2_e4m3(s0, s2), h13 = f2_e4m3(s1, s3);
            const float2 b02 = e4m3_f2(h02), b13 = e4m3_f2(h13);
            const uint32_t l02 = f2_e4m3(s0 - b02.x, s2 - b02.y), l13 = f2_e4m3(s1 - b13.x, s3 - b13.y);
            /* k = 4L + i: lane group t' = L / 8, mma j = (L / 2) & 3, offset o = 4 (L & 1) + i; even o
             * to the first 4 bytes of (t', j), odd o to the next 4, index o / 2 */
            const int base = (lane >> 3) * 32 + ((lane >> 1) & 3) * 8 + (lane & 1) * 2;
            *reinterpret_cast<uint16_t *>(&xq[warp][u][0][base]) = (uint16_t)h02;
            *reinterpret_cast<uint16_t *>(&xq[warp][u][0][base + 4]) = (uint16_t)h13;
            *reinterpret_cast<uint16_t *>(&xq[warp][u][1][base]) = (uint16_t)l02;
            *reinterpret_cast<uint16_t *>(&xq[warp][u][1][base + 4]) = (uint16_t)l13;
            if ((lane & 3) == 0) xf[warp][u][lane >> 2] = 1.f / fx;
        }
        wait_dyn(PER - 1 - u); /* chunk u's codes and scales */
        __syncwarp();
        uint32_t b[8];
        {
            const bool on = g == t || g == t + 4;
            const uint4 *src = reinterpret_cast<const uint4 *>(&xq[warp][u][g >= 4][t * 32]);
            const uint4 p0 = on ? src[0] : make_uint4(0u, 0u, 0u, 0u), p1 = on ? src[1] : make_uint4(0u, 0u, 0u, 0u);
            b[0] = p0.x; b[1] = p0.y; b[2] = p0.z; b[3] = p0.w; b[4] = p1.x; b[5] = p1.y; b[6] = p1.z; b[7] = p1.w;
        }
        const uint4 q0 = stage[warp][u][0][lane], q1 = stage[warp][u][1][lane];
        const uint32_t r0[4] = {q0.x, q0.y, q0.z, q0.w}, r1[4] = {q1.x, q1.y, q1.z, q1.w};
        float dA[4] = {0.f, 0.f, 0.f, 0.f}, dB[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint32_t a[4] = {e2m1_even_e4m3(r0[j]), e2m1_even_e4m3(r1[j]), e2m1_odd_e4m3(r0[j]),
                                   e2m1_odd_e4m3(r1[j])};
            mma_e4m3_16832(j < 2 ? dA : dB, a, b[2 * j], b[2 * j + 1]);
        }
        /* D column c = 2t + i: lane group tg = c & 3, its blocks 2 tg (dA) and 2 tg + 1 (dB) */
        const uint8_t *sr0 = reinterpret_cast<const uint8_t *>(&ss[warp][u][2 * g]);
        const uint8_t *sr1 = reinterpret_cast<const uint8_t *>(&ss[warp][u][2 * (g + 8)]);
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int tg = (2 * t + i) & 3;
            float wa0, wb0, wa1, wb1;
            nv4_e4m3x2_to_f32x2((uint16_t)(sr0[2 * tg] | (sr0[2 * tg + 1] << 8)), wa0, wb0);
            nv4_e4m3x2_to_f32x2((uint16_t)(sr1[2 * tg] | (sr1[2 * tg + 1] << 8)), wa1, wb1);
            const float fa = xf[warp][u][2 * tg], fb = xf[warp][u][2 * tg + 1];
            acc0 += wa0 * fa * dA[i] + wb0 * fb * dB[i];
            acc1 += wa1 * fa * dA[2 + i] + wb1 * fb * dB[2 + i];
        }
    }
    acc0 += __shfl_xor_sync(0xffffffffu, acc0, 1);
    acc1 += __shfl_xor_sync(0xffffffffu, acc1, 1);
    acc0 += __shfl_xor_sync(0xffffffffu, acc0, 2);
    acc1 += __shfl_xor_sync(0xffffffffu, acc1, 2);
    if (t == 0) {
        red[warp][g] = acc0;
        red[warp][g + 8] = acc1;
    }
    __syncthreads();
    if (threadIdx.x < 16) {
        float v = 0.f;
#pragma unroll
        for (int ww = 0; ww < KW; ww++) v += red[ww][threadIdx.x];
        y[n0 + threadIdx.x] = __float2bfloat16_rn(v * scale2 * 64.f); /* 2^6: the E4M3 placement of E2M1 */
    }
}

static int fp8_section(const cudaDeviceProp &p, cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, double copy_gbs) {
    const int N = 4096, K = 4096;
    const size_t cbytes = (size_t)N * K / 2, sbytes = (size_t)N * K / 16, bytes = cbytes + sbytes;
    const int nsets = 32;
    std::vector<uint8_t *> W(nsets), S(nsets);
    std::vector<uint8_t> hw(cbytes), hs(sbytes);
    uint32_t r = 12345u;
    auto rnd = [&]() { r = r * 1664525u + 1013904223u; return r >> 8; };
    for (size_t i = 0; i < cbytes; i++) hw[i] = (uint8_t)rnd();
    for (size_t i = 0; i < sbytes; i++) hs[i] = (uint8_t)(0x28 + rnd() % 0x20); /* E4M3 ~0.14 .. 1.9 */
    for (int i = 0; i < nsets; i++) {
        CK(cudaMalloc(&W[i], cbytes));
        CK(cudaMalloc(&S[i], sbytes));
        CK(cudaMemcpy(W[i], hw.data(), cbytes, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(S[i], hs.data(), sbytes, cudaMemcpyHostToDevice));
    }
    std::vector<__nv_bfloat16> hx(K);
    for (int i = 0; i < K; i++) {
        float v = ((int)(rnd() % 20001) - 10000) / 5000.f;
        if (i % 97 == 0) v *= 40.f; /* outliers */
        if (i % 31 == 0) v *= 1e-3f;
        hx[i] = __float2bfloat16(v);
    }
    __nv_bfloat16 *x, *ya, *yb;
    CK(cudaMalloc(&x, (size_t)K * 2));
    CK(cudaMalloc(&ya, (size_t)N * 2));
    CK(cudaMalloc(&yb, (size_t)N * 2));
    CK(cudaMemcpy(x, hx.data(), (size_t)K * 2, cudaMemcpyHostToDevice));
    CK(cudaFuncSetAttribute(gv_kernel<0, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, GK_PAD));
    CK((gv_launch<0, 1>(0, N, K, st, x, W[0], S[0], ya)));
    auto g8 = g8_kernel<16, 2>;
    CK(cu_launch_pdl(0, g8, dim3(N / 16), dim3(512), 0, st, N, K, (const __nv_bfloat16 *)x, (const uint8_t *)W[0],
                     (const uint8_t *)S[0], 1.0f, yb));
    CK(cudaStreamSynchronize(st));
    std::vector<__nv_bfloat16> a(N), b(N);
    CK(cudaMemcpy(a.data(), ya, (size_t)N * 2, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(b.data(), yb, (size_t)N * 2, cudaMemcpyDeviceToHost));
    double mx = 0, md = 0, se = 0, sr = 0;
    for (int i = 0; i < N; i++) {
        const double av = __bfloat162float(a[i]), bv = __bfloat162float(b[i]);
        mx = std::max(mx, fabs(av));
        md = std::max(md, fabs(av - bv));
        se += (av - bv) * (av - bv);
        sr += av * av;
    }
    /* a host fp64 reference for a few rows */
    auto e2m1 = [](int c) { static const float v[8] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f}; return (c & 8 ? -1.f : 1.f) * v[c & 7]; };
    auto e4m3 = [](uint8_t q) {
        const int s = q >> 7, e = (q >> 3) & 15, m = q & 7;
        const double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
        return s ? -v : v;
    };
    double hmax = 0, hda = 0, hdb = 0;
    for (int n = 0; n < N; n += 97) {
        double yv = 0;
        for (int k = 0; k < K; k++) {
            const uint8_t byte = hw[(size_t)n * (K / 2) + k / 2];
            const int c = k & 1 ? byte >> 4 : byte & 15;
            yv += (double)e2m1(c) * e4m3(hs[(size_t)n * (K / 16) + k / 16]) * (double)__bfloat162float(hx[k]);
        }
        hmax = std::max(hmax, fabs(yv));
        hda = std::max(hda, fabs(yv - __bfloat162float(a[n])));
        hdb = std::max(hdb, fabs(yv - __bfloat162float(b[n])));
    }
    printf("fp8 section: [4096 x 4096] M = 1, random codes / scales / x (outliers): BF16 form vs FP8 split form: "
           "max|a-b|/max|a| %.2e, rel Frobenius %.2e; vs fp64 on %d rows: BF16 form %.2e, FP8 form %.2e (of max %.3g)\n",
           md / mx, sqrt(se / sr), (N + 96) / 97, hda / hmax, hdb / hmax, hmax);
    int occ = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, g8, 512, 0));
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, g8));
    printf("g8_kernel<16,2>: %d regs, %zu B smem, %d blocks/SM\n", fa.numRegs, fa.sharedSizeBytes, occ);
    printf("%-34s %4s %5s %16s %16s\n", "kernel", "pdl", "chain", "stream+hold", "graph+hold");
    for (int kind = 0; kind < 2; kind++)
        for (int chain : {8, 32}) {
            auto launch_k = [&](int k) -> cudaError_t {
                const int si = k % nsets;
                if (kind == 0) return gv_launch<0, 1>(1, N, K, st, x, W[si], S[si], ya);
                return cu_launch_pdl(1, g8, dim3(N / 16), dim3(512), 0, st, N, K,
                                     (const __nv_bfloat16 *)x, (const uint8_t *)W[si], (const uint8_t *)S[si], 1.0f, yb);
            };
            printf("%-34s %4d %5d", kind ? "FP8 split g8_kernel<16,2>" : "BF16 fp4_gemv1t<16,2,0>", 1, chain);
            for (int mode = 1; mode < 3; mode++) {
                const double us = time_chain(st, e0, e1, mode, chain, nsets, chain == 8 ? 200 : 60, launch_k);
                printf(" %8.2f (%4.1f%%)", us, 100.0 * bytes / (us * 1e-6) / 1e9 / copy_gbs);
            }
            printf("\n");
            fflush(stdout);
        }
    return 0;
}

int main(int argc, char **argv) {
    int dev = 0;
    CK(cudaSetDevice(dev));
    cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, dev));
    const int sms = p.multiProcessorCount;
    const size_t smem_sm = p.sharedMemPerMultiprocessor, smem_blk = p.sharedMemPerBlockOptin;
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));

    /* copy bandwidth: 1 GiB device to device, bytes read + written */
    double copy_gbs;
    {
        const size_t n = (size_t)1 << 30;
        void *a, *b;
        CK(cudaMalloc(&a, n));
        CK(cudaMalloc(&b, n));
        CK(cudaMemsetAsync(a, 1, n, st));
        for (int i = 0; i < 2; i++) CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st));
        std::vector<double> t;
        for (int i = 0; i < 5; i++) {
            CK(cudaEventRecord(e0, st));
            CK(cudaMemcpyAsync(b, a, n, cudaMemcpyDeviceToDevice, st));
            CK(cudaEventRecord(e1, st));
            CK(cudaEventSynchronize(e1));
            float ms;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            t.push_back(ms);
        }
        copy_gbs = 2.0 * n / (median(t) * 1e-3) / 1e9;
        CK(cudaFree(a));
        CK(cudaFree(b));
    }
    printf("gemv_floor: %s, %d SMs, L2 %d MB, copy bandwidth %.0f GB/s (read + written)\n", p.name, sms,
           p.l2CacheSize >> 20, copy_gbs);
    if (argc > 1 && !strcmp(argv[1], "graph")) return graph_section(p, st, e0, e1, copy_gbs);
    if (argc > 1 && !strcmp(argv[1], "fp8")) return fp8_section(p, st, e0, e1, copy_gbs);
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, floor_kernel));
    const size_t smem_dyn_max = smem_blk - fa.sharedSizeBytes; /* the opt-in limit counts static shared memory */
    CK(cudaFuncSetAttribute(floor_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_dyn_max));

    const int shapes[2][2] = {{4096, 4096}, {16384, 4096}};
    uint32_t *xin, *out;
    CK(cudaMalloc(&xin, 8192));
    CK(cudaMemset(xin, 0x5a, 8192));
    CK(cudaMalloc(&out, 1 << 20));
    printf("%-12s %4s %4s %5s %9s %4s %4s %3s %2s %3s %9s %8s %6s\n", "shape", "rows", "thr", "b/SM", "fly/SM", "pdl",
           "D", "pf", "xb", "hot/nl", "us/call", "GB/s", "%copy");
    for (int si = 0; si < 2; si++) {
        const int N = shapes[si][0], K = shapes[si][1];
        const size_t cbytes = (size_t)N * K / 2, sbytes = (size_t)N * K / 16, bytes = cbytes + sbytes;
        const int nsets = (int)std::max<size_t>(8, (3 * (size_t)p.l2CacheSize) / bytes + 1);
        std::vector<uint8_t *> W(nsets), S(nsets);
        for (int i = 0; i < nsets; i++) {
            CK(cudaMalloc(&W[i], cbytes));
            CK(cudaMalloc(&S[i], sbytes));
            CK(cudaMemsetAsync(W[i], 0x37 + i, cbytes, st)); /* not zeros */
            CK(cudaMemsetAsync(S[i], 0x38 + i, sbytes, st));
        }
        /* rows, threads, blocks/SM (0 = as many as fit), pdl, D */
        struct cfg {
            int rows, thr, bps, pdl, D, pf, xb = 0, hot = 0, noload = 0;
        };
        std::vector<cfg> cfgs;
        const int big = si == 1;
        for (int pdl = 1; pdl >= 0; pdl--)
            for (int bps : {1, 2, 4}) cfgs.push_back({16, 512, bps, pdl, 0, 0});
        cfgs.push_back({16, 256, 4, 1, 0, 0});
        cfgs.push_back({16, 256, 2, 1, 0, 0});
        cfgs.push_back({32, 512, 1, 1, 0, 0});
        cfgs.push_back({32, 1024, 1, 1, 0, 0});
        cfgs.push_back({8, 256, 4, 1, 0, 0});
        cfgs.push_back({8, 256, 8, 1, 0, 0});
        if (!big) {
            cfgs.push_back({16, 512, 2, 1, 0, 8});
            for (int D : {32, 64, 128, 256})
                for (int pf : {0, 8}) cfgs.push_back({16, 512, 2, 1, D, pf});
            for (int D : {64, 128}) cfgs.push_back({16, 512, 4, 1, D, 0});
            cfgs.push_back({16, 512, 3, 1, 128, 0});
            cfgs.push_back({16, 256, 4, 1, 128, 0});
            cfgs.push_back({16, 256, 4, 1, 128, 8});
            /* x read before the wait (the serial wait -> x step removed), and a hot L2 (one
             * set, no rotation: the weight streams from L2, not DRAM) */
            for (int D : {0, 64, 128}) cfgs.push_back({16, 512, 2, 1, D, 0, 1, 0});
            for (int D : {0, 64, 128}) cfgs.push_back({16, 512, 2, 1, D, 0, 0, 1});
            cfgs.push_back({16, 512, 2, 0, 128, 0, 0, 1});
            /* no loads at all: the chain of 256-block launches, wait and write alone */
            cfgs.push_back({16, 512, 2, 1, 0, 0, 0, 0, 1});
            cfgs.push_back({16, 512, 2, 0, 0, 0, 0, 0, 1});
        }
        for (const cfg &c : cfgs) {
            const size_t tile = (size_t)c.rows * (K / 2 + K / 16);
            size_t smem = std::max(tile, smem_sm / c.bps - 1024 - 1024);
            if (smem > smem_dyn_max) smem = smem_dyn_max;
            if (tile > smem) {
                printf("%-12s %4d %4d %5d: skip (tile %zu B, smem %zu)\n", "", c.rows, c.thr, c.bps, tile, smem);
                continue;
            }
            int occ = 0;
            CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, floor_kernel, c.thr, smem));
            const dim3 grid(N / c.rows), block(c.thr);
            int k = 0;
            for (int i = 0; i < 16; i++, k++)
                CK(launch(c.pdl, grid, block, smem, st, W[c.hot ? 0 : k % nsets], S[c.hot ? 0 : k % nsets], K,
                          c.noload ? 0 : c.rows, c.D, c.pf, c.xb, xin, out));
            CK(cudaStreamSynchronize(st));
            std::vector<double> t;
            for (int s = 0; s < 200; s++) {
                CK(cudaEventRecord(e0, st));
                for (int i = 0; i < 8; i++, k++)
                    CK(launch(c.pdl, grid, block, smem, st, W[c.hot ? 0 : k % nsets], S[c.hot ? 0 : k % nsets], K,
                              c.noload ? 0 : c.rows, c.D, c.pf, c.xb, xin, out));
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                t.push_back(ms * 1e3 / 8);
            }
            CK(cudaGetLastError());
            const double us = median(t);
            const int resident = std::min(occ, (int)((N / c.rows + sms - 1) / sms));
            char nm[32];
            snprintf(nm, sizeof nm, "%dx%d", N, K);
            printf("%-12s %4d %4d %2d/%-2d %7.0fKB %4d %4d %3d %2d %3d %9.2f %8.0f %5.1f%%\n", nm, c.rows, c.thr, occ,
                   c.bps, resident * tile / 1024.0, c.pdl, c.D, c.pf, c.xb, c.hot + 2 * c.noload, us, bytes / (us * 1e-6) / 1e9,
                   100.0 * bytes / (us * 1e-6) / 1e9 / copy_gbs);
        }
        for (int i = 0; i < nsets; i++) {
            CK(cudaFree(W[i]));
            CK(cudaFree(S[i]));
        }
    }
    /* the real default, decomposed ([4096 x 4096], M = 1) */
    {
        const int N = 4096, K = 4096;
        const size_t cbytes = (size_t)N * K / 2, sbytes = (size_t)N * K / 16, bytes = cbytes + sbytes;
        const int nsets = (int)std::max<size_t>(8, (3 * (size_t)p.l2CacheSize) / bytes + 1);
        std::vector<uint8_t *> W(nsets), S(nsets);
        for (int i = 0; i < nsets; i++) {
            CK(cudaMalloc(&W[i], cbytes));
            CK(cudaMalloc(&S[i], sbytes));
            CK(cudaMemsetAsync(W[i], 0x37 + i, cbytes, st)); /* E2M1 codes, not zeros */
            CK(cudaMemsetAsync(S[i], 0x30 + i, sbytes, st)); /* E4M3 0x30..: finite */
        }
        __nv_bfloat16 *x, *y;
        CK(cudaMalloc(&x, (size_t)K * 2));
        CK(cudaMalloc(&y, (size_t)N * 2));
        CK(cudaMemsetAsync(x, 0x3c, (size_t)K * 2, st));
        CK(cudaFuncSetAttribute(gv_kernel<0, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, GK_PAD));
        CK(cudaFuncSetAttribute(gv_kernel<0, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, GK_PAD));
        CK(cudaFuncSetAttribute(gv_kernel<1, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, GK_PAD));
        CK(cudaFuncSetAttribute(gv_kernel<1, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, GK_PAD));
        int occ = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, gv_kernel<0, 0>, 32 * GK_KW, GK_PAD));
        printf("real default fp4_gemv1t<16,2,0> [4096 x 4096], chain8 (XB: x before the wait; DEC=0: no decode), "
               "%d blocks/SM\n", occ);
        printf("%-32s %9s %6s\n", "variant", "us/call", "%copy");
        struct gcfg {
            const char *name;
            int xb, dec, pdl, hot;
        };
        const gcfg gc[] = {{"as the GEMV (cold, PDL)", 0, 1, 1, 0}, {"as the GEMV, no PDL", 0, 1, 0, 0},
                           {"hot L2 (one set)", 0, 1, 1, 1},         {"XB=1 (x before wait)", 1, 1, 1, 0},
                           {"DEC=0 (no decode)", 0, 0, 1, 0},        {"XB=1 DEC=0", 1, 0, 1, 0},
                           {"hot L2, DEC=0", 0, 0, 1, 1},            {"hot L2, XB=1", 1, 1, 1, 1},
                           {"hot L2, XB=1, DEC=0", 1, 0, 1, 1},      {"as the GEMV again", 0, 1, 1, 0}};
        for (const gcfg &c : gc) {
            auto one = [&](int k) {
                const int sidx = c.hot ? 0 : k % nsets;
                if (c.xb && c.dec) return gv_launch<1, 1>(c.pdl, N, K, st, x, W[sidx], S[sidx], y);
                if (c.xb) return gv_launch<1, 0>(c.pdl, N, K, st, x, W[sidx], S[sidx], y);
                if (c.dec) return gv_launch<0, 1>(c.pdl, N, K, st, x, W[sidx], S[sidx], y);
                return gv_launch<0, 0>(c.pdl, N, K, st, x, W[sidx], S[sidx], y);
            };
            int k = 0;
            for (int i = 0; i < 16; i++, k++) CK(one(k));
            CK(cudaStreamSynchronize(st));
            std::vector<double> t;
            for (int smp = 0; smp < 200; smp++) {
                CK(cudaEventRecord(e0, st));
                for (int i = 0; i < 8; i++, k++) CK(one(k));
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                t.push_back(ms * 1e3 / 8);
            }
            CK(cudaGetLastError());
            const double us = median(t);
            printf("%-32s %9.2f %5.1f%%\n", c.name, us, 100.0 * bytes / (us * 1e-6) / 1e9 / copy_gbs);
        }
        for (int i = 0; i < nsets; i++) {
            CK(cudaFree(W[i]));
            CK(cudaFree(S[i]));
        }
    }
    return 0;
}

/* The graph section: the no-load chain, the pure read and the real default at [4096 x 4096],
 * each timed three ways (time_chain's modes), chains of 8 and 32. */
static int graph_section(const cudaDeviceProp &p, cudaStream_t st, cudaEvent_t e0, cudaEvent_t e1, double copy_gbs) {
    const int N = 4096, K = 4096;
    const size_t cbytes = (size_t)N * K / 2, sbytes = (size_t)N * K / 16, bytes = cbytes + sbytes;
    const int nsets = 32; /* 302 MB: far over L2 */
    std::vector<uint8_t *> W(nsets), S(nsets);
    for (int i = 0; i < nsets; i++) {
        CK(cudaMalloc(&W[i], cbytes));
        CK(cudaMalloc(&S[i], sbytes));
        CK(cudaMemsetAsync(W[i], 0x37 + i, cbytes, st));
        CK(cudaMemsetAsync(S[i], 0x30 + i, sbytes, st));
    }
    uint32_t *xin, *out;
    CK(cudaMalloc(&xin, 8192));
    CK(cudaMemset(xin, 0x5a, 8192));
    CK(cudaMalloc(&out, 1 << 20));
    __nv_bfloat16 *x, *y;
    CK(cudaMalloc(&x, (size_t)K * 2));
    CK(cudaMalloc(&y, (size_t)N * 2));
    CK(cudaMemsetAsync(x, 0x3c, (size_t)K * 2, st));
    cudaFuncAttributes fa;
    CK(cudaFuncGetAttributes(&fa, floor_kernel));
    CK(cudaFuncSetAttribute(floor_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            (int)(p.sharedMemPerBlockOptin - fa.sharedSizeBytes)));
    CK(cudaFuncSetAttribute(gv_kernel<0, 1>, cudaFuncAttributeMaxDynamicSharedMemorySize, GK_PAD));
    CK(cudaFuncSetAttribute(gv_kernel<0, 0>, cudaFuncAttributeMaxDynamicSharedMemorySize, GK_PAD));
    const size_t smem2 = (size_t)p.sharedMemPerMultiprocessor / 2 - 2048; /* 2 blocks an SM */
    printf("graph section: [4096 x 4096], %zu B a call, 32 rotating sets; us per call (%% of copy %.0f GB/s)\n",
           bytes, copy_gbs);
    printf("%-34s %4s %5s %16s %16s %16s\n", "kernel", "pdl", "chain", "stream", "stream+hold", "graph+hold");
    struct row {
        const char *name;
        int kind, pdl; /* kind 0: no loads, 1: pure read, 2: real GEMV, 3: real without decode,
                        * 4 / 5 / 6: real at 16 x 2 / 8 x 4 / 4 x 8 (warps x chunks), natural occupancy,
                        * 7: pure read at 4 blocks an SM */
    };
    const row rows[] = {{"no loads (launch/wait/x/write)", 0, 1}, {"no loads", 0, 0},
                        {"pure read 16 rows x 512 thr", 1, 1},   {"pure read", 1, 0},
                        {"real fp4_gemv1t<16,2,0>", 2, 1},       {"real fp4_gemv1t<16,2,0>", 2, 0},
                        {"real, no decode (DEC=0)", 3, 1},       {"real 16x2 natural occupancy", 4, 1},
                        {"real 8x4 (256 thr)", 5, 1},            {"real 4x8 (128 thr)", 6, 1},
                        {"pure read, 4 blocks an SM", 7, 1},     {"real 8x4, 4 blocks an SM (<= 64 regs)", 8, 1},
                        {"real 16x2 again", 2, 1}};
    {
        int o4 = 0, o5 = 0, o6 = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o4, gv_kernel<0, 1, 16, 2>, 512, 0));
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o5, gv_kernel<0, 1, 8, 4>, 256, 0));
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o6, gv_kernel<0, 1, 4, 8>, 128, 0));
        cudaFuncAttributes a4, a5, a6;
        CK(cudaFuncGetAttributes(&a4, gv_kernel<0, 1, 16, 2>));
        CK(cudaFuncGetAttributes(&a5, gv_kernel<0, 1, 8, 4>));
        CK(cudaFuncGetAttributes(&a6, gv_kernel<0, 1, 4, 8>));
        int o8 = 0;
        cudaFuncAttributes a8;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&o8, gv_kernel<0, 1, 8, 4, 4>, 256, 0));
        CK(cudaFuncGetAttributes(&a8, gv_kernel<0, 1, 8, 4, 4>));
        printf("occupancy: 16x2 %d blocks/SM (%d regs), 8x4 %d (%d regs), 4x8 %d (%d regs), 8x4 min 4: %d (%d regs, "
               "%zu B local)\n", o4, a4.numRegs, o5, a5.numRegs, o6, a6.numRegs, o8, a8.numRegs, a8.localSizeBytes);
    }
    const size_t smem4 = (size_t)p.sharedMemPerMultiprocessor / 4 - 2048;
    for (const row &r : rows) {
        auto launch_k = [&](int k) -> cudaError_t {
            const int si = k % nsets;
            if (r.kind <= 1 || r.kind == 7)
                return launch(r.pdl, dim3(N / 16), dim3(512), r.kind == 7 ? smem4 : smem2, st, W[si], S[si], K,
                              r.kind ? 16 : 0, 0, 0, 0, xin, out);
            if (r.kind == 4) return gv_launch_kp<16, 2>(r.pdl, N, K, st, x, W[si], S[si], y);
            if (r.kind == 5) return gv_launch_kp<8, 4>(r.pdl, N, K, st, x, W[si], S[si], y);
            if (r.kind == 6) return gv_launch_kp<4, 8>(r.pdl, N, K, st, x, W[si], S[si], y);
            if (r.kind == 8) return gv_launch_kp<8, 4, 4>(r.pdl, N, K, st, x, W[si], S[si], y);
            if (r.kind == 2) return gv_launch<0, 1>(r.pdl, N, K, st, x, W[si], S[si], y);
            return gv_launch<0, 0>(r.pdl, N, K, st, x, W[si], S[si], y);
        };
        for (int chain : {8, 32}) {
            printf("%-34s %4d %5d", r.name, r.pdl, chain);
            for (int mode = 0; mode < 3; mode++) {
                const double us = time_chain(st, e0, e1, mode, chain, nsets, chain == 8 ? 200 : 60, launch_k);
                printf(" %8.2f (%4.1f%%)", us, 100.0 * bytes / (us * 1e-6) / 1e9 / copy_gbs);
            }
            printf("\n");
            fflush(stdout);
        }
    }
    return 0;
}
