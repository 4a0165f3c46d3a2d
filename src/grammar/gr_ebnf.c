/* gr_ebnf.c: context-free grammars in EBNF -> grammar nodes (SGLang's `ebnf`,
 * the GBNF of llama.cpp's `grammar`).
 *
 *   root   ::= "{" ws pair (ws "," ws pair)* ws "}"    # comments run to the end of the line
 *   pair   ::= key ws ":" ws [0-9]+
 *   key    ::= "\"" [a-z_]{1,16} "\""
 *   ws     ::= [ \t\n]*
 *
 * A rule is NAME ::= alternatives; it runs until the next NAME ::= (so rules
 * may span lines). Items: "strings" and 'strings' (escapes \n \t \r \\ \" \'
 * \xHH \uHHHH), character classes [...] (gr_regex.c's class syntax), '.'
 * (any character), rule names, ( groups ), with * + ? {m} {m,} {m,n}. The
 * grammar starts at the rule named root. A class with its quantifier becomes
 * one regex terminal (its masks cached like a string's); other repetitions
 * are GN_ARR nodes, references GN_REF nodes patched once every rule is known,
 * so rules may refer to each other in any order and recursively.
 *
 * Refused with the line and column: undefined rules, a missing root, left
 * recursion (a rule that can reach itself before consuming a byte: the
 * automaton would never get past it), unbalanced groups, bad escapes.
 */
#include "grammar/gr_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RULES 4096
#define MAX_GROUP_DEPTH 100
#define MAX_ITEMS 4096

typedef struct erule { char name[64]; int body, line; } erule;
typedef struct eref { int node; char name[64]; int line, col; } eref;

typedef struct eparse {
    const char *p; size_t n, i;
    int line; size_t line_start;
    gr_grammar *g;
    erule *rules; int n_rules;
    eref *refs; int n_refs, cap_refs;
    ls_err *e;
    const char *path;
    int failed;
} eparse;

static int efail(eparse *ps, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int efail(eparse *ps, const char *fmt, ...) {
    if (ps->failed) return -1;
    ps->failed = 1;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    errf(ps->e, ERR_INVAL, "%s: line %d, column %d: %s", ps->path, ps->line, (int)(ps->i - ps->line_start) + 1, msg);
    return -1;
}

/* Skip blanks, newlines and # comments. */
static void skip(eparse *ps) {
    while (ps->i < ps->n) {
        char c = ps->p[ps->i];
        if (c == '#') {
            while (ps->i < ps->n && ps->p[ps->i] != '\n') ps->i++;
        } else if (c == '\n') {
            ps->i++;
            ps->line++;
            ps->line_start = ps->i;
        } else if (c == ' ' || c == '\t' || c == '\r') {
            ps->i++;
        } else {
            break;
        }
    }
}

static int name_char(char c, int first) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (!first && ((c >= '0' && c <= '9') || c == '-'));
}

/* A rule name at ps->i (not consumed): its length, 0 if none. */
static size_t name_len(const eparse *ps, size_t at) {
    size_t k = at;
    if (k >= ps->n || !name_char(ps->p[k], 1)) return 0;
    while (k < ps->n && name_char(ps->p[k], 0)) k++;
    return k - at;
}

/* Does a rule definition (NAME ::=) start at ps->i? */
static int at_rule_start(const eparse *ps) {
    size_t k = name_len(ps, ps->i);
    if (!k) return 0;
    size_t j = ps->i + k;
    while (j < ps->n && (ps->p[j] == ' ' || ps->p[j] == '\t' || ps->p[j] == '\r' || ps->p[j] == '\n')) j++;
    return j + 2 < ps->n && !memcmp(ps->p + j, "::=", 3);
}

static int hexdig(char c) {
    return c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1;
}

