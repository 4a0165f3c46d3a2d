/* gdn_decode.cu: the gdn backend cuda_decode (Gated DeltaNet, reference/qwen35-and-nvfp4.md
 * 2.4), built for decode steps (a few new tokens per sequence): one launch that does the
 * causal conv + SiLU, the L2 norms, g and β and the delta rule, with each head's state split
 * over warps so that one sequence fills the GPU. Same contract as gdn.cu's cuda_recurrent
 * (ops.h gdn_args): qkv [n_tok, conv_dim] pre-conv, a and b [n_tok, nv], BF16; per-slot fp32
 * states conv [n_slots, conv_dim, conv_k − 1] (oldest first) and rec S [n_slots, nv, dk, dv],
 * read and updated in place; out [n_tok, nv, dv] = Sᵀq per token, BF16.
 *
 * Work split: a warp owns 16 value columns [16·cs, 16·cs + 16) of one v head j of one
 * sequence, i.e. S[:, cols] (dk × 16 fp32), in registers for the whole call: lane = (rg, cg)
 * with cg = lane & 3 picking 4 adjacent columns (one 16-byte load per row) and rg = lane >> 2
 * picking dk / 8 consecutive rows, so a warp-wide load covers 8 rows × 64 contiguous bytes
 * (dk = 128: 64 registers of S per lane, 512 warps for one sequence of Qwen3.5-397B).
 * The tokens go in groups of GD_TB (4). Phase A, for the whole group: every raw input of the
 * group is loaded first, so no load waits for another (in R2 a load -> use chain per channel
 * cost one L2 round trip per channel, ~3 µs per token; the conv weights are loaded once, next to
 * S), then the conv of the k head's q and k channels (dk / 32 of each per lane) and of the
 * warp's own 16 v channels from the conv windows kept in registers (SiLU output, to shared
 * memory), the heads' sums of squares and k·q (warp shuffles, the group's side by side),
 * g = −exp(A_log)·softplus(a + dt_bias) and β = sigmoid(b). Phase B, token by token, with
 * q = q_raw·rq (rq = dk^-0.5 / ‖q_raw‖), k = k_raw·rk and the old S:
 *       m = Sᵀk,  p = Sᵀq  (on the raw q, k, partial over the lane's rows, 3 shuffles over rg,
 *                           then scaled by rk, rq),
 *       δ = β (v − e^g m),  o = e^g p + (k·q) δ,  S ← e^g S + k_raw (rk δ)ᵀ,
 *     which is S ← e^g S; δ = β(v − Sᵀk); S ← S + kδᵀ; o = Sᵀq of the reference rearranged
 *     so that one pass over S gives both products (the same fp32 math up to rounding order).
 * No block-wide barrier in the token loop: a warp shares nothing with the others but its k
 * head's q/k conv state, which every warp of the k head reads (the conv is recomputed by
 * each, a few FMAs). So that no warp reads it after it has been rolled, the blocks of one k
 * head form a thread block cluster (sm_90): after the token loop the cluster barrier, then
 * warp 0 of the cluster's first block writes the new q/k window; each warp writes its own v
 * channels' window and S slice. Block = NW warps of one v head, cluster = the ratio·dv/16/NW
 * blocks of one k head (at most 8, NW chosen for that), grid (nk · cluster, n_seq); where that grid
 * needs more than one wave (decode steps of more than ~4 sequences), blocks of 8 warps instead
 * (gd_nw_knob, LASTSTAND_GDN_NW).
 * A sequence's tokens run one after the other in phase B, so long prompts are cuda_chunked's
 * job: a call in which some sequence brings more than 64 new tokens (LASTSTAND_GDN_DECODE_MAX_NEW,
 * 0 = never) is handed to gdn_cuda_chunked whole, so that serve, which takes one backend per
 * family (the doctor's pick at M = 1), gets the chunked form for prefill.
 *
 * Decode steps (every sequence one token; LASTSTAND_GDN_T1=1, opt-in) may run gd_kernel1: the same
 * body with one token a group and at most 128 registers a thread (a few spilled), so that its
 * 2-warp blocks fit beside the two blocks an SM of the in-projection GEMV before it and, launched
 * early, load their state while it runs (see gd_kernel1); LASTSTAND_GDN_T1=2 only where gd_kernel
 * (255 registers, 8 warps an SM) would need more than one wave: batches of more than ~4
 * sequences (see gd_t1).
 *
 * Wide decode steps run gd_kernel_p instead (LASTSTAND_GDN_STREAM, see gd_stream): persistent
 * blocks walking (sequence, k head) units, the states of their next v heads in flight in shared
 * memory (bulk copies), so that every SM streams reads and writes at once (its forms: gp_cfg);
 * gd_kernel_s is the same per token math with a v head a block (see both). The arithmetic is
 * gd_kernel's in the same order, so the same bits whichever form runs a sequence.
 *
 * Programmatic dependent launch (cu_pdl.h): launched with the programmatic-stream-serialization
 * attribute (LASTSTAND_GDN_PDL=0|1, GD_PDL_DEFAULT), the kernel loads the sequence table, its S slice,
 * the conv windows and weights, then waits (griddepcontrol.wait) for the projection before it
 * reads qkv, a and b: the state loads overlap that kernel's tail and the launch.
 * Sequence metadata: the kernel reads the device array args->seqs ({slot, n_new, row0} int32
 * triples); seqs_host is validated. No workspace, no host sync: capture-safe.
 * A BF16 state (gdn_state.rec16, --mamba-ssm-dtype bfloat16): the kernels are templated on the
 * state's storage type ST (gd_ld4 / gd_st4: four values a load, rounded to nearest even on the
 * store); gd_kernel and gd_kernel1 load S into registers and store it once, gd_kernel_p brings
 * it into shared memory as BF16 bulk copies (half the bytes) and stores the one token's update;
 * gd_kernel_s, which runs several tokens on S in shared memory, keeps to fp32 (such calls take
 * gd_kernel). The fp32 instances compile to the same PTX as before the template.
 * Supported: sm_90+, BF16 activations, dk 32/64/128, dv a multiple of 16, conv_k 4.
 *
 * The gated output norm, fused (gdn_args.z set, dv <= 256; LASTSTAND_GDN_NORM=0 turns it off): out gets
 * y = (w · rmsnorm(o_j)) · silu(z_j) per v head j, small_ops.rmsnorm_gated's result bit for
 * bit, instead of o (and *norm_done = 1), so that the layer needs no separate norm launch. A v
 * head's dv columns live in the dv / 16 warps of dv / 16 / NW consecutive blocks of its
 * cluster: every lane stores its column's BF16-rounded o (a float) into the shared memory of
 * every block of its head (distributed shared memory, st.shared::cluster), [2 groups][GD_TB
 * tokens][dv], after each token group one cluster barrier, then each warp sums the squares of
 * its head's dv values in the order of sm_rmsnorm_kernel's block sum (one warp's xor tree per
 * 32 columns, then a tree over those partials: the same fp32 adds, so the same bits) and
 * scales its own 16 columns; z and w are loaded with the group's inputs (w before the wait).
 * The group buffers alternate, so the next group's stores cannot meet a warp still reading:
 * a warp reaches the next barrier only after it read its group. A cluster barrier at the
 * start (arrive at entry, wait before the first remote store) makes sure every block of the
 * cluster runs before its shared memory is written; the group barriers also order every warp's
 * reads of the old q/k window before its rewrite, so the fused kernel has no barrier at its end
 * (but for T = 0, where the entry's arrive meets its wait there).
 */
#include "ops/cuda/cu_util.h"
#include "ops/cuda/gdn_cu.h"
#include "ops/cuda/cu_pdl.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { GD_K = 4, GD_MAX_NW = 8, GD_MAX_CLUSTER = 8, GD_WC = 16 /* value columns per warp */, GD_TB = 4 /* tokens per group */,
       GD_CHUNK_LIMIT = 64 /* longer prompt chunks: cuda_chunked */ };

/* floats per token in a warp's shared buffer: q [dk], k [dk] (conv outputs), v [GD_WC] */
#define GD_TOK(DK) (2 * (DK) + GD_WC)

static_assert(sizeof(gdn_seq) == 3 * sizeof(int32_t) && offsetof(gdn_seq, slot) == 0 &&
                  offsetof(gdn_seq, n_new) == 4 && offsetof(gdn_seq, row0) == 8,
              "gdn_seq must be {int32 slot, n_new, row0}: the kernel reads it as int32 triples");

__device__ __forceinline__ float gd_bf(const bf16 *p, size_t i) { return __bfloat162float(p[i]); }
/* {slot, n_new, row0} of a sequence in one asm statement of volatile loads: all three leave
 * together at the top (left to itself the compiler sinks row0's load into the token loop, a
 * second round trip before the first input load). */
__device__ __forceinline__ void gd_ld_seq(const int32_t *p, int &slot, int &n, int &row0) {
    asm volatile("ld.volatile.global.b32 %0, [%3];\n\t"
                 "ld.volatile.global.b32 %1, [%3+4];\n\t"
                 "ld.volatile.global.b32 %2, [%3+8];"
                 : "=r"(slot), "=r"(n), "=r"(row0)
                 : "l"(p));
}

__device__ __forceinline__ void gd_prefetch_l1(const void *p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }

/* x·sigmoid(x) and sigmoid(x) by the fast division: no slow-path call in the straight-line code
 * (a denominator of +inf, x < −88, gives 0, as the exact form) */
__device__ __forceinline__ float gd_silu(float x) { return __fdividef(x, 1.f + expf(-x)); }
__device__ __forceinline__ float gd_sigmoid(float x) { return __fdividef(1.f, 1.f + expf(-x)); }

/* c = silu(Σ_i w[i]·win[i] + w[K−1]·x) over the window (oldest first), then the window slides. */
__device__ __forceinline__ float gd_conv(const float4 w, float win[GD_K - 1], float x) {
    float acc = w.x * win[0];
    acc = fmaf(w.y, win[1], acc);
    acc = fmaf(w.z, win[2], acc);
    acc = fmaf(w.w, x, acc);
    win[0] = win[1];
    win[1] = win[2];
    win[2] = x;
    return gd_silu(acc);
}

/* The prologue every form shares. A channel's conv window (K − 1 fp32, oldest first) in the
 * per-slot conv state [n_slots, D, K − 1]: */
