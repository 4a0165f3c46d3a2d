/* model.h: a loaded model (config + weights bound for a device) and its
 * forward pass over a batch of sequences, with caches the engine manages.
 *
 * Caches: full-attention layers use a paged KV pool (pages of page_size
 * tokens, every full-attention layer's K and V for those tokens); GDN layers
 * keep per-sequence conv and recurrent state in fixed slots. The engine owns
 * the page and slot allocation; the model owns the memory.
 *
 * A batch is a list of sequences, each contributing n_new consecutive tokens
 * that follow its n_past cached tokens (prefill chunks and decode rows mix
 * freely). Logits come back for each sequence's last new token, or for every
 * new token when logits_all is set.
 */
#ifndef LS_MODEL_H
#define LS_MODEL_H

#include "base/base.h"
#include "fmt/hfconfig.h"

typedef struct model model;

typedef struct model_opts {
    const char *device;        /* "cpu", "cuda", or NULL: cuda when a GPU is present, else cpu */
    int tp;                    /* tensor-parallel ranks (CPU: threads with a shared-memory all-reduce) */
    /* backend names per op family; NULL or "auto" = the measured winner */
    const char *fp4_gemm_backend, *moe_backend, *attention_backend, *gdn_backend;
    int trust_backend;
    /* Added (additive): families (ops_sel.auto_fam bits: 1 gemm, 2 fp4_gemm, 4 moe,
     * 8 attention, 16 gdn) whose named backend is a preference, as serve passes the doctor's
     * choice for a flag left at auto: a shape it does not take falls back per call, and a
     * CUDA graph capture may take a capture-safe backend instead (ops.h). */
    unsigned auto_families;
    /* (additive) backends eliminated at start-up (serve's doctor or smoke test):
     * "FAMILY:NAME[,...]" (ops_sel_ban): per-shape fallbacks and CUDA graph
     * captures never take them. NULL: none. The backend names above may be per-M
     * plans ("a:8,b", ops.h). */
    const char *banned_backends;
    /* (additive) the BF16/F16-weight GEMM backend, a name or a plan as those above; NULL or
     * "auto" = the first of the device (registration order) */
    const char *gemm_backend;
    /* (additive) a model cut to its first layers (serve's smoke test): 0: every layer; N > 0:
     * only layers [0, N) are loaded and run (the final norm and lm_head as usual; later
     * layers' tensors are never bound or uploaded, MTP tensors ignored as always);
     * MODEL_LAYERS_SMOKE: the first model_smoke_depth() layers. For synth: paths the
     * cut applies to the spec's layers=N (same weights: synth seeds each tensor by name). */
    int max_layers;
    /* (additive) the lm_head's own BF16 gemm backend or per-M plan (serve's --lm-head-backend;
     * M = the rows that want logits), chosen by the doctor on the lm_head's own shape while the
     * projections keep gemm_backend's; NULL or "auto": the lm_head runs gemm_backend's choice.
     * auto_families bit MODEL_AUTO_LM_HEAD makes it a preference (per-shape fallback, capture
     * substitutes), as the other families' bits do; banned_backends may name "lm_head:NAME"
     * (kept off the lm_head's fallbacks, on top of the gemm family's). An NVFP4 lm_head runs
     * fp4_gemm_backend's choice. */
    const char *lm_head_backend;
    /* (additive) the GDN recurrent state's storage: "float32", "bfloat16" (SGLang's
     * --mamba-ssm-dtype: half the state's bytes and memory, rounded once per step), or NULL /
     * "auto": the config's mamba_ssm_dtype (float32 when absent) */
    const char *mamba_ssm_dtype;
    /* (additive) 1: also load the checkpoint's multi-token-prediction head (mtp.*: Qwen3.5 /
     * Qwen3-Next, config mtp_num_hidden_layers / num_nextn_predict_layers >= 1), for
     * fwd_batch.mtp passes; ERR_INVAL naming the config key when it has none. Ignored with
     * max_layers (a cut model never drafts). */
    int mtp;
} model_opts;

/* A --mamba-ssm-dtype value as model_config.state_bf16: NULL, "" or "auto" -> dflt (the config's),
 * "float32" -> 0, "bfloat16" -> 1, anything else -> -1. */
int model_ssm_dtype(const char *v, int dflt);

#define MODEL_AUTO_LM_HEAD 32u /* model_opts.auto_families: the bit after the five ops families' */

#define MODEL_LAYERS_SMOKE (-1)

/* (additive) The smallest prefix of c's layers that holds at least 2 layers of every layer
 * kind the model has (full attention and GDN; dense MLP and MoE) and at least 2 layers;
 * a kind with a single layer counts once; c->n_layers when the model is no deeper.
 * Qwen3.5 / Qwen3-Next (3 GDN then 1 full attention): 8; dense Qwen3, Qwen3-MoE: 2.
 * Layers of a kind have equal shapes, so the prefix runs every shape of the model. */
int model_smoke_depth(const model_config *c);

