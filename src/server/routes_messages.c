/* routes_messages.c: the Anthropic Messages API, for clients built on Anthropic's SDK.
 *
 *   POST /v1/messages                 create (streamed or not)
 *   POST /v1/messages/count_tokens    {"input_tokens": N} of the rendered prompt
 *
 * A request becomes a chat request: `system` a system message; user turns'
 * text blocks user messages and their tool_result blocks tool messages (in
 * block order); assistant turns' thinking, text and tool_use blocks one
 * assistant message (reasoning_content, content, tool_calls);
 * max_tokens (required), stop_sequences, temperature, top_p, top_k, custom
 * tools (input_schema), tool_choice (auto, any, tool, none;
 * disable_parallel_tool_use keeps one call) and thinking (enabled / disabled:
 * the template's enable_thinking) map onto the chat fields; req.c validates.
 *
 * Output, through the same streaming parsers event by event in both modes: a
 * thinking block (signature ""), a text block and tool_use blocks (input: the
 * call's typed arguments), in the order the model wrote them; stop_reason
 * end_turn, max_tokens, stop_sequence (with the string) or tool_use. Streaming
 * sends message_start, content_block_start / _delta (text_delta,
 * thinking_delta, input_json_delta) / _stop, message_delta and message_stop.
 * Errors have Anthropic's shape {"type": "error", "error": {"type", "message"}}.
 * Not supported, with a 400 naming the field: image and document blocks,
 * server tools and Anthropic-defined tool types, MCP servers, containers.
 */
#include "server/server.h"
#include "server/routes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *get(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_null(v) ? NULL : v;
}

/* The route's errors in Anthropic's shape (srv_error writes OpenAI's). */
void srv_anthropic_error(srv_resp *rs) {
    if (rs->status < 400 || rs->stream_fn) return;
    json_t *o = json_loadb(rs->body.data ? rs->body.data : "", rs->body.len, 0, NULL);
    const char *msg = json_string_value(json_object_get(json_object_get(o, "error"), "message"));
    const char *type = rs->status == 401 ? "authentication_error" : rs->status == 404 ? "not_found_error"
                     : rs->status == 413 ? "request_too_large" : rs->status == 429 ? "rate_limit_error"
                     : rs->status == 503 ? "overloaded_error" : rs->status >= 500 ? "api_error"
                     : "invalid_request_error";
    json_t *e = json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", type, "message", msg ? msg : "error");
    json_decref(o);
    srv_json_resp(rs, rs->status, e);
}

/* ---- request -> chat ---------------------------------------------------------------- */

/* Text of a string or an array of text blocks (path names it). New string, or NULL with rs filled. */
static json_t *blocks_text(json_t *v, const char *path, srv_resp *rs) {
    if (json_is_string(v)) return json_incref(v);
    if (!json_is_array(v)) {
        srv_error(rs, 400, NULL, "messages", "%s: expected a string or an array of text blocks", path);
        return NULL;
    }
    buf t; buf_init(&t);
    for (size_t j = 0; j < json_array_size(v); j++) {
        json_t *b = json_array_get(v, j);
        const char *type = json_string_value(json_object_get(b, "type"));
        const char *txt = json_string_value(json_object_get(b, "text"));
        if (!type || strcmp(type, "text") || !txt) {
            buf_free(&t);
            srv_error(rs, 400, NULL, "messages", "%s[%zu]: expected a text block ('%s' is not supported here)", path, j,
                      type ? type : "(missing)");
            return NULL;
        }
        if (j) buf_putc(&t, '\n');
        buf_puts(&t, txt);
    }
    json_t *s = json_stringn(t.data ? t.data : "", t.len);
    buf_free(&t);
    return s;
}

static void flush_user(json_t *msgs, buf *text, int *has) {
    if (!*has) return;
    json_array_append_new(msgs, json_pack("{s:s, s:s%}", "role", "user", "content", text->data ? text->data : "",
                                          text->len));
    text->len = 0;
    *has = 0;
}