__device__ __forceinline__ float *gd_win(float *conv_st, int slot, int D, int ch) {
    return conv_st + ((size_t)slot * D + ch) * (GD_K - 1);
}

/* the windows and conv weights of the lane's CH q channels from qch and CH k channels from kch */
template <int CH>
__device__ __forceinline__ void gd_ld_qk(float *conv_st, const float *__restrict__ conv_w, int slot, int D, int qch,
                                         int kch, float wq[CH][GD_K - 1], float wk[CH][GD_K - 1], float4 cwq[CH],
                                         float4 cwk[CH]) {
    const float *stq = gd_win(conv_st, slot, D, qch), *stk = gd_win(conv_st, slot, D, kch);
#pragma unroll
    for (int c = 0; c < CH; c++)
#pragma unroll
        for (int i = 0; i < GD_K - 1; i++) {
            wq[c][i] = stq[c * (GD_K - 1) + i];
            wk[c][i] = stk[c * (GD_K - 1) + i];
        }
#pragma unroll
    for (int c = 0; c < CH; c++) {
        cwq[c] = __ldg(reinterpret_cast<const float4 *>(conv_w + (size_t)(qch + c) * GD_K));
        cwk[c] = __ldg(reinterpret_cast<const float4 *>(conv_w + (size_t)(kch + c) * GD_K));
    }
}

/* v channel vch of v head j: its window and conv weights, and the head's −exp(A_log) and dt_bias */
__device__ __forceinline__ void gd_ld_v(float *conv_st, const float *__restrict__ conv_w,
                                        const float *__restrict__ A_log, const float *__restrict__ dt_bias, int slot,
                                        int D, int vch, int j, float wv[GD_K - 1], float4 &cwv, float &al, float &db) {
    const float *stv = gd_win(conv_st, slot, D, vch);
#pragma unroll
    for (int i = 0; i < GD_K - 1; i++) wv[i] = stv[i];
    cwv = __ldg(reinterpret_cast<const float4 *>(conv_w + (size_t)vch * GD_K));
    al = -expf(A_log[j]);
    db = dt_bias[j];
}

/* the rolled q/k windows back to the conv state */
template <int CH>
__device__ __forceinline__ void gd_st_qk(float *conv_st, int slot, int D, int qch, int kch,
                                         const float wq[CH][GD_K - 1], const float wk[CH][GD_K - 1]) {
    float *q = gd_win(conv_st, slot, D, qch), *k = gd_win(conv_st, slot, D, kch);
#pragma unroll
    for (int c = 0; c < CH; c++)
#pragma unroll
        for (int i = 0; i < GD_K - 1; i++) {
            q[c * (GD_K - 1) + i] = wq[c][i];
            k[c * (GD_K - 1) + i] = wk[c][i];
        }
}

/* one token's conv of the lane's CH q and k channels (raw inputs xq, xk): the outputs to tq, tk
 * [DK] (channels lane·CH ..), the lane's partial sums of q·q, k·k and q·k added to ssq, ssk, sqk */
template <int CH>
__device__ __forceinline__ void gd_conv_qk(const float4 cwq[CH], const float4 cwk[CH], float wq[CH][GD_K - 1],
                                           float wk[CH][GD_K - 1], const float xq[CH], const float xk[CH], float *tq,
                                           float *tk, int lane, float &ssq, float &ssk, float &sqk) {
#pragma unroll
    for (int c = 0; c < CH; c++) {
        const float cq = gd_conv(cwq[c], wq[c], xq[c]);
        const float ck = gd_conv(cwk[c], wk[c], xk[c]);
        ssq = fmaf(cq, cq, ssq);
        ssk = fmaf(ck, ck, ssk);
        sqk = fmaf(cq, ck, sqk);
        tq[lane * CH + c] = cq;
        tk[lane * CH + c] = ck;
    }
}

/* one token's raw inputs of the lane's CH q channels from qch and CH k channels from kch (row r of qkv) */
template <int CH>
__device__ __forceinline__ void gd_ld_raw_qk(const bf16 *r, int qch, int kch, float xq[CH], float xk[CH]) {
#pragma unroll
    for (int c = 0; c < CH; c++) {
        xq[c] = __bfloat162float(r[qch + c]);
        xk[c] = __bfloat162float(r[kch + c]);
    }
}

/* the lanes' partial q·q, k·k and q·k summed over the warp (the streamed forms' one token) */
__device__ __forceinline__ void gd_sum3(float &ssq, float &ssk, float &sqk) {
#pragma unroll
    for (int o = 16; o; o >>= 1) {
        ssq += __shfl_xor_sync(0xffffffffu, ssq, o);
        ssk += __shfl_xor_sync(0xffffffffu, ssk, o);
        sqk += __shfl_xor_sync(0xffffffffu, sqk, o);
    }
}

/* The per-token scalar math that gd_body and gd_kernel_s (the streamed form) share, in one
 * place so that both compile it to the same instructions (same contractions, same bits):
 * e^g = exp(−exp(A_log)·softplus(a + dt_bias)) (torch's softplus threshold 20) and β = sigmoid(b) */
__device__ __forceinline__ void gd_gate_beta(float xa, float xb, float al, float db, float &decay, float &beta) {
    const float x = xa + db;
    decay = expf(al * (x > 20.f ? x : log1pf(expf(x))));
    beta = gd_sigmoid(xb);
}

/* one column: δ = β (v − e^g m rk), o = e^g p rq + (k·q) δ, and δ·rk (k enters the update raw) */
__device__ __forceinline__ void gd_delta(float beta, float v, float dg, float m, float p, float rk, float rq, float kq,
                                         float &o, float &dkc) {
    const float dl = beta * (v - dg * (m * rk));
    o = fmaf(dg, p * rq, kq * dl);
    dkc = dl * rk;
}

/* The state's row arithmetic, one row of a lane's 4 columns (x = S[row, col .. col + 3]), in one
 * place so that every form runs the same fmaf chains (gd_body, gs_token): the partial
 * sums m += S·k and p += S·q (kv = k[row], qv = q[row]), and S ← e^g S + k δᵀ (d: the columns' δ·rk) */
__device__ __forceinline__ void gd_mp4(float4 x, float kv, float qv, float m[4], float p[4]) {
    m[0] = fmaf(x.x, kv, m[0]);
    m[1] = fmaf(x.y, kv, m[1]);
    m[2] = fmaf(x.z, kv, m[2]);
    m[3] = fmaf(x.w, kv, m[3]);
    p[0] = fmaf(x.x, qv, p[0]);
    p[1] = fmaf(x.y, qv, p[1]);
    p[2] = fmaf(x.z, qv, p[2]);
    p[3] = fmaf(x.w, qv, p[3]);
}
__device__ __forceinline__ float4 gd_upd4(float4 x, float kv, const float d[4], float decay) {
    x.x = fmaf(kv, d[0], x.x * decay);
    x.y = fmaf(kv, d[1], x.y * decay);
    x.z = fmaf(kv, d[2], x.z * decay);
    x.w = fmaf(kv, d[3], x.w * decay);
    return x;
}
/* m, p summed over the lanes that differ in bits O0 .. 16 of the lane id (the row groups), the
 * lower bit first */
template <int O0>
__device__ __forceinline__ void gd_mp_sum(float m[4], float p[4]) {
#pragma unroll
    for (int o = O0; o <= 16; o <<= 1)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            m[c] += __shfl_xor_sync(0xffffffffu, m[c], o);
            p[c] += __shfl_xor_sync(0xffffffffu, p[c], o);
        }
}

/* 1/rms of a head's dv (<= 256) BF16-rounded outputs hv (shared memory), every lane of the warp
 * the same value, in sm_rmsnorm_kernel's order: thread e of its block (blockDim = dv rounded up
 * to 32) squares element e, sm_block_sum adds each warp's squares by an xor tree and the warps'
 * partials (lanes < dv / 32, zeros above) by another (here the up to 8 warps' trees side by side) */
__device__ __forceinline__ float gd_norm_scale(const float *hv, int dv, int lane, float eps) {
    float qw[8];
#pragma unroll
    for (int w0 = 0; w0 < 8; w0++) {
        const int e = w0 * 32 + lane;
        qw[w0] = 0.f;
        if (e < dv) {
            const float v = hv[e];
            qw[w0] += v * v;
        }
    }
#pragma unroll
    for (int o = 16; o; o >>= 1)
#pragma unroll
        for (int w0 = 0; w0 < 8; w0++)
            if (w0 * 32 < dv) qw[w0] += __shfl_xor_sync(0xffffffffu, qw[w0], o);
    float t = 0.f;
#pragma unroll
    for (int w0 = 0; w0 < 8; w0++)
        if (lane == w0 && w0 * 32 < dv) t = qw[w0];
    for (int o = 16; o; o >>= 1) t += __shfl_xor_sync(0xffffffffu, t, o);
    return rsqrtf(t / dv + eps);
}

/* y = w · x̂ · silu(z) (x̂ = o / rms) */
__device__ __forceinline__ float gd_gated(float w, float xh, float zz) { return w * xh * (zz / (1.0f + expf(-zz))); }

/* grid (nk · cl, n_seq), block NW · 32 threads, cluster (cl, 1, 1); dynamic shared memory
 * NW · TB · GD_TOK(DK) floats: per warp and token of a group of TB, the conv outputs q [DK],
 * k [DK] (before the norms) and v [GD_WC] (and the fused norm's [2][TB][dv]). The body of
 * gd_kernel (groups of GD_TB) and gd_kernel1 (TB = 1, see gd_t1). */
#define GD_ARGS_T(ST)                                                                                                  \
    int nk, int nv, int dv, int D, int cl, const int32_t *__restrict__ meta, const bf16 *__restrict__ qkv,            \
        const bf16 *__restrict__ a, const bf16 *__restrict__ b, const float *__restrict__ conv_w,                     \
        const float *__restrict__ A_log, const float *__restrict__ dt_bias,                                           \
        float *conv_st, /* read, then rolled: not restrict */                                                         \
        ST *__restrict__ rec, bf16 *__restrict__ out, const bf16 *__restrict__ z,                                     \
        const float *__restrict__ nrm_w, float nrm_eps
#define GD_ARGS GD_ARGS_T(ST)
/* Four consecutive state values (a 16-byte fp32 or 8-byte BF16 access) as fp32, and back (BF16:
 * rounded to nearest even): the state's storage type ST (gdn_state.rec or rec16) */
