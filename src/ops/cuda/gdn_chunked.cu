/* gdn_chunked.cu: two more gdn backends on CUDA (Gated DeltaNet,
 * reference/qwen35-and-nvfp4.md 2.4), same contract as gdn.cu's
 * cuda_recurrent (ops.h gdn_args): qkv [n_tok, conv_dim] pre-conv, a and b
 * [n_tok, nv], BF16; per-slot fp32 states conv [n_slots, conv_dim, conv_k-1]
 * (oldest first) and rec S [n_slots, nv, dk, dv], read and updated in place;
 * out [n_tok, nv, dv] = Sᵀq per token, BF16, before the gated norm.
 *
 * Both start with a preparation kernel (the math of cuda_recurrent's conv step,
 * parallel over tokens too): a thread per (sequence, channel, chunk of 16
 * tokens) runs the causal depthwise conv + SiLU from the slot's conv state,
 * and g = -exp(A_log)·softplus(a + dt_bias), β = sigmoid(b) per (token, v
 * head) go to an fp32 workspace gb [n_tok, nv, 2]; the conv state is rolled by
 * the same kernel for decode batches (<= 16 new tokens per sequence), by a
 * small second kernel otherwise. cuda_chunked's preparation is by default gc_prep8_kernel (4
 * channels a thread, a q/k head's norm within one warp; LASTSTAND_GDN_PREP=0: gc_prep_kernel,
 * the same bits). Then:
 *
 *   cuda_chunked   the preparation also L2-normalises q and k (q scaled by
 *                  dk^-0.5; a head's sum of squares across the warps of its
 *                  block) and multiplies v by β, into FP16 operands x16
 *                  [n_tok, conv_dim]; then the chunkwise (WY / UT-transform)
 *                  form of the gated delta rule over chunks of 64 tokens (fla
 *                  chunk_gated_delta_rule, transformers
 *                  torch_chunk_gated_delta_rule; src/ops/cpu/gdn_chunked.c has
 *                  the same math in plain C). A block of 16 warps (dk = 128;
 *                  8 otherwise) per (sequence, v head) walks the sequence's
 *                  chunks, the next chunk's operands arriving by cp.async in a
 *                  second buffer while the current one is worked on; S [dk,
 *                  dv] stays in registers as mma accumulators (fp32) for the
 *                  whole sequence, with an FP16 copy in shared memory as the B
 *                  operand. Per chunk of L tokens, γ = in-chunk cumulative sum
 *                  of g, every exp taken of a non-positive difference (γ_i −
 *                  γ_j, j ≤ i) so nothing overflows:
 *                    A  = strict_lower(β_i k_i·k_j e^{γ_i−γ_j})      (fp32)
 *                    T  = (I + A)⁻¹   by 16 × 16 blocks (fp32)
 *                    U  = T (β⊙V),  W = T (β⊙K⊙e^γ)
 *                    V' = U − W S
 *                    O  = e^γ ⊙ (Q S) + (lower_incl(Q Kᵀ ⊙ e^{γ_i−γ_j})) V'
 *                    S  ← e^{γ_L} S + (K ⊙ e^{γ_L−γ})ᵀ V'
 *                  All matmuls are mma.sync m16n8k16 with fp32 accumulation;
 *                  the operands are FP16 (fla uses the model's BF16: FP16's
 *                  three more mantissa bits bring the chunked outputs and
 *                  states as close to the fp32 recurrence as cuda_per_token;
 *                  GC_FP16 0 selects BF16). Rows past L are zero (k = v = q =
 *                  0, g = β = 0), which leaves S and every valid row unchanged,
 *                  and their 16-row tiles are skipped.
 *                  When the sequences × v heads leave SMs idle (one long prompt:
 *                  64 or 32 blocks on 132 SMs), dk = dv = 128 heads are split
 *                  over 2 or 4 blocks by value columns (A, T, W, P recomputed
 *                  by each; U, V', O, S split).
 *                  Chunk-parallel form (default; LASTSTAND_GDN_WY=0 turns it off; dk = dv =
 *                  128, a sequence of more than 512 tokens; chunk_run): the same kernel in MODE 1 computes every chunk's
 *                  WY record (γ, U, −W, P: all that does not depend on S) in a block per (chunk,
 *                  v head) at once, then in MODE 2 walks the chunks with S doing only V', O and
 *                  the state update; the same products, so the same bits as the serial MODE 0.
 *   cuda_per_token the preparation writes the conv outputs in fp32 (c [n_tok,
 *                  conv_dim]); then the plain recurrence, token by token: a
 *                  block per (sequence, v head), a thread per column d of S, S
 *                  in global memory (read twice and written once per token,
 *                  through L1/L2), q and k normalised per token:
 *                    S ← e^g S;  δ = β (v − Sᵀk);  S ← S + k δᵀ;  o = Sᵀq.
 *
 * Sequence metadata: the kernels read the device array args->seqs ({slot,
 * n_new, row0} int32 triples); seqs_host is validated and sizes the grids.
 * The workspace is per device (cu_ws.h: cudaGetDevice, own lock), grown on
 * first use and never in steady state, outgrown buffers kept (a captured
 * graph's pointers stay valid); nothing syncs with the host.
 * A BF16 state (gdn_state.rec16, --mamba-ssm-dtype bfloat16): cuda_chunked's chunk kernel reads
 * S once into fp32 and writes it once (gc_ld2 / gc_st2, rounded to nearest even), instantiated at
 * dk = dv = 128 (Qwen3.5, Qwen3-Next); cuda_per_token, which updates S in global memory token by
 * token, refuses it.
 */
#include "ops/cuda/cu_util.h"
#include "ops/cuda/gdn_cu.h"
#include "ops/cuda/cu_ws.h"
#include "ops/cuda/gdn_prep_hook.h"

#include <cuda_fp16.h>

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

enum { GC_MAX_K = 8, GC_CHUNK = 64, GC_THREADS = 256, GC_CONV_T = 16, GC_CONV_MAXZ = 64 };

static_assert(sizeof(gdn_seq) == 3 * sizeof(int32_t) && offsetof(gdn_seq, slot) == 0 &&
                  offsetof(gdn_seq, n_new) == 4 && offsetof(gdn_seq, row0) == 8,
              "gdn_seq must be {int32 slot, n_new, row0}: the kernels read it as int32 triples");

/* ---- workspace ------------------------------------------------------------- */

typedef struct gc_ws {
    cu_ws ws;    /* lock + buffer 0: conv output (fp32 or FP16 operands) then (g, β) (cu_ws.h) */
    int smem_ok; /* chunked kernels' shared-memory opt-in done (bit per instantiation) */
    int n_sm;    /* multiprocessors of the device */
    int p8_bps;  /* resident blocks of gc_prep8_kernel<4, GC_P8_CPT> per SM (0: not asked yet) */
} gc_ws;

static gc_ws g_gcws[CU_WS_MAX_DEV];

/* This device's workspace, locked; its SM count read on first use. */
static int gc_lock(gc_ws **out, ls_err *e) {
    int dev = 0, rc = cu_ws_device("gdn", &dev, e);
    if (rc) return rc;
    gc_ws *w = &g_gcws[dev];
    cu_ws_lock(&w->ws);
    if (!w->n_sm) {
        int n = 0;
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n <= 0) n = 100;
        w->n_sm = n;
    }
    *out = w;
    return 0;
}

__device__ __forceinline__ float gc_bf(const bf16 *p, size_t i) { return __bfloat162float(p[i]); }

/* ---- preparation: conv + SiLU, g and β (the same math as gdn.cu) ------------- */

/* (1) grid (ceil(max(D, nv) / 128), n_seq, nz), 128 threads: block (x, s, z) takes channels
 * 128x .. 128x + 127 of sequence s, token chunks z, z + nz, ... of GC_CONV_T tokens each, so a
 * long prefill is not one serial walk per channel. meta: [slot, n_new, row0] per seq.
 *   c [n_tok, D]      = silu(Σ_i w[ch][i] · x[t − (K−1) + i][ch]), x at t' < 0 taken from the
 *                       slot's conv state (oldest first: x[t'] = state[K − 1 + t'])
 *   gb [n_tok, nv, 2] = (g, β)
 * With one block per channel along z (gridDim.z == 1: every sequence has at most 16 new tokens,
 * decode) the block rolls the conv state itself; otherwise gc_conv_state_kernel does, afterwards.
 * KK: the kernel size when known at compile time (0: K at run time, at most GC_MAX_K). */
template <int KK>
__global__ void gc_conv_kernel(int D, int Kr, int nv, const int32_t *__restrict__ meta, const bf16 *__restrict__ qkv,
                               const bf16 *__restrict__ a, const bf16 *__restrict__ b,
                               const float *__restrict__ conv_w, const float *__restrict__ A_log,
                               const float *__restrict__ dt_bias, float *__restrict__ conv_st,
                               float *__restrict__ c, float *__restrict__ gb) {
    const int K = KK ? KK : Kr;
    const int s = blockIdx.y, ch = blockIdx.x * blockDim.x + threadIdx.x;
    const int slot = meta[3 * s], T = meta[3 * s + 1], row0 = meta[3 * s + 2];
    for (int t0 = blockIdx.z * GC_CONV_T; t0 < T; t0 += gridDim.z * GC_CONV_T) {
        const int t1 = min(T, t0 + GC_CONV_T);
        if (ch < D) {
            float win[KK ? KK : GC_MAX_K], w[KK ? KK : GC_MAX_K];
            float *st = conv_st + ((size_t)slot * D + ch) * (K - 1);
#pragma unroll
            for (int i = 0; i < K; i++) w[i] = conv_w[(size_t)ch * K + i];
#pragma unroll
            for (int i = 0; i < K - 1; i++) {
                const int u = t0 - (K - 1) + i;
                win[i] = u < 0 ? st[K - 1 + u] : gc_bf(qkv, (size_t)(row0 + u) * D + ch);
            }
            float xin[GC_CONV_T]; /* the chunk's inputs in flight together (rows past t1 repeat the last) */
#pragma unroll
            for (int t = 0; t < GC_CONV_T; t++) xin[t] = gc_bf(qkv, (size_t)(row0 + min(t0 + t, t1 - 1)) * D + ch);
#pragma unroll
            for (int t = 0; t < GC_CONV_T; t++) {
                if (t0 + t >= t1) break;
                win[K - 1] = xin[t];
                float acc = 0.f;
#pragma unroll
                for (int i = 0; i < K; i++) acc = fmaf(w[i], win[i], acc);
                c[(size_t)(row0 + t0 + t) * D + ch] = acc / (1.f + __expf(-acc));
#pragma unroll
                for (int i = 0; i < K - 1; i++) win[i] = win[i + 1];
            }
            if (gridDim.z == 1 && t1 == T) /* one block walks all the tokens: it rolls the state itself */
#pragma unroll
                for (int i = 0; i < K - 1; i++) st[i] = win[i];
        }
        if (ch < nv) {
            const float al = -__expf(A_log[ch]), db = dt_bias[ch];
            for (int t = t0; t < t1; t++) {
                size_t r = (size_t)(row0 + t) * nv + ch;
                float x = gc_bf(a, r) + db;
                float sp = x > 20.f ? x : log1pf(__expf(x)); /* torch softplus threshold 20 */
                gb[2 * r] = al * sp;
                gb[2 * r + 1] = 1.f / (1.f + __expf(-gc_bf(b, r)));
            }
        }
    }
}

