/* req.c: OpenAI request bodies (chat and completions) -> srv_req.
 *
 * Fields and defaults follow SGLang's ChatCompletionRequest / CompletionRequest
 * (reference/peers-and-parsers.md 1.5). Every rejection names the JSON path
 * at fault ("messages[2].role: ..."), and `param` receives the top-level
 * field for the OpenAI error's "param". Unknown fields are ignored, as
 * SGLang does; the test-only "force_ids" is refused unless the server runs
 * with LASTSTAND_TEST_FORCE_IDS=1. Nothing here touches the engine: prompt
 * strings are tokenized by the routes.
 *
 * Memory: r->root owns the parsed body; strings in srv_req point into it;
 * arrays live in r->a (freed by req_free).
 */
#include "server/server.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_N 128
#define MAX_STOP 32

typedef struct pctx { ls_err *e; char *param; size_t paramn; } pctx;

static int bad(pctx *p, const char *field, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(pctx *p, const char *field, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char msg[900];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (p->param && p->paramn) snprintf(p->param, p->paramn, "%s", field ? field : "");
    return errf(p->e, ERR_INVAL, "%s", msg);
}

/* Present and not null. */
static json_t *get(json_t *o, const char *k) {
    json_t *v = json_object_get(o, k);
    return json_is_null(v) ? NULL : v;
}

static int get_bool(pctx *p, json_t *o, const char *k, int *out) {
    json_t *v = get(o, k);
    if (!v) return 0;
    if (!json_is_boolean(v)) return bad(p, k, "%s: expected true or false", k);
    *out = json_is_true(v);
    return 0;
}

static int get_num(pctx *p, json_t *o, const char *k, double lo, double hi, int lo_open, double *out, int *has) {
    json_t *v = get(o, k);
    if (!v) return 0;
    if (!json_is_number(v)) return bad(p, k, "%s: expected a number", k);
    double d = json_number_value(v);
    if (!isfinite(d) || d < lo || d > hi || (lo_open && d == lo)) {
        if (isinf(hi)) return bad(p, k, "%s: must be %s %g, got %g", k, lo_open ? ">" : ">=", lo, d);
        return bad(p, k, "%s: must be %s %g and <= %g, got %g", k, lo_open ? ">" : ">=", lo, hi, d);
    }
    *out = d;
    if (has) *has = 1;
    return 0;
}

static int get_int(pctx *p, json_t *o, const char *k, long long lo, long long hi, long long *out, int *has) {
    json_t *v = get(o, k);
    if (!v) return 0;
    long long x;
    if (json_is_integer(v)) x = json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 9e18)
        x = (long long)json_real_value(v);
    else return bad(p, k, "%s: expected an integer", k);
    if (x < lo || x > hi) return bad(p, k, "%s: must be between %lld and %lld, got %lld", k, lo, hi, x);
    *out = x;
    if (has) *has = 1;
    return 0;
}

/* An array of token ids; path names it in errors. */
static int id_array_min(pctx *p, arena *a, json_t *v, const char *field, const char *path, int32_t **ids, int *n,
                        long long min) {
    if (!json_is_array(v)) return bad(p, field, "%s: expected an array of token ids", path);
    size_t len = json_array_size(v);
    *ids = arena_alloc(a, (len + 1) * sizeof(int32_t));
    for (size_t i = 0; i < len; i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_integer(x) || json_integer_value(x) < min || json_integer_value(x) > INT32_MAX)
            return bad(p, field, "%s[%zu]: expected a non-negative integer token id", path, i);
        (*ids)[i] = (int32_t)json_integer_value(x);
    }
    *n = (int)len;
    return 0;
}

static int id_array(pctx *p, arena *a, json_t *v, const char *field, const char *path, int32_t **ids, int *n) {
    return id_array_min(p, a, v, field, path, ids, n, 0);
}

/* ---- chat messages ----------------------------------------------------------- */

static const char *ROLES[] = {"system", "user", "assistant", "tool", "function", "developer", NULL};