__device__ __forceinline__ float4 gd_ld4(const float *p) { return *reinterpret_cast<const float4 *>(p); }
__device__ __forceinline__ float4 gd_ld4(const bf16 *p) {
    const uint2 u = *reinterpret_cast<const uint2 *>(p);
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xffff0000u));
}
__device__ __forceinline__ void gd_st4(float *p, float4 v) { *reinterpret_cast<float4 *>(p) = v; }
__device__ __forceinline__ void gd_st4(bf16 *p, float4 v) {
    const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
    uint2 u;
    u.x = *reinterpret_cast<const uint32_t *>(&lo);
    u.y = *reinterpret_cast<const uint32_t *>(&hi);
    *reinterpret_cast<uint2 *>(p) = u;
}
template <int DK, int TB, class ST>
__device__ __forceinline__ void gd_body(GD_ARGS) {
    constexpr int K = GD_K, CH = DK / 32, RPL = DK / 8;
    extern __shared__ float4 gd_sh4[];
    cu_pdl_trigger(); /* programmatic dependent launch: see the header */
    const bool fuse = z != nullptr; /* the gated norm fused: see the header */
    if (fuse) asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory");
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, rg = lane >> 2, cg = lane & 3;
    const int s = blockIdx.y;
    int slot, T, row0;
    gd_ld_seq(meta + 3 * s, slot, T, row0);
    /* (no early exit for T = 0: the slot's S and windows go back unchanged; the three reads of
     *  the sequence table stay one round trip) */
    const int nsl = dv / GD_WC, gw = blockIdx.x * (blockDim.x >> 5) + warp;
    const int j = gw / nsl, cs = gw - j * nsl, kh = blockIdx.x / cl;
    const int col = cs * GD_WC + 4 * cg, vl = lane & (GD_WC - 1);

    /* S [DK, dv] of (slot, j): rows rg·RPL + n, columns col .. col + 3 */
    ST *__restrict__ Sg = rec + ((size_t)slot * nv + j) * DK * dv + col + (size_t)rg * RPL * dv;
    float4 S[RPL];
#pragma unroll
    for (int n = 0; n < RPL; n++) S[n] = gd_ld4(Sg + (size_t)n * dv);

    /* conv windows: q/k channels lane·CH .. + CH − 1 of head kh, v channel of column cs·GD_WC + vl
     * (lanes vl and vl + 16 both run it; the first one publishes it) */
    const int qch = kh * DK + lane * CH, kch = nk * DK + qch, vch = 2 * nk * DK + j * dv + cs * GD_WC + vl;
    float *stv = gd_win(conv_st, slot, D, vch);
    /* the windows and conv weights of the lane's channels, for all tokens */
    float wq[CH][K - 1], wk[CH][K - 1], wv[K - 1], al, db;
    float4 cwq[CH], cwk[CH], cwv;
    gd_ld_qk<CH>(conv_st, conv_w, slot, D, qch, kch, wq, wk, cwq, cwk);
    gd_ld_v(conv_st, conv_w, A_log, dt_bias, slot, D, vch, j, wv, cwv, al, db);
    const float qscale = rsqrtf((float)DK);
    /* the fused norm: lane (rg, cg) scales column hc of its head (every rg holds the warp's 4
     * column sums, so lanes rg and rg + 4 share one); nbh blocks per head, the first hb0 */
    const int nwb = blockDim.x >> 5, nbh = nsl / nwb, hb0 = blockIdx.x % cl - cs / nwb, hc = col + (rg & 3);
    const float gwn = fuse ? nrm_w[hc] : 0.f;
    float *const nbuf = reinterpret_cast<float *>(gd_sh4) + nwb * TB * GD_TOK(DK); /* [2][TB][dv] */
    int par = 0;
    /* everything above (the step's sequence table, this layer's states, the weights) was
     * written before the step's first kernel or by this layer in an earlier step; qkv, a and
     * b come from the projection right before: wait for it (no-op without the attribute) */
    cu_pdl_wait();
    /* the tokens in groups of TB: phase A runs the conv of the whole group (the loads of all its
     * tokens in flight together, the head sums reduced side by side), phase B the recurrence */
    float *gq = reinterpret_cast<float *>(gd_sh4) + warp * TB * GD_TOK(DK);
    for (int t0 = 0; t0 < T; t0 += TB) {
        const int nt = min(TB, T - t0);
        /* the group's raw inputs, every load issued before any is used (rows past the group's
         * end repeat its last row, so no load is guarded) */
        float xq[TB][CH], xk[TB][CH], xv[TB], xa[TB], xb[TB], xz[TB];
#pragma unroll
        for (int u = 0; u < TB; u++) {
            const size_t row = (size_t)(row0 + t0 + min(u, nt - 1));
            const bf16 *r = qkv + row * D;
            gd_ld_raw_qk<CH>(r, qch, kch, xq[u], xk[u]);
            xv[u] = __bfloat162float(r[vch]);
            xa[u] = gd_bf(a, row * nv + j);
            xb[u] = gd_bf(b, row * nv + j);
            xz[u] = fuse ? gd_bf(z, (row * nv + j) * dv + hc) : 0.f;
        }
        if (fuse && t0 == 0) asm volatile("barrier.cluster.wait;" ::: "memory"); /* every block of the cluster runs */
        float ssq[TB], ssk[TB], sqk[TB], decay[TB], beta[TB];
#pragma unroll
        for (int u = 0; u < TB; u++) {
            ssq[u] = ssk[u] = sqk[u] = 0.f;
            decay[u] = beta[u] = 0.f;
            if (u < nt) {
                float *tq = gq + u * GD_TOK(DK), *tk = tq + DK, *tv = tk + DK;
                gd_conv_qk<CH>(cwq, cwk, wq, wk, xq[u], xk[u], tq, tk, lane, ssq[u], ssk[u], sqk[u]);
                const float cv = gd_conv(cwv, wv, xv[u]);
                if (lane < GD_WC) tv[lane] = cv;
                gd_gate_beta(xa[u], xb[u], al, db, decay[u], beta[u]);
            }
        }
#pragma unroll
        for (int o = 16; o; o >>= 1)
#pragma unroll
            for (int u = 0; u < TB; u++) {
                ssq[u] += __shfl_xor_sync(0xffffffffu, ssq[u], o);
                ssk[u] += __shfl_xor_sync(0xffffffffu, ssk[u], o);
                sqk[u] += __shfl_xor_sync(0xffffffffu, sqk[u], o);
            }
        __syncwarp();
        if (t0 + TB < T) { /* the next group's inputs into L1 while this one runs (no registers) */
            const int nt2 = min(TB, T - t0 - TB);
#pragma unroll
            for (int u = 0; u < TB; u++) {
                const size_t row = (size_t)(row0 + t0 + TB + min(u, nt2 - 1));
                const bf16 *r = qkv + row * D;
                gd_prefetch_l1(r + qch);
                gd_prefetch_l1(r + kch);
                gd_prefetch_l1(r + vch);
                gd_prefetch_l1(a + row * nv + j);
                gd_prefetch_l1(b + row * nv + j);
            }
        }
#pragma unroll
        for (int u = 0; u < TB; u++) {
            if (u >= nt) break;
            const int row = row0 + t0 + u;
            /* q = q_raw·rq, k = k_raw·rk: the products are taken on the raw values and scaled */
            const float rq = rsqrtf(ssq[u] + 1e-6f) * qscale, rk = rsqrtf(ssk[u] + 1e-6f);
            const float kq = sqk[u] * rq * rk;
            const float *tq = gq + u * GD_TOK(DK), *tk = tq + DK, *tv = tk + DK;
            /* m = Sᵀk and p = Sᵀq for the lane's 4 columns, from the old S */
            float m[4] = {0.f, 0.f, 0.f, 0.f}, p[4] = {0.f, 0.f, 0.f, 0.f};
            const float4 *k4 = reinterpret_cast<const float4 *>(tk + rg * RPL);
            const float4 *q4 = reinterpret_cast<const float4 *>(tq + rg * RPL);
#pragma unroll
            for (int n4 = 0; n4 < RPL / 4; n4++) {
                const float4 kk = k4[n4], qq = q4[n4];
                const float kv[4] = {kk.x, kk.y, kk.z, kk.w}, qv[4] = {qq.x, qq.y, qq.z, qq.w};
#pragma unroll
                for (int e = 0; e < 4; e++) gd_mp4(S[4 * n4 + e], kv[e], qv[e], m, p);
            }
            gd_mp_sum<4>(m, p);
            const float dg = decay[u];
            float dk_[4], o4[4]; /* δ·rk (k enters the update raw), o */
#pragma unroll
            for (int c = 0; c < 4; c++) gd_delta(beta[u], tv[4 * cg + c], dg, m[c], p[c], rk, rq, kq, o4[c], dk_[c]);
            /* S ← e^g S + k δᵀ */
#pragma unroll
            for (int n4 = 0; n4 < RPL / 4; n4++) {
                const float4 kk = k4[n4];
                const float kv[4] = {kk.x, kk.y, kk.z, kk.w};
#pragma unroll
                for (int e = 0; e < 4; e++) S[4 * n4 + e] = gd_upd4(S[4 * n4 + e], kv[e], dk_, dg);
            }
            /* every rg holds the 4 columns' sums: lane (rg < 4, cg) writes column col + rg */
            const int r3 = rg & 3;
            const float ov = r3 == 0 ? o4[0] : r3 == 1 ? o4[1] : r3 == 2 ? o4[2] : o4[3];
            if (!fuse) {
                if (rg < 4) out[((size_t)row * nv + j) * dv + col + rg] = __float2bfloat16_rn(ov);
            } else { /* o rounded as the unfused op stores it, to every block of the head: lanes rg
                      * < 4 to blocks 0, 2, ..., lanes rg >= 4 to blocks 1, 3, ... */
                const float orr = __bfloat162float(__float2bfloat16_rn(ov));
                const uint32_t la = (uint32_t)__cvta_generic_to_shared(nbuf + (par * TB + u) * dv + hc);
                for (int hb = rg >> 2; hb < nbh; hb += 2) {
                    uint32_t ra;
                    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(la), "r"(hb0 + hb));
                    asm volatile("st.shared::cluster.f32 [%0], %1;" ::"r"(ra), "f"(orr) : "memory");
                }
            }
        }
        __syncwarp(); /* the group's buffers are rewritten by the next group */
        if (fuse) {
            asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;\n" ::: "memory");
#pragma unroll
            for (int u = 0; u < TB; u++) {
                if (u >= nt) break;
                const float *hv = nbuf + (par * TB + u) * dv;
                const float y = gd_gated(gwn, hv[hc] * gd_norm_scale(hv, dv, lane, nrm_eps), xz[u]);
                if (rg < 4) out[((size_t)(row0 + t0 + u) * nv + j) * dv + hc] = __float2bfloat16(y);
            }
            par ^= 1;
        }
    }
