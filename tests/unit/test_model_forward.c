/* test_model_forward.c: the forward pass through the caches against a full
 * pass (model_logits_all, itself checked against transformers by
 * tests/test_model_fixtures.py): decoding token by token and in chunks over
 * scattered KV pages gives the same logits; a mixed batch (a prefill chunk of
 * one sequence and a decode row of another, in other slots) equals separate
 * runs; bad batches are refused. Uses the fixtures in ../shared (skipped when
 * absent). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* fixture folders, and synth presets (built in memory, real tensor layout) */
static const char *k_models[] = {"qwen3", "qwen3_moe-nvfp4", "qwen3_next", "qwen3_5_moe-fused",
                                 "qwen3_5_moe_text-nvfp4", "synth:demo"};
#define N_IDS 20
static const int32_t k_ids[N_IDS] = {5, 900, 17, 256, 3, 77, 1000, 512, 42, 8,
                                     600, 13, 99, 731, 2, 64, 333, 870, 21, 400};

/* the CPU device whatever the machine has: the exact equalities here (1e-5) are the CPU's
 * fp32 forward pass's; on a GPU BF16 activations and per-M plans round differently by batch
 * shape (the CUDA twins: test_prefix_cuda.c, tests/test_gpu_*.py) */
static const model_opts k_cpu = {.device = "cpu"};

static model *open_fixture(const char *name) {
    char path[512];
    if (!strncmp(name, "synth:", 6)) {
        model *m = NULL;
        ls_err e = {0};
        if (model_open(name, &k_cpu, &m, &e)) fail_msg("open %s: %s", name, e.msg);
        return m;
    }
    const char *root = getenv("LS_SHARED") ? getenv("LS_SHARED") : "../shared";
    snprintf(path, sizeof path, "%s/fixtures/models/%s", root, name);
    if (access(path, R_OK)) return NULL;
    model *m = NULL;
    ls_err e = {0};
    if (model_open(path, &k_cpu, &m, &e)) fail_msg("open %s: %s", path, e.msg);
    return m;
}

/* max |a - b| / max |b| over one row of V */
static double row_err(const float *a, const float *b, int V) {
    double d = 0, mx = 0;
    for (int v = 0; v < V; v++) {
        d = fmax(d, fabs((double)a[v] - b[v]));
        mx = fmax(mx, fabs((double)b[v]));
    }
    return d / mx;
}

static void test_decode_steps_match_full_pass(void **st) {
    int ran = 0;
    for (size_t mi = 0; mi < sizeof k_models / sizeof k_models[0]; mi++) {
        model *m = open_fixture(k_models[mi]);
        if (!m) continue;
        ran++;
        const int V = model_cfg(m)->vocab;
        float *full = NULL;
        ls_err e = {0};
        assert_int_equal(model_logits_all(m, k_ids, N_IDS, &full, &e), 0);
        /* pages of 4 tokens, handed out in a scrambled order */
        model_cache_opts co = {.page_size = 4, .n_pages = 8, .n_slots = 2};
        assert_int_equal(model_cache_init(m, &co, &e), 0);
        model_slot_reset(m, 1);
        const int32_t pages[5] = {6, 1, 7, 3, 0};
        float *lg = malloc(sizeof(float) * N_IDS * V);
        /* steps: prefill 7 (all logits), a chunk of 5 (all), then single tokens */
        int n_past = 0;
        while (n_past < N_IDS) {
            int n_new = n_past == 0 ? 7 : n_past == 7 ? 5 : 1;
            fwd_seq s = {.slot = 1, .n_past = n_past, .n_new = n_new, .pages = pages, .logits_all = 1};
            fwd_batch b = {.n_seq = 1, .seqs = &s, .ids = k_ids + n_past, .logits = lg};
            if (model_forward(m, &b, &e)) fail_msg("%s: %s", k_models[mi], e.msg);
            for (int i = 0; i < n_new; i++) {
                double r = row_err(lg + (size_t)i * V, full + (size_t)(n_past + i) * V, V);
                if (r > 1e-5)
                    fail_msg("%s: position %d differs from the full pass by %g", k_models[mi], n_past + i, r);
            }
            n_past += n_new;
        }
        free(lg);
        free(full);
        model_close(m);
    }
    if (!ran) skip();
}

