/* moe_grouped.cu: the moe family's grouped-GEMM backend on CUDA, cuda_grouped_gemm
 * (reference/qwen35-and-nvfp4.md 2.5), for large batches:
 *   p = softmax(x·W_routerᵀ) over E (fp32), top-k (ties: lower index), renormalised
 *   y = Σ_j w_j · down_e(silu(gate_e(x)) · up_e(x)) + sigmoid(x·w_sg) · shared(x)
 * x, y BF16 [M, H]; router and shared-expert gate BF16; experts NVFP4 (ModelOpt)
 * or BF16 (all of a layer's routed experts the same kind), the shared expert
 * NVFP4 or BF16 on its own (ModelOpt may exclude `*.mlp.shared_expert.*`; synth
 * does): then each GEMM is two launches, the routed tiles with their loader and
 * the shared expert's tiles (the last ones of the plan) with its own.
 *
 * Everything stays on the device (no host round trip, no allocation after the
 * first call of a given size), six launches:
 *   1 router     logits [M, E] fp32 = x·W_routerᵀ through cuBLASLt (cu_lt_gemm)
 *   2 top-k      warp per token: softmax, top-k, renormalise, shared gate
 *                -> idx [M, k], wts [M, k+1] (slot k: the shared expert's weight,
 *                   sigmoid(x·w_sg), 1 without a gate, 0 without a shared expert)
 *   3 plan       histogram of the (token, j) pairs per expert (the
 *                shared expert is expert E, picked by every token), counts padded
 *                to the tile height BM, prefix sum -> row offsets, the tile table
 *                (tile t of BM rows belongs to expert tile_e[t]), and the scatter:
 *                perm[row] = pair p = m·(k+1) + j, or -1 on padding rows; by two
 *                launches over the whole GPU (mg_plan_count_kernel, mg_plan_place_kernel:
 *                a stable counting sort, LASTSTAND_MG_PLAN) or, on the mid path,
 *                one block (mg_plan_kernel)
 *   4 gate/up    grouped GEMM, CTA = one tile (BM rows of one expert) x 128 gate
 *                rows + the same 128 up rows of that expert; A rows gathered from x by
 *                perm; epilogue h = silu(g·s2g)·(u·s2u) -> hbuf [R, ldh] bf16
 *   5 down       grouped GEMM, CTA = one tile x 256 output rows; A = hbuf rows;
 *                epilogue (acc · s2d · wts[p]) -> dbuf [M·(k+1), H] bf16 at the pair
 *   6 combine    y[m] = Σ_j dbuf[m·(k+1) + j] in fp32 (fixed order: deterministic)
 * Grids are sized from an upper bound of the tile count (ceil(pairs/BM) plus one
 * per expert that can be non-empty); CTAs past the real count (read on the device)
 * exit at once. So a call is CUDA-graph capturable once its workspace exists.
 *
 * The GEMM (both launches): 256 threads, a multi-stage cp.async pipeline into
 * dynamic shared memory, BK = 64, mma.sync m16n8k16 BF16 -> fp32; the 8 warps
 * lie along N (32 weight rows each), CTA tile BM x 256 weight rows with the
 * tile height BM = 16, 32 or 64 picked from the routed experts' average row
 * count (one tile per expert where possible, else the least padding work;
 * LASTSTAND_GROUPED_BM=16|32|64 forces one), 6 stages at BM <= 32 (weight
 * streaming wants bytes in flight), 4 at BM = 64. Tokens are the A operand
 * (row-major [rows, K]), weights the B operand ([N, K] row-major = K x N
 * column-major). Lane (g = lane/4, t = lane%4) owns, in each 64-wide K block,
 * the 16 contiguous k = 16t..16t+15: for k-step q the mma's k slots
 * {2t, 2t+1, 2t+8, 2t+9} stand for k = 16t + 4q + {0, 1, 2, 3} on both A and B
 * (a dot product does not care how k is numbered, as long as A and B agree).
 * So a lane's B fragments for one weight row are 8 bytes of E2M1 codes and one
 * E4M3 block scale, decoded in registers (cu_e2m1x8_to_bf16x8, exact times the
 * scale in bf16); scale2 is applied in fp32 in the epilogue.
 * Three weight loaders: NVFP4 by cp.async (K multiple of 64, 16-byte aligned
 * codes, 4-byte aligned scales: every real checkpoint), NVFP4 by plain loads
 * for the small fixtures (any K multiple of 16, any alignment), and BF16 by
 * cp.async (the B fragments read straight from shared memory, like A; 3 stages,
 * 138 KB of shared memory at BM = 64). A always uses cp.async (x rows 16-byte
 * aligned, H multiple of 8).
 *
 * Batched decode (M = 16..256: 1-2 real rows per 16-row tile, the GEMMs are weight-streaming
 * GEMVs per expert, bound by the integer pipe that decodes NVFP4). By default (mg_knobs, each
 * switchable by an environment variable): at BM = 16 and 32 the NVFP4 decode is by bit placement
 * (nvfp4.cuh's nv4_e2m1x8_place: half of the decode on the FMA pipe, the block scale x 2^118
 * by one BF16 multiply per pair, 2^8 folded into scale2, A permuted to the decode's (i, i + 4)
 * pairing) with each thread's load addresses made once per CTA (-33% GEMM instructions);
 * and a shared expert of another kind (BF16 next to NVFP4) runs on a high-priority side
 * stream beside the routed GEMMs (fork after the plan, join before the combine, by events:
 * capturable) instead of after them with its 4-16 CTAs alone on the GPU. Opt-in: 3 CTAs
 * per SM at BM = 16, an L2 prefetch hint on the codes' cp.async.
 *
 * Prefill chunks (64-row tiles) of NVFP4 experts on Hopper: moe_wgmma.cu's warpgroup-MMA
 * kernels (LASTSTAND_MG_WGMMA, mg_knobs) replace mg_gemm_kernel for launches 4 and 5: the
 * weights decoded once per CTA into a swizzled BF16 tile in shared memory, wgmma m64n128k16.
 *
 * The mid-batch path (LASTSTAND_MG_MID, mg_knobs; 16-row tiles, bench/RESULTS.md "MoE at 9..64
 * tokens"): at 1-4 rows per expert the GEMMs are GEMVs per expert, so the same plan and tiles
 * are run by GEMV kernels instead (moe_mid.cu: mv_kernel, mvd_kernel, mvb_kernel for the BF16
 * shared expert, and the router by mr_kernel), with the top-k by a block per token, the combine
 * with its loads in flight, and every launch after the router with programmatic dependent launch.
 * Same outputs, same determinism.
 *
 * Workspace: per device (cu_ws.h), grown on first use and never shrunk; superseded
 * buffers are kept (not freed) so that a CUDA graph captured with them stays valid. The
 * expert pointer table (64 B per expert) lives in device memory, cached per
 * moe_w and uploaded only when it changes. Calls on one device are serialised
 * by its mutex.
 *
 * The routing (launches 2 and 3: the top-k and plan kernels, their launchers, the test hooks
 * but cuda_mg_route_force) is in moe_route.cu; what both files share in moe_grouped_int.cuh.
 */
#include "ops/cuda/cu_pdl.h"
#include "ops/cuda/cu_util.h"
#include "ops/cuda/cu_ws.h"
#include "ops/cuda/moe_grouped_int.cuh"
#include "ops/cuda/moe_grouped_test.h"
#include "ops/cuda/moe_int.cuh"
#include "ops/cuda/moe_wgmma.cuh"
#include "ops/cuda/nvfp4.cuh"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

enum { MG_BK = 64, MG_THREADS = 256, MG_APAD = MG_BK + 8 };

/* ---- per-device workspace (mg_ws: moe_grouped_int.cuh) ------------------------- */

static mg_ws g_mg[CU_WS_MAX_DEV];

/* This device's workspace, locked (calls on one device are serialised). */
int mg_lock(mg_ws **out, ls_err *e) {
    int dev = 0, rc = cu_ws_device("cuda_grouped_gemm", &dev, e);
    if (rc) return rc;
    cu_ws_lock(&g_mg[dev].ws);
    *out = &g_mg[dev];
    return 0;
}

/* ---- small device helpers (the routing's warp and bf16 helpers: moe_int.cuh) -------- */

__device__ __forceinline__ uint32_t mg_pack_bf2(float a, float b) {
    __nv_bfloat162 r = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t *>(&r);
}

/* cp.async of 16 (or 4) bytes; src_size 0 when !valid zero-fills the destination. */
__device__ __forceinline__ void mg_cp16(void *smem, const void *g, bool valid) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g), "r"(n));
}
/* mg_cp16 with an L2 prefetch hint of pf = 64, 128 or 256 bytes (else none); pf is
 * uniform across the grid (a kernel argument), so the branch costs nothing */
__device__ __forceinline__ void mg_cp16_pf(void *smem, const void *g, bool valid, int pf) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    int n = valid ? 16 : 0;
    if (pf == 256)
        asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g), "r"(n));
    else if (pf == 128)
        asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g), "r"(n));
    else if (pf == 64)
        asm volatile("cp.async.cg.shared.global.L2::64B [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g), "r"(n));
    else
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(g), "r"(n));
}
__device__ __forceinline__ void mg_cp4(void *smem, const void *g, bool valid) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    int n = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(g), "r"(n));
}
__device__ __forceinline__ void mg_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void mg_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* ---- 2, 3: top-k and plan: moe_route.cu ---------------------------------------- */

/* ---- 4, 5: the grouped GEMM ------------------------------------------------------ */

