/* prefix.c: the prefix cache's entries, hash table, references, LRU
 * eviction and snapshot slots (see prefix.h for the model and invariants).
 *
 * Owns: the entry table and its lists. Pages and snapshot slots are plain
 * indices; the page pool (kvpool) still marks a cached page as held, the
 * cache says who may reclaim it.
 * Single-threaded: only the engine thread calls it.
 */
#include "engine/prefix.h"
#include "base/base.h"

#include <stdlib.h>
#include <string.h>

void pfx_init(pfx_cache *c, int n_pages, int page_size, int n_snap) {
    memset(c, 0, sizeof *c);
    c->page_size = page_size;
    c->cap = n_pages > 0 ? n_pages : 0;
    int cap1 = c->cap > 0 ? c->cap : 1;
    c->ent = xcalloc((size_t)cap1, sizeof *c->ent);
    c->ids = xmalloc((size_t)cap1 * (size_t)page_size * sizeof *c->ids);
    c->free_ent = xmalloc((size_t)cap1 * sizeof *c->free_ent);
    for (int i = 0; i < c->cap; i++) c->free_ent[i] = c->cap - 1 - i;
    c->n_free_ent = c->cap;
    c->n_bucket = 16;
    while (c->n_bucket < 2 * c->cap) c->n_bucket *= 2;
    c->bucket = xmalloc((size_t)c->n_bucket * sizeof *c->bucket);
    for (int i = 0; i < c->n_bucket; i++) c->bucket[i] = -1;
    c->lru_head = c->lru_tail = c->snap_head = c->snap_tail = -1;
    c->n_snap = n_snap > 0 ? n_snap : 0;
    c->snap_free = xmalloc((size_t)(c->n_snap > 0 ? c->n_snap : 1) * sizeof *c->snap_free);
    for (int i = 0; i < c->n_snap; i++) c->snap_free[i] = c->n_snap - 1 - i;
    c->n_snap_free = c->n_snap;
}

void pfx_free(pfx_cache *c) {
    free(c->ent);
    free(c->ids);
    free(c->free_ent);
    free(c->bucket);
    free(c->snap_free);
    memset(c, 0, sizeof *c);
    c->lru_head = c->lru_tail = c->snap_head = c->snap_tail = -1;
}

/* splitmix64's finaliser over the parent hash and each id */
static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
    return h;
}

uint64_t pfx_hash(const pfx_cache *c, uint64_t parent_hash, const int32_t *ids) {
    if (c->test_collide) return 42;
    uint64_t h = mix(parent_hash, 0x5bd1e995u);
    for (int i = 0; i < c->page_size; i++) h = mix(h, (uint32_t)ids[i]);
    return h;
}

static const int32_t *ent_ids(const pfx_cache *c, int32_t k) { return c->ids + (size_t)k * c->page_size; }

static int32_t find_h(const pfx_cache *c, uint64_t h, int32_t parent, const int32_t *ids) {
    for (int32_t k = c->bucket[h & (uint64_t)(c->n_bucket - 1)]; k >= 0; k = c->ent[k].hnext) {
        const pfx_ent *x = &c->ent[k];
        if (x->hash == h && x->parent == parent &&
            memcmp(ent_ids(c, k), ids, (size_t)c->page_size * sizeof *ids) == 0)
            return k;
    }
    return -1;
}

int32_t pfx_find(const pfx_cache *c, int32_t parent, const int32_t *ids) {
    if (parent >= 0 && (parent >= c->cap || !c->ent[parent].live)) return -1;
    uint64_t ph = parent >= 0 ? c->ent[parent].hash : 0;
    return find_h(c, pfx_hash(c, ph, ids), parent, ids);
}

int pfx_match(const pfx_cache *c, const int32_t *ids, int n, int need_snap, int32_t *out, int max_out) {
    int ps = c->page_size, k = 0, usable = 0;
    int32_t parent = -1;
    uint64_t h = 0;
    while (k < max_out && (k + 1) * ps <= n) {
        const int32_t *p = ids + (size_t)k * ps;
        uint64_t hk = pfx_hash(c, h, p);
        int32_t e = find_h(c, hk, parent, p);
        if (e < 0) break;
        out[k++] = e;
        if (!need_snap || c->ent[e].snap >= 0) usable = k;
        parent = e;
        h = hk;
    }
    return usable;
}

