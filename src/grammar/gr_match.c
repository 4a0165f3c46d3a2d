/* gr_match.c: the vocabulary trie, token masks and the per-sequence matcher.
 *
 * The vocabulary is a byte trie stored in preorder (node i's subtree is
 * [i, end[i])), so a mask is one forward sweep: each node's automaton state
 * is its parent's advanced by the node's byte, a dead state skips the whole
 * subtree, and the tokens ending at a live node are allowed.
 *
 * Inside a string (or qwen3_coder raw text) almost the whole vocabulary is
 * allowed and the sweep would visit every node; there the state below the
 * string's frame does not matter until the string closes, so the mask of
 * such a state is cached per grammar, keyed by the string frame alone
 * (node, sub-state, length so far): the tokens that stay inside the string,
 * plus the trie nodes where the string has just closed ("exits"). At run
 * time the cached bits are copied and only the exits' subtrees are swept
 * with the real stack below the string. JSON strings go one step further:
 * their walk does not depend on the grammar, so the vocabulary keeps one table
 * per string sub-state (each token's code points, the exits' counts) and a
 * string frame's entry is that table filtered by its remaining min/maxLength
 * (a 250k-id pass, no trie walk).
 *
 * Owns: the vocabulary's copies of every token's bytes and its string tables; the matcher owns its
 * frame pools and scratch. Invariants: the matcher's state is never empty
 * unless it failed; a mask is never empty (terminators when nothing else).
 */
#include "grammar/gr_int.h"

#include <stdlib.h>
#include <string.h>

#define MAX_TOKEN_BYTES 254   /* longer tokens are never allowed (none exist in real vocabularies) */
#define CACHE_MAX 256         /* cached string states per grammar */

struct gr_vocab {
    int n_vocab, words;
    char *tb;                 /* every id's bytes */
    uint32_t *toff, *tlen;    /* [n_vocab] */
    uint8_t *never;           /* [n_vocab] special, empty, too long, or outside the tokenizer */
    int n_nodes;              /* preorder trie; node 0 is the root (no byte) */
    uint8_t *nb, *nd;         /* byte, depth */
    int32_t *nend, *ntok;     /* subtree end, first token ending here (-1) */
    int32_t *tnext;           /* [n_vocab] next token with the same bytes */
    int32_t *term;
    int n_term;
    int max_depth;
    /* String tables, one per string sub-state, built on first use (under mu) and shared by
     * every grammar: with no length limits, the code points each token adds while staying
     * inside the string (STAB_OUT: it does not), and the trie nodes where the string closes
     * with the code points before the quote. A bounded string's mask is a filter of them. */
    pthread_mutex_t mu;
    struct stab { uint8_t *cnt; int32_t *exits, *exit_cnt; int n_exits; } *stab[S_F4 + 1];
    gr_centry *raw[R_NLLT + 1]; /* unbounded raw text (qwen3_coder values): whole entries */
};

#define STAB_OUT 255

/* ==== the vocabulary ============================================================ */

