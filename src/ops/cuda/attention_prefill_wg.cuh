/* attention_prefill_wg.cuh: cuda_flash_prefill's Hopper (sm_90a) prefill kernel for head_dim 128 and 256
 * (attention_prefill_wg.cu says how), called by attention_prefill.cu for host-planned calls under
 * the round plan (prefill chunks) when LASTSTAND_FP_WG is on. */
#ifndef LS_OPS_CUDA_ATTENTION_PREFILL_WG_CUH
#define LS_OPS_CUDA_ATTENTION_PREFILL_WG_CUH

#include "ops/cuda/cu_util.h"

/* Flat rows (token, query head of one kv head's GQA group) a CTA of the kernel takes. */
enum { FW_BM = 128 };

/* 1 when this device runs the kernel (compute capability 9.0 with the sm_90a image loaded and the
 * shared-memory opt-in done), else 0; asked once per device, the answer cached. */
int fw_available(void);

/* fp_kernel's round plan at head_dim hd = 128 or 256 (same arguments, same partial layout for
 * fp_merge_kernel; another hd: cudaErrorInvalidValue):
 * grid (tiles, nkv, nsplit) with tiles >= Σ ceil(n_new·grp / FW_BM) over the sequences; part_o /
 * part_ml NULL: each CTA writes out (times sigmoid(gate) when gate is set), else its split's
 * partials (row max in log2 units, row sum, unnormalised O) at slot blockIdx.z. lpt: tiles longest
 * first. pdl: launched as a programmatic dependent launch. pool_rows: the pool's rows (pages x P), the
 * extent of the TMA tensor maps (LASTSTAND_FP_WG_TMA). */
cudaError_t fw_launch(int hd, dim3 grid, int pdl, cudaStream_t st, int n_seq, const attn_seq *seqs, int nh, int nkv,
                      int P, long pool_rows, float sl2, const bf16 *q, const bf16 *gate, const bf16 *K, const bf16 *V,
                      bf16 *out, float *part_o, float *part_ml, int n_rows_total, int lpt);

#endif
