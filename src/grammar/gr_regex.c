/* gr_regex.c: regular expressions -> byte-level DFAs, the automata of the
 * grammar's GN_RE terminals (JSON Schema "pattern", SGLang's "regex").
 *
 * Dialect: the subset that ECMA-262 (JSON Schema's) and Python's re agree on:
 * literals (UTF-8), '.', classes [...] with ranges and negation, the escapes
 * \d \D \w \W \s \S (ASCII, as ECMA-262 and re.ASCII), \n \t \r \f \v \0
 * \xHH \uHHHH and escaped punctuation, groups ( ), (?: ), (?P<name> ),
 * (?<name> ), alternation |, quantifiers * + ? {n} {n,} {n,m} (a trailing
 * '?' makes one lazy, which matches the same strings), '^' at the start and
 * '$' at the end. Anything else (backreferences, lookaround, \b, inline flags,
 * anchors inside the pattern, possessive quantifiers, \p{..}) is refused with
 * the offset of the construct.
 *
 * Pipeline: the pattern parses into a small tree of code-point sets,
 * concatenations, alternations and repetitions; the tree compiles to a
 * Thompson NFA whose edges are byte ranges (each code-point range split into
 * UTF-8 byte sequences, surrogates excluded), and subset construction makes
 * the DFA. States from which no accepting state is reachable are removed, so
 * a live transition always leaves a way to finish. Limits: MAX_NFA NFA states
 * (large counted repetitions) and MAX_DFA DFA states, each refused with an
 * error naming the limit.
 */
#include "grammar/gr_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NFA 60000
#define MAX_DFA 4096
#define MAX_CP 0x10FFFF
#define MAX_REP 1000

/* ==== the tree ================================================================= */

enum { X_SET, X_CAT, X_ALT, X_REP };

typedef struct xnode {
    int kind;
    uint32_t *r; int nr;        /* X_SET: sorted disjoint ranges [lo, hi] (2 * nr values) */
    struct xnode **k; int nk;   /* X_CAT / X_ALT kids; X_REP: k[0] */
    int min, max;               /* X_REP (max -1: unbounded) */
} xnode;

typedef struct xparse {
    const char *p; size_t n, i;
    char *err; size_t errn;
    int failed;
} xparse;

static void xfree(xnode *x) {
    if (!x) return;
    for (int i = 0; i < x->nk; i++) xfree(x->k[i]);
    free(x->k);
    free(x->r);
    free(x);
}

static xnode *xnew(int kind) {
    xnode *x = xcalloc(1, sizeof *x);
    x->kind = kind;
    return x;
}

static void xkid(xnode *x, xnode *k) {
    x->k = xrealloc(x->k, (size_t)(x->nk + 1) * sizeof *x->k);
    x->k[x->nk++] = k;
}

static void *fail(xparse *ps, const char *fmt, const char *what) {
    if (!ps->failed) snprintf(ps->err, ps->errn, fmt, what, (int)ps->i);
    ps->failed = 1;
    return NULL;
}

/* ---- code-point sets ---- */

typedef struct cset { uint32_t *r; int n, cap; } cset;

static void cs_add(cset *s, uint32_t lo, uint32_t hi) {
    if (s->n == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 8;
        s->r = xrealloc(s->r, (size_t)s->cap * 2 * sizeof *s->r);
    }
    s->r[2 * s->n] = lo;
    s->r[2 * s->n + 1] = hi;
    s->n++;
}

static int cmp_range(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* Sort and merge into disjoint ranges. */
static void cs_norm(cset *s) {
    if (!s->n) return;
    qsort(s->r, (size_t)s->n, 2 * sizeof *s->r, cmp_range);
    int k = 0;
    for (int i = 1; i < s->n; i++) {
        if (s->r[2 * i] <= s->r[2 * k + 1] + 1) {
            if (s->r[2 * i + 1] > s->r[2 * k + 1]) s->r[2 * k + 1] = s->r[2 * i + 1];
        } else {
            k++;
            s->r[2 * k] = s->r[2 * i];
            s->r[2 * k + 1] = s->r[2 * i + 1];
        }
    }
    s->n = k + 1;
}

/* The complement within [0, MAX_CP] (s normalized). */
static void cs_negate(cset *s) {
    cset o = {0};
    uint32_t next = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->r[2 * i] > next) cs_add(&o, next, s->r[2 * i] - 1);
        next = s->r[2 * i + 1] + 1;
    }
    if (next <= MAX_CP) cs_add(&o, next, MAX_CP);
    free(s->r);
    *s = o;
}