/* Weight loaders: NVFP4 by cp.async (K % 64 == 0, codes 16-byte and scales
 * 4-byte aligned), NVFP4 by plain loads (any K % 16 == 0, any alignment), BF16
 * by cp.async (K % 8 == 0, 16-byte aligned rows). */
enum { MG_LD_FP4 = 0, MG_LD_FP4_PLAIN = 1, MG_LD_BF16 = 2 };

/* Tile geometry per tile height BM (rows of one expert per CTA) and loader LD:
 * the 8 warps all lie along N, each owning 4 n8 tiles (32 weight rows; gate/up:
 * 16 gate rows and the same 16 up rows) for all BM rows, so every weight
 * fragment is decoded once per CTA and feeds BM/16 mma; BNW = 256 weight rows
 * per CTA (each A tile is re-read by few CTAs):
 *   BM = 64: 4 m16 tiles per warp, 4 stages
 *   BM = 32: 2 m16 tiles per warp, 6 stages
 *   BM = 16: 1 m16 tile per warp, 6 stages (decode and mid batches stream
 *            weights: more bytes in flight)
 * BF16 weights take 3 stages (their B tiles are 4.5x larger). */
template <int BM, int LD>
struct mg_geo {
    static constexpr int WM = 1;                     /* warps along M */
    static constexpr int WN = 8 / WM;                /* warps along N */
    static constexpr int MT = BM / (16 * WM);        /* m16 tiles per warp */
    static constexpr int NT = 4;                     /* n8 tiles per warp (half gate, half up) */
    static constexpr int BNW = WN * NT * 8;          /* weight rows per CTA tile */
    static constexpr int ST = LD == MG_LD_BF16 ? 3 : BM >= 64 ? 4 : 6; /* pipeline stages */
};

template <int BM, int LD>
struct mg_smem { /* NVFP4 */
    typedef mg_geo<BM, LD> G;
    bf16 a[G::ST][BM][MG_APAD];                 /* A rows, k0..k0+63 (+8 pad: conflict-free 16 B reads) */
    uint8_t b[G::ST][G::BNW][MG_BK / 2];        /* weight rows' E2M1 codes for k0..k0+63 */
    uint8_t s[G::ST][G::BNW][MG_BK / 16];       /* their 4 block scales */
    int pair[BM];                               /* perm of the tile's rows (-1: padding) */
};
template <int BM>
struct mg_smem<BM, MG_LD_BF16> {
    typedef mg_geo<BM, MG_LD_BF16> G;
    bf16 a[G::ST][BM][MG_APAD];
    bf16 b[G::ST][G::BNW][MG_APAD];             /* weight rows, k0..k0+63, padded as A */
    int pair[BM];
};

/* Grouped GEMM over the tiles of the plan (blockIdx.y = tile of BM rows, one
 * expert). GATEUP: A = x rows gathered by token (K = H); CTA weight rows
 * 0..BNW/2-1 = gate rows n0.., BNW/2..BNW-1 = up rows n0.. (n0 = blockIdx.x ·
 * BNW/2); out hbuf [R, ldh] = silu(gate·s2g)·(up·s2u). Else (down): A = hbuf
 * rows (K = I_e), weight rows = down rows n0..n0+BNW-1 (n0 = blockIdx.x · BNW);
 * out dbuf [pair, H] = wts[pair] · s2d · down. LD: the weight loader (MG_LD_*).
 * Shared memory is dynamic: sizeof(mg_smem<BM, LD>). */
template <bool GATEUP, int LD, int BM, int PLACE>
__global__ void __launch_bounds__(MG_THREADS, PLACE == 2 ? 3 : 2)
    mg_gemm_kernel(const mg_expert *__restrict__ tab, const int32_t *__restrict__ tile_e,
                   const int32_t *__restrict__ perm, const int32_t *__restrict__ n_tiles, int H, int k,
                   const bf16 *__restrict__ x, bf16 *__restrict__ hbuf, int ldh, const float *__restrict__ wts,
                   bf16 *__restrict__ dbuf, int sh_only, int pf) {
    typedef mg_geo<BM, LD> G;
    constexpr int BNW = G::BNW, HALF = BNW / 2, MT = G::MT, NT = G::NT, NH = NT / 2, ST = G::ST;
    extern __shared__ __align__(16) unsigned char mg_dsm[];
    mg_smem<BM, LD> &sm = *reinterpret_cast<mg_smem<BM, LD> *>(mg_dsm);
    /* sh_only: blockIdx.y counts the shared expert's tiles only (n_tiles[1] on) */
    const int tile = blockIdx.y + (sh_only ? n_tiles[1] : 0);
    if (tile >= n_tiles[0]) return;
    const int ex = tile_e[tile];
    const mg_expert *xp = &tab[ex];
    const int I = xp->inter;
    const int N = GATEUP ? I : H;      /* output columns of this GEMM */
    const int K = GATEUP ? H : I;
    const int n0 = blockIdx.x * (GATEUP ? HALF : BNW);
    if (n0 >= N) return;
    const int r0 = tile * BM;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int wm = warp % G::WM, wn = warp / G::WM;
    if (tid < BM) sm.pair[tid] = perm[r0 + tid];
    __syncthreads();

    const uint8_t *w0 = GATEUP ? xp->w[0] : xp->w[2], *w1 = xp->w[1];
    const uint8_t *s0 = GATEUP ? xp->s[0] : xp->s[2], *s1 = xp->s[1];
    const size_t ldw = (size_t)K / 2, lds = (size_t)K / 16; /* bytes per weight row: codes, scales */
    const int nk = (K + MG_BK - 1) / MG_BK;

    /* PLACE (BM <= 32, NVFP4 cp.async loader): every thread's sources are fixed
     * for the whole K loop (at most one A chunk, two code chunks, one or two scale
     * words), so their addresses (the token's row: a division by k + 1) are made
     * once here, not per k block on the integer pipe that the decode saturates */
    static_assert(!PLACE || (BM * 8 <= MG_THREADS && BNW * 2 == 2 * MG_THREADS), "PLACE: fixed sources");
    const bf16 *pa_src = x;
    int pa_ok = 0;
    const uint8_t *pb_src[2] = {w0, w0}, *ps_src[2] = {s0, s0};
    int pb_ok[2] = {0, 0};
    if constexpr (PLACE) {
        if (tid < BM * 8) {
            const int row = tid >> 3, p = sm.pair[row];
            pa_ok = p >= 0;
            if (pa_ok)
                pa_src = (GATEUP ? x + (size_t)(p / (k + 1)) * H : hbuf + (size_t)(r0 + row) * ldh) + (tid & 7) * 8;
        }
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int row = (tid + i * MG_THREADS) >> 1, half = tid & 1;
            const bool up = GATEUP && row >= HALF;
            const int n = n0 + (up ? row - HALF : row);
            pb_ok[i] = n < N;
            if (pb_ok[i]) {
                pb_src[i] = (up ? w1 : w0) + (size_t)n * ldw + half * 16;
                ps_src[i] = (up ? s1 : s0) + (size_t)n * lds;
            }
        }
    }

    /* stage st <- k block k0: A BM rows x 64 k (BM·8 chunks of 16 B), codes BNW
     * rows x 32 B (BNW·2 chunks of 16 B), scales BNW rows x 4 B */
    auto load = [&](int st, int k0) {
        if constexpr (PLACE) {
            if (tid < BM * 8) {
                const bool ok = pa_ok && k0 + (tid & 7) * 8 < K;
                mg_cp16(&sm.a[st][tid >> 3][(tid & 7) * 8], ok ? pa_src + k0 : x, ok);
            }
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int row = (tid + i * MG_THREADS) >> 1, half = tid & 1;
                const bool ok = pb_ok[i] && k0 + half * 32 < K;
                mg_cp16_pf(&sm.b[st][row][half * 16], ok ? pb_src[i] + k0 / 2 : w0, ok, pf);
                if (half == 0) mg_cp4(&sm.s[st][row][0], pb_ok[i] ? ps_src[i] + k0 / 16 : s0, pb_ok[i]);
            }
        } else {
#pragma unroll
            for (int c = tid; c < BM * 8; c += MG_THREADS) {
                const int row = c >> 3, kk = k0 + (c & 7) * 8;
                const int p = sm.pair[row];
                const bool ok = p >= 0 && kk < K;
                const bf16 *src = x;
                if (ok) src = GATEUP ? x + (size_t)(p / (k + 1)) * H + kk : hbuf + (size_t)(r0 + row) * ldh + kk;
                mg_cp16(&sm.a[st][row][(c & 7) * 8], src, ok);
            }
#pragma unroll
            for (int c = tid; c < BNW * 2; c += MG_THREADS) {
                const int row = c >> 1, half = c & 1;
                const bool up = GATEUP && row >= HALF;
                const int n = n0 + (up ? row - HALF : row);
                const uint8_t *wb = up ? w1 : w0, *sb = up ? s1 : s0;
                const bool nok = n < N;
                if constexpr (LD == MG_LD_BF16) {
                    /* row of K bf16: 8 chunks of 16 B per 64 k; this thread takes chunks half, half+2, .. */
#pragma unroll
                    for (int q = half; q < 8; q += 2) {
                        const int kk = k0 + q * 8;
                        const bool ok = nok && kk < K;
                        mg_cp16(&sm.b[st][row][q * 8], ok ? wb + ((size_t)n * K + kk) * 2 : w0, ok);
                    }
                } else if constexpr (LD == MG_LD_FP4) {
                    const bool ok = nok && k0 + half * 32 < K;
                    mg_cp16_pf(&sm.b[st][row][half * 16], ok ? wb + (size_t)n * ldw + k0 / 2 + half * 16 : w0, ok,
                               pf);
                    if (half == 0) mg_cp4(&sm.s[st][row][0], nok ? sb + (size_t)n * lds + k0 / 16 : s0, nok);
                } else {
                    /* plain loads, zero past the end of K (K % 16 == 0) */
#pragma unroll 4
                    for (int i = 0; i < 16; i++) {
                        const int kb = k0 + half * 32 + 2 * i; /* k of the byte's low nibble */
                        sm.b[st][row][half * 16 + i] =
                            (nok && kb < K) ? wb[(size_t)n * ldw + kb / 2] : (uint8_t)0;
                    }
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        const int kb = k0 + (half * 2 + i) * 16;
                        sm.s[st][row][half * 2 + i] =
                            (nok && kb < K) ? sb[(size_t)n * lds + kb / 16] : (uint8_t)0;
                    }
                }
            }
        }
    };

    /* CTA weight row of this warp's n8 tile j: gate/up: j < NH gate cols
     * wn·NH·8 + 8j, j >= NH the same up cols (rows HALF + ...); down: cols
     * wn·NT·8 + 8j */
    int brow[NT];
