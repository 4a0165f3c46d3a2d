/* jinja_parse.c: Jinja2 lexer and parser, configured as transformers configures it.
 *
 * Lexing follows jinja2/lexer.py with trim_blocks=True, lstrip_blocks=True,
 * keep_trailing_newline=False: newlines (\r\n, \r, \n) are normalized to \n, one
 * trailing newline is dropped, `{%-`/`-%}` strip all (Python) whitespace, `+` keeps
 * it, a block or comment tag alone on its line loses the line's leading blanks
 * and the newline after `%}`/`#}`. Parsing follows jinja2/parser.py's grammar and
 * precedence (condexpr < or < and < not < compare < + - < ~ < * / // % < ** < unary
 * < postfix/filters/tests). Filters and tests are resolved here, as Jinja does
 * when it compiles, so an unknown name is a syntax error.
 *
 * Owns: the template arena (tokens are scratch, freed after parsing).
 * Errors: ERR_INVAL with "line L, column C: message" (column in code points).
 */
#include "tok/jinja_int.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==== lexer ================================================================== */
enum { TK_DATA, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END, TK_NAME, TK_STRING,
       TK_INT, TK_FLOAT, TK_OP, TK_EOF };

typedef struct tok {
    int type;
    int line, col;
    const char *p;  /* TK_DATA/TK_NAME/TK_OP/TK_STRING(decoded): bytes */
    size_t n;
    int64_t ival;
    double fval;
} tok;

typedef struct lexer {
    arena *a;
    const char *src;
    size_t len, pos;
    /* line/column cursor (monotonic) */
    size_t cur_off, cur_line_start;
    int cur_line;
    tok *toks;
    int ntok, cap;
    ls_err *e;
} lexer;

static void lx_linecol(lexer *L, size_t off, int *line, int *col) {
    if (off < L->cur_off) { L->cur_off = 0; L->cur_line = 1; L->cur_line_start = 0; }
    for (size_t i = L->cur_off; i < off; i++)
        if (L->src[i] == '\n') { L->cur_line++; L->cur_line_start = i + 1; }
    L->cur_off = off;
    *line = L->cur_line;
    *col = (int)u8_len(L->src + L->cur_line_start, off - L->cur_line_start) + 1;
}

static int lx_err(lexer *L, size_t off, const char *msg) {
    int line, col;
    lx_linecol(L, off, &line, &col);
    return errf(L->e, ERR_INVAL, "line %d, column %d: %s", line, col, msg);
}

static tok *lx_push(lexer *L, int type, size_t off, const char *p, size_t n) {
    if (L->ntok == L->cap) {
        L->cap = L->cap ? L->cap * 2 : 256;
        L->toks = xrealloc(L->toks, sizeof(tok) * L->cap);
    }
    tok *t = &L->toks[L->ntok++];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->p = p;
    t->n = n;
    lx_linecol(L, off, &t->line, &t->col);
    return t;
}

/* Length of the Python whitespace code point at s[i] (0 if none). */
static size_t ws_at(const char *s, size_t n, size_t i) {
    if (i >= n) return 0;
    size_t j = i;
    int32_t cp = u8_next(s, n, &j);
    return py_isspace(cp) ? j - i : 0;
}
static size_t skip_ws(const char *s, size_t n, size_t i) {
    size_t k;
    while ((k = ws_at(s, n, i)) > 0) i += k;
    return i;
}
/* Byte length of text after removing trailing Python whitespace (str.rstrip()). */
static size_t rstrip_len(const char *s, size_t n) {
    size_t end = n;
    while (end > 0) {
        size_t st = end - 1;
        while (st > 0 && ((unsigned char)s[st] & 0xC0) == 0x80) st--;
        size_t j = st;
        if (!py_isspace(u8_next(s, end, &j))) break;
        end = st;
    }
    return end;
}
static bool all_ws(const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t k = ws_at(s, n, i);
        if (!k) return false;
        i += k;
    }
    return true;
}

/* Emit data text[0..n) with the strip sign of the tag that follows (jinja's OptionalLStrip). */
static void lx_data(lexer *L, size_t off, size_t n, char sign, bool is_var, bool line_starting) {
    const char *text = L->src + off;
    if (sign == '-') {
        n = rstrip_len(text, n);
    } else if (sign != '+' && !is_var) {
        size_t l_pos = 0;
        for (size_t i = n; i > 0; i--)
            if (text[i - 1] == '\n') { l_pos = i; break; }
        if ((l_pos > 0 || line_starting) && n > l_pos && all_ws(text + l_pos, n - l_pos)) n = l_pos;
    }
    if (n) lx_push(L, TK_DATA, off, text, n);
}

/* Decode a string literal body the way jinja does (Python unicode-escape). */
static char *decode_string(arena *a, const char *s, size_t n, size_t *outn) {
    buf b;
    buf_init(&b);
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (ch != '\\' || i + 1 >= n) { buf_putc(&b, ch); continue; }
        char x = s[++i];
        int digits = 0;
        switch (x) {
        case '\n': break;
        case '\\': buf_putc(&b, '\\'); break;
        case '\'': buf_putc(&b, '\''); break;
        case '"': buf_putc(&b, '"'); break;
        case 'a': buf_putc(&b, 7); break;
        case 'b': buf_putc(&b, 8); break;
        case 'f': buf_putc(&b, 12); break;
        case 'n': buf_putc(&b, '\n'); break;
        case 'r': buf_putc(&b, '\r'); break;
        case 't': buf_putc(&b, '\t'); break;
        case 'v': buf_putc(&b, 11); break;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        default:
            if (x >= '0' && x <= '7') {
                int v = 0, k = 0;
                while (k < 3 && i < n && s[i] >= '0' && s[i] <= '7') v = v * 8 + (s[i++] - '0'), k++;
                i--;
                u8_put(&b, v);
            } else {
                buf_putc(&b, '\\');
                buf_putc(&b, x);
            }
        }
        if (digits) {
            int32_t v = 0;
            int k = 0;
            while (k < digits && i + 1 < n && isxdigit((unsigned char)s[i + 1])) {
                char h = s[++i];
                v = v * 16 + (isdigit((unsigned char)h) ? h - '0' : (tolower(h) - 'a' + 10));
                k++;
            }
            if (k == digits && v <= 0x10FFFF && !(v >= 0xD800 && v <= 0xDFFF)) u8_put(&b, v);
            else { buf_putc(&b, '\\'); buf_putc(&b, x); i -= k; }
        }
    }
    *outn = b.len;
    char *r = arena_strndup(a, b.data ? b.data : "", b.len);
    buf_free(&b);
    return r;
}

static const char *OPS2[] = {"//", "**", "==", "!=", ">=", "<=", NULL};
static const char OPS1[] = "+-/*%~[](){}><=.:|,;";

