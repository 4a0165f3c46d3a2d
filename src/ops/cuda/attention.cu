/* attention.cu: the attention family on CUDA: causal GQA over the paged KV
 * pool, decode rows and prefill chunks mixed in one call, optional output
 * gate out *= sigmoid(gate); q, gate, out, K, V BF16; softmax and the
 * accumulation in fp32 (online softmax).
 *
 * Metadata, two ways (ops.h attn_args):
 *   host planning (ctx_cap == 0): args->seqs_host and each of its page lists
 *     (host memory) are read on the host; the launcher flattens them into one
 *     table (per token: position, pointer to its sequence's page list) and
 *     copies it to a per-device workspace (one per cudaGetDevice ordinal) each
 *     call; split-K uses chunks of 256 positions up to the batch's longest
 *     context. The device-side args->seqs is not read.
 *   device planning (ctx_cap > 0, for CUDA graph capture): a one-block kernel
 *     builds the same table from the device args->seqs into the caller's
 *     scratch; the split count is fixed from ctx_cap (attn_cuda_scratch_bytes),
 *     and each token cuts its own prefix into chunks of 256 positions (longer
 *     past 256 x that count), so one recorded launch serves any context
 *     lengths up to ctx_cap, bitwise as host planning up to 32768 positions.
 *     Nothing is read on the host.
 *
 * Backends, two different algorithms:
 *   cuda_naive         one warp per (token, query head) walks its whole causal
 *                      prefix, lanes over head_dim, online softmax; the simple
 *                      one the others are compared with on the GPU.
 *   cuda_flash_decode  split-K (flash-decoding): the prefix is cut into chunks
 *                      of 256 positions; a block per (chunk, kv head, token)
 *                      runs one warp per query head of that kv head's group, so
 *                      each K/V row is fetched once for the group (L1), and
 *                      writes (max, sum, acc) partials; a second kernel merges the
 *                      chunks per (token, head) and applies the gate.
 */
#include "ops/cuda/cu_util.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ATT_MIN_CHUNK = ATT_CHUNK: under device planning a prefix up to ATT_CHUNK x the split count is
 * cut exactly as host planning cuts it, so a captured step is bitwise the eager one */
enum { ATT_MAX_HD = 512, ATT_CHUNK = 256, ATT_MAX_DEV = 16, ATT_MIN_CHUNK = ATT_CHUNK, ATT_MAX_SPLIT = 128 };

typedef struct att_ws {
    void *meta;
    size_t meta_cap;
    float *part;
    size_t part_cap;
    int32_t *h_meta;
    size_t h_cap;
    pthread_mutex_t mu;
    int init;
} att_ws;

static att_ws g_aws[ATT_MAX_DEV];
static pthread_mutex_t g_aws_mu = PTHREAD_MUTEX_INITIALIZER;

static int aws_lock(att_ws **out, ls_err *e) {
    int dev = 0;
    CU_TRY(e, cudaGetDevice(&dev), "cudaGetDevice");
    if (dev < 0 || dev >= ATT_MAX_DEV) return errf(e, ERR_UNSUPPORTED, "attention: device %d out of range", dev);
    pthread_mutex_lock(&g_aws_mu);
    if (!g_aws[dev].init) {
        pthread_mutex_init(&g_aws[dev].mu, NULL);
        g_aws[dev].init = 1;
    }
    pthread_mutex_unlock(&g_aws_mu);
    pthread_mutex_lock(&g_aws[dev].mu);
    *out = &g_aws[dev];
    return 0;
}

static int grow(void **p, size_t *cap, size_t n, ls_err *e) {
    if (*cap >= n) return 0;
    if (*p) {
        cudaDeviceSynchronize();
        cudaFree(*p);
    }
    *p = NULL;
    *cap = 0;
    CU_TRY(e, cudaMalloc(p, n), "attention workspace");
    *cap = n;
    return 0;
}

/* Host -> device metadata: [n_tok] page-list pointers (8-byte aligned, first),
 * [n_tok] positions, then the pages. */
