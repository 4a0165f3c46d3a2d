/* small.cu: the small ops on CUDA ("cuda"): RMSNorm (plain w·x̂ and
 * zero-centred (1+w)·x̂), gated RMSNorm (w·x̂·silu(z)), NeoX RoPE on the first
 * rot_dim dims of each head (alone, or fused after the q/k head RMSNorm with
 * one rounding), embedding lookup, SiLU-mul, residual add, the residual add
 * fused with the next RMSNorm over the fp32 residual stream, the KV-page
 * writes and the logits row gather. Activations BF16, math fp32,
 * 1-D weights and add_rmsnorm's residual stream fp32; the same formulas as
 * ref_small.c (inverse frequencies theta^(-2i/rot_dim) computed in double and
 * rounded to fp32, as transformers).
 *
 * Every pointer is device memory: ids, pos and the attn_seq array (with its
 * page tables) included. Launch errors come back as ERR_RUNTIME /
 * ERR_UNSUPPORTED; faults surface at the model's next sync.
 * The kernels that come right before a projection start with
 * griddepcontrol.launch_dependents (cu_pdl_trigger): the projection, launched
 * with programmatic dependent launch, loads its weights while they run.
 * By default (sm_pdl; LASTSTAND_SMALL_PDL=0: off) every kernel but the embedding is
 * itself launched with the attribute and waits (cu_pdl_wait) before its first memory
 * access: its launch overlaps the previous kernel's tail (H200 device round R1,
 * 2026-11-29: with the other decode-step PDL switches, 8-layer synth 35B decode step
 * 1.023 -> 0.941 ms).
 */
#include "ops/cuda/cu_util.h"
#include "ops/cuda/cu_pdl.h"
#include "ops/cuda/fwd_cuda.h"

#include <stdlib.h>
#include <string.h>

enum { SM_THREADS = 256 };

static int launched(void) {
    cudaError_t c = cudaGetLastError();
    if (c == cudaSuccess) return 0;
    return (c == cudaErrorNoKernelImageForDevice || c == cudaErrorInvalidDeviceFunction) ? ERR_UNSUPPORTED
                                                                                         : ERR_RUNTIME;
}

/* LASTSTAND_SMALL_PDL=0|1: launch the kernels below (all but the embedding) without / with
 * the programmatic-serialization attribute (SM_PDL_DEFAULT). With it a kernel may be
 * scheduled while its predecessor still runs; each one executes cu_pdl_wait before its
 * first memory access, so it only hides its own launch. Read once. */
#define SM_PDL_DEFAULT 1
static int sm_pdl(void) {
    static int v = -1;
    if (v < 0) v = cu_env_switch("LASTSTAND_SMALL_PDL", SM_PDL_DEFAULT);
    return v;
}

/* K<<<g, b, smem, s>>>(args...), with the attribute when sm_pdl() (retried without it if
 * the launch refuses it); 0, ERR_UNSUPPORTED (no kernel image) or ERR_RUNTIME. */
template <typename... KArgs, typename... Args>
static int sm_launch(void (*K)(KArgs...), dim3 g, dim3 b, size_t smem, ls_stream s, Args... args) {
    const int pdl = sm_pdl();
    cudaError_t c = cu_launch_pdl(pdl, K, g, b, smem, (cudaStream_t)s, args...);
    if (c != cudaSuccess && pdl) {
        (void)cudaGetLastError();
        c = cu_launch_pdl(0, K, g, b, smem, (cudaStream_t)s, args...);
    }
    if (c == cudaSuccess) return launched();
    (void)cudaGetLastError();
    return (c == cudaErrorNoKernelImageForDevice || c == cudaErrorInvalidDeviceFunction) ? ERR_UNSUPPORTED
                                                                                         : ERR_RUNTIME;
}

/* Programmatic dependent launch: the kernels that usually come right before a
 * projection (the norms, RoPE, SiLU-mul, the residual adds, the embedding) let the
 * next kernel launch as soon as all their blocks have started. Only a kernel launched
 * with the programmatic-serialization attribute can start early, and every such kernel
 * (fp4_gemv.cu's, moe_fused.cu's, attention_prefill.cu's) executes cu_pdl_wait (griddepcontrol.wait), which waits for this grid to
 * complete with its memory visible, before it reads anything written here: the early
 * start only lets it fetch its weights meanwhile. A no-op otherwise. */

__device__ __forceinline__ float sm_silu(float x) { return x / (1.0f + expf(-x)); }

