/* moe_mid.cu: the mid-batch path of cuda_grouped_gemm (moe_grouped.cu), LASTSTAND_MG_MID:
 * at 1-4 rows per expert (M = 9..64 tokens on the Qwen3.5 shapes; bench/RESULTS.md "MoE at
 * 9..64 tokens") the grouped GEMMs are GEMVs per expert, so the grouped GEMM's plan and
 * 16-row tiles are run by GEMV kernels instead:
 *   mv_kernel    NVFP4 gate/up (K = H) and down (K = I): a warp per 16-row weight tile and a
 *                slice of K, the tile's tokens in the mma's B columns, partial sums meeting in
 *                shared memory in a fixed order;
 *   mvd_kernel   NVFP4 down with a whole K per warp (LASTSTAND_MG_MIDDN=2, the default);
 *   mvb_kernel   a BF16 shared expert next to NVFP4 experts (its own launches, side stream);
 *   mr_kernel    the router, logits [M, E] fp32, instead of cuBLASLt.
 * Inputs and outputs are the grouped GEMM's: the expert table (mg_expert, moe_int.cuh), the
 * plan's tile_e / perm / n_tiles, hbuf [R, ldh] and dbuf [M·(k+1), H] BF16, so the top-k, the
 * plan and the combine (moe_grouped.cu) are shared and the results are the same; every sum
 * has a fixed order (deterministic). Which path runs, and the knobs, are decided by
 * moe_grouped.cu (mg_knobs, mg_run_locked, mg_gemms) through the launchers below (declared
 * in moe_int.cuh); each launcher returns the launch's cudaError_t (mr_launch: 0 when no
 * instance fits, then the caller uses cuBLASLt). Kernels read the plan with programmatic
 * dependent launch (cu_pdl.h) when launched with it; no host round trip, capturable.
 */
#include "ops/cuda/cu_pdl.h"
#include "ops/cuda/cu_util.h"
#include "ops/cuda/moe_int.cuh"
#include "ops/cuda/nvfp4.cuh"

/* ---- 4', 5': the mid-batch GEMVs (LASTSTAND_MG_MID) ------------------------------ */

/* At 1-2 real rows per 16-row tile (M = 9..64 on the Qwen3.5 shapes) the grouped GEMM is a
 * weight-streaming GEMV per expert whose mma tiles are mostly padding and whose per-k-block
 * overhead (A tile staging and permutes, 16 mma of 16 rows for 32 weight rows, the cp.async
 * ring's address work) is half of its instructions. These kernels do the GEMMs the way the
 * M = 1..8 GEMV does (nvfp4.cuh nv4_w4_chunk, fp4_gemv2_kernel): a warp owns a 16-row weight
 * tile (mma A operand, NVFP4 decoded by bit placement, the block scale by one HMUL2 per pair)
 * over PER chunks of 128 K, the plan tile's tokens are the mma's B columns (slots 0..7, and
 * 8..15 only when the tile has a real row there), KW warps split K and meet in shared memory
 * in a fixed order (deterministic). Every weight byte of the block is put in flight by
 * cp.async at entry (no ring), the tokens' x fragments are loaded into registers under it.
 * Same plan, tile table, hbuf / dbuf layout and combine as the grouped GEMM (BM = 16 tiles),
 * so the BF16 shared expert's side-stream launches are unchanged.
 *   gate/up: block = one 16-row tile of gate and the same 16 rows of up (both decoded per
 *            chunk against the same x), KW warps along K = H; epilogue silu(g)·u -> hbuf.
 *   down:    block = RT 16-row tiles of the output (H) x KW warps along K = I; epilogue
 *            · s2d · wts[pair] -> dbuf at the pair.
 * Instances (mv_cfg): gate/up K = 1024, 2048, 3072 (8 warps x 1, 2, 3 chunks), 4096 (16 x 2);
 * down K = 512 (4 warps x 1 chunk x 2 tiles), 768 (2 x 3 x 4), 1024 (4 x 2 x 2), 1536 (4 x 3 x
 * 2); mvd_kernel (a whole K a warp) at K = 512, 768, 1024. Other shapes keep the grouped GEMM. */
enum { MV_CH = 128 };

/* cp.async.wait_group with a run-time count (the chunk loop is unrolled: u is constant) */
__device__ __forceinline__ void mv_wait(int pending) {
    if (pending <= 0) asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    else if (pending == 1) asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    else if (pending == 2) asm volatile("cp.async.wait_group 2;\n" ::: "memory");
    else if (pending == 3) asm volatile("cp.async.wait_group 3;\n" ::: "memory");
    else if (pending == 4) asm volatile("cp.async.wait_group 4;\n" ::: "memory");
    else if (pending == 5) asm volatile("cp.async.wait_group 5;\n" ::: "memory");
    else if (pending == 6) asm volatile("cp.async.wait_group 6;\n" ::: "memory");
    else asm volatile("cp.async.wait_group 7;\n" ::: "memory");
}

/* Shared memory of one block: NW = KW·RT warps, NQ = 2 (gate, up) or 1 weight tiles per warp.
 * The reduction buffer reuses the stage once every warp is done with it. */
template <bool GATEUP, int KW, int PER, int RT>
struct mv_smem {
    static constexpr int NW = KW * RT, NQ = GATEUP ? 2 : 1;
    union {
        struct {
            uint4 codes[NW][PER][NQ][2][32]; /* lane's 16 B of rows g, g + 8 */
            uint32_t sc[NW][PER][NQ][32];    /* E4M3 scales: 16 rows x 8 (lane i: row i/2, bytes 4(i%2)..) */
        } st;
        float red[NW][NQ][2][16][8];         /* partial sums [warp][tile][slot group][row][slot] */
    } u;
    int pair[16];
    int two; /* a real row among slots 8..15 */
};

