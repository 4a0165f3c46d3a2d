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
 * Two kernels, picked per call by mw_launch: m2_kernel (further down: up to 256 tokens a CTA as
 * wgmma's N side, the weights decoded straight into the A registers, persistent) when
 * on (the default since S11-R2; LASTSTAND_MG_WGMMA2=0: off) and the call has
 * LASTSTAND_MG_WGMMA2_MINROWS (112) or more routed rows
 * an expert on average (mw_rows_hint), else mw_kernel (this header):
 *
 * mw_kernel: CTA = one warpgroup (128 threads), 2 CTAs an SM (80-104 KB of shared memory each). K blocks of
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
#include "ops/cuda/cu_wgmma.cuh"
#include "ops/cuda/moe_wgmma.cuh"
#include "ops/cuda/nvfp4.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <pthread.h>

enum { MW_BM = 64, MW_BK = 64, MW_THREADS = 128 };
enum { M2_MAXG = 2048, M2_MAXT = 4096 }; /* m2_kernel: groups listed a CTA, plan tiles a launch */
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

__device__ __forceinline__ void mw_cp16f(uint32_t dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void mw_cp4(uint32_t dst, const void *src, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 4 : 0));
}
/* m2_kernel's CB = 3 (the NVFP4 down): the token rows by TMA, completion on a per-stage mbarrier */
__device__ __forceinline__ void m2_bar_arrive_tx(uint32_t a, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(a), "r"(bytes) : "memory");
}
__device__ __forceinline__ void m2_tma2(uint32_t dst, const CUtensorMap *tm, int c0, int c1, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
                 "[%4];\n" ::"r"(dst),
                 "l"(reinterpret_cast<uint64_t>(tm)), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}

/* d[64] += A[64 x 16] · B[128 x 16]ᵀ, both from shared memory */
__device__ __forceinline__ void mw_mma(float (&d)[64], uint64_t da, uint64_t db) {
    cu_wg_mma128_ss(d, da, db, 1);
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
        for (int i = 0; i < 4; i++) cu_cp16_shared(as + adst[i], aok[i] ? pa[i] + k0 : x, aok[i]);
        const uint32_t cs = sb + MW_C_OFF + (kb % MW_CST) * 4096 + tid * 32;
        cu_cp16_shared(cs, wok ? wrow + k0 / 2 : wsrc, wok);
        cu_cp16_shared(cs + 16, wok ? wrow + k0 / 2 + 16 : wsrc, wok);
        mw_cp4(sb + MW_S_OFF + (kb % MW_CST) * 512 + tid * 4, wok ? srow + k0 / 16 : ssrc, wok);
    };

    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.f;

#pragma unroll
    for (int q = 0; q < PF; q++) {
        if (q < nk) load(q);
        cu_cp_async_commit();
    }
    unsigned char *const gb = mw_dsm + (sb - raw); /* generic pointer to the aligned base */
    for (int kb = 0; kb < nk; kb++) {
        cu_cp_wait<PF - 1>();
        __syncthreads(); /* block kb landed for all; every buffer block kb+PF reuses is free */
        if (kb + PF < nk) load(kb + PF);
        cu_cp_async_commit();
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
        cu_fence_proxy_async();
        __syncthreads(); /* B buffer kb%2 decoded by all; A stage kb visible to the async proxy */
        cu_wg_fence();
        cu_wg_fence_acc(acc);
        const uint64_t da = cu_wg_desc_k128(sb + MW_A_OFF + (kb % MW_AST) * 8192);
        const uint64_t db = cu_wg_desc_k128(sb + MW_B_OFF + (kb & 1) * 16384);
#pragma unroll
        for (int kk = 0; kk < MW_BK / 16; kk++) mw_mma(acc, da + 2 * kk, db + 2 * kk);
        cu_wg_commit();
        cu_wg_fence_acc(acc);
        cu_wg_wait<1>();
    }
    cu_wg_wait<0>();
    cu_wg_fence_acc(acc);

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

/* d[0..31] (+)= A[64 x 16] (registers a) · B[64 x 16]ᵀ (shared memory, descriptor db); acc: 0 = overwrite */
__device__ __forceinline__ void m2_mma64(float (&d)[128], const uint32_t (&a)[4], uint64_t db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

/* d[0..63] (+)= A[64 x 16] (registers a) · B[128 x 16]ᵀ (shared memory, descriptor db); acc: 0 = overwrite */
__device__ __forceinline__ void m2_mma128(float (&d)[128], const uint32_t (&a)[4], uint64_t db, int acc) {
    cu_wg_mma128_rs<0>(d, a, db, acc);
}

/* d[0..95] (+)= A[64 x 16] (registers a) · B[192 x 16]ᵀ (shared memory, descriptor db); acc: 0 = overwrite */
__device__ __forceinline__ void m2_mma192(float (&d)[128], const uint32_t (&a)[4], uint64_t db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %101, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, "
        "{%96, %97, %98, %99}, %100, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

/* d[0..127] (+)= A[64 x 16] (registers a) · B[256 x 16]ᵀ (shared memory, descriptor db); acc: 0 = overwrite */
__device__ __forceinline__ void m2_mma256(float (&d)[128], const uint32_t (&a)[4], uint64_t db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "{%128, %129, %130, %131}, %132, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc));
}

/* the same with A from shared memory too (descriptor da): the BF16 weights */
__device__ __forceinline__ void m2_mma64ss(float (&d)[128], uint64_t da, uint64_t db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
        "%32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(acc));
}

__device__ __forceinline__ void m2_mma128ss(float (&d)[128], uint64_t da, uint64_t db, int acc) {
    cu_wg_mma128_ss(d, da, db, acc);
}

__device__ __forceinline__ void m2_mma192ss(float (&d)[128], uint64_t da, uint64_t db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95}, "
        "%96, %97, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
        : "l"(da), "l"(db), "r"(acc));
}

__device__ __forceinline__ void m2_mma256ss(float (&d)[128], uint64_t da, uint64_t db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, "
        "%128, %129, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
        : "l"(da), "l"(db), "r"(acc));
}

