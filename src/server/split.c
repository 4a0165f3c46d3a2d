/* split.c: one generation's streamed text as the typed parts that the
 * Responses and Messages APIs answer with: reasoning, text and tool calls
 * (name, then argument pieces), in the order the model wrote them.
 *
 * The text goes through the reasoning parser and then the tool-call parser
 * (srv_parse_text), event by event, so a streamed and a collected request
 * give the same parts. Two rules of these APIs on top of the parsers':
 * whitespace alone starts no text part (the "\n\n" between </think> and a
 * <tool_call> would otherwise be an empty message): it waits until text that
 * is not whitespace follows, a call drops it, and at the end it is the text
 * only when the model made no call; and calls beyond max_calls are dropped
 * whole. A token counts as a reasoning token when the reasoning parser was
 * inside reasoning before or after it, or it produced reasoning text.
 */
#include "server/server.h"
#include "server/routes.h"

#include <string.h>

void srv_split_init(srv_split *s, int use_rp, int force_reasoning, int use_tp, tp_kind kind, const json_t *tools,
                    int max_calls, const srv_split_cb *cb, void *ctx) {
    memset(s, 0, sizeof *s);
    s->use_rp = use_rp;
    s->use_tp = use_tp;
    s->max_calls = max_calls;
    s->cb = cb;
    s->ctx = ctx;
    s->cur_call = -1;
    rp_init(&s->rp, force_reasoning, 1);
    tp_stream_init(&s->tp, kind, tools);
    buf_init(&s->ws);
}

void srv_split_free(srv_split *s) {
    rp_free(&s->rp);
    tp_stream_free(&s->tp);
    buf_free(&s->ws);
}

static int all_space(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\n' && s[i] != '\t' && s[i] != '\r') return 0;
    return 1;
}

static void flush_ws(srv_split *s) {
    buf held = s->ws;
    buf_init(&s->ws);
    s->text_open = 1;
    s->cur_call = -1;
    s->cb->text(s->ctx, held.data ? held.data : "", held.len);
    buf_free(&held);
}

static void on_text(srv_split *s, const char *t, size_t n) {
    if (s->text_open) { s->cb->text(s->ctx, t, n); return; }
    buf_append(&s->ws, t, n);
    if (!all_space(s->ws.data, s->ws.len)) flush_ws(s);
}

static void on_call(srv_split *s, const tp_delta *d) {
    int k = d->index;
    if (k < 0 || k >= SRV_SPLIT_MAX_CALLS) return;
    if (d->name) {
        s->ws.len = 0;
        s->text_open = 0;
        s->cur_call = -1;
        if (s->max_calls && s->n_calls >= s->max_calls) return;
        s->n_calls++;
        s->cur_call = k;
        s->cb->call(s->ctx, d->name);
        return;
    }
    if (k == s->cur_call) s->cb->args(s->ctx, d->args, strlen(d->args));
}

void srv_split_feed(srv_split *s, const char *text, int token, int final) {
    int was_reasoning = s->use_rp && s->rp.in_reasoning;
    buf reasoning, content;
    buf_init(&reasoning); buf_init(&content);
    tp_deltas d = {0};
    srv_parse_text(s->use_rp ? &s->rp : NULL, s->use_tp ? &s->tp : NULL, text, strlen(text), final, &reasoning, &content,
                   &d);
    if (token >= 0 && (was_reasoning || reasoning.len || (s->use_rp && s->rp.in_reasoning))) s->reasoning_tokens++;
    if (reasoning.len) {
        s->text_open = 0;
        s->cur_call = -1; /* a later argument piece has no call to go to */
        s->cb->reasoning(s->ctx, reasoning.data, reasoning.len);
    }
    if (content.len) on_text(s, content.data, content.len);
    for (int i = 0; i < d.n; i++) on_call(s, &d.v[i]);
    if (final && s->ws.len && !s->n_calls) flush_ws(s); /* whitespace was all the model said */
    tp_deltas_free(&d);
    buf_free(&reasoning);
    buf_free(&content);
}

int srv_run_one(srv *sv, srv_conn *c, srv_req *r, int stream, void *ctx, void (*feed)(void *, const gen_event *),
                sse_step_fn step, sse_end_fn end, void (*ctx_free)(void *), srv_resp *rs) {
    gen *g;
    char err[512] = "";
    r->n = 1;
    int rc = gen_start(sv, r, &g, err, sizeof err);
    if (rc) {
        srv_submit_error(rs, rc, err);
        return -1;
    }
    if (stream) {
        sse_start(rs, sv, c, g, ctx, step, end, ctx_free);
        sse_no_done(rs);
        return 1;
    }
    acc_choice *a;
    if (srv_collect_with(sv, c, g, r, feed, ctx, &a, rs)) return -1;
    acc_free(a, 1);
    return 0;
}