/* One chunk of G slot groups against the 16-row tile (w0, w1: rows g, g + 8; s0, s1: their
 * two scales): decoded once, G x 8 mma. xv[grp][q]: token slot 8·grp + g's x, elements 8q..
 * 8q + 7 of the lane's 32-element slice, permuted (nv4_xperm8). acc[grp]: as nv4_w4_chunk. */
template <int G>
__device__ __forceinline__ void mv_chunk(uint4 w0, uint4 w1, uint16_t s0, uint16_t s1, const uint4 (*xv)[4],
                                         float (*acc)[4]) {
    uint32_t sa0, sb0, sa1, sb1;
    nv4_scale2_bf16x2_x118(s0, sa0, sb0);
    nv4_scale2_bf16x2_x118(s1, sa1, sb1);
    const uint32_t q0[4] = {w0.x, w0.y, w0.z, w0.w}, q1[4] = {w1.x, w1.y, w1.z, w1.w};
#pragma unroll
    for (int q = 0; q < 4; q++) {
        uint32_t a0[4], a1[4];
        nv4_e2m1x8_place(q0[q], a0);
        nv4_e2m1x8_place(q1[q], a1);
#pragma unroll
        for (int r = 0; r < 4; r++) {
            a0[r] = nv4_hmul2(a0[r], q < 2 ? sa0 : sb0);
            a1[r] = nv4_hmul2(a1[r], q < 2 ? sa1 : sb1);
        }
        const uint32_t f0[4] = {a0[0], a1[0], a0[1], a1[1]}, f1[4] = {a0[2], a1[2], a0[3], a1[3]};
#pragma unroll
        for (int grp = 0; grp < G; grp++) {
            nv4_mma_16816(acc[grp], f0, xv[grp][q].x, xv[grp][q].y, acc[grp]);
            nv4_mma_16816(acc[grp], f1, xv[grp][q].z, xv[grp][q].w, acc[grp]);
        }
    }
}

/* Token slot s's x fragment for chunk c (K order -> the decode's pairing), or zeros for a
 * padding slot: gate/up reads x[token], down reads hbuf[row r0 + s]. */
template <bool GATEUP>
__device__ __forceinline__ void mv_load_x(uint4 (&xv)[4], int p, int s, int r0, int c, int t, int H, int k,
                                          const bf16 *__restrict__ x, const bf16 *__restrict__ hbuf, int ldh) {
    if (p < 0) {
#pragma unroll
        for (int q = 0; q < 4; q++) xv[q] = make_uint4(0u, 0u, 0u, 0u);
        return;
    }
    const bf16 *src = (GATEUP ? x + (size_t)(p / (k + 1)) * H : hbuf + (size_t)(r0 + s) * ldh) + c * MV_CH + 32 * t;
#pragma unroll
    for (int q = 0; q < 4; q++) xv[q] = nv4_xperm8(__ldg(reinterpret_cast<const uint4 *>(src) + q));
}

/* grid (N / (16·RT), tiles_max); block 32·KW·RT threads; K = KW·PER·128 for every expert of
 * the launch (the host checks). Arguments as mg_gemm_kernel. */
