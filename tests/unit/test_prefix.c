/* test_prefix.c: the prefix cache's bookkeeping (src/engine/prefix.c) on its
 * own: the chained hash (a page's entry depends on every earlier page), ids
 * compared on a hit even when every hash collides (test hook), references,
 * leaf-first LRU eviction in last-use order, snapshot slots (taken, reused
 * least recently used first, freed with their page), held snapshots (taken
 * before their entry exists, attached after, or put back), and pfx_check's
 * invariants after every operation of a random workload. The model side of
 * an in-step snapshot (fwd_seq.n_snap): the GDN state copied mid-step, restored
 * into another slot, continues exactly as the full pass (model_logits_all,
 * itself checked against transformers by tests/test_model_fixtures.py) on
 * synth:demo and the GDN fixtures of ../shared (skipped when absent), on the
 * CPU (test_prefix_cuda.c: the same on a CUDA device).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "engine/prefix.h"
#include "model/model.h"
#include "prefix_test.h"

#include <stdio.h>

enum { PS = 4 };

/* ids of page p of sequence "seq": seq picks the run, p the page */
static void page_ids(int32_t *out, int seq, int p) {
    for (int i = 0; i < PS; i++) out[i] = seq * 1000 + p * PS + i;
}

/* publish pages [0, n) of sequence seq holding one ref on each, pages from *next_page */
static void publish(pfx_cache *c, int seq, int n, int32_t *ents, int *next_page) {
    int32_t ids[PS];
    int32_t parent = -1;
    for (int p = 0; p < n; p++) {
        page_ids(ids, seq, p);
        int32_t k = pfx_find(c, parent, ids);
        if (k >= 0) pfx_acquire(c, k);
        else k = pfx_insert(c, parent, ids, (*next_page)++);
        ents[p] = parent = k;
    }
    assert_int_equal(pfx_check(c), 0);
}

static void release_all(pfx_cache *c, const int32_t *ents, int n) {
    for (int p = n - 1; p >= 0; p--) pfx_release(c, ents[p]);
    assert_int_equal(pfx_check(c), 0);
}

static void test_chain_hash_depends_on_earlier_pages(void **st) {
    (void)st;
    pfx_cache c;
    pfx_init(&c, 16, PS, 0);
    int32_t a[PS] = {1, 2, 3, 4}, b[PS] = {5, 6, 7, 8}, a2[PS] = {1, 2, 3, 5};
    uint64_t ha = pfx_hash(&c, 0, a), hb_after_a = pfx_hash(&c, ha, b), hb_first = pfx_hash(&c, 0, b);
    assert_true(ha != pfx_hash(&c, 0, a2));
    assert_true(hb_after_a != hb_first);
    assert_true(ha == pfx_hash(&c, 0, a)); /* deterministic */
    int32_t ka = pfx_insert(&c, -1, a, 0);
    int32_t kb = pfx_insert(&c, ka, b, 1);
    /* the same page ids after a different first page do not match */
    assert_int_equal(pfx_find(&c, -1, b), -1);
    assert_int_equal(pfx_find(&c, ka, b), kb);
    int32_t seq[3 * PS] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 9}, out[3];
    assert_int_equal(pfx_match(&c, seq, 3 * PS, 0, out, 3), 2);
    assert_int_equal(out[0], ka);
    assert_int_equal(out[1], kb);
    int32_t other[2 * PS] = {1, 2, 3, 5, 5, 6, 7, 8};
    assert_int_equal(pfx_match(&c, other, 2 * PS, 0, out, 2), 0);
    /* a partial page never matches: 7 tokens cover one full page */
    assert_int_equal(pfx_match(&c, seq, 7, 0, out, 3), 1);
    assert_int_equal(c.ent[kb].depth, 1);
    assert_int_equal(pfx_check(&c), 0);
    pfx_free(&c);
}

