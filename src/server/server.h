/* server.h: the OpenAI-compatible HTTP server (DESIGN.md section 6).
 *
 * Layers, bottom up:
 *   json_py.c            Python json.dumps / ast.literal_eval compatible helpers
 *   parse_reasoning.c    --reasoning-parser qwen3 (streaming and one-shot)
 *   parse_tool*.c        --tool-call-parser qwen3_coder | qwen25
 *   req.c                OpenAI request bodies -> srv_req (validation, JSON paths)
 *   gen.c                engine submissions, per-request event queue, cancel
 *   http.c               libmicrohttpd daemon, routing, auth, limits, errors
 *   routes_*.c, sse.c    the endpoints; metrics.c the Prometheus text
 *
 * The server uses only include/laststand.h (never engine or model internals).
 * Threads: one libmicrohttpd thread per connection parses, renders and waits;
 * the engine thread only pushes events into a request's queue (gen.c).
 */
#ifndef LS_SERVER_H
#define LS_SERVER_H

#include "base/base.h"
#include "laststand.h"

#include <jansson.h>
#include <pthread.h>

/* ===================================================================== */
/* json_py.c: JSON text exactly as Python's json.dumps(v, ensure_ascii=False) */
/* ===================================================================== */
void jpy_dump(buf *b, const json_t *v);              /* separators ", " and ": " */
/* Separators "," and ":": what the server sends (reals in the shortest form that
 * reads back the same double, e.g. 0.6 where jansson writes 0.59999999999999998). */
void jpy_dump_compact(buf *b, const json_t *v);
void jpy_str(buf *b, const char *s, size_t n);       /* a JSON string literal */
char *jpy_dumps(const json_t *v);                    /* malloc'd */
/* ast.literal_eval for the literals tool arguments use (dict, list, tuple,
 * str, int, float, True/False/None, unary minus). NULL if not a literal. */
json_t *jpy_literal_eval(const char *s);
/* Python float repr (shortest round-trip, 'e' notation outside 1e-4..1e16). */
void jpy_float(buf *b, double d);

/* ===================================================================== */
/* parse_reasoning.c: --reasoning-parser qwen3                            */
/* ===================================================================== */
/* Semantics (reference/peers-and-parsers.md 2.1): leading "<think>" tags are
 * stripped and enter reasoning; force = the prompt opened <think>. Inside
 * reasoning, the first of "</think>" (dropped) or "<tool_call>" (kept, goes
 * to content) ends it; without either, all text is reasoning. Outside
 * reasoning everything is content. The streaming parser holds back any
 * suffix that may be the start of a tag, so its deltas concatenate to the
 * one-shot result for every split of the text. */
typedef struct rp_state {
    int in_reasoning, at_start, ended, stream_reasoning;
    buf hold;       /* unprocessed text (a possible partial tag) */
    buf pending;    /* reasoning held while !stream_reasoning */
} rp_state;
void rp_init(rp_state *s, int force_reasoning, int stream_reasoning);
void rp_feed(rp_state *s, const char *d, size_t n, buf *reasoning, buf *content);
void rp_finish(rp_state *s, buf *reasoning, buf *content);
void rp_free(rp_state *s);
void rp_parse(const char *text, int force_reasoning, buf *reasoning, buf *content);

/* ===================================================================== */
/* parse_tool*.c: --tool-call-parser qwen3_coder | qwen25                 */
/* ===================================================================== */
typedef enum { TP_NONE = 0, TP_QWEN3_CODER, TP_QWEN25 } tp_kind;
int tp_kind_parse(const char *s, tp_kind *out); /* 0 or ERR_INVAL */
const char *tp_kind_name(tp_kind k);

/* One complete call (one-shot parse). */
typedef struct tp_call { char *name; char *args; } tp_call;
typedef struct tp_calls { tp_call *v; int n, cap; } tp_calls;
void tp_calls_free(tp_calls *c);

/* One streamed piece: a new call (name != NULL, args "") or an argument
 * fragment for call `index` (name == NULL). */
typedef struct tp_delta { int index; char *name; char *args; } tp_delta;
typedef struct tp_deltas { tp_delta *v; int n, cap; } tp_deltas;
void tp_deltas_push(tp_deltas *d, int index, const char *name, const char *args, size_t args_len);
void tp_deltas_clear(tp_deltas *d);
void tp_deltas_free(tp_deltas *d);