/* One message of the request into chat messages. 0, or rs filled. */
static int message_to_chat(json_t *m, size_t i, json_t *msgs, srv_resp *rs) {
    char path[64];
    snprintf(path, sizeof path, "messages[%zu]", i);
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!json_is_object(m) || !role || (strcmp(role, "user") && strcmp(role, "assistant")))
        return srv_error(rs, 400, NULL, "messages", "%s.role: expected \"user\" or \"assistant\"", path), -1;
    json_t *content = json_object_get(m, "content");
    if (json_is_string(content)) {
        json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", role, "content", content));
        return 0;
    }
    if (!json_is_array(content))
        return srv_error(rs, 400, NULL, "messages", "%s.content: expected a string or an array of content blocks", path), -1;
    int user = !strcmp(role, "user");
    buf text, reasoning;
    buf_init(&text); buf_init(&reasoning);
    int has_text = 0, has_reasoning = 0, rc = 0;
    json_t *calls = json_array();
    for (size_t j = 0; j < json_array_size(content) && !rc; j++) {
        json_t *b = json_array_get(content, j);
        const char *type = json_string_value(json_object_get(b, "type"));
        char bp[96];
        snprintf(bp, sizeof bp, "%s.content[%zu]", path, j);
        if (!type) { rc = -1; srv_error(rs, 400, NULL, "messages", "%s.type: expected a string", bp); break; }
        if (!strcmp(type, "text")) {
            const char *t = json_string_value(json_object_get(b, "text"));
            if (!t) { rc = -1; srv_error(rs, 400, NULL, "messages", "%s.text: expected a string", bp); break; }
            if (has_text) buf_putc(&text, '\n');
            buf_puts(&text, t);
            has_text = 1;
        } else if (user && !strcmp(type, "tool_result")) {
            const char *id = json_string_value(json_object_get(b, "tool_use_id"));
            if (!id) { rc = -1; srv_error(rs, 400, NULL, "messages", "%s.tool_use_id: expected a string", bp); break; }
            json_t *c = get(b, "content");
            char cp[112];
            snprintf(cp, sizeof cp, "%s.content", bp);
            json_t *t = c ? blocks_text(c, cp, rs) : json_string("");
            if (!t) { rc = -1; break; }
            flush_user(msgs, &text, &has_text); /* the blocks' order is kept */
            json_array_append_new(msgs, json_pack("{s:s, s:s, s:o}", "role", "tool", "tool_call_id", id, "content", t));
        } else if (!user && !strcmp(type, "tool_use")) {
            const char *id = json_string_value(json_object_get(b, "id"));
            const char *name = json_string_value(json_object_get(b, "name"));
            json_t *input = json_object_get(b, "input");
            if (!id || !name || !json_is_object(input)) {
                rc = -1;
                srv_error(rs, 400, NULL, "messages", "%s: a tool_use block needs id, name and an input object", bp);
                break;
            }
            char *args = json_dumps(input, JSON_COMPACT);
            json_array_append_new(calls, json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function",
                                                   "name", name, "arguments", args));
            free(args);
        } else if (!user && (!strcmp(type, "thinking") || !strcmp(type, "redacted_thinking"))) {
            const char *t = json_string_value(json_object_get(b, "thinking"));
            if (t) { buf_puts(&reasoning, t); has_reasoning = 1; }
        } else {
            rc = -1;
            srv_error(rs, 400, NULL, "messages", "%s.type: '%s' is not supported in a%s turn (%s)", bp, type,
                      user ? " user" : "n assistant", user ? "text and tool_result" : "text, thinking and tool_use");
        }
    }
    if (!rc && user) {
        flush_user(msgs, &text, &has_text);
    } else if (!rc) {
        json_t *a = json_pack("{s:s, s:s%}", "role", "assistant", "content", text.data ? text.data : "", text.len);
        if (has_reasoning) json_object_set_new(a, "reasoning_content", json_stringn(reasoning.data ? reasoning.data : "",
                                                                                    reasoning.len));
        if (json_array_size(calls)) json_object_set(a, "tool_calls", calls);
        json_array_append_new(msgs, a);
    }
    json_decref(calls);
    buf_free(&text);
    buf_free(&reasoning);
    return rc;
}

