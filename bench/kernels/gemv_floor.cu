/* gemv_floor.cu: the physical floor of the M = 1 NVFP4 GEMV in the doctor's harness
 * (gemv5 session). Standalone (not part of the server): nvcc -O3 -arch=sm_90a
 * -o gemv_floor bench/kernels/gemv_floor.cu; bench/device/gemv5.sh builds and runs it.
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
 * Output: one line per configuration: shape, rows/block, threads, blocks/SM (fit /
 * asked), bytes in flight per SM, PDL, D, pf, xb, hot/nl, us per call, GB/s, % of copy. */
#include <cuda_runtime.h>

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
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
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
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
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

static cudaError_t launch(int pdl, dim3 grid, dim3 block, size_t smem, cudaStream_t st, const uint8_t *w,
                          const uint8_t *sc, int K, int R, int D, int pf, int xb, const uint32_t *xin,
                          uint32_t *out) {
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
    return cudaLaunchKernelEx(&cfg, floor_kernel, w, sc, K, R, D, pf, xb, xin, out);
}

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
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
    (void)argc;
    (void)argv;
    return 0;
}
