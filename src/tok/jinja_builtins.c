/* jinja_builtins.c: filters, tests, Python str/dict/list methods and global functions.
 *
 * Each follows jinja2 3.1's implementation (filters.py, tests.py, defaults.py) and
 * the Python builtin it wraps, under transformers' ImmutableSandboxedEnvironment:
 * mutating methods (list.append, dict.update ...) are unsafe there and come back as
 * an undefined that raises "access to attribute 'append' of 'list' object is unsafe."
 * when called; range() is capped at 100000 items; tojson is transformers' json.dumps.
 *
 * Known gaps (documented, not silent): str.upper/lower use Unicode simple case
 * mappings plus the common special cases (ß, ligatures, final sigma); format specs
 * cover fill/align/sign/zero/width/,/precision with types s d f e g %.
 */
#include "tok/jinja_int.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

/* ==== argument helpers ============================================================= */
int jargs_get(jargs *a, int pos, const char *kw, jval *out) {
    if (pos >= 0 && pos < a->npos) { *out = a->pos[pos]; return 1; }
    for (int i = 0; i < a->nkw; i++)
        if (kw && !strcmp(a->kwn[i], kw)) { *out = a->kwv[i]; return 1; }
    return 0;
}
static jval arg_or(jargs *a, int pos, const char *kw, jval dflt) {
    jval v;
    return jargs_get(a, pos, kw, &v) ? v : dflt;
}
static int need_str(jctx *c, jval v, const char *what) {
    if (v.t == JT_STR) return 0;
    if (v.t == JT_UNDEF) return jfail_undef(c, v);
    return jfail(c, "%s must be str, not %s", what, jv_typename(v));
}
static int need_int(jctx *c, jval v, const char *what, int64_t *out) {
    if (v.t == JT_INT) { *out = v.i; return 0; }
    if (v.t == JT_BOOL) { *out = v.b; return 0; }
    if (v.t == JT_UNDEF) return jfail_undef(c, v);
    return jfail(c, "%s: '%s' object cannot be interpreted as an integer", what, jv_typename(v));
}
static jval mkstr(jctx *c, buf *b) {
    jval r = jv_str(c, b->data ? b->data : "", b->len);
    buf_free(b);
    return r;
}

/* ==== case mapping (Python str semantics, see header) ================================= */
static bool is_cased(int32_t cp) {
    utf8proc_category_t k = utf8proc_category(cp);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT;
}
static void put_upper(buf *b, int32_t cp) {
    switch (cp) {
    case 0xDF: buf_puts(b, "SS"); return;
    case 0xFB00: buf_puts(b, "FF"); return;
    case 0xFB01: buf_puts(b, "FI"); return;
    case 0xFB02: buf_puts(b, "FL"); return;
    case 0xFB03: buf_puts(b, "FFI"); return;
    case 0xFB04: buf_puts(b, "FFL"); return;
    case 0xFB05: case 0xFB06: buf_puts(b, "ST"); return;
    case 0x149: u8_put(b, 0x2BC); buf_putc(b, 'N'); return;
    default: u8_put(b, utf8proc_toupper(cp));
    }
}
static void put_title(buf *b, int32_t cp) {
    switch (cp) {
    case 0xDF: buf_puts(b, "Ss"); return;
    case 0xFB01: buf_puts(b, "Fi"); return;
    case 0xFB02: buf_puts(b, "Fl"); return;
    default: u8_put(b, utf8proc_totitle(cp));
    }
}
/* lower() of s[i] with Greek final sigma: Σ after a cased letter and not before one. */
static void put_lower_at(buf *b, const char *s, size_t n, size_t st, size_t en, int32_t cp, int32_t prev) {
    if (cp == 0x130) { buf_puts(b, "i"); u8_put(b, 0x307); return; }
    if (cp == 0x3A3) {
        size_t j = en;
        int32_t next = j < n ? u8_next(s, n, &j) : 0;
        if (prev && is_cased(prev) && !(next && is_cased(next))) { u8_put(b, 0x3C2); return; }
    }
    (void)st;
    u8_put(b, utf8proc_tolower(cp));
}
jval jstr_case(jctx *c, jval v, int mode) {
    buf b;
    buf_init(&b);
    const char *s = v.s.p;
    size_t n = v.s.n, i = 0;
    int32_t prev = 0;
    bool prev_cased = false, first = true, word_start = true;
    while (i < n) {
        size_t st = i;
        int32_t cp = u8_next(s, n, &i);
        switch (mode) {
        case CASE_UPPER: put_upper(&b, cp); break;
        case CASE_LOWER: put_lower_at(&b, s, n, st, i, cp, prev); break;
        case CASE_TITLE:
            if (prev_cased) put_lower_at(&b, s, n, st, i, cp, prev);
            else put_title(&b, cp);
            prev_cased = is_cased(cp);
            break;
        case CASE_CAPITALIZE:
            if (first) put_title(&b, cp);
            else put_lower_at(&b, s, n, st, i, cp, prev);
            break;
        case CASE_SWAP: {
            utf8proc_category_t k = utf8proc_category(cp);
            if (k == UTF8PROC_CATEGORY_LU) put_lower_at(&b, s, n, st, i, cp, prev);
            else if (k == UTF8PROC_CATEGORY_LL) put_upper(&b, cp);
            else u8_put(&b, cp);
            break;
        }
        case CASE_JTITLE: { /* jinja's title: words split on [-\s({\[<]+, w[0].upper() + w[1:].lower() */
            bool sep = py_isspace(cp) || cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<';
            if (sep) { u8_put(&b, cp); word_start = true; }
            else if (word_start) { put_upper(&b, cp); word_start = false; }
            else put_lower_at(&b, s, n, st, i, cp, prev);
            break;
        }
        }
        prev = cp;
        first = false;
    }
    jval r = mkstr(c, &b);
    r.markup = v.markup;
    return r;
}

/* ==== string helpers ========================================================================= */
static bool in_chars(int32_t cp, jval chars) {
    if (chars.t != JT_STR) return py_isspace(cp);
    size_t i = 0;
    while (i < chars.s.n)
        if (u8_next(chars.s.p, chars.s.n, &i) == cp) return true;
    return false;
}
/* which: 1 left, 2 right, 3 both */
jval jstr_strip(jval s, jval chars, int which) {
    const char *p = s.s.p;
    size_t a = 0, b = s.s.n;
    if (which & 1)
        while (a < b) {
            size_t j = a;
            if (!in_chars(u8_next(p, b, &j), chars)) break;
            a = j;
        }
    if (which & 2)
        while (b > a) {
            size_t st = b - 1;
            while (st > a && ((unsigned char)p[st] & 0xC0) == 0x80) st--;
            size_t j = st;
            if (!in_chars(u8_next(p, b, &j), chars)) break;
            b = st;
        }
    return jv_strn_nocopy(p + a, b - a);
}

static const char *find_sub(const char *h, size_t hn, const char *nd, size_t nn) {
    if (!nn) return h;
    return memmem(h, hn, nd, nn);
}
static const char *rfind_sub(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn > hn) return NULL;
    for (size_t i = hn - nn + 1; i-- > 0;)
        if (!memcmp(h + i, nd, nn)) return h + i;
    return NULL;
}

jval jstr_replace(jctx *c, jval s, jval old, jval new_, int64_t count) {
    buf b;
    buf_init(&b);
    if (!old.s.n) { /* Python inserts `new` around every code point */
        size_t i = 0;
        int64_t k = 0;
        while (true) {
            if (count < 0 || k < count) { buf_append(&b, new_.s.p, new_.s.n); k++; }
            if (i >= s.s.n) break;
            size_t st = i;
            u8_next(s.s.p, s.s.n, &i);
            buf_append(&b, s.s.p + st, i - st);
        }
        return mkstr(c, &b);
    }
    const char *p = s.s.p, *end = s.s.p + s.s.n;
    int64_t k = 0;
    while (p < end && (count < 0 || k < count)) {
        const char *q = find_sub(p, (size_t)(end - p), old.s.p, old.s.n);
        if (!q) break;
        buf_append(&b, p, (size_t)(q - p));
        buf_append(&b, new_.s.p, new_.s.n);
        p = q + old.s.n;
        k++;
    }
    buf_append(&b, p, (size_t)(end - p));
    return mkstr(c, &b);
}

