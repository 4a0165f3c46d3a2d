/* laststand.h: the public C API of the laststand engine.
 *
 * A small library interface (as llama.h is for llama.cpp): open a model with
 * its tokenizer and chat template, submit requests to the engine, receive
 * tokens through a callback, cancel. The server and the CLI use only this API
 * and the tokenizer module. All strings are UTF-8. Functions that can fail
 * return 0 or a negative code and write a one-line message into err.
 */
#ifndef LASTSTAND_H
#define LASTSTAND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ls_engine ls_engine;

/* Error codes (same values as the internal ERR_*). */
enum { LS_OK = 0, LS_ERR_INVAL = -1, LS_ERR_IO = -2, LS_ERR_NOMEM = -3, LS_ERR_UNSUPPORTED = -4,
       LS_ERR_RUNTIME = -5, LS_ERR_CANCELLED = -6, LS_ERR_BUSY = -7 };

typedef struct ls_engine_opts {
    const char *model_path;        /* folder or synth:NAME[,...] */
    const char *tokenizer_path;    /* NULL: model_path */
    const char *chat_template;     /* file overriding the model's template, or NULL */
    const char *device;            /* "cpu" | "cuda" | NULL (auto) */
    int tp;                        /* tensor-parallel size (default 1) */
    const char *fp4_gemm_backend, *moe_backend, *attention_backend, *gdn_backend; /* NULL = auto */
    int trust_backend;
    int max_running_requests;      /* 0 = auto: on a GPU as many as the GDN state of a quarter of the
                                      cache memory holds, at most 256; on the CPU 64 */
    int chunked_prefill_size;      /* token budget per step, default 8192 */
    int context_length;            /* default: model max, capped by memory */
    double mem_fraction_static;    /* of device memory (CPU: of physical RAM) for weights + caches;
                                      0 = auto: 0.88 on GPU; on CPU 0.5, caches capped at 1 GiB */
    int page_size;                 /* KV tokens per page, default 16 */
    int max_queued_requests;       /* admission queue bound, default 1024 */
    /* Added by the engine (additive): */
    int max_total_tokens;          /* KV pool size in tokens (SGLang --max-total-tokens); 0: from memory */
    /* Added (additive): where sampling runs and CUDA graphs. */
    const char *sampling_backend;  /* "host" | "device" | NULL or "auto": device on a GPU, host on the CPU */
    int disable_cuda_graph;        /* 1: every step runs eagerly */
    int cuda_graph_max_bs;         /* largest decode batch captured (0: max_running_requests) */
    unsigned auto_families;        /* backend families whose name above is the doctor's pick for a flag
                                      left at auto (bits: 1 gemm, 2 fp4_gemm, 4 moe, 8 attention, 16 gdn): a
                                      preference, with per-shape fallback and capture-safe substitutes */
    /* Added (additive): per-M plans and eliminated backends. Each backend name above may be a
     * plan "NAME:MAXM,...,NAME" (the entry for a call of M tokens: the first with M <= MAXM;
     * see `laststand serve --help`). banned_backends "FAMILY:NAME[,...]": backends that the
     * start-up doctor or smoke test eliminated; fallbacks and CUDA graph captures never take
     * them (NULL: none). */
    const char *banned_backends;
    /* Added (additive): the BF16/F16-weight GEMM backend (cuda_cublaslt, cuda_gemv, ...; serve's
     * --gemm-backend), a name or a plan like the four above; NULL = auto. Its auto_families
     * bit is 1. */
    const char *gemm_backend;
    /* Added (additive): the lm_head's own BF16 gemm backend or plan (serve's --lm-head-backend;
     * M = the rows that want logits), the doctor's choice on the lm_head's shape; NULL = auto
     * (the lm_head runs gemm_backend's choice). Its auto_families bit is 32; banned_backends
     * may name "lm_head:NAME". */
    const char *lm_head_backend;
    /* Added (additive): automatic prefix caching (src/engine/prefix.c). prefix_cache: 1 on,
     * -1 off, 0 the default (on; with --device cuda on once validated on a GPU: see
     * ls_engine_open's log line). prefix_snapshots: GDN state snapshot slots for models with
     * GDN layers (a hit is usable up to a page boundary holding one): > 0 that many, -1 none,
     * 0 auto (a tenth of the cache budget, at most 2 x max_running_requests). */
    int prefix_cache;
    int prefix_snapshots;
    /* Added (additive): the GDN recurrent state's storage, "float32" or "bfloat16" (SGLang's
     * --mamba-ssm-dtype: half the state's memory and bytes a step, the state rounded to BF16
     * once a step); NULL or "auto": the config's mamba_ssm_dtype (float32 when absent). */
    const char *mamba_ssm_dtype;
    /* Added (additive): speculative decoding (src/engine/engine_spec.c). speculative_algorithm:
     * NULL, "" or "none": off; "ngram" (any case; SGLang's NGRAM): drafts by prompt lookup
     * (src/engine/spec.h), verified in one step and rolled back past the first rejected one.
     * speculative_num_draft_tokens: tokens a request verifies in one step, its last accepted
     * token included (SGLang's meaning): 2 .. SPEC_DRAFT_MAX + 1, at most MODEL_SNAP_MAX + 1 on a
     * model with GDN layers (each draft holds a spare GDN state slot); 0: 4. The n-gram windows:
     * the suffix lengths looked up, longest first (0: 2 and 12). speculative_max_batch: steps
     * with more running requests verify no drafts (0: 16). */
    const char *speculative_algorithm;
    int speculative_num_draft_tokens;
    int speculative_ngram_min_window, speculative_ngram_max_window;
    int speculative_max_batch;
} ls_engine_opts;