/* (1b) grid (ceil(D / 128), n_seq): the slot's conv state becomes the last K − 1 inputs of
 * (state ++ new tokens): new[i] = combined[T + i]. In place in ascending i: new[i] reads
 * old[T + i] with T + i > i, never an entry already rewritten. */
__global__ void gc_conv_state_kernel(int D, int K, const int32_t *__restrict__ meta, const bf16 *__restrict__ qkv,
                                     float *__restrict__ conv_st) {
    const int s = blockIdx.y, ch = blockIdx.x * blockDim.x + threadIdx.x;
    const int slot = meta[3 * s], T = meta[3 * s + 1], row0 = meta[3 * s + 2];
    if (ch >= D || T <= 0) return;
    float *st = conv_st + ((size_t)slot * D + ch) * (K - 1);
    for (int i = 0; i < K - 1; i++) {
        const int idx = T + i; /* index into combined = state (K − 1) ++ new (T) */
        st[i] = idx < K - 1 ? st[idx] : gc_bf(qkv, (size_t)(row0 + idx - (K - 1)) * D + ch);
    }
}

/* ---- cuda_per_token ------------------------------------------------------------ */

/* grid (nv, n_seq), block dv threads: thread d owns column d of S [dk, dv] in
 * global memory. Shared: qs [dk], ks [dk] (dynamic). */
__global__ void gc_token_kernel(int nk, int nv, int dk, int dv, int D, const int32_t *__restrict__ meta,
                                const float *__restrict__ c, const float *__restrict__ gb, float *__restrict__ rec,
                                bf16 *__restrict__ out) {
    extern __shared__ float gc_tok_sh[];
    __shared__ float red[32];
    float *qs = gc_tok_sh, *ks = gc_tok_sh + dk;
    const int j = blockIdx.x, s = blockIdx.y, d = threadIdx.x;
    const int slot = meta[3 * s], T = meta[3 * s + 1], row0 = meta[3 * s + 2];
    const int kh = j / (nv / nk);
    float *__restrict__ Sg = rec + ((size_t)slot * nv + j) * dk * dv; /* [dk, dv] */
    const float qscale = rsqrtf((float)dk);
    for (int t = 0; t < T; t++) {
        const float *ct = c + (size_t)(row0 + t) * D;
        float sq = 0.f, sk = 0.f;
        for (int i = d; i < dk; i += dv) {
            float x = ct[(size_t)kh * dk + i], y = ct[(size_t)nk * dk + (size_t)kh * dk + i];
            qs[i] = x;
            ks[i] = y;
            sq += x * x;
            sk += y * y;
        }
        sq = gdn_block_sum(sq, red); /* its syncs also publish qs, ks */
        sk = gdn_block_sum(sk, red);
        const float rq = rsqrtf(sq + 1e-6f) * qscale, rk = rsqrtf(sk + 1e-6f);
        const size_t r = (size_t)(row0 + t) * nv + j;
        const float decay = __expf(gb[2 * r]), beta = gb[2 * r + 1];
        const float v = ct[(size_t)2 * nk * dk + (size_t)j * dv + d];
        /* m = (e^g S)ᵀ k̂ for column d */
        float m = 0.f;
        for (int i = 0; i < dk; i++) m = fmaf(Sg[(size_t)i * dv + d], ks[i], m);
        m *= decay * rk;
        const float delta = beta * (v - m);
        /* S[:, d] ← e^g S[:, d] + k̂ δ;  o = S[:, d] · q̂ */
        float o = 0.f;
        for (int i = 0; i < dk; i++) {
            float x = fmaf(Sg[(size_t)i * dv + d], decay, ks[i] * rk * delta);
            Sg[(size_t)i * dv + d] = x;
            o = fmaf(x, qs[i], o);
        }
        out[r * dv + d] = __float2bfloat16_rn(o * rq);
        __syncthreads(); /* qs, ks are rewritten by the next token */
    }
}

/* ---- cuda_chunked: fragment helpers ------------------------------------------ */
/* mma.sync m16n8k16 fragments (g = lane / 4, t = lane % 4):
 *   A (16×16, row-major): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
 *   B (16×8, "col"):      b0 = B[2t..2t+1][g],  b1 = B[2t+8..2t+9][g]
 *   C (16×8, fp32):       c0,c1 = C[g][2t..2t+1], c2,c3 = C[g+8][2t..2t+1] */

/* The operand type of every product of the chunk kernel: FP16 (GC_FP16 1, 10-bit mantissa, 8x
 * finer than BF16, so the chunked form stays as close to the fp32 recurrence as the per-token
 * kernels) or BF16 (0, as fla). FP16 is safe here because every operand is bounded: q̂, k̂ have
 * unit norm, decays and T are O(1), and vβ, V', S scale with v (|v| far below 65504 for the
 * conv + SiLU outputs of a normed hidden state). Accumulation is fp32 either way. */
#ifndef GC_FP16
#define GC_FP16 1
#endif
#if GC_FP16
typedef __half gc_op;
__device__ __forceinline__ gc_op gc_cvt(float x) { return __float2half_rn(x); }
__device__ __forceinline__ float gc_f(gc_op x) { return __half2float(x); }
__device__ __forceinline__ uint32_t gc_pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
/* D = A·B + D, m16n8k16, FP16 in, fp32 accumulate (A row-major, B col-major) */
__device__ __forceinline__ void gc_mma(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
#else
typedef bf16 gc_op;
__device__ __forceinline__ gc_op gc_cvt(float x) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ float gc_f(gc_op x) { return __bfloat162float(x); }
__device__ __forceinline__ uint32_t gc_pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}
__device__ __forceinline__ void gc_mma(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    cu_mma_bf16_16816(d, a, b0, b1);
}
#endif

/* Two outputs as BF16x2 (the op's output dtype). */
__device__ __forceinline__ uint32_t gc_pack_out(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

__device__ __forceinline__ uint32_t gc_ld32(const gc_op *p) { return *reinterpret_cast<const uint32_t *>(p); }

/* A fragment of rows r0.., cols k0.. of a row-major [*, ld] gc_op matrix. */
__device__ __forceinline__ void gc_lda(uint32_t a[4], const gc_op *M, int ld, int r0, int k0) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const gc_op *p = M + (r0 + g) * ld + k0 + 2 * t;
    a[0] = gc_ld32(p);
    a[1] = gc_ld32(p + 8 * ld);
    a[2] = gc_ld32(p + 8);
    a[3] = gc_ld32(p + 8 * ld + 8);
}

/* A fragment of Mᵀ: A[m][k] = M[k][m] for M row-major [*, ld] (k rows k0.., m cols m0..),
 * ldmatrix.x4.trans: lane l addresses matrix mi = l/8 row l%8 at M[k0 + (mi>>1)·8 + l%8][m0 + (mi&1)·8]. */
__device__ __forceinline__ void gc_lda_t(uint32_t a[4], const gc_op *M, int ld, int k0, int m0) {
    const int lane = threadIdx.x & 31, mi = lane >> 3;
    const gc_op *p = M + (k0 + (mi >> 1) * 8 + (lane & 7)) * ld + m0 + (mi & 1) * 8;
    uint32_t ad = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(ad));
}

/* B fragment (k0.., n0..) of B = M for M row-major [k][n] (n contiguous): ldmatrix.x2.trans,
 * lanes 0..15 address M[k0 + (l/8)·8 + l%8][n0]. */
__device__ __forceinline__ void gc_ldb_kn(uint32_t &b0, uint32_t &b1, const gc_op *M, int ld, int k0, int n0) {
    const int lane = threadIdx.x & 15;
    const gc_op *p = M + (k0 + lane) * ld + n0;
    uint32_t ad = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(b0), "=r"(b1) : "r"(ad));
}

/* B fragment (k0.., n0..) of B = Mᵀ for M row-major [n][k] (k contiguous). */
__device__ __forceinline__ void gc_ldb_nk(uint32_t &b0, uint32_t &b1, const gc_op *M, int ld, int k0, int n0) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const gc_op *p = M + (n0 + g) * ld + k0 + 2 * t;
    b0 = gc_ld32(p);
    b1 = gc_ld32(p + 8);
}

/* Store a C fragment (rows r0.., cols c0..) as gc_op into row-major [*, ld], times f. */
__device__ __forceinline__ void gc_stc(gc_op *M, int ld, int r0, int c0, const float c[4], float f) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    gc_op *p = M + (r0 + g) * ld + c0 + 2 * t;
    *reinterpret_cast<uint32_t *>(p) = gc_pack(c[0] * f, c[1] * f);
    *reinterpret_cast<uint32_t *>(p + 8 * ld) = gc_pack(c[2] * f, c[3] * f);
}

/* ---- cuda_chunked: preparation -------------------------------------------------- */

/* (1, chunked) grid (ceil(D / 128), n_seq, nz), 128 threads, the conv of gc_conv_kernel finished
 * into the chunk kernel's operands: x16 [n_tok, D] (gc_op) holds q̂ = l2norm(q)·dk^-0.5, k̂ =
 * l2norm(k) and βv in the channel layout of qkv, and gb [n_tok, nv, 2] = (g, β). A block's 128
 * channels hold whole q/k heads (dk divides 128 and the block start): a head's sum of squares is
 * the sum of its dk/32 warps' partials (shared red). The conv state as in gc_conv_kernel. */
