/* bench_http.c: the benchmark's HTTP client on libcurl's multi interface.
 *
 * One thread drives every transfer: requests are added to one multi handle as
 * their arrival time passes and a concurrency slot is free, and the loop
 * sleeps in curl_multi_poll until a socket is ready or the next arrival is
 * due. Every received SSE line is stamped with CLOCK_MONOTONIC (now_sec) in the
 * write callback, the moment its last byte arrives, so TTFT and ITL are
 * per-chunk client-side times exactly as sglang.bench_serving measures them.
 *
 * Owns: the curl handles of requests in flight (freed when each completes).
 * Invariants: a request is either ok (HTTP 200, usage seen, no error event)
 * or has an error text; nothing is dropped silently.
 */
#include "cli/bench.h"

#include <curl/curl.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct xfer {
    CURL *easy;
    struct curl_slist *hdrs;
    char errbuf[CURL_ERROR_SIZE];
} xfer;

static pthread_once_t g_curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) { curl_global_init(CURL_GLOBAL_DEFAULT); }

/* ---- small helpers ------------------------------------------------------------ */

uint64_t bench_rng_next(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
double bench_rng_uniform(uint64_t *s) { return (bench_rng_next(s) >> 11) * (1.0 / 9007199254740992.0); }
int64_t bench_rng_int(uint64_t *s, int64_t lo, int64_t hi) {
    if (hi <= lo) return lo;
    uint64_t span = (uint64_t)(hi - lo) + 1;
    /* rejection sampling: no modulo bias */
    uint64_t limit = UINT64_MAX - UINT64_MAX % span;
    uint64_t x;
    do x = bench_rng_next(s); while (x >= limit);
    return lo + (int64_t)(x % span);
}

int bench_utf8_valid(const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        int len;
        uint32_t cp;
        if (c < 0x80) { i++; continue; }
        else if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
        else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
        else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
        else return 0;
        if (i + len > n) return 0;
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
            cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += len;
    }
    return 1;
}

void bench_req_free(bench_req *r) {
    free(r->body);
    free(r->error);
    free(r->chunk_t);
    free(r->finish_reason);
    buf_free(&r->text);
    buf_free(&r->raw);
    r->body = r->error = r->finish_reason = NULL;
    r->chunk_t = NULL;
}