static int cmp_tok_bytes(const void *a, const void *b, void *ctx) {
    const gr_vocab *v = ctx;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    uint32_t lx = v->tlen[x], ly = v->tlen[y];
    int c = memcmp(v->tb + v->toff[x], v->tb + v->toff[y], lx < ly ? lx : ly);
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static void build_trie(gr_vocab *v) {
    int32_t *ids = xmalloc((size_t)v->n_vocab * sizeof *ids);
    int n = 0;
    for (int32_t i = 0; i < v->n_vocab; i++)
        if (!v->never[i]) ids[n++] = i;
    qsort_r(ids, (size_t)n, sizeof *ids, cmp_tok_bytes, v);
    size_t cap = 1024;
    v->nb = xmalloc(cap); v->nd = xmalloc(cap);
    v->nend = xmalloc(cap * sizeof(int32_t)); v->ntok = xmalloc(cap * sizeof(int32_t));
    v->tnext = xmalloc((size_t)v->n_vocab * sizeof *v->tnext);
    for (int i = 0; i < v->n_vocab; i++) v->tnext[i] = -1;
    int32_t open[MAX_TOKEN_BYTES + 2];
    int nn = 1, cur = 0;
    v->nb[0] = 0; v->nd[0] = 0; v->ntok[0] = -1;
    open[0] = 0;
    const char *prev = NULL;
    uint32_t plen = 0;
    for (int k = 0; k < n; k++) {
        int32_t id = ids[k];
        const char *s = v->tb + v->toff[id];
        uint32_t len = v->tlen[id], lcp = 0;
        while (prev && lcp < len && lcp < plen && s[lcp] == prev[lcp]) lcp++;
        for (int d = cur; d > (int)lcp; d--) v->nend[open[d]] = nn;
        cur = (int)lcp;
        for (uint32_t d = lcp + 1; d <= len; d++) {
            if ((size_t)nn == cap) {
                cap *= 2;
                v->nb = xrealloc(v->nb, cap); v->nd = xrealloc(v->nd, cap);
                v->nend = xrealloc(v->nend, cap * sizeof(int32_t));
                v->ntok = xrealloc(v->ntok, cap * sizeof(int32_t));
            }
            v->nb[nn] = (uint8_t)s[d - 1];
            v->nd[nn] = (uint8_t)d;
            v->ntok[nn] = -1;
            open[d] = nn++;
            cur = (int)d;
        }
        /* tokens sharing these bytes are chained (rare: the same bytes under two ids) */
        int32_t *slot = &v->ntok[open[len]];
        while (*slot >= 0) slot = &v->tnext[*slot];
        *slot = id;
        if ((int)len > v->max_depth) v->max_depth = (int)len;
        prev = s;
        plen = len;
    }
    for (int d = cur; d >= 0; d--) v->nend[open[d]] = nn;
    v->n_nodes = nn;
    free(ids);
}

static gr_vocab *vocab_alloc(int n_vocab, const int32_t *term, int n_term) {
    gr_vocab *v = xcalloc(1, sizeof *v);
    pthread_mutex_init(&v->mu, NULL);
    v->n_vocab = n_vocab;
    v->words = (n_vocab + 31) / 32;
    v->toff = xcalloc((size_t)n_vocab, sizeof *v->toff);
    v->tlen = xcalloc((size_t)n_vocab, sizeof *v->tlen);
    v->never = xcalloc((size_t)n_vocab, 1);
    v->term = xmalloc((size_t)(n_term + 1) * sizeof *v->term);
    for (int i = 0; i < n_term; i++)
        if (term[i] >= 0 && term[i] < n_vocab) v->term[v->n_term++] = term[i];
    return v;
}

static void vocab_finish(gr_vocab *v, buf *pool) {
    v->tb = buf_detach(pool);
    if (!v->tb) v->tb = xcalloc(1, 1);
    for (int i = 0; i < v->n_term; i++) v->never[v->term[i]] = 1; /* terminators: only by the mask's rule */
    build_trie(v);
}

gr_vocab *gr_vocab_new(const tokenizer *t, int n_vocab, const int32_t *term, int n_term) {
    gr_vocab *v = vocab_alloc(n_vocab, term, n_term);
    int nt = tok_vocab_size(t);
    buf pool;
    buf_init(&pool);
    for (int32_t id = 0; id < n_vocab; id++) {
        v->toff[id] = (uint32_t)pool.len;
        if (id >= nt || !tok_piece(t, id)) { v->never[id] = 1; continue; }
        size_t len = 0;
        const char *b = tok_token_bytes(t, id, &len);
        if (b) {
            buf_append(&pool, b, len);
        } else {
            char *d = tok_decode_n(t, &id, 1, 0, &len);
            buf_append(&pool, d ? d : "", d ? len : 0);
            free(d);
        }
        v->tlen[id] = (uint32_t)len;
        if (tok_is_special(t, id) || len == 0 || len > MAX_TOKEN_BYTES) v->never[id] = 1;
    }
    vocab_finish(v, &pool);
    return v;
}

gr_vocab *gr_vocab_from_bytes(int n, const char *const *tokens, const int *len, const uint8_t *special,
                              const int32_t *term, int n_term) {
    gr_vocab *v = vocab_alloc(n, term, n_term);
    buf pool;
    buf_init(&pool);
    for (int i = 0; i < n; i++) {
        v->toff[i] = (uint32_t)pool.len;
        buf_append(&pool, tokens[i], (size_t)len[i]);
        v->tlen[i] = (uint32_t)len[i];
        if ((special && special[i]) || len[i] == 0 || len[i] > MAX_TOKEN_BYTES) v->never[i] = 1;
    }
    vocab_finish(v, &pool);
    return v;
}

void gr_vocab_free(gr_vocab *v) {
    if (!v) return;
    for (int i = 0; i <= S_F4; i++)
        if (v->stab[i]) { free(v->stab[i]->cnt); free(v->stab[i]->exits); free(v->stab[i]->exit_cnt); free(v->stab[i]); }
    for (int i = 0; i <= R_NLLT; i++)
        if (v->raw[i]) { free(v->raw[i]->bits); free(v->raw[i]->exits); free(v->raw[i]); }
    pthread_mutex_destroy(&v->mu);
    free(v->tb); free(v->toff); free(v->tlen); free(v->never);
    free(v->nb); free(v->nd); free(v->nend); free(v->ntok); free(v->tnext); free(v->term);
    free(v);
}

int gr_vocab_size(const gr_vocab *v) { return v->n_vocab; }
int gr_mask_words(const gr_vocab *v) { return v->words; }

/* ==== the matcher ================================================================== */

struct gr_matcher {
    gr_grammar *g;
    const gr_vocab *v;
    gr_pool pool, spare;      /* the current state's frames (+ scratch during a mask or a token) */
    int32_t tops[GR_MAX_SET], tmp[GR_MAX_SET];
    gr_set cur;
    int failed, finished;
    char *gate;
    int gate_len, gate_k;
    int32_t *settops;         /* [(max_depth + 2) * GR_MAX_SET] */
    gr_set *sets;             /* [max_depth + 2] */
    int *marks;
    int last_cached;
};

gr_matcher *gr_matcher_new(gr_grammar *g, const gr_vocab *v, const char *gate) {
    gr_matcher *m = xcalloc(1, sizeof *m);
    m->g = gr_ref(g);
    m->v = v;
    m->cur.tops = m->tops;
    gr_start(g, &m->pool, &m->cur);
    if (!m->cur.n && !m->cur.accept) m->failed = 1;
    if (gate && *gate) {
        m->gate = xstrdup(gate);
        m->gate_len = (int)strlen(gate);
    }
    return m;
}

void gr_matcher_free(gr_matcher *m) {
    if (!m) return;
    gr_unref(m->g);
    free(m->pool.f); free(m->spare.f);
    free(m->gate); free(m->settops); free(m->sets); free(m->marks);
    free(m);
}

int gr_matcher_accepting(const gr_matcher *m) { return !m->failed && (m->gate_len == 0) && m->cur.accept; }
int gr_matcher_done(const gr_matcher *m) { return m->finished || (gr_matcher_accepting(m) && m->cur.n == 0); }
int gr_matcher_failed(const gr_matcher *m) { return m->failed; }
int gr_matcher_gated(const gr_matcher *m) { return m->gate_len > 0 && !m->failed; }
const gr_vocab *gr_matcher_vocab(const gr_matcher *m) { return m->v; }
int gr_matcher_last_cached(const gr_matcher *m) { return m->last_cached; }

/* Copy a stack into q (no sharing: stacks are shallow and few). */
static int32_t copy_stack(const gr_pool *p, gr_pool *q, int32_t t) {
    if (t < 0) return t;
    int32_t up = copy_stack(p, q, p->f[t].up);
    if (q->n == q->cap) {
        q->cap = q->cap ? 2 * q->cap : 1024;
        q->f = xrealloc(q->f, (size_t)q->cap * sizeof *q->f);
    }
    q->f[q->n] = p->f[t];
    q->f[q->n].up = up;
    return q->n++;
}

/* Drop the frames no live stack uses: the live stacks into the spare pool, swap. */
static void compact(gr_matcher *m) {
    m->spare.n = 0;
    for (int i = 0; i < m->cur.n; i++) m->cur.tops[i] = copy_stack(&m->pool, &m->spare, m->cur.tops[i]);
    gr_pool t = m->pool;
    m->pool = m->spare;
    m->spare = t;
}

static int feed_byte(gr_matcher *m, uint8_t b) {
    gr_set out = {m->tmp, 0, 0};
    gr_advance(m->g, &m->pool, &m->cur, b, &out);
    if (!out.n && !out.accept) { m->failed = 1; return -1; }
    memcpy(m->tops, m->tmp, (size_t)out.n * sizeof *m->tops);
    m->cur.n = out.n;
    m->cur.accept = out.accept;
    return 0;
}

/* Gate bytes: returns how many bytes of s the gate consumed (all of them until it opens). */
static size_t gate_feed(gr_matcher *m, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        int k = m->gate_k;
        /* the longest prefix of the gate that is a suffix of what was seen (gates are short) */
        for (;;) {
            if (m->gate[k] == c) { k++; break; }
            if (k == 0) break;
            int j = k - 1;
            for (; j > 0; j--)
                if (!memcmp(m->gate, m->gate + (k - j), (size_t)j)) break;
            k = j;
        }
        m->gate_k = k;
        if (k == m->gate_len) {
            m->gate_len = 0;
            return i + 1;
        }
    }
    return n;
}

