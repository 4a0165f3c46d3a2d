/* moe_midp.cu: the mid-batch NVFP4 expert GEMVs of cuda_grouped_gemm as one persistent,
 * pipelined grid per GEMM (LASTSTAND_MG_MIDP; moe_grouped.cu decides when it runs).
 *
 * Why: mv_kernel / mvd_kernel (moe_mid.cu) give each block one or a few 16-row weight tiles
 * (~36 KB): the block puts its weights in flight, waits, decodes, reduces and exits, and the
 * SM's next block starts from nothing. At 64-256 tokens (every expert touched, 1-8 rows each)
 * a decode step's MoE is a stream of such blocks; S17's ncu at 118 tokens measured gate/up at
 * 2.41 TB/s and down at 2.28 TB/s (56% / 53% of copy bandwidth): an SM has nothing in flight
 * while its blocks decode, reduce and start.
 *
 * Here: one block of 16 warps an SM loops over steps, a step being RT = 16 / KW 16-row output
 * tiles of one plan tile, each tile's K split over KW warps (mv_kernel's block shape, so that a
 * step requests whole weight rows at once). The warps stream their chunks through a ring of D
 * steps in shared memory (cp.async), D steps ahead across tile boundaries: the next steps'
 * weights load while this one is decoded, reduced and written. The plan tile's 16 token slots
 * (x rows for gate/up, hbuf rows for down; zeros on padding slots) are staged once per plan
 * tile in shared memory, permuted for the decode's pairing (nv4_xperm8); they are the mma's B
 * columns (slots 0..7, and 8..15 when the tile has a real row there). The launch's steps are
 * dealt to the blocks in contiguous ranges (one step of imbalance at most), so a block's
 * steps mostly share their plan tile and its staged slots.
 *   gate/up: the gate and the up tile of the same rows against the same slots; epilogue
 *            silu(g)·u -> hbuf (BF16);
 *   down:    epilogue · s2 · wts[pair] -> dbuf at the pair.
 * Inputs and outputs are mv_kernel's (the expert table, the plan's tile_e / perm / n_tiles,
 * hbuf, dbuf), so the router, top-k, plan and combine are shared. The KW partial sums of an
 * output meet in a fixed order (deterministic), and a row's value does not depend on how the
 * steps are dealt (graph replay = eager).
 *
 * The first form (S18 device round 1-2, not kept): each warp a whole 16-row tile over all of
 * K, chunk by chunk, no cross-warp reduction: 1.5-1.6 TB/s (8 and 16 warps), slower than
 * mv_kernel. A warp sweeping its 16 rows 64 bytes at a time left the DRAM reading every row
 * in 16 separate pieces (ncu: DRAM 33%, half the cycles with no eligible warp). */
#include "ops/cuda/cu_pdl.h"
#include "ops/cuda/cu_util.h"
#include "ops/cuda/moe_int.cuh"
#include "ops/cuda/nvfp4.cuh"

enum { MP_CH = 128, MP_WARPS = 16 };

/* KW warps split K (PER chunks each), RT = 16 / KW row tiles a step; D steps in the ring;
 * NRED reduction buffers (2: one barrier a step, 1: two). */
template <bool GATEUP, int KCH, int KW, int D, int NRED>
struct mp_smem {
    static constexpr int NQ = GATEUP ? 2 : 1, XW = KCH * MP_CH / 8, PER = KCH / KW;
    uint4 codes[D][MP_WARPS][PER][NQ][2][32]; /* [stage][warp][chunk][gate, up][row g, g + 8][lane] */
    uint32_t sc[D][MP_WARPS][PER][NQ][32];    /* E4M3 scales: 16 rows x 8 (lane i: row i/2, bytes 4(i%2)..) */
    float red[NRED][MP_WARPS][NQ][2][16][8];  /* partial sums [buffer][warp][gate, up][slot group][row][slot] */
    uint4 xs[16][XW + 1];                     /* [slot][8 K values], permuted; +16 B: rows g on distinct banks */
    int pair[16];
};

