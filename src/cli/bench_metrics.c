/* bench_metrics.c: sglang.bench_serving's figures from the per-request records,
 * their JSON record and the stdout tables.
 *
 * Definitions (reference/peers-and-parsers.md section 3), over successful
 * requests only:
 *   total_output = sum of usage.completion_tokens; total_input = sum of
 *   usage.prompt_tokens (the server's own counts, chat template included);
 *   request/input/output/total throughput = count / duration;
 *   TTFT, e2e per request; TPOT = (e2e - TTFT) / (completion_tokens - 1) for
 *   requests with more than one token; ITL = every gap between chunks with
 *   text; concurrency = sum(e2e) / duration.
 * Percentiles interpolate linearly between order statistics (numpy's default)
 * and std is the population std (numpy's np.std), so figures match SGLang's.
 */
#include "cli/bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int cmp_dbl(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct_sorted(const double *v, int n, double p) {
    if (n == 0) return 0;
    double pos = p / 100.0 * (n - 1);
    int lo = (int)floor(pos);
    int hi = lo + 1 < n ? lo + 1 : lo;
    double f = pos - lo;
    return v[lo] + (v[hi] - v[lo]) * f;
}

/* v in seconds -> distribution in milliseconds; sorts v */
static bench_dist dist_of(double *v, int n) {
    bench_dist d = {0};
    d.n = n;
    if (!n) return d;
    qsort(v, n, sizeof *v, cmp_dbl);
    double s = 0;
    for (int i = 0; i < n; i++) s += v[i];
    double mean = s / n, ss = 0;
    for (int i = 0; i < n; i++) ss += (v[i] - mean) * (v[i] - mean);
    d.mean = mean * 1e3;
    d.std = sqrt(ss / n) * 1e3;
    d.median = pct_sorted(v, n, 50) * 1e3;
    d.p90 = pct_sorted(v, n, 90) * 1e3;
    d.p95 = pct_sorted(v, n, 95) * 1e3;
    d.p99 = pct_sorted(v, n, 99) * 1e3;
    d.max = v[n - 1] * 1e3;
    return d;
}

void bench_metrics(const bench_req *reqs, int n, double duration_s, bench_result *r) {
    memset(r, 0, sizeof *r);
    r->duration_s = duration_s;
    r->num_prompts = n;
    int nitl = 0;
    for (int i = 0; i < n; i++)
        if (reqs[i].ok && reqs[i].n_chunks > 1) nitl += reqs[i].n_chunks - 1;
    double *ttft = xcalloc(n + 1, sizeof(double)), *tpot = xcalloc(n + 1, sizeof(double));
    double *e2e = xcalloc(n + 1, sizeof(double)), *itl = xcalloc(nitl + 1, sizeof(double));
    int nt = 0, np = 0, ni = 0;
    double sum_e2e = 0;
    r->errors = json_array();
    for (int i = 0; i < n; i++) {
        const bench_req *q = &reqs[i];
        r->drawn_input_tokens += q->prompt_len;
        r->requested_output_tokens += q->output_len;
        if (!q->ok) {
            r->failed++;
            const char *msg = q->error ? q->error : "unknown failure";
            size_t k;
            json_t *ent = NULL;
            json_array_foreach(r->errors, k, ent) {
                if (!strcmp(json_string_value(json_object_get(ent, "error")), msg)) break;
                ent = NULL;
            }
            if (ent) json_object_set_new(ent, "count", json_integer(json_integer_value(json_object_get(ent, "count")) + 1));
            else json_array_append_new(r->errors, json_pack("{s:s,s:i}", "error", msg, "count", 1));
            continue;
        }
        r->completed++;
        r->total_input_tokens += q->prompt_tokens;
        r->total_output_tokens += q->completion_tokens;
        double lat = q->t_end - q->t_send, first = q->t_first - q->t_send;
        e2e[nt] = lat;
        ttft[nt++] = first;
        sum_e2e += lat;
        if (q->completion_tokens > 1) tpot[np++] = (lat - first) / (double)(q->completion_tokens - 1);
        for (int k = 1; k < q->n_chunks; k++) itl[ni++] = q->chunk_t[k] - q->chunk_t[k - 1];
    }
    double dur = duration_s > 0 ? duration_s : 1e-9;
    r->request_throughput = r->completed / dur;
    r->input_throughput = r->total_input_tokens / dur;
    r->output_throughput = r->total_output_tokens / dur;
    r->total_throughput = (r->total_input_tokens + r->total_output_tokens) / dur;
    r->concurrency = sum_e2e / dur;
    r->ttft = dist_of(ttft, nt);
    r->e2e = dist_of(e2e, nt);
    r->tpot = dist_of(tpot, np);
    r->itl = dist_of(itl, ni);
    free(ttft), free(tpot), free(e2e), free(itl);
}