static int upload_meta(att_ws *w, const attn_args *a, const int32_t ***d_tpg, int32_t **d_pos, int *max_ctx,
                       cudaStream_t st, ls_err *e) {
    size_t npages = 0;
    int mx = 0;
    const int P = a->kv->page_size;
    if (a->n_seq > 0 && !a->seqs_host)
        return errf(e, ERR_INVAL, "attention on CUDA: seqs_host (the host copy of the sequences) is not set");
    for (int s = 0; s < a->n_seq; s++) {
        const attn_seq *q = &a->seqs_host[s];
        if (q->row0 < 0 || q->n_new < 0 || q->row0 + q->n_new > a->n_tok || q->n_past < 0)
            return errf(e, ERR_INVAL, "attention: sequence %d rows [%d, %d) outside %d tokens", s, q->row0,
                        q->row0 + q->n_new, a->n_tok);
        int ctx = q->n_past + q->n_new;
        npages += (size_t)(ctx + P - 1) / P;
        if (ctx > mx) mx = ctx;
    }
    size_t n = 3 * (size_t)a->n_tok + npages; /* int32 units: pointers take two */
    if (w->h_cap < n) {
        free(w->h_meta);
        w->h_meta = (int32_t *)xmalloc(sizeof(int32_t) * n);
        w->h_cap = n;
    }
    int rc = grow(&w->meta, &w->meta_cap, sizeof(int32_t) * n, e);
    if (rc) return rc;
    const int32_t **tpg = (const int32_t **)w->h_meta;
    int32_t *pos = w->h_meta + 2 * (size_t)a->n_tok, *pages = pos + a->n_tok;
    const int32_t *d_pages = (const int32_t *)w->meta + 3 * (size_t)a->n_tok;
    for (int t = 0; t < a->n_tok; t++) {
        pos[t] = -1;
        tpg[t] = d_pages;
    }
    size_t at = 0;
    for (int s = 0; s < a->n_seq; s++) {
        const attn_seq *q = &a->seqs_host[s];
        int np = (q->n_past + q->n_new + P - 1) / P;
        for (int i = 0; i < np; i++) {
            if (q->pages[i] < 0 || q->pages[i] >= a->kv->n_pages)
                return errf(e, ERR_INVAL, "attention: sequence %d page %d is %d of %d", s, i, q->pages[i],
                            a->kv->n_pages);
            pages[at + i] = q->pages[i];
        }
        for (int t = 0; t < q->n_new; t++) {
            pos[q->row0 + t] = q->n_past + t;
            tpg[q->row0 + t] = d_pages + at;
        }
        at += np;
    }
    CU_TRY(e, cudaMemcpyAsync(w->meta, w->h_meta, sizeof(int32_t) * n, cudaMemcpyHostToDevice, st),
           "attention metadata");
    *d_tpg = (const int32_t **)w->meta;
    *d_pos = (int32_t *)w->meta + 2 * (size_t)a->n_tok;
    *max_ctx = mx;
    return 0;
}

/* ---- device planning (CUDA graphs) -------------------------------------------------- */

/* Splits per token for device planning: as many as ctx_cap needs in chunks of
 * ATT_MIN_CHUNK, at most ATT_MAX_SPLIT. A token's chunks are ATT_MIN_CHUNK
 * long (as host planning's) until its prefix outgrows ATT_MIN_CHUNK x splits,
 * then longer: so a replayed step is bitwise the eager one at every context up
 * to min(ctx_cap, ATT_MIN_CHUNK x ATT_MAX_SPLIT = 32768), whatever the bucket
 * (the split count once also aimed at four blocks per SM, min(that, ctx_cap /
 * 2048): a 64-token bucket got 5 splits, chunks past 1280 positions, and
 * rounded unlike eager). Blocks of chunks past a token's prefix exit at once. */
static int att_dev_nsplit(int n_tok, int n_kv_heads, int ctx_cap) {
    (void)n_tok;
    (void)n_kv_heads;
    long most = ((long)ctx_cap + ATT_MIN_CHUNK - 1) / ATT_MIN_CHUNK;
    if (most > ATT_MAX_SPLIT) most = ATT_MAX_SPLIT;
    return most < 1 ? 1 : (int)most;
}