template <bool GATEUP, int KW, int PER, int RT, bool LEAN, int MINB>
__global__ void __launch_bounds__(32 * KW * RT, MINB)
    mv_kernel(const mg_expert *__restrict__ tab, const int32_t *__restrict__ tile_e, const int32_t *__restrict__ perm,
              const int32_t *__restrict__ n_tiles, int H, int k, const bf16 *__restrict__ x, bf16 *__restrict__ hbuf,
              int ldh, const float *__restrict__ wts, bf16 *__restrict__ dbuf, int sh_only, int late) {
    typedef mv_smem<GATEUP, KW, PER, RT> S;
    constexpr int NQ = S::NQ;
    extern __shared__ __align__(16) unsigned char mv_dsm[];
    S &sm = *reinterpret_cast<S *>(mv_dsm);
    /* LEAN: the partial sums past the stage (no barrier before writing them), the slots read
     * by each warp (no barrier at entry): one __syncthreads in all */
    float(*red)[S::NQ][2][16][8] =
        LEAN ? reinterpret_cast<float(*)[S::NQ][2][16][8]>(mv_dsm + sizeof(S)) : sm.u.red;
    /* late (pdl 2, mv_launch): the next kernel is let go only after this block's wait, so that the
     * plan (two kernels back) is complete when it starts: mvd_kernel reads it before its own wait */
    if (!late) cu_pdl_trigger();
    cu_pdl_wait(); /* (with PDL: the plan's tiles, gate/up's hbuf) */
    if (late) cu_pdl_trigger();
    const int tile = blockIdx.y + (sh_only ? n_tiles[1] : 0);
    if (tile >= n_tiles[0]) return;
    const mg_expert *xp = &tab[tile_e[tile]];
    const int N = GATEUP ? xp->inter : H, K = GATEUP ? H : xp->inter;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int rt = warp / KW, kw = warp % KW;
    const int nrow0 = (blockIdx.x * RT + rt) * 16; /* this warp's 16 output rows */
    const bool live = nrow0 < N && K == KW * PER * MV_CH;
    const int c0 = kw * PER, r0 = tile * 16;
    /* weights first: codes of rows g, g + 8 and the 16 rows' scales, one group per chunk */
    if (live) {
        const size_t ldw = (size_t)K / 2, lds = (size_t)K / 16;
#pragma unroll
        for (int u = 0; u < PER; u++) {
#pragma unroll
            for (int q = 0; q < NQ; q++) {
                const uint8_t *wb = GATEUP ? xp->w[q] : xp->w[2], *sb = GATEUP ? xp->s[q] : xp->s[2];
                const uint8_t *wr = wb + (size_t)(nrow0 + g) * ldw + (c0 + u) * 64 + 16 * t;
                cu_cp_async16(&sm.u.st.codes[warp][u][q][0][lane], wr);
                cu_cp_async16(&sm.u.st.codes[warp][u][q][1][lane], wr + 8 * ldw);
                nv4_cp_async4(&sm.u.st.sc[warp][u][q][lane],
                              sb + (size_t)(nrow0 + (lane >> 1)) * lds + (c0 + u) * 8 + 4 * (lane & 1));
            }
            cu_cp_async_commit();
        }
    }
    int two, pl = -1; /* LEAN: lane i < 16 holds slot i's pair */
    if constexpr (LEAN) {
        if (lane < 16) pl = perm[r0 + lane];
        two = __any_sync(0xffffffffu, lane >= 8 && pl >= 0);
        if (warp == 0 && lane < 16) sm.pair[lane] = pl; /* for the epilogue, after its barrier */
    } else {
        if (tid < 16) {
            const int p = perm[r0 + tid];
            sm.pair[tid] = p;
            if (tid == 8) sm.two = 0;
        }
        __syncthreads();
        if (tid >= 8 && tid < 16 && sm.pair[tid] >= 0) sm.two = 1; /* benign race: all write 1 */
        __syncthreads();
        two = sm.two;
    }
    float acc[NQ][2][4];
#pragma unroll
    for (int q = 0; q < NQ; q++)
#pragma unroll
        for (int grp = 0; grp < 2; grp++)
#pragma unroll
            for (int r = 0; r < 4; r++) acc[q][grp][r] = 0.f;
    if (live) {
        /* pass 0: slots 0..7 (as the chunks land); pass 1, only when a slot 8..15 is real: the
         * same staged weights decoded again against those slots (rare at these batch sizes:
         * a tile past 8 rows; the shared expert's tiles when it is in the launch) */
#pragma unroll
        for (int pass = 0; pass < 2; pass++) {
            if (pass == 1 && !two) break;
            uint4 xv[PER][1][4]; /* slot 8·pass + g's x, every chunk of this warp */
            const int s = 8 * pass + g;
            const int ps = LEAN ? __shfl_sync(0xffffffffu, pl, s) : sm.pair[s];
#pragma unroll
            for (int u = 0; u < PER; u++) mv_load_x<GATEUP>(xv[u][0], ps, s, r0, c0 + u, t, H, k, x, hbuf, ldh);
#pragma unroll
            for (int u = 0; u < PER; u++) {
                if (pass == 0) {
                    mv_wait(PER - 1 - u);
                    __syncwarp(); /* scales of chunk u were copied by other lanes */
                }
#pragma unroll
                for (int q = 0; q < NQ; q++) {
                    const uint16_t *s16 = reinterpret_cast<const uint16_t *>(sm.u.st.sc[warp][u][q]);
                    mv_chunk<1>(sm.u.st.codes[warp][u][q][0][lane], sm.u.st.codes[warp][u][q][1][lane],
                                s16[4 * g + t], s16[4 * (g + 8) + t], xv[u], &acc[q][pass]);
                }
            }
        }
    }
    if (!LEAN) __syncthreads(); /* every warp is done with the stage: the reduction buffer reuses it */
#pragma unroll
    for (int q = 0; q < NQ; q++)
#pragma unroll
        for (int grp = 0; grp < 2; grp++) {
            /* c0, c1 = row g, slots 2t, 2t + 1; c2, c3 = row g + 8 */
            red[warp][q][grp][g][2 * t] = acc[q][grp][0];
            red[warp][q][grp][g][2 * t + 1] = acc[q][grp][1];
            red[warp][q][grp][g + 8][2 * t] = acc[q][grp][2];
            red[warp][q][grp][g + 8][2 * t + 1] = acc[q][grp][3];
        }
    __syncthreads();
    /* outputs (tile rt, row, slot): row fastest (16 consecutive outputs per slot) */
    for (int o = tid; o < RT * 16 * 16; o += 32 * KW * RT) {
        const int row = o & 15, slot = (o >> 4) & 15, ort = o >> 8;
        const int p = sm.pair[slot], grp = slot >> 3, s8 = slot & 7;
        const int n = (blockIdx.x * RT + ort) * 16 + row;
        if (p < 0 || n >= N || K != KW * PER * MV_CH) continue;
        float v0 = 0.f, v1 = 0.f;
#pragma unroll
        for (int w = 0; w < KW; w++) { /* fixed order: deterministic */
            v0 += red[ort * KW + w][0][grp][row][s8];
            if (GATEUP) v1 += red[ort * KW + w][NQ - 1][grp][row][s8];
        }
        if (GATEUP) {
            /* the decoded weights carry 2^-8 */
            const float gg = v0 * (xp->s2[0] * 256.f), uu = v1 * (xp->s2[1] * 256.f);
            hbuf[(size_t)(r0 + slot) * ldh + n] = __float2bfloat16_rn(gg / (1.f + __expf(-gg)) * uu);
        } else {
            dbuf[(size_t)p * H + n] = __float2bfloat16_rn(v0 * (xp->s2[2] * 256.f * wts[p]));
        }
    }
}

/* The mid-batch instance for K (mv_kernel's KW, PER, RT), or {0} when there is none. */
mv_cfg mv_pick(bool gateup, int K) {
    mv_cfg c = {0, 0, 0};
    if (gateup) {
        if (K == 1024) c = (mv_cfg){8, 1, 1};
        else if (K == 2048) c = (mv_cfg){8, 2, 1};
        else if (K == 3072) c = (mv_cfg){8, 3, 1}; /* Qwen3.5-122B-A10B */
        else if (K == 4096) c = (mv_cfg){16, 2, 1};
    } else {
        if (K == 512) c = (mv_cfg){4, 1, 2};
        else if (K == 768) c = (mv_cfg){2, 3, 4}; /* Qwen3-30B-A3B */
        else if (K == 1024) c = (mv_cfg){4, 2, 2};
        else if (K == 1536) c = (mv_cfg){4, 3, 2}; /* Qwen3-235B-A22B */
    }
    return c;
}

