/* decode.c: ids -> text (HF `tokenizers` Tokenizer::decode), and the UTF-8
 * helpers of the tokenizer module.
 *
 * Owns: the GPT-2 byte <-> char table (const), each tokenizer's per-id
 * ByteLevel bytes (built at load).
 * The common decoder, ByteLevel alone, is a pure byte concatenation followed by
 * String::from_utf8_lossy, so it runs over precomputed per-id bytes. Other
 * decoder chains (Replace, ByteFallback, Fuse, Strip, Metaspace, ByteLevel in
 * a Sequence) run HF's decode_chain steps over a list of strings.
 */
#include "tok/tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- UTF-8 ------------------------------------------------------------------- */

/* GPT-2 bytes_to_unicode(): printable bytes map to themselves, the others to 256 + k. */
const uint16_t tok_byte_to_cp[256] = {
    0x100, 0x101, 0x102, 0x103, 0x104, 0x105, 0x106, 0x107, 0x108, 0x109, 0x10a, 0x10b, 0x10c, 0x10d, 0x10e, 0x10f,
    0x110, 0x111, 0x112, 0x113, 0x114, 0x115, 0x116, 0x117, 0x118, 0x119, 0x11a, 0x11b, 0x11c, 0x11d, 0x11e, 0x11f,
    0x120, 0x021, 0x022, 0x023, 0x024, 0x025, 0x026, 0x027, 0x028, 0x029, 0x02a, 0x02b, 0x02c, 0x02d, 0x02e, 0x02f,
    0x030, 0x031, 0x032, 0x033, 0x034, 0x035, 0x036, 0x037, 0x038, 0x039, 0x03a, 0x03b, 0x03c, 0x03d, 0x03e, 0x03f,
    0x040, 0x041, 0x042, 0x043, 0x044, 0x045, 0x046, 0x047, 0x048, 0x049, 0x04a, 0x04b, 0x04c, 0x04d, 0x04e, 0x04f,
    0x050, 0x051, 0x052, 0x053, 0x054, 0x055, 0x056, 0x057, 0x058, 0x059, 0x05a, 0x05b, 0x05c, 0x05d, 0x05e, 0x05f,
    0x060, 0x061, 0x062, 0x063, 0x064, 0x065, 0x066, 0x067, 0x068, 0x069, 0x06a, 0x06b, 0x06c, 0x06d, 0x06e, 0x06f,
    0x070, 0x071, 0x072, 0x073, 0x074, 0x075, 0x076, 0x077, 0x078, 0x079, 0x07a, 0x07b, 0x07c, 0x07d, 0x07e, 0x121,
    0x122, 0x123, 0x124, 0x125, 0x126, 0x127, 0x128, 0x129, 0x12a, 0x12b, 0x12c, 0x12d, 0x12e, 0x12f, 0x130, 0x131,
    0x132, 0x133, 0x134, 0x135, 0x136, 0x137, 0x138, 0x139, 0x13a, 0x13b, 0x13c, 0x13d, 0x13e, 0x13f, 0x140, 0x141,
    0x142, 0x0a1, 0x0a2, 0x0a3, 0x0a4, 0x0a5, 0x0a6, 0x0a7, 0x0a8, 0x0a9, 0x0aa, 0x0ab, 0x0ac, 0x143, 0x0ae, 0x0af,
    0x0b0, 0x0b1, 0x0b2, 0x0b3, 0x0b4, 0x0b5, 0x0b6, 0x0b7, 0x0b8, 0x0b9, 0x0ba, 0x0bb, 0x0bc, 0x0bd, 0x0be, 0x0bf,
    0x0c0, 0x0c1, 0x0c2, 0x0c3, 0x0c4, 0x0c5, 0x0c6, 0x0c7, 0x0c8, 0x0c9, 0x0ca, 0x0cb, 0x0cc, 0x0cd, 0x0ce, 0x0cf,
    0x0d0, 0x0d1, 0x0d2, 0x0d3, 0x0d4, 0x0d5, 0x0d6, 0x0d7, 0x0d8, 0x0d9, 0x0da, 0x0db, 0x0dc, 0x0dd, 0x0de, 0x0df,
    0x0e0, 0x0e1, 0x0e2, 0x0e3, 0x0e4, 0x0e5, 0x0e6, 0x0e7, 0x0e8, 0x0e9, 0x0ea, 0x0eb, 0x0ec, 0x0ed, 0x0ee, 0x0ef,
    0x0f0, 0x0f1, 0x0f2, 0x0f3, 0x0f4, 0x0f5, 0x0f6, 0x0f7, 0x0f8, 0x0f9, 0x0fa, 0x0fb, 0x0fc, 0x0fd, 0x0fe, 0x0ff,
};

