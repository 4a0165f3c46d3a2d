/* moe_fused_dec.cu: the three-launch form of cuda_fused_decode (moe_fused.cu), with the
 * kernels it shares with the four launches: launch 1 in rows form (SHARED_ROUTE=2) and the
 * cp.async pair. At M >= 4 with a BF16 shared expert (fused_run's DEC, the default there since
 * the H200 round S10 R1), three launches: (1) the router rows and the BF16 shared expert's
 * gate/up rows, one warp a row, the top-k by the router launch's last blocks (a device ticket;
 * no top-k launch); (2) gate/up of the routed slots in 8-warp blocks playing the 16-warp slices
 * (V = 2, the same sums), so that a down block fits beside two of them on an SM and requests its
 * weights during gate/up, the expert tables prefetched into L2; (3) down, with the shared
 * expert's down rows computed before its wait (moe_down2_kernel SHB). Bit for bit the four
 * launches' sums in the SHARED_ROUTE=2 form. fused_run (moe_fused.cu) picks the form, owns the
 * tables and the workspace, and calls the launchers here (moe_fused_int.cuh).
 */
#include "ops/cuda/moe_fused_int.cuh"

/* Launch 1, SHARED_ROUTE=2: blocks b < nrb the router rows (as moe_router_kernel, LD =
 * 4); blocks b >= nrb one BF16 shared-expert row a warp (rows 0 .. Is - 1 of the gate
 * projection, then Is .. 2·Is - 1 of the up projection), lane l reading 16 B of every
 * 256 weights, so that a warp-instruction reads 512 contiguous bytes (the m16n8k16
 * tiles of SHARED_ROUTE=1 read 64 B pieces of 8 rows, half a sector per lane and
 * instruction: that launch took 13.3 us for 25 MB in the H200 round R1); hgu [M, 2·Is]
 * fp32 = x·rowᵀ. Two blocks an SM: 257 blocks on the 397B layer, one wave. (A row's
 * second round of loads by cp.async into shared memory at the start, so that a whole
 * 4096-wide row was in flight at once, changed nothing: 58.0 us either way, H200 R3.)
 * TK (the three launches): no top-k launch; the last M
 * router blocks to finish (a device ticket, counted after each block's logits are fenced)
 * run moe_topk_block, one token each, once the last one has counted itself, and write
 * idx / wts, so that the next launch needs no top-k of its own. (The ticket as one release-acquire
 * add instead of a fence in every thread, LASTSTAND_MOE_TKF, was no faster in the 40-layer step,
 * 2.529 vs 2.518 ms: deleted in S11, last at e4fc8bf.) */
template <bool TK>
__global__ void __launch_bounds__(32 * ROUTER_NW, 2)
    moe_route_rows_kernel(int M, int H, int E, int nrb, const bf16 *__restrict__ x, const bf16 *__restrict__ wr,
                          const bf16 *__restrict__ wsg, float *logits, float *sgl, const bf16 *__restrict__ shg,
                          const bf16 *__restrict__ shu, int Is, float *__restrict__ hgu, int k, int norm,
                          int32_t *idx, float *wts, unsigned *ticket) {
    extern __shared__ uint4 xs4[];
    __shared__ float part[ROUTER_RPB][ROUTER_Q][FUSED_MAXM];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const uint4 *xg = reinterpret_cast<const uint4 *>(x);
    if ((int)blockIdx.x < nrb) {
        uint4 vw[4];
        const router_part rp = router_issue<4>(blockIdx.x, H, E, wr, wsg, vw);
        router_wait_trigger();
        for (int i = threadIdx.x; i < M * H / 8; i += blockDim.x) xs4[i] = __ldg(xg + i);
        __syncthreads();
        router_finish<4>(rp, blockIdx.x, M, H, E, wsg, xs4, vw, part, logits, sgl);
        if constexpr (TK) {
            __shared__ int tok;
            __threadfence(); /* this thread's logits (or sgl) visible before the ticket */
            __syncthreads();
            if (threadIdx.x == 0) {
                /* the last M router blocks to finish take token t - (nrb - M) each; all but the
                 * very last wait (acquire) until it has counted itself (it needs at most a free
                 * slot, which blocks that never wait release) */
                const unsigned t = atomicAdd(ticket, 1u);
                const int mm = (int)t - (nrb - M);
                if (mm >= 0 && t != (unsigned)nrb - 1) {
                    unsigned v, polls = 0;
                    do {
                        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(ticket) : "memory");
                        if (++polls > (1u << 26)) __trap(); /* seconds: a broken launch, not a hang */
                    } while (v < (unsigned)nrb);
                }
                tok = mm;
            }
            __syncthreads();
            if (tok < 0) return;
            __threadfence();
            moe_topk_block(tok, H, E, k, norm, x, wsg, 1, logits, wsg ? sgl : nullptr, idx, wts);
            /* the M-th block out resets the ticket for the next call or graph replay (no
             * block reads it again in this launch) */
            if (threadIdx.x == 0 && atomicAdd(ticket, 1u) == (unsigned)(nrb + M - 1)) *ticket = 0u;
        }
        return;
    }
    const int r = ((int)blockIdx.x - nrb) * ROUTER_NW + warp;
    const bool on = r < 2 * Is;
    const bf16 *row = r < Is ? shg + (size_t)r * H : shu + (size_t)(r - Is) * H;
    uint4 vw[SHR_LD];
    if (on) {
#pragma unroll
        for (int c = 0; c < SHR_LD; c++)
            if (lane * 8 + 256 * c < H) vw[c] = cu_ld_stream16(row + lane * 8 + 256 * c);
    }
    router_wait_trigger();
    for (int i = threadIdx.x; i < M * H / 8; i += blockDim.x) xs4[i] = __ldg(xg + i);
    __syncthreads();
    if (!on) return;
    float acc[FUSED_MAXM];
    rows_dot<SHR_LD>(row, 0, H, M, H, xs4, vw, acc);