static void req_fail(bench_req *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void req_fail(bench_req *r, const char *fmt, ...) {
    if (r->error) return; /* keep the first cause */
    buf b;
    buf_init(&b);
    va_list ap;
    va_start(ap, fmt);
    buf_vprintf(&b, fmt, ap);
    va_end(ap);
    r->error = buf_detach(&b);
}

char *bench_error_text(int status, const char *body) {
    buf b;
    buf_init(&b);
    buf_printf(&b, "HTTP %d", status);
    if (body && *body) {
        json_error_t je;
        json_t *j = json_loads(body, 0, &je);
        const char *msg = NULL;
        if (j) {
            json_t *err = json_object_get(j, "error");
            if (json_is_object(err)) msg = json_string_value(json_object_get(err, "message"));
            else if (json_is_string(err)) msg = json_string_value(err);
            if (!msg) msg = json_string_value(json_object_get(j, "message"));
            if (!msg) msg = json_string_value(json_object_get(j, "detail"));
        }
        if (msg) buf_printf(&b, ": %s", msg);
        else {
            size_t n = strlen(body);
            buf_printf(&b, ": %.*s%s", (int)(n > 300 ? 300 : n), body, n > 300 ? "..." : "");
        }
        json_decref(j);
    }
    /* one line */
    for (size_t i = 0; i < b.len; i++)
        if (b.data[i] == '\n' || b.data[i] == '\r') b.data[i] = ' ';
    return buf_detach(&b);
}

/* ---- response parsing ------------------------------------------------------------ */

static void add_chunk_time(bench_req *r, double t) {
    if (r->n_chunks == r->cap_chunks) {
        r->cap_chunks = r->cap_chunks ? r->cap_chunks * 2 : 64;
        r->chunk_t = xrealloc(r->chunk_t, sizeof(double) * r->cap_chunks);
    }
    r->chunk_t[r->n_chunks++] = t;
    if (r->n_chunks == 1) r->t_first = t;
}

/* Reads one JSON object (an SSE data payload or a whole non-streamed body):
 * text, finish_reason, usage, error. Returns the number of text bytes. */
static size_t absorb_json(bench_req *r, const char *p, size_t n) {
    json_error_t je;
    json_t *j = json_loadb(p, n, 0, &je);
    if (!j) {
        if (strstr(je.text, "UTF-8") || strstr(je.text, "utf-8") || !bench_utf8_valid(p, n)) {
            r->bad_utf8 = 1;
            req_fail(r, "invalid UTF-8 in the response");
        } else {
            req_fail(r, "invalid JSON in the response (%s): %.*s", je.text, (int)(n > 200 ? 200 : n), p);
        }
        return 0;
    }
    size_t added = 0;
    json_t *err = json_object_get(j, "error");
    if (err && !json_is_null(err)) {
        const char *m = json_is_object(err) ? json_string_value(json_object_get(err, "message"))
                                            : json_string_value(err);
        req_fail(r, "error from the server: %s", m ? m : "(no message)");
    }
    json_t *choices = json_object_get(j, "choices");
    if (json_is_array(choices) && json_array_size(choices) > 0) {
        json_t *c0 = json_array_get(choices, 0);
        const char *parts[3] = {NULL, NULL, NULL};
        if (r->is_chat) {
            json_t *m = json_object_get(c0, r->stream ? "delta" : "message");
            parts[0] = json_string_value(json_object_get(m, "reasoning_content"));
            parts[1] = json_string_value(json_object_get(m, "content"));
        } else {
            parts[0] = json_string_value(json_object_get(c0, "text"));
        }
        for (int k = 0; k < 3; k++)
            if (parts[k] && *parts[k]) {
                size_t len = strlen(parts[k]);
                buf_append(&r->text, parts[k], len);
                added += len;
            }
        /* A chunk that carries a token's logprobs marks a token even when its
         * text is empty (a server without a tokenizer, or bytes held back
         * mid-character): counted only when logprobs were asked for. */
        json_t *lp = json_object_get(c0, "logprobs");
        if (!added && json_is_object(lp)) {
            json_t *toks = json_object_get(lp, r->is_chat ? "content" : "tokens");
            if (json_array_size(toks) > 0) r->lp_token = 1;
        }
        const char *fr = json_string_value(json_object_get(c0, "finish_reason"));
        if (fr) {
            free(r->finish_reason);
            r->finish_reason = xstrdup(fr);
        }
    }
    json_t *usage = json_object_get(j, "usage");
    if (json_is_object(usage)) {
        json_t *pt = json_object_get(usage, "prompt_tokens");
        json_t *ct = json_object_get(usage, "completion_tokens");
        if (json_is_integer(pt) && json_is_integer(ct)) {
            r->have_usage = 1;
            r->prompt_tokens = json_integer_value(pt);
            r->completion_tokens = json_integer_value(ct);
        }
    }
    json_decref(j);
    return added;
}

/* Consumes complete lines of an SSE stream from r->raw; t = arrival time. */
static void absorb_sse_lines(bench_req *r, double t, int final) {
    if (!r->raw.len) return;
    size_t start = 0;
    for (;;) {
        char *nl = memchr(r->raw.data + start, '\n', r->raw.len - start);
        size_t end;
        if (nl) end = (size_t)(nl - r->raw.data);
        else if (final && start < r->raw.len) end = r->raw.len;
        else break;
        size_t le = end;
        if (le > start && r->raw.data[le - 1] == '\r') le--;
        const char *line = r->raw.data + start;
        size_t n = le - start;
        if (n >= 5 && !memcmp(line, "data:", 5)) {
            line += 5, n -= 5;
            while (n && *line == ' ') line++, n--;
            if (!(n == 6 && !memcmp(line, "[DONE]", 6)) && n > 0) {
                r->lp_token = 0;
                if (absorb_json(r, line, n) > 0 || r->lp_token) add_chunk_time(r, t);
            }
        } else if (n > 0 && line[0] == '{') {
            /* some servers send a bare JSON error instead of an event */
            absorb_json(r, line, n);
        }
        start = nl ? end + 1 : end;
    }
    if (start) {
        memmove(r->raw.data, r->raw.data + start, r->raw.len - start);
        r->raw.len -= start;
        r->raw.data[r->raw.len] = 0;
    }
}

static size_t on_write(char *ptr, size_t size, size_t nmemb, void *ud) {
    double t = now_sec();
    bench_req *r = ud;
    size_t n = size * nmemb;
    buf_append(&r->raw, ptr, n);
    if (r->stream) {
        long code = 0;
        curl_easy_getinfo(((xfer *)r->xfer)->easy, CURLINFO_RESPONSE_CODE, &code);
        if (code == 200) absorb_sse_lines(r, t, 0);
    }
    return n;
}

/* ---- transfers ----------------------------------------------------------------- */

static struct curl_slist *make_headers(const char *api_key) {
    struct curl_slist *h = NULL;
    h = curl_slist_append(h, "Content-Type: application/json");
    h = curl_slist_append(h, "Expect:"); /* no 100-continue round trip on large bodies */
    if (api_key && *api_key) {
        buf b;
        buf_init(&b);
        buf_printf(&b, "Authorization: Bearer %s", api_key);
        h = curl_slist_append(h, b.data);
        buf_free(&b);
    }
    return h;
}

static void start_req(CURLM *m, const char *url, const char *api_key, bench_req *r, double timeout_s) {
    xfer *x = xcalloc(1, sizeof *x);
    r->xfer = x;
    x->easy = curl_easy_init();
    CHECK(x->easy);
    x->hdrs = make_headers(api_key);
    CURL *c = x->easy;
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, x->hdrs);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, r->body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(r->body));
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(c, CURLOPT_PRIVATE, r);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, x->errbuf);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, 30000L);
    if (timeout_s > 0) curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
    r->started = 1;
    r->t_send = now_sec();
    curl_multi_add_handle(m, c);
}