static void put_utf8(buf *b, uint32_t c) {
    char t[4];
    int n = c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
    if (n == 1) t[0] = (char)c;
    else if (n == 2) { t[0] = (char)(0xC0 | c >> 6); t[1] = (char)(0x80 | (c & 0x3F)); }
    else if (n == 3) { t[0] = (char)(0xE0 | c >> 12); t[1] = (char)(0x80 | (c >> 6 & 0x3F)); t[2] = (char)(0x80 | (c & 0x3F)); }
    else {
        t[0] = (char)(0xF0 | c >> 18); t[1] = (char)(0x80 | (c >> 12 & 0x3F));
        t[2] = (char)(0x80 | (c >> 6 & 0x3F)); t[3] = (char)(0x80 | (c & 0x3F));
    }
    buf_append(b, t, (size_t)n);
}

/* A quoted literal at ps->i (its quote char) -> LIT node. */
static int literal(eparse *ps) {
    char q = ps->p[ps->i++];
    buf b; buf_init(&b);
    for (;;) {
        if (ps->i >= ps->n || ps->p[ps->i] == '\n') { buf_free(&b); return efail(ps, "unterminated string"); }
        char c = ps->p[ps->i++];
        if (c == q) break;
        if (c != '\\') { buf_putc(&b, c); continue; }
        if (ps->i >= ps->n) { buf_free(&b); return efail(ps, "unterminated string"); }
        char x = ps->p[ps->i++];
        int hex = x == 'x' ? 2 : x == 'u' ? 4 : x == 'U' ? 8 : 0;
        if (hex) {
            uint32_t v = 0;
            for (int k = 0; k < hex; k++) {
                int h = ps->i < ps->n ? hexdig(ps->p[ps->i]) : -1;
                if (h < 0) { buf_free(&b); return efail(ps, "\\%c needs %d hex digits", x, hex); }
                v = v * 16 + (uint32_t)h;
                ps->i++;
            }
            if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) { buf_free(&b); return efail(ps, "escape outside Unicode"); }
            put_utf8(&b, v);
            continue;
        }
        const char *from = "ntr\\\"'[]-", *to = "\n\t\r\\\"'[]-";
        const char *k = strchr(from, x);
        if (!k || !x) { buf_free(&b); return efail(ps, "unknown escape '\\%c'", x); }
        buf_putc(&b, to[k - from]);
    }
    int node = gr_lit(ps->g, b.data ? b.data : "", b.len);
    buf_free(&b);
    return node;
}

/* {m}, {m,}, {m,n} at ps->i: 1 with the bounds (consumed), or -1 (error). */
static int braces(eparse *ps, int *min, int *max) {
    size_t j = ps->i + 1;
    long a = 0, b;
    int d = 0;
    while (j < ps->n && ps->p[j] >= '0' && ps->p[j] <= '9' && a <= 100000) { a = a * 10 + (ps->p[j++] - '0'); d++; }
    if (!d) return efail(ps, "expected a count after '{'");
    b = a;
    if (j < ps->n && ps->p[j] == ',') {
        j++;
        int d2 = 0;
        long t = 0;
        while (j < ps->n && ps->p[j] >= '0' && ps->p[j] <= '9' && t <= 100000) { t = t * 10 + (ps->p[j++] - '0'); d2++; }
        b = d2 ? t : -1;
    }
    if (j >= ps->n || ps->p[j] != '}') return efail(ps, "expected '}'");
    if (a > 10000 || b > 10000) return efail(ps, "repetition counts above 10000 are not supported");
    if (b >= 0 && b < a) return efail(ps, "{m,n} with n < m");
    ps->i = j + 1;
    *min = (int)a;
    *max = (int)b;
    return 1;
}

/* A quantifier at ps->i, if any: 1 and its bounds (consumed), 0 none, -1 error. */
static int quantifier(eparse *ps, int *min, int *max) {
    if (ps->i >= ps->n) return 0;
    char c = ps->p[ps->i];
    if (c == '*') { ps->i++; *min = 0; *max = -1; return 1; }
    if (c == '+') { ps->i++; *min = 1; *max = -1; return 1; }
    if (c == '?') { ps->i++; *min = 0; *max = 1; return 1; }
    if (c == '{') return braces(ps, min, max);
    return 0;
}

