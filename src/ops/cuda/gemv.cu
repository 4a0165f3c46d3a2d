/* gemv.cu: the gemm family's small-M backend on CUDA, "cuda_gemv":
 * y[M,N] (+)= x[M,K] · Wᵀ with W BF16 [N,K], x and y BF16, fp32 accumulation,
 * for 1 <= M <= 16 (decode batches; above that cuBLASLt was faster in device
 * round R2, on every shape at M = 32). A memory-bound kernel: every weight byte is
 * read once, 16 bytes per load, and as many loads as possible are in flight.
 *
 * The math on tensor cores ("swap AB", as the fp4_gemm cuda_w4a16_mma kernel):
 * mma.sync m16n8k16 with 16 weight rows as the A operand and up to 8 tokens per
 * n8 tile as B, so M = 1 reads no more weight than M = 16. Lane (g, t) of a
 * warp (g = lane / 4, t = lane % 4) loads 16 B (8 k values) of rows g and g + 8
 * at k = 32·col + 8·t for each of its columns `col`; the quad of lanes of one g
 * covers 32 contiguous k (64 B of each row). A dot product does not care about
 * the order of k, so the 8 values of a lane are fed to two mma as the k slots
 * {2t, 2t+1, 2t+8, 2t+9} of each, and token g's B fragment is the same 8 k
 * values of x (16 B from shared memory): A = {w0.x, w1.x, w0.y, w1.y},
 * B = {x.x, x.y}, then A = {w0.z, w1.z, w0.w, w1.w}, B = {x.z, x.w}.
 *
 * Work split: a block (8 warps) owns 16-row tiles (grid-stride over the tiles,
 * the grid sized to what the GPU holds at once, so there is no tail wave) and one
 * K range; its warps split that range into 8 contiguous runs of 32-wide columns
 * (interleaving the warps' columns so that a batch step reads one contiguous run
 * per row was tried: 14 % slower at [16384 x 4096], device round R3). When the tiles
 * alone would not give every SM a block (small N), K is also split over the S
 * blocks of a thread block cluster (sm_90, S = 2, 4 or 8), which meet in
 * distributed shared memory; S also grows when x would not fit shared memory
 * (M·K large). A cluster barrier has release semantics and so waits for the
 * weight loads in flight: clusters cost ~1.5 µs per tile when they walk through
 * several tiles (device round R2), hence the one-block-per-SM rule for S.
 * Per warp the (tile, batch of U columns) items form one flat sequence, and the
 * next item's weight loads are issued before the current item's mma (two
 * register sets), across tile boundaries too. The block's x slice (its K range,
 * M rows) is staged once in shared memory, after the first weight loads left.
 *
 * Reduction, deterministic (no float atomics; bitwise identical run to run):
 * each warp's fp32 partial of a tile goes to shared memory, a thread per output
 * sums the 8 warps in warp order, then (S > 1) cluster rank r sums its share of
 * the outputs over the S ranks in rank order, reading the other blocks' shared
 * memory, adds y when accumulating, rounds to BF16 once and stores.
 *
 * Grouped launch (gemm_impl.run_multi, ops_linear_multi): up to GV_MAX_MATS weights
 * of one K behind one x (a GDN layer's in_proj qkv / z / b / a, an attention layer's
 * q / gate / k / v) run as one grid over their concatenated 16-row tiles, each tile
 * writing its own matrix's y: one launch and one x staging instead of four, and the
 * two 32-row projections no longer a launch of their own. LASTSTAND_GEMV_MULTI=0|1
 * launches per weight / grouped (GV_MULTI_DEFAULT).
 *
 * Programmatic dependent launch (cu_pdl.h): launched with the programmatic-stream-
 * serialization attribute, the kernel lets the next one be scheduled at once, puts
 * its first weight loads in flight, and only then waits (griddepcontrol.wait) for the
 * previous grid before it stages x or touches y. LASTSTAND_GEMV_PDL=0|1 launches
 * without / with the attribute (GV_PDL_DEFAULT; without it the wait is a no-op).
 *
 * Graph-safe: no host synchronisation and no allocation; the per-kernel attribute
 * (dynamic shared memory limit) and occupancy are set / asked once per kernel
 * instance on the first call (a host-side query, no stream work).
 * Invariants: K % 8 == 0; x, W and y 16-byte aligned (cudaMalloc'd buffers and
 * BF16 rows of K % 8 == 0 are); y must not alias x.
 *
 * FP8 weights (W_FP8, E4M3 codes with fp32 scales): cuda_gemv takes them too, at M <= 16
 * and K % 64 == 0, through fp8_gemm.cu's kernel (1 byte a weight streamed; the codes
 * converted exactly to f16 in registers, one cvt per two weights, x scaled per 64-group
 * to f16 exactly, mma.sync m16n8k16): gv_run / gv_run_multi hand W_FP8 calls to
 * cu_fp8_gemv_run (up to CU_FP8_GEMV_MAX_MATS weights a launch); a grouped call must have
 * all its weights of one kind. The same PDL, determinism and graph rules hold.
 */