#pragma unroll
    for (int j = 0; j < NT; j++)
        brow[j] = GATEUP ? (j / NH) * HALF + wn * NH * 8 + (j % NH) * 8 : wn * NT * 8 + j * 8;

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[i][j][r] = 0.f;

#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < nk) load(s, s * MG_BK);
        mg_cp_commit();
    }
    for (int kt = 0; kt < nk; kt++) {
        mg_cp_wait<ST - 2>();
        __syncthreads(); /* stage kt landed for all; stage kt-1 consumed by all */
        if (kt + ST - 1 < nk) load((kt + ST - 1) % ST, (kt + ST - 1) * MG_BK);
        mg_cp_commit();
        const int st = kt % ST;
        /* B: weight row brow[j] + g, k = 16t..16t+15 -> bf[j][0..7] (register r = the pair
         * k 16t+2r, 16t+2r+1), decoded once and used by every m16 tile */
        uint32_t bf[NT][8];
#pragma unroll
        for (int j = 0; j < NT; j++) {
            if constexpr (LD == MG_LD_BF16) {
                const uint4 *pw = reinterpret_cast<const uint4 *>(&sm.b[st][brow[j] + g][16 * t]);
                const uint4 v0 = pw[0], v1 = pw[1];
                bf[j][0] = v0.x; bf[j][1] = v0.y; bf[j][2] = v0.z; bf[j][3] = v0.w;
                bf[j][4] = v1.x; bf[j][5] = v1.y; bf[j][6] = v1.z; bf[j][7] = v1.w;
            } else if constexpr (PLACE) {
                /* bit placement (nvfp4.cuh): register r = the pair (k 16t + 8(r/4) + r%4,
                 * the same + 4) as e2m1·2^-126, times the block scale·2^118 (exact) */
                const uint2 cw = *reinterpret_cast<const uint2 *>(&sm.b[st][brow[j] + g][8 * t]);
                const float sf = cu_e4m3_to_f32(sm.s[st][brow[j] + g][t]) * 0x1p118f;
                const uint32_t sc = mg_pack_bf2(sf, sf);
                nv4_e2m1x8_place(cw.x, &bf[j][0]);
                nv4_e2m1x8_place(cw.y, &bf[j][4]);
#pragma unroll
                for (int r = 0; r < 8; r++) bf[j][r] = cu_bf16x2_mul(bf[j][r], sc);
            } else {
                const uint2 cw = *reinterpret_cast<const uint2 *>(&sm.b[st][brow[j] + g][8 * t]);
                const uint32_t sc = cu_scale_bf16x2(sm.s[st][brow[j] + g][t]);
                cu_e2m1x8_to_bf16x8(cw.x, &bf[j][0]);
                cu_e2m1x8_to_bf16x8(cw.y, &bf[j][4]);
#pragma unroll
                for (int r = 0; r < 8; r++) bf[j][r] = cu_bf16x2_mul(bf[j][r], sc);
            }
        }
#pragma unroll
        for (int i = 0; i < MT; i++) {
            /* A: rows ra = wm·MT·16 + 16i + g and ra + 8, k = 16t..16t+15 -> xa / xb[0..7] (pairs as B) */
            const int ra = wm * MT * 16 + i * 16 + g;
            const uint4 *pa = reinterpret_cast<const uint4 *>(&sm.a[st][ra][16 * t]);
            const uint4 *pb = reinterpret_cast<const uint4 *>(&sm.a[st][ra + 8][16 * t]);
            uint4 a0 = pa[0], a1 = pa[1], b0 = pb[0], b1 = pb[1];
            if constexpr (PLACE && LD != MG_LD_BF16) { /* A in the decode's (i, i + 4) pairing */
                a0 = nv4_xperm8(a0);
                a1 = nv4_xperm8(a1);
                b0 = nv4_xperm8(b0);
                b1 = nv4_xperm8(b1);
            }
            const uint32_t xa[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
            const uint32_t xb[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
            for (int q = 0; q < 4; q++) {
                /* mma k slots (2t, 2t+1 | 2t+8, 2t+9) = k 16t+4q+(0, 1 | 2, 3) */
                const uint32_t af[4] = {xa[2 * q], xb[2 * q], xa[2 * q + 1], xb[2 * q + 1]};
#pragma unroll
                for (int j = 0; j < NT; j++) cu_mma_bf16_16816(acc[i][j], af, bf[j][2 * q], bf[j][2 * q + 1]);
            }
        }
    }

    /* epilogue: acc[i][j] = C of rows wm·MT·16 + 16i + (g | g+8), cols 2t, 2t+1 of tile j */
    if (GATEUP) {
        /* PLACE: the decoded weights carry 2^-8 */
        const float s2g = xp->s2[0] * (PLACE ? 256.f : 1.f), s2u = xp->s2[1] * (PLACE ? 256.f : 1.f);
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = wm * MT * 16 + i * 16 + g + 8 * h;
                if (sm.pair[row] < 0) continue;
#pragma unroll
                for (int jj = 0; jj < NH; jj++) {
                    const int col = n0 + wn * NH * 8 + jj * 8 + 2 * t;
                    if (col >= N) continue;
                    const float g0 = acc[i][jj][2 * h] * s2g, g1 = acc[i][jj][2 * h + 1] * s2g;
                    const float u0 = acc[i][jj + NH][2 * h] * s2u, u1 = acc[i][jj + NH][2 * h + 1] * s2u;
                    const float h0 = g0 / (1.f + __expf(-g0)) * u0, h1 = g1 / (1.f + __expf(-g1)) * u1;
                    *reinterpret_cast<uint32_t *>(hbuf + (size_t)(r0 + row) * ldh + col) = mg_pack_bf2(h0, h1);
                }
            }
    } else {
        const float s2d = xp->s2[2] * (PLACE ? 256.f : 1.f);
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = wm * MT * 16 + i * 16 + g + 8 * h;
                const int p = sm.pair[row];
                if (p < 0) continue;
                const float c = s2d * wts[p];
#pragma unroll
                for (int j = 0; j < NT; j++) {
                    const int col = n0 + wn * NT * 8 + j * 8 + 2 * t;
                    if (col >= N) continue;
                    *reinterpret_cast<uint32_t *>(dbuf + (size_t)p * H + col) =
                        mg_pack_bf2(acc[i][j][2 * h] * c, acc[i][j][2 * h + 1] * c);
                }
            }
    }
}

/* Launch one instantiation; its dynamic shared memory limit is raised once per
 * device (the attribute belongs to the function on the current device). */
template <bool GATEUP, int LD, int BM, int PLACE>
static cudaError_t mg_gemm_launch1(dim3 grid, const mg_expert *tab, const int32_t *tile_e, const int32_t *perm,
                                   const int32_t *nt, int H, int k, const bf16 *x, bf16 *hbuf, int ldh,
                                   const float *wts, bf16 *dbuf, int sh_only, int pf, cudaStream_t st) {
    const size_t smem = sizeof(mg_smem<BM, LD>);
    static unsigned raised; /* bit per device ordinal (< CU_WS_MAX_DEV) */
    int dev = 0;
    cudaError_t c = cudaGetDevice(&dev);
    if (c != cudaSuccess) return c;
    if (smem > 48 * 1024 && !(__atomic_load_n(&raised, __ATOMIC_ACQUIRE) >> dev & 1u)) {
        c = cudaFuncSetAttribute(mg_gemm_kernel<GATEUP, LD, BM, PLACE>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem);
        if (c != cudaSuccess) return c;
        if (PLACE == 2) /* all of the SM's unified memory as shared memory: room for 3 CTAs */
            c = cudaFuncSetAttribute(mg_gemm_kernel<GATEUP, LD, BM, PLACE>,
                                     cudaFuncAttributePreferredSharedMemoryCarveout, 100);
        if (c != cudaSuccess) return c;
        __atomic_fetch_or(&raised, 1u << dev, __ATOMIC_RELEASE);
    }
    mg_gemm_kernel<GATEUP, LD, BM, PLACE><<<grid, MG_THREADS, smem, st>>>(tab, tile_e, perm, nt, H, k, x, hbuf, ldh,
                                                                          wts, dbuf, sh_only, pf);
    return cudaGetLastError();
}

/* ---- 4', 5', 1': the mid-batch GEMVs and router (LASTSTAND_MG_MID): moe_mid.cu ------- */

