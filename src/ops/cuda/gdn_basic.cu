/* gdn_basic.cu: gdn "cuda_recurrent": the Gated DeltaNet core run token by
 * token (reference section 2.4; the same math as ref_gdn.c):
 *   c_t  = silu(causal depthwise conv1d over [conv state | new inputs])
 *   q, k = l2norm(c_t[q]) · dk^-0.5, l2norm(c_t[k])     (x·rsqrt(Σx² + 1e-6))
 *   g    = -exp(A_log)·softplus(a + dt_bias), β = sigmoid(b)
 *   per value head j:  S ← e^g S;  δ = β(v − Sᵀk);  S ← S + k δᵀ;  o = Sᵀq
 *
 * Two launches per call:
 *   conv:      grid (sequence, channel block): a thread per channel runs the
 *              window over the sequence's new tokens, writes silu(conv) in
 *              fp32 to a scratch buffer and the last K-1 inputs back to the
 *              slot's conv state (the q/k channels are shared by several value
 *              heads, hence a separate pass).
 *   recurrent: grid (sequence, value head), a thread per value dim d holding
 *              column d of the fp32 state S [dk, dv] in registers (dk <= 256),
 *              q and k normed in shared memory; S goes back to the slot at the end.
 * Scratch: per device an fp32 buffer [n_tok, conv_dim], grown on first use
 * (under the device's mutex; calls on one device are serialised by it).
 */
#include "ops/cuda/cu_util.h"
#include "ops/cuda/fwd_cuda.h"

#include <pthread.h>

enum { GDN_CONV_THREADS = 128, GDN_MAXK = 8 };

__device__ __forceinline__ float gd_silu(float x) { return x / (1.0f + expf(-x)); }

__global__ void gdn_conv_kernel(const gdn_seq *__restrict__ seqs, int D, int K, const bf16 *__restrict__ qkv,
                                const float *__restrict__ conv_w, float *conv_state, float *__restrict__ c) {
    const gdn_seq sq = seqs[blockIdx.x];
    const int ch = blockIdx.y * blockDim.x + threadIdx.x;
    if (ch >= D) return;
    float win[GDN_MAXK], w[GDN_MAXK];
    float *st = conv_state + ((size_t)sq.slot * D + ch) * (K - 1);
    for (int j = 0; j < K - 1; j++) win[j] = st[j];
    for (int j = 0; j < K; j++) w[j] = conv_w[(size_t)ch * K + j];
    for (int t = 0; t < sq.n_new; t++) {
        const size_t row = (size_t)(sq.row0 + t);
        win[K - 1] = __bfloat162float(qkv[row * D + ch]);
        float s = 0.f;
        for (int j = 0; j < K; j++) s += w[j] * win[j];
        c[row * D + ch] = gd_silu(s);
        for (int j = 0; j < K - 1; j++) win[j] = win[j + 1];
    }
    for (int j = 0; j < K - 1; j++) st[j] = win[j];
}

__device__ float gd_block_sum(float v, float *part) {
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    __syncthreads();
    if (l == 0) part[w] = v;
    __syncthreads();
    float t = 0.f;
    for (int i = 0; i < nw; i++) t += part[i];
    return t;
}

template <int MAXDK>
__global__ void gdn_rec_kernel(const gdn_seq *__restrict__ seqs, int nk, int nv, int dk, int dv, int D,
                               const float *__restrict__ c, const bf16 *__restrict__ a_in,
                               const bf16 *__restrict__ b_in, const float *__restrict__ A_log,
                               const float *__restrict__ dt_bias, float *rec, bf16 *__restrict__ out) {
    __shared__ float qs[MAXDK], ks[MAXDK];
    __shared__ float part[32];
    const gdn_seq sq = seqs[blockIdx.x];
    const int j = blockIdx.y, kh = j / (nv / nk), d = threadIdx.x;
    const bool act = d < dv;
    float S[MAXDK];
    float *Sg = rec + (((size_t)sq.slot * nv + j) * dk) * dv;
#pragma unroll
    for (int i = 0; i < MAXDK; i++) S[i] = (act && i < dk) ? Sg[(size_t)i * dv + d] : 0.f;
    const float qscale = rsqrtf((float)dk);
    const float A = -expf(A_log[j]), bias = dt_bias[j];
    for (int t = 0; t < sq.n_new; t++) {
        const size_t row = (size_t)(sq.row0 + t);
        const float *ct = c + row * D;
        float sq_q = 0.f, sq_k = 0.f;
        for (int i = threadIdx.x; i < dk; i += blockDim.x) {
            float qv = ct[(size_t)kh * dk + i], kv = ct[(size_t)nk * dk + (size_t)kh * dk + i];
            qs[i] = qv;
            ks[i] = kv;
            sq_q += qv * qv;
            sq_k += kv * kv;
        }
        const float rq = rsqrtf(gd_block_sum(sq_q, part) + 1e-6f) * qscale;
        const float rk = rsqrtf(gd_block_sum(sq_k, part) + 1e-6f);
        const float av = __bfloat162float(a_in[row * nv + j]) + bias;
        const float sp = av > 20.f ? av : log1pf(expf(av));
        const float decay = expf(A * sp);
        const float beta = 1.0f / (1.0f + expf(-__bfloat162float(b_in[row * nv + j])));
        const float v = act ? ct[(size_t)2 * nk * dk + (size_t)j * dv + d] : 0.f;
        float m = 0.f;
#pragma unroll
        for (int i = 0; i < MAXDK; i++)
            if (i < dk) {
                S[i] *= decay;
                m += S[i] * (ks[i] * rk);
            }
        const float delta = beta * (v - m);
        float o = 0.f;
#pragma unroll
        for (int i = 0; i < MAXDK; i++)
            if (i < dk) {
                S[i] += (ks[i] * rk) * delta;
                o += S[i] * (qs[i] * rq);
            }
        if (act) out[(row * nv + j) * dv + d] = __float2bfloat16(o);
        __syncthreads(); /* qs/ks are rewritten by the next token */
    }
    if (act)
#pragma unroll
        for (int i = 0; i < MAXDK; i++)
            if (i < dk) Sg[(size_t)i * dv + d] = S[i];
}

