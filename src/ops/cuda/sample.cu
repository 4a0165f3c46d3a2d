/* sample.cu: the engine's sampler on the GPU (ops.h "sampling on the
 * device"; semantics of src/engine/sampler.h, kept identical where the API
 * defines them). Two forms of the same steps, each one launch with a fixed grid
 * per batch size (capturable into a CUDA graph, no host reads): one thread-block
 * cluster of SMW_CL blocks per logits row (smw_row_kernel, the default, below),
 * or one block of SMP_T threads per row (sample_block.cu, LASTSTAND_SAMPLE_WIDE=0),
 * which leaves all but one SM idle at batch 1. What both use: sample_int.cuh.
 *
 * Per row, in order (each step a pass over the row, block-synchronised):
 *   1. raw logits (BF16 or fp32) widened to the fp32 work row; the first
 *      NaN/Inf index is recorded and ends the row (smp_out.bad_idx); a
 *      constrained row's refused ids (smp_row.n_mask: its grammar bitmask in
 *      toks, one 32-bit word read per 16-byte load) become -inf here, so the
 *      widen's maximum and argmax are the masked row's and a masked greedy row
 *      without logprobs still ends in this pass; rows without a mask pay a
 *      null test per load;
 *   2. logit_bias (smp_row.n_bias: distinct ids, each bias added to the raw
 *      logit, as the host adds it before masking: a refused id stays -inf),
 *      bans (-inf), repetition penalty over the distinct prompt + output ids
 *      (positive divided, negative multiplied), frequency · count + presence
 *      subtracted per distinct output id: sparse, from the row's token lists;
 *   3. greedy (temperature <= 0 or top_k == 1): argmax of the penalised
 *      logits, lowest id on ties (a row with no edits and no logprobs takes
 *      it during step 1's scan and stops there);
 *   4. s = x / T (x when T == 1, exactly the host's float ops), m = max s,
 *      Z = Σ exp(s - m) (fp32 terms, fp64 sum): logprob = s - m - log Z;
 *   5. top_k and top_p as thresholds on a 64-bit rank key (the float's
 *      ordered bits, then the complement of the id: descending key = the
 *      host's order, higher value then lower id). The k-th largest key and
 *      the nucleus' last key: the cluster form (by default) finds them by
 *      wide-digit histograms (10 bits a pass, masses in 2^-40 fixed point
 *      summed exactly) and a finish among <= 256 candidates in shared memory
 *      (cl_key_select, below: the design and the error bound), and also takes
 *      m from the widen's maximum when nothing edits the row, and Z (only the
 *      logprobs need it there) in the draw's pass; the one-block form by a
 *      radix descent, 4 bits a pass, over counts or masses. min_p is a plain
 *      predicate (exp(s - m) >= min_p). The kept tokens are those at or above
 *      both thresholds;
 *   6. the draw: u · mass against a prefix sum in id order (each thread owns a
 *      contiguous segment; segment sums scanned across the block), u from
 *      Philox-4x32-10 keyed by the request's seed, counter = its completion
 *      index: a seeded request gives the same tokens run to run and whatever
 *      shares its batch. The host draws with its own RNG in rank order, so
 *      the two backends give the same distribution, not the same tokens;
 *   7. top logprobs: the n-th largest key by the same search as top_k, the n tokens
 *      at or above it gathered and sorted (descending, lowest id on ties); -inf
 *      ones (refused or banned) dropped from the end, as the host does.
 * Every reduction has a fixed order (thread-strided partials, then a tree), so
 * results are bitwise reproducible. exp is fp32 (the host's is fp64): kept
 * sets and logprobs agree to ~1e-6 relative.
 */
#include "ops/cuda/sample_int.cuh"

/* ---- the wide form: one thread-block cluster per row ----------------------------------------
 *
 * The one-block kernel (sample_block.cu) leaves all but one SM idle at batch 1 (45.6 us for a
 * 248320-wide BF16 row on the H200, bench/RESULTS.md S5). Here each row is one cluster of SMW_CL
 * blocks (Hopper thread-block clusters: the blocks run together and meet at hardware barriers,
 * with each other's shared memory mapped), so every pass over the row is spread over SMW_CL SMs
 * in one launch: no cooperative launch, no second kernel, a fixed grid of rows · SMW_CL blocks,
 * capturable like the one-block form.
 *
 * The steps, thresholds, Philox stream and tie rules are those of smp_row_kernel; what changes
 * is who holds which element (global thread g = rank · SMP_T + tid strides the row by SMW_G)
 * and how partials meet: each block reduces its own (the helpers above), publishes the result
 * in a shared-memory slot, the cluster syncs, and every block reads all SMW_CL slots in rank
 * order, so each block holds bitwise the same totals. Sums therefore run in a different (still
 * fixed) order than the one-block kernel's: Z and the masses may differ from it in the last
 * bits of a double (a seeded draw picks a different token only when u · mass falls within that
 * rounding of a boundary). Global writes before a cluster barrier are visible after it (the
 * barrier is release / acquire at cluster scope), which orders the work row's widen, bans and
 * penalties across blocks. A block leaves only at a barrier every block reaches, so no block
 * reads the shared memory of one that exited.
 *
 * The row in shared memory (SM, LASTSTAND_SAMPLE_SM, up to SMS_SM_ROWS rows): block r widens
 * the ids [r·L, (r+1)·L), L = SMP_T·S (S = ceil(V / SMW_G), a thread's draw segment), in 16-byte
 * loads into its shared memory in id order (8 x 122 KB for 248320 ids), and every later pass,
 * the bans and penalties (each block the ids it owns) and the draw (thread t's segment is
 * s[t·S ..], conflict-free for odd S) read it there: no global work row, no L2 round trips after
 * the widen. The draw's sums run over the same segments in the same order as with the row in
 * global memory, so the seeded tokens, Z and the masses are bitwise the same; only a greedy
 * row's Z (logprobs) sums in another order. The bound (LB, LASTSTAND_SAMPLE_LB): the k-th
 * largest of the cluster's SMW_NW warp maxima (each one a real key, so at least k keys are at
 * or above it; k = top_k, or the top logprobs wanted) published with the widen's barrier;
 * cl_key_select gathers every key at or above it at once when they fit its SMF_CAP candidates (a
 * long-tailed row: about k of them) and ranks them, no histogram pass; else (flat rows, ties)
 * the search as without it. */
#include <cooperative_groups.h>
namespace cg = cooperative_groups;

enum { SMW_CL = 8, SMW_G = SMW_CL * SMP_T, SMW_NW = SMW_CL * SMP_W };
static_assert(SMP_W <= 16 && 4 * 32 >= SMW_NW, "the draw's scan: a block's warp totals fit a slot, 4 warps a lane");

typedef struct smw_slot {
    double d[16];
    int i[16];
    float f;
    int pad_;
    uint64_t wk[16]; /* the widen's warp maxima (rank keys; 0: none), for the top_k bound */
} smw_slot;

typedef struct smw_shared {
    smp_shared b;
    smw_slot slot[2]; /* alternate per reduction: a slot is rewritten only after the next barrier */
    double res_d[16];
    int res_i[16];
    float res_f;
    int n_all;
    double e[SMW_NW + 1]; /* the draw's warp boundaries: e[k] = mass of the warps before warp k */
} smw_shared;

struct smw_ctx {
    cg::cluster_group cl;
    unsigned rank;
    int par;
    __device__ smw_slot *slot(smw_shared &sh) { return &sh.slot[par]; }
    __device__ const smw_slot *peer(smw_shared &sh, unsigned r) { return cl.map_shared_rank(&sh.slot[par], r); }
};

/* Cluster sums of N doubles per thread: each warp's sums in shared memory, thread j < N adds
 * the warps in order into this block's slot (the block total the one-block kernel's blk_sum_dn
 * makes, bitwise), the cluster syncs, thread j adds the ranks' slots in order, and every thread
 * reads the N totals back. */
