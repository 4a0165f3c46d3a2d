/* moe_fused_int.cuh: what the two files of the moe family's fused decode backend,
 * cuda_fused_decode, share (never included from C): moe_fused.cu (the backend: its expert
 * tables and workspace, the router and top-k launches, the register-staged pair, fused_run's
 * choices) and moe_fused_dec.cu (the cp.async pair, launch 1's rows form and the three-launch
 * form built on them). The router rows' device code (both files' launch-1 kernels), the expert
 * tables' layout, the block-column decode, the launch helpers, and the operands of one call
 * (fused_call) with the launchers moe_fused_dec.cu defines for fused_run. Static or inline:
 * each file compiles its own copy; every kernel is defined in one of the two files.
 */
#ifndef LS_MOE_FUSED_INT_CUH
#define LS_MOE_FUSED_INT_CUH

#include "ops/cuda/cu_pdl.h"
#include "ops/cuda/moe_int.cuh"
#include "ops/cuda/nvfp4.cuh"

enum { FUSED_MAXM = 8 };

/* Launch 1's router rows (moe_router_kernel, moe_route_rows_kernel): a block of ROUTER_NW
 * warps takes ROUTER_RPB expert rows, ROUTER_Q warps a row (see moe_router_kernel) */
enum { ROUTER_RPB = 4, ROUTER_Q = 4, ROUTER_LD = 8, ROUTER_NW = ROUTER_RPB * ROUTER_Q, SH_CPW = 2 };

/* This warp's router row quarter in block blk: row E is the shared gate's (when wsg) */
typedef struct router_part {
    const bf16 *row;
    int r, q, kb, ke;
    bool active;
} router_part;

/* Launch 1's router rows, first half: this warp's quarter row, its first LD loads issued. */
template <int LD>
__device__ __forceinline__ router_part router_issue(int blk, int H, int E, const bf16 *__restrict__ wr,
                                                    const bf16 *__restrict__ wsg, uint4 (&vw)[LD]) {
    router_part p;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    p.r = warp / ROUTER_Q;
    p.q = warp % ROUTER_Q;
    const int ex = blk * ROUTER_RPB + p.r;
    p.active = ex < E || (ex == E && wsg);
    p.row = ex < E ? wr + (size_t)ex * H : wsg;
    const int hq = H / ROUTER_Q;
    p.kb = p.q * hq;
    p.ke = p.kb + hq;
    if (p.active) {
#pragma unroll
        for (int c = 0; c < LD; c++)
            if (p.kb + lane * 8 + 256 * c < p.ke) vw[c] = cu_ld_stream16(p.row + p.kb + lane * 8 + 256 * c);
    }
    return p;
}

/* acc[m] = the lane's part of row[kb, ke) · x_m[kb, ke) for the M tokens (x staged in shared memory,
 * xs4 = [M][H] bf16): its 16-byte pieces kb + 8·lane + 256·c, LD of them in flight (vw holds the
 * first LD, already issued), each piece's 8 products in K order */
template <int LD>
__device__ __forceinline__ void rows_dot(const bf16 *row, int kb, int ke, int M, int H, const uint4 *xs4,
                                         uint4 (&vw)[LD], float (&acc)[FUSED_MAXM]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int m = 0; m < FUSED_MAXM; m++) acc[m] = 0.f;
    for (int k0 = kb + lane * 8; k0 < ke; k0 += 256 * LD) {
        if (k0 != kb + lane * 8) {
#pragma unroll
            for (int c = 0; c < LD; c++)
                if (k0 + 256 * c < ke) vw[c] = cu_ld_stream16(row + k0 + 256 * c);
        }
#pragma unroll
        for (int c = 0; c < LD; c++) {
            const int kk = k0 + 256 * c;
            if (kk >= ke) break;
            const uint32_t ww[4] = {vw[c].x, vw[c].y, vw[c].z, vw[c].w};
#pragma unroll
            for (int m = 0; m < FUSED_MAXM; m++) {
                if (m >= M) break;
                const uint4 vx = xs4[((size_t)m * H + kk) / 8];
                const uint32_t xx[4] = {vx.x, vx.y, vx.z, vx.w};
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const float2 a = bf2_to_f2(ww[u]), b = bf2_to_f2(xx[u]);
                    acc[m] = fmaf(a.x, b.x, acc[m]);
                    acc[m] = fmaf(a.y, b.y, acc[m]);
                }
            }
        }
    }
}

/* Second half, once x is in shared memory (xs4): the quarter's dot products, the
 * quarters summed in part, logits [M, E] (and sgl [M] for row E) written. Contains a
 * __syncthreads: every thread of the block calls it. */