int gr_matcher_feed(gr_matcher *m, const char *s, size_t n) {
    if (m->failed) return -1;
    if (m->gate_len) {
        size_t k = gate_feed(m, s, n);
        s += k;
        n -= k;
    }
    for (size_t i = 0; i < n; i++)
        if (feed_byte(m, (uint8_t)s[i]) < 0) return -1;
    compact(m);
    return 0;
}

static int is_term(const gr_vocab *v, int32_t id) {
    for (int i = 0; i < v->n_term; i++) if (v->term[i] == id) return 1;
    return 0;
}

int gr_matcher_accept_token(gr_matcher *m, int32_t id) {
    const gr_vocab *v = m->v;
    if (m->failed || id < 0 || id >= v->n_vocab) { m->failed = 1; return -1; }
    if (m->gate_len) {
        gr_matcher_feed(m, v->tb + v->toff[id], v->tlen[id]);
        return m->failed ? -1 : 0;
    }
    if (is_term(v, id)) {
        if (!m->cur.accept) { m->failed = 1; return -1; }
        m->finished = 1;
        return 0;
    }
    if (v->never[id]) { m->failed = 1; return -1; }
    return gr_matcher_feed(m, v->tb + v->toff[id], v->tlen[id]);
}

/* ---- masks ---------------------------------------------------------------------------- */

