/* gr_pda.c: the byte-level pushdown automaton: node construction, the
 * terminal byte steps and the closure that turns a stack into stacks whose
 * top is a terminal ready for a byte.
 *
 * Stacks are persistent: frames live in a pool (gr_pool, indices, never
 * moved semantically: growth reallocates but indices stay valid) and point
 * at the frame below, so alternatives share their tails and a step copies
 * only the top frame. Callers release frames by resetting p->n to a mark
 * (the mask walk) or by copying live stacks into a fresh pool (the matcher).
 * Invariants: every stack in a gr_set has a terminal top that can still take
 * a byte; the closure is bounded (depth GR_MAX_DEPTH, GR_MAX_SET stacks, a
 * work budget) so a left-recursive or exploding schema degrades to fewer
 * alternatives, never to a hang.
 */
#include "grammar/gr_int.h"

#include <stdlib.h>
#include <string.h>

/* ==== building ============================================================ */

gr_grammar *gr_new(void) {
    gr_grammar *g = xcalloc(1, sizeof *g);
    atomic_init(&g->refs, 1);
    pthread_mutex_init(&g->mu, NULL);
    g->root = -1;
    return g;
}

int gr_add(gr_grammar *g, int kind, int a, int b, int c, int d, int e, int f) {
    if (g->n_nodes == g->cap_nodes) {
        g->cap_nodes = g->cap_nodes ? 2 * g->cap_nodes : 64;
        g->nodes = xrealloc(g->nodes, (size_t)g->cap_nodes * sizeof *g->nodes);
    }
    g->nodes[g->n_nodes] = (gr_node){kind, a, b, c, d, e, f};
    return g->n_nodes++;
}

int gr_kids(gr_grammar *g, const int32_t *kids, int n) {
    if (g->n_kids + n > g->cap_kids) {
        while (g->n_kids + n > g->cap_kids) g->cap_kids = g->cap_kids ? 2 * g->cap_kids : 128;
        g->kids = xrealloc(g->kids, (size_t)g->cap_kids * sizeof *g->kids);
    }
    int off = g->n_kids;
    if (n) memcpy(g->kids + off, kids, (size_t)n * sizeof *kids);
    g->n_kids += n;
    return off;
}

int gr_lit(gr_grammar *g, const char *s, size_t n) {
    if (g->n_bytes + (int)n + 1 > g->cap_bytes) {
        while (g->n_bytes + (int)n + 1 > g->cap_bytes) g->cap_bytes = g->cap_bytes ? 2 * g->cap_bytes : 256;
        g->bytes = xrealloc(g->bytes, (size_t)g->cap_bytes);
    }
    int off = g->n_bytes;
    if (n) memcpy(g->bytes + off, s, n);
    g->n_bytes += (int)n;
    return gr_add(g, GN_LIT, off, (int)n, 0, 0, 0, 0);
}

int gr_seq(gr_grammar *g, const int32_t *kids, int n) {
    if (n == 1) return kids[0];
    int off = gr_kids(g, kids, n);
    return gr_add(g, GN_SEQ, off, n, 0, 0, 0, 0);
}

int gr_alt(gr_grammar *g, const int32_t *kids, int n) {
    if (n == 1) return kids[0];
    int off = gr_kids(g, kids, n);
    return gr_add(g, GN_ALT, off, n, 0, 0, 0, 0);
}

gr_grammar *gr_ref(gr_grammar *g) {
    if (g) atomic_fetch_add(&g->refs, 1);
    return g;
}

void gr_unref(gr_grammar *g) {
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1) return;
    for (int i = 0; i < g->n_cache; i++) {
        free(g->cache[i]->bits);
        free(g->cache[i]->exits);
        free(g->cache[i]);
    }
    free(g->cache);
    for (int i = 0; i < g->n_dfas; i++) gr_dfa_free(&g->dfas[i]);
    free(g->dfas);
    pthread_mutex_destroy(&g->mu);
    free(g->nodes); free(g->kids); free(g->bytes);
    free(g);
}

/* ==== terminal steps ======================================================== */

static int is_digit(uint8_t b) { return b >= '0' && b <= '9'; }