template <int LD>
__device__ __forceinline__ void router_finish(const router_part &p, int blk, int M, int H, int E,
                                              const bf16 *__restrict__ wsg, const uint4 *xs4, uint4 (&vw)[LD],
                                              float (*part)[ROUTER_Q][FUSED_MAXM], float *logits, float *sgl) {
    const int lane = threadIdx.x & 31;
    if (p.active) {
        float acc[FUSED_MAXM];
        rows_dot<LD>(p.row, p.kb, p.ke, M, H, xs4, vw, acc);
#pragma unroll
        for (int m = 0; m < FUSED_MAXM; m++) {
            if (m >= M) break;
            const float sum = warp_sum(acc[m]);
            if (lane == 0) part[p.r][p.q][m] = sum;
        }
    }
    __syncthreads();
    if (threadIdx.x < ROUTER_RPB * FUSED_MAXM) {
        const int r2 = threadIdx.x / FUSED_MAXM, m = threadIdx.x % FUSED_MAXM;
        const int ex2 = blk * ROUTER_RPB + r2;
        if (m < M && (ex2 < E || (ex2 == E && wsg))) {
            float v = 0.f;
#pragma unroll
            for (int qq = 0; qq < ROUTER_Q; qq++) v += part[r2][qq][m];
            if (ex2 < E) logits[(size_t)m * E + ex2] = v;
            else sgl[m] = v;
        }
    }
}

/* Launch 1 (the router kernels) after its weight loads are in flight, before it stages
 * x: wait for the kernel that wrote x (a no-op when launched without the attribute,
 * LASTSTAND_MOE_ROUTER_PDL=0), then let the top-k kernel
 * launch. Triggering only after the wait keeps what the later launches read before their
 * own waits (x, in gate/up) complete by the time they can start, as when launch 1 had no
 * attribute and triggered first thing. */
__device__ __forceinline__ void router_wait_trigger(void) {
    cu_pdl_wait();
    cu_pdl_trigger();
}

/* the loads in flight a lane: launch 1's BF16 shared gate/up rows (SHARED_ROUTE=2), launch
 * 1b's and the three launches' BF16 shared down rows */
enum { SHR_LD = 8, SHD_LD = 4 };

/* The expert tables in device memory (fused_run uploads them per layer) */
typedef struct gu_params {
    const uint8_t *gw[MOE_MAXE], *uw[MOE_MAXE];
    const uint8_t *gs[MOE_MAXE], *us[MOE_MAXE];
    float g2[MOE_MAXE], u2[MOE_MAXE];
    const uint8_t *sgw, *suw, *sgs, *sus; /* an NVFP4 shared expert (a BF16 one: SHARED_ROUTE) */
    float sg2, su2;
} gu_params;

typedef struct dn_params {
    const uint8_t *dw[MOE_MAXE];
    const uint8_t *ds[MOE_MAXE];
    float d2[MOE_MAXE];
    const uint8_t *sdw, *sds; /* an NVFP4 shared expert's down (a BF16 one: SHARED_ROUTE) */
    float sd2;
} dn_params;

typedef struct fused_tables {
    gu_params gu;
    dn_params dn;
} fused_tables;

/* Block-column form (BC, M = 1 only; nvfp4.cuh's nv4_gemv1_chunk): the mma's 8 B
 * columns hold the chunk's 8 scale blocks instead of 8 copies of the token, so each
 * output is one (row, block) partial and the block scale is an fp32 FFMA (no BF16
 * multiply per decoded pair, the byte tables built once). acc then holds (row g,
 * block 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1): bc_rows leaves the rows' sums
 * in acc[0] (row g) and acc[2] (row g + 8) of the lanes with t == 0, as the standard
 * layout has them. */
__device__ __forceinline__ void bc_rows(float (&acc)[4]) {
    float r0 = acc[0] + acc[1], r1 = acc[2] + acc[3];
    r0 += __shfl_xor_sync(0xffffffffu, r0, 1);
    r1 += __shfl_xor_sync(0xffffffffu, r1, 1);
    r0 += __shfl_xor_sync(0xffffffffu, r0, 2);
    r1 += __shfl_xor_sync(0xffffffffu, r1, 2);
    acc[0] = r0;
    acc[2] = r1;
}

/* One NVFP4 chunk in BC form: xr = the lane's 32 B-values of the token (4 uint4, K
 * order), zero = 64 readable zero bytes (global); s0 / s1 the E4M3 scale pairs of
 * rows g / g + 8. */
__device__ __forceinline__ void bc_chunk(uint4 w0, uint4 w1, uint16_t s0, uint16_t s1, const uint4 *xr,
                                         const uint4 *zero, int g, int t, const nv4_lut &lut, float (&acc)[4]) {
    const bool act = t == (g >> 1);
    const uint4 *pe = act && !(g & 1) ? xr : zero, *po = act && (g & 1) ? xr + 2 : zero;
    float sg[4];
    nv4_e4m3x2_to_f32x2(s0, sg[0], sg[1]);
    nv4_e4m3x2_to_f32x2(s1, sg[2], sg[3]);
    nv4_gemv1_chunk(w0, w1, __ldg(pe), __ldg(pe + 1), __ldg(po), __ldg(po + 1), sg, lut, acc);
}