static const char *const NAMES[] = {"stop", "stop_sequences", NULL};

/* The chat body for an Anthropic body (count: for count_tokens, max_tokens optional). */
static int build_chat(json_t *b, json_t *chat, int count, int *max_calls, srv_resp *rs) {
    json_t *v;
    v = get(b, "max_tokens");
    if (!count && !v) return srv_error(rs, 400, NULL, "max_tokens", "max_tokens: required"), -1;
    if (v) json_object_set(chat, "max_tokens", v);
    json_t *msgs = json_array();
    json_object_set_new(chat, "messages", msgs);
    if ((v = get(b, "system"))) {
        json_t *t = blocks_text(v, "system", rs);
        if (!t) return -1;
        json_array_append_new(msgs, json_pack("{s:s, s:o}", "role", "system", "content", t));
    }
    json_t *in = get(b, "messages");
    if (!json_is_array(in) || !json_array_size(in))
        return srv_error(rs, 400, NULL, "messages", "messages: expected a non-empty array of messages"), -1;
    for (size_t i = 0; i < json_array_size(in); i++)
        if (message_to_chat(json_array_get(in, i), i, msgs, rs)) return -1;
    if ((v = get(b, "stop_sequences"))) {
        if (!json_is_array(v)) return srv_error(rs, 400, NULL, "stop_sequences", "stop_sequences: expected an array of strings"), -1;
        json_object_set(chat, "stop", v);
    }
    static const char *same[] = {"model", "temperature", "top_p", "top_k", "stream", "force_ids"};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        if ((v = json_object_get(b, same[i]))) json_object_set(chat, same[i], v);
    if ((v = get(b, "thinking"))) {
        const char *t = json_string_value(json_object_get(v, "type"));
        if (!t || (strcmp(t, "enabled") && strcmp(t, "disabled") && strcmp(t, "adaptive")))
            return srv_error(rs, 400, NULL, "thinking", "thinking.type: expected enabled, disabled or adaptive"), -1;
        if (strcmp(t, "adaptive"))
            json_object_set_new(chat, "chat_template_kwargs", json_pack("{s:b}", "enable_thinking", !strcmp(t, "enabled")));
    }
    if ((v = get(b, "tools"))) {
        if (!json_is_array(v)) return srv_error(rs, 400, NULL, "tools", "tools: expected an array"), -1;
        json_t *tools = json_array();
        json_object_set_new(chat, "tools", tools);
        for (size_t i = 0; i < json_array_size(v); i++) {
            json_t *t = json_array_get(v, i);
            const char *type = json_string_value(json_object_get(t, "type"));
            if (!json_is_object(t)) return srv_error(rs, 400, NULL, "tools", "tools[%zu]: expected an object", i), -1;
            if (type && strcmp(type, "custom"))
                return srv_error(rs, 400, NULL, "tools", "tools[%zu].type: '%s' is not supported (custom tools with an "
                                 "input_schema only)", i, type), -1;
            json_t *nm = json_object_get(t, "name"), *schema = json_object_get(t, "input_schema");
            json_t *desc = get(t, "description");
            if (!json_is_string(nm)) return srv_error(rs, 400, NULL, "tools", "tools[%zu].name: expected a string", i), -1;
            if (!json_is_object(schema))
                return srv_error(rs, 400, NULL, "tools", "tools[%zu].input_schema: expected a JSON schema object", i), -1;
            json_t *fn = json_pack("{s:O, s:O}", "name", nm, "parameters", schema);
            if (json_is_string(desc)) json_object_set(fn, "description", desc);
            json_array_append_new(tools, json_pack("{s:s, s:o}", "type", "function", "function", fn));
        }
    }
    if ((v = get(b, "tool_choice"))) {
        const char *t = json_string_value(json_object_get(v, "type"));
        if (!t) return srv_error(rs, 400, NULL, "tool_choice", "tool_choice.type: expected auto, any, tool or none"), -1;
        if (!strcmp(t, "auto") || !strcmp(t, "none")) json_object_set_new(chat, "tool_choice", json_string(t));
        else if (!strcmp(t, "any")) json_object_set_new(chat, "tool_choice", json_string("required"));
        else if (!strcmp(t, "tool")) {
            const char *name = json_string_value(json_object_get(v, "name"));
            if (!name) return srv_error(rs, 400, NULL, "tool_choice", "tool_choice.name: expected a string"), -1;
            json_object_set_new(chat, "tool_choice", json_pack("{s:s, s:{s:s}}", "type", "function", "function", "name", name));
        } else {
            return srv_error(rs, 400, NULL, "tool_choice", "tool_choice.type: expected auto, any, tool or none, got '%s'", t), -1;
        }
        if (json_is_true(get(v, "disable_parallel_tool_use"))) *max_calls = 1;
    }
    static const char *refused[] = {"mcp_servers", "container", "context_management"};
    for (size_t i = 0; i < 3; i++)
        if (get(b, refused[i]))
            return srv_error(rs, 400, NULL, refused[i], "%s: not supported by this server", refused[i]), -1;
    return 0;
}

