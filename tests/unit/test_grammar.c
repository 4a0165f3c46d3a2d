/* test_grammar.c: the constrained-decoding automaton against hand-checked
 * strings per JSON Schema feature (accepted / rejected), schema errors naming
 * their JSON path, and token masks on a small vocabulary against brute force
 * (every token's bytes run through a fresh matcher that replays the prefix),
 * along random walks that visit string (cached) and structural states.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/gr.h"

/* A vocabulary of single bytes only: the matcher is driven byte by byte. */
static gr_vocab *byte_vocab(void) {
    static char bytes[256][1];
    const char *tok[257];
    int len[257];
    for (int i = 0; i < 256; i++) { bytes[i][0] = (char)i; tok[i] = bytes[i]; len[i] = 1; }
    tok[256] = "";
    len[256] = 0;
    int32_t eos = 256;
    return gr_vocab_from_bytes(257, tok, len, NULL, &eos, 1);
}

static gr_grammar *schema(const char *text, int strict) {
    json_error_t je;
    json_t *s = json_loads(text, JSON_DECODE_ANY, &je);
    assert_non_null(s);
    gr_grammar *g = NULL;
    ls_err e = {0};
    int rc = gr_compile_json_schema(s, strict, "schema", &g, &e);
    if (rc) fprintf(stderr, "compile failed: %s\n", e.msg);
    assert_int_equal(rc, 0);
    json_decref(s);
    return g;
}

/* 1: the whole text is a sentence of g; 0: rejected or incomplete. */
static int accepts_g(gr_grammar *g, const char *text) {
    gr_vocab *v = byte_vocab();
    gr_matcher *m = gr_matcher_new(g, v, NULL);
    int ok = gr_matcher_feed(m, text, strlen(text)) == 0 && gr_matcher_accepting(m);
    gr_matcher_free(m);
    gr_vocab_free(v);
    return ok;
}

static int accepts(const char *sch, int strict, const char *text) {
    gr_grammar *g = schema(sch, strict);
    int ok = accepts_g(g, text);
    gr_unref(g);
    return ok;
}

#define YES(s, strict, t) do { if (!accepts(s, strict, t)) fail_msg("schema %s should accept %s", s, t); } while (0)
#define NO(s, strict, t) do { if (accepts(s, strict, t)) fail_msg("schema %s should reject %s", s, t); } while (0)

static void test_grammar_scalars_follow_json_syntax(void **st) {
    (void)st;
    const char *b = "{\"type\":\"boolean\"}";
    YES(b, 0, "true"); YES(b, 0, "false"); NO(b, 0, "tru"); NO(b, 0, "null"); NO(b, 0, "truee");
    const char *n = "{\"type\":\"number\"}";
    YES(n, 0, "0"); YES(n, 0, "-12.5e+3"); YES(n, 0, "3.25"); YES(n, 0, "1E9");
    NO(n, 0, "01"); NO(n, 0, "1."); NO(n, 0, ".5"); NO(n, 0, "-"); NO(n, 0, "1e"); NO(n, 0, "+1");
    NO(n, 0, "1234567890123456"); /* 16 integer digits: over the bound */
    const char *i = "{\"type\":\"integer\"}";
    YES(i, 0, "-7"); YES(i, 0, "42"); NO(i, 0, "4.2"); NO(i, 0, "1e3");
    YES("{\"type\":\"integer\",\"minimum\":0}", 0, "5");
    NO("{\"type\":\"integer\",\"minimum\":0}", 0, "-5");
    YES("{\"type\":\"null\"}", 0, "null");
    YES("{\"type\":[\"integer\",\"null\"]}", 0, "null");
    YES("{\"type\":\"string\",\"nullable\":true}", 0, "null");
    /* bounded whitespace around the value */
    YES(b, 0, " \ntrue\n");
    NO(b, 0, "     true"); /* 5 > GR_WS_MAX */
}

