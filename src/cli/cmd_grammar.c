/* cmd_grammar.c: `laststand grammar`: the constrained-decoding automaton on a
 * tokenizer, outside the server. For debugging a schema, for the differential
 * tests (tests/test_grammar_json.py) and for the mask benchmark
 * (bench/grammar_bench.sh).
 *
 *   laststand grammar --tokenizer-path DIR (--schema FILE [--strict] | --json-object | --regex RE | --ebnf FILE |
 *                     --tools FILE --tool-format hermes|qwen3_coder [--only NAME])
 *                     [--prefix-file F] [--vocab N] (--mask | --check-file F)
 *   laststand grammar --tokenizer-path DIR --bench [--vocab N] [--reps N]
 *
 * --mask: after the prefix's bytes, prints {"accepting":b,"cached":b,"us":t,"allowed":[ids]}
 *   (cached: the mask came from the string-state cache)
 * --check-file F: F has one hex byte string per line; prints {"ok":[0|1,...],"accept":[0|1,...]}:
 *   whether prefix + those bytes is still a prefix of the grammar's language, and a whole sentence of it
 * --bench: a table of microseconds per mask by state kind (cold = first mask
 *   of that state, which may fill the string-state cache; warm = median).
 * EOS ids: the tokenizer_config eos_token and <|im_end|> / <|endoftext|> when present.
 * Exit codes: 0 ok, 2 bad flag / file / schema (the message names it).
 */
#include "cli/cli.h"
#include "grammar/gr.h"
#include "tok/tok.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f,
            "usage: laststand grammar --tokenizer-path DIR (--schema FILE [--strict] | --json-object | --regex RE |\n"
            "                         --ebnf FILE |\n"
            "                         --tools FILE --tool-format hermes|qwen3_coder [--only NAME])\n"
            "                         [--prefix-file F] [--vocab N] (--mask | --check-file F)\n"
            "       laststand grammar --tokenizer-path DIR --bench [--vocab N] [--reps N]\n"
            "  --schema FILE       a JSON Schema          --json-object   any JSON object\n"
            "  --regex RE          the whole output matches the regular expression RE\n"
            "  --ebnf FILE         an EBNF / GBNF grammar (its rule root)\n"
            "  --tools FILE        a tools array (OpenAI) --only NAME     that function only\n"
            "  --prefix-file F     output bytes already generated (default: none)\n"
            "  --vocab N           mask width (the model's vocabulary; default the tokenizer's)\n"
            "  --mask              print the allowed token ids after the prefix\n"
            "  --check-file F      one hex byte string per line: is prefix + bytes a valid prefix?\n"
            "  --bench             microseconds per mask by state kind\n");
}

static int fail(const char *fmt, const char *a) {
    fprintf(stderr, "laststand grammar: error: ");
    fprintf(stderr, fmt, a);
    fputc('\n', stderr);
    return 2;
}

static gr_vocab *load_vocab(const tokenizer *t, int n_vocab) {
    int32_t eos[3];
    int ne = 0;
    const char *names[3] = {tok_eos_token(t), "<|im_end|>", "<|endoftext|>"};
    for (int i = 0; i < 3; i++) {
        int32_t id = names[i] ? tok_id(t, names[i]) : -1;
        int dup = 0;
        for (int k = 0; k < ne; k++) dup |= eos[k] == id;
        if (id >= 0 && !dup) eos[ne++] = id;
    }
    return gr_vocab_new(t, n_vocab, eos, ne);
}