template <int N>
__device__ void cl_sum_dn(double (&v)[N], smw_shared &sh, smw_ctx &c) {
    const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
#pragma unroll
    for (int j = 0; j < N; j++) {
        double t = warp_sum_d(v[j]);
        if (lane == 0) sh.b.d[w * 16 + j] = t;
    }
    __syncthreads();
    if (tid < N) {
        double t = 0;
        for (int q = 0; q < SMP_W; q++) t += sh.b.d[q * 16 + tid];
        c.slot(sh)->d[tid] = t;
    }
    c.cl.sync(); /* also: every thread is past its reads of sh.b.d before they are reused */
    if (tid < N) {
        double t = 0, dr[SMW_CL];
#pragma unroll
        for (unsigned r = 0; r < SMW_CL; r++) dr[r] = c.peer(sh, r)->d[tid]; /* the remote loads together */
#pragma unroll
        for (unsigned r = 0; r < SMW_CL; r++) t += dr[r];                      /* then the sums in order */
        sh.res_d[tid] = t;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < N; j++) v[j] = sh.res_d[j];
    c.par ^= 1;
}

/* Cluster (value, id) maximum with lowest id on ties, the minimum of lo and the maximum of hi. */
__device__ void cl_argmax_min_max(float &v, int &id, int &lo, int &hi, smw_shared &sh, smw_ctx &c) {
    if (threadIdx.x == 0) { sh.b.bad = INT_MAX; sh.n_all = INT_MIN; }
    __syncthreads();
    if (lo != INT_MAX) atomicMin(&sh.b.bad, lo);
    if (hi != INT_MIN) atomicMax(&sh.n_all, hi);
    blk_argmax(v, id, sh.b); /* its barriers order the atomics above */
    if (threadIdx.x == 0) {
        smw_slot *s = c.slot(sh);
        s->f = v; s->i[0] = id; s->i[1] = sh.b.bad; s->i[2] = sh.n_all;
    }
    c.cl.sync();
    if (threadIdx.x == 0) {
        float bv = -INFINITY;
        int bi = INT_MAX, mn = INT_MAX, mx = INT_MIN;
        float fr[SMW_CL];
        int4 ir[SMW_CL];
#pragma unroll
        for (unsigned r = 0; r < SMW_CL; r++) { /* the remote loads in flight together */
            const smw_slot *q = c.peer(sh, r);
            fr[r] = q->f;
            ir[r] = make_int4(q->i[0], q->i[1], q->i[2], 0);
        }
#pragma unroll
        for (unsigned r = 0; r < SMW_CL; r++) {
            if (r == 0 || fr[r] > bv || (fr[r] == bv && ir[r].x < bi)) { bv = fr[r]; bi = ir[r].x; }
            mn = min(mn, ir[r].y);
            mx = max(mx, ir[r].z);
        }
        sh.res_f = bv; sh.res_i[0] = bi; sh.res_i[1] = mn; sh.res_i[2] = mx;
    }
    __syncthreads();
    v = sh.res_f; id = sh.res_i[0]; lo = sh.res_i[1]; hi = sh.res_i[2];
    c.par ^= 1;
}

__device__ float cl_max(float v, smw_shared &sh, smw_ctx &c) {
    int id = 0, lo = INT_MAX, hi = INT_MIN;
    cl_argmax_min_max(v, id, lo, hi, sh, c);
    return v;
}

/* f(i, w[i]) over global thread g's elements of the work row, ids ascending per thread: when
 * V % 4 == 0, 16-byte loads q = g, g + SMW_G, ... of ids 4q .. 4q + 3, else i = g, g + SMW_G, ... */
template <class F>
__device__ __forceinline__ void w_each(const float *__restrict__ w, int V, int g, F &&f) {
    if ((V & 3) == 0) {
        const float4 *w4 = (const float4 *)w;
        const int nv = V >> 2;
#pragma unroll 2
        for (int q = g; q < nv; q += SMW_G) {
            const float4 u = w4[q];
            f(4 * q, u.x);
            f(4 * q + 1, u.y);
            f(4 * q + 2, u.z);
            f(4 * q + 3, u.w);
        }
    } else {
        for (int i = g; i < V; i += SMW_G) f(i, w[i]);
    }
}

/* ---- top_k / top_p: wide-digit histograms ------------------------------------------------
 *
 * The one-block form's key_descent in wide digits: a pass over the work row builds an
 * SMF_NB-bin histogram of the next digit of the rank key (counts, with MASS the masses exp(s -
 * m) in fixed point, and in the value half past the first pass each bin's least and largest
 * value; one shared atomic each a token, the mass in two exact 32-bit words) over the keys
 * still in the range [P, P + 2^rbits) and at or above the floor; the cluster merges it (block r
 * sums slice r of the bins over the 8 blocks through distributed shared memory, then every
 * block reads the slice totals and the chosen slice), and the scan from the top bin picks the
 * bin where the measure above reaches the target. The digits: 10 bits a pass of the value half
 * (sign, exponent, mantissa), then of the id half only below the highest bit of V - 1 (ids < V:
 * the complement's bits above it are all ones); a bin that holds one value (BF16 logits: ties
 * by the hundred) goes straight to the id half. A search ends when the chosen bin holds one
 * token (the cut is that token), when a count takes the whole bin, or when the bin holds at
 * most SMF_CAP tokens: those are compacted into shared memory (each block its own list, then
 * every block gathers all of them in rank order) and the exact threshold is found there by
 * ranking each candidate against the others (the count and the mass of the keys above it:
 * integer sums, order-free). A top_k of at most SMF_CAP with a top_p after it gathers every key
 * from its bin up (when they are at most SMF_CAP) with their masses, and the top_p is ranked
 * among those at or above the top_k threshold without another pass (or with one compaction
 * pass of exactly the top_k set when the top_k search ended on a bin).
 *
 * Masses in fixed point: fx = round(expf(s - m) · 2^40) as an unsigned 64-bit integer (expf
 * <= 1 since s <= m, and the top token's is exactly 1: fx = 2^40; V · 2^40 < 2^64 for V < 2^24),
 * summed with integer atomics: exact and independent of the order, so the thresholds are
 * bitwise reproducible whatever the schedule or the batch. The top_p target is ceil(top_p ·
 * Σ fx) over the keys at or above the top_k threshold (the host's lim = top_p · base). Error
 * against the host's fp64 exp(s - m): the rounding is within 2^-41 a token, so a sum of n
 * tokens within n · 2^-41 <= 1.13e-7 for n <= 248320; expf is within 2 ulp (2.4e-7 relative:
 * the descent's fp32 terms carry the same). With base >= 1, a cumulative mass is within
 * 3.5e-7 · base of the host's: a kept set can differ from the host's only when the host's
 * cumulative mass at the boundary token lies within that of top_p · base (the host itself
 * rounds top_p to a float: 6e-8 relative). test_sample_cuda pins a near-tie one float ulp of
 * top_p either side of an exact boundary (masses exact in both arithmetics: the host decides,
 * both forms follow). Tokens with exp(s - m) < 2^-41 (s - m < -28.4) weigh zero here: a
 * nucleus reaches them only when top_p · base is within V · 2^-41 of the base, i.e. for no
 * float top_p < 1 but 0.99999994; they are drawn with probability < 2^-41 each anyway. */
enum { SMF_BITS = 10, SMF_NB = 1 << SMF_BITS, SMF_SL = SMF_NB / SMW_CL, SMF_CAP = 256, SMF_U = 16 };
static_assert((int)SMF_SL == 4 * 32 && (int)SMF_SL <= (int)SMP_T, "block r merges slice r (one bin a thread); a lane scans 4");

typedef unsigned long long u64s; /* the atomics' type */

typedef struct smf_shared {
    unsigned cnt[SMF_NB];     /* this block's histogram: counts, masses (high, low words), and in */
    unsigned mlo[SMF_NB], mhi[SMF_NB]; /* the value half */
    unsigned vmin[SMF_NB], vmax[SMF_NB]; /* the least and largest value bits (key >> 32) a bin holds */
    unsigned mc[SMF_SL];      /* slice rank of the bins, merged over the cluster */
    u64s mm[SMF_SL];
    unsigned mmin[SMF_SL], mmax[SMF_SL];
    u64s wc[SMF_SL / 32], wm[SMF_SL / 32];
    u64s tc, tm;              /* the merged slice's totals */
    unsigned nl;              /* this block's candidate list */
    u64s lk[SMF_CAP], lf[SMF_CAP];
    u64s ck[SMF_CAP], cf[SMF_CAP]; /* every block's candidates, in rank order */
    int off[SMW_CL + 1];
    int have_all;             /* ck / cf hold every key >= all_floor (a top_k's collect) */
    uint64_t all_floor;
    u64s r_above, r_target, r_nsel, r_key;
    int r_bin, r_single;
    unsigned r_v;
    int n_all;                /* the untruncated count of the last gather */
    u64s lbk[SMW_NW];         /* the cluster's warp maxima, and the top_k bound from them */
    u64s lb;
} smf_shared;

