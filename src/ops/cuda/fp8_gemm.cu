/* fp8_gemm.cu: FP8 (E4M3) weights x BF16 activations ("W8A16") for the gemm family on
 * CUDA (fp8_gemm.h): y[M,N] (+)= x[M,K] · Wᵀ with W a W_FP8 lin_w, 1 byte a weight,
 * W[n,k] = e4m3(code[n,k]) · fscale[((n + fs_r0) / fs_br) · fs_cols + (k + fs_c0) / fs_bc].
 * Three pieces, one per CUDA gemm backend:
 *   cu_fp8_gemv_run  the small-M kernel (M <= 16) that cuda_gemv (gemv.cu) runs;
 *   cu_fp8_dequant   W -> BF16 [N, K], for cuda_cublaslt (fp4_gemm.cu) at large M;
 *   cu_fp8_ref_run   one thread per output, the chain-of-trust reference (cuda_ref).
 *
 * ---- the small-M kernel -----------------------------------------------------------
 *
 * Decode is memory-bound, so the kernel must stream the 1-byte weights at close to copy
 * bandwidth; the 16 codes a lane loads go to the tensor cores as the A operand of
 * mma.sync with 16 weight rows a tile ("swap AB", as gemv.cu: M = 1 reads no more weight
 * than M = 16), with ONE instruction per two weights on the way.
 *
 * Why not mma.sync m16n8k32 .e4m3: on sm_90 (the H200) there is no FP8 mma.sync in the
 * hardware. ptxas lowers mma.sync.m16n8k32.row.col.f32.e4m3.e4m3.f32 to
 * F2FP.F16.E4M3.UNPACK_B (two codes -> f16x2) on every A and B register, then two
 * HMMA.16816.F32 (f16); only sm_89 and sm_120 get a native QMMA.16832 (read from the
 * SASS of nvcc 13.0: 12 F2FP + 2 HMMA + 4 FADD per e4m3 mma on sm_90 / sm_90a / sm_100a).
 * Hopper's FP8 tensor-core path is wgmma only. So this kernel does that conversion
 * itself, once per weight register (cvt.rn.f16x2.e4m3x2: exact, E4M3 is a subset of
 * f16), shared by all the token tiles, and feeds f16 mma m16n8k16; x needs no E4M3 hi /
 * lo split then (that would double the B columns and the mma count and add a conversion
 * per B register): it goes into the B operand as f16, scaled per 64-k group by a power
 * of two (below), exactly.
 *
 * The fragments of mma.m16n8k16 .f16 (PTX ISA, "Matrix Fragments for mma.m16n8k16";
 * g = lane / 4, t = lane % 4; f16x2 registers, the lower k in the low half):
 *   A (16 x 16, row): a0 = row g, k 2t, 2t+1; a1 = row g+8, k 2t, 2t+1;
 *                     a2 = row g, k 2t+8, 2t+9; a3 = row g+8, k 2t+8, 2t+9
 *   B (16 x 8, col):  b0 = column g, k 2t, 2t+1; b1 = column g, k 2t+8, 2t+9
 *   C/D (16 x 8 f32): c0, c1 = row g, columns 2t, 2t+1; c2, c3 = row g+8, same columns.
 * Lane (g, t) loads 16 contiguous codes of rows g and g + 8 at k = 64·col + 16t: the quad
 * of lanes of one g covers 64 contiguous k (a "column" of 64). A dot product does not care
 * about the order of k, so those 16 k feed four mma (q = 0..3) whose k slots the lane
 * owns, in the same order for A and B (f8_frag_a, f8_mma_item):
 *   mma q: slots 2t, 2t+1 <- k 16t + 4q, +1;  slots 2t+8, 2t+9 <- k 16t + 4q + 2, +3
 * i.e. code word q of the lane's 16 bytes: its low half converts to a0 / a1, its high
 * half to a2 / a3; token column g's B registers are f16 words 2q and 2q + 1 of the same
 * 16 k of x. 8 tokens per mma (B column g = token 8·nt + g): M <= 16 is at most two mma
 * per A fragment.
 *
 * x in f16, exactly: per 64-k group of each token row, a power of two 2^-e taken from the
 * group's max |x| puts that max in [2^14, 2^15) (f8_group_exp); v = x·2^-e is exact in
 * fp32 (e in [-126, 114]) and in f16 for every element >= 2^-24 of the group max: such a
 * v has |v| >= 2^-10 and 8 significant bits, so its quantum is >= 2^-17 > f16's 2^-24,
 * and |v| < 2^15 < 65504. Smaller elements round at f16's subnormal quantum: an error
 * below 2^-25 against a max >= 2^14, i.e. < 2^-39 of the group max. E4M3 x f16 products
 * (4 + 11 significant bits) are exact in fp32. After each 64-k column (four chained mma)
 * the fp32 partials D are promoted: acc += D · 2^e · scale(row), in registers (lane t
 * holds tokens 2t, 2t + 1 of rows g and g + 8), so the tensor core's own sums stay 64 k
 * long and everything longer is plain fp32.
 *
 * W's scales: a layout with one scale a row over the view's K (per tensor, per row) is
 * applied once per tile, at its end (two scales a lane, loaded when the tile starts); the
 * others (128 x 128 blocks, TP slices of them: COL) per 64-k column, read with __ldg from
 * L1 at the column's start, times the group factor, into the promotion's FFMA.
 *
 * Work split (as gemv.cu): a block (8 warps) owns 16-row tiles (grid-stride over the
 * tiles of all the grouped matrices, the grid sized to what the GPU holds at once) and
 * one K range; its warps split that range into 8 contiguous runs of 64-k columns. When
 * the tiles alone would not give every SM a block (small N), K is also split over the S
 * blocks of a thread block cluster (S = 2, 4, 8), which meet in distributed shared
 * memory; S also grows while x would not fit shared memory. Per warp the (tile, batch of
 * F8_U = 4 columns) items form one flat sequence, walked by two positions (f8_pos: the
 * loads two items ahead of the mma; a tile's matrix, rows and scale rows are worked out
 * once per tile, f8_tile_of); a lane holds two items in registers (2 x 8 loads of 16 B:
 * 8 KB a warp in flight), and each register set is refilled right after its mma, before
 * any barrier of the tile's end. The first item is issued before the kernel waits for its
 * predecessor (programmatic dependent launch, cu_pdl.h), the second right after x's copy
 * was issued, so both stream in while x is staged and converted.
 *
 * x staging (f8_stage_x_issue / _finish): the block's K range of x (BF16, M rows) is
 * copied with cp.async.ca into shared memory (through L1: the two blocks of an SM stage the
 * same x, the second copy hits L1; 4096 x 4096 at M = 8: 13.5 -> 10.7 us against .cg), then
 * converted in place to f16 (same 2 bytes an element) by a quad of lanes a 64-group; token
 * m's row at m·xstride bytes, xstride ≡ 16 (mod 128) so that the 8 lanes of a quarter warp
 * reading B fragments (two token rows, 4 x 16 B each) hit distinct banks; the group
 * factors 2^e as floats xe[col][16] (0 for tokens >= M).
 *
 * Reduction, deterministic (no float atomics; bitwise identical run to run, and a graph
 * replay gives the eager bits): each warp's fp32 partial of a tile goes to shared memory,
 * a thread per output sums the 8 warps in warp order, then (S > 1) cluster rank r sums
 * its share of the outputs over the S ranks in rank order, adds y when accumulating,
 * rounds to BF16 once and stores. A cluster barrier waits for the loads in flight, so when
 * the clusters walk several tiles (2 .. F8_DEFER_TILES) the block keeps each tile's sum in
 * its own slot and the cluster meets once, after the last tile (f8_defer_end; 16384 x 4096
 * at M = 16, S = 2: 42.8 -> 38.5 us).
 *
 * Measured on the H200 (test_fp8_gemm_cuda --bench: back-to-back PDL launches over
 * rotating weight copies, L2 cold; copy bandwidth 4.23 TB/s; per-tensor scales, M = 1):
 * [4096 x 4096] 6.9 - 7.2 us (2.3 - 2.4 TB/s), [16384 x 4096] 21.8 us (3.1 TB/s, 73 %),
 * [12288 x 2048] 10.8 us; 128 x 128 blocks ~0.5 us more. M = 4 / 8 / 16 at [4096 x 4096]:
 * 8.3 / 11.0 / 14.4 us: staging x (M·K per block, redundant over the blocks) is what grows
 * with M.
 *
 * Graph-safe: no allocation, no host synchronisation; the per-kernel shared-memory
 * attribute is set and the occupancy asked once per (device, instance), cached.
 * Invariants: K % 64 == 0; x, W, y 16-byte aligned; one scale per 64-k column and row
 * (cu_fp8_scale_per_64); y must not alias x.
 */
