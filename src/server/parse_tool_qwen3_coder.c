/* parse_tool_qwen3_coder.c: the Qwen3-Coder / Qwen3.5 XML tool-call format.
 *
 *   <tool_call>
 *   <function=get_weather>
 *   <parameter=city>
 *   Paris
 *   </parameter>
 *   </function>
 *   </tool_call>
 *
 * Behaviour of SGLang's Qwen3CoderDetector (reference 2.2): content is the
 * text before the first <tool_call>; every function inside a block is a
 * call; a parameter ends at </parameter>, the next <parameter=, </function>
 * or the end of the block; one leading and one trailing "\n" are stripped
 * from each value, which is then converted by the tool's schema type
 * (tp_convert_param); arguments are json.dumps of the parameters in order.
 * Streaming emits the name as soon as <function=NAME> is complete, then "{",
 * one "key": value fragment per complete parameter (", " between) and "}" at
 * </function>, so the fragments concatenate to the one-shot arguments.
 * Decided here, identically in both modes: a final block missing its
 * </tool_call> (output cut by max_tokens) still yields its calls, and text
 * after the first <tool_call> outside any function is dropped.
 */
#include "server/server.h"

#include <stdlib.h>
#include <string.h>

#define T_CALL "<tool_call>"
#define T_CALL_END "</tool_call>"
#define T_FUNC "<function="
#define T_FUNC_END "</function>"
#define T_PARAM "<parameter="
#define T_PARAM_END "</parameter>"

static const char *const START_TAG[] = {T_CALL, NULL};
static const char *const ALL_TAGS[] = {T_CALL, T_CALL_END, T_FUNC, T_FUNC_END, T_PARAM, T_PARAM_END, NULL};

static int starts(const char *s, size_t n, const char *tag) {
    size_t tl = strlen(tag);
    return n >= tl && !memcmp(s, tag, tl);
}

static const char *find(const char *s, size_t n, const char *tag) { return memmem(s, n, tag, strlen(tag)); }

/* Strip one leading and one trailing newline. */
static void trim_nl(const char **v, size_t *n) {
    if (*n && (*v)[0] == '\n') { (*v)++; (*n)--; }
    if (*n && (*v)[*n - 1] == '\n') (*n)--;
}

/* `"key": value` as Python writes it. */
static void param_fragment(buf *b, const char *name, size_t nl, const char *val, size_t vn,
                           const json_t *props) {
    char *key = xmalloc(nl + 1);
    memcpy(key, name, nl);
    key[nl] = 0;
    json_t *v = tp_convert_param(val, vn, key, props);
    jpy_str(b, name, nl);
    buf_puts(b, ": ");
    jpy_dump(b, v);
    json_decref(v);
    free(key);
}

/* ---- streaming -------------------------------------------------------------- */

static void close_function(tp_stream *s, tp_deltas *out) {
    if (!s->in_function) return;
    tp_deltas_push(out, s->index, NULL, s->json_started ? "}" : "{}", s->json_started ? 1 : 2);
    s->in_function = 0;
    free(s->func_name);
    s->func_name = NULL;
}

