/* routes_responses.c: the OpenAI Responses API.
 *
 *   POST   /v1/responses                     create (streamed or not)
 *   GET    /v1/responses/{id}                a stored response
 *   DELETE /v1/responses/{id}                forget it
 *   GET    /v1/responses/{id}/input_items    its input items (limit, order, after)
 *   POST   /v1/responses/{id}/cancel         stop a running background response
 *   POST   /v1/responses/input_tokens        {"input_tokens": N}: the request's prompt, rendered, counted
 *
 * A create request becomes a chat request: `instructions` a leading system
 * message, the conversation of `previous_response_id` (its stored items) and
 * then `input` (a string, or message, function_call, function_call_output and
 * reasoning items) become messages; function tools, tool_choice,
 * max_output_tokens, text.format (json_object / json_schema), reasoning.effort
 * "none" (thinking off), top_logprobs and the sampling fields map onto the chat
 * fields, and req.c validates the result. Everything the chat route does then
 * applies: the model's template, the context check, constrained decoding,
 * the reasoning and tool-call parsers.
 *
 * Output: the model's text goes through the same streaming parsers event by
 * event in both modes, into output items: a reasoning item (reasoning_text),
 * a message (output_text) and function_call items, in the order the model
 * wrote them. Streaming sends the typed events of the API (response.created,
 * response.in_progress, output_item.added / done, content_part.added / done,
 * output_text.delta / done, reasoning_text.delta / done,
 * function_call_arguments.delta / done, then response.completed,
 * response.incomplete or response.failed) with sequence numbers, as `event:` +
 * `data:` pairs and no [DONE]. A streamed and a non-streamed request for the
 * same tokens give the same response.
 *
 * store (default true) keeps the response, its conversation and its input items
 * in the server's bounded memory (resp_store.c, --responses-store-mb).
 * background (store: true, not streamed) runs on a thread of its own: the request returns
 * at once with the response in progress; GET polls it, cancel stops it.
 * Not supported, with a 400 naming the field: conversation,
 * prompt templates, non-function tools, image / file / audio inputs,
 * item_reference.
 */
#include "server/server.h"
#include "server/routes.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- small helpers ------------------------------------------------------------------ */

static json_t *get(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_null(v) ? NULL : v;
}

static void item_id(char *out, size_t n, const char *prefix) { srv_random_id(out, n, prefix); }

static void jset_str(json_t *o, const char *k, const char *s) { json_object_set_new(o, k, srv_jstr(s, strlen(s))); }

/* ---- input items -> chat messages ------------------------------------------------------ */

/* Text of a content value: a string or an array of text parts. path names it in errors
 * (NULL: trusted, stored items). Returns a new string, or NULL with rs filled. */
static json_t *content_text(json_t *content, const char *path, const char *field, srv_resp *rs) {
    if (json_is_string(content)) return json_incref(content);
    if (!json_is_array(content)) {
        srv_error(rs, 400, NULL, field, "%s: expected a string or an array of content parts", path);
        return NULL;
    }
    buf t; buf_init(&t);
    for (size_t j = 0; j < json_array_size(content); j++) {
        json_t *part = json_array_get(content, j);
        const char *type = json_string_value(json_object_get(part, "type"));
        if (!type || (strcmp(type, "input_text") && strcmp(type, "output_text") && strcmp(type, "text") &&
                      strcmp(type, "refusal"))) {
            buf_free(&t);
            srv_error(rs, 400, NULL, field, "%s[%zu].type: '%s' is not supported (this server's models read text: "
                      "input_text, output_text)", path, j, type ? type : "(missing)");
            return NULL;
        }
        const char *txt = json_string_value(json_object_get(part, strcmp(type, "refusal") ? "text" : "refusal"));
        if (!txt) {
            buf_free(&t);
            srv_error(rs, 400, NULL, field, "%s[%zu].text: expected a string", path, j);
            return NULL;
        }
        if (j) buf_putc(&t, '\n');
        buf_puts(&t, txt);
    }
    json_t *s = json_stringn(t.data ? t.data : "", t.len);
    buf_free(&t);
    return s;
}

typedef struct conv {
    json_t *msgs;        /* chat messages (appended) */
    buf reasoning;       /* a reasoning item's text waiting for the assistant message it precedes */
    int has_reasoning;
} conv;

static json_t *new_assistant(conv *cv) {
    json_t *m = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
    if (cv->has_reasoning) {
        json_object_set_new(m, "reasoning_content", json_stringn(cv->reasoning.data ? cv->reasoning.data : "",
                                                                 cv->reasoning.len));
        cv->reasoning.len = 0;
        cv->has_reasoning = 0;
    }
    json_array_append_new(cv->msgs, m);
    return m;
}