#pragma unroll
    for (int m = 0; m < FUSED_MAXM; m++) {
        if (m >= M) break;
        const float v = warp_sum(acc[m]);
        if (lane == 0) hgu[(size_t)m * 2 * Is + r] = v;
    }
}

/* ---- the streaming pair (default): same load pipeline as fp4_gemm's cp.async kernel ---- */

/* Launch 2: block (16 rows, slot s = m·(k+1) + j), KW warps each owning PER
 * consecutive 128-element chunks of H (H == KW·PER·128): all gate and up bytes of
 * the warp's slice go in flight at once with cp.async (4 x 16 B per lane per
 * chunk), one commit group per chunk, then chunk by chunk: wait, read back,
 * decode, mma. Epilogue: h[s, rows] = silu(gate·g2)·(up·u2)·coef in BF16, coef =
 * the slot's combine weight (or shared gate) times the down projection's scale2,
 * so the down kernel reads h as its ready B operand. BC (M = 1): the block-column decode
 * (bc_chunk; no gain here in the H200 rounds, opt-in). (The bit-placement decode of
 * nvfp4.cuh, which moves half the decode to the FMA pipe and wins in cuda_grouped_gemm,
 * was slower here in round R2: 397B M = 1 57.7 vs 55.4 us, NVFP4 shared 51.9 vs 50.3.) */
