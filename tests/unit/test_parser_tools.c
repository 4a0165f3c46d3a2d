/* test_parser_tools.c: the qwen3_coder and qwen25 tool-call parsers against
 * reference/peers-and-parsers.md 2.2 (SGLang's detectors): typed arguments
 * as json.dumps writes them, the streamed delta sequence, and streaming ==
 * one-shot for every split of the text. Also Python-compatible JSON text. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server.h"

static const char *TOOLS_JSON =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
    "\"temp\":{\"type\":\"number\"},\"metric\":{\"type\":\"boolean\"},\"opts\":{\"type\":\"object\"},"
    "\"tags\":{\"type\":\"array\"},\"other\":{\"type\":\"whatever\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"noop\",\"parameters\":{\"type\":\"object\",\"properties\":{}}}}]";

static json_t *tools(void) {
    json_t *t = json_loads(TOOLS_JSON, 0, NULL);
    assert_non_null(t);
    return t;
}

static const char *WEATHER =
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
    "</parameter>\n</function>\n</tool_call>";

/* ---- Python-compatible JSON -------------------------------------------------- */

static void check_float(double d, const char *want) {
    buf b; buf_init(&b);
    jpy_float(&b, d);
    assert_string_equal(b.data, want);
    buf_free(&b);
}

static void test_floats_print_like_python_repr(void **st) {
    (void)st;
    check_float(0.1, "0.1");
    check_float(3.0, "3.0");
    check_float(-2.5, "-2.5");
    check_float(1e-05, "1e-05");
    check_float(0.0001, "0.0001");
    check_float(1e16, "1e+16");
    check_float(1.5e16, "1.5e+16");
    check_float(123456.789, "123456.789");
    check_float(1e15, "1000000000000000.0");
    check_float(1.0 / 3.0, "0.3333333333333333");
}

static void test_dump_uses_python_separators_and_raw_utf8(void **st) {
    (void)st;
    json_t *v = json_loads("{\"a\":[1,2.5,true,null],\"b\":\"\xc3\xa9\\n\\\"\",\"c\":{}}", 0, NULL);
    char *s = jpy_dumps(v);
    assert_string_equal(s, "{\"a\": [1, 2.5, true, null], \"b\": \"\xc3\xa9\\n\\\"\", \"c\": {}}");
    free(s); json_decref(v);
}

static void test_literal_eval_python_dict(void **st) {
    (void)st;
    json_t *v = jpy_literal_eval("{'a': True, 'b': None, 'c': [1, 2.0, (3,)], 'd': \"x'y\", 1: -4}");
    assert_non_null(v);
    char *s = jpy_dumps(v);
    assert_string_equal(s, "{\"a\": true, \"b\": null, \"c\": [1, 2.0, [3]], \"d\": \"x'y\", \"1\": -4}");
    free(s); json_decref(v);
    assert_null(jpy_literal_eval("hello"));
    assert_null(jpy_literal_eval("{'a': 1"));
    assert_null(jpy_literal_eval("1 2"));
}

/* ---- qwen3_coder one-shot ------------------------------------------------------ */

static void parse(tp_kind k, const char *text, char **content, tp_calls *calls) {
    json_t *t = tools();
    buf cb; buf_init(&cb);
    memset(calls, 0, sizeof *calls);
    tp_parse(k, t, text, &cb, calls);
    *content = buf_detach(&cb);
    json_decref(t);
}

static void test_coder_reference_example_typed_arguments(void **st) {
    (void)st;
    char *c; tp_calls calls;
    parse(TP_QWEN3_CODER, WEATHER, &c, &calls);
    assert_string_equal(c, "");
    assert_int_equal(calls.n, 1);
    assert_string_equal(calls.v[0].name, "get_weather");
    assert_string_equal(calls.v[0].args, "{\"city\": \"Paris\", \"days\": 3}");
    free(c); tp_calls_free(&calls);
}

static char *one_param(const char *pname, const char *value) {
    char text[1024];
    snprintf(text, sizeof text, "<tool_call>\n<function=get_weather>\n<parameter=%s>\n%s\n</parameter>\n</function>\n</tool_call>",
             pname, value);
    char *c; tp_calls calls;
    parse(TP_QWEN3_CODER, text, &c, &calls);
    assert_int_equal(calls.n, 1);
    char *args = xstrdup(calls.v[0].args);
    free(c); tp_calls_free(&calls);
    return args;
}

static void expect_param(const char *pname, const char *value, const char *want) {
    char *a = one_param(pname, value);
    if (strcmp(a, want)) fail_msg("%s=%s: got %s, want %s", pname, value, a, want);
    free(a);
}