/* ---- m2: tokens as the N side, the weights decoded straight into wgmma's A registers -------
 *
 * mw_kernel above (64 token rows x 128 weight rows a CTA, both operands from shared memory)
 * re-decodes an expert's weights for every 64 tokens, stores them to shared memory and reads
 * them back for the MMA (~210 B of shared-memory traffic a clock against the SM's 128), and its
 * decode waits for the MMA inside the one warpgroup: ~200 TFLOP/s. m2_kernel swaps the roles:
 *   CTA  = 2 warpgroups (256 threads, one CTA an SM) x up to 256 tokens (a group of up to four
 *          consecutive 64-row tiles of one expert in the plan: "a super tile") x NB blocks of
 *          weight rows (each 128 rows: 64 a warpgroup).
 *   A    = 64 weight rows a warpgroup, decoded from the E2M1 codes (in shared memory, brought
 *          with the tokens by cp.async) straight into the m64k16 register fragments: lane
 *          (g, t) of warp w holds rows 16w + g, 16w + g + 8 at k = 2t, 2t + 1 (byte t of code
 *          word 2s of the k16 step s) and 2t + 8, 2t + 9 (byte t of word 2s + 1). A byte is
 *          placed into a bf16x2 (nv4_e2m1x8_place's bit placement: e2m1 x 2^-126, exact) and
 *          multiplied by its block scale x 2^118 (one HMUL2, exact); 2^8 goes into scale2 in
 *          the epilogue. The decode of block q + 1 runs while block q's wgmma group is in flight.
 *   B    = the super tile's token rows x 64 k from shared memory (cp.async gathers them by
 *          perm into the 128-byte swizzled K-major layout), N = 64 x (tiles in the group):
 *          wgmma m64nNk16 with N = 64, 128, 192 or 256 (a uniform switch a CTA).
 *   gate/up: warp w's 16 A rows = 8 gate rows (i = n0 + 32·wg + 8w + g) then the same 8 up
 *          rows, so one lane holds gate and up of the same (i, token): h = silu(g)·u in
 *          registers, staged in shared memory, stored as 128-byte rows of hbuf.
 *   down:  A rows = 128 output columns; acc·s2d·wts[pair] staged, stored as 256-byte rows.
 * Pipeline: S stages (tokens 32 KB + codes 4 KB + scales 512 B each), loads S - 2 blocks
 * ahead (a stage is refilled only after the wgmma group that read it was retired by the
 * wait_group 1 of the step before), across the NB weight blocks of a CTA without a break.
 * Shared memory per token tile and MMA: 64 B a clock of B reads at full rate (any N), against
 * ~210 for mw_kernel; decode: 64 values per lane per 64 x N x 64 block.
 * CB (S12): the form of a step, a template parameter: 1 gate/up (routed and BF16 shared), 2 the
 * BF16 shared down and the NVFP4 down without TMA (LASTSTAND_MG_WGMMA2_TMA=0), 3 the NVFP4 down.
 * Every form commits the wgmma group inside each branch on N. S11's kernel (CB = 0, deleted in S12)
 * committed once after the join; ptxas then tagged the last HGMMA of each branch with the
 * scoreboard gsb0 AND added a dummy `HGMMA.64x8x16.F16 RZ, gdesc[URZ], RZ, !UPT, gsb0` at the join
 * (cuobjdump -sass; mw_kernel, unbranched, has none), so a step held two gsb0 groups and
 * wait_group 1 (WARPGROUP.DEPBAR.LE gsb0, 0x1) waited for the real MMAs of that very step: the
 * decode of block q + 1 never overlapped the MMAs of block q, and the two warpgroups, in lockstep
 * through the step's __syncthreads, left the tensor pipe idle while both decoded (S11 ncu: tensor
 * 35% / 31%, barrier the top stall). CB = 1: one gsb0 group a step, the overlap the pipeline above
 * was written for. CB = 2: a step's cp.async refill (block q + S - 2 into the stage retired by the
 * step before) issued after its MMAs instead of before the decode (~100 instructions a thread off
 * the path from the barrier to the MMA issue). CB = 3: CB = 2 with the token rows (the group's hbuf
 * rows, contiguous) by TMA from one thread (one box of 64 k x 64 rows a tile, a per-stage
 * mbarrier), no proxy fence, the codes and scales still cp.async (read by LDS). The same MMAs in
 * the same order in every form: bit-identical outputs. S12-R2/R3 (H200, ncu, generate synth 35B,
 * 8192-token prompt): gate/up 961 (CB 0) / 763-765 (1) / 785 (2) us, tensor pipe 35 / 44 / 42%;
 * down 557 (0) / 545 (1) / 512 (2) / 509 (3) us; barrier stall 1.8 -> 0.25, the top stall now
 * fixed-latency waits (~1.5 cycles an instruction at 2 warps a scheduler: a step is ~400
 * instructions a warp at ~5 cycles each, ~2000 cycles against 1024 of MMA). */

/* lower bound of e in the non-decreasing te[0..n) (the plan's tile_e: experts in ascending order) */
__device__ __forceinline__ int m2_lb(const int *te, int n, int e) {
    int lo = 0, hi = n;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (te[mid] < e) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* exclusive prefix sum over the block's 256 threads (ws: 8 ints of shared memory); *total */
__device__ __forceinline__ int m2_scan(int v, int *ws, int *total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int inc = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, inc, o);
        if (lane >= o) inc += u;
    }
    if (lane == 31) ws[warp] = inc;
    __syncthreads();
    int before = 0, all = 0;
#pragma unroll
    for (int w = 0; w < 8; w++) {
        const int x = ws[w];
        before += w < warp ? x : 0;
        all += x;
    }
    __syncthreads();
    *total = all;
    return before + inc - v;
}

/* BW: BF16 weights (a stage: tokens 32768 B, the 128 weight rows x 64 k 16384 B, swizzled like
 * the tokens, read by wgmma through a descriptor) instead of NVFP4 codes decoded into registers.
 * NB == 1: the output staging aliases the stages (the pipeline is drained by then). */
