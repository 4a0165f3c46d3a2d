/* routes_common.c: what the chat and completions routes share: the model-name
 * check, prompt limits against the context, submission errors, ids, usage,
 * logprob entries, and collecting every choice of a non-streamed request
 * (watching for the client going away while the engine works).
 */
#include "server/server.h"
#include "server/routes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

int srv_check_model(srv *sv, const srv_req *r, srv_resp *rs) {
    if (!r->model || !*r->model) return 0;
    if (!strcmp(r->model, sv->cfg.served_model_name)) return 0;
    if (sv->cfg.model_path && !strcmp(r->model, sv->cfg.model_path)) return 0;
    srv_error(rs, 404, "not_found_error", "model", "The model `%s` does not exist.", r->model);
    return -1;
}

int srv_check_prompt(srv *sv, srv_req *r, const srv_prompt *p, srv_resp *rs) {
    int ctx = sv->info.context_length;
    if (p->n < 1) {
        srv_error(rs, 400, NULL, "prompt", "the prompt is empty");
        return -1;
    }
    if (ctx > 0 && p->n >= ctx) {
        srv_error(rs, 400, NULL, r->prompt_field ? r->prompt_field : r->kind == SRV_CHAT ? "messages" : "prompt",
                  "The prompt is %d tokens long, but this model's maximum context length is %d tokens "
                  "(the prompt must leave room for at least one completion token).", p->n, ctx);
        return -1;
    }
    if (ctx > 0 && r->has_max_tokens && (long long)p->n + r->s.max_tokens > ctx) {
        srv_error(rs, 400, NULL, r->max_tokens_field,
                  "This model's maximum context length is %d tokens. However, you requested %lld tokens "
                  "(%d in the prompt, %d for the completion).", ctx, (long long)p->n + r->s.max_tokens, p->n,
                  r->s.max_tokens);
        return -1;
    }
    return 0;
}

/* ---- chat prompts ---------------------------------------------------------------- */

int srv_prompt_opens_think(const char *text) {
    const char *last = NULL, *p = text;
    while ((p = strstr(p, "<think>"))) { last = p; p += 7; }
    return last && !strstr(last, "</think>");
}

int srv_render_chat(srv *sv, srv_req *r, srv_resp *rs) {
    const char *field = r->prompt_field ? r->prompt_field : "messages";
    json_t *req = json_pack("{s:O, s:b}", "messages", r->messages, "add_generation_prompt", 1);
    if (r->tools && r->tool_choice != TC_NONE) json_object_set(req, "tools", (json_t *)r->tools);
    if (r->chat_template_kwargs) json_object_set(req, "chat_template_kwargs", r->chat_template_kwargs);
    char *js = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    char err[1024] = "";
    char *text = NULL;
    int rc = ls_apply_chat_template(sv->eng, js, &text, err, sizeof err);
    free(js);
    if (rc == LS_ERR_INVAL) { srv_error(rs, 400, NULL, field, "chat template: %s", err); return -1; }
    if (rc) { srv_error(rs, 500, NULL, NULL, "chat template failed: %s", err); return -1; }
    int32_t *ids = NULL;
    int n = ls_tokenize(sv->eng, text, &ids, err, sizeof err);
    if (n < 0) {
        free(text);
        srv_error(rs, 400, NULL, field, "cannot tokenize the prompt: %s", err);
        return -1;
    }
    r->n_prompts = 1;
    r->prompts = arena_alloc(r->a, sizeof *r->prompts);
    r->prompts[0].ids = arena_alloc(r->a, (n + 1) * sizeof(int32_t));
    memcpy(r->prompts[0].ids, ids, n * sizeof(int32_t));
    r->prompts[0].n = n;
    r->prompts[0].text = arena_strdup(r->a, text);
    free(ids);
    free(text);
    return 0;
}

