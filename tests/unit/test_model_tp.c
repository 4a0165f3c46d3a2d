/* test_model_tp.c: the tensor-parallel coordination that CUDA graphs under
 * --tp rely on (model_tp.c, model.c), on CPU ranks (threads) of synth:demo:
 * - tp_each runs a function once on every rank model, concurrently (a
 *   function that waits for all ranks at a barrier would hang otherwise);
 * - tp_all is a collective AND: over many rounds of different ballots every
 *   rank gets the same verdict, equal to the AND of that round's ballots
 *   (a round's ballots never leak into the next one's count);
 * - mdl_graphs_sync makes a bucket stale on every rank when it is stale on
 *   one, leaves fresh buckets alone, and makes a warm-up due on all when due
 *   on one;
 * - tp_graphs_supported refuses a group without NCCL communicators, saying so.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "model/model_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

enum { N = 2, ROUNDS = 2000 };

static model *open_tp(void) {
    model_opts o = {.device = "cpu", .tp = N};
    model *m = NULL;
    ls_err e = {0};
    if (model_open("synth:demo", &o, &m, &e)) fail_msg("open synth:demo --tp %d: %s", N, e.msg);
    return m;
}

typedef struct votes {
    int ballot[N][ROUNDS];
    int verdict[N][ROUNDS];
    int seen[N];
    pthread_t thread[N];
} votes;

static int vote_rank(model *rm, void *arg, ls_err *e) {
    votes *v = arg;
    const int r = rm->rank;
    v->seen[r]++;
    v->thread[r] = pthread_self();
    for (int k = 0; k < ROUNDS; k++) v->verdict[r][k] = tp_all(rm, v->ballot[r][k]);
    return 0;
}

static void test_tp_each_and_tp_all_agree(void **st) {
    (void)st;
    model *m = open_tp();
    static votes v;
    memset(&v, 0, sizeof v);
    uint64_t x = 88172645463325252ull;
    for (int k = 0; k < ROUNDS; k++)
        for (int r = 0; r < N; r++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            v.ballot[r][k] = (x % 4) != 0; /* mostly yes, so AND verdicts of both kinds occur */
        }
    ls_err e = {0};
    assert_int_equal(tp_each(m, vote_rank, &v, &e), 0);
    int ones = 0;
    for (int r = 0; r < N; r++) assert_int_equal(v.seen[r], 1);
    assert_false(pthread_equal(v.thread[0], v.thread[1]));
    for (int k = 0; k < ROUNDS; k++) {
        int want = 1;
        for (int r = 0; r < N; r++) want &= v.ballot[r][k];
        for (int r = 0; r < N; r++)
            if (v.verdict[r][k] != want) fail_msg("round %d rank %d: verdict %d, AND of ballots %d", k, r, v.verdict[r][k], want);
        ones += want;
    }
    assert_true(ones > 0 && ones < ROUNDS);
    model_close(m);
}

static int fail_on_rank1(model *rm, void *arg, ls_err *e) {
    (void)arg;
    return rm->rank == 1 ? errf(e, ERR_RUNTIME, "boom") : 0;
}

static void test_tp_each_reports_the_failing_rank(void **st) {
    (void)st;
    model *m = open_tp();
    ls_err e = {0};
    assert_int_equal(tp_each(m, fail_on_rank1, NULL, &e), ERR_RUNTIME);
    assert_non_null(strstr(e.msg, "rank 1"));
    assert_non_null(strstr(e.msg, "boom"));
    model_close(m);
}

static void test_graphs_sync_makes_staleness_common(void **st) {
    (void)st;
    model *m = open_tp();
    /* fake bookkeeping (no graphs exist on the CPU): two captured buckets, fresh everywhere */
    for (int r = 0; r < N; r++) {
        model *rm = m->rank_m[r];
        rm->n_graphs = 2;
        rm->graph_gen = 7;
        rm->warm_gen = 7;
        rm->graphs[0] = (mgraph){.bs = 1, .state = 1, .gen = 7};
        rm->graphs[1] = (mgraph){.bs = 2, .state = 1, .gen = 7};
    }
    mdl_graphs_sync(m);
    for (int r = 0; r < N; r++) {
        assert_int_equal(m->rank_m[r]->graphs[0].gen, 7);
        assert_int_equal(m->rank_m[r]->graphs[1].gen, 7);
        assert_int_equal(m->rank_m[r]->warm_gen, 7);
    }
    /* rank 1's workspace moved (its graph_gen bumped): its buckets are stale, and so rank 0's */
    m->rank_m[1]->graph_gen = 8;
    m->rank_m[1]->graphs[0].state = -1; /* a bucket that runs eagerly is never stale */
    m->rank_m[0]->graphs[0].state = -1;
    mdl_graphs_sync(m);
    for (int r = 0; r < N; r++) {
        const model *rm = m->rank_m[r];
        assert_int_equal(rm->graphs[0].gen, 7);  /* eager bucket: untouched */
        assert_true(rm->graphs[1].gen != rm->graph_gen); /* stale on both */
        assert_true(rm->warm_gen != rm->graph_gen);      /* warm-up due on both */
    }
    for (int r = 0; r < N; r++) m->rank_m[r]->n_graphs = 0; /* nothing real to destroy at close */
    model_close(m);
}

static void test_cpu_group_cannot_capture(void **st) {
    (void)st;
    model *m = open_tp();
    char why[256] = "";
    assert_int_equal(tp_graphs_supported(m, why, sizeof why), 0);
    assert_non_null(strstr(why, "NCCL"));
    model_close(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tp_each_and_tp_all_agree),
        cmocka_unit_test(test_tp_each_reports_the_failing_rank),
        cmocka_unit_test(test_graphs_sync_makes_staleness_common),
        cmocka_unit_test(test_cpu_group_cannot_capture),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