static void cs_class(cset *s, char c) { /* \d \w \s and their negations */
    cset t = {0};
    switch (c | 0x20) {
    case 'd': cs_add(&t, '0', '9'); break;
    case 'w': cs_add(&t, '0', '9'); cs_add(&t, 'A', 'Z'); cs_add(&t, '_', '_'); cs_add(&t, 'a', 'z'); break;
    default: cs_add(&t, '\t', '\r'); cs_add(&t, ' ', ' '); break; /* \t \n \v \f \r and space */
    }
    cs_norm(&t);
    if (c >= 'A' && c <= 'Z') cs_negate(&t);
    for (int i = 0; i < t.n; i++) cs_add(s, t.r[2 * i], t.r[2 * i + 1]);
    free(t.r);
}

static xnode *set_node(cset *s) {
    cs_norm(s);
    xnode *x = xnew(X_SET);
    x->r = s->r;
    x->nr = s->n;
    return x;
}

/* ---- the parser ---- */

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
}

/* One UTF-8 code point at ps->i (advanced). */
static int32_t next_cp(xparse *ps) {
    const unsigned char *p = (const unsigned char *)ps->p + ps->i;
    size_t left = ps->n - ps->i;
    uint32_t c = p[0];
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || (size_t)len > left) { fail(ps, "%s at offset %d: invalid UTF-8", "pattern"); return -1; }
    if (len > 1) c &= 0x3F >> (len - 1);
    for (int k = 1; k < len; k++) {
        if ((p[k] & 0xC0) != 0x80) { fail(ps, "%s at offset %d: invalid UTF-8", "pattern"); return -1; }
        c = c << 6 | (p[k] & 0x3F);
    }
    ps->i += (size_t)len;
    return (int32_t)c;
}

/* Hex digits at ps->i: exactly n of them. */
static int32_t hex_n(xparse *ps, int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; k++) {
        int h = ps->i < ps->n ? hexval(ps->p[ps->i]) : -1;
        if (h < 0) { fail(ps, "%s at offset %d: expected hex digits", "escape"); return -1; }
        v = v * 16 + (uint32_t)h;
        ps->i++;
    }
    return (int32_t)v;
}

/* An escape after '\' (ps->i at the escaped char): a code point (>= 0), or -2 with
 * the class added to s (\d \w \s ...; s may be NULL outside classes: then *cls is set). */
static int32_t escape(xparse *ps, cset *cls) {
    if (ps->i >= ps->n) { fail(ps, "%s at offset %d: a pattern cannot end with '\\'", "escape"); return -1; }
    char c = ps->p[ps->i];
    if (strchr("dDwWsS", c)) { ps->i++; cs_class(cls, c); return -2; }
    ps->i++;
    switch (c) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'f': return '\f';
    case 'v': return '\v';
    case '0': return 0;
    case 'x': return hex_n(ps, 2);
    case 'u': return hex_n(ps, 4);
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '1' && c <= '9')) {
        ps->i--;
        char what[48];
        snprintf(what, sizeof what, "'\\%c'", c);
        fail(ps, "%s at offset %d is not supported (backreferences, \\b, \\p and other letter escapes)", what);
        return -1;
    }
    ps->i--;
    return next_cp(ps); /* escaped punctuation stands for itself */
}

static xnode *parse_alt(xparse *ps, int depth);
static int parse_braces(xparse *ps, int *min, int *max);

