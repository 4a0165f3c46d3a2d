/* jinja_value.c: Jinja values with Python semantics.
 *
 * What templates see is what Python would do with the same objects under jinja2:
 * str() of None is "None", of True "True", of a float its shortest round-trip repr
 * ("1e+16", "0.0001", "1.0"), of a list "['a', 1]" (repr of items, with Python's
 * choice of quotes); == compares across int/float/bool; ordering between unrelated
 * types is a TypeError with Python's message. tojson is transformers' override:
 * json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False),
 * so separators are ", " and ": " without indent and "," / ": " with it.
 *
 * Owns: the render arena accounting (jalloc enforces the context's memory cap).
 */
#include "tok/jinja_int.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- allocation and errors ------------------------------------------------- */
void *jalloc(jctx *c, size_t n) {
    c->alloc_bytes += n;
    if (c->alloc_cap && c->alloc_bytes > c->alloc_cap) return NULL;
    return arena_alloc(c->a, n ? n : 1);
}

int jfail(jctx *c, const char *fmt, ...) {
    if (c->has_err) return ERR_INVAL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, sizeof c->msg, fmt, ap);
    va_end(ap);
    c->has_err = 1;
    return ERR_INVAL;
}

int jfail_undef(jctx *c, jval u) { return jfail(c, "%s", u.umsg ? u.umsg : "undefined value"); }

/* ---- UTF-8 --------------------------------------------------------------------- */
int32_t u8_next(const char *p, size_t n, size_t *i) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)p + *i, (utf8proc_ssize_t)(n - *i), &cp);
    if (k <= 0) { cp = (unsigned char)p[*i]; k = 1; }
    *i += (size_t)k;
    return cp;
}
int64_t u8_len(const char *p, size_t n) {
    int64_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)p[i] & 0xC0) != 0x80;
    return c;
}
size_t u8_offset(const char *p, size_t n, int64_t cp) {
    size_t i = 0;
    while (cp > 0 && i < n) {
        i++;
        while (i < n && ((unsigned char)p[i] & 0xC0) == 0x80) i++;
        cp--;
    }
    return i;
}
void u8_put(buf *b, int32_t cp) {
    utf8proc_uint8_t tmp[4];
    utf8proc_ssize_t k = utf8proc_encode_char(cp, tmp);
    buf_append(b, tmp, (size_t)k);
}
bool py_isspace(int32_t cp) {
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
           cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* ---- constructors ------------------------------------------------------------------ */
jval jv_undef(const char *msg) { jval v = {.t = JT_UNDEF}; v.umsg = msg; return v; }
jval jv_none(void) { jval v = {.t = JT_NONE}; return v; }
jval jv_bool(bool b) { jval v = {.t = JT_BOOL}; v.b = b; return v; }
jval jv_int(int64_t i) { jval v = {.t = JT_INT}; v.i = i; return v; }
jval jv_float(double f) { jval v = {.t = JT_FLOAT}; v.f = f; return v; }
jval jv_strn_nocopy(const char *p, size_t n) { jval v = {.t = JT_STR}; v.s.p = p; v.s.n = n; return v; }
jval jv_strz(const char *p) { return jv_strn_nocopy(p, strlen(p)); }
jval jv_str(jctx *c, const char *p, size_t n) {
    char *q = jalloc(c, n + 1);
    if (!q) return jv_strn_nocopy("", 0);
    if (n) memcpy(q, p, n);
    q[n] = 0;
    return jv_strn_nocopy(q, n);
}
jval jv_list(jctx *c, int cap, bool tuple) {
    jval v = {.t = JT_LIST};
    v.l = jalloc(c, sizeof(jlist));
    if (!v.l) { static jlist empty; v.l = &empty; return v; }
    v.l->tuple = tuple;
    if (cap > 0) { v.l->v = jalloc(c, sizeof(jval) * cap); v.l->cap = v.l->v ? cap : 0; }
    return v;
}
void jl_push(jctx *c, jlist *l, jval x) {
    if (l->n == l->cap) {
        int nc = l->cap ? l->cap * 2 : 4;
        jval *nv = jalloc(c, sizeof(jval) * nc);
        if (!nv) return; /* the memory cap error surfaces at the next check */
        if (l->n) memcpy(nv, l->v, sizeof(jval) * l->n);
        l->v = nv;
        l->cap = nc;
    }
    l->v[l->n++] = x;
}
jval jv_dict(jctx *c, int cap) {
    jval v = {.t = JT_DICT};
    v.d = jalloc(c, sizeof(jdict));
    if (!v.d) { static jdict empty; v.d = &empty; return v; }
    if (cap > 0) {
        v.d->k = jalloc(c, sizeof(jval) * cap);
        v.d->v = jalloc(c, sizeof(jval) * cap);
        v.d->cap = (v.d->k && v.d->v) ? cap : 0;
    }
    return v;
}
int jd_find(const jdict *d, jval k) {
    for (int i = 0; i < d->n; i++)
        if (jv_eq(d->k[i], k)) return i;
    return -1;
}
jval *jd_get_str(const jdict *d, const char *k) {
    size_t n = strlen(k);
    for (int i = 0; i < d->n; i++)
        if (d->k[i].t == JT_STR && d->k[i].s.n == n && !memcmp(d->k[i].s.p, k, n)) return &d->v[i];
    return NULL;
}
void jd_set(jctx *c, jdict *d, jval k, jval v) {
    int i = jd_find(d, k);
    if (i >= 0) { d->v[i] = v; return; }
    if (d->n == d->cap) {
        int nc = d->cap ? d->cap * 2 : 4;
        jval *nk = jalloc(c, sizeof(jval) * nc), *nv = jalloc(c, sizeof(jval) * nc);
        if (!nk || !nv) return;
        if (d->n) { memcpy(nk, d->k, sizeof(jval) * d->n); memcpy(nv, d->v, sizeof(jval) * d->n); }
        d->k = nk; d->v = nv; d->cap = nc;
    }
    d->k[d->n] = k;
    d->v[d->n++] = v;
}
jval jv_func(jctx *c, const char *name, jfn_impl fn, jval self) {
    jval v = {.t = JT_FUNC};
    v.fn = jalloc(c, sizeof(jfunc));
    if (!v.fn) return jv_none();
    v.fn->name = name;
    v.fn->fn = fn;
    v.fn->self = self;
    return v;
}

jval jv_from_json(jctx *c, json_t *j) {
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        jval d = jv_dict(c, (int)json_object_size(j));
        const char *k;
        json_t *x;
        json_object_foreach(j, k, x) jd_set(c, d.d, jv_strz(k), jv_from_json(c, x));
        return d;
    }
    case JSON_ARRAY: {
        jval l = jv_list(c, (int)json_array_size(j), false);
        size_t i;
        json_t *x;
        json_array_foreach(j, i, x) jl_push(c, l.l, jv_from_json(c, x));
        return l;
    }
    case JSON_STRING: return jv_strn_nocopy(json_string_value(j), json_string_length(j));
    case JSON_INTEGER: return jv_int((int64_t)json_integer_value(j));
    case JSON_REAL: return jv_float(json_real_value(j));
    case JSON_TRUE: return jv_bool(true);
    case JSON_FALSE: return jv_bool(false);
    default: return jv_none();
    }
}

