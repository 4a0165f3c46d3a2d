/* jinja_filters.c: Jinja2's builtin filters (jinja2/filters.py 3.1) plus transformers' tojson.
 *
 * Each filter takes the already evaluated operand and arguments (positional and
 * keyword, in jinja's parameter order) and returns a new value. Filters that jinja
 * implements as generators (reverse, batch, map, select...) return lists here: same
 * items when iterated, joined or counted.
 * Not provided (a template using them fails to parse with "No filter named ..."):
 * wordwrap, striptags, urlize, urlencode, xmlattr, filesizeformat, pprint,
 * groupby, slice, random.
 */
#include "tok/jinja_int.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static jval arg(jargs *a, int pos, const char *kw, jval dflt) {
    jval v;
    return jargs_get(a, pos, kw, &v) ? v : dflt;
}
static jval sstr(jctx *c, jval v) { return jv_tostr(c, v); }
static jval lower_key(jctx *c, jval v) { return v.t == JT_STR ? jstr_case(c, v, CASE_LOWER) : v; }

/* make_attrgetter: "a.b.0" looked up with getitem semantics (items first, then attributes). */
static int attr_get(jctx *c, jval item, jval attribute, jval dflt, jval *out) {
    if (attribute.t == JT_INT) return jinja_getitem(c, item, attribute, out);
    if (attribute.t != JT_STR) return jfail(c, "attribute must be a string or an integer");
    const char *p = attribute.s.p, *end = p + attribute.s.n;
    jval cur = item;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        if (!dot) dot = end;
        size_t n = (size_t)(dot - p);
        bool digits = n > 0;
        for (size_t i = 0; i < n; i++) digits = digits && p[i] >= '0' && p[i] <= '9';
        jval key = digits ? jv_int(strtoll(p, NULL, 10)) : jv_str(c, p, n);
        if (jinja_getitem(c, cur, key, &cur)) return ERR_INVAL;
        if (cur.t == JT_UNDEF && dflt.t != JT_UNDEF) { *out = dflt; return 0; }
        p = dot + 1;
    }
    *out = cur;
    return 0;
}

static int iter_of(jctx *c, jval v, jlist **l) { return jinja_iterate(c, v, l); }

