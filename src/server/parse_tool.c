/* parse_tool.c: what the tool-call parsers share: dispatch by format, the
 * tool schema lookup, qwen3_coder's typed parameter conversion, delta lists
 * and call ids. The formats themselves live in parse_tool_qwen3_coder.c and
 * parse_tool_qwen25.c (reference/peers-and-parsers.md 2.2).
 */
#include "server/server.h"

#include <ctype.h>
#include <errno.h>
#include <strings.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

/* The formats (parse_tool_qwen3_coder.c, parse_tool_qwen25.c). */
void tp_coder_feed(tp_stream *s, buf *content, tp_deltas *out, int final);
void tp_coder_parse(const json_t *tools, const char *text, tp_calls *calls);
void tp_q25_feed(tp_stream *s, buf *content, tp_deltas *out, int final);
void tp_q25_parse(const json_t *tools, const char *text, tp_calls *calls);

int tp_kind_parse(const char *s, tp_kind *out) {
    if (!strcmp(s, "qwen3_coder")) *out = TP_QWEN3_CODER;
    else if (!strcmp(s, "qwen25") || !strcmp(s, "qwen")) *out = TP_QWEN25;
    else return ERR_INVAL;
    return 0;
}

const char *tp_kind_name(tp_kind k) {
    return k == TP_QWEN3_CODER ? "qwen3_coder" : k == TP_QWEN25 ? "qwen25" : "none";
}

/* ---- lists -------------------------------------------------------------- */

void tp_calls_free(tp_calls *c) {
    for (int i = 0; i < c->n; i++) { free(c->v[i].name); free(c->v[i].args); }
    free(c->v);
    memset(c, 0, sizeof *c);
}

void tp_deltas_push(tp_deltas *d, int index, const char *name, const char *args, size_t args_len) {
    if (d->n == d->cap) {
        d->cap = d->cap ? d->cap * 2 : 8;
        d->v = xrealloc(d->v, d->cap * sizeof *d->v);
    }
    tp_delta *x = &d->v[d->n++];
    x->index = index;
    x->name = name ? xstrdup(name) : NULL;
    x->args = xmalloc(args_len + 1);
    memcpy(x->args, args, args_len);
    x->args[args_len] = 0;
}

void tp_deltas_clear(tp_deltas *d) {
    for (int i = 0; i < d->n; i++) { free(d->v[i].name); free(d->v[i].args); }
    d->n = 0;
}

void tp_deltas_free(tp_deltas *d) {
    tp_deltas_clear(d);
    free(d->v);
    memset(d, 0, sizeof *d);
}

size_t tp_partial_suffix(const char *s, size_t n, const char *const *tags) {
    size_t maxk = 0;
    for (int t = 0; tags[t]; t++) {
        size_t tl = strlen(tags[t]);
        size_t lim = tl - 1 < n ? tl - 1 : n;
        for (size_t k = lim; k > maxk; k--)
            if (!memcmp(s + n - k, tags[t], k)) { maxk = k; break; }
    }
    return maxk;
}

void tp_call_id(char out[32]) {
    static const char hex[] = "0123456789abcdef";
    unsigned char r[12];
    if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) {
        uint64_t x = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)out ^ (uint64_t)clock();
        for (int i = 0; i < 12; i++) { x = x * 6364136223846793005ULL + 1442695040888963407ULL; r[i] = (unsigned char)(x >> 56); }
    }
    memcpy(out, "call_", 5);
    for (int i = 0; i < 12; i++) { out[5 + 2 * i] = hex[r[i] >> 4]; out[6 + 2 * i] = hex[r[i] & 15]; }
    out[29] = 0;
}

/* ---- streaming dispatch -------------------------------------------------- */

void tp_stream_init(tp_stream *s, tp_kind kind, const json_t *tools) {
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->tools = tools;
    s->index = -1;
    buf_init(&s->hold);
}

void tp_stream_free(tp_stream *s) {
    buf_free(&s->hold);
    free(s->func_name);
    s->func_name = NULL;
}

void tp_stream_feed(tp_stream *s, const char *d, size_t n, buf *content, tp_deltas *out) {
    buf_append(&s->hold, d, n);
    if (s->kind == TP_QWEN3_CODER) tp_coder_feed(s, content, out, 0);
    else if (s->kind == TP_QWEN25) tp_q25_feed(s, content, out, 0);
    else { buf_append(content, s->hold.data, s->hold.len); s->hold.len = 0; }
}

void tp_stream_finish(tp_stream *s, buf *content, tp_deltas *out) {
    buf_reserve(&s->hold, 0);
    if (s->kind == TP_QWEN3_CODER) tp_coder_feed(s, content, out, 1);
    else if (s->kind == TP_QWEN25) tp_q25_feed(s, content, out, 1);
    else if (s->hold.len) buf_append(content, s->hold.data, s->hold.len);
    s->hold.len = 0;
}

void tp_parse(tp_kind kind, const json_t *tools, const char *text, buf *content, tp_calls *calls) {
    const char *t = kind == TP_NONE ? NULL : strstr(text, "<tool_call>");
    if (!t) { buf_puts(content, text); return; }
    buf_append(content, text, t - text);
    if (kind == TP_QWEN3_CODER) tp_coder_parse(tools, t, calls);
    else tp_q25_parse(tools, t, calls);
}

/* ---- tool schemas -------------------------------------------------------- */