int tok_cp_to_byte(uint32_t cp) {
    if ((cp >= 0x21 && cp <= 0x7e) || (cp >= 0xa1 && cp <= 0xac) || (cp >= 0xae && cp <= 0xff)) return (int)cp;
    if (cp >= 0x100 && cp <= 0x143) {
        /* 256 + k is the k-th byte (ascending) outside the printable ranges. */
        int k = (int)(cp - 0x100);
        for (int b = 0; b < 256; b++)
            if (tok_byte_to_cp[b] >= 0x100 && k-- == 0) return b;
    }
    return -1;
}

int tok_utf8_dec(const unsigned char *s, uint32_t *cp) {
    unsigned char c = s[0];
    if (c < 0x80) { *cp = c; return 1; }
    if (c < 0xE0) { *cp = (uint32_t)(c & 0x1F) << 6 | (s[1] & 0x3F); return 2; }
    if (c < 0xF0) { *cp = (uint32_t)(c & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F); return 3; }
    *cp = (uint32_t)(c & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 | (s[3] & 0x3F);
    return 4;
}

int tok_utf8_enc(uint32_t cp, char *o) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the valid UTF-8 sequence at s[0..n): > 0 valid char of that length;
 * 0: s holds the valid beginning of a char but ends early (*got bytes of it);
 * < 0: -(number of bytes forming one invalid sequence: the maximal valid prefix, or 1). */
static int utf8_step(const unsigned char *s, size_t n, size_t *got) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    int w;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) w = 2;
    else if (c >= 0xE0 && c <= 0xEF) { w = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { w = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else return -1;
    for (int k = 1; k < w; k++) {
        if ((size_t)k >= n) { *got = (size_t)k; return 0; }
        unsigned char b = s[k];
        if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return -k;
    }
    return w;
}

size_t tok_utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, got;
    while (i < n) {
        if (i + 8 <= n) { /* 8 ASCII bytes at a time */
            uint64_t v;
            memcpy(&v, u + i, 8);
            if (!(v & 0x8080808080808080ull)) { i += 8; continue; }
        }
        if (u[i] < 0x80) { i++; continue; }
        int r = utf8_step(u + i, n - i, &got);
        if (r <= 0) return i;
        i += (size_t)r;
    }
    return n;
}

void tok_utf8_lossy(buf *out, const char *s, size_t n, size_t *hold) {
    static const char repl[] = "\xEF\xBF\xBD";
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0, got = 0;
    if (hold) *hold = 0;
    while (i < n) {
        if (u[i] < 0x80) { i++; continue; }
        int r = utf8_step(u + i, n - i, &got);
        if (r > 0) { i += (size_t)r; continue; }
        buf_append(out, s + run, i - run);
        if (r == 0 && hold) { *hold = got; return; }
        buf_append(out, repl, 3);
        i += r == 0 ? got : (size_t)-r;
        run = i;
    }
    buf_append(out, s + run, n - run);
}

bool tok_is_whitespace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* The regex crate's Unicode \w, which HF uses for single_word: Alphabetic
 * (letters, Nl, Other_Alphabetic), marks, Nd, Pc and the joiners. */
bool tok_is_word_char(uint32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || c == '_';
    if (c == 0x200C || c == 0x200D || (c >= 0x24B6 && c <= 0x24E9) || (c >= 0x1F130 && c <= 0x1F149) ||
        (c >= 0x1F150 && c <= 0x1F169) || (c >= 0x1F170 && c <= 0x1F189))
        return true;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return false;
    }
}

/* ---- per-id ByteLevel bytes ----------------------------------------------------- */

/* HF ByteLevel decoder per token: every char through the inverse byte table;
 * a token with any char outside the table contributes its own UTF-8 bytes. */
static void bytelevel_token(const char *p, size_t n, buf *out) {
    size_t mark = out->len;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += tok_utf8_dec((const unsigned char *)p + i, &cp);
        int b = tok_cp_to_byte(cp);
        if (b < 0) {
            out->len = mark;
            buf_append(out, p, n);
            return;
        }
        buf_putc(out, (char)b);
    }
}