json_t *srv_load_body(const char *body, size_t len, srv_resp *rs) {
    json_error_t je;
    json_t *o = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
        srv_error(rs, 400, NULL, NULL, "invalid JSON body: line %d, column %d: %s", je.line, je.column, je.text);
        return NULL;
    }
    if (!json_is_object(o)) {
        json_decref(o);
        srv_error(rs, 400, NULL, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return o;
}

static const char *map_name(const char *const *names, const char *k) {
    for (int i = 0; names && names[i]; i += 2)
        if (!strcmp(names[i], k)) return names[i + 1];
    return k;
}

int srv_chat_translated(srv *sv, srv_req *r, json_t *chat, const char *const *names, srv_resp *rs) {
    char *text = json_dumps(chat, JSON_COMPACT);
    ls_err e = {0};
    char param[64];
    req_free(r);
    int rc = req_parse(r, SRV_CHAT, text, strlen(text), sv->cfg.allow_force_ids, &sv->cfg.sampling_defaults, param,
                       sizeof param, &e);
    free(text);
    if (rc) {
        srv_error(rs, 400, NULL, map_name(names, param), "%s", e.msg);
        return -1;
    }
    r->prompt_field = map_name(names, "messages");
    if (r->has_max_tokens) r->max_tokens_field = map_name(names, r->max_tokens_field);
    return srv_check_model(sv, r, rs) || srv_render_chat(sv, r, rs) ? -1 : 0;
}

int srv_chat_ready(srv *sv, srv_req *r, srv_resp *rs, int *use_rp, int *use_tp, int *force_reasoning) {
    if (srv_check_prompt(sv, r, &r->prompts[0], rs)) return -1;
    int opens = srv_prompt_opens_think(r->prompts[0].text);
    if (srv_req_constrain(sv, r, opens, rs)) return -1;
    *use_rp = sv->cfg.reasoning_parser && r->separate_reasoning && r->enable_thinking != 0;
    *force_reasoning = *use_rp && (sv->cfg.reasoning_always || opens);
    *use_tp = sv->cfg.tool_parser != TP_NONE && r->tools && r->tool_choice != TC_NONE;
    return 0;
}

void srv_parse_text(rp_state *rp, tp_stream *tp, const char *text, size_t n, int final, buf *reasoning, buf *content,
                    tp_deltas *d) {
    buf mid; buf_init(&mid);
    if (rp) {
        rp_feed(rp, text, n, reasoning, &mid);
        if (final) rp_finish(rp, reasoning, &mid);
    } else {
        buf_append(&mid, text, n);
    }
    if (tp) {
        tp_stream_feed(tp, mid.data, mid.len, content, d);
        if (final) tp_stream_finish(tp, content, d);
    } else {
        buf_append(content, mid.data, mid.len);
    }
    buf_free(&mid);
}

void srv_submit_error(srv_resp *rs, int code, const char *err) {
    if (code == LS_ERR_INVAL) srv_error(rs, 400, NULL, NULL, "%s", err);
    else if (code == LS_ERR_BUSY) srv_error(rs, 503, NULL, NULL, "server busy: %s", err);
    else srv_error(rs, 500, NULL, NULL, "engine error: %s", err);
}

void srv_random_id(char *out, size_t n, const char *prefix) {
    static const char hex[] = "0123456789abcdef";
    unsigned char r[16];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        uint64_t x = (uint64_t)time(NULL) * 0x9E3779B97F4A7C15ULL ^ (uint64_t)(uintptr_t)out;
        for (int i = 0; i < 16; i++) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; r[i] = (unsigned char)x; }
    }
    char h[33];
    for (int i = 0; i < 16; i++) { h[2 * i] = hex[r[i] >> 4]; h[2 * i + 1] = hex[r[i] & 15]; }
    h[32] = 0;
    snprintf(out, n, "%s%s", prefix, h);
}

json_t *srv_usage(int prompt, int completion, int cached) {
    json_t *u = json_pack("{s:i, s:i, s:i}", "prompt_tokens", prompt, "completion_tokens", completion,
                          "total_tokens", prompt + completion);
    if (cached > 0) json_object_set_new(u, "prompt_tokens_details", json_pack("{s:i}", "cached_tokens", cached));
    return u;
}

/* ---- logprobs ------------------------------------------------------------------- */

static json_t *utf8_bytes(const char *s) {
    json_t *a = json_array();
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) json_array_append_new(a, json_integer(*p));
    return a;
}

char *srv_token_text(srv *sv, int32_t id) {
    char *t = ls_detokenize(sv->eng, &id, 1, 0);
    return t ? t : xstrdup("");
}

json_t *srv_chat_logprob(srv *sv, const gen_event *ev) {
    char *t = srv_token_text(sv, ev->token);
    json_t *top = json_array();
    for (int i = 0; i < ev->n_top; i++) {
        char *tt = srv_token_text(sv, ev->top_ids[i]);
        json_array_append_new(top, json_pack("{s:s, s:f, s:o}", "token", tt, "logprob", (double)ev->top_lps[i],
                                             "bytes", utf8_bytes(tt)));
        free(tt);
    }
    json_t *e = json_pack("{s:s, s:f, s:o, s:o}", "token", t, "logprob", (double)ev->logprob, "bytes", utf8_bytes(t),
                          "top_logprobs", top);
    free(t);
    return e;
}

void srv_completion_logprob(srv *sv, const gen_event *ev, json_t *lp, size_t text_offset) {
    char *t = srv_token_text(sv, ev->token);
    json_array_append_new(json_object_get(lp, "tokens"), json_string(t));
    json_array_append_new(json_object_get(lp, "token_logprobs"), json_real(ev->logprob));
    json_t *top = json_object();
    for (int i = 0; i < ev->n_top; i++) {
        char *tt = srv_token_text(sv, ev->top_ids[i]);
        json_object_set_new(top, tt, json_real(ev->top_lps[i]));
        free(tt);
    }
    json_array_append_new(json_object_get(lp, "top_logprobs"), top);
    json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)text_offset));
    free(t);
}