static xnode *parse_class(xparse *ps) {
    cset s = {0};
    int neg = 0;
    if (ps->i < ps->n && ps->p[ps->i] == '^') { neg = 1; ps->i++; }
    int first = 1;
    for (;;) {
        if (ps->i >= ps->n) { free(s.r); return fail(ps, "%s at offset %d: unterminated [", "class"); }
        char c = ps->p[ps->i];
        if (c == ']' && first) { /* Python: a literal ']'; ECMA-262: the end of an empty class */
            free(s.r);
            return fail(ps, "%s at offset %d: ']' first in a class is text to Python and ends an empty class to "
                        "ECMA-262; write \\]", "class");
        }
        if (c == ']') { ps->i++; break; }
        first = 0;
        int32_t lo;
        if (c == '\\') {
            ps->i++;
            lo = escape(ps, &s);
            if (lo == -2) continue;
        } else {
            if (c == '[' && ps->i + 1 < ps->n && ps->p[ps->i + 1] == ':') {
                free(s.r);
                return fail(ps, "%s at offset %d: POSIX classes [:name:] are not supported", "class");
            }
            lo = next_cp(ps);
        }
        if (lo < 0) { free(s.r); return NULL; }
        int32_t hi = lo;
        if (ps->i + 1 < ps->n && ps->p[ps->i] == '-' && ps->p[ps->i + 1] != ']') {
            ps->i++;
            if (ps->p[ps->i] == '\\') {
                ps->i++;
                cset junk = {0};
                hi = escape(ps, &junk);
                free(junk.r);
                if (hi == -2) { free(s.r); return fail(ps, "%s at offset %d: a class escape cannot end a range", "class"); }
            } else {
                hi = next_cp(ps);
            }
            if (hi < 0) { free(s.r); return NULL; }
            if (hi < lo) { free(s.r); return fail(ps, "%s at offset %d: a range runs backwards", "class"); }
        }
        cs_add(&s, (uint32_t)lo, (uint32_t)hi);
    }
    cs_norm(&s);
    if (neg) cs_negate(&s);
    return set_node(&s);
}

static xnode *parse_atom(xparse *ps, int depth) {
    char c = ps->p[ps->i];
    cset s = {0};
    if (c == '(') {
        ps->i++;
        if (ps->i < ps->n && ps->p[ps->i] == '?') {
            const char *q = ps->p + ps->i + 1;
            size_t left = ps->n - ps->i - 1;
            if (left >= 1 && q[0] == ':') ps->i += 2;
            else if (left >= 2 && (q[0] == 'P' || q[0] == '<') && (q[0] == '<' ? q[1] != '=' && q[1] != '!' : q[1] == '<')) {
                const char *end = memchr(q, '>', left);
                if (!end) return fail(ps, "%s at offset %d: unterminated group name", "group");
                ps->i = (size_t)(end - ps->p) + 1;
            } else {
                return fail(ps, "%s at offset %d is not supported (lookaround, inline flags, conditionals)", "'(?'");
            }
        }
        xnode *x = parse_alt(ps, depth + 1);
        if (!x) return NULL;
        if (ps->i >= ps->n || ps->p[ps->i] != ')') { xfree(x); return fail(ps, "%s at offset %d: missing ')'", "group"); }
        ps->i++;
        return x;
    }
    if (c == '[') { ps->i++; return parse_class(ps); }
    if (c == '.') {
        ps->i++;
        cs_add(&s, '\n', '\n');
        cs_negate(&s);
        return set_node(&s);
    }
    if (c == '\\') {
        ps->i++;
        int32_t v = escape(ps, &s);
        if (v == -1) { free(s.r); return NULL; }
        if (v >= 0) cs_add(&s, (uint32_t)v, (uint32_t)v);
        return set_node(&s);
    }
    if (c == '^' || c == '$') return fail(ps, "%s at offset %d: anchors are supported only at the start and end of the pattern", "anchor");
    if (c == '*' || c == '+' || c == '?') return fail(ps, "%s at offset %d: nothing to repeat", "quantifier");
    if (c == '{') { /* not a quantifier here: a literal '{', as both dialects read it */
        size_t j = ps->i + 1;
        if (j < ps->n && ps->p[j] == ',') /* Python reads {,n} as {0,n}, ECMA-262 as text */
            return fail(ps, "%s at offset %d: '{,n}' means {0,n} to Python and literal text to ECMA-262; write {0,n}",
                        "quantifier");
        if (ps->i > 0 && !strchr("|(", ps->p[ps->i - 1])) {
            int mn, mx;
            xparse probe = *ps;
            if (parse_braces(&probe, &mn, &mx)) return fail(ps, "%s at offset %d: nothing to repeat", "quantifier");
        }
    }
    if (c == ')') return fail(ps, "%s at offset %d: unbalanced ')'", "group");
    int32_t v = next_cp(ps);
    if (v < 0) return NULL;
    cs_add(&s, (uint32_t)v, (uint32_t)v);
    return set_node(&s);
}