template <int KW, int PER, bool BC, int V>
__global__ void __launch_bounds__(32 * KW / V, 32 * V / KW)
    moe_gateup2_kernel(const gu_params *__restrict__ P, const dn_params *__restrict__ D, int H, int I, int Is,
                       int k, const bf16 *__restrict__ x, const int32_t *__restrict__ idx,
                       const float *__restrict__ wts, bf16 *__restrict__ hout, int ldh, int early_sh,
                       const uint4 *__restrict__ zero, int sr, int pf) {
    extern __shared__ uint4 st[]; /* [KW][PER][4][32] */
    __shared__ float red[KW][2][16];
    const int lane = threadIdx.x & 31, rw = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    /* pf (LASTSTAND_MOE_PF; V = 2 only): before the wait, one 128-byte line a block of the
     * expert tables (gu_params, then dn_params) into L2, so that the lookups after the wait
     * (and the down kernel's) hit L2: in a decode step the ~100 MB of weights streamed by the
     * other layers have evicted them */
    if (V > 1 && pf && threadIdx.x == 0) { /* V = 1 (the four launches' form): none, main's code */
        const size_t b = (size_t)blockIdx.y * gridDim.x + blockIdx.x, nl = (sizeof(gu_params) + 127) / 128;
        const char *pl = b < nl ? (const char *)P + 128 * b
                                : b - nl < (sizeof(dn_params) + 127) / 128 ? (const char *)D + 128 * (b - nl) : nullptr;
        if (pl) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(pl));
    }
    const int by = (int)blockIdx.y;
    /* the shared expert's blocks (j = k) first in launch order (the longest when Is > I);
     * sr (SHARED_ROUTE): routed slots only, the shared expert ran in launches 1 and 1b */
    const int m = sr ? by / k : by / (k + 1), j = sr ? by % k : (by + k) % (k + 1);
    const int s = m * (k + 1) + j;
    /* early_sh (fused_early, the default with PDL): the shared expert's
     * blocks need only x (complete before the router started) until their epilogue's
     * gate weight, so they fetch and multiply before waiting for the top-k kernel; the
     * routed blocks still wait before they trigger, which keeps the down kernel's
     * early read of the choices safe */
    if (!(early_sh && j == k)) cu_pdl_wait();
    cu_pdl_trigger();
    const int n0 = blockIdx.x * 16;
    const uint8_t *gw, *uw, *gs, *us;
    float g2, u2, coef;
    int rows;
    if (j < k) {
        const int ex = idx[m * k + j];
        gw = P->gw[ex]; uw = P->uw[ex]; gs = P->gs[ex]; us = P->us[ex]; g2 = P->g2[ex]; u2 = P->u2[ex];
        coef = D->d2[ex];
        rows = I;
    } else {
        gw = P->sgw; uw = P->suw; gs = P->sgs; us = P->sus; g2 = P->sg2; u2 = P->su2;
        coef = D->sd2;
        rows = Is;
    }
    if (n0 >= rows) return;
    /* V (LASTSTAND_MOE_GU_V): each of the KW / V warps plays V of the KW slices (virtual
     * warps rw·V .. rw·V + V - 1, each with its own accumulators and its own slot of red),
     * so the sums are the KW-warp block's bit for bit with a V times smaller block */
    float ag[V][4], au[V][4];
    uint16_t sg0[V][PER], sg1[V][PER], su0[V][PER], su1[V][PER];
    const size_t r8 = (size_t)8 * (H / 2), s8 = (size_t)8 * (H / 16);
#pragma unroll
    for (int v = 0; v < V; v++) {
        const int c0 = (rw * V + v) * PER;
#pragma unroll
        for (int i = 0; i < 4; i++) ag[v][i] = au[v][i] = 0.f;
        const size_t rb = (size_t)(n0 + g) * (H / 2) + c0 * 64 + 16 * t;
        uint4 *my = st + (size_t)(rw * V + v) * PER * 4 * 32 + lane;
#pragma unroll
        for (int u = 0; u < PER; u++) {
            cu_cp_async16(my + (u * 4 + 0) * 32, gw + rb + u * 64);
            cu_cp_async16(my + (u * 4 + 1) * 32, gw + rb + r8 + u * 64);
            cu_cp_async16(my + (u * 4 + 2) * 32, uw + rb + u * 64);
            cu_cp_async16(my + (u * 4 + 3) * 32, uw + rb + r8 + u * 64);
            cu_cp_async_commit();
        }
    }
#pragma unroll
    for (int v = 0; v < V; v++) {
        const int c0 = (rw * V + v) * PER;
        const size_t sb = (size_t)(n0 + g) * (H / 16) + c0 * 8 + 2 * t;
#pragma unroll
        for (int u = 0; u < PER; u++) {
            sg0[v][u] = __ldg(reinterpret_cast<const uint16_t *>(gs + sb + u * 8));
            sg1[v][u] = __ldg(reinterpret_cast<const uint16_t *>(gs + sb + s8 + u * 8));
            su0[v][u] = __ldg(reinterpret_cast<const uint16_t *>(us + sb + u * 8));
            su1[v][u] = __ldg(reinterpret_cast<const uint16_t *>(us + sb + s8 + u * 8));
        }
    }
    cu_pdl_wait();
    coef *= wts[m * (k + 1) + j];
