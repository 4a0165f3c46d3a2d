/* routes.h: helpers shared by the generation routes (routes_common.c). */
#ifndef LS_SERVER_ROUTES_H
#define LS_SERVER_ROUTES_H

#include "server/server.h"

/* One choice of a non-streamed request, as collected from its events. */
typedef struct acc_choice {
    buf text;
    int done, prompt_tokens, completion_tokens, cached_tokens;
    char finish[16];
    char *matched_stop, *error;
    int32_t matched_stop_id;
    json_t *logprobs;     /* chat: array of entries; completions: {tokens, token_logprobs, ...} */
} acc_choice;

/* Wait for every choice. 0: *out filled (acc_free it). -1: rs filled with an
 * error (engine error -> 500), or the client went away (rs->status 499). The
 * gen is released either way. */
int srv_collect(srv *sv, srv_conn *c, gen *g, const srv_req *r, acc_choice **out, srv_resp *rs);
/* The same, handing every event to fn(ctx, ev) as it arrives (before it is accumulated). */
int srv_collect_with(srv *sv, srv_conn *c, gen *g, const srv_req *r, void (*fn)(void *, const gen_event *),
                     void *ctx, acc_choice **out, srv_resp *rs);
void acc_free(acc_choice *a, int n);
void srv_usage_totals(const acc_choice *a, int n_choices, int n_per_prompt, int *prompt, int *completion, int *cached);

/* Chat: render r->messages (tools, chat_template_kwargs) with the model's
 * template and tokenize it into r->prompts[0]. 0, or rs filled (400 naming
 * r->prompt_field for a template or tokenizer failure). */
int srv_render_chat(srv *sv, srv_req *r, srv_resp *rs);
/* The request body as a JSON object, or NULL with rs filled (400 naming the position). */
json_t *srv_load_body(const char *body, size_t len, srv_resp *rs);
/* A chat body built by a translating route (Responses, Anthropic Messages): parse it
 * into r, check the model, render the prompt. names: pairs {chat field, the route's
 * field} ending with NULL, for the errors' "param" and r->prompt_field /
 * max_tokens_field. 0, or rs filled. Callable again on the same r (it is reset). */
int srv_chat_translated(srv *sv, srv_req *r, json_t *chat, const char *const *names, srv_resp *rs);
/* Once the prompt is rendered: the context check, the constraint, and which parsers
 * run on the output (reasoning, tool calls; force: the output starts inside reasoning). */
int srv_chat_ready(srv *sv, srv_req *r, srv_resp *rs, int *use_rp, int *use_tp, int *force_reasoning);
/* The rendered prompt leaves a <think> open: the model starts inside reasoning. */
int srv_prompt_opens_think(const char *text);

/* Streamed model text through the reasoning parser (rp, NULL: none) and then the
 * tool-call parser (tp, NULL: none) into reasoning, content and tool deltas; final flushes. */
void srv_parse_text(rp_state *rp, tp_stream *tp, const char *text, size_t n, int final, buf *reasoning, buf *content,
                    tp_deltas *d);

/* Prompt length against the context and max_tokens; 0 or rs filled with 400. */
int srv_check_prompt(srv *sv, srv_req *r, const srv_prompt *p, srv_resp *rs);
json_t *srv_usage(int prompt, int completion, int cached);
/* SGLang's matched_stop: the stop string, else the EOS / stop id, else null. */
json_t *srv_matched_stop(const char *matched, int32_t matched_id);

/* A JSON string of model text; invalid UTF-8 bytes become U+FFFD. */
json_t *srv_jstr(const char *s, size_t n);
char *srv_token_text(srv *sv, int32_t id);                 /* malloc'd */
json_t *srv_chat_logprob(srv *sv, const gen_event *ev);     /* one chat logprobs.content entry */
json_t *srv_completion_logprobs_new(void);
void srv_completion_logprob(srv *sv, const gen_event *ev, json_t *lp, size_t text_offset);

/* split.c: a generation's text as reasoning, text and tool-call parts (Responses, Messages). */
#define SRV_SPLIT_MAX_CALLS 64
typedef struct srv_split_cb {
    void (*reasoning)(void *ctx, const char *s, size_t n);
    void (*text)(void *ctx, const char *s, size_t n);  /* a text part starts with text that is not whitespace */
    void (*call)(void *ctx, const char *name);          /* a new call (those past max_calls never come) */
    void (*args)(void *ctx, const char *s, size_t n);   /* a piece of the current call's JSON arguments */
} srv_split_cb;
typedef struct srv_split {
    int use_rp, use_tp, max_calls;
    rp_state rp;
    tp_stream tp;
    buf ws;                 /* whitespace held before a text part */
    int text_open;          /* the last part was text: whitespace goes straight on */
    int cur_call;           /* the tool-parser index of the call taking arguments (-1: none, or dropped) */
    int n_calls;
    int reasoning_tokens;
    const srv_split_cb *cb;
    void *ctx;
} srv_split;
/* max_calls 0: no limit. tools are borrowed (the request's). */
void srv_split_init(srv_split *s, int use_rp, int force_reasoning, int use_tp, tp_kind kind, const json_t *tools,
                    int max_calls, const srv_split_cb *cb, void *ctx);
/* One engine event's text (token: its id, -1 for none; final: the last event). */
void srv_split_feed(srv_split *s, const char *text, int token, int final);
void srv_split_free(srv_split *s);

/* Submit r as one generation: streamed (1: the SSE stream owns ctx and frees it with
 * ctx_free; no [DONE]), or collected with every event handed to feed (0), or -1 with rs
 * filled. */
int srv_run_one(srv *sv, srv_conn *c, srv_req *r, int stream, void *ctx, void (*feed)(void *, const gen_event *),
                sse_step_fn step, sse_end_fn end, void (*ctx_free)(void *), srv_resp *rs);

#endif