__device__ __forceinline__ u64s mass_fx(float e) { return e > 0.f ? __float2ull_rn(e * 0x1p40f) : 0ull; }

__device__ __forceinline__ u64s warp_sum_u(u64s v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Inclusive suffix sums over the lanes (lane l: the sum of lanes l..31). */
__device__ __forceinline__ u64s warp_suffix_u(u64s v, int lane) {
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        u64s t = __shfl_down_sync(0xffffffffu, v, o);
        if (lane + o < 32) v += t;
    }
    return v;
}

/* Warp 0: the highest lane whose suffix (with `above`) reaches target, and the measure of the
 * lanes above it. The suffixes fall with the lane, so the lanes that reach it are 0..L
 * (of `lanes`; a target of 0 is reached by every lane). */
__device__ __forceinline__ int warp_pick(u64s meas, u64s above, u64s target, int lane, unsigned lanes,
                                         u64s *above_out) {
    const u64s suf = warp_suffix_u(meas, lane);
    const unsigned ok = __ballot_sync(0xffffffffu, above + suf >= target) & lanes;
    const int L = ok ? 31 - __clz((int)ok) : 0;
    const u64s sL = __shfl_sync(0xffffffffu, suf, L), mL = __shfl_sync(0xffffffffu, meas, L);
    *above_out = above + sL - mL;
    return L;
}

/* The work row as a pass visits it. smw_grow: in global memory, global thread g's ids as w_each
 * gives them. smw_srow (SM forms): the ids [lo, lo + n) this block owns, held in its shared
 * memory in id order (s[j] = id lo + j; lo = rank · SMP_T · S, S = ceil(V / SMW_G): exactly its
 * threads' draw segments [g·S, (g + 1)·S)). each(f): f(i, x) over this thread's ids, ascending
 * (the passes whose result does not depend on the order: argmax with its tie rule, maxima,
 * integer histograms, candidate lists); seg(i): the value of id i of this thread's segment. */
struct smw_grow {
    const float *w;
    int V, g;
    template <class F>
    __device__ __forceinline__ void each(F &&f) const { w_each(w, V, g, f); }
    __device__ __forceinline__ float seg(int i) const { return w[i]; }
};
struct smw_srow {
    const float *s;
    int lo, n;
    template <class F>
    __device__ __forceinline__ void each(F &&f) const {
        const float4 *s4 = (const float4 *)s;
        const int n4 = n >> 2;
#pragma unroll 4
        for (int q = threadIdx.x; q < n4; q += SMP_T) {
            const float4 u = s4[q];
            f(lo + 4 * q, u.x);
            f(lo + 4 * q + 1, u.y);
            f(lo + 4 * q + 2, u.z);
            f(lo + 4 * q + 3, u.w);
        }
        for (int j = 4 * n4 + threadIdx.x; j < n; j += SMP_T) f(lo + j, s[j]);
    }
    __device__ __forceinline__ float seg(int i) const { return s[i - lo]; }
};

/* The threshold key t of the kept set {key >= t}: with MASS = 0 the kcount-th largest key at or
 * above floor (its whole set when there are fewer), with MASS = 1 the last key of the nucleus
 * (the fewest keys >= floor, descending, whose fixed-point mass reaches ceil(frac · their
 * total)). known >= 0: the number of keys >= floor, when it is at most SMF_CAP (no histogram;
 * the candidates a collecting top_k left in shared memory when they hold all of them).
 * collect (MASS = 0): when the keys from the chosen bin up number at most SMF_CAP, gather all
 * of them with their masses (a top_p inside this top_k then needs no pass over the row). */
