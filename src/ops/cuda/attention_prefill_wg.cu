/* attention_prefill_wg.cu: cuda_flash_prefill's prefill kernel for head_dim 256 on Hopper warpgroup
 * MMA (wgmma), FlashAttention-3 style. Same contract and tiling as attention_prefill.cu's fp_kernel
 * under the round plan (ops.h attn_args: causal GQA over the paged BF16 KV pool, prefill chunks of
 * several sequences in one call, split-K partials for fp_merge_kernel), with 128 flat rows a CTA:
 * flat row f of a sequence is token f / grp, query head kvh·grp + f % grp, so the CTA's K/V tiles
 * serve the whole GQA group (grp = 8 at the 35B shape: 16 tokens x 8 heads).
 * This file alone is compiled for sm_90a (Makefile): wgmma exists only there; fw_available() says
 * whether the device loaded the image, else attention_prefill.cu keeps fp_kernel.
 *
 * CTA = 384 threads: warpgroups 0 and 1 (warps 0-7) are consumers, 64 flat rows each, warpgroup 2
 * the producer (setmaxnreg: 40 registers a producer thread, 232 a consumer's). Shared memory
 * (1024-aligned, 128-byte swizzled K-major tiles: row r's 16-byte chunk c of a 64-dim slab at
 * r·128 + (c ^ r%8)·16, slab s of a tile at s·(rows·128)):
 *   Q   2 x [64 rows x 256 dims] (32 KB each), staged once by its warpgroup (cp.async)
 *   K/V 2 stages x ([BN keys x 256 dims] K + the same for V) = 2 x 80 KB at BN = 80, by the producer
 *   mbarriers fullK/fullV (producer -> consumers, 128 arrivals) and emptyK/emptyV (consumers ->
 *   producer, one arrival a consumer warp) per stage.
 * Producer: for each key tile, K then V by cp.async (16 bytes a lane, 512 bytes a key row, BN / 4
 * rows a warp: the page table read once a tile, keys past the tile's last zero-filled); each
 * thread's copies arrive on the stage's full barrier by cp.async.mbarrier.arrive.noinc (the
 * producer never waits for its own copies: harness 402 -> 415 TFLOP/s against waiting, fencing and
 * arriving), and the consumers fence.proxy.async after the wait (the generic-proxy writes made
 * visible to wgmma's async proxy). A stage is reused when the consumers released it. The page
 * table is read a tile ahead (harness 409 -> 423 TFLOP/s).
 * TMA (LASTSTAND_FP_WG_TMA=1, the default): warp 8 alone produces; a tile's runs of 16 keys that lie
 * in one page below the sequence's end come as 4 tensor-map boxes each (64 dims x 16 rows, the same
 * 128-byte swizzle), the barrier's phase waiting for their bytes (expect_tx) and the warp's arrivals;
 * the rest (the last tile's runs) by cp.async with zero fill as above.
 * Tried and dropped: FA3's ping-pong of the two consumer warpgroups (named barriers ordering their
 * MMA issue): 393 against 402 TFLOP/s with cp.async, 481 against 473 with TMA (noise, and it spills):
 * not kept; 64-key tiles: 384 against 408 with 80.
 * Consumer warpgroup, per key tile i (BN = 80 keys), FA3's intra-warpgroup overlap:
 *   S_i = Q·K_iᵀ   16 x wgmma m64n80k16 (A = Q, B = K from shared memory, K-major), issued, then
 *   O += P_{i-1}·V_{i-1}   5 x wgmma m64n256k16 (A = P in registers, BF16 from the S
 *                  accumulators, B = V from shared memory, MN-major: the transpose bit), issued;
 *   wait S_i, release K_i, mask (the tiles past the CTA's first row's last key only), online
 *   softmax in the log2 domain (row max over the row's four lanes), wait the PV, release V_{i-1},
 *   O rescaled (skipped when no row's max moved), P_i = BF16(exp2(s - m)).
 * Accumulator fragment (m64nN f32): warp w of the warpgroup holds rows 16w + g, 16w + g + 8
 * (g = lane/4), n8 block j: d[4j + 0, 1] = (row g, cols 8j + 2t, +1), d[4j + 2, 3] = (row g + 8)
 * (t = lane%4); the A register fragment of k16 step kk is the S blocks 2kk, 2kk + 1 packed as
 * mma.sync's m16n8k16 A (the same layout).
 */
