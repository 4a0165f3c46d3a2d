/* test_engine_stop.c: stop strings matched across token boundaries on the
 * streamed text: held-back prefixes, overlapping prefixes, the earliest match
 * winning, UTF-8 text, and release of held text at the end.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "engine/stop.h"

/* Feed deltas in order; returns the matched index (or -1) and fills out with
 * everything emitted (plus the flushed tail when nothing matched). */
static int run(const char *const *stops, int n_stops, const char *const *deltas, int n, buf *out,
               int *emitted_before_last) {
    stop_matcher m;
    stop_init(&m, stops, n_stops);
    buf_init(out);
    int k = -1;
    for (int i = 0; i < n && k < 0; i++) {
        if (emitted_before_last && i == n - 1) *emitted_before_last = (int)out->len;
        k = stop_feed(&m, deltas[i], strlen(deltas[i]), out);
    }
    if (k < 0) stop_flush(&m, out);
    stop_free(&m);
    if (!out->data) buf_puts(out, "");
    return k;
}

static void test_stop_inside_one_delta_is_trimmed(void **st) {
    (void)st;
    buf o;
    const char *s[] = {"STOP"};
    assert_int_equal(run(s, 1, (const char *[]){"hello STOP world"}, 1, &o, NULL), 0);
    assert_string_equal(o.data, "hello ");
    buf_free(&o);
}

static void test_stop_split_across_tokens_never_leaks(void **st) {
    (void)st;
    buf o;
    const char *s[] = {"</end>"};
    int before = 0;
    assert_int_equal(run(s, 1, (const char *[]){"abc<", "/e", "nd>tail"}, 3, &o, &before), 0);
    assert_string_equal(o.data, "abc");
    assert_int_equal(before, 3); /* "<" and "/e" were held back */
    buf_free(&o);
}

static void test_held_prefix_is_released_when_it_stops_matching(void **st) {
    (void)st;
    buf o;
    const char *s[] = {"</end>"};
    assert_int_equal(run(s, 1, (const char *[]){"a<", "/x", "y"}, 3, &o, NULL), -1);
    assert_string_equal(o.data, "a</xy");
    buf_free(&o);
    /* the held tail is released at the end of generation */
    assert_int_equal(run(s, 1, (const char *[]){"ab</en"}, 1, &o, NULL), -1);
    assert_string_equal(o.data, "ab</en");
    buf_free(&o);
}

static void test_overlapping_prefix_keeps_only_possible_start(void **st) {
    (void)st;
    buf o;
    const char *s[] = {"aab"};
    assert_int_equal(run(s, 1, (const char *[]){"a", "a", "a", "b", "c"}, 5, &o, NULL), 0);
    assert_string_equal(o.data, "a");
    buf_free(&o);
}

static void test_earliest_match_wins_then_list_order(void **st) {
    (void)st;
    buf o;
    const char *s[] = {"world", "lo w"};
    assert_int_equal(run(s, 2, (const char *[]){"hello world"}, 1, &o, NULL), 1);
    assert_string_equal(o.data, "hel");
    buf_free(&o);
    const char *t[] = {"ab", "abc"};
    assert_int_equal(run(t, 2, (const char *[]){"xabc"}, 1, &o, NULL), 0);
    assert_string_equal(o.data, "x");
    buf_free(&o);
}

static void test_utf8_stop_strings_and_text(void **st) {
    (void)st;
    buf o;
    const char *s[] = {"\xc3\xa9!"}; /* "é!" */
    assert_int_equal(run(s, 1, (const char *[]){"caf", "\xc3\xa9", "!", "more"}, 4, &o, NULL), 0);
    assert_string_equal(o.data, "caf");
    buf_free(&o);
    const char *t[] = {"\xc3\xafx"}; /* "ïx" */
    int before = 0;
    assert_int_equal(run(t, 1, (const char *[]){"na\xc3\xaf", "ve"}, 2, &o, &before), -1);
    assert_int_equal(before, 2); /* "ï" held back whole */
    assert_string_equal(o.data, "na\xc3\xafve");
    buf_free(&o);
}

static void test_no_stop_strings_pass_through(void **st) {
    (void)st;
    buf o;
    assert_int_equal(run(NULL, 0, (const char *[]){"a", "bc"}, 2, &o, NULL), -1);
    assert_string_equal(o.data, "abc");
    buf_free(&o);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stop_inside_one_delta_is_trimmed),
        cmocka_unit_test(test_stop_split_across_tokens_never_leaks),
        cmocka_unit_test(test_held_prefix_is_released_when_it_stops_matching),
        cmocka_unit_test(test_overlapping_prefix_keeps_only_possible_start),
        cmocka_unit_test(test_earliest_match_wins_then_list_order),
        cmocka_unit_test(test_utf8_stop_strings_and_text),
        cmocka_unit_test(test_no_stop_strings_pass_through),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
