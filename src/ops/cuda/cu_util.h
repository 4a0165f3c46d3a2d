/* cu_util.h: device helpers shared by the .cu files of src/ops/cuda (never
 * included from C): the C headers behind extern "C", CUDA error -> ls_err,
 * NVFP4 nibble and E4M3 scale decoding in registers, and mma.sync wrappers.
 *
 * Invariants: every launcher returns 0 or a negative ERR_* with e filled;
 * a missing kernel image for this GPU ("no kernel image is available") maps
 * to ERR_UNSUPPORTED, every other CUDA error to ERR_RUNTIME.
 */
#ifndef LS_CU_UTIL_H
#define LS_CU_UTIL_H

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* base.h is C11; nvcc's C++ front end does not know _Noreturn. */
#ifndef _Noreturn
#define _Noreturn __attribute__((noreturn))
#endif
extern "C" {
#include "ops/ops.h"
#include "ops/cuda/cuda_ops.h"
}

typedef __nv_bfloat16 bf16;

/* Fill e from a CUDA error; returns ERR_UNSUPPORTED for a missing kernel
 * image (the GPU is not one the code was built for), else ERR_RUNTIME. */
static inline int cu_fail(ls_err *e, cudaError_t c, const char *what) {
    int code = (c == cudaErrorNoKernelImageForDevice || c == cudaErrorUnsupportedPtxVersion ||
                c == cudaErrorInvalidDeviceFunction)
                   ? ERR_UNSUPPORTED
                   : ERR_RUNTIME;
    return errf(e, code, "%s: %s (%s)", what, cudaGetErrorString(c), cudaGetErrorName(c));
}

/* A 0/1 switch from the environment (the decode-step kernels' LASTSTAND_* knobs): "0" off,
 * "1" on, anything else (or unset) dflt. Callers cache it in a static. */
static inline int cu_env_switch(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && !strcmp(v, "0") ? 0 : v && !strcmp(v, "1") ? 1 : dflt;
}

/* The dynamic shared memory kernel fn may take at launch on the current device without
 * raising its attribute: 48 KB less the kernel's own static shared memory
 * (cudaFuncAttributes.maxDynamicSharedSizeBytes), not 48 KB. A launcher that compared its
 * dynamic bytes with 48 KB launched a kernel with static shared memory and exactly 48 KB of
 * dynamic (moe_router_kernel at H 3072, M 8: the 122B's MoE) into "invalid argument". */
static inline cudaError_t cu_smem_default(const void *fn, size_t *bytes) {
    cudaFuncAttributes fa;
    const cudaError_t c = cudaFuncGetAttributes(&fa, fn);
    *bytes = c == cudaSuccess ? (size_t)fa.maxDynamicSharedSizeBytes : 0;
    return c;
}

/* Let kernel fn take `bytes` of dynamic shared memory on the current device: the attribute
 * raised where the default (cu_smem_default) is less. */
static inline cudaError_t cu_smem_allow(const void *fn, size_t bytes) {
    size_t h = 0;
    cudaError_t c = cu_smem_default(fn, &h);
    if (c != cudaSuccess || bytes <= h) return c;
    return cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
}

/* After a launch: the launch error (bad config, missing image), not a sync. */
#define CU_LAUNCHED(e, what)                                     \
    do {                                                         \
        cudaError_t c_ = cudaGetLastError();                     \
        if (c_ != cudaSuccess) return cu_fail((e), c_, (what));  \
    } while (0)

#define CU_TRY(e, call, what)                                    \
    do {                                                         \
        cudaError_t c_ = (call);                                 \
        if (c_ != cudaSuccess) return cu_fail((e), c_, (what));  \
    } while (0)

/* E2M1 code -> value (reference/qwen35-and-nvfp4.md 4.4). */
__device__ __constant__ static const float cu_e2m1_lut[16] = {
    0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f, -0.f, -0.5f, -1.f, -1.5f, -2.f, -3.f, -4.f, -6.f};

__device__ __forceinline__ float cu_e4m3_to_f32(uint8_t v) {
    __nv_fp8_e4m3 f;
    f.__x = v;
    return (float)f;
}

/* Eight E2M1 codes in one 32-bit word (code i in bits 4i..4i+3, i.e. the
 * byte order of the checkpoint, low nibble first) -> four bf16x2 registers:
 * out[j] = (value of code 2j in the low half, code 2j+1 in the high half).
 * Exact: every E2M1 value is a bf16. Built from byte permutes (prmt): the
 * bf16 of |v| has high byte H[i] and low byte L[i] for magnitude index i,
 * and the sign bit of each code moves to bit 15 of its half. */
__device__ __forceinline__ void cu_e2m1x8_to_bf16x8(uint32_t w, uint32_t out[4]) {
    /* magnitudes 0..7 = 0, .5, 1, 1.5, 2, 3, 4, 6 -> bf16 0000 3F00 3F80 3FC0 4000 4040 4080 40C0 */
    const uint32_t L0 = 0xC0800000u, L1 = 0xC0804000u; /* low bytes  for i = 0..3 | 4..7 */
    const uint32_t H0 = 0x3F3F3F00u, H1 = 0x40404040u; /* high bytes for i = 0..3 | 4..7 */
    uint32_t t = w << 4; /* sign of even codes to bit 7 of each byte */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        uint32_t sel = (w >> (16 * h)) & 0x7777u; /* four 3-bit indices, no sign-replicate bit */
        uint32_t lo = __byte_perm(L0, L1, sel);
        uint32_t hi = __byte_perm(H0, H1, sel);
        /* signs of codes 4h..4h+3 at bit 7 of bytes 0..3 */
        uint32_t s = __byte_perm(t, w, h == 0 ? 0x5140u : 0x7362u);
        hi |= s & 0x80808080u;
        out[2 * h + 0] = __byte_perm(lo, hi, 0x5140u);
        out[2 * h + 1] = __byte_perm(lo, hi, 0x7362u);
    }
}

