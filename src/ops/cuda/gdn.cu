/* gdn.cu: the gdn family on CUDA (Gated DeltaNet, reference/qwen35-and-nvfp4.md
 * 2.4): causal depthwise conv + SiLU with per-slot conv state, L2-normed q and
 * k (q scaled by dk^-0.5), g = -exp(A_log)·softplus(a + dt_bias), β =
 * sigmoid(b), and the delta rule on the per-slot fp32 state S [dk, dv]:
 *   S ← e^g S;  δ = β (v − Sᵀk);  S ← S + k δᵀ;  o = Sᵀ q.
 * qkv, a, b, out BF16; weights and states fp32.
 *
 * Backend cuda_recurrent (the fused per-token recurrence), two launches:
 *   (1) a thread per (sequence, channel) runs the conv over the sequence's new
 *       tokens from its state (SiLU output to an fp32 workspace, state
 *       updated), and a thread per (sequence, v head) computes g and β;
 *   (2) a block per (sequence, v head), one thread per column d of S holding
 *       that column (dk floats) in registers for the whole sequence: per token
 *       the block L2-normalises q and k in shared memory, then every thread
 *       updates its column and emits o[d]; S goes back to the slot at the end.
 * Sequence metadata: the kernels read the device array args->seqs directly
 * (gdn_seq is {slot, n_new, row0}, three int32, asserted below); the host
 * copy args->seqs_host is only validated. The fp32 workspace (conv output,
 * g and beta) is per device (cu_ws.h: indexed by cudaGetDevice, with its own
 * lock, outgrown buffers kept for captured graphs), so tensor-parallel ranks on
 * several GPUs never share a buffer.
 */
#include "ops/cuda/cu_util.h"
#include "ops/cuda/gdn_cu.h"
#include "ops/cuda/cu_ws.h"

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

enum { GDN_MAX_K = 8 };

static_assert(sizeof(gdn_seq) == 3 * sizeof(int32_t) && offsetof(gdn_seq, slot) == 0 &&
                  offsetof(gdn_seq, n_new) == 4 && offsetof(gdn_seq, row0) == 8,
              "gdn_seq must be {int32 slot, n_new, row0}: the kernels read it as int32 triples");

static cu_ws g_gws[CU_WS_MAX_DEV]; /* buffer 0: conv output [n_tok, D] then (g, β) [n_tok, nv, 2], fp32 */

__device__ __forceinline__ float bfv(const bf16 *p, size_t i) { return __bfloat162float(p[i]); }

/* (1) conv + SiLU, and g/β. grid (ceil(max(D, nv) / 128), n_seq). meta: [slot, n_new, row0] per seq. */
__global__ void gdn_conv_kernel(int D, int K, int nv, const int32_t *__restrict__ meta, const bf16 *__restrict__ qkv,
                                const bf16 *__restrict__ a, const bf16 *__restrict__ b,
                                const float *__restrict__ conv_w, const float *__restrict__ A_log,
                                const float *__restrict__ dt_bias, float *__restrict__ conv_st,
                                float *__restrict__ c, float *__restrict__ gb) {
    const int s = blockIdx.y, ch = blockIdx.x * blockDim.x + threadIdx.x;
    const int slot = meta[3 * s], T = meta[3 * s + 1], row0 = meta[3 * s + 2];
    if (ch < D) {
        float win[GDN_MAX_K], w[GDN_MAX_K];
        float *st = conv_st + ((size_t)slot * D + ch) * (K - 1);
        for (int i = 0; i < K - 1; i++) win[i] = st[i];
        for (int i = 0; i < K; i++) w[i] = conv_w[(size_t)ch * K + i];
        for (int t = 0; t < T; t++) {
            win[K - 1] = bfv(qkv, (size_t)(row0 + t) * D + ch);
            float acc = 0.f;
            for (int i = 0; i < K; i++) acc = fmaf(w[i], win[i], acc);
            c[(size_t)(row0 + t) * D + ch] = acc / (1.f + __expf(-acc));
            for (int i = 0; i < K - 1; i++) win[i] = win[i + 1];
        }
        for (int i = 0; i < K - 1; i++) st[i] = win[i];
    }
    if (ch < nv) {
        const float al = -__expf(A_log[ch]), db = dt_bias[ch];
        for (int t = 0; t < T; t++) {
            size_t r = (size_t)(row0 + t) * nv + ch;
            float x = bfv(a, r) + db;
            float sp = x > 20.f ? x : log1pf(__expf(x)); /* torch softplus threshold 20 */
            gb[2 * r] = al * sp;
            gb[2 * r + 1] = 1.f / (1.f + __expf(-bfv(b, r)));
        }
    }
}