static inline void set_toks(const gr_vocab *v, int node, uint32_t *bits) {
    for (int32_t t = v->ntok[node]; t >= 0; t = v->tnext[t]) bits[t >> 5] |= 1u << (t & 31);
}

/* Sweep nodes [first, last) (all deeper than d0) from state st0 (in m->pool). */
static void sweep(gr_matcher *m, int first, int last, int d0, const gr_set *st0, uint32_t *bits) {
    const gr_vocab *v = m->v;
    gr_set *sets = m->sets;
    sets[d0].n = st0->n;
    sets[d0].accept = st0->accept;
    memcpy(sets[d0].tops, st0->tops, (size_t)st0->n * sizeof *st0->tops);
    m->marks[d0] = m->pool.n;
    for (int i = first; i < last;) {
        int d = v->nd[i];
        m->pool.n = m->marks[d - 1];
        const gr_set *par = &sets[d - 1];
        if (!par->n) { i = v->nend[i]; continue; }
        gr_set *s = &sets[d];
        gr_advance(m->g, &m->pool, par, v->nb[i], s);
        if (!s->n && !s->accept) { i = v->nend[i]; continue; }
        m->marks[d] = m->pool.n;
        set_toks(v, i, bits);
        i++;
    }
}

/* The string table of sub-state pc0 (see struct gr_vocab): one sweep of the trie
 * with a private (pc, count) per depth. */