template <bool GATEUP, int KW, int PER, int RT, bool LEAN = false, int MINB = 3>
static cudaError_t mv_launch1(int n_out, int tiles_max, const mg_expert *tab, const int32_t *tile_e,
                              const int32_t *perm, const int32_t *nt, int H, int k, const bf16 *x, bf16 *hbuf, int ldh,
                              const float *wts, bf16 *dbuf, int sh_only, int pdl, cudaStream_t st) {
    typedef mv_smem<GATEUP, KW, PER, RT> S;
    const size_t smem = sizeof(S) + (LEAN ? sizeof(((S *)0)->u.red) : 0);
    static unsigned raised; /* bit per device ordinal (< CU_WS_MAX_DEV) */
    int dev = 0;
    cudaError_t c = cudaGetDevice(&dev);
    if (c != cudaSuccess) return c;
    if (smem > 48 * 1024 && !(__atomic_load_n(&raised, __ATOMIC_ACQUIRE) >> dev & 1u)) {
        c = cudaFuncSetAttribute(mv_kernel<GATEUP, KW, PER, RT, LEAN, MINB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 (int)smem);
        if (c != cudaSuccess) return c;
        __atomic_fetch_or(&raised, 1u << dev, __ATOMIC_RELEASE);
    }
    const dim3 grid((unsigned)((n_out + 16 * RT - 1) / (16 * RT)), (unsigned)tiles_max);
    return cu_launch_pdl(pdl, mv_kernel<GATEUP, KW, PER, RT, LEAN, MINB>, grid, dim3(32 * KW * RT), smem, st, tab, tile_e,
                         perm, nt, H, k, x, hbuf, ldh, wts, dbuf, sh_only, (int)(pdl == 2));
}

/* The gate/up (K = H) or down (K = the experts' I) GEMM of the launch by mv_kernel; the
 * caller checked mv_pick(GATEUP, K).kw != 0 (a K without an instance here is
 * cudaErrorInvalidValue: an instance's K must be its KW·PER·128, or its blocks would write
 * nothing). alt: the other down instance at K = 512 (LASTSTAND_MG_MIDDN=1, a device-round
 * experiment). */
template <bool GATEUP>
cudaError_t mv_launch(int K, int n_out, int tiles_max, const mg_expert *tab, const int32_t *tile_e,
                      const int32_t *perm, const int32_t *nt, int H, int k, const bf16 *x, bf16 *hbuf, int ldh,
                      const float *wts, bf16 *dbuf, int sh_only, int alt, int pdl, cudaStream_t st) {
    if constexpr (GATEUP) {
        if (K == 1024)
            return mv_launch1<GATEUP, 8, 1, 1>(n_out, tiles_max, tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts, dbuf,
                                               sh_only, pdl, st);
        if (K == 2048 && alt == 2) /* LASTSTAND_MG_MIDGU=2: the LEAN instance at 4 blocks an SM (<= 64 registers) */
            return mv_launch1<GATEUP, 8, 2, 1, true, 4>(n_out, tiles_max, tab, tile_e, perm, nt, H, k, x, hbuf, ldh,
                                                        wts, dbuf, sh_only, pdl, st);
        if (K == 2048 && alt)
            return mv_launch1<GATEUP, 8, 2, 1, true>(n_out, tiles_max, tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts,
                                                     dbuf, sh_only, pdl, st);
        if (K == 2048)
            return mv_launch1<GATEUP, 8, 2, 1>(n_out, tiles_max, tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts, dbuf,
                                               sh_only, pdl, st);
        if (K == 3072) /* two blocks an SM: 3 chunks of gate and up in flight a warp */
            return mv_launch1<GATEUP, 8, 3, 1, false, 2>(n_out, tiles_max, tab, tile_e, perm, nt, H, k, x, hbuf, ldh,
                                                         wts, dbuf, sh_only, pdl, st);
        if (K != 4096) return cudaErrorInvalidValue;
        if (alt == 1) /* K = 4096 (LASTSTAND_MG_MID4K=1): the LEAN instance at 2 blocks an SM (<= 64 registers) */
            return mv_launch1<GATEUP, 16, 2, 1, true, 2>(n_out, tiles_max, tab, tile_e, perm, nt, H, k, x, hbuf, ldh,
                                                         wts, dbuf, sh_only, pdl, st);
        return mv_launch1<GATEUP, 16, 2, 1, false, 1>(n_out, tiles_max, tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts,
                                                      dbuf, sh_only, pdl, st);
    } else {
        if (K == 512 && alt) /* 2 warps of 2 chunks per tile, 4 tiles: twice the bytes in flight per warp */
            return mv_launch1<GATEUP, 2, 2, 4>(n_out, tiles_max, tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts, dbuf,
                                               sh_only, pdl, st);
        if (K == 512)
            return mv_launch1<GATEUP, 4, 1, 2>(n_out, tiles_max, tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts, dbuf,
                                               sh_only, pdl, st);
        if (K == 768)
            return mv_launch1<GATEUP, 2, 3, 4, false, 2>(n_out, tiles_max, tab, tile_e, perm, nt, H, k, x, hbuf, ldh,
                                                         wts, dbuf, sh_only, pdl, st);
        if (K == 1536)
            return mv_launch1<GATEUP, 4, 3, 2, false, 2>(n_out, tiles_max, tab, tile_e, perm, nt, H, k, x, hbuf, ldh,
                                                         wts, dbuf, sh_only, pdl, st);
        if (K != 1024) return cudaErrorInvalidValue;
        return mv_launch1<GATEUP, 4, 2, 2>(n_out, tiles_max, tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts, dbuf,
                                           sh_only, pdl, st);
    }
}

/* The down GEMV with a whole K per warp (LASTSTAND_MG_MIDDN=2): block = 8 output tiles of 16
 * rows (one a warp) over all PER chunks of K = I (128·PER), so no partial sums meet across
 * warps: each lane writes its outputs. The tile's 16 slots of hbuf (K bf16 each) are staged
 * once per block in shared memory, already in the decode's pairing (zeros on padding slots),
 * and every warp reads its B fragments there; the weights (the warp's 16 rows x K) are in
 * flight by cp.async from entry. mv_kernel's down spent half its instructions on per-warp
 * overhead at one chunk a warp (K = 512). */