/* The GEMMs' variant knobs, read once per process. The defaults are the variant
 * that device rounds R3 and R4 found correct (doctor, fp64 CPU reference) and fastest
 * on both Qwen3.5 MoE shapes (bench/RESULTS.md): place32, side (the prefetch hint,
 * measured alone, changed nothing: off).
 *   LASTSTAND_MG_DECODE=place|place32|place3|perm  NVFP4 decode: bit placement (nvfp4.cuh,
 *                                   half of it on the FMA pipe; the loads' addresses made
 *                                   once per CTA) at BM = 16 and 32 (place32, default; R4:
 *                                   -19% at 35B M = 512, -20% at 397B M = 1024), at BM = 16
 *                                   only (place), with 3 CTAs per SM at BM = 16 (place3), or
 *                                   the byte-permute tables everywhere (perm)
 *   LASTSTAND_MG_SIDE=0|1           a shared expert of another kind than the routed
 *                                   experts runs on a side stream beside them (1, default)
 *                                   or after them on the caller's stream (0)
 *   LASTSTAND_MG_PREFETCH=0|64|128|256  the NVFP4 codes' cp.async asks L2 to fetch this many
 *                                   bytes around each 16-byte piece (default 0; a CTA
 *                                   reads 32 B per weight row per k block)
 *   LASTSTAND_MG_MID=0|1            the mid-batch path at 16-row tiles where device round R2
 *                                   found it faster (1, default since R2: H <= 2048 up to
 *                                   M·k = 8E, H = 3072 up to 4E (S14), else up to E/2 (4E at
 *                                   H = 4096, below); LASTSTAND_MG_MIDALL=1 at every
 *                                   16-row tile size) or the grouped GEMM path (0). Its parts,
 *                                   each on by default and switchable: the routed (and a
 *                                   same-kind shared) NVFP4 experts' GEMMs by mv_kernel, gate/up
 *                                   with one barrier (LASTSTAND_MG_MIDGU=1; 0: four), down by
 *                                   mvd_kernel, a whole K per warp (LASTSTAND_MG_MIDDN=2; 0:
 *                                   mv_kernel, 1: its other instance at I = 512), a BF16 shared
 *                                   expert by mvb_kernel, the router by mr_kernel
 *                                   (LASTSTAND_MG_MIDROUTER), the top-k by a block per token
 *                                   (LASTSTAND_MG_MIDTOPK), the combine with every load in
 *                                   flight, programmatic dependent launch (LASTSTAND_MG_MIDPDL,
 *                                   cu_pdl.h); down's weights in flight before its wait for
 *                                   gate/up (LASTSTAND_MG_DNEARLY, on since S8 device round R2:
 *                                   gate/up lets it go only after its own wait, so the plan it
 *                                   reads first is complete), gate/up at 4 blocks an SM
 *                                   (LASTSTAND_MG_MIDGU=2, the default since S8-R2; 1: 3 blocks;
 *                                   both: the 35B MoE call at M = 8 / 16 / 32 71.3 / 105.5 /
 *                                   154.4 -> 66.7 / 100.4 / 149.6 µs, the same bits);
 *                                   at H = 4096 (the 397B shapes, S10 c16moe): gate/up with one
 *                                   barrier at 2 blocks an SM and the mid path up to M·k = 4E
 *                                   (LASTSTAND_MG_MID4K=1, default since R1: the 397B tp2 rank
 *                                   shape 294.7 -> 236.4 µs at M = 16, 564.6 / 802.6 -> 391.2 /
 *                                   593.4 µs at M = 32 / 64; 0: 16 warps at 95 registers, one
 *                                   block an SM, up to M·k = E/2)
 *   LASTSTAND_MG_WGMMA=0|1          64-row tiles (prefill chunks) of NVFP4 experts by the
 *                                   warpgroup-MMA kernels of moe_wgmma.cu where the device
 *                                   runs sm_90a code (1, default since S9 round R1: the
 *                                   doctor's fp64 check passed at M = 1024, 2048, 8192, the 35B
 *                                   MoE call 983 -> 812 µs at M = 2048, 2.955 -> 2.441 ms at
 *                                   8192), or by mg_gemm_kernel (0)
 *   LASTSTAND_MG_PLAN=0|1|2         off the mid path (S12): the plan by mg_plan_count_kernel +
 *                                   mg_plan_place_kernel, the place launch with PDL (1, default)
 *                                   or without (2), or by the one-block mg_plan_kernel (0); the
 *                                   same tiles, rows per expert in a fixed order, the same y (3,
 *                                   a one-launch plan with a grid barrier, 19 vs 25 us a layer
 *                                   at 8192 tokens, was deleted in S13: 0.2% of the 8k TTFT
 *                                   for a spin barrier; last at 5b67803)
 *   LASTSTAND_MG_TOPK=0|1           off the mid path (S12): the top-k by mg_topk2_kernel (1,
 *                                   default) or mg_topk_kernel (0); the same bits (2, a
 *                                   <= 64-register form never measured faster, deleted in S13) */
typedef struct mg_knobs {
    int place;   /* 0 perm, 1 place, 2 place3 */
    int place32; /* place at BM = 32 too */
    int side, pf;
    int mid;     /* the mid-batch GEMVs (mv_kernel) at 16-row tiles */
    int midtopk; /* with mid: the block-per-token top-k */
    int middn;   /* with mid: down at K = 512 by 2 warps x 2 chunks (1), a whole K per warp (2) */
    int midrouter; /* with mid: the router by mr_kernel */
    int midgu;   /* with mid: gate/up at H = 2048 with one barrier (LEAN, 1), at 4 blocks an SM (2) */
    int midall;  /* with mid: the GEMVs at every 16-row tile size and shape */
    int midpdl;  /* with mid: its launches with programmatic dependent launch */
    int routerpdl; /* with mid and midpdl: the router's launch, 0 plain (default since S11), 1 PDL with
                      the next kernel released first (S10), 2 PDL released after its wait */
    int dnearly; /* with mid, PDL and mvd_kernel: down's weights fetched before its wait */
    int wgmma;   /* 64-row tiles of NVFP4 experts by moe_wgmma.cu's warpgroup-MMA kernels (sm_90a) */
    int mid4k;   /* with mid: gate/up at H = 4096 with one barrier at 2 blocks an SM, the mid path
                    at H = 4096 up to M·k = 4E */
    int plan;    /* off the mid path: 0 mg_plan_kernel (one block), 1 the multi-block plan with its
                    place launch by PDL (default), 2 the same without PDL */
    int topk;    /* off the mid path: 0 mg_topk_kernel, 1 mg_topk2_kernel (default; the same bits) */
    int shearly; /* with mid and a BF16 shared expert on the side stream: its gate/up forked before
                    the router (1, default), or after the plan (0) */
} mg_knobs;

/* tests/unit/test_moe_plan_cuda.c's override of plan and topk (-1: the knobs) */
static int mg_force_plan = -1, mg_force_topk = -1;

static mg_knobs mg_knobs_get(void) {
    static mg_knobs k;
    static int done;
    if (!__atomic_load_n(&done, __ATOMIC_ACQUIRE)) {
        mg_knobs n = {1, 1, 1, 0, 1, 1, 2, 1, 2, 0, 1, 1, 1, 1};
        const char *v = getenv("LASTSTAND_MG_DECODE");
        if (v && !strcmp(v, "perm")) n.place = 0;
        if (v && !strcmp(v, "place")) n.place32 = 0;
        if (v && !strcmp(v, "place3")) n.place = 2;
        v = getenv("LASTSTAND_MG_SIDE");
        if (v && (!strcmp(v, "0") || !strcmp(v, "1"))) n.side = atoi(v);
        v = getenv("LASTSTAND_MG_PREFETCH");
        if (v && (!strcmp(v, "0") || !strcmp(v, "64") || !strcmp(v, "128") || !strcmp(v, "256"))) n.pf = atoi(v);
        n.mid = cu_env_switch("LASTSTAND_MG_MID", 1);
        n.midtopk = cu_env_switch("LASTSTAND_MG_MIDTOPK", 1);
        v = getenv("LASTSTAND_MG_MIDDN");
        if (v && (!strcmp(v, "0") || !strcmp(v, "1") || !strcmp(v, "2"))) n.middn = atoi(v);
        n.midrouter = cu_env_switch("LASTSTAND_MG_MIDROUTER", 1);
        v = getenv("LASTSTAND_MG_MIDGU");
        n.midgu = v && !strcmp(v, "2") ? 2 : cu_env_switch("LASTSTAND_MG_MIDGU", 2);
        n.midall = cu_env_switch("LASTSTAND_MG_MIDALL", 0);
        n.midpdl = cu_env_switch("LASTSTAND_MG_MIDPDL", 1);
        n.dnearly = cu_env_switch("LASTSTAND_MG_DNEARLY", 1);
        n.wgmma = cu_env_switch("LASTSTAND_MG_WGMMA", 1);
        n.mid4k = cu_env_switch("LASTSTAND_MG_MID4K", 1);
        n.shearly = cu_env_switch("LASTSTAND_MG_SHEARLY", 1);
        v = getenv("LASTSTAND_MG_ROUTER_PDL");
        n.routerpdl = v && (!strcmp(v, "1") || !strcmp(v, "2")) ? atoi(v) : 0;
        v = getenv("LASTSTAND_MG_PLAN");
        n.plan = v && (!strcmp(v, "0") || !strcmp(v, "2")) ? atoi(v) : 1;
        v = getenv("LASTSTAND_MG_TOPK");
        n.topk = v && !strcmp(v, "0") ? 0 : 1;
        k = n; /* the same value from every racing thread */
        __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
    }
    mg_knobs r = k;
    const int fp = __atomic_load_n(&mg_force_plan, __ATOMIC_RELAXED), ft = __atomic_load_n(&mg_force_topk, __ATOMIC_RELAXED);
    if (fp >= 0) r.plan = fp;
    if (ft >= 0) r.topk = ft;
    return r;
}