#include "ops/cuda/cu_cluster.h"
#include "ops/cuda/cu_util.h"
#include "ops/cuda/cu_pdl.h"
#include "ops/cuda/fp8_gemm.h"

#include <cooperative_groups.h>
#include <stdlib.h>
#include <string.h>

namespace cg = cooperative_groups;

#define GV_WARPS 8
#define GV_THREADS (GV_WARPS * 32)
#define GV_U 4                       /* columns (32 k each) per batch and lane: 8 loads of 16 B */
#define GV_MAX_M 16
#define GV_MAX_S 8                   /* cluster size (portable limit) */
#define GV_XSMEM_MAX (96 * 1024)     /* bytes of staged x per block */

/* Shared memory layout (dynamic): red [WARPS][16][8·NT] f32 (per-warp partials of
 * one tile), part [16][8·NT] f32 (the block's sum, read by the cluster), then
 * x [M][xstride] bf16 (the block's K range, zero past K). */
template <int NT>
struct gv_smem {
    static constexpr int red_floats = GV_WARPS * 16 * 8 * NT;
    static constexpr int part_floats = 16 * 8 * NT;
    static constexpr size_t x_off = (size_t)(red_floats + part_floats) * 4;
};

/* One item's weights: rows g and g + 8 of the tile, GV_U columns. */
struct gv_wregs {
    uint4 a[GV_U], b[GV_U];
};

__device__ __forceinline__ void gv_load(gv_wregs &r, const bf16 *__restrict__ w, int N, int K, int row0, int col0,
                                        int col_end, int lane) {
    const int g = lane >> 2, t = lane & 3;
    const int r0 = row0 + g, r1 = row0 + g + 8;
    const bf16 *p0 = w + (size_t)r0 * K, *p1 = w + (size_t)r1 * K;
#pragma unroll
    for (int u = 0; u < GV_U; u++) {
        const int col = col0 + u, k = col * 32 + t * 8;
        const bool ok = col < col_end && k < K;
        r.a[u] = make_uint4(0, 0, 0, 0);
        r.b[u] = make_uint4(0, 0, 0, 0);
        if (ok && r0 < N) r.a[u] = cu_ld_stream16(p0 + k);
        if (ok && r1 < N) r.b[u] = cu_ld_stream16(p1 + k);
    }
}

/* acc[nt] += W-tile rows · x tokens 8nt..8nt+7 over this item's columns. xs is the
 * block's staged x (row m at xs + m·xstride, column 0 of the block at k0). */
template <int NT>
__device__ __forceinline__ void gv_mma(const gv_wregs &r, const bf16 *xs, int xstride, int M, int col0,
                                       int col_end, int kcol0, int lane, float (&acc)[NT][4]) {
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int u = 0; u < GV_U; u++) {
        const int col = col0 + u;
        if (col >= col_end) break; /* warp-uniform */
        const int kl = (col - kcol0) * 32 + t * 8;
        const uint32_t f0[4] = {r.a[u].x, r.b[u].x, r.a[u].y, r.b[u].y};
        const uint32_t f1[4] = {r.a[u].z, r.b[u].z, r.a[u].w, r.b[u].w};
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int tok = nt * 8 + g;
            uint4 xv = make_uint4(0, 0, 0, 0);
            if (tok < M) xv = cu_lds16(xs + (size_t)tok * xstride + kl);
            cu_mma_bf16_16816(acc[nt], f0, xv.x, xv.y);
            cu_mma_bf16_16816(acc[nt], f1, xv.z, xv.w);
        }
    }
}

