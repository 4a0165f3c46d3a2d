/* test_resp_store.c: the Responses API's stored responses (server/resp_store.c):
 * lookups copy the texts out, the byte budget evicts the oldest entries first,
 * an entry over the whole budget is refused, a second put under an id replaces
 * the first, and delete forgets. Threads hammer one store to catch lock gaps. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server.h"

static int put(resp_store *s, const char *id, const char *resp, const char *items, const char *input) {
    char *t[RSTORE_NTEXT] = {resp ? strdup(resp) : NULL, items ? strdup(items) : NULL, input ? strdup(input) : NULL};
    int rc = rstore_put(s, id, t);
    for (int i = 0; i < RSTORE_NTEXT; i++) assert_null(t[i]); /* taken either way */
    return rc;
}

static void expect_text(resp_store *s, const char *id, int which, const char *want) {
    char *t = NULL;
    assert_int_equal(rstore_get(s, id, which, &t), 0);
    assert_non_null(t);
    assert_string_equal(t, want);
    free(t);
}

static void test_put_get_delete(void **st) {
    (void)st;
    resp_store *s = rstore_new(1 << 20);
    assert_int_equal(put(s, "resp_a", "{\"id\":\"resp_a\"}", "[1]", "[2]"), 0);
    expect_text(s, "resp_a", RSTORE_RESPONSE, "{\"id\":\"resp_a\"}");
    expect_text(s, "resp_a", RSTORE_ITEMS, "[1]");
    expect_text(s, "resp_a", RSTORE_INPUT, "[2]");
    char *t = (char *)1;
    assert_int_equal(rstore_get(s, "resp_b", RSTORE_RESPONSE, &t), -1);
    assert_null(t);
    /* a second put under the same id replaces the entry, not adds one */
    assert_int_equal(put(s, "resp_a", "{\"v\":2}", "[]", "[]"), 0);
    expect_text(s, "resp_a", RSTORE_RESPONSE, "{\"v\":2}");
    size_t n, bytes;
    rstore_stats(s, &n, &bytes);
    assert_int_equal(n, 1);
    assert_int_equal(rstore_delete(s, "resp_a"), 0);
    assert_int_equal(rstore_delete(s, "resp_a"), -1);
    assert_int_equal(rstore_get(s, "resp_a", RSTORE_RESPONSE, &t), -1);
    rstore_stats(s, &n, &bytes);
    assert_int_equal(n, 0);
    assert_int_equal(bytes, 0);
    rstore_free(s);
}

static void test_budget_evicts_oldest_first(void **st) {
    (void)st;
    char big[1001];
    memset(big, 'x', 1000);
    big[1000] = 0;
    resp_store *s = rstore_new(4500); /* room for four entries of ~1.1 KB, not five */
    char id[16];
    for (int i = 0; i < 4; i++) {
        snprintf(id, sizeof id, "r%d", i);
        assert_int_equal(put(s, id, big, "[]", "[]"), 0);
    }
    size_t n, bytes;
    rstore_stats(s, &n, &bytes);
    assert_int_equal(n, 4);
    assert_true(bytes <= 4500);
    assert_int_equal(put(s, "r4", big, "[]", "[]"), 0);
    rstore_stats(s, &n, &bytes);
    assert_int_equal(n, 4);
    assert_true(bytes <= 4500);
    char *t = NULL;
    assert_int_equal(rstore_get(s, "r0", RSTORE_RESPONSE, &t), -1); /* the oldest went */
    for (int i = 1; i <= 4; i++) {
        snprintf(id, sizeof id, "r%d", i);
        expect_text(s, id, RSTORE_RESPONSE, big);
    }
    /* an entry over the whole budget is refused and evicts nothing */
    char *huge = malloc(6000);
    memset(huge, 'y', 5999);
    huge[5999] = 0;
    assert_int_equal(put(s, "rh", huge, "[]", "[]"), -1);
    free(huge);
    rstore_stats(s, &n, &bytes);
    assert_int_equal(n, 4);
    assert_int_equal(rstore_get(s, "rh", RSTORE_RESPONSE, &t), -1);
    rstore_free(s);
    /* a zero budget keeps nothing */
    s = rstore_new(0);
    assert_int_equal(put(s, "z", "{}", "[]", "[]"), -1);
    assert_int_equal(rstore_get(s, "z", RSTORE_RESPONSE, &t), -1);
    rstore_free(s);
}

typedef struct hctx { resp_store *s; int k; } hctx;

static void *hammer(void *arg) {
    resp_store *s = ((hctx *)arg)->s;
    int k = ((hctx *)arg)->k;
    char id[32], want[64];
    for (int i = 0; i < 2000; i++) {
        snprintf(id, sizeof id, "t%d-%d", k, i % 50);
        snprintf(want, sizeof want, "{\"i\":%d}", i);
        char *t[RSTORE_NTEXT] = {strdup(want), strdup("[]"), strdup("[]")};
        rstore_put(s, id, t);
        char *got = NULL;
        if (rstore_get(s, id, RSTORE_RESPONSE, &got) == 0 && got && strcmp(got, want)) {
            /* another thread may have evicted it, never changed it */
            free(got);
            return (void *)1;
        }
        free(got);
        if (i % 7 == 0) rstore_delete(s, id);
    }
    return NULL;
}

static void test_threads(void **st) {
    (void)st;
    resp_store *s = rstore_new(20000);
    pthread_t th[4];
    hctx hc[4];
    for (int i = 0; i < 4; i++) {
        hc[i] = (hctx){s, i};
        pthread_create(&th[i], NULL, hammer, &hc[i]);
    }
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(th[i], &r);
        assert_null(r);
    }
    size_t n, bytes;
    rstore_stats(s, &n, &bytes);
    assert_true(bytes <= 20000);
    rstore_free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_get_delete),
        cmocka_unit_test(test_budget_evicts_oldest_first),
        cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