#pragma unroll
    for (int v = 0; v < V; v++) {
        const int c0 = (rw * V + v) * PER;
        const uint4 *my = st + (size_t)(rw * V + v) * PER * 4 * 32 + lane;
        /* every token column is token m: no lane predicated off, column 0 is read */
        const uint4 *xr = reinterpret_cast<const uint4 *>(x + (size_t)m * H + c0 * 128 + 32 * t);
        if (BC) {
            const nv4_lut lut = nv4_lut_make((threadIdx.x + 1u) * (uint32_t)(H & 127)); /* H % 128 == 0 */
#pragma unroll
            for (int u = 0; u < PER; u++) {
                cu_cp_async_wait_dyn(V * PER - 1 - (v * PER + u));
                bc_chunk(my[(u * 4 + 0) * 32], my[(u * 4 + 1) * 32], sg0[v][u], sg1[v][u], xr + u * 16, zero, g, t,
                         lut, ag[v]);
                bc_chunk(my[(u * 4 + 2) * 32], my[(u * 4 + 3) * 32], su0[v][u], su1[v][u], xr + u * 16, zero, g, t,
                         lut, au[v]);
            }
            bc_rows(ag[v]);
            bc_rows(au[v]);
        } else {
#pragma unroll
            for (int u = 0; u < PER; u++) {
                uint4 xv[4];
#pragma unroll
                for (int q = 0; q < 4; q++) xv[q] = __ldg(xr + u * 16 + q);
                cu_cp_async_wait_dyn(V * PER - 1 - (v * PER + u));
                cu_w4_chunk_mma(my[(u * 4 + 0) * 32], my[(u * 4 + 1) * 32], sg0[v][u], sg1[v][u], xv, ag[v]);
                cu_w4_chunk_mma(my[(u * 4 + 2) * 32], my[(u * 4 + 3) * 32], su0[v][u], su1[v][u], xv, au[v]);
            }
        }
        if (t == 0) {
            red[rw * V + v][0][g] = ag[v][0];
            red[rw * V + v][0][g + 8] = ag[v][2];
            red[rw * V + v][1][g] = au[v][0];
            red[rw * V + v][1][g + 8] = au[v][2];
        }
    }
    __syncthreads();
    if (threadIdx.x < 16) {
        float gv = 0.f, uv = 0.f;
#pragma unroll
        for (int w = 0; w < KW; w++) {
            gv += red[w][0][threadIdx.x];
            uv += red[w][1][threadIdx.x];
        }
        gv *= g2;
        uv *= u2;
        hout[(size_t)s * ldh + n0 + threadIdx.x] = __float2bfloat16_rn(gv / (1.f + __expf(-gv)) * uv * coef);
    }
}

/* Launch 3: block (16 output rows, token m): y = Σ_j down_j(h_j) over the
 * (k·I + Is)/128 chunks of the token's experts, dealt round-robin to KW warps;
 * each warp puts up to PMAX chunks in flight with cp.async, then consumes them
 * in order (h rows from L2 as the B operand). The experts' down weights are
 * looked up once per block into shared memory. BC as moe_gateup2_kernel's. */