/* Sum over the block (blockDim.x a multiple of 32, <= 1024). */
__device__ float sm_block_sum(float v) {
    __shared__ float part[32];
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (l == 0) part[w] = v;
    __syncthreads();
    float t = l < nw ? part[l] : 0.f;
    for (int o = 16; o; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    return t;
}

/* ---- many rows: one warp a row, persistent -----------------------------------------
 * The kernels above give every row (an 8192-token prefill: 262144 GDN norm rows of 128,
 * 147456 q/k head rows of 256) a block: per-block costs, two barriers and a double pow per
 * element dominate (H200, ncu, S12: 317 µs for 190 MB, 462 µs for 164 MB). Below, one warp
 * does a row of cols <= 256, SR_WARPS warps a block, a grid of as many blocks as fit at once
 * (occupancy x SMs): each warp walks batches (SP_R rows of the norm, 1 row of qk) gridDim · 8
 * apart and issues the next batch's loads before the current batch's math, so that its loads
 * and its math overlap; the q/k kernel computes its inverse-frequency table once a block, its
 * rope variant fixed at compile time (HT: the rotated pairs in one lane, half = 32 HT; 0:
 * through shared memory), its KV slot by a 32-wide ballot over the sequences.
 * Lane l holds elements e = l + 32 j (j < J), i.e. the element thread e of the block kernel
 * held (blockDim there = cols rounded up to 32, so one element a thread), and the results are
 * the block kernels' bit for bit: the sum of squares is sm_block_sum's, virtual warp j's xor
 * tree then the tree over the J partials padded with zeros (virtual warps past cols add exact
 * zeros), every other op the same fp32 op (the rope's contraction spelled out as the block
 * kernel's SASS has it: fma(±partner, sin, x · cos)), the inverse frequencies the same double
 * expression. (S12 round R2 also had one warp a row with R rows a warp and no prefetch: gated
 * norm 150 µs, qk 171 µs; deleted after R3: 147 / 167 µs against this form's 99 / 113 µs.) */
enum { SR_WARPS = 8, SR_MAXJ = 8,
       SR_MIN_ROWS = 2048 /* the engine's (small_cuda's) warp form from here: below, the block kernels */ };

/* LASTSTAND_SMALL_ROWS=0|1: rmsnorm, rmsnorm_gated, qk_norm_rope and qk_norm_rope_kv one
 * block a row / the persistent warps below, where cols (head_dim) <= 256 and from SR_MIN_ROWS
 * rows (SM_ROWS_DEFAULT: 1 since H200 round R3 of S12, ncu, synth 35B's 8192-token prefill:
 * gated norm 317.6 -> 99.3 µs, qk norm + rope + KV 461.9 -> 112.9 µs, the same bits
 * (test_small_cuda), the same greedy ids; the warp form with R rows a warp took one decode
 * token's qk 5.4 -> 8.1 µs in R2, hence the block kernels below SR_MIN_ROWS rows). Read once. */
#define SM_ROWS_DEFAULT 1
static int sm_rows(void) {
    static int v = -1;
    if (v < 0) v = cu_env_switch("LASTSTAND_SMALL_ROWS", SM_ROWS_DEFAULT);
    return v;
}

/* sm_block_sum of the J virtual warps' squares q[j] (this lane's element of warp j); every
 * lane gets the same value. */
template <int J>
__device__ __forceinline__ float sr_sum(float q[J], int lane) {
#pragma unroll
    for (int o = 16; o; o >>= 1)
#pragma unroll
        for (int j = 0; j < J; j++) q[j] += __shfl_xor_sync(0xffffffffu, q[j], o);
    float t = 0.f;
#pragma unroll
    for (int j = 0; j < J; j++)
        if (lane == j) t = q[j];
    for (int o = 16; o; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    return t;
}

/* The token's KV slot (row of the pool; -1: no sequence holds token t, or its page is outside
 * the pool), as sm_qk_norm_rope_kv_kernel's scan (the first sequence that holds t), 32
 * sequences a step; every lane gets it. */
__device__ __forceinline__ long long sr_slot(const attn_seq *__restrict__ seqs, int n_seq, int t, int page_size,
                                             int n_pages, int lane) {
    for (int i0 = 0; i0 < n_seq; i0 += 32) {
        const int i = i0 + lane;
        long long d = -1;
        bool hit = false;
        if (i < n_seq) {
            const attn_seq sq = seqs[i];
            hit = t >= sq.row0 && t < sq.row0 + sq.n_new;
            if (hit) {
                const int p = sq.n_past + t - sq.row0;
                const int32_t page = sq.pages[p / page_size];
                if (page >= 0 && page < n_pages) d = (long long)page * page_size + p % page_size;
            }
        }
        const unsigned m = __ballot_sync(0xffffffffu, hit);
        if (m) return __shfl_sync(0xffffffffu, d, __ffs(m) - 1);
    }
    return -1;
}

/* NeoX rotation of a row whose rotated pairs (e, e + half) sit in one lane: half = 32 H. */
template <int J, int H>
__device__ __forceinline__ void sr_rope_lane(float o[J], const float nv[J], const float *inv, float p, int lane) {
#pragma unroll
    for (int j = 0; j < H; j++) {
        const float ang = __fmul_rn(p, inv[lane + 32 * j]), c = cosf(ang), sn = sinf(ang);
        o[j] = __fmaf_rn(-nv[j + H], sn, __fmul_rn(nv[j], c));
        o[j + H] = __fmaf_rn(nv[j], sn, __fmul_rn(nv[j + H], c));
    }
}

/* J for cols (head_dim) <= 256: the virtual warps, a power of two >= 2; 0 above. */
static int sr_j(int cols) { return cols <= 64 ? 2 : cols <= 128 ? 4 : cols <= 256 ? 8 : 0; }

/* rows a warp's batch in sm_rmsnorm_pipe_kernel */
enum { SP_R = 2 };

template <int J, int R>
__device__ __forceinline__ void sp_norm_load(bf16 (&xb)[R][J], bf16 (&zb)[R][J], const bf16 *x, const bf16 *z,
                                             int rows, int cols, long long r0, int lane) {
    const bf16 zero = __float2bfloat16(0.f);
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int j = 0; j < J; j++) {
            const int e = lane + 32 * j;
            const bool on = r0 + r < rows && e < cols;
            const size_t i = (size_t)(r0 + r) * cols + e;
            xb[r][j] = on ? x[i] : zero;
            zb[r][j] = on && z ? z[i] : zero;
        }
}

template <int J>
__global__ void __launch_bounds__(SR_WARPS * 32)
    sm_rmsnorm_pipe_kernel(int rows, int cols, const bf16 *x, const bf16 *__restrict__ z,
                           const float *__restrict__ w, int zc, float eps, bf16 *y) {
    cu_pdl_trigger();
    const int lane = threadIdx.x & 31;
    float wv[J];
#pragma unroll
    for (int j = 0; j < J; j++) wv[j] = lane + 32 * j < cols ? __ldg(w + lane + 32 * j) : 0.f; /* constants */
    cu_pdl_wait();
    const long long stride = (long long)gridDim.x * SR_WARPS * SP_R;
    long long r0 = ((long long)blockIdx.x * SR_WARPS + (threadIdx.x >> 5)) * SP_R;
    bf16 xb[SP_R][J], zb[SP_R][J];
    sp_norm_load<J, SP_R>(xb, zb, x, z, rows, cols, r0, lane);
    for (; r0 < rows; r0 += stride) {
        bf16 xn[SP_R][J], zn[SP_R][J];
        sp_norm_load<J, SP_R>(xn, zn, x, z, rows, cols, r0 + stride, lane); /* in flight during the math */
#pragma unroll
        for (int r = 0; r < SP_R; r++) {
            if (r0 + r >= rows) break;
            float xv[J], q[J];
#pragma unroll
            for (int j = 0; j < J; j++) xv[j] = __bfloat162float(xb[r][j]), q[j] = __fmul_rn(xv[j], xv[j]);
            const float s = rsqrtf(sr_sum<J>(q, lane) / cols + eps);
            bf16 *yr = y + (size_t)(r0 + r) * cols;
#pragma unroll
            for (int j = 0; j < J; j++) {
                const int e = lane + 32 * j;
                if (e >= cols) continue;
                const float xh = __fmul_rn(xv[j], s);
                float o;
                if (z)
                    o = __fmul_rn(__fmul_rn(wv[j], xh), sm_silu(__bfloat162float(zb[r][j])));
                else
                    o = zc ? __fmul_rn(xh, __fadd_rn(1.0f, wv[j])) : __fmul_rn(wv[j], xh);
                yr[e] = __float2bfloat16(o);
            }
        }
#pragma unroll
        for (int r = 0; r < SP_R; r++)
#pragma unroll
            for (int j = 0; j < J; j++) xb[r][j] = xn[r][j], zb[r][j] = zn[r][j];
    }
}

/* row b's x (q or k), v (k rows with a pool) and position */
template <int J>
__device__ __forceinline__ void sp_qk_load(bf16 (&xb)[J], bf16 (&vb)[J], float &pb, int b, int nq, int nrows,
                                           int nh, int nkv, int head_dim, int rot_dim, const int32_t *pos,
                                           const bf16 *q, const bf16 *k, const bf16 *v, bool kv, int lane) {
    const bf16 zero = __float2bfloat16(0.f);
    const int isk = b >= nq, rr = isk ? b - nq : b;
    const bool ok = b < nrows;
    pb = ok && rot_dim ? (float)pos[rr / (isk ? nkv : nh)] : 0.f;
    const bf16 *xr = (isk ? k : q) + (size_t)rr * head_dim;
#pragma unroll
    for (int j = 0; j < J; j++) {
        const int e = lane + 32 * j;
        const bool on = ok && e < head_dim;
        xb[j] = on ? xr[e] : zero;
        vb[j] = on && isk && kv ? v[(size_t)rr * head_dim + e] : zero;
    }
}

template <typename T, int J, int HT>
__global__ void __launch_bounds__(SR_WARPS * 32)
    sm_qk_pipe_kernel(int n_tok, int nh, int nkv, int head_dim, const float *__restrict__ qw,
                      const float *__restrict__ kw, int zc, float eps, int rot_dim, const int32_t *__restrict__ pos,
                      double theta, bf16 *q, bf16 *k, const bf16 *__restrict__ v,
                      const attn_seq *__restrict__ seqs, int n_seq, int page_size, int n_pages, T *kp, T *vp) {
    cu_pdl_trigger();
    __shared__ float inv_sh[SR_MAXJ * 16];
    __shared__ float row_sh[SR_WARPS][HT ? 1 : SR_MAXJ * 32];
    const int half = rot_dim / 2;
    for (int j = threadIdx.x; j < rot_dim - half; j += blockDim.x) /* constants: before the wait */
        inv_sh[j] = (float)(1.0 / pow(theta, (double)(2 * j) / rot_dim));
    __syncthreads();
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    const int nq = n_tok * nh, nrows = n_tok * (nh + nkv), stride = gridDim.x * SR_WARPS;
    const bool kv = kp != nullptr;
    float wq[J], wk[J];
#pragma unroll
    for (int j = 0; j < J; j++) {
        const bool on = lane + 32 * j < head_dim;
        wq[j] = on ? __ldg(qw + lane + 32 * j) : 0.f;
        wk[j] = on && nkv ? __ldg(kw + lane + 32 * j) : 0.f;
    }
    cu_pdl_wait();
    int b = blockIdx.x * SR_WARPS + wi;
    bf16 xb[J], vb[J];
    float pb;
    sp_qk_load<J>(xb, vb, pb, b, nq, nrows, nh, nkv, head_dim, rot_dim, pos, q, k, v, kv, lane);
    long long db = b < nrows && b >= nq && kv ? sr_slot(seqs, n_seq, (b - nq) / nkv, page_size, n_pages, lane) : -1;
    for (; b < nrows; b += stride) {
        const int bn = b + stride;
        bf16 xn[J], vn[J];
        float pn;
        sp_qk_load<J>(xn, vn, pn, bn, nq, nrows, nh, nkv, head_dim, rot_dim, pos, q, k, v, kv, lane);
        const int isk = b >= nq, rr = isk ? b - nq : b;
        float xv[J], sq[J], nv[J], o[J];
#pragma unroll
        for (int j = 0; j < J; j++) xv[j] = __bfloat162float(xb[j]), sq[j] = __fmul_rn(xv[j], xv[j]);
        const float s = rsqrtf(sr_sum<J>(sq, lane) / head_dim + eps);
#pragma unroll
        for (int j = 0; j < J; j++) {
            const float wj = isk ? wk[j] : wq[j], xh = __fmul_rn(xv[j], s);
            nv[j] = zc ? __fmul_rn(xh, __fadd_rn(1.0f, wj)) : __fmul_rn(wj, xh);
            o[j] = nv[j];
        }
        if (HT) {
            sr_rope_lane<J, (HT ? HT : 1)>(o, nv, inv_sh, pb, lane);
        } else if (rot_dim) { /* the partner in another lane: through this warp's row in shared memory */
            float *rs = row_sh[wi];
#pragma unroll
            for (int j = 0; j < J; j++)
                if (lane + 32 * j < head_dim) rs[lane + 32 * j] = nv[j];
            __syncwarp();
#pragma unroll
            for (int j = 0; j < J; j++) {
                const int e = lane + 32 * j;
                if (e >= rot_dim) continue;
                const float ang = __fmul_rn(pb, inv_sh[e < half ? e : e - half]), c = cosf(ang), sn = sinf(ang);
                const float m = __fmul_rn(nv[j], c);
                o[j] = e < half ? __fmaf_rn(-rs[e + half], sn, m) : __fmaf_rn(rs[e - half], sn, m);
            }
            __syncwarp(); /* before the next row's stores */
        }
        bf16 *xr = (isk ? k : q) + (size_t)rr * head_dim;
        const size_t kvo = (size_t)db * nkv * head_dim + (size_t)(rr % (isk ? nkv : 1)) * head_dim;
#pragma unroll
        for (int j = 0; j < J; j++) {
            const int e = lane + 32 * j;
            if (e >= head_dim) continue;
            const bf16 ob = __float2bfloat16(o[j]);
            xr[e] = ob;
            if (db >= 0) {
                if (sizeof(T) == 2) {
                    ((bf16 *)kp)[kvo + e] = ob;
                    ((bf16 *)vp)[kvo + e] = vb[j];
                } else {
                    ((float *)kp)[kvo + e] = __bfloat162float(ob);
                    ((float *)vp)[kvo + e] = __bfloat162float(vb[j]);
                }
            }
        }
        db = bn < nrows && bn >= nq && kv ? sr_slot(seqs, n_seq, (bn - nq) / nkv, page_size, n_pages, lane) : -1;
#pragma unroll
        for (int j = 0; j < J; j++) xb[j] = xn[j], vb[j] = vn[j];
        pb = pn;
    }
}

/* blocks of kern that fit on the device at once (occupancy x SMs), cached in *n (one per kernel) */
template <typename K>
static int sp_resident(K kern, int *n) {
    if (!*n) {
        int dev = 0, sms = 0, per = 0;
        if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kern, SR_WARPS * 32, 0) != cudaSuccess || sms * per <= 0) {
            (void)cudaGetLastError();
            return 1024;
        }
        *n = sms * per;
    }
    return *n;
}