static int str_split(jctx *c, jval s, jval sep, int64_t maxsplit, bool right, jval *out) {
    jval l = jv_list(c, 0, false);
    const char *p = s.s.p;
    size_t n = s.s.n;
    if (sep.t == JT_NONE || sep.t == JT_UNDEF) {
        /* runs of whitespace, no empty strings */
        if (!right) {
            size_t i = 0;
            int64_t k = 0;
            while (i < n) {
                size_t j = i;
                while (j < n) { size_t q = j; if (!py_isspace(u8_next(p, n, &q))) break; j = q; }
                i = j;
                if (i >= n) break;
                if (maxsplit >= 0 && k >= maxsplit) {
                    jl_push(c, l.l, jv_strn_nocopy(p + i, n - i)); /* the rest, verbatim */
                    break;
                }
                while (j < n) { size_t q = j; if (py_isspace(u8_next(p, n, &q))) break; j = q; }
                jl_push(c, l.l, jv_strn_nocopy(p + i, j - i));
                k++;
                i = j;
            }
        } else {
            /* rsplit: collect words from the right */
            jval tmp = jv_list(c, 0, false);
            size_t e = n;
            int64_t k = 0;
            while (e > 0) {
                jval head = jstr_strip(jv_strn_nocopy(p, e), jv_none(), 2);
                e = head.s.n;
                if (!e) break;
                if (maxsplit >= 0 && k >= maxsplit) { jl_push(c, tmp.l, head); break; }
                size_t st = e;
                while (st > 0) {
                    size_t b0 = st - 1;
                    while (b0 > 0 && ((unsigned char)p[b0] & 0xC0) == 0x80) b0--;
                    size_t q = b0;
                    if (py_isspace(u8_next(p, e, &q))) break;
                    st = b0;
                }
                jl_push(c, tmp.l, jv_strn_nocopy(p + st, e - st));
                k++;
                e = st;
            }
            for (int i = tmp.l->n - 1; i >= 0; i--) jl_push(c, l.l, tmp.l->v[i]);
        }
        *out = l;
        return 0;
    }
    if (need_str(c, sep, "separator")) return ERR_INVAL;
    if (!sep.s.n) return jfail(c, "empty separator");
    if (!right) {
        const char *q = p, *end = p + n;
        int64_t k = 0;
        while (maxsplit < 0 || k < maxsplit) {
            const char *m = find_sub(q, (size_t)(end - q), sep.s.p, sep.s.n);
            if (!m) break;
            jl_push(c, l.l, jv_strn_nocopy(q, (size_t)(m - q)));
            q = m + sep.s.n;
            k++;
        }
        jl_push(c, l.l, jv_strn_nocopy(q, (size_t)(end - q)));
    } else {
        jval tmp = jv_list(c, 0, false);
        size_t e = n;
        int64_t k = 0;
        while (maxsplit < 0 || k < maxsplit) {
            const char *m = rfind_sub(p, e, sep.s.p, sep.s.n);
            if (!m) break;
            size_t mo = (size_t)(m - p);
            jl_push(c, tmp.l, jv_strn_nocopy(m + sep.s.n, e - mo - sep.s.n));
            e = mo;
            k++;
        }
        jl_push(c, tmp.l, jv_strn_nocopy(p, e));
        for (int i = tmp.l->n - 1; i >= 0; i--) jl_push(c, l.l, tmp.l->v[i]);
    }
    *out = l;
    return 0;
}

static bool is_linebreak(int32_t cp) {
    return cp == '\n' || cp == '\r' || cp == 0x0B || cp == 0x0C || cp == 0x1C || cp == 0x1D || cp == 0x1E ||
           cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}
jval jstr_splitlines(jctx *c, jval s, bool keepends) {
    jval l = jv_list(c, 0, false);
    const char *p = s.s.p;
    size_t n = s.s.n, i = 0, start = 0;
    while (i < n) {
        size_t st = i;
        int32_t cp = u8_next(p, n, &i);
        if (!is_linebreak(cp)) continue;
        size_t eol = i;
        if (cp == '\r' && i < n && p[i] == '\n') eol = ++i;
        jl_push(c, l.l, jv_strn_nocopy(p + start, (keepends ? eol : st) - start));
        start = i;
    }
    if (start < n) jl_push(c, l.l, jv_strn_nocopy(p + start, n - start));
    return l;
}

/* Python str.startswith/endswith argument: str or tuple of str. */
static int affix_match(jctx *c, jval s, jval arg, bool end, const char *name, bool *res) {
    *res = false;
    if (arg.t == JT_LIST && arg.l->tuple) {
        for (int i = 0; i < arg.l->n; i++) {
            bool r;
            if (affix_match(c, s, arg.l->v[i], end, name, &r)) return ERR_INVAL;
            if (r) { *res = true; return 0; }
        }
        return 0;
    }
    if (arg.t != JT_STR) {
        if (arg.t == JT_UNDEF) return jfail_undef(c, arg);
        return jfail(c, "%s first arg must be str or a tuple of str, not %s", name, jv_typename(arg));
    }
    if (arg.s.n > s.s.n) return 0;
    *res = !memcmp(end ? s.s.p + s.s.n - arg.s.n : s.s.p, arg.s.p, arg.s.n);
    return 0;
}

/* ==== number formatting (format spec / printf-style) ====================================== */
typedef struct fspec {
    int32_t fill; char align, sign; bool zero, alt, comma; int width, prec; char type;
} fspec;

static void pad_out(buf *out, const char *s, size_t n, fspec *fs, char default_align) {
    int64_t len = u8_len(s, n);
    char align = fs->align ? fs->align : default_align;
    int64_t padn = fs->width > len ? fs->width - len : 0;
    int32_t fill = fs->fill ? fs->fill : ' ';
    int64_t left = align == '>' ? padn : align == '^' ? padn / 2 : 0, right = padn - left;
    if (align == '=') { /* padding between the sign and the digits */
        size_t k = (n && (s[0] == '-' || s[0] == '+' || s[0] == ' ')) ? 1 : 0;
        buf_append(out, s, k);
        for (int64_t i = 0; i < padn; i++) u8_put(out, fill);
        buf_append(out, s + k, n - k);
        return;
    }
    for (int64_t i = 0; i < left; i++) u8_put(out, fill);
    buf_append(out, s, n);
    for (int64_t i = 0; i < right; i++) u8_put(out, fill);
}

static void group_thousands(buf *b, const char *digits) {
    const char *dot = strpbrk(digits, ".eE");
    size_t intlen = dot ? (size_t)(dot - digits) : strlen(digits);
    const char *p = digits;
    if (*p == '-' || *p == '+' || *p == ' ') { buf_putc(b, *p++); intlen--; }
    for (size_t i = 0; i < intlen; i++) {
        if (i && (intlen - i) % 3 == 0) buf_putc(b, ',');
        buf_putc(b, p[i]);
    }
    buf_puts(b, p + intlen);
}

