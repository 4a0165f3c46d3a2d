/* test_parser_reasoning.c: the qwen3 reasoning parser against the examples of
 * reference/peers-and-parsers.md 2.1, and streaming == one-shot for every
 * split of the text into two deltas and into single bytes. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "server/server.h"

static void oneshot(const char *text, int force, char **r, char **c) {
    buf rb, cb; buf_init(&rb); buf_init(&cb);
    rp_parse(text, force, &rb, &cb);
    *r = buf_detach(&rb); *c = buf_detach(&cb);
}

/* Feed text cut at the given offsets (sorted, may be empty). */
static void streamed(const char *text, int force, int stream_reasoning, const size_t *cuts, int ncuts,
                     char **r, char **c) {
    rp_state s; rp_init(&s, force, stream_reasoning);
    buf rb, cb; buf_init(&rb); buf_init(&cb);
    size_t prev = 0, n = strlen(text);
    for (int i = 0; i <= ncuts; i++) {
        size_t end = i < ncuts ? cuts[i] : n;
        rp_feed(&s, text + prev, end - prev, &rb, &cb);
        prev = end;
    }
    rp_finish(&s, &rb, &cb);
    rp_free(&s);
    *r = buf_detach(&rb); *c = buf_detach(&cb);
}

static void test_reference_example_splits_at_think_close(void **st) {
    (void)st;
    char *r, *c;
    oneshot("User asks 2+2.\n</think>\n\nIt is 4.", 1, &r, &c);
    assert_string_equal(r, "User asks 2+2.\n");
    assert_string_equal(c, "\n\nIt is 4.");
    free(r); free(c);
}

static void test_reference_stream_buffers_partial_close_tag(void **st) {
    (void)st;
    const char *deltas[] = {"Let me", " think", "</th", "ink>\n\nHi"};
    const char *want_r[] = {"Let me", " think", "", ""};
    const char *want_c[] = {"", "", "", "\n\nHi"};
    rp_state s; rp_init(&s, 1, 1);
    for (int i = 0; i < 4; i++) {
        buf rb, cb; buf_init(&rb); buf_init(&cb);
        rp_feed(&s, deltas[i], strlen(deltas[i]), &rb, &cb);
        assert_string_equal(rb.data ? rb.data : "", want_r[i]);
        assert_string_equal(cb.data ? cb.data : "", want_c[i]);
        buf_free(&rb); buf_free(&cb);
    }
    rp_free(&s);
}

static void test_leading_think_enters_reasoning_without_force(void **st) {
    (void)st;
    char *r, *c;
    oneshot("<think>\nhmm\n</think>\n\nHello", 0, &r, &c);
    assert_string_equal(r, "\nhmm\n");
    assert_string_equal(c, "\n\nHello");
    free(r); free(c);
}

static void test_no_reasoning_when_not_forced_and_no_tag(void **st) {
    (void)st;
    char *r, *c;
    oneshot("Hello </think> world", 0, &r, &c);
    assert_string_equal(r, "");
    assert_string_equal(c, "Hello </think> world");
    free(r); free(c);
}

static void test_truncated_thinking_is_all_reasoning(void **st) {
    (void)st;
    char *r, *c;
    oneshot("still thinking <tool", 1, &r, &c);
    assert_string_equal(r, "still thinking <tool");
    assert_string_equal(c, "");
    free(r); free(c);
}

static void test_tool_call_before_think_close_ends_reasoning(void **st) {
    (void)st;
    char *r, *c;
    oneshot("need weather\n<tool_call>\n<function=f>\n</function>\n</tool_call></think>", 1, &r, &c);
    assert_string_equal(r, "need weather\n");
    assert_string_equal(c, "<tool_call>\n<function=f>\n</function>\n</tool_call></think>");
    free(r); free(c);
}

static void test_think_close_before_tool_call_wins(void **st) {
    (void)st;
    char *r, *c;
    oneshot("a</think>\n\n<tool_call>x</tool_call>", 1, &r, &c);
    assert_string_equal(r, "a");
    assert_string_equal(c, "\n\n<tool_call>x</tool_call>");
    free(r); free(c);
}

static const char *TEXTS[] = {
    "User asks 2+2.\n</think>\n\nIt is 4.",
    "<think>\nhmm\n</think>\n\nHello",
    "<think><think>x</think>y",
    "plain answer with < and </ and <t and </think",
    "a <tool_call> b </think> c",
    "</think>",
    "<think>",
    "<thin",
    "x</thi",
    "\xe4\xbd\xa0\xe5\xa5\xbd</think>\xe5\x86\x8d\xe8\xa7\x81",
    "",
};

static void test_every_split_equals_oneshot(void **st) {
    (void)st;
    for (size_t t = 0; t < sizeof TEXTS / sizeof TEXTS[0]; t++)
        for (int force = 0; force < 2; force++) {
            const char *text = TEXTS[t];
            char *r0, *c0;
            oneshot(text, force, &r0, &c0);
            size_t n = strlen(text);
            for (size_t i = 0; i <= n; i++) {
                char *r, *c;
                streamed(text, force, 1, &i, 1, &r, &c);
                if (strcmp(r, r0) || strcmp(c, c0))
                    fail_msg("text %zu force %d split at %zu: reasoning '%s' vs '%s', content '%s' vs '%s'",
                             t, force, i, r, r0, c, c0);
                free(r); free(c);
                for (size_t j = i; j <= n; j += 3) { /* three pieces */
                    size_t cuts[2] = {i, j};
                    streamed(text, force, 1, cuts, 2, &r, &c);
                    assert_string_equal(r, r0);
                    assert_string_equal(c, c0);
                    free(r); free(c);
                }
            }
            size_t *bytes = malloc((n + 1) * sizeof *bytes);
            for (size_t i = 0; i < n; i++) bytes[i] = i;
            char *r, *c;
            streamed(text, force, 1, bytes, (int)n, &r, &c);
            assert_string_equal(r, r0);
            assert_string_equal(c, c0);
            free(r); free(c);
            streamed(text, force, 0, bytes, (int)n, &r, &c); /* stream_reasoning false */
            assert_string_equal(r, r0);
            assert_string_equal(c, c0);
            free(r); free(c);
            free(bytes); free(r0); free(c0);
        }
}

static void test_stream_reasoning_false_holds_reasoning_until_end(void **st) {
    (void)st;
    rp_state s; rp_init(&s, 1, 0);
    buf rb, cb; buf_init(&rb); buf_init(&cb);
    rp_feed(&s, "abc", 3, &rb, &cb);
    assert_int_equal(rb.len, 0);
    rp_feed(&s, "def</think>x", 12, &rb, &cb);
    assert_string_equal(rb.data, "abcdef");
    assert_string_equal(cb.data, "x");
    rp_free(&s); buf_free(&rb); buf_free(&cb);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_example_splits_at_think_close),
        cmocka_unit_test(test_reference_stream_buffers_partial_close_tag),
        cmocka_unit_test(test_leading_think_enters_reasoning_without_force),
        cmocka_unit_test(test_no_reasoning_when_not_forced_and_no_tag),
        cmocka_unit_test(test_truncated_thinking_is_all_reasoning),
        cmocka_unit_test(test_tool_call_before_think_close_ends_reasoning),
        cmocka_unit_test(test_think_close_before_tool_call_wins),
        cmocka_unit_test(test_every_split_equals_oneshot),
        cmocka_unit_test(test_stream_reasoning_false_holds_reasoning_until_end),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
