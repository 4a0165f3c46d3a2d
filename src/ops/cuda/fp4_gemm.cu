/* fp4_gemm.cu: the fp4_gemm family on CUDA: y[M,N] (+)= x[M,K] · Wᵀ with W an
 * NVFP4 (ModelOpt) weight [N,K]: codes uint8 [N,K/2] (element 2i in the low
 * nibble), E4M3 block scales [N,K/16], fp32 scale2; x and y BF16, fp32
 * accumulation. W[n,k] = e2m1(code) · e4m3(scale[n,k/16]) · scale2.
 *
 * Backends, three different algorithms:
 *   cuda_w4a16_mma       memory-bound small-M decode kernels (M = 1 GEMV, M <= 8
 *                        and beyond): in fp4_gemv.cu, which says how.
 *   cuda_dequant_cublas  dequantize the whole weight into a BF16 workspace
 *                        (byte-permute decoder, 16 B in, 64 B out per thread),
 *                        then a cuBLASLt BF16 GEMM with alpha = scale2: large M.
 *   cuda_ref             the weight decoded exactly into fp32 in shared memory, a plain
 *                        tiled fp32 product (ref_tile_kernel, gemm's cuda_ref too); the
 *                        chain-of-trust reference on the GPU.
 * Test-only broken ones (registered under LASTSTAND_TEST_BROKEN_BACKENDS=1):
 *   cuda_broken_nan3072  cuda_ref, then NaN written into the output iff M == 3072
 *   cuda_broken_illegal  a store to an unmapped address (illegal memory access)
 *   cuda_broken_sm100    lives in fp4_gemm_sm100.cu (built for sm_100a only)
 *
 * The gemm family (BF16 and FP8 weights) is here too: cuda_cublaslt and cuda_ref; and
 * cu_lt_gemm, the cuBLASLt entry the other families of the module use. An FP8 weight
 * (W_FP8: E4M3 codes, fp32 scales) goes to cuda_cublaslt as BF16: dequantized
 * (fp8_gemm.cu's cu_fp8_dequant) into slot 0 of a per-device grow-only workspace
 * (g_fp8_ws, cu_ws.h), then the same BF16 GEMM; and to cuda_ref as fp8_gemm.cu's plain
 * reference (cu_fp8_ref_run). cuda_gemv (gemv.cu) runs FP8 at M <= 16.
 */
#include "ops/cuda/fp4_gemm.cuh"
#include "ops/cuda/fp8_gemm.h"

#include <cublasLt.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- cuda_ref -------------------------------------------------------------- */

/* The GPU references (cuda_ref of fp4_gemm and of gemm's BF16 weights): a plain
 * shared-memory tiled product, y = alpha · x·Wᵀ (+ y), fp32 accumulation in k order; a
 * 64 x 64 output tile per block of 16 x 16 threads, 4 x 4 each, k in steps of 16. The weight
 * comes through WL: wl(n, k) = W[n, k] as an exact fp32 (n < N, k < K). */
template <class WL>
__global__ void ref_tile_kernel(int M, int N, int K, const bf16 *__restrict__ x, WL wl, float alpha,
                                bf16 *__restrict__ y, int accumulate) {
    __shared__ float xs[16][65], ws[16][65];
    const int tx = threadIdx.x, ty = threadIdx.y, tid = ty * 16 + tx;
    const int m0 = blockIdx.x * 64, n0 = blockIdx.y * 64;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += 16) {
        for (int i = tid; i < 16 * 64; i += 256) {
            int r = i / 16, kk = i % 16; /* r: row within the tile, kk: k within the step */
            int m = m0 + r, n = n0 + r, k = k0 + kk;
            xs[kk][r] = m < M && k < K ? __bfloat162float(x[(size_t)m * K + k]) : 0.f;
            ws[kk][r] = n < N && k < K ? wl(n, k) : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < 16; kk++)
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++) acc[i][j] = fmaf(xs[kk][ty + 16 * i], ws[kk][tx + 16 * j], acc[i][j]);
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int m = m0 + ty + 16 * i, n = n0 + tx + 16 * j;
            if (m >= M || n >= N) continue;
            size_t o = (size_t)m * N + n;
            float v = acc[i][j] * alpha;
            if (accumulate) v += __bfloat162float(y[o]);
            y[o] = __float2bfloat16_rn(v);
        }
}