static int format_value(jctx *c, buf *out, jval v, fspec *fs) {
    char tmp[512];
    char t = fs->type;
    if (v.t == JT_UNDEF) v = jv_strz("");
    if (v.t == JT_STR || (!t && v.t != JT_INT && v.t != JT_FLOAT && v.t != JT_BOOL) || t == 's') {
        if (t && t != 's') return jfail(c, "Unknown format code '%c' for object of type 'str'", t);
        jval s = jv_tostr(c, v);
        size_t n = s.s.n;
        if (fs->prec >= 0) n = u8_offset(s.s.p, s.s.n, fs->prec);
        pad_out(out, s.s.p, n, fs, '<');
        return 0;
    }
    buf num;
    buf_init(&num);
    bool neg;
    if (v.t == JT_BOOL && !t) { pad_out(out, v.b ? "True" : "False", v.b ? 4 : 5, fs, '<'); buf_free(&num); return 0; }
    if ((t == 'd' || t == 'x' || t == 'X' || t == 'o' || t == 'b' || t == 'c' || (!t && v.t != JT_FLOAT))) {
        if (v.t == JT_FLOAT) { buf_free(&num); return jfail(c, "Unknown format code '%c' for object of type 'float'", t); }
        int64_t x = v.t == JT_INT ? v.i : v.b;
        neg = x < 0;
        unsigned long long ux = neg ? 0ULL - (unsigned long long)x : (unsigned long long)x;
        if (t == 'x') snprintf(tmp, sizeof tmp, "%llx", ux);
        else if (t == 'X') snprintf(tmp, sizeof tmp, "%llX", ux);
        else if (t == 'o') snprintf(tmp, sizeof tmp, "%llo", ux);
        else if (t == 'b') { int k = 0; char r[70]; do { r[k++] = '0' + (ux & 1); ux >>= 1; } while (ux); for (int i = 0; i < k; i++) tmp[i] = r[k - 1 - i]; tmp[k] = 0; }
        else if (t == 'c') { buf_free(&num); buf b; buf_init(&b); u8_put(&b, (int32_t)x); pad_out(out, b.data, b.len, fs, '<'); buf_free(&b); return 0; }
        else snprintf(tmp, sizeof tmp, "%llu", ux);
    } else {
        double x = v.t == JT_FLOAT ? v.f : v.t == JT_INT ? (double)v.i : (double)v.b;
        neg = signbit(x) && !isnan(x);
        double ax = fabs(x);
        int prec = fs->prec >= 0 ? fs->prec : 6;
        if (isinf(ax) || isnan(ax)) snprintf(tmp, sizeof tmp, "%s", isnan(ax) ? "nan" : "inf");
        else if (t == 'f' || t == 'F') snprintf(tmp, sizeof tmp, "%.*f", prec, ax);
        else if (t == 'e' || t == 'E') snprintf(tmp, sizeof tmp, t == 'e' ? "%.*e" : "%.*E", prec, ax);
        else if (t == '%') snprintf(tmp, sizeof tmp, "%.*f%%", prec, ax * 100);
        else if (t == 'g' || t == 'G') snprintf(tmp, sizeof tmp, t == 'g' ? "%.*g" : "%.*G", prec ? prec : 1, ax);
        else if (!t && fs->prec < 0) { buf b; buf_init(&b); py_float_repr(&b, ax); snprintf(tmp, sizeof tmp, "%s", b.data); buf_free(&b); }
        else if (!t) snprintf(tmp, sizeof tmp, "%.*g", prec ? prec : 1, ax);
        else { buf_free(&num); return jfail(c, "Unknown format code '%c' for object of type '%s'", t, jv_typename(v)); }
    }
    if (neg) buf_putc(&num, '-');
    else if (fs->sign == '+') buf_putc(&num, '+');
    else if (fs->sign == ' ') buf_putc(&num, ' ');
    if (fs->alt && (t == 'x' || t == 'X' || t == 'o' || t == 'b')) { buf_putc(&num, '0'); buf_putc(&num, t); }
    if (fs->comma) group_thousands(&num, tmp);
    else buf_puts(&num, tmp);
    if (fs->zero && !fs->align) { fs->align = '='; fs->fill = '0'; }
    pad_out(out, num.data, num.len, fs, '>');
    buf_free(&num);
    return 0;
}

static int parse_spec(jctx *c, const char *s, size_t n, fspec *fs) {
    memset(fs, 0, sizeof *fs);
    fs->prec = -1;
    size_t i = 0;
    if (n >= 2 && strchr("<>^=", s[1]) && ((unsigned char)s[0] < 0x80)) { fs->fill = s[0]; fs->align = s[1]; i = 2; }
    else if (n >= 1 && strchr("<>^=", s[0])) { fs->align = s[0]; i = 1; }
    if (i < n && strchr("+- ", s[i])) fs->sign = s[i++];
    if (i < n && s[i] == '#') { fs->alt = true; i++; }
    if (i < n && s[i] == '0') { fs->zero = true; i++; }
    while (i < n && isdigit((unsigned char)s[i])) fs->width = fs->width * 10 + (s[i++] - '0');
    if (i < n && (s[i] == ',' || s[i] == '_')) { fs->comma = true; i++; }
    if (i < n && s[i] == '.') {
        i++;
        fs->prec = 0;
        while (i < n && isdigit((unsigned char)s[i])) fs->prec = fs->prec * 10 + (s[i++] - '0');
    }
    if (i < n) fs->type = s[i++];
    if (i != n) return jfail(c, "Invalid format specifier '%.*s'", (int)n, s);
    return 0;
}

/* "{} {0} {name!r:>10}".format(*args, **kwargs) */
static int str_format(jctx *c, jval fmt, jargs *a, jval *out) {
    buf b;
    buf_init(&b);
    const char *p = fmt.s.p, *end = p + fmt.s.n;
    int auto_idx = 0;
    while (p < end) {
        if (*p == '{' && p + 1 < end && p[1] == '{') { buf_putc(&b, '{'); p += 2; continue; }
        if (*p == '}' && p + 1 < end && p[1] == '}') { buf_putc(&b, '}'); p += 2; continue; }
        if (*p == '}') { buf_free(&b); return jfail(c, "Single '}' encountered in format string"); }
        if (*p != '{') { buf_putc(&b, *p++); continue; }
        const char *q = memchr(p, '}', (size_t)(end - p));
        if (!q) { buf_free(&b); return jfail(c, "Single '{' encountered in format string"); }
        const char *f = p + 1, *fe = q;
        const char *conv = NULL, *spec = NULL;
        for (const char *k = f; k < fe; k++) {
            if (*k == '!' && !conv && !spec) conv = k;
            else if (*k == ':' && !spec) { spec = k; break; }
        }
        const char *name_end = conv ? conv : spec ? spec : fe;
        jval v;
        if (name_end == f) {
            if (auto_idx >= a->npos) { buf_free(&b); return jfail(c, "Replacement index %d out of range for positional args tuple", auto_idx); }
            v = a->pos[auto_idx++];
        } else if (isdigit((unsigned char)*f)) {
            int idx = atoi(f);
            if (idx >= a->npos) { buf_free(&b); return jfail(c, "Replacement index %d out of range for positional args tuple", idx); }
            v = a->pos[idx];
        } else {
            char nm[128];
            snprintf(nm, sizeof nm, "%.*s", (int)(name_end - f), f);
            if (!jargs_get(a, -1, nm, &v)) { buf_free(&b); return jfail(c, "'%s'", nm); }
        }
        if (conv && conv + 1 < fe && conv[1] == 'r') {
            buf r;
            buf_init(&r);
            jv_repr_append(&r, v);
            v = mkstr(c, &r);
        } else if (conv) {
            v = jv_tostr(c, v);
        }
        fspec fs;
        if (parse_spec(c, spec ? spec + 1 : fe, spec ? (size_t)(fe - spec - 1) : 0, &fs) || format_value(c, &b, v, &fs)) {
            buf_free(&b);
            return ERR_INVAL;
        }
        p = q + 1;
    }
    *out = mkstr(c, &b);
    return 0;
}