enum { GDN_MAX_DEV = 16 };
static pthread_mutex_t g_mu[GDN_MAX_DEV] = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
    PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER};
static float *g_scratch_dev[GDN_MAX_DEV];
static size_t g_scratch_n_dev[GDN_MAX_DEV];

static int rec_supported(const dev_info *d, const gdn_shape *s, char *why, size_t n) {
    if (d->kind != DEV_CUDA) {
        snprintf(why, n, "needs a CUDA device");
        return 0;
    }
    if (s->dt != ACT_BF16) {
        snprintf(why, n, "activations must be BF16");
        return 0;
    }
    if (s->dk > 256 || s->dv > 1024 || s->conv_k > GDN_MAXK || s->conv_k < 1 || s->nk < 1 || s->nv % s->nk) {
        snprintf(why, n, "needs dk <= 256, dv <= 1024, conv kernel <= %d, nv a multiple of nk "
                 "(dk=%d dv=%d K=%d nk=%d nv=%d)", GDN_MAXK, s->dk, s->dv, s->conv_k, s->nk, s->nv);
        return 0;
    }
    return 1;
}

static int rec_run_locked(const gdn_args *a, cudaStream_t st, int dev, ls_err *e) {
    float *&g_scratch = g_scratch_dev[dev];
    size_t &g_scratch_n = g_scratch_n_dev[dev];
    const gdn_w *w = a->w;
    const int D = 2 * w->nk * w->dk + w->nv * w->dv;
    const size_t need = (size_t)a->n_tok * D;
    if (need > g_scratch_n) {
        if (g_scratch) {
            cudaStreamSynchronize(st);
            cudaFree(g_scratch);
        }
        g_scratch = NULL;
        g_scratch_n = 0;
        CU_TRY(e, cudaMalloc(&g_scratch, need * sizeof(float)), "gdn cuda_recurrent scratch");
        g_scratch_n = need;
    }
    dim3 gc(a->n_seq, (D + GDN_CONV_THREADS - 1) / GDN_CONV_THREADS);
    gdn_conv_kernel<<<gc, GDN_CONV_THREADS, 0, st>>>(a->seqs, D, w->conv_k, (const bf16 *)a->qkv, w->conv_w,
                                                     a->st->conv, g_scratch);
    CU_LAUNCHED(e, "gdn cuda_recurrent conv");
    dim3 gr(a->n_seq, w->nv);
    const int thr = ((w->dv + 31) / 32) * 32;
#define GDN_REC(MAXDK)                                                                                   \
    gdn_rec_kernel<MAXDK><<<gr, thr, 0, st>>>(a->seqs, w->nk, w->nv, w->dk, w->dv, D, g_scratch,         \
                                              (const bf16 *)a->a, (const bf16 *)a->b, w->A_log,          \
                                              w->dt_bias, a->st->rec, (bf16 *)a->out)
    if (w->dk <= 32)
        GDN_REC(32);
    else if (w->dk <= 64)
        GDN_REC(64);
    else if (w->dk <= 128)
        GDN_REC(128);
    else
        GDN_REC(256);
#undef GDN_REC
    CU_LAUNCHED(e, "gdn cuda_recurrent delta rule");
    return 0;
}

static int rec_run(const gdn_args *a, ls_stream s, ls_err *e) {
    const gdn_w *w = a->w;
    gdn_shape sh = {a->n_tok, a->n_seq, w->nk, w->nv, w->dk, w->dv, w->conv_k, a->dt};
    dev_info d;
    memset(&d, 0, sizeof d);
    d.kind = DEV_CUDA;
    char why[200];
    if (!rec_supported(&d, &sh, why, sizeof why)) return errf(e, ERR_UNSUPPORTED, "gdn cuda_recurrent: %s", why);
    if (a->n_tok <= 0 || a->n_seq <= 0) return 0;
    int dev = 0;
    CU_TRY(e, cudaGetDevice(&dev), "cudaGetDevice");
    if (dev < 0 || dev >= GDN_MAX_DEV) return errf(e, ERR_UNSUPPORTED, "gdn cuda_recurrent: device %d >= %d", dev, GDN_MAX_DEV);
    pthread_mutex_lock(&g_mu[dev]);
    int rc = rec_run_locked(a, (cudaStream_t)s, dev, e);
    pthread_mutex_unlock(&g_mu[dev]);
    return rc;
}

extern "C" const gdn_impl gdn_cuda_recurrent = {"cuda_recurrent", DEV_CUDA, 0, rec_supported, rec_run};
