/* pretok.c: pre-tokenizers (HF `tokenizers` pre_tokenizers): Split (regex or
 * string, five delimiter behaviours, invert), ByteLevel, Digits, Punctuation,
 * Whitespace, WhitespaceSplit, Metaspace; and the regex compiler they share.
 *
 * Owns: nothing; pieces are views of the caller's text or of per-call scratch
 * buffers (prefix spaces, ByteLevel chars), streamed to a callback depth first.
 *
 * Regexes: HF compiles patterns with Oniguruma; we compile the same text with
 * PCRE2 (UTF, UCP, JIT). The two differ on a few escapes, which are rewritten
 * to Oniguruma's meaning before compiling: \s / \S (Unicode White_Space; PCRE2
 * adds U+180E), \w / \W (Alphabetic, marks, Nd, connector punctuation, joiners) and
 * \h / \H (hex digit in Oniguruma, horizontal space in PCRE2). Match iteration
 * follows the onig crate's find_iter: an empty match right after the previous
 * match is skipped by advancing one char. Known gap: PCRE2 10.42 knows Unicode
 * 14 and HF's Oniguruma Unicode 16, so \p{..} differs on characters assigned
 * since (the Qwen / Llama 3 patterns use pretok_fast.c, which knows 15.0/15.1).
 */
#include "tok/tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- regex ----------------------------------------------------------------- */

#define WS_SET "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
/* Oniguruma's Unicode \\w: Alphabetic (L, Nl, Other_Alphabetic), M, Nd, Pc, Join_Control. */
#define WORD_SET "\\p{L}\\p{M}\\p{Nd}\\p{Nl}\\p{Pc}\\x{200c}\\x{200d}\\x{24b6}-\\x{24e9}\\x{1f130}-\\x{1f149}\\x{1f150}-\\x{1f169}\\x{1f170}-\\x{1f189}"
#define HEX_SET "0-9a-fA-F"

static void translate(const char *p, size_t n, buf *o) {
    bool in_class = false;
    size_t class_start = 0;
    for (size_t i = 0; i < n;) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char d = p[i + 1];
            const char *set = d == 's' || d == 'S' ? WS_SET : d == 'w' || d == 'W' ? WORD_SET : d == 'h' || d == 'H' ? HEX_SET : NULL;
            if (set && (d == 's' || d == 'w' || d == 'h')) {
                if (in_class) buf_puts(o, set);
                else { buf_putc(o, '['); buf_puts(o, set); buf_putc(o, ']'); }
                i += 2;
                continue;
            }
            if (set && !in_class) { /* \S \W \H outside a class */
                buf_puts(o, "[^");
                buf_puts(o, set);
                buf_putc(o, ']');
                i += 2;
                continue;
            }
            if (d == 'Q') { /* \Q...\E literal run */
                const char *e = memmem(p + i + 2, n - i - 2, "\\E", 2);
                size_t end = e ? (size_t)(e - p) + 2 : n;
                buf_append(o, p + i, end - i);
                i = end;
                continue;
            }
            buf_append(o, p + i, 2);
            i += 2;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            buf_putc(o, c);
            i++;
            if (i < n && p[i] == '^') buf_putc(o, p[i++]);
            class_start = i;
            if (i < n && p[i] == ']') buf_putc(o, p[i++]); /* leading ']' is literal */
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') { /* POSIX [:name:] */
            const char *e = memmem(p + i + 2, n - i - 2, ":]", 2);
            size_t end = e ? (size_t)(e - p) + 2 : i + 1;
            buf_append(o, p + i, end - i);
            i = end;
            continue;
        }
        if (in_class && c == ']' && i > class_start) in_class = false;
        buf_putc(o, c);
        i++;
    }
}