#pragma unroll
    for (int n = 0; n < RPL; n++) gd_st4(Sg + (size_t)n * dv, S[n]);
#pragma unroll
    for (int i = 0; i < K - 1; i++)
        if (lane < GD_WC) stv[i] = wv[i];
    /* every warp of the k head has read the old q/k window: the first one writes the new one.
     * Fused, with T > 0, the group barriers above already stand between those reads (group 0's
     * inputs) and this write, and no remote store follows the last one: no barrier here. With
     * T = 0 this is the wait of the entry's arrive. */
    if (fuse && T == 0) asm volatile("barrier.cluster.wait;" ::: "memory");
    if (!fuse) asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;\n" ::: "memory");
    if (blockIdx.x % cl == 0 && warp == 0) {
        gd_st_qk<CH>(conv_st, slot, D, qch, kch, wq, wk);
    }
}

template <int DK, class ST>
__global__ void __launch_bounds__(GD_MAX_NW * 32, 1) gd_kernel(GD_ARGS) {
    gd_body<DK, GD_TB, ST>(nk, nv, dv, D, cl, meta, qkv, a, b, conv_w, A_log, dt_bias, conv_st, rec, out, z, nrm_w, nrm_eps);
}

/* Decode steps of one token a sequence (gd_t1): one token a group, and at most GD_T1_REGS
 * registers a thread, so that a block of 2 warps (12 K registers) fits beside the two blocks
 * of the in-projection GEMV that runs before it (cuda_gemv, 100 registers x 256 threads each):
 * launched early (programmatic dependent launch), it loads its S slice, windows and weights
 * while the projection still runs, instead of after its blocks retire. */
#define GD_T1_REGS 128
template <int DK, class ST>
__global__ void __maxnreg__(GD_T1_REGS) gd_kernel1(GD_ARGS) {
    gd_body<DK, 1, ST>(nk, nv, dv, D, cl, meta, qkv, a, b, conv_w, A_log, dt_bias, conv_st, rec, out, z, nrm_w, nrm_eps);
}

/* S ← e^g S + k δᵀ over the DK / 8 rows from rr of the lane's 4 columns col .. col + 3 of a state
 * [DK][DK] in shared memory sS, back into sS, or (last) into the state in global memory Sg (a
 * quarter warp stores 128 contiguous bytes); tk: k [DK], dk_: the columns' δ·rk */
template <int DK, class ST, bool RELOAD = false>
__device__ __forceinline__ void gs_update_rows(ST *sS, ST *__restrict__ Sg, bool last, const float *tk, int rr,
                                               int col, const float dk_[4], float decay) {
    constexpr int RPL = DK / 8, DV = DK;
    const float4 *k4 = reinterpret_cast<const float4 *>(tk + rr);
    ST *Ss = sS + (size_t)rr * DV + col, *Sgl = Sg + (size_t)rr * DV + col;
#pragma unroll(RELOAD ? 1 : RPL / 4)
    for (int n4 = 0; n4 < RPL / 4; n4++) {
        const float4 kk = k4[n4];
        const float kv[4] = {kk.x, kk.y, kk.z, kk.w};
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const size_t off = (size_t)(4 * n4 + e) * DV;
            const float4 x = gd_upd4(gd_ld4(Ss + off), kv[e], dk_, decay);
            if (last)
                gd_st4(Sgl + off, x);
            else /* (gd_kernel_s only: ST is float there; a BF16 state never runs a token in shared memory) */
                gd_st4(Ss + off, x);
        }
    }
}

/* One token of one v head whose state S [DK][DK] (dk = dv) is in shared memory sS, for lane (r, cg)
 * of warp w (columns col = 32w + 4cg .. + 3, row groups r and r + 4: see gd_kernel_s): m = Sᵀk and
 * p = Sᵀq in gd_kernel's order, δ and o (gd_delta), then S ← e^g S + k δᵀ into sS, or (last) into
 * the state in global memory Sg [DK][DK]. tq, tk: the conv's q, k [DK]; tv: the warp's 32 v values.
 * Returns the lane's 4 columns' o (every r holds all 4). */
template <int DK, class ST, bool RELOAD = false>
__device__ __forceinline__ void gs_token(ST *sS, ST *__restrict__ Sg, bool last, const float *tq, const float *tk,
                                         const float *tv, float rq, float rk, float kq, float decay, float beta, int r,
                                         int cg, int col, float o4[4]) {
    constexpr int RPL = DK / 8, DV = DK;
    /* m = Sᵀk, p = Sᵀq over row groups r (A) and r + 4 (B), the lane's 4 columns */
    float mA[4] = {0.f, 0.f, 0.f, 0.f}, pA[4] = {0.f, 0.f, 0.f, 0.f};
    float mB[4] = {0.f, 0.f, 0.f, 0.f}, pB[4] = {0.f, 0.f, 0.f, 0.f};
    const ST *SA = sS + (size_t)r * RPL * DV + col, *SB = SA + (size_t)4 * RPL * DV;
    const float4 *kA = reinterpret_cast<const float4 *>(tk + r * RPL), *kB = kA + RPL;
    const float4 *qA = reinterpret_cast<const float4 *>(tq + r * RPL), *qB = qA + RPL;
#pragma unroll(RELOAD ? 1 : RPL / 4)
    for (int n4 = 0; n4 < RPL / 4; n4++) {
        const float4 ka = kA[n4], qa = qA[n4], kb = kB[n4], qb = qB[n4];
        const float kva[4] = {ka.x, ka.y, ka.z, ka.w}, qva[4] = {qa.x, qa.y, qa.z, qa.w};
        const float kvb[4] = {kb.x, kb.y, kb.z, kb.w}, qvb[4] = {qb.x, qb.y, qb.z, qb.w};
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float4 x = gd_ld4(SA + (size_t)(4 * n4 + e) * DV);
            const float4 y = gd_ld4(SB + (size_t)(4 * n4 + e) * DV);
            gd_mp4(x, kva[e], qva[e], mA, pA);
            gd_mp4(y, kvb[e], qvb[e], mB, pB);
        }
    }
#pragma unroll
    for (int o = 8; o <= 16; o <<= 1)
#pragma unroll
        for (int c = 0; c < 4; c++) {
            mA[c] += __shfl_xor_sync(0xffffffffu, mA[c], o);
            pA[c] += __shfl_xor_sync(0xffffffffu, pA[c], o);
            mB[c] += __shfl_xor_sync(0xffffffffu, mB[c], o);
            pB[c] += __shfl_xor_sync(0xffffffffu, pB[c], o);
        }
    float dk_[4];
#pragma unroll
    for (int c = 0; c < 4; c++) {
        const float m = mA[c] + mB[c], p = pA[c] + pB[c];
        gd_delta(beta, tv[4 * cg + c], decay, m, p, rk, rq, kq, o4[c], dk_[c]);
    }
    /* RELOAD: the update reads S from shared memory again instead of keeping the first pass's 32
     * rows in registers (fewer registers a thread, so more blocks an SM; the same values) */
    if constexpr (RELOAD) asm volatile("" ::: "memory");
    /* S ← e^g S + k δᵀ: to shared memory, the last token's to the state in global memory */
#pragma unroll
    for (int h = 0; h < 2; h++) gs_update_rows<DK, ST, RELOAD>(sS, Sg, last, tk, (r + 4 * h) * RPL, col, dk_, decay);
}

/* ---- gd_kernel_s: the streamed form, a v head a block (LASTSTAND_GDN_STREAM=1, 4) -------------
 * A block owns one v head j of one sequence: its whole state S [DK, dv] (64 KB at dk = dv = 128,
 * contiguous in rec) comes into shared memory by bulk copies (cp.async.bulk, one mbarrier) that
 * one thread issues right after the sequence table: no register holds the stream, so a block
 * takes dv / 32 warps of ~100 registers and an SM holds 3 blocks (by shared memory) with their
 * copies in flight while another block computes or stores. gd_kernel keeps S in 255 registers,
 * one 8-warp block an SM, and runs load -> compute -> store in ~4 serial waves at 16 sequences.
 * Lane (r = lane >> 3, cg = lane & 7) of warp w takes columns 32w + 4cg .. + 3 and gd_kernel's row
 * groups rg = r and r + 4 (rows rg·DK/8 .. + DK/8 − 1): a quarter warp reads 128 contiguous bytes of
 * a row (no bank conflict). The arithmetic is gd_kernel's, in its order: each group's partial
 * sums over its rows one after the other from 0, then the tree ((m0+m1)+(m2+m3))+((m4+m5)+(m6+m7))
 * (xor 8, xor 16, then the two groups' sums), the conv, norms and scalars by the same code
 * (gd_conv, gd_gate_beta, gd_delta, gd_norm_scale, gd_gated): the same bits as gd_kernel for every
 * sequence (test_gdn_decode_cuda), so that a step may take either form. Tokens go one at a time
 * (two passes over S in shared memory each: m, p, then the update); the last token's update goes
 * to global memory directly (a quarter warp stores 128 contiguous bytes). The fused gated norm is
 * block-local (a v head is one block): o to shared memory [2][dv], one __syncthreads a token.
 * Cluster = the ratio = nv / nk v heads of one k head (one sequence): each warp runs the k head's
 * q/k conv as gd_kernel's warps do; after the first token every thread arrives on the cluster
 * barrier, and before exit waits on it, so that the first block's warp 0 rewrites the q/k window
 * only after every block has read the old one. A sequence with no token returns at once (its
 * state is not touched; cluster-uniform: a cluster is one sequence).
 * grid (nv, n_seq), block dv threads, cluster (nv / nk); dynamic shared memory gs_smem(DK, dv). */