template <bool GATEUP, bool BW, int S, int NB>
struct m2_lay {
    static constexpr int STAGE = BW ? 48 * 1024 : 37 * 1024; /* NVFP4: tokens, codes 4096, scales 512 */
    static constexpr int C_IN = 32768, S_IN = 36864;
    static constexpr int OSTR = GATEUP ? 144 : 272;    /* staging row stride (64 / 128 bf16 + 16 B) */
    static constexpr int O_OFF = NB == 1 ? 0 : S * STAGE;
    static constexpr int L_OFF = O_OFF + 256 * OSTR > S * STAGE ? O_OFF + 256 * OSTR : S * STAGE;
    /* soff[256], spair[256], swt[256], ws[16], glist[M2_MAXG] (uint16), the stages' mbarriers (CB = 3) */
    static constexpr int MB_OFF = L_OFF + 3 * 1024 + 64 + 2 * M2_MAXG;
    static constexpr int SMEM = MB_OFF + 64 + 1024;
    static_assert(SMEM <= 232448, "227 KB of shared memory a block on sm_90");
    static_assert(M2_MAXT * 4 <= S * STAGE, "tile_e fits in the stage buffers");
};

/* Persistent: gridDim.x CTAs (one an SM) walk the work units u = blockIdx.x + i·gridDim.x, unit u =
 * group u / nxb (up to 4 consecutive 64-row plan tiles of one expert) x weight blocks
 * (u % nxb)·NB .. + NB - 1. Each CTA first lists the groups in shared memory (tile_e copied into
 * the stage buffers, a group starts at every 4th tile of an expert's run: binary searches). */
