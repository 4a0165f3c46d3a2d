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
 * Here: one block of 16 warps an SM loops over work items. A warp owns whole 16-row weight
 * tiles over the full K (no partial sums meet across warps) and streams their 128-K chunks
 * through its own ring of D stages in shared memory (cp.async), D chunks ahead across tile
 * and item boundaries: the next tile's weights load while this one is decoded. The plan
 * tile's 16 token slots (x rows for gate/up, hbuf rows for down; zeros on padding slots) are
 * staged once per plan tile in shared memory, permuted for the decode's pairing
 * (nv4_xperm8); they are the mma's B columns (slots 0..7, and 8..15 when the tile has a real
 * row there).
 *   item:    (plan tile, part): NSW·16 16-row output tiles; warp w takes (part·NSW + j)·16 + w,
 *            j < NSW. Items are dealt to blocks in contiguous ranges, so a block's items
 *            mostly share their plan tile and its staged slots.
 *   gate/up: the gate and the up tile of the same rows against the same slots; epilogue
 *            silu(g)·u -> hbuf (BF16);
 *   down:    epilogue · s2 · wts[pair] -> dbuf at the pair.
 * Inputs and outputs are mv_kernel's (the expert table, the plan's tile_e / perm / n_tiles,
 * hbuf, dbuf), so the router, top-k, plan and combine are shared. Each output is one warp's
 * sum over K in mma order (a fixed order: deterministic), and a row's value does not depend
 * on how the items are dealt (graph replay = eager). */
#include "ops/cuda/cu_pdl.h"
#include "ops/cuda/cu_util.h"
#include "ops/cuda/moe_int.cuh"
#include "ops/cuda/nvfp4.cuh"

enum { MP_CH = 128, MP_WARPS = 16 };

template <bool GATEUP, int KCH, int D>
struct mp_smem {
    static constexpr int NQ = GATEUP ? 2 : 1, XW = KCH * MP_CH / 8;
    uint4 codes[MP_WARPS][D][NQ][2][32]; /* [warp][stage][gate, up][row g, g + 8][lane] */
    uint32_t sc[MP_WARPS][D][NQ][32];    /* E4M3 scales: 16 rows x 8 (lane i: row i/2, bytes 4(i%2)..) */
    uint4 xs[16][XW + 1];                /* [slot][8 K values], permuted; +16 B: rows g on distinct banks */
    int pair[16];
};

/* A position in a warp's chunk sequence: item it (absolute), output tile j of the item, chunk
 * c of K; with the item's expert and the warp's first output row. */
struct mp_pos {
    int it, j, c, tile, nrow0, live;
    const mg_expert *xp;
};

template <bool GATEUP, int KCH>
__device__ __forceinline__ void mp_locate(mp_pos &p, const mg_expert *__restrict__ tab,
                                          const int32_t *__restrict__ tile_e, int H, int nsw, int ipt, int warp) {
    p.tile = p.it / ipt;
    p.xp = &tab[tile_e[p.tile]];
    const int part = p.it - p.tile * ipt;
    const int N = GATEUP ? p.xp->inter : H, K = GATEUP ? H : p.xp->inter;
    p.nrow0 = ((part * nsw + p.j) * MP_WARPS + warp) * 16;
    p.live = p.nrow0 < N && K == KCH * MP_CH; /* a K other than the instance's writes nothing (the host checks) */
}

/* the next chunk: c, then j, then the item */
template <bool GATEUP, int KCH>
__device__ __forceinline__ void mp_step(mp_pos &p, const mg_expert *__restrict__ tab,
                                        const int32_t *__restrict__ tile_e, int H, int nsw, int ipt, int warp,
                                        int i1) {
    if (++p.c < KCH) return;
    p.c = 0;
    if (++p.j == nsw) {
        p.j = 0;
        p.it++;
    }
    if (p.it < i1) mp_locate<GATEUP, KCH>(p, tab, tile_e, H, nsw, ipt, warp);
}