static void test_grammar_strings_validate_utf8_escapes_and_lengths(void **st) {
    (void)st;
    const char *s = "{\"type\":\"string\"}";
    YES(s, 0, "\"\""); YES(s, 0, "\"h\\u00e9llo \\\"x\\\" \\\\ \\n\"");
    YES(s, 0, "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"");
    NO(s, 0, "\"a\nb\"");            /* raw control character */
    NO(s, 0, "\"\\x41\"");           /* bad escape */
    NO(s, 0, "\"\\u12G4\"");
    NO(s, 0, "\"\xc3\"");            /* truncated UTF-8 */
    NO(s, 0, "\"\xc0\xaf\"");        /* overlong */
    NO(s, 0, "\"\xed\xa0\x80\"");    /* surrogate */
    NO(s, 0, "\"\xf4\x90\x80\x80\""); /* above U+10FFFF */
    NO(s, 0, "\"abc");
    const char *l = "{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}";
    YES(l, 0, "\"ab\""); YES(l, 0, "\"\xc3\xa9\xc3\xa9\xc3\xa9\""); YES(l, 0, "\"a\\nb\"");
    NO(l, 0, "\"a\""); NO(l, 0, "\"abcd\"");
}

static void test_grammar_enum_const_anyof(void **st) {
    (void)st;
    const char *e = "{\"enum\":[\"red\",\"gr\\u00fcn\",3,null,[1,2]]}";
    YES(e, 0, "\"red\""); YES(e, 0, "\"gr\xc3\xbcn\""); YES(e, 0, "3"); YES(e, 0, "null"); YES(e, 0, "[1,2]");
    NO(e, 0, "\"blue\""); NO(e, 0, "\"re\""); NO(e, 0, "4");
    YES("{\"const\":\"x\"}", 0, "\"x\"");
    NO("{\"const\":\"x\"}", 0, "\"y\"");
    const char *a = "{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\",\"maxLength\":1}]}";
    YES(a, 0, "12"); YES(a, 0, "\"q\""); NO(a, 0, "\"qq\""); NO(a, 0, "true");
    YES("{\"oneOf\":[{\"type\":\"boolean\"},{\"type\":\"null\"}]}", 0, "null");
    YES("{\"allOf\":[{\"type\":\"boolean\"}]}", 0, "false");
}

static void test_grammar_objects_order_required_additional(void **st) {
    (void)st;
    const char *o = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},"
                    "\"required\":[\"a\"]}";
    YES(o, 1, "{\"a\":1}"); YES(o, 1, "{\"a\":1,\"b\":\"x\"}"); YES(o, 1, "{ \"a\" : 1 , \"b\" : \"x\" }");
    NO(o, 1, "{}"); NO(o, 1, "{\"b\":\"x\"}"); NO(o, 1, "{\"b\":\"x\",\"a\":1}"); /* schema order */
    NO(o, 1, "{\"a\":1,\"c\":2}");                   /* strict: no additional properties */
    YES(o, 0, "{\"a\":1,\"c\":[true,{\"d\":null}]}"); /* not strict: any extra after the listed ones */
    NO(o, 0, "{\"a\":1,}");
    const char *f = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}},\"additionalProperties\":false}";
    YES(f, 0, "{}"); YES(f, 0, "{\"a\":2}"); NO(f, 0, "{\"z\":2}");
    const char *s = "{\"type\":\"object\",\"additionalProperties\":{\"type\":\"boolean\"}}";
    YES(s, 0, "{\"x\":true,\"y\":false}"); NO(s, 0, "{\"x\":1}");
    YES("{\"type\":\"object\"}", 0, "{\"k\":[1,\"2\",{}]}");
    NO("{\"type\":\"object\"}", 0, "[]");
}

static void test_grammar_arrays_items_prefix_bounds(void **st) {
    (void)st;
    const char *a = "{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}";
    YES(a, 0, "[1]"); YES(a, 0, "[1, 2,3]"); NO(a, 0, "[]"); NO(a, 0, "[1,2,3,4]"); NO(a, 0, "[1,]");
    NO(a, 0, "[\"x\"]");
    YES("{\"type\":\"array\"}", 0, "[]");
    const char *p = "{\"type\":\"array\",\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"boolean\"}],\"items\":false}";
    YES(p, 0, "[\"a\",true]"); YES(p, 0, "[\"a\"]"); NO(p, 0, "[true]"); NO(p, 0, "[\"a\",true,1]");
}