template <bool GATEUP, bool BW, int S, int NB, int CB>
__global__ void __launch_bounds__(256, 1)
    m2_kernel(const mg_expert *__restrict__ tab, const int32_t *__restrict__ tile_e, const int32_t *__restrict__ perm,
              const int32_t *__restrict__ n_tiles, int H, int k, const bf16 *__restrict__ x, bf16 *__restrict__ hbuf,
              int ldh, const float *__restrict__ wts, bf16 *__restrict__ dbuf, int sh_only, int nxb,
              int *__restrict__ ctr, int flags, const __grid_constant__ CUtensorMap tmh) {
    /* flags: 1 down's copy-out deferred (LASTSTAND_MG_WGMMA2_DEFER), 2 the next unit's perm
     * prefetched (LASTSTAND_MG_WGMMA2_PFU) */
    const int dfr = flags & 1, pfu = flags & 2;
    extern __shared__ __align__(1024) unsigned char mw_dsm[];
    typedef m2_lay<GATEUP, BW, S, NB> LY;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, tq = lane & 3;
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(mw_dsm);
    const uint32_t sb = (raw + 1023u) & ~1023u;
    unsigned char *const gb = mw_dsm + (sb - raw);
    int *soff = reinterpret_cast<int *>(gb + LY::L_OFF);
    int *spair = soff + 256;
    float *swt = reinterpret_cast<float *>(spair + 256);
    int *ws = reinterpret_cast<int *>(swt + 256);
    uint16_t *glist = reinterpret_cast<uint16_t *>(ws + 16);

    /* the group list: tiles [T0, T1) (sh_only: the shared expert's, n_tiles[1] on); T1 - T0 <= 4096 */
    const int T0 = sh_only ? n_tiles[1] : 0, T1 = n_tiles[0], nt = T1 - T0;
    int *te = reinterpret_cast<int *>(gb); /* tile_e[T0..T1) in the stage buffers, for the list only */
    for (int i = tid; i < nt; i += 256) te[i] = tile_e[T0 + i];
    /* CB = 3, down: the token rows (hbuf rows r0.., contiguous) by TMA from one thread, one mbarrier a
     * stage (1 arrival + the bytes); mph: the parity each stage's next phase completes with */
    constexpr bool TMAT = CB == 3 && !GATEUP && !BW;
    uint32_t mph = 0;
    if constexpr (TMAT) {
        if (tid == 0) {
            for (int i = 0; i < S; i++) cu_mbar_init(sb + LY::MB_OFF + 8 * i, 1);
            asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        }
    }
    __syncthreads();
    const int per = (nt + 255) / 256, i0 = min(nt, tid * per), i1 = min(nt, i0 + per);
    int mine = 0;
    {
        int le = -1, lf = 0;
        for (int i = i0; i < i1; i++) {
            const int e = te[i];
            if (e != le) { le = e; lf = m2_lb(te, nt, e); }
            mine += (i - lf) % 4 == 0;
        }
    }
    int ngroups;
    int pos = m2_scan(mine, ws, &ngroups);
    {
        int le = -1, lf = 0, ll = 0;
        for (int i = i0; i < i1; i++) {
            const int e = te[i];
            if (e != le) { le = e; lf = m2_lb(te, nt, e); ll = m2_lb(te, nt, e + 1); }
            if ((i - lf) % 4 == 0 && pos < M2_MAXG) glist[pos++] = (uint16_t)(i << 3 | min(4, ll - i));
        }
    }
    __syncthreads(); /* the list is complete; te (the stage buffers) free */
    if constexpr (TMAT) { /* te's generic accesses before the TMA (async proxy) writes over them */
        if (tid == 0) cu_fence_proxy_async();
    }
    const int U = min(ngroups, (int)M2_MAXG) * nxb;

    /* units: blockIdx.x first, then (ctr) the next free one from ctr[0] (fetched by thread 0 at the
     * start of a unit, read by all after the unit's last barrier: snext by the unit's parity), or
     * (no ctr) every gridDim.x-th */
    int *const snext = ws + 8;
    int par = 0;
    /* the next unit's perm (and wts) for this thread's row, loaded during the current unit
     * (its index known by then: the counter's answer, or u + gridDim.x) */
    int pf_u = -1, pf_p = -1;
    float pf_w = 0.f;
    for (int u = blockIdx.x; u < U;
         u = ctr ? (__syncthreads(), par ^= 1, snext[par ^ 1]) : u + (int)gridDim.x) {
    /* thread 0 asks for the next unit now and publishes the answer at step 1 (or before
     * leaving a unit without steps): the atomic's latency stays off the unit's first barriers */
    int fetched = 0;
    if (ctr && tid == 0) fetched = atomicAdd(ctr, 1) + (int)gridDim.x;
    const int gl = glist[u / nxb];
    const int t = T0 + (gl >> 3), ntl = gl & 7;
    const mg_expert *xp = &tab[tile_e[t]];
    const int I = xp->inter;
    const int N = GATEUP ? I : H, K = GATEUP ? H : I;
    constexpr int PER = GATEUP ? 64 : 128; /* output columns a weight block */
    const int nball = (N + PER - 1) / PER, nb0 = (u % nxb) * NB;
    if (nb0 >= nball) {
        if (ctr && tid == 0) snext[par] = fetched;
        continue;
    }
    const int nbe = min(NB, nball - nb0);
    const int r0 = t * MW_BM, rows = ntl * MW_BM;
    __syncthreads(); /* the previous unit's epilogue has read soff / spair and the staging */
    {
        int p = -1, off = -1;
        float wv = 0.f;
        if (tid < rows) {
            p = pf_u == u ? pf_p : perm[r0 + tid];
            if (p >= 0) off = GATEUP ? (p / (k + 1)) * H : (r0 + tid) * ldh;
            if (!GATEUP && p >= 0) wv = pf_u == u ? pf_w : wts[p];
        }
        soff[tid] = off;
        spair[tid] = p;
        if (!GATEUP) swt[tid] = wv;
    }
    __syncthreads();
    /* at step 2 of this unit (after its barriers: snext is visible): the next unit's perm */
    auto prefetch_next = [&]() {
        const int un = ctr ? snext[par] : u + (int)gridDim.x;
        pf_u = -1;
        if (un < U) {
            const int gn = glist[un / nxb];
            const int rn = (T0 + (gn >> 3)) * MW_BM;
            pf_p = -1;
            pf_w = 0.f;
            if (tid < (gn & 7) * MW_BM) {
                pf_p = perm[rn + tid];
                if (!GATEUP && pf_p >= 0) pf_w = wts[pf_p];
            }
            pf_u = un;
        }
    };

    /* loader roles: token chunks (row tid/8 + 32i, chunk tid%8), the codes of A row tid/2
     * (half tid%2), the scales of A row tid (tid < 128) */
    const bf16 *const tsrc = GATEUP ? x : hbuf;
    const int lch = tid & 7, lrow = tid >> 3;
    auto arow = [&](int ar) { /* A row ar (0..127) -> (matrix, row of it) without n0 */
        const int rr = ar & 63, wg = ar >> 6;
        if (GATEUP) return make_int2((rr >> 3) & 1, 32 * wg + 8 * (rr >> 4) + (rr & 7));
        return make_int2(2, ar);
    };
    const int2 cr = arow(tid >> 1), sr = arow(tid & 127);
    const uint8_t *const cbase = xp->w[cr.x] + (tid & 1) * 16;
    const uint8_t *const sbase = BW ? xp->w[0] : xp->s[sr.x];
    const int nk = (K + MW_BK - 1) / MW_BK, Q = nbe * nk; /* NVFP4: K % 64 == 0 (the loader's condition) */

    /* this thread's token chunks, fixed for the unit: rows lrow + 32i (i < 2·ntl: the group's
     * rows), source pointers and a bit mask of the rows that have a token (else zero-filled) */
    const bf16 *pa[8];
    uint32_t zm = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int row = lrow + 32 * i;
        const int off = row < rows ? soff[row] : -1;
        pa[i] = tsrc + (off >= 0 ? off : 0) + lch * 8;
        zm |= off >= 0 ? 1u << i : 0u;
    }
    const uint32_t adst = (uint32_t)(lrow * 128 + ((lch ^ (lrow & 7)) << 4)); /* + 4096·i */
    int lkb = 0, lnb = 0, lst = 0; /* the next block to load: k block, weight block, stage */
    /* this thread's code / scale rows of the loaded weight block (NVFP4), set at its k block 0 */
    const uint8_t *cp = cbase, *sp = sbase;
    bool cok = false, sok = false;

    auto load = [&](int) {
        const int kb = lkb, k0 = kb * MW_BK, n0 = (nb0 + lnb) * PER, lstage = lst;
        const uint32_t st = sb + lst * LY::STAGE;
        if (!BW && kb == 0) {
            const int wr = n0 + cr.y, s_r = n0 + sr.y;
            cok = wr < N;
            sok = s_r < N && tid < 128;
            cp = cok ? cbase + (size_t)wr * (K / 2) : cbase;
            sp = sok ? sbase + (size_t)s_r * (K / 16) : sbase;
        }
        if (++lkb == nk) { lkb = 0; lnb++; }
        if (++lst == S) lst = 0;
        if constexpr (BW) {
#pragma unroll
            for (int i = 0; i < 8; i++) {
                if (i < 2 * ntl) {
                    const bool ok = ((zm >> i) & 1) && k0 + lch * 8 < K;
                    cu_cp16_shared(st + adst + 4096 * i, pa[i] + k0, ok);
                }
            }
        } else if constexpr (TMAT) { /* the group's tiles, 64 rows x 64 k each (a row without a token
                                        * loads its own hbuf row: its product column is never stored) */
            if (tid == 0) {
                const uint32_t bar = sb + LY::MB_OFF + 8 * lstage;
                m2_bar_arrive_tx(bar, (uint32_t)ntl * 8192u);
                for (int i = 0; i < ntl; i++) m2_tma2(st + 8192 * i, &tmh, k0, r0 + 64 * i, bar);
            }
        } else {
            /* a row without a token loads row 0 of x / hbuf (valid memory, K % 64 == 0 here): its
             * column of the product is garbage and never stored (rows are independent in the MMA) */
#pragma unroll
            for (int i = 0; i < 8; i++)
                if (i < 2 * ntl) mw_cp16f(st + adst + 4096 * i, pa[i] + k0);
        }
        if constexpr (BW) { /* weight rows lrow + 32i, chunk lch, into the swizzled tile at C_IN */
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int ar = lrow + 32 * i;
                const int2 m = arow(ar);
                const int wr = n0 + m.y;
                const bool ok = wr < N && k0 + lch * 8 < K;
                const uint8_t *src = xp->w[m.x] + ((size_t)wr * K + k0 + lch * 8) * 2;
                cu_cp16_shared(st + LY::C_IN + ar * 128 + ((lch ^ (ar & 7)) << 4), ok ? src : xp->w[m.x], ok);
            }
            return;
        }
        cu_cp16_shared(st + LY::C_IN + tid * 16, cok ? cp + k0 / 2 : cbase, cok);
        if (tid < 128) mw_cp4(st + LY::S_IN + tid * 4, sok ? sp + k0 / 16 : sbase, sok);
    };

    /* the decode: this lane's A rows ar0 = 64·wg + 16w + g and ar0 + 8 */
    const int ar0 = 64 * (warp >> 2) + 16 * (warp & 3) + g;
    const uint32_t sel = 0x4440u | (uint32_t)tq; /* byte tq to byte 0, zeros above */
    auto place = [&](uint32_t w) -> uint32_t {
        const uint32_t b = __byte_perm(w, 0u, sel);
        return ((b * 0x40040u) & 0x01C001C0u) | ((b * 0x1001000u) & 0x80008000u);
    };
    auto decode = [&](int stq, uint32_t (&a)[16]) {
        const unsigned char *stp = gb + stq * LY::STAGE;
        const uint32_t sw0 = *reinterpret_cast<const uint32_t *>(stp + LY::S_IN + ar0 * 4);
        const uint32_t sw1 = *reinterpret_cast<const uint32_t *>(stp + LY::S_IN + (ar0 + 8) * 4);
        uint32_t sc0[4], sc1[4];
        nv4_scale2_bf16x2_x118((uint16_t)sw0, sc0[0], sc0[1]);
        nv4_scale2_bf16x2_x118((uint16_t)(sw0 >> 16), sc0[2], sc0[3]);
        nv4_scale2_bf16x2_x118((uint16_t)sw1, sc1[0], sc1[1]);
        nv4_scale2_bf16x2_x118((uint16_t)(sw1 >> 16), sc1[2], sc1[3]);
#pragma unroll
        for (int s = 0; s < 4; s++) {
            const uint2 c0 = *reinterpret_cast<const uint2 *>(stp + LY::C_IN + ar0 * 32 + 8 * s);
            const uint2 c1 = *reinterpret_cast<const uint2 *>(stp + LY::C_IN + (ar0 + 8) * 32 + 8 * s);
            a[4 * s + 0] = nv4_hmul2(place(c0.x), sc0[s]);
            a[4 * s + 1] = nv4_hmul2(place(c1.x), sc1[s]);
            a[4 * s + 2] = nv4_hmul2(place(c0.y), sc0[s]);
            a[4 * s + 3] = nv4_hmul2(place(c1.y), sc1[s]);
        }
    };

    float acc[128];
