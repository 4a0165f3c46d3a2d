/* bench.h: the client side of a serving benchmark (`laststand bench`) and the
 * pieces `laststand sweep` reuses: a streaming HTTP runner on libcurl's multi
 * interface, the random dataset, the sglang.bench_serving metrics, the table,
 * the JSON record and the SVG plot. Internal to src/cli (not a public API).
 *
 * Metric definitions follow sglang.bench_serving (reference/peers-and-parsers.md
 * section 3) so numbers compare with it:
 *   TTFT   = time of the first chunk carrying text - time the request was sent
 *   ITL    = gap between consecutive chunks carrying text (one sample per chunk)
 *            (with logprobs requested, a chunk with a token's logprobs counts
 *            too, so servers without a tokenizer can be timed)
 *   e2e    = time of the last byte - time sent
 *   TPOT   = (e2e - TTFT) / (completion_tokens - 1), requests with > 1 token only
 *   concurrency = sum of e2e latencies / duration
 * Token counts come from the server's `usage` only; a request without usage is
 * a failed request (with that reason), never a guessed count.
 */
#ifndef LS_CLI_BENCH_H
#define LS_CLI_BENCH_H

#include "base/base.h"

#include <jansson.h>

/* ---- one HTTP request and what came back ----------------------------------- */
typedef struct bench_req {
    /* input */
    char *body;                 /* JSON request body (owned) */
    int prompt_len;             /* drawn input length, tokens (dataset) */
    int output_len;             /* requested output length, tokens */
    int is_chat;                /* 1: /v1/chat/completions, 0: /v1/completions */
    int stream;
    int usage_optional;         /* a missing usage is not a failure (smoke test) */
    /* result */
    int ok;                     /* finished with usage and no error */
    int http_status;
    char *error;                /* owned; NULL when ok */
    double t_send, t_first, t_end;   /* CLOCK_MONOTONIC seconds */
    double *chunk_t;            /* [n_chunks] arrival time of each chunk with text */
    int n_chunks, cap_chunks;
    int have_usage;
    int64_t prompt_tokens, completion_tokens;
    char *finish_reason;        /* owned, last non-null finish_reason seen */
    buf text;                   /* generated text (content + reasoning_content) */
    int bad_utf8;               /* a response could not be decoded as UTF-8 JSON */
    int lp_token;               /* the last chunk carried a token's logprobs */
    /* transfer state (runner private) */
    buf raw;                    /* SSE bytes not yet split into lines, or the body */
    void *xfer;                 /* curl handles while in flight */
    int started, done;
} bench_req;

void bench_req_free(bench_req *r);   /* frees owned fields, not r */

typedef void (*bench_progress_fn)(void *ctx, int done, int total);

/* Runs reqs[0..n) against url (the full endpoint URL) with at most max_conc in
 * flight (0 = no limit). rate <= 0 or inf: every request arrives at t=0; else
 * Poisson arrivals with that rate (exponential gaps from rng_seed). One thread
 * drives every transfer. timeout_s > 0 bounds each request. *duration_s is
 * first arrival to last completion. Returns 0, or a negative ERR_* when the
 * runner itself failed (per-request failures are recorded in the requests). */
int bench_http_run(const char *url, const char *api_key, bench_req *reqs, int n, int max_conc,
                   double rate, uint64_t rng_seed, double timeout_s, bench_progress_fn progress,
                   void *progress_ctx, double *duration_s, ls_err *e);

/* Plain blocking request (GET when body is NULL, else POST JSON). Fills
 * *status and *resp (malloc'd body, may be NULL on transport failure).
 * Returns 0 when a response arrived (any status), else ERR_RUNTIME with the
 * transport error in e. */
int bench_http_simple(const char *url, const char *api_key, const char *body, double timeout_s,
                      int *status, char **resp, ls_err *e);

/* Error text from an OpenAI-shaped (or any) error body; malloc'd. */
char *bench_error_text(int status, const char *body);