/* printf-style: fmt % args (args in a->pos; a single dict allows %(name)s). */
int jv_pyformat(jctx *c, jval fmt, jargs *a, bool maplike, jval *out) {
    buf b;
    buf_init(&b);
    const char *p = fmt.s.p, *end = p + fmt.s.n;
    int idx = 0;
    while (p < end) {
        if (*p != '%') { buf_putc(&b, *p++); continue; }
        p++;
        if (p < end && *p == '%') { buf_putc(&b, '%'); p++; continue; }
        jval v;
        bool have = false;
        if (p < end && *p == '(') {
            const char *q = memchr(p, ')', (size_t)(end - p));
            if (!q || a->npos != 1 || a->pos[0].t != JT_DICT) { buf_free(&b); return jfail(c, "format requires a mapping"); }
            jval key = jv_str(c, p + 1, (size_t)(q - p - 1));
            int k = jd_find(a->pos[0].d, key);
            if (k < 0) { buf_free(&b); return jfail(c, "'%s'", key.s.p); }
            v = a->pos[0].d->v[k];
            have = true;
            p = q + 1;
        }
        fspec fs;
        memset(&fs, 0, sizeof fs);
        fs.prec = -1;
        while (p < end && strchr("-+ #0", *p)) {
            if (*p == '-') fs.align = '<';
            else if (*p == '+') fs.sign = '+';
            else if (*p == ' ') { if (!fs.sign) fs.sign = ' '; }
            else if (*p == '#') fs.alt = true;
            else fs.zero = true;
            p++;
        }
        while (p < end && isdigit((unsigned char)*p)) fs.width = fs.width * 10 + (*p++ - '0');
        if (p < end && *p == '.') { p++; fs.prec = 0; while (p < end && isdigit((unsigned char)*p)) fs.prec = fs.prec * 10 + (*p++ - '0'); }
        if (p >= end) { buf_free(&b); return jfail(c, "incomplete format"); }
        char t = *p++;
        if (!have) {
            if (idx >= a->npos) { buf_free(&b); return jfail(c, "not enough arguments for format string"); }
            v = a->pos[idx++];
        }
        if (fs.align == '<') fs.zero = false;
        if (t == 's' || t == 'r' || t == 'a') {
            buf s;
            buf_init(&s);
            if (t == 's') jv_str_append(&s, v); else jv_repr_append(&s, v);
            jval sv = mkstr(c, &s);
            fs.type = 0;
            fs.zero = false;
            if (!fs.align) fs.align = '>';
            if (format_value(c, &b, sv, &fs)) { buf_free(&b); return ERR_INVAL; }
            continue;
        }
        if (t == 'i' || t == 'u') t = 'd';
        if (!strchr("dxXofFeEgGc", t)) { buf_free(&b); return jfail(c, "unsupported format character '%c'", t); }
        if (v.t != JT_INT && v.t != JT_FLOAT && v.t != JT_BOOL) {
            buf_free(&b);
            return jfail(c, "%%%c format: a real number is required, not %s", t, jv_typename(v));
        }
        if (t == 'd' && v.t == JT_FLOAT) v = jv_int((int64_t)v.f);
        if (strchr("fFeEgG", t) && v.t != JT_FLOAT) v = jv_float(v.t == JT_INT ? (double)v.i : (double)v.b);
        fs.type = t;
        if (!fs.align) fs.align = fs.zero ? 0 : '>';
        if (format_value(c, &b, v, &fs)) { buf_free(&b); return ERR_INVAL; }
    }
    if (idx < a->npos && !maplike) {
        buf_free(&b);
        return jfail(c, "not all arguments converted during string formatting");
    }
    *out = mkstr(c, &b);
    return 0;
}