static int alternatives(eparse *ps, int depth);

static int add_ref(eparse *ps, size_t at, size_t len) {
    if (len >= sizeof ps->refs->name) return efail(ps, "rule name too long");
    int node = gr_add(ps->g, GN_REF, -1, 0, 0, 0, 0, 0);
    if (ps->n_refs == ps->cap_refs) {
        ps->cap_refs = ps->cap_refs ? 2 * ps->cap_refs : 64;
        ps->refs = xrealloc(ps->refs, (size_t)ps->cap_refs * sizeof *ps->refs);
    }
    eref *r = &ps->refs[ps->n_refs++];
    memcpy(r->name, ps->p + at, len);
    r->name[len] = 0;
    r->node = node;
    r->line = ps->line;
    r->col = (int)(at - ps->line_start) + 1;
    return node;
}

/* One item with its quantifier. */
static int item(eparse *ps, int depth) {
    char c = ps->p[ps->i];
    int node, min, max, q;
    if (c == '[' || c == '.') { /* a class (or '.') with its quantifier: one regex terminal */
        size_t s = ps->i;
        if (c == '.') ps->i++;
        else {
            ps->i++;
            if (ps->i < ps->n && ps->p[ps->i] == '^') ps->i++;
            if (ps->i < ps->n && ps->p[ps->i] == ']') return efail(ps, "']' first in a class: write \\]");
            while (ps->i < ps->n && ps->p[ps->i] != ']') {
                if (ps->p[ps->i] == '\n') return efail(ps, "unterminated character class");
                ps->i += ps->p[ps->i] == '\\' ? 2 : 1;
            }
            if (ps->i >= ps->n) return efail(ps, "unterminated character class");
            ps->i++;
        }
        size_t e = ps->i;
        if ((q = quantifier(ps, &min, &max)) < 0) return -1;
        buf re; buf_init(&re);
        if (c == '.') buf_puts(&re, "[\\s\\S]");
        else buf_append(&re, ps->p + s, e - s);
        if (q && max < 0) buf_printf(&re, "{%d,}", min);
        else if (q) buf_printf(&re, "{%d,%d}", min, max);
        char err[300];
        node = gr_re(ps->g, re.data, re.len, 0, 0, 0, -1, err, sizeof err);
        buf_free(&re);
        if (node < 0) {
            size_t keep = ps->i;
            ps->i = s;
            efail(ps, "%s", err);
            ps->i = keep;
            return -1;
        }
        return node;
    }
    if (c == '"' || c == '\'') node = literal(ps);
    else if (c == '(') {
        if (depth >= MAX_GROUP_DEPTH) return efail(ps, "groups nested too deep");
        ps->i++;
        node = alternatives(ps, depth + 1);
        if (node < 0) return -1;
        skip(ps);
        if (ps->i >= ps->n || ps->p[ps->i] != ')') return efail(ps, "expected ')'");
        ps->i++;
    } else if (name_char(c, 1)) {
        size_t len = name_len(ps, ps->i);
        node = add_ref(ps, ps->i, len);
        ps->i += len;
    } else {
        return efail(ps, "unexpected '%c'", c);
    }
    if (node < 0) return -1;
    if ((q = quantifier(ps, &min, &max)) < 0) return -1;
    if (!q) return node;
    return gr_add(ps->g, GN_ARR, gr_kids(ps->g, NULL, 0), 0, node, min, max, -1);
}

/* The items on the heap, grown as they come: a group nests a sequence per level (up to
 * MAX_GROUP_DEPTH), and a fixed MAX_ITEMS array a level would put 1.6 MB on the stack of the
 * HTTP thread that compiles the request's grammar. */
