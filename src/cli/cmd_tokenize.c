/* cmd_tokenize.c: `laststand tokenize --tokenizer-path DIR (--text S | --file F)
 * [--jsonl]`: encode with the model's tokenizer.json, no special tokens added,
 * and print JSON {"ids":[...]}.
 * --jsonl: the input (--file F, or --text S) holds one JSON string per line;
 * one {"ids":[...]} line is printed per input line, in order (batch mode for
 * tests: one process start for thousands of strings).
 * --bench N: encode the whole text (with --jsonl: each line's string) N times
 * on this thread, each run with an empty word cache, and print
 * {"bytes","texts","tokens","runs","best_s","median_s","mb_per_s","best_cpu_s","cpu_mb_per_s"} instead
 * of the ids (bench/tok_bench.py drives it).
 * Exit codes: 0 ok, 2 bad flag / unreadable file / bad tokenizer / bad input.
 */
#include "cli/cli.h"
#include "tok/tok.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double thread_cpu_sec(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void usage(FILE *f) {
    fprintf(f, "usage: laststand tokenize --tokenizer-path DIR (--text S | --file F) [--jsonl] [--bench N]\n"
               "  --tokenizer-path DIR  folder with tokenizer.json (--model-path is accepted too)\n"
               "  --text S              the text to encode (UTF-8)\n"
               "  --file F              read the text from file F ('-': stdin)\n"
               "  --jsonl               input is one JSON string per line; prints one {\"ids\":[...]} per line\n"
               "  --bench N             encode the text (or each --jsonl line) N times on one thread, cold cache;\n"
               "                        print timing JSON (wall and thread CPU), not ids\n"
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
    const char *dir = NULL, *text = NULL, *file = NULL, *bench = NULL;
    int jsonl = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) { usage(stdout); return 0; }
        if (!strcmp(a, "--jsonl")) { jsonl = 1; continue; }
        const char **dst = !strcmp(a, "--tokenizer-path") || !strcmp(a, "--model-path") ? &dir
                         : !strcmp(a, "--text") ? &text
                         : !strcmp(a, "--file") ? &file
                         : !strcmp(a, "--bench") ? &bench : NULL;
        if (!dst) {
            usage(stderr);
            return fail("unknown flag '%s'%s", a, "");
        }
        if (i + 1 >= argc) return fail("%s needs a value%s", a, "");
        *dst = argv[++i];
    }
    if (!dir) { usage(stderr); return fail("--tokenizer-path is required%s%s", "", ""); }
    if (!text == !file) { usage(stderr); return fail("give exactly one of --text and --file%s%s", "", ""); }
    int runs = 0;
    if (bench) {
        char *end;
        long v = strtol(bench, &end, 10);
        if (*end || v < 1 || v > 1000) return fail("--bench: expected a run count 1..1000, got '%s'%s", bench, "");
        runs = (int)v;
    }

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
    if (runs) {
        /* the texts: the whole input, or (--jsonl) one JSON string per line */
        int np = 0, cap = 1;
        json_t **js = NULL;
        const char **pt = xmalloc(sizeof *pt);
        size_t *pl = xmalloc(sizeof *pl);
        if (jsonl) {
            for (size_t i = 0; i < len && !rc;) {
                const char *nl = memchr(text + i, '\n', len - i);
                size_t end = nl ? (size_t)(nl - text) : len;
                if (end > i) {
                    json_error_t je;
                    json_t *v = json_loadb(text + i, end - i, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
                    if (!json_is_string(v)) {
                        json_decref(v);
                        rc = fail("%s: expected one JSON string per line%s", file ? "--file" : "--text", "");
                        break;
                    }
                    if (np == cap) {
                        cap *= 2;
                        pt = xrealloc(pt, cap * sizeof *pt);
                        pl = xrealloc(pl, cap * sizeof *pl);
                        js = xrealloc(js, cap * sizeof *js);
                    }
                    if (!js) js = xmalloc(cap * sizeof *js);
                    js[np] = v;
                    pt[np] = json_string_value(v);
                    pl[np++] = json_string_length(v);
                }
                i = end + 1;
            }
        } else {
            pt[0] = text;
            pl[0] = len;
            np = 1;
        }
        size_t bytes = 0;
        for (int i = 0; i < np; i++) bytes += pl[i];
        double *sec = xmalloc(runs * sizeof *sec), *cpu = xmalloc(runs * sizeof *cpu);
        long ntok = 0;
        for (int r = 0; r < runs && !rc; r++) {
            tok_cache_clear(t); /* every run starts cold */
            ntok = 0;
            double t0 = now_sec(), c0 = thread_cpu_sec();
            for (int i = 0; i < np && !rc; i++) {
                int32_t *ids;
                int n = tok_encode(t, pt[i], pl[i], &ids, &e);
                if (n < 0) rc = fail("%s: %s", file ? "--file" : "--text", e.msg);
                else free(ids), ntok += n;
            }
            sec[r] = now_sec() - t0;
            cpu[r] = thread_cpu_sec() - c0;
        }
        if (!rc) {
            qsort(sec, runs, sizeof *sec, cmp_double);
            qsort(cpu, runs, sizeof *cpu, cmp_double);
            printf("{\"bytes\":%zu,\"texts\":%d,\"tokens\":%ld,\"runs\":%d,\"best_s\":%.6f,\"median_s\":%.6f,"
                   "\"mb_per_s\":%.3f,\"best_cpu_s\":%.6f,\"cpu_mb_per_s\":%.3f}\n",
                   bytes, np, ntok, runs, sec[0], sec[runs / 2], bytes / 1e6 / sec[0], cpu[0], bytes / 1e6 / cpu[0]);
        }
        for (int i = 0; js && i < np; i++) json_decref(js[i]);
        free(js);
        free(pt);
        free(pl);
        free(sec);
        free(cpu);
    } else if (jsonl) {
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
