/* cmd_detokenize.c: `laststand detokenize --tokenizer-path DIR --ids 1,2,3
 * [--skip-special-tokens] [--stream] [--jsonl F]`: decode ids with the model's
 * tokenizer.json and print JSON {"text":"..."} (UTF-8, not \u-escaped).
 * --stream: also run the streaming detokenizer, one id at a time, and add its
 *           deltas: {"text":"...","deltas":["...",...]} (the last delta is
 *           what tok_stream_finish returned).
 * --jsonl F: F ('-': stdin) holds one JSON array of ids per line; one output
 *           line per input line (batch mode for tests).
 * Exit codes: 0 ok, 2 bad flag / bad ids / bad tokenizer.
 */
#include "cli/cli.h"
#include "tok/tok.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *f) {
    fprintf(f, "usage: laststand detokenize --tokenizer-path DIR (--ids 1,2,3 | --jsonl F)\n"
               "                            [--skip-special-tokens] [--stream]\n"
               "  --tokenizer-path DIR   folder with tokenizer.json (--model-path is accepted too)\n"
               "  --ids 1,2,3            the ids to decode\n"
               "  --skip-special-tokens  drop added tokens flagged special\n"
               "  --stream               also print the streaming detokenizer's deltas\n"
               "  --jsonl F              F ('-': stdin) holds one JSON array of ids per line;\n"
               "                         prints one JSON object per line\n"
               "prints {\"text\":\"...\"} (with --stream: {\"text\":\"...\",\"deltas\":[...]})\n");
}

static int fail(const char *fmt, const char *a, const char *b) {
    fprintf(stderr, "laststand detokenize: error: ");
    fprintf(stderr, fmt, a, b);
    fputc('\n', stderr);
    return 2;
}

static void emit(const tokenizer *t, const int32_t *ids, int n, int skip, int stream) {
    json_t *o = json_object();
    size_t len;
    char *text = tok_decode_n(t, ids, n, skip, &len);
    json_object_set_new(o, "text", json_stringn(text, len));
    free(text);
    if (stream) {
        json_t *d = json_array();
        tok_stream *s = tok_stream_new(t, skip);
        for (int i = 0; i <= n; i++) {
            char *x = i < n ? tok_stream_push_n(s, ids[i], &len) : tok_stream_finish_n(s, &len);
            json_array_append_new(d, json_stringn(x, len));
            free(x);
        }
        tok_stream_free(s);
        json_object_set_new(o, "deltas", d);
    }
    char *js = json_dumps(o, JSON_COMPACT);
    fputs(js, stdout);
    fputc('\n', stdout);
    free(js);
    json_decref(o);
}

static int bad_ids(const tokenizer *t, const int32_t *ids, int n, char *msg, size_t mn) {
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= tok_vocab_size(t) || !tok_piece(t, ids[i])) {
            snprintf(msg, mn, "id %d at position %d is not in the vocabulary (size %d)", ids[i], i, tok_vocab_size(t));
            return 1;
        }
    return 0;
}

static int run_jsonl(const tokenizer *t, const char *path, int skip, int stream) {
    ls_err e = {0};
    size_t len;
    char *src;
    if (!strcmp(path, "-")) {
        buf b;
        buf_init(&b);
        char tmp[65536];
        size_t k;
        while ((k = fread(tmp, 1, sizeof tmp, stdin)) > 0) buf_append(&b, tmp, k);
        len = b.len;
        src = buf_detach(&b);
    } else if (!(src = read_file(path, &len, &e))) {
        return fail("--jsonl: %s%s", e.msg, "");
    }
    size_t line = 0;
    int rc = 0;
    for (size_t i = 0; i < len && !rc;) {
        const char *nl = memchr(src + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - src) : len;
        line++;
        if (end > i) {
            json_error_t je;
            json_t *a = json_loadb(src + i, end - i, 0, &je);
            char where[32], msg[200];
            snprintf(where, sizeof where, "%zu", line);
            if (!json_is_array(a)) {
                rc = fail("--jsonl: line %s: expected a JSON array of ids%s", where, "");
            } else {
                int n = (int)json_array_size(a);
                int32_t *ids = xmalloc((n + 1) * sizeof *ids);
                for (int k = 0; k < n && !rc; k++) {
                    json_t *v = json_array_get(a, k);
                    if (!json_is_integer(v) || json_integer_value(v) < INT32_MIN || json_integer_value(v) > INT32_MAX)
                        rc = fail("--jsonl: line %s: expected a JSON array of ids%s", where, "");
                    else
                        ids[k] = (int32_t)json_integer_value(v);
                }
                if (!rc && bad_ids(t, ids, n, msg, sizeof msg)) rc = fail("--jsonl: line %s: %s", where, msg);
                if (!rc) emit(t, ids, n, skip, stream);
                free(ids);
            }
            json_decref(a);
        }
        i = end + 1;
    }
    free(src);
    return rc;
}

int cmd_detokenize(int argc, char **argv) {
    const char *dir = NULL, *ids_s = NULL, *jsonl = NULL;
    int skip = 0, stream = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!strcmp(a, "--skip-special-tokens")) { skip = 1; continue; }
        if (!strcmp(a, "--stream")) { stream = 1; continue; }
        const char **dst = !strcmp(a, "--tokenizer-path") || !strcmp(a, "--model-path") ? &dir
                         : !strcmp(a, "--ids") ? &ids_s
                         : !strcmp(a, "--jsonl") ? &jsonl : NULL;
        if (!dst) {
            usage(stderr);
            return fail("unknown flag '%s'%s", a, "");
        }
        if (i + 1 >= argc) return fail("%s needs a value%s", a, "");
        *dst = argv[++i];
    }
    if (!dir) { usage(stderr); return fail("--tokenizer-path is required%s%s", "", ""); }
    if (!ids_s == !jsonl) { usage(stderr); return fail("give exactly one of --ids and --jsonl%s%s", "", ""); }
    int32_t *ids = NULL;
    int n = 0;
    if (ids_s && (n = parse_int_list(ids_s, &ids)) < 0)
        return fail("--ids: expected comma-separated integers, got '%s'%s", ids_s, "");

    tokenizer *t;
    ls_err e = {0};
    if (tok_load_dir(dir, &t, &e)) {
        free(ids);
        return fail("--tokenizer-path: %s%s", e.msg, "");
    }
    int rc = 0;
    if (jsonl) {
        rc = run_jsonl(t, jsonl, skip, stream);
    } else {
        char msg[200];
        if (bad_ids(t, ids, n, msg, sizeof msg)) rc = fail("--ids: %s%s", msg, "");
        else emit(t, ids, n, skip, stream);
    }
    fflush(stdout);
    free(ids);
    tok_free(t);
    return rc;
}
