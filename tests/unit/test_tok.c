/* test_tok.c: the tokenizer through its C API (src/tok/tok.h).
 *
 * Pins: the streaming detokenizer at every prefix split of random id
 * sequences (byte soup included) equals tok_decode of that prefix and never
 * emits a partial UTF-8 character; String::from_utf8_lossy's U+FFFD rules;
 * encoding from many threads at once gives the single-thread ids (shared word
 * cache); a 1 MB word encodes in well under quadratic time; load errors name
 * the file and the JSON path; lookups and tokenizer_config.json fields.
 * HF `tokenizers` itself is the oracle in tests/test_tokenizer.py; here the
 * oracle for streaming is tok_decode, which that suite pins to HF.
 * Needs ../shared/tokenizers/qwen3 (LS_SHARED overrides ../shared); skips without it.
 * Random cases are seeded from the time; the seed is printed (TOK_TEST_SEED reproduces).
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tok/tok.h"

static tokenizer *g_tok;
static uint64_t g_seed;

static uint64_t rnd(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int valid_utf8(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        int w = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (!w || i + w > n) return 0;
        for (int k = 1; k < w; k++)
            if ((u[i + k] & 0xC0) != 0x80) return 0;
        if ((c == 0xE0 && u[i + 1] < 0xA0) || (c == 0xED && u[i + 1] > 0x9F) || (c == 0xF0 && u[i + 1] < 0x90) ||
            (c == 0xF4 && u[i + 1] > 0x8F))
            return 0;
        i += w;
    }
    return 1;
}

static int setup(void **st) {
    (void)st;
    const char *sh = getenv("LS_SHARED") ? getenv("LS_SHARED") : "../shared";
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tokenizers/qwen3", sh);
    ls_err e = {0};
    if (tok_load_dir(dir, &g_tok, &e)) {
        fprintf(stderr, "test_tok: %s (tests needing it are skipped)\n", e.msg);
        g_tok = NULL;
    }
    g_seed = getenv("TOK_TEST_SEED") ? strtoull(getenv("TOK_TEST_SEED"), NULL, 10) : (uint64_t)time(NULL);
    fprintf(stderr, "test_tok: seed %llu (TOK_TEST_SEED=%llu reproduces)\n", (unsigned long long)g_seed,
            (unsigned long long)g_seed);
    return 0;
}

static int teardown(void **st) {
    (void)st;
    tok_free(g_tok);
    return 0;
}

#define NEED_TOK() do { if (!g_tok) skip(); } while (0)

/* ---- streaming ------------------------------------------------------------ */

static int32_t rand_id(uint64_t *s) {
    uint64_t r = rnd(s) % 10;
    if (r < 5) return (int32_t)(rnd(s) % 256);           /* single bytes: partial characters */
    if (r < 6) return (int32_t)(151643 + rnd(s) % 26);    /* added tokens, special or not */
    return (int32_t)(rnd(s) % 151643);
}

static void check_stream(const int32_t *ids, int n, int skip_special) {
    /* one stream over all ids: after each push the emitted text is a prefix of
     * decode(prefix); with finish at any point it equals decode(prefix). */
    tok_stream *s = tok_stream_new(g_tok, skip_special);
    char *acc = xcalloc(1, 1);
    size_t acc_n = 0;
    for (int k = 0; k <= n; k++) {
        size_t dn;
        char *d = k < n ? tok_stream_push_n(s, ids[k], &dn) : tok_stream_finish_n(s, &dn);
        assert_true(valid_utf8(d, dn));
        acc = xrealloc(acc, acc_n + dn + 1);
        memcpy(acc + acc_n, d, dn);
        acc_n += dn;
        free(d);
        size_t fn;
        char *full = tok_decode_n(g_tok, ids, k < n ? k + 1 : n, skip_special, &fn);
        assert_true(acc_n <= fn);
        assert_memory_equal(acc, full, acc_n);
        if (k == n) assert_int_equal(acc_n, fn);
        free(full);
    }
    tok_stream_free(s);
    /* a fresh stream finished after each prefix gives exactly decode(prefix) */
    for (int cut = 0; cut <= n; cut++) {
        tok_stream *t = tok_stream_new(g_tok, skip_special);
        buf b;
        buf_init(&b);
        for (int k = 0; k <= cut; k++) {
            size_t dn;
            char *d = k < cut ? tok_stream_push_n(t, ids[k], &dn) : tok_stream_finish_n(t, &dn);
            buf_append(&b, d, dn);
            free(d);
        }
        size_t fn;
        char *full = tok_decode_n(g_tok, ids, cut, skip_special, &fn);
        assert_int_equal(b.len, fn);
        assert_memory_equal(b.data, full, fn);
        free(full);
        buf_free(&b);
        tok_stream_free(t);
    }
    free(acc);
}

static void test_stream_every_prefix_split_equals_decode(void **st) {
    (void)st;
    NEED_TOK();
    uint64_t s = g_seed;
    for (int c = 0; c < 300; c++) {
        int32_t ids[40];
        int n = (int)(rnd(&s) % 40);
        for (int i = 0; i < n; i++) ids[i] = rand_id(&s);
        check_stream(ids, n, c & 1);
    }
}