/* ==== methods =============================================================================== */
static int m_upper(jctx *c, jval self, jargs *a, jval *o) { *o = jstr_case(c, self, CASE_UPPER); return 0; }
static int m_lower(jctx *c, jval self, jargs *a, jval *o) { *o = jstr_case(c, self, CASE_LOWER); return 0; }
static int m_title(jctx *c, jval self, jargs *a, jval *o) { *o = jstr_case(c, self, CASE_TITLE); return 0; }
static int m_capitalize(jctx *c, jval self, jargs *a, jval *o) { *o = jstr_case(c, self, CASE_CAPITALIZE); return 0; }
static int m_swapcase(jctx *c, jval self, jargs *a, jval *o) { *o = jstr_case(c, self, CASE_SWAP); return 0; }
static int strip_common(jctx *c, jval self, jargs *a, jval *o, int which) {
    jval ch = arg_or(a, 0, NULL, jv_none());
    if (ch.t != JT_NONE && need_str(c, ch, "strip arg")) return ERR_INVAL;
    *o = jstr_strip(self, ch, which);
    return 0;
}
static int m_strip(jctx *c, jval self, jargs *a, jval *o) { return strip_common(c, self, a, o, 3); }
static int m_lstrip(jctx *c, jval self, jargs *a, jval *o) { return strip_common(c, self, a, o, 1); }
static int m_rstrip(jctx *c, jval self, jargs *a, jval *o) { return strip_common(c, self, a, o, 2); }
static int affix_common(jctx *c, jval self, jargs *a, jval *o, bool end, const char *name) {
    jval arg, st = arg_or(a, 1, NULL, jv_none()), en = arg_or(a, 2, NULL, jv_none());
    if (!jargs_get(a, 0, NULL, &arg)) return jfail(c, "%s() takes at least 1 argument (0 given)", name);
    jval s = self;
    if (st.t != JT_NONE || en.t != JT_NONE) {
        int64_t n = u8_len(s.s.p, s.s.n), b0 = 0, e0 = n;
        if (st.t != JT_NONE && need_int(c, st, name, &b0)) return ERR_INVAL;
        if (en.t != JT_NONE && need_int(c, en, name, &e0)) return ERR_INVAL;
        if (b0 < 0) b0 = b0 + n < 0 ? 0 : b0 + n;
        if (e0 < 0) e0 = e0 + n < 0 ? 0 : e0 + n;
        if (b0 > n) b0 = n;
        if (e0 > n) e0 = n;
        if (e0 < b0) { *o = jv_bool(false); return 0; }
        size_t x = u8_offset(s.s.p, s.s.n, b0), y = u8_offset(s.s.p, s.s.n, e0);
        s = jv_strn_nocopy(s.s.p + x, y - x);
    }
    bool r;
    if (affix_match(c, s, arg, end, name, &r)) return ERR_INVAL;
    *o = jv_bool(r);
    return 0;
}
static int m_startswith(jctx *c, jval self, jargs *a, jval *o) { return affix_common(c, self, a, o, false, "startswith"); }
static int m_endswith(jctx *c, jval self, jargs *a, jval *o) { return affix_common(c, self, a, o, true, "endswith"); }
static int split_common(jctx *c, jval self, jargs *a, jval *o, bool right) {
    jval sep = arg_or(a, 0, "sep", jv_none()), mx = arg_or(a, 1, "maxsplit", jv_int(-1));
    int64_t m = 0;
    if (need_int(c, mx, "maxsplit", &m)) return ERR_INVAL;
    return str_split(c, self, sep, m, right, o);
}
static int m_split(jctx *c, jval self, jargs *a, jval *o) { return split_common(c, self, a, o, false); }
static int m_rsplit(jctx *c, jval self, jargs *a, jval *o) { return split_common(c, self, a, o, true); }
static int m_splitlines(jctx *c, jval self, jargs *a, jval *o) {
    *o = jstr_splitlines(c, self, jv_truthy(arg_or(a, 0, "keepends", jv_bool(false))));
    return 0;
}
static int m_replace(jctx *c, jval self, jargs *a, jval *o) {
    jval old, nw;
    int64_t cnt = -1;
    if (!jargs_get(a, 0, NULL, &old) || !jargs_get(a, 1, NULL, &nw)) return jfail(c, "replace expected at least 2 arguments");
    if (need_str(c, old, "replace() argument 1") || need_str(c, nw, "replace() argument 2")) return ERR_INVAL;
    jval cv = arg_or(a, 2, "count", jv_int(-1));
    if (need_int(c, cv, "replace", &cnt)) return ERR_INVAL;
    *o = jstr_replace(c, self, old, nw, cnt);
    return 0;
}
static int find_common(jctx *c, jval self, jargs *a, jval *o, bool rev, bool raise, bool count) {
    jval sub;
    if (!jargs_get(a, 0, NULL, &sub)) return jfail(c, "expected at least 1 argument");
    if (need_str(c, sub, "substring")) return ERR_INVAL;
    int64_t n = u8_len(self.s.p, self.s.n), b0 = 0, e0 = n;
    jval st = arg_or(a, 1, NULL, jv_none()), en = arg_or(a, 2, NULL, jv_none());
    if (st.t != JT_NONE && need_int(c, st, "start", &b0)) return ERR_INVAL;
    if (en.t != JT_NONE && need_int(c, en, "end", &e0)) return ERR_INVAL;
    if (b0 < 0) b0 = b0 + n < 0 ? 0 : b0 + n;
    if (e0 < 0) e0 = e0 + n < 0 ? 0 : e0 + n;
    if (e0 > n) e0 = n;
    if (b0 > e0) { *o = jv_int(count ? 0 : -1); if (raise) return jfail(c, "substring not found"); return 0; }
    size_t x = u8_offset(self.s.p, self.s.n, b0), y = u8_offset(self.s.p, self.s.n, e0);
    const char *h = self.s.p + x;
    size_t hn = y - x;
    if (count) {
        int64_t k = 0;
        if (!sub.s.n) k = u8_len(h, hn) + 1;
        else for (const char *q = h; (q = find_sub(q, (size_t)(h + hn - q), sub.s.p, sub.s.n)); q += sub.s.n) k++;
        *o = jv_int(k);
        return 0;
    }
    const char *m = rev ? rfind_sub(h, hn, sub.s.p, sub.s.n) : find_sub(h, hn, sub.s.p, sub.s.n);
    if (!m) {
        if (raise) return jfail(c, "substring not found");
        *o = jv_int(-1);
        return 0;
    }
    *o = jv_int(b0 + u8_len(h, (size_t)(m - h)));
    return 0;
}
static int m_find(jctx *c, jval self, jargs *a, jval *o) { return find_common(c, self, a, o, false, false, false); }
static int m_rfind(jctx *c, jval self, jargs *a, jval *o) { return find_common(c, self, a, o, true, false, false); }
static int m_index(jctx *c, jval self, jargs *a, jval *o) { return find_common(c, self, a, o, false, true, false); }
static int m_rindex(jctx *c, jval self, jargs *a, jval *o) { return find_common(c, self, a, o, true, true, false); }
static int m_count(jctx *c, jval self, jargs *a, jval *o) { return find_common(c, self, a, o, false, false, true); }
static int m_format(jctx *c, jval self, jargs *a, jval *o) { return str_format(c, self, a, o); }
static int m_join(jctx *c, jval self, jargs *a, jval *o) {
    jval it;
    jlist *l;
    if (!jargs_get(a, 0, NULL, &it)) return jfail(c, "join() takes exactly one argument (0 given)");
    if (jinja_iterate(c, it, &l)) return ERR_INVAL;
    buf b;
    buf_init(&b);
    for (int i = 0; i < l->n; i++) {
        if (l->v[i].t != JT_STR) {
            buf_free(&b);
            return jfail(c, "sequence item %d: expected str instance, %s found", i, jv_typename(l->v[i]));
        }
        if (i) buf_append(&b, self.s.p, self.s.n);
        buf_append(&b, l->v[i].s.p, l->v[i].s.n);
    }
    *o = mkstr(c, &b);
    return 0;
}
static int pad_common(jctx *c, jval self, jargs *a, jval *o, char align) {
    jval w, fc = arg_or(a, 1, NULL, jv_strz(" "));
    int64_t width = 0;
    if (!jargs_get(a, 0, NULL, &w) || need_int(c, w, "width", &width)) return jfail(c, "expected a width");
    if (need_str(c, fc, "fillchar") || u8_len(fc.s.p, fc.s.n) != 1)
        return jfail(c, "The fill character must be exactly one character long");
    int64_t n = u8_len(self.s.p, self.s.n);
    if (width <= n) { *o = self; return 0; }
    buf b;
    buf_init(&b);
    int64_t padn = width - n, left = align == '>' ? padn : align == '^' ? padn / 2 + (padn & width & 1) : 0;
    for (int64_t i = 0; i < left; i++) buf_append(&b, fc.s.p, fc.s.n);
    buf_append(&b, self.s.p, self.s.n);
    for (int64_t i = 0; i < padn - left; i++) buf_append(&b, fc.s.p, fc.s.n);
    *o = mkstr(c, &b);
    return 0;
}
static int m_center(jctx *c, jval self, jargs *a, jval *o) { return pad_common(c, self, a, o, '^'); }
static int m_ljust(jctx *c, jval self, jargs *a, jval *o) { return pad_common(c, self, a, o, '<'); }
static int m_rjust(jctx *c, jval self, jargs *a, jval *o) { return pad_common(c, self, a, o, '>'); }
static int m_zfill(jctx *c, jval self, jargs *a, jval *o) {
    jval w;
    int64_t width = 0;
    if (!jargs_get(a, 0, NULL, &w) || need_int(c, w, "width", &width)) return jfail(c, "zfill() expects a width");
    int64_t n = u8_len(self.s.p, self.s.n);
    if (width <= n) { *o = self; return 0; }
    buf b;
    buf_init(&b);
    size_t k = 0;
    if (self.s.n && (self.s.p[0] == '-' || self.s.p[0] == '+')) { buf_putc(&b, self.s.p[0]); k = 1; }
    for (int64_t i = 0; i < width - n; i++) buf_putc(&b, '0');
    buf_append(&b, self.s.p + k, self.s.n - k);
    *o = mkstr(c, &b);
    return 0;
}
static int partition_common(jctx *c, jval self, jargs *a, jval *o, bool rev) {
    jval sep;
    if (!jargs_get(a, 0, NULL, &sep) || need_str(c, sep, "separator")) return ERR_INVAL;
    if (!sep.s.n) return jfail(c, "empty separator");
    const char *m = rev ? rfind_sub(self.s.p, self.s.n, sep.s.p, sep.s.n) : find_sub(self.s.p, self.s.n, sep.s.p, sep.s.n);
    jval t = jv_list(c, 3, true);
    if (!m) {
        jval e = jv_strz("");
        jl_push(c, t.l, rev ? e : self);
        jl_push(c, t.l, e);
        jl_push(c, t.l, rev ? self : e);
    } else {
        size_t off = (size_t)(m - self.s.p);
        jl_push(c, t.l, jv_strn_nocopy(self.s.p, off));
        jl_push(c, t.l, sep);
        jl_push(c, t.l, jv_strn_nocopy(m + sep.s.n, self.s.n - off - sep.s.n));
    }
    *o = t;
    return 0;
}
static int m_partition(jctx *c, jval self, jargs *a, jval *o) { return partition_common(c, self, a, o, false); }
static int m_rpartition(jctx *c, jval self, jargs *a, jval *o) { return partition_common(c, self, a, o, true); }
static int m_removeprefix(jctx *c, jval self, jargs *a, jval *o) {
    jval p;
    if (!jargs_get(a, 0, NULL, &p) || need_str(c, p, "prefix")) return ERR_INVAL;
    *o = (p.s.n <= self.s.n && !memcmp(self.s.p, p.s.p, p.s.n)) ? jv_strn_nocopy(self.s.p + p.s.n, self.s.n - p.s.n) : self;
    return 0;
}
static int m_removesuffix(jctx *c, jval self, jargs *a, jval *o) {
    jval p;
    if (!jargs_get(a, 0, NULL, &p) || need_str(c, p, "suffix")) return ERR_INVAL;
    *o = (p.s.n && p.s.n <= self.s.n && !memcmp(self.s.p + self.s.n - p.s.n, p.s.p, p.s.n))
             ? jv_strn_nocopy(self.s.p, self.s.n - p.s.n) : self;
    return 0;
}
/* is*: every code point satisfies pred (and the string is non-empty) */
static int is_common(jval self, jval *o, int kind) {
    size_t i = 0;
    bool ok = self.s.n > 0, any_cased = false;
    while (ok && i < self.s.n) {
        int32_t cp = u8_next(self.s.p, self.s.n, &i);
        utf8proc_category_t k = utf8proc_category(cp);
        bool letter = k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO;
        bool digit = k == UTF8PROC_CATEGORY_ND;
        bool numeric = digit || k == UTF8PROC_CATEGORY_NL || k == UTF8PROC_CATEGORY_NO;
        switch (kind) {
        case 0: ok = digit; break;
        case 1: ok = letter; break;
        case 2: ok = letter || numeric; break;
        case 3: ok = py_isspace(cp); break;
        case 4: if (k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT) ok = false; else if (k == UTF8PROC_CATEGORY_LL) any_cased = true; break;
        case 5: if (k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LT) ok = false; else if (k == UTF8PROC_CATEGORY_LU) any_cased = true; break;
        case 6: ok = numeric; break;
        }
    }
    if (kind == 4 || kind == 5) ok = ok && any_cased;
    *o = jv_bool(ok);
    return 0;
}
static int m_isdigit(jctx *c, jval s, jargs *a, jval *o) { return is_common(s, o, 0); }
static int m_isalpha(jctx *c, jval s, jargs *a, jval *o) { return is_common(s, o, 1); }
static int m_isalnum(jctx *c, jval s, jargs *a, jval *o) { return is_common(s, o, 2); }
static int m_isspace(jctx *c, jval s, jargs *a, jval *o) { return is_common(s, o, 3); }
static int m_islower(jctx *c, jval s, jargs *a, jval *o) { return is_common(s, o, 4); }
static int m_isupper(jctx *c, jval s, jargs *a, jval *o) { return is_common(s, o, 5); }
static int m_isnumeric(jctx *c, jval s, jargs *a, jval *o) { return is_common(s, o, 6); }

