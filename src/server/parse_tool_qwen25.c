/* parse_tool_qwen25.c: the JSON-in-<tool_call> format of Qwen2.5 / Qwen3 templates.
 *
 *   <tool_call>
 *   {"name": "get_weather", "arguments": {"city": "Paris"}}
 *   </tool_call>
 *
 * As SGLang's Qwen25Detector: content is the text before the first
 * <tool_call>; each closed block holding a JSON object with a "name" of a
 * declared tool (any name when the request declared none) and "arguments"
 * (or "parameters") is a call, arguments re-serialised as json.dumps;
 * blocks that are not valid JSON are dropped, as is an unclosed final block.
 * Whitespace around the JSON is ignored (SGLang requires exactly one "\n").
 * Streaming emits a call once its </tool_call> has arrived: the name delta,
 * then the whole arguments in one fragment.
 */
#include "server/server.h"

#include <stdlib.h>
#include <string.h>

#define T_CALL "<tool_call>"
#define T_CALL_END "</tool_call>"

static const char *const START_TAG[] = {T_CALL, NULL};

/* Parse one block body; on success fills name/args (malloc'd). */
static int parse_block(const json_t *tools, const char *s, size_t n, char **name, char **args) {
    json_t *v = json_loadb(s, n, 0, NULL);
    if (!json_is_object(v)) { json_decref(v); return -1; }
    const char *nm = json_string_value(json_object_get(v, "name"));
    if (!nm || (json_array_size(tools) && !tp_tool_exists(tools, nm))) { json_decref(v); return -1; }
    json_t *a = json_object_get(v, "arguments");
    if (!a) a = json_object_get(v, "parameters");
    json_t *parsed = NULL;
    if (json_is_string(a)) { /* some models send the arguments JSON-encoded */
        parsed = json_loads(json_string_value(a), 0, NULL);
        if (json_is_object(parsed)) a = parsed;
    }
    if (!a) { *args = xstrdup("{}"); }
    else *args = jpy_dumps(a);
    *name = xstrdup(nm);
    json_decref(parsed);
    json_decref(v);
    return 0;
}

void tp_q25_feed(tp_stream *s, buf *content, tp_deltas *out, int final) {
    buf *h = &s->hold;
    size_t pos = 0;
    for (;;) {
        const char *c = h->data + pos;
        size_t n = h->len - pos;
        if (!n) break;
        if (!s->inside) {
            const char *t = memmem(c, n, T_CALL, strlen(T_CALL));
            if (t) {
                if (!s->seen) buf_append(content, c, t - c);
                pos += (t - c) + strlen(T_CALL);
                s->seen = s->inside = 1;
                continue;
            }
            size_t k = final ? 0 : tp_partial_suffix(c, n, START_TAG);
            if (!s->seen) buf_append(content, c, n - k);
            pos += n - k;
            break;
        }
        const char *e = memmem(c, n, T_CALL_END, strlen(T_CALL_END));
        if (!e) {
            if (final) pos += n; /* unclosed: dropped */
            break;
        }
        char *name, *args;
        if (parse_block(s->tools, c, e - c, &name, &args) == 0) {
            s->index = s->n_calls++;
            tp_deltas_push(out, s->index, name, "", 0);
            tp_deltas_push(out, s->index, NULL, args, strlen(args));
            free(name);
            free(args);
        }
        pos += (e - c) + strlen(T_CALL_END);
        s->inside = 0;
    }
    memmove(h->data, h->data + pos, h->len - pos);
    h->len -= pos;
    h->data[h->len] = 0;
}

/* text starts at the first <tool_call>. */
void tp_q25_parse(const json_t *tools, const char *text, tp_calls *calls) {
    const char *p = text;
    while ((p = strstr(p, T_CALL))) {
        const char *bs = p + strlen(T_CALL);
        const char *be = strstr(bs, T_CALL_END);
        if (!be) break;
        char *name, *args;
        if (parse_block(tools, bs, be - bs, &name, &args) == 0) {
            if (calls->n == calls->cap) {
                calls->cap = calls->cap ? calls->cap * 2 : 4;
                calls->v = xrealloc(calls->v, calls->cap * sizeof *calls->v);
            }
            calls->v[calls->n].name = name;
            calls->v[calls->n].args = args;
            calls->n++;
        }
        p = be + strlen(T_CALL_END);
    }
}