static int norm_message(pctx *p, json_t *m, size_t i, json_t **out) {
    char path[64];
    snprintf(path, sizeof path, "messages[%zu]", i);
    if (!json_is_object(m)) return bad(p, "messages", "%s: expected an object", path);
    const char *role = json_string_value(json_object_get(m, "role"));
    if (!role) return bad(p, "messages", "%s.role: missing (expected one of system, user, assistant, tool, developer)", path);
    int known = 0;
    for (int r = 0; ROLES[r]; r++) known |= !strcmp(role, ROLES[r]);
    if (!known)
        return bad(p, "messages", "%s.role: unknown role '%s' (expected system, user, assistant, tool or developer)",
                   path, role);
    json_t *c = json_deep_copy(m);
    if (!strcmp(role, "developer")) json_object_set_new(c, "role", json_string("system"));
    json_t *content = json_object_get(m, "content");
    if (json_is_array(content)) {
        /* Text parts are joined; this server's models read text only. */
        buf t; buf_init(&t);
        for (size_t j = 0; j < json_array_size(content); j++) {
            json_t *part = json_array_get(content, j);
            const char *type = json_string_value(json_object_get(part, "type"));
            if (!type || strcmp(type, "text")) {
                buf_free(&t); json_decref(c);
                return bad(p, "messages", "%s.content[%zu].type: '%s' is not supported (text only)", path, j,
                           type ? type : "(missing)");
            }
            const char *txt = json_string_value(json_object_get(part, "text"));
            if (!txt) { buf_free(&t); json_decref(c); return bad(p, "messages", "%s.content[%zu].text: expected a string", path, j); }
            if (j) buf_putc(&t, '\n');
            buf_puts(&t, txt);
        }
        json_object_set_new(c, "content", json_string(t.data ? t.data : ""));
        buf_free(&t);
    } else if (content && !json_is_string(content) && !json_is_null(content)) {
        json_decref(c);
        return bad(p, "messages", "%s.content: expected a string, an array of content parts or null", path);
    } else if (!content || json_is_null(content)) {
        int has_calls = json_array_size(json_object_get(m, "tool_calls")) > 0;
        if (strcmp(role, "assistant") || !has_calls) {
            if (!content && strcmp(role, "assistant")) {
                json_decref(c);
                return bad(p, "messages", "%s.content: missing", path);
            }
        }
        json_object_set_new(c, "content", json_string(""));
    }
    /* Templates iterate tool_call.arguments as a mapping: decode JSON strings
     * (SGLang does the same before rendering). */
    json_t *calls = json_object_get(c, "tool_calls");
    if (calls && !json_is_array(calls) && !json_is_null(calls)) {
        json_decref(c);
        return bad(p, "messages", "%s.tool_calls: expected an array", path);
    }
    for (size_t j = 0; j < json_array_size(calls); j++) {
        json_t *f = json_object_get(json_array_get(calls, j), "function");
        if (!json_is_object(f) || !json_is_string(json_object_get(f, "name"))) {
            json_decref(c);
            return bad(p, "messages", "%s.tool_calls[%zu].function.name: expected a string", path, j);
        }
        json_t *a = json_object_get(f, "arguments");
        if (json_is_string(a)) {
            json_t *d = json_loads(json_string_value(a), 0, NULL);
            if (json_is_object(d)) json_object_set_new(f, "arguments", d);
            else json_decref(d);
        }
    }
    *out = c;
    return 0;
}