/* One item (path: "input[3]", field "input"). 0, or rs filled. */
static int item_to_msgs(conv *cv, json_t *it, const char *path, srv_resp *rs) {
    const char *F = "input";
    if (!json_is_object(it)) return srv_error(rs, 400, NULL, F, "%s: expected an object", path), -1;
    const char *type = json_string_value(json_object_get(it, "type"));
    json_t *rolev = json_object_get(it, "role");
    char p[96];
    if (json_object_get(it, "type") && !type)
        return srv_error(rs, 400, NULL, F, "%s.type: expected a string", path), -1;
    if (!type || !strcmp(type, "message")) {
        const char *role = json_string_value(rolev);
        if (!role) return srv_error(rs, 400, NULL, F, "%s.role: expected one of user, assistant, system, developer", path), -1;
        if (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system") && strcmp(role, "developer"))
            return srv_error(rs, 400, NULL, F, "%s.role: unknown role '%s' (expected user, assistant, system or developer)",
                             path, role), -1;
        json_t *content = json_object_get(it, "content");
        snprintf(p, sizeof p, "%s.content", path);
        if (!content) return srv_error(rs, 400, NULL, F, "%s: missing", p), -1;
        json_t *text = content_text(content, p, F, rs);
        if (!text) return -1;
        json_t *m;
        if (!strcmp(role, "assistant")) {
            m = new_assistant(cv);
            json_object_set_new(m, "content", text);
        } else {
            m = json_pack("{s:s, s:o}", "role", role, "content", text);
            json_array_append_new(cv->msgs, m);
        }
        return 0;
    }
    if (!strcmp(type, "function_call")) {
        const char *call_id = json_string_value(json_object_get(it, "call_id"));
        const char *name = json_string_value(json_object_get(it, "name"));
        const char *args = json_string_value(json_object_get(it, "arguments"));
        if (!call_id) return srv_error(rs, 400, NULL, F, "%s.call_id: expected a string", path), -1;
        if (!name) return srv_error(rs, 400, NULL, F, "%s.name: expected a string", path), -1;
        if (!args) return srv_error(rs, 400, NULL, F, "%s.arguments: expected a string (JSON text)", path), -1;
        /* the calls of one turn join the assistant message they follow */
        size_t n = json_array_size(cv->msgs);
        json_t *last = n ? json_array_get(cv->msgs, n - 1) : NULL;
        const char *lrole = json_string_value(json_object_get(last, "role"));
        json_t *m = last && lrole && !strcmp(lrole, "assistant") && !cv->has_reasoning ? last : new_assistant(cv);
        json_t *calls = json_object_get(m, "tool_calls");
        if (!calls) { calls = json_array(); json_object_set_new(m, "tool_calls", calls); }
        json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", call_id, "type", "function", "function",
                                               "name", name, "arguments", args));
        return 0;
    }
    if (!strcmp(type, "function_call_output")) {
        const char *call_id = json_string_value(json_object_get(it, "call_id"));
        if (!call_id) return srv_error(rs, 400, NULL, F, "%s.call_id: expected a string", path), -1;
        json_t *out = json_object_get(it, "output");
        snprintf(p, sizeof p, "%s.output", path);
        if (!out) return srv_error(rs, 400, NULL, F, "%s: missing", p), -1;
        json_t *text = content_text(out, p, F, rs);
        if (!text) return -1;
        json_array_append_new(cv->msgs, json_pack("{s:s, s:s, s:o}", "role", "tool", "tool_call_id", call_id, "content", text));
        return 0;
    }
    if (!strcmp(type, "reasoning")) {
        json_t *parts = json_object_get(it, "content");
        const char *key = "text";
        if (!json_array_size(parts)) parts = json_object_get(it, "summary");
        if (parts && !json_is_array(parts))
            return srv_error(rs, 400, NULL, F, "%s.content: expected an array of reasoning_text parts", path), -1;
        cv->reasoning.len = 0;
        for (size_t j = 0; j < json_array_size(parts); j++) {
            const char *t = json_string_value(json_object_get(json_array_get(parts, j), key));
            if (!t) return srv_error(rs, 400, NULL, F, "%s: part %zu has no text", path, j), -1;
            buf_puts(&cv->reasoning, t);
        }
        cv->has_reasoning = 1;
        return 0;
    }
    if (!strcmp(type, "item_reference"))
        return srv_error(rs, 400, NULL, F, "%s: item_reference is not supported; send the item itself, or continue a "
                         "stored response with previous_response_id", path), -1;
    return srv_error(rs, 400, NULL, F, "%s.type: '%s' is not supported (message, function_call, function_call_output "
                     "and reasoning items)", path, type), -1;
}

/* The item as listed and stored: a message gets type, id, status and content parts. */
static json_t *normalize_item(json_t *it) {
    json_t *c = json_deep_copy(it);
    const char *type = json_string_value(json_object_get(it, "type"));
    char id[48];
    if (!type || !strcmp(type, "message")) {
        json_object_set_new(c, "type", json_string("message"));
        const char *role = json_string_value(json_object_get(it, "role"));
        json_t *content = json_object_get(it, "content");
        if (json_is_string(content))
            json_object_set_new(c, "content", json_pack("[{s:s, s:O}]", "type",
                                                        role && !strcmp(role, "assistant") ? "output_text" : "input_text",
                                                        "text", content));
        if (!json_object_get(c, "status")) json_object_set_new(c, "status", json_string("completed"));
        if (!json_object_get(c, "id")) { item_id(id, sizeof id, "msg_"); json_object_set_new(c, "id", json_string(id)); }
    } else if (!json_object_get(c, "id")) {
        item_id(id, sizeof id, !strcmp(type, "function_call") ? "fc_" : !strcmp(type, "reasoning") ? "rs_" : "item_");
        json_object_set_new(c, "id", json_string(id));
    }
    return c;
}

/* ---- the request --------------------------------------------------------------------- */

enum { K_REASONING = 1, K_MESSAGE = 2, K_CALL = 3 };

typedef struct ritem {
    int kind;
    char id[48], call_id[32];
    char *name;
    buf text;                 /* reasoning text, message text or call arguments */
    int open;
    char status[16];
    json_t *lp;               /* K_MESSAGE: its logprob entries */
} ritem;

typedef struct rctx {
    srv *sv;
    srv_req r;
    json_t *body;             /* the Responses request (owned) */
    json_t *items_all;        /* the conversation's items: previous ones, then this input (owned) */
    json_t *input_items;      /* this request's input items, normalized (owned) */
    char id[48];
    json_int_t created_at;
    int store, stream, logprobs, background;
    int max_tool_calls;       /* 0: no limit */
    /* output */
    srv_split split;          /* the parsers: reasoning, text and calls */
    int split_on;
    ritem *items; int n_items, cap_items;
    int cur;                  /* the open item, -1 none */
    json_t *lp_all, *lp_pending;
    int started, finished;
    char finish[16];
    char *error;
    int prompt_tokens, completion_tokens, cached_tokens;
    buf *out;                 /* streaming: where events go (NULL: none) */
    int seq;
} rctx;

static void rctx_free(void *p) {
    rctx *cx = p;
    json_decref(cx->body);
    json_decref(cx->items_all);
    json_decref(cx->input_items);
    if (cx->split_on) srv_split_free(&cx->split);
    for (int i = 0; i < cx->n_items; i++) {
        free(cx->items[i].name);
        buf_free(&cx->items[i].text);
        json_decref(cx->items[i].lp);
    }
    free(cx->items);
    json_decref(cx->lp_all);
    json_decref(cx->lp_pending);
    free(cx->error);
    req_free(&cx->r);
    free(cx);
}

/* ---- events ------------------------------------------------------------------------- */

static void emit(rctx *cx, const char *type, json_t *ev) {
    if (!cx->out) { json_decref(ev); return; }
    json_object_set_new(ev, "sequence_number", json_integer(cx->seq++));
    sse_json_event(cx->out, type, ev);
}

static json_t *item_json(const ritem *it) {
    const char *st = it->open ? "in_progress" : it->status;
    const char *text = it->text.data ? it->text.data : "";
    switch (it->kind) {
    case K_REASONING: {
        json_t *content = json_array();
        if (!it->open) json_array_append_new(content, json_pack("{s:s, s:o}", "type", "reasoning_text", "text",
                                                                srv_jstr(text, it->text.len)));
        return json_pack("{s:s, s:s, s:[], s:o, s:s}", "id", it->id, "type", "reasoning", "summary", "content", content,
                         "status", st);
    }
    case K_MESSAGE: {
        json_t *content = json_array();
        if (!it->open) {
            json_t *part = json_pack("{s:s, s:o, s:[]}", "type", "output_text", "text", srv_jstr(text, it->text.len),
                                     "annotations");
            if (it->lp) json_object_set(part, "logprobs", it->lp);
            json_array_append_new(content, part);
        }
        return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", it->id, "type", "message", "role", "assistant", "status", st,
                         "content", content);
    }
    default: {
        json_t *o = json_pack("{s:s, s:s, s:s, s:s}", "id", it->id, "type", "function_call", "call_id", it->call_id,
                              "status", st);
        json_object_set_new(o, "name", srv_jstr(it->name, strlen(it->name)));
        json_object_set_new(o, "arguments", it->open ? json_string("") : srv_jstr(text, it->text.len));
        return o;
    }
    }
}

