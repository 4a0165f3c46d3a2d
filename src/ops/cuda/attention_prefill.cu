/* attention_prefill.cu: the attention backend "cuda_flash_prefill": a tiled
 * FlashAttention-2 kernel on tensor cores (mma.sync m16n8k16, BF16 in, fp32
 * accumulation, online softmax with a running max and sum per row in fp32)
 * over the paged BF16 KV pool. Same contract as attention.cu's backends
 * (ops.h attn_args): causal GQA, decode rows and prefill chunks of any
 * sequences mixed in one call, out = softmax(q·Kᵀ·scale)·V, then
 * out *= sigmoid(gate) when a gate is given.
 *
 * Tiling. Rows of a tile are (token, query head) pairs of ONE sequence and ONE
 * kv head: with grp = n_heads / n_kv_heads, the sequence's flat row index
 * f = tok_local·grp + hg (hg < grp) maps to token row0 + tok_local and query
 * head kvh·grp + hg. A tile is 64 consecutive flat rows (4 warps × 16 rows),
 * so every K/V tile read from the pool is shared by the whole GQA group and,
 * for decode, a single token's grp heads fill the MMA rows. Blocks: grid
 * (tiles, n_kv_heads); the tile list is not built on the host: block x walks
 * the device array args->seqs, counting ceil(n_new·grp / 64) tiles per
 * sequence (grid.x = ceil(n_tok·grp / 64) + n_seq is an upper bound; spare
 * blocks exit). No host metadata, no host sync; the split-K workspace below
 * only grows.
 *
 * Per tile: Q [64, HD] is staged in shared memory once; the keys 0 .. kmax
 * (kmax = n_past + the last row's token offset) are walked in BN-key tiles,
 * K and V [BN, HD] staged in shared memory (double-buffered with cp.async;
 * rows past kmax zero-filled), S = Q·Kᵀ on tensor cores, the causal mask per
 * row (key ≤ n_past + tok_local), online softmax in the log2 domain, P
 * (BF16, straight from the S accumulators' registers) · V on tensor cores.
 * Q and K fragments come through ldmatrix.x4, V's through ldmatrix.x4.trans;
 * Q's stay in registers for head_dim <= 128. The O rescale is skipped when no
 * row's running max moved (warp vote). Shared rows are padded by 8 BF16 so
 * the fragment loads are bank-conflict free.
 *
 * Split-K, two plans (fp_plan_mode). Decode calls (one new token per
 * sequence) and every device-planned call (CUDA graph capture) take the row
 * plan: a tile's keys are cut into contiguous chunks whose length depends only
 * on the tile's own context (FP_CHUNK_KEYS keys, shorter for a short context
 * so that it still makes up to FP_SHORT_SPLIT chunks, longer past FP_MAX_SPLIT
 * chunks), chunk z -> block z, partials (row max, row sum, unnormalised O,
 * fp32) to slot z and fp_merge_rows_kernel folds the row's chunks in order:
 * a row's rounding does not depend on the batch, the grid or the planning,
 * so a replayed decode step is bitwise the eager one. Such calls run
 * fp_dec_kernel (the 4 warps of a block share the token's GQA rows and split
 * head_dim) where grp <= 16 and head_dim >= 64. Other calls take the round
 * plan: when tiles × kv heads would not fill the GPU twice, grid.z = nsplit
 * blocks share each tile's keys round-robin by BN-key tiles (nsplit from
 * seqs_host), and fp_merge_kernel combines them. Partials live in a
 * per-device workspace grown on demand, or in the caller's scratch under
 * device planning. The gate is applied by whichever kernel writes out.
 * The (row vs round) split was found when graph replay with this backend gave
 * other greedy tokens than eager steps (R1: 19/136 on a random synth model;
 * 136/136 with the row plan, and with both plannings forced to 64 splits).
 *
 * HD (head_dim) 32, 64, 128, 256; BN = 64 keys per step, 32 for HD 256 (the
 * O accumulator of 16 rows × 256 dims is 128 registers a thread).
 *
 * Head_dim 256 and 128 calls under the round plan with host planning (prefill chunks) run the Hopper
 * kernel of attention_prefill_wg.cu instead (LASTSTAND_FP_WG=1; wgmma, 128-row tiles, a producer
 * warpgroup; sm_90a only, fp_kernel elsewhere), with its own split count (fw_nsplit) and the same
 * partials and merge.
 */
#include "ops/cuda/cu_util.h"
#include "ops/cuda/cu_pdl.h"
#include "ops/cuda/fp_rows.h"
#include "ops/cuda/attention_prefill_wg.cuh"

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

enum { FP_BM = 64, FP_THREADS = 128, FP_MAX_DEV = 16 };
/* The row plan (fp_plan_mode, fp_rows.h) plans host calls whose sequences all have at most
 * FP_ROWS_MAX_NEW new tokens (decode steps: the ones CUDA graphs replay; R1: at 16, the doctor's
 * mixed M = 8 batches of 1..4-token sequences took 34 µs against the round plan's 28) and every
 * device planned call. */
enum { FP_ROWS_MAX_NEW = 1 };

static_assert(offsetof(attn_seq, n_past) == 0 && offsetof(attn_seq, n_new) == 4 && offsetof(attn_seq, row0) == 8,
              "attn_seq layout: the kernel reads the device copy as the same struct");

/* ---- fragment helpers ------------------------------------------------------ */


__device__ __forceinline__ uint32_t fp_pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* Four 8×8 BF16 matrices, transposed: lane l gives the row address of matrix
 * l / 8, row l % 8; register i of lane (g = l/4, t = l%4) receives matrix i's
 * elements (row 2t, col g) and (row 2t + 1, col g). */
