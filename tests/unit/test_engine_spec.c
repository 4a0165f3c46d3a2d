/* test_engine_spec.c: speculative decoding (engine.c "Speculative decoding", spec.h).
 *
 * The n-gram proposer against hand-worked cases. Then the property that makes
 * speculation safe to turn on: an engine that verifies n-gram drafts emits
 * exactly the tokens of one that does not, greedy or seeded sampling, under
 * continuous batching, with the prefix cache, under KV-pool preemption, with two
 * tensor-parallel ranks, on the
 * demo model (Qwen3.5 layout: Gated DeltaNet layers, whose state must be rolled
 * back past a rejected draft). Each request's first tokens are forced (test
 * id forcing) into a pattern that repeats with deviations, so drafts are
 * accepted in full, in part and not at all; the free tokens after it are the
 * model's, and come out right only if every rollback left the KV cache and the
 * GDN state exactly at the accepted position. And the cost model: a request whose drafts
 * do not pay for their verify steps pauses drafting, with the same tokens.
 *
 * The same with drafts from the checkpoint's MTP head (--speculative-algorithm mtp):
 * synth:demo,mtp=chain has a head whose draft after token t is always f(t), f read here from the
 * model itself (model_mtp_logits_all), so the forced prefix follows f with deviations and the
 * head's drafts are accepted in full, in part and not at all; and the demo's random head,
 * whose drafts are hardly ever accepted, with the same tokens too.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "laststand.h"
#include "engine/sampler.h"
#include "engine/spec.h"
#include "model/model.h"

/* ---- the proposer ------------------------------------------------------------------ */

static int prop(const int32_t *t, int n, int w0, int w1, int k, int32_t *out) {
    memset(out, 0x7f, sizeof(int32_t) * SPEC_DRAFT_MAX);
    return spec_ngram_propose(t, n, w0, w1, k, out);
}

static void test_ngram_proposer(void **st) {
    (void)st;
    int32_t o[SPEC_DRAFT_MAX];
    /* 5 6 7 8 | 5 6 : "5 6" occurred at 0, followed by 7 8 5 6 (then the period 4 again) */
    const int32_t a[] = {5, 6, 7, 8, 5, 6};
    assert_int_equal(prop(a, 6, 1, 4, 3, o), 3);
    assert_int_equal(o[0], 7); assert_int_equal(o[1], 8); assert_int_equal(o[2], 5);
    assert_int_equal(prop(a, 6, 1, 4, 6, o), 6); /* past the end: the period continues */
    const int32_t a6[] = {7, 8, 5, 6, 7, 8};
    for (int i = 0; i < 6; i++) assert_int_equal(o[i], a6[i]);
    /* the longest window wins: suffix "1 2" matches at 3 (-> 9), suffix "2" alone later at 6 (-> 4) */
    const int32_t b[] = {0, 0, 0, 1, 2, 9, 2, 4, 1, 2};
    assert_int_equal(prop(b, 10, 1, 2, 2, o), 2);
    assert_int_equal(o[0], 9); assert_int_equal(o[1], 2);
    assert_int_equal(prop(b, 10, 1, 1, 2, o), 2); /* window 1 only: the latest "2" before the end is at 6 */
    assert_int_equal(o[0], 4); assert_int_equal(o[1], 1);
    /* the latest occurrence, not the first */
    const int32_t c[] = {3, 1, 3, 2, 3};
    assert_int_equal(prop(c, 5, 1, 1, 1, o), 1);
    assert_int_equal(o[0], 2);
    /* a run of one token proposes more of it */
    const int32_t d[] = {1, 9, 9};
    assert_int_equal(prop(d, 3, 1, 3, 4, o), 4);
    for (int i = 0; i < 4; i++) assert_int_equal(o[i], 9);
    /* no match, a window longer than the history, bad arguments */
    const int32_t e[] = {1, 2, 3, 4};
    assert_int_equal(prop(e, 4, 1, 3, 3, o), 0);
    assert_int_equal(prop(a, 6, 2, 2, 3, o), 3);
    assert_int_equal(prop(a, 6, 3, 3, 3, o), 0); /* "8 5 6" never occurred before */
    assert_int_equal(prop(a, 1, 1, 4, 3, o), 0);
    assert_int_equal(prop(a, 6, 0, 4, 3, o), 0);
    assert_int_equal(prop(a, 6, 3, 2, 3, o), 0);
    assert_int_equal(prop(a, 6, 1, 4, 0, o), 0);
    assert_int_equal(prop(NULL, 0, 1, 4, 3, o), 0);
    /* k is capped at SPEC_DRAFT_MAX */
    assert_int_equal(prop(d, 3, 1, 1, SPEC_DRAFT_MAX + 5, o), SPEC_DRAFT_MAX);
    /* the scan stops SPEC_NGRAM_SCAN tokens back */
    int n = SPEC_NGRAM_SCAN + 10;
    int32_t *h = calloc((size_t)n, sizeof *h);
    for (int i = 0; i < n; i++) h[i] = 100 + i; /* all distinct ... */
    h[0] = 7; h[1] = 8;                          /* ... but the very first pair */
    h[n - 1] = 7;
    assert_int_equal(prop(h, n, 1, 1, 1, o), 0); /* "7" at 0 is out of reach */
    h[n - 1 - SPEC_NGRAM_SCAN] = 7;
    h[n - SPEC_NGRAM_SCAN] = 42;
    assert_int_equal(prop(h, n, 1, 1, 1, o), 1); /* at the edge of the scan */
    assert_int_equal(o[0], 42);
    free(h);
}

