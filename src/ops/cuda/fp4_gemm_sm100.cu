/* fp4_gemm_sm100.cu: the kernel of the test-only backend cuda_broken_sm100.
 *
 * This file alone is compiled with `-gencode arch=compute_100a,code=sm_100a`
 * (Makefile), the way a kernel library built only for Blackwell ships: the
 * fat binary holds SASS for sm_100a and no PTX. On any other GPU (the H200 is
 * sm_90) the launch fails with cudaErrorNoKernelImageForDevice ("no kernel
 * image is available for execution on the device"), which is not sticky; the
 * launcher reports it as ERR_UNSUPPORTED so the doctor records `unsupported`.
 * On an sm_100a GPU it computes the product correctly (one thread per output).
 */
#include "ops/cuda/cu_util.h"

__global__ void fp4_sm100_kernel(int M, int N, int K, const bf16 *__restrict__ x,
                                 const uint8_t *__restrict__ w, const uint8_t *__restrict__ sc,
                                 float scale2, bf16 *__restrict__ y, int accumulate) {
    int n = blockIdx.x * blockDim.x + threadIdx.x, m = blockIdx.y;
    if (n >= N || m >= M) return;
    float acc = 0.f;
    for (int k = 0; k < K; k++) {
        uint8_t b = w[(size_t)n * (K / 2) + k / 2];
        float v = cu_e2m1_lut[(k & 1) ? (b >> 4) : (b & 15)] * cu_e4m3_to_f32(sc[(size_t)n * (K / 16) + k / 16]);
        acc += v * __bfloat162float(x[(size_t)m * K + k]);
    }
    acc *= scale2;
    size_t o = (size_t)m * N + n;
    if (accumulate) acc += __bfloat162float(y[o]);
    y[o] = __float2bfloat16_rn(acc);
}

extern "C" int lsc_broken_sm100_launch(const gemm_args *a, ls_stream s, ls_err *e) {
    const lin_w *w = a->w;
    if (a->M <= 0) return 0;
    if (a->M > 65535) return errf(e, ERR_UNSUPPORTED, "cuda_broken_sm100: M=%d too large", a->M);
    /* what a careful library does first: ask whether the image exists */
    cudaFuncAttributes fa;
    cudaError_t c = cudaFuncGetAttributes(&fa, fp4_sm100_kernel);
    if (c != cudaSuccess) {
        cudaGetLastError(); /* not sticky: clear it */
        return cu_fail(e, c, "fp4_gemm cuda_broken_sm100");
    }
    dim3 grid((w->N + 127) / 128, a->M);
    fp4_sm100_kernel<<<grid, 128, 0, (cudaStream_t)s>>>(a->M, w->N, w->K, (const bf16 *)a->x,
                                                        (const uint8_t *)w->data, w->scale, w->scale2,
                                                        (bf16 *)a->y, a->accumulate);
    CU_LAUNCHED(e, "fp4_gemm cuda_broken_sm100");
    return 0;
}
