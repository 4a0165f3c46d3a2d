/* metrics.c: GET /metrics in the Prometheus text format (version 0.0.4).
 *
 * Names follow SGLang's production metrics with the laststand: prefix:
 * token counters, running / queued requests, KV-cache usage and pages,
 * NaN-logit failures, preemptions, TTFT / inter-token / end-to-end latency
 * histograms (seconds) from the engine, and HTTP responses by status class
 * from the server. Every sample carries model_name.
 */
#include "server/server.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static void head(buf *b, const char *name, const char *type, const char *help) {
    buf_printf(b, "# HELP laststand:%s %s\n# TYPE laststand:%s %s\n", name, help, name, type);
}

static void sample_u(buf *b, const char *name, const char *model, uint64_t v) {
    buf_printf(b, "laststand:%s{model_name=\"%s\"} %llu\n", name, model, (unsigned long long)v);
}

static void sample_f(buf *b, const char *name, const char *model, double v) {
    buf_printf(b, "laststand:%s{model_name=\"%s\"} %.9g\n", name, model, v);
}

/* counts[i]: observations in (bounds[i-1], bounds[i]]; counts[LS_HIST_BUCKETS]: above the last
 * bound. Unused trailing bounds are <= the previous one and are skipped. */
static void hist(buf *b, const char *name, const char *help, const char *model, const ls_hist *h) {
    head(b, name, "histogram", help);
    uint64_t cum = 0;
    double prev = -INFINITY;
    for (int i = 0; i < LS_HIST_BUCKETS; i++) {
        cum += h->counts[i];
        if (!(h->bounds[i] > prev)) continue;
        prev = h->bounds[i];
        buf_printf(b, "laststand:%s_bucket{model_name=\"%s\",le=\"%.6g\"} %llu\n", name, model, h->bounds[i],
                   (unsigned long long)cum);
    }
    buf_printf(b, "laststand:%s_bucket{model_name=\"%s\",le=\"+Inf\"} %llu\n", name, model, (unsigned long long)h->n);
    buf_printf(b, "laststand:%s_sum{model_name=\"%s\"} %.9g\n", name, model, h->sum);
    buf_printf(b, "laststand:%s_count{model_name=\"%s\"} %llu\n", name, model, (unsigned long long)h->n);
}