/* Tokens inside {{ }} or {% %}; stops after the closing tag. */
static int lx_tag(lexer *L, bool block, bool *line_starting) {
    const char *s = L->src;
    size_t n = L->len;
    int depth = 0; /* brace/paren/bracket balance */
    char stack[256];
    for (;;) {
        size_t i = skip_ws(s, n, L->pos);
        L->pos = i;
        if (i >= n) return lx_err(L, i, block ? "unexpected end of template, expected end of block ('%}')"
                                             : "unexpected end of template, expected end of print statement ('}}')");
        if (depth == 0) {
            const char *end = block ? "%}" : "}}";
            size_t j = i;
            if (block && s[j] == '+' && j + 2 < n + 1 && !strncmp(s + j + 1, end, 2)) {
                lx_push(L, block ? TK_BLOCK_END : TK_VAR_END, i, s + i, 3);
                L->pos = j + 3;
                *line_starting = false;
                return 0;
            }
            if (s[j] == '-' && j + 2 < n + 1 && !strncmp(s + j + 1, end, 2)) {
                lx_push(L, block ? TK_BLOCK_END : TK_VAR_END, i, s + i, 3);
                size_t k = skip_ws(s, n, j + 3);
                *line_starting = k > j + 3 && s[k - 1] == '\n';
                L->pos = k;
                return 0;
            }
            if (!strncmp(s + j, end, 2)) {
                lx_push(L, block ? TK_BLOCK_END : TK_VAR_END, i, s + i, 2);
                j += 2;
                *line_starting = false;
                if (block && j < n && s[j] == '\n') { j++; *line_starting = true; }
                L->pos = j;
                return 0;
            }
        }
        char ch = s[i];
        if (isdigit((unsigned char)ch)) {
            /* integer (0b/0o/0x, underscores) or float */
            size_t j = i;
            char digits[128];
            size_t dn = 0;
            bool is_float = false;
            int base = 10;
            if (ch == '0' && i + 1 < n && strchr("bBoOxX", s[i + 1])) {
                base = strchr("bB", s[i + 1]) ? 2 : strchr("oO", s[i + 1]) ? 8 : 16;
                j = i + 2;
                while (j < n && (isxdigit((unsigned char)s[j]) || s[j] == '_')) {
                    if (s[j] != '_' && dn < sizeof digits - 1) digits[dn++] = s[j];
                    j++;
                }
            } else {
                while (j < n && (isdigit((unsigned char)s[j]) || (s[j] == '_' && j + 1 < n && isdigit((unsigned char)s[j + 1])))) {
                    if (s[j] != '_' && dn < sizeof digits - 1) digits[dn++] = s[j];
                    j++;
                }
                if (j + 1 < n && s[j] == '.' && isdigit((unsigned char)s[j + 1])) {
                    is_float = true;
                    digits[dn++] = s[j++];
                    while (j < n && (isdigit((unsigned char)s[j]) || (s[j] == '_' && j + 1 < n && isdigit((unsigned char)s[j + 1])))) {
                        if (s[j] != '_' && dn < sizeof digits - 1) digits[dn++] = s[j];
                        j++;
                    }
                }
                if (j < n && (s[j] == 'e' || s[j] == 'E')) {
                    size_t k = j + 1;
                    if (k < n && (s[k] == '+' || s[k] == '-')) k++;
                    if (k < n && isdigit((unsigned char)s[k])) {
                        is_float = true;
                        digits[dn++] = 'e';
                        for (size_t q = j + 1; q < k; q++) digits[dn++] = s[q];
                        j = k;
                        while (j < n && (isdigit((unsigned char)s[j]) || s[j] == '_')) {
                            if (s[j] != '_' && dn < sizeof digits - 1) digits[dn++] = s[j];
                            j++;
                        }
                    }
                }
            }
            digits[dn] = 0;
            tok *t = lx_push(L, is_float ? TK_FLOAT : TK_INT, i, s + i, j - i);
            errno = 0;
            if (is_float) t->fval = strtod(digits, NULL);
            else {
                t->ival = (int64_t)strtoll(digits, NULL, base);
                if (errno == ERANGE) return lx_err(L, i, "integer literal too large");
            }
            L->pos = j;
            continue;
        }
        if (isalpha((unsigned char)ch) || ch == '_' || (unsigned char)ch >= 0x80) {
            size_t j = i;
            while (j < n && (isalnum((unsigned char)s[j]) || s[j] == '_' || (unsigned char)s[j] >= 0x80)) j++;
            lx_push(L, TK_NAME, i, s + i, j - i);
            L->pos = j;
            continue;
        }
        if (ch == '\'' || ch == '"') {
            size_t j = i + 1;
            while (j < n && s[j] != ch) j += (s[j] == '\\' && j + 1 < n) ? 2 : 1;
            if (j >= n) return lx_err(L, i, "unexpected end of string");
            tok *t = lx_push(L, TK_STRING, i, NULL, 0);
            t->p = decode_string(L->a, s + i + 1, j - i - 1, &t->n);
            L->pos = j + 1;
            continue;
        }
        size_t oplen = 0;
        for (int k = 0; OPS2[k]; k++)
            if (i + 1 < n && !strncmp(s + i, OPS2[k], 2)) { oplen = 2; break; }
        if (!oplen && strchr(OPS1, ch)) oplen = 1;
        if (!oplen) {
            char m[64];
            snprintf(m, sizeof m, "unexpected char '%c'", ch);
            return lx_err(L, i, m);
        }
        if (oplen == 1 && strchr("([{", ch)) {
            if (depth >= (int)sizeof stack) return lx_err(L, i, "brackets nested too deeply");
            stack[depth++] = ch == '(' ? ')' : ch == '[' ? ']' : '}';
        } else if (oplen == 1 && strchr(")]}", ch)) {
            char m[64];
            if (!depth) { snprintf(m, sizeof m, "unexpected '%c'", ch); return lx_err(L, i, m); }
            if (stack[depth - 1] != ch) {
                snprintf(m, sizeof m, "unexpected '%c', expected '%c'", ch, stack[depth - 1]);
                return lx_err(L, i, m);
            }
            depth--;
        }
        lx_push(L, TK_OP, i, s + i, oplen);
        L->pos = i + oplen;
    }
}