#include "ops/cuda/attention_prefill_wg.cuh"
#include "ops/cuda/cu_pdl.h"
#include "ops/cuda/cu_wgmma.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <pthread.h>

enum { FW_THREADS = 384 };
/* registers a thread after setmaxnreg: the producer warpgroup gives, the consumers take
 * (128 x 40 + 256 x 232 <= 64K) */
enum { FW_REG_PROD = 40, FW_REG_CONS = 232 };
/* Shared memory for head_dim HD and BN-key tiles: Q 2 x [64 rows x HD] (2 x 32 KB at HD 256), then 2
 * stages of K and V [BN keys x HD dims] (a 64-dim slab of a tile: BN x 128 B), the barriers, the
 * alignment slack. HD 256: BN = 64 193 KB, 80 225 KB; HD 128, BN 128: 161 KB. */
template <int HD, int BN>
struct fw_lay {
    static constexpr int Q_OFF = 0;
    static constexpr int QWG = 64 * HD * 2;                /* a warpgroup's Q rows */
    static constexpr int SLAB = BN * 128;                  /* bytes of a 64-dim slab of a K or V tile */
    static constexpr int TILE = HD / 64 * SLAB;            /* a K (or V) tile */
    static constexpr int KV_OFF = 2 * QWG;                 /* stage s: K at KV_OFF + 2s·TILE, V a TILE later */
    static constexpr int BAR_OFF = KV_OFF + 4 * TILE;      /* fullK[2], fullV[2], emptyK[2], emptyV[2] */
    static constexpr int SMEM = BAR_OFF + 64 + 1024;
};

/* the barrier's arrival once every cp.async this thread issued so far has landed (not counted as
 * pending: the barrier's count includes it) */
__device__ __forceinline__ void fw_cp_arrive(uint32_t a) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(a) : "memory");
}
/* the transaction bytes the barrier's current phase also waits for (the TMA copies' complete_tx) */
__device__ __forceinline__ void fw_bar_expect(uint32_t a, uint32_t bytes) {
    asm volatile("mbarrier.expect_tx.shared::cta.b64 [%0], %1;\n" ::"r"(a), "r"(bytes) : "memory");
}
/* TMA: the box at (c0, c1, c2) of the 3-D tensor map into shared memory at dst, complete_tx on bar */
__device__ __forceinline__ void fw_tma3(uint32_t dst, const CUtensorMap *tm, int c0, int c1, int c2, uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
        "[%5];\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(tm)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");
}
__device__ __forceinline__ void fw_bar_arrive(uint32_t a) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(a) : "memory");
}
/* cu_wg_fence_acc (cu_wgmma.cuh) for the A registers */
template <int N>
__device__ __forceinline__ void fw_fence_u(uint32_t (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+r"(d[i])::"memory");
}

/* MN-major (V as B of O += P·V: N = dims contiguous), 128-byte swizzle: the leading offset is the
 * step between 64-dim slabs (BN keys x 128 B), the stride offset between 8-key groups
 * (1024 B) */
__device__ __forceinline__ uint64_t fw_desc_v(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) |
           ((uint64_t)1 << 62);
}


/* d[64 x 64] (+)= A[64 x 16] · B[64 x 16]ᵀ, both K-major in shared memory; acc 0: d = A·Bᵀ */
__device__ __forceinline__ void fw_mma_qk(float (&d)[32], uint64_t da, uint64_t db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : CU_WG_R32(0)
        : "l"(da), "l"(db), "r"(acc));
}

/* d[64 x 80] (+)= A[64 x 16] · B[80 x 16]ᵀ, both K-major in shared memory; acc 0: d = A·Bᵀ */
__device__ __forceinline__ void fw_mma_qk(float (&d)[40], uint64_t da, uint64_t db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %42, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n80k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39"
        "}, %40, %41, p, 1, 1, 0, 0;\n}\n"
        : CU_WG_R32(0), CU_WG_R4(32), CU_WG_R4(36)
        : "l"(da), "l"(db), "r"(acc));
}

/* d[64 x 128] (+)= A[64 x 16] · B[128 x 16]ᵀ, both K-major in shared memory; acc 0: d = A·Bᵀ */
__device__ __forceinline__ void fw_mma_qk(float (&d)[64], uint64_t da, uint64_t db, int acc) {
    cu_wg_mma128_ss(d, da, db, acc);
}