/* Up to GV_MAX_MATS weights of one K behind one x: matrix i owns the global tiles
 * [t_end[i-1], t_end[i]) (t_end[-1] = 0), its rows are w[i] [N[i], K], its output y[i]
 * [M, N[i]]. n = 1 is the plain y = x·Wᵀ. Passed by value; every index into it is a
 * compile-time constant (gv_mat_of), so it stays in the parameter bank. */
#define GV_MAX_MATS 4
struct gv_mats {
    int n;
    int t_end[GV_MAX_MATS];
    int N[GV_MAX_MATS];
    const bf16 *w[GV_MAX_MATS];
    bf16 *y[GV_MAX_MATS];
};

/* The matrix of global tile tg: its weights, rows, output and first global tile. */
struct gv_mat {
    const bf16 *w;
    bf16 *y;
    int N, t0;
};
__device__ __forceinline__ gv_mat gv_mat_of(const gv_mats &ms, int tg) {
    gv_mat r = {ms.w[0], ms.y[0], ms.N[0], 0};
#pragma unroll
    for (int i = 1; i < GV_MAX_MATS; i++)
        if (i < ms.n && tg >= ms.t_end[i - 1]) r = gv_mat{ms.w[i], ms.y[i], ms.N[i], ms.t_end[i - 1]};
    return r;
}

/* grid (S, G): blockIdx.x = rank in the cluster of S (the K split), blockIdx.y =
 * first global tile, stride G (T tiles over the matrices of ms). cw = columns per warp; the block's columns are
 * [rank·8·cw, (rank+1)·8·cw) ∩ [0, C), C = ceil(K / 32); warp w takes the run
 * kcol0 + w·cw + [0, cw), GV_U columns per batch. */
template <int NT>
__global__ void __launch_bounds__(GV_THREADS, 2)
gv_kernel(int M, int K, int T, int cw, int xstride, const bf16 *__restrict__ x, const gv_mats ms, int accumulate) {
    extern __shared__ __align__(16) unsigned char gv_sm[];
    float *red = reinterpret_cast<float *>(gv_sm);
    float *part = red + gv_smem<NT>::red_floats;
    bf16 *xs = reinterpret_cast<bf16 *>(gv_sm + gv_smem<NT>::x_off);

    /* programmatic dependent launch (cu_pdl.h): the next kernel may be scheduled now; this
     * one reads x and touches y only after the previous grid completed (cu_pdl_wait below),
     * its weights are constants and go in flight before that */
    cu_pdl_trigger();
    const int S = gridDim.x, rank = blockIdx.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int C = (K + 31) / 32; /* T: the tiles of all the matrices */
    const int kcol0 = rank * GV_WARPS * cw;                  /* the block's first column */
    const int cb = kcol0 + warp * cw, ce = min(cb + cw, C);  /* this warp's columns (may be empty) */
    const int nb = (cw + GV_U - 1) / GV_U;                   /* batches per tile, same for every warp */
    const int my_tiles = blockIdx.y < T ? (T - 1 - blockIdx.y) / gridDim.y + 1 : 0;
    const int items = my_tiles * nb;

    gv_wregs cur, nxt;
    if (items > 0) {
        const gv_mat a = gv_mat_of(ms, blockIdx.y);
        gv_load(cur, a.w, a.N, K, (blockIdx.y - a.t0) * 16, cb, ce, lane);
    }
    cu_pdl_wait();

    /* stage x[0..M)[block's K range] (zero past K) while the first weights are on their way */
    {
        const int kb0 = kcol0 * 32, v8 = GV_WARPS * cw * 4; /* 16 B vectors per row */
        for (int i = tid; i < M * v8; i += GV_THREADS) {
            const int m = i / v8, c = i - m * v8, k = kb0 + c * 8;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (k < K) v = __ldg(reinterpret_cast<const uint4 *>(x + (size_t)m * K + k));
            *reinterpret_cast<uint4 *>(xs + (size_t)m * xstride + c * 8) = v;
        }
    }
    __syncthreads();

    float acc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
    const int g = lane >> 2, t = lane & 3;
    cg::cluster_group cl = cg::this_cluster();

    for (int it = 0; it < items; it++) {
        const int ti = it / nb, b = it - ti * nb;
        if (it + 1 < items) {
            const int ti2 = (it + 1) / nb, b2 = (it + 1) - ti2 * nb;
            const int tg2 = blockIdx.y + ti2 * gridDim.y;
            const gv_mat a = gv_mat_of(ms, tg2);
            gv_load(nxt, a.w, a.N, K, (tg2 - a.t0) * 16, cb + b2 * GV_U, ce, lane);
        }
        gv_mma<NT>(cur, xs, xstride, M, cb + b * GV_U, ce, kcol0, lane, acc);
        cur = nxt;
        if (b != nb - 1) continue;

        /* the tile is done: warp partials -> block sum -> cluster sum -> y */
        const int tg = blockIdx.y + ti * gridDim.y;
        const gv_mat mt = gv_mat_of(ms, tg);
        const int row0 = (tg - mt.t0) * 16, N = mt.N;
        float *rw = red + warp * (16 * 8 * NT);
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            const int c0 = nt * 8 + 2 * t;
            rw[g * (8 * NT) + c0] = acc[nt][0];
            rw[g * (8 * NT) + c0 + 1] = acc[nt][1];
            rw[(g + 8) * (8 * NT) + c0] = acc[nt][2];
            rw[(g + 8) * (8 * NT) + c0 + 1] = acc[nt][3];
            acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
        }
        __syncthreads();
        for (int o = tid; o < 16 * M; o += GV_THREADS) {
            const int m = o >> 4, r = o & 15;
            float s = 0.f;
#pragma unroll
            for (int q = 0; q < GV_WARPS; q++) s += red[q * (16 * 8 * NT) + r * (8 * NT) + m];
            part[r * (8 * NT) + m] = s;
        }
        if (S > 1) cl.sync();
        else __syncthreads();
        /* outputs o = m·16 + r (consecutive threads -> consecutive n); rank r takes every S-th
         * group of 256 */
        for (int o = rank * GV_THREADS + tid; o < 16 * M; o += S * GV_THREADS) {
            const int m = o >> 4, r = o & 15, n = row0 + r;
            if (n >= N) continue;
            float s = 0.f;
            for (int q = 0; q < S; q++) {
                const float *pq = S > 1 ? cl.map_shared_rank(part, q) : part;
                s += pq[r * (8 * NT) + m];
            }
            bf16 *yp = mt.y + (size_t)m * N + n;
            if (accumulate) s += __bfloat162float(*yp);
            *yp = __float2bfloat16_rn(s);
        }
        if (S > 1) cl.sync();
        else __syncthreads();
    }
}