static int f_abs(jctx *c, jval v, jargs *a, jval *o) {
    if (v.t == JT_INT) *o = jv_int(v.i < 0 ? -v.i : v.i);
    else if (v.t == JT_BOOL) *o = jv_int(v.b);
    else if (v.t == JT_FLOAT) *o = jv_float(fabs(v.f));
    else if (v.t == JT_UNDEF) return jfail_undef(c, v);
    else return jfail(c, "bad operand type for abs(): '%s'", jv_typename(v));
    return 0;
}
static int f_attr(jctx *c, jval v, jargs *a, jval *o) {
    jval name = arg(a, 0, "name", jv_none());
    if (name.t != JT_STR) return jfail(c, "attr: name must be a string");
    return jinja_getattr(c, v, jv_str(c, name.s.p, name.s.n).s.p, o);
}
static int f_batch(jctx *c, jval v, jargs *a, jval *o) {
    jval lc = arg(a, 0, "linecount", jv_none()), fill = arg(a, 1, "fill_with", jv_none());
    jlist *l;
    if (lc.t != JT_INT || lc.i <= 0) return jfail(c, "batch: linecount must be a positive integer");
    if (iter_of(c, v, &l)) return ERR_INVAL;
    jval r = jv_list(c, 0, false), cur = jv_list(c, 0, false);
    for (int i = 0; i < l->n; i++) {
        if (cur.l->n == lc.i) { jl_push(c, r.l, cur); cur = jv_list(c, 0, false); }
        jl_push(c, cur.l, l->v[i]);
    }
    if (cur.l->n) {
        if (fill.t != JT_NONE)
            while (cur.l->n < lc.i) jl_push(c, cur.l, fill);
        jl_push(c, r.l, cur);
    }
    *o = r;
    return 0;
}
static int f_capitalize(jctx *c, jval v, jargs *a, jval *o) { *o = jstr_case(c, sstr(c, v), CASE_CAPITALIZE); return 0; }
static int f_title(jctx *c, jval v, jargs *a, jval *o) { *o = jstr_case(c, sstr(c, v), CASE_JTITLE); return 0; }
static int f_upper(jctx *c, jval v, jargs *a, jval *o) { *o = jstr_case(c, sstr(c, v), CASE_UPPER); return 0; }
static int f_lower(jctx *c, jval v, jargs *a, jval *o) { *o = jstr_case(c, sstr(c, v), CASE_LOWER); return 0; }
static int f_center(jctx *c, jval v, jargs *a, jval *o) {
    jval s = sstr(c, v), w = arg(a, 0, "width", jv_int(80));
    if (w.t != JT_INT) return jfail(c, "center: width must be an integer");
    int64_t n = u8_len(s.s.p, s.s.n);
    if (w.i <= n) { *o = s; return 0; }
    int64_t padn = w.i - n, left = padn / 2 + (padn & w.i & 1);
    buf b;
    buf_init(&b);
    for (int64_t i = 0; i < left; i++) buf_putc(&b, ' ');
    buf_append(&b, s.s.p, s.s.n);
    for (int64_t i = 0; i < padn - left; i++) buf_putc(&b, ' ');
    *o = jv_str(c, b.data, b.len);
    buf_free(&b);
    return 0;
}
static int f_length(jctx *c, jval v, jargs *a, jval *o) {
    switch (v.t) {
    case JT_UNDEF: *o = jv_int(0); return 0;
    case JT_STR: *o = jv_int(u8_len(v.s.p, v.s.n)); return 0;
    case JT_LIST: *o = jv_int(v.l->n); return 0;
    case JT_DICT: *o = jv_int(v.d->n); return 0;
    case JT_LOOP: *o = jv_int(v.loop->length); return 0;
    default: return jfail(c, "object of type '%s' has no len()", jv_typename(v));
    }
}
static int f_default(jctx *c, jval v, jargs *a, jval *o) {
    jval d = arg(a, 0, "default_value", jv_strz("")), boolean = arg(a, 1, "boolean", jv_bool(false));
    *o = (v.t == JT_UNDEF || (jv_truthy(boolean) && !jv_truthy(v))) ? d : v;
    return 0;
}
static int f_dictsort(jctx *c, jval v, jargs *a, jval *o) {
    jval cs = arg(a, 0, "case_sensitive", jv_bool(false)), by = arg(a, 1, "by", jv_strz("key")),
         rev = arg(a, 2, "reverse", jv_bool(false));
    if (v.t != JT_DICT) return jfail(c, "dictsort: argument must be a mapping");
    int pos;
    if (by.t == JT_STR && by.s.n == 3 && !memcmp(by.s.p, "key", 3)) pos = 0;
    else if (by.t == JT_STR && by.s.n == 5 && !memcmp(by.s.p, "value", 5)) pos = 1;
    else return jfail(c, "You can only sort by either \"key\" or \"value\"");
    int n = v.d->n;
    jval r = jv_list(c, n, false);
    jval *keys = jalloc(c, sizeof(jval) * (n + 1));
    if (!keys) return jfail(c, "template used too much memory");
    for (int i = 0; i < n; i++) {
        jval t = jv_list(c, 2, true);
        jl_push(c, t.l, v.d->k[i]);
        jl_push(c, t.l, v.d->v[i]);
        jl_push(c, r.l, t);
        jval k = pos ? v.d->v[i] : v.d->k[i];
        keys[i] = jv_truthy(cs) ? k : lower_key(c, k);
    }
    if (jv_sort(c, r.l->v, n, true, jv_truthy(rev), keys)) return ERR_INVAL;
    *o = r;
    return 0;
}
void jv_html_escape(buf *b, jval s, bool escape) {
    if (!escape) { buf_append(b, s.s.p, s.s.n); return; }
    for (size_t i = 0; i < s.s.n; i++) {
        char ch = s.s.p[i];
        switch (ch) {
        case '&': buf_puts(b, "&amp;"); break;
        case '<': buf_puts(b, "&lt;"); break;
        case '>': buf_puts(b, "&gt;"); break;
        case '"': buf_puts(b, "&#34;"); break;
        case '\'': buf_puts(b, "&#39;"); break;
        default: buf_putc(b, ch);
        }
    }
}
static int f_escape(jctx *c, jval v, jargs *a, jval *o) {
    if (v.t == JT_STR && v.markup) { *o = v; return 0; }
    buf b;
    buf_init(&b);
    jv_html_escape(&b, sstr(c, v), true);
    *o = jv_str(c, b.data ? b.data : "", b.len);
    o->markup = 1;
    buf_free(&b);
    return 0;
}
static int f_forceescape(jctx *c, jval v, jargs *a, jval *o) {
    jval s = sstr(c, v);
    s.markup = 0;
    return f_escape(c, s, a, o);
}
static int f_first(jctx *c, jval v, jargs *a, jval *o) {
    jlist *l;
    if (iter_of(c, v, &l)) return ERR_INVAL;
    *o = l->n ? l->v[0] : jv_undef("No first item, sequence was empty.");
    return 0;
}
static int f_last(jctx *c, jval v, jargs *a, jval *o) {
    jlist *l;
    if (iter_of(c, v, &l)) return ERR_INVAL; /* reversed(Undefined) is empty: len 0 */
    *o = l->n ? l->v[l->n - 1] : jv_undef("No last item, sequence was empty.");
    return 0;
}
/* Python float(str): optional whitespace, sign, digits/underscores, inf/nan. */
static bool parse_float(jval s, double *out) {
    char tmp[128];
    jval t = jstr_strip(s, jv_none(), 3);
    if (!t.s.n || t.s.n >= sizeof tmp) return false;
    size_t k = 0;
    for (size_t i = 0; i < t.s.n; i++) {
        if (t.s.p[i] == '_') {
            if (!i || i + 1 >= t.s.n || !(t.s.p[i - 1] >= '0' && t.s.p[i - 1] <= '9') || !(t.s.p[i + 1] >= '0' && t.s.p[i + 1] <= '9')) return false;
            continue;
        }
        tmp[k++] = t.s.p[i];
    }
    tmp[k] = 0;
    if (!strncmp(tmp, "0x", 2) || !strncmp(tmp, "0X", 2) || strpbrk(tmp, "xXpP")) return false;
    char *end;
    errno = 0;
    double d = strtod(tmp, &end);
    if (*end) return false;
    const char *w = tmp + (tmp[0] == '+' || tmp[0] == '-');
    if (isinf(d) && strcasecmp(w, "inf") && strcasecmp(w, "infinity") && errno != ERANGE) return false;
    if (isnan(d) && strcasecmp(w, "nan")) return false;
    *out = d;
    return true;
}
static bool parse_int(jval s, int base, int64_t *out) {
    char tmp[128];
    jval t = jstr_strip(s, jv_none(), 3);
    if (!t.s.n || t.s.n >= sizeof tmp) return false;
    size_t k = 0;
    for (size_t i = 0; i < t.s.n; i++) {
        if (t.s.p[i] == '_') { if (!i || i + 1 >= t.s.n) return false; continue; }
        tmp[k++] = t.s.p[i];
    }
    tmp[k] = 0;
    const char *p = tmp + (tmp[0] == '+' || tmp[0] == '-');
    if (!*p) return false;
    char *end;
    errno = 0;
    long long v = strtoll(tmp, &end, base);
    if (*end || errno) return false;
    *out = v;
    return true;
}
static int f_int(jctx *c, jval v, jargs *a, jval *o) {
    jval d = arg(a, 0, "default", jv_int(0)), base = arg(a, 1, "base", jv_int(10));
    int64_t i;
    double f;
    switch (v.t) {
    case JT_INT: *o = v; return 0;
    case JT_BOOL: *o = jv_int(v.b); return 0;
    case JT_FLOAT:
        if (isnan(v.f) || isinf(v.f)) { *o = d; return 0; }
        *o = jv_int((int64_t)v.f);
        return 0;
    case JT_STR:
        if (parse_int(v, base.t == JT_INT ? (int)base.i : 10, &i)) *o = jv_int(i);
        else if (parse_float(v, &f) && !isnan(f) && !isinf(f)) *o = jv_int((int64_t)f);
        else *o = d;
        return 0;
    case JT_UNDEF: return jfail_undef(c, v);
    default: *o = d; return 0;
    }
}
static int f_float(jctx *c, jval v, jargs *a, jval *o) {
    jval d = arg(a, 0, "default", jv_float(0.0));
    double f;
    switch (v.t) {
    case JT_FLOAT: *o = v; return 0;
    case JT_INT: *o = jv_float((double)v.i); return 0;
    case JT_BOOL: *o = jv_float(v.b); return 0;
    case JT_STR: *o = parse_float(v, &f) ? jv_float(f) : d; return 0;
    case JT_UNDEF: return jfail_undef(c, v);
    default: *o = d; return 0;
    }
}
static int f_format(jctx *c, jval v, jargs *a, jval *o) {
    jargs fa = *a;
    if (a->nkw) { /* format(**kwargs): a mapping for %(name)s */
        jval d = jv_dict(c, a->nkw);
        for (int i = 0; i < a->nkw; i++) jd_set(c, d.d, jv_strz(a->kwn[i]), a->kwv[i]);
        jval *one = jalloc(c, sizeof(jval));
        if (!one) return jfail(c, "template used too much memory");
        *one = d;
        fa.npos = 1;
        fa.pos = one;
        fa.nkw = 0;
    }
    /* jinja: soft_str(value) % (kwargs or args): args is always a tuple */
    return jv_pyformat(c, sstr(c, v), &fa, a->nkw > 0, o);
}
static int f_indent(jctx *c, jval v, jargs *a, jval *o) {
    jval w = arg(a, 0, "width", jv_int(4)), first = arg(a, 1, "first", jv_bool(false)), blank = arg(a, 2, "blank", jv_bool(false));
    buf ind, b;
    buf_init(&ind);
    buf_init(&b);
    if (w.t == JT_STR) buf_append(&ind, w.s.p, w.s.n);
    else if (w.t == JT_INT) for (int64_t i = 0; i < w.i; i++) buf_putc(&ind, ' ');
    else { buf_free(&ind); return jfail(c, "indent: width must be an integer or a string"); }
    if (v.t != JT_STR) { /* jinja does `s += "\n"` on the value itself */
        buf_free(&ind);
        if (v.t == JT_UNDEF) return jfail_undef(c, v);
        if (v.t == JT_LIST && !v.l->tuple) /* list += "\n" extends it; then .splitlines() fails */
            return jfail(c, "'list' object has no attribute 'splitlines'");
        return jfail(c, "unsupported operand type(s) for +=: '%s' and 'str'", jv_typename(v));
    }
    jval s = v;
    buf tmp;
    buf_init(&tmp);
    buf_append(&tmp, s.s.p, s.s.n);
    buf_putc(&tmp, '\n');
    jval lines = jstr_splitlines(c, jv_str(c, tmp.data, tmp.len), false);
    buf_free(&tmp);
    const char *indent = ind.data ? ind.data : "";
    if (jv_truthy(first)) buf_puts(&b, indent);
    for (int i = 0; i < lines.l->n; i++) {
        jval ln = lines.l->v[i];
        if (i) {
            buf_putc(&b, '\n');
            if (jv_truthy(blank) || ln.s.n) buf_puts(&b, indent);
        }
        buf_append(&b, ln.s.p, ln.s.n);
    }
    *o = jv_str(c, b.data ? b.data : "", b.len);
    buf_free(&b);
    buf_free(&ind);
    return 0;
}
static int f_items(jctx *c, jval v, jargs *a, jval *o) {
    if (v.t == JT_UNDEF) { *o = jv_list(c, 0, false); return 0; }
    if (v.t != JT_DICT) return jfail(c, "Can only get item pairs from a mapping.");
    jval l = jv_list(c, v.d->n, false);
    for (int i = 0; i < v.d->n; i++) {
        jval t = jv_list(c, 2, true);
        jl_push(c, t.l, v.d->k[i]);
        jl_push(c, t.l, v.d->v[i]);
        jl_push(c, l.l, t);
    }
    *o = l;
    return 0;
}
static int f_join(jctx *c, jval v, jargs *a, jval *o) {
    jval d = arg(a, 0, "d", jv_strz("")), attribute = arg(a, 1, "attribute", jv_none());
    jlist *l;
    if (iter_of(c, v, &l)) return ERR_INVAL;
    d = sstr(c, d);
    buf b;
    buf_init(&b);
    for (int i = 0; i < l->n; i++) {
        jval x = l->v[i];
        if (attribute.t != JT_NONE && attr_get(c, x, attribute, jv_undef(NULL), &x)) { buf_free(&b); return ERR_INVAL; }
        if (i) buf_append(&b, d.s.p, d.s.n);
        jv_str_append(&b, x);
    }
    *o = jv_str(c, b.data ? b.data : "", b.len);
    buf_free(&b);
    return 0;
}
static int f_list(jctx *c, jval v, jargs *a, jval *o) {
    jlist *l;
    if (iter_of(c, v, &l)) return ERR_INVAL;
    jval r = jv_list(c, l->n, false);
    for (int i = 0; i < l->n; i++) jl_push(c, r.l, l->v[i]);
    *o = r;
    return 0;
}
static int f_map(jctx *c, jval v, jargs *a, jval *o) {
    jlist *l;
    if (!jv_truthy(v)) { *o = jv_list(c, 0, false); return 0; } /* jinja: `if value:` before iterating */
    if (iter_of(c, v, &l)) return ERR_INVAL;
    jval r = jv_list(c, l->n, false), attribute;
    if (jargs_get(a, -1, "attribute", &attribute)) {
        jval dflt = arg(a, -1, "default", jv_undef(NULL));
        for (int i = 0; i < l->n; i++) {
            jval x;
            if (attr_get(c, l->v[i], attribute, dflt, &x)) return ERR_INVAL;
            jl_push(c, r.l, x);
        }
        *o = r;
        return 0;
    }
    if (!a->npos || a->pos[0].t != JT_STR) return jfail(c, "map requires a filter argument");
    jfilter_fn fn = jinja_find_filter(jv_str(c, a->pos[0].s.p, a->pos[0].s.n).s.p);
    if (!fn) return jfail(c, "No filter named '%.*s'.", (int)a->pos[0].s.n, a->pos[0].s.p);
    jargs rest = *a;
    rest.npos--;
    rest.pos++;
    for (int i = 0; i < l->n; i++) {
        jval x;
        if (fn(c, l->v[i], &rest, &x)) return ERR_INVAL;
        jl_push(c, r.l, x);
    }
    *o = r;
    return 0;
}
/* select/reject/selectattr/rejectattr */
static int select_common(jctx *c, jval v, jargs *a, jval *o, bool attr, bool want) {
    jlist *l;
    if (!jv_truthy(v)) { *o = jv_list(c, 0, false); return 0; } /* jinja: `if value:` before iterating */
    if (iter_of(c, v, &l)) return ERR_INVAL;
    int off = attr ? 1 : 0;
    jval attribute = jv_none();
    if (attr && !jargs_get(a, 0, NULL, &attribute)) return jfail(c, "Missing parameter for attribute name");
    jtest_fn test = NULL;
    jargs rest = {0};
    if (a->npos > off) {
        if (a->pos[off].t != JT_STR) return jfail(c, "test name must be a string");
        test = jinja_find_test(jv_str(c, a->pos[off].s.p, a->pos[off].s.n).s.p);
        if (!test) return jfail(c, "No test named '%.*s'.", (int)a->pos[off].s.n, a->pos[off].s.p);
        rest = *a;
        rest.npos -= off + 1;
        rest.pos += off + 1;
    }
    jval r = jv_list(c, 0, false);
    for (int i = 0; i < l->n; i++) {
        jval x = l->v[i];
        if (attr && attr_get(c, x, attribute, jv_undef(NULL), &x)) return ERR_INVAL;
        bool ok;
        if (test) { if (test(c, x, &rest, &ok)) return ERR_INVAL; }
        else ok = jv_truthy(x);
        if (ok == want) jl_push(c, r.l, l->v[i]);
    }
    *o = r;
    return 0;
}
static int f_select(jctx *c, jval v, jargs *a, jval *o) { return select_common(c, v, a, o, false, true); }
static int f_reject(jctx *c, jval v, jargs *a, jval *o) { return select_common(c, v, a, o, false, false); }
static int f_selectattr(jctx *c, jval v, jargs *a, jval *o) { return select_common(c, v, a, o, true, true); }
static int f_rejectattr(jctx *c, jval v, jargs *a, jval *o) { return select_common(c, v, a, o, true, false); }