/* ---- the engine: speculation changes no token ----------------------------------------- */

#define MAXT 256

typedef struct rec {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t toks[MAXT];
    int n, finished;
    char reason[16];
} rec;

static void on_event(void *user, const ls_event *ev) {
    rec *r = user;
    pthread_mutex_lock(&r->mu);
    if (ev->token >= 0 && r->n < MAXT) r->toks[r->n++] = ev->token;
    if (ev->finished) {
        r->finished = 1;
        snprintf(r->reason, sizeof r->reason, "%s", ev->finish_reason);
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
}

static void rec_wait(rec *r) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 300;
    pthread_mutex_lock(&r->mu);
    while (!r->finished)
        if (pthread_cond_timedwait(&r->cv, &r->mu, &dl)) break;
    int f = r->finished;
    pthread_mutex_unlock(&r->mu);
    assert_true(f);
}

typedef struct eng_cfg {
    const char *model;     /* NULL: synth:demo */
    const char *spec;      /* NULL: off */
    int n_draft_tokens;    /* 0: the default */
    int max_total_tokens;  /* 0: from memory */
    int prefix_cache;      /* -1 off, 0 default (on) */
    int page_size;
    int prefix_snapshots;  /* 0: auto */
    int tp;                /* 0: 1 */
} eng_cfg;

static ls_engine *open_engine(const eng_cfg *c) {
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.model_path = c->model ? c->model : "synth:demo";
    o.device = "cpu";
    o.max_running_requests = 8;
    o.chunked_prefill_size = 48; /* prompts span several steps, mixed with decode rows */
    o.context_length = 512;
    o.max_total_tokens = c->max_total_tokens;
    o.prefix_cache = c->prefix_cache;
    if (c->page_size) o.page_size = c->page_size;
    o.prefix_snapshots = c->prefix_snapshots;
    if (c->tp) o.tp = c->tp;
    o.speculative_algorithm = c->spec;
    o.speculative_num_draft_tokens = c->n_draft_tokens;
    o.speculative_ngram_min_window = c->spec && !strcasecmp(c->spec, "ngram") ? 1 : 0;
    ls_engine *e = NULL;
    char err[512] = "";
    int rc = ls_engine_open(&o, &e, err, sizeof err);
    if (rc) fprintf(stderr, "open: %s\n", err);
    assert_int_equal(rc, 0);
    return e;
}

enum { NJOB = 10, NFORCE = 48 };
typedef struct job {
    int32_t prompt[256];
    int n_prompt, max_tokens;
    float temp;
    uint64_t seed;
    int32_t force[NFORCE];
} job;

/* Prompts of random ids; the forced prefix repeats a period-p motif with a changed token
 * now and then (full, partial and failed drafts); a third of the jobs sample with a seed. */