/* ---- host side ------------------------------------------------------------------- */

typedef struct gv_plan {
    int nt;          /* n8 token tiles: 1, 2 or 4 */
    int S;           /* K split over a cluster of S blocks */
    int cw;          /* columns per warp */
    int xstride;     /* staged x row stride, elements */
    size_t smem;     /* dynamic shared memory, bytes */
} gv_plan;

static size_t gv_smem_bytes(int nt, int M, int xstride) {
    return (size_t)(GV_WARPS * 16 * 8 * nt + 16 * 8 * nt) * 4 + (size_t)M * xstride * 2;
}

/* LASTSTAND_GEMV_SPLIT=S (1, 2, 4 or 8): a tuning knob for the device rounds
 * (bench/device/gemv.sh): use at least S blocks per K split instead of the policy
 * below (more where x would not fit otherwise). Read once; 0 = the policy. */
static int gv_forced_split(void) {
    static int v = -1;
    if (v < 0) {
        const char *s = getenv("LASTSTAND_GEMV_SPLIT");
        int f = s ? atoi(s) : 0;
        v = (f == 1 || f == 2 || f == 4 || f == 8) ? f : 0;
    }
    return v;
}

/* LASTSTAND_GEMV_FILL=1|2: split K while the doubled grid still has at most one (1) or two (2)
 * blocks per SM: at [2048 x 4096] (out_proj / o_proj, 128 tiles) 2 gives S = 2, every block's
 * loads in flight at once, two blocks an SM (the decode-step profile of S5 device round R1:
 * that shape ran at 1.8 TB/s under ncu, one block of 8 warps an SM). GV_FILL_DEFAULT 2 since
 * S7 device round R1 (2026-11-30, bench/device/stepfuse.sh): the 40-layer synth 35B decode
 * step 2.520 -> 2.441 ms (-3.1%; S5's rounds: doctor ✅, [2048 x 4096] 8.0 -> 7.3 µs at M = 1,
 * 9.5 -> 8.4 at M = 8, the 8-layer step 0.877 -> 0.869 ms). Read once. */