template <int KW, int PMAX, bool BC, bool SHB>
__global__ void __launch_bounds__(32 * KW, 2)
    moe_down2_kernel(const dn_params *__restrict__ P, int H, int I, int Is, int k,
                     const int32_t *__restrict__ idx, const bf16 *__restrict__ hin, int ldh,
                     bf16 *__restrict__ y, const uint4 *__restrict__ zero, const float *__restrict__ ys,
                     const float *__restrict__ hgu, const float *__restrict__ sgl, const bf16 *__restrict__ sdw) {
    extern __shared__ uint4 st[]; /* [KW][PMAX][2][32], then (SHB) h_s [Is] fp32 */
    __shared__ const uint8_t *sw[MOE_MAXK + 1], *ss[MOE_MAXK + 1];
    __shared__ float red[KW][16];
    __shared__ float ysv[SHB ? 16 : 1];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int m = blockIdx.y, n0 = blockIdx.x * 16;
    /* SHB (LASTSTAND_MOE_DEC=1): the BF16 shared expert's down rows n0 .. n0 + 15 for token m
     * here, one warp a row (KW == 16), as moe_topk_rows_kernel computes them (the same
     * sums in the same order): the row's Is weights requested right after the routed
     * weights, h_s = silu(g)·u·gate from launch 1 (complete: this kernel starts only after
     * every gate/up block passed its wait for launch 1), staged and multiplied before this
     * kernel's wait, i.e. while gate/up runs.
     * Needs one pass of the routed loop (KW <= npairs <= KW·PMAX, fused_run) since the
     * pass holds a __syncthreads. */
    static_assert(!SHB || KW == 16, "SHB: one warp a row of a 16-row tile");
    if (threadIdx.x < k) {
        const int ex = idx[m * k + threadIdx.x];
        sw[threadIdx.x] = P->dw[ex];
        ss[threadIdx.x] = P->ds[ex];
    } else if (threadIdx.x == k) {
        sw[k] = P->sdw;
        ss[k] = P->sds;
    }
    __syncthreads();
    const int cpe = I / 128, cps = Is / 128;
    /* ys (SHARED_ROUTE) / SHB: the shared expert's result, added at the end */
    const int npairs = k * cpe + (ys || SHB ? 0 : cps);
    uint4 *my = st + (size_t)warp * PMAX * 2 * 32 + lane;
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    const nv4_lut lut = nv4_lut_make((threadIdx.x + 1u) * (uint32_t)(I & 127)); /* I % 128 == 0 (BC only) */
    for (int base = warp; base < npairs; base += KW * PMAX) {
        uint16_t s0[PMAX], s1[PMAX];
#pragma unroll
        for (int u = 0; u < PMAX; u++) {
            const int p = base + KW * u;
            if (p < npairs) {
                const int j = p < k * cpe ? p / cpe : k, c = p < k * cpe ? p % cpe : p - k * cpe;
                const int K = j < k ? I : Is;
                const size_t rb = (size_t)(n0 + g) * (K / 2) + (size_t)c * 64 + 16 * t;
                const size_t sbb = (size_t)(n0 + g) * (K / 16) + (size_t)c * 8 + 2 * t;
                cu_cp_async16(my + (u * 2 + 0) * 32, sw[j] + rb);
                cu_cp_async16(my + (u * 2 + 1) * 32, sw[j] + rb + (size_t)8 * (K / 2));
                s0[u] = __ldg(reinterpret_cast<const uint16_t *>(ss[j] + sbb));
                s1[u] = __ldg(reinterpret_cast<const uint16_t *>(ss[j] + sbb + (size_t)8 * (K / 16)));
            }
            cu_cp_async_commit();
        }
        if constexpr (SHB) {
            /* the shared row's loads after the routed ones (fewer registers live across them) */
            uint4 shv[SHD_LD];
            const bf16 *row = sdw + (size_t)(n0 + warp) * Is;
#pragma unroll
            for (int c = 0; c < SHD_LD; c++)
                if (lane * 8 + 256 * c < Is) shv[c] = cu_ld_stream16(row + lane * 8 + 256 * c);
            float *hsm = reinterpret_cast<float *>(st + (size_t)KW * PMAX * 2 * 32);
            const float cg = sgl ? 1.f / (1.f + __expf(-__ldcg(sgl + m))) : 1.f;
            for (int i = threadIdx.x; i < Is; i += blockDim.x) {
                const float gv = __ldcg(hgu + (size_t)m * 2 * Is + i), uv = __ldcg(hgu + (size_t)m * 2 * Is + Is + i);
                hsm[i] = gv / (1.f + __expf(-gv)) * uv * cg;
            }
            __syncthreads();
            float a = 0.f;
#pragma unroll
            for (int c = 0; c < SHD_LD; c++) {
                const int kk = lane * 8 + 256 * c;
                if (kk >= Is) break;
                const uint32_t ww[4] = {shv[c].x, shv[c].y, shv[c].z, shv[c].w};
                const float4 h0 = *reinterpret_cast<const float4 *>(hsm + kk);
                const float4 h1 = *reinterpret_cast<const float4 *>(hsm + kk + 4);
                const float hv[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    const float2 w2 = bf2_to_f2(ww[u]);
                    a = fmaf(w2.x, hv[2 * u], a);
                    a = fmaf(w2.y, hv[2 * u + 1], a);
                }
            }
            a = warp_sum(a);
            if (lane == 0) ysv[warp] = a;
        }
        cu_pdl_wait(); /* h from gate/up (the weights above are already in flight) */
#pragma unroll
        for (int u = 0; u < PMAX; u++) {
            const int p = base + KW * u;
            if (p >= npairs) break;
            const int j = p < k * cpe ? p / cpe : k, c = p < k * cpe ? p % cpe : p - k * cpe;
            const uint4 *hp = reinterpret_cast<const uint4 *>(hin + (size_t)(m * (k + 1) + j) * ldh + c * 128 + 32 * t);
            if (BC) {
                cu_cp_async_wait_dyn(PMAX - 1 - u);
                bc_chunk(my[(u * 2 + 0) * 32], my[(u * 2 + 1) * 32], s0[u], s1[u], hp, zero, g, t, lut, acc);
            } else {
                uint4 xv[4];
#pragma unroll
                for (int v = 0; v < 4; v++) xv[v] = __ldg(hp + v);
                cu_cp_async_wait_dyn(PMAX - 1 - u);
                cu_w4_chunk_mma(my[(u * 2 + 0) * 32], my[(u * 2 + 1) * 32], s0[u], s1[u], xv, acc);
            }
        }
    }
    cu_pdl_wait();
    if (BC) bc_rows(acc);
    if (t == 0) {
        red[warp][g] = acc[0];
        red[warp][g + 8] = acc[2];
    }
    __syncthreads();
    if (threadIdx.x < 16) {
        float v = 0.f;
#pragma unroll
        for (int w = 0; w < KW; w++) v += red[w][threadIdx.x];
        if (ys) v += __ldcg(ys + (size_t)m * H + n0 + threadIdx.x);
        if (SHB) v += ysv[threadIdx.x];
        y[(size_t)m * H + n0 + threadIdx.x] = __float2bfloat16_rn(v);
    }
}

