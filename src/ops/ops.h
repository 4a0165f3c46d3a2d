/* ops.h: the op families, their backends and the registries.
 *
 * An op family is a C interface (shape struct, argument struct) plus a
 * registry of implementations, ggml style: a table of function pointers per
 * backend, `name`, `supported(dev, shape, why, n)` and `run(args, stream, err)`.
 * Families (DESIGN.md section 4):
 *   gemm      y = x·Wᵀ with a BF16/F16/F32 weight, or FP8 (E4M3 codes, fp32 scales)
 *   fp4_gemm  y = x·Wᵀ with an NVFP4 (ModelOpt) weight
 *   moe       router softmax -> top-k -> renormalise, routed SiLU-gated
 *             experts, shared expert with its sigmoid gate, weighted combine
 *   attention paged GQA over the KV pool, prefill and decode rows mixed,
 *             causal, optional output gate
 *   gdn       causal conv1d + SiLU with conv state, L2 norm, g/beta, gated
 *             delta rule with recurrent state (decode and multi-token prefill)
 *   small     RMSNorm flavours, gated RMSNorm, NeoX RoPE (partial or full),
 *             embedding, SiLU-mul, residual add, KV-page writes
 *
 * Every family's registry ends with its CPU reference ("cpu_ref": plain
 * fp32/fp64 code that reads like reference/qwen35-and-nvfp4.md); other
 * backends (fast CPU, CUDA) register in front of it. Registration order is
 * preference order: "auto" takes the first backend of the device that is not
 * marked test_only. test_only backends (the deliberately broken ones, and
 * alternatives kept for cross-checking that are slower on their device, such
 * as gdn "cpu_chunked") are still validated and timed by the doctor and can
 * be named explicitly. Backends are stateless; all memory comes in the args.
 *
 * Pointers in args live in the memory of the device the backend runs on:
 * on CUDA that includes the attn_seq / gdn_seq arrays (and their page
 * tables), token ids and positions (the model uploads them once per step);
 * the weight structs (lin_w, moe_w, gdn_w, kv_layer, gdn_state) are host
 * structs whose data pointers are device memory. Host-side counts (n_seq,
 * n_tok, M) come in the args. attn_args and gdn_args also carry seqs_host:
 * the same sequences in host memory, with host page tables, always filled
 * by callers (on the CPU it equals seqs). Device-side kernels read `seqs`;
 * host-side planning (split-K partitions, metadata tables, validation) reads
 * `seqs_host`; nothing dereferences `seqs` on the host.
 * Activations have dtype `dt` (ACT_F32 on the CPU; ACT_BF16 on CUDA). Weights
 * are lin_w views. 1-D parameters (norm weights, A_log, dt_bias, conv1d) are
 * fp32. Shapes are written [rows, cols] in comments, row-major.
 *
 * The env var LASTSTAND_TEST_BROKEN_BACKENDS=1 registers two deliberately
 * broken moe backends (cpu_broken_nan, cpu_broken_abort) for testing the
 * doctor; they are test_only, so "auto" never picks them.
 */
#ifndef LS_OPS_H
#define LS_OPS_H

#include "base/base.h"

/* ---- devices, dtypes, weights -------------------------------------------- */

typedef enum dev_kind { DEV_CPU = 0, DEV_CUDA = 1 } dev_kind;

typedef struct dev_info {
    dev_kind kind;
    int ordinal;            /* CUDA device index */
    char name[128];         /* "cpu", "NVIDIA H200" */
    int cc_major, cc_minor; /* CUDA compute capability */
    int n_sm;
    size_t mem_bytes;
    int n_threads;          /* CPU worker threads */
} dev_info;

typedef void *ls_stream;    /* cudaStream_t on CUDA, NULL on the CPU */

typedef enum act_dtype { ACT_F32 = 0, ACT_BF16 = 1 } act_dtype;
size_t act_size(act_dtype dt);
const char *act_name(act_dtype dt);

typedef enum w_kind { W_F32 = 0, W_BF16, W_F16, W_NVFP4, W_FP8 } w_kind;
const char *w_kind_name(w_kind k);