static unsigned sp_grid(long long warps_needed, int resident) {
    const long long b = (warps_needed + SR_WARPS - 1) / SR_WARPS;
    return (unsigned)(b < resident ? (b > 0 ? b : 1) : resident);
}

template <int J>
static int sp_rmsnorm_launch(int rows, int cols, const bf16 *x, const bf16 *z, const float *w, int zc, float eps,
                             bf16 *y, ls_stream s) {
    static int res = 0;
    const unsigned g = sp_grid((rows + SP_R - 1) / SP_R, sp_resident(sm_rmsnorm_pipe_kernel<J>, &res));
    return sm_launch(sm_rmsnorm_pipe_kernel<J>, dim3(g), dim3(SR_WARPS * 32), 0, s, rows, cols, x, z, w, zc, eps, y);
}

static int sp_rmsnorm(int rows, int cols, const void *x, const void *z, const float *w, int zc, float eps, void *y,
                      ls_stream s) {
    switch (sr_j(cols)) {
    case 2: return sp_rmsnorm_launch<2>(rows, cols, (const bf16 *)x, (const bf16 *)z, w, zc, eps, (bf16 *)y, s);
    case 4: return sp_rmsnorm_launch<4>(rows, cols, (const bf16 *)x, (const bf16 *)z, w, zc, eps, (bf16 *)y, s);
    default: return sp_rmsnorm_launch<8>(rows, cols, (const bf16 *)x, (const bf16 *)z, w, zc, eps, (bf16 *)y, s);
    }
}

