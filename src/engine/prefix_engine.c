/* prefix_engine.c: the prefix cache inside the engine thread: which pages a
 * request admitted with a known prefix shares, what a step publishes, when
 * GDN state snapshots are taken and restored, and page reclaim under memory
 * pressure. The bookkeeping itself is prefix.c.
 *
 * A request's page table: pages[0 .. n_pent) are cache pages (entries
 * pent[], one reference each, never written: the request's writes start at
 * n_cached, a page boundary past them); pages[n_pent .. n_pages) its own.
 * After every step, each page that became full is published (or, when an
 * equal page is already cached, the request switches to that page and
 * frees its own: same tokens after the same prefix = the same KV).
 *
 * Models with GDN layers: a hit is only usable up to a page boundary where a
 * snapshot of the GDN state exists (prefix.h: pfx_match need_snap); the
 * snapshot is copied into the request's slot at admission. Snapshots are
 * taken at the prompt's page boundaries a follow-up uses (pfxe_chunk's
 * comment) and whenever a step ends on a page boundary: during decode every
 * boundary is reached, the request keeping only its latest one in the front
 * of the snapshot LRU (the previous one is demoted), so that when it finishes
 * the last boundary it reached is cached for a follow-up.
 *
 * The prompt's boundaries inside a prefill step (pfx_instep, the default;
 * validated on the H200 in S9 round R1): pfxe_step_plan holds
 * a snapshot slot (pfx_snap_hold) per boundary and asks the model for the GDN
 * state there (fwd_seq.snap_off / snap_slot: the GDN op runs in pieces, the
 * state copied between them, model_qwen3_next.c); pfxe_step_done attaches
 * each to the entry of the page the boundary ends, once that page is
 * published. The prefill stays one step. The alternative (pfx_instep 0,
 * LASTSTAND_PREFIX_SNAPSHOT=cut, the S8 way, kept for comparison): pfxe_chunk
 * cuts the prefill into steps ending at those boundaries, each one more
 * forward pass over every weight (+8 ms of TTFT for a 1024-token miss on the
 * 40-layer synth 35B, against +1.3 ms in-step: bench/RESULTS.md, S9).
 *
 * Invariants: the last prompt token is always recomputed (a hit covers at
 * most n_tok - 1 tokens, rounded down to a usable boundary); pages cached
 * and unreferenced are reclaimed (pfxe_page_get) before the scheduler
 * preempts anyone; at idle, pages off the free list == pages in the cache.
 */
#include "engine/engine_int.h"

#include <stdlib.h>
#include <string.h>

static void grow(ereq *r, int n) {
    if (n > r->cap_pages) {
        int cap = r->cap_pages * 2 > n ? r->cap_pages * 2 : n;
        r->pages = xrealloc(r->pages, (size_t)cap * sizeof *r->pages);
        r->cap_pages = cap;
    }
    if (n > r->cap_pent) {
        int cap = r->cap_pent * 2 > n ? r->cap_pent * 2 : n;
        r->pent = xrealloc(r->pent, (size_t)cap * sizeof *r->pent);
        r->cap_pent = cap;
    }
}

/* A free page, else an unreferenced cached page reclaimed (LRU, leaf first); -1 when neither. */
int32_t pfxe_page_get(ls_engine *e) {
    int32_t pg = kvpool_get(&e->pages);
    if (pg < 0 && e->pfx_on) pg = pfx_evict(&e->pfx); /* stays marked held in the pool: now the caller's */
    return pg;
}

int pfxe_pages_avail(const ls_engine *e) { return kvpool_avail(&e->pages) + (e->pfx_on ? e->pfx.n_unref : 0); }

/* Before r takes a slot: share the longest usable cached prefix of its tokens.
 * Sets pages[0 .. k), pent, n_cached = k * page_size; returns n_cached. */