/* (2) the recurrence. grid (nv, n_seq), block dv threads (thread d owns column d of S). */
__device__ __forceinline__ float gdn_ldS(const float *p) { return *p; }
__device__ __forceinline__ float gdn_ldS(const bf16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ void gdn_stS(float *p, float v) { *p = v; }
__device__ __forceinline__ void gdn_stS(bf16 *p, float v) { *p = __float2bfloat16_rn(v); }
/* ST: the state's storage, fp32 (gdn_state.rec) or BF16 (rec16: loaded once, rounded once at the end) */
template <int DK, class ST>
__global__ void gdn_rec_kernel(int nk, int nv, int dv, int D, const int32_t *__restrict__ meta,
                               const float *__restrict__ c, const float *__restrict__ gb, ST *__restrict__ rec,
                               bf16 *__restrict__ out) {
    __shared__ float qs[DK], ks[DK], red[32];
    const int j = blockIdx.x, s = blockIdx.y, d = threadIdx.x;
    const int slot = meta[3 * s], T = meta[3 * s + 1], row0 = meta[3 * s + 2];
    const int kh = j / (nv / nk);
    float S[DK];
    ST *Sg = rec + ((size_t)slot * nv + j) * DK * dv;
#pragma unroll
    for (int i = 0; i < DK; i++) S[i] = gdn_ldS(Sg + (size_t)i * dv + d);
    const float qscale = rsqrtf((float)DK);
    for (int t = 0; t < T; t++) {
        const float *ct = c + (size_t)(row0 + t) * D;
        float qv = 0.f, kv = 0.f;
        for (int i = d; i < DK; i += dv) {
            qs[i] = ct[(size_t)kh * DK + i];
            ks[i] = ct[(size_t)nk * DK + (size_t)kh * DK + i];
        }
        __syncthreads();
        for (int i = d; i < DK; i += dv) {
            qv += qs[i] * qs[i];
            kv += ks[i] * ks[i];
        }
        float sq = gdn_block_sum(qv, red);
        float sk = gdn_block_sum(kv, red);
        const float rq = rsqrtf(sq + 1e-6f) * qscale, rk = rsqrtf(sk + 1e-6f);
        __syncthreads(); /* every thread has read the sums' inputs */
        for (int i = d; i < DK; i += dv) {
            qs[i] *= rq;
            ks[i] *= rk;
        }
        __syncthreads();
        const float g = gb[2 * ((size_t)(row0 + t) * nv + j)], beta = gb[2 * ((size_t)(row0 + t) * nv + j) + 1];
        const float decay = __expf(g), v = ct[(size_t)2 * nk * DK + (size_t)j * dv + d];
        float m = 0.f;
#pragma unroll
        for (int i = 0; i < DK; i++) {
            S[i] *= decay;
            m = fmaf(S[i], ks[i], m);
        }
        const float delta = beta * (v - m);
        float o = 0.f;
#pragma unroll
        for (int i = 0; i < DK; i++) {
            S[i] = fmaf(ks[i], delta, S[i]);
            o = fmaf(S[i], qs[i], o);
        }
        out[((size_t)(row0 + t) * nv + j) * dv + d] = __float2bfloat16_rn(o);
        __syncthreads(); /* qs/ks are rewritten by the next token */
    }
#pragma unroll
    for (int i = 0; i < DK; i++) gdn_stS(Sg + (size_t)i * dv + d, S[i]);
}

static int rec_supported(const dev_info *d, const gdn_shape *s, char *why, size_t n) {
    if (d->kind != DEV_CUDA) {
        snprintf(why, n, "needs a CUDA device");
        return 0;
    }
    if (s->dt != ACT_BF16) {
        snprintf(why, n, "activations must be BF16");
        return 0;
    }
    if ((s->dk != 32 && s->dk != 64 && s->dk != 128 && s->dk != 256) || s->dv < 32 || s->dv > 1024 || s->dv % 32 || s->conv_k < 1 ||
        s->conv_k > GDN_MAX_K || s->nk <= 0 || s->nv % s->nk) {
        snprintf(why, n, "needs dk 32/64/128/256, dv a multiple of 32 up to 1024, conv <= %d, nv %% nk == 0 "
                         "(dk=%d dv=%d conv=%d %d/%d)", GDN_MAX_K, s->dk, s->dv, s->conv_k, s->nv, s->nk);
        return 0;
    }
    return 1;
}

static int rec_run(const gdn_args *a, ls_stream s, ls_err *e) {
    const gdn_w *w = a->w;
    gdn_shape sh;
    dev_info dv0;
    const int rc0 = cu_gdn_begin(a, rec_supported, "cuda_recurrent", &sh, &dv0, e);
    if (rc0) return rc0 < 0 ? rc0 : 0;
    const int D = 2 * w->nk * w->dk + w->nv * w->dv;
    int dev = 0, rc = cu_ws_device("gdn", &dev, e);
    if (rc) return rc;
    cu_ws *ws = &g_gws[dev];
    /* validation on the host copy; the kernels read the device array itself */
    if (!a->seqs_host) return errf(e, ERR_INVAL, "gdn cuda_recurrent: seqs_host (the host copy of the sequences) is not set");
    for (int i = 0; i < a->n_seq; i++) {
        const gdn_seq *q = &a->seqs_host[i];
        if (q->slot < 0 || q->slot >= a->st->n_slots || q->n_new < 0 || q->row0 < 0 || q->row0 + q->n_new > a->n_tok)
            return errf(e, ERR_INVAL, "gdn: sequence %d (slot %d, rows %d+%d) outside the batch", i, q->slot, q->row0,
                        q->n_new);
    }
    const int32_t *meta = (const int32_t *)a->seqs;
    cu_ws_lock(ws);
    cudaStream_t st = (cudaStream_t)s;
    size_t cbytes = sizeof(float) * ((size_t)a->n_tok * D + (size_t)a->n_tok * w->nv * 2);
    float *cw = (float *)cu_ws_get(ws, 0, cbytes, 0, st, "gdn", e);
    if (!cw) rc = e->code ? e->code : ERR_NOMEM;
    cudaError_t c = cudaSuccess;
    if (!rc) {
        float *gb = cw + (size_t)a->n_tok * D;
        int wide = D > w->nv ? D : w->nv;
        dim3 g1((wide + 127) / 128, a->n_seq), g2(w->nv, a->n_seq);
        gdn_conv_kernel<<<g1, 128, 0, st>>>(D, w->conv_k, w->nv, meta, (const bf16 *)a->qkv, (const bf16 *)a->a,
                                            (const bf16 *)a->b, w->conv_w, w->A_log, w->dt_bias, a->st->conv, cw, gb);
#define GDN_REC(DK)                                                                                              \
    if (a->st->rec16)                                                                                            \
        gdn_rec_kernel<DK, bf16><<<g2, w->dv, 0, st>>>(w->nk, w->nv, w->dv, D, meta, cw, gb, (bf16 *)a->st->rec16, \
                                                       (bf16 *)a->out);                                          \
    else                                                                                                         \
        gdn_rec_kernel<DK, float><<<g2, w->dv, 0, st>>>(w->nk, w->nv, w->dv, D, meta, cw, gb, a->st->rec, (bf16 *)a->out)
        switch (w->dk) {
        case 32: GDN_REC(32); break;
        case 64: GDN_REC(64); break;
        case 128: GDN_REC(128); break;
        default: GDN_REC(256); break; /* rec_supported admits 32/64/128/256 only */
        }
#undef GDN_REC
        c = cudaGetLastError();
    }
    if (!rc && c != cudaSuccess) rc = cu_fail(e, c, "gdn cuda_recurrent");
    cu_ws_unlock(ws);
    return rc;
}

const gdn_impl gdn_cuda_recurrent = {"cuda_recurrent", DEV_CUDA, 0, rec_supported, rec_run, 1};