static size_t att_align(size_t n) { return (n + 255) & ~(size_t)255; }

/* attention_prefill.cu: cuda_flash_prefill's device-planning scratch */
extern "C" size_t attn_fp_scratch_bytes(int n_tok, int n_heads, int head_dim, int ctx_cap);

/* The most any backend here needs (the model sizes one scratch for whichever it captures). */
extern "C" size_t attn_cuda_scratch_bytes(int n_tok, int n_heads, int n_kv_heads, int head_dim, int ctx_cap) {
    if (n_tok < 1 || n_kv_heads < 1 || ctx_cap < 1) return 0;
    int ns = att_dev_nsplit(n_tok, n_kv_heads, ctx_cap);
    size_t dec = att_align(sizeof(void *) * (size_t)n_tok) + att_align(sizeof(int32_t) * (size_t)n_tok) +
                 sizeof(float) * (size_t)n_tok * n_heads * ns * (head_dim + 2);
    size_t fp = attn_fp_scratch_bytes(n_tok, n_heads, head_dim, ctx_cap);
    return dec > fp ? dec : fp;
}

/* One block: pos[t] = -1 for every token, then per sequence its rows'
 * positions and page-list pointer, from the device seqs. */
__global__ void att_plan_kernel(int n_seq, const attn_seq *__restrict__ seqs, int n_tok, int32_t *__restrict__ pos,
                                const int32_t **__restrict__ tpg) {
    for (int t = threadIdx.x; t < n_tok; t += blockDim.x) pos[t] = -1;
    __syncthreads();
    for (int s = threadIdx.x; s < n_seq; s += blockDim.x) {
        const attn_seq q = seqs[s];
        for (int t = 0; t < q.n_new; t++) {
            int r = q.row0 + t;
            if (r < 0 || r >= n_tok) continue;
            pos[r] = q.n_past + t;
            tpg[r] = q.pages;
        }
    }
}

/* Device planning: the table into the scratch; *part after it. */
static int dev_plan(const attn_args *a, int nsplit, const int32_t ***d_tpg, int32_t **d_pos, float **part,
                    cudaStream_t st, ls_err *e) {
    size_t need = attn_cuda_scratch_bytes(a->n_tok, a->n_heads, a->n_kv_heads, a->head_dim, a->ctx_cap);
    if (!a->scratch || a->scratch_bytes < need)
        return errf(e, ERR_INVAL, "attention device planning: scratch of %zu bytes, %zu needed", a->scratch_bytes,
                    need);
    (void)nsplit;
    char *p = (char *)a->scratch;
    *d_tpg = (const int32_t **)p;
    p += att_align(sizeof(void *) * (size_t)a->n_tok);
    *d_pos = (int32_t *)p;
    p += att_align(sizeof(int32_t) * (size_t)a->n_tok);
    *part = (float *)p;
    att_plan_kernel<<<1, 256, 0, st>>>(a->n_seq, a->seqs, a->n_tok, *d_pos, (const int32_t **)*d_tpg);
    CU_LAUNCHED(e, "attention device planning");
    return 0;
}

/* A warp's share of head_dim: lane holds dims lane + 32·i, i < HD/32 (HD a
 * multiple of 32, at most ATT_MAX_HD). */
template <int NPL>
__device__ __forceinline__ void att_range(const bf16 *__restrict__ q, const bf16 *__restrict__ K,
                                          const bf16 *__restrict__ V, const int32_t *__restrict__ pages, int P,
                                          int nkv, int hd, int kvh, int j0, int j1, float scale, float &m, float &l,
                                          float (&acc)[NPL]) {
    const int lane = threadIdx.x & 31;
    float qv[NPL];
#pragma unroll
    for (int i = 0; i < NPL; i++) qv[i] = __bfloat162float(q[lane + 32 * i]);
    for (int j = j0; j < j1; j++) {
        size_t off = ((size_t)pages[j / P] * P + j % P) * nkv * hd + (size_t)kvh * hd;
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < NPL; i++) s = fmaf(qv[i], __bfloat162float(K[off + lane + 32 * i]), s);
#pragma unroll
        for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        s *= scale;
        float mn = fmaxf(m, s), c = __expf(m - mn), p = __expf(s - mn);
        l = l * c + p;
#pragma unroll
        for (int i = 0; i < NPL; i++) acc[i] = acc[i] * c + p * __bfloat162float(V[off + lane + 32 * i]);
        m = mn;
    }
}