/* keys for sort/unique/min/max: attribute lookup (comma list for sort), lower() unless case_sensitive */
static int make_keys(jctx *c, jlist *l, jval attribute, bool case_sensitive, bool multi, jval **keys) {
    *keys = jalloc(c, sizeof(jval) * (l->n + 1));
    if (!*keys) return jfail(c, "template used too much memory");
    for (int i = 0; i < l->n; i++) {
        jval k = l->v[i];
        if (attribute.t == JT_STR && multi && memchr(attribute.s.p, ',', attribute.s.n)) {
            jval t = jv_list(c, 0, true);
            const char *p = attribute.s.p, *end = p + attribute.s.n;
            while (p <= end) {
                const char *comma = memchr(p, ',', (size_t)(end - p));
                if (!comma) comma = end;
                jval part, x;
                part = jv_str(c, p, (size_t)(comma - p));
                if (attr_get(c, l->v[i], part, jv_undef(NULL), &x)) return ERR_INVAL;
                jl_push(c, t.l, case_sensitive ? x : lower_key(c, x));
                p = comma + 1;
            }
            (*keys)[i] = t;
            continue;
        }
        if (attribute.t != JT_NONE && attr_get(c, k, attribute, jv_undef(NULL), &k)) return ERR_INVAL;
        (*keys)[i] = case_sensitive ? k : lower_key(c, k);
    }
    return 0;
}
static int f_sort(jctx *c, jval v, jargs *a, jval *o) {
    jval rev = arg(a, 0, "reverse", jv_bool(false)), cs = arg(a, 1, "case_sensitive", jv_bool(false)),
         attribute = arg(a, 2, "attribute", jv_none());
    jlist *l;
    jval *keys;
    if (iter_of(c, v, &l) || make_keys(c, l, attribute, jv_truthy(cs), true, &keys)) return ERR_INVAL;
    jval r = jv_list(c, l->n, false);
    for (int i = 0; i < l->n; i++) jl_push(c, r.l, l->v[i]);
    if (jv_sort(c, r.l->v, r.l->n, true, jv_truthy(rev), keys)) return ERR_INVAL;
    *o = r;
    return 0;
}
static int f_unique(jctx *c, jval v, jargs *a, jval *o) {
    jval cs = arg(a, 0, "case_sensitive", jv_bool(false)), attribute = arg(a, 1, "attribute", jv_none());
    jlist *l;
    jval *keys;
    if (iter_of(c, v, &l) || make_keys(c, l, attribute, jv_truthy(cs), false, &keys)) return ERR_INVAL;
    jval r = jv_list(c, 0, false);
    for (int i = 0; i < l->n; i++) {
        if (*jv_unhashable(keys[i])) return jfail(c, "unhashable type: '%s'", jv_unhashable(keys[i]));
        bool seen = false;
        for (int j = 0; j < i && !seen; j++) seen = jv_eq(keys[j], keys[i]);
        if (!seen) jl_push(c, r.l, l->v[i]);
    }
    *o = r;
    return 0;
}
static int minmax(jctx *c, jval v, jargs *a, jval *o, bool want_max) {
    jval cs = arg(a, 0, "case_sensitive", jv_bool(false)), attribute = arg(a, 1, "attribute", jv_none());
    jlist *l;
    jval *keys;
    if (iter_of(c, v, &l) || make_keys(c, l, attribute, jv_truthy(cs), false, &keys)) return ERR_INVAL;
    if (!l->n) { *o = jv_undef("No aggregated item, sequence was empty."); return 0; }
    int best = 0;
    for (int i = 1; i < l->n; i++) {
        int r;
        if (jv_cmp(c, keys[i], keys[best], want_max ? ">" : "<", &r)) return ERR_INVAL;
        if (r != 2 && (want_max ? r > 0 : r < 0)) best = i;
    }
    *o = l->v[best];
    return 0;
}
static int f_max(jctx *c, jval v, jargs *a, jval *o) { return minmax(c, v, a, o, true); }
static int f_min(jctx *c, jval v, jargs *a, jval *o) { return minmax(c, v, a, o, false); }
static int f_replace(jctx *c, jval v, jargs *a, jval *o) {
    jval old, nw, cnt = arg(a, 2, "count", jv_none());
    if (!jargs_get(a, 0, "old", &old) || !jargs_get(a, 1, "new", &nw)) return jfail(c, "replace: expected old and new");
    int64_t k = -1;
    if (cnt.t == JT_INT) k = cnt.i;
    else if (cnt.t != JT_NONE) return jfail(c, "replace: count must be an integer");
    *o = jstr_replace(c, sstr(c, v), sstr(c, old), sstr(c, nw), k);
    return 0;
}
static int f_reverse(jctx *c, jval v, jargs *a, jval *o) {
    jlist *l;
    if (v.t == JT_STR) {
        if (iter_of(c, v, &l)) return ERR_INVAL;
        buf b;
        buf_init(&b);
        for (int i = l->n - 1; i >= 0; i--) buf_append(&b, l->v[i].s.p, l->v[i].s.n);
        *o = jv_str(c, b.data ? b.data : "", b.len);
        buf_free(&b);
        return 0;
    }
    if (v.t != JT_LIST && v.t != JT_DICT && v.t != JT_UNDEF) return jfail(c, "argument must be iterable");
    if (iter_of(c, v, &l)) return ERR_INVAL;
    jval r = jv_list(c, l->n, false);
    for (int i = l->n - 1; i >= 0; i--) jl_push(c, r.l, l->v[i]);
    *o = r;
    return 0;
}
static int f_round(jctx *c, jval v, jargs *a, jval *o) {
    jval pr = arg(a, 0, "precision", jv_int(0)), method = arg(a, 1, "method", jv_strz("common"));
    if (pr.t != JT_INT) return jfail(c, "round: precision must be an integer");
    if (method.t != JT_STR) return jfail(c, "method must be common, ceil or floor");
    bool common = method.s.n == 6 && !memcmp(method.s.p, "common", 6);
    bool ceil_ = method.s.n == 4 && !memcmp(method.s.p, "ceil", 4);
    bool floor_ = method.s.n == 5 && !memcmp(method.s.p, "floor", 5);
    if (!common && !ceil_ && !floor_) return jfail(c, "method must be common, ceil or floor");
    if (v.t == JT_UNDEF) return jfail_undef(c, v);
    if (v.t != JT_INT && v.t != JT_FLOAT && v.t != JT_BOOL) return jfail(c, "type %s doesn't define __round__ method", jv_typename(v));
    if (common && v.t != JT_FLOAT) { *o = jv_int(v.t == JT_INT ? v.i : v.b); return 0; } /* round(int, n) is an int */
    double x = v.t == JT_FLOAT ? v.f : (double)(v.t == JT_INT ? v.i : v.b);
    if (common) {
        if (isnan(x) || isinf(x) || pr.i > 300) { *o = jv_float(x); return 0; }
        if (pr.i >= 0) {
            char tmp[512];
            snprintf(tmp, sizeof tmp, "%.*f", (int)pr.i, x); /* correctly rounded, half to even */
            *o = jv_float(strtod(tmp, NULL));
        } else {
            double p = pow(10.0, (double)-pr.i);
            double y = x / p, r = nearbyint(y);
            *o = jv_float(r * p);
        }
        return 0;
    }
    double p = pow(10.0, (double)pr.i);
    *o = jv_float((ceil_ ? ceil(x * p) : floor(x * p)) / p);
    return 0;
}
static int f_safe(jctx *c, jval v, jargs *a, jval *o) { *o = sstr(c, v); o->markup = 1; return 0; }
static int f_string(jctx *c, jval v, jargs *a, jval *o) { *o = sstr(c, v); return 0; }
static int f_sum(jctx *c, jval v, jargs *a, jval *o) {
    jval attribute = arg(a, 0, "attribute", jv_none()), acc = arg(a, 1, "start", jv_int(0));
    jlist *l;
    if (iter_of(c, v, &l)) return ERR_INVAL;
    for (int i = 0; i < l->n; i++) {
        jval x = l->v[i];
        if (attribute.t != JT_NONE && attr_get(c, x, attribute, jv_undef(NULL), &x)) return ERR_INVAL;
        if (x.t == JT_UNDEF) return jfail_undef(c, x);
        bool xi = x.t == JT_INT || x.t == JT_BOOL, ai = acc.t == JT_INT || acc.t == JT_BOOL;
        if ((!xi && x.t != JT_FLOAT) || (!ai && acc.t != JT_FLOAT))
            return jfail(c, "unsupported operand type(s) for +: '%s' and '%s'", jv_typename(acc), jv_typename(x));
        if (xi && ai) acc = jv_int((acc.t == JT_INT ? acc.i : acc.b) + (x.t == JT_INT ? x.i : x.b));
        else acc = jv_float((acc.t == JT_FLOAT ? acc.f : (double)(acc.t == JT_INT ? acc.i : acc.b)) +
                            (x.t == JT_FLOAT ? x.f : (double)(x.t == JT_INT ? x.i : x.b)));
    }
    *o = acc;
    return 0;
}
/* transformers: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) */
static int f_tojson(jctx *c, jval v, jargs *a, jval *o) {
    jval ea = arg(a, 0, "ensure_ascii", jv_bool(false)), ind = arg(a, 1, "indent", jv_none()),
         seps = arg(a, 2, "separators", jv_none()), sk = arg(a, 3, "sort_keys", jv_bool(false));
    buf ib, b;
    buf_init(&ib);
    buf_init(&b);
    const char *indent = NULL, *isep = NULL, *ksep = NULL;
    if (ind.t == JT_INT || ind.t == JT_BOOL) {
        int64_t n = ind.t == JT_INT ? ind.i : ind.b;
        for (int64_t i = 0; i < n; i++) buf_putc(&ib, ' ');
        indent = ib.data ? ib.data : "";
    } else if (ind.t == JT_STR) {
        indent = jv_str(c, ind.s.p, ind.s.n).s.p;
    } else if (ind.t != JT_NONE) {
        buf_free(&ib);
        return jfail(c, "tojson: indent must be an integer, a string or None");
    }
    if (seps.t == JT_LIST) {
        if (seps.l->n != 2 || seps.l->v[0].t != JT_STR || seps.l->v[1].t != JT_STR) {
            buf_free(&ib);
            return jfail(c, "tojson: separators must be a pair of strings");
        }
        isep = jv_str(c, seps.l->v[0].s.p, seps.l->v[0].s.n).s.p;
        ksep = jv_str(c, seps.l->v[1].s.p, seps.l->v[1].s.n).s.p;
    } else if (seps.t != JT_NONE) {
        buf_free(&ib);
        return jfail(c, "tojson: separators must be a pair of strings");
    }
    int rc = jv_tojson(c, &b, v, jv_truthy(ea), indent, isep, ksep, jv_truthy(sk));
    buf_free(&ib);
    if (rc) { buf_free(&b); return rc; }
    *o = jv_str(c, b.data ? b.data : "", b.len);
    buf_free(&b);
    return 0;
}
static int f_trim(jctx *c, jval v, jargs *a, jval *o) {
    jval chars = arg(a, 0, "chars", jv_none());
    if (chars.t != JT_NONE && chars.t != JT_STR) return jfail(c, "strip arg must be None or str");
    *o = jstr_strip(sstr(c, v), chars, 3);
    return 0;
}
/* truncate(s, length=255, killwords=False, end='...', leeway=5) */
static int f_truncate(jctx *c, jval v, jargs *a, jval *o) {
    jval len = arg(a, 0, "length", jv_int(255)), kill = arg(a, 1, "killwords", jv_bool(false)),
         end = arg(a, 2, "end", jv_strz("...")), lee = arg(a, 3, "leeway", jv_int(5));
    if (len.t != JT_INT || lee.t != JT_INT || end.t != JT_STR) return jfail(c, "truncate: bad arguments");
    jval s = sstr(c, v);
    int64_t n = u8_len(s.s.p, s.s.n), en = u8_len(end.s.p, end.s.n);
    if (len.i < en) return jfail(c, "expected length >= %lld, got %lld", (long long)en, (long long)len.i);
    if (lee.i < 0) return jfail(c, "expected leeway >= 0, got %lld", (long long)lee.i);
    if (n <= len.i + lee.i) { *o = s; return 0; }
    size_t cut = u8_offset(s.s.p, s.s.n, len.i - en);
    if (!jv_truthy(kill)) { /* s[:length - len(end)].rsplit(" ", 1)[0] */
        const char *sp = NULL;
        for (size_t i = cut; i-- > 0;)
            if (s.s.p[i] == ' ') { sp = s.s.p + i; break; }
        if (sp) cut = (size_t)(sp - s.s.p);
    }
    buf b;
    buf_init(&b);
    buf_append(&b, s.s.p, cut);
    buf_append(&b, end.s.p, end.s.n);
    *o = jv_str(c, b.data, b.len);
    buf_free(&b);
    return 0;
}
static bool is_word_cp(int32_t cp) {
    if (cp == '_') return true;
    utf8proc_category_t k = utf8proc_category(cp);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || k == UTF8PROC_CATEGORY_ND ||
           k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
}
static int f_wordcount(jctx *c, jval v, jargs *a, jval *o) {
    jval s = sstr(c, v);
    int64_t n = 0;
    bool in = false;
    size_t i = 0;
    while (i < s.s.n) {
        bool w = is_word_cp(u8_next(s.s.p, s.s.n, &i));
        if (w && !in) n++;
        in = w;
    }
    *o = jv_int(n);
    return 0;
}