/* ---- options shared by bench and sweep ------------------------------------- */
typedef struct bench_opts {
    const char *base_url;       /* no trailing slash (points into base_url_buf) */
    char *base_url_buf;         /* owned */
    const char *backend;        /* "openai-chat" | "openai" */
    const char *model;          /* NULL: first of GET /v1/models */
    int num_prompts;            /* the largest of per_level_prompts when that is a list */
    int32_t *level_prompts;     /* --num-prompts N1,N2,...: one count per level, or NULL */
    int n_level_prompts;
    int input_len, output_len;
    double range_ratio;
    int32_t *conc;              /* concurrency levels (0 = unlimited) */
    int n_conc;
    double request_rate;        /* <= 0 or INFINITY: all at once */
    int warmup;
    uint64_t seed;
    const char *api_key;
    const char *output_file;
    const char *plot_file;
    const char *tokenizer_path;
    int stream;
    double timeout_s;           /* per request */
    int quiet;                  /* no table on stdout (sweep) */
    int output_details;         /* per-request records in the JSON lines */
    json_t *extra_body;         /* --extra-request-body: merged into every request (owned) */
} bench_opts;

void bench_opts_default(bench_opts *o);
/* If argv[*i] is a bench flag, consume it (and its value), advance *i past it
 * and return 1; return 0 if it is not a bench flag; ERR_INVAL with the flag
 * named in e on a bad value. */
int bench_opts_parse_flag(bench_opts *o, int argc, char **argv, int *i, ls_err *e);
int bench_opts_check(const bench_opts *o, ls_err *e);
void bench_opts_free(bench_opts *o);
extern const char *const BENCH_FLAGS_HELP;

/* ---- dataset --------------------------------------------------------------- */
typedef struct bench_prompt {
    int32_t *ids;   /* [n_ids] */
    int n_ids;
    char *text;     /* detokenized text (NULL when sent as ids) */
    int output_len;
} bench_prompt;

typedef struct bench_dataset {
    bench_prompt *p;    /* [n] */
    int n;
    int as_ids;         /* prompts are sent as token-id lists (completions only) */
    const char *vocab_source;  /* "tokenizer-path" | "server /tokenize" ... */
    int vocab_n;        /* size of the id pool drawn from */
} bench_dataset;

/* Draws the random dataset (SGLang lengths: input ~ U[max(1,int(I*r)), I],
 * output ~ U[int(O*r), O], output clamped to >= 1). model may be NULL. */
int bench_dataset_make(const bench_opts *o, const char *model, bench_dataset *d, ls_err *e);
void bench_dataset_free(bench_dataset *d);

/* ---- metrics ---------------------------------------------------------------- */
typedef struct bench_dist {
    double mean, median, std, p90, p95, p99, max;   /* milliseconds */
    int n;
} bench_dist;

typedef struct bench_result {
    int max_concurrency;        /* 0 = unlimited */
    double request_rate;
    double duration_s;
    int completed, failed, num_prompts;
    int64_t total_input_tokens, total_output_tokens;    /* from usage */
    int64_t drawn_input_tokens, requested_output_tokens;
    double request_throughput, input_throughput, output_throughput, total_throughput;
    double concurrency;
    bench_dist ttft, tpot, itl, e2e;
    json_t *errors;             /* [{"error":..., "count":n}] */
    json_t *details;            /* per-request records (--output-details), or NULL */
} bench_result;

void bench_metrics(const bench_req *reqs, int n, double duration_s, bench_result *r);
/* Per-request records: lengths, usage, TTFT, e2e, chunk count, text, error. */
json_t *bench_details_json(const bench_req *reqs, int n, const bench_dataset *d);
void bench_result_free(bench_result *r);
/* One JSON object with every figure and the config. */
json_t *bench_result_json(const bench_result *r, const bench_opts *o, const char *model,
                          const bench_dataset *d);
void bench_print_level(FILE *f, const bench_result *r, const bench_opts *o, const char *model);
void bench_print_summary(FILE *f, const bench_result *rs, int n);

/* ---- whole run -------------------------------------------------------------- */
/* Runs every concurrency level; fills *out (malloc'd array of n_conc results)
 * and *model_out (malloc'd). Prints tables unless o->quiet. */
int bench_run(const bench_opts *o, bench_result **out, char **model_out, ls_err *e);
/* First model id of GET /v1/models (malloc'd), or NULL with e filled. */
char *bench_discover_model(const bench_opts *o, ls_err *e);

/* ---- plot ------------------------------------------------------------------- */
int bench_plot_svg(const char *path, const bench_result *rs, int n, const char *title, ls_err *e);

/* ---- small helpers ---------------------------------------------------------- */
uint64_t bench_rng_next(uint64_t *s);      /* splitmix64 */
double bench_rng_uniform(uint64_t *s);     /* [0, 1) */
int64_t bench_rng_int(uint64_t *s, int64_t lo, int64_t hi);  /* uniform in [lo, hi] */
int bench_utf8_valid(const char *s, size_t n);

#endif