json_t *srv_completion_logprobs_new(void) {
    return json_pack("{s:[], s:[], s:[], s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

/* ---- collecting a non-streamed request -------------------------------------------- */

void acc_free(acc_choice *a, int n) {
    for (int i = 0; i < n; i++) {
        buf_free(&a[i].text);
        free(a[i].matched_stop);
        free(a[i].error);
        json_decref(a[i].logprobs);
    }
    free(a);
}

int srv_collect(srv *sv, srv_conn *c, gen *g, const srv_req *r, acc_choice **out, srv_resp *rs) {
    return srv_collect_with(sv, c, g, r, NULL, NULL, out, rs);
}

int srv_collect_with(srv *sv, srv_conn *c, gen *g, const srv_req *r, void (*fn)(void *, const gen_event *),
                     void *ctx, acc_choice **out, srv_resp *rs) {
    int n = gen_choices(g);
    acc_choice *a = xcalloc(n, sizeof *a);
    for (int i = 0; i < n; i++) {
        buf_init(&a[i].text);
        a[i].matched_stop_id = -1;
        if (r->logprobs) a[i].logprobs = r->kind == SRV_CHAT ? json_array() : srv_completion_logprobs_new();
    }
    int cancelled = 0;
    double last_check = now_sec();
    for (;;) {
        gen_event ev;
        int rc = gen_next(g, &ev, 0.05);
        if (rc < 0) break;
        /* Every 50 ms, events flowing or not: is anyone still waiting? */
        if (rc == 0 || now_sec() - last_check > 0.05) {
            last_check = now_sec();
            if (srv_conn_gone(c)) { /* nobody to answer: free the engine's work now */
                if (rc == 1) gen_event_free(&ev);
                gen_release(g);
                acc_free(a, n);
                rs->status = 499;
                return -1;
            }
            if (sv->stopping && !cancelled) { gen_cancel(g); cancelled = 1; }
            if (rc == 0) continue;
        }
        acc_choice *ch = &a[ev.choice];
        if (fn) fn(ctx, &ev);
        if (ev.token >= 0 && r->logprobs) {
            if (r->kind == SRV_CHAT) json_array_append_new(ch->logprobs, srv_chat_logprob(sv, &ev));
            else srv_completion_logprob(sv, &ev, ch->logprobs, ch->text.len);
        }
        buf_puts(&ch->text, ev.text);
        if (ev.finished) {
            ch->done = 1;
            snprintf(ch->finish, sizeof ch->finish, "%s", ev.finish_reason[0] ? ev.finish_reason : "stop");
            ch->prompt_tokens = ev.prompt_tokens;
            ch->completion_tokens = ev.completion_tokens;
            ch->cached_tokens = ev.cached_tokens;
            if (ev.matched_stop) ch->matched_stop = xstrdup(ev.matched_stop);
            ch->matched_stop_id = ev.matched_stop_id;
            if (ev.error) ch->error = xstrdup(ev.error);
        }
        gen_event_free(&ev);
    }
    gen_release(g);
    for (int i = 0; i < n; i++)
        if (!strcmp(a[i].finish, "error")) {
            srv_error(rs, 500, "server_error", NULL, "generation failed: %s", a[i].error ? a[i].error : "engine error");
            acc_free(a, n);
            return -1;
        }
    *out = a;
    return 0;
}

void srv_usage_totals(const acc_choice *a, int n_choices, int n_per_prompt, int *prompt, int *completion, int *cached) {
    *prompt = *completion = *cached = 0;
    for (int i = 0; i < n_choices; i++) {
        if (i % n_per_prompt == 0) { *prompt += a[i].prompt_tokens; *cached += a[i].cached_tokens; }
        *completion += a[i].completion_tokens;
    }
}

json_t *srv_matched_stop(const char *matched, int32_t matched_id) {
    if (matched) return json_string(matched);
    if (matched_id >= 0) return json_integer(matched_id);
    return json_null();
}

json_t *srv_jstr(const char *s, size_t n) {
    json_t *j = json_stringn(s, n);
    if (j) return j;
    /* Replace every byte that does not start a valid UTF-8 sequence. */
    buf b; buf_init(&b);
    const unsigned char *p = (const unsigned char *)s, *end = p + n;
    while (p < end) {
        int len = *p < 0x80 ? 1 : (*p >> 5) == 6 ? 2 : (*p >> 4) == 14 ? 3 : (*p >> 3) == 30 ? 4 : 0;
        int ok = len > 0 && p + len <= end && *p != 0;
        for (int i = 1; ok && i < len; i++) ok = (p[i] & 0xC0) == 0x80;
        if (ok && len > 1) { /* overlong forms, surrogates: let jansson judge */
            json_t *t = json_stringn((const char *)p, len);
            ok = t != NULL;
            json_decref(t);
        }
        if (ok) { buf_append(&b, p, len); p += len; }
        else { buf_puts(&b, "\xEF\xBF\xBD"); p++; }
    }
    j = json_stringn(b.data ? b.data : "", b.len);
    buf_free(&b);
    return j ? j : json_string("");
}