/* cuda_naive: grid (n_tok, n_heads), one warp each. */
template <int NPL>
__global__ void att_naive_kernel(int nh, int nkv, int hd, int P, float scale, const bf16 *__restrict__ q,
                                 const bf16 *__restrict__ gate, const bf16 *__restrict__ K,
                                 const bf16 *__restrict__ V, const int32_t *__restrict__ pos,
                                 const int32_t *const *__restrict__ tpg, bf16 *__restrict__ out) {
    const int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
    const int p = pos[t];
    const size_t row = ((size_t)t * nh + h) * hd;
    float m = -INFINITY, l = 0.f, acc[NPL];
#pragma unroll
    for (int i = 0; i < NPL; i++) acc[i] = 0.f;
    if (p >= 0) att_range<NPL>(q + row, K, V, tpg[t], P, nkv, hd, h / (nh / nkv), 0, p + 1, scale, m, l, acc);
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        float o = l > 0.f ? acc[i] / l : 0.f;
        if (gate) o *= 1.f / (1.f + __expf(-__bfloat162float(gate[row + lane + 32 * i])));
        out[row + lane + 32 * i] = __float2bfloat16_rn(o);
    }
}

/* Chunk length for a token at position p: `chunk` when fixed (host
 * planning), else p + 1 cut into nchunk pieces (rounded up to 32, at least
 * ATT_MIN_CHUNK), so that ceil((p + 1) / len) <= nchunk. */
__device__ __forceinline__ int att_chunk_len(int chunk, int nchunk, int p) {
    if (chunk > 0) return chunk;
    int L = (p + nchunk) / nchunk;
    L = (L + 31) & ~31;
    return L < ATT_MIN_CHUNK ? ATT_MIN_CHUNK : L;
}

/* cuda_flash_decode, pass 1: grid (chunks, nkv, n_tok), block = grp warps. */
template <int NPL>
__global__ void att_split_kernel(int nh, int nkv, int hd, int P, float scale, int chunk, int nchunk,
                                 const bf16 *__restrict__ q, const bf16 *__restrict__ K, const bf16 *__restrict__ V,
                                 const int32_t *__restrict__ pos, const int32_t *const *__restrict__ tpg,
                                 float *__restrict__ part) {
    const int c = blockIdx.x, kvh = blockIdx.y, t = blockIdx.z;
    const int grp = nh / nkv, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = kvh * grp + w;
    const int p = pos[t];
    const int L = att_chunk_len(chunk, nchunk, p);
    const int j0 = c * L, j1 = min(p + 1, j0 + L);
    float m = -INFINITY, l = 0.f, acc[NPL];
#pragma unroll
    for (int i = 0; i < NPL; i++) acc[i] = 0.f;
    if (p >= 0 && j0 < j1)
        att_range<NPL>(q + ((size_t)t * nh + h) * hd, K, V, tpg[t], P, nkv, hd, kvh, j0, j1, scale, m, l, acc);
    /* partial layout per (t, h, chunk): [m, l, acc[hd]] */
    float *pp = part + (((size_t)t * nh + h) * nchunk + c) * (hd + 2);
    if (lane == 0) {
        pp[0] = m;
        pp[1] = l;
    }
#pragma unroll
    for (int i = 0; i < NPL; i++) pp[2 + lane + 32 * i] = acc[i];
}