static void finish_req(CURLM *m, bench_req *r, CURLcode res) {
    double t = now_sec();
    xfer *x = r->xfer;
    long code = 0;
    curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &code);
    r->http_status = (int)code;
    r->t_end = t;
    if (res != CURLE_OK) {
        req_fail(r, "transport: %s%s%s", curl_easy_strerror(res), x->errbuf[0] ? ": " : "", x->errbuf);
    } else if (code != 200) {
        free(r->error);
        r->error = bench_error_text((int)code, r->raw.data);
    } else if (r->stream) {
        absorb_sse_lines(r, t, 1);
    } else {
        if (absorb_json(r, r->raw.data ? r->raw.data : "", r->raw.len) > 0) add_chunk_time(r, t);
    }
    if (!r->error && !r->have_usage && !r->usage_optional)
        req_fail(r, "%s", r->stream ? "the server sent no usage in the stream (it ignores stream_options.include_usage); "
                                      "token counts are never guessed: use --disable-stream"
                                    : "the server sent no usage (prompt_tokens, completion_tokens) in the response");
    r->ok = r->error == NULL;
    if (r->ok && r->n_chunks == 0) r->t_first = r->t_end; /* no text: TTFT = latency */
    curl_multi_remove_handle(m, x->easy);
    curl_easy_cleanup(x->easy);
    curl_slist_free_all(x->hdrs);
    free(x);
    r->xfer = NULL;
    r->done = 1;
    buf_free(&r->raw);
}