static size_t gs_smem(int dk, int dv) { return sizeof(float) * ((size_t)dk * dv + (dv / 32) * (2 * dk + 32) + 2 * dv); }

enum { GS_CHUNK = 16384 /* bytes a bulk copy */ };

/* BYTES from global src to shared dst by bulk copies of GS_CHUNK bytes, completing on the mbarrier
 * at bar (whose expected transaction count the caller has set) */
template <uint32_t BYTES>
__device__ __forceinline__ void gd_bulk_load(uint32_t dst, const void *src, uint32_t bar) {
#pragma unroll
    for (uint32_t o = 0; o < BYTES; o += GS_CHUNK)
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                         dst + o),
                     "l"(reinterpret_cast<const char *>(src) + o), "r"(BYTES - o < GS_CHUNK ? BYTES - o : (uint32_t)GS_CHUNK),
                     "r"(bar)
                     : "memory");
}

/* wait until the mbarrier at bar (shared memory) has completed its phase of parity par */
__device__ __forceinline__ void gd_mbar_wait(uint32_t bar, uint32_t par) {
    uint32_t ok = 0;
    while (!ok)
        asm volatile("{\n\t.reg .pred p;\n\tmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(ok)
                     : "r"(bar), "r"(par)
                     : "memory");
}

template <int DK, int DV, class ST = float>
__global__ void __launch_bounds__(DV, 3) gd_kernel_s(GD_ARGS) {
    static_assert(sizeof(ST) == 4, "gd_kernel_s runs tokens on S in shared memory: an fp32 state only");
    constexpr int K = GD_K, CH = DK / 32;
    extern __shared__ float4 gd_sh4[];
    __shared__ alignas(8) unsigned long long gs_bar;
    (void)cl;
    (void)dv; /* DV: the addresses of S fold into constants */
    cu_pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, cg = lane & 7, r = lane >> 3;
    const int j = blockIdx.x, s = blockIdx.y, kh = j / (nv / nk);
    int slot, T, row0;
    gd_ld_seq(meta + 3 * s, slot, T, row0);
    if (T <= 0) { /* nothing to do; every block of the cluster (one sequence) returns here, after */
        cu_pdl_wait(); /* the wait: a grid that ends without it would let its successor pass */
        return;        /* griddepcontrol.wait before this grid's predecessor completed */
    }
    float *const sS = reinterpret_cast<float *>(gd_sh4);           /* [DK][DV] */
    float *const gq = sS + (size_t)DK * DV + warp * (2 * DK + 32); /* q [DK], k [DK], v [32] of the warp */
    float *const nbuf = sS + (size_t)DK * DV + (DV / 32) * (2 * DK + 32); /* [2][DV] */
    float *__restrict__ Sg = rec + ((size_t)slot * nv + j) * DK * DV;
    const uint32_t bar = (uint32_t)__cvta_generic_to_shared(&gs_bar);
    if (threadIdx.x == 0) {
        constexpr uint32_t bytes = (uint32_t)DK * DV * 4;
        const uint32_t dst = (uint32_t)__cvta_generic_to_shared(sS);
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
        gd_bulk_load<bytes>(dst, Sg, bar);
    }
    /* conv windows: q/k channels lane·CH .. + CH − 1 of head kh (as gd_kernel's warps), v channel
     * 32·warp + lane of head j */
    const int qch = kh * DK + lane * CH, kch = nk * DK + qch, vch = 2 * nk * DK + j * DV + warp * 32 + lane;
    float *stv = gd_win(conv_st, slot, D, vch);
    float wq[CH][K - 1], wk[CH][K - 1], wv[K - 1], al, db;
    float4 cwq[CH], cwk[CH], cwv;
    gd_ld_qk<CH>(conv_st, conv_w, slot, D, qch, kch, wq, wk, cwq, cwk);
    gd_ld_v(conv_st, conv_w, A_log, dt_bias, slot, D, vch, j, wv, cwv, al, db);
    const float qscale = rsqrtf((float)DK);
    const bool fuse = z != nullptr;
    const int col = warp * 32 + 4 * cg, hc = col + r; /* the lane's 4 columns; the one it writes */
    const float gwn = fuse ? nrm_w[hc] : 0.f;
    __syncthreads(); /* the mbarrier is initialized before anyone waits on it */
    cu_pdl_wait();   /* qkv, a, b (and z) come from the projection before */
    float *tq = gq, *tk = gq + DK, *tv = gq + 2 * DK;
    for (int u = 0; u < T; u++) {
        const size_t row = (size_t)(row0 + u);
        const bf16 *rw = qkv + row * D;
        float xq[CH], xk[CH];
        gd_ld_raw_qk<CH>(rw, qch, kch, xq, xk);
        const float xv = __bfloat162float(rw[vch]), xa = gd_bf(a, row * nv + j), xb = gd_bf(b, row * nv + j);
        const float xz = fuse ? gd_bf(z, (row * nv + j) * DV + hc) : 0.f;
        float ssq = 0.f, ssk = 0.f, sqk = 0.f, decay, beta;
        __syncwarp(); /* the previous token's q, k, v are read */
        gd_conv_qk<CH>(cwq, cwk, wq, wk, xq, xk, tq, tk, lane, ssq, ssk, sqk);
        tv[lane] = gd_conv(cwv, wv, xv);
        gd_gate_beta(xa, xb, al, db, decay, beta);
        gd_sum3(ssq, ssk, sqk);
        __syncwarp();
        if (u == 0) {
            /* every window of this block is read: the k head's first block may roll q/k once all arrived */
            asm volatile("barrier.cluster.arrive.release;" ::: "memory");
            gd_mbar_wait(bar, 0);
        }
        const float rq = rsqrtf(ssq + 1e-6f) * qscale, rk = rsqrtf(ssk + 1e-6f);
        const float kq = sqk * rq * rk;
        float o4[4];
        gs_token<DK, float>(sS, Sg, u == T - 1, tq, tk, tv, rq, rk, kq, decay, beta, r, cg, col, o4);
        /* every r holds its 4 columns' o: lane (r, cg) writes column col + r */
        const float ov = r == 0 ? o4[0] : r == 1 ? o4[1] : r == 2 ? o4[2] : o4[3];
        if (!fuse) {
            out[(row * nv + j) * DV + hc] = __float2bfloat16_rn(ov);
        } else {
            float *hv = nbuf + (u & 1) * DV; /* alternating: a warp rewrites it only after the next barrier */
            hv[hc] = __bfloat162float(__float2bfloat16_rn(ov));
            __syncthreads();
            const float y = gd_gated(gwn, hv[hc] * gd_norm_scale(hv, DV, lane, nrm_eps), xz);
            out[(row * nv + j) * DV + hc] = __float2bfloat16(y);
        }
    }
#pragma unroll
    for (int i = 0; i < K - 1; i++) stv[i] = wv[i];
    asm volatile("barrier.cluster.wait.acquire;" ::: "memory");
    if (j % (nv / nk) == 0 && warp == 0) {
        gd_st_qk<CH>(conv_st, slot, D, qch, kch, wq, wk);
    }
}

/* ---- gd_kernel_p: the streamed form, persistent (wide decode steps: LASTSTAND_GDN_STREAM) ---------
 * For decode steps (every sequence at most one token). grid (G) with G = min(units, the blocks
 * resident at once), block DK threads (dk = dv), no cluster; a unit = (sequence, k head), block b
 * takes units b, b + G, ... and a unit's nv / nk v heads one after the other ("tasks"). The states of the next NB tasks are in
 * flight at all times: NB shared-memory buffers with an mbarrier each (NB = GP_NB, or fewer in the
 * forms with more blocks an SM: gp_cfg), thread 0 refills a buffer with the task NB ahead as soon
 * as the block is done with it, so an SM streams reads and writes without the gaps between one
 * block's exit and the next one's first load (gd_kernel_s's
 * blocks start in step: at 16 sequences of the 35B shape the reads of the first wave all come
 * before any store). The unit's q/k conv runs once, in warp 0 (the lane split of gd_kernel's
 * warps, so the same bits), and warp 0 rolls the q/k window itself (a unit belongs to one block:
 * no cluster); the per-token math is gs_token's. Sequences with no token are skipped by producer
 * and consumers alike (the same walk over the sequence table). Blocks of 2·DK threads, a head's row
 * halves on two warps a scheduler (LASTSTAND_GDN_P8=1), gave the same bits but were slower at every
 * size (S11: 16 sequences 31.10 vs 30.14 µs, 64: 101.1 vs 97.3) and were deleted in S11 (last at
 * commit e4fc8bf; bench/RESULTS.md, tidy2). */
enum { GP_NB = 3 };
static size_t gp_smem(int dk, size_t es = sizeof(float), int nb = GP_NB) { /* es: bytes of a state element */
    return es * (size_t)nb * dk * dk + sizeof(float) * (2 * dk /* q, k */ + dk /* v */ + dk /* o */ + 4);
}

/* the first unit from u on (step G) whose sequence has a token; n_units when none */
__device__ __forceinline__ int gp_seek(const int32_t *meta, int u, int n_units, int nk, int G, int &slot, int &T,
                                       int &row0) {
    for (; u < n_units; u += G) {
        gd_ld_seq(meta + 3 * (u / nk), slot, T, row0);
        if (T > 0) break;
    }
    return u;
}