/* ---- type predicates ------------------------------------------------------------- */
const char *jv_typename(jval v) {
    switch (v.t) {
    case JT_UNDEF: return "Undefined";
    case JT_NONE: return "NoneType";
    case JT_BOOL: return "bool";
    case JT_INT: return "int";
    case JT_FLOAT: return "float";
    case JT_STR: return "str";
    case JT_LIST: return v.l->tuple ? "tuple" : "list";
    case JT_DICT: return "dict";
    case JT_NS: return "Namespace";
    case JT_MACRO: return "Macro";
    case JT_FUNC: return "builtin_function_or_method";
    case JT_LOOP: return "LoopContext";
    }
    return "object";
}
const char *jv_objrepr(jval v) {
    switch (v.t) {
    case JT_NONE: return "None";
    case JT_BOOL: return "bool object";
    case JT_INT: return "int object";
    case JT_FLOAT: return "float object";
    case JT_STR: return "str object";
    case JT_LIST: return v.l->tuple ? "tuple object" : "list object";
    case JT_DICT: return "dict object";
    case JT_NS: return "jinja2.utils.Namespace object";
    case JT_MACRO: return "jinja2.runtime.Macro object";
    case JT_LOOP: return "jinja2.runtime.LoopContext object";
    default: return "builtin_function_or_method object";
    }
}
bool jv_is_str(jval v) { return v.t == JT_STR; }
bool jv_iterable(jval v) {
    return v.t == JT_UNDEF || v.t == JT_STR || v.t == JT_LIST || v.t == JT_DICT || v.t == JT_LOOP;
}
/* Python hash(): "" when hashable, else the name of the first unhashable type inside */
const char *jv_unhashable(jval v) {
    if (v.t == JT_LIST && v.l->tuple) {
        for (int i = 0; i < v.l->n; i++) {
            const char *u = jv_unhashable(v.l->v[i]);
            if (*u) return u;
        }
        return "";
    }
    return v.t == JT_LIST ? "list" : v.t == JT_DICT ? "dict" : "";
}
bool jv_is_callable(jval v) { return v.t == JT_MACRO || v.t == JT_FUNC; }