template <typename T, int J, int HT>
static int sp_qk_launch(int n_tok, int nh, int nkv, int head_dim, const float *qw, const float *kw, int zc, float eps,
                        int rot_dim, const int32_t *pos, double theta, bf16 *q, bf16 *k, const bf16 *v,
                        const attn_seq *seqs, int n_seq, int page_size, int n_pages, T *kp, T *vp, ls_stream s) {
    static int res = 0;
    const unsigned g = sp_grid((long long)n_tok * (nh + nkv), sp_resident(sm_qk_pipe_kernel<T, J, HT>, &res));
    return sm_launch(sm_qk_pipe_kernel<T, J, HT>, dim3(g), dim3(SR_WARPS * 32), 0, s, n_tok, nh, nkv, head_dim, qw,
                     kw, zc, eps, rot_dim, pos, theta, q, k, v, seqs, n_seq, page_size, n_pages, kp, vp);
}

/* qk_norm_rope(_kv), the persistent form (head_dim <= 256; rot_dim already 0 when < 2). */
template <typename T>
static int sp_qk(int n_tok, int nh, int nkv, int head_dim, const float *qw, const float *kw, int zc, float eps,
                 int rot_dim, const int32_t *pos, double theta, void *q, void *k, const void *v, const attn_seq *seqs,
                 int n_seq, int page_size, int n_pages, T *kp, T *vp, ls_stream s) {
    const int J = sr_j(head_dim), HT = rot_dim && rot_dim % 64 == 0 ? rot_dim / 64 : 0;
#define SP_QK(J_, HT_)                                                                                               \
    return sp_qk_launch<T, J_, HT_>(n_tok, nh, nkv, head_dim, qw, kw, zc, eps, rot_dim, pos, theta, (bf16 *)q,       \
                                    (bf16 *)k, (const bf16 *)v, seqs, n_seq, page_size, n_pages, kp, vp, s)
    if (J == 2) {
        if (HT == 1) SP_QK(2, 1);
        SP_QK(2, 0);
    }
    if (J == 4) {
        if (HT == 1) SP_QK(4, 1);
        if (HT == 2) SP_QK(4, 2);
        SP_QK(4, 0);
    }
    if (HT == 1) SP_QK(8, 1);
    if (HT == 2) SP_QK(8, 2);
    if (HT == 4) SP_QK(8, 4);
    SP_QK(8, 0);
#undef SP_QK
}

/* ---- RMSNorm ---------------------------------------------------------------- */

/* One block per row; y may alias x (each element is read and written by one thread). */
__global__ void sm_rmsnorm_kernel(int cols, const bf16 *__restrict__ x, const bf16 *__restrict__ z,
                                  const float *__restrict__ w, int zc, float eps, bf16 *y) {
    cu_pdl_trigger();
    cu_pdl_wait();
    const size_t r = blockIdx.x;
    const bf16 *xr = x + r * cols;
    float ss = 0.f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        float v = __bfloat162float(xr[i]);
        ss += v * v;
    }
    const float s = rsqrtf(sm_block_sum(ss) / cols + eps);
    bf16 *yr = y + r * cols;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        float xh = __bfloat162float(xr[i]) * s;
        float o;
        if (z)
            o = w[i] * xh * sm_silu(__bfloat162float(z[r * cols + i]));
        else
            o = zc ? xh * (1.0f + w[i]) : w[i] * xh;
        yr[i] = __float2bfloat16(o);
    }
}

static int threads_for(int cols) {
    int t = cols >= SM_THREADS ? SM_THREADS : ((cols + 31) / 32) * 32;
    return t < 32 ? 32 : t;
}

/* The form of the row-wise norms for rows rows: F < 0 the switch's (small_cuda; the block
 * kernels below SR_MIN_ROWS rows), 0 one block a row (small_cuda_block), 1 the persistent warps
 * where they apply (small_cuda_rows). */
static int sm_form(int F, long long rows) { return F >= 0 ? F : rows < SR_MIN_ROWS ? 0 : sm_rows(); }

template <int F>
static int c_rmsnorm(int rows, int cols, const void *x, const float *w, rms_kind kind, float eps, void *y,
                     act_dtype dt, ls_stream s) {
    if (dt != ACT_BF16) return ERR_UNSUPPORTED;
    if (rows <= 0) return 0;
    const int f = sm_form(F, rows);
    if (f && sr_j(cols))
        return sp_rmsnorm(rows, cols, x, nullptr, w, (int)(kind == RMS_ZC), eps, y, s);
    return sm_launch(sm_rmsnorm_kernel, dim3(rows), dim3(threads_for(cols)), 0, s, cols, (const bf16 *)x,
                     (const bf16 *)nullptr, w, (int)(kind == RMS_ZC), eps, (bf16 *)y);
}

