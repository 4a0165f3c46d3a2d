/* pretok.c: pre-tokenizers (HF `tokenizers` pre_tokenizers): Split (regex or
 * string, five delimiter behaviours, invert), ByteLevel, Digits, Punctuation,
 * Whitespace, WhitespaceSplit, Metaspace; and the regex compiler they share.
 *
 * Owns: nothing; pieces are (offset, length) spans into the caller's buffer,
 * new text (prefix spaces, ByteLevel chars) is appended to that buffer.
 *
 * Regexes: HF compiles patterns with Oniguruma; we compile the same text with
 * PCRE2 (UTF, UCP, JIT). The two differ on a few escapes, which are rewritten
 * to Oniguruma's meaning before compiling: \s / \S (Unicode White_Space; PCRE2
 * adds U+180E), \w / \W (letters, marks, numbers, connector punctuation) and
 * \h / \H (hex digit in Oniguruma, horizontal space in PCRE2). Match iteration
 * follows the onig crate's find_iter: an empty match right after the previous
 * match is skipped by advancing one char.
 */
#include "tok/tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- regex ----------------------------------------------------------------- */

#define WS_SET "\\t-\\r\\x{20}\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"
#define WORD_SET "\\p{L}\\p{M}\\p{N}\\p{Pc}"
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
                                   PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0), &errc, &erroff, NULL);
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

/* ---- spans ----------------------------------------------------------------- */

void tok_spans_push(tok_spans *s, uint32_t off, uint32_t len) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 64;
        s->v = xrealloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->n].off = off;
    s->v[s->n].len = len;
    s->n++;
}

/* Matches of one piece, (start, end, is_match) relative to the piece, in order,
 * covering it (HF Pattern::find_matches). */
typedef struct mspan { uint32_t s, e; int m; } mspan;
typedef struct mlist { mspan *v; size_t n, cap; } mlist;

static void ml_push(mlist *l, uint32_t s, uint32_t e, int m) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->v = xrealloc(l->v, l->cap * sizeof *l->v);
    }
    l->v[l->n++] = (mspan){s, e, m};
}

static int re_search(const pcre2_code *re, const char *s, size_t n, size_t from, pcre2_match_data *md) {
    int rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, md, NULL);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) /* JIT stack exhausted and the like: interpret */
        rc = pcre2_match(re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, md, NULL);
    return rc;
}

static void regex_matches(const pcre2_code *re, const char *s, size_t n, pcre2_match_data *md, mlist *out) {
    out->n = 0;
    if (n == 0) { ml_push(out, 0, 0, 0); return; }
    size_t prev = 0, from = 0;
    long last_match_end = -1;
    while (from <= n) {
        int rc = re_search(re, s, n, from, md);
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
        if (prev != ms) ml_push(out, (uint32_t)prev, (uint32_t)ms, 0);
        ml_push(out, (uint32_t)ms, (uint32_t)me, 1);
        prev = me;
    }
    if (prev != n) ml_push(out, (uint32_t)prev, (uint32_t)n, 0);
}

typedef bool (*char_pred)(uint32_t cp);

static void pred_matches(char_pred f, const char *s, size_t n, mlist *out) {
    out->n = 0;
    if (n == 0) { ml_push(out, 0, 0, 0); return; }
    size_t last = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = tok_utf8_dec((const unsigned char *)s + i, &cp);
        if (f(cp)) {
            if (last < i) ml_push(out, (uint32_t)last, (uint32_t)i, 0);
            ml_push(out, (uint32_t)i, (uint32_t)(i + l), 1);
            last = i + l;
        }
        i += (size_t)l;
    }
    if (n > last) ml_push(out, (uint32_t)last, (uint32_t)n, 0);
}

/* HF NormalizedString::split: apply the delimiter behaviour, drop empty pieces. */
static void apply_behavior(const mlist *m, int behavior, uint32_t base, tok_spans *out) {
    size_t first = out->n;
    int prev_match = 0;
    switch (behavior) {
    case SPLIT_ISOLATED:
        for (size_t i = 0; i < m->n; i++) tok_spans_push(out, base + m->v[i].s, m->v[i].e - m->v[i].s);
        break;
    case SPLIT_REMOVED:
        for (size_t i = 0; i < m->n; i++)
            if (!m->v[i].m) tok_spans_push(out, base + m->v[i].s, m->v[i].e - m->v[i].s);
        break;
    case SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < m->n; i++) {
            if (m->v[i].m == prev_match && out->n > first) out->v[out->n - 1].len = base + m->v[i].e - out->v[out->n - 1].off;
            else tok_spans_push(out, base + m->v[i].s, m->v[i].e - m->v[i].s);
            prev_match = m->v[i].m;
        }
        break;
    case SPLIT_MERGED_PREV:
        for (size_t i = 0; i < m->n; i++) {
            if (m->v[i].m && !prev_match && out->n > first) out->v[out->n - 1].len = base + m->v[i].e - out->v[out->n - 1].off;
            else tok_spans_push(out, base + m->v[i].s, m->v[i].e - m->v[i].s);
            prev_match = m->v[i].m;
        }
        break;
    case SPLIT_MERGED_NEXT: {
        /* Fold from the right: a match joins the piece after it. */
        size_t k0 = out->n;
        for (size_t i = m->n; i-- > 0;) {
            if (m->v[i].m && !prev_match && out->n > k0) {
                tok_span *l = &out->v[out->n - 1];
                uint32_t end = l->off + l->len;
                l->off = base + m->v[i].s;
                l->len = end - l->off;
            } else {
                tok_spans_push(out, base + m->v[i].s, m->v[i].e - m->v[i].s);
            }
            prev_match = m->v[i].m;
        }
        for (size_t a = k0, b = out->n; a + 1 < b; a++, b--) {
            tok_span x = out->v[a];
            out->v[a] = out->v[b - 1];
            out->v[b - 1] = x;
        }
        break;
    }
    }
    size_t k = first;
    for (size_t i = first; i < out->n; i++)
        if (out->v[i].len) out->v[k++] = out->v[i];
    out->n = k;
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