/* d[64 x 128] += A[64 x 16] (registers) · B[16 x 128] (shared memory, MN-major: transposed) */
__device__ __forceinline__ void fw_mma_pv(float (&d)[64], const uint32_t *a, uint64_t db) {
    cu_wg_mma128_rs<1>(d, a, db, 1);
}

/* d[64 x 256] += A[64 x 16] (registers) · B[16 x 256] (shared memory, MN-major: transposed) */
__device__ __forceinline__ void fw_mma_pv(float (&d)[128], const uint32_t *a, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
        "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
        "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
        "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
        "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
        "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
        : CU_WG_R32(0), CU_WG_R32(32), CU_WG_R32(64), CU_WG_R32(96)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

__device__ __forceinline__ uint32_t fw_pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

template <int HD, int BN, bool TMA>
__global__ void __launch_bounds__(FW_THREADS, 1)
    fw_kernel(int n_seq, const attn_seq *__restrict__ seqs, int nh, int nkv, int P, float sl2,
              const bf16 *__restrict__ q, const bf16 *__restrict__ gate, const bf16 *__restrict__ K,
              const bf16 *__restrict__ V, bf16 *__restrict__ out, float *__restrict__ part_o,
              float *__restrict__ part_ml, int n_rows_total, int lpt, const __grid_constant__ CUtensorMap tmk,
              const __grid_constant__ CUtensorMap tmv) {
    typedef fw_lay<HD, BN> LY;
    constexpr int NJ = BN / 8; /* n8 blocks of S */
    constexpr int NS = HD / 64; /* 64-dim slabs of a Q, K or V row */
    constexpr int RL = HD / 8;  /* lanes that copy a key row, 16 bytes each */
    constexpr int RLS = HD == 256 ? 5 : 4; /* log2(RL) */
    static_assert(HD == 128 || HD == 256, "fw_kernel: head_dim 128 or 256");
    extern __shared__ __align__(1024) unsigned char fw_dsm[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(fw_dsm);
    const uint32_t sb = (raw + 1023u) & ~1023u;
    const int grp = nh / nkv, kvh = blockIdx.y;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    cu_pdl_wait();
    cu_pdl_trigger();

    /* which sequence and tile (as fp_kernel, FW_BM rows a tile; lpt: the last tiles first) */
    int id = blockIdx.x, s = 0;
    if (lpt) {
        int total = 0;
        for (int i = 0; i < n_seq; i++) total += (seqs[i].n_new * grp + FW_BM - 1) / FW_BM;
        if (id >= total) return;
        id = total - 1 - id;
    }
    for (; s < n_seq; s++) {
        const int nt = (seqs[s].n_new * grp + FW_BM - 1) / FW_BM;
        if (id < nt) break;
        id -= nt;
    }
    if (s >= n_seq) return;
    const int n_past = seqs[s].n_past, n_new = seqs[s].n_new, row0 = seqs[s].row0;
    const int32_t *__restrict__ pages = seqs[s].pages;
    const int f0 = id * FW_BM;
    const int nrows = min(FW_BM, n_new * grp - f0);
    const int kmax = n_past + (f0 + nrows - 1) / grp; /* the last key any row of the tile sees */
    const int n_ktiles = kmax / BN + 1;
    const int z = blockIdx.z, nsplit = gridDim.z;
    /* split z takes key tiles z, z + nsplit, ... */
    const int n_it = z < n_ktiles ? (n_ktiles - z + nsplit - 1) / nsplit : 0;

    const uint32_t bar = sb + LY::BAR_OFF; /* fullK s: +8s, fullV: +16 + 8s, emptyK: +32 + 8s, emptyV: +48 + 8s */
    if (tid == 0) {
        const int np = TMA ? 32 : 128; /* producer threads arriving on a full barrier */
        cu_mbar_init(bar + 0, np);
        cu_mbar_init(bar + 8, np);
        cu_mbar_init(bar + 16, np);
        cu_mbar_init(bar + 24, np);
        cu_mbar_init(bar + 32, 8);
        cu_mbar_init(bar + 40, 8);
        cu_mbar_init(bar + 48, 8);
        cu_mbar_init(bar + 56, 8);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (TMA && warp >= 8) { /* ---- the producer, TMA: warp 8 alone ---- */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"((int)FW_REG_PROD));
        if (warp > 8) return;
        /* a tile is NR runs of 16 keys; a run inside one page whose keys are all <= kmax comes by TMA
         * (HD / 64 boxes of 64 dims x 16 rows, 128-byte swizzled as the consumers read it) at row
         * pages[j / P]·P + j % P of the pool viewed as [rows][nkv][HD]; other runs (the last tile's,
         * or every run when 16 does not divide P) by cp.async with zero fill. Lane m < NR holds run
         * m's pool row (-1: not by TMA), read a tile ahead. */
        constexpr int NR = BN / 16;
        const bool p16 = P % 16 == 0;
        auto runrow = [&](int kt) -> int {
            const int j = kt * BN + 16 * lane;
            return lane < NR && p16 && j + 15 <= kmax ? pages[j / P] * P + j % P : -1;
        };
        auto rowoff = [&](int j) -> long long { /* key j's element offset, -1 past kmax */
            return j <= kmax ? (((long long)pages[j / P] * P + j % P) * nkv + kvh) * HD : -1;
        };
        auto load = [&](const CUtensorMap *tm, const bf16 *src, int kt, int rr, uint32_t dst, uint32_t fb) {
            const unsigned full = __ballot_sync(0xffffffffu, rr >= 0) & ((1u << NR) - 1);
            int rows[NR];
#pragma unroll
            for (int m = 0; m < NR; m++) rows[m] = __shfl_sync(0xffffffffu, rr, m);
            if (lane == 0) {
                fw_bar_expect(fb, (uint32_t)__popc(full) * 16 * HD * 2);
#pragma unroll
                for (int m = 0; m < NR; m++)
                    if (full >> m & 1)
#pragma unroll
                        for (int c = 0; c < NS; c++)
                            fw_tma3(dst + c * LY::SLAB + m * 2048, tm, 64 * c, kvh, rows[m], fb);
            }
            __syncwarp();
            for (int m = 0; m < NR; m++) {
                if (full >> m & 1) continue;
                const long long oj = rowoff(kt * BN + 16 * m + (lane & 15));
                const uint32_t dl = dst + (lane >> 3) * LY::SLAB;
#pragma unroll 4
                for (int r = 16 * m; r < 16 * m + 16; r++) {
                    const long long off = __shfl_sync(0xffffffffu, oj, r & 15);
                    if (lane < RL) /* a key row is RL lanes' 16 bytes */
                        cu_cp16_shared(dl + r * 128 + (((lane & 7) ^ (r & 7)) << 4),
                                       off >= 0 ? src + off + lane * 8 : src, off >= 0);
                }
            }
            fw_cp_arrive(fb);
        };
        int nr = n_it > 0 ? runrow(z) : -1;
        for (int i = 0; i < n_it; i++) {
            const int st = i & 1, u = i >> 1, kt = z + i * nsplit;
            const int rr = nr;
            if (i + 1 < n_it) nr = runrow(z + (i + 1) * nsplit);
            const uint32_t kd = sb + LY::KV_OFF + st * 2 * LY::TILE;
            if (i >= 2) cu_mbar_wait(bar + 32 + 8 * st, (u - 1) & 1);
            load(&tmk, K, kt, rr, kd, bar + 8 * st);
            if (i >= 2) cu_mbar_wait(bar + 48 + 8 * st, (u - 1) & 1);
            load(&tmv, V, kt, rr, kd + LY::TILE, bar + 16 + 8 * st);
        }
        cu_cp_wait<0>();
        return;
    }
    if (warp >= 8) { /* ---- the producer warpgroup ---- */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"((int)FW_REG_PROD));
        /* warp pw loads key rows RW·pw .. RW·pw + RW - 1 of each K tile, then of the V tile (split
         * between K and V warps instead, two and two: harness 420 -> 339 TFLOP/s) */
        const int part = warp - 8;
        constexpr int RW = BN / 4;
        /* key rows kt·BN + RW·part + lane (+ 32): their element offsets (-1 past kmax), shared by
         * shuffles; read a tile ahead (the page table's latency off the critical path) */
        auto offs = [&](int kt, int r) -> long long {
            const int j = kt * BN + RW * part + r;
            return r < RW && j <= kmax ? (((long long)pages[j / P] * P + j % P) * nkv + kvh) * HD : -1;
        };
        auto load = [&](const bf16 *src, long long o0, long long o1, uint32_t dst) {
            const uint32_t dl = dst + (lane >> 3) * LY::SLAB;
#pragma unroll 4
            for (int rr = 0; rr < RW; rr++) {
                const int r = RW * part + rr;
                const long long off = __shfl_sync(0xffffffffu, rr < 32 ? o0 : o1, rr & 31);
                if (lane < RL)
                    cu_cp16_shared(dl + r * 128 + (((lane & 7) ^ (r & 7)) << 4), off >= 0 ? src + off + lane * 8 : src,
                                   off >= 0);
            }
        };
        long long n0 = n_it > 0 ? offs(z, lane) : -1, n1 = n_it > 0 && RW > 32 ? offs(z, lane + 32) : -1;
        for (int i = 0; i < n_it; i++) {
            const int st = i & 1, u = i >> 1;
            const long long o0 = n0, o1 = n1;
            if (i + 1 < n_it) {
                n0 = offs(z + (i + 1) * nsplit, lane);
                if (RW > 32) n1 = offs(z + (i + 1) * nsplit, lane + 32);
            }
            const uint32_t kd = sb + LY::KV_OFF + st * 2 * LY::TILE;
            /* the copies arrive on the full barriers themselves (cp.async.mbarrier.arrive); the
             * consumers fence the async proxy after their wait */
            if (i >= 2) cu_mbar_wait(bar + 32 + 8 * st, (u - 1) & 1); /* emptyK: tile i - 2's S done */
            load(K, o0, o1, kd);
            fw_cp_arrive(bar + 8 * st);
            if (i >= 2) cu_mbar_wait(bar + 48 + 8 * st, (u - 1) & 1); /* emptyV: tile i - 2's PV done */
            load(V, o0, o1, kd + LY::TILE);
            fw_cp_arrive(bar + 16 + 8 * st);
        }
        cu_cp_wait<0>();
        return;
    }

    /* ---- the consumer warpgroups ---- */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"((int)FW_REG_CONS));
    const int wg = warp >> 2, wi = warp & 3, ctid = tid & 127, g = lane >> 2, t = lane & 3;
    const uint32_t qs = sb + LY::Q_OFF + wg * LY::QWG;
    /* stage Q: the warpgroup's 64 rows (flat rows f0 + 64wg + r; zeros past nrows) */
    for (int i = ctid; i < 64 * RL; i += 128) {
        const int r = i >> RLS, pc = i & (RL - 1), fr = 64 * wg + r;
        const bool ok = fr < nrows;
        const int f = f0 + fr;
        const bf16 *src = ok ? q + ((size_t)(row0 + f / grp) * nh + kvh * grp + f % grp) * HD + pc * 8 : q;
        cu_cp16_shared(qs + (pc >> 3) * 8192 + r * 128 + (((pc & 7) ^ (r & 7)) << 4), src, ok);
    }
    cu_cp_async_commit();
    cu_cp_wait<0>();
    cu_fence_proxy_async();
    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");

    /* this thread's rows: A = 16wi + g, B = A + 8 (of the warpgroup's 64); lim = the last key the
     * row sees (padding rows: kmax, never fully masked, never written) */
    const int rA = 64 * wg + 16 * wi + g, rB = rA + 8;
    const int limA = rA < nrows ? n_past + (f0 + rA) / grp : kmax;
    const int limB = rB < nrows ? n_past + (f0 + rB) / grp : kmax;
    const int mask_from = n_past + f0 / grp; /* keys above it are masked for some row */
    float mA = -INFINITY, mB = -INFINITY, lA = 0.f, lB = 0.f;
    float o[HD / 2], sc[4 * NJ];
    uint32_t pa[2 * NJ];
#pragma unroll
    for (int i = 0; i < HD / 2; i++) o[i] = 0.f;

    auto issue_qk = [&](int st) {
        const uint32_t ks = sb + LY::KV_OFF + st * 2 * LY::TILE;
        cu_wg_fence();
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++)
            fw_mma_qk(sc, cu_wg_desc_k128(qs + (kk >> 2) * 8192) + 2 * (kk & 3),
                      cu_wg_desc_k128(ks + (kk >> 2) * LY::SLAB) + 2 * (kk & 3), kk);
        cu_wg_commit();
        cu_wg_fence_acc(sc);
    };
    auto issue_pv = [&](int st) {
        const uint32_t vs = sb + LY::KV_OFF + st * 2 * LY::TILE + LY::TILE;
        cu_wg_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) fw_mma_pv(o, pa + 4 * kk, fw_desc_v(vs + kk * 2048, LY::SLAB, 1024));
        cu_wg_commit();
        cu_wg_fence_acc(o);
    };
    auto release = [&](uint32_t b) {
        __syncwarp();
        if (lane == 0) fw_bar_arrive(b);
    };
    /* masked online softmax of S (key tile kt): the rows' new max, cA / cB = the factors O and l
     * are rescaled by, sc = P = exp2(s·sl2 - m) (fp32; m in log2 units, the scale folded into one FFMA) */
    float cA = 1.f, cB = 1.f;
    auto softmax = [&](int kt) {
        float xA = -INFINITY, xB = -INFINITY;
        if (kt * BN + BN - 1 > mask_from) {
#pragma unroll
            for (int j = 0; j < NJ; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = kt * BN + 8 * j + 2 * t + (e & 1);
                    if (key > (e < 2 ? limA : limB)) sc[4 * j + e] = -INFINITY;
                }
        }
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            xA = fmaxf(xA, fmaxf(sc[4 * j], sc[4 * j + 1]));
            xB = fmaxf(xB, fmaxf(sc[4 * j + 2], sc[4 * j + 3]));
        }
#pragma unroll
        for (int o2 = 1; o2 < 4; o2 <<= 1) {
            xA = fmaxf(xA, __shfl_xor_sync(0xffffffffu, xA, o2));
            xB = fmaxf(xB, __shfl_xor_sync(0xffffffffu, xB, o2));
        }
        const float nA = fmaxf(mA, xA * sl2), nB = fmaxf(mB, xB * sl2); /* sl2 > 0 */
        const float uA = nA == -INFINITY ? 0.f : nA, uB = nB == -INFINITY ? 0.f : nB; /* fully masked rows */
        cA = exp2f(mA - uA);
        cB = exp2f(mB - uB);
        mA = nA;
        mB = nB;
        lA *= cA;
        lB *= cB;
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            sc[4 * j] = exp2f(fmaf(sc[4 * j], sl2, -uA));
            sc[4 * j + 1] = exp2f(fmaf(sc[4 * j + 1], sl2, -uA));
            sc[4 * j + 2] = exp2f(fmaf(sc[4 * j + 2], sl2, -uB));
            sc[4 * j + 3] = exp2f(fmaf(sc[4 * j + 3], sl2, -uB));
            lA += sc[4 * j] + sc[4 * j + 1];
            lB += sc[4 * j + 2] + sc[4 * j + 3];
        }
    };
    auto pack_p = [&]() {
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            pa[4 * kk] = fw_pack(sc[8 * kk], sc[8 * kk + 1]);
            pa[4 * kk + 1] = fw_pack(sc[8 * kk + 2], sc[8 * kk + 3]);
            pa[4 * kk + 2] = fw_pack(sc[8 * kk + 4], sc[8 * kk + 5]);
            pa[4 * kk + 3] = fw_pack(sc[8 * kk + 6], sc[8 * kk + 7]);
        }
    };
    auto rescale = [&]() {
        if (!__all_sync(0xffffffffu, cA == 1.f && cB == 1.f)) {
#pragma unroll
            for (int j = 0; j < HD / 8; j++) {
                o[4 * j] *= cA;
                o[4 * j + 1] *= cA;
                o[4 * j + 2] *= cB;
                o[4 * j + 3] *= cB;
            }
        }
    };

    if (n_it > 0) {
        cu_mbar_wait(bar + 0, 0);
        cu_fence_proxy_async();
        issue_qk(0);
        cu_wg_wait<0>();
        cu_wg_fence_acc(sc);
        release(bar + 32);
        softmax(z);
        pack_p();
        for (int i = 1; i < n_it; i++) {
            const int st = i & 1, ps = (i - 1) & 1;
            cu_mbar_wait(bar + 8 * st, (i >> 1) & 1);
            cu_fence_proxy_async();
            issue_qk(st);
            cu_mbar_wait(bar + 16 + 8 * ps, ((i - 1) >> 1) & 1);
            cu_fence_proxy_async();
            issue_pv(ps);
            cu_wg_wait<1>(); /* S_i done; the PV may still run */
            cu_wg_fence_acc(sc);
            release(bar + 32 + 8 * st);
            softmax(z + i * nsplit);
            cu_wg_wait<0>(); /* the PV done: O and P's registers free */
            cu_wg_fence_acc(o);
            fw_fence_u(pa);
            release(bar + 48 + 8 * ps);
            rescale();
            pack_p();
        }
        const int ls = (n_it - 1) & 1;
        cu_mbar_wait(bar + 16 + 8 * ls, ((n_it - 1) >> 1) & 1);
        cu_fence_proxy_async();
        issue_pv(ls);
        cu_wg_wait<0>();
        cu_wg_fence_acc(o);
        fw_fence_u(pa);
    }

    /* finish: l summed over the row's four lanes; O / l, the gate, BF16 (or the split's partial) */