static void test_stream_of_encoded_text_reassembles_it(void **st) {
    (void)st;
    NEED_TOK();
    const char *text = "emoji 🤖🚀 and ZWJ 👩‍👩‍👧 日本語 <|im_start|>u\xCC\x88 done";
    int32_t *ids;
    ls_err e = {0};
    int n = tok_encode(g_tok, text, strlen(text), &ids, &e);
    assert_true(n > 0);
    check_stream(ids, n, 0);
    tok_stream *s = tok_stream_new(g_tok, 0);
    buf b;
    buf_init(&b);
    for (int i = 0; i < n; i++) {
        char *d = tok_stream_push(s, ids[i]);
        buf_puts(&b, d);
        free(d);
    }
    char *d = tok_stream_finish(s);
    buf_puts(&b, d);
    free(d);
    assert_string_equal(b.data, "emoji 🤖🚀 and ZWJ 👩‍👩‍👧 日本語 <|im_start|>ü done"); /* NFC'd */
    buf_free(&b);
    tok_stream_free(s);
    free(ids);
}

/* ---- U+FFFD exactly as String::from_utf8_lossy -------------------------------- */

static char *decode_bytes(const char *bytes, size_t n) {
    int32_t ids[64];
    for (size_t i = 0; i < n; i++) {
        /* the GPT-2 byte alphabet is ids 0..255 in Qwen's vocab, in byte-char order */
        unsigned b = (unsigned char)bytes[i];
        char one[8];
        unsigned cp = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE) ? b : 0;
        if (!cp) {
            int k = 0;
            for (unsigned x = 0; x < b; x++)
                if (!((x >= 0x21 && x <= 0x7E) || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) k++;
            cp = 256 + k;
        }
        if (cp < 0x80) { one[0] = (char)cp; one[1] = 0; }
        else { one[0] = (char)(0xC0 | cp >> 6); one[1] = (char)(0x80 | (cp & 0x3F)); one[2] = 0; }
        ids[i] = tok_id(g_tok, one);
        assert_true(ids[i] >= 0);
    }
    return tok_decode(g_tok, ids, (int)n, 0);
}