template <int PER>
struct mvd_smem {
    uint4 codes[8][PER][2][32];  /* [warp][chunk][row g, g + 8][lane] */
    uint32_t sc[8][PER][32];     /* [warp][chunk][scale word] */
    uint4 xs[16][PER * MV_CH / 8 + 1]; /* [slot][8 K values], permuted (+16 B: rows g on distinct banks) */
    int pair[16];
    int two;
};

template <int PER>
__global__ void __launch_bounds__(256, 3)
    mvd_kernel(const mg_expert *__restrict__ tab, const int32_t *__restrict__ tile_e, const int32_t *__restrict__ perm,
               const int32_t *__restrict__ n_tiles, int H, int k, const bf16 *__restrict__ x, bf16 *__restrict__ hbuf,
               int ldh, const float *__restrict__ wts, bf16 *__restrict__ dbuf, int sh_only, int early) {
    constexpr int K = PER * MV_CH, XW = K / 8; /* uint4 per slot row */
    extern __shared__ __align__(16) unsigned char mvd_dsm[];
    mvd_smem<PER> &sm = *reinterpret_cast<mvd_smem<PER> *>(mvd_dsm);
    cu_pdl_trigger();
    /* early (pdl 2): the plan is complete when this grid starts (gate/up let it go after its own
     * wait), so the tile's expert and its weights are read first and the wait only guards hbuf;
     * the weight loads overlap gate/up's tail. */
    if (!early) cu_pdl_wait(); /* (with PDL: the plan's tiles, gate/up's hbuf) */
    /* The plan's outputs through L2 (ld.global.cg), not the non-coherent path: with early they
     * are read before this grid's wait, and the workspace has the same addresses every layer
     * (S11 PDL audit, item 1). */
    const int tile = blockIdx.y + (sh_only ? __ldcg(n_tiles + 1) : 0);
    if (tile >= __ldcg(n_tiles)) return;
    const mg_expert *xp = &tab[__ldcg(tile_e + tile)];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int nrow0 = (blockIdx.x * 8 + warp) * 16;
    const bool ok = xp->inter == K; /* the host checks; a mismatch writes nothing */
    const bool live = ok && nrow0 < H;
    if (live) {
        const size_t ldw = (size_t)K / 2, lds = (size_t)K / 16;
        const uint8_t *wr = xp->w[2] + (size_t)(nrow0 + g) * ldw + 16 * t;
        const uint8_t *sr = xp->s[2] + (size_t)(nrow0 + (lane >> 1)) * lds + 4 * (lane & 1);
#pragma unroll
        for (int u = 0; u < PER; u++) {
            cu_cp_async16(&sm.codes[warp][u][0][lane], wr + u * 64);
            cu_cp_async16(&sm.codes[warp][u][1][lane], wr + 8 * ldw + u * 64);
            nv4_cp_async4(&sm.sc[warp][u][lane], sr + u * 8);
            cu_cp_async_commit();
        }
    }
    if (tid < 16) {
        sm.pair[tid] = __ldcg(perm + tile * 16 + tid);
        if (tid == 8) sm.two = 0;
    }
    if (early) cu_pdl_wait(); /* gate/up's hbuf from here on */
    __syncthreads();
    if (tid >= 8 && tid < 16 && sm.pair[tid] >= 0) sm.two = 1;
    /* hbuf rows of the real slots -> xs, permuted; zeros elsewhere */
    for (int i = tid; i < 16 * XW; i += 256) {
        const int s = i / XW, c = i - s * XW;
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (sm.pair[s] >= 0 && ok) v = nv4_xperm8(__ldg(reinterpret_cast<const uint4 *>(hbuf + (size_t)(tile * 16 + s) * ldh) + c));
        sm.xs[s][c] = v;
    }
    __syncthreads();
    const int two = sm.two;
    float acc[2][4];
#pragma unroll
    for (int grp = 0; grp < 2; grp++)
#pragma unroll
        for (int r = 0; r < 4; r++) acc[grp][r] = 0.f;
    if (live) {
#pragma unroll
        for (int u = 0; u < PER; u++) {
            mv_wait(PER - 1 - u);
            __syncwarp(); /* scales of chunk u were copied by other lanes */
            const uint16_t *s16 = reinterpret_cast<const uint16_t *>(sm.sc[warp][u]);
            uint4 xv[2][4];
#pragma unroll
            for (int q = 0; q < 4; q++) xv[0][q] = sm.xs[g][u * (MV_CH / 8) + 4 * t + q];
            if (two) {
#pragma unroll
                for (int q = 0; q < 4; q++) xv[1][q] = sm.xs[8 + g][u * (MV_CH / 8) + 4 * t + q];
                mv_chunk<2>(sm.codes[warp][u][0][lane], sm.codes[warp][u][1][lane], s16[4 * g + t],
                            s16[4 * (g + 8) + t], xv, acc);
            } else {
                mv_chunk<1>(sm.codes[warp][u][0][lane], sm.codes[warp][u][1][lane], s16[4 * g + t],
                            s16[4 * (g + 8) + t], xv, acc);
            }
        }
        /* c0, c1 = row g, slots 2t, 2t + 1; c2, c3 = row g + 8; the decoded weights carry 2^-8 */
        const float s2 = xp->s2[2] * 256.f;
#pragma unroll
        for (int grp = 0; grp < 2; grp++) {
            if (grp == 1 && !two) break;
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const int slot = 8 * grp + 2 * t + (r & 1), n = nrow0 + g + 8 * (r >> 1);
                const int p = sm.pair[slot];
                if (p >= 0) dbuf[(size_t)p * H + n] = __float2bfloat16_rn(acc[grp][r] * (s2 * wts[p]));
            }
        }
    }
}