#pragma unroll
    for (int o2 = 1; o2 < 4; o2 <<= 1) {
        lA += __shfl_xor_sync(0xffffffffu, lA, o2);
        lB += __shfl_xor_sync(0xffffffffu, lB, o2);
    }
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int r = half ? rB : rA;
        if (r >= nrows) continue;
        const int f = f0 + r;
        const size_t orow = (size_t)(row0 + f / grp) * nh + kvh * grp + f % grp;
        if (part_o) {
            const size_t prow = (size_t)z * n_rows_total + orow;
            if (t == 0) {
                part_ml[2 * prow] = half ? mB : mA;
                part_ml[2 * prow + 1] = half ? lB : lA;
            }
#pragma unroll
            for (int j = 0; j < HD / 8; j++)
                *reinterpret_cast<float2 *>(part_o + prow * HD + 8 * j + 2 * t) =
                    make_float2(o[4 * j + 2 * half], o[4 * j + 2 * half + 1]);
        } else {
            const float l = half ? lB : lA, inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
            for (int j = 0; j < HD / 8; j++) {
                const size_t at = orow * HD + 8 * j + 2 * t;
                float v0 = o[4 * j + 2 * half] * inv, v1 = o[4 * j + 2 * half + 1] * inv;
                if (gate) {
                    const __nv_bfloat162 gv = *reinterpret_cast<const __nv_bfloat162 *>(gate + at);
                    v0 *= 1.f / (1.f + __expf(-__bfloat162float(gv.x)));
                    v1 *= 1.f / (1.f + __expf(-__bfloat162float(gv.y)));
                }
                *reinterpret_cast<uint32_t *>(out + at) = fw_pack(v0, v1);
            }
        }
    }
}

