/* bpe.c: the BPE model of a tokenizer: string and merge hash tables, the merge
 * loop and the word cache.
 *
 * Owns: nothing global; the tables and the cache live in the tokenizer.
 * Merge loop (HF tokenizers `Word::merge_all`): symbols form a doubly linked
 * list over an array; a binary min-heap holds candidate merges keyed by
 * (rank, position). A popped entry is applied only if its left symbol is still
 * alive, has a right neighbour, and the pair there still merges into the same
 * id; this gives "lowest rank first, leftmost on ties" in O(n log n).
 * Cache: TOK_CACHE_SHARDS independent shards, each a mutex-protected open
 * addressing table over a bump pool; a full shard is simply cleared. Results
 * never depend on the cache.
 */
#include "tok/tok_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---- hashing and the string map ------------------------------------------- */

uint64_t tok_hash(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ v) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    uint64_t v = 0;
    memcpy(&v, s, n);
    h = (h ^ v) * 0x94d049bb133111ebull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}

void tok_map_init(tok_map *m, size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2) cap <<= 1;
    m->slots = xcalloc(cap, sizeof *m->slots);
    m->mask = (uint32_t)(cap - 1);
    m->count = 0;
}

void tok_map_free(tok_map *m) {
    free(m->slots);
    memset(m, 0, sizeof *m);
}

static void map_grow(tok_map *m) {
    tok_map bigger;
    tok_map_init(&bigger, (size_t)(m->mask + 1));
    for (uint32_t i = 0; i <= m->mask; i++) {
        tok_map_ent *e = &m->slots[i];
        if (!e->key) continue;
        uint32_t j = e->hash & bigger.mask;
        while (bigger.slots[j].key) j = (j + 1) & bigger.mask;
        bigger.slots[j] = *e;
        bigger.count++;
    }
    free(m->slots);
    *m = bigger;
}

void tok_map_put(tok_map *m, const char *key, uint32_t len, int32_t val) {
    if ((m->count + 1) * 2 > m->mask + 1) map_grow(m);
    uint32_t h = (uint32_t)tok_hash(key, len);
    uint32_t j = h & m->mask;
    for (;;) {
        tok_map_ent *e = &m->slots[j];
        if (!e->key) {
            e->key = key;
            e->len = len;
            e->hash = h;
            e->val = val;
            m->count++;
            return;
        }
        if (e->hash == h && e->len == len && !memcmp(e->key, key, len)) {
            e->val = val;
            return;
        }
        j = (j + 1) & m->mask;
    }
}

int32_t tok_map_get(const tok_map *m, const char *key, size_t len) {
    return tok_map_get_h(m, key, len, tok_hash(key, len));
}

int32_t tok_map_get_h(const tok_map *m, const char *key, size_t len, uint64_t hash) {
    if (!m->slots) return -1;
    uint32_t h = (uint32_t)hash;
    uint32_t j = h & m->mask;
    for (;;) {
        const tok_map_ent *e = &m->slots[j];
        if (!e->key) return -1;
        if (e->hash == h && e->len == len && !memcmp(e->key, key, len)) return e->val;
        j = (j + 1) & m->mask;
    }
}

/* ---- merges ------------------------------------------------------------------ */

static inline uint64_t merge_slot(uint64_t key, uint64_t mask) {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return (h ^ (h >> 29)) & mask;
}

void tok_merges_init(tok_merges *mg, size_t expected) {
    size_t cap = 16;
    while (cap < expected * 2) cap <<= 1;
    mg->slots = xmalloc(cap * sizeof *mg->slots);
    for (size_t i = 0; i < cap; i++) mg->slots[i].key = UINT64_MAX;
    mg->mask = cap - 1;
    mg->count = 0;
}

void tok_merges_free(tok_merges *mg) {
    free(mg->slots);
    memset(mg, 0, sizeof *mg);
}

/* A later duplicate pair overwrites the earlier one, as HF's HashMap collect does. */
void tok_merges_put(tok_merges *mg, int32_t a, int32_t b, uint32_t rank, int32_t id) {
    CHECK((mg->count + 1) * 2 <= mg->mask + 1);
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint64_t j = merge_slot(key, mg->mask);
    while (mg->slots[j].key != UINT64_MAX && mg->slots[j].key != key) j = (j + 1) & mg->mask;
    if (mg->slots[j].key == UINT64_MAX) mg->count++;
    mg->slots[j].key = key;
    mg->slots[j].rank = rank;
    mg->slots[j].id = id;
}