static int parse_tools(pctx *p, srv_req *r) {
    json_t *tools = get(r->root, "tools");
    if (tools && !json_is_array(tools)) return bad(p, "tools", "tools: expected an array");
    for (size_t i = 0; i < json_array_size(tools); i++) {
        json_t *t = json_array_get(tools, i);
        const char *type = json_string_value(json_object_get(t, "type"));
        if (!json_is_object(t) || (type && strcmp(type, "function")))
            return bad(p, "tools", "tools[%zu]: expected {\"type\": \"function\", \"function\": {...}}", i);
        json_t *f = json_object_get(t, "function");
        if (!json_is_object(f) || !json_is_string(json_object_get(f, "name")))
            return bad(p, "tools", "tools[%zu].function.name: expected a string", i);
        json_t *params = json_object_get(f, "parameters");
        if (params && !json_is_object(params) && !json_is_null(params))
            return bad(p, "tools", "tools[%zu].function.parameters: expected a JSON schema object", i);
    }
    if (json_array_size(tools)) r->tools = tools;
    r->tool_choice = r->tools ? TC_AUTO : TC_NONE;
    json_t *tc = get(r->root, "tool_choice");
    if (tc) {
        if (json_is_string(tc)) {
            const char *s = json_string_value(tc);
            if (!strcmp(s, "none")) r->tool_choice = TC_NONE;
            else if (!strcmp(s, "auto")) r->tool_choice = r->tools ? TC_AUTO : TC_NONE;
            else if (!strcmp(s, "required")) {
                if (!r->tools) return bad(p, "tool_choice", "tool_choice: \"required\" needs at least one tool in tools");
                r->tool_choice = TC_REQUIRED;
            } else return bad(p, "tool_choice", "tool_choice: expected \"none\", \"auto\", \"required\" or a named function, got \"%s\"", s);
        } else if (json_is_object(tc)) {
            const char *type = json_string_value(json_object_get(tc, "type"));
            if (type && strcmp(type, "function"))
                return bad(p, "tool_choice", "tool_choice.type: expected \"function\", got \"%s\"", type);
            const char *name = json_string_value(json_object_get(json_object_get(tc, "function"), "name"));
            if (!name) return bad(p, "tool_choice", "tool_choice.function.name: expected a string");
            int found = 0;
            for (size_t i = 0; i < json_array_size(r->tools) && !found; i++)
                found = !strcmp(json_string_value(json_object_get(json_object_get(json_array_get(r->tools, i), "function"),
                                                                  "name")), name);
            if (!found) return bad(p, "tool_choice", "tool_choice.function.name: '%s' is not among the request's tools", name);
            r->tool_choice = TC_NAMED;
            r->tool_choice_name = name;
        } else {
            return bad(p, "tool_choice", "tool_choice: expected a string or an object");
        }
    }
    return 0;
}

static int parse_chat(pctx *p, srv_req *r) {
    json_t *msgs = json_object_get(r->root, "messages");
    if (!msgs) return bad(p, "messages", "messages: required");
    if (!json_is_array(msgs) || !json_array_size(msgs))
        return bad(p, "messages", "messages: expected a non-empty array of messages");
    r->messages = json_array();
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = NULL;
        int rc = norm_message(p, json_array_get(msgs, i), i, &m);
        if (rc) return rc;
        json_array_append_new(r->messages, m);
    }
    int rc = parse_tools(p, r);
    if (rc) return rc;
    int par = 1;
    if ((rc = get_bool(p, r->root, "parallel_tool_calls", &par))) return rc;
    r->one_call = !par;
    json_t *kw = get(r->root, "chat_template_kwargs");
    if (kw && !json_is_object(kw)) return bad(p, "chat_template_kwargs", "chat_template_kwargs: expected an object");
    r->chat_template_kwargs = kw;
    r->enable_thinking = -1;
    json_t *et = json_object_get(kw, "enable_thinking");
    if (et && !json_is_null(et)) {
        if (!json_is_boolean(et)) return bad(p, "chat_template_kwargs", "chat_template_kwargs.enable_thinking: expected true or false");
        r->enable_thinking = json_is_true(et);
    }
    json_t *effort = get(r->root, "reasoning_effort");
    if (effort) {
        const char *s = json_string_value(effort);
        if (!s || (strcmp(s, "none") && strcmp(s, "minimal") && strcmp(s, "low") && strcmp(s, "medium") &&
                   strcmp(s, "high") && strcmp(s, "max")))
            return bad(p, "reasoning_effort", "reasoning_effort: expected none, low, medium, high or max");
        if (!strcmp(s, "none") && r->enable_thinking < 0) {
            /* the template must see it too */
            r->enable_thinking = 0;
            r->own_kwargs = kw ? json_deep_copy(kw) : json_object();
            json_object_set_new(r->own_kwargs, "enable_thinking", json_false());
            r->chat_template_kwargs = r->own_kwargs;
        }
    }
    r->separate_reasoning = 1;
    r->stream_reasoning = 1;
    if ((rc = get_bool(p, r->root, "separate_reasoning", &r->separate_reasoning))) return rc;
    if ((rc = get_bool(p, r->root, "stream_reasoning", &r->stream_reasoning))) return rc;
    json_t *lp = get(r->root, "logprobs");
    if (lp) {
        if (!json_is_boolean(lp)) return bad(p, "logprobs", "logprobs: expected true or false");
        r->logprobs = json_is_true(lp);
    }
    long long tl = 0; int has_tl = 0;
    if ((rc = get_int(p, r->root, "top_logprobs", 0, 20, &tl, &has_tl))) return rc;
    if (has_tl && tl > 0 && !r->logprobs) return bad(p, "top_logprobs", "top_logprobs: requires logprobs to be true");
    r->top_logprobs = (int)tl;
    return 0;
}

