/* bench/kernels/op_rates.cu: issue rates of the instructions an NVFP4 weight decode is made of,
 * and of two whole decoders, on the GPU it runs on (a standalone bench, not in the server).
 *   nvcc -O3 -std=c++17 -Isrc -gencode arch=compute_90a,code=sm_90a -o op_rates bench/kernels/op_rates.cu
 *   ./op_rates
 * Every kernel: a grid of 8 blocks an SM x 256 threads, each thread N iterations of 8 independent
 * dependency chains of one operation (so latency is hidden and the pipe's rate shows), the chains
 * folded into one store at the end (nothing is dead code). Prints per kind the warp instructions a
 * cycle an SM, from the event time and the SM clock (nvidia-smi's current clock is passed in, or
 * 1980 MHz).
 * The decoders, per 32-bit word of eight E2M1 codes, into four 2-element registers for mma A:
 *   place_bf16  nv4_e2m1x8_place (src/ops/cuda/nvfp4.cuh: 7 shifts as IMAD, 8 LOP3) + 4 HMUL2.BF16
 *               by the block scale (what mv_kernel runs today)
 *   e4m3_f16    codes -> E4M3 bytes (3 shifts, 4 LOP3), 4 cvt.rn.f16x2.e4m3x2 (F2FP), 4 HMUL2.F16
 *               by the block scale (the f16 path the FP8 GEMV uses, fp8_gemm.cu) */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops/cuda/nvfp4.cuh"

#define CHAINS 8
enum { K_LOP3, K_IMAD, K_SHF, K_PRMT, K_HMUL2_BF16, K_HFMA2_F16, K_F2FP_E4M3, K_F2FP_PACK_BF16, K_FFMA, K_DEC_PLACE,
       K_DEC_E4M3, K_N };
static const char *kname[K_N] = {"LOP3", "IMAD (x*16+y)", "SHF.R", "PRMT", "HMUL2.BF16", "HFMA2.F16",
                                 "F2FP e4m3x2->f16x2", "F2FP f32x2->bf16x2", "FFMA", "decoder place_bf16 (word)",
                                 "decoder e4m3_f16 (word)"};

__device__ __forceinline__ uint32_t f2fp_e4m3(uint32_t v) {
    uint32_t h;
    asm volatile("{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %1;\n\tcvt.rn.f16x2.e4m3x2 %0, lo;\n\t}" : "=r"(h) : "r"(v));
    return h;
}
__device__ __forceinline__ uint32_t f2fp_e4m3_hi(uint32_t v) {
    uint32_t h;
    asm volatile("{\n\t.reg .b16 lo, hi;\n\tmov.b32 {lo, hi}, %1;\n\tcvt.rn.f16x2.e4m3x2 %0, hi;\n\t}" : "=r"(h) : "r"(v));
    return h;
}
__device__ __forceinline__ uint32_t hmul2_f16(uint32_t a, uint32_t b) {
    __half2 r = __hmul2(*reinterpret_cast<__half2 *>(&a), *reinterpret_cast<__half2 *>(&b));
    return *reinterpret_cast<uint32_t *>(&r);
}
__device__ __forceinline__ uint32_t hfma2_f16(uint32_t a, uint32_t b, uint32_t c) {
    __half2 r = __hfma2(*reinterpret_cast<__half2 *>(&a), *reinterpret_cast<__half2 *>(&b),
                        *reinterpret_cast<__half2 *>(&c));
    return *reinterpret_cast<uint32_t *>(&r);
}

/* Eight E2M1 codes -> four f16x2 by way of E4M3 bytes: byte i of lo = code 2i (low nibble), of hi =
 * code 2i + 1; E4M3 = s eeee mmm with E2M1's e1 e0 at exponent bits 1..0 and m at the top mantissa bit
 * (value = e2m1 x 2^-6, exact, subnormals included); then two F2FP a register. out = (c0, c2), (c4,
 * c6), (c1, c3), (c5, c7). */
__device__ __forceinline__ void dec_e4m3(uint32_t q, uint32_t out[4]) {
    const uint32_t hi = ((q >> 2) & 0x1C1C1C1Cu) | (q & 0x80808080u);
    const uint32_t lo = ((q << 2) & 0x1C1C1C1Cu) | ((q << 4) & 0x80808080u);
    out[0] = f2fp_e4m3(lo);
    out[1] = f2fp_e4m3_hi(lo);
    out[2] = f2fp_e4m3(hi);
    out[3] = f2fp_e4m3_hi(hi);
}

__global__ void check_kernel(uint32_t *out) {
    const uint32_t b = threadIdx.x, q = b * 0x01010101u;
    uint32_t o[4];
    dec_e4m3(q, o);
    for (int r = 0; r < 4; r++) out[4 * b + r] = o[r];
}