template <int MASS, class Row>
__device__ uint64_t cl_key_select(const Row &row, int V, float inv, int scale, float m, uint64_t floor, double frac,
                                  u64s kcount, int known, int collect, smf_shared &fs, smw_ctx &c, uint64_t lb = 0) {
    const int tid = threadIdx.x, lane = tid & 31, wp = tid >> 5;
    const int idbits = V > 1 ? 32 - __clz(V - 1) : 0;
    uint64_t P = floor;
    int rbits = 64; /* 64: no upper bound (the range [P, 2^64)) */
    u64s above = 0, target = kcount;
    int first = 1, id_half = 0, nsel = known, all = 0;
    if (known >= 0 && fs.have_all && fs.all_floor <= floor) {
        all = 2; /* the candidates are in place: rank them */
    } else {
        __syncthreads(); /* every thread has read have_all */
        if (tid == 0) fs.have_all = 0;
    }
    /* the keys of [P0, P0 + 2^rb) (rb 64: of [P0, 2^64)) at or above floor, with their masses,
     * into shared memory: each block's list, then every block gathers all of them in rank
     * order into ck / cf (the first SMF_CAP); fs.n_all: how many there were (past SMF_CAP: more) */
    auto gather = [&](uint64_t P0, int rb) {
        if (tid == 0) fs.nl = 0;
        __syncthreads();
        row.each([&](int i, float x) {
            const float s = scaled(x, inv, scale);
            const uint64_t k = rank_key(s, i);
            if (k < floor || k < P0) return;
            if (rb < 64 && ((k - P0) >> rb)) return;
            if (*(volatile unsigned *)&fs.nl > SMF_CAP) return; /* the list overflows: enough to know it */
            const unsigned at = atomicAdd(&fs.nl, 1u);
            if (at < SMF_CAP) { fs.lk[at] = k; fs.lf[at] = mass_fx(expf(s - m)); }
        });
        __syncthreads();
        c.cl.sync(); /* every block's list is complete */
        if (tid == 0) {
            int o = 0, t = 0;
            unsigned nrs[SMW_CL];
#pragma unroll
            for (unsigned r = 0; r < SMW_CL; r++) nrs[r] = c.cl.map_shared_rank(&fs, r)->nl;
            for (unsigned r = 0; r < SMW_CL; r++) {
                const unsigned nr = nrs[r];
                fs.off[r] = o;
                o += (int)min(nr, (unsigned)SMF_CAP);
                t += (int)min(nr, (unsigned)INT_MAX / 16);
            }
            fs.off[SMW_CL] = min(o, SMF_CAP);
            fs.n_all = t;
        }
        __syncthreads();
        const int n = fs.off[SMW_CL];
        for (int j = tid; j < n; j += SMP_T) {
            int r = 0;
            while (r + 1 < SMW_CL && fs.off[r + 1] <= j) r++;
            const smf_shared *q = c.cl.map_shared_rank(&fs, (unsigned)r);
            fs.ck[j] = q->lk[j - fs.off[r]];
            fs.cf[j] = q->lf[j - fs.off[r]];
        }
    };
    /* a top_k with a bound lb (at least kcount keys >= lb: the widen's warp maxima): every key
     * >= lb gathered at once when they are at most SMF_CAP (no histogram), else the search */
    if (!MASS && lb > floor && known < 0 && all != 2) {
        gather(lb, 64);
        const int ok = fs.n_all <= SMF_CAP;
        if (ok && tid == 0) { fs.have_all = 1; fs.all_floor = lb; }
        __syncthreads();
        c.cl.sync(); /* no block rewrites its list while another still reads it */
        if (ok) { P = lb; all = 2; }
    }
    if (known < 0 && all != 2) {
        P = 0;
        for (;;) {
            if (rbits == 32 && !id_half) { /* the id half: only the bits below V - 1's highest */
                id_half = 1;
                P |= (uint64_t)(0xffffffffu & ~(idbits >= 32 ? 0xffffffffu : (1u << idbits) - 1u));
                rbits = idbits;
            }
            if (rbits == 0) return P;
            const int wd = rbits > 32 ? min(SMF_BITS, rbits - 32) : min(SMF_BITS, rbits);
            const int shf = rbits - wd;
            /* the value half after the first pass (its bins are wide, and it sees every token):
             * each bin's least and largest value too */
            const bool vals = !id_half && rbits < 64;
            for (int b = tid; b < SMF_NB; b += SMP_T) {
                fs.cnt[b] = 0;
                if (MASS) { fs.mlo[b] = 0; fs.mhi[b] = 0; }
                fs.vmin[b] = 0xffffffffu;
                fs.vmax[b] = 0;
            }
            __syncthreads();
            const uint64_t P0 = P;
            const int rb = rbits;
            /* one shared atomic a token in range (the hardware resolves a warp's same-bin lanes),
             * the mass in two 32-bit words with the carry counted by whoever wrapped the low one
             * (exact). Aggregating a warp's same-bin lanes first (__match_any_sync, or a ballot
             * round per distinct bin) cost 1.4-3.3x (S7 device round R2): removed in S8. */
            row.each([&](int i, float x) {
                const float s = scaled(x, inv, scale);
                const uint64_t k = rank_key(s, i);
                const uint64_t off = k - P0;
                if (k < floor || k < P0 || (rb != 64 && (off >> rb))) return;
                const int d = (int)(off >> shf);
                if (vals) {
                    const unsigned v = (unsigned)(k >> 32);
                    atomicMin(&fs.vmin[d], v);
                    atomicMax(&fs.vmax[d], v);
                }
                atomicAdd(&fs.cnt[d], 1u);
                if (MASS) {
                    const u64s f = mass_fx(expf(s - m));
                    if (f) {
                        const unsigned lo = (unsigned)f, old = atomicAdd(&fs.mlo[d], lo);
                        const unsigned hi = (unsigned)(f >> 32) + (old + lo < old ? 1u : 0u);
                        if (hi) atomicAdd(&fs.mhi[d], hi);
                    }
                }
            });
            __syncthreads();
            c.cl.sync(); /* every block's histogram is complete */
            if (tid < SMF_SL) {
                const int b = (int)c.rank * SMF_SL + tid;
                unsigned n = 0, vlo = 0xffffffffu, vhi = 0;
                u64s ms = 0;
                unsigned cr[SMW_CL], hr[SMW_CL], lr[SMW_CL], ar[SMW_CL], br[SMW_CL];
#pragma unroll
                for (unsigned r = 0; r < SMW_CL; r++) { /* the remote loads in flight together */
                    const smf_shared *q = c.cl.map_shared_rank(&fs, r);
                    cr[r] = q->cnt[b];
                    hr[r] = MASS ? q->mhi[b] : 0;
                    lr[r] = MASS ? q->mlo[b] : 0;
                    ar[r] = vals ? q->vmin[b] : 0xffffffffu;
                    br[r] = vals ? q->vmax[b] : 0;
                }
#pragma unroll
                for (unsigned r = 0; r < SMW_CL; r++) {
                    n += cr[r];
                    ms += ((u64s)hr[r] << 32) + lr[r];
                    vlo = min(vlo, ar[r]);
                    vhi = max(vhi, br[r]);
                }
                fs.mc[tid] = n;
                fs.mm[tid] = ms;
                fs.mmin[tid] = vlo;
                fs.mmax[tid] = vhi;
                const u64s wn = warp_sum_u(n), wmass = MASS ? warp_sum_u(ms) : 0;
                if (lane == 0) { fs.wc[wp] = wn; fs.wm[wp] = wmass; }
            }
            __syncthreads();
            if (tid == 0) {
                u64s a = 0, b = 0;
                for (int q = 0; q < SMF_SL / 32; q++) { a += fs.wc[q]; b += fs.wm[q]; }
                fs.tc = a;
                fs.tm = b;
            }
            c.cl.sync(); /* every merged slice and its totals are visible; the histograms are free */
            if (wp == 0) {
                const smf_shared *qs = c.cl.map_shared_rank(&fs, (unsigned)min(lane, SMW_CL - 1));
                const u64s lc = lane < SMW_CL ? qs->tc : 0, lm = lane < SMW_CL ? qs->tm : 0;
                u64s tgt = target;
                if (first) { /* the measure at or above the floor: the base of the target */
                    const u64s tot = warp_sum_u(MASS ? lm : lc);
                    if (MASS) {
                        const double t = ceil(frac * (double)tot);
                        tgt = t >= (double)tot ? tot : (u64s)t;
                    } else if (tgt > tot) {
                        tgt = tot;
                    }
                }
                u64s ab;
                const int S = warp_pick(MASS ? lm : lc, above, tgt, lane, (1u << SMW_CL) - 1u, &ab);
                /* the bins of slice S: lane l holds bins 4l .. 4l + 3 */
                const smf_shared *qb = c.cl.map_shared_rank(&fs, (unsigned)S);
                u64s bc[4], bm[4], lsum = 0;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    bc[j] = qb->mc[lane * 4 + j];
                    bm[j] = MASS ? qb->mm[lane * 4 + j] : 0;
                    lsum += MASS ? bm[j] : bc[j];
                }
                u64s ab2;
                const int L = warp_pick(lsum, ab, tgt, lane, 0xffffffffu, &ab2);
                if (lane == L) {
                    int j = 3;
                    for (; j > 0; j--) {
                        const u64s here = MASS ? bm[j] : bc[j];
                        if (ab2 + here >= tgt) break;
                        ab2 += here;
                    }
                    const int sb = lane * 4 + j;
                    fs.r_bin = S * SMF_SL + sb;
                    fs.r_above = ab2;
                    fs.r_nsel = bc[j];
                    fs.r_target = tgt;
                    fs.r_single = vals && qb->mmin[sb] == qb->mmax[sb];
                    fs.r_v = qb->mmin[sb];
                }
            }
            __syncthreads();
            P += (uint64_t)fs.r_bin << shf;
            above = fs.r_above;
            target = fs.r_target;
            nsel = (int)min(fs.r_nsel, (u64s)INT_MAX);
            rbits = shf;
            first = 0;
            const int single = fs.r_single;
            const unsigned v1 = fs.r_v;
            if (nsel <= 1 || (!MASS && above + (u64s)nsel == target) || rbits == 0) return P;
            if (!MASS && collect && above + (u64s)nsel <= SMF_CAP) { all = 1; break; }
            if (nsel <= SMF_CAP) break;
            if (single && rbits > 32) { /* one value in the bin: straight to the ids */
                P = (uint64_t)v1 << 32;
                rbits = 32;
            }
        }
    }

    if (all != 2) {
        gather(P, all ? 64 : rbits);
        if (all == 1 && tid == 0) { fs.have_all = 1; fs.all_floor = P; }
        __syncthreads();
        c.cl.sync(); /* no block rewrites its list while another still reads it */
        if (all == 1) above = 0; /* the candidates include every key above the bin */
    }
    /* rank the candidates at or above the floor against each other */
    const int n = fs.off[SMW_CL];
    if (tid == 0) fs.r_key = P; /* no winner (cannot happen): the whole range is kept */
    if (first) { /* top_p inside a small top_k set: its base is the set's mass */
        if (MASS) {
            u64s t = 0;
            for (int j = 0; j < n; j++) t += fs.ck[j] >= floor ? fs.cf[j] : 0;
            const double tt = ceil(frac * (double)t);
            target = tt >= (double)t ? t : (u64s)tt;
        } else if (target > (u64s)n) {
            target = (u64s)n;
        }
    }
    __syncthreads();
    for (int j = tid; j < n; j += SMP_T) {
        const u64s kj = fs.ck[j];
        if (kj < floor) continue;
        u64s gc = 0, gm = 0;
        for (int q = 0; q < n; q++) {
            const u64s kq = fs.ck[q];
            if (kq > kj) { gc++; gm += fs.cf[q]; }
        }
        const int win = MASS ? (above + gm < target && above + gm + fs.cf[j] >= target) : (above + gc + 1 == target);
        if (win) fs.r_key = kj; /* one candidate at most */
    }
    __syncthreads();
    const uint64_t t = fs.r_key;
    __syncthreads();
    return t;
}

/* The work row of the form: global memory, or (SM) the block's ids in its shared memory. */
template <bool SM>
struct smw_row_of {
    typedef smw_grow type;
    static __device__ type make(const float *w, int V, int g, const float *, int, int) { return type{w, V, g}; }
};
template <>
struct smw_row_of<true> {
    typedef smw_srow type;
    static __device__ type make(const float *, int, int, const float *s, int lo, int n) { return type{s, lo, n}; }
};

/* SM: 16-byte loads of logits in flight at once a thread in the widen (a 248320-wide BF16 row:
 * 7.6 a thread); the profile's stamps (sample_cuda_profile, test-only): rank 0's thread 0 writes
 * clock64() at each phase boundary to prof[k] when prof is set. */