/* grid (blocks <= SMs); block 32·MP_WARPS; dynamic shared memory sizeof(mp_smem). The launch's
 * steps (n_tiles[0] plan tiles x spt steps of RT 16-row output tiles each) are dealt to the
 * blocks in contiguous ranges. Arguments otherwise as mv_kernel's. */
template <bool GATEUP, int KCH, int KW, int D, int NRED>
__global__ void __launch_bounds__(32 * MP_WARPS, 1)
    mp_kernel(const mg_expert *__restrict__ tab, const int32_t *__restrict__ tile_e, const int32_t *__restrict__ perm,
              const int32_t *__restrict__ n_tiles, int H, int k, const bf16 *__restrict__ x, bf16 *__restrict__ hbuf,
              int ldh, const float *__restrict__ wts, bf16 *__restrict__ dbuf, int spt) {
    typedef mp_smem<GATEUP, KCH, KW, D, NRED> S;
    constexpr int NQ = S::NQ, XW = S::XW, PER = S::PER, RT = MP_WARPS / KW, K = KCH * MP_CH;
    static_assert(KCH % KW == 0 && MP_WARPS % KW == 0, "mp_kernel: KW must divide KCH and the warps");
    extern __shared__ __align__(16) unsigned char mp_dsm[];
    S &sm = *reinterpret_cast<S *>(mp_dsm);
    cu_pdl_wait(); /* (with PDL: the plan's tiles; gate/up's hbuf for down) */
    /* the next launch (down after gate/up, the combine after down) becomes resident only as
     * these blocks exit (shared memory), and waits for this grid's completion before its reads */
    cu_pdl_trigger();
    const int n_steps = n_tiles[0] * spt, G = gridDim.x, b = blockIdx.x;
    const int s0 = (int)((long long)b * n_steps / G), s1 = (int)((long long)(b + 1) * n_steps / G);
    if (s0 >= s1) return; /* the whole block: no barrier is skipped by part of it */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int rt = warp / KW, kw = warp - rt * KW, c0 = kw * PER;
    const int T = s1 - s0;
    const size_t ldw = (size_t)K / 2, lds = (size_t)K / 16;

    /* the producer: this warp's PER chunks of step q into stage q % D, one commit group a step
     * (empty past the end or where the warp has no rows), so that wait_group D - 1 means "step
     * q has landed" for every q */
    auto issue = [&](int q) {
        if (q < T) {
            const int st = s0 + q, tile = st / spt, sub = st - tile * spt;
            const mg_expert *xp = &tab[tile_e[tile]];
            const int N = GATEUP ? xp->inter : H, Kx = GATEUP ? H : xp->inter;
            const int nrow0 = (sub * RT + rt) * 16, sg = q % D;
            if (nrow0 < N && Kx == K) {
#pragma unroll
                for (int u = 0; u < PER; u++)
#pragma unroll
                    for (int m = 0; m < NQ; m++) {
                        const uint8_t *wb = GATEUP ? xp->w[m] : xp->w[2], *sb = GATEUP ? xp->s[m] : xp->s[2];
                        const uint8_t *wr = wb + (size_t)(nrow0 + g) * ldw + (c0 + u) * 64 + 16 * t;
                        cu_cp_async16(&sm.codes[sg][warp][u][m][0][lane], wr);
                        cu_cp_async16(&sm.codes[sg][warp][u][m][1][lane], wr + 8 * ldw);
                        nv4_cp_async4(&sm.sc[sg][warp][u][m][lane],
                                      sb + (size_t)(nrow0 + (lane >> 1)) * lds + (c0 + u) * 8 + 4 * (lane & 1));
                    }
            }
        }
        cu_cp_async_commit();
    };
#pragma unroll 1
    for (int q = 0; q < D; q++) issue(q);

    int staged = -1, two = 0;
#pragma unroll 1
    for (int q = 0; q < T; q++) {
        const int st = s0 + q, tile = st / spt, sub = st - tile * spt;
        if (tile != staged) { /* the same for every warp of the block */
            __syncthreads(); /* every thread is done with the previous tile's slots and pairs */
            if (tid < 16) sm.pair[tid] = perm[tile * 16 + tid];
            __syncthreads();
            /* every load in flight before the first store: one L2 round trip a restage */
            constexpr int NV = (16 * XW + 32 * MP_WARPS - 1) / (32 * MP_WARPS);
            uint4 v[NV];
#pragma unroll
            for (int u = 0; u < NV; u++) {
                const int i = tid + u * 32 * MP_WARPS, s = i / XW, cc = i - s * XW;
                const int p = i < 16 * XW ? sm.pair[s] : -1;
                v[u] = make_uint4(0u, 0u, 0u, 0u);
                if (p >= 0) {
                    const bf16 *src = GATEUP ? x + (size_t)(p / (k + 1)) * H : hbuf + (size_t)(tile * 16 + s) * ldh;
                    v[u] = __ldg(reinterpret_cast<const uint4 *>(src) + cc);
                }
            }
#pragma unroll
            for (int u = 0; u < NV; u++) {
                const int i = tid + u * 32 * MP_WARPS, s = i / XW, cc = i - s * XW;
                if (i < 16 * XW) sm.xs[s][cc] = nv4_xperm8(v[u]);
            }
            __syncthreads();
            two = 0;
#pragma unroll
            for (int s = 8; s < 16; s++) two |= sm.pair[s] >= 0;
            staged = tile;
        }
        const mg_expert *xp = &tab[tile_e[tile]];
        const int N = GATEUP ? xp->inter : H, Kx = GATEUP ? H : xp->inter;
        const int nrow0 = (sub * RT + rt) * 16;
        float acc[NQ][2][4];
#pragma unroll
        for (int m = 0; m < NQ; m++)
#pragma unroll
            for (int grp = 0; grp < 2; grp++)
#pragma unroll
                for (int r = 0; r < 4; r++) acc[m][grp][r] = 0.f;
        cu_cp_async_wait<D - 1>(); /* step q has landed (this lane's copies) */
        __syncwarp();              /* and the other lanes' (the scales) */
        if (nrow0 < N && Kx == K) {
            const int sg = q % D;
#pragma unroll
            for (int u = 0; u < PER; u++) {
                uint4 xv[2][4];
#pragma unroll
                for (int i = 0; i < 4; i++) xv[0][i] = sm.xs[g][(c0 + u) * (MP_CH / 8) + 4 * t + i];
                if (two) {
#pragma unroll
                    for (int i = 0; i < 4; i++) xv[1][i] = sm.xs[8 + g][(c0 + u) * (MP_CH / 8) + 4 * t + i];
                }
#pragma unroll
                for (int m = 0; m < NQ; m++) {
                    const uint16_t *s16 = reinterpret_cast<const uint16_t *>(sm.sc[sg][warp][u][m]);
                    if (two)
                        nv4_gemv2_chunk_g<2>(sm.codes[sg][warp][u][m][0][lane], sm.codes[sg][warp][u][m][1][lane],
                                             s16[4 * g + t], s16[4 * (g + 8) + t], xv, acc[m]);
                    else
                        nv4_gemv2_chunk_g<1>(sm.codes[sg][warp][u][m][0][lane], sm.codes[sg][warp][u][m][1][lane],
                                             s16[4 * g + t], s16[4 * (g + 8) + t], xv, acc[m]);
                }
            }
        }
        __syncwarp(); /* every lane is done with stage q % D before it is refilled */
        issue(q + D);
        /* c0, c1 = row g, slots 2t, 2t + 1; c2, c3 = row g + 8 */
        float(*red)[NQ][2][16][8] = sm.red[NRED == 2 ? (q & 1) : 0];
#pragma unroll
        for (int m = 0; m < NQ; m++)
#pragma unroll
            for (int grp = 0; grp < 2; grp++) {
                red[warp][m][grp][g][2 * t] = acc[m][grp][0];
                red[warp][m][grp][g][2 * t + 1] = acc[m][grp][1];
                red[warp][m][grp][g + 8][2 * t] = acc[m][grp][2];
                red[warp][m][grp][g + 8][2 * t + 1] = acc[m][grp][3];
            }
        __syncthreads();
        /* outputs (row tile ort, row, slot): row fastest; the KW partial sums in a fixed order;
         * the decoded weights carry 2^-8 */
        for (int o = tid; o < RT * 16 * 16; o += 32 * MP_WARPS) {
            const int row = o & 15, slot = (o >> 4) & 15, ort = o >> 8;
            const int p = sm.pair[slot], grp = slot >> 3, s8 = slot & 7;
            const int n = (sub * RT + ort) * 16 + row;
            if (p < 0 || n >= N || Kx != K) continue;
            float v0 = 0.f, v1 = 0.f;
#pragma unroll
            for (int w = 0; w < KW; w++) {
                v0 += red[ort * KW + w][0][grp][row][s8];
                if (GATEUP) v1 += red[ort * KW + w][NQ - 1][grp][row][s8];
            }
            if (GATEUP) {
                const float gg = v0 * (xp->s2[0] * 256.f), uu = v1 * (xp->s2[1] * 256.f);
                hbuf[(size_t)(tile * 16 + slot) * ldh + n] = __float2bfloat16_rn(gg / (1.f + __expf(-gg)) * uu);
            } else {
                dbuf[(size_t)p * H + n] = __float2bfloat16_rn(v0 * (xp->s2[2] * 256.f * wts[p]));
            }
        }
        if (NRED == 1) __syncthreads(); /* the partial sums are read before the next step writes them */
    }
}