template <int DK, class ST, int NB = GP_NB, int MINB = 1>
__global__ void __launch_bounds__(DK, MINB) gd_kernel_p(GD_ARGS) {
    constexpr int K = GD_K, CH = DK / 32, DV = DK;
    constexpr uint32_t BYTES = (uint32_t)DK * DV * sizeof(ST); /* a head's state as stored: fp32 or BF16 */
    extern __shared__ float4 gd_sh4[];
    __shared__ alignas(8) unsigned long long gp_bar[NB];
    (void)dv;
    cu_pdl_trigger();
    const int n_seq = cl; /* launched with cl = the sequence count */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, cg = lane & 7, r = lane >> 3;
    const int ratio = nv / nk, n_units = n_seq * nk, G = gridDim.x;
    ST *const sbuf = reinterpret_cast<ST *>(gd_sh4);          /* [NB][DK][DV] */
    float *const tq = reinterpret_cast<float *>(sbuf + (size_t)NB * DK * DV), *const tk = tq + DK;
    float *const tv = tk + DK + warp * 32;                   /* the warp's 32 v values */
    float *const hv = tk + DK + DV;                          /* o of the head [DV] (fused norm) */
    float *const scal = hv + DV;                             /* rq, rk, k·q of the unit */
    const uint32_t bar0 = (uint32_t)__cvta_generic_to_shared(&gp_bar[0]);
    const uint32_t sdst = (uint32_t)__cvta_generic_to_shared(sbuf);
    /* the producer's cursor (thread 0): unit pu, its head pj, the unit's slot */
    int pu = 0, pj = 0, pslot = 0;
    if (threadIdx.x == 0) {
        for (int b = 0; b < NB; b++)
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar0 + 8 * b) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        int pT, prow;
        pu = gp_seek(meta, blockIdx.x, n_units, nk, G, pslot, pT, prow);
    }
    /* thread 0: the next task's state into buffer b, then the cursor one task on */
    auto issue = [&](int b) {
        if (pu >= n_units) return;
        const int j = (pu % nk) * ratio + pj;
        const char *src = reinterpret_cast<const char *>(rec + ((size_t)pslot * nv + j) * DK * DV);
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar0 + 8 * b), "r"(BYTES)
                     : "memory");
        gd_bulk_load<BYTES>(sdst + b * BYTES, src, bar0 + 8 * b);
        if (++pj == ratio) {
            int pT, prow;
            pj = 0;
            pu = gp_seek(meta, pu + G, n_units, nk, G, pslot, pT, prow);
        }
    };
    if (threadIdx.x == 0)
        for (int b = 0; b < NB; b++) issue(b);
    const bool fuse = z != nullptr;
    const int col = warp * 32 + 4 * cg, hc = col + r;
    const float gwn = fuse ? nrm_w[hc] : 0.f, qscale = rsqrtf((float)DK);
    __syncthreads(); /* the mbarriers are initialized before anyone waits on them */
    cu_pdl_wait();   /* qkv, a, b (and z) come from the projection before */
    int t = 0, slot, T, row0;
    for (int u = gp_seek(meta, blockIdx.x, n_units, nk, G, slot, T, row0); u < n_units;
         u = gp_seek(meta, u + G, n_units, nk, G, slot, T, row0)) {
        const int kh = u % nk;
        const size_t row = (size_t)row0; /* T == 1: decode steps only */
        const bf16 *rw = qkv + row * D;
        if (warp == 0) { /* the unit's q/k conv (gd_kernel's lane split), its window rolled */
            const int qch = kh * DK + lane * CH, kch = nk * DK + qch;
            float wq[CH][K - 1], wk[CH][K - 1], xq[CH], xk[CH];
            float4 cwq[CH], cwk[CH];
            gd_ld_qk<CH>(conv_st, conv_w, slot, D, qch, kch, wq, wk, cwq, cwk);
            gd_ld_raw_qk<CH>(rw, qch, kch, xq, xk);
            float ssq = 0.f, ssk = 0.f, sqk = 0.f;
            gd_conv_qk<CH>(cwq, cwk, wq, wk, xq, xk, tq, tk, lane, ssq, ssk, sqk);
            gd_sum3(ssq, ssk, sqk);
            if (lane == 0) {
                const float rq = rsqrtf(ssq + 1e-6f) * qscale, rk = rsqrtf(ssk + 1e-6f);
                scal[0] = rq;
                scal[1] = rk;
                scal[2] = sqk * rq * rk;
            }
            gd_st_qk<CH>(conv_st, slot, D, qch, kch, wq, wk);
        }
        for (int jj = 0; jj < ratio; jj++, t++) {
            const int j = kh * ratio + jj, bi = t % NB;
            /* the head's v channel 32·warp + lane: conv, window rolled; its g, β; z */
            const int vch = 2 * nk * DK + j * DV + warp * 32 + lane;
            float wv[K - 1], al, db;
            float4 cwv;
            gd_ld_v(conv_st, conv_w, A_log, dt_bias, slot, D, vch, j, wv, cwv, al, db);
            const float xv = __bfloat162float(rw[vch]), xa = gd_bf(a, row * nv + j), xb = gd_bf(b, row * nv + j);
            const float xz = fuse ? gd_bf(z, (row * nv + j) * DV + hc) : 0.f;
            float decay, beta;
            float *stv = gd_win(conv_st, slot, D, vch);
            tv[lane] = gd_conv(cwv, wv, xv);
#pragma unroll
            for (int i = 0; i < K - 1; i++) stv[i] = wv[i];
            gd_gate_beta(xa, xb, al, db, decay, beta);
            __syncthreads(); /* q, k and the scalars (warp 0), v (each warp) */
            gd_mbar_wait(bar0 + 8 * bi, (uint32_t)(t / NB) & 1u);
            float o4[4];
            gs_token<DK, ST, (MINB > 1)>(sbuf + (size_t)bi * DK * DV, rec + ((size_t)slot * nv + j) * DK * DV, true,
                                         tq, tk, tv, scal[0], scal[1], scal[2], decay, beta, r, cg, col, o4);
            const float ov = r == 0 ? o4[0] : r == 1 ? o4[1] : r == 2 ? o4[2] : o4[3];
            if (!fuse) {
                out[(row * nv + j) * DV + hc] = __float2bfloat16_rn(ov);
            } else {
                hv[hc] = __bfloat162float(__float2bfloat16_rn(ov));
                __syncthreads();
                const float y = gd_gated(gwn, hv[hc] * gd_norm_scale(hv, DV, lane, nrm_eps), xz);
                out[(row * nv + j) * DV + hc] = __float2bfloat16(y);
            }
            __syncthreads(); /* buffer b, q, k, v, o are read */
            if (threadIdx.x == 0) {
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                issue(bi);
            }
        }
    }
}

static int gp_sms(void) {
    static int n = 0;
    if (!n) {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && v > 0)
            n = v;
        else
            (void)cudaGetLastError();
    }
    return n > 0 ? n : 132;
}

/* Every form's launch: kern on grid x block, smem bytes of dynamic shared memory (opted in above
 * 48 KB: a function attribute, no stream work: capture-safe), a cluster of `cluster` blocks along x
 * (none when 0), programmatic dependent launch when pdl (retried without it when the launch refuses
 * the attribute); cl: the kernel's cl argument (gd_kernel_p: the sequence count). */
template <class ST>
static cudaError_t gd_launch_ex(void (*kern)(GD_ARGS), dim3 grid, dim3 block, size_t smem, int cluster, int pdl, int cl,
                                const gdn_args *a, int fuse, cudaStream_t st) {
    ST *const rec = sizeof(ST) == 2 ? (ST *)(void *)a->st->rec16 : (ST *)(void *)a->st->rec; /* the state as stored */
    const gdn_w *w = a->w;
    const int D = 2 * w->nk * w->dk + w->nv * w->dv;
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    if (smem > 32 * 1024) { /* these kernels' static shared memory is a few barriers: below 32 KB the default holds */
        cudaError_t c = cu_smem_allow((const void *)kern, smem);
        if (c != cudaSuccess) return c;
    }
    cudaLaunchAttribute at[2];
    memset(at, 0, sizeof at);
    unsigned n = 0;
    if (cluster) {
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = cluster;
        at[n].val.clusterDim.y = 1;
        at[n].val.clusterDim.z = 1;
        n++;
    }
    const unsigned base = n;
    if (pdl) {
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n].val.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    cfg.attrs = at;
    cfg.numAttrs = n;
    cudaError_t c;
    for (;;) {
        c = cudaLaunchKernelEx(&cfg, kern, w->nk, w->nv, w->dv, D, cl, (const int32_t *)a->seqs,
                               (const bf16 *)a->qkv, (const bf16 *)a->a, (const bf16 *)a->b, w->conv_w, w->A_log,
                               w->dt_bias, a->st->conv, rec, (bf16 *)a->out,
                               fuse ? (const bf16 *)a->z : (const bf16 *)nullptr, fuse ? a->norm_w : (const float *)nullptr,
                               a->norm_eps);
        if (c == cudaSuccess || cfg.numAttrs == base) return c;
        (void)cudaGetLastError(); /* a launch that refuses the attribute: without it */
        cfg.numAttrs = base;
    }
}

/* LASTSTAND_GDN_POCC = 1 | 2: at most that many form-0 gd_kernel_p blocks an SM (default 2). The BF16
 * state's three buffers (3 x 32 KB at dk = dv = 128) leave room for a second block an SM, the fp32
 * state's (3 x 64 KB) do not: the grid is what fits at once (a persistent grid must not queue a
 * second wave), so only the BF16 state gets two. Why (S22): a block is 4 warps, one a scheduler,
 * so a head's update waits on its own instruction latencies; with the bytes halved the BF16 step
 * measured -9% where the bytes predicted -14%. A task's arithmetic does not depend on the block
 * that runs it: the same bits either way. */
static int gp_occ_cap(void) {
    const char *v = getenv("LASTSTAND_GDN_POCC");
    return v && !strcmp(v, "1") ? 1 : 2;
}

/* gd_kernel_p<DK, ST, NB, MINB>'s blocks an SM by the occupancy calculator for its block and shared
 * memory, found once (a constant of the instance; the first launch pays the query, no step after it) */
template <int DK, class ST, int NB, int MINB>
static int gp_occ(size_t smem) {
    static int occ = 0;
    if (!occ) {
        int v = 1;
        const void *kern = (const void *)gd_kernel_p<DK, ST, NB, MINB>;
        if ((smem > 32 * 1024 && cu_smem_allow(kern, smem) != cudaSuccess) ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, gd_kernel_p<DK, ST, NB, MINB>, DK, smem) != cudaSuccess ||
            v < 1) {
            (void)cudaGetLastError();
            v = 1;
        }
        occ = v;
    }
    return occ;
}