static int sequence(eparse *ps, int depth) {
    int32_t *kids = NULL;
    int n = 0, cap = 0, rc;
    for (;;) {
        skip(ps);
        if (ps->i >= ps->n) break;
        char c = ps->p[ps->i];
        if (c == '|' || c == ')' || at_rule_start(ps)) break;
        if (n == MAX_ITEMS) { free(kids); return efail(ps, "more than %d items in a sequence", MAX_ITEMS); }
        int k = item(ps, depth);
        if (k < 0) { free(kids); return -1; }
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            kids = xrealloc(kids, (size_t)cap * sizeof *kids);
        }
        kids[n++] = k;
    }
    rc = n ? gr_seq(ps->g, kids, n) : gr_lit(ps->g, "", 0);
    free(kids);
    return rc;
}

static int alternatives(eparse *ps, int depth) {
    int32_t kids[256];
    int n = 0;
    for (;;) {
        if (n == 256) return efail(ps, "more than 256 alternatives in one place");
        int k = sequence(ps, depth);
        if (k < 0) return -1;
        kids[n++] = k;
        skip(ps);
        if (ps->i < ps->n && ps->p[ps->i] == '|') { ps->i++; continue; }
        return gr_alt(ps->g, kids, n);
    }
}

/* ---- left recursion ------------------------------------------------------------- */

static int nullable_node(const gr_grammar *g, const uint8_t *nul, int v) {
    const gr_node *n = &g->nodes[v];
    switch (n->kind) {
    case GN_LIT: return n->b == 0;
    case GN_RE: return g->dfas[n->a].accept[0] && n->b == 0;
    case GN_WS: return 1;
    case GN_SEQ:
        for (int i = 0; i < n->b; i++)
            if (!nul[g->kids[n->a + i]]) return 0;
        return 1;
    case GN_ALT:
        for (int i = 0; i < n->b; i++)
            if (nul[g->kids[n->a + i]]) return 1;
        return 0;
    case GN_ARR: return n->d == 0 || nul[n->c];
    case GN_REF: return n->a >= 0 && nul[n->a];
    default: return 0;
    }
}

/* Is there a path from v to target that consumes nothing? (DFS over left corners) */
static int reaches(const gr_grammar *g, const uint8_t *nul, uint8_t *seen, int v, int target) {
    if (v == target) return 1;
    if (seen[v]) return 0;
    seen[v] = 1;
    const gr_node *n = &g->nodes[v];
    switch (n->kind) {
    case GN_SEQ:
        for (int i = 0; i < n->b; i++) {
            int k = g->kids[n->a + i];
            if (reaches(g, nul, seen, k, target)) return 1;
            if (!nul[k]) break;
        }
        return 0;
    case GN_ALT:
        for (int i = 0; i < n->b; i++)
            if (reaches(g, nul, seen, g->kids[n->a + i], target)) return 1;
        return 0;
    case GN_ARR: return reaches(g, nul, seen, n->c, target);
    case GN_REF: return reaches(g, nul, seen, n->a, target);
    default: return 0;
    }
}