enum { SMS_LD = 8, SMS_NPROF = 10 };
#define SMS_STAMP(k)                                \
    do {                                            \
        if (prof && lead) prof[k] = clock64();      \
    } while (0)

template <typename T, int MINB, bool SM>
__global__ void __cluster_dims__(SMW_CL, 1, 1) __launch_bounds__(SMP_T, MINB)
    smw_row_kernel(int V, const T *__restrict__ logits, const smp_row *__restrict__ rows,
                   const int32_t *__restrict__ toks, float *__restrict__ work, smp_out *__restrict__ out,
                   long long *prof, int lbon) {
    __shared__ smw_shared sh;
    __shared__ smf_shared fs;
    extern __shared__ float4 wsm[]; /* SM: the ids [slo, slo + sn) in order (smw_srow) */
    smw_ctx c = {cg::this_cluster(), 0, 0};
    c.rank = c.cl.block_rank();
    const int row = blockIdx.x / SMW_CL, tid = threadIdx.x, g = (int)c.rank * SMP_T + tid;
    const int lead = c.rank == 0 && tid == 0; /* writes the row's smp_out */
    SMS_STAMP(0);
    const smp_row p = rows[row];
    smp_out *o = &out[row];
    if (p.forced == SMP_ROW_SKIP) { /* uniform over the cluster, before any shared access */
        if (lead) { o->token = -1; o->bad_idx = -1; o->n_top = 0; o->logprob = 0.f; }
        return;
    }
    const T *x = logits + (size_t)row * V;
    float *w = work + (size_t)row * V;
    const int S = (V + SMW_G - 1) / SMW_G; /* a thread's draw segment: ids [g·S, (g + 1)·S) */
    const int slo = (int)c.rank * SMP_T * S, sn = SM ? max(0, min(SMP_T * S, V - slo)) : 0;
    float *ws = (float *)wsm;
    const typename smw_row_of<SM>::type rw = smw_row_of<SM>::make(w, V, g, ws, slo, sn);

    const int greedy = !(p.temperature > 0.f) || p.top_k == 1;
    const int want_lp = p.want_lp || p.n_top > 0;
    /* the mask is applied as the widen reads the row (not an edit: the widen's maximum and argmax
     * are the masked row's); the bias is a sparse edit like the bans */
    const uint32_t *mk = row_mask(p, toks, V);
    const int edits = p.n_ban > 0 || p.n_bias > 0 || (p.rep_pen > 0.f && p.rep_pen != 1.f && p.n_rep > 0) ||
                      ((p.freq_pen != 0.f || p.pres_pen != 0.f) && p.n_cnt > 0);
    const int fast = greedy && !want_lp && !edits;
    const float temp = p.temperature > 0.f ? p.temperature : 1.f;
    const int scale = temp != 1.f;
    const float inv = 1.f / temp;
    /* the row's maximum during the widen too, when nothing edits the row (m below) */
    const int track = fast || !edits;

    /* 1. widen, NaN/Inf scan (and the plain-greedy argmax). A thread visits its ids in
     * ascending order either way (16-byte vectors g, g + SMW_G, ... when the row allows, else
     * single ids), so its first maximum is its lowest id. */
    const int poison = p.forced == SMP_ROW_POISON ? V / 2 : -1;
    float fv = -INFINITY;
    int fi = 0, bad = INT_MAX, none = INT_MIN;
    constexpr int VW = 16 / (int)sizeof(T); /* elements of a 16-byte load */
    /* M: the row has a mask; the loops are instantiated without and with it, so a row without
     * one runs the unmasked loads (S9-R1: a per-element test cost up to 1.9 us a batch-16 greedy
     * call) */
    auto widen = [&](auto mc) {
        constexpr bool M = decltype(mc)::value;
        if (SM) {
            /* the block's ids [slo, slo + sn) into ws in id order, SMS_LD 16-byte loads in flight a
             * thread (x + slo is 16-byte aligned when x is: slo · sizeof(T) is a multiple of 1 KB) */
            const int nq = ((uintptr_t)x & 15) == 0 ? sn / VW : 0;
            const uint4 *xv = (const uint4 *)(x + slo);
            for (int q0 = tid; q0 < nq; q0 += SMS_LD * SMP_T) {
                uint4 u[SMS_LD];
#pragma unroll
                for (int k = 0; k < SMS_LD; k++) u[k] = q0 + k * SMP_T < nq ? xv[q0 + k * SMP_T] : make_uint4(0, 0, 0, 0);
#pragma unroll
                for (int k = 0; k < SMS_LD; k++) {
                    const int q = q0 + k * SMP_T;
                    if (q >= nq) break;
                    float v[VW];
                    unpack16<T>(u[k], v);
                    const uint32_t mb = M ? mask_bits(mk, slo + q * VW) : 0xffffffffu;
#pragma unroll
                    for (int j = 0; j < VW; j++) {
                        const int i = slo + q * VW + j;
                        if (i == poison) v[j] = __int_as_float(0x7fc00000);
                        if (!isfinite(v[j])) bad = min(bad, i);
                        if (M && !((mb >> j) & 1u)) v[j] = -INFINITY;
                        if (track && v[j] > fv) { fv = v[j]; fi = i; }
                    }
                    if (!fast)
#pragma unroll
                        for (int j = 0; j < VW; j += 4)
                            wsm[(q * VW + j) / 4] = make_float4(v[j], v[j + 1], v[j + 2], v[j + 3]);
                }
            }
            for (int j = nq * VW + tid; j < sn; j += SMP_T) {
                float v = load_logit<T>(x, slo + j);
                if (slo + j == poison) v = __int_as_float(0x7fc00000);
                if (!isfinite(v)) bad = min(bad, slo + j);
                if (M && !(mask_bits(mk, slo + j) & 1u)) v = -INFINITY;
                if (track && v > fv) { fv = v; fi = slo + j; }
                if (!fast) ws[j] = v;
            }
        } else if (V % VW == 0 && ((uintptr_t)x & 15) == 0) {
            const uint4 *xv = (const uint4 *)x;
            float4 *wv = (float4 *)w; /* V % 4 == 0 and the work row 16-byte aligned with it */
            const int nv = V / VW;
#pragma unroll 2
            for (int q = g; q < nv; q += SMW_G) {
                float v[VW];
                unpack16<T>(xv[q], v);
                const uint32_t mb = M ? mask_bits(mk, q * VW) : 0xffffffffu;
#pragma unroll
                for (int k = 0; k < VW; k++) {
                    const int i = q * VW + k;
                    if (i == poison) v[k] = __int_as_float(0x7fc00000);
                    if (!isfinite(v[k])) bad = min(bad, i);
                    if (M && !((mb >> k) & 1u)) v[k] = -INFINITY;
                    if (track && v[k] > fv) { fv = v[k]; fi = i; }
                }
                if (!fast)
#pragma unroll
                    for (int k = 0; k < VW; k += 4) wv[q * (VW / 4) + k / 4] = make_float4(v[k], v[k + 1], v[k + 2], v[k + 3]);
            }
        } else {
#pragma unroll 4
            for (int i = g; i < V; i += SMW_G) {
                float v = load_logit<T>(x, i);
                if (i == poison) v = __int_as_float(0x7fc00000);
                if (!isfinite(v)) bad = min(bad, i);
                if (M && !(mask_bits(mk, i) & 1u)) v = -INFINITY;
                if (track && v > fv) { fv = v; fi = i; }
                if (!fast) w[i] = v;
            }
        }
    };
    if (mk) widen(smp_bool<true>{});
    else widen(smp_bool<false>{});
    /* lbon (nothing edits the row; a top_k of at most SMW_NW or top logprobs): the warp maxima's
     * rank keys, for the bound cl_key_select gathers from (published with the widen's barrier) */
    const int nt = min(p.n_top, min(SMP_DEV_TOP, V));
    const int use_lb = lbon && track && !fast &&
                       ((!greedy && p.top_k > 1 && p.top_k <= SMW_NW && p.top_k < V) || (nt > 0 && nt < V));
    if (use_lb) {
        uint64_t k = fv > -INFINITY ? rank_key(scaled(fv, inv, scale), fi) : 0;
#pragma unroll
        for (int o = 16; o; o >>= 1) {
            const uint64_t t = __shfl_xor_sync(0xffffffffu, k, o);
            k = t > k ? t : k;
        }
        if ((tid & 31) == 0) c.slot(sh)->wk[tid >> 5] = k;
    }
    cl_argmax_min_max(fv, fi, bad, none, sh, c); /* also the barrier after the widen */
    SMS_STAMP(1);
    /* the cluster's warp maxima, before a later reduction reuses their slot; lb_for(k): the k-th
     * largest of them (k <= SMW_NW; each one a real key, so at least k keys are >= it), 0: none */
    if (use_lb && tid < SMW_NW)
        fs.lbk[tid] = c.cl.map_shared_rank(&sh.slot[c.par ^ 1], (unsigned)(tid / SMP_W))->wk[tid % SMP_W];
    auto lb_for = [&](int k) -> uint64_t {
        __syncthreads(); /* fs.lbk complete, the last fs.lb read */
        if (tid == 0) fs.lb = 0;
        __syncthreads();
        if (tid < SMW_NW) {
            const u64s kt = fs.lbk[tid];
            int gt = 0;
            for (int u = 0; u < SMW_NW; u++) gt += fs.lbk[u] > kt;
            if (kt && gt == k - 1) fs.lb = kt; /* distinct keys: one thread at most */
        }
        __syncthreads();
        return fs.lb;
    };
    if (bad != INT_MAX) {
        if (lead) {
            o->bad_idx = bad;
            o->bad_val = bad == poison ? __int_as_float(0x7fc00000) : load_logit<T>(x, bad);
            o->token = -1;
            o->n_top = 0;
        }
        c.cl.sync();
        return;
    }
    if (fast) {
        if (lead) {
            o->token = p.forced >= 0 ? p.forced : fi;
            o->bad_idx = -1;
            o->n_top = 0;
            o->logprob = 0.f;
        }
        c.cl.sync();
        return;
    }

    /* 2. bans, repetition, frequency / presence (the lists hold distinct ids): f(entry) over a
     * list, split over the cluster's threads (SM: every block the whole list, for the ids it
     * owns), then the barrier that orders the edits before the passes; at(id): the element of
     * the work row this thread may edit, or null */
    auto each_entry = [&](int cnt, auto &&f) {
        for (int j = SM ? tid : g; j < cnt; j += SM ? SMP_T : SMW_G) f(j);
        if (SM) __syncthreads();
        else c.cl.sync();
    };
    auto at = [&](int id) -> float * {
        if (id < 0 || id >= V) return nullptr;
        return !SM ? w + id : id >= slo && id < slo + sn ? ws + (id - slo) : nullptr;
    };
    if (p.n_bias > 0) /* first: the host adds the bias to the raw logits (a masked id stays -inf) */
        each_entry(p.n_bias, [&](int j) {
            if (float *q = at(toks[p.bias_off + j])) *q = __fadd_rn(*q, bias_val(p, toks, j));
        });
    if (p.n_ban > 0)
        each_entry(p.n_ban, [&](int j) {
            if (float *q = at(toks[p.ban_off + j])) *q = -INFINITY;
        });
    if (p.rep_pen > 0.f && p.rep_pen != 1.f && p.n_rep > 0)
        each_entry(p.n_rep, [&](int j) {
            if (float *q = at(toks[p.rep_off + j])) *q = *q > 0.f ? __fdiv_rn(*q, p.rep_pen) : __fmul_rn(*q, p.rep_pen);
        });
    if ((p.freq_pen != 0.f || p.pres_pen != 0.f) && p.n_cnt > 0)
        each_entry(p.n_cnt, [&](int j) {
            if (float *q = at(toks[p.cnt_off + 2 * j]))
                *q = __fsub_rn(*q, __fadd_rn(__fmul_rn(p.freq_pen, (float)toks[p.cnt_off + 2 * j + 1]), p.pres_pen));
        });

    int token = -1;

    /* 3. greedy (the widen's argmax when it tracked one: the same ids, the same tie rule) */
    if (greedy && track) {
        token = fi;
    } else if (greedy) {
        float bv = -INFINITY;
        int bi = 0, lo = INT_MAX, hi = INT_MIN;
        rw.each([&](int i, float v) {
            if (v > bv) { bv = v; bi = i; }
        });
        cl_argmax_min_max(bv, bi, lo, hi, sh, c);
        token = bi;
    }
    if (p.forced >= 0) token = p.forced;
    if (greedy && !want_lp) {
        if (lead) { o->token = token; o->bad_idx = -1; o->n_top = 0; o->logprob = 0.f; }
        c.cl.sync();
        return;
    }

    /* 4. scaled logits, max, partition function */
    float m = -INFINITY;
    if (track) { /* x · inv rounds monotonically: the largest scaled logit is the largest's, scaled */
        m = scaled(fv, inv, scale);
    } else {
        rw.each([&](int, float x) { m = fmaxf(m, scaled(x, inv, scale)); });
        m = cl_max(m, sh, c);
    }
    /* with a draw: Z in the draw's pass over the row instead (the thresholds do not need it) */
    const int z_in_draw = token < 0;
    double Z = 0;
    if (!z_in_draw) {
        double z1[1] = {0};
        rw.each([&](int, float x) { z1[0] += (double)expf(scaled(x, inv, scale) - m); });
        cl_sum_dn<1>(z1, sh, c);
        Z = z1[0];
    }

    /* 5-6. filter and draw */
    if (token < 0) {
        const int use_k = p.top_k > 0 && p.top_k < V;
        const int use_p = p.top_p > 0.f && p.top_p < 1.f;
        uint64_t tk = 0, tp = 0;
        SMS_STAMP(2);
        { /* wide digits; top_p's base is its first histogram's (or candidates') mass */
            const int small_k = use_k && p.top_k <= SMF_CAP;
            const uint64_t lb = use_lb && use_k && p.top_k <= SMW_NW ? lb_for(p.top_k) : 0;
            if (use_k)
                tk = cl_key_select<0>(rw, V, inv, scale, m, 0, 0.0, (u64s)p.top_k, -1, use_p && small_k, fs, c, lb);
            SMS_STAMP(3);
            if (use_p)
                tp = cl_key_select<1>(rw, V, inv, scale, m, tk, (double)p.top_p, 0, small_k ? p.top_k : -1, 0, fs, c);
            SMS_STAMP(4);
        }
        const uint64_t thr = tk > tp ? tk : tp;
        const float min_p = p.min_p;
        /* segment sums in id order: global thread g owns [g·S, (g+1)·S) */
        const int i0 = min(V, g * S), i1 = min(V, i0 + S);
        double seg = 0, zs = 0;
        int last = -1;
        /* the segment in chunks of SMF_U loads issued together (a serial walk waits an L2 round
         * trip an id), then the sums in id order */
        for (int c0 = i0; c0 < i1; c0 += SMF_U) {
            float xv[SMF_U];
#pragma unroll
            for (int u = 0; u < SMF_U; u++) xv[u] = c0 + u < i1 ? rw.seg(c0 + u) : 0.f;
#pragma unroll
            for (int u = 0; u < SMF_U; u++) {
                const int i = c0 + u;
                if (i >= i1) break;
                float s = scaled(xv[u], inv, scale);
                float ex = expf(s - m);
                zs += (double)ex;
                if (rank_key(s, i) >= thr && (!(min_p > 0.f) || ex >= min_p)) {
                    seg += (double)ex;
                    if (ex > 0.f) last = i; /* never a masked or banned id (exp(-inf) = 0) */
                }
            }
        }
        /* inclusive scan in the warp, then the warps' totals in global warp order: e[k] is the
         * mass of the warps before global warp k, every block computing the same e */
        const int lane = tid & 31, wp = tid >> 5, gw = (int)c.rank * SMP_W + wp;
        double incl = seg;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            double t = __shfl_up_sync(0xffffffffu, incl, off);
            if (lane >= off) incl += t;
        }
        if (lane == 31) c.slot(sh)->d[wp] = incl;
        c.cl.sync();
        if (wp == 0) {
            /* lane l sums global warps 4l .. 4l+3 in order, then a fixed-order lane scan */
            double t4[4], run = 0;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                int q = lane * 4 + k;
                t4[k] = q < SMW_NW ? c.peer(sh, (unsigned)(q / SMP_W))->d[q % SMP_W] : 0.0;
                run += t4[k];
            }
            double inc = run;
#pragma unroll
            for (int off = 1; off < 32; off <<= 1) {
                double t = __shfl_up_sync(0xffffffffu, inc, off);
                if (lane >= off) inc += t;
            }
            double acc = __shfl_up_sync(0xffffffffu, inc, 1); /* the lanes before this one */
            if (lane == 0) acc = 0;
#pragma unroll
            for (int k = 0; k < 4; k++) {
                int q = lane * 4 + k;
                if (q < SMW_NW) sh.e[q] = acc;
                acc += t4[k];
                if (q + 1 == SMW_NW) sh.e[SMW_NW] = acc; /* the total: the last boundary */
            }
        }
        __syncthreads();
        c.par ^= 1;
        SMS_STAMP(5);
        /* [lo, hi) per thread: a thread's hi is bitwise the next thread's lo (the last lane's
         * hi is the next warp's boundary), so the ranges tile [0, mass) in id order */
        const double mass = sh.e[SMW_NW];
        double prev = __shfl_up_sync(0xffffffffu, incl, 1);
        const double lo = sh.e[gw] + (lane ? prev : 0.0);
        const double hi = lane == 31 ? sh.e[gw + 1] : sh.e[gw] + incl;
        const double target = philox_uniform(p.seed, p.counter, 0) * mass;
        int pick = INT_MAX;
        if (seg > 0 && target >= lo && target < hi) {
            double acc = lo;
            pick = last;
            bool done = false; /* chunked as above */
            for (int c0 = i0; c0 < i1 && !done; c0 += SMF_U) {
                float xv[SMF_U];
#pragma unroll
                for (int u = 0; u < SMF_U; u++) xv[u] = c0 + u < i1 ? rw.seg(c0 + u) : 0.f;
#pragma unroll
                for (int u = 0; u < SMF_U; u++) {
                    const int i = c0 + u;
                    if (done || i >= i1) break;
                    float s = scaled(xv[u], inv, scale);
                    if (rank_key(s, i) < thr) continue;
                    float ex = expf(s - m);
                    if (!(min_p > 0.f) || ex >= min_p) {
                        acc += (double)ex;
                        if (acc > target) { pick = i; done = true; }
                    }
                }
            }
        }
        float dv = 0.f;
        int did = 0;
        cl_argmax_min_max(dv, did, pick, last, sh, c);
        SMS_STAMP(6);
        token = pick != INT_MAX ? pick : last; /* last: the last candidate, for a target past the total */
        if (token < 0) token = 0;              /* nothing kept: every logit banned to -inf */
        if (z_in_draw) { /* the segments' sums of every exp, in the cluster's fixed order */
            double z1[1] = {zs};
            cl_sum_dn<1>(z1, sh, c);
            Z = z1[0];
        }
        SMS_STAMP(7);
    }

    /* 7. logprobs */
    const double lz = log(Z) + (double)m;
    if (p.n_top > 0) {
        const int n = nt;
        const uint64_t tn = cl_key_select<0>(rw, V, inv, scale, m, 0, 0.0, (u64s)n, -1, 0, fs, c,
                                             use_lb && n < V ? lb_for(n) : 0);
        if (tid == 0) sh.b.n_top = 0;
        __syncthreads();
        rw.each([&](int i, float x) {
            float s = scaled(x, inv, scale);
            uint64_t k = rank_key(s, i);
            if (k >= tn) {
                int at = atomicAdd(&sh.b.n_top, 1);
                if (at < SMP_DEV_TOP) { sh.b.top_key[at] = k; sh.b.top_id[at] = i; sh.b.top_s[at] = s; }
            }
        });
        c.cl.sync(); /* every block's candidates are in its shared memory */
        /* every block's list in rank order, one remote load a thread (a thread walking them one
         * after another waited ~0.5 µs a load: 42 µs for 5 top logprobs in S8-R1), then the lead
         * sorts them */
        if (tid < SMW_CL) fs.off[tid] = min(c.cl.map_shared_rank(&sh.b, (unsigned)tid)->n_top, SMP_DEV_TOP);
        __syncthreads();
        if (tid == 0) {
            int o = 0;
            for (int r = 0; r < SMW_CL; r++) {
                const int nr = fs.off[r];
                fs.off[r] = o;
                o += nr;
            }
            fs.off[SMW_CL] = min(o, SMP_DEV_TOP);
        }
        __syncthreads();
        if (tid < fs.off[SMW_CL]) {
            int r = 0;
            while (r + 1 < SMW_CL && fs.off[r + 1] <= tid) r++;
            const smp_shared *q = c.cl.map_shared_rank(&sh.b, (unsigned)r);
            const int a = tid - fs.off[r];
            fs.ck[tid] = q->top_key[a];
            fs.cf[tid] = ((u64s)(uint32_t)q->top_id[a] << 32) | __float_as_uint(q->top_s[a]);
        }
        __syncthreads();
        if (lead) {
            uint64_t key[SMP_DEV_TOP];
            int32_t id[SMP_DEV_TOP];
            float sv[SMP_DEV_TOP];
            int cnt = fs.off[SMW_CL];
            for (int a = 0; a < cnt; a++) {
                key[a] = fs.ck[a];
                id[a] = (int32_t)(fs.cf[a] >> 32);
                sv[a] = __uint_as_float((uint32_t)fs.cf[a]);
            }
            for (int a = 1; a < cnt; a++) /* insertion sort, descending key */
                for (int b = a; b > 0 && key[b] > key[b - 1]; b--) {
                    uint64_t tk2 = key[b]; key[b] = key[b - 1]; key[b - 1] = tk2;
                    int ti = id[b]; id[b] = id[b - 1]; id[b - 1] = ti;
                    float ts = sv[b]; sv[b] = sv[b - 1]; sv[b - 1] = ts;
                }
            cnt = min(cnt, n);
            while (cnt > 0 && sv[cnt - 1] == -INFINITY) cnt--; /* masked or banned: the host lists none */
            o->n_top = cnt;
            for (int a = 0; a < cnt; a++) {
                o->top_ids[a] = id[a];
                o->top_lp[a] = (float)((double)sv[a] - lz);
            }
        }
    } else if (lead) {
        o->n_top = 0;
    }
    SMS_STAMP(8);
    if (lead) { /* SM: the token's value in the shared memory of the block that owns it */
        const float xt = SM ? c.cl.map_shared_rank(ws, (unsigned)(token / (SMP_T * S)))[token % (SMP_T * S)] : w[token];
        o->token = token;
        o->bad_idx = -1;
        o->logprob = (float)((double)scaled(xt, inv, scale) - lz);
    }
    SMS_STAMP(9);
    c.cl.sync(); /* no block leaves while the lead may still read its shared memory */
}