/* mp_launch has an instance for K (gate/up: K = H; down: K = I): KW, D, NRED and shared memory
 * (D x 16 warps x PER x NQ x 1152 B + NRED x 16 x NQ x 4 KB + 16 x (K / 8 + 1) x 16 B):
 *   gate/up K = 1024  KW 8  (2 row tiles a step)  D 4  NRED 1  213 KB
 *           K = 2048  KW 16 (1)                   D 3  NRED 1  209 KB
 *   down    K = 512   KW 4  (4)                   D 8  NRED 2  196 KB
 *           K = 768   KW 2  (8, 3 chunks a warp)  D 3  NRED 2  224 KB
 *           K = 1024  KW 8  (2)                   D 8  NRED 2  213 KB
 *           K = 1536  KW 4  (4, 3 chunks a warp)  D 2  NRED 2  192 KB
 * H = 3072 and 4096 (the 122B, 397B, 235B) have none: the slots of a plan tile (16 x K BF16)
 * and a ring deep enough do not fit beside each other; those keep mv_kernel. */
int mp_has(bool gateup, int K) {
    return gateup ? K == 1024 || K == 2048 : K == 512 || K == 768 || K == 1024 || K == 1536;
}

/* the SMs of the current device (cached per ordinal), 0 on an error */
static int mp_sms(int dev) {
    static int n[CU_WS_MAX_DEV];
    if (dev < 0 || dev >= CU_WS_MAX_DEV) return 0;
    int v = __atomic_load_n(&n[dev], __ATOMIC_ACQUIRE);
    if (v > 0) return v;
    if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || v <= 0) return 0;
    __atomic_store_n(&n[dev], v, __ATOMIC_RELEASE);
    return v;
}