pcre2_code *tok_regex_compile(const char *pat, size_t len, bool literal, char *why, size_t whyn) {
    buf o;
    buf_init(&o);
    if (literal) buf_append(&o, pat, len);
    else translate(pat, len, &o);
    int errc;
    PCRE2_SIZE erroff;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(o.data ? o.data : ""), o.len,
                                   literal ? PCRE2_UTF | PCRE2_LITERAL : PCRE2_UTF | PCRE2_UCP, &errc, &erroff, NULL);
    buf_free(&o);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(errc, msg, sizeof msg);
        snprintf(why, whyn, "regex does not compile (offset %zu): %s", (size_t)erroff, (char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* without JIT, pcre2_match interprets */
    return re;
}

bool tok_regex_has_jit(const pcre2_code *re) {
    size_t sz = 0;
    return pcre2_pattern_info(re, PCRE2_INFO_JITSIZE, &sz) == 0 && sz > 0;
}

/* ---- streaming split machinery ---------------------------------------------------
 * Each step turns one input piece into a sequence of (text, is_match) items in
 * order (HF Pattern::find_matches), a small state machine applies the delimiter
 * behaviour (HF NormalizedString::split) and hands every finished, non-empty
 * piece straight to the next step, depth first. Nothing is materialized, so a
 * 10 MB piece costs no more memory than a short one. */

struct tok_pre_scratch {
    int n;
    pcre2_match_data **md; /* [n] one per step: steps nest */
    buf *gen;              /* [n] text a step creates (prefix space, mapped chars) */
    buf *gen2;             /* [n] */
};

tok_pre_scratch *tok_pre_scratch_new(const tokenizer *t) {
    tok_pre_scratch *sc = xcalloc(1, sizeof *sc);
    sc->n = t->n_pre;
    sc->md = xcalloc(t->n_pre + 1, sizeof *sc->md);
    sc->gen = xcalloc(t->n_pre + 1, sizeof *sc->gen);
    sc->gen2 = xcalloc(t->n_pre + 1, sizeof *sc->gen2);
    for (int k = 0; k < t->n_pre; k++)
        if (t->pre[k].re) sc->md[k] = pcre2_match_data_create(16, NULL);
    return sc;
}

void tok_pre_scratch_free(tok_pre_scratch *sc) {
    if (!sc) return;
    for (int k = 0; k < sc->n; k++) {
        if (sc->md[k]) pcre2_match_data_free(sc->md[k]);
        buf_free(&sc->gen[k]);
        buf_free(&sc->gen2[k]);
    }
    free(sc->md);
    free(sc->gen);
    free(sc->gen2);
    free(sc);
}

typedef struct pipe {
    const tokenizer *t;
    tok_pre_scratch *sc;
    tok_word_fn fn;
    void *ctx;
} pipe_t;

static void run_step(pipe_t *p, int k, const char *s, size_t n, bool origin);

static inline void pass_down(pipe_t *p, int k, const char *s, size_t n, bool origin) {
    if (!n) return;
    if (k + 1 >= p->t->n_pre) p->fn(p->ctx, s, n);
    else run_step(p, k + 1, s, n, origin);
}

/* The delimiter-behaviour machine of one step over one input piece. */
typedef struct bm {
    pipe_t *p;
    int k, behavior;
    const char *base; /* start of the input piece (origin tracking) */
    bool origin;
    bool has;         /* a held piece */
    const char *hs;
    size_t hn;
    int hm, prev_match;
} bm;

static inline void bm_emit(bm *b, const char *s, size_t n) {
    pass_down(b->p, b->k, s, n, b->origin && s == b->base);
}

static void bm_feed(bm *b, const char *s, size_t n, int m) {
    switch (b->behavior) {
    case SPLIT_ISOLATED:
        bm_emit(b, s, n);
        return;
    case SPLIT_REMOVED:
        if (!m) bm_emit(b, s, n);
        return;
    case SPLIT_CONTIGUOUS:
        if (b->has && m == b->hm) {
            b->hn = (size_t)(s + n - b->hs);
        } else {
            if (b->has) bm_emit(b, b->hs, b->hn);
            b->has = true, b->hs = s, b->hn = n, b->hm = m;
        }
        return;
    case SPLIT_MERGED_PREV:
        if (m && !b->prev_match && b->has) {
            b->hn = (size_t)(s + n - b->hs);
        } else {
            if (b->has) bm_emit(b, b->hs, b->hn);
            b->has = true, b->hs = s, b->hn = n;
        }
        b->prev_match = m;
        return;
    case SPLIT_MERGED_NEXT:
        /* HF folds from the right: a match joins the non-match right after it. */
        if (b->has && !m) {
            bm_emit(b, b->hs, (size_t)(s + n - b->hs));
            b->has = false;
            return;
        }
        if (b->has) bm_emit(b, b->hs, b->hn);
        b->has = false;
        if (m) b->has = true, b->hs = s, b->hn = n;
        else bm_emit(b, s, n);
        return;
    }
}

static void bm_flush(bm *b) {
    if (b->has) bm_emit(b, b->hs, b->hn);
    b->has = false;
}

static inline int re_search(const pcre2_code *re, bool jit, const char *s, size_t n, size_t from, pcre2_match_data *md) {
    int rc = jit ? pcre2_jit_match(re, (PCRE2_SPTR)s, n, from, 0, md, NULL)
                 : pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) /* JIT stack exhausted and the like: interpret */
        rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
    return rc;
}

