/* moe_grouped_int.cuh: what cuda_grouped_gemm's two CUDA files share (never included from C):
 * moe_grouped.cu (the GEMMs, the combine, the host side) and moe_route.cu (the routing: the top-k
 * and plan kernels, their launchers and the test hooks of moe_grouped_test.h). The size limits,
 * the per-device workspace (mg_ws and its MG_* buffer slots; g_mg and mg_lock in moe_grouped.cu),
 * the plan's tile bound, and the launchers that moe_route.cu defines for moe_grouped.cu. The warp
 * and bf16 helpers are moe_int.cuh's (warp_sum, warp_max, bf2_to_f2).
 */
#ifndef LS_MOE_GROUPED_INT_CUH
#define LS_MOE_GROUPED_INT_CUH

#include "ops/cuda/cu_util.h"
#include "ops/cuda/cu_ws.h"
#include "ops/cuda/moe_int.cuh"

enum { MG_MAXE = 1024, MG_MAXK = 16, MG_TAB_CACHE = 128 };

/* ---- per-device workspace ------------------------------------------------------ */

/* MG_PLANB: the multi-block plan's hist, pre [G, E], cnt [S], off [S + 1]; MG_TICKET: its ticket
 * (zeroed once, reset by the kernel); MG_HS: the early shared expert's h [16·tiles, ldh] */
enum { MG_LOGITS, MG_IDX, MG_WTS, MG_TILE, MG_PERM, MG_NT, MG_H, MG_D, MG_PLANB, MG_TICKET, MG_HS, MG_NBUF };
static_assert((int)MG_NBUF <= (int)CU_WS_SLOTS, "cuda_grouped_gemm workspace slots");

typedef struct mg_tab {
    const moe_w *key;
    int n;               /* entries (E + 1) */
    int ld_gu, ld_dn;    /* weight loaders (MG_LD_*) of the gate/up and the down GEMM */
    int ld_gu_s, ld_dn_s;/* the shared expert's, when its kind differs from the routed
                            experts' (a BF16 shared expert next to NVFP4 experts, as
                            ModelOpt may leave it); else -1 */
    mg_expert *host, *dev;
} mg_tab;

typedef struct mg_ws {
    cu_ws ws; /* lock + the MG_* device buffers (cu_ws.h: kept on grow) */
    mg_tab tabs[MG_TAB_CACHE];
    int next_tab;
    mg_expert *scratch;  /* host [MG_MAXE + 1] */
    /* the side stream (highest priority) that runs the shared expert's GEMMs beside the
     * routed ones when its kind differs, forked from / joined to the caller's stream by
     * two events; made on first use, side_state 1 made, -1 failed (then one stream) */
    int side_state;
    cudaStream_t side;
    cudaEvent_t ev_fork, ev_join;
    cudaEvent_t ev_route; /* the early shared expert's down waits on the routing (mg_run_locked) */
} mg_ws;

/* This device's workspace, locked (calls on one device are serialised); moe_grouped.cu. */
int mg_lock(mg_ws **out, ls_err *e);

/* Device buffer `slot` of at least n bytes; no allocation happens once the
 * sizes of the largest call exist (a captured graph's buffers stay allocated). */
static inline void *mg_get(mg_ws *w, int slot, size_t n, cudaStream_t st, ls_err *e) {
    return cu_ws_get(&w->ws, slot, n, 0, st, "cuda_grouped_gemm", e);
}

/* the plan's row bound (tiles_max) for tile height bm */
static inline size_t mg_tiles_max(int M, int E, int k, int hs, int bm) {
    const size_t pairs = (size_t)M * (k + hs), slots = (size_t)E + hs;
    return (pairs + bm - 1) / bm + (slots < pairs ? slots : pairs);
}

/* ---- the routing's launchers (moe_route.cu) ---------------------------------------- */

/* The top-k launch off the mid path: mg_topk2_kernel at NV = ceil(E/32) (topk), else mg_topk_kernel. */
cudaError_t mg_topk_launch(int topk, int M, int H, int E, int k, int norm, const bf16 *x, const bf16 *wsg, int hs,
                           const float *logits, int32_t *idx, float *wts, cudaStream_t st);
/* The mid path's top-k, mg_topk_block_kernel (a block per token), with the PDL attribute when pdl. */
cudaError_t mg_topk_block_launch(int pdl, int M, int H, int E, int k, int norm, const bf16 *x, const bf16 *wsg,
                                 int hs, const float *logits, int32_t *idx, float *wts, cudaStream_t st);
/* The plan (plan: mg_knobs.plan, LASTSTAND_MG_PLAN) of idx [M, k] at tile height bm -> tile_e, perm,
 * nt; its buffers from ws (MG_PLANB, MG_TICKET). 0 or a negative ERR_* with e filled. */
int mg_plan_launch(mg_ws *ws, int plan, int pdl, int M, int E, int k, int hs, int bm, const int32_t *idx,
                   int32_t *tile_e, int32_t *perm, int32_t *nt, cudaStream_t st, ls_err *e);

#endif