static void make_jobs(job *jobs, int n, int vocab) {
    smp_rng r;
    smp_rng_seed(&r, 23);
    for (int j = 0; j < n; j++) {
        job *b = &jobs[j];
        b->n_prompt = 4 + (int)(smp_rng_uniform(&r) * 100);
        for (int i = 0; i < b->n_prompt; i++) b->prompt[i] = (int32_t)(smp_rng_uniform(&r) * vocab);
        int period = 3 + j % 5;
        int32_t motif[8];
        for (int i = 0; i < period; i++) motif[i] = (int32_t)(smp_rng_uniform(&r) * vocab);
        for (int i = 0; i < NFORCE; i++) {
            b->force[i] = motif[i % period];
            if (smp_rng_uniform(&r) < 0.12) b->force[i] = (int32_t)(smp_rng_uniform(&r) * vocab);
        }
        b->max_tokens = NFORCE + 10 + (int)(smp_rng_uniform(&r) * 40);
        b->temp = (j % 3 == 2) ? 0.9f : 0.0f;
        b->seed = 500 + (uint64_t)j;
    }
}

static void run_jobs(ls_engine *e, const job *jobs, int n, rec *out, int n_force) {
    ls_engine_hold(e, 1); /* one first step for all: the batch and its mixing are the same each run */
    for (int j = 0; j < n; j++) {
        memset(&out[j], 0, sizeof out[j]);
        pthread_mutex_init(&out[j].mu, NULL);
        pthread_cond_init(&out[j].cv, NULL);
        ls_sampling s;
        ls_sampling_default(&s);
        s.temperature = jobs[j].temp;
        s.has_seed = 1;
        s.seed = jobs[j].seed;
        s.max_tokens = jobs[j].max_tokens;
        s.ignore_eos = 1;
        s.force_ids = jobs[j].force;
        s.n_force = n_force;
        char err[256];
        int64_t id = ls_submit(e, jobs[j].prompt, jobs[j].n_prompt, &s, on_event, &out[j], err, sizeof err);
        if (id <= 0) fprintf(stderr, "submit: %s\n", err);
        assert_true(id > 0);
    }
    ls_engine_hold(e, 0);
    for (int j = 0; j < n; j++) rec_wait(&out[j]);
}

/* A follow-up turn per job: its prompt, the first 6 + 5 j tokens it generated, 3 new ids (a chat's
 * next turn: with the prefix cache on, a hit up to the last page boundary whose GDN snapshot
 * was taken while decoding). Nothing forced: every token is the model's. */
static void follow_ups(const job *jobs, const rec *out, job *next, int n) {
    for (int j = 0; j < n; j++) {
        job *b = &next[j];
        *b = jobs[j];
        int m = 0;
        for (int i = 0; i < jobs[j].n_prompt; i++) b->prompt[m++] = jobs[j].prompt[i];
        /* cut at a different depth per job (page size 8: each lands past another boundary that
         * drafts may have reached inside a step), so the hits restore decode-time snapshots from
         * all over the drafted stretch */
        for (int i = 0; i < 6 + 5 * j && i < out[j].n && m < 250; i++) b->prompt[m++] = out[j].toks[i];
        for (int i = 0; i < 3; i++) b->prompt[m++] = (int32_t)(7 + 13 * j + i);
        b->n_prompt = m;
        b->max_tokens = 24;
        for (int i = 0; i < NFORCE; i++) b->force[i] = -2; /* not forced (n_force 0 below) */
    }
}

static void run_rounds(const eng_cfg *c, job *jobs, job *next, rec *r1, rec *r2, ls_stats *st) {
    ls_engine *e = open_engine(c);
    run_jobs(e, jobs, NJOB, r1, NFORCE);
    follow_ups(jobs, r1, next, NJOB);
    run_jobs(e, next, NJOB, r2, 0);
    ls_engine_stats(e, st);
    ls_engine_close(e);
}

/* f(t) of synth:demo,mtp=chain's MTP head: its draft after token t (synth.h mtp_chain), read from
 * the head's logits (model_mtp_logits_all: the row whose next id is t; the head ignores the rest). */
