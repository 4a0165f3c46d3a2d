/* fwd_cuda.h: the CUDA small ops of small.cu (registered by
 * ops_cuda_register_fwd in fwd_dev.cu). */
#ifndef LS_FWD_CUDA_H
#define LS_FWD_CUDA_H

#include "ops/ops.h"

#ifdef __cplusplus
extern "C" {
#endif
extern const small_ops small_cuda;
#ifdef __cplusplus
}
#endif

#endif