int mvd_per(int K) { return K == 512 ? 4 : K == 768 ? 6 : K == 1024 ? 8 : 0; }

template <int PER>
static cudaError_t mvd_launch1(int tiles_max, const mg_expert *tab, const int32_t *tile_e, const int32_t *perm,
                               const int32_t *nt, int H, int k, const bf16 *x, bf16 *hbuf, int ldh, const float *wts,
                               bf16 *dbuf, int pdl, cudaStream_t st) {
    const size_t smem = sizeof(mvd_smem<PER>); /* 52 KB (PER 4), 104 KB (8) */
    static unsigned raised; /* bit per device ordinal (< CU_WS_MAX_DEV) */
    int dev = 0;
    cudaError_t c = cudaGetDevice(&dev);
    if (c != cudaSuccess) return c;
    if (!(__atomic_load_n(&raised, __ATOMIC_ACQUIRE) >> dev & 1u)) {
        c = cudaFuncSetAttribute(mvd_kernel<PER>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (c != cudaSuccess) return c;
        __atomic_fetch_or(&raised, 1u << dev, __ATOMIC_RELEASE);
    }
    const dim3 grid((unsigned)((H + 127) / 128), (unsigned)tiles_max);
    return cu_launch_pdl(pdl, mvd_kernel<PER>, grid, dim3(256), smem, st, tab, tile_e, perm, nt, H, k, x, hbuf, ldh,
                         wts, dbuf, 0, (int)(pdl == 2));
}

/* The routed (and same-kind shared) down GEMM by mvd_kernel; the caller checked mvd_per(K). */
cudaError_t mvd_launch(int K, int tiles_max, const mg_expert *tab, const int32_t *tile_e, const int32_t *perm,
                       const int32_t *nt, int H, int k, const bf16 *x, bf16 *hbuf, int ldh, const float *wts,
                       bf16 *dbuf, int pdl, cudaStream_t st) {
    switch (mvd_per(K)) {
    case 4: return mvd_launch1<4>(tiles_max, tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts, dbuf, pdl, st);
    case 6: return mvd_launch1<6>(tiles_max, tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts, dbuf, pdl, st);
    case 8: return mvd_launch1<8>(tiles_max, tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts, dbuf, pdl, st);
    default: return cudaErrorInvalidValue; /* no instance: its blocks would write nothing */
    }
}

/* The BF16 form of the mid-batch GEMVs, for a BF16 shared expert next to NVFP4 experts (synth
 * and ModelOpt checkpoints): its 1..4 tiles ran through the grouped GEMM's BF16 loader on 4-16
 * CTAs (~53 us at the 35B shape, M = 16, on the side stream). Here a warp streams a 16-row
 * BF16 tile over PER chunks of 128 K straight into registers (the weights are the mma A
 * operand as they are, x in K order, one chunk ahead in flight), 4 warps along K per tile;
 * block = the gate and the up tile (8 warps) or 2 output tiles of down (8 warps), grid
 * (N / 16 or H / 32, the shared expert's tiles). K = 512·PER. Epilogue as mv_kernel (no
 * 2^8: BF16 weights carry no factor). */
template <bool GATEUP, int PER>
__global__ void __launch_bounds__(256)
    mvb_kernel(const mg_expert *__restrict__ tab, const int32_t *__restrict__ tile_e, const int32_t *__restrict__ perm,
               const int32_t *__restrict__ n_tiles, int H, int k, const bf16 *__restrict__ x, bf16 *__restrict__ hbuf,
               int ldh, const float *__restrict__ wts, bf16 *__restrict__ dbuf, int sh_only, int dm) {
    constexpr int KW = 4, RT = GATEUP ? 1 : 2;
    __shared__ float red[8][2][16][8]; /* [warp][slot group][row][slot] */
    __shared__ int pair[16], two_s;
    /* dm > 0: the direct form (mvb_launch), tile t = tokens 16t .. 16t + 15 of dm, tab = the shared expert's entry */
    const int tile = blockIdx.y + (dm ? 0 : sh_only ? n_tiles[1] : 0);
    if (dm ? tile * 16 >= dm : tile >= n_tiles[0]) return;
    const mg_expert *xp = dm ? tab : &tab[tile_e[tile]];
    const int N = GATEUP ? xp->inter : H, K = GATEUP ? H : xp->inter;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int kw = warp & 3, wq = warp >> 2; /* gate/up: wq 0 gate, 1 up; down: wq = the output tile */
    const int nrow0 = (blockIdx.x * RT + (GATEUP ? 0 : wq)) * 16;
    const bool live = nrow0 < N && K == KW * PER * MV_CH;
    const int r0 = tile * 16;
    if (tid < 16) {
        pair[tid] = dm ? (r0 + tid < dm ? (r0 + tid) * (k + 1) + k : -1) : perm[r0 + tid];
        if (tid == 8) two_s = 0;
    }
    __syncthreads();
    if (tid >= 8 && tid < 16 && pair[tid] >= 0) two_s = 1;
    __syncthreads();
    const int two = two_s;
    float acc[2][4];
#pragma unroll
    for (int grp = 0; grp < 2; grp++)
#pragma unroll
        for (int r = 0; r < 4; r++) acc[grp][r] = 0.f;
    if (live) {
        const bf16 *wb = reinterpret_cast<const bf16 *>(GATEUP ? xp->w[wq] : xp->w[2]);
        /* this lane's 32 elements of rows g and g + 8 in chunk 0 of the warp (uint4 = 8 bf16) */
        const uint4 *w0 = reinterpret_cast<const uint4 *>(wb + (size_t)(nrow0 + g) * K + kw * PER * MV_CH + 32 * t);
        const uint4 *w1 = w0 + K; /* 8 rows = 8·K bf16 = K uint4 */
#pragma unroll
        for (int pass = 0; pass < 2; pass++) {
            if (pass == 1 && !two) break;
            const int s = 8 * pass + g, ps = pair[s];
            const bf16 *xr = ps < 0 ? nullptr
                                    : (GATEUP ? x + (size_t)(ps / (k + 1)) * H : hbuf + (size_t)(r0 + s) * ldh) +
                                          kw * PER * MV_CH + 32 * t;
            /* [row g, g + 8][word] and x of the chunk in use (wa, xa) and of the next (wn, xn):
             * a rolled loop, so that the compiler keeps one chunk ahead, not all of them */
            uint4 wa[2][4], xa[4], wn[2][4], xn[4];
            auto loadc = [&](int u, uint4 (&w)[2][4], uint4 (&xq)[4]) {
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    w[0][q] = __ldg(w0 + u * (MV_CH / 8) + q);
                    w[1][q] = __ldg(w1 + u * (MV_CH / 8) + q);
                    xq[q] = xr ? __ldg(reinterpret_cast<const uint4 *>(xr + u * MV_CH) + q) : make_uint4(0u, 0u, 0u, 0u);
                }
            };
            loadc(0, wa, xa);
#pragma unroll 1
            for (int u = 0; u < PER; u++) {
                if (u + 1 < PER) loadc(u + 1, wn, xn);
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    /* K order on both sides: A word pairs (0,1) (2,3) | (4,5) (6,7) of the 8 elements */
                    const uint32_t f0[4] = {wa[0][q].x, wa[1][q].x, wa[0][q].y, wa[1][q].y};
                    const uint32_t f1[4] = {wa[0][q].z, wa[1][q].z, wa[0][q].w, wa[1][q].w};
                    nv4_mma_16816(acc[pass], f0, xa[q].x, xa[q].y, acc[pass]);
                    nv4_mma_16816(acc[pass], f1, xa[q].z, xa[q].w, acc[pass]);
                }
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    wa[0][q] = wn[0][q];
                    wa[1][q] = wn[1][q];
                    xa[q] = xn[q];
                }
            }
        }
    }
