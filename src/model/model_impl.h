/* model_impl.h: the model struct, bound layer weights and caches, shared by
 * model.c (open/close, binding helpers, caches, the forward skeleton) and the
 * per-architecture files model_qwen3.c (attention, dense MLP, MoE: Qwen3,
 * Qwen3-MoE and the full-attention layers of the hybrids) and
 * model_qwen3_next.c (Gated DeltaNet layers of Qwen3-Next and Qwen3.5), and
 * model_tp.c (tensor-parallel ranks: weight slices, all-reduce),
 * model_backends.c (the lm_head's backend selection, the named-backend check) and
 * model_weights.c (the weights' upload to the device).
 * Internal to src/model.
 */
#ifndef LS_MODEL_IMPL_H
#define LS_MODEL_IMPL_H

#include "fmt/safetensors.h"
#include "model/model.h"
#include "ops/ops.h"

typedef struct attn_layer_w {
    lin_w q;           /* [nh·hd, H] (gated checkpoints: the q rows of q_proj, permuted at load) */
    lin_w gate;        /* gated: [nh·hd, H], the gate rows of q_proj's per-head [q_h | gate_h] */
    lin_w k, v;        /* [nkv·hd, H] */
    lin_w o;           /* [H, nh·hd] */
    float *q_norm;     /* [hd] */
    float *k_norm;     /* [hd] */
} attn_layer_w;

/* Qwen3-Next's fused in_proj_qkvz / in_proj_ba (grouped per key head) are
 * split at load into the same four contiguous projections Qwen3.5 stores. */
typedef struct gdn_layer_w {
    int fused;         /* the checkpoint had in_proj_qkvz / in_proj_ba */
    lin_w qkv;         /* [2·nk·dk + nv·dv, H], contiguous q | k | v */
    lin_w z;           /* [nv·dv, H] */
    lin_w b, a;        /* [nv, H] */
    lin_w out;         /* [H, nv·dv] */
    float *norm;       /* [dv], gated RMSNorm weight (plain, not 1+w) */
    gdn_w g;           /* conv_w [conv_dim, K], A_log [nv], dt_bias [nv] */
} gdn_layer_w;

typedef struct mlp_w {
    lin_w gate, up;    /* [I, H] */
    lin_w down;        /* [H, I] */
} mlp_w;

/* The multi-token-prediction head's own weights beside its decoder layer (the layer after the
 * model's last, m->layers[cfg.n_layers]): x = fc(cat(pre_e · embed(next id), pre_h · h)), with
 * mtp.fc [H, 2H] cut at load into the columns of each half; out = norm(layer(x)). */
typedef struct mtp_glue {
    lin_w fc_e, fc_h;  /* [H, H] each (BF16) */
    float *pre_e, *pre_h, *norm; /* [H] zero-centred norms */
} mtp_glue;

typedef struct layer_w {
    int type;          /* LAYER_FULL_ATTN / LAYER_LINEAR_ATTN */
    int cache_idx;     /* index among the full-attention (KV) or GDN (slot) layers */
    float *in_norm;    /* [H] input_layernorm */
    float *post_norm;  /* [H] post_attention_layernorm */
    attn_layer_w attn;
    gdn_layer_w gdn;
    int dense;         /* dense MLP instead of MoE */
    mlp_w mlp;
    moe_w moe;
    lin_w *experts;    /* [3·E]: gate[E] | up[E] | down[E], the moe_w arrays point here */
    mtp_glue *mtp;     /* the MTP head's layer only (else NULL) */
} layer_w;

/* Caches, in the model's device memory. */
typedef struct mcache {
    int page_size, n_pages, n_slots;
    void *kv;          /* kv_dt [n_full, 2 (k, v), n_pages, page_size, nkv, hd] */
    float *conv;       /* [n_lin, n_slots, conv_dim, K - 1] */
    float *rec;        /* [n_lin, n_slots, nv, dk, dv], fp32 state (cfg.state_bf16 0), or NULL */
    uint16_t *rec16;   /* the same in BF16 (cfg.state_bf16 1), or NULL */
} mcache;

/* The forward pass's working memory on the model's device, allocated at
 * cache init for cap_tok tokens per step and grown (never in steady-state
 * decode) only when a step brings more tokens, sequences or pages. */
