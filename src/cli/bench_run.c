/* bench_run.c: the flags of `laststand bench` (shared with `sweep`) and one
 * whole benchmark run: model discovery, the dataset, then per concurrency
 * level a warm-up, the timed run, its table, its JSON line; the sweep summary
 * and the plot at the end.
 *
 * The same prompts (same --seed) are sent at every level, so levels differ
 * only in concurrency, as separate sglang.bench_serving runs with one seed do.
 */
#include "cli/bench.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

const char *const BENCH_FLAGS_HELP =
    "  --base-url URL             server root, e.g. http://127.0.0.1:30000 (required)\n"
    "  --backend B                openai-chat (/v1/chat/completions, default) or openai (/v1/completions)\n"
    "  --model NAME               model field of requests (default: first id of GET /v1/models)\n"
    "  --num-prompts N[,N..]      requests per concurrency level, or one count per level (default 1000)\n"
    "  --random-input-len I       input tokens (default 1024)\n"
    "  --random-output-len O      output tokens, sent as max_tokens with ignore_eos (default 1024)\n"
    "  --random-range-ratio R     lengths ~ U[int(len*R), len] as in sglang.bench_serving (default 0.0;\n"
    "                             1.0 = fixed lengths)\n"
    "  --max-concurrency C[,C..]  in-flight limit; a list runs one level per value (default: no limit)\n"
    "  --request-rate R|inf       Poisson arrivals at R req/s, or all at once (default inf)\n"
    "  --warmup-requests K        untimed requests before each level (default 1)\n"
    "  --seed S                   dataset and arrival seed (default 1)\n"
    "  --api-key KEY              sent as Authorization: Bearer KEY\n"
    "  --output-file F            JSON lines, one object per level (the file is rewritten)\n"
    "  --plot F.svg               chart of output throughput and median TPOT against concurrency\n"
    "  --tokenizer-path DIR       draw prompt ids from a local tokenizer.json instead of the server's /tokenize\n"
    "  --disable-stream           non-streaming requests (TTFT = latency)\n"
    "  --request-timeout S        per-request limit in seconds (default: none)\n"
    "  --extra-request-body JSON  fields merged into every request, e.g. '{\"logprobs\":0}' (times servers\n"
    "                             that stream no text: a chunk with a token's logprobs counts as a token)\n"
    "  --output-details           add every request (prompt, usage, TTFT, e2e, text, error) to the JSON lines\n";

void bench_opts_default(bench_opts *o) {
    memset(o, 0, sizeof *o);
    o->backend = "openai-chat";
    o->num_prompts = 1000;
    o->input_len = 1024;
    o->output_len = 1024;
    o->range_ratio = 0.0;
    o->request_rate = INFINITY;
    o->warmup = 1;
    o->seed = 1;
    o->stream = 1;
}

void bench_opts_free(bench_opts *o) {
    free(o->base_url_buf);
    o->base_url_buf = NULL;
    o->base_url = NULL;
    json_decref(o->extra_body);
    o->extra_body = NULL;
    free(o->conc);
    free(o->level_prompts);
    o->conc = o->level_prompts = NULL;
    o->n_conc = o->n_level_prompts = 0;
}

static int parse_i(const char *flag, const char *v, long lo, long hi, int *out, ls_err *e) {
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (end == v || *end || errno || x < lo || x > hi)
        return errf(e, ERR_INVAL, "%s: '%s' is not an integer in [%ld, %ld]", flag, v, lo, hi);
    *out = (int)x;
    return 0;
}

static int parse_d(const char *flag, const char *v, double lo, double hi, double *out, ls_err *e) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (end == v || *end || errno || !(x >= lo && x <= hi))
        return errf(e, ERR_INVAL, "%s: '%s' is not a number in [%g, %g]", flag, v, lo, hi);
    *out = x;
    return 0;
}