static int parse_completion(pctx *p, srv_req *r) {
    json_t *pr = json_object_get(r->root, "prompt");
    if (!pr || json_is_null(pr)) return bad(p, "prompt", "prompt: required");
    if (json_is_string(pr)) {
        r->prompt_strings = json_array();
        json_array_append(r->prompt_strings, pr);
        r->n_prompts = 1;
    } else if (json_is_array(pr) && json_array_size(pr)) {
        json_t *first = json_array_get(pr, 0);
        size_t n = json_array_size(pr);
        if (json_is_integer(first)) {
            r->n_prompts = 1;
            r->prompts = arena_alloc(r->a, sizeof *r->prompts);
            int rc = id_array(p, r->a, pr, "prompt", "prompt", &r->prompts[0].ids, &r->prompts[0].n);
            if (rc) return rc;
        } else if (json_is_string(first)) {
            for (size_t i = 0; i < n; i++)
                if (!json_is_string(json_array_get(pr, i)))
                    return bad(p, "prompt", "prompt[%zu]: expected a string like the other prompts", i);
            r->prompt_strings = json_incref(pr);
            r->n_prompts = (int)n;
        } else if (json_is_array(first)) {
            r->n_prompts = (int)n;
            r->prompts = arena_alloc(r->a, n * sizeof *r->prompts);
            for (size_t i = 0; i < n; i++) {
                char path[32];
                snprintf(path, sizeof path, "prompt[%zu]", i);
                int rc = id_array(p, r->a, json_array_get(pr, i), "prompt", path, &r->prompts[i].ids, &r->prompts[i].n);
                if (rc) return rc;
                if (!r->prompts[i].n) return bad(p, "prompt", "%s: empty", path);
            }
        } else {
            return bad(p, "prompt", "prompt[0]: expected a string, a token id or an array of token ids");
        }
    } else {
        return bad(p, "prompt", "prompt: expected a string, a list of strings, a list of token ids or a list of lists of token ids");
    }
    if (r->n_prompts > 256) return bad(p, "prompt", "prompt: at most 256 prompts per request, got %d", r->n_prompts);
    if (r->n_prompts * r->n > 256)
        return bad(p, "n", "n: %d prompts x n = %d would make %d completions; at most 256 per request", r->n_prompts,
                   r->n, r->n_prompts * r->n);
    int rc = get_bool(p, r->root, "echo", &r->echo);
    if (rc) return rc;
    long long lp = 0; int has = 0;
    if ((rc = get_int(p, r->root, "logprobs", 0, 20, &lp, &has))) return rc;
    r->logprobs = has;
    r->top_logprobs = (int)lp;
    json_t *sfx = get(r->root, "suffix");
    if (sfx && !(json_is_string(sfx) && !json_string_length(sfx)))
        return bad(p, "suffix", "suffix: not supported");
    return 0;
}

/* ---- common fields ------------------------------------------------------------ */

