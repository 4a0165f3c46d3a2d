/* moe_wgmma.cu: cuda_grouped_gemm's large-batch GEMMs on Hopper warpgroup MMA (wgmma), for the
 * routed NVFP4 experts at 64-row tiles (prefill chunks: M·k/E >= 28 rows per expert on average).
 * Same plan, same outputs as moe_grouped.cu's mg_gemm_kernel (its header has the six launches;
 * this file replaces launches 4 and 5 for the NVFP4 loader when LASTSTAND_MG_WGMMA=1):
 *   gate/up  CTA = one tile (64 rows of one expert) x 64 gate rows n0.. + the same 64 up rows;
 *            epilogue h = silu(g·s2g)·(u·s2u) -> hbuf [R, ldh] bf16
 *   down     CTA = one tile x 128 output rows n0..; epilogue acc·s2d·wts[pair] -> dbuf [pair, H]
 * This file alone is compiled for sm_90a (Makefile): wgmma exists only there; mw_available()
 * says whether the device loaded the image (compute capability 9.0), else moe_grouped.cu keeps
 * mg_gemm_kernel.
 *
 * CTA = one warpgroup (128 threads), 2 CTAs an SM (80-104 KB of shared memory each). K blocks of
 * 64; per block:
 *   A   the tile's 64 token rows x 64 k (gathered by perm: x rows for gate/up, hbuf rows for
 *       down), cp.async straight into a 128-byte-swizzled K-major tile (16-byte chunk c of row r
 *       at r·128 + (c ^ r%8)·16, the layout wgmma's descriptors name with swizzle mode 1);
 *       PF + 2 stages
 *   B   the 128 weight rows' E2M1 codes (32 B a row) and E4M3 block scales (4 B), cp.async into
 *       a PF + 1-stage ring, then decoded by the CTA (a thread per weight row: 64 values,
 *       cu_e2m1x8_to_bf16x8 times the scale in bf16, exact) into a BF16 swizzled tile like A's;
 *       2 buffers
 *   4 x wgmma.mma_async m64n128k16 (BF16 in, fp32 accumulators in registers: 64 a thread),
 *       the descriptors advanced by 32 bytes per k16 within the swizzled rows.
 * Pipeline: A and codes PF blocks ahead (cp.async groups; PF = LASTSTAND_MG_WGMMA_PF, 2 by
 * default, 3 or 4: R1 measured ~200 TFLOPS at 256 rows an expert and suspected the loads; R2: no
 * difference, 794.9 / 794.8 / 807.2 µs for the 35B MoE call at M = 2048; ncu: 8 warps an SM, the
 * integer pipe at 42%, stalls on fixed-latency dependencies and shared-memory loads); block kb's decode runs while block kb-1's wgmma group is still in flight
 * (wgmma.wait_group 1 after each commit), so the decode (integer and FMA pipes) overlaps the
 * tensor cores. Hazards: B buffer kb%2 was last read by group kb-2, A stage (kb+PF)%(PF+2) by
 * group kb-2, the code stage (kb+PF)%(PF+1) by the decode of kb-1 — all finished before the
 * barrier that opens block kb. Generic-proxy writes of the
 * shared tiles (cp.async, the decode's stores) reach wgmma's async proxy through
 * fence.proxy.async.shared::cta before the barrier that precedes the MMAs.
 * Accumulator fragment (m64nN f32): warp w of the group holds rows 16w + g, 16w + g + 8
 * (g = lane/4), n8 block j: d[4j + 0, 1] = (row g, cols 8j + 2t, +1), d[4j + 2, 3] = (row g + 8,
 * the same cols) (t = lane%4).
 * Expert K (H for gate/up, I for down) must be a multiple of 64 (the NVFP4 cp.async loader's
 * condition, MG_LD_FP4); N tails are zero-filled and not written.
 */
#include "ops/cuda/moe_wgmma.cuh"

#include <pthread.h>

enum { MW_BM = 64, MW_BK = 64, MW_THREADS = 128 };
/* Shared memory for prefetch distance PF (K blocks in flight ahead of the one decoded): A stages
 * PF + 2 (wgmma kb-1 may still read its stage while kb + PF lands), code stages PF + 1, two
 * decoded B buffers. PF = 2: 80 KB, 3: 92 KB, 4: 104 KB; two CTAs an SM in every case. */
