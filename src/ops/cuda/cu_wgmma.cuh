/* cu_wgmma.cuh: the Hopper (sm_90a) helpers that the warpgroup-MMA kernels share: moe_wgmma.cu
 * (cuda_grouped_gemm's prefill GEMMs) and attention_prefill_wg.cu (cuda_flash_prefill at
 * head_dim 256). Include it only from files that the Makefile compiles for sm_90a alone: wgmma
 * exists nowhere else. Shared-memory operands are 32-bit shared-window addresses
 * (__cvta_generic_to_shared). cp.async's commit is cu_util.h's cu_cp_async_commit.
 */
#ifndef LS_CU_WGMMA_CUH
#define LS_CU_WGMMA_CUH

#include <stdint.h>

/* ---- cp.async, the async proxy ------------------------------------------------------- */

/* 16 bytes global -> shared (L2 only); !ok: the 16 bytes zero-filled, src not read */
__device__ __forceinline__ void cu_cp16_shared(uint32_t dst, const void *src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0));
}
/* until at most N of this thread's committed cp.async groups are in flight; a compiler barrier
 * for memory too (cu_util.h's cu_cp_async_wait is not) */
template <int N>
__device__ __forceinline__ void cu_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
/* this thread's generic-proxy writes to shared memory (stores, cp.async) visible to the async
 * proxy (wgmma's descriptor operands, TMA) */
__device__ __forceinline__ void cu_fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* ---- mbarrier ------------------------------------------------------------------------ */

__device__ __forceinline__ void cu_mbar_init(uint32_t a, int n) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(a), "r"(n) : "memory");
}
/* waits until the barrier's phase with parity par completed */
__device__ __forceinline__ void cu_mbar_wait(uint32_t a, int par) {
    uint32_t ok = 0;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, %3;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(ok)
                     : "r"(a), "r"(par), "r"(0x989680) /* suspend up to 10 ms: no busy spinning */
                     : "memory");
    } while (!ok);
}

/* ---- wgmma --------------------------------------------------------------------------- */

__device__ __forceinline__ void cu_wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cu_wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
/* until at most N of this warpgroup's committed wgmma groups are in flight */
template <int N>
__device__ __forceinline__ void cu_wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* keeps the compiler from moving accumulator accesses across the asynchronous MMAs */
template <int N>
__device__ __forceinline__ void cu_wg_fence_acc(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* Shared-memory matrix descriptor, K-major, 128-byte swizzle: start address >> 4, leading offset
 * 16 B (unused by this mode), stride 1024 B between 8-row groups, mode 1 in bits 62-63 */
__device__ __forceinline__ uint64_t cu_wg_desc_k128(uint32_t saddr) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
           ((uint64_t)1 << 62);
}

#endif