void route_metrics(srv *sv, srv_resp *rs) {
    ls_stats st;
    memset(&st, 0, sizeof st);
    ls_engine_stats(sv->eng, &st);
    /* model names are flag values: keep them label-safe */
    char model[256];
    size_t k = 0;
    for (const char *p = sv->cfg.served_model_name; *p && k < sizeof model - 1; p++)
        model[k++] = (*p == '"' || *p == '\\' || *p == '\n') ? '_' : *p;
    model[k] = 0;
    buf *b = &rs->body;
    buf_free(b);
    buf_init(b);
    head(b, "prompt_tokens_total", "counter", "Prefill tokens processed.");
    sample_u(b, "prompt_tokens_total", model, st.prompt_tokens_total);
    head(b, "generation_tokens_total", "counter", "Tokens generated.");
    sample_u(b, "generation_tokens_total", model, st.generation_tokens_total);
    head(b, "num_requests_total", "counter", "Engine requests finished.");
    sample_u(b, "num_requests_total", model, st.requests_total);
    head(b, "num_requests_failed_total", "counter", "Engine requests that ended with an error.");
    sample_u(b, "num_requests_failed_total", model, st.requests_failed_total);
    head(b, "nan_logits_total", "counter", "Requests aborted because their logits held NaN or Inf.");
    sample_u(b, "nan_logits_total", model, st.nan_logits_total);
    head(b, "preemptions_total", "counter", "Requests preempted for KV-cache space and recomputed later.");
    sample_u(b, "preemptions_total", model, st.preemptions_total);
    head(b, "num_running_reqs", "gauge", "Requests in the running batch.");
    sample_u(b, "num_running_reqs", model, (uint64_t)(st.running > 0 ? st.running : 0));
    head(b, "num_queue_reqs", "gauge", "Requests waiting for admission.");
    sample_u(b, "num_queue_reqs", model, (uint64_t)(st.queued > 0 ? st.queued : 0));
    head(b, "token_usage", "gauge", "KV-cache usage: used pages / total pages.");
    sample_f(b, "token_usage", model, st.kv_usage);
    head(b, "kv_pages_total", "gauge", "KV-cache pages.");
    sample_u(b, "kv_pages_total", model, (uint64_t)(st.kv_pages_total > 0 ? st.kv_pages_total : 0));
    head(b, "kv_pages_used", "gauge", "KV-cache pages held by running requests (shared prefix pages included).");
    sample_u(b, "kv_pages_used", model, (uint64_t)(st.kv_pages_used > 0 ? st.kv_pages_used : 0));
    head(b, "prefix_cache_query_tokens_total", "counter", "Prompt tokens of admitted requests (prefix cache on).");
    sample_u(b, "prefix_cache_query_tokens_total", model, st.prefix_query_tokens_total);
    head(b, "prefix_cache_hit_tokens_total", "counter", "Prompt tokens taken from the prefix cache (cached_tokens).");
    sample_u(b, "prefix_cache_hit_tokens_total", model, st.prefix_hit_tokens_total);
    head(b, "cache_hit_rate", "gauge", "Prefix cache hit tokens / query tokens so far.");
    sample_f(b, "cache_hit_rate", model,
             st.prefix_query_tokens_total ? (double)st.prefix_hit_tokens_total / (double)st.prefix_query_tokens_total : 0);
    head(b, "prefix_cache_pages", "gauge", "KV pages the prefix cache holds (reclaimable once unreferenced).");
    sample_u(b, "prefix_cache_pages", model, (uint64_t)(st.prefix_cached_pages > 0 ? st.prefix_cached_pages : 0));
    head(b, "kv_pages_allocated", "gauge", "KV pages off the free list (running requests' and the prefix cache's).");
    sample_u(b, "kv_pages_allocated", model, (uint64_t)(st.kv_pages_allocated > 0 ? st.kv_pages_allocated : 0));
    head(b, "prefix_cache_snapshots_used", "gauge", "GDN state snapshots held by the prefix cache.");
    sample_u(b, "prefix_cache_snapshots_used", model,
             (uint64_t)(st.prefix_snapshots_used > 0 ? st.prefix_snapshots_used : 0));
    head(b, "constrained_rows_device_total", "counter",
         "Sampled rows with a grammar mask or logit_bias, sampled on the device.");
    sample_u(b, "constrained_rows_device_total", model, st.constrained_rows_device_total);
    head(b, "constrained_rows_host_total", "counter",
         "Sampled rows with a grammar mask or logit_bias, sampled on the host from downloaded logits.");
    sample_u(b, "constrained_rows_host_total", model, st.constrained_rows_host_total);
    head(b, "spec_verify_rows_total", "counter", "Speculative decoding: decode rows that verified drafts.");
    sample_u(b, "spec_verify_rows_total", model, st.spec_verify_rows_total);
    head(b, "spec_draft_tokens_total", "counter", "Speculative decoding: draft tokens verified.");
    sample_u(b, "spec_draft_tokens_total", model, st.spec_draft_tokens_total);
    head(b, "spec_accepted_tokens_total", "counter", "Speculative decoding: draft tokens accepted (tokens gained).");
    sample_u(b, "spec_accepted_tokens_total", model, st.spec_accepted_tokens_total);
    head(b, "spec_accept_length", "gauge", "Speculative decoding: mean tokens a verifying row committed per step.");
    sample_f(b, "spec_accept_length", model,
             st.spec_verify_rows_total ? 1.0 + (double)st.spec_accepted_tokens_total / (double)st.spec_verify_rows_total : 0);
    head(b, "grammar_cache_hits_total", "counter",
         "Constraints (schema, tools, regex, EBNF) served by a grammar compiled for an earlier request.");
    sample_u(b, "grammar_cache_hits_total", model, st.grammar_cache_hits_total);
    head(b, "grammar_compiles_total", "counter", "Constraints compiled (the grammar cache missed).");
    sample_u(b, "grammar_compiles_total", model, st.grammar_compiles_total);
    hist(b, "time_to_first_token_seconds", "Time to first token.", model, &st.ttft);
    hist(b, "inter_token_latency_seconds", "Time between consecutive tokens of a request.", model, &st.itl);
    hist(b, "e2e_request_latency_seconds", "End-to-end request latency.", model, &st.e2e);
    static const char *classes[SRV_ST_N] = {"2xx", "400", "401", "404", "413", "429", "500", "503", "other"};
    uint64_t counts[SRV_ST_N];
    pthread_mutex_lock(&sv->mu);
    memcpy(counts, sv->http_status, sizeof counts);
    pthread_mutex_unlock(&sv->mu);
    head(b, "http_responses_total", "counter", "HTTP responses sent, by status.");
    for (int i = 0; i < SRV_ST_N; i++)
        buf_printf(b, "laststand:http_responses_total{model_name=\"%s\",status=\"%s\"} %llu\n", model, classes[i],
                   (unsigned long long)counts[i]);
    rs->status = 200;
    rs->content_type = "text/plain; version=0.0.4; charset=utf-8";
}