/* {n}, {n,}, {n,m} at ps->i ('{'): 1 and the bounds, 0 when it is not a quantifier (a literal '{'). */
static int parse_braces(xparse *ps, int *min, int *max) {
    size_t j = ps->i + 1;
    long a = 0, b = -1;
    int digits = 0;
    while (j < ps->n && ps->p[j] >= '0' && ps->p[j] <= '9') { a = a * 10 + (ps->p[j++] - '0'); digits++; if (a > MAX_REP) a = MAX_REP + 1; }
    if (!digits) return 0;
    if (j < ps->n && ps->p[j] == ',') {
        j++;
        int d2 = 0;
        long t = 0;
        while (j < ps->n && ps->p[j] >= '0' && ps->p[j] <= '9') { t = t * 10 + (ps->p[j++] - '0'); d2++; if (t > MAX_REP) t = MAX_REP + 1; }
        b = d2 ? t : -1;
    } else {
        b = a;
    }
    if (j >= ps->n || ps->p[j] != '}') return 0;
    ps->i = j + 1;
    *min = (int)a;
    *max = (int)b;
    return 1;
}

static xnode *parse_rep(xparse *ps, int depth) {
    xnode *x = parse_atom(ps, depth);
    while (x && ps->i < ps->n) {
        char c = ps->p[ps->i];
        int min, max;
        if (c == '*') { min = 0; max = -1; ps->i++; }
        else if (c == '+') { min = 1; max = -1; ps->i++; }
        else if (c == '?') { min = 0; max = 1; ps->i++; }
        else if (c == '{') {
            if (!parse_braces(ps, &min, &max)) break;
            if (min > MAX_REP || max > MAX_REP) { xfree(x); return fail(ps, "%s before offset %d: counts above 1000 are not supported", "repetition"); }
            if (max >= 0 && max < min) { xfree(x); return fail(ps, "%s before offset %d: {n,m} with m < n", "repetition"); }
        } else break;
        if (ps->i < ps->n && ps->p[ps->i] == '?') ps->i++; /* lazy: the same language */
        else if (ps->i < ps->n && ps->p[ps->i] == '+') { xfree(x); return fail(ps, "%s at offset %d: possessive quantifiers are not supported", "'+'"); }
        xnode *r = xnew(X_REP);
        xkid(r, x);
        r->min = min;
        r->max = max;
        x = r;
        int dummy1, dummy2;
        xparse probe = *ps;
        if (ps->i < ps->n && (strchr("*+?", ps->p[ps->i]) || (ps->p[ps->i] == '{' && parse_braces(&probe, &dummy1, &dummy2)))) {
            xfree(x);
            return fail(ps, "%s at offset %d: a quantifier cannot follow another (group the first)", "quantifier");
        }
    }
    return x;
}

static xnode *parse_cat(xparse *ps, int depth) {
    xnode *cat = xnew(X_CAT);
    while (ps->i < ps->n && ps->p[ps->i] != '|' && ps->p[ps->i] != ')') {
        xnode *x = parse_rep(ps, depth);
        if (!x) { xfree(cat); return NULL; }
        xkid(cat, x);
    }
    return cat;
}

static xnode *parse_alt(xparse *ps, int depth) {
    if (depth > 100) return fail(ps, "%s at offset %d: groups nested too deep", "group");
    xnode *a = xnew(X_ALT);
    for (;;) {
        xnode *x = parse_cat(ps, depth);
        if (!x) { xfree(a); return NULL; }
        xkid(a, x);
        if (ps->i < ps->n && ps->p[ps->i] == '|') { ps->i++; continue; }
        return a;
    }
}

/* ==== the NFA ================================================================== */

typedef struct xedge { int32_t from, to; uint8_t lo, hi; } xedge; /* lo > hi: epsilon */

typedef struct nfa {
    xedge *e; int ne, cap;
    int n;                      /* states */
    int too_big;
} nfa;

static int nstate(nfa *a) {
    if (a->n >= MAX_NFA) a->too_big = 1;
    return a->n++;
}