static int parse_common(pctx *p, srv_req *r, int allow_force_ids) {
    json_t *o = r->root;
    int rc;
    json_t *model = get(o, "model");
    if (model && !json_is_string(model)) return bad(p, "model", "model: expected a string");
    r->model = json_string_value(model);
    ls_sampling *s = &r->s;
    double d; long long x; int has;
    d = s->temperature; if ((rc = get_num(p, o, "temperature", 0, INFINITY, 0, &d, NULL))) return rc; s->temperature = (float)d;
    d = s->top_p; if ((rc = get_num(p, o, "top_p", 0, 1, 1, &d, NULL))) return rc; s->top_p = (float)d;
    x = s->top_k; if ((rc = get_int(p, o, "top_k", -1, 1 << 30, &x, NULL))) return rc; s->top_k = (int)x;
    d = s->min_p; if ((rc = get_num(p, o, "min_p", 0, 1, 0, &d, NULL))) return rc; s->min_p = (float)d;
    d = s->repetition_penalty; if ((rc = get_num(p, o, "repetition_penalty", 0, 2, 1, &d, NULL))) return rc; s->repetition_penalty = (float)d;
    d = s->presence_penalty; if ((rc = get_num(p, o, "presence_penalty", -2, 2, 0, &d, NULL))) return rc; s->presence_penalty = (float)d;
    d = s->frequency_penalty; if ((rc = get_num(p, o, "frequency_penalty", -2, 2, 0, &d, NULL))) return rc; s->frequency_penalty = (float)d;
    has = 0;
    if ((rc = get_int(p, o, "seed", INT64_MIN, INT64_MAX, &x, &has))) return rc;
    if (has) { s->has_seed = 1; s->seed = (uint64_t)x; }
    has = 0;
    long long mt = 0;
    if ((rc = get_int(p, o, "max_tokens", 1, 1 << 30, &mt, &has))) return rc;
    if (has) r->max_tokens_field = "max_tokens";
    int has_mct = 0;
    if (r->kind == SRV_CHAT && (rc = get_int(p, o, "max_completion_tokens", 1, 1 << 30, &mt, &has_mct))) return rc;
    if (has_mct) r->max_tokens_field = "max_completion_tokens";
    if (has || has_mct) { s->max_tokens = (int)mt; r->has_max_tokens = 1; }
    else s->max_tokens = r->kind == SRV_COMPLETION ? 16 : 0; /* OpenAI defaults: 16 / up to the context */
    x = 0;
    if ((rc = get_int(p, o, "min_tokens", 0, 1 << 30, &x, NULL))) return rc;
    s->min_tokens = (int)x;
    if ((rc = get_bool(p, o, "ignore_eos", &s->ignore_eos))) return rc;
    if ((rc = get_bool(p, o, "skip_special_tokens", &s->skip_special_tokens))) return rc;
    x = 1;
    if ((rc = get_int(p, o, "n", 1, MAX_N, &x, NULL))) return rc;
    r->n = (int)x;
    json_t *bo = get(o, "best_of");
    if (bo && !(json_is_integer(bo) && json_integer_value(bo) == r->n))
        return bad(p, "best_of", "best_of: only best_of == n is supported");
    if ((rc = get_bool(p, o, "stream", &r->stream))) return rc;
    json_t *so = get(o, "stream_options");
    if (so) {
        if (!json_is_object(so)) return bad(p, "stream_options", "stream_options: expected an object");
        if ((rc = get_bool(p, so, "include_usage", &r->include_usage))) return rc;
        if ((rc = get_bool(p, so, "continuous_usage_stats", &r->continuous_usage))) return rc;
    }
    /* stop: a string or a list of strings */
    json_t *stop = get(o, "stop");
    if (stop) {
        size_t n = json_is_string(stop) ? 1 : json_array_size(stop);
        if (!json_is_string(stop) && !json_is_array(stop)) return bad(p, "stop", "stop: expected a string or a list of strings");
        if (n > MAX_STOP) return bad(p, "stop", "stop: at most %d stop strings, got %zu", MAX_STOP, n);
        r->stop = arena_alloc(r->a, (n + 1) * sizeof(char *));
        for (size_t i = 0; i < n; i++) {
            json_t *v = json_is_string(stop) ? stop : json_array_get(stop, i);
            if (!json_is_string(v)) return bad(p, "stop", "stop[%zu]: expected a string", i);
            if (!json_string_length(v)) return bad(p, "stop", "stop[%zu]: empty stop string", i);
            r->stop[r->n_stop++] = json_string_value(v);
        }
        s->stop = r->stop;
        s->n_stop = r->n_stop;
    }
    json_t *sti = get(o, "stop_token_ids");
    if (sti) {
        if ((rc = id_array(p, r->a, sti, "stop_token_ids", "stop_token_ids", &r->stop_ids, &r->n_stop_ids))) return rc;
        s->stop_ids = r->stop_ids;
        s->n_stop_ids = r->n_stop_ids;
    }
    json_t *fi = get(o, "force_ids");
    if (fi) {
        if (!allow_force_ids)
            return bad(p, "force_ids", "force_ids: a test-only field, accepted only when the server runs with "
                       "LASTSTAND_TEST_FORCE_IDS=1");
        /* -1 is the engine's test hook for NaN logits */
        if ((rc = id_array_min(p, r->a, fi, "force_ids", "force_ids", &r->force_ids, &r->n_force, -1))) return rc;
        s->force_ids = r->force_ids;
        s->n_force = r->n_force;
    }
    json_t *user = get(o, "user");
    if (user && !json_is_string(user)) return bad(p, "user", "user: expected a string");
    r->user = json_string_value(user);
    json_t *rf = get(o, "response_format");
    if (rf) {
        if (!json_is_object(rf)) return bad(p, "response_format", "response_format: expected an object");
        const char *t = json_string_value(json_object_get(rf, "type"));
        if (!t) return bad(p, "response_format", "response_format.type: expected a string");
        if (!strcmp(t, "json_object")) {
            r->rf_kind = RF_JSON_OBJECT;
        } else if (!strcmp(t, "json_schema")) {
            json_t *js = json_object_get(rf, "json_schema");
            if (!json_is_object(js)) return bad(p, "response_format", "response_format.json_schema: expected an object");
            json_t *nm = json_object_get(js, "name");
            if (nm && !json_is_string(nm)) return bad(p, "response_format", "response_format.json_schema.name: expected a string");
            json_t *sc = json_object_get(js, "schema");
            if (!sc) sc = json_object_get(js, "schema_"); /* some SDK versions */
            if (!sc) return bad(p, "response_format", "response_format.json_schema.schema: required");
            if (!json_is_object(sc) && !json_is_boolean(sc))
                return bad(p, "response_format", "response_format.json_schema.schema: expected a JSON Schema object");
            json_t *stv = json_object_get(js, "strict");
            if (stv && !json_is_boolean(stv) && !json_is_null(stv))
                return bad(p, "response_format", "response_format.json_schema.strict: expected true or false");
            r->rf_kind = RF_JSON_SCHEMA;
            r->rf_schema = sc;
            r->rf_strict = json_is_true(stv);
            r->rf_path = "response_format.json_schema.schema";
        } else if (strcmp(t, "text")) {
            return bad(p, "response_format", "response_format.type: expected text, json_object or json_schema, got '%s'", t);
        }
    }
    /* SGLang's extensions: the whole output matches a regular expression / an EBNF grammar */
    static const char *const gk[] = {"regex", "ebnf"};
    for (int k = 0; k < 2; k++) {
        json_t *rx = get(o, gk[k]);
        if (!rx) continue;
        if (!json_is_string(rx))
            return bad(p, gk[k], "%s: expected %s", gk[k], k ? "an EBNF grammar string" : "a regular expression string");
        if (r->rf_kind)
            return bad(p, gk[k], "%s: cannot be combined with response_format or another constraint", gk[k]);
        r->rf_kind = k ? RF_EBNF : RF_REGEX;
        r->regex = json_string_value(rx);
        r->rf_path = gk[k];
    }
    json_t *lb = get(o, "logit_bias");
    if (lb) {
        if (!json_is_object(lb)) return bad(p, "logit_bias", "logit_bias: expected an object of token id -> bias");
        size_t n = json_object_size(lb);
        r->lb_ids = arena_alloc(r->a, (n + 1) * sizeof *r->lb_ids);
        r->lb = arena_alloc(r->a, (n + 1) * sizeof *r->lb);
        const char *k;
        json_t *v;
        json_object_foreach(lb, k, v) {
            char *end = NULL;
            long long id = strtoll(k, &end, 10);
            if (!*k || *end || id < 0 || id > INT32_MAX)
                return bad(p, "logit_bias", "logit_bias.%s: the key must be a token id", k);
            if (!json_is_number(v) || !(json_number_value(v) >= -100 && json_number_value(v) <= 100))
                return bad(p, "logit_bias", "logit_bias.%s: the bias must be a number in [-100, 100]", k);
            r->lb_ids[r->n_lb] = (int32_t)id;
            r->lb[r->n_lb++] = (float)json_number_value(v);
        }
        s->logit_bias_ids = r->lb_ids;
        s->logit_bias = r->lb;
        s->n_logit_bias = r->n_lb;
    }
    return 0;
}