static void close_item(rctx *cx, const char *status) {
    if (cx->cur < 0) return;
    int oi = cx->cur;
    ritem *it = &cx->items[oi];
    it->open = 0;
    snprintf(it->status, sizeof it->status, "%s", status);
    const char *text = it->text.data ? it->text.data : "";
    if (it->kind == K_REASONING) {
        emit(cx, "response.reasoning_text.done", json_pack("{s:s, s:i, s:i, s:o}", "item_id", it->id, "output_index", oi,
                                                           "content_index", 0, "text", srv_jstr(text, it->text.len)));
        emit(cx, "response.content_part.done",
             json_pack("{s:s, s:i, s:i, s:{s:s, s:o}}", "item_id", it->id, "output_index", oi, "content_index", 0, "part",
                       "type", "reasoning_text", "text", srv_jstr(text, it->text.len)));
    } else if (it->kind == K_MESSAGE) {
        if (cx->logprobs) it->lp = json_deep_copy(cx->lp_all);
        emit(cx, "response.output_text.done",
             json_pack("{s:s, s:i, s:i, s:o, s:o}", "item_id", it->id, "output_index", oi, "content_index", 0, "text",
                       srv_jstr(text, it->text.len), "logprobs", it->lp ? json_incref(it->lp) : json_array()));
        json_t *part = json_pack("{s:s, s:o, s:[]}", "type", "output_text", "text", srv_jstr(text, it->text.len),
                                 "annotations");
        if (it->lp) json_object_set(part, "logprobs", it->lp);
        emit(cx, "response.content_part.done", json_pack("{s:s, s:i, s:i, s:o}", "item_id", it->id, "output_index", oi,
                                                         "content_index", 0, "part", part));
    } else {
        json_t *ev = json_pack("{s:s, s:i, s:o}", "item_id", it->id, "output_index", oi, "arguments",
                               srv_jstr(text, it->text.len));
        json_object_set_new(ev, "name", srv_jstr(it->name, strlen(it->name)));
        emit(cx, "response.function_call_arguments.done", ev);
    }
    emit(cx, "response.output_item.done", json_pack("{s:i, s:o}", "output_index", oi, "item", item_json(it)));
    cx->cur = -1;
}

static ritem *open_item(rctx *cx, int kind) {
    close_item(cx, "completed");
    if (cx->n_items == cx->cap_items) {
        cx->cap_items = cx->cap_items ? 2 * cx->cap_items : 4;
        cx->items = xrealloc(cx->items, cx->cap_items * sizeof *cx->items);
    }
    int oi = cx->n_items++;
    ritem *it = &cx->items[oi];
    memset(it, 0, sizeof *it);
    buf_init(&it->text);
    it->kind = kind;
    it->open = 1;
    item_id(it->id, sizeof it->id, kind == K_REASONING ? "rs_" : kind == K_MESSAGE ? "msg_" : "fc_");
    cx->cur = oi;
    return it;
}

