/* tok.h: byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json,
 * and the streaming detokenizer. Output matches HF `tokenizers` exactly:
 * encode(text, add_special_tokens=False) and decode(ids, skip_special_tokens).
 *
 * A tokenizer is immutable after loading and safe to use from many threads
 * (the word cache is internally locked, in shards).
 */
#ifndef LS_TOK_H
#define LS_TOK_H

#include "base/base.h"

typedef struct tokenizer tokenizer;

/* dir holds tokenizer.json (and optionally tokenizer_config.json). */
int tok_load_dir(const char *dir, tokenizer **out, ls_err *e);
int tok_load_file(const char *tokenizer_json_path, tokenizer **out, ls_err *e);
void tok_free(tokenizer *t);

/* Encode UTF-8 text (added/special tokens inside the text are matched).
 * *ids is malloc'd; returns the count or a negative ERR_*. */
int tok_encode(const tokenizer *t, const char *text, size_t len, int32_t **ids, ls_err *e);
/* Decode ids to malloc'd UTF-8 text (invalid byte runs become U+FFFD as HF does). */
char *tok_decode(const tokenizer *t, const int32_t *ids, int n, int skip_special);

/* The same, also giving the length: the text may hold U+0000 (a NUL byte). */
char *tok_decode_n(const tokenizer *t, const int32_t *ids, int n, int skip_special, size_t *len);

int tok_vocab_size(const tokenizer *t);         /* highest id + 1 */
int32_t tok_id(const tokenizer *t, const char *token); /* -1 if not a token */
const char *tok_piece(const tokenizer *t, int32_t id); /* raw vocab string, NULL if none */
int tok_is_special(const tokenizer *t, int32_t id);

/* Empty the internal word cache (results never depend on it; benchmarks use
 * this to measure a cold tokenizer). Thread-safe. */
void tok_cache_clear(const tokenizer *t);

/* Special strings from tokenizer_config.json (NULL when absent). */
const char *tok_bos_token(const tokenizer *t);
const char *tok_eos_token(const tokenizer *t);
/* The chat template text from tokenizer_config.json ("default" if a named list), or NULL. */
const char *tok_chat_template(const tokenizer *t);

/* ---- streaming detokenizer ------------------------------------------------ */
/* Feed ids one at a time; each call returns the new text that is now final
 * (never a partial UTF-8 character). The deltas concatenate to exactly
 * tok_decode(all ids). */
typedef struct tok_stream tok_stream;
tok_stream *tok_stream_new(const tokenizer *t, int skip_special);
/* Returns a malloc'd delta (possibly ""). */
char *tok_stream_push(tok_stream *s, int32_t id);
/* Remaining text at the end of the sequence (may hold U+FFFD for dangling bytes). */
char *tok_stream_finish(tok_stream *s);
void tok_stream_free(tok_stream *s);
/* The same as push / finish, also giving the delta's length (it may hold NUL bytes). */
char *tok_stream_push_n(tok_stream *s, int32_t id, size_t *len);
char *tok_stream_finish_n(tok_stream *s, size_t *len);

/* Added (additive, for constrained decoding): the raw bytes id decodes to on
 * its own, before any UTF-8 repair (a ByteLevel token may hold part of a
 * character). A pointer into the tokenizer, valid while it lives; NULL when
 * id is a hole or the decoder is not plain ByteLevel (then tok_decode_n of
 * the single id is the best available). */
const char *tok_token_bytes(const tokenizer *t, int32_t id, size_t *len);

#endif