static void test_ids_compared_when_every_hash_collides(void **st) {
    (void)st;
    pfx_cache c;
    pfx_init(&c, 16, PS, 0);
    c.test_collide = 1; /* one bucket, one hash: only the id comparison tells entries apart */
    int32_t a[PS] = {1, 2, 3, 4}, b[PS] = {1, 2, 3, 7}, d[PS] = {9, 9, 9, 9};
    int32_t ka = pfx_insert(&c, -1, a, 0);
    assert_int_equal(pfx_find(&c, -1, b), -1);
    int32_t kb = pfx_insert(&c, -1, b, 1);
    int32_t kd = pfx_insert(&c, ka, d, 2);
    assert_true(ka != kb);
    assert_int_equal(pfx_find(&c, -1, a), ka);
    assert_int_equal(pfx_find(&c, -1, b), kb);
    assert_int_equal(pfx_find(&c, ka, d), kd);
    assert_int_equal(pfx_find(&c, kb, d), -1); /* same ids and hash, other parent */
    assert_int_equal(pfx_find(&c, -1, d), -1);
    int32_t seq[2 * PS] = {1, 2, 3, 7, 9, 9, 9, 9}, out[2];
    assert_int_equal(pfx_match(&c, seq, 2 * PS, 0, out, 2), 1);
    assert_int_equal(out[0], kb);
    assert_int_equal(pfx_check(&c), 0);
    pfx_free(&c);
}

static void test_refcounts_keep_pages_and_release_makes_them_evictable(void **st) {
    (void)st;
    pfx_cache c;
    pfx_init(&c, 16, PS, 0);
    int next = 0;
    int32_t e1[3], e2[3];
    publish(&c, 1, 3, e1, &next);
    publish(&c, 1, 3, e2, &next); /* a second request sharing the same pages */
    assert_memory_equal(e1, e2, sizeof e1);
    assert_int_equal(next, 3);
    assert_int_equal(c.ent[e1[0]].ref, 2);
    assert_int_equal(c.n_unref, 0);
    assert_int_equal(pfx_evict(&c), -1); /* nothing unreferenced */
    release_all(&c, e1, 3);
    assert_int_equal(c.n_unref, 0);
    assert_int_equal(pfx_evict(&c), -1);
    release_all(&c, e2, 3);
    assert_int_equal(c.n_unref, 3);
    /* leaf first: page 2, then 1, then 0 */
    assert_int_equal(pfx_evict(&c), 2);
    assert_int_equal(pfx_check(&c), 0);
    assert_int_equal(pfx_evict(&c), 1);
    assert_int_equal(pfx_evict(&c), 0);
    assert_int_equal(pfx_evict(&c), -1);
    assert_int_equal(c.n_ents, 0);
    assert_int_equal(c.n_unref, 0);
    assert_int_equal(pfx_check(&c), 0);
    pfx_free(&c);
}

static void test_lru_evicts_least_recently_used_first(void **st) {
    (void)st;
    pfx_cache c;
    pfx_init(&c, 32, PS, 0);
    int next = 0;
    int32_t a[2], b[2], d[2], again[2];
    publish(&c, 1, 2, a, &next); /* pages 0, 1 */
    publish(&c, 2, 2, b, &next); /* pages 2, 3 */
    publish(&c, 3, 2, d, &next); /* pages 4, 5 */
    release_all(&c, a, 2);
    release_all(&c, b, 2);
    release_all(&c, d, 2);
    /* sequence 1 is used again: it becomes the most recent */
    publish(&c, 1, 2, again, &next);
    assert_int_equal(next, 6);
    release_all(&c, again, 2);
    int order[6];
    for (int i = 0; i < 6; i++) {
        order[i] = pfx_evict(&c);
        assert_int_equal(pfx_check(&c), 0);
    }
    int want[6] = {3, 2, 5, 4, 1, 0};
    assert_memory_equal(order, want, sizeof want);
    pfx_free(&c);
}

