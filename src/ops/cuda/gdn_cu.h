/* gdn_cu.h: what the CUDA gdn backends (gdn.cu: cuda_recurrent; gdn_chunked.cu: cuda_chunked,
 * cuda_per_token; gdn_decode.cu: cuda_decode) share on the host (never included from C).
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
    *sh = (gdn_shape){a->n_tok, a->n_seq, w->nk, w->nv, w->dk, w->dv, w->conv_k, a->dt};
    memset(d0, 0, sizeof *d0);
    d0->kind = DEV_CUDA;
    char why[200];
    if (!supported(d0, sh, why, sizeof why)) return errf(e, ERR_UNSUPPORTED, "gdn %s: %s", backend, why);
    return a->n_tok <= 0 || a->n_seq <= 0;
}

#endif