template <int PF>
struct mw_lay {
    static constexpr int AST = PF + 2, CST = PF + 1;
    static constexpr int A_OFF = 0;                      /* A stages: 8192 B each (1024-aligned) */
    static constexpr int B_OFF = A_OFF + AST * 8192;     /* decoded B: 2 x 16384 B */
    static constexpr int C_OFF = B_OFF + 2 * 16384;      /* codes: 128 rows x 32 B a stage */
    static constexpr int S_OFF = C_OFF + CST * 4096;     /* scales: 128 rows x 4 B a stage */
    static constexpr int P_OFF = S_OFF + CST * 512;      /* the tile's pairs: 64 x int32 */
    static constexpr int SMEM = P_OFF + MW_BM * 4 + 1024; /* + the alignment slack */
};

__device__ __forceinline__ void mw_cp16(uint32_t dst, const void *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void mw_cp4(uint32_t dst, const void *src, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 4 : 0));
}
__device__ __forceinline__ void mw_commit_cp() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void mw_wait_cp() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void mw_fence_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void mw_wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void mw_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void mw_wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* keeps the compiler from moving accumulator accesses across the asynchronous MMAs */
__device__ __forceinline__ void mw_fence_regs(float (&d)[64]) {
#pragma unroll
    for (int i = 0; i < 64; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* K-major, 128-byte swizzle: start address >> 4, leading offset 16 B (unused by this mode),
 * stride 1024 B between 8-row groups, mode 1 in bits 62-63 */
__device__ __forceinline__ uint64_t mw_desc(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

/* d[64] += A[64 x 16] · B[128 x 16]ᵀ, both from shared memory */
__device__ __forceinline__ void mw_mma(float (&d)[64], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(1));
}

template <bool GATEUP, int PF>
__global__ void __launch_bounds__(MW_THREADS, 2)
    mw_kernel(const mg_expert *__restrict__ tab, const int32_t *__restrict__ tile_e, const int32_t *__restrict__ perm,
              const int32_t *__restrict__ n_tiles, int H, int k, const bf16 *__restrict__ x, bf16 *__restrict__ hbuf,
              int ldh, const float *__restrict__ wts, bf16 *__restrict__ dbuf) {
    extern __shared__ __align__(1024) unsigned char mw_dsm[];
    typedef mw_lay<PF> LY;
    constexpr int MW_AST = LY::AST, MW_CST = LY::CST, MW_A_OFF = LY::A_OFF, MW_B_OFF = LY::B_OFF,
                  MW_C_OFF = LY::C_OFF, MW_S_OFF = LY::S_OFF, MW_P_OFF = LY::P_OFF;
    const int tile = blockIdx.y;
    if (tile >= n_tiles[0]) return;
    const mg_expert *xp = &tab[tile_e[tile]];
    const int I = xp->inter;
    const int N = GATEUP ? I : H, K = GATEUP ? H : I;
    const int n0 = blockIdx.x * (GATEUP ? 64 : 128);
    if (n0 >= N) return;
    const int r0 = tile * MW_BM;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(mw_dsm);
    const uint32_t sb = (raw + 1023u) & ~1023u; /* the 1024-aligned base (shared window address) */
    int *pair = reinterpret_cast<int *>(mw_dsm + (sb - raw) + MW_P_OFF);
    if (tid < MW_BM) pair[tid] = perm[r0 + tid];
    __syncthreads();

    /* this thread's fixed sources: A chunks c = tid + 128i (row c/8, 16-byte chunk c%8), and the
     * weight row tid (gate/up: rows 0..63 gate n0.., 64..127 up n0..; down: rows n0..) */
    const bf16 *pa[4];
    bool aok[4];
    uint32_t adst[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int c = tid + MW_THREADS * i, row = c >> 3, ch = c & 7, p = pair[row];
        aok[i] = p >= 0;
        pa[i] = !aok[i] ? x : GATEUP ? x + (size_t)(p / (k + 1)) * H + ch * 8 : hbuf + (size_t)(r0 + row) * ldh + ch * 8;
        adst[i] = (uint32_t)(row * 128 + ((ch ^ (row & 7)) << 4));
    }
    const bool up = GATEUP && tid >= 64;
    const int nrow = n0 + (up ? tid - 64 : tid);
    const bool wok = nrow < N;
    const uint8_t *wsrc = GATEUP ? (up ? xp->w[1] : xp->w[0]) : xp->w[2];
    const uint8_t *ssrc = GATEUP ? (up ? xp->s[1] : xp->s[0]) : xp->s[2];
    const uint8_t *wrow = wok ? wsrc + (size_t)nrow * (K / 2) : wsrc;
    const uint8_t *srow = wok ? ssrc + (size_t)nrow * (K / 16) : ssrc;
    const int nk = K / MW_BK;

    auto load = [&](int kb) {
        const int k0 = kb * MW_BK;
        const uint32_t as = sb + MW_A_OFF + (kb % MW_AST) * 8192;
#pragma unroll
        for (int i = 0; i < 4; i++) mw_cp16(as + adst[i], aok[i] ? pa[i] + k0 : x, aok[i]);
        const uint32_t cs = sb + MW_C_OFF + (kb % MW_CST) * 4096 + tid * 32;
        mw_cp16(cs, wok ? wrow + k0 / 2 : wsrc, wok);
        mw_cp16(cs + 16, wok ? wrow + k0 / 2 + 16 : wsrc, wok);
        mw_cp4(sb + MW_S_OFF + (kb % MW_CST) * 512 + tid * 4, wok ? srow + k0 / 16 : ssrc, wok);
    };

    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.f;

#pragma unroll
    for (int q = 0; q < PF; q++) {
        if (q < nk) load(q);
        mw_commit_cp();
    }
    unsigned char *const gb = mw_dsm + (sb - raw); /* generic pointer to the aligned base */
    for (int kb = 0; kb < nk; kb++) {
        mw_wait_cp<PF - 1>();
        __syncthreads(); /* block kb landed for all; every buffer block kb+PF reuses is free */
        if (kb + PF < nk) load(kb + PF);
        mw_commit_cp();
        { /* decode weight row tid of block kb into B buffer kb%2 (swizzled like A) */
            const unsigned char *cr = gb + MW_C_OFF + (kb % MW_CST) * 4096 + tid * 32;
            const uint4 c0 = *reinterpret_cast<const uint4 *>(cr), c1 = *reinterpret_cast<const uint4 *>(cr + 16);
            const uint32_t sw = *reinterpret_cast<const uint32_t *>(gb + MW_S_OFF + (kb % MW_CST) * 512 + tid * 4);
            const uint32_t cw[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
            unsigned char *br = gb + MW_B_OFF + (kb & 1) * 16384 + tid * 128;
#pragma unroll
            for (int q = 0; q < 8; q++) {
                const uint32_t sc = cu_scale_bf16x2((uint8_t)(sw >> (8 * (q >> 1))));
                uint32_t o[4];
                cu_e2m1x8_to_bf16x8(cw[q], o);
#pragma unroll
                for (int r = 0; r < 4; r++) o[r] = cu_bf16x2_mul(o[r], sc);
                *reinterpret_cast<uint4 *>(br + ((q ^ (tid & 7)) << 4)) = make_uint4(o[0], o[1], o[2], o[3]);
            }
        }
        mw_fence_async();
        __syncthreads(); /* B buffer kb%2 decoded by all; A stage kb visible to the async proxy */
        mw_wg_fence();
        mw_fence_regs(acc);
        const uint64_t da = mw_desc(sb + MW_A_OFF + (kb % MW_AST) * 8192);
        const uint64_t db = mw_desc(sb + MW_B_OFF + (kb & 1) * 16384);
#pragma unroll
        for (int kk = 0; kk < MW_BK / 16; kk++) mw_mma(acc, da + 2 * kk, db + 2 * kk);
        mw_wg_commit();
        mw_fence_regs(acc);
        mw_wg_wait<1>();
    }
    mw_wg_wait<0>();
    mw_fence_regs(acc);

    if (GATEUP) {
        const float s2g = xp->s2[0], s2u = xp->s2[1];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = warp * 16 + g + 8 * h;
            if (pair[row] < 0) continue;
            bf16 *dst = hbuf + (size_t)(r0 + row) * ldh;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int col = n0 + 8 * j + 2 * t;
                if (col >= N) continue;
                const float g0 = acc[4 * j + 2 * h] * s2g, g1 = acc[4 * j + 2 * h + 1] * s2g;
                const float u0 = acc[4 * (j + 8) + 2 * h] * s2u, u1 = acc[4 * (j + 8) + 2 * h + 1] * s2u;
                const float h0 = g0 / (1.f + __expf(-g0)) * u0, h1 = g1 / (1.f + __expf(-g1)) * u1;
                __nv_bfloat162 v = __floats2bfloat162_rn(h0, h1);
                *reinterpret_cast<__nv_bfloat162 *>(dst + col) = v;
            }
        }
    } else {
        const float s2d = xp->s2[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = warp * 16 + g + 8 * h;
            const int p = pair[row];
            if (p < 0) continue;
            const float c = s2d * wts[p];
            bf16 *dst = dbuf + (size_t)p * H;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const int col = n0 + 8 * j + 2 * t;
                if (col >= N) continue;
                __nv_bfloat162 v = __floats2bfloat162_rn(acc[4 * j + 2 * h] * c, acc[4 * j + 2 * h + 1] * c);
                *reinterpret_cast<__nv_bfloat162 *>(dst + col) = v;
            }
        }
    }
}