__device__ __forceinline__ void fp_ldsm_x4_t(uint32_t r[4], const bf16 *p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* Four 8×8 BF16 matrices: register i of lane (g, t) receives matrix i's (row g, cols 2t, 2t + 1). */
__device__ __forceinline__ void fp_ldsm_x4(uint32_t r[4], const bf16 *p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* 16-byte async copy global -> shared; src_bytes 0 zero-fills the 16 bytes. */
__device__ __forceinline__ void fp_cp16(bf16 *dst, const bf16 *src, int src_bytes) {
    uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void fp_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void fp_cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

/* Programmatic dependent launch (sm_90): without the launch attribute both are no-ops. cu_pdl_wait
 * blocks until the grid before this one in the stream completed with its memory visible; every
 * kernel here calls it before it reads anything, and cu_pdl_trigger right after (what follows waits
 * in turn for this grid's completion before it reads). */

/* ---- the online-softmax steps both kernels share ------------------------------ */

/* A thread's two rows A and B (accumulator elements 0, 1 and 2, 3 of every n-tile) are summed over
 * the row's four lanes t (lanes 4g .. 4g + 3). */
__device__ __forceinline__ void fp_quad_sum(float &a, float &b) {
#pragma unroll
    for (int o2 = 1; o2 < 4; o2 <<= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o2);
        b += __shfl_xor_sync(0xffffffffu, b, o2);
    }
}

/* One online-softmax step over a key tile. In: sc [NT n-tiles of 8 keys] the masked scores in log2
 * units, xA / xB this thread's maxima of rows A / B; m, l the rows' running max and sum, o [OT
 * n-tiles of 8 dims] the unnormalised output. The row maxima meet over the row's four lanes, o and
 * l are rescaled to the new max, and sc becomes P = exp2(s - m) with l += its row sums. */
template <int NT, int OT>
__device__ __forceinline__ void fp_softmax_step(float (&sc)[NT][4], float (&o)[OT][4], float xA, float xB, float &mA,
                                                float &mB, float &lA, float &lB) {
#pragma unroll
    for (int o2 = 1; o2 < 4; o2 <<= 1) {
        xA = fmaxf(xA, __shfl_xor_sync(0xffffffffu, xA, o2));
        xB = fmaxf(xB, __shfl_xor_sync(0xffffffffu, xB, o2));
    }
    const float nA = fmaxf(mA, xA), nB = fmaxf(mB, xB);
    const float uA = nA == -INFINITY ? 0.f : nA, uB = nB == -INFINITY ? 0.f : nB; /* fully masked rows */
    const float cA = exp2f(mA - uA), cB = exp2f(mB - uB);                           /* exp2(-inf) = 0 */
    mA = nA;
    mB = nB;
    lA *= cA;
    lB *= cB;
    if (!__all_sync(0xffffffffu, cA == 1.f && cB == 1.f)) { /* skipped once no row's max moves */
#pragma unroll
        for (int n = 0; n < OT; n++) {
            o[n][0] *= cA; o[n][1] *= cA;
            o[n][2] *= cB; o[n][3] *= cB;
        }
    }
#pragma unroll
    for (int n = 0; n < NT; n++) {
        sc[n][0] = exp2f(sc[n][0] - uA);
        sc[n][1] = exp2f(sc[n][1] - uA);
        sc[n][2] = exp2f(sc[n][2] - uB);
        sc[n][3] = exp2f(sc[n][3] - uB);
        lA += sc[n][0] + sc[n][1];
        lB += sc[n][2] + sc[n][3];
    }
}

/* O [16 rows, OT n-tiles of 8 dims from dim d0] += P · V for a key tile of 8·NT keys: P's A fragment
 * for keys 16kk .. 16kk + 15 is the S accumulators of n-tiles 2kk, 2kk + 1 (BF16); V [keys, dims] in
 * shared memory with row stride LD: lane l addresses matrix mi = l/8 row l%8, key 16kk + (mi&1)·8 +
 * l%8, dim d0 + 16np + (mi>>1)·8; regs 0,1 = B of dim n-tile 2np, regs 2,3 = B of n-tile 2np + 1. */
template <int LD, int NT, int OT>
__device__ __forceinline__ void fp_pv(const float (&sc)[NT][4], float (&o)[OT][4], const bf16 *Vs, int lane, int d0) {
#pragma unroll
    for (int kk = 0; kk < NT / 2; kk++) {
        uint32_t a[4];
        a[0] = fp_pack(sc[2 * kk][0], sc[2 * kk][1]);
        a[1] = fp_pack(sc[2 * kk][2], sc[2 * kk][3]);
        a[2] = fp_pack(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
        a[3] = fp_pack(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
        const bf16 *vb = Vs + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + (lane >> 4) * 8 + d0;
#pragma unroll
        for (int np = 0; np < OT / 2; np++) {
            uint32_t b[4];
            fp_ldsm_x4_t(b, vb + np * 16);
            cu_mma_bf16_16816(o[2 * np], a, b[0], b[1]);
            cu_mma_bf16_16816(o[2 * np + 1], a, b[2], b[3]);
        }
    }
}

/* ---- the kernel ------------------------------------------------------------ */

/* grid (tiles bound, nkv), block 128 threads (4 warps, warp w owns tile rows
 * 16w .. 16w + 15). Shared: Qs [64][HD+8], then 2 stages of Ks [BN][HD+8] and
 * Vs [BN][HD+8], all BF16. sl2 = scale · log2(e). */
template <int HD, int BN>
__global__ void __launch_bounds__(FP_THREADS) fp_kernel(int n_seq, const attn_seq *__restrict__ seqs, int nh,
                                                        int nkv, int P, float sl2, const bf16 *__restrict__ q,
                                                        const bf16 *__restrict__ gate, const bf16 *__restrict__ K,
                                                        const bf16 *__restrict__ V, bf16 *__restrict__ out,
                                                        float *__restrict__ part_o, float *__restrict__ part_ml,
                                                        int *__restrict__ part_n, int n_rows_total, int rows_c0,
                                                        int rows_ss, int lpt) {
    constexpr int LD = HD + 8;        /* shared row stride, elements */
    constexpr int NT = BN / 8;        /* key n-tiles of S per warp */
    constexpr int OT = HD / 8;        /* dim n-tiles of O per warp */
    constexpr int CH = HD / 8;        /* 16-byte chunks per row */
    extern __shared__ __align__(16) unsigned char fp_smem[];
    bf16 *Qs = reinterpret_cast<bf16 *>(fp_smem);
    bf16 *KV = Qs + FP_BM * LD; /* stage st: Ks = KV + st·2·BN·LD, Vs = Ks + BN·LD */

    const int grp = nh / nkv, kvh = blockIdx.y;
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    cu_pdl_wait();
    cu_pdl_trigger();

    /* which sequence and tile this block is; lpt: the tiles in reverse order (the last rows of the
     * last sequence first: a prompt's longest key ranges start first, its short ones fill the tail) */
    int id = blockIdx.x, s = 0;
    if (lpt) {
        int total = 0;
        for (int i = 0; i < n_seq; i++) total += (seqs[i].n_new * grp + FP_BM - 1) / FP_BM;
        if (id >= total) return;
        id = total - 1 - id;
    }
    for (; s < n_seq; s++) {
        int nt = (seqs[s].n_new * grp + FP_BM - 1) / FP_BM;
        if (id < nt) break;
        id -= nt;
    }
    if (s >= n_seq) return;
    const int n_past = seqs[s].n_past, n_new = seqs[s].n_new, row0 = seqs[s].row0;
    const int32_t *__restrict__ pages = seqs[s].pages;
    const int f0 = id * FP_BM;
    const int nrows = min(FP_BM, n_new * grp - f0);
    const int kmax = n_past + (f0 + nrows - 1) / grp; /* last key any row of the tile sees */
    const int n_ktiles = kmax / BN + 1;
    const int z = blockIdx.z, nsplit = gridDim.z;
    int kt0, kstep, n_it, direct;
    if (rows_c0 > 0) {
        /* the row plan: the tile's keys in contiguous chunks whose length depends only on the
         * tile's own last key (fp_rows_chunk), chunk z -> block z; blocks past the tile's chunk
         * count exit. Chunk c's partial goes to slot c, and fp_merge_kernel folds slots
         * 0 .. nc - 1 in order: the arithmetic of a row is fixed by its context alone, whatever
         * the batch, the grid or the planning (host or device). One chunk: written directly. */
        const int ct = fp_rows_chunk(n_ktiles, rows_c0, rows_ss, nsplit);
        const int nc = (n_ktiles + ct - 1) / ct;
        if (z >= nc) return;
        kt0 = z * ct;
        kstep = 1;
        n_it = min(ct, n_ktiles - kt0);
        direct = nc == 1 || !part_o;
        if (z == 0 && part_n)
            for (int r = tid; r < nrows; r += FP_THREADS) {
                const int f = f0 + r;
                part_n[(size_t)(row0 + f / grp) * nh + kvh * grp + f % grp] = nc;
            }
    } else {
        /* split-K (gridDim.z > 1): split z takes key tiles z, z + nsplit, ... (every key is covered
         * whatever the contexts) and writes partials; fp_merge_kernel combines them */
        kt0 = z;
        kstep = nsplit;
        n_it = z < n_ktiles ? (n_ktiles - z + nsplit - 1) / nsplit : 0;
        direct = !part_o;
    }

    /* stage Q [64, HD]: row r is flat row f0 + r (zeros past nrows) */
    for (int i = tid; i < FP_BM * CH; i += FP_THREADS) {
        int r = i / CH, c = i % CH;
        const bf16 *src = q;
        int ok = r < nrows;
        if (ok) {
            int f = f0 + r;
            src = q + ((size_t)(row0 + f / grp) * nh + kvh * grp + f % grp) * HD + c * 8;
        }
        fp_cp16(Qs + r * LD + c * 8, src, ok ? 16 : 0);
    }
    /* K/V tile kt into stage st: key j = kt·BN + r lives at page pages[j / P], row j % P */
    auto load_kv = [&](int kt, int st) {
        bf16 *Ks = KV + st * 2 * BN * LD, *Vs = Ks + BN * LD;
        for (int i = tid; i < BN * CH; i += FP_THREADS) {
            int r = i / CH, c = i % CH, j = kt * BN + r;
            size_t off = 0;
            int ok = j <= kmax;
            if (ok) off = (((size_t)pages[j / P] * P + j % P) * nkv + kvh) * HD + c * 8;
            fp_cp16(Ks + r * LD + c * 8, K + off, ok ? 16 : 0);
            fp_cp16(Vs + r * LD + c * 8, V + off, ok ? 16 : 0);
        }
    };
    if (n_it > 0) load_kv(kt0, 0);
    fp_cp_commit(); /* group 0: Q and the first K/V tile */

    /* this thread's two rows: rA = 16w + g, rB = rA + 8; lim = last key it may see (-1: padding) */
    const int rA = 16 * w + g, rB = rA + 8;
    const int limA = rA < nrows ? n_past + (f0 + rA) / grp : -1;
    const int limB = rB < nrows ? n_past + (f0 + rB) / grp : -1;
    float mA = -INFINITY, mB = -INFINITY, lA = 0.f, lB = 0.f; /* running max (log2 units), partial sums */
    float o[OT][4];
#pragma unroll
    for (int n = 0; n < OT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

    /* Q fragments: lane l addresses matrix mi = l/8 row l%8 at tile row 16w + (mi&1)·8 + l%8, dim (mi>>1)·8
     * (+ 16kk): regs = a0..a3 of the m16n8k16 A operand. Kept in registers for HD <= 128. */
    constexpr bool QREG = HD <= 128;
    const bf16 *qa = Qs + (16 * w + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + (lane >> 4) * 8;
    uint32_t qf[QREG ? HD / 16 : 1][4];
    if (QREG) {
        fp_cp_wait<0>(); /* Q (and the first K/V tile) landed */
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < (QREG ? HD / 16 : 0); kk++) fp_ldsm_x4(qf[kk], qa + kk * 16);
    }
    for (int it = 0; it < n_it; it++) {
        const int kt = kt0 + it * kstep, st = it & 1;
        if (it + 1 < n_it) load_kv(kt + kstep, st ^ 1); /* stage st^1 was freed by the sync ending it-1 */
        fp_cp_commit();
        fp_cp_wait<1>(); /* everything but the newest group: tile kt (and Q) landed */
        __syncthreads();
        const bf16 *Ks = KV + st * 2 * BN * LD, *Vs = Ks + BN * LD;

        /* S [16 rows, BN keys] = Q·Kᵀ: A = Q rows (row-major, k = dim), B = K rows (k = dim contiguous).
         * K fragments of two key n-tiles per ldmatrix.x4: lane l addresses matrix mi = l/8 row l%8 at
         * key 16np + (mi>>1)·8 + l%8, dim 16kk + (mi&1)·8: regs 0,1 = (b0, b1) of n-tile 2np, regs 2,3 of 2np + 1 */
        float sc[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
        const bf16 *kb = Ks + ((lane >> 4) * 8 + (lane & 7)) * LD + ((lane >> 3) & 1) * 8;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t a[4];
            if (QREG) {
                a[0] = qf[kk][0]; a[1] = qf[kk][1]; a[2] = qf[kk][2]; a[3] = qf[kk][3];
            } else {
                fp_ldsm_x4(a, qa + kk * 16);
            }
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t b[4];
                fp_ldsm_x4(b, kb + np * 16 * LD + kk * 16);
                cu_mma_bf16_16816(sc[2 * np], a, b[0], b[1]);
                cu_mma_bf16_16816(sc[2 * np + 1], a, b[2], b[3]);
            }
        }
        /* mask, scale to log2 units; accumulator (n, e): row rA (e < 2) or rB, key kt·BN + 8n + 2t + (e & 1) */
        float xA = -INFINITY, xB = -INFINITY;
#pragma unroll
        for (int n = 0; n < NT; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = kt * BN + n * 8 + 2 * t + (e & 1);
                int lim = e < 2 ? limA : limB;
                float v = key <= lim ? sc[n][e] * sl2 : -INFINITY;
                sc[n][e] = v;
                if (e < 2) xA = fmaxf(xA, v); else xB = fmaxf(xB, v);
            }
        }
        fp_softmax_step(sc, o, xA, xB, mA, mB, lA, lB);
        /* O += P·V: P's A fragment for keys 16kk .. 16kk + 15 is the S accumulators of n-tiles 2kk, 2kk + 1 */
        fp_pv<LD>(sc, o, Vs, lane, 0);
        __syncthreads(); /* stage st is reloaded by iteration it + 1 */
    }
    fp_cp_wait<0>();

    /* finish: l summed over the row's four lanes, O / l, gate, BF16 */
    fp_quad_sum(lA, lB);
    if (!direct) { /* split-K partial of output row (token, head): m (log2 units), l, unnormalised O */
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int r = half ? rB : rA;
            if (r >= nrows) continue;
            const int f = f0 + r;
            const size_t prow = (size_t)z * n_rows_total + (size_t)(row0 + f / grp) * nh + kvh * grp + f % grp;
            if (t == 0) {
                part_ml[2 * prow] = half ? mB : mA;
                part_ml[2 * prow + 1] = half ? lB : lA;
            }
#pragma unroll
            for (int n = 0; n < OT; n++)
                *reinterpret_cast<float2 *>(part_o + prow * HD + n * 8 + 2 * t) =
                    make_float2(o[n][2 * half], o[n][2 * half + 1]);
        }
        return;
    }
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int r = half ? rB : rA;
        if (r >= nrows) continue;
        const float l = half ? lB : lA, inv = l > 0.f ? 1.f / l : 0.f;
        const int f = f0 + r;
        const size_t base = ((size_t)(row0 + f / grp) * nh + kvh * grp + f % grp) * HD;
#pragma unroll
        for (int n = 0; n < OT; n++) {
            const size_t at = base + n * 8 + 2 * t;
            float v0 = o[n][2 * half] * inv, v1 = o[n][2 * half + 1] * inv;
            if (gate) {
                __nv_bfloat162 gv = *reinterpret_cast<const __nv_bfloat162 *>(gate + at);
                v0 *= 1.f / (1.f + __expf(-__bfloat162float(gv.x)));
                v1 *= 1.f / (1.f + __expf(-__bfloat162float(gv.y)));
            }
            *reinterpret_cast<uint32_t *>(out + at) = fp_pack(v0, v1);
        }
    }
}

/* fp_dec_kernel's end of a chunk zc: the (m, l) and unnormalised O of rows g and g + 8 (< grp) to
 * partial slot zc, or, the row's only chunk (direct), O / l times the gate to out */
template <int HD>
__device__ __forceinline__ void fp_dec_chunk_out(int zc, bool direct, int grp, int g, int t, int w, float mA, float mB,
                                                 float lA, float lB, const float (*o)[4], size_t hrow,
                                                 int n_rows_total, float *__restrict__ part_o,
                                                 float *__restrict__ part_ml, const bf16 *__restrict__ gate,
                                                 bf16 *__restrict__ out) {
    constexpr int OTW = HD / 32;
    fp_quad_sum(lA, lB);
    const int dbase = w * (HD / 4);
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int r = half ? g + 8 : g;
        if (r >= grp) continue;
        if (!direct) {
            const size_t prow = (size_t)zc * n_rows_total + hrow + r;
            if (w == 0 && t == 0) {
                part_ml[2 * prow] = half ? mB : mA;
                part_ml[2 * prow + 1] = half ? lB : lA;
            }
#pragma unroll
            for (int n = 0; n < OTW; n++)
                *reinterpret_cast<float2 *>(part_o + prow * HD + dbase + n * 8 + 2 * t) =
                    make_float2(o[n][2 * half], o[n][2 * half + 1]);
        } else {
            const float l = half ? lB : lA, inv = l > 0.f ? 1.f / l : 0.f;
            const size_t base = (hrow + r) * HD + dbase;
#pragma unroll
            for (int n = 0; n < OTW; n++) {
                const size_t at = base + n * 8 + 2 * t;
                float v0 = o[n][2 * half] * inv, v1 = o[n][2 * half + 1] * inv;
                if (gate) {
                    __nv_bfloat162 gv = *reinterpret_cast<const __nv_bfloat162 *>(gate + at);
                    v0 *= 1.f / (1.f + __expf(-__bfloat162float(gv.x)));
                    v1 *= 1.f / (1.f + __expf(-__bfloat162float(gv.y)));
                }
                *reinterpret_cast<uint32_t *>(out + at) = fp_pack(v0, v1);
            }
        }
    }
}