static void nedge(nfa *a, int from, int to, int lo, int hi) {
    if (a->ne == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 256;
        a->e = xrealloc(a->e, (size_t)a->cap * sizeof *a->e);
    }
    a->e[a->ne++] = (xedge){from, to, (uint8_t)lo, (uint8_t)hi};
}

static void eps(nfa *a, int from, int to) { nedge(a, from, to, 1, 0); }

static int utf8_enc(uint32_t c, uint8_t *b) {
    if (c < 0x80) { b[0] = (uint8_t)c; return 1; }
    if (c < 0x800) { b[0] = (uint8_t)(0xC0 | c >> 6); b[1] = (uint8_t)(0x80 | (c & 0x3F)); return 2; }
    if (c < 0x10000) {
        b[0] = (uint8_t)(0xE0 | c >> 12); b[1] = (uint8_t)(0x80 | (c >> 6 & 0x3F)); b[2] = (uint8_t)(0x80 | (c & 0x3F));
        return 3;
    }
    b[0] = (uint8_t)(0xF0 | c >> 18); b[1] = (uint8_t)(0x80 | (c >> 12 & 0x3F));
    b[2] = (uint8_t)(0x80 | (c >> 6 & 0x3F)); b[3] = (uint8_t)(0x80 | (c & 0x3F));
    return 4;
}

/* Code points [lo, hi] of one UTF-8 length as byte-range chains from s to e. */
static void utf8_range(nfa *a, uint32_t lo, uint32_t hi, int s, int e) {
    int n = lo < 0x80 ? 1 : lo < 0x800 ? 2 : lo < 0x10000 ? 3 : 4;
    for (int i = 1; i < n; i++) {
        uint32_t m = (1u << (6 * i)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if (lo & m) { utf8_range(a, lo, lo | m, s, e); utf8_range(a, (lo | m) + 1, hi, s, e); return; }
            if ((hi & m) != m) { utf8_range(a, lo, (hi & ~m) - 1, s, e); utf8_range(a, hi & ~m, hi, s, e); return; }
        }
    }
    uint8_t bl[4], bh[4];
    utf8_enc(lo, bl);
    utf8_enc(hi, bh);
    int cur = s;
    for (int k = 0; k < n; k++) {
        int nx = k == n - 1 ? e : nstate(a);
        nedge(a, cur, nx, bl[k], bh[k]);
        cur = nx;
    }
}

/* Code points [lo, hi] (any lengths) from s to e, minus the surrogates and, in
 * JSON-string mode, the characters a JSON string must escape. */
static void cp_range(nfa *a, uint32_t lo, uint32_t hi, int s, int e, int json) {
    static const uint32_t cuts[][2] = {{0xD800, 0xDFFF}, {0x22, 0x22}, {0x5C, 0x5C}, {0, 0x1F}};
    int nc = json ? 4 : 1;
    for (int k = 0; k < nc; k++) {
        uint32_t cl = cuts[k][0], ch = cuts[k][1];
        if (hi < cl || lo > ch) continue;
        if (lo < cl) cp_range(a, lo, cl - 1, s, e, json);
        if (hi > ch) cp_range(a, ch + 1, hi, s, e, json);
        return;
    }
    static const uint32_t bounds[] = {0x7F, 0x7FF, 0xFFFF, MAX_CP};
    for (int k = 0; k < 4 && lo <= hi; k++) {
        if (lo > bounds[k]) continue;
        uint32_t top = hi < bounds[k] ? hi : bounds[k];
        utf8_range(a, lo, top, s, e);
        lo = top + 1;
    }
}

