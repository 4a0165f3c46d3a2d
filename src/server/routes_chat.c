/* routes_chat.c: POST /v1/chat/completions.
 *
 * Flow: parse and validate the body (req.c), check the model name, render
 * the chat template through the engine (a template raise_exception is a 400
 * with its message), tokenize, check the prompt against the context, submit
 * n choices (gen.c), then either collect them into one chat.completion or
 * stream chat.completion.chunk events (sse.c).
 *
 * Model text goes through the reasoning parser first (when --reasoning-parser
 * is set, separate_reasoning is true and thinking is not switched off), then
 * the tool-call parser (when --tool-call-parser is set and the request has
 * tools with tool_choice "auto"). Streaming uses the incremental parsers, so
 * a stream reassembles to exactly the non-streamed message.
 * Chunk order per choice: a role chunk, then reasoning_content / content /
 * tool_calls deltas as they become final, then an empty delta with
 * finish_reason ("tool_calls" when calls were made and the model stopped);
 * with include_usage one more chunk with no choices and the usage.
 */
#include "server/server.h"
#include "server/routes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- per-choice parsing state ------------------------------------------------------- */

typedef struct chat_choice {
    int use_rp, use_tp;
    rp_state rp;
    tp_stream tp;
    int role_sent, n_calls;
    char (*call_ids)[32];
    int cap_ids;
    json_t *pending_lp;   /* logprob entries not yet attached to a chunk */
} chat_choice;

typedef struct chat_ctx {
    srv *sv;
    srv_req r;
    char id[48];
    json_int_t created;
    int force_reasoning, use_rp, use_tp;
    int n;
    chat_choice *ch;
    int usage_prompt, usage_completion, usage_cached;
    int cu_prompt, cu_completion;   /* the current event's counts (continuous_usage_stats) */
} chat_ctx;

static void chat_ctx_free(void *p) {
    chat_ctx *cx = p;
    for (int i = 0; i < cx->n; i++) {
        rp_free(&cx->ch[i].rp);
        tp_stream_free(&cx->ch[i].tp);
        free(cx->ch[i].call_ids);
        json_decref(cx->ch[i].pending_lp);
    }
    free(cx->ch);
    req_free(&cx->r);
    free(cx);
}

static const char *call_id(chat_choice *ch, int index) {
    while (index >= ch->cap_ids) {
        int cap = ch->cap_ids ? ch->cap_ids * 2 : 4;
        ch->call_ids = xrealloc(ch->call_ids, cap * sizeof *ch->call_ids);
        for (int i = ch->cap_ids; i < cap; i++) tp_call_id(ch->call_ids[i]);
        ch->cap_ids = cap;
    }
    return ch->call_ids[index];
}

/* ---- streaming ------------------------------------------------------------------ */

static void emit_chunk(chat_ctx *cx, buf *out, int index, json_t *delta, chat_choice *ch, const char *finish,
                       json_t *matched) {
    json_t *lp = json_null();
    if (ch->pending_lp && json_array_size(ch->pending_lp)) {
        json_decref(lp);
        lp = json_pack("{s:o}", "content", ch->pending_lp);
        ch->pending_lp = json_array();
    }
    json_t *choice = json_pack("{s:i, s:o, s:o, s:o}", "index", index, "delta", delta, "logprobs", lp,
                               "finish_reason", finish ? json_string(finish) : json_null());
    if (finish) json_object_set_new(choice, "matched_stop", matched ? matched : json_null());
    json_t *c = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", cx->id, "object", "chat.completion.chunk", "created",
                          cx->created, "model", cx->sv->cfg.served_model_name, "choices", choice);
    if (cx->r.continuous_usage) json_object_set_new(c, "usage", srv_usage(cx->cu_prompt, cx->cu_completion, 0));
    char *s = json_dumps(c, JSON_COMPACT);
    sse_data(out, s, strlen(s));
    free(s);
    json_decref(c);
}

