/* fwd_cuda.h: the CUDA small ops of small.cu (registered by
 * ops_cuda_register_fwd in fwd_dev.cu). */
#ifndef LS_FWD_CUDA_H
#define LS_FWD_CUDA_H

#include "ops/ops.h"

#ifdef __cplusplus
extern "C" {
#endif
extern const small_ops small_cuda;
/* The same ops with the row-wise norms in one form at every row count, whatever
 * LASTSTAND_SMALL_ROWS says (for tests and timing; not registered): _block one block a row
 * (sm_rmsnorm_kernel, sm_qk_norm_rope(_kv)_kernel), _rows one warp a row, persistent, where it
 * applies (small.cu, "many rows"). */
extern const small_ops small_cuda_block;
extern const small_ops small_cuda_rows;
#ifdef __cplusplus
}
#endif

#endif