static model *g_chain;
static int32_t chain_next(int32_t t) {
    if (!g_chain) {
        model_opts mo = {.device = "cpu", .mtp = 1};
        ls_err le = {0};
        if (model_open("synth:demo,mtp=chain", &mo, &g_chain, &le)) fail_msg("open: %s", le.msg);
    }
    const int32_t ids[2] = {0, t};
    float *lg = NULL;
    ls_err le = {0};
    if (model_mtp_logits_all(g_chain, ids, 2, &lg, &le)) fail_msg("mtp logits: %s", le.msg);
    const int V = model_cfg(g_chain)->vocab;
    int32_t best = 0;
    for (int i = 1; i < V; i++)
        if (lg[i] > lg[best]) best = i;
    free(lg);
    return best;
}

/* make_jobs, with each forced prefix following the chain head's f (12% of the tokens changed) */
static void make_jobs_chain(job *jobs, int n, int vocab) {
    make_jobs(jobs, n, vocab);
    smp_rng r;
    smp_rng_seed(&r, 41);
    for (int j = 0; j < n; j++)
        for (int i = 1; i < NFORCE; i++)
            jobs[j].force[i] = smp_rng_uniform(&r) < 0.12 ? (int32_t)(smp_rng_uniform(&r) * vocab)
                                                          : chain_next(jobs[j].force[i - 1]);
}

static void check_same(const eng_cfg *spec_cfg, int expect_preemption) {
    static job jobs[NJOB], next[NJOB];
    static rec plain[NJOB], spec[NJOB], plain2[NJOB], spec2[NJOB];
    eng_cfg pc = *spec_cfg;
    pc.spec = NULL;
    pc.n_draft_tokens = 0;
    const int chain = spec_cfg->model && strstr(spec_cfg->model, "mtp=chain");
    if (chain) make_jobs_chain(jobs, NJOB, 4096);
    else make_jobs(jobs, NJOB, 4096);
    ls_stats st0, st;
    run_rounds(&pc, jobs, next, plain, plain2, &st0);
    run_rounds(spec_cfg, jobs, next, spec, spec2, &st);

    for (int j = 0; j < NJOB; j++) {
        assert_int_equal(plain2[j].n, next[j].max_tokens);
        assert_int_equal(spec2[j].n, next[j].max_tokens);
        for (int i = 0; i < plain2[j].n; i++)
            if (plain2[j].toks[i] != spec2[j].toks[i])
                fail_msg("follow-up of job %d: token %d differs with drafts: %d vs %d without", j, i,
                         spec2[j].toks[i], plain2[j].toks[i]);
    }
    if (spec_cfg->prefix_cache >= 0 && !spec_cfg->max_total_tokens) { /* the follow-ups hit the decode-time snapshots */
        /* (not equal counts: which snapshots the LRU keeps depends on the order requests reach
         * their page boundaries, which drafts change) */
        assert_true(st0.prefix_hit_tokens_total > 0);
        assert_true(st.prefix_hit_tokens_total > 0);
        fprintf(stderr, "  follow-ups: %llu prompt tokens from the cache with drafts, %llu without\n",
                (unsigned long long)st.prefix_hit_tokens_total, (unsigned long long)st0.prefix_hit_tokens_total);
    }
    for (int j = 0; j < NJOB; j++) {
        assert_string_equal(plain[j].reason, "length");
        assert_string_equal(spec[j].reason, "length");
        assert_int_equal(plain[j].n, jobs[j].max_tokens);
        assert_int_equal(spec[j].n, jobs[j].max_tokens);
        for (int i = 0; i < plain[j].n; i++)
            if (plain[j].toks[i] != spec[j].toks[i])
                fail_msg("job %d (temperature %.1f): token %d differs with drafts: %d vs %d without", j,
                         (double)jobs[j].temp, i, spec[j].toks[i], plain[j].toks[i]);
    }
    fprintf(stderr, "  %llu rows verified %llu drafts, %llu accepted; %llu preemptions\n",
            (unsigned long long)st.spec_verify_rows_total, (unsigned long long)st.spec_draft_tokens_total,
            (unsigned long long)st.spec_accepted_tokens_total, (unsigned long long)st.preemptions_total);
    /* drafts ran, some were accepted and some were not */
    assert_true(st.spec_verify_rows_total > 20);
    if (spec_cfg->spec && !strcasecmp(spec_cfg->spec, "ngram") + chain)
        assert_true(st.spec_accepted_tokens_total > 20);
    assert_true(st.spec_accepted_tokens_total < st.spec_draft_tokens_total);
    if (expect_preemption) assert_true(st.preemptions_total > 0);
}