void bench_result_free(bench_result *r) {
    json_decref(r->errors);
    json_decref(r->details);
    r->errors = r->details = NULL;
}

json_t *bench_details_json(const bench_req *reqs, int n, const bench_dataset *d) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) {
        const bench_req *q = &reqs[i];
        json_t *o = json_object();
        const bench_prompt *p = d && i < d->n ? &d->p[i] : NULL;
        if (p && p->text) json_object_set_new(o, "prompt", json_string(p->text));
        else if (p) {
            json_t *ids = json_array();
            for (int k = 0; k < p->n_ids; k++) json_array_append_new(ids, json_integer(p->ids[k]));
            json_object_set_new(o, "prompt", ids);
        }
        json_object_set_new(o, "prompt_len", json_integer(q->prompt_len));
        json_object_set_new(o, "output_len", json_integer(q->output_len));
        json_object_set_new(o, "ok", json_boolean(q->ok));
        json_object_set_new(o, "error", q->error ? json_string(q->error) : json_null());
        json_object_set_new(o, "http_status", json_integer(q->http_status));
        json_object_set_new(o, "prompt_tokens", q->have_usage ? json_integer(q->prompt_tokens) : json_null());
        json_object_set_new(o, "completion_tokens", q->have_usage ? json_integer(q->completion_tokens) : json_null());
        json_object_set_new(o, "ttft_ms", json_real(q->ok ? (q->t_first - q->t_send) * 1e3 : 0));
        json_object_set_new(o, "e2e_latency_ms", json_real((q->t_end - q->t_send) * 1e3));
        json_object_set_new(o, "chunks", json_integer(q->n_chunks));
        json_object_set_new(o, "finish_reason", q->finish_reason ? json_string(q->finish_reason) : json_null());
        const char *t = q->text.data ? q->text.data : "";
        json_object_set_new(o, "text", bench_utf8_valid(t, q->text.len) ? json_stringn(t, q->text.len) : json_null());
        json_array_append_new(a, o);
    }
    return a;
}

static void put_dist(json_t *o, const char *name, const bench_dist *d) {
    char k[64];
    static const char *const stat[] = {"mean", "median", "std", "p90", "p95", "p99", "max"};
    const double val[] = {d->mean, d->median, d->std, d->p90, d->p95, d->p99, d->max};
    for (int i = 0; i < 7; i++) {
        snprintf(k, sizeof k, "%s_%s_ms", stat[i], name);
        json_object_set_new(o, k, json_real(val[i]));
    }
}