/* ---- launch ------------------------------------------------------------------------------ */

/* MINB: blocks an SM must hold at once (2: at most 64 registers a thread, so that 16 rows'
 * clusters fit the GPU in one wave: device round S7-R1, batch 16 of the fast form 152 -> 111 us,
 * batch 1 78 -> 79 us); SM (one block an SM): the row in shared memory, smb bytes a block. */
template <int MINB, bool SM>
static void wide_kernels(const sample_args *a, cudaStream_t st, size_t smb, long long *prof, int lb) {
    const unsigned grid = (unsigned)a->rows * SMW_CL; /* a multiple of the cluster's size */
    if (a->dt == ACT_BF16)
        smw_row_kernel<bf16, MINB, SM><<<grid, SMP_T, smb, st>>>(a->vocab, (const bf16 *)a->logits, a->p, a->toks,
                                                                 a->work, a->out, prof, lb);
    else
        smw_row_kernel<float, MINB, SM><<<grid, SMP_T, smb, st>>>(a->vocab, (const float *)a->logits, a->p, a->toks,
                                                                  a->work, a->out, prof, lb);
}

/* The SM form's dynamic shared memory for a vocab-wide row (a block's SMP_T draw segments of
 * fp32: 122 KB for 248320 ids), or 0 with why filled when the kernels cannot take it beside their
 * static shared memory (cudaFuncGetAttributes) on this device (its opt-in limit: 227 KB on
 * sm_90). Raises the kernels' limit to it once a device and size (a function attribute, no
 * stream work). */