static const struct stab *stab_get(gr_vocab *vm, int pc0) {
    pthread_mutex_lock(&vm->mu);
    struct stab *t = vm->stab[pc0];
    if (t) { pthread_mutex_unlock(&vm->mu); return t; }
    const gr_vocab *v = vm;
    t = xcalloc(1, sizeof *t);
    t->cnt = xmalloc((size_t)v->n_vocab);
    memset(t->cnt, STAB_OUT, (size_t)v->n_vocab);
    int cap = 1024;
    t->exits = xmalloc((size_t)cap * sizeof *t->exits);
    t->exit_cnt = xmalloc((size_t)cap * sizeof *t->exit_cnt);
    const gr_node free_str = {GN_STR, 0, -1, 0, 0, 0, 0};
    int32_t pcs[MAX_TOKEN_BYTES + 2], xs[MAX_TOKEN_BYTES + 2];
    pcs[0] = pc0;
    xs[0] = 0;
    for (int i = 1; i < v->n_nodes;) {
        int d = v->nd[i];
        int32_t pc = pcs[d - 1], x = xs[d - 1];
        if (gr_str_step(&free_str, &pc, &x, v->nb[i]) < 0) { i = v->nend[i]; continue; }
        if (pc == T_DONE) {
            if (t->n_exits == cap) {
                cap *= 2;
                t->exits = xrealloc(t->exits, (size_t)cap * sizeof *t->exits);
                t->exit_cnt = xrealloc(t->exit_cnt, (size_t)cap * sizeof *t->exit_cnt);
            }
            t->exits[t->n_exits] = i;
            t->exit_cnt[t->n_exits++] = x;
            i = v->nend[i];
            continue;
        }
        pcs[d] = pc;
        xs[d] = x;
        for (int32_t k = v->ntok[i]; k >= 0; k = v->tnext[k]) t->cnt[k] = (uint8_t)x;
        i++;
    }
    vm->stab[pc0] = t;
    pthread_mutex_unlock(&vm->mu);
    return t;
}

/* A string frame's entry: the shared table filtered by what is left of the
 * node's minLength / maxLength after x code points. */
static gr_centry *centry_str(const gr_grammar *g, const gr_vocab *v, int node, int32_t pc0, int32_t x0) {
    const gr_node *n = &g->nodes[node];
    const struct stab *t = stab_get((gr_vocab *)v, pc0);
    int rem = n->b < 0 ? STAB_OUT - 1 : n->b - x0, need = n->a - x0;
    gr_centry *c = xcalloc(1, sizeof *c);
    c->node = node; c->pc = pc0; c->x = x0;
    c->bits = xcalloc((size_t)v->words, sizeof *c->bits);
    for (int i = 0; i < v->n_vocab; i++)
        if (t->cnt[i] <= rem) c->bits[i >> 5] |= 1u << (i & 31);
    c->exits = xmalloc((size_t)(t->n_exits + 1) * sizeof *c->exits);
    for (int k = 0; k < t->n_exits; k++)
        if (t->exit_cnt[k] >= need && t->exit_cnt[k] <= rem) c->exits[c->n_exits++] = t->exits[k];
    return c;
}

/* The cached mask of a lone string / raw-text frame: one sweep with a
 * private (pc, x) per depth, no stacks. */
static gr_centry *centry_walk(const gr_node *n, const gr_vocab *v, int node, int32_t pc0, int32_t x0);

/* A regex frame's entry: the tokens whose bytes the DFA takes, and as exits every trie
 * node where it may end (the token's rest, if any, then belongs to what follows). */
static gr_centry *centry_new(const gr_vocab *v, int node, int32_t pc0, int32_t x0, int *cap) {
    gr_centry *c = xcalloc(1, sizeof *c);
    c->node = node; c->pc = pc0; c->x = x0;
    c->bits = xcalloc((size_t)v->words, sizeof *c->bits);
    *cap = 256;
    c->exits = xmalloc((size_t)*cap * sizeof *c->exits);
    return c;
}

static void centry_exit(gr_centry *c, int *cap, int node) {
    if (c->n_exits == *cap) c->exits = xrealloc(c->exits, (size_t)(*cap *= 2) * sizeof *c->exits);
    c->exits[c->n_exits++] = node;
}