json_t *bench_result_json(const bench_result *r, const bench_opts *o, const char *model,
                          const bench_dataset *d) {
    json_t *j = json_object();
    time_t now = time(NULL);
    char ts[32];
    strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    json_object_set_new(j, "timestamp", json_string(ts));
    /* config */
    json_object_set_new(j, "backend", json_string(o->backend));
    json_object_set_new(j, "base_url", json_string(o->base_url));
    json_object_set_new(j, "model", model ? json_string(model) : json_null());
    json_object_set_new(j, "dataset_name", json_string("random"));
    json_object_set_new(j, "num_prompts", json_integer(r->num_prompts));
    json_object_set_new(j, "random_input_len", json_integer(o->input_len));
    json_object_set_new(j, "random_output_len", json_integer(o->output_len));
    json_object_set_new(j, "random_range_ratio", json_real(o->range_ratio));
    json_object_set_new(j, "request_rate", r->request_rate > 0 && isfinite(r->request_rate)
                                               ? json_real(r->request_rate) : json_string("inf"));
    json_object_set_new(j, "max_concurrency", r->max_concurrency > 0 ? json_integer(r->max_concurrency) : json_null());
    json_object_set_new(j, "seed", json_integer((json_int_t)o->seed));
    json_object_set_new(j, "warmup_requests", json_integer(o->warmup));
    json_object_set_new(j, "stream", json_boolean(o->stream));
    if (d) {
        json_object_set_new(j, "prompt_format", json_string(d->as_ids ? "token_ids" : "text"));
        json_object_set_new(j, "vocab_source", json_string(d->vocab_source ? d->vocab_source : ""));
        json_object_set_new(j, "vocab_pool_size", json_integer(d->vocab_n));
    }
    /* results */
    json_object_set_new(j, "duration", json_real(r->duration_s));
    json_object_set_new(j, "completed", json_integer(r->completed));
    json_object_set_new(j, "failed", json_integer(r->failed));
    json_object_set_new(j, "total_input_tokens", json_integer(r->total_input_tokens));
    json_object_set_new(j, "total_output_tokens", json_integer(r->total_output_tokens));
    json_object_set_new(j, "drawn_input_tokens", json_integer(r->drawn_input_tokens));
    json_object_set_new(j, "requested_output_tokens", json_integer(r->requested_output_tokens));
    json_object_set_new(j, "server_usage", json_pack("{s:I,s:I,s:I}", "prompt_tokens", (json_int_t)r->total_input_tokens,
                                                     "completion_tokens", (json_int_t)r->total_output_tokens,
                                                     "total_tokens", (json_int_t)(r->total_input_tokens + r->total_output_tokens)));
    json_object_set_new(j, "request_throughput", json_real(r->request_throughput));
    json_object_set_new(j, "input_throughput", json_real(r->input_throughput));
    json_object_set_new(j, "output_throughput", json_real(r->output_throughput));
    json_object_set_new(j, "total_token_throughput", json_real(r->total_throughput));
    json_object_set_new(j, "concurrency", json_real(r->concurrency));
    put_dist(j, "ttft", &r->ttft);
    put_dist(j, "tpot", &r->tpot);
    put_dist(j, "itl", &r->itl);
    put_dist(j, "e2e_latency", &r->e2e);
    json_object_set_new(j, "itl_samples", json_integer(r->itl.n));
    json_object_set_new(j, "tpot_samples", json_integer(r->tpot.n));
    json_object_set_new(j, "errors", json_deep_copy(r->errors));
    if (r->details) json_object_set(j, "details", r->details);
    return j;
}

/* ---- tables ------------------------------------------------------------------- */

static void banner(FILE *f, const char *s, char c) {
    int n = 50, len = (int)strlen(s), left = (n - len) / 2, right = n - len - left;
    for (int i = 0; i < left; i++) fputc(c, f);
    fputs(s, f);
    for (int i = 0; i < right; i++) fputc(c, f);
    fputc('\n', f);
}

#define ROW_S(f, k, v) fprintf(f, "%-40s %s\n", k, v)
#define ROW_I(f, k, v) fprintf(f, "%-40s %lld\n", k, (long long)(v))
#define ROW_F(f, k, v) fprintf(f, "%-40s %.2f\n", k, (double)(v))

