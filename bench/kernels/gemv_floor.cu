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
 * Output: one line per configuration: shape, rows/block, threads, blocks/SM (fit /
 * asked), bytes in flight per SM, PDL, D, pf, xb, hot/nl, us per call, GB/s, % of copy. */
#include <cuda_runtime.h>

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