static gr_centry *centry_re(const gr_grammar *g, const gr_vocab *v, int node, int32_t pc0, int32_t x0) {
    const gr_node *n = &g->nodes[node];
    int cap;
    gr_centry *c = centry_new(v, node, pc0, x0, &cap);
    int32_t pcs[MAX_TOKEN_BYTES + 2], xs[MAX_TOKEN_BYTES + 2];
    pcs[0] = pc0;
    xs[0] = x0;
    for (int i = 1; i < v->n_nodes;) {
        int d = v->nd[i];
        int32_t pc = pcs[d - 1], x = xs[d - 1];
        if (gr_re_step(g, n, &pc, &x, v->nb[i]) < 0) { i = v->nend[i]; continue; }
        int end = gr_re_can_end(g, n, pc, x), more = gr_re_more(g, n, pc, x);
        if (!end && !more) { i = v->nend[i]; continue; } /* a dead end (length bounds) */
        if (end) centry_exit(c, &cap, i);
        set_toks(v, i, c->bits); /* inside the regex, a state that can still finish */
        if (!more) { i = v->nend[i]; continue; }
        pcs[d] = pc;
        xs[d] = x;
        i++;
    }
    return c;
}

static gr_centry *centry_build(const gr_grammar *g, const gr_vocab *v, int node, int32_t pc0, int32_t x0) {
    if (g->nodes[node].kind == GN_STR) return centry_str(g, v, node, pc0, x0);
    if (g->nodes[node].kind == GN_RE) return centry_re(g, v, node, pc0, x0);
    return centry_walk(&g->nodes[node], v, node, pc0, x0);
}

/* The entry of unbounded raw text in sub-state pc, kept by the vocabulary. */
static const gr_centry *raw_get(gr_vocab *v, int pc) {
    pthread_mutex_lock(&v->mu);
    if (!v->raw[pc]) {
        const gr_node free_raw = {GN_RAW, -1, 0, 0, 0, 0, 0};
        v->raw[pc] = centry_walk(&free_raw, v, -1, pc, 0);
    }
    gr_centry *c = v->raw[pc];
    pthread_mutex_unlock(&v->mu);
    return c;
}

static gr_centry *centry_walk(const gr_node *n, const gr_vocab *v, int node, int32_t pc0, int32_t x0) {
    int cap;
    gr_centry *c = centry_new(v, node, pc0, x0, &cap);
    int32_t pcs[MAX_TOKEN_BYTES + 2], xs[MAX_TOKEN_BYTES + 2];
    pcs[0] = pc0;
    xs[0] = x0;
    for (int i = 1; i < v->n_nodes;) {
        int d = v->nd[i];
        int32_t pc = pcs[d - 1], x = xs[d - 1];
        int st = n->kind == GN_STR ? gr_str_step(n, &pc, &x, v->nb[i]) : gr_raw_step(n, &pc, &x, v->nb[i]);
        if (st < 0) { i = v->nend[i]; continue; }
        if (pc == T_DONE) {
            centry_exit(c, &cap, i);
            i = v->nend[i];
            continue;
        }
        pcs[d] = pc;
        xs[d] = x;
        set_toks(v, i, c->bits);
        i++;
    }
    return c;
}

static void centry_free(gr_centry *c) {
    if (!c) return;
    free(c->bits); free(c->exits); free(c);
}

/* The cache entry for a lone frame (found or built; *owned = 1 when the
 * caller must free it because the cache is full or bound to another vocabulary). */