__device__ __forceinline__ uint32_t cu_bf16x2_mul(uint32_t a, uint32_t b) {
    __nv_bfloat162 x = *reinterpret_cast<__nv_bfloat162 *>(&a);
    __nv_bfloat162 y = *reinterpret_cast<__nv_bfloat162 *>(&b);
    __nv_bfloat162 r = __hmul2(x, y);
    return *reinterpret_cast<uint32_t *>(&r);
}

/* An E4M3 scale as bf16x2 (both halves equal); exact. */
__device__ __forceinline__ uint32_t cu_scale_bf16x2(uint8_t s) {
    __nv_bfloat16 b = __float2bfloat16_rn(cu_e4m3_to_f32(s));
    uint16_t u = *reinterpret_cast<uint16_t *>(&b);
    return (uint32_t)u | ((uint32_t)u << 16);
}

/* D = A·B + D, m16n8k16, bf16 in, fp32 accumulate (A row-major, B col-major). */
__device__ __forceinline__ void cu_mma_bf16_16816(float d[4], const uint32_t a[4], uint32_t b0,
                                                  uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* 16-byte streaming load that skips L1 (weights are read once per call). */
__device__ __forceinline__ uint4 cu_ld_stream16(const void *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

/* cp.async (sm_80+): 16 bytes global -> shared without a register, cached in L2
 * only; groups complete in commit order, each thread waits for its own copies. */
__device__ __forceinline__ void cu_cp_async16(void *smem, const void *gmem) {
    unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(sa), "l"(gmem));
}
__device__ __forceinline__ void cu_cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
/* wait until at most N of this thread's committed groups are still in flight */
template <int N>
__device__ __forceinline__ void cu_cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ uint4 cu_lds16(const void *smem) {
    return *reinterpret_cast<const uint4 *>(smem);
}

/* The two E4M3 scales of a uint16 (low byte first) as bf16x2 pairs (s, s): exact.
 * One cvt for both bytes, then f16 -> f32 -> bf16 (E4M3 values are exact in f16). */
__device__ __forceinline__ void cu_scale2_bf16x2(uint16_t s, uint32_t &lo, uint32_t &hi) {
    uint32_t h2;
    asm("{cvt.rn.f16x2.e4m3x2 %0, %1;}\n" : "=r"(h2) : "h"(s));
    __half2 hh = *reinterpret_cast<__half2 *>(&h2);
    float2 f = __half22float2(hh);
    __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
    uint32_t u = *reinterpret_cast<uint32_t *>(&b);
    lo = __byte_perm(u, 0, 0x1010);
    hi = __byte_perm(u, 0, 0x3232);
}

/* cp.async.wait_group with a count known only after unrolling (0..7): the switch folds */
__device__ __forceinline__ void cu_cp_async_wait_dyn(int pending) {
    switch (pending) {
    case 0: cu_cp_async_wait<0>(); break;
    case 1: cu_cp_async_wait<1>(); break;
    case 2: cu_cp_async_wait<2>(); break;
    case 3: cu_cp_async_wait<3>(); break;
    case 4: cu_cp_async_wait<4>(); break;
    case 5: cu_cp_async_wait<5>(); break;
    case 6: cu_cp_async_wait<6>(); break;
    default: cu_cp_async_wait<7>(); break;
    }
}

/* One 128-element K chunk of a 16-row NVFP4 tile against 8 token columns:
 * w0 / w1 = this lane's 16 B of codes of rows g and g + 8 (32 elements each: two
 * scale blocks, whose E4M3 scales are s0 / s1, low byte first), xv = the lane's
 * 32 matching x values (bf16, K order) for token column g. 8 mma m16n8k16 into
 * acc (c0, c1: row g, tokens 2t, 2t + 1; c2, c3: row g + 8). The K permutation
 * inside the lane's slice is the same for A and B. */
__device__ __forceinline__ void cu_w4_chunk_mma(uint4 w0, uint4 w1, uint16_t s0, uint16_t s1, const uint4 (&xv)[4],
                                                float (&acc)[4]) {
    uint32_t sa0, sb0, sa1, sb1;
    cu_scale2_bf16x2(s0, sa0, sb0);
    cu_scale2_bf16x2(s1, sa1, sb1);
    const uint32_t q0[4] = {w0.x, w0.y, w0.z, w0.w}, q1[4] = {w1.x, w1.y, w1.z, w1.w};
#pragma unroll
    for (int q = 0; q < 4; q++) {
        uint32_t a0[4], a1[4];
        cu_e2m1x8_to_bf16x8(q0[q], a0);
        cu_e2m1x8_to_bf16x8(q1[q], a1);
#pragma unroll
        for (int r = 0; r < 4; r++) {
            a0[r] = cu_bf16x2_mul(a0[r], q < 2 ? sa0 : sb0);
            a1[r] = cu_bf16x2_mul(a1[r], q < 2 ? sa1 : sb1);
        }
        const uint32_t f0[4] = {a0[0], a1[0], a0[1], a1[1]}, f1[4] = {a0[2], a1[2], a0[3], a1[3]};
        cu_mma_bf16_16816(acc, f0, xv[q].x, xv[q].y);
        cu_mma_bf16_16816(acc, f1, xv[q].z, xv[q].w);
    }
}

/* cuBLASLt GEMM shared by the families of this module (fp4_gemm.cu). */
int cu_lt_gemm(int M, int N, int K, const void *W, const void *A, void *D, int d32, float alpha,
               float beta, cudaStream_t st, ls_err *e);

#endif