/* ---- lists ------------------------------------------------------------------ */

static void lru_unlink(pfx_cache *c, int32_t k) {
    pfx_ent *x = &c->ent[k];
    if (!x->in_lru) return;
    if (x->lprev >= 0) c->ent[x->lprev].lnext = x->lnext; else c->lru_head = x->lnext;
    if (x->lnext >= 0) c->ent[x->lnext].lprev = x->lprev; else c->lru_tail = x->lprev;
    x->lprev = x->lnext = -1;
    x->in_lru = 0;
}

/* Insert by tick, walking from the nearer end: a released leaf is the newest
 * (tail), a parent that an eviction turned into a leaf was used about when
 * its child was, which is the oldest (head). Both walks stay short. */
static void lru_insert(pfx_cache *c, int32_t k) {
    pfx_ent *x = &c->ent[k];
    int32_t after;
    uint64_t th = c->lru_head >= 0 ? c->ent[c->lru_head].tick : 0, tt = c->lru_tail >= 0 ? c->ent[c->lru_tail].tick : 0;
    if (c->lru_head >= 0 && x->tick < tt && (x->tick <= th || x->tick - th < tt - x->tick)) {
        int32_t before = c->lru_head; /* the first entry newer than x */
        while (before >= 0 && c->ent[before].tick <= x->tick) before = c->ent[before].lnext;
        after = before >= 0 ? c->ent[before].lprev : c->lru_tail;
    } else {
        after = c->lru_tail;
        while (after >= 0 && c->ent[after].tick > x->tick) after = c->ent[after].lprev;
    }
    x->lprev = after;
    x->lnext = after >= 0 ? c->ent[after].lnext : c->lru_head;
    if (x->lnext >= 0) c->ent[x->lnext].lprev = k; else c->lru_tail = k;
    if (after >= 0) c->ent[after].lnext = k; else c->lru_head = k;
    x->in_lru = 1;
}

static void snap_unlink(pfx_cache *c, int32_t k) {
    pfx_ent *x = &c->ent[k];
    if (x->sprev >= 0) c->ent[x->sprev].snext = x->snext; else c->snap_head = x->snext;
    if (x->snext >= 0) c->ent[x->snext].sprev = x->sprev; else c->snap_tail = x->sprev;
    x->sprev = x->snext = -1;
}

static void snap_push_tail(pfx_cache *c, int32_t k) {
    pfx_ent *x = &c->ent[k];
    x->snext = -1;
    x->sprev = c->snap_tail;
    if (c->snap_tail >= 0) c->ent[c->snap_tail].snext = k; else c->snap_head = k;
    c->snap_tail = k;
}

static void snap_push_head(pfx_cache *c, int32_t k) {
    pfx_ent *x = &c->ent[k];
    x->sprev = -1;
    x->snext = c->snap_head;
    if (c->snap_head >= 0) c->ent[c->snap_head].sprev = k; else c->snap_tail = k;
    c->snap_head = k;
}

/* ---- entries ---------------------------------------------------------------- */

int32_t pfx_insert(pfx_cache *c, int32_t parent, const int32_t *ids, int32_t page) {
    CHECK(c->n_free_ent > 0);
    CHECK(parent < 0 || (parent < c->cap && c->ent[parent].live));
    int32_t k = c->free_ent[--c->n_free_ent];
    pfx_ent *x = &c->ent[k];
    memset(x, 0, sizeof *x);
    x->hash = pfx_hash(c, parent >= 0 ? c->ent[parent].hash : 0, ids);
    x->parent = parent;
    x->page = page;
    x->snap = -1;
    x->depth = parent >= 0 ? c->ent[parent].depth + 1 : 0;
    x->ref = 1;
    x->tick = ++c->tick;
    x->lprev = x->lnext = x->sprev = x->snext = -1;
    x->live = 1;
    memcpy(c->ids + (size_t)k * c->page_size, ids, (size_t)c->page_size * sizeof *ids);
    size_t b = x->hash & (uint64_t)(c->n_bucket - 1);
    x->hnext = c->bucket[b];
    c->bucket[b] = k;
    if (parent >= 0) {
        pfx_ent *p = &c->ent[parent];
        if (p->n_child++ == 0) lru_unlink(c, parent);
    }
    c->n_ents++;
    return k;
}

