/* routes_generate.c: POST /generate, SGLang's native generation API (what
 * `sglang.bench_serving --backend sglang` and SGLang's own clients call).
 *
 * Request: {"text": str | [str]} or {"input_ids": [ids] | [[ids]]},
 * "sampling_params": {max_new_tokens (default 128), min_new_tokens,
 * temperature, top_p, top_k, min_p, frequency_penalty, presence_penalty,
 * repetition_penalty, stop, stop_token_ids, ignore_eos, skip_special_tokens,
 * n}, "stream", "rid". It is mapped onto a completions request and validated
 * by req.c (errors name the mapped fields: sampling_params.max_new_tokens is
 * checked as max_tokens).
 * Response: {"text", "output_ids", "meta_info": {"id", "finish_reason":
 * {"type": "stop"|"length"|"abort", "matched"|"length"}, "prompt_tokens",
 * "completion_tokens", "cached_tokens", "e2e_latency"}}, a list for batched
 * inputs. Streaming sends the cumulative text and ids in each event, as
 * SGLang does by default, then [DONE].
 */
#include "server/server.h"
#include "server/routes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct gen_out {
    buf text;
    json_t *ids;          /* output ids so far */
    int prompt_tokens, completion_tokens, cached_tokens;
    char finish[16];
    char *matched;
    int32_t matched_id;
} gen_out;

typedef struct native_ctx {
    srv *sv;
    srv_req r;
    char rid[48];
    double t0;
    int n, batched;
    gen_out *o;
} native_ctx;

static void native_free(void *p) {
    native_ctx *cx = p;
    for (int i = 0; i < cx->n; i++) {
        buf_free(&cx->o[i].text);
        json_decref(cx->o[i].ids);
        free(cx->o[i].matched);
    }
    free(cx->o);
    req_free(&cx->r);
    free(cx);
}

/* {"text", "output_ids", "meta_info"} for choice i. */
static json_t *native_item(native_ctx *cx, int i, int finished) {
    gen_out *o = &cx->o[i];
    json_t *fr = json_null();
    if (finished) {
        json_decref(fr);
        fr = json_pack("{s:s}", "type", o->finish);
        if (!strcmp(o->finish, "length")) json_object_set_new(fr, "length", json_integer(o->completion_tokens));
        else if (!strcmp(o->finish, "stop")) json_object_set_new(fr, "matched", srv_matched_stop(o->matched, o->matched_id));
    }
    char id[64];
    if (cx->n > 1) snprintf(id, sizeof id, "%s-%d", cx->rid, i);
    else snprintf(id, sizeof id, "%s", cx->rid);
    return json_pack("{s:o, s:O, s:{s:s, s:o, s:i, s:i, s:i, s:f}}", "text", srv_jstr(o->text.data ? o->text.data : "", o->text.len),
                     "output_ids", o->ids, "meta_info", "id", id, "finish_reason", fr, "prompt_tokens",
                     o->prompt_tokens, "completion_tokens", o->completion_tokens, "cached_tokens", o->cached_tokens,
                     "e2e_latency", now_sec() - cx->t0);
}

static void absorb(native_ctx *cx, const gen_event *ev) {
    gen_out *o = &cx->o[ev->choice];
    buf_puts(&o->text, ev->text);
    if (ev->token >= 0 && (!ev->finished || ev->matched_stop_id != ev->token))
        json_array_append_new(o->ids, json_integer(ev->token));
    o->prompt_tokens = ev->prompt_tokens;
    o->completion_tokens = ev->completion_tokens;
    o->cached_tokens = ev->cached_tokens;
    if (ev->finished) {
        snprintf(o->finish, sizeof o->finish, "%s", ev->finish_reason[0] ? ev->finish_reason : "stop");
        if (ev->matched_stop) o->matched = xstrdup(ev->matched_stop);
        o->matched_id = ev->matched_stop_id;
    }
}

