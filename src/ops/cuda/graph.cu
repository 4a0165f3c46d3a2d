/* graph.cu: CUDA graph capture and replay for the forward pass (graph.h).
 *
 * The model captures a whole decode step (all layers, final norm, lm_head,
 * sampling) once per batch-size bucket and replays it; this file only wraps
 * the runtime: begin / end (instantiate, or discard a failed recording and
 * clear the runtime's error state so the eager path can run next), launch,
 * destroy. Capture mode is thread-local: tensor-parallel ranks and other
 * threads keep making CUDA calls meanwhile.
 */
#include "ops/cuda/cu_util.h"
#include "ops/cuda/graph.h"

extern "C" int cug_begin(ls_stream s, ls_err *e) {
    CU_TRY(e, cudaStreamBeginCapture((cudaStream_t)s, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    return 0;
}

extern "C" int cug_end(ls_stream s, int ok, void **exec, ls_err *e) {
    *exec = NULL;
    cudaGraph_t g = NULL;
    cudaError_t c = cudaStreamEndCapture((cudaStream_t)s, &g);
    if (!ok || c != cudaSuccess) {
        if (g) cudaGraphDestroy(g);
        cudaGetLastError(); /* an invalidated capture leaves a non-sticky error behind */
        if (!ok) return 0;
        return errf(e, ERR_UNSUPPORTED, "CUDA graph capture: %s (%s)", cudaGetErrorString(c), cudaGetErrorName(c));
    }
    cudaGraphExec_t x = NULL;
    c = cudaGraphInstantiateWithFlags(&x, g, 0);
    cudaGraphDestroy(g);
    if (c != cudaSuccess) {
        cudaGetLastError();
        return errf(e, ERR_UNSUPPORTED, "CUDA graph instantiate: %s (%s)", cudaGetErrorString(c),
                    cudaGetErrorName(c));
    }
    *exec = (void *)x;
    return 0;
}

extern "C" int cug_stream_new(ls_stream *s, ls_err *e) {
    cudaStream_t st = NULL;
    CU_TRY(e, cudaStreamCreateWithFlags(&st, cudaStreamDefault), "cudaStreamCreate");
    *s = (ls_stream)st;
    return 0;
}

extern "C" void cug_stream_free(ls_stream s) {
    if (s) cudaStreamDestroy((cudaStream_t)s);
}

extern "C" int cug_launch(void *exec, ls_stream s, ls_err *e) {
    CU_TRY(e, cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)s), "cudaGraphLaunch");
    return 0;
}

extern "C" void cug_destroy(void *exec) {
    if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec);
}