#include "ops/cuda/fp8_gemm.h"
#include "ops/cuda/cu_pdl.h"
#include "ops/cuda/cu_cluster.h"
#include "ops/cuda/cu_util.h"

#include <cooperative_groups.h>
#include <string.h>

namespace cg = cooperative_groups;

#define F8_WARPS 8
#define F8_THREADS (F8_WARPS * 32)
#define F8_U 4                       /* 64-k columns per item and lane: 8 loads of 16 B */
#define F8_MAX_S 8                   /* cluster size (portable limit) */
#define F8_XSMEM_MAX (96 * 1024)     /* bytes of staged x (and group factors) per block */
#define F8_MAX_MATS CU_FP8_GEMV_MAX_MATS
#define F8_DEFER_TILES 16            /* tiles a block may keep for one cluster reduction at the end */

/* ---- device helpers ------------------------------------------------------------- */

/* D += A·B, m16n8k16, f16 in, fp32 accumulate (A row-major, B col-major). */
__device__ __forceinline__ void f8_mma(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* f16x2 <- two E4M3 codes (exact; the lower byte to the low half): one F2FP. */
__device__ __forceinline__ uint32_t f8_e4m3x2_to_f16x2(uint32_t v) {
    uint32_t r;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(r) : "h"((uint16_t)v));
    return r;
}

/* The A fragment of mma q (0..3) of a 64-k column: w0 / w1 = code word q (k 16t + 4q ..
 * 4q + 3) of rows g / g + 8. Its low half (k 4q, 4q+1) takes slots 2t, 2t+1 (a0 / a1),
 * its high half (k 4q+2, 4q+3) slots 2t+8, 2t+9 (a2 / a3): the B side reads the same k
 * for token column g (f16 words 2q, 2q + 1 of the lane's 16 k of x). */
__device__ __forceinline__ void f8_frag_a(uint32_t w0, uint32_t w1, uint32_t (&a)[4]) {
    a[0] = f8_e4m3x2_to_f16x2(w0 & 0xffffu);
    a[1] = f8_e4m3x2_to_f16x2(w1 & 0xffffu);
    a[2] = f8_e4m3x2_to_f16x2(w0 >> 16);
    a[3] = f8_e4m3x2_to_f16x2(w1 >> 16);
}

/* Where lane (g, t)'s B words of token tile nt, block column cl live: token 8nt + g's f16
 * row, k = 64·cl + 16t .. +15 (32 bytes: words 0..7, word p = k 2p, 2p + 1). */
__device__ __forceinline__ int f8_frag_b_off(int nt, int cl, int lane, int xstride) {
    return (8 * nt + (lane >> 2)) * xstride + 128 * cl + 32 * (lane & 3);
}

/* The group exponent from the max |x| bits (a BF16 magnitude, 0..0x7fff, the max over the
 * 64 elements): e = (its biased exponent) - 127 - 14 puts the max in [2^14, 2^15);
 * clamped to >= -126 so that 2^-e and 2^e are normal floats (all-zero and tiny groups:
 * 2^126). */
__device__ __forceinline__ int f8_group_exp(uint32_t maxbits) {
    return max((int)(maxbits >> 7) - 141, -126);
}

/* Eight BF16 x values (K order) times s = 2^-e -> eight f16 (K order): exact for the
 * elements >= 2^-24 of the group max (the top of this file). */
__device__ __forceinline__ uint4 f8_scale_to_f16(uint4 raw, float s) {
    const uint32_t q[4] = {raw.x, raw.y, raw.z, raw.w};
    uint32_t o[4];
#pragma unroll
    for (int p = 0; p < 4; p++) {
        const __half2 v = __floats2half2_rn(__uint_as_float(q[p] << 16) * s, __uint_as_float(q[p] & 0xffff0000u) * s);
        o[p] = *reinterpret_cast<const uint32_t *>(&v);
    }
    return make_uint4(o[0], o[1], o[2], o[3]);
}

/* cp.async of 16 bytes cached in L1 too (.ca): the two blocks an SM holds stage the same x
 * (the same K range), so the second one's copy hits L1 instead of L2. */
__device__ __forceinline__ void f8_cp_async16_ca(void *smem, const void *gmem) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(gmem));
}

/* Staging x, in two steps so that the kernel can put its second weight item in flight in
 * between. f8_stage_x_issue: cp.async of the block's K range of x (columns kcol0 .. kcol0 +
 * ncb, M rows, BF16) into the x tile xs (token m's row at m·xstride bytes). */
__device__ __forceinline__ void f8_stage_x_issue(const bf16 *__restrict__ x, int M, int K, int kcol0, int ncb,
                                                 uint8_t *xs, int xstride) {
    const int per_row = ncb * 8; /* 16-byte chunks a token row: 8 a 64-group */
    int m = 0, c = threadIdx.x;  /* chunk threadIdx.x + i·F8_THREADS = (m, c), stepped without a division */
    while (c >= per_row) c -= per_row, m++;
    for (; m < M;) {
        f8_cp_async16_ca(xs + m * xstride + 16 * c, x + (size_t)m * K + (size_t)kcol0 * 64 + 8 * c);
        c += F8_THREADS;
        while (c >= per_row) c -= per_row, m++;
    }
    cu_cp_async_commit();
}