template <int F>
static int c_rmsnorm_gated(int rows, int cols, const void *x, const void *z, const float *w, float eps,
                           void *y, act_dtype dt, ls_stream s) {
    if (dt != ACT_BF16) return ERR_UNSUPPORTED;
    if (rows <= 0) return 0;
    const int f = sm_form(F, rows);
    if (f && sr_j(cols)) return sp_rmsnorm(rows, cols, x, z, w, 0, eps, y, s);
    return sm_launch(sm_rmsnorm_kernel, dim3(rows), dim3(threads_for(cols)), 0, s, cols, (const bf16 *)x,
                     (const bf16 *)z, w, 0, eps, (bf16 *)y);
}

/* h (+)= x in fp32, then y = norm(h) in BF16. One block per row; each thread
 * reads back only the h elements it wrote, so no barrier besides the sum's. */
__global__ void sm_add_rmsnorm_kernel(int cols, float *__restrict__ h, const bf16 *x, int init,
                                      const float *__restrict__ w, int zc, float eps, bf16 *y) {
    cu_pdl_trigger();
    cu_pdl_wait();
    const size_t r = blockIdx.x;
    float *hr = h + r * cols;
    const bf16 *xr = x + r * cols;
    float ss = 0.f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        float v = __bfloat162float(xr[i]);
        if (!init) v += hr[i];
        hr[i] = v;
        ss += v * v;
    }
    const float s = rsqrtf(sm_block_sum(ss) / cols + eps);
    bf16 *yr = y + r * cols;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float xh = hr[i] * s;
        yr[i] = __float2bfloat16(zc ? xh * (1.0f + w[i]) : w[i] * xh);
    }
}

/* The same op with every load of a thread in flight at once: thread i owns columns
 * [8i, 8i + 8) of its row (one 16-byte x load, two of h, two of w, issued before any is
 * used), so a row costs one memory round trip, not one per 8 columns as the loop above
 * (whose loads wait for the previous iteration's store: x may alias y). blockDim = cols / 8
 * (cols % 8 == 0, <= 8192), 16-byte aligned rows. The same fp32 math and rounding. */
__global__ void sm_add_rmsnorm8_kernel(int cols, float *__restrict__ h, const bf16 *x, int init,
                                       const float *__restrict__ w, int zc, float eps, bf16 *y) {
    cu_pdl_trigger();
    const size_t r = blockIdx.x;
    const int c0 = threadIdx.x * 8;
    const bool on = c0 < cols;
    float4 *h4 = reinterpret_cast<float4 *>(h + r * cols + c0);
    const float4 *w4 = reinterpret_cast<const float4 *>(w + c0);
    float4 wa = make_float4(0.f, 0.f, 0.f, 0.f), wb = wa, ha = wa, hb = wa;
    if (on) wa = __ldg(w4), wb = __ldg(w4 + 1); /* weights: constants, before the wait */
    cu_pdl_wait();
    uint4 xv = make_uint4(0u, 0u, 0u, 0u);
    if (on) {
        xv = *reinterpret_cast<const uint4 *>(x + r * cols + c0);
        if (!init) ha = h4[0], hb = h4[1];
    }
    const uint32_t xw[4] = {xv.x, xv.y, xv.z, xv.w};
    float v[8] = {ha.x, ha.y, ha.z, ha.w, hb.x, hb.y, hb.z, hb.w};
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const __nv_bfloat162 p = *reinterpret_cast<const __nv_bfloat162 *>(&xw[j]);
        const float lo = __low2float(p), hi = __high2float(p);
        v[2 * j] = init ? lo : lo + v[2 * j];
        v[2 * j + 1] = init ? hi : hi + v[2 * j + 1];
    }