int pfxe_admit(ls_engine *e, ereq *r) {
    r->n_cached = 0;
    if (!e->pfx_on) return 0;
    int ps = e->page_size, lim = r->n_tok - 1, maxp = lim / ps;
    if (maxp <= 0) return 0;
    grow(r, maxp);
    int k = pfx_match(&e->pfx, r->tok, lim, e->pfx_gdn, r->pent, maxp);
    for (int i = 0; i < k; i++) {
        pfx_acquire(&e->pfx, r->pent[i]);
        r->pages[i] = e->pfx.ent[r->pent[i]].page;
    }
    r->n_pent = r->n_pages = k;
    r->n_cached = k * ps;
    return r->n_cached;
}

/* After r took its slot: the GDN state for n_cached tokens: the hit's snapshot, or zero. */
void pfxe_restore(ls_engine *e, ereq *r) {
    if (r->n_cached > 0 && e->pfx_gdn) {
        int32_t k = r->pent[r->n_pent - 1];
        int32_t snap = e->pfx.ent[k].snap;
        ls_err le = {0};
        if (snap >= 0 && model_slot_copy(e->m, r->slot, e->snap_base + snap, &le) == 0) {
            pfx_snap_touch(&e->pfx, k);
            return;
        }
        /* cannot happen (pfx_match only counts snapshot boundaries, and nothing evicts between) */
        log_warn("engine: request %lld: no GDN snapshot to restore (%s); recomputing its prompt",
                 (long long)r->id, snap < 0 ? "none at the hit" : le.msg);
        int32_t slot = r->slot;
        pfxe_release(e, r);
        r->slot = slot;
    }
    model_slot_reset(e->m, r->slot);
}

/* Tokens at the end of a prompt that the next turn of a chat may render
 * differently: the generation prompt ("<|im_start|>assistant\n<think>\n" for
 * Qwen3.5, whose history drops the "<think>\n"). */
#define PFX_TAIL 8

/* A prefill chunk of n_new tokens, cut to end at the prompt's page
 * boundaries a follow-up can use (GDN models), where snapshots are taken:
 * the last one before the prompt's PFX_TAIL last tokens (a chat's next turn;
 * also the same prompt again) and the last full page (a longer prompt that
 * extends this one). At most two cuts, one when they coincide; a prompt's
 * end on a boundary, and every boundary reached while decoding, are
 * snapshotted too, as any step that ends on one. A pure-attention model
 * needs no cut (any full page is shared). */
static void prompt_bounds(const ls_engine *e, const ereq *r, int b[2]) {
    int ps = e->page_size;
    b[0] = (r->n_prompt > PFX_TAIL ? r->n_prompt - PFX_TAIL : 0) / ps * ps;
    b[1] = r->n_prompt / ps * ps;
}

int pfxe_chunk(const ls_engine *e, const ereq *r, int n_new) {
    if (!e->pfx_on || !e->pfx_gdn || e->pfx_instep || n_new <= 1) return n_new;
    int b[2];
    prompt_bounds(e, r, b);
    for (int i = 0; i < 2; i++)
        if (b[i] > r->n_cached && b[i] < r->n_cached + n_new) return b[i] - r->n_cached;
    return n_new;
}

/* In-step snapshots unless LASTSTAND_PREFIX_SNAPSHOT=cut (every model and
 * device takes them: the GDN op in pieces is backend-agnostic, and with --tp
 * every rank copies its own shard of the state). */
int pfxe_instep_mode(const ls_engine *e) {
    (void)e;
    const char *v = getenv("LASTSTAND_PREFIX_SNAPSHOT");
    if (!v || !*v || strcmp(v, "step") == 0) return 1;
    if (strcmp(v, "cut") == 0) return 0;
    log_warn("engine: LASTSTAND_PREFIX_SNAPSHOT=%s: expected step or cut; taking the snapshots in-step", v);
    return 1;
}

/* Before a step of s->n_new tokens of r: the prompt's page boundaries strictly
 * inside it (the end of a step on a boundary is snapshotted after it, as
 * always) become in-step snapshot requests, each into a held snapshot slot.
 * Always sets s->n_snap (0: none). */