/* f8_stage_x_finish: wait for the copy, then convert the tile in place to f16 (x·2^-e per
 * 64-group) and write the group factors xe[cl·16 + m] = 2^e (0 for m >= M). A quad of lanes
 * takes a group, each lane 16 elements as two 16-byte words: lane q of group j reads bytes
 * 16q + 64·(j & 1) and 16q + 64·(1 - (j & 1)) of its 128, so that the 8 lanes of a quarter
 * warp (two groups) cover 128 contiguous-modulo-128 bytes: no bank conflict. Warp-uniform
 * trip count (the shuffles see the whole warp). Ends with a block barrier. */
__device__ __forceinline__ void f8_stage_x_finish(int M, int ncb, uint8_t *xs, int xstride, float *xe) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, q = lane & 3;
    for (int i = tid; i < ncb * 16; i += F8_THREADS)
        if ((i & 15) >= M) xe[i] = 0.f;
    cu_cp_async_wait<0>();
    __syncthreads();
    const int ngroups = M * ncb;
    /* group gi = base + lane / 4 = (m, cl), stepped by F8_WARPS·8 groups without a division */
    int m = 0, cl = warp * 8 + (lane >> 2);
    while (cl >= ncb) cl -= ncb, m++;
    for (int base = warp * 8; base < ngroups; base += F8_WARPS * 8) {
        const bool act = m < M;
        const int j = lane >> 2;
        uint8_t *p = xs + m * xstride + 128 * cl + 16 * q;
        uint8_t *p0 = p + 64 * (j & 1), *p1 = p + 64 * (1 - (j & 1));
        uint4 r0 = make_uint4(0, 0, 0, 0), r1 = make_uint4(0, 0, 0, 0);
        if (act) r0 = cu_lds16(p0), r1 = cu_lds16(p1);
        uint32_t mx = __vmaxu2(__vmaxu2(__vmaxu2(r0.x & 0x7fff7fffu, r0.y & 0x7fff7fffu),
                                        __vmaxu2(r0.z & 0x7fff7fffu, r0.w & 0x7fff7fffu)),
                               __vmaxu2(__vmaxu2(r1.x & 0x7fff7fffu, r1.y & 0x7fff7fffu),
                                        __vmaxu2(r1.z & 0x7fff7fffu, r1.w & 0x7fff7fffu)));
        mx = max(mx & 0xffffu, mx >> 16);
        mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const int e = f8_group_exp(mx);
        if (act) {
            const float s = __int_as_float((127 - e) << 23);
            *reinterpret_cast<uint4 *>(p0) = f8_scale_to_f16(r0, s);
            *reinterpret_cast<uint4 *>(p1) = f8_scale_to_f16(r1, s);
            if (q == 0) xe[cl * 16 + m] = __int_as_float((127 + e) << 23);
        }
        cl += F8_WARPS * 8;
        while (cl >= ncb) cl -= ncb, m++;
    }
    __syncthreads();
}

/* Up to F8_MAX_MATS weights of one K behind one x: matrix i owns the global tiles
 * [t_end[i-1], t_end[i]) (t_end[-1] = 0); its codes w[i] [N[i], K], scales fs[i] (the
 * lin_w's fs_br, fs_cols, fs_r0 as br, cols, r0), output y[i] [M, N[i]]. The scale column
 * of 64-k column c is (c + cq[i]) >> csh[i] (COL layouts: fs_bc = 64·2^csh, fs_c0 =
 * 64·cq; csh = -1: fs_bc = 64·cdiv, not a power of two: a division), or the constant cq[i]
 * (one column block: csh[i] = 31). A __grid_constant__ kernel parameter: indexed by a
 * run-time matrix number without a local copy. */
struct f8_mats {
    int n;
    int t_end[F8_MAX_MATS];
    int N[F8_MAX_MATS];
    int br[F8_MAX_MATS], cols[F8_MAX_MATS], r0[F8_MAX_MATS], cq[F8_MAX_MATS], csh[F8_MAX_MATS], cdiv[F8_MAX_MATS];
    const uint8_t *w[F8_MAX_MATS];
    const float *fs[F8_MAX_MATS];
    bf16 *y[F8_MAX_MATS];
};

/* A 16-row tile as one lane sees it: its matrix, first row, and the scale row offsets of
 * rows g and g + 8 (fscale + so0 / so1 is their scale row; -1: past N, rows of zeros).
 * Computed once per tile (two integer divisions), not per item. */
struct f8_tile {
    int i, row0, so0, so1;
};
__device__ __forceinline__ f8_tile f8_tile_of(const f8_mats &ms, int tg, int lane) {
    f8_tile t;
    t.i = 0;
#pragma unroll
    for (int j = 1; j < F8_MAX_MATS; j++) t.i += j < ms.n && tg >= ms.t_end[j - 1];
    t.row0 = (tg - (t.i ? ms.t_end[t.i - 1] : 0)) * 16;
    const int n0 = t.row0 + (lane >> 2), n1 = n0 + 8, N = ms.N[t.i];
    const unsigned br = (unsigned)ms.br[t.i], r0 = (unsigned)ms.r0[t.i], cols = (unsigned)ms.cols[t.i];
    t.so0 = n0 < N ? (int)(((unsigned)n0 + r0) / br * cols) : -1;
    t.so1 = n1 < N ? (int)(((unsigned)n1 + r0) / br * cols) : -1;
    return t;
}

/* The scale column of 64-k column col of matrix i. */
__device__ __forceinline__ int f8_scol(const f8_mats &ms, int i, int col) {
    const int sh = ms.csh[i];
    if (sh == 31) return ms.cq[i];
    return sh >= 0 ? (col + ms.cq[i]) >> sh : (int)((unsigned)(col + ms.cq[i]) / (unsigned)ms.cdiv[i]);
}

/* One item's registers: codes of rows g and g + 8 for F8_U columns. */
struct f8_wregs {
    uint4 a[F8_U], b[F8_U];
};

/* Scales: the COL layouts read the scales of an item's 4 columns with __ldg when the item
 * is multiplied (L1-cached: the weight loads bypass L1 and x is staged through L2 only);
 * prefetching them into L1 with the weights (prefetch.global.L1) measured slower on the
 * H200 (16384 x 4096, 128 x 128 blocks, M = 1: 25.4 -> 22.0 us without). The
 * one-scale-a-row layouts load their two scales once per tile (f8_row_scales) and apply
 * them at its end. */
__device__ __forceinline__ void f8_load(f8_wregs &r, const f8_mats &ms, const f8_tile &tl, int K, int col0,
                                        int col_end, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const uint8_t *w = ms.w[tl.i];
    const uint8_t *p0 = w + (size_t)(tl.row0 + g) * K + 16 * t, *p1 = p0 + (size_t)8 * K;
#pragma unroll
    for (int u = 0; u < F8_U; u++) {
        const bool ok = col0 + u < col_end;
        r.a[u] = make_uint4(0, 0, 0, 0);
        r.b[u] = make_uint4(0, 0, 0, 0);
        if (ok && tl.so0 >= 0) r.a[u] = cu_ld_stream16(p0 + (size_t)(col0 + u) * 64);
        if (ok && tl.so1 >= 0) r.b[u] = cu_ld_stream16(p1 + (size_t)(col0 + u) * 64);
    }
}