/* The fragment of x from s to e. */
static void compile(nfa *a, const xnode *x, int s, int e, int json) {
    if (a->too_big) return;
    switch (x->kind) {
    case X_SET:
        for (int i = 0; i < x->nr; i++) cp_range(a, x->r[2 * i], x->r[2 * i + 1], s, e, json);
        return;
    case X_CAT: {
        int cur = s;
        for (int i = 0; i < x->nk; i++) {
            int nx = i == x->nk - 1 ? e : nstate(a);
            compile(a, x->k[i], cur, nx, json);
            cur = nx;
        }
        if (!x->nk) eps(a, s, e);
        return;
    }
    case X_ALT:
        for (int i = 0; i < x->nk; i++) compile(a, x->k[i], s, e, json);
        return;
    case X_REP: {
        int cur = s;
        for (int i = 0; i < x->min; i++) {
            int nx = nstate(a);
            compile(a, x->k[0], cur, nx, json);
            cur = nx;
        }
        if (x->max < 0) { /* a loop */
            int loop = nstate(a);
            eps(a, cur, loop);
            int back = nstate(a);
            compile(a, x->k[0], loop, back, json);
            eps(a, back, loop);
            eps(a, loop, e);
            return;
        }
        for (int i = x->min; i < x->max; i++) { /* optional copies, each may end the run */
            eps(a, cur, e);
            int nx = i == x->max - 1 ? e : nstate(a);
            compile(a, x->k[0], cur, nx, json);
            cur = nx;
        }
        if (x->min == x->max) eps(a, cur, e);
        return;
    }
    }
}

/* ==== the DFA ================================================================== */

typedef struct dset { int32_t *s; int n; } dset;

typedef struct dbuild {
    const nfa *a;
    int32_t *eh, *en;           /* per NFA state: first edge index, edge count (edges sorted by from) */
    const xedge *es;
    dset *sets; int n, cap;
    int32_t *hidx; int hcap;    /* open addressing: DFA state + 1 */
    uint32_t *stamp, tick;      /* [a->n] membership marks of the set being built */
    int32_t *stack;
} dbuild;

static int cmp_edge(const void *x, const void *y) {
    const xedge *a = x, *b = y;
    return a->from < b->from ? -1 : a->from > b->from;
}

static int cmp_i32(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    return a < b ? -1 : a > b;
}

/* v[0..n) are marked with the current tick; add their epsilon closure, sort. */
static int closure(dbuild *d, int32_t *v, int n) {
    int sp = 0;
    for (int i = 0; i < n; i++) d->stack[sp++] = v[i];
    while (sp) {
        int32_t st = d->stack[--sp];
        for (int k = d->eh[st]; k < d->eh[st] + d->en[st]; k++) {
            const xedge *ed = &d->es[k];
            if (ed->lo > ed->hi && d->stamp[ed->to] != d->tick) {
                d->stamp[ed->to] = d->tick;
                v[n++] = ed->to;
                d->stack[sp++] = ed->to;
            }
        }
    }
    qsort(v, (size_t)n, sizeof *v, cmp_i32);
    return n;
}

static uint32_t hash_set(const int32_t *v, int n) {
    uint32_t h = 2166136261u;
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)v[i]) * 16777619u;
    return h;
}

/* The DFA state of the set (added when new); -1 past MAX_DFA. */
static int intern(dbuild *d, const int32_t *v, int n) {
    uint32_t h = hash_set(v, n), mask = (uint32_t)d->hcap - 1;
    uint32_t k = h & mask;
    for (; d->hidx[k]; k = (k + 1) & mask) {
        const dset *s = &d->sets[d->hidx[k] - 1];
        if (s->n == n && !memcmp(s->s, v, (size_t)n * sizeof *v)) return d->hidx[k] - 1;
    }
    if (d->n >= MAX_DFA) return -1;
    if (d->n == d->cap) {
        d->cap = d->cap ? 2 * d->cap : 64;
        d->sets = xrealloc(d->sets, (size_t)d->cap * sizeof *d->sets);
    }
    int id = d->n++;
    d->sets[id].s = xmalloc((size_t)(n ? n : 1) * sizeof *v);
    memcpy(d->sets[id].s, v, (size_t)n * sizeof *v);
    d->sets[id].n = n;
    d->hidx[k] = id + 1;
    return id;
}

static xnode *any_star(void) {
    cset any = {0};
    cs_add(&any, 0, MAX_CP);
    xnode *r = xnew(X_REP);
    xkid(r, set_node(&any));
    r->max = -1;
    return r;
}

