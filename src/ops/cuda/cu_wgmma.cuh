/* cu_wgmma.cuh: the Hopper (sm_90a) helpers that the warpgroup-MMA kernels share: moe_wgmma.cu
 * (cuda_grouped_gemm's prefill GEMMs) and attention_prefill_wg.cu (cuda_flash_prefill at
 * head_dim 128 and 256). Include it only from files that the Makefile compiles for sm_90a alone: wgmma
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
/* The accumulator operands d[b] .. of the inline wgmma statements below ("+f": read and written) */
#define CU_WG_R4(b) "+f"(d[b]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3])
#define CU_WG_R16(b) CU_WG_R4(b), CU_WG_R4(b + 4), CU_WG_R4(b + 8), CU_WG_R4(b + 12)
#define CU_WG_R32(b) CU_WG_R16(b), CU_WG_R16(b + 16)

/* d[0..63] (+)= A[64 x 16] · B[128 x 16]ᵀ, m64n128k16 (BF16 in, fp32 accumulators), A and B K-major in
 * shared memory (descriptors da, db); acc 0: d = A·Bᵀ. d: the thread's 64 accumulators (the first 64
 * of a longer array where a kernel keeps more) */
__device__ __forceinline__ void cu_wg_mma128_ss(float *d, uint64_t da, uint64_t db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : CU_WG_R32(0), CU_WG_R32(32)
        : "l"(da), "l"(db), "r"(acc));
}

/* d[0..63] (+)= A[64 x 16] · B, m64n128k16, A in registers (a[4]: mma.sync's m16n8k16 A fragment
 * layout), B in shared memory (descriptor db): TB 0 K-major [128 x 16] (d += A·Bᵀ), TB 1 MN-major
 * [16 x 128] (the transposed read: d += A·B); acc 0: d overwritten */
template <int TB>
__device__ __forceinline__ void cu_wg_mma128_rs(float *d, const uint32_t *a, uint64_t db, int acc) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
        : CU_WG_R32(0), CU_WG_R32(32)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(acc), "n"(TB));
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