#pragma unroll
    for (int i = 0; i < 128; i++) acc[i] = 0.f;
    uint32_t af[2][16];

    auto mma = [&](const uint32_t (&a)[16], int stq, int kb) {
        const uint64_t db = cu_wg_desc_k128(sb + stq * LY::STAGE);
        if constexpr (BW) {
            const uint64_t da = cu_wg_desc_k128(sb + stq * LY::STAGE + LY::C_IN + (warp >> 2) * 8192);
#define M2_MMA4SS(F) \
    _Pragma("unroll") for (int s = 0; s < 4; s++) F(acc, da + 2 * s, db + 2 * s, kb > 0 || s > 0);
            if (ntl == 4) {
                M2_MMA4SS(m2_mma256ss)
                cu_wg_commit();
            } else if (ntl == 3) {
                M2_MMA4SS(m2_mma192ss)
                cu_wg_commit();
            } else if (ntl == 2) {
                M2_MMA4SS(m2_mma128ss)
                cu_wg_commit();
            } else {
                M2_MMA4SS(m2_mma64ss)
                cu_wg_commit();
            }
#undef M2_MMA4SS
        } else { /* the N switch outside the four MMAs of the group (one uniform branch a block) */
#define M2_MMA4(F)                                                                                     \
    _Pragma("unroll") for (int s = 0; s < 4; s++) {                                                     \
        const uint32_t as[4] = {a[4 * s], a[4 * s + 1], a[4 * s + 2], a[4 * s + 3]};                   \
        F(acc, as, db + 2 * s, kb > 0 || s > 0);                                                         \
    }
            if (ntl == 4) {
                M2_MMA4(m2_mma256)
                cu_wg_commit();
            } else if (ntl == 3) {
                M2_MMA4(m2_mma192)
                cu_wg_commit();
            } else if (ntl == 2) {
                M2_MMA4(m2_mma128)
                cu_wg_commit();
            } else {
                M2_MMA4(m2_mma64)
                cu_wg_commit();
            }
#undef M2_MMA4
        }
    };

    /* down with NB > 1 (LASTSTAND_MG_WGMMA2_DEFER, dfr): a weight block's copy-out from the
     * staging (its own region) is spread over the next block's k steps, after their MMAs are
     * issued, instead of holding the tensor cores; pend = that block, pend_i its next slice */
    constexpr int CPR = PER / 8;          /* 16-byte chunks a row */
    constexpr int CPT = 256 * CPR / 256;  /* chunks a thread for 256 rows */
    const bool defer = !GATEUP && NB > 1 && dfr;
    const int cps = (CPT + nk - 1) / nk;  /* chunks a thread a step when deferred */
    int pend = -1, pend_i = 0;
    auto copy_out = [&](int nb, int i0, int i1) {
        const int n0 = (nb0 + nb) * PER;
        const unsigned char *so = gb + LY::O_OFF;
        for (int i = i0; i < i1; i++) {
            const int c = tid + 256 * i, row = c / CPR, ch = c - row * CPR, col = n0 + ch * 8;
            if (row >= rows || col >= N) continue;
            const uint4 v = *reinterpret_cast<const uint4 *>(so + row * LY::OSTR + ch * 16);
            if (GATEUP) {
                if (soff[row] >= 0) *reinterpret_cast<uint4 *>(hbuf + (size_t)(r0 + row) * ldh + col) = v;
            } else {
                const int p = spair[row];
                if (p >= 0) *reinterpret_cast<uint4 *>(dbuf + (size_t)p * H + col) = v;
            }
        }
    };

    auto epilogue = [&](int nb) {
        unsigned char *so = gb + LY::O_OFF;
        constexpr float SF = BW ? 1.f : 256.f; /* the decode's 2^-8 */
        /* NB == 1: the staging aliases the stages: every warpgroup's MMAs done; defer: every
         * thread's last slice of the previous block's copy-out (this very step) done */
        if (NB == 1 || defer) __syncthreads();
        if (GATEUP) {
            const int il = 32 * (warp >> 2) + 8 * (warp & 3) + g; /* i - n0 */
            const float s2g = xp->s2[0] * SF, s2u = xp->s2[1] * SF;
#pragma unroll
            for (int j = 0; j < 32; j++) {
                if (j < 8 * ntl) {
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const float gv = acc[4 * j + h] * s2g, uv = acc[4 * j + 2 + h] * s2u;
                        const float hv = gv / (1.f + __expf(-gv)) * uv;
                        *reinterpret_cast<bf16 *>(so + (8 * j + 2 * tq + h) * LY::OSTR + il * 2) = __float2bfloat16(hv);
                    }
                }
            }
        } else {
            const int cl = 64 * (warp >> 2) + 16 * (warp & 3) + g; /* column - n0 */
            const float s2d = xp->s2[2] * SF;
#pragma unroll
            for (int j = 0; j < 32; j++) {
                if (j < 8 * ntl) {
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int tok = 8 * j + 2 * tq + h;
                        const float c = s2d * swt[tok];
                        unsigned char *d = so + tok * LY::OSTR + cl * 2;
                        *reinterpret_cast<bf16 *>(d) = __float2bfloat16(acc[4 * j + h] * c);
                        *reinterpret_cast<bf16 *>(d + 16) = __float2bfloat16(acc[4 * j + 2 + h] * c);
                    }
                }
            }
        }
        __syncthreads();
        if (defer && nb < nbe - 1) { /* the copy rides on the next block's steps */
            pend = nb;
            pend_i = 0;
        } else {
            copy_out(nb, 0, CPT);
        }
    };

    int ckb = 0, cnb = 0, cst = 0; /* the block computed next: k block, weight block, stage */
    auto step = [&](int q, uint32_t (&a)[16]) {
        cu_cp_wait<S - 3>();
        if constexpr (TMAT) { /* the tokens by TMA (async proxy, as wgmma reads them): no proxy fence */
            cu_mbar_wait(sb + LY::MB_OFF + 8 * cst, (mph >> cst) & 1);
            mph ^= 1u << cst;
        } else {
            cu_fence_proxy_async();
        }
        __syncthreads(); /* block q landed for all; the stage block q + S - 2 refills was retired */
        if constexpr (CB < 2) {
            if (q + S - 2 < Q) load(q + S - 2);
            cu_cp_async_commit();
        }
        const int nb = cnb, kb = ckb, stq = cst;
        if (++ckb == nk) { ckb = 0; cnb++; }
        if (++cst == S) cst = 0;
        if constexpr (!BW) decode(stq, a);
        if constexpr (!BW) {
#pragma unroll
            for (int i = 0; i < 16; i++) asm volatile("" : "+r"(a[i])::"memory"); /* decoded before the fence */
        }
        cu_wg_fence();
        cu_wg_fence_acc(acc);
        mma(a, stq, kb);
        cu_wg_fence_acc(acc);
        if constexpr (CB >= 2) { /* CB = 2, 3: the refill issued behind the MMAs, off the decode's path */
            if (q + S - 2 < Q) load(q + S - 2);
            cu_cp_async_commit();
        }
        if (defer && pend >= 0) { /* a slice of the previous weight block's copy-out */
            const int i1 = min(CPT, pend_i + cps);
            copy_out(pend, pend_i, i1);
            pend_i = i1;
            if (pend_i >= CPT) pend = -1;
        }
        if (q == 1 && ctr && tid == 0) snext[par] = fetched; /* read by all after step 2's barrier */
        if (q == 2 && pfu) prefetch_next();
        cu_wg_wait<1>();
        if (kb == nk - 1) {
            cu_wg_wait<0>();
            cu_wg_fence_acc(acc);
            epilogue(nb);
        }
    };