void pfxe_step_plan(ls_engine *e, ereq *r, fwd_seq *s) {
    s->n_snap = 0;
    r->n_snap_hold = 0;
    if (!e->pfx_on || !e->pfx_gdn || !e->pfx_instep || s->n_new <= 1) return;
    int b[2], lo = r->n_cached, hi = r->n_cached + s->n_new, n = 0;
    prompt_bounds(e, r, b);
    for (int i = 0; i < 2 && n < MODEL_SNAP_MAX; i++) {
        if (b[i] <= lo || b[i] >= hi || (n && b[i] <= r->snap_at[n - 1])) continue;
        int32_t h = pfx_snap_hold(&e->pfx);
        if (h < 0) break; /* every snapshot slot is held this step: no snapshot there */
        s->snap_off[n] = b[i] - lo;
        s->snap_slot[n] = e->snap_base + h;
        r->snap_hold[n] = h;
        r->snap_at[n++] = b[i];
    }
    s->n_snap = r->n_snap_hold = n;
}

static void snapshot(ls_engine *e, ereq *r, int32_t k) {
    int32_t s = pfx_snap_take(&e->pfx, k);
    if (s >= 0) {
        ls_err le = {0};
        if (model_slot_copy(e->m, e->snap_base + s, r->slot, &le) < 0) {
            log_warn("engine: request %lld: GDN snapshot at token %d not taken: %s", (long long)r->id,
                     r->n_cached, le.msg);
            pfx_snap_drop(&e->pfx, k);
            return;
        }
    }
    if (r->n_cached > r->n_prompt) { /* decode: keep one rolling snapshot in front */
        if (r->snap_roll >= 0 && r->snap_roll != k) pfx_snap_demote(&e->pfx, r->snap_roll);
        r->snap_roll = k;
    }
}

/* After a step advanced r->n_cached: publish the pages that became full, and
 * snapshot the GDN state when the step ended on a page boundary. */
void pfxe_step_done(ls_engine *e, ereq *r) {
    if (!e->pfx_on) return;
    int ps = e->page_size, full = r->n_cached / ps;
    if (full > r->n_pages) full = r->n_pages;
    if (full > r->n_pent) grow(r, full);
    while (r->n_pent < full) {
        int i = r->n_pent;
        int32_t parent = i ? r->pent[i - 1] : -1;
        const int32_t *ids = r->tok + (size_t)i * ps;
        int32_t k = pfx_find(&e->pfx, parent, ids);
        if (k >= 0) { /* an equal page is cached: share it, free ours */
            pfx_acquire(&e->pfx, k);
            kvpool_put(&e->pages, r->pages[i]);
            r->pages[i] = e->pfx.ent[k].page;
        } else {
            k = pfx_insert(&e->pfx, parent, ids, r->pages[i]);
        }
        r->pent[r->n_pent++] = k;
    }
    /* the step's in-step snapshots: the pages their boundaries end are published now */
    for (int i = 0; i < r->n_snap_hold; i++) {
        int p = r->snap_at[i] / ps;
        CHECK(p >= 1 && p <= r->n_pent);
        pfx_snap_attach(&e->pfx, r->pent[p - 1], r->snap_hold[i]);
    }
    r->n_snap_hold = 0;
    if (e->pfx_gdn && full > 0 && r->n_cached == full * ps) snapshot(e, r, r->pent[full - 1]);
}

/* r stops running (finished, preempted, cancelled, failed): drop its cache
 * references, give its own pages back; the slot is the caller's. */
void pfxe_release(ls_engine *e, ereq *r) {
    for (int i = 0; i < r->n_snap_hold; i++) pfx_snap_put(&e->pfx, r->snap_hold[i]); /* its step failed */
    r->n_snap_hold = 0;
    for (int i = r->n_pages - 1; i >= 0; i--) { /* deepest first: an entry never outlives its parent's ref */
        if (i < r->n_pent) pfx_release(&e->pfx, r->pent[i]);
        else kvpool_put(&e->pages, r->pages[i]);
    }
    r->n_pent = r->n_pages = 0;
    r->n_cached = 0;
    r->snap_roll = -1;
}
