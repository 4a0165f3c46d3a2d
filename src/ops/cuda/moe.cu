/* moe.cu: the moe family on CUDA (reference/qwen35-and-nvfp4.md 2.5), the expert-loop
 * backend cuda_expert_loop:
 *   p = softmax(x·W_routerᵀ) over E (fp32), top-k (ties: lower index), renormalised
 *   y = Σ_j w_j · down_e(silu(gate_e(x)) · up_e(x)) + sigmoid(x·w_sg) · shared(x)
 * x, y BF16 [M, H]; router and shared-expert gate BF16; experts NVFP4 or BF16; the
 * shared expert NVFP4 or BF16 on its own (ModelOpt NVFP4 checkpoints may exclude
 * `*.mlp.shared_expert.*` from quantization, as synth does).
 *
 * The family's CUDA backends, three algorithms:
 *   cuda_fused_decode  M <= 8, NVFP4 experts, 4 launches, no host round trip
 *                      (moe_fused.cu);
 *   cuda_grouped_gemm  any M: routing and the sort by expert on the device, two
 *                      grouped GEMMs over expert tiles (moe_grouped.cu);
 *   cuda_expert_loop   any M (this file): router through cuBLASLt (fp32 logits),
 *                      top-k kernel, one device->host copy of the choices, tokens
 *                      sorted by expert and gathered, then per expert the fp4_gemm
 *                      backends (cuda_w4a16_mma for <= 64 rows, else
 *                      cuda_dequant_cublas; cuBLASLt for BF16 experts), SiLU·up, and
 *                      one combine kernel (no atomics: each output row sums its own
 *                      k rows).
 * Workspace: per device (cu_ws.h), grown on first use and kept on growth; calls on
 * one device are serialised by its lock.
 */
#include "ops/cuda/moe_int.cuh"

/* ---- per-device workspace ------------------------------------------------------ */

enum { WS_LOGITS, WS_IDX, WS_WTS, WS_PERM, WS_POS, WS_XS, WS_G, WS_U, WS_Y, WS_GS, WS_US, WS_S, WS_N };
static_assert((int)WS_N <= (int)CU_WS_SLOTS, "moe workspace slots");

typedef struct moe_ws {
    cu_ws ws; /* lock + the WS_* device buffers (cu_ws.h: kept on grow) */
    int32_t *h_idx, *h_perm, *h_pos; /* host scratch */
    size_t h_cap;
} moe_ws;

static moe_ws g_ws[CU_WS_MAX_DEV];

/* This device's workspace, locked (moe calls on one device are serialised). */
static int ws_lock(moe_ws **out, ls_err *e) {
    int dev = 0, rc = cu_ws_device("moe", &dev, e);
    if (rc) return rc;
    cu_ws_lock(&g_ws[dev].ws);
    *out = &g_ws[dev];
    return 0;
}
static void ws_unlock(moe_ws *w) { cu_ws_unlock(&w->ws); }

/* Device buffer `slot` of at least n bytes (zeroed when allocated). */
static void *ws_get(moe_ws *w, int slot, size_t n, cudaStream_t st, ls_err *e) {
    return cu_ws_get(&w->ws, slot, n, 1, st, "moe", e);
}

/* ---- cuda_expert_loop ------------------------------------------------------------- */

/* softmax, top-k and the shared gate, a block per token (moe_int.cuh) */
__global__ void __launch_bounds__(32 * TOPK_W) moe_loop_topk_kernel(int H, int E, int k, int norm,
                                                                    const bf16 *__restrict__ x,
                                                                    const bf16 *__restrict__ wsg, int has_shared,
                                                                    const float *__restrict__ logits, int32_t *idx,
                                                                    float *wts) {
    moe_topk_block(blockIdx.x, H, E, k, norm, x, wsg, has_shared, logits, NULL, idx, wts);
}

/* xs[i] = x[perm[i]], rows of H bf16 */
__global__ void moe_gather_kernel(int n, int H, const bf16 *__restrict__ x, const int32_t *__restrict__ perm,
                                  bf16 *__restrict__ xs) {
    int i = blockIdx.x;
    const uint4 *src = reinterpret_cast<const uint4 *>(x + (size_t)perm[i] * H);
    uint4 *dst = reinterpret_cast<uint4 *>(xs + (size_t)i * H);
    for (int v = threadIdx.x; v < H / 8; v += blockDim.x) dst[v] = src[v];
}

/* g = silu(g) · u, bf16, computed in fp32 */
__global__ void moe_silu_mul_kernel(size_t n, bf16 *g, const bf16 *__restrict__ u) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float a = __bfloat162float(g[i]), b = __bfloat162float(u[i]);
    g[i] = __float2bfloat16_rn(a / (1.f + __expf(-a)) * b);
}