/* A BF16 weight [N, K]. */
struct ref_w_bf16 {
    const bf16 *w;
    int K;
    __device__ float operator()(int n, int k) const { return __bfloat162float(w[(size_t)n * K + k]); }
};

/* An NVFP4 weight decoded exactly: e2m1(code) · e4m3(block scale); scale2 is the kernel's alpha.
 * (cuda_ref was one thread per output with a loop over K until S19: 0.5 TFLOP/s, most of the
 * doctor's fp4_gemm time at large M.) */
struct ref_w_nvfp4 {
    const uint8_t *w, *sc;
    int K;
    __device__ float operator()(int n, int k) const {
        uint8_t b = w[(size_t)n * (K / 2) + k / 2];
        return cu_e2m1_lut[(k & 1) ? b >> 4 : b & 15] * cu_e4m3_to_f32(sc[(size_t)n * (K / 16) + k / 16]);
    }
};

static int fp4_ref_run(const gemm_args *a, ls_stream s, ls_err *e) {
    int rc = fp4_check_args(a, e);
    if (rc) return rc;
    if (a->M <= 0) return 0;
    const lin_w *w = a->w;
    dim3 grid((a->M + 63) / 64, (w->N + 63) / 64), block(16, 16);
    if (grid.y > 65535) return errf(e, ERR_UNSUPPORTED, "cuda_ref: N=%d too large", w->N);
    ref_tile_kernel<<<grid, block, 0, (cudaStream_t)s>>>(a->M, w->N, w->K, (const bf16 *)a->x,
                                                        ref_w_nvfp4{(const uint8_t *)w->data, w->scale, w->K},
                                                        w->scale2, (bf16 *)a->y, a->accumulate);
    CU_LAUNCHED(e, "fp4_gemm cuda_ref");
    return 0;
}

static int fp4_ref_supported(const dev_info *d, const gemm_shape *s, char *why, size_t n) {
    if (!fp4_common_supported(d, s, why, n)) return 0;
    if (s->N > 65535 * 64) {
        snprintf(why, n, "N=%d exceeds the grid limit", s->N);
        return 0;
    }
    return 1;
}

const fp4_gemm_impl fp4_gemm_cuda_ref = {"cuda_ref", DEV_CUDA, 0, fp4_ref_supported, fp4_ref_run, 1};

/* ---- cuBLASLt, loaded on first use ------------------------------------------------ */
/* libcublasLt is 540 MB: linking it made every start of the binary (every CLI
 * call, every doctor child) pay ~0.6 s before main(). It is dlopen()ed the first
 * time a backend needs it instead; the binary's RUNPATH ($CUDA_HOME/lib64) and
 * the usual library path are searched. */