#pragma unroll
    for (int grp = 0; grp < 2; grp++) {
        red[warp][grp][g][2 * t] = acc[grp][0];
        red[warp][grp][g][2 * t + 1] = acc[grp][1];
        red[warp][grp][g + 8][2 * t] = acc[grp][2];
        red[warp][grp][g + 8][2 * t + 1] = acc[grp][3];
    }
    __syncthreads();
    for (int o = tid; o < RT * 16 * 16; o += 256) {
        const int row = o & 15, slot = (o >> 4) & 15, ort = o >> 8;
        const int p = pair[slot], grp = slot >> 3, s8 = slot & 7;
        const int n = (blockIdx.x * RT + ort) * 16 + row;
        if (p < 0 || n >= N || K != KW * PER * MV_CH) continue;
        float v0 = 0.f, v1 = 0.f;
#pragma unroll
        for (int w = 0; w < KW; w++) { /* fixed order: deterministic */
            v0 += red[(GATEUP ? 0 : ort * KW) + w][grp][row][s8];
            if (GATEUP) v1 += red[KW + w][grp][row][s8];
        }
        if (GATEUP) {
            const float gg = v0 * xp->s2[0], uu = v1 * xp->s2[1];
            hbuf[(size_t)(r0 + slot) * ldh + n] = __float2bfloat16_rn(gg / (1.f + __expf(-gg)) * uu);
        } else {
            dbuf[(size_t)p * H + n] = __float2bfloat16_rn(v0 * (xp->s2[2] * wts[p]));
        }
    }
}

/* mvb_kernel's PER for K, or 0 when there is no instance. */
int mvb_per(int K) {
    return K == 512 ? 1 : K == 1024 ? 2 : K == 2048 ? 4 : K == 3072 ? 6 : K == 4096 ? 8 : 0;
}

/* The BF16 shared expert's gate/up (K = H, n_out = its I) or down (K = its I, n_out = H) over
 * its sh_tiles tiles (sh_only); the caller checked mvb_per(K). dm > 0, the direct form: no plan
 * (tile_e, perm and nt unused, tab = the shared expert's own entry): tile t holds tokens 16t ..
 * 16t + 15 of dm, token m's pair is m·(k+1) + k, hbuf [16·sh_tiles, ldh] the shared expert's own
 * h, so that it can run before the routing is known (the gate/up) or before the plan (the down,
 * which needs wts) with the same sums as the plan's form. */
template <bool GATEUP>
cudaError_t mvb_launch(int K, int n_out, int sh_tiles, const mg_expert *tab, const int32_t *tile_e,
                       const int32_t *perm, const int32_t *nt, int H, int k, const bf16 *x, bf16 *hbuf, int ldh,
                       const float *wts, bf16 *dbuf, int dm, cudaStream_t st) {
    constexpr int rows = GATEUP ? 16 : 32;
    dim3 grid((unsigned)((n_out + rows - 1) / rows), (unsigned)sh_tiles);
    const int per = mvb_per(K);
#define MVB_GO(P) mvb_kernel<GATEUP, P><<<grid, 256, 0, st>>>(tab, tile_e, perm, nt, H, k, x, hbuf, ldh, wts, dbuf, 1, dm)
    if (per == 1) MVB_GO(1);
    else if (per == 2) MVB_GO(2);
    else if (per == 4) MVB_GO(4);
    else if (per == 6) MVB_GO(6);
    else MVB_GO(8);
#undef MVB_GO
    return cudaGetLastError();
}

/* ---- 1': the mid-batch router (LASTSTAND_MG_MID) ----------------------------------- */

/* logits[m, e] (fp32) = x[m] · W_router[e] for small M, instead of cuBLASLt (6.4 us at the
 * 35B shape, M = 16, 8 CTAs reading the 1 MB weight): block = 16 router rows x one group of 8
 * tokens (blockIdx.y; the tokens are the mma's B columns), KW warps along K = H with PER
 * chunks of 128 each streamed into registers one ahead (as mvb_kernel), summed over the warps
 * in a fixed order. grid (E / 16, ceil(M / 8)). */