static int chat_step(void *ctx, const gen_event *ev, buf *out) {
    chat_ctx *cx = ctx;
    int idx = ev->choice;
    chat_choice *ch = &cx->ch[idx];
    cx->cu_prompt = ev->prompt_tokens;
    cx->cu_completion = ev->completion_tokens;
    if (!ch->role_sent) {
        emit_chunk(cx, out, idx, json_pack("{s:s, s:s}", "role", "assistant", "content", ""), ch, NULL, NULL);
        ch->role_sent = 1;
    }
    if (ev->finished && !strcmp(ev->finish_reason, "error")) {
        sse_error_event(out, "server_error", 500, ev->error ? ev->error : "engine error");
        return -1;
    }
    if (ev->token >= 0 && cx->r.logprobs) json_array_append_new(ch->pending_lp, srv_chat_logprob(cx->sv, ev));
    buf reasoning, content;
    buf_init(&reasoning); buf_init(&content);
    tp_deltas d = {0};
    srv_parse_text(ch->use_rp ? &ch->rp : NULL, ch->use_tp ? &ch->tp : NULL, ev->text, strlen(ev->text), ev->finished,
                   &reasoning, &content, &d);
    if (reasoning.len)
        emit_chunk(cx, out, idx, json_pack("{s:o}", "reasoning_content", srv_jstr(reasoning.data, reasoning.len)), ch, NULL, NULL);
    if (content.len)
        emit_chunk(cx, out, idx, json_pack("{s:o}", "content", srv_jstr(content.data, content.len)), ch, NULL, NULL);
    for (int i = 0; i < d.n; i++) {
        tp_delta *x = &d.v[i];
        if (cx->r.one_call && x->index > 0) continue; /* parallel_tool_calls false: the first call only */
        json_t *call;
        if (x->name) {
            call = json_pack("{s:i, s:s, s:s, s:{s:o, s:s}}", "index", x->index, "id", call_id(ch, x->index), "type",
                             "function", "function", "name", srv_jstr(x->name, strlen(x->name)), "arguments", "");
            if (x->index + 1 > ch->n_calls) ch->n_calls = x->index + 1;
        } else {
            call = json_pack("{s:i, s:{s:o}}", "index", x->index, "function", "arguments", srv_jstr(x->args, strlen(x->args)));
        }
        emit_chunk(cx, out, idx, json_pack("{s:[o]}", "tool_calls", call), ch, NULL, NULL);
    }
    tp_deltas_free(&d);
    buf_free(&reasoning);
    buf_free(&content);
    if (ev->finished) {
        const char *fr = ev->finish_reason[0] ? ev->finish_reason : "stop";
        if (!strcmp(fr, "stop") && ch->n_calls) fr = "tool_calls";
        emit_chunk(cx, out, idx, json_object(), ch, fr, srv_matched_stop(ev->matched_stop, ev->matched_stop_id));
        if (idx % cx->r.n == 0) { cx->usage_prompt += ev->prompt_tokens; cx->usage_cached += ev->cached_tokens; }
        cx->usage_completion += ev->completion_tokens;
    }
    return 0;
}

static void chat_end(void *ctx, buf *out) {
    chat_ctx *cx = ctx;
    if (!cx->r.include_usage) return;
    json_t *c = json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", cx->id, "object", "chat.completion.chunk",
                          "created", cx->created, "model", cx->sv->cfg.served_model_name, "choices", "usage",
                          srv_usage(cx->usage_prompt, cx->usage_completion, cx->usage_cached));
    char *s = json_dumps(c, JSON_COMPACT);
    sse_data(out, s, strlen(s));
    free(s);
    json_decref(c);
}

/* ---- non-streamed ------------------------------------------------------------------ */