/* The one-scale-a-row layouts: the scales of rows g, g + 8 of a tile (0 past N). */
__device__ __forceinline__ float2 f8_row_scales(const f8_mats &ms, const f8_tile &tm) {
    const float *fs = ms.fs[tm.i] + ms.cq[tm.i];
    return make_float2(tm.so0 >= 0 ? __ldg(fs + tm.so0) : 0.f, tm.so1 >= 0 ? __ldg(fs + tm.so1) : 0.f);
}

/* acc[nt][0..3] += (rows g, g + 8) x (tokens 8nt + 2t, 8nt + 2t + 1) over this item's
 * columns (the C fragment's order), times the W scale of each column (COL) or not (the
 * row scale comes at the tile's end). xs / xe: the block's staged x (column 0 of the
 * block at kcol0). */
template <int NT, bool COL>
__device__ __forceinline__ void f8_mma_item(const f8_wregs &r, const f8_mats &ms, const f8_tile &tm,
                                            const uint8_t *xs, int xstride, const float *xe, int M, int col0,
                                            int col_end, int kcol0, int lane, float (&acc)[NT][4]) {
    const int g = lane >> 2, t = lane & 3;
    /* COL: each column's two scales are read at its start (L1 hits after the first tile),
     * their latency under its four mma */
    const float *fs0 = nullptr, *fs1 = nullptr;
    if (COL) fs0 = ms.fs[tm.i] + tm.so0, fs1 = ms.fs[tm.i] + tm.so1;
#pragma unroll
    for (int u = 0; u < F8_U; u++) {
        const int col = col0 + u;
        if (col >= col_end) break; /* warp-uniform */
        const int cl = col - kcol0;
        float sgu = 0.f, sg8u = 0.f;
        if (COL) {
            const int sc = f8_scol(ms, tm.i, col);
            sgu = tm.so0 >= 0 ? __ldg(fs0 + sc) : 0.f;
            sg8u = tm.so1 >= 0 ? __ldg(fs1 + sc) : 0.f;
        }
        const uint32_t w0[4] = {r.a[u].x, r.a[u].y, r.a[u].z, r.a[u].w};
        const uint32_t w1[4] = {r.b[u].x, r.b[u].y, r.b[u].z, r.b[u].w};
        float d[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) d[nt][0] = d[nt][1] = d[nt][2] = d[nt][3] = 0.f;
        /* token column g of each token tile: its 16 k of x (f16) as words 0..7, read in two
         * halves (words 0..3 for mma 0, 1; 4..7 for mma 2, 3: fewer live registers) */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            uint4 xv[NT];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                xv[nt] = make_uint4(0, 0, 0, 0);
                if (8 * nt + g < M) xv[nt] = cu_lds16(xs + f8_frag_b_off(nt, cl, lane, xstride) + 16 * h);
            }
#pragma unroll
            for (int qq = 0; qq < 2; qq++) {
                const int q = 2 * h + qq;
                uint32_t a[4];
                f8_frag_a(w0[q], w1[q], a);
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
                    f8_mma(d[nt], a, qq ? xv[nt].z : xv[nt].x, qq ? xv[nt].w : xv[nt].y);
            }
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const float2 f = *reinterpret_cast<const float2 *>(xe + cl * 16 + 8 * nt + 2 * t);
            if (COL) {
                acc[nt][0] = fmaf(d[nt][0], f.x * sgu, acc[nt][0]);
                acc[nt][1] = fmaf(d[nt][1], f.y * sgu, acc[nt][1]);
                acc[nt][2] = fmaf(d[nt][2], f.x * sg8u, acc[nt][2]);
                acc[nt][3] = fmaf(d[nt][3], f.y * sg8u, acc[nt][3]);
            } else {
                acc[nt][0] = fmaf(d[nt][0], f.x, acc[nt][0]);
                acc[nt][1] = fmaf(d[nt][1], f.y, acc[nt][1]);
                acc[nt][2] = fmaf(d[nt][2], f.x, acc[nt][2]);
                acc[nt][3] = fmaf(d[nt][3], f.y, acc[nt][3]);
            }
        }
    }
}

/* Shared memory (dynamic): red [WARPS][16][TOK] f32 (per-warp partials of one tile), part
 * [P][16][TOK] f32 (the block's sums, read by the cluster; P = 1, or F8_DEFER_TILES for a
 * K split over a cluster: one slot per tile of the block, reduced over the cluster once at
 * the end), xe [8·cw][16] f32 (group factors), then the x tile [M][xstride] bytes. TOK = 8·NT. */
template <int NT>
struct f8_smem {
    static constexpr int tok = 8 * NT;
    static constexpr int red_floats = F8_WARPS * 16 * tok;
    static constexpr int part_floats = 16 * tok;
    __host__ __device__ static size_t xe_off(int slots) { return (size_t)(red_floats + part_floats * slots) * 4; }
};

/* A warp's walk through its block's (tile, batch of F8_U columns) items: tile number ti of
 * the block (global tile blockIdx.y + ti·gridDim.y), batch b of nb, the tile's state. The
 * loads run two items ahead of the mma, each with its own position. */
struct f8_pos {
    int ti, b;
    f8_tile tile;
};
__device__ __forceinline__ void f8_pos_next(f8_pos &p, const f8_mats &ms, int nb, int my_tiles, int lane) {
    if (++p.b < nb) return;
    p.b = 0;
    if (++p.ti < my_tiles) p.tile = f8_tile_of(ms, blockIdx.y + p.ti * gridDim.y, lane);
}

/* The tile of position tm is complete: warp partials (times the row scales rs when the
 * layout has one scale a row) -> block sum -> cluster sum -> y. Block-uniform (every warp
 * has the same items). */