static void test_grammar_refs_and_recursion(void **st) {
    (void)st;
    const char *r = "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"integer\"},"
                    "\"next\":{\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"null\"}]}},"
                    "\"required\":[\"v\",\"next\"],\"additionalProperties\":false}},\"$ref\":\"#/$defs/node\"}";
    YES(r, 0, "{\"v\":1,\"next\":{\"v\":2,\"next\":null}}");
    NO(r, 0, "{\"v\":1,\"next\":{\"v\":2}}");
    const char *d = "{\"definitions\":{\"c\":{\"enum\":[\"a\",\"b\"]}},\"type\":\"array\",\"items\":{\"$ref\":\"#/definitions/c\"}}";
    YES(d, 0, "[\"a\",\"b\",\"a\"]"); NO(d, 0, "[\"c\"]");
}

static void test_grammar_json_object_mode(void **st) {
    (void)st;
    gr_grammar *g = gr_compile_json_object();
    assert_true(accepts_g(g, "{}"));
    assert_true(accepts_g(g, "{\"a\": [1, 2.5, \"x\", {\"b\": null}], \"c\": false}"));
    assert_false(accepts_g(g, "[1]"));
    assert_false(accepts_g(g, "\"s\""));
    assert_false(accepts_g(g, "{\"a\" 1}"));
    gr_unref(g);
}

static void expect_error(const char *sch, const char *want) {
    json_t *s = json_loads(sch, JSON_DECODE_ANY, NULL);
    assert_non_null(s);
    gr_grammar *g = NULL;
    ls_err e = {0};
    int rc = gr_compile_json_schema(s, 0, "response_format.json_schema.schema", &g, &e);
    json_decref(s);
    assert_int_equal(rc, ERR_INVAL);
    assert_null(g);
    if (!strstr(e.msg, want)) fail_msg("error '%s' does not contain '%s'", e.msg, want);
}

static void test_grammar_bad_schemas_name_their_path(void **st) {
    (void)st;
    expect_error("{\"type\":\"object\",\"properties\":{\"age\":{\"type\":\"integr\"}}}",
                 "response_format.json_schema.schema.properties.age.type: unknown type 'integr'");
    expect_error("{\"type\":\"string\",\"pattern\":\"(?=a)\"}",
                 "response_format.json_schema.schema.pattern: '(?' at offset 1 is not supported");
    expect_error("{\"type\":\"string\",\"pattern\":3}", "response_format.json_schema.schema.pattern: expected a regular");
    expect_error("{\"patternProperties\":{}}", "response_format.json_schema.schema.patternProperties: not supported");
    expect_error("{\"type\":\"array\",\"items\":{\"type\":\"string\",\"minLength\":5,\"maxLength\":2}}",
                 "schema.items.minLength: 5 is above maxLength 2");
    expect_error("{\"$ref\":\"#/$defs/missing\"}", "schema.$ref: '#/$defs/missing' does not resolve");
    expect_error("false", "accepts nothing");
    expect_error("{\"$defs\":{\"a\":{\"type\":\"strin\"}},\"$ref\":\"#/$defs/a\"}",
                 "response_format.json_schema.schema.$defs.a.type: unknown type 'strin'");
    expect_error("{\"anyOf\":[{\"type\":\"string\"},{\"type\":3}]}", "schema.anyOf[1].type: expected a type name");
}