static void test_mixed_batch_equals_separate_runs(void **st) {
    int ran = 0;
    for (size_t mi = 0; mi < sizeof k_models / sizeof k_models[0]; mi++) {
        model *m = open_fixture(k_models[mi]);
        if (!m) continue;
        ran++;
        const int V = model_cfg(m)->vocab;
        ls_err e = {0};
        /* oracles: A = ids[0..16), B = ids[16..20) run alone */
        float *fa = NULL, *fb = NULL;
        assert_int_equal(model_logits_all(m, k_ids, 16, &fa, &e), 0);
        assert_int_equal(model_logits_all(m, k_ids + 16, 4, &fb, &e), 0);
        model_cache_opts co = {.page_size = 4, .n_pages = 8, .n_slots = 3};
        assert_int_equal(model_cache_init(m, &co, &e), 0);
        model_slot_reset(m, 2);
        model_slot_reset(m, 0);
        const int32_t pa[4] = {5, 0, 7, 2}, pb[1] = {4};
        float *lg = malloc(sizeof(float) * 16 * V);
        /* step 1: both prefill together (A: 10 tokens, B: 3) */
        fwd_seq s1[2] = {{.slot = 2, .n_past = 0, .n_new = 10, .pages = pa, .logits_all = 0},
                         {.slot = 0, .n_past = 0, .n_new = 3, .pages = pb, .logits_all = 0}};
        int32_t ids1[13];
        memcpy(ids1, k_ids, sizeof(int32_t) * 10);
        memcpy(ids1 + 10, k_ids + 16, sizeof(int32_t) * 3);
        fwd_batch b1 = {.n_seq = 2, .seqs = s1, .ids = ids1, .logits = lg};
        if (model_forward(m, &b1, &e)) fail_msg("%s: %s", k_models[mi], e.msg);
        assert_true(row_err(lg, fa + (size_t)9 * V, V) < 1e-5);     /* A's last row */
        assert_true(row_err(lg + V, fb + (size_t)2 * V, V) < 1e-5); /* B's last row */
        /* step 2: a decode row of B first, then A's prefill chunk of 6 */
        fwd_seq s2[2] = {{.slot = 0, .n_past = 3, .n_new = 1, .pages = pb, .logits_all = 0},
                         {.slot = 2, .n_past = 10, .n_new = 6, .pages = pa, .logits_all = 1}};
        int32_t ids2[7];
        ids2[0] = k_ids[19];
        memcpy(ids2 + 1, k_ids + 10, sizeof(int32_t) * 6);
        fwd_batch b2 = {.n_seq = 2, .seqs = s2, .ids = ids2, .logits = lg};
        if (model_forward(m, &b2, &e)) fail_msg("%s: %s", k_models[mi], e.msg);
        double r = row_err(lg, fb + (size_t)3 * V, V);
        if (r > 1e-5) fail_msg("%s: decode row differs by %g", k_models[mi], r);
        for (int i = 0; i < 6; i++) {
            r = row_err(lg + (size_t)(1 + i) * V, fa + (size_t)(10 + i) * V, V);
            if (r > 1e-5) fail_msg("%s: chunk row %d differs by %g", k_models[mi], i, r);
        }
        free(lg);
        free(fa);
        free(fb);
        model_close(m);
    }
    if (!ran) skip();
}

/* A decode row between two prompt chunks: the GDN op runs the decode rows and the chunks as
 * two calls (model_qwen3_next.c, "Decode rows apart"), the chunks' call over a span of rows
 * that holds the decode row; every row must still equal its sequence run alone. */