/* ---- output --------------------------------------------------------------------------- */

enum { B_THINK = 1, B_TEXT = 2, B_TOOL = 3 };

typedef struct mblock {
    int kind;
    char id[48];
    char *name;
    buf text;
} mblock;

typedef struct mctx {
    srv *sv;
    srv_req r;
    json_t *body;
    char id[48];
    int max_calls;
    srv_split split;
    int split_on;
    mblock *b; int nb, capb;
    int cur;
    int started, finished;
    char finish[16];
    char *matched_stop, *error;
    int prompt_tokens, completion_tokens, cached_tokens;
    buf *out;
} mctx;

static void mctx_free(void *p) {
    mctx *cx = p;
    json_decref(cx->body);
    if (cx->split_on) srv_split_free(&cx->split);
    for (int i = 0; i < cx->nb; i++) { free(cx->b[i].name); buf_free(&cx->b[i].text); }
    free(cx->b);
    free(cx->matched_stop);
    free(cx->error);
    req_free(&cx->r);
    free(cx);
}

static void emit(mctx *cx, const char *type, json_t *ev) {
    if (!cx->out) { json_decref(ev); return; }
    sse_json_event(cx->out, type, ev);
}

static json_t *block_json(const mblock *b, int final) {
    const char *t = b->text.data ? b->text.data : "";
    if (b->kind == B_THINK)
        return json_pack("{s:s, s:o, s:s}", "type", "thinking", "thinking", final ? srv_jstr(t, b->text.len) : json_string(""),
                         "signature", "");
    if (b->kind == B_TEXT)
        return json_pack("{s:s, s:o}", "type", "text", "text", final ? srv_jstr(t, b->text.len) : json_string(""));
    json_t *input = final ? json_loadb(t, b->text.len, 0, NULL) : NULL;
    if (!json_is_object(input)) { json_decref(input); input = json_object(); }
    json_t *o = json_pack("{s:s, s:s, s:o}", "type", "tool_use", "id", b->id, "input", input);
    json_object_set_new(o, "name", srv_jstr(b->name, strlen(b->name)));
    return o;
}

static void close_block(mctx *cx) {
    if (cx->cur < 0) return;
    emit(cx, "content_block_stop", json_pack("{s:i}", "index", cx->cur));
    cx->cur = -1;
}

