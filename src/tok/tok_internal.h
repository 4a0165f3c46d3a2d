/* tok_internal.h: the tokenizer's private structures, shared by the files of
 * src/tok/ (tok.c loads and drives, normalize.c, pretok.c, bpe.c, decode.c,
 * stream.c). Nothing here is part of the contract in tok.h.
 *
 * Pipeline of tok_encode (HF `tokenizers` TokenizerImpl::encode_single_sequence,
 * add_special_tokens=false):
 *   text -> split on non-normalized added tokens (raw text)
 *        -> each remaining piece: normalizer -> split on normalized added tokens
 *        -> each remaining piece: pre-tokenizer steps -> words
 *        -> each word: BPE model (word cache) -> ids
 * Pieces are (offset, length) views into working buffers; a "word" handed to
 * the model is raw bytes when the last pre-tokenizer step is ByteLevel (the
 * byte -> printable-char mapping is folded into the model's byte table), or the
 * text itself otherwise.
 */
#ifndef LS_TOK_INTERNAL_H
#define LS_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdbool.h>

#include "tok/tok.h"

/* ---- string -> id hash map (keys are borrowed, never copied) ------------- */
typedef struct tok_map_ent {
    const char *key;
    uint32_t len;
    uint32_t hash;
    int32_t val;
} tok_map_ent;

typedef struct tok_map {
    tok_map_ent *slots; /* [mask + 1]; key == NULL: empty */
    uint32_t mask;
    uint32_t count;
} tok_map;

uint64_t tok_hash(const void *p, size_t n);
void tok_map_init(tok_map *m, size_t expected);
void tok_map_free(tok_map *m);
/* Insert or overwrite. */
void tok_map_put(tok_map *m, const char *key, uint32_t len, int32_t val);
/* -1 if absent. */
int32_t tok_map_get(const tok_map *m, const char *key, size_t len);
/* The same with the key's tok_hash precomputed. */
int32_t tok_map_get_h(const tok_map *m, const char *key, size_t len, uint64_t h);

/* ---- (left id, right id) -> (rank, merged id) ------------------------------ */
typedef struct tok_merge_ent {
    uint64_t key; /* left << 32 | right; UINT64_MAX: empty */
    uint32_t rank;
    int32_t id;
} tok_merge_ent;

typedef struct tok_merges {
    tok_merge_ent *slots;
    uint64_t mask;
    uint32_t count;
} tok_merges;

void tok_merges_init(tok_merges *mg, size_t expected);
void tok_merges_free(tok_merges *mg);
void tok_merges_put(tok_merges *mg, int32_t a, int32_t b, uint32_t rank, int32_t id);

/* ---- normalizers ----------------------------------------------------------- */
enum {
    NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_LOWERCASE, NORM_REPLACE,
    NORM_PREPEND, NORM_STRIP, NORM_STRIP_ACCENTS,
};

typedef struct tok_norm_step {
    int kind;
    char *a;            /* Replace: pattern text (String); Prepend: the prefix */
    size_t alen;
    char *b;            /* Replace: replacement */
    size_t blen;
    pcre2_code *re;     /* Replace with a Regex pattern */
    int left, right;    /* Strip */
} tok_norm_step;

/* ---- pre-tokenizers -------------------------------------------------------- */
enum { SPLIT_ISOLATED, SPLIT_REMOVED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };
enum {
    PRE_SPLIT,          /* regex or literal string */
    PRE_BYTELEVEL,
    PRE_DIGITS,
    PRE_PUNCTUATION,
    PRE_WHITESPACE,     /* \w+|[^\w\s]+ kept */
    PRE_WHITESPACE_SPLIT,
    PRE_METASPACE,
};
enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };
enum { FAST_NONE, FAST_QWEN2, FAST_QWEN35, FAST_LLAMA3 };

