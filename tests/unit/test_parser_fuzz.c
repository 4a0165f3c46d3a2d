/* test_parser_fuzz.c: random texts built from tag fragments (whole tags,
 * partial tags, stray '<' and '>', JSON, newlines, multi-byte UTF-8) fed to
 * the reasoning and tool-call parsers cut at random points: the streamed
 * result must always equal the one-shot parse, and nothing may crash.
 * Also mutated request bodies through req_parse (accepted or rejected with a
 * message, never a crash). Deterministic seeds; run under ASan in CI builds
 * that use it. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server.h"

static uint64_t rs = 0x9E3779B97F4A7C15ULL;
static uint64_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return rs; }
static size_t rndn(size_t n) { return n ? (size_t)(rnd() % n) : 0; }

static const char *FRAG[] = {
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<function=get_weather>", "<function=noop>",
    "<parameter=city>", "<parameter=days>", "<parameter=opts>", "</parameter>", "</function>", "<", ">", "\n",
    "Paris", "3", "{'a': [1, True]}", "{\"name\": \"noop\", \"arguments\": {}}",
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}", "<tool", "</thi", "<func", "<param",
    "</param", "\xc3\xa9", "\xe4\xbd\xa0", " ", "text", "null", "<function=", "<parameter=", "}", "{",
};

/* LS_FUZZ_ITERS / LS_FUZZ_SEED scale a local run up (defaults keep CI quick). */
static int iters(int dflt) {
    const char *e = getenv("LS_FUZZ_ITERS");
    return e && atoi(e) > 0 ? atoi(e) : dflt;
}

static char *random_text(void) {
    buf b; buf_init(&b);
    int n = 1 + (int)rndn(14);
    for (int i = 0; i < n; i++) buf_puts(&b, FRAG[rndn(sizeof FRAG / sizeof FRAG[0])]);
    return buf_detach(&b);
}

static json_t *tools(void) {
    return json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
                      "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
                      "\"opts\":{\"type\":\"object\"}}}}},{\"type\":\"function\",\"function\":{\"name\":\"noop\"}}]",
                      0, NULL);
}

static void test_reasoning_stream_equals_oneshot_on_random_texts(void **st) {
    (void)st;
    for (int it = 0; it < iters(3000); it++) {
        char *t = random_text();
        int force = (int)rndn(2);
        buf r0, c0; buf_init(&r0); buf_init(&c0);
        rp_parse(t, force, &r0, &c0);
        rp_state s; rp_init(&s, force, (int)rndn(2));
        buf r1, c1; buf_init(&r1); buf_init(&c1);
        size_t n = strlen(t), pos = 0;
        while (pos < n) {
            size_t k = 1 + rndn(6);
            if (k > n - pos) k = n - pos;
            rp_feed(&s, t + pos, k, &r1, &c1);
            pos += k;
        }
        rp_finish(&s, &r1, &c1);
        if (strcmp(r0.data ? r0.data : "", r1.data ? r1.data : "") || strcmp(c0.data ? c0.data : "", c1.data ? c1.data : ""))
            fail_msg("force %d text '%s': reasoning '%s' vs '%s', content '%s' vs '%s'", force, t, r1.data, r0.data,
                     c1.data, c0.data);
        rp_free(&s);
        buf_free(&r0); buf_free(&c0); buf_free(&r1); buf_free(&c1);
        free(t);
    }
}