#pragma unroll
    for (int q = 0; q < S - 2; q++) {
        if (q < Q) load(q);
        cu_cp_async_commit();
    }
    for (int q = 0; q < Q; q += 2) {
        step(q, af[0]);
        if (q + 1 < Q) step(q + 1, af[1]);
    }
    cu_wg_wait<0>();
    if (Q < 2 && ctr && tid == 0) snext[par] = fetched;
    } /* units */
    if (ctr) { /* the last CTA out resets the counters for the next launch (stream-ordered) */
        __syncthreads();
        if (tid == 0) {
            __threadfence();
            if (atomicAdd(ctr + 1, 1) == (int)gridDim.x - 1) {
                ctr[0] = 0;
                ctr[1] = 0;
                __threadfence();
            }
        }
    }
}

/* ---- host side ------------------------------------------------------------------ */

enum { MW_MAX_DEV = 16 };
static int mw_state[MW_MAX_DEV]; /* per device: 0 not asked, 1 ready (image + shared memory), -1 no */
static int mw_pf = 2;            /* prefetch distance, LASTSTAND_MG_WGMMA_PF = 2, 3 or 4 */
static int mw_v2 = 1;            /* m2_kernel instead of mw_kernel (LASTSTAND_MG_WGMMA2=0: mw_kernel only) */
static int mw_nsm[MW_MAX_DEV];   /* multiprocessors per device (m2_kernel's persistent grid) */
static int mw_dfr = 1;           /* m2 down: copy-out deferred (LASTSTAND_MG_WGMMA2_DEFER=0: not) */
static int mw_pfu = 2;           /* m2: the next unit's perm prefetched (LASTSTAND_MG_WGMMA2_PFU=0: not) */
static int mw_minrows = 112;     /* m2_kernel from this many routed rows per expert on average (S11-R2:
                                  * 35B m2 at 64 rows 958 vs mw 808 us, at 128 rows 1179 vs 1344) */
