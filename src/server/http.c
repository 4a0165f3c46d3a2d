/* http.c: the libmicrohttpd daemon: connections, bodies, auth, routing, errors.
 *
 * Mode: one thread per connection (MHD_USE_THREAD_PER_CONNECTION with the
 * internal polling thread), HTTP/1.1 keep-alive, a connection cap and an
 * idle timeout. A route may block its connection thread (waiting on the
 * engine) and streams are produced by a blocking content reader, which MHD
 * sends with chunked transfer encoding (dependencies.md section 1).
 *
 * Limits: bodies over cfg.max_body get 413 (as soon as Content-Length says
 * so); every route but /health needs the bearer token when --api-key is set.
 * Errors use the OpenAI shape {"error":{"message","type","param","code"}}.
 * Owns: the srv state and the per-connection srv_conn (freed by MHD's
 * request-completed callback).
 */
#include "server/server.h"

#include <microhttpd.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct srv_conn {
    srv *sv;
    struct MHD_Connection *mc;
    buf body;
    int too_large;
    int answered;
    double t0;
    char method[8], url[120];
};

/* ---- responses ------------------------------------------------------------------ */

static const char *default_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    case 500: return "server_error";
    case 503: return "service_unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

void srv_error(srv_resp *rs, int status, const char *type, const char *param, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    buf m; buf_init(&m);
    buf_vprintf(&m, fmt, ap);
    va_end(ap);
    json_t *err = json_pack("{s:s, s:s, s:o, s:i}", "message", m.data ? m.data : "", "type",
                            type ? type : default_type(status), "param",
                            param && *param ? json_string(param) : json_null(), "code", status);
    buf_free(&m);
    srv_json_resp(rs, status, json_pack("{s:o}", "error", err));
}

void srv_json_resp(srv_resp *rs, int status, json_t *obj) {
    rs->status = status;
    rs->content_type = "application/json";
    buf_free(&rs->body);
    buf_init(&rs->body);
    jpy_dump_compact(&rs->body, obj);
    json_decref(obj);
}

void srv_count_status(srv *sv, int status) {
    int k;
    if (status < 300) k = SRV_ST_2XX;
    else switch (status) {
        case 400: k = SRV_ST_400; break;
        case 401: k = SRV_ST_401; break;
        case 404: k = SRV_ST_404; break;
        case 413: k = SRV_ST_413; break;
        case 429: k = SRV_ST_429; break;
        case 500: k = SRV_ST_500; break;
        case 503: k = SRV_ST_503; break;
        default: k = SRV_ST_OTHER;
    }
    pthread_mutex_lock(&sv->mu);
    sv->http_status[k]++;
    pthread_mutex_unlock(&sv->mu);
}

int srv_conn_gone(srv_conn *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 1;
    struct pollfd p = {.fd = ci->connect_fd, .events = POLLRDHUP};
    if (poll(&p, 1, 0) < 0) return 0;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

typedef struct stream_cls { srv_resp r; } stream_cls;

static ssize_t stream_reader(void *cls, uint64_t pos, char *out, size_t max) {
    (void)pos;
    stream_cls *s = cls;
    long n = s->r.stream_fn(s->r.stream_ctx, out, max);
    if (n == -1) return MHD_CONTENT_READER_END_OF_STREAM;
    if (n < 0) return MHD_CONTENT_READER_END_WITH_ERROR;
    return n;
}

static void stream_free(void *cls) {
    stream_cls *s = cls;
    if (s->r.stream_free) s->r.stream_free(s->r.stream_ctx);
    free(s);
}

static enum MHD_Result send_resp(srv_conn *c, srv_resp *rs) {
    struct MHD_Response *r;
    if (rs->stream_fn) {
        stream_cls *s = xmalloc(sizeof *s);
        s->r = *rs;
        rs->stream_fn = NULL; /* ownership of the stream moved */
        r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, s, stream_free);
        if (!r) { stream_free(s); return MHD_NO; }
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
    } else {
        size_t n = rs->body.len;
        char *data = buf_detach(&rs->body);
        r = MHD_create_response_from_buffer(n, data, MHD_RESPMEM_MUST_FREE);
        if (!r) { free(data); return MHD_NO; }
    }
    MHD_add_response_header(r, "Content-Type", rs->content_type ? rs->content_type : "application/json");
    /* CORS as SGLang's server allows it: any origin, method and header */
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    if (rs->status == 204) {
        MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
        MHD_add_response_header(r, "Access-Control-Max-Age", "86400");
    }
    srv_count_status(c->sv, rs->status);
    if (rs->status >= 500) log_warn("%s %s -> %d (%.3f s)", c->method, c->url, rs->status, now_sec() - c->t0);
    else log_debug("%s %s -> %d (%.3f s%s)", c->method, c->url, rs->status, now_sec() - c->t0,
                   rs->stream_fn ? ", streaming" : "");
    enum MHD_Result ok = MHD_queue_response(c->mc, (unsigned)rs->status, r);
    MHD_destroy_response(r);
    c->answered = 1;
    return ok;
}