static void test_shared_parent_outlives_its_children(void **st) {
    (void)st;
    pfx_cache c;
    pfx_init(&c, 16, PS, 0);
    int32_t sys[PS] = {7, 7, 7, 7}, u1[PS] = {1, 1, 1, 1}, u2[PS] = {2, 2, 2, 2};
    int32_t ks = pfx_insert(&c, -1, sys, 0);
    int32_t k1 = pfx_insert(&c, ks, u1, 1);
    pfx_acquire(&c, ks);
    int32_t k2 = pfx_insert(&c, ks, u2, 2);
    pfx_release(&c, k1);
    pfx_release(&c, ks);
    /* ks still referenced by the second request: only k1 may go */
    assert_int_equal(pfx_evict(&c), 1);
    assert_int_equal(pfx_evict(&c), -1);
    pfx_release(&c, k2);
    pfx_release(&c, ks);
    assert_int_equal(pfx_check(&c), 0);
    assert_int_equal(pfx_evict(&c), 2);
    assert_int_equal(pfx_evict(&c), 0);
    pfx_free(&c);
}

static void test_snapshots_bound_the_usable_hit_and_recycle_lru(void **st) {
    (void)st;
    pfx_cache c;
    pfx_init(&c, 16, PS, 2);
    int next = 0;
    int32_t e[4], out[4];
    publish(&c, 1, 4, e, &next);
    int32_t seq[4 * PS];
    for (int p = 0; p < 4; p++) page_ids(seq + p * PS, 1, p);
    assert_int_equal(pfx_match(&c, seq, 4 * PS, 1, out, 4), 0); /* no snapshot: nothing usable */
    assert_int_equal(pfx_match(&c, seq, 4 * PS, 0, out, 4), 4);
    int32_t s1 = pfx_snap_take(&c, e[1]);
    assert_true(s1 >= 0 && s1 < 2);
    assert_int_equal(pfx_snap_take(&c, e[1]), -1); /* has one already */
    assert_int_equal(pfx_match(&c, seq, 4 * PS, 1, out, 4), 2);
    int32_t s3 = pfx_snap_take(&c, e[3]);
    assert_true(s3 >= 0 && s3 != s1);
    assert_int_equal(pfx_match(&c, seq, 4 * PS, 1, out, 4), 4);
    assert_int_equal(pfx_match(&c, seq, 4 * PS - 1, 1, out, 4), 2); /* the last page not full */
    /* both slots used: the next take recycles the least recently used (e[1]) */
    pfx_snap_touch(&c, e[3]);
    int32_t s0 = pfx_snap_take(&c, e[0]);
    assert_int_equal(s0, s1);
    assert_int_equal(c.ent[e[1]].snap, -1);
    assert_int_equal(pfx_check(&c), 0);
    /* a demoted snapshot goes first */
    pfx_snap_demote(&c, e[3]);
    assert_int_equal(pfx_snap_take(&c, e[2]), s3);
    assert_int_equal(c.ent[e[3]].snap, -1);
    /* evicting a page frees its snapshot */
    release_all(&c, e, 4);
    assert_int_equal(pfx_evict(&c), 3);
    assert_int_equal(pfx_evict(&c), 2);
    assert_int_equal(c.n_snaps_used, 1);
    assert_int_equal(c.n_snap_free, 1);
    pfx_snap_drop(&c, e[0]);
    assert_int_equal(c.n_snaps_used, 0);
    assert_int_equal(pfx_check(&c), 0);
    pfx_free(&c);
}