/* The gate/up (GATEUP) or down GEMM for tile height BM with loader ld, over
 * the tiles below nt[0] (or, sh_only, the shared expert's tiles nt[1] ..);
 * kn: the variant knobs (mg_knobs). */
template <bool GATEUP, int BM>
static cudaError_t mg_gemm_launch(int ld, const mg_knobs &kn, int n_out, int tiles_max, const mg_expert *tab,
                                  const int32_t *tile_e, const int32_t *perm, const int32_t *nt, int H, int k,
                                  const bf16 *x, bf16 *hbuf, int ldh, const float *wts, bf16 *dbuf, int sh_only,
                                  cudaStream_t st) {
    constexpr int bnw = mg_geo<BM, MG_LD_FP4>::BNW; /* the same for every loader */
    static_assert(mg_geo<BM, MG_LD_BF16>::BNW == bnw, "loaders share the CTA tile");
    constexpr int per = GATEUP ? bnw / 2 : bnw;     /* output columns per CTA */
    dim3 grid((unsigned)((n_out + per - 1) / per), (unsigned)tiles_max);
    if constexpr (BM == 64) { /* the prefill chunks' tiles on Hopper's warpgroup MMA (moe_wgmma.cu) */
        if (ld == MG_LD_FP4 && !sh_only && kn.wgmma && mw_available())
            return mw_launch<GATEUP>(n_out, tiles_max, tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts, dbuf, st);
        if (ld == MG_LD_BF16 && sh_only && kn.wgmma && m2_bf16_on(tiles_max)) /* a BF16 shared expert's tiles */
            return m2_launch_bf16<GATEUP>(n_out, tiles_max, tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts, dbuf, st);
    }
    if constexpr (BM == 16) { /* three CTAs per SM: 3 x 69 KB of shared memory, <= 85 registers */
        if (ld == MG_LD_FP4 && kn.place == 2)
            return mg_gemm_launch1<GATEUP, MG_LD_FP4, BM, 2>(grid, tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts,
                                                             dbuf, sh_only, kn.pf, st);
    }
    if constexpr (BM <= 32) { /* (at BM = 64 the place decode spills: not built) */
        if (ld == MG_LD_FP4 && kn.place && (BM == 16 || kn.place32))
            return mg_gemm_launch1<GATEUP, MG_LD_FP4, BM, 1>(grid, tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts,
                                                             dbuf, sh_only, kn.pf, st);
    }
    if (ld == MG_LD_FP4)
        return mg_gemm_launch1<GATEUP, MG_LD_FP4, BM, 0>(grid, tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts, dbuf,
                                                         sh_only, kn.pf, st);
    if (ld == MG_LD_FP4_PLAIN)
        return mg_gemm_launch1<GATEUP, MG_LD_FP4_PLAIN, BM, 0>(grid, tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts,
                                                               dbuf, sh_only, kn.pf, st);
    return mg_gemm_launch1<GATEUP, MG_LD_BF16, BM, 0>(grid, tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts, dbuf,
                                                      sh_only, kn.pf, st);
}

/* Both GEMMs of a call at tile height BM; *what names the one that failed.
 * When the shared expert's kind differs from the routed experts' (tab->ld_gu_s
 * >= 0), each GEMM is two launches: the routed tiles (below nt[1]) with their
 * loader, and the shared expert's sh_tiles tiles with its own. With a side
 * stream (side != NULL) the shared expert's two launches run there, forked
 * from st after the plan and joined back before the combine: its few CTAs
 * (sh_tiles x 4..16, each streaming up to 2 MB of BF16 weights) overlap the
 * routed GEMMs instead of running after them at a fraction of the GPU. The
 * two streams write disjoint rows of hbuf and dbuf. */
template <int BM>
static cudaError_t mg_gemms(const mg_tab *tab, const mg_knobs &kn, cudaStream_t side, cudaEvent_t ev_fork,
                            cudaEvent_t ev_join, int imax, int tiles_max, int sh_tiles, const int32_t *tile_e,
                            const int32_t *perm, const int32_t *nt, int H, int k, const bf16 *x, bf16 *hbuf, int ldh,
                            const float *wts, bf16 *dbuf, int mid_k, int mid_ks, int sh_done, cudaStream_t st,
                            const char **what) {
    const int mixed = tab->ld_gu_s >= 0;
    /* sh_done: the caller runs the shared expert (mg_run_locked's early form): routed tiles only */
    const int shl = mixed && !sh_done;
    const int32_t *ntr = mixed ? nt + 1 : nt; /* bound of the routed launch: routed tiles only when mixed */
    /* pdl 2 (LASTSTAND_MG_DNEARLY): gate/up lets the down launch go only after its own wait, and
     * mvd_kernel fetches its weights before its wait (moe_mid.cu) */
    const int dn_mvd = BM == 16 && mid_k && kn.middn == 2 && mvd_per(mid_k);
    const int gpdl = kn.midpdl ? (dn_mvd && kn.dnearly ? 2 : 1) : 0;
    cudaError_t c = cudaSuccess;
    if (shl && side) {
        *what = "cuda_grouped_gemm side stream fork";
        c = cudaEventRecord(ev_fork, st);
        if (c == cudaSuccess) c = cudaStreamWaitEvent(side, ev_fork, 0);
        if (c != cudaSuccess) return c;
        *what = "cuda_grouped_gemm shared expert gate/up";
        c = BM == 16 && mid_ks ? mvb_launch<true>(H, mid_ks, sh_tiles, tab->dev, tile_e, perm, nt, H, k, x, hbuf, ldh,
                                                  wts, dbuf, 0, side)
                               : mg_gemm_launch<true, BM>(tab->ld_gu_s, kn, imax, sh_tiles, tab->dev, tile_e, perm, nt,
                                                          H, k, x, hbuf, ldh, wts, dbuf, 1, side);
        if (c == cudaSuccess) {
            *what = "cuda_grouped_gemm shared expert down";
            c = BM == 16 && mid_ks ? mvb_launch<false>(mid_ks, H, sh_tiles, tab->dev, tile_e, perm, nt, H, k, x, hbuf,
                                                       ldh, wts, dbuf, 0, side)
                                   : mg_gemm_launch<false, BM>(tab->ld_dn_s, kn, H, sh_tiles, tab->dev, tile_e, perm,
                                                               nt, H, k, x, hbuf, ldh, wts, dbuf, 1, side);
        }
    }
    if (c == cudaSuccess) {
        *what = "cuda_grouped_gemm gate/up";
        c = BM == 16 && mid_k
                ? mv_launch<true>(H, imax, tiles_max, tab->dev, tile_e, perm, ntr, H, k, x, hbuf, ldh, wts, dbuf, 0,
                                  H == 4096 ? kn.mid4k : kn.midgu, gpdl, st)
                : mg_gemm_launch<true, BM>(tab->ld_gu, kn, imax, tiles_max, tab->dev, tile_e, perm, ntr, H, k, x, hbuf,
                                           ldh, wts, dbuf, 0, st);
    }
    if (c == cudaSuccess && shl && !side) {
        *what = "cuda_grouped_gemm shared expert gate/up";
        c = BM == 16 && mid_ks ? mvb_launch<true>(H, mid_ks, sh_tiles, tab->dev, tile_e, perm, nt, H, k, x, hbuf, ldh,
                                                  wts, dbuf, 0, st)
                               : mg_gemm_launch<true, BM>(tab->ld_gu_s, kn, imax, sh_tiles, tab->dev, tile_e, perm, nt,
                                                          H, k, x, hbuf, ldh, wts, dbuf, 1, st);
    }
    if (c == cudaSuccess) {
        *what = "cuda_grouped_gemm down";
        c = dn_mvd ? mvd_launch(mid_k, tiles_max, tab->dev, tile_e, perm, ntr, H, k, x, hbuf, ldh, wts, dbuf, gpdl, st)
            : BM == 16 && mid_k
                ? mv_launch<false>(mid_k, H, tiles_max, tab->dev, tile_e, perm, ntr, H, k, x, hbuf, ldh, wts, dbuf, 0,
                                   kn.middn == 1, kn.midpdl, st)
                : mg_gemm_launch<false, BM>(tab->ld_dn, kn, H, tiles_max, tab->dev, tile_e, perm, ntr, H, k, x, hbuf,
                                            ldh, wts, dbuf, 0, st);
    }
    if (c == cudaSuccess && shl && !side) {
        *what = "cuda_grouped_gemm shared expert down";
        c = BM == 16 && mid_ks ? mvb_launch<false>(mid_ks, H, sh_tiles, tab->dev, tile_e, perm, nt, H, k, x, hbuf, ldh,
                                                   wts, dbuf, 0, st)
                               : mg_gemm_launch<false, BM>(tab->ld_dn_s, kn, H, sh_tiles, tab->dev, tile_e, perm, nt,
                                                           H, k, x, hbuf, ldh, wts, dbuf, 1, st);
    }
    if (shl && side) { /* joined even after a failed launch: a capture must not end with the side stream forked */
        cudaError_t j = cudaEventRecord(ev_join, side);
        if (j == cudaSuccess) j = cudaStreamWaitEvent(st, ev_join, 0);
        if (c == cudaSuccess && j != cudaSuccess) *what = "cuda_grouped_gemm side stream join";
        if (c == cudaSuccess) c = j;
    }
    return c;
}

/* ---- 6: combine ----------------------------------------------------------------- */

