/* routes_completions.c: POST /v1/completions (the legacy text API).
 *
 * prompt: a string, a list of strings (a batch), a list of token ids, or a
 * list of lists of ids. Each prompt gets n choices, numbered prompt-major
 * (choice = prompt_index * n + i), as OpenAI and SGLang do. echo puts the
 * prompt text in front of each choice's text (the first chunk when
 * streaming). Default max_tokens is 16, as OpenAI's.
 */
#include "server/server.h"
#include "server/routes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct cmpl_ctx {
    srv *sv;
    srv_req r;
    char id[48];
    json_int_t created;
    int n;
    int *started;           /* per choice: first chunk sent (echo) */
    size_t *offset;         /* per choice: text offset for logprobs */
    int usage_prompt, usage_completion, usage_cached;
} cmpl_ctx;

static void cmpl_ctx_free(void *p) {
    cmpl_ctx *cx = p;
    free(cx->started);
    free(cx->offset);
    req_free(&cx->r);
    free(cx);
}

/* The prompt's text for echo (arena). */
static const char *prompt_text(cmpl_ctx *cx, int prompt_index) {
    srv_prompt *p = &cx->r.prompts[prompt_index];
    if (!p->text) {
        char *t = ls_detokenize(cx->sv->eng, p->ids, p->n, 0);
        p->text = arena_strdup(cx->r.a, t ? t : "");
        free(t);
    }
    return p->text;
}

static int tokenize_prompts(srv *sv, srv_req *r, srv_resp *rs) {
    if (!r->prompt_strings) return 0;
    r->prompts = arena_alloc(r->a, r->n_prompts * sizeof *r->prompts);
    for (int i = 0; i < r->n_prompts; i++) {
        const char *s = json_string_value(json_array_get(r->prompt_strings, i));
        int32_t *ids = NULL;
        char err[512] = "";
        int n = ls_tokenize(sv->eng, s, &ids, err, sizeof err);
        if (n < 0) { srv_error(rs, 400, NULL, "prompt", "prompt[%d]: cannot tokenize: %s", i, err); return -1; }
        r->prompts[i].ids = arena_alloc(r->a, (n + 1) * sizeof(int32_t));
        memcpy(r->prompts[i].ids, ids, n * sizeof(int32_t));
        r->prompts[i].n = n;
        r->prompts[i].text = s;
        free(ids);
    }
    return 0;
}

static void emit(cmpl_ctx *cx, buf *out, json_t *choice, const gen_event *ev) {
    json_t *c = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", cx->id, "object", "text_completion", "created",
                          cx->created, "model", cx->sv->cfg.served_model_name, "choices", choice);
    if (cx->r.continuous_usage) json_object_set_new(c, "usage", srv_usage(ev->prompt_tokens, ev->completion_tokens, 0));
    char *s = json_dumps(c, JSON_COMPACT);
    sse_data(out, s, strlen(s));
    free(s);
    json_decref(c);
}

static int cmpl_step(void *ctx, const gen_event *ev, buf *out) {
    cmpl_ctx *cx = ctx;
    int idx = ev->choice;
    if (ev->finished && !strcmp(ev->finish_reason, "error")) {
        sse_error_event(out, "server_error", 500, ev->error ? ev->error : "engine error");
        return -1;
    }
    buf text; buf_init(&text);
    if (!cx->started[idx]) {
        cx->started[idx] = 1;
        if (cx->r.echo) buf_puts(&text, prompt_text(cx, idx / cx->r.n));
    }
    buf_puts(&text, ev->text);
    json_t *lp = json_null();
    if (cx->r.logprobs && ev->token >= 0) {
        json_decref(lp);
        lp = srv_completion_logprobs_new();
        srv_completion_logprob(cx->sv, ev, lp, cx->offset[idx]);
    }
    cx->offset[idx] += strlen(ev->text);
    if (text.len || !json_is_null(lp) || ev->finished) {
        const char *fr = ev->finished ? (ev->finish_reason[0] ? ev->finish_reason : "stop") : NULL;
        json_t *choice = json_pack("{s:i, s:o, s:o, s:o}", "index", idx, "text", srv_jstr(text.data ? text.data : "", text.len),
                                   "logprobs", lp, "finish_reason", fr ? json_string(fr) : json_null());
        if (fr) json_object_set_new(choice, "matched_stop", srv_matched_stop(ev->matched_stop, ev->matched_stop_id));
        emit(cx, out, choice, ev);
    } else {
        json_decref(lp);
    }
    buf_free(&text);
    if (ev->finished) {
        if (idx % cx->r.n == 0) { cx->usage_prompt += ev->prompt_tokens; cx->usage_cached += ev->cached_tokens; }
        cx->usage_completion += ev->completion_tokens;
    }
    return 0;
}