/* y[m] = Σ_j wts[m,j] · Y[pos[m,j]] + wts[m,k] · S[m] (S may be NULL) */
__global__ void moe_combine_kernel(int M, int H, int k, const float *__restrict__ wts,
                                   const int32_t *__restrict__ pos, const bf16 *__restrict__ Y,
                                   const bf16 *__restrict__ S, bf16 *__restrict__ y) {
    int m = blockIdx.x;
    for (int h = threadIdx.x; h < H; h += blockDim.x) {
        float acc = 0.f;
        for (int j = 0; j < k; j++)
            acc += wts[(size_t)m * (k + 1) + j] * __bfloat162float(Y[(size_t)pos[(size_t)m * k + j] * H + h]);
        if (S) acc += wts[(size_t)m * (k + 1) + k] * __bfloat162float(S[(size_t)m * H + h]);
        y[(size_t)m * H + h] = __float2bfloat16_rn(acc);
    }
}

/* y[rows, N] = x[rows, K]·Wᵀ through the fp4_gemm / gemm backends */
static int lin_run(const lin_w *w, int rows, const void *x, void *y, cudaStream_t st, ls_err *e) {
    gemm_args a = {.M = rows, .x = x, .w = w, .y = y, .accumulate = 0, .dt = ACT_BF16};
    if (w->kind == W_BF16) return gemm_cuda_cublaslt.run(&a, st, e);
    if (w->kind != W_NVFP4) return errf(e, ERR_UNSUPPORTED, "cuda_expert_loop: %s expert weights", w_kind_name(w->kind));
    if (rows <= 64 && w->K % 128 == 0 && w->N % 16 == 0 && !((uintptr_t)w->scale & 1))
        return fp4_gemm_cuda_w4a16_mma.run(&a, st, e);
    if (w->K % 32 == 0) return fp4_gemm_cuda_dequant_cublas.run(&a, st, e);
    return fp4_gemm_cuda_ref.run(&a, st, e);
}

static int loop_supported(const dev_info *d, const moe_shape *s, char *why, size_t n) {
    if (!moe_common_supported(d, s, why, n)) return 0;
    if (s->wk != W_NVFP4 && s->wk != W_BF16) {
        snprintf(why, n, "experts must be NVFP4 or BF16");
        return 0;
    }
    return 1;
}