/* Regex matches of s[0..n) in order, with the gaps between them (onig find_iter). */
static void regex_feed(bm *b, const pcre2_code *re, bool jit, pcre2_match_data *md, const char *s, size_t n, bool invert) {
    size_t prev = 0, from = 0;
    long last_match_end = -1;
    while (from <= n) {
        int rc = re_search(re, jit, s, n, from, md);
        if (rc < 0) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms == me && last_match_end == (long)me) {
            if (from >= n) break;
            uint32_t cp;
            from += (size_t)tok_utf8_dec((const unsigned char *)s + from, &cp);
            continue;
        }
        from = me;
        last_match_end = (long)me;
        if (prev != ms) bm_feed(b, s + prev, ms - prev, invert);
        bm_feed(b, s + ms, me - ms, !invert);
        prev = me;
    }
    if (prev != n) bm_feed(b, s + prev, n - prev, invert);
    bm_flush(b);
}

typedef bool (*char_pred)(uint32_t cp);

/* Every char satisfying f is its own match. */
static void pred_feed(bm *b, char_pred f, const char *s, size_t n) {
    size_t last = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = tok_utf8_dec((const unsigned char *)s + i, &cp);
        if (f(cp)) {
            if (last < i) bm_feed(b, s + last, i - last, 0);
            bm_feed(b, s + i, (size_t)l, 1);
            last = i + (size_t)l;
        }
        i += (size_t)l;
    }
    if (n > last) bm_feed(b, s + last, n - last, 0);
    bm_flush(b);
}

