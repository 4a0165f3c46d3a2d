/* sample_int.cuh: what the two CUDA samplers share (sample.cu: a thread-block cluster a row, the
 * engine's; sample_block.cu: one block a row, the reference): the block size, fixed-order block
 * reductions, the rank key, the temperature scaling, the Philox draw, the logits' loads. The
 * steps, their semantics and the invariants are sample.cu's header comment. */
#ifndef LS_OPS_CUDA_SAMPLE_INT_CUH
#define LS_OPS_CUDA_SAMPLE_INT_CUH

#include "ops/cuda/cu_util.h"
#include "ops/cuda/graph.h"

#include <float.h>
#include <limits.h>
#include <math.h>

enum { SMP_T = 512, SMP_W = SMP_T / 32 };

static_assert(sizeof(smp_row) % 8 == 0, "smp_row is read as a struct from device memory");

/* ---- block reductions (fixed order) ------------------------------------------------------ */

typedef struct smp_shared {
    double d[SMP_W * 16];
    int i[SMP_W * 16];
    float f[SMP_W];
    int bad;
    int n_top;
    uint64_t top_key[SMP_DEV_TOP];
    int32_t top_id[SMP_DEV_TOP];
    float top_s[SMP_DEV_TOP];
} smp_shared;

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ int warp_sum_i(int v) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum of n values per thread (n <= 16) across the block: every thread gets the totals. */
template <int N>
__device__ void blk_sum_dn(double (&v)[N], smp_shared &sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int j = 0; j < N; j++) {
        double t = warp_sum_d(v[j]);
        if (lane == 0) sh.d[w * 16 + j] = t;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < N; j++) {
        double t = 0;
        for (int k = 0; k < SMP_W; k++) t += sh.d[k * 16 + j];
        v[j] = t;
    }
    __syncthreads();
}
template <int N>
__device__ void blk_sum_in(int (&v)[N], smp_shared &sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int j = 0; j < N; j++) {
        int t = warp_sum_i(v[j]);
        if (lane == 0) sh.i[w * 16 + j] = t;
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < N; j++) {
        int t = 0;
        for (int k = 0; k < SMP_W; k++) t += sh.i[k * 16 + j];
        v[j] = t;
    }
    __syncthreads();
}

/* (value, id) maximum, lowest id on ties; -inf rows give id 0. */
static __device__ void blk_argmax(float &v, int &id, smp_shared &sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        float ov = __shfl_xor_sync(0xffffffffu, v, o);
        int oi = __shfl_xor_sync(0xffffffffu, id, o);
        if (ov > v || (ov == v && oi < id)) { v = ov; id = oi; }
    }
    if (lane == 0) { sh.f[w] = v; sh.i[w] = id; }
    __syncthreads();
    v = sh.f[0];
    id = sh.i[0];
    for (int k = 1; k < SMP_W; k++)
        if (sh.f[k] > v || (sh.f[k] == v && sh.i[k] < id)) { v = sh.f[k]; id = sh.i[k]; }
    __syncthreads();
}

static __device__ float blk_max(float v, smp_shared &sh) {
    int id = 0;
    blk_argmax(v, id, sh);
    return v;
}

/* ---- keys and the RNG ------------------------------------------------------------------- */

/* Descending key = descending value, then ascending id (the host's rank order). */
__device__ __forceinline__ uint64_t rank_key(float s, int i) {
    uint32_t b = __float_as_uint(s);
    uint32_t o = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((uint64_t)o << 32) | (uint64_t)(0xffffffffu - (uint32_t)i);
}

/* The host's scaling: x · (1 / T) in float, or x itself when T == 1. */
__device__ __forceinline__ float scaled(float x, float inv, int scale) { return scale ? __fmul_rn(x, inv) : x; }