/* ---- host side ------------------------------------------------------------------ */

enum { FW_MAX_DEV = 16 };
static int fw_state[FW_MAX_DEV]; /* per device: 0 not asked, 1 ready, -1 no */
static pthread_mutex_t fw_mu = PTHREAD_MUTEX_INITIALIZER;

/* keys a tile: 80 at head_dim 256 (FlashAttention-3's choice there; the standalone harness at 8192
 * tokens: 408 TFLOP/s against 384 with 64), 128 at head_dim 128 (FlashAttention-3's 128 x 128 tiles;
 * the S accumulator of m64n128 takes the registers the halved O frees) */
template <int HD>
struct fw_bn {
    static constexpr int BN = HD == 256 ? 80 : 128;
};
template <int HD, bool TMA>
static bool fw_optin(void) {
    constexpr int BN = fw_bn<HD>::BN;
    return cudaFuncSetAttribute(fw_kernel<HD, BN, TMA>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                fw_lay<HD, BN>::SMEM) == cudaSuccess;
}

/* LASTSTAND_FP_WG_TMA = 1 (default: the standalone harness on an H200, 8192-token prompt at the 35B
 * shape 1.300 -> 1.141 ms, 423 -> 482 TFLOP/s; 2048 tokens 317 -> 341; every sampled row right):
 * K/V tiles by TMA (cp.async.bulk.tensor, one producer thread; tensor maps over the call's pool
 * encoded on the host, cuTensorMapEncodeTiled through the runtime's driver entry point) where the
 * run of 16 keys lies in one page below the sequence's end; 0: every row by cp.async from 4
 * producer warps */