/* ---- the pre-tokenizer ------------------------------------------------------ */

static void append_mapped(buf *w, uint32_t off, uint32_t len) {
    for (uint32_t i = 0; i < len; i++) {
        char tmp[4];
        int k = tok_utf8_enc(tok_byte_to_cp[(unsigned char)w->data[off + i]], tmp);
        buf_append(w, tmp, k);
    }
}

void tok_pretokenize(const tokenizer *t, buf *w, bool is_first, tok_spans *out) {
    tok_spans a = {0}, b = {0};
    tok_spans *cur = &a, *nxt = &b;
    mlist ml = {0};
    pcre2_match_data *md = NULL;
    if (w->len) tok_spans_push(cur, 0, (uint32_t)w->len);
    for (int k = 0; k < t->n_pre; k++) {
        const tok_pre_step *st = &t->pre[k];
        bool last = k == t->n_pre - 1;
        nxt->n = 0;
        if (st->re && !md) md = pcre2_match_data_create(16, NULL);
        for (size_t i = 0; i < cur->n; i++) {
            uint32_t off = cur->v[i].off, len = cur->v[i].len;
            switch (st->kind) {
            case PRE_SPLIT:
            case PRE_WHITESPACE:
                regex_matches(st->re, w->data + off, len, md, &ml);
                if (st->invert)
                    for (size_t j = 0; j < ml.n; j++) ml.v[j].m = !ml.v[j].m;
                apply_behavior(&ml, st->behavior, off, nxt);
                break;
            case PRE_DIGITS:
                pred_matches(is_numeric, w->data + off, len, &ml);
                apply_behavior(&ml, st->individual_digits ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS, off, nxt);
                break;
            case PRE_PUNCTUATION:
                pred_matches(is_punct, w->data + off, len, &ml);
                apply_behavior(&ml, st->behavior, off, nxt);
                break;
            case PRE_WHITESPACE_SPLIT:
                pred_matches(tok_is_whitespace, w->data + off, len, &ml);
                apply_behavior(&ml, SPLIT_REMOVED, off, nxt);
                break;
            case PRE_BYTELEVEL: {
                if (st->add_prefix_space && (len == 0 || w->data[off] != ' ')) {
                    uint32_t noff = (uint32_t)w->len;
                    buf_reserve(w, (size_t)len + 1); /* w->data must not move while copying from it */
                    buf_putc(w, ' ');
                    buf_append(w, w->data + off, len);
                    off = noff;
                    len++;
                }
                size_t from = nxt->n;
                if (st->use_regex) {
                    regex_matches(st->re, w->data + off, len, md, &ml);
                    apply_behavior(&ml, SPLIT_ISOLATED, off, nxt);
                } else if (len) {
                    tok_spans_push(nxt, off, len);
                }
                if (!last) /* later steps see the mapped chars */
                    for (size_t j = from; j < nxt->n; j++) {
                        uint32_t noff = (uint32_t)w->len;
                        append_mapped(w, nxt->v[j].off, nxt->v[j].len);
                        nxt->v[j].off = noff;
                        nxt->v[j].len = (uint32_t)(w->len - noff);
                    }
                break;
            }
            case PRE_METASPACE: {
                /* ' ' -> replacement, maybe prepend it, maybe split before each. */
                size_t rl = strlen(st->replacement);
                uint32_t noff = (uint32_t)w->len;
                bool starts = len >= rl && !memcmp(w->data + off, st->replacement, rl);
                /* a leading ' ' becomes the replacement too */
                bool starts_space = len && w->data[off] == ' ';
                bool origin = is_first && off == 0;
                if (!starts && !starts_space &&
                    (st->prepend_scheme == PREPEND_ALWAYS || (st->prepend_scheme == PREPEND_FIRST && origin)))
                    buf_puts(w, st->replacement);
                for (uint32_t j = 0; j < len; j++) {
                    if (w->data[off + j] == ' ') buf_puts(w, st->replacement);
                    else buf_putc(w, w->data[off + j]);
                }
                uint32_t nlen = (uint32_t)(w->len - noff);
                if (st->split) {
                    mlist mm = {0};
                    const char *s = w->data + noff;
                    size_t lastp = 0;
                    for (size_t j = 0; j + rl <= nlen;) {
                        if (!memcmp(s + j, st->replacement, rl)) {
                            if (lastp < j) ml_push(&mm, (uint32_t)lastp, (uint32_t)j, 0);
                            ml_push(&mm, (uint32_t)j, (uint32_t)(j + rl), 1);
                            lastp = j + rl;
                            j += rl;
                        } else {
                            j++;
                        }
                    }
                    if (nlen > lastp) ml_push(&mm, (uint32_t)lastp, nlen, 0);
                    apply_behavior(&mm, SPLIT_MERGED_NEXT, noff, nxt);
                    free(mm.v);
                } else if (nlen) {
                    tok_spans_push(nxt, noff, nlen);
                }
                break;
            }
            }
        }
        tok_spans *tmp = cur;
        cur = nxt;
        nxt = tmp;
    }
    out->n = 0;
    for (size_t i = 0; i < cur->n; i++) tok_spans_push(out, cur->v[i].off, cur->v[i].len);
    free(a.v);
    free(b.v);
    free(ml.v);
    if (md) pcre2_match_data_free(md);
}