/* cuda_flash_prefill's decode kernel (LASTSTAND_FP_DEC=1, the row plan, calls of one new token per
 * sequence, grp <= 16): grid (n_seq, nkv, nsplit), block 128 threads (4 warps) on the 16 MMA rows
 * of one token's GQA group (rows >= grp are zero). Where fp_kernel gives each warp 16 rows of a
 * 64-row tile (for a decode token three warps work on zero rows), here the 4 warps share the rows
 * and split the work: S = Q·Kᵀ by head_dim quarters (warp w: dims HD/4·w ..), the four partial S
 * summed through shared memory in warp order (every warp then holds the same S and runs the same
 * online softmax), and O += P·V by head_dim quarters of V (warp w owns output dims HD/4·w ..).
 * Chunking, partials and merge as fp_kernel's row plan (chunk z of the sequence's keys -> partial
 * slot z; one chunk: written directly), the chunks dealt to grid.z blocks a row in contiguous runs
 * (fp_dec_gz): a block runs its run's key tiles through one pipeline and closes each chunk (partial
 * out, m / l / O reset) as that chunk's own block would, so the grid never changes a bit. (S24: a
 * block a chunk left a short row's blocks latency-bound, 2 key tiles each at 545 keys.) Shared: Qs [16][HD+8], STG stages of Ks, Vs [BN][HD+8] (BF16), Sred
 * [4][16][BN+8] fp32. STG = 2, or 4 for grids of at most one block per SM (STG - 1 key tiles in
 * flight: a decode block's loop waits on memory latency, not on its math); the stages do not
 * change the arithmetic. */