template <bool GATEUP, int KCH, int KW, int D, int NRED>
static cudaError_t mp_launch1(int n_out, int tiles_max, const mg_expert *tab, const int32_t *tile_e,
                              const int32_t *perm, const int32_t *nt, int H, int k, const bf16 *x, bf16 *hbuf, int ldh,
                              const float *wts, bf16 *dbuf, int pdl, cudaStream_t st) {
    const size_t smem = sizeof(mp_smem<GATEUP, KCH, KW, D, NRED>);
    static_assert(sizeof(mp_smem<GATEUP, KCH, KW, D, NRED>) <= 227 * 1024, "mp_kernel: over an SM's shared memory");
    static unsigned raised; /* bit per device ordinal (< CU_WS_MAX_DEV) */
    int dev = 0;
    cudaError_t c = cudaGetDevice(&dev);
    if (c != cudaSuccess) return c;
    const int sms = mp_sms(dev);
    if (sms <= 0) return cudaErrorInvalidDevice;
    if (!(__atomic_load_n(&raised, __ATOMIC_ACQUIRE) >> dev & 1u)) {
        c = cudaFuncSetAttribute(mp_kernel<GATEUP, KCH, KW, D, NRED>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem);
        if (c != cudaSuccess) return c;
        __atomic_fetch_or(&raised, 1u << dev, __ATOMIC_RELEASE);
    }
    const int rows = 16 * (MP_WARPS / KW), spt = (n_out + rows - 1) / rows; /* steps a plan tile */
    const long long steps = (long long)tiles_max * spt;
    const unsigned grid = (unsigned)(steps < sms ? steps : sms);
    if (grid == 0) return cudaSuccess;
    return cu_launch_pdl(pdl, mp_kernel<GATEUP, KCH, KW, D, NRED>, dim3(grid), dim3(32 * MP_WARPS), smem, st, tab,
                         tile_e, perm, nt, H, k, x, hbuf, ldh, wts, dbuf, spt);
}