/* A linear layer's weight, logical shape [N, K]; y = x·Wᵀ. Non-owning. */
typedef struct lin_w {
    w_kind kind;
    int N, K;
    const void *data;     /* W_F32/W_BF16/W_F16: [N, K];
                             W_NVFP4: uint8 [N, K/2], element 2i in the low nibble */
    const uint8_t *scale; /* W_NVFP4: F8_E4M3 [N, K/16] per-16-element block scales */
    float scale2;         /* W_NVFP4: per-tensor global scale (weight_scale_2) */
    const char *name;     /* checkpoint prefix, for messages; may be NULL */
    /* W_FP8: data = F8_E4M3 [N, K] (row stride K, no NaN codes), and fp32 scales covering
     * blocks of fs_br rows x fs_bc columns of the checkpoint's whole tensor:
     *   W[n, k] = e4m3(data[n, k]) · fscale[((n + fs_r0) / fs_br) · fs_cols + (k + fs_c0) / fs_bc]
     * per tensor: fs_br, fs_bc = the tensor's rows, columns (fs_cols 1); per row: 1, columns;
     * Hugging Face's fine-grained FP8: the weight_block_size (128, 128). fs_r0 / fs_c0: where
     * this view starts in that tensor (a tensor-parallel slice; 0 for a whole tensor); fs_n:
     * the floats in fscale (the whole tensor's scales, a slice shares them). */
    const float *fscale;
    int fs_br, fs_bc, fs_cols, fs_r0, fs_c0;
    size_t fs_n;
} lin_w;

/* The scale of W_FP8 element (n, k). */
static inline float lin_fp8_scale(const lin_w *w, int n, int k) {
    return w->fscale[(size_t)((n + w->fs_r0) / w->fs_br) * (size_t)w->fs_cols + (size_t)((k + w->fs_c0) / w->fs_bc)];
}

/* fp8 e4m3 code -> fp32, a 256-entry table (built once). */
const float *ops_fp8_e4m3_table(void);

/* Row n of W as fp32 (dequantised for NVFP4 and FP8): out [K]. */
void lin_row_f32(const lin_w *w, int n, float *out);
/* Bytes of W's data (+ scales). */
size_t lin_bytes(const lin_w *w);

/* ---- gemm / fp4_gemm ----------------------------------------------------- */

typedef struct gemm_shape {
    int M, N, K;
    w_kind wk;
    act_dtype dt;
} gemm_shape;

typedef struct gemm_args {
    int M;
    const void *x;     /* [M, K] */
    const lin_w *w;    /* [N, K] */
    void *y;           /* [M, N]; must not alias x */
    int accumulate;    /* 0: y = x·Wᵀ   1: y += x·Wᵀ */
    act_dtype dt;
} gemm_args;

typedef struct gemm_impl {
    const char *name;
    dev_kind dev;
    int test_only;     /* never chosen by "auto"; the doctor still validates and times it */
    int (*supported)(const dev_info *d, const gemm_shape *s, char *why, size_t n);
    int (*run)(const gemm_args *a, ls_stream s, ls_err *e);
    int graph_safe;    /* (additive) run() may be captured into a CUDA graph: only stream-ordered
                          device work, no host reads of device data, no synchronisation, no
                          allocation once warmed up at the step's largest shape; 0 on the CPU */
    /* (additive) optional: n products of one x in as few launches as it can (same M, x, K and
     * accumulate; each a[i] has its own weight and y), the same results as n run() calls up
     * to fp32 summation order; NULL: ops_linear_multi calls run() per weight */
    int (*run_multi)(int n, const gemm_args *a, ls_stream s, ls_err *e);
} gemm_impl;

/* fp4_gemm shares gemm's argument types; its registry is separate. */
typedef gemm_shape fp4_gemm_shape;
typedef gemm_args fp4_gemm_args;
typedef gemm_impl fp4_gemm_impl;

/* ---- moe ----------------------------------------------------------------- */

/* One sparse-MoE block's weights (a layer's `mlp`). */
typedef struct moe_w {
    int hidden;          /* H */
    int n_experts;       /* E */
    int top_k;
    int inter;           /* I, per routed expert */
    int norm_topk;       /* renormalise the top-k weights to sum 1 */
    lin_w router;        /* mlp.gate [E, H] */
    const lin_w *gate;   /* [E] experts' gate_proj, each [I, H] */
    const lin_w *up;     /* [E] experts' up_proj,   each [I, H] */
    const lin_w *down;   /* [E] experts' down_proj, each [H, I] */
    int shared_inter;    /* Is; 0 = no shared expert */
    lin_w sh_gate, sh_up;/* [Is, H] */
    lin_w sh_down;       /* [H, Is] */
    int has_sh_gate;     /* shared_expert_gate present */
    lin_w sh_gate_w;     /* shared_expert_gate [1, H]: out += sigmoid(x·w) · shared */
} moe_w;

typedef struct moe_shape {
    int M, H, E, top_k, I, Is;
    w_kind wk;           /* the experts' weight kind */
    act_dtype dt;
    w_kind sk;           /* (additive) the shared expert's weight kind (NVFP4 checkpoints may
                            keep it BF16); W_F32 = 0, as left by a caller that predates the
                            field, means "same as wk": read it through moe_shared_kind() */
} moe_shape;