template <int HD, int BN, int STG>
__global__ void __launch_bounds__(FP_THREADS) fp_dec_kernel(const attn_seq *__restrict__ seqs, int nh, int nkv, int P,
                                                            float sl2, const bf16 *__restrict__ q,
                                                            const bf16 *__restrict__ gate, const bf16 *__restrict__ K,
                                                            const bf16 *__restrict__ V, bf16 *__restrict__ out,
                                                            float *__restrict__ part_o, float *__restrict__ part_ml,
                                                            int *__restrict__ part_n, int n_rows_total, int c0,
                                                            int ss, int early, int nsplit) {
    constexpr int LD = HD + 8, NT = BN / 8, CH = HD / 8, SB = BN + 8; /* SB: Sred row stride */
    constexpr int KKW = HD / 64;      /* k-steps (16 dims) of S per warp: its quarter of head_dim */
    constexpr int OTW = HD / 32;      /* dim n-tiles (8 dims) of O per warp */
    extern __shared__ __align__(16) unsigned char fp_smem[];
    bf16 *Qs = reinterpret_cast<bf16 *>(fp_smem);
    bf16 *KV = Qs + 16 * LD;
    float *Sred = reinterpret_cast<float *>(KV + STG * 2 * BN * LD); /* [4][16][SB] */

    const int grp = nh / nkv, kvh = blockIdx.y, s = blockIdx.x;
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    /* early (LASTSTAND_FP_EARLY, fp_early): the sequence table and the prologue's K/V tiles of
     * past keys only (written by earlier steps) are fetched before the wait for the kernel
     * before (q and the new token's K/V row); else everything after it */
    if (!early) {
        cu_pdl_wait();
        cu_pdl_trigger();
    }
    const int n_past = seqs[s].n_past, row0 = seqs[s].row0;
    const int32_t *__restrict__ pages = seqs[s].pages;
    const int kmax = n_past, n_ktiles = kmax / BN + 1;
    /* the row's chunks (the plan's, whatever the grid), dealt to the gridDim.z blocks of the row in
     * contiguous runs of cpb: this block's chunks zc0 .., its key tiles kt0 .. kt0 + n_it - 1 */
    const int ct = fp_rows_chunk(n_ktiles, c0, ss, nsplit), nc = (n_ktiles + ct - 1) / ct;
    const int cpb = (nc + (int)gridDim.z - 1) / (int)gridDim.z, zc0 = (int)blockIdx.z * cpb;
    if (zc0 >= nc) return;
    const int kt0 = zc0 * ct, n_it = min(cpb * ct, n_ktiles - kt0);
    const bool direct = nc == 1 || !part_o;
    const size_t hrow = (size_t)row0 * nh + kvh * grp; /* output row of query head kvh·grp + 0 */
    auto load_kv = [&](int kt, int st) {
        bf16 *Ks = KV + st * 2 * BN * LD, *Vs = Ks + BN * LD;
        for (int i = tid; i < BN * CH; i += FP_THREADS) {
            int r = i / CH, c = i % CH, j = kt * BN + r;
            size_t off = 0;
            int ok = j <= kmax;
            if (ok) off = (((size_t)pages[j / P] * P + j % P) * nkv + kvh) * HD + c * 8;
            fp_cp16(Ks + r * LD + c * 8, K + off, ok ? 16 : 0);
            fp_cp16(Vs + r * LD + c * 8, V + off, ok ? 16 : 0);
        }
    };
    /* prologue: tiles 0 .. STG - 2 in flight (group 0 also holds Q). Early, the tiles whose keys
     * all precede the new token go first, before the wait, and join group 0 (a tile in an
     * earlier group has landed by the time its own group's wait returns) */
    const auto is_early = [&](int p) { return early && p < n_it && (kt0 + p + 1) * BN <= n_past; };
    if (early) {
#pragma unroll
        for (int p = 0; p < STG - 1; p++)
            if (is_early(p)) load_kv(kt0 + p, p);
        cu_pdl_wait();
        cu_pdl_trigger();
    }
    if (zc0 == 0 && part_n && tid < grp) part_n[hrow + tid] = nc;
    for (int i = tid; i < 16 * CH; i += FP_THREADS) {
        const int r = i / CH, c = i % CH, ok = r < grp;
        fp_cp16(Qs + r * LD + c * 8, ok ? q + (hrow + r) * HD + c * 8 : q, ok ? 16 : 0);
    }
#pragma unroll
    for (int p = 0; p < STG - 1; p++) {
        if (p < n_it && !is_early(p)) load_kv(kt0 + p, p);
        fp_cp_commit();
    }

    const int limA = g < grp ? n_past : -1, limB = g + 8 < grp ? n_past : -1;
    float mA = -INFINITY, mB = -INFINITY, lA = 0.f, lB = 0.f;
    float o[OTW][4];
#pragma unroll
    for (int n = 0; n < OTW; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    fp_cp_wait<STG - 2>(); /* group 0: Q */
    __syncthreads();
    /* Q fragments of this warp's k-steps (rows 0..15, dims 64w + 16kk ..) */
    const bf16 *qa = Qs + (((lane >> 3) & 1) * 8 + (lane & 7)) * LD + (lane >> 4) * 8 + w * (HD / 4);
    uint32_t qf[KKW][4];
#pragma unroll
    for (int kk = 0; kk < KKW; kk++) fp_ldsm_x4(qf[kk], qa + kk * 16);

    for (int it = 0; it < n_it; it++) {
        const int kt = kt0 + it, st = it % STG;
        if (it + STG - 1 < n_it) load_kv(kt + STG - 1, (it + STG - 1) % STG); /* its stage was freed by it - 1 */
        fp_cp_commit();
        fp_cp_wait<STG - 1>(); /* all but the newest STG - 1 groups: tile it landed */
        __syncthreads();
        const bf16 *Ks = KV + st * 2 * BN * LD, *Vs = Ks + BN * LD;
        float sc[NT][4];
#pragma unroll
        for (int n = 0; n < NT; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.f;
        const bf16 *kb = Ks + ((lane >> 4) * 8 + (lane & 7)) * LD + ((lane >> 3) & 1) * 8 + w * (HD / 4);
#pragma unroll
        for (int kk = 0; kk < KKW; kk++) {
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                uint32_t b[4];
                fp_ldsm_x4(b, kb + np * 16 * LD + kk * 16);
                cu_mma_bf16_16816(sc[2 * np], qf[kk], b[0], b[1]);
                cu_mma_bf16_16816(sc[2 * np + 1], qf[kk], b[2], b[3]);
            }
        }
        /* the four head_dim quarters of S summed in warp order: accumulator (n, e) is row g (e < 2) or
         * g + 8, key 8n + 2t + (e & 1) */
        float *Sw = Sred + w * 16 * SB;
#pragma unroll
        for (int n = 0; n < NT; n++) {
            *reinterpret_cast<float2 *>(Sw + g * SB + 8 * n + 2 * t) = make_float2(sc[n][0], sc[n][1]);
            *reinterpret_cast<float2 *>(Sw + (g + 8) * SB + 8 * n + 2 * t) = make_float2(sc[n][2], sc[n][3]);
        }
        __syncthreads();
        float xA = -INFINITY, xB = -INFINITY;
#pragma unroll
        for (int n = 0; n < NT; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e < 2 ? g : g + 8, kc = 8 * n + 2 * t + (e & 1), key = kt * BN + kc;
                float v = Sred[r * SB + kc];
#pragma unroll
                for (int ww = 1; ww < 4; ww++) v += Sred[(ww * 16 + r) * SB + kc];
                const int lim = e < 2 ? limA : limB;
                v = key <= lim ? v * sl2 : -INFINITY;
                sc[n][e] = v;
                if (e < 2) xA = fmaxf(xA, v); else xB = fmaxf(xB, v);
            }
        }
        fp_softmax_step(sc, o, xA, xB, mA, mB, lA, lB);
        /* O[:, this warp's dims] += P·V */
        fp_pv<LD>(sc, o, Vs, lane, w * (HD / 4));
        __syncthreads(); /* stage st and Sred are rewritten by iteration it + 1 */
        if ((kt + 1) % ct == 0 || it == n_it - 1) { /* chunk kt / ct is done: its partial (or the row) */
            fp_dec_chunk_out<HD>(kt / ct, direct, grp, g, t, w, mA, mB, lA, lB, o, hrow, n_rows_total, part_o, part_ml,
                                 gate, out);
            mA = mB = -INFINITY; /* the next chunk starts from nothing, as its own block would */
            lA = lB = 0.f;
#pragma unroll
            for (int n = 0; n < OTW; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
        }
    }
    fp_cp_wait<0>();
}

/* split-K merge: grid (n_tok · nh), one warp per output row (token, head) = row:
 * M = max_z m_z, L = Σ l_z 2^{m_z − M}, out = (Σ O_z 2^{m_z − M}) / L, then the gate. */
template <int HD>
__global__ void fp_merge_kernel(int n_rows, int nsplit, const float *__restrict__ part_o,
                                const float *__restrict__ part_ml, const int *__restrict__ part_n,
                                const bf16 *__restrict__ gate, bf16 *__restrict__ out) {
    const size_t row = blockIdx.x;
    const int lane = threadIdx.x;
    if (part_n) { /* the row plan: the row's own chunk count; one chunk was written directly */
        const int k = part_n[row];
        if (k <= 1) return;
        nsplit = min(k, nsplit);
    }
    float M = -INFINITY;
    for (int z = 0; z < nsplit; z++) M = fmaxf(M, part_ml[2 * ((size_t)z * n_rows + row)]);
    float L = 0.f, acc[HD / 32];
#pragma unroll
    for (int i = 0; i < HD / 32; i++) acc[i] = 0.f;
    for (int z = 0; z < nsplit; z++) {
        const size_t pr = (size_t)z * n_rows + row;
        const float l = part_ml[2 * pr + 1];
        if (!(l > 0.f)) continue; /* a split that saw no key of this row */
        const float f = exp2f(part_ml[2 * pr] - M);
        L += l * f;
#pragma unroll
        for (int i = 0; i < HD / 32; i++) acc[i] += part_o[pr * HD + lane + 32 * i] * f;
    }
    const float inv = L > 0.f ? 1.f / L : 0.f;
#pragma unroll
    for (int i = 0; i < HD / 32; i++) {
        const size_t at = row * HD + lane + 32 * i;
        float v = acc[i] * inv;
        if (gate) v *= 1.f / (1.f + __expf(-__bfloat162float(gate[at])));
        out[at] = __float2bfloat16_rn(v);
    }
}

/* The row plan's merge: grid (n_tok · nh), block HD threads (thread d = output dim d), one output
 * row (token, head) = row per block, over the row's own chunk count k = part_n[row] (k <= 1: the
 * attention kernel wrote the row). Lanes hold the (m, l) of chunks lane and lane + 32 (k <=
 * FP_MAX_SPLIT = 64): M and L by warp shuffles (a fixed order), then O = Σ_z O_z 2^{m_z − M} in
 * chunk order, every load of the sum independent of the others. */
template <int HD>
__global__ void __launch_bounds__(HD) fp_merge_rows_kernel(int n_rows, int nsplit, const float *__restrict__ part_o,
                                                           const float *__restrict__ part_ml,
                                                           const int *__restrict__ part_n,
                                                           const bf16 *__restrict__ gate, bf16 *__restrict__ out) {
    cu_pdl_wait();
    cu_pdl_trigger();
    const size_t row = blockIdx.x;
    const int d = threadIdx.x, lane = d & 31;
    const int k = min(part_n[row], nsplit);
    if (k <= 1) return;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f;
    if (lane < k) {
        m0 = part_ml[2 * ((size_t)lane * n_rows + row)];
        l0 = part_ml[2 * ((size_t)lane * n_rows + row) + 1];
    }
    if (lane + 32 < k) {
        m1 = part_ml[2 * ((size_t)(lane + 32) * n_rows + row)];
        l1 = part_ml[2 * ((size_t)(lane + 32) * n_rows + row) + 1];
    }
    float M = fmaxf(l0 > 0.f ? m0 : -INFINITY, l1 > 0.f ? m1 : -INFINITY);
#pragma unroll
    for (int o = 16; o; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    const float f0 = l0 > 0.f ? exp2f(m0 - M) : 0.f, f1 = l1 > 0.f ? exp2f(m1 - M) : 0.f;
    float L = l0 * f0 + l1 * f1;
#pragma unroll
    for (int o = 16; o; o >>= 1) L += __shfl_xor_sync(0xffffffffu, L, o);
    float acc = 0.f;
#pragma unroll 8
    for (int z = 0; z < k; z++) {
        const float f = __shfl_sync(0xffffffffu, z < 32 ? f0 : f1, z & 31);
        if (f != 0.f) acc += part_o[((size_t)z * n_rows + row) * HD + d] * f;
    }
    const size_t at = row * HD + d;
    float v = acc * (L > 0.f ? 1.f / L : 0.f);
    if (gate) v *= 1.f / (1.f + __expf(-__bfloat162float(gate[at])));
    out[at] = __float2bfloat16_rn(v);
}

/* ---- host side --------------------------------------------------------------- */

/* Per-device split-K workspace (grown, never shrunk) and SM count. */
typedef struct fp_ws {
    float *part;
    size_t cap;
    int n_sm;
    pthread_mutex_t mu;
    int init;
} fp_ws;
static fp_ws g_fpws[FP_MAX_DEV];
static pthread_mutex_t g_fpws_mu = PTHREAD_MUTEX_INITIALIZER;

static int fp_ws_lock(fp_ws **out, ls_err *e) {
    int dev = 0;
    CU_TRY(e, cudaGetDevice(&dev), "cudaGetDevice");
    if (dev < 0 || dev >= FP_MAX_DEV) return errf(e, ERR_UNSUPPORTED, "cuda_flash_prefill: device %d out of range", dev);
    pthread_mutex_lock(&g_fpws_mu);
    if (!g_fpws[dev].init) {
        pthread_mutex_init(&g_fpws[dev].mu, NULL);
        int n = 0;
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) n = 100;
        g_fpws[dev].n_sm = n;
        g_fpws[dev].init = 1;
    }
    pthread_mutex_unlock(&g_fpws_mu);
    pthread_mutex_lock(&g_fpws[dev].mu);
    *out = &g_fpws[dev];
    return 0;
}

static int fp_supported(const dev_info *d, const attn_shape *s, char *why, size_t n) {
    if (d->kind != DEV_CUDA) {
        snprintf(why, n, "needs a CUDA device");
        return 0;
    }
    if (d->cc_major && d->cc_major < 8) {
        snprintf(why, n, "needs BF16 mma.sync (compute capability 8.0+, this is %d.%d)", d->cc_major, d->cc_minor);
        return 0;
    }
    if (s->dt != ACT_BF16) {
        snprintf(why, n, "activations and KV must be BF16");
        return 0;
    }
    int hd = s->head_dim;
    if ((hd != 32 && hd != 64 && hd != 128 && hd != 256) || s->n_kv_heads <= 0 || s->n_heads % s->n_kv_heads) {
        snprintf(why, n, "needs head_dim 32/64/128/256 and heads divisible by kv heads (hd=%d, %d/%d)", hd,
                 s->n_heads, s->n_kv_heads);
        return 0;
    }
    return 1;
}

/* The split plan, LASTSTAND_FP_PLAN (read once):
 *   "round"                split-K by round-robin key tiles, the split count from the batch:
 *                          host planning from seqs_host (tile count, longest context), device
 *                          planning (graph capture) from the tile bound and ctx_cap; a row's
 *                          rounding then depends on the batch and the planning, so a replayed
 *                          decode step is not bitwise the eager one;
 *   "rows" (the default)   the row plan (fp_rows_chunk) for decode calls and device planning,
 *                          round-robin for calls with longer sequences: a decode row's rounding
 *                          depends on its own context only, captured or eager;
 *   an integer N           round-robin with N splits under both plannings (diagnostics). */
/* Defaults of the plan and the knobs below. H200 round R1 (2026-11-29 19:38Z): the row plan and
 * fp_dec_kernel gave the eager tokens under graph replay (136/136 on the synth 35B, where the round
 * plan gave 19/136) and the doctor's fp64 check passed at the 397B and 35B shapes; M = 1: 14.1 µs
 * with fp_dec_kernel and PDL 2, 17.2 round plan, 19.3 row plan on fp_kernel (397B). */
enum { FP_DEF_PLAN = 1, FP_DEF_DEC = 1, FP_DEF_PDL = 2 };
/* fp_dec_kernel's pipeline depth: 0 = 4 stages on grids of at most a block per SM, 2 above (R3:
 * M = 1 397B 14.1 -> 13.6 µs at 512 positions, 16.0 -> 15.6 at 4096, 29.7 -> 29.1 at 16384; the
 * same tokens bit for bit; forcing 4 at M = 8 / 64 costs occupancy: 39.0 -> 49.9, 240.8 -> 355.2) */
enum { FP_DEF_STAGES = 0 };
static int g_fp_plan = -1; /* 0 round, 1 rows, 2 forced */
static int g_fp_force = 1;
/* Benchmark knobs, read with the plan: LASTSTAND_FP_CHUNK = the row plan's chunk in keys (32 .. 1024,
 * FP_CHUNK_KEYS by default); LASTSTAND_FP_PDL = 0: plain launches, 1: the merge kernel as a
 * programmatic dependent launch of the attention kernel, 2: the attention kernel too (of whatever
 * ran before it); LASTSTAND_FP_DEC = 1 / 0: fp_dec_kernel for the row plan's
 * one-token-per-sequence calls, or fp_kernel; 2: fp_dec_kernel with 64-key tiles at head_dim 256;
 * LASTSTAND_FP_STAGES = 2 / 4: fp_dec_kernel's pipeline depth, 0: 4 on grids of at most a block
 * per SM, else 2. */
static int g_fp_ckeys = FP_CHUNK_KEYS, g_fp_ss = FP_SHORT_SPLIT, g_fp_pdl = FP_DEF_PDL, g_fp_dec = FP_DEF_DEC, g_fp_stages = FP_DEF_STAGES;
/* LASTSTAND_FP_LPT = 1 (default since S9 round R1: 8192-token TTFT 251.7 -> 247.2 ms, the
 * doctor's verdicts unchanged): fp_kernel under the round plan (prefill chunks) takes its tiles
 * longest first (reverse order); each tile's arithmetic is unchanged, only the order blocks start
 * in; 0: ascending. */
static int g_fp_lpt = 1;
/* LASTSTAND_FP_WG = 1 (default since the attnpre session's standalone harness on an H200: right
 * against an fp32 reference on sampled rows, one 8192-token causal prompt at the 35B shape 1.33 ms,
 * 415 TFLOP/s, where fp_kernel ran ~166): head_dim 256 calls under the round plan (host-planned
 * prefill chunks) run attention_prefill_wg.cu's wgmma kernel (sm_90a; fp_kernel where the device has
 * no such image); 0: fp_kernel. */
enum { FP_DEF_WG = 1 };
static int g_fp_wg = FP_DEF_WG;
/* LASTSTAND_FP_WG128 = 1 (default since S14): head_dim 128 (Qwen3-MoE, Qwen3-235B) too, in 128 x 128
 * tiles; 0: fp_kernel there. The S14 doctor, one causal 8192-token prompt at the Qwen3-30B-A3B
 * shape (32 / 4 heads): fp_kernel 3.577 ms, 153.7 TFLOP/s (see bench/RESULTS.md for the wgmma form). */
static int g_fp_wg128 = 1;

static int fp_plan_mode(void) {
    if (g_fp_plan >= 0) return g_fp_plan;
    const char *ck = getenv("LASTSTAND_FP_CHUNK"), *pd = getenv("LASTSTAND_FP_PDL");
    if (ck && atoi(ck) >= 32 && atoi(ck) <= 1024) g_fp_ckeys = atoi(ck);
    const char *ss = getenv("LASTSTAND_FP_SHORT");
    if (ss && *ss && strlen(ss) <= 2 && strspn(ss, "0123456789") == strlen(ss) && atoi(ss) <= FP_MAX_SPLIT)
        g_fp_ss = atoi(ss); /* 0 .. FP_MAX_SPLIT; anything else: the default */
    if (pd && pd[0] >= '0' && pd[0] <= '2' && !pd[1]) g_fp_pdl = pd[0] - '0';
    const char *dk = getenv("LASTSTAND_FP_DEC");
    if (dk && dk[0] >= '0' && dk[0] <= '2' && !dk[1]) g_fp_dec = dk[0] - '0';
    g_fp_lpt = cu_env_switch("LASTSTAND_FP_LPT", g_fp_lpt);
    g_fp_wg = cu_env_switch("LASTSTAND_FP_WG", g_fp_wg);
    g_fp_wg128 = cu_env_switch("LASTSTAND_FP_WG128", g_fp_wg128);
    const char *sg = getenv("LASTSTAND_FP_STAGES");
    if (sg && (!strcmp(sg, "0") || !strcmp(sg, "2") || !strcmp(sg, "4"))) g_fp_stages = sg[0] - '0';
    const char *v = getenv("LASTSTAND_FP_PLAN");
    int mode = FP_DEF_PLAN;
    if (v && !strcmp(v, "rows")) {
        mode = 1;
    } else if (v && !strcmp(v, "round")) {
        mode = 0;
    } else if (v && *v >= '1' && *v <= '9') {
        int n = atoi(v);
        g_fp_force = n < 1 ? 1 : n > FP_MAX_SPLIT ? FP_MAX_SPLIT : n;
        mode = 2;
    } else if (v && *v) {
        log_warn("LASTSTAND_FP_PLAN=%s: not round, rows or a split count; using the default", v);
    }
    g_fp_plan = mode;
    return mode;
}

/* Round-robin split count: when the tiles x kv heads do not fill the GPU twice over, the keys of
 * each tile are dealt round-robin (BN-key tiles) to nsplit blocks, at least 64 keys each on average.
 * Host planning reads seqs_host (exact tile count, longest context); device planning (ctx_cap > 0,
 * graph capture) takes the tile bound ceil(n_tok·grp / 64) + n_seq and ctx_cap. */
static int fp_nsplit(const attn_args *a, int n_sm, int BN) {
    const int grp = a->n_heads / a->n_kv_heads;
    long tiles = 0;
    int max_ctx = 0;
    if (a->ctx_cap > 0) {
        tiles = ((long)a->n_tok * grp + FP_BM - 1) / FP_BM + a->n_seq;
        max_ctx = a->ctx_cap;
    } else {
        for (int i = 0; i < a->n_seq; i++) {
            const attn_seq *q = &a->seqs_host[i];
            tiles += ((long)q->n_new * grp + FP_BM - 1) / FP_BM;
            if (q->n_new > 0 && q->n_past + q->n_new > max_ctx) max_ctx = q->n_past + q->n_new;
        }
    }
    const long blocks = tiles * a->n_kv_heads;
    if (blocks <= 0 || blocks >= 2L * n_sm) return 1;
    long want = (2L * n_sm + blocks - 1) / blocks, cap = (max_ctx + 63) / 64, kt = (max_ctx + BN - 1) / BN;
    long n = want < cap ? want : cap;
    if (n > kt) n = kt;
    if (n > 64) n = 64;
    return n < 2 ? 1 : (int)n;
}

/* The wgmma kernel's split count (host planning): its CTAs (FW_BM-row tiles x kv heads, one CTA an
 * SM) split round-robin by key tiles only when they would not fill half the GPU, to about one CTA an
 * SM, at least 256 keys a split on average. Device round R1 (attnpre): a 1024-token prompt (128
 * CTAs) took 86.1 µs with 3 splits and the merge, where the standalone harness ran it unsplit in
 * 61 µs (the partials' 50 MB round trip and the merge cost more than the idle SMs). */
static int fw_nsplit(const attn_args *a, int n_sm) {
    const int grp = a->n_heads / a->n_kv_heads;
    long tiles = 0;
    int max_ctx = 0;
    for (int i = 0; i < a->n_seq; i++) {
        const attn_seq *q = &a->seqs_host[i];
        tiles += ((long)q->n_new * grp + FW_BM - 1) / FW_BM;
        if (q->n_new > 0 && q->n_past + q->n_new > max_ctx) max_ctx = q->n_past + q->n_new;
    }
    const long blocks = tiles * a->n_kv_heads;
    if (blocks <= 0 || 2 * blocks >= n_sm) return 1;
    long n = (n_sm + blocks - 1) / blocks, cap = (max_ctx + 255) / 256;
    if (n > cap) n = cap;
    if (n > 64) n = 64;
    return n < 2 ? 1 : (int)n;
}

/* The row plan's chunk in key tiles of BN keys. */
static int fp_rows_c0(int BN) { return g_fp_ckeys / BN > 1 ? g_fp_ckeys / BN : 1; }

/* Row-plan chunk count of a tile whose last key is kmax (fp_kernel's n_ktiles = kmax / BN + 1). */
static int fp_rows_nc(long kmax, int BN) {
    const int nk = (int)(kmax / BN + 1), ct = fp_rows_chunk(nk, fp_rows_c0(BN), g_fp_ss, 0);
    return (nk + ct - 1) / ct;
}

/* The row plan's split count (grid.z) for a call: host planning, the most chunks any tile has;
 * device planning, the most any context up to ctx_cap can have. 0: not a row-plan call. */
static int fp_rows_nsplit(const attn_args *a, int BN) {
    if (a->ctx_cap > 0) {
        return fp_rows_nsplit_cap(((long)a->ctx_cap - 1) / BN + 1, fp_rows_c0(BN), g_fp_ss);
    }
    const int grp = a->n_heads / a->n_kv_heads;
    int most = 1;
    for (int i = 0; i < a->n_seq; i++)
        if (a->seqs_host[i].n_new > FP_ROWS_MAX_NEW) return 0;
    for (int i = 0; i < a->n_seq; i++) {
        const attn_seq *q = &a->seqs_host[i];
        const int nt = (q->n_new * grp + FP_BM - 1) / FP_BM;
        for (int t = 0; t < nt; t++) { /* tile t's last row: flat row min(64(t+1), n_new·grp) - 1 */
            const int f_last = ((t + 1) * FP_BM < q->n_new * grp ? (t + 1) * FP_BM : q->n_new * grp) - 1;
            const int nc = fp_rows_nc((long)q->n_past + f_last / grp, BN);
            if (nc > most) most = nc;
        }
    }
    return most;
}

/* Bytes of device-planning scratch cuda_flash_prefill needs for n_tok tokens (the row plan at
 * ctx_cap, whatever its chunk: partials of FP_MAX_SPLIT chunks at most, a chunk count per row). */
extern "C" size_t attn_fp_scratch_bytes(int n_tok, int n_heads, int head_dim, int ctx_cap) {
    if (n_tok < 1 || ctx_cap < 1 || head_dim < 1) return 0;
    const int BN = head_dim >= 256 ? 32 : 64;
    const long ns = fp_rows_scratch_splits(((long)ctx_cap - 1) / BN + 1);
    const size_t rows = (size_t)n_tok * n_heads;
    return sizeof(float) * rows * (head_dim + 2) * (size_t)ns + sizeof(int) * rows;
}

/* LASTSTAND_FP_EARLY=0|1: fp_dec_kernel fetches its sequence and the K/V tiles of past keys of its
 * pipeline's prologue before griddepcontrol.wait (1), or everything after it (0). FP_DEF_EARLY on
 * since S7 device round R2 (2026-11-30, bench/device/stepfuse.sh): the doctor ✅ (fp64) at the
 * 35B shape, M = 1 and 8, test_attn_cuda's graph-replay check (fp64, eager bits) passed, the
 * arithmetic unchanged; with 64-key chunks the 40-layer synth 35B decode step 2.465 -> 2.421 ms
 * (the chunks alone -0.036 ms in R1; they stay 128 keys: at M = 8 and 64 shorter chunks cost
 * more than they save: bench/RESULTS.md, the attngraph session's R2). Read once. */
enum { FP_DEF_EARLY = 1 };
static int fp_early(void) {
    static int v = -1;
    if (v < 0) v = cu_env_switch("LASTSTAND_FP_EARLY", FP_DEF_EARLY);
    return v;
}

/* LASTSTAND_FP_BPS = N (FP_DEF_BPS; read once): fp_dec_kernel's blocks a row (grid.z) are the fewest
 * that give the call about N blocks an SM (a row's chunks dealt to them in contiguous runs, the key
 * tiles of a run in one pipeline), never more than the plan's split count; 0: a block a chunk slot
 * (grid.z = the split count, before S24). The chunks, and so every sum and the bits, are the row
 * plan's whatever the grid: a block finishes each chunk as that chunk's own block would. Measured
 * (S24, H200, the synth 35B's decode step with graphs, ~545-key contexts, ids equal at every N):
 * B = 128 14.721 ms (0) -> 14.322 (2), 14.310 (1), 14.301 (4); B = 64 11.126 -> 11.007; B = 16 5.944
 * -> 5.931; B = 1 2.383 -> 2.374 (there the grid is the split count either way). At 4000-token
 * contexts (32 chunks a row) B = 64: 9.497 (0), 9.690 (2: 3 blocks a row, 1.45 waves of 44-tile
 * runs, a long last wave), 9.464 (4: 5 blocks a row, 2.4 waves), so 4 is the default since S25. */
enum { FP_DEF_BPS = 4 };
static int fp_bps(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("LASTSTAND_FP_BPS");
        v = e && e[0] >= '0' && e[0] <= '9' && !e[1] ? e[0] - '0' : FP_DEF_BPS;
    }
    return v;
}