void pfx_acquire(pfx_cache *c, int32_t k) {
    CHECK(k >= 0 && k < c->cap && c->ent[k].live);
    pfx_ent *x = &c->ent[k];
    if (x->ref++ == 0) {
        c->n_unref--;
        lru_unlink(c, k);
    }
    x->tick = ++c->tick;
}

void pfx_release(pfx_cache *c, int32_t k) {
    CHECK(k >= 0 && k < c->cap && c->ent[k].live && c->ent[k].ref > 0);
    pfx_ent *x = &c->ent[k];
    x->tick = ++c->tick;
    if (--x->ref == 0) {
        c->n_unref++;
        if (x->n_child == 0) lru_insert(c, k);
    }
}

static void snap_free_slot(pfx_cache *c, int32_t k) {
    pfx_ent *x = &c->ent[k];
    if (x->snap < 0) return;
    snap_unlink(c, k);
    c->snap_free[c->n_snap_free++] = x->snap;
    x->snap = -1;
    c->n_snaps_used--;
}

int32_t pfx_evict(pfx_cache *c) {
    int32_t k = c->lru_head;
    if (k < 0) return -1;
    pfx_ent *x = &c->ent[k];
    CHECK(x->ref == 0 && x->n_child == 0);
    lru_unlink(c, k);
    snap_free_slot(c, k);
    size_t b = x->hash & (uint64_t)(c->n_bucket - 1);
    int32_t *pp = &c->bucket[b];
    while (*pp != k) pp = &c->ent[*pp].hnext;
    *pp = x->hnext;
    if (x->parent >= 0) {
        pfx_ent *p = &c->ent[x->parent];
        if (--p->n_child == 0 && p->ref == 0) lru_insert(c, x->parent);
    }
    int32_t page = x->page;
    x->live = 0;
    c->free_ent[c->n_free_ent++] = k;
    c->n_ents--;
    c->n_unref--;
    return page;
}

/* ---- snapshots ---------------------------------------------------------------- */

int32_t pfx_snap_take(pfx_cache *c, int32_t k) {
    CHECK(k >= 0 && k < c->cap && c->ent[k].live);
    pfx_ent *x = &c->ent[k];
    if (x->snap >= 0) { pfx_snap_touch(c, k); return -1; }
    if (c->n_snap == 0) return -1;
    if (c->n_snap_free == 0) snap_free_slot(c, c->snap_head);
    x->snap = c->snap_free[--c->n_snap_free];
    snap_push_tail(c, k);
    c->n_snaps_used++;
    return x->snap;
}

void pfx_snap_drop(pfx_cache *c, int32_t k) {
    if (k >= 0 && k < c->cap && c->ent[k].live) snap_free_slot(c, k);
}

void pfx_snap_touch(pfx_cache *c, int32_t k) {
    if (k < 0 || k >= c->cap || !c->ent[k].live || c->ent[k].snap < 0) return;
    snap_unlink(c, k);
    snap_push_tail(c, k);
}

void pfx_snap_demote(pfx_cache *c, int32_t k) {
    if (k < 0 || k >= c->cap || !c->ent[k].live || c->ent[k].snap < 0) return;
    snap_unlink(c, k);
    snap_push_head(c, k);
}

int32_t pfx_snap_hold(pfx_cache *c) {
    if (c->n_snap_free == 0 && c->snap_head < 0) return -1; /* none, or every one held */
    if (c->n_snap_free == 0) snap_free_slot(c, c->snap_head);
    c->n_snaps_held++;
    return c->snap_free[--c->n_snap_free];
}