/* ---- auth and routing -------------------------------------------------------- */

static int token_ok(const char *have, const char *want) {
    if (!have) return 0;
    size_t hn = strlen(have), wn = strlen(want);
    unsigned diff = (unsigned)(hn ^ wn);
    for (size_t i = 0; i < hn; i++) diff |= (unsigned char)have[i] ^ (unsigned char)want[i % (wn ? wn : 1)];
    return diff == 0;
}

static int authorized(srv *sv, srv_conn *c) {
    if (!sv->cfg.api_key) return 1;
    const char *x = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "x-api-key"); /* Anthropic's clients */
    if (x && token_ok(x, sv->cfg.api_key)) return 1;
    const char *h = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7)) return 0;
    h += 7;
    while (*h == ' ') h++;
    return token_ok(h, sv->cfg.api_key);
}

static void dispatch(srv *sv, srv_conn *c, const char *url, const char *method, srv_resp *rs) {
    int get = !strcmp(method, "GET") || !strcmp(method, "HEAD"), post = !strcmp(method, "POST");
    const char *body = c->body.data;
    size_t len = c->body.len;
    if (!strcmp(method, "OPTIONS")) { /* CORS preflight: no key needed */
        rs->status = 204;
        rs->content_type = "text/plain";
        return;
    }
    if (!strcmp(url, "/health")) {
        if (!get) goto bad_method;
        rs->status = sv->stopping ? 503 : 200;
        rs->content_type = "text/plain";
        return;
    }
    if (!authorized(sv, c)) {
        srv_error(rs, 401, NULL, NULL, "invalid or missing API key: send the --api-key value as 'Authorization: Bearer KEY' "
                  "(or 'x-api-key: KEY')");
        if (!strncmp(url, "/v1/messages", 12)) srv_anthropic_error(rs);
        return;
    }
    if (!strcmp(url, "/v1/chat/completions")) { if (!post) goto bad_method; route_chat(sv, c, body, len, rs); return; }
    if (!strcmp(url, "/v1/completions")) { if (!post) goto bad_method; route_completions(sv, c, body, len, rs); return; }
    if (!strcmp(url, "/generate")) { if (!post) goto bad_method; route_generate(sv, c, body, len, rs); return; }
    if (!strcmp(url, "/v1/responses")) { if (!post) goto bad_method; route_responses(sv, c, method, NULL, body, len, rs); return; }
    if (!strncmp(url, "/v1/responses/", 14)) { route_responses(sv, c, method, url + 14, body, len, rs); return; }
    if (!strcmp(url, "/v1/messages")) { if (!post) goto bad_method; route_messages(sv, c, NULL, body, len, rs); return; }
    if (!strncmp(url, "/v1/messages/", 13)) { if (!post) goto bad_method; route_messages(sv, c, url + 13, body, len, rs); return; }
    if (!strcmp(url, "/v1/models")) { if (!get) goto bad_method; route_models(sv, NULL, rs); return; }
    if (!strncmp(url, "/v1/models/", 11)) { if (!get) goto bad_method; route_models(sv, url + 11, rs); return; }
    if (!strcmp(url, "/health_generate")) { if (!get) goto bad_method; route_health_generate(sv, rs); return; }
    if (!strcmp(url, "/get_model_info")) { if (!get) goto bad_method; route_model_info(sv, rs); return; }
    if (!strcmp(url, "/get_server_info")) { if (!get) goto bad_method; route_server_info(sv, rs); return; }
    if (!strcmp(url, "/metrics")) { if (!get) goto bad_method; route_metrics(sv, rs); return; }
    if (!strcmp(url, "/tokenize") || !strcmp(url, "/v1/tokenize")) {
        if (!post) goto bad_method;
        route_tokenize(sv, body, len, rs);
        return;
    }
    if (!strcmp(url, "/detokenize") || !strcmp(url, "/v1/detokenize")) {
        if (!post) goto bad_method;
        route_detokenize(sv, body, len, rs);
        return;
    }
    srv_error(rs, 404, NULL, NULL, "no route for %s %s", method, url);
    return;
bad_method:
    srv_error(rs, 405, NULL, NULL, "method %s is not allowed on %s", method, url);
}