int bench_opts_parse_flag(bench_opts *o, int argc, char **argv, int *i, ls_err *e) {
    static const char *const with_value[] = {
        "--base-url", "--backend", "--model", "--num-prompts", "--random-input-len", "--random-input",
        "--random-output-len", "--random-output", "--random-range-ratio", "--max-concurrency",
        "--request-rate", "--warmup-requests", "--seed", "--api-key", "--output-file", "--plot",
        "--tokenizer-path", "--request-timeout", "--dataset-name", "--extra-request-body"};
    const char *a = argv[*i];
    if (!strcmp(a, "--disable-stream")) {
        o->stream = 0;
        (*i)++;
        return 1;
    }
    if (!strcmp(a, "--output-details")) {
        o->output_details = 1;
        (*i)++;
        return 1;
    }
    const char *eq = strchr(a, '=');
    size_t nlen = eq ? (size_t)(eq - a) : strlen(a);
    const char *flag = NULL;
    for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++)
        if (strlen(with_value[k]) == nlen && !strncmp(a, with_value[k], nlen)) flag = with_value[k];
    if (!flag) return 0;
    const char *v;
    if (eq) v = eq + 1, (*i)++;
    else {
        if (*i + 1 >= argc) return errf(e, ERR_INVAL, "%s needs a value", flag);
        v = argv[*i + 1];
        *i += 2;
    }
    int rc = 0;
    if (!strcmp(flag, "--base-url")) {
        char *s = xstrdup(v);
        free(o->base_url_buf);
        o->base_url_buf = s;
        size_t n = strlen(s);
        while (n && s[n - 1] == '/') s[--n] = 0;
        if (strncmp(s, "http://", 7) && strncmp(s, "https://", 8))
            return errf(e, ERR_INVAL, "--base-url: '%s' is not an http:// or https:// URL", v);
        o->base_url = s;
    } else if (!strcmp(flag, "--backend")) {
        if (strcmp(v, "openai-chat") && strcmp(v, "openai"))
            return errf(e, ERR_INVAL, "--backend: '%s' is not openai-chat or openai", v);
        o->backend = v;
    } else if (!strcmp(flag, "--model")) o->model = v;
    else if (!strcmp(flag, "--num-prompts")) {
        free(o->level_prompts);
        o->level_prompts = NULL;
        o->n_level_prompts = 0;
        if (!strchr(v, ',')) rc = parse_i(flag, v, 1, 10000000, &o->num_prompts, e);
        else {
            o->n_level_prompts = parse_int_list(v, &o->level_prompts);
            if (o->n_level_prompts <= 0)
                return errf(e, ERR_INVAL, "--num-prompts: '%s' is not an integer or a list like 16,64,256", v);
            o->num_prompts = 0;
            for (int k = 0; k < o->n_level_prompts; k++) {
                if (o->level_prompts[k] < 1 || o->level_prompts[k] > 10000000)
                    return errf(e, ERR_INVAL, "--num-prompts: %d is not in [1, 10000000]", o->level_prompts[k]);
                if (o->level_prompts[k] > o->num_prompts) o->num_prompts = o->level_prompts[k];
            }
        }
    }
    else if (!strcmp(flag, "--random-input-len") || !strcmp(flag, "--random-input"))
        rc = parse_i(flag, v, 1, 10000000, &o->input_len, e);
    else if (!strcmp(flag, "--random-output-len") || !strcmp(flag, "--random-output"))
        rc = parse_i(flag, v, 1, 10000000, &o->output_len, e);
    else if (!strcmp(flag, "--random-range-ratio")) rc = parse_d(flag, v, 0, 1, &o->range_ratio, e);
    else if (!strcmp(flag, "--max-concurrency")) {
        free(o->conc);
        o->n_conc = parse_int_list(v, &o->conc);
        if (o->n_conc <= 0) return errf(e, ERR_INVAL, "--max-concurrency: '%s' is not a list of integers like 1,8,64", v);
        for (int k = 0; k < o->n_conc; k++)
            if (o->conc[k] < 1) return errf(e, ERR_INVAL, "--max-concurrency: %d is not >= 1", o->conc[k]);
    } else if (!strcmp(flag, "--request-rate")) {
        if (!strcmp(v, "inf")) o->request_rate = INFINITY;
        else rc = parse_d(flag, v, 1e-9, 1e9, &o->request_rate, e);
    } else if (!strcmp(flag, "--warmup-requests")) rc = parse_i(flag, v, 0, 100000, &o->warmup, e);
    else if (!strcmp(flag, "--seed")) {
        int s;
        rc = parse_i(flag, v, 0, 2147483647L, &s, e);
        o->seed = (uint64_t)s;
    } else if (!strcmp(flag, "--api-key")) o->api_key = v;
    else if (!strcmp(flag, "--output-file")) o->output_file = v;
    else if (!strcmp(flag, "--plot")) o->plot_file = v;
    else if (!strcmp(flag, "--tokenizer-path")) o->tokenizer_path = v;
    else if (!strcmp(flag, "--request-timeout")) rc = parse_d(flag, v, 0, 1e7, &o->timeout_s, e);
    else if (!strcmp(flag, "--extra-request-body")) {
        json_error_t je;
        json_t *j = json_loads(v, 0, &je);
        if (!json_is_object(j)) {
            json_decref(j);
            return errf(e, ERR_INVAL, "--extra-request-body: not a JSON object (%s)", j ? "another JSON value" : je.text);
        }
        json_decref(o->extra_body);
        o->extra_body = j;
    } else if (!strcmp(flag, "--dataset-name")) {
        if (strcmp(v, "random") && strcmp(v, "random-ids"))
            return errf(e, ERR_INVAL, "--dataset-name: '%s' is not supported (only random)", v);
    }
    return rc ? rc : 1;
}