static inline w_kind moe_shared_kind(const moe_shape *s) { return s->sk == W_F32 ? s->wk : s->sk; }

typedef struct moe_args {
    int M;
    const void *x;       /* [M, H] */
    void *y;             /* [M, H] out (overwritten); must not alias x */
    const moe_w *w;
    act_dtype dt;
    int32_t *topk_idx;   /* optional out [M, top_k]: chosen experts, by descending weight */
    float *topk_w;       /* optional out [M, top_k]: their combine weights */
} moe_args;

typedef struct moe_impl {
    const char *name;
    dev_kind dev;
    int test_only;
    int (*supported)(const dev_info *d, const moe_shape *s, char *why, size_t n);
    int (*run)(const moe_args *a, ls_stream s, ls_err *e);
    int graph_safe;    /* (additive) capturable into a CUDA graph, as gemm_impl.graph_safe */
} moe_impl;

/* The router's math, shared by every backend's reference check:
 * p = softmax(logits) over E (fp32), take the top_k largest (ties: lower index
 * first), renormalise to sum 1 if norm. logits [E] -> idx [k], w [k]. */
void moe_route(const float *logits, int E, int k, int norm, int32_t *idx, float *w);

/* ---- attention ----------------------------------------------------------- */

/* One layer's slice of the paged KV pool. Position p of a sequence lives in
 * page pages[p / page_size], row p % page_size. */
typedef struct kv_layer {
    void *k;             /* [n_pages, page_size, n_kv_heads, head_dim] */
    void *v;             /* [n_pages, page_size, n_kv_heads, head_dim] */
    int n_pages, page_size;
    act_dtype dt;        /* storage dtype (F32 on the CPU) */
} kv_layer;

typedef struct attn_seq {
    int n_past;          /* tokens already cached */
    int n_new;           /* new tokens at positions [n_past, n_past + n_new) */
    int row0;            /* first row of this sequence in q/gate/out (rows are new tokens) */
    const int32_t *pages;/* pages covering positions [0, n_past + n_new) */
} attn_seq;

typedef struct attn_shape {
    int n_tok, n_seq, max_ctx;
    int n_heads, n_kv_heads, head_dim;
    int gated;
    act_dtype dt;
} attn_shape;

typedef struct attn_args {
    int n_seq;
    const attn_seq *seqs;
    int n_tok;           /* Σ n_new */
    int n_heads, n_kv_heads, head_dim; /* query head h reads kv head h / (n_heads / n_kv_heads) */
    float scale;         /* softmax scale, head_dim^-0.5 */
    const void *q;       /* [n_tok, n_heads, head_dim], already normed and rotated */
    const void *gate;    /* [n_tok, n_heads, head_dim] or NULL: out *= sigmoid(gate) */
    const kv_layer *kv;  /* holds K/V of every position incl. the new ones (small.kv_write) */
    void *out;           /* [n_tok, n_heads, head_dim] */
    act_dtype dt;
    const attn_seq *seqs_host; /* [n_seq] the same sequences as seqs, in host memory with host page
                                  tables (== seqs on the CPU); for host-side planning only */
    /* (additive) Device-side planning, for CUDA graph capture: when ctx_cap > 0 the backend
     * reads only the device `seqs` (seqs_host may be NULL), plans its split from ctx_cap (an
     * upper bound of every n_past + n_new) and the token count, and takes its metadata and
     * partials from scratch (device memory, scratch_bytes >= what the backend's
     * scratch-size function asks for); nothing is allocated or copied from the host. */
    int ctx_cap;
    void *scratch;
    size_t scratch_bytes;
} attn_args;

typedef struct attn_impl {
    const char *name;
    dev_kind dev;
    int test_only;
    int (*supported)(const dev_info *d, const attn_shape *s, char *why, size_t n);
    int (*run)(const attn_args *a, ls_stream s, ls_err *e);
    int graph_safe;    /* (additive) capturable into a CUDA graph, as gemm_impl.graph_safe */
} attn_impl;

/* ---- gdn (Gated DeltaNet) ------------------------------------------------ */

typedef struct gdn_w {
    int nk, nv;          /* key heads, value heads (nv % nk == 0; v head j uses k head j / (nv/nk)) */
    int dk, dv;          /* head dims */
    int conv_k;          /* conv kernel size */
    const float *conv_w; /* [conv_dim, conv_k], conv_dim = 2·nk·dk + nv·dv */
    const float *A_log;  /* [nv] */
    const float *dt_bias;/* [nv] */
} gdn_w;