static thread_local int mw_rows = 1 << 30; /* this host thread's call: M·k/E (mw_rows_hint) */
static int *mw_ctr[MW_MAX_DEV];  /* m2_kernel's unit counters per device: 4 launch kinds x {next, done} */
static int mw_tma = 1;           /* m2's NVFP4 down: token rows by TMA (CB = 3; LASTSTAND_MG_WGMMA2_TMA=0: by
                                  * cp.async, CB = 2; S12-R3, doctor 35B MoE call at 2048 / 4096 / 8192 tokens
                                  * 835 / 1021 / 1609 us against 890 / 1066 / 1619) */
static PFN_cuTensorMapEncodeTiled_v12000 m2_encode; /* its tensor map of hbuf */
static const CUtensorMap m2_nomap = {};             /* the launches without TMA */
static int mw_v2sh = 1;          /* a BF16 shared expert's tiles by m2_kernel (LASTSTAND_MG_WGMMA2_SH=0: not) */
enum { M2_S_GU = 5, M2_S_DN = 4, M2_NB_GU = 1, M2_NB_DN = 4, M2_S_BW = 4 }; /* stages, weight blocks a CTA */
#define M2_GU(CB) m2_kernel<true, false, M2_S_GU, M2_NB_GU, CB>
#define M2_DN(CB) m2_kernel<false, false, M2_S_DN, M2_NB_DN, CB>
#define M2_GU_BW(CB) m2_kernel<true, true, M2_S_BW, 1, CB>
#define M2_DN_BW(CB) m2_kernel<false, true, M2_S_BW, 1, CB>

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
/* m2's forms (CB, m2_kernel): gate/up 1, the NVFP4 down 3 (2 without TMA), the BF16 down 2 */
static bool m2_ready() {
    cudaFuncAttributes fa;
    return cudaFuncGetAttributes(&fa, M2_GU(1)) == cudaSuccess && cudaFuncGetAttributes(&fa, M2_DN(2)) == cudaSuccess &&
           cudaFuncGetAttributes(&fa, M2_DN(3)) == cudaSuccess && cudaFuncGetAttributes(&fa, M2_GU_BW(1)) == cudaSuccess &&
           cudaFuncGetAttributes(&fa, M2_DN_BW(2)) == cudaSuccess &&
           cudaFuncSetAttribute(M2_GU(1), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                m2_lay<true, false, M2_S_GU, M2_NB_GU>::SMEM) == cudaSuccess &&
           cudaFuncSetAttribute(M2_DN(2), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                m2_lay<false, false, M2_S_DN, M2_NB_DN>::SMEM) == cudaSuccess &&
           cudaFuncSetAttribute(M2_DN(3), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                m2_lay<false, false, M2_S_DN, M2_NB_DN>::SMEM) == cudaSuccess &&
           cudaFuncSetAttribute(M2_GU_BW(1), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                m2_lay<true, true, M2_S_BW, 1>::SMEM) == cudaSuccess &&
           cudaFuncSetAttribute(M2_DN_BW(2), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                m2_lay<false, true, M2_S_BW, 1>::SMEM) == cudaSuccess;
}
/* hbuf [rows][ldh] BF16 as a 2-D tensor map, boxes of 64 k x 64 rows (a plan tile), 128-byte swizzle */
static bool m2_map(CUtensorMap *m, const void *hbuf, int ldh, long rows) {
    const cuuint64_t dims[2] = {(cuuint64_t)ldh, (cuuint64_t)rows};
    const cuuint64_t strides[1] = {(cuuint64_t)ldh * 2};
    const cuuint32_t box[2] = {64, 64}, es[2] = {1, 1};
    return m2_encode && m2_encode(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(hbuf), dims, strides,
                                  box, es, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                  CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
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
        cudaDeviceGetAttribute(&mw_nsm[dev], cudaDevAttrMultiProcessorCount, dev);
        if (mw_nsm[dev] < 1) mw_nsm[dev] = 1;
        const char *dv = getenv("LASTSTAND_MG_WGMMA2_DYN");
        if (!(dv && !strcmp(dv, "0"))) { /* dynamic unit scheduling (0: every gridDim.x-th unit) */
            int *c = NULL;
            if (cudaMalloc(&c, 8 * sizeof(int)) == cudaSuccess && cudaMemset(c, 0, 8 * sizeof(int)) == cudaSuccess)
                mw_ctr[dev] = c;
            cudaGetLastError();
        }
        const char *v = getenv("LASTSTAND_MG_WGMMA_PF");
        if (v && (!strcmp(v, "2") || !strcmp(v, "3") || !strcmp(v, "4"))) mw_pf = v[0] - '0';
        v = getenv("LASTSTAND_MG_WGMMA2");
        if (v && !strcmp(v, "0")) mw_v2 = 0;
        v = getenv("LASTSTAND_MG_WGMMA2_DEFER");
        if (v && !strcmp(v, "0")) mw_dfr = 0;
        v = getenv("LASTSTAND_MG_WGMMA2_PFU");
        if (v && !strcmp(v, "0")) mw_pfu = 0;
        v = getenv("LASTSTAND_MG_WGMMA2_MINROWS");
        if (v && atoi(v) >= 0) mw_minrows = atoi(v);
        v = getenv("LASTSTAND_MG_WGMMA2_SH");
        if (v && !strcmp(v, "0")) mw_v2sh = 0;
        v = getenv("LASTSTAND_MG_WGMMA2_TMA");
        if (v && !strcmp(v, "0")) mw_tma = 0;
        if (mw_tma) {
            cudaDriverEntryPointQueryResult qr;
            if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&m2_encode, 12000,
                                                 cudaEnableDefault, &qr) != cudaSuccess ||
                qr != cudaDriverEntryPointSuccess || !m2_encode) {
                log_warn("cuda_grouped_gemm: cuTensorMapEncodeTiled not found; m2_kernel's down loads its tokens by cp.async");
                m2_encode = NULL;
                mw_tma = 0;
            }
            cudaGetLastError();
        }
        s = major == 9 && minor == 0 && mw_ready<2>() && mw_ready<3>() && mw_ready<4>() &&
                    (!(mw_v2 || mw_v2sh) || m2_ready())
                ? 1
                : -1;
        cudaGetLastError(); /* a missing image is not sticky: clear it */
        if (s > 0)
            log_info("cuda_grouped_gemm: 64-row tiles of NVFP4 experts by the wgmma kernels (device %d, sm_90a, %s)",
                     dev, mw_v2 ? "m2_kernel: up to 256 tokens a CTA, weights decoded into the A registers"
                                : mw_pf == 2 ? "mw_kernel, prefetch distance 2"
                                : mw_pf == 3 ? "mw_kernel, prefetch distance 3"
                                             : "mw_kernel, prefetch distance 4");
        else
            log_warn("cuda_grouped_gemm: LASTSTAND_MG_WGMMA=1 but device %d (compute capability %d.%d) has no sm_90a "
                     "image of the wgmma kernels; mg_gemm_kernel runs", dev, major, minor);
        __atomic_store_n(&mw_state[dev], s, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&mw_mu);
    return s > 0;
}