template <int NT, bool COL>
__device__ __forceinline__ void f8_tile_end(float (&acc)[NT][4], float2 rs, float *red, float *part,
                                            const f8_mats &ms, const f8_tile &tm, int M, int accumulate,
                                            int ti, int defer) {
    constexpr int TOK = 8 * NT;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int S = gridDim.x, rank = blockIdx.x;
    cg::cluster_group cl = cg::this_cluster();
    float *rw = red + warp * (16 * TOK);
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        const int c0 = nt * 8 + 2 * t;
        rw[g * TOK + c0] = COL ? acc[nt][0] : acc[nt][0] * rs.x;
        rw[g * TOK + c0 + 1] = COL ? acc[nt][1] : acc[nt][1] * rs.x;
        rw[(g + 8) * TOK + c0] = COL ? acc[nt][2] : acc[nt][2] * rs.y;
        rw[(g + 8) * TOK + c0 + 1] = COL ? acc[nt][3] : acc[nt][3] * rs.y;
        acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    }
    __syncthreads();
    float *pt = part + (defer ? ti : 0) * (16 * TOK);
    for (int o = tid; o < 16 * M; o += F8_THREADS) {
        const int m = o >> 4, r = o & 15;
        float s = 0.f;
#pragma unroll
        for (int q = 0; q < F8_WARPS; q++) s += red[q * (16 * TOK) + r * TOK + m];
        pt[r * TOK + m] = s;
    }
    if (defer) { /* the cluster meets once, after the last tile (f8_defer_end) */
        __syncthreads(); /* red is rewritten by the next tile */
        return;
    }
    if (S > 1) cl.sync();
    else __syncthreads();
    /* outputs o = m·16 + r (consecutive threads -> consecutive n); rank r takes every S-th
     * group of F8_THREADS */
    const int N = ms.N[tm.i];
    bf16 *y = ms.y[tm.i];
    for (int o = rank * F8_THREADS + tid; o < 16 * M; o += S * F8_THREADS) {
        const int m = o >> 4, r = o & 15, n = tm.row0 + r;
        if (n >= N) continue;
        float s = 0.f;
        for (int q = 0; q < S; q++) {
            const float *pq = S > 1 ? cl.map_shared_rank(part, q) : part;
            s += pq[r * TOK + m];
        }
        bf16 *yp = y + (size_t)m * N + n;
        if (accumulate) s += __bfloat162float(*yp);
        *yp = __float2bfloat16_rn(s);
    }
    if (S > 1) cl.sync();
    else __syncthreads();
}

/* The deferred cluster reduction (a K split over S ranks, the block's my_tiles <=
 * F8_DEFER_TILES tiles): one cluster barrier, then every (tile, output) of the block's tiles,
 * dealt over the S ranks' threads, sums the S ranks' partials in rank order, adds y when
 * accumulating, rounds to BF16 once and stores; a last barrier keeps every block's shared
 * memory alive until the others have read it. A cluster barrier waits for the loads in
 * flight (it has release semantics), so meeting once instead of per tile keeps the weight
 * stream going (H200, 16384 x 4096, M = 16: see fp8_make_plan). */
template <int NT>
__device__ __forceinline__ void f8_defer_end(const float *part, const f8_mats &ms, int M, int my_tiles,
                                             int accumulate) {
    constexpr int TOK = 8 * NT;
    const int S = gridDim.x, rank = blockIdx.x;
    cg::cluster_group cl = cg::this_cluster();
    cl.sync();
    const int per_tile = 16 * M;
    for (int o = rank * F8_THREADS + (int)threadIdx.x; o < my_tiles * per_tile; o += S * F8_THREADS) {
        const int ti = o / per_tile, oo = o - ti * per_tile, m = oo >> 4, r = oo & 15;
        const int tg = blockIdx.y + ti * gridDim.y;
        int i = 0;
#pragma unroll
        for (int j = 1; j < F8_MAX_MATS; j++) i += j < ms.n && tg >= ms.t_end[j - 1];
        const int N = ms.N[i], n = (tg - (i ? ms.t_end[i - 1] : 0)) * 16 + r;
        if (n >= N) continue;
        float s = 0.f;
        for (int q = 0; q < S; q++) s += cl.map_shared_rank(part, q)[ti * (16 * TOK) + r * TOK + m];
        bf16 *yp = ms.y[i] + (size_t)m * N + n;
        if (accumulate) s += __bfloat162float(*yp);
        *yp = __float2bfloat16_rn(s);
    }
    cl.sync();
}

/* grid (S, G): blockIdx.x = rank in the cluster of S (the K split), blockIdx.y = first
 * global tile, stride G (T tiles over the matrices of ms). cw = columns (64 k) per warp;
 * the block's columns are [rank·8·cw, (rank+1)·8·cw) ∩ [0, C), C = K / 64; warp w takes
 * kcol0 + w·cw + [0, cw), F8_U columns per item. xstride: bytes between staged x rows.
 * COL: the W scale may change along K (per 64-k column); else one scale a row. defer (S > 1
 * and every block has at most F8_DEFER_TILES tiles): the cluster reduces once at the end. */
template <int NT, bool COL>
__global__ void __launch_bounds__(F8_THREADS, 2)
f8_gemv_kernel(int M, int K, int T, int cw, int xstride, const bf16 *__restrict__ x,
               const __grid_constant__ f8_mats ms, int accumulate, int defer) {
    extern __shared__ __align__(16) unsigned char f8_sm[];
    float *red = reinterpret_cast<float *>(f8_sm);
    float *part = red + f8_smem<NT>::red_floats;
    const size_t xe_off = f8_smem<NT>::xe_off(defer ? F8_DEFER_TILES : 1);
    float *xe = reinterpret_cast<float *>(f8_sm + xe_off);
    uint8_t *xs = f8_sm + xe_off + (size_t)F8_WARPS * cw * 16 * 4;

    /* programmatic dependent launch (cu_pdl.h): the next kernel may be scheduled now; this one
     * reads x and touches y only after the previous grid completed (cu_pdl_wait below); its
     * weights and scales are constants and go in flight before that */
    cu_pdl_trigger();
    const int rank = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int C = K / 64;
    const int kcol0 = rank * F8_WARPS * cw;
    const int cb = kcol0 + warp * cw, ce = min(cb + cw, C); /* this warp's columns (may be empty) */
    const int nb = (cw + F8_U - 1) / F8_U;                   /* batches per tile, same for every warp */
    const int my_tiles = blockIdx.y < T ? (T - 1 - blockIdx.y) / gridDim.y + 1 : 0;
    const int items = my_tiles * nb;

    f8_pos lp = {0, 0, f8_tile_of(ms, blockIdx.y, lane)}; /* the next item to load */
    const f8_pos first = lp;
    f8_wregs r0, r1;
    if (items > 0) {
        f8_load(r0, ms, lp.tile, K, cb + lp.b * F8_U, ce, lane);
        f8_pos_next(lp, ms, nb, my_tiles, lane);
    }
    f8_pos mp = first; /* the next item to multiply */
    float2 rs = make_float2(0.f, 0.f);
    if (!COL && items > 0) rs = f8_row_scales(ms, mp.tile);
    cu_pdl_wait();

    /* x's copy goes first, then the second weight item (the x copy queues behind one item of
     * weights, not two: H200, 4096 x 4096, M = 1: 7.8 -> 7.3 us) */
    const int ncb = min(F8_WARPS * cw, C - kcol0); /* the block's columns inside K */
    if (ncb > 0) f8_stage_x_issue(x, M, K, kcol0, ncb, xs, xstride);
    if (items > 1) {
        f8_load(r1, ms, lp.tile, K, cb + lp.b * F8_U, ce, lane);
        f8_pos_next(lp, ms, nb, my_tiles, lane);
    }
    if (ncb > 0) f8_stage_x_finish(M, ncb, xs, xstride, xe);
    else __syncthreads();

    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;

    /* item it from r0 (r0 then refilled with item it + 2, before any barrier), then item it + 1
     * from r1 (refilled with it + 3) */
    for (int it = 0; it < items; it += 2) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            if (h == 1 && it + 1 >= items) break;
            f8_wregs &r = h ? r1 : r0;
            f8_mma_item<NT, COL>(r, ms, mp.tile, xs, xstride, xe, M, cb + mp.b * F8_U, ce, kcol0, lane, acc);
            if (it + h + 2 < items) {
                f8_load(r, ms, lp.tile, K, cb + lp.b * F8_U, ce, lane);
                f8_pos_next(lp, ms, nb, my_tiles, lane);
            }
            if (mp.b == nb - 1) {
                f8_tile_end<NT, COL>(acc, rs, red, part, ms, mp.tile, M, accumulate, mp.ti, defer);
                f8_pos_next(mp, ms, nb, my_tiles, lane);
                if (!COL && mp.ti < my_tiles) rs = f8_row_scales(ms, mp.tile);
            } else {
                f8_pos_next(mp, ms, nb, my_tiles, lane);
            }
        }
    }
    if (defer) f8_defer_end<NT>(part, ms, M, my_tiles, accumulate);
}