int req_parse(srv_req *r, int kind, const char *body, size_t len, int allow_force_ids,
              const ls_sampling *defaults, char *param, size_t paramn, ls_err *e) {
    memset(r, 0, sizeof *r);
    r->a = arena_new(4096);
    r->kind = kind;
    if (defaults) r->s = *defaults;
    else ls_sampling_default(&r->s);
    if (param && paramn) param[0] = 0;
    pctx p = {e, param, paramn};
    json_error_t je;
    r->root = json_loadb(body ? body : "", len, JSON_REJECT_DUPLICATES, &je);
    if (!r->root)
        return errf(e, ERR_INVAL, "invalid JSON body: line %d, column %d: %s", je.line, je.column, je.text);
    if (!json_is_object(r->root)) return errf(e, ERR_INVAL, "the request body must be a JSON object");
    int rc = parse_common(&p, r, allow_force_ids);
    if (rc) return rc;
    rc = kind == SRV_CHAT ? parse_chat(&p, r) : parse_completion(&p, r);
    if (rc) return rc;
    r->s.logprobs = r->logprobs;
    r->s.top_logprobs = r->top_logprobs;
    return 0;
}

void req_free(srv_req *r) {
    json_decref(r->root);
    json_decref(r->messages);
    json_decref(r->prompt_strings);
    json_decref(r->own_kwargs);
    ls_grammar_free(r->grammar);
    if (r->a) arena_free(r->a);
    memset(r, 0, sizeof *r);
}