typedef struct mws {
    int cap_tok, cap_seq, cap_pages;
    void *act;          /* one allocation holding the buffers below (act dtype) */
    void *h, *u, *o;    /* [T, H] residual stream, normed input, block output */
    void *q, *gate, *k, *v, *ao; /* attention: [T, nh·hd], [T, nh·hd], [T, nkv·hd] x2, [T, nh·hd] */
    void *qkv, *z, *b, *a, *core; /* gdn: [T, conv_dim], [T, nv·dv], [T, nv] x2, [T, nv·dv] */
    void *g, *up;       /* dense MLP: [T, I] */
    void *hl;           /* [T, H] the rows that want logits */
    void *hm, *hs;      /* with the MTP head: [T, H] the last pass's final-normed rows, and the last
                           MTP pass's output rows (fwd_batch.mtp_src) */
    void *red;          /* [T, H] tensor parallel: the all-reduce's sum */
    void *logits;       /* [T, V] (devices other than the CPU; the CPU writes the caller's) */
    void *meta;         /* device: ids [T] | pos [T] | rows [T] | aseq [S] | gseq [S] | pages [P] */
    char *meta_host;    /* host staging of meta (== meta on the CPU) */
    attn_seq *aseq_host;/* [cap_seq] the step's attn_seq with host page tables (into meta_host),
                           for the backends' host-side planning (attn_args.seqs_host) */
    uint16_t *lg_host;  /* host staging of BF16 logits [T, V] */
    /* sampling on the device, [cap_srows] rows */
    smp_row *srow;      /* device: the rows' parameters */
    smp_out *sout;      /* device: their results */
    float *swork;       /* device [cap_srows, V] fp32 work rows */
    int32_t *stoks;     /* device: the rows' token lists, cap_stoks entries */
    int cap_srows, cap_stoks;
} mws;

/* CUDA graphs of pure-decode steps, one per batch-size bucket (model.c). */
enum { MG_MAX = 32 };
typedef struct mgraph {
    int bs;             /* bucket: padded batch size */
    int state;          /* 0: not tried, 1: captured, -1: runs eagerly (a backend is not capture-safe) */
    void *exec;         /* cudaGraphExec_t */
    int gen;            /* m->graph_gen at capture */
} mgraph;

#define TP_MAX 16
typedef struct tp_group tp_group;

struct model {
    model_config cfg;   /* a rank's copy holds its local head counts and intermediate sizes */
    char *path;
    st_set *st;
    ops_sel ops;
    const dev_mem *mem; /* the device's memory table */
    act_dtype kv_dt;    /* KV pool dtype: F32 on the CPU, BF16 on CUDA */
    void **dev_part;    /* devices other than the CPU: [n_layers + 1] one allocation per part
                           (0: embedding, lm_head, final norm; 1 + l: layer l), model_weights.c */
    size_t weight_bytes;/* their total */
    mws ws;             /* forward working memory */
    /* tensor parallelism (model_tp.c): the coordinator (tp > 1, rank_m set) opens the
     * checkpoint and owns the config; its ranks (is_rank) hold the weight slices,
     * caches and workspaces, and run the forward pass */
    int tp, rank, is_rank;
    int owns_stream;    /* a CUDA rank opened its own device and stream */
    tp_group *grp;
    model **rank_m;     /* [tp] */
    rms_kind norm_kind; /* layer norms and q/k norms */
    char prefix[64];    /* "model." or "model.language_model." */
    lin_w embed;        /* [V, H] */
    lin_w lm_head;      /* [V, H] (the embedding when tied) */
    float *final_norm;  /* [H] */
    layer_w *layers;    /* [n_layers + n_mtp] */
    int n_full, n_lin;  /* the model's full-attention and GDN layers (the MTP head's not counted) */
    int n_mtp;          /* 1: the MTP head is loaded as layer n_layers, KV layer n_full (model_opts.mtp) */
    int mtp_rows_main, mtp_rows_self; /* the rows ws.hm / ws.hs hold (the last model / MTP pass's) */
    mcache cache;       /* the engine's (model_cache_init) */
    const sample_impl *sampler; /* device sampling, NULL on the CPU */
    /* CUDA graphs (model.c): bucket sizes, state, what they bake in */
    int graph_max_bs, ctx_cap;
    int n_graphs;
    mgraph graphs[MG_MAX];
    int graph_gen;      /* bumped whenever an address a graph holds changes (workspace, caches) */
    int warm_gen;       /* graph_gen after the last full-size warm-up pass */
    int scratch_slot;   /* padding rows' GDN slot and KV page (beyond the engine's) */
    int32_t scratch_page;
    ls_stream graph_stream; /* the model's own stream once graphs are on (owned; m->ops.stream) */
    void *attn_scratch; /* attention's device-planning scratch, for the largest bucket */
    size_t attn_scratch_bytes;
    fwd_seq *gpad;      /* [graph_max_bs] host: the padded batch */
    int32_t *gpad_ids;  /* [graph_max_bs] */
    smp_row *gpad_smp;  /* [graph_max_bs] */
    int64_t n_replayed, n_eager, n_captured;
    int tp_cap_rc;      /* TP: an all-reduce's NCCL error while capturing (the capture fails, model_tp.c) */
    void **owned;       /* malloc'd blocks freed at close */
    int n_owned, cap_owned;
    const st_tensor **used; /* every tensor binding looked up (to report unused ones) */
    int n_used, cap_used;
    int n_layers_ckpt;  /* the checkpoint's num_hidden_layers (cfg.n_layers: after model_opts.max_layers) */
    double plan_gpu_weights; /* model_mem_plan's weights per GPU (checked against each GPU's free memory) */
    st_set *st_part;    /* while a part is bound from a generated checkpoint (synth): its tensors,
                           looked up before st's (mdl_tensor) */
    /* the lm_head's own gemm selection (model_opts.lm_head_backend; mdl_lm_ops): lm_plan.n = 0:
     * the gemm family's (ops); else its entries (n = 1: one backend), lm_auto (a preference:
     * per-shape fallback, capture substitutes) and the backends its fallbacks never take */
    ops_plan lm_plan;
    int lm_auto;
    const void *lm_ban[OPS_BAN_MAX];
    int n_lm_ban;
};

