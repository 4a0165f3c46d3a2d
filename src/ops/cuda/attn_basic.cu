/* attn_basic.cu: attention "cuda_naive": straightforward paged GQA attention
 * over the KV pool, prefill and decode rows mixed, causal, optional output
 * gate (reference section 2.3; the same math as ref_attention.c):
 *   s_j = scale · q·k_j for j in [0, p];  o = Σ softmax(s)_j v_j;  o ·= sigmoid(gate)
 *
 * One block per (token, query head), ATT_THREADS threads: the token's
 * sequence is found in the (device) attn_seq array by its row0; positions go
 * in chunks of ATT_CHUNK: a warp per position computes q·k (lanes over the
 * head dims), the chunk's scores sit in shared memory, and an online
 * softmax (running max and sum, fp32) rescales the output accumulator, which
 * thread d holds for head dim d. KV pages BF16 (or fp32), q/gate/out BF16.
 * Correct at any context length; not tuned (no split-K over the context).
 */
#include "ops/cuda/cu_util.h"
#include "ops/cuda/fwd_cuda.h"

#include <math.h>

enum { ATT_THREADS = 256, ATT_CHUNK = 256, ATT_MAXHD = 256 };

template <typename T>
__device__ __forceinline__ float att_ld(const T *p, size_t i) {
    if (sizeof(T) == 2) return __bfloat162float(((const bf16 *)p)[i]);
    return ((const float *)p)[i];
}

template <typename T>
__global__ void __launch_bounds__(ATT_THREADS)
att_naive_kernel(int n_seq, const attn_seq *__restrict__ seqs, int nh, int nkv, int hd, float scale,
                 const bf16 *__restrict__ q, const bf16 *__restrict__ gate, const T *__restrict__ K,
                 const T *__restrict__ V, int page_size, bf16 *__restrict__ out) {
    __shared__ float qs[ATT_MAXHD];
    __shared__ float sc[ATT_CHUNK];
    __shared__ float stat[2]; /* chunk max, chunk sum */
    const int t = blockIdx.x, h = blockIdx.y, kvh = h / (nh / nkv);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    /* the sequence holding row t: the last one with row0 <= t */
    int si = 0;
    for (int s = 1; s < n_seq; s++)
        if (seqs[s].row0 <= t) si = s;
    const attn_seq sq = seqs[si];
    const int pos = sq.n_past + (t - sq.row0);
    const size_t qoff = ((size_t)t * nh + h) * hd;
    for (int d = tid; d < hd; d += blockDim.x) qs[d] = __bfloat162float(q[qoff + d]);
    __syncthreads();
    const size_t kv_row = (size_t)nkv * hd;
    float m = -INFINITY, l = 0.f, acc = 0.f; /* acc: head dim tid */
    for (int j0 = 0; j0 <= pos; j0 += ATT_CHUNK) {
        const int n = min(ATT_CHUNK, pos + 1 - j0);
        for (int jj = warp; jj < n; jj += nw) {
            const int j = j0 + jj;
            const size_t off = ((size_t)sq.pages[j / page_size] * page_size + j % page_size) * kv_row +
                               (size_t)kvh * hd;
            float dot = 0.f;
            for (int d = lane; d < hd; d += 32) dot += qs[d] * att_ld(K, off + d);
            for (int o = 16; o; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
            if (lane == 0) sc[jj] = dot * scale;
        }
        __syncthreads();
        if (warp == 0) {
            float mx = -INFINITY;
            for (int jj = lane; jj < n; jj += 32) mx = fmaxf(mx, sc[jj]);
            for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float mn = fmaxf(m, mx);
            float sum = 0.f;
            for (int jj = lane; jj < n; jj += 32) {
                float p = expf(sc[jj] - mn);
                sc[jj] = p;
                sum += p;
            }
            for (int o = 16; o; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            if (lane == 0) {
                stat[0] = mn;
                stat[1] = sum;
            }
        }
        __syncthreads();
        const float mn = stat[0], corr = expf(m - mn); /* m = -inf on the first chunk: corr 0 */
        l = l * corr + stat[1];
        m = mn;
        if (tid < hd) {
            float a = acc * corr;
            for (int jj = 0; jj < n; jj++) {
                const int j = j0 + jj;
                const size_t off = ((size_t)sq.pages[j / page_size] * page_size + j % page_size) * kv_row +
                                   (size_t)kvh * hd;
                a += sc[jj] * att_ld(V, off + tid);
            }
            acc = a;
        }
        __syncthreads(); /* sc is rewritten by the next chunk */
    }
    if (tid < hd) {
        float o = acc / l;
        if (gate) o *= 1.0f / (1.0f + expf(-__bfloat162float(gate[qoff + tid])));
        out[qoff + tid] = __float2bfloat16(o);
    }
}

static int naive_supported(const dev_info *d, const attn_shape *s, char *why, size_t n) {
    if (d->kind != DEV_CUDA) {
        snprintf(why, n, "needs a CUDA device");
        return 0;
    }
    if (s->dt != ACT_BF16) {
        snprintf(why, n, "activations must be BF16");
        return 0;
    }
    if (s->head_dim > ATT_MAXHD || s->n_kv_heads < 1 || s->n_heads % s->n_kv_heads) {
        snprintf(why, n, "needs head_dim <= %d and n_heads a multiple of n_kv_heads (hd=%d nh=%d nkv=%d)",
                 ATT_MAXHD, s->head_dim, s->n_heads, s->n_kv_heads);
        return 0;
    }
    return 1;
}

static int naive_run(const attn_args *a, ls_stream s, ls_err *e) {
    if (a->dt != ACT_BF16) return errf(e, ERR_UNSUPPORTED, "attention cuda_naive: activations must be BF16");
    if (a->head_dim > ATT_MAXHD || a->n_kv_heads < 1 || a->n_heads % a->n_kv_heads)
        return errf(e, ERR_UNSUPPORTED, "attention cuda_naive: head_dim %d, heads %d/%d not supported",
                    a->head_dim, a->n_heads, a->n_kv_heads);
    if (a->n_tok <= 0) return 0;
    dim3 grid(a->n_tok, a->n_heads);
    const kv_layer *kv = a->kv;
    if (kv->dt == ACT_BF16)
        att_naive_kernel<uint16_t><<<grid, ATT_THREADS, 0, (cudaStream_t)s>>>(
            a->n_seq, a->seqs, a->n_heads, a->n_kv_heads, a->head_dim, a->scale, (const bf16 *)a->q,
            (const bf16 *)a->gate, (const uint16_t *)kv->k, (const uint16_t *)kv->v, kv->page_size,
            (bf16 *)a->out);
    else
        att_naive_kernel<float><<<grid, ATT_THREADS, 0, (cudaStream_t)s>>>(
            a->n_seq, a->seqs, a->n_heads, a->n_kv_heads, a->head_dim, a->scale, (const bf16 *)a->q,
            (const bf16 *)a->gate, (const float *)kv->k, (const float *)kv->v, kv->page_size,
            (bf16 *)a->out);
    CU_LAUNCHED(e, "attention cuda_naive");
    return 0;
}

extern "C" const attn_impl attn_cuda_naive = {"cuda_naive", DEV_CUDA, 0, naive_supported, naive_run};