static void test_coder_converts_values_by_schema_type(void **st) {
    (void)st;
    expect_param("city", "42", "{\"city\": \"42\"}");                  /* string stays raw */
    expect_param("days", "7", "{\"days\": 7}");                       /* integer */
    expect_param("days", "seven", "{\"days\": \"seven\"}");           /* bad integer -> string */
    expect_param("temp", "21.5", "{\"temp\": 21.5}");                 /* number */
    expect_param("temp", "20", "{\"temp\": 20}");                     /* integral number -> int */
    expect_param("temp", "2e1", "{\"temp\": 20.0}");                  /* exponent keeps float */
    expect_param("metric", "True", "{\"metric\": true}");             /* boolean, any case */
    expect_param("metric", "yes", "{\"metric\": false}");             /* not true -> false */
    expect_param("opts", "{\"a\": [1, 2]}", "{\"opts\": {\"a\": [1, 2]}}");      /* JSON object */
    expect_param("opts", "{'a': True, 'b': None}", "{\"opts\": {\"a\": true, \"b\": null}}"); /* literal */
    expect_param("opts", "not json", "{\"opts\": \"not json\"}");    /* fallback string */
    expect_param("tags", "[\"x\", \"y\"]", "{\"tags\": [\"x\", \"y\"]}");
    expect_param("days", "null", "{\"days\": null}");                 /* null for any type */
    expect_param("other", "12", "{\"other\": 12}");                   /* unknown type: literal_eval */
    expect_param("other", "abc", "{\"other\": \"abc\"}");
    expect_param("unknown", "12", "{\"unknown\": \"12\"}");           /* not in schema: string */
    expect_param("city", "line1\nline2", "{\"city\": \"line1\\nline2\"}"); /* only one \n stripped */
}

static void test_coder_content_before_first_call_and_two_calls(void **st) {
    (void)st;
    const char *text = "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
                       "</function>\n</tool_call>\n<tool_call>\n<function=noop>\n</function>\n</tool_call>\ntrailing";
    char *c; tp_calls calls;
    parse(TP_QWEN3_CODER, text, &c, &calls);
    assert_string_equal(c, "Let me check.\n");
    assert_int_equal(calls.n, 2);
    assert_string_equal(calls.v[0].args, "{\"city\": \"Rome\"}");
    assert_string_equal(calls.v[1].name, "noop");
    assert_string_equal(calls.v[1].args, "{}");
    free(c); tp_calls_free(&calls);
}

static void test_coder_tolerates_missing_parameter_end(void **st) {
    (void)st;
    const char *text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n<parameter=days>\n2\n"
                       "</function>\n</tool_call>";
    char *c; tp_calls calls;
    parse(TP_QWEN3_CODER, text, &c, &calls);
    assert_int_equal(calls.n, 1);
    assert_string_equal(calls.v[0].args, "{\"city\": \"Oslo\", \"days\": 2}");
    free(c); tp_calls_free(&calls);
}

static void test_no_tool_call_is_all_content(void **st) {
    (void)st;
    char *c; tp_calls calls;
    parse(TP_QWEN3_CODER, "just <b>text</b>", &c, &calls);
    assert_string_equal(c, "just <b>text</b>");
    assert_int_equal(calls.n, 0);
    free(c); tp_calls_free(&calls);
}

/* ---- streaming --------------------------------------------------------------- */

typedef struct reassembled { char *content; int n; char *names[8]; buf args[8]; int order_ok; } reassembled;

static void stream(tp_kind k, const char *text, const size_t *cuts, int ncuts, reassembled *out, tp_deltas *all) {
    json_t *t = tools();
    tp_stream s; tp_stream_init(&s, k, t);
    buf cb; buf_init(&cb);
    tp_deltas d = {0};
    memset(out, 0, sizeof *out);
    out->order_ok = 1;
    size_t prev = 0, n = strlen(text);
    for (int i = 0; i <= ncuts + 1; i++) {
        if (i <= ncuts) {
            size_t end = i < ncuts ? cuts[i] : n;
            tp_stream_feed(&s, text + prev, end - prev, &cb, &d);
            prev = end;
        } else {
            tp_stream_finish(&s, &cb, &d);
        }
        for (int j = 0; j < d.n; j++) {
            tp_delta *x = &d.v[j];
            assert_true(x->index >= 0 && x->index < 8);
            if (x->name) {
                if (x->index != out->n) out->order_ok = 0;
                out->names[out->n] = xstrdup(x->name);
                buf_init(&out->args[out->n]);
                buf_puts(&out->args[out->n], "");
                out->n++;
            } else {
                if (x->index >= out->n) out->order_ok = 0; /* arguments before the name */
                else buf_puts(&out->args[x->index], x->args);
            }
            if (all) tp_deltas_push(all, x->index, x->name, x->args, strlen(x->args));
        }
        tp_deltas_clear(&d);
    }
    out->content = buf_detach(&cb);
    tp_deltas_free(&d);
    tp_stream_free(&s);
    json_decref(t);
}

static void reassembled_free(reassembled *r) {
    free(r->content);
    for (int i = 0; i < r->n; i++) { free(r->names[i]); buf_free(&r->args[i]); }
}

static void test_coder_stream_delta_sequence_matches_reference(void **st) {
    (void)st;
    reassembled r;
    tp_deltas all = {0};
    size_t bytes[512];
    size_t n = strlen(WEATHER);
    for (size_t i = 0; i < n; i++) bytes[i] = i;
    stream(TP_QWEN3_CODER, WEATHER, bytes, (int)n, &r, &all);
    assert_int_equal(all.n, 5);
    assert_string_equal(all.v[0].name, "get_weather");
    assert_string_equal(all.v[0].args, "");
    assert_null(all.v[1].name);
    assert_string_equal(all.v[1].args, "{");
    assert_string_equal(all.v[2].args, "\"city\": \"Paris\"");
    assert_string_equal(all.v[3].args, ", \"days\": 3");
    assert_string_equal(all.v[4].args, "}");
    tp_deltas_free(&all);
    reassembled_free(&r);
}