static size_t sm_bytes(int V, char *why, size_t nwhy) {
    const size_t b = (((size_t)V + SMW_G - 1) / SMW_G) * SMP_T * sizeof(float);
    static size_t set[16]; /* the limit set so far, per device */
    int dev = 0, optin = 0;
    cudaError_t c = cudaGetDevice(&dev);
    if (c == cudaSuccess && (dev < 0 || dev >= 16)) c = cudaErrorInvalidDevice;
    if (c == cudaSuccess && set[dev] >= b) return b;
    cudaFuncAttributes fa, fb;
    if (c == cudaSuccess) c = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev);
    if (c == cudaSuccess) c = cudaFuncGetAttributes(&fa, smw_row_kernel<bf16, 1, true>);
    if (c == cudaSuccess) c = cudaFuncGetAttributes(&fb, smw_row_kernel<float, 1, true>);
    if (c != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, nwhy, "%s", cudaGetErrorString(c));
        return 0;
    }
    const size_t fixed = fa.sharedSizeBytes > fb.sharedSizeBytes ? fa.sharedSizeBytes : fb.sharedSizeBytes;
    if (b + fixed > (size_t)optin) {
        snprintf(why, nwhy, "vocab %d: %zu + %zu B of shared memory a block, the device takes %d", V, b, fixed, optin);
        return 0;
    }
    c = cudaFuncSetAttribute(smw_row_kernel<bf16, 1, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)b);
    if (c == cudaSuccess)
        c = cudaFuncSetAttribute(smw_row_kernel<float, 1, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)b);
    if (c != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(why, nwhy, "%zu + %zu B of shared memory: %s", b, fixed, cudaGetErrorString(c));
        return 0;
    }
    set[dev] = b;
    return b;
}

