/* moe_wgmma.cuh: the Hopper (sm_90a) warpgroup-MMA grouped GEMM of cuda_grouped_gemm's
 * large-batch path (moe_wgmma.cu says how), called by moe_grouped.cu at 64-row tiles. */
#ifndef LS_OPS_CUDA_MOE_WGMMA_CUH
#define LS_OPS_CUDA_MOE_WGMMA_CUH

#include "ops/cuda/moe_int.cuh"

/* 1 when this device runs the kernels (an sm_90a image loaded: compute capability 9.0), else 0;
 * asked once per device, the answer cached. */
int mw_available(void);

/* The gate/up (GATEUP) or down GEMM of the routed NVFP4 experts over the plan's 64-row tiles
 * below nt[0], arguments as mg_gemm_kernel's (moe_grouped.cu): tab [E + 1] on the device,
 * tile_e [tiles], perm [tiles·64], x [M, H], hbuf [R, ldh], wts [M, k + 1], dbuf [M·(k + 1), H];
 * n_out = the widest output (gate/up: max I, down: H); every expert of a tile below nt[0] must
 * have NVFP4 weights with K (H for gate/up, I for down) a multiple of 64. */
template <bool GATEUP>
cudaError_t mw_launch(int n_out, int tiles_max, const mg_expert *tab, const int32_t *tile_e, const int32_t *perm,
                      const int32_t *nt, int H, int k, const bf16 *x, bf16 *hbuf, int ldh, const float *wts,
                      bf16 *dbuf, cudaStream_t st);

/* The next launches of this host thread have rows = M·k/E routed rows per expert on average:
 * m2_kernel (default; LASTSTAND_MG_WGMMA2=0: off) takes the routed GEMMs from
 * LASTSTAND_MG_WGMMA2_MINROWS (112) on, mw_kernel below (S11-R2, 35B: m2 at 64 rows an expert
 * 958 vs 808 us, at 128 rows 1179 vs 1344 us, at 256 rows 1884 vs 2439 us). */
void mw_rows_hint(int rows);

/* 1 when mw_available() and m2's BF16 form is on (default; LASTSTAND_MG_WGMMA2_SH=0: off): a BF16 shared expert's 64-row tiles (sh_only
 * launches) by m2_kernel's BF16-weight form (A from shared memory through a descriptor). */
int m2_bf16_on(int tiles);

/* The shared expert's tiles nt[1] .. nt[0] - 1 (grid: sh_tiles) with BF16 weights, arguments as
 * mw_launch's; any K multiple of 8 (chunks past K zero-filled), 16-byte aligned weight rows. */
template <bool GATEUP>
cudaError_t m2_launch_bf16(int n_out, int sh_tiles, const mg_expert *tab, const int32_t *tile_e, const int32_t *perm,
                           const int32_t *nt, int H, int k, const bf16 *x, bf16 *hbuf, int ldh, const float *wts,
                           bf16 *dbuf, cudaStream_t st);

#endif