void tok_build_dec_bytes(tokenizer *t) {
    buf pool;
    buf_init(&pool);
    t->dec_off = xcalloc(t->n_ids, sizeof *t->dec_off);
    t->dec_len = xcalloc(t->n_ids, sizeof *t->dec_len);
    for (int32_t id = 0; id < t->n_ids; id++) {
        if (!t->piece[id]) continue;
        size_t o = pool.len;
        bytelevel_token(t->piece[id], t->piece_len[id], &pool);
        t->dec_off[id] = (uint32_t)o;
        t->dec_len[id] = (uint32_t)(pool.len - o);
    }
    t->dec_pool = buf_detach(&pool);
}

/* ---- decoder chains -------------------------------------------------------------- */

typedef struct strv { buf *v; size_t n, cap; } strv;

static void strv_push(strv *s, const char *p, size_t n) {
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 16;
        s->v = xrealloc(s->v, s->cap * sizeof *s->v);
    }
    buf_init(&s->v[s->n]);
    buf_append(&s->v[s->n], p, n);
    s->n++;
}

static void strv_free(strv *s) {
    for (size_t i = 0; i < s->n; i++) buf_free(&s->v[i]);
    free(s->v);
    memset(s, 0, sizeof *s);
}

static size_t utf8_count(const char *p, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)p[i] & 0xC0) != 0x80;
    return c;
}