void ls_engine_opts_default(ls_engine_opts *o);
/* (additive) 1 when a speculative_algorithm value names the checkpoint's MTP head as the draft model
 * ("mtp", or SGLang's "EAGLE" / "NEXTN" for these models, any case): the head then loads with the model. */
int ls_spec_algo_is_mtp(const char *algo);
int ls_engine_open(const ls_engine_opts *o, ls_engine **out, char *err, size_t errn);
void ls_engine_close(ls_engine *e);   /* stops the engine thread; pending requests end with "abort" */

/* ---- model facts ------------------------------------------------------------ */
typedef struct ls_model_info {
    const char *model_path;
    const char *architecture;      /* "qwen3_5_moe", ... */
    int vocab_size;
    int context_length;            /* effective max prompt + completion */
    int n_eos; const int32_t *eos_ids;
    const char *device;
    int tp;
    /* Added by the engine (additive): */
    const char *tokenizer_path;    /* NULL when the model has no tokenizer */
    int has_chat_template;
    int max_running_requests, chunked_prefill_size, page_size;
    int max_total_tokens;          /* KV pool capacity in tokens */
    const char *bos_token, *eos_token; /* from tokenizer_config.json, NULL if absent */
} ls_model_info;
void ls_engine_model_info(const ls_engine *e, ls_model_info *out);

/* ---- tokenizer and chat template --------------------------------------------- */
/* ids malloc'd; returns count or negative. */
int ls_tokenize(const ls_engine *e, const char *text, int32_t **ids, char *err, size_t errn);
/* malloc'd; NULL when an id is outside the tokenizer's vocabulary; "" without a tokenizer. */
char *ls_detokenize(const ls_engine *e, const int32_t *ids, int n, int skip_special);
/* Render the chat template. request_json: {"messages","tools","add_generation_prompt",
 * "chat_template_kwargs"}. On a template raise_exception: LS_ERR_INVAL, err = its message. */
int ls_apply_chat_template(const ls_engine *e, const char *request_json, char **out, char *err, size_t errn);

/* ---- requests ------------------------------------------------------------------ */
typedef struct ls_sampling {
    float temperature;             /* 0 = greedy; default 1.0 */
    float top_p;                   /* default 1.0 */
    int top_k;                     /* <= 0: off */
    float min_p;                   /* 0: off */
    float repetition_penalty;      /* 1.0: off */
    float presence_penalty, frequency_penalty;
    int has_seed; uint64_t seed;
    int max_tokens;                /* completion tokens; <= 0: up to the context */
    int min_tokens;
    int ignore_eos;
    const int32_t *stop_ids; int n_stop_ids;     /* besides EOS */
    const char *const *stop; int n_stop;         /* stop strings, trimmed from the output */
    int skip_special_tokens;       /* default 1 */
    int logprobs;                  /* 1: report the sampled token's logprob */
    int top_logprobs;              /* 0..20 */
    /* Test-only: when non-NULL, these ids are emitted instead of sampled ones
     * (the forward pass still runs). Honoured only if the engine was opened
     * with LASTSTAND_TEST_FORCE_IDS=1 in the environment. A forced -1 puts
     * a NaN into that step's logits row instead (tests the "error" path). */
    const int32_t *force_ids; int n_force;
    /* Added (additive): constrained decoding and logit_bias.
     * grammar: the output must follow it (see ls_grammar_* below); ls_submit takes its own
     * reference. grammar_gate: the constraint starts once the output holds these bytes
     * ("</think>" for a reasoning model; NULL: from the first token). logit_bias: OpenAI's
     * token id -> bias in [-100, 100], added to the raw logits before everything else.
     * A constrained step samples from the masked distribution: tokens the grammar refuses get
     * -inf before the penalties, temperature and top_k / top_p / min_p, so probabilities
     * renormalise over the allowed tokens, greedy picks the best allowed one, and logprobs are
     * those of the masked distribution. EOS and stop_ids are allowed only where the grammar
     * accepts (and then min_tokens no longer bans them once nothing else may follow). */
    const struct ls_grammar *grammar;
    const char *grammar_gate;
    const int32_t *logit_bias_ids; const float *logit_bias; int n_logit_bias;
} ls_sampling;
void ls_sampling_default(ls_sampling *s);

