/* token_bytes.c: tok_token_bytes, the per-id ByteLevel bytes that decode.c
 * builds (tok_build_dec_bytes), exposed for the grammar module's vocabulary
 * trie. Owns nothing. */
#include "tok/tok_internal.h"

const char *tok_token_bytes(const tokenizer *t, int32_t id, size_t *len) {
    *len = 0;
    if (id < 0 || id >= t->n_ids || !t->piece[id] || !t->dec_bytes_only || !t->dec_pool) return NULL;
    *len = t->dec_len[id];
    return t->dec_pool + t->dec_off[id];
}