static int hexval(int c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* ---- bench ------------------------------------------------------------------------------- */

typedef struct scen { const char *kind, *schema, *tools, *prefix; } scen;

static const scen SCENARIOS[] = {
    {"object start (json_object)", NULL, NULL, ""},
    {"key string (json_object, cached)", NULL, NULL, "{\"na"},
    {"value start (json_object: any value)", NULL, NULL, "{\"name\": "},
    {"free string value (cached)", NULL, NULL, "{\"name\": \"Jo"},
    {"number", NULL, NULL, "{\"age\": 12"},
    {"after a value (, or })", NULL, NULL, "{\"age\": 12.5"},
    {"enum value (schema)",
     "{\"type\":\"object\",\"properties\":{\"color\":{\"enum\":[\"red\",\"green\",\"blue\",\"cyan\",\"magenta\"]}},"
     "\"required\":[\"color\"]}", NULL, "{\"color\": \""},
    {"maxLength 20 string (schema, cached)",
     "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":20}},\"required\":[\"name\"]}",
     NULL, "{\"name\": \"ab"},
    {"anyOf string|integer (2 stacks)",
     "{\"type\":\"object\",\"properties\":{\"v\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":9},{\"type\":\"integer\"}]}},"
     "\"required\":[\"v\"]}", NULL, "{\"v\": "},
    {"anyOf of two strings, inside (2 stacks, each cached)",
     "{\"type\":\"object\",\"properties\":{\"v\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":9},"
     "{\"type\":\"string\",\"minLength\":3}]}},\"required\":[\"v\"]}", NULL, "{\"v\": \"ab"},
    {"complete (only EOS / ws)", NULL, NULL, "{\"a\": 1}"},
    {"xml tool call: function name", NULL,
     "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
     "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}},\"required\":[\"city\"]}}}]",
     "<tool_call>\n<function=get_w"},
    {"xml tool call: raw text value (cached)", NULL,
     "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
     "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}},\"required\":[\"city\"]}}}]",
     "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar"},
};

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int bench(const tokenizer *t, int n_vocab, int reps) {
    double t0 = now_sec();
    gr_vocab *v = load_vocab(t, n_vocab);
    double tv = now_sec() - t0;
    printf("grammar mask bench: %d tokenizer ids, mask width %d, trie built in %.0f ms, %d reps\n",
           tok_vocab_size(t), gr_vocab_size(v), tv * 1e3, reps);
    printf("| state | allowed | cold us | warm us (median) | cached |\n|---|---|---|---|---|\n");
    uint32_t *bits = xmalloc((size_t)gr_mask_words(v) * sizeof *bits);
    double *ts = xmalloc((size_t)reps * sizeof *ts), worst = 0;
    for (size_t i = 0; i < sizeof SCENARIOS / sizeof *SCENARIOS; i++) {
        const scen *s = &SCENARIOS[i];
        gr_grammar *g = NULL;
        ls_err e = {0};
        if (s->tools) {
            json_t *tools = json_loads(s->tools, 0, NULL);
            gr_compile_tool_calls(tools, NULL, GR_TOOLS_XML, 1, 1, "tools", &g, &e);
            json_decref(tools);
        } else if (s->schema) {
            json_t *sc = json_loads(s->schema, 0, NULL);
            gr_compile_json_schema(sc, 0, "schema", &g, &e);
            json_decref(sc);
        } else {
            g = gr_compile_json_object();
        }
        CHECK(g);
        gr_matcher *m = gr_matcher_new(g, v, NULL);
        CHECK(gr_matcher_feed(m, s->prefix, strlen(s->prefix)) == 0);
        double c0 = now_sec();
        gr_matcher_fill_mask(m, bits);
        double cold = now_sec() - c0;
        for (int r = 0; r < reps; r++) {
            double a = now_sec();
            gr_matcher_fill_mask(m, bits);
            ts[r] = now_sec() - a;
        }
        qsort(ts, (size_t)reps, sizeof *ts, cmp_d);
        int allowed = 0;
        for (int w = 0; w < gr_mask_words(v); w++) allowed += __builtin_popcount(bits[w]);
        printf("| %s | %d | %.0f | %.1f | %s |\n", s->kind, allowed, cold * 1e6, ts[reps / 2] * 1e6,
               gr_matcher_last_cached(m) ? "yes" : "no");
        if (ts[reps / 2] > worst) worst = ts[reps / 2];
        gr_matcher_free(m);
        gr_unref(g);
    }
    printf("worst warm mask: %.1f us\n", worst * 1e6);
    free(bits);
    free(ts);
    gr_vocab_free(v);
    return 0;
}

/* ---- main ----------------------------------------------------------------------------------- */