/* An NVFP4 shared expert's gate/up blocks in the cp.async pair before the top-k wait
 * (with PDL): the default since the H200 round of 17:56 (397B M = 1 57.1 -> 55.4 us, M =
 * 2 92.9 -> 90.9); LASTSTAND_MOE_SHARED_EARLY=0 turns it off. */
static int fused_early(void) {
    static int force_early = -2;
    return fused_knob(&force_early, "LASTSTAND_MOE_SHARED_EARLY", 0, 1, 1);
}

template <int KW, int PER, int V>
static cudaError_t gateup2_launch_v(int pdl, int bc, int pf, dim3 grid, size_t smem, cudaStream_t st,
                                    const gu_params *P, const dn_params *D, int H, int I, int Is, int k,
                                    const void *x, const int32_t *idx, const float *wts, void *h, int ldh,
                                    const uint4 *zero, int sr) {
    const int early = fused_early();
    auto K = bc ? moe_gateup2_kernel<KW, PER, true, V> : moe_gateup2_kernel<KW, PER, false, V>;
    cudaError_t c = bc ? fused_smem<moe_gateup2_kernel<KW, PER, true, V>>(smem)
                       : fused_smem<moe_gateup2_kernel<KW, PER, false, V>>(smem);
    if (c != cudaSuccess) return c;
    return fused_launch(pdl, K, grid, dim3(32 * KW / V), smem, st, P, D, H, I, Is, k, (const bf16 *)x, idx, wts,
                        (bf16 *)h, ldh, early, zero, sr, pf);
}

/* gate/up of the cp.async pair; v2: the 16-warp forms as 8 warps playing two slices each
 * (V = 2, the same sums), so that a down block fits beside them on an SM; pf: the expert
 * tables prefetched into L2 */
template <int KW, int PER>
static cudaError_t gateup2_launch(int pdl, int bc, int v2, int pf, dim3 grid, size_t smem, cudaStream_t st,
                                  const gu_params *P, const dn_params *D, int H, int I, int Is, int k, const void *x,
                                  const int32_t *idx, const float *wts, void *h, int ldh, const uint4 *zero, int sr) {
    if constexpr (KW == 16)
        if (v2)
            return gateup2_launch_v<KW, PER, 2>(pdl, bc, pf, grid, smem, st, P, D, H, I, Is, k, x, idx, wts, h, ldh,
                                                zero, sr);
    return gateup2_launch_v<KW, PER, 1>(pdl, bc, pf, grid, smem, st, P, D, H, I, Is, k, x, idx, wts, h, ldh, zero, sr);
}

/* the down kernel with the BF16 shared expert's rows (SHB), PMAX = P */
template <int P>
static cudaError_t down3_launch(int pdl, dim3 grid, size_t smem, cudaStream_t st, const dn_params *D, int H, int I,
                                int Is, int k, const int32_t *idx, const void *h, int ldh, void *y, const uint4 *zero,
                                const float *hgu, const float *sgl, const bf16 *sdw) {
    cudaError_t c = fused_smem<moe_down2_kernel<DOWN_KW, P, false, true>>(smem);
    if (c != cudaSuccess) return c;
    return fused_launch(pdl, moe_down2_kernel<DOWN_KW, P, false, true>, grid, dim3(32 * DOWN_KW), smem, st, D, H, I,
                        Is, k, idx, (const bf16 *)h, ldh, (bf16 *)y, zero, (const float *)NULL, hgu, sgl, sdw);
}

