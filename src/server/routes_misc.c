/* routes_misc.c: the small routes: /v1/models, /health_generate,
 * /get_model_info, /get_server_info, /tokenize, /detokenize (SGLang's shapes:
 * tokenize {"prompt": str | [str]} -> {"tokens", "count", "max_model_len"};
 * detokenize {"tokens": [ids] | [[ids]]} -> {"text"}).
 */
#include "server/server.h"
#include "server/routes.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef LS_VERSION
#define LS_VERSION "0.1.0"
#endif

static json_t *model_card(srv *sv) {
    return json_pack("{s:s, s:s, s:I, s:s, s:s, s:i}", "id", sv->cfg.served_model_name, "object", "model", "created",
                     (json_int_t)sv->started_wall, "owned_by", "laststand", "root", sv->cfg.served_model_name,
                     "max_model_len", sv->info.context_length);
}

void route_models(srv *sv, const char *model_id, srv_resp *rs) {
    if (model_id) {
        if (strcmp(model_id, sv->cfg.served_model_name)) {
            srv_error(rs, 404, "not_found_error", "model", "The model `%s` does not exist.", model_id);
            return;
        }
        srv_json_resp(rs, 200, model_card(sv));
        return;
    }
    srv_json_resp(rs, 200, json_pack("{s:s, s:[o]}", "object", "list", "data", model_card(sv)));
}

void route_health_generate(srv *sv, srv_resp *rs) {
    srv_req r = {0};
    r.a = arena_new(1024);
    r.kind = SRV_COMPLETION;
    r.n = 1;
    r.n_prompts = 1;
    r.prompts = arena_alloc(r.a, sizeof *r.prompts);
    char err[512] = "";
    int32_t *ids = NULL;
    int n = ls_tokenize(sv->eng, "Hello", &ids, err, sizeof err);
    if (n <= 0) {
        srv_error(rs, 503, NULL, NULL, "health check: cannot tokenize: %s", err);
        arena_free(r.a);
        free(ids);
        return;
    }
    r.prompts[0].ids = ids;
    r.prompts[0].n = n;
    ls_sampling_default(&r.s);
    r.s.temperature = 0;
    r.s.max_tokens = 1;
    r.s.ignore_eos = 1;
    gen *g;
    int rc = gen_start(sv, &r, &g, err, sizeof err);
    free(ids);
    arena_free(r.a);
    if (rc) { srv_error(rs, 503, NULL, NULL, "health check: %s", err); return; }
    double t0 = now_sec();
    int ok = 0, done = 0;
    char why[512] = "timed out after 60 s";
    while (!done && now_sec() - t0 < 60) {
        gen_event ev;
        int k = gen_next(g, &ev, 0.1);
        if (k < 0) break;
        if (k == 0) { if (sv->stopping) break; continue; }
        if (ev.finished) {
            done = 1;
            ok = strcmp(ev.finish_reason, "error") && strcmp(ev.finish_reason, "abort");
            snprintf(why, sizeof why, "%s", ev.error ? ev.error : ev.finish_reason);
        }
        gen_event_free(&ev);
    }
    gen_release(g);
    if (ok) { rs->status = 200; rs->content_type = "text/plain"; return; }
    srv_error(rs, 503, NULL, NULL, "health check generation failed: %s", why);
}

void route_model_info(srv *sv, srv_resp *rs) {
    json_t *eos = json_array();
    for (int i = 0; i < sv->info.n_eos; i++) json_array_append_new(eos, json_integer(sv->info.eos_ids[i]));
    const char *mp = sv->info.model_path ? sv->info.model_path : sv->cfg.model_path;
    const char *tp = sv->info.tokenizer_path ? sv->info.tokenizer_path : sv->cfg.tokenizer_path;
    srv_json_resp(rs, 200, json_pack("{s:s, s:o, s:b, s:o, s:s, s:s, s:s, s:i, s:i, s:o, s:b}", "model_path", mp ? mp : "",
                                     "tokenizer_path", tp ? json_string(tp) : json_null(),
                                     "is_generation", 1, "preferred_sampling_params",
                                     sv->cfg.preferred_sampling && json_object_size(sv->cfg.preferred_sampling)
                                         ? json_incref(sv->cfg.preferred_sampling) : json_null(),
                                     "weight_version", "default",
                                     "served_model_name", sv->cfg.served_model_name, "architecture",
                                     sv->info.architecture ? sv->info.architecture : "", "context_length",
                                     sv->info.context_length, "vocab_size", sv->info.vocab_size, "eos_token_ids", eos,
                                     "has_chat_template", sv->info.has_chat_template));
}

void route_server_info(srv *sv, srv_resp *rs) {
    ls_stats st;
    ls_engine_stats(sv->eng, &st);
    json_t *o = json_deep_copy(sv->cfg.server_args ? sv->cfg.server_args : json_object());
    json_object_set_new(o, "version", json_string(LS_VERSION));
    json_object_set_new(o, "architecture", json_string(sv->info.architecture ? sv->info.architecture : ""));
    json_object_set_new(o, "context_length", json_integer(sv->info.context_length));
    json_object_set_new(o, "device", json_string(sv->info.device ? sv->info.device : ""));
    json_object_set_new(o, "uptime_s", json_real(now_sec() - sv->started));
    json_object_set_new(o, "max_running_requests", json_integer(sv->info.max_running_requests));
    json_object_set_new(o, "chunked_prefill_size", json_integer(sv->info.chunked_prefill_size));
    json_object_set_new(o, "page_size", json_integer(sv->info.page_size));
    json_object_set_new(o, "max_total_tokens", json_integer(sv->info.max_total_tokens));
    json_object_set_new(o, "internal_states",
                        json_pack("[{s:i, s:i, s:f, s:i, s:i, s:I, s:I}]", "num_running_reqs", st.running,
                                  "num_queue_reqs", st.queued, "kv_usage", st.kv_usage, "kv_pages_total",
                                  st.kv_pages_total, "kv_pages_used", st.kv_pages_used, "requests_total",
                                  (json_int_t)st.requests_total, "nan_logits_total", (json_int_t)st.nan_logits_total));
    srv_json_resp(rs, 200, o);
}