/* One layer's per-sequence state, in fixed slots. */
typedef struct gdn_state {
    float *conv;         /* [n_slots, conv_dim, conv_k - 1]: the previous inputs, oldest first */
    float *rec;          /* [n_slots, nv, dk, dv]: S of the delta rule (fp32 state), or NULL */
    int n_slots;
    /* (additive) S stored in BF16 (--mamba-ssm-dtype bfloat16, SGLang's option): rec is NULL and
     * rec16 [n_slots, nv, dk, dv] holds it; a call loads each S into fp32, runs all its tokens in
     * fp32 and stores S rounded to nearest even once, at the end of the call (the conv state stays
     * fp32). NULL: fp32 state. A backend without it says so in supported (gdn_shape.state_bf16). */
    uint16_t *rec16;
} gdn_state;

typedef struct gdn_seq {
    int slot;
    int n_new;           /* tokens this step, following the slot's state */
    int row0;            /* first row of this sequence in qkv/a/b/out */
} gdn_seq;

typedef struct gdn_shape {
    int n_tok, n_seq, nk, nv, dk, dv, conv_k;
    act_dtype dt;
    int state_bf16;      /* (additive) gdn_state.rec16: the state in BF16 */
} gdn_shape;

typedef struct gdn_args {
    int n_seq;
    const gdn_seq *seqs;
    int n_tok;
    const gdn_w *w;
    const void *qkv;     /* [n_tok, conv_dim]: x·W_qkvᵀ, channels [q(nk·dk) | k(nk·dk) | v(nv·dv)], pre-conv */
    const void *a;       /* [n_tok, nv]: x·W_aᵀ */
    const void *b;       /* [n_tok, nv]: x·W_bᵀ */
    const gdn_state *st; /* read and updated in place */
    void *out;           /* [n_tok, nv, dv]: o_t = Sᵀ q_t, before the gated norm */
    act_dtype dt;
    const gdn_seq *seqs_host; /* [n_seq] the same sequences as seqs, in host memory (== seqs on the
                                 CPU); for host-side planning only */
    /* (additive, optional) The layer's gated output norm, for a backend that can fuse it:
     * with z, norm_w and norm_done set, a backend MAY write into out, instead of o,
     *   y = (norm_w · rmsnorm(o_j)) · silu(z_j) per token and v head j
     * (small_ops.rmsnorm_gated on the dt-rounded o, eps norm_eps) and then set
     * *norm_done = 1. It leaves *norm_done alone otherwise: the caller sets it to 0 and
     * runs rmsnorm_gated itself when it stays 0. Backends that ignore these fields stay
     * correct. */
    const void *z;        /* [n_tok, nv, dv] */
    const float *norm_w;  /* [dv] */
    float norm_eps;
    int *norm_done;       /* host memory */
} gdn_args;

typedef struct gdn_impl {
    const char *name;
    dev_kind dev;
    int test_only;
    int (*supported)(const dev_info *d, const gdn_shape *s, char *why, size_t n);
    int (*run)(const gdn_args *a, ls_stream s, ls_err *e);
    int graph_safe;    /* (additive) capturable into a CUDA graph, as gemm_impl.graph_safe */
} gdn_impl;

/* ---- small ops ----------------------------------------------------------- */

typedef enum rms_kind {
    RMS_PLAIN = 0,       /* y = w · x̂             (Qwen3, Qwen3-MoE) */
    RMS_ZC = 1,          /* y = (1 + w) · x̂       (Qwen3-Next, Qwen3.5: zero-centred) */
} rms_kind;              /* x̂ = x · rsqrt(mean(x²) + eps), in fp32 */