cudaError_t moe_fused_route_rows(const fused_call *f, int tk, float *hgu, unsigned *ticket) {
    const unsigned g1 = f->nrb + (2 * f->Is + ROUTER_NW - 1) / ROUTER_NW;
    const size_t xsm = sizeof(bf16) * (size_t)f->M * f->H;
    auto RK = tk ? moe_route_rows_kernel<true> : moe_route_rows_kernel<false>;
    cudaError_t c = tk ? fused_smem<moe_route_rows_kernel<true>>(xsm) : fused_smem<moe_route_rows_kernel<false>>(xsm);
    if (c == cudaSuccess)
        c = fused_launch(f->rpdl, RK, dim3(g1), dim3(32 * ROUTER_NW), xsm, f->st, f->M, f->H, f->E, f->nrb, f->x, f->wr,
                         f->wsg, f->logits, f->sgl, f->shg, f->shu, f->Is, hgu, f->k, f->norm, f->idx, f->wts, ticket);
    return c;
}

cudaError_t moe_fused_gateup2(const fused_call *f, int bc, int v2, int pf, dim3 grid, int sr) {
    const int gkw = f->gkw, nch = f->nch;
    const size_t gsm = (size_t)gkw * (nch / gkw) * 4 * 32 * 16;
#define GU2(KW, PER)                                                                                                   \
    gateup2_launch<KW, PER>(f->pdl, bc, v2, pf, grid, gsm, f->st, f->gp, f->dp, f->H, f->I, f->Is, f->k, f->x, f->idx, \
                            f->wts, f->hws, f->ldh, f->zero, sr)
    if (gkw == 16 && nch == 16) return GU2(16, 1);
    if (gkw == 16) return GU2(16, 2);
    if (nch == 8) return GU2(8, 1);
    if (nch == 16) return GU2(8, 2);
    if (nch == 24) return GU2(8, 3); /* H 3072: Qwen3.5-122B */
    return GU2(8, 4);
#undef GU2
}

cudaError_t moe_fused_down2(const fused_call *f, int bc, dim3 grid, const float *ys) {
    const size_t dsm = (size_t)DOWN_KW * DOWN_PMAX * 2 * 32 * 16;
    auto DK = bc ? moe_down2_kernel<DOWN_KW, DOWN_PMAX, true, false> : moe_down2_kernel<DOWN_KW, DOWN_PMAX, false, false>;
    cudaError_t c = bc ? fused_smem<moe_down2_kernel<DOWN_KW, DOWN_PMAX, true, false>>(dsm)
                       : fused_smem<moe_down2_kernel<DOWN_KW, DOWN_PMAX, false, false>>(dsm);
    if (c == cudaSuccess)
        c = fused_launch(f->pdl, DK, grid, dim3(32 * DOWN_KW), dsm, f->st, f->dp, f->H, f->I, f->Is, f->k,
                         (const int32_t *)f->idx, (const bf16 *)f->hws, f->ldh, (bf16 *)f->y, f->zero, ys,
                         (const float *)NULL, (const float *)NULL, (const bf16 *)NULL);
    return c;
}

cudaError_t moe_fused_dec(const fused_call *f, int v2, int pf, float *hs, unsigned *ticket) {
    cudaError_t c = moe_fused_route_rows(f, 1, hs, ticket);
    if (c == cudaSuccess) c = moe_fused_gateup2(f, 0, v2, pf, dim3(f->I / 16, f->M * f->k), 1);
    const int npr = f->k * (f->I / 128), pm = (npr + DOWN_KW - 1) / DOWN_KW; /* one pass of the routed loop */
    const size_t dsm = (size_t)DOWN_KW * pm * 2 * 32 * 16 + sizeof(float) * f->Is;
    const float *sg = f->wsg ? (const float *)f->sgl : NULL;
    const dim3 g3d(f->H / 16, f->M);
#define D3(P)                                                                                                          \
    down3_launch<P>(f->pdl, g3d, dsm, f->st, f->dp, f->H, f->I, f->Is, f->k, f->idx, f->hws, f->ldh, f->y, f->zero, hs, \
                    sg, f->shd)
    if (c == cudaSuccess) {
        switch (pm) {
        case 1: c = D3(1); break;
        case 2: c = D3(2); break;
        case 3: c = D3(3); break;
        case 4: c = D3(4); break;
        case 5: c = D3(5); break;
        default: c = D3(6); break;
        }
    }
#undef D3
    return c;
}