static void test_held_snapshots_attach_after_the_step(void **st) {
    (void)st;
    pfx_cache c;
    pfx_init(&c, 16, PS, 3);
    int next = 0;
    int32_t e[4], f[4];
    /* two held before any entry exists, a third taken the old way */
    int32_t h0 = pfx_snap_hold(&c), h1 = pfx_snap_hold(&c);
    assert_true(h0 >= 0 && h1 >= 0 && h0 != h1);
    assert_int_equal(c.n_snaps_held, 2);
    assert_int_equal(pfx_check(&c), 0);
    publish(&c, 1, 4, e, &next);
    int32_t t = pfx_snap_take(&c, e[3]);
    assert_true(t >= 0 && t != h0 && t != h1);
    /* all three in use, none attached but e[3]'s: the LRU can only give e[3]'s */
    assert_int_equal(pfx_snap_hold(&c), t);
    assert_int_equal(c.ent[e[3]].snap, -1);
    assert_int_equal(c.n_snaps_held, 3);
    assert_int_equal(pfx_snap_hold(&c), -1); /* every slot held */
    assert_int_equal(pfx_check(&c), 0);
    /* attached after the step: the hit now reaches them */
    int32_t seq[4 * PS], out[4];
    for (int p = 0; p < 4; p++) page_ids(seq + p * PS, 1, p);
    assert_int_equal(pfx_snap_attach(&c, e[1], h0), 1);
    assert_int_equal(c.ent[e[1]].snap, h0);
    assert_int_equal(pfx_match(&c, seq, 4 * PS, 1, out, 4), 2);
    assert_int_equal(pfx_snap_attach(&c, e[2], h1), 1);
    assert_int_equal(pfx_match(&c, seq, 4 * PS, 1, out, 4), 3);
    /* an entry that has one keeps it: the held slot goes back free */
    assert_int_equal(pfx_snap_attach(&c, e[1], t), 0);
    assert_int_equal(c.ent[e[1]].snap, h0);
    assert_int_equal(c.n_snaps_held, 0);
    assert_int_equal(c.n_snap_free, 1);
    assert_int_equal(pfx_check(&c), 0);
    /* a failed step puts its held slot back; the LRU order: e[2], then e[1] (touched by the
     * attach it refused) */
    int32_t h2 = pfx_snap_hold(&c);
    assert_int_equal(h2, t);
    pfx_snap_put(&c, h2);
    assert_int_equal(c.n_snaps_held, 0);
    assert_int_equal(c.n_snap_free, 1);
    assert_int_equal(pfx_snap_hold(&c), t);
    assert_int_equal(pfx_snap_hold(&c), h1); /* detached from e[2], the least recently used */
    assert_int_equal(c.ent[e[2]].snap, -1);
    assert_int_equal(c.ent[e[1]].snap, h0);
    assert_int_equal(pfx_check(&c), 0);
    publish(&c, 2, 2, f, &next);
    pfx_snap_attach(&c, f[1], t);
    pfx_snap_attach(&c, f[0], h1);
    release_all(&c, f, 2);
    release_all(&c, e, 4);
    while (pfx_evict(&c) >= 0) {}
    assert_int_equal(c.n_snaps_used, 0);
    assert_int_equal(c.n_snap_free, 3);
    assert_int_equal(pfx_check(&c), 0);
    pfx_free(&c);
}

/* ---- the model's in-step snapshots ---------------------------------------------- */

/* One step: sequence A (slot 0) prefills all 20 tokens with snapshots after 8 and 13 of them
 * into slots 1 and 2, beside sequence B (slot 3, no snapshot: only in the first GDN piece) on
 * its first 5 tokens and sequence C (slot 5) on its first token: a decode row, so the first GDN
 * piece runs as two calls (model_qwen3_next.c, "Decode rows apart") before snapshot 1's copies.
 * Its logits equal the full pass; slots 1 and 2, copied into slot 4 and continued from token 8 /
 * 13, give the full pass's logits from there on: the snapshot is the state a step ending at that
 * token leaves. */