static void test_spec_greedy_and_sampled_match_plain_decoding(void **st) {
    (void)st;
    eng_cfg c = {.spec = "ngram", .n_draft_tokens = 5, .prefix_cache = -1};
    check_same(&c, 0);
}

static void test_spec_with_the_prefix_cache(void **st) {
    (void)st;
    /* snapshots enough that none is evicted: every boundary the requests reached stays hittable */
    eng_cfg c = {.spec = "NGRAM", .n_draft_tokens = 4, .page_size = 8, .prefix_snapshots = 1024};
    check_same(&c, 0);
}

static void test_spec_under_preemption(void **st) {
    (void)st;
    /* 512 tokens of KV for 10 requests of up to ~200: the newest are preempted and recomputed */
    eng_cfg c = {.spec = "ngram", .n_draft_tokens = 3, .max_total_tokens = 512, .page_size = 8};
    check_same(&c, 1);
}

static void test_mtp_drafts_match_plain_decoding(void **st) {
    (void)st;
    eng_cfg c = {.model = "synth:demo,mtp=chain", .spec = "mtp", .n_draft_tokens = 4, .prefix_cache = -1};
    check_same(&c, 0);
}

static void test_mtp_drafts_with_the_prefix_cache(void **st) {
    (void)st;
    eng_cfg c = {.model = "synth:demo,mtp=chain", .spec = "EAGLE", .n_draft_tokens = 5, .page_size = 8,
                 .prefix_snapshots = 1024};
    check_same(&c, 0);
}

static void test_mtp_drafts_under_preemption(void **st) {
    (void)st;
    eng_cfg c = {.model = "synth:demo,mtp=chain", .spec = "nextn", .n_draft_tokens = 3, .max_total_tokens = 512,
                 .page_size = 8};
    check_same(&c, 1);
}

static void test_mtp_drafts_tensor_parallel(void **st) {
    (void)st;
    /* the head's layer sliced as the others, its fc and norms whole on each rank */
    eng_cfg c = {.model = "synth:demo,mtp=chain", .spec = "mtp", .n_draft_tokens = 5, .prefix_cache = -1, .tp = 2};
    check_same(&c, 0);
}

static void test_mtp_random_head_drafts_match_plain_decoding(void **st) {
    (void)st;
    /* the demo's own random head: its drafts are rarely right, the output is still the model's */
    eng_cfg c = {.spec = "mtp", .n_draft_tokens = 4, .prefix_cache = -1};
    check_same(&c, 0);
}

static void test_spec_tensor_parallel(void **st) {
    (void)st;
    /* two ranks on CPU threads: each rank snapshots its shard of the GDN state into the spares */
    eng_cfg c = {.spec = "ngram", .n_draft_tokens = 5, .prefix_cache = -1, .tp = 2};
    check_same(&c, 0);
}

/* One request, its output forced to a copy of its prompt with every 4th token changed: two tokens a
 * verify step, while a verify step of 5 costs the CPU demo model several one-token steps. With the
 * cost model (spec_settle, LASTSTAND_SPEC_ADAPT unset) the request pauses drafting after its first
 * measured verify steps; without it, it drafts at every match. The tokens are the same. */