int bench_opts_check(const bench_opts *o, ls_err *e) {
    if (!o->base_url) return errf(e, ERR_INVAL, "--base-url is required");
    if (o->level_prompts && o->n_level_prompts != (o->n_conc ? o->n_conc : 1))
        return errf(e, ERR_INVAL, "--num-prompts: %d counts for %d --max-concurrency levels", o->n_level_prompts,
                    o->n_conc ? o->n_conc : 1);
    return 0;
}

/* ---- request bodies --------------------------------------------------------------- */

static char *make_body(const bench_opts *o, const char *model, const bench_dataset *d, const bench_prompt *p,
                       int output_len) {
    json_t *b = json_object();
    if (model) json_object_set_new(b, "model", json_string(model));
    if (!strcmp(o->backend, "openai-chat")) {
        json_object_set_new(b, "messages", json_pack("[{s:s,s:s}]", "role", "user", "content", p->text));
    } else if (d->as_ids) {
        json_t *arr = json_array();
        for (int j = 0; j < p->n_ids; j++) json_array_append_new(arr, json_integer(p->ids[j]));
        json_object_set_new(b, "prompt", arr);
    } else {
        json_object_set_new(b, "prompt", json_string(p->text));
    }
    json_object_set_new(b, "max_tokens", json_integer(output_len));
    json_object_set_new(b, "min_tokens", json_integer(output_len));
    json_object_set_new(b, "ignore_eos", json_true());
    json_object_set_new(b, "temperature", json_real(0.0));
    json_object_set_new(b, "stream", json_boolean(o->stream));
    if (o->stream) json_object_set_new(b, "stream_options", json_pack("{s:b}", "include_usage", 1));
    if (o->extra_body) json_object_update(b, o->extra_body);
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

static void fill_reqs(const bench_opts *o, const char *model, const bench_dataset *d, bench_req *reqs, int n,
                      int warm) {
    int chat = !strcmp(o->backend, "openai-chat");
    for (int i = 0; i < n; i++) {
        const bench_prompt *p = &d->p[warm ? 0 : i];
        int ol = warm ? (p->output_len < 32 ? p->output_len : 32) : p->output_len;
        memset(&reqs[i], 0, sizeof reqs[i]);
        reqs[i].body = make_body(o, model, d, p, ol);
        reqs[i].prompt_len = p->n_ids;
        reqs[i].output_len = ol;
        reqs[i].is_chat = chat;
        reqs[i].stream = o->stream;
    }
}

/* ---- progress bar ------------------------------------------------------------------ */

typedef struct progress {
    int level;
    double t0;
    int last_done;
} progress;

static void on_progress(void *ctx, int done, int total) {
    progress *p = ctx;
    if (done == p->last_done) return;
    p->last_done = done;
    int w = 40, fill = total ? done * w / total : w;
    char bar[64];
    for (int k = 0; k < w; k++) bar[k] = k < fill ? '#' : '.';
    bar[w] = 0;
    char lvl[16];
    if (p->level > 0) snprintf(lvl, sizeof lvl, "%d", p->level);
    else snprintf(lvl, sizeof lvl, "inf");
    fprintf(stderr, "\rconcurrency %-5s [%s] %d/%d %.1fs", lvl, bar, done, total, now_sec() - p->t0);
    if (done == total) fputc('\n', stderr);
    fflush(stderr);
}

/* ---- the run ------------------------------------------------------------------------ */

char *bench_discover_model(const bench_opts *o, ls_err *e) {
    buf url;
    buf_init(&url);
    buf_printf(&url, "%s/v1/models", o->base_url);
    int status = 0;
    char *resp = NULL;
    int rc = bench_http_simple(url.data, o->api_key, NULL, 30, &status, &resp, e);
    buf_free(&url);
    if (rc) {
        err_prefix(e, "--base-url: GET /v1/models");
        return NULL;
    }
    char *model = NULL;
    if (status == 200) {
        json_t *j = json_loads(resp, 0, NULL);
        json_t *d0 = json_array_get(json_object_get(j, "data"), 0);
        const char *id = json_string_value(json_object_get(d0, "id"));
        if (id) model = xstrdup(id);
        json_decref(j);
    }
    if (!model) {
        char *t = bench_error_text(status, resp);
        errf(e, ERR_INVAL, "--base-url %s: GET /v1/models gave no model id (%s); give %s", o->base_url, t,
             status == 401 || status == 403 ? "the server's key with --api-key" : "--model");
        free(t);
    }
    free(resp);
    return model;
}

static void free_reqs(bench_req *reqs, int n) {
    for (int i = 0; i < n; i++) bench_req_free(&reqs[i]);
    free(reqs);
}

int bench_run(const bench_opts *o, bench_result **out, char **model_out, ls_err *e) {
    *out = NULL;
    *model_out = NULL;
    char *model = o->model ? xstrdup(o->model) : bench_discover_model(o, e);
    if (!model) return e->code ? e->code : ERR_RUNTIME;
    bench_dataset d;
    int rc = bench_dataset_make(o, model, &d, e);
    if (rc) {
        free(model);
        return rc;
    }
    log_info("bench: %d prompts, ids drawn from a pool of %d ids (%s), sent as %s", d.n, d.vocab_n,
             d.vocab_source, d.as_ids ? "token ids" : "text");
    buf url;
    buf_init(&url);
    buf_printf(&url, "%s%s", o->base_url, strcmp(o->backend, "openai-chat") ? "/v1/completions" : "/v1/chat/completions");
    FILE *jf = NULL;
    if (o->output_file && !(jf = fopen(o->output_file, "w"))) {
        rc = errf(e, ERR_IO, "--output-file %s: %s", o->output_file, strerror(errno));
        goto done;
    }
    int32_t unlimited = 0;
    const int32_t *levels = o->n_conc ? o->conc : &unlimited;
    int nlev = o->n_conc ? o->n_conc : 1;
    bench_result *rs = xcalloc(nlev, sizeof *rs);
    *out = rs;
    int tty = isatty(2);
    for (int li = 0; li < nlev; li++) {
        if (o->warmup > 0) {
            bench_req *w = xcalloc(o->warmup, sizeof *w);
            fill_reqs(o, model, &d, w, o->warmup, 1);
            double dur;
            rc = bench_http_run(url.data, o->api_key, w, o->warmup, o->warmup, INFINITY, 0, o->timeout_s, NULL,
                                NULL, &dur, e);
            int any = 0;
            for (int i = 0; i < o->warmup; i++) any |= w[i].ok;
            if (!rc && !any)
                rc = errf(e, ERR_RUNTIME, "warm-up failed (%d requests to %s): %s", o->warmup, url.data,
                          w[0].error ? w[0].error : "?");
            free_reqs(w, o->warmup);
            if (rc) goto done;
        }
        /* the first n prompts of the dataset (all levels share its prefix) */
        int n = o->level_prompts ? o->level_prompts[li] : d.n;
        bench_req *reqs = xcalloc(n, sizeof *reqs);
        fill_reqs(o, model, &d, reqs, n, 0);
        progress pg = {levels[li], now_sec(), -1};
        double dur = 0;
        rc = bench_http_run(url.data, o->api_key, reqs, n, levels[li], o->request_rate, o->seed + li, o->timeout_s,
                            tty && !o->quiet ? on_progress : NULL, &pg, &dur, e);
        if (rc) {
            free_reqs(reqs, n);
            goto done;
        }
        bench_metrics(reqs, n, dur, &rs[li]);
        if (o->output_details) rs[li].details = bench_details_json(reqs, n, &d);
        free_reqs(reqs, n);
        rs[li].max_concurrency = levels[li];
        rs[li].request_rate = o->request_rate;
        if (!o->quiet) bench_print_level(stdout, &rs[li], o, model);
        if (jf) {
            json_t *j = bench_result_json(&rs[li], o, model, &d);
            char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(10));
            fprintf(jf, "%s\n", s);
            fflush(jf);
            free(s);
            json_decref(j);
        }
    }
    if (!o->quiet && nlev > 1) bench_print_summary(stdout, rs, nlev);
    if (o->plot_file) {
        char title[256];
        snprintf(title, sizeof title, "%s: random %d in / %d out, %s", model, o->input_len, o->output_len, o->backend);
        rc = bench_plot_svg(o->plot_file, rs, nlev, title, e);
    }
done:
    if (jf && fclose(jf) && !rc) rc = errf(e, ERR_IO, "--output-file %s: %s", o->output_file, strerror(errno));
    buf_free(&url);
    bench_dataset_free(&d);
    if (rc) {
        if (*out) {
            for (int li = 0; li < (o->n_conc ? o->n_conc : 1); li++) bench_result_free(&(*out)[li]);
            free(*out);
            *out = NULL;
        }
        free(model);
        return rc;
    }
    *model_out = model;
    return 0;
}
