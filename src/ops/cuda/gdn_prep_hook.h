/* gdn_prep_hook.h: the test hooks of gdn cuda_chunked (gdn_chunked.cu;
 * tests/unit/test_gdn_prep_cuda.c), C-callable. Kept out of cuda_ops.h so that adding it did not
 * touch every CUDA file's header.
 *
 * lsc_gdn_chunked_prep: the preparation alone on a poisoned workspace, *form 1 the vector kernel
 * gc_prep8_kernel (LASTSTAND_GDN_PREP=1) or 0 the old gc_prep_kernel, *form set to the one that
 * ran (0 where the vector kernel does not apply); its operands copied out: x16 [n_tok, conv_dim]
 * FP16, gb [n_tok, nv, 2] fp32 (device memory); the conv state of a->st rolled in place as a real
 * call does (a->st->rec and a->out unused). Synchronises the stream. */
#ifndef LS_GDN_PREP_HOOK_H
#define LS_GDN_PREP_HOOK_H

#include "ops/ops.h"

#ifdef __cplusplus
extern "C" {
#endif
int lsc_gdn_chunked_prep(const gdn_args *a, int *form, void *x16, void *gb, ls_stream s, ls_err *e);
/* lsc_gdn_chunked_run: the whole cuda_chunked call with LASTSTAND_GDN_PREP = form (that switch is
 * read once per process; this sets it per call). */
int lsc_gdn_chunked_run(const gdn_args *a, int form, ls_stream s, ls_err *e);
#ifdef __cplusplus
}
#endif

#endif