static void on_reasoning(void *ctx, const char *s, size_t n) {
    rctx *cx = ctx;
    ritem *it = cx->cur >= 0 && cx->items[cx->cur].kind == K_REASONING ? &cx->items[cx->cur] : NULL;
    if (!it) {
        it = open_item(cx, K_REASONING);
        int oi = cx->cur;
        emit(cx, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", oi, "item", item_json(it)));
        emit(cx, "response.content_part.added",
             json_pack("{s:s, s:i, s:i, s:{s:s, s:s}}", "item_id", it->id, "output_index", oi, "content_index", 0, "part",
                       "type", "reasoning_text", "text", ""));
    }
    buf_append(&it->text, s, n);
    emit(cx, "response.reasoning_text.delta", json_pack("{s:s, s:i, s:i, s:o}", "item_id", it->id, "output_index",
                                                        cx->cur, "content_index", 0, "delta", srv_jstr(s, n)));
}

static void on_text(void *ctx, const char *s, size_t n) {
    rctx *cx = ctx;
    ritem *it = cx->cur >= 0 && cx->items[cx->cur].kind == K_MESSAGE ? &cx->items[cx->cur] : NULL;
    if (!it) {
        it = open_item(cx, K_MESSAGE);
        emit(cx, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", cx->cur, "item", item_json(it)));
        emit(cx, "response.content_part.added",
             json_pack("{s:s, s:i, s:i, s:{s:s, s:s, s:[], s:[]}}", "item_id", it->id, "output_index", cx->cur,
                       "content_index", 0, "part", "type", "output_text", "text", "", "annotations", "logprobs"));
    }
    buf_append(&it->text, s, n);
    json_t *lp = cx->lp_pending ? cx->lp_pending : json_array();
    if (cx->lp_pending) cx->lp_pending = json_array();
    emit(cx, "response.output_text.delta", json_pack("{s:s, s:i, s:i, s:o, s:o}", "item_id", it->id, "output_index",
                                                     cx->cur, "content_index", 0, "delta", srv_jstr(s, n), "logprobs", lp));
}

static void on_call(void *ctx, const char *name) {
    rctx *cx = ctx;
    ritem *it = open_item(cx, K_CALL);
    it->name = xstrdup(name);
    tp_call_id(it->call_id);
    emit(cx, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", cx->cur, "item", item_json(it)));
}

static void on_args(void *ctx, const char *s, size_t n) {
    rctx *cx = ctx;
    ritem *it = &cx->items[cx->cur];
    buf_append(&it->text, s, n);
    emit(cx, "response.function_call_arguments.delta",
         json_pack("{s:s, s:i, s:o}", "item_id", it->id, "output_index", cx->cur, "delta", srv_jstr(s, n)));
}

static const srv_split_cb SPLIT_CB = {on_reasoning, on_text, on_call, on_args};

/* One engine event through the parsers into the output items (both modes). */
static void feed(void *ctx, const gen_event *ev) {
    rctx *cx = ctx;
    if (cx->finished) return;
    if (ev->token >= 0 && cx->logprobs) {
        json_t *e = srv_chat_logprob(cx->sv, ev);
        json_array_append(cx->lp_all, e);
        json_array_append_new(cx->lp_pending, e);
    }
    srv_split_feed(&cx->split, ev->text, ev->token, ev->finished);
    if (ev->finished) {
        cx->finished = 1;
        snprintf(cx->finish, sizeof cx->finish, "%s", ev->finish_reason[0] ? ev->finish_reason : "stop");
        if (ev->error) cx->error = xstrdup(ev->error);
        cx->prompt_tokens = ev->prompt_tokens;
        cx->completion_tokens = ev->completion_tokens;
        cx->cached_tokens = ev->cached_tokens;
    }
}

/* ---- the response object ---------------------------------------------------------------- */

static const char *status_of(const rctx *cx) {
    if (!cx->finished) return "in_progress";
    if (!strcmp(cx->finish, "error")) return "failed";
    if (!strcmp(cx->finish, "length")) return "incomplete";
    if (!strcmp(cx->finish, "abort")) return "cancelled";
    return "completed";
}

/* The request's value, else the sampling default in use (a float: its shortest decimal form). */
static json_t *echo_num(json_t *body, const char *k, float fallback) {
    json_t *v = get(body, k);
    if (json_is_number(v)) return json_incref(v);
    char t[32];
    for (int p = 1; p <= 9; p++) {
        snprintf(t, sizeof t, "%.*g", p, (double)fallback);
        if ((float)strtod(t, NULL) == fallback) break;
    }
    return json_real(strtod(t, NULL));
}

static json_t *response_json(rctx *cx) {
    json_t *b = cx->body;
    const char *st = status_of(cx);
    json_t *output = json_array();
    for (int i = 0; i < cx->n_items; i++) json_array_append_new(output, item_json(&cx->items[i]));
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:b, s:n, s:o}", "id", cx->id, "object", "response", "created_at",
                          cx->created_at, "status", st, "background", cx->background, "error", "output", output);
    if (!strcmp(st, "incomplete"))
        json_object_set_new(o, "incomplete_details", json_pack("{s:s}", "reason", "max_output_tokens"));
    else json_object_set_new(o, "incomplete_details", json_null());
    if (!strcmp(st, "failed"))
        json_object_set_new(o, "error", json_pack("{s:s, s:o}", "code", "server_error", "message",
                                                  srv_jstr(cx->error ? cx->error : "engine error",
                                                           strlen(cx->error ? cx->error : "engine error"))));
    if (cx->finished) json_object_set_new(o, "completed_at", json_integer((json_int_t)time(NULL)));
    json_t *v;
    json_object_set_new(o, "instructions", (v = get(b, "instructions")) ? json_incref(v) : json_null());
    json_object_set_new(o, "max_output_tokens", (v = get(b, "max_output_tokens")) ? json_incref(v) : json_null());
    json_object_set_new(o, "max_tool_calls", (v = get(b, "max_tool_calls")) ? json_incref(v) : json_null());
    json_object_set_new(o, "metadata", (v = get(b, "metadata")) ? json_incref(v) : json_object());
    jset_str(o, "model", cx->sv->cfg.served_model_name);
    json_object_set_new(o, "parallel_tool_calls", (v = get(b, "parallel_tool_calls")) ? json_incref(v) : json_true());
    json_object_set_new(o, "previous_response_id", (v = get(b, "previous_response_id")) ? json_incref(v) : json_null());
    json_t *reasoning = get(b, "reasoning");
    json_object_set_new(o, "reasoning", json_pack("{s:O, s:n}", "effort",
                                                  (v = get(reasoning, "effort")) ? v : json_null(), "summary"));
    json_object_set_new(o, "store", json_boolean(cx->store));
    json_object_set_new(o, "temperature", echo_num(b, "temperature", cx->r.s.temperature));
    json_object_set_new(o, "top_p", echo_num(b, "top_p", cx->r.s.top_p));
    json_t *format = get(get(b, "text"), "format");
    json_object_set_new(o, "text", json_pack("{s:o}", "format", format ? json_incref(format)
                                                                       : json_pack("{s:s}", "type", "text")));
    json_object_set_new(o, "tool_choice", (v = get(b, "tool_choice")) ? json_incref(v) : json_string("auto"));
    json_object_set_new(o, "tools", (v = get(b, "tools")) ? json_incref(v) : json_array());
    json_object_set_new(o, "top_logprobs", (v = get(b, "top_logprobs")) ? json_incref(v) : json_integer(0));
    json_object_set_new(o, "truncation", (v = get(b, "truncation")) ? json_incref(v) : json_string("disabled"));
    json_object_set_new(o, "user", (v = get(b, "user")) ? json_incref(v) : json_null());
    if (cx->finished)
        json_object_set_new(o, "usage",
                            json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens", cx->prompt_tokens,
                                      "input_tokens_details", "cached_tokens", cx->cached_tokens, "output_tokens",
                                      cx->completion_tokens, "output_tokens_details", "reasoning_tokens",
                                      cx->split.reasoning_tokens, "total_tokens", cx->prompt_tokens + cx->completion_tokens));
    else json_object_set_new(o, "usage", json_null());
    return o;
}

/* Close the output, keep it when asked, return the final response (new reference). */
static json_t *finish_response(rctx *cx) {
    const char *st = status_of(cx);
    close_item(cx, !strcmp(st, "completed") ? "completed" : "incomplete");
    json_t *resp = response_json(cx);
    if (cx->store && (strcmp(st, "failed") || cx->background)) { /* a failed background response is polled */
        json_t *all = json_copy(cx->items_all);
        json_t *out = json_object_get(resp, "output");
        for (size_t i = 0; i < json_array_size(out); i++) json_array_append(all, json_array_get(out, i));
        char *texts[RSTORE_NTEXT];
        texts[RSTORE_RESPONSE] = json_dumps(resp, JSON_COMPACT);
        texts[RSTORE_ITEMS] = json_dumps(all, JSON_COMPACT);
        texts[RSTORE_INPUT] = json_dumps(cx->input_items, JSON_COMPACT);
        json_decref(all);
        if (rstore_put(cx->sv->rstore, cx->id, texts))
            log_warn("responses: %s not stored: larger than --responses-store-mb", cx->id);
        for (int i = 0; i < RSTORE_NTEXT; i++) free(texts[i]);
    }
    return resp;
}

/* ---- streaming ------------------------------------------------------------------------- */

/* response.created and response.in_progress, once, before anything else. */
static void start_events(rctx *cx) {
    if (cx->started) return;
    cx->started = 1;
    emit(cx, "response.created", json_pack("{s:o}", "response", response_json(cx)));
    emit(cx, "response.in_progress", json_pack("{s:o}", "response", response_json(cx)));
}

static int resp_step(void *ctx, const gen_event *ev, buf *out) {
    rctx *cx = ctx;
    cx->out = out;
    start_events(cx);
    feed(cx, ev);
    if (cx->finished && !strcmp(cx->finish, "error")) {
        json_t *resp = finish_response(cx);
        emit(cx, "response.failed", json_pack("{s:o}", "response", resp));
        cx->out = NULL;
        return -1;
    }
    cx->out = NULL;
    return 0;
}