template <int KIND>
__global__ void __launch_bounds__(256) rate_kernel(int n, uint32_t seed, uint32_t *sink) {
    uint32_t x[CHAINS];
    float f[CHAINS];
    const uint32_t t = threadIdx.x + blockIdx.x * blockDim.x;
#pragma unroll
    for (int c = 0; c < CHAINS; c++) {
        x[c] = (t * 2654435761u) ^ (seed + 0x9E3779B9u * c);
        f[c] = (float)(x[c] & 0xff) * 0.01f;
    }
    const uint32_t y = seed | 1u, sc = 0x3c003c00u ^ (seed & 0x00010001u); /* ~1.0 f16 / bf16-ish */
    for (int i = 0; i < n; i++) {
#pragma unroll
        for (int c = 0; c < CHAINS; c++) {
            if (KIND == K_LOP3) x[c] = (x[c] & y) ^ (x[c] >> 0) ^ 0x5a5a5a5au;
            if (KIND == K_IMAD) x[c] = x[c] * 16u + y;
            if (KIND == K_SHF) x[c] = __funnelshift_r(x[c], x[c], 7) ;
            if (KIND == K_PRMT) x[c] = __byte_perm(x[c], y, 0x3715u);
            if (KIND == K_HMUL2_BF16) x[c] = nv4_hmul2(x[c], sc);
            if (KIND == K_HFMA2_F16) x[c] = hfma2_f16(x[c], sc, y);
            if (KIND == K_F2FP_E4M3) x[c] = f2fp_e4m3(x[c]);
            if (KIND == K_F2FP_PACK_BF16) x[c] = nv4_pack_bf16x2(__uint_as_float(x[c]), __uint_as_float(x[c] ^ y));
            if (KIND == K_FFMA) f[c] = fmaf(f[c], 0.999f, 0.5f);
            if (KIND == K_DEC_PLACE) {
                uint32_t o[4];
                nv4_e2m1x8_place(x[c], o);
                x[c] = nv4_hmul2(o[0], sc) ^ nv4_hmul2(o[1], sc) ^ nv4_hmul2(o[2], sc) ^ nv4_hmul2(o[3], sc) ^ (x[c] + y);
            }
            if (KIND == K_DEC_E4M3) {
                uint32_t o[4];
                dec_e4m3(x[c], o);
                x[c] = hmul2_f16(o[0], sc) ^ hmul2_f16(o[1], sc) ^ hmul2_f16(o[2], sc) ^ hmul2_f16(o[3], sc) ^ (x[c] + y);
            }
        }
    }
    uint32_t acc = 0;
#pragma unroll
    for (int c = 0; c < CHAINS; c++) acc ^= x[c] ^ __float_as_uint(f[c]);
    if (acc == 0x12345678u) sink[t] = acc; /* practically never: the chains stay live */
}

/* instructions of the kind per loop body per chain (LOP3: one LOP3 if the compiler fuses, see SASS) */
template <int KIND>
static float run(int sms, int n, uint32_t *sink, float mhz, float *ms_out) {
    const int blocks = sms * 8;
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    rate_kernel<KIND><<<blocks, 256>>>(n / 8, 1u, sink); /* warm */
    cudaEventRecord(a);
    rate_kernel<KIND><<<blocks, 256>>>(n, 1u, sink);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0.f;
    cudaEventElapsedTime(&ms, a, b);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        fprintf(stderr, "%s: %s\n", kname[KIND], cudaGetErrorString(e));
        exit(1);
    }
    *ms_out = ms;
    /* loop bodies (one per chain) a cycle an SM, in warp units */
    const double bodies = (double)blocks * 256 / 32 * n * CHAINS;
    const double cycles = ms * 1e-3 * mhz * 1e6;
    return (float)(bodies / cycles / sms);
}

int main(int argc, char **argv) {
    float mhz = argc > 1 ? (float)atof(argv[1]) : 1980.f;
    int dev = 0, sms = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    uint32_t *sink;
    cudaMalloc(&sink, (size_t)sms * 8 * 256 * 4);
    const int n = 4096;
    printf("op_rates: %d SMs, %.0f MHz; per SM a cycle: warp-level loop bodies (one op, or one decoded word)\n", sms, mhz);
    float ms, r;
#define ONE(K)                                                                                                         \
    r = run<K>(sms, K >= K_DEC_PLACE ? n / 4 : n, sink, mhz, &ms);                                                     \
    printf("%-28s %7.3f /clk/SM  (%.3f ms)\n", kname[K], r, ms);
    ONE(K_LOP3) ONE(K_IMAD) ONE(K_SHF) ONE(K_PRMT) ONE(K_HMUL2_BF16) ONE(K_HFMA2_F16) ONE(K_F2FP_E4M3)
        ONE(K_F2FP_PACK_BF16) ONE(K_FFMA) ONE(K_DEC_PLACE) ONE(K_DEC_E4M3)
    /* dec_e4m3 against the E2M1 table for every code byte (x 2^6 exact) */
    uint32_t *d;
    cudaMalloc(&d, 256 * 16);
    check_kernel<<<1, 256>>>(d);
    uint32_t h[256 * 4];
    cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
    static const float tab[8] = {0.f, .5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
    int bad = 0;
    for (int b = 0; b < 256; b++) {
        const int lo = b & 15, hi = b >> 4; /* the word's every byte is b: codes 2i = lo, 2i + 1 = hi */
        const float vlo = (lo & 8 ? -1.f : 1.f) * tab[lo & 7], vhi = (hi & 8 ? -1.f : 1.f) * tab[hi & 7];
        for (int r = 0; r < 4; r++)
            for (int half = 0; half < 2; half++) {
                __half_raw hr;
                hr.x = (unsigned short)(h[4 * b + r] >> (16 * half));
                const float v = __half2float(__half(hr)) * 64.f, want = r < 2 ? vlo : vhi;
                if (v != want || (v == 0.f && signbit(v) != signbit(want))) bad++;
            }
    }
    printf("dec_e4m3 exact on all 256 code bytes: %s (%d wrong)\n", bad ? "NO" : "yes", bad);
    return bad != 0;
}