/* pass 2: grid (n_tok, nh), one warp: merge the chunks, gate, store. */
template <int NPL>
__global__ void att_merge_kernel(int nh, int hd, int chunk, int nchunk, const int32_t *__restrict__ pos,
                                 const float *__restrict__ part, const bf16 *__restrict__ gate,
                                 bf16 *__restrict__ out) {
    const int t = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
    const int p = pos[t];
    const int len = att_chunk_len(chunk, nchunk, p);
    const int nc = p >= 0 ? (p + len) / len : 0; /* chunks holding positions 0..p */
    const float *pp = part + ((size_t)t * nh + h) * nchunk * (hd + 2);
    float M = -INFINITY;
    for (int c = 0; c < nc; c++) M = fmaxf(M, pp[(size_t)c * (hd + 2)]);
    float L = 0.f, acc[NPL];
#pragma unroll
    for (int i = 0; i < NPL; i++) acc[i] = 0.f;
    for (int c = 0; c < nc; c++) {
        const float *q = pp + (size_t)c * (hd + 2);
        float f = q[1] > 0.f ? __expf(q[0] - M) : 0.f;
        L += q[1] * f;
#pragma unroll
        for (int i = 0; i < NPL; i++) acc[i] += q[2 + lane + 32 * i] * f;
    }
    const size_t row = ((size_t)t * nh + h) * hd;
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        float o = L > 0.f ? acc[i] / L : 0.f;
        if (gate) o *= 1.f / (1.f + __expf(-__bfloat162float(gate[row + lane + 32 * i])));
        out[row + lane + 32 * i] = __float2bfloat16_rn(o);
    }
}

static int att_supported(const dev_info *d, const attn_shape *s, char *why, size_t n) {
    if (d->kind != DEV_CUDA) {
        snprintf(why, n, "needs a CUDA device");
        return 0;
    }
    if (s->dt != ACT_BF16) {
        snprintf(why, n, "activations and KV must be BF16");
        return 0;
    }
    int hd = s->head_dim;
    if ((hd != 32 && hd != 64 && hd != 128 && hd != 256 && hd != 512) || s->n_kv_heads <= 0 ||
        s->n_heads % s->n_kv_heads) {
        snprintf(why, n, "needs head_dim 32/64/128/256/512 and heads divisible by kv heads (hd=%d, %d/%d)",
                 hd, s->n_heads, s->n_kv_heads);
        return 0;
    }
    return 1;
}

static int flash_supported(const dev_info *d, const attn_shape *s, char *why, size_t n) {
    if (!att_supported(d, s, why, n)) return 0;
    if (s->n_heads / s->n_kv_heads > 32) {
        snprintf(why, n, "more than 32 query heads per kv head (%d)", s->n_heads / s->n_kv_heads);
        return 0;
    }
    return 1;
}

static int att_check(const attn_args *a, ls_err *e) {
    if (a->dt != ACT_BF16 || a->kv->dt != ACT_BF16)
        return errf(e, ERR_UNSUPPORTED, "attention on CUDA: BF16 activations and KV only");
    if (a->head_dim % 32 || a->head_dim > ATT_MAX_HD || a->n_kv_heads <= 0 || a->n_heads % a->n_kv_heads)
        return errf(e, ERR_UNSUPPORTED, "attention on CUDA: head_dim %d, %d heads over %d kv heads", a->head_dim,
                    a->n_heads, a->n_kv_heads);
    return 0;
}

#define ATT_DISPATCH(HD, CALL)                      \
    switch ((HD) / 32) {                            \
    case 1: { const int NPL = 1; CALL; } break;     \
    case 2: { const int NPL = 2; CALL; } break;     \
    case 4: { const int NPL = 4; CALL; } break;     \
    case 8: { const int NPL = 8; CALL; } break;     \
    case 16: { const int NPL = 16; CALL; } break;   \
    default: rc = errf(e, ERR_UNSUPPORTED, "attention on CUDA: head_dim %d not 32/64/128/256/512", (HD)); \
    }