void tp_coder_feed(tp_stream *s, buf *content, tp_deltas *out, int final) {
    buf *h = &s->hold;
    size_t pos = 0;
    for (;;) {
        const char *c = h->data + pos;
        size_t n = h->len - pos;
        if (!n) break;
        if (!s->seen) {
            const char *t = find(c, n, T_CALL);
            if (t) {
                buf_append(content, c, t - c);
                pos += (t - c) + strlen(T_CALL);
                s->seen = s->inside = 1;
                continue;
            }
            size_t k = final ? 0 : tp_partial_suffix(c, n, START_TAG);
            buf_append(content, c, n - k);
            pos += n - k;
            break;
        }
        if (starts(c, n, T_CALL)) { pos += strlen(T_CALL); s->inside = 1; continue; }
        if (!s->inside) { /* between blocks: dropped until the next <tool_call> */
            const char *t = find(c, n, T_CALL);
            if (t) { pos += t - c; continue; }
            size_t k = final ? 0 : tp_partial_suffix(c, n, START_TAG);
            pos += n - k;
            break;
        }
        if (starts(c, n, T_CALL_END)) {
            close_function(s, out);
            pos += strlen(T_CALL_END);
            s->inside = 0;
            continue;
        }
        if (!s->in_function && starts(c, n, T_FUNC)) {
            /* the name ends at the first '>' before the function's (or block's) end */
            const char *fb = c + strlen(T_FUNC);
            size_t rest = n - strlen(T_FUNC);
            const char *fe = find(fb, rest, T_FUNC_END), *be = find(fb, rest, T_CALL_END);
            const char *bound = fe && (!be || fe < be) ? fe : be;
            const char *gt = memchr(fb, '>', (bound ? bound : c + n) - fb);
            if (!gt) {
                if (bound) { pos += (bound - c) + (bound == fe ? strlen(T_FUNC_END) : 0); continue; } /* no name: skipped */
                if (final) { pos += n; continue; }
                break;
            }
            size_t nl = gt - c - strlen(T_FUNC);
            free(s->func_name);
            s->func_name = xmalloc(nl + 1);
            memcpy(s->func_name, c + strlen(T_FUNC), nl);
            s->func_name[nl] = 0;
            s->index = s->n_calls++;
            s->in_function = 1;
            s->json_started = 0;
            s->n_params = 0;
            tp_deltas_push(out, s->index, s->func_name, "", 0);
            pos += gt - c + 1;
            continue;
        }
        if (s->in_function && starts(c, n, T_PARAM)) {
            const char *ps = c + strlen(T_PARAM);
            size_t rest = n - strlen(T_PARAM);
            const char *ends[4] = {find(ps, rest, T_PARAM_END), find(ps, rest, T_PARAM),
                                   find(ps, rest, T_FUNC_END), find(ps, rest, T_CALL_END)};
            const char *e = NULL;
            size_t consume = 0;
            for (int i = 0; i < 4; i++)
                if (ends[i] && (!e || ends[i] < e)) { e = ends[i]; consume = i == 0 ? strlen(T_PARAM_END) : 0; }
            if (!e) {
                if (!final) break; /* the value is still arriving */
                e = c + n;
            }
            const char *gt = memchr(ps, '>', e - ps);
            if (gt) {
                const char *v = gt + 1;
                size_t vn = e - v;
                trim_nl(&v, &vn);
                buf frag; buf_init(&frag);
                if (!s->json_started) { tp_deltas_push(out, s->index, NULL, "{", 1); s->json_started = 1; }
                if (s->n_params++) buf_puts(&frag, ", ");
                param_fragment(&frag, ps, gt - ps, v, vn, tp_tool_properties(s->tools, s->func_name));
                tp_deltas_push(out, s->index, NULL, frag.data, frag.len);
                buf_free(&frag);
            }
            pos += (e - c) + consume;
            continue;
        }
        if (s->in_function && starts(c, n, T_FUNC_END)) {
            if (!s->json_started) { s->json_started = 1; tp_deltas_push(out, s->index, NULL, "{", 1); }
            close_function(s, out);
            pos += strlen(T_FUNC_END);
            continue;
        }
        /* anything else inside a block is dropped, but a tag may be starting */
        if (c[0] == '<') {
            if (!final && tp_partial_suffix(c, n, ALL_TAGS) == n) break;
            pos++;
            continue;
        }
        const char *lt = memchr(c, '<', n);
        pos += lt ? (size_t)(lt - c) : n;
    }
    memmove(h->data, h->data + pos, h->len - pos);
    h->len -= pos;
    h->data[h->len] = 0;
    if (final) close_function(s, out);
}

/* ---- one-shot ----------------------------------------------------------------- */

static void parse_function(const json_t *tools, const char *fb, const char *fend, tp_calls *calls) {
    const char *gt = memchr(fb, '>', fend - fb);
    if (!gt) return;
    char *name = xmalloc(gt - fb + 1);
    memcpy(name, fb, gt - fb);
    name[gt - fb] = 0;
    const json_t *props = tp_tool_properties(tools, name);
    buf args; buf_init(&args);
    buf_putc(&args, '{');
    int np = 0;
    const char *r = gt + 1;
    for (;;) {
        const char *pp = find(r, fend - r, T_PARAM);
        if (!pp) break;
        const char *ps = pp + strlen(T_PARAM);
        const char *e1 = find(ps, fend - ps, T_PARAM_END), *e2 = find(ps, fend - ps, T_PARAM);
        const char *e = fend;
        size_t consume = 0;
        if (e1 && e1 < e) { e = e1; consume = strlen(T_PARAM_END); }
        if (e2 && e2 < e) { e = e2; consume = 0; }
        const char *pgt = memchr(ps, '>', e - ps);
        if (pgt) {
            const char *v = pgt + 1;
            size_t vn = e - v;
            trim_nl(&v, &vn);
            if (np++) buf_puts(&args, ", ");
            param_fragment(&args, ps, pgt - ps, v, vn, props);
        }
        r = e + consume;
    }
    buf_putc(&args, '}');
    if (calls->n == calls->cap) {
        calls->cap = calls->cap ? calls->cap * 2 : 4;
        calls->v = xrealloc(calls->v, calls->cap * sizeof *calls->v);
    }
    calls->v[calls->n].name = name;
    calls->v[calls->n].args = buf_detach(&args);
    calls->n++;
}

/* text starts at the first <tool_call>. */
void tp_coder_parse(const json_t *tools, const char *text, tp_calls *calls) {
    const char *p = text, *tend = text + strlen(text);
    while ((p = find(p, tend - p, T_CALL))) {
        const char *bs = p + strlen(T_CALL);
        const char *be = find(bs, tend - bs, T_CALL_END);
        const char *bend = be ? be : tend;
        const char *q = bs;
        const char *f;
        while ((f = find(q, bend - q, T_FUNC))) {
            const char *fb = f + strlen(T_FUNC);
            const char *fe = find(fb, bend - fb, T_FUNC_END);
            const char *fend = fe ? fe : bend;
            parse_function(tools, fb, fend, calls);
            q = fe ? fe + strlen(T_FUNC_END) : bend;
        }
        p = be ? be + strlen(T_CALL_END) : tend;
    }
}