int gr_compile_ebnf(const char *text, const char *path, gr_grammar **out, ls_err *e) {
    *out = NULL;
    eparse ps = {text ? text : "", text ? strlen(text) : 0, 0, 1, 0, gr_new(), NULL, 0, NULL, 0, 0, e,
                 path ? path : "ebnf", 0};
    ps.rules = xcalloc(MAX_RULES, sizeof *ps.rules);
    skip(&ps);
    while (ps.i < ps.n && !ps.failed) {
        size_t len = name_len(&ps, ps.i);
        if (!len || !at_rule_start(&ps)) { efail(&ps, "expected a rule: NAME ::= ..."); break; }
        if (len >= sizeof ps.rules->name) { efail(&ps, "rule name too long"); break; }
        if (ps.n_rules == MAX_RULES) { efail(&ps, "more than %d rules", MAX_RULES); break; }
        erule *r = &ps.rules[ps.n_rules];
        memcpy(r->name, ps.p + ps.i, len);
        r->name[len] = 0;
        r->line = ps.line;
        for (int k = 0; k < ps.n_rules; k++)
            if (!strcmp(ps.rules[k].name, r->name)) { efail(&ps, "rule '%s' is defined twice", r->name); break; }
        if (ps.failed) break;
        ps.i += len;
        skip(&ps);
        ps.i += 3; /* ::= */
        r->body = alternatives(&ps, 0);
        if (r->body < 0) break;
        ps.n_rules++;
        skip(&ps);
        if (ps.i < ps.n && ps.p[ps.i] == ')') { efail(&ps, "unbalanced ')'"); break; }
    }
    int root = -1;
    for (int k = 0; !ps.failed && k < ps.n_refs; k++) {
        eref *rf = &ps.refs[k];
        int body = -1;
        for (int j = 0; j < ps.n_rules && body < 0; j++)
            if (!strcmp(ps.rules[j].name, rf->name)) body = ps.rules[j].body;
        if (body < 0) {
            errf(e, ERR_INVAL, "%s: line %d, column %d: rule '%s' is not defined", ps.path, rf->line, rf->col, rf->name);
            ps.failed = 1;
        } else {
            ps.g->nodes[rf->node].a = body;
        }
    }
    for (int j = 0; !ps.failed && j < ps.n_rules; j++)
        if (!strcmp(ps.rules[j].name, "root")) root = ps.rules[j].body;
    if (!ps.failed && root < 0) {
        errf(e, ERR_INVAL, "%s: no rule named root (the grammar starts there)", ps.path);
        ps.failed = 1;
    }
    if (!ps.failed) {
        gr_grammar *g = ps.g;
        uint8_t *nul = xcalloc((size_t)g->n_nodes, 1), *seen = xmalloc((size_t)g->n_nodes);
        for (int changed = 1; changed;) {
            changed = 0;
            for (int v = 0; v < g->n_nodes; v++)
                if (!nul[v] && nullable_node(g, nul, v)) nul[v] = changed = 1;
        }
        for (int j = 0; j < ps.n_rules && !ps.failed; j++) {
            /* from the rule's body, without consuming a byte, back to a reference of itself */
            int body = ps.rules[j].body;
            const gr_node *bn = &g->nodes[body];
            memset(seen, 0, (size_t)g->n_nodes);
            int lr = 0;
            if (bn->kind == GN_SEQ || bn->kind == GN_ALT || bn->kind == GN_ARR || bn->kind == GN_REF) {
                seen[body] = 1; /* a path back to body itself */
                switch (bn->kind) {
                case GN_SEQ:
                    for (int i = 0; i < bn->b && !lr; i++) {
                        int k = g->kids[bn->a + i];
                        lr = reaches(g, nul, seen, k, body);
                        if (!nul[k]) break;
                    }
                    break;
                case GN_ALT:
                    for (int i = 0; i < bn->b && !lr; i++) lr = reaches(g, nul, seen, g->kids[bn->a + i], body);
                    break;
                case GN_ARR: lr = reaches(g, nul, seen, bn->c, body); break;
                default: lr = reaches(g, nul, seen, bn->a, body); break;
                }
            }
            if (lr) {
                errf(e, ERR_INVAL, "%s: line %d: rule '%s' is left-recursive (it can reach itself before reading "
                     "anything); rewrite it with repetition, e.g. a ::= b (\"+\" b)*", ps.path, ps.rules[j].line,
                     ps.rules[j].name);
                ps.failed = 1;
            }
        }
        free(nul);
        free(seen);
    }
    free(ps.rules);
    free(ps.refs);
    if (ps.failed) {
        gr_unref(ps.g);
        return -1;
    }
    ps.g->root = root;
    *out = ps.g;
    return 0;
}