static void resp_end(void *ctx, buf *out) {
    rctx *cx = ctx;
    cx->out = out;
    start_events(cx);
    json_t *resp = finish_response(cx);
    const char *st = status_of(cx);
    emit(cx, !strcmp(st, "incomplete") || !strcmp(st, "cancelled") ? "response.incomplete" : "response.completed",
         json_pack("{s:o}", "response", resp));
    cx->out = NULL;
}

/* ---- create ----------------------------------------------------------------------------- */

/* The chat request body for the Responses body b (0), or rs filled. */
static int build_chat(rctx *cx, json_t *b, json_t *chat, srv_resp *rs) {
    json_t *v;
    /* ints validated here so that errors name the Responses field */
    struct { const char *k; long long lo, hi; } ints[] = {{"max_output_tokens", 1, 1 << 30}, {"top_logprobs", 0, 20},
                                                          {"max_tool_calls", 1, 64}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        v = get(b, ints[i].k);
        if (!v) continue;
        if (!json_is_integer(v) || json_integer_value(v) < ints[i].lo || json_integer_value(v) > ints[i].hi)
            return srv_error(rs, 400, NULL, ints[i].k, "%s: expected an integer between %lld and %lld", ints[i].k,
                             ints[i].lo, ints[i].hi), -1;
    }
    if ((v = get(b, "max_output_tokens"))) json_object_set(chat, "max_tokens", v);
    if ((v = get(b, "max_tool_calls"))) cx->max_tool_calls = (int)json_integer_value(v);
    if (json_is_false(get(b, "parallel_tool_calls"))) cx->max_tool_calls = 1; /* one call a response */
    static const char *bools[] = {"stream", "store", "background", "parallel_tool_calls"};
    for (size_t i = 0; i < 4; i++)
        if ((v = get(b, bools[i])) && !json_is_boolean(v))
            return srv_error(rs, 400, NULL, bools[i], "%s: expected true or false", bools[i]), -1;
    cx->stream = json_is_true(get(b, "stream"));
    cx->store = !json_is_false(get(b, "store"));
    cx->background = json_is_true(get(b, "background"));
    if (cx->background && cx->stream)
        return srv_error(rs, 400, NULL, "background", "background: a background response is polled (GET "
                         "/v1/responses/{id}), not streamed; send stream: false"), -1;
    if (cx->background && !cx->store)
        return srv_error(rs, 400, NULL, "background", "background: a background response must be stored (store: true)"), -1;
    if (get(b, "conversation"))
        return srv_error(rs, 400, NULL, "conversation", "conversation: the Conversations API is not supported; "
                         "continue a conversation with previous_response_id"), -1;
    if (get(b, "prompt"))
        return srv_error(rs, 400, NULL, "prompt", "prompt: reusable prompt templates are not supported"), -1;
    if ((v = get(b, "truncation")) && !(json_is_string(v) && (!strcmp(json_string_value(v), "disabled") ||
                                                              !strcmp(json_string_value(v), "auto"))))
        return srv_error(rs, 400, NULL, "truncation", "truncation: expected \"auto\" or \"disabled\""), -1;
    if ((v = get(b, "metadata"))) {
        if (!json_is_object(v) || json_object_size(v) > 16)
            return srv_error(rs, 400, NULL, "metadata", "metadata: expected an object of at most 16 string values"), -1;
        const char *k; json_t *x;
        json_object_foreach(v, k, x)
            if (!json_is_string(x) || strlen(k) > 64 || json_string_length(x) > 512)
                return srv_error(rs, 400, NULL, "metadata", "metadata.%s: expected a string of at most 512 characters "
                                 "under a key of at most 64", k), -1;
    }
    /* include */
    if ((v = get(b, "include"))) {
        if (!json_is_array(v)) return srv_error(rs, 400, NULL, "include", "include: expected an array of strings"), -1;
        for (size_t i = 0; i < json_array_size(v); i++) {
            const char *s = json_string_value(json_array_get(v, i));
            if (!s) return srv_error(rs, 400, NULL, "include", "include[%zu]: expected a string", i), -1;
            if (!strcmp(s, "message.output_text.logprobs")) cx->logprobs = 1;
            else if (strcmp(s, "reasoning.encrypted_content"))
                return srv_error(rs, 400, NULL, "include", "include[%zu]: '%s' is not supported (message.output_text.logprobs, "
                                 "reasoning.encrypted_content)", i, s), -1;
        }
    }
    if (cx->logprobs) {
        json_object_set_new(chat, "logprobs", json_true());
        if ((v = get(b, "top_logprobs"))) json_object_set(chat, "top_logprobs", v);
    }
    /* sampling and SGLang extras pass through under the same names */
    static const char *same[] = {"model", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                                 "presence_penalty", "frequency_penalty", "seed", "stop", "stop_token_ids", "ignore_eos",
                                 "min_tokens", "logit_bias", "skip_special_tokens", "user", "chat_template_kwargs",
                                 "separate_reasoning", "force_ids"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        if ((v = json_object_get(b, same[i]))) json_object_set(chat, same[i], v);
    /* reasoning */
    if ((v = get(b, "reasoning"))) {
        if (!json_is_object(v)) return srv_error(rs, 400, NULL, "reasoning", "reasoning: expected an object"), -1;
        json_t *e = get(v, "effort");
        const char *s = json_string_value(e);
        if (e && (!s || (strcmp(s, "none") && strcmp(s, "minimal") && strcmp(s, "low") && strcmp(s, "medium") &&
                         strcmp(s, "high") && strcmp(s, "xhigh"))))
            return srv_error(rs, 400, NULL, "reasoning", "reasoning.effort: expected none, minimal, low, medium, high or xhigh"), -1;
        if (s && !strcmp(s, "none")) json_object_set_new(chat, "reasoning_effort", json_string("none"));
    }
    /* text.format -> response_format */
    if ((v = get(b, "text"))) {
        if (!json_is_object(v)) return srv_error(rs, 400, NULL, "text", "text: expected an object"), -1;
        json_t *f = get(v, "format");
        if (f) {
            const char *t = json_string_value(json_object_get(f, "type"));
            if (!json_is_object(f) || !t) return srv_error(rs, 400, NULL, "text", "text.format.type: expected a string"), -1;
            if (!strcmp(t, "json_object")) {
                json_object_set_new(chat, "response_format", json_pack("{s:s}", "type", "json_object"));
            } else if (!strcmp(t, "json_schema")) {
                json_t *sc = json_object_get(f, "schema");
                if (!sc) return srv_error(rs, 400, NULL, "text", "text.format.schema: required"), -1;
                if (!json_is_object(sc) && !json_is_boolean(sc))
                    return srv_error(rs, 400, NULL, "text", "text.format.schema: expected a JSON Schema object"), -1;
                json_t *nm = json_object_get(f, "name"), *strict = json_object_get(f, "strict");
                if (nm && !json_is_string(nm)) return srv_error(rs, 400, NULL, "text", "text.format.name: expected a string"), -1;
                if (strict && !json_is_boolean(strict) && !json_is_null(strict))
                    return srv_error(rs, 400, NULL, "text", "text.format.strict: expected true or false"), -1;
                json_t *js = json_pack("{s:O}", "schema", sc);
                if (nm) json_object_set(js, "name", nm);
                if (json_is_boolean(strict)) json_object_set(js, "strict", strict);
                json_object_set_new(chat, "response_format", json_pack("{s:s, s:o}", "type", "json_schema", "json_schema", js));
            } else if (strcmp(t, "text")) {
                return srv_error(rs, 400, NULL, "text", "text.format.type: expected text, json_object or json_schema, got '%s'", t), -1;
            }
        }
    }
    /* tools: function tools, flat in this API */
    if ((v = get(b, "tools"))) {
        if (!json_is_array(v)) return srv_error(rs, 400, NULL, "tools", "tools: expected an array"), -1;
        json_t *tools = json_array();
        json_object_set_new(chat, "tools", tools);
        for (size_t i = 0; i < json_array_size(v); i++) {
            json_t *t = json_array_get(v, i);
            const char *type = json_string_value(json_object_get(t, "type"));
            if (!json_is_object(t) || !type)
                return srv_error(rs, 400, NULL, "tools", "tools[%zu].type: expected a string", i), -1;
            if (strcmp(type, "function"))
                return srv_error(rs, 400, NULL, "tools", "tools[%zu].type: '%s' is not supported (function tools only: "
                                 "this server runs no hosted tools)", i, type), -1;
            json_t *nm = json_object_get(t, "name"), *params = json_object_get(t, "parameters");
            json_t *desc = json_object_get(t, "description");
            if (!json_is_string(nm)) return srv_error(rs, 400, NULL, "tools", "tools[%zu].name: expected a string", i), -1;
            if (params && !json_is_object(params) && !json_is_null(params))
                return srv_error(rs, 400, NULL, "tools", "tools[%zu].parameters: expected a JSON schema object", i), -1;
            if (desc && !json_is_string(desc) && !json_is_null(desc))
                return srv_error(rs, 400, NULL, "tools", "tools[%zu].description: expected a string", i), -1;
            json_t *fn = json_pack("{s:O}", "name", nm);
            if (json_is_string(desc)) json_object_set(fn, "description", desc);
            if (json_is_object(params)) json_object_set(fn, "parameters", params);
            json_array_append_new(tools, json_pack("{s:s, s:o}", "type", "function", "function", fn));
        }
    }
    if ((v = get(b, "tool_choice"))) {
        if (json_is_string(v)) {
            json_object_set(chat, "tool_choice", v);
        } else if (json_is_object(v)) {
            const char *type = json_string_value(json_object_get(v, "type"));
            const char *name = json_string_value(json_object_get(v, "name"));
            if (!type || strcmp(type, "function"))
                return srv_error(rs, 400, NULL, "tool_choice", "tool_choice.type: '%s' is not supported (\"function\" "
                                 "with a name, or \"none\", \"auto\", \"required\")", type ? type : "(missing)"), -1;
            if (!name) return srv_error(rs, 400, NULL, "tool_choice", "tool_choice.name: expected a string"), -1;
            json_object_set_new(chat, "tool_choice", json_pack("{s:s, s:{s:s}}", "type", "function", "function", "name", name));
        } else {
            return srv_error(rs, 400, NULL, "tool_choice", "tool_choice: expected a string or an object"), -1;
        }
    }
    return 0;
}

/* The conversation's items (previous response, then input), normalized. 0, or rs filled. */
static int gather_items(rctx *cx, json_t *b, srv_resp *rs) {
    cx->items_all = json_array();
    cx->input_items = json_array();
    json_t *prev = get(b, "previous_response_id");
    if (prev) {
        if (!json_is_string(prev))
            return srv_error(rs, 400, NULL, "previous_response_id", "previous_response_id: expected a string"), -1;
        char *text = NULL;
        if (rstore_get(cx->sv->rstore, json_string_value(prev), RSTORE_ITEMS, &text) || !text) {
            free(text);
            return srv_error(rs, 400, NULL, "previous_response_id", "previous_response_id: no stored response '%s' "
                             "(never stored, deleted, or evicted from the --responses-store-mb budget)",
                             json_string_value(prev)), -1;
        }
        json_t *items = json_loads(text, 0, NULL);
        free(text);
        if (json_is_array(items)) json_array_extend(cx->items_all, items);
        json_decref(items);
    }
    json_t *in = get(b, "input");
    if (!in && !prev) return srv_error(rs, 400, NULL, "input", "input: required"), -1;
    if (in && json_is_string(in)) {
        json_array_append_new(cx->input_items, json_pack("{s:s, s:s, s:[{s:s, s:O}]}", "type", "message", "role", "user",
                                                         "content", "type", "input_text", "text", in));
    } else if (in && json_is_array(in)) {
        for (size_t i = 0; i < json_array_size(in); i++) {
            json_t *it = json_array_get(in, i);
            if (!json_is_object(it)) return srv_error(rs, 400, NULL, "input", "input[%zu]: expected an object", i), -1;
            json_array_append_new(cx->input_items, json_incref(it));
        }
    } else if (in) {
        return srv_error(rs, 400, NULL, "input", "input: expected a string or an array of input items"), -1;
    }
    /* validate the new items where they came from (their paths), then normalize */
    conv cv = {json_array(), {0}, 0};
    buf_init(&cv.reasoning);
    for (size_t i = 0; i < json_array_size(cx->input_items); i++) {
        char path[32];
        snprintf(path, sizeof path, "input[%zu]", i);
        if (item_to_msgs(&cv, json_array_get(cx->input_items, i), path, rs)) {
            json_decref(cv.msgs);
            buf_free(&cv.reasoning);
            return -1;
        }
    }
    json_decref(cv.msgs);
    buf_free(&cv.reasoning);
    for (size_t i = 0; i < json_array_size(cx->input_items); i++) {
        json_t *n = normalize_item(json_array_get(cx->input_items, i));
        json_array_set_new(cx->input_items, i, n);
        json_array_append(cx->items_all, n);
    }
    return 0;
}

/* Chat messages: instructions, then the conversation's items from `first`. */
static json_t *messages_from(rctx *cx, size_t first, srv_resp *rs) {
    conv cv = {json_array(), {0}, 0};
    buf_init(&cv.reasoning);
    json_t *ins = get(cx->body, "instructions");
    if (ins) json_array_append_new(cv.msgs, json_pack("{s:s, s:O}", "role", "system", "content", ins));
    for (size_t i = first; i < json_array_size(cx->items_all); i++) {
        char path[32];
        snprintf(path, sizeof path, "input[%zu]", i);
        if (item_to_msgs(&cv, json_array_get(cx->items_all, i), path, rs)) {
            json_decref(cv.msgs);
            cv.msgs = NULL;
            break;
        }
    }
    buf_free(&cv.reasoning);
    return cv.msgs;
}

/* ---- background ------------------------------------------------------------------------ */

/* A background response runs on a thread of its own that feeds the engine's events through
 * the same output items, keeps an in-progress snapshot in the store (every 64 events or half a
 * second) and the final response at the end; POST .../cancel asks it to stop. The jobs are
 * listed here so that cancel finds them and the server's shutdown waits for them. */
typedef struct bgjob {
    struct bgjob *next;
    char id[48];
    srv *sv;
    rctx *cx;
    gen *g;
    volatile int cancel;
    int done;
} bgjob;

static pthread_mutex_t bg_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t bg_cv = PTHREAD_COND_INITIALIZER;
static bgjob *bg_jobs;

static void store_snapshot(rctx *cx) {
    json_t *resp = response_json(cx);
    char *texts[RSTORE_NTEXT];
    texts[RSTORE_RESPONSE] = json_dumps(resp, JSON_COMPACT);
    texts[RSTORE_ITEMS] = json_dumps(cx->items_all, JSON_COMPACT);
    texts[RSTORE_INPUT] = json_dumps(cx->input_items, JSON_COMPACT);
    json_decref(resp);
    rstore_put(cx->sv->rstore, cx->id, texts);
    for (int i = 0; i < RSTORE_NTEXT; i++) free(texts[i]);
}

static void *bg_main(void *p) {
    bgjob *job = p;
    rctx *cx = job->cx;
    double last = now_sec();
    int since = 0, cancelled = 0;
    for (;;) {
        gen_event ev;
        int rc = gen_next(job->g, &ev, 0.05);
        if (rc < 0) break;
        if (rc == 1) {
            feed(cx, &ev);
            gen_event_free(&ev);
            since++;
        }
        if (!cancelled && (job->cancel || job->sv->stopping)) {
            gen_cancel(job->g);
            cancelled = 1;
        }
        if (!cx->finished && (since >= 64 || now_sec() - last > 0.5)) {
            store_snapshot(cx);
            since = 0;
            last = now_sec();
        }
    }
    gen_release(job->g);
    json_decref(finish_response(cx));
    pthread_mutex_lock(&bg_mu);
    bgjob **pp = &bg_jobs;
    while (*pp != job) pp = &(*pp)->next;
    *pp = job->next;
    pthread_cond_broadcast(&bg_cv);
    pthread_mutex_unlock(&bg_mu);
    rctx_free(cx);
    free(job);
    return NULL;
}

/* Start cx's generation in the background; rs gets the first snapshot. 0, or -1 with rs filled. */
static int bg_start(srv *sv, rctx *cx, srv_resp *rs) {
    gen *g;
    char err[512] = "";
    cx->r.n = 1;
    int rc = gen_start(sv, &cx->r, &g, err, sizeof err);
    if (rc) {
        srv_submit_error(rs, rc, err);
        return -1;
    }
    bgjob *job = xcalloc(1, sizeof *job);
    snprintf(job->id, sizeof job->id, "%s", cx->id);
    job->sv = sv;
    job->cx = cx;
    job->g = g;
    store_snapshot(cx);
    srv_json_resp(rs, 200, response_json(cx));
    pthread_mutex_lock(&bg_mu);
    job->next = bg_jobs;
    bg_jobs = job;
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &at, bg_main, job)) {
        bg_jobs = job->next;
        pthread_mutex_unlock(&bg_mu);
        pthread_attr_destroy(&at);
        gen_release(g);
        free(job);
        srv_error(rs, 503, NULL, NULL, "cannot start a background response: no thread");
        return -1;
    }
    pthread_attr_destroy(&at);
    pthread_mutex_unlock(&bg_mu);
    return 0;
}

