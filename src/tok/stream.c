/* stream.c: the streaming detokenizer (tok_stream_*): ids in, text deltas out.
 *
 * Owns: each stream's pending bytes / ids and the text already emitted.
 * Invariant: the deltas (pushes, then finish) concatenate to exactly
 * tok_decode(all ids pushed), and no delta ends inside a UTF-8 character.
 *
 * ByteLevel decoders (every HF byte-level BPE): decoding is "concatenate each
 * id's bytes, then String::from_utf8_lossy", so the stream keeps only the bytes
 * of a possibly unfinished character; every complete character, and every
 * byte run that can no longer become valid (-> U+FFFD), is final at once.
 * Other decoder chains are re-decoded in full at each push and the new text
 * after the emitted prefix is released, minus trailing U+FFFD which a later
 * byte token may still complete, and minus a trailing run of "<0xXX>" tokens
 * when the chain has ByteFallback (HF decodes such a run as a whole). This
 * costs O(n) per push; every byte-level BPE takes the ByteLevel path.
 */
#include "tok/tok_internal.h"

#include <stdlib.h>
#include <string.h>

struct tok_stream {
    const tokenizer *t;
    int skip_special;
    buf pending;        /* ByteLevel: bytes of an unfinished character */
    int32_t *ids;       /* other decoders: every id so far */
    size_t n, cap;
    size_t emitted;     /* other decoders: bytes of text released */
};

tok_stream *tok_stream_new(const tokenizer *t, int skip_special) {
    tok_stream *s = xcalloc(1, sizeof *s);
    s->t = t;
    s->skip_special = skip_special;
    buf_init(&s->pending);
    return s;
}

void tok_stream_free(tok_stream *s) {
    if (!s) return;
    buf_free(&s->pending);
    free(s->ids);
    free(s);
}

static bool hexd(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

/* A "<0xXX>" token, which HF's ByteFallback decoder groups with its neighbours. */
static bool byte_token(const tokenizer *t, int32_t id) {
    if (id < 0 || id >= t->n_ids || !t->piece[id] || t->piece_len[id] != 6) return false;
    const char *p = t->piece[id];
    return !memcmp(p, "<0x", 3) && hexd(p[3]) && hexd(p[4]) && p[5] == '>';
}

static char *generic_delta(tok_stream *s, bool final, size_t *dlen) {
    const tokenizer *t = s->t;
    size_t upto = s->n;
    if (!final) {
        /* ByteFallback decodes a run of byte tokens as a whole (valid UTF-8, or one
         * U+FFFD per byte), so text from a run still growing is not final. */
        bool fallback = false;
        for (int k = 0; k < t->n_dec; k++) fallback |= t->dec[k].kind == DEC_BYTEFALLBACK;
        if (fallback)
            while (upto > 0 && byte_token(t, s->ids[upto - 1]) &&
                   !(s->skip_special && (t->flags[s->ids[upto - 1]] & TOKF_SPECIAL)))
                upto--;
    }
    size_t len;
    char *full = tok_decode_n(t, s->ids, (int)upto, s->skip_special, &len);
    size_t end = len;
    if (!final) /* a trailing U+FFFD may be an unfinished character */
        while (end >= s->emitted + 3 && !memcmp(full + end - 3, "\xEF\xBF\xBD", 3)) end -= 3;
    buf d;
    buf_init(&d);
    if (end > s->emitted) {
        buf_append(&d, full + s->emitted, end - s->emitted);
        s->emitted = end;
    }
    free(full);
    if (dlen) *dlen = d.len;
    return buf_detach(&d);
}

char *tok_stream_push(tok_stream *s, int32_t id) { return tok_stream_push_n(s, id, NULL); }
char *tok_stream_finish(tok_stream *s) { return tok_stream_finish_n(s, NULL); }

char *tok_stream_push_n(tok_stream *s, int32_t id, size_t *len) {
    const tokenizer *t = s->t;
    if (!t->dec_bytes_only) {
        if (s->n == s->cap) {
            s->cap = s->cap ? s->cap * 2 : 64;
            s->ids = xrealloc(s->ids, s->cap * sizeof *s->ids);
        }
        s->ids[s->n++] = id;
        return generic_delta(s, false, len);
    }
    buf d;
    buf_init(&d);
    bool keep = id >= 0 && id < t->n_ids && t->piece[id] && !(s->skip_special && (t->flags[id] & TOKF_SPECIAL));
    if (keep) {
        buf_append(&s->pending, t->dec_pool + t->dec_off[id], t->dec_len[id]);
        size_t hold = 0;
        tok_utf8_lossy(&d, s->pending.data, s->pending.len, &hold);
        memmove(s->pending.data, s->pending.data + s->pending.len - hold, hold);
        s->pending.len = hold;
    }
    if (len) *len = d.len;
    return buf_detach(&d);
}

char *tok_stream_finish_n(tok_stream *s, size_t *len) {
    if (!s->t->dec_bytes_only) return generic_delta(s, true, len);
    buf d;
    buf_init(&d);
    tok_utf8_lossy(&d, s->pending.data ? s->pending.data : "", s->pending.len, NULL);
    s->pending.len = 0;
    if (len) *len = d.len;
    return buf_detach(&d);
}