static void test_invalid_utf8_becomes_fffd_per_maximal_subpart(void **st) {
    (void)st;
    NEED_TOK();
    static const struct { const char *in; const char *out; } cases[] = {
        {"\xF0\x9F\x98" "A", "\xEF\xBF\xBD" "A"},                          /* truncated 4-byte: one U+FFFD */
        {"\xED\xA0\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"},          /* surrogate: 3 */
        {"\xC0\xAF", "\xEF\xBF\xBD\xEF\xBF\xBD"},                          /* overlong */
        {"\xE4\xB8", "\xEF\xBF\xBD"},                                      /* truncated at the end */
        {"\xE4\xB8\xAD", "中"},
        {"\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD"},                          /* stray continuations */
        {"\xF4\x90\x80\x80", "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD"}, /* > U+10FFFF */
        {"\xFF" "a\xE2\x82", "\xEF\xBF\xBD" "a\xEF\xBF\xBD"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *d = decode_bytes(cases[i].in, strlen(cases[i].in));
        assert_string_equal(d, cases[i].out);
        free(d);
    }
}

/* ---- threads --------------------------------------------------------------- */

#define NTEXT 64
static char *g_texts[NTEXT];
static int32_t *g_want[NTEXT];
static int g_want_n[NTEXT];

static void *encode_all(void *arg) {
    int bad = 0;
    for (int r = 0; r < 20; r++)
        for (int i = 0; i < NTEXT; i++) {
            int j = (i + (int)(intptr_t)arg * 7 + r) % NTEXT;
            int32_t *ids;
            ls_err e = {0};
            int n = tok_encode(g_tok, g_texts[j], strlen(g_texts[j]), &ids, &e);
            if (n != g_want_n[j] || memcmp(ids, g_want[j], n * sizeof *ids)) bad++;
            free(ids);
        }
    return (void *)(intptr_t)bad;
}

static void test_encode_from_many_threads_matches_single_thread(void **st) {
    (void)st;
    NEED_TOK();
    static const char *words[] = {"the", " quick", " 日本語", " русский", "  ", "\n", " 😀", "123", "é", "<|im_end|>",
                                  " don't", "\t", "ab", "ü\xCC\x88"};
    uint64_t s = g_seed ^ 0x5151;
    for (int i = 0; i < NTEXT; i++) {
        buf b;
        buf_init(&b);
        int k = 1 + (int)(rnd(&s) % 60);
        for (int j = 0; j < k; j++) buf_puts(&b, words[rnd(&s) % (sizeof words / sizeof words[0])]);
        g_texts[i] = buf_detach(&b);
        ls_err e = {0};
        g_want_n[i] = tok_encode(g_tok, g_texts[i], strlen(g_texts[i]), &g_want[i], &e);
        assert_true(g_want_n[i] >= 0);
    }
    pthread_t th[8];
    for (int i = 0; i < 8; i++) pthread_create(&th[i], NULL, encode_all, (void *)(intptr_t)i);
    int bad = 0;
    for (int i = 0; i < 8; i++) {
        void *r;
        pthread_join(th[i], &r);
        bad += (int)(intptr_t)r;
    }
    assert_int_equal(bad, 0);
    for (int i = 0; i < NTEXT; i++) {
        free(g_texts[i]);
        free(g_want[i]);
    }
}

/* ---- long words ------------------------------------------------------------- */

static void test_one_megabyte_word_is_not_quadratic(void **st) {
    (void)st;
    NEED_TOK();
    size_t n = 1 << 20;
    char *w = xmalloc(n + 1);
    uint64_t s = g_seed;
    for (size_t i = 0; i < n; i++) w[i] = (char)('a' + rnd(&s) % 26); /* one \p{L}+ pre-token */
    w[n] = 0;
    int32_t *ids;
    ls_err e = {0};
    double t0 = now_sec();
    int k = tok_encode(g_tok, w, n, &ids, &e);
    double dt = now_sec() - t0;
    assert_true(k > 0 && k < (int)n);
    char *back = tok_decode(g_tok, ids, k, 0);
    assert_string_equal(back, w);
    fprintf(stderr, "test_tok: 1 MB word -> %d tokens in %.2f s\n", k, dt);
    assert_true(dt < 20.0); /* quadratic would be hours; generous for a loaded CI box */
    free(back);
    free(ids);
    free(w);
}

/* ---- lookups, config, errors --------------------------------------------------- */

static void test_lookups_and_config(void **st) {
    (void)st;
    NEED_TOK();
    assert_int_equal(tok_vocab_size(g_tok), 151669);
    assert_int_equal(tok_id(g_tok, "<|im_end|>"), 151645);
    assert_int_equal(tok_id(g_tok, "Hello"), 9707);
    assert_int_equal(tok_id(g_tok, "no such token here"), -1);
    assert_string_equal(tok_piece(g_tok, 151667), "<think>");
    assert_null(tok_piece(g_tok, 151669));
    assert_true(tok_is_special(g_tok, 151645));
    assert_false(tok_is_special(g_tok, 151667)); /* <think> is added, not special */
    assert_false(tok_is_special(g_tok, 9707));
    assert_null(tok_bos_token(g_tok));
    assert_string_equal(tok_eos_token(g_tok), "<|im_end|>");
    assert_non_null(tok_chat_template(g_tok));
    char *d = tok_decode(g_tok, (int32_t[]){151644, 9707, 151667, 151645}, 4, 1);
    assert_string_equal(d, "Hello<think>");
    free(d);
    int32_t *ids;
    ls_err e = {0};
    assert_int_equal(tok_encode(g_tok, "a\xFF", 2, &ids, &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, "UTF-8"));
    assert_int_equal(tok_encode(g_tok, "", 0, &ids, &e), 0);
    free(ids);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_load_errors_name_file_and_json_path(void **st) {
    (void)st;
    char dir[] = "/tmp/test_tok_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[600];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    tokenizer *t;
    ls_err e = {0};
    assert_int_equal(tok_load_dir(dir, &t, &e), ERR_INVAL);
    assert_non_null(strstr(e.msg, path));
    static const struct { const char *json, *needle; } cases[] = {
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2},\"merges\":[\"a b\",\"a xx\"]}}",
         "model.merges[1]: unknown token 'xx'"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[[\"a\",\"b\"]]}}",
         "model.merges[0]: merged token 'ab' is not in model.vocab"},
        {"{\"model\":{\"type\":\"Unigram\",\"vocab\":[]}}", "model.type: 'Unigram' is not supported"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"normalizer\":{\"type\":\"Nope\"}}",
         "normalizer: normalizer type 'Nope'"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"pre_tokenizer\":{\"type\":\"Sequence\","
         "\"pretokenizers\":[{\"type\":\"ByteLevel\"},{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},\"behavior\":\"Isolated\"}]}}",
         "pre_tokenizer.pretokenizers[1].pattern: regex does not compile"},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},\"added_tokens\":[{\"id\":\"x\"}]}",
         "added_tokens[0]: missing or bad \"id\""},
        {"{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[], }", "tokenizer.json: line 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_file(path, cases[i].json);
        memset(&e, 0, sizeof e);
        assert_int_equal(tok_load_dir(dir, &t, &e), ERR_INVAL);
        if (!strstr(e.msg, cases[i].needle)) fail_msg("case %zu: '%s' lacks '%s'", i, e.msg, cases[i].needle);
    }
    unlink(path);
    rmdir(dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stream_every_prefix_split_equals_decode),
        cmocka_unit_test(test_stream_of_encoded_text_reassembles_it),
        cmocka_unit_test(test_invalid_utf8_becomes_fffd_per_maximal_subpart),
        cmocka_unit_test(test_encode_from_many_threads_matches_single_thread),
        cmocka_unit_test(test_one_megabyte_word_is_not_quadratic),
        cmocka_unit_test(test_lookups_and_config),
        cmocka_unit_test(test_load_errors_name_file_and_json_path),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