/* y[m, :] = Σ_{j < nslot} dbuf[m·(k+1) + j, :], fp32 sum; 8 columns per thread. */
__global__ void __launch_bounds__(256) mg_combine_kernel(int M, int H, int k, int nslot,
                                                         const bf16 *__restrict__ dbuf, bf16 *__restrict__ y) {
    const int m = blockIdx.x;
    for (int c = threadIdx.x * 8; c < H; c += 256 * 8) {
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (int j = 0; j < nslot; j++) {
            const uint4 v = *reinterpret_cast<const uint4 *>(dbuf + ((size_t)m * (k + 1) + j) * H + c);
            const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int q = 0; q < 4; q++) {
                float2 f = bf2_to_f2(w[q]);
                acc[2 * q] += f.x;
                acc[2 * q + 1] += f.y;
            }
        }
        uint4 o;
        o.x = mg_pack_bf2(acc[0], acc[1]);
        o.y = mg_pack_bf2(acc[2], acc[3]);
        o.z = mg_pack_bf2(acc[4], acc[5]);
        o.w = mg_pack_bf2(acc[6], acc[7]);
        *reinterpret_cast<uint4 *>(y + (size_t)m * H + c) = o;
    }
}

/* mg_combine_kernel for the mid-batch path (LASTSTAND_MG_MID): every slot's 16 bytes are
 * loaded before the first add (nslot <= MG_MAXK + 1 loads in flight, not one at a time: 4.2
 * us at M = 16 was nine L2 round trips), then summed in the same order (j ascending): the
 * same bits as mg_combine_kernel. */
