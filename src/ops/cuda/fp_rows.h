/* fp_rows.h: cuda_flash_prefill's row plan (attention_prefill.cu), in a header that C can include
 * too, so that its invariants are checked on the CPU (tests/unit/test_fp_rows.c): how a decode row's
 * keys are cut into chunks, and how many split slots a CUDA-graph step (device planning) reserves.
 * A row's chunks must depend on its own context only (a replayed decode step is bitwise the eager
 * one), so the grid's split count may never bind: fp_rows_nsplit_cap must be at least the chunk count
 * of every context up to the cap, and the scratch's split count (fp_rows_scratch_splits) at least that.
 * Pure arithmetic, no state.
 */
#ifndef LS_OPS_CUDA_FP_ROWS_H
#define LS_OPS_CUDA_FP_ROWS_H

#ifdef __CUDACC__
#define FP_ROWS_FN __host__ __device__ __forceinline__
#else
#define FP_ROWS_FN static inline
#endif

/* Chunks of FP_CHUNK_KEYS keys (LASTSTAND_FP_CHUNK), at most FP_MAX_SPLIT per tile (longer chunks past
 * FP_CHUNK_KEYS x FP_MAX_SPLIT keys); a short context's chunks: up to FP_SHORT_SPLIT of them, shorter
 * than FP_CHUNK_KEYS (down to one key tile), so that a decode row of a few hundred keys still spreads
 * over ~16 blocks a kv head (LASTSTAND_FP_SHORT = N: up to N <= FP_MAX_SPLIT, 0: chunks of
 * FP_CHUNK_KEYS keys whatever the context). */
enum { FP_CHUNK_KEYS = 128, FP_MAX_SPLIT = 64, FP_SHORT_SPLIT = 16 };

/* Key tiles per chunk under the row plan, for a tile of n_ktiles key tiles: c0 (the chunk's key
 * tiles, FP_CHUNK_KEYS / BN), shorter for a short context so that it still makes up to ss chunks
 * (ceil(n_ktiles / ss) tiles, at least one; ss = 0: never shorter), or ceil(n_ktiles /
 * FP_MAX_SPLIT) tiles when that is longer; and no more than `most` chunks (the grid's split count:
 * a grid smaller than the plan, which the launcher never makes, still covers every key, in longer
 * chunks). Whatever ss, the chunk depends on the tile's own context only. */
FP_ROWS_FN int fp_rows_chunk(int n_ktiles, int c0, int ss, int most) {
    int ct = c0 > 1 ? c0 : 1;
    if (ss > 0) {
        const int sh = (n_ktiles + ss - 1) / ss;
        if (sh < ct) ct = sh > 1 ? sh : 1;
    }
    const int lng = (n_ktiles + FP_MAX_SPLIT - 1) / FP_MAX_SPLIT;
    if (lng > ct) ct = lng;
    if (most > 0 && (n_ktiles + ct - 1) / ct > most) ct = (n_ktiles + most - 1) / most;
    return ct;
}

/* Device planning's split count: the most chunks any context of 1 .. cap_tiles key tiles has. A
 * context of c tiles has at most min(c, ss) chunks while it is short (ss chunks or fewer), ceil(c /
 * c0) once its chunks are c0 tiles, never more than FP_MAX_SPLIT. */
FP_ROWS_FN int fp_rows_nsplit_cap(long cap_tiles, int c0, int ss) {
    const long c = c0 > 1 ? c0 : 1;
    long n = (cap_tiles + c - 1) / c;
    const long sh = cap_tiles < ss ? cap_tiles : ss;
    if (sh > n) n = sh;
    if (n < 1) n = 1;
    return n > FP_MAX_SPLIT ? FP_MAX_SPLIT : (int)n;
}

/* The split slots attn_fp_scratch_bytes reserves for a context of up to cap_tiles key tiles, whatever
 * the chunk knobs: min(cap_tiles, FP_MAX_SPLIT), at least 1. */
FP_ROWS_FN long fp_rows_scratch_splits(long cap_tiles) {
    return cap_tiles > FP_MAX_SPLIT ? FP_MAX_SPLIT : cap_tiles < 1 ? 1 : cap_tiles;
}

#endif