/* The gate/up (GATEUP: K = H, n_out = the experts' I) or down (K = I, n_out = H) GEMM of the
 * launch by mp_kernel; the caller checked mp_has(GATEUP, K) (another K is
 * cudaErrorInvalidValue). */
template <bool GATEUP>
cudaError_t mp_launch(int K, int n_out, int tiles_max, const mg_expert *tab, const int32_t *tile_e,
                      const int32_t *perm, const int32_t *nt, int H, int k, const bf16 *x, bf16 *hbuf, int ldh,
                      const float *wts, bf16 *dbuf, int pdl, cudaStream_t st) {
#define MP_L(KCH, KW, D, NRED)                                                                                       \
    return mp_launch1<GATEUP, KCH, KW, D, NRED>(n_out, tiles_max, tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts,   \
                                                dbuf, pdl, st)
    if constexpr (GATEUP) {
        if (K == 1024) MP_L(8, 8, 4, 1);
        static int d2 = -1; /* LASTSTAND_MG_MIDP_D2=1: the ring 2 steps deep (172 KB; a device-round probe) */
        if (d2 < 0) d2 = cu_env_switch("LASTSTAND_MG_MIDP_D2", 0);
        if (K == 2048 && d2) MP_L(16, 16, 2, 1);
        if (K == 2048) MP_L(16, 16, 3, 1);
    } else {
        if (K == 512) MP_L(4, 4, 8, 2);
        if (K == 768) MP_L(6, 2, 3, 2);
        if (K == 1024) MP_L(8, 8, 8, 2);
        if (K == 1536) MP_L(12, 4, 2, 2);
    }
#undef MP_L
    return cudaErrorInvalidValue;
}

template cudaError_t mp_launch<true>(int, int, int, const mg_expert *, const int32_t *, const int32_t *,
                                     const int32_t *, int, int, const bf16 *, bf16 *, int, const float *, bf16 *, int,
                                     cudaStream_t);
template cudaError_t mp_launch<false>(int, int, int, const mg_expert *, const int32_t *, const int32_t *,
                                      const int32_t *, int, int, const bf16 *, bf16 *, int, const float *, bf16 *, int,
                                      cudaStream_t);