static void test_grammar_tool_calls_in_both_formats(void **st) {
    (void)st;
    json_t *tools = json_loads(
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},"
        "\"unit\":{\"type\":\"string\",\"enum\":[\"c\",\"f\"]}},\"required\":[\"city\"]}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"noop\"}}]", 0, NULL);
    assert_non_null(tools);
    gr_grammar *g = NULL;
    ls_err e = {0};
    assert_int_equal(gr_compile_tool_calls(tools, NULL, GR_TOOLS_XML, 1, 4, "tools", &g, &e), 0);
    const char *x1 = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis <b>\n</parameter>\n"
                     "<parameter=unit>\nc\n</parameter>\n</function>\n</tool_call>";
    assert_true(accepts_g(g, x1));
    assert_false(accepts_g(g, "<tool_call>\n<function=get_weather>\n<parameter=unit>\nc\n</parameter>\n"
                              "</function>\n</tool_call>")); /* city is required */
    assert_false(accepts_g(g, "<tool_call>\n<function=get_weather>\n<parameter=city>\na</b\n</parameter>\n"
                              "</function>\n</tool_call>")); /* "</" inside a raw value */
    assert_false(accepts_g(g, "<tool_call>\n<function=other>\n</function>\n</tool_call>"));
    assert_false(accepts_g(g, "hello"));
    char two[1024];
    snprintf(two, sizeof two, "%s\n<tool_call>\n<function=noop>\n</function>\n</tool_call>", x1);
    assert_true(accepts_g(g, two));
    gr_unref(g);
    assert_int_equal(gr_compile_tool_calls(tools, "noop", GR_TOOLS_HERMES, 1, 1, "tools", &g, &e), 0);
    assert_true(accepts_g(g, "<tool_call>\n{\"name\": \"noop\", \"arguments\": {}}\n</tool_call>"));
    assert_false(accepts_g(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"));
    gr_unref(g);
    assert_int_equal(gr_compile_tool_calls(tools, "get_weather", GR_TOOLS_HERMES, 1, 1, "tools", &g, &e), 0);
    assert_true(accepts_g(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\", \"days\": 3}}\n</tool_call>"));
    assert_false(accepts_g(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 3}}\n</tool_call>"));
    gr_unref(g);
    assert_int_equal(gr_compile_tool_calls(tools, "nope", GR_TOOLS_HERMES, 1, 1, "tools", &g, &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "'nope' is not among"));
    json_decref(tools);
}

/* ---- masks against brute force ---------------------------------------------------- */

static uint64_t rng_state = 88172645463325252ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 11);
}

typedef struct tvocab { int n; char **tok; int *len; uint8_t *special; } tvocab;

/* Single bytes of JSON's alphabet plus random multi-byte pieces (with UTF-8
 * fragments, quotes and escapes inside), a special token and the EOS. */
static tvocab make_tvocab(void) {
    static const char alpha[] = "{}[]\":,\\ \n\tabcdefghijklmnopqrstuvwxyz0123456789.-+eE/<>=_";
    static const char *frag[] = {"\xc3", "\xa9", "\xe2\x82", "\xac", "\xf0\x9f\x98\x80", "\\u00", "\\\"", "\",",
                                 "\":", "\"}", "}\n", "true", "null", "false", "\": \"", "\n</", "parameter>",
                                 "<tool_call>", "</tool_call>", "<function=", "\n<parameter=", "</function>"};
    tvocab v = {0};
    int cap = 600;
    v.tok = calloc((size_t)cap, sizeof *v.tok);
    v.len = calloc((size_t)cap, sizeof *v.len);
    v.special = calloc((size_t)cap, 1);
    for (size_t i = 0; i < sizeof alpha - 1; i++) {
        v.tok[v.n] = malloc(2); v.tok[v.n][0] = alpha[i]; v.len[v.n++] = 1;
    }
    for (size_t i = 0; i < sizeof frag / sizeof *frag; i++) {
        v.tok[v.n] = strdup(frag[i]); v.len[v.n++] = (int)strlen(frag[i]);
    }
    while (v.n < cap - 2) {
        int l = 2 + (int)(rnd() % 5);
        char *t = malloc((size_t)l + 1);
        for (int k = 0; k < l; k++) {
            uint32_t r = rnd() % 10;
            t[k] = r < 7 ? alpha[rnd() % (sizeof alpha - 1)] : r < 9 ? (char)("\xc3\xa9\xe2\x82\xac"[rnd() % 5]) : (char)(rnd() % 32);
        }
        v.tok[v.n] = t; v.len[v.n++] = l;
    }
    v.tok[v.n] = strdup("<|special|>"); v.len[v.n] = 11; v.special[v.n++] = 1;
    v.tok[v.n] = strdup("<|eos|>"); v.len[v.n] = 7; v.special[v.n++] = 1;
    return v;
}

static void free_tvocab(tvocab *v) {
    for (int i = 0; i < v->n; i++) free(v->tok[i]);
    free(v->tok); free(v->len); free(v->special);
}