static void test_decode_row_between_chunks(void **st) {
    int ran = 0;
    for (size_t mi = 0; mi < sizeof k_models / sizeof k_models[0]; mi++) {
        model *m = open_fixture(k_models[mi]);
        if (!m) continue;
        ran++;
        const int V = model_cfg(m)->vocab;
        ls_err e = {0};
        /* oracles: A = ids[0..12), B = ids[12..16), C = ids[16..20) alone */
        float *fa = NULL, *fb = NULL, *fc = NULL;
        assert_int_equal(model_logits_all(m, k_ids, 12, &fa, &e), 0);
        assert_int_equal(model_logits_all(m, k_ids + 12, 4, &fb, &e), 0);
        assert_int_equal(model_logits_all(m, k_ids + 16, 4, &fc, &e), 0);
        model_cache_opts co = {.page_size = 4, .n_pages = 12, .n_slots = 4};
        assert_int_equal(model_cache_init(m, &co, &e), 0);
        for (int sl = 0; sl < 4; sl++) model_slot_reset(m, sl);
        const int32_t pa[3] = {9, 2, 6}, pb[1] = {4}, pc[1] = {11};
        float *lg = malloc(sizeof(float) * 12 * V);
        /* step 1: A 5 tokens, B 3, C 1 (every sequence a chunk or a row) */
        fwd_seq s1[3] = {{.slot = 3, .n_past = 0, .n_new = 5, .pages = pa},
                         {.slot = 1, .n_past = 0, .n_new = 3, .pages = pb},
                         {.slot = 0, .n_past = 0, .n_new = 1, .pages = pc}};
        int32_t ids1[9];
        memcpy(ids1, k_ids, sizeof(int32_t) * 5);
        memcpy(ids1 + 5, k_ids + 12, sizeof(int32_t) * 3);
        ids1[8] = k_ids[16];
        fwd_batch b1 = {.n_seq = 3, .seqs = s1, .ids = ids1, .logits = lg};
        if (model_forward(m, &b1, &e)) fail_msg("%s: %s", k_models[mi], e.msg);
        /* step 2: A's chunk of 7, B's decode row, C's chunk of 3, all rows' logits */
        fwd_seq s2[3] = {{.slot = 3, .n_past = 5, .n_new = 7, .pages = pa, .logits_all = 1},
                         {.slot = 1, .n_past = 3, .n_new = 1, .pages = pb, .logits_all = 1},
                         {.slot = 0, .n_past = 1, .n_new = 3, .pages = pc, .logits_all = 1}};
        int32_t ids2[11];
        memcpy(ids2, k_ids + 5, sizeof(int32_t) * 7);
        ids2[7] = k_ids[15];
        memcpy(ids2 + 8, k_ids + 17, sizeof(int32_t) * 3);
        fwd_batch b2 = {.n_seq = 3, .seqs = s2, .ids = ids2, .logits = lg};
        if (model_forward(m, &b2, &e)) fail_msg("%s: %s", k_models[mi], e.msg);
        for (int i = 0; i < 11; i++) {
            const float *ref = i < 7 ? fa + (size_t)(5 + i) * V : i == 7 ? fb + (size_t)3 * V : fc + (size_t)(i - 7) * V;
            double r = row_err(lg + (size_t)i * V, ref, V);
            if (r > 1e-5) fail_msg("%s: step 2 row %d differs from its sequence alone by %g", k_models[mi], i, r);
        }
        free(lg);
        free(fa);
        free(fb);
        free(fc);
        model_close(m);
    }
    if (!ran) skip();
}

static void test_bad_batches_are_refused(void **st) {
    model *m = open_fixture("qwen3_5_moe_text");
    if (!m) skip();
    ls_err e = {0};
    float lg[1024 * 2];
    const int32_t pages[1] = {0}, bad_page[1] = {9}, ids[2] = {1, 2}, bad_id[1] = {5000};
    fwd_seq s = {.slot = 0, .n_past = 0, .n_new = 1, .pages = pages};
    fwd_batch b = {.n_seq = 1, .seqs = &s, .ids = ids, .logits = lg};
    assert_int_equal(model_forward(m, &b, &e), ERR_INVAL); /* no cache yet */
    assert_non_null(strstr(e.msg, "cache"));
    model_cache_opts co = {.page_size = 4, .n_pages = 2, .n_slots = 1};
    assert_int_equal(model_cache_init(m, &co, &e), 0);
    s.pages = bad_page;
    assert_int_equal(model_forward(m, &b, &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "page"));
    s.pages = pages;
    s.slot = 1;
    assert_int_equal(model_forward(m, &b, &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "slot"));
    s.slot = 0;
    fwd_seq two[2] = {s, s}; /* two sequences in one GDN slot */
    fwd_batch b2 = {.n_seq = 2, .seqs = two, .ids = ids, .logits = lg};
    assert_int_equal(model_forward(m, &b2, &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "share GDN slot 0"));
    b.ids = bad_id;
    assert_int_equal(model_forward(m, &b, &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "5000"));
    model_close(m);
}

static void test_cuda_device_is_refused_cleanly(void **st) {
    model *m = NULL;
    ls_err e = {0};
    model_opts o = {.device = "cuda"};
    int rc = model_open("/nonexistent", &o, &m, &e);
#ifndef LS_HAVE_CUDA
    assert_int_equal(rc, ERR_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "CUDA"));
#else
    assert_true(rc != 0);
#endif
    assert_null(m);
    o.device = "tpu";
    assert_int_equal(model_open("/nonexistent", &o, &m, &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "tpu"));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_steps_match_full_pass),
        cmocka_unit_test(test_mixed_batch_equals_separate_runs),
        cmocka_unit_test(test_decode_row_between_chunks),
        cmocka_unit_test(test_bad_batches_are_refused),
        cmocka_unit_test(test_cuda_device_is_refused_cleanly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