bool jv_truthy(jval v) {
    switch (v.t) {
    case JT_UNDEF: case JT_NONE: return false;
    case JT_BOOL: return v.b;
    case JT_INT: return v.i != 0;
    case JT_FLOAT: return v.f != 0.0;
    case JT_STR: return v.s.n > 0;
    case JT_LIST: return v.l->n > 0;
    case JT_DICT: return v.d->n > 0;
    default: return true;
    }
}

static bool is_num(jval v) { return v.t == JT_INT || v.t == JT_FLOAT || v.t == JT_BOOL; }
static double num_f(jval v) { return v.t == JT_FLOAT ? v.f : v.t == JT_INT ? (double)v.i : (double)v.b; }
static int64_t num_i(jval v) { return v.t == JT_INT ? v.i : (int64_t)v.b; }

bool jv_eq(jval a, jval b) {
    if (is_num(a) && is_num(b)) {
        if (a.t == JT_FLOAT || b.t == JT_FLOAT) return num_f(a) == num_f(b);
        return num_i(a) == num_i(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case JT_UNDEF: case JT_NONE: return true;
    case JT_STR: return a.s.n == b.s.n && !memcmp(a.s.p, b.s.p, a.s.n);
    case JT_LIST:
        if (a.l->tuple != b.l->tuple || a.l->n != b.l->n) return false;
        for (int i = 0; i < a.l->n; i++)
            if (!jv_eq(a.l->v[i], b.l->v[i])) return false;
        return true;
    case JT_DICT:
        if (a.d->n != b.d->n) return false;
        for (int i = 0; i < a.d->n; i++) {
            int j = jd_find(b.d, a.d->k[i]);
            if (j < 0 || !jv_eq(a.d->v[i], b.d->v[j])) return false;
        }
        return true;
    case JT_NS: return a.d == b.d;
    case JT_MACRO: return a.m == b.m;
    case JT_FUNC: return a.fn == b.fn;
    case JT_LOOP: return a.loop == b.loop;
    default: return false;
    }
}

int jv_cmp(jctx *c, jval a, jval b, const char *op, int *res) {
    if (is_num(a) && is_num(b)) {
        if (a.t == JT_FLOAT || b.t == JT_FLOAT) {
            double x = num_f(a), y = num_f(b);
            *res = x < y ? -1 : x > y ? 1 : 0;
            if (isnan(x) || isnan(y)) *res = 2; /* every ordering comparison false */
        } else {
            int64_t x = num_i(a), y = num_i(b);
            *res = x < y ? -1 : x > y;
        }
        return 0;
    }
    if (a.t == JT_STR && b.t == JT_STR) {
        size_t n = a.s.n < b.s.n ? a.s.n : b.s.n;
        int r = memcmp(a.s.p, b.s.p, n);
        *res = r < 0 ? -1 : r > 0 ? 1 : a.s.n < b.s.n ? -1 : a.s.n > b.s.n;
        return 0;
    }
    if (a.t == JT_LIST && b.t == JT_LIST && a.l->tuple == b.l->tuple) {
        for (int i = 0; i < a.l->n && i < b.l->n; i++) {
            if (jv_eq(a.l->v[i], b.l->v[i])) continue;
            return jv_cmp(c, a.l->v[i], b.l->v[i], op, res);
        }
        *res = a.l->n < b.l->n ? -1 : a.l->n > b.l->n;
        return 0;
    }
    if (a.t == JT_UNDEF) return jfail_undef(c, a);
    if (b.t == JT_UNDEF) return jfail_undef(c, b);
    return jfail(c, "'%s' not supported between instances of '%s' and '%s'", op, jv_typename(a), jv_typename(b));
}

/* ---- str() / repr() ---------------------------------------------------------------- */
void py_float_repr(buf *b, double f) {
    if (isnan(f)) { buf_puts(b, "nan"); return; }
    if (isinf(f)) { buf_puts(b, f < 0 ? "-inf" : "inf"); return; }
    char tmp[64];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, f);
        if (strtod(tmp, NULL) == f) break;
    }
    /* tmp = [-]d[.ddd]e[+-]XX: collect digits and exponent */
    const char *p = tmp;
    bool neg = false;
    if (*p == '-') { neg = true; p++; }
    char dig[32];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') dig[nd++] = *p;
    while (nd > 1 && dig[nd - 1] == '0') nd--;
    int ex = atoi(p + 1);
    if (neg) buf_putc(b, '-');
    if (ex >= -5 + 1 && ex < 16) {
        if (ex >= 0) {
            for (int i = 0; i <= ex; i++) buf_putc(b, i < nd ? dig[i] : '0');
            buf_putc(b, '.');
            if (nd > ex + 1) buf_append(b, dig + ex + 1, (size_t)(nd - ex - 1));
            else buf_putc(b, '0');
        } else {
            buf_puts(b, "0.");
            for (int i = 0; i < -ex - 1; i++) buf_putc(b, '0');
            buf_append(b, dig, (size_t)nd);
        }
    } else {
        buf_putc(b, dig[0]);
        if (nd > 1) { buf_putc(b, '.'); buf_append(b, dig + 1, (size_t)(nd - 1)); }
        buf_printf(b, "e%c%02d", ex < 0 ? '-' : '+', ex < 0 ? -ex : ex);
    }
}