/* LASTSTAND_GDN_PCFG = 0 | 1 | 2 | 3 (unset: auto, -1): gd_kernel_p's form, (state buffers a block,
 * blocks an SM):
 *   0: 3 buffers, a task's rows unrolled (245 registers), at most gp_occ_cap() blocks an SM;
 *   1: 2 buffers, the rows in a loop (~102 registers, the same arithmetic), up to 3 blocks;
 *   2: 1 buffer, up to 5 blocks;  3: 1 buffer, up to 6 blocks (80 registers).
 * S23's ncu of form 0 at 119 sequences: 2 warps a scheduler, issue 22% busy, the task's chain of
 * latencies (its inputs, three block barriers) not hidden. Forms 1-3 trade the state copies in
 * flight a block for more blocks (tasks) an SM. Measured (synth 35B decode step, ms, form 0 -> 2):
 * BF16 state B = 128 14.837 -> 14.726, B = 64 11.268 -> 11.109, B = 16 5.951 -> 6.069 (worse: one
 * unit a block, whose next task's state form 0 already has in flight); fp32 state B = 128 17.372 ->
 * 16.636; forms 1 and 3 no better than 2; the same bits in every form. Then (gdnauto.sh) B = 32
 * (512 units) 8.661 -> 8.543, B = 48 10.142 -> 10.053, fp32 B = 16 6.174 -> 6.313 (worse, as BF16's).
 * Auto: form 2 from 3 units an SM on (the 35B / 397B shapes, 16 k heads: 25 sequences and more),
 * else form 0. */
static int gp_cfg(void) { /* read at every call, as LASTSTAND_GDN_STREAM (the tests set it) */
    const char *e = getenv("LASTSTAND_GDN_PCFG");
    return e && e[0] >= '0' && e[0] <= '3' && !e[1] ? e[0] - '0' : -1;
}

/* gd_kernel_p<DK, ST, NB, MINB> on a grid of the units, at most what is resident at once (gp_occ;
 * form 0 also capped by gp_occ_cap): a persistent grid must not queue a second wave */
template <int DK, class ST, int NB, int MINB>
static cudaError_t gp_launch_f(const gdn_args *a, int fuse, int pdl, cudaStream_t st) {
    const size_t sm = gp_smem(DK, sizeof(ST), NB);
    int occ = gp_occ<DK, ST, NB, MINB>(sm);
    if (MINB == 1 && occ > gp_occ_cap()) occ = gp_occ_cap();
    const int units = a->n_seq * a->w->nk, most = gp_sms() * occ;
    return gd_launch_ex<ST>(gd_kernel_p<DK, ST, NB, MINB>, dim3(units < most ? units : most, 1, 1), dim3(DK, 1, 1), sm,
                            0, pdl, a->n_seq, a, fuse, st);
}

template <int DK, class ST>
static cudaError_t gp_launch_st(const gdn_args *a, int fuse, int pdl, cudaStream_t st) {
    int cfg = gp_cfg();
    if (cfg < 0) cfg = a->n_seq * a->w->nk >= 3 * gp_sms() ? 2 : 0; /* auto: by the units an SM */
    switch (cfg) {
    case 1: return gp_launch_f<DK, ST, 2, 3>(a, fuse, pdl, st);
    case 2: return gp_launch_f<DK, ST, 1, 5>(a, fuse, pdl, st);
    case 3: return gp_launch_f<DK, ST, 1, 6>(a, fuse, pdl, st);
    default: return gp_launch_f<DK, ST, GP_NB, 1>(a, fuse, pdl, st);
    }
}

template <int DK>
static cudaError_t gp_launch(const gdn_args *a, int fuse, int pdl, cudaStream_t st) {
    return a->st->rec16 ? gp_launch_st<DK, bf16>(a, fuse, pdl, st) : gp_launch_st<DK, float>(a, fuse, pdl, st);
}

/* Warps per block: the fewest, at least want, that divide dv / GD_WC and leave at most
 * GD_MAX_CLUSTER blocks per k head (the fewest of all when none of those does). 0 when none. */
static int gd_warps(int nk, int nv, int dv, int want) {
    const int nsl = dv / GD_WC, wk = (nv / nk) * nsl;
    for (int nw = want; nw <= GD_MAX_NW; nw++)
        if (nsl % nw == 0 && wk / nw <= GD_MAX_CLUSTER) return nw;
    for (int nw = 1; nw <= GD_MAX_NW; nw++)
        if (nsl % nw == 0 && wk / nw <= GD_MAX_CLUSTER) return nw;
    return 0;
}

/* LASTSTAND_GDN_NW=1|2|4|8: at least that many warps a block; unset (auto, 0): the fewest, and
 * blocks of 8 warps (clusters of 2 at Qwen3.5's shapes instead of 8 blocks of 2) where the
 * fewest-warps grid needs more than one wave: S8 device round R2 (ncu, caches flushed), a
 * decode step of 16 sequences of Qwen3.5-35B's GDN 44.7 -> 39.2 µs, -397B's 84.6 -> 81.3 µs.
 * The warps' arithmetic does not depend on the blocks' size (test_gdn_decode_cuda). Read once. */
static int gd_nw_knob(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("LASTSTAND_GDN_NW");
        v = e && (!strcmp(e, "1") || !strcmp(e, "2") || !strcmp(e, "4") || !strcmp(e, "8")) ? atoi(e) : 0;
    }
    return v;
}

static int dec_supported(const dev_info *d, const gdn_shape *s, char *why, size_t n) {
    if (d->kind != DEV_CUDA) {
        snprintf(why, n, "needs a CUDA device");
        return 0;
    }
    if (d->cc_major && d->cc_major < 9) {
        snprintf(why, n, "needs thread block clusters (compute capability 9.0+, this is %d.%d)", d->cc_major,
                 d->cc_minor);
        return 0;
    }
    if (s->dt != ACT_BF16) {
        snprintf(why, n, "activations must be BF16");
        return 0;
    }
    if ((s->dk != 32 && s->dk != 64 && s->dk != 128) || s->dv < GD_WC || s->dv % GD_WC || s->conv_k != GD_K ||
        s->nk <= 0 || s->nv % s->nk) {
        snprintf(why, n, "needs dk 32/64/128, dv a multiple of %d, conv %d, nv %% nk == 0 (dk=%d dv=%d conv=%d %d/%d)",
                 GD_WC, GD_K, s->dk, s->dv, s->conv_k, s->nv, s->nk);
        return 0;
    }
    if (!gd_warps(s->nk, s->nv, s->dv, 1)) {
        snprintf(why, n, "a k head's %d v heads x %d columns do not fit a cluster of %d blocks of %d warps",
                 s->nv / s->nk, s->dv, GD_MAX_CLUSTER, GD_MAX_NW);
        return 0;
    }
    if (s->n_seq > 65535) {
        snprintf(why, n, "at most 65535 sequences per call (%d)", s->n_seq);
        return 0;
    }
    return 1;
}

/* LASTSTAND_GDN_PDL=0|1: launch without / with programmatic dependent launch (off: the
 * behaviour before it, for before/after timings); else GD_PDL_DEFAULT (on since H200 device
 * round R1, 2026-11-29, with the other decode-step PDL switches). Read once. */
#define GD_PDL_DEFAULT 1
static int gd_pdl(void) {
    static int v = -1;
    if (v < 0) v = cu_env_switch("LASTSTAND_GDN_PDL", GD_PDL_DEFAULT);
    return v;
}

/* LASTSTAND_GDN_NORM=0|1: the gated output norm fused into the kernel when the caller asks
 * (gdn_args.z) and dv <= 256 (see the header); else GD_NORM_DEFAULT: on since H200 device round
 * S7-R1 (2026-11-30, bench/device/stepfuse.sh): test_gdn_decode_cuda bitwise equal to the two
 * ops, the 40-layer synth 35B's 129 greedy ids identical, its decode step 2.520 -> 2.500 ms.
 * Read once. */
#define GD_NORM_DEFAULT 1
static int gd_norm(void) {
    static int v = -1;
    if (v < 0) v = cu_env_switch("LASTSTAND_GDN_NORM", GD_NORM_DEFAULT);
    return v;
}

/* LASTSTAND_GDN_T1=0|1|2: calls whose sequences bring at most one token each run gd_kernel1
 * (one token a group, at most GD_T1_REGS registers; the same arithmetic, bit for bit) never (0),
 * always (1), or (2) when the call's blocks outnumber what the GPU holds of gd_kernel at once
 * (gd_t1_wide): gd_kernel takes 255 registers a thread (ptxas, dk = 128), so an SM holds 8 of
 * its warps, and a decode step of 16 sequences of Qwen3.5 (16 x 32 v heads x 8 warps) runs in
 * ~4 waves where gd_kernel1's 16 warps an SM need 2; one sequence (256 warps) fits either way,
 * where gd_kernel1's spills made it slower (S7 stepfuse R2: +0.074 ms over 30 layers).
 * GD_T1_DEFAULT: off until a device round checks it. Read once. */
#define GD_T1_DEFAULT 0
static int gd_t1(void) {
    static int v = -1;
    if (v < 0) {
        const char *s = getenv("LASTSTAND_GDN_T1");
        v = s && !strcmp(s, "2") ? 2 : cu_env_switch("LASTSTAND_GDN_T1", GD_T1_DEFAULT);
    }
    return v;
}

/* Whether a grid of `blocks` blocks of nw warps (dynamic shared memory smem) of gd_kernel<DK>
 * is more than the GPU holds at once (occupancy asked once per device and shape: a host-side
 * query, no stream work, capture-safe). 0 when the query fails. */
template <int DK>
static int gd_t1_wide(long blocks, int nw, size_t smem) {
    static struct {
        int dev, nw;
        size_t smem;
        long fit;
    } memo[8];
    static int n_memo;
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return (void)cudaGetLastError(), 0;
    long fit = -1;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n_memo && fit < 0; i++)
        if (memo[i].dev == dev && memo[i].nw == nw && memo[i].smem == smem) fit = memo[i].fit;
    if (fit < 0) {
        int bps = 0, sms = 0;
        if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&bps, gd_kernel<DK, float>, nw * 32, smem) != cudaSuccess ||
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
            (void)cudaGetLastError();
            bps = sms = 0;
        }
        fit = (long)bps * sms;
        if (fit > 0 && n_memo < 8) memo[n_memo++] = {dev, nw, smem, fit};
    }
    pthread_mutex_unlock(&mu);
    return fit > 0 && blocks > fit;
}

/* gd_kernel's (tb = GD_TB) or gd_kernel1's (tb = 1) blocks of nw warps: their dynamic shared memory
 * (see gd_body; nw > 4 at dk = 128: more than 48 KB), and the blocks a k head (the cluster) */
