/* json_py.c: JSON text as Python writes it, and Python literal parsing.
 *
 * Tool-call arguments must be byte-identical to what SGLang sends, which is
 * json.dumps(value, ensure_ascii=False): separators ", " and ": ", non-ASCII
 * kept raw, floats as repr() (shortest round-trip digits). jansson's own
 * dumper prints 0.1 as 0.10000000000000001, hence this file. It also holds a
 * small ast.literal_eval for the qwen3_coder fallback when a value is a
 * Python literal ({'a': True}) rather than JSON.
 */
#include "server/server.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- writing ----------------------------------------------------------- */

void jpy_str(buf *b, const char *s, size_t n) {
    buf_putc(b, '"');
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char tmp[8];
        switch (c) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (c < 0x20) { snprintf(tmp, sizeof tmp, "\\u%04x", c); esc = tmp; }
        }
        if (esc) {
            buf_append(b, s + run, i - run);
            buf_puts(b, esc);
            run = i + 1;
        }
    }
    buf_append(b, s + run, n - run);
    buf_putc(b, '"');
}

void jpy_float(buf *b, double d) {
    if (isnan(d)) { buf_puts(b, "NaN"); return; }
    if (isinf(d)) { buf_puts(b, d < 0 ? "-Infinity" : "Infinity"); return; }
    if (d == 0) { buf_puts(b, signbit(d) ? "-0.0" : "0.0"); return; }
    char tmp[64];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
        if (strtod(tmp, NULL) == d) break;
    }
    /* tmp = [-]D[.DDD]e[+-]XX: split into digits and exponent */
    char digits[32]; int nd = 0, neg = 0;
    const char *p = tmp;
    if (*p == '-') { neg = 1; p++; }
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    digits[nd] = 0;
    int x = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') digits[--nd] = 0;
    if (neg) buf_putc(b, '-');
    if (x >= -4 && x < 16) {
        if (x >= 0) {
            for (int i = 0; i <= x; i++) buf_putc(b, i < nd ? digits[i] : '0');
            buf_putc(b, '.');
            if (nd > x + 1) buf_puts(b, digits + x + 1); else buf_putc(b, '0');
        } else {
            buf_puts(b, "0.");
            for (int i = 0; i < -x - 1; i++) buf_putc(b, '0');
            buf_puts(b, digits);
        }
    } else {
        buf_putc(b, digits[0]);
        if (nd > 1) { buf_putc(b, '.'); buf_puts(b, digits + 1); }
        buf_printf(b, "e%c%02d", x < 0 ? '-' : '+', x < 0 ? -x : x);
    }
}

static void dump_sep(buf *b, const json_t *v, const char *item_sep, const char *kv_sep) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: {
        const char *k; json_t *x; int first = 1;
        buf_putc(b, '{');
        json_object_foreach((json_t *)v, k, x) {
            if (!first) buf_puts(b, item_sep);
            first = 0;
            jpy_str(b, k, strlen(k));
            buf_puts(b, kv_sep);
            dump_sep(b, x, item_sep, kv_sep);
        }
        buf_putc(b, '}');
        break;
    }
    case JSON_ARRAY:
        buf_putc(b, '[');
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) buf_puts(b, item_sep);
            dump_sep(b, json_array_get(v, i), item_sep, kv_sep);
        }
        buf_putc(b, ']');
        break;
    case JSON_STRING: jpy_str(b, json_string_value(v), json_string_length(v)); break;
    case JSON_INTEGER: buf_printf(b, "%lld", (long long)json_integer_value(v)); break;
    case JSON_REAL: jpy_float(b, json_real_value(v)); break;
    case JSON_TRUE: buf_puts(b, "true"); break;
    case JSON_FALSE: buf_puts(b, "false"); break;
    case JSON_NULL: buf_puts(b, "null"); break;
    }
}

void jpy_dump(buf *b, const json_t *v) { dump_sep(b, v, ", ", ": "); }

