/* fwd_cuda.h: the CUDA forward-pass backends of small.cu, attn_basic.cu and
 * gdn_basic.cu (registered by ops_cuda_register_fwd in fwd_dev.cu). */
#ifndef LS_FWD_CUDA_H
#define LS_FWD_CUDA_H

#include "ops/ops.h"

#ifdef __cplusplus
extern "C" {
#endif
extern const small_ops small_cuda;
extern const attn_impl attn_cuda_naive;
extern const gdn_impl gdn_cuda_recurrent;
#ifdef __cplusplus
}
#endif

#endif