template <int KK>
__global__ void gc_prep_kernel(int D, int Kr, int nk, int nv, int dk, int dv,
                                                      const int32_t *__restrict__ meta,
                                                      const bf16 *__restrict__ qkv, const bf16 *__restrict__ a,
                                                      const bf16 *__restrict__ b, const float *__restrict__ conv_w,
                                                      const float *__restrict__ A_log,
                                                      const float *__restrict__ dt_bias,
                                                      float *__restrict__ conv_st, gc_op *__restrict__ x16,
                                                      float *__restrict__ gb) {
    __shared__ float red[GC_CONV_T][4];
    const int K = KK ? KK : Kr;
    const int s = blockIdx.y, ch = blockIdx.x * 128 + threadIdx.x, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int slot = meta[3 * s], T = meta[3 * s + 1], row0 = meta[3 * s + 2];
    const int qk = 2 * nk * dk, hw = dk / 32, w0 = (threadIdx.x / dk) * hw; /* the head's first warp */
    const bool isq = ch < nk * dk, isk = !isq && ch < qk, isv = ch >= qk && ch < D;
    const float qscale = rsqrtf((float)dk);
    for (int t0 = blockIdx.z * GC_CONV_T; t0 < T; t0 += gridDim.z * GC_CONV_T) {
        const int n = min(GC_CONV_T, T - t0);
        float xs[GC_CONV_T];
        if (ch < D) {
            float win[KK ? KK : GC_MAX_K], wt[KK ? KK : GC_MAX_K];
            float *st = conv_st + ((size_t)slot * D + ch) * (K - 1);
#pragma unroll
            for (int i = 0; i < K; i++) wt[i] = conv_w[(size_t)ch * K + i];
#pragma unroll
            for (int i = 0; i < K - 1; i++) {
                const int u = t0 - (K - 1) + i;
                win[i] = u < 0 ? st[K - 1 + u] : gc_bf(qkv, (size_t)(row0 + u) * D + ch);
            }
            float xin[GC_CONV_T]; /* all the chunk's inputs in flight at once (rows past n repeat the last) */
#pragma unroll
            for (int t = 0; t < GC_CONV_T; t++) xin[t] = gc_bf(qkv, (size_t)(row0 + t0 + min(t, n - 1)) * D + ch);
#pragma unroll
            for (int t = 0; t < GC_CONV_T; t++) {
                float acc = 0.f;
                if (t < n) {
                    win[K - 1] = xin[t];
#pragma unroll
                    for (int i = 0; i < K; i++) acc = fmaf(wt[i], win[i], acc);
                    acc = acc / (1.f + __expf(-acc));
#pragma unroll
                    for (int i = 0; i < K - 1; i++) win[i] = win[i + 1];
                }
                xs[t] = acc;
            }
            if (gridDim.z == 1 && t0 + n == T) /* one block walks all the tokens: it rolls the state itself */
#pragma unroll
                for (int i = 0; i < K - 1; i++) st[i] = win[i];
        } else {
#pragma unroll
            for (int t = 0; t < GC_CONV_T; t++) xs[t] = 0.f;
        }
#pragma unroll
        for (int t = 0; t < GC_CONV_T; t++) {
            float sq = xs[t] * xs[t];
#pragma unroll
            for (int o = 16; o; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
            if (lane == 0) red[t][w] = sq;
        }
        float bv[GC_CONV_T]; /* β of this v channel's head, loaded together */
#pragma unroll
        for (int t = 0; t < GC_CONV_T; t++)
            bv[t] = isv ? gc_bf(b, (size_t)(row0 + t0 + min(t, n - 1)) * nv + (ch - qk) / dv) : 0.f;
        __syncthreads();
#pragma unroll
        for (int t = 0; t < GC_CONV_T; t++) {
            if (t >= n) break;
            const size_t r = (size_t)(row0 + t0 + t);
            float v = xs[t];
            if (isq || isk) {
                float ss = 0.f;
                for (int u = 0; u < hw; u++) ss += red[t][w0 + u];
                v *= rsqrtf(ss + 1e-6f) * (isq ? qscale : 1.f);
            } else if (isv) {
                v *= 1.f / (1.f + __expf(-bv[t]));
            }
            if (ch < D) x16[r * D + ch] = gc_cvt(v);
        }
        __syncthreads(); /* red is rewritten by the next chunk of tokens */
        if (ch < nv) {
            const float al = -__expf(A_log[ch]), db = dt_bias[ch];
            float av[GC_CONV_T], bb[GC_CONV_T];
#pragma unroll
            for (int t = 0; t < GC_CONV_T; t++) {
                const size_t r = (size_t)(row0 + t0 + min(t, n - 1)) * nv + ch;
                av[t] = gc_bf(a, r);
                bb[t] = gc_bf(b, r);
            }
#pragma unroll
            for (int t = 0; t < GC_CONV_T; t++) {
                if (t >= n) break;
                const size_t r = (size_t)(row0 + t0 + t) * nv + ch;
                float x = av[t] + db;
                float sp = x > 20.f ? x : log1pf(__expf(x)); /* torch softplus threshold 20 */
                gb[2 * r] = al * sp;
                gb[2 * r + 1] = 1.f / (1.f + __expf(-bb[t]));
            }
        }
    }
}

/* (1, chunked, vector form: LASTSTAND_GDN_PREP=1, the default; 0 = gc_prep_kernel above) the same
 * outputs as gc_prep_kernel, bit for bit, by wider threads: grid (ceil(D / (128·CPT)), n_seq, nz),
 * 128 threads; a thread takes CPT adjacent channels (CPT = GC_P8_CPT = 4: 8-byte loads of qkv and
 * stores of x16; the template also builds CPT 8, 16-byte accesses, measured slower);
 * block z walks tokens [z·L, (z+1)·L) of its sequence (L a multiple of GC_P8_G, chosen by the host
 * so that the blocks fill the SMs' resident slots once), the conv window carried in registers,
 * in groups of GC_P8_G tokens: the next group's rows are loaded while this one is computed, and a
 * group's tokens are independent (no branch: past the sequence's end rows are clamped and stores
 * skipped), so their conv, SiLU and reductions interleave. A q/k head of dk channels is dk/CPT lanes
 * of one warp, so its sum of squares needs no shared memory and no barrier: the old kernel's tree,
 * rebuilt on lanes that hold CPT channels (element l = CPT·(lane % (32/CPT)) + c of a 32-channel
 * group): its xor levels 16 .. CPT are shuffles to lanes ^ o/CPT (CPT 4: ^4, ^2, ^1), the levels below
 * CPT within the thread; then the head's dk/32 group partials summed in order u = 0, 1, ...
 * Every sum is an unfused fp32 add (__fadd_rn / __fmul_rn: the old kernel's FMUL, SHFL, FADD);
 * the conv fma order, SiLU, the scales, softplus and sigmoid are the old expressions. Warps of v
 * channels only skip the reductions (QK = false). (g, β) of a v head are written by the dv/CPT
 * lanes of its channels (tokens q, q + dv/CPT, ... of the block's range), spread over all blocks
 * instead of one block's 32 threads. The conv state is rolled here when nz = 1 (with
 * gc_conv_state_kernel's reads, after this block read the state), else by that kernel afterwards.
 * Needs conv_k = 4 (GC_P8_K), qkv 2·CPT-byte aligned, dk in 32/64/128 (a head within a warp), dv
 * a multiple of 8. */
/* GC_P8_CPT 4 (S12 R3: 177.3 µs at the 35B shape's 8192-token step, 120 registers, 4 blocks an SM)
 * beat 8 (183.6 µs, 166 registers, 3 blocks); groups of 6 tokens (8 spilled at CPT 8) */
enum { GC_P8_G = 6, GC_P8_NT = 128, GC_P8_K = 4, GC_P8_CPT = 4 };

/* CPT (8 or 4) BF16 channels of a row: one 16- or 8-byte access */
template <int CPT> struct gc_p8_vec;
template <> struct gc_p8_vec<8> { typedef uint4 t; };
template <> struct gc_p8_vec<4> { typedef uint2 t; };

__device__ __forceinline__ void gc_unpack(const uint4 r, float x[8]) {
    const uint32_t u[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; i++) { /* BF16 -> fp32 is exact: the upper 16 bits */
        x[2 * i] = __uint_as_float(u[i] << 16);
        x[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    }
}
__device__ __forceinline__ void gc_unpack(const uint2 r, float x[4]) {
    x[0] = __uint_as_float(r.x << 16);
    x[1] = __uint_as_float(r.x & 0xffff0000u);
    x[2] = __uint_as_float(r.y << 16);
    x[3] = __uint_as_float(r.y & 0xffff0000u);
}
__device__ __forceinline__ void gc_store(gc_op *p, const float y[8], float f) {
    uint4 o;
    o.x = gc_pack(y[0] * f, y[1] * f);
    o.y = gc_pack(y[2] * f, y[3] * f);
    o.z = gc_pack(y[4] * f, y[5] * f);
    o.w = gc_pack(y[6] * f, y[7] * f);
    *reinterpret_cast<uint4 *>(p) = o;
}
__device__ __forceinline__ void gc_store4(gc_op *p, const float y[4], float f) {
    uint2 o;
    o.x = gc_pack(y[0] * f, y[1] * f);
    o.y = gc_pack(y[2] * f, y[3] * f);
    *reinterpret_cast<uint2 *>(p) = o;
}

/* One thread's walk over tokens [tb, te) of its sequence (see gc_prep8_kernel). */
template <int K, int CPT, bool QK>
__device__ __forceinline__ void gc_p8_walk(int tb, int te, int row0, int D, int nv, bool in, bool isv, int vh,
                                           int hb, int hw, float sc, const typename gc_p8_vec<CPT>::t *__restrict__ src,
                                           size_t rs, const bf16 *__restrict__ b, const float (&wt)[CPT][K],
                                           const float *__restrict__ st, gc_op *__restrict__ xo) {
    constexpr int G = GC_P8_G, LG = 32 / CPT; /* lanes of a 32-channel group */
    typedef typename gc_p8_vec<CPT>::t vec;
    float win[CPT][K - 1]; /* inputs tb − (K−1) .. tb − 1 (before the sequence: the slot's conv state) */
#pragma unroll
    for (int i = 0; i < K - 1; i++) {
        const int u = tb - (K - 1) + i;
        if (u < 0) {
#pragma unroll
            for (int c = 0; c < CPT; c++) win[c][i] = in ? st[c * (K - 1) + K - 1 + u] : 0.f;
        } else {
            float x[CPT];
            gc_unpack(__ldg(src + (size_t)(row0 + u) * rs), x);
#pragma unroll
            for (int c = 0; c < CPT; c++) win[c][i] = x[c];
        }
    }
    vec cur[G];
    float bc[G];
#pragma unroll
    for (int t = 0; t < G; t++) { /* rows past te clamped to te − 1 (computed, not stored) */
        const int r = row0 + min(tb + t, te - 1);
        cur[t] = __ldg(src + (size_t)r * rs);
        bc[t] = isv ? gc_bf(b, (size_t)r * nv + vh) : 0.f;
    }
    for (int g0 = tb; g0 < te; g0 += G) {
        vec nxt[G];
        float bn[G];
        if (g0 + G < te) { /* uniform */
#pragma unroll
            for (int t = 0; t < G; t++) {
                const int r = row0 + min(g0 + G + t, te - 1);
                nxt[t] = __ldg(src + (size_t)r * rs);
                bn[t] = isv ? gc_bf(b, (size_t)r * nv + vh) : 0.f;
            }
        }
#pragma unroll
        for (int t = 0; t < G; t++) {
            float x[CPT], y[CPT], ac[CPT], dn[CPT];
            gc_unpack(cur[t], x);
#pragma unroll
            for (int c = 0; c < CPT; c++) {
                float acc = 0.f;
#pragma unroll
                for (int i = 0; i < K - 1; i++) acc = fmaf(wt[c][i], win[c][i], acc);
                acc = fmaf(wt[c][K - 1], x[c], acc);
                ac[c] = acc;
                dn[c] = 1.f + __expf(-acc);
#pragma unroll
                for (int i = 0; i < K - 2; i++) win[c][i] = win[c][i + 1];
                win[c][K - 2] = x[c];
            }
#pragma unroll
            for (int c = 0; c < CPT; c++) y[c] = ac[c] / dn[c]; /* SiLU: acc / (1 + e^−acc) */
            float f = 1.f;
            if constexpr (QK) {
                /* the old tree over element l = CPT·(lane % LG) + c: xor levels 16 .. CPT across
                 * lanes (lane ^ o/CPT), then CPT/2 .. 1 inside the thread */
                float sq[CPT];
#pragma unroll
                for (int c = 0; c < CPT; c++) sq[c] = __fmul_rn(y[c], y[c]);
#pragma unroll
                for (int o = 16; o >= CPT; o >>= 1)
#pragma unroll
                    for (int c = 0; c < CPT; c++)
                        sq[c] = __fadd_rn(sq[c], __shfl_xor_sync(0xffffffffu, sq[c], o / CPT));
#pragma unroll
                for (int o = CPT / 2; o >= 1; o >>= 1)
#pragma unroll
                    for (int c = 0; c < o; c++) sq[c] = __fadd_rn(sq[c], sq[c + o]);
                float ss = 0.f; /* the head's group partials u = 0, 1, ... in order */
                for (int u = 0; u < hw; u++) ss = __fadd_rn(ss, __shfl_sync(0xffffffffu, sq[0], hb + LG * u));
                f = rsqrtf(ss + 1e-6f) * sc;
            }
            if (isv) f = 1.f / (1.f + __expf(-bc[t]));
            if (in && g0 + t < te) {
                if constexpr (CPT == 8)
                    gc_store(xo + (size_t)(row0 + g0 + t) * D, y, f);
                else
                    gc_store4(xo + (size_t)(row0 + g0 + t) * D, y, f);
            }
        }
#pragma unroll
        for (int t = 0; t < G; t++) {
            cur[t] = nxt[t];
            bc[t] = bn[t];
        }
    }
}

template <int K, int CPT>
__global__ void __launch_bounds__(GC_P8_NT, CPT == 8 ? 3 : 4)
    gc_prep8_kernel(int D, int nk, int nv, int dk, int dv, int L, const int32_t *__restrict__ meta,
                    const bf16 *__restrict__ qkv, const bf16 *__restrict__ a, const bf16 *__restrict__ b,
                    const float *__restrict__ conv_w, const float *__restrict__ A_log,
                    const float *__restrict__ dt_bias, float *__restrict__ conv_st, gc_op *__restrict__ x16,
                    float *__restrict__ gb) {
    static_assert(K >= 2 && (CPT == 8 || CPT == 4), "gc_prep8_kernel");
    const int s = blockIdx.y, lane = threadIdx.x & 31;
    const int slot = meta[3 * s], T = meta[3 * s + 1], row0 = meta[3 * s + 2];
    const int tb = blockIdx.z * L, te = min(T, tb + L);
    if (tb >= te) return; /* the whole block: no barrier follows */
    const int cv = blockIdx.x * GC_P8_NT + threadIdx.x, qk = 2 * nk * dk;
    const bool in = CPT * cv < D;
    const int ch = in ? CPT * cv : 0; /* this thread's channels ch .. ch + CPT − 1 (past D: read channel 0) */
    const bool isq = in && ch < nk * dk, isv = in && ch >= qk;
    const bool wqk = CPT * (cv - lane) < qk;                /* the warp holds q/k channels (uniform) */
    const int hb = lane & ~(dk / CPT - 1), hw = dk >> 5;    /* the head's first lane, its 32-channel groups */
    const int vh = isv ? (ch - qk) / dv : 0;                /* v head */
    const float sc = isq ? rsqrtf((float)dk) : 1.f;         /* q̂ scale dk^-0.5 */
    const size_t rs = (size_t)D / CPT;                      /* a row of qkv in vectors */
    const typename gc_p8_vec<CPT>::t *src = reinterpret_cast<const typename gc_p8_vec<CPT>::t *>(qkv) + ch / CPT;
    float wt[CPT][K];
#pragma unroll
    for (int c = 0; c < CPT; c++)
#pragma unroll
        for (int i = 0; i < K; i++) wt[c][i] = conv_w[(size_t)(ch + c) * K + i];
    float *st = conv_st + ((size_t)slot * D + ch) * (K - 1);
    if (wqk)
        gc_p8_walk<K, CPT, true>(tb, te, row0, D, nv, in, isv, vh, hb, hw, sc, src, rs, b, wt, st, x16 + ch);
    else
        gc_p8_walk<K, CPT, false>(tb, te, row0, D, nv, in, isv, vh, hb, hw, sc, src, rs, b, wt, st, x16 + ch);
    if (gridDim.z == 1 && in) /* one block walked all the tokens (and has read the state): roll it */
#pragma unroll
        for (int c = 0; c < CPT; c++)
#pragma unroll
            for (int i = 0; i < K - 1; i++) { /* new[i] = (state ++ new tokens)[T + i], ascending */
                const int idx = T + i;
                st[c * (K - 1) + i] = idx < K - 1 ? st[c * (K - 1) + idx]
                                                  : gc_bf(qkv, (size_t)(row0 + idx - (K - 1)) * D + ch + c);
            }
    if (isv) { /* (g, β) of head vh: lane q of its dv/CPT takes tokens tb + q, tb + q + dv/CPT, ... */
        const int nq = dv / CPT, q = ((ch - qk) / CPT) % nq;
        const float al = -__expf(A_log[vh]), db = dt_bias[vh];
        for (int t = tb + q; t < te; t += nq) {
            const size_t r = (size_t)(row0 + t) * nv + vh;
            float x = gc_bf(a, r) + db;
            float sp = x > 20.f ? x : log1pf(__expf(x)); /* torch softplus threshold 20 */
            *reinterpret_cast<float2 *>(gb + 2 * r) = make_float2(al * sp, 1.f / (1.f + __expf(-gc_bf(b, r))));
        }
    }
}

/* cp.async global -> shared of 16 (.cg) or 8 (.ca) bytes; src_bytes 0 zero-fills. */
__device__ __forceinline__ void gc_cp16(void *dst, const void *src, int src_bytes) {
    uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void gc_cp8(void *dst, const void *src, int src_bytes) {
    uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void gc_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void gc_cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

/* ---- cuda_chunked: the kernel ------------------------------------------------- */

/* Shared memory of gc_chunk_kernel<DK, DV, ...> (bytes): gc_op tiles Qs, Ks [2][64][DK+8] (two
 * buffers: the next chunk lands while this one is worked on), KBs, Ws [64][DK+8], VBs
 * [2][64][DV+8], Sb [DK][DV+8], Tb, Pb [64][72]; fp32 Af, Xf [64][65], gam [64], Ys [3][16][16],
 * gbs [2][64][2] (g, β). 225 KB at dk = dv = 128. */
template <int DK, int DV>
struct gc_layout {
    static constexpr int LK = DK + 8, LV = DV + 8, LT = GC_CHUNK + 8, LF = GC_CHUNK + 1;
    static constexpr size_t bf16s = 6 * GC_CHUNK * LK + 2 * GC_CHUNK * LV + DK * LV + 2 * GC_CHUNK * LT;
    static constexpr size_t f32s = 2 * GC_CHUNK * LF + GC_CHUNK + 3 * 256 + 4 * GC_CHUNK;
    static constexpr size_t bytes = bf16s * 2 + f32s * 4;
};

/* grid (nv, n_seq, NVS), NW warps (8, or 16 at dk = 128: the block is alone on its SM, and
 * its phases are latency-bound, so more warps with less work each). Block z takes the value
 * columns [z·DVB, (z+1)·DVB) of its head (DVB = DV / NVS): everything that depends on v (U, V',
 * O, S) is split, the rest (A, T, W, P) is recomputed per block; NVS > 1 when nv · n_seq blocks
 * would leave SMs idle (a long prompt). Warp tiles, with CGN = NW/4 column groups:
 *   64×64 products (K Kᵀ, Q Kᵀ): rows 16·(w%4), cols (w/4)·64/CGN, 8/CGN n-tiles
 *   64×DVB / 64×DK products (U, W, V', O): rows 16·(w%4), cols (w/4)·DVB/CGN (DK/CGN)
 *   S [DK, DVB]: RT = DK/16 row tiles, SCG = NW/RT column groups: rows 16·(w%RT), cols (w/RT)·DVB/SCG */
/* Two consecutive state values as fp32 and back (BF16: rounded to nearest even): the state's
 * storage type ST (gdn_state.rec or rec16) */
__device__ __forceinline__ float2 gc_ld2(const float *p) { return *reinterpret_cast<const float2 *>(p); }
__device__ __forceinline__ float2 gc_ld2(const bf16 *p) {
    const uint32_t u = *reinterpret_cast<const uint32_t *>(p);
    return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}
__device__ __forceinline__ void gc_st2(float *p, float a, float b) { *reinterpret_cast<float2 *>(p) = make_float2(a, b); }
__device__ __forceinline__ void gc_st2(bf16 *p, float a, float b) {
    *reinterpret_cast<__nv_bfloat162 *>(p) = __floats2bfloat162_rn(a, b);
}

template <int DK, int DV, int NVS, int NW, int MODE, class ST = float>
__global__ void __launch_bounds__(NW * 32, 1)
    gc_chunk_kernel(int nk, int nv, int D, const int32_t *__restrict__ meta, const gc_op *__restrict__ x16,
                    const float *__restrict__ gb, ST *__restrict__ rec, bf16 *__restrict__ out, int n_seq,
                    unsigned char *__restrict__ wy) {
    constexpr int DVB = DV / NVS, NT = NW * 32, CGN = NW / 4;
    typedef gc_layout<DK, DVB> LY;
    constexpr int LK = LY::LK, LV = LY::LV, LT = LY::LT, LF = LY::LF, C = GC_CHUNK;
    constexpr int RT = DK / 16, SCG = NW / RT, SC = DVB / SCG, SNT = SC / 8; /* S tiling */
    constexpr int UC = DVB / CGN, WC = DK / CGN, KC = 64 / CGN;              /* column group widths */
    constexpr int UNT = UC / 8, WNT = WC / 8, KNT = KC / 8;                  /* their n-tiles */
    static_assert(RT >= 1 && RT <= NW && NW % RT == 0 && SC % 8 == 0 && UC % 8 == 0 && WC % 8 == 0, "tiling");
    extern __shared__ __align__(16) unsigned char gc_smem[];
    gc_op *Qb = reinterpret_cast<gc_op *>(gc_smem); /* [2][C][LK] */
    gc_op *Kb = Qb + 2 * C * LK, *KBs = Kb + 2 * C * LK, *Ws = KBs + C * LK;
    gc_op *VBb = Ws + C * LK, *Sb = VBb + 2 * C * LV, *Tb = Sb + DK * LV, *Pb = Tb + C * LT;
    float *Af = reinterpret_cast<float *>(Pb + C * LT), *Xf = Af + C * LF;
    float *gam = Xf + C * LF, *Ys = gam + C, *gbs = Ys + 3 * 256; /* gbs [2][C][2] */
    /* the WY record of a (chunk, v head) (MODE 1 writes it, MODE 2 reads it): −W [C][DK] gc_op,
     * P [C][C] gc_op, U [C][DV] fp32, γ [C] fp32; MODE 2 double-buffers −W, P, γ: buffer 0 in Ws,
     * Pb, gam, buffer 1 in the Af / Xf region and Ys (unused by MODE 2) */
    constexpr size_t WY_P = (size_t)C * DK * sizeof(gc_op), WY_U = WY_P + (size_t)C * C * sizeof(gc_op),
                     WY_G = WY_U + (size_t)C * DV * 4, WY_B = WY_G + (size_t)C * 4;
    static_assert(MODE != 2 || C * LK * sizeof(gc_op) + C * LT * sizeof(gc_op) <= 2 * C * LF * sizeof(float),
                  "MODE 2: the second -W and P buffers fit where Af and Xf were");
    static_assert(MODE != 1 || NVS == 1, "MODE 1: a block computes U for every value column");

    const int j = blockIdx.x;
    const int tid = threadIdx.x, w = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    /* MODE 1: blockIdx.y = the chunk's index over all sequences' chunks (ci), s and its chunk from
     * it; else blockIdx.y = the sequence, and (MODE 2) cib = the index of its first chunk */
    int s = blockIdx.y, cbeg = 0, cib = 0;
    if constexpr (MODE == 1) {
        int ci = blockIdx.y;
        for (s = 0; s < n_seq; s++) {
            const int nc = (meta[3 * s + 1] + C - 1) / C;
            if (ci < nc) break;
            ci -= nc;
        }
        if (s >= n_seq) return;
        cbeg = ci * C;
    } else if constexpr (MODE == 2) {
        for (int q = 0; q < s; q++) cib += (meta[3 * q + 1] + C - 1) / C;
    }
    const int slot = meta[3 * s], T = meta[3 * s + 1], row0 = meta[3 * s + 2];
    if (T <= 0) return;
    const int kh = j / (nv / nk);
    const int vc0 = blockIdx.z * DVB;                                            /* this block's v columns */
    ST *__restrict__ Sg = rec + ((size_t)slot * nv + j) * DK * DV + vc0; /* [DK, DV] as stored, from column vc0 */

    /* chunk starting at token cc0 into buffer bi: q̂, k̂ rows of head kh, βv rows of this block's
     * columns, (g, β); rows past the sequence are zero-filled */
    auto load_chunk = [&](int cc0, int bi) {
        const int Ln = min(C, T - cc0);
        gc_op *Qd = Qb + bi * C * LK, *Kd = Kb + bi * C * LK, *Vd = VBb + bi * C * LV;
        float *gd = gbs + bi * 2 * C;
        for (int x = tid; x < C * (DK / 8); x += NT) {
            const int i = x / (DK / 8), c8 = x % (DK / 8), ok = i < Ln;
            const gc_op *src = x16 + (size_t)(row0 + cc0 + (ok ? i : 0)) * D + (size_t)kh * DK + c8 * 8;
            gc_cp16(Qd + i * LK + c8 * 8, src, ok ? 16 : 0);
            gc_cp16(Kd + i * LK + c8 * 8, src + (size_t)nk * DK, ok ? 16 : 0);
        }
        if constexpr (MODE == 2) {
            const unsigned char *r = wy + ((size_t)(cib + cc0 / C) * nv + j) * WY_B;
            gc_op *Wd = bi ? reinterpret_cast<gc_op *>(Af) : Ws;
            gc_op *Pd = bi ? reinterpret_cast<gc_op *>(Af) + C * LK : Pb;
            float *Gd = bi ? Ys : gam;
            for (int x = tid; x < C * (DK / 8); x += NT)
                gc_cp16(Wd + (x / (DK / 8)) * LK + (x % (DK / 8)) * 8, r + (size_t)x * 16, 16);
            for (int x = tid; x < C * (C / 8); x += NT)
                gc_cp16(Pd + (x / (C / 8)) * LT + (x % (C / 8)) * 8, r + WY_P + (size_t)x * 16, 16);
            for (int x = tid; x < C / 4; x += NT) gc_cp16(Gd + 4 * x, r + WY_G + (size_t)x * 16, 16);
            (void)Vd;
            (void)gd;
        } else {
            for (int x = tid; x < C * (DVB / 8); x += NT) {
                const int i = x / (DVB / 8), c8 = x % (DVB / 8), ok = i < Ln;
                const gc_op *src = x16 + (size_t)(row0 + cc0 + (ok ? i : 0)) * D + (size_t)2 * nk * DK +
                                   (size_t)j * DV + vc0 + c8 * 8;
                gc_cp16(Vd + i * LV + c8 * 8, src, ok ? 16 : 0);
            }
            for (int i = tid; i < C; i += NT) {
                const int ok = i < Ln;
                gc_cp8(gd + 2 * i, gb + 2 * ((size_t)(row0 + cc0 + (ok ? i : 0)) * nv + j), ok ? 8 : 0);
            }
        }
    };
    load_chunk(cbeg, 0);
    gc_cp_commit();

    /* S in registers: this warp's rows sr .. sr + 15, cols sc0 .. sc0 + SC - 1 */
    const int sr = 16 * (w % RT), sc0 = (w / RT) * SC;
    float S[SNT][4];
#pragma unroll
    for (int n = 0; n < SNT; n++) {
        if constexpr (MODE == 1) {
            S[n][0] = S[n][1] = S[n][2] = S[n][3] = 0.f;
            continue;
        }
        const float2 x0 = gc_ld2(Sg + (size_t)(sr + g) * DV + sc0 + 8 * n + 2 * t);
        const float2 x1 = gc_ld2(Sg + (size_t)(sr + g + 8) * DV + sc0 + 8 * n + 2 * t);
        S[n][0] = x0.x; S[n][1] = x0.y; S[n][2] = x1.x; S[n][3] = x1.y;
        gc_stc(Sb, LV, sr, sc0 + 8 * n, S[n], 1.f);
    }
    const int rt = 16 * (w & 3);   /* row tile of the 64-row products */
    const int cg = w >> 2;         /* column group of the 64-row products */

    for (int c0 = cbeg; c0 < (MODE == 1 ? cbeg + 1 : T); c0 += C) { /* MODE 1: its one chunk */
        const int L = min(C, T - c0);
        /* 16-row tiles holding tokens (a decode row: 1): the other tiles are padding, their products
         * are zero and are skipped (warps whose row tile is padding idle through (c), (e)-(g)) */
        const int NT16 = (L + 15) / 16;
        const bool live = rt < 16 * NT16;
        /* (a) this chunk landed in buffer bi (prefetched during the previous chunk); start the next */
        const int bi = MODE == 1 ? 0 : (c0 / C) & 1;
        if (MODE != 1 && c0 + C < T) load_chunk(c0 + C, bi ^ 1); /* buffer bi^1 was freed by the previous chunk's end */
        gc_cp_commit();
        gc_cp_wait<1>();
        __syncthreads();
        gc_op *Qs = Qb + bi * C * LK, *Ks = Kb + bi * C * LK, *VBs = VBb + bi * C * LV;
        const float *gbc = gbs + bi * 2 * C; /* (g, β) of row i at gbc[2i], gbc[2i + 1] */
        /* −W, P, γ of this chunk (MODE 2: the buffer the record landed in) and U */
        gc_op *const Wsc = MODE == 2 && bi ? reinterpret_cast<gc_op *>(Af) : Ws;
        gc_op *const Pbc = MODE == 2 && bi ? reinterpret_cast<gc_op *>(Af) + C * LK : Pb;
        const float *const gamc = MODE == 2 && bi ? Ys : gam;
        float u[UNT][4];
        if constexpr (MODE == 2) {
            /* (b)-(e) were done by MODE 1: U (rows of live tiles, this block's columns) from the record */
            const float *Ug = reinterpret_cast<const float *>(wy + ((size_t)(cib + c0 / C) * nv + j) * WY_B + WY_U);
#pragma unroll
            for (int n = 0; n < UNT; n++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const float2 v = live ? *reinterpret_cast<const float2 *>(Ug + (size_t)(rt + g + 8 * hh) * DV + vc0 +
                                                                              cg * UC + 8 * n + 2 * t)
                                          : make_float2(0.f, 0.f);
                    u[n][2 * hh] = v.x;
                    u[n][2 * hh + 1] = v.y;
                }
            (void)gbc;
        } else {
        /* (b) γ = inclusive cumsum of g over the chunk (warp 0: lane l holds rows 2l, 2l + 1) */
        if (w == 0) {
            const float g0 = gbc[4 * lane], g1 = gbc[4 * lane + 2];
            float x = g0 + g1;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                float y = __shfl_up_sync(0xffffffffu, x, o);
                if (lane >= o) x += y;
            }
            gam[2 * lane] = x - g1;
            gam[2 * lane + 1] = x;
        }
        __syncthreads();
        /* (c) KBs = β k̂ e^γ; A = strict_lower(β_i k̂_i·k̂_j e^{γ_i−γ_j}) (fp32); P = lower_incl(q̂_i·k̂_j e^{γ_i−γ_j}) */
        for (int x = tid; x < C * DK; x += NT) {
            const int i = x / DK, d = x % DK;
            KBs[i * LK + d] = gc_cvt(gc_f(Ks[i * LK + d]) * gbc[2 * i + 1] * __expf(gam[i]));
        }
        if (live) {
            float kk[KNT][4], qk[KNT][4];
#pragma unroll
            for (int n = 0; n < KNT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) kk[n][e] = qk[n][e] = 0.f;
#pragma unroll
            for (int ks = 0; ks < DK / 16; ks++) {
                uint32_t ak[4], aq[4];
                gc_lda(ak, Ks, LK, rt, 16 * ks);
                gc_lda(aq, Qs, LK, rt, 16 * ks);
#pragma unroll
                for (int n = 0; n < KNT; n++) {
                    uint32_t b0, b1;
                    gc_ldb_nk(b0, b1, Ks, LK, 16 * ks, KC * cg + 8 * n);
                    gc_mma(kk[n], ak, b0, b1);
                    gc_mma(qk[n], aq, b0, b1);
                }
            }
#pragma unroll
            for (int n = 0; n < KNT; n++) {
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    const int i = rt + g + 8 * hh, jj = KC * cg + 8 * n + 2 * t;
                    const float gi = gam[i], bt = gbc[2 * i + 1];
                    float av[2], pv[2];
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int col = jj + e;
                        const float dec = col <= i ? __expf(gi - gam[col]) : 0.f;
                        av[e] = col < i ? bt * kk[n][2 * hh + e] * dec : 0.f;
                        pv[e] = qk[n][2 * hh + e] * dec;
                    }
                    Af[i * LF + jj] = av[0];
                    Af[i * LF + jj + 1] = av[1];
                    *reinterpret_cast<uint32_t *>(Pb + i * LT + jj) = gc_pack(pv[0], pv[1]);
                }
            }
        }
        __syncthreads();
        /* (d) T = (I + A)⁻¹ (fp32) by 16×16 blocks.
         * (d1) the four diagonal blocks, forward substitution: lane l of warps 0, 1 owns column cc =
         *      32w + l (block b = cc / 16, local column c) in registers: X[r][c] = δ_rc for r <= c,
         *      −Σ_{m<r} A[16b + r][16b + m] X[m][c] below (rows past L have A = 0: identity);
         *      the other warps zero the blocks off the diagonal.
         * (d2) block forward substitution, level d = i − j = 1, 2, 3 (blocks of lower levels are done):
         *      Y = A[block i][16j .. 16i) · X[16j .. 16i)[block j],  X[block i][block j] = −X_ii · Y. */
        {
            if (w < 2) {
                const int cc = 32 * w + lane, b0 = cc & ~15, c = cc & 15;
                float x[16];
#pragma unroll
                for (int r = 0; r < 16; r++) x[r] = r == c ? 1.f : 0.f;
#pragma unroll
                for (int r = 1; r < 16; r++) {
                    if (b0 >= 16 * NT16) break; /* a padding tile: A was not written there; X = I */
                    const float *ar = Af + (b0 + r) * LF + b0;
                    float p = 0.f;
#pragma unroll
                    for (int m = 0; m < r; m++) p = fmaf(ar[m], x[m], p);
                    if (r > c) x[r] = -p;
                }
#pragma unroll
                for (int r = 0; r < 16; r++) Xf[(b0 + r) * LF + cc] = x[r];
            } else {
                for (int x = tid - 64; x < C * C; x += NT - 64) {
                    const int i = x / C, cc = x % C;
                    if (i / 16 != cc / 16) Xf[i * LF + cc] = 0.f;
                }
            }
            __syncthreads();
            for (int d = 1; d < NT16; d++) {
                const int nb = NT16 - d; /* blocks (jb + d, jb), jb < nb, ib = jb + d < NT16 (zero past it) */
                for (int x = tid; x < nb * 256; x += NT) {
                    const int jb = x >> 8, r = (x >> 4) & 15, cc = x & 15, ib = jb + d;
                    const float *ar = Af + (16 * ib + r) * LF;
                    float y = 0.f;
                    for (int m = 16 * jb; m < 16 * ib; m++) y = fmaf(ar[m], Xf[m * LF + 16 * jb + cc], y);
                    Ys[x] = y;
                }
                __syncthreads();
                for (int x = tid; x < nb * 256; x += NT) {
                    const int jb = x >> 8, r = (x >> 4) & 15, cc = x & 15, ib = jb + d;
                    const float *xr = Xf + (16 * ib + r) * LF + 16 * ib;
                    float v = 0.f;
#pragma unroll
                    for (int m = 0; m < 16; m++) v = fmaf(xr[m], Ys[(jb << 8) + m * 16 + cc], v);
                    Xf[(16 * ib + r) * LF + 16 * jb + cc] = -v;
                }
                __syncthreads();
            }
            for (int x = tid; x < C * C; x += NT) {
                const int i = x / C, cc = x % C;
                Tb[i * LT + cc] = gc_cvt(Xf[i * LF + cc]);
            }
        }
        __syncthreads();
        /* (e) U = T vβ (kept in registers), W = T (kβ e^γ) -> Ws as −W */
        {
#pragma unroll
            for (int n = 0; n < UNT; n++) u[n][0] = u[n][1] = u[n][2] = u[n][3] = 0.f;
            float wk[WNT][4];
#pragma unroll
            for (int n = 0; n < WNT; n++) wk[n][0] = wk[n][1] = wk[n][2] = wk[n][3] = 0.f;
            for (int ks = 0; live && ks < NT16; ks++) { /* T[i][m] = 0 for m >= 16·NT16 > i */
                uint32_t a[4];
                gc_lda(a, Tb, LT, rt, 16 * ks);
#pragma unroll
                for (int n = 0; n < UNT; n++) {
                    uint32_t b0, b1;
                    gc_ldb_kn(b0, b1, VBs, LV, 16 * ks, cg * UC + 8 * n);
                    gc_mma(u[n], a, b0, b1);
                }
#pragma unroll
                for (int n = 0; n < WNT; n++) {
                    uint32_t b0, b1;
                    gc_ldb_kn(b0, b1, KBs, LK, 16 * ks, cg * WC + 8 * n);
                    gc_mma(wk[n], a, b0, b1);
                }
            }
#pragma unroll
            for (int n = 0; n < WNT; n++) gc_stc(Ws, LK, rt, cg * WC + 8 * n, wk[n], -1.f);
        }
        __syncthreads();
        if constexpr (MODE == 1) {
            /* the chunk's WY record: U from the registers (zeros on padding tiles), −W, P, γ from
             * shared memory (P rows of padding tiles are never read) */
            unsigned char *r = wy + ((size_t)blockIdx.y * nv + j) * WY_B;
            float *Ug = reinterpret_cast<float *>(r + WY_U);
#pragma unroll
            for (int n = 0; n < UNT; n++)
#pragma unroll
                for (int hh = 0; hh < 2; hh++)
                    *reinterpret_cast<float2 *>(Ug + (size_t)(rt + g + 8 * hh) * DV + cg * UC + 8 * n + 2 * t) =
                        make_float2(u[n][2 * hh], u[n][2 * hh + 1]);
            for (int x = tid; x < C * (DK / 8); x += NT)
                *reinterpret_cast<uint4 *>(r + (size_t)x * 16) =
                    *reinterpret_cast<const uint4 *>(Ws + (x / (DK / 8)) * LK + (x % (DK / 8)) * 8);
            for (int x = tid; x < C * (C / 8); x += NT)
                *reinterpret_cast<uint4 *>(r + WY_P + (size_t)x * 16) =
                    *reinterpret_cast<const uint4 *>(Pb + (x / (C / 8)) * LT + (x % (C / 8)) * 8);
            for (int x = tid; x < C; x += NT) reinterpret_cast<float *>(r + WY_G)[x] = gam[x];
            return;
        }
        } /* MODE != 2 */
        /* KBs := K' = k̂ e^{γ_L − γ} (KBs is free now); padded rows have k̂ = 0 */
        const float gL = gamc[C - 1];
        for (int x = tid; x < C * DK; x += NT) {
            const int i = x / DK, d = x % DK;
            KBs[i * LK + d] = gc_cvt(gc_f(Ks[i * LK + d]) * __expf(gL - gamc[i]));
        }
        /* (f) V' = U + (−W) S  -> VBs (vβ is no longer read); padding rows: 0 */
#pragma unroll
        for (int ks = 0; ks < DK / 16; ks++) {
            if (!live) break;
            uint32_t a[4];
            gc_lda(a, Wsc, LK, rt, 16 * ks);
#pragma unroll
            for (int n = 0; n < UNT; n++) {
                uint32_t b0, b1;
                gc_ldb_kn(b0, b1, Sb, LV, 16 * ks, cg * UC + 8 * n);
                gc_mma(u[n], a, b0, b1);
            }
        }
#pragma unroll
        for (int n = 0; n < UNT; n++) gc_stc(VBs, LV, rt, cg * UC + 8 * n, u[n], 1.f);
        __syncthreads();
        /* (g) O = e^γ ⊙ (Q S) + P V' -> out (rows < L) */
        if (live) {
            float o[UNT][4];
#pragma unroll
            for (int n = 0; n < UNT; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
#pragma unroll
            for (int ks = 0; ks < DK / 16; ks++) {
                uint32_t a[4];
                gc_lda(a, Qs, LK, rt, 16 * ks);
#pragma unroll
                for (int n = 0; n < UNT; n++) {
                    uint32_t b0, b1;
                    gc_ldb_kn(b0, b1, Sb, LV, 16 * ks, cg * UC + 8 * n);
                    gc_mma(o[n], a, b0, b1);
                }
            }
            const float eA = __expf(gamc[rt + g]), eB = __expf(gamc[rt + g + 8]);
#pragma unroll
            for (int n = 0; n < UNT; n++) {
                o[n][0] *= eA; o[n][1] *= eA;
                o[n][2] *= eB; o[n][3] *= eB;
            }
            for (int ks = 0; ks < NT16; ks++) { /* P[i][m] = 0 for m > i */
                uint32_t a[4];
                gc_lda(a, Pbc, LT, rt, 16 * ks);
#pragma unroll
                for (int n = 0; n < UNT; n++) {
                    uint32_t b0, b1;
                    gc_ldb_kn(b0, b1, VBs, LV, 16 * ks, cg * UC + 8 * n);
                    gc_mma(o[n], a, b0, b1);
                }
            }
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int i = rt + g + 8 * hh;
                if (i >= L) continue;
                bf16 *orow = out + ((size_t)(row0 + c0 + i) * nv + j) * DV + vc0 + cg * UC + 2 * t;
#pragma unroll
                for (int n = 0; n < UNT; n++)
                    *reinterpret_cast<uint32_t *>(orow + 8 * n) = gc_pack_out(o[n][2 * hh], o[n][2 * hh + 1]);
            }
        }
        /* (h) S ← e^{γ_L} S + K'ᵀ V'  (A = K'ᵀ [DK × 64] through ldmatrix.trans, B = V' [64 × DVB]) */
        {
            const float eL = __expf(gL);
#pragma unroll
            for (int n = 0; n < SNT; n++) {
                S[n][0] *= eL; S[n][1] *= eL; S[n][2] *= eL; S[n][3] *= eL;
            }
            for (int ks = 0; ks < NT16; ks++) { /* K' rows past L are zero */
                uint32_t a[4];
                gc_lda_t(a, KBs, LK, 16 * ks, sr);
#pragma unroll
                for (int n = 0; n < SNT; n++) {
                    uint32_t b0, b1;
                    gc_ldb_kn(b0, b1, VBs, LV, 16 * ks, sc0 + 8 * n);
                    gc_mma(S[n], a, b0, b1);
                }
            }
        }
        __syncthreads(); /* Sb, Qs, Ks, KBs, VBs, Pb are all rewritten next */
#pragma unroll
        for (int n = 0; n < SNT; n++) gc_stc(Sb, LV, sr, sc0 + 8 * n, S[n], 1.f);
    }
    gc_cp_wait<0>();
#pragma unroll
    for (int n = 0; n < SNT; n++) {
        gc_st2(Sg + (size_t)(sr + g) * DV + sc0 + 8 * n + 2 * t, S[n][0], S[n][1]);
        gc_st2(Sg + (size_t)(sr + g + 8) * DV + sc0 + 8 * n + 2 * t, S[n][2], S[n][3]);
    }
}

/* ---- host side --------------------------------------------------------------------- */

static int gc_base_supported(const dev_info *d, const gdn_shape *s, char *why, size_t n) {
    if (d->kind != DEV_CUDA) {
        snprintf(why, n, "needs a CUDA device");
        return 0;
    }
    if (s->dt != ACT_BF16) {
        snprintf(why, n, "activations must be BF16");
        return 0;
    }
    if (s->conv_k < 1 || s->conv_k > GC_MAX_K || s->nk <= 0 || s->nv % s->nk) {
        snprintf(why, n, "needs conv <= %d and nv %% nk == 0 (conv=%d %d/%d)", GC_MAX_K, s->conv_k, s->nv, s->nk);
        return 0;
    }
    return 1;
}

static int tok_supported(const dev_info *d, const gdn_shape *s, char *why, size_t n) {
    if (!gc_base_supported(d, s, why, n)) return 0;
    if (s->state_bf16) { /* it updates S in global memory token by token */
        snprintf(why, n, "keeps the GDN state in fp32 (--mamba-ssm-dtype float32)");
        return 0;
    }
    if (s->dk < 1 || s->dk > 4096 || s->dv < 32 || s->dv > 1024 || s->dv % 32) {
        snprintf(why, n, "needs dv a multiple of 32 up to 1024 and dk up to 4096 (dk=%d dv=%d)", s->dk, s->dv);
        return 0;
    }
    return 1;
}

/* Largest dynamic shared memory a block may opt in to, by compute capability. */
static size_t gc_smem_limit(const dev_info *d) {
    if (d->cc_major == 9 || d->cc_major == 10) return 227 * 1024;
    if (d->cc_major == 8 && d->cc_minor == 0) return 163 * 1024;
    if (d->cc_major == 0) return 227 * 1024; /* unknown (run-time check): the launch reports it */
    return 99 * 1024;
}

static size_t gc_chunk_smem(int dk, int dv) {
#define GC_SZ(A, B) \
    if (dk == A && dv == B) return gc_layout<A, B>::bytes;
    GC_SZ(32, 32) GC_SZ(32, 64) GC_SZ(32, 128) GC_SZ(64, 32) GC_SZ(64, 64) GC_SZ(64, 128)
    GC_SZ(128, 32) GC_SZ(128, 64) GC_SZ(128, 128)
#undef GC_SZ
    return 0;
}

static int chunk_supported(const dev_info *d, const gdn_shape *s, char *why, size_t n) {
    if (!gc_base_supported(d, s, why, n)) return 0;
    if (s->state_bf16 && (s->dk != 128 || s->dv != 128)) { /* the instances built for it: Qwen3.5's, Qwen3-Next's */
        snprintf(why, n, "takes a BF16 GDN state at dk = dv = 128 only (dk=%d dv=%d)", s->dk, s->dv);
        return 0;
    }
    if (d->cc_major && d->cc_major < 8) {
        snprintf(why, n, "needs BF16 mma.sync (compute capability 8.0+, this is %d.%d)", d->cc_major, d->cc_minor);
        return 0;
    }
    size_t sm = gc_chunk_smem(s->dk, s->dv);
    if (!sm) {
        snprintf(why, n, "needs dk and dv in 32/64/128 (dk=%d dv=%d)", s->dk, s->dv);
        return 0;
    }
    if (sm > gc_smem_limit(d)) {
        snprintf(why, n, "needs %zu KB of shared memory per block, more than this GPU gives", sm / 1024);
        return 0;
    }
    return 1;
}

/* LASTSTAND_GDN_PREP (read once): 1 (default) cuda_chunked's preparation by gc_prep8_kernel where it
 * applies (conv_k 4, qkv 8-byte aligned), 0 always by gc_prep_kernel; the same bits. */
static int gc_prep_form(void) {
    static int v = -1;
    if (v < 0) v = cu_env_switch("LASTSTAND_GDN_PREP", 1);
    return v;
}

/* Validation of the host copy, workspace, and the preparation kernels: fp32 conv outputs *cw
 * [n_tok, D] (x16 == NULL: cuda_per_token) or the chunk kernel's operands *x16 [n_tok, D] gc_op,
 * then (g, β) *gbw [n_tok, nv, 2]. *form (x16 only; NULL: 0): 1 gc_prep8_kernel where it applies,
 * 0 gc_prep_kernel; set to the form that ran. poison: the
 * workspace filled with 0xff bytes first (the test hook: rows a kernel
 * failed to write cannot keep an earlier call's values). Leaves ws locked on success. */
static int gc_prepare(const gdn_args *a, cudaStream_t st, const char *name, gc_ws **wso, float **cw, gc_op **x16,
                      float **gbw, int *form, int poison, ls_err *e) {
    const gdn_w *w = a->w;
    const int D = 2 * w->nk * w->dk + w->nv * w->dv;
    if (!a->seqs_host) return errf(e, ERR_INVAL, "gdn %s: seqs_host (the host copy of the sequences) is not set", name);
    for (int i = 0; i < a->n_seq; i++) {
        const gdn_seq *q = &a->seqs_host[i];
        if (q->slot < 0 || q->slot >= a->st->n_slots || q->n_new < 0 || q->row0 < 0 || q->row0 + q->n_new > a->n_tok)
            return errf(e, ERR_INVAL, "gdn: sequence %d (slot %d, rows %d+%d) outside the batch", i, q->slot, q->row0,
                        q->n_new);
    }
    gc_ws *ws;
    int rc = gc_lock(&ws, e);
    if (rc) return rc;
    const size_t xb = (x16 ? sizeof(gc_op) : sizeof(float)) * (size_t)a->n_tok * D; /* a multiple of 16 */
    size_t bytes = xb + sizeof(float) * (size_t)a->n_tok * w->nv * 2;
    char *buf = (char *)cu_ws_get(&ws->ws, 0, bytes, 0, st, "gdn", e);
    if (!buf) {
        cu_ws_unlock(&ws->ws);
        return e->code ? e->code : ERR_NOMEM;
    }
    if (x16)
        *x16 = (gc_op *)buf;
    else
        *cw = (float *)buf;
    *gbw = (float *)(buf + xb);
    /* token chunks per sequence: enough blocks for the longest one (the kernel strides over the rest) */
    int max_t = 0;
    for (int i = 0; i < a->n_seq; i++)
        if (a->seqs_host[i].n_new > max_t) max_t = a->seqs_host[i].n_new;
    int nz = (max_t + GC_CONV_T - 1) / GC_CONV_T;
    if (nz < 1) nz = 1;
    if (nz > GC_CONV_MAXZ) nz = GC_CONV_MAXZ;
    const int wide = D > w->nv ? D : w->nv;
    dim3 g1((wide + 127) / 128, a->n_seq, nz), g1b((D + 127) / 128, a->n_seq);
    const int32_t *meta = (const int32_t *)a->seqs;
    if (poison) {
        const cudaError_t c = cudaMemsetAsync(buf, 0xff, bytes, st);
        if (c != cudaSuccess) {
            cu_ws_unlock(&ws->ws);
            return cu_fail(e, c, name);
        }
    }
    const int f8 = x16 && form && *form == 1 && w->conv_k == GC_P8_K &&
                   !((uintptr_t)a->qkv & (2 * GC_P8_CPT - 1)) && w->dv % 8 == 0 &&
                   (w->dk == 32 || w->dk == 64 || w->dk == 128);
    if (form) *form = f8;
    if (f8) {
        const int cpt = GC_P8_CPT;
        /* tokens along z: each block a range of L = GC_P8_G·per tokens, as many blocks as fill every
         * SM's resident slots once (more would only re-read their windows) */
        if (!ws->p8_bps) {
            int n = 0;
            if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, gc_prep8_kernel<GC_P8_K, GC_P8_CPT>, GC_P8_NT, 0) !=
                    cudaSuccess || n <= 0) {
                (void)cudaGetLastError(); /* not sticky: the launch below reports a real fault */
                n = 4;
            }
            ws->p8_bps = n;
        }
        const int gx = (D / cpt + GC_P8_NT - 1) / GC_P8_NT, groups = (max_t + GC_P8_G - 1) / GC_P8_G;
        long zfit = (long)ws->n_sm * ws->p8_bps / ((long)gx * a->n_seq); /* z blocks in one wave */
        if (zfit < 1) zfit = 1;
        long per = (groups + zfit - 1) / zfit; /* groups per block */
        if (per < 1) per = 1;
        if ((groups + per - 1) / per > 65535) per = (groups + 65534) / 65535;
        const int L = (int)per * GC_P8_G, nz8 = (int)((groups + per - 1) / per);
        dim3 gp(gx, a->n_seq, nz8 > 0 ? nz8 : 1);
        gc_prep8_kernel<GC_P8_K, GC_P8_CPT><<<gp, GC_P8_NT, 0, st>>>(
            D, w->nk, w->nv, w->dk, w->dv, L, meta, (const bf16 *)a->qkv, (const bf16 *)a->a, (const bf16 *)a->b,
            w->conv_w, w->A_log, w->dt_bias, a->st->conv, *x16, *gbw);
        nz = (int)gp.z; /* the state kernel below runs when more than one block walks a sequence's tokens */
    } else if (x16) {
        dim3 gp((D + 127) / 128, a->n_seq, nz);
        if (w->conv_k == 4)
            gc_prep_kernel<4><<<gp, 128, 0, st>>>(D, 4, w->nk, w->nv, w->dk, w->dv, meta, (const bf16 *)a->qkv,
                                                  (const bf16 *)a->a, (const bf16 *)a->b, w->conv_w, w->A_log,
                                                  w->dt_bias, a->st->conv, *x16, *gbw);
        else
            gc_prep_kernel<0><<<gp, 128, 0, st>>>(D, w->conv_k, w->nk, w->nv, w->dk, w->dv, meta,
                                                  (const bf16 *)a->qkv, (const bf16 *)a->a, (const bf16 *)a->b,
                                                  w->conv_w, w->A_log, w->dt_bias, a->st->conv, *x16, *gbw);
    } else if (w->conv_k == 4)
        gc_conv_kernel<4><<<g1, 128, 0, st>>>(D, 4, w->nv, meta, (const bf16 *)a->qkv, (const bf16 *)a->a,
                                              (const bf16 *)a->b, w->conv_w, w->A_log, w->dt_bias, a->st->conv, *cw,
                                              *gbw);
    else
        gc_conv_kernel<0><<<g1, 128, 0, st>>>(D, w->conv_k, w->nv, meta, (const bf16 *)a->qkv, (const bf16 *)a->a,
                                              (const bf16 *)a->b, w->conv_w, w->A_log, w->dt_bias, a->st->conv, *cw,
                                              *gbw);
    if (w->conv_k > 1 && nz > 1) /* with one token chunk (decode) the conv kernels roll the state */
        gc_conv_state_kernel<<<g1b, 128, 0, st>>>(D, w->conv_k, meta, (const bf16 *)a->qkv, a->st->conv);
    cudaError_t c = cudaGetLastError();
    if (c != cudaSuccess) {
        cu_ws_unlock(&ws->ws);
        return cu_fail(e, c, name);
    }
    *wso = ws;
    return 0;
}