static int native_step(void *ctx, const gen_event *ev, buf *out) {
    native_ctx *cx = ctx;
    if (ev->finished && !strcmp(ev->finish_reason, "error")) {
        sse_error_event(out, "server_error", 500, ev->error ? ev->error : "engine error");
        return -1;
    }
    absorb(cx, ev);
    if (!ev->text[0] && !ev->finished) return 0;
    json_t *item = native_item(cx, ev->choice, ev->finished);
    json_object_set_new(item, "index", json_integer(ev->choice));
    char *s = json_dumps(item, JSON_COMPACT);
    sse_data(out, s, strlen(s));
    free(s);
    json_decref(item);
    return 0;
}

/* Map the native body onto an OpenAI completions body. */
static json_t *to_completion(json_t *in, srv_resp *rs) {
    json_t *out = json_object();
    json_t *text = json_object_get(in, "text"), *ids = json_object_get(in, "input_ids");
    if ((text && !json_is_null(text)) == (ids && !json_is_null(ids))) {
        srv_error(rs, 400, NULL, "text", "exactly one of text and input_ids is required");
        json_decref(out);
        return NULL;
    }
    json_object_set(out, "prompt", text && !json_is_null(text) ? text : ids);
    json_t *sp = json_object_get(in, "sampling_params");
    if (sp && !json_is_object(sp) && !json_is_null(sp)) {
        srv_error(rs, 400, NULL, "sampling_params", "sampling_params: expected an object");
        json_decref(out);
        return NULL;
    }
    static const char *same[] = {"temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
                                 "repetition_penalty", "stop", "stop_token_ids", "ignore_eos", "skip_special_tokens",
                                 "n", "seed", NULL};
    for (int i = 0; same[i]; i++) {
        json_t *v = json_object_get(sp, same[i]);
        if (v) json_object_set(out, same[i], v);
    }
    json_t *mx = json_object_get(sp, "max_new_tokens");
    json_object_set_new(out, "max_tokens", mx ? json_incref(mx) : json_integer(128));
    json_t *mn = json_object_get(sp, "min_new_tokens");
    if (mn) json_object_set(out, "min_tokens", mn);
    json_t *rx = json_object_get(sp, "regex"), *eb = json_object_get(sp, "ebnf");
    if (rx && !json_is_null(rx)) json_object_set(out, "regex", rx);
    if (eb && !json_is_null(eb)) json_object_set(out, "ebnf", eb);
    json_t *js = json_object_get(sp, "json_schema");
    if (js && !json_is_null(js)) {
        /* SGLang takes the schema as a JSON string */
        json_t *sc = json_is_string(js) ? json_loads(json_string_value(js), JSON_DECODE_ANY, NULL) : NULL;
        if (!sc) {
            srv_error(rs, 400, NULL, "sampling_params", "sampling_params.json_schema: expected a JSON Schema as a JSON string");
            json_decref(out);
            return NULL;
        }
        json_object_set_new(out, "response_format", json_pack("{s:s, s:{s:s, s:o}}", "type", "json_schema", "json_schema",
                                                              "name", "generate", "schema", sc));
    }
    json_t *lb = json_object_get(sp, "logit_bias");
    if (lb) json_object_set(out, "logit_bias", lb);
    json_t *st = json_object_get(in, "stream");
    if (st) json_object_set(out, "stream", st);
    json_t *fi = json_object_get(in, "force_ids");
    if (fi) json_object_set(out, "force_ids", fi);
    return out;
}