static const json_t *find_tool(const json_t *tools, const char *func) {
    if (!json_is_array(tools) || !func) return NULL;
    for (size_t i = 0; i < json_array_size(tools); i++) {
        const json_t *t = json_array_get(tools, i);
        const json_t *f = json_object_get(t, "function");
        const char *type = json_string_value(json_object_get(t, "type"));
        if (type && strcmp(type, "function")) continue;
        const char *name = json_string_value(json_object_get(f, "name"));
        if (name && !strcmp(name, func)) return f;
    }
    return NULL;
}

int tp_tool_exists(const json_t *tools, const char *func) { return find_tool(tools, func) != NULL; }

const json_t *tp_tool_properties(const json_t *tools, const char *func) {
    const json_t *f = find_tool(tools, func);
    const json_t *p = json_object_get(f, "parameters");
    if (!json_is_object(p)) return NULL;
    const json_t *props = json_object_get(p, "properties");
    return json_is_object(props) ? props : p;
}

/* ---- qwen3_coder parameter conversion --------------------------------------- */

static int has_prefix(const char *s, const char *p) { return !strncmp(s, p, strlen(p)); }

/* Python int(): surrounding whitespace, a sign, digits with single underscores. */
static int py_int(const char *s, long long *out) {
    while (isspace((unsigned char)*s)) s++;
    char tmp[64]; int n = 0;
    if (*s == '+' || *s == '-') tmp[n++] = *s++;
    int digits = 0;
    for (; *s && !isspace((unsigned char)*s); s++) {
        if (*s == '_' && digits && s[1] >= '0' && s[1] <= '9') continue;
        if (*s < '0' || *s > '9' || n >= 40) return -1;
        tmp[n++] = *s;
        digits++;
    }
    while (isspace((unsigned char)*s)) s++;
    if (*s || !digits) return -1;
    tmp[n] = 0;
    char *end;
    errno = 0;
    *out = strtoll(tmp, &end, 10);
    return errno ? -1 : 0;
}

/* Python float(): like strtod but no hex floats; "inf"/"nan" allowed. */
static int py_float(const char *s, double *out) {
    while (isspace((unsigned char)*s)) s++;
    const char *q = s;
    if (*q == '+' || *q == '-') q++;
    if (q[0] == '0' && (q[1] == 'x' || q[1] == 'X')) return -1;
    char *tmp = xstrdup(s), *w = tmp;
    for (const char *r = s; *r; r++) if (*r != '_') *w++ = *r; /* 1_000.5 */
    *w = 0;
    char *end;
    double d = strtod(tmp, &end);
    while (isspace((unsigned char)*end)) end++;
    int ok = end != tmp && !*end;
    free(tmp);
    if (!ok) return -1;
    *out = d;
    return 0;
}

json_t *tp_convert_param(const char *value, size_t n, const char *pname, const json_t *props) {
    char *v = xmalloc(n + 1);
    memcpy(v, value, n);
    v[n] = 0;
    json_t *out = NULL;
    if (n == 4 && !strncasecmp(v, "null", 4)) { out = json_null(); goto done; }
    const json_t *pc = props ? json_object_get(props, pname) : NULL;
    if (!pc) { out = json_stringn(v, n); goto done; }
    char type[64] = "string";
    const json_t *jt = json_object_get(pc, "type");
    if (jt) {
        if (json_is_string(jt)) snprintf(type, sizeof type, "%s", json_string_value(jt));
        else snprintf(type, sizeof type, "<non-string type>"); /* e.g. ["string","null"]: "other" */
        char *a = type, *b = type + strlen(type);
        while (*a && isspace((unsigned char)*a)) a++;
        while (b > a && isspace((unsigned char)b[-1])) *--b = 0;
        memmove(type, a, strlen(a) + 1);
        for (char *c = type; *c; c++) *c = (char)tolower((unsigned char)*c);
    }
    if (!strcmp(type, "string") || !strcmp(type, "str") || !strcmp(type, "text") ||
        !strcmp(type, "varchar") || !strcmp(type, "char") || !strcmp(type, "enum")) {
        out = json_stringn(v, n);
    } else if (has_prefix(type, "int") || has_prefix(type, "uint") || has_prefix(type, "long") ||
               has_prefix(type, "short") || has_prefix(type, "unsigned")) {
        long long x;
        out = py_int(v, &x) == 0 ? json_integer(x) : json_stringn(v, n);
    } else if (has_prefix(type, "num") || has_prefix(type, "float")) {
        int maybe_int = !strchr(v, '.') && !strchr(v, 'e') && !strchr(v, 'E');
        double d;
        if (py_float(v, &d) == 0) {
            if (maybe_int && isfinite(d) && d == floor(d) && fabs(d) < 9.2e18) out = json_integer((long long)d);
            else out = json_real(d);
        } else {
            out = json_stringn(v, n);
        }
    } else if (!strcmp(type, "boolean") || !strcmp(type, "bool") || !strcmp(type, "binary")) {
        out = json_boolean(n == 4 && !strncasecmp(v, "true", 4));
    } else {
        if (!strcmp(type, "object") || !strcmp(type, "array") || !strcmp(type, "arr") ||
            has_prefix(type, "dict") || has_prefix(type, "list")) {
            out = json_loadb(v, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
            if (out) goto done;
        }
        out = jpy_literal_eval(v);
        if (!out) out = json_stringn(v, n);
    }
done:
    free(v);
    return out;
}