static int tok_run(const gdn_args *a, ls_stream s, ls_err *e) {
    const gdn_w *w = a->w;
    gdn_shape sh;
    dev_info d0;
    const int rc0 = cu_gdn_begin(a, tok_supported, "cuda_per_token", &sh, &d0, e);
    if (rc0) return rc0 < 0 ? rc0 : 0;
    cudaStream_t st = (cudaStream_t)s;
    gc_ws *ws;
    float *cw, *gbw;
    int rc = gc_prepare(a, st, "gdn cuda_per_token", &ws, &cw, NULL, &gbw, NULL, 0, e);
    if (rc) return rc;
    const int D = 2 * w->nk * w->dk + w->nv * w->dv;
    dim3 g2(w->nv, a->n_seq);
    gc_token_kernel<<<g2, w->dv, sizeof(float) * 2 * w->dk, st>>>(w->nk, w->nv, w->dk, w->dv, D,
                                                                  (const int32_t *)a->seqs, cw, gbw, a->st->rec,
                                                                  (bf16 *)a->out);
    cudaError_t c = cudaGetLastError();
    if (c != cudaSuccess) rc = cu_fail(e, c, "gdn cuda_per_token");
    cu_ws_unlock(&ws->ws);
    return rc;
}

/* One launch of gc_chunk_kernel<DK, DV, NVS, NW, MODE> (bit: its shared-memory opt-in flag in
 * ws->smem_ok): MODE 0 and 2 over grid (nv, n_seq, NVS), MODE 1 over (nv, n_chunks) */