void bench_print_level(FILE *f, const bench_result *r, const bench_opts *o, const char *model) {
    char tmp[64];
    banner(f, " Serving Benchmark Result ", '=');
    ROW_S(f, "Backend:", o->backend);
    ROW_S(f, "Model:", model ? model : "-");
    if (r->request_rate > 0 && isfinite(r->request_rate)) snprintf(tmp, sizeof tmp, "%g", r->request_rate);
    else snprintf(tmp, sizeof tmp, "inf");
    ROW_S(f, "Traffic request rate:", tmp);
    if (r->max_concurrency > 0) snprintf(tmp, sizeof tmp, "%d", r->max_concurrency);
    else snprintf(tmp, sizeof tmp, "not set");
    ROW_S(f, "Max request concurrency:", tmp);
    ROW_I(f, "Successful requests:", r->completed);
    ROW_I(f, "Failed requests:", r->failed);
    size_t k;
    json_t *ent;
    json_array_foreach(r->errors, k, ent) {
        fprintf(f, "  %lldx %s\n", (long long)json_integer_value(json_object_get(ent, "count")),
                json_string_value(json_object_get(ent, "error")));
    }
    ROW_F(f, "Benchmark duration (s):", r->duration_s);
    ROW_I(f, "Total input tokens (server usage):", r->total_input_tokens);
    ROW_I(f, "Total generated tokens (server usage):", r->total_output_tokens);
    ROW_F(f, "Request throughput (req/s):", r->request_throughput);
    ROW_F(f, "Input token throughput (tok/s):", r->input_throughput);
    ROW_F(f, "Output token throughput (tok/s):", r->output_throughput);
    ROW_F(f, "Total token throughput (tok/s):", r->total_throughput);
    ROW_F(f, "Concurrency:", r->concurrency);
    banner(f, "End-to-End Latency", '-');
    ROW_F(f, "Mean E2E Latency (ms):", r->e2e.mean);
    ROW_F(f, "Median E2E Latency (ms):", r->e2e.median);
    ROW_F(f, "P90 E2E Latency (ms):", r->e2e.p90);
    ROW_F(f, "P99 E2E Latency (ms):", r->e2e.p99);
    banner(f, "Time to First Token", '-');
    ROW_F(f, "Mean TTFT (ms):", r->ttft.mean);
    ROW_F(f, "Median TTFT (ms):", r->ttft.median);
    ROW_F(f, "P90 TTFT (ms):", r->ttft.p90);
    ROW_F(f, "P99 TTFT (ms):", r->ttft.p99);
    banner(f, "Time per Output Token (excl. 1st token)", '-');
    ROW_F(f, "Mean TPOT (ms):", r->tpot.mean);
    ROW_F(f, "Median TPOT (ms):", r->tpot.median);
    ROW_F(f, "P90 TPOT (ms):", r->tpot.p90);
    ROW_F(f, "P99 TPOT (ms):", r->tpot.p99);
    banner(f, "Inter-Token Latency", '-');
    ROW_F(f, "Mean ITL (ms):", r->itl.mean);
    ROW_F(f, "Median ITL (ms):", r->itl.median);
    ROW_F(f, "P90 ITL (ms):", r->itl.p90);
    ROW_F(f, "P95 ITL (ms):", r->itl.p95);
    ROW_F(f, "P99 ITL (ms):", r->itl.p99);
    ROW_F(f, "Max ITL (ms):", r->itl.max);
    banner(f, "", '=');
    if (r->max_concurrency > 0) snprintf(tmp, sizeof tmp, "%d", r->max_concurrency);
    else snprintf(tmp, sizeof tmp, "unlimited");
    fprintf(f, "Headline (concurrency %s): output %.2f tok/s, median TPOT %.2f ms, median TTFT %.2f ms, %d/%d ok\n",
            tmp, r->output_throughput, r->tpot.median, r->ttft.median, r->completed, r->num_prompts);
    fflush(f);
}

void bench_print_summary(FILE *f, const bench_result *rs, int n) {
    banner(f, " Concurrency sweep ", '=');
    fprintf(f, "%6s %9s %8s %10s %10s %10s %10s %10s\n", "conc", "ok/fail", "req/s", "out tok/s", "TTFT p50",
            "TPOT p50", "ITL p50", "E2E p50");
    int best = -1;
    for (int i = 0; i < n; i++) {
        const bench_result *r = &rs[i];
        char c[16], of[24];
        if (r->max_concurrency > 0) snprintf(c, sizeof c, "%d", r->max_concurrency);
        else snprintf(c, sizeof c, "inf");
        snprintf(of, sizeof of, "%d/%d", r->completed, r->failed);
        fprintf(f, "%6s %9s %8.2f %10.2f %10.2f %10.2f %10.2f %10.2f\n", c, of, r->request_throughput,
                r->output_throughput, r->ttft.median, r->tpot.median, r->itl.median, r->e2e.median);
        if (best < 0 || r->output_throughput > rs[best].output_throughput) best = i;
    }
    fprintf(f, "(latencies in ms)\n");
    if (best >= 0) {
        const bench_result *r = &rs[best];
        char c[16];
        if (r->max_concurrency > 0) snprintf(c, sizeof c, "%d", r->max_concurrency);
        else snprintf(c, sizeof c, "unlimited");
        fprintf(f, "Headline: peak output throughput %.2f tok/s at concurrency %s (median TPOT %.2f ms, median TTFT %.2f ms)\n",
                r->output_throughput, c, r->tpot.median, r->ttft.median);
    }
    fflush(f);
}