static mblock *open_block(mctx *cx, int kind) {
    close_block(cx);
    if (cx->nb == cx->capb) {
        cx->capb = cx->capb ? 2 * cx->capb : 4;
        cx->b = xrealloc(cx->b, cx->capb * sizeof *cx->b);
    }
    mblock *b = &cx->b[cx->nb];
    memset(b, 0, sizeof *b);
    buf_init(&b->text);
    b->kind = kind;
    cx->cur = cx->nb++;
    return b;
}

static void delta(mctx *cx, int kind, const char *s, size_t n) {
    mblock *b = cx->cur >= 0 && cx->b[cx->cur].kind == kind ? &cx->b[cx->cur] : NULL;
    if (!b) {
        b = open_block(cx, kind);
        emit(cx, "content_block_start", json_pack("{s:i, s:o}", "index", cx->cur, "content_block", block_json(b, 0)));
    }
    buf_append(&b->text, s, n);
    emit(cx, "content_block_delta",
         json_pack("{s:i, s:{s:s, s:o}}", "index", cx->cur, "delta", "type", kind == B_THINK ? "thinking_delta" : "text_delta",
                   kind == B_THINK ? "thinking" : "text", srv_jstr(s, n)));
}

static void on_reasoning(void *ctx, const char *s, size_t n) { delta(ctx, B_THINK, s, n); }

static void on_text(void *ctx, const char *s, size_t n) { delta(ctx, B_TEXT, s, n); }

static void on_call(void *ctx, const char *name) {
    mctx *cx = ctx;
    mblock *b = open_block(cx, B_TOOL);
    b->name = xstrdup(name);
    srv_random_id(b->id, sizeof b->id, "toolu_");
    emit(cx, "content_block_start", json_pack("{s:i, s:o}", "index", cx->cur, "content_block", block_json(b, 0)));
}

static void on_args(void *ctx, const char *s, size_t n) {
    mctx *cx = ctx;
    buf_append(&cx->b[cx->cur].text, s, n);
    emit(cx, "content_block_delta", json_pack("{s:i, s:{s:s, s:o}}", "index", cx->cur, "delta", "type", "input_json_delta",
                                              "partial_json", srv_jstr(s, n)));
}

static const srv_split_cb SPLIT_CB = {on_reasoning, on_text, on_call, on_args};

static json_t *usage_json(const mctx *cx) {
    return json_pack("{s:i, s:i, s:i, s:i}", "input_tokens", cx->prompt_tokens - cx->cached_tokens,
                     "cache_creation_input_tokens", 0, "cache_read_input_tokens", cx->cached_tokens, "output_tokens",
                     cx->completion_tokens);
}

static json_t *message_json(mctx *cx, int final) {
    json_t *content = json_array();
    for (int i = 0; final && i < cx->nb; i++) json_array_append_new(content, block_json(&cx->b[i], 1));
    json_t *o = json_pack("{s:s, s:s, s:s, s:o, s:n, s:n, s:o}", "id", cx->id, "type", "message", "role", "assistant",
                          "content", content, "stop_reason", "stop_sequence", "usage", usage_json(cx));
    json_object_set_new(o, "model", srv_jstr(cx->sv->cfg.served_model_name, strlen(cx->sv->cfg.served_model_name)));
    return o;
}

static const char *stop_reason(const mctx *cx) {
    if (!strcmp(cx->finish, "length")) return "max_tokens";
    if (cx->split.n_calls) return "tool_use";
    if (cx->matched_stop) return "stop_sequence";
    return "end_turn";
}

static void feed(void *ctx, const gen_event *ev) {
    mctx *cx = ctx;
    if (cx->finished) return;
    if (!cx->started) {
        cx->started = 1;
        cx->prompt_tokens = ev->prompt_tokens;
        cx->cached_tokens = ev->cached_tokens;
        emit(cx, "message_start", json_pack("{s:o}", "message", message_json(cx, 0)));
    }
    srv_split_feed(&cx->split, ev->text, ev->token, ev->finished);
    if (ev->finished) {
        cx->finished = 1;
        snprintf(cx->finish, sizeof cx->finish, "%s", ev->finish_reason[0] ? ev->finish_reason : "stop");
        if (ev->matched_stop) cx->matched_stop = xstrdup(ev->matched_stop);
        if (ev->error) cx->error = xstrdup(ev->error);
        cx->prompt_tokens = ev->prompt_tokens;
        cx->completion_tokens = ev->completion_tokens;
        cx->cached_tokens = ev->cached_tokens;
        close_block(cx);
    }
}