typedef struct small_ops {
    const char *name;
    dev_kind dev;
    int test_only;
    /* y[r] = norm(x[r]) for rows x cols; w [cols]; y may alias x. */
    int (*rmsnorm)(int rows, int cols, const void *x, const float *w, rms_kind kind, float eps,
                   void *y, act_dtype dt, ls_stream s);
    /* y[r] = (w · x̂[r]) · silu(z[r])  (the GDN output norm); y may alias x. */
    int (*rmsnorm_gated)(int rows, int cols, const void *x, const void *z, const float *w,
                         float eps, void *y, act_dtype dt, ls_stream s);
    /* NeoX rotate-half RoPE on the first rot_dim dims of each head, in place:
     * x [n_tok, n_heads, head_dim], pos [n_tok]; pairs (i, i + rot_dim/2),
     * angle pos · theta^(-2i/rot_dim). */
    int (*rope)(int n_tok, int n_heads, int head_dim, int rot_dim, const int32_t *pos,
                double theta, void *x, act_dtype dt, ls_stream s);
    /* y[i] = table[ids[i]]: table [V, H] (W_F32/W_BF16/W_F16), y [n, H]. */
    int (*embed)(int n, const int32_t *ids, const lin_w *table, void *y, act_dtype dt, ls_stream s);
    /* y = silu(g) · u, all [n]. y may alias g. */
    int (*silu_mul)(int64_t n, const void *g, const void *u, void *y, act_dtype dt, ls_stream s);
    /* y += x, [n]. */
    int (*add)(int64_t n, const void *x, void *y, act_dtype dt, ls_stream s);
    /* Write the new tokens' K and V into the pool: k, v [n_tok, n_kv_heads,
     * head_dim] rows ordered as the seqs' rows. */
    int (*kv_write)(const kv_layer *kv, int n_seq, const attn_seq *seqs, int n_kv_heads,
                    int head_dim, const void *k, const void *v, act_dtype dt, ls_stream s);
    /* y[i] = x[idx[i]] for i < n: x [*, cols], y [n, cols], idx [n] (device memory).
     * Picks the rows that want logits. y must not alias x. */
    int (*gather_rows)(int n, int cols, const int32_t *idx, const void *x, void *y, act_dtype dt,
                       ls_stream s);
    /* (additive) The residual add fused with the RMSNorm that follows it, the
     * residual stream h kept in fp32 whatever the activation dtype:
     *   h[r] = x[r] (init) or h[r] + x[r];  y[r] = norm(h[r]), as rmsnorm.
     * h [rows, cols] fp32 (read and written); x, y [rows, cols] of dtype dt;
     * y may alias x, never h. */
    int (*add_rmsnorm)(int rows, int cols, float *h, const void *x, int init, const float *w,
                       rms_kind kind, float eps, void *y, act_dtype dt, ls_stream s);
    int graph_safe;      /* (additive) every op above is capturable into a CUDA graph */
    /* (additive, after graph_safe, which covers it too) The attention q/k head norm
     * fused with RoPE, in place, rounded to dt once: x [n_tok, n_heads, head_dim]
     * gets rmsnorm per head (w [head_dim]) and then rope (rot_dim, pos [n_tok],
     * theta), the same math as those two ops. */
    int (*qk_norm_rope)(int n_tok, int n_heads, int head_dim, void *x, const float *w, rms_kind kind,
                        float eps, int rot_dim, const int32_t *pos, double theta, act_dtype dt,
                        ls_stream s);
    /* (additive, optional: NULL = call the three ops) An attention layer's step between
     * its projections and the attention op: qk_norm_rope on q [n_tok, n_heads, head_dim]
     * (weights qw) and on k [n_tok, n_kv_heads, head_dim] (kw), then kv_write of the new
     * k and v rows; the same results as those three calls, in as few launches as the
     * device can. */
    int (*qk_norm_rope_kv)(int n_tok, int n_heads, int n_kv_heads, int head_dim, void *q, void *k, const void *v,
                           const float *qw, const float *kw, rms_kind kind, float eps, int rot_dim,
                           const int32_t *pos, double theta, const kv_layer *kv, int n_seq, const attn_seq *seqs,
                           act_dtype dt, ls_stream s);
} small_ops;

/* ---- device memory -------------------------------------------------------- */

/* How the model talks to a device's memory: everything the forward pass
 * needs besides the op families. The CPU's is plain malloc/memcpy; the CUDA
 * module registers its own (ops_dev_mem_register, from its registration
 * hook). Copies are ordered on stream s; d2h returns when the data is on
 * the host. All return 0 or a negative ERR_* with e filled. */
typedef struct dev_mem {
    dev_kind dev;
    /* Pick device `ordinal`, describe it, make its stream. A machine without
     * the device is ERR_UNSUPPORTED with the device error in e. */
    int (*open)(int ordinal, dev_info *d, ls_stream *s, ls_err *e);
    void (*close_stream)(ls_stream s);
    void *(*alloc)(size_t n, ls_err *e);   /* NULL + e on failure; contents undefined */
    void (*free)(void *p);
    int (*h2d)(void *dst, const void *src, size_t n, ls_stream s, ls_err *e);
    int (*d2h)(void *dst, const void *src, size_t n, ls_stream s, ls_err *e);
    int (*memset0)(void *dst, size_t n, ls_stream s, ls_err *e);
    int (*sync)(ls_stream s, ls_err *e);  /* wait for s; a kernel fault surfaces here */
    /* Make device `ordinal` the calling thread's (tensor-parallel ranks run one
     * thread per device); the CPU's does nothing. */
    int (*bind_thread)(int ordinal, ls_err *e);
    int (*count)(void);                   /* devices present (0 when none answers) */
    /* (additive) device-to-device copy ordered on s (the prefix cache's GDN state snapshots);
     * never called inside a CUDA graph capture */
    int (*d2d)(void *dst, const void *src, size_t n, ls_stream s, ls_err *e);
} dev_mem;