/* Matches `{%[-+]?\s*raw\s*(-%}\s*|%})` at i; returns end offset or 0. */
static size_t match_raw(const char *s, size_t n, size_t i, const char *word, char *sign) {
    if (i + 2 > n || s[i] != '{' || s[i + 1] != '%') return 0;
    size_t j = i + 2;
    *sign = 0;
    if (j < n && (s[j] == '-' || s[j] == '+')) *sign = s[j++];
    j = skip_ws(s, n, j);
    size_t wl = strlen(word);
    if (j + wl > n || strncmp(s + j, word, wl)) return 0;
    j = skip_ws(s, n, j + wl);
    if (j + 3 <= n && s[j] == '-' && s[j + 1] == '%' && s[j + 2] == '}') return skip_ws(s, n, j + 3);
    if (j + 3 <= n && s[j] == '+' && s[j + 1] == '%' && s[j + 2] == '}' && strcmp(word, "endraw") == 0) return j + 3;
    if (j + 2 <= n && s[j] == '%' && s[j + 1] == '}') {
        j += 2;
        if (!strcmp(word, "endraw") && j < n && s[j] == '\n') j++;
        return j;
    }
    return 0;
}

static int lex(lexer *L) {
    const char *s = L->src;
    size_t n = L->len;
    bool line_starting = true;
    while (L->pos < n) {
        /* find the next tag opener */
        size_t i = L->pos;
        const char *q = NULL;
        for (size_t k = i; k + 1 < n; k++)
            if (s[k] == '{' && (s[k + 1] == '{' || s[k + 1] == '%' || s[k + 1] == '#')) { q = s + k; break; }
        if (!q) {
            lx_push(L, TK_DATA, i, s + i, n - i);
            L->pos = n;
            break;
        }
        size_t t = (size_t)(q - s);
        char kind = s[t + 1];
        char sign = (t + 2 < n && (s[t + 2] == '-' || s[t + 2] == '+')) ? s[t + 2] : 0;
        char rsign;
        size_t rend = kind == '%' ? match_raw(s, n, t, "raw", &rsign) : 0;
        lx_data(L, i, t - i, sign, kind == '{', line_starting);
        if (rend) {
            /* raw block: data up to {% endraw %} */
            size_t k = rend, eend = 0;
            char esign = 0;
            for (; k + 1 < n; k++)
                if (s[k] == '{' && s[k + 1] == '%' && (eend = match_raw(s, n, k, "endraw", &esign))) break;
            if (!eend) return lx_err(L, t, "Missing end of raw directive");
            lx_data(L, rend, k - rend, esign, false, false);
            L->pos = eend;
            line_starting = s[eend - 1] == '\n';
            continue;
        }
        size_t body = t + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            size_t k = body;
            for (; k + 1 < n; k++)
                if (s[k] == '#' && s[k + 1] == '}') break;
            if (k + 1 >= n) return lx_err(L, t, "Missing end of comment tag");
            size_t e = k + 2;
            if (k > body && s[k - 1] == '-') { e = skip_ws(s, n, e); line_starting = e > k + 2 && s[e - 1] == '\n'; }
            else if (k > body && s[k - 1] == '+') line_starting = false;
            else { line_starting = false; if (e < n && s[e] == '\n') { e++; line_starting = true; } }
            L->pos = e;
            continue;
        }
        lx_push(L, kind == '%' ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, t, s + t, 2);
        L->pos = body;
        int rc = lx_tag(L, kind == '%', &line_starting);
        if (rc) return rc;
    }
    lx_push(L, TK_EOF, n, s + n, 0);
    return 0;
}

/* ==== parser ==================================================================== */
typedef struct parser {
    arena *a;
    tok *t;
    int i, n;
    ls_err *e;
    int loop_depth;
} parser;

static tok *cur(parser *P) { return &P->t[P->i]; }
static tok *peek(parser *P, int k) { return &P->t[P->i + k < P->n ? P->i + k : P->n - 1]; }
static bool is_op(tok *t, const char *op) { return t->type == TK_OP && t->n == strlen(op) && !memcmp(t->p, op, t->n); }
static bool is_name(tok *t, const char *nm) { return t->type == TK_NAME && t->n == strlen(nm) && !memcmp(t->p, nm, t->n); }

static const char *tok_desc(tok *t, char *tmp, size_t n) {
    switch (t->type) {
    case TK_EOF: return "end of template";
    case TK_VAR_END: return "end of print statement";
    case TK_BLOCK_END: return "end of statement block";
    case TK_STRING: return "string";
    case TK_INT: return "integer";
    case TK_FLOAT: return "float";
    default: snprintf(tmp, n, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->p); return tmp;
    }
}

