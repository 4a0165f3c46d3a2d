/* prefix.h: the prefix cache's bookkeeping: full KV pages published under a
 * chained hash of their token run, refcounted while running requests share
 * them, kept in LRU order once unreferenced; GDN state snapshots (slots of
 * their own) attached to the page they end.
 *
 * Pure data structure: no model, no engine. The engine glue (what to publish
 * when, copying snapshots, page eviction under pressure) is prefix_engine.c.
 *
 * An entry is one full page of page_size token ids at a position given by
 * its chain: entry(parent, ids) holds the KV of tokens
 * [depth * page_size, (depth + 1) * page_size) of every sequence whose
 * earlier pages are the parent chain. Lookups compare the parent entry and
 * the ids; the hash only picks the bucket.
 *
 * Invariants:
 *   - an entry's ancestors are live while it is (eviction takes leaves only);
 *   - a request holding entry k holds every ancestor of k, so an entry with
 *     ref == 0 has only ref == 0 descendants, and every unreferenced entry is
 *     reclaimable (leaf first): n_unref pages can always be evicted;
 *   - the eviction list holds exactly the entries with ref == 0 and no
 *     children, ordered by last use (head = oldest);
 *   - a snapshot belongs to one entry, or is held (pfx_snap_hold: its state is
 *     being written during a step that publishes the entry after it); the
 *     snapshot list holds every entry with a snapshot, ordered by last use
 *     (head = evicted first); free + attached + held = n_snap.
 */
#ifndef LS_ENGINE_PREFIX_H
#define LS_ENGINE_PREFIX_H

#include <stdint.h>

typedef struct pfx_ent {
    uint64_t hash;            /* chain hash: mix(parent's hash, ids) */
    uint64_t tick;            /* last use */
    int32_t parent;           /* entry of the previous page, -1 for page 0 */
    int32_t page;             /* KV pool page, owned by the cache while live */
    int32_t snap;             /* snapshot index [0, n_snap) of the GDN state after this page, -1 */
    int32_t depth;            /* page number within the sequence */
    int32_t ref;              /* requests holding it */
    int32_t n_child;
    int32_t hnext;            /* hash bucket chain */
    int32_t lprev, lnext;     /* eviction list (ref 0, no children) */
    int32_t sprev, snext;     /* snapshot list */
    uint8_t live, in_lru;
} pfx_ent;

typedef struct pfx_cache {
    int page_size;
    int cap;                  /* entries: at most one per KV page */
    pfx_ent *ent;             /* [cap] */
    int32_t *ids;             /* [cap, page_size] each entry's token ids */
    int32_t *free_ent;        /* [cap] stack of unused entry indices */
    int n_free_ent;
    int32_t *bucket;          /* [n_bucket] heads of the hash chains */
    int n_bucket;             /* a power of two */
    int32_t lru_head, lru_tail;
    int32_t snap_head, snap_tail;
    int n_snap;               /* snapshot slots */
    int32_t *snap_free;       /* [n_snap] stack */
    int n_snap_free;
    int n_ents, n_unref, n_snaps_used;
    uint64_t tick;
    int test_collide;         /* test hook: every hash is the same (forces bucket collisions) */
    int n_snaps_held;         /* snapshot slots held by the caller, attached to no entry yet */
} pfx_cache;

/* n_pages: the KV pool size (the most entries); n_snap: snapshot slots (0: none). */
void pfx_init(pfx_cache *c, int n_pages, int page_size, int n_snap);
void pfx_free(pfx_cache *c);

/* The chain hash of a page: parent_hash (0 for the first page) mixed with its ids. */
uint64_t pfx_hash(const pfx_cache *c, uint64_t parent_hash, const int32_t *ids);

/* The entry holding the page after `parent` (-1: the first page) whose ids
 * are ids[0 .. page_size), or -1. */
int32_t pfx_find(const pfx_cache *c, int32_t parent, const int32_t *ids);

/* Walk ids[0 .. n) page by page (full pages only) and write the matching
 * entries to out[] (at most max_out). Returns how many pages matched. With
 * need_snap, only the prefix ending at the deepest matched entry that has a
 * snapshot counts (0 when none has). Takes no references; touches nothing. */
int pfx_match(const pfx_cache *c, const int32_t *ids, int n, int need_snap, int32_t *out, int max_out);

/* Publish a full page: a new entry (parent, ids) owning `page`, with one
 * reference (the caller's). The caller checked pfx_find returned -1. */
int32_t pfx_insert(pfx_cache *c, int32_t parent, const int32_t *ids, int32_t page);

void pfx_acquire(pfx_cache *c, int32_t k);   /* ref++, marks it used now */
void pfx_release(pfx_cache *c, int32_t k);   /* ref--; unreferenced leaves join the eviction list */

/* Evict the least recently used unreferenced leaf: its page is returned
 * (still held in the page pool, now the caller's), its snapshot freed.
 * -1 when nothing is unreferenced. */
int32_t pfx_evict(pfx_cache *c);

/* A snapshot slot for entry k's state: a free one, else the least recently
 * used snapshot's (detached from its entry). Returns the snapshot index to
 * fill, or -1 when k already has one (then only marked used) or there are
 * no snapshot slots. */
int32_t pfx_snap_take(pfx_cache *c, int32_t k);
void pfx_snap_drop(pfx_cache *c, int32_t k);   /* free k's snapshot (e.g. the copy failed) */
void pfx_snap_touch(pfx_cache *c, int32_t k);  /* k's snapshot was used now */
void pfx_snap_demote(pfx_cache *c, int32_t k); /* k's snapshot goes first on the next eviction */

/* A snapshot slot held by the caller before the entry it will belong to exists
 * (an in-step snapshot: the GDN state is copied during the step, the page is
 * published after it): a free one, else the least recently used snapshot's
 * (detached from its entry). -1 when there are no snapshot slots or every one
 * is held. Hand it on with pfx_snap_attach or back with pfx_snap_put. */
int32_t pfx_snap_hold(pfx_cache *c);
/* Held snapshot s becomes entry k's, used now. When k already has one (an
 * equal page with its snapshot was cached meanwhile), s is freed and k's
 * touched. Returns 1 when s was attached, 0 when it was freed. */
int pfx_snap_attach(pfx_cache *c, int32_t k, int32_t s);
void pfx_snap_put(pfx_cache *c, int32_t s);    /* held snapshot s freed, unused (the step failed) */

/* Consistency check of every invariant above (tests); 0 when it holds, else
 * a negative line number of the failed check. */
int pfx_check(const pfx_cache *c);

#endif