/* ---- small-M host side -------------------------------------------------------------- */

typedef struct f8_plan {
    int nt;          /* n8 token tiles: 1 (M <= 8) or 2 */
    int S;           /* K split over a cluster of S blocks */
    int cw;          /* columns (64 k) per warp */
    int xstride;     /* bytes between staged x rows */
    int slots;       /* part slots in smem: F8_DEFER_TILES when the cluster may reduce once */
    size_t smem;     /* dynamic shared memory, bytes */
} f8_plan;

/* Bytes of staged x (and group factors) for M tokens and cw columns a warp. */
static size_t f8_xbytes(int M, int cw, int *xstride) {
    const int kb = F8_WARPS * cw * 64 * 2;
    *xstride = ((kb + 127) & ~127) + 16; /* ≡ 16 (mod 128): see the top of the file */
    return (size_t)M * *xstride + (size_t)F8_WARPS * cw * 16 * 4;
}

/* red and part (slots: one tile's, or F8_DEFER_TILES under a deferred K split) */
static size_t f8_red_bytes(int nt, int slots) { return (size_t)(F8_WARPS * 16 * 8 * nt + 16 * 8 * nt * slots) * 4; }

/* The split for M tokens, T tiles of K on n_sm SMs; 0, or -1 when K is too long to stage
 * x for this M even over a cluster of F8_MAX_S. The rule of gemv.cu: split K further
 * while the doubled grid still has at most two blocks per SM and every warp keeps at
 * least one column; S also grows while x would not fit. */
static int f8_make_plan(int M, int T, int K, int n_sm, f8_plan *p) {
    p->nt = M <= 8 ? 1 : 2;
    const int C = K / 64;
    for (int S = 1; S <= F8_MAX_S; S *= 2) {
        int cw = (C + S * F8_WARPS - 1) / (S * F8_WARPS), xstride;
        if (cw < 1) cw = 1;
        const size_t xb = f8_xbytes(M, cw, &xstride);
        const int more_fill = (long)T * 2 * S <= 2L * n_sm && C >= S * 2 * F8_WARPS;
        /* a K split whose clusters walk several tiles keeps F8_DEFER_TILES part slots (the
         * cluster reduces once, f8_defer_end): x gets that much less, so that two blocks still
         * fit an SM */
        const int slots = S > 1 && (long)T * S > 2L * n_sm ? F8_DEFER_TILES : 1;
        const size_t xmax = F8_XSMEM_MAX - (f8_red_bytes(p->nt, slots) - f8_red_bytes(p->nt, 1));
        if ((xb > xmax || more_fill) && S < F8_MAX_S) continue;
        if (xb > xmax) return -1;
        p->S = S;
        p->cw = cw;
        p->xstride = xstride;
        p->slots = slots;
        p->smem = f8_red_bytes(p->nt, slots) + xb;
        return 0;
    }
    return -1;
}

/* Per (device, kernel instance): the dynamic shared memory limit raised once; and how many
 * clusters of S blocks (blocks when S = 1) the GPU holds at once, asked once per
 * (device, instance, S, shared memory size) and cached (cu_cluster.cu); < 0 on error. */
template <int NT, bool COL>
static int f8_resident(const f8_plan *p, int n_sm, ls_err *e) {
    return cu_cluster_resident((const void *)f8_gemv_kernel<NT, COL>, F8_THREADS, p->S, p->smem,
                               f8_red_bytes(NT, 1) + F8_XSMEM_MAX, n_sm, "gemm cuda_gemv (fp8)", e);
}

template <int NT, bool COL>
static int f8_launch(int M, int K, const bf16 *x, const f8_mats &ms, int accumulate, const f8_plan *p, int n_sm,
                     cudaStream_t st, ls_err *e) {
    const int T = ms.t_end[ms.n - 1];
    int G = f8_resident<NT, COL>(p, n_sm, e);
    if (G < 0) return G;
    if (G > T) G = T;
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute at[2];
    cu_cluster_config(&cfg, at, p->S, G, F8_THREADS, p->smem, st);
    /* programmatic dependent launch, as gv_launch (a cluster launch needs its own config, so
     * not cu_launch_pdl; the same attribute) */
    at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.numAttrs = 2;
    /* one cluster reduction at the end when the clusters walk 2 .. F8_DEFER_TILES tiles (one
     * tile: the per-tile path, the same barriers) */
    const int per = (T + G - 1) / G, defer = p->slots > 1 && per >= 2 && per <= F8_DEFER_TILES;
    cudaError_t c =
        cudaLaunchKernelEx(&cfg, f8_gemv_kernel<NT, COL>, M, K, T, p->cw, p->xstride, x, ms, accumulate, defer);
    if (c != cudaSuccess) { /* a launch that refuses the attribute: without it */
        (void)cudaGetLastError();
        cfg.numAttrs = 1;
        c = cudaLaunchKernelEx(&cfg, f8_gemv_kernel<NT, COL>, M, K, T, p->cw, p->xstride, x, ms, accumulate, defer);
    }
    CU_TRY(e, c, "gemm cuda_gemv (fp8)");
    return 0;
}

/* ---- checks ------------------------------------------------------------------------- */

static const char *f8_name(const lin_w *w) { return w && w->name ? w->name : "?"; }