/* Walk random allowed tokens; at each step the mask must equal brute force. */
static void check_masks(gr_grammar *g, int walks, int steps) {
    tvocab tv = make_tvocab();
    int32_t eos = tv.n - 1;
    gr_vocab *v = gr_vocab_from_bytes(tv.n, (const char *const *)tv.tok, tv.len, tv.special, &eos, 1);
    int W = gr_mask_words(v);
    uint32_t *bits = calloc((size_t)W, sizeof *bits);
    int32_t *hist = calloc((size_t)steps, sizeof *hist);
    int checked = 0, cached = 0;
    for (int w = 0; w < walks; w++) {
        gr_matcher *m = gr_matcher_new(g, v, NULL);
        for (int s = 0; s < steps; s++) {
            assert_int_equal(gr_matcher_fill_mask(m, bits), 1);
            cached += gr_matcher_last_cached(m);
            int n_allowed = 0, n_grammar = 0;
            for (int t = 0; t < tv.n; t++) {
                int got = (bits[t >> 5] >> (t & 31)) & 1;
                int want;
                if (t == eos) {
                    want = gr_matcher_accepting(m) || n_grammar == 0; /* never an empty mask */
                } else if (tv.special[t]) {
                    want = 0;
                } else {
                    gr_matcher *b = gr_matcher_new(g, v, NULL);
                    for (int k = 0; k < s; k++) gr_matcher_accept_token(b, hist[k]);
                    want = gr_matcher_feed(b, tv.tok[t], (size_t)tv.len[t]) == 0;
                    gr_matcher_free(b);
                    n_grammar += want;
                }
                if (got != want)
                    fail_msg("walk %d step %d token %d (%.*s): mask %d, brute force %d", w, s, t, tv.len[t], tv.tok[t], got, want);
                n_allowed += got;
                checked++;
            }
            assert_true(n_allowed > 0);
            /* next token: random allowed, EOS rarely */
            int pick = -1, tries = 0;
            while (pick < 0 && tries++ < 10000) {
                int t = (int)(rnd() % (uint32_t)tv.n);
                if (((bits[t >> 5] >> (t & 31)) & 1) && (t != eos || n_allowed == 1)) pick = t;
            }
            if (pick < 0 || pick == eos) break;
            assert_int_equal(gr_matcher_accept_token(m, pick), 0);
            hist[s] = pick;
        }
        gr_matcher_free(m);
    }
    assert_true(checked > 1000);
    free(bits); free(hist);
    gr_vocab_free(v);
    free_tvocab(&tv);
}

static void test_grammar_masks_equal_brute_force_json_schema(void **st) {
    (void)st;
    gr_grammar *g = schema("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},"
                           "\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"b\\u00e9\"]},\"maxItems\":3},"
                           "\"n\":{\"type\":[\"number\",\"null\"]},\"ok\":{\"type\":\"boolean\"}},"
                           "\"required\":[\"name\",\"ok\"]}", 1);
    check_masks(g, 12, 40);
    gr_unref(g);
}

static void test_grammar_masks_equal_brute_force_alternative_strings(void **st) {
    (void)st;
    /* several live stacks inside strings: the union of per-stack (cached) masks */
    /* after '"x' the one-character string allows only the quote, the enum "xb" allows 'b' */
    char sch[2048] = "{\"type\":\"array\",\"maxItems\":4,\"items\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":1},"
                     "{\"type\":\"integer\"},{\"enum\":[";
    for (char c = 'a'; c <= 'z'; c++) snprintf(sch + strlen(sch), sizeof sch - strlen(sch), "%s\"%cb\"", c > 'a' ? "," : "", c);
    strcat(sch, "]}]}}");
    gr_grammar *g = schema(sch, 0);
    check_masks(g, 10, 30);
    gr_unref(g);
}

static void test_grammar_masks_equal_brute_force_free_strings(void **st) {
    (void)st;
    gr_grammar *g = gr_compile_json_object(); /* unbounded strings: the cached path */
    check_masks(g, 8, 40);
    gr_unref(g);
}

static void test_grammar_masks_equal_brute_force_tool_calls(void **st) {
    (void)st;
    json_t *tools = json_loads(
        "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"q\":{\"type\":\"string\"},\"k\":{\"type\":\"integer\"}},\"required\":[\"q\"]}}}]", 0, NULL);
    gr_grammar *g = NULL;
    ls_err e = {0};
    assert_int_equal(gr_compile_tool_calls(tools, NULL, GR_TOOLS_XML, 1, 2, "tools", &g, &e), 0);
    check_masks(g, 8, 40);
    gr_unref(g);
    json_decref(tools);
}