/* ---- host side ------------------------------------------------------------------ */

enum { MW_MAX_DEV = 16 };
static int mw_state[MW_MAX_DEV]; /* per device: 0 not asked, 1 ready (image + shared memory), -1 no */
static int mw_pf = 2;            /* prefetch distance, LASTSTAND_MG_WGMMA_PF = 2, 3 or 4 */

template <int PF>
static bool mw_ready() {
    cudaFuncAttributes fa;
    return cudaFuncGetAttributes(&fa, mw_kernel<true, PF>) == cudaSuccess &&
           cudaFuncGetAttributes(&fa, mw_kernel<false, PF>) == cudaSuccess &&
           cudaFuncSetAttribute(mw_kernel<true, PF>, cudaFuncAttributeMaxDynamicSharedMemorySize, mw_lay<PF>::SMEM) ==
               cudaSuccess &&
           cudaFuncSetAttribute(mw_kernel<false, PF>, cudaFuncAttributeMaxDynamicSharedMemorySize, mw_lay<PF>::SMEM) ==
               cudaSuccess;
}
static pthread_mutex_t mw_mu = PTHREAD_MUTEX_INITIALIZER;

int mw_available(void) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= MW_MAX_DEV) {
        cudaGetLastError();
        return 0;
    }
    int s = __atomic_load_n(&mw_state[dev], __ATOMIC_ACQUIRE);
    if (s) return s > 0;
    pthread_mutex_lock(&mw_mu);
    s = mw_state[dev];
    if (!s) {
        int major = 0, minor = 0;
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
        const char *v = getenv("LASTSTAND_MG_WGMMA_PF");
        if (v && (!strcmp(v, "2") || !strcmp(v, "3") || !strcmp(v, "4"))) mw_pf = v[0] - '0';
        s = major == 9 && minor == 0 && mw_ready<2>() && mw_ready<3>() && mw_ready<4>() ? 1 : -1;
        cudaGetLastError(); /* a missing image is not sticky: clear it */
        if (s > 0)
            log_info("cuda_grouped_gemm: 64-row tiles of NVFP4 experts by the wgmma kernels (device %d, sm_90a, "
                     "prefetch distance %d)", dev, mw_pf);
        else
            log_warn("cuda_grouped_gemm: LASTSTAND_MG_WGMMA=1 but device %d (compute capability %d.%d) has no sm_90a "
                     "image of the wgmma kernels; mg_gemm_kernel runs", dev, major, minor);
        __atomic_store_n(&mw_state[dev], s, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&mw_mu);
    return s > 0;
}