#pragma unroll
    for (int j = 0; j < 8; j++) ss += v[j] * v[j];
    if (on) {
        h4[0] = make_float4(v[0], v[1], v[2], v[3]);
        h4[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
    const float sc = rsqrtf(sm_block_sum(ss) / cols + eps);
    if (!on) return;
    const float wv[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
    uint32_t o[4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        const float a = v[2 * j] * sc, b = v[2 * j + 1] * sc;
        const __nv_bfloat162 p = __floats2bfloat162_rn(zc ? a * (1.0f + wv[2 * j]) : wv[2 * j] * a,
                                                       zc ? b * (1.0f + wv[2 * j + 1]) : wv[2 * j + 1] * b);
        o[j] = *reinterpret_cast<const uint32_t *>(&p);
    }
    *reinterpret_cast<uint4 *>(y + r * cols + c0) = make_uint4(o[0], o[1], o[2], o[3]);
}

/* LASTSTAND_SMALL_ADDNORM=0|1: add_rmsnorm by sm_add_rmsnorm8_kernel where it applies
 * (SM_ADDNORM_DEFAULT: on since H200 device round R2 of 2026-11-29: 6.29 -> 2.56 µs a call
 * under ncu, 40-layer synth 35B decode step 2.842 -> 2.531 ms, test_small_cuda against the
 * host, same greedy tokens graphs / eager). Read once. */
#define SM_ADDNORM_DEFAULT 1
static int sm_addnorm8(void) {
    static int v = -1;
    if (v < 0) v = cu_env_switch("LASTSTAND_SMALL_ADDNORM", SM_ADDNORM_DEFAULT);
    return v;
}

static int c_add_rmsnorm(int rows, int cols, float *h, const void *x, int init, const float *w, rms_kind kind,
                         float eps, void *y, act_dtype dt, ls_stream s) {
    if (dt != ACT_BF16) return ERR_UNSUPPORTED;
    if (rows <= 0) return 0;
    if (sm_addnorm8() && cols % 8 == 0 && cols <= 8192 && !(((uintptr_t)h | (uintptr_t)x | (uintptr_t)w | (uintptr_t)y) & 15))
        return sm_launch(sm_add_rmsnorm8_kernel, dim3(rows), dim3(((cols / 8 + 31) / 32) * 32), 0, s, cols, h,
                         (const bf16 *)x, init, w, (int)(kind == RMS_ZC), eps, (bf16 *)y);
    return sm_launch(sm_add_rmsnorm_kernel, dim3(rows), dim3(threads_for(cols)), 0, s, cols, h, (const bf16 *)x,
                     init, w, (int)(kind == RMS_ZC), eps, (bf16 *)y);
}

/* ---- RoPE ------------------------------------------------------------------- */

/* One block per token; threads over (head, i < rot_dim/2). */
__global__ void sm_rope_kernel(int n_heads, int head_dim, int rot_dim, const int32_t *__restrict__ pos,
                               double theta, bf16 *x) {
    cu_pdl_trigger();
    cu_pdl_wait();
    const int t = blockIdx.x, half = rot_dim / 2;
    const float p = (float)pos[t];
    for (int j = threadIdx.x; j < n_heads * half; j += blockDim.x) {
        const int h = j / half, i = j % half;
        const float inv = (float)(1.0 / pow(theta, (double)(2 * i) / rot_dim));
        const float ang = p * inv, c = cosf(ang), sn = sinf(ang);
        bf16 *v = x + ((size_t)t * n_heads + h) * head_dim;
        const float a = __bfloat162float(v[i]), b = __bfloat162float(v[i + half]);
        v[i] = __float2bfloat16(a * c - b * sn);
        v[i + half] = __float2bfloat16(b * c + a * sn);
    }
}

static int c_rope(int n_tok, int n_heads, int head_dim, int rot_dim, const int32_t *pos, double theta,
                  void *x, act_dtype dt, ls_stream s) {
    if (dt != ACT_BF16) return ERR_UNSUPPORTED;
    if (n_tok <= 0 || rot_dim < 2) return 0;
    return sm_launch(sm_rope_kernel, dim3(n_tok), dim3(threads_for(n_heads * rot_dim / 2)), 0, s, n_heads, head_dim,
                     rot_dim, pos, theta, (bf16 *)x);
}

/* q/k head norm + RoPE: one block per (token, head) row, the normed row in shared
 * memory (fp32) so each rotated pair reads both halves; written to BF16 once. */
__global__ void sm_qk_norm_rope_kernel(int n_heads, int head_dim, const float *__restrict__ w, int zc, float eps,
                                       int rot_dim, const int32_t *__restrict__ pos, double theta, bf16 *x) {
    cu_pdl_trigger();
    cu_pdl_wait();
    extern __shared__ float row[];
    const size_t r = blockIdx.x;
    bf16 *xr = x + r * head_dim;
    float ss = 0.f;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        const float v = __bfloat162float(xr[i]);
        row[i] = v;
        ss += v * v;
    }
    const float s = rsqrtf(sm_block_sum(ss) / head_dim + eps); /* its barriers order row[] too */
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        const float xh = row[i] * s;
        row[i] = zc ? xh * (1.0f + w[i]) : w[i] * xh;
    }
    __syncthreads();
    const int half = rot_dim / 2;
    const float p = (float)pos[r / n_heads];
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        float o = row[i];
        if (i < rot_dim) {
            const int j = i < half ? i : i - half;
            const float inv = (float)(1.0 / pow(theta, (double)(2 * j) / rot_dim));
            const float ang = p * inv, c = cosf(ang), sn = sinf(ang);
            o = i < half ? row[i] * c - row[i + half] * sn : row[i] * c + row[i - half] * sn;
        }
        xr[i] = __float2bfloat16(o);
    }
}

template <int F>
static int c_qk_norm_rope(int n_tok, int n_heads, int head_dim, void *x, const float *w, rms_kind kind, float eps,
                          int rot_dim, const int32_t *pos, double theta, act_dtype dt, ls_stream s) {
    if (dt != ACT_BF16 || head_dim > 8192 || rot_dim > head_dim) return ERR_UNSUPPORTED;
    if (n_tok <= 0 || n_heads <= 0) return 0;
    if (rot_dim < 2) rot_dim = 0;
    const int f = sm_form(F, (long long)n_tok * n_heads);
    if (f && sr_j(head_dim))
        return sp_qk<uint16_t>(n_tok, n_heads, 0, head_dim, w, nullptr, (int)(kind == RMS_ZC), eps, rot_dim, pos,
                               theta, x, nullptr, nullptr, nullptr, 0, 1, 0, (uint16_t *)nullptr,
                               (uint16_t *)nullptr, s);
    return sm_launch(sm_qk_norm_rope_kernel, dim3(n_tok * n_heads), dim3(threads_for(head_dim)),
                     sizeof(float) * head_dim, s, n_heads, head_dim, w, (int)(kind == RMS_ZC), eps, rot_dim, pos,
                     theta, (bf16 *)x);
}

/* q and k head norm + RoPE and the KV write in one launch (small_ops.qk_norm_rope_kv):
 * blocks [0, n_tok·nh) are the q rows of sm_qk_norm_rope_kernel; block n_tok·nh + t·nkv + h
 * does k row (t, h) the same way, then stores that rounded row and v row (t, h) in the
 * token's KV page slot, as sm_kv_write_kernel (a token outside every sequence, or a bad
 * page, is not stored). The token's sequence is found by a scan of seqs (n_seq entries). */
