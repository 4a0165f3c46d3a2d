/* moe_grouped_test.h: test hooks of cuda_grouped_gemm's routing (moe_route.cu; cuda_mg_route_force
 * in moe_grouped.cu), for tests/unit/test_moe_plan_cuda.c (CUDA builds only). Device pointers
 * throughout; each call is queued on stream s (reps > 0: run once, then reps more times between two
 * events, *us = the mean µs of one, synchronised). 0 or a negative ERR_* with e filled. */
#ifndef LS_MOE_GROUPED_TEST_H
#define LS_MOE_GROUPED_TEST_H

#include "ops/ops.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The plan's tile bound for M tokens (tile_e holds that many, perm that many x bm rows). */
size_t cuda_mg_plan_tiles_max(int M, int E, int k, int hs, int bm);
/* The plan of idx [M, k] (hs: a shared expert, slot E) at tile height bm: plan 0 the one-block
 * mg_plan_kernel, 1 the multi-block plan (place by PDL), 2 the same without PDL. */
int cuda_mg_plan_test(int plan, int M, int E, int k, int hs, int bm, const int32_t *idx, int32_t *tile_e,
                      int32_t *perm, int32_t *nt, int reps, float *us, ls_stream s, ls_err *e);
/* The top-k of logits [M, E] (x [M, H] and wsg [H] BF16, wsg may be NULL): topk 0 mg_topk_kernel,
 * 1 mg_topk2_kernel -> idx [M, k], wts [M, k + 1]. */
int cuda_mg_topk_test(int topk, int M, int H, int E, int k, int norm, const void *x, const void *wsg, int hs,
                      const float *logits, int32_t *idx, float *wts, int reps, float *us, ls_stream s, ls_err *e);
/* Override LASTSTAND_MG_PLAN / LASTSTAND_MG_TOPK for the calls that follow (-1: the knobs). */
void cuda_mg_route_force(int plan, int topk);

#ifdef __cplusplus
}
#endif
#endif
