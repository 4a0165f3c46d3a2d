/* runtime.cu: registration of the CUDA backends into the ops registries, and
 * the small runtime surface (device query, memory, sync, events, copy
 * bandwidth, the timing hold) that the doctor and bench/kernels use through
 * cuda_ops.h.
 *
 * Registration order is preference order for "auto" before the doctor has
 * measured anything: the fast paths first, the reference kernel last, the
 * test-only broken backends (LASTSTAND_TEST_BROKEN_BACKENDS=1) after it.
 */
#include "ops/cuda/cu_util.h"

#include <stdlib.h>
#include <string.h>

extern "C" void ops_cuda_register_all(void) {
    ops_fp4_gemm_register(&fp4_gemm_cuda_w4a16_mma);
    ops_fp4_gemm_register(&fp4_gemm_cuda_dequant_cublas);
    ops_fp4_gemm_register(&fp4_gemm_cuda_ref);
    ops_moe_register(&moe_cuda_fused_decode);
    ops_moe_register(&moe_cuda_grouped_gemm); /* before the loop: faster at every M (bench/RESULTS.md) */
    ops_moe_register(&moe_cuda_expert_loop);
    ops_attn_register(&attn_cuda_flash_prefill); /* fastest at every bucket the doctor measured */
    ops_attn_register(&attn_cuda_flash_decode);
    ops_attn_register(&attn_cuda_naive);
    /* cuda_decode: correct at every cell in R2 and R3 (this version), fastest at M = 1, 2, 8, 16, 64
     * (397B shapes), chunks of > 64 tokens handed to cuda_chunked (bench/RESULTS.md); never last,
     * which would make it serve's smoke-test reference */
    ops_gdn_register(&gdn_cuda_decode);
    ops_gdn_register(&gdn_cuda_recurrent);
    ops_gdn_register(&gdn_cuda_chunked);
    ops_gdn_register(&gdn_cuda_per_token);
    ops_gemm_register(&gemm_cuda_cublaslt);
    ops_gemm_register(&gemm_cuda_gemv); /* after cuBLASLt: auto's static default stays cuBLASLt */
    ops_gemm_register(&gemm_cuda_ref);
    const char *tb = getenv("LASTSTAND_TEST_BROKEN_BACKENDS");
    if (tb && !strcmp(tb, "1")) {
        ops_fp4_gemm_register(&fp4_gemm_cuda_broken_sm100);
        ops_fp4_gemm_register(&fp4_gemm_cuda_broken_nan3072);
        ops_fp4_gemm_register(&fp4_gemm_cuda_broken_illegal);
    }
}

extern "C" int lsc_device_count(ls_err *e) {
    int n = 0;
    cudaError_t c = cudaGetDeviceCount(&n);
    if (c != cudaSuccess) {
        cu_fail(e, c, "cudaGetDeviceCount");
        return 0;
    }
    if (n == 0) errf(e, ERR_UNSUPPORTED, "no CUDA device found");
    return n;
}

extern "C" int lsc_device_open(int ordinal, dev_info *d, char *driver, size_t driver_n, ls_err *e) {
    CU_TRY(e, cudaSetDevice(ordinal), "cudaSetDevice");
    cudaDeviceProp p;
    CU_TRY(e, cudaGetDeviceProperties(&p, ordinal), "cudaGetDeviceProperties");
    memset(d, 0, sizeof *d);
    d->kind = DEV_CUDA;
    d->ordinal = ordinal;
    snprintf(d->name, sizeof d->name, "%s", p.name);
    d->cc_major = p.major;
    d->cc_minor = p.minor;
    d->n_sm = p.multiProcessorCount;
    d->mem_bytes = p.totalGlobalMem;
    int dv = 0, rv = 0;
    cudaDriverGetVersion(&dv);
    cudaRuntimeGetVersion(&rv);
    if (driver)
        snprintf(driver, driver_n, "cuda-driver-%d.%d/runtime-%d.%d", dv / 1000, (dv % 1000) / 10,
                 rv / 1000, (rv % 1000) / 10);
    /* force context creation here so later timings exclude it */
    CU_TRY(e, cudaFree(0), "cudaFree(0)");
    return 0;
}

extern "C" int lsc_l2_bytes(void) {
    int dev = 0, v = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&v, cudaDevAttrL2CacheSize, dev);
    return v;
}

extern "C" void *lsc_malloc(size_t n, ls_err *e) {
    void *p = NULL;
    cudaError_t c = cudaMalloc(&p, n ? n : 16);
    if (c != cudaSuccess) {
        char what[96];
        snprintf(what, sizeof what, "cudaMalloc(%zu bytes)", n);
        cu_fail(e, c, what);
        return NULL;
    }
    return p;
}

extern "C" void lsc_free(void *p) {
    if (p) cudaFree(p);
}