/* dict */
static int m_get(jctx *c, jval self, jargs *a, jval *o) {
    jval k;
    if (!jargs_get(a, 0, NULL, &k)) return jfail(c, "get expected at least 1 argument, got 0");
    int i = jd_find(self.d, k);
    *o = i >= 0 ? self.d->v[i] : arg_or(a, 1, NULL, jv_none());
    return 0;
}
static int m_items(jctx *c, jval self, jargs *a, jval *o) {
    jval l = jv_list(c, self.d->n, false);
    for (int i = 0; i < self.d->n; i++) {
        jval t = jv_list(c, 2, true);
        jl_push(c, t.l, self.d->k[i]);
        jl_push(c, t.l, self.d->v[i]);
        jl_push(c, l.l, t);
    }
    *o = l;
    return 0;
}
static int m_keys(jctx *c, jval self, jargs *a, jval *o) {
    jval l = jv_list(c, self.d->n, false);
    for (int i = 0; i < self.d->n; i++) jl_push(c, l.l, self.d->k[i]);
    *o = l;
    return 0;
}
static int m_values(jctx *c, jval self, jargs *a, jval *o) {
    jval l = jv_list(c, self.d->n, false);
    for (int i = 0; i < self.d->n; i++) jl_push(c, l.l, self.d->v[i]);
    *o = l;
    return 0;
}
static int m_copy(jctx *c, jval self, jargs *a, jval *o) {
    if (self.t == JT_DICT) {
        jval d = jv_dict(c, self.d->n);
        for (int i = 0; i < self.d->n; i++) jd_set(c, d.d, self.d->k[i], self.d->v[i]);
        *o = d;
    } else {
        jval l = jv_list(c, self.l->n, self.l->tuple);
        for (int i = 0; i < self.l->n; i++) jl_push(c, l.l, self.l->v[i]);
        *o = l;
    }
    return 0;
}
/* list */
static int m_lcount(jctx *c, jval self, jargs *a, jval *o) {
    jval x;
    if (!jargs_get(a, 0, NULL, &x)) return jfail(c, "count() takes exactly one argument (0 given)");
    int64_t k = 0;
    for (int i = 0; i < self.l->n; i++) k += jv_eq(self.l->v[i], x);
    *o = jv_int(k);
    return 0;
}
static int m_lindex(jctx *c, jval self, jargs *a, jval *o) {
    jval x;
    if (!jargs_get(a, 0, NULL, &x)) return jfail(c, "index expected at least 1 argument, got 0");
    for (int i = 0; i < self.l->n; i++)
        if (jv_eq(self.l->v[i], x)) { *o = jv_int(i); return 0; }
    buf b;
    buf_init(&b);
    jv_repr_append(&b, x);
    jfail(c, "%s is not in list", b.data);
    buf_free(&b);
    return ERR_INVAL;
}

typedef struct mdef { const char *name; jfn_impl fn; } mdef;
static const mdef STR_METHODS[] = {
    {"upper", m_upper}, {"lower", m_lower}, {"title", m_title}, {"capitalize", m_capitalize},
    {"swapcase", m_swapcase}, {"casefold", m_lower}, {"strip", m_strip}, {"lstrip", m_lstrip},
    {"rstrip", m_rstrip}, {"startswith", m_startswith}, {"endswith", m_endswith}, {"split", m_split},
    {"rsplit", m_rsplit}, {"splitlines", m_splitlines}, {"replace", m_replace}, {"find", m_find},
    {"rfind", m_rfind}, {"index", m_index}, {"rindex", m_rindex}, {"count", m_count}, {"format", m_format},
    {"join", m_join}, {"center", m_center}, {"ljust", m_ljust}, {"rjust", m_rjust}, {"zfill", m_zfill},
    {"partition", m_partition}, {"rpartition", m_rpartition}, {"removeprefix", m_removeprefix},
    {"removesuffix", m_removesuffix}, {"isdigit", m_isdigit}, {"isdecimal", m_isdigit}, {"isalpha", m_isalpha},
    {"isalnum", m_isalnum}, {"isspace", m_isspace}, {"islower", m_islower}, {"isupper", m_isupper},
    {"isnumeric", m_isnumeric}, {NULL, NULL}};
static const mdef DICT_METHODS[] = {{"get", m_get}, {"items", m_items}, {"keys", m_keys}, {"values", m_values},
                                    {"copy", m_copy}, {NULL, NULL}};
static const mdef LIST_METHODS[] = {{"count", m_lcount}, {"index", m_lindex}, {"copy", m_copy}, {NULL, NULL}};
static const char *const UNSAFE_LIST[] = {"append", "clear", "extend", "insert", "pop", "remove", "reverse", "sort", NULL};
static const char *const UNSAFE_DICT[] = {"clear", "pop", "popitem", "setdefault", "update", NULL};

int jinja_method(jctx *c, jval obj, const char *name, jval *out) {
    const mdef *tab = obj.t == JT_STR ? STR_METHODS : obj.t == JT_DICT ? DICT_METHODS : obj.t == JT_LIST ? LIST_METHODS : NULL;
    if (!tab) return 0;
    for (int i = 0; tab[i].name; i++)
        if (!strcmp(tab[i].name, name)) {
            *out = jv_func(c, tab[i].name, tab[i].fn, obj);
            return 1;
        }
    const char *const *unsafe = obj.t == JT_DICT ? UNSAFE_DICT : obj.t == JT_LIST && !obj.l->tuple ? UNSAFE_LIST : NULL;
    for (int i = 0; unsafe && unsafe[i]; i++)
        if (!strcmp(unsafe[i], name)) {
            char m[160];
            snprintf(m, sizeof m, "access to attribute '%s' of '%s' object is unsafe.", name, jv_typename(obj));
            *out = jv_undef(jv_str(c, m, strlen(m)).s.p);
            return 1;
        }
    return 0;
}