static void cmpl_end(void *ctx, buf *out) {
    cmpl_ctx *cx = ctx;
    if (!cx->r.include_usage) return;
    json_t *c = json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", cx->id, "object", "text_completion", "created",
                          cx->created, "model", cx->sv->cfg.served_model_name, "choices", "usage",
                          srv_usage(cx->usage_prompt, cx->usage_completion, cx->usage_cached));
    char *s = json_dumps(c, JSON_COMPACT);
    sse_data(out, s, strlen(s));
    free(s);
    json_decref(c);
}

void route_completions(srv *sv, srv_conn *c, const char *body, size_t len, srv_resp *rs) {
    cmpl_ctx *cx = xcalloc(1, sizeof *cx);
    cx->sv = sv;
    ls_err e = {0};
    char param[64];
    if (req_parse(&cx->r, SRV_COMPLETION, body, len, sv->cfg.allow_force_ids, &sv->cfg.sampling_defaults, param,
                  sizeof param, &e)) {
        srv_error(rs, 400, NULL, param, "%s", e.msg);
        goto fail;
    }
    srv_req *r = &cx->r;
    if (srv_check_model(sv, r, rs) || tokenize_prompts(sv, r, rs)) goto fail;
    for (int i = 0; i < r->n_prompts; i++)
        if (srv_check_prompt(sv, r, &r->prompts[i], rs)) goto fail;
    if (srv_req_constrain(sv, r, 0, rs)) goto fail;
    srv_random_id(cx->id, sizeof cx->id, "cmpl-");
    cx->created = (json_int_t)time(NULL);

    gen *g;
    char err[512] = "";
    int rc = gen_start(sv, r, &g, err, sizeof err);
    if (rc) { srv_submit_error(rs, rc, err); goto fail; }
    int n = gen_choices(g);

    if (r->stream) {
        cx->n = n;
        cx->started = xcalloc(n, sizeof *cx->started);
        cx->offset = xcalloc(n, sizeof *cx->offset);
        sse_start(rs, sv, c, g, cx, cmpl_step, cmpl_end, cmpl_ctx_free);
        return;
    }

    acc_choice *a;
    if (srv_collect(sv, c, g, r, &a, rs)) goto fail;
    json_t *choices = json_array();
    for (int i = 0; i < n; i++) {
        buf t; buf_init(&t);
        if (r->echo) buf_puts(&t, prompt_text(cx, i / r->n));
        if (a[i].text.len) buf_append(&t, a[i].text.data, a[i].text.len);
        json_t *lp = r->logprobs ? json_incref(a[i].logprobs) : json_null();
        json_array_append_new(choices, json_pack("{s:i, s:o, s:o, s:s, s:o}", "index", i, "text",
                                                 srv_jstr(t.data ? t.data : "", t.len), "logprobs", lp,
                                                 "finish_reason", a[i].finish, "matched_stop",
                                                 srv_matched_stop(a[i].matched_stop, a[i].matched_stop_id)));
        buf_free(&t);
    }
    int up, uc, ucached;
    srv_usage_totals(a, n, r->n, &up, &uc, &ucached);
    acc_free(a, n);
    srv_json_resp(rs, 200, json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", cx->id, "object", "text_completion",
                                     "created", cx->created, "model", sv->cfg.served_model_name, "choices", choices,
                                     "usage", srv_usage(up, uc, ucached)));
fail:
    cmpl_ctx_free(cx);
}