/* grid (blocks <= SMs); block 32·MP_WARPS; dynamic shared memory sizeof(mp_smem). ipt items per plan
 * tile of nsw·8 output tiles each. Arguments otherwise as mv_kernel's. */
template <bool GATEUP, int KCH, int D>
__global__ void __launch_bounds__(32 * MP_WARPS, 1)
    mp_kernel(const mg_expert *__restrict__ tab, const int32_t *__restrict__ tile_e, const int32_t *__restrict__ perm,
              const int32_t *__restrict__ n_tiles, int H, int k, const bf16 *__restrict__ x, bf16 *__restrict__ hbuf,
              int ldh, const float *__restrict__ wts, bf16 *__restrict__ dbuf, int nsw, int ipt) {
    typedef mp_smem<GATEUP, KCH, D> S;
    constexpr int NQ = S::NQ, XW = S::XW, K = KCH * MP_CH;
    extern __shared__ __align__(16) unsigned char mp_dsm[];
    S &sm = *reinterpret_cast<S *>(mp_dsm);
    cu_pdl_wait(); /* (with PDL: the plan's tiles; gate/up's hbuf for down) */
    /* the next launch (down after gate/up, the combine after down) may become resident only as
     * these blocks exit (shared memory), and waits for this grid's completion before its reads */
    cu_pdl_trigger();
    const int n_items = n_tiles[0] * ipt, G = gridDim.x, b = blockIdx.x;
    const int i0 = (int)((long long)b * n_items / G), i1 = (int)((long long)(b + 1) * n_items / G);
    if (i0 >= i1) return; /* the whole block: no barrier is skipped by part of it */
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int T = (i1 - i0) * nsw * KCH; /* this warp's chunks */
    const size_t ldw = (size_t)K / 2, lds = (size_t)K / 16;

    /* the producer: chunk q (position pp) into stage q % D, one commit group per chunk (empty
     * past the end or on a tile the warp has no rows of), so that wait_group D - 1 means
     * "chunk q has landed" for every q */
    mp_pos pp = {i0, 0, 0, 0, 0, 0, nullptr};
    mp_locate<GATEUP, KCH>(pp, tab, tile_e, H, nsw, ipt, warp);
    auto issue = [&](int q) {
        if (q < T) {
            if (pp.live) {
                const int st = q % D;
#pragma unroll
                for (int u = 0; u < NQ; u++) {
                    const uint8_t *wb = GATEUP ? pp.xp->w[u] : pp.xp->w[2], *sb = GATEUP ? pp.xp->s[u] : pp.xp->s[2];
                    const uint8_t *wr = wb + (size_t)(pp.nrow0 + g) * ldw + pp.c * 64 + 16 * t;
                    cu_cp_async16(&sm.codes[warp][st][u][0][lane], wr);
                    cu_cp_async16(&sm.codes[warp][st][u][1][lane], wr + 8 * ldw);
                    nv4_cp_async4(&sm.sc[warp][st][u][lane],
                                  sb + (size_t)(pp.nrow0 + (lane >> 1)) * lds + pp.c * 8 + 4 * (lane & 1));
                }
            }
            mp_step<GATEUP, KCH>(pp, tab, tile_e, H, nsw, ipt, warp, i1);
        }
        cu_cp_async_commit();
    };
#pragma unroll 1
    for (int q = 0; q < D; q++) issue(q);

    mp_pos cp = {i0, 0, 0, 0, 0, 0, nullptr};
    mp_locate<GATEUP, KCH>(cp, tab, tile_e, H, nsw, ipt, warp);
    int staged = -1, two = 0;
    float acc[NQ][2][4];
#pragma unroll
    for (int u = 0; u < NQ; u++)
#pragma unroll
        for (int grp = 0; grp < 2; grp++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[u][grp][r] = 0.f;
#pragma unroll 1
    for (int q = 0; q < T; q++) {
        if (cp.c == 0 && cp.j == 0 && cp.tile != staged) { /* the same for every warp of the block */
            __syncthreads(); /* every warp is done with the previous tile's slots */
            if (tid < 16) sm.pair[tid] = perm[cp.tile * 16 + tid];
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
                    const bf16 *src = GATEUP ? x + (size_t)(p / (k + 1)) * H : hbuf + (size_t)(cp.tile * 16 + s) * ldh;
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
            staged = cp.tile;
        }
        cu_cp_async_wait<D - 1>(); /* chunk q has landed (this lane's copies) */
        __syncwarp();              /* and the other lanes' (the scales) */
        if (cp.live) {
            const int st = q % D;
            const uint16_t *s16[NQ];
#pragma unroll
            for (int u = 0; u < NQ; u++) s16[u] = reinterpret_cast<const uint16_t *>(sm.sc[warp][st][u]);
            uint4 xv[2][4];
#pragma unroll
            for (int i = 0; i < 4; i++) xv[0][i] = sm.xs[g][cp.c * (MP_CH / 8) + 4 * t + i];
            if (two) {
#pragma unroll
                for (int i = 0; i < 4; i++) xv[1][i] = sm.xs[8 + g][cp.c * (MP_CH / 8) + 4 * t + i];
#pragma unroll
                for (int u = 0; u < NQ; u++)
                    nv4_gemv2_chunk_g<2>(sm.codes[warp][st][u][0][lane], sm.codes[warp][st][u][1][lane],
                                         s16[u][4 * g + t], s16[u][4 * (g + 8) + t], xv, acc[u]);
            } else {
#pragma unroll
                for (int u = 0; u < NQ; u++)
                    nv4_gemv2_chunk_g<1>(sm.codes[warp][st][u][0][lane], sm.codes[warp][st][u][1][lane],
                                         s16[u][4 * g + t], s16[u][4 * (g + 8) + t], xv, acc[u]);
            }
        }
        __syncwarp(); /* every lane is done with stage q % D before it is refilled */
        issue(q + D);
        if (cp.c == KCH - 1) {
            if (cp.live) {
                /* c0, c1 = row g, slots 2t, 2t + 1; c2, c3 = row g + 8; the decoded weights carry 2^-8 */
                const mg_expert *xp = cp.xp;
#pragma unroll
                for (int grp = 0; grp < 2; grp++) {
                    if (grp == 1 && !two) break;
#pragma unroll
                    for (int r = 0; r < 4; r++) {
                        const int slot = 8 * grp + 2 * t + (r & 1), n = cp.nrow0 + g + 8 * (r >> 1);
                        const int p = sm.pair[slot];
                        if (p < 0) continue;
                        if (GATEUP) {
                            const float gg = acc[0][grp][r] * (xp->s2[0] * 256.f),
                                        uu = acc[NQ - 1][grp][r] * (xp->s2[1] * 256.f);
                            hbuf[(size_t)(cp.tile * 16 + slot) * ldh + n] =
                                __float2bfloat16_rn(gg / (1.f + __expf(-gg)) * uu);
                        } else {
                            dbuf[(size_t)p * H + n] = __float2bfloat16_rn(acc[0][grp][r] * (xp->s2[2] * 256.f * wts[p]));
                        }
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < NQ; u++)
#pragma unroll
                for (int grp = 0; grp < 2; grp++)
#pragma unroll
                    for (int r = 0; r < 4; r++) acc[u][grp][r] = 0.f;
        }
        mp_step<GATEUP, KCH>(cp, tab, tile_e, H, nsw, ipt, warp, i1);
    }
}

/* mp_launch has an instance for K (gate/up: K = H; down: K = I). Shared memory of an instance:
 * 16 warps x D stages x NQ x 1152 B + 16 x (K / 8 + 1) x 16 B (gate/up NQ = 2: K = 1024 D 5
 * 217 KB, 2048 D 4 213 KB, 3072 D 3 209 KB, 4096 D 2 205 KB; down: 512 D 8 164 KB, 768 D 8
 * 172 KB, 1024 D 8 180 KB, 1536 D 8 197 KB). */
int mp_has(bool gateup, int K) {
    return gateup ? K == 1024 || K == 2048 || K == 3072 || K == 4096 : K == 512 || K == 768 || K == 1024 || K == 1536;
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

template <bool GATEUP, int KCH, int D>
static cudaError_t mp_launch1(int n_out, int tiles_max, const mg_expert *tab, const int32_t *tile_e,
                              const int32_t *perm, const int32_t *nt, int H, int k, const bf16 *x, bf16 *hbuf, int ldh,
                              const float *wts, bf16 *dbuf, int pdl, cudaStream_t st) {
    const size_t smem = sizeof(mp_smem<GATEUP, KCH, D>);
    static unsigned raised; /* bit per device ordinal (< CU_WS_MAX_DEV) */
    int dev = 0;
    cudaError_t c = cudaGetDevice(&dev);
    if (c != cudaSuccess) return c;
    const int sms = mp_sms(dev);
    if (sms <= 0) return cudaErrorInvalidDevice;
    if (!(__atomic_load_n(&raised, __ATOMIC_ACQUIRE) >> dev & 1u)) {
        c = cudaFuncSetAttribute(mp_kernel<GATEUP, KCH, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (c != cudaSuccess) return c;
        __atomic_fetch_or(&raised, 1u << dev, __ATOMIC_RELEASE);
    }
    /* output tiles a warp takes per item: >= ~144 KB of weights an item (down: 256·nsw rows of
     * K NVFP4 values; gate/up: 256 rows of two matrices at K = H >= 1024 are already more) */
    const int K = KCH * MP_CH, rows = 16 * MP_WARPS;
    int nsw = GATEUP ? 1 : 1024 / K;
    if (nsw < 1) nsw = 1;
    while (nsw > 1 && nsw * rows > n_out) nsw /= 2;
    const int ipt = (n_out + rows * nsw - 1) / (rows * nsw);
    const long long items = (long long)tiles_max * ipt;
    const unsigned grid = (unsigned)(items < sms ? items : sms);
    if (grid == 0) return cudaSuccess;
    return cu_launch_pdl(pdl, mp_kernel<GATEUP, KCH, D>, dim3(grid), dim3(32 * MP_WARPS), smem, st, tab, tile_e, perm,
                         nt, H, k, x, hbuf, ldh, wts, dbuf, nsw, ipt);
}

/* The gate/up (GATEUP: K = H, n_out = the experts' I) or down (K = I, n_out = H) GEMM of the
 * launch by mp_kernel; the caller checked mp_has(GATEUP, K) (another K is
 * cudaErrorInvalidValue). */
template <bool GATEUP>
cudaError_t mp_launch(int K, int n_out, int tiles_max, const mg_expert *tab, const int32_t *tile_e,
                      const int32_t *perm, const int32_t *nt, int H, int k, const bf16 *x, bf16 *hbuf, int ldh,
                      const float *wts, bf16 *dbuf, int pdl, cudaStream_t st) {
#define MP_L(KCH, D)                                                                                                  \
    return mp_launch1<GATEUP, KCH, D>(n_out, tiles_max, tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts, dbuf, pdl, st)
    if constexpr (GATEUP) {
        if (K == 1024) MP_L(8, 5);
        if (K == 2048) MP_L(16, 4);
        if (K == 3072) MP_L(24, 3);
        if (K == 4096) MP_L(32, 2);
    } else {
        if (K == 512) MP_L(4, 8);
        if (K == 768) MP_L(6, 8);
        if (K == 1024) MP_L(8, 8);
        if (K == 1536) MP_L(12, 8);
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