static size_t gd_smem(const gdn_w *w, int nw, int tb, int fuse) {
    return sizeof(float) * (nw * tb * GD_TOK(w->dk) + (fuse ? 2 * tb * w->dv : 0));
}
static int gd_cl(const gdn_w *w, int nw) { return (w->nv / w->nk) * (w->dv / GD_WC) / nw; }

/* Whether gd_kernel's grid for n_seq sequences in blocks of nw warps needs more than one wave */
static int gd_wide(const gdn_w *w, int nw, int n_seq, int fuse) {
    const long blocks = (long)w->nk * gd_cl(w, nw) * n_seq;
    const size_t smem = gd_smem(w, nw, GD_TB, fuse);
    return w->dk == 32   ? gd_t1_wide<32>(blocks, nw, smem)
           : w->dk == 64 ? gd_t1_wide<64>(blocks, nw, smem)
                         : gd_t1_wide<128>(blocks, nw, smem);
}

/* fuse: write the gated norm of o (a->z, a->norm_w, a->norm_eps) instead of o; t1: gd_kernel1 */
template <int DK>
static cudaError_t gd_launch(const gdn_args *a, int nw, int cl, int fuse, int t1, cudaStream_t st) {
    const size_t smem = gd_smem(a->w, nw, t1 ? 1 : GD_TB, fuse);
    if (a->st->rec16)
        return gd_launch_ex<bf16>(t1 ? gd_kernel1<DK, bf16> : gd_kernel<DK, bf16>, dim3(a->w->nk * cl, a->n_seq, 1),
                                  dim3(nw * 32, 1, 1), smem, cl, gd_pdl(), cl, a, fuse, st);
    return gd_launch_ex<float>(t1 ? gd_kernel1<DK, float> : gd_kernel<DK, float>, dim3(a->w->nk * cl, a->n_seq, 1),
                               dim3(nw * 32, 1, 1), smem, cl, gd_pdl(), cl, a, fuse, st);
}

/* LASTSTAND_GDN_STREAM=0|1|2|3|4: the streamed forms (see gd_kernel_s, gd_kernel_p) never (0);
 * gd_kernel_s for every call it supports (1; prompt chunks too, a token at a time); auto (2): decode
 * steps (every sequence at most one new token) whose gd_kernel grid of the fewest warps needs more
 * than one wave (gd_t1_wide: more than ~4 sequences at Qwen3.5's shapes) run gd_kernel_p, the rest
 * gd_kernel; gd_kernel_p for every decode step (3); (4) R1's auto: those wide decode steps on
 * gd_kernel_s. The same bits every way (test_gdn_decode_cuda). Else GD_STREAM_DEFAULT, 2 since H200
 * device round gdn16-R2 (2026-11-30, bench/device/gdn16.sh): the 16-sequence step's kernel (ncu,
 * caches flushed) gd_kernel 41.7 / gd_kernel_s 30.6 / gd_kernel_p 26.3 µs at Qwen3.5-35B's shape,
 * 83.9 / 46.9 / 45.0 at -397B's; the 40-layer synth 35B's decode step at c = 16 6.558 / 6.352 /
 * 6.177 ms (every decode step on gd_kernel_p there); one sequence stays gd_kernel's (gd_kernel_p
 * 6.8 µs against 5.0 in the doctor at M = 1). Read at every call (the test switches it between
 * calls; serve captures the step in a graph). */
#define GD_STREAM_DEFAULT 2
static int gd_stream(void) {
    const char *v = getenv("LASTSTAND_GDN_STREAM");
    if (v && (!strcmp(v, "2") || !strcmp(v, "3") || !strcmp(v, "4"))) return atoi(v);
    return cu_env_switch("LASTSTAND_GDN_STREAM", GD_STREAM_DEFAULT);
}

/* gd_kernel_s takes a v head a block (dv / 32 warps of 32 columns), a k head's v heads a cluster
 * (at most 8), S of a head in shared memory (the opt-in limit of sm_90); it is built for dk = dv
 * (32, 64, 128: Qwen3.5's and Qwen3-Next's 128, the fixtures' 32) so that S's addresses are constants */
static int gs_fits(const gdn_w *w) {
    return w->dv == w->dk && w->nv / w->nk <= GD_MAX_CLUSTER && gs_smem(w->dk, w->dv) <= 227 * 1024;
}

template <int DK, int DV>
static cudaError_t gs_launch(const gdn_args *a, int fuse, cudaStream_t st) {
    const gdn_w *w = a->w;
    const int cl = w->nv / w->nk;
    return gd_launch_ex<float>(gd_kernel_s<DK, DV, float>, dim3(w->nv, a->n_seq, 1), dim3(w->dv, 1, 1),
                               gs_smem(DK, w->dv), cl,
                        gd_pdl(), cl, a, fuse, st);
}

/* LASTSTAND_GDN_DECODE_MAX_NEW: the most new tokens of one sequence that this kernel takes;
 * a call with a longer one goes to cuda_chunked. Default GD_CHUNK_LIMIT; 0: never hand over. */
static int gd_chunk_limit(void) {
    const char *v = getenv("LASTSTAND_GDN_DECODE_MAX_NEW");
    if (!v || !*v) return GD_CHUNK_LIMIT;
    char *end;
    long n = strtol(v, &end, 10);
    return *end || n < 0 || n > INT32_MAX ? GD_CHUNK_LIMIT : (int)n;
}

static int dec_run(const gdn_args *a, ls_stream s, ls_err *e) {
    const gdn_w *w = a->w;
    gdn_shape sh;
    dev_info d0;
    const int rc0 = cu_gdn_begin(a, dec_supported, "cuda_decode", &sh, &d0, e);
    if (rc0) return rc0 < 0 ? rc0 : 0;
    if (!a->seqs_host)
        return errf(e, ERR_INVAL, "gdn cuda_decode: seqs_host (the host copy of the sequences) is not set");
    for (int i = 0; i < a->n_seq; i++) {
        const gdn_seq *q = &a->seqs_host[i];
        if (q->slot < 0 || q->slot >= a->st->n_slots || q->n_new < 0 || q->row0 < 0 || q->row0 + q->n_new > a->n_tok)
            return errf(e, ERR_INVAL, "gdn: sequence %d (slot %d, rows %d+%d) outside the batch", i, q->slot, q->row0,
                        q->n_new);
    }
    /* a prompt chunk longer than the limit: the whole call is cuda_chunked's (see the header) */
    int max_new = 0;
    for (int i = 0; i < a->n_seq; i++)
        if (a->seqs_host[i].n_new > max_new) max_new = a->seqs_host[i].n_new;
    const int lim = gd_chunk_limit();
    char why[200];
    if (lim > 0 && max_new > lim && gdn_cuda_chunked.supported(&d0, &sh, why, sizeof why))
        return gdn_cuda_chunked.run(a, s, e);
    const int bf = a->st->rec16 != NULL; /* the state in BF16: gd_kernel, gd_kernel1, gd_kernel_p (not _s) */
    if (((uintptr_t)(bf ? (const void *)a->st->rec16 : (const void *)a->st->rec) | (uintptr_t)w->conv_w) & 15)
        return errf(e, ERR_UNSUPPORTED, "gdn cuda_decode: the recurrent state and conv weights must be 16-byte aligned");
    const int knob = gd_nw_knob();
    int nw = gd_warps(w->nk, w->nv, w->dv, knob > 0 ? knob : 1), cl = gd_cl(w, nw);
    const int fuse = a->z && a->norm_w && a->norm_done && w->dv <= 256 && !((uintptr_t)a->z & 1) && gd_norm();
    /* whether gd_kernel's grid of the fewest warps a block needs more than one wave */
    const int wide = gd_wide(w, gd_warps(w->nk, w->nv, w->dv, 1), a->n_seq, fuse);
    cudaStream_t st = (cudaStream_t)s;
    cudaError_t c;
    const int sm = gd_stream();
    const int fits = gs_fits(w), dec = max_new <= 1;
    const int persistent = fits && dec && gp_smem(w->dk, bf ? 2 : 4) <= 227 * 1024 && (sm == 3 || (sm == 2 && wide));
    const int streamed = !persistent && !bf && fits && (sm == 1 || (sm == 4 && dec && wide));
    if (persistent) {
        const int pdl = gd_pdl();
        switch (w->dk) {
        case 32: c = gp_launch<32>(a, fuse, pdl, st); break;
        case 64: c = gp_launch<64>(a, fuse, pdl, st); break;
        default: c = gp_launch<128>(a, fuse, pdl, st); break;
        }
    } else if (streamed) {
        switch (w->dk) {
        case 32: c = gs_launch<32, 32>(a, fuse, st); break;
        case 64: c = gs_launch<64, 64>(a, fuse, st); break;
        default: c = gs_launch<128, 128>(a, fuse, st); break; /* gs_fits: dk = dv, 32/64/128 */
        }
    } else {
        if (!knob && wide) { /* auto: 8-warp blocks where the fewest-warps grid of gd_kernel needs more than one wave */
            const int n8 = gd_warps(w->nk, w->nv, w->dv, 8);
            if (n8 == 8) {
                nw = 8;
                cl = gd_cl(w, nw);
            }
        }
        int t1 = max_new <= 1 && gd_t1();
        if (t1 == 1 && gd_t1() == 2) t1 = gd_wide(w, nw, a->n_seq, fuse); /* auto: only a grid of more than one wave */
        switch (w->dk) {
        case 32: c = gd_launch<32>(a, nw, cl, fuse, t1, st); break;
        case 64: c = gd_launch<64>(a, nw, cl, fuse, t1, st); break;
        default: c = gd_launch<128>(a, nw, cl, fuse, t1, st); break; /* dec_supported admits 32/64/128 only */
        }
    }
    if (c == cudaSuccess) c = cudaGetLastError();
    if (c != cudaSuccess)
        return cu_fail(e, c, persistent ? "gdn cuda_decode (persistent)" : streamed ? "gdn cuda_decode (streamed)"
                                                                          : "gdn cuda_decode");
    if (fuse) {
        *a->norm_done = 1;
        static int said;
        if (!said) {
            said = 1;
            log_info("gdn cuda_decode: the gated output norm fused (dv %d)", w->dv);
        }
    }
    return 0;
}

const gdn_impl gdn_cuda_decode = {"cuda_decode", DEV_CUDA, 0, dec_supported, dec_run, 1};