static int msg_step(void *ctx, const gen_event *ev, buf *out) {
    mctx *cx = ctx;
    cx->out = out;
    feed(cx, ev);
    int rc = 0;
    if (cx->finished && !strcmp(cx->finish, "error")) {
        const char *m = cx->error ? cx->error : "engine error";
        emit(cx, "error", json_pack("{s:{s:s, s:o}}", "error", "type", "api_error", "message", srv_jstr(m, strlen(m))));
        rc = -1;
    }
    cx->out = NULL;
    return rc;
}

static void msg_end(void *ctx, buf *out) {
    mctx *cx = ctx;
    cx->out = out;
    json_t *d = json_pack("{s:s, s:o}", "stop_reason", stop_reason(cx), "stop_sequence",
                          cx->matched_stop && strcmp(stop_reason(cx), "stop_sequence") == 0
                              ? srv_jstr(cx->matched_stop, strlen(cx->matched_stop)) : json_null());
    emit(cx, "message_delta", json_pack("{s:o, s:o}", "delta", d, "usage", usage_json(cx)));
    emit(cx, "message_stop", json_object());
    cx->out = NULL;
}

/* ---- routes ---------------------------------------------------------------------------- */

static void messages(srv *sv, srv_conn *c, const char *body, size_t len, int count, srv_resp *rs) {
    mctx *cx = xcalloc(1, sizeof *cx);
    cx->sv = sv;
    cx->cur = -1;
    json_t *chat = json_object();
    if (!(cx->body = srv_load_body(body, len, rs))) goto fail;
    if (build_chat(cx->body, chat, count, &cx->max_calls, rs) || srv_chat_translated(sv, &cx->r, chat, NAMES, rs))
        goto fail;
    json_decref(chat);
    chat = NULL;
    srv_req *r = &cx->r;
    if (count) {
        srv_json_resp(rs, 200, json_pack("{s:i}", "input_tokens", r->prompts[0].n));
        goto fail;
    }
    int use_rp, use_tp, force;
    if (srv_chat_ready(sv, r, rs, &use_rp, &use_tp, &force)) goto fail;
    srv_split_init(&cx->split, use_rp, force, use_tp, sv->cfg.tool_parser, r->tools, cx->max_calls, &SPLIT_CB, cx);
    cx->split_on = 1;
    srv_random_id(cx->id, sizeof cx->id, "msg_");
    int rc = srv_run_one(sv, c, r, r->stream, cx, feed, msg_step, msg_end, mctx_free, rs);
    if (rc == 1) return;
    if (rc < 0) goto fail;
    json_t *m = message_json(cx, 1);
    json_object_set_new(m, "stop_reason", json_string(stop_reason(cx)));
    if (!strcmp(stop_reason(cx), "stop_sequence"))
        json_object_set_new(m, "stop_sequence", srv_jstr(cx->matched_stop, strlen(cx->matched_stop)));
    srv_json_resp(rs, 200, m);
fail:
    json_decref(chat);
    mctx_free(cx);
    srv_anthropic_error(rs);
}

void route_messages(srv *sv, srv_conn *c, const char *rest, const char *body, size_t len, srv_resp *rs) {
    if (!rest) messages(sv, c, body, len, 0, rs);
    else if (!strcmp(rest, "count_tokens")) messages(sv, c, body, len, 1, rs);
    else {
        srv_error(rs, 404, NULL, NULL, "no route for POST /v1/messages/%s", rest);
        srv_anthropic_error(rs);
    }
}