static void test_in_step_snapshot_restores_the_state_at_its_token(void **st) {
    (void)st;
    static const char *names[] = {"synth:demo", "qwen3_next", "qwen3_5_moe_text", "qwen3_5_moe-fused"};
    int ran = 0;
    for (size_t mi = 0; mi < sizeof names / sizeof names[0]; mi++) {
        model *m = pfx_test_open(names[mi], "cpu");
        if (!m) continue;
        ran++;
        const int V = model_cfg(m)->vocab;
        ls_err e = {0};
        float *full = NULL;
        assert_int_equal(model_logits_all(m, k_ids, N_IDS, &full, &e), 0);
        model_cache_opts co = {.page_size = 4, .n_pages = 9, .n_slots = 6};
        assert_int_equal(model_cache_init(m, &co, &e), 0);
        for (int sl = 0; sl < 6; sl++) model_slot_reset(m, sl);
        const int32_t pa[5] = {6, 1, 7, 3, 0}, pb[2] = {2, 4}, pc[1] = {8};
        float *lg = malloc(sizeof(float) * N_IDS * 2 * V);
        int32_t ids[N_IDS + 6];
        memcpy(ids, k_ids, sizeof k_ids);
        memcpy(ids + N_IDS, k_ids, 5 * sizeof *ids);
        ids[N_IDS + 5] = k_ids[0];
        fwd_seq s[3] = {{.slot = 0, .n_past = 0, .n_new = N_IDS, .pages = pa, .logits_all = 1,
                         .n_snap = 2, .snap_off = {8, 13}, .snap_slot = {1, 2}},
                        {.slot = 3, .n_past = 0, .n_new = 5, .pages = pb, .logits_all = 1},
                        {.slot = 5, .n_past = 0, .n_new = 1, .pages = pc, .logits_all = 1}};
        fwd_batch b = {.n_seq = 3, .seqs = s, .ids = ids, .logits = lg};
        if (model_forward(m, &b, &e)) fail_msg("%s: %s", names[mi], e.msg);
        double r = rows_err(lg, full, N_IDS, V), rb = rows_err(lg + (size_t)N_IDS * V, full, 5, V);
        double rc = rows_err(lg + (size_t)(N_IDS + 5) * V, full, 1, V);
        if (r > 1e-5 || rb > 1e-5 || rc > 1e-5)
            fail_msg("%s: the snapshotting step's logits differ: %g, %g, %g", names[mi], r, rb, rc);
        const int at[2] = {8, 13};
        for (int k = 0; k < 2; k++) {
            assert_int_equal(model_slot_copy(m, 4, 1 + k, &e), 0);
            fwd_seq c = {.slot = 4, .n_past = at[k], .n_new = N_IDS - at[k], .pages = pa, .logits_all = 1};
            fwd_batch cb = {.n_seq = 1, .seqs = &c, .ids = k_ids + at[k], .logits = lg};
            if (model_forward(m, &cb, &e)) fail_msg("%s: %s", names[mi], e.msg);
            r = rows_err(lg, full + (size_t)at[k] * V, N_IDS - at[k], V);
            if (r > 1e-5) fail_msg("%s: continued from the snapshot at token %d: logits differ by %g", names[mi],
                                   at[k], r);
        }
        /* bad requests are refused, naming the sequence */
        const struct { int n, off0, off1, slot0, slot1; } bad[] = {
            {1, 0, 0, 1, 0}, {1, N_IDS, 0, 1, 0}, {2, 8, 8, 1, 2}, {2, 13, 8, 1, 2}, {1, 8, 0, 0, 0},
            {1, 8, 0, 3, 0}, {1, 8, 0, 6, 0}, {2, 8, 13, 1, 1}, {3, 4, 8, 1, 2}, {-1, 8, 0, 1, 0},
            {MODEL_SNAP_MAX + 1, 4, 8, 1, 2}};
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            fwd_seq q[2] = {s[0], s[1]};
            q[0].n_snap = bad[i].n;
            q[0].snap_off[0] = bad[i].off0;
            q[0].snap_off[1] = bad[i].off1;
            q[0].snap_slot[0] = bad[i].slot0;
            q[0].snap_slot[1] = bad[i].slot1;
            fwd_batch qb = {.n_seq = 2, .seqs = q, .ids = ids, .logits = lg};
            e = (ls_err){0};
            assert_int_equal(model_forward(m, &qb, &e), ERR_INVAL);
            if (!strstr(e.msg, "snapshot")) fail_msg("%s: bad request %zu: %s", names[mi], i, e.msg);
        }
        free(lg);
        free(full);
        model_close(m);
    }
    assert_true(ran >= 1);
}

/* 2000 chains of 50 pages (a 400k-token cache of 4-token pages), released
 * chain after chain, then evicted completely: chain by chain in release order,
 * each leaf first, every page once. Each eviction's parent goes back into a
 * list of 2000 leaves next to its head: an O(n) walk per eviction would show. */