/* ---- constrained decoding (added, additive) ------------------------------------
 * A compiled constraint over the engine's tokenizer. Compiling builds the
 * engine's vocabulary trie on first use (a fraction of a second for a 250k
 * vocabulary). Errors are LS_ERR_INVAL with err naming the JSON path at fault,
 * prefixed by path. The supported JSON Schema subset is listed in
 * src/grammar/gr.h. */
typedef struct ls_grammar ls_grammar;
/* schema_json: a JSON Schema; strict: OpenAI's strict (additionalProperties false by default). */
int ls_grammar_json_schema(ls_engine *e, const char *schema_json, int strict, const char *path,
                           ls_grammar **out, char *err, size_t errn);
/* Any JSON object. */
int ls_grammar_json_object(ls_engine *e, ls_grammar **out, char *err, size_t errn);
/* The whole output matches a regular expression (the subset ECMA-262 and Python's re
 * share; SGLang's "regex"). path prefixes error messages. */
int ls_grammar_regex(ls_engine *e, const char *pattern, const char *path, ls_grammar **out, char *err, size_t errn);
/* The output follows an EBNF / GBNF grammar from its rule "root" (SGLang's "ebnf"). */
int ls_grammar_ebnf(ls_engine *e, const char *text, const char *path, ls_grammar **out, char *err, size_t errn);
/* Tool calls: tools_json is the request's "tools" array; only = the function that must be
 * called (NULL: any of them); format "hermes" (<tool_call>{"name":..., "arguments":...}
 * </tool_call>) or "qwen3_coder" (the XML form); between min_calls and max_calls calls. */
int ls_grammar_tool_calls(ls_engine *e, const char *tools_json, const char *only, const char *format,
                          int min_calls, int max_calls, const char *path, ls_grammar **out, char *err,
                          size_t errn);
void ls_grammar_free(ls_grammar *g);

typedef struct ls_event {
    int64_t request_id;
    int32_t token;                 /* -1 on events without a token */
    const char *text;              /* text delta (UTF-8 complete, stop strings trimmed); "" possible */
    float logprob;
    int n_top; const int32_t *top_ids; const float *top_logprobs;
    int finished;                  /* 1 on the last event of the request */
    const char *finish_reason;     /* "stop" | "length" | "abort" | "error" (when finished) */
    const char *matched_stop;      /* the stop string or NULL */
    const char *error;             /* message when finish_reason is "error" */
    int prompt_tokens, completion_tokens, cached_tokens;
    /* Added by the engine (additive): */
    int32_t matched_stop_id;       /* EOS / stop id that ended the request, else -1 (SGLang matched_stop int) */
} ls_event;