static void test_grammar_gate_and_eos_rules(void **st) {
    (void)st;
    tvocab tv = make_tvocab();
    int32_t eos = tv.n - 1;
    gr_vocab *v = gr_vocab_from_bytes(tv.n, (const char *const *)tv.tok, tv.len, tv.special, &eos, 1);
    uint32_t *bits = calloc((size_t)gr_mask_words(v), sizeof *bits);
    gr_grammar *g = schema("{\"type\":\"boolean\"}", 0);
    gr_matcher *m = gr_matcher_new(g, v, "</think>");
    assert_int_equal(gr_matcher_fill_mask(m, bits), 0); /* gate closed: unconstrained */
    assert_int_equal(gr_matcher_feed(m, "hmm </thi", 9), 0);
    assert_int_equal(gr_matcher_fill_mask(m, bits), 0);
    assert_int_equal(gr_matcher_feed(m, "nk>\ntr", 6), 0); /* gate opens mid-token; the rest is grammar */
    assert_int_equal(gr_matcher_fill_mask(m, bits), 1);
    assert_false((bits[eos >> 5] >> (eos & 31)) & 1);
    assert_int_equal(gr_matcher_feed(m, "ue", 2), 0);
    assert_true(gr_matcher_accepting(m));
    assert_int_equal(gr_matcher_fill_mask(m, bits), 1);
    assert_true((bits[eos >> 5] >> (eos & 31)) & 1);
    assert_int_equal(gr_matcher_feed(m, "x", 1), -1);
    assert_true(gr_matcher_failed(m));
    assert_int_equal(gr_matcher_fill_mask(m, bits), 1); /* failed: only EOS */
    int n = 0;
    for (int t = 0; t < tv.n; t++) n += (bits[t >> 5] >> (t & 31)) & 1;
    assert_int_equal(n, 1);
    gr_matcher_free(m);
    gr_unref(g);
    free(bits);
    gr_vocab_free(v);
    free_tvocab(&tv);
}

/* Random schema-like JSON (keywords with odd values) either compiles or is refused with a
 * message naming a path under "schema"; what compiles takes random bytes without crashing. */
static json_t *junk_schema(int depth) {
    static const char *keys[] = {"type", "properties", "required", "items", "prefixItems", "enum", "const", "anyOf",
                                 "oneOf", "allOf", "$ref", "minLength", "maxLength", "minItems", "maxItems",
                                 "additionalProperties", "nullable", "minimum", "$defs", "pattern", "title"};
    static const char *types[] = {"string", "number", "integer", "boolean", "null", "object", "array", "bogus"};
    uint32_t r = rnd() % 10;
    if (depth > 3 || r == 0) {
        switch (rnd() % 6) {
        case 0: return json_true();
        case 1: return json_false();
        case 2: return json_integer((json_int_t)(rnd() % 7) - 2);
        case 3: return json_string(types[rnd() % 8]);
        case 4: return json_null();
        default: return json_string(rnd() % 2 ? "#/$defs/a" : "#");
        }
    }
    if (r == 1) {
        json_t *a = json_array();
        for (int i = (int)(rnd() % 4); i > 0; i--) json_array_append_new(a, junk_schema(depth + 1));
        return a;
    }
    json_t *o = json_object();
    for (int i = (int)(rnd() % 5); i > 0; i--) {
        const char *k = keys[rnd() % (sizeof keys / sizeof *keys)];
        json_t *v;
        if (!strcmp(k, "type") && rnd() % 3) v = json_string(types[rnd() % 8]);
        else if (!strcmp(k, "properties") || !strcmp(k, "$defs")) {
            v = json_object();
            json_object_set_new(v, rnd() % 2 ? "a" : "b", junk_schema(depth + 1));
        } else if (!strcmp(k, "$ref")) v = json_string(rnd() % 2 ? "#/$defs/a" : "#");
        else v = junk_schema(depth + 1);
        json_object_set_new(o, k, v);
    }
    return o;
}