#define GV_FILL_DEFAULT 2
static int gv_fill(void) {
    static int v = -1;
    if (v < 0) {
        const char *s = getenv("LASTSTAND_GEMV_FILL");
        v = s && !strcmp(s, "2") ? 2 : s && !strcmp(s, "1") ? 1 : GV_FILL_DEFAULT;
    }
    return v;
}

/* The split for M, N, K on n_sm SMs; 0, or -1 when K is too long to stage x for
 * this M even over a cluster of GV_MAX_S. */
static int gv_make_plan(int M, int N, int K, int n_sm, gv_plan *p) {
    p->nt = M <= 8 ? 1 : 2;
    const int T = (N + 15) / 16, C = (K + 31) / 32, force = gv_forced_split();
    for (int S = 1; S <= GV_MAX_S; S *= 2) {
        const int cw = (C + S * GV_WARPS - 1) / (S * GV_WARPS);
        /* stride ≡ 32 (mod 64) elements: the 8 lanes of a quarter warp (two token rows,
         * 64 B each) hit distinct banks */
        const int xstride = GV_WARPS * cw * 32 + 32;
        const size_t xb = (size_t)M * xstride * 2;
        /* split K further while the doubled grid still has at most one block per SM and
         * every warp keeps >= 2 columns: all weight loads are then issued up front, and no
         * cluster walks through more than one tile (a cluster barrier waits for the loads
         * in flight). Device round R2: S = 4 at [512 x 4096] and S = 2 at [1024 x 4096]
         * were the fastest, one block per SM both. */
        const int more_fill = force ? S < force : T * 2 * S <= gv_fill() * n_sm && C >= S * 2 * GV_WARPS * 2;
        if ((xb > GV_XSMEM_MAX || more_fill) && S < GV_MAX_S) continue;
        if (xb > GV_XSMEM_MAX) return -1;
        p->S = S;
        p->cw = cw;
        p->xstride = xstride;
        p->smem = gv_smem_bytes(p->nt, M, xstride);
        return 0;
    }
    return -1;
}

/* Per kernel instance: the dynamic shared memory limit raised once; and how many
 * clusters of S blocks (blocks when S = 1) the whole GPU holds at once, asked once
 * per (device, instance, S, shared memory size) and cached (cu_cluster.cu). */
template <int NT>
static int gv_resident(const gv_plan *p, int n_sm, ls_err *e) {
    return cu_cluster_resident((const void *)gv_kernel<NT>, GV_THREADS, p->S, p->smem,
                               gv_smem_bytes(NT, GV_MAX_M, 0) + GV_XSMEM_MAX, n_sm, "gemm cuda_gemv", e);
}

/* LASTSTAND_GEMV_PDL=0|1: launch without / with programmatic dependent launch (off: the
 * behaviour before it, for before/after timings). On by default since H200 device round
 * R1 (2026-11-29 23:07, bench/device/decprof.sh): the PDL switches together took the
 * 8-layer synth 35B decode step from 1.023 to 0.941 ms. */
#define GV_PDL_DEFAULT 1
static int gv_pdl(void) {
    static int v = -1;
    if (v < 0) v = cu_env_switch("LASTSTAND_GEMV_PDL", GV_PDL_DEFAULT);
    return v;
}

template <int NT>
static int gv_launch(int M, int K, const bf16 *x, const gv_mats &ms, int accumulate, const gv_plan *p, int n_sm,
                     cudaStream_t st, ls_err *e) {
    const int T = ms.t_end[ms.n - 1];
    int G = gv_resident<NT>(p, n_sm, e);
    if (G < 0) return G;
    if (G > T) G = T;
    cudaLaunchConfig_t cfg;
    cudaLaunchAttribute at[2];
    cu_cluster_config(&cfg, at, p->S, G, GV_THREADS, p->smem, st);
    if (gv_pdl()) {
        at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[1].val.programmaticStreamSerializationAllowed = 1;
        cfg.numAttrs = 2;
    }
    cudaError_t c = cudaLaunchKernelEx(&cfg, gv_kernel<NT>, M, K, T, p->cw, p->xstride, x, ms, accumulate);
    if (c != cudaSuccess && cfg.numAttrs == 2) { /* a launch that refuses the attribute: without it */
        (void)cudaGetLastError();
        cfg.numAttrs = 1;
        c = cudaLaunchKernelEx(&cfg, gv_kernel<NT>, M, K, T, p->cw, p->xstride, x, ms, accumulate);
    }
    CU_TRY(e, c, "gemm cuda_gemv");
    return 0;
}