static bool py_isprintable(int32_t cp) {
    if (cp == ' ') return true;
    utf8proc_category_t cat = utf8proc_category(cp);
    switch (cat) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
        return false;
    default:
        return true;
    }
}

static void repr_str(buf *b, const char *p, size_t n) {
    bool has_sq = memchr(p, '\'', n) != NULL, has_dq = memchr(p, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    buf_putc(b, q);
    size_t i = 0;
    while (i < n) {
        int32_t cp = u8_next(p, n, &i);
        if (cp == q || cp == '\\') { buf_putc(b, '\\'); buf_putc(b, (char)cp); }
        else if (cp == '\n') buf_puts(b, "\\n");
        else if (cp == '\r') buf_puts(b, "\\r");
        else if (cp == '\t') buf_puts(b, "\\t");
        else if (cp < 0x20 || cp == 0x7F) buf_printf(b, "\\x%02x", cp);
        else if (cp < 0x7F) buf_putc(b, (char)cp);
        else if (py_isprintable(cp)) u8_put(b, cp);
        else if (cp <= 0xFF) buf_printf(b, "\\x%02x", cp);
        else if (cp <= 0xFFFF) buf_printf(b, "\\u%04x", cp);
        else buf_printf(b, "\\U%08x", cp);
    }
    buf_putc(b, q);
}

static void repr_dict_body(buf *b, const jdict *d) {
    buf_putc(b, '{');
    for (int i = 0; i < d->n; i++) {
        if (i) buf_puts(b, ", ");
        jv_repr_append(b, d->k[i]);
        buf_puts(b, ": ");
        jv_repr_append(b, d->v[i]);
    }
    buf_putc(b, '}');
}

void jv_repr_append(buf *b, jval v) {
    switch (v.t) {
    case JT_STR:
        if (v.markup) buf_puts(b, "Markup(");
        repr_str(b, v.s.p, v.s.n);
        if (v.markup) buf_putc(b, ')');
        return;
    case JT_LIST:
        buf_putc(b, v.l->tuple ? '(' : '[');
        for (int i = 0; i < v.l->n; i++) {
            if (i) buf_puts(b, ", ");
            jv_repr_append(b, v.l->v[i]);
        }
        if (v.l->tuple && v.l->n == 1) buf_putc(b, ',');
        buf_putc(b, v.l->tuple ? ')' : ']');
        return;
    case JT_DICT: repr_dict_body(b, v.d); return;
    case JT_UNDEF: buf_puts(b, "Undefined"); return;
    default: jv_str_append(b, v);
    }
}

void jv_str_append(buf *b, jval v) {
    switch (v.t) {
    case JT_UNDEF: return;
    case JT_NONE: buf_puts(b, "None"); return;
    case JT_BOOL: buf_puts(b, v.b ? "True" : "False"); return;
    case JT_INT: buf_printf(b, "%lld", (long long)v.i); return;
    case JT_FLOAT: py_float_repr(b, v.f); return;
    case JT_STR: buf_append(b, v.s.p, v.s.n); return;
    case JT_NS: buf_puts(b, "<Namespace "); repr_dict_body(b, v.d); buf_putc(b, '>'); return;
    case JT_MACRO: buf_printf(b, "<Macro '%s'>", v.m->name ? v.m->name : "caller"); return;
    case JT_FUNC: buf_printf(b, "<built-in method %s>", v.fn->name); return;
    case JT_LOOP: buf_printf(b, "<LoopContext %lld/%lld>", (long long)v.loop->index0 + 1, (long long)v.loop->length); return;
    default: jv_repr_append(b, v);
    }
}

jval jv_tostr(jctx *c, jval v) {
    if (v.t == JT_STR) return v;
    buf b;
    buf_init(&b);
    jv_str_append(&b, v);
    jval r = jv_str(c, b.data ? b.data : "", b.len);
    buf_free(&b);
    return r;
}

/* ---- tojson (json.dumps) ------------------------------------------------------------ */
static void json_str(buf *b, const char *p, size_t n, bool ensure_ascii) {
    buf_putc(b, '"');
    size_t i = 0;
    while (i < n) {
        size_t st = i;
        int32_t cp = u8_next(p, n, &i);
        switch (cp) {
        case '"': buf_puts(b, "\\\""); break;
        case '\\': buf_puts(b, "\\\\"); break;
        case '\n': buf_puts(b, "\\n"); break;
        case '\r': buf_puts(b, "\\r"); break;
        case '\t': buf_puts(b, "\\t"); break;
        case '\b': buf_puts(b, "\\b"); break;
        case '\f': buf_puts(b, "\\f"); break;
        default:
            if (cp < 0x20) buf_printf(b, "\\u%04x", cp);
            else if (!ensure_ascii || cp < 0x7F) buf_append(b, p + st, i - st);
            else if (cp <= 0xFFFF) buf_printf(b, "\\u%04x", cp);
            else {
                int32_t x = cp - 0x10000;
                buf_printf(b, "\\u%04x\\u%04x", 0xD800 + (x >> 10), 0xDC00 + (x & 0x3FF));
            }
        }
    }
    buf_putc(b, '"');
}

static void json_float(buf *b, double f) {
    if (isnan(f)) buf_puts(b, "NaN");
    else if (isinf(f)) buf_puts(b, f < 0 ? "-Infinity" : "Infinity");
    else py_float_repr(b, f);
}

typedef struct jopts { bool ascii; const char *indent; const char *isep, *ksep; bool sort; } jopts;

static void json_nl(buf *b, const jopts *o, int level) {
    buf_putc(b, '\n');
    for (int i = 0; i < level; i++) buf_puts(b, o->indent);
}

static int json_rec(jctx *c, buf *b, jval v, const jopts *o, int level) {
    if (level > 200) return jfail(c, "tojson: value nested too deeply");
    switch (v.t) {
    case JT_NONE: buf_puts(b, "null"); return 0;
    case JT_BOOL: buf_puts(b, v.b ? "true" : "false"); return 0;
    case JT_INT: buf_printf(b, "%lld", (long long)v.i); return 0;
    case JT_FLOAT: json_float(b, v.f); return 0;
    case JT_STR: json_str(b, v.s.p, v.s.n, o->ascii); return 0;
    case JT_LIST:
        if (!v.l->n) { buf_puts(b, "[]"); return 0; }
        buf_putc(b, '[');
        for (int i = 0; i < v.l->n; i++) {
            if (i) buf_puts(b, o->isep);
            if (o->indent) json_nl(b, o, level + 1);
            if (json_rec(c, b, v.l->v[i], o, level + 1)) return ERR_INVAL;
        }
        if (o->indent) json_nl(b, o, level);
        buf_putc(b, ']');
        return 0;
    case JT_DICT: {
        if (!v.d->n) { buf_puts(b, "{}"); return 0; }
        int n = v.d->n;
        int *order = jalloc(c, sizeof(int) * n);
        if (!order) return jfail(c, "template used too much memory");
        for (int i = 0; i < n; i++) order[i] = i;
        if (o->sort) {
            /* insertion sort by key (keys must be mutually comparable, as in Python) */
            for (int i = 1; i < n; i++)
                for (int j = i; j > 0; j--) {
                    int r;
                    if (jv_cmp(c, v.d->k[order[j - 1]], v.d->k[order[j]], "<", &r)) return ERR_INVAL;
                    if (r <= 0) break;
                    int t = order[j]; order[j] = order[j - 1]; order[j - 1] = t;
                }
        }
        buf_putc(b, '{');
        for (int ii = 0; ii < n; ii++) {
            int i = order[ii];
            jval k = v.d->k[i];
            if (ii) buf_puts(b, o->isep);
            if (o->indent) json_nl(b, o, level + 1);
            switch (k.t) {
            case JT_STR: json_str(b, k.s.p, k.s.n, o->ascii); break;
            case JT_INT: buf_printf(b, "\"%lld\"", (long long)k.i); break;
            case JT_FLOAT: buf_putc(b, '"'); json_float(b, k.f); buf_putc(b, '"'); break;
            case JT_BOOL: buf_puts(b, k.b ? "\"true\"" : "\"false\""); break;
            case JT_NONE: buf_puts(b, "\"null\""); break;
            default: return jfail(c, "keys must be str, int, float, bool or None, not %s", jv_typename(k));
            }
            buf_puts(b, o->ksep);
            if (json_rec(c, b, v.d->v[i], o, level + 1)) return ERR_INVAL;
        }
        if (o->indent) json_nl(b, o, level);
        buf_putc(b, '}');
        return 0;
    }
    default:
        return jfail(c, "Object of type %s is not JSON serializable", jv_typename(v));
    }
}

int jv_tojson(jctx *c, buf *b, jval v, bool ensure_ascii, const char *indent, const char *item_sep,
              const char *key_sep, bool sort_keys) {
    jopts o = {ensure_ascii, indent, item_sep, key_sep, sort_keys};
    if (!o.isep) o.isep = indent ? "," : ", ";
    if (!o.ksep) o.ksep = ": ";
    return json_rec(c, b, v, &o, 0);
}

/* ---- sorting (stable merge sort, Python's ordering) -------------------------------- */
static jval fold_case(jctx *c, jval v, bool case_sensitive) {
    if (case_sensitive || v.t != JT_STR) return v;
    utf8proc_uint8_t *low = NULL;
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)v.s.p, (utf8proc_ssize_t)v.s.n, &low,
                                      UTF8PROC_CASEFOLD);
    if (n < 0) return v;
    jval r = jv_str(c, (const char *)low, (size_t)n);
    free(low);
    return r;
}