/* Streaming state; tools is the request's "tools" array (borrowed, may be NULL). */
typedef struct tp_stream {
    tp_kind kind;
    const json_t *tools;
    buf hold;               /* unprocessed text */
    int seen;               /* a <tool_call> has started: outside text is dropped from here on */
    int inside;             /* between <tool_call> and </tool_call> */
    int index;              /* current call index (-1 none) */
    int in_function, json_started, n_params;
    char *func_name;
    int n_calls;
} tp_stream;
void tp_stream_init(tp_stream *s, tp_kind kind, const json_t *tools);
void tp_stream_feed(tp_stream *s, const char *d, size_t n, buf *content, tp_deltas *out);
void tp_stream_finish(tp_stream *s, buf *content, tp_deltas *out);
void tp_stream_free(tp_stream *s);
/* One-shot: content = text before the first <tool_call>; calls appended. */
void tp_parse(tp_kind kind, const json_t *tools, const char *text, buf *content, tp_calls *calls);

/* Shared by the two formats (parse_tool.c). */
const json_t *tp_tool_properties(const json_t *tools, const char *func); /* NULL if none */
int tp_tool_exists(const json_t *tools, const char *func);
/* qwen3_coder parameter conversion by the schema type; returns a new reference. */
json_t *tp_convert_param(const char *value, size_t n, const char *pname, const json_t *props);
/* "call_" + 24 hex digits. */
void tp_call_id(char out[32]);
/* Longest suffix of s[0..n) that is a proper prefix of one of tags (NULL-terminated). */
size_t tp_partial_suffix(const char *s, size_t n, const char *const *tags);

/* ===================================================================== */
/* req.c: request bodies                                                  */
/* ===================================================================== */
enum { SRV_CHAT = 1, SRV_COMPLETION = 2 };
enum { TC_NONE = 0, TC_AUTO = 1, TC_REQUIRED = 2, TC_NAMED = 3 };
enum { RF_TEXT = 0, RF_JSON_OBJECT = 1, RF_JSON_SCHEMA = 2, RF_REGEX = 3, RF_EBNF = 4 }; /* response_format.type; SGLang's regex / ebnf */

typedef struct srv_prompt {
    int32_t *ids; int n;          /* arena */
    const char *text;             /* the prompt text (completions string prompts, rendered chat) */
} srv_prompt;

typedef struct srv_req {
    arena *a;
    int kind;
    json_t *root;                 /* the parsed body (owned) */
    const char *model;            /* NULL: not given */
    /* chat */
    json_t *messages;             /* normalised copy handed to the template (owned) */
    const json_t *tools;          /* borrowed from root, NULL if none */
    int tool_choice;
    json_t *chat_template_kwargs; /* borrowed (or own_kwargs), may be NULL */
    json_t *own_kwargs;           /* owned copy when the server adds enable_thinking */
    int enable_thinking;          /* -1 unset, 0, 1 */
    int separate_reasoning, stream_reasoning;
    /* completions */
    int n_prompts;
    srv_prompt *prompts;
    json_t *prompt_strings;       /* borrowed: list of strings to tokenize, or NULL */
    int echo;
    /* both */
    ls_sampling s;
    int has_max_tokens;
    const char *max_tokens_field; /* the field that set it ("max_tokens" / "max_completion_tokens") */
    const char *prompt_field;     /* the field named when the prompt is at fault (NULL: messages / prompt) */
    int n, stream, include_usage, continuous_usage;
    int logprobs;                 /* chat: bool; completions: top count + 1 (0 = off) */
    int top_logprobs;
    const char **stop; int n_stop;
    int32_t *stop_ids; int n_stop_ids;
    int32_t *force_ids; int n_force;
    const char *user;
    /* constrained decoding (added): parsed by req.c, compiled by req_grammar.c */
    const char *tool_choice_name; /* TC_NAMED: the function (borrowed) */
    int one_call;                 /* parallel_tool_calls false: at most one tool call */
    int rf_kind;                  /* RF_* */
    const json_t *rf_schema;      /* RF_JSON_SCHEMA: borrowed from root */
    int rf_strict;
    const char *rf_path;          /* the schema's (or regex's) JSON path in error messages */
    const char *regex;            /* RF_REGEX / RF_EBNF: SGLang's "regex" / "ebnf" (borrowed from root) */
    ls_grammar *grammar;          /* owned; r->s.grammar points at it */
    int32_t *lb_ids; float *lb; int n_lb; /* logit_bias (arena) */
} srv_req;

/* Parse and validate a body (status 400 on failure): returns ERR_INVAL with
 * e->msg naming the JSON path; param (may be NULL) receives the top-level
 * field for the OpenAI error's "param". */
int req_parse(srv_req *r, int kind, const char *body, size_t len, int allow_force_ids,
              const ls_sampling *defaults, char *param, size_t paramn, ls_err *e);