static int perr(parser *P, tok *t, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int perr(parser *P, tok *t, const char *fmt, ...) {
    char m[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    return errf(P->e, ERR_INVAL, "line %d, column %d: %s", t->line, t->col, m);
}

static int expect_op(parser *P, const char *op) {
    char tmp[64];
    if (!is_op(cur(P), op)) return perr(P, cur(P), "expected '%s', got %s", op, tok_desc(cur(P), tmp, sizeof tmp));
    P->i++;
    return 0;
}

static jnode *mk(parser *P, int kind, tok *at) {
    jnode *x = arena_alloc(P->a, sizeof *x);
    x->kind = kind;
    x->line = at->line;
    x->col = at->col;
    return x;
}

/* growable node-pointer arrays built in scratch, then copied to the arena */
typedef struct nvec { jnode **v; int n, cap; const char **names; int nn, ncap; } nvec;
static void nv_push(nvec *v, jnode *x) {
    if (v->n == v->cap) { v->cap = v->cap ? v->cap * 2 : 8; v->v = xrealloc(v->v, sizeof(jnode *) * v->cap); }
    v->v[v->n++] = x;
}
static void nv_name(nvec *v, const char *s) {
    if (v->nn == v->ncap) { v->ncap = v->ncap ? v->ncap * 2 : 8; v->names = xrealloc(v->names, sizeof(char *) * v->ncap); }
    v->names[v->nn++] = s;
}
static jnode **nv_done(parser *P, nvec *v, int *n) {
    *n = v->n;
    jnode **r = v->n ? arena_alloc(P->a, sizeof(jnode *) * v->n) : NULL;
    if (v->n) memcpy(r, v->v, sizeof(jnode *) * v->n);
    free(v->v);
    v->v = NULL; v->n = v->cap = 0;
    return r;
}
static const char **nv_names_done(parser *P, nvec *v, int *n) {
    *n = v->nn;
    const char **r = v->nn ? arena_alloc(P->a, sizeof(char *) * v->nn) : NULL;
    if (v->nn) memcpy(r, v->names, sizeof(char *) * v->nn);
    free(v->names);
    v->names = NULL; v->nn = v->ncap = 0;
    return r;
}
static void nv_free(nvec *v) { free(v->v); free(v->names); memset(v, 0, sizeof *v); }

static const char *tok_str(parser *P, tok *t) { return arena_strndup(P->a, t->p, t->n); }

static jnode *p_expr(parser *P);
static jnode *p_or(parser *P);
static jnode *p_unary(parser *P, bool with_filter);
static jnode *p_tuple(parser *P, bool with_condexpr, const char *extra_end, bool explicit_parens);
static jnode *p_postfix(parser *P, jnode *node);

static jnode *p_condexpr(parser *P) {
    jnode *e1 = p_or(P);
    if (!e1) return NULL;
    while (is_name(cur(P), "if")) {
        tok *at = cur(P);
        P->i++;
        jnode *e2 = p_or(P), *e3 = NULL;
        if (!e2) return NULL;
        if (is_name(cur(P), "else")) {
            P->i++;
            if (!(e3 = p_condexpr(P))) return NULL;
        }
        jnode *c = mk(P, N_COND, at);
        c->a = e2; c->b = e1; c->c = e3;
        e1 = c;
    }
    return e1;
}
static jnode *p_expr(parser *P) { return p_condexpr(P); }

static jnode *p_not(parser *P);
static jnode *p_and(parser *P) {
    jnode *l = p_not(P);
    while (l && is_name(cur(P), "and")) {
        tok *at = cur(P);
        P->i++;
        jnode *r = p_not(P);
        if (!r) return NULL;
        jnode *x = mk(P, N_AND, at);
        x->a = l; x->b = r;
        l = x;
    }
    return l;
}
static jnode *p_or(parser *P) {
    jnode *l = p_and(P);
    while (l && is_name(cur(P), "or")) {
        tok *at = cur(P);
        P->i++;
        jnode *r = p_and(P);
        if (!r) return NULL;
        jnode *x = mk(P, N_OR, at);
        x->a = l; x->b = r;
        l = x;
    }
    return l;
}
static jnode *p_math1(parser *P);
static jnode *p_compare(parser *P) {
    jnode *e = p_math1(P);
    if (!e) return NULL;
    nvec ops = {0};
    int *opv = NULL, nop = 0;
    tok *first = cur(P);
    for (;;) {
        tok *t = cur(P);
        int op = -1;
        if (is_op(t, "==")) op = OP_EQ;
        else if (is_op(t, "!=")) op = OP_NE;
        else if (is_op(t, "<")) op = OP_LT;
        else if (is_op(t, "<=")) op = OP_LE;
        else if (is_op(t, ">")) op = OP_GT;
        else if (is_op(t, ">=")) op = OP_GE;
        else if (is_name(t, "in")) op = OP_IN;
        else if (is_name(t, "not") && is_name(peek(P, 1), "in")) { op = OP_NOTIN; P->i++; }
        if (op < 0) break;
        P->i++;
        jnode *r = p_math1(P);
        if (!r) { nv_free(&ops); free(opv); return NULL; }
        nv_push(&ops, r);
        opv = xrealloc(opv, sizeof(int) * (nop + 1));
        opv[nop++] = op;
    }
    if (!nop) return e;
    jnode *x = mk(P, N_CMP, first);
    x->line = e->line; x->col = e->col;
    x->a = e;
    x->list = nv_done(P, &ops, &x->nlist);
    x->ops = arena_alloc(P->a, sizeof(int) * nop);
    memcpy(x->ops, opv, sizeof(int) * nop);
    free(opv);
    return x;
}
static jnode *p_not(parser *P) {
    if (is_name(cur(P), "not")) {
        tok *at = cur(P);
        P->i++;
        jnode *x = mk(P, N_NOT, at);
        if (!(x->a = p_not(P))) return NULL;
        return x;
    }
    return p_compare(P);
}
static jnode *binop(parser *P, tok *at, int op, jnode *l, jnode *r) {
    jnode *x = mk(P, N_BINOP, at);
    x->line = l->line; x->col = l->col; /* errors point at the expression's start */
    x->op = op; x->a = l; x->b = r;
    return x;
}
static jnode *p_pow(parser *P) {
    jnode *l = p_unary(P, true);
    while (l && is_op(cur(P), "**")) {
        tok *at = cur(P);
        P->i++;
        jnode *r = p_unary(P, true);
        if (!r) return NULL;
        l = binop(P, at, OP_POW, l, r);
    }
    return l;
}
static jnode *p_math2(parser *P) {
    jnode *l = p_pow(P);
    for (;;) {
        if (!l) return NULL;
        tok *at = cur(P);
        int op = is_op(at, "*") ? OP_MUL : is_op(at, "/") ? OP_DIV : is_op(at, "//") ? OP_FLOORDIV
               : is_op(at, "%") ? OP_MOD : -1;
        if (op < 0) return l;
        P->i++;
        jnode *r = p_pow(P);
        if (!r) return NULL;
        l = binop(P, at, op, l, r);
    }
}
static jnode *p_concat(parser *P) {
    jnode *l = p_math2(P);
    while (l && is_op(cur(P), "~")) {
        tok *at = cur(P);
        P->i++;
        jnode *r = p_math2(P);
        if (!r) return NULL;
        l = binop(P, at, OP_CONCAT, l, r);
    }
    return l;
}
static jnode *p_math1(parser *P) {
    jnode *l = p_concat(P);
    for (;;) {
        if (!l) return NULL;
        tok *at = cur(P);
        int op = is_op(at, "+") ? OP_ADD : is_op(at, "-") ? OP_SUB : -1;
        if (op < 0) return l;
        P->i++;
        jnode *r = p_concat(P);
        if (!r) return NULL;
        l = binop(P, at, op, l, r);
    }
}

/* (args) of a call/filter/test into x->list (positional), x->names/x->list2 (keywords). */
static int p_call_args(parser *P, jnode *x) {
    if (expect_op(P, "(")) return -1;
    nvec pos = {0}, kw = {0};
    bool comma = false;
    while (!is_op(cur(P), ")")) {
        if (comma && expect_op(P, ",")) goto fail;
        if (is_op(cur(P), ")")) break;
        if (is_op(cur(P), "*") || is_op(cur(P), "**")) {
            perr(P, cur(P), "*args and **kwargs in calls are not supported");
            goto fail;
        }
        if (cur(P)->type == TK_NAME && is_op(peek(P, 1), "=")) {
            nv_name(&kw, tok_str(P, cur(P)));
            P->i += 2;
            jnode *v = p_expr(P);
            if (!v) goto fail;
            nv_push(&kw, v);
        } else {
            if (kw.n) { perr(P, cur(P), "positional argument follows keyword argument"); goto fail; }
            jnode *v = p_expr(P);
            if (!v) goto fail;
            nv_push(&pos, v);
        }
        comma = true;
    }
    P->i++;
    x->list = nv_done(P, &pos, &x->nlist);
    x->list2 = nv_done(P, &kw, &x->nlist2);
    x->names = nv_names_done(P, &kw, &x->nnames);
    return 0;
fail:
    nv_free(&pos);
    nv_free(&kw);
    return -1;
}

static const char *p_dotted_name(parser *P) {
    char tmp[64];
    if (cur(P)->type != TK_NAME) {
        perr(P, cur(P), "expected a name, got %s", tok_desc(cur(P), tmp, sizeof tmp));
        return NULL;
    }
    buf b;
    buf_init(&b);
    buf_append(&b, cur(P)->p, cur(P)->n);
    P->i++;
    while (is_op(cur(P), ".") && peek(P, 1)->type == TK_NAME) {
        buf_putc(&b, '.');
        buf_append(&b, peek(P, 1)->p, peek(P, 1)->n);
        P->i += 2;
    }
    const char *r = arena_strdup(P->a, b.data);
    buf_free(&b);
    return r;
}

static jnode *p_filter(parser *P, jnode *operand) {
    tok *at = cur(P); /* the '|' */
    P->i++;
    tok *nt = cur(P);
    jnode *x = mk(P, N_FILTER, nt);
    x->a = operand;
    if (!(x->str = p_dotted_name(P))) return NULL;
    if (!(x->impl = (const void *)jinja_find_filter(x->str))) {
        perr(P, nt, "No filter named '%s'.", x->str);
        return NULL;
    }
    (void)at;
    if (is_op(cur(P), "(") && p_call_args(P, x)) return NULL;
    return x;
}

static jnode *p_primary(parser *P);
static jnode *p_test(parser *P, jnode *operand) {
    P->i++; /* 'is' */
    bool neg = false;
    if (is_name(cur(P), "not")) { neg = true; P->i++; }
    tok *nt = cur(P);
    jnode *x = mk(P, N_TEST, nt);
    x->a = operand;
    x->op = neg;
    if (!(x->str = p_dotted_name(P))) return NULL;
    if (!(x->impl = (const void *)jinja_find_test(x->str))) {
        perr(P, nt, "No test named '%s'.", x->str);
        return NULL;
    }
    tok *t = cur(P);
    if (is_op(t, "(")) {
        if (p_call_args(P, x)) return NULL;
    } else if ((t->type == TK_NAME || t->type == TK_STRING || t->type == TK_INT || t->type == TK_FLOAT ||
                is_op(t, "(") || is_op(t, "[") || is_op(t, "{")) &&
               !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and")) {
        if (is_name(t, "is")) { perr(P, t, "You cannot chain multiple tests with is"); return NULL; }
        jnode *arg = p_primary(P);
        if (!arg || !(arg = p_postfix(P, arg))) return NULL;
        x->list = arena_alloc(P->a, sizeof(jnode *));
        x->list[0] = arg;
        x->nlist = 1;
    }
    return x;
}

static jnode *p_subscribed(parser *P) {
    tok *at = cur(P);
    jnode *args[3] = {0};
    if (is_op(cur(P), ":")) {
        P->i++;
    } else {
        jnode *node = p_expr(P);
        if (!node) return NULL;
        if (!is_op(cur(P), ":")) return node;
        P->i++;
        args[0] = node;
    }
    if (!is_op(cur(P), ":") && !is_op(cur(P), "]") && !is_op(cur(P), ",")) {
        if (!(args[1] = p_expr(P))) return NULL;
    }
    if (is_op(cur(P), ":")) {
        P->i++;
        if (!is_op(cur(P), "]") && !is_op(cur(P), ",")) {
            if (!(args[2] = p_expr(P))) return NULL;
        }
    }
    jnode *s = mk(P, N_SLICE, at);
    s->list = arena_alloc(P->a, sizeof(jnode *) * 3);
    memcpy(s->list, args, sizeof args);
    s->nlist = 3;
    return s;
}

static jnode *p_postfix(parser *P, jnode *node) {
    char tmp[64];
    for (;;) {
        tok *t = cur(P);
        if (is_op(t, ".")) {
            P->i++;
            tok *nt = cur(P);
            if (nt->type == TK_NAME) {
                jnode *x = mk(P, N_GETATTR, nt);
                x->line = node->line; x->col = node->col;
                x->a = node;
                x->str = tok_str(P, nt);
                P->i++;
                node = x;
            } else if (nt->type == TK_INT) {
                jnode *x = mk(P, N_GETITEM, nt), *k = mk(P, N_CONST, nt);
                k->lit = jv_int(nt->ival);
                x->a = node; x->b = k;
                P->i++;
                node = x;
            } else {
                perr(P, nt, "expected name or number, got %s", tok_desc(nt, tmp, sizeof tmp));
                return NULL;
            }
        } else if (is_op(t, "[")) {
            P->i++;
            nvec args = {0};
            while (!is_op(cur(P), "]")) {
                if (args.n && expect_op(P, ",")) { nv_free(&args); return NULL; }
                if (is_op(cur(P), "]")) break;
                jnode *s = p_subscribed(P);
                if (!s) { nv_free(&args); return NULL; }
                nv_push(&args, s);
            }
            P->i++;
            jnode *x = mk(P, N_GETITEM, t);
            x->line = node->line; x->col = node->col;
            x->a = node;
            if (args.n == 1) { x->b = args.v[0]; nv_free(&args); }
            else {
                jnode *tu = mk(P, N_TUPLE, t);
                tu->list = nv_done(P, &args, &tu->nlist);
                x->b = tu;
            }
            if (x->b->kind == N_SLICE) { x->kind = N_SLICE; x->list = x->b->list; x->nlist = 3; x->b = NULL; }
            node = x;
        } else if (is_op(t, "(")) {
            jnode *x = mk(P, N_CALL, t);
            x->line = node->line; x->col = node->col;
            x->a = node;
            if (p_call_args(P, x)) return NULL;
            node = x;
        } else {
            return node;
        }
    }
}

static jnode *p_filter_expr(parser *P, jnode *node) {
    for (;;) {
        if (!node) return NULL;
        tok *t = cur(P);
        if (is_op(t, "|")) node = p_filter(P, node);
        else if (is_name(t, "is")) node = p_test(P, node);
        else if (is_op(t, "(")) {
            jnode *x = mk(P, N_CALL, t);
            x->a = node;
            if (p_call_args(P, x)) return NULL;
            node = x;
        } else return node;
    }
}

static jnode *p_unary(parser *P, bool with_filter) {
    tok *t = cur(P);
    jnode *node;
    if (is_op(t, "-") || is_op(t, "+")) {
        P->i++;
        node = mk(P, is_op(t, "-") ? N_NEG : N_POS, t);
        if (!(node->a = p_unary(P, false))) return NULL;
    } else {
        node = p_primary(P);
    }
    if (!node || !(node = p_postfix(P, node))) return NULL;
    if (with_filter) node = p_filter_expr(P, node);
    return node;
}

static jnode *p_primary(parser *P) {
    tok *t = cur(P);
    char tmp[64];
    jnode *x;
    switch (t->type) {
    case TK_NAME:
        P->i++;
        x = mk(P, N_CONST, t);
        if (is_name(t, "true") || is_name(t, "True")) x->lit = jv_bool(true);
        else if (is_name(t, "false") || is_name(t, "False")) x->lit = jv_bool(false);
        else if (is_name(t, "none") || is_name(t, "None")) x->lit = jv_none();
        else { x->kind = N_NAME; x->str = tok_str(P, t); }
        return x;
    case TK_STRING: {
        buf b;
        buf_init(&b);
        while (cur(P)->type == TK_STRING) { buf_append(&b, cur(P)->p, cur(P)->n); P->i++; }
        x = mk(P, N_CONST, t);
        x->lit = jv_strn_nocopy(arena_strndup(P->a, b.data ? b.data : "", b.len), b.len);
        buf_free(&b);
        return x;
    }
    case TK_INT:
        P->i++;
        x = mk(P, N_CONST, t);
        x->lit = jv_int(t->ival);
        return x;
    case TK_FLOAT:
        P->i++;
        x = mk(P, N_CONST, t);
        x->lit = jv_float(t->fval);
        return x;
    case TK_OP:
        if (is_op(t, "(")) {
            P->i++;
            x = p_tuple(P, true, NULL, true);
            if (!x || expect_op(P, ")")) return NULL;
            return x;
        }
        if (is_op(t, "[")) {
            P->i++;
            nvec items = {0};
            while (!is_op(cur(P), "]")) {
                if (items.n && expect_op(P, ",")) { nv_free(&items); return NULL; }
                if (is_op(cur(P), "]")) break;
                jnode *v = p_expr(P);
                if (!v) { nv_free(&items); return NULL; }
                nv_push(&items, v);
            }
            P->i++;
            x = mk(P, N_LIST, t);
            x->list = nv_done(P, &items, &x->nlist);
            return x;
        }
        if (is_op(t, "{")) {
            P->i++;
            nvec ks = {0}, vs = {0};
            while (!is_op(cur(P), "}")) {
                if (ks.n && expect_op(P, ",")) goto dfail;
                if (is_op(cur(P), "}")) break;
                jnode *k = p_expr(P);
                if (!k || expect_op(P, ":")) goto dfail;
                jnode *v = p_expr(P);
                if (!v) goto dfail;
                nv_push(&ks, k);
                nv_push(&vs, v);
            }
            P->i++;
            x = mk(P, N_DICT, t);
            x->list = nv_done(P, &ks, &x->nlist);
            x->list2 = nv_done(P, &vs, &x->nlist2);
            return x;
        dfail:
            nv_free(&ks);
            nv_free(&vs);
            return NULL;
        }
        /* fallthrough */
    default:
        perr(P, t, "unexpected %s", tok_desc(t, tmp, sizeof tmp));
        return NULL;
    }
}

static bool tuple_end(parser *P, const char *extra) {
    tok *t = cur(P);
    if (t->type == TK_VAR_END || t->type == TK_BLOCK_END || t->type == TK_EOF || is_op(t, ")")) return true;
    return extra && is_name(t, extra);
}

static jnode *p_tuple(parser *P, bool with_condexpr, const char *extra_end, bool explicit_parens) {
    tok *at = cur(P);
    nvec args = {0};
    bool is_tuple = false;
    for (;;) {
        if (args.n && expect_op(P, ",")) { nv_free(&args); return NULL; }
        if (tuple_end(P, extra_end)) break;
        jnode *v = with_condexpr ? p_expr(P) : p_or(P);
        if (!v) { nv_free(&args); return NULL; }
        nv_push(&args, v);
        if (is_op(cur(P), ",")) is_tuple = true;
        else break;
    }
    if (!is_tuple) {
        if (args.n) { jnode *r = args.v[0]; nv_free(&args); return r; }
        if (!explicit_parens) {
            char tmp[64];
            perr(P, cur(P), "Expected an expression, got %s", tok_desc(cur(P), tmp, sizeof tmp));
            return NULL;
        }
    }
    jnode *x = mk(P, N_TUPLE, at);
    x->list = nv_done(P, &args, &x->nlist);
    return x;
}

/* ---- statements ------------------------------------------------------------------ */
static int p_body(parser *P, const char *const *ends, jnode **body, const char **which);

static int block_end(parser *P) {
    char tmp[64];
    if (cur(P)->type != TK_BLOCK_END)
        return perr(P, cur(P), "expected end of statement block, got %s", tok_desc(cur(P), tmp, sizeof tmp));
    P->i++;
    return 0;
}

/* Assignment target: name | name.attr | n1, n2 ... */
static jnode *p_assign_target(parser *P, const char *extra_end, bool with_ns) {
    char tmp[64];
    tok *t = cur(P);
    if (with_ns && t->type == TK_NAME && is_op(peek(P, 1), ".") && peek(P, 2)->type == TK_NAME) {
        jnode *x = mk(P, N_GETATTR, t), *nm = mk(P, N_NAME, t);
        nm->str = tok_str(P, t);
        x->a = nm;
        x->str = tok_str(P, peek(P, 2));
        P->i += 3;
        return x;
    }
    nvec names = {0};
    bool tuple = false;
    bool paren = false;
    if (is_op(t, "(")) { paren = true; P->i++; }
    for (;;) {
        if (names.nn) {
            if (!is_op(cur(P), ",")) break;
            P->i++;
            tuple = true;
        }
        if (tuple_end(P, extra_end) || is_op(cur(P), "=") || is_op(cur(P), "|") || is_op(cur(P), ")")) break;
        if (cur(P)->type != TK_NAME) {
            perr(P, cur(P), "can't assign to %s", tok_desc(cur(P), tmp, sizeof tmp));
            nv_free(&names);
            return NULL;
        }
        tok *nt = cur(P);
        if (is_name(nt, "true") || is_name(nt, "false") || is_name(nt, "none") || is_name(nt, "True") ||
            is_name(nt, "False") || is_name(nt, "None")) {
            perr(P, nt, "can't assign to constant");
            nv_free(&names);
            return NULL;
        }
        nv_name(&names, tok_str(P, nt));
        P->i++;
    }
    if (paren) { if (expect_op(P, ")")) { nv_free(&names); return NULL; } tuple = true; }
    if (!names.nn) {
        perr(P, cur(P), "expected an assignment target, got %s", tok_desc(cur(P), tmp, sizeof tmp));
        nv_free(&names);
        return NULL;
    }
    jnode *x = mk(P, tuple ? N_TUPLE : N_NAME, t);
    x->names = nv_names_done(P, &names, &x->nnames);
    if (!tuple) x->str = x->names[0];
    return x;
}

static int p_signature(parser *P, jnode *x) {
    nvec params = {0}, defs = {0};
    if (expect_op(P, "(")) return -1;
    while (!is_op(cur(P), ")")) {
        if (params.nn && expect_op(P, ",")) goto fail;
        if (is_op(cur(P), ")")) break;
        if (cur(P)->type != TK_NAME) { perr(P, cur(P), "expected a parameter name"); goto fail; }
        nv_name(&params, tok_str(P, cur(P)));
        P->i++;
        jnode *d = NULL;
        if (is_op(cur(P), "=")) {
            P->i++;
            if (!(d = p_expr(P))) goto fail;
        } else if (defs.n && defs.v[defs.n - 1]) {
            perr(P, cur(P), "non-default argument follows default argument");
            goto fail;
        }
        nv_push(&defs, d);
    }
    P->i++;
    x->names = nv_names_done(P, &params, &x->nnames);
    x->list2 = nv_done(P, &defs, &x->nlist2);
    return 0;
fail:
    nv_free(&params);
    nv_free(&defs);
    return -1;
}

/* Marks whether a macro body refers to caller/varargs/kwargs (jinja decides this at compile time). */
static void scan_names(const jnode *x, int *flags) {
    if (!x) return;
    if (x->kind == N_NAME && x->str) {
        if (!strcmp(x->str, "caller")) *flags |= MF_CALLER;
        else if (!strcmp(x->str, "varargs")) *flags |= MF_VARARGS;
        else if (!strcmp(x->str, "kwargs")) *flags |= MF_KWARGS;
    }
    scan_names(x->a, flags);
    scan_names(x->b, flags);
    scan_names(x->c, flags);
    for (int i = 0; i < x->nlist; i++) scan_names(x->list[i], flags);
    for (int i = 0; i < x->nlist2; i++) scan_names(x->list2[i], flags);
}

static jnode *p_statement(parser *P) {
    tok *t = cur(P);
    char tmp[64];
    if (t->type != TK_NAME) { perr(P, t, "tag name expected"); return NULL; }
    if (is_name(t, "for")) {
        P->i++;
        jnode *x = mk(P, N_FOR, t);
        if (!(x->a = p_assign_target(P, "in", false))) return NULL;
        if (!is_name(cur(P), "in")) { perr(P, cur(P), "expected 'in', got %s", tok_desc(cur(P), tmp, sizeof tmp)); return NULL; }
        P->i++;
        if (!(x->b = p_tuple(P, false, "recursive", false))) return NULL;
        if (is_name(cur(P), "if")) {
            P->i++;
            if (!(x->c = p_expr(P))) return NULL;
        }
        if (is_name(cur(P), "recursive")) { x->op = 1; P->i++; }
        if (block_end(P)) return NULL;
        static const char *const ends[] = {"endfor", "else", NULL};
        static const char *const ends2[] = {"endfor", NULL};
        const char *which;
        jnode *body;
        P->loop_depth++;
        if (p_body(P, ends, &body, &which)) return NULL;
        P->loop_depth--;
        x->list = body->list; x->nlist = body->nlist;
        if (!strcmp(which, "else")) {
            if (p_body(P, ends2, &body, &which)) return NULL;
            x->list2 = body->list; x->nlist2 = body->nlist;
        }
        return x;
    }
    if (is_name(t, "if")) {
        P->i++;
        jnode *x = mk(P, N_IF, t), *top = x;
        for (;;) {
            if (!(x->a = p_tuple(P, false, NULL, false)) || block_end(P)) return NULL;
            static const char *const ends[] = {"elif", "else", "endif", NULL};
            static const char *const ends2[] = {"endif", NULL};
            const char *which;
            jnode *body;
            if (p_body(P, ends, &body, &which)) return NULL;
            x->list = body->list; x->nlist = body->nlist;
            if (!strcmp(which, "elif")) {
                jnode *y = mk(P, N_IF, cur(P));
                x->list2 = arena_alloc(P->a, sizeof(jnode *));
                x->list2[0] = y;
                x->nlist2 = 1;
                x = y;
                continue;
            }
            if (!strcmp(which, "else")) {
                if (p_body(P, ends2, &body, &which)) return NULL;
                x->list2 = body->list; x->nlist2 = body->nlist;
            }
            return top;
        }
    }
    if (is_name(t, "set")) {
        P->i++;
        jnode *target = p_assign_target(P, NULL, true);
        if (!target) return NULL;
        if (is_op(cur(P), "=")) {
            P->i++;
            jnode *x = mk(P, N_SET, t);
            x->a = target;
            if (!(x->b = p_tuple(P, true, NULL, false)) || block_end(P)) return NULL;
            return x;
        }
        jnode *x = mk(P, N_SETBLOCK, t);
        x->a = target;
        if (is_op(cur(P), "|")) {
            jnode *f = NULL;
            while (is_op(cur(P), "|")) if (!(f = p_filter(P, f))) return NULL;
            x->c = f;
        }
        if (block_end(P)) return NULL;
        static const char *const ends[] = {"endset", NULL};
        const char *which;
        jnode *body;
        if (p_body(P, ends, &body, &which)) return NULL;
        x->list = body->list; x->nlist = body->nlist;
        return x;
    }
    if (is_name(t, "macro")) {
        P->i++;
        if (cur(P)->type != TK_NAME) { perr(P, cur(P), "expected a macro name"); return NULL; }
        jnode *x = mk(P, N_MACRO, t);
        x->str = tok_str(P, cur(P));
        P->i++;
        if (p_signature(P, x) || block_end(P)) return NULL;
        static const char *const ends[] = {"endmacro", NULL};
        const char *which;
        jnode *body;
        int saved = P->loop_depth;
        P->loop_depth = 0;
        if (p_body(P, ends, &body, &which)) return NULL;
        P->loop_depth = saved;
        x->list = body->list; x->nlist = body->nlist;
        int flags = 0;
        for (int i = 0; i < x->nlist; i++) scan_names(x->list[i], &flags);
        x->op = flags;
        return x;
    }
    if (is_name(t, "call")) {
        P->i++;
        jnode *x = mk(P, N_CALLBLOCK, t);
        x->str = "caller";
        if (is_op(cur(P), "(")) { if (p_signature(P, x)) return NULL; }
        tok *ct = cur(P);
        if (!(x->a = p_expr(P))) return NULL;
        if (x->a->kind != N_CALL) { perr(P, ct, "expected call"); return NULL; }
        if (block_end(P)) return NULL;
        static const char *const ends[] = {"endcall", NULL};
        const char *which;
        jnode *body;
        if (p_body(P, ends, &body, &which)) return NULL;
        x->list = body->list; x->nlist = body->nlist;
        int flags = 0;
        for (int i = 0; i < x->nlist; i++) scan_names(x->list[i], &flags);
        x->op = flags;
        return x;
    }
    if (is_name(t, "filter")) {
        P->i++;
        jnode *x = mk(P, N_FILTERBLOCK, t), *f = NULL;
        P->i--; /* p_filter skips one token (normally the '|') */
        do { if (!(f = p_filter(P, f))) return NULL; } while (is_op(cur(P), "|"));
        x->a = f;
        if (block_end(P)) return NULL;
        static const char *const ends[] = {"endfilter", NULL};
        const char *which;
        jnode *body;
        if (p_body(P, ends, &body, &which)) return NULL;
        x->list = body->list; x->nlist = body->nlist;
        return x;
    }
    if (is_name(t, "with")) {
        P->i++;
        jnode *x = mk(P, N_WITH, t);
        nvec names = {0}, vals = {0};
        while (cur(P)->type != TK_BLOCK_END) {
            if (names.nn && expect_op(P, ",")) { nv_free(&names); nv_free(&vals); return NULL; }
            if (cur(P)->type != TK_NAME) { perr(P, cur(P), "expected a name"); nv_free(&names); nv_free(&vals); return NULL; }
            nv_name(&names, tok_str(P, cur(P)));
            P->i++;
            jnode *v;
            if (expect_op(P, "=") || !(v = p_expr(P))) { nv_free(&names); nv_free(&vals); return NULL; }
            nv_push(&vals, v);
        }
        x->names = nv_names_done(P, &names, &x->nnames);
        x->list2 = nv_done(P, &vals, &x->nlist2);
        if (block_end(P)) return NULL;
        static const char *const ends[] = {"endwith", NULL};
        const char *which;
        jnode *body;
        if (p_body(P, ends, &body, &which)) return NULL;
        x->list = body->list; x->nlist = body->nlist;
        return x;
    }
    if (is_name(t, "generation")) {
        /* transformers' AssistantTracker: renders its body unchanged */
        P->i++;
        if (block_end(P)) return NULL;
        static const char *const ends[] = {"endgeneration", NULL};
        const char *which;
        jnode *body;
        if (p_body(P, ends, &body, &which)) return NULL;
        return body;
    }
    if (is_name(t, "break") || is_name(t, "continue")) {
        if (!P->loop_depth) { perr(P, t, "'%.*s' outside of a loop", (int)t->n, t->p); return NULL; }
        P->i++;
        jnode *x = mk(P, is_name(t, "break") ? N_BREAK : N_CONTINUE, t);
        if (block_end(P)) return NULL;
        return x;
    }
    perr(P, t, "Encountered unknown tag '%.*s'.", (int)t->n, t->p);
    return NULL;
}

/* Parses nodes until `{% END %}` for one END of ends (NULL ends: until EOF). */
static int p_body(parser *P, const char *const *ends, jnode **body, const char **which) {
    nvec v = {0};
    tok *start = cur(P);
    for (;;) {
        tok *t = cur(P);
        if (t->type == TK_EOF) {
            if (ends) {
                nv_free(&v);
                return perr(P, t, "Unexpected end of template. Jinja was looking for the following tags: '%s'.", ends[0]);
            }
            break;
        }
        if (t->type == TK_DATA) {
            jnode *x = mk(P, N_TEXT, t);
            x->str = t->p; x->slen = t->n;
            nv_push(&v, x);
            P->i++;
        } else if (t->type == TK_VAR_BEGIN) {
            P->i++;
            jnode *x = mk(P, N_OUTPUT, cur(P));
            char tmp[64];
            if (!(x->a = p_tuple(P, true, NULL, false))) { nv_free(&v); return -1; }
            if (cur(P)->type != TK_VAR_END) {
                nv_free(&v);
                return perr(P, cur(P), "expected end of print statement, got %s", tok_desc(cur(P), tmp, sizeof tmp));
            }
            P->i++;
            nv_push(&v, x);
        } else if (t->type == TK_BLOCK_BEGIN) {
            tok *nt = peek(P, 1);
            bool ended = false;
            for (int k = 0; ends && ends[k]; k++)
                if (is_name(nt, ends[k])) {
                    *which = ends[k];
                    P->i += 2;
                    if ((strcmp(ends[k], "elif") != 0 && block_end(P))) { nv_free(&v); return -1; }
                    ended = true;
                    break;
                }
            if (ended) break;
            if (nt->type == TK_NAME && (!strncmp(nt->p, "end", 3) || is_name(nt, "elif") || is_name(nt, "else"))) {
                nv_free(&v);
                if (ends)
                    return perr(P, nt, "Encountered unknown tag '%.*s'. Jinja was looking for the following tags: '%s'.",
                                (int)nt->n, nt->p, ends[0]);
                return perr(P, nt, "Encountered unknown tag '%.*s'.", (int)nt->n, nt->p);
            }
            P->i++;
            jnode *x = p_statement(P);
            if (!x) { nv_free(&v); return -1; }
            nv_push(&v, x);
        } else {
            nv_free(&v);
            return perr(P, t, "unexpected token");
        }
    }
    jnode *b = mk(P, N_BODY, start);
    b->list = nv_done(P, &v, &b->nlist);
    *body = b;
    return 0;
}

/* ==== public ===================================================================== */
int jinja_parse(const char *src, jinja_tmpl **out, ls_err *e) {
    *out = NULL;
    if (!src) return errf(e, ERR_INVAL, "template is NULL");
    jinja_tmpl *t = xcalloc(1, sizeof *t);
    t->a = arena_new(1 << 16);
    /* normalize newlines, drop one trailing newline (keep_trailing_newline=False) */
    size_t n = strlen(src);
    char *s = arena_alloc(t->a, n + 1);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '\r') { s[m++] = '\n'; if (i + 1 < n && src[i + 1] == '\n') i++; }
        else s[m++] = src[i];
    }
    if (m && s[m - 1] == '\n') m--;
    s[m] = 0;
    lexer L = {.a = t->a, .src = s, .len = m, .cur_line = 1, .e = e};
    int rc = lex(&L);
    if (!rc) {
        parser P = {.a = t->a, .t = L.toks, .n = L.ntok, .e = e};
        const char *which = NULL;
        rc = p_body(&P, NULL, &t->root, &which);
    }
    free(L.toks);
    if (rc) {
        jinja_free(t);
        return rc < 0 ? rc : ERR_INVAL;
    }
    *out = t;
    return 0;
}

void jinja_free(jinja_tmpl *t) {
    if (!t) return;
    arena_free(t->a);
    free(t);
}