typedef struct tok_pre_step {
    int kind;
    pcre2_code *re;     /* PRE_SPLIT, PRE_WHITESPACE, PRE_BYTELEVEL with use_regex */
    bool jit;           /* re was JIT-compiled: call pcre2_jit_match directly */
    int fast;           /* FAST_*: a known pattern matched by pretok_fast.c */
    bool to_model;      /* the next step is the last and a plain ByteLevel: pieces go straight to the model */
    int behavior;       /* SPLIT_* */
    int invert;
    int add_prefix_space;
    int use_regex;
    int individual_digits;
    char replacement[8]; /* Metaspace replacement char (UTF-8) */
    int prepend_scheme;
    int split;
} tok_pre_step;

/* ---- decoders -------------------------------------------------------------- */
enum { DEC_BYTELEVEL, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE };

typedef struct tok_dec_step {
    int kind;
    char *a;            /* Replace pattern (String) / Strip content char / Metaspace replacement */
    size_t alen;
    char *b;            /* Replace content */
    size_t blen;
    pcre2_code *re;     /* Replace with a Regex pattern */
    int start, stop;    /* Strip */
    int prepend_scheme; /* Metaspace */
} tok_dec_step;

/* ---- added tokens ---------------------------------------------------------- */
typedef struct tok_added {
    int32_t id;
    char *content;      /* as written in tokenizer.json */
    size_t len;
    char *match;        /* the text matched: content, or its normalized form */
    size_t match_len;
    bool special, lstrip, rstrip, normalized, single_word;
} tok_added;

/* Leftmost-longest matcher over a set of added tokens. */
typedef struct tok_matcher {
    int n;
    int *order;         /* added-token indices grouped by first byte, longest first */
    int start[257];     /* order[start[b] .. start[b+1]) begin with byte b */
    int one_first;      /* the first byte shared by every token, or -1 */
} tok_matcher;

/* ---- word cache (thread-safe, sharded) --------------------------------------- */
#define TOK_CACHE_SHARDS 64
#define TOK_CACHE_MAX_WORD 128 /* bytes; longer words are not cached */

typedef struct tok_cache_shard {
    pthread_mutex_t mu;
    uint32_t *slots;    /* [TOK_CACHE_SLOTS] offset+1 into pool; 0 empty */
    uint64_t *hashes;   /* [TOK_CACHE_SLOTS] */
    char *pool;         /* entries: u8 klen, u8 nids, pad2, key, ids (int32, aligned) */
    uint32_t used, count;
} tok_cache_shard;

/* ---- the tokenizer ----------------------------------------------------------- */
struct tokenizer {
    char *path;                 /* tokenizer.json path (for messages) */

    /* model: BPE */
    tok_map vocab;              /* model vocab string -> id */
    char *strpool;              /* owns every vocab / added string */
    size_t strpool_len;
    tok_merges merges;
    tok_map stable;             /* byte mode: raw bytes of every token t with BPE(bytes(t)) == [t];
                                   a word found here needs no cache and no merge loop */
    int32_t byte_id[256];       /* id of the ByteLevel char of each byte, -1 if none */
    int32_t byte_fallback_id[256]; /* id of "<0xXX>", -1 if none */
    int32_t unk_id;             /* -1 if no unk_token */
    bool byte_fallback, fuse_unk, ignore_merges;
    char *cont_prefix;          /* continuing_subword_prefix, NULL if none/empty */
    char *eow_suffix;           /* end_of_word_suffix, NULL if none/empty */

    /* id -> piece: vocab strings overlaid with added-token contents */
    int32_t n_ids;              /* highest id + 1 */
    const char **piece;         /* [n_ids] NULL for holes */
    uint32_t *piece_len;
    uint8_t *flags;             /* [n_ids] TOKF_* */
    /* ByteLevel-decoded bytes of each piece (decoder fast path) */
    uint32_t *dec_off, *dec_len;
    char *dec_pool;

    /* added tokens */
    tok_added *added;
    int n_added;
    tok_matcher match_raw, match_norm;
    tok_map added_map;          /* content -> id (tok_id) */