/* ==== globals =============================================================================== */
static int g_range(jctx *c, jval self, jargs *a, jval *o) {
    int64_t start = 0, stop = 0, step = 1;
    if (a->nkw) return jfail(c, "range() takes no keyword arguments");
    if (a->npos == 1) { if (need_int(c, a->pos[0], "range", &stop)) return ERR_INVAL; }
    else if (a->npos == 2 || a->npos == 3) {
        if (need_int(c, a->pos[0], "range", &start) || need_int(c, a->pos[1], "range", &stop)) return ERR_INVAL;
        if (a->npos == 3 && need_int(c, a->pos[2], "range", &step)) return ERR_INVAL;
    } else return jfail(c, "range expected at most 3 arguments, got %d", a->npos);
    if (!step) return jfail(c, "range() arg 3 must not be zero");
    int64_t n = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0) : (start > stop ? (start - stop - step - 1) / -step : 0);
    if (n > 100000) return jfail(c, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    jval l = jv_list(c, (int)n, false);
    for (int64_t i = 0; i < n; i++) jl_push(c, l.l, jv_int(start + i * step));
    *o = l;
    return 0;
}
static int dict_from(jctx *c, jargs *a, jval *o) {
    jval d = jv_dict(c, 0);
    if (a->npos > 1) return jfail(c, "dict expected at most 1 argument, got %d", a->npos);
    if (a->npos == 1) {
        jval src = a->pos[0];
        if (src.t == JT_DICT || src.t == JT_NS) {
            for (int i = 0; i < src.d->n; i++) jd_set(c, d.d, src.d->k[i], src.d->v[i]);
        } else {
            jlist *l;
            if (jinja_iterate(c, src, &l)) return ERR_INVAL;
            for (int i = 0; i < l->n; i++) {
                jlist *pair;
                if (jinja_iterate(c, l->v[i], &pair)) return ERR_INVAL;
                if (pair->n != 2)
                    return jfail(c, "dictionary update sequence element #%d has length %d; 2 is required", i, pair->n);
                jd_set(c, d.d, pair->v[0], pair->v[1]);
            }
        }
    }
    for (int i = 0; i < a->nkw; i++) jd_set(c, d.d, jv_strz(a->kwn[i]), a->kwv[i]);
    *o = d;
    return 0;
}
static int g_dict(jctx *c, jval self, jargs *a, jval *o) { return dict_from(c, a, o); }
static int g_namespace(jctx *c, jval self, jargs *a, jval *o) {
    if (dict_from(c, a, o)) return ERR_INVAL;
    o->t = JT_NS;
    return 0;
}
static int g_raise(jctx *c, jval self, jargs *a, jval *o) {
    jval m = arg_or(a, 0, "message", jv_strz(""));
    buf b;
    buf_init(&b);
    jv_str_append(&b, m);
    c->raised = 1;
    jfail(c, "%s", b.data ? b.data : "");
    buf_free(&b);
    return ERR_INVAL;
}
static int g_strftime_now(jctx *c, jval self, jargs *a, jval *o) {
    jval f;
    if (!jargs_get(a, 0, "format", &f) || need_str(c, f, "strftime_now format")) return jfail(c, "strftime_now() needs a format string");
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    char out[512];
    size_t n = strftime(out, sizeof out, jv_str(c, f.s.p, f.s.n).s.p, &tm);
    *o = jv_str(c, out, n);
    return 0;
}

/* cycler(*items) and joiner(sep): small stateful objects kept in a namespace dict */
static int cyc_next(jctx *c, jval self, jargs *a, jval *o) {
    jval *items = jd_get_str(self.d, "items"), *pos = jd_get_str(self.d, "pos");
    *o = items->l->v[pos->i];
    int64_t next = (pos->i + 1) % items->l->n;
    jd_set(c, self.d, jv_strz("pos"), jv_int(next));
    jd_set(c, self.d, jv_strz("current"), items->l->v[next]);
    return 0;
}
static int cyc_reset(jctx *c, jval self, jargs *a, jval *o) {
    jval *items = jd_get_str(self.d, "items");
    jd_set(c, self.d, jv_strz("pos"), jv_int(0));
    jd_set(c, self.d, jv_strz("current"), items->l->v[0]);
    *o = jv_none();
    return 0;
}
static int g_cycler(jctx *c, jval self, jargs *a, jval *o) {
    if (!a->npos) return jfail(c, "at least one item has to be provided");
    jval ns = jv_dict(c, 5), items = jv_list(c, a->npos, true);
    ns.t = JT_NS;
    for (int i = 0; i < a->npos; i++) jl_push(c, items.l, a->pos[i]);
    jd_set(c, ns.d, jv_strz("items"), items);
    jd_set(c, ns.d, jv_strz("pos"), jv_int(0));
    jd_set(c, ns.d, jv_strz("current"), a->pos[0]);
    jd_set(c, ns.d, jv_strz("next"), jv_func(c, "next", cyc_next, ns));
    jd_set(c, ns.d, jv_strz("reset"), jv_func(c, "reset", cyc_reset, ns));
    *o = ns;
    return 0;
}
static int joiner_call(jctx *c, jval self, jargs *a, jval *o) {
    jval *used = jd_get_str(self.d, "used");
    if (!used->b) { jd_set(c, self.d, jv_strz("used"), jv_bool(true)); *o = jv_strz(""); }
    else *o = *jd_get_str(self.d, "sep");
    return 0;
}
static int g_joiner(jctx *c, jval self, jargs *a, jval *o) {
    jval st = jv_dict(c, 2);
    st.t = JT_NS;
    jd_set(c, st.d, jv_strz("sep"), arg_or(a, 0, "sep", jv_strz(", ")));
    jd_set(c, st.d, jv_strz("used"), jv_bool(false));
    *o = jv_func(c, "joiner", joiner_call, st);
    return 0;
}

bool jinja_global(jctx *c, const char *name, jval *out) {
    static const mdef G[] = {{"range", g_range}, {"dict", g_dict}, {"namespace", g_namespace},
                             {"raise_exception", g_raise}, {"strftime_now", g_strftime_now},
                             {"cycler", g_cycler}, {"joiner", g_joiner}, {NULL, NULL}};
    for (int i = 0; G[i].name; i++)
        if (!strcmp(G[i].name, name)) { *out = jv_func(c, G[i].name, G[i].fn, jv_none()); return true; }
    return false;
}