int cu_fp8_w_ok(const lin_w *w, char *why, size_t n) {
    if (!w || w->kind != W_FP8) {
        snprintf(why, n, "weight %s is %s, not FP8", f8_name(w), w ? w_kind_name(w->kind) : "?");
        return 0;
    }
    if (w->N < 0 || w->K < 0 || ((size_t)w->N * w->K && !w->data)) {
        snprintf(why, n, "weight %s: bad shape [%d x %d] or no data", f8_name(w), w->N, w->K);
        return 0;
    }
    if (!w->fscale || w->fs_br < 1 || w->fs_bc < 1 || w->fs_cols < 1 || w->fs_r0 < 0 || w->fs_c0 < 0) {
        snprintf(why, n, "weight %s: bad FP8 scale layout (fscale %s, blocks %d x %d, %d columns, view at %d, %d)",
                 f8_name(w), w->fscale ? "set" : "NULL", w->fs_br, w->fs_bc, w->fs_cols, w->fs_r0, w->fs_c0);
        return 0;
    }
    if (w->N > 0 && w->K > 0) {
        const long long last_c = ((long long)w->K - 1 + w->fs_c0) / w->fs_bc;
        const long long last = ((long long)w->N - 1 + w->fs_r0) / w->fs_br * w->fs_cols + last_c;
        if (last_c >= w->fs_cols || (w->fs_n > 0 && last >= (long long)w->fs_n)) {
            snprintf(why, n,
                     "weight %s: FP8 scales do not cover the view (scale column %lld of %d, index %lld of %zu floats)",
                     f8_name(w), last_c, w->fs_cols, last, w->fs_n);
            return 0;
        }
    }
    return 1;
}

int cu_fp8_scale_per_64(const lin_w *w) {
    if (w->K <= 0 || w->fs_c0 / w->fs_bc == (w->K - 1 + w->fs_c0) / w->fs_bc) return 1; /* one column block */
    return w->fs_bc % 64 == 0 && w->fs_c0 % 64 == 0;
}

/* The view's K range lies in one column block of the scales: one scale per row. */
static int f8_one_col_block(const lin_w *w) {
    return w->K <= 0 || w->fs_c0 / w->fs_bc == (w->K - 1 + w->fs_c0) / w->fs_bc;
}

int cu_fp8_gemv_shape_ok(int M, int N, int K, char *why, size_t n) {
    if (M > CU_FP8_GEMV_MAX_M) {
        snprintf(why, n, "small-M kernel: M=%d > %d (cuda_cublaslt is faster there)", M, CU_FP8_GEMV_MAX_M);
        return 0;
    }
    if (K % 64) {
        snprintf(why, n, "K=%d is not a multiple of 64 (the FP8 kernel's 64-column groups)", K);
        return 0;
    }
    f8_plan p;
    if (M > 0 && f8_make_plan(M, (N + 15) / 16, K, 132, &p)) {
        snprintf(why, n, "K=%d too long to stage x for M=%d (%d KB of shared memory per block at most)", K, M,
                 F8_XSMEM_MAX / 1024);
        return 0;
    }
    return 1;
}

int cu_fp8_gemv_check(const gemm_args *a, char *why, size_t n) {
    const lin_w *w = a->w;
    if (!cu_fp8_w_ok(w, why, n)) return 0;
    if (a->dt != ACT_BF16) {
        snprintf(why, n, "activations must be BF16");
        return 0;
    }
    char sub[160];
    if (!cu_fp8_gemv_shape_ok(a->M, w->N, w->K, sub, sizeof sub)) {
        snprintf(why, n, "weight %s: %s", f8_name(w), sub);
        return 0;
    }
    if (((uintptr_t)a->x | (uintptr_t)w->data | (uintptr_t)a->y) & 15) {
        snprintf(why, n, "weight %s: x, W and y must be 16-byte aligned", f8_name(w));
        return 0;
    }
    if (!cu_fp8_scale_per_64(w)) {
        snprintf(why, n,
                 "weight %s: FP8 scale blocks of %d columns from column %d do not give every 64-column group one "
                 "scale",
                 f8_name(w), w->fs_bc, w->fs_c0);
        return 0;
    }
    return 1;
}

static int f8_n_sm(ls_err *e) {
    int dev = 0, n = 0;
    CU_TRY(e, cudaGetDevice(&dev), "cudaGetDevice");
    CU_TRY(e, cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
    return n;
}

int cu_fp8_gemv_run(int n, const gemm_args *a, cudaStream_t st, ls_err *e) {
    if (n < 1 || n > F8_MAX_MATS)
        return errf(e, ERR_INVAL, "gemm cuda_gemv (fp8): %d weights in one launch (1..%d)", n, F8_MAX_MATS);
    char why[256];
    for (int i = 0; i < n; i++) {
        if (!cu_fp8_gemv_check(&a[i], why, sizeof why)) return errf(e, ERR_UNSUPPORTED, "gemm cuda_gemv: %s", why);
        if (a[i].M != a[0].M || a[i].x != a[0].x || a[i].w->K != a[0].w->K || a[i].accumulate != a[0].accumulate)
            return errf(e, ERR_INVAL, "gemm cuda_gemv: grouped weights %s and %s differ in M, x, K or accumulate",
                        f8_name(a[0].w), f8_name(a[i].w));
    }
    f8_mats ms;
    memset(&ms, 0, sizeof ms);
    int T = 0, col = 0;
    for (int i = 0; i < n; i++) {
        const lin_w *w = a[i].w;
        if (w->N <= 0) continue;
        const int k = ms.n++;
        ms.w[k] = (const uint8_t *)w->data;
        ms.fs[k] = w->fscale;
        ms.y[k] = (bf16 *)a[i].y;
        ms.N[k] = w->N;
        ms.br[k] = w->fs_br, ms.cols[k] = w->fs_cols, ms.r0[k] = w->fs_r0;
        if (f8_one_col_block(w)) { /* the view's one scale column */
            ms.csh[k] = 31, ms.cq[k] = w->fs_c0 / w->fs_bc, ms.cdiv[k] = 1;
        } else { /* fs_bc % 64 == 0, fs_c0 % 64 == 0 (cu_fp8_gemv_check) */
            const int bcc = w->fs_bc / 64;
            ms.cq[k] = w->fs_c0 / 64, ms.cdiv[k] = bcc, ms.csh[k] = -1;
            for (int sh = 0; sh < 30; sh++)
                if (bcc == 1 << sh) ms.csh[k] = sh;
        }
        T += (w->N + 15) / 16;
        ms.t_end[k] = T;
        if (!f8_one_col_block(w)) col = 1;
    }
    const int M = a[0].M, K = a[0].w->K;
    if (M <= 0 || ms.n == 0 || K == 0) {
        if (M > 0 && K == 0) /* an empty dot product: y = 0 (+ y) */
            for (int i = 0; i < n; i++)
                if (!a[i].accumulate && a[i].w->N > 0)
                    CU_TRY(e, cudaMemsetAsync(a[i].y, 0, (size_t)M * a[i].w->N * 2, st), "gemm cuda_gemv (fp8)");
        return 0;
    }
    const int n_sm = f8_n_sm(e);
    if (n_sm <= 0) return n_sm < 0 ? n_sm : errf(e, ERR_RUNTIME, "gemm cuda_gemv (fp8): no SM count");
    f8_plan p;
    if (f8_make_plan(M, T, K, n_sm, &p))
        return errf(e, ERR_UNSUPPORTED, "gemm cuda_gemv: weight %s: K=%d too long to stage x for M=%d",
                    f8_name(a[0].w), K, M);
    const bf16 *x = (const bf16 *)a[0].x;
    const int acc = a[0].accumulate;
    switch (p.nt * 2 + col) {
    case 2: return f8_launch<1, false>(M, K, x, ms, acc, &p, n_sm, st, e);
    case 3: return f8_launch<1, true>(M, K, x, ms, acc, &p, n_sm, st, e);
    case 4: return f8_launch<2, false>(M, K, x, ms, acc, &p, n_sm, st, e);
    default: return f8_launch<2, true>(M, K, x, ms, acc, &p, n_sm, st, e);
    }
}

/* ---- dequantize (large M: then a BF16 GEMM) ------------------------------------------ */

/* Column-block walker of one row: the scale index of (row, k) for increasing k without a
 * division per element. */
struct f8_colwalk {
    const float *row;  /* fscale + row block · fs_cols */
    long long next;    /* first k of the next column block */
    int cb, bc;
    __device__ __forceinline__ void init(const float *fs, int n, int k, int br, int bc_, int cols, int r0, int c0) {
        row = fs + (size_t)((unsigned)(n + r0) / (unsigned)br) * (unsigned)cols;
        bc = bc_;
        cb = (int)((unsigned)(k + c0) / (unsigned)bc);
        next = (long long)(cb + 1) * bc - c0;
    }
    __device__ __forceinline__ float at(int k) {
        while (k >= next) cb++, next += bc;
        return row[cb];
    }
};

/* One thread: 16 consecutive codes of one row (chunk c of ceil(K / 16) per row). VEC: K % 16
 * == 0 with 16-byte aligned codes and output (16 B in, 32 B out); else element by element. */
template <bool VEC>
__global__ void f8_dequant_kernel(int N, int K, const uint8_t *__restrict__ w, const float *__restrict__ fs, int br,
                                  int bc, int cols, int r0, int c0, bf16 *__restrict__ out) {
    const int cpr = (K + 15) / 16;
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)N * cpr) return;
    const int n = (int)(i / cpr), k0 = (int)(i - (size_t)n * cpr) * 16;
    f8_colwalk cwk;
    cwk.init(fs, n, k0, br, bc, cols, r0, c0);
    const uint8_t *src = w + (size_t)n * K + k0;
    bf16 *dst = out + (size_t)n * K + k0;
    if (VEC) {
        const uint4 v = cu_ld_stream16(src);
        const uint32_t q[4] = {v.x, v.y, v.z, v.w};
        uint32_t o[8];
#pragma unroll
        for (int p = 0; p < 8; p++) {
            const uint32_t h = f8_e4m3x2_to_f16x2((q[p >> 1] >> (16 * (p & 1))) & 0xffffu);
            const float2 f = __half22float2(*reinterpret_cast<const __half2 *>(&h));
            const float s0 = cwk.at(k0 + 2 * p), s1 = cwk.at(k0 + 2 * p + 1); /* in k order: at() walks forward */
            const __nv_bfloat162 b = __floats2bfloat162_rn(f.x * s0, f.y * s1);
            o[p] = *reinterpret_cast<const uint32_t *>(&b);
        }
        reinterpret_cast<uint4 *>(dst)[0] = make_uint4(o[0], o[1], o[2], o[3]);
        reinterpret_cast<uint4 *>(dst)[1] = make_uint4(o[4], o[5], o[6], o[7]);
    } else {
        for (int j = 0; j < 16 && k0 + j < K; j++)
            dst[j] = __float2bfloat16_rn(cu_e4m3_to_f32(src[j]) * cwk.at(k0 + j));
    }
}

