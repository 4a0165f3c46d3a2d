/* sse.c: Server-Sent Events bodies fed from a gen's event queue.
 *
 * The content reader (called by libmicrohttpd on the connection's thread)
 * blocks until the route's formatter has produced bytes: it pops engine
 * events, hands each to the route (step), and after the last one asks the
 * route for its closing chunks (end) and appends `data: [DONE]`. While
 * waiting it checks every 50 ms whether the client has gone (then the
 * stream ends with an error, and freeing it cancels the engine requests) or
 * the server is stopping (then the requests are cancelled and the stream
 * finishes normally with their "abort" events).
 * An error after the stream started is the route's final error event,
 * followed by [DONE]; the remaining choices are cancelled.
 */
#include "server/server.h"

#include <stdlib.h>
#include <string.h>

struct sse_stream {
    srv *sv;
    srv_conn *c;
    gen *g;
    void *route_ctx;
    sse_step_fn step;
    sse_end_fn end;
    void (*ctx_free)(void *);
    buf out;
    size_t off;
    int done, cancelled;
    int no_done;            /* no closing `data: [DONE]` (the Responses API's event streams) */
};

void sse_no_done(srv_resp *rs) {
    if (rs->stream_fn) ((sse_stream *)rs->stream_ctx)->no_done = 1;
}

void sse_json_event(buf *out, const char *type, json_t *ev) {
    json_object_set_new(ev, "type", json_string(type));
    buf s; buf_init(&s);
    jpy_dump_compact(&s, ev);
    sse_event(out, type, s.data, s.len);
    buf_free(&s);
    json_decref(ev);
}

void sse_event(buf *out, const char *event, const char *json, size_t n) {
    buf_puts(out, "event: ");
    buf_puts(out, event);
    buf_puts(out, "\ndata: ");
    buf_append(out, json, n);
    buf_puts(out, "\n\n");
}

void sse_data(buf *out, const char *json, size_t n) {
    buf_puts(out, "data: ");
    buf_append(out, json, n);
    buf_puts(out, "\n\n");
}

void sse_error_event(buf *out, const char *type, int code, const char *msg) {
    json_t *e = json_pack("{s:{s:s, s:s, s:n, s:i}}", "error", "message", msg, "type", type, "param", "code", code);
    char *s = json_dumps(e, JSON_COMPACT);
    sse_data(out, s, strlen(s));
    free(s);
    json_decref(e);
}

static long sse_read(void *ctx, char *dst, size_t max) {
    sse_stream *s = ctx;
    while (s->off == s->out.len) {
        if (s->done) return -1;
        s->out.len = 0;
        s->off = 0;
        gen_event ev;
        int rc = gen_next(s->g, &ev, 0.05);
        if (rc == 1) {
            int r = s->step(s->route_ctx, &ev, &s->out);
            gen_event_free(&ev);
            if (r < 0) { /* error event written: end the stream */
                gen_cancel(s->g);
                if (!s->no_done) buf_puts(&s->out, "data: [DONE]\n\n");
                s->done = 1;
            }
            continue;
        }
        if (rc < 0) {
            if (s->end) s->end(s->route_ctx, &s->out);
            if (!s->no_done) buf_puts(&s->out, "data: [DONE]\n\n");
            s->done = 1;
            continue;
        }
        if (srv_conn_gone(s->c)) return -2;
        if (s->sv->stopping && !s->cancelled) {
            gen_cancel(s->g);
            s->cancelled = 1;
        }
    }
    size_t n = s->out.len - s->off;
    if (n > max) n = max;
    memcpy(dst, s->out.data + s->off, n);
    s->off += n;
    return (long)n;
}

static void sse_free(void *ctx) {
    sse_stream *s = ctx;
    gen_release(s->g); /* cancels what still runs (client gone) */
    if (s->ctx_free) s->ctx_free(s->route_ctx);
    buf_free(&s->out);
    free(s);
}

void sse_start(srv_resp *rs, srv *sv, srv_conn *c, gen *g, void *route_ctx, sse_step_fn step, sse_end_fn end,
               void (*ctx_free)(void *)) {
    sse_stream *s = xcalloc(1, sizeof *s);
    s->sv = sv;
    s->c = c;
    s->g = g;
    s->route_ctx = route_ctx;
    s->step = step;
    s->end = end;
    s->ctx_free = ctx_free;
    buf_init(&s->out);
    rs->status = 200;
    rs->content_type = "text/event-stream";
    rs->stream_fn = sse_read;
    rs->stream_free = sse_free;
    rs->stream_ctx = s;
}