static void check_tools(tp_kind kind, const json_t *tl, const char *t) {
    buf c0; buf_init(&c0);
    tp_calls calls = {0};
    tp_parse(kind, tl, t, &c0, &calls);
    tp_stream s; tp_stream_init(&s, kind, tl);
    buf c1; buf_init(&c1);
    tp_deltas d = {0};
    size_t n = strlen(t), pos = 0;
    while (pos < n) {
        size_t k = 1 + rndn(6);
        if (k > n - pos) k = n - pos;
        tp_stream_feed(&s, t + pos, k, &c1, &d);
        pos += k;
    }
    tp_stream_finish(&s, &c1, &d);
    buf args[64];
    int nc = 0;
    for (int i = 0; i < d.n; i++) {
        if (d.v[i].name) {
            assert_int_equal(d.v[i].index, nc);
            assert_true(nc < 64);
            buf_init(&args[nc]);
            buf_puts(&args[nc], "");
            nc++;
        } else {
            assert_true(d.v[i].index < nc);
            buf_puts(&args[d.v[i].index], d.v[i].args);
        }
    }
    if (strcmp(c0.data ? c0.data : "", c1.data ? c1.data : "") || nc != calls.n)
        fail_msg("%s text '%s': content '%s' vs '%s', %d vs %d calls", tp_kind_name(kind), t, c1.data, c0.data, nc,
                 calls.n);
    for (int i = 0; i < nc; i++) {
        if (strcmp(args[i].data, calls.v[i].args))
            fail_msg("%s text '%s': call %d args '%s' vs '%s'", tp_kind_name(kind), t, i, args[i].data, calls.v[i].args);
        json_t *parsed = json_loads(calls.v[i].args, 0, NULL); /* arguments are always valid JSON */
        if (!json_is_object(parsed)) fail_msg("%s text '%s': arguments '%s' are not a JSON object", tp_kind_name(kind), t, calls.v[i].args);
        json_decref(parsed);
        buf_free(&args[i]);
    }
    tp_deltas_free(&d);
    tp_stream_free(&s);
    tp_calls_free(&calls);
    buf_free(&c0);
    buf_free(&c1);
}

static void test_tool_streams_equal_oneshot_on_random_texts(void **st) {
    (void)st;
    json_t *tl = tools();
    for (int it = 0; it < iters(3000); it++) {
        char *t = random_text();
        check_tools(TP_QWEN3_CODER, tl, t);
        check_tools(TP_QWEN25, tl, t);
        free(t);
    }
    json_decref(tl);
}

static void test_mutated_request_bodies_never_crash(void **st) {
    (void)st;
    const char *bases[] = {
        "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}],\"stop\":[\"a\"],"
        "\"stream_options\":{\"include_usage\":true},\"n\":2,\"logprobs\":true,\"top_logprobs\":2}",
        "{\"prompt\":[[1,2],[3]],\"max_tokens\":4,\"echo\":true,\"logprobs\":1,\"stop_token_ids\":[5]}",
    };
    for (int it = 0; it < iters(4000); it++) {
        int kind = (int)rndn(2);
        const char *base = bases[kind];
        size_t n = strlen(base);
        char *m = xmalloc(n + 16);
        memcpy(m, base, n + 1);
        int muts = 1 + (int)rndn(4);
        for (int k = 0; k < muts; k++) {
            size_t p = rndn(n);
            switch (rndn(4)) {
            case 0: m[p] = "{}[]\",:0-9aetn\\ "[rndn(17)]; break;
            case 1: m[p] = (char)(rndn(255) + 1); break;
            case 2: memmove(m + p, m + p + 1, n - p); n--; break; /* delete */
            default: n = p; m[n] = 0; break;                    /* truncate */
            }
            if (!n) break;
        }
        srv_req r; ls_err e = {0}; char param[64];
        int rc = req_parse(&r, kind ? SRV_COMPLETION : SRV_CHAT, m, strlen(m), 1, NULL, param, sizeof param, &e);
        if (rc) assert_true(e.msg[0] != 0);
        req_free(&r);
        free(m);
    }
}

int main(void) {
    const char *seed = getenv("LS_FUZZ_SEED");
    if (seed && strtoull(seed, NULL, 10)) rs = strtoull(seed, NULL, 10);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reasoning_stream_equals_oneshot_on_random_texts),
        cmocka_unit_test(test_tool_streams_equal_oneshot_on_random_texts),
        cmocka_unit_test(test_mutated_request_bodies_never_crash),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