static json_t *chat_message(chat_ctx *cx, const char *text, const char *finish_in, const char **finish_out) {
    buf reasoning, rest, content;
    buf_init(&reasoning); buf_init(&rest); buf_init(&content);
    if (cx->use_rp) rp_parse(text, cx->force_reasoning, &reasoning, &rest);
    else buf_puts(&rest, text);
    tp_calls calls = {0};
    if (cx->use_tp) tp_parse(cx->sv->cfg.tool_parser, cx->r.tools, rest.data ? rest.data : "", &content, &calls);
    else buf_append(&content, rest.data ? rest.data : "", rest.len);
    json_t *m = json_pack("{s:s}", "role", "assistant");
    json_object_set_new(m, "content", content.len || !calls.n ? srv_jstr(content.data ? content.data : "", content.len) : json_null());
    json_object_set_new(m, "reasoning_content", cx->use_rp && reasoning.len ? srv_jstr(reasoning.data, reasoning.len) : json_null());
    if (calls.n) {
        json_t *tc = json_array();
        for (int i = 0; i < (cx->r.one_call ? 1 : calls.n); i++) {
            char id[32];
            tp_call_id(id);
            json_array_append_new(tc, json_pack("{s:s, s:s, s:{s:o, s:o}}", "id", id, "type", "function", "function",
                                                "name", srv_jstr(calls.v[i].name, strlen(calls.v[i].name)),
                                                "arguments", srv_jstr(calls.v[i].args, strlen(calls.v[i].args))));
        }
        json_object_set_new(m, "tool_calls", tc);
    }
    *finish_out = calls.n && !strcmp(finish_in, "stop") ? "tool_calls" : finish_in;
    tp_calls_free(&calls);
    buf_free(&reasoning); buf_free(&rest); buf_free(&content);
    return m;
}

void route_chat(srv *sv, srv_conn *c, const char *body, size_t len, srv_resp *rs) {
    chat_ctx *cx = xcalloc(1, sizeof *cx);
    cx->sv = sv;
    ls_err e = {0};
    char param[64];
    if (req_parse(&cx->r, SRV_CHAT, body, len, sv->cfg.allow_force_ids, &sv->cfg.sampling_defaults, param,
                  sizeof param, &e)) {
        srv_error(rs, 400, NULL, param, "%s", e.msg);
        goto fail;
    }
    srv_req *r = &cx->r;
    if (srv_check_model(sv, r, rs)) goto fail;
    if (srv_render_chat(sv, r, rs) || srv_chat_ready(sv, r, rs, &cx->use_rp, &cx->use_tp, &cx->force_reasoning))
        goto fail;
    srv_random_id(cx->id, sizeof cx->id, "chatcmpl-");
    cx->created = (json_int_t)time(NULL);

    gen *g;
    char err[512] = "";
    int rc;
    if ((rc = gen_start(sv, r, &g, err, sizeof err))) { srv_submit_error(rs, rc, err); goto fail; }
    int n = gen_choices(g);

    if (r->stream) {
        cx->n = n;
        cx->ch = xcalloc(n, sizeof *cx->ch);
        for (int i = 0; i < n; i++) {
            chat_choice *ch = &cx->ch[i];
            ch->use_rp = cx->use_rp;
            ch->use_tp = cx->use_tp;
            rp_init(&ch->rp, cx->force_reasoning, r->stream_reasoning);
            tp_stream_init(&ch->tp, sv->cfg.tool_parser, r->tools);
            if (r->logprobs) ch->pending_lp = json_array();
        }
        sse_start(rs, sv, c, g, cx, chat_step, chat_end, chat_ctx_free);
        return;
    }

    acc_choice *a;
    if (srv_collect(sv, c, g, r, &a, rs)) goto fail;
    json_t *choices = json_array();
    for (int i = 0; i < n; i++) {
        const char *fr;
        json_t *msg = chat_message(cx, a[i].text.data ? a[i].text.data : "", a[i].finish, &fr);
        json_t *lp = r->logprobs ? json_pack("{s:O}", "content", a[i].logprobs) : json_null();
        json_array_append_new(choices, json_pack("{s:i, s:o, s:o, s:s, s:o}", "index", i, "message", msg, "logprobs", lp,
                                                 "finish_reason", fr, "matched_stop",
                                                 srv_matched_stop(a[i].matched_stop, a[i].matched_stop_id)));
    }
    int up, uc, ucached;
    srv_usage_totals(a, n, r->n, &up, &uc, &ucached);
    acc_free(a, n);
    srv_json_resp(rs, 200, json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", cx->id, "object", "chat.completion",
                                     "created", cx->created, "model", sv->cfg.served_model_name, "choices", choices,
                                     "usage", srv_usage(up, uc, ucached)));
fail:
    chat_ctx_free(cx);
}