template <int KW, int PER>
__global__ void __launch_bounds__(32 * KW)
    mr_kernel(int M, int H, int E, const bf16 *__restrict__ w, const bf16 *__restrict__ x, float *__restrict__ logits,
              int late) {
    __shared__ float red[KW][16][8]; /* [warp][row][token of the group] */
    const int tid = threadIdx.x, lane = tid & 31, kw = tid >> 5, g = lane >> 2, t = lane & 3;
    const int e0 = blockIdx.x * 16, m = blockIdx.y * 8 + g;
    const int k0 = kw * PER * MV_CH + 32 * t; /* this lane's K offset */
    const uint4 *w0 = reinterpret_cast<const uint4 *>(w + (size_t)(e0 + g) * H + k0);
    const uint4 *w1 = w0 + H; /* 8 rows = 8·H bf16 = H uint4 */
    const bf16 *xr = m < M ? x + (size_t)m * H + k0 : nullptr;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    uint4 wa[2][4], xa[4], wn[2][4], xn[4];
    auto loadc = [&](int u, uint4 (&wq)[2][4], uint4 (&xq)[4]) {
#pragma unroll
        for (int q = 0; q < 4; q++) {
            wq[0][q] = __ldg(w0 + u * (MV_CH / 8) + q);
            wq[1][q] = __ldg(w1 + u * (MV_CH / 8) + q);
            xq[q] = xr ? __ldg(reinterpret_cast<const uint4 *>(xr + u * MV_CH) + q) : make_uint4(0u, 0u, 0u, 0u);
        }
    };
    /* with PDL: the first chunk's router weights (constants) before the wait, x after it; the
     * next kernel released before the wait, or after it (late: LASTSTAND_MG_ROUTER_PDL=2) */
    if (!late) cu_pdl_trigger();
#pragma unroll
    for (int q = 0; q < 4; q++) {
        wa[0][q] = __ldg(w0 + q);
        wa[1][q] = __ldg(w1 + q);
    }
    cu_pdl_wait();
    if (late) cu_pdl_trigger();
#pragma unroll
    for (int q = 0; q < 4; q++)
        xa[q] = xr ? __ldg(reinterpret_cast<const uint4 *>(xr) + q) : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll 1
    for (int u = 0; u < PER; u++) {
        if (u + 1 < PER) loadc(u + 1, wn, xn);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const uint32_t f0[4] = {wa[0][q].x, wa[1][q].x, wa[0][q].y, wa[1][q].y};
            const uint32_t f1[4] = {wa[0][q].z, wa[1][q].z, wa[0][q].w, wa[1][q].w};
            nv4_mma_16816(acc, f0, xa[q].x, xa[q].y, acc);
            nv4_mma_16816(acc, f1, xa[q].z, xa[q].w, acc);
        }
#pragma unroll
        for (int q = 0; q < 4; q++) {
            wa[0][q] = wn[0][q];
            wa[1][q] = wn[1][q];
            xa[q] = xn[q];
        }
    }
    red[kw][g][2 * t] = acc[0];
    red[kw][g][2 * t + 1] = acc[1];
    red[kw][g + 8][2 * t] = acc[2];
    red[kw][g + 8][2 * t + 1] = acc[3];
    __syncthreads();
    if (tid < 128) {
        const int row = tid & 15, s = tid >> 4, mm = blockIdx.y * 8 + s;
        if (mm < M) {
            float v = 0.f;
#pragma unroll
            for (int i = 0; i < KW; i++) v += red[i][row][s]; /* fixed order: deterministic */
            logits[(size_t)mm * E + e0 + row] = v;
        }
    }
}

/* The router by mr_kernel when an instance fits (E % 16 == 0, H = 1024, 2048 or 4096, the
 * weight 16-byte aligned); returns 0 = not launched (the caller uses cuBLASLt). */
int mr_launch(int M, int H, int E, const bf16 *w, const bf16 *x, float *logits, int pdl, cudaStream_t st,
              cudaError_t *c) {
    if (E % 16 || ((uintptr_t)w & 15)) return 0;
    const dim3 grid((unsigned)(E / 16), (unsigned)((M + 7) / 8)), block(256);
    const int late = pdl == 2;
    if (H == 1024) *c = cu_launch_pdl(pdl, mr_kernel<8, 1>, grid, block, 0, st, M, H, E, w, x, logits, late);
    else if (H == 2048) *c = cu_launch_pdl(pdl, mr_kernel<8, 2>, grid, block, 0, st, M, H, E, w, x, logits, late);
    else if (H == 3072) *c = cu_launch_pdl(pdl, mr_kernel<8, 3>, grid, block, 0, st, M, H, E, w, x, logits, late);
    else if (H == 4096) *c = cu_launch_pdl(pdl, mr_kernel<8, 4>, grid, block, 0, st, M, H, E, w, x, logits, late);
    else return 0;
    return 1;
}


/* the instances moe_grouped.cu calls */
template cudaError_t mv_launch<true>(int, int, int, const mg_expert *, const int32_t *, const int32_t *,
                                     const int32_t *, int, int, const bf16 *, bf16 *, int, const float *, bf16 *, int,
                                     int, int, cudaStream_t);
template cudaError_t mv_launch<false>(int, int, int, const mg_expert *, const int32_t *, const int32_t *,
                                      const int32_t *, int, int, const bf16 *, bf16 *, int, const float *, bf16 *, int,
                                      int, int, cudaStream_t);
template cudaError_t mvb_launch<true>(int, int, int, const mg_expert *, const int32_t *, const int32_t *,
                                      const int32_t *, int, int, const bf16 *, bf16 *, int, const float *, bf16 *,
                                      int, cudaStream_t);
template cudaError_t mvb_launch<false>(int, int, int, const mg_expert *, const int32_t *, const int32_t *,
                                       const int32_t *, int, int, const bf16 *, bf16 *, int, const float *, bf16 *,
                                       int, cudaStream_t);