/* POST /v1/responses/{id}/cancel on a running job: ask it to stop, wait for its final
 * response (up to 10 s). 1 = was running (rs filled), 0 = no such job. */
static int bg_cancel(srv *sv, const char *id, srv_resp *rs) {
    pthread_mutex_lock(&bg_mu);
    bgjob *job = bg_jobs;
    while (job && strcmp(job->id, id)) job = job->next;
    if (!job) { pthread_mutex_unlock(&bg_mu); return 0; }
    job->cancel = 1;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 10;
    for (;;) {
        bgjob *j = bg_jobs;
        while (j && j != job) j = j->next;
        if (!j || pthread_cond_timedwait(&bg_cv, &bg_mu, &ts)) break;
    }
    pthread_mutex_unlock(&bg_mu);
    char *text = NULL;
    if (rstore_get(sv->rstore, id, RSTORE_RESPONSE, &text) || !text) {
        free(text);
        srv_error(rs, 404, "not_found_error", "response_id", "No response found with id '%s'.", id);
        return 1;
    }
    srv_json_resp(rs, 200, json_loads(text, 0, NULL));
    free(text);
    return 1;
}

void responses_shutdown(srv *sv) {
    (void)sv; /* sv->stopping is set: every job cancels its generation and ends */
    pthread_mutex_lock(&bg_mu);
    while (bg_jobs) pthread_cond_wait(&bg_cv, &bg_mu);
    pthread_mutex_unlock(&bg_mu);
}

