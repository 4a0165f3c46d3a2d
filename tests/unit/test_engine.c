/* test_engine.c: the engine through the public API on the demo model built
 * in memory (synth:demo). The key property of continuous batching: many
 * concurrent requests of different lengths (mixed prefill chunks and decode
 * rows, preemption under a tiny KV pool) produce exactly the tokens each
 * request produces alone. Also: cancellation frees every page, test id
 * forcing, context limits, queue bound, statistics.
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

#include <ftw.h>
#include <unistd.h>

#include "laststand.h"
#include "engine/sampler.h"
#include "model/synth.h"

/* The demo checkpoint (4 layers), written once for the whole file. */
static char g_dir[64];

#define MAXT 512

typedef struct rec {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int32_t toks[MAXT];
    int n, finished, n_events;
    char reason[16];
    char text[4096];
    char matched[64];
    int32_t matched_id;
} rec;

static void rec_init(rec *r) {
    memset(r, 0, sizeof *r);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
}

static void on_event(void *user, const ls_event *ev) {
    rec *r = user;
    pthread_mutex_lock(&r->mu);
    r->n_events++;
    if (ev->token >= 0 && r->n < MAXT) r->toks[r->n++] = ev->token;
    strncat(r->text, ev->text, sizeof r->text - strlen(r->text) - 1);
    if (ev->finished) {
        r->matched_id = ev->matched_stop_id;
        if (ev->matched_stop) snprintf(r->matched, sizeof r->matched, "%s", ev->matched_stop);
        r->finished = 1;
        snprintf(r->reason, sizeof r->reason, "%s", ev->finish_reason);
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
}

static void rec_wait(rec *r) {
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += 120;
    pthread_mutex_lock(&r->mu);
    while (!r->finished)
        if (pthread_cond_timedwait(&r->cv, &r->mu, &dl)) break;
    int f = r->finished;
    pthread_mutex_unlock(&r->mu);
    assert_true(f);
}

static int rec_count(rec *r) {
    pthread_mutex_lock(&r->mu);
    int n = r->n;
    pthread_mutex_unlock(&r->mu);
    return n;
}

static ls_engine *open_engine(int max_run, int chunk, int ctx, int max_total) {
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.model_path = g_dir;
    o.device = "cpu"; /* batch == alone exactly: the CPU's property (a GPU's BF16 plans differ by batch) */
    o.max_running_requests = max_run;
    o.chunked_prefill_size = chunk;
    o.context_length = ctx;
    o.max_total_tokens = max_total;
    ls_engine *e = NULL;
    char err[512] = "";
    int rc = ls_engine_open(&o, &e, err, sizeof err);
    if (rc) fprintf(stderr, "open: %s\n", err);
    assert_int_equal(rc, 0);
    return e;
}

enum { NREQ = 12 };
typedef struct job { int32_t prompt[200]; int n_prompt, max_tokens; float temp; uint64_t seed; } job;

static void make_jobs(job *jobs, int n, int vocab, int max_prompt) {
    smp_rng r;
    smp_rng_seed(&r, 11);
    for (int j = 0; j < n; j++) {
        job *b = &jobs[j];
        b->n_prompt = 2 + (int)(smp_rng_uniform(&r) * (max_prompt - 2));
        for (int i = 0; i < b->n_prompt; i++) b->prompt[i] = (int32_t)(smp_rng_uniform(&r) * vocab);
        b->max_tokens = 3 + (int)(smp_rng_uniform(&r) * 18);
        b->temp = (j % 3 == 2) ? 0.8f : 0.0f; /* a third sampled with a seed */
        b->seed = 1000 + (uint64_t)j;
    }
}

static int64_t submit_job(ls_engine *e, const job *b, rec *r) {
    ls_sampling s;
    ls_sampling_default(&s);
    s.temperature = b->temp;
    s.has_seed = 1;
    s.seed = b->seed;
    s.max_tokens = b->max_tokens;
    s.ignore_eos = 1;
    char err[256];
    int64_t id = ls_submit(e, b->prompt, b->n_prompt, &s, on_event, r, err, sizeof err);
    if (id <= 0) fprintf(stderr, "submit: %s\n", err);
    assert_true(id > 0);
    return id;
}

/* Each job alone, then all at once: identical tokens. */
static void check_batch_matches_alone(ls_engine *e, job *jobs, int n) {
    rec *alone = calloc(n, sizeof *alone), *batch = calloc(n, sizeof *batch);
    for (int j = 0; j < n; j++) {
        rec_init(&alone[j]);
        submit_job(e, &jobs[j], &alone[j]);
        rec_wait(&alone[j]);
        assert_string_equal(alone[j].reason, "length");
        assert_int_equal(alone[j].n, jobs[j].max_tokens);
    }
    for (int j = 0; j < n; j++) { rec_init(&batch[j]); submit_job(e, &jobs[j], &batch[j]); }
    for (int j = 0; j < n; j++) {
        rec_wait(&batch[j]);
        assert_string_equal(batch[j].reason, "length");
        assert_int_equal(batch[j].n, alone[j].n);
        if (memcmp(batch[j].toks, alone[j].toks, sizeof(int32_t) * alone[j].n) != 0) {
            fprintf(stderr, "job %d (prompt %d, temp %g) differs in a batch:\n", j, jobs[j].n_prompt,
                    jobs[j].temp);
            for (int i = 0; i < alone[j].n; i++) fprintf(stderr, " %d/%d", alone[j].toks[i], batch[j].toks[i]);
            fprintf(stderr, "\n");
            fail();
        }
    }
    free(alone);
    free(batch);
}

static void test_concurrent_requests_match_each_alone(void **st) {
    (void)st;
    ls_engine *e = open_engine(8, 48, 512, 0); /* 48-token budget: prompts prefill in chunks */
    ls_model_info mi;
    ls_engine_model_info(e, &mi);
    job jobs[NREQ];
    make_jobs(jobs, NREQ, mi.vocab_size, 120);
    check_batch_matches_alone(e, jobs, NREQ);
    ls_stats s;
    ls_engine_stats(e, &s);
    assert_int_equal(s.kv_pages_used, 0);
    assert_int_equal(s.running, 0);
    assert_int_equal((int)s.requests_total, 2 * NREQ);
    assert_int_equal((int)s.ttft.n, 2 * NREQ);
    assert_int_equal((int)s.e2e.n, 2 * NREQ);
    uint64_t gen = 0;
    for (int j = 0; j < NREQ; j++) gen += 2 * (uint64_t)jobs[j].max_tokens;
    assert_int_equal((int)s.generation_tokens_total, (int)gen);
    assert_int_equal((int)s.itl.n, (int)(gen - 2 * NREQ));
    ls_engine_close(e);
}

static void test_tiny_kv_pool_preempts_and_still_matches(void **st) {
    (void)st;
    /* 160 tokens of KV for 12 requests of up to ~80 prompt + 20 new tokens */
    ls_engine *e = open_engine(12, 64, 160, 160);
    ls_model_info mi;
    ls_engine_model_info(e, &mi);
    assert_int_equal(mi.max_total_tokens, 160);
    job jobs[NREQ];
    make_jobs(jobs, NREQ, mi.vocab_size, 80);
    check_batch_matches_alone(e, jobs, NREQ);
    ls_stats s;
    ls_engine_stats(e, &s);
    assert_true(s.preemptions_total > 0);
    assert_int_equal(s.kv_pages_used, 0);
    assert_int_equal(s.running + s.queued, 0);
    ls_engine_close(e);
}

static void test_cancel_frees_every_page(void **st) {
    (void)st;
    ls_engine *e = open_engine(4, 256, 512, 0);
    ls_model_info mi;
    ls_engine_model_info(e, &mi);
    job jobs[6];
    make_jobs(jobs, 6, mi.vocab_size, 100);
    rec r[6];
    int64_t ids[6];
    for (int j = 0; j < 6; j++) {
        jobs[j].max_tokens = 400;
        rec_init(&r[j]);
        ids[j] = submit_job(e, &jobs[j], &r[j]);
    }
    /* wait until the first four are decoding; two stay queued */
    for (int j = 0; j < 4; j++)
        for (int k = 0; k < 2000 && rec_count(&r[j]) < 2; k++) nanosleep(&(struct timespec){0, 5000000}, NULL);
    for (int j = 0; j < 6; j++) ls_cancel(e, ids[j]);
    for (int j = 0; j < 6; j++) {
        rec_wait(&r[j]);
        assert_string_equal(r[j].reason, "abort");
        assert_true(r[j].n < 400);
    }
    ls_stats s;
    ls_engine_stats(e, &s);
    assert_int_equal(s.kv_pages_used, 0);
    assert_true(s.kv_usage == 0);
    assert_int_equal(s.running + s.queued, 0);
    /* cancelling a finished request is harmless; the engine keeps serving */
    ls_cancel(e, ids[0]);
    rec again;
    rec_init(&again);
    jobs[0].max_tokens = 3;
    submit_job(e, &jobs[0], &again);
    rec_wait(&again);
    assert_string_equal(again.reason, "length");
    ls_engine_close(e);
}

static void test_close_aborts_pending_requests(void **st) {
    (void)st;
    ls_engine *e = open_engine(2, 256, 512, 0);
    ls_model_info mi;
    ls_engine_model_info(e, &mi);
    job jobs[4];
    make_jobs(jobs, 4, mi.vocab_size, 50);
    rec r[4];
    for (int j = 0; j < 4; j++) {
        jobs[j].max_tokens = 400;
        rec_init(&r[j]);
        submit_job(e, &jobs[j], &r[j]);
    }
    ls_engine_close(e);
    for (int j = 0; j < 4; j++) {
        assert_true(r[j].finished);
        assert_string_equal(r[j].reason, "abort");
    }
}

/* ls_engine_hold: while held, submissions wait and running requests pause; the release admits
 * them all at once; the tokens are those of the same requests submitted without a hold (the
 * CPU's batch == alone); close overrides a hold. */
static void sleep_ms(int ms) { nanosleep(&(struct timespec){ms / 1000, (long)(ms % 1000) * 1000000L}, NULL); }

static void test_hold_pauses_and_releases_a_batch(void **st) {
    (void)st;
    ls_engine *e = open_engine(4, 256, 512, 0);
    ls_model_info mi;
    ls_engine_model_info(e, &mi);
    job jobs[3];
    make_jobs(jobs, 3, mi.vocab_size, 60);
    rec ref[3], r[3];
    for (int j = 0; j < 3; j++) { /* the reference: submitted without a hold */
        rec_init(&ref[j]);
        submit_job(e, &jobs[j], &ref[j]);
    }
    for (int j = 0; j < 3; j++) rec_wait(&ref[j]);
    ls_stats s0, s1;
    ls_engine_stats(e, &s0);
    ls_engine_hold(e, 1);
    for (int j = 0; j < 3; j++) {
        rec_init(&r[j]);
        submit_job(e, &jobs[j], &r[j]);
    }
    sleep_ms(300);
    ls_engine_stats(e, &s1);
    assert_true(s1.generation_tokens_total == s0.generation_tokens_total); /* no step ran */
    for (int j = 0; j < 3; j++) assert_int_equal(rec_count(&r[j]), 0);
    ls_engine_hold(e, 0);
    for (int j = 0; j < 3; j++) {
        rec_wait(&r[j]);
        assert_string_equal(r[j].reason, "length");
        assert_int_equal(r[j].n, ref[j].n);
        assert_memory_equal(r[j].toks, ref[j].toks, sizeof(int32_t) * ref[j].n);
    }
    /* a running request pauses under a hold and resumes after it */
    rec run;
    rec_init(&run);
    jobs[0].max_tokens = 400;
    submit_job(e, &jobs[0], &run);
    for (int k = 0; k < 2000 && rec_count(&run) < 2; k++) sleep_ms(5);
    ls_engine_hold(e, 1);
    sleep_ms(100); /* the step in progress ends */
    const int c1 = rec_count(&run);
    sleep_ms(200);
    assert_int_equal(rec_count(&run), c1);
    assert_false(run.finished);
    ls_engine_hold(e, 0);
    rec_wait(&run);
    assert_string_equal(run.reason, "length");
    assert_int_equal(run.n, 400);
    /* close overrides a hold: the held request ends with "abort" and close returns */
    rec held;
    rec_init(&held);
    ls_engine_hold(e, 1);
    submit_job(e, &jobs[1], &held);
    ls_engine_close(e);
    assert_true(held.finished);
    assert_string_equal(held.reason, "abort");
}

static void test_prompt_longer_than_context_is_rejected_with_both_numbers(void **st) {
    (void)st;
    ls_engine *e = open_engine(2, 64, 64, 0);
    int32_t p[64] = {0};
    ls_sampling s;
    ls_sampling_default(&s);
    char err[256] = "";
    rec r;
    rec_init(&r);
    int64_t id = ls_submit(e, p, 64, &s, on_event, &r, err, sizeof err);
    assert_int_equal(id, LS_ERR_INVAL);
    assert_non_null(strstr(err, "64 tokens"));
    assert_non_null(strstr(err, "context length of 64"));
    /* max_tokens is capped so prompt + completion fits: 60 + 4 */
    s.temperature = 0;
    s.ignore_eos = 1;
    s.max_tokens = 100;
    id = ls_submit(e, p, 60, &s, on_event, &r, err, sizeof err);
    assert_true(id > 0);
    rec_wait(&r);
    assert_int_equal(r.n, 4);
    assert_string_equal(r.reason, "length");
    /* bad sampling parameters name the field */
    s.top_p = 0;
    assert_int_equal(ls_submit(e, p, 4, &s, on_event, &r, err, sizeof err), LS_ERR_INVAL);
    assert_non_null(strstr(err, "top_p"));
    ls_engine_close(e);
}

static void test_forced_ids_then_greedy_resumes(void **st) {
    (void)st;
    setenv("LASTSTAND_TEST_FORCE_IDS", "1", 1);
    ls_engine *e = open_engine(4, 256, 512, 0);
    unsetenv("LASTSTAND_TEST_FORCE_IDS");
    int32_t p[40];
    for (int i = 0; i < 40; i++) p[i] = (i * 37 + 5) % 200;
    int32_t force[3] = {7, 8, 9};
    ls_sampling s;
    ls_sampling_default(&s);
    s.temperature = 0;
    s.ignore_eos = 1;
    s.max_tokens = 8;
    s.force_ids = force;
    s.n_force = 3;
    char err[256];
    rec a, b;
    rec_init(&a);
    rec_init(&b);
    assert_true(ls_submit(e, p, 37, &s, on_event, &a, err, sizeof err) > 0);
    rec_wait(&a);
    assert_int_equal(a.n, 8);
    assert_memory_equal(a.toks, force, sizeof force);
    /* oracle: the prompt with the forced ids appended continues the same way */
    memcpy(p + 37, force, sizeof force);
    s.force_ids = NULL;
    s.n_force = 0;
    s.max_tokens = 5;
    assert_true(ls_submit(e, p, 40, &s, on_event, &b, err, sizeof err) > 0);
    rec_wait(&b);
    assert_memory_equal(a.toks + 3, b.toks, 5 * sizeof(int32_t));
    /* a forced -1 means NaN logits: that request fails, the others go on */
    int32_t nan_force[2] = {7, -1};
    s.force_ids = nan_force;
    s.n_force = 2;
    rec c, d;
    rec_init(&c);
    rec_init(&d);
    assert_true(ls_submit(e, p, 37, &s, on_event, &c, err, sizeof err) > 0);
    s.force_ids = NULL;
    s.n_force = 0;
    assert_true(ls_submit(e, p, 40, &s, on_event, &d, err, sizeof err) > 0);
    rec_wait(&c);
    rec_wait(&d);
    assert_string_equal(c.reason, "error");
    assert_int_equal(c.n, 1);
    assert_string_equal(d.reason, "length");
    assert_memory_equal(d.toks, b.toks, 5 * sizeof(int32_t));
    ls_stats st2;
    ls_engine_stats(e, &st2);
    assert_int_equal((int)st2.nan_logits_total, 1);
    assert_int_equal((int)st2.requests_failed_total, 1);
    assert_int_equal(st2.kv_pages_used, 0);
    ls_engine_close(e);
}

/* Text deltas concatenate to the detokenized ids; a stop string taken from
 * that text (spanning a token boundary) ends the request right before it;
 * a stop id ends it on that token. */
static void test_text_stop_strings_and_stop_ids(void **st) {
    (void)st;
    ls_engine *e = open_engine(4, 256, 512, 0);
    int32_t *p = NULL;
    char err[256];
    int n = ls_tokenize(e, "The quick brown fox jumps over the lazy dog. Once upon a time", &p, err, sizeof err);
    assert_true(n > 0);
    ls_sampling s;
    ls_sampling_default(&s);
    s.temperature = 0;
    s.ignore_eos = 1;
    s.max_tokens = 24;
    rec a;
    rec_init(&a);
    assert_true(ls_submit(e, p, n, &s, on_event, &a, err, sizeof err) > 0);
    rec_wait(&a);
    char *full = ls_detokenize(e, a.toks, a.n, 1);
    assert_string_equal(a.text, full);
    /* a stop string starting inside token 4's text and ending in a later one */
    char *pre = ls_detokenize(e, a.toks, 4, 1);
    size_t off = strlen(pre) > 0 ? strlen(pre) - 1 : 0;
    while (off > 0 && ((unsigned char)full[off] & 0xC0) == 0x80) off--;
    size_t len = 3;
    while (off + len < strlen(full) && ((unsigned char)full[off + len] & 0xC0) == 0x80) len++;
    if (off + len > strlen(full)) len = strlen(full) - off;
    char stop[32] = {0};
    memcpy(stop, full + off, len);
    char *first = strstr(full, stop);
    const char *stops[1] = {stop};
    s.stop = stops;
    s.n_stop = 1;
    rec b;
    rec_init(&b);
    assert_true(ls_submit(e, p, n, &s, on_event, &b, err, sizeof err) > 0);
    rec_wait(&b);
    assert_string_equal(b.reason, "stop");
    assert_string_equal(b.matched, stop);
    assert_int_equal(strlen(b.text), (size_t)(first - full));
    assert_memory_equal(b.text, full, strlen(b.text));
    /* stop id: the first occurrence of token 3 ends the request there */
    s.stop = NULL;
    s.n_stop = 0;
    s.ignore_eos = 0;
    int32_t sid = a.toks[3];
    int at = 0;
    while (a.toks[at] != sid) at++;
    s.stop_ids = &sid;
    s.n_stop_ids = 1;
    rec c;
    rec_init(&c);
    assert_true(ls_submit(e, p, n, &s, on_event, &c, err, sizeof err) > 0);
    rec_wait(&c);
    assert_string_equal(c.reason, "stop");
    assert_int_equal(c.matched_id, sid);
    assert_int_equal(c.n, at + 1);
    /* min_tokens suppresses the stop id before the minimum */
    s.min_tokens = at + 2;
    rec d;
    rec_init(&d);
    assert_true(ls_submit(e, p, n, &s, on_event, &d, err, sizeof err) > 0);
    rec_wait(&d);
    assert_true(d.n >= at + 2);
    for (int i = 0; i < at + 2; i++) assert_int_not_equal(d.toks[i], sid);
    free(full);
    free(pre);
    free(p);
    ls_engine_close(e);
}

static void test_full_queue_is_busy(void **st) {
    (void)st;
    ls_engine_opts o;
    ls_engine_opts_default(&o);
    o.model_path = g_dir;
    o.device = "cpu";
    o.max_running_requests = 1;
    o.max_queued_requests = 2;
    o.context_length = 512;
    ls_engine *e = NULL;
    char err[256];
    assert_int_equal(ls_engine_open(&o, &e, err, sizeof err), 0);
    int32_t p[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ls_sampling s;
    ls_sampling_default(&s);
    s.max_tokens = 400;
    s.ignore_eos = 1;
    rec r[4];
    int64_t ids[4];
    int busy = 0;
    for (int j = 0; j < 4; j++) {
        rec_init(&r[j]);
        ids[j] = ls_submit(e, p, 8, &s, on_event, &r[j], err, sizeof err);
        if (ids[j] == LS_ERR_BUSY) { busy++; assert_non_null(strstr(err, "queue is full")); }
    }
    assert_true(busy >= 1);
    for (int j = 0; j < 4; j++) if (ids[j] > 0) ls_cancel(e, ids[j]);
    for (int j = 0; j < 4; j++) if (ids[j] > 0) rec_wait(&r[j]);
    ls_engine_close(e);
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(p);
}

static int group_setup(void **st) {
    (void)st;
    snprintf(g_dir, sizeof g_dir, "/tmp/ls_test_engine_XXXXXX");
    if (!mkdtemp(g_dir)) return -1;
    synth_opts so = {.preset = "demo", .layers = 4};
    ls_err e = {0};
    if (synth_write(&so, g_dir, &e)) { fprintf(stderr, "synth: %s\n", e.msg); return -1; }
    return 0;
}

static int group_teardown(void **st) {
    (void)st;
    nftw(g_dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_concurrent_requests_match_each_alone),
        cmocka_unit_test(test_tiny_kv_pool_preempts_and_still_matches),
        cmocka_unit_test(test_cancel_frees_every_page),
        cmocka_unit_test(test_close_aborts_pending_requests),
        cmocka_unit_test(test_hold_pauses_and_releases_a_batch),
        cmocka_unit_test(test_prompt_longer_than_context_is_rejected_with_both_numbers),
        cmocka_unit_test(test_forced_ids_then_greedy_resumes),
        cmocka_unit_test(test_text_stop_strings_and_stop_ids),
        cmocka_unit_test(test_full_queue_is_busy),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