void jpy_dump_compact(buf *b, const json_t *v) { dump_sep(b, v, ",", ":"); }

char *jpy_dumps(const json_t *v) {
    buf b; buf_init(&b);
    jpy_dump(&b, v);
    return buf_detach(&b);
}

/* ---- ast.literal_eval subset ---------------------------------------------- */

typedef struct lit { const char *p; int depth; } lit;

static void lit_ws(lit *L) {
    while (*L->p == ' ' || *L->p == '\t' || *L->p == '\n' || *L->p == '\r') L->p++;
}

static json_t *lit_value(lit *L);

static int hexval(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void put_utf8(buf *b, unsigned cp) {
    if (cp < 0x80) buf_putc(b, (char)cp);
    else if (cp < 0x800) { buf_putc(b, (char)(0xC0 | cp >> 6)); buf_putc(b, (char)(0x80 | (cp & 63))); }
    else if (cp < 0x10000) {
        buf_putc(b, (char)(0xE0 | cp >> 12)); buf_putc(b, (char)(0x80 | ((cp >> 6) & 63)));
        buf_putc(b, (char)(0x80 | (cp & 63)));
    } else {
        buf_putc(b, (char)(0xF0 | cp >> 18)); buf_putc(b, (char)(0x80 | ((cp >> 12) & 63)));
        buf_putc(b, (char)(0x80 | ((cp >> 6) & 63))); buf_putc(b, (char)(0x80 | (cp & 63)));
    }
}

static json_t *lit_string(lit *L) {
    char q = *L->p++;
    buf b; buf_init(&b);
    for (;;) {
        char c = *L->p;
        if (!c || c == '\n') { buf_free(&b); return NULL; }
        L->p++;
        if (c == q) break;
        if (c != '\\') { buf_putc(&b, c); continue; }
        char e = *L->p++;
        int nhex = 0;
        switch (e) {
        case 'n': buf_putc(&b, '\n'); break;
        case 't': buf_putc(&b, '\t'); break;
        case 'r': buf_putc(&b, '\r'); break;
        case 'b': buf_putc(&b, '\b'); break;
        case 'f': buf_putc(&b, '\f'); break;
        case 'v': buf_putc(&b, '\v'); break;
        case 'a': buf_putc(&b, '\a'); break;
        case '0': buf_putc(&b, '\0'); break;
        case '\\': case '\'': case '"': buf_putc(&b, e); break;
        case '\n': break;
        case 'x': nhex = 2; break;
        case 'u': nhex = 4; break;
        case 'U': nhex = 8; break;
        default: buf_putc(&b, '\\'); buf_putc(&b, e); break; /* Python keeps unknown escapes */
        }
        if (nhex) {
            unsigned cp = 0;
            for (int i = 0; i < nhex; i++) {
                int h = hexval(*L->p);
                if (h < 0) { buf_free(&b); return NULL; }
                cp = cp * 16 + (unsigned)h;
                L->p++;
            }
            if (cp > 0x10FFFF) { buf_free(&b); return NULL; }
            put_utf8(&b, cp);
        }
    }
    json_t *s = json_stringn(b.data ? b.data : "", b.len);
    buf_free(&b);
    return s;
}

static json_t *lit_number(lit *L) {
    const char *s = L->p;
    int neg = 0;
    while (*s == '-' || *s == '+') { if (*s == '-') neg = !neg; s++; while (*s == ' ') s++; }
    char tmp[128]; int n = 0, is_float = 0;
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        s += 2;
        long long v = 0; int any = 0;
        while (hexval(*s) >= 0 || *s == '_') {
            if (*s != '_') { v = v * 16 + hexval(*s); any = 1; }
            s++;
        }
        if (!any) return NULL;
        L->p = s;
        return json_integer(neg ? -v : v);
    }
    while ((*s >= '0' && *s <= '9') || *s == '_' || *s == '.' || *s == 'e' || *s == 'E' ||
           ((*s == '-' || *s == '+') && n > 0 && (tmp[n - 1] == 'e' || tmp[n - 1] == 'E'))) {
        if (n >= (int)sizeof tmp - 1) return NULL;
        if (*s == '.' || *s == 'e' || *s == 'E') is_float = 1;
        if (*s != '_') tmp[n++] = *s;
        s++;
    }
    tmp[n] = 0;
    if (!n || !((tmp[0] >= '0' && tmp[0] <= '9') || tmp[0] == '.')) return NULL;
    char *end;
    L->p = s;
    if (is_float) {
        double d = strtod(tmp, &end);
        if (*end) return NULL;
        return json_real(neg ? -d : d);
    }
    long long v = strtoll(tmp, &end, 10);
    if (*end) return NULL;
    if (n > 1 && tmp[0] == '0') { /* Python rejects 012 (but allows 0, 00) */
        for (int i = 0; i < n; i++) if (tmp[i] != '0') return NULL;
    }
    return json_integer(neg ? -v : v);
}