/* the cp.async pair's down kernel: warps, chunks in flight a warp */
enum { DOWN_KW = 16, DOWN_PMAX = 6 };

/* Raise kernel K's dynamic shared memory limit to `bytes` once it needs more than the
 * default, 48 KB less K's static shared memory (cu_smem_default). Remembered per kernel
 * and per device (the largest so far): a function attribute applies to the current
 * device only, and tensor-parallel ranks launch the same kernel on other GPUs from
 * their own threads. */
template <auto K>
static cudaError_t fused_smem(size_t bytes) {
    static size_t have[CU_WS_MAX_DEV];
    int dev = 0;
    cudaError_t c = cudaGetDevice(&dev);
    if (c != cudaSuccess) return c;
    if (dev < 0 || dev >= CU_WS_MAX_DEV) return cudaErrorInvalidDevice;
    size_t h = __atomic_load_n(&have[dev], __ATOMIC_ACQUIRE);
    if (!h) { /* shared memory before L1, so that two blocks of 96 KB fit an SM */
        cudaFuncSetAttribute(K, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
        if ((c = cu_smem_default((const void *)K, &h)) != cudaSuccess) return c; /* 48 KB less K's static */
        if (!h) h = 1; /* "nothing yet" stays 0 */
        __atomic_store_n(&have[dev], h, __ATOMIC_RELEASE);
    }
    if (bytes <= h) return cudaSuccess;
    c = cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (c == cudaSuccess) __atomic_store_n(&have[dev], bytes, __ATOMIC_RELEASE);
    return c;
}

/* Launch kernel K on st, as a programmatic dependent launch when pdl is set (the
 * kernel may start before its predecessor ends; see moe_fused.cu on programmatic dependent launch). */
template <typename... KArgs, typename... Args>
static cudaError_t fused_launch(int pdl, void (*K)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                Args... args) {
    const cudaError_t c = cu_launch_pdl(pdl, K, grid, block, smem, st, args...);
    return c == cudaSuccess ? cudaGetLastError() : c;
}

/* An integer knob from the environment, read once into *v: def when unset, else
 * the value if it is lo..hi (one digit), else def. Benchmarks only. */
static int fused_knob(int *v, const char *name, int lo, int hi, int def) {
    if (*v < -1) {
        const char *ev = getenv(name);
        *v = ev && ev[0] >= '0' + lo && ev[0] <= '0' + hi && !ev[1] ? ev[0] - '0' : -1;
    }
    return *v >= 0 ? *v : def;
}

/* One call's operands as fused_run sets them up, for the launchers below */
typedef struct fused_call {
    int M, H, E, I, Is, k, norm; /* tokens, hidden, experts, expert / shared intermediate, top-k, renormalise */
    int nrb, nch, gkw, ldh;      /* router blocks, H / 128, the cp.async gate/up's warps, h's row length */
    int pdl, rpdl;               /* programmatic dependent launch: launches 1b .., launch 1 */
    const bf16 *x, *wr, *wsg;    /* x [M, H], router [E, H], shared gate [H] (or NULL) */
    const bf16 *shg, *shu, *shd; /* a BF16 shared expert: gate, up [Is, H], down [H, Is] */
    const gu_params *gp;         /* the expert tables (device memory) */
    const dn_params *dp;
    float *logits, *sgl;         /* logits [M, E]; the shared gate's logits [M] */
    int32_t *idx;                /* the choices [M, k] */
    float *wts;                  /* combine weights [M, k + 1] */
    float *hws;                  /* h [M·(k + 1), ldh] */
    const uint4 *zero;           /* 64 zero bytes (device) */
    void *y;                     /* out [M, H] BF16 */
    cudaStream_t st;
} fused_call;

/* moe_fused_dec.cu. Launch 1 in rows form (SHARED_ROUTE=2: hgu [M, 2·Is] fp32), with the top-k by
 * its last blocks when tk (ticket: 64 zeroed bytes) */
cudaError_t moe_fused_route_rows(const fused_call *f, int tk, float *hgu, unsigned *ticket);
/* the cp.async pair's gate/up on grid (f->gkw != 0); bc: block-column decode, v2: 8 warps playing
 * the 16-warp slices, pf: the tables prefetched into L2, sr: routed slots only */
cudaError_t moe_fused_gateup2(const fused_call *f, int bc, int v2, int pf, dim3 grid, int sr);
/* the cp.async pair's down on grid (ys: the BF16 shared expert's result [M, H] to add, or NULL) */
cudaError_t moe_fused_down2(const fused_call *f, int bc, dim3 grid, const float *ys);
/* the three launches (fused_run's DEC = 1): hs [M, 2·Is] fp32 and ticket (64 zeroed bytes) workspace */
cudaError_t moe_fused_dec(const fused_call *f, int v2, int pf, float *hs, unsigned *ticket);

#endif