static int loop_run_locked(moe_ws *ws, const moe_args *a, cudaStream_t st, ls_err *e) {
    const moe_w *w = a->w;
    const int M = a->M, H = w->hidden, E = w->n_experts, k = w->top_k, I = w->inter,
              Is = w->shared_inter > 0 ? w->shared_inter : 0;
    const size_t Mk = (size_t)M * k;
    float *logits = (float *)ws_get(ws, WS_LOGITS, sizeof(float) * M * E, st, e);
    int32_t *idx = (int32_t *)ws_get(ws, WS_IDX, sizeof(int32_t) * Mk, st, e);
    float *wts = (float *)ws_get(ws, WS_WTS, sizeof(float) * M * (k + 1), st, e);
    int32_t *perm = (int32_t *)ws_get(ws, WS_PERM, sizeof(int32_t) * Mk, st, e);
    int32_t *pos = (int32_t *)ws_get(ws, WS_POS, sizeof(int32_t) * Mk, st, e);
    bf16 *xs = (bf16 *)ws_get(ws, WS_XS, sizeof(bf16) * Mk * H, st, e);
    bf16 *G = (bf16 *)ws_get(ws, WS_G, sizeof(bf16) * Mk * I, st, e);
    bf16 *U = (bf16 *)ws_get(ws, WS_U, sizeof(bf16) * Mk * I, st, e);
    bf16 *Y = (bf16 *)ws_get(ws, WS_Y, sizeof(bf16) * Mk * H, st, e);
    if (!logits || !idx || !wts || !perm || !pos || !xs || !G || !U || !Y) return e->code ? e->code : ERR_NOMEM;
    bf16 *Gs = NULL, *Us = NULL, *S = NULL;
    if (Is) {
        Gs = (bf16 *)ws_get(ws, WS_GS, sizeof(bf16) * M * Is, st, e);
        Us = (bf16 *)ws_get(ws, WS_US, sizeof(bf16) * M * Is, st, e);
        S = (bf16 *)ws_get(ws, WS_S, sizeof(bf16) * M * H, st, e);
        if (!Gs || !Us || !S) return e->code ? e->code : ERR_NOMEM;
    }
    int rc = cu_lt_gemm(M, E, H, w->router.data, a->x, logits, 1, 1.f, 0.f, st, e);
    if (rc) return err_prefix(e, "cuda_expert_loop router");
    moe_loop_topk_kernel<<<M, 32 * TOPK_W, 0, st>>>(H, E, k, w->norm_topk, (const bf16 *)a->x,
                                                    w->has_sh_gate ? (const bf16 *)w->sh_gate_w.data : NULL, Is > 0,
                                                    logits, idx, wts);
    CU_LAUNCHED(e, "cuda_expert_loop top-k");
    /* the shared expert does not depend on the routing: queue it before the host waits */
    if (Is) {
        if ((rc = lin_run(&w->sh_gate, M, a->x, Gs, st, e)) || (rc = lin_run(&w->sh_up, M, a->x, Us, st, e)))
            return rc;
        size_t n = (size_t)M * Is;
        moe_silu_mul_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(n, Gs, Us);
        CU_LAUNCHED(e, "cuda_expert_loop shared silu");
        if ((rc = lin_run(&w->sh_down, M, Gs, S, st, e))) return rc;
    }
    if (ws->h_cap < Mk) {
        free(ws->h_idx); free(ws->h_perm); free(ws->h_pos);
        ws->h_idx = (int32_t *)xmalloc(sizeof(int32_t) * Mk);
        ws->h_perm = (int32_t *)xmalloc(sizeof(int32_t) * Mk);
        ws->h_pos = (int32_t *)xmalloc(sizeof(int32_t) * Mk);
        ws->h_cap = Mk;
    }
    CU_TRY(e, cudaMemcpyAsync(ws->h_idx, idx, sizeof(int32_t) * Mk, cudaMemcpyDeviceToHost, st), "top-k to host");
    CU_TRY(e, cudaStreamSynchronize(st), "cuda_expert_loop routing");
    /* counting sort of (token, j) entries by expert */
    int *cnt = (int *)xcalloc(E + 1, sizeof(int));
    for (size_t i = 0; i < Mk; i++) {
        int ex = ws->h_idx[i];
        if (ex < 0 || ex >= E) {
            free(cnt);
            return errf(e, ERR_RUNTIME, "cuda_expert_loop: top-k returned expert %d of %d", ex, E);
        }
        cnt[ex + 1]++;
    }
    for (int x = 0; x < E; x++) cnt[x + 1] += cnt[x];
    int *fill = (int *)xmalloc(sizeof(int) * E);
    memcpy(fill, cnt, sizeof(int) * E);
    for (size_t i = 0; i < Mk; i++) {
        int ex = ws->h_idx[i], at = fill[ex]++;
        ws->h_perm[at] = (int32_t)(i / k);
        ws->h_pos[i] = at;
    }
    free(fill);
    cudaError_t c = cudaMemcpyAsync(perm, ws->h_perm, sizeof(int32_t) * Mk, cudaMemcpyHostToDevice, st);
    if (c == cudaSuccess) c = cudaMemcpyAsync(pos, ws->h_pos, sizeof(int32_t) * Mk, cudaMemcpyHostToDevice, st);
    if (c == cudaSuccess) c = cudaStreamSynchronize(st); /* the host arrays are reused next call */
    if (c != cudaSuccess) {
        free(cnt);
        return cu_fail(e, c, "cuda_expert_loop: token order to device");
    }
    moe_gather_kernel<<<(unsigned)Mk, 128, 0, st>>>((int)Mk, H, (const bf16 *)a->x, perm, xs);
    c = cudaGetLastError();
    for (int x = 0; c == cudaSuccess && !rc && x < E; x++) {
        int n = cnt[x + 1] - cnt[x];
        if (!n) continue;
        size_t off = cnt[x];
        rc = lin_run(&w->gate[x], n, xs + off * H, G + off * I, st, e);
        if (!rc) rc = lin_run(&w->up[x], n, xs + off * H, U + off * I, st, e);
    }
    if (c == cudaSuccess && !rc) {
        size_t n = Mk * I;
        moe_silu_mul_kernel<<<(unsigned)((n + 255) / 256), 256, 0, st>>>(n, G, U);
        c = cudaGetLastError();
    }
    for (int x = 0; c == cudaSuccess && !rc && x < E; x++) {
        int n = cnt[x + 1] - cnt[x];
        if (!n) continue;
        size_t off = cnt[x];
        rc = lin_run(&w->down[x], n, G + off * I, Y + off * H, st, e);
    }
    free(cnt);
    if (rc) return err_prefix(e, "cuda_expert_loop");
    if (c == cudaSuccess) {
        moe_combine_kernel<<<M, 256, 0, st>>>(M, H, k, wts, pos, Y, S, (bf16 *)a->y);
        c = cudaGetLastError();
    }
    if (c == cudaSuccess && a->topk_idx)
        c = cudaMemcpyAsync(a->topk_idx, idx, sizeof(int32_t) * Mk, cudaMemcpyDeviceToDevice, st);
    if (c == cudaSuccess && a->topk_w)
        c = cudaMemcpy2DAsync(a->topk_w, sizeof(float) * k, wts, sizeof(float) * (k + 1), sizeof(float) * k, M,
                              cudaMemcpyDeviceToDevice, st);
    if (c != cudaSuccess) return cu_fail(e, c, "moe cuda_expert_loop");
    return 0;
}

static int loop_run(const moe_args *a, ls_stream s, ls_err *e) {
    int rc = moe_check_w(a, e);
    if (rc || a->M <= 0) return rc;
    moe_ws *ws;
    if ((rc = ws_lock(&ws, e))) return rc;
    rc = loop_run_locked(ws, a, (cudaStream_t)s, e);
    ws_unlock(ws);
    return rc;
}

const moe_impl moe_cuda_expert_loop = {"cuda_expert_loop", DEV_CUDA, 0, loop_supported, loop_run};