/* The memory table of device kind k, or NULL when this build has none. */
const dev_mem *ops_dev_mem(dev_kind k);
void ops_dev_mem_register(const dev_mem *m);
extern const dev_mem dev_mem_cpu;

/* ---- registries ---------------------------------------------------------- */

/* Per family: register (inserted before the trailing CPU reference; returns
 * ERR_INVAL on a duplicate name or a full registry), count, i-th, by name. */
#define OPS_DECLARE_FAMILY(fam, T)                                    \
    int ops_##fam##_register(const T *impl);                          \
    int ops_##fam##_count(void);                                      \
    const T *ops_##fam##_at(int i);                                   \
    const T *ops_##fam##_find(const char *name);
OPS_DECLARE_FAMILY(gemm, gemm_impl)
OPS_DECLARE_FAMILY(fp4_gemm, fp4_gemm_impl)
OPS_DECLARE_FAMILY(moe, moe_impl)
OPS_DECLARE_FAMILY(attn, attn_impl)
OPS_DECLARE_FAMILY(gdn, gdn_impl)
OPS_DECLARE_FAMILY(small, small_ops)
#undef OPS_DECLARE_FAMILY

/* Hook for the CUDA module: when linked (LS_HAVE_CUDA), registers its
 * backends; called once, before the CPU backends are appended. */
void ops_cuda_register_all(void);
/* Second CUDA hook, for the forward-pass pieces (device memory table and
 * small ops: src/ops/cuda/fwd_dev.cu, small.cu); called right after
 * ops_cuda_register_all. */
void ops_cuda_register_fwd(void);

/* The CPU as a dev_info. */
void ops_cpu_dev(dev_info *d);

/* ---- per-M plans (additive) -------------------------------------------------
 *
 * The doctor decides per batch-size bucket, so one backend per family is not
 * enough (gdn cuda_recurrent wins at M = 1, cuda_chunked at M = 3072; moe
 * cuda_fused_decode takes only M <= 8). A plan is a short list of
 * (largest M, backend) entries; the run helpers take, for a call of M tokens,
 * the first entry whose bound is >= M. M is what the doctor measured:
 *   gemm / fp4_gemm  the rows of the call (its M)
 *   moe              the tokens of the call (moe_args.M)
 *   attention, gdn   the new tokens of the whole step (n_tok = sum of n_new), as
 *                    in src/doctor/trial_seq.c, where a bucket's step mixes
 *                    decode rows and prefill chunks
 * Text form (flags, child processes, logs): NAME[:MAXM](,NAME[:MAXM])*, bounds
 * strictly increasing, every entry but the last with a bound, the last without
 * (it takes every larger M): "cuda_recurrent:8,cuda_chunked". One bare NAME
 * is one backend, exactly as before (no plan).
 * Named vs auto: with the family's auto_fam bit clear (a plan named on the
 * command line), an entry that does not take the call's shape is
 * ERR_UNSUPPORTED with its reason; with the bit set (serve's plan from the
 * doctor for a flag left at auto), the call falls back to another entry of the
 * plan that takes it, then to the first backend of the device that does and
 * is neither test_only nor banned (ops_sel_ban). While capturing, an entry
 * that is not graph_safe is traded (auto only) for the first graph_safe entry
 * of the plan that takes the shape, then for the first graph_safe backend of
 * the device that is neither test_only nor banned. */
enum { OPS_FAM_GEMM = 0, OPS_FAM_FP4_GEMM, OPS_FAM_MOE, OPS_FAM_ATTN, OPS_FAM_GDN, OPS_N_FAM };
#define OPS_PLAN_MAX 8
#define OPS_BAN_MAX 16

typedef struct ops_plan {
    int n;                          /* entries; 0: no plan */
    int max_m[OPS_PLAN_MAX];        /* entry i takes M in (max_m[i-1], max_m[i]]; the last: INT_MAX */
    const void *impl[OPS_PLAN_MAX]; /* the family's impl (gemm_impl, moe_impl, ...) */
} ops_plan;

/* Backend names chosen per family; NULL or "auto" = the default choice. */
typedef struct ops_names {
    const char *gemm, *fp4_gemm, *moe, *attention, *gdn;
} ops_names;