static json_t *parse_body(const char *body, size_t len, srv_resp *rs) {
    json_error_t je;
    json_t *o = json_loadb(body ? body : "", len, 0, &je);
    if (!o) { srv_error(rs, 400, NULL, NULL, "invalid JSON body: line %d, column %d: %s", je.line, je.column, je.text); return NULL; }
    if (!json_is_object(o)) { srv_error(rs, 400, NULL, NULL, "the request body must be a JSON object"); json_decref(o); return NULL; }
    return o;
}

static json_t *tokenize_one(srv *sv, const char *text, int *count, srv_resp *rs, const char *path) {
    int32_t *ids = NULL;
    char err[512] = "";
    int n = ls_tokenize(sv->eng, text, &ids, err, sizeof err);
    if (n < 0) { srv_error(rs, 400, NULL, "prompt", "%s: cannot tokenize: %s", path, err); return NULL; }
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    free(ids);
    *count = n;
    return a;
}

void route_tokenize(srv *sv, const char *body, size_t len, srv_resp *rs) {
    json_t *o = parse_body(body, len, rs);
    if (!o) return;
    json_t *p = json_object_get(o, "prompt");
    if (!p) p = json_object_get(o, "text");
    int cnt;
    if (json_is_string(p)) {
        json_t *a = tokenize_one(sv, json_string_value(p), &cnt, rs, "prompt");
        if (a) srv_json_resp(rs, 200, json_pack("{s:o, s:i, s:i}", "tokens", a, "count", cnt, "max_model_len", sv->info.context_length));
    } else if (json_is_array(p)) {
        json_t *all = json_array(), *counts = json_array();
        for (size_t i = 0; i < json_array_size(p); i++) {
            char path[32];
            snprintf(path, sizeof path, "prompt[%zu]", i);
            const char *s = json_string_value(json_array_get(p, i));
            if (!s) { srv_error(rs, 400, NULL, "prompt", "%s: expected a string", path); goto out_arr; }
            json_t *a = tokenize_one(sv, s, &cnt, rs, path);
            if (!a) goto out_arr;
            json_array_append_new(all, a);
            json_array_append_new(counts, json_integer(cnt));
        }
        srv_json_resp(rs, 200, json_pack("{s:O, s:O, s:i}", "tokens", all, "count", counts, "max_model_len", sv->info.context_length));
    out_arr:
        json_decref(all);
        json_decref(counts);
    } else {
        srv_error(rs, 400, NULL, "prompt", "prompt: expected a string or a list of strings");
    }
    json_decref(o);
}

static int ids_of(srv *sv, json_t *a, const char *path, int32_t **ids, int *n, srv_resp *rs) {
    size_t len = json_array_size(a);
    *ids = xmalloc((len + 1) * sizeof(int32_t));
    for (size_t i = 0; i < len; i++) {
        json_t *x = json_array_get(a, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= sv->info.vocab_size) {
            srv_error(rs, 400, NULL, "tokens", "%s[%zu]: expected a token id in [0, %d)", path, i, sv->info.vocab_size);
            free(*ids);
            return -1;
        }
        (*ids)[i] = (int32_t)json_integer_value(x);
    }
    *n = (int)len;
    return 0;
}

void route_detokenize(srv *sv, const char *body, size_t len, srv_resp *rs) {
    json_t *o = parse_body(body, len, rs);
    if (!o) return;
    json_t *t = json_object_get(o, "tokens");
    int skip = json_is_true(json_object_get(o, "skip_special_tokens"));
    if (!json_is_array(t)) {
        srv_error(rs, 400, NULL, "tokens", "tokens: expected a list of token ids or a list of lists");
        json_decref(o);
        return;
    }
    int batch = json_array_size(t) && json_is_array(json_array_get(t, 0));
    json_t *texts = json_array();
    size_t nb = batch ? json_array_size(t) : 1;
    for (size_t b = 0; b < nb; b++) {
        char path[32];
        snprintf(path, sizeof path, batch ? "tokens[%zu]" : "tokens", b);
        json_t *a = batch ? json_array_get(t, b) : t;
        if (!json_is_array(a)) { srv_error(rs, 400, NULL, "tokens", "%s: expected a list of token ids", path); goto out; }
        int32_t *ids; int n;
        if (ids_of(sv, a, path, &ids, &n, rs)) goto out;
        char *s = ls_detokenize(sv->eng, ids, n, skip);
        free(ids);
        json_array_append_new(texts, srv_jstr(s ? s : "", s ? strlen(s) : 0));
        free(s);
    }
    srv_json_resp(rs, 200, json_pack("{s:O}", "text", batch ? texts : json_array_get(texts, 0)));
out:
    json_decref(texts);
    json_decref(o);
}