static inline const tok_merge_ent *merges_get(const tok_merges *mg, int32_t a, int32_t b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    uint64_t j = merge_slot(key, mg->mask);
    for (;;) {
        const tok_merge_ent *e = &mg->slots[j];
        if (e->key == key) return e;
        if (e->key == UINT64_MAX) return NULL;
        j = (j + 1) & mg->mask;
    }
}

/* ---- word cache ------------------------------------------------------------- */

#define TOK_CACHE_SLOTS 2048u
#define TOK_CACHE_POOL (64u << 10)

void tok_cache_init(tokenizer *t) {
    for (int i = 0; i < TOK_CACHE_SHARDS; i++) {
        memset(&t->cache[i], 0, sizeof t->cache[i]);
        pthread_mutex_init(&t->cache[i].mu, NULL);
    }
}

void tok_cache_free(tokenizer *t) {
    for (int i = 0; i < TOK_CACHE_SHARDS; i++) {
        tok_cache_shard *c = &t->cache[i];
        free(c->slots);
        free(c->hashes);
        free(c->pool);
        pthread_mutex_destroy(&c->mu);
    }
}

void tok_cache_clear(const tokenizer *t) {
    for (int i = 0; i < TOK_CACHE_SHARDS; i++) {
        tok_cache_shard *c = (tok_cache_shard *)&t->cache[i];
        pthread_mutex_lock(&c->mu);
        if (c->slots) memset(c->slots, 0, TOK_CACHE_SLOTS * sizeof *c->slots);
        c->used = c->count = 0;
        pthread_mutex_unlock(&c->mu);
    }
}

/* Entry layout in the pool: u16 klen, u16 nids, key bytes, padding to 4, int32 ids. */
static inline size_t cache_ids_off(size_t klen) { return (4 + klen + 3) & ~(size_t)3; }