/* ==== tests ================================================================================== */
static jval arg0(jargs *a) { return a->npos ? a->pos[0] : a->nkw ? a->kwv[0] : jv_undef("missing test argument"); }
static int t_defined(jctx *c, jval v, jargs *a, bool *r) { *r = v.t != JT_UNDEF; return 0; }
static int t_undefined(jctx *c, jval v, jargs *a, bool *r) { *r = v.t == JT_UNDEF; return 0; }
static int t_none(jctx *c, jval v, jargs *a, bool *r) { *r = v.t == JT_NONE; return 0; }
static int t_boolean(jctx *c, jval v, jargs *a, bool *r) { *r = v.t == JT_BOOL; return 0; }
static int t_true(jctx *c, jval v, jargs *a, bool *r) { *r = v.t == JT_BOOL && v.b; return 0; }
static int t_false(jctx *c, jval v, jargs *a, bool *r) { *r = v.t == JT_BOOL && !v.b; return 0; }
static int t_string(jctx *c, jval v, jargs *a, bool *r) { *r = v.t == JT_STR; return 0; }
static int t_mapping(jctx *c, jval v, jargs *a, bool *r) { *r = v.t == JT_DICT; return 0; }
static int t_number(jctx *c, jval v, jargs *a, bool *r) { *r = v.t == JT_INT || v.t == JT_FLOAT || v.t == JT_BOOL; return 0; }
static int t_integer(jctx *c, jval v, jargs *a, bool *r) { *r = v.t == JT_INT; return 0; }
static int t_float(jctx *c, jval v, jargs *a, bool *r) { *r = v.t == JT_FLOAT; return 0; }
static int t_iterable(jctx *c, jval v, jargs *a, bool *r) { *r = jv_iterable(v); return 0; }
/* len() and __getitem__: str, list, tuple, dict, and (as in Python) Undefined */
static int t_sequence(jctx *c, jval v, jargs *a, bool *r) {
    *r = v.t == JT_STR || v.t == JT_LIST || v.t == JT_DICT || v.t == JT_UNDEF;
    return 0;
}
/* Python callable(): Undefined defines __call__ (that raises) */
static int t_callable(jctx *c, jval v, jargs *a, bool *r) { *r = jv_is_callable(v) || v.t == JT_UNDEF; return 0; }
static int t_escaped(jctx *c, jval v, jargs *a, bool *r) { *r = v.t == JT_STR && v.markup; return 0; }
static int t_lower(jctx *c, jval v, jargs *a, bool *r) { jval o; is_common(jv_tostr(c, v), &o, 4); *r = o.b; return 0; }
static int t_upper(jctx *c, jval v, jargs *a, bool *r) { jval o; is_common(jv_tostr(c, v), &o, 5); *r = o.b; return 0; }
/* Python `v % d` for numbers, as a double (exact for the ints templates use) */
static int modulo(jctx *c, jval v, jval d, double *m) {
    if (v.t == JT_UNDEF) return jfail_undef(c, v);
    bool vn = v.t == JT_INT || v.t == JT_BOOL || v.t == JT_FLOAT, dn = d.t == JT_INT || d.t == JT_BOOL || d.t == JT_FLOAT;
    if (!vn || !dn)
        return jfail(c, "unsupported operand type(s) for %%: '%s' and '%s'", jv_typename(v), jv_typename(d));
    if (v.t == JT_FLOAT || d.t == JT_FLOAT) {
        double fx = v.t == JT_FLOAT ? v.f : (double)(v.t == JT_INT ? v.i : v.b);
        double fy = d.t == JT_FLOAT ? d.f : (double)(d.t == JT_INT ? d.i : d.b);
        if (fy == 0) return jfail(c, "float modulo");
        double r = fmod(fx, fy);
        if (r != 0 && ((r < 0) != (fy < 0))) r += fy;
        *m = r;
        return 0;
    }
    int64_t x = v.t == JT_INT ? v.i : v.b, y = d.t == JT_INT ? d.i : d.b;
    if (!y) return jfail(c, "integer division or modulo by zero");
    int64_t r = x % y;
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    *m = (double)r;
    return 0;
}
static int str_mod_test(jctx *c, jval v, jval d, bool *r);
static int t_divisibleby(jctx *c, jval v, jargs *a, bool *r) {
    double m = 0;
    if (v.t == JT_STR) return str_mod_test(c, v, arg0(a), r);
    if (modulo(c, v, arg0(a), &m)) return ERR_INVAL;
    *r = m == 0;
    return 0;
}
/* odd/even/divisibleby on a str: Python's `value % n` formats, and a str never equals an int */
static int str_mod_test(jctx *c, jval v, jval d, bool *r) {
    jargs fa = {0};
    fa.npos = 1;
    fa.pos = &d;
    jval ignored;
    *r = false;
    return jv_pyformat(c, v, &fa, d.t == JT_DICT || (d.t == JT_LIST && !d.l->tuple), &ignored);
}
static int t_even(jctx *c, jval v, jargs *a, bool *r) {
    double m = 0;
    if (v.t == JT_STR) return str_mod_test(c, v, jv_int(2), r);
    if (modulo(c, v, jv_int(2), &m)) return ERR_INVAL;
    *r = m == 0;
    return 0;
}
static int t_odd(jctx *c, jval v, jargs *a, bool *r) {
    double m = 0;
    if (v.t == JT_STR) return str_mod_test(c, v, jv_int(2), r);
    if (modulo(c, v, jv_int(2), &m)) return ERR_INVAL;
    *r = m == 1; /* `value % 2 == 1`: 2.5 is neither odd nor even */
    return 0;
}
static int t_in(jctx *c, jval v, jargs *a, bool *r) { return jv_contains(c, arg0(a), v, r); }
static int t_eq(jctx *c, jval v, jargs *a, bool *r) { *r = jv_eq(v, arg0(a)); return 0; }
static int t_ne(jctx *c, jval v, jargs *a, bool *r) { *r = !jv_eq(v, arg0(a)); return 0; }
static int cmp_test(jctx *c, jval v, jargs *a, bool *r, const char *op) {
    int k;
    if (jv_cmp(c, v, arg0(a), op, &k)) return ERR_INVAL;
    *r = k == 2 ? false : op[0] == '<' ? (op[1] ? k <= 0 : k < 0) : (op[1] ? k >= 0 : k > 0);
    return 0;
}
static int t_lt(jctx *c, jval v, jargs *a, bool *r) { return cmp_test(c, v, a, r, "<"); }
static int t_le(jctx *c, jval v, jargs *a, bool *r) { return cmp_test(c, v, a, r, "<="); }
static int t_gt(jctx *c, jval v, jargs *a, bool *r) { return cmp_test(c, v, a, r, ">"); }
static int t_ge(jctx *c, jval v, jargs *a, bool *r) { return cmp_test(c, v, a, r, ">="); }
static int t_sameas(jctx *c, jval v, jargs *a, bool *r) {
    jval o = arg0(a);
    if (v.t != o.t) { *r = false; return 0; }
    switch (v.t) {
    case JT_NONE: case JT_UNDEF: *r = true; break;
    case JT_BOOL: *r = v.b == o.b; break;
    case JT_INT: *r = v.i == o.i && v.i >= -5 && v.i <= 256; break; /* CPython's small-int cache */
    case JT_STR: *r = v.s.p == o.s.p && v.s.n == o.s.n; break;
    default: *r = jv_eq(v, o) && v.l == o.l; break;
    }
    return 0;
}
static int t_filter(jctx *c, jval v, jargs *a, bool *r) { *r = v.t == JT_STR && jinja_find_filter(jv_str(c, v.s.p, v.s.n).s.p); return 0; }
static int t_test(jctx *c, jval v, jargs *a, bool *r) { *r = v.t == JT_STR && jinja_find_test(jv_str(c, v.s.p, v.s.n).s.p); return 0; }

typedef struct tdef { const char *name; jtest_fn fn; } tdef;
static const tdef TESTS[] = {
    {"defined", t_defined}, {"undefined", t_undefined}, {"none", t_none}, {"boolean", t_boolean},
    {"true", t_true}, {"false", t_false}, {"string", t_string}, {"mapping", t_mapping}, {"number", t_number},
    {"integer", t_integer}, {"float", t_float}, {"iterable", t_iterable}, {"sequence", t_sequence},
    {"callable", t_callable}, {"escaped", t_escaped}, {"lower", t_lower}, {"upper", t_upper},
    {"divisibleby", t_divisibleby}, {"even", t_even}, {"odd", t_odd}, {"in", t_in}, {"eq", t_eq},
    {"equalto", t_eq}, {"==", t_eq}, {"ne", t_ne}, {"!=", t_ne}, {"lt", t_lt}, {"lessthan", t_lt}, {"<", t_lt},
    {"le", t_le}, {"<=", t_le}, {"gt", t_gt}, {"greaterthan", t_gt}, {">", t_gt}, {"ge", t_ge}, {">=", t_ge},
    {"sameas", t_sameas}, {"filter", t_filter}, {"test", t_test}, {NULL, NULL}};

jtest_fn jinja_find_test(const char *name) {
    for (int i = 0; TESTS[i].name; i++)
        if (!strcmp(TESTS[i].name, name)) return TESTS[i].fn;
    return NULL;
}