void req_free(srv_req *r);
/* SGLang's --sampling-defaults model: temperature, top_p, top_k, min_p and
 * repetition_penalty from DIR/generation_config.json for requests that omit
 * them. Fills *out (from ls_sampling_default otherwise) and returns the
 * values found as a JSON object (new reference, {} when none). */
json_t *req_model_sampling_defaults(const char *model_dir, ls_sampling *out);

/* req_grammar.c: compile the request's constraint (response_format, tool_choice
 * required / named) into r->grammar and r->s.grammar. opens_think: the rendered
 * prompt leaves a <think> open, so the constraint starts after "</think>".
 * Returns 0, or fills rs with a 400 naming the JSON path at fault. */
struct srv;
struct srv_resp;
int srv_req_constrain(struct srv *sv, srv_req *r, int opens_think, struct srv_resp *rs);

/* ===================================================================== */
/* gen.c: engine submissions and the per-request event queue              */
/* ===================================================================== */
typedef struct gen_event {
    int choice;
    int32_t token;
    char *text;
    float logprob;
    int n_top; int32_t *top_ids; float *top_lps;
    int finished;
    char finish_reason[16];
    char *matched_stop, *error;
    int32_t matched_stop_id;     /* EOS / stop id that ended it, else -1 */
    int prompt_tokens, completion_tokens, cached_tokens;
} gen_event;
void gen_event_free(gen_event *ev);

typedef struct gen gen;
struct srv;
/* Submit one engine request per choice: choice c uses prompts[c / n] and,
 * when a seed is given, seed + c % n. On failure nothing stays submitted;
 * returns LS_ERR_INVAL (bad prompt) / LS_ERR_BUSY / other with err filled. */
int gen_start(struct srv *sv, const srv_req *r, gen **out, char *err, size_t errn);
/* Next event, waiting up to timeout_s. 1 = got one, 0 = timeout, -1 = all done. */
int gen_next(gen *g, gen_event *ev, double timeout_s);
int gen_choices(const gen *g);
void gen_cancel(gen *g);          /* ls_cancel every unfinished choice */
void gen_release(gen *g);         /* the HTTP side lets go (cancels unfinished choices) */

/* ===================================================================== */
/* resp_store.c: stored responses of the Responses API                    */
/* ===================================================================== */
enum { RSTORE_RESPONSE = 0, RSTORE_ITEMS = 1, RSTORE_INPUT = 2, RSTORE_NTEXT = 3 };
typedef struct resp_store resp_store;
resp_store *rstore_new(size_t max_bytes);
void rstore_free(resp_store *s);
/* Keep texts[RSTORE_*] (malloc'd JSON; taken, set to NULL) under id, evicting the
 * oldest entries to fit. -1 (nothing kept) when the entry alone exceeds the budget. */
int rstore_put(resp_store *s, const char *id, char *texts[RSTORE_NTEXT]);
/* 0 and a malloc'd copy of one text (NULL if absent), or -1: no such id. */
int rstore_get(resp_store *s, const char *id, int which, char **text);
int rstore_delete(resp_store *s, const char *id); /* 0, or -1: no such id */
void rstore_stats(resp_store *s, size_t *n, size_t *bytes);

/* ===================================================================== */
/* http.c / routes: the server                                            */
/* ===================================================================== */
typedef struct srv_config {
    const char *host;             /* default 127.0.0.1 */
    int port;                     /* default 30000 */
    const char *served_model_name;
    const char *model_path, *tokenizer_path;
    const char *api_key;          /* NULL: no auth */
    tp_kind tool_parser;
    int reasoning_parser;         /* 1: qwen3 or qwen3-thinking */
    int reasoning_always;         /* qwen3-thinking: output starts inside reasoning, whatever the prompt */
    const char *reasoning_parser_name;
    size_t max_body;              /* default 32 MiB */
    int max_connections;          /* default 512 */
    int conn_timeout_s;           /* idle keep-alive timeout, default 600 */
    int allow_force_ids;          /* LASTSTAND_TEST_FORCE_IDS=1 */
    json_t *server_args;          /* every flag, for /get_server_info (owned) */
    ls_sampling sampling_defaults; /* for fields a request omits */
    json_t *preferred_sampling;   /* the model's generation_config values in use, or NULL */
    size_t responses_store_bytes; /* budget of the stored responses (0: none kept) */
} srv_config;

/* Per-status HTTP counters (for /metrics). */
enum { SRV_ST_2XX, SRV_ST_400, SRV_ST_401, SRV_ST_404, SRV_ST_413, SRV_ST_429, SRV_ST_500, SRV_ST_503, SRV_ST_OTHER, SRV_ST_N };