static void test_many_chains_evict_in_release_order(void **st) {
    (void)st;
    enum { NC = 2000, L = 50, N = NC * L };
    pfx_cache c;
    pfx_init(&c, N, PS, 0);
    int32_t *ents = malloc(sizeof *ents * N);
    int next = 0;
    for (int ch = 0; ch < NC; ch++) {
        int32_t ids[PS], parent = -1;
        for (int p = 0; p < L; p++) {
            page_ids(ids, 10 + ch, p);
            ents[ch * L + p] = parent = pfx_insert(&c, parent, ids, next++);
        }
    }
    for (int ch = 0; ch < NC; ch++)
        for (int p = L - 1; p >= 0; p--) pfx_release(&c, ents[ch * L + p]);
    assert_int_equal(c.n_unref, N);
    for (int ch = 0; ch < NC; ch++)
        for (int p = L - 1; p >= 0; p--) assert_int_equal(pfx_evict(&c), ch * L + p);
    assert_int_equal(pfx_evict(&c), -1);
    assert_int_equal(c.n_ents, 0);
    assert_int_equal(pfx_check(&c), 0);
    free(ents);
    pfx_free(&c);
}

/* Random publish / share / release / evict / snapshot traffic on a small
 * cache, with a collision-prone hash half the time: the invariants hold
 * after every operation and every page comes back exactly once. */
static void test_random_workload_keeps_invariants(void **st) {
    (void)st;
    for (int collide = 0; collide < 2; collide++) {
        enum { NP = 24, NR = 5 };
        pfx_cache c;
        pfx_init(&c, NP, PS, 3);
        c.test_collide = collide;
        int free_pages[NP], n_free = NP;
        for (int i = 0; i < NP; i++) free_pages[i] = i;
        int32_t held[NR][8];
        int n_held[NR] = {0};
        uint32_t s = 12345;
        for (int it = 0; it < 3000; it++) {
            s = s * 1103515245u + 12345u;
            int r = (int)((s >> 8) % NR), op = (int)((s >> 16) % 4);
            if (op < 2 && n_held[r] < 8) { /* extend request r by one page of one of 3 runs */
                int32_t ids[PS];
                page_ids(ids, (int)((s >> 20) % 3), n_held[r]);
                int32_t parent = n_held[r] ? held[r][n_held[r] - 1] : -1;
                int32_t k = pfx_find(&c, parent, ids);
                if (k >= 0) {
                    pfx_acquire(&c, k);
                } else {
                    int32_t pg = n_free ? free_pages[--n_free] : pfx_evict(&c);
                    if (pg < 0) continue;
                    k = pfx_insert(&c, parent, ids, pg);
                }
                held[r][n_held[r]++] = k;
                if ((s >> 24) % 3 == 0) pfx_snap_take(&c, k);
            } else if (op == 2) {
                for (int p = n_held[r] - 1; p >= 0; p--) pfx_release(&c, held[r][p]);
                n_held[r] = 0;
            } else {
                int32_t pg = pfx_evict(&c);
                if (pg >= 0) free_pages[n_free++] = pg;
            }
            assert_int_equal(pfx_check(&c), 0);
        }
        for (int r = 0; r < NR; r++)
            for (int p = n_held[r] - 1; p >= 0; p--) pfx_release(&c, held[r][p]);
        assert_int_equal(c.n_unref, c.n_ents);
        for (int32_t pg; (pg = pfx_evict(&c)) >= 0;) free_pages[n_free++] = pg;
        assert_int_equal(n_free, NP);
        int seen[NP] = {0};
        for (int i = 0; i < NP; i++) seen[free_pages[i]]++;
        for (int i = 0; i < NP; i++) assert_int_equal(seen[i], 1);
        assert_int_equal(c.n_snaps_used, 0);
        assert_int_equal(pfx_check(&c), 0);
        pfx_free(&c);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain_hash_depends_on_earlier_pages),
        cmocka_unit_test(test_ids_compared_when_every_hash_collides),
        cmocka_unit_test(test_refcounts_keep_pages_and_release_makes_them_evictable),
        cmocka_unit_test(test_lru_evicts_least_recently_used_first),
        cmocka_unit_test(test_shared_parent_outlives_its_children),
        cmocka_unit_test(test_snapshots_bound_the_usable_hit_and_recycle_lru),
        cmocka_unit_test(test_many_chains_evict_in_release_order),
        cmocka_unit_test(test_random_workload_keeps_invariants),
        cmocka_unit_test(test_held_snapshots_attach_after_the_step),
        cmocka_unit_test(test_in_step_snapshot_restores_the_state_at_its_token),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