template <int DK, int DV, int NVS, int MODE, class ST = float>
static int gc_chunk_launch(const gdn_args *a, gc_ws *ws, int bit, const gc_op *x16, const float *gbw,
                           unsigned char *wy, int n_chunks, cudaStream_t st, ls_err *e) {
    ST *const rec = sizeof(ST) == 2 ? (ST *)(void *)a->st->rec16 : (ST *)(void *)a->st->rec; /* the state as stored */
    const gdn_w *w = a->w;
    const size_t smem = gc_layout<DK, DV / NVS>::bytes;
    constexpr int NW = DK == 128 ? 16 : 8; /* warps: see gc_chunk_kernel */
    if (!(ws->smem_ok & (1 << bit))) {
        CU_TRY(e,
               cudaFuncSetAttribute(gc_chunk_kernel<DK, DV, NVS, NW, MODE, ST>,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
               "gdn cuda_chunked: shared memory opt-in");
        ws->smem_ok |= 1 << bit;
    }
    const int D = 2 * w->nk * DK + w->nv * DV;
    dim3 g2(w->nv, MODE == 1 ? n_chunks : a->n_seq, MODE == 1 ? 1 : NVS);
    gc_chunk_kernel<DK, DV, NVS, NW, MODE, ST><<<g2, NW * 32, smem, st>>>(w->nk, w->nv, D, (const int32_t *)a->seqs,
                                                                         x16, gbw, rec, (bf16 *)a->out, a->n_seq, wy);
    CU_LAUNCHED(e, "gdn cuda_chunked");
    return 0;
}

/* LASTSTAND_GDN_WY=1: at dk = dv = 128, calls with a sequence of more than one 64-token chunk
 * take the chunk-parallel form: MODE 1 computes every chunk's WY record (γ, A, T = (I + A)⁻¹,
 * U = T(βV), −W, P: everything that does not depend on the state) in a block per (chunk, v head)
 * at once, into the workspace; MODE 2 then walks each sequence's chunks with the state as MODE 0
 * does, left with V' = U − W S, O = e^γ(Q S) + P V' and S ← e^{γ_L} S + K'ᵀ V' per chunk (the
 * serial path of a long prompt: R1 measured MODE 0 at 12.4 µs a chunk, 32 chunks of a
 * 2048-token step in series). The same products in the same order: outputs and states equal
 * MODE 0's up to the record's storage (U fp32, −W and P in the operand type as MODE 0 keeps
 * them in shared memory). On by default since S9 round R2 (doctor fp64 ✅ at the 35B and 397B
 * shapes, a 3000-token prompt's greedy ids equal; 8k-token TTFT 249.0 -> 228.9 ms); taken when the
 * longest sequence has more than GC_WY_MIN tokens: R2's doctor batches of <= 512-token sequences
 * (M = 3072) ran 476 µs serial, 531 µs in this form. LASTSTAND_GDN_WY=0: always serial; 1: for
 * every sequence of more than one chunk (as R2 validated it; the tests force it so). */
enum { GC_WY_MIN = 512 };
static int gc_wy_mode(void) { /* 0 off, 1 forced (any sequence of more than one chunk), 2 auto */
    static int v = -1;
    if (v < 0) v = cu_env_switch("LASTSTAND_GDN_WY", 2);
    return v;
}

/* cuda_chunked with the preparation form (gc_prep_form) given. */
static int chunk_run_with(const gdn_args *a, ls_stream s, int form, ls_err *e) {
    const gdn_w *w = a->w;
    gdn_shape sh;
    dev_info d0;
    const int rc0 = cu_gdn_begin(a, chunk_supported, "cuda_chunked", &sh, &d0, e);
    if (rc0) return rc0 < 0 ? rc0 : 0;
    cudaStream_t st = (cudaStream_t)s;
    gc_ws *ws;
    float *gbw;
    gc_op *x16;
    int rc = gc_prepare(a, st, "gdn cuda_chunked", &ws, NULL, &x16, &gbw, &form, 0, e);
    if (rc) return rc;
    /* value-column split (dk = dv = 128 only): double it while the blocks of the sequences with new
     * tokens, nv per sequence, leave more than half the SMs idle */
    int busy = 0, nvs = 1, n_chunks = 0, longest = 0;
    for (int i = 0; i < a->n_seq; i++) {
        const int n = a->seqs_host[i].n_new;
        busy += n > 0;
        n_chunks += (n + GC_CHUNK - 1) / GC_CHUNK;
        if (n > longest) longest = n;
    }
    if (w->dk == 128 && w->dv == 128)
        while (nvs < 4 && (long)busy * w->nv * nvs * 2 <= ws->n_sm) nvs *= 2;
    const int wy = gc_wy_mode();
    if (w->dk == 128 && w->dv == 128 && n_chunks <= 65535 && wy && longest > (wy == 1 ? (int)GC_CHUNK : (int)GC_WY_MIN)) {
        /* the WY record: −W [64][128] + P [64][64] in gc_op, U [64][128] + γ [64] in fp32 */
        const size_t rb = (size_t)GC_CHUNK * 128 * sizeof(gc_op) + (size_t)GC_CHUNK * GC_CHUNK * sizeof(gc_op) +
                          (size_t)GC_CHUNK * 128 * 4 + (size_t)GC_CHUNK * 4;
        unsigned char *wy = (unsigned char *)cu_ws_get(&ws->ws, 1, rb * n_chunks * w->nv, 0, st, "gdn", e);
        if (!wy) {
            cu_ws_unlock(&ws->ws);
            return e->code ? e->code : ERR_NOMEM;
        }
        rc = gc_chunk_launch<128, 128, 1, 1>(a, ws, 11, x16, gbw, wy, n_chunks, st, e); /* no state: either */
        if (!rc && a->st->rec16) /* a BF16 state (chunk_supported: dk = dv = 128) */
            rc = nvs == 4   ? gc_chunk_launch<128, 128, 4, 2, bf16>(a, ws, 18, x16, gbw, wy, n_chunks, st, e)
                 : nvs == 2 ? gc_chunk_launch<128, 128, 2, 2, bf16>(a, ws, 19, x16, gbw, wy, n_chunks, st, e)
                            : gc_chunk_launch<128, 128, 1, 2, bf16>(a, ws, 20, x16, gbw, wy, n_chunks, st, e);
        else if (!rc)
            rc = nvs == 4   ? gc_chunk_launch<128, 128, 4, 2>(a, ws, 12, x16, gbw, wy, n_chunks, st, e)
                 : nvs == 2 ? gc_chunk_launch<128, 128, 2, 2>(a, ws, 13, x16, gbw, wy, n_chunks, st, e)
                            : gc_chunk_launch<128, 128, 1, 2>(a, ws, 14, x16, gbw, wy, n_chunks, st, e);
        cu_ws_unlock(&ws->ws);
        return rc;
    }
#define GC_CASE(A, B, BIT) \
    if (w->dk == A && w->dv == B) rc = gc_chunk_launch<A, B, 1, 0>(a, ws, BIT, x16, gbw, NULL, 0, st, e); else
    if (a->st->rec16) rc = w->dk != 128 || w->dv != 128
                         ? errf(e, ERR_UNSUPPORTED, "gdn cuda_chunked: a BF16 state at dk %d dv %d", w->dk, w->dv)
                         : nvs == 4 ? gc_chunk_launch<128, 128, 4, 0, bf16>(a, ws, 15, x16, gbw, NULL, 0, st, e)
                         : nvs == 2 ? gc_chunk_launch<128, 128, 2, 0, bf16>(a, ws, 16, x16, gbw, NULL, 0, st, e)
                                    : gc_chunk_launch<128, 128, 1, 0, bf16>(a, ws, 17, x16, gbw, NULL, 0, st, e); else
    if (w->dk == 128 && w->dv == 128 && nvs == 4) rc = gc_chunk_launch<128, 128, 4, 0>(a, ws, 10, x16, gbw, NULL, 0, st, e); else
    if (w->dk == 128 && w->dv == 128 && nvs == 2) rc = gc_chunk_launch<128, 128, 2, 0>(a, ws, 9, x16, gbw, NULL, 0, st, e); else
    GC_CASE(32, 32, 0) GC_CASE(32, 64, 1) GC_CASE(32, 128, 2) GC_CASE(64, 32, 3) GC_CASE(64, 64, 4)
    GC_CASE(64, 128, 5) GC_CASE(128, 32, 6) GC_CASE(128, 64, 7) GC_CASE(128, 128, 8)
    rc = errf(e, ERR_UNSUPPORTED, "gdn cuda_chunked: dk %d dv %d", w->dk, w->dv);
#undef GC_CASE
    cu_ws_unlock(&ws->ws);
    return rc;
}

static int chunk_run(const gdn_args *a, ls_stream s, ls_err *e) {
    return chunk_run_with(a, s, gc_prep_form(), e);
}

/* The test hook (gdn_prep_hook.h): the whole cuda_chunked call with the preparation form given. */
extern "C" int lsc_gdn_chunked_run(const gdn_args *a, int form, ls_stream s, ls_err *e) {
    return chunk_run_with(a, s, form, e);
}

/* The test hook (gdn_prep_hook.h): cuda_chunked's preparation alone, by form (1 gc_prep8_kernel, 0
 * gc_prep_kernel; set to the one that ran) on a poisoned workspace; its outputs copied to x16 [n_tok, conv_dim] (FP16) and
 * gb [n_tok, nv, 2] (fp32) in device memory; the conv state rolled in place as a real call does. */
extern "C" int lsc_gdn_chunked_prep(const gdn_args *a, int *form, void *x16, void *gb, ls_stream s, ls_err *e) {
    const gdn_w *w = a->w;
    gdn_shape sh;
    dev_info d0;
    const int rc0 = cu_gdn_begin(a, chunk_supported, "cuda_chunked (prep)", &sh, &d0, e);
    if (rc0) return rc0 < 0 ? rc0 : 0;
    cudaStream_t st = (cudaStream_t)s;
    gc_ws *ws;
    float *gbw;
    gc_op *xw;
    int rc = gc_prepare(a, st, "gdn cuda_chunked (prep)", &ws, NULL, &xw, &gbw, form, 1, e);
    if (rc) return rc;
    const size_t D = 2 * (size_t)w->nk * w->dk + (size_t)w->nv * w->dv;
    cudaError_t c = cudaMemcpyAsync(x16, xw, sizeof(gc_op) * a->n_tok * D, cudaMemcpyDeviceToDevice, st);
    if (c == cudaSuccess)
        c = cudaMemcpyAsync(gb, gbw, sizeof(float) * 2 * a->n_tok * w->nv, cudaMemcpyDeviceToDevice, st);
    if (c == cudaSuccess) c = cudaStreamSynchronize(st); /* the workspace is free again once unlocked */
    cu_ws_unlock(&ws->ws);
    return c == cudaSuccess ? 0 : cu_fail(e, c, "gdn cuda_chunked (prep)");
}

/* graph_safe: stream-ordered launches only; the workspace grows on the (eager or rehearsal) call at
 * the step's largest shape, the shared-memory opt-in happens on the first call */
const gdn_impl gdn_cuda_chunked = {"cuda_chunked", DEV_CUDA, 0, chunk_supported, chunk_run, 1};
const gdn_impl gdn_cuda_per_token = {"cuda_per_token", DEV_CUDA, 0, tok_supported, tok_run, 1};
