/* cuda_ops.h: the CUDA module's C surface: its backends (impl tables that
 * ops_cuda_register_all() puts into the ops registries) and the few runtime
 * helpers the doctor and the kernel benchmark need (device query, memory,
 * events), so that no C file outside src/ops/cuda includes CUDA headers.
 *
 * Backends (src/ops/cuda/<family>.cu, one file per family):
 *   fp4_gemm: cuda_w4a16_mma      NVFP4 dequantized in registers, mma.sync m16n8k16
 *                                 (weights as the A operand, tokens as N = 8): small M
 *             cuda_dequant_cublas whole weight -> BF16 workspace, then cuBLASLt: large M
 *             cuda_ref            one thread per output, fp32 loop over K
 *             test-only (LASTSTAND_TEST_BROKEN_BACKENDS=1): cuda_broken_sm100 (built for
 *             sm_100a only), cuda_broken_nan3072 (NaN when M == 3072), cuda_broken_illegal
 *   gemm:     cuda_cublaslt (BF16 weight; FP8 dequantized into a BF16 workspace first), cuda_ref
 *             (BF16 and FP8)
 *             cuda_gemv           M <= 16: mma.sync with the weight rows as A, K split over a
 *                                 thread block cluster for small N, deterministic (gemv.cu); FP8
 *                                 (E4M3) weights at K % 64 == 0: 1 byte a weight streamed, codes
 *                                 to f16 in registers, x to f16 exactly (fp8_gemm.cu)
 *   moe:      cuda_fused_decode   M <= 8, NVFP4 routed experts (moe_fused.cu): router, top-k,
 *                                 gate/up, down chained by programmatic dependent launch; a BF16
 *                                 shared expert runs inside the router and top-k launches
 *             cuda_expert_loop    any M: tokens sorted by expert, fp4_gemm per expert
 *             cuda_grouped_gemm   any M, NVFP4: routing, sort and tile table on the device,
 *                                 grouped mma.sync GEMMs over expert tiles (moe_grouped.cu),
 *                                 GEMVs per expert tile at 9..64 tokens (moe_mid.cu)
 *   attention: cuda_flash_decode  split-K over 256-position chunks, GQA group per block
 *             cuda_naive          one warp per (token, head), online softmax
 *             (seqs and their page lists are host memory; flattened per call)
 *             cuda_flash_prefill  FlashAttention-2 tiles on mma.sync, (token, head) rows of a GQA
 *                                 group per tile, K/V tiles shared by the group, split-K for small
 *                                 grids; decode-only calls and graph captures split each row into
 *                                 128-key chunks fixed by its context (graph = eager bit for bit)
 *                                 (attention_prefill.cu)
 *   gdn:       cuda_recurrent      conv kernel + per-(sequence, v head) recurrence, S in registers
 *             cuda_chunked        chunks of 64 tokens in the WY/UT form on mma.sync (FP16 operands,
 *                                 fp32 accumulation), S in registers as accumulators (gdn_chunked.cu)
 *             cuda_per_token      token by token with S in global memory (gdn_chunked.cu)
 *             cuda_decode         one launch (conv, norms, g/β, delta rule), a warp per 16 value
 *                                 columns of a head, S in registers, a k head's blocks one cluster;
 *                                 a call with a chunk of > 64 new tokens goes to cuda_chunked
 *                                 (gdn_decode.cu; registered first: auto's static choice)
 *
 * Memory: backends are stateless except for per-device lazily created
 * cuBLASLt handles and workspaces (grown on first use, never in steady state).
 */
#ifndef LS_CUDA_OPS_H
#define LS_CUDA_OPS_H

#include "ops/ops.h"

extern const fp4_gemm_impl fp4_gemm_cuda_w4a16_mma;
extern const fp4_gemm_impl fp4_gemm_cuda_dequant_cublas;
extern const fp4_gemm_impl fp4_gemm_cuda_ref;
extern const fp4_gemm_impl fp4_gemm_cuda_broken_sm100;
extern const fp4_gemm_impl fp4_gemm_cuda_broken_nan3072;
extern const fp4_gemm_impl fp4_gemm_cuda_broken_illegal;
extern const moe_impl moe_cuda_fused_decode;
extern const moe_impl moe_cuda_expert_loop;
extern const moe_impl moe_cuda_grouped_gemm;
extern const attn_impl attn_cuda_flash_decode;
extern const attn_impl attn_cuda_naive;
extern const attn_impl attn_cuda_flash_prefill;
extern const gdn_impl gdn_cuda_recurrent;
extern const gdn_impl gdn_cuda_chunked;
extern const gdn_impl gdn_cuda_per_token;
extern const gdn_impl gdn_cuda_decode;
extern const gemm_impl gemm_cuda_cublaslt;
extern const gemm_impl gemm_cuda_ref;
extern const gemm_impl gemm_cuda_gemv;

/* The sm_100a-only kernel's launcher (fp4_gemm_sm100.cu). */
int lsc_broken_sm100_launch(const gemm_args *a, ls_stream s, ls_err *e);

/* ---- runtime helpers ------------------------------------------------------ */
/* Number of CUDA devices; 0 with e filled (the CUDA error) when none is usable. */
int lsc_device_count(ls_err *e);
/* Select device `ordinal` for this thread and describe it. driver: "580.159.04"-like
 * when NVML is absent we give the CUDA driver API version ("13.0"). */
int lsc_device_open(int ordinal, dev_info *d, char *driver, size_t driver_n, ls_err *e);
int lsc_l2_bytes(void);

void *lsc_malloc(size_t n, ls_err *e); /* NULL + e on failure */
void lsc_free(void *p);
int lsc_h2d(void *dst, const void *src, size_t n, ls_err *e);
int lsc_d2h(void *dst, const void *src, size_t n, ls_err *e);
int lsc_d2d(void *dst, const void *src, size_t n, ls_err *e);
int lsc_memset(void *dst, int byte, size_t n, ls_err *e);
/* Synchronize the device; a kernel fault surfaces here. *sticky = 1 when
 * the error corrupted the context (illegal address, trap...). */
int lsc_sync(int *sticky, ls_err *e);

/* Events on the default stream. */
typedef struct lsc_timer lsc_timer;
lsc_timer *lsc_timer_new(int n, ls_err *e); /* n start/stop pairs */
void lsc_timer_start(lsc_timer *t, int i);
void lsc_timer_stop(lsc_timer *t, int i);
/* Milliseconds of pair i (after a sync). */
float lsc_timer_ms(lsc_timer *t, int i);
void lsc_timer_free(lsc_timer *t);

/* The timing hold: enqueue on the default stream a kernel that keeps the GPU busy
 * for `us` microseconds (at most LSC_HOLD_MAX_US) by spinning on the GPU's own
 * clock, never on the host, so a call that synchronises inside cannot deadlock
 * it. Enqueue it, then the timed calls with their event pairs: the calls queue up
 * behind it and run back to back, each pair measuring GPU time only.
 * lsc_hold_over(): 1 once the last hold has finished (asked right after the timed
 * calls were enqueued, 1 means it did not cover them all). */
#define LSC_HOLD_MAX_US 200000.0
int lsc_hold(double us, ls_err *e);
int lsc_hold_over(void);

/* Device-to-device copy bandwidth in GB/s (bytes read + written), `bytes` a buffer. */
double lsc_copy_bw_gbs(size_t bytes, int reps, ls_err *e);

#endif