/* The backends a model runs with. */
typedef struct ops_sel {
    dev_info dev;
    act_dtype act;       /* activation dtype on this device: F32 (CPU), BF16 (CUDA) */
    ls_stream stream;    /* the stream ops run on (NULL on the CPU) */
    const gemm_impl *gemm;
    const fp4_gemm_impl *fp4_gemm;
    const moe_impl *moe;
    const attn_impl *attn;
    const gdn_impl *gdn;
    const small_ops *small;
    unsigned auto_fam;   /* bit per family chosen by "auto" (1 gemm, 2 fp4_gemm, 4 moe, 8 attention,
                            16 gdn): the run helpers below then fall back, per call, to the first
                            backend of the device whose supported() takes the call's shape */
    int capturing;       /* (additive) 1: a CUDA graph is being captured on `stream`: a family chosen
                            by "auto" takes its first graph_safe backend that fits the shape, and
                            the run helpers refuse (ERR_UNSUPPORTED, naming it) a backend that is
                            not graph_safe; 2: the rehearsal before a capture: the same choice,
                            nothing refused */
    /* (additive) per-M plans by OPS_FAM_* (n = 0: the single backend above; n >= 1:
     * that pointer is the plan's first entry), and the backends that fallbacks and
     * capture substitutes never take (ops_sel_ban) */
    ops_plan plan[OPS_N_FAM];
    const void *ban[OPS_N_FAM][OPS_BAN_MAX];
    int n_ban[OPS_N_FAM];
} ops_sel;

/* Resolve names for device d. An unknown name, or one of another device, is
 * ERR_INVAL naming the family and listing the valid names. A name may also be
 * a plan (below): the family's pointer is then the plan's first entry. */
int ops_select(const dev_info *d, const ops_names *names, ops_sel *out, ls_err *e);

/* "gemm", "fp4_gemm", "moe", "attention", "gdn" by OPS_FAM_*; the index of a
 * name (-1: none). */
const char *ops_family_name(int fam);
int ops_family_index(const char *name);
/* Parse text (one backend name or a plan) for family fam on device d (NULL:
 * a backend of any device); one name gives n = 1. ERR_INVAL with a message
 * naming the family, the text and the fault: an empty entry, a bound that is
 * not an integer in 1..2^30, bounds not increasing, a bound on the last entry
 * or none on another, more than OPS_PLAN_MAX entries, "auto" inside a plan,
 * an unknown backend (listing the valid ones). */
int ops_plan_parse(int fam, const dev_info *d, const char *text, ops_plan *out, ls_err *e);
/* The text form of p ("a:8,b"; one entry: its name; none: ""). */
void ops_plan_format(const ops_plan *p, char *out, size_t n);
/* The entry of p for a call of M tokens (NULL when p is empty). */
const void *ops_plan_at(const ops_plan *p, int M);
/* What family fam's run helper takes first for a call of M tokens: the plan's
 * entry, or the single selected backend (before any per-shape fallback). */
const void *ops_sel_for_m(const ops_sel *s, int fam, int M);
/* Backends that fallbacks and capture substitutes must never take (those
 * serve's doctor or smoke test eliminated): "FAMILY:NAME[,FAMILY:NAME...]";
 * NULL or "" for none. The selection or plan itself is not changed (a name
 * chosen explicitly stays the caller's decision). ERR_INVAL naming the bad
 * item, or more than OPS_BAN_MAX in one family. */
int ops_sel_ban(ops_sel *s, const char *list, ls_err *e);
int ops_sel_is_banned(const ops_sel *s, int fam, const void *impl);
/* (additive) Load-time check of the backends named for a family (its auto_fam bit clear;
 * a family chosen by "auto" passes: it falls back per call): every entry of the plan,
 * or the single backend, must take the shape at the first and the last M of its range
 * (the last entry: its first M and OPS_CHECK_MAX_M). ERR_UNSUPPORTED naming the
 * family, the backend, its M range, the shape, M and the backend's reason; the model
 * runs these at open, so a named backend that cannot run the model is refused before a
 * request fails on it. The linear goes to gemm or fp4_gemm by its kind. */
#define OPS_CHECK_MAX_M 8192
int ops_sel_check_linear(const ops_sel *s, const lin_w *w, ls_err *e);
int ops_sel_check_moe(const ops_sel *s, const moe_w *w, ls_err *e);
int ops_sel_check_attn(const ops_sel *s, const attn_shape *shape, ls_err *e);
int ops_sel_check_gdn(const ops_sel *s, const gdn_shape *shape, ls_err *e);

/* y = x·Wᵀ through the selected gemm or fp4_gemm (by w->kind). */
int ops_linear(const ops_sel *s, int M, const void *x, const lin_w *w, void *y, int accumulate,
               ls_err *e);
/* (additive) y[i] = x·w[i]ᵀ for i < n (n <= OPS_LINEAR_MULTI_MAX), the projections of
 * one input: one grouped call when every weight resolves, as ops_linear would, to the
 * same backend and that backend has run_multi (the decode step's q/gate/k/v or
 * qkv/z/b/a in one launch), else ops_linear per weight. */