/* Event stream of a request (engine semantics, SGLang's):
 * - one event per generated token, in order; the last one has finished = 1.
 *   A request ended by abort or error gets a final event with token -1.
 * - text: the UTF-8 delta of the detokenized output (skip_special_tokens
 *   honoured); text that might begin a stop string is held back until it
 *   cannot; the stop string and anything after it are never sent. The EOS /
 *   stop-id token that ends a request is reported (token, counted in
 *   completion_tokens) but adds no text.
 * - finish_reason: "length" when max_tokens (or the context) is reached,
 *   checked before EOS like SGLang; "stop" with matched_stop (string) or
 *   matched_stop_id (EOS / stop id); "abort" after ls_cancel or close;
 *   "error" with error set (NaN/Inf logits, a failed forward pass).
 * - ignore_eos disables EOS and stop_ids (as SGLang does), not stop strings.
 *   min_tokens bans EOS and stop ids until that many tokens exist.
 * - logprob / top_logprobs: log_softmax of the logits after penalties and
 *   temperature (temperature 0 counts as 1), before top_k / top_p / min_p,
 *   which is SGLang's default (not its "original logprobs" mode).
 * - n > 1 is the caller's job: submit n requests (with seeds seed, seed+1...
 *   if the results must be reproducible).
 * Pointers in the event are valid only during the callback.
 * Called on the engine thread; must return quickly and never call back into
 * the engine (ls_cancel is the exception: it only queues the id). */
typedef void (*ls_event_cb)(void *user, const ls_event *ev);

/* Queue a request. Returns its id (> 0) or a negative code with err filled
 * (prompt longer than the context: LS_ERR_INVAL; queue full: LS_ERR_BUSY). */
int64_t ls_submit(ls_engine *e, const int32_t *prompt, int n_prompt, const ls_sampling *s,
                  ls_event_cb cb, void *user, char *err, size_t errn);
/* Cancel: frees the request's pages and slot at the next step; the callback
 * gets a final event with finish_reason "abort". Safe from any thread. */
void ls_cancel(ls_engine *e, int64_t request_id);
/* (Additive, S21.) Hold (on = 1): from the end of the step in progress the engine admits no
 * submission and runs no step (running requests pause too) until released (on = 0), when it
 * admits everything submitted meanwhile at once. For a batch submitted as one: the requests
 * share their first step whatever the submitting thread's timing (`generate --batch`), so that
 * two runs schedule the same steps. ls_engine_close overrides a hold. Safe from any thread. */
void ls_engine_hold(ls_engine *e, int on);

/* ---- statistics (for /metrics and /get_server_info) -------------------------------- */
/* Histograms: counts[i] holds observations in (bounds[i-1], bounds[i]],
 * counts[LS_HIST_BUCKETS] those above the last bound (per bucket, NOT
 * cumulative: a Prometheus exporter sums them for le="..."). Bounds follow
 * SGLang's default buckets. ttft: submit to first token; itl: between
 * consecutive tokens of a request; e2e: submit to the final event. */
#define LS_HIST_BUCKETS 16
typedef struct ls_hist { double bounds[LS_HIST_BUCKETS]; uint64_t counts[LS_HIST_BUCKETS + 1]; double sum; uint64_t n; } ls_hist;
typedef struct ls_stats {
    /* requests_total: finished requests (any reason); failed: finish_reason "error" */
    uint64_t prompt_tokens_total, generation_tokens_total, requests_total, requests_failed_total;
    uint64_t nan_logits_total, preemptions_total;
    int running, queued;
    double kv_usage;               /* used pages / total pages */
    int kv_pages_total, kv_pages_used;
    ls_hist ttft, itl, e2e;        /* seconds */
    /* Added (additive): the prefix cache. query: prompt tokens of admitted requests (first
     * admission); hit: of those, the tokens taken from the cache (cached_tokens). Pages:
     * kv_pages_used counts the pages running requests hold (shared cache pages included);
     * prefix_cached_pages the pages the cache holds (referenced or not), reclaimable once
     * unreferenced; kv_pages_allocated every page off the free list (at idle: = cached). */
    uint64_t prefix_query_tokens_total, prefix_hit_tokens_total;
    int prefix_cached_pages, kv_pages_allocated;
    int prefix_snapshots_total, prefix_snapshots_used;
    /* Added (additive, S9): sampled rows with a grammar mask or logit_bias, by where they were
     * sampled (the device sampler, or the host from downloaded logits) */
    uint64_t constrained_rows_device_total, constrained_rows_host_total;
    /* Added (additive): speculative decoding. Rows that verified drafts, the drafts verified
     * and those accepted (each accepted draft is a token the step gained). */
    uint64_t spec_verify_rows_total, spec_draft_tokens_total, spec_accepted_tokens_total;
    /* Added (additive): compiled grammars reused from / built for the grammar cache */
    uint64_t grammar_cache_hits_total, grammar_compiles_total; /* compiled grammars reused / built */
} ls_stats;
void ls_engine_stats(ls_engine *e, ls_stats *out);

#ifdef __cplusplus
}
#endif
#endif