extern "C" int lsc_h2d(void *dst, const void *src, size_t n, ls_err *e) {
    CU_TRY(e, cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice), "cudaMemcpy H2D");
    return 0;
}
extern "C" int lsc_d2h(void *dst, const void *src, size_t n, ls_err *e) {
    CU_TRY(e, cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost), "cudaMemcpy D2H");
    return 0;
}
extern "C" int lsc_d2d(void *dst, const void *src, size_t n, ls_err *e) {
    CU_TRY(e, cudaMemcpy(dst, src, n, cudaMemcpyDeviceToDevice), "cudaMemcpy D2D");
    return 0;
}
extern "C" int lsc_memset(void *dst, int byte, size_t n, ls_err *e) {
    CU_TRY(e, cudaMemset(dst, byte, n), "cudaMemset");
    return 0;
}

extern "C" int lsc_sync(int *sticky, ls_err *e) {
    if (sticky) *sticky = 0;
    cudaError_t c = cudaDeviceSynchronize();
    if (c == cudaSuccess) c = cudaGetLastError();
    if (c == cudaSuccess) return 0;
    /* a sticky error stays after the query; a launch error does not */
    cudaError_t again = cudaDeviceSynchronize();
    if (sticky) *sticky = again != cudaSuccess;
    return cu_fail(e, c, "kernel execution");
}

struct lsc_timer {
    int n;
    cudaEvent_t *ev;
};

extern "C" lsc_timer *lsc_timer_new(int n, ls_err *e) {
    lsc_timer *t = (lsc_timer *)calloc(1, sizeof *t);
    t->n = n;
    t->ev = (cudaEvent_t *)calloc(2 * n, sizeof(cudaEvent_t));
    for (int i = 0; i < 2 * n; i++) {
        cudaError_t c = cudaEventCreate(&t->ev[i]);
        if (c != cudaSuccess) {
            cu_fail(e, c, "cudaEventCreate");
            lsc_timer_free(t);
            return NULL;
        }
    }
    return t;
}
extern "C" void lsc_timer_start(lsc_timer *t, int i) { cudaEventRecord(t->ev[2 * i], 0); }
extern "C" void lsc_timer_stop(lsc_timer *t, int i) { cudaEventRecord(t->ev[2 * i + 1], 0); }
extern "C" float lsc_timer_ms(lsc_timer *t, int i) {
    float ms = -1.f;
    if (cudaEventElapsedTime(&ms, t->ev[2 * i], t->ev[2 * i + 1]) != cudaSuccess) return -1.f;
    return ms;
}
extern "C" void lsc_timer_free(lsc_timer *t) {
    if (!t) return;
    for (int i = 0; i < 2 * t->n; i++)
        if (t->ev[i]) cudaEventDestroy(t->ev[i]);
    free(t->ev);
    free(t);
}

/* ---- the timing hold -------------------------------------------------------------
 * One thread spins on the global nanosecond timer for `ns`, bounded (it never
 * waits on anything the host does, so a backend that synchronises inside its
 * call only delays itself: the hold ends on its own). Enqueued before a timed
 * loop, it keeps the GPU busy while the host enqueues every timed call, so the
 * calls then run back to back as they would in a CUDA graph, and each event pair
 * measures GPU time, not the host's launch latency. */
__global__ void lsc_hold_kernel(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

static cudaEvent_t g_hold_ev;

extern "C" int lsc_hold(double us, ls_err *e) {
    if (us < 0) us = 0;
    if (us > LSC_HOLD_MAX_US) us = LSC_HOLD_MAX_US;
    if (!g_hold_ev) CU_TRY(e, cudaEventCreateWithFlags(&g_hold_ev, cudaEventDisableTiming), "cudaEventCreate");
    lsc_hold_kernel<<<1, 1, 0, 0>>>((unsigned long long)(us * 1e3));
    CU_LAUNCHED(e, "timing hold kernel");
    CU_TRY(e, cudaEventRecord(g_hold_ev, 0), "cudaEventRecord (hold)");
    return 0;
}

extern "C" int lsc_hold_over(void) {
    return g_hold_ev && cudaEventQuery(g_hold_ev) == cudaSuccess;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

extern "C" double lsc_copy_bw_gbs(size_t bytes, int reps, ls_err *e) {
    void *a = lsc_malloc(bytes, e), *b = a ? lsc_malloc(bytes, e) : NULL;
    if (!a || !b) {
        lsc_free(a);
        return -1;
    }
    double gbs = -1;
    lsc_timer *t = lsc_timer_new(reps, e);
    float *ms = (float *)calloc(reps, sizeof(float));
    if (t && cudaMemset(a, 0x5a, bytes) == cudaSuccess) {
        cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice); /* warm-up */
        for (int i = 0; i < reps; i++) {
            lsc_timer_start(t, i);
            cudaMemcpyAsync((i & 1) ? a : b, (i & 1) ? b : a, bytes, cudaMemcpyDeviceToDevice, 0);
            lsc_timer_stop(t, i);
        }
        if (lsc_sync(NULL, e) == 0) {
            for (int i = 0; i < reps; i++) ms[i] = lsc_timer_ms(t, i);
            qsort(ms, reps, sizeof(float), cmp_float);
            gbs = 2.0 * bytes / (ms[reps / 2] * 1e-3) / 1e9;
        }
    }
    free(ms);
    lsc_timer_free(t);
    lsc_free(a);
    lsc_free(b);
    return gbs;
}