/* Chat fields -> this API's, in errors. */
static const char *const NAMES[] = {"messages", "input", "max_tokens", "max_output_tokens", "response_format", "text",
                                    "reasoning_effort", "reasoning", NULL};

/* count: POST /v1/responses/input_tokens, the prompt's length only. */
static void resp_create(srv *sv, srv_conn *c, const char *body, size_t len, int count, srv_resp *rs) {
    rctx *cx = xcalloc(1, sizeof *cx);
    cx->sv = sv;
    cx->cur = -1;
    json_t *chat = json_object();
    if (!(cx->body = srv_load_body(body, len, rs))) goto fail;
    json_t *b = cx->body, *ins = get(b, "instructions");
    if (ins && !json_is_string(ins)) { srv_error(rs, 400, NULL, "instructions", "instructions: expected a string"); goto fail; }
    if (build_chat(cx, b, chat, rs) || gather_items(cx, b, rs)) goto fail;

    /* truncation "auto": the oldest items go until the prompt fits */
    int autotrunc = json_is_string(get(b, "truncation")) && !strcmp(json_string_value(get(b, "truncation")), "auto");
    srv_req *r = &cx->r;
    for (size_t first = 0;; first++) {
        json_t *msgs = messages_from(cx, first, rs);
        if (!msgs) goto fail;
        if (!json_array_size(msgs)) {
            json_decref(msgs);
            srv_error(rs, 400, NULL, "input", "input: the conversation has no messages");
            goto fail;
        }
        json_object_set_new(chat, "messages", msgs);
        if (srv_chat_translated(sv, r, chat, NAMES, rs)) goto fail;
        if (r->rf_kind == RF_JSON_SCHEMA) r->rf_path = "text.format.schema";
        int ctx = sv->info.context_length, n = r->prompts[0].n;
        int fits = ctx <= 0 || ((long long)n + (r->has_max_tokens ? r->s.max_tokens : 1) <= ctx && n < ctx);
        if (fits || !autotrunc || first + 1 >= json_array_size(cx->items_all)) break;
    }
    if (count) {
        srv_json_resp(rs, 200, json_pack("{s:s, s:i}", "object", "response.input_tokens", "input_tokens", r->prompts[0].n));
        goto fail;
    }
    int use_rp, use_tp, force;
    if (srv_chat_ready(sv, r, rs, &use_rp, &use_tp, &force)) goto fail;
    srv_split_init(&cx->split, use_rp, force, use_tp, sv->cfg.tool_parser, r->tools, cx->max_tool_calls, &SPLIT_CB, cx);
    cx->split_on = 1;
    if (cx->logprobs) { cx->lp_all = json_array(); cx->lp_pending = json_array(); }
    srv_random_id(cx->id, sizeof cx->id, "resp_");
    cx->created_at = (json_int_t)time(NULL);
    json_decref(chat);
    chat = NULL;
    if (cx->background) {
        if (bg_start(sv, cx, rs)) goto fail;
        return; /* the job owns cx */
    }
    int rc = srv_run_one(sv, c, r, cx->stream, cx, feed, resp_step, resp_end, rctx_free, rs);
    if (rc == 1) return;
    if (rc == 0) srv_json_resp(rs, 200, finish_response(cx));
fail:
    json_decref(chat);
    rctx_free(cx);
}

