/* pretok_fast.c: a hand-written matcher for the pre-tokenizer regexes of the
 * Qwen2/Qwen3, Qwen3.5 and Llama 3 / cl100k families, recognised by their
 * exact pattern text:
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?L+|\p{N}{1,D}| ?[^\s\p{L}\p{N}X]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * with L = \p{L} (Qwen3, Llama 3) or [\p{L}\p{M}] (Qwen3.5, X = \p{M}) and
 * D = 1 (Qwen) or 3 (Llama 3).
 *
 * Owns: nothing. It reproduces the backtracking matcher's leftmost-first
 * semantics alternative by alternative (see fast_match), and classifies code
 * points with utf8proc (Unicode 15) instead of PCRE2's tables (Unicode 14),
 * which is closer to the Oniguruma build HF ships. Every position of the text
 * starts a match, so the pieces tile the text. LS_TOK_NO_FASTPATH=1 in the
 * environment disables it at load (tests compare both paths with HF).
 */
#include "tok/tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static const char P_QWEN2[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char P_QWEN35[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char P_LLAMA3[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

int tok_fast_pattern(const char *pat, size_t len) {
    const char *off = getenv("LS_TOK_NO_FASTPATH");
    if (off && *off && strcmp(off, "0")) return FAST_NONE;
    if (len == sizeof P_QWEN2 - 1 && !memcmp(pat, P_QWEN2, len)) return FAST_QWEN2;
    if (len == sizeof P_QWEN35 - 1 && !memcmp(pat, P_QWEN35, len)) return FAST_QWEN35;
    if (len == sizeof P_LLAMA3 - 1 && !memcmp(pat, P_LLAMA3, len)) return FAST_LLAMA3;
    return FAST_NONE;
}

/* ---- character kinds ---------------------------------------------------------- */

enum { K_L, K_M, K_N, K_WS, K_NL, K_O };

static uint8_t ascii_kind[128];
static pthread_once_t ascii_once = PTHREAD_ONCE_INIT;

static void ascii_init(void) {
    for (int c = 0; c < 128; c++) {
        uint8_t k = K_O;
        if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') k = K_L;
        else if (c >= '0' && c <= '9') k = K_N;
        else if (c == '\r' || c == '\n') k = K_NL;
        else if (c == ' ' || (c >= 0x09 && c <= 0x0D)) k = K_WS;
        ascii_kind[c] = k;
    }
}