json_t *req_model_sampling_defaults(const char *model_dir, ls_sampling *out) {
    ls_sampling_default(out);
    json_t *found = json_object();
    if (!model_dir || !strncmp(model_dir, "synth:", 6)) return found;
    char path[4096];
    snprintf(path, sizeof path, "%s/generation_config.json", model_dir);
    json_t *g = json_load_file(path, 0, NULL);
    if (!json_is_object(g)) { json_decref(g); return found; }
    static const char *keys[] = {"temperature", "top_p", "top_k", "min_p", "repetition_penalty"};
    for (int i = 0; i < 5; i++) {
        json_t *v = json_object_get(g, keys[i]);
        if (!json_is_number(v)) continue;
        double d = json_number_value(v);
        /* values a request could not send are ignored, as a bad request would be */
        if (i == 0 && d >= 0) out->temperature = (float)d;
        else if (i == 1 && d > 0 && d <= 1) out->top_p = (float)d;
        else if (i == 2 && d >= -1 && d == floor(d)) out->top_k = (int)d;
        else if (i == 3 && d >= 0 && d <= 1) out->min_p = (float)d;
        else if (i == 4 && d > 0 && d <= 2) out->repetition_penalty = (float)d;
        else continue;
        json_object_set(found, keys[i], v);
    }
    json_decref(g);
    return found;
}