template <typename T>
__global__ void sm_qk_norm_rope_kv_kernel(int n_tok, int nh, int nkv, int head_dim, const float *__restrict__ qw,
                                          const float *__restrict__ kw, int zc, float eps, int rot_dim,
                                          const int32_t *__restrict__ pos, double theta, bf16 *q, bf16 *k,
                                          const bf16 *__restrict__ v, const attn_seq *__restrict__ seqs, int n_seq,
                                          int page_size, int n_pages, T *kp, T *vp) {
    cu_pdl_trigger();
    cu_pdl_wait();
    extern __shared__ float row[];
    __shared__ long long dst_sh;
    const int b = blockIdx.x, isk = b >= n_tok * nh;
    const int rr = isk ? b - n_tok * nh : b, hh = isk ? nkv : nh, t = rr / hh;
    bf16 *xr = (isk ? k : q) + (size_t)rr * head_dim;
    const float *w = isk ? kw : qw;
    if (isk && threadIdx.x == 0) { /* the token's KV slot: row index of the pool, -1 for none */
        long long d = -1;
        for (int i = 0; i < n_seq; i++) {
            const attn_seq sq = seqs[i];
            if (t >= sq.row0 && t < sq.row0 + sq.n_new) {
                const int p = sq.n_past + t - sq.row0;
                const int32_t page = sq.pages[p / page_size];
                if (page >= 0 && page < n_pages) d = (long long)page * page_size + p % page_size;
                break;
            }
        }
        dst_sh = d;
    }
    float ss = 0.f;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        const float x = __bfloat162float(xr[i]);
        row[i] = x;
        ss += x * x;
    }
    const float s = rsqrtf(sm_block_sum(ss) / head_dim + eps); /* its barriers order row[] and dst_sh */
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        const float xh = row[i] * s;
        row[i] = zc ? xh * (1.0f + w[i]) : w[i] * xh;
    }
    __syncthreads();
    const int half = rot_dim / 2;
    const float p = (float)pos[t];
    const long long d = isk ? dst_sh : -1;
    const size_t kvo = (size_t)d * nkv * head_dim + (size_t)(rr % nkv) * head_dim;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        float o = row[i];
        if (i < rot_dim) {
            const int j = i < half ? i : i - half;
            const float inv = (float)(1.0 / pow(theta, (double)(2 * j) / rot_dim));
            const float ang = p * inv, c = cosf(ang), sn = sinf(ang);
            o = i < half ? row[i] * c - row[i + half] * sn : row[i] * c + row[i - half] * sn;
        }
        const bf16 ob = __float2bfloat16(o);
        xr[i] = ob;
        if (d >= 0) {
            const bf16 vb = v[(size_t)rr * head_dim + i];
            if (sizeof(T) == 2) {
                ((bf16 *)kp)[kvo + i] = ob;
                ((bf16 *)vp)[kvo + i] = vb;
            } else {
                ((float *)kp)[kvo + i] = __bfloat162float(ob);
                ((float *)vp)[kvo + i] = __bfloat162float(vb);
            }
        }
    }
}

static int c_kv_write(const kv_layer *kv, int n_seq, const attn_seq *seqs, int n_kv_heads, int head_dim,
                      const void *k, const void *v, act_dtype dt, ls_stream s);

/* LASTSTAND_SMALL_QKV=0|1: qk_norm_rope_kv as the three ops' launches / as one launch
 * (SM_QKV_DEFAULT; on since H200 device round R1: 4.10 + 3.87 + 2.88 -> 4.99 µs under ncu,
 * bitwise the same results, test_small_cuda). Read once. */
#define SM_QKV_DEFAULT 1
static int sm_qkv_fused(void) {
    static int v = -1;
    if (v < 0) v = cu_env_switch("LASTSTAND_SMALL_QKV", SM_QKV_DEFAULT);
    return v;
}

template <int F>
static int c_qk_norm_rope_kv(int n_tok, int n_heads, int n_kv_heads, int head_dim, void *q, void *k, const void *v,
                             const float *qw, const float *kw, rms_kind kind, float eps, int rot_dim,
                             const int32_t *pos, double theta, const kv_layer *kv, int n_seq, const attn_seq *seqs,
                             act_dtype dt, ls_stream s) {
    if (dt != ACT_BF16 || head_dim > 8192 || rot_dim > head_dim) return ERR_UNSUPPORTED;
    if (n_tok <= 0) return 0;
    if (!sm_qkv_fused()) {
        int rc;
        if ((rc = c_qk_norm_rope<F>(n_tok, n_heads, head_dim, q, qw, kind, eps, rot_dim, pos, theta, dt, s)) ||
            (rc = c_qk_norm_rope<F>(n_tok, n_kv_heads, head_dim, k, kw, kind, eps, rot_dim, pos, theta, dt, s)))
            return rc;
        return c_kv_write(kv, n_seq, seqs, n_kv_heads, head_dim, k, v, dt, s);
    }
    if (rot_dim < 2) rot_dim = 0;
    const dim3 grid(n_tok * (n_heads + n_kv_heads)), block(threads_for(head_dim));
    const size_t smem = sizeof(float) * head_dim;
    const int zc = kind == RMS_ZC;
    const int f = sm_form(F, (long long)n_tok * (n_heads + n_kv_heads));
    if (f && sr_j(head_dim)) {
        if (kv->dt == ACT_BF16)
            return sp_qk<uint16_t>(n_tok, n_heads, n_kv_heads, head_dim, qw, kw, zc, eps, rot_dim, pos, theta, q, k, v,
                                   seqs, n_seq, kv->page_size, kv->n_pages, (uint16_t *)kv->k, (uint16_t *)kv->v, s);
        return sp_qk<float>(n_tok, n_heads, n_kv_heads, head_dim, qw, kw, zc, eps, rot_dim, pos, theta, q, k, v, seqs,
                            n_seq, kv->page_size, kv->n_pages, (float *)kv->k, (float *)kv->v, s);
    }
    if (kv->dt == ACT_BF16)
        return sm_launch(sm_qk_norm_rope_kv_kernel<uint16_t>, grid, block, smem, s, n_tok, n_heads, n_kv_heads,
                         head_dim, qw, kw, zc, eps, rot_dim, pos, theta, (bf16 *)q, (bf16 *)k, (const bf16 *)v, seqs,
                         n_seq, kv->page_size, kv->n_pages, (uint16_t *)kv->k, (uint16_t *)kv->v);
    return sm_launch(sm_qk_norm_rope_kv_kernel<float>, grid, block, smem, s, n_tok, n_heads, n_kv_heads, head_dim, qw,
                     kw, zc, eps, rot_dim, pos, theta, (bf16 *)q, (bf16 *)k, (const bf16 *)v, seqs, n_seq,
                     kv->page_size, kv->n_pages, (float *)kv->k, (float *)kv->v);
}

/* ---- embedding, elementwise --------------------------------------------------- */

/* kind: 0 F32, 1 BF16, 2 F16 table; ids validated by the caller. */
__global__ void sm_embed_kernel(int H, const int32_t *__restrict__ ids, const void *__restrict__ tab, int kind,
                                bf16 *__restrict__ y) {
    cu_pdl_trigger();
    const size_t row = (size_t)ids[blockIdx.x] * H;
    bf16 *yr = y + (size_t)blockIdx.x * H;
    for (int i = threadIdx.x; i < H; i += blockDim.x) {
        float v = kind == 1 ? __bfloat162float(((const bf16 *)tab)[row + i])
                : kind == 2 ? __half2float(((const __half *)tab)[row + i])
                            : ((const float *)tab)[row + i];
        yr[i] = __float2bfloat16(v);
    }
}