template <bool GATEUP>
cudaError_t mw_launch(int n_out, int tiles_max, const mg_expert *tab, const int32_t *tile_e, const int32_t *perm,
                      const int32_t *nt, int H, int k, const bf16 *x, bf16 *hbuf, int ldh, const float *wts,
                      bf16 *dbuf, cudaStream_t st) {
    const int per = GATEUP ? 64 : 128;
    dim3 grid((unsigned)((n_out + per - 1) / per), (unsigned)tiles_max);
    if (mw_pf == 4)
        mw_kernel<GATEUP, 4><<<grid, MW_THREADS, mw_lay<4>::SMEM, st>>>(tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts,
                                                                         dbuf);
    else if (mw_pf == 3)
        mw_kernel<GATEUP, 3><<<grid, MW_THREADS, mw_lay<3>::SMEM, st>>>(tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts,
                                                                         dbuf);
    else
        mw_kernel<GATEUP, 2><<<grid, MW_THREADS, mw_lay<2>::SMEM, st>>>(tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts,
                                                                         dbuf);
    return cudaGetLastError();
}

template cudaError_t mw_launch<true>(int, int, const mg_expert *, const int32_t *, const int32_t *, const int32_t *,
                                     int, int, const bf16 *, bf16 *, int, const float *, bf16 *, cudaStream_t);
template cudaError_t mw_launch<false>(int, int, const mg_expert *, const int32_t *, const int32_t *, const int32_t *,
                                      int, int, const bf16 *, bf16 *, int, const float *, bf16 *, cudaStream_t);