int bench_http_run(const char *url, const char *api_key, bench_req *reqs, int n, int max_conc,
                   double rate, uint64_t rng_seed, double timeout_s, bench_progress_fn progress,
                   void *progress_ctx, double *duration_s, ls_err *e) {
    pthread_once(&g_curl_once, curl_init_once);
    CURLM *m = curl_multi_init();
    if (!m) return errf(e, ERR_RUNTIME, "curl_multi_init failed");
    if (max_conc <= 0 || max_conc > n) max_conc = n;
    curl_multi_setopt(m, CURLMOPT_MAXCONNECTS, (long)(max_conc + 4));

    /* arrival offsets: sglang's get_request yields the first request at once,
     * then sleeps an exponential interval before each next one */
    double *arrive = xcalloc(n ? n : 1, sizeof(double));
    uint64_t rs = rng_seed ^ 0xA5A5A5A5DEADBEEFull;
    int poisson = rate > 0 && isfinite(rate);
    for (int i = 1; i < n; i++) {
        double gap = poisson ? -log(1.0 - bench_rng_uniform(&rs)) / rate : 0.0;
        arrive[i] = arrive[i - 1] + gap;
    }
    double t0 = now_sec();
    int next = 0, inflight = 0, ndone = 0;
    while (ndone < n) {
        double now = now_sec();
        while (next < n && inflight < max_conc && t0 + arrive[next] <= now) {
            start_req(m, url, api_key, &reqs[next], timeout_s);
            next++, inflight++;
        }
        int running = 0;
        CURLMcode mc = curl_multi_perform(m, &running);
        if (mc != CURLM_OK) {
            free(arrive);
            return errf(e, ERR_RUNTIME, "curl_multi_perform: %s", curl_multi_strerror(mc));
        }
        CURLMsg *msg;
        int left;
        while ((msg = curl_multi_info_read(m, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            bench_req *r = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
            finish_req(m, r, msg->data.result);
            inflight--, ndone++;
            if (progress) progress(progress_ctx, ndone, n);
        }
        if (ndone >= n) break;
        int wait_ms = 100;
        if (next < n && inflight < max_conc) {
            double dt = t0 + arrive[next] - now_sec();
            wait_ms = dt <= 0 ? 0 : (int)ceil(dt * 1000);
            if (wait_ms > 100) wait_ms = 100;
        }
        if (wait_ms > 0 || inflight > 0) curl_multi_poll(m, NULL, 0, wait_ms, NULL);
    }
    *duration_s = now_sec() - t0;
    free(arrive);
    curl_multi_cleanup(m);
    return 0;
}

static size_t on_write_buf(char *ptr, size_t size, size_t nmemb, void *ud) {
    buf_append(ud, ptr, size * nmemb);
    return size * nmemb;
}

int bench_http_simple(const char *url, const char *api_key, const char *body, double timeout_s,
                      int *status, char **resp, ls_err *e) {
    pthread_once(&g_curl_once, curl_init_once);
    *status = 0;
    *resp = NULL;
    CURL *c = curl_easy_init();
    if (!c) return errf(e, ERR_RUNTIME, "curl_easy_init failed");
    char errbuf[CURL_ERROR_SIZE] = {0};
    struct curl_slist *h = make_headers(api_key);
    buf b;
    buf_init(&b);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    if (body) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_write_buf);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)(timeout_s > 0 && timeout_s < 10 ? timeout_s * 1000 : 10000));
    if (timeout_s > 0) curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
    CURLcode res = curl_easy_perform(c);
    long code = 0;
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    curl_easy_cleanup(c);
    curl_slist_free_all(h);
    if (res != CURLE_OK) {
        buf_free(&b);
        return errf(e, ERR_RUNTIME, "%s: %s%s%s", url, curl_easy_strerror(res), errbuf[0] ? ": " : "", errbuf);
    }
    *status = (int)code;
    *resp = buf_detach(&b);
    return 0;
}
