/* normalize.c: the normalizers of tokenizer.json (HF `tokenizers`
 * normalizers): NFC, NFD, NFKC, NFKD, Lowercase, Replace, Prepend, Strip,
 * StripAccents, applied in order (a Sequence is flattened at load).
 *
 * Owns: nothing; pure functions of the tokenizer's steps.
 * NFC fast path: text is cut at characters that are certainly composition
 * boundaries (ccc 0, never the second of a composition pair, not a Hangul
 * jamo, and NFC-stable: no canonical decomposition or one that recomposes;
 * everything below U+0300 qualifies). Text made only of such characters is
 * returned as it is. Only the stretches
 * holding another character go through utf8proc, so ASCII, CJK and most
 * scripts are copied as they are. NFC of the whole equals the concatenation
 * of NFC of stretches that start at such boundaries.
 */
#include "tok/tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* Canonically decomposable BMP chars that NFC leaves as they are (NFC_QC=Yes:
 * é, й, ά ...), found once by asking utf8proc; one bit per code point. */
static uint8_t nfc_stable_bits[0x10000 / 8];
static pthread_once_t nfc_stable_once = PTHREAD_ONCE_INIT;

static void nfc_stable_init(void) {
    for (uint32_t cp = 0x300; cp < 0x10000; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
        if (p->decomp_seqindex == UINT16_MAX || p->decomp_type != 0) continue; /* none or compatibility only */
        char one[4];
        int n = tok_utf8_enc(cp, one);
        utf8proc_uint8_t *dst = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)one, n, &dst, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (r == n && !memcmp(dst, one, (size_t)n)) nfc_stable_bits[cp >> 3] |= (uint8_t)(1u << (cp & 7));
        free(dst);
    }
}

/* A composition boundary before cp (ICU's hasCompBoundaryBefore, conservatively):
 * ccc 0, never the second char of a composition, and NFC maps it to itself. */
static bool nfc_boundary(uint32_t cp) {
    if (cp < 0x300) return true;
    /* Hangul: only V (U+1161..1175) and T (U+11A8..11C2) jamo compose with what
     * precedes them. U+11A7 must stay a boundary: utf8proc 2.8 wrongly composes
     * LV + U+11A7 and drops the jamo. */
    if ((cp >= 0x1161 && cp <= 0x1175) || (cp >= 0x11A8 && cp <= 0x11C2)) return false;
    if (cp >= 0x1100 && cp <= 0x11FF) return true;
    const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)cp);
    if (p->combining_class != 0) return false;
    /* utf8proc 2.8: comb_index >= 0x8000 marks the second char of a composition. */
    if (p->comb_index != UINT16_MAX && p->comb_index >= 0x8000) return false;
    if (p->decomp_seqindex == UINT16_MAX || p->decomp_type != 0) return true;
    return cp < 0x10000 && (nfc_stable_bits[cp >> 3] >> (cp & 7) & 1);
}

static void map_one(const char *s, size_t n, int opts, buf *out);

/* utf8proc 2.8 composes an LV syllable with a following U+11A7 (TBase, not a
 * trailing consonant) and drops the jamo. U+11A7 never composes with anything,
 * so composing forms run separately on the stretches that start at it. */
static void map_with(const char *s, size_t n, int opts, buf *out) {
    static const char tbase[] = "\xE1\x86\xA7";
    if (opts & UTF8PROC_COMPOSE) {
        size_t i = 0, from = 0; /* the stretch being built starts at i */
        const char *hit;
        while (from < n && (hit = memmem(s + from, n - from, tbase, 3))) {
            size_t k = (size_t)(hit - s);
            if (k > i) {
                map_one(s + i, k - i, opts, out);
                i = k;
            }
            from = k + 3;
        }
        map_one(s + i, n - i, opts, out);
        return;
    }
    map_one(s, n, opts, out);
}

static void map_one(const char *s, size_t n, int opts, buf *out) {
    if (!n) return;
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &dst, (utf8proc_option_t)opts);
    if (r < 0) {
        buf_append(out, s, n); /* unreachable for valid UTF-8 */
    } else {
        buf_append(out, dst, (size_t)r);
    }
    free(dst);
}

static void nfc(const char *s, size_t n, buf *out) {
    const unsigned char *u = (const unsigned char *)s;
    size_t seg = 0, i = 0, copied = 0; /* seg: start of the current stretch (a boundary) */
    bool dirty = false;
    while (i < n) {
        if (u[i] < 0x80) {
            if (dirty) {
                map_with(s + seg, i - seg, UTF8PROC_STABLE | UTF8PROC_COMPOSE, out);
                copied = i;
                dirty = false;
            }
            seg = i++;
            continue;
        }
        uint32_t cp;
        int l = tok_utf8_dec(u + i, &cp);
        if (nfc_boundary(cp)) {
            if (dirty) {
                map_with(s + seg, i - seg, UTF8PROC_STABLE | UTF8PROC_COMPOSE, out);
                copied = i;
                dirty = false;
            }
            seg = i;
        } else if (!dirty) {
            buf_append(out, s + copied, seg - copied);
            copied = seg;
            dirty = true;
        }
        i += (size_t)l;
    }
    if (dirty) {
        map_with(s + seg, n - seg, UTF8PROC_STABLE | UTF8PROC_COMPOSE, out);
    } else {
        buf_append(out, s + copied, n - copied);
    }
}