/* path: a Hugging Face folder, or "synth:NAME[,layers=N][,seed=S][,quant=nvfp4|bf16]". */
int model_open(const char *path, const model_opts *o, model **out, ls_err *e);
void model_close(model *m);
const model_config *model_cfg(const model *m);
const char *model_path(const model *m);
/* (additive) The checkpoint's layer count (num_hidden_layers); model_cfg(m)->n_layers is
 * smaller when model_opts.max_layers cut the model. */
int model_layers_in_checkpoint(const model *m);
/* The device the model runs on: "cpu" or "cuda" (what a NULL opts.device chose),
 * and its memory in bytes (0 on the CPU). */
const char *model_device(const model *m);
size_t model_device_mem(const model *m);

/* (additive) What model_open(path, o) places on each GPU and needs in host memory, from the
 * checkpoint's config and tensor headers alone (nothing generated, read or uploaded; no GPU
 * needed): serve --dry-run prints it, and model_open checks every GPU's free memory against
 * gpu_weights before it loads anything. Bytes. model_plan.c says how each tensor counts. */
typedef struct model_mem_plan {
    int tp, n_layers, n_layers_ckpt;
    double total_bytes;     /* the checkpoint tensors that load (a cut's later layers, the vision tower, and the
                               MTP head unless model_opts.mtp, left out) */
    double gpu_weights;     /* weights on each GPU (each tensor-parallel rank holds the same) */
    double gpu_replicated;  /* of which every GPU holds whole (embedding, lm_head, norms, router) */
    double largest_layer;   /* one layer's tensors (the streamed load holds one at a time) */
    double host_globals;    /* the tensors outside the layers (kept in host memory while serving) */
    double host_peak;       /* host memory for the weights while loading (not the process's own) */
    double kv_token_bytes;  /* KV cache per token on each GPU (every full-attention layer) */
    double slot_bytes;      /* one GDN state slot on each GPU (every GDN layer) */
} model_mem_plan;
int model_mem_plan_get(const char *path, const model_opts *o, model_mem_plan *out, ls_err *e);
/* (additive) The model's tightest GPU now (with --tp, the rank GPU with the least free memory):
 * its ordinal, free and total bytes. -1 on the CPU. The caches are budgeted on it: with --tp every
 * GPU holds an equal share (model_kv_page_bytes / model_slot_bytes sum over the ranks). */
int model_gpu_mem(model *m, int *ordinal, size_t *free_b, size_t *total_b);

/* ---- caches -------------------------------------------------------------- */
typedef struct model_cache_opts {
    int page_size;   /* tokens per KV page, e.g. 16 */
    int n_pages;     /* KV pool size in pages */
    int n_slots;     /* GDN state slots (= max concurrent sequences) */
    int max_tokens;  /* most tokens in one forward step (0: 256); the forward workspace is sized
                        for it here, and grows only when a larger step arrives */
    /* Added (additive): CUDA graphs for pure-decode steps (devices other than the CPU, one
     * rank; model.c "CUDA graphs"). graph_max_bs: the largest batch captured (0: never
     * capture); ctx_cap: the longest sequence (n_past + n_new) the caller will ever run. */
    int graph_max_bs;
    int ctx_cap;
    /* (additive) the most sequences in one step (0: n_slots). The engine's prefix cache adds
     * GDN snapshot slots that never run in a step: the per-step workspace and the device
     * sampler's rows are sized for max_seqs, not n_slots. */
    int max_seqs;
    /* (additive) the most logits rows one step samples on the device (speculative decoding
     * samples every position of a row with drafts); 0: max_seqs. The sampler's buffers are
     * sized for it up front (growing them later re-captures the CUDA graphs). */
    int max_sample_rows;
} model_cache_opts;

/* --max-running-requests left at auto on a GPU: as many running requests as the GDN state of a
 * quarter of the caches' memory holds (cache_bytes: what the caches get; slot_bytes: one
 * request's GDN state, model_slot_bytes; both summed over the ranks or both one GPU's), at least
 * 1 and at most MODEL_AUTO_RUN_MAX (models without GDN layers: MODEL_AUTO_RUN_MAX). The CPU
 * keeps MODEL_CPU_RUN_DEFAULT. */
#define MODEL_AUTO_RUN_MAX 256
#define MODEL_CPU_RUN_DEFAULT 64
int model_auto_max_running(double cache_bytes, double slot_bytes);

size_t model_kv_page_bytes(const model *m, int page_size); /* one page, all full-attn layers */
size_t model_slot_bytes(const model *m);                    /* one GDN slot, all GDN layers */
int model_cache_init(model *m, const model_cache_opts *o, ls_err *e);
/* Clear a slot's GDN conv + recurrent state before a sequence starts using it. */
void model_slot_reset(model *m, int slot);
/* (additive) Copy slot src's GDN conv + recurrent state into slot dst (the prefix cache's
 * snapshots: taken from a sequence's slot at a page boundary, restored into a new sequence's
 * slot on a hit). Ordered on the model's stream after every step already issued and before
 * any later one (no host wait); with --tp every rank copies its shard. Never call it while a
 * CUDA graph is being captured. Models without GDN layers copy nothing. 0 or ERR_*. */
int model_slot_copy(model *m, int dst, int src, ls_err *e);

