/* test_regex.c: the regex compiler behind SGLang's `regex` and JSON Schema's
 * `pattern` (grammar/gr_regex.c). Matching is checked against cases worked out
 * by hand here (tests/test_grammar_regex.py checks it against Python's re);
 * this file covers what a differential test cannot: the limits and their
 * messages, the length tables, and random junk patterns that must compile or
 * fail cleanly, never crash. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gr_int.h"

static int matches(const char *re, const char *s, int json, int search) {
    gr_dfa d;
    char err[300];
    if (gr_regex_dfa(re, strlen(re), json, search, &d, err, sizeof err)) fail_msg("'%s' refused: %s", re, err);
    int m = gr_dfa_match(&d, s, strlen(s));
    gr_dfa_free(&d);
    return m;
}

static void refused(const char *re, const char *want) {
    gr_dfa d;
    char err[300] = "";
    if (!gr_regex_dfa(re, strlen(re), 0, 0, &d, err, sizeof err)) {
        gr_dfa_free(&d);
        fail_msg("'%s' compiled", re);
    }
    if (!strstr(err, want)) fail_msg("'%s': error '%s' lacks '%s'", re, err, want);
}

static void test_matching(void **st) {
    (void)st;
    static const struct { const char *re, *s; int m; } cases[] = {
        {"abc", "abc", 1}, {"abc", "abcd", 0}, {"a|b|", "", 1}, {"(a|b)*c", "ababc", 1}, {"(a|b)*c", "abab", 0},
        {"a{2}", "aa", 1}, {"a{2}", "aaa", 0}, {"a{2,}", "aaaaa", 1}, {"a{x", "a{x", 1}, {"{1}", "{1}", 1}, /* not quantifiers */
        {"a{1,3}b", "aaab", 1}, {"a{1,3}b", "aaaab", 0}, {"x?y+z*", "yyy", 1}, {"[^a-c]", "d", 1}, {"[^a-c]", "b", 0},
        {"[\\]a]", "]", 1}, {"[a-]", "-", 1}, {"\\d\\D\\w\\W\\s\\S", "1x_ \tq", 1}, {"\\d\\D\\w\\W\\s\\S", "1x_a\tq", 0}, {"\\d\\D\\w\\W\\s\\S", "1xa\t q", 1},
        {".", "\n", 0}, {".", "\xc3\xa9", 1}, {".", "\xe2\x82\xac", 1}, {"..", "\xf0\x9f\x98\x80", 0},
        {"[\\u00e0-\\u00ff]+", "\xc3\xa0\xc3\xbf", 1}, {"\\x41\\u0042", "AB", 1}, {"\\.\\*", ".*", 1},
        {"^ab$", "ab", 1}, {"(?:ab)+", "abab", 1}, {"(?P<n>a)(?<m>b)", "ab", 1}, {"a*?b", "aab", 1},
        {"[\\s\\d]+", " 1\n", 1}, {"a\\$", "a$", 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (matches(cases[i].re, cases[i].s, 0, 0) != cases[i].m)
            fail_msg("'%s' on '%s': want %d", cases[i].re, cases[i].s, cases[i].m);
    /* search: unanchored ends match anything; anchored ones hold */
    assert_true(matches("b", "abc", 0, 1));
    assert_false(matches("^b", "abc", 0, 1));
    assert_true(matches("c$", "abc", 0, 1));
    assert_false(matches("^a$", "abc", 0, 1));
    /* JSON-string mode: characters a JSON string must escape never match */
    assert_false(matches(".*", "a\"b", 1, 0));
    assert_false(matches(".*", "a\\b", 1, 0));
    assert_false(matches("[\\x00-\\x7f]+", "a\tb", 1, 0));
    assert_true(matches("[\\x00-\\x7f]+", "a b", 1, 0));
}

static void test_refusals_and_limits(void **st) {
    (void)st;
    refused("a(?=b)", "'(?' at offset 2 is not supported");
    refused("\\bx", "'\\b' at offset 1 is not supported");
    refused("(a)\\1", "'\\1' at offset 4");
    refused("a^", "anchors are supported only at the start and end");
    refused("[b-a]", "runs backwards");
    refused("a{5,2}", "m < n");
    refused("a{1001}", "counts above 1000");
    refused("a{,2}", "write {0,n}");
    refused("a*{2}", "cannot follow another");
    refused("a**", "cannot follow another");
    refused("[]a]", "write \\]");
    refused("[^]a]", "write \\]");
    refused("(a", "missing ')'");
    refused("a)", "unbalanced ')'");
    refused("+", "nothing to repeat");
    refused("[[:alpha:]]", "POSIX classes");
    refused("\xff", "invalid UTF-8");
    refused("a\\", "cannot end with '\\'");
    refused("(((((a{1000}){1000}){1000})))", "too large");
    refused("(a|b)*a(a|b){14}", "too complex"); /* 2^15 DFA states */
    gr_dfa d;
    char err[200];
    assert_int_equal(gr_regex_dfa("\"", 1, 1, 0, &d, err, sizeof err), -1);
    assert_non_null(strstr(err, "no JSON string without escapes matches it"));
}

static void test_length_tables(void **st) {
    (void)st;
    gr_dfa d;
    char err[200];
    assert_int_equal(gr_regex_dfa("ab(c|\xc3\xa9\xc3\xa9)", strlen("ab(c|\xc3\xa9\xc3\xa9)"), 0, 0, &d, err, sizeof err), 0);
    assert_int_equal(gr_dfa_lengths(&d), 0);
    assert_int_equal(d.dmin[0], 3); /* code points, not bytes */
    assert_int_equal(d.dmax[0], 4);
    gr_dfa_free(&d);
    assert_int_equal(gr_regex_dfa("a(b|c)*", 7, 0, 0, &d, err, sizeof err), 0);
    assert_int_equal(gr_dfa_lengths(&d), 0);
    assert_int_equal(d.dmin[0], 1);
    assert_int_equal(d.dmax[0], GR_LEN_INF);
    gr_dfa_free(&d);
}

static uint32_t seed = 12345;
static uint32_t rnd(void) { seed = seed * 1103515245u + 12345u; return seed >> 8; }

static void test_junk_patterns_compile_or_fail_cleanly(void **st) {
    (void)st;
    static const char atoms[] = "ab.|()[]^$*+?{}-,0123\\dws\xc3\xa9:P<>=!";
    char re[40], err[300];
    int compiled = 0;
    for (int k = 0; k < 20000; k++) {
        int n = (int)(rnd() % 16);
        for (int i = 0; i < n; i++) re[i] = atoms[rnd() % (sizeof atoms - 1)];
        re[n] = 0;
        gr_dfa d;
        err[0] = 0;
        if (gr_regex_dfa(re, (size_t)n, (int)(rnd() % 2), (int)(rnd() % 2), &d, err, sizeof err) == 0) {
            compiled++;
            assert_true(d.n >= 1);
            char s[8];
            for (int i = 0; i < 8; i++) s[i] = atoms[rnd() % (sizeof atoms - 1)];
            gr_dfa_match(&d, s, rnd() % 8);
            gr_dfa_free(&d);
        } else if (!err[0]) {
            fail_msg("'%s' refused without a message", re);
        }
    }
    assert_true(compiled > 1000);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matching),
        cmocka_unit_test(test_refusals_and_limits),
        cmocka_unit_test(test_length_tables),
        cmocka_unit_test(test_junk_patterns_compile_or_fail_cleanly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