typedef struct lt_api {
    decltype(&cublasLtCreate) Create;
    decltype(&cublasLtGetStatusString) GetStatusString;
    decltype(&cublasLtMatmul) Matmul;
    decltype(&cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
    decltype(&cublasLtMatmulDescCreate) MatmulDescCreate;
    decltype(&cublasLtMatmulDescDestroy) MatmulDescDestroy;
    decltype(&cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
    decltype(&cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
    decltype(&cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
    decltype(&cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
    decltype(&cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
    decltype(&cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
} lt_api;
static lt_api g_api;
static char g_api_err[256];
static pthread_once_t g_api_once = PTHREAD_ONCE_INIT;

static void lt_api_load(void) {
    static const char *const libs[] = {"libcublasLt.so.13", "libcublasLt.so", "/usr/local/cuda/lib64/libcublasLt.so.13"};
    void *h = NULL;
    for (size_t i = 0; !h && i < sizeof libs / sizeof libs[0]; i++) h = dlopen(libs[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(g_api_err, sizeof g_api_err, "cannot load libcublasLt.so.13: %s", dlerror());
        return;
    }
    if (!(g_api.Create = (decltype(&cublasLtCreate))dlsym(h, "cublasLtCreate"))) {
        snprintf(g_api_err, sizeof g_api_err, "libcublasLt has no cublasLtCreate");
        return;
    }
    if (!(g_api.GetStatusString = (decltype(&cublasLtGetStatusString))dlsym(h, "cublasLtGetStatusString"))) {
        snprintf(g_api_err, sizeof g_api_err, "libcublasLt has no cublasLtGetStatusString");
        return;
    }
    if (!(g_api.Matmul = (decltype(&cublasLtMatmul))dlsym(h, "cublasLtMatmul"))) {
        snprintf(g_api_err, sizeof g_api_err, "libcublasLt has no cublasLtMatmul");
        return;
    }
    if (!(g_api.MatmulAlgoGetHeuristic = (decltype(&cublasLtMatmulAlgoGetHeuristic))dlsym(h, "cublasLtMatmulAlgoGetHeuristic"))) {
        snprintf(g_api_err, sizeof g_api_err, "libcublasLt has no cublasLtMatmulAlgoGetHeuristic");
        return;
    }
    if (!(g_api.MatmulDescCreate = (decltype(&cublasLtMatmulDescCreate))dlsym(h, "cublasLtMatmulDescCreate"))) {
        snprintf(g_api_err, sizeof g_api_err, "libcublasLt has no cublasLtMatmulDescCreate");
        return;
    }
    if (!(g_api.MatmulDescDestroy = (decltype(&cublasLtMatmulDescDestroy))dlsym(h, "cublasLtMatmulDescDestroy"))) {
        snprintf(g_api_err, sizeof g_api_err, "libcublasLt has no cublasLtMatmulDescDestroy");
        return;
    }
    if (!(g_api.MatmulDescSetAttribute = (decltype(&cublasLtMatmulDescSetAttribute))dlsym(h, "cublasLtMatmulDescSetAttribute"))) {
        snprintf(g_api_err, sizeof g_api_err, "libcublasLt has no cublasLtMatmulDescSetAttribute");
        return;
    }
    if (!(g_api.MatmulPreferenceCreate = (decltype(&cublasLtMatmulPreferenceCreate))dlsym(h, "cublasLtMatmulPreferenceCreate"))) {
        snprintf(g_api_err, sizeof g_api_err, "libcublasLt has no cublasLtMatmulPreferenceCreate");
        return;
    }
    if (!(g_api.MatmulPreferenceDestroy = (decltype(&cublasLtMatmulPreferenceDestroy))dlsym(h, "cublasLtMatmulPreferenceDestroy"))) {
        snprintf(g_api_err, sizeof g_api_err, "libcublasLt has no cublasLtMatmulPreferenceDestroy");
        return;
    }
    if (!(g_api.MatmulPreferenceSetAttribute = (decltype(&cublasLtMatmulPreferenceSetAttribute))dlsym(h, "cublasLtMatmulPreferenceSetAttribute"))) {
        snprintf(g_api_err, sizeof g_api_err, "libcublasLt has no cublasLtMatmulPreferenceSetAttribute");
        return;
    }
    if (!(g_api.MatrixLayoutCreate = (decltype(&cublasLtMatrixLayoutCreate))dlsym(h, "cublasLtMatrixLayoutCreate"))) {
        snprintf(g_api_err, sizeof g_api_err, "libcublasLt has no cublasLtMatrixLayoutCreate");
        return;
    }
    if (!(g_api.MatrixLayoutDestroy = (decltype(&cublasLtMatrixLayoutDestroy))dlsym(h, "cublasLtMatrixLayoutDestroy"))) {
        snprintf(g_api_err, sizeof g_api_err, "libcublasLt has no cublasLtMatrixLayoutDestroy");
        return;
    }
}

/* 0, or ERR_UNSUPPORTED naming what is missing */
static int lt_api_get(ls_err *e) {
    pthread_once(&g_api_once, lt_api_load);
    if (g_api_err[0]) return errf(e, ERR_UNSUPPORTED, "cuBLASLt: %s", g_api_err);
    return 0;
}

/* ---- cuBLASLt state (per device, lazily) ------------------------------------- */

enum { LT_MAX_DEV = 16, LT_WS_BYTES = 32 << 20, LT_CACHE = 64 };

typedef struct lt_algo_entry {
    int M, N, K, beta1, d32;
    cublasLtMatmulAlgo_t algo;
    int valid;
} lt_algo_entry;

typedef struct lt_state {
    cublasLtHandle_t h;
    void *ws;                 /* cuBLASLt workspace, LT_WS_BYTES */
    void *wbuf;               /* dequantized BF16 weight */
    size_t wbuf_cap;
    lt_algo_entry cache[LT_CACHE];
    int n_cache;
    pthread_mutex_t mu;
    int init;
} lt_state;

static lt_state g_lt[LT_MAX_DEV];
static pthread_mutex_t g_lt_mu = PTHREAD_MUTEX_INITIALIZER;

static int lt_get(lt_state **out, ls_err *e) {
    int rc = lt_api_get(e);
    if (rc) return rc;
    int dev = 0;
    CU_TRY(e, cudaGetDevice(&dev), "cudaGetDevice");
    if (dev < 0 || dev >= LT_MAX_DEV) return errf(e, ERR_UNSUPPORTED, "cuBLASLt: device %d out of range", dev);
    lt_state *L = &g_lt[dev];
    pthread_mutex_lock(&g_lt_mu);
    if (!L->init) {
        cublasStatus_t st = g_api.Create(&L->h);
        if (st != CUBLAS_STATUS_SUCCESS) {
            pthread_mutex_unlock(&g_lt_mu);
            return errf(e, ERR_RUNTIME, "cublasLtCreate: %s", g_api.GetStatusString(st));
        }
        cudaError_t c = cudaMalloc(&L->ws, LT_WS_BYTES);
        if (c != cudaSuccess) {
            pthread_mutex_unlock(&g_lt_mu);
            return cu_fail(e, c, "cuBLASLt workspace");
        }
        pthread_mutex_init(&L->mu, NULL);
        L->init = 1;
    }
    pthread_mutex_unlock(&g_lt_mu);
    *out = L;
    return 0;
}

/* D[M,N] = alpha · A[M,K] · Wᵀ + beta · D (all BF16 row-major), as the
 * column-major product Dᵀ[N,M] = W[N,K] · Aᵀ: opA = T on W (K x N col-major),
 * opB = N on A (K x M col-major). Caller holds L->mu. */
static int lt_matmul(lt_state *L, int M, int N, int K, const void *W, const void *A, void *D, int d32,
                     float alpha, float beta, cudaStream_t st, ls_err *e) {
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasStatus_t s;
    int rc = 0;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
#define LT_TRY(x)                                                                       \
    do {                                                                                \
        s = (x);                                                                        \
        if (s != CUBLAS_STATUS_SUCCESS) {                                               \
            rc = errf(e, ERR_RUNTIME, "cuBLASLt %s: %s", #x, g_api.GetStatusString(s)); \
            goto done;                                                                  \
        }                                                                               \
    } while (0)
    LT_TRY(g_api.MatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    LT_TRY(g_api.MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_TRY(g_api.MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    LT_TRY(g_api.MatrixLayoutCreate(&la, CUDA_R_16BF, K, N, K));
    LT_TRY(g_api.MatrixLayoutCreate(&lb, CUDA_R_16BF, K, M, K));
    LT_TRY(g_api.MatrixLayoutCreate(&lc, d32 ? CUDA_R_32F : CUDA_R_16BF, N, M, N));
    {
        int beta1 = beta != 0.f;
        lt_algo_entry *hit = NULL;
        for (int i = 0; i < L->n_cache; i++)
            if (L->cache[i].M == M && L->cache[i].N == N && L->cache[i].K == K &&
                L->cache[i].beta1 == beta1 && L->cache[i].d32 == d32)
                hit = &L->cache[i];
        if (!hit) {
            cublasLtMatmulPreference_t pref = NULL;
            cublasLtMatmulHeuristicResult_t res;
            int nres = 0;
            size_t wsb = LT_WS_BYTES;
            LT_TRY(g_api.MatmulPreferenceCreate(&pref));
            s = g_api.MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &wsb, sizeof wsb);
            if (s == CUBLAS_STATUS_SUCCESS)
                s = g_api.MatmulAlgoGetHeuristic(L->h, op, la, lb, lc, lc, pref, 1, &res, &nres);
            g_api.MatmulPreferenceDestroy(pref);
            if (s != CUBLAS_STATUS_SUCCESS || nres < 1) {
                rc = errf(e, ERR_UNSUPPORTED, "cuBLASLt has no algorithm for M=%d N=%d K=%d: %s", M, N,
                          K, g_api.GetStatusString(s));
                goto done;
            }
            int slot = L->n_cache < LT_CACHE ? L->n_cache++ : (M + N + K) % LT_CACHE;
            L->cache[slot] = (lt_algo_entry){M, N, K, beta1, d32, res.algo, 1};
            hit = &L->cache[slot];
        }
        LT_TRY(g_api.Matmul(L->h, op, &alpha, W, la, A, lb, &beta, D, lc, D, lc, &hit->algo, L->ws,
                              LT_WS_BYTES, st));
    }
done:
#undef LT_TRY
    if (lc) g_api.MatrixLayoutDestroy(lc);
    if (lb) g_api.MatrixLayoutDestroy(lb);
    if (la) g_api.MatrixLayoutDestroy(la);
    if (op) g_api.MatmulDescDestroy(op);
    return rc;
}

/* ---- cuda_dequant_cublas ------------------------------------------------------- */

/* One thread: 16 code bytes (32 elements, 2 scale blocks) -> 64 B of bf16. */
__global__ void fp4_dequant_kernel(size_t n16, int K, const uint8_t *__restrict__ w,
                                   const uint8_t *__restrict__ sc, bf16 *__restrict__ out) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n16) return;
    uint4 v = cu_ld_stream16(w + i * 16);
    size_t e0 = i * 32; /* first element; K % 32 == 0 so both blocks are in one row */
    size_t row = e0 / K, kk = e0 % K;
    const uint8_t *sr = sc + row * (K / 16) + kk / 16;
    uint32_t sa = cu_scale_bf16x2(sr[0]), sb = cu_scale_bf16x2(sr[1]);
    const uint32_t q[4] = {v.x, v.y, v.z, v.w};
    uint4 *o = reinterpret_cast<uint4 *>(out + e0);
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t r[4];
        cu_e2m1x8_to_bf16x8(q[j], r);
        uint32_t s = j < 2 ? sa : sb;
        o[j] = make_uint4(cu_bf16x2_mul(r[0], s), cu_bf16x2_mul(r[1], s), cu_bf16x2_mul(r[2], s),
                          cu_bf16x2_mul(r[3], s));
    }
}

static int dq_supported(const dev_info *d, const gemm_shape *s, char *why, size_t n) {
    if (!fp4_common_supported(d, s, why, n)) return 0;
    if (s->K % 32) {
        snprintf(why, n, "needs K %% 32 == 0 (K=%d)", s->K);
        return 0;
    }
    return 1;
}

static int dq_run(const gemm_args *a, ls_stream s, ls_err *e) {
    int rc = fp4_check_args(a, e);
    if (rc) return rc;
    const lin_w *w = a->w;
    if (w->K % 32) return errf(e, ERR_UNSUPPORTED, "cuda_dequant_cublas: needs K %% 32 == 0 (K=%d)", w->K);
    if ((uintptr_t)w->data & 15)
        return errf(e, ERR_UNSUPPORTED, "cuda_dequant_cublas: weight must be 16-byte aligned");
    if (a->M <= 0) return 0;
    lt_state *L;
    if ((rc = lt_get(&L, e))) return rc;
    pthread_mutex_lock(&L->mu);
    size_t need = (size_t)w->N * w->K * 2;
    if (need > L->wbuf_cap) {
        if (L->wbuf) cudaFree(L->wbuf);
        L->wbuf = NULL;
        L->wbuf_cap = 0;
        cudaError_t c = cudaMalloc(&L->wbuf, need);
        if (c != cudaSuccess) {
            pthread_mutex_unlock(&L->mu);
            return cu_fail(e, c, "cuda_dequant_cublas workspace");
        }
        L->wbuf_cap = need;
    }
    cudaStream_t st = (cudaStream_t)s;
    size_t n16 = (size_t)w->N * w->K / 32;
    fp4_dequant_kernel<<<(unsigned)((n16 + 255) / 256), 256, 0, st>>>(
        n16, w->K, (const uint8_t *)w->data, w->scale, (bf16 *)L->wbuf);
    cudaError_t c = cudaGetLastError();
    if (c != cudaSuccess) {
        pthread_mutex_unlock(&L->mu);
        return cu_fail(e, c, "fp4_gemm cuda_dequant_cublas (dequant)");
    }
    rc = lt_matmul(L, a->M, w->N, w->K, L->wbuf, a->x, a->y, 0, w->scale2, a->accumulate ? 1.f : 0.f, st,
                   e);
    pthread_mutex_unlock(&L->mu);
    return rc;
}

/* graph_safe: the BF16 buffer only grows with the largest weight, reached by the warm-up pass */
const fp4_gemm_impl fp4_gemm_cuda_dequant_cublas = {"cuda_dequant_cublas", DEV_CUDA, 0, dq_supported,
                                                    dq_run, 1};

/* ---- test-only broken backends ------------------------------------------------- */

__global__ void poison_nan_kernel(size_t n, bf16 *y) {
    size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * 97;
    if (i < n) y[i] = __float2bfloat16_rn(__int_as_float(0x7fc00000));
}

static int nan3072_run(const gemm_args *a, ls_stream s, ls_err *e) {
    int rc = fp4_ref_run(a, s, e);
    if (rc || a->M != 3072) return rc;
    size_t n = (size_t)a->M * a->w->N;
    size_t thr = (n + 96) / 97;
    poison_nan_kernel<<<(unsigned)((thr + 255) / 256), 256, 0, (cudaStream_t)s>>>(n, (bf16 *)a->y);
    CU_LAUNCHED(e, "fp4_gemm cuda_broken_nan3072");
    return 0;
}

const fp4_gemm_impl fp4_gemm_cuda_broken_nan3072 = {"cuda_broken_nan3072", DEV_CUDA, 1,
                                                    fp4_ref_supported, nan3072_run};

__global__ void illegal_kernel(bf16 *y) {
    /* far past any allocation: the store faults with an illegal address */
    bf16 *bad = y + ((size_t)1 << 40) + threadIdx.x;
    *reinterpret_cast<volatile bf16 *>(bad) = __float2bfloat16_rn(1.f);
}

static int illegal_run(const gemm_args *a, ls_stream s, ls_err *e) {
    int rc = fp4_check_args(a, e);
    if (rc) return rc;
    illegal_kernel<<<1, 32, 0, (cudaStream_t)s>>>((bf16 *)a->y);
    CU_LAUNCHED(e, "fp4_gemm cuda_broken_illegal");
    return 0;
}

const fp4_gemm_impl fp4_gemm_cuda_broken_illegal = {"cuda_broken_illegal", DEV_CUDA, 1,
                                                    fp4_common_supported, illegal_run};

static int sm100_run(const gemm_args *a, ls_stream s, ls_err *e) {
    int rc = fp4_check_args(a, e);
    if (rc) return rc;
    return lsc_broken_sm100_launch(a, s, e);
}

/* Declares itself supported everywhere, as a kernel library that only checks
 * the device's name would: the missing sm_90 image is found by the launch. */
const fp4_gemm_impl fp4_gemm_cuda_broken_sm100 = {"cuda_broken_sm100", DEV_CUDA, 1, fp4_common_supported,
                                                  sm100_run};

/* ---- gemm (BF16 and FP8 weights) ------------------------------------------------ */

/* A BF16 or FP8 weight (FP8: a usable scale layout, cu_fp8_w_ok), BF16 activations. */
static int bf_check(const gemm_args *a, const char *who, ls_err *e) {
    if (!a->w || (a->w->kind != W_BF16 && a->w->kind != W_FP8))
        return errf(e, ERR_UNSUPPORTED, "gemm %s: weight %s is %s, needs BF16 or FP8", who,
                    a->w && a->w->name ? a->w->name : "?", a->w ? w_kind_name(a->w->kind) : "?");
    if (a->dt != ACT_BF16)
        return errf(e, ERR_UNSUPPORTED, "gemm %s: activations must be BF16", who);
    char why[256];
    if (a->w->kind == W_FP8 && !cu_fp8_w_ok(a->w, why, sizeof why))
        return errf(e, ERR_UNSUPPORTED, "gemm %s: %s", who, why);
    return 0;
}

static int bf_supported(const dev_info *d, const gemm_shape *s, char *why, size_t n) {
    if (!fp4_common_supported(d, s, why, n)) return 0;
    if (s->wk != W_BF16 && s->wk != W_FP8) {
        snprintf(why, n, "weight must be BF16 or FP8, got %s", w_kind_name(s->wk));
        return 0;
    }
    return 1;
}

/* FP8 weights as BF16 for cuBLASLt: slot 0 of this per-device workspace (lock held over the
 * whole call), grown to the largest weight seen and never shrunk: graph-safe once the engine's
 * warm-up ran the step's largest FP8 weight (as cuda_dequant_cublas's buffer). */
static cu_ws g_fp8_ws[CU_WS_MAX_DEV];

static int lt_run(const gemm_args *a, ls_stream s, ls_err *e) {
    int rc = bf_check(a, "cuda_cublaslt", e);
    if (rc) return rc;
    if (a->M <= 0) return 0;
    lt_state *L;
    if ((rc = lt_get(&L, e))) return rc;
    const lin_w *w = a->w;
    cudaStream_t st = (cudaStream_t)s;
    if (w->kind != W_FP8) {
        pthread_mutex_lock(&L->mu);
        rc = lt_matmul(L, a->M, w->N, w->K, w->data, a->x, a->y, 0, 1.f, a->accumulate ? 1.f : 0.f, st, e);
        pthread_mutex_unlock(&L->mu);
        return rc;
    }
    int dev = 0;
    if ((rc = cu_ws_device("gemm cuda_cublaslt (fp8)", &dev, e))) return rc;
    cu_ws *ws = &g_fp8_ws[dev];
    cu_ws_lock(ws);
    void *wb = cu_ws_get(ws, 0, (size_t)w->N * w->K * 2, 0, st, "gemm cuda_cublaslt (fp8)", e);
    rc = wb ? cu_fp8_dequant(w, wb, st, e) : e->code ? e->code : ERR_NOMEM; /* cu_ws_get filled e */
    if (!rc) {
        pthread_mutex_lock(&L->mu);
        rc = lt_matmul(L, a->M, w->N, w->K, wb, a->x, a->y, 0, 1.f, a->accumulate ? 1.f : 0.f, st, e);
        pthread_mutex_unlock(&L->mu);
    }
    cu_ws_unlock(ws);
    return rc;
}

const gemm_impl gemm_cuda_cublaslt = {"cuda_cublaslt", DEV_CUDA, 0, bf_supported, lt_run, 1};

static int bf_ref_run(const gemm_args *a, ls_stream s, ls_err *e) {
    int rc = bf_check(a, "cuda_ref", e);
    if (rc) return rc;
    if (a->w->kind == W_FP8) return cu_fp8_ref_run(a, (cudaStream_t)s, e);
    if (a->M <= 0) return 0;
    dim3 grid((a->M + 63) / 64, (a->w->N + 63) / 64), block(16, 16);
    if (grid.y > 65535) return errf(e, ERR_UNSUPPORTED, "gemm cuda_ref: N=%d too large", a->w->N);
    ref_tile_kernel<<<grid, block, 0, (cudaStream_t)s>>>(a->M, a->w->N, a->w->K, (const bf16 *)a->x,
                                                        ref_w_bf16{(const bf16 *)a->w->data, a->w->K}, 1.f,
                                                        (bf16 *)a->y, a->accumulate);
    CU_LAUNCHED(e, "gemm cuda_ref");
    return 0;
}

const gemm_impl gemm_cuda_ref = {"cuda_ref", DEV_CUDA, 0, bf_supported, bf_ref_run, 1};

/* D[M,N] = alpha · A[M,K]·Wᵀ (+ beta·D), W and A BF16, D BF16 or (d32) fp32:
 * for the other families of this module (the MoE router's fp32 logits). */
int cu_lt_gemm(int M, int N, int K, const void *W, const void *A, void *D, int d32, float alpha,
               float beta, cudaStream_t st, ls_err *e) {
    lt_state *L;
    int rc = lt_get(&L, e);
    if (rc) return rc;
    pthread_mutex_lock(&L->mu);
    rc = lt_matmul(L, M, N, K, W, A, D, d32, alpha, beta, st, e);
    pthread_mutex_unlock(&L->mu);
    return rc;
}