int gr_regex_dfa(const char *re, size_t len, int json_string, int search, gr_dfa *out, char *err, size_t errn) {
    memset(out, 0, sizeof *out);
    /* anchors: '^' first, '$' last (unescaped) */
    int a_start = len > 0 && re[0] == '^', a_end = 0;
    if (len > (size_t)a_start && re[len - 1] == '$') {
        size_t bs = 0;
        while (bs + 1 < len && re[len - 2 - bs] == '\\') bs++;
        a_end = bs % 2 == 0;
    }
    xparse ps = {re, len - (size_t)a_end, (size_t)a_start, err, errn, 0};
    xnode *root = parse_alt(&ps, 0);
    if (root && ps.i < ps.n) { /* a ')' without its '(' */
        fail(&ps, "%s at offset %d: unbalanced ')'", "group");
        xfree(root);
        root = NULL;
    }
    if (!root) return -1;
    if (search && (!a_start || !a_end)) { /* JSON Schema's pattern matches anywhere: [\s\S]* around it */
        xnode *cat = xnew(X_CAT);
        if (!a_start) xkid(cat, any_star());
        xkid(cat, root);
        if (!a_end) xkid(cat, any_star());
        root = cat;
    }
    nfa a = {0};
    int s0 = nstate(&a), acc = nstate(&a);
    compile(&a, root, s0, acc, json_string);
    xfree(root);
    if (a.too_big) {
        free(a.e);
        snprintf(err, errn, "too large (more than %d automaton states before determinization)", MAX_NFA);
        return -1;
    }
    dbuild d = {0};
    d.a = &a;
    qsort(a.e, (size_t)a.ne, sizeof *a.e, cmp_edge);
    d.es = a.e;
    d.eh = xcalloc((size_t)a.n, sizeof *d.eh);
    d.en = xcalloc((size_t)a.n, sizeof *d.en);
    for (int k = a.ne - 1; k >= 0; k--) { d.eh[a.e[k].from] = k; d.en[a.e[k].from]++; }
    d.hcap = 4 * MAX_DFA;
    d.hidx = xcalloc((size_t)d.hcap, sizeof *d.hidx);
    d.stamp = xcalloc((size_t)a.n, sizeof *d.stamp);
    d.stack = xmalloc((size_t)a.n * sizeof *d.stack);
    int32_t *v = xmalloc((size_t)a.n * sizeof *v);
    d.tick = 1;
    v[0] = s0;
    d.stamp[s0] = d.tick;
    intern(&d, v, closure(&d, v, 1));
    int rc = 0, cap = 0;
    int32_t *next = NULL;
    for (int q = 0; q < d.n && !rc; q++) {
        if (q >= cap) {
            cap = cap ? 2 * cap : 64;
            next = xrealloc(next, (size_t)cap * 256 * sizeof *next);
        }
        for (int b = 0; b < 256 && !rc; b++) {
            int n = 0;
            d.tick++;
            const dset *cur = &d.sets[q];
            for (int i = 0; i < cur->n; i++) {
                int32_t st = cur->s[i];
                for (int k = d.eh[st]; k < d.eh[st] + d.en[st]; k++) {
                    const xedge *ed = &d.es[k];
                    if (ed->lo <= b && b <= ed->hi && d.stamp[ed->to] != d.tick) {
                        d.stamp[ed->to] = d.tick;
                        v[n++] = ed->to;
                    }
                }
            }
            if (!n) { next[(size_t)q * 256 + b] = -1; continue; }
            int t = intern(&d, v, closure(&d, v, n));
            if (t < 0) rc = -1;
            else next[(size_t)q * 256 + b] = t;
        }
    }
    int nd = d.n;
    uint8_t *accept = xcalloc((size_t)nd, 1);
    for (int q = 0; q < nd; q++)
        for (int i = 0; i < d.sets[q].n; i++)
            if (d.sets[q].s[i] == acc) accept[q] = 1;
    for (int q = 0; q < d.n; q++) free(d.sets[q].s);
    free(d.sets); free(d.hidx); free(d.stamp); free(d.stack); free(d.eh); free(d.en);
    free(v); free(a.e);
    if (rc) {
        free(next); free(accept);
        snprintf(err, errn, "too complex (more than %d automaton states)", MAX_DFA);
        return -1;
    }
    /* keep only states that can still reach an accepting one */
    uint8_t *live = xcalloc((size_t)nd, 1);
    for (int q = 0; q < nd; q++) live[q] = accept[q];
    for (int changed = 1; changed;) {
        changed = 0;
        for (int q = 0; q < nd; q++) {
            if (live[q]) continue;
            for (int b = 0; b < 256; b++) {
                int t = next[(size_t)q * 256 + b];
                if (t >= 0 && live[t]) { live[q] = 1; changed = 1; break; }
            }
        }
    }
    if (!live[0]) {
        free(next); free(accept); free(live);
        snprintf(err, errn, json_string ? "no JSON string without escapes matches it"
                                        : "no string matches it");
        return -1;
    }
    out->more = xcalloc((size_t)nd, 1);
    out->cont = xmalloc((size_t)nd);
    memset(out->cont, 1, (size_t)nd);
    for (int q = 0; q < nd; q++)
        for (int b = 0; b < 256; b++) {
            int32_t *t = &next[(size_t)q * 256 + b];
            if (*t >= 0 && !live[*t]) *t = -1;
            if (*t >= 0) {
                out->more[q] = 1;
                if ((b & 0xC0) != 0x80) out->cont[q] = 0;
            }
        }
    free(live);
    out->n = nd;
    out->next = next;
    out->accept = accept;
    return 0;
}