/* minb 0: one block an SM up to 8 rows, two above (the same code, so the same results,
 * whichever); form: | SMS_SM the row in shared memory (| SMS_MUST: an error when it does not
 * fit, else the row in global memory, said once), | SMS_LB the top_k / top logprobs bound from
 * the warp maxima. */
enum { SMS_SM = 1, SMS_LB = 2, SMS_MUST = 4 };
static int wide_launch(const sample_args *a, ls_stream s, int minb, int form, ls_err *e, long long *prof = nullptr) {
    if (a->rows <= 0) return 0;
    int rc = sample_check(a, e);
    if (rc) return rc;
    cudaStream_t st = (cudaStream_t)s;
    if (!minb) minb = a->rows <= 8 ? 1 : 2;
    char why[160] = "";
    const size_t smb = (form & SMS_SM) ? sm_bytes(a->vocab, why, sizeof why) : 0;
    if ((form & SMS_SM) && !smb) {
        if (form & SMS_MUST) return errf(e, ERR_UNSUPPORTED, "sampling on CUDA: the row in shared memory: %s", why);
        static int said;
        if (!said) {
            said = 1;
            log_warn("sampling on CUDA: the row stays in global memory (%s)", why);
        }
    }
    const int lb = (form & SMS_LB) != 0;
    if (smb) wide_kernels<1, true>(a, st, smb, prof, lb);
    else if (minb == 2) wide_kernels<2, false>(a, st, 0, prof, lb);
    else wide_kernels<1, false>(a, st, 0, prof, lb);
    CU_LAUNCHED(e, smb ? "sampling on CUDA (a cluster a row, the row in shared memory)"
                       : "sampling on CUDA (a cluster a row)");
    return 0;
}

/* The cluster form: top_k / top_p / top logprobs thresholds by wide-digit histograms and a
 * shared-memory finish (cl_key_select, the default since H200 device round S7-R2: T 0.7 top_k 20
 * top_p 0.95 at batch 1 608.6 -> 83.2 us against the radix descent, the 8-layer decode step
 * 1.216 -> 0.779 ms; the descent was deleted in S8, the one-block form keeps it).
 * LASTSTAND_SAMPLE_LB=0|1: the top_k / top logprobs bound from the widen's warp maxima (on since
 * S8 device round R1: every test_sample_cuda case; R2, batch 1 / 16, tailed rows: T 0.7 top_k 20
 * top_p 0.95 68.7 -> 36.0 / 92.8 -> 47.3 us, top_k 20 53.6 -> 31.6 / 77.5 -> 44.6, the same
 * generate ids). LASTSTAND_SAMPLE_SM=0|1: up to SMS_SM_ROWS rows, each block's share of the row
 * in its shared memory (on since S8-R2: every case; at batch 1 with the bound 36.0 -> 32.0 us,
 * top_k 20 31.6 -> 26.7, top_p 0.9 70.9 -> 61.5, no filter 27.3 -> 23.5; at batch 16, one block
 * an SM against two, it loses: 47.3 -> 59.2). Read once. */
enum { SMS_SM_ROWS = 8 };
static int cuda_sample_wide_run(const sample_args *a, ls_stream s, ls_err *e) {
    static int lb = -1, sm = -1;
    if (lb < 0) lb = cu_env_switch("LASTSTAND_SAMPLE_LB", 1);
    if (sm < 0) sm = cu_env_switch("LASTSTAND_SAMPLE_SM", 1);
    return wide_launch(a, s, 0, (lb ? SMS_LB : 0) | (sm && a->rows <= SMS_SM_ROWS ? SMS_SM : 0), e);
}
static int cuda_sample_fast_run(const sample_args *a, ls_stream s, ls_err *e) { return wide_launch(a, s, 0, 0, e); }
static int cuda_sample_fast_lb_run(const sample_args *a, ls_stream s, ls_err *e) {
    return wide_launch(a, s, 0, SMS_LB, e);
}
static int cuda_sample_fast_sm_run(const sample_args *a, ls_stream s, ls_err *e) {
    return wide_launch(a, s, 1, SMS_SM | SMS_MUST, e);
}
static int cuda_sample_fast_smlb_run(const sample_args *a, ls_stream s, ls_err *e) {
    return wide_launch(a, s, 1, SMS_SM | SMS_LB | SMS_MUST, e);
}

/* rank 0's phase stamps of the last profiled launch (clock64 of its SM) */
__device__ long long smp_prof_stamps[SMS_NPROF];

extern "C" int sample_cuda_profile(const sample_args *a, ls_stream s, int lb, long long *stamps, int n, ls_err *e) {
    long long *d = nullptr;
    cudaStream_t st = (cudaStream_t)s;
    CU_TRY(e, cudaGetSymbolAddress((void **)&d, smp_prof_stamps), "sample_cuda_profile: the stamps");
    CU_TRY(e, cudaMemsetAsync(d, 0, sizeof(long long) * SMS_NPROF, st), "sample_cuda_profile: clear");
    int rc = wide_launch(a, s, 1, SMS_SM | SMS_MUST | (lb ? SMS_LB : 0), e, d);
    if (rc) return rc;
    if (n > SMS_NPROF) n = SMS_NPROF;
    CU_TRY(e, cudaMemcpyAsync(stamps, d, sizeof(long long) * n, cudaMemcpyDeviceToHost, st),
           "sample_cuda_profile: read");
    CU_TRY(e, cudaStreamSynchronize(st), "sample_cuda_profile: sync");
    return n;
}

/* The engine's sampler: the cluster form (the default since H200 device round S6-R1: every
 * test_sample_cuda case on both forms, the same greedy and seeded ids in `generate`, 36.5 ->
 * 10.6 µs a greedy batch-1 call), or the one-block form with LASTSTAND_SAMPLE_WIDE=0 (read
 * once). */
static int cuda_sample_run(const sample_args *a, ls_stream s, ls_err *e) {
    static int wide = -1;
    if (wide < 0) wide = cu_env_switch("LASTSTAND_SAMPLE_WIDE", 1);
    return wide ? cuda_sample_wide_run(a, s, e) : smp_block_run(a, s, e);
}

extern "C" const sample_impl sample_cuda = {"cuda_sample", DEV_CUDA, 0, 1, cuda_sample_run};
extern "C" const sample_impl sample_cuda_wide = {"cuda_sample_wide", DEV_CUDA, 1, 1, cuda_sample_wide_run};
extern "C" const sample_impl sample_cuda_fast = {"cuda_sample_fast", DEV_CUDA, 1, 1, cuda_sample_fast_run};
extern "C" const sample_impl sample_cuda_fast_lb = {"cuda_sample_fast_lb", DEV_CUDA, 1, 1, cuda_sample_fast_lb_run};
extern "C" const sample_impl sample_cuda_fast_sm = {"cuda_sample_fast_sm", DEV_CUDA, 1, 1, cuda_sample_fast_sm_run};
extern "C" const sample_impl sample_cuda_fast_smlb = {"cuda_sample_fast_smlb", DEV_CUDA, 1, 1,
                                                       cuda_sample_fast_smlb_run};