/* fp_dec_kernel's grid.z for a call of the row plan's split count nsplit (see fp_bps) */
static int fp_dec_gz(const attn_args *a, int nsplit, int n_sm) {
    const int bps = fp_bps();
    const long rows = (long)a->n_seq * a->n_kv_heads;
    if (bps <= 0 || rows <= 0) return nsplit;
    const long want = ((long)bps * n_sm + rows - 1) / rows;
    return want >= nsplit ? nsplit : want < 1 ? 1 : (int)want;
}

/* fp_dec_kernel<HD, BN> on grid (n_seq, nkv, gz): the shared-memory opt-in once per device
 * (dev: the device's index, under its workspace lock), then the launch. */
template <int HD, int BN, int STG>
static cudaError_t fp_dec_launch(const attn_args *a, int dev, int nsplit, int gz, float sl2, float *po, float *pml,
                                 int *pn, int n_rows, cudaStream_t st) {
    constexpr size_t dsmem =
        (size_t)(16 + 2 * STG * BN) * (HD + 8) * sizeof(bf16) + sizeof(float) * 4 * 16 * (BN + 8);
    static int ddone[FP_MAX_DEV];
    if (!ddone[dev]) {
        cudaError_t c = cudaFuncSetAttribute(fp_dec_kernel<HD, BN, STG>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)dsmem);
        if (c != cudaSuccess) return c;
        ddone[dev] = 1;
    }
    return cu_launch_pdl(g_fp_pdl >= 2, fp_dec_kernel<HD, BN, STG>, dim3(a->n_seq, a->n_kv_heads, gz),
                       dim3(FP_THREADS),
                       dsmem, st, a->seqs, a->n_heads, a->n_kv_heads, a->kv->page_size, sl2, (const bf16 *)a->q,
                       (const bf16 *)a->gate, (const bf16 *)a->kv->k, (const bf16 *)a->kv->v, (bf16 *)a->out, po,
                       pml, pn, n_rows, fp_rows_c0(BN), g_fp_ss, fp_early(), nsplit);
}

