/* cmd_tokenize.c: `laststand tokenize --tokenizer-path DIR (--text S | --file F)
 * [--jsonl]`: encode with the model's tokenizer.json, no special tokens added,
 * and print JSON {"ids":[...]}.
 * --jsonl: the input (--file F, or --text S) holds one JSON string per line;
 * one {"ids":[...]} line is printed per input line, in order (batch mode for
 * tests: one process start for thousands of strings).
 * Exit codes: 0 ok, 2 bad flag / unreadable file / bad tokenizer / bad input.
 */
#include "cli/cli.h"
#include "tok/tok.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: laststand tokenize --tokenizer-path DIR (--text S | --file F) [--jsonl]\n"
               "  --tokenizer-path DIR  folder with tokenizer.json (--model-path is accepted too)\n"
               "  --text S              the text to encode (UTF-8)\n"
               "  --file F              read the text from file F ('-': stdin)\n"
               "  --jsonl               input is one JSON string per line; prints one {\"ids\":[...]} per line\n"
               "prints {\"ids\":[...]}; no special tokens are added (added tokens in the text are matched)\n");
}

static int fail(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "laststand tokenize: error: ");
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
    return 2;
}

static void print_ids(const int32_t *ids, int n) {
    fputs("{\"ids\":[", stdout);
    for (int i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
    fputs("]}\n", stdout);
}

static char *read_stdin(size_t *len) {
    buf b;
    buf_init(&b);
    char tmp[65536];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, stdin)) > 0) buf_append(&b, tmp, n);
    *len = b.len;
    return buf_detach(&b);
}

static int encode_jsonl(const tokenizer *t, const char *src, size_t len, const char *what) {
    size_t line = 0;
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(src + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - src) : len;
        line++;
        if (end > i) {
            json_error_t je;
            json_t *s = json_loadb(src + i, end - i, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
            if (!s || !json_is_string(s)) {
                char where[64];
                snprintf(where, sizeof where, "%zu", line);
                json_decref(s);
                return fail("%s: line %s: expected one JSON string per line", what, where);
            }
            int32_t *ids;
            ls_err e = {0};
            int n = tok_encode(t, json_string_value(s), json_string_length(s), &ids, &e);
            json_decref(s);
            if (n < 0) return fail("%s: %s", what, e.msg);
            print_ids(ids, n);
            free(ids);
        }
        i = end + 1;
    }
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *dir = NULL, *text = NULL, *file = NULL;
    int jsonl = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!strcmp(a, "--jsonl")) { jsonl = 1; continue; }
        const char **dst = !strcmp(a, "--tokenizer-path") || !strcmp(a, "--model-path") ? &dir
                         : !strcmp(a, "--text") ? &text
                         : !strcmp(a, "--file") ? &file : NULL;
        if (!dst) {
            usage(stderr);
            return fail("unknown flag '%s'%s", a, "");
        }
        if (i + 1 >= argc) return fail("%s needs a value%s", a, "");
        *dst = argv[++i];
    }
    if (!dir) { usage(stderr); return fail("--tokenizer-path is required%s%s", "", ""); }
    if (!text == !file) { usage(stderr); return fail("give exactly one of --text and --file%s%s", "", ""); }

    size_t len;
    char *owned = NULL;
    if (file) {
        ls_err e = {0};
        owned = !strcmp(file, "-") ? read_stdin(&len) : read_file(file, &len, &e);
        if (!owned) return fail("--file: %s%s", e.msg, "");
        text = owned;
    } else {
        len = strlen(text);
    }

    tokenizer *t;
    ls_err e = {0};
    if (tok_load_dir(dir, &t, &e)) {
        free(owned);
        return fail("--tokenizer-path: %s%s", e.msg, "");
    }
    int rc = 0;
    if (jsonl) {
        rc = encode_jsonl(t, text, len, file ? "--file" : "--text");
    } else {
        int32_t *ids;
        int n = tok_encode(t, text, len, &ids, &e);
        if (n < 0) {
            rc = fail("%s: %s", file ? "--file" : "--text", e.msg);
        } else {
            print_ids(ids, n);
            free(ids);
        }
    }
    fflush(stdout);
    tok_free(t);
    free(owned);
    return rc;
}