/* A byte of a JSON string body, from S_BODY and its sub-states. */
int gr_str_step(const gr_node *n, int32_t *pc, int32_t *x, uint8_t b) {
    int max = n->b;
    switch (*pc) {
    case S_OPEN:
        if (b != '"') return -1;
        *pc = S_BODY;
        return 0;
    case S_BODY:
        if (b == '"') {
            if (*x < n->a) return -1;
            *pc = T_DONE;
            return 0;
        }
        if (b < 0x20) return -1;
        if (max >= 0 && *x >= max) return -1;
        if (b == '\\') { *pc = S_ESC; (*x)++; return 0; }
        if (b < 0x80) { (*x)++; return 0; }
        if (b >= 0xC2 && b <= 0xDF) *pc = S_C1;
        else if (b == 0xE0) *pc = S_E0;
        else if (b == 0xED) *pc = S_ED;
        else if (b >= 0xE1 && b <= 0xEF) *pc = S_C2;
        else if (b == 0xF0) *pc = S_F0;
        else if (b >= 0xF1 && b <= 0xF3) *pc = S_C3;
        else if (b == 0xF4) *pc = S_F4;
        else return -1;
        (*x)++;
        return 0;
    case S_ESC:
        if (b == 'u') { *pc = S_HEX1; return 0; }
        if (b == '"' || b == '\\' || b == '/' || b == 'b' || b == 'f' || b == 'n' || b == 'r' || b == 't') {
            *pc = S_BODY;
            return 0;
        }
        return -1;
    case S_HEX1: case S_HEX2: case S_HEX3: case S_HEX4:
        if (!(is_digit(b) || (b >= 'a' && b <= 'f') || (b >= 'A' && b <= 'F'))) return -1;
        *pc = *pc == S_HEX4 ? S_BODY : *pc + 1;
        return 0;
    case S_C1: case S_C2: case S_C3:
        if ((b & 0xC0) != 0x80) return -1;
        *pc = *pc == S_C1 ? S_BODY : *pc - 1;
        return 0;
    case S_E0: if (b < 0xA0 || b > 0xBF) return -1; *pc = S_C1; return 0;
    case S_ED: if (b < 0x80 || b > 0x9F) return -1; *pc = S_C1; return 0;
    case S_F0: if (b < 0x90 || b > 0xBF) return -1; *pc = S_C2; return 0;
    case S_F4: if (b < 0x80 || b > 0x8F) return -1; *pc = S_C2; return 0;
    }
    return -1;
}

#define NUM_INT_DIGITS 15
#define NUM_FRAC_DIGITS 15
#define NUM_EXP_DIGITS 3

static int num_step(const gr_node *n, int32_t *pc, int32_t *x, uint8_t b) {
    int integer = n->a, nonneg = n->b;
    switch (*pc) {
    case N_START:
        if (b == '-' && !nonneg) { *pc = N_SIGN; return 0; }
        /* fall through */
    case N_SIGN:
        if (b == '0') { *pc = N_ZERO; return 0; }
        if (b >= '1' && b <= '9') { *pc = N_INT; *x = 1; return 0; }
        return -1;
    case N_INT:
        if (is_digit(b)) {
            if (*x >= NUM_INT_DIGITS) return -1;
            (*x)++;
            return 0;
        }
        /* fall through */
    case N_ZERO:
        if (integer) return -1;
        if (b == '.') { *pc = N_DOT; *x = 0; return 0; }
        if (b == 'e' || b == 'E') { *pc = N_EXP; *x = 0; return 0; }
        return -1;
    case N_DOT:
        if (!is_digit(b)) return -1;
        *pc = N_FRAC; *x = 1;
        return 0;
    case N_FRAC:
        if (is_digit(b)) {
            if (*x >= NUM_FRAC_DIGITS) return -1;
            (*x)++;
            return 0;
        }
        if (b == 'e' || b == 'E') { *pc = N_EXP; *x = 0; return 0; }
        return -1;
    case N_EXP:
        if (b == '+' || b == '-') { *pc = N_EXPS; return 0; }
        /* fall through */
    case N_EXPS:
        if (!is_digit(b)) return -1;
        *pc = N_EXPD; *x = 1;
        return 0;
    case N_EXPD:
        if (!is_digit(b) || *x >= NUM_EXP_DIGITS) return -1;
        (*x)++;
        return 0;
    }
    return -1;
}

static int num_can_end(int pc) { return pc == N_ZERO || pc == N_INT || pc == N_FRAC || pc == N_EXPD; }

static int num_more(const gr_node *n, int pc, int x) {
    switch (pc) {
    case N_ZERO: return !n->a;
    case N_INT: return x < NUM_INT_DIGITS || !n->a;
    case N_FRAC: return 1;
    case N_EXPD: return x < NUM_EXP_DIGITS;
    default: return 1;
    }
}

