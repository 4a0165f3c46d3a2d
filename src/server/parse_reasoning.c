/* parse_reasoning.c: the qwen3 reasoning parser (reference/peers-and-parsers.md 2.1).
 *
 * Splits model text into reasoning_content and content. One-shot (rp_parse)
 * and streaming (rp_feed/rp_finish) give the same split for every way the
 * text is cut into deltas: the streaming side never emits bytes that could
 * still turn out to be the start of "<think>", "</think>" or "<tool_call>".
 *
 * Rules (both modes):
 *   - leading "<think>" tags (repeated) are dropped and enter reasoning;
 *     force_reasoning = the rendered prompt already opened <think>;
 *   - outside reasoning everything is content;
 *   - inside reasoning, the first "</think>" ends it (tag dropped), or the
 *     first "<tool_call>" ends it (tag kept, it starts the content: Qwen3.5
 *     may call a tool without closing its thinking);
 *   - no end tag: all of it is reasoning (truncated thinking).
 * Unlike SGLang's streaming detector, a partial tag is recognised anywhere in
 * the buffer, not only at its start (SGLang relies on the tags being single
 * tokens); the output is otherwise the same.
 */
#include "server/server.h"

#include <string.h>

#define THINK_OPEN "<think>"
#define THINK_CLOSE "</think>"
#define TOOL_OPEN "<tool_call>"

static const char *const END_TAGS[] = {THINK_CLOSE, TOOL_OPEN, NULL};

/* First end tag in s[0..n): position, its length, whether it is kept. */
static int find_end(const char *s, size_t n, size_t *pos, size_t *taglen, int *keep) {
    const char *a = memmem(s, n, THINK_CLOSE, strlen(THINK_CLOSE));
    const char *t = memmem(s, n, TOOL_OPEN, strlen(TOOL_OPEN));
    if (!a && !t) return 0;
    if (a && (!t || a < t)) { *pos = a - s; *taglen = strlen(THINK_CLOSE); *keep = 0; }
    else { *pos = t - s; *taglen = strlen(TOOL_OPEN); *keep = 1; }
    return 1;
}

void rp_parse(const char *text, int force_reasoning, buf *reasoning, buf *content) {
    const char *p = text;
    int in = force_reasoning;
    size_t lo = strlen(THINK_OPEN);
    while (!strncmp(p, THINK_OPEN, lo)) { p += lo; in = 1; }
    if (!in) { buf_puts(content, text); return; }
    size_t n = strlen(p), pos, taglen;
    int keep;
    if (find_end(p, n, &pos, &taglen, &keep)) {
        buf_append(reasoning, p, pos);
        buf_puts(content, p + pos + (keep ? 0 : taglen));
    } else {
        buf_append(reasoning, p, n);
    }
}

void rp_init(rp_state *s, int force_reasoning, int stream_reasoning) {
    memset(s, 0, sizeof *s);
    s->in_reasoning = force_reasoning;
    s->at_start = 1;
    s->stream_reasoning = stream_reasoning;
    buf_init(&s->hold);
    buf_init(&s->pending);
}

void rp_free(rp_state *s) {
    buf_free(&s->hold);
    buf_free(&s->pending);
}

static void emit_reasoning(rp_state *s, const char *p, size_t n, buf *reasoning) {
    if (!n) return;
    if (s->stream_reasoning) buf_append(reasoning, p, n);
    else buf_append(&s->pending, p, n);
}

static void flush_pending(rp_state *s, buf *reasoning) {
    if (s->pending.len) buf_append(reasoning, s->pending.data, s->pending.len);
    s->pending.len = 0;
    if (s->pending.data) s->pending.data[0] = 0;
}

static void hold_consume(buf *h, size_t n) {
    memmove(h->data, h->data + n, h->len - n);
    h->len -= n;
    h->data[h->len] = 0;
}

void rp_feed(rp_state *s, const char *d, size_t n, buf *reasoning, buf *content) {
    if (s->ended || (!s->at_start && !s->in_reasoning)) { /* plain content from here on */
        buf_append(content, d, n);
        return;
    }
    buf_append(&s->hold, d, n);
    buf *h = &s->hold;
    size_t lo = strlen(THINK_OPEN);
    while (s->at_start) {
        if (!h->len) return;
        if (h->len >= lo && !memcmp(h->data, THINK_OPEN, lo)) {
            hold_consume(h, lo);
            s->in_reasoning = 1;
            continue;
        }
        if (h->len < lo && !memcmp(h->data, THINK_OPEN, h->len)) return; /* may still be <think> */
        s->at_start = 0;
    }
    if (!s->in_reasoning) {
        buf_append(content, h->data, h->len);
        hold_consume(h, h->len);
        return;
    }
    size_t pos, taglen;
    int keep;
    if (find_end(h->data, h->len, &pos, &taglen, &keep)) {
        emit_reasoning(s, h->data, pos, reasoning);
        flush_pending(s, reasoning);
        size_t from = pos + (keep ? 0 : taglen);
        buf_append(content, h->data + from, h->len - from);
        hold_consume(h, h->len);
        s->in_reasoning = 0;
        s->ended = 1;
        return;
    }
    size_t keepn = tp_partial_suffix(h->data, h->len, END_TAGS);
    emit_reasoning(s, h->data, h->len - keepn, reasoning);
    hold_consume(h, h->len - keepn);
}

void rp_finish(rp_state *s, buf *reasoning, buf *content) {
    buf *h = &s->hold;
    if (h->len) {
        if (s->in_reasoning) emit_reasoning(s, h->data, h->len, reasoning);
        else buf_append(content, h->data, h->len);
        hold_consume(h, h->len);
    }
    flush_pending(s, reasoning);
    s->at_start = 0;
    s->ended = 1;
}