static void lowercase(const char *s, size_t n, buf *out) {
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x80) {
            buf_putc(out, (char)(c >= 'A' && c <= 'Z' ? c + 32 : c));
            i++;
            continue;
        }
        uint32_t cp;
        i += tok_utf8_dec((const unsigned char *)s + i, &cp);
        char tmp[8];
        if (cp == 0x130) { /* Rust: 'İ'.to_lowercase() == "i\u{307}" */
            buf_append(out, "i\xCC\x87", 3);
            continue;
        }
        int k = tok_utf8_enc((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), tmp);
        buf_append(out, tmp, k);
    }
}

static void replace(const tok_norm_step *st, const char *s, size_t n, buf *out) {
    if (st->re) {
        PCRE2_SIZE olen = n * 2 + st->blen * 4 + 64;
        for (;;) {
            char *o = xmalloc(olen + 1);
            PCRE2_SIZE got = olen;
            int rc = pcre2_substitute(st->re, (PCRE2_SPTR)s, n, 0,
                                      PCRE2_SUBSTITUTE_GLOBAL | PCRE2_SUBSTITUTE_LITERAL | PCRE2_SUBSTITUTE_OVERFLOW_LENGTH,
                                      NULL, NULL, (PCRE2_SPTR)st->b, st->blen, (PCRE2_UCHAR *)o, &got);
            if (rc == PCRE2_ERROR_NOMEMORY) { free(o); olen = got; continue; }
            if (rc >= 0) buf_append(out, o, got);
            else buf_append(out, s, n);
            free(o);
            return;
        }
    }
    size_t i = 0;
    while (st->alen && i + st->alen <= n) {
        const char *hit = memmem(s + i, n - i, st->a, st->alen);
        if (!hit) break;
        size_t k = (size_t)(hit - s);
        buf_append(out, s + i, k - i);
        buf_append(out, st->b, st->blen);
        i = k + st->alen;
    }
    buf_append(out, s + i, n - i);
}

static void strip(const tok_norm_step *st, const char *s, size_t n, buf *out) {
    size_t a = 0, b = n;
    if (st->left) {
        while (a < b) {
            uint32_t cp;
            int l = tok_utf8_dec((const unsigned char *)s + a, &cp);
            if (!tok_is_whitespace(cp)) break;
            a += (size_t)l;
        }
    }
    if (st->right) {
        while (b > a) {
            size_t p = b - 1;
            while (p > a && ((unsigned char)s[p] & 0xC0) == 0x80) p--;
            uint32_t cp;
            tok_utf8_dec((const unsigned char *)s + p, &cp);
            if (!tok_is_whitespace(cp)) break;
            b = p;
        }
    }
    buf_append(out, s + a, b - a);
}

static void strip_accents(const char *s, size_t n, buf *out) {
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = tok_utf8_dec((const unsigned char *)s + i, &cp);
        int c = cp < 0x300 ? UTF8PROC_CATEGORY_LL : utf8proc_category((utf8proc_int32_t)cp);
        if (c != UTF8PROC_CATEGORY_MN && c != UTF8PROC_CATEGORY_MC && c != UTF8PROC_CATEGORY_ME) buf_append(out, s + i, (size_t)l);
        i += (size_t)l;
    }
}

/* True when NFC leaves s unchanged for certain (every char a boundary). */
static bool nfc_clean(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        if (i + 8 <= n) {
            uint64_t v;
            memcpy(&v, u + i, 8);
            if (!(v & 0x8080808080808080ull)) { i += 8; continue; }
        }
        if (u[i] < 0x80) { i++; continue; }
        uint32_t cp;
        i += (size_t)tok_utf8_dec(u + i, &cp);
        if (!nfc_boundary(cp)) return false;
    }
    return true;
}

const char *tok_normalize(const tokenizer *t, const char *s, size_t n, buf *out, size_t *outn) {
    pthread_once(&nfc_stable_once, nfc_stable_init);
    if (t->n_norm == 1 && t->norm[0].kind == NORM_NFC && nfc_clean(s, n)) {
        *outn = n;
        return s;
    }
    buf tmp;
    buf_init(&tmp);
    out->len = 0;
    buf_append(out, s, n);
    for (int k = 0; k < t->n_norm; k++) {
        const tok_norm_step *st = &t->norm[k];
        tmp.len = 0;
        buf_reserve(&tmp, out->len);
        switch (st->kind) {
        case NORM_NFC: nfc(out->data, out->len, &tmp); break;
        case NORM_NFD: map_with(out->data, out->len, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE, &tmp); break;
        case NORM_NFKC: map_with(out->data, out->len, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT, &tmp); break;
        case NORM_NFKD: map_with(out->data, out->len, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, &tmp); break;
        case NORM_LOWERCASE: lowercase(out->data, out->len, &tmp); break;
        case NORM_REPLACE: replace(st, out->data, out->len, &tmp); break;
        case NORM_PREPEND:
            if (out->len) buf_append(&tmp, st->a, st->alen);
            buf_append(&tmp, out->data, out->len);
            break;
        case NORM_STRIP: strip(st, out->data, out->len, &tmp); break;
        case NORM_STRIP_ACCENTS: strip_accents(out->data, out->len, &tmp); break;
        }
        buf t2 = *out;
        *out = tmp;
        tmp = t2;
    }
    buf_free(&tmp);
    *outn = out->len;
    return out->data;
}