static int quarter_rows(int adapt, int32_t *toks, int *n_toks) {
    if (adapt) unsetenv("LASTSTAND_SPEC_ADAPT");
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.model_path = "synth:demo";
    o.device = "cpu";
    o.max_running_requests = 2;
    o.speculative_algorithm = "ngram";
    o.speculative_num_draft_tokens = 5;
    ls_engine *e = NULL;
    char err[512] = "";
    int rc = ls_engine_open(&o, &e, err, sizeof err);
    setenv("LASTSTAND_SPEC_ADAPT", "0", 1);
    if (rc) fprintf(stderr, "open: %s\n", err);
    assert_int_equal(rc, 0);
    int32_t prompt[200], force[160];
    smp_rng r;
    smp_rng_seed(&r, 5);
    for (int i = 0; i < 200; i++) prompt[i] = 10 + (int32_t)(smp_rng_uniform(&r) * 4000);
    for (int i = 0; i < 160; i++) force[i] = i % 4 == 3 ? 10 + (int32_t)(smp_rng_uniform(&r) * 4000) : prompt[20 + i];
    static rec out;
    memset(&out, 0, sizeof out);
    pthread_mutex_init(&out.mu, NULL);
    pthread_cond_init(&out.cv, NULL);
    ls_sampling s;
    ls_sampling_default(&s);
    s.temperature = 0;
    s.max_tokens = 160;
    s.ignore_eos = 1;
    s.force_ids = force;
    s.n_force = 160;
    int64_t id = ls_submit(e, prompt, 200, &s, on_event, &out, err, sizeof err);
    assert_true(id > 0);
    rec_wait(&out);
    ls_stats st;
    ls_engine_stats(e, &st);
    ls_engine_close(e);
    assert_int_equal(out.n, 160);
    memcpy(toks, out.toks, sizeof(int32_t) * (size_t)out.n);
    *n_toks = out.n;
    fprintf(stderr, "  cost model %s: %llu verify rows, %llu drafts, %llu accepted\n", adapt ? "on" : "off",
            (unsigned long long)st.spec_verify_rows_total, (unsigned long long)st.spec_draft_tokens_total,
            (unsigned long long)st.spec_accepted_tokens_total);
    return (int)st.spec_verify_rows_total;
}

static void test_cost_model_pauses_drafts_that_do_not_pay(void **st) {
    (void)st;
    static int32_t a[MAXT], b[MAXT];
    int na, nb;
    int off = quarter_rows(0, a, &na), on = quarter_rows(1, b, &nb);
    assert_int_equal(na, nb);
    assert_memory_equal(a, b, sizeof(int32_t) * (size_t)na);
    assert_true(off >= 30);
    assert_true(on > 0 && 2 * on <= off);
}

static void test_bad_options_are_refused_by_name(void **st) {
    (void)st;
    const struct { const char *algo; int n, w0, w1; const char *want; } bad[] = {
        {"medusa", 0, 0, 0, "--speculative-algorithm 'medusa'"},
        {"ngram", 1, 0, 0, "--speculative-num-draft-tokens 1"},
        {"ngram", 6, 0, 0, "--speculative-num-draft-tokens 6: expected 2..5"}, /* GDN model: MODEL_SNAP_MAX drafts */
        {"ngram", 0, 5, 3, "window-size 5..3"},
        {"ngram", -2, 0, 0, "negative"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ls_engine_opts o;
        ls_engine_opts_default(&o);
        o.model_path = "synth:demo";
        o.device = "cpu";
        o.speculative_algorithm = bad[i].algo;
        o.speculative_num_draft_tokens = bad[i].n;
        o.speculative_ngram_min_window = bad[i].w0;
        o.speculative_ngram_max_window = bad[i].w1;
        ls_engine *e = NULL;
        char err[512] = "";
        assert_int_equal(ls_engine_open(&o, &e, err, sizeof err), LS_ERR_INVAL);
        if (!strstr(err, bad[i].want)) fail_msg("case %zu: '%s' does not say '%s'", i, err, bad[i].want);
    }
}

int main(void) {
    setenv("LASTSTAND_TEST_FORCE_IDS", "1", 1);
    /* the mechanics, drafting whenever a match exists: the cost model (spec_settle) would make
     * the drafted steps depend on measured times */
    setenv("LASTSTAND_SPEC_ADAPT", "0", 1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ngram_proposer),
        cmocka_unit_test(test_spec_greedy_and_sampled_match_plain_decoding),
        cmocka_unit_test(test_spec_with_the_prefix_cache),
        cmocka_unit_test(test_spec_under_preemption),
        cmocka_unit_test(test_spec_tensor_parallel),
        cmocka_unit_test(test_cost_model_pauses_drafts_that_do_not_pay),
        cmocka_unit_test(test_mtp_drafts_match_plain_decoding),
        cmocka_unit_test(test_mtp_drafts_with_the_prefix_cache),
        cmocka_unit_test(test_mtp_drafts_under_preemption),
        cmocka_unit_test(test_mtp_drafts_tensor_parallel),
        cmocka_unit_test(test_mtp_random_head_drafts_match_plain_decoding),
        cmocka_unit_test(test_bad_options_are_refused_by_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