/* Raw parameter text (qwen3_coder). x counts content bytes. */
int gr_raw_step(const gr_node *n, int32_t *pc, int32_t *x, uint8_t b) {
    static const char stop[] = GR_RAW_STOP;
    const int slen = (int)sizeof stop - 1;
    int full = n->a >= 0 && *x >= n->a;
    if (*pc >= R_STOP) {
        int k = *pc - R_STOP;
        if ((uint8_t)stop[k] != b) return -1;
        *pc = k + 1 == slen ? T_DONE : *pc + 1;
        return 0;
    }
    switch (*pc) {
    case R_NLLT:
        if (b == '/') { *pc = R_STOP + 3; return 0; }
        if (b == 'p') return -1;
        break; /* "\n<" was content */
    case R_LT:
        if (b == '/' || b == 'p') return -1;
        break;
    case R_NL:
        if (b == '<') { *pc = R_NLLT; return 0; }
        break;
    default:
        break;
    }
    /* b is a content byte */
    if (full && !(b == '\n' && *pc != R_NL)) return -1; /* past the limit: only the stop's newline */
    (*x)++;
    *pc = b == '\n' ? R_NL : b == '<' ? R_LT : R_BODY;
    return 0;
}

int gr_re(gr_grammar *g, const char *re, size_t len, int json_string, int search, int min_cp, int max_cp, char *err,
          size_t errn) {
    gr_dfa d;
    if (gr_regex_dfa(re, len, json_string, search, &d, err, errn)) return -1;
    if (min_cp > 0 || max_cp >= 0) { /* steps must leave a completion within the bounds */
        const char *why = gr_dfa_lengths(&d) ? "too complex to combine with minLength / maxLength (over 1024 states)"
                        : (max_cp >= 0 && d.dmin[0] > max_cp) || d.dmax[0] < min_cp
                            ? "no match has a length within minLength / maxLength" : NULL;
        if (why) {
            snprintf(err, errn, "%s", why);
            gr_dfa_free(&d);
            return -1;
        }
    }
    g->dfas = xrealloc(g->dfas, (size_t)(g->n_dfas + 1) * sizeof *g->dfas);
    g->dfas[g->n_dfas] = d;
    return gr_add(g, GN_RE, g->n_dfas++, min_cp, max_cp, 0, 0, 0);
}

int gr_re_step(const gr_grammar *g, const gr_node *n, int32_t *pc, int32_t *x, uint8_t b) {
    const gr_dfa *d = &g->dfas[n->a];
    int32_t q = d->next[(size_t)*pc * 256 + b];
    if (q < 0) return -1;
    int32_t nx = *x + ((b & 0xC0) != 0x80); /* a code point starts */
    if (n->c >= 0 && nx > n->c) return -1;
    /* with length bounds, only steps after which a completion still fits them */
    if (d->dmin && ((n->c >= 0 && nx + d->dmin[q] > n->c) || (d->dmax[q] < GR_LEN_INF && nx + d->dmax[q] < n->b)))
        return -1;
    *pc = q;
    *x = nx;
    return 0;
}

int gr_re_can_end(const gr_grammar *g, const gr_node *n, int32_t pc, int32_t x) {
    return g->dfas[n->a].accept[pc] && x >= n->b;
}

int gr_re_more(const gr_grammar *g, const gr_node *n, int32_t pc, int32_t x) {
    const gr_dfa *d = &g->dfas[n->a];
    return d->more[pc] && (n->c < 0 || x < n->c || d->cont[pc]); /* a code point under way may finish */
}

int gr_term_step(const gr_grammar *g, int node, int32_t *pc, int32_t *x, uint8_t b) {
    const gr_node *n = &g->nodes[node];
    switch (n->kind) {
    case GN_LIT:
        if (*pc >= n->b || (uint8_t)g->bytes[n->a + *pc] != b) return -1;
        (*pc)++;
        return 0;
    case GN_STR: return gr_str_step(n, pc, x, b);
    case GN_NUM: return num_step(n, pc, x, b);
    case GN_WS:
        if (*x >= n->a || !(b == ' ' || b == '\n' || b == '\t')) return -1;
        (*x)++;
        return 0;
    case GN_RAW: return gr_raw_step(n, pc, x, b);
    case GN_RE: return gr_re_step(g, n, pc, x, b);
    }
    return -1;
}

/* ==== stacks ================================================================== */

static int32_t new_frame(gr_pool *p, int node, int pc, int x, int32_t up) {
    int depth = up < 0 ? 1 : p->f[up].depth + 1;
    if (depth > GR_MAX_DEPTH) return -2;
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 1024;
        p->f = xrealloc(p->f, (size_t)p->cap * sizeof *p->f);
    }
    p->f[p->n] = (gr_frame){node, pc, x, up, depth};
    return p->n++;
}

int32_t gr_push(gr_pool *p, const gr_grammar *g, int node, int32_t up) {
    (void)g;
    return new_frame(p, node, 0, 0, up);
}

static int same_stack(const gr_pool *p, int32_t a, int32_t b) {
    while (a != b) {
        if (a < 0 || b < 0) return 0;
        const gr_frame *x = &p->f[a], *y = &p->f[b];
        if (x->node != y->node || x->pc != y->pc || x->x != y->x || x->depth != y->depth) return 0;
        a = x->up;
        b = y->up;
    }
    return 1;
}