static const char *TOOL_TEXTS[] = {
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
    "</parameter>\n</function>\n</tool_call>",
    "Let me check < and <tool <tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
    "</function>\n</tool_call>\nafter\n<tool_call>\n<function=noop>\n</function>\n</tool_call>",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n<parameter=days>\n2\n</function>\n</tool_call>",
    "<tool_call>\n<function=get_weather>\n<parameter=opts>\n{'a': [1, 2]}\n</parameter>\n<parameter=temp>\n-1.5\n"
    "</parameter>\n</function>\n</tool_call>",
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nBer", /* cut by max_tokens */
    "no calls here, only <b>html</b>",
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>",
    "Sure.\n<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{bad json}\n</tool_call>"
    "\n<tool_call>\n{\"name\": \"unknown_tool\", \"arguments\": {}}\n</tool_call>",
};

static void check_every_split(tp_kind k) {
    for (size_t t = 0; t < sizeof TOOL_TEXTS / sizeof TOOL_TEXTS[0]; t++) {
        const char *text = TOOL_TEXTS[t];
        char *c0; tp_calls calls;
        parse(k, text, &c0, &calls);
        size_t n = strlen(text);
        for (size_t i = 0; i <= n; i++) {
            for (size_t j = i; j <= n; j += 7) {
                size_t cuts[2] = {i, j};
                reassembled r;
                stream(k, text, cuts, 2, &r, NULL);
                if (strcmp(r.content, c0) || r.n != calls.n || !r.order_ok)
                    fail_msg("%s text %zu cuts %zu,%zu: content '%s' vs '%s', %d vs %d calls",
                             tp_kind_name(k), t, i, j, r.content, c0, r.n, calls.n);
                for (int m = 0; m < r.n; m++) {
                    assert_string_equal(r.names[m], calls.v[m].name);
                    assert_string_equal(r.args[m].data, calls.v[m].args);
                }
                reassembled_free(&r);
            }
        }
        size_t *bytes = malloc((n + 1) * sizeof *bytes);
        for (size_t i = 0; i < n; i++) bytes[i] = i;
        reassembled r;
        stream(k, text, bytes, (int)n, &r, NULL);
        assert_string_equal(r.content, c0);
        assert_int_equal(r.n, calls.n);
        for (int m = 0; m < r.n; m++) assert_string_equal(r.args[m].data, calls.v[m].args);
        reassembled_free(&r);
        free(bytes); free(c0); tp_calls_free(&calls);
    }
}

static void test_coder_every_split_equals_oneshot(void **st) { (void)st; check_every_split(TP_QWEN3_CODER); }
static void test_qwen25_every_split_equals_oneshot(void **st) { (void)st; check_every_split(TP_QWEN25); }

static void test_qwen25_json_call_and_drops(void **st) {
    (void)st;
    char *c; tp_calls calls;
    parse(TP_QWEN25, TOOL_TEXTS[7], &c, &calls);
    assert_string_equal(c, "Sure.\n");
    assert_int_equal(calls.n, 1); /* bad JSON and undeclared tool dropped */
    assert_string_equal(calls.v[0].name, "noop");
    assert_string_equal(calls.v[0].args, "{}");
    free(c); tp_calls_free(&calls);
    parse(TP_QWEN25, TOOL_TEXTS[6], &c, &calls);
    assert_int_equal(calls.n, 1);
    assert_string_equal(calls.v[0].args, "{\"city\": \"Paris\", \"days\": 3}");
    free(c); tp_calls_free(&calls);
}

static void test_call_ids_look_like_openai(void **st) {
    (void)st;
    char a[32], b[32];
    tp_call_id(a); tp_call_id(b);
    assert_int_equal(strlen(a), 29);
    assert_memory_equal(a, "call_", 5);
    assert_string_not_equal(a, b);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_floats_print_like_python_repr),
        cmocka_unit_test(test_dump_uses_python_separators_and_raw_utf8),
        cmocka_unit_test(test_literal_eval_python_dict),
        cmocka_unit_test(test_coder_reference_example_typed_arguments),
        cmocka_unit_test(test_coder_converts_values_by_schema_type),
        cmocka_unit_test(test_coder_content_before_first_call_and_two_calls),
        cmocka_unit_test(test_coder_tolerates_missing_parameter_end),
        cmocka_unit_test(test_no_tool_call_is_all_content),
        cmocka_unit_test(test_coder_stream_delta_sequence_matches_reference),
        cmocka_unit_test(test_coder_every_split_equals_oneshot),
        cmocka_unit_test(test_qwen25_every_split_equals_oneshot),
        cmocka_unit_test(test_qwen25_json_call_and_drops),
        cmocka_unit_test(test_call_ids_look_like_openai),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