static int naive_run(const attn_args *a, ls_stream s, ls_err *e) {
    int rc = att_check(a, e);
    if (rc || a->n_tok <= 0) return rc;
    att_ws *w = NULL;
    cudaStream_t st = (cudaStream_t)s;
    const int32_t **tpg;
    int32_t *pos;
    int mx;
    float *unused;
    if (a->ctx_cap > 0) {
        rc = dev_plan(a, 1, &tpg, &pos, &unused, st, e);
    } else {
        if ((rc = aws_lock(&w, e))) return rc;
        rc = upload_meta(w, a, &tpg, &pos, &mx, st, e);
    }
    if (!rc) {
        dim3 grid(a->n_tok, a->n_heads);
        const bf16 *q = (const bf16 *)a->q, *g = (const bf16 *)a->gate;
        const bf16 *K = (const bf16 *)a->kv->k, *V = (const bf16 *)a->kv->v;
        ATT_DISPATCH(a->head_dim, (att_naive_kernel<NPL><<<grid, 32, 0, st>>>(
                                      a->n_heads, a->n_kv_heads, a->head_dim, a->kv->page_size, a->scale, q, g, K, V,
                                      pos, tpg, (bf16 *)a->out)));
        cudaError_t c = cudaGetLastError();
        if (!rc && c != cudaSuccess) rc = cu_fail(e, c, "attention cuda_naive");
    }
    if (w) pthread_mutex_unlock(&w->mu);
    return rc;
}

static int flash_run(const attn_args *a, ls_stream s, ls_err *e) {
    int rc = att_check(a, e);
    if (rc || a->n_tok <= 0) return rc;
    const int grp = a->n_heads / a->n_kv_heads;
    if (grp > 32) return errf(e, ERR_UNSUPPORTED, "cuda_flash_decode: %d query heads per kv head > 32", grp);
    att_ws *w = NULL;
    cudaStream_t st = (cudaStream_t)s;
    const int32_t **tpg;
    int32_t *pos;
    float *part = NULL;
    int chunk, nchunk;
    if (a->ctx_cap > 0) { /* device planning: fixed split count, per-token chunk length */
        chunk = 0;
        nchunk = att_dev_nsplit(a->n_tok, a->n_kv_heads, a->ctx_cap);
        rc = dev_plan(a, nchunk, &tpg, &pos, &part, st, e);
    } else {
        if ((rc = aws_lock(&w, e))) return rc;
        int mx = 0;
        rc = upload_meta(w, a, &tpg, &pos, &mx, st, e);
        chunk = ATT_CHUNK;
        nchunk = (mx + ATT_CHUNK - 1) / ATT_CHUNK;
        if (nchunk < 1) nchunk = 1;
        size_t pbytes = sizeof(float) * (size_t)a->n_tok * a->n_heads * nchunk * (a->head_dim + 2);
        if (!rc) rc = grow((void **)&w->part, &w->part_cap, pbytes, e);
        part = w->part;
    }
    if (!rc) {
        const bf16 *q = (const bf16 *)a->q, *g = (const bf16 *)a->gate;
        const bf16 *K = (const bf16 *)a->kv->k, *V = (const bf16 *)a->kv->v;
        dim3 g1(nchunk, a->n_kv_heads, a->n_tok), g2(a->n_tok, a->n_heads);
        ATT_DISPATCH(a->head_dim, (att_split_kernel<NPL><<<g1, 32 * grp, 0, st>>>(
                                       a->n_heads, a->n_kv_heads, a->head_dim, a->kv->page_size, a->scale, chunk,
                                       nchunk, q, K, V, pos, tpg, part),
                                   att_merge_kernel<NPL><<<g2, 32, 0, st>>>(a->n_heads, a->head_dim, chunk, nchunk,
                                                                          pos, part, g, (bf16 *)a->out)));
        cudaError_t c = cudaGetLastError();
        if (!rc && c != cudaSuccess) rc = cu_fail(e, c, "attention cuda_flash_decode");
    }
    if (w) pthread_mutex_unlock(&w->mu);
    return rc;
}

/* graph_safe: with ctx_cap > 0 (device planning) both only launch kernels */
const attn_impl attn_cuda_flash_decode = {"cuda_flash_decode", DEV_CUDA, 0, flash_supported, flash_run, 1};
const attn_impl attn_cuda_naive = {"cuda_naive", DEV_CUDA, 0, att_supported, naive_run, 1};