static int c_embed(int n, const int32_t *ids, const lin_w *table, void *y, act_dtype dt, ls_stream s) {
    if (dt != ACT_BF16 || table->kind == W_NVFP4) return ERR_UNSUPPORTED;
    if (n <= 0) return 0;
    int kind = table->kind == W_BF16 ? 1 : table->kind == W_F16 ? 2 : 0;
    sm_embed_kernel<<<n, threads_for(table->K), 0, (cudaStream_t)s>>>(table->K, ids, table->data, kind,
                                                                       (bf16 *)y);
    return launched();
}

__global__ void sm_silu_mul_kernel(int64_t n, const bf16 *g, const bf16 *__restrict__ u, bf16 *y) {
    cu_pdl_trigger();
    cu_pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16(sm_silu(__bfloat162float(g[i])) * __bfloat162float(u[i]));
}

__global__ void sm_add_kernel(int64_t n, const bf16 *__restrict__ x, bf16 *y) {
    cu_pdl_trigger();
    cu_pdl_wait();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16(__bfloat162float(y[i]) + __bfloat162float(x[i]));
}

static unsigned grid_for(int64_t n) {
    int64_t b = (n + SM_THREADS - 1) / SM_THREADS;
    return (unsigned)(b < 65535 ? (b > 0 ? b : 1) : 65535);
}

static int c_silu_mul(int64_t n, const void *g, const void *u, void *y, act_dtype dt, ls_stream s) {
    if (dt != ACT_BF16) return ERR_UNSUPPORTED;
    if (n <= 0) return 0;
    return sm_launch(sm_silu_mul_kernel, dim3(grid_for(n)), dim3(SM_THREADS), 0, s, n, (const bf16 *)g,
                     (const bf16 *)u, (bf16 *)y);
}

static int c_add(int64_t n, const void *x, void *y, act_dtype dt, ls_stream s) {
    if (dt != ACT_BF16) return ERR_UNSUPPORTED;
    if (n <= 0) return 0;
    return sm_launch(sm_add_kernel, dim3(grid_for(n)), dim3(SM_THREADS), 0, s, n, (const bf16 *)x, (bf16 *)y);
}

/* ---- KV writes, row gather ----------------------------------------------------- */

/* grid (n_seq, KV_SPLIT): block (s, j) writes tokens j, j + KV_SPLIT, ... of
 * sequence s. Pages were checked on the host (check_batch); a bad one is skipped. */
enum { KV_SPLIT = 32 };
template <typename T>
__global__ void sm_kv_write_kernel(const attn_seq *__restrict__ seqs, int page_size, int n_pages, int row,
                                   const bf16 *__restrict__ k, const bf16 *__restrict__ v, T *kp, T *vp) {
    cu_pdl_wait(); /* (no early trigger, as before the PDL switch) */
    const attn_seq sq = seqs[blockIdx.x];
    for (int i = blockIdx.y; i < sq.n_new; i += gridDim.y) {
        const int p = sq.n_past + i;
        const int32_t page = sq.pages[p / page_size];
        if (page < 0 || page >= n_pages) continue;
        const size_t dst = ((size_t)page * page_size + p % page_size) * row;
        const size_t src = (size_t)(sq.row0 + i) * row;
        for (int c = threadIdx.x; c < row; c += blockDim.x) {
            if (sizeof(T) == 2) {
                ((bf16 *)kp)[dst + c] = k[src + c];
                ((bf16 *)vp)[dst + c] = v[src + c];
            } else {
                ((float *)kp)[dst + c] = __bfloat162float(k[src + c]);
                ((float *)vp)[dst + c] = __bfloat162float(v[src + c]);
            }
        }
    }
}

static int c_kv_write(const kv_layer *kv, int n_seq, const attn_seq *seqs, int n_kv_heads, int head_dim,
                      const void *k, const void *v, act_dtype dt, ls_stream s) {
    if (dt != ACT_BF16) return ERR_UNSUPPORTED;
    if (n_seq <= 0) return 0;
    const int row = n_kv_heads * head_dim;
    dim3 grid(n_seq, KV_SPLIT);
    if (kv->dt == ACT_BF16)
        return sm_launch(sm_kv_write_kernel<uint16_t>, grid, dim3(threads_for(row)), 0, s, seqs, kv->page_size,
                         kv->n_pages, row, (const bf16 *)k, (const bf16 *)v, (uint16_t *)kv->k, (uint16_t *)kv->v);
    return sm_launch(sm_kv_write_kernel<float>, grid, dim3(threads_for(row)), 0, s, seqs, kv->page_size, kv->n_pages,
                     row, (const bf16 *)k, (const bf16 *)v, (float *)kv->k, (float *)kv->v);
}

__global__ void sm_gather_kernel(int cols, const int32_t *__restrict__ idx, const bf16 *__restrict__ x,
                                 bf16 *__restrict__ y) {
    cu_pdl_wait();
    const bf16 *xr = x + (size_t)idx[blockIdx.x] * cols;
    bf16 *yr = y + (size_t)blockIdx.x * cols;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) yr[i] = xr[i];
}

static int c_gather_rows(int n, int cols, const int32_t *idx, const void *x, void *y, act_dtype dt,
                         ls_stream s) {
    if (dt != ACT_BF16) return ERR_UNSUPPORTED;
    if (n <= 0) return 0;
    return sm_launch(sm_gather_kernel, dim3(n), dim3(threads_for(cols)), 0, s, cols, idx, (const bf16 *)x,
                     (bf16 *)y);
}

extern "C" const small_ops small_cuda = {
    "cuda",          DEV_CUDA,   0,     c_rmsnorm<-1>,  c_rmsnorm_gated<-1>, c_rope, c_embed,
    c_silu_mul,      c_add,      c_kv_write, c_gather_rows, c_add_rmsnorm, 1, c_qk_norm_rope<-1>,
    c_qk_norm_rope_kv<-1>};
extern "C" const small_ops small_cuda_block = {
    "cuda_block",    DEV_CUDA,   1,     c_rmsnorm<0>,  c_rmsnorm_gated<0>, c_rope, c_embed,
    c_silu_mul,      c_add,      c_kv_write, c_gather_rows, c_add_rmsnorm, 1, c_qk_norm_rope<0>,
    c_qk_norm_rope_kv<0>};
extern "C" const small_ops small_cuda_rows = {
    "cuda_rows",     DEV_CUDA,   1,     c_rmsnorm<1>,  c_rmsnorm_gated<1>, c_rope, c_embed,
    c_silu_mul,      c_add,      c_kv_write, c_gather_rows, c_add_rmsnorm, 1, c_qk_norm_rope<1>,
    c_qk_norm_rope_kv<1>};