int cu_fp8_dequant(const lin_w *w, void *out, cudaStream_t st, ls_err *e) {
    char why[256];
    if (!cu_fp8_w_ok(w, why, sizeof why)) return errf(e, ERR_INVAL, "fp8 dequant: %s", why);
    if (w->N <= 0 || w->K <= 0) return 0;
    const size_t n = (size_t)w->N * ((w->K + 15) / 16);
    const unsigned blocks = (unsigned)((n + 255) / 256);
    const int vec = w->K % 16 == 0 && !(((uintptr_t)w->data | (uintptr_t)out) & 15);
    if (vec)
        f8_dequant_kernel<true><<<blocks, 256, 0, st>>>(w->N, w->K, (const uint8_t *)w->data, w->fscale, w->fs_br,
                                                        w->fs_bc, w->fs_cols, w->fs_r0, w->fs_c0, (bf16 *)out);
    else
        f8_dequant_kernel<false><<<blocks, 256, 0, st>>>(w->N, w->K, (const uint8_t *)w->data, w->fscale, w->fs_br,
                                                         w->fs_bc, w->fs_cols, w->fs_r0, w->fs_c0, (bf16 *)out);
    CU_LAUNCHED(e, "fp8 dequant");
    return 0;
}

/* ---- the reference ------------------------------------------------------------------ */

/* grid (ceil(M/32), ceil(N/8)): lane = token, threadIdx.y = weight row. Weight and scale
 * reads are warp-uniform (broadcast); each token row streams through L1. */
__global__ void f8_ref_kernel(int M, int N, int K, const bf16 *__restrict__ x, const uint8_t *__restrict__ w,
                              const float *__restrict__ fs, int br, int bc, int cols, int r0, int c0,
                              bf16 *__restrict__ y, int accumulate) {
    const int m = blockIdx.x * 32 + threadIdx.x;
    const int n = blockIdx.y * 8 + threadIdx.y;
    if (n >= N) return;
    const uint8_t *wr = w + (size_t)n * K;
    const bf16 *xr = x + (size_t)(m < M ? m : 0) * K;
    f8_colwalk cwk;
    cwk.init(fs, n, 0, br, bc, cols, r0, c0);
    float acc = 0.f;
    for (int k = 0; k < K; k++) acc = fmaf(cu_e4m3_to_f32(wr[k]) * cwk.at(k), __bfloat162float(xr[k]), acc);
    if (m >= M) return;
    const size_t o = (size_t)m * N + n;
    if (accumulate) acc += __bfloat162float(y[o]);
    y[o] = __float2bfloat16_rn(acc);
}

int cu_fp8_ref_run(const gemm_args *a, cudaStream_t st, ls_err *e) {
    char why[256];
    if (!cu_fp8_w_ok(a->w, why, sizeof why)) return errf(e, ERR_UNSUPPORTED, "gemm cuda_ref: %s", why);
    if (a->dt != ACT_BF16) return errf(e, ERR_UNSUPPORTED, "gemm cuda_ref: activations must be BF16");
    const lin_w *w = a->w;
    if (a->M <= 0 || w->N <= 0) return 0;
    dim3 grid((a->M + 31) / 32, (w->N + 7) / 8), block(32, 8);
    if (grid.y > 65535) return errf(e, ERR_UNSUPPORTED, "gemm cuda_ref: N=%d too large", w->N);
    f8_ref_kernel<<<grid, block, 0, st>>>(a->M, w->N, w->K, (const bf16 *)a->x, (const uint8_t *)w->data, w->fscale,
                                          w->fs_br, w->fs_bc, w->fs_cols, w->fs_r0, w->fs_c0, (bf16 *)a->y,
                                          a->accumulate);
    CU_LAUNCHED(e, "gemm cuda_ref (fp8)");
    return 0;
}