typedef struct srv {
    srv_config cfg;
    ls_engine *eng;
    ls_model_info info;
    volatile int stopping;
    double started;               /* now_sec() at start */
    long long started_wall;       /* time(NULL) at start */
    pthread_mutex_t mu;
    uint64_t http_status[SRV_ST_N];
    uint64_t requests_active;
    resp_store *rstore;           /* the Responses API's stored responses */
} srv;

/* Run until SIGINT/SIGTERM. Returns 0, or 1 when the daemon cannot start. */
int srv_run(const srv_config *cfg, ls_engine *eng);

/* A response being built by a route. */
typedef struct srv_conn srv_conn;
typedef struct srv_resp {
    int status;
    const char *content_type;
    buf body;
    /* streaming: when stream_fn is set, the body is produced by it */
    long (*stream_fn)(void *ctx, char *out, size_t max); /* bytes, 0 never, -1 end, -2 error */
    void (*stream_free)(void *ctx);
    void *stream_ctx;
} srv_resp;

void srv_error(srv_resp *rs, int status, const char *type, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void srv_json_resp(srv_resp *rs, int status, json_t *obj); /* steals obj */
void srv_count_status(srv *sv, int status);
/* True once the client has closed its end (non-blocking check). */
int srv_conn_gone(srv_conn *c);
/* A query-string argument of the request, or NULL. */
const char *srv_conn_query(srv_conn *c, const char *key);

/* Routes (each fills rs). body may be NULL for GET. */
void route_chat(srv *sv, srv_conn *c, const char *body, size_t len, srv_resp *rs);
void route_completions(srv *sv, srv_conn *c, const char *body, size_t len, srv_resp *rs);
void route_generate(srv *sv, srv_conn *c, const char *body, size_t len, srv_resp *rs); /* SGLang native */
void route_models(srv *sv, const char *model_id, srv_resp *rs);
void route_health_generate(srv *sv, srv_resp *rs);
void route_model_info(srv *sv, srv_resp *rs);
void route_server_info(srv *sv, srv_resp *rs);
void route_tokenize(srv *sv, const char *body, size_t len, srv_resp *rs);
void route_detokenize(srv *sv, const char *body, size_t len, srv_resp *rs);
void route_metrics(srv *sv, srv_resp *rs);
/* The Responses API (routes_responses.c): POST /v1/responses; GET / DELETE
 * /v1/responses/{id}; GET /v1/responses/{id}/input_items; POST .../cancel.
 * rest is the URL after "/v1/responses/" (NULL for the collection). */
void route_responses(srv *sv, srv_conn *c, const char *method, const char *rest, const char *body, size_t len,
                     srv_resp *rs);
/* Server shutdown (sv->stopping set): wait for the running background responses to end. */
void responses_shutdown(srv *sv);
/* The Anthropic Messages API (routes_messages.c): POST /v1/messages and
 * /v1/messages/count_tokens (rest "count_tokens"; NULL for the collection). */
void route_messages(srv *sv, srv_conn *c, const char *rest, const char *body, size_t len, srv_resp *rs);
/* An error response (OpenAI's shape, as srv_error writes it) rewritten in Anthropic's. */
void srv_anthropic_error(srv_resp *rs);

/* Shared by the two generation routes (routes_common in routes_misc.c). */
int srv_check_model(srv *sv, const srv_req *r, srv_resp *rs); /* 0 ok, else rs filled */
/* Map a gen_start failure to an HTTP error. */
void srv_submit_error(srv_resp *rs, int code, const char *err);
void srv_random_id(char *out, size_t n, const char *prefix); /* prefix + 32 hex */

/* sse.c: a streamed body fed from a gen queue by a route-specific formatter. */
typedef struct sse_stream sse_stream;
typedef int (*sse_step_fn)(void *route_ctx, const gen_event *ev, buf *out); /* on each event */
typedef void (*sse_end_fn)(void *route_ctx, buf *out);  /* after the last event (before [DONE]) */
void sse_start(srv_resp *rs, srv *sv, srv_conn *c, gen *g, void *route_ctx, sse_step_fn step,
               sse_end_fn end, void (*ctx_free)(void *));
/* After sse_start: the stream ends without `data: [DONE]`. */
void sse_no_done(srv_resp *rs);
/* Format `event: <event>\ndata: <json>\n\n`. */
void sse_event(buf *out, const char *event, const char *json, size_t n);
/* The same for a JSON object (taken) that gets "type": type. */
void sse_json_event(buf *out, const char *type, json_t *ev);
/* Format `data: <json>\n\n`. */
void sse_data(buf *out, const char *json, size_t n);
void sse_error_event(buf *out, const char *type, int code, const char *msg);

#endif