#define OPS_LINEAR_MULTI_MAX 8
int ops_linear_multi(const ops_sel *s, int M, const void *x, int n, const lin_w *const *w, void *const *y,
                     ls_err *e);

/* Run the selected moe / attention / gdn backend on s->stream (with the
 * per-shape fallback for families chosen by "auto"; a named backend that
 * does not take the shape is ERR_UNSUPPORTED with its reason). max_ctx:
 * the longest n_past + n_new of the batch (the seqs may be device memory;
 * seqs_host is host memory). */
int ops_moe_run(const ops_sel *s, const moe_args *a, ls_err *e);
int ops_attn_run(const ops_sel *s, const attn_args *a, int max_ctx, ls_err *e);
int ops_gdn_run(const ops_sel *s, const gdn_args *a, ls_err *e);

/* ---- sampling on the device ------------------------------------------------ */

/* The engine's sampler (src/engine/sampler.h: penalties, temperature,
 * top_k / top_p / min_p, draw, logprobs) run on the device over the logits
 * rows the forward pass leaves there; only smp_out comes back. One smp_row per
 * logits row, in device memory. Token lists (bans, the repetition penalty's
 * distinct prompt + output ids, the (id, count) pairs of the frequency and
 * presence penalties) live in one int32 table `toks`, addressed by offsets.
 * The draw uses Philox-4x32-10 keyed by `seed`, counter `counter` (the
 * request's completion index): reproducible and independent of the batch. */
#define SMP_DEV_TOP 20
enum { SMP_ROW_SKIP = -2, SMP_ROW_POISON = -3 }; /* smp_row.forced: no sampling; test: NaN row */
typedef struct smp_row {
    float temperature;   /* <= 0: greedy */
    float top_p, min_p;
    int32_t top_k;       /* <= 0 or >= vocab: off */
    float rep_pen, freq_pen, pres_pen;
    int32_t forced;      /* >= 0: report that token (with its logprob) instead of drawing;
                            SMP_ROW_SKIP: the row is not sampled; SMP_ROW_POISON: test-only NaN */
    int32_t want_lp;     /* report the token's logprob */
    int32_t n_top;       /* top logprobs wanted, 0..SMP_DEV_TOP */
    uint64_t seed, counter;
    int32_t ban_off, n_ban;   /* ids forced to -inf */
    int32_t rep_off, n_rep;   /* distinct ids of prompt + output */
    int32_t cnt_off, n_cnt;   /* n_cnt (id, count) pairs: 2·n_cnt int32 */
    int32_t pad_;
    /* Added (additive, S9): constrained decoding (sampler.h smp_edit), both in toks too.
     * mask: n_mask (0: none, else ceil(vocab / 32)) uint32 words at toks[mask_off..], bit i of
     * word i / 32 set = id i allowed; a clear bit makes the raw logit -inf as the row is first
     * read, before everything else (bans, penalties, temperature, filters, logprobs). bias:
     * n_bias distinct ids at toks[bias_off..], then their n_bias float biases (the bits of a
     * float in each int32) at toks[bias_off + n_bias..], added to the raw logits first. */
    int32_t mask_off, n_mask;
    int32_t bias_off, n_bias;
} smp_row;

typedef struct smp_out {
    int32_t token;
    float logprob;
    int32_t n_top;
    int32_t bad_idx;     /* >= 0: the first NaN/Inf raw logit of the row (then nothing else is set) */
    float bad_val;
    int32_t top_ids[SMP_DEV_TOP];
    float top_lp[SMP_DEV_TOP];
} smp_out;

typedef struct sample_args {
    int rows, vocab;
    const void *logits;  /* [rows, vocab] of dtype dt */
    act_dtype dt;
    const smp_row *p;    /* [rows] */
    const int32_t *toks; /* the token lists of p */
    float *work;         /* [rows, vocab] scratch */
    smp_out *out;        /* [rows] */
} sample_args;

typedef struct sample_impl {
    const char *name;
    dev_kind dev;
    int test_only;
    int graph_safe;
    int (*run)(const sample_args *a, ls_stream s, ls_err *e);
} sample_impl;

/* ---- the CPU reference backends (always registered, always last) -------- */
extern const gemm_impl gemm_cpu_ref;
extern const fp4_gemm_impl fp4_gemm_cpu_ref;
extern const moe_impl moe_cpu_ref;
extern const attn_impl attn_cpu_ref;
extern const gdn_impl gdn_cpu_ref;
extern const small_ops small_cpu_ref;

#endif