__global__ void __launch_bounds__(256) mg_combine_mid_kernel(int M, int H, int k, int nslot,
                                                             const bf16 *__restrict__ dbuf, bf16 *__restrict__ y) {
    cu_pdl_trigger();
    cu_pdl_wait(); /* (with PDL: down's dbuf) */
    const int m = blockIdx.x;
    for (int c = threadIdx.x * 8; c < H; c += 256 * 8) {
        uint4 v[MG_MAXK + 1];
#pragma unroll
        for (int j = 0; j < MG_MAXK + 1; j++)
            if (j < nslot) v[j] = __ldg(reinterpret_cast<const uint4 *>(dbuf + ((size_t)m * (k + 1) + j) * H + c));
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll
        for (int j = 0; j < MG_MAXK + 1; j++) {
            if (j >= nslot) break;
            const uint32_t w[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
#pragma unroll
            for (int q = 0; q < 4; q++) {
                float2 f = bf2_to_f2(w[q]);
                acc[2 * q] += f.x;
                acc[2 * q + 1] += f.y;
            }
        }
        uint4 o;
        o.x = mg_pack_bf2(acc[0], acc[1]);
        o.y = mg_pack_bf2(acc[2], acc[3]);
        o.z = mg_pack_bf2(acc[4], acc[5]);
        o.w = mg_pack_bf2(acc[6], acc[7]);
        *reinterpret_cast<uint4 *>(y + (size_t)m * H + c) = o;
    }
}

/* ---- host side ---------------------------------------------------------------------- */

static int mg_supported(const dev_info *d, const moe_shape *s, char *why, size_t n) {
    if (d->kind != DEV_CUDA) {
        snprintf(why, n, "needs a CUDA device");
        return 0;
    }
    if (s->dt != ACT_BF16) {
        snprintf(why, n, "activations must be BF16");
        return 0;
    }
    if (s->wk != W_NVFP4 && s->wk != W_BF16) {
        snprintf(why, n, "needs NVFP4 or BF16 experts");
        return 0;
    }
    if (s->Is > 0 && moe_shared_kind(s) != W_NVFP4 && moe_shared_kind(s) != W_BF16) {
        snprintf(why, n, "needs an NVFP4 or BF16 shared expert, got %s", w_kind_name(moe_shared_kind(s)));
        return 0;
    }
    if (s->top_k < 1 || s->top_k > MG_MAXK || s->top_k > s->E || s->E > MG_MAXE) {
        snprintf(why, n, "needs top_k 1..%d and at most %d experts (top_k %d, E %d)", MG_MAXK, MG_MAXE, s->top_k,
                 s->E);
        return 0;
    }
    if (s->H % 16 || s->I % 16 || s->Is % 16 || s->I <= 0) {
        snprintf(why, n, "needs H, I, shared I multiples of 16 (H=%d I=%d Is=%d)", s->H, s->I, s->Is);
        return 0;
    }
    return 1;
}

/* Fill ws->scratch from w (E routed experts, all NVFP4 or all BF16, + the
 * shared one, all NVFP4 or all BF16 on its own), pick the loaders, and find or
 * refresh the device copy; *out = its cache entry. */
static int mg_table(mg_ws *ws, const moe_w *w, cudaStream_t st, mg_tab **out, ls_err *e) {
    const int E = w->n_experts, H = w->hidden, Is = w->shared_inter > 0 ? w->shared_inter : 0;
    if (!ws->scratch) ws->scratch = (mg_expert *)xcalloc(MG_MAXE + 1, sizeof(mg_expert));
    mg_expert *sc = ws->scratch;
    const w_kind wk = w->gate[0].kind;
    if (wk != W_NVFP4 && wk != W_BF16)
        return errf(e, ERR_UNSUPPORTED, "cuda_grouped_gemm: %s experts (takes NVFP4 or BF16)", w_kind_name(wk));
    const w_kind sk = Is ? w->sh_gate.kind : wk; /* the shared expert's kind */
    if (sk != W_NVFP4 && sk != W_BF16)
        return errf(e, ERR_UNSUPPORTED, "cuda_grouped_gemm: %s shared expert (takes NVFP4 or BF16)", w_kind_name(sk));
    int fast_gu = H % 64 == 0, fast_dn = 1;   /* NVFP4 cp.async loaders usable: routed experts */
    int fast_gu_s = H % 64 == 0, fast_dn_s = 1; /* the shared expert */
    for (int x = 0; x <= E; x++) {
        const lin_w *l[3];
        int I;
        if (x < E) {
            l[0] = &w->gate[x]; l[1] = &w->up[x]; l[2] = &w->down[x];
            I = w->inter;
        } else if (Is) {
            l[0] = &w->sh_gate; l[1] = &w->sh_up; l[2] = &w->sh_down;
            I = Is;
        } else {
            memset(&sc[x], 0, sizeof sc[x]);
            break;
        }
        const w_kind xk = x < E ? wk : sk;
        int *fgu = x < E ? &fast_gu : &fast_gu_s, *fdn = x < E ? &fast_dn : &fast_dn_s;
        for (int q = 0; q < 3; q++) {
            const int wantN = q < 2 ? I : H, wantK = q < 2 ? H : I;
            const char *what = x < E ? "expert" : "shared expert";
            if (l[q]->kind != xk)
                return errf(e, ERR_UNSUPPORTED, "cuda_grouped_gemm: %s %d weight %s is %s, %s gate is %s", what, x,
                            l[q]->name ? l[q]->name : "?", w_kind_name(l[q]->kind),
                            x < E ? "expert 0's" : "its", w_kind_name(xk));
            if (l[q]->N != wantN || l[q]->K != wantK)
                return errf(e, ERR_INVAL, "cuda_grouped_gemm: %s %d weight %s is [%d, %d], expected [%d, %d]", what, x,
                            l[q]->name ? l[q]->name : "?", l[q]->N, l[q]->K, wantN, wantK);
            sc[x].w[q] = (const uint8_t *)l[q]->data;
            if (xk == W_BF16) { /* rows of K bf16 read as 16-byte chunks (K % 16 == 0 checked) */
                if ((uintptr_t)l[q]->data & 15)
                    return errf(e, ERR_UNSUPPORTED, "cuda_grouped_gemm: BF16 weight %s not 16-byte aligned",
                                l[q]->name ? l[q]->name : "?");
                sc[x].s[q] = NULL;
                sc[x].s2[q] = 1.f;
                continue;
            }
            sc[x].s[q] = l[q]->scale;
            sc[x].s2[q] = l[q]->scale2;
            const int ok = !((uintptr_t)l[q]->data & 15) && !((uintptr_t)l[q]->scale & 3);
            if (q < 2) *fgu &= ok;
            else *fdn &= ok && I % 64 == 0;
        }
        sc[x].inter = I;
    }
    const int n = E + 1;
    mg_tab *te = NULL;
    for (int i = 0; i < MG_TAB_CACHE; i++)
        if (ws->tabs[i].key == w && ws->tabs[i].n == n) te = &ws->tabs[i];
    if (!te || memcmp(te->host, sc, sizeof(mg_expert) * n)) {
        if (!te) {
            te = &ws->tabs[ws->next_tab];
            ws->next_tab = (ws->next_tab + 1) % MG_TAB_CACHE;
        }
        if (!te->host) { /* sized for MG_MAXE + 1 experts: reused by any layer */
            te->host = (mg_expert *)xmalloc(sizeof(mg_expert) * (MG_MAXE + 1));
            cudaError_t c = cudaMalloc(&te->dev, sizeof(mg_expert) * (MG_MAXE + 1));
            if (c != cudaSuccess) {
                free(te->host);
                te->host = NULL;
                te->dev = NULL;
                te->key = NULL;
                return cu_fail(e, c, "cuda_grouped_gemm expert table");
            }
        }
        te->key = w;
        te->n = n;
        memcpy(te->host, sc, sizeof(mg_expert) * n);
        /* from pageable memory: ordered after the stream's earlier work */
        cudaError_t c = cudaMemcpyAsync(te->dev, te->host, sizeof(mg_expert) * n, cudaMemcpyHostToDevice, st);
        if (c != cudaSuccess) {
            te->key = NULL;
            return cu_fail(e, c, "cuda_grouped_gemm expert table");
        }
    }
    te->ld_gu = wk == W_BF16 ? MG_LD_BF16 : fast_gu ? MG_LD_FP4 : MG_LD_FP4_PLAIN;
    te->ld_dn = wk == W_BF16 ? MG_LD_BF16 : fast_dn ? MG_LD_FP4 : MG_LD_FP4_PLAIN;
    te->ld_gu_s = sk == wk ? -1 : sk == W_BF16 ? MG_LD_BF16 : fast_gu_s ? MG_LD_FP4 : MG_LD_FP4_PLAIN;
    te->ld_dn_s = sk == wk ? -1 : sk == W_BF16 ? MG_LD_BF16 : fast_dn_s ? MG_LD_FP4 : MG_LD_FP4_PLAIN;
    *out = te;
    return 0;
}

/* ---- test hooks (moe_grouped_test.h; the others in moe_route.cu) ---------------- */

extern "C" void cuda_mg_route_force(int plan, int topk) {
    __atomic_store_n(&mg_force_plan, plan, __ATOMIC_RELAXED);
    __atomic_store_n(&mg_force_topk, topk, __ATOMIC_RELAXED);
}

/* The side stream and its two events, made once per device (the warm-up call,
 * before any capture). A stream that cannot be made leaves the call on one stream. */
static void mg_side(mg_ws *ws) {
    if (ws->side_state) return;
    int lo = 0, hi = 0;
    cudaError_t c = cudaDeviceGetStreamPriorityRange(&lo, &hi);
    if (c == cudaSuccess) c = cudaEventCreateWithFlags(&ws->ev_fork, cudaEventDisableTiming);
    if (c == cudaSuccess) c = cudaEventCreateWithFlags(&ws->ev_join, cudaEventDisableTiming);
    if (c == cudaSuccess) c = cudaEventCreateWithFlags(&ws->ev_route, cudaEventDisableTiming);
    if (c == cudaSuccess) c = cudaStreamCreateWithPriority(&ws->side, cudaStreamNonBlocking, hi);
    if (c != cudaSuccess) { /* whatever was made stays unused (a few bytes, once per device) */
        (void)cudaGetLastError();
        log_warn("cuda_grouped_gemm: no side stream for the shared expert (%s); it runs after the routed experts",
                 cudaGetErrorString(c));
        ws->side_state = -1;
        return;
    }
    ws->side_state = 1;
    return;
}

/* The routing of a call up to the plan: router logits, top-k (idx, wts). */
static int mg_route(const moe_args *a, const mg_knobs &kn, int midp, int pdl, float *logits, int32_t *idx,
                    float *wts, cudaStream_t st, ls_err *e) {
    const moe_w *w = a->w;
    const int M = a->M, H = w->hidden, E = w->n_experts, k = w->top_k, hs = w->shared_inter > 0;
    int rc;
    cudaError_t cr = cudaSuccess;
    /* the router launch without the PDL attribute: it is the call's first kernel, and with PDL
     * (S10's mr_kernel) its results depended on the history of the call (S11 device rounds: the
     * same 8-token forward gave different greedy ids call to call, so serve's sampler check fell
     * back to the host; decode from CUDA graphs differed from eager steps from token 0; both gone
     * with LASTSTAND_MG_MIDPDL=0 or the cuBLASLt router, LASTSTAND_MG_MIDROUTER=0). The launches
     * after it keep PDL among themselves. LASTSTAND_MG_ROUTER_PDL=1 restores S10's launch (the
     * next kernel released before the wait), =2 PDL with the release after the wait (as the fused
     * decode router, which passed graphs == eager): opt-in until bench/device/pdlcheck.sh shows
     * one deterministic (bench/RESULTS.md, "PDL hazard audit"). */
    if (midp && kn.midrouter &&
        mr_launch(M, H, E, (const bf16 *)w->router.data, (const bf16 *)a->x, logits, pdl ? kn.routerpdl : 0, st,
                  &cr)) {
        if (cr != cudaSuccess) return cu_fail(e, cr, "cuda_grouped_gemm router");
    } else {
        rc = cu_lt_gemm(M, E, H, w->router.data, a->x, logits, 1, 1.f, 0.f, st, e);
        if (rc) return err_prefix(e, "cuda_grouped_gemm router");
    }
    if (midp && kn.midtopk)
        CU_TRY(e,
               mg_topk_block_launch(pdl, M, H, E, k, w->norm_topk, (const bf16 *)a->x,
                                    w->has_sh_gate ? (const bf16 *)w->sh_gate_w.data : NULL, hs,
                                    (const float *)logits, idx, wts, st),
               "cuda_grouped_gemm top-k");
    else
        CU_TRY(e,
               mg_topk_launch(midp ? 0 : kn.topk, M, H, E, k, w->norm_topk, (const bf16 *)a->x,
                              w->has_sh_gate ? (const bf16 *)w->sh_gate_w.data : NULL, hs, logits, idx, wts, st),
               "cuda_grouped_gemm top-k");
    CU_LAUNCHED(e, "cuda_grouped_gemm top-k");
    return 0;
}

/* A forked side stream joined back into st (after a failed launch: a capture must not end forked). */
static void mg_side_join(mg_ws *ws, cudaStream_t side, cudaStream_t st) {
    if (cudaEventRecord(ws->ev_join, side) == cudaSuccess) (void)cudaStreamWaitEvent(st, ws->ev_join, 0);
    (void)cudaGetLastError();
}

static int mg_run_locked(mg_ws *ws, const moe_args *a, cudaStream_t st, ls_err *e) {
    const moe_w *w = a->w;
    const int M = a->M, H = w->hidden, E = w->n_experts, k = w->top_k, I = w->inter,
              Is = w->shared_inter > 0 ? w->shared_inter : 0, hs = Is > 0;
    mg_tab *tab;
    int rc = mg_table(ws, w, st, &tab, e);
    if (rc) return rc;
    /* tile height from the routed experts' average rows r = M·k/E: 16 when r < 12
     * (decode-ish and mid batches), 32 when r < 28, else 64: one tile per expert
     * where possible (its weights decoded once), the least padding work beside
     * that (LASTSTAND_GROUPED_BM=16|32|64 forces one) */
    const size_t mk = (size_t)M * k;
    int bm = mk < (size_t)12 * E ? 16 : mk < (size_t)28 * E ? 32 : 64;
    const char *force = getenv("LASTSTAND_GROUPED_BM");
    if (force && (!strcmp(force, "16") || !strcmp(force, "32") || !strcmp(force, "64"))) bm = atoi(force);
    /* rows: each slot's pairs padded to bm; at most min(slots, pairs) slots are non-empty */
    const size_t tiles_max = mg_tiles_max(M, E, k, hs, bm);
    const size_t R = tiles_max * bm;
    const int imax = I > Is ? I : Is, ldh = (imax + 63) / 64 * 64;
    if (tiles_max > 65535)
        return errf(e, ERR_UNSUPPORTED, "cuda_grouped_gemm: M=%d needs %zu tiles > 65535", M, tiles_max);
    float *logits = (float *)mg_get(ws, MG_LOGITS, sizeof(float) * M * E, st, e);
    int32_t *idx = (int32_t *)mg_get(ws, MG_IDX, sizeof(int32_t) * M * k, st, e);
    float *wts = (float *)mg_get(ws, MG_WTS, sizeof(float) * M * (k + 1), st, e);
    int32_t *tile_e = (int32_t *)mg_get(ws, MG_TILE, sizeof(int32_t) * tiles_max, st, e);
    int32_t *perm = (int32_t *)mg_get(ws, MG_PERM, sizeof(int32_t) * R, st, e);
    int32_t *nt = (int32_t *)mg_get(ws, MG_NT, sizeof(int32_t) * 2, st, e); /* all tiles, routed tiles */
    bf16 *hbuf = (bf16 *)mg_get(ws, MG_H, sizeof(bf16) * R * ldh, st, e);
    bf16 *dbuf = (bf16 *)mg_get(ws, MG_D, sizeof(bf16) * (size_t)M * (k + 1) * H, st, e);
    if (!logits || !idx || !wts || !tile_e || !perm || !nt || !hbuf || !dbuf) return e->code ? e->code : ERR_NOMEM;

    const mg_knobs kn = mg_knobs_get();
    /* the mid-batch path (mg_knobs) at 16-row tiles where the H200 rounds found it faster (R2:
     * the 35B shape up to 8 rows per expert, -36% at M = 16 and 32, -27% at 128, -7% at 256;
     * the 397B shape at M = 16, -8%, not at 64, +3%): H <= 2048 up to M·k = 8E, else up to
     * M·k = E/2 (LASTSTAND_MG_MIDALL=1: every 16-row tile size); at H = 4096 with gate/up at 2
     * blocks an SM (LASTSTAND_MG_MID4K, S10 c16moe R1: 397B -20% at M = 16, -31% / -26% at 32 / 64
     * against the grouped GEMM) up to M·k = 4E (2E until S11: the S11 device round measured the
     * mid path at M = 128 784 vs 1010 µs at the 397B tp2 rank shape, 1.582 vs 1.923 ms at the full
     * 397B shape, and at 192 880 µs, against the grouped GEMM); at H = 3072 (the 122B's gate/up
     * instance since S14) up to M·k = 4E as well (S14 doctor, one 122B layer, µs, mid path
     * against the grouped GEMM: M = 24 364 / 464, 32 438 / 549, 64 610 / 726, 128 749 / 803) */
    const size_t midmax = H <= 2048                          ? (size_t)8 * E
                          : H == 3072 || (H == 4096 && kn.mid4k) ? (size_t)4 * E
                                                                 : (size_t)E / 2;
    const int midp = kn.mid && bm == 16 && (kn.midall || mk <= midmax);
    /* its launches (router, top-k, plan, GEMVs, combine) carry the PDL attribute (each kernel
     * waits before its first dependent access): LASTSTAND_MG_MIDPDL */
    const int pdl = midp && kn.midpdl;
    const bf16 *x = (const bf16 *)a->x;
    const char *what = "cuda_grouped_gemm";
    const int sht = hs ? (M + bm - 1) / bm : 0; /* the shared expert's tiles: every token, padded */
    cudaStream_t side = NULL;
    if (kn.side && tab->ld_gu_s >= 0 && hs) {
        mg_side(ws);
        side = ws->side_state > 0 ? ws->side : NULL;
    }
    /* the mid-batch GEMVs (mv_kernel) for the routed GEMMs at 16-row tiles: NVFP4 experts by
     * cp.async, K of both GEMMs an instance of mv_pick, and a shared expert in the same launch
     * (same kind) with the routed experts' I; mid_k = the down GEMM's K, 0 = the grouped GEMM */
    const int mixed = tab->ld_gu_s >= 0;
    const int mid_k = midp && tab->ld_gu == MG_LD_FP4 && tab->ld_dn == MG_LD_FP4 && mv_pick(true, H).kw &&
                              mv_pick(false, I).kw && (mixed || !hs || Is == I)
                          ? I
                          : 0;
    /* and the BF16 form for a BF16 shared expert next to them (its own launches) */
    const int mid_ks = midp && mixed && tab->ld_gu_s == MG_LD_BF16 && tab->ld_dn_s == MG_LD_BF16 &&
                               mvb_per(H) && mvb_per(Is)
                           ? Is
                           : 0;
    /* The early shared expert (LASTSTAND_MG_SHEARLY, default 1; the mid path with a BF16 shared
     * expert and the side stream): its gate/up needs only x, so the side stream forks before the
     * router and runs it (mvb_kernel's direct form, into its own h buffer MG_HS) beside the
     * router, top-k and plan, whose few blocks leave most SMs idle; its down (which needs wts)
     * follows the top-k there (beside the plan), and the join stands before the combine. The
     * same sums as the plan's form (same kernel, same K order, same pairs of dbuf). Before (S21, bench/device/dectrace.sh):
     * the side-stream gate/up, forked after the plan, got SMs only once the routed gate/up's
     * blocks drained, ~20 us a layer on the step's critical path at 16 and at 113 sequences. */
    const int sh_early = mid_ks && side && kn.shearly;
    bf16 *hsh = NULL;
    if (sh_early && !(hsh = (bf16 *)mg_get(ws, MG_HS, sizeof(bf16) * (size_t)sht * 16 * ldh, st, e)))
        return e->code ? e->code : ERR_NOMEM;
    if (sh_early) {
        cudaError_t c = cudaEventRecord(ws->ev_fork, st);
        if (c == cudaSuccess) c = cudaStreamWaitEvent(side, ws->ev_fork, 0);
        if (c != cudaSuccess) return cu_fail(e, c, "cuda_grouped_gemm side stream fork");
        c = mvb_launch<true>(H, Is, sht, tab->dev + E, NULL, NULL, NULL, H, k, x, hsh, ldh, wts, dbuf, M, side);
        if (c != cudaSuccess) {
            mg_side_join(ws, side, st);
            return cu_fail(e, c, "cuda_grouped_gemm shared expert gate/up");
        }
    }
    rc = mg_route(a, kn, midp, pdl, logits, idx, wts, st, e);
    if (sh_early) {
        cudaError_t c = cudaSuccess;
        if (!rc) {
            c = cudaEventRecord(ws->ev_route, st);
            if (c == cudaSuccess) c = cudaStreamWaitEvent(side, ws->ev_route, 0);
            if (c == cudaSuccess)
                c = mvb_launch<false>(Is, H, sht, tab->dev + E, NULL, NULL, NULL, H, k, x, hsh, ldh, wts, dbuf, M, side);
        }
        cudaError_t j = cudaEventRecord(ws->ev_join, side); /* st waits on it before the combine */
        if (rc || c != cudaSuccess || j != cudaSuccess) {
            mg_side_join(ws, side, st);
            if (rc) return rc;
            return cu_fail(e, c != cudaSuccess ? c : j, "cuda_grouped_gemm shared expert down");
        }
    } else if (rc) {
        return rc;
    }
    /* the mid path keeps mg_plan_kernel (its PDL chain; at most 8E pairs there) */
    rc = mg_plan_launch(ws, midp ? 0 : kn.plan, pdl, M, E, k, hs, bm, (const int32_t *)idx, tile_e, perm, nt, st, e);
    if (rc) {
        if (sh_early) mg_side_join(ws, side, st);
        return rc;
    }
    mw_rows_hint((int)(mk / (size_t)E)); /* moe_wgmma.cu: m2_kernel or mw_kernel at 64-row tiles */
    cudaError_t c = bm == 16   ? mg_gemms<16>(tab, kn, side, ws->ev_fork, ws->ev_join, imax, (int)tiles_max, sht,
                                              tile_e, perm, nt, H, k, x, hbuf, ldh, wts, dbuf, mid_k, mid_ks, sh_early,
                                              st, &what)
                    : bm == 32 ? mg_gemms<32>(tab, kn, side, ws->ev_fork, ws->ev_join, imax, (int)tiles_max, sht,
                                              tile_e, perm, nt, H, k, x, hbuf, ldh, wts, dbuf, 0, 0, 0, st, &what)
                               : mg_gemms<64>(tab, kn, side, ws->ev_fork, ws->ev_join, imax, (int)tiles_max, sht,
                                              tile_e, perm, nt, H, k, x, hbuf, ldh, wts, dbuf, 0, 0, 0, st, &what);
    if (sh_early) { /* the early shared expert's join (recorded after its down), even after a failure */
        cudaError_t j = cudaStreamWaitEvent(st, ws->ev_join, 0);
        if (c == cudaSuccess && j != cudaSuccess) what = "cuda_grouped_gemm side stream join";
        if (c == cudaSuccess) c = j;
    }
    if (c != cudaSuccess) return cu_fail(e, c, what);
    if (midp) /* after a side-stream join without the attribute: the join is a full dependency
               * anyway, and a PDL node with mixed edge kinds is what the S11 audit (item 3) flagged */
        CU_TRY(e, cu_launch_pdl(pdl && !side, mg_combine_mid_kernel, dim3(M), dim3(256), 0, st, M, H, k, k + hs, (const bf16 *)dbuf, (bf16 *)a->y),
               "cuda_grouped_gemm combine");
    else
        mg_combine_kernel<<<M, 256, 0, st>>>(M, H, k, k + hs, dbuf, (bf16 *)a->y);
    CU_LAUNCHED(e, "cuda_grouped_gemm combine");
    if (a->topk_idx)
        CU_TRY(e, cudaMemcpyAsync(a->topk_idx, idx, sizeof(int32_t) * M * k, cudaMemcpyDeviceToDevice, st),
               "cuda_grouped_gemm top-k out");
    if (a->topk_w)
        CU_TRY(e, cudaMemcpy2DAsync(a->topk_w, sizeof(float) * k, wts, sizeof(float) * (k + 1), sizeof(float) * k, M,
                                    cudaMemcpyDeviceToDevice, st),
               "cuda_grouped_gemm top-k weights out");
    return 0;
}

static int mg_run(const moe_args *a, ls_stream s, ls_err *e) {
    const moe_w *w = a->w;
    if (a->M <= 0) return 0;
    if (a->dt != ACT_BF16) return errf(e, ERR_UNSUPPORTED, "cuda_grouped_gemm: activations must be BF16");
    if (w->router.kind != W_BF16)
        return errf(e, ERR_UNSUPPORTED, "cuda_grouped_gemm: router weight must be BF16, got %s",
                    w_kind_name(w->router.kind));
    if (w->has_sh_gate && w->sh_gate_w.kind != W_BF16)
        return errf(e, ERR_UNSUPPORTED, "cuda_grouped_gemm: shared_expert_gate must be BF16");
    if (w->top_k < 1 || w->top_k > MG_MAXK || w->top_k > w->n_experts || w->n_experts > MG_MAXE)
        return errf(e, ERR_UNSUPPORTED, "cuda_grouped_gemm: top_k %d of %d experts (needs top_k <= %d, E <= %d)",
                    w->top_k, w->n_experts, MG_MAXK, MG_MAXE);
    if (w->hidden % 16 || w->inter % 16 || w->inter <= 0 || (w->shared_inter > 0 && w->shared_inter % 16))
        return errf(e, ERR_UNSUPPORTED, "cuda_grouped_gemm: H=%d I=%d Is=%d must be multiples of 16", w->hidden,
                    w->inter, w->shared_inter);
    if (((uintptr_t)a->x & 15) || ((uintptr_t)a->y & 15) || (w->has_sh_gate && ((uintptr_t)w->sh_gate_w.data & 15)))
        return errf(e, ERR_UNSUPPORTED, "cuda_grouped_gemm: x, y and shared_expert_gate must be 16-byte aligned");
    mg_ws *ws;
    int rc = mg_lock(&ws, e);
    if (rc) return rc;
    rc = mg_run_locked(ws, a, (cudaStream_t)s, e);
    cu_ws_unlock(&ws->ws);
    return rc;
}

/* graph_safe: no host round trip, no synchronisation; the workspace and the expert tables are
 * made by the warm-up (rehearsal) call at the captured M, after which a call only launches
 * kernels (the router through cuBLASLt, itself capture-safe) */
const moe_impl moe_cuda_grouped_gemm = {"cuda_grouped_gemm", DEV_CUDA, 0, mg_supported, mg_run, 1};