static inline int kind_of(uint32_t cp) {
    if (cp < 0x80) return ascii_kind[cp];
    if (tok_is_whitespace(cp)) return K_WS; /* Oniguruma's \s: Unicode White_Space */
    switch (utf8proc_category((utf8proc_int32_t)cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO:
        return K_L;
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
        return K_M;
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
        return K_N;
    case UTF8PROC_CATEGORY_CN:
        /* Unicode 15.1: CJK Extension I (Lo), unassigned in utf8proc 2.8 */
        return cp >= 0x2EBF0 && cp <= 0x2EE5D ? K_L : K_O;
    default:
        return K_O;
    }
}

/* Kind and byte length of the char at s[i] (i < n). */
static inline int kind_at(const unsigned char *s, size_t i, int *len) {
    if (s[i] < 0x80) {
        *len = 1;
        return ascii_kind[s[i]];
    }
    uint32_t cp;
    *len = tok_utf8_dec(s + i, &cp);
    return kind_of(cp);
}

/* ---- the matcher -------------------------------------------------------------- */

typedef struct fpat {
    bool marks_are_letters; /* Qwen3.5 */
    int max_digits;
} fpat;

static inline bool is_letter(const fpat *p, int k) { return k == K_L || (p->marks_are_letters && k == K_M); }
static inline bool is_punct(const fpat *p, int k) { return k == K_O || (!p->marks_are_letters && k == K_M); }

static size_t run_while_letter(const fpat *p, const unsigned char *s, size_t n, size_t i) {
    int l;
    while (i < n && is_letter(p, kind_at(s, i, &l))) i += (size_t)l;
    return i;
}

/* (?i) 's 't 're 've 'm 'll 'd after the apostrophe at s[i]: end or 0. PCRE2
 * and Oniguruma both fold U+017F (long s) to 's'. */
static size_t contraction(const unsigned char *s, size_t n, size_t i) {
    size_t j = i + 1;
    if (j >= n) return 0;
    unsigned c = s[j] | 0x20u;
    if (s[j] < 0x80 && (c == 's' || c == 't' || c == 'm' || c == 'd')) return j + 1;
    if (s[j] == 0xC5 && j + 1 < n && s[j + 1] == 0xBF) return j + 2; /* ſ */
    if (j + 1 < n && s[j] < 0x80 && s[j + 1] < 0x80) {
        unsigned d = s[j + 1] | 0x20u;
        if ((c == 'r' && d == 'e') || (c == 'v' && d == 'e') || (c == 'l' && d == 'l')) return j + 2;
    }
    return 0;
}

/* End of the match starting at i (< n); the alternatives in pattern order. */
static size_t fast_match(const fpat *p, const unsigned char *s, size_t n, size_t i) {
    int l0;
    int k0 = kind_at(s, i, &l0);
    /* 1: contractions */
    if (s[i] == '\'') {
        size_t e = contraction(s, n, i);
        if (e) return e;
    }
    /* 2: [^\r\n\p{L}\p{N}]?L+ */
    if (is_letter(p, k0)) return run_while_letter(p, s, n, i);
    if (k0 != K_NL && k0 != K_L && k0 != K_N && i + l0 < n) {
        int l1;
        if (is_letter(p, kind_at(s, i + l0, &l1))) return run_while_letter(p, s, n, i + l0);
    }
    /* 3: \p{N}{1,D} */
    if (k0 == K_N) {
        size_t j = i + l0;
        for (int d = 1; d < p->max_digits && j < n; d++) {
            int l;
            if (kind_at(s, j, &l) != K_N) break;
            j += (size_t)l;
        }
        return j;
    }
    /* 4: ' ?[^\s\p{L}\p{N}X]+[\r\n]*' */
    {
        size_t j = i;
        int l, k = k0;
        l = l0;
        if (s[i] == ' ' && i + 1 < n) {
            k = kind_at(s, i + 1, &l);
            j = i + 1;
        }
        if (is_punct(p, k)) {
            while (j < n && is_punct(p, kind_at(s, j, &l))) j += (size_t)l;
            while (j < n && (s[j] == '\r' || s[j] == '\n')) j++;
            return j;
        }
    }
    /* k0 is white space (with or without \r \n) from here on. */
    size_t j = i, last_nl_end = 0, last_start = i;
    int nchars = 0;
    while (j < n) {
        int l;
        int k = kind_at(s, j, &l);
        if (k != K_WS && k != K_NL) break;
        last_start = j;
        j += (size_t)l;
        nchars++;
        if (k == K_NL) last_nl_end = j;
    }
    /* 5: \s*[\r\n]+ : up to the last \r or \n of the run */
    if (last_nl_end) return last_nl_end;
    /* 6: \s+(?!\S) : the run, minus its last char unless the text ends there */
    if (j == n) return n;
    if (nchars >= 2) return last_start;
    /* 7: \s+ */
    return j;
}

void tok_fast_split(int which, const char *text, size_t n, void (*piece)(void *ctx, const char *s, size_t n), void *ctx) {
    pthread_once(&ascii_once, ascii_init);
    fpat p = {.marks_are_letters = which == FAST_QWEN35, .max_digits = which == FAST_LLAMA3 ? 3 : 1};
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < n) {
        size_t e = fast_match(&p, s, n, i);
        piece(ctx, text + i, e - i);
        i = e;
    }
}