/* m2_kernel's persistent grid: one CTA an SM, no more than the units can use */
static unsigned m2_grid(int tiles_max, int nxb) {
    int dev = 0;
    cudaGetDevice(&dev);
    const long n = mw_nsm[dev >= 0 && dev < MW_MAX_DEV ? dev : 0], u = (long)tiles_max * nxb;
    return (unsigned)(u < n ? (u > 0 ? u : 1) : n);
}
/* the unit counters of launch kind 0..3 (routed gate/up, down, shared gate/up, down), or NULL */
static int *m2_ctr(int kind) {
    int dev = 0;
    cudaGetDevice(&dev);
    int *c = dev >= 0 && dev < MW_MAX_DEV ? mw_ctr[dev] : NULL;
    return c ? c + 2 * kind : NULL;
}

template <bool GATEUP>
cudaError_t mw_launch(int n_out, int tiles_max, const mg_expert *tab, const int32_t *tile_e, const int32_t *perm,
                      const int32_t *nt, int H, int k, const bf16 *x, bf16 *hbuf, int ldh, const float *wts,
                      bf16 *dbuf, cudaStream_t st) {
    if (mw_v2 && tiles_max <= M2_MAXT && mw_rows >= mw_minrows) {
        constexpr int S = GATEUP ? M2_S_GU : M2_S_DN, NB = GATEUP ? M2_NB_GU : M2_NB_DN, PER = GATEUP ? 64 : 128;
        const int nxb = ((n_out + PER - 1) / PER + NB - 1) / NB;
        const unsigned grid = m2_grid(tiles_max, nxb);
        constexpr int SM = m2_lay<GATEUP, false, S, NB>::SMEM;
        int *const ctr = m2_ctr(GATEUP ? 0 : 1);
        const int fl = mw_dfr | mw_pfu;
        if constexpr (GATEUP) {
            M2_GU(1)<<<grid, 256, SM, st>>>(tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts, dbuf, 0, nxb, ctr, fl,
                                            m2_nomap);
        } else {
            CUtensorMap tm;
            memset(&tm, 0, sizeof tm);
            if (mw_tma && m2_map(&tm, hbuf, ldh, (long)tiles_max * MW_BM)) /* else (no map) the cp.async form */
                M2_DN(3)<<<grid, 256, SM, st>>>(tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts, dbuf, 0, nxb, ctr, fl,
                                                tm);
            else
                M2_DN(2)<<<grid, 256, SM, st>>>(tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts, dbuf, 0, nxb, ctr, fl,
                                                m2_nomap);
        }
        return cudaGetLastError();
    }
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

int m2_bf16_on(int tiles) { return tiles <= M2_MAXT && mw_available() && mw_v2sh; }

template <bool GATEUP>
cudaError_t m2_launch_bf16(int n_out, int sh_tiles, const mg_expert *tab, const int32_t *tile_e, const int32_t *perm,
                           const int32_t *nt, int H, int k, const bf16 *x, bf16 *hbuf, int ldh, const float *wts,
                           bf16 *dbuf, cudaStream_t st) {
    constexpr int PER = GATEUP ? 64 : 128;
    const int nxb = (n_out + PER - 1) / PER;
    const unsigned grid = m2_grid(sh_tiles, nxb);
    constexpr int SM = m2_lay<GATEUP, true, M2_S_BW, 1>::SMEM;
    int *const ctr = m2_ctr(GATEUP ? 2 : 3);
    if constexpr (GATEUP)
        M2_GU_BW(1)<<<grid, 256, SM, st>>>(tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts, dbuf, 1, nxb, ctr, mw_pfu,
                                           m2_nomap);
    else
        M2_DN_BW(2)<<<grid, 256, SM, st>>>(tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts, dbuf, 1, nxb, ctr, mw_pfu,
                                           m2_nomap);
    return cudaGetLastError();
}

template cudaError_t m2_launch_bf16<true>(int, int, const mg_expert *, const int32_t *, const int32_t *,
                                          const int32_t *, int, int, const bf16 *, bf16 *, int, const float *, bf16 *,
                                          cudaStream_t);
template cudaError_t m2_launch_bf16<false>(int, int, const mg_expert *, const int32_t *, const int32_t *,
                                           const int32_t *, int, int, const bf16 *, bf16 *, int, const float *,
                                           bf16 *, cudaStream_t);

void mw_rows_hint(int rows) { mw_rows = rows; }
