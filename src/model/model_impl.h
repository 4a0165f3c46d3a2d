/* model_impl.h: the model struct, bound layer weights and caches, shared by
 * model.c (open/close, binding helpers, caches, the forward skeleton) and the
 * per-architecture files model_qwen3.c (attention, dense MLP, MoE: Qwen3,
 * Qwen3-MoE and the full-attention layers of the hybrids) and
 * model_qwen3_next.c (Gated DeltaNet layers of Qwen3-Next and Qwen3.5).
 * Internal to src/model.
 */
#ifndef LS_MODEL_IMPL_H
#define LS_MODEL_IMPL_H

#include "fmt/safetensors.h"
#include "model/model.h"
#include "ops/ops.h"

typedef struct attn_layer_w {
    lin_w q;           /* [nh·hd, H], or [nh·2hd, H] per-head [q | gate] when gated */
    lin_w k, v;        /* [nkv·hd, H] */
    lin_w o;           /* [H, nh·hd] */
    float *q_norm;     /* [hd] */
    float *k_norm;     /* [hd] */
} attn_layer_w;

typedef struct gdn_layer_w {
    int fused;         /* Qwen3-Next: in_proj_qkvz / in_proj_ba grouped per key head */
    lin_w qkv;         /* Qwen3.5: [2·nk·dk + nv·dv, H], contiguous q | k | v */
    lin_w z;           /* Qwen3.5: [nv·dv, H] */
    lin_w b, a;        /* Qwen3.5: [nv, H] */
    lin_w qkvz;        /* Qwen3-Next: [2·nk·dk + 2·nv·dv, H] */
    lin_w ba;          /* Qwen3-Next: [2·nv, H] */
    lin_w out;         /* [H, nv·dv] */
    float *norm;       /* [dv], gated RMSNorm weight (plain, not 1+w) */
    gdn_w g;           /* conv_w [conv_dim, K], A_log [nv], dt_bias [nv] */
} gdn_layer_w;

typedef struct mlp_w {
    lin_w gate, up;    /* [I, H] */
    lin_w down;        /* [H, I] */
} mlp_w;

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
} layer_w;

typedef struct mcache {
    int page_size, n_pages, n_slots;
    float *kv;         /* [n_full, 2 (k, v), n_pages, page_size, nkv, hd] */
    float *conv;       /* [n_lin, n_slots, conv_dim, K - 1] */
    float *rec;        /* [n_lin, n_slots, nv, dk, dv] */
} mcache;

struct model {
    model_config cfg;
    char *path;
    st_set *st;
    ops_sel ops;
    rms_kind norm_kind; /* layer norms and q/k norms */
    char prefix[64];    /* "model." or "model.language_model." */
    lin_w embed;        /* [V, H] */
    lin_w lm_head;      /* [V, H] (the embedding when tied) */
    float *final_norm;  /* [H] */
    layer_w *layers;    /* [n_layers] */
    int n_full, n_lin;
    mcache cache;       /* the engine's (model_cache_init) */
    void **owned;       /* malloc'd blocks freed at close */
    int n_owned, cap_owned;
    const st_tensor **used; /* every tensor binding looked up (to report unused ones) */
    int n_used, cap_used;
};

/* ---- binding helpers (model.c) ------------------------------------------ */

/* Full tensor name "<prefix><rest>" into out (model prefix prepended). */
void mdl_name(const model *m, char *out, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A linear `p` of logical shape [N, K]: `p.weight` BF16/F16/F32 [N, K], or
 * NVFP4 (`p.weight` U8 [N, K/2] + `p.weight_scale` F8_E4M3 [N, K/16] +
 * `p.weight_scale_2` F32 scalar). p is a full tensor name without ".weight". */
int mdl_bind_lin(model *m, const char *p, int N, int K, lin_w *out, ls_err *e);
/* A 1-D parameter (full name) of n elements (any float dtype, any shape whose
 * product is n and whose dims are given by shape[0..nd)) as an owned fp32 copy. */
int mdl_bind_vec(model *m, const char *name, int nd, const int64_t *shape, float **out, ls_err *e);
/* Shorthand: a [n] vector. */
int mdl_bind_vec1(model *m, const char *name, int n, float **out, ls_err *e);
/* Look a tensor up (NULL if absent) and remember it as used. */
const st_tensor *mdl_tensor(model *m, const char *name);
void *mdl_alloc(model *m, size_t bytes); /* zeroed, freed at close */

/* ---- per-architecture (model_qwen3.c, model_qwen3_next.c) ---------------- */
int qwen3_bind_attn(model *m, int l, ls_err *e);
int qwen3_bind_mlp(model *m, int l, ls_err *e);
int next_bind_gdn(model *m, int l, ls_err *e);

/* One step's token layout, shared by the layer forwards. */
typedef struct fwd_ctx {
    model *m;
    mcache *c;
    int n_tok;
    int n_seq;
    const fwd_seq *seqs;
    attn_seq *aseq;    /* [n_seq] */
    gdn_seq *gseq;     /* [n_seq] */
    int32_t *pos;      /* [n_tok] positions */
} fwd_ctx;

/* out [T, H] = block(u [T, H]) for layer l. */
int qwen3_attn_forward(fwd_ctx *f, int l, const float *u, float *out, ls_err *e);
int qwen3_mlp_forward(fwd_ctx *f, int l, const float *u, float *out, ls_err *e);
int next_gdn_forward(fwd_ctx *f, int l, const float *u, float *out, ls_err *e);

#endif