void route_generate(srv *sv, srv_conn *c, const char *body, size_t len, srv_resp *rs) {
    json_error_t je;
    json_t *in = json_loadb(body ? body : "", len, 0, &je);
    if (!in) { srv_error(rs, 400, NULL, NULL, "invalid JSON body: line %d, column %d: %s", je.line, je.column, je.text); return; }
    if (!json_is_object(in)) { srv_error(rs, 400, NULL, NULL, "the request body must be a JSON object"); json_decref(in); return; }
    json_t *mapped = to_completion(in, rs);
    if (!mapped) { json_decref(in); return; }
    native_ctx *cx = xcalloc(1, sizeof *cx);
    cx->sv = sv;
    cx->t0 = now_sec();
    const char *rid = json_string_value(json_object_get(in, "rid"));
    if (rid) snprintf(cx->rid, sizeof cx->rid, "%s", rid);
    else srv_random_id(cx->rid, sizeof cx->rid, "");
    json_t *p = json_object_get(mapped, "prompt");
    cx->batched = json_is_array(p) && json_array_size(p) && !json_is_integer(json_array_get(p, 0));
    char *js = json_dumps(mapped, JSON_COMPACT);
    json_decref(mapped);
    json_decref(in);
    ls_err e = {0};
    char param[64];
    int rc = req_parse(&cx->r, SRV_COMPLETION, js, strlen(js), sv->cfg.allow_force_ids, &sv->cfg.sampling_defaults,
                       param, sizeof param, &e);
    free(js);
    if (rc) { srv_error(rs, 400, NULL, param, "%s", e.msg); native_free(cx); return; }
    srv_req *r = &cx->r;
    if (r->prompt_strings) {
        r->prompts = arena_alloc(r->a, r->n_prompts * sizeof *r->prompts);
        for (int i = 0; i < r->n_prompts; i++) {
            int32_t *ids = NULL;
            char err[512] = "";
            int n = ls_tokenize(sv->eng, json_string_value(json_array_get(r->prompt_strings, i)), &ids, err, sizeof err);
            if (n < 0) { srv_error(rs, 400, NULL, "text", "text: cannot tokenize: %s", err); native_free(cx); return; }
            r->prompts[i].ids = arena_alloc(r->a, (n + 1) * sizeof(int32_t));
            memcpy(r->prompts[i].ids, ids, n * sizeof(int32_t));
            r->prompts[i].n = n;
            free(ids);
        }
    }
    for (int i = 0; i < r->n_prompts; i++)
        if (srv_check_prompt(sv, r, &r->prompts[i], rs)) { native_free(cx); return; }
    r->rf_path = r->rf_kind == RF_REGEX ? "sampling_params.regex" : r->rf_kind == RF_EBNF ? "sampling_params.ebnf"
               : "sampling_params.json_schema";
    if (srv_req_constrain(sv, r, 0, rs)) { native_free(cx); return; }
    gen *g;
    char err[512] = "";
    if ((rc = gen_start(sv, r, &g, err, sizeof err))) { srv_submit_error(rs, rc, err); native_free(cx); return; }
    cx->n = gen_choices(g);
    cx->o = xcalloc(cx->n, sizeof *cx->o);
    for (int i = 0; i < cx->n; i++) {
        buf_init(&cx->o[i].text);
        cx->o[i].ids = json_array();
        cx->o[i].matched_id = -1;
    }
    if (r->stream) {
        sse_start(rs, sv, c, g, cx, native_step, NULL, native_free);
        return;
    }
    /* non-streamed: gather every choice (watching for a vanished client) */
    double last_check = now_sec();
    for (;;) {
        gen_event ev;
        int k = gen_next(g, &ev, 0.05);
        if (k < 0) break;
        if (k == 0 || now_sec() - last_check > 0.05) {
            last_check = now_sec();
            if (srv_conn_gone(c) || sv->stopping) {
                if (k == 1) gen_event_free(&ev);
                gen_release(g);
                if (sv->stopping) srv_error(rs, 503, NULL, NULL, "the server is stopping");
                else rs->status = 499;
                native_free(cx);
                return;
            }
            if (k == 0) continue;
        }
        if (ev.finished && !strcmp(ev.finish_reason, "error")) {
            srv_error(rs, 500, "server_error", NULL, "generation failed: %s", ev.error ? ev.error : "engine error");
            gen_event_free(&ev);
            gen_release(g);
            native_free(cx);
            return;
        }
        absorb(cx, &ev);
        gen_event_free(&ev);
    }
    gen_release(g);
    if (cx->batched || cx->n > 1) {
        json_t *list = json_array();
        for (int i = 0; i < cx->n; i++) json_array_append_new(list, native_item(cx, i, 1));
        srv_json_resp(rs, 200, list);
    } else {
        srv_json_resp(rs, 200, native_item(cx, 0, 1));
    }
    native_free(cx);
}
