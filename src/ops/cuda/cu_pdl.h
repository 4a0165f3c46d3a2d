/* cu_pdl.h: programmatic dependent launch (sm_90), shared by the CUDA backends.
 * A kernel launched with cu_launch_pdl(1, ...) may start while the kernel before it in
 * the stream still runs. It must call cu_pdl_wait() before it reads anything that kernel
 * writes (and before it writes anything that kernel reads): the wait returns once the
 * previous grid completed with its memory visible. cu_pdl_trigger() lets the next
 * kernel's blocks be scheduled early. Without the launch attribute (pdl = 0, or a GPU
 * before sm_90) both instructions are no-ops and the stream orders kernels as usual;
 * inside a CUDA graph capture the attribute becomes a programmatic edge. */
#pragma once
#include <cuda_runtime.h>

__device__ __forceinline__ void cu_pdl_wait(void) { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void cu_pdl_trigger(void) {
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

/* Launch K<<<grid, block, smem, st>>>(args...), with the programmatic-stream-serialization
 * attribute when pdl is set; returns the launch's own error (not cudaGetLastError). */
template <typename... KArgs, typename... Args>
static inline cudaError_t cu_launch_pdl(int pdl, void (*K)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                        cudaStream_t st, Args... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    return cudaLaunchKernelEx(&cfg, K, args...);
}