static int fw_tma = 1;
static PFN_cuTensorMapEncodeTiled_v12000 fw_encode;

/* the pool [rows][nkv][hd] BF16 as a 3-D tensor map, boxes of 64 dims x 1 head x 16 rows, 128-byte
 * swizzle */
static int fw_map(CUtensorMap *m, const void *base, int hd, int nkv, long rows) {
    const cuuint64_t dims[3] = {(cuuint64_t)hd, (cuuint64_t)nkv, (cuuint64_t)rows};
    const cuuint64_t strides[2] = {(cuuint64_t)hd * 2, (cuuint64_t)nkv * hd * 2};
    const cuuint32_t box[3] = {64, 1, 16}, es[3] = {1, 1, 1};
    return fw_encode(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void *>(base), dims, strides, box, es,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

int fw_available(void) {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= FW_MAX_DEV) {
        cudaGetLastError();
        return 0;
    }
    int s = __atomic_load_n(&fw_state[dev], __ATOMIC_ACQUIRE);
    if (s) return s > 0;
    pthread_mutex_lock(&fw_mu);
    s = fw_state[dev];
    if (!s) {
        int major = 0, minor = 0;
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
        fw_tma = cu_env_switch("LASTSTAND_FP_WG_TMA", fw_tma);
        if (fw_tma) {
            cudaDriverEntryPointQueryResult qr;
            if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", (void **)&fw_encode, 12000,
                                                 cudaEnableDefault, &qr) != cudaSuccess ||
                qr != cudaDriverEntryPointSuccess || !fw_encode) {
                log_warn("cuda_flash_prefill: LASTSTAND_FP_WG_TMA=1 but cuTensorMapEncodeTiled was not found; cp.async");
                fw_tma = 0;
            }
            cudaGetLastError();
        }
        cudaFuncAttributes fa;
        s = major == 9 && minor == 0 && cudaFuncGetAttributes(&fa, fw_kernel<256, fw_bn<256>::BN, false>) == cudaSuccess &&
                    fw_optin<256, false>() && fw_optin<256, true>() && fw_optin<128, false>() &&
                    fw_optin<128, true>()
                ? 1
                : -1;
        cudaGetLastError(); /* a missing image is not sticky: clear it */
        if (s > 0)
            log_info("cuda_flash_prefill: head_dim 128 and 256 prefill by the wgmma kernel (device %d, sm_90a, K/V by %s)",
                     dev, fw_tma ? "TMA" : "cp.async");
        else
            log_warn("cuda_flash_prefill: LASTSTAND_FP_WG=1 but device %d (compute capability %d.%d) has no sm_90a "
                     "image of the wgmma kernel; fp_kernel runs", dev, major, minor);
        __atomic_store_n(&fw_state[dev], s, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&fw_mu);
    return s > 0;
}