/* ---- backend selection (model_backends.c) -------------------------------- */

/* The banned backends of model_opts on m->ops ("lm_head:NAME" bans the lm_head's fallbacks
 * only) and the lm_head's own plan (model_opts.lm_head_backend), at open. */
int mdl_lm_select(model *m, const dev_info *d, const model_opts *o, ls_err *e);
/* The selection the lm_head runs with: &m->ops, or tmp filled from it with the lm_head's plan. */
const ops_sel *mdl_lm_ops(const model *m, ops_sel *tmp);
/* ERR_INVAL naming the flag, plan and layer when a backend named on the command line cannot
 * run one of the model's shapes (checked at open, after binding and tp_build). */
int mdl_check_named_backends(const model *m, ls_err *e);

/* ---- binding helpers (model.c) ------------------------------------------ */

/* Full tensor name "<prefix><rest>" into out (model prefix prepended). */
void mdl_name(const model *m, char *out, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A linear `p` of logical shape [N, K]: `p.weight` BF16/F16/F32 [N, K], or
 * NVFP4 (`p.weight` U8 [N, K/2] + `p.weight_scale` F8_E4M3 [N, K/16] +
 * `p.weight_scale_2` F32 scalar). p is a full tensor name without ".weight". */
int mdl_bind_lin(model *m, const char *p, int N, int K, lin_w *out, ls_err *e);
/* mdl_bind_lin, then an FP8 weight dequantized to BF16 (for the consumers that need BF16 or
 * NVFP4: MoE experts, router, shared expert, embedding, lm_head). */
int mdl_bind_lin_bf16(model *m, const char *p, int N, int K, lin_w *out, ls_err *e);
/* w (W_FP8) as a W_BF16 weight in the model's memory: fp8 · scale in fp32, rounded once; other
 * kinds untouched. */
int mdl_fp8_to_bf16(model *m, lin_w *w, ls_err *e);
/* A 1-D parameter (full name) of n elements (any float dtype, any shape whose
 * product is n and whose dims are given by shape[0..nd)) as an owned fp32 copy. */
int mdl_bind_vec(model *m, const char *name, int nd, const int64_t *shape, float **out, ls_err *e);
/* Shorthand: a [n] vector. */
int mdl_bind_vec1(model *m, const char *name, int n, float **out, ls_err *e);
/* out = the rows rows[0..n) of w, in that order, as an owned host copy
 * (data and, for NVFP4, scales; scale2 shared). Used to permute fused
 * projections at load so their outputs come out contiguous. */
void mdl_take_rows(model *m, const lin_w *w, const int *rows, int n, lin_w *out);
/* Look a tensor up (NULL if absent) and remember it as used. */
const st_tensor *mdl_tensor(model *m, const char *name);
void *mdl_alloc(model *m, size_t bytes); /* zeroed, freed at close */

/* ---- per-architecture (model_qwen3.c, model_qwen3_next.c) ---------------- */
int qwen3_bind_attn(model *m, int l, ls_err *e);
int qwen3_bind_mlp(model *m, int l, ls_err *e);
int next_bind_gdn(model *m, int l, ls_err *e);

/* One step's token layout, shared by the layer forwards. */
/* Every pointer here is in the model's device memory, except the *_host tables. */
/* The most GDN op calls of a step: (MODEL_SNAP_MAX + 1) snapshot pieces x (decode rows, chunks). */
#define MODEL_GDN_CALLS_MAX (2 * (MODEL_SNAP_MAX + 1))

typedef struct fwd_ctx {
    model *m;
    mcache *c;
    mws *ws;
    int n_tok;
    int n_seq;
    int max_ctx;          /* the longest n_past + n_new */
    const attn_seq *aseq; /* [n_seq], pages in device memory */
    const gdn_seq *gseq;  /* [n_seq] */
    const attn_seq *aseq_host; /* [n_seq] the same in host memory, host page tables (args.seqs_host) */
    const gdn_seq *gseq_host;  /* [n_seq] the same in host memory */
    const int32_t *pos;   /* [n_tok] positions */
    int ctx_cap;          /* > 0: attention plans on the device (graph capture), see attn_args */
    void *attn_scratch;
    size_t attn_scratch_bytes;
    /* (additive) The GDN op's calls of a step (next_snap_tables): n_piece 0: one call over gseq;
     * else call p runs over the n_piece_seq[p] sequences gpiece[p] (device) / gpiece_host[p],
     * whose rows are those of the step's rows [piece_row0[p], piece_row0[p] + piece_rows[p])
     * (row0 counted from there), and piece_snap[p] >= 0 has snapshot piece_snap[p]'s state
     * copies follow it. A step is cut into calls (1) at its in-step snapshots (fwd_seq.n_snap):
     * piece k ends at each sequence's k-th snapshot offset; (2) within a piece, decode rows
     * (one new token) apart from longer chunks, when both are there, so that each call gets
     * its own M's backend (a chunked kernel that a prompt chunk calls for runs decode rows at
     * a fraction of the recurrent kernel's speed). */
    const fwd_seq *seqs;  /* [n_seq] the caller's (host) */
    int n_piece;
    int n_piece_seq[MODEL_GDN_CALLS_MAX];
    int piece_row0[MODEL_GDN_CALLS_MAX], piece_rows[MODEL_GDN_CALLS_MAX], piece_snap[MODEL_GDN_CALLS_MAX];
    const gdn_seq *gpiece[MODEL_GDN_CALLS_MAX];
    const gdn_seq *gpiece_host[MODEL_GDN_CALLS_MAX];
} fwd_ctx;

/* (model_qwen3_next.c) The GDN op's calls of a step (see fwd_ctx.n_piece; seqs: the step's n_seq
 * sequences, gs their gdn_seq over the step's f->n_tok rows): fills out
 * [MODEL_GDN_CALLS_MAX * n_seq] with call p's sequences at out + p * n_seq, and f's
 * n_piece_seq, piece_row0, piece_rows and piece_snap; returns the number of calls, 0 for one
 * call over the whole step (no snapshot, and not both decode rows and longer chunks;
 * LASTSTAND_GDN_SPLIT=0: never the decode / chunk cut). */
int next_snap_tables(fwd_ctx *f, const fwd_seq *seqs, int n_seq, const gdn_seq *gs, gdn_seq *out);

/* One rank's (or the only) forward pass over cache c; with TP, every rank
 * runs it on its own thread and only rank 0 writes b->logits. */
int mdl_forward_rank(model *m, mcache *c, const fwd_batch *b, ls_err *e);

/* n rounded up to 256 bytes: pieces of the device weights and of the workspace start aligned. */
static inline size_t align256(size_t n) { return (n + 255) & ~(size_t)255; }

/* Copy the weights to the model's device (model_weights.c; no-op on the CPU). */
int mdl_upload_weights(model *m, ls_err *e);
/* 1 when m's weights are copied to its device: a device other than the CPU, or the CPU under
 * LASTSTAND_TEST_CPU_UPLOAD=1 (tests: the device path's uploads, views, staging and frees run
 * on the CPU, the "device" copies being host memory the CPU forward reads). */
int mdl_uploads(const model *m);
/* Copy one part (-1: embedding, lm_head, final norm; l: layer l) to the device, repoint the
 * model at it and free the host blocks the model owned for it; no-op on the CPU, for a
 * coordinator, and for a part already there. */
int mdl_upload_part(model *m, int part, ls_err *e);
/* The free and total bytes of the model's GPU (binds the calling thread to it); -1 on the CPU. */
int mdl_dev_mem_info(model *m, size_t *free_b, size_t *total_b);
/* ERR_NOMEM naming GPU m's ordinal and name, the weights per GPU and its free memory when the
 * planned weights (plan_gpu_weights) plus a GiB of headroom do not fit in it; else 0. */
int mdl_check_fits(model *m, double weights, int tp, ls_err *e);

/* ---- memory plan (model_plan.c) ------------------------------------------- */
typedef struct synth_src synth_src;
/* The plan of config c cut to n_layers at tp ranks on a device (1) or the CPU (0), with the MTP head
 * (mtp), from st's tensors or src's (one of them). */
int mdl_mem_plan(const model_config *c, int n_layers, int tp, int device, int mtp, const st_set *st,
                 const synth_src *src, model_mem_plan *out);

/* ---- tensor parallelism (model_tp.c) ------------------------------------- */
/* N rank models of m (bound: embedding, lm_head, final norm; not yet its layers): CPU
 * threads, or one CUDA device per rank (each uploads the non-layer weights; all-reduce through
 * NCCL). Then tp_take_layer for every layer, as each is bound. */
int tp_build(model *m, int N, ls_err *e);
/* Layer l of m (bound) sliced into every rank, the ranks at once on their threads; on CUDA each
 * rank's slice is uploaded to its GPU and its host copy freed. The coordinator's layer l is no longer read afterwards (mdl_drop_layer). */
int tp_take_layer(model *m, int l, ls_err *e);
/* Every layer taken: the loading's host staging freed. */
void tp_load_done(model *m);
void tp_free(model *m);
/* Every rank over the batch, caches[r] being rank r's. */
int tp_forward(model *m, mcache *const *caches, const fwd_batch *b, ls_err *e);
/* x [n] (activations) = the sum of every rank's x, identical on every rank. */
void tp_allreduce(model *m, void *x, size_t n);
/* ERR_RUNTIME if an all-reduce of this group failed (CUDA), else 0; while
 * capturing, a failed all-reduce of this capture (tp_cap_rc). */
int tp_status(model *m, ls_err *e);
/* 1 when rank models of m (coordinator or rank) may capture CUDA graphs:
 * NCCL communicators, NCCL >= 2.9 (ncclGetVersion) and LASTSTAND_TP_GRAPHS
 * not "0"; else 0 with why filled. */
int tp_graphs_supported(const model *m, char *why, size_t n);
/* Collective over the ranks' threads (every rank calls it, in the same order):
 * 1 when ok is nonzero on every rank. Without a group: ok. */
int tp_all(model *m, int ok);
/* fn(rank model, arg) on every rank at once, each on its own thread bound to
 * its device (rank 0 on the caller's); the lowest failing rank's error. */
int tp_each(model *m, int (*fn)(model *rm, void *arg, ls_err *e), void *arg, ls_err *e);

/* ---- CUDA graphs under TP (model.c) --------------------------------------- */
/* Before a TP step (coordinator): the ranks' graph bookkeeping made the same
 * (a bucket stale on one rank is stale on all; a warm-up due on one is due on
 * all), so every rank replays, re-captures or runs eagerly alike. */
void mdl_graphs_sync(model *m);

/* A small op's status as an error naming the op and layer. */
int mdl_op_err(int rc, const char *op, int layer, ls_err *e);
/* out [T, H] = block(u [T, H]) for layer l (activations of dtype m->ops.act). */
int qwen3_attn_forward(fwd_ctx *f, int l, const void *u, void *out, ls_err *e);
int qwen3_mlp_forward(fwd_ctx *f, int l, const void *u, void *out, ls_err *e);
int next_gdn_forward(fwd_ctx *f, int l, const void *u, void *out, ls_err *e);

#endif