typedef struct fdef { const char *name; jfilter_fn fn; } fdef;
static const fdef FILTERS[] = {
    {"abs", f_abs}, {"attr", f_attr}, {"batch", f_batch}, {"capitalize", f_capitalize}, {"center", f_center},
    {"count", f_length}, {"d", f_default}, {"default", f_default}, {"dictsort", f_dictsort}, {"e", f_escape},
    {"escape", f_escape}, {"first", f_first}, {"float", f_float}, {"forceescape", f_forceescape},
    {"format", f_format}, {"indent", f_indent}, {"int", f_int}, {"items", f_items}, {"join", f_join},
    {"last", f_last}, {"length", f_length}, {"list", f_list}, {"lower", f_lower}, {"map", f_map},
    {"max", f_max}, {"min", f_min}, {"reject", f_reject}, {"rejectattr", f_rejectattr}, {"replace", f_replace},
    {"reverse", f_reverse}, {"round", f_round}, {"safe", f_safe}, {"select", f_select},
    {"selectattr", f_selectattr}, {"sort", f_sort}, {"string", f_string}, {"sum", f_sum}, {"title", f_title},
    {"tojson", f_tojson}, {"trim", f_trim}, {"truncate", f_truncate}, {"unique", f_unique}, {"upper", f_upper},
    {"wordcount", f_wordcount}, {NULL, NULL}};

jfilter_fn jinja_find_filter(const char *name) {
    for (int i = 0; FILTERS[i].name; i++)
        if (!strcmp(FILTERS[i].name, name)) return FILTERS[i].fn;
    return NULL;
}