static int gv_n_sm(ls_err *e) {
    int dev = 0, n = 0;
    CU_TRY(e, cudaGetDevice(&dev), "cudaGetDevice");
    CU_TRY(e, cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute");
    return n;
}

static int gv_supported(const dev_info *d, const gemm_shape *s, char *why, size_t n) {
    if (d->kind != DEV_CUDA) {
        snprintf(why, n, "needs a CUDA device");
        return 0;
    }
    if (d->cc_major < 9) {
        snprintf(why, n, "needs sm_90 or newer (thread block clusters), device is cc %d.%d", d->cc_major,
                 d->cc_minor);
        return 0;
    }
    if (s->wk != W_BF16 && s->wk != W_FP8) {
        snprintf(why, n, "weight must be BF16 or FP8, got %s", w_kind_name(s->wk));
        return 0;
    }
    if (s->dt != ACT_BF16) {
        snprintf(why, n, "activations must be BF16");
        return 0;
    }
    if (s->wk == W_FP8) return cu_fp8_gemv_shape_ok(s->M, s->N, s->K, why, n);
    if (s->M > GV_MAX_M) {
        snprintf(why, n, "small-M kernel: M=%d > %d (cuda_cublaslt is faster there)", s->M, GV_MAX_M);
        return 0;
    }
    if (s->K % 8) {
        snprintf(why, n, "K=%d is not a multiple of 8 (16-byte weight loads)", s->K);
        return 0;
    }
    gv_plan p;
    if (s->M > 0 && gv_make_plan(s->M, s->N, s->K, d->n_sm > 0 ? d->n_sm : 132, &p)) {
        snprintf(why, n, "K=%d too long to stage x for M=%d (%d KB of shared memory per block at most)", s->K, s->M,
                 GV_XSMEM_MAX / 1024);
        return 0;
    }
    return 1;
}

/* Check one call's operands; 0 or ERR_UNSUPPORTED naming the weight. */
static int gv_check(const gemm_args *a, ls_err *e) {
    const lin_w *w = a->w;
    if (!w || w->kind != W_BF16)
        return errf(e, ERR_UNSUPPORTED, "gemm cuda_gemv: weight %s is %s, needs BF16", w && w->name ? w->name : "?",
                    w ? w_kind_name(w->kind) : "?");
    if (a->dt != ACT_BF16) return errf(e, ERR_UNSUPPORTED, "gemm cuda_gemv: activations must be BF16");
    if (a->M > GV_MAX_M)
        return errf(e, ERR_UNSUPPORTED, "gemm cuda_gemv: weight %s: M=%d > %d", w->name ? w->name : "?", a->M,
                    GV_MAX_M);
    if (w->K % 8)
        return errf(e, ERR_UNSUPPORTED, "gemm cuda_gemv: weight %s: K=%d is not a multiple of 8",
                    w->name ? w->name : "?", w->K);
    if (((uintptr_t)a->x | (uintptr_t)w->data | (uintptr_t)a->y) & 15)
        return errf(e, ERR_UNSUPPORTED, "gemm cuda_gemv: weight %s: x, W and y must be 16-byte aligned",
                    w->name ? w->name : "?");
    return 0;
}

/* n calls that share M, x, K and accumulate (checked by the caller) as one launch. */
static int gv_run_mats(int n, const gemm_args *a, ls_stream s, ls_err *e) {
    gv_mats ms;
    memset(&ms, 0, sizeof ms);
    int T = 0;
    for (int i = 0; i < n; i++) {
        if (a[i].w->N <= 0) continue;
        ms.w[ms.n] = (const bf16 *)a[i].w->data;
        ms.y[ms.n] = (bf16 *)a[i].y;
        ms.N[ms.n] = a[i].w->N;
        T += (a[i].w->N + 15) / 16;
        ms.t_end[ms.n++] = T;
    }
    if (a[0].M <= 0 || ms.n == 0) return 0;
    int n_sm = gv_n_sm(e);
    if (n_sm <= 0) return n_sm < 0 ? n_sm : errf(e, ERR_RUNTIME, "gemm cuda_gemv: no SM count");
    const int K = a[0].w->K;
    gv_plan p;
    if (gv_make_plan(a[0].M, T * 16, K, n_sm, &p))
        return errf(e, ERR_UNSUPPORTED, "gemm cuda_gemv: weight %s: K=%d too long to stage x for M=%d",
                    a[0].w->name ? a[0].w->name : "?", K, a[0].M);
    cudaStream_t st = (cudaStream_t)s;
    switch (p.nt) {
    case 1: return gv_launch<1>(a[0].M, K, (const bf16 *)a[0].x, ms, a[0].accumulate, &p, n_sm, st, e);
    default: return gv_launch<2>(a[0].M, K, (const bf16 *)a[0].x, ms, a[0].accumulate, &p, n_sm, st, e);
    }
}

/* A W_FP8 call for fp8_gemm.cu's kernel: 0, or ERR_UNSUPPORTED with its reason. */
static int gv_fp8_check(const gemm_args *a, ls_err *e) {
    char why[256];
    if (!cu_fp8_gemv_check(a, why, sizeof why)) return errf(e, ERR_UNSUPPORTED, "gemm cuda_gemv: %s", why);
    return 0;
}

static int gv_run(const gemm_args *a, ls_stream s, ls_err *e) {
    if (a->w && a->w->kind == W_FP8) {
        int rc = gv_fp8_check(a, e);
        return rc ? rc : cu_fp8_gemv_run(1, a, (cudaStream_t)s, e);
    }
    int rc = gv_check(a, e);
    if (rc) return rc;
    return gv_run_mats(1, a, s, e);
}

/* LASTSTAND_GEMV_MULTI=0|1: run_multi launches one kernel per weight / groups them (off:
 * the behaviour before the grouped launch, for before/after timings). On by default since
 * H200 device round R1 (2026-11-29 23:07): GDN in-projections 12.4 + 7.8 + 4.6 + 4.6 µs
 * -> 16.6 µs (ncu), 8-layer synth 35B decode step 1.023 -> 0.939 ms. */
#define GV_MULTI_DEFAULT 1
static int gv_multi_on(void) {
    static int v = -1;
    if (v < 0) v = cu_env_switch("LASTSTAND_GEMV_MULTI", GV_MULTI_DEFAULT);
    return v;
}

/* gemm_impl.run_multi: n products of one x (same M, K, accumulate) in one launch, the
 * weights' 16-row tiles concatenated into one grid; in groups of GV_MAX_MATS (FP8:
 * CU_FP8_GEMV_MAX_MATS). All weights BF16 or all FP8. */
static int gv_run_multi(int n, const gemm_args *a, ls_stream s, ls_err *e) {
    const int fp8 = n > 0 && a[0].w && a[0].w->kind == W_FP8;
    for (int i = 0; i < n; i++) {
        if (a[0].w && a[i].w && (a[i].w->kind == W_FP8) != fp8)
            return errf(e, ERR_INVAL, "gemm cuda_gemv: grouped weights %s (%s) and %s (%s) are of different kinds",
                        a[0].w->name ? a[0].w->name : "?", w_kind_name(a[0].w->kind),
                        a[i].w->name ? a[i].w->name : "?", w_kind_name(a[i].w->kind));
        int rc = fp8 ? gv_fp8_check(&a[i], e) : gv_check(&a[i], e);
        if (rc) return rc;
        if (a[i].M != a[0].M || a[i].x != a[0].x || a[i].w->K != a[0].w->K || a[i].accumulate != a[0].accumulate)
            return errf(e, ERR_INVAL, "gemm cuda_gemv: grouped weights %s and %s differ in M, x, K or accumulate",
                        a[0].w->name ? a[0].w->name : "?", a[i].w->name ? a[i].w->name : "?");
    }
    const int g = !gv_multi_on() ? 1 : fp8 ? CU_FP8_GEMV_MAX_MATS : GV_MAX_MATS;
    for (int i = 0; i < n; i += g) {
        const int k = n - i < g ? n - i : g;
        int rc = fp8 ? cu_fp8_gemv_run(k, a + i, (cudaStream_t)s, e) : gv_run_mats(k, a + i, s, e);
        if (rc) return rc;
    }
    return 0;
}

const gemm_impl gemm_cuda_gemv = {"cuda_gemv", DEV_CUDA, 0, gv_supported, gv_run, 1, gv_run_multi};