/* Philox-4x32-10 (Salmon et al. 2011): 4 x 32 random bits from a 128-bit counter and 64-bit key. */
static __device__ void philox4x32(uint32_t c[4], uint32_t k0, uint32_t k1) {
#pragma unroll
    for (int r = 0; r < 10; r++) {
        uint32_t hi0 = __umulhi(0xD2511F53u, c[0]), lo0 = 0xD2511F53u * c[0];
        uint32_t hi1 = __umulhi(0xCD9E8D57u, c[2]), lo1 = 0xCD9E8D57u * c[2];
        uint32_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
}

/* u in [0, 1) with 53 random bits for (seed, counter, stream). */
static __device__ double philox_uniform(uint64_t seed, uint64_t counter, uint32_t stream) {
    uint32_t c[4] = {(uint32_t)counter, (uint32_t)(counter >> 32), stream, 0x6c617374u /* "last" */};
    philox4x32(c, (uint32_t)seed, (uint32_t)(seed >> 32));
    uint64_t bits = ((uint64_t)c[0] << 21) ^ ((uint64_t)c[1] >> 11) ^ ((uint64_t)c[2] << 32);
    return (double)(bits & ((1ull << 53) - 1)) * 0x1.0p-53;
}

/* ---- loads ------------------------------------------------------------------------------ */

template <typename T>
__device__ __forceinline__ float load_logit(const T *p, size_t i);
template <>
__device__ __forceinline__ float load_logit<bf16>(const bf16 *p, size_t i) { return __bfloat162float(p[i]); }
template <>
__device__ __forceinline__ float load_logit<float>(const float *p, size_t i) { return p[i]; }

/* The 16 bytes u as fp32 values (8 BF16 or 4 fp32). */
template <typename T>
__device__ __forceinline__ void unpack16(uint4 u, float *v);
template <>
__device__ __forceinline__ void unpack16<bf16>(uint4 u, float *v) {
    const uint32_t q[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        v[2 * k] = __uint_as_float(q[k] << 16);
        v[2 * k + 1] = __uint_as_float(q[k] & 0xffff0000u);
    }
}
template <>
__device__ __forceinline__ void unpack16<float>(uint4 u, float *v) {
    v[0] = __uint_as_float(u.x); v[1] = __uint_as_float(u.y); v[2] = __uint_as_float(u.z); v[3] = __uint_as_float(u.w);
}

/* ---- constrained rows (smp_row.n_mask / n_bias, S9) ---------------------------------------- */

/* A compile-time flag for generic lambdas (a loop instantiated with and without a mask). */
template <bool B>
struct smp_bool {
    static constexpr bool value = B;
};

/* The row's allowed-token bitmask in toks, or null (none, or fewer words than the vocabulary). */
__device__ __forceinline__ const uint32_t *row_mask(const smp_row &p, const int32_t *toks, int V) {
    return p.n_mask > 0 && p.n_mask >= (V + 31) / 32 ? (const uint32_t *)(toks + p.mask_off) : nullptr;
}
/* The allow bits of ids i .. i + 31 from bit 0 (i a multiple of the 16-byte load's elements, so
 * a load's ids share one word); all ones without a mask. */
__device__ __forceinline__ uint32_t mask_bits(const uint32_t *mk, int i) {
    return mk ? mk[i >> 5] >> (i & 31) : 0xffffffffu;
}
/* bias entry j of a row: (id, float) */
__device__ __forceinline__ float bias_val(const smp_row &p, const int32_t *toks, int j) {
    return __int_as_float(toks[p.bias_off + p.n_bias + j]);
}

/* ---- launch ----------------------------------------------------------------------------- */

static inline int sample_check(const sample_args *a, ls_err *e) {
    if (a->vocab < 1 || !a->logits || !a->p || !a->work || !a->out)
        return errf(e, ERR_INVAL, "sampling on CUDA: %d rows of vocab %d with a missing buffer", a->rows, a->vocab);
    return 0;
}

/* sample_block.cu: the one-block form (sample_cuda_block; LASTSTAND_SAMPLE_WIDE=0). */
int smp_block_run(const sample_args *a, ls_stream s, ls_err *e);

#endif
