/* cu_cluster.h: launch configuration and residency of a thread-block-cluster GEMV kernel
 * (never included from C; cu_cluster.cu implements it). Shared by cuda_gemv's BF16 kernel
 * (gemv.cu) and its FP8 form (fp8_gemm.cu): both launch a grid (S, G) of clusters of S blocks
 * (S = 1: plain blocks) and size G to what is resident on the whole GPU at once. */
#ifndef LS_CU_CLUSTER_H
#define LS_CU_CLUSTER_H

#include "ops/cuda/cu_util.h"

#include <stddef.h>

/* cfg / at[0] for a launch of G clusters of S blocks of `threads` threads with `smem` bytes of
 * dynamic shared memory each (at[0]: the cluster dimension; cfg->numAttrs = 1, so a caller may
 * add at[1]). */
void cu_cluster_config(cudaLaunchConfig_t *cfg, cudaLaunchAttribute *at, int S, int G, int threads, size_t smem,
                       cudaStream_t st);

/* Clusters (S > 1) or blocks (S = 1) of the kernel fn resident on the whole current device at
 * once (n_sm SMs), or < 0 with e set (who names the backend in the error). The first call per
 * (device, fn) raises fn's dynamic shared memory limit to smem_attr; the answer is cached per
 * (device, fn, S, smem). Thread-safe. */
int cu_cluster_resident(const void *fn, int threads, int S, size_t smem, size_t smem_attr, int n_sm, const char *who,
                        ls_err *e);

#endif
