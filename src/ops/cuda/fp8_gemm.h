/* fp8_gemm.h: FP8 (E4M3) weights x BF16 activations ("W8A16") for the gemm family on CUDA
 * (fp8_gemm.cu): the small-M kernel that cuda_gemv runs for W_FP8 weights, the dequantizer
 * that cuda_cublaslt runs before its BF16 GEMM, and the plain reference of cuda_ref.
 * C-callable from the .cu files of src/ops/cuda (never included from C).
 *
 * A W_FP8 lin_w (ops.h): data = E4M3 codes [N, K] (row stride K, no NaN codes), fscale = fp32
 * scales in device memory, W[n, k] = e4m3(data[n, k]) · lin_fp8_scale(w, n, k). x and y are
 * BF16 [M, K] / [M, N]; fp32 accumulation, y rounded once (RN); accumulate = 1 adds the old
 * y in fp32 before that rounding. Every function returns 0 or a negative ERR_* with e filled
 * (the *_ok / *_check ones: 1 = taken, 0 = not, with the reason in why).
 */
#ifndef LS_FP8_GEMM_H
#define LS_FP8_GEMM_H

#include <cuda_runtime.h>
#include <stddef.h>

/* base.h is C11; nvcc's C++ front end does not know _Noreturn (as cu_util.h). */
#ifndef _Noreturn
#define _Noreturn __attribute__((noreturn))
#endif
extern "C" {
#include "ops/ops.h"
}

/* The largest M the small-M kernel takes (4 tokens per mma, 4 mma per weight fragment). */
#define CU_FP8_GEMV_MAX_M 16
/* The most weights one grouped launch (cu_fp8_gemv_run) takes. */
#define CU_FP8_GEMV_MAX_MATS 8

extern "C" {

/* 1 when w is a usable W_FP8 weight for any of the CUDA paths: fscale set, fs_br / fs_bc /
 * fs_cols >= 1, fs_r0 / fs_c0 >= 0, and (when fs_n > 0) the view's last scale index inside
 * the fs_n floats; else 0 with the reason. */
int cu_fp8_w_ok(const lin_w *w, char *why, size_t n);

/* 1 when every 64-column group of the view has one scale per row: the view lies inside one
 * column block of the scales (per tensor, per row; fs_cols == 1 layouts), or fs_bc % 64 == 0
 * and fs_c0 % 64 == 0 (128 x 128 blocks, tensor-parallel slices on 64-column boundaries). */
int cu_fp8_scale_per_64(const lin_w *w);

/* The small-M kernel at shape level: M <= 16, K % 64 == 0, and x stageable in shared memory
 * over a cluster of at most 8 blocks. */
int cu_fp8_gemv_shape_ok(int M, int N, int K, char *why, size_t n);

/* 1 if the small-M kernel takes this call: W_FP8 (cu_fp8_w_ok), BF16 activations, M <= 16
 * (M <= 0: nothing to do, taken), K % 64 == 0, x / W / y 16-byte aligned, one scale per
 * 64-column group (cu_fp8_scale_per_64); else 0 with the reason. */
int cu_fp8_gemv_check(const gemm_args *a, char *why, size_t n);

/* n (1..CU_FP8_GEMV_MAX_MATS) products that share M, x, K and accumulate, as one launch over
 * their concatenated 16-row tiles, each writing its own y. Every a[i] must pass
 * cu_fp8_gemv_check (ERR_UNSUPPORTED with the reason otherwise; ERR_INVAL when they do not
 * share M, x, K, accumulate). Graph-safe: no allocation, no host synchronisation. */
int cu_fp8_gemv_run(int n, const gemm_args *a, cudaStream_t st, ls_err *e);

/* W as BF16 [N, K] at out (16-byte aligned device memory; e4m3 · scale in fp32, rounded once
 * to nearest even), any K: the large-M path dequantizes, then runs a BF16 GEMM. */
int cu_fp8_dequant(const lin_w *w, void *out, cudaStream_t st, ls_err *e);

/* The plain reference: one thread per output, an fp32 loop over k (in k order) of
 * e4m3(w) · scale · x; any shape. */
int cu_fp8_ref_run(const gemm_args *a, cudaStream_t st, ls_err *e);
}

#endif