template <int HD, int BN, bool TMA>
static cudaError_t fw_go(dim3 grid, int pdl, cudaStream_t st, int n_seq, const attn_seq *seqs, int nh, int nkv, int P,
                         float sl2, const bf16 *q, const bf16 *gate, const bf16 *K, const bf16 *V, bf16 *out,
                         float *part_o, float *part_ml, int n_rows_total, int lpt, const CUtensorMap &tmk,
                         const CUtensorMap &tmv) {
    return cu_launch_pdl(pdl, fw_kernel<HD, BN, TMA>, grid, dim3(FW_THREADS), (size_t)fw_lay<HD, BN>::SMEM, st, n_seq, seqs, nh,
                         nkv, P, sl2, q, gate, K, V, out, part_o, part_ml, n_rows_total, lpt, tmk, tmv);
}

cudaError_t fw_launch(int hd, dim3 grid, int pdl, cudaStream_t st, int n_seq, const attn_seq *seqs, int nh, int nkv,
                      int P, long pool_rows, float sl2, const bf16 *q, const bf16 *gate, const bf16 *K, const bf16 *V,
                      bf16 *out, float *part_o, float *part_ml, int n_rows_total, int lpt) {
    if (hd != 128 && hd != 256) return cudaErrorInvalidValue;
    CUtensorMap tmk, tmv;
    memset(&tmk, 0, sizeof tmk);
    memset(&tmv, 0, sizeof tmv);
    const bool tma =
        fw_tma && pool_rows > 0 && fw_map(&tmk, K, hd, nkv, pool_rows) && fw_map(&tmv, V, hd, nkv, pool_rows);
#define FW_ARGS grid, pdl, st, n_seq, seqs, nh, nkv, P, sl2, q, gate, K, V, out, part_o, part_ml, n_rows_total, lpt, tmk, tmv
    constexpr int B128 = fw_bn<128>::BN, B256 = fw_bn<256>::BN;
    if (hd == 128) return tma ? fw_go<128, B128, true>(FW_ARGS) : fw_go<128, B128, false>(FW_ARGS);
    return tma ? fw_go<256, B256, true>(FW_ARGS) : fw_go<256, B256, false>(FW_ARGS);
#undef FW_ARGS
}
