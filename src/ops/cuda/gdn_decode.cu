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
 * Per token the warp
 *   - runs the conv of its k head's q and k channels (dk / 32 of each per lane) and of its
 *     own 16 v channels from the conv window kept in registers (SiLU output),
 *   - L2-normalises q (· dk^-0.5) and k: sums of squares, and k·q, by warp shuffles,
 *   - g = −exp(A_log)·softplus(a + dt_bias), β = sigmoid(b), and with the old S
 *       m = Sᵀk,  p = Sᵀq  (partial over the lane's rows, then 2 shuffles over rg),
 *       δ = β (v − e^g m),  o = e^g p + (k·q) δ,  S ← e^g S + k δᵀ,
 *     which is S ← e^g S; δ = β(v − Sᵀk); S ← S + kδᵀ; o = Sᵀq of the reference rearranged
 *     so that one pass over S gives both products (the same fp32 math up to rounding order).
 * No block-wide barrier in the token loop: a warp shares nothing with the others but its k
 * head's q/k conv state, which every warp of the k head reads (the conv is recomputed by
 * each, a few FMAs). So that no warp reads it after it has been rolled, the blocks of one k
 * head form a thread block cluster (sm_90): after the token loop the cluster barrier, then
 * warp 0 of the cluster's first block writes the new q/k window; each warp writes its own v
 * channels' window and S slice. Block = NW warps of one v head, cluster = the ratio·dv/16/NW
 * blocks of one k head (at most 8, NW chosen for that), grid (nk · cluster, n_seq).
 * A sequence's tokens run one after the other in its warps (the next token's inputs loaded
 * while the current one is worked on); long prompts are cuda_chunked's job.
 *
 * Sequence metadata: the kernel reads the device array args->seqs ({slot, n_new, row0} int32
 * triples); seqs_host is validated. No workspace, no host sync: capture-safe.
 * Supported: sm_90+, BF16 activations, dk 32/64/128, dv a multiple of 16, conv_k 4.
 */
#include "ops/cuda/cu_util.h"

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum { GD_K = 4, GD_MAX_NW = 8, GD_MAX_CLUSTER = 8, GD_WC = 16 /* value columns per warp */ };

static_assert(sizeof(gdn_seq) == 3 * sizeof(int32_t) && offsetof(gdn_seq, slot) == 0 &&
                  offsetof(gdn_seq, n_new) == 4 && offsetof(gdn_seq, row0) == 8,
              "gdn_seq must be {int32 slot, n_new, row0}: the kernel reads it as int32 triples");