/* ---- stored responses -------------------------------------------------------------------- */

static void not_found(srv_resp *rs, const char *id) {
    srv_error(rs, 404, "not_found_error", "response_id", "No response found with id '%s' (never stored, deleted, or "
              "evicted from the --responses-store-mb budget).", id);
}

static void resp_input_items(srv *sv, srv_conn *c, const char *id, srv_resp *rs) {
    char *text = NULL;
    if (rstore_get(sv->rstore, id, RSTORE_INPUT, &text)) { not_found(rs, id); return; }
    json_t *items = json_loads(text ? text : "[]", 0, NULL);
    free(text);
    const char *order = srv_conn_query(c, "order"), *after = srv_conn_query(c, "after");
    const char *lim = srv_conn_query(c, "limit");
    long limit = 20;
    if (lim) {
        char *end;
        limit = strtol(lim, &end, 10);
        if (!*lim || *end || limit < 1 || limit > 100) {
            json_decref(items);
            srv_error(rs, 400, NULL, "limit", "limit: expected an integer between 1 and 100, got '%s'", lim);
            return;
        }
    }
    if (order && strcmp(order, "asc") && strcmp(order, "desc")) {
        json_decref(items);
        srv_error(rs, 400, NULL, "order", "order: expected asc or desc, got '%s'", order);
        return;
    }
    int desc = !order || !strcmp(order, "desc");
    long n = (long)json_array_size(items), start = 0;
    if (after) {
        long k = -1;
        for (long i = 0; i < n; i++)
        {
            const char *iid = json_string_value(json_object_get(json_array_get(items, desc ? n - 1 - i : i), "id"));
            if (iid && !strcmp(iid, after)) k = i;
        }
        if (k < 0) {
            json_decref(items);
            srv_error(rs, 400, NULL, "after", "after: no input item '%s' in response '%s'", after, id);
            return;
        }
        start = k + 1;
    }
    json_t *data = json_array();
    for (long i = start; i < n && i < start + limit; i++)
        json_array_append(data, json_array_get(items, desc ? n - 1 - i : i));
    size_t dn = json_array_size(data);
    json_t *o = json_pack("{s:s, s:o, s:b}", "object", "list", "data", data, "has_more", start + limit < n);
    json_object_set(o, "first_id", dn ? json_object_get(json_array_get(data, 0), "id") : json_null());
    json_object_set(o, "last_id", dn ? json_object_get(json_array_get(data, dn - 1), "id") : json_null());
    json_decref(items);
    srv_json_resp(rs, 200, o);
}

void route_responses(srv *sv, srv_conn *c, const char *method, const char *rest, const char *body, size_t len,
                     srv_resp *rs) {
    int get_m = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    int del = !strcmp(method, "DELETE");
    if (!rest) { resp_create(sv, c, body, len, 0, rs); return; }
    if (!strcmp(rest, "input_tokens")) {
        if (!post) { srv_error(rs, 405, NULL, NULL, "method %s is not allowed on /v1/responses/input_tokens", method); return; }
        resp_create(sv, c, body, len, 1, rs);
        return;
    }
    char id[160];
    size_t k = strcspn(rest, "/");
    if (!k || k >= sizeof id) { srv_error(rs, 404, NULL, NULL, "no route for %s /v1/responses/%s", method, rest); return; }
    memcpy(id, rest, k);
    id[k] = 0;
    const char *sub = rest + k;
    if (!*sub) {
        if (get_m) {
            char *text = NULL;
            if (rstore_get(sv->rstore, id, RSTORE_RESPONSE, &text) || !text) { free(text); not_found(rs, id); return; }
            srv_json_resp(rs, 200, json_loads(text, 0, NULL));
            free(text);
        } else if (del) {
            pthread_mutex_lock(&bg_mu);
            bgjob *job = bg_jobs;
            while (job && strcmp(job->id, id)) job = job->next;
            pthread_mutex_unlock(&bg_mu);
            if (job) {
                srv_error(rs, 400, NULL, "response_id", "'%s' is still running in the background: cancel it first", id);
                return;
            }
            if (rstore_delete(sv->rstore, id)) { not_found(rs, id); return; }
            srv_json_resp(rs, 200, json_pack("{s:s, s:s, s:b}", "id", id, "object", "response.deleted", "deleted", 1));
        } else {
            srv_error(rs, 405, NULL, NULL, "method %s is not allowed on /v1/responses/{id}", method);
        }
        return;
    }
    if (!strcmp(sub, "/input_items")) {
        if (!get_m) { srv_error(rs, 405, NULL, NULL, "method %s is not allowed on /v1/responses/{id}/input_items", method); return; }
        resp_input_items(sv, c, id, rs);
        return;
    }
    if (!strcmp(sub, "/cancel")) {
        if (!post) { srv_error(rs, 405, NULL, NULL, "method %s is not allowed on /v1/responses/{id}/cancel", method); return; }
        if (bg_cancel(sv, id, rs)) return;
        char *text = NULL;
        if (rstore_get(sv->rstore, id, RSTORE_RESPONSE, &text)) { not_found(rs, id); return; }
        free(text);
        srv_error(rs, 400, NULL, "response_id", "Only running background responses can be cancelled; '%s' has finished.",
                  id);
        return;
    }
    srv_error(rs, 404, NULL, NULL, "no route for %s /v1/responses/%s", method, rest);
}