/* ---- forward ------------------------------------------------------------- */
/* fwd_seq snapshots per sequence and step: the prefix cache takes up to 2 (the prompt's page
 * boundaries inside a prefill chunk), speculative decoding one per draft token (the GDN state
 * after each verified position, so that a rejected draft rolls back by taking a snapshot). */
#define MODEL_SNAP_MAX 4

typedef struct fwd_seq {
    int slot;              /* GDN state slot */
    int n_past;            /* tokens already in this sequence's cache */
    int n_new;             /* tokens this step (>= 1) */
    const int32_t *pages;  /* KV pages covering positions [0, n_past + n_new) */
    int logits_all;        /* 1: a logits row per new token; 0: last token only */
    /* (additive) GDN state snapshots inside the step (the prefix cache's, prefix_engine.c):
     * snapshot i copies this sequence's GDN conv + recurrent state, as it stands after its
     * first snap_off[i] new tokens, into slot snap_slot[i] (what model_slot_copy would copy
     * had the step ended there). n_snap in [0, MODEL_SNAP_MAX]; offsets strictly increasing
     * in (0, n_new); the slots distinct, not a slot of any sequence of the batch. The GDN op
     * then runs in pieces (model_qwen3_next.c); every other op still sees the whole step.
     * With --tp every rank copies its shard. Models without GDN layers ignore them. */
    int n_snap;
    int snap_off[MODEL_SNAP_MAX];
    int snap_slot[MODEL_SNAP_MAX];
} fwd_seq;

typedef struct smp_row smp_row; /* src/ops/ops.h */
typedef struct smp_out smp_out;

typedef struct fwd_batch {
    int n_seq;
    const fwd_seq *seqs;
    const int32_t *ids;    /* the new tokens of every sequence, concatenated in seq order */
    float *logits;         /* out: rows in seq order, vocab floats each */
    /* Added (additive): sampling on the device (model_samples_on_device). When smp is set,
     * logits row r (one per sequence, or one per new token of a logits_all sequence) is sampled
     * on the device with smp[r], only smp_res[r] comes back and logits is not written. toks: the token lists
     * the rows address (n_toks int32, host memory). */
    const smp_row *smp;
    smp_out *smp_res;
    const int32_t *toks;
    int n_toks;
    /* (additive) A pass of the multi-token-prediction head (model_has_mtp) instead of the model:
     * row i (ids[i]: the token that follows row i's position, i.e. the token at position + 1)
     * takes as its hidden input row mtp_src[i] (host memory, [n_tok]) of the model's last pass's
     * final-normed rows (mtp_self 0; every row of that pass, in its row order) or of the last
     * MTP pass's outputs (mtp_self 1; its logits rows, in their order). The head's attention
     * writes its own KV at the rows' positions (in the pages given, an extra KV layer), its
     * output after mtp.norm gives the logits rows (as above: the last row of each sequence, or
     * every row with logits_all) and is kept for a later mtp_self pass. GDN state is neither
     * read nor written (slots and snapshots are only validated); mtp_nologits: no logits rows,
     * no sampling (a pass that only writes the head's KV; logits / smp ignored). Never
     * replayed from a CUDA graph. */
    int mtp, mtp_self, mtp_nologits;
    const int32_t *mtp_src;
} fwd_batch;

int model_forward(model *m, const fwd_batch *b, ls_err *e);

/* (additive) 1 when the multi-token-prediction head is loaded (model_opts.mtp). */
int model_has_mtp(const model *m);
/* (additive) The MTP head's logits over ids [n >= 2] (a fresh cache of its own): row i < n - 1
 * predicts ids[i + 2] from the model's final-normed hidden state at position i and ids[i + 1]
 * (what drafting computes). logits: [n - 1, vocab] malloc'd. */
int model_mtp_logits_all(model *m, const int32_t *ids, int n, float **logits, ls_err *e);

/* 1 when the model's device samples (fwd_batch.smp): a CUDA device. */
int model_samples_on_device(const model *m);

/* Capture every decode bucket's CUDA graph now (model_cache_init with graph_max_bs > 0;
 * otherwise nothing), instead of on each bucket's first use. A bucket whose backends are not
 * capture-safe is marked to run eagerly (logged); an error is a failed warm-up pass. */
int model_graphs_capture(model *m, ls_err *e);

/* After model_graphs_capture: a short greedy run on the model's scratch slot, eager and then
 * replayed through the batch-1 graph; 0 when they agree (equal tokens, or a near tie where they
 * first differ), else 1 with why filled. Nothing to check (no graphs) is 0. */
int model_graphs_check(model *m, char *why, size_t n);
/* Every bucket runs eagerly from now on. */
void model_graphs_off(model *m);

/* CUDA graph use so far: steps replayed from a graph, steps run eagerly, graphs captured. */
typedef struct model_graph_stats { int64_t replayed, eager, captured; } model_graph_stats;
void model_graph_stats_get(const model *m, model_graph_stats *out);

/* Convenience for the CLI and tests: logits of every position of ids
 * (a fresh cache of its own). logits: [n, vocab] malloc'd. */
int model_logits_all(model *m, const int32_t *ids, int n, float **logits, ls_err *e);

#endif