static void replace_all(const tok_dec_step *d, const buf *in, buf *out) {
    if (d->re) {
        PCRE2_SIZE olen = in->len * 2 + d->blen * 4 + 64;
        for (;;) {
            char *o = xmalloc(olen + 1);
            PCRE2_SIZE got = olen;
            int rc = pcre2_substitute(d->re, (PCRE2_SPTR)in->data, in->len, 0,
                                      PCRE2_SUBSTITUTE_GLOBAL | PCRE2_SUBSTITUTE_LITERAL | PCRE2_SUBSTITUTE_OVERFLOW_LENGTH,
                                      NULL, NULL, (PCRE2_SPTR)d->b, d->blen, (PCRE2_UCHAR *)o, &got);
            if (rc == PCRE2_ERROR_NOMEMORY) { free(o); olen = got; continue; }
            if (rc >= 0) buf_append(out, o, got);
            else buf_append(out, in->data, in->len);
            free(o);
            return;
        }
    }
    size_t i = 0;
    while (d->alen && i + d->alen <= in->len) {
        const char *hit = memmem(in->data + i, in->len - i, d->a, d->alen);
        if (!hit) break;
        size_t k = (size_t)(hit - in->data);
        buf_append(out, in->data + i, k - i);
        buf_append(out, d->b, d->blen);
        i = k + d->alen;
    }
    buf_append(out, in->data + i, in->len - i);
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static void dec_step(const tok_dec_step *d, strv *in, strv *out) {
    switch (d->kind) {
    case DEC_BYTELEVEL: {
        buf all, txt;
        buf_init(&all);
        buf_init(&txt);
        for (size_t i = 0; i < in->n; i++) bytelevel_token(in->v[i].data, in->v[i].len, &all);
        tok_utf8_lossy(&txt, all.data ? all.data : "", all.len, NULL);
        strv_push(out, txt.data ? txt.data : "", txt.len);
        buf_free(&all);
        buf_free(&txt);
        break;
    }
    case DEC_REPLACE:
        for (size_t i = 0; i < in->n; i++) {
            buf o;
            buf_init(&o);
            replace_all(d, &in->v[i], &o);
            strv_push(out, o.data ? o.data : "", o.len);
            buf_free(&o);
        }
        break;
    case DEC_BYTEFALLBACK: {
        buf bytes;
        buf_init(&bytes);
        for (size_t i = 0; i <= in->n; i++) {
            const buf *tk = i < in->n ? &in->v[i] : NULL;
            if (tk && tk->len == 6 && !memcmp(tk->data, "<0x", 3) && tk->data[5] == '>' &&
                hexval(tk->data[3]) >= 0 && hexval(tk->data[4]) >= 0) {
                buf_putc(&bytes, (char)(hexval(tk->data[3]) * 16 + hexval(tk->data[4])));
                continue;
            }
            if (bytes.len) {
                if (tok_utf8_valid(bytes.data, bytes.len) == bytes.len) strv_push(out, bytes.data, bytes.len);
                else for (size_t k = 0; k < bytes.len; k++) strv_push(out, "\xEF\xBF\xBD", 3);
                bytes.len = 0;
            }
            if (tk) strv_push(out, tk->data ? tk->data : "", tk->len);
        }
        buf_free(&bytes);
        break;
    }
    case DEC_FUSE: {
        buf all;
        buf_init(&all);
        for (size_t i = 0; i < in->n; i++) buf_append(&all, in->v[i].data, in->v[i].len);
        strv_push(out, all.data ? all.data : "", all.len);
        buf_free(&all);
        break;
    }
    case DEC_STRIP:
        /* HF Strip: cut up to `start` leading and `stop` trailing `content` chars,
         * then take (byte length - cuts) chars, exactly as its Rust does. */
        for (size_t i = 0; i < in->n; i++) {
            const char *p = in->v[i].data ? in->v[i].data : "";
            size_t n = in->v[i].len, nchars = utf8_count(p, n);
            size_t scut = 0, ecut = 0, pos = 0;
            while (scut < (size_t)d->start && pos < n && n - pos >= d->alen && !memcmp(p + pos, d->a, d->alen)) {
                scut++;
                pos += d->alen;
            }
            size_t end = n;
            while (ecut < (size_t)d->stop && end >= d->alen && !memcmp(p + end - d->alen, d->a, d->alen)) {
                ecut++;
                end -= d->alen;
            }
            if (scut + ecut > nchars) ecut = nchars - scut;
            size_t take = n - scut - ecut, have = nchars - scut;
            if (take > have) take = have;
            size_t q = pos;
            for (size_t k = 0; k < take; k++) {
                uint32_t cp;
                q += tok_utf8_dec((const unsigned char *)p + q, &cp);
            }
            strv_push(out, p + pos, q - pos);
        }
        break;
    case DEC_METASPACE:
        for (size_t i = 0; i < in->n; i++) {
            buf o;
            buf_init(&o);
            const char *p = in->v[i].data ? in->v[i].data : "";
            size_t n = in->v[i].len;
            for (size_t k = 0; k < n;) {
                if (d->alen && k + d->alen <= n && !memcmp(p + k, d->a, d->alen)) {
                    /* HF drops every replacement char of the first token (prepend_scheme != never) */
                    if (!(i == 0 && d->prepend_scheme != PREPEND_NEVER)) buf_putc(&o, ' ');
                    k += d->alen;
                } else {
                    buf_putc(&o, p[k++]);
                }
            }
            strv_push(out, o.data ? o.data : "", o.len);
            buf_free(&o);
        }
        break;
    }
}

/* ---- tok_decode ------------------------------------------------------------------ */

static bool keep_id(const tokenizer *t, int32_t id, int skip_special) {
    if (id < 0 || id >= t->n_ids || !t->piece[id]) return false;
    return !(skip_special && (t->flags[id] & TOKF_SPECIAL));
}

char *tok_decode(const tokenizer *t, const int32_t *ids, int n, int skip_special) {
    return tok_decode_n(t, ids, n, skip_special, NULL);
}

char *tok_decode_n(const tokenizer *t, const int32_t *ids, int n, int skip_special, size_t *len) {
    buf out;
    buf_init(&out);
    if (t->dec_bytes_only) {
        buf bytes;
        buf_init(&bytes);
        for (int i = 0; i < n; i++)
            if (keep_id(t, ids[i], skip_special)) buf_append(&bytes, t->dec_pool + t->dec_off[ids[i]], t->dec_len[ids[i]]);
        tok_utf8_lossy(&out, bytes.data ? bytes.data : "", bytes.len, NULL);
        buf_free(&bytes);
    } else {
        strv cur = {0};
        for (int i = 0; i < n; i++)
            if (keep_id(t, ids[i], skip_special)) strv_push(&cur, t->piece[ids[i]], t->piece_len[ids[i]]);
        if (!t->has_decoder) {
            for (size_t i = 0; i < cur.n; i++) {
                if (i) buf_putc(&out, ' ');
                buf_append(&out, cur.v[i].data, cur.v[i].len);
            }
        } else {
            for (int s = 0; s < t->n_dec; s++) {
                strv next = {0};
                dec_step(&t->dec[s], &cur, &next);
                strv_free(&cur);
                cur = next;
            }
            for (size_t i = 0; i < cur.n; i++) buf_append(&out, cur.v[i].data, cur.v[i].len);
        }
        strv_free(&cur);
    }
    if (len) *len = out.len;
    return buf_detach(&out);
}