static void set_add(const gr_pool *p, gr_set *s, int32_t top) {
    for (int i = 0; i < s->n; i++)
        if (same_stack(p, s->tops[i], top)) return;
    if (s->n < GR_MAX_SET) s->tops[s->n++] = top;
}

typedef struct cl_ctx { const gr_grammar *g; gr_pool *p; gr_set *out; int budget; } cl_ctx;

static void closure(cl_ctx *c, int32_t top) {
    if (top == -2 || --c->budget < 0) return; /* too deep, or too much work: branch dropped */
    if (top < 0) { c->out->accept = 1; return; }
    const gr_grammar *g = c->g;
    gr_frame f = c->p->f[top];
    const gr_node *n = &g->nodes[f.node];
    switch (n->kind) {
    case GN_SEQ: {
        if (f.pc >= n->b) { closure(c, f.up); return; }
        int kid = g->kids[n->a + f.pc];
        /* the last child replaces the sequence (right recursion runs in constant depth) */
        int32_t base = f.pc == n->b - 1 ? f.up : new_frame(c->p, f.node, f.pc + 1, 0, f.up);
        if (base == -2) return;
        closure(c, new_frame(c->p, kid, 0, 0, base));
        return;
    }
    case GN_ALT:
        for (int i = 0; i < n->b; i++) closure(c, new_frame(c->p, g->kids[n->a + i], 0, 0, f.up));
        return;
    case GN_REF:
        closure(c, new_frame(c->p, n->a, 0, 0, f.up));
        return;
    case GN_ARR: {
        int count = f.pc;
        if (count >= n->d) closure(c, f.up);
        if (n->e >= 0 && count >= n->e) return;
        int elem = count < n->b ? g->kids[n->a + count] : n->c;
        if (elem < 0) return;
        int32_t base = new_frame(c->p, f.node, count + 1, 0, f.up);
        if (base == -2) return;
        int32_t t = new_frame(c->p, elem, 0, 0, base);
        if (t >= 0 && count > 0 && n->f >= 0) t = new_frame(c->p, n->f, 0, 0, t);
        closure(c, t);
        return;
    }
    case GN_LIT:
        if (f.pc >= n->b) closure(c, f.up);
        else set_add(c->p, c->out, top);
        return;
    case GN_WS:
        if (f.x < n->a) set_add(c->p, c->out, top);
        closure(c, f.up);
        return;
    case GN_STR:
    case GN_RAW:
        if (f.pc == T_DONE) closure(c, f.up);
        else set_add(c->p, c->out, top);
        return;
    case GN_NUM:
        if (num_more(n, f.pc, f.x)) set_add(c->p, c->out, top);
        if (num_can_end(f.pc)) closure(c, f.up);
        return;
    case GN_RE:
        if (gr_re_more(g, n, f.pc, f.x)) set_add(c->p, c->out, top);
        if (gr_re_can_end(g, n, f.pc, f.x)) closure(c, f.up);
        return;
    }
}

void gr_closure(const gr_grammar *g, gr_pool *p, int32_t top, gr_set *out) {
    cl_ctx c = {g, p, out, 4096};
    closure(&c, top);
}

void gr_advance(const gr_grammar *g, gr_pool *p, const gr_set *in, uint8_t b, gr_set *out) {
    out->n = 0;
    out->accept = 0;
    cl_ctx c = {g, p, out, 4096};
    for (int i = 0; i < in->n; i++) {
        gr_frame f = p->f[in->tops[i]];
        int32_t pc = f.pc, x = f.x;
        if (gr_term_step(g, f.node, &pc, &x, b) < 0) continue;
        int32_t nt = new_frame(p, f.node, pc, x, f.up);
        closure(&c, nt);
    }
}

void gr_start(const gr_grammar *g, gr_pool *p, gr_set *out) {
    out->n = 0;
    out->accept = 0;
    gr_closure(g, p, new_frame(p, g->root, 0, 0, -1), out);
}

int gr_cache_key(const gr_grammar *g, const gr_frame *f, int32_t *pc, int32_t *x) {
    const gr_node *n = &g->nodes[f->node];
    if (n->kind == GN_STR) {
        if (f->pc == S_OPEN || f->pc == T_DONE) return 0;
        *pc = f->pc;
        /* past minLength without maxLength, the count no longer matters */
        *x = n->b < 0 && f->x > n->a ? n->a : f->x;
        return 1;
    }
    if (n->kind == GN_RE) {
        *pc = f->pc;
        /* past the minimum without a maximum, the count no longer matters */
        *x = n->c < 0 && f->x > n->b ? n->b : f->x;
        return 1;
    }
    if (n->kind == GN_RAW && f->pc < R_STOP) {
        *pc = f->pc;
        *x = n->a < 0 ? 0 : f->x;
        return 1;
    }
    return 0;
}
