/* gdn_cu.h: what the CUDA gdn backends (gdn.cu: cuda_recurrent; gdn_chunked.cu: cuda_chunked,
 * cuda_per_token; gdn_decode.cu: cuda_decode) share (never included from C).
 */
#ifndef LS_GDN_CU_H
#define LS_GDN_CU_H

#include "ops/cuda/cu_util.h"

/* The start of a backend's run: the call's shape (sh) checked against the backend's supported()
 * on a CUDA device (d0: the compute capability unknown here, the selection checked it), an
 * ERR_UNSUPPORTED naming the backend when it does not fit; 1 when the call has no token or no
 * sequence (nothing to do), else 0. */
static inline int cu_gdn_begin(const gdn_args *a, int (*supported)(const dev_info *, const gdn_shape *, char *, size_t),
                               const char *backend, gdn_shape *sh, dev_info *d0, ls_err *e) {
    const gdn_w *w = a->w;
    *sh = (gdn_shape){a->n_tok, a->n_seq, w->nk, w->nv, w->dk, w->dv, w->conv_k, a->dt, a->st && a->st->rec16};
    memset(d0, 0, sizeof *d0);
    d0->kind = DEV_CUDA;
    char why[200];
    if (!supported(d0, sh, why, sizeof why)) return errf(e, ERR_UNSUPPORTED, "gdn %s: %s", backend, why);
    return a->n_tok <= 0 || a->n_seq <= 0;
}

/* Sum of v over the block, every thread gets it (the warps' xor trees, then warp 0's .. last
 * partial in order); red [32] shared; every thread of the block calls it (two barriers). */
__device__ __forceinline__ float gdn_block_sum(float v, float *red) {
#pragma unroll
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int w = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) red[w] = v;
    __syncthreads();
    float t = 0.f;
    for (int i = 0; i < nw; i++) t += red[i];
    return t;
}

#endif