__device__ __forceinline__ float gd_bf(const bf16 *p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ float gd_silu(float x) { return x / (1.f + expf(-x)); }

/* c = silu(Σ_i w[i]·win[i] + w[K−1]·x) over the window (oldest first), then the window slides. */
__device__ __forceinline__ float gd_conv(const float *__restrict__ wrow, float win[GD_K - 1], float x) {
    const float4 w = __ldg(reinterpret_cast<const float4 *>(wrow));
    float acc = w.x * win[0];
    acc = fmaf(w.y, win[1], acc);
    acc = fmaf(w.z, win[2], acc);
    acc = fmaf(w.w, x, acc);
    win[0] = win[1];
    win[1] = win[2];
    win[2] = x;
    return gd_silu(acc);
}

/* grid (nk · cl, n_seq), block NW · 32 threads, cluster (cl, 1, 1); dynamic shared memory
 * NW · (2·DK + GD_WC) floats: per warp q [DK], k [DK] (normalised) and v [GD_WC] of the token. */
template <int DK>
__global__ void __launch_bounds__(GD_MAX_NW * 32, 1)
    gd_kernel(int nk, int nv, int dv, int D, int cl, const int32_t *__restrict__ meta, const bf16 *__restrict__ qkv,
              const bf16 *__restrict__ a, const bf16 *__restrict__ b, const float *__restrict__ conv_w,
              const float *__restrict__ A_log, const float *__restrict__ dt_bias, float *conv_st, /* read, then rolled: not restrict */
              float *__restrict__ rec, bf16 *__restrict__ out) {
    constexpr int K = GD_K, CH = DK / 32, RPL = DK / 8;
    extern __shared__ float4 gd_sh4[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, rg = lane >> 2, cg = lane & 3;
    float *qs = reinterpret_cast<float *>(gd_sh4) + warp * (2 * DK + GD_WC), *ks = qs + DK, *vs = ks + DK;
    const int s = blockIdx.y;
    const int slot = meta[3 * s], T = meta[3 * s + 1], row0 = meta[3 * s + 2];
    if (T <= 0) return; /* the whole cluster (one sequence) leaves together */
    const int nsl = dv / GD_WC, gw = blockIdx.x * (blockDim.x >> 5) + warp;
    const int j = gw / nsl, cs = gw - j * nsl, kh = blockIdx.x / cl;
    const int col = cs * GD_WC + 4 * cg, vl = lane & (GD_WC - 1);

    /* S [DK, dv] of (slot, j): rows rg·RPL + n, columns col .. col + 3 */
    float *__restrict__ Sg = rec + ((size_t)slot * nv + j) * DK * dv + col + (size_t)rg * RPL * dv;
    float4 S[RPL];
#pragma unroll
    for (int n = 0; n < RPL; n++) S[n] = *reinterpret_cast<const float4 *>(Sg + (size_t)n * dv);

    /* conv windows: q/k channels lane·CH .. + CH − 1 of head kh, v channel of column cs·GD_WC + vl
     * (lanes vl and vl + 16 both run it; the first one publishes it) */
    const int qch = kh * DK + lane * CH, kch = nk * DK + qch, vch = 2 * nk * DK + j * dv + cs * GD_WC + vl;
    const float *stq = conv_st + ((size_t)slot * D + qch) * (K - 1);
    const float *stk = conv_st + ((size_t)slot * D + kch) * (K - 1);
    float *stv = conv_st + ((size_t)slot * D + vch) * (K - 1);
    float wq[CH][K - 1], wk[CH][K - 1], wv[K - 1];
#pragma unroll
    for (int c = 0; c < CH; c++)
#pragma unroll
        for (int i = 0; i < K - 1; i++) {
            wq[c][i] = stq[c * (K - 1) + i];
            wk[c][i] = stk[c * (K - 1) + i];
        }
#pragma unroll
    for (int i = 0; i < K - 1; i++) wv[i] = stv[i];

    const float qscale = rsqrtf((float)DK), al = -expf(A_log[j]), db = dt_bias[j];
    /* this token's raw inputs, loaded one token ahead */
    float xq[CH], xk[CH], xv, xa, xb;
    {
        const bf16 *r = qkv + (size_t)row0 * D;
#pragma unroll
        for (int c = 0; c < CH; c++) {
            xq[c] = __bfloat162float(r[qch + c]);
            xk[c] = __bfloat162float(r[kch + c]);
        }
        xv = __bfloat162float(r[vch]);
        xa = gd_bf(a, (size_t)row0 * nv + j);
        xb = gd_bf(b, (size_t)row0 * nv + j);
    }
    for (int t = 0; t < T; t++) {
        const int row = row0 + t;
        float cq[CH], ck[CH], cv;
#pragma unroll
        for (int c = 0; c < CH; c++) {
            cq[c] = xq[c];
            ck[c] = xk[c];
        }
        cv = xv;
        const float ca = xa, cb = xb;
        if (t + 1 < T) {
            const bf16 *r = qkv + (size_t)(row + 1) * D;
#pragma unroll
            for (int c = 0; c < CH; c++) {
                xq[c] = __bfloat162float(r[qch + c]);
                xk[c] = __bfloat162float(r[kch + c]);
            }
            xv = __bfloat162float(r[vch]);
            xa = gd_bf(a, (size_t)(row + 1) * nv + j);
            xb = gd_bf(b, (size_t)(row + 1) * nv + j);
        }
        /* conv + SiLU; sums of squares and k·q over the head (all lanes get them) */
        float ssq = 0.f, ssk = 0.f, sqk = 0.f;
#pragma unroll
        for (int c = 0; c < CH; c++) {
            cq[c] = gd_conv(conv_w + (size_t)(qch + c) * K, wq[c], cq[c]);
            ck[c] = gd_conv(conv_w + (size_t)(kch + c) * K, wk[c], ck[c]);
            ssq = fmaf(cq[c], cq[c], ssq);
            ssk = fmaf(ck[c], ck[c], ssk);
            sqk = fmaf(cq[c], ck[c], sqk);
        }
        cv = gd_conv(conv_w + (size_t)vch * K, wv, cv);
#pragma unroll
        for (int o = 16; o; o >>= 1) {
            ssq += __shfl_xor_sync(0xffffffffu, ssq, o);
            ssk += __shfl_xor_sync(0xffffffffu, ssk, o);
            sqk += __shfl_xor_sync(0xffffffffu, sqk, o);
        }
        const float rq = rsqrtf(ssq + 1e-6f) * qscale, rk = rsqrtf(ssk + 1e-6f);
        const float kq = sqk * rq * rk;
#pragma unroll
        for (int c = 0; c < CH; c++) {
            qs[lane * CH + c] = cq[c] * rq;
            ks[lane * CH + c] = ck[c] * rk;
        }
        if (lane < GD_WC) vs[lane] = cv;
        const float x = ca + db;
        const float g = al * (x > 20.f ? x : log1pf(expf(x))); /* torch softplus threshold 20 */
        const float beta = 1.f / (1.f + expf(-cb)), decay = expf(g);
        __syncwarp();

        /* m = Sᵀk and p = Sᵀq for the lane's 4 columns, from the old S */
        float m[4] = {0.f, 0.f, 0.f, 0.f}, p[4] = {0.f, 0.f, 0.f, 0.f};
        const float4 *k4 = reinterpret_cast<const float4 *>(ks + rg * RPL);
        const float4 *q4 = reinterpret_cast<const float4 *>(qs + rg * RPL);
#pragma unroll
        for (int n4 = 0; n4 < RPL / 4; n4++) {
            const float4 kk = k4[n4], qq = q4[n4];
            const float kv[4] = {kk.x, kk.y, kk.z, kk.w}, qv[4] = {qq.x, qq.y, qq.z, qq.w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const float4 r = S[4 * n4 + e];
                m[0] = fmaf(r.x, kv[e], m[0]);
                m[1] = fmaf(r.y, kv[e], m[1]);
                m[2] = fmaf(r.z, kv[e], m[2]);
                m[3] = fmaf(r.w, kv[e], m[3]);
                p[0] = fmaf(r.x, qv[e], p[0]);
                p[1] = fmaf(r.y, qv[e], p[1]);
                p[2] = fmaf(r.z, qv[e], p[2]);
                p[3] = fmaf(r.w, qv[e], p[3]);
            }
        }
#pragma unroll
        for (int o = 4; o <= 16; o <<= 1)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                m[c] += __shfl_xor_sync(0xffffffffu, m[c], o);
                p[c] += __shfl_xor_sync(0xffffffffu, p[c], o);
            }
        float dl[4], o4[4];
#pragma unroll
        for (int c = 0; c < 4; c++) {
            dl[c] = beta * (vs[4 * cg + c] - decay * m[c]);
            o4[c] = fmaf(decay, p[c], kq * dl[c]);
        }
        /* S ← e^g S + k δᵀ */
#pragma unroll
        for (int n4 = 0; n4 < RPL / 4; n4++) {
            const float4 kk = k4[n4];
            const float kv[4] = {kk.x, kk.y, kk.z, kk.w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float4 &r = S[4 * n4 + e];
                r.x = fmaf(kv[e], dl[0], r.x * decay);
                r.y = fmaf(kv[e], dl[1], r.y * decay);
                r.z = fmaf(kv[e], dl[2], r.z * decay);
                r.w = fmaf(kv[e], dl[3], r.w * decay);
            }
        }
        /* every rg holds the 4 columns' sums: lane (rg < 4, cg) writes column col + rg */
        const float ov = rg == 0 ? o4[0] : rg == 1 ? o4[1] : rg == 2 ? o4[2] : o4[3];
        if (rg < 4) out[((size_t)row * nv + j) * dv + col + rg] = __float2bfloat16_rn(ov);
        __syncwarp(); /* qs, ks, vs are rewritten by the next token */
    }
#pragma unroll
    for (int n = 0; n < RPL; n++) *reinterpret_cast<float4 *>(Sg + (size_t)n * dv) = S[n];
#pragma unroll
    for (int i = 0; i < K - 1; i++)
        if (lane < GD_WC) stv[i] = wv[i];
    /* every warp of the k head has read the old q/k window: the first one writes the new one */
    asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;\n" ::: "memory");
    if (blockIdx.x % cl == 0 && warp == 0) {
        float *q = conv_st + ((size_t)slot * D + qch) * (K - 1), *k = conv_st + ((size_t)slot * D + kch) * (K - 1);
#pragma unroll
        for (int c = 0; c < CH; c++)
#pragma unroll
            for (int i = 0; i < K - 1; i++) {
                q[c * (K - 1) + i] = wq[c][i];
                k[c * (K - 1) + i] = wk[c][i];
            }
    }
}

/* Warps per block: the fewest that divide dv / GD_WC and leave at most GD_MAX_CLUSTER blocks per
 * k head. 0 when none. */
static int gd_warps(int nk, int nv, int dv) {
    const int nsl = dv / GD_WC, wk = (nv / nk) * nsl;
    for (int nw = 1; nw <= GD_MAX_NW; nw++)
        if (nsl % nw == 0 && wk / nw <= GD_MAX_CLUSTER) return nw;
    return 0;
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
    if (!gd_warps(s->nk, s->nv, s->dv)) {
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

template <int DK>
static cudaError_t gd_launch(const gdn_args *a, int nw, int cl, cudaStream_t st) {
    const gdn_w *w = a->w;
    const int D = 2 * w->nk * w->dk + w->nv * w->dv;
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDim = dim3(w->nk * cl, a->n_seq, 1);
    cfg.blockDim = dim3(nw * 32, 1, 1);
    cfg.dynamicSmemBytes = sizeof(float) * nw * (2 * DK + GD_WC);
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    memset(at, 0, sizeof at);
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = cl;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, gd_kernel<DK>, w->nk, w->nv, w->dv, D, cl, (const int32_t *)a->seqs,
                              (const bf16 *)a->qkv, (const bf16 *)a->a, (const bf16 *)a->b, w->conv_w, w->A_log,
                              w->dt_bias, a->st->conv, a->st->rec, (bf16 *)a->out);
}

static int dec_run(const gdn_args *a, ls_stream s, ls_err *e) {
    const gdn_w *w = a->w;
    gdn_shape sh = {a->n_tok, a->n_seq, w->nk, w->nv, w->dk, w->dv, w->conv_k, a->dt};
    dev_info d0;
    memset(&d0, 0, sizeof d0);
    d0.kind = DEV_CUDA;
    char why[200];
    if (!dec_supported(&d0, &sh, why, sizeof why)) return errf(e, ERR_UNSUPPORTED, "gdn cuda_decode: %s", why);
    if (a->n_tok <= 0 || a->n_seq <= 0) return 0;
    if (!a->seqs_host)
        return errf(e, ERR_INVAL, "gdn cuda_decode: seqs_host (the host copy of the sequences) is not set");
    for (int i = 0; i < a->n_seq; i++) {
        const gdn_seq *q = &a->seqs_host[i];
        if (q->slot < 0 || q->slot >= a->st->n_slots || q->n_new < 0 || q->row0 < 0 || q->row0 + q->n_new > a->n_tok)
            return errf(e, ERR_INVAL, "gdn: sequence %d (slot %d, rows %d+%d) outside the batch", i, q->slot, q->row0,
                        q->n_new);
    }
    if (((uintptr_t)a->st->rec | (uintptr_t)w->conv_w) & 15)
        return errf(e, ERR_UNSUPPORTED, "gdn cuda_decode: the recurrent state and conv weights must be 16-byte aligned");
    const int nw = gd_warps(w->nk, w->nv, w->dv), cl = (w->nv / w->nk) * (w->dv / GD_WC) / nw;
    cudaStream_t st = (cudaStream_t)s;
    cudaError_t c;
    switch (w->dk) {
    case 32: c = gd_launch<32>(a, nw, cl, st); break;
    case 64: c = gd_launch<64>(a, nw, cl, st); break;
    default: c = gd_launch<128>(a, nw, cl, st); break; /* dec_supported admits 32/64/128 only */
    }
    if (c == cudaSuccess) c = cudaGetLastError();
    return c == cudaSuccess ? 0 : cu_fail(e, c, "gdn cuda_decode");
}

const gdn_impl gdn_cuda_decode = {"cuda_decode", DEV_CUDA, 0, dec_supported, dec_run, 1};