int cmd_grammar(int argc, char **argv) {
    const char *tdir = NULL, *schema = NULL, *tools = NULL, *fmt = "qwen3_coder", *only = NULL, *prefix = NULL,
               *check = NULL, *regex = NULL, *ebnf = NULL;
    int strict = 0, json_obj = 0, mask = 0, do_bench = 0, n_vocab = 0, reps = 50;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
#define TAKE(name, dst) if (!strcmp(a, name)) { if (!val) return fail("%s needs a value", name); dst = val; i++; continue; }
        TAKE("--tokenizer-path", tdir) TAKE("--model-path", tdir) TAKE("--schema", schema) TAKE("--tools", tools)
        TAKE("--tool-format", fmt) TAKE("--only", only) TAKE("--prefix-file", prefix) TAKE("--check-file", check)
        TAKE("--regex", regex) TAKE("--ebnf", ebnf)
#undef TAKE
        if (!strcmp(a, "--vocab") || !strcmp(a, "--reps")) {
            if (!val || atoi(val) <= 0) return fail("%s needs a positive integer", a);
            *(strcmp(a, "--vocab") ? &reps : &n_vocab) = atoi(val);
            i++;
        } else if (!strcmp(a, "--strict")) strict = 1;
        else if (!strcmp(a, "--json-object")) json_obj = 1;
        else if (!strcmp(a, "--mask")) mask = 1;
        else if (!strcmp(a, "--bench")) do_bench = 1;
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        else { usage(stderr); return fail("unknown flag '%s'", a); }
    }
    if (!tdir) { usage(stderr); return fail("%s is required", "--tokenizer-path"); }
    tokenizer *t = NULL;
    ls_err e = {0};
    if (tok_load_dir(tdir, &t, &e) < 0) return fail("--tokenizer-path: %s", e.msg);
    if (!n_vocab) n_vocab = tok_vocab_size(t);
    if (do_bench) {
        int rc = bench(t, n_vocab, reps);
        tok_free(t);
        return rc;
    }
    if ((schema != NULL) + (tools != NULL) + (regex != NULL) + (ebnf != NULL) + json_obj != 1 ||
        mask + (check != NULL) != 1) {
        tok_free(t);
        usage(stderr);
        return fail("%s", "give one of --schema, --tools, --regex, --ebnf, --json-object and one of --mask, --check-file");
    }
    gr_grammar *g = NULL;
    int rc = 0;
    if (json_obj) g = gr_compile_json_object();
    else if (regex) {
        if (gr_compile_regex(regex, "--regex", &g, &e) < 0) { tok_free(t); return fail("%s", e.msg); }
    } else if (ebnf) {
        size_t n = 0;
        char *text = read_file(ebnf, &n, &e);
        if (!text) { tok_free(t); return fail("--ebnf: %s", e.msg); }
        rc = gr_compile_ebnf(text, "--ebnf", &g, &e);
        free(text);
        if (rc < 0) { tok_free(t); return fail("%s", e.msg); }
    } else {
        json_error_t je;
        json_t *j = json_load_file(schema ? schema : tools, JSON_DECODE_ANY, &je);
        if (!j) { tok_free(t); return fail("cannot read the JSON of %s", schema ? schema : tools); }
        if (schema) rc = gr_compile_json_schema(j, strict, "schema", &g, &e);
        else rc = gr_compile_tool_calls(j, only, !strcmp(fmt, "hermes") ? GR_TOOLS_HERMES : GR_TOOLS_XML, 1, 4,
                                        "tools", &g, &e);
        json_decref(j);
        if (rc < 0) { tok_free(t); return fail("%s", e.msg); }
    }
    gr_vocab *v = load_vocab(t, n_vocab);
    size_t plen = 0;
    char *pre = prefix ? read_file(prefix, &plen, &e) : NULL;
    if (prefix && !pre) { rc = fail("--prefix-file: %s", e.msg); goto out; }
    gr_matcher *m = gr_matcher_new(g, v, NULL);
    if (gr_matcher_feed(m, pre ? pre : "", plen) < 0) {
        gr_matcher_free(m);
        rc = fail("%s", "the prefix does not follow the grammar");
        goto out;
    }
    if (mask) {
        uint32_t *bits = xmalloc((size_t)gr_mask_words(v) * sizeof *bits);
        double t0 = now_sec();
        gr_matcher_fill_mask(m, bits);
        double us = (now_sec() - t0) * 1e6;
        printf("{\"accepting\":%s,\"cached\":%s,\"us\":%.1f,\"allowed\":[", gr_matcher_accepting(m) ? "true" : "false",
               gr_matcher_last_cached(m) ? "true" : "false", us);
        int first = 1;
        for (int i = 0; i < n_vocab; i++)
            if ((bits[i >> 5] >> (i & 31)) & 1) { printf(first ? "%d" : ",%d", i); first = 0; }
        printf("]}\n");
        free(bits);
    } else {
        FILE *f = fopen(check, "r");
        if (!f) { gr_matcher_free(m); rc = fail("--check-file %s: cannot open", check); goto out; }
        char line[4096];
        buf acc; buf_init(&acc);
        printf("{\"ok\":[");
        int first = 1;
        while (fgets(line, sizeof line, f)) {
            size_t n = strcspn(line, "\r\n");
            char bytes[2048];
            size_t nb = 0;
            for (size_t k = 0; k + 1 < n && nb < sizeof bytes; k += 2)
                bytes[nb++] = (char)(hexval(line[k]) * 16 + hexval(line[k + 1]));
            gr_matcher *b = gr_matcher_new(g, v, NULL);
            int ok = gr_matcher_feed(b, pre ? pre : "", plen) == 0 && gr_matcher_feed(b, bytes, nb) == 0;
            int whole = ok && gr_matcher_accepting(b);
            gr_matcher_free(b);
            printf(first ? "%d" : ",%d", ok);
            buf_printf(&acc, first ? "%d" : ",%d", whole);
            first = 0;
        }
        printf("],\"accept\":[%s]}\n", acc.data ? acc.data : "");
        buf_free(&acc);
        fclose(f);
    }
    gr_matcher_free(m);
out:
    free(pre);
    gr_vocab_free(v);
    gr_unref(g);
    tok_free(t);
    return rc;
}