static gr_centry *cache_get(gr_grammar *g, const gr_vocab *v, int node, int32_t pc, int32_t x, int *owned) {
    *owned = 0;
    pthread_mutex_lock(&g->mu);
    if (!g->cache_vocab) g->cache_vocab = v;
    int usable = g->cache_vocab == v;
    for (int i = 0; usable && i < g->n_cache; i++) {
        gr_centry *c = g->cache[i];
        if (c->node == node && c->pc == pc && c->x == x) { pthread_mutex_unlock(&g->mu); return c; }
    }
    pthread_mutex_unlock(&g->mu);
    gr_centry *c = centry_build(g, v, node, pc, x);
    pthread_mutex_lock(&g->mu);
    if (!usable || g->n_cache >= CACHE_MAX) {
        *owned = 1;
    } else {
        for (int i = 0; i < g->n_cache; i++) {
            gr_centry *o = g->cache[i];
            if (o->node == node && o->pc == pc && o->x == x) { /* built twice in parallel */
                centry_free(c);
                c = o;
                goto out;
            }
        }
        if (g->n_cache == g->cap_cache) {
            g->cap_cache = g->cap_cache ? 2 * g->cap_cache : 16;
            g->cache = xrealloc(g->cache, (size_t)g->cap_cache * sizeof *g->cache);
        }
        g->cache[g->n_cache++] = c;
    }
out:
    pthread_mutex_unlock(&g->mu);
    return c;
}

/* OR into bits the mask of the lone stack top, whose top frame is a string /
 * raw-text frame with cache key (pc, x). */
static void mask_cached(gr_matcher *m, int32_t top, int32_t pc, int32_t x, uint32_t *bits) {
    const gr_vocab *v = m->v;
    const gr_frame *f = &m->pool.f[top];
    const gr_node *fn = &m->g->nodes[f->node];
    int owned = 0;
    const gr_centry *c = fn->kind == GN_RAW && fn->a < 0 ? raw_get((gr_vocab *)v, pc)
                       : cache_get(m->g, v, f->node, pc, x, &owned);
    for (int w = 0; w < v->words; w++) bits[w] |= c->bits[w];
    /* below the string: what may follow it */
    int32_t below[GR_MAX_SET];
    gr_set after = {below, 0, 0};
    gr_closure(m->g, &m->pool, f->up, &after);
    if (after.n || after.accept)
        for (int k = 0; k < c->n_exits; k++) {
            int e = c->exits[k];
            set_toks(v, e, bits);
            if (after.n) sweep(m, e + 1, v->nend[e], v->nd[e], &after, bits);
        }
    if (owned) centry_free((gr_centry *)c);
}

int gr_matcher_fill_mask(gr_matcher *m, uint32_t *bits) {
    const gr_vocab *v = m->v;
    m->last_cached = 0;
    if (m->gate_len && !m->failed) return 0;
    if (!m->sets) { /* the sweep's per-depth scratch, on the first mask */
        int nd = v->max_depth + 2;
        m->settops = xmalloc((size_t)nd * GR_MAX_SET * sizeof *m->settops);
        m->sets = xcalloc((size_t)nd, sizeof *m->sets);
        m->marks = xcalloc((size_t)nd, sizeof *m->marks);
        for (int d = 0; d < nd; d++) m->sets[d].tops = m->settops + (size_t)d * GR_MAX_SET;
    }
    memset(bits, 0, (size_t)v->words * sizeof *bits);
    if (!m->failed && !m->finished) {
        /* The state is a set of alternative stacks and a token is allowed when one of them
         * takes it: the mask is the union of the stacks' masks. A stack whose top is a
         * string / raw-text frame takes its cached entry; the others share one sweep. */
        int mark = m->pool.n, n_plain = 0;
        int32_t plain[GR_MAX_SET];
        for (int i = 0; i < m->cur.n; i++) {
            int32_t pc, x;
            if (gr_cache_key(m->g, &m->pool.f[m->cur.tops[i]], &pc, &x)) {
                mask_cached(m, m->cur.tops[i], pc, x, bits);
                m->last_cached = 1;
            } else {
                plain[n_plain++] = m->cur.tops[i];
            }
        }
        if (n_plain) {
            gr_set ps = {plain, n_plain, 0};
            sweep(m, 1, v->n_nodes, 0, &ps, bits);
        }
        m->pool.n = mark;
    }
    for (int i = 0; i < v->n_term; i++) bits[v->term[i] >> 5] &= ~(1u << (v->term[i] & 31));
    int any = 0;
    for (int i = 0; i < v->words && !any; i++) any = bits[i] != 0;
    if (gr_matcher_accepting(m) || m->finished || m->failed || !any)
        for (int i = 0; i < v->n_term; i++) bits[v->term[i] >> 5] |= 1u << (v->term[i] & 31);
    return 1;
}