    /* normalizer, pre-tokenizer, decoder: flattened Sequences */
    tok_norm_step *norm;
    int n_norm;
    tok_pre_step *pre;
    int n_pre;
    bool byte_mode;             /* last pre-tokenizer step is ByteLevel: words are raw bytes */
    tok_dec_step *dec;
    int n_dec;
    bool has_decoder;
    bool dec_bytes_only;        /* decoder is exactly ByteLevel: per-id bytes + lossy UTF-8 */

    /* tokenizer_config.json */
    char *bos_token, *eos_token, *chat_template;

    tok_cache_shard cache[TOK_CACHE_SHARDS];
};

enum { TOKF_ADDED = 1, TOKF_SPECIAL = 2 };

/* ---- helpers shared across files ------------------------------------------------ */
/* GPT-2 bytes_to_unicode: byte -> code point, and its inverse (-1 if not a mapped char). */
extern const uint16_t tok_byte_to_cp[256];
int tok_cp_to_byte(uint32_t cp);

/* Decode one UTF-8 char of a valid string; returns its length. */
int tok_utf8_dec(const unsigned char *s, uint32_t *cp);
int tok_utf8_enc(uint32_t cp, char *out);
/* Index of the first invalid byte, or n if s[0..n) is valid UTF-8. */
size_t tok_utf8_valid(const char *s, size_t n);
/* Append s[0..n) to out with String::from_utf8_lossy semantics. If hold is
 * non-NULL, a trailing incomplete-but-valid-so-far sequence is not emitted:
 * its length is stored in *hold instead. */
void tok_utf8_lossy(buf *out, const char *s, size_t n, size_t *hold);
bool tok_is_whitespace(uint32_t cp); /* Rust char::is_whitespace (Unicode White_Space) */
bool tok_is_word_char(uint32_t cp);      /* Unicode \\w of the regex crate */

/* Compile a pattern with Oniguruma's meaning of \s \S \w \W (see pretok.c). */
pcre2_code *tok_regex_compile(const char *pat, size_t len, bool literal, char *why, size_t whyn);
bool tok_regex_has_jit(const pcre2_code *re);

/* normalize.c: the normalized text of s[0..n): s itself when nothing changes,
 * else out->data (out's contents are replaced). Its length goes to *outn. */
const char *tok_normalize(const tokenizer *t, const char *s, size_t n, buf *out, size_t *outn);

/* pretok.c: the pre-tokenizer streams words to a callback, depth first.
 * Scratch state (match data, generated text) is per encode call. */
typedef struct tok_pre_scratch tok_pre_scratch;
typedef void (*tok_word_fn)(void *ctx, const char *w, size_t n);
tok_pre_scratch *tok_pre_scratch_new(const tokenizer *t);
void tok_pre_scratch_free(tok_pre_scratch *sc);
/* Pre-tokenize s[0..n) (is_first: it starts the original text) and call fn
 * on every word, in order. */
void tok_pretokenize(const tokenizer *t, tok_pre_scratch *sc, const char *s, size_t n, bool is_first,
                     tok_word_fn fn, void *ctx);

/* pretok_fast.c: FAST_* for a pattern text (FAST_NONE if not a known one),
 * and the split itself: piece() gets every match in order (they tile text). */
int tok_fast_pattern(const char *pat, size_t len);
void tok_fast_split(int which, const char *text, size_t n, void (*piece)(void *ctx, const char *s, size_t n), void *ctx);

/* bpe.c */
void tok_bpe_word(const tokenizer *t, const char *w, size_t n, int32_t **ids, size_t *nids, size_t *cap);
void tok_cache_init(tokenizer *t);
void tok_build_stable(tokenizer *t); /* after tok_build_dec_bytes */
void tok_cache_free(tokenizer *t);

/* decode.c: per-id ByteLevel bytes */
void tok_build_dec_bytes(tokenizer *t);

#endif