int pfx_snap_attach(pfx_cache *c, int32_t k, int32_t s) {
    CHECK(k >= 0 && k < c->cap && c->ent[k].live && s >= 0 && s < c->n_snap && c->n_snaps_held > 0);
    pfx_ent *x = &c->ent[k];
    c->n_snaps_held--;
    if (x->snap >= 0) {
        c->snap_free[c->n_snap_free++] = s;
        pfx_snap_touch(c, k);
        return 0;
    }
    x->snap = s;
    snap_push_tail(c, k);
    c->n_snaps_used++;
    return 1;
}

void pfx_snap_put(pfx_cache *c, int32_t s) {
    CHECK(s >= 0 && s < c->n_snap && c->n_snaps_held > 0);
    c->n_snaps_held--;
    c->snap_free[c->n_snap_free++] = s;
}

/* ---- consistency -------------------------------------------------------------- */

#define BAD_IF(cond) do { if (cond) { free(seen); free(kids); return -__LINE__; } } while (0)

int pfx_check(const pfx_cache *c) {
    uint8_t *seen = xcalloc((size_t)(c->cap > 0 ? c->cap : 1), 1);
    int32_t *kids = xcalloc((size_t)(c->cap > 0 ? c->cap : 1), sizeof *kids);
    for (int32_t j = 0; j < c->cap; j++)
        if (c->ent[j].live && c->ent[j].parent >= 0 && c->ent[j].parent < c->cap) kids[c->ent[j].parent]++;
    int n_live = 0, n_unref = 0, n_snap = 0;
    for (int32_t k = 0; k < c->cap; k++) {
        const pfx_ent *x = &c->ent[k];
        if (!x->live) continue;
        n_live++;
        if (x->ref == 0) n_unref++;
        if (x->snap >= 0) n_snap++;
        BAD_IF(x->ref < 0 || x->n_child < 0);
        BAD_IF(x->in_lru != (x->ref == 0 && x->n_child == 0));
        if (x->parent >= 0) {
            const pfx_ent *p = &c->ent[x->parent];
            BAD_IF(!p->live || p->depth + 1 != x->depth);
            BAD_IF(x->ref > 0 && p->ref == 0);
        } else {
            BAD_IF(x->depth != 0);
        }
        BAD_IF(kids[k] != x->n_child);
        BAD_IF(pfx_find(c, x->parent, ent_ids(c, k)) != k);
    }
    BAD_IF(n_live != c->n_ents || n_unref != c->n_unref || n_snap != c->n_snaps_used);
    BAD_IF(c->n_free_ent + c->n_ents != c->cap);
    BAD_IF(c->n_snaps_held < 0 || c->n_snap_free + c->n_snaps_used + c->n_snaps_held != c->n_snap);
    int n_lru = 0;
    uint64_t last = 0;
    for (int32_t k = c->lru_head, prev = -1; k >= 0; prev = k, k = c->ent[k].lnext) {
        BAD_IF(!c->ent[k].in_lru || c->ent[k].lprev != prev || c->ent[k].tick < last);
        last = c->ent[k].tick;
        n_lru++;
        if (c->ent[k].lnext < 0) BAD_IF(c->lru_tail != k);
    }
    int want_lru = 0;
    for (int32_t k = 0; k < c->cap; k++) want_lru += c->ent[k].live && c->ent[k].in_lru;
    BAD_IF(n_lru != want_lru);
    int n_sl = 0;
    for (int32_t k = c->snap_head, prev = -1; k >= 0; prev = k, k = c->ent[k].snext) {
        BAD_IF(c->ent[k].snap < 0 || c->ent[k].sprev != prev);
        BAD_IF(seen[k]);
        seen[k] = 1;
        n_sl++;
        if (c->ent[k].snext < 0) BAD_IF(c->snap_tail != k);
    }
    BAD_IF(n_sl != n_snap);
    free(seen);
    free(kids);
    return 0;
}