static enum MHD_Result on_access(void *cls, struct MHD_Connection *mc, const char *url, const char *method,
                                 const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    srv *sv = cls;
    srv_conn *c = *con_cls;
    if (!c) {
        c = xcalloc(1, sizeof *c);
        c->sv = sv;
        c->mc = mc;
        c->t0 = now_sec();
        snprintf(c->method, sizeof c->method, "%s", method);
        snprintf(c->url, sizeof c->url, "%s", url);
        buf_init(&c->body);
        *con_cls = c;
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        unsigned long long announced = cl ? strtoull(cl, NULL, 10) : 0;
        if (announced > sv->cfg.max_body) {
            /* A client waiting for "100 Continue", or one announcing a huge
             * body, is answered at once; others have their body read and
             * dropped first, so that they are able to read the 413. */
            const char *expect = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
            if ((expect && !strcasecmp(expect, "100-continue")) || announced > 4 * sv->cfg.max_body + (64u << 20)) {
                srv_resp rs = {0};
                srv_error(&rs, 413, NULL, NULL, "request body of %llu bytes is over the limit of %zu bytes",
                          announced, sv->cfg.max_body);
                return send_resp(c, &rs);
            }
            c->too_large = 1;
        }
        return MHD_YES;
    }
    if (c->answered) { *upload_size = 0; return MHD_YES; }
    if (*upload_size) {
        if (!c->too_large) {
            if (c->body.len + *upload_size > sv->cfg.max_body) {
                c->too_large = 1;
                buf_free(&c->body);
            } else {
                buf_append(&c->body, upload, *upload_size);
            }
        }
        *upload_size = 0;
        return MHD_YES;
    }
    srv_resp rs = {0};
    buf_init(&rs.body);
    if (c->too_large) srv_error(&rs, 413, NULL, NULL, "request body is over the limit of %zu bytes", sv->cfg.max_body);
    else dispatch(sv, c, url, method, &rs);
    enum MHD_Result ok = send_resp(c, &rs);
    buf_free(&rs.body);
    if (rs.stream_fn && rs.stream_free) rs.stream_free(rs.stream_ctx); /* not sent */
    return ok;
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)cls; (void)mc; (void)toe;
    srv_conn *c = *con_cls;
    if (!c) return;
    buf_free(&c->body);
    free(c);
    *con_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && msg[n - 1] == '\n') msg[--n] = 0;
    log_debug("http: %s", msg);
}

const char *srv_conn_query(srv_conn *c, const char *key) {
    return MHD_lookup_connection_value(c->mc, MHD_GET_ARGUMENT_KIND, key);
}

/* ---- daemon ------------------------------------------------------------------------ */

int srv_run(const srv_config *cfg, ls_engine *eng) {
    srv *sv = xcalloc(1, sizeof *sv);
    sv->cfg = *cfg;
    sv->eng = eng;
    sv->started = now_sec();
    sv->started_wall = (long long)time(NULL);
    pthread_mutex_init(&sv->mu, NULL);
    ls_engine_model_info(eng, &sv->info);
    sv->rstore = rstore_new(cfg->responses_store_bytes);

    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    int gai = getaddrinfo(cfg->host, port, &hints, &ai);
    if (gai) {
        log_error("--host %s: %s", cfg->host, gai_strerror(gai));
        rstore_free(sv->rstore);
        free(sv);
        return 2;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    /* SIGPIPE from a vanished client must not kill the server */
    signal(SIGPIPE, SIG_IGN);
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL); /* MHD threads inherit the mask; sigwait below */

    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)cfg->port, NULL, NULL, on_access, sv,
        MHD_OPTION_SOCK_ADDR, ai->ai_addr,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->conn_timeout_s,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, sv,
        MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, sv,
        MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!d) {
        log_error("cannot listen on %s:%d (address in use or not available)", cfg->host, cfg->port);
        rstore_free(sv->rstore);
        free(sv);
        return 1;
    }
    const char *h = cfg->host;
    int v6 = strchr(h, ':') != NULL;
    log_info("serving %s (%s, context %d) at http://%s%s%s:%d  (OpenAI API under /v1)", cfg->served_model_name,
             sv->info.architecture ? sv->info.architecture : "?", sv->info.context_length, v6 ? "[" : "", h,
             v6 ? "]" : "", cfg->port);
    fflush(stderr);

    int sig = 0;
    sigwait(&sigs, &sig);
    log_info("signal %d: stopping", sig);
    sv->stopping = 1;
    MHD_quiesce_daemon(d);
    MHD_stop_daemon(d); /* joins connection threads; streams end on sv->stopping */
    responses_shutdown(sv); /* background responses cancel on sv->stopping */
    pthread_mutex_destroy(&sv->mu);
    rstore_free(sv->rstore);
    free(sv);
    return 0;
}
