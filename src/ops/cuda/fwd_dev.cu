/* fwd_dev.cu: the CUDA device's memory table (dev_mem: open, alloc, copies,
 * memset, sync) that the model's forward pass uses, and the registration
 * hook ops_cuda_register_fwd() for the forward-pass pieces: the memory table
 * and small ops "cuda" (small.cu). The attention and gdn backends are
 * attention.cu / gdn.cu, registered once by ops_cuda_register_all
 * (runtime.cu).
 *
 * Streams: the model runs on the legacy default stream (ls_stream NULL), so
 * every backend's launches, cuBLASLt calls and copies are ordered with each
 * other whatever stream they name. Copies are cudaMemcpyAsync on it; d2h and
 * sync wait for the stream and report a kernel fault as ERR_RUNTIME.
 */
#include "ops/cuda/cu_util.h"
#include "ops/cuda/fwd_cuda.h"

#include <string.h>

static int dm_open(int ordinal, dev_info *d, ls_stream *s, ls_err *e) {
    int n = 0;
    cudaError_t c = cudaGetDeviceCount(&n);
    if (c != cudaSuccess)
        return errf(e, ERR_UNSUPPORTED, "%s (%s)", cudaGetErrorString(c), cudaGetErrorName(c));
    if (n <= ordinal) return errf(e, ERR_UNSUPPORTED, "%d CUDA devices, none with index %d", n, ordinal);
    int rc = lsc_device_open(ordinal, d, NULL, 0, e);
    if (rc) return rc;
    *s = NULL;
    return 0;
}

static void dm_close_stream(ls_stream s) { (void)s; }

static void *dm_alloc(size_t n, ls_err *e) { return lsc_malloc(n, e); }

static void dm_free(void *p) { lsc_free(p); }

static int dm_h2d(void *dst, const void *src, size_t n, ls_stream s, ls_err *e) {
    if (!n) return 0;
    CU_TRY(e, cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, (cudaStream_t)s), "cudaMemcpy H2D");
    return 0;
}

static int dm_d2h(void *dst, const void *src, size_t n, ls_stream s, ls_err *e) {
    if (!n) return 0;
    CU_TRY(e, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, (cudaStream_t)s), "cudaMemcpy D2H");
    CU_TRY(e, cudaStreamSynchronize((cudaStream_t)s), "forward pass");
    return 0;
}

static int dm_d2d(void *dst, const void *src, size_t n, ls_stream s, ls_err *e) {
    if (!n) return 0;
    CU_TRY(e, cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, (cudaStream_t)s), "cudaMemcpy D2D");
    return 0;
}

static int dm_memset0(void *dst, size_t n, ls_stream s, ls_err *e) {
    if (!n) return 0;
    CU_TRY(e, cudaMemsetAsync(dst, 0, n, (cudaStream_t)s), "cudaMemset");
    return 0;
}

static int dm_sync(ls_stream s, ls_err *e) {
    CU_TRY(e, cudaStreamSynchronize((cudaStream_t)s), "cudaStreamSynchronize");
    CU_TRY(e, cudaGetLastError(), "kernel launch");
    return 0;
}

static int dm_bind_thread(int ordinal, ls_err *e) {
    CU_TRY(e, cudaSetDevice(ordinal), "cudaSetDevice");
    return 0;
}

static int dm_count(void) {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

static const dev_mem dev_mem_cuda = {DEV_CUDA, dm_open,    dm_close_stream, dm_alloc,       dm_free, dm_h2d,
                                     dm_d2h,   dm_memset0, dm_sync,         dm_bind_thread, dm_count,
                                     dm_d2d};

extern "C" void ops_cuda_register_fwd(void) {
    ops_dev_mem_register(&dev_mem_cuda);
    ops_small_register(&small_cuda);
}