static bool is_numeric(uint32_t cp) {
    if (cp < 0x80) return cp >= '0' && cp <= '9';
    int c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

static bool is_punct(uint32_t cp) {
    if (cp < 0x80) return (cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) || (cp >= 0x5B && cp <= 0x60) || (cp >= 0x7B && cp <= 0x7E);
    int c = utf8proc_category((utf8proc_int32_t)cp);
    return c >= UTF8PROC_CATEGORY_PC && c <= UTF8PROC_CATEGORY_PO;
}

/* ---- the steps ---------------------------------------------------------------- */

/* ByteLevel followed by more steps: they see the mapped chars. */
static void bytelevel_down(pipe_t *p, int k, const char *s, size_t n, bool origin) {
    if (!n) return;
    if (k + 1 >= p->t->n_pre) { /* last step: the model maps bytes itself */
        p->fn(p->ctx, s, n);
        return;
    }
    buf *g = &p->sc->gen2[k];
    g->len = 0;
    for (size_t i = 0; i < n; i++) {
        char tmp[4];
        int l = tok_utf8_enc(tok_byte_to_cp[(unsigned char)s[i]], tmp);
        buf_append(g, tmp, (size_t)l);
    }
    run_step(p, k + 1, g->data, g->len, origin);
}

typedef struct fast_bm { bm *b; int m; } fast_bm;

static void fast_piece(void *ctx, const char *s, size_t n) {
    fast_bm *f = ctx;
    bm_feed(f->b, s, n, f->m);
}

/* The common shape (Qwen, Llama 3, GPT-4o...): an Isolated regex Split, then
 * a plain ByteLevel as the last step: every match and gap is a word. */
static void regex_to_model(pipe_t *p, const tok_pre_step *st, pcre2_match_data *md, const char *s, size_t n) {
    size_t prev = 0, from = 0;
    long last_match_end = -1;
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
    while (from <= n) {
        int rc = re_search(st->re, st->jit, s, n, from, md);
        if (rc < 0) break;
        size_t ms = ov[0], me = ov[1];
        if (ms == me && last_match_end == (long)me) {
            if (from >= n) break;
            uint32_t cp;
            from += (size_t)tok_utf8_dec((const unsigned char *)s + from, &cp);
            continue;
        }
        from = me;
        last_match_end = (long)me;
        if (prev != ms) p->fn(p->ctx, s + prev, ms - prev);
        if (me != ms) p->fn(p->ctx, s + ms, me - ms);
        prev = me;
    }
    if (prev != n) p->fn(p->ctx, s + prev, n - prev);
}

static void run_step(pipe_t *p, int k, const char *s, size_t n, bool origin) {
    const tok_pre_step *st = &p->t->pre[k];
    bm b = {.p = p, .k = k, .behavior = st->behavior, .base = s, .origin = origin};
    switch (st->kind) {
    case PRE_SPLIT:
    case PRE_WHITESPACE:
        if (st->fast && st->to_model && st->behavior == SPLIT_ISOLATED && !st->invert) {
            tok_fast_split(st->fast, s, n, p->fn, p->ctx);
            break;
        }
        if (st->fast) { /* every piece is a match: they tile the text */
            fast_bm fb = {&b, !st->invert};
            tok_fast_split(st->fast, s, n, fast_piece, &fb);
            bm_flush(&b);
            break;
        }
        if (st->to_model && st->behavior == SPLIT_ISOLATED && !st->invert) {
            regex_to_model(p, st, p->sc->md[k], s, n);
            break;
        }
        regex_feed(&b, st->re, st->jit, p->sc->md[k], s, n, st->invert);
        break;
    case PRE_DIGITS:
        b.behavior = st->individual_digits ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS;
        pred_feed(&b, is_numeric, s, n);
        break;
    case PRE_PUNCTUATION:
        pred_feed(&b, is_punct, s, n);
        break;
    case PRE_WHITESPACE_SPLIT:
        b.behavior = SPLIT_REMOVED;
        pred_feed(&b, tok_is_whitespace, s, n);
        break;
    case PRE_BYTELEVEL: {
        if (st->add_prefix_space && (n == 0 || s[0] != ' ')) {
            buf *g = &p->sc->gen[k];
            g->len = 0;
            buf_putc(g, ' ');
            buf_append(g, s, n);
            s = g->data;
            n = g->len;
        }
        if (!st->use_regex) {
            bytelevel_down(p, k, s, n, origin);
            break;
        }
        /* Isolated split, then each piece mapped: run the regex with a
         * machine whose pieces go through bytelevel_down. */
        size_t prev = 0, from = 0;
        long last_match_end = -1;
        pcre2_match_data *md = p->sc->md[k];
        while (from <= n) {
            int rc = re_search(st->re, st->jit, s, n, from, md);
            if (rc < 0) break;
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t ms = ov[0], me = ov[1];
            if (ms == me && last_match_end == (long)me) {
                if (from >= n) break;
                uint32_t cp;
                from += (size_t)tok_utf8_dec((const unsigned char *)s + from, &cp);
                continue;
            }
            from = me;
            last_match_end = (long)me;
            if (prev != ms) bytelevel_down(p, k, s + prev, ms - prev, origin && prev == 0);
            bytelevel_down(p, k, s + ms, me - ms, origin && ms == 0);
            prev = me;
        }
        if (prev != n) bytelevel_down(p, k, s + prev, n - prev, origin && prev == 0);
        break;
    }
    case PRE_METASPACE: {
        /* ' ' -> replacement, maybe prepend it, maybe split before each. */
        size_t rl = strlen(st->replacement);
        buf *g = &p->sc->gen[k];
        g->len = 0;
        bool starts = (n >= rl && !memcmp(s, st->replacement, rl)) || (n && s[0] == ' ');
        if (!starts && (st->prepend_scheme == PREPEND_ALWAYS || (st->prepend_scheme == PREPEND_FIRST && origin)))
            buf_puts(g, st->replacement);
        for (size_t j = 0; j < n; j++) {
            if (s[j] == ' ') buf_puts(g, st->replacement);
            else buf_putc(g, s[j]);
        }
        const char *q = g->data ? g->data : "";
        size_t qn = g->len;
        if (!st->split) {
            pass_down(p, k, q, qn, origin);
            break;
        }
        b.behavior = SPLIT_MERGED_NEXT;
        b.base = q;
        size_t lastp = 0;
        for (size_t j = 0; j + rl <= qn;) {
            if (!memcmp(q + j, st->replacement, rl)) {
                if (lastp < j) bm_feed(&b, q + lastp, j - lastp, 0);
                bm_feed(&b, q + j, rl, 1);
                lastp = j + rl;
                j += rl;
            } else {
                j++;
            }
        }
        if (qn > lastp) bm_feed(&b, q + lastp, qn - lastp, 0);
        bm_flush(&b);
        break;
    }
    }
}

void tok_pretokenize(const tokenizer *t, tok_pre_scratch *sc, const char *s, size_t n, bool is_first,
                     tok_word_fn fn, void *ctx) {
    if (!n) return;
    if (!t->n_pre) {
        fn(ctx, s, n);
        return;
    }
    pipe_t p = {t, sc, fn, ctx};
    run_step(&p, 0, s, n, is_first);
}