int jv_sort(jctx *c, jval *v, int n, bool case_sensitive, bool reverse, jval *keys) {
    if (n < 2) return 0;
    jval *k = jalloc(c, sizeof(jval) * n), *tk = jalloc(c, sizeof(jval) * n), *tv = jalloc(c, sizeof(jval) * n);
    if (!k || !tk || !tv) return jfail(c, "template used too much memory");
    for (int i = 0; i < n; i++) k[i] = fold_case(c, keys ? keys[i] : v[i], case_sensitive);
    for (int w = 1; w < n; w *= 2) {
        for (int lo = 0; lo < n; lo += 2 * w) {
            int mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int i = lo, j = mid, o = lo;
            while (i < mid && j < hi) {
                int r;
                if (jv_cmp(c, k[j], k[i], "<", &r)) return ERR_INVAL;
                bool take_right = reverse ? (r > 0 && r != 2) : (r < 0);
                if (reverse) { /* stable descending: right wins only when strictly greater */
                    if (take_right) { tk[o] = k[j]; tv[o++] = v[j++]; }
                    else { tk[o] = k[i]; tv[o++] = v[i++]; }
                } else {
                    if (take_right) { tk[o] = k[j]; tv[o++] = v[j++]; }
                    else { tk[o] = k[i]; tv[o++] = v[i++]; }
                }
            }
            while (i < mid) { tk[o] = k[i]; tv[o++] = v[i++]; }
            while (j < hi) { tk[o] = k[j]; tv[o++] = v[j++]; }
        }
        memcpy(k, tk, sizeof(jval) * n);
        memcpy(v, tv, sizeof(jval) * n);
    }
    return 0;
}
