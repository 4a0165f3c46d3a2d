/* sweep_smoke.c: the smoke test of a sweep point and its garbage judgement.
 *
 * A few fixed, unrelated chat prompts go out at once (one mixed batch, where
 * real kernel failures hide), greedy (temperature 0), short max_tokens. The
 * answers are garbage when any of these holds (reference/peers-and-parsers.md
 * section 0: the "!!!!" and "++++" outputs seen in the wild):
 *   - a request failed (HTTP error, an error event, NaN that broke the JSON),
 *   - an answer is empty,
 *   - one character or a short unit (up to 16 bytes, e.g. one token) repeats
 *     16 or more times in a row (whitespace runs excepted),
 *   - an answer is not valid UTF-8,
 *   - two different prompts got the identical answer.
 */
#include "cli/sweep.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

static const char *const PROMPTS[] = {
    "What is the capital of France? Answer in one sentence.",
    "Write a short poem about the ocean.",
    "List three prime numbers greater than ten.",
    "Explain in two sentences why the sky is blue.",
};
#define N_PROMPTS ((int)(sizeof PROMPTS / sizeof PROMPTS[0]))

/* Printable, valid-UTF-8 quote of s[0..n) cut at max bytes (for evidence). */
static void quote(buf *b, const char *s, size_t n, size_t max) {
    buf_putc(b, '"');
    size_t i = 0;
    while (i < n && i < max) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n') buf_puts(b, "\\n"), i++;
        else if (c == '"') buf_puts(b, "\\\""), i++;
        else if (c < 0x20 || c == 0x7f) buf_printf(b, "\\x%02x", c), i++;
        else if (c < 0x80) buf_putc(b, (char)c), i++;
        else {
            int len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
            if (len && i + len <= n && bench_utf8_valid(s + i, len)) buf_append(b, s + i, len), i += len;
            else buf_printf(b, "\\x%02x", c), i++;
        }
    }
    if (i < n) buf_puts(b, "...");
    buf_putc(b, '"');
}

char *sweep_judge_text(const char *t, size_t n) {
    buf b;
    buf_init(&b);
    size_t k = 0;
    while (k < n && isspace((unsigned char)t[k])) k++;
    if (k == n) {
        buf_puts(&b, "empty output");
        return buf_detach(&b);
    }
    if (!bench_utf8_valid(t, n)) {
        buf_puts(&b, "invalid UTF-8 in the output: ");
        quote(&b, t, n, 60);
        return buf_detach(&b);
    }
    for (size_t L = 1; L <= 16; L++) {
        size_t run = 0;
        for (size_t j = L; j < n; j++) {
            run = t[j] == t[j - L] ? run + 1 : 0;
            if (run < 15 * L) continue;
            size_t start = j - run - L + 1;
            int blank = 1;
            for (size_t q = 0; q < L; q++) blank &= isspace((unsigned char)t[start + q]) != 0;
            if (blank) continue;
            /* extend to the whole run for the count */
            size_t e = j;
            while (e + 1 < n && t[e + 1] == t[e + 1 - L]) e++;
            size_t times = (e - start + 1) / L;
            buf_puts(&b, L == 1 ? "one character repeated " : "one unit repeated ");
            buf_printf(&b, "%zu times: ", times);
            quote(&b, t + start, L, L);
            buf_puts(&b, " in ");
            quote(&b, t, n, 60);
            return buf_detach(&b);
        }
    }
    buf_free(&b);
    return NULL;
}

void sweep_smoke_free(sweep_smoke *s) {
    for (int i = 0; i < s->n; i++) {
        if (s->texts) free(s->texts[i]);
        if (s->errors) free(s->errors[i]);
    }
    free(s->texts);
    free(s->errors);
    free(s->reason);
    memset(s, 0, sizeof *s);
}

int sweep_smoke_run(const char *base_url, const char *api_key, const char *model, int max_tokens,
                    double timeout_s, sweep_smoke *s, ls_err *e) {
    memset(s, 0, sizeof *s);
    s->n = N_PROMPTS;
    s->prompts = (const char **)PROMPTS;
    s->texts = xcalloc(N_PROMPTS, sizeof(char *));
    s->errors = xcalloc(N_PROMPTS, sizeof(char *));
    bench_req reqs[N_PROMPTS];
    memset(reqs, 0, sizeof reqs);
    for (int i = 0; i < N_PROMPTS; i++) {
        json_t *b = json_object();
        if (model) json_object_set_new(b, "model", json_string(model));
        json_object_set_new(b, "messages", json_pack("[{s:s,s:s}]", "role", "user", "content", PROMPTS[i]));
        json_object_set_new(b, "max_tokens", json_integer(max_tokens));
        json_object_set_new(b, "temperature", json_real(0.0));
        json_object_set_new(b, "stream", json_false());
        reqs[i].body = json_dumps(b, JSON_COMPACT);
        json_decref(b);
        reqs[i].is_chat = 1;
        reqs[i].usage_optional = 1;
    }
    buf url;
    buf_init(&url);
    buf_printf(&url, "%s/v1/chat/completions", base_url);
    double dur;
    int rc = bench_http_run(url.data, api_key, reqs, N_PROMPTS, 0, 0, 0, timeout_s, NULL, NULL, &dur, e);
    buf_free(&url);
    if (rc) {
        for (int i = 0; i < N_PROMPTS; i++) bench_req_free(&reqs[i]);
        sweep_smoke_free(s);
        return rc;
    }
    buf why;
    buf_init(&why);
    for (int i = 0; i < N_PROMPTS; i++) {
        bench_req *r = &reqs[i];
        if (r->error) s->errors[i] = xstrdup(r->error);
        if (r->text.data && bench_utf8_valid(r->text.data, r->text.len)) s->texts[i] = xstrdup(r->text.data);
        if (why.len) continue; /* the first reason is the evidence */
        if (r->error) {
            buf_printf(&why, "prompt %d: %s", i + 1, r->error);
            continue;
        }
        char *j = sweep_judge_text(r->text.data ? r->text.data : "", r->text.len);
        if (j) buf_printf(&why, "prompt %d: %s", i + 1, j);
        free(j);
    }
    for (int i = 0; i < N_PROMPTS && !why.len; i++)
        for (int k = i + 1; k < N_PROMPTS && !why.len; k++)
            if (s->texts[i] && s->texts[k] && *s->texts[i] && !strcmp(s->texts[i], s->texts[k])) {
                buf_printf(&why, "prompts %d and %d got the identical answer ", i + 1, k + 1);
                quote(&why, s->texts[i], strlen(s->texts[i]), 60);
            }
    for (int i = 0; i < N_PROMPTS; i++) bench_req_free(&reqs[i]);
    if (why.len) {
        s->garbage = 1;
        s->reason = buf_detach(&why);
    }
    buf_free(&why);
    return 0;
}