int gr_dfa_lengths(gr_dfa *d) {
    int nd = d->n;
    if (nd > 1024) return -1;
    /* w[q][t]: the most code points one byte from q to t starts (-1: no byte leads there) */
    int8_t *w = xmalloc((size_t)nd * nd);
    memset(w, -1, (size_t)nd * nd);
    for (int q = 0; q < nd; q++)
        for (int b = 0; b < 256; b++) {
            int t = d->next[(size_t)q * 256 + b];
            int8_t c = (b & 0xC0) != 0x80;
            if (t >= 0 && w[(size_t)q * nd + t] < c) w[(size_t)q * nd + t] = c;
        }
    d->dmin = xmalloc((size_t)nd * sizeof *d->dmin);
    d->dmax = xmalloc((size_t)nd * sizeof *d->dmax);
    /* shortest completions: relax until nothing changes (every state is live: all finish) */
    for (int q = 0; q < nd; q++) d->dmin[q] = d->accept[q] ? 0 : GR_LEN_INF;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int q = 0; q < nd; q++)
            for (int t = 0; t < nd; t++) {
                int8_t c = w[(size_t)q * nd + t];
                if (c >= 0 && d->dmin[t] < GR_LEN_INF && d->dmin[t] + c < d->dmin[q]) {
                    d->dmin[q] = d->dmin[t] + c;
                    changed = 1;
                }
            }
    }
    /* longest: states that reach a cycle have none (GR_LEN_INF); the others form a DAG,
     * finished sinks first (Kahn's order on the successors) */
    int *out = xcalloc((size_t)nd, sizeof *out), *queue = xmalloc((size_t)nd * sizeof *queue);
    int qh = 0, qt = 0;
    for (int q = 0; q < nd; q++) {
        for (int t = 0; t < nd; t++) out[q] += w[(size_t)q * nd + t] >= 0;
        d->dmax[q] = GR_LEN_INF;
        if (!out[q]) queue[qt++] = q;
    }
    while (qh < qt) {
        int t = queue[qh++];
        int32_t best = d->accept[t] ? 0 : -1;
        for (int s2 = 0; s2 < nd; s2++) {
            int8_t c = w[(size_t)t * nd + s2];
            if (c >= 0 && d->dmax[s2] + c > best) best = d->dmax[s2] + c;
        }
        d->dmax[t] = best;
        for (int p = 0; p < nd; p++)
            if (w[(size_t)p * nd + t] >= 0 && --out[p] == 0) queue[qt++] = p;
    }
    free(out); free(queue); free(w);
    return 0;
}

void gr_dfa_free(gr_dfa *d) {
    free(d->dmin);
    free(d->dmax);
    free(d->next);
    free(d->accept);
    free(d->more);
    free(d->cont);
    memset(d, 0, sizeof *d);
}

int gr_dfa_match(const gr_dfa *d, const char *s, size_t n) {
    int q = 0;
    for (size_t i = 0; i < n && q >= 0; i++) q = d->next[(size_t)q * 256 + (uint8_t)s[i]];
    return q >= 0 && d->accept[q];
}