static int lit_word(lit *L, const char *w) {
    size_t n = strlen(w);
    if (strncmp(L->p, w, n)) return 0;
    char c = L->p[n];
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_') return 0;
    L->p += n;
    return 1;
}

/* Python's json.dumps turns non-string keys into strings. */
static char *lit_key_string(json_t *k) {
    if (json_is_string(k)) return xstrdup(json_string_value(k));
    if (json_is_true(k)) return xstrdup("true");
    if (json_is_false(k)) return xstrdup("false");
    if (json_is_null(k)) return xstrdup("null");
    if (json_is_integer(k) || json_is_real(k)) return jpy_dumps(k);
    return NULL;
}

static json_t *lit_seq(lit *L, char close, int is_dict) {
    json_t *out = is_dict ? json_object() : json_array();
    L->p++;
    int count = 0, tuple_comma = 0;
    for (;;) {
        lit_ws(L);
        if (*L->p == close) { L->p++; break; }
        json_t *k = lit_value(L);
        if (!k) goto fail;
        lit_ws(L);
        if (is_dict) {
            if (*L->p != ':') { json_decref(k); goto fail; }
            L->p++;
            json_t *v = lit_value(L);
            char *ks = lit_key_string(k);
            json_decref(k);
            if (!v || !ks) { json_decref(v); free(ks); goto fail; }
            json_object_set_new(out, ks, v);
            free(ks);
        } else {
            json_array_append_new(out, k);
        }
        count++;
        lit_ws(L);
        if (*L->p == ',') { L->p++; tuple_comma = 1; continue; }
        if (*L->p == close) { L->p++; break; }
        goto fail;
    }
    /* "(1)" is not a tuple but a parenthesised value */
    if (close == ')' && count == 1 && !tuple_comma) {
        json_t *v = json_incref(json_array_get(out, 0));
        json_decref(out);
        return v;
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

static json_t *lit_value(lit *L) {
    if (++L->depth > 64) return NULL;
    json_t *v = NULL;
    lit_ws(L);
    char c = *L->p;
    if (c == '{') {
        /* {} is a dict; {1, 2} would be a set, which JSON cannot hold */
        v = lit_seq(L, '}', 1);
    } else if (c == '[') v = lit_seq(L, ']', 0);
    else if (c == '(') v = lit_seq(L, ')', 0);
    else if (c == '\'' || c == '"') v = lit_string(L);
    else if (lit_word(L, "True")) v = json_true();
    else if (lit_word(L, "False")) v = json_false();
    else if (lit_word(L, "None")) v = json_null();
    else if (c == '-' || c == '+' || c == '.' || (c >= '0' && c <= '9')) v = lit_number(L);
    L->depth--;
    return v;
}

json_t *jpy_literal_eval(const char *s) {
    lit L = {s, 0};
    json_t *v = lit_value(&L);
    if (!v) return NULL;
    lit_ws(&L);
    if (*L.p) { json_decref(v); return NULL; }
    return v;
}