static void test_grammar_random_schemas_compile_or_fail_cleanly(void **st) {
    (void)st;
    gr_vocab *v = byte_vocab();
    int compiled = 0, refused = 0;
    for (int i = 0; i < 1500; i++) {
        json_t *s = junk_schema(0);
        gr_grammar *g = NULL;
        ls_err e = {0};
        int rc = gr_compile_json_schema(s, (int)(rnd() % 2), "schema", &g, &e);
        if (rc == 0) {
            compiled++;
            gr_matcher *m = gr_matcher_new(g, v, NULL);
            char b[64];
            static const char cs[] = "{}[]\":, 0123abtruefalsn\"\\";
            for (int k = 0; k < 64; k++) b[k] = cs[rnd() % (sizeof cs - 1)];
            gr_matcher_feed(m, b, sizeof b);
            uint32_t bits[9];
            gr_matcher_fill_mask(m, bits);
            gr_matcher_free(m);
            gr_unref(g);
        } else {
            refused++;
            assert_int_equal(rc, ERR_INVAL);
            assert_null(g);
            if (strncmp(e.msg, "schema", 6) && strncmp(e.msg, "#", 1)) fail_msg("message without a path: %s", e.msg);
        }
        json_decref(s);
    }
    assert_true(compiled > 100 && refused > 100);
    gr_vocab_free(v);
}

/* Random EBNF-like text either compiles or is refused with a message naming the line;
 * what compiles follows random bytes without crashing. */
static void test_grammar_random_ebnf_compiles_or_fails_cleanly(void **st) {
    (void)st;
    static const char *bits[] = {"root", " ::= ", "a", "b", " ::= ", "\"x\"", "'y'", "[a-c]", ".", "(", ")", "|", "*",
                                 "+", "?", "{1,2}", "{2}", "\n", "# c\n", " ", "\"\\n\"", "[^x]+", "\"\\u00e9\""};
    int compiled = 0;
    for (int k = 0; k < 5000; k++) {
        char text[400] = "";
        int n = 1 + (int)(rnd() % 14);
        if (rnd() % 2) strcat(text, "root ::= ");
        for (int i = 0; i < n; i++) strcat(text, bits[rnd() % (sizeof bits / sizeof bits[0])]);
        gr_grammar *g = NULL;
        ls_err e = {0};
        if (gr_compile_ebnf(text, "ebnf", &g, &e) == 0) {
            compiled++;
            char in[12];
            for (int i = 0; i < 12; i++) in[i] = "xyabc\n+("[rnd() % 9];
            gr_vocab *vv = gr_vocab_from_bytes(0, NULL, NULL, NULL, NULL, 0);
            gr_matcher *m = gr_matcher_new(g, vv, NULL);
            gr_matcher_feed(m, in, rnd() % 12);
            gr_matcher_free(m);
            gr_vocab_free(vv);
            gr_unref(g);
        } else if (strncmp(e.msg, "ebnf: ", 6)) {
            fail_msg("'%s' refused without its path: '%s'", text, e.msg);
        }
    }
    assert_true(compiled > 100);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grammar_scalars_follow_json_syntax),
        cmocka_unit_test(test_grammar_strings_validate_utf8_escapes_and_lengths),
        cmocka_unit_test(test_grammar_enum_const_anyof),
        cmocka_unit_test(test_grammar_objects_order_required_additional),
        cmocka_unit_test(test_grammar_arrays_items_prefix_bounds),
        cmocka_unit_test(test_grammar_refs_and_recursion),
        cmocka_unit_test(test_grammar_json_object_mode),
        cmocka_unit_test(test_grammar_bad_schemas_name_their_path),
        cmocka_unit_test(test_grammar_tool_calls_in_both_formats),
        cmocka_unit_test(test_grammar_masks_equal_brute_force_json_schema),
        cmocka_unit_test(test_grammar_masks_equal_brute_force_alternative_strings),
        cmocka_unit_test(test_grammar_masks_equal_brute_force_free_strings),
        cmocka_unit_test(test_grammar_masks_equal_brute_force_tool_calls),
        cmocka_unit_test(test_grammar_gate_and_eos_rules),
        cmocka_unit_test(test_grammar_random_schemas_compile_or_fail_cleanly),
        cmocka_unit_test(test_grammar_random_ebnf_compiles_or_fails_cleanly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