template <int HD, int BN>
static int fp_launch(const attn_args *a, cudaStream_t st, ls_err *e) {
    constexpr size_t smem = (size_t)(FP_BM + 4 * BN) * (HD + 8) * sizeof(bf16);
    fp_ws *ws;
    int rc = fp_ws_lock(&ws, e);
    if (rc) return rc;
    /* opt in to more than 48 KB of shared memory, once per device (under the device's lock) */
    static int done[FP_MAX_DEV];
    const int dev = (int)(ws - g_fpws);
    if (!done[dev]) {
        cudaError_t c = cudaFuncSetAttribute(fp_kernel<HD, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (c != cudaSuccess) {
            pthread_mutex_unlock(&ws->mu);
            return cu_fail(e, c, "cuda_flash_prefill: shared memory opt-in");
        }
        done[dev] = 1;
    }
    const int grp = a->n_heads / a->n_kv_heads;
    const long tiles = ((long)a->n_tok * grp + FP_BM - 1) / FP_BM + a->n_seq;
    const int mode = fp_plan_mode();
    /* fp_dec_kernel: the row plan's one-token-per-sequence calls (host planning checks; device
     * planning is a decode step's capture: n_tok = n_seq); LASTSTAND_FP_DEC=2: with 64-key tiles
     * at head_dim 256 (DBN, which the row plan's chunk count then follows) */
    int dec = mode == 1 && g_fp_dec && HD >= 64 && grp <= 16 && a->n_tok == a->n_seq;
    for (int i = 0; dec && a->ctx_cap <= 0 && i < a->n_seq; i++) dec = a->seqs_host[i].n_new == 1;
    const int DBN = dec && g_fp_dec == 2 && HD == 256 ? 64 : BN;
    const int rows = mode == 1 ? fp_rows_nsplit(a, DBN) : 0;
    /* the wgmma kernel: head_dim 256, the round plan, host planning, LASTSTAND_FP_WG, an sm_90a image */
    const int wgk = (HD == 256 || (HD == 128 && g_fp_wg128)) && rows == 0 && a->ctx_cap <= 0 && g_fp_wg && fw_available();
    int nsplit = rows > 0 ? rows : mode == 2 ? g_fp_force : wgk ? fw_nsplit(a, ws->n_sm) : fp_nsplit(a, ws->n_sm, BN);
    const int n_rows = a->n_tok * a->n_heads;
    /* partials [nsplit][n_rows][HD], (m, l) [nsplit][n_rows][2], the row plan's chunk counts [n_rows] */
    const size_t per = sizeof(float) * (size_t)n_rows * (HD + 2), tail = rows > 0 ? sizeof(int) * (size_t)n_rows : 0;
    float *po = NULL, *pml = NULL;
    int *pn = NULL;
    if (nsplit > 1 && a->ctx_cap > 0) { /* device planning: partials in the caller's scratch, as many splits as fit */
        const size_t fit = a->scratch && a->scratch_bytes > tail ? (a->scratch_bytes - tail) / per : 0;
        if ((size_t)nsplit > fit) nsplit = (int)fit;
        if (nsplit > 1) {
            po = (float *)a->scratch;
            pml = po + (size_t)nsplit * n_rows * HD;
            if (rows > 0) pn = (int *)(pml + (size_t)nsplit * n_rows * 2);
        } else {
            nsplit = 1;
        }
    } else if (nsplit > 1) {
        size_t need = per * nsplit + tail;
        if (ws->cap < need) {
            if (ws->part) {
                cudaDeviceSynchronize(); /* growth only: the old buffer may still be in use */
                cudaFree(ws->part);
            }
            ws->part = NULL;
            ws->cap = 0;
            cudaError_t c = cudaMalloc((void **)&ws->part, need);
            if (c != cudaSuccess) {
                pthread_mutex_unlock(&ws->mu);
                return cu_fail(e, c, "cuda_flash_prefill: split-K workspace");
            }
            ws->cap = need;
        }
        po = ws->part;
        pml = ws->part + (size_t)nsplit * n_rows * HD;
        if (rows > 0) pn = (int *)(pml + (size_t)nsplit * n_rows * 2);
    }
    const float sl2 = a->scale * 1.4426950408889634f;
    cudaError_t c1 = cudaSuccess;
    if (dec && rows > 0) {
        const int gz = fp_dec_gz(a, nsplit, ws->n_sm);
        /* 4 stages where the grid is at most a block per SM (LASTSTAND_FP_STAGES: 2 / 4 force one) */
        const long ctas = (long)a->n_seq * a->n_kv_heads * gz;
        const int stg4 = g_fp_stages ? g_fp_stages == 4 : ctas <= ws->n_sm;
        if constexpr (HD == 256) {
            c1 = DBN == 64 ? fp_dec_launch<256, 64, 2>(a, dev, nsplit, gz, sl2, po, pml, pn, n_rows, st)
                 : stg4    ? fp_dec_launch<256, BN, 4>(a, dev, nsplit, gz, sl2, po, pml, pn, n_rows, st)
                           : fp_dec_launch<256, BN, 2>(a, dev, nsplit, gz, sl2, po, pml, pn, n_rows, st);
        } else if constexpr (HD >= 64) {
            c1 = stg4 ? fp_dec_launch<HD, BN, 4>(a, dev, nsplit, gz, sl2, po, pml, pn, n_rows, st)
                      : fp_dec_launch<HD, BN, 2>(a, dev, nsplit, gz, sl2, po, pml, pn, n_rows, st);
        }
    } else if (wgk) {
        const long wtiles = ((long)a->n_tok * grp + FW_BM - 1) / FW_BM + a->n_seq;
        c1 = fw_launch(HD, dim3((unsigned)wtiles, a->n_kv_heads, nsplit), g_fp_pdl >= 2, st, a->n_seq, a->seqs, a->n_heads,
                       a->n_kv_heads, a->kv->page_size, (long)a->kv->n_pages * a->kv->page_size, sl2, (const bf16 *)a->q, (const bf16 *)a->gate,
                       (const bf16 *)a->kv->k, (const bf16 *)a->kv->v, (bf16 *)a->out, po, pml, n_rows, g_fp_lpt);
    } else {
    dim3 grid((unsigned)tiles, a->n_kv_heads, nsplit);
    c1 = cu_launch_pdl(g_fp_pdl >= 2, fp_kernel<HD, BN>, grid, dim3(FP_THREADS), smem, st, a->n_seq, a->seqs,
                                 a->n_heads, a->n_kv_heads, a->kv->page_size, sl2, (const bf16 *)a->q,
                                 (const bf16 *)a->gate, (const bf16 *)a->kv->k, (const bf16 *)a->kv->v,
                                 (bf16 *)a->out, po, pml, pn, n_rows, rows > 0 ? fp_rows_c0(BN) : 0, g_fp_ss,
                                 rows > 0 ? 0 : g_fp_lpt);
    }
    if (c1 == cudaSuccess && nsplit > 1) {
        if (rows > 0)
            c1 = cu_launch_pdl(g_fp_pdl >= 1, fp_merge_rows_kernel<HD>, dim3(n_rows), dim3(HD), 0, st, n_rows, nsplit,
                             (const float *)po, (const float *)pml, (const int *)pn, (const bf16 *)a->gate,
                             (bf16 *)a->out);
        else
            fp_merge_kernel<HD><<<n_rows, 32, 0, st>>>(n_rows, nsplit, po, pml, pn, (const bf16 *)a->gate,
                                                       (bf16 *)a->out);
    }
    if (c1 != cudaSuccess) {
        pthread_mutex_unlock(&ws->mu);
        return cu_fail(e, c1, "attention cuda_flash_prefill");
    }
    cudaError_t c = cudaGetLastError();
    pthread_mutex_unlock(&ws->mu);
    if (c != cudaSuccess) return cu_fail(e, c, "attention cuda_flash_prefill");
    return 0;
}

static int fp_run(const attn_args *a, ls_stream s, ls_err *e) {
    if (a->dt != ACT_BF16 || a->kv->dt != ACT_BF16)
        return errf(e, ERR_UNSUPPORTED, "cuda_flash_prefill: BF16 activations and KV only");
    if (a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads)
        return errf(e, ERR_UNSUPPORTED, "cuda_flash_prefill: %d heads over %d kv heads", a->n_heads, a->n_kv_heads);
    if (a->n_tok <= 0 || a->n_seq <= 0) return 0;
    /* host planning validates the host copy (the kernel trusts the device array); device planning
     * (ctx_cap > 0) may have no host copy */
    if (a->ctx_cap <= 0 && !a->seqs_host)
        return errf(e, ERR_INVAL, "cuda_flash_prefill: seqs_host (the host copy of the sequences) is not set");
    for (int i = 0; a->seqs_host && i < a->n_seq; i++) {
        const attn_seq *q = &a->seqs_host[i];
        if (q->row0 < 0 || q->n_new < 0 || q->n_past < 0 || q->row0 + q->n_new > a->n_tok)
            return errf(e, ERR_INVAL, "attention: sequence %d rows [%d, %d) outside %d tokens", i, q->row0,
                        q->row0 + q->n_new, a->n_tok);
    }
    cudaStream_t st = (cudaStream_t)s;
    switch (a->head_dim) {
    case 32: return fp_launch<32, 64>(a, st, e);
    case 64: return fp_launch<64, 64>(a, st, e);
    case 128: return fp_launch<128, 64>(a, st, e);
    case 256: return fp_launch<256, 32>(a, st, e);
    default: return errf(e, ERR_UNSUPPORTED, "cuda_flash_prefill: head_dim %d not 32/64/128/256", a->head_dim);
    }
}

/* graph_safe: with ctx_cap > 0 it only launches kernels (partials in the caller's scratch); the
 * shared-memory opt-in happens on the first (eager or rehearsal) call */
const attn_impl attn_cuda_flash_prefill = {"cuda_flash_prefill", DEV_CUDA, 0, fp_supported, fp_run, 1};
