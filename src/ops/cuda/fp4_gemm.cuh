/* fp4_gemm.cuh: what the two files of the fp4_gemm family on CUDA share
 * (fp4_gemm.cu: references, cuBLASLt, dequantize + cuBLASLt, the BF16 gemm family;
 * fp4_gemv.cu: the small-M decode kernels of cuda_w4a16_mma): the argument
 * checks of every backend, and the per-device function attributes.
 */
#ifndef LS_FP4_GEMM_CUH
#define LS_FP4_GEMM_CUH

#include "ops/cuda/cu_util.h"
#include "ops/cuda/cu_ws.h"

/* 0, or ERR_INVAL / ERR_UNSUPPORTED naming the weight: NVFP4, BF16 activations, K % 16 == 0. */
static inline int fp4_check_args(const gemm_args *a, ls_err *e) {
    const lin_w *w = a->w;
    if (!w || w->kind != W_NVFP4)
        return errf(e, ERR_INVAL, "fp4_gemm: weight %s is not NVFP4", w && w->name ? w->name : "?");
    if (a->dt != ACT_BF16)
        return errf(e, ERR_UNSUPPORTED, "fp4_gemm on CUDA: activations must be BF16, got %s", act_name(a->dt));
    if (w->K % 16)
        return errf(e, ERR_INVAL, "fp4_gemm: weight %s: K=%d is not a multiple of 16", w->name ? w->name : "?",
                    w->K);
    return 0;
}

/* The `supported` test every CUDA backend of the two families starts with. */
static inline int fp4_common_supported(const dev_info *d, const gemm_shape *s, char *why, size_t n) {
    if (d->kind != DEV_CUDA) {
        snprintf(why, n, "needs a CUDA device");
        return 0;
    }
    if (s->dt != ACT_BF16) {
        snprintf(why, n, "activations must be BF16");
        return 0;
    }
    return 1;
}

/* Prefer shared memory over L1 for kernel fn, and raise its dynamic shared-memory
 * limit to smem when that is over the default (48 KB less fn's static shared memory,
 * cu_smem_default), once per device: function attributes belong to the current
 * device's context, so a flag per process would leave the second GPU of --tp 2 at the
 * defaults (a failed launch). have: one slot per device, the largest limit set there
 * so far (0 = nothing yet); the threads that drive the GPUs share it. */
static inline cudaError_t fp4_func_attr(const void *fn, size_t smem, size_t have[CU_WS_MAX_DEV]) {
    int dev = 0;
    cudaError_t c = cudaGetDevice(&dev);
    if (c != cudaSuccess) return c;
    if (dev < 0 || dev >= CU_WS_MAX_DEV) return cudaErrorInvalidDevice;
    size_t h = __atomic_load_n(&have[dev], __ATOMIC_ACQUIRE);
    if (!h) {
        cudaFuncSetAttribute(fn, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
        if ((c = cu_smem_default(fn, &h)) != cudaSuccess) return c; /* 48 KB less fn's static */
        if (!h) h = 1;
        __atomic_store_n(&have[dev], h, __ATOMIC_RELEASE);
    }
    if (smem <= h) return cudaSuccess;
    c = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (c == cudaSuccess) __atomic_store_n(&have[dev], smem, __ATOMIC_RELEASE);
    return c;
}

#endif