/* Appends the cached ids to *ids on a hit; returns 1 on a hit. */
static int cache_get(const tokenizer *t, uint64_t h, const char *w, size_t n,
                     int32_t **ids, size_t *nids, size_t *cap) {
    tok_cache_shard *c = (tok_cache_shard *)&t->cache[h >> 58];
    int hit = 0;
    pthread_mutex_lock(&c->mu);
    if (c->slots) {
        uint32_t j = (uint32_t)h & (TOK_CACHE_SLOTS - 1);
        for (;;) {
            uint32_t o = c->slots[j];
            if (!o) break;
            if (c->hashes[j] == h) {
                const char *e = c->pool + (o - 1);
                uint16_t klen, cnt;
                memcpy(&klen, e, 2);
                memcpy(&cnt, e + 2, 2);
                if (klen == n && !memcmp(e + 4, w, n)) {
                    if (*nids + cnt > *cap) {
                        *cap = (*nids + cnt) * 2;
                        *ids = xrealloc(*ids, *cap * sizeof **ids);
                    }
                    memcpy(*ids + *nids, e + cache_ids_off(klen), cnt * sizeof(int32_t));
                    *nids += cnt;
                    hit = 1;
                    break;
                }
            }
            j = (j + 1) & (TOK_CACHE_SLOTS - 1);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return hit;
}

static void cache_put(const tokenizer *t, uint64_t h, const char *w, size_t n, const int32_t *ids, size_t cnt) {
    tok_cache_shard *c = (tok_cache_shard *)&t->cache[h >> 58];
    size_t need = cache_ids_off(n) + cnt * sizeof(int32_t);
    if (cnt > UINT16_MAX || need > TOK_CACHE_POOL / 4) return;
    pthread_mutex_lock(&c->mu);
    if (!c->slots) {
        c->slots = xcalloc(TOK_CACHE_SLOTS, sizeof *c->slots);
        c->hashes = xmalloc(TOK_CACHE_SLOTS * sizeof *c->hashes);
        c->pool = xmalloc(TOK_CACHE_POOL);
    }
    if (c->used + need > TOK_CACHE_POOL || (c->count + 1) * 2 > TOK_CACHE_SLOTS) {
        memset(c->slots, 0, TOK_CACHE_SLOTS * sizeof *c->slots);
        c->used = c->count = 0;
    }
    uint32_t j = (uint32_t)h & (TOK_CACHE_SLOTS - 1);
    while (c->slots[j]) {
        if (c->hashes[j] == h) {
            /* Another thread inserted it meanwhile (or a 64-bit collision): keep the table as is. */
            pthread_mutex_unlock(&c->mu);
            return;
        }
        j = (j + 1) & (TOK_CACHE_SLOTS - 1);
    }
    char *e = c->pool + c->used;
    uint16_t klen = (uint16_t)n, cn = (uint16_t)cnt;
    memcpy(e, &klen, 2);
    memcpy(e + 2, &cn, 2);
    memcpy(e + 4, w, n);
    memcpy(e + cache_ids_off(n), ids, cnt * sizeof(int32_t));
    c->slots[j] = c->used + 1;
    c->hashes[j] = h;
    c->used += (uint32_t)((need + 3) & ~(size_t)3);
    c->count++;
    pthread_mutex_unlock(&c->mu);
}

/* ---- merge loop ----------------------------------------------------------- */

typedef struct sym {
    int32_t id;
    int32_t prev, next; /* -1: none */
    int32_t alive;
} sym;

typedef struct cand {
    uint32_t rank;
    int32_t pos;
    int32_t id;
} cand;

static inline int cand_less(const cand *a, const cand *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(cand *h, int *n, cand c) {
    int i = (*n)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (!cand_less(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static cand heap_pop(cand *h, int *n) {
    cand top = h[0], last = h[--(*n)];
    int i = 0;
    for (;;) {
        int l = 2 * i + 1;
        if (l >= *n) break;
        int m = (l + 1 < *n && cand_less(&h[l + 1], &h[l])) ? l + 1 : l;
        if (!cand_less(&h[m], &last)) break;
        h[i] = h[m];
        i = m;
    }
    if (*n > 0) h[i] = last;
    return top;
}

/* Merge ids[0..n) in place; returns the new count. */
static int merge_all(const tok_merges *mg, int32_t *ids, int n) {
    if (n < 2) return n;
    sym sbuf[128];
    cand hbuf[256];
    sym *s = n <= 128 ? sbuf : xmalloc(n * sizeof *s);
    /* Each merge pushes at most 2 candidates; n - 1 initial + 2 (n - 1) merges. */
    int hcap = 3 * n;
    cand *h = hcap <= 256 ? hbuf : xmalloc(hcap * sizeof *h);
    int hn = 0;
    for (int i = 0; i < n; i++) {
        s[i].id = ids[i];
        s[i].prev = i - 1;
        s[i].next = i + 1 < n ? i + 1 : -1;
        s[i].alive = 1;
    }
    for (int i = 0; i + 1 < n; i++) {
        const tok_merge_ent *m = merges_get(mg, ids[i], ids[i + 1]);
        if (m) heap_push(h, &hn, (cand){m->rank, i, m->id});
    }
    while (hn > 0) {
        cand top = heap_pop(h, &hn);
        sym *l = &s[top.pos];
        if (!l->alive || l->next < 0) continue;
        sym *r = &s[l->next];
        const tok_merge_ent *m = merges_get(mg, l->id, r->id);
        if (!m || m->id != top.id) continue;
        l->id = top.id;
        l->next = r->next;
        r->alive = 0;
        if (r->next >= 0) s[r->next].prev = top.pos;
        if (l->prev >= 0) {
            const tok_merge_ent *pm = merges_get(mg, s[l->prev].id, l->id);
            if (pm) heap_push(h, &hn, (cand){pm->rank, l->prev, pm->id});
        }
        if (l->next >= 0) {
            const tok_merge_ent *nm = merges_get(mg, l->id, s[l->next].id);
            if (nm) heap_push(h, &hn, (cand){nm->rank, top.pos, nm->id});
        }
    }
    int k = 0;
    for (int i = 0; i >= 0; i = s[i].next) ids[k++] = s[i].id;
    if (s != sbuf) free(s);
    if (h != hbuf) free(h);
    return k;
}

/* ---- a word -> ids ------------------------------------------------------------ */

static inline void push_id(int32_t **ids, size_t *n, size_t *cap, int32_t id) {
    if (*n == *cap) {
        *cap = *cap ? *cap * 2 : 64;
        *ids = xrealloc(*ids, *cap * sizeof **ids);
    }
    (*ids)[(*n)++] = id;
}

/* The model's view of a word: byte mode maps every byte to its ByteLevel char. */
static void model_string(const tokenizer *t, const char *w, size_t n, buf *out) {
    out->len = 0;
    if (!t->byte_mode) {
        buf_append(out, w, n);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        char tmp[4];
        int k = tok_utf8_enc(tok_byte_to_cp[(unsigned char)w[i]], tmp);
        buf_append(out, tmp, k);
    }
}

/* HF BPE::merge_word's symbol construction over the model string ms: each char
 * (with continuing_subword_prefix / end_of_word_suffix), else byte fallback,
 * else unk (fused or not), else dropped. */
static void initial_symbols_generic(const tokenizer *t, const char *ms, size_t n, int32_t **sy, size_t *ns, size_t *cap) {
    int32_t unk = -1; /* pending unk */
    buf piece;
    buf_init(&piece);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int cl = tok_utf8_dec((const unsigned char *)ms + i, &cp);
        piece.len = 0;
        if (i > 0 && t->cont_prefix) buf_puts(&piece, t->cont_prefix);
        buf_append(&piece, ms + i, cl);
        if (i + cl == n && t->eow_suffix) buf_puts(&piece, t->eow_suffix);
        i += cl;
        int32_t id = tok_map_get(&t->vocab, piece.data, piece.len);
        if (id >= 0) {
            if (unk >= 0) push_id(sy, ns, cap, unk);
            unk = -1;
            push_id(sy, ns, cap, id);
            continue;
        }
        if (t->byte_fallback) {
            bool all = true;
            for (size_t k = 0; k < piece.len; k++)
                if (t->byte_fallback_id[(unsigned char)piece.data[k]] < 0) all = false;
            if (all) {
                for (size_t k = 0; k < piece.len; k++) push_id(sy, ns, cap, t->byte_fallback_id[(unsigned char)piece.data[k]]);
                continue;
            }
        }
        if (t->unk_id >= 0) {
            if (unk >= 0 && !t->fuse_unk) push_id(sy, ns, cap, unk);
            unk = t->unk_id;
        }
    }
    if (unk >= 0) push_id(sy, ns, cap, unk);
    buf_free(&piece);
}

void tok_bpe_word(const tokenizer *t, const char *w, size_t n, int32_t **ids, size_t *nids, size_t *cap) {
    if (n == 0) return;
    if (t->ignore_merges) {
        int32_t id;
        if (t->byte_mode) {
            buf ms;
            buf_init(&ms);
            model_string(t, w, n, &ms);
            id = tok_map_get(&t->vocab, ms.data, ms.len);
            buf_free(&ms);
        } else {
            id = tok_map_get(&t->vocab, w, n);
        }
        if (id >= 0) {
            push_id(ids, nids, cap, id);
            return;
        }
    }
    uint64_t h = 0;
    bool cacheable = n <= TOK_CACHE_MAX_WORD;
    if (cacheable) {
        h = tok_hash(w, n);
        if (t->stable.count) { /* read-only: no lock */
            int32_t id = tok_map_get_h(&t->stable, w, n, h);
            if (id >= 0) {
                push_id(ids, nids, cap, id);
                return;
            }
        }
        if (cache_get(t, h, w, n, ids, nids, cap)) return;
    }
    size_t start = *nids;
    bool fast = t->byte_mode && !t->cont_prefix && !t->eow_suffix;
    if (fast) {
        if (*nids + n > *cap) {
            *cap = (*nids + n) * 2;
            *ids = xrealloc(*ids, *cap * sizeof **ids);
        }
        for (size_t i = 0; i < n; i++) {
            int32_t id = t->byte_id[(unsigned char)w[i]];
            if (id < 0) { fast = false; break; }
            (*ids)[start + i] = id;
        }
        if (fast) *nids = start + n;
    }
    if (!fast) {
        *nids = start;
        buf ms;
        buf_init(&ms);
        model_string(t, w, n, &ms);
        initial_symbols_generic(t, ms.data, ms.len, ids, nids, cap);
        buf_free(&ms);
    }
    int k = merge_all(&t->merges, *ids + start, (int)(*nids - start));
    *nids = start + k;
    if (cacheable) cache_put(t, h, w, n, *ids + start, k);
}

/* Byte mode: remember every token whose own bytes merge back into it, keyed by
 * those raw bytes (its ByteLevel-decoded piece). Most words of running text are
 * such a token, and this lookup needs no lock. */
void tok_build_stable(tokenizer *t) {
    if (!t->byte_mode || t->cont_prefix || t->eow_suffix) return;
    tok_map_init(&t->stable, t->vocab.count);
    int32_t sym[TOK_CACHE_MAX_WORD];
    for (int32_t id = 0; id < t->n_ids; id++) {
        if (!t->piece[id] || (t->flags[id] & TOKF_ADDED)) continue;
        uint32_t n = t->dec_len[id];
        const char *b = t->dec_pool + t->dec_off[id];
        if (n == 0 || n > TOK_CACHE_MAX_WORD) continue;
        bool ok = true;
        for (uint32_t i = 0; i < n && ok; i++) ok = (sym[i] = t->byte_id[(unsigned char)b[i]]) >= 0;
        if (!ok) continue;
        if (merge_all(&t->merges, sym, (int)n) == 1 && sym[0] == id) tok_map_put(&t->stable, b, n, id);
    }
}